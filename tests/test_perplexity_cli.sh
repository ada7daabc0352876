#!/usr/bin/env bash
# test_perplexity_cli.sh — `lily perplexity` end to end on tiny-a mlx4, case5 (300 tokens): the
# perplexity equals the one computed here from the reference logits (reference.safetensors, computed by
# transformers) within 1e-3 relative; with those logits as --reference-logits, top-1 agreement is 100%
# and the reference perplexity printed equals ours-from-the-file to 1e-6; -f TEXT gives the same result
# as --tokens-file with the ids `lily debug tokenize` prints; a reference shorter than the input is compared
# with lily's perplexity on the same predictions; and bad input exits non-zero with a message.
# usage: bash test_perplexity_cli.sh <path-to-lily> <tests/data dir>
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"
lily_test_init "$@"
lily_python "$LILY"

# tokens, raw logits and the expected perplexity from reference.safetensors (plain python, no numpy)
EXPECTED=$("$PY" - "$DATA/tiny-a/reference.safetensors" "$TMP" <<'PY'
import json, math, struct, sys
buf = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", buf[:8])[0]
hdr = json.loads(buf[8:8 + n])
def raw(name):
    b, e = hdr[name]["data_offsets"]
    return buf[8 + n + b: 8 + n + e]
toks = struct.unpack("<%di" % (len(raw("case5.tokens")) // 4), raw("case5.tokens"))
open(sys.argv[2] + "/tokens.txt", "w").write(" ".join(map(str, toks)) + "\n")
logits = raw("case5.logits.mlx4")
open(sys.argv[2] + "/ref.f32", "wb").write(logits)
vocab = hdr["case5.logits.mlx4"]["shape"][1]
vals = struct.unpack("<%df" % (len(logits) // 4), logits)
nll = 0.0
for i in range(len(toks) - 1):
    row = vals[i * vocab:(i + 1) * vocab]
    m = max(row)
    nll += m + math.log(sum(math.exp(v - m) for v in row)) - row[toks[i + 1]]
print("%.9f" % math.exp(nll / (len(toks) - 1)))
PY
)
echo "expected perplexity from the reference logits: $EXPECTED"

value() { sed -n "s/^$1: \([0-9.]*\).*/\1/p" <<<"$2" | head -1; }
close() { "$PY" -c "import sys; a, b, tol = map(float, sys.argv[1:]); sys.exit(0 if abs(a / b - 1) <= tol else 1)" "$@"; }

M="$DATA/tiny-a/mlx4"
if out=$("$LILY" perplexity -m "$M" --tokens-file "$TMP/tokens.txt" --ctx 300 2>/dev/null); then
    got=$(value perplexity "$out")
    if [ -n "$got" ] && close "$got" "$EXPECTED" 1e-3; then ok "perplexity $got vs $EXPECTED"; else fail "perplexity: $out"; fi
else
    fail "lily perplexity exited non-zero: $out"
fi

if out=$("$LILY" perplexity -m "$M" --tokens-file "$TMP/tokens.txt" --ctx 300 --reference-logits "$TMP/ref.f32" 2>/dev/null); then
    top1=$(value "top-1 agreement" "$out")
    refp=$(value "reference perplexity" "$out")
    if [ "$top1" = "100.0000%" ] || [ "$top1" = "100.0000" ]; then ok "top-1 agreement $top1"; else fail "top-1: $out"; fi
    if [ -n "$refp" ] && close "$refp" "$EXPECTED" 1e-6; then ok "reference perplexity $refp"; else fail "reference perplexity: $out"; fi
    grep -q "^KL(reference || lily): mean " <<<"$out" && ok "KL reported" || fail "no KL line: $out"
else
    fail "lily perplexity --reference-logits exited non-zero"
fi

# a reference of lily's own logits for the first 100 of the 300 tokens: the percentage compares lily on those
# same 100 predictions (0 here), not lily's perplexity over all 299 (it printed that against the reference's 100)
"$LILY" eval -m "$M" --tokens "$(head -c 100000 "$TMP/tokens.txt" | tr ' ' '\n' | head -100 | tr '\n' ',' | sed 's/,$//')" \
    --logits-out "$TMP/own100.f32" >/dev/null 2>&1
out=$("$LILY" perplexity -m "$M" --tokens-file "$TMP/tokens.txt" --ctx 300 --reference-logits "$TMP/own100.f32" 2>/dev/null || true)
grep -qE "^reference perplexity: [0-9.]+ on the first 100 predictions \(lily [0-9.]+ there, [+-]0\.0000%\)" <<<"$out" &&
    ok "a shorter reference is compared with lily on the same predictions" || fail "shorter reference: $out"

# windows of 64: 5 windows, 295 predictions
out=$("$LILY" perplexity -m "$M" --tokens-file "$TMP/tokens.txt" --ctx 64 2>/dev/null || true)
grep -q "in 5 window(s) of 64; 295 predictions scored" <<<"$out" && ok "windows of 64" || fail "windows: $out"

# an input longer than the window says so on stderr (windows reset the state: not the text's perplexity); a
# window past the model's max_position_embeddings is warned of as lily run's --ctx-size is (a copy of the
# model whose config says 200); an input that fits a window within it: no warning
SHORT="$TMP/short"
mkdir "$SHORT"
for f in "$M"/*; do ln -s "$(cd "$(dirname "$f")" && pwd)/$(basename "$f")" "$SHORT/"; done
rm "$SHORT/config.json"
sed 's/"max_position_embeddings": [0-9]*/"max_position_embeddings": 200/' "$M/config.json" >"$SHORT/config.json"
windows="lily perplexity: warning: the input is 300 tokens, longer than the window (--ctx 64): it is scored in 5 windows, the state reset at each, not as one text (--ctx 300 for that)"
beyond="lily perplexity: warning: --ctx 300 is beyond the model's max_position_embeddings 200; quality past that length is untested"
"$LILY" perplexity -m "$M" --tokens-file "$TMP/tokens.txt" --ctx 64 >/dev/null 2>"$TMP/w64.err" &&
    [ "$(grep -cxF -- "$windows" "$TMP/w64.err")" = 1 ] && [ "$(grep -c warning "$TMP/w64.err")" = 1 ] &&
    ok "--ctx 64 of 300 tokens: one warning that it is scored in windows" || fail "--ctx 64 stderr: $(cat "$TMP/w64.err")"
# one token more than the window: one window, the last token unscored (not "1 windows, the state reset at each")
last="lily perplexity: warning: the input is 300 tokens, one more than the window (--ctx 299): its last token is not scored (--ctx 300 for that)"
"$LILY" perplexity -m "$M" --tokens-file "$TMP/tokens.txt" --ctx 299 >/dev/null 2>"$TMP/w299.err" &&
    [ "$(grep -cxF -- "$last" "$TMP/w299.err")" = 1 ] && [ "$(grep -c warning "$TMP/w299.err")" = 1 ] &&
    ok "--ctx 299 of 300 tokens: one warning that the last token is not scored" || fail "--ctx 299 stderr: $(cat "$TMP/w299.err")"
"$LILY" perplexity -m "$M" --tokens-file "$TMP/tokens.txt" --ctx 300 >/dev/null 2>"$TMP/w300.err" &&
    ! grep -q warning "$TMP/w300.err" && ok "--ctx 300 of 300 tokens: no warning" || fail "--ctx 300 stderr: $(cat "$TMP/w300.err")"
"$LILY" perplexity -m "$SHORT" --tokens-file "$TMP/tokens.txt" --ctx 300 >/dev/null 2>"$TMP/beyond.err" &&
    [ "$(grep -cxF -- "$beyond" "$TMP/beyond.err")" = 1 ] && [ "$(grep -c warning "$TMP/beyond.err")" = 1 ] &&
    ok "--ctx 300 past max_position_embeddings 200: one warning" || fail "past the model's length: $(cat "$TMP/beyond.err")"

# -f TEXT tokenizes with the model's tokenizer: same as the ids from lily debug tokenize
CHAT="$DATA/tiny-chat"
if [ -d "$CHAT" ]; then
    printf 'Once upon a time, a small model counted its tokens twice and got the same answer.\n' >"$TMP/text.txt"
    if ids=$("$LILY" debug tokenize -m "$CHAT" --ids --no-special <"$TMP/text.txt" 2>/dev/null) && [ -n "$ids" ]; then
        echo "$ids" >"$TMP/ids.txt"
        a=$("$LILY" perplexity -m "$CHAT" -f "$TMP/text.txt" 2>/dev/null | sed -n 's/^perplexity: //p')
        b=$("$LILY" perplexity -m "$CHAT" --tokens-file "$TMP/ids.txt" 2>/dev/null | sed -n 's/^perplexity: //p')
        [ -n "$a" ] && [ "$a" = "$b" ] && ok "-f equals --tokens-file ($a)" || fail "-f '$a' vs --tokens-file '$b'"
        # -f - reads the text from stdin, as lily run -f - (it was "-: cannot open")
        c=$("$LILY" perplexity -m "$CHAT" -f - <"$TMP/text.txt" 2>/dev/null | sed -n 's/^perplexity: //p' || true)
        [ -n "$c" ] && [ "$c" = "$a" ] && ok "-f - reads stdin ($c)" || fail "-f - gave '$c', -f FILE '$a'"
    else
        fail "lily debug tokenize failed"
    fi
fi

# errors: exit non-zero with a message
expect_error() {
    local name=$1; shift
    local out
    if out=$("$@" 2>&1); then fail "$name: exit 0"; elif [ -z "$out" ]; then fail "$name: no message"; else ok "$name: $(head -1 <<<"$out")"; fi
}
echo "1 2 3 999999" >"$TMP/bad.txt"
expect_error "token outside the vocab" "$LILY" perplexity -m "$M" --tokens-file "$TMP/bad.txt"
head -c 1000 "$TMP/ref.f32" >"$TMP/short.f32"
expect_error "logits file not whole rows" "$LILY" perplexity -m "$M" --tokens-file "$TMP/tokens.txt" --reference-logits "$TMP/short.f32"
expect_error "no input" "$LILY" perplexity -m "$M"

finish
