#!/usr/bin/env bash
# test_webui.sh — the chat page `lily serve` answers at / , driven in headless Chromium through the DevTools
# protocol (tiny-chat model, --reasoning-budget so a reply has reasoning and then an answer):
#   - the page loads and names the model (GET /v1/models);
#   - typing a message and pressing Enter streams the reply: the text grows over several polls before
#     the reply ends; the reasoning sits in a folded <details>, the answer beside it;
#   - a second message is sent with the whole conversation (the page keeps it: 4 messages after it);
#   - Stop ends a reply ("stopped") and the server keeps serving;
#   - after a reload the conversation is still shown, tool calls as "tool call: NAME ARGS";
#   - Enter while an input method composes does not send;
#   - an error event inside a stream is shown after the partial reply (it was dropped without a word).
# Skips (with a message) where chromium is missing (make test installs Debian's chromium) or the
# websocket-client package cannot be installed into the suite's Python.
# usage: bash test_webui.sh <path-to-lily> <tests/data dir>
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"
lily_test_init "$@"
CHROME=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$CHROME" ]; then
    echo "SKIP test_webui: no chromium on PATH (Debian: apt-get install chromium; make test installs it as root)"
    exit 0
fi
lily_python "$LILY" websocket-client=websocket
if [ -n "$PY_MISSING" ]; then
    echo "SKIP test_webui: cannot install$PY_MISSING into the suite's Python (no network?)"
    exit 0
fi
exec "$PY" - "$LILY" "$DATA/tiny-chat" "$CHROME" "$TMP" "$(dirname "$0")/lib" <<'PY'
import json, os, re, subprocess, sys, time, urllib.request
import websocket
lily, model, chrome, tmp = sys.argv[1:5]
sys.path.insert(0, sys.argv[5])
from lily_test import Tally, start_server
t = Tally()
check = t.check

log_path = os.path.join(tmp, "serve.log")
srv, port = start_server(lily, model, log_path, "--temp", "0", "--reasoning-budget", "24", "-n", "96")
browser = None
try:
    profile = os.path.join(tmp, "profile")
    browser = subprocess.Popen([chrome, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                "--remote-debugging-port=0", "--user-data-dir=" + profile, "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    active = os.path.join(profile, "DevToolsActivePort")
    deadline = time.time() + 60
    while not (os.path.exists(active) and open(active).read().strip()) and time.time() < deadline:
        time.sleep(0.1)
    devtools_port = int(open(active).read().split()[0])
    targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{devtools_port}/json/list"))
    page = next(t for t in targets if t["type"] == "page")
    ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
    next_id = [0]
    def cdp(method, **params):
        next_id[0] += 1
        ws.send(json.dumps({"id": next_id[0], "method": method, "params": params}))
        while True:
            msg = json.loads(ws.recv())
            if msg.get("id") == next_id[0]:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg.get("result", {})
    def js(expr):
        r = cdp("Runtime.evaluate", expression=expr, returnByValue=True)
        return r.get("result", {}).get("value")
    def wait_for(expr, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if js(expr):
                return True
            time.sleep(0.05)
        return False
    def type_and_send(text):
        js("document.getElementById('input').focus()")
        cdp("Input.insertText", text=text)
        for kind in ("keyDown", "keyUp"):
            cdp("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter", windowsVirtualKeyCode=13,
                nativeVirtualKeyCode=13, text="\r" if kind == "keyDown" else "")

    url = f"http://127.0.0.1:{port}/"
    cdp("Page.navigate", url=url)
    check(wait_for("document.readyState === 'complete' && document.getElementById('model').textContent === 'tiny-chat'"),
          "the page loads and names the model")
    reply_text = ("(() => { const a = document.querySelectorAll('.assistant'); if (!a.length) return ''; "
                  "const l = a[a.length - 1]; return l.querySelector('.reasoning-text').textContent + '|' + "
                  "l.querySelector('.content').textContent; })()")
    js("window.__updates = 0; new MutationObserver((ms) => { window.__updates += ms.length; })"
       ".observe(document.getElementById('log'), {subtree: true, childList: true, characterData: true})")
    type_and_send("Tell me about lists.")
    seen = set()
    deadline = time.time() + 60
    while time.time() < deadline:
        seen.add(js(reply_text) or "")
        if js("document.getElementById('send').disabled === false && document.querySelectorAll('.assistant').length === 1"):
            break
        time.sleep(0.005)
    final = js(reply_text) or ""
    partial = len([x for x in seen if x and x != final])
    updates = js("window.__updates")
    check(partial >= 1 and updates >= 10,
          "the reply streams in: %d partial states seen before the end, %d page updates" % (partial, updates))
    check(js("document.querySelector('.assistant details.reasoning').hidden === false && "
             "document.querySelector('.assistant details.reasoning').open === false && "
             "document.querySelector('.assistant .reasoning-text').textContent.length > 0"),
          "the reasoning is shown folded (a closed <details>)")
    check(js("document.querySelector('.assistant .content').textContent.length > 0"),
          "the answer follows the reasoning (the server's --reasoning-budget closed the think block)")
    type_and_send("And tuples?")
    check(wait_for("document.querySelectorAll('.assistant').length === 2 && document.getElementById('send').disabled === false"),
          "a second message gets a second reply")
    check(js("messages.length") == 4 and js("messages[0].content") == "Tell me about lists."
          and js("messages[1].role") == "assistant", "the page keeps the conversation (4 messages)")
    check(re.search(r"POST /v1/chat/completions 200 prompt=(\d+)", open(log_path).read()) is not None,
          "the server logged the page's requests")
    # Stop, pressed as soon as the message is sent (a tiny-chat reply can end by itself within milliseconds)
    js("document.getElementById('max').value = '4000'")
    type_and_send("Write a long story.")
    js("document.getElementById('stop').click()")
    check(wait_for("document.querySelectorAll('.assistant').length === 3 && "
                   "document.querySelectorAll('.assistant')[2].querySelector('.meta').textContent.includes('stopped') && "
                   "document.getElementById('send').disabled === false", 30),
          "Stop ends the reply (marked 'stopped') and the page takes the next message")
    health = urllib.request.urlopen(f"http://127.0.0.1:{port}/health").status
    check(health == 200, "the server keeps serving after the stopped request")
    # a conversation with a tool call, kept across a reload
    js("sessionStorage.setItem('lily.messages', JSON.stringify([{role:'user', content:'weather?'}, {role:'assistant', "
       "content:'', tool_calls:[{id:'call_1', type:'function', function:{name:'get_weather', arguments:'{\"city\": \"Paris\"}'}}]}]))")
    cdp("Page.reload")
    check(wait_for("document.querySelectorAll('.msg').length === 2 && document.querySelector('.tool') !== null"),
          "after a reload the kept conversation is shown")
    check(js("document.querySelector('.tool').textContent") == 'tool call: get_weather {"city": "Paris"}',
          "a tool call is shown as 'tool call: NAME ARGS'")
    # Enter that confirms an input method's candidate (isComposing; keyCode 229 in Safari) does not send: it sent
    # a half-typed Chinese or Japanese message; a plain Enter still does
    n_before = js("messages.length")
    js("document.getElementById('input').value = '你好'")
    for init in ("{key: 'Enter', isComposing: true}", "{key: 'Enter', keyCode: 229}"):
        js("document.getElementById('input').dispatchEvent(new KeyboardEvent('keydown', Object.assign({bubbles: true, "
           "cancelable: true}, %s)))" % init)
    time.sleep(0.3)
    check(js("messages.length") == n_before and js("document.getElementById('input').value") == "你好",
          "Enter while composing in an input method does not send")
    js("document.getElementById('input').value = ''")
    # an error the server sends inside a stream (a reply whose logits turn non-finite, a shutdown cancelling
    # it: "data: {\"error\": ...}" after the first chunks) is shown; the page ended the reply without a word.
    # The page's fetch is replaced by one answering such a stream.
    js("window.fetch = async () => new Response(new ReadableStream({start(c) { const e = new TextEncoder(); "
       "c.enqueue(e.encode('data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Partial\"}}]}\\n\\n' + "
       "'data: {\"error\":{\"message\":\"boom mid-stream\",\"type\":\"server_error\"}}\\n\\n')); c.close(); }}), "
       "{status: 200, headers: {'Content-Type': 'text/event-stream'}})")
    type_and_send("Anything.")
    check(wait_for("(() => { const a = document.querySelectorAll('.assistant'); const l = a[a.length - 1]; "
                   "return l.querySelector('.content').textContent === 'Partial' && "
                   "l.querySelector('.meta').textContent.includes('error: boom mid-stream') && "
                   "document.getElementById('send').disabled === false; })()", 30),
          "an error event inside the stream is shown after the partial reply")
    ws.close()
finally:
    if browser:
        browser.terminate()
        try:
            browser.wait(10)
        except subprocess.TimeoutExpired:
            browser.kill()
    srv.terminate()
    srv.wait()
sys.exit(t.finish())
PY
