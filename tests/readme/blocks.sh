#!/usr/bin/env bash
# Runs the README's and docs/' set-up blocks as a newcomer pastes them
# (issue 28), each in a fresh bash with only HOME, PATH and the variables the
# page says to set, against one live broker: the README's Quick start (with
# the built binary on PATH standing in for `cargo install`) and its hooks
# blocks, docs/mcp.md's permission answer, docs/http-api.md's upload and the
# owner's close, docs/operations.md's event stream, docs/lark.md's pairing and
# docs/phone.md's sign-in link.
# Every block must set what it uses, and answer no error.
#
# Usage: tests/readme/blocks.sh [path/to/loopx]   (default target/debug/loopx)
set -euo pipefail
cd "$(dirname "$0")/../.."
loopx=$(realpath "${1:-target/debug/loopx}")
source tests/support/live_broker.sh
source tests/support/doc_block.sh

fresh_home
mkdir -p "$work/bin"
ln -s "$loopx" "$work/bin/loopx"   # what `cargo install --path .` puts on PATH
start_broker "$loopx"
token=$(cat "$HOME/.local/share/loopx/owner.token")

# block FILE HEADING [N]: the Nth (default: first) bash block after a
# heading of FILE, on the test broker's port.
block() {
  doc_block "$@" | sed "s|http://127.0.0.1:7317|$BROKER_URL|g"
}

# Runs a block in a clean environment: HOME, PATH and the given variables only.
run_block() {
  local name=$1 file=$2
  shift 2
  env -i HOME="$HOME" PATH="$work/bin:/usr/bin:/bin" "$@" bash -euo pipefail "$file" >"$work/$name.out" 2>&1 \
    || { echo "$name failed:"; cat "$work/$name.out"; exit 1; }
  if grep -qF '"error"' "$work/$name.out"; then echo "$name answered an error:"; cat "$work/$name.out"; exit 1; fi
}

api() { curl -fsS -X "$1" -H "Authorization: Bearer $token" -H 'Content-Type: application/json' ${3:+-d "$3"} "$BROKER_URL$2"; }

# Quick start: installs loopx and serves. The install is stood in for by the
# binary on PATH (a release build is too slow here); the block must say how.
block README.md '## Quick start' >"$work/quick.sh"
grep -q '^cargo install --locked --path \.' "$work/quick.sh" || { echo "the Quick start does not install loopx"; exit 1; }
grep -q '^loopx serve' "$work/quick.sh" || { echo "the Quick start does not run loopx serve"; exit 1; }
env -i HOME="$HOME" PATH="$work/bin:/usr/bin:/bin" bash -c 'command -v loopx && loopx --version' >/dev/null

# A session with a pending permission request and an active claim.
thread='{"goal_id": "g-readme", "agent_id": "agent-readme", "host_surface": "claude-code", "host_session_id": "readme-host"}'
api POST /v1/agent-threads "$thread" >/dev/null
session=$(api POST /v1/sessions "${thread%\}}, \"executor_endpoint_id\": \"exec-readme\"}" | sed -n 's/.*"session_id":"\([^"]*\)".*/\1/p')
api POST "/v1/sessions/$session/permission-requests" '{"host_surface": "claude-code", "host_session_id": "readme-host", "request_id": "abcde", "tool_name": "Bash", "description": "Remove the build directory", "input_preview": "rm -rf build"}' >/dev/null
api POST "/v1/sessions/$session/messages" '{"origin": "web", "text": "are you there?"}' >/dev/null
api POST "/v1/sessions/$session/claims" '{"host_surface": "claude-code", "host_session_id": "readme-host", "claim_id": "readme-claim"}' >/dev/null

block docs/mcp.md '## Approving tool use from the Web page' >"$work/permissions.sh"
run_block permissions "$work/permissions.sh" SESSION="$session"
grep -qF '"state":"allowed"' "$work/permissions.out" || { echo "the permission block did not allow:"; cat "$work/permissions.out"; exit 1; }

# A message with a file, sent and read back byte for byte, in a folder of its own.
block docs/http-api.md '## Messages with files' >"$work/upload.sh"
grep -qF -- "-F 'message=" "$work/upload.sh" || { echo "the upload block sends no message part"; exit 1; }
mkdir -p "$work/upload"
(cd "$work/upload" && run_block upload "$work/upload.sh" SESSION="$session")
grep -q '^the file came back unchanged$' "$work/upload.out" || { echo "the upload block:"; cat "$work/upload.out"; exit 1; }

# The session's event stream, replayed from the start: it streams until it
# is stopped, so it is stopped after 3 s and must have shown the turns.
block docs/operations.md '## Watching: events and metrics' >"$work/events.sh"
set +e
env -i HOME="$HOME" PATH="$work/bin:/usr/bin:/bin" TOKEN="$token" SESSION="$session" \
  timeout 3 bash "$work/events.sh" >"$work/events.out" 2>&1
status=$?
set -e
[ "$status" = 124 ] && grep -q '^event: turn$' "$work/events.out" \
  || { echo "the event stream block: exit $status"; cat "$work/events.out"; exit 1; }

# Lark pairing: a one-time code for the session, as the line to send the bot.
block docs/lark.md '4. Pair a chat with a session' >"$work/pair.sh"
run_block pair "$work/pair.sh" SESSION="$session" LOOPX_BROKER_URL="$BROKER_URL"
grep -Eq '^/link [A-Z0-9]+$' "$work/pair.out" || { echo "the pair block:"; cat "$work/pair.out"; exit 1; }

# A phone's sign-in link: the link for the address the phone uses, and its QR code.
block docs/phone.md '## 2. Sign the phone in' >"$work/phone.sh"
run_block phone "$work/phone.sh" LOOPX_BROKER_URL="$BROKER_URL"
grep -Eq '^  https://machine\.tailnet-name\.ts\.net/#link=[0-9A-Z]{26}$' "$work/phone.out" && grep -q '▀' "$work/phone.out" \
  || { echo "the phone sign-in block:"; cat "$work/phone.out"; exit 1; }

block docs/http-api.md 'The owner can always close a session' >"$work/close.sh"
run_block close "$work/close.sh" SESSION="$session"
for expected in '"released":true' '"state":"closed"'; do
  grep -qF "$expected" "$work/close.out" || { echo "the close block: no $expected in:"; cat "$work/close.out"; exit 1; }
done

# Claude Code with hooks: install in a fresh project, then the doctor, which
# must find the entries, the binary, this broker and no refusal.
block README.md '### Claude Code with hooks' >"$work/hooks.sh"
grep -q '^loopx hook install --agent claude-code' "$work/hooks.sh" || { echo "the hooks block does not install"; exit 1; }
mkdir -p "$work/project"
(cd "$work/project" && run_block hooks "$work/hooks.sh" LOOPX_BROKER_URL="$BROKER_URL")
grep -q '^ok: the broker at' "$work/hooks.out" || { echo "the doctor did not reach the broker:"; cat "$work/hooks.out"; exit 1; }
grep -q 'Stop' "$work/project/.claude/settings.local.json" || { echo "no Stop hook was installed"; exit 1; }

# Then each agent started under `loopx run`, as the README says: here with a
# stand-in for the agent on PATH (tests/wake/ runs the real Claude Code and
# Codex the same way), which must run in loopx's terminal and hand back its
# exit status.
for agent in claude codex; do
  heading='### Claude Code with hooks'
  [ "$agent" = codex ] && heading='### Codex with hooks'
  block README.md "$heading" 2 >"$work/run-$agent.sh"
  grep -Eq "^loopx run -- $agent( |\$)" "$work/run-$agent.sh" || { echo "no 'loopx run -- $agent' block:"; cat "$work/run-$agent.sh"; exit 1; }
  printf '#!/bin/sh\n[ -t 0 ] && [ -n "$LOOPX_RUN_DIR" ] && echo "stand-in for %s in loopx run"; exit 5\n' "$agent" >"$work/bin/$agent"
  chmod +x "$work/bin/$agent"
  set +e
  env -i HOME="$HOME" PATH="$work/bin:/usr/bin:/bin" LOOPX_BROKER_URL="$BROKER_URL" bash "$work/run-$agent.sh" >"$work/run-$agent.out" 2>&1
  status=$?
  set -e
  [ "$status" = 5 ] && grep -q "stand-in for $agent in loopx run" "$work/run-$agent.out" \
    || { echo "loopx run -- $agent: exit $status"; cat "$work/run-$agent.out"; exit 1; }
done
echo "the README and docs/ set-up blocks run as pasted"
