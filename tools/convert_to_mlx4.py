#!/usr/bin/env python3
"""convert_to_mlx4.py — convert a Qwen3.5/3.6-MoE Hugging Face checkpoint into the MLX 4-bit layout, as mlx-lm does.

usage: python3 tools/convert_to_mlx4.py HF_DIR OUT_DIR [--compare MLX_DIR]

Input: HF_DIR/config.json and either model.safetensors or model.safetensors.index.json + shards. Tensor names
may use the published multimodal prefix `model.language_model.` or the text-only `model.` of a
`Qwen3_5MoeForCausalLM` save; a flat text config (model_type qwen3_5_moe_text) is wrapped into the published
nesting (`model_type qwen3_5_moe`, `text_config`).

What it does, in mlx-lm's order (docs/MODEL.md §2.3, §3; mlx-lm qwen3_5 `sanitize`, `convert.py`,
`utils.quantize_model`; mlx `backend/cpu/quantized.cpp` `quantize`):
  1. drops `mtp.*` and vision tensors;
  2. renames to `language_model.model.*` / `language_model.lm_head.*`;
  3. splits `mlp.experts.gate_up_proj` [E, 2I, H] into `mlp.switch_mlp.gate_proj.weight` (first I rows) and
     `up_proj.weight`; `mlp.experts.down_proj` -> `mlp.switch_mlp.down_proj.weight` (per-expert tensors
     `mlp.experts.{e}.*_proj.weight` are stacked);
  4. moves conv1d [C, 1, K] -> [C, K, 1];
  5. adds 1.0 to the zero-centred norms (input_layernorm, post_attention_layernorm, model.norm, q_norm, k_norm)
     in bf16 (the add happens in the tensor's dtype; bf16 inputs stay bf16, so (1+w) is rounded to bf16);
  6. casts every floating tensor to bf16 except `A_log` (keeps its source dtype);
  7. quantizes every linear / embedding / switch weight whose input dim is a multiple of 64: affine, group 64,
     4 bits; 8 bits for `mlp.gate` (router) and `shared_expert_gate`. Per group, in float32 from the bf16
     weights: s = max((max-min)/n, 1e-7), sign and edge from the larger-magnitude extreme, q0 = rint(edge/s),
     if q0 != 0 then s = edge/q0 and bias = edge else bias = 0; codes rint((w-bias)/s) clamped to [0, n] are
     computed with the float32 s and bias; scales and biases are stored rounded to bf16. Codes are packed into
     uint32, element j of each run at bits [bits*j, bits*j+bits) (low nibble first);
  8. writes model.safetensors (names sorted) and config.json with identical `quantization` and
     `quantization_config` blocks (default {group_size 64, bits 4, mode affine} plus one 8-bit entry per router
     and shared_expert_gate).
Needs numpy only (safetensors are read and written here, bf16 as raw uint16 bits).
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np

GROUP = 64
ZC_NORM_SUFFIXES = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                    ".q_norm.weight", ".k_norm.weight")
NP_DT = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "U32": np.uint32, "I32": np.int32,
         "I64": np.int64, "U8": np.uint8}


# ---------------------------------------------------------------- safetensors I/O (exact bytes)
def st_read(path):
    """Return {name: (dtype_str, np.ndarray)}; BF16 arrays are uint16 bit patterns."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        arr = np.frombuffer(raw[base + a: base + b], dtype=np.dtype(NP_DT[h["dtype"]]).newbyteorder("<"))
        out[name] = (h["dtype"], arr.reshape(h["shape"]).copy())
    return out


def st_write(path, tensors, metadata=None):
    """tensors: {name: (dtype_str, np.ndarray)}; written in sorted-name order, header padded to 8 bytes."""
    header, off, blobs = {}, 0, []
    for name in sorted(tensors):
        dt, arr = tensors[name]
        b = np.ascontiguousarray(arr).astype(np.dtype(NP_DT[dt]).newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    header["__metadata__"] = metadata or {"format": "mlx"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """float32 -> bf16 bits, round to nearest even (NaN kept quiet)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u >> 16) & 1) + 0x7FFF
    out = ((u + r) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return out


def to_f32(dt, a):
    if dt == "BF16":
        return bf16_to_f32(a)
    return a.astype(np.float32)


# ---------------------------------------------------------------- MLX affine quantization
def mlx_quantize(w, bits, group=GROUP):
    """w: float32 [..., out, in] (bf16-valued). Returns (packed uint32 [..., out, in*bits/32], scales bf16 bits,
    biases bf16 bits). mlx backend/cpu/quantized.cpp `quantize`, vectorised; every operation in float32."""
    w = np.asarray(w, np.float32)
    *lead, out, inn = w.shape
    assert inn % group == 0, w.shape
    n_bins = np.float32((1 << bits) - 1)
    g = w.reshape(*lead, out, inn // group, group)
    wmin, wmax = g.min(-1), g.max(-1)
    mask = np.abs(wmin) > np.abs(wmax)
    scale = np.maximum((wmax - wmin) / n_bins, np.float32(1e-7)).astype(np.float32)
    scale = np.where(mask, scale, -scale).astype(np.float32)
    edge = np.where(mask, wmin, wmax).astype(np.float32)
    q0 = np.rint(edge / scale).astype(np.float32)
    nz = q0 != 0
    scale = np.where(nz, edge / np.where(nz, q0, np.float32(1)), scale).astype(np.float32)
    bias = np.where(nz, edge, np.float32(0)).astype(np.float32)
    q = np.rint((g - bias[..., None]) / scale[..., None]).astype(np.float32)
    q = np.minimum(np.maximum(q, np.float32(0)), n_bins).astype(np.uint32)
    per = 32 // bits
    qf = q.reshape(*lead, out, inn // per, per)
    packed = np.zeros(qf.shape[:-1], np.uint32)
    for j in range(per):
        packed |= qf[..., j] << np.uint32(bits * j)
    return packed, f32_to_bf16(scale), f32_to_bf16(bias)


def mlx_dequantize(packed, scales_bits, biases_bits, bits, group=GROUP):
    """Inverse for checks: float32 [..., out, in] = float(s)*q + float(b)."""
    per = 32 // bits
    mask = np.uint32((1 << bits) - 1)
    q = np.stack([(packed >> np.uint32(bits * j)) & mask for j in range(per)], axis=-1)
    q = q.reshape(*packed.shape[:-1], packed.shape[-1] * per).astype(np.float32)
    s = np.repeat(bf16_to_f32(scales_bits), group, axis=-1)
    b = np.repeat(bf16_to_f32(biases_bits), group, axis=-1)
    return s * q + b


# ---------------------------------------------------------------- conversion
def load_hf(hf_dir):
    hf_dir = Path(hf_dir)
    idx = hf_dir / "model.safetensors.index.json"
    files = sorted(set(json.loads(idx.read_text())["weight_map"].values())) if idx.exists() else ["model.safetensors"]
    tensors = {}
    for f in files:
        tensors.update(st_read(hf_dir / f))
    return tensors


def canonical_name(k):
    """HF name -> name under `model.` / `lm_head.` (text model), or None to drop."""
    if k.startswith("mtp.") or k.startswith("model.visual.") or k.startswith("visual."):
        return None
    if k.startswith("model.language_model."):
        return "model." + k[len("model.language_model."):]
    if k.startswith("model.") or k.startswith("lm_head."):
        return k
    raise SystemExit(f"unexpected tensor name {k}")


def wrap_config(cfg):
    """Published nesting: top-level qwen3_5_moe with text_config (keeps an already nested config as is)."""
    if "text_config" in cfg:
        return json.loads(json.dumps(cfg))
    text = {k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version", "_name_or_path")}
    text["model_type"] = "qwen3_5_moe_text"
    text.setdefault("dtype", "bfloat16")
    if text.get("dtype") in ("float32", "float16"):
        text["dtype"] = "bfloat16"
    return {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
            "text_config": text, "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
            "transformers_version": cfg.get("transformers_version", "")}


def convert(hf_dir, out_dir):
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    src = load_hf(hf_dir)
    cfg = wrap_config(json.loads((hf_dir / "config.json").read_text()))
    tie = bool(cfg.get("tie_word_embeddings") or cfg["text_config"].get("tie_word_embeddings"))
    sd = {}
    for k, v in src.items():
        c = canonical_name(k)
        if c is not None:
            sd[c] = v
    # stack per-expert tensors, if any, into the fused names
    per_expert = {}
    for k in list(sd):
        parts = k.split(".")
        if ".mlp.experts." in k and len(parts) > 5 and parts[-3].isdigit():
            pre = k[: k.index(".mlp.experts.")] + ".mlp.switch_mlp." + parts[-2]
            per_expert.setdefault(pre, {})[int(parts[-3])] = sd.pop(k)
    out, qcfg = {}, {"group_size": GROUP, "bits": 4, "mode": "affine"}

    def bf16_of(dt, a):
        return a if dt == "BF16" else f32_to_bf16(to_f32(dt, a))

    def put_linear(name, bits16):
        """name without `.weight`; bits16: bf16 bit patterns [..., out, in]."""
        if bits16.shape[-1] % GROUP:
            out[name + ".weight"] = ("BF16", bits16)
            return
        bits = 8 if (name.endswith("mlp.gate") or name.endswith("shared_expert_gate")) else 4
        packed, s, b = mlx_quantize(bf16_to_f32(bits16), bits)
        out[name + ".weight"] = ("U32", packed)
        out[name + ".scales"] = ("BF16", s)
        out[name + ".biases"] = ("BF16", b)
        if bits != 4:
            qcfg[name] = {"group_size": GROUP, "bits": bits}

    for pre, d in per_expert.items():
        stacked = np.stack([bf16_of(*d[e]) for e in sorted(d)])
        put_linear("language_model." + pre, stacked)
    for k in sorted(sd):
        dt, a = sd[k]
        base = "language_model." + k
        if k.startswith("lm_head.") and tie:
            continue
        if k.endswith("mlp.experts.gate_up_proj"):
            a16 = bf16_of(dt, a)
            half = a16.shape[1] // 2
            pre = base[: -len("experts.gate_up_proj")] + "switch_mlp."
            put_linear(pre + "gate_proj", a16[:, :half, :])
            put_linear(pre + "up_proj", a16[:, half:, :])
        elif k.endswith("mlp.experts.down_proj"):
            put_linear(base[: -len("experts.down_proj")] + "switch_mlp.down_proj", bf16_of(dt, a))
        elif k.endswith("conv1d.weight"):
            a16 = bf16_of(dt, a)
            if a16.shape[-1] != 1:
                a16 = np.moveaxis(a16, 2, 1)
            out[base] = ("BF16", np.ascontiguousarray(a16))
        elif k.endswith("A_log"):
            out[base] = (dt, a)
        elif a.ndim == 1:
            if k.endswith(ZC_NORM_SUFFIXES):
                if dt == "BF16":  # add in bf16: result rounded to bf16
                    a16 = f32_to_bf16(bf16_to_f32(a) + np.float32(1.0))
                else:             # add in the source dtype, then the dtype cast
                    a16 = f32_to_bf16((to_f32(dt, a) + np.float32(1.0)).astype(np.float32))
                out[base] = ("BF16", a16)
            else:
                out[base] = ("BF16", bf16_of(dt, a))
        elif k.endswith(".weight") and a.ndim == 2:
            put_linear(base[: -len(".weight")], bf16_of(dt, a))
        else:
            raise SystemExit(f"unhandled tensor {k} {a.shape}")
    st_write(out_dir / "model.safetensors", out)
    cfg["quantization"] = qcfg
    cfg["quantization_config"] = json.loads(json.dumps(qcfg))
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def compare(mine_dir, ref_dir):
    """Tensor-by-tensor comparison; returns a report dict."""
    a = st_read(Path(mine_dir) / "model.safetensors")
    b = st_read(Path(ref_dir) / "model.safetensors")
    rep = {"only_mine": sorted(set(a) - set(b)), "only_ref": sorted(set(b) - set(a)), "tensors": {}}
    total_bytes = diff_bytes = 0
    for k in sorted(set(a) & set(b)):
        (da, xa), (db, xb) = a[k], b[k]
        if da != db or xa.shape != xb.shape:
            rep["tensors"][k] = f"dtype/shape {da}{list(xa.shape)} vs {db}{list(xb.shape)}"
            continue
        ba, bb = xa.tobytes(), xb.tobytes()
        nd = int(np.count_nonzero(np.frombuffer(ba, np.uint8) != np.frombuffer(bb, np.uint8)))
        total_bytes += len(ba)
        diff_bytes += nd
        if nd:
            rep["tensors"][k] = f"{nd}/{len(ba)} bytes differ"
    rep["bytes_total"], rep["bytes_differ"] = total_bytes, diff_bytes
    # dequantized agreement for quantized modules
    worst = 0.0
    for k in sorted(set(a) & set(b)):
        if k.endswith(".scales"):
            m = k[: -len(".scales")]
            wa, wb = a[m + ".weight"][1], b[m + ".weight"][1]
            if wa.shape != wb.shape:
                continue
            bits = 32 * wa.shape[-1] // (a[k][1].shape[-1] * GROUP)
            qa = mlx_dequantize(wa, a[k][1], a[m + ".biases"][1], bits)
            qb = mlx_dequantize(wb, b[k][1], b[m + ".biases"][1], bits)
            worst = max(worst, float(np.abs(qa - qb).max() / (np.abs(qb).max() + 1e-12)))
    rep["max_rel_dequant_diff"] = worst
    return rep


def main():
    args = sys.argv[1:]
    if len(args) not in (2, 4) or (len(args) == 4 and args[2] != "--compare"):
        sys.exit(__doc__)
    out = convert(args[0], args[1])
    print(f"wrote {args[1]}: {len(out)} tensors")
    if len(args) == 4:
        rep = compare(args[1], args[3])
        print(json.dumps(rep, indent=1))


if __name__ == "__main__":
    main()
