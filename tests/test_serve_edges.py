"""test_serve_edges.py — `lily serve` where llama.cpp / Ollama / vLLM users trip (run by test_serve_edges.sh).

usage: python test_serve_edges.py <lily-binary> <model-dir>

Raw HTTP only (no SDK), against one server started with --host localhost:
  - localhost listens on 127.0.0.1 and on ::1 (the same port), or says it has no IPv6 loopback;
  - max_tokens that cuts a tool call anywhere in its opening never reports a tool whose name was cut (a
    prefix such as "get_wea"): /v1/chat/completions (tool_choice named and required) and /v1/messages
    (tool and any), whole bodies and streams; every cut reply ends "length" / "max_tokens";
  - the request log's ttft of a reply made only of forced tokens (a named tool call cut inside its opening)
    is the real time to that first token, not 0.0;
  - a stream whose client disconnects is logged (and counted in /metrics) as 499, not 200;
  - seeds: each sampled request's log line says its seed; a request's seed -1 is a random one (as llama.cpp's
    server takes it), and the seed the log gives reproduces that reply; `--seed N` is the seed of a request
    that sets none; `--seed -2` is a usage error.
"""
import http.client
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

LILY, MODEL = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    print(("  ok   " if cond else "  FAIL ") + what)
    if not cond:
        failures.append(what)


def start(*extra, host="localhost"):
    log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log", delete=False)
    p = subprocess.Popen([LILY, "serve", "-m", MODEL, "--host", host, "--port", "0", "--threads", "1",
                          "--ctx-size", "1024", "--precision", "exact", *extra],
                         stdout=subprocess.DEVNULL, stderr=log)
    port = None
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None:
        m = re.search(r"ready on http://\S+:(\d+)", open(log.name).read())
        if m:
            port = int(m.group(1))
            break
        time.sleep(0.05)
    if port is None:
        p.kill()
        print(open(log.name).read())
        sys.exit("lily serve did not start")
    return p, port, log.name


def stop(p):
    p.terminate()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def post(port, path, body, host="127.0.0.1"):
    req = urllib.request.Request(f"http://{host}:{port}{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "anthropic-version": "2023-06-01"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            text = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    if body.get("stream"):
        return status, text
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def get(port, path, host="127.0.0.1"):
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=30) as r:
            return r.status, r.read().decode()
    except (urllib.error.URLError, OSError) as e:  # refused: nothing listens there
        return 0, str(e)


def log_lines(path, route):
    return [ln for ln in open(path).read().splitlines() if f" POST {route} " in ln]


def wait_lines(path, route, n):
    """The log's lines for route once there are n of them (the line is written as the connection ends)."""
    for _ in range(100):
        lines = log_lines(path, route)
        if len(lines) >= n:
            return lines
        time.sleep(0.05)
    return log_lines(path, route)


def ipv6_loopback():
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.bind(("::1", 0))
        s.close()
        return True
    except OSError:
        return False


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
          "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
          "type": "object", "properties": {"city": {"type": "string"}}}}}]
NAMES = {t["function"]["name"] for t in TOOLS}
ATOOLS = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

server, port, log = start()
startup = open(log).read()
try:
    print("--host localhost: both loopbacks")
    s, body = get(port, "/health", "127.0.0.1")
    check(s == 200, "localhost: 127.0.0.1 answers")
    if ipv6_loopback():
        s, body = get(port, "/health", "[::1]")
        check(s == 200 and "(127.0.0.1 and ::1)" in startup, "localhost: ::1 answers on the same port")
    else:
        check("(127.0.0.1 only: this machine has no IPv6 loopback)" in startup,
              "localhost without an IPv6 loopback: 127.0.0.1 alone, said at startup")

    print("a tool call cut by max_tokens never names a tool that does not exist")
    s, tok = post(port, "/tokenize", {"content": "<tool_call>\n<function=get_weather>\n"})
    n_open = len(tok["tokens"]) + 8  # the opening, and a closed think block before it, with room to spare
    chat_choices = [{"type": "function", "function": {"name": "get_weather"}}, "required"]
    anth_choices = [{"type": "tool", "name": "get_weather"}, {"type": "any"}]
    bad, calls_seen, finishes = [], 0, set()
    for n in range(1, n_open + 1):
        for choice in chat_choices:
            req = {"messages": ASK, "tools": TOOLS, "tool_choice": choice, "max_tokens": n, "temperature": 0}
            s, r = post(port, "/v1/chat/completions", req)
            c = r["choices"][0]
            names = [tc["function"]["name"] for tc in c["message"].get("tool_calls") or []]
            finishes.add(c["finish_reason"])
            calls_seen += bool(names)
            if s != 200 or set(names) - NAMES or "<" in (c["message"]["content"] or ""):
                bad.append(("chat", n, choice, c))
            s, text = post(port, "/v1/chat/completions", dict(req, stream=True))
            chunks = [json.loads(ln[6:]) for ln in text.splitlines() if ln.startswith("data: {")]
            snames = [tc["function"]["name"] for ch in chunks if ch["choices"]
                      for tc in ch["choices"][0]["delta"].get("tool_calls") or [] if "name" in tc.get("function", {})]
            sfin = [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"] and ch["choices"][0]["finish_reason"]]
            if s != 200 or set(snames) - NAMES or snames != names or sfin != [c["finish_reason"]]:
                bad.append(("chat stream", n, choice, snames, sfin))
        for choice in anth_choices:
            req = {"model": "x", "messages": ASK, "tools": ATOOLS, "tool_choice": choice, "max_tokens": n,
                   "temperature": 0}
            s, m = post(port, "/v1/messages", req)
            names = [b["name"] for b in m["content"] if b["type"] == "tool_use"]
            if s != 200 or set(names) - NAMES or any("<" in b.get("text", "") for b in m["content"]):
                bad.append(("messages", n, choice, m))
            finishes.add(m["stop_reason"])
            s, text = post(port, "/v1/messages", dict(req, stream=True))
            events = [json.loads(ln[6:]) for ln in text.splitlines() if ln.startswith("data: {")]
            snames = [e["content_block"]["name"] for e in events
                      if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"]
            stops = [e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta"]
            if s != 200 or set(snames) - NAMES or snames != names or stops != [m["stop_reason"]]:
                bad.append(("messages stream", n, choice, snames, stops))
    check(not bad, f"max_tokens 1..{n_open} through a forced call's opening: every tool named is a real one, no "
                   f"markup in content, streams agree ({bad[:2]})")
    check(calls_seen > 0 and finishes == {"length", "max_tokens"},
          f"... the longest hold a whole call, every one ends 'length' / 'max_tokens' ({sorted(finishes)}, "
          f"{calls_seen} with a call)")

    print("the request log's ttft of a reply made only of forced tokens")
    before = len(log_lines(log, "/v1/chat/completions"))
    t0 = time.time()
    s, r = post(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Weather in Oslo?"}],
                                                "tools": TOOLS, "tool_choice": chat_choices[0], "max_tokens": 5})
    took_ms = 1e3 * (time.time() - t0)
    line = (wait_lines(log, "/v1/chat/completions", before + 1)[before:] or [""])[0]
    m = re.search(r" completion=(\d+) .* ttft=([0-9.]+) ms", line)
    check(s == 200 and m is not None and m.group(1) == "5" and 0 < float(m.group(2)) <= took_ms,
          f"a forced opening cut at 5 tokens: ttft > 0 and within the request's {took_ms:.1f} ms ({line[20:140]})")

    print("a stream its client leaves is 499")
    s, tok = post(port, "/tokenize", {"content": "<|im_end|><|endoftext|>"})
    ban_end = {str(i): -100 for i in tok["tokens"]}
    before = len(log_lines(log, "/v1/chat/completions"))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/chat/completions", json.dumps({"messages": ASK, "max_tokens": 900, "stream": True,
                                                             "logit_bias": ban_end}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.read1(200)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    s, r = post(port, "/v1/chat/completions", {"messages": ASK, "max_tokens": 3, "stream": True})
    lines = wait_lines(log, "/v1/chat/completions", before + 2)[before:]
    left = [ln for ln in lines if "cancelled" in ln]
    fields = left[0].split() if left else []
    check(len(left) == 1 and fields[1:4] == ["POST", "/v1/chat/completions", "499"] and
          int(re.search(r"completion=(\d+)", left[0]).group(1)) < 900,
          f"the disconnected stream's log line: 499 ... cancelled ({left[:1]})")
    done = [ln for ln in lines if "cancelled" not in ln]
    check(len(done) == 1 and done[0].split()[3] == "200", f"the stream read to its end: 200 ({done[:1]})")
    s, metrics = get(port, "/metrics")
    check(re.search(r'^lily_requests_total\{status="499"\} [1-9]', metrics, re.M) is not None and
          re.search(r"^lily_requests_cancelled_total [1-9]", metrics, re.M) is not None,
          "/metrics counts it as 499 and as cancelled")

    print("seeds")
    before = len(log_lines(log, "/v1/completions"))
    req = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.5, "logit_bias": ban_end}
    replies = [post(port, "/v1/completions", dict(req, seed=-1))[1]["choices"][0]["text"] for _ in range(3)]
    lines = wait_lines(log, "/v1/completions", before + 3)[before:]
    seeds = [int(m.group(1)) for ln in lines for m in [re.search(r" seed=(\d+)", ln)] if m]
    check(len(seeds) == 3 and len(set(seeds)) == 3 and max(seeds) < 2 ** 63 and len(set(replies)) > 1,
          f"seed -1: a random seed per request, said in the log ({seeds}; {replies})")
    again = post(port, "/v1/completions", dict(req, seed=seeds[1]))[1]["choices"][0]["text"] if seeds else None
    check(again == replies[1], "the seed the log gives draws that reply again")
finally:
    stop(server)

server, port, log = start("--seed", "7", host="127.0.0.1")
try:
    req = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.5}
    a = post(port, "/v1/completions", req)[1]["choices"][0]["text"]
    b = post(port, "/v1/completions", req)[1]["choices"][0]["text"]
    c = post(port, "/v1/completions", dict(req, seed=7))[1]["choices"][0]["text"]
    post(port, "/v1/completions", dict(req, seed=-1))
    lines = wait_lines(log, "/v1/completions", 4)
    seeds = [re.search(r" seed=(\d+)", ln).group(1) for ln in lines]
    check(a == b == c and seeds[:3] == ["7", "7", "7"] and seeds[3] != "7",
          f"--seed 7: the seed of requests that set none; a request's -1 is still random ({seeds})")
finally:
    stop(server)

r = subprocess.run([LILY, "serve", "-m", MODEL, "--port", "0", "--seed", "-2"], capture_output=True, text=True,
                   timeout=30)
check(r.returncode == 2 and "--seed expects a non-negative integer, or -1 for a random seed" in r.stderr,
      f"serve --seed -2 is a usage error ({r.stderr.strip()[:120]})")

print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
