#!/usr/bin/env bash
# The OpenAPI checks against a live broker: validate the committed document,
# generate a Python client from it (into a temporary folder, not committed) and
# run a whole turn with it, then fuzz the broker from the document with
# schemathesis (bounded): no 5xx, no answer outside its documented schema.
#
# Usage: tests/python/run.sh [path/to/loopx]   (default target/debug/loopx)
set -euo pipefail
cd "$(dirname "$0")/../.."
loopx=${1:-target/debug/loopx}
venv=${LOOPX_PYENV:-target/pyenv}
source tests/support/live_broker.sh

if [ ! -x "$venv/bin/schemathesis" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/python/requirements.txt
fi

echo "== validating openapi/openapi.json"
"$venv/bin/openapi-spec-validator" openapi/openapi.json

echo "== generating a Python client"
"$venv/bin/openapi-python-client" generate --path openapi/openapi.json \
  --output-path "$work/gen/loopx_client" --meta none >"$work/generate.log" 2>&1 \
  || { cat "$work/generate.log"; exit 1; }
if grep -qiE "^(Warning|Error).*(Unable|Cannot|Could not)" "$work/generate.log"; then
  echo "the generator could not handle part of the document:"; cat "$work/generate.log"; exit 1
fi

# Waits are capped at 2 s here: fuzzed claims on a live session may ask for
# any wait up to 1800 s, which would only test the fuzzer's patience.
start_broker "$loopx" --data-dir "$work/data" --max-wait-seconds 2
export LOOPX_URL="$BROKER_URL" LOOPX_TOKEN
LOOPX_TOKEN=$(cat "$work/data/owner.token")

echo "== a whole turn with the generated client"
PYTHONPATH="$work/gen" "$venv/bin/python" tests/python/test_generated_client.py

echo "== schemathesis against the live broker"
# Bounded: a fixed number of examples per operation and a time budget.
"$venv/bin/schemathesis" run openapi/openapi.json --url "$LOOPX_URL" \
  -H "Authorization: Bearer $LOOPX_TOKEN" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance,unsupported_method \
  --phases examples,coverage,fuzzing --max-examples "${SCHEMATHESIS_EXAMPLES:-30}" \
  --max-time 90 --request-timeout 20 --seed 7317 --no-color \
  --report junit --report-dir "${LOOPX_ARTIFACTS:-target/test-artifacts}/schemathesis"
