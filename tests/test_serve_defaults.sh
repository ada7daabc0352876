#!/usr/bin/env bash
# test_serve_defaults.sh — `lily serve` options that set defaults for what a request leaves out, and the
# smaller conveniences of the first minutes (tiny-chat model, loopback only):
#   - --temp 0: two requests without temperature give the same reply; a request's own temperature + seed
#     overrides it (two seeds, two replies);
#   - --reasoning-budget N: reasoning_content stops and content follows (lily closes the think block);
#   - --no-think / --reasoning off: no reasoning_content; a request's enable_thinking true wins;
#   - --top-p 0: greedy whatever the request's temperature and seed (as run's --top-p 0); a request's top_p wins;
#   - -n N caps chat replies without max_tokens; a request's max_tokens wins;
#   - /v1/completions without max_tokens stops at 16 tokens (OpenAI's default);
#   - GET /v1/models/{id}: 200 with the model object, 404 model_not_found for another id;
#   - GET / serves the chat page (HTML that posts to /v1/chat/completions);
#   - a model directory without generation_config.json samples with Qwen's recommendation (a seeded request
#     without sampling fields equals one that sends temperature 1, top_p 0.95, top_k 20, min_p 0, and
#     differs from one with top_k off), and the request log line names the decode path;
#   - --host-sampler: every request on the host sampler (the log says it was asked for), the same seeded reply;
#   - a port already taken: "cannot listen" and exit 1 before the model loads (nothing of the load logged);
#   - --host 0.0.0.0 without --api-key: a warning (none with a key, none on loopback).
# usage: bash test_serve_defaults.sh <path-to-lily> <tests/data dir>
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"
lily_test_init "$@"
lily_python "$LILY"
exec "$PY" - "$LILY" "$DATA/tiny-chat" "$TMP" "$(dirname "$0")/lib" <<'PY'
import http.client, json, os, re, shutil, subprocess, sys, time
lily, model, tmp = sys.argv[1:4]
sys.path.insert(0, sys.argv[4])
from lily_test import Tally, start_server
t = Tally()
check = t.check

def start(*args):
    return start_server(lily, model, os.path.join(tmp, "serve.log"), *args)

def wait_log(path, pattern, seconds=10.0):
    """Whether the server's log shows pattern within seconds (the request log line is written after the
    reply has been sent, so a client can read the log before it is there)."""
    end = time.time() + seconds
    while True:
        if re.search(pattern, open(path).read()):
            return True
        if time.time() > end:
            return False
        time.sleep(0.05)

def req(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request(method, path, json.dumps(body) if body is not None else None, {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    ctype = r.getheader("Content-Type") or ""
    c.close()
    return r.status, (json.loads(data) if ctype.startswith("application/json") else data.decode())

def chat(port, **kw):
    body = {"messages": [{"role": "user", "content": "Tell me about Python lists."}]}
    body.update(kw)
    st, j = req(port, "POST", "/v1/chat/completions", body)
    assert st == 200, j
    return j["choices"][0], j["usage"]

NO_STOP = {"0": -100, "2": -100}  # tiny-chat's stop ids: keep generating to the cap
# ... and its <think> / </think> ids: a sampled reply of the random model emits one ~3% of the time, which
# opens or closes a think block whatever the server's defaults
NO_STOP_NO_TAGS = dict(NO_STOP, **{"3": -100, "4": -100})

p, port = start("--temp", "0", "--reasoning-budget", "6", "-n", "40")
try:
    a, ua = chat(port)
    b, ub = chat(port)
    check(a["message"] == b["message"], "--temp 0: the same reply twice without a request temperature")
    s1, _ = chat(port, temperature=1.5, seed=1, max_tokens=12)
    s2, _ = chat(port, temperature=1.5, seed=2, max_tokens=12)
    check(s1["message"] != s2["message"], "a request's temperature + seed overrides --temp 0")
    c, uc = chat(port, logit_bias=NO_STOP)
    m = c["message"]
    check(bool(m.get("reasoning_content")) and bool(m.get("content")),
          "--reasoning-budget 6: reasoning, then an answer after lily closed the think block")
    c6, _ = chat(port, logit_bias=NO_STOP, max_tokens=6)
    check(c6["message"]["reasoning_content"].strip() == m["reasoning_content"].strip() and not c6["message"].get("content"),
          "the reasoning stopped after exactly 6 tokens (it equals a reply cut at max_tokens 6)")
    check(uc["completion_tokens"] == 40 and c["finish_reason"] == "length", "-n 40 caps a reply without max_tokens")
    d, ud = chat(port, logit_bias=NO_STOP, max_tokens=9)
    check(ud["completion_tokens"] == 9, "a request's max_tokens overrides -n")
    st, j = req(port, "POST", "/v1/completions", {"prompt": "The list type", "logit_bias": NO_STOP})
    check(st == 200 and j["usage"]["completion_tokens"] == 40, "-n also sets completions' default")
    st, j = req(port, "GET", "/v1/models/tiny-chat")
    check(st == 200 and j["id"] == "tiny-chat" and j["object"] == "model", "GET /v1/models/{id} answers the model")
    st, j = req(port, "GET", "/v1/models/gpt-4o")
    check(st == 404 and j["error"]["code"] == "model_not_found", "GET /v1/models/{other id}: 404 model_not_found")
    st, page = req(port, "GET", "/")
    check(st == 200 and "<html" in page and "/v1/chat/completions" in page, "GET / serves the chat page")
finally:
    p.terminate(); p.wait()

p, port = start("--no-think")
try:
    a, _ = chat(port, max_tokens=8, logit_bias=NO_STOP_NO_TAGS)
    check(not a["message"].get("reasoning_content"), "--no-think: no reasoning_content")
    b, _ = chat(port, max_tokens=8, logit_bias=NO_STOP, chat_template_kwargs={"enable_thinking": True})
    check(bool(b["message"].get("reasoning_content")), "a request's enable_thinking true overrides --no-think")
    st, j = req(port, "POST", "/v1/completions", {"prompt": "The list type", "logit_bias": NO_STOP})
    check(st == 200 and j["usage"]["completion_tokens"] == 16 and j["choices"][0]["finish_reason"] == "length",
          "/v1/completions without max_tokens: 16 tokens, as OpenAI")
finally:
    p.terminate(); p.wait()

p, port = start("--reasoning", "off", "--top-p", "0")
try:
    a, _ = chat(port, max_tokens=8, logit_bias=NO_STOP_NO_TAGS)
    check(not a["message"].get("reasoning_content"), "--reasoning off: no reasoning_content")
    # --top-p 0 (as run's, and a request's top_p 0): greedy whatever the temperature and seed; a request's
    # own top_p wins
    s1, _ = chat(port, max_tokens=12, temperature=1.5, seed=1, logit_bias=NO_STOP)
    s2, _ = chat(port, max_tokens=12, temperature=1.5, seed=2, logit_bias=NO_STOP)
    g, _ = chat(port, max_tokens=12, temperature=0, logit_bias=NO_STOP)
    check(s1["message"] == s2["message"] == g["message"], "--top-p 0: the greedy reply whatever the seed")
    o1, _ = chat(port, max_tokens=12, temperature=1.5, top_p=1, seed=1, logit_bias=NO_STOP)
    o2, _ = chat(port, max_tokens=12, temperature=1.5, top_p=1, seed=2, logit_bias=NO_STOP)
    check(o1["message"] != o2["message"], "a request's top_p 1 overrides --top-p 0 (two seeds, two replies)")
finally:
    p.terminate(); p.wait()

# no generation_config.json: Qwen's recommended sampling; the log line says which decode path ran
bare = os.path.join(tmp, "no-genconfig")
shutil.copytree(model, bare)
os.remove(os.path.join(bare, "generation_config.json"))
p, port = start_server(lily, bare, os.path.join(tmp, "bare.log"))
try:
    ask = dict(max_tokens=24, seed=7, logit_bias=NO_STOP)
    d, _ = chat(port, **ask)
    q, _ = chat(port, temperature=1.0, top_p=0.95, top_k=20, min_p=0.0, **ask)
    o, _ = chat(port, temperature=1.0, top_p=1.0, top_k=0, **ask)
    check(d["message"] == q["message"], "no generation_config.json: the defaults are temperature 1, top_p 0.95, top_k 20")
    check(d["message"] != o["message"], "... and not top-k off / top-p 1 (the sampler's own defaults)")
    check(wait_log(os.path.join(tmp, "bare.log"), r'decode_path="host sampler \(the backend has no device loop\)"'),
          "the request log line names the decode path and why")
finally:
    p.terminate(); p.wait()

# --host-sampler: every request on the host sampler, as the request log says (it was parsed and ignored)
p, port = start_server(lily, bare, os.path.join(tmp, "host.log"), "--host-sampler")
try:
    h, _ = chat(port, **ask)
    check(h["message"] == d["message"], "--host-sampler: the same seeded reply")
    check(wait_log(os.path.join(tmp, "host.log"), r'decode_path="host sampler \(asked for\)"'),
          "--host-sampler: the request log says the host sampler was asked for")
finally:
    p.terminate(); p.wait()

# a generation_config.json without sampling fields (tiny-chat's own): each missing field takes Qwen's value,
# as `lily run` does; do_sample false: greedy
p, port = start()
try:
    ask = dict(max_tokens=24, seed=7, logit_bias=NO_STOP)
    d, _ = chat(port, **ask)
    q, _ = chat(port, temperature=1.0, top_p=0.95, top_k=20, min_p=0.0, **ask)
    check(d["message"] == q["message"], "generation_config.json without sampling fields: Qwen's values per field")
finally:
    p.terminate(); p.wait()
greedy_dir = os.path.join(tmp, "do-sample-false")
shutil.copytree(model, greedy_dir)
with open(os.path.join(greedy_dir, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": [2, 0], "max_new_tokens": 128, "do_sample": False, "temperature": 0.7}, f)
p, port = start_server(lily, greedy_dir, os.path.join(tmp, "greedy.log"))
try:
    a, _ = chat(port, max_tokens=16, seed=1, logit_bias=NO_STOP)
    b, _ = chat(port, max_tokens=16, seed=2, logit_bias=NO_STOP)
    g, _ = chat(port, max_tokens=16, temperature=0, logit_bias=NO_STOP)
    check(a["message"] == b["message"] == g["message"], "do_sample false: greedy whatever the seed")
finally:
    p.terminate(); p.wait()

# a forced tool call after a prompt that opened a think block closes the block first (well-formed history)
p, port = start()
try:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        c, u = chat(port, max_tokens=60, seed=3, logprobs=True, tools=tools, tool_choice=choice,
                    chat_template_kwargs={"enable_thinking": True})
        raw = "".join(t["token"] for t in c["logprobs"]["content"])
        check(raw.startswith("\n</think>\n\n<tool_call>\n<function=get_weather>") and not c["message"].get("content")
              and c["message"]["tool_calls"][0]["function"]["name"] == "get_weather",
              f"tool_choice {choice if isinstance(choice, str) else 'named'} with thinking on: the think block "
              "closes before the forced call")
finally:
    p.terminate(); p.wait()

r = subprocess.run([lily, "serve", "--reasoning", "maybe"], capture_output=True, text=True)
check(r.returncode == 2 and "--reasoning expects on or off" in r.stderr, "--reasoning maybe: usage error")

# a port already taken: the server says so and exits before it loads the model (no prefix cache line, no
# warm-up: nothing of the load is printed after "cannot listen")
import socket
taken = socket.socket()
taken.bind(("127.0.0.1", 0))
taken.listen(1)
r = subprocess.run([lily, "serve", "-m", model, "--port", str(taken.getsockname()[1]), "--threads", "1"],
                   capture_output=True, text=True, timeout=120)
taken.close()
check(r.returncode == 1 and "cannot listen on 127.0.0.1:" in r.stderr and "prefix cache" not in r.stderr
      and "loading model" not in r.stderr,
      f"a taken port: 'cannot listen' and exit 1, before the model loads ({r.stderr.strip()!r})")
# every interface without a key: a warning that anyone who can reach the address can use the model; with a
# key, or on loopback (the servers above), none
def listen_all(*extra):
    log = os.path.join(tmp, "all.log")
    with open(log, "w") as f:
        q = subprocess.Popen([lily, "serve", "-m", model, "--host", "0.0.0.0", "--port", "0", "--threads", "1", *extra],
                             stdout=subprocess.DEVNULL, stderr=f)
    try:
        end = time.time() + 60
        while time.time() < end and q.poll() is None and "ready on http://" not in open(log).read():
            time.sleep(0.05)
        return open(log).read()
    finally:
        q.terminate(); q.wait()
out = listen_all()
check("warning: 0.0.0.0 is reachable from other machines and no --api-key is set" in out,
      f"--host 0.0.0.0 without a key: a warning ({out.strip()[-300:]!r})")
out = listen_all("--api-key", "k")
check("ready on http://0.0.0.0:" in out and "warning" not in out, "--host 0.0.0.0 with --api-key: no warning")
check("warning" not in open(os.path.join(tmp, "host.log")).read(), "127.0.0.1 without a key: no warning")
sys.exit(t.finish())
PY
