#!/usr/bin/env bash
# test_convert_mlx4.sh — tools/convert_to_mlx4.py (the converter that made models/lily-tiny) against the
# shared fixture: converting tests/data/tiny-a/hf must give tiny-a/mlx4's exact tensor names, dtypes and
# shapes and the same config.json; unquantized tensors byte-identical (norms within one bf16 step: the fixture
# added 1 to the fp32 originals, the converter to the stored bf16 values); quantized weights within one
# quantization step (plus bf16 rounding of scale and bias) of the HF weights and of the fixture's. Plus one
# hand-computed group: 0, 0.1, ..., 1.5 (x4) quantizes with a NEGATIVE scale -0.1, bias 1.5, codes 15..0, packed low nibble first
# (word 0 = 0x89ABCDEF). Runs in the suite's Python (lily_python: numpy).
# usage: bash test_convert_mlx4.sh <path-to-lily> <tests/data dir>
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"
DATA=$2
lily_python "$1"
TOOLS="$DATA/../../tools"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$PY" "$TOOLS/convert_to_mlx4.py" "$DATA/tiny-a/hf" "$TMP/mlx4" >/dev/null
"$PY" - "$TOOLS" "$DATA/tiny-a" "$TMP/mlx4" <<'PY'
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from convert_to_mlx4 import st_read, bf16_to_f32, mlx_dequantize, mlx_quantize, load_hf, GROUP
fix, mine_dir = sys.argv[2], sys.argv[3]
fails = []

# hand-computed group
w = np.tile(np.arange(16, dtype=np.float32) / np.float32(10), 4)[None, :]
packed, s, b = mlx_quantize(w, 4)
if int(packed[0, 0]) != 0x89ABCDEF or int(s[0, 0]) != 0xBDCD or int(b[0, 0]) != 0x3FC0:
    fails.append(f"hand group: word {int(packed[0, 0]):#x} scale {int(s[0, 0]):#x} bias {int(b[0, 0]):#x}")

ref = st_read(f"{fix}/mlx4/model.safetensors")
got = st_read(f"{mine_dir}/model.safetensors")
if sorted(ref) != sorted(got):
    fails.append(f"names differ: {sorted(set(ref) ^ set(got))[:6]}")
if json.load(open(f"{fix}/mlx4/config.json")) != json.load(open(f"{mine_dir}/config.json")):
    fails.append("config.json differs")
hf = {k.replace("model.language_model.", "language_model.model.").replace("lm_head.", "language_model.lm_head."): v
      for k, v in load_hf(f"{fix}/hf").items()}
ndiff = 0
for k in sorted(set(ref) & set(got)):
    (dr, r), (dg, g) = ref[k], got[k]
    if dr != dg or r.shape != g.shape:
        fails.append(f"{k}: {dg}{list(g.shape)} vs fixture {dr}{list(r.shape)}")
        continue
    ndiff += int(np.count_nonzero(r.view(np.uint8) != g.view(np.uint8)))
    base = k[: -len(".weight")] if k.endswith(".weight") else None
    if base and base + ".scales" in ref:
        sr, br = ref[base + ".scales"][1], ref[base + ".biases"][1]
        sg, bg = got[base + ".scales"][1], got[base + ".biases"][1]
        bits = 32 * r.shape[-1] // (sr.shape[-1] * GROUP)
        wr, wg = mlx_dequantize(r, sr, br, bits), mlx_dequantize(g, sg, bg, bits)
        n = (1 << bits) - 1

        def bound(sc, bi):
            """|dequantized - source| for MLX: one step (half for rounding; a whole one where rounding q0 = edge/s
            pushed the other extreme past code n and it was clamped), plus the bf16 rounding of the stored
            scale (times the code, at most n) and bias (codes come from the unrounded fp32 scale and bias)."""
            sc = np.repeat(np.abs(bf16_to_f32(sc)), GROUP, axis=-1)
            bi = np.repeat(np.abs(bf16_to_f32(bi)), GROUP, axis=-1)
            return 1.01 * (sc + (n * sc + bi) * 2.0 ** -8) + 1e-7

        if not np.all(np.abs(wr - wg) <= bound(sr, br) + bound(sg, bg) + np.abs(wg) * 2.0 ** -7):
            fails.append(f"{k}: dequantized differs from the fixture by more than both rounding bounds")
        # against the HF weights this module came from
        if ".switch_mlp." in k:
            fused = hf[k.replace("switch_mlp.gate_proj.weight", "experts.gate_up_proj")
                        .replace("switch_mlp.up_proj.weight", "experts.gate_up_proj")
                        .replace("switch_mlp.down_proj.weight", "experts.down_proj")]
            src = bf16_to_f32(fused[1])
            half = src.shape[1] // 2
            src = src[:, :half] if "gate_proj" in k else src[:, half:] if "up_proj" in k else src
        else:
            src = bf16_to_f32(hf[k][1])
        if not np.all(np.abs(wg - src) <= bound(sg, bg)):
            fails.append(f"{k}: dequantized is further from the HF weight than MLX rounding allows")
    elif k.endswith((".scales", ".biases")) or (base and base + ".scales" in ref):
        pass
    elif k.endswith(("layernorm.weight", "model.norm.weight", "q_norm.weight", "k_norm.weight")):
        d = np.abs(bf16_to_f32(r) - bf16_to_f32(g))
        if not np.all(d <= np.abs(bf16_to_f32(r)) * 2.0 ** -7 + 1e-12):
            fails.append(f"{k}: norm differs by more than one bf16 step")
    elif r.tobytes() != g.tobytes():
        fails.append(f"{k}: unquantized tensor not byte-identical")
print(f"{len(got)} tensors; {ndiff} of {sum(v[1].nbytes for v in ref.values())} bytes differ from the fixture "
      "(it quantized the fp32 originals, the converter the stored bf16 weights)")
for f in fails:
    print("FAIL", f)
sys.exit(1 if fails else 0)
PY
echo "all passed"
