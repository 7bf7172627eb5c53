#!/usr/bin/env bash
# Waking an idle agent (issue 36), with the real Claude Code TUI (npm
# @anthropic-ai/claude-code, pinned) in a private tmux server against the stub
# model (tests/hooks/stub_model.py) and a live broker. The hooks come from
# `loopx hook install` with the bind flags; claude is started in a pane as a
# person would; messages are sent with `loopx chat send` and must be typed
# into the idle agent's prompt (`[LoopX #<seq> <origin>] <text>`), answered, and read
# back from GET /v1/sessions/{id}/turns.
#
#  0. the harness itself: claude at its prompt with no first-run screen, the
#     installed hooks bind the session, a prompt typed by the test is answered
#  1. idle 5 s, then one Web message: typed, answered
#  2. three messages queued while idle: three answers, in order, each typed
#     in after the turn before (no Stop block: no hook error on the screen)
#  3. a multi-line message reaches the model as one prompt
#  4. "/clear everything" is text, not a command: the model gets it with the
#     earlier conversation
#  5. claude exits with a message waiting (sent while "/exit" was a draft):
#     the session stays open, the message queued, never typed into the shell
#     back in the pane, and nothing the hooks started is left running
#  6. `loopx run -- claude` (no tmux waker: TMUX unset in it) inside a pane:
#     a message reaches the idle agent; claude's exit ends loopx run
#  7. a claude just started in tmux, nothing typed into it yet, is woken too
#  8. (issue 53) a pane's `bash -c "claude; exec bash -i"`, claude killed
#     with SIGKILL: the shell left in its place never gets a message, in tmux
#     and under `loopx run`
#  9. (issue 53) a draft left in claude's prompt (typed while it worked) is
#     never merged with a message; the message is delivered once, on its own
# 10. (issue 55) Esc during a slow turn (tmux, then `loopx run`): within 5 s
#     the message it worked on is cancelled `interrupted`, the agent waits,
#     and the next queued message is typed in and answered
# 11. (issue 55) `/clear` typed at the terminal: the new Claude session
#     continues the conversation (one open session; the old one names it in
#     `continued_in`), and a message to it is typed in and answered; in
#     tmux and under `loopx run`
# Latency from send to typed (the stub's request) and the broker's
# enqueued -> claimed -> completed are printed.
#
# Usage: tests/wake/claude_code.sh [path/to/loopx]   (default target/debug/loopx)
#   WAKE_HARNESS_ONLY=1 stops after 0 (runs without the feature);
#   WAKE_CASES="1 5" runs only those cases after 0.
set -euo pipefail
cd "$(dirname "$0")/../.."
loopx=$(realpath "${1:-target/debug/loopx}")
source tests/support/live_broker.sh
source tests/wake/tui.sh
source tests/wake/turns.sh
version=2.1.332

(cd "$work" && npm install --silent --no-audit --no-fund "@anthropic-ai/claude-code@$version" >/dev/null)
claude="$work/node_modules/.bin/claude"
"$claude" --version

export LOOPX_TOKEN=wake-test-token HOME="$work/home"
mkdir -p "$HOME" "$work/project" "$work/project-run" "$work/project-fresh" \
  "$work/project-exec-tmux" "$work/project-exec-run" "$work/project-draft" \
  "$work/project-esc" "$work/project-esc-run" "$work/project-clear" "$work/project-clear-run"
start_broker "$loopx" --data-dir "$work/data" --close-exited-after 2s
model_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export STUB_LOG="$work/model-requests.jsonl"
python3 tests/hooks/stub_model.py "$model_port" 2>"$work/model.log" &
model_pid=$!
cleanup() {
  local status=$?
  if [ $status -ne 0 ] && [ -n "${pane:-}" ]; then
    echo "--- the pane at the failure ($pane):" >&2; tui_screen "$pane" >&2 || true
    for other in $(tui list-panes -a -F '#{pane_id}' 2>/dev/null); do
      [ "$other" = "$pane" ] && continue
      echo "--- pane $other (its last lines):" >&2; tui_screen "$other" | grep -v '^ *$' | tail -8 >&2 || true
    done
    echo "--- broker log (tail):" >&2; tail -20 "$work/broker.log" >&2 || true
  fi
  tui_stop
  kill $model_pid 2>/dev/null
  stop_broker
}
trap cleanup EXIT

# Claude Code's environment, inherited by every pane (tui_start copies it).
key=sk-stub-wake-0123456789abcdefghij
export ANTHROPIC_BASE_URL="http://127.0.0.1:$model_port" ANTHROPIC_API_KEY=$key \
  DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 TERM=xterm-256color SHELL=/bin/bash
unset TMUX TMUX_PANE
tui_claude_home "$key" "$work/project" "$work/project-run" "$work/project-fresh" \
  "$work/project-exec-tmux" "$work/project-exec-run" "$work/project-draft" \
  "$work/project-esc" "$work/project-esc-run" "$work/project-clear" "$work/project-clear-run"
tui_start

# 0. The harness: claude at its prompt, the hooks bind the session, a prompt
# typed here is answered.
"$loopx" hook install --agent claude-code --project-dir "$work/project" --goal-id g-wake \
  --agent-id agent-wake --executor-endpoint-id exec-ci --broker-url "$BROKER_URL"
pane=$(tui_window claude "$work/project")
tui_wait "$pane" '^wake\$ ' 10
tui_claude "$pane"
session=$(open_session g-wake)
[ "$(tui_foreground "$pane")" = claude ]
tui_type "$pane" "Typed by the test itself."
sleep 0.3
tui_enter "$pane"
tui_wait "$pane" 'Stub answer\. \[Typed by the test itself\.\]' 30
tui_wait "$pane" "$TUI_CLAUDE_IDLE" 10
state=$(api "/v1/sessions/$session" | python3 -c 'import json, sys; print(json.load(sys.stdin)["agent"]["state"])')
[ "$state" = waiting ] || { echo "the agent is $state after its turn, not waiting" >&2; exit 1; }
echo "harness: claude at its prompt in $pane, session $session bound by its hooks, a typed prompt answered"
if [ -n "${WAKE_HARNESS_ONLY:-}" ]; then exit 0; fi
on() { [[ " ${WAKE_CASES:-1 2 3 4 5 6 7 8 9 10 11} " == *" $1 "* ]]; }

# 1. Idle for 5 s, then one Web message.
if on 1; then
sleep 5
text1="Case one: what is 2+2?"
seq1=$(send "$session" "$text1")
answer=$(answers "$session" 60 "$seq1")
expect_answer "$answer" "$seq1" "$text1"
tui_wait "$pane" "^❯ \[LoopX #$seq1( [a-z]+)?\] Case one" 5
echo "1. idle agent woken: #$seq1 answered: $answer"
fi

# 2. Three messages queued while idle, answered in order.
if on 2; then
tui_wait "$pane" "$TUI_CLAUDE_IDLE" 30
seqs=()
for n in first second third; do seqs+=("$(send "$session" "Case two, the $n of three.")"); done
mapfile -t got < <(answers "$session" 120 "${seqs[@]}")
i=0
for n in first second third; do
  expect_answer "${got[$i]}" "${seqs[$i]}" "Case two, the $n of three."
  i=$((i + 1))
done
python3 - "$BROKER_URL" "$LOOPX_TOKEN" "$session" "${seqs[@]}" <<'PY'
import json, sys, urllib.request
url, token, session, seqs = sys.argv[1], sys.argv[2], sys.argv[3], [int(s) for s in sys.argv[4:]]
req = urllib.request.Request(f"{url}/v1/sessions/{session}/turns?limit=200", headers={"Authorization": f"Bearer {token}"})
turns = {t["seq"]: t for t in json.load(urllib.request.urlopen(req))["turns"]}
done = [turns[s]["completed_at"] for s in seqs]
assert done == sorted(done), "answered out of order: %r" % done
PY
# Typed in after each turn, never handed over by a Stop block (issue 55): the
# terminal shows each as a prompt, never "Stop hook reported a problem".
! tui_screen "$pane" | grep -q "Stop hook reported a problem" || {
  echo "a message was delivered as a Stop hook's error" >&2; exit 1; }
echo "2. three queued messages answered in order, each typed in, no hook error: ${seqs[*]}"
fi

# 3. A multi-line message is one prompt: one request whose last user text
# holds all its lines.
if on 3; then
tui_wait "$pane" "$TUI_CLAUDE_IDLE" 30
text3=$'Case three, line one\nline two\n\nline four, the last'
seq3=$(send "$session" "$text3")
answer=$(answers "$session" 60 "$seq3")
python3 - "$STUB_LOG" "$seq3" <<'PY'
import json, re, sys
log, seq = sys.argv[1], sys.argv[2]
lasts = [json.loads(l)["texts"][-1] for l in open(log) if json.loads(l)["texts"]]
mine = [t for t in lasts if "Case three" in t or "line four, the last" in t]
assert len(mine) == 1, "case three reached the model as %d prompts: %r" % (len(mine), mine)
t = mine[0]
assert re.search(r"\[LoopX #%s( [a-z]+)?\] Case three" % seq, t), "no marker of #%s in %r" % (seq, t)
for part in ("Case three, line one", "line two", "line four, the last"):
    assert part in t, "%r missing from the prompt %r" % (part, t)
assert t.index("line one") < t.index("line two") < t.index("line four"), t
PY
echo "3. the multi-line message #$seq3 was one prompt: $answer"
# A long one (over 800 characters, which Claude Code takes as a paste).
tui_wait "$pane" "$TUI_CLAUDE_IDLE" 30
text3b="Case three, a long one: $(printf 'word%.0s ' $(seq 175))the end."
seq3b=$(send "$session" "$text3b")
answer=$(answers "$session" 60 "$seq3b")
python3 - "$STUB_LOG" "$seq3b" <<'PY'
import json, sys
log, seq = sys.argv[1], sys.argv[2]
lasts = [json.loads(l)["texts"][-1] for l in open(log) if json.loads(l)["texts"]]
mine = [t for t in lasts if "Case three, a long one" in t]
assert len(mine) == 1, "the long message reached the model as %d prompts: %r" % (len(mine), [m[:120] for m in mine])
assert "word word" in mine[0] and "the end." in mine[0], mine[0][:200]
PY
echo "3. the long message #$seq3b (${#text3b} characters) was one prompt: $answer"
fi

# 4. "/clear everything" is a message: the model is sent it, with the
# conversation before it (a /clear would have wiped that).
if on 4; then
tui_wait "$pane" "$TUI_CLAUDE_IDLE" 30
seq4=$(send "$session" "/clear everything")
answer=$(answers "$session" 60 "$seq4")
expect_answer "$answer" "$seq4" "/clear everything"
python3 - "$STUB_LOG" "$seq4" <<'PY'
import json, re, sys
log, seq = sys.argv[1], sys.argv[2]
reqs = [json.loads(l)["texts"] for l in open(log)]
mine = [r for r in reqs if r and re.search(r"\[LoopX #%s( [a-z]+)?\] /clear everything" % seq, r[-1])]
assert len(mine) == 1, mine
assert any("Typed by the test itself." in t for t in mine[0]) and len(mine[0]) > 1, \
    "the earlier conversation was not sent with /clear everything: %r" % mine[0]
PY
echo "4. /clear everything (#$seq4) reached the model as text, with the earlier conversation"
fi

# 5. Claude exits; the shell is back in the pane: a message is not typed into
# it. Typed there, its second line would run and create the marker.
if on 5; then
tui_wait "$pane" "$TUI_CLAUDE_IDLE" 30
# "/exit" typed, not yet sent: a draft, so the message sent now waits; then
# the person's Enter exits claude with it still queued (issue 55: a session
# with messages waiting stays open for the agent to be resumed).
tui_type "$pane" "/exit"
sleep 1
seq5=$(send "$session" "Case five, not for the shell
touch $work/typed-into-shell")
sleep 2
state=$(turn_state "$session" "$seq5")
[ "$state" = queued ] || { echo "message #$seq5 is $state while /exit was a draft" >&2; exit 1; }
tui_enter "$pane"
tui_wait "$pane" '^wake\$ $' 20
[ "$(tui_foreground "$pane")" = bash ]
before=$(tui_screen "$pane" | grep -c 'LoopX #' || true)
sleep 10
open=$(api "/v1/sessions/$session" | python3 -c 'import json, sys; s = json.load(sys.stdin); print(s["state"], s["agent"]["state"])')
[ "$open" = "open away" ] || { echo "with a message waiting, the session is $open after the exit" >&2; exit 1; }
[ ! -e "$work/typed-into-shell" ] || { echo "message #$seq5 was typed into the shell" >&2; exit 1; }
after=$(tui_screen "$pane" | grep -c 'LoopX #' || true)
[ "$after" = "$before" ] || { echo "message #$seq5 was typed into the shell's line" >&2; exit 1; }
state=$(turn_state "$session" "$seq5")
[ "$state" = queued ] || { echo "message #$seq5 is $state, not queued, with no agent" >&2; exit 1; }
# Only the panes' own programs (the shells) still name our tmux server:
# nothing the hooks started outlives the agent.
panes=$(tui list-panes -a -F '#{pane_pid}')
for _ in $(seq 50); do
  left=$(tui_processes | grep -vxF "$panes" || true)
  [ -z "$left" ] && break
  sleep 0.1
done
if [ -n "$left" ]; then
  echo "left running after claude exited:" >&2
  ps -o pid,ppid,pgid,etime,args -p "$(echo $left | tr ' ' ,)" >&2
  exit 1
fi
echo "5. after /exit, #$seq5 stayed queued, the shell got nothing, nothing was left running"
fi

# 6. `loopx run -- claude`, inside a pane as its outer terminal, without
# TMUX so only loopx run can type into it.
if on 6; then
"$loopx" hook install --agent claude-code --project-dir "$work/project-run" --goal-id g-wake-run \
  --agent-id agent-wake --executor-endpoint-id exec-ci --broker-url "$BROKER_URL" >/dev/null
pane=$(tui_window run "$work/project-run")
tui_wait "$pane" '^wake\$ ' 10
tui_type "$pane" "env -u TMUX -u TMUX_PANE $(printf '%q' "$loopx") run --broker-url $BROKER_URL -- $(printf '%q' "$claude"); echo \"run exited \$?\""
tui_enter "$pane"
tui_wait "$pane" "$TUI_CLAUDE_IDLE" 60
session_run=$(open_session g-wake-run)
sleep 3
text6="Case six, through loopx run."
seq6=$(send "$session_run" "$text6")
answer=$(answers "$session_run" 60 "$seq6")
expect_answer "$answer" "$seq6" "$text6"
tui_wait "$pane" "$TUI_CLAUDE_IDLE" 30
tui send-keys -t "$pane" C-c
sleep 0.3
tui send-keys -t "$pane" C-c
tui_wait "$pane" '^run exited 0$' 20
tui_wait "$pane" '^wake\$ $' 5
# Nothing waited: the session closed itself (issue 55).
closed_within "$session_run" 15
echo "6. loopx run: #$seq6 answered: $answer; claude's exit ended loopx run with 0 and closed its idle session"
fi

# 7. A claude just started, with no prompt yet (no Stop has run): the first
# thing a person meets who starts it and walks away.
if on 7; then
"$loopx" hook install --agent claude-code --project-dir "$work/project-fresh" --goal-id g-wake-fresh \
  --agent-id agent-wake --executor-endpoint-id exec-ci --broker-url "$BROKER_URL" >/dev/null
pane=$(tui_window fresh "$work/project-fresh")
tui_wait "$pane" '^wake\$ ' 10
tui_claude "$pane"
session_fresh=$(open_session g-wake-fresh)
sleep 3
text7="Case seven, to a claude nobody typed into."
seq7=$(send "$session_fresh" "$text7")
answer=$(answers "$session_fresh" 60 "$seq7")
expect_answer "$answer" "$seq7" "$text7"
echo "7. a claude just started was woken: #$seq7 answered: $answer"
fi

# 8. `bash -c "claude; exec bash -i"` (bash keeps its pid for the shell),
# claude killed with SIGKILL (no SessionEnd): the shell left in its place
# gets nothing, in tmux and under loopx run.
if on 8; then
for way in tmux run; do
  dir="$work/project-exec-$way"
  "$loopx" hook install --agent claude-code --project-dir "$dir" --goal-id "g-wake-exec-$way" \
    --agent-id agent-wake --executor-endpoint-id exec-ci --broker-url "$BROKER_URL" >/dev/null
  pane=$(tui_window "exec-$way" "$dir")
  tui_wait "$pane" '^wake\$ ' 10
  inner="bash -c \"$(printf '%q' "$claude"); exec env PS1='after\\$ ' bash --norc --noprofile -i\""
  if [ "$way" = run ]; then
    inner="env -u TMUX -u TMUX_PANE $(printf '%q' "$loopx") run --broker-url $BROKER_URL -- $inner"
  fi
  tui_type "$pane" "$inner"
  tui_enter "$pane"
  tui_wait "$pane" "$TUI_CLAUDE_IDLE" 60
  session_exec=$(open_session "g-wake-exec-$way")
  sleep 2
  seq8=$(send "$session_exec" "Case eight, before the crash.")
  answers "$session_exec" 60 "$seq8" >/dev/null
  tui_wait "$pane" "$TUI_CLAUDE_IDLE" 30
  agent_pid=$(pgrep -f -n "^$claude\$" || pgrep -n -x claude)
  kill -9 "$agent_pid"
  tui_wait "$pane" '^after\$ ' 20
  seq8b=$(send "$session_exec" "Case eight, not for the shell
touch $work/typed-into-shell-$way")
  sleep 6
  [ ! -e "$work/typed-into-shell-$way" ] || { echo "$way: message #$seq8b ran in the shell" >&2; exit 1; }
  ! tui_screen "$pane" | grep -q "Case eight, not for the shell" || { echo "$way: #$seq8b typed into the shell" >&2; exit 1; }
  state=$(turn_state "$session_exec" "$seq8b")
  [ "$state" = queued ] || { echo "$way: message #$seq8b is $state, not queued" >&2; exit 1; }
  echo "8. $way: claude killed in 'bash -c \"claude; exec bash -i\"': #$seq8b stayed queued, the shell got nothing"
done
fi

# 9. A draft typed into claude's prompt while it works (the keys come
# before it goes idle): a message sent then waits; the person's Enter sends
# the draft alone; the message is delivered once, on its own.
if on 9; then
"$loopx" hook install --agent claude-code --project-dir "$work/project-draft" --goal-id g-wake-draft \
  --agent-id agent-wake --executor-endpoint-id exec-ci --broker-url "$BROKER_URL" >/dev/null
pane=$(tui_window draft "$work/project-draft")
tui_wait "$pane" '^wake\$ ' 10
tui_claude "$pane"
session=$(open_session g-wake-draft)
tui_type "$pane" "Case nine, the person's own prompt."
sleep 0.3
tui_enter "$pane"
tui_type "$pane" "my half typed draft about the bug"
tui_wait "$pane" '\A(?![\s\S]*esc to interrupt)[\s\S]*^❯.my half typed draft about the bug' 30
sleep 1
text9="Case nine, deploy is green."
seq9=$(send "$session" "$text9")
sleep 5
state=$(turn_state "$session" "$seq9")
[ "$state" = queued ] || { echo "message #$seq9 is $state while a draft is in the prompt" >&2; exit 1; }
tui_enter "$pane"
answer=$(answers "$session" 60 "$seq9")
python3 - "$STUB_LOG" <<'PY'
import json, sys
lasts = [json.loads(l)["texts"][-1] for l in open(sys.argv[1]) if json.loads(l)["texts"]]
drafts = [t for t in lasts if "my half typed draft" in t]
assert drafts and all("deploy is green" not in t for t in drafts), "the draft was merged: %r" % drafts
mine = [t for t in lasts if "Case nine, deploy is green." in t]
assert len(mine) == 1, "the message reached the model %d times: %r" % (len(mine), mine)
PY
echo "9. a draft in the prompt: #$seq9 waited, the draft went alone, the message once: $answer"
fi

# 10. Esc during a slow turn: no Stop hook runs. The waker reads the
# interrupt off claude's transcript; the broker settles the turn; the next
# message is typed in.
interrupted_then_next() {
  local pane=$1 session=$2 how=$3 seq slow next t0 waited answer
  slow=$(send "$session" "[slow] Case ten ($how), take your time.")
  next=$(send "$session" "Case ten ($how), after the interrupt.")
  tui_wait "$pane" "\[LoopX #$slow( [a-z]+)?\] \[slow\] Case ten" 30
  for _ in $(seq 50); do [ "$(turn_state "$session" "$slow")" = claimed ] && break; sleep 0.2; done
  tui_wait "$pane" 'esc to interrupt' 10
  sleep 1
  tui send-keys -t "$pane" Escape
  t0=$(date +%s.%N)
  waited=$(interrupted "$session" "$slow" "$t0")
  answer=$(answers "$session" 60 "$next")
  expect_answer "$answer" "$next" "Case ten ($how), after the interrupt."
  echo "10. $how: Esc during #$slow settled it interrupted in ${waited}s; #$next typed in next: $answer"
}
if on 10; then
"$loopx" hook install --agent claude-code --project-dir "$work/project-esc" --goal-id g-wake-esc \
  --agent-id agent-wake --executor-endpoint-id exec-ci --broker-url "$BROKER_URL" >/dev/null
pane=$(tui_window esc "$work/project-esc")
tui_wait "$pane" '^wake\$ ' 10
tui_claude "$pane"
interrupted_then_next "$pane" "$(open_session g-wake-esc)" tmux
"$loopx" hook install --agent claude-code --project-dir "$work/project-esc-run" --goal-id g-wake-esc-run \
  --agent-id agent-wake --executor-endpoint-id exec-ci --broker-url "$BROKER_URL" >/dev/null
pane=$(tui_window escrun "$work/project-esc-run")
tui_wait "$pane" '^wake\$ ' 10
tui_type "$pane" "env -u TMUX -u TMUX_PANE $(printf '%q' "$loopx") run --broker-url $BROKER_URL -- $(printf '%q' "$claude")"
tui_enter "$pane"
tui_wait "$pane" "$TUI_CLAUDE_IDLE" 60
interrupted_then_next "$pane" "$(open_session g-wake-esc-run)" "loopx run"
fi

# 11. /clear: Claude Code ends its session (SessionEnd, reason clear) and
# starts another (SessionStart, a new session id) in the same process and
# terminal; the hooks bind the new one, which continues the old.
cleared_then_message() {
  local pane=$1 goal=$2 how=$3 old new open seq answer
  old=$(open_session "$goal")
  tui_type "$pane" "/clear"
  sleep 0.3
  tui_enter "$pane"
  new=$(continued "$old")
  open=$(open_sessions "$goal")
  [ "$open" = "$new" ] || { echo "$how: open sessions after /clear: $open (not just $new)" >&2; exit 1; }
  api "/v1/sessions/$new" | python3 -c '
import json, sys
s = json.load(sys.stdin)
assert s["continued_from"] == sys.argv[1], s
' "$old"
  tui_wait "$pane" "$TUI_CLAUDE_IDLE" 20
  sleep 2
  seq=$(send "$new" "Case eleven ($how), after /clear.")
  answer=$(answers "$new" 60 "$seq")
  expect_answer "$answer" "$seq" "Case eleven ($how), after /clear."
  echo "11. $how: /clear continued $old in $new (one open session); #$seq typed in: $answer"
}
if on 11; then
"$loopx" hook install --agent claude-code --project-dir "$work/project-clear" --goal-id g-wake-clear \
  --agent-id agent-wake --executor-endpoint-id exec-ci --broker-url "$BROKER_URL" >/dev/null
pane=$(tui_window clear "$work/project-clear")
tui_wait "$pane" '^wake\$ ' 10
tui_claude "$pane"
cleared_then_message "$pane" g-wake-clear tmux
"$loopx" hook install --agent claude-code --project-dir "$work/project-clear-run" --goal-id g-wake-clear-run \
  --agent-id agent-wake --executor-endpoint-id exec-ci --broker-url "$BROKER_URL" >/dev/null
pane=$(tui_window clearrun "$work/project-clear-run")
tui_wait "$pane" '^wake\$ ' 10
tui_type "$pane" "env -u TMUX -u TMUX_PANE $(printf '%q' "$loopx") run --broker-url $BROKER_URL -- $(printf '%q' "$claude")"
tui_enter "$pane"
tui_wait "$pane" "$TUI_CLAUDE_IDLE" 60
cleared_then_message "$pane" g-wake-clear-run "loopx run"
fi

# Latency: send -> typed (the model's request for that prompt, our clock) and
# the broker's enqueued -> claimed -> completed.
latency_report "$STUB_LOG"
