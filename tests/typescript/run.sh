#!/usr/bin/env bash
# The TypeScript checks of the committed OpenAPI document: `redocly lint` with
# the recommended rules (0 errors, 0 warnings), then a client generated from
# the document (openapi-typescript + openapi-fetch, into generated/, not
# committed), type-checked with `tsc --strict --noEmit` and run against a live
# broker: a whole turn, typed end to end.
#
# Usage: tests/typescript/run.sh [path/to/loopx]   (default target/debug/loopx)
# Needs `npm ci` done in tests/typescript (.ci/run does it).
set -euo pipefail
cd "$(dirname "$0")/../.."
loopx=$(realpath "${1:-target/debug/loopx}")
source tests/support/live_broker.sh
cd tests/typescript
bin=node_modules/.bin

echo "== redocly lint (recommended rules)"
# redocly exits 0 on warnings; its JSON totals must show none of either.
"$bin/redocly" lint ../../openapi/openapi.json --config redocly.yaml --format json \
  >"$work/lint.json" 2>"$work/lint.log" || true
node -e '
  const { totals } = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  console.log(`redocly lint: ${totals.errors} errors, ${totals.warnings} warnings`);
  process.exit(totals.errors + totals.warnings === 0 ? 0 : 1);
' "$work/lint.json" || {
  "$bin/redocly" lint ../../openapi/openapi.json --config redocly.yaml --format stylish || true
  exit 1
}

echo "== generating the TypeScript types and type-checking the client strictly"
"$bin/openapi-typescript" ../../openapi/openapi.json -o generated/loopx.ts >"$work/generate.log" 2>&1 \
  || { cat "$work/generate.log"; exit 1; }
"$bin/tsc" --strict --noEmit -p .
"$bin/tsc" -p .

start_broker "$loopx" --data-dir "$work/data"

echo "== a whole turn with the TypeScript client"
LOOPX_URL="$BROKER_URL" LOOPX_TOKEN=$(cat "$work/data/owner.token") node dist/client.js \
  || { cat "$work/broker.log"; exit 1; }
