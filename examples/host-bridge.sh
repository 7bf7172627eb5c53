#!/usr/bin/env bash
# A minimal host bridge: binds an already-running host session to a LoopX Chat
# session, then answers its queued messages one by one:
#
#   claim (a bounded wait, --format json) -> answer -> complete
#
# The "agent" here only echoes ("received: <text>"); put the real hand-off to
# your host session in answer(). Ctrl-C or SIGTERM stops it cleanly (exit 0).
#
# Needs bash, python3 (to read and write JSON) and a running `loopx serve`.
# Configuration, all optional (the token is found as by every loopx command:
# LOOPX_TOKEN, LOOPX_TOKEN_FILE or the data dir's owner.token):
#
#   LOOPX_BIN                 the loopx binary            [loopx]
#   LOOPX_BROKER_URL          the broker                  [http://127.0.0.1:7317]
#   LOOPX_GOAL_ID             the goal                    [demo-goal]
#   LOOPX_AGENT_ID            the registered agent        [demo-agent]
#   LOOPX_HOST_SURFACE        the host surface            [codex-cli]
#   LOOPX_HOST_SESSION_ID     the running host session    [demo-host-session]
#   LOOPX_EXECUTOR_ENDPOINT_ID  the executor label        [demo-executor]
#   LOOPX_BRIDGE_WAIT         seconds per claim wait      [30]

set -u

loopx=${LOOPX_BIN:-loopx}
goal=${LOOPX_GOAL_ID:-demo-goal}
agent=${LOOPX_AGENT_ID:-demo-agent}
surface=${LOOPX_HOST_SURFACE:-codex-cli}
host_session=${LOOPX_HOST_SESSION_ID:-demo-host-session}
executor=${LOOPX_EXECUTOR_ENDPOINT_ID:-demo-executor}
wait_seconds=${LOOPX_BRIDGE_WAIT:-30}
host=(--host-surface "$surface" --host-session-id "$host_session")

work=$(mktemp -d) || exit 2
child=
stop=0
# A signal ends a claim wait at once (the turn stays queued, or a claim that
# raced the signal is adopted on the next start); an answer being completed
# is finished first, since completing is what the host owes the turn.
on_signal() {
    stop=1
    if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; fi
}
trap on_signal INT TERM
trap 'rm -rf "$work"' EXIT

log() { printf 'host-bridge: %s\n' "$*" >&2; }

# json_get FILE a.b.c: prints that field ("" when absent; booleans as true/false).
json_get() {
    python3 -c '
import json, sys
value = json.load(open(sys.argv[1]))
for key in sys.argv[2].split("."):
    value = value.get(key) if isinstance(value, dict) else None
print("" if value is None else json.dumps(value) if isinstance(value, bool) else value)
' "$1" "$2"
}

# answer CLAIM_FILE RESPONSE_FILE: the agent's work. This one echoes.
answer() {
    python3 -c '
import json, sys
claim = json.load(open(sys.argv[1]))
json.dump({"message": "received: " + claim["turn"]["text"]}, open(sys.argv[2], "w"))
' "$1" "$2"
}

# Bind: the exact agent-thread registration, then the session (both idempotent).
"$loopx" worker-bridge bind-agent-thread --goal-id "$goal" --agent-id "$agent" "${host[@]}" \
    >&2 || exit $?
"$loopx" worker-bridge attached-session-bind --goal-id "$goal" --agent-id "$agent" "${host[@]}" \
    --executor-endpoint-id "$executor" --execute --format json >"$work/session.json" || exit $?
session=$(json_get "$work/session.json" session_id)
log "serving session $session (Ctrl-C to stop)"

n=0
claim_id=
while [ "$stop" = 0 ]; do
    # A fresh claim id per turn; an unused one (claimed=false) is kept.
    if [ -z "$claim_id" ]; then
        n=$((n + 1))
        claim_id="claim-$session-$(date +%s)-$$-$n"
    fi
    # In the background so that a signal interrupts the wait at once.
    "$loopx" worker-bridge attached-session-claim --session-id "$session" "${host[@]}" \
        --claim-id "$claim_id" --wait-seconds "$wait_seconds" --format json >"$work/claim.json" &
    child=$!
    wait "$child"
    status=$?
    child=
    [ "$stop" = 1 ] && break
    case $status in
    0) ;;
    3) log "broker unreachable; retrying in 2 s"; sleep 2; continue ;;
    1)
        # Only this bridge claims on this session, so an active claim is ours,
        # stranded by an earlier run: adopt it (a replay answers its turn).
        active=$(json_get "$work/claim.json" error.active_claim_id 2>/dev/null)
        if [ -n "$active" ] && [ "$active" != "$claim_id" ]; then
            log "adopting active claim $active"
            claim_id=$active
            continue
        fi
        case $(json_get "$work/claim.json" error.code 2>/dev/null) in
        session_closed) log "session closed; stopping"; exit 0 ;;
        esac
        log "claim refused; retrying in 5 s with a new claim id"
        claim_id=
        sleep 5
        continue
        ;;
    *) log "claim failed (exit $status); stopping"; exit "$status" ;;
    esac
    [ "$(json_get "$work/claim.json" claimed)" = true ] || continue

    turn=$(json_get "$work/claim.json" turn.turn_id)
    log "claimed $turn"
    if ! answer "$work/claim.json" "$work/response.json"; then
        log "no answer for $turn; releasing it"
        "$loopx" worker-bridge attached-session-release --session-id "$session" "${host[@]}" \
            --claim-id "$claim_id" >&2
        claim_id=
        continue
    fi
    # The completion id is derived from the turn: a retry is a replay, never a second answer.
    for attempt in 1 2 3 4 5; do
        "$loopx" worker-bridge attached-session-complete --session-id "$session" \
            --turn-id "$turn" "${host[@]}" --claim-id "$claim_id" \
            --completion-id "done-$turn" --response-json "$work/response.json" >&2
        status=$?
        [ "$status" = 3 ] || break
        log "broker unreachable; retrying the completion ($attempt)"
        sleep 2
    done
    claim_id=
done
log "stopped"
exit 0
