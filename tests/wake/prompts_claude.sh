#!/usr/bin/env bash
# Everything the agent asks, answered from the phone (issue 54), with the real
# Claude Code TUI (npm, pinned) in a private tmux server against the stub model
# (tests/hooks/stub_model.py, STUB_TOOL_USE: the model calls one tool) and a
# live broker; the hooks from `loopx hook install`. Each case starts claude in
# its own pane with its own permission mode and stub:
#
#  1. `default` mode, AskUserQuestion: a `question` request with its options
#     (PermissionRequest); answered through the API, the model's tool result
#     holds exactly that answer and the terminal's picker is gone
#  2. `acceptEdits` mode, the same question through PreToolUse: one request,
#     the model gets the answer
#  3. `default` mode, Bash with "always allow" suggestions: the chosen one is
#     echoed back and Claude Code writes its rule (settings.local.json)
#  4. `default` mode, the question answered at the terminal's picker first:
#     the request leaves `pending` within 5 s as answered at the terminal, and
#     a late answer from the phone is refused (409)
#
# Which hook fires in which mode (found with this script, Claude Code 2.1.332):
# AskUserQuestion: PermissionRequest in `default`, PreToolUse only in
# `acceptEdits`, `auto` and `plan`; Bash with a suggestion: PermissionRequest.
# ExitPlanMode is a deferred tool in 2.1.332 (loaded through ToolSearch), which
# the one-tool stub cannot drive: plans are covered at the hook level
# (tests/it/prompts.rs).
#
# Usage: tests/wake/prompts_claude.sh [path/to/loopx]   (default target/debug/loopx)
set -euo pipefail
cd "$(dirname "$0")/../.."
loopx=$(realpath "${1:-target/debug/loopx}")
source tests/support/live_broker.sh
source tests/wake/tui.sh
source tests/wake/turns.sh
version=2.1.332

(cd "$work" && npm install --silent --no-audit --no-fund "@anthropic-ai/claude-code@$version" >/dev/null)
claude="$work/node_modules/.bin/claude"
export LOOPX_TOKEN=prompts-test-token HOME="$work/home"
mkdir -p "$HOME"
start_broker "$loopx" --data-dir "$work/data"
stubs=()
cleanup() {
  local status=$?
  if [ $status -ne 0 ] && [ -n "${pane:-}" ]; then
    echo "--- the pane at the failure ($pane):" >&2; tui_screen "$pane" >&2 || true
    echo "--- broker log (tail):" >&2; tail -20 "$work/broker.log" >&2 || true
  fi
  tui_stop
  [ ${#stubs[@]} -gt 0 ] && kill "${stubs[@]}" 2>/dev/null
  stop_broker
}
trap cleanup EXIT
key=sk-stub-prompts-0123456789abcdefghij
export ANTHROPIC_API_KEY=$key DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
  TERM=xterm-256color SHELL=/bin/bash
unset TMUX TMUX_PANE
dirs=()
for n in 1 2 3 4; do dirs+=("$work/project-$n"); mkdir -p "$work/project-$n"; done
tui_claude_home "$key" "${dirs[@]}"
tui_start

question='{"name": "AskUserQuestion", "input": {"questions": [{"question": "Which database?", "header": "DB", "multiSelect": false, "options": [{"label": "PostgreSQL", "description": "a server"}, {"label": "SQLite", "description": "a file"}]}]}}'

# start_case N MODE TOOL: a stub calling TOOL, claude in MODE in its own pane
# with the hooks installed; sets $pane, $session, $log; the prompt is sent.
start_case() {
  local n=$1 mode=$2 tool=$3 port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  log="$work/model-$n.jsonl"
  STUB_LOG="$log" STUB_TOOL_USE="$tool" python3 tests/hooks/stub_model.py "$port" 2>"$work/model-$n.log" &
  stubs+=($!)
  "$loopx" hook install --agent claude-code --project-dir "$work/project-$n" --goal-id "g-prompts-$n" \
    --agent-id agent-prompts --executor-endpoint-id exec-ci --broker-url "$BROKER_URL" >/dev/null
  pane=$(tui_window "case$n" "$work/project-$n")
  tui_wait "$pane" '^wake\$ ' 10
  tui_type "$pane" "export ANTHROPIC_BASE_URL=http://127.0.0.1:$port"
  tui_enter "$pane"
  tui_claude "$pane" --permission-mode "$mode"
  session=$(open_session "g-prompts-$n")
  tui_type "$pane" "Case $n, please."
  sleep 0.3
  tui_enter "$pane"
}

# pending_request SESSION: waits for the session's pending request; prints it (JSON).
pending_request() {
  python3 - "$BROKER_URL" "$LOOPX_TOKEN" "$1" <<'PY'
import json, sys, time, urllib.request
url, token, session = sys.argv[1:4]
end = time.time() + 30
while True:
    req = urllib.request.Request(f"{url}/v1/sessions/{session}/permission-requests?state=pending",
                                 headers={"Authorization": f"Bearer {token}"})
    got = json.load(urllib.request.urlopen(req))["permission_requests"]
    if got: print(json.dumps(got[0])); sys.exit(0)
    if time.time() > end: sys.exit("no pending request after 30 s")
    time.sleep(0.1)
PY
}

# answer SESSION REQUEST BODY: the owner's answer; prints the HTTP status.
answer() {
  curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $LOOPX_TOKEN" \
    -H 'content-type: application/json' -X POST \
    "$BROKER_URL/v1/sessions/$1/permission-requests/$2/answer" -d "$3"
}

# tool_result LOG TEXT: waits until the model was sent a tool result holding TEXT.
tool_result() {
  python3 - "$1" "$2" <<'PY'
import json, sys, time
log, want = sys.argv[1:3]
end = time.time() + 30
while time.time() < end:
    try:
        lines = [json.loads(l) for l in open(log)]
    except FileNotFoundError:
        lines = []
    results = [t for l in lines for t in l["texts"] if t.startswith("tool_result: ")]
    if any(want in r for r in results): print(results[-1][:160]); sys.exit(0)
    time.sleep(0.2)
sys.exit("the model never got a tool result with %r; results: %r" % (want, results))
PY
}

# 1. default mode: the question through PermissionRequest.
start_case 1 default "$question"
request=$(pending_request "$session")
id=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); assert r["kind"] == "question", r; assert [o["label"] for o in r["questions"][0]["options"]] == ["PostgreSQL", "SQLite"], r; print(r["request_id"])' "$request")
tui_wait "$pane" 'Which database\?' 10   # the terminal's own picker races the phone
[ "$(answer "$session" "$id" '{"behavior": "allow"}')" = 422 ] || { echo "an allow without answers was taken" >&2; exit 1; }
[ "$(answer "$session" "$id" '{"behavior": "allow", "answers": {"Which database?": "SQLite"}}')" = 200 ]
got=$(tool_result "$log" '"Which database?"="SQLite"')
tui_wait "$pane" "$TUI_CLAUDE_IDLE" 30
echo "1. default mode: the question ($id) answered from the phone; the model got: $got"

# 2. acceptEdits mode: the question through PreToolUse, asked once.
start_case 2 acceptEdits "$question"
request=$(pending_request "$session")
id=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["request_id"])' "$request")
[ "$(answer "$session" "$id" '{"behavior": "allow", "answers": {"Which database?": "My own words: DuckDB"}}')" = 200 ]
got=$(tool_result "$log" '"Which database?"="My own words: DuckDB"')
count=$(api "/v1/sessions/$session/permission-requests" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["permission_requests"]))')
[ "$count" = 1 ] || { echo "the question was asked $count times" >&2; exit 1; }
echo "2. acceptEdits mode: the question asked once (PreToolUse), free text answered; the model got: $got"

# 3. default mode: "always allow" from the phone.
start_case 3 default '{"name": "Bash", "input": {"command": "npm test", "description": "Run the tests"}}'
request=$(pending_request "$session")
id=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); assert r["suggestions"], r; print(r["request_id"])' "$request")
label=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["suggestions"][0]["label"])' "$request")
[ "$(answer "$session" "$id" '{"behavior": "allow", "suggestion": 0}')" = 200 ]
tool_result "$log" 'npm' >/dev/null
python3 - "$work/project-3/.claude/settings.local.json" <<'PY'
import json, sys
allowed = json.load(open(sys.argv[1])).get("permissions", {}).get("allow", [])
assert any(rule.startswith("Bash(npm test") for rule in allowed), "no rule written: %r" % allowed
PY
echo "3. \"$label\" chosen on the phone: Claude Code wrote the rule"

# 4. The person answers at the terminal's picker first.
start_case 4 default "$question"
request=$(pending_request "$session")
id=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["request_id"])' "$request")
tui_wait "$pane" 'Which database\?' 10
sleep 0.5
tui_enter "$pane"    # option 1, PostgreSQL
started=$(date +%s.%N)
python3 - "$BROKER_URL" "$LOOPX_TOKEN" "$session" "$id" <<'PY'
import json, sys, time, urllib.request
url, token, session, rid = sys.argv[1:5]
end = time.time() + 5
while True:
    req = urllib.request.Request(f"{url}/v1/sessions/{session}/permission-requests/{rid}",
                                 headers={"Authorization": f"Bearer {token}"})
    r = json.load(urllib.request.urlopen(req))
    if r["state"] != "pending":
        assert (r["state"], r["answered_via"]) == ("expired", "terminal"), r
        sys.exit(0)
    if time.time() > end: sys.exit("still pending 5 s after the terminal's answer")
    time.sleep(0.1)
PY
took=$(python3 -c "import time; print('%.1f' % (time.time() - $started))")
[ "$(answer "$session" "$id" '{"behavior": "allow", "answers": {"Which database?": "SQLite"}}')" = 409 ]
got=$(tool_result "$log" '"Which database?"="PostgreSQL"')
echo "4. answered at the terminal first: retired in ${took}s as answered there, a late answer refused (409); the model got: $got"
