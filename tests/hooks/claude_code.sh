#!/usr/bin/env bash
# The real Claude Code (npm @anthropic-ai/claude-code, pinned) runs
# `loopx hook` through its own hook runner, headless (`claude -p`) against a
# stub model endpoint (stub_model.py) and a live broker: the entries written
# by `loopx hook install`, a Web message queued before the run, delivered by
# the Stop hook, answered by the model and completed with its last message;
# SessionEnd marks the agent away.
#
# Usage: tests/hooks/claude_code.sh [path/to/loopx]   (default target/debug/loopx)
set -euo pipefail
cd "$(dirname "$0")/../.."
loopx=$(realpath "${1:-target/debug/loopx}")
source tests/support/live_broker.sh
version=2.1.332

(cd "$work" && npm install --silent --no-audit --no-fund "@anthropic-ai/claude-code@$version" >/dev/null)
claude="$work/node_modules/.bin/claude"
"$claude" --version

export LOOPX_TOKEN=hooks-test-token HOME="$work/home"
mkdir -p "$HOME" "$work/project"
start_broker "$loopx" --data-dir "$work/data"
model_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 tests/hooks/stub_model.py "$model_port" 2>"$work/model.log" &
model_pid=$!
trap 'kill $model_pid 2>/dev/null; stop_broker' EXIT

# The host session is Claude Code's own session id, chosen here.
host=$(python3 -c 'import uuid; print(uuid.uuid4())')
"$loopx" worker-bridge bind-agent-thread --broker-url "$BROKER_URL" --goal-id g-hooks \
  --agent-id agent-hooks --host-surface claude-code --host-session-id "$host" >/dev/null
session=$("$loopx" worker-bridge attached-session-bind --broker-url "$BROKER_URL" --goal-id g-hooks \
  --agent-id agent-hooks --host-surface claude-code --host-session-id "$host" \
  --executor-endpoint-id exec-ci --execute --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["session_id"])')
"$loopx" hook install --agent claude-code --project-dir "$work/project" \
  --session-id "$session" --broker-url "$BROKER_URL"
"$loopx" chat send --broker-url "$BROKER_URL" --session-id "$session" --text "From the web: what is 2+2?" >/dev/null

(cd "$work/project" && ANTHROPIC_BASE_URL="http://127.0.0.1:$model_port" ANTHROPIC_API_KEY=sk-stub \
  DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
  timeout 120 "$claude" -p "Hello." --session-id "$host" --output-format json >"$work/run.json")

turns=$(curl -fsS -H "Authorization: Bearer $LOOPX_TOKEN" "$BROKER_URL/v1/sessions/$session/turns")
projection=$(curl -fsS -H "Authorization: Bearer $LOOPX_TOKEN" "$BROKER_URL/v1/sessions/$session")
python3 - "$turns" "$projection" "$work/run.json" <<'PY'
import json, sys
turns = json.loads(sys.argv[1])["turns"]
session = json.loads(sys.argv[2])
run = json.load(open(sys.argv[3]))
assert len(turns) == 1, turns
turn = turns[0]
assert turn["state"] == "completed", turn
answer = turn["response"]["message"]
# The model answered the Stop hook's block: its instruction ends with the
# words the stub echoes.
assert answer.startswith("Stub answer. [") and "as your answer" in answer, answer
assert run["num_turns"] >= 2 and not run["is_error"], run
assert session["agent"]["state"] == "away", session
print("claude code", "delivered and answered:", answer)
PY

# A model that answers everything with the same words (issue 35): three
# messages queued before the run, each delivered once, in order, and each
# answered "Done." (the Stop hook tells the turns apart by the transcript).
model_port_same=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 tests/hooks/stub_model.py "$model_port_same" "Done." --same 2>"$work/model-same.log" &
same_pid=$!
trap 'kill $model_pid $same_pid 2>/dev/null; stop_broker' EXIT
host2=$(python3 -c 'import uuid; print(uuid.uuid4())')
"$loopx" worker-bridge bind-agent-thread --broker-url "$BROKER_URL" --goal-id g-hooks-same \
  --agent-id agent-hooks --host-surface claude-code --host-session-id "$host2" >/dev/null
session2=$("$loopx" worker-bridge attached-session-bind --broker-url "$BROKER_URL" --goal-id g-hooks-same \
  --agent-id agent-hooks --host-surface claude-code --host-session-id "$host2" \
  --executor-endpoint-id exec-ci --execute --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["session_id"])')
mkdir -p "$work/project2"
"$loopx" hook install --agent claude-code --project-dir "$work/project2" \
  --session-id "$session2" --broker-url "$BROKER_URL" >/dev/null
for text in "First message." "Second message." "Third message."; do
  "$loopx" chat send --broker-url "$BROKER_URL" --session-id "$session2" --text "$text" >/dev/null
done
for _ in $(seq 50); do  # the stub listening
  (exec 3<>"/dev/tcp/127.0.0.1/$model_port_same") 2>/dev/null && break
  sleep 0.1
done
(cd "$work/project2" && ANTHROPIC_BASE_URL="http://127.0.0.1:$model_port_same" ANTHROPIC_API_KEY=sk-stub \
  DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
  timeout 120 "$claude" -p "Hello." --session-id "$host2" --output-format json >"$work/run2.json")
turns=$(curl -fsS -H "Authorization: Bearer $LOOPX_TOKEN" "$BROKER_URL/v1/sessions/$session2/turns")
python3 - "$turns" <<'PY'
import json, sys
turns = json.loads(sys.argv[1])["turns"]
got = [(t["text"], t["state"], (t.get("response") or {}).get("message")) for t in turns]
want = [(m, "completed", "Done.") for m in ("First message.", "Second message.", "Third message.")]
assert got == want, got
print("claude code, the same answer every time: three messages answered once each, in order")
PY
