"""serve_small_requests.py — the HTTP path of `lily serve` alone: latency of small requests that run no model.

usage: python3 bench/serve_small_requests.py LILY MODEL_DIR [--requests 2000] [--rounds 5] [--label NAME]

Starts `lily serve --threads 1` on a free loopback port and times, at the client (Python http.client), N
requests of each kind on one kept-alive connection, and N/4 on a fresh connection each ("Connection: close":
connect, a new server thread): GET /health, GET /v1/models, GET /v1/models with a short query
(?limit=20&after_id=x), GET /v1/models with a 4 KiB query of 1023 arguments (near lily's bounds, see
src/server/target.h), POST /tokenize of a short text. Prints one markdown row per kind: microseconds per
request, the median of the rounds' means and the best round. Stdlib only.
"""
import http.client
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time

args = sys.argv[1:]
if len(args) < 2:
    sys.exit(__doc__)
LILY, MODEL = args[0], args[1]
n_req, rounds, label = 2000, 5, ""
i = 2
while i < len(args):
    k, v = args[i], args[i + 1]
    if k == "--requests": n_req = int(v)
    elif k == "--rounds": rounds = int(v)
    elif k == "--label": label = v
    else: sys.exit(f"unknown option {k}\n" + __doc__)
    i += 2

KINDS = [
    ("GET /health", "GET", "/health", None),
    ("GET /v1/models", "GET", "/v1/models", None),
    ("GET /v1/models?limit=20&after_id=x", "GET", "/v1/models?limit=20&after_id=x", None),
    ("GET /v1/models + 1023 query args (4 KiB)", "GET", "/v1/models?" + "&".join(["a=1"] * 1023), None),
    ("POST /tokenize (12 bytes)", "POST", "/tokenize", json.dumps({"content": "Hello world!"})),
]

log = tempfile.NamedTemporaryFile("w+", suffix=".log")
srv = subprocess.Popen([LILY, "serve", "-m", MODEL, "--port", "0", "--threads", "1"], stdout=subprocess.DEVNULL,
                       stderr=log)
port = None
for _ in range(600):
    m = re.search(r"ready on http://127\.0\.0\.1:(\d+)", open(log.name).read())
    if m:
        port = int(m.group(1))
        break
    time.sleep(0.1)
if port is None:
    srv.kill()
    sys.exit("lily serve did not start:\n" + open(log.name).read())


def once(conn, method, path, body, close):
    headers = {"Content-Type": "application/json"}
    if close:
        headers["Connection"] = "close"
    conn.request(method, path, body, headers)
    r = conn.getresponse()
    r.read()
    assert r.status == 200, (path[:60], r.status)


def kept_alive(method, path, body, n):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.connect()
    t0 = time.perf_counter()
    for _ in range(n):
        once(conn, method, path, body, False)
    dt = time.perf_counter() - t0
    conn.close()
    return dt / n


def fresh(method, path, body, n):
    t0 = time.perf_counter()
    for _ in range(n):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        once(conn, method, path, body, True)
        conn.close()
    return (time.perf_counter() - t0) / n


try:
    print(f"| {label} request | kept-alive µs (median, best of {rounds}) | new connection µs (median, best) |")
    print("|---|---|---|")
    for name, method, path, body in KINDS:
        ka = [kept_alive(method, path, body, n_req) * 1e6 for _ in range(rounds)]
        fr = [fresh(method, path, body, max(1, n_req // 4)) * 1e6 for _ in range(rounds)]
        print(f"| {name} | {statistics.median(ka):.0f} ({min(ka):.0f}) | {statistics.median(fr):.0f} ({min(fr):.0f}) |",
              flush=True)
finally:
    srv.terminate()
    srv.wait(timeout=30)
