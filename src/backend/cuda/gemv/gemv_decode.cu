/* gemv_decode.cu — dense y = W·x for one activation row per token (decode), also used row by row for
 * prefill (grid.y = token; the weight tiles are re-read from L2 across tokens).
 *
 * One launch serves up to 4 matrices that read the same input (qkv + z + b + a; q + k + v; router +
 * shared-expert gate), with the input transform fused in (RMSNorm of the residual stream, or the
 * Gated DeltaNet's per-head gated RMSNorm) and the output either stored, added into the residual
 * stream, or stored with a device-side argmax (LM head + greedy sampling).
 *
 * Launch shape: 256 threads (8 warps), grid = (min(row groups / 8, blocks resident at once), n_tokens). The block applies the
 * input transform once into shared memory (x as fp32), each warp copies its lanes' x into registers;
 * a lane group of LPR lanes owns a row, a warp takes groups of U passes (U*32/LPR rows) grid-stride, with
 * the next group's loads issued before the current one is stored. The first group's weight loads are
 * issued before pdl_wait(), overlapping the previous kernel's tail (programmatic dependent launch).
 */
#include "gemv_common.cuh"

#define GEMV_WARPS 8
#define GEMV_UNROLL_MAX 4
#define GEMV_GRID_CAP 264

template <int BITS, int LPR, int VPL, int IN_MODE, int OUT_MODE>
__global__ void __launch_bounds__(GEMV_WARPS * 32, VPL <= 2 ? 2 : 1)
gemv_kernel(gemv_batch b, gemv_input in, int total_rows, unsigned long long *argmax)
{
    tl_block<> tl(b.timeline);
    constexpr int CPV = 128 / BITS;
    constexpr int RPW = 32 / LPR; /* rows per warp pass */
    constexpr int U = VPL >= 2 ? 2 : GEMV_UNROLL_MAX; /* passes of loads in flight per warp */
    constexpr int GROUP = RPW * U;
    extern __shared__ float s_x[];
    __shared__ float s_red[GEMV_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int li = lane % LPR, sub = lane / LPR;
    const int t = blockIdx.y;
    const int W = gridDim.x * GEMV_WARPS;
    const int n_groups = (total_rows + GROUP - 1) / GROUP;
    const int cols = b.m[0].cols;

    row_frag<BITS, VPL> f[U];
    int mi[U], lr[U];
    auto load_group = [&](int g) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int row = g * GROUP + u * RPW + sub;
            int m = 0;
#pragma unroll
            for (int k = 1; k < GEMV_MAX_MATS; k++)
                if (k < b.n_mats && row >= b.row_start[k])
                    m = k;
            mi[u] = m;
            lr[u] = row - b.row_start[m];
            if (row < total_rows)
                row_load<BITS, LPR, VPL>(b.m[m], lr[u], li, f[u]);
        }
    };
    int g = blockIdx.x * GEMV_WARPS + warp;
    if (g < n_groups)
        load_group(g); /* weights only: may run before the previous kernel finishes */
    gemv_input_prefetch<GEMV_WARPS>(in, cols);
    pdl_wait();
    tl.waited();
    pdl_trigger();
    gemv_prologue<IN_MODE, GEMV_WARPS>(in, t, cols, s_x, s_red);

    float x[VPL][CPV];
    x_from_smem<BITS, LPR, VPL>(s_x, li, x);
    float xs[VPL];
    x_sums<BITS, VPL>(x, xs);
    x_prescale4<BITS, VPL>(x);
    tl.mark();

    float best = -INFINITY;
    int best_row = 0x7fffffff;
    for (; g < n_groups; g += W) {
        float acc[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            acc[u] = group_sum<LPR>(row_dot<BITS, VPL>(f[u], x, xs));
        int mo[U], lo[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            mo[u] = mi[u], lo[u] = lr[u];
        const int g0 = g;
        if (g + W < n_groups)
            load_group(g + W); /* next group's loads in flight while this one is stored */
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int row = g0 * GROUP + u * RPW + sub;
            if (row < total_rows && li == 0) {
                float *y = b.y[mo[u]] + (int64_t)t * b.y_stride[mo[u]] + lo[u];
                if (OUT_MODE == GEMV_OUT_ADD)
                    *y += acc[u];
                else
                    *y = acc[u];
                if (OUT_MODE == GEMV_OUT_ARGMAX && acc[u] > best) {
                    best = acc[u];
                    best_row = row;
                }
            }
        }
    }
    if (OUT_MODE == GEMV_OUT_ARGMAX)
        warp_argmax_publish(best, best_row, lane, argmax + t);
}

/* ---- dispatch: the one place that maps (bits, cols) to a lane shape ------------------------------- */

template <int BITS, int LPR, int VPL>
static cudaError_t gemv_go(const gemv_batch &b, const gemv_input &in, int out_mode, int n_tokens,
                           unsigned long long *argmax, cudaStream_t s)
{
    constexpr int U = VPL >= 2 ? 2 : GEMV_UNROLL_MAX;
    const int total = b.row_start[b.n_mats];
    const int n_groups = (total + (32 / LPR) * U - 1) / ((32 / LPR) * U);
    /* one wave: as many blocks as fit on the GPU at once (asked once per kernel instance) */
    static int resident = 0;
    if (!resident) { /* a failed query falls back to the fixed cap (errors surface at the launch) */
        const cudaError_t e = cuda_resident_blocks(gemv_kernel<BITS, LPR, VPL, GEMV_IN_RMSNORM, GEMV_OUT_STORE>, GEMV_WARPS * 32,
                                                   (size_t)b.m[0].cols * sizeof(float), &resident);
        if (e != cudaSuccess || resident <= 0)
            resident = GEMV_GRID_CAP;
    }
    const int cap = b.grid_cap > 0 ? b.grid_cap : resident;
    int gx = (n_groups + GEMV_WARPS - 1) / GEMV_WARPS;
    gx = gx < cap ? gx : cap;
    dim3 grid(gx, n_tokens);
    const size_t smem = (size_t)b.m[0].cols * sizeof(float);
#define GO(IM, OM) return launch_pdl(gemv_kernel<BITS, LPR, VPL, IM, OM>, grid, dim3(GEMV_WARPS * 32), smem, s, b, in, total, argmax)
    if (in.mode == GEMV_IN_PLAIN) {
        if (out_mode == GEMV_OUT_STORE) GO(GEMV_IN_PLAIN, GEMV_OUT_STORE);
        if (out_mode == GEMV_OUT_ADD) GO(GEMV_IN_PLAIN, GEMV_OUT_ADD);
    } else if (in.mode == GEMV_IN_RMSNORM) {
        if (out_mode == GEMV_OUT_STORE) GO(GEMV_IN_RMSNORM, GEMV_OUT_STORE);
        if (out_mode == GEMV_OUT_ARGMAX) GO(GEMV_IN_RMSNORM, GEMV_OUT_ARGMAX);
    } else if (in.mode == GEMV_IN_GATED) {
        if (out_mode == GEMV_OUT_ADD) GO(GEMV_IN_GATED, GEMV_OUT_ADD);
    }
#undef GO
    return cudaErrorInvalidValue;
}

template <int BITS>
static cudaError_t gemv_bits(const gemv_batch &b, const gemv_input &in, int out_mode, int n_tokens,
                             unsigned long long *argmax, cudaStream_t s)
{
    constexpr int CPV = 128 / BITS;
    const int nvec = b.m[0].cols / CPV;
    switch (nvec) {
    case 4: return gemv_go<BITS, 4, 1>(b, in, out_mode, n_tokens, argmax, s);
    case 8: return gemv_go<BITS, 8, 1>(b, in, out_mode, n_tokens, argmax, s);
    case 16: return gemv_go<BITS, 16, 1>(b, in, out_mode, n_tokens, argmax, s);
    case 32: return gemv_go<BITS, 32, 1>(b, in, out_mode, n_tokens, argmax, s);
    case 64: return gemv_go<BITS, 32, 2>(b, in, out_mode, n_tokens, argmax, s);
    case 128: return gemv_go<BITS, 32, 4>(b, in, out_mode, n_tokens, argmax, s);
    case 256: if constexpr (BITS == 16) return gemv_go<BITS, 32, 8>(b, in, out_mode, n_tokens, argmax, s); else return cudaErrorInvalidValue;
    case 512: if constexpr (BITS == 16) return gemv_go<BITS, 32, 16>(b, in, out_mode, n_tokens, argmax, s); else return cudaErrorInvalidValue;
    /* three vectors per lane: rows of 3 * 2^k vectors (hidden 384 / 768 / 1536 / 3072 at 4 or 8 bits) */
    case 12: return gemv_go<BITS, 4, 3>(b, in, out_mode, n_tokens, argmax, s);
    case 24: return gemv_go<BITS, 8, 3>(b, in, out_mode, n_tokens, argmax, s);
    case 48: return gemv_go<BITS, 16, 3>(b, in, out_mode, n_tokens, argmax, s);
    case 96: return gemv_go<BITS, 32, 3>(b, in, out_mode, n_tokens, argmax, s);
    default: return cudaErrorInvalidValue;
    }
}

bool gemv_cols_supported(int bits, int cols)
{
    if (bits != 4 && bits != 8 && bits != 16)
        return false;
    const int cpv = 128 / bits;
    if (cols <= 0 || cols % cpv || (size_t)cols * sizeof(float) > 48 * 1024)
        return false;
    switch (cols / cpv) { /* the cases of gemv_bits */
    case 4: case 8: case 16: case 32: case 64: case 128: case 12: case 24: case 48: case 96: return true;
    case 256: case 512: return bits == 16;
    default: return false;
    }
}

gemv_kernel_id gemv_kernel_choose(const gemv_batch &b, int n_tokens)
{
    if (gemv_stream_supported(b, n_tokens))
        return GEMV_KERNEL_STREAM;
    if (gemv_mma_supported(b, n_tokens))
        return GEMV_KERNEL_MMA;
    return GEMV_KERNEL_SIMT;
}

cudaError_t launch_gemv(const gemv_batch &b, const gemv_input &in, int out_mode, int n_tokens,
                        unsigned long long *argmax, cudaStream_t s)
{
    for (int k = 1; k < b.n_mats; k++)
        if (b.m[k].cols != b.m[0].cols || b.m[k].bits != b.m[0].bits)
            return cudaErrorInvalidValue;
    const gemv_kernel_id k = b.kernel != GEMV_KERNEL_AUTO ? (gemv_kernel_id)b.kernel : gemv_kernel_choose(b, n_tokens);
    if (k == GEMV_KERNEL_STREAM)
        return launch_gemv_stream(b, in, out_mode, argmax, s); /* gemv_stream.cu */
    if (b.conv_w) /* the fused DeltaNet conv: the streamed kernel only */
        return cudaErrorInvalidValue;
    if (k == GEMV_KERNEL_MMA)
        return launch_gemv_mma(b, in, out_mode, argmax, s); /* gemv_mma.cu */
    if (in.mode == GEMV_IN_GATED && (in.head_dim % (128 / b.m[0].bits)) != 0)
        return cudaErrorInvalidValue;
    switch (b.m[0].bits) {
    case 4: return gemv_bits<4>(b, in, out_mode, n_tokens, argmax, s);
    case 8: return gemv_bits<8>(b, in, out_mode, n_tokens, argmax, s);
    case 16: return gemv_bits<16>(b, in, out_mode, n_tokens, argmax, s);
    default: return cudaErrorInvalidValue;
    }
}
