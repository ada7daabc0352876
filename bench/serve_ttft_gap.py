"""serve_ttft_gap.py — where a streamed request's time to first token goes between `lily serve` and its client.

usage: python3 bench/serve_ttft_gap.py LILY MODEL_DIR [N] [--backend cuda]

Starts `lily serve`, then for N different ~300-word prompts each: a cold request on a kept-alive connection,
a cold request on a fresh urllib connection (connect, a new server thread), and a request restoring a prompt
just prefilled; 16-token greedy streamed replies. For each kind it prints medians of the client's TTFT (from
just before the request is sent to the first chunk with generated text parsed) and of the server log's
numbers for the same request: ttft (arrival to the first token sampled), first_byte (arrival to that text
handed to the socket), held (the first token's text waiting for later tokens) and handoff (the worker's write
to the connection thread), with how many requests had text held over 0.3 ms, and client TTFT - first_byte
(the client's side: sending the request, reading the chunk). Stdlib only.
"""
import http.client
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

args = sys.argv[1:]
if len(args) < 2:
    sys.exit(__doc__)
LILY, MODEL = args[0], args[1]
N = int(args[2]) if len(args) > 2 and not args[2].startswith("--") else 15
backend = args[args.index("--backend") + 1] if "--backend" in args else "cpu"
WORDS = "alpha kernel memory bandwidth river stone cloud matrix token engine green quiet signal paper window".split()

log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log", delete=False)
srv = subprocess.Popen([LILY, "serve", "-m", MODEL, "--port", "0", "--backend", backend], stdout=subprocess.DEVNULL,
                       stderr=log)


def one(port, conn, content):
    """(client TTFT, server ttft, first_byte, held, handoff) in ms; conn None: a fresh urllib connection."""
    body = json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": 16, "stream": True,
                       "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}}).encode()
    n0 = sum(1 for ln in open(log.name) if "POST /v1/chat" in ln)
    t0 = time.monotonic()
    if conn is None:
        f = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                                          {"Content-Type": "application/json"}), timeout=900)
    else:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        f = conn.getresponse()
    first = None
    while True:
        line = f.readline()
        if not line or line.startswith(b"data: [DONE]"):
            break
        if first is None and re.search(rb'"(content|reasoning_content)":"[^"]', line):
            first = time.monotonic()
    f.read()
    for _ in range(500):  # the log line is written as the request completes
        lines = [ln for ln in open(log.name) if "POST /v1/chat" in ln]
        if len(lines) > n0:
            break
        time.sleep(0.01)
    num = lambda p: float(re.search(p, lines[-1]).group(1))
    return (1e3 * (first - t0), num(r" ttft=([0-9.]+)"), num(r"first_byte=([0-9.]+)"), num(r"held ([0-9.]+)"),
            num(r"handoff ([0-9.]+)"))


try:
    port = None
    while port is None and srv.poll() is None:
        time.sleep(0.2)
        m = re.search(r"ready on http://127\.0\.0\.1:(\d+)", open(log.name).read())
        port = m and int(m.group(1))
    if port is None:
        sys.exit("lily serve did not start:\n" + open(log.name).read())
    conn, used = None, 0.0
    rng = random.Random(5)
    print("| requests | client TTFT | server ttft | first_byte | held (n > 0.3 ms) | handoff | client - first_byte |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind in ("cold, kept-alive connection", "cold, fresh connection", "restored, kept-alive connection"):
        rows = []
        for _ in range(N):
            p = " ".join(rng.choice(WORDS) for _ in range(300))
            if "kept" in kind and (conn is None or time.time() - used > 5):  # within the server's idle timeout
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
                conn.connect()
            if kind.startswith("restored"):
                one(port, conn, p)
            rows.append(one(port, None if "fresh" in kind else conn, p))
            used = time.time()
        med = [statistics.median(c) for c in zip(*rows)]
        n_held = sum(1 for r in rows if r[3] > 0.3)
        gap = statistics.median(r[0] - r[2] for r in rows)
        print(f"| {kind} (median of {N}) | {med[0]:.2f} | {med[1]:.2f} | {med[2]:.2f} | {med[3]:.2f} ({n_held}) | "
              f"{med[4]:.2f} | {gap:.2f} |")
finally:
    srv.terminate()
    srv.wait(timeout=60)
