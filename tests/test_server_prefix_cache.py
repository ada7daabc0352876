"""test_server_prefix_cache.py — the prefix cache seen from a client of `lily serve` (run by
test_server_prefix_cache.sh).

usage: python test_server_prefix_cache.py <lily-binary> <model-dir>

The Qwen3.6 template renders an earlier assistant turn without the <think> block its generation prompt
had, so turn k+1 shares with turn k everything before that <think> (the mark checkpoint, 2 tokens before
the end of turn k's prompt with thinking on): cached_tokens must be exactly that. Exactness of the reused
state (cached == cold, bit for bit) is tested at the runtime level (tests/test_prefix_cache.c).
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

LILY, MODEL = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    print(("  ok   " if cond else "  FAIL ") + what)
    if not cond:
        failures.append(what)


log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log", delete=False)
server = subprocess.Popen([LILY, "serve", "-m", MODEL, "--port", "0", "--ctx-size", "2048", "--threads", "1",
                           "--cache-ram", "64", "--checkpoint-every", "64"], stdout=subprocess.DEVNULL, stderr=log)
port = None
deadline = time.time() + 60
while port is None and time.time() < deadline and server.poll() is None:
    time.sleep(0.05)
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log.name).read())
    port = int(m.group(1)) if m else None
if port is None:
    print(open(log.name).read())
    sys.exit("lily serve did not start")
BASE = f"http://127.0.0.1:{port}"
for _ in range(600):
    try:
        if urllib.request.urlopen(BASE + "/health", timeout=5).status == 200:
            break
    except Exception:
        time.sleep(0.1)

try:
    import openai
except ImportError:
    openai = None
    print("WARNING: the openai package is not installed; the checks run over raw HTTP")


def post(path, body):
    req = urllib.request.Request(BASE + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=120).read())


def chat(messages):
    """(content, prompt_tokens, cached_tokens) of one greedy chat completion."""
    if openai:
        client = openai.OpenAI(base_url=BASE + "/v1", api_key="none", max_retries=0, timeout=120)
        r = client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=12, temperature=0)
        return (r.choices[0].message.content or "", r.usage.prompt_tokens,
                r.usage.prompt_tokens_details.cached_tokens)
    r = post("/v1/chat/completions", {"messages": messages, "max_tokens": 12, "temperature": 0})
    return (r["choices"][0]["message"].get("content") or "", r["usage"]["prompt_tokens"],
            r["usage"]["prompt_tokens_details"]["cached_tokens"])


print("a 3-turn conversation")
messages = [{"role": "system", "content": "You are a terse assistant for Python questions."},
            {"role": "user", "content": "What does enumerate return?"}]
prompts, cached = [], []
for turn in range(3):
    content, p, c = chat(messages)
    prompts.append(p)
    cached.append(c)
    messages += [{"role": "assistant", "content": content},
                 {"role": "user", "content": f"Follow-up question number {turn + 2}: why?"}]
print(f"  prompt tokens {prompts}, cached tokens {cached}")
check(cached[0] == 0, "turn 1: nothing cached on a fresh server")
check(cached[1] == prompts[0] - 2, f"turn 2 reuses all of turn 1's prompt before its <think> ({prompts[0] - 2})")
check(cached[2] == prompts[1] - 2, f"turn 3 reuses all of turn 2's prompt before its <think> ({prompts[1] - 2})")
check(prompts[1] > prompts[0] and prompts[2] > prompts[1], "the prompts grow")

print("completions: an exact repeat")
body = {"prompt": "The quick brown fox jumps over the lazy dog. " * 8, "max_tokens": 8, "temperature": 0}
a, b = post("/v1/completions", body), post("/v1/completions", body)
check(b["usage"]["prompt_tokens_details"]["cached_tokens"] == b["usage"]["prompt_tokens"],
      f"the repeat reuses all {b['usage']['prompt_tokens']} prompt tokens")
check(a["choices"][0]["text"] == b["choices"][0]["text"], "and answers the same")

print("the request log and /metrics")
time.sleep(0.2)
lines = [ln for ln in open(log.name).read().splitlines() if "/v1/chat/completions" in ln]
got = [int(m.group(1)) for m in (re.search(r"cached=(\d+)", ln) for ln in lines) if m]
check(got[-3:] == cached, f"the log lines show cached= {got[-3:]}")
metrics = urllib.request.urlopen(BASE + "/metrics", timeout=10).read().decode()
values = dict(re.findall(r"^(lily_prefix_cache_\w+) (\d+)$", metrics, re.M))
print("  " + " ".join(f"{k[18:]}={v}" for k, v in values.items()))
check(int(values.get("lily_prefix_cache_hits_total", 0)) == 3, "hits: turns 2 and 3 and the repeat")
check(int(values.get("lily_prefix_cache_misses_total", 0)) == 2, "misses: turn 1 and the first completion")
check(int(values.get("lily_prefix_cache_reused_tokens_total", 0)) == sum(cached) + b["usage"]["prompt_tokens"],
      "reused tokens = the cached_tokens reported")
check(int(values.get("lily_prefix_cache_checkpoints", 0)) > 0 and int(values.get("lily_prefix_cache_bytes", 0)) > 0
      and int(values.get("lily_prefix_cache_capacity_bytes", 0)) == 64 << 20, "checkpoints, bytes and the cap")
check("lily_prefix_cache_evictions_total 0" in metrics, "no evictions in a 64 MiB pool")

server.terminate()
server.wait(timeout=30)
if failures:
    print("\n--- server log (tail) ---\n" + "".join(open(log.name).readlines()[-30:]))
    sys.exit(f"{len(failures)} check(s) failed")
print("all prefix cache server checks passed")
os.unlink(log.name)
