/* gemv_stream.cu — the 4-bit decode GEMV (one activation row, y = W·x on tensor cores, the tile math
 * of mma_gemv.cuh, results bit-identical to gemv_mma.cu) with the weights streamed through a
 * shared-memory ring by sm_90 bulk copies (cp.async.bulk + mbarrier), so that ~80-160 KB per SM (the
 * rings of two blocks: GS_BLOCKS_PER_SM) are in flight instead of the ~32 KB gemv_mma keeps in registers:
 * at ~2 µs loaded latency an SM needs ~64 KB in flight to draw its 1/132 of the H200's ~4.2 TB/s.
 *
 * Shape (as gemv_mma): a tile is 16 rows of one matrix; KS = cols / 512 warps split its columns (a
 * warp owns 512 columns, 4 mma steps); a block of 8 warps consumes a group of RT = 8 / KS tiles, groups
 * grid-stride (grid = blocks resident at once). Ring: `stages` slots per tile position rt, a slot holds
 * one whole tile — 16 rows of row_bytes + 64 bytes (the pad puts rows g and g + 1 of a quarter-warp's
 * 16-byte reads in different banks) and the tile's scales and biases as in global memory. Copies: one
 * bulk copy per row and one each for scales and biases, issued by lanes 0..17 of the tile's first warp,
 * completing on the slot's mbarrier (expect_tx = the bytes). The first `stages` groups are issued
 * before pdl_wait() (weights only), so a small matrix is entirely in flight while the previous kernel
 * finishes. Per group each warp waits on its slot's mbarrier, builds its fragment from shared memory
 * (mg_load_smem), runs mg_dot, and the KS warps of a tile meet at one named barrier (none when KS = 1)
 * that both publishes the column partials (s_part, double-buffered by group parity) and frees the
 * slot; the tile's first warp then refills the slot with the group `stages` ahead and lanes 0..15
 * reduce and store one row each (STORE / ADD / ARGMAX exactly as gemv_mma). x side as gemv_mma's
 * (mg_x_side: per warp, no block barrier but an RMSNorm's sum of squares); none after it.
 *
 * Requirements (gemv_stream_supported; otherwise gemv_mma runs): gemv_mma_supported, cols in {512, 1024,
 * 2048, 4096}, rows 16-byte aligned, the sm_90 code running (cuda_sm90_code: the compute_80 PTX has an
 * empty body).
 */
#include "gemv_stream.cuh"

template <int IN_MODE, int OUT_MODE, int KS, bool REGS>
__global__ void __launch_bounds__(GS_WARPS * 32, 2)
gemv_stream_kernel(gemv_batch b, gemv_input in, int n_tiles, int stages, unsigned long long *argmax)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    gs_front_plain<IN_MODE, KS, REGS> front;
    gs_run<IN_MODE, OUT_MODE, KS>(b, in, n_tiles, stages, argmax, front);
#endif
}

/* ---- dispatch ------------------------------------------------------------------------------------ */

static int64_t gs_weight_bytes(const gemv_batch &b)
{
    int64_t bytes = 0;
    for (int k = 0; k < b.n_mats; k++)
        bytes += (int64_t)b.m[k].rows * (b.m[k].cols / 2 + (b.m[k].cols / 64) * 4);
    return bytes;
}

bool gemv_stream_supported(const gemv_batch &b, int n_tokens)
{
    if (!gemv_mma_supported(b, n_tokens))
        return false;
    const int cols = b.m[0].cols;
    if (!(cols == 512 || cols == 1024 || cols == 2048 || cols == 4096))
        return false;
    for (int k = 0; k < b.n_mats; k++)
        if (b.m[k].n_experts > 1 || b.m[k].row_bytes % 16 || b.m[k].row_bytes < cols / 2)
            return false;
    if (gs_weight_bytes(b) < 1024)
        return false;
    return cuda_sm90_code(); /* bulk copies and mbarrier transaction counts: the sm_90 code only */
}

template <int IM, int OM, int KS, bool REGS>
static cudaError_t gs_go(const gemv_batch &b, const gemv_input &in, unsigned long long *argmax, cudaStream_t s)
{
    void (*kern)(gemv_batch, gemv_input, int, int, unsigned long long *) = gemv_stream_kernel<IM, OM, KS, REGS>;
    int tiles = 0;
    for (int k = 0; k < b.n_mats; k++)
        tiles += (b.m[k].rows + 15) / 16;
    const int cols = b.m[0].cols;
    const size_t x_bytes = REGS ? (size_t)mg_warp_x_floats(cols, GS_WARPS) * 4
                                : (size_t)cols * 4 + (size_t)cols * 2 + (size_t)(cols / 64) * 8;
    static gs_occupancy occ; /* asked once per instantiation */
    int grid = 0, stages = 0;
    size_t smem = 0;
    const cudaError_t e = gs_launch_shape(kern, occ, tiles, cols, GS_WARPS / KS, x_bytes, &grid, &stages, &smem);
    if (e != cudaSuccess)
        return e;
    return launch_pdl(kern, dim3(grid), dim3(GS_WARPS * 32), smem, s, b, in, tiles, stages, argmax);
}

template <int IM, int OM>
static cudaError_t gs_ks(const gemv_batch &b, const gemv_input &in, unsigned long long *argmax, cudaStream_t s)
{
    const bool regs = mg_x_regs_ok<IM, GS_WARPS>(in, b.m[0].cols);
    switch (b.m[0].cols / 512) {
    case 1: return regs ? gs_go<IM, OM, 1, true>(b, in, argmax, s) : gs_go<IM, OM, 1, false>(b, in, argmax, s);
    case 2: return regs ? gs_go<IM, OM, 2, true>(b, in, argmax, s) : gs_go<IM, OM, 2, false>(b, in, argmax, s);
    case 4: return regs ? gs_go<IM, OM, 4, true>(b, in, argmax, s) : gs_go<IM, OM, 4, false>(b, in, argmax, s);
    case 8: return regs ? gs_go<IM, OM, 8, true>(b, in, argmax, s) : gs_go<IM, OM, 8, false>(b, in, argmax, s);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t launch_gemv_stream(const gemv_batch &b, const gemv_input &in, int out_mode, unsigned long long *argmax,
                               cudaStream_t s)
{
    if (!gemv_stream_supported(b, 1))
        return cudaErrorInvalidValue;
    if (in.mode == GEMV_IN_PLAIN) {
        if (out_mode == GEMV_OUT_STORE) return gs_ks<GEMV_IN_PLAIN, GEMV_OUT_STORE>(b, in, argmax, s);
        if (out_mode == GEMV_OUT_ADD) return gs_ks<GEMV_IN_PLAIN, GEMV_OUT_ADD>(b, in, argmax, s);
    } else if (in.mode == GEMV_IN_RMSNORM) {
        if (out_mode == GEMV_OUT_STORE) return gs_ks<GEMV_IN_RMSNORM, GEMV_OUT_STORE>(b, in, argmax, s);
        if (out_mode == GEMV_OUT_ARGMAX) return gs_ks<GEMV_IN_RMSNORM, GEMV_OUT_ARGMAX>(b, in, argmax, s);
    } else if (in.mode == GEMV_IN_GATED) {
        if (out_mode == GEMV_OUT_ADD) return gs_ks<GEMV_IN_GATED, GEMV_OUT_ADD>(b, in, argmax, s);
    }
    return cudaErrorInvalidValue;
}
