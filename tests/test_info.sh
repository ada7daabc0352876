#!/usr/bin/env bash
# test_info.sh — `lily info` on both tiny-a layouts (summary values from tests/data/tiny-a/README.md and
# the safetensors headers), and its errors: message on stderr naming the file/tensor, exit status 1.
# Without --model it uses $LILY_MODEL.
# usage: bash test_info.sh <path-to-lily> <tests/data dir>
set -u
LILY=$1
DATA=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
has() { grep -qF -- "$2" "$1" || { cat "$1" >&2; fail "$1 lacks: $2"; }; }

"$LILY" info --model "$DATA/tiny-a/hf" >"$TMP/hf.out" 2>"$TMP/hf.err" || fail "info hf exited $?"
has "$TMP/hf.out" "layers       4 (3 linear_attention, 1 full_attention)"
has "$TMP/hf.out" "attention    8 heads, 2 kv heads, head_dim 64"
has "$TMP/hf.out" "rope         rope_theta 1e+07, partial_rotary_factor 0.25, rotary_dim 16"
has "$TMP/hf.out" "moe          16 experts, top-4, moe_intermediate 64, shared_intermediate 64"
has "$TMP/hf.out" "layout       hf (norms zero-centred"
has "$TMP/hf.out" "quantization none (weights BF16)"
has "$TMP/hf.out" "tensors      72 in 2 file(s)"
has "$TMP/hf.out" "total        4489160 bytes"   # = metadata.total_size of the index
[ -s "$TMP/hf.err" ] && fail "info hf wrote to stderr: $(cat "$TMP/hf.err")"

"$LILY" info -m "$DATA/tiny-a/mlx4" >"$TMP/mlx.out" 2>&1 || fail "info mlx4 exited $?"
has "$TMP/mlx.out" "layout       mlx (norms stored as 1 + w)"
has "$TMP/mlx.out" "quantization 4-bit affine, group_size 64"
has "$TMP/mlx.out" "override   router               8-bit in 4 layer(s), group_size 64"
has "$TMP/mlx.out" "override   shared_expert_gate   8-bit in 4 layer(s), group_size 64"
has "$TMP/mlx.out" "tensors      182 in 1 file(s)"
has "$TMP/mlx.out" "U32 1124352"

# errors: exit 1, message on stderr, nothing on stdout
"$LILY" info -m "$TMP/nonexistent" >"$TMP/e.out" 2>"$TMP/e.err"; rc=$?
[ $rc -eq 1 ] || fail "missing dir: exit $rc"
has "$TMP/e.err" "model directory $TMP/nonexistent: No such file or directory"
[ -s "$TMP/e.out" ] && fail "error wrote to stdout"

mkdir "$TMP/trunc"
cp "$DATA/tiny-a/mlx4/config.json" "$TMP/trunc/"
head -c 1000 "$DATA/tiny-a/mlx4/model.safetensors" >"$TMP/trunc/model.safetensors"
"$LILY" info -m "$TMP/trunc" >"$TMP/e.out" 2>"$TMP/e.err"; rc=$?
[ $rc -eq 1 ] || fail "truncated: exit $rc"
has "$TMP/e.err" "$TMP/trunc/model.safetensors: header length"

# no --model: $LILY_MODEL (like run/chat/serve/bench), the same summary as with -m
LILY_MODEL="$DATA/tiny-a/mlx4" "$LILY" info >"$TMP/env.out" 2>"$TMP/env.err"; rc=$?
[ $rc -eq 0 ] || fail "no --model with \$LILY_MODEL: exit $rc"
has "$TMP/env.err" "no -m given; using \$LILY_MODEL = $DATA/tiny-a/mlx4"
"$LILY" info -m "$DATA/tiny-a/mlx4" 2>/dev/null | cmp -s - "$TMP/env.out" || fail "no --model: output differs from -m"
echo "test_info: ok"
