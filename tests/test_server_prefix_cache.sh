#!/usr/bin/env bash
# test_server_prefix_cache.sh — `lily serve`'s prefix cache through the official openai SDK (tiny-chat):
# a 3-turn conversation reports cached_tokens covering the earlier turns, an exact repeat reuses the whole
# prompt, the request log and GET /metrics show the counts.
# usage: bash tests/test_server_prefix_cache.sh <path-to-lily> <tests/data>
# Uses a virtualenv next to the binary with `openai` from PyPI (installed once); without network the
# checks run over raw HTTP instead (said loudly).
set -euo pipefail
LILY="$1"
DATA="$2"
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/lib/common.sh"
lily_python "$LILY" openai
[ -z "$PY_MISSING" ] || echo "test_server_prefix_cache.sh: WARNING: cannot install the openai package (no network?): raw HTTP only" >&2
exec "$PY" "$HERE/test_server_prefix_cache.py" "$LILY" "$DATA/tiny-chat"
