#!/usr/bin/env bash
# test_server_agent.sh — `lily serve` for agents: the Anthropic Messages API through the official anthropic
# SDK, structured outputs and forced tool calls through the openai SDK (tests/test_server_agent.py).
# usage: bash tests/test_server_agent.sh <path-to-lily> <tests/data>
set -euo pipefail
LILY="$1"
DATA="$2"
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/lib/common.sh"
if declare -F lily_python >/dev/null; then # the suite's one Python, where common.sh has it
    lily_python "$LILY" openai anthropic
else
    ensure_openai_venv "$(cd "$(dirname "$LILY")" && pwd)/venv-agent-test" \
      "test_server_agent.sh: WARNING: cannot install the openai and anthropic packages (no network?): checks skipped"
fi
exec "$PY" "$HERE/test_server_agent.py" "$LILY" "$DATA/tiny-chat"
