#!/usr/bin/env python3
"""Generate tests/data/chat_template_cases.json: OpenAI chat requests and their exact Qwen3.6 renderings.

Usage: python3 tools/make_template_cases.py [TEMPLATE] [OUT] [RANDOM_OUT]
  TEMPLATE defaults to tests/data/tokenizers/qwen35/chat_template.jinja, OUT to
  tests/data/chat_template_cases.json (the named cases below), RANDOM_OUT to
  tests/data/chat_template_random.json (random requests from a fixed seed: odd whitespace, stray think and
  tool_response tags, list/image content, random JSON argument values, flag combinations).
  `--random N SEED FILE` writes only N random cases (for a bigger differential run).
Needs jinja2 (pip install jinja2).

The template is rendered the way Hugging Face transformers does it (same setup as
tests/data/tokenizers/qwen35/render_chat_template.py: jinja2 ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks, loopcontrols; tojson = json.dumps(ensure_ascii=False); raise_exception raises). The request is
first turned into template arguments the way vLLM's OpenAI server does:
  - messages[*] with role "developer" are given role "system" (lily's rule; the template itself knows no
    developer role);
  - assistant tool_calls[*].function.arguments given as a JSON string are parsed (json.loads); null or ""
    becomes {} (vLLM's _postprocess_messages);
  - add_generation_prompt defaults to true; chat_template_kwargs are passed as template variables.
Each case is {"name", "request", "rendered"} or, when the template (or the preprocessing) refuses the
request, {"name", "request", "error"}.
"""
import copy
import json
import math
import os
import random
import struct
import sys

from jinja2 import ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def raise_exception(m):
    raise Exception(m)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def template_kwargs(request):
    """The request as template variables, preprocessed as described in the module doc."""
    messages = copy.deepcopy(request.get("messages"))
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict) and m.get("role") == "developer":
                m["role"] = "system"
            if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list):
                for tc in m["tool_calls"]:
                    fn = tc.get("function", tc) if isinstance(tc, dict) else None
                    if not isinstance(fn, dict) or "arguments" not in fn:
                        continue
                    args = fn["arguments"]
                    if args is None or args == "":
                        fn["arguments"] = {}
                    elif isinstance(args, str):
                        fn["arguments"] = json.loads(args)
    kw = {"messages": messages, "add_generation_prompt": request.get("add_generation_prompt", True)}
    if request.get("tools") is not None:
        kw["tools"] = request["tools"]
    kw.update(request.get("chat_template_kwargs") or {})
    return kw


# ------------------------------------------------------------------------------------------------ data
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather for a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                                                           "unit": {"type": "string", "enum": ["c", "f"]}},
                          "required": ["city"]}}}
WRITE_FILE = {"type": "function", "function": {"name": "write_file", "description": "Write text to a file.\nOverwrites.",
              "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                              "content": {"type": "string", "description": "Full \"text\" \\ body"}},
                             "required": ["path", "content"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "description": "Recherche « plein texte » — 全文検索 🔍",
          "parameters": {"type": "object", "properties": {
              "query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10},
              "threshold": {"type": "number", "default": 0.5}, "filters": {"type": "object", "properties": {
                  "lang": {"type": "array", "items": {"type": "string"}}, "exact": {"type": "boolean"}}}},
              "required": ["query"]}}}
RUN = {"type": "function", "function": {"name": "run_shell", "parameters": {"type": "object", "properties": {
    "cmd": {"type": "string"}}, "required": ["cmd"]}}}


def U(text):
    return {"role": "user", "content": text}


def A(text, **kw):
    m = {"role": "assistant", "content": text}
    m.update(kw)
    return m


def T(text):
    return {"role": "tool", "content": text}


def call(name, args, wrapped=True):
    fn = {"name": name, "arguments": args}
    return {"type": "function", "id": "call_" + name, "function": fn} if wrapped else fn


def R(messages, **kw):
    r = {"messages": messages}
    r.update(kw)
    return r


OFF = {"enable_thinking": False}
KEEP = {"preserve_thinking": True}

CASES = [
    # ---- basics, system/developer, thinking switch
    ("user_only", R([U("Hello")])),
    ("user_only_thinking_on_explicit", R([U("Hello")], chat_template_kwargs={"enable_thinking": True})),
    ("user_only_thinking_off", R([U("Hello")], chat_template_kwargs=OFF)),
    ("no_generation_prompt", R([U("Hello")], add_generation_prompt=False)),
    ("no_generation_prompt_thinking_off", R([U("Hi"), A("Hello!")], add_generation_prompt=False, chat_template_kwargs=OFF)),
    ("system_user", R([{"role": "system", "content": "You are a terse assistant."}, U("Name three primes.")])),
    ("system_empty_content", R([{"role": "system", "content": ""}, U("Hi")])),
    ("system_whitespace_trimmed", R([{"role": "system", "content": "\n\t  Be brief.\u3000\n"}, U("  Hi there \n")])),
    ("developer_as_system", R([{"role": "developer", "content": "Answer in French."}, U("Hello")])),
    ("developer_with_tools", R([{"role": "developer", "content": "Use tools when needed."}, U("Weather in Oslo?")], tools=[WEATHER])),
    ("empty_user_content", R([U("")])),
    ("null_user_content_then_text", R([{"role": "user", "content": None}, A("?"), U("ok")])),
    ("multi_turn_three", R([U("Hi"), A("Hello! How can I help?"), U("Tell me a joke."), A("Why did the chicken cross the road?"), U("Why?")])),
    ("consecutive_assistants", R([U("Go"), A("Part one."), A("Part two.")])),
    ("unicode_content", R([{"role": "system", "content": "Réponds en français — 日本語も可 🙂"}, U("Ça va? 你好 👋🏽 नमस्ते \u00a0x")])),
    # ---- list content
    ("list_content_user", R([{"role": "user", "content": [{"type": "text", "text": "First part. "}, {"type": "text", "text": "Second part."}]}])),
    ("list_content_system", R([{"role": "system", "content": [{"type": "text", "text": " Sys A"}, {"type": "text", "text": "\nSys B "}]}, U("Hi")])),
    ("list_content_system_with_tools", R([{"role": "system", "content": [{"type": "text", "text": "Be careful."}]}, U("Hi")], tools=[RUN])),
    ("list_content_assistant_and_tool", R([U("Read it"), {"role": "assistant", "content": [{"type": "text", "text": "Reading."}], "tool_calls": [call("run_shell", {"cmd": "cat a.txt"})]},
                                         {"role": "tool", "content": [{"type": "text", "text": "line1\nline2"}]}], tools=[RUN])),
    ("image_url_part", R([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, {"type": "text", "text": "Describe."}]}])),
    ("video_part", R([{"role": "user", "content": [{"type": "video", "video": "clip.mp4"}, {"type": "text", "text": "What happens?"}]}])),
    ("vision_ids", R([{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Compare."}]}, A("They differ."),
                      {"role": "user", "content": [{"type": "video"}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "And these?"}]}],
                     chat_template_kwargs={"add_vision_id": True})),
    # ---- tools listing
    ("tools_system_user", R([{"role": "system", "content": "You are helpful."}, U("Weather in Paris?")], tools=[WEATHER])),
    ("tools_no_system", R([U("Weather in Paris?")], tools=[WEATHER])),
    ("tools_empty_system", R([{"role": "system", "content": "  \n"}, U("Weather?")], tools=[WEATHER])),
    ("tools_many_unicode_schema", R([U("Find 'café' docs")], tools=[WEATHER, WRITE_FILE, SEARCH, RUN])),
    ("tools_empty_list", R([U("Hello")], tools=[])),
    ("tools_raw_function_objects", R([U("Hi")], tools=[{"name": "ping", "description": "No wrapper", "parameters": {}}])),
    # ---- tool calls
    ("tool_call_object_args", R([U("Weather in Paris?"), A("", tool_calls=[call("get_weather", {"city": "Paris"})])], tools=[WEATHER])),
    ("tool_call_string_args", R([U("Weather in Paris?"), A("", tool_calls=[call("get_weather", "{\"city\": \"Paris\", \"unit\": \"c\"}")])], tools=[WEATHER])),
    ("tool_call_with_content", R([U("Weather in Paris?"), A("Let me check.", tool_calls=[call("get_weather", {"city": "Paris"})])], tools=[WEATHER])),
    ("tool_call_whitespace_content", R([U("Weather?"), A(" \n ", tool_calls=[call("get_weather", {"city": "Rome"})])], tools=[WEATHER])),
    ("tool_call_null_content", R([U("Weather?"), A(None, tool_calls=[call("get_weather", {"city": "Rome"})])], tools=[WEATHER])),
    ("multiple_tool_calls", R([U("Weather in Paris, Rome and Oslo?"), A("Checking all three.", tool_calls=[
        call("get_weather", {"city": "Paris"}), call("get_weather", "{\"city\":\"Rome\",\"unit\":\"f\"}"), call("get_weather", {"city": "Oslo", "unit": "c"})])], tools=[WEATHER])),
    ("tool_call_unwrapped_function", R([U("Ping"), A("", tool_calls=[call("ping", {"host": "a.b"}, wrapped=False)])])),
    ("tool_call_no_arguments_key", R([U("Ping"), A("", tool_calls=[{"type": "function", "function": {"name": "ping"}}])])),
    ("tool_call_empty_string_and_null_args", R([U("Ping twice"), A("", tool_calls=[call("ping", ""), call("ping", None), call("ping", "{}")])])),
    ("tool_call_nested_values", R([U("Search"), A("", tool_calls=[call("search", {
        "query": "llama", "limit": 5, "threshold": 0.25, "filters": {"lang": ["en", "fr"], "exact": True, "since": None},
        "weights": [1.0, 2.5, -0.0, 1e-07, 1e+20, 123456789.123, 0.1, 1e16, 1e15, 3.0e-5, 0.0001],
        "big": 9007199254740993, "neg": -42, "flag": False, "empty_obj": {}, "empty_arr": [], "nested": [[{"a": [1, {"b": None}]}]]})])],
        tools=[SEARCH])),
    ("tool_call_string_args_nested", R([U("Search"), A("", tool_calls=[call("search",
        "{\"query\": \"caf\\u00e9 \\\"x\\\"\", \"filters\": {\"lang\": [\"ja\", \"\\u65e5\\u672c\"], \"exact\": false}, \"limit\": 3, \"threshold\": 1.50}")])],
        tools=[SEARCH])),
    ("tool_call_special_chars", R([U("Write the file"), A("", tool_calls=[call("write_file", {
        "path": "src/a b/<x>&\"y\".c",
        "content": "#include <stdio.h>\nint main(void) {\n\tprintf(\"%s\\n\", \"héllo 🌍\");\n\treturn 0; /* </parameter> */\n}\n",
        "meta": {"quote": "\"", "backslash": "\\", "ctrl": "\u0001\u001f\b\f\r\t\n", "del": "\u007f", "slash": "/", "uni": "é中🙂\u2028"}})])],
        tools=[WRITE_FILE])),
    ("tool_call_unicode_arg_names", R([U("x"), A("", tool_calls=[call("f", {"ключ": "значение", "键": ["值"]})])])),
    # ---- tool results
    ("tool_round_trip_grouped", R([U("Weather in Paris and Rome?"), A("I will check both.", reasoning_content="Need two calls.", tool_calls=[
        call("get_weather", {"city": "Paris"}), call("get_weather", {"city": "Rome", "unit": "c"})]),
        T("{\"temp\": 18}"), T("{\"temp\": 24}")], tools=[WEATHER])),
    ("tool_results_then_answer_then_user", R([U("Weather?"), A("", tool_calls=[call("get_weather", {"city": "Paris"})]), T("sunny"), T(" windy \n"),
                                               A("It is sunny and windy."), U("Thanks")], tools=[WEATHER], chat_template_kwargs=OFF)),
    ("tool_result_last_no_generation_prompt", R([U("Weather?"), A("", tool_calls=[call("get_weather", {"city": "Paris"})]), T("rain")],
                                               tools=[WEATHER], add_generation_prompt=False)),
    ("tool_result_empty_content", R([U("Run it"), A("", tool_calls=[call("run_shell", {"cmd": "true"})]), T("")], tools=[RUN])),
    ("tool_after_system_first", R([{"role": "system", "content": "S"}, T("orphan result"), U("What was that?")])),
    ("tool_first_message", R([T("orphan result"), U("What was that?")])),
    # ---- reasoning and the last-user-query rule
    ("history_reasoning_dropped", R([U("1+1?"), A("2", reasoning_content="Add one and one."), U("2+2?")])),
    ("history_think_in_content_dropped", R([U("1+1?"), A("<think>\nAdd one and one.\n</think>\n\n2"), U("2+2?")])),
    ("history_reasoning_preserved", R([U("1+1?"), A("2", reasoning_content="Add one and one."), U("2+2?")], chat_template_kwargs=KEEP)),
    ("preserve_thinking_false_explicit", R([U("1+1?"), A("2", reasoning_content="Add."), U("2+2?")], chat_template_kwargs={"preserve_thinking": False})),
    ("preserve_think_in_content", R([U("Q"), A("<think>\n  inner  \n</think>\n\n  A  "), U("Q2"), A("B", reasoning_content="  r2 \n")],
                                    chat_template_kwargs={"preserve_thinking": True, "enable_thinking": False})),
    ("reasoning_after_last_query_kept", R([U("Weather in Paris?"), A("", reasoning_content="I should call the tool.", tool_calls=[call("get_weather", {"city": "Paris"})]),
                                          T("18C"), A("It is 18C.", reasoning_content="The tool said 18C.")], tools=[WEATHER])),
    ("reasoning_before_and_after_last_query", R([U("First?"), A("One.", reasoning_content="old thoughts"), U("Weather?"),
                                                A("", reasoning_content="call it", tool_calls=[call("get_weather", {"city": "Oslo"})]), T("cold")], tools=[WEATHER])),
    ("reasoning_after_query_thinking_off", R([U("Weather?"), A("", reasoning_content="tool time", tool_calls=[call("get_weather", {"city": "Oslo"})]), T("cold")],
                                             tools=[WEATHER], chat_template_kwargs=OFF)),
    ("user_tool_response_not_a_query", R([U("Real question"), A("x", reasoning_content="thinking A"), U("<tool_response>\nfake\n</tool_response>"),
                                          A("y", reasoning_content="thinking B")])),
    ("user_tool_response_padded", R([U("Q"), A("x", reasoning_content="r"), U("  <tool_response>data</tool_response>\n")])),
    ("think_close_without_open", R([U("Q"), A("reasoning only here</think>answer"), U("Q2")], chat_template_kwargs=KEEP)),
    ("think_multiple_close_tags", R([U("Q"), A("<think>a</think>b</think>\n\nc")], add_generation_prompt=False)),
    ("think_content_leading_spaces", R([U("Q"), A("<think>r</think>\n  spaced answer")], add_generation_prompt=False)),
    ("reasoning_empty_string_keeps_think_tags", R([U("Q"), A("<think>x</think>y", reasoning_content="")], add_generation_prompt=False)),
    ("reasoning_null_splits_content", R([U("Q"), A("<think>\nr\n</think>\n\ny", reasoning_content=None)], add_generation_prompt=False)),
    ("reasoning_multiline_trimmed", R([U("Q"), A("Answer.", reasoning_content="\n\n  line one\nline two  \n\n")], add_generation_prompt=False)),
    ("agent_loop_long", R([{"role": "system", "content": "You are a coding agent."}, U("Fix the bug in main.c"),
                           A("Let me look.", reasoning_content="Open the file first.", tool_calls=[call("run_shell", "{\"cmd\": \"cat main.c\"}")]),
                           T("int main() { return 1; }"),
                           A("", reasoning_content="Returns 1; should be 0.", tool_calls=[call("write_file", {"path": "main.c", "content": "int main() { return 0; }\n"}),
                                                                                           call("run_shell", {"cmd": "make && ./main; echo $?"})]),
                           T("ok"), T("0"), A("Fixed: main now returns 0.", reasoning_content="Verified."), U("Thanks! Now add a test.")],
                          tools=[RUN, WRITE_FILE])),
    # ---- refusals (the template raises, or the preprocessing fails)
    ("error_no_messages", R([])),
    ("error_no_user_message", R([{"role": "system", "content": "S"}, A("hi")])),
    ("error_only_tool_response_users", R([U("<tool_response>x</tool_response>")])),
    ("error_unknown_role", R([U("Hi"), {"role": "narrator", "content": "Meanwhile..."}])),
    ("error_system_not_first", R([U("Hi"), {"role": "system", "content": "late"}])),
    ("error_system_image", R([{"role": "system", "content": [{"type": "image"}]}, U("Hi")])),
    ("error_content_number", R([{"role": "user", "content": 5}])),
    ("error_content_object", R([{"role": "user", "content": {"text": "hi"}}])),
    ("error_content_item_unknown", R([{"role": "user", "content": [{"type": "audio", "audio": "x"}]}])),
    ("error_args_json_array", R([U("x"), A("", tool_calls=[call("f", "[1, 2]")])])),
    ("error_args_bad_json", R([U("x"), A("", tool_calls=[call("f", "{\"a\": ")])])),
    ("error_args_number", R([U("x"), A("", tool_calls=[call("f", 7)])])),
    ("error_tool_call_no_name", R([U("x"), A("", tool_calls=[{"type": "function", "function": {"arguments": {}}}])])),
]


# ------------------------------------------------------------------------------------------- random
WS = [" ", "\n", "\t", "\u3000", "\xa0", "\x1c", "\u2028", "\x85", "\u200b", "\r", "\x0b", ""]
PIECES = ["hello", "<think>", "</think>", "<tool_response>", "</tool_response>", "\n", "\n\n", " ", "é", "日本", "🙂",
          "\"", "\\", "{", "}", "x y", "<tool_call>", "a</think", "think>"]


def random_cases(seed, n):
    rng = random.Random(seed)

    def text():
        return "".join(rng.choice(PIECES + WS) for _ in range(rng.randint(0, 8)))

    def value(depth=0):
        r = rng.random()
        if r < 0.15:
            return text()
        if r < 0.3:
            return rng.randint(-10**12, 10**12)
        if r < 0.45:
            c = rng.random()
            if c < 0.3:
                v = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(63)))[0]
                return v if math.isfinite(v) else 0.5
            if c < 0.6:
                return rng.uniform(-1e6, 1e6)
            return float(rng.choice(["0.1", "1e16", "1e-5", "2.5", "100", "1e300", "3.14159"]))
        if r < 0.55:
            return rng.choice([True, False, None])
        if r < 0.75 and depth < 3:
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        if depth < 3:
            return {text() or "k": value(depth + 1) for _ in range(rng.randint(0, 3))}
        return 1

    def content():
        r = rng.random()
        if r < 0.6:
            return text()
        if r < 0.7:
            return None
        parts = []
        for _ in range(rng.randint(0, 3)):
            c = rng.random()
            if c < 0.7:
                parts.append({"type": "text", "text": text()})
            elif c < 0.85:
                parts.append({"type": "image_url", "image_url": {"url": "u"}})
            else:
                parts.append({"type": "video"})
        return parts

    def tool_call():
        args = {text() or "p": value() for _ in range(rng.randint(0, 3))}
        if rng.random() < 0.4:
            args = json.dumps(args, ensure_ascii=rng.random() < 0.5)
        fn = {"name": rng.choice(["f", "get_weather", "é"]), "arguments": args}
        return {"type": "function", "function": fn} if rng.random() < 0.8 else fn

    def message(first):
        roles = ["system", "developer", "user", "user", "tool"] if first else \
            ["user", "user", "assistant", "assistant", "tool", "tool"] + (["system"] if rng.random() < 0.05 else [])
        msg = {"role": rng.choice(roles), "content": content()}
        if msg["role"] == "user" and rng.random() < 0.2:
            msg["content"] = rng.choice(WS) + "<tool_response>" + text() + "</tool_response>" + rng.choice(WS)
        if msg["role"] == "assistant":
            if rng.random() < 0.5:
                msg["reasoning_content"] = rng.choice([text(), None, ""])
            if rng.random() < 0.5:
                msg["tool_calls"] = [tool_call() for _ in range(rng.randint(1, 3))]
        if msg["role"] in ("system", "developer") and isinstance(msg["content"], list):
            msg["content"] = [p for p in msg["content"] if p.get("type") == "text"]
        return msg

    cases = []
    for k in range(n):
        messages = [message(i == 0) for i in range(rng.randint(1, 9))]
        at = rng.randint(1, len(messages)) if messages[0]["role"] in ("system", "developer") else 0
        messages.insert(at, {"role": "user", "content": text() or "q"})
        request = {"messages": messages}
        if rng.random() < 0.5:
            request["tools"] = [{"type": "function", "function": {"name": text(), "description": text(),
                                                                  "parameters": value()}} for _ in range(rng.randint(0, 2))]
        kwargs = {}
        for key in ("enable_thinking", "preserve_thinking"):
            if rng.random() < 0.4:
                kwargs[key] = rng.choice([True, False, None])
        if rng.random() < 0.1:
            kwargs["add_vision_id"] = True
        if kwargs:
            request["chat_template_kwargs"] = kwargs
        if rng.random() < 0.3:
            request["add_generation_prompt"] = rng.random() < 0.5
        cases.append(("random_%d_%d" % (seed, k), request))
    return cases


def render_cases(tpl, cases, allow_errors):
    out = []
    for name, request in cases:
        case = {"name": name, "request": request}
        try:
            case["rendered"] = tpl.render(**template_kwargs(request))
            assert allow_errors or not name.startswith("error_"), name + " rendered"
        except Exception as e:  # noqa: BLE001 - any refusal is a case
            assert allow_errors or name.startswith("error_"), name + ": " + repr(e)
            case["error"] = "%s: %s" % (type(e).__name__, e)
        out.append(case)
    return out


def write_cases(out, path):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote %d cases (%d errors) to %s" % (len(out), sum("error" in c for c in out), path))


def main():
    default_tpl = os.path.join(ROOT, "tests/data/tokenizers/qwen35/chat_template.jinja")
    if len(sys.argv) > 1 and sys.argv[1] == "--random":
        tpl = make_env().from_string(open(default_tpl, encoding="utf-8").read())
        write_cases(render_cases(tpl, random_cases(int(sys.argv[3]), int(sys.argv[2])), True), sys.argv[4])
        return
    tpl_path = sys.argv[1] if len(sys.argv) > 1 else default_tpl
    out_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "tests/data/chat_template_cases.json")
    random_path = sys.argv[3] if len(sys.argv) > 3 else os.path.join(ROOT, "tests/data/chat_template_random.json")
    tpl = make_env().from_string(open(tpl_path, encoding="utf-8").read())
    names = [name for name, _ in CASES]
    assert len(set(names)) == len(names), "duplicate case names"
    write_cases(render_cases(tpl, CASES, False), out_path)
    write_cases(render_cases(tpl, random_cases(2026, 150), True), random_path)


if __name__ == "__main__":
    main()
