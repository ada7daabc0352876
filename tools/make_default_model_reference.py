#!/usr/bin/env python3
"""make_default_model_reference.py — transformers' own view of an MLX 4-bit model directory (models/lily-tiny).

It dequantizes the MLX weights (float(scale)*q + float(bias), docs/MODEL.md §3), undoes the layout changes of
tools/convert_to_mlx4.py (switch_mlp -> fused experts, conv1d [C,K,1] -> [C,1,K], stored (1+w) norms -> w),
loads them into transformers' `Qwen3_5MoeForCausalLM` in float32 and then:

  greedy   MODEL_DIR OUT_JSON [--prompt TEXT] [--n 32]
           greedy-generates N tokens (no cache tricks: transformers' generate, eager attention) from the prompt
           encoded with MODEL_DIR/tokenizer.json and writes {prompt, prompt_ids, output_ids, text, ...} to OUT_JSON
           (tests/data/default_model_greedy.json; tests/test_default_model.sh checks lily against it)
  ppl      MODEL_DIR HELDOUT_BIN [--seq 512] [--max-tokens N]
           held-out perplexity over consecutive windows of the uint16 token file (same windows as
           tools/train_default_model.py); also prints that of the same architecture with random weights
  logits   MODEL_DIR TOKENS_CSV OUT_NPY     logits for one token sequence (checks)
Runs on CPU (float32, TF32 off) unless --device cuda.
"""
import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convert_to_mlx4 import bf16_to_f32, mlx_dequantize, st_read, GROUP  # noqa: E402

DEFAULT_PROMPT = "Python is a programming language"
ZC = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight", ".q_norm.weight",
      ".k_norm.weight")


def load_mlx_as_hf(model_dir):
    """Return ({hf_text_name: float32 np.ndarray}, text_config dict)."""
    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    t = st_read(model_dir / "model.safetensors")
    out = {}
    for k in sorted(t):
        if k.endswith(".scales") or k.endswith(".biases"):
            continue
        dt, a = t[k]
        name = k[len("language_model."):] if k.startswith("language_model.") else k
        if k.endswith(".weight") and k[: -len(".weight")] + ".scales" in t:
            m = k[: -len(".weight")]
            s, b = t[m + ".scales"][1], t[m + ".biases"][1]
            bits = 32 * a.shape[-1] // (s.shape[-1] * GROUP)
            w = mlx_dequantize(a, s, b, bits)
        else:
            w = bf16_to_f32(a) if dt == "BF16" else a.astype(np.float32)
        if "conv1d" in name and w.shape[-1] == 1:
            w = np.moveaxis(w, 1, 2)
        if name.endswith(ZC):
            w = w - np.float32(1.0)
        out[name] = np.ascontiguousarray(w, dtype=np.float32)
    # switch_mlp -> fused experts
    for k in [k for k in out if ".mlp.switch_mlp.gate_proj.weight" in k]:
        pre = k[: k.index(".mlp.switch_mlp.")]
        g = out.pop(k)
        u = out.pop(pre + ".mlp.switch_mlp.up_proj.weight")
        d = out.pop(pre + ".mlp.switch_mlp.down_proj.weight")
        out[pre + ".mlp.experts.gate_up_proj"] = np.concatenate([g, u], axis=1)
        out[pre + ".mlp.experts.down_proj"] = d
    return out, text


def build_model(text, device, values=None):
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
    tc = {k: v for k, v in text.items() if k not in ("model_type", "dtype", "transformers_version")}
    cfg = Qwen3_5MoeTextConfig(**tc)
    cfg._attn_implementation = "eager"
    cfg.output_router_logits = False
    torch.manual_seed(1234)
    model = Qwen3_5MoeForCausalLM(cfg).float().eval()
    if values is not None:
        sd = model.state_dict()
        missing = set(sd) - set(values)
        extra = set(values) - set(sd)
        assert not missing and not extra, (sorted(missing)[:5], sorted(extra)[:5])
        with torch.no_grad():
            for n, p in sd.items():
                assert tuple(p.shape) == values[n].shape, (n, p.shape, values[n].shape)
                p.copy_(torch.from_numpy(values[n]))
    return model.to(device)


@torch.no_grad()
def ppl(model, held, seq, device, max_tokens=None):
    n = (len(held) - 1) // seq
    if max_tokens:
        n = min(n, max(1, max_tokens // seq))
    tot, cnt = 0.0, 0
    for i in range(0, n, 8):
        b = torch.stack([held[j * seq: j * seq + seq + 1] for j in range(i, min(n, i + 8))]).to(device)
        lg = model(input_ids=b[:, :-1], use_cache=False).logits.float()
        tot += float(torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), b[:, 1:].reshape(-1),
                                                       reduction="sum"))
        cnt += b[:, 1:].numel()
    return math.exp(tot / cnt), cnt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["greedy", "ppl", "logits"])
    ap.add_argument("model_dir")
    ap.add_argument("a", nargs="*")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    values, text = load_mlx_as_hf(args.model_dir)
    model = build_model(text, args.device, values)
    if args.cmd == "greedy":
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(Path(args.model_dir) / "tokenizer.json"))
        ids = tok.encode(args.prompt).ids
        x = torch.tensor([ids], device=args.device)
        g = model.generate(x, max_new_tokens=args.n, do_sample=False, eos_token_id=None, pad_token_id=0,
                           min_new_tokens=args.n)
        outs = g[0, len(ids):].tolist()
        # teacher-forced check of the same tokens: argmax of one full forward over prompt + outputs
        lg = model(input_ids=g[:, :-1], use_cache=False).logits[0]
        tf = lg.argmax(-1)[len(ids) - 1:].tolist()
        top2 = torch.topk(lg[len(ids) - 1:].float(), 2, dim=-1).values
        margins = (top2[:, 0] - top2[:, 1]).tolist()
        margin = min(margins)
        rec = {"prompt": args.prompt, "prompt_ids": ids, "output_ids": outs,
               "text": tok.decode(outs), "teacher_forced_argmax_matches": tf == outs,
               "min_top1_top2_logit_margin": margin,
               "top1_top2_logit_margins": [round(m, 5) for m in margins],
               "how": "transformers Qwen3_5MoeForCausalLM float32 on CPU, eager attention, greedy generate, on the "
                      "dequantized MLX 4-bit weights of the model directory (tools/make_default_model_reference.py)",
               "torch": torch.__version__}
        import transformers
        rec["transformers"] = transformers.__version__
        Path(args.a[0]).write_text(json.dumps(rec, indent=1) + "\n")
        print(json.dumps(rec, indent=1))
    elif args.cmd == "ppl":
        held = torch.from_numpy(np.fromfile(args.a[0], dtype=np.uint16).astype(np.int64))
        p, n = ppl(model, held, args.seq, args.device, args.max_tokens)
        rnd = build_model(text, args.device, None)
        pr, _ = ppl(rnd, held, args.seq, args.device, args.max_tokens)
        print(json.dumps({"heldout_ppl_mlx4_dequantized": p, "heldout_ppl_random_init": pr, "tokens": n}))
    else:
        ids = [int(v) for v in args.a[0].split(",")]
        lg = model(input_ids=torch.tensor([ids], device=args.device), use_cache=False).logits[0].float().cpu()
        np.save(args.a[1], lg.numpy())


if __name__ == "__main__":
    main()
