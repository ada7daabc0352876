/* gemv_common.cuh — the inner loop shared by every one-activation-row matrix kernel (dense GEMV,
 * routed-expert GEMVs): a lane group of LPR lanes owns one weight row, each lane holds VPL 16-byte
 * vectors of it (CPV columns each) and the matching x values in registers; dequantization happens in
 * registers (MLX affine: w = s*q + b, so a vector's dot is s*sum(q*x) + b*sum(x)), fp32 accumulation.
 *
 * Loads: 16 bytes per lane, a lane group's vectors contiguous (coalesced); callers keep U rows of loads
 * in flight before the first use.
 */
#ifndef LILY_GEMV_COMMON_CUH
#define LILY_GEMV_COMMON_CUH

#include "gemv.cuh"

/* Columns per 16-byte vector for a storage width. */
template <int BITS> struct gemv_traits { static constexpr int CPV = 128 / BITS; };

/* One row's raw loads for a lane: VPL vectors plus their group scale/bias. */
template <int BITS, int VPL> struct row_frag {
    uint4 v[VPL];
    float s[VPL], b[VPL];
};

/* Issue the loads of logical row `prow` (physical, experts folded in) for lane index li of its group. */
template <int BITS, int LPR, int VPL>
__device__ __forceinline__ void row_load(const dmat &m, int64_t prow, int li, row_frag<BITS, VPL> &f)
{
    constexpr int CPV = gemv_traits<BITS>::CPV;
    const uint4 *p = reinterpret_cast<const uint4 *>(m.data + prow * m.row_bytes);
#pragma unroll
    for (int j = 0; j < VPL; j++)
        f.v[j] = __ldg(p + j * LPR + li);
    if (BITS < 16) {
        const int gpr = m.cols / 64;
#pragma unroll
        for (int j = 0; j < VPL; j++) {
            const int g = ((j * LPR + li) * CPV) / 64;
            f.s[j] = bf2f(m.scales[prow * gpr + g]);
            f.b[j] = bf2f(m.biases[prow * gpr + g]);
        }
    }
}

__device__ __forceinline__ float u4f(unsigned int q) { return __uint_as_float(0x4B000000u | q) - 8388608.0f; }

/* sum over this lane's vectors of w*x (x[j][c] = column (j*LPR+li)*CPV + c), xs[j] = sum_c x[j][c]. */
template <int BITS, int VPL>
__device__ __forceinline__ float row_dot(const row_frag<BITS, VPL> &f, const float (&x)[VPL][128 / BITS],
                                         const float (&xs)[VPL])
{
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < VPL; j++) {
        const unsigned int w[4] = {f.v[j].x, f.v[j].y, f.v[j].z, f.v[j].w};
        if (BITS == 4) {
            /* nibble e of a word, masked in place and OR'd into the mantissa of 2^23, is exactly
             * q * 16^p after subtracting 2^23 (p = e for e <= 4; the word shifted by 12 serves e = 5..7
             * with p = e - 3); x was prescaled by 16^-p (x_prescale4), so each weight costs LOP3 + FADD +
             * FFMA. */
            float d = 0.0f;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const unsigned int w0 = w[k], w1 = w[k] >> 12;
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const unsigned int q = e <= 4 ? (w0 & (15u << (4 * e))) : (w1 & (15u << (4 * (e - 3))));
                    d = fmaf(x[j][k * 8 + e], __uint_as_float(0x4B000000u | q) - 8388608.0f, d);
                }
            }
            acc = fmaf(f.s[j], d, fmaf(f.b[j], xs[j], acc));
        } else if (BITS == 8) {
            float d = 0.0f;
#pragma unroll
            for (int k = 0; k < 4; k++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    d = fmaf(x[j][k * 4 + e], __uint_as_float(__byte_perm(w[k], 0x4B000000u, e | 0x7650)) - 8388608.0f,
                             d);
            acc = fmaf(f.s[j], d, fmaf(f.b[j], xs[j], acc));
        } else {
#pragma unroll
            for (int k = 0; k < 4; k++) {
                acc = fmaf(x[j][k * 2], __uint_as_float(w[k] << 16), acc);
                acc = fmaf(x[j][k * 2 + 1], __uint_as_float(w[k] & 0xffff0000u), acc);
            }
        }
    }
    return acc;
}

/* For 4-bit rows: scale x[.][8m + e] by 16^-p(e), p(e) = e (e <= 4) or e - 3 (e >= 5), exact powers of
 * two, to match row_dot's in-place nibble extraction. Call after x_sums. */
template <int BITS, int VPL>
__device__ __forceinline__ void x_prescale4(float (&x)[VPL][128 / BITS])
{
    if constexpr (BITS == 4) {
#pragma unroll
        for (int j = 0; j < VPL; j++)
#pragma unroll
            for (int c = 0; c < 128 / BITS; c++) {
                const int e = c % 8, p = e <= 4 ? e : e - 3;
                x[j][c] *= __uint_as_float((unsigned int)(127 - 4 * p) << 23);
            }
    }
}

/* Sum v over the LPR lanes of each aligned lane group. */
template <int LPR> __device__ __forceinline__ float group_sum(float v)
{
#pragma unroll
    for (int o = LPR / 2; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Load this lane's x values (columns of its vectors) from act[0..cols) and their per-vector sums. */
template <int BITS, int LPR, int VPL>
__device__ __forceinline__ void x_load(const float *act, int li, float (&x)[VPL][128 / BITS])
{
    constexpr int CPV = 128 / BITS;
#pragma unroll
    for (int j = 0; j < VPL; j++) {
        const float4 *p = reinterpret_cast<const float4 *>(act + (j * LPR + li) * CPV);
#pragma unroll
        for (int c = 0; c < CPV / 4; c++) {
            float4 t = p[c];
            x[j][4 * c] = t.x;
            x[j][4 * c + 1] = t.y;
            x[j][4 * c + 2] = t.z;
            x[j][4 * c + 3] = t.w;
        }
    }
}

/* x *= rsqrt(mean(x^2) + eps) * w[col] over all `cols` columns (each lane group holds a full row). */
template <int BITS, int LPR, int VPL>
__device__ __forceinline__ void x_rmsnorm(float (&x)[VPL][128 / BITS], const float *w, int cols, float eps, int li)
{
    constexpr int CPV = 128 / BITS;
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < VPL; j++)
#pragma unroll
        for (int c = 0; c < CPV; c++)
            ss = fmaf(x[j][c], x[j][c], ss);
    ss = group_sum<LPR>(ss);
    const float r = rsqrtf(ss / (float)cols + eps);
#pragma unroll
    for (int j = 0; j < VPL; j++) {
        const float4 *wp = reinterpret_cast<const float4 *>(w + (j * LPR + li) * CPV);
#pragma unroll
        for (int c = 0; c < CPV / 4; c++) {
            float4 t = wp[c];
            x[j][4 * c] *= r * t.x;
            x[j][4 * c + 1] *= r * t.y;
            x[j][4 * c + 2] *= r * t.z;
            x[j][4 * c + 3] *= r * t.w;
        }
    }
}

template <int BITS, int VPL>
__device__ __forceinline__ void x_sums(const float (&x)[VPL][128 / BITS], float (&xs)[VPL])
{
#pragma unroll
    for (int j = 0; j < VPL; j++) {
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < 128 / BITS; c++)
            s += x[j][c];
        xs[j] = s;
    }
}

/* GEMV_OUT_ARGMAX: the warp's best (value, row) as an argmax_key (0 when the lane saw no row:
 * best_row == 0x7fffffff), max over the warp, lane 0 (lane = threadIdx.x & 31) publishes it with
 * atomicMax into *slot. */
__device__ __forceinline__ void warp_argmax_publish(float best, int best_row, int lane, unsigned long long *slot)
{
    unsigned long long k = best_row == 0x7fffffff ? 0ull : argmax_key(best, best_row);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long k2 = __shfl_xor_sync(0xffffffffu, k, o);
        k = k2 > k ? k2 : k;
    }
    if (lane == 0 && k)
        atomicMax(slot, k);
}

/* The GEMV_IN_RMSNORM input (no gate): x = RMSNorm(act row) * norm_w, rows act_stride apart. */
__device__ __forceinline__ gemv_input gemv_input_rmsnorm(const float *act, int act_stride, const float *norm_w,
                                                         float eps)
{
    gemv_input in;
    in.act = act;
    in.act_stride = act_stride;
    in.mode = GEMV_IN_RMSNORM;
    in.norm_w = norm_w;
    in.eps = eps;
    in.z = NULL;
    in.z_stride = 0;
    in.head_dim = 0;
    return in;
}

#define PRO_MAX 16 /* global loads per thread per pass of gemv_prologue */

/* The GEMV_IN_GATED transform into s_x (gemv_prologue), LPH = head_dim / 32 lanes' slots per head (0: any,
 * read from in.head_dim). With LPH fixed the slot -> (head, dim) map is compile-time; as a runtime value every
 * k / lph and k % lph of the unrolled loops below is an integer division (~130 per thread; the in-kernel
 * timeline showed this transform at 6.9 µs after the PDL wait against 2.8 µs for a plain input of the same
 * width). Same loads, order of the sums and values either way. Only head_dim 128 (every
 * Qwen3.5/3.6 DeltaNet) has its own instance: more instances inlined into one kernel spill registers. */
template <int LPH, int NW>
__device__ __forceinline__ void gemv_gated_x(const gemv_input &in, const float *act, int t, int cols, float *s_x)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int hd = in.head_dim, heads = cols / hd, lph = LPH ? LPH : hd / 32; /* slots per head per lane */
    const float *z = in.z + (int64_t)t * in.z_stride;
    const int hpp = PRO_MAX / lph; /* heads per warp per pass */
    constexpr int HH_UNROLL = LPH ? PRO_MAX / LPH : 1;
    for (int h0 = 0; h0 < heads; h0 += hpp * NW) {
        float v[PRO_MAX], zv[PRO_MAX], wv[PRO_MAX];
#pragma unroll
        for (int k = 0; k < PRO_MAX; k++) {
            const int h = h0 + warp + (k / lph) * NW, d = lane + 32 * (k % lph);
            const bool ok = k / lph < hpp && h < heads;
            v[k] = ok ? act[h * hd + d] : 0.0f;
            zv[k] = ok ? z[h * hd + d] : 0.0f;
            wv[k] = ok ? in.norm_w[d] : 0.0f;
        }
#pragma unroll HH_UNROLL
        for (int hh = 0; hh < hpp; hh++) {
            const int h = h0 + warp + hh * NW;
            float ss = 0.0f;
#pragma unroll
            for (int k = 0; k < PRO_MAX; k++)
                if (k / lph == hh)
                    ss = fmaf(v[k], v[k], ss);
            ss = warp_sum(ss);
            const float r = rsqrtf(ss / (float)hd + in.eps);
#pragma unroll
            for (int k = 0; k < PRO_MAX; k++)
                if (k / lph == hh && h < heads)
                    s_x[h * hd + lane + 32 * (k % lph)] = v[k] * r * wv[k] * silu_f(zv[k]);
        }
    }
}

/* Before pdl_wait: pull the input transform's weights (the RMSNorm weight, constant for the session) into
 * L2, one 128-byte line per thread, so the prologue's load of them after the wait does not go to HBM (a
 * decode token streams far more than L2 holds, so nothing of the previous token's is left). A prefetch
 * returns nothing: no register is held and no ordering is implied. */
template <int NW>
__device__ __forceinline__ void gemv_input_prefetch(const gemv_input &in, int cols)
{
    if (in.mode != GEMV_IN_RMSNORM || !in.norm_w)
        return;
    for (int c = threadIdx.x * 32; c < cols; c += NW * 32 * 32)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(in.norm_w + c));
}

/* The input transform (gemv_input_mode) of token t, once per block of NW warps, into s_x[0..cols);
 * s_red holds NW floats. Ends with __syncthreads (END_SYNC false: only GEMV_IN_GATED does; otherwise
 * thread tid has written s_x[c] for c = tid, tid + 32·NW, ... and the other values may still be pending). Every global load of a pass is issued before the
 * first use (PRO_MAX per thread), so a pass costs one memory round trip, not one per element. */
template <int IN_MODE, int NW, bool END_SYNC = true>
__device__ __forceinline__ void gemv_prologue(const gemv_input &in, int t, int cols, float *s_x, float *s_red)
{
    constexpr int NT = NW * 32;
    const float *act = in.act + (int64_t)t * in.act_stride;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (IN_MODE == GEMV_IN_GATED) {
        switch (in.head_dim) {
        case 128: gemv_gated_x<4, NW>(in, act, t, cols, s_x); break;
        default: gemv_gated_x<0, NW>(in, act, t, cols, s_x); break;
        }
        __syncthreads();
        return;
    }
    if (IN_MODE == GEMV_IN_RMSNORM && cols <= NT * PRO_MAX) {
        /* one pass: the weights' loads issued with the activations', so both cost one round trip */
        float v[PRO_MAX], wv[PRO_MAX], ss = 0.0f;
#pragma unroll
        for (int k = 0; k < PRO_MAX; k++) {
            const int c = tid + k * NT;
            v[k] = c < cols ? act[c] : 0.0f;
            wv[k] = c < cols ? in.norm_w[c] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < PRO_MAX; k++)
            ss = fmaf(v[k], v[k], ss);
        ss = warp_sum(ss);
        if (lane == 0)
            s_red[warp] = ss;
        __syncthreads();
        float tot = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++)
            tot += s_red[w];
        const float r = rsqrtf(tot / (float)cols + in.eps);
#pragma unroll
        for (int k = 0; k < PRO_MAX; k++) {
            const int c = tid + k * NT;
            if (c < cols)
                s_x[c] = v[k] * (r * wv[k]);
        }
        if (END_SYNC)
            __syncthreads();
        return;
    }
    float ss = 0.0f;
    for (int c0 = 0; c0 < cols; c0 += NT * PRO_MAX) {
        float v[PRO_MAX];
#pragma unroll
        for (int k = 0; k < PRO_MAX; k++) {
            const int c = c0 + tid + k * NT;
            v[k] = c < cols ? act[c] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < PRO_MAX; k++) {
            const int c = c0 + tid + k * NT;
            if (c < cols)
                s_x[c] = v[k];
            ss = fmaf(v[k], v[k], ss);
        }
    }
    if (IN_MODE == GEMV_IN_RMSNORM) {
        ss = warp_sum(ss);
        if (lane == 0)
            s_red[warp] = ss;
        __syncthreads();
        float tot = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++)
            tot += s_red[w];
        const float r = rsqrtf(tot / (float)cols + in.eps);
        for (int c0 = 0; c0 < cols; c0 += NT * PRO_MAX) {
            float wv[PRO_MAX];
#pragma unroll
            for (int k = 0; k < PRO_MAX; k++) {
                const int c = c0 + tid + k * NT;
                wv[k] = c < cols ? in.norm_w[c] : 0.0f;
            }
#pragma unroll
            for (int k = 0; k < PRO_MAX; k++) {
                const int c = c0 + tid + k * NT;
                if (c < cols)
                    s_x[c] *= r * wv[k]; /* the same thread wrote s_x[c] above */
            }
        }
    }
    if (END_SYNC)
        __syncthreads();
}

/* This lane's x values from the block's shared copy. */
template <int BITS, int LPR, int VPL>
__device__ __forceinline__ void x_from_smem(const float *s_x, int li, float (&x)[VPL][128 / BITS])
{
    constexpr int CPV = 128 / BITS;
#pragma unroll
    for (int j = 0; j < VPL; j++) {
        const float4 *p = reinterpret_cast<const float4 *>(s_x + (j * LPR + li) * CPV);
#pragma unroll
        for (int c = 0; c < CPV / 4; c++) {
            const float4 v = p[c];
            x[j][4 * c] = v.x;
            x[j][4 * c + 1] = v.y;
            x[j][4 * c + 2] = v.z;
            x[j][4 * c + 3] = v.w;
        }
    }
}

#endif
