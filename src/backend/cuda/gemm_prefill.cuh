/* gemm_prefill.cuh — the tensor-core prefill path's launch interface: the activation pre-pass
 * (input transform + fp16 conversion), the dense / grouped (MoE) GEMM over MLX affine 4/8-bit or bf16
 * weights, and the MoE routing kernels (top-k, expert plan, combine). Kernels in gemm_prefill.cu,
 * gemm_prefill_2d.cu and moe_prefill.cu; the per-layer wiring in forward_prefill.cu.
 *
 * Precision: activations are scaled per row by a power of two (largest |x| lands in [2^13, 2^14)) and
 * rounded to fp16 once; weights enter the MMA as exact small integers q (or bf16 -> fp16); per group of
 * 64 columns the fp32 MMA sum is folded as acc += s * Σ(q·x) + b * Σx (Σx over the fp16 values), and the
 * row scale is multiplied back in the epilogue. Output fp32.
 *
 * Activation layout (gemm_act): x[row][cols] fp16 with the columns of every 16-column block permuted
 * (position l holds column gemm_perm16(l)) so that one thread's MMA fragments of a whole 64-column
 * group are 32 contiguous bytes and match the order the 4-bit nibbles unpack in; xs[row][cols/64] the
 * group sums; scale[row] the power of two to multiply results by.
 */
#ifndef LILY_GEMM_PREFILL_CUH
#define LILY_GEMM_PREFILL_CUH

#include <cuda_fp16.h>

#include "cuda_common.cuh"

/* Column held at position l (0..15) of a 16-column block of a gemm_act row. */
__host__ __device__ __forceinline__ int gemm_perm16(int l)
{
    return 8 * (l >> 3) + 2 * ((l >> 2) & 1) + ((l >> 1) & 1) + 4 * (l & 1);
}

struct gemm_act {
    __half *x;    /* [rows][cols] permuted fp16 */
    float *xs;    /* [rows][cols / 64] */
    float *scale; /* [rows] */
    int cols;
};

enum gemm_epilogue {
    GEMM_EPI_STORE = 0,  /* y[row][r] = acc */
    GEMM_EPI_ADD = 1,    /* y[row][r] += acc */
    GEMM_EPI_SWIGLU = 2, /* y[row][r] = silu(gate·x) * (up·x): m[0] = gate, m[1] = up */
};

/* Y[row][r] (=, +=, swiglu) Σ_c X[row][c] W[r][c] for up to 4 matrices (same bits and cols) whose rows
 * are concatenated (row_start), each writing its own y / y_stride. Dense: rows of X are tokens 0..n-1.
 * Grouped (tile_expert != NULL): the block walks a tile map of (expert, first position); positions p of
 * expert e are [offsets[e], offsets[e+1]); X row = gather ? gather[p] : p, output row = p; weights are
 * expert e's rows of m[0] (and m[1]); n_mats must be 1 (STORE) or 2 (SWIGLU). */
struct gemm_args {
    dmat m[GEMV_MAX_MATS];
    float *y[GEMV_MAX_MATS];
    int y_stride[GEMV_MAX_MATS];
    int row_start[GEMV_MAX_MATS + 1];
    int n_mats;
    gemm_act act;
    int epi;                  /* gemm_epilogue */
    /* grouped (MoE) */
    const int *tile_expert;   /* [max_tiles] */
    const int *tile_start;    /* [max_tiles] first position of the tile */
    const int *n_tiles;       /* device count of valid tiles */
    const int *offsets;       /* [n_experts + 1] */
    const int *gather;        /* [positions] X row of position p, or NULL */
    int max_tiles;            /* grid bound (host) */
    int tile_tokens;          /* grouped: tokens per tile, 16, 32, 64 or 128 (must match the plan); dense:
                               * unused (gemm_dense_tile picks) */
    int act_rows;             /* grouped without a gather, or 0: rows of act.x that may be read (all positions);
                               * lets gemm_variant 10 load X tiles by TMA (zeros past it) */
};

/* Input transform of n_rows rows (gemv_input_mode: plain, RMSNorm, gated RMSNorm; in.act fp32
 * [n_rows][in.act_stride]) into gemm_act form: out.x fp16 [n_rows][cols] (columns permuted per 16),
 * out.xs fp32 [n_rows][cols / 64], out.scale fp32 [n_rows] (gemm_prep.cu). Returns
 * cudaErrorInvalidValue unless cols % 64 == 0, cols > 0, n_rows > 0 and out.cols == cols (and, for the
 * shared-memory kernel, cols <= 12288 and a gated head_dim that is a multiple of 32), else the launch's
 * error. */
cudaError_t launch_gemm_prep(const gemv_input &in, int cols, int n_rows, const gemm_act &out, cudaStream_t s);

/* The GEMM for n_tokens rows of X (dense) or for the tile map (grouped; n_tokens unused). The kernel:
 * gemm_kernel (gemm_prefill.cu) for 16/32/64-token tiles, gemm2d_kernel (gemm_prefill_2d.cu) for
 * 128-token tiles (16 warps with g_cuda_tuning.gemm_variant 2, else 8) and, with gemm_variant >= 1, for
 * 64; same results either way. gemm_variant 3: gemm_wg_kernel (gemm_prefill_wgmma.cu, Hopper wgmma) for
 * 4-bit weights at 64/128 tokens on sm_90a (weights rounded to fp16: not bit-identical to the others),
 * else as variant 1; gemm_variant 4: the same kernel keeping one group's wgmmas in flight; 7: one commit
 * group per k16 slice (three wgmmas queued through each dequantization) with a lean step (a quarter
 * fewer instructions per group: the tile rows' X addresses in shared memory, a running stage slot, one
 * LOP3 less per weight pair); 9: 7 with the wgmma width of a ragged tile trimmed to its live tokens
 * (32 / 64 / 96: MoE tiles); 10: 9 with the X tile of a launch without a gather (dense, and grouped
 * with act_rows: the routed down) loaded by TMA (one 2D tensor copy per stage on an mbarrier, no proxy
 * fence per step; the others as 9); 11: 10, and the other launches (the gathered gate/up) with cp.async
 * completing on the stage's mbarrier instead of wait_group + fence.proxy.async (as CUTLASS's cp.async
 * GMMA mainloops); 3-11 give the same bits; 5, 6, 8 (removed) and 12 and up run as 3.
 * Dense tile: g_cuda_tuning.dense_tile or by n_tokens (gemm_dense_tile).
 * Returns cudaErrorInvalidValue for shapes it has no kernel for. */
cudaError_t launch_gemm(const gemm_args &a, int n_tokens, cudaStream_t s);

/* Whether gemm_variants 3-11 can run their wgmma kernel: the current device is compute capability 9.0 and
 * the runtime loaded the binary's sm_90a image (a device flag read once by cudaMemcpyFromSymbol, then
 * cached: first call outside stream capture, e.g. a prefill GEMM). */
bool gemm_wgmma_available(void);

/* Tokens per grouped tile for an average of `avg_rows` rows per expert: g_cuda_tuning.moe_tile when it
 * is 16, 32, 64 or 128; else 16 / 32 / 64 from 24 / 48 rows (gemm_variant 0), 16 / 64 from 24 rows
 * (variants 1, 2), 16 / 64 / 128 from 24 / 128 rows (variants 3-11). The plan (launch_moe_plan) and the
 * grouped GEMMs must get the same T (forward_prefill.cu calls this once per MoE block). */
int gemm_grouped_tile(double avg_rows);

/* ---- MoE routing (moe_prefill.cu) ---- */

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
