#!/usr/bin/env bash
# test_server.sh — `lily serve` end to end: the official openai SDK and raw HTTP against the tiny-chat model.
# usage: bash tests/test_server.sh <path-to-lily> <tests/data>
# Runs in the suite's virtualenv (lily_python, tests/lib/common.sh), which gets `openai` from PyPI once; without network the
# SDK checks are skipped (said loudly) and the raw-HTTP checks still run.
set -euo pipefail
LILY="$1"
DATA="$2"
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/lib/common.sh"
lily_python "$LILY" openai
[ -z "$PY_MISSING" ] || echo "test_server.sh: WARNING: cannot install the openai package (no network?): SDK checks will be skipped" >&2
exec "$PY" "$HERE/test_server_openai.py" "$LILY" "$DATA/tiny-chat"
