#!/usr/bin/env bash
# test_eval.sh — `lily eval` end to end: for both tiny-a layouts, case5 (300 tokens) in three modes
# (one prefill, prefill half then decode, prefill in chunks of 7) against the reference logits: exact
# mode max |Δ| <= 1e-3 and top-1 agreement 1; fast mode (the default) top-1 >= 0.99 and mean KL <= 1e-3;
# --logits-out round trip, and the errors (exit non-zero + message; a bad --logits-out or --reference before
# the forward passes).
# usage: bash test_eval.sh <path-to-lily> <tests/data dir>
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"
lily_test_init "$@"
lily_python "$LILY"

# case5 tokens and per-layout logits from reference.safetensors, as raw files (no numpy needed)
"$PY" - "$DATA/tiny-a/reference.safetensors" "$TMP" <<'PY'
import json, struct, sys
buf = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", buf[:8])[0]
hdr = json.loads(buf[8:8 + n])
def raw(name):
    b, e = hdr[name]["data_offsets"]
    return buf[8 + n + b: 8 + n + e]
toks = struct.unpack("<%di" % (len(raw("case5.tokens")) // 4), raw("case5.tokens"))
open(sys.argv[2] + "/tokens.txt", "w").write(" ".join(map(str, toks)) + "\n")
for layout in ("hf", "mlx4"):
    open(sys.argv[2] + "/ref_%s.f32" % layout, "wb").write(raw("case5.logits." + layout))
PY

# run_check name condition command...: runs the command, reads max |Δ|, top-1 agreement and mean KL from its
# output into the python variables maxd, top1, kl, and passes when it exits 0 and `condition` holds.
run_check() {
    local name=$1 cond=$2; shift 2
    local out
    if ! out=$("$@" 2>&1); then
        echo "FAIL $name: exit non-zero: $out"; fails=$((fails + 1)); return
    fi
    local maxd top1 kl
    maxd=$(sed -n 's/^max |Δ|: //p' <<<"$out")
    top1=$(sed -n 's/^top-1 agreement: \([0-9.]*\).*/\1/p' <<<"$out")
    kl=$(sed -n 's/^mean KL(reference‖lily): //p' <<<"$out")
    if "$PY" -c "import sys; maxd, top1, kl = float('$maxd'), float('$top1'), float('$kl'); sys.exit(0 if $cond else 1)"; then
        echo "ok   $name: max |Δ| $maxd, top-1 $top1, mean KL $kl"; passes=$((passes + 1))
    else
        echo "FAIL $name: $out"; fails=$((fails + 1))
    fi
}
check() { run_check "$1" "maxd <= 1e-3 and top1 == 1.0" "${@:2}"; }      # exact: the reference's logits
check_fast() { run_check "$1" "kl <= 1e-3 and top1 >= 0.99" "${@:2}"; }  # fast: top-1 and KL bounds

expect_error() { # name, command...: passes when the command exits non-zero and prints a message
    local name=$1; shift
    local out
    if out=$("$@" 2>&1); then
        echo "FAIL $name: exit 0"; fails=$((fails + 1))
    elif [ -z "$out" ]; then
        echo "FAIL $name: no message"; fails=$((fails + 1))
    else
        echo "ok   $name: $(head -1 <<<"$out")"; passes=$((passes + 1))
    fi
}

for layout in hf mlx4; do
    M="$DATA/tiny-a/$layout"
    X="--precision exact"
    # shellcheck disable=SC2086
    {
    check "$layout prefill" "$LILY" eval --model "$M" --tokens-file "$TMP/tokens.txt" --reference "$TMP/ref_$layout.f32" --logits-out "$TMP/out_$layout.f32" $X
    check "$layout decode-from 150" "$LILY" eval -m "$M" --tokens-file "$TMP/tokens.txt" --decode-from 150 --reference "$TMP/ref_$layout.f32" $X
    check "$layout prefill-chunk 7" "$LILY" eval -m "$M" --tokens-file "$TMP/tokens.txt" --prefill-chunk 7 --threads 1 --reference "$TMP/ref_$layout.f32" $X
    check "$layout chunked delta rule" "$LILY" eval -m "$M" --tokens-file "$TMP/tokens.txt" --deltanet chunked --reference "$TMP/ref_$layout.f32" $X
    check "$layout chunked delta rule, prefill-chunk 100" "$LILY" eval -m "$M" --tokens-file "$TMP/tokens.txt" --deltanet chunked --prefill-chunk 100 --decode-from 250 --reference "$TMP/ref_$layout.f32" $X
    }
    check_fast "$layout fast prefill" "$LILY" eval -m "$M" --tokens-file "$TMP/tokens.txt" --reference "$TMP/ref_$layout.f32"
    check_fast "$layout fast decode-from 150" "$LILY" eval -m "$M" --tokens-file "$TMP/tokens.txt" --decode-from 150 --reference "$TMP/ref_$layout.f32" --precision fast
    check_fast "$layout fast prefill-chunk 7" "$LILY" eval -m "$M" --tokens-file "$TMP/tokens.txt" --prefill-chunk 7 --reference "$TMP/ref_$layout.f32"
    size=$(stat -c %s "$TMP/out_$layout.f32")
    if [ "$size" = $((300 * 512 * 4)) ]; then
        echo "ok   $layout logits-out size"; passes=$((passes + 1))
    else
        echo "FAIL $layout logits-out size $size"; fails=$((fails + 1))
    fi
done
check "logits-out round trip" "$LILY" eval -m "$DATA/tiny-a/mlx4" --tokens-file "$TMP/tokens.txt" --reference "$TMP/out_mlx4.f32" --precision exact

M="$DATA/tiny-a/mlx4"
expect_error "missing model" "$LILY" eval --model "$TMP/nope" --tokens 1,2
expect_error "token out of vocab" "$LILY" eval --model "$M" --tokens 1,512
expect_error "bad token text" "$LILY" eval --model "$M" --tokens 1,x
for list in 1,,2 ,1,2 1,2, "1, ,2"; do # an empty list item is an error naming it, not a shorter list
    if out=$("$LILY" eval --model "$M" --tokens "$list" 2>&1); then
        echo "FAIL empty item in --tokens $list: exit 0"; fails=$((fails + 1))
    elif ! grep -q 'empty item in the token id list' <<<"$out"; then
        echo "FAIL empty item in --tokens $list: $out"; fails=$((fails + 1))
    else
        echo "ok   empty item in --tokens $list"; passes=$((passes + 1))
    fi
done
expect_error "no tokens" "$LILY" eval --model "$M"
expect_error "decode-from past end" "$LILY" eval --model "$M" --tokens 1,2 --decode-from 3
# a --logits-out that cannot be written or a --reference of the wrong size fails before the forward passes
# (which may take long on a large model): nothing on stdout, where the eval line and speeds go after them
expect_early_error() {
    local name=$1 out rc=0; shift
    out=$("$@" 2>"$TMP/early.err") || rc=$?
    if [ $rc != 0 ] && [ -z "$out" ] && [ -s "$TMP/early.err" ]; then
        echo "ok   $name: $(head -1 "$TMP/early.err")"; passes=$((passes + 1))
    else
        echo "FAIL $name: rc $rc, stdout '$out'"; fails=$((fails + 1))
    fi
}
expect_early_error "reference of wrong size, before the forward passes" \
    "$LILY" eval --model "$M" --tokens 1,2,3 --reference "$TMP/ref_hf.f32"
expect_early_error "missing reference, before the forward passes" \
    "$LILY" eval --model "$M" --tokens 1,2,3 --reference "$TMP/nope.f32"
expect_early_error "--logits-out in a missing directory, before the forward passes" \
    "$LILY" eval --model "$M" --tokens 1,2,3 --logits-out "$TMP/nope/out.f32"
expect_error "unknown backend" "$LILY" eval --model "$M" --tokens 1 --backend tpu

# more tokens than the model's max_position_embeddings: evaluated (the context is the input's length), with
# one warning on stderr, as lily run's --ctx-size past it (a copy of the model whose config says 200); the
# logits are the same as the model's own
SHORT="$TMP/short"
mkdir "$SHORT"
for f in "$M"/*; do ln -s "$(cd "$(dirname "$f")" && pwd)/$(basename "$f")" "$SHORT/"; done
rm "$SHORT/config.json"
sed 's/"max_position_embeddings": [0-9]*/"max_position_embeddings": 200/' "$M/config.json" >"$SHORT/config.json"
beyond="lily eval: warning: 300 tokens are beyond the model's max_position_embeddings 200; quality past that length is untested"
"$LILY" eval -m "$M" --tokens-file "$TMP/tokens.txt" --logits-out "$TMP/own.f32" >/dev/null 2>"$TMP/own.err"
if "$LILY" eval -m "$SHORT" --tokens-file "$TMP/tokens.txt" --logits-out "$TMP/short.f32" >/dev/null 2>"$TMP/beyond.err" &&
    [ "$(grep -cxF -- "$beyond" "$TMP/beyond.err")" = 1 ] && [ "$(grep -c warning "$TMP/beyond.err")" = 1 ] &&
    ! grep -q warning "$TMP/own.err" && cmp -s "$TMP/short.f32" "$TMP/own.f32"; then
    echo "ok   300 tokens past max_position_embeddings 200: one warning, the same logits"; passes=$((passes + 1))
else
    echo "FAIL past max_position_embeddings: $(cat "$TMP/beyond.err") / $(cat "$TMP/own.err")"; fails=$((fails + 1))
fi

finish
