#!/usr/bin/env bash
# The real Claude Code (npm @anthropic-ai/claude-code, pinned) runs
# `loopx hook` through its own hook runner, headless (`claude -p`) against a
# stub model endpoint (stub_model.py) and a live broker: the entries written
# by `loopx hook install`, a Web message queued before the run, delivered by
# the Stop hook, answered by the model and completed with its last message;
# SessionEnd marks the agent away. The prompt given on the command line is a
# turn of origin "terminal", answered with the model's answer; a tool the
# model calls (Bash, `sleep 3`) is shown by name while it runs, never its
# input, and a Web message sent meanwhile is delivered at Stop and answered
# after the terminal turn (issue 37). The Web message carries a screenshot:
# the model reads the path it was saved at, bytes equal (issue 39).
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
STUB_LOG="$work/model-texts.jsonl" python3 tests/hooks/stub_model.py "$model_port" 2>"$work/model.log" &
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
# The Web message carries a screenshot (issue 39): the Stop hook saves it
# on the host and names the saved file in the text the model reads.
python3 - "$work/shot.png" <<'PY'
import struct, sys, zlib
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)) \
    + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b"")
open(sys.argv[1], "wb").write(png)
PY
curl -fsS -H "Authorization: Bearer $LOOPX_TOKEN" \
  -F 'message={"text": "From the web: what is 2+2?", "origin": "web"};type=application/json' \
  -F "file=@$work/shot.png;type=image/png" \
  "$BROKER_URL/v1/sessions/$session/messages/with-attachments" >/dev/null

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
# The Web message queued before the run (seq 1), then the prompt given on
# the command line (seq 2, typed at the terminal as far as the hooks know).
assert [(t["seq"], t["origin"], t["state"]) for t in turns] == \
    [(1, "web", "completed"), (2, "terminal", "completed")], turns
web, terminal = turns
answer = web["response"]["message"]
# The model answered the Stop hook's block: its instruction ends with the
# words the stub echoes.
assert answer.startswith("Stub answer. [") and "as your answer" in answer, answer
assert terminal["text"] == "Hello." and terminal["response"]["message"] == "Stub answer. [Hello.]", terminal
assert run["num_turns"] >= 2 and not run["is_error"], run
assert session["agent"]["state"] == "away", session
print("claude code", "delivered and answered:", answer)
print("claude code", "the terminal's prompt answered:", terminal["response"]["message"])
PY
python3 - "$work/model-texts.jsonl" "$work/shot.png" <<'PY'
import json, os, re, stat, sys
texts = [t for line in open(sys.argv[1]) for t in json.loads(line)["texts"]]
named = [m for t in texts for m in re.findall(r"Attached: (\S+) \(image/png, ", t)]
assert named, "the model never read a line naming the saved screenshot: %r" % texts
path = named[0]
assert open(path, "rb").read() == open(sys.argv[2], "rb").read(), "the saved bytes differ"
assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700, oct(os.stat(os.path.dirname(path)).st_mode)
print("claude code", "the model read the saved screenshot's path:", path)
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
got = [(t["origin"], t["text"], t["state"], (t.get("response") or {}).get("message")) for t in turns]
want = [("web", m, "completed", "Done.") for m in ("First message.", "Second message.", "Third message.")]
assert got == want + [("terminal", "Hello.", "completed", "Done.")], got
print("claude code, the same answer every time: three messages answered once each, in order")
PY

# What the agent is doing now (issue 37): the model calls Claude Code's Bash
# tool (`sleep 3`), allowed up front (`--allowedTools Bash`: as root, Claude
# Code refuses bypassPermissions). While it runs, the projection shows
# `working` and the tool by name; after the run, no tool; its input is never
# stored. A logging hook beside loopx's records what Claude Code sends to
# PreToolUse and PostToolUse.
model_port_tool=$(free_port)
STUB_TOOL_USE='{"name": "Bash", "input": {"command": "sleep 3", "description": "wait"}}' \
  python3 tests/hooks/stub_model.py "$model_port_tool" 2>"$work/model-tool.log" &
tool_pid=$!
poller_pid=
trap 'kill $model_pid $same_pid $tool_pid $poller_pid 2>/dev/null; stop_broker' EXIT
host3=$(python3 -c 'import uuid; print(uuid.uuid4())')
"$loopx" worker-bridge bind-agent-thread --broker-url "$BROKER_URL" --goal-id g-hooks-tool \
  --agent-id agent-hooks --host-surface claude-code --host-session-id "$host3" >/dev/null
session3=$("$loopx" worker-bridge attached-session-bind --broker-url "$BROKER_URL" --goal-id g-hooks-tool \
  --agent-id agent-hooks --host-surface claude-code --host-session-id "$host3" \
  --executor-endpoint-id exec-ci --execute --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["session_id"])')
mkdir -p "$work/project3"
"$loopx" hook install --agent claude-code --project-dir "$work/project3" \
  --session-id "$session3" --broker-url "$BROKER_URL" >/dev/null
python3 - "$work/project3/.claude/settings.local.json" "$work" <<'PY'
import json, sys
path, work = sys.argv[1:]
settings = json.load(open(path))
for event, name in (("PreToolUse", "pre-tool-use"), ("PostToolUse", "post-tool-use")):
    [group] = settings["hooks"][event]
    assert group["matcher"] == "*", group
    group["hooks"].append({"type": "command", "command": "{ cat; echo; } >> %s/%s.jsonl" % (work, name)})
json.dump(settings, open(path, "w"), indent=2)
PY
for _ in $(seq 50); do  # the stub listening
  (exec 3<>"/dev/tcp/127.0.0.1/$model_port_tool") 2>/dev/null && break
  sleep 0.1
done
# The projection, every 100 ms, one JSON line each, while Claude Code runs;
# once it shows the tool running, a Web message is sent.
python3 - "$BROKER_URL/v1/sessions/$session3" "$work/polls.jsonl" <<'PY' &
import json, os, sys, time, urllib.request
url, out = sys.argv[1:]
auth = {"Authorization": "Bearer " + os.environ["LOOPX_TOKEN"]}
request = urllib.request.Request(url, headers=auth)
sent = False
with open(out, "a") as f:
    while True:
        polled = urllib.request.urlopen(request).read().decode().strip()
        f.write(polled + "\n")
        f.flush()
        if not sent and json.loads(polled)["agent"]["tool"] == "Bash":
            message = json.dumps({"origin": "web", "text": "Sent while the tool ran."}).encode()
            urllib.request.urlopen(urllib.request.Request(
                url + "/messages", data=message, method="POST",
                headers=dict(auth, **{"Content-Type": "application/json"})))
            sent = True
        time.sleep(0.1)
PY
poller_pid=$!
(cd "$work/project3" && ANTHROPIC_BASE_URL="http://127.0.0.1:$model_port_tool" ANTHROPIC_API_KEY=sk-stub \
  DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
  timeout 120 "$claude" -p "Wait a little." --session-id "$host3" --allowedTools Bash \
  --output-format json >"$work/run3.json")
kill "$poller_pid"
wait "$poller_pid" 2>/dev/null || true
poller_pid=
projection=$(curl -fsS -H "Authorization: Bearer $LOOPX_TOKEN" "$BROKER_URL/v1/sessions/$session3")
turns=$(curl -fsS -H "Authorization: Bearer $LOOPX_TOKEN" "$BROKER_URL/v1/sessions/$session3/turns")
python3 - "$projection" "$work" "$turns" <<'PY'
import json, sys
session, work = json.loads(sys.argv[1]), sys.argv[2]
# One conversation: the prompt typed at the terminal, then the Web message
# sent while its tool ran, delivered at Stop; each answered, in order.
turns = [(t["seq"], t["origin"], t["text"], t["state"]) for t in json.loads(sys.argv[3])["turns"]]
assert turns == [(1, "terminal", "Wait a little.", "completed"),
                 (2, "web", "Sent while the tool ran.", "completed")], turns
print("claude code, one conversation:", turns)
run = json.load(open(work + "/run3.json"))
assert not run["is_error"] and run["num_turns"] >= 2, run
polls = [json.loads(line) for line in open(work + "/polls.jsonl") if line.strip()]
tools = [p["agent"] for p in polls if p["agent"]["tool"]]
assert any(a["state"] == "working" and a["tool"] == "Bash" and a["tool_since"] for a in tools), \
    [p["agent"] for p in polls]
assert {a["tool"] for a in tools} == {"Bash"}, tools
assert session["agent"]["tool"] is None and session["agent"]["tool_since"] is None, session["agent"]
assert session["agent"]["state"] == "away", session["agent"]
# The tool's input never reaches the broker's projection.
for text in [sys.argv[1]] + [json.dumps(p) for p in polls]:
    assert "sleep 3" not in text, text
# What Claude Code itself gives the hooks.
[pre] = [json.loads(line) for line in open(work + "/pre-tool-use.jsonl") if line.strip()]
[post] = [json.loads(line) for line in open(work + "/post-tool-use.jsonl") if line.strip()]
for stdin, event in ((pre, "PreToolUse"), (post, "PostToolUse")):
    assert stdin["hook_event_name"] == event and stdin["tool_name"] == "Bash", stdin
    assert stdin["tool_input"] == {"command": "sleep 3", "description": "wait"}, stdin
    print("claude code %s stdin: %s" % (event, json.dumps(stdin, sort_keys=True)))
assert "tool_response" in post and "tool_response" not in pre, (pre, post)
print("claude code, a tool running: %d of %d polls showed working · Bash; none after the run"
      % (len(tools), len(polls)))
PY
if grep -F "sleep 3" "$work/broker.log"; then
  echo "the broker logged the tool's input" >&2
  exit 1
fi
