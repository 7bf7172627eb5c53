#!/usr/bin/env bash
# What the agent changed, reported by the hooks of the real Claude Code TUI
# (npm, pinned) in a private tmux server against the stub model
# (tests/hooks/stub_model.py, STUB_TOOL_USE: the model calls Write) and a live
# broker (issue 57); the hooks from `loopx hook install`. The project is a
# git repository with one commit; a prompt typed at the terminal makes the
# model write a new file (acceptEdits: no approval asked); once the turn
# ends, the broker holds the working tree (the new file, untracked, +2) and
# the typed turn's files (the file Write wrote), and one file's diff.
#
# Usage: tests/wake/changes_claude.sh [path/to/loopx]   (default target/debug/loopx)
set -euo pipefail
cd "$(dirname "$0")/../.."
loopx=$(realpath "${1:-target/debug/loopx}")
source tests/support/live_broker.sh
source tests/wake/tui.sh
source tests/wake/turns.sh
version=2.1.332

claude=$(npm_bin "@anthropic-ai/claude-code@$version" claude)
export LOOPX_TOKEN=changes-test-token HOME="$work/home"
mkdir -p "$HOME"
start_broker "$loopx" --data-dir "$work/data"
stub=
cleanup() {
  local status=$?
  if [ $status -ne 0 ] && [ -n "${pane:-}" ]; then
    echo "--- the pane at the failure ($pane):" >&2; tui_screen "$pane" >&2 || true
    echo "--- broker log (tail):" >&2; tail -20 "$work/broker.log" >&2 || true
  fi
  tui_stop
  [ -n "$stub" ] && kill "$stub" 2>/dev/null
  stop_broker
}
trap cleanup EXIT
key=sk-stub-changes-0123456789abcdefghij
export ANTHROPIC_API_KEY=$key DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
  TERM=xterm-256color SHELL=/bin/bash
unset TMUX TMUX_PANE
project="$work/project"
mkdir -p "$project"
git -C "$project" init -q
printf 'one\n' > "$project/README.md"
git -C "$project" add README.md
git -C "$project" -c user.name=t -c user.email=t@example.com -c commit.gpgsign=false commit -qm first
tui_claude_home "$key" "$project"
tui_start

port=$(free_port)
log="$work/model.jsonl"
tool=$(python3 -c 'import json,sys; print(json.dumps({"name": "Write", "input": {"file_path": sys.argv[1], "content": "hello\nworld\n"}}))' "$project/notes/hello world.txt")
STUB_LOG="$log" STUB_TOOL_USE="$tool" python3 tests/hooks/stub_model.py "$port" "Wrote it." 2>"$work/model.log" &
stub=$!
"$loopx" hook install --agent claude-code --project-dir "$project" --goal-id g-changes \
  --agent-id agent-changes --executor-endpoint-id exec-ci --broker-url "$BROKER_URL" >/dev/null
pane=$(tui_window changes "$project")
tui_wait "$pane" '^wake\$ ' 10
tui_type "$pane" "export ANTHROPIC_BASE_URL=http://127.0.0.1:$port"
tui_enter "$pane"
tui_claude "$pane" --permission-mode acceptEdits
session=$(open_session g-changes)
tui_type "$pane" "Write the notes, please."
sleep 0.3
tui_enter "$pane"

# The turn ends (Stop): the report is there, the typed turn answered.
python3 - "$BROKER_URL" "$LOOPX_TOKEN" "$session" "$project/notes/hello world.txt" <<'PY'
import json, os, sys, time, urllib.error, urllib.parse, urllib.request
url, token, session, written = sys.argv[1:5]
def get(path):
    req = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {token}"})
    return json.load(urllib.request.urlopen(req))
end = time.time() + 60
while True:
    try:
        changes = get(f"/v1/sessions/{session}/changes")
        turns = get(f"/v1/sessions/{session}/turns")["turns"]
        if changes["turns"] and turns and turns[-1]["state"] == "completed":
            break
    except urllib.error.HTTPError as e:
        if e.code != 404: raise
    if time.time() > end: sys.exit("no report with the turn's files after 60 s")
    time.sleep(0.2)
assert os.path.exists(written), "Claude Code did not write the file"
files = {f["path"]: f for f in changes["files"]}
assert files.get("notes/hello world.txt", {}).get("status") == "untracked", changes["files"]
assert files["notes/hello world.txt"]["added"] == 2, files
assert changes["branch"] in ("main", "master"), changes["branch"]
turn = changes["turns"][0]
assert turn["turn_id"] == turns[-1]["turn_id"] and turns[-1]["origin"] == "terminal", (turn, turns[-1])
assert [f["path"] for f in turn["files"]] == ["notes/hello world.txt"], turn
one = get(f"/v1/sessions/{session}/changes/files/" + urllib.parse.quote("notes/hello world.txt", safe=""))
assert "+hello\n+world\n" in one["diff"], one["diff"]
print("the turn typed at the terminal wrote %s (+%d); the broker holds the report and its diff"
      % (turn["files"][0]["path"], turn["added"]))
PY
