#!/usr/bin/env python3
"""write_synthetic.py — a random but well-scaled checkpoint in the exact mlx-community 4-bit layout.

For benchmarks of full-size shapes without the real weights (MODEL.md §2.3 and §3):
  * names `language_model.model.layers.N.…` / `language_model.lm_head`, experts as
    `mlp.switch_mlp.{gate,up,down}_proj` [E, out, in];
  * quantized modules as `.weight` U32 [..., out, in*bits/32] (low nibble first) + bf16 `.scales` /
    `.biases` [..., out, in/64]; 4 bits, group 64, except the router `mlp.gate` and
    `mlp.shared_expert_gate` at 8 bits (per-module overrides in config.json `quantization`);
  * norms stored as (1 + w) in bf16, `linear_attn.norm.weight` plain bf16, conv1d bf16 [C, K, 1],
    `A_log` f32, `dt_bias` bf16;
  * shards of at most 5 GiB + model.safetensors.index.json, config.json (HF nesting with `text_config`,
    `quantization` and `quantization_config` at the root), and the Qwen3 tokenizer.json (given a word for each
    id past its own when the vocabulary is larger: write_tokenizer).

Defaults give Qwen3.6-35B-A3B (MODEL.md §1.2, ~19.4 GB); `--config FILE` takes the shape of any config.json
(nested or flat), e.g. tests/data/tiny-a/mlx4/config.json.

Values: packed words are uniform random, so each 4-bit code q has mean 7.5 and std sqrt(255/12) ~ 4.61; a
group's scale s = sigma / 4.61 (jittered +-25% per group) and bias -7.5 s make the dequantized weights
zero-mean with std sigma = 1/sqrt(in_features) (output projections: also / sqrt(2 * n_layers), so the
residual stream stays O(1) through all layers). Router rows are iid, so routing spreads over the experts;
the script checks that on a sample prompt and prints the expert-load histogram of layer 0.

Deterministic from --seed: every tensor draws from its own generator, seeded by (seed, tensor index).
Needs numpy only. Usage:
    python3 tools/write_synthetic.py OUT_DIR [--config config.json] [--seed 0] [--no-tokenizer]
                                     [--shard-limit-bytes N] [--sample-tokens N]
"""
import argparse
import json
import math
import os
import queue
import shutil
import struct
import sys
import threading
import time

import numpy as np

SHARD_LIMIT = 5 << 30  # bytes per shard (mlx_lm.utils.save: max_file_size_gb = 5)
GROUP_SIZE = 64
HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER_DIR = os.path.join(HERE, "..", "tests", "data", "tokenizers", "qwen3")

# Qwen3.6-35B-A3B text_config (MODEL.md §1.2).
QWEN36_35B_A3B = {
    "vocab_size": 248320,
    "hidden_size": 2048,
    "num_hidden_layers": 40,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "full_attention_interval": 4,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000000.0,
    "partial_rotary_factor": 0.25,
    "mrope_section": [11, 11, 10],
    "eos_token_id": 248044,
    "bos_token_id": 248044,
}


def bf16_bits(x):
    """float32 array -> uint16 bf16 bit patterns, round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def read_shape(path):
    """The text fields of a config.json (nested `text_config` or flat), with 35B defaults for gaps."""
    with open(path) as f:
        root = json.load(f)
    tc = root.get("text_config", root)
    shape = dict(QWEN36_35B_A3B)
    for k in shape:
        if k in tc:
            shape[k] = tc[k]
    rp = tc.get("rope_parameters") or tc.get("rope_scaling") or {}
    if "rope_theta" in rp:
        shape["rope_theta"] = rp["rope_theta"]
    if "partial_rotary_factor" in rp:
        shape["partial_rotary_factor"] = rp["partial_rotary_factor"]
    if "mrope_section" in rp:
        shape["mrope_section"] = rp["mrope_section"]
    if "layer_types" in tc:
        shape["layer_types"] = list(tc["layer_types"])
    if "eos_token_id" in tc:
        shape["eos_token_id"] = tc["eos_token_id"]
    shape["bos_token_id"] = tc.get("bos_token_id")
    return shape


def layer_types(shape):
    if "layer_types" in shape:
        return shape["layer_types"]
    every = shape["full_attention_interval"]
    return ["full_attention" if (i + 1) % every == 0 else "linear_attention"
            for i in range(shape["num_hidden_layers"])]


def make_config(shape, quant):
    lt = layer_types(shape)
    text = {
        "model_type": "qwen3_5_moe_text",
        "dtype": "bfloat16",
        "vocab_size": shape["vocab_size"],
        "hidden_size": shape["hidden_size"],
        "num_hidden_layers": shape["num_hidden_layers"],
        "layer_types": lt,
        "full_attention_interval": shape["full_attention_interval"],
        "num_attention_heads": shape["num_attention_heads"],
        "num_key_value_heads": shape["num_key_value_heads"],
        "head_dim": shape["head_dim"],
        "attn_output_gate": True,
        "attention_bias": False,
        "linear_num_key_heads": shape["linear_num_key_heads"],
        "linear_num_value_heads": shape["linear_num_value_heads"],
        "linear_key_head_dim": shape["linear_key_head_dim"],
        "linear_value_head_dim": shape["linear_value_head_dim"],
        "linear_conv_kernel_dim": shape["linear_conv_kernel_dim"],
        "mamba_ssm_dtype": "float32",
        "num_experts": shape["num_experts"],
        "num_experts_per_tok": shape["num_experts_per_tok"],
        "moe_intermediate_size": shape["moe_intermediate_size"],
        "shared_expert_intermediate_size": shape["shared_expert_intermediate_size"],
        "router_aux_loss_coef": 0.001,
        "hidden_act": "silu",
        "rms_norm_eps": shape["rms_norm_eps"],
        "max_position_embeddings": shape["max_position_embeddings"],
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": shape["rope_theta"],
            "partial_rotary_factor": shape["partial_rotary_factor"],
            "mrope_section": shape["mrope_section"],
            "mrope_interleaved": True,
        },
        "partial_rotary_factor": shape["partial_rotary_factor"],
        "tie_word_embeddings": False,
        "eos_token_id": shape["eos_token_id"],
        "bos_token_id": shape["bos_token_id"],
        "pad_token_id": None,
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
    }
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": text,
        "tie_word_embeddings": False,
        "synthetic": "random weights from tools/write_synthetic.py (not a trained model)",
        "quantization": quant,
        "quantization_config": quant,
    }


class Tensor:
    """One stored tensor: name, dtype ("U32", "BF16", "F32"), shape, and how to make its bytes."""

    def __init__(self, name, dtype, shape, make, seed_index):
        self.name, self.dtype, self.shape, self.make = name, dtype, list(shape), make
        self.seed_index = seed_index  # tensors of one module (.scales, .biases) share it

    @property
    def nbytes(self):
        return int(np.prod(self.shape)) * (2 if self.dtype == "BF16" else 4)


def plan(shape):
    """Every tensor of the checkpoint in model order, plus the `quantization` block."""
    H = shape["hidden_size"]
    L = shape["num_hidden_layers"]
    E = shape["num_experts"]
    I_moe = shape["moe_intermediate_size"]
    I_sh = shape["shared_expert_intermediate_size"]
    nh, nkv, hd = shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"]
    hk, hv = shape["linear_num_key_heads"], shape["linear_num_value_heads"]
    dk, dv, K = shape["linear_key_head_dim"], shape["linear_value_head_dim"], shape["linear_conv_kernel_dim"]
    key_dim, value_dim = hk * dk, hv * dv
    conv_dim = 2 * key_dim + value_dim
    out_scale = 1.0 / math.sqrt(2.0 * L)  # output projections: keep the residual stream O(1)

    tensors = []
    quant = {"group_size": GROUP_SIZE, "bits": 4, "mode": "affine"}
    counter = [0]

    def add(name, dtype, shp, make, same_module=False):
        if not same_module:
            counter[0] += 1
        tensors.append(Tensor(name, dtype, shp, make, counter[0]))

    def quantized(prefix, lead, out_f, in_f, bits=4, sigma_mul=1.0):
        if in_f % GROUP_SIZE:
            raise SystemExit(f"{prefix}: in_features {in_f} is not a multiple of {GROUP_SIZE}")
        sigma = sigma_mul / math.sqrt(in_f)
        per_word = 32 // bits
        rows = int(np.prod(lead)) * out_f if lead else out_f
        state = {}

        def scales_and_biases(rng, which):
            # One (scale, bias) pair per group; drawn once for .scales and .biases together.
            if "s" not in state:
                q_std = math.sqrt(((1 << bits) ** 2 - 1) / 12.0)
                q_mean = ((1 << bits) - 1) / 2.0
                s = (sigma / q_std) * rng.uniform(0.75, 1.25, size=(rows, in_f // GROUP_SIZE)).astype(np.float32)
                s_bits = bf16_bits(s)
                b_bits = bf16_bits(-q_mean * bf16_to_f32(s_bits))
                state["s"], state["b"], state["left"] = s_bits, b_bits, 2
            out = state[which]
            state["left"] -= 1
            if not state["left"]:
                state.clear()
            return out

        add(prefix + ".weight", "U32", list(lead) + [out_f, in_f // per_word], "random_words")
        add(prefix + ".scales", "BF16", list(lead) + [out_f, in_f // GROUP_SIZE],
            lambda rng: scales_and_biases(rng, "s"))
        add(prefix + ".biases", "BF16", list(lead) + [out_f, in_f // GROUP_SIZE],
            lambda rng: scales_and_biases(rng, "b"), same_module=True)
        if bits != 4:
            quant[prefix] = {"group_size": GROUP_SIZE, "bits": bits}

    def norm_1p(name, n):
        add(name, "BF16", [n], lambda rng: bf16_bits(1.0 + 0.02 * rng.standard_normal(n).astype(np.float32)))

    p = "language_model.model."
    quantized(p + "embed_tokens", [], shape["vocab_size"], H)
    for i, kind in enumerate(layer_types(shape)):
        lp = f"{p}layers.{i}."
        norm_1p(lp + "input_layernorm.weight", H)
        norm_1p(lp + "post_attention_layernorm.weight", H)
        if kind == "full_attention":
            a = lp + "self_attn."
            quantized(a + "q_proj", [], nh * hd * 2, H)
            quantized(a + "k_proj", [], nkv * hd, H)
            quantized(a + "v_proj", [], nkv * hd, H)
            quantized(a + "o_proj", [], H, nh * hd, sigma_mul=out_scale)
            norm_1p(a + "q_norm.weight", hd)
            norm_1p(a + "k_norm.weight", hd)
        else:
            a = lp + "linear_attn."
            quantized(a + "in_proj_qkv", [], conv_dim, H)
            quantized(a + "in_proj_z", [], value_dim, H)
            quantized(a + "in_proj_b", [], hv, H)
            quantized(a + "in_proj_a", [], hv, H)
            quantized(a + "out_proj", [], H, value_dim, sigma_mul=out_scale)
            add(a + "conv1d.weight", "BF16", [conv_dim, K, 1],
                lambda rng, n=conv_dim * K: bf16_bits(rng.standard_normal(n).astype(np.float32) / math.sqrt(K)))
            # A in [1, 16] and dt in [1e-3, 1e-1] as at initialisation (transformers Qwen3_5MoeGatedDeltaNet).
            add(a + "A_log", "F32", [hv], lambda rng, n=hv: np.log(rng.uniform(1.0, 16.0, n)).astype(np.float32))
            add(a + "dt_bias", "BF16", [hv], lambda rng, n=hv: bf16_bits(np.log(np.expm1(
                np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), n)))).astype(np.float32)))
            add(a + "norm.weight", "BF16", [dv],
                lambda rng, n=dv: bf16_bits(1.0 + 0.02 * rng.standard_normal(n).astype(np.float32)))
        m = lp + "mlp."
        quantized(m + "gate", [], E, H, bits=8)
        quantized(m + "switch_mlp.gate_proj", [E], I_moe, H)
        quantized(m + "switch_mlp.up_proj", [E], I_moe, H)
        quantized(m + "switch_mlp.down_proj", [E], H, I_moe, sigma_mul=out_scale)
        quantized(m + "shared_expert.gate_proj", [], I_sh, H)
        quantized(m + "shared_expert.up_proj", [], I_sh, H)
        quantized(m + "shared_expert.down_proj", [], H, I_sh, sigma_mul=out_scale)
        quantized(m + "shared_expert_gate", [], 1, H, bits=8)
    norm_1p(p + "norm.weight", H)
    quantized("language_model.lm_head", [], shape["vocab_size"], H)
    return tensors, quant


def shard(tensors, limit=SHARD_LIMIT):
    """Split in model order into shards of at most SHARD_LIMIT bytes; within a shard 4-byte dtypes come
    first so every tensor starts aligned to its element size."""
    shards, cur, size = [], [], 0
    for t in tensors:
        if cur and size + t.nbytes > limit:
            shards.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += t.nbytes
    if cur:
        shards.append(cur)
    return [sorted(s, key=lambda t: 0 if t.dtype in ("U32", "F32") else 1) for s in shards]


def write_shard(path, tensors, seed, progress):
    header, off = {}, 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, off + t.nbytes]}
        off += t.nbytes
    header["__metadata__"] = {"format": "mlx"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    chunk_words = 1 << 24  # 64 MiB of packed words per draw
    # A writer thread overlaps the disk writes with drawing the next block (both release the GIL).
    blocks = queue.Queue(maxsize=3)
    failure = []

    def writer(f):
        while True:
            b = blocks.get()
            if b is None:
                return
            try:
                if not failure:
                    f.write(b)
            except OSError as e:  # reported once the producer is done
                failure.append(e)

    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        th = threading.Thread(target=writer, args=(f,), daemon=True)
        th.start()
        try:
            for t in tensors:
                rng = np.random.Generator(np.random.PCG64([seed, t.seed_index]))
                if t.make == "random_words":
                    left = t.nbytes // 4
                    while left and not failure:
                        n = min(left, chunk_words)
                        words = rng.bit_generator.random_raw((n + 1) // 2).view(np.uint32)[:n]
                        blocks.put(memoryview(words))
                        left -= n
                        progress(4 * n)
                else:
                    arr = np.ascontiguousarray(t.make(rng))
                    assert arr.nbytes == t.nbytes, (t.name, arr.nbytes, t.nbytes)
                    blocks.put(arr.tobytes())
                    progress(arr.nbytes)
        finally:
            blocks.put(None)
            th.join()
    if failure:
        raise failure[0]
    return off + 8 + len(h)


def read_tensor(out_dir, index, name):
    """A stored tensor back from disk as numpy (memory-mapped): checks what was written."""
    fname = index[name]
    path = os.path.join(out_dir, fname)
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    e = hdr[name]
    dt = {"U32": np.uint32, "BF16": np.uint16, "F32": np.float32}[e["dtype"]]
    b, _ = e["data_offsets"]
    return np.memmap(path, dtype=dt, mode="r", offset=8 + n + b, shape=tuple(e["shape"]))


def dequant_rows(w, s, b, bits, rows):
    """MLX affine dequantize (MODEL.md §3) of the given rows: w = float(scale) * q + float(bias)."""
    words = np.asarray(w[rows], dtype=np.uint32)
    per = 32 // bits
    mask = (1 << bits) - 1
    q = np.stack([(words >> (bits * j)) & mask for j in range(per)], axis=-1).reshape(len(rows), -1)
    sc = np.repeat(bf16_to_f32(np.asarray(s[rows])), GROUP_SIZE, axis=1)
    bi = np.repeat(bf16_to_f32(np.asarray(b[rows])), GROUP_SIZE, axis=1)
    return sc * q.astype(np.float32) + bi


def expert_load(out_dir, shape, index, seed, n_tokens=512):
    """Route a sample prompt (random token ids) through layer 0's router: embedding -> RMSNorm ->
    (the mixer is skipped) -> RMSNorm -> router softmax -> top-k. Returns per-expert counts."""
    rng = np.random.default_rng(seed + 1)
    V, E, k = shape["vocab_size"], shape["num_experts"], shape["num_experts_per_tok"]
    tokens = np.sort(rng.integers(0, V, size=n_tokens))
    p = "language_model.model."
    x = dequant_rows(read_tensor(out_dir, index, p + "embed_tokens.weight"),
                     read_tensor(out_dir, index, p + "embed_tokens.scales"),
                     read_tensor(out_dir, index, p + "embed_tokens.biases"), 4, tokens)
    eps = shape["rms_norm_eps"]
    for norm in ("input_layernorm", "post_attention_layernorm"):
        w = bf16_to_f32(np.asarray(read_tensor(out_dir, index, f"{p}layers.0.{norm}.weight")))
        x = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps) * w
    g = f"{p}layers.0.mlp.gate."
    router = dequant_rows(read_tensor(out_dir, index, g + "weight"), read_tensor(out_dir, index, g + "scales"),
                          read_tensor(out_dir, index, g + "biases"), 8, np.arange(E))
    logits = x @ router.T
    top = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    return np.bincount(top.ravel(), minlength=E), float(np.std(x)), float(np.std(logits))


def print_histogram(counts, k, n_tokens):
    mean = counts.mean()
    print(f"expert load, layer 0, {n_tokens} sample tokens x top-{k}: mean {mean:.2f}, "
          f"max {counts.max()} ({counts.max() / mean:.2f}x mean), min {counts.min()}, "
          f"experts used {np.count_nonzero(counts)}/{len(counts)}")
    lo, hi = int(counts.min()), int(counts.max()) + 1
    edges = np.linspace(lo, hi, min(11, hi - lo + 1)).astype(int)
    edges = np.unique(edges)
    hist, _ = np.histogram(counts, bins=edges)
    width = max(1, hist.max())
    for lo, hi, h in zip(edges[:-1], edges[1:], hist):
        print(f"  {lo:4d}-{hi - 1:<4d} tokens | {'#' * int(round(40 * h / width)):<40} {h} experts")


def write_tokenizer(src, dst, vocab_size):
    """The Qwen3 tokenizer.json (ids 0..151668), with a word for every id up to vocab_size - 1 when the model's
    vocabulary is larger (Qwen3.6's 248,320): a random model draws any id, and an id without text would stream
    nothing, so a served reply's first text (time to first token at the client) would wait for a later
    token about 39% of the time. The added words (" syn<id>", in the byte-level alphabet: "Ġsyn<id>") are
    plain text that no input encodes to (no merge makes them, and the pre-tokenizer splits digits from
    letters), so encoding is unchanged."""
    with open(src, encoding="utf-8") as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    used = set(vocab.values()) | {t["id"] for t in tok.get("added_tokens", [])}
    if max(used) + 1 >= vocab_size:
        shutil.copyfile(src, dst)
        return
    for i in range(vocab_size):
        if i not in used:
            vocab["\u0120syn%d" % i] = i
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, separators=(",", ":"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--config", help="config.json giving the shape (default: Qwen3.6-35B-A3B)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-tokenizer", action="store_true", help="do not copy the Qwen3 tokenizer.json")
    ap.add_argument("--sample-tokens", type=int, default=512, help="prompt length for the routing check (0: no check)")
    ap.add_argument("--shard-limit-bytes", type=int, default=SHARD_LIMIT, help="largest shard (default 5 GiB)")
    args = ap.parse_args()

    shape = read_shape(args.config) if args.config else dict(QWEN36_35B_A3B)
    tensors, quant = plan(shape)
    shards = shard(tensors, args.shard_limit_bytes)
    os.makedirs(args.out_dir, exist_ok=True)

    total = sum(t.nbytes for t in tensors)
    t0 = time.time()
    done = [0, 0.0]

    def progress(n):
        done[0] += n
        now = time.time()
        if now - done[1] > 1.0 or done[0] == total:
            done[1] = now
            rate = done[0] / max(now - t0, 1e-9) / 1e6
            sys.stderr.write(f"\rwriting {done[0] / 1e9:6.2f} / {total / 1e9:.2f} GB  ({rate:.0f} MB/s)   ")
            sys.stderr.flush()

    weight_map = {}
    names = []
    for i, s in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1 else "model.safetensors"
        names.append(fname)
        write_shard(os.path.join(args.out_dir, fname), s, args.seed, progress)
        for t in s:
            weight_map[t.name] = fname
    sys.stderr.write("\n")
    elapsed = time.time() - t0
    if len(shards) > 1:
        with open(os.path.join(args.out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(make_config(shape, quant), f, indent=2)
    if not args.no_tokenizer:
        for fn in ("tokenizer.json", "tokenizer_config.json"):
            src = os.path.join(TOKENIZER_DIR, fn)
            if fn == "tokenizer.json" and os.path.exists(src):
                write_tokenizer(src, os.path.join(args.out_dir, fn), shape["vocab_size"])
            elif os.path.exists(src):
                shutil.copyfile(src, os.path.join(args.out_dir, fn))
    print(f"wrote {args.out_dir}: {len(tensors)} tensors, {total / 1e9:.3f} GB in {len(names)} shard(s), "
          f"{elapsed:.1f} s ({total / max(elapsed, 1e-9) / 1e6:.0f} MB/s)")

    n_tok = min(args.sample_tokens, shape["vocab_size"])
    if n_tok <= 0:  # --sample-tokens 0: no routing check
        return 0
    counts, x_std, logit_std = expert_load(args.out_dir, shape, weight_map, args.seed, n_tok)
    print(f"router input std {x_std:.3f}, router logit std {logit_std:.3f}")
    print_histogram(counts, shape["num_experts_per_tok"], n_tok)
    ratio = counts.max() / counts.mean()
    if ratio > 3.0:
        print(f"routing too concentrated: max/mean {ratio:.2f} > 3", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
