#!/usr/bin/env bash
# test_synthetic_writer.sh — tools/write_synthetic.py writes the exact mlx-community 4-bit layout:
# for tiny-a's shape its tensor names, dtypes and shapes equal the fixture's (tests/data/tiny-a/mlx4),
# config.json carries the same `quantization` block, the output is deterministic from the seed, a
# sharded write (index + 2 files) loads too, and `lily info` / `lily eval` accept it with finite,
# O(1) logits. Runs in the suite's Python (lily_python: numpy); skips without numpy.
# usage: bash test_synthetic_writer.sh <path-to-lily> <tests/data dir>
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"
lily_test_init "$@"
ROOT=$(cd "$DATA/../.." && pwd)
WRITER="$ROOT/tools/write_synthetic.py"

lily_python "$LILY"
if [ -n "$PY_MISSING" ]; then
    echo "SKIP test_synthetic_writer: no numpy in the suite's Python (make deps installs python3-numpy)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi

CFG="$DATA/tiny-a/mlx4/config.json"
OUT="$TMP/tiny"
if "$PY" "$WRITER" "$OUT" --config "$CFG" --seed 7 >"$TMP/write.log" 2>&1; then ok "writer exits 0"; else fail "writer: $(cat "$TMP/write.log")"; fi
for f in config.json model.safetensors tokenizer.json; do
    [ -s "$OUT/$f" ] && ok "wrote $f" || fail "missing $f"
done
grep -q "expert load, layer 0" "$TMP/write.log" && ok "prints the expert-load histogram" || fail "no histogram: $(cat "$TMP/write.log")"

# layout: names, dtypes, shapes and the quantization block equal the mlx4 fixture's
if "$PY" - "$OUT" "$DATA/tiny-a/mlx4" <<'PY'
import json, struct, sys
def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"]) for k, v in h.items()}
ours, ref = header(sys.argv[1] + "/model.safetensors"), header(sys.argv[2] + "/model.safetensors")
bad = sorted(set(ours) ^ set(ref)) + [k for k in ref if k in ours and ours[k] != ref[k]]
for k in bad[:10]:
    print("  differs:", k, ours.get(k), ref.get(k))
c1, c2 = (json.load(open(d + "/config.json")) for d in sys.argv[1:3])
if c1["quantization"] != c2["quantization"]:
    print("  quantization differs:", c1["quantization"], c2["quantization"]); bad.append("quantization")
for key in ("hidden_size", "num_hidden_layers", "num_experts", "vocab_size", "layer_types", "head_dim"):
    if c1["text_config"][key] != c2["text_config"][key]:
        print("  text_config differs:", key); bad.append(key)
print(len(ref), "tensors compared")
sys.exit(1 if bad else 0)
PY
then ok "layout equals tests/data/tiny-a/mlx4"; else fail "layout differs from tests/data/tiny-a/mlx4"; fi

# deterministic from the seed; another seed gives other values
"$PY" "$WRITER" "$TMP/again" --config "$CFG" --seed 7 --no-tokenizer >/dev/null 2>&1
"$PY" "$WRITER" "$TMP/other" --config "$CFG" --seed 8 --no-tokenizer >/dev/null 2>&1
cmp -s "$OUT/model.safetensors" "$TMP/again/model.safetensors" && ok "same seed, same bytes" || fail "same seed gave different bytes"
cmp -s "$OUT/model.safetensors" "$TMP/other/model.safetensors" && fail "another seed gave the same bytes" || ok "another seed, other bytes"

# sharded: index + 2 files, same tensors
if "$PY" "$WRITER" "$TMP/sharded" --config "$CFG" --seed 7 --no-tokenizer --shard-limit-bytes 700000 >/dev/null 2>&1 &&
    [ -s "$TMP/sharded/model.safetensors.index.json" ] && [ -s "$TMP/sharded/model-00002-of-00002.safetensors" ]; then
    ok "sharded write with index"
else
    fail "sharded write: $(ls "$TMP/sharded" 2>&1)"
fi

# the loader accepts both
for d in "$OUT" "$TMP/sharded"; do
    if info=$("$LILY" info -m "$d" 2>&1); then
        if grep -q "layout *mlx" <<<"$info" && grep -q "router *8-bit in 4 layer" <<<"$info"; then
            ok "lily info $(basename "$d"): mlx layout, 8-bit routers"
        else
            fail "lily info $(basename "$d") output: $info"
        fi
    else
        fail "lily info $(basename "$d"): $info"
    fi
done

# a vocabulary past the Qwen3 tokenizer's ids (Qwen3.6's is 248,320): every id gets text (a random model draws
# any id, and one without text would stream nothing), and encoding is unchanged
"$PY" - "$CFG" "$TMP/cfg_big.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.get("text_config", c)["vocab_size"] = 152000
json.dump(c, open(sys.argv[2], "w"))
PY
if "$PY" "$WRITER" "$TMP/big" --config "$TMP/cfg_big.json" --seed 7 --sample-tokens 64 >"$TMP/big.log" 2>&1 &&
    "$PY" - "$TMP/big/tokenizer.json" "$ROOT/tests/data/tokenizers/qwen3/tokenizer.json" <<'PY'
import json, sys
big, ref = (json.load(open(p, encoding="utf-8")) for p in sys.argv[1:3])
ids = set(big["model"]["vocab"].values()) | {t["id"] for t in big["added_tokens"]}
added = {k: v for k, v in big["model"]["vocab"].items() if k not in ref["model"]["vocab"]}
ok = (ids == set(range(152000)) and all(k == "\u0120syn%d" % v for k, v in added.items()) and len(added) == 152000 - 151669
      and big["model"]["merges"] == ref["model"]["merges"] and big["added_tokens"] == ref["added_tokens"])
sys.exit(0 if ok else 1)
PY
then ok "a larger vocabulary: the tokenizer gets a word (' syn<id>') for each id past its own"
else fail "a larger vocabulary's tokenizer: $(tail -3 "$TMP/big.log")"; fi
mkdir -p "$TMP/big_ref"
cp "$TMP/big/config.json" "$TMP/big/tokenizer_config.json" "$TMP/big_ref/"
cp "$ROOT/tests/data/tokenizers/qwen3/tokenizer.json" "$TMP/big_ref/"
TEXT="Hello world syn151700 and 123 <think> résumé 你好 Ġsyn151669"
a=$(printf '%s' "$TEXT" | "$LILY" debug tokenize --model "$TMP/big" --ids 2>&1)
b=$(printf '%s' "$TEXT" | "$LILY" debug tokenize --model "$TMP/big_ref" --ids 2>&1)
[ -n "$a" ] && [ "$a" = "$b" ] && ok "the padded tokenizer encodes as the Qwen3 one ($a)" || fail "encodings differ: '$a' vs '$b'"

# lily eval runs it; logits finite with std in [0.1, 10] (activations O(1))
TOKS=$(seq -s, 1 37 500)
if out=$("$LILY" eval -m "$OUT" --tokens "$TOKS" --logits-out "$TMP/logits.f32" 2>&1); then
    if "$PY" - "$TMP/logits.f32" <<'PY'
import sys, numpy as np
x = np.fromfile(sys.argv[1], dtype=np.float32).reshape(-1, 512)
std = float(x.std())
print("  logits", x.shape, "std", std)
sys.exit(0 if np.isfinite(x).all() and 0.1 <= std <= 10 else 1)
PY
    then ok "lily eval: finite logits of O(1) scale"; else fail "lily eval logits out of range"; fi
    # sharded and single-file checkpoints hold the same weights
    if "$LILY" eval -m "$TMP/sharded" --tokens "$TOKS" --reference "$TMP/logits.f32" 2>&1 | grep -q "max |Δ|: 0$"; then
        ok "sharded checkpoint gives identical logits"
    else
        fail "sharded checkpoint logits differ: $("$LILY" eval -m "$TMP/sharded" --tokens "$TOKS" --reference "$TMP/logits.f32" 2>&1 | tail -3)"
    fi
else
    fail "lily eval: $out"
fi

finish
