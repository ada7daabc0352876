#!/usr/bin/env bash
# test_debug_tokenize.sh — `lily debug tokenize` turns stdin text into ids (special tokens recognized), and
# says clearly when tokenizer.json is missing or malformed. Expected ids from HF tokenizers 0.23.
# usage: bash test_debug_tokenize.sh <path-to-lily> <tests/data dir>
set -u
LILY=$1
DATA=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

TEXT='<|im_start|>user
Hello world<|im_end|>
'
got=$(printf '%s' "$TEXT" | "$LILY" debug tokenize --model "$DATA/tokenizers/qwen3" --ids) || fail "qwen3 exited $?"
[ "$got" = "151644 872 198 9707 1879 151645 198" ] || fail "qwen3 ids: $got"

got=$(printf '%s' "$TEXT" | "$LILY" debug tokenize --model "$DATA/tiny-chat" --ids) || fail "tiny-chat exited $?"
[ "$got" = "1 93 273 90 207 48 77 84 390 323 294 84 76 2 207" ] || fail "tiny-chat ids: $got"

# one line per token: id, tab, the token's text with newlines escaped
printf '%s' "$TEXT" | "$LILY" debug tokenize --model "$DATA/tiny-chat" >"$TMP/lines" 2>"$TMP/err" || fail "lines exited $?"
[ "$(sed -n 1p "$TMP/lines")" = "$(printf '1\t<|im_start|>')" ] || fail "line 1: $(sed -n 1p "$TMP/lines")"
[ "$(sed -n 5p "$TMP/lines")" = "$(printf '207\t\\n')" ] || fail "line 5: $(sed -n 5p "$TMP/lines")"
[ "$(sed -n 10p "$TMP/lines")" = "$(printf '323\t w')" ] || fail "line 10: $(sed -n 10p "$TMP/lines")"
grep -q "15 tokens" "$TMP/err" || fail "no token count on stderr"

# --no-special: the special token written in the text is plain text
got=$(printf '<|im_end|>' | "$LILY" debug tokenize --model "$DATA/tiny-chat" --ids --no-special) || fail "no-special exited $?"
[ "$got" = "36 100 81 85 71 77 86 76 100 38" ] || fail "--no-special ids: $got"

# clear errors: no such directory, no tokenizer.json, malformed tokenizer.json
"$LILY" debug tokenize --model "$TMP/nope" </dev/null 2>"$TMP/err" && fail "missing dir accepted"
grep -q "tokenizer.json" "$TMP/err" || fail "missing dir message: $(cat "$TMP/err")"
mkdir "$TMP/empty"
"$LILY" debug tokenize --model "$TMP/empty" </dev/null 2>"$TMP/err" && fail "missing tokenizer.json accepted"
grep -q "empty/tokenizer.json: cannot open" "$TMP/err" || fail "missing file message: $(cat "$TMP/err")"
mkdir "$TMP/bad" && printf '{"model": {"vocab": ' >"$TMP/bad/tokenizer.json"
"$LILY" debug tokenize --model "$TMP/bad" </dev/null 2>"$TMP/err" && fail "malformed tokenizer.json accepted"
grep -q "malformed JSON" "$TMP/err" || fail "malformed message: $(cat "$TMP/err")"
printf 'hello' | LILY_MODEL="$DATA/tiny-chat" "$LILY" debug tokenize --ids >"$TMP/out" 2>"$TMP/err"
[ $? -eq 0 ] && grep -q 'using \$LILY_MODEL' "$TMP/err" && [ -s "$TMP/out" ] \
    || fail "no --model: the default model (\$LILY_MODEL here), as every command: $(cat "$TMP/err")"
echo "ok"
