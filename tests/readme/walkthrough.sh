#!/usr/bin/env bash
# Runs docs/http-api.md's "Walk-through with curl" as written, twice against one
# live broker (a reader pastes it more than once): every step must answer
# without an error, and the second run must not trip over ids of the first.
#
# Usage: tests/readme/walkthrough.sh [path/to/loopx]   (default target/debug/loopx)
set -euo pipefail
cd "$(dirname "$0")/../.."
loopx=$(realpath "${1:-target/debug/loopx}")
source tests/support/live_broker.sh
source tests/support/doc_block.sh

# The walk-through reads the token from the default data dir under $HOME.
fresh_home
start_broker "$loopx"

# The first bash block after the walk-through's heading, on the broker's port.
doc_block docs/http-api.md '## Walk-through with curl' \
  | sed "s|^B=http://127.0.0.1:7317$|B=$BROKER_URL|" >"$work/walkthrough.sh"
grep -q "^B=$BROKER_URL$" "$work/walkthrough.sh" || { echo "walk-through not found"; exit 1; }

for run in 1 2; do
  echo "== walk-through, run $run"
  bash -euo pipefail "$work/walkthrough.sh" >"$work/out-$run" 2>&1 || { cat "$work/out-$run"; exit 1; }
  out=$(cat "$work/out-$run")
  for expected in '"registered":true' '"claimed":true' '"completed":true' \
    '"message":"Two parser tests fail."' '"state":"closed"'; do
    grep -qF "$expected" <<<"$out" || { echo "run $run: no $expected in:"; echo "$out"; exit 1; }
  done
  if grep -qF '"error"' <<<"$out"; then echo "run $run answered an error:"; echo "$out"; exit 1; fi
done
echo "the docs/http-api.md walk-through runs, twice"
