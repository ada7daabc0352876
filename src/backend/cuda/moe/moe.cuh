/* moe.cuh — the sparse MoE block after the router: routing (top-k), the routed experts' and the shared
 * expert's SwiGLU MLPs and the weighted sum into the residual stream. Decode and short calls: moe_route.cu
 * (fp32) and moe_decode.cu (4-bit, one token, tensor cores); prefill: the routing kernels of moe_prefill.cu
 * around the grouped GEMMs of gemm/ (forward_prefill.cu wires them).
 */
#ifndef LILY_CUDA_MOE_CUH
#define LILY_CUDA_MOE_CUH

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/timeline.cuh"

/* A range of weight bytes to pull into L2 (16-byte aligned start, bytes a multiple of 16). */
struct moe_l2_range {
    const uint8_t *p;
    unsigned int bytes;
};
#define MOE_L2_RANGES 32
#define MOE_L2_CHUNK 8192

struct moe_args {
    dmat gate, up, down;            /* routed experts */
    dmat sgate, sup, sdown;         /* shared expert */
    float *router_logits;           /* [n_tokens][logit_stride]: n_experts logits, then the shared-gate logit
                                     * (written by moe_gate_up_mma when the router is fused into it) */
    int logit_stride;
    int n_experts, top_k, inter, shared_inter, hidden;
    const float *h;                 /* residual stream [n_tokens][hidden] (input of the post-attention norm) */
    const float *norm_w;            /* post_attention_layernorm (1 + w form) [hidden] */
    float eps;
    float *hid;                     /* scratch [n_tokens][top_k + 1][max(inter, shared_inter)] */
    int *topk_idx;                  /* scratch [n_tokens][top_k] */
    float *topk_w;                  /* scratch [n_tokens][top_k] */
    float *out;                     /* residual stream to add into: [n_tokens][hidden] (may equal h) */
    int exact;                      /* 1 (exact mode): moe_route.cu's fp32 kernels only, never moe_decode.cu's */
    /* Decode, early ids (moe_decode.cu): the session's forward-call counter (device; not
     * written during a forward call), its MOE_PUB_WORDS tagged top-k words (cuda_counters) and the layer
     * index (< 256). topk_pub NULL: off. */
    const int *step;
    unsigned long long *topk_pub;
    int layer;
    /* Decode (n_tokens == 1): the last cpu_slots of the top_k routed slots are left out — the host's cores
     * compute them (cpu_experts.cu) — while the ranking and the weights' renormalization still cover all
     * top_k. 0: every slot here. */
    int cpu_slots;
    /* Decode, the router fused into moe_gate_up_mma (moe_router_fused): the router's E + 1 rows (8-bit,
     * hidden columns) are rows 0.. of `router`, then those of `router_shared` (the shared-expert gate; rows
     * 0 and data NULL when `router` holds all E + 1), and logit_pub the session's MOE_LOGIT_WORDS tagged
     * logit words (cuda_counters). logit_pub NULL: the router is a GEMV launched before gate/up. */
    dmat router, router_shared;
    unsigned long long *logit_pub;
    unsigned long long *timeline; /* per-block stamps of the decode kernels (timeline.cuh); NULL: none */
    /* Decode (moe_gate_up_mma, STAGED): byte ranges of later kernels' weights (the next layer's input
     * projection) that the blocks pull into L2 while the router and the top-k run (HBM idle then), split in
     * MOE_L2_CHUNK-byte bulk prefetches over the grid; l2_when 0: none, 1: before pdl_wait, 2: after it. */
    moe_l2_range l2[MOE_L2_RANGES];
    int n_l2, l2_when;
};
/* Tagged top-k words of moe_args.topk_pub: 2 per slot (id, weight), MOE_MAX_K (moe_topk.cuh) slots. */
#define MOE_PUB_WORDS 32
/* Tagged router logits of moe_args.logit_pub: one word per router row, E + 1 <= MOE_MAX_E + 1 (moe_topk.cuh). */
#define MOE_LOGIT_WORDS 520
cudaError_t launch_moe_gate_up(const moe_args &a, int n_tokens, cudaStream_t s);
cudaError_t launch_moe_down(const moe_args &a, int n_tokens, cudaStream_t s);
/* Whether moe_route.cu's kernels take these shapes (any n_tokens): gate/up `gu_bits` with hidden
 * columns, down `down_bits` with inter (routed) and shared_inter (shared expert) columns, top_k of
 * n_experts. The routed and shared experts must share the storage width of each stage. */
bool moe_route_supported(int gu_bits, int down_bits, int hidden, int inter, int shared_inter, int n_experts, int top_k);
/* moe_decode.cu: the same two stages for one decode token on tensor cores (launch_moe_* call them). */
bool moe_decode_mma_supported(const moe_args &a, int n_tokens);
cudaError_t launch_moe_gate_up_mma(const moe_args &a, cudaStream_t s);
cudaError_t launch_moe_down_mma(const moe_args &a, cudaStream_t s);
/* Whether the MoE kernels of layer `layer` use the tagged top-k (PDL on sm_90 code, layer < 256). */
bool moe_early_ids_wanted(int layer);
/* Whether moe_gate_up_mma computes the router itself (a.logit_pub, a.router set; the caller launches no
 * router GEMV then): the tensor-core decode kernels with early ids, an 8-bit router of E + 1 rows x hidden,
 * and gate/up one wave of co-resident blocks (each computes at most 2 router rows, publishes them as tagged
 * words and the routed blocks rank the top-k once all E are there: a grid-wide exchange, so every block must
 * be resident at once). The one place this is chosen; launch_moe_gate_up follows a.logit_pub. */
bool moe_router_fused(const moe_args &a, int n_tokens);

/* ---- prefill routing (moe_prefill.cu) ---- */

/* Top-k of each token's router logits (same semantics as moe_route.cu: ties to the lower expert id,
 * softmax renormalised over the top k). idx/w: [n][K]. E <= 1024, K <= 32. */
cudaError_t launch_moe_topk(const float *logits, int stride, int E, int K, int n, int *idx, float *w,
                            cudaStream_t s);

/* Rows per expert, offsets (exclusive scan, [E+1]), positions in expert order: sorted token of position
 * p (gather) and the position of each (token, slot) (slot_pos [n*K]); the tile map for tiles of T
 * tokens (tile_expert, tile_start, *n_tiles). E <= 1024, K <= 32; counts = scratch of
 * moe_plan_chunks(n) * E ints. Two kernels of moe_plan_chunks(n) blocks; positions within an expert
 * in token order (deterministic). */
cudaError_t launch_moe_plan(const int *idx, int n, int K, int E, int T, int *offsets, int *gather, int *slot_pos,
                            int *tile_expert, int *tile_start, int *n_tiles, int *counts, cudaStream_t s);

/* Chunks of 64 tokens of the multi-block plan. */
static inline int moe_plan_chunks(int n) { return (n + 63) / 64; }

/* out[t][c] += Σ_k w[t][k] · y[slot_pos[t][k]][c] + sigmoid(logits[t][E]) · ysh[t][c]. */
cudaError_t launch_moe_combine(float *out, int hidden, int n, int K, const float *w, const int *slot_pos,
                               const float *y, const float *ysh, const float *logits, int logit_stride, int E,
                               cudaStream_t s);

/* Upper bound of the number of tiles of T tokens for n*K rows over E experts. */
static inline int moe_max_tiles(int n, int K, int E, int T) { return (n * K + T - 1) / T + E; }

#endif
