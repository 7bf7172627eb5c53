"""A whole turn through a Python client generated from openapi/openapi.json.

Run by tests/python/run.sh with the generated package `loopx_client` on
PYTHONPATH and LOOPX_URL / LOOPX_TOKEN naming a live broker.
"""

import os
import sys
import threading
import time
import uuid

from loopx_client import AuthenticatedClient, Client
from loopx_client.api.operations import healthz
from loopx_client.api.sessions import bind_session, close_session, get_session, list_sessions, register_agent_thread
from loopx_client.api.turns import claim_turn, complete_turn, enqueue_message, get_turn, list_turns
from loopx_client.models import (
    BindRequest,
    ClaimRequest,
    Claimed,
    CompleteRequest,
    EnqueueRequest,
    ErrorBody,
    ErrorCode,
    NotClaimed,
    Origin,
    RegisterAgentThread,
    Session,
    SessionState,
    TurnResponse,
    TurnState,
)


def check(condition, message):
    if not condition:
        print(f"FAIL: {message}", file=sys.stderr)
        sys.exit(1)


def main():
    url, token = os.environ["LOOPX_URL"], os.environ["LOOPX_TOKEN"]
    anonymous = Client(base_url=url)
    client = AuthenticatedClient(base_url=url, token=token, timeout=60.0)
    suffix = uuid.uuid4().hex[:8]
    goal, agent, host = f"goal-{suffix}", f"agent-{suffix}", f"host-{suffix}"

    check(healthz.sync(client=anonymous).status == "ok", "healthz answers ok")

    refused = list_sessions.sync_detailed(client=AuthenticatedClient(base_url=url, token="wrong"))
    check(refused.status_code == 401, "a wrong token is refused")
    check(isinstance(refused.parsed, ErrorBody) and refused.parsed.error.code == ErrorCode.UNAUTHORIZED,
          "the refusal is the JSON error with its code")

    registered = register_agent_thread.sync_detailed(
        client=client,
        body=RegisterAgentThread(goal_id=goal, agent_id=agent, host_surface="codex-cli", host_session_id=host),
    )
    check(registered.status_code == 201, f"register answers 201, got {registered.status_code}")

    bound = bind_session.sync_detailed(
        client=client,
        body=BindRequest(goal_id=goal, agent_id=agent, host_surface="codex-cli",
                         host_session_id=host, executor_endpoint_id="exec-py"),
    )
    check(bound.status_code == 201 and isinstance(bound.parsed, Session), "bind answers the new session")
    session = bound.parsed
    check(session.state == SessionState.OPEN and session.capabilities.live_steering is False,
          "an open session without live steering")
    check(get_session.sync(session.session_id, client=client).session_id == session.session_id, "read back")

    # Park a claim first, then enqueue from another thread: the claim wakes with the turn.
    def enqueue_later():
        time.sleep(0.5)
        enqueue_message.sync(session.session_id, client=client,
                             body=EnqueueRequest(origin=Origin.WEB, text="hello from python",
                                                 client_message_id=f"py-{suffix}"))

    threading.Thread(target=enqueue_later).start()
    started = time.monotonic()
    claimed = claim_turn.sync(session.session_id, client=client,
                              body=ClaimRequest(host_surface="codex-cli", host_session_id=host,
                                                claim_id=f"claim-{suffix}", wait_seconds=20))
    check(isinstance(claimed, Claimed), f"the parked claim wakes with the turn, got {claimed!r}")
    check(time.monotonic() - started < 10, "woken promptly")
    check(claimed.turn.text == "hello from python" and claimed.turn.attempt == 1, "the claimed turn's content")

    response = TurnResponse.from_dict({"message": "hi from the host", "tokens": 3})
    receipt = complete_turn.sync(session.session_id, claimed.turn.turn_id, client=client,
                                 body=CompleteRequest(host_surface="codex-cli", host_session_id=host,
                                                      claim_id=f"claim-{suffix}",
                                                      completion_id=f"done-{suffix}", response=response))
    check(receipt.completed and not receipt.replayed, "the completion receipt")

    turn = get_turn.sync(session.session_id, claimed.turn.turn_id, client=client)
    check(turn.state == TurnState.COMPLETED, "the turn reads back completed")
    check(turn.response.to_dict() == {"message": "hi from the host", "tokens": 3}, "with the response as given")
    page = list_turns.sync(session.session_id, client=client)
    check(len(page.turns) == 1 and page.has_more is False, "one turn in the transcript")

    closed = close_session.sync(session.session_id, client=client)
    check(isinstance(closed, Session) and closed.state == SessionState.CLOSED, "closed")

    idle = claim_turn.sync(session.session_id, client=client,
                           body=ClaimRequest(host_surface="codex-cli", host_session_id=host, claim_id="late"))
    check(isinstance(idle, ErrorBody) and idle.error.code == ErrorCode.SESSION_CLOSED, "claims on a closed session")
    _ = NotClaimed  # the other claim answer, generated as its own model
    print("generated client: a whole turn passed")


if __name__ == "__main__":
    main()
