/* gemv_decode.cu — dense y = W·x for one activation row per token (decode), also used row by row for
 * prefill (grid.y = token; the weight tiles are re-read from L2 across tokens).
 *
 * One launch serves up to 4 matrices that read the same input (qkv + z + b + a; q + k + v; router +
 * shared-expert gate), with the input transform fused in (RMSNorm of the residual stream, or the
 * Gated DeltaNet's per-head gated RMSNorm) and the output either stored, added into the residual
 * stream, or stored with a device-side argmax (LM head + greedy sampling).
 *
 * Launch shape: 128 threads (4 warps); a warp owns `rows_per_warp` consecutive rows, a lane group of
 * LPR lanes one row at a time, U = 4 rows of loads in flight. grid = (ceil(rows / rows_per_block), n_tokens).
 */
#include "gemv_common.cuh"

#define GEMV_WARPS 4
#define GEMV_UNROLL_MAX 4

template <int BITS, int LPR, int VPL, int IN_MODE, int OUT_MODE>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_kernel(gemv_batch b, gemv_input in, int rows_per_warp, int total_rows, unsigned long long *argmax)
{
    constexpr int CPV = 128 / BITS;
    constexpr int RPW = 32 / LPR; /* rows per warp pass */
    constexpr int GEMV_UNROLL = VPL >= 4 ? 2 : GEMV_UNROLL_MAX; /* rows of loads in flight per lane group */
    const int lane = threadIdx.x & 31;
    const int li = lane % LPR, sub = lane / LPR;
    const int warp = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    const int t = blockIdx.y;
    const int r0 = warp * rows_per_warp;
    if (r0 >= total_rows)
        return;
    const int cols = b.m[0].cols;

    float x[VPL][CPV];
    x_load<BITS, LPR, VPL>(in.act + (int64_t)t * in.act_stride, li, x);
    if (IN_MODE == GEMV_IN_RMSNORM) {
        x_rmsnorm<BITS, LPR, VPL>(x, in.norm_w, cols, in.eps, li);
    } else if (IN_MODE == GEMV_IN_GATED) {
        /* per head of head_dim columns: (x * rsqrt(mean(x^2)+eps)) * w[d] * silu(z) */
        const float *z = in.z + (int64_t)t * in.z_stride;
#pragma unroll
        for (int j = 0; j < VPL; j++) {
            float ss = 0.0f;
#pragma unroll
            for (int c = 0; c < CPV; c++)
                ss = fmaf(x[j][c], x[j][c], ss);
            for (int o = 1; o * CPV < in.head_dim; o <<= 1)
                ss += __shfl_xor_sync(0xffffffffu, ss, o);
            const float r = rsqrtf(ss / (float)in.head_dim + in.eps);
            const int c0 = (j * LPR + li) * CPV;
#pragma unroll
            for (int c = 0; c < CPV; c++) {
                const int col = c0 + c;
                x[j][c] = x[j][c] * r * in.norm_w[col % in.head_dim] * silu_f(z[col]);
            }
        }
    }
    float xs[VPL];
    x_sums<BITS, VPL>(x, xs);

    float best = -INFINITY;
    int best_row = 0x7fffffff;
    const int r_end = min(r0 + rows_per_warp, total_rows);
    for (int rb = r0; rb < r_end; rb += RPW * GEMV_UNROLL) {
        row_frag<BITS, VPL> f[GEMV_UNROLL];
        int mi[GEMV_UNROLL], lr[GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int row = rb + u * RPW + sub;
            int m = 0;
#pragma unroll
            for (int k = 1; k < GEMV_MAX_MATS; k++)
                if (k < b.n_mats && row >= b.row_start[k])
                    m = k;
            mi[u] = m;
            lr[u] = row - b.row_start[m];
            if (row < r_end)
                row_load<BITS, LPR, VPL>(b.m[m], lr[u], li, f[u]);
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int row = rb + u * RPW + sub;
            float acc = row_dot<BITS, VPL>(f[u], x, xs);
            acc = group_sum<LPR>(acc);
            if (row < r_end && li == 0) {
                float *y = b.y[mi[u]] + (int64_t)t * b.y_stride[mi[u]] + lr[u];
                if (OUT_MODE == GEMV_OUT_ADD)
                    *y += acc;
                else
                    *y = acc;
                if (OUT_MODE == GEMV_OUT_ARGMAX && acc > best) {
                    best = acc;
                    best_row = row;
                }
            }
        }
    }
    if (OUT_MODE == GEMV_OUT_ARGMAX) {
        unsigned long long k = best_row == 0x7fffffff ? 0ull : argmax_key(best, best_row);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            unsigned long long k2 = __shfl_xor_sync(0xffffffffu, k, o);
            k = k2 > k ? k2 : k;
        }
        if (lane == 0 && k)
            atomicMax(argmax + t, k);
    }
}

/* ---- dispatch: the one place that maps (bits, cols) to a lane shape ------------------------------- */

template <int BITS, int LPR, int VPL>
static cudaError_t gemv_go(const gemv_batch &b, const gemv_input &in, int out_mode, int n_tokens,
                           unsigned long long *argmax, cudaStream_t s)
{
    const int total = b.row_start[b.n_mats];
    /* rows per warp: enough rows per x load, but enough warps to fill the GPU (>= ~4 per SM) */
    int rpw = 32 / LPR * GEMV_UNROLL_MAX;
    while (rpw * 2 * 1056 <= total && rpw < 64)
        rpw *= 2;
    const int rows_per_block = rpw * GEMV_WARPS;
    dim3 grid((total + rows_per_block - 1) / rows_per_block, n_tokens);
#define GO(IM, OM) gemv_kernel<BITS, LPR, VPL, IM, OM><<<grid, GEMV_WARPS * 32, 0, s>>>(b, in, rpw, total, argmax)
    if (in.mode == GEMV_IN_PLAIN) {
        if (out_mode == GEMV_OUT_STORE) GO(GEMV_IN_PLAIN, GEMV_OUT_STORE);
        else if (out_mode == GEMV_OUT_ADD) GO(GEMV_IN_PLAIN, GEMV_OUT_ADD);
        else return cudaErrorInvalidValue;
    } else if (in.mode == GEMV_IN_RMSNORM) {
        if (out_mode == GEMV_OUT_STORE) GO(GEMV_IN_RMSNORM, GEMV_OUT_STORE);
        else if (out_mode == GEMV_OUT_ARGMAX) GO(GEMV_IN_RMSNORM, GEMV_OUT_ARGMAX);
        else return cudaErrorInvalidValue;
    } else if (in.mode == GEMV_IN_GATED) {
        if (out_mode == GEMV_OUT_ADD) GO(GEMV_IN_GATED, GEMV_OUT_ADD);
        else return cudaErrorInvalidValue;
    } else {
        return cudaErrorInvalidValue;
    }
#undef GO
    return cudaGetLastError();
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
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t launch_gemv(const gemv_batch &b, const gemv_input &in, int out_mode, int n_tokens,
                        unsigned long long *argmax, cudaStream_t s)
{
    for (int k = 1; k < b.n_mats; k++)
        if (b.m[k].cols != b.m[0].cols || b.m[k].bits != b.m[0].bits)
            return cudaErrorInvalidValue;
    if (in.mode == GEMV_IN_GATED && (in.head_dim % (128 / b.m[0].bits)) != 0)
        return cudaErrorInvalidValue;
    switch (b.m[0].bits) {
    case 4: return gemv_bits<4>(b, in, out_mode, n_tokens, argmax, s);
    case 8: return gemv_bits<8>(b, in, out_mode, n_tokens, argmax, s);
    case 16: return gemv_bits<16>(b, in, out_mode, n_tokens, argmax, s);
    default: return cudaErrorInvalidValue;
    }
}
