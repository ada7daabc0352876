#!/usr/bin/env bash
# test_debug_parse.sh — `lily debug parse` turns raw model output into the OpenAI choice JSON.
# usage: bash test_debug_parse.sh <path-to-lily> <tests/data dir>
set -u
LILY=$1
DATA=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cat >"$TMP/tools.json" <<'JSON'
{"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
  "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]}
JSON

# thinking, a reasoning line, then a tool call with a typed parameter
printf '%s' 'Need the forecast.
</think>

<tool_call>
<function=get_weather>
<parameter=city>
Paris
</parameter>
<parameter=days>
3
</parameter>
</function>
</tool_call>' | "$LILY" debug parse --model "$DATA/tiny-chat" --thinking --tools "$TMP/tools.json" >"$TMP/out.json" \
    || fail "debug parse exited $?"
cat >"$TMP/expect.json" <<'JSON'
{
  "message": {
    "role": "assistant",
    "content": null,
    "reasoning_content": "Need the forecast.",
    "tool_calls": [
      {
        "id": "call_0",
        "type": "function",
        "function": {
          "name": "get_weather",
          "arguments": "{\"city\":\"Paris\",\"days\":3}"
        }
      }
    ]
  },
  "finish_reason": "tool_calls"
}
JSON
diff -u "$TMP/expect.json" "$TMP/out.json" || fail "tool call output differs"

# thinking cut by max tokens: all reasoning, no content, finish_reason length
printf 'Let me think about' | "$LILY" debug parse --thinking --length >"$TMP/out.json" || fail "exit $?"
cat >"$TMP/expect.json" <<'JSON'
{
  "message": {
    "role": "assistant",
    "content": null,
    "reasoning_content": "Let me think about"
  },
  "finish_reason": "length"
}
JSON
diff -u "$TMP/expect.json" "$TMP/out.json" || fail "length output differs"

# thinking off, plain answer
printf 'Hello!' | "$LILY" debug parse >"$TMP/out.json" || fail "exit $?"
grep -q '"content": "Hello!"' "$TMP/out.json" || fail "plain content missing"
grep -q '"finish_reason": "stop"' "$TMP/out.json" || fail "finish_reason stop missing"

# a bad tools file is a clear error, exit 1
echo '{"tools": 3}' >"$TMP/bad.json"
printf 'x' | "$LILY" debug parse --tools "$TMP/bad.json" >/dev/null 2>"$TMP/err.txt"
[ $? -eq 1 ] || fail "bad tools file should exit 1"
grep -q 'tools' "$TMP/err.txt" || fail "bad tools error should name the problem"
# a tools file that cannot be opened names it without jansson's line -1 ("F:-1: unable to open F"), and a
# directory says it is one (it was "line 1 column 0: '[' or '{' expected")
printf 'x' | "$LILY" debug parse --tools "$TMP/missing.json" >/dev/null 2>"$TMP/err.txt"
[ $? -eq 1 ] || fail "missing tools file should exit 1"
grep -qF "lily debug parse: --tools: $TMP/missing.json: cannot open (No such file or directory)" "$TMP/err.txt" ||
    fail "missing tools file: $(cat "$TMP/err.txt")"
printf 'x' | "$LILY" debug parse --tools "$TMP" >/dev/null 2>"$TMP/err.txt"
[ $? -eq 1 ] || fail "a directory as the tools file should exit 1"
grep -qF "lily debug parse: --tools: $TMP: read failed (Is a directory)" "$TMP/err.txt" ||
    fail "a directory as the tools file: $(cat "$TMP/err.txt")"
# lily serve's JSON loader: a schema bound past int64 (a client's pydantic model may carry one) loads
echo '[{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
  "properties": {"n": {"type": "integer", "maximum": 99999999999999999999}}}}}]' >"$TMP/big.json"
printf '<tool_call>\n<function=f>\n<parameter=n>\n5\n' | "$LILY" debug parse --tools "$TMP/big.json" >"$TMP/out.json" 2>"$TMP/err.txt" ||
    fail "a tools file with an integer past int64: $(cat "$TMP/err.txt")"
grep -qF '"arguments": "{\"n\":5}"' "$TMP/out.json" || fail "integer past int64 in tools: $(cat "$TMP/out.json")"
# an unknown option is a usage error, exit 2
"$LILY" debug parse --bogus </dev/null >/dev/null 2>&1
[ $? -eq 2 ] || fail "unknown option should exit 2"
echo "ok"
