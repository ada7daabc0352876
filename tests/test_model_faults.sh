#!/usr/bin/env bash
# test_model_faults.sh — broken and unusual model files, and what `lily run` / `lily serve` answer with
# them (tiny-chat copies edited in a temp dir): NaN/Inf weights refused at load naming the tensor,
# non-finite logits an error (500), out-of-range integers in config/tokenizer files, eos ids outside the
# vocabulary, top_p 0 and seeds beyond int64 in requests, the prefix cache's default cap (sized from the
# model, said at startup); a model file that is a FIFO refused before it is opened (it hung the loader); a
# data section that starts at any byte (MLX writes the header unpadded) read as any other, in both precisions
# (under UBSan a misaligned load fails it).
# usage: bash tests/test_model_faults.sh <path-to-lily> <tests/data>
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/lib/common.sh"
lily_python "$1"
exec "$PY" "$HERE/test_model_faults.py" "$1" "$2/tiny-chat"
