"""test_server_responses.py — `lily serve`'s Responses API through the official openai SDK (run by
test_server_responses.sh).

usage: python test_server_responses.py <lily-binary> <model-dir>

Every reply is checked against /v1/chat/completions for the same conversation (greedy, temperature 0): the
Responses API runs the chat path, so its text, reasoning, tool calls and usage must be the chat route's. The
tiny model writes noise, so tool calls are forced with tool_choice and structured output relies on the grammar.
"""
import http.client
import json
import os
import subprocess
import sys
import tempfile
from typing import Optional

LILY, MODEL = sys.argv[1], sys.argv[2]
KEY = "resp-key"
failures = []


def check(cond, what):
    print(("  ok   " if cond else "  FAIL ") + what)
    if not cond:
        failures.append(what)


try:
    import openai
    import pydantic
except ImportError as e:
    print(f"SKIP: {e}: the SDK checks need the openai package (PyPI)")
    sys.exit(0)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from lily_test import start_server  # noqa: E402  (the suite's one way to start `lily serve`)

log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log", delete=False)
server, port = start_server(LILY, MODEL, log.name, "--api-key", KEY, "--ctx-size", "4096",
                            "--backend", os.environ.get("LILY_TEST_BACKEND", "cpu"))
BASE = f"http://127.0.0.1:{port}"


def raw(method, path, body=None, text=None):
    """(status, parsed JSON or text) of one request with the key."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    data = text if text is not None else (json.dumps(body) if body is not None else None)
    conn.request(method, path, data, {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    r = conn.getresponse()
    status, out = r.status, r.read().decode()
    conn.close()
    try:
        return status, json.loads(out)
    except ValueError:
        return status, out


def error_shaped(body, param):
    err = body.get("error") if isinstance(body, dict) else None
    return (isinstance(err, dict) and set(err) == {"message", "type", "param", "code"} and
            err["type"] == "invalid_request_error" and err["param"] == param and bool(err["message"]))


oc = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
NO_THINK = {"effort": "none"}  # the chat route's reasoning_effort "none": the same prompt on both routes
HI = "Say hello."


def chat(messages, **kw):
    return oc.chat.completions.create(model="lily", messages=messages, temperature=0, **kw)


try:
    # ------------------------------------------------------------------------------------ plain text
    print("responses: plain text, against chat")
    r = oc.responses.create(model="lily", input=HI, max_output_tokens=12, temperature=0, reasoning=NO_THINK,
                            metadata={"run": "t1"}, store=False)
    c = chat([{"role": "user", "content": HI}], max_tokens=12, reasoning_effort="none")
    check(r.id.startswith("resp_") and r.object == "response" and r.model == c.model and r.created_at > 0,
          f"id resp_..., object response, model {r.model}")
    check([o.type for o in r.output] == ["message"] and r.output[0].role == "assistant" and
          r.output[0].content[0].type == "output_text", f"one message item with output_text ({r.output})")
    check(r.output_text == c.choices[0].message.content and r.output_text,
          f"greedy text equals /v1/chat/completions': {r.output_text!r}")
    check(r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens" and
          c.choices[0].finish_reason == "length" and r.output[0].status == "incomplete",
          f"max_output_tokens 12: status incomplete, reason max_output_tokens ({r.status}, {r.incomplete_details})")
    u = r.usage
    check(u.output_tokens == 12 and u.input_tokens == c.usage.prompt_tokens and
          u.total_tokens == u.input_tokens + u.output_tokens and u.output_tokens_details.reasoning_tokens == 0,
          f"usage: 12 output tokens, input_tokens as chat's prompt_tokens ({u})")
    check(r.metadata == {"run": "t1"} and r.store is False and r.max_output_tokens == 12 and
          r.previous_response_id is None, "metadata echoed, store false (stateless), max_output_tokens echoed")
    r2 = oc.responses.create(model="lily", input=HI, max_output_tokens=12, temperature=0, reasoning=NO_THINK)
    check(r2.usage.input_tokens_details.cached_tokens > 0 and r2.output_text == r.output_text and r2.id != r.id,
          f"the same input again reads the prefix cache ({r2.usage.input_tokens_details.cached_tokens} cached)")

    # instructions and message items are the chat route's system and user messages
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Say "}, {"type": "input_text",
                                                                                   "text": "hello."}]}]
    r = oc.responses.create(model="lily", instructions="Be brief.", input=items, max_output_tokens=30,
                            temperature=0, reasoning=NO_THINK)
    c = chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": HI}], max_tokens=30,
             reasoning_effort="none")
    done = {"stop": "completed", "length": "incomplete"}[c.choices[0].finish_reason]
    check(r.output_text == c.choices[0].message.content and r.status == done and
          r.usage.input_tokens == c.usage.prompt_tokens and r.instructions == "Be brief.",
          f"instructions + input_text parts: chat's system + user ({r.status}, {r.output_text!r})")

    # a developer / system item after a user turn (agents send them) joins the one system message, in order,
    # on this route and the chat route: the reply and usage of that conversation with one leading system message
    late = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."},
            {"role": "developer", "content": "Answer in French."}, {"role": "user", "content": HI},
            {"role": "system", "content": "Use one word."}]
    r = oc.responses.create(model="lily", instructions="Be brief.", input=late, max_output_tokens=20,
                            temperature=0, reasoning=NO_THINK)
    folded = [{"role": "system", "content": "Be brief.\n\nAnswer in French.\n\nUse one word."}] + [
        m for m in late if m["role"] in ("user", "assistant")]
    c = chat(folded, max_tokens=20, reasoning_effort="none")
    c_late = chat([{"role": "system", "content": "Be brief."}] + late, max_tokens=20, reasoning_effort="none")
    check(r.output_text == c.choices[0].message.content == c_late.choices[0].message.content and
          r.usage.input_tokens == c.usage.prompt_tokens == c_late.usage.prompt_tokens,
          f"late developer / system items: one leading system message on both routes ({r.output_text!r}, "
          f"{r.usage.input_tokens} = {c.usage.prompt_tokens} = {c_late.usage.prompt_tokens} input tokens)")

    # thinking on (the template's default, as on the chat route): a reasoning item before the message
    r = oc.responses.create(model="lily", input=HI, max_output_tokens=60, temperature=0)
    c = chat([{"role": "user", "content": HI}], max_tokens=60)
    want_reasoning = (c.choices[0].message.model_extra or {}).get("reasoning_content") or ""
    kinds = [o.type for o in r.output]
    got_reasoning = "".join(p.text for o in r.output if o.type == "reasoning" for p in (o.content or []))
    check(want_reasoning and kinds[0] == "reasoning" and got_reasoning == want_reasoning and
          r.output_text == (c.choices[0].message.content or ""),
          f"thinking: reasoning item = chat's reasoning_content, then the text ({kinds})")
    check(r.usage.output_tokens_details.reasoning_tokens == c.usage.completion_tokens_details.reasoning_tokens > 0,
          f"reasoning_tokens as chat's ({r.usage.output_tokens_details.reasoning_tokens})")

    # ------------------------------------------------------------------------------------ streaming
    print("responses: streaming")
    # reasoning_budget (lily's chat extension, as vLLM's): the think block is closed after 8 tokens, so both a
    # reasoning item and a message stream
    BUDGET = {"reasoning_budget": 8}
    ref = oc.responses.create(model="lily", input=HI, max_output_tokens=60, temperature=0, extra_body=BUDGET)
    events = list(oc.responses.create(model="lily", input=HI, max_output_tokens=60, temperature=0, stream=True,
                                      extra_body=BUDGET))
    types = [e.type for e in events]
    check(types[:2] == ["response.created", "response.in_progress"] and
          types[-1] in ("response.completed", "response.incomplete") and
          [e.sequence_number for e in events] == list(range(len(events))),
          f"created, in_progress, ..., {types[-1]}; sequence_number 0..{len(events) - 1}")
    check(events[0].response.status == "in_progress" and events[0].response.output == [] and
          events[0].response.id == events[-1].response.id, "response.created: in_progress, no output, one id")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    thoughts = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    final = events[-1].response
    check(deltas and thoughts and deltas == ref.output_text and final.output_text == ref.output_text and
          thoughts == "".join(p.text for o in ref.output if o.type == "reasoning" for p in (o.content or [])),
          f"streamed text and reasoning equal the non-streamed response's ({deltas!r})")
    check(final.status == ref.status and final.usage.output_tokens == ref.usage.output_tokens and
          [o.type for o in final.output] == [o.type for o in ref.output],
          f"the final event's response: status {final.status}, usage, items as non-streamed")
    added = [e for e in events if e.type == "response.output_item.added"]
    finished = [e for e in events if e.type == "response.output_item.done"]
    check(len(added) == len(finished) == len(final.output) and
          [e.item.id for e in finished] == [o.id for o in final.output] and
          "response.content_part.added" in types and "response.output_text.done" in types and
          "response.content_part.done" in types, "each item added and done, content parts opened and closed")

    # ------------------------------------------------------------------------------------ structured output
    print("responses: text.format json_schema")

    class Person(pydantic.BaseModel):
        name: pydantic.constr(max_length=10)
        age: int
        admin: bool

    if hasattr(oc.responses, "parse"):
        r = oc.responses.parse(model="lily", input="Give me JSON.", text_format=Person, max_output_tokens=300,
                               temperature=0, reasoning=NO_THINK)
        check(r.status == "completed" and isinstance(r.output_parsed, Person),
              f"responses.parse(text_format=Person): {r.output_text}")
        c = oc.chat.completions.parse(model="lily", messages=[{"role": "user", "content": "Give me JSON."}],
                                      response_format=Person, max_tokens=300, temperature=0, reasoning_effort="none")
        check(r.output_text == c.choices[0].message.content, "the same JSON as chat.completions.parse")
    else:
        print("  (this openai SDK has no responses.parse)")
        # a completed stream through the SDK's helper (responses.stream), parsed as the non-streamed one
        with oc.responses.stream(model="lily", input="Give me JSON.", text_format=Person, max_output_tokens=300,
                                 temperature=0, reasoning=NO_THINK) as s:
            for _ in s:
                pass
            fin = s.get_final_response()
        check(fin.status == "completed" and fin.output_text == r.output_text and fin.output_parsed == r.output_parsed,
              f"responses.stream(text_format=Person): completed, the same parsed output ({fin.output_parsed})")
    r = oc.responses.create(model="lily", input="Give me JSON.", max_output_tokens=300, temperature=0,
                            reasoning=NO_THINK, text={"format": {"type": "json_object"}})
    check(isinstance(json.loads(r.output_text), dict), f"json_object: an object ({r.output_text[:60]})")

    # ------------------------------------------------------------------------------------ function tools
    print("responses: a function tool round trip")
    TOOL = {"type": "function", "name": "get_weather", "description": "Weather of a city.", "strict": True,
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                           "required": ["city"], "additionalProperties": False}}
    CHAT_TOOL = {"type": "function", "function": {k: TOOL[k] for k in ("name", "description", "parameters",
                                                                       "strict")}}
    ASK = "What is the weather in Paris?"
    r = oc.responses.create(model="lily", input=ASK, tools=[TOOL], max_output_tokens=200, temperature=0,
                            reasoning=NO_THINK, tool_choice={"type": "function", "name": "get_weather"})
    c = chat([{"role": "user", "content": ASK}], tools=[CHAT_TOOL], max_tokens=200, reasoning_effort="none",
             tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls = [o for o in r.output if o.type == "function_call"]
    cc = c.choices[0].message.tool_calls
    check(r.status == "completed" and len(calls) == 1 and calls[0].name == "get_weather" and
          calls[0].call_id.startswith("call_") and calls[0].id.startswith("fc_") and
          "city" in json.loads(calls[0].arguments), f"a function_call item ({calls[0] if calls else r.output})")
    check(cc and calls and calls[0].arguments == cc[0].function.arguments,
          f"its arguments equal chat's named tool call's ({cc[0].function.arguments if cc else None})")
    # the round trip: the SDK's own output items back as input, with the function's result
    follow = [{"role": "user", "content": ASK}] + [o.model_dump(exclude_none=True) for o in r.output] + \
        [{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C."}]
    r2 = oc.responses.create(model="lily", input=follow, tools=[TOOL], max_output_tokens=40, temperature=0,
                             reasoning=NO_THINK)
    c2 = chat([{"role": "user", "content": ASK},
               {"role": "assistant", "content": c.choices[0].message.content or "",
                "tool_calls": [t.model_dump() for t in cc]},
               {"role": "tool", "tool_call_id": cc[0].id, "content": "Sunny, 21 C."}],
              tools=[CHAT_TOOL], max_tokens=40, reasoning_effort="none")
    text2 = c2.choices[0].message.content or ""
    check(r2.usage.input_tokens == c2.usage.prompt_tokens and r2.output_text == text2,
          f"function_call_output: the chat route's tool message, the same reply ({r2.output_text[:40]!r})")

    # streamed: the call's arguments arrive as deltas, the final item as non-streamed
    with oc.responses.stream(model="lily", input=ASK, tools=[TOOL], max_output_tokens=200, temperature=0,
                             reasoning=NO_THINK, tool_choice="required", parallel_tool_calls=False) as s:
        evs = list(s)
        fin = s.get_final_response()
    args = "".join(e.delta for e in evs if e.type == "response.function_call_arguments.delta")
    done_args = [e.arguments for e in evs if e.type == "response.function_call_arguments.done"]
    fcalls = [o for o in fin.output if o.type == "function_call"]
    check(fcalls and done_args == [fcalls[0].arguments] and args == fcalls[0].arguments and
          "city" in json.loads(args), f"streamed call: deltas = .done = the final item's arguments ({args})")

    # ------------------------------------------------------------------------------------ bad input
    print("responses: 400s in the Responses error shape")
    status, body = raw("POST", "/v1/responses", text='{"model": "lily", "input": ')
    check(status == 400 and error_shaped(body, None), f"malformed JSON: 400 ({body})")
    status, body = raw("POST", "/v1/responses", {"model": "lily", "input": 42})
    check(status == 400 and error_shaped(body, "input"), f"input 42: 400 naming input ({body})")
    status, body = raw("POST", "/v1/responses", {"model": "lily", "input": "hi", "max_output_tokens": "lots"})
    check(status == 400 and error_shaped(body, "max_output_tokens"), "max_output_tokens a string: 400")
    status, body = raw("POST", "/v1/responses", {"model": "lily", "input": "hi", "tools": [{"type": "web_search"}]})
    check(status == 400 and error_shaped(body, "tools[0]"), "a hosted tool: 400")
    status, body = raw("POST", "/v1/responses", {"model": "lily", "input": [
        {"type": "function_call_output", "call_id": "call_nope", "output": "x"}]})
    check(status == 400 and error_shaped(body, "input[0].call_id"), "function_call_output of no call: 400")
    try:
        oc.responses.create(model="lily", input="hi", previous_response_id="resp_123")
        check(False, "previous_response_id is refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body.get("param") == "previous_response_id" and
              "stateless" in e.message, f"previous_response_id: the SDK raises a 400 ({e.message[:80]})")
    try:
        oc.responses.create(model="lily", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://x/y.png"}]}])
        check(False, "an image is refused")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "input[0].content[0]" and "text only" in e.message, "input_image: a 400")
    status, body = raw("POST", "/v1/responses", {"model": "lily", "input": "x " * 5000, "max_output_tokens": 5})
    check(status == 400 and body["error"]["code"] == "context_length_exceeded" and body["error"]["param"] == "input"
          and "your input resulted in" in body["error"]["message"],
          f"a prompt over the context: 400 context_length_exceeded naming input ({body['error']['message'][:80]})")
    status, body = raw("POST", "/v1/responses", {"model": "lily", "input": [
        {"role": "user", "content": "a"}, {"type": "reasoning", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "t", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "t", "arguments": "[1]"}]})
    check(status == 400 and error_shaped(body, "input[3].arguments") and
          "input[3].arguments: expected a JSON object" in body["error"]["message"],
          f"a template error names the input item sent, not the chat message ({body})")
    status, body = raw("GET", "/v1/responses/resp_123")
    check(status == 404 and "stateless" in body["error"]["message"], "GET /v1/responses/{id}: 404, stateless")
    status, body = raw("POST", "/v1/responses", {"model": "lily", "input": "hi", "max_output_tokens": 2,
                                                 "reasoning": NO_THINK})
    check(status == 200 and body["object"] == "response", "the server still answers after the 400s")
finally:
    server.terminate()
    try:
        rc = server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        rc = "hung"
check(rc == 0, f"the server exits 0 after SIGTERM (rc {rc}; under ASan a leak fails it)")

if failures:
    print("\n--- server log (tail) ---\n" + "".join(open(log.name).readlines()[-40:]))
    print(f"{len(failures)} FAILED")
    sys.exit(1)
print("all passed")
