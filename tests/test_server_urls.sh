#!/usr/bin/env bash
# test_server_urls.sh — `lily serve` answers 404 / 405 with a valid JSON error, naming the URL and method
# as printable ASCII (%XX for other bytes), when the request line holds bytes that are not UTF-8: a URL
# that unescapes to 0xFF, a URL of 100 'é' (cut at the message's length limit), a method with a 0xFF byte.
# It used to close the connection without a response. The server keeps serving (/health 200 after).
# usage: bash test_server_urls.sh <path-to-lily> <tests/data dir>
set -uo pipefail
LILY=$1
DATA=$2
exec python3 - "$LILY" "$DATA/tiny-chat" <<'PY'
import json, re, socket, subprocess, sys, tempfile, time
lily, model = sys.argv[1], sys.argv[2]
log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log")
srv = subprocess.Popen([lily, "serve", "-m", model, "--port", "0", "--threads", "1"], stdout=subprocess.DEVNULL,
                       stderr=log)
port, deadline = None, time.time() + 60
while port is None and time.time() < deadline and srv.poll() is None:
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log.name).read())
    port = int(m.group(1)) if m else time.sleep(0.1)
fails = 0

def raw(request_line):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(request_line + b"\r\nHost: x\r\nConnection: close\r\n\r\n")
    out = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        out += d
    s.close()
    head, _, body = out.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/1.") else None
    return status, body

def check(name, request_line, want_status, want_message):
    global fails
    status, body = raw(request_line)
    try:
        msg = json.loads(body.decode("utf-8"))["error"]["message"]
    except Exception:
        msg = None
    if status == want_status and msg == want_message:
        print("ok  ", name)
    else:
        fails += 1
        print("FAIL", name, status, body[:200])

if port is None:
    print("FAIL the server did not start:", open(log.name).read()[-500:])
    sys.exit(1)
check("404 for a URL that unescapes to 0xFF", b"GET /%ff HTTP/1.1", 404, "Unknown request URL: GET /%FF.")
check("404 for a URL of 100 'e-acute' (escaped, cut at a whole %XX)", b"GET /" + "é".encode() * 100 + b" HTTP/1.1",
      404, "Unknown request URL: GET /" + "%C3%A9" * 26 + ".")
check("405 for a method with a 0xFF byte", b"G\xffT /health HTTP/1.1", 405,
      "Method G%FFT is not allowed for /health; use GET.")
check("404 for a plain unknown URL (unchanged)", b"GET /nope HTTP/1.1", 404, "Unknown request URL: GET /nope.")
status, body = raw(b"GET /health HTTP/1.1")
if status == 200:
    print("ok   /health 200 after")
else:
    fails += 1
    print("FAIL /health after:", status, body[:200])
srv.terminate()
srv.wait(timeout=30)
print("failures:", fails)
sys.exit(1 if fails else 0)
PY
