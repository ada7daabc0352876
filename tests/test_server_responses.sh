#!/usr/bin/env bash
# test_server_responses.sh — `lily serve`'s Responses API (POST /v1/responses) through the official openai SDK's
# client.responses (tests/test_server_responses.py): text, streaming, structured output, a function tool round
# trip, max_output_tokens, and the 400s; each reply checked against /v1/chat/completions for the same conversation.
# usage: bash tests/test_server_responses.sh <path-to-lily> <tests/data>
set -euo pipefail
LILY="$1"
DATA="$2"
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/lib/common.sh"
lily_python "$LILY" openai # the suite's one Python, with the SDK
# the bundled model (models/lily-tiny), as a user first meets it; tiny-chat where it is absent
MODEL="$HERE/../models/lily-tiny"
[ -f "$MODEL/config.json" ] || MODEL="$DATA/tiny-chat"
exec "$PY" "$HERE/test_server_responses.py" "$LILY" "$MODEL"
