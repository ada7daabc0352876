#!/usr/bin/env bash
# test_server_load.sh — `lily serve` under a bounded load with faults, on loopback, stopping by itself
# (about 20 s on 2 cores): see test_server_load.py. Runs in the suite's Python (lily_python).
# usage: bash tests/test_server_load.sh <path-to-lily> <tests/data>
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/lib/common.sh"
lily_python "$1"
exec "$PY" "$HERE/test_server_load.py" "$1" "$2/tiny-chat"
