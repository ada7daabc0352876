#!/usr/bin/env bash
# test_default_model.sh — the bundled default model (models/lily-tiny) is the trained one: lily's argmax at
# every position of prompt + the 32 greedy tokens recorded from transformers on the same (dequantized) weights
# (tests/data/default_model_greedy.json, made by tools/make_default_model_reference.py) equals the next
# recorded token. Checked twice: all tokens in one prefill, and the prompt as prefill then the 32 tokens one
# at a time through the decode path. Also checks the model directory is complete and under 20 MB.
# usage: bash test_default_model.sh <path-to-lily> <tests/data dir>
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"
LILY=$1
DATA=$2
lily_python "$LILY"
MODEL="$DATA/../../models/lily-tiny"
REF="$DATA/default_model_greedy.json"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0

for f in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja \
         model.safetensors README.md; do
    [ -f "$MODEL/$f" ] || { echo "FAIL missing $MODEL/$f"; fails=$((fails + 1)); }
done
size=$(du -cb "$MODEL"/* | tail -1 | cut -f1)
if [ "$size" -gt 20000000 ]; then echo "FAIL model directory is $size bytes (> 20 MB)"; fails=$((fails + 1)); fi

# tokens to feed: prompt + all recorded outputs but the last
"$PY" - "$REF" "$TMP" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
feed = r["prompt_ids"] + r["output_ids"][:-1]
open(sys.argv[2] + "/feed.txt", "w").write(",".join(map(str, feed)))
open(sys.argv[2] + "/nprompt.txt", "w").write(str(len(r["prompt_ids"])))
PY
FEED=$(cat "$TMP/feed.txt")
NP=$(cat "$TMP/nprompt.txt")

check() { # name, extra eval options...
    local name=$1; shift
    local out
    if ! out=$("$LILY" eval --model "$MODEL" --tokens "$FEED" --logits-out "$TMP/logits.f32" "$@" 2>&1); then
        echo "FAIL $name: lily eval exited non-zero: $out"; fails=$((fails + 1)); return
    fi
    if "$PY" - "$REF" "$TMP/logits.f32" <<'PY'; then echo "ok   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
import array, json, sys
r = json.load(open(sys.argv[1]))
prompt, outs = r["prompt_ids"], r["output_ids"]
n = len(prompt) + len(outs) - 1
a = array.array("f")
a.frombytes(open(sys.argv[2], "rb").read())
if sys.byteorder != "little":
    a.byteswap()
vocab = len(a) // n
assert vocab * n == len(a), (len(a), n)
bad = []
for i, want in enumerate(outs):
    row = a[(len(prompt) - 1 + i) * vocab:(len(prompt) + i) * vocab]
    got = max(range(vocab), key=row.__getitem__)
    if got != want:
        bad.append((i, got, want))
if bad:
    print("  mismatches (step, lily argmax, reference):", bad[:8], "of", len(bad))
    sys.exit(1)
PY
}

check "one prefill: 32 teacher-forced greedy tokens match transformers"
check "prefill prompt, decode 32: greedy tokens match transformers" --decode-from "$NP"

# Without -m, run / bench / serve load the bundled model and say so in one line on stderr.
default_line() { # name, command...: passes when stderr names the bundled default model
    local name=$1; shift
    local err
    err=$(env -u LILY_MODEL "$@" 2>&1 >/dev/null) || true
    if grep -q "using the bundled default model .*models/lily-tiny" <<<"$err"; then echo "ok   $name"
    else echo "FAIL $name: $err" | head -5; fails=$((fails + 1)); fi
}
default_line "run without -m" "$LILY" run --raw -p "The Python interpreter" -n 4 --temp 0
default_line "bench without -m" "$LILY" bench -p 16 -d none -n 0 -r 1 --no-warmup
default_line "serve without -m" timeout 20 "$LILY" serve --port 1 --host 256.0.0.1

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "all passed"
