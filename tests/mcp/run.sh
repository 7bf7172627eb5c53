#!/usr/bin/env bash
# The `loopx mcp` tests: the official MCP Python SDK (`mcp`, pinned in
# requirements.txt, in its own venv under target/) drives `loopx mcp` over
# stdio against real brokers that the tests start themselves.
#
# Usage: tests/mcp/run.sh [path/to/loopx]   (default target/debug/loopx)
set -euo pipefail
cd "$(dirname "$0")/../.."
LOOPX_BIN=$(realpath "${1:-target/debug/loopx}")
export LOOPX_BIN
venv=$(realpath -m "${LOOPX_MCP_PYENV:-target/mcp-venv}")
stamp="$venv/.requirements"
if ! cmp -s tests/mcp/requirements.txt "$stamp" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/mcp/requirements.txt
  cp tests/mcp/requirements.txt "$stamp"
fi
cd tests/mcp
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "${@:2}" .
