/* deltanet.cuh — the Gated DeltaNet mixer (causal conv, q/k norms, gates, delta rule): its arguments,
 * the kernel choice and the launchers of deltanet_decode.cu, deltanet_prefill.cu and deltanet_chunked.cu.
 */
#ifndef LILY_CUDA_DELTANET_CUH
#define LILY_CUDA_DELTANET_CUH

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/timeline.cuh"

/* DeltaNet calls of at least this many tokens take the chunked delta rule (deltanet_chunked.cu), shorter
 * ones the sequential recurrence (docs/BENCHMARKS.md, "One kernel per op and shape"). */
#define GDN_CHUNKED_MIN_TOKENS 256

/* The Gated DeltaNet mixer kernels (gdn_kernel_choose picks one per call). */
enum gdn_kernel {
    GDN_KERNEL_AUTO = 0,       /* gdn_args.kernel: gdn_kernel_choose decides */
    GDN_KERNEL_DECODE = 1,     /* deltanet_decode.cu: one token, barrier-free */
    GDN_KERNEL_RECURRENCE = 2, /* deltanet_prefill.cu: prep for all tokens, then the sequential delta rule */
    GDN_KERNEL_CHUNKED = 3,    /* deltanet_chunked.cu: prep, then the chunked (WY) delta rule on tensor cores */
};

struct gdn_args {
    const float *mixed;   /* [n][mixed_stride] in_proj_qkv output (pre-conv), conv_dim channels */
    int mixed_stride;
    const float *ba;      /* [n][ba_stride]: b at [0,Hv), a at [Hv, 2Hv) */
    int ba_stride;
    const float *conv_w;  /* [conv_dim][K] */
    const float *A_log, *dt_bias; /* [Hv] */
    float *conv_state;    /* [2][K-1][conv_dim]: ping-pong by *step & 1 */
    float *state;         /* [Hv][dk][dv] fp32 */
    const int *step;      /* forward-call counter (device) */
    float *out;           /* [n][Hv*dv] raw delta-rule output (gated norm applied by out_proj's GEMV) */
    int Hk, Hv, dk, dv, K, conv_dim;
    int kernel;           /* gdn_kernel: GDN_KERNEL_AUTO, or one the shape supports (tests) */
    /* 1: in_proj's store applied the conv + SiLU and advanced the conv history (gemv_batch.conv_w): mixed holds
     * silu(conv) and the decode kernel skips both (gdn_decode_conv_fusable shapes). In the padding before
     * `timeline`: a larger argument struct changed the decode kernel's register allocation (151 -> 145) and
     * doubled its time on the H200 (docs/BENCHMARKS.md, "The DeltaNet conv in in_proj's store") */
    int conv_done;
    unsigned long long *timeline; /* per-block stamps of the decode kernel (timeline.cuh); NULL: none */
};
/* The one place a DeltaNet kernel is chosen: n_tokens 1: DECODE; longer calls: CHUNKED from
 * GDN_CHUNKED_MIN_TOKENS tokens where gdn_chunked_supported (not in exact mode: 3xTF32 products), else
 * RECURRENCE. (cuda_shapes.cu admits only shapes every one of them takes.) */
gdn_kernel gdn_kernel_choose(const gdn_args &a, int n_tokens, bool exact);
/* The mixer for n_tokens by a.kernel (AUTO: gdn_kernel_choose(a, n, false)); pre and wy are the scratch of
 * launch_gdn_prefill / launch_gdn_prefill_chunked (RECURRENCE needs pre, CHUNKED both: without wy it runs
 * the recurrence). cudaErrorInvalidValue for an n > 1 call without pre or a shape no kernel takes. */
cudaError_t launch_gdn(const gdn_args &a, float *pre, float *wy, int n_tokens, cudaStream_t s);
/* Whether the decode kernel takes conv_done (K == 4, dk 128, 16-byte aligned taps, history and inputs):
 * the shapes whose conv in_proj's streamed store may apply. */
bool gdn_decode_conv_fusable(const gdn_args &a);
/* gdn_decode_kernel: one token (dk 32/64/128, dv % 16 == 0, Hv % Hk == 0, K <= 4; else
 * cudaErrorInvalidValue). */
cudaError_t launch_gdn_decode(const gdn_args &a, cudaStream_t s);
/* deltanet_prefill.cu: the same mixer for a chunk:
 * gdn_prep_kernel (conv, norms, gates for all tokens at once) into pre [n_tokens][gdn_prefill_stride]
 * floats (scratch sized for max_chunk), then gdn_recur_kernel (the delta rule only). Same state and conv
 * state semantics as launch_gdn_decode. cudaErrorInvalidValue for a shape gdn_prefill_supported rejects. */
int gdn_prefill_stride(int conv_dim, int Hv);
bool gdn_prefill_supported(const gdn_args &a); /* dk 32/64/128, Hv % Hk == 0, K <= 4, dv % 32 */
cudaError_t launch_gdn_prefill(const gdn_args &a, float *pre, int n_tokens, cudaStream_t s);
/* gdn_prep_kernel alone (the first half of launch_gdn_prefill; launch_gdn_prefill_chunked's too). */
cudaError_t launch_gdn_prep(const gdn_args &a, float *pre, int n_tokens, cudaStream_t s);
/* deltanet_chunked.cu: the same mixer with the delta rule in its chunked (WY) form on tensor cores:
 * gdn_prep_kernel, then per (64-token chunk, value head) the intra-chunk matrices into wy
 * (>= gdn_chunked_scratch_floats(n_tokens, Hv, dk, dv) floats), then the inter-chunk recurrence. Same
 * outputs, state and conv state as launch_gdn_prefill (fp32-level accuracy: 3xTF32 products).
 * cudaErrorInvalidValue for a shape gdn_chunked_supported rejects. */
bool gdn_chunked_supported(const gdn_args &a); /* gdn_prefill_supported, dk 32/64/128, dv <= 128 */
int gdn_chunked_record_floats(int dk, int dv);
size_t gdn_chunked_scratch_floats(int max_tokens, int Hv, int dk, int dv);
cudaError_t launch_gdn_prefill_chunked(const gdn_args &a, float *pre, float *wy, int n_tokens, cudaStream_t s);

#endif
