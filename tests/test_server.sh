#!/usr/bin/env bash
# test_server.sh — `lily serve` end to end: the official openai SDK and raw HTTP against the tiny-chat model.
# usage: bash tests/test_server.sh <path-to-lily> <tests/data>
# Makes a virtualenv next to the binary and installs `openai` from PyPI into it once; without network the
# SDK checks are skipped (said loudly) and the raw-HTTP checks still run.
set -euo pipefail
LILY="$1"
DATA="$2"
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/lib/common.sh"
ensure_openai_venv "$(cd "$(dirname "$LILY")" && pwd)/venv-server-test" \
  "test_server.sh: WARNING: cannot install the openai package (no network?): SDK checks will be skipped"
exec "$PY" "$HERE/test_server_openai.py" "$LILY" "$DATA/tiny-chat"
