"""test_server_load.py — `lily serve` under a bounded load with faults (run by test_server_load.sh).

usage: python3 test_server_load.py <lily-binary> <model-dir>

Loopback only; stops by itself (two rounds of ROUND_S seconds plus start-up and checks). Checks:
  - usage: an empty --api-key, an empty --api-key-file, or both options, exit 2 (a directory as the key file too,
    saying it is one); LILY_API_KEY is the key; blanks
    around a key (from the environment or a key file) are not part of it;
  - U+0000 round trip: a message holding U+0000 (which lily may write in a reply) is accepted back, and
    /tokenize then /detokenize returns it;
  - two rounds of load: concurrent streaming and non-streaming clients, clients that disconnect early, a
    streaming client that stops reading, idle and slow-header connections, and malformed requests of every
    kind (bad JSON, a body of 300000 values, 65 levels of nesting, a bad tool name, a non-JSON content type,
    a foreign Origin, a wrong key, bad chunks, a bad Content-Length, a garbage request line, invalid UTF-8
    through /detokenize). Every request is answered with the status its kind must get, or cleanly refused
    (503 queue_full only); no 5xx; /health stays reachable;
  - /metrics counts exactly what was sent (a request the client left early counts as 2xx or 499);
  - RSS is flat: the second round grows it by less than RSS_BOUND_MB, or else a third round does;
  - a second SIGTERM cancels a long generation at once and the server exits 0.
"""
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

LILY, MODEL = sys.argv[1], sys.argv[2]
KEY = "load-test-key"
ROUND_S = 6.0
RSS_BOUND_MB = 24
failures = []
lock = threading.Lock()


def check(cond, what):
    print(("  ok   " if cond else "  FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def start(args, env=None):
    log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log", delete=False)
    proc = subprocess.Popen([LILY, "serve", "-m", MODEL, "--port", "0", "--threads", "1"] + args,
                            stdout=subprocess.DEVNULL, stderr=log, env=env)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        text = open(log.name).read()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", text)
        if m and "model loaded" in text:
            return proc, int(m.group(1)), log.name
        time.sleep(0.05)
    print(open(log.name).read())
    sys.exit("lily serve did not start")


def request(port, method, path, body=None, headers=None, key=KEY, timeout=60):
    """(status, body bytes) of one request on its own connection."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Connection": "close"}
    if body is not None:
        h["Content-Type"] = "application/json"
    if key:
        h["Authorization"] = "Bearer " + key
    h.update(headers or {})
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    c.request(method, path, body=data, headers=h)
    r = c.getresponse()
    out = r.read()
    c.close()
    return r.status, out


def raw(port, data, timeout=30):
    """The whole response to raw bytes (b"" when the server closed without one)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    out = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        out += d
    s.close()
    return out


def rss_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# ---------------------------------------------------------------------------------------------- usage

empty = tempfile.NamedTemporaryFile(mode="w", suffix=".key", delete=False)
empty.write("\n")
empty.close()
keyfile = tempfile.NamedTemporaryFile(mode="w", suffix=".key", delete=False)
keyfile.write("\t" + KEY + "  \r\n")  # the spaces, tab and CR around it are not the key's: every check below sends KEY
keyfile.close()
for args, what in ((["--api-key", ""], "an empty --api-key"), (["--api-key-file", empty.name], "an empty key file"),
                   (["--api-key", "x", "--api-key-file", keyfile.name], "both key options")):
    r = subprocess.run([LILY, "serve", "-m", MODEL, "--port", "0"] + args, capture_output=True, text=True, timeout=30)
    check(r.returncode == 2 and "key" in r.stderr, f"{what} is a usage error (rc {r.returncode}: {r.stderr.strip()[:80]})")
# an empty LILY_API_KEY (a deployment's unset variable expanded to "") is refused, saying to unset it
r = subprocess.run([LILY, "serve", "-m", MODEL, "--port", "0"], capture_output=True, text=True, timeout=30,
                   env=dict(os.environ, LILY_API_KEY=" "))
check(r.returncode == 2 and "the API key from LILY_API_KEY is empty (unset LILY_API_KEY to serve without a key)"
      in r.stderr, f"an empty LILY_API_KEY says to unset it (rc {r.returncode}: {r.stderr.strip()[:120]})")
# a directory given as the key file is a read error that says so (it was "the API key ... is empty")
key_dir = tempfile.mkdtemp()
r = subprocess.run([LILY, "serve", "-m", MODEL, "--port", "0", "--api-key-file", key_dir], capture_output=True, text=True,
                   timeout=30)
check(r.returncode == 2 and f"cannot read --api-key-file {key_dir}: Is a directory" in r.stderr,
      f"a directory as --api-key-file says it is one (rc {r.returncode}: {r.stderr.strip()[:120]})")
os.rmdir(key_dir)
env = dict(os.environ, LILY_API_KEY=" from-env\t")  # without the blanks around it (a client cannot send them)
proc, port, _ = start([], env)
s1, _ = request(port, "GET", "/v1/models", key=None)
s2, _ = request(port, "GET", "/v1/models", key="from-env")
check((s1, s2) == (401, 200), f"LILY_API_KEY is the key, blanks around it dropped ({s1}, {s2})")
proc.terminate()
proc.wait(timeout=30)
os.unlink(empty.name)

# ---------------------------------------------------------------------------------------------- server

# one malloc arena: a thread per connection otherwise spreads allocations over up to 8 arenas per core, whose
# cached pages grow RSS by tens of MB between rounds without any leak (seen in CI: 33 -> 60 MB)
proc, port, log_path = start(["--api-key-file", keyfile.name, "--queue", "4", "--idle-timeout", "2",
                              "--max-connections", "64", "--ctx-size", "8192", "--cache-ram", "8"],
                             dict(os.environ, MALLOC_ARENA_MAX="1"))
os.unlink(keyfile.name)
s, ids = request(port, "POST", "/tokenize", {"content": "<|im_end|><|endoftext|>"})
END_IDS = json.loads(ids)["tokens"]
BAN = {str(t): -100 for t in END_IDS}

# U+0000 round trip
s, r = request(port, "POST", "/v1/chat/completions",
               {"messages": [{"role": "user", "content": "a\u0000b"}, {"role": "assistant", "content": "c\u0000"},
                             {"role": "user", "content": "d"}], "max_tokens": 4})
check(s == 200, f"a conversation holding U+0000 is accepted ({s} {r[:120]})")
s, r = request(port, "POST", "/tokenize", {"content": "a\u0000b"})
toks = json.loads(r).get("tokens", []) if s == 200 else []
s2, r2 = request(port, "POST", "/detokenize", {"tokens": toks})
check(s == 200 and len(toks) == 3 and s2 == 200 and json.loads(r2)["content"] == "a\u0000b",
      f"/tokenize and /detokenize round-trip U+0000 ({toks}, {r2[:60]})")
s, r = request(port, "POST", "/v1/completions", {"prompt": "x\u0000y", "max_tokens": 2})
check(s == 200 and json.loads(r)["usage"]["prompt_tokens"] == 3,
      f"a completions prompt keeps U+0000: x, NUL, y ({r[-160:]})")
s, r = request(port, "POST", "/detokenize", {"tokens": [136, 111]})
E_ACUTE = [136, 111] if s == 200 and json.loads(r)["content"] == "\u00e9" else None

# ---------------------------------------------------------------------------------------------- load

sent = {}          # label -> responses the clients got
left_early = [0]   # requests the client abandoned (the server counts 2xx or 499)
problems = []


def label(status):
    if status < 400:
        return "2xx"
    if status in (404, 405):
        return "404_405"
    if status in (503, 529):
        return "503_529"
    if status in (400, 401, 403, 413, 415, 499):
        return str(status)
    return "4xx" if status < 499 else "5xx"


def got(status, what, want=None, body=b""):
    with lock:
        sent[label(status)] = sent.get(label(status), 0) + 1
        if status >= 500 and not (status == 503 and b"queue_full" in body):
            problems.append(f"{what}: {status} {body[:120]}")
        elif want is not None and status not in want:
            problems.append(f"{what}: {status} (want {want}) {body[:120]}")


def chat(n_tokens, stream=False, **extra):
    b = {"messages": [{"role": "user", "content": "hello " * random.randint(1, 8)}], "max_tokens": n_tokens,
         "stream": stream}
    b.update(extra)
    return b


def nonstream_client(stop):
    while not stop.is_set():
        s, r = request(port, "POST", "/v1/chat/completions", chat(8))
        got(s, "non-stream chat", (200, 503), r)


def http_request_bytes(path, body, headers=""):
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
            f"{headers}Content-Length: {len(data)}\r\n\r\n").encode() + data


def stream_client(stop):
    while not stop.is_set():
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        s.sendall(http_request_bytes("/v1/chat/completions", chat(24, True)))
        if random.random() < 0.3:  # leave after the first bytes
            s.recv(64)
            s.close()
            with lock:
                left_early[0] += 1
            continue
        out = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
        s.close()
        status = int(out.split(b" ", 2)[1]) if out.startswith(b"HTTP/1.1") else 0
        got(status, "stream chat", (200, 503), out[-200:])
        if status == 200 and b"data: [DONE]\n\n" not in out:
            problems.append("a stream without [DONE]: " + repr(out[-120:]))


def slow_reader(stop):
    """A stream with logprobs that the client does not read for 3 s, then leaves."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(http_request_bytes("/v1/chat/completions", chat(2000, True, logprobs=True, top_logprobs=20,
                                                             logit_bias=BAN)))
    stop.wait(3)
    s.close()
    with lock:
        left_early[0] += 1


def idle_connections(stop):
    socks = []
    for i in range(24):
        c = socket.create_connection(("127.0.0.1", port), timeout=10)
        if i % 2:
            c.sendall(b"POST /v1/chat/comp")  # a slow header that never ends
        socks.append(c)
    stop.wait()
    for c in socks:
        c.close()


def bad_requests():
    """(what, send, expected status or None for no answer): one of every malformed kind."""
    deep = b'{"messages":[{"role":"user","content":"x"}],"x":' + b"[" * 65 + b"]" * 65 + b"}"
    many = b'{"messages":[{"role":"user","content":"x"}],"x":[' + b"0," * 300000 + b"0]}"
    bad_tool = {"messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "<|im_end|>"}}]}
    return [
        ("bad JSON", lambda: request(port, "POST", "/v1/chat/completions", b"{nope"), 400),
        ("300000 values", lambda: request(port, "POST", "/v1/chat/completions", many), 400),
        ("65 levels", lambda: request(port, "POST", "/v1/chat/completions", deep), 400),
        ("a bad tool name", lambda: request(port, "POST", "/v1/chat/completions", bad_tool), 400),
        ("text/plain", lambda: request(port, "POST", "/v1/chat/completions", chat(4),
                                       {"Content-Type": "text/plain"}), 415),
        ("a foreign Origin", lambda: request(port, "POST", "/v1/chat/completions", chat(4),
                                             {"Origin": "https://evil.example"}), 403),
        ("a wrong key", lambda: request(port, "GET", "/v1/models", key="nope"), 401),
        ("an unknown URL", lambda: request(port, "GET", "/v2/nope"), 404),
        ("a wrong method", lambda: request(port, "GET", "/v1/chat/completions"), 405),
        ("a body over /tokenize's limit", lambda: request(port, "POST", "/tokenize", {"content": "a" * (1 << 20 | 1)}),
         400),
        ("a bad chunk", lambda: raw(port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                                          b"Authorization: Bearer " + KEY.encode() + b"\r\n\r\nZZ\r\n{}\r\n0\r\n\r\n"),
         400),
        ("Content-Length: -1", lambda: raw(port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"),
         400),
        ("a garbage request line", lambda: raw(port, b"GARBAGE\r\n\r\n"), None),
    ] + ([("invalid UTF-8 out of /detokenize",
           lambda: request(port, "POST", "/detokenize", {"tokens": E_ACUTE * 60000 + [136]}), (200, 503))]
         if E_ACUTE else [])


def malformed_client(stop):
    kinds = bad_requests()
    while not stop.is_set():
        for what, send, want in kinds:
            r = send()
            if isinstance(r, bytes):  # raw
                if want is None:
                    if r:
                        problems.append(f"{what}: answered {r[:80]}")
                    continue
                status = int(r.split(b" ", 2)[1]) if r.startswith(b"HTTP/1.1") else 0
                got(status, what, (want,), r)
            else:
                got(r[0], what, want if isinstance(want, tuple) else (want,), r[1])
                if r[0] != 200:
                    try:
                        json.loads(r[1])["error"]["message"]
                    except Exception:
                        problems.append(f"{what}: not an OpenAI error: {r[1][:100]}")


def health_client(stop):
    while not stop.is_set():
        s, r = request(port, "GET", "/health", timeout=5)
        got(s, "/health", (200,), r)
        stop.wait(0.2)


def wait_idle():
    for _ in range(200):
        s, r = request(port, "GET", "/health")
        got(s, "/health")
        h = json.loads(r)
        if h.get("requests_processing") == 0 and h.get("requests_waiting") == 0:
            return
        time.sleep(0.05)


def run_round(n):
    stop = threading.Event()
    workers = [nonstream_client] * 3 + [stream_client] * 2 + [slow_reader, idle_connections, malformed_client,
                                                              health_client]
    threads = [threading.Thread(target=w, args=(stop,)) for w in workers]
    t0 = time.time()
    for t in threads:
        t.start()
    time.sleep(ROUND_S)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    check(not any(t.is_alive() for t in threads), f"round {n}: every client finished ({time.time() - t0:.1f} s)")
    wait_idle()
    time.sleep(2.5)  # the idle connections' slots and the abandoned requests' threads are released
    wait_idle()


def requests_total():
    s, m = request(port, "GET", "/metrics")
    return {k: int(v) for k, v in re.findall(r'^lily_requests_total\{status="([^"]+)"\} (\d+)$', m.decode(), re.M)}


time.sleep(0.5)  # a request is counted once its connection is done, a moment after its client has the answer
before = requests_total()
got(200, "/metrics")  # counted once answered
random.seed(18)
run_round(1)
rss1 = rss_mb(proc.pid)
run_round(2)
rss2 = rss_mb(proc.pid)
asan = b"__asan_init" in open(LILY, "rb").read()  # its quarantine holds freed memory; LeakSanitizer checks at exit
rss3 = None
if not asan and rss2 - rss1 >= RSS_BOUND_MB:
    # on a loaded machine round 2 can hold more connections at once than round 1 did (touched thread stacks, the
    # one arena's high-water mark; seen under a parallel ctest: 43 -> 67 MB): a leak keeps growing, so a third
    # round must not grow it again
    run_round(3)
    rss3 = rss_mb(proc.pid)
check(not problems, f"every request answered with its kind's status, no 5xx ({problems[:5]})")
if asan:
    print(f"  skip RSS flat across rounds under AddressSanitizer ({rss1:.0f} MB -> {rss2:.0f} MB)")
elif rss3 is None:
    check(True, f"RSS flat across rounds: {rss1:.0f} MB -> {rss2:.0f} MB (bound +{RSS_BOUND_MB})")
else:
    check(rss3 - rss2 < RSS_BOUND_MB, f"RSS flat across rounds: {rss1:.0f} MB -> {rss2:.0f} MB, then a third round "
          f"-> {rss3:.0f} MB (bound +{RSS_BOUND_MB} per round once it has settled)")

# /metrics equals what was sent (a request its client left is counted as 2xx, 499 or 503 queue_full)
metrics = {}
LEFT = ("2xx", "499", "503_529")
for _ in range(50):
    metrics = {k: v - before.get(k, 0) for k, v in requests_total().items()}
    exact = all(metrics.get(k, 0) == sent.get(k, 0) for k in set(metrics) | set(sent) if k not in LEFT)
    early = sum(metrics.get(k, 0) for k in LEFT) == sum(sent.get(k, 0) for k in LEFT) + left_early[0]
    if exact and early:
        break
    got(200, "/metrics")
    time.sleep(0.1)
check(exact and early and metrics.get("5xx") == 0 and sent.get("2xx", 0) > 20 and sent.get("400", 0) > 10,
      f"/metrics counts what was sent: {metrics} vs {sent} + {left_early[0]} left early")
print(f"  (sent: {sent}, left early: {left_early[0]})")

# a second SIGTERM stops a long generation at once
s = socket.create_connection(("127.0.0.1", port), timeout=30)
s.sendall(http_request_bytes("/v1/chat/completions", chat(7000, True, logit_bias=BAN)))
first = s.recv(4096)
proc.send_signal(signal.SIGTERM)
time.sleep(0.3)
t0 = time.time()
proc.send_signal(signal.SIGTERM)
try:
    rc = proc.wait(timeout=10)
except subprocess.TimeoutExpired:
    proc.kill()
    rc = proc.wait()
took = time.time() - t0
s.close()
log = open(log_path).read()
last = [l for l in log.splitlines() if "POST /v1/chat/completions" in l][-1:]
m = re.search(r"completion=(\d+)", last[0]) if last else None
check(rc == 0 and took < 3 and m is not None and int(m.group(1)) < 7000 and "cancelled" in last[0],
      f"a second SIGTERM cancels the generation in flight and exits 0 (rc {rc}, {took:.1f} s, {last})")

os.unlink(log_path)
if failures:
    print("\n--- server log (tail) ---\n" + "\n".join(log.splitlines()[-40:]))
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all passed")
