#!/usr/bin/env bash
# Waking an idle agent (issue 36), with the real Codex TUI (npm @openai/codex,
# pinned) in a private tmux server against a stub Responses API
# (tests/wake/stub_responses.py) and a live broker: the hooks from
# `loopx hook install --agent codex` with the bind flags, trusted with
# Codex's own hashes; codex started in a pane as a person would (its default:
# the shared background server, which runs the hooks).
#
#  0. the harness: codex at its composer with no first-run screen; a prompt
#     typed by the test is answered and its hooks bind the session (Codex
#     runs SessionStart at the first prompt, not at start-up)
#  1. idle 5 s, then one Web message: typed, answered
#  2. three messages queued while idle: three answers, in order
#  3. a multi-line message reaches the model as one prompt
#  4. "/new everything" is text: the model gets it with the earlier conversation
#  5. after codex exits and the shell is back in the pane, a message is not
#     typed into the shell
#  6. a codex started afterwards in another pane (the shared background
#     server, started by the first, runs its hooks) is woken in its own pane
#  7. two codex running at once in two panes: each one's message is typed
#     into its own pane
#  8. (issue 55) Esc during a slow turn: within 5 s the message it worked on
#     is cancelled `interrupted` (read off Codex's rollout file), and the
#     next queued message is typed in and answered; then codex exits with
#     nothing waiting and its session closes itself
#  9. (issue 55) `/new` typed at the composer: the new thread continues the
#     conversation (one open session, `continued_in`), and a message to it
#     is typed in and answered
# 10. (issue 59) plain `codex` (its shared background server): the hooks
#     start the Codex bridge, which delivers a Web message into the thread
#     with `turn/start` (nothing typed), answered with the turn's message,
#     recorded once (not also as a prompt typed at the terminal)
#
# Usage: tests/wake/codex.sh [path/to/loopx]   (default target/debug/loopx)
#   WAKE_HARNESS_ONLY=1 stops after 0 (runs without the feature);
#   WAKE_CASES="1 5" runs only those cases after 0.
set -euo pipefail
cd "$(dirname "$0")/../.."
loopx=$(realpath "${1:-target/debug/loopx}")
source tests/support/live_broker.sh
source tests/wake/tui.sh
source tests/wake/turns.sh
version=0.171.0

(cd "$work" && npm install --silent --no-audit --no-fund "@openai/codex@$version" >/dev/null)
codex="$work/node_modules/.bin/codex"
"$codex" --version

export LOOPX_TOKEN=wake-test-token HOME="$work/home" STUB_API_KEY=sk-stub
unset CODEX_HOME TMUX TMUX_PANE
# One project per agent, each with its own goal (the hooks bind by it).
mkdir -p "$HOME" "$work/project" "$work/project2" "$work/project-a" "$work/project-b" "$work/project-esc" \
  "$work/project-new" "$work/project-plain"
project=$(realpath "$work/project")   # as Codex names it
project2=$(realpath "$work/project2")
project_a=$(realpath "$work/project-a")
project_b=$(realpath "$work/project-b")
project_esc=$(realpath "$work/project-esc")
project_new=$(realpath "$work/project-new")
project_plain=$(realpath "$work/project-plain")
start_broker "$loopx" --data-dir "$work/data" --close-exited-after 2s
model_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export STUB_LOG="$work/model-requests.jsonl"
python3 tests/wake/stub_responses.py "$model_port" 2>"$work/model.log" &
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
  tui_stop   # Codex's background server carries the pane's TMUX: it is ended here too
  kill $model_pid 2>/dev/null
  stop_broker
}
trap cleanup EXIT
export TERM=xterm-256color SHELL=/bin/bash

tui_codex_home "$model_port" "$project" "$project2" "$project_a" "$project_b" "$project_esc" "$project_new" "$project_plain"
for dir in "$project" "$project2" "$project_a" "$project_b" "$project_esc" "$project_new" "$project_plain"; do
  git -C "$dir" init -q
  "$loopx" hook install --agent codex --project-dir "$dir" --goal-id "g-$(basename "$dir")" \
    --agent-id agent-wake --executor-endpoint-id exec-ci --broker-url "$BROKER_URL" >/dev/null
  tui_codex_trust_hooks "$dir"
done
tui_start

# 0. The harness.
pane=$(tui_window codex "$project")
tui_wait "$pane" '^wake\$ ' 10
tui_codex "$pane"
tui_type "$pane" "Typed by the test itself."
sleep 0.5   # Codex takes an Enter within ~100 ms of fast input as part of a paste
tui_enter "$pane"
tui_wait "$pane" 'Stub answer\. \[Typed by the test itself\.\]' 30
tui_wait "$pane" "$TUI_CODEX_IDLE" 10
session=$(open_session g-project)
state=$(api "/v1/sessions/$session" | python3 -c 'import json, sys; print(json.load(sys.stdin)["agent"]["state"])')
[ "$state" = waiting ] || { echo "the agent is $state after its turn, not waiting" >&2; exit 1; }
echo "harness: codex at its composer in $pane, session $session bound by its hooks, a typed prompt answered"
if [ -n "${WAKE_HARNESS_ONLY:-}" ]; then exit 0; fi
on() { [[ " ${WAKE_CASES:-1 2 3 4 5 6 7 8 9 10} " == *" $1 "* ]]; }

# 1. Idle for 5 s, then one Web message.
if on 1; then
sleep 5
text1="Case one: what is 2+2?"
seq1=$(send "$session" "$text1")
answer=$(answers "$session" 60 "$seq1")
expect_answer "$answer" "$seq1" "$text1"
tui_wait "$pane" "^› \[LoopX #$seq1( [a-z]+)?\] Case one" 5
echo "1. idle agent woken: #$seq1 answered: $answer"
fi

# 2. Three messages queued while idle, answered in order.
if on 2; then
tui_wait "$pane" "$TUI_CODEX_IDLE" 30
seqs=()
for n in first second third; do seqs+=("$(send "$session" "Case two, the $n of three.")"); done
mapfile -t got < <(answers "$session" 120 "${seqs[@]}")
i=0
for n in first second third; do
  expect_answer "${got[$i]}" "${seqs[$i]}" "Case two, the $n of three."
  i=$((i + 1))
done
echo "2. three queued messages answered in order: ${seqs[*]}"
fi

# 3. A multi-line message is one prompt.
if on 3; then
tui_wait "$pane" "$TUI_CODEX_IDLE" 30
text3=$'Case three, line one\nline two\n\nline four, the last'
seq3=$(send "$session" "$text3")
answer=$(answers "$session" 60 "$seq3")
python3 - "$STUB_LOG" "$seq3" <<'PY'
import json, re, sys
log, seq = sys.argv[1], sys.argv[2]
lasts = [json.loads(l)["texts"][-1] for l in open(log) if json.loads(l)["texts"]]
mine = [t for t in lasts if "Case three" in t or "line four, the last" in t]
assert len(mine) == 1, "case three reached the model as %d prompts: %r" % (len(mine), mine)
assert re.fullmatch(r"\[LoopX #%s( [a-z]+)?\] Case three, line one\nline two\n\nline four, the last" % seq, mine[0]), mine[0]
PY
echo "3. the multi-line message #$seq3 was one prompt: $answer"
fi

# 4. "/new everything" is a message, sent with the conversation before it.
if on 4; then
tui_wait "$pane" "$TUI_CODEX_IDLE" 30
seq4=$(send "$session" "/new everything")
answer=$(answers "$session" 60 "$seq4")
expect_answer "$answer" "$seq4" "/new everything"
python3 - "$STUB_LOG" "$seq4" <<'PY'
import json, re, sys
log, seq = sys.argv[1], sys.argv[2]
reqs = [json.loads(l)["texts"] for l in open(log)]
mine = [r for r in reqs if r and re.fullmatch(r"\[LoopX #%s( [a-z]+)?\] /new everything" % seq, r[-1])]
assert len(mine) == 1, mine
assert "Typed by the test itself." in mine[0] and len(mine[0]) > 1, mine[0]
PY
echo "4. /new everything (#$seq4) reached the model as text, with the earlier conversation"
fi

# 5. Codex exits (Ctrl-C at an idle composer); the shell is back: a message
# is not typed into it. Typed there, its second line would create the marker.
if on 5; then
tui_wait "$pane" "$TUI_CODEX_IDLE" 30
# A draft in the composer keeps the message sent now waiting; Ctrl-C clears
# the draft and a second exits codex with the message still queued (issue
# 55: a session with messages waiting stays open for codex to be resumed).
tui_type "$pane" "a draft of mine"
sleep 1
seq5=$(send "$session" "Case five, not for the shell
touch $work/typed-into-shell")
sleep 2
state=$(turn_state "$session" "$seq5")
[ "$state" = queued ] || { echo "message #$seq5 is $state while a draft was in the composer" >&2; exit 1; }
tui send-keys -t "$pane" C-c
sleep 0.3
tui send-keys -t "$pane" C-c
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
echo "5. after codex exited, #$seq5 stayed queued and the shell got nothing"
fi

# A codex in PANE, in DIR, at its composer after a first prompt of its own
# (Codex runs SessionStart then); prints nothing.
codex_ready() {
  tui_wait "$1" '^wake\$ ' 10
  tui_codex "$1"
  tui_type "$1" "$2"
  sleep 0.5
  tui_enter "$1"
  tui_wait "$1" "Stub answer\\. \\[$2\\]" 30
  tui_wait "$1" "$TUI_CODEX_IDLE" 10
}

# 6. The first codex has exited (case 5, or here); its background server
# runs on and runs the hooks of a codex started now in another pane.
if on 6; then
if [ "$(tui_foreground "$pane")" != bash ]; then
  tui send-keys -t "$pane" C-c
  tui_wait "$pane" '^wake\$ $' 20
fi
pane=$(tui_window codex2 "$project2")
codex_ready "$pane" "Typed into the second codex."
session2=$(open_session g-project2)
sleep 3
text6="Case six, to the second codex."
seq6=$(send "$session2" "$text6")
answer=$(answers "$session2" 60 "$seq6")
expect_answer "$answer" "$seq6" "$text6"
tui_wait "$pane" "^› \\[LoopX #$seq6( [a-z]+)?\\] Case six" 5
echo "6. a codex started after the first exited was woken in its own pane: #$seq6 answered: $answer"
fi

# 7. Two codex at once, in two panes (one shared background server): each
# message is typed into its own agent's pane.
if on 7; then
pane_a=$(tui_window codex-a "$project_a")
codex_ready "$pane_a" "Typed into codex A."
pane_b=$(tui_window codex-b "$project_b")
codex_ready "$pane_b" "Typed into codex B."
session_a=$(open_session g-project-a)
session_b=$(open_session g-project-b)
sleep 3
seq_a=$(send "$session_a" "Case seven, for codex A.")
seq_b=$(send "$session_b" "Case seven, for codex B.")
answer_a=$(answers "$session_a" 60 "$seq_a")
answer_b=$(answers "$session_b" 60 "$seq_b")
expect_answer "$answer_a" "$seq_a" "Case seven, for codex A."
expect_answer "$answer_b" "$seq_b" "Case seven, for codex B."
tui_wait "$pane_a" "Case seven, for codex A" 5
tui_wait "$pane_b" "Case seven, for codex B" 5
! tui_screen "$pane_a" | grep -q "for codex B" || { echo "codex B's message was typed into codex A's pane" >&2; exit 1; }
! tui_screen "$pane_b" | grep -q "for codex A" || { echo "codex A's message was typed into codex B's pane" >&2; exit 1; }
echo "7. two codex at once: each message typed into its own pane"
fi

# 8. Esc during a slow turn: Codex runs no Stop hook; it writes turn_aborted
# to its rollout file, which the waker reads.
if on 8; then
pane=$(tui_window codex-esc "$project_esc")
codex_ready "$pane" "Typed into the codex of case eight."
session_esc=$(open_session g-project-esc)
sleep 3
slow=$(send "$session_esc" "[slow] Case eight, take your time.")
next=$(send "$session_esc" "Case eight, after the interrupt.")
tui_wait "$pane" "\[LoopX #$slow( [a-z]+)?\] \[slow\] Case eight" 30
for _ in $(seq 50); do [ "$(turn_state "$session_esc" "$slow")" = claimed ] && break; sleep 0.2; done
tui_wait "$pane" 'Working on it, slowly' 15
sleep 1
tui send-keys -t "$pane" Escape
t0=$(date +%s.%N)
waited=$(interrupted "$session_esc" "$slow" "$t0")
answer=$(answers "$session_esc" 60 "$next")
expect_answer "$answer" "$next" "Case eight, after the interrupt."
echo "8. Esc during #$slow settled it interrupted in ${waited}s; #$next typed in next: $answer"
# Then codex exits with nothing waiting: its session closes itself.
tui_wait "$pane" "$TUI_CODEX_IDLE" 30
tui send-keys -t "$pane" C-c
tui_wait "$pane" '^wake\$ $' 20
closed_within "$session_esc" 15
echo "8. codex exited with nothing waiting: its session closed itself"
fi

# 9. /new: Codex starts a new thread (a new session id) in the same TUI and
# terminal; the hooks bind it at its first prompt, and it continues the old.
if on 9; then
pane=$(tui_window codex-new "$project_new")
codex_ready "$pane" "Typed into the codex of case nine."
old=$(open_session g-project-new)
tui_type "$pane" "/new"
sleep 0.5
tui_enter "$pane"
# In a git repository Codex asks where the new thread runs: here.
tui_wait "$pane" "Where should the new conversation run\\?" 10
tui_enter "$pane"
tui_wait "$pane" "$TUI_CODEX_IDLE" 20
# Codex binds a thread at its first prompt (SessionStart runs then).
codex_first="First prompt of the new thread."
tui_type "$pane" "$codex_first"
sleep 0.5
tui_enter "$pane"
tui_wait "$pane" "Stub answer\\. \\[$codex_first\\]" 30
new=$(continued "$old")
open=$(open_sessions g-project-new)
[ "$open" = "$new" ] || { echo "open sessions after /new: $open (not just $new)" >&2; exit 1; }
tui_wait "$pane" "$TUI_CODEX_IDLE" 20
sleep 2
seq=$(send "$new" "Case nine, after /new.")
answer=$(answers "$new" 60 "$seq")
expect_answer "$answer" "$seq" "Case nine, after /new."
echo "9. /new continued $old in $new (one open session); #$seq typed in: $answer"
fi

# 10. Plain codex: its threads live in the shared background server, whose
# hooks start the bridge; messages go in through the server, not the pane.
if on 10; then
pane=$(tui_window codex-plain "$project_plain")
tui_wait "$pane" '^wake\$ ' 10
tui_type "$pane" "$(printf '%q' "$codex")"
tui_enter "$pane"
tui_wait "$pane" "$TUI_CODEX_IDLE" 60
first="Typed into plain codex."
tui_type "$pane" "$first"
sleep 0.5
tui_enter "$pane"
tui_wait "$pane" "Stub answer\\. \\[$first\\]" 30
tui_wait "$pane" "$TUI_CODEX_IDLE" 20
session_plain=$(open_session g-project-plain)
for _ in $(seq 100); do
  ls "$work/data/codex-bridges/"*.lock >/dev/null 2>&1 && break
  sleep 0.1
done
sleep 2
seq=$(send "$session_plain" "Case ten, through the bridge.")
answer=$(answers "$session_plain" 60 "$seq")
expect_answer "$answer" "$seq" "Case ten, through the bridge."
tui_wait "$pane" "Case ten, through the bridge" 10
api "/v1/sessions/$session_plain/turns?limit=200" | python3 -c '
import json, sys
turns = json.load(sys.stdin)["turns"]
mine = [t for t in turns if "Case ten, through the bridge." in t["text"]]
assert len(mine) == 1 and mine[0]["origin"] == "web", "recorded %r" % [(t["seq"], t["origin"], t["text"][:40]) for t in turns]
'
bridge=$(pgrep -f "$(basename "$loopx") codex bridge" | head -1)
[ -n "$bridge" ] || { echo "no codex bridge runs" >&2; exit 1; }
! tui_screen "$pane" | grep -q "Blocked by hook" || { echo "the message came as a Stop hook's block" >&2; exit 1; }
echo "10. plain codex: the bridge delivered #$seq with no typing: $answer"
# The bridge killed mid-turn, then started again (as the next hook would):
# the message it delivered is answered by that turn, once.
mapfile -d '' -t argv < "/proc/$bridge/cmdline"
seq=$(send "$session_plain" "[slowish] Case ten, a bridge restart.")
tui_wait "$pane" "Working on it, slowly" 20
kill -9 "$bridge"
"${argv[@]}" </dev/null >/dev/null 2>&1 &
answer=$(answers "$session_plain" 60 "$seq")
python3 - "$STUB_LOG" <<'PY'
import json, sys
asked = [l for l in open(sys.argv[1]) if "a bridge restart." in json.dumps(json.loads(l)["texts"][-1:])]
assert len(asked) == 1, "the message reached the model %d times" % len(asked)
PY
case "$answer" in *"Case ten, a bridge restart."*) ;; *) echo "answered with $answer" >&2; exit 1 ;; esac
open=$(open_sessions g-project-plain)
[ "$open" = "$session_plain" ] || { echo "open sessions for one codex thread: $open (a side thread bound?)" >&2; exit 1; }
echo "10. the bridge killed mid-turn: #$seq answered by its turn, once: $answer"
fi

latency_report "$STUB_LOG"
