// A whole turn through a TypeScript client generated from openapi/openapi.json
// (openapi-typescript + openapi-fetch), compiled with `tsc --strict` and run
// against a live broker by tests/typescript/run.sh. It uses no cast and no
// `any`: every value below is typed by the document, so the document's holes
// (a claim answer that cannot be narrowed, a response typed as an empty
// record, always-sent fields typed as optional) are compile errors here.
//
// Environment: LOOPX_URL and LOOPX_TOKEN name the live broker.

import createClient from "openapi-fetch";

import type { components, paths } from "./generated/loopx.js";

type Schemas = components["schemas"];

function check(condition: boolean, message: string): asserts condition {
  if (!condition) {
    throw new Error(`FAIL: ${message}`);
  }
}

function env(name: string): string {
  const value = process.env[name];
  check(value !== undefined && value !== "", `${name} is set`);
  return value;
}

const baseUrl = env("LOOPX_URL");
const token = env("LOOPX_TOKEN");
// Only the JSON media types: the claim's `text/event-stream` mode is another
// media type of the same operation, so the JSON answer's type is exactly
// `ClaimAnswer`.
const client = createClient<paths, "application/json">({
  baseUrl,
  headers: { Authorization: `Bearer ${token}` },
});

const suffix = Math.random().toString(36).slice(2, 10);
const host = {
  host_surface: "codex-cli",
  host_session_id: `host-ts-${suffix}`,
};
const thread = { goal_id: `goal-ts-${suffix}`, agent_id: `agent-ts-${suffix}`, ...host };

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function bindSession(): Promise<Schemas["Session"]> {
  const registered = await client.POST("/v1/agent-threads", { body: thread });
  check(registered.response.status === 201, `register answers 201, got ${registered.response.status}`);
  const again = await client.POST("/v1/agent-threads", { body: thread });
  check(again.response.status === 200, "registering again answers 200");
  check(again.response.headers.get("Idempotent-Replayed") === "true", "with Idempotent-Replayed");
  const registration: true | undefined = again.data?.registered;
  check(registration === true, "registered: true");

  const bound = await client.POST("/v1/sessions", {
    body: { ...thread, executor_endpoint_id: `exec-ts-${suffix}` },
  });
  check(bound.response.status === 201 && bound.data !== undefined, "bind answers 201");
  // 201 is a Session; only a 200 may be a dry run's preview.
  check(!("dry_run" in bound.data), "the bind made a session, not a preview");
  const session: Schemas["Session"] = bound.data;
  // Sent as null while open, and typed so: `string | null`, not `undefined`.
  const closedAt: string | null = session.closed_at;
  check(closedAt === null && session.state === "open", "an open session");
  check(session.capabilities.live_steering === false, "no live steering");
  return session;
}

/// Parks a claim, then enqueues: the claim wakes with the turn.
async function parkedClaim(sessionId: string, claimId: string): Promise<Schemas["Claimed"]> {
  const path = { params: { path: { session_id: sessionId } } };
  const started = Date.now();
  const parked = client.POST("/v1/sessions/{session_id}/claims", {
    ...path,
    body: { ...host, claim_id: claimId, wait_seconds: 20 },
  });
  await sleep(500);
  const enqueued = await client.POST("/v1/sessions/{session_id}/messages", {
    ...path,
    body: { origin: "web", text: "hello from typescript", client_message_id: `ts-${suffix}` },
  });
  check(enqueued.response.status === 201 && enqueued.data?.state === "queued", "enqueued");

  const { data: answer } = await parked;
  check(answer !== undefined, "the claim answers JSON");
  // Narrowed on the `claimed` constant: no `"turn" in answer` needed.
  if (!answer.claimed) {
    const waited: number = answer.waited_ms;
    throw new Error(`FAIL: the parked claim timed out after ${waited} ms`);
  }
  check(Date.now() - started < 10_000, "woken promptly");
  check(answer.turn.text === "hello from typescript" && answer.turn.attempt === 1, "the claimed turn");
  check(answer.turn_state === "claimed", "turn_state claimed");
  return answer;
}

/// A second claim while one is active: a typed 409 read through the error schema.
async function claimActiveConflict(sessionId: string, activeClaimId: string): Promise<void> {
  const { data, error, response } = await client.POST("/v1/sessions/{session_id}/claims", {
    params: { path: { session_id: sessionId } },
    body: { ...host, claim_id: `other-${suffix}` },
  });
  check(data === undefined && error !== undefined && response.status === 409, "a second claim is 409");
  const code: Schemas["ErrorCode"] = error.error.code;
  check(code === "claim_active", `claim_active, got ${code}`);
  check(error.error.active_claim_id === activeClaimId, "naming the active claim");
  check(typeof error.error.claimed_at === "string", "and when it was made");
}

async function completeAndReadBack(sessionId: string, claimed: Schemas["Claimed"]): Promise<void> {
  const turnPath = { params: { path: { session_id: sessionId, turn_id: claimed.turn.turn_id } } };
  // The response is an object with a `message` and any other fields.
  const response: Schemas["TurnResponse"] = { message: "hi from the host", tokens: 3 };
  const completion = {
    ...host,
    claim_id: claimed.claim_id,
    completion_id: `done-${suffix}`,
    response,
  };
  const receipt = await client.POST("/v1/sessions/{session_id}/turns/{turn_id}/complete", {
    ...turnPath,
    body: completion,
  });
  check(receipt.data?.completed === true && receipt.data.replayed === false, "the completion receipt");
  const replay = await client.POST("/v1/sessions/{session_id}/turns/{turn_id}/complete", {
    ...turnPath,
    body: completion,
  });
  check(replay.data?.replayed === true, "a replayed completion");
  check(replay.response.headers.get("Idempotent-Replayed") === "true", "with Idempotent-Replayed");

  const { data: turn } = await client.GET("/v1/sessions/{session_id}/turns/{turn_id}", turnPath);
  check(turn !== undefined && turn.state === "completed", "the turn reads back completed");
  check(turn.response !== null, "with its response");
  const message: string = turn.response.message;
  check(message === "hi from the host" && turn.response["tokens"] === 3, "the response as given");
  const completedAt: string | null = turn.completed_at;
  const reply: Schemas["ReplyStatus"] | null = turn.reply;
  check(completedAt !== null && reply === null && turn.cancel_reason === null, "times and nulls");

  const { data: page } = await client.GET("/v1/sessions/{session_id}/turns", {
    params: { path: { session_id: sessionId }, query: { limit: 10 } },
  });
  check(page !== undefined && page.turns.length === 1 && !page.has_more, "one turn in the transcript");
}

async function listAndClose(session: Schemas["Session"]): Promise<void> {
  const { data: list } = await client.GET("/v1/sessions", {
    params: { query: { goal_id: session.goal_id, state: "open" } },
  });
  check(list !== undefined, "the list answers");
  const next: string | null = list.next_cursor;
  check(next === null && list.sessions.length === 1, "one open session of this goal, one page");
  check(list.sessions[0]?.session_id === session.session_id, "the bound session");

  const path = { params: { path: { session_id: session.session_id } } };
  const { data: closed } = await client.POST("/v1/sessions/{session_id}/close", path);
  check(closed?.state === "closed" && typeof closed.closed_at === "string", "closed");

  const { error } = await client.POST("/v1/sessions/{session_id}/messages", {
    ...path,
    body: { origin: "web", text: "too late" },
  });
  check(error?.error.code === "session_closed", "enqueue on a closed session is 409 session_closed");
}

const turnChanges: readonly Schemas["TurnChange"][] = [
  "queued",
  "claimed",
  "completed",
  "released",
  "cancelled",
];

function isTurnChange(value: unknown): value is Schemas["TurnChange"] {
  return turnChanges.some((change) => change === value);
}

/// The session's event log from its start (`Last-Event-ID: 0`): the stream of
/// a closed session ends after its `closed` event, so the whole body arrives.
async function eventLog(sessionId: string): Promise<string[]> {
  const response = await fetch(`${baseUrl}/v1/sessions/${sessionId}/events`, {
    headers: { Authorization: `Bearer ${token}`, "Last-Event-ID": "0" },
  });
  check(response.status === 200, "the event stream opens");
  const seen: string[] = [];
  for (const block of (await response.text()).split("\n\n")) {
    const fields = new Map<string, string>();
    for (const line of block.split("\n")) {
      const colon = line.indexOf(":");
      if (colon > 0) fields.set(line.slice(0, colon), line.slice(colon + 1).trim());
    }
    const name = fields.get("event");
    const data: unknown = JSON.parse(fields.get("data") ?? "null");
    if (name === undefined || typeof data !== "object" || data === null) continue;
    const state: unknown = "state" in data ? data.state : undefined;
    check(name === "session" || isTurnChange(state), `a documented turn change: ${String(state)}`);
    seen.push(`${name}:${String(state)}`);
  }
  return seen;
}

async function main(): Promise<void> {
  const session = await bindSession();
  const claimId = `claim-ts-${suffix}`;
  const claimed = await parkedClaim(session.session_id, claimId);
  await claimActiveConflict(session.session_id, claimId);
  await completeAndReadBack(session.session_id, claimed);
  await listAndClose(session);
  const log = await eventLog(session.session_id);
  const expected = ["turn:queued", "turn:claimed", "turn:completed", "session:closed"];
  check(log.join(" ") === expected.join(" "), `the event log, got ${log.join(" ")}`);
  console.log("typescript client: a whole turn passed");
}

await main();
