#!/usr/bin/env bash
# test_server_agent.sh — `lily serve` for agents: the Anthropic Messages API through the official anthropic
# SDK, structured outputs and forced tool calls through the openai SDK (tests/test_server_agent.py).
# usage: bash tests/test_server_agent.sh <path-to-lily> <tests/data>
set -euo pipefail
LILY="$1"
DATA="$2"
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/lib/common.sh"
lily_python "$LILY" openai anthropic # the suite's one Python, with both SDKs
# the bundled model (models/lily-tiny), as a user first meets it; tiny-chat where it is absent
MODEL="$HERE/../models/lily-tiny"
[ -f "$MODEL/config.json" ] || MODEL="$DATA/tiny-chat"
exec "$PY" "$HERE/test_server_agent.py" "$LILY" "$MODEL"
