#!/usr/bin/env bash
# The real Codex (npm @openai/codex, pinned) runs `loopx hook` through its own
# hook runner against a stub Responses API (stub_responses.py) and a live
# broker, in a throwaway HOME. The hooks are installed and trusted by
# `loopx hook install --agent codex --trust` (no bypass flag: Codex runs them
# because its own trust says so).
# - `codex exec`: a Web message queued while the first turn is under way is
#   delivered by the Stop hook, answered by the stub and completed; a second
#   message queued before `codex exec resume` is delivered and answered in
#   the resumed thread (the same host session).
# - `codex app-server` with approval policy `on-request` (`codex exec` never
#   asks): the PermissionRequest hook puts the shell command's approval on the
#   session; answered as the Web page does, allowed runs it, denied does not.
#
# Usage: tests/hooks/codex.sh [path/to/loopx]   (default target/debug/loopx)
set -euo pipefail
cd "$(dirname "$0")/../.."
loopx=$(realpath "${1:-target/debug/loopx}")
source tests/support/live_broker.sh
source tests/support/doc_block.sh
codex=$(npm_bin @openai/codex@0.171.0 codex)
"$codex" --version

export LOOPX_TOKEN=hooks-test-token HOME="$work/home" STUB_API_KEY=sk-stub
unset CODEX_HOME
mkdir -p "$HOME/.codex" "$work/project"
project=$(realpath "$work/project")   # as Codex names it
git -C "$project" init -q
start_broker "$loopx" --data-dir "$work/data"
model_port=$(free_port)
python3 tests/hooks/stub_responses.py "$model_port" "$work/gate" 2>"$work/model.log" &
model_pid=$!
trap 'kill $model_pid 2>/dev/null; stop_broker' EXIT

# The user's own config, which --trust must keep.
cat >"$HOME/.codex/config.toml" <<EOF
# the test's Codex: a stub model
model = "stub-model"
model_provider = "stub"

[model_providers.stub]
name = "stub"
base_url = "http://127.0.0.1:$model_port/v1"
wire_api = "responses"
env_key = "STUB_API_KEY"
EOF
cp "$HOME/.codex/config.toml" "$work/user-config.before"

# The host session is Codex's thread id, known only once Codex runs: the
# hooks bind with the bind flags.
bind=(--goal-id g-codex --agent-id agent-codex --executor-endpoint-id exec-ci)
install=("$loopx" hook install --agent codex --project-dir "$project" "${bind[@]}" --broker-url "$BROKER_URL")
"${install[@]}" >"$work/install.out"
grep -q -- "--trust" "$work/install.out"
"${install[@]}" --codex "$codex" --trust | tee "$work/trust.out"
grep -q "Stop hook: trusted" "$work/trust.out"
"${install[@]}" --codex "$codex" --trust >"$work/trust-again.out"
grep -q "Stop hook: unchanged (trusted)" "$work/trust-again.out"
grep -q "project $project: unchanged (trusted)" "$work/trust-again.out"
head -c "$(wc -c <"$work/user-config.before")" "$HOME/.codex/config.toml" | cmp - "$work/user-config.before"

sessions() { # the ids of the goal's sessions, one a line
  curl -fsS -H "Authorization: Bearer $LOOPX_TOKEN" "$BROKER_URL/v1/sessions?goal_id=g-codex" |
    python3 -c 'import json,sys; [print(s["session_id"]) for s in json.load(sys.stdin)["sessions"]]'
}
run_codex() { # OUT ARGS...: codex exec in the project, its --json events in OUT
  local out=$1
  shift
  (cd "$project" && timeout 120 "$codex" exec --json "$@" </dev/null >"$out" 2>>"$work/codex.log")
}

# 1. The first run: its SessionStart hook binds the session; the stub holds
# the first answer until the Web message is queued.
run_codex "$work/run1.jsonl" "Hello." &
codex_pid=$!
session=
for _ in $(seq 300); do
  session=$(curl -fsS -H "Authorization: Bearer $LOOPX_TOKEN" "$BROKER_URL/v1/sessions?goal_id=g-codex" |
    python3 -c 'import json,sys; print(next((s["session_id"] for s in json.load(sys.stdin)["sessions"] ), ""))')
  [ -n "$session" ] && break
  sleep 0.1
done
[ -n "$session" ] || { echo "no hook bound a session" >&2; cat "$work/codex.log" >&2; exit 1; }
for _ in $(seq 300); do  # UserPromptSubmit recorded the prompt as a terminal turn
  curl -fsS -H "Authorization: Bearer $LOOPX_TOKEN" "$BROKER_URL/v1/sessions/$session/turns" |
    grep -q '"origin":"terminal"' && break
  sleep 0.1
done
"$loopx" chat send --broker-url "$BROKER_URL" --session-id "$session" --text "From the web: what is 2+2?" >/dev/null
touch "$work/gate"
wait "$codex_pid"
thread=$(python3 -c 'import json,sys; print(next(json.loads(l)["thread_id"] for l in open(sys.argv[1]) if json.loads(l).get("type") == "thread.started"))' "$work/run1.jsonl")

# 2. A message queued before `codex exec resume`: the same thread, the same
# session.
"$loopx" chat send --broker-url "$BROKER_URL" --session-id "$session" --text "From the web: and 3+3?" >/dev/null
run_codex "$work/run2.jsonl" resume "$thread" "Go on."
[ "$(sessions)" = "$session" ]

turns=$(curl -fsS -H "Authorization: Bearer $LOOPX_TOKEN" "$BROKER_URL/v1/sessions/$session/turns")
projection=$(curl -fsS -H "Authorization: Bearer $LOOPX_TOKEN" "$BROKER_URL/v1/sessions/$session")
python3 - "$turns" "$projection" "$work/run1.jsonl" "$work/run2.jsonl" <<'PY'
import json, sys
turns = json.loads(sys.argv[1])["turns"]
# SessionEnd ran when `codex exec resume` ended.
assert json.loads(sys.argv[2])["agent"]["state"] == "away", sys.argv[2]
# One conversation: each prompt given on the command line is a turn of
# origin "terminal" in its place, answered by the model (issue 37).
assert [(t["seq"], t["origin"]) for t in turns] == \
    [(1, "terminal"), (2, "web"), (3, "web"), (4, "terminal")], turns
for turn, prompt in zip([turns[0], turns[3]], ["Hello.", "Go on."]):
    assert turn["text"] == prompt and turn["state"] == "completed", turn
    assert turn["response"]["message"].startswith("Stub answer. ["), turn
    print("codex exec", "the terminal's prompt answered:", turn["response"]["message"])
turns = [t for t in turns if t["origin"] == "web"]
assert len(turns) == 2, turns
for turn, asked in zip(turns, ["what is 2+2?", "and 3+3?"]):
    assert turn["state"] == "completed", turn
    answer = turn["response"]["message"]
    # The stub echoes the tail of the Stop hook's instruction and the
    # question in it.
    assert answer.startswith("Stub answer. [") and "as your answer" in answer, answer
    assert answer.endswith("Asked: From the web: " + asked), answer
    print("codex exec", "delivered and answered:", answer)
for run in sys.argv[3:]:
    events = [json.loads(line) for line in open(run)]
    assert any(e.get("type") == "turn.completed" for e in events), events
PY

# 3. Approvals through `codex app-server`.
python3 tests/hooks/codex_app_server.py "$codex" "$project" "$BROKER_URL" g-codex

# The README's Codex block (### Codex with hooks), as pasted, in a project of its own: its install
# with --trust and its doctor (codex on PATH, the broker by environment).
readme_project=$(realpath "$(mktemp -d "$work/readme.XXXX")")
git -C "$readme_project" init -q
doc_block README.md '### Codex with hooks' >"$work/readme-codex.sh"
grep -q -- "--trust" "$work/readme-codex.sh"
mkdir -p "$work/bin"
ln -sf "$codex" "$work/bin/codex"
ln -sf "$loopx" "$work/bin/loopx"
(cd "$readme_project" && PATH="$work/bin:$PATH" LOOPX_BROKER_URL="$BROKER_URL" bash -euo pipefail "$work/readme-codex.sh") >"$work/readme-codex.out" 2>&1 \
  || { echo "the README's Codex block failed:"; cat "$work/readme-codex.out"; exit 1; }
grep -q "Stop hook: trusted" "$work/readme-codex.out"
grep -q "^ok: the broker at" "$work/readme-codex.out"
echo "the README's Codex block: installed, trusted, checked"
