"""serve_speed.py — what a client of `lily serve` sees: time to first token and decode tok/s per request shape.

usage: python3 bench/serve_speed.py LILY MODEL_DIR [--backend cuda] [--depths 4096,32768] [--tokens 256]
                                    [--rounds 2] [--serve-arg ARG]...

Starts `lily serve` on a free loopback port and, for each prompt depth (a one-message chat of about that many
tokens, sized through /tokenize), measures at the client with streamed requests:
  * cold prefill: a prompt no checkpoint holds; TTFT and prompt tokens / TTFT — on a kept-alive connection
    (as the SDKs' connection pools send), and on a fresh connection per request (urllib: connect, a new
    server thread, "Connection: close");
  * decode per sampling shape (the same prompt again, so its prefill is a checkpoint restore): greedy;
    Qwen's thinking settings (temperature 1.0, top_p 0.95, top_k 20, presence_penalty 1.5); the OpenAI SDK's
    defaults (temperature 1, top_p 1); logprobs with top_logprobs 5; a stop string; logit_bias; a json_schema
    response_format and a forced tool call (grammar-constrained: the mask computed on the host per step); each as
    (completion tokens - 1) / (last token time - first token time), usage from stream_options;
  * turn 2: the conversation + the reply + a new user message (TTFT).
TTFT is from just before the request is sent to the first chunk with generated text (content, reasoning or a
tool call) parsed. Beside it, the server's own log line: `ttft` (request arrival to the first token sampled)
and `first_byte` (arrival to that token's text handed to the socket): client TTFT - server first_byte is the
client's side (sending the request, reading the chunk); first_byte - ttft is lily's HTTP path (the log line
splits it into text held for later tokens and the hand-off between threads).
Prints one markdown table per depth with the server's log numbers beside. Stdlib only (the GPU machine has no
PyPI). `--serve-arg --cache-vram --serve-arg 0` measures turn 2 from host memory.
"""
import http.client
import json
import random
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

args = sys.argv[1:]
if len(args) < 2:
    sys.exit(__doc__)
LILY, MODEL = args[0], args[1]
backend, depths, n_tokens, rounds, serve_args = "cpu", [4096], 256, 2, []
i = 2
while i < len(args):
    k, v = args[i], args[i + 1]
    if k == "--backend": backend = v
    elif k == "--depths": depths = [int(x) for x in v.split(",")]
    elif k == "--tokens": n_tokens = int(v)
    elif k == "--rounds": rounds = int(v)
    elif k == "--serve-arg": serve_args.append(v)
    else: sys.exit(f"unknown option {k}\n" + __doc__)
    i += 2

WORDS = ("alpha kernel memory bandwidth river stone cloud matrix token engine green quiet signal paper window "
         "orange number thread castle forest lamp ocean silver delta").split()
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 400},
                                           "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 40}},
          "required": ["name", "tags"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["query"]}}}
SHAPES = [
    ("greedy", {"temperature": 0}),
    ("Qwen thinking: temperature 1.0, top_p 0.95, top_k 20, presence_penalty 1.5",
     {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "presence_penalty": 1.5}),
    ("OpenAI SDK defaults: temperature 1, top_p 1", {"temperature": 1.0, "top_p": 1.0}),
    ("greedy + logprobs, top_logprobs 5", {"temperature": 0, "logprobs": True, "top_logprobs": 5}),
    ("greedy + a stop string", {"temperature": 0, "stop": ["QZXJV"]}),
    ("temperature 0.7 + logit_bias", {"temperature": 0.7, "logit_bias": {"15": -100, "16": 5}}),
    ("greedy + json_schema", {"temperature": 0, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}}),
    ("greedy + forced tool call", {"temperature": 0, "tools": [TOOL],
                                   "tool_choice": {"type": "function", "function": {"name": "search"}}}),
]


def post(port, path, body):
    r = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                               {"Content-Type": "application/json"})
    return urllib.request.urlopen(r, timeout=900)


class KeptAlive:
    """One HTTP/1.1 connection reused across requests (http.client sets TCP_NODELAY), opened again before a
    request when it sat idle for longer than the server's idle timeout may allow."""
    def __init__(self, port):
        self.port, self.conn, self.used = port, None, 0.0

    def post(self, path, data):
        for attempt in (0, 1):  # a connection the server closed meanwhile: once more on a new one
            if attempt or self.conn is None or time.time() - self.used > 5:
                if self.conn:
                    self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=900)
                self.conn.connect()
            try:
                self.conn.request("POST", path, data, {"Content-Type": "application/json"})
                return self.conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionError):
                if attempt:
                    raise

    def done(self):
        self.used = time.time()


def stream(port, messages, max_tokens, extra, conn=None):
    """A streamed chat request on `conn` (a KeptAlive), or on a fresh urllib connection when None."""
    body = {"messages": messages, "max_tokens": max_tokens, "stream": True, "seed": 1,
            "stream_options": {"include_usage": True}, "chat_template_kwargs": {"enable_thinking": False}}
    body.update(extra)
    data = json.dumps(body).encode()
    first = last = None
    usage, text = {}, ""
    t0 = time.time()
    if conn is None:
        f = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data,
                                                          {"Content-Type": "application/json"}), timeout=900)
    else:
        f = conn.post("/v1/chat/completions", data)
    with f:
        while True:
            line = f.readline()
            if not line:
                break
            line = line.decode()
            if not line.startswith("data: ") or line.startswith("data: [DONE]"):
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                usage = d["usage"]
            for c in d.get("choices", []):
                delta = c.get("delta") or {}
                piece = delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls")
                if piece:
                    now = time.time()
                    first = first or now
                    last = now
                    text += piece if isinstance(piece, str) else ""
            if line.startswith("data: [DONE]"):
                break
        f.read()  # the chunked body's end, so that the connection can carry the next request
    if conn is not None:
        conn.done()
    ttft = (first - t0) if first else float("nan")
    n = usage.get("completion_tokens", 0)
    tok_s = (n - 1) / (last - first) if first and last and last > first and n > 1 else float("nan")
    return ttft, tok_s, n, usage.get("prompt_tokens", 0), text


def prompt_of(port, n_target, seed):
    rng = random.Random(seed)
    sample = " ".join(rng.choice(WORDS) for _ in range(2000))
    with post(port, "/tokenize", {"content": sample}) as f:
        per_word = len(json.load(f)["tokens"]) / 2000
    return " ".join(rng.choice(WORDS) for _ in range(int((n_target - 30) / per_word)))


log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log", delete=False)
srv = subprocess.Popen([LILY, "serve", "-m", MODEL, "--port", "0", "--backend", backend] + serve_args,
                       stdout=subprocess.DEVNULL, stderr=log)


def log_lines(since):
    return open(log.name).read()[since:]


def server_numbers(text):
    m = re.findall(r"prefill=([0-9.]+) tok/s decode=([0-9.]+) tok/s(?: ttft=([0-9.]+) ms)?", text)
    return m[-1] if m else ("", "", "")


def server_first(text):
    """The last log line's 'ttft / first_byte' in ms ('' when the line has none)."""
    lines = [l for l in text.splitlines() if " ttft=" in l]
    if not lines:
        return ""
    t = re.search(r" ttft=([0-9.]+) ms", lines[-1])
    b = re.search(r" first_byte=([0-9.]+) ms", lines[-1])
    return f"{t.group(1)} / {b.group(1) if b else '-'}"


cold_logs = []
try:
    port, deadline = None, time.time() + 600
    while port is None and time.time() < deadline and srv.poll() is None:
        time.sleep(0.2)
        m = re.search(r"ready on http://127\.0\.0\.1:(\d+)", open(log.name).read())
        port = m.group(1) if m else None
    if port is None:
        sys.exit("lily serve did not start:\n" + open(log.name).read())
    print("".join(l for l in open(log.name) if "plan" in l or "prefix cache" in l))
    conn = KeptAlive(port)
    for depth in depths:
        print(f"\n### depth ~{depth} tokens ({backend}; {n_tokens}-token replies; best of {rounds})\n")
        print("| request | client TTFT ms | client decode tok/s | server prefill tok/s | server decode tok/s "
              "| server ttft / first byte ms |")
        print("|---|---:|---:|---:|---:|---:|")
        msgs = None
        for fresh in (False, True):  # a prompt no checkpoint holds, on the kept connection, then on a fresh one
            best = None
            for r in range(rounds):
                m = [{"role": "user", "content": prompt_of(port, depth, 1000 * depth + 100 * fresh + r)}]
                at = len(open(log.name).read())
                ttft, _, _, n_prompt, _ = stream(port, m, 4, {"temperature": 0}, None if fresh else conn)
                time.sleep(0.1)
                text = log_lines(at)
                srv_pf, _, _ = server_numbers(text)
                if best is None or ttft < best[0]:
                    best = (ttft, n_prompt, srv_pf, m, [l for l in text.splitlines() if "ttft=" in l],
                            server_first(text))
            ttft, n_prompt, srv_pf, m, cold_log, first = best
            msgs = msgs or m
            cold_logs.extend(cold_log)
            how = "a fresh connection (urllib)" if fresh else "kept-alive connection"
            print(f"| cold prefill, {n_prompt} prompt tokens, {how} | {1e3 * ttft:.1f} ({n_prompt / ttft:,.0f} "
                  f"tok/s) | | {srv_pf} | | {first} |")
        reply = ""
        for name, extra in SHAPES:
            rows = []
            for _ in range(rounds):
                at = len(open(log.name).read())
                ttft, tok_s, n, _, text = stream(port, msgs, n_tokens, extra, conn)
                time.sleep(0.1)
                rows.append((tok_s, ttft, n, server_numbers(log_lines(at)), server_first(log_lines(at))))
                reply = reply or text
            tok_s, ttft, n, (_, srv_dec, _), first = max(rows, key=lambda x: x[0] if x[0] == x[0] else -1)
            print(f"| {name} ({n} tokens) | {1e3 * ttft:.1f} | {tok_s:.1f} | | {srv_dec} | {first} |")
        turn2 = msgs + [{"role": "assistant", "content": reply}, {"role": "user", "content": "Go on."}]
        at = len(open(log.name).read())
        ttft, _, _, n_prompt, _ = stream(port, turn2, 8, {"temperature": 0}, conn)
        time.sleep(0.1)
        print(f"| turn 2 ({n_prompt} prompt tokens) | {1e3 * ttft:.1f} | | | | {server_first(log_lines(at))} |")
        sys.stdout.flush()
    print("\nserver log: the cold prefills' lines, the structured requests' decode paths, then the last lines:\n" +
          "".join(l + "\n" for l in cold_logs) +
          "".join(sorted(set(l for l in open(log.name) if "structured output decoded" in l))) +
          "".join(open(log.name).readlines()[-10:]))
finally:
    srv.terminate()
    srv.wait(timeout=60)
