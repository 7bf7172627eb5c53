#!/usr/bin/env bash
# Web Push end to end (WEB.md "Installable, and it tells you"): the real
# broker sends to a fake push service on loopback (fake_push.py), which
# decrypts every message and checks its VAPID signature with the reference
# implementations (PyPI http-ece, py-vapid). A pending permission request is
# told `needs_you` with `Urgency: high`, an answer `answered`, an agent
# silent while working `stalled` (--stall-after 1s); the payload
# names only the session and the kind (no message text); a 429 is retried;
# a subscription answered 410 is removed.
#
# Usage: tests/push/run.sh [path/to/loopx]   (default target/debug/loopx)
set -euo pipefail
cd "$(dirname "$0")/../.."
loopx=$(realpath "${1:-target/debug/loopx}")
source tests/support/live_broker.sh

start_broker "$loopx" --data-dir "$work/data" --stall-after 1s
token=$(cat "$work/data/owner.token")
api() { curl -fsS -X "$1" -H "Authorization: Bearer $token" -H 'Content-Type: application/json' ${3:+-d "$3"} "$BROKER_URL$2"; }
key=$(api GET /v1/push/key | python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])')

port=$(free_port)
record="$work/pushes.jsonl"
touch "$record"
python3 tests/push/fake_push.py "$port" "$record" "$key" >"$work/subscriptions.jsonl" &
fake=$!
trap 'kill $fake 2>/dev/null; stop_broker' EXIT
for _ in $(seq 100); do [ "$(wc -l <"$work/subscriptions.jsonl")" -eq 3 ] && break; sleep 0.1; done
while read -r subscription; do api POST /v1/push/subscriptions "$subscription" >/dev/null; done <"$work/subscriptions.jsonl"

thread='{"goal_id": "g-push", "agent_id": "agent-push", "host_surface": "claude-code", "host_session_id": "push-host"}'
host='"host_surface": "claude-code", "host_session_id": "push-host"'
api POST /v1/agent-threads "$thread" >/dev/null
session=$(api POST /v1/sessions "${thread%\}}, \"executor_endpoint_id\": \"exec-push\"}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["session_id"])')
api POST "/v1/sessions/$session/permission-requests" "{$host, \"request_id\": \"abcde\", \"tool_name\": \"Bash\", \"description\": \"Remove the secret build directory\", \"input_preview\": \"rm -rf secret\"}" >/dev/null
turn=$(api POST "/v1/sessions/$session/messages" '{"origin": "web", "text": "a private question"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["turn_id"])')
api POST "/v1/sessions/$session/claims" "{$host, \"claim_id\": \"c1\"}" >/dev/null
api POST "/v1/sessions/$session/turns/$turn/complete" "{$host, \"claim_id\": \"c1\", \"completion_id\": \"k1\", \"response\": {\"message\": \"a private answer\"}}" >/dev/null

# Each gets both kinds (gone answers 410 to both: they go out together);
# busy answers its first a 429, retried after its Retry-After.
for _ in $(seq 150); do [ "$(wc -l <"$record")" -ge 7 ] && break; sleep 0.1; done
python3 - "$record" "$session" <<'PY'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
session = sys.argv[2]
assert all("error" not in r for r in records), records
assert all(r["vapid"] == "ok" for r in records), records
for r in records:
    assert set(r["payload"]) == {"session_id", "kind"} and r["payload"]["session_id"] == session, r
    assert "private" not in json.dumps(r) and "secret" not in json.dumps(r), r
    assert r["urgency"] == ("high" if r["payload"]["kind"] == "needs_you" else "normal"), r
def kinds(name, status):
    return sorted(r["payload"]["kind"] for r in records
                  if r["path"] == f"/push/{name}" and r["status"] == status and r["payload"]["kind"] != "stalled")
assert kinds("ok", 201) == ["answered", "needs_you"], records
assert kinds("busy", 201) == ["answered", "needs_you"], records
assert len(kinds("busy", 429)) == 1, records
assert kinds("gone", 410) != [], records
print(f"{len(records)} pushes decrypted and verified")
PY
# The subscription answered 410 is gone; the others stay.
for _ in $(seq 50); do
  left=$(api GET /v1/push/subscriptions | python3 -c 'import json,sys; print(" ".join(sorted(s["endpoint"].rsplit("/",1)[1] for s in json.load(sys.stdin)["subscriptions"])))')
  [ "$left" = "busy ok" ] && break
  sleep 0.1
done
[ "$left" = "busy ok" ] || { echo "subscriptions left: $left"; exit 1; }
# An agent working and then silent past --stall-after is told `stalled`.
api POST "/v1/sessions/$session/agent-state" "{$host, \"state\": \"working\"}" >/dev/null
for _ in $(seq 100); do grep -q '"kind": "stalled"' "$record" && break; sleep 0.1; done
grep '"kind": "stalled"' "$record" | grep -q '"path": "/push/ok"' || { echo "no stalled push:"; cat "$record"; exit 1; }
grep '"kind": "stalled"' "$record" | grep -q '"vapid": "ok"' || { echo "the stalled push:"; cat "$record"; exit 1; }
echo "web push: needs_you, answered and stalled decrypted by http-ece, VAPID verified by py-vapid, 429 retried, 410 removed"
