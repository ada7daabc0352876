/* cuda_backend.h — CUDA-only entry points beyond backend.h: the decode fast path that keeps the next
 * token on the device (CUDA graph replay, no host sync per token), a per-stage decode profile (CUDA
 * events), device bandwidth measurement, and a bench helper that places a session at a given depth.
 * In a build without CUDA (cuda_stub.c) every function returns LILY_ERR_UNSUPPORTED.
 * `ctx` and `state` are the cuda backend's (lily_backend.ctx and a state from its state_new).
 */
#ifndef LILY_CUDA_BACKEND_H
#define LILY_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "lily.h"

/* Greedy decode of n tokens: first_token is processed at the state's position, each chosen token is
 * written by the GPU into the next step's input slot, the captured step graph is replayed n times,
 * and out_tokens[0..n) receives the chosen ids with one host synchronization for the whole call.
 * Errors: LILY_ERR_CONTEXT_LENGTH (position + n > max_ctx), LILY_ERR_BACKEND. */
lily_status lily_cuda_generate_greedy(void *ctx, void *state, int32_t first_token, int n, int32_t *out_tokens,
                                      lily_error *err);

/* A generated token handed to the host while the GPU keeps decoding (index = 0-based step). */
typedef void (*lily_cuda_token_fn)(void *user, int32_t token, int index);

/* As lily_cuda_generate_greedy, and each token is passed to on_token as soon as the GPU has chosen it:
 * the sampling kernel writes it to mapped host memory and the host polls a counter there (no
 * host-device synchronization per token; the call still synchronizes once at the end). */
lily_status lily_cuda_generate_greedy_stream(void *ctx, void *state, int32_t first_token, int n, int32_t *out_tokens,
                                             lily_cuda_token_fn on_token, void *user, lily_error *err);

/* As lily_cuda_generate_greedy with temperature / top-k (<= 64; the candidate lists keep 16 per scan
 * thread) / top-p sampling on the device; seed makes the draw reproducible. */
lily_status lily_cuda_generate_sample(void *ctx, void *state, int32_t first_token, int n, float temperature,
                                      int top_k, float top_p, uint64_t seed, int32_t *out_tokens, lily_error *err);

/* Host waits on the device so far (stream synchronizations); decode adds none per token. */
long long lily_cuda_host_syncs(void *ctx);

/* Bench helper: put the session at position pos as if pos tokens had been processed (KV rows [0, pos)
 * filled with pseudo-random bf16-representable values, stored bf16 or fp32 as the cache is; DeltaNet states
 * kept). Errors: LILY_ERR_CONTEXT_LENGTH. */
lily_status lily_cuda_state_set_position(void *ctx, void *state, int pos, lily_error *err);

/* Decode-step profile: one greedy step captured as a CUDA graph with an event between stages, replayed
 * n_steps times (after one warm-up). names[i]/ms[i]: GPU time per step of each stage, summed over layers;
 * total_ms: their sum (a little above the plain graph's step time: event nodes cut the launch overlap). */
#define LILY_CUDA_PROFILE_MAX 16
typedef struct {
    int n;
    const char *names[LILY_CUDA_PROFILE_MAX];
    double ms[LILY_CUDA_PROFILE_MAX];
    double total_ms;
} lily_cuda_profile;
lily_status lily_cuda_profile_decode(void *ctx, void *state, int32_t first_token, int n_steps,
                                     lily_cuda_profile *out, lily_error *err);

/* Per-stage profile of one prefill forward call of n tokens (n <= max_chunk) at the state's position,
 * with CUDA events between stages (ms for the call); advances the state by n. */
lily_status lily_cuda_profile_prefill(void *ctx, void *state, const int32_t *tokens, int n, lily_cuda_profile *out,
                                      lily_error *err);

/* Device memory in use (all processes) and in total on GPU `device`, bytes. */
lily_status lily_cuda_device_memory(int device, size_t *used, size_t *total, lily_error *err);

/* Device-to-device copy bandwidth of GPU `device`: `bytes` copied `reps` times; *gbps = (read + write)
 * bytes / second / 1e9. Errors: LILY_ERR_UNSUPPORTED without CUDA, LILY_ERR_OUT_OF_MEMORY, LILY_ERR_BACKEND. */
lily_status lily_cuda_membw(int device, size_t bytes, int reps, double *gbps, lily_error *err);

/* Set the split-KV shape for later captures (bench / tests): at most n_splits chunks per KV head,
 * chunks of at least min_chunk keys. Drops captured graphs of `state`. */
lily_status lily_cuda_set_attention_split(void *ctx, void *state, int n_splits, int min_chunk, lily_error *err);

/* Bench knobs, process-wide, for graphs captured afterwards (drop old ones with
 * lily_cuda_set_attention_split). Defaults: LILY_CUDA_TUNING_DEFAULT. */
typedef struct {
    int pdl;                /* 1: programmatic dependent launch; 0: plain launches */
    int gemv_blocks_per_sm; /* general GEMV kernel: 0 as many as fit, else that many blocks per SM */
    int gemv_mma;           /* 4-bit decode GEMVs and MoE on tensor cores: 1, 2 (PDL trigger after the wait),
                             * 3 (as 1, two weight groups loaded before the PDL wait), 0 off */
    int att_mma;            /* decode attention on tensor cores: 1, or 0 the SIMT split-KV kernel */
    int gdn_decode;         /* one-token Gated DeltaNet scan kernel: 1, or 0 the general scan */
    int gdn_prefill;        /* Gated DeltaNet prefill (n > 1): 1 prep + sequential recurrence (deltanet_prefill.cu),
                             * 2 prep + chunked delta rule on tensor cores (deltanet_chunked.cu) for every n > 1,
                             * 3 or more (default 4): chunked for n >= GDN_CHUNKED_MIN_TOKENS (cuda_internal.cuh),
                             * else 1; 0 the general scan.
                             * The environment variable LILY_CUDA_GDN_PREFILL=0..4, read when a CUDA backend is
                             * created, overrides it (tests, lily eval) */
    int prefill_gemm;       /* prefill projections and MoE (n >= 16) on tensor-core GEMMs: 1, or 0 the GEMV kernels */
    int att_prefill;        /* prefill attention (n > 1) by the flash kernel: 1, or 0 the SIMT kernel; 2: the
                             * Hopper wgmma flash kernel (attention_prefill_wg.cu) on sm_90a, else as 1; 3: as 2
                             * with each tile's softmax overlapping the previous tile's P·V; 4: as 3 with the K/V
                             * refills issued after the tile's wgmmas (179.9 vs 174.5 ms, last chunk of 128K);
                             * above 4: as 4. Default 3 (H200, the last 4096-token chunk of a 32K prompt:
                             * attention 44.5 ms, 47.6 with 2, 87.5 with 1). 5-10 (warp-specialized producer +
                             * mbarrier rings, ping-pong, 3 K stages, 80-key tiles, noinc completion) measured
                             * 51.3-56.0 ms there and were removed in session 7 (git history, commit de8dfae) */
    int moe_gate_up_blocks; /* decode MoE gate/up kernel: registers capped for 2 or 3 blocks per SM */
    int gemv_mma_blocks;    /* decode 4-bit GEMV: registers capped for 1 or 2 blocks per SM */
    /* prefill tensor-core GEMM (gemm_prefill.cuh; read at each launch, no capture involved) */
    int gemm_variant;       /* 0: one-warp-row kernel (16/32/64-token tiles); 1: 2D-warp-tiled kernel for 64/128
                             * (8 warps); 2: as 1 with 16 warps at 128 tokens (4/16-bit weights); 3: Hopper
                             * wgmma kernel for 4-bit weights at 64/128 tokens (sm_90a), else as 1; 4: as 3
                             * with one group's wgmmas in flight through the next barrier and loads (5 stages);
                             * 7: as 4 with one commit group per k16 slice (wait<3>) and a lean step (~25%
                             * fewer instructions per group); 9: 7 with the wgmma width of a ragged tile
                             * trimmed to its live tokens (32/64/96); 10: 9 with the X tile of dense launches
                             * and the routed down by TMA; 11: 10 with the other launches' cp.async on
                             * mbarriers (no per-step proxy fence); 3-11 give the same bits; 5, 6, 8 and 12
                             * and up run as 3. Default 11 (H200, 4096-token prompt, one chunk: 41,546
                             * tok/s; 40,695 with 10, 40,161 with 9, 39,984 with 7, 38,984 with 4). Removed
                             * after that measurement: 5 (4 with two A register sets: 39,009), 6 (7 without
                             * the lean step: 38,492), 8 (5 with the lean step: 37,968) */
    int moe_tile;           /* grouped (MoE) tokens per tile: 0 auto (gemm_grouped_tile), or 16, 32, 64, 128 */
    int dense_tile;         /* dense projection tokens per block: 0 auto, or 16, 64, 128 */
    int att_prefill_fused_q; /* with att_prefill: 1 = the flash kernel norms + rotates q while staging it (the
                              * norm/RoPE kernel appends k/v only), 0 = q normed + rotated by that kernel */
    int moe_gate_up_staged; /* decode MoE gate/up (2 blocks per SM): 1 = one wave of resident blocks, the
                             * shared-expert tiles past it staged in shared memory before the PDL wait (moe_decode.cu);
                             * default 1: 420 vs 410 tok/s at 4K (H200) */
    /* decode 4-bit GEMV streamed through a shared-memory ring (gemv_stream.cu; sm_90) */
    int gemv_stream;        /* 0 off; N > 0: batches of >= N KiB of weights (data + scales + biases); default 1
                             * (every shape it has), measured 442 vs 410 tok/s at 4K (H200) */
    int gemv_stream_stages; /* ring stages (one group of 8 warps' tiles each): 0 as many as fit, else 1..8 */
    int moe_early_ids;      /* decode MoE (moe_decode.cu, with PDL): 1 = the gate/up block of item 0, which ranks the
                             * top-k, publishes it as step-tagged words and the down blocks poll them before their
                             * PDL wait, so the expert loads start while the previous kernel still
                             * runs; 0 = the ids read after the wait; default 1 (H200, 4K: 461.3 vs 450.5 tok/s) */
    int gemm_prep_rows;     /* prefill activation pre-pass (gemm_prep.cu): 1 = 1-8 warps per row, values in
                             * registers; 0 = one block per row through shared memory; default 1 (H200, 4K
                             * prompt: 36,329 vs 34,542 tok/s) */
} lily_cuda_tuning;
#define LILY_CUDA_TUNING_DEFAULT {1, 0, 3, 1, 1, 4, 1, 3, 2, 1, 11, 0, 0, 1, 1, 1, 0, 1, 1}
void lily_cuda_set_tuning(const lily_cuda_tuning *t);

#ifdef __cplusplus
}
#endif

#endif
