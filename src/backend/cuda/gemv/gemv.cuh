/* gemv.cuh — the GEMV op (y = W·x for each token row, up to 4 matrices reading the same input, with the
 * input transform fused in): its argument structs, the kernel choice and the launchers of gemv_decode.cu
 * (SIMT, any n), gemv_mma.cu (4-bit decode on tensor cores) and gemv_stream.cu (the same, weights streamed
 * by sm_90 bulk copies).
 */
#ifndef LILY_CUDA_GEMV_CUH
#define LILY_CUDA_GEMV_CUH

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/timeline.cuh"

/* Launch-time constants of one GEMV input transform (see gemv_decode.cu). */
enum gemv_input_mode {
    GEMV_IN_PLAIN = 0,   /* x = act */
    GEMV_IN_RMSNORM = 1, /* x = act * rsqrt(mean(act^2) + eps) * norm_w   (over all cols) */
    GEMV_IN_GATED = 2,   /* x = (act * rsqrt(mean_head(act^2) + eps)) * norm_w[d] * silu(z)  per head of head_dim */
};
enum gemv_output_mode {
    GEMV_OUT_STORE = 0,  /* y[row] = dot */
    GEMV_OUT_ADD = 1,    /* y[row] += dot (residual add; each row owned by one lane group) */
    GEMV_OUT_ARGMAX = 2, /* y[row] = dot, and atomicMax of (value, -row) into *argmax */
};

#define GEMV_MAX_MATS 4

/* The decode GEMV kernels (gemv_kernel_choose picks one per batch shape). */
enum gemv_kernel_id {
    GEMV_KERNEL_AUTO = 0,   /* gemv_batch.kernel: gemv_kernel_choose decides */
    GEMV_KERNEL_SIMT = 1,   /* gemv_decode.cu: fp32 FMA, any n_tokens, every storage width */
    GEMV_KERNEL_MMA = 2,    /* gemv_mma.cu: 4-bit, one token, tensor cores */
    GEMV_KERNEL_STREAM = 3, /* gemv_stream.cu: as MMA with the weights streamed by sm_90 bulk copies */
};

/* Up to 4 matrices with the same cols and bits that read the same input, outputs concatenated. */
struct gemv_batch {
    dmat m[GEMV_MAX_MATS];
    float *y[GEMV_MAX_MATS]; /* [n_tokens][y_stride] */
    int y_stride[GEMV_MAX_MATS];
    int row_start[GEMV_MAX_MATS + 1]; /* prefix of rows */
    int n_mats;
    int grid_cap; /* most blocks per token (0: 264 = 2 per SM of an H100/H200) */
    int exact;    /* 1 (exact mode): the fp32 SIMT kernel only, never gemv_mma / gemv_stream (fp16 operands) */
    int kernel;   /* gemv_kernel_id: GEMV_KERNEL_AUTO, or a kernel the batch's shape supports (tests) */
    unsigned long long *timeline; /* per-block stamps (timeline.cuh); NULL: none */
    /* The DeltaNet causal conv fused into the store (decode in_proj, gemv_stream only; conv_w NULL: none):
     * rows r < conv_rows of matrix 0 are conv channels; with x the dot, y[r] = silu(Σ_s w[r][s]·hist[s][r] +
     * w[r][3]·x) (K = 4 taps conv_w [conv_rows][4] fp32, history rows s = 0..2 of conv_state [2][3][conv_rows]
     * in ping-pong buffer *step & 1), and the history shifted by one with x last into buffer (*step & 1) ^ 1:
     * deltanet_decode.cu's conv (docs/MODEL.md §4.4 step 2), the same fp32 operations in the same order */
    const float *conv_w;
    float *conv_state;
    int conv_rows;
    const int *step; /* forward-call counter (device), written by the previous call */
};

struct gemv_input {
    const float *act;   /* [n_tokens][act_stride] */
    int act_stride;
    int mode;           /* gemv_input_mode */
    const float *norm_w;/* RMSNORM: [cols]; GATED: [head_dim] */
    const float *z;     /* GATED: [n_tokens][z_stride] */
    int z_stride;
    int head_dim;       /* GATED */
    float eps;
};

/* y = W x for n_tokens rows of x, every matrix of the batch, by b.kernel (AUTO:
 * gemv_kernel_choose). argmax may be NULL unless out_mode == GEMV_OUT_ARGMAX. Returns
 * cudaErrorInvalidValue for a shape it has no kernel for. */
cudaError_t launch_gemv(const gemv_batch &b, const gemv_input &in, int out_mode, int n_tokens,
                        unsigned long long *argmax, cudaStream_t s);
/* Whether gemv_decode.cu has a lane shape for rows of `cols` columns at `bits` (4, 8, 16): cols a
 * multiple of 128 / bits whose vector count is 4..128 (a power of two), 3 x 4..32, or 256 / 512 (bf16). */
bool gemv_cols_supported(int bits, int cols);
/* The one place a decode GEMV kernel is chosen: STREAM where gemv_stream_supported, else MMA where
 * gemv_mma_supported, else SIMT. */
gemv_kernel_id gemv_kernel_choose(const gemv_batch &b, int n_tokens);
/* gemv_mma.cu: the 4-bit decode (one token) GEMV on tensor cores (4-bit, n_tokens 1, cols % 128, cols /
 * min(cols, 512) in 1, 2, 4, 8, 16-byte aligned data, not exact). */
cudaError_t launch_gemv_mma(const gemv_batch &b, const gemv_input &in, int out_mode, unsigned long long *argmax,
                            cudaStream_t s);
bool gemv_mma_supported(const gemv_batch &b, int n_tokens);
/* gemv_stream.cu: the same GEMV with the weights streamed through a shared-memory ring (sm_90 bulk
 * copies): gemv_mma_supported, cols 512 / 1024 / 2048 / 4096, plain matrices, >= 1 KiB of weights, the
 * sm_90 code running. */
cudaError_t launch_gemv_stream(const gemv_batch &b, const gemv_input &in, int out_mode, unsigned long long *argmax,
                               cudaStream_t s);
bool gemv_stream_supported(const gemv_batch &b, int n_tokens);

#endif
