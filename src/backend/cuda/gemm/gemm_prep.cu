/* gemm_prep.cu — the activation pre-pass of the prefill GEMMs: n rows of fp32 activations through the
 * input transform (gemv_input_mode: plain, RMSNorm, the DeltaNet gated RMSNorm of docs/MODEL.md §4.4 step 9)
 * into gemm_act form (gemm_prefill.cuh): fp16 with the columns of each 16-column block permuted
 * (gemm_perm16), times a per-row power of two that puts the row's largest |x| in [2^13, 2^14); the
 * group sums Σx of each 64 columns (of the rounded fp16 values; the mma.sync kernels fold them in, the
 * wgmma kernel does not read them); and the inverse power of two the GEMM epilogue multiplies back.
 *
 *   gemm_prep_rows_kernel<MODE, WPR>: WPR = 1, 2, 4 or 8 warps
 *     per row (cols <= 1024 · WPR), 8 / WPR rows per 256-thread block. Lane l of a row's warp w owns
 *     the 8-column chunks w · cpw + l + 32 i (cpw = cols / 8 / WPR chunks per warp, i < 4): two float4
 *     loads each, kept in registers through the norm, the row max and the fp16 writes (one 16-byte
 *     store per chunk: a chunk is half of a 16-column block and perm16 stays inside that half). A
 *     64-column group is 8 neighbouring lanes, a gated-norm head head_dim / 8 neighbouring lanes:
 *     their sums are shuffles; the row sums cross warps through shared memory only when WPR > 1.
 *   gemm_prep_kernel<MODE>: one block of 256 threads per row through shared memory (gemv_prologue);
 *     every shape the rows kernel does not take (launch_gemm_prep_block).
 * The two agree to rounding (the norms sum in different orders); test_cuda_prefill_gemm compares them.
 */
#include "gemm_prefill.cuh"
#include "backend/cuda/gemv/gemv_common.cuh"

#define GEMM_PREP_THREADS 256
#define PREP_MAX_CHUNKS 4 /* 8-column chunks per lane */

/* The power of two that brings a row max m into [2^13, 2^14): *inv multiplies
 * x before rounding, the return value multiplies the GEMM result back. */
__device__ __forceinline__ float prep_scale(float m, float *inv)
{
    int ex = 0;
    if (m > 0.0f && m <= 3.0e38f) {
        ex = (int)((__float_as_uint(m) >> 23) & 0xff) - 127 - 13;
        ex = max(-100, min(100, ex));
    }
    *inv = __uint_as_float((unsigned int)(127 - ex) << 23);
    return __uint_as_float((unsigned int)(127 + ex) << 23);
}

/* ---- one block per row ----------------------------------------------------------------------------- */

template <int IN_MODE>
__global__ void __launch_bounds__(GEMM_PREP_THREADS) gemm_prep_kernel(gemv_input in, int cols, gemm_act out)
{
    constexpr int NW = GEMM_PREP_THREADS / 32;
    extern __shared__ float s_x[]; /* [cols] */
    __shared__ float s_red[NW];
    __shared__ float s_max[NW];
    const int t = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    gemv_prologue<IN_MODE, NW>(in, t, cols, s_x, s_red);
    float m = 0.0f;
    for (int c = tid; c < cols; c += GEMM_PREP_THREADS)
        m = fmaxf(m, fabsf(s_x[c]));
    m = warp_max(m);
    if (lane == 0)
        s_max[warp] = m;
    __syncthreads();
    m = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; w++)
        m = fmaxf(m, s_max[w]);
    /* power of two so that the largest |x| lands in [2^13, 2^14): far from fp16 overflow, and the row's
     * small values keep their precision */
    float inv;
    const float scale = prep_scale(m, &inv);
    __half *xo = out.x + (size_t)t * cols;
    for (int q = tid; q < cols / 8; q += GEMM_PREP_THREADS) {
        const int p0 = q * 8, b16 = p0 & ~15, l0 = p0 & 15;
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            __half2 h = __floats2half2_rn(s_x[b16 + gemm_perm16(l0 + 2 * i)] * inv,
                                          s_x[b16 + gemm_perm16(l0 + 2 * i + 1)] * inv);
            w[i] = *reinterpret_cast<uint32_t *>(&h);
        }
        *reinterpret_cast<uint4 *>(xo + p0) = make_uint4(w[0], w[1], w[2], w[3]);
    }
    const int gpr = cols / 64;
    for (int g = warp; g < gpr; g += NW) {
        float v = __half2float(__float2half_rn(s_x[g * 64 + lane] * inv)) +
                  __half2float(__float2half_rn(s_x[g * 64 + 32 + lane] * inv));
        v = warp_sum(v);
        if (lane == 0)
            out.xs[(size_t)t * gpr + g] = v;
    }
    if (tid == 0)
        out.scale[t] = scale;
}

cudaError_t launch_gemm_prep_block(const gemv_input &in, int cols, int n_rows, const gemm_act &out, cudaStream_t s)
{
    const size_t smem = (size_t)cols * sizeof(float);
    if (smem > 48 * 1024)
        return cudaErrorInvalidValue;
    switch (in.mode) {
    case GEMV_IN_PLAIN: gemm_prep_kernel<GEMV_IN_PLAIN><<<n_rows, GEMM_PREP_THREADS, smem, s>>>(in, cols, out); break;
    case GEMV_IN_RMSNORM: gemm_prep_kernel<GEMV_IN_RMSNORM><<<n_rows, GEMM_PREP_THREADS, smem, s>>>(in, cols, out); break;
    case GEMV_IN_GATED:
        if (in.head_dim % 32 || in.head_dim > 32 * PRO_MAX || cols % in.head_dim)
            return cudaErrorInvalidValue;
        gemm_prep_kernel<GEMV_IN_GATED><<<n_rows, GEMM_PREP_THREADS, smem, s>>>(in, cols, out);
        break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* ---- WPR warps per row, values in registers ------------------------------------------------------ */

/* Sum (or max) of v over the WPR warps of a row through s_red[row in block][WPR]; every warp of the
 * block calls it (one barrier pair). */
template <int WPR, bool MAX>
__device__ __forceinline__ float prep_row_reduce(float v, float (*s_red)[8], int rib, int wr, int lane)
{
    v = MAX ? warp_max(v) : warp_sum(v);
    if (WPR == 1)
        return v;
    if (lane == 0)
        s_red[rib][wr] = v;
    __syncthreads();
    float r = 0.0f;
#pragma unroll
    for (int w = 0; w < WPR; w++)
        r = MAX ? fmaxf(r, s_red[rib][w]) : r + s_red[rib][w];
    __syncthreads(); /* s_red is reused by the next reduction */
    return r;
}

template <int IN_MODE, int WPR>
__global__ void __launch_bounds__(GEMM_PREP_THREADS)
gemm_prep_rows_kernel(gemv_input in, int cols, int n_rows, gemm_act out)
{
    constexpr int RPB = GEMM_PREP_THREADS / 32 / WPR; /* rows per block */
    __shared__ float s_red[RPB][8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rib = warp / WPR, wr = warp % WPR;
    const int t = blockIdx.x * RPB + rib;
    const bool live = t < n_rows; /* no early return: the cross-warp reductions have barriers */
    const int cpw = cols / 8 / WPR, c0 = wr * cpw;
    const float *act = in.act + (int64_t)(live ? t : 0) * in.act_stride;

    float v[PREP_MAX_CHUNKS][8];
#pragma unroll
    for (int i = 0; i < PREP_MAX_CHUNKS; i++) {
        const int j = lane + 32 * i;
        const bool ok = live && j < cpw;
        const float4 *p = reinterpret_cast<const float4 *>(act + (c0 + j) * 8);
        const float4 a = ok ? p[0] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float4 b = ok ? p[1] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        v[i][0] = a.x, v[i][1] = a.y, v[i][2] = a.z, v[i][3] = a.w;
        v[i][4] = b.x, v[i][5] = b.y, v[i][6] = b.z, v[i][7] = b.w;
    }

    if (IN_MODE == GEMV_IN_GATED) { /* per head: rmsnorm(x_h) · w · silu(z_h); a head = hd / 8 lanes */
        const int hd = in.head_dim, lph = hd / 8;
        const float *z = in.z + (int64_t)(live ? t : 0) * in.z_stride;
#pragma unroll
        for (int i = 0; i < PREP_MAX_CHUNKS; i++) {
            const int j = lane + 32 * i;
            const bool ok = live && j < cpw;
            float ss = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++)
                ss = fmaf(v[i][k], v[i][k], ss);
            for (int o = 1; o < lph; o <<= 1)
                ss += __shfl_xor_sync(0xffffffffu, ss, o);
            const float r = rsqrtf(ss / (float)hd + in.eps);
            if (ok) {
                const int col = (c0 + j) * 8, d = col % hd;
                const float4 *zp = reinterpret_cast<const float4 *>(z + col);
                const float4 za = zp[0], zb = zp[1];
                const float zv[8] = {za.x, za.y, za.z, za.w, zb.x, zb.y, zb.z, zb.w};
#pragma unroll
                for (int k = 0; k < 8; k++)
                    v[i][k] = v[i][k] * r * in.norm_w[d + k] * silu_f(zv[k]);
            }
        }
    } else if (IN_MODE == GEMV_IN_RMSNORM) {
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < PREP_MAX_CHUNKS; i++)
#pragma unroll
            for (int k = 0; k < 8; k++)
                ss = fmaf(v[i][k], v[i][k], ss);
        ss = prep_row_reduce<WPR, false>(ss, s_red, rib, wr, lane);
        const float r = rsqrtf(ss / (float)cols + in.eps);
#pragma unroll
        for (int i = 0; i < PREP_MAX_CHUNKS; i++) {
            const int j = lane + 32 * i;
            if (live && j < cpw) {
                const float4 *wp = reinterpret_cast<const float4 *>(in.norm_w + (c0 + j) * 8);
                const float4 wa = wp[0], wb = wp[1];
                const float wv[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
                for (int k = 0; k < 8; k++)
                    v[i][k] *= r * wv[k];
            }
        }
    }

    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < PREP_MAX_CHUNKS; i++)
#pragma unroll
        for (int k = 0; k < 8; k++)
            m = fmaxf(m, fabsf(v[i][k]));
    m = prep_row_reduce<WPR, true>(m, s_red, rib, wr, lane);
    float inv;
    const float scale = prep_scale(m, &inv);

    __half *xo = out.x + (int64_t)(live ? t : 0) * cols;
    const int gpr = cols / 64;
#pragma unroll
    for (int i = 0; i < PREP_MAX_CHUNKS; i++) {
        const int j = lane + 32 * i;
        const bool ok = live && j < cpw;
        /* chunk position l holds column perm16(l) of its half: pairs (0,4) (1,5) (2,6) (3,7) */
        uint32_t w[4];
        float gs = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const __half2 h = __floats2half2_rn(v[i][k] * inv, v[i][k + 4] * inv);
            w[k] = *reinterpret_cast<const uint32_t *>(&h);
            gs += __low2float(h) + __high2float(h);
        }
        if (ok)
            *reinterpret_cast<uint4 *>(xo + (c0 + j) * 8) = make_uint4(w[0], w[1], w[2], w[3]);
        /* a 64-column group = chunks 8q .. 8q + 7 = 8 neighbouring lanes (cpw % 8 == 0) */
        gs += __shfl_xor_sync(0xffffffffu, gs, 1);
        gs += __shfl_xor_sync(0xffffffffu, gs, 2);
        gs += __shfl_xor_sync(0xffffffffu, gs, 4);
        if (ok && (lane & 7) == 0)
            out.xs[(int64_t)t * gpr + (c0 + j) / 8] = gs;
    }
    if (live && wr == 0 && lane == 0)
        out.scale[t] = scale;
}

/* Warps per row for the rows kernel, or 0 when it does not take the shape. */
static int prep_rows_warps(const gemv_input &in, int cols)
{
    int wpr = 1;
    while (wpr < 8 && cols > 32 * PREP_MAX_CHUNKS * 8 * wpr)
        wpr *= 2;
    const int cpw = cols / 8 / wpr;
    if (cols > 32 * PREP_MAX_CHUNKS * 8 * wpr || cpw % 8)
        return 0;
    if (((uintptr_t)in.act % 16) || in.act_stride % 4)
        return 0;
    if (in.mode == GEMV_IN_RMSNORM && (uintptr_t)in.norm_w % 16)
        return 0;
    if (in.mode == GEMV_IN_GATED) {
        const int lph = in.head_dim / 8;
        if (in.head_dim % 8 || lph < 1 || lph > 32 || (lph & (lph - 1)) || cpw % lph || ((uintptr_t)in.z % 16) ||
            in.z_stride % 4)
            return 0;
    }
    return wpr;
}

template <int IN_MODE>
static cudaError_t launch_prep_rows(const gemv_input &in, int cols, int n_rows, const gemm_act &out, int wpr,
                                    cudaStream_t s)
{
    const int rpb = 8 / wpr, grid = (n_rows + rpb - 1) / rpb;
    switch (wpr) {
    case 1: gemm_prep_rows_kernel<IN_MODE, 1><<<grid, GEMM_PREP_THREADS, 0, s>>>(in, cols, n_rows, out); break;
    case 2: gemm_prep_rows_kernel<IN_MODE, 2><<<grid, GEMM_PREP_THREADS, 0, s>>>(in, cols, n_rows, out); break;
    case 4: gemm_prep_rows_kernel<IN_MODE, 4><<<grid, GEMM_PREP_THREADS, 0, s>>>(in, cols, n_rows, out); break;
    default: gemm_prep_rows_kernel<IN_MODE, 8><<<grid, GEMM_PREP_THREADS, 0, s>>>(in, cols, n_rows, out); break;
    }
    return cudaGetLastError();
}

cudaError_t launch_gemm_prep(const gemv_input &in, int cols, int n_rows, const gemm_act &out, cudaStream_t s)
{
    if (cols % 64 || cols <= 0 || n_rows <= 0 || out.cols != cols)
        return cudaErrorInvalidValue;
    const int wpr = prep_rows_warps(in, cols);
    if (!wpr)
        return launch_gemm_prep_block(in, cols, n_rows, out, s);
    switch (in.mode) {
    case GEMV_IN_PLAIN: return launch_prep_rows<GEMV_IN_PLAIN>(in, cols, n_rows, out, wpr, s);
    case GEMV_IN_RMSNORM: return launch_prep_rows<GEMV_IN_RMSNORM>(in, cols, n_rows, out, wpr, s);
    case GEMV_IN_GATED: return launch_prep_rows<GEMV_IN_GATED>(in, cols, n_rows, out, wpr, s);
    default: return cudaErrorInvalidValue;
    }
}
