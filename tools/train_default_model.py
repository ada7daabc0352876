#!/usr/bin/env python3
"""train_default_model.py — train lily's bundled default model (models/lily-tiny) with transformers.

The model is transformers' own `Qwen3_5MoeForCausalLM` (the exact Qwen3.5/3.6-MoE architecture: Gated DeltaNet
layers with every 4th layer gated full attention, sparse MoE with a shared expert in every layer), small enough
that its MLX 4-bit form stays under 20 MB. Every linear layer's input dimension is a multiple of 64, so all of
them quantize with group 64.

Data: token files made by `prepare` (below) from tools/extract_pydoc_corpus.py's text and the tokenizer of
tools/train_default_tokenizer.py. Training samples random windows of SEQ tokens from train.bin; held-out loss is
measured on fixed consecutive windows of heldout.bin; the best checkpoint (lowest held-out loss) is kept.

usage:
  python3 tools/train_default_model.py prepare CORPUS_DIR TOKENIZER_JSON DATA_DIR
        -> DATA_DIR/train.bin, heldout.bin (uint16 token ids; documents joined by <|endoftext|>)
  python3 tools/train_default_model.py train DATA_DIR OUT_DIR [--minutes M] [--preset NAME] [--resume]
        -> OUT_DIR/hf/ (config.json + model.safetensors, the best held-out checkpoint, text-only
           Qwen3_5MoeForCausalLM save), OUT_DIR/ckpt.pt (resume state), OUT_DIR/train_log.json
           (config, steps, tokens seen, losses, held-out perplexity of the trained and of the random-init
           model, greedy samples)
  python3 tools/train_default_model.py bench DATA_DIR [--preset NAME]   (a few timed steps)
Runs on CUDA with bf16 autocast when a GPU is present, else on CPU in fp32.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

T_START = time.time()

EOT_ID = 0  # <|endoftext|> is id 0 in the tokenizer of tools/train_default_tokenizer.py

PRESETS = {
    # the shipped model
    "lily-tiny": dict(vocab_size=8192, hidden_size=384, num_hidden_layers=8, num_attention_heads=6,
                      num_key_value_heads=2, head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8,
                      linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4,
                      num_experts=24, num_experts_per_tok=4, moe_intermediate_size=64,
                      shared_expert_intermediate_size=256, mrope=[3, 3, 2],
                      seq=512, batch=32, lr=1.5e-3, min_lr=1e-4, warmup=100, wd=0.1),
    # a CPU smoke test of the same code path
    "smoke": dict(vocab_size=8192, hidden_size=128, num_hidden_layers=4, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                  linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4,
                  num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                  shared_expert_intermediate_size=64, mrope=[3, 3, 2],
                  seq=128, batch=8, lr=2e-3, min_lr=1e-4, warmup=20, wd=0.1),
}
ARCH_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
             "linear_value_head_dim", "linear_conv_kernel_dim", "num_experts", "num_experts_per_tok",
             "moe_intermediate_size", "shared_expert_intermediate_size")
SAMPLE_PROMPTS = ["The Python interpreter", "A list is", "To open a file, use", "The following example shows"]


def build_config(p):
    from transformers import Qwen3_5MoeTextConfig
    rope = {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
            "mrope_section": p["mrope"], "mrope_interleaved": True}
    n = p["num_hidden_layers"]
    cfg = Qwen3_5MoeTextConfig(
        rope_parameters=rope, max_position_embeddings=8192, rms_norm_eps=1e-6, tie_word_embeddings=False,
        full_attention_interval=4,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)],
        eos_token_id=EOT_ID, bos_token_id=None, pad_token_id=None, router_aux_loss_coef=0.001,
        output_router_logits=False, initializer_range=0.02, **{k: p[k] for k in ARCH_KEYS})
    return cfg


def check_dims(cfg):
    """Every linear's input dim must be a multiple of 64 (MLX group-64 quantization)."""
    H = cfg.hidden_size
    ins = [H, cfg.num_attention_heads * cfg.head_dim, cfg.linear_num_value_heads * cfg.linear_value_head_dim,
           cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size]
    assert all(d % 64 == 0 for d in ins), ins


def prepare(corpus_dir, tok_path, data_dir):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tok_path)
    assert tok.token_to_id("<|endoftext|>") == EOT_ID
    os.makedirs(data_dir, exist_ok=True)
    for name in ("train", "heldout"):
        text = open(os.path.join(corpus_dir, name + ".txt"), encoding="utf-8").read()
        docs = text.split("\n<|endoftext|>\n")
        ids = []
        for enc in tok.encode_batch(docs):
            ids.extend(enc.ids)
            ids.append(EOT_ID)
        a = np.asarray(ids, dtype=np.uint16)
        a.tofile(os.path.join(data_dir, name + ".bin"))
        print(f"{name}: {len(docs)} documents, {len(a)} tokens")


def load_bin(data_dir, name):
    return torch.from_numpy(np.fromfile(os.path.join(data_dir, name + ".bin"), dtype=np.uint16).astype(np.int64))


def make_model(p, device, seed=1234, experts="eager"):
    from transformers import Qwen3_5MoeForCausalLM
    cfg = build_config(p)
    check_dims(cfg)
    cfg._experts_implementation = experts
    torch.manual_seed(seed)
    model = Qwen3_5MoeForCausalLM(cfg)
    # transformers initialises the zero-centred norms to 0 (=> scale 1) already; nothing else to fix.
    return model.to(device), cfg


def lm_loss(model, x, p, aux=True):
    out = model(input_ids=x[:, :-1], labels=None, use_cache=False, output_router_logits=aux)
    logits = out.logits.float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
    aux_loss = out.aux_loss if aux and getattr(out, "aux_loss", None) is not None else None
    return loss, aux_loss


@torch.no_grad()
def heldout_loss(model, held, p, device, max_windows=128):
    model.eval()
    seq = p["seq"]
    n = min(max_windows, (len(held) - 1) // seq)
    tot, cnt = 0.0, 0
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
    for i in range(0, n, 16):
        b = torch.stack([held[j * seq: j * seq + seq + 1] for j in range(i, min(n, i + 16))]).to(device)
        with amp:
            loss, _ = lm_loss(model, b, p, aux=False)
        tot += float(loss) * b.shape[0]
        cnt += b.shape[0]
    model.train()
    return tot / max(cnt, 1)


@torch.no_grad()
def greedy_samples(model, tok_path, device, n=40):
    from tokenizers import Tokenizer
    if not tok_path or not os.path.exists(tok_path):
        return []
    tok = Tokenizer.from_file(tok_path)
    model.eval()
    outs = []
    for s in SAMPLE_PROMPTS:
        ids = torch.tensor([tok.encode(s).ids], device=device)
        g = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=EOT_ID)
        outs.append(tok.decode(g[0].tolist()))
    model.train()
    return outs


def lr_at(step, total, p):
    if step < p["warmup"]:
        return p["lr"] * (step + 1) / p["warmup"]
    t = min(1.0, (step - p["warmup"]) / max(1, total - p["warmup"]))
    return p["min_lr"] + 0.5 * (p["lr"] - p["min_lr"]) * (1 + math.cos(math.pi * t))


def save_hf(model, out_dir):
    """The text-only HF checkpoint in bf16 (as Qwen3.6 publishes its weights)."""
    import copy
    hf = os.path.join(out_dir, "hf")
    os.makedirs(hf, exist_ok=True)
    m = copy.deepcopy(model).to(torch.bfloat16)
    m.config._experts_implementation = None
    m.save_pretrained(hf, safe_serialization=True)


def pick_experts_impl(p, device, tr, candidates):
    """Time 3 training steps with each MoE experts implementation that works here; return the fastest."""
    if len(candidates) == 1:
        return candidates[0], {}
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
    res = {}
    for impl in candidates:
        try:
            m, c = make_model(p, device, experts=impl)
            opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
            x = torch.stack([tr[j: j + p["seq"] + 1] for j in range(0, p["batch"] * 997, 997)]).to(device)
            for i in range(4):
                if i == 1:
                    if device == "cuda":
                        torch.cuda.synchronize()
                    t = time.time()
                with amp:
                    loss, aux = lm_loss(m, x, p)
                    full = loss + c.router_aux_loss_coef * aux
                opt.zero_grad()
                full.backward()
                opt.step()
            if device == "cuda":
                torch.cuda.synchronize()
            res[impl] = (time.time() - t) / 3
            print(f"experts_implementation {impl}: {res[impl] * 1000:.0f} ms/step (loss {float(loss):.3f})", flush=True)
            del m, opt
        except Exception as e:  # an implementation this torch build cannot run
            print(f"experts_implementation {impl}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
    best = min(res, key=res.get)
    return best, res


def train(args):
    p = dict(PRESETS[args.preset])
    if args.batch:
        p["batch"] = args.batch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    os.makedirs(args.out, exist_ok=True)
    tr, held = load_bin(args.data, "train"), load_bin(args.data, "heldout")
    impl, impl_times = pick_experts_impl(p, device, tr, args.experts.split(","))
    model, cfg = make_model(p, device, experts=impl)
    nparam = sum(t.numel() for t in model.parameters())
    decay = [t for n, t in model.named_parameters() if t.ndim >= 2 and "embed" not in n]
    no_decay = [t for n, t in model.named_parameters() if not (t.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": p["wd"]}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=p["lr"], betas=(0.9, 0.95), eps=1e-8, fused=(device == "cuda"))
    log = {"preset": args.preset, "params": p, "n_params": nparam, "device": device,
           "experts_implementation": impl, "experts_impl_ms_per_step": impl_times,
           "train_tokens": len(tr), "heldout_tokens": len(held), "evals": [], "torch": torch.__version__}
    ckpt = os.path.join(args.out, "ckpt.pt")
    step, tokens, best, elapsed0 = 0, 0, float("inf"), 0.0
    total_steps = args.steps
    if args.resume and os.path.exists(ckpt):
        st = torch.load(ckpt, map_location=device, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, tokens, best, elapsed0, total_steps = st["step"], st["tokens"], st["best"], st["elapsed"], st["total"]
        log = st["log"]
        print(f"resumed at step {step}")
    else:
        rl = heldout_loss(model, held, p, device)
        log["random_init_heldout_loss"] = rl
        log["random_init_heldout_ppl"] = math.exp(rl)
        print(f"params {nparam}; random-init held-out loss {rl:.4f} ppl {math.exp(rl):.1f}", flush=True)
    gen = torch.Generator().manual_seed(4321 + step)
    seq, B = p["seq"], p["batch"]
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
    budget = args.minutes * 60.0
    if args.wall:  # whole-process deadline: leave ~50 s for the final eval, save and samples
        budget = min(budget, args.wall - (time.time() - T_START) - 50.0)
        print(f"training-loop budget {budget:.0f} s", flush=True)
    t0 = time.time() - elapsed0
    last_eval, last_ckpt = time.time(), time.time()
    model.train()
    while True:
        el = time.time() - t0
        if total_steps is None and step == 10:
            t10 = el
        if total_steps is None and step == args.measure_steps:
            # size the run from the speed measured over steps 10..measure_steps: steps that fit the time budget
            rate = (step - 10) / (el - t10)
            total_steps = int(step + rate * (budget - el) * 0.95)
            if args.max_epochs:
                total_steps = min(total_steps, int(math.ceil(args.max_epochs * len(tr) / (B * seq))))
            log["measured_steps_per_s"] = rate
            print(f"measured {rate:.2f} steps/s ({rate * B * seq / 1e3:.0f}k tok/s); run = {total_steps} steps",
                  flush=True)
        if total_steps is not None and step >= total_steps:
            break
        if el > budget:
            break
        ix = torch.randint(0, len(tr) - seq - 1, (B,), generator=gen)
        x = torch.stack([tr[i: i + seq + 1] for i in ix.tolist()]).to(device, non_blocking=True)
        lr = lr_at(step, total_steps or 10 ** 9, p)
        for g in opt.param_groups:
            g["lr"] = lr
        with amp:
            loss, aux = lm_loss(model, x, p)
            full = loss + (cfg.router_aux_loss_coef * aux if aux is not None else 0.0)
        opt.zero_grad(set_to_none=True)
        full.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += B * seq
        if step % 50 == 0 or step == 1:
            print(f"step {step} loss {float(loss):.4f} aux {float(aux) if aux is not None else 0:.3f} lr {lr:.2e} "
                  f"t {time.time() - t0:.0f}s", flush=True)
        now = time.time()
        if now - last_eval > args.eval_every or (total_steps is not None and step >= total_steps):
            hl = heldout_loss(model, held, p, device)
            log["evals"].append({"step": step, "tokens": tokens, "train_loss": float(loss), "heldout_loss": hl,
                                 "t": now - t0})
            print(f"  eval step {step} held-out loss {hl:.4f} ppl {math.exp(hl):.2f}", flush=True)
            if hl < best:
                best = hl
                save_hf(model, args.out)
                log["best"] = {"step": step, "heldout_loss": hl, "heldout_ppl": math.exp(hl)}
            last_eval = time.time()
        if now - last_ckpt > args.ckpt_every:
            log["elapsed"] = time.time() - t0
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "tokens": tokens,
                        "best": best, "elapsed": time.time() - t0, "total": total_steps, "log": log}, ckpt)
            last_ckpt = time.time()
    hl = heldout_loss(model, held, p, device)
    log["evals"].append({"step": step, "tokens": tokens, "heldout_loss": hl, "t": time.time() - t0})
    if hl < best:
        best = hl
        save_hf(model, args.out)
        log["best"] = {"step": step, "heldout_loss": hl, "heldout_ppl": math.exp(hl)}
    log.update(steps=step, tokens_seen=tokens, epochs=tokens / len(tr), train_seconds=time.time() - t0)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "tokens": tokens,
                "best": best, "elapsed": time.time() - t0, "total": total_steps, "log": log}, ckpt)
    # samples from the best checkpoint
    from transformers import Qwen3_5MoeForCausalLM
    bestm = Qwen3_5MoeForCausalLM.from_pretrained(os.path.join(args.out, "hf"), dtype=torch.float32).to(device)
    log["samples"] = greedy_samples(bestm, args.tokenizer, device)
    for s in log["samples"]:
        print("SAMPLE:", repr(s))
    json.dump(log, open(os.path.join(args.out, "train_log.json"), "w"), indent=1)
    print(f"done: {step} steps, {tokens} tokens ({tokens / len(tr):.1f} epochs), best held-out loss {best:.4f} "
          f"ppl {math.exp(best):.2f}", flush=True)


def bench(args):
    p = dict(PRESETS[args.preset])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tr = load_bin(args.data, "train")
    model, cfg = make_model(p, device)
    print("params", sum(t.numel() for t in model.parameters()))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
    for i in range(args.bench_steps):
        if i == 2:
            if device == "cuda":
                torch.cuda.synchronize()
            t = time.time()
        x = torch.stack([tr[j: j + p["seq"] + 1] for j in range(0, p["batch"] * 1000, 1000)]).to(device)
        with amp:
            loss, aux = lm_loss(model, x, p)
            full = loss + cfg.router_aux_loss_coef * aux
        opt.zero_grad()
        full.backward()
        opt.step()
        print(i, float(loss.detach()), flush=True)
    if device == "cuda":
        torch.cuda.synchronize()
    dt = (time.time() - t) / (args.bench_steps - 2)
    print(f"{dt * 1000:.0f} ms/step, {p['batch'] * p['seq'] / dt / 1e3:.1f}k tok/s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd")
    ap.add_argument("a", nargs="*")
    ap.add_argument("--preset", default="lily-tiny")
    ap.add_argument("--minutes", type=float, default=7.0)
    ap.add_argument("--steps", type=int, default=None, help="fixed step count (default: sized from measured speed)")
    ap.add_argument("--measure-steps", type=int, default=60)
    ap.add_argument("--eval-every", type=float, default=45.0, help="seconds")
    ap.add_argument("--ckpt-every", type=float, default=120.0, help="seconds")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--bench-steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--max-epochs", type=float, default=None, help="cap on passes over train.bin")
    ap.add_argument("--wall", type=float, default=None, help="whole-process deadline in seconds")
    ap.add_argument("--experts", default="eager", help="comma list of experts implementations to time and pick from")
    args = ap.parse_args()
    if args.cmd == "prepare":
        prepare(*args.a)
    elif args.cmd == "train":
        args.data, args.out = args.a
        train(args)
    elif args.cmd == "bench":
        args.data = args.a[0]
        bench(args)
    else:
        sys.exit("unknown command " + args.cmd)


if __name__ == "__main__":
    main()
