"""test_server_openai.py — `lily serve` against the official openai SDK and raw HTTP (run by test_server.sh).

usage: python test_server_openai.py <lily-binary> <model-dir>

Starts `lily serve` on a free loopback port with an API key, --queue 1 and a small --max-body, waits for
/health, runs every check, stops the server with SIGTERM while a stream is in flight (the stream must end
with [DONE] and the server exit 0). The tiny model writes noise, so the checks force what they need: tool
calls through tool_choice, long generations by banning the end tokens with logit_bias.
"""
import http.client
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

LILY, MODEL = sys.argv[1], sys.argv[2]
KEY = "test-key-123"
CTX = 2048
failures = []


def show_log_on_crash(kind, value, tb):
    """An exception (the server died, say): show the server's log before the traceback."""
    try:
        print("\n--- server log (tail) ---\n" + "".join(open(log.name).readlines()[-60:]))
        server.kill()
    except Exception:
        pass
    sys.__excepthook__(kind, value, tb)


sys.excepthook = show_log_on_crash


def check(cond, what):
    if cond:
        print("  ok   " + what)
    else:
        print("  FAIL " + what)
        failures.append(what)


# ---------------------------------------------------------------------------------------------- server

log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log", delete=False)
BACKEND = os.environ.get("LILY_TEST_BACKEND", "cpu")  # cuda: the same checks on the GPU backend
# The tiny model writes noise and the seeded checks below were set on the cpu's exact path's draws.
PRECISION = ["--precision", "exact"] if BACKEND == "cpu" else []
server = subprocess.Popen([LILY, "serve", "-m", MODEL, "--port", "0", "--api-key", KEY, "--queue", "1",
                           "--max-body", "1", "--ctx-size", str(CTX), "--threads", "1", "--backend", BACKEND]
                          + PRECISION,
                          stdout=subprocess.DEVNULL, stderr=log)
port = None
deadline = time.time() + 60
while port is None and time.time() < deadline:
    time.sleep(0.05)
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log.name).read())
    if m:
        port = int(m.group(1))
    if server.poll() is not None:
        break
if port is None:
    print(open(log.name).read())
    sys.exit("lily serve did not start")
BASE = f"http://127.0.0.1:{port}"


def request(method, path, body=None, key=KEY, raw=None, timeout=60):
    """(status, parsed JSON or text) of one HTTP request."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(BASE + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


# /health is 503 while loading, then 200
statuses = set()
while time.time() < deadline:
    s, _ = request("GET", "/health", key=None)
    statuses.add(s)
    if s == 200:
        break
    time.sleep(0.05)
check(200 in statuses and statuses <= {200, 503}, f"/health answers 503 while loading, then 200 (saw {statuses})")

s, tok = request("POST", "/tokenize", {"content": "<|im_end|><|endoftext|>"})
END_IDS = tok["tokens"] if s == 200 else []
check(s == 200 and len(END_IDS) == 2, f"/tokenize finds the end tokens {END_IDS}")
BAN_END = {str(i): -100 for i in END_IDS}

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time", "description": "Time in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]

# ---------------------------------------------------------------------------------------------- raw HTTP

print("routes")
s, models = request("GET", "/v1/models")
check(s == 200 and models["data"][0]["id"] == os.path.basename(MODEL.rstrip("/")), "/v1/models lists the model")
# vLLM's max_model_len, the --ctx-size the server runs (clients size their prompts by it), on the list and the model
s2, one = request("GET", "/v1/models/" + models["data"][0]["id"] if s == 200 else "/v1/models/x")
check(s == 200 and s2 == 200 and models["data"][0].get("max_model_len") == CTX and one.get("max_model_len") == CTX,
      f"/v1/models and /v1/models/ID give max_model_len = --ctx-size {CTX} "
      f"({models['data'][0].get('max_model_len') if s == 200 else s}, {one.get('max_model_len') if s2 == 200 else s2})")
s, r = request("POST", "/tokenize", {"content": "Hello world"})
ids = r.get("tokens", []) if s == 200 else []
s2, r2 = request("POST", "/detokenize", {"tokens": ids})
check(s == 200 and s2 == 200 and r2.get("content") == "Hello world", "/tokenize then /detokenize round-trips")

print("completions: echo with logprobs scores the prompt")
PROMPT = "Hello world, this is"
s, pt = request("POST", "/tokenize", {"content": PROMPT})
p_ids = pt["tokens"]
body = {"prompt": PROMPT, "max_tokens": 2, "echo": True, "logprobs": 3, "temperature": 0}
s, r = request("POST", "/v1/completions", body)
lp = r["choices"][0]["logprobs"] if s == 200 else {}
n_p = len(p_ids)
check(s == 200 and len(lp["tokens"]) == n_p + 2 and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
      and all(isinstance(x, float) for x in lp["token_logprobs"][1:])
      and "".join(lp["tokens"]) == r["choices"][0]["text"] and lp["text_offset"][:2] == [0, len(lp["tokens"][0])],
      f"echo + logprobs: the prompt's {n_p} tokens (the first null) then the completion's ({lp.get('token_logprobs')})")
# each prompt token's logprob is the one a completion of the prompt before it gives that token
agree = []
for k in range(1, n_p):
    s, one = request("POST", "/v1/completions", {"prompt": p_ids[:k], "max_tokens": 1, "logprobs": 3,
                                                 "temperature": 0, "logit_bias": {str(p_ids[k]): 100}})
    got = one["choices"][0]["logprobs"] if s == 200 else {}
    agree.append(s == 200 and got["tokens"] == [lp["tokens"][k]] and
                 abs(got["token_logprobs"][0] - lp["token_logprobs"][k]) < 1e-3 and
                 got["top_logprobs"][0].keys() == lp["top_logprobs"][k].keys())
check(agree and all(agree),
      f"each echoed prompt token's logprob and top_logprobs match a completion of its prefix ({agree})")
body["stream"] = True
s, text = request("POST", "/v1/completions", body)
chunks = [json.loads(ln[6:]) for ln in text.splitlines() if ln.startswith("data: {")] if s == 200 else []
streamed = [t for ch in chunks for t in ((ch["choices"][0]["logprobs"] or {}).get("token_logprobs") or [])]
check(streamed == lp["token_logprobs"] and chunks[0]["choices"][0]["text"] == PROMPT,
      "streamed: the echo chunk carries the prompt's logprobs, then the same values as unstreamed")

# max_tokens 0 with echo (how evaluation harnesses score a prompt, as vLLM allows): the prompt and its
# logprobs, nothing generated, finish_reason length; streamed the same
for stream in (False, True):
    s, r = request("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 3,
                                               "stream": stream, "stream_options": {"include_usage": True}}
                   if stream else {"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 3})
    if stream and s == 200:
        chunks = [json.loads(ln[6:]) for ln in r.splitlines() if ln.startswith("data: {")]
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        lps = [t for c in chunks if c["choices"] for t in ((c["choices"][0]["logprobs"] or {}).get("token_logprobs") or [])]
        fin = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        usage = [c["usage"] for c in chunks if c.get("usage")]
    elif s == 200:
        text, lps = r["choices"][0]["text"], r["choices"][0]["logprobs"]["token_logprobs"]
        fin, usage = [r["choices"][0]["finish_reason"]], [r["usage"]]
    check(s == 200 and text == PROMPT and lps == lp["token_logprobs"][:n_p] and fin == ["length"]
          and usage and usage[-1]["completion_tokens"] == 0 and usage[-1]["prompt_tokens"] == n_p,
          f"max_tokens 0 with echo{' (streamed)' if stream else ''}: the prompt's logprobs, no completion "
          f"({s} {str(r)[:300]})")

# a prompt of exactly the context: scoring it (echo, max_tokens 0) needs no room for a reply, so it is served, each
# position's logprob that of the same tokens one shorter; generating after it, or a prompt one longer, is a 400
FULL = [10 + (i * 37) % 480 for i in range(CTX)]
# two prefills of the whole context: ~55 s each on an AddressSanitizer build under load, so more than the default 60 s
s, r = request("POST", "/v1/completions", {"prompt": FULL, "max_tokens": 0, "echo": True, "logprobs": 1}, timeout=600)
s2, r2 = request("POST", "/v1/completions", {"prompt": FULL[:-1], "max_tokens": 0, "echo": True, "logprobs": 1},
                 timeout=600)
full_lps = r["choices"][0]["logprobs"]["token_logprobs"] if s == 200 else []
short_lps = r2["choices"][0]["logprobs"]["token_logprobs"] if s2 == 200 else []
check(s == 200 and s2 == 200 and len(full_lps) == CTX and full_lps[0] is None and full_lps[:-1] == short_lps
      and isinstance(full_lps[-1], float) and r["usage"]["prompt_tokens"] == CTX and r["choices"][0]["finish_reason"] == "length",
      f"echo with max_tokens 0 scores a prompt of the whole context ({CTX} tokens): {s} {str(r)[:200]}")
for body, what in (({"prompt": FULL, "max_tokens": 1}, "a prompt of the whole context and max_tokens 1"),
                   ({"prompt": FULL + [10], "max_tokens": 0, "echo": True}, "echo of a prompt one past the context")):
    s, r = request("POST", "/v1/completions", body)
    check(s == 400 and r["error"]["code"] == "context_length_exceeded", f"{what}: 400 ({s} {str(r)[:200]})")

# a streamed chat reply with logprobs: every token's logprobs once, and "logprobs": null on a chunk without
# tokens (the role chunk, the final one), as OpenAI and vLLM send it (the final chunk had {"content": []})
s, r = request("POST", "/v1/chat/completions", {"messages": USER, "max_tokens": 5, "logprobs": True, "top_logprobs": 2,
                                                "stream": True, "logit_bias": BAN_END, "seed": 3})
chunks = [json.loads(ln[6:]) for ln in r.splitlines() if ln.startswith("data: {")] if s == 200 else []
per_chunk = [ch["choices"][0].get("logprobs", "absent") for ch in chunks if ch["choices"]]
streamed = [t for lp in per_chunk if isinstance(lp, dict) for t in lp.get("content") or []]
check(s == 200 and len(streamed) == 5 and per_chunk[0] is None and per_chunk[-1] is None
      and chunks[-1]["choices"][0]["finish_reason"] == "length"
      and all(lp is None or (isinstance(lp, dict) and lp["content"]) for lp in per_chunk),
      f"streamed chat logprobs: 5 tokens, null on the chunks without tokens ({per_chunk[:1]} ... {per_chunk[-2:]})")
# the same for a streamed completion: each token's logprobs once, in the chunk of its text, the same values as
# unstreamed; the final chunk (finish_reason, no tokens) has "logprobs": null (it had empty arrays)
body = {"prompt": "Once", "max_tokens": 4, "logprobs": 2, "logit_bias": BAN_END, "seed": 7}
s, whole = request("POST", "/v1/completions", body)
s2, r = request("POST", "/v1/completions", dict(body, stream=True))
chunks = [json.loads(ln[6:]) for ln in r.splitlines() if ln.startswith("data: {")] if s2 == 200 else []
per_chunk = [ch["choices"][0].get("logprobs", "absent") for ch in chunks if ch["choices"]]
streamed = {k: [x for lp in per_chunk if isinstance(lp, dict) for x in lp[k]] for k in ("tokens", "token_logprobs")}
want = whole["choices"][0]["logprobs"] if s == 200 else {}
check(s == 200 and s2 == 200 and streamed["tokens"] == want["tokens"] and len(want["tokens"]) == 4
      and all(abs(a - b) < 1e-6 for a, b in zip(streamed["token_logprobs"], want["token_logprobs"]))
      and per_chunk[-1] is None and chunks[-1]["choices"][0]["finish_reason"] == "length"
      and all(lp is None or (isinstance(lp, dict) and lp["tokens"]) for lp in per_chunk)
      and all(lp is not None for ch, lp in zip(chunks, per_chunk) if ch["choices"][0]["text"]),
      f"streamed completion logprobs: 4 tokens as unstreamed, null on the final chunk ({per_chunk[-2:]})")

# U+0000 the model writes is kept, as other characters (strings may hold it): the token of "\u0000", forced by
# logit_bias, three times, in a chat reply (thinking off) and a completion, streamed or not
s, tok = request("POST", "/tokenize", {"content": "\u0000"})
check(s == 200 and len(tok["tokens"]) == 1, f"/tokenize: U+0000 is one token ({tok})")
if s == 200:
    force_nul = {"max_tokens": 3, "temperature": 0, "logit_bias": {str(tok["tokens"][0]): 100}}
    no_think = {"enable_thinking": False}
    for path, body in (("/v1/chat/completions", {"messages": USER, "chat_template_kwargs": no_think, **force_nul}),
                       ("/v1/completions", {"prompt": "Once", **force_nul})):
        for stream in (False, True):
            s, r = request("POST", path, {**body, "stream": stream})
            if s != 200:
                text = None
            elif stream:
                chunks = [json.loads(ln[6:]) for ln in r.splitlines() if ln.startswith("data: {")]
                text = "".join((c["choices"][0]["delta"].get("content") or "") if path.endswith("chat/completions")
                               else c["choices"][0]["text"] for c in chunks if c["choices"])
            else:
                choice = r["choices"][0]
                text = choice["message"]["content"] if path.endswith("chat/completions") else choice["text"]
            check(text == "\u0000" * 3, f"{path}{' streamed' if stream else ''}: three U+0000 kept ({s} {text!r})")
    # and echoed in a prompt (streamed, and streamed with the prompt's logprobs, which sends it after the prefill)
    for extra in ({}, {"stream": True}, {"stream": True, "logprobs": 1}):
        s, r = request("POST", "/v1/completions", {"prompt": "a\u0000b", "echo": True, **force_nul, **extra})
        if s == 200 and extra:
            chunks = [json.loads(ln[6:]) for ln in r.splitlines() if ln.startswith("data: {")]
            text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        else:
            text = r["choices"][0]["text"] if s == 200 else None
        check(text == "a\u0000b" + "\u0000" * 3, f"echo {extra}: the prompt's U+0000 kept ({s} {text!r})")

print("errors")
chat = "/v1/chat/completions"


def expect_error(status_want, method, path, body=None, raw=None, key=KEY, code=None, param=None, what=""):
    s, r = request(method, path, body, key=key, raw=raw)
    ok = s == status_want and isinstance(r, dict) and isinstance(r.get("error"), dict) and \
        {"message", "type", "param", "code"} <= set(r["error"])
    if ok and code is not None:
        ok = r["error"]["code"] == code
    if ok and param is not None:
        ok = r["error"]["param"] == param
    check(ok, f"{status_want} {what}: {json.dumps(r)[:160]}")


expect_error(400, "POST", chat, raw=b"{\"messages\": [", what="malformed JSON")
expect_error(400, "POST", chat, raw=b"\xff\xfe\x00", what="bytes that are not JSON")
expect_error(400, "POST", chat, {"messages": "hi"}, param="messages", what="messages not an array")
expect_error(400, "POST", chat, {"messages": []}, param="messages", what="empty messages")
expect_error(400, "POST", chat, {"messages": USER, "temperature": "hot"}, param="temperature", what="wrong type")
expect_error(400, "POST", chat, {"messages": USER, "max_tokens": -5}, param="max_tokens", what="negative max_tokens")
expect_error(400, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 0}, param="max_tokens",
             what="max_tokens 0 without echo")
expect_error(400, "POST", chat, {"messages": USER, "n": 2}, param="n", what="n > 1")
expect_error(400, "POST", chat, {"messages": USER, "stream_options": {"include_usage": True}}, param="stream_options",
             what="stream_options without stream (as OpenAI)")
expect_error(400, "POST", "/v1/completions", {"prompt": "Hi", "stream": False, "stream_options": {}},
             param="stream_options", what="stream_options with stream false")
# vLLM extensions lily does not implement are refused when set, not dropped (a reply made without them would
# silently be another reply): ignore_eos, min_tokens, guided_json, stop_token_ids, include_stop_str_in_output,
# continue_final_message, add_generation_prompt false
PREFILL = USER + [{"role": "assistant", "content": "Sure"}]
for path, body, param in ((chat, {"messages": USER, "ignore_eos": True}, "ignore_eos"),
                          ("/v1/completions", {"prompt": "Hi", "ignore_eos": True}, "ignore_eos"),
                          (chat, {"messages": USER, "min_tokens": 4}, "min_tokens"),
                          (chat, {"messages": USER, "guided_json": {"type": "object"}}, "guided_json"),
                          ("/v1/completions", {"prompt": "Hi", "stop_token_ids": [1]}, "stop_token_ids"),
                          (chat, {"messages": USER, "include_stop_str_in_output": True}, "include_stop_str_in_output"),
                          (chat, {"messages": PREFILL, "continue_final_message": True,
                                  "add_generation_prompt": False}, "continue_final_message"),
                          (chat, {"messages": USER, "add_generation_prompt": False}, "add_generation_prompt")):
    expect_error(400, "POST", path, body, param=param, what=f"{path} {param} (not implemented: refused, not ignored)")
s, r = request("POST", chat, {"messages": USER, "max_tokens": 2, "ignore_eos": False, "min_tokens": 0,
                              "guided_json": None, "stop_token_ids": [], "include_stop_str_in_output": False,
                              "continue_final_message": False, "add_generation_prompt": True})
check(s == 200, f"those fields at their defaults are accepted ({s})")
expect_error(400, "POST", chat, {"messages": [{"role": "wizard", "content": "x"}]}, what="unknown role")
expect_error(400, "POST", chat, {"messages": [{"role": "assistant", "content": "no user"}]}, what="unrenderable")
expect_error(400, "POST", chat, {"messages": USER, "tools": TOOLS,
                                 "tool_choice": {"type": "function", "function": {"name": "nope"}}},
             param="tool_choice", what="tool_choice naming an unknown function")
expect_error(400, "POST", chat, {"messages": [{"role": "user", "content": "word " * (CTX + 100)}]},
             code="context_length_exceeded", what="prompt longer than the context")
expect_error(400, "POST", "/v1/completions", {"prompt": [1, 2, 99999]}, param="prompt", what="token id out of vocab")
expect_error(400, "POST", chat, {"messages": USER, "logit_bias": {"99999": 5}}, param="logit_bias",
             what="logit_bias token id out of vocab")
expect_error(400, "POST", "/v1/completions", {"prompt": "Once", "logit_bias": {"1.5": 5}}, param="logit_bias",
             what="logit_bias key not an integer")
m = re.findall(r"POST /v1/chat/completions 400 prompt=(\d+)", open(log.name).read())
check(any(int(n) >= CTX for n in m), f"the log of a 400 context_length_exceeded shows the prompt's tokens (prompt={m})")
# Tokenizing stops at twice the context: past that the reply says "more than 2 CTX", what is known without
# tokenizing the rest; below it, the exact count. A long pre-token that alone cannot fit is not merged at all:
# the reply gives a lower bound on its count (1 MB of "a": at least 10^6 / the longest entry holding "a").
for path, body, low, high in ((chat, {"messages": [{"role": "user", "content": "word " * 200000}]}, 2 * CTX, 2 * CTX),
                              ("/v1/completions", {"prompt": "a" * 1000000}, CTX, 1000000)):
    s, r = request("POST", path, body)
    msg = r.get("error", {}).get("message", "") if isinstance(r, dict) else ""
    m = re.search(r"resulted in more than (\d+) tokens", msg)
    check(s == 400 and r["error"]["code"] == "context_length_exceeded" and m and low <= int(m.group(1)) <= high,
          f"{path}: a ~1 MB prompt is refused with a lower bound on its count ({s}: {msg[:120]})")
s, r = request("POST", "/tokenize", {"content": "word " * 1000})
n_1000 = len(r["tokens"]) if s == 200 else -1
s, r = request("POST", "/v1/completions", {"prompt": "word " * 1000})
msg = r.get("error", {}).get("message", "") if isinstance(r, dict) else ""
check(s == 400 and CTX < n_1000 <= 2 * CTX and f"resulted in {n_1000} tokens" in msg,
      f"a prompt under twice the context is refused with its count, {n_1000} ({msg[:120]})")
expect_error(400, "POST", "/v1/completions", {"prompt": list(range(1, 9)) * (CTX // 4)},
             code="context_length_exceeded", what="completions prompt longer than the context")
# a reply that runs into the end of the context stops there: prompt + completion == the context, never one more
s, r = request("POST", "/v1/completions", {"prompt": list(range(1, 9)) * (CTX // 8 - 1) + [1, 2, 3], "max_tokens": 50,
                                           "logit_bias": BAN_END, "seed": 1}, timeout=600)  # ~60 s under ASan (exact, 1 thread)
u = r.get("usage", {}) if s == 200 else {}
check(s == 200 and r["choices"][0]["finish_reason"] == "length" and u["prompt_tokens"] == CTX - 5 and
      u["completion_tokens"] == 5 and u["total_tokens"] == CTX,
      f"a reply cut by the full context: prompt + completion == {CTX} (got {s} {u})")
expect_error(401, "POST", chat, {"messages": USER}, key=None, code="invalid_api_key", what="no bearer token")
expect_error(401, "POST", chat, {"messages": USER}, key=KEY + "x", code="invalid_api_key", what="wrong bearer token")
expect_error(404, "GET", "/v2/nothing", what="unknown route")
expect_error(405, "GET", chat, what="GET on a POST route")
expect_error(405, "DELETE", "/v1/models", what="DELETE on a GET route")
expect_error(413, "POST", chat, raw=b"{\"messages\":\"" + b"x" * (2 << 20) + b"\"}", code="request_too_large",
             what="body over --max-body 1 MiB")
s, _ = request("GET", "/health", key=None)
check(s == 200, "the server is still healthy after the bad requests")

print("max_tokens cuts a tool call")
# 1 and 5 cut the opening the server writes itself ("\n</think>\n\n<tool_call>\n<function=NAME>\n", 14 tokens
# here): usage never counts more than max_tokens (it counted the whole opening: 14 for max_tokens 1)
for choice, max_tokens in itertools.product(("required", {"type": "function", "function": {"name": "get_weather"}}),
                                            (1, 5, 24)):
    s, r = request("POST", chat, {"messages": USER, "tools": TOOLS, "tool_choice": choice, "max_tokens": max_tokens,
                                  "seed": 3, "logit_bias": BAN_END})
    c = r["choices"][0] if s == 200 else {}
    check(s == 200 and c["finish_reason"] == "length" and r["usage"]["completion_tokens"] == max_tokens,
          f"tool_choice {json.dumps(choice)[:30]}, max_tokens {max_tokens}, cut inside the call: finish_reason "
          f"length, {max_tokens} tokens ({json.dumps(c)[:200]} {r.get('usage')})")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", chat, json.dumps({"messages": USER, "tools": TOOLS, "tool_choice": choice,
                                           "max_tokens": max_tokens, "seed": 3, "logit_bias": BAN_END,
                                           "stream": True, "stream_options": {"include_usage": True}}),
                 {"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
    chunks = [json.loads(ln[6:]) for ln in conn.getresponse().read().decode().splitlines() if ln.startswith("data: {")]
    conn.close()
    finishes = [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"]]
    usage = chunks[-1].get("usage") if chunks else None
    check(finishes and finishes[-1] == "length" and all(f is None for f in finishes[:-1]) and
          usage and usage["completion_tokens"] == max_tokens,
          f"the same streamed: finish_reason length, {max_tokens} tokens ({finishes[-3:]} {usage})")

# without logprobs the server appends its opening in one forward pass (with them, one pass per token, each
# token's logprob from the logits before it): the same reply either way, token for token
for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
    replies = []
    for lp in (False, True):
        s, r = request("POST", chat, {"messages": USER, "tools": TOOLS, "tool_choice": choice, "max_tokens": 40,
                                      "temperature": 0, "logit_bias": BAN_END, "logprobs": lp})
        m = r["choices"][0]["message"] if s == 200 else {}
        replies.append((s, m.get("content"), json.dumps(m.get("tool_calls") and
                                                        [c["function"] for c in m["tool_calls"]]),
                        r.get("usage", {}).get("completion_tokens")))
    check(replies[0] == replies[1] and replies[0][0] == 200 and replies[0][2] != "null",
          f"tool_choice {json.dumps(choice)[:30]}: the opening in one pass gives the reply of one pass per token "
          f"({replies[0]} vs {replies[1]})")

# a prompt that leaves less room than the opening: the part of the opening that fits goes in (in one pass without
# logprobs, one pass per token with them) and the reply ends at the end of the context, "length", the same either way
def padded_prompt_tokens(k):
    s, r = request("POST", chat, {"messages": [{"role": "user", "content": "Weather?" + " a" * k}], "tools": TOOLS,
                                  "max_tokens": 1})
    return r["usage"]["prompt_tokens"] if s == 200 else None


p0, p100 = padded_prompt_tokens(0), padded_prompt_tokens(100)
for room in (1, 2, 3, 7, 12, 18):
    k = round((CTX - room - p0) * 100 / (p100 - p0))
    for _ in range(6):  # the prompt of exactly CTX - room tokens
        n = padded_prompt_tokens(k)
        if n is None or n == CTX - room:
            break
        k += CTX - room - n
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        replies = []
        for lp in (False, True):
            s, r = request("POST", chat, {"messages": [{"role": "user", "content": "Weather?" + " a" * k}],
                                          "tools": TOOLS, "tool_choice": choice, "max_tokens": 40, "temperature": 0,
                                          "logit_bias": BAN_END, "logprobs": lp})
            c = r["choices"][0] if s == 200 else {}
            u = r.get("usage", {})
            m = c.get("message") or {}
            replies.append((s, c.get("finish_reason"), m.get("content"), json.dumps(m.get("tool_calls") and [
                t["function"] for t in m["tool_calls"]]), u.get("prompt_tokens"), u.get("completion_tokens")))
        check(replies[0] == replies[1] and replies[0][:2] == (200, "length") and replies[0][4] == CTX - room and
              replies[0][5] == room,
              f"tool_choice {json.dumps(choice)[:30]} with {room} tokens of room: the reply cut by the end of the "
              f"context, finish_reason length, prompt + completion == {CTX}, with or without logprobs ({replies})")

print("response_format beside tools under tool_choice auto")
# As in OpenAI's API the model may still call a tool; only an answer follows the format. The bias makes the
# model open a call ("<tool_call>") at once: the format must not mask it, and once the call is open nothing is
# constrained, so the reply is the one the same request gives without response_format, token for token.
s, r = request("POST", "/tokenize", {"content": "<tool_call>"})
CALL_OPEN = r["tokens"] if s == 200 else []
check(len(CALL_OPEN) == 1, f"<tool_call> is one token ({CALL_OPEN})")
for think in (False, True):
    base = {"messages": USER, "tools": TOOLS, "max_tokens": 12, "seed": 5, "logprobs": True,
            "logit_bias": {str(CALL_OPEN[0]): 100}, "chat_template_kwargs": {"enable_thinking": think}}
    if think:  # the call opens after the think block: the budget closes it at once
        base["reasoning_budget"] = 0
    replies = []
    for extra in ({}, {"tool_choice": "auto", "response_format": {"type": "json_object"}}):
        s, r = request("POST", chat, dict(base, **extra))
        c = r["choices"][0] if s == 200 else {}
        replies.append((s, c.get("message"), c.get("finish_reason"), c.get("logprobs"), r.get("usage", {}).get("completion_tokens")))
    toks = [t["token"] for t in (replies[0][3] or {}).get("content", [])]
    check(replies[0][0] == 200 and replies[0] == replies[1] and "<tool_call>" in toks,
          f"thinking {think}: with response_format the call still opens, the reply as without it ({toks[:6]})")
    # tool_choice "none" leaves the tools out: the format holds, the biased opening is masked
    s, r = request("POST", chat, dict(base, tool_choice="none", response_format={"type": "json_object"}))
    content = r["choices"][0]["message"]["content"] if s == 200 else ""
    check(s == 200 and (content or "").startswith("{"), f"thinking {think}: tool_choice none keeps the format ({content!r:.60})")

print("tool_choice allowed_tools (chat and Responses)")
# OpenAI's {"type": "allowed_tools", ...}: only the listed tools may be called; "required" forces a call to one of
# them, "auto" leaves the choice to the model with only them in the prompt (an auto call is not constrained).
def allowed(mode, names):
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": [
        {"type": "function", "function": {"name": n}} for n in names]}}
for seed in (1, 2, 3):
    s, r = request("POST", chat, {"messages": USER, "tools": TOOLS, "tool_choice": allowed("required", ["get_time"]),
                                  "max_tokens": 60, "seed": seed, "chat_template_kwargs": {"enable_thinking": False}})
    c = r["choices"][0] if s == 200 else {}
    calls = (c.get("message") or {}).get("tool_calls") or []
    finish = c.get("finish_reason")  # "length": max_tokens cut the (unbounded) string argument
    check(s == 200 and finish in ("tool_calls", "length") and calls and
          all(t["function"]["name"] == "get_time" for t in calls) and
          (finish == "length" or all(isinstance(json.loads(t["function"]["arguments"]), dict) for t in calls)),
          f"seed {seed}: mode required [get_time]: only get_time is called ({s}, {finish}, {calls})")
tokens = []
for tools, choice in ((TOOLS, allowed("auto", ["get_time"])), (TOOLS[1:], "auto"), (TOOLS, "auto")):
    s, r = request("POST", chat, {"messages": USER, "tools": tools, "tool_choice": choice, "max_tokens": 1})
    tokens.append(r["usage"]["prompt_tokens"] if s == 200 else s)
check(tokens[0] == tokens[1] and tokens[1] < tokens[2],
      f"mode auto [get_time]: the prompt of tools [get_time] alone (prompt tokens {tokens})")
for choice, param, what in ((allowed("auto", ["nope"]), "tool_choice", "no function named 'nope'"),
                            (allowed("required", []), "tool_choice", "at least one tool"),
                            (allowed("any", ["get_time"]), "tool_choice", "'auto' or 'required'")):
    s, r = request("POST", chat, {"messages": USER, "tools": TOOLS, "tool_choice": choice, "max_tokens": 1})
    err = r.get("error", {}) if isinstance(r, dict) else {}
    check(s == 400 and err.get("param") == param and what in err.get("message", ""),
          f"{json.dumps(choice['allowed_tools'])}: 400 ({err.get('message')})")
RTOOLS = [dict(t["function"], type="function") for t in TOOLS]
s, r = request("POST", "/v1/responses", {"input": USER, "tools": RTOOLS, "max_output_tokens": 60, "seed": 1,
                                         "reasoning": {"effort": "none"}, "tool_choice": {
                                             "type": "allowed_tools", "mode": "required",
                                             "tools": [{"type": "function", "name": "get_time"}]}})
calls = [o for o in r.get("output", []) if o.get("type") == "function_call"] if s == 200 else []
check(s == 200 and calls and all(o["name"] == "get_time" for o in calls) and
      r.get("tool_choice", {}).get("type") == "allowed_tools",
      f"/v1/responses mode required [get_time]: only get_time is called, tool_choice echoed ({s}, {calls})")
s, r = request("POST", "/v1/responses", {"input": USER, "tools": RTOOLS, "max_output_tokens": 1, "tool_choice": {
    "type": "allowed_tools", "mode": "auto", "tools": [{"type": "mcp", "server_label": "x"}]}})
check(s == 400 and r["error"]["param"] == "tool_choice.tools",
      f"/v1/responses allowed_tools with an mcp tool: 400 naming tool_choice.tools ({r})")

print("a stop string inside an unconstrained tool call")
# parameters the grammar cannot compile leave a required call's arguments free, so stop strings apply inside
# it: one that cuts the call short ends the reply with finish_reason "stop" (the call kept unfinished, as a
# length cut keeps it), never "tool_calls", which would tell a client to run it
FREE = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "strin"}}}}}]
base = {"messages": USER, "tools": FREE, "tool_choice": "required", "max_tokens": 30, "seed": 1,
        "chat_template_kwargs": {"enable_thinking": False}}
s, r = request("POST", chat, base)
free_finish = r["choices"][0]["finish_reason"] if s == 200 else None
for stream in (False, True):
    body = dict(base, stop=["e", "a", "o", "i"], stream=stream)
    s, r = request("POST", chat, body)
    if stream:
        chunks = [json.loads(ln[6:]) for ln in r.splitlines() if ln.startswith("data: {")] if s == 200 else []
        finishes = [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"]]
        finish = finishes[-1] if finishes else None
        called = any(ch["choices"][0]["delta"].get("tool_calls") for ch in chunks if ch["choices"])
    else:
        c = r["choices"][0] if s == 200 else {}
        finish, called = c.get("finish_reason"), bool(c.get("message", {}).get("tool_calls"))
    check(s == 200 and free_finish == "length" and called and finish == "stop",
          f"stream {stream}: a stop string cut the call: finish_reason stop (free: {free_finish}, got {finish})")

print("bad requests during a generation")
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
conn.request("POST", "/v1/completions", json.dumps({"prompt": "Once", "max_tokens": 80, "stream": True, "seed": 5,
                                                   "logit_bias": BAN_END, "stream_options": {"include_usage": True}}),
             {"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
resp = conn.getresponse()
body = resp.read1(100)
bad = [request("POST", chat, raw=b"{oops")[0], request("POST", chat, {"messages": []})[0],
       request("GET", "/nope")[0], request("POST", chat, {"messages": USER}, key="wrong")[0]]
body += resp.read()
conn.close()
usage = [json.loads(ln[6:]) for ln in body.decode().splitlines() if ln.startswith("data: {") and '"usage":{' in ln]
check(bad == [400, 400, 404, 401] and body.rstrip().endswith(b"data: [DONE]") and usage and
      usage[-1]["usage"]["completion_tokens"] == 80, f"a stream in flight is undisturbed by bad requests ({bad})")

print("tokenize, detokenize and count_tokens while a generation runs and the queue is full")
# they need the tokenizer, not the engine: answered at once beside the running generation (llama.cpp's server
# does so), where they waited in the queue behind it, or got 503 queue_full with the queue (--queue 1) full
streams = []
for i in range(2):  # the first runs, then the second fills the queue
    sc = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    sc.request("POST", "/v1/completions", json.dumps({"prompt": "Once", "max_tokens": CTX - 8, "stream": True,
                                                      "logit_bias": BAN_END}),
               {"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
    streams.append(sc)
    if i == 0:
        sc.getresponse().read1(100)  # the first generation is running: out of the queue
waiting = running = 0
for _ in range(200):  # the second request reaches the queue
    s, h = request("GET", "/health", key=None)
    running, waiting = h.get("requests_processing"), h.get("requests_waiting")
    if waiting == 1:
        break
    time.sleep(0.01)
s_tok, tok = request("POST", "/tokenize", {"content": "Hello world"})
s_detok, detok = request("POST", "/detokenize", {"tokens": tok.get("tokens", []) if s_tok == 200 else []})
s_count, count = request("POST", "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "Hello"}]})
s_h, h = request("GET", "/health", key=None)
for sc in streams:
    sc.sock.shutdown(socket.SHUT_RDWR)
    sc.close()
check((running, waiting) == (1, 1) and (s_tok, s_detok, s_count) == (200, 200, 200) and
      detok.get("content") == "Hello world" and count.get("input_tokens", 0) > 0 and
      (h.get("requests_processing"), h.get("requests_waiting")) == (1, 1),
      f"answered beside a running generation with the queue full ({s_tok}, {s_detok}, {s_count}; "
      f"running/waiting before {running}/{waiting}, after {h.get('requests_processing')}/{h.get('requests_waiting')})")
for _ in range(400):  # both cancelled: the engine is free for what follows
    if request("GET", "/health", key=None)[1].get("requests_processing") == 0:
        break
    time.sleep(0.01)

print("the request log: a stream's time to its first byte")


def logged(stream):
    """The log line of one chat request (streamed or not), once written (as the request completes)."""
    n = sum(1 for ln in open(log.name) if "POST /v1/chat/completions 200" in ln)
    s, _ = request("POST", chat, {"messages": USER, "max_tokens": 6, "seed": 2, "logit_bias": BAN_END,
                                  "stream": stream})
    for _ in range(200):
        lines = [ln for ln in open(log.name) if "POST /v1/chat/completions 200" in ln]
        if len(lines) > n:
            return s, lines[-1]
        time.sleep(0.01)
    return s, ""


s, line = logged(True)
t = re.search(r" ttft=([0-9.]+) ms", line)
b = re.search(r" first_byte=([0-9.]+) ms \(held ([0-9.]+), handoff ([0-9.]+)\)", line)
ttft, (first, held, handoff) = (float(t.group(1)) if t else 0), (map(float, b.groups()) if b else (0, 0, 0))
check(s == 200 and t and b and first >= ttft - 0.15 and abs(first - (ttft + held + handoff)) <= 0.25,
      f"a stream's log line: first_byte = ttft + held + handoff ({line.strip()[-220:]})")
s, line = logged(False)
check(s == 200 and " ttft=" in line and "first_byte" not in line, "a whole-body answer's log line has no first_byte")

# ---------------------------------------------------------------------------------------------- the SDK

try:
    import openai
except ImportError:
    openai = None
    print("SKIP: the openai package is not installed; SDK checks skipped")

if openai:
    client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
    NAME = os.path.basename(MODEL.rstrip("/"))

    print("chat, non-streaming")
    r = client.chat.completions.create(model=NAME, messages=USER, max_tokens=24, seed=7)
    c = r.choices[0]
    check(r.object == "chat.completion" and r.id.startswith("chatcmpl-") and c.message.role == "assistant",
          "response object, id and role")
    check(c.finish_reason in ("stop", "length"), f"finish_reason {c.finish_reason}")
    u = r.usage
    check(u.prompt_tokens > 0 and 0 < u.completion_tokens <= 24 and u.total_tokens == u.prompt_tokens +
          u.completion_tokens, f"usage {u.prompt_tokens}+{u.completion_tokens}")
    check(u.prompt_tokens_details is not None and u.prompt_tokens_details.cached_tokens >= 0, "cached_tokens present")

    print("chat, streaming")
    chunks = list(client.chat.completions.create(model=NAME, messages=USER, max_tokens=24, seed=7, stream=True))
    check(chunks[0].choices[0].delta.role == "assistant", "first delta carries the role")
    check(chunks[-1].choices[0].finish_reason in ("stop", "length") and
          all(ch.choices[0].finish_reason is None for ch in chunks[:-1]), "only the last chunk has finish_reason")
    check(all(ch.usage is None for ch in chunks), "no usage without include_usage")
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    streamed_reasoning = "".join(getattr(ch.choices[0].delta, "reasoning_content", None) or "" for ch in chunks)
    check(streamed == (c.message.content or "") and
          streamed_reasoning == (getattr(c.message, "reasoning_content", None) or ""),
          "stream and non-stream agree for the same seed")
    chunks = list(client.chat.completions.create(model=NAME, messages=USER, max_tokens=8, stream=True,
                                                 stream_options={"include_usage": True}))
    last = chunks[-1]
    check(last.choices == [] and last.usage is not None and last.usage.completion_tokens > 0 and
          all(ch.usage is None for ch in chunks[:-1]), "include_usage: one final chunk with empty choices")

    print("seed")
    a = client.chat.completions.create(model=NAME, messages=USER, max_tokens=32, seed=1234, temperature=1.0,
                                       logit_bias=BAN_END)
    b = client.chat.completions.create(model=NAME, messages=USER, max_tokens=32, seed=1234, temperature=1.0,
                                       logit_bias=BAN_END)
    check(a.choices[0].message.model_dump() == b.choices[0].message.model_dump(), "same seed, same output")

    print("thinking")
    on = client.chat.completions.create(model=NAME, messages=USER, max_tokens=40, seed=3)
    off = client.chat.completions.create(model=NAME, messages=USER, max_tokens=40, seed=3,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    none = client.chat.completions.create(model=NAME, messages=USER, max_tokens=40, seed=3, reasoning_effort="none")
    for name, resp in (("on", on), ("off", off), ("reasoning_effort none", none)):
        content = resp.choices[0].message.content or ""
        check("<think>" not in content and "</think>" not in content, f"thinking {name}: no think tags in content")
    check(off.usage.prompt_tokens > on.usage.prompt_tokens and none.usage.prompt_tokens == off.usage.prompt_tokens,
          "thinking off renders the empty think block (longer prompt), reasoning_effort none likewise")
    check(on.usage.completion_tokens_details.reasoning_tokens >= 0, "reasoning_tokens reported")

    print("developer role")
    dev = client.chat.completions.create(model=NAME, max_tokens=4, seed=5,
                                         messages=[{"role": "developer", "content": "Be brief."}] + USER)
    sysm = client.chat.completions.create(model=NAME, max_tokens=4, seed=5,
                                          messages=[{"role": "system", "content": "Be brief."}] + USER)
    check(dev.usage.prompt_tokens == sysm.usage.prompt_tokens and
          dev.choices[0].message.content == sysm.choices[0].message.content, "developer works like system")

    print("tools")
    # max_tokens leaves room to close the call: a call cut by max_tokens is finish_reason "length"
    r = client.chat.completions.create(model=NAME, messages=USER, tools=TOOLS, max_tokens=128, seed=11,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    m = r.choices[0].message
    calls = m.tool_calls or []
    check(r.choices[0].finish_reason == "tool_calls" and len(calls) >= 1 and
          calls[0].function.name == "get_weather" and calls[0].type == "function" and calls[0].id.startswith("call_"),
          "named tool_choice gives a get_weather call")
    check(len(calls) == 1, "named tool_choice: exactly one call")
    args_ok = all(isinstance(cl.function.arguments, str) and isinstance(json.loads(cl.function.arguments), dict)
                  for cl in calls)
    check(args_ok, "arguments are a JSON string of an object")
    follow = USER + [m.model_dump(exclude_none=True)] + \
        [{"role": "tool", "tool_call_id": cl.id, "content": "22 C and sunny"} for cl in calls]
    r2 = client.chat.completions.create(model=NAME, messages=follow, tools=TOOLS, max_tokens=8)
    check(r2.choices[0].message.role == "assistant", "the assistant tool-call message sent back unchanged: 200")
    r = client.chat.completions.create(model=NAME, messages=USER, tools=TOOLS, max_tokens=32, tool_choice="required")
    names = [cl.function.name for cl in (r.choices[0].message.tool_calls or [])]
    check(len(names) >= 1 and names[0] in ("get_weather", "get_time"), f"required tool_choice calls a tool {names}")
    # parallel_tool_calls false: the reply ends as its first call closes (it was ignored: the reply went on)
    kw = dict(model=NAME, messages=USER, tools=TOOLS, max_tokens=200, seed=4, tool_choice="required",
              logit_bias=BAN_END)
    many = client.chat.completions.create(**kw)
    one = client.chat.completions.create(parallel_tool_calls=False, **kw)
    check(one.choices[0].finish_reason == "tool_calls" and len(one.choices[0].message.tool_calls or []) == 1 and
          one.usage.completion_tokens < many.usage.completion_tokens,
          f"parallel_tool_calls false: one call, then the reply ends ({many.usage.completion_tokens} tokens without "
          f"it, {one.usage.completion_tokens} with)")
    r = client.chat.completions.create(model=NAME, messages=USER, tools=TOOLS, max_tokens=8, tool_choice="none",
                                       seed=2)
    r0 = client.chat.completions.create(model=NAME, messages=USER, max_tokens=8, seed=2)
    check(r.usage.prompt_tokens == r0.usage.prompt_tokens, "tool_choice none drops the tools from the prompt")
    stream = client.chat.completions.create(model=NAME, messages=USER, tools=TOOLS, max_tokens=128, seed=11, stream=True,
                                            tool_choice={"type": "function", "function": {"name": "get_time"}})
    first, args, finish, indices = None, "", None, set()
    for ch in stream:
        if not ch.choices:
            continue
        for tc in ch.choices[0].delta.tool_calls or []:
            indices.add(tc.index)
            if tc.id:
                first = tc
            args += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    check(first is not None and first.type == "function" and first.function.name == "get_time" and
          isinstance(json.loads(args), dict) and finish == "tool_calls" and indices == {0},
          "streamed tool call: id, type, name, then argument fragments forming a JSON object")

    print("stop strings")
    base = client.completions.create(model=NAME, prompt="The quick brown fox", max_tokens=40, seed=9,
                                     logit_bias=BAN_END)
    text = base.choices[0].text
    check(base.object == "text_completion" and base.choices[0].finish_reason == "length" and
          base.usage.completion_tokens == 40, "/v1/completions with a string prompt")
    stop = text[12:15] if len(text) >= 15 else text[-2:]
    cut = client.completions.create(model=NAME, prompt="The quick brown fox", max_tokens=40, seed=9,
                                    logit_bias=BAN_END, stop=[stop])
    check(cut.choices[0].text == text[:text.find(stop)] and cut.choices[0].finish_reason == "stop",
          f"stop string {stop!r} cuts the text before it and is not emitted")
    cs = client.chat.completions.create(model=NAME, messages=USER, max_tokens=40, seed=9, stop=["e", "a"],
                                        logit_bias=BAN_END, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    check("e" not in (cs.choices[0].message.content or "") and "a" not in (cs.choices[0].message.content or ""),
          "chat stop strings never reach content")

    print("completions")
    ids = client.completions.create(model=NAME, prompt=[1, 20, 30, 40], max_tokens=5, logit_bias=BAN_END)
    check(ids.usage.prompt_tokens == 4 and ids.usage.completion_tokens == 5, "/v1/completions with token ids")
    sc = list(client.completions.create(model=NAME, prompt="The quick brown fox", max_tokens=40, seed=9,
                                        logit_bias=BAN_END, stream=True))
    check("".join(ch.choices[0].text for ch in sc if ch.choices) == text, "streamed completion equals non-streamed")

    print("logprobs")
    lp = client.chat.completions.create(model=NAME, messages=USER, max_tokens=6, logprobs=True, top_logprobs=3,
                                        logit_bias=BAN_END)
    content = lp.choices[0].logprobs.content
    check(len(content) == 6 and all(len(t.top_logprobs) == 3 and t.logprob <= 0 and
                                    t.top_logprobs[0].logprob >= t.top_logprobs[2].logprob for t in content),
          "logprobs with 3 top_logprobs per token")

    clp = client.completions.create(model=NAME, prompt="Once", max_tokens=5, logprobs=2, logit_bias=BAN_END, seed=7)
    lp = clp.choices[0].logprobs
    # OpenAI: "the API will always return the logprob of the sampled token, so there may be up to logprobs+1
    # elements" (vLLM the same): the sampled token is in each top_logprobs dict (its value may be another
    # token's where two decode to the same text, U+FFFD for partial UTF-8: the dict is keyed by text)
    check(len(lp.tokens) == 5 and len(lp.token_logprobs) == 5 and all(1 <= len(t) <= 3 for t in lp.top_logprobs) and
          all(tok in t for t, tok in zip(lp.top_logprobs, lp.tokens)) and
          lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset), "completions logprobs (tokens, offsets)")

    print("queue full: 503")
    results, barrier = [], threading.Barrier(6)

    def burst():
        barrier.wait()
        results.append(request("POST", chat, {"messages": USER, "max_tokens": 60, "logit_bias": BAN_END})[0])
    threads = [threading.Thread(target=burst) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(503 in results and 200 in results and set(results) <= {200, 503},
          f"--queue 1 with 6 concurrent requests: some 503, the rest 200 ({sorted(results)})")

    print("a client that disconnects mid-stream")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", chat, json.dumps({"messages": USER, "max_tokens": CTX, "stream": True,
                                           "logit_bias": BAN_END}),
                 {"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
    resp = conn.getresponse()
    resp.read1(200)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    r = client.chat.completions.create(model=NAME, messages=USER, max_tokens=4)
    check(r.choices[0].finish_reason in ("stop", "length"), "the next request completes normally")
    time.sleep(0.2)
    lines = [ln for ln in open(log.name).read().splitlines() if "/v1/chat/completions" in ln and "cancelled" in ln]
    m = re.search(r"completion=(\d+)", lines[-1]) if lines else None
    check(m is not None and int(m.group(1)) < CTX - 200 and lines[-1].split()[3] == "499",
          f"the disconnected stream was cancelled early, logged as 499: {lines[-1:]}")
    s, metrics = request("GET", "/metrics")
    check(s == 200 and re.search(r"^lily_requests_cancelled_total [1-9]", metrics, re.M) is not None and
          re.search(r"^lily_completion_tokens_total [1-9]", metrics, re.M) is not None,
          "/metrics counts the cancelled request and the generated tokens")

# ---------------------------------------------------------------------------------------------- shutdown

print("SIGTERM with a stream in flight")
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
conn.request("POST", "/v1/completions", json.dumps({"prompt": "Once", "max_tokens": 300, "stream": True,
                                                   "logit_bias": BAN_END}),
             {"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
resp = conn.getresponse()
first = resp.read1(100)
server.send_signal(signal.SIGTERM)
rest = first + resp.read()
check(rest.rstrip().endswith(b"data: [DONE]") and b"\"finish_reason\":\"length\"" in rest,
      "the stream in flight finishes with [DONE] after SIGTERM")
try:
    rc = server.wait(timeout=30)
except subprocess.TimeoutExpired:
    server.kill()
    rc = "hung"
check(rc == 0, f"the server exits 0 after SIGTERM (rc {rc})")

if failures:
    print("\n--- server log (tail) ---\n" + "".join(open(log.name).readlines()[-40:]))
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all server checks passed")
os.unlink(log.name)
