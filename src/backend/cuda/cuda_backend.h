/* cuda_backend.h — CUDA-only entry points beyond backend.h (whose decode_loop is the decode fast path:
 * CUDA graph replay, the next token chosen on the device): the host-sync counter, a per-stage decode and
 * prefill profile (CUDA events), device memory and bandwidth measurement, and bench helpers that place a
 * session at a given depth and set the split-KV shape.
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

/* Tests: from now on, the forward call whose step counter (forward calls of the state so far) equals
 * `step` gets a NaN hidden state before the LM head, as an overflow would leave it; -1 turns it off. Set it
 * before the state's first decode loop (the step graphs are captured then). */
void lily_cuda_debug_poison(void *ctx, int step);

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

/* In-kernel timeline of one greedy decode step (the plain step graph, programmatic launch overlap intact,
 * with every decode kernel stamping %globaltimer per block at entry, after its PDL wait and at exit:
 * src/backend/cuda/timeline.cuh), replayed n_steps times after one warm-up, averaged. Times in µs from the
 * step's first stamp (the embedding, token fetch and finish kernels are not stamped). Advances the state by
 * n_steps + 1. Errors: LILY_ERR_CONTEXT_LENGTH, LILY_ERR_OUT_OF_MEMORY, LILY_ERR_BACKEND. */
#define LILY_CUDA_TIMELINE_MAX 320
typedef struct {
    int stage;            /* index into lily_cuda_timeline.stage_names */
    int layer;            /* -1: not a layer's (LM head) */
    int blocks;           /* blocks stamped */
    double start_us;      /* first block's entry */
    double last_start_us; /* last block's entry (all blocks resident) */
    double wait_us;       /* last block's PDL wait release */
    double end_us;        /* last block's exit */
    double mark_us;       /* last block's mark (GEMVs, MoE: x ready in shared memory); 0: the kernel has none */
    double bytes;         /* bytes the kernel moves at the step's depth (weights, state, KV cache) */
} lily_cuda_timeline_kernel;
typedef struct {
    int n;
    lily_cuda_timeline_kernel k[LILY_CUDA_TIMELINE_MAX]; /* in launch order */
    int n_stages;
    const char *stage_names[16];
    double step_us;           /* last exit - first entry */
    double timer_step_ns;     /* %globaltimer: smallest nonzero increment */
    double timer_update_ns;   /* mean time between its changes */
    double timer_update_cycles; /* SM clock cycles between its changes */
} lily_cuda_timeline;
lily_status lily_cuda_timeline_decode(void *ctx, void *state, int32_t first_token, int n_steps, lily_cuda_timeline *out,
                                      lily_error *err);

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

/* Whether later captures may run a DeltaNet layer's decode scan inside its out_proj launch (bench A/B):
 * fused 1 (the default) = where the kernel choice takes GDN_KERNEL_DECODE_FUSED, 0 = the scan kernel and
 * the out_proj GEMV as two launches. Drops captured graphs of `state`. */
lily_status lily_cuda_set_deltanet_fusion(void *ctx, void *state, int fused, lily_error *err);


#ifdef __cplusplus
}
#endif

#endif
