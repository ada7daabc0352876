#!/usr/bin/env python3
"""Time llama.cpp (through the llama-cpp-python package) on a GGUF: prefill of P random tokens, then N
single-token decode steps, at T threads — the shapes `lily bench -p P -n N -d 0 --threads T` measures.

Usage: time_llama.py MODEL.gguf [P=256] [N=32] [T=2] [ROUNDS=1]
Prints "pp P: X tok/s" and "tg N: Y tok/s" per round. Build llama-cpp-python for this CPU without AMX
(bench/llama_cpp/README.md).
"""
import random, sys, time
from llama_cpp import Llama

path = sys.argv[1]
P, N, T, R = (int(a) for a in (sys.argv[2:] + ["256", "32", "2", "1"][len(sys.argv) - 2:])[:4])
llm = Llama(model_path=path, n_threads=T, n_threads_batch=T, n_ctx=P + N + 8, n_batch=P, n_ubatch=P,
            verbose=False)
vocab = llm.n_vocab()
rng = random.Random(1)
for r in range(R + 1):  # round 0 warms up
    toks = [rng.randrange(vocab) for _ in range(P + N)]
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(toks[:P])
    t1 = time.perf_counter()
    for i in range(N):
        llm.eval([toks[P + i]])
    t2 = time.perf_counter()
    if r:
        print(f"pp {P}: {P / (t1 - t0):.2f} tok/s   tg {N}: {N / (t2 - t1):.2f} tok/s", flush=True)
