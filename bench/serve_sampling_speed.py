"""serve_sampling_speed.py — decode speed through `lily serve` as a client sees it, per request shape.

usage: python3 bench/serve_sampling_speed.py LILY MODEL_DIR [--backend cuda] [--tokens 256] [--rounds 3]

Starts `lily serve` on a free loopback port, sends the same chat prompt with each request shape below
(greedy, Qwen's recommended sampling, a json_schema response_format, a forced tool call), and prints, per
shape, the server's own decode tok/s (from its request log) and the client's tokens / wall seconds. Stdlib
only (it runs on the GPU machine, which has no PyPI). Stops the server when done.
"""
import json
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
opt = dict(zip(args[2::2], args[3::2]))
backend = opt.get("--backend", "cpu")
n_tokens = int(opt.get("--tokens", "256"))
rounds = int(opt.get("--rounds", "3"))

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 400},
                                           "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 40}},
          "required": ["name", "tags"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["query"]}}}
BASE = {"messages": [{"role": "user", "content": "Describe the Python interpreter in detail."}],
        "max_tokens": n_tokens, "chat_template_kwargs": {"enable_thinking": False}, "seed": 1}
SHAPES = [
    ("greedy", {"temperature": 0}),
    ("temperature 1.0, top_p 0.95, top_k 20", {"temperature": 1.0, "top_p": 0.95, "top_k": 20}),
    ("greedy + json_schema", {"temperature": 0, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}}),
    ("greedy + forced tool call", {"temperature": 0, "tools": [TOOL],
                                   "tool_choice": {"type": "function", "function": {"name": "search"}}}),
]

log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log", delete=False)
srv = subprocess.Popen([LILY, "serve", "-m", MODEL, "--port", "0", "--backend", backend, "--ctx-size", "4096"],
                       stdout=subprocess.DEVNULL, stderr=log)
try:
    port, deadline = None, time.time() + 120
    while port is None and time.time() < deadline and srv.poll() is None:
        time.sleep(0.1)
        m = re.search(r"ready on http://127\.0\.0\.1:(\d+)", open(log.name).read())
        port = m.group(1) if m else None
    if port is None:
        sys.exit("lily serve did not start:\n" + open(log.name).read())
    print(f"| request ({backend}, {n_tokens} tokens, best of {rounds}) | server decode tok/s | client tok/s |")
    print("|---|---:|---:|")
    for name, extra in SHAPES:
        best = (0.0, 0.0)
        for _ in range(rounds):
            n_log = len(open(log.name).read())
            t0 = time.time()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                         data=json.dumps({**BASE, **extra}).encode(),
                                         headers={"Content-Type": "application/json"})
            body = json.load(urllib.request.urlopen(req, timeout=600))
            wall = time.time() - t0
            got = body["usage"]["completion_tokens"]
            time.sleep(0.2)
            line = open(log.name).read()[n_log:]
            m = re.search(r"decode[= ]([0-9.]+) ?tok/s", line)
            server = float(m.group(1)) if m else 0.0
            if server > best[0]:
                best = (server, got / wall)
        print(f"| {name} | {best[0]:.1f} | {best[1]:.1f} |")
    print("\nlast log lines:\n" + "".join(open(log.name).readlines()[-4:]))
finally:
    srv.terminate()
    srv.wait(timeout=30)
