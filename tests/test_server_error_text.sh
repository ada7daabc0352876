#!/usr/bin/env bash
# test_server_error_text.sh — `lily serve` always answers with a valid JSON error when the message quotes
# text from the client that is not UTF-8 or is cut inside a character (it used to close the connection
# without a response):
#   - 404 / 405 name the URL and method as printable ASCII (%XX for other bytes): a URL that unescapes to
#     0xFF, a URL of 100 'é' (cut at the message's length limit), a method with a 0xFF byte;
#   - 400 for a long non-ASCII role, content part type, tool_choice string, tool_choice function name and
#     logit_bias key, quoted and cut on a character boundary (never a U+FFFD in place of a cut character).
#   - 404 for another API's URL (a stored response of OpenAI's Responses API, Ollama's /api/) or a doubled /v1
#     says what to use; one of OpenAI's routes for other kinds of model (/v1/embeddings, /v1/audio/...) says
#     lily serves text generation only and lists its routes.
# The request log line quotes them the same way (no newline or escape sequence from a client reaches it).
# The server keeps serving (/health 200 after).
# usage: bash test_server_error_text.sh <path-to-lily> <tests/data dir>
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
LILY=$1
DATA=$2
lily_python "$LILY"
exec "$PY" - "$LILY" "$DATA/tiny-chat" <<'PY'
import json, re, socket, subprocess, sys, tempfile, time
lily, model = sys.argv[1], sys.argv[2]
log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log")
srv = subprocess.Popen([lily, "serve", "-m", model, "--port", "0", "--threads", "1"], stdout=subprocess.DEVNULL,
                       stderr=log)
port, deadline = None, time.time() + 60
while port is None and time.time() < deadline and srv.poll() is None:
    text = open(log.name).read()  # listening, and loaded (requests before that are 503s)
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", text)
    port = int(m.group(1)) if m and "model loaded" in text else time.sleep(0.1)
fails = 0

def raw(request_line):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    head, sep, body = request_line.partition(b"\r\n")
    s.sendall(head + b"\r\nHost: x\r\nConnection: close\r\n" + (body if sep else b"\r\n"))
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
# a client of another API, or a base URL given with /v1 that the client extends with /v1: the 404 says so
check("GET /v1/responses: 405, use POST (the Responses API is served)", b"GET /v1/responses HTTP/1.1", 405,
      "Method GET is not allowed for /v1/responses; use POST.")
check("404 for a stored response's URL says the Responses API is stateless", b"GET /responses/resp_1 HTTP/1.1", 404,
      "Unknown request URL: GET /responses/resp_1. lily's Responses API is stateless: POST /v1/responses answers, "
      "but no response is stored to retrieve, cancel or delete.")
check("404 for Ollama's API names the base URL to give", b"GET /api/tags HTTP/1.1", 404,
      "Unknown request URL: GET /api/tags. lily does not speak Ollama's API: configure the client for an "
      "OpenAI-compatible server, base URL http://HOST:PORT/v1.")
check("404 for /v1/v1/... names the base URL to give", b"POST /v1/v1/chat/completions HTTP/1.1", 404,
      "Unknown request URL: POST /v1/v1/chat/completions. The client's base URL ends in /v1 and the client added "
      "/v1 again: give it http://HOST:PORT.")
# a client that sends every kind of request to one base URL (embeddings beside chat): the 404 says lily has
# text generation only and lists its routes (it said "Unknown request URL" alone)
for url in (b"/v1/embeddings", b"/embeddings", b"/v1/audio/transcriptions", b"/v1/images/generations",
            b"/v1/moderations", b"/v1/rerank"):
    check("404 for POST " + url.decode() + " says lily serves text generation only", b"POST " + url + b" HTTP/1.1",
          404, "Unknown request URL: POST " + url.decode() + ". lily serves one chat model for text generation and "
          "has no such route: its routes are POST /v1/chat/completions, /v1/completions, /v1/responses and "
          "/v1/messages (give this client another server for embeddings, audio, images, moderation or reranking).")
check("404 for /v1/embeddingsx: no hint", b"POST /v1/embeddingsx HTTP/1.1", 404,
      "Unknown request URL: POST /v1/embeddingsx.")
check("404 for /v1/responsesx: no hint", b"POST /v1/responsesx HTTP/1.1", 404,
      "Unknown request URL: POST /v1/responsesx.")
def post(name, body, want_message_start):
    global fails
    data = json.dumps(body, ensure_ascii=False).encode()
    status, resp = raw(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\n"
                       b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    try:
        msg = json.loads(resp.decode("utf-8"))["error"]["message"]
    except Exception:
        msg = None
    quoted = msg[len(want_message_start) - 2:].split("'")[0] if msg else ""
    if (status == 400 and msg and msg.startswith(want_message_start) and "\ufffd" not in msg and len(quoted) >= 16 and
            odd.startswith(quoted)):
        print("ok  ", name)
    else:
        fails += 1
        print("FAIL", name, status, resp[:200])

odd = "a" + "é" * 150  # a cut at an even byte count splits an 'é'
user = [{"role": "user", "content": "x"}]
tools = [{"type": "function", "function": {"name": "f"}}]
post("400 for a long non-ASCII role", {"messages": [{"role": odd, "content": "x"}]}, "Invalid value: 'aé")
post("400 for a long non-ASCII content part type", {"messages": [{"role": "user", "content": [{"type": odd}]}]},
     "Unsupported content part type 'aé")
post("400 for a long non-ASCII tool_choice", {"messages": user, "tools": tools, "tool_choice": odd},
     "Invalid value for 'tool_choice': 'aé")
post("400 for a long non-ASCII tool_choice function name",
     {"messages": user, "tools": tools, "tool_choice": {"type": "function", "function": {"name": odd}}},
     "Invalid 'tool_choice.function.name': 'aé")
post("400 for a long non-ASCII logit_bias key", {"messages": user, "logit_bias": {odd: 1}},
     "Invalid key in 'logit_bias': 'aé")

# /detokenize with an id outside the tokenizer is a 400, as /v1/completions is for the same id
data = b'{"tokens": [1, 99999999]}'
status, resp = raw(b"POST /detokenize HTTP/1.1\r\nContent-Type: application/json\r\n"
                   b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
if status == 400 and b"outside the tokenizer" in resp:
    print("ok   400 for /detokenize of an out-of-vocabulary id")
else:
    fails += 1
    print("FAIL /detokenize out-of-vocabulary:", status, resp[:200])

# the request log writes the method and URL as printable ASCII too: a URL that unescapes to a newline and an
# escape sequence neither forges a log line nor reaches the terminal (such a path is a 400, logged as sent)
log_status = raw(b"GET /x%0a2000-01-01T00:00:00%20GET%20/forged%20200%1b[31m HTTP/1.1")[0], \
    raw(b"G\x1bT /health HTTP/1.1")[0]
status, body = raw(b"GET /health HTTP/1.1")
if status == 200:
    print("ok   /health 200 after")
else:
    fails += 1
    print("FAIL /health after:", status, body[:200])
srv.terminate()
srv.wait(timeout=30)
logged = open(log.name, "rb").read()
if log_status == (400, 405) and b"\x1b" not in logged and b"\n2000-01-01" not in logged and \
        b"GET /x%0a2000-01-01T00:00:00%20GET%20/forged%20200%1b[31m 400" in logged and b"G%1BT /health 405" in logged:
    print("ok   the request log escapes control bytes of the method and URL")
else:
    fails += 1
    print("FAIL request log:", log_status, [l for l in logged.split(b"\n") if b"forged" in l or b"health 405" in l])
print("failures:", fails)
sys.exit(1 if fails else 0)
PY
