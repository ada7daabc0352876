/* gemm_prefill.cuh — the GEMM op of the prefill path: the activation pre-pass (input transform + fp16
 * conversion, gemm_prep.cu) and the dense / grouped (MoE) GEMM over MLX affine 4/8-bit or bf16 weights
 * (gemm_prefill.cu, gemm_prefill_2d.cu, gemm_prefill_wgmma.cu); the MoE routing kernels around the grouped
 * GEMMs are in moe/moe.cuh, the per-layer wiring in forward_prefill.cu.
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

#include "backend/cuda/gemv/gemv.cuh"

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

/* The GEMM kernel family of the prefill path, chosen once per backend (gemm_kernel_choose). */
enum gemm_kernel_id {
    GEMM_KERNEL_MMA = 0,    /* mma.sync on integer weights + per-group fold: gemm_kernel (16-token tiles),
                             * gemm2d_kernel (64, 128); any sm_80+ GPU; the bit-exact reference family */
    GEMM_KERNEL_WGMMA = 1,  /* as MMA, and gemm_wg_kernel (Hopper wgmma) for 4-bit weights at 64/128 tokens */
    GEMM_KERNEL_MMA_DQ = 2, /* as MMA, and gemm2d_kernel's DQ form (mma.sync on weights dequantized to fp16)
                             * for 4-bit weights at 64/128 tokens; any sm_80+ GPU */
};

/* GEMM_KERNEL_WGMMA when the current device runs the binary's sm_90a image (gemm_wgmma_available), else
 * GEMM_KERNEL_MMA_DQ (sm_80 ... sm_89, sm_120, and sm_90 without the sm_90a image). Call outside stream
 * capture (the first call reads a device flag). */
gemm_kernel_id gemm_kernel_choose(void);

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
    int tile_tokens;          /* grouped: tokens per tile, 16, 64 or 128 (gemm_grouped_tile; must match the
                               * plan); dense: 0 = gemm_dense_tile, or 16, 64, 128 */
    int act_rows;             /* grouped without a gather, or 0: rows of act.x that may be read (all positions);
                               * lets the wgmma kernel load X tiles by TMA (zeros past it) */
    int kernel;               /* gemm_kernel_id */
};

/* Input transform of n_rows rows (gemv_input_mode: plain, RMSNorm, gated RMSNorm; in.act fp32
 * [n_rows][in.act_stride]) into gemm_act form: out.x fp16 [n_rows][cols] (columns permuted per 16),
 * out.xs fp32 [n_rows][cols / 64], out.scale fp32 [n_rows] (gemm_prep.cu). Returns
 * cudaErrorInvalidValue unless cols % 64 == 0, cols > 0, n_rows > 0 and out.cols == cols (and, for the
 * shared-memory kernel, cols <= 12288 and a gated head_dim that is a multiple of 32), else the launch's
 * error. */
cudaError_t launch_gemm_prep(const gemv_input &in, int cols, int n_rows, const gemm_act &out, cudaStream_t s);
/* The same by the one-block-per-row kernel that launch_gemm_prep falls back to (tests compare the two). */
cudaError_t launch_gemm_prep_block(const gemv_input &in, int cols, int n_rows, const gemm_act &out, cudaStream_t s);

/* The GEMM for n_tokens rows of X (dense) or for the tile map (grouped; n_tokens unused), by the kernel
 * family a.kernel: gemm_kernel (gemm_prefill.cu) for 16-token tiles, gemm2d_kernel (gemm_prefill_2d.cu)
 * for 64/128; for 4-bit weights at 64/128, GEMM_KERNEL_WGMMA runs gemm_wg_kernel (gemm_prefill_wgmma.cu)
 * and GEMM_KERNEL_MMA_DQ gemm2d_kernel's DQ form (both round the weights to fp16: not bit-identical to
 * GEMM_KERNEL_MMA). Returns cudaErrorInvalidValue for shapes it has no kernel for (and for
 * GEMM_KERNEL_WGMMA on a device without the sm_90a image). */
cudaError_t launch_gemm(const gemm_args &a, int n_tokens, cudaStream_t s);

/* Whether the wgmma kernel can run: the current device is compute capability 9.0 and the runtime loaded
 * the binary's sm_90a image (a device flag read once by cudaMemcpyFromSymbol, then cached: first call
 * outside stream capture). */
bool gemm_wgmma_available(void);

/* Tokens per grouped tile for an average of `avg_rows` rows per expert under kernel family `kernel`:
 * 16 / 64 from 24 rows (MMA, MMA_DQ), 16 / 64 / 128 from 24 / 128 rows (WGMMA). The plan (launch_moe_plan)
 * and the grouped GEMMs must get the same T (forward_prefill.cu calls this once per MoE block). */
int gemm_grouped_tile(int kernel, double avg_rows);
/* Tokens per block of a dense GEMM of n_tokens rows: 16 up to 16 tokens, then 64 (MMA: 128-token tiles
 * measured slower with the integer-weight kernels), WGMMA and MMA_DQ 128 from 128 tokens (the same
 * dequantized A feeds twice the tokens). */
int gemm_dense_tile(int kernel, int n_tokens);

#endif
