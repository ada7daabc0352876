#!/usr/bin/env bash
# test_readme_examples.sh — every example in README.md runs: each ```sh block (but the `make` lines, which
# are the build this suite runs in) as a bash script with `lily` this binary and DIR the tiny-chat model,
# and each ```python block with the suite's Python (openai installed), against `lily serve` on a free
# loopback port in place of 8080. Usage synopses are ```text blocks and are not run.
# Checked: every block exits 0 and prints something; the streaming Python example prints the reasoning and
# then the answer, exactly "[thinking] R\n[answer] C\n" where R and C are the reasoning_content and content
# of the same request made without streaming (the server runs greedy, with --reasoning-budget 16 so the
# reply has both).
# usage: bash test_readme_examples.sh <path-to-lily> <tests/data dir>
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"
lily_test_init "$@"
lily_python "$LILY" openai anthropic
if [ -n "$PY_MISSING" ]; then
    echo "SKIP test_readme_examples: cannot install$PY_MISSING into the suite's Python (no network?)"
    exit 0
fi
exec "$PY" - "$LILY" "$DATA/tiny-chat" "$DATA/../../README.md" "$TMP" "$(dirname "$0")/lib" <<'PY'
import json, os, re, subprocess, sys, urllib.request
lily, model, readme, tmp = sys.argv[1:5]
sys.path.insert(0, sys.argv[5])
from lily_test import Tally, start_server
t = Tally()
check = t.check

text = open(readme).read()
blocks = re.findall(r"^```(\w+)\n(.*?)^```", text, re.S | re.M)
runnable = [(lang, body) for lang, body in blocks if lang in ("sh", "python")]
check(len(runnable) >= 5, "README has runnable examples (%d sh/python blocks)" % len(runnable))
check(all(lang in ("sh", "python", "text") for lang, _ in blocks) and len(re.findall(r"^```", text, re.M)) == 2 * len(blocks),
      "every fenced block is sh, python (both run here) or text (not run)")

srv, port = start_server(lily, model, os.path.join(tmp, "serve.log"), "--temp", "0", "--reasoning-budget", "16")
port = str(port)
try:
    env = dict(os.environ, LILY=lily, DIR=model)
    for i, (lang, body) in enumerate(runnable):
        code = body.replace("127.0.0.1:8080", "127.0.0.1:" + port)
        first = body.strip().splitlines()[0][:60]
        if lang == "sh":
            lines = [l for l in code.splitlines() if not l.startswith("make ")]
            if not any(l.strip() for l in lines):
                continue
            script = 'lily() { "$LILY" "$@"; }\n' + re.sub(r"\bDIR\b", '"$DIR"', "\n".join(lines)) + "\n"
            r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env, stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=300)
        else:
            r = subprocess.run([sys.executable, "-c", code], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=300)
        check(r.returncode == 0 and r.stdout.strip() != b"", "example %d (%s) runs: %s" % (i + 1, lang, first),
              (r.stdout + r.stderr).decode(errors="replace")[-2000:])
        if lang == "python" and "stream=True" in code:
            req = urllib.request.Request("http://127.0.0.1:%s/v1/chat/completions" % port, data=json.dumps({
                "messages": [{"role": "user", "content": "Write a haiku about C."}], "max_tokens": 64}).encode(),
                headers={"Content-Type": "application/json"})
            msg = json.load(urllib.request.urlopen(req))["choices"][0]["message"]
            want = "[thinking] " + msg["reasoning_content"] + "\n[answer] " + msg["content"] + "\n"
            got = r.stdout.decode()
            check(msg["reasoning_content"] and msg["content"] and got == want,
                  "the streaming example prints the reasoning, then the answer",
                  "got %r\nwant %r" % (got[:400], want[:400]))
finally:
    srv.terminate()
    srv.wait()
sys.exit(t.finish())
PY
