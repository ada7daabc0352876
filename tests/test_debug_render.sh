#!/usr/bin/env bash
# test_debug_render.sh — `lily debug render` prints exactly the rendered prompt on stdout, warnings on stderr.
# usage: bash test_debug_render.sh <path-to-lily> <tests/data dir>
set -u
LILY=$1
DATA=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cat >"$TMP/request.json" <<'JSON'
{"model": "qwen", "messages": [
  {"role": "developer", "content": "Be brief."},
  {"role": "user", "content": "Weather in Paris?"},
  {"role": "assistant", "content": "", "reasoning_content": "Call the tool.",
   "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
  {"role": "tool", "tool_call_id": "c1", "content": "18C"}],
 "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
 "chat_template_kwargs": {"enable_thinking": false}}
JSON
# expected text, as jinja2 renders the real template (no trailing newline)
printf '%s' '<|im_start|>system
# Tools

You have access to the following functions:

<tools>
{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
</tools>

If you choose to call a function ONLY reply in the following format with NO suffix:

<tool_call>
<function=example_function_name>
<parameter=example_parameter_1>
value_1
</parameter>
<parameter=example_parameter_2>
This is the value for the second parameter
that can span
multiple lines
</parameter>
</function>
</tool_call>

<IMPORTANT>
Reminder:
- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags
- Required parameters MUST be specified
- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after
- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls
</IMPORTANT>

Be brief.<|im_end|>
<|im_start|>user
Weather in Paris?<|im_end|>
<|im_start|>assistant
<think>
Call the tool.
</think>

<tool_call>
<function=get_weather>
<parameter=city>
Paris
</parameter>
</function>
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
18C
</tool_response><|im_end|>
<|im_start|>assistant
<think>

</think>

' >"$TMP/expected.txt"

# the fixture directory holds the real template: no warning, exact output
"$LILY" debug render --model "$DATA/tokenizers/qwen35" --request "$TMP/request.json" >"$TMP/out.txt" 2>"$TMP/err.txt" \
    || fail "render exited $?: $(cat "$TMP/err.txt")"
cmp "$TMP/out.txt" "$TMP/expected.txt" || fail "rendered prompt differs from the jinja2 rendering"
[ ! -s "$TMP/err.txt" ] || fail "unexpected stderr: $(cat "$TMP/err.txt")"

# stdin request, a model directory with a different template: same stdout, a warning on stderr
mkdir "$TMP/model"
printf '{{ messages }}' >"$TMP/model/chat_template.jinja"
"$LILY" debug render -m "$TMP/model" -r - <"$TMP/request.json" >"$TMP/out2.txt" 2>"$TMP/err2.txt" || fail "stdin render failed"
cmp "$TMP/out2.txt" "$TMP/expected.txt" || fail "stdin rendering differs"
grep -q "differs from the known Qwen3.6 template" "$TMP/err2.txt" || fail "no warning for a different template"

# a request the template cannot render: exit 1, a clear message, nothing on stdout
printf '{"messages": [{"role": "system", "content": "only system"}]}' >"$TMP/bad.json"
"$LILY" debug render --request "$TMP/bad.json" >"$TMP/out3.txt" 2>"$TMP/err3.txt"
[ $? -eq 1 ] || fail "bad request should exit 1"
[ ! -s "$TMP/out3.txt" ] || fail "bad request printed to stdout"
grep -q "No user query found" "$TMP/err3.txt" || fail "bad request message: $(cat "$TMP/err3.txt")"

# lily serve's JSON loader: a request serve takes, with an integer past int64 in a tool call's arguments (jansson
# alone says "too big integer"), renders from a file and from stdin, the integer as the nearest double
printf '%s' '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls":
  [{"type": "function", "function": {"name": "f", "arguments": {"n": 99999999999999999999}}}]},
  {"role": "tool", "content": "ok"}]}' >"$TMP/big.json"
"$LILY" debug render --request "$TMP/big.json" >"$TMP/out4.txt" 2>"$TMP/err4.txt" ||
    fail "integer past int64 refused: $(cat "$TMP/err4.txt")"
grep -qF '<parameter=n>
1e+20' "$TMP/out4.txt" || fail "integer past int64 rendered as: $(cat "$TMP/out4.txt")"
"$LILY" debug render --request - <"$TMP/big.json" >"$TMP/out5.txt" 2>"$TMP/err5.txt" || fail "stdin: $(cat "$TMP/err5.txt")"
cmp "$TMP/out4.txt" "$TMP/out5.txt" || fail "integer past int64: stdin renders otherwise than the file"
# a directory as the request file says it is one (it was "line 1 column 0: '[' or '{' expected")
"$LILY" debug render --request "$TMP" >/dev/null 2>"$TMP/err6.txt"
[ $? -eq 1 ] || fail "a directory as the request should exit 1"
grep -qF "lily debug render: $TMP: read failed (Is a directory)" "$TMP/err6.txt" ||
    fail "a directory as the request: $(cat "$TMP/err6.txt")"

# a missing model directory is an error
"$LILY" debug render --model "$TMP/nope" --request "$TMP/request.json" >/dev/null 2>&1 && fail "missing model dir accepted"
echo "ok"
