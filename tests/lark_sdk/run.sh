#!/usr/bin/env bash
# Checks the tests' fake Lark long connection against Lark's official client
# (lark-oapi, pinned), in its own venv under target/.
#
# Usage: tests/lark_sdk/run.sh   (builds the fake_lark_ws example)
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${LOOPX_LARK_SDK_ENV:-target/lark-sdk-env}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import lark_oapi" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/lark_sdk/requirements.txt
fi
cargo build --locked --example fake_lark_ws
timeout 120 "$venv/bin/python" tests/lark_sdk/check_fake.py target/debug/examples/fake_lark_ws
