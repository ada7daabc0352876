/* mma_gemv.cuh — a 16-row tile of a 4-bit matrix times one activation vector on tensor cores, the
 * building block of the decode GEMVs (gemv_mma.cu, gemv_stream.cu) and the decode MoE kernels (moe_decode.cu).
 *
 * MLX affine 4-bit, w = s·q + b per group of 64 columns. A 32-bit word holds nibbles q0..q7 (column
 * 8m + e at bits 4e); (w & 0x000F000F) | 0x64006400 is the fp16 pair (1024 + q0, 1024 + q4) and
 * (w & 0x00F000F0) | 0x64006400 is (1024 + 16·q1, 1024 + 16·q5): one LOP3 per two weights, fed as-is to
 * mma.sync m16n8k16 as A, with x' (x in fp16, divided by 16 for the odd nibbles) as B, fp32 accumulate.
 * Per group D = Σ q·x_eff + 1024·S1 (S1 = Σ of the fed values, x_eff = x' or 16·x'), hence
 *   Σ w·x = s·(D − 1024·S1) + b·Σ x_eff,
 * with 1024·S1 and Σ x_eff computed once from the same fp16 values (mg_group_sums).
 *
 * Thread (g, t) of a quad (g = lane / 4, t = lane % 4) loads, per 128-column step, one 16-byte vector
 * (32 columns) of rows g and g+8: t < 2 covers the step's first group, t >= 2 its second. B's 8 columns
 * keep the groups apart: thread (g, t) feeds x for column g only when (t >= 2) == (g odd), so D column
 * 2t holds the first group's sum and 2t+1 the second's (c0/c1 for row g, c2/c3 for row g+8).
 *
 * x fragments (mg_build_frags): item i = 8 columns 8i..8i+7 as one uint4 of fp16 pairs
 *   {(x0, x4), (x1, x5)/16, (x2, x6), (x3, x7)/16}; thread t reads items c0/8 + 4t + j, j = 0..3.
 */
#ifndef LILY_MMA_GEMV_CUH
#define LILY_MMA_GEMV_CUH

#include "gemv_common.cuh"
#include "backend/cuda/mma_common.cuh"

#define MG_MAX_STEPS 4 /* 128-column steps per warp: at most 512 columns */

/* The loads of one warp's tile: rows ra (g) and rb (g+8), `steps` 128-column steps from column c_lo. */
struct mg_frag {
    uint4 wa[MG_MAX_STEPS], wb[MG_MAX_STEPS];
    uint32_t sa[MG_MAX_STEPS], ba[MG_MAX_STEPS], sb[MG_MAX_STEPS], bb[MG_MAX_STEPS]; /* bf16 pairs */
};

/* Issue the loads (physical rows ra, rb of W: experts folded in). Only weights: may run before pdl_wait. */
__device__ __forceinline__ void mg_load(const dmat &W, int64_t ra, int64_t rb, int c_lo, int steps, int t, mg_frag &f)
{
    const int gpr = W.cols / 64;
#pragma unroll
    for (int st = 0; st < MG_MAX_STEPS; st++) {
        if (st < steps) {
            const int c0 = c_lo + st * 128, gi = c0 / 64; /* gi even: (gi, gi+1) is one aligned word */
            f.wa[st] = __ldg(reinterpret_cast<const uint4 *>(W.data + ra * W.row_bytes + c0 / 2) + t);
            f.wb[st] = __ldg(reinterpret_cast<const uint4 *>(W.data + rb * W.row_bytes + c0 / 2) + t);
            f.sa[st] = __ldg(reinterpret_cast<const uint32_t *>(W.scales + ra * gpr + gi));
            f.ba[st] = __ldg(reinterpret_cast<const uint32_t *>(W.biases + ra * gpr + gi));
            f.sb[st] = __ldg(reinterpret_cast<const uint32_t *>(W.scales + rb * gpr + gi));
            f.bb[st] = __ldg(reinterpret_cast<const uint32_t *>(W.biases + rb * gpr + gi));
        }
    }
}

/* The same loads as mg_load, as cp.async copies into a thread-private staging area of shared memory
 * (MG_STAGE_BYTES per thread, laid out [field][thread] so a warp's accesses are contiguous: conflict
 * free): weights only, so they may be issued before pdl_wait(). Commit and wait with cp.async.commit_group /
 * wait_group (mg_stage_wait), then mg_load_staged. nthr: threads of the block sharing the area. */
#define MG_STAGE_BYTES (MG_MAX_STEPS * (2 * 16 + 4 * 4))
__device__ __forceinline__ void mg_cp(unsigned char *dst, const void *src, int bytes)
{
    const unsigned int sa = (unsigned int)__cvta_generic_to_shared(dst);
    if (bytes == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(src) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(sa), "l"(src) : "memory");
}
__device__ __forceinline__ void mg_load_async(const dmat &W, int64_t ra, int64_t rb, int c_lo, int steps, int t,
                                              unsigned char *stage, int tid, int nthr)
{
    const int gpr = W.cols / 64;
    unsigned char *v = stage, *w = stage + 2 * MG_MAX_STEPS * 16 * nthr;
#pragma unroll
    for (int st = 0; st < MG_MAX_STEPS; st++) {
        if (st < steps) {
            const int c0 = c_lo + st * 128, gi = c0 / 64;
            mg_cp(v + ((2 * st) * nthr + tid) * 16, reinterpret_cast<const uint4 *>(W.data + ra * W.row_bytes + c0 / 2) + t, 16);
            mg_cp(v + ((2 * st + 1) * nthr + tid) * 16, reinterpret_cast<const uint4 *>(W.data + rb * W.row_bytes + c0 / 2) + t, 16);
            mg_cp(w + ((4 * st) * nthr + tid) * 4, W.scales + ra * gpr + gi, 4);
            mg_cp(w + ((4 * st + 1) * nthr + tid) * 4, W.biases + ra * gpr + gi, 4);
            mg_cp(w + ((4 * st + 2) * nthr + tid) * 4, W.scales + rb * gpr + gi, 4);
            mg_cp(w + ((4 * st + 3) * nthr + tid) * 4, W.biases + rb * gpr + gi, 4);
        }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void mg_stage_wait(void) { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void mg_load_staged(const unsigned char *stage, int steps, int tid, int nthr, mg_frag &f)
{
    const unsigned char *v = stage, *w = stage + 2 * MG_MAX_STEPS * 16 * nthr;
#pragma unroll
    for (int st = 0; st < MG_MAX_STEPS; st++) {
        if (st < steps) {
            f.wa[st] = *reinterpret_cast<const uint4 *>(v + ((2 * st) * nthr + tid) * 16);
            f.wb[st] = *reinterpret_cast<const uint4 *>(v + ((2 * st + 1) * nthr + tid) * 16);
            f.sa[st] = *reinterpret_cast<const uint32_t *>(w + ((4 * st) * nthr + tid) * 4);
            f.ba[st] = *reinterpret_cast<const uint32_t *>(w + ((4 * st + 1) * nthr + tid) * 4);
            f.sb[st] = *reinterpret_cast<const uint32_t *>(w + ((4 * st + 2) * nthr + tid) * 4);
            f.bb[st] = *reinterpret_cast<const uint32_t *>(w + ((4 * st + 3) * nthr + tid) * 4);
        }
    }
}

/* The same fragment from a tile staged in shared memory (gemv_stream.cu): tile row r (0..15) at
 * w + r * w_stride bytes (the whole matrix row from column 0), its scales / biases at sc + r * gpr and
 * bi + r * gpr (bf16, from group 0; gpr = cols / 64). Rows g and g + 8 of the tile, as mg_load's ra / rb. */
__device__ __forceinline__ void mg_load_smem(const uint8_t *w, int w_stride, const __nv_bfloat16 *sc, const __nv_bfloat16 *bi,
                                             int gpr, int c_lo, int steps, int g, int t, mg_frag &f)
{
    const uint8_t *wa = w + g * w_stride + c_lo / 2 + 16 * t, *wb = wa + 8 * w_stride;
#pragma unroll
    for (int st = 0; st < MG_MAX_STEPS; st++) {
        if (st < steps) {
            f.wa[st] = *reinterpret_cast<const uint4 *>(wa + 64 * st);
            f.wb[st] = *reinterpret_cast<const uint4 *>(wb + 64 * st);
        }
    }
    const uint32_t *sa = reinterpret_cast<const uint32_t *>(sc + g * gpr + c_lo / 64), *sb = sa + 4 * gpr;
    const uint32_t *ba = reinterpret_cast<const uint32_t *>(bi + g * gpr + c_lo / 64), *bb = ba + 4 * gpr;
    if (steps == MG_MAX_STEPS) { /* 16-byte aligned when gpr % 8 == 0 and c_lo % 512 == 0 */
        const uint4 a = *reinterpret_cast<const uint4 *>(sa), c = *reinterpret_cast<const uint4 *>(sb);
        const uint4 d = *reinterpret_cast<const uint4 *>(ba), e = *reinterpret_cast<const uint4 *>(bb);
        f.sa[0] = a.x, f.sa[1] = a.y, f.sa[2] = a.z, f.sa[3] = a.w;
        f.sb[0] = c.x, f.sb[1] = c.y, f.sb[2] = c.z, f.sb[3] = c.w;
        f.ba[0] = d.x, f.ba[1] = d.y, f.ba[2] = d.z, f.ba[3] = d.w;
        f.bb[0] = e.x, f.bb[1] = e.y, f.bb[2] = e.z, f.bb[3] = e.w;
    } else {
#pragma unroll
        for (int st = 0; st < MG_MAX_STEPS; st++) {
            if (st < steps) {
                f.sa[st] = sa[st], f.sb[st] = sb[st], f.ba[st] = ba[st], f.bb[st] = bb[st];
            }
        }
    }
}

__device__ __forceinline__ float2 bf2_f2(uint32_t u) { return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u)); }

/* The tile's dot products (of the fed x; divide by the x scale afterwards): acc_a for row g, acc_b for
 * row g+8, identical in the 4 threads of a quad. s_xh / s_off / s_xsum are indexed by absolute column. */
__device__ __forceinline__ void mg_dot(const mg_frag &f, int c_lo, int steps, const uint4 *s_xh, const float *s_off,
                                       const float *s_xsum, int g, int t, float &acc_a, float &acc_b)
{
    const bool feeds = (t >= 2) == ((g & 1) != 0);
#pragma unroll
    for (int st = 0; st < MG_MAX_STEPS; st++) {
        if (st < steps) {
            const int c0 = c_lo + st * 128, gi = c0 / 64;
            const uint4 *xf = s_xh + c0 / 8 + t * 4;
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const uint32_t wa4[4] = {f.wa[st].x, f.wa[st].y, f.wa[st].z, f.wa[st].w};
            const uint32_t wb4[4] = {f.wb[st].x, f.wb[st].y, f.wb[st].z, f.wb[st].w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint4 xv = feeds ? xf[j] : make_uint4(0u, 0u, 0u, 0u);
                const uint32_t pa = wa4[j], pb = wb4[j], qa = pa >> 8, qb = pb >> 8;
                const uint32_t A0[4] = {(pa & 0x000F000Fu) | 0x64006400u, (pb & 0x000F000Fu) | 0x64006400u,
                                        (pa & 0x00F000F0u) | 0x64006400u, (pb & 0x00F000F0u) | 0x64006400u};
                const uint32_t A1[4] = {(qa & 0x000F000Fu) | 0x64006400u, (qb & 0x000F000Fu) | 0x64006400u,
                                        (qa & 0x00F000F0u) | 0x64006400u, (qb & 0x00F000F0u) | 0x64006400u};
                mma16816(d, A0, xv.x, xv.y);
                mma16816(d, A1, xv.z, xv.w);
            }
            const float o0 = s_off[gi], o1 = s_off[gi + 1], x0 = s_xsum[gi], x1 = s_xsum[gi + 1];
            const float2 Sa = bf2_f2(f.sa[st]), Ba = bf2_f2(f.ba[st]), Sb = bf2_f2(f.sb[st]), Bb = bf2_f2(f.bb[st]);
            acc_a = fmaf(Sa.x, d[0] - o0, fmaf(Ba.x, x0, fmaf(Sa.y, d[1] - o1, fmaf(Ba.y, x1, acc_a))));
            acc_b = fmaf(Sb.x, d[2] - o0, fmaf(Bb.x, x0, fmaf(Sb.y, d[3] - o1, fmaf(Bb.y, x1, acc_b))));
        }
    }
}

/* The power of two that keeps max|x| <= 2^14 in fp16 (1 when it already is). */
__device__ __forceinline__ float mg_x_scale(float max_abs)
{
    float k = 1.0f;
    while (max_abs * k > 16384.0f)
        k *= 0.5f;
    return k;
}

/* x fragments of columns [0, cols) from fp32 x (times xk), items i = tid, tid + nthr, ... */
__device__ __forceinline__ void mg_build_frags(const float *x, int cols, float xk, uint4 *s_xh, int tid, int nthr)
{
    for (int i = tid; i < cols / 8; i += nthr) {
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; e++)
            v[e] = x[i * 8 + e] * xk;
        s_xh[i] = make_uint4(h2_bits(__floats2half2_rn(v[0], v[4])), h2_bits(__floats2half2_rn(v[1] * 0.0625f, v[5] * 0.0625f)),
                             h2_bits(__floats2half2_rn(v[2], v[6])), h2_bits(__floats2half2_rn(v[3] * 0.0625f, v[7] * 0.0625f)));
    }
}

/* Per group of 64 columns: s_off = 1024 · Σ fed values, s_xsum = Σ x_eff (after mg_build_frags). */
__device__ __forceinline__ void mg_group_sums(const uint4 *s_xh, int cols, float *s_off, float *s_xsum, int tid, int nthr)
{
    for (int gi = tid; gi < cols / 64; gi += nthr) {
        float s1 = 0.0f, sx = 0.0f;
        for (int i = gi * 8; i < gi * 8 + 8; i++) {
            const uint4 u = s_xh[i];
            const float2 a0 = __half22float2(bits_h2(u.x)), a1 = __half22float2(bits_h2(u.y));
            const float2 b0 = __half22float2(bits_h2(u.z)), b1 = __half22float2(bits_h2(u.w));
            const float even = a0.x + a0.y + b0.x + b0.y, odd = a1.x + a1.y + b1.x + b1.y;
            s1 += even + odd;
            sx += even + 16.0f * odd;
        }
        s_off[gi] = 1024.0f * s1;
        s_xsum[gi] = sx;
    }
}

/* Where tile `tile` of a gemv_batch lives: matrix *m, first row *r0 (tiles of 16 rows, per matrix). */
__device__ __forceinline__ void mg_locate(const gemv_batch &b, int tile, int *m, int *r0)
{
    int mm = 0, t0 = 0, acc = 0;
#pragma unroll
    for (int q = 0; q < GEMV_MAX_MATS; q++) {
        if (q < b.n_mats) {
            if (tile >= acc) {
                mm = q;
                t0 = acc;
            }
            acc += (b.m[q].rows + 15) / 16;
        }
    }
    *m = mm;
    *r0 = (tile - t0) * 16;
}

/* The x side of a block of NW warps from fp32 x in s_x[0..cols), where thread tid has written s_x[c] for
 * c = tid, tid + 32·NW, ... (no barrier needed before): the block x scale xk (mg_x_scale of max|x|: per
 * thread over its own values, per warp, then every thread over the NW warps), the fp16 fragments s_xh
 * (mg_build_frags), then the group sums s_off / s_xsum (mg_group_sums), with a __syncthreads after each
 * of the three steps. Returns xk (the caller divides its dot products by it). */
template <int NW>
__device__ __forceinline__ float mg_block_x_tail(const float *s_x, int cols, uint4 *s_xh, float *s_off, float *s_xsum)
{
    __shared__ float s_mx[NW];
    float mx = 0.0f;
    for (int c = threadIdx.x; c < cols; c += NW * 32)
        mx = fmaxf(mx, fabsf(s_x[c]));
    mx = warp_max(mx);
    if ((threadIdx.x & 31) == 0)
        s_mx[threadIdx.x >> 5] = mx;
    __syncthreads();
    float M = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; w++)
        M = fmaxf(M, s_mx[w]);
    const float xk = mg_x_scale(M);
    mg_build_frags(s_x, cols, xk, s_xh, threadIdx.x, NW * 32);
    __syncthreads();
    mg_group_sums(s_xh, cols, s_off, s_xsum, threadIdx.x, NW * 32);
    __syncthreads();
    return xk;
}

#define MG_X_ITEMS 2 /* 8-column items per lane of mg_warp_x: a warp's column slice is <= 512 columns */

/* Whether mg_warp_x serves this input (the launchers instantiate the kernel with REGS = this): cols a
 * multiple of 64, act (and norm_w, z) 16-byte aligned (float4 loads); GATED: heads of 8 · L columns, L a
 * power of two <= 32 (a head is L neighbouring lanes of one pass), whole heads in a warp's slice. */
template <int IN_MODE, int NW>
__host__ __device__ __forceinline__ bool mg_x_regs_ok(const gemv_input &in, int cols)
{
    const int CW = cols < 512 ? cols : 512; /* a warp's column slice (gemv_mma / gemv_stream) */
    if (cols % 64 || CW / 8 > MG_X_ITEMS * 32)
        return false;
    const uintptr_t al = (uintptr_t)in.act | (IN_MODE != GEMV_IN_PLAIN ? (uintptr_t)in.norm_w : 0) |
                         (IN_MODE == GEMV_IN_GATED ? (uintptr_t)in.z : 0);
    if (al & 15) /* float4 loads */
        return false;
    if (IN_MODE == GEMV_IN_GATED) {
        const int L = in.head_dim / 8;
        return in.head_dim % 8 == 0 && L >= 1 && L <= 32 && (L & (L - 1)) == 0 && CW % in.head_dim == 0;
    }
    return true;
}

/* Floats of shared memory mg_warp_x uses for a block of NW warps (per warp: its slice's fp16 fragments
 * and group sums). */
__host__ __device__ __forceinline__ int mg_warp_x_floats(int cols, int nw)
{
    const int CW = cols < 512 ? cols : 512;
    return nw * (CW / 2 + 2 * (CW / 64));
}

/* The x side of one warp of a gemv_mma / gemv_stream block (warp = rt · KS + ks owns columns [ks · CW,
 * (ks + 1) · CW), CW = cols / KS): lane l holds the 8-column items l and l + 32 of that slice, loads act
 * (and the RMSNorm weight, or z and the gated norm's weight) for them in one batch, and builds the fp16
 * fragments (mg_build_frags' layout) and group sums (mg_group_sums' values, summed over a group's 8
 * neighbouring lanes by shuffles) of ITS slice only, into its own part of x_area (mg_warp_x_floats), with
 * its own fp16 scale xk (mg_x_scale of the slice's max |x|): no block barrier for PLAIN and GATED (a
 * gated head's sum of squares by shuffles over its L = head_dim / 8 lanes), one for RMSNORM's sum of
 * squares (warps rt = 0 cover the row once; s_ss holds KS floats). Sets xh / off / xsum to pointers that
 * mg_dot indexes by absolute column. x values as gemv_prologue computes them (sums of squares in another
 * order); the caller divides each warp's dot products by its xk before the slices are added. Requires
 * mg_x_regs_ok. Returns xk. */
template <int IN_MODE, int NW, int KS>
__device__ __forceinline__ float mg_warp_x(const gemv_input &in, int cols, float *x_area, const uint4 *&xh,
                                           const float *&off, const float *&xsum)
{
    __shared__ float s_ss[KS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ks = warp % KS, rt = warp / KS;
    const int CW = cols / KS, nit = CW / 8, base = ks * nit, ngr = CW / 64;
    uint4 *wxh = reinterpret_cast<uint4 *>(x_area) + warp * nit;
    float *wsum = x_area + NW * (CW / 2) + warp * 2 * ngr;
    float v[MG_X_ITEMS][8], w[MG_X_ITEMS][8], z[MG_X_ITEMS][8];
#pragma unroll
    for (int k = 0; k < MG_X_ITEMS; k++) {
        const int j = lane + 32 * k, i = base + j;
        const bool ok = j < nit;
        const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
        const float4 *pa = reinterpret_cast<const float4 *>(in.act + 8 * i);
        float4 a0 = ok ? pa[0] : zero, a1 = ok ? pa[1] : zero;
        v[k][0] = a0.x, v[k][1] = a0.y, v[k][2] = a0.z, v[k][3] = a0.w;
        v[k][4] = a1.x, v[k][5] = a1.y, v[k][6] = a1.z, v[k][7] = a1.w;
        if (IN_MODE == GEMV_IN_RMSNORM || (IN_MODE == GEMV_IN_GATED && k == 0)) {
            /* GATED: item l + 32 sits where item l does in its head (256 columns apart, head_dim | 256) */
            const int wc = IN_MODE == GEMV_IN_GATED ? (8 * i) % in.head_dim : 8 * i;
            const float4 *pw = reinterpret_cast<const float4 *>(in.norm_w + wc);
            a0 = ok ? pw[0] : zero, a1 = ok ? pw[1] : zero;
            w[k][0] = a0.x, w[k][1] = a0.y, w[k][2] = a0.z, w[k][3] = a0.w;
            w[k][4] = a1.x, w[k][5] = a1.y, w[k][6] = a1.z, w[k][7] = a1.w;
        }
        if (IN_MODE == GEMV_IN_GATED) {
            const float4 *pz = reinterpret_cast<const float4 *>(in.z + 8 * i);
            a0 = ok ? pz[0] : zero, a1 = ok ? pz[1] : zero;
            z[k][0] = a0.x, z[k][1] = a0.y, z[k][2] = a0.z, z[k][3] = a0.w;
            z[k][4] = a1.x, z[k][5] = a1.y, z[k][6] = a1.z, z[k][7] = a1.w;
        }
    }
    if (IN_MODE == GEMV_IN_RMSNORM) {
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < MG_X_ITEMS; k++)
#pragma unroll
            for (int e = 0; e < 8; e++)
                ss = fmaf(v[k][e], v[k][e], ss);
        if (rt == 0) { /* warp-uniform */
            ss = warp_sum(ss);
            if (lane == 0)
                s_ss[ks] = ss;
        }
        __syncthreads();
        float tot = 0.0f;
#pragma unroll
        for (int q = 0; q < KS; q++)
            tot += s_ss[q];
        const float r = rsqrtf(tot / (float)cols + in.eps);
#pragma unroll
        for (int k = 0; k < MG_X_ITEMS; k++)
#pragma unroll
            for (int e = 0; e < 8; e++)
                v[k][e] = v[k][e] * (r * w[k][e]);
    } else if (IN_MODE == GEMV_IN_GATED) {
        const int L = in.head_dim / 8;
#pragma unroll
        for (int k = 0; k < MG_X_ITEMS; k++) {
            float ss = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++)
                ss = fmaf(v[k][e], v[k][e], ss);
            for (int o = 1; o < L; o <<= 1)
                ss += __shfl_xor_sync(0xffffffffu, ss, o);
            const float r = rsqrtf(ss / (float)in.head_dim + in.eps);
#pragma unroll
            for (int e = 0; e < 8; e++)
                v[k][e] = v[k][e] * r * w[0][e] * silu_f(z[k][e]);
        }
    }
    float mx = 0.0f;
#pragma unroll
    for (int k = 0; k < MG_X_ITEMS; k++)
#pragma unroll
        for (int e = 0; e < 8; e++)
            mx = fmaxf(mx, fabsf(v[k][e]));
    const float xk = mg_x_scale(warp_max(mx));
#pragma unroll
    for (int k = 0; k < MG_X_ITEMS; k++) {
        const int j = lane + 32 * k;
        float h[8];
#pragma unroll
        for (int e = 0; e < 8; e++)
            h[e] = v[k][e] * xk;
        const uint4 u = make_uint4(h2_bits(__floats2half2_rn(h[0], h[4])),
                                   h2_bits(__floats2half2_rn(h[1] * 0.0625f, h[5] * 0.0625f)),
                                   h2_bits(__floats2half2_rn(h[2], h[6])),
                                   h2_bits(__floats2half2_rn(h[3] * 0.0625f, h[7] * 0.0625f)));
        const float2 a0 = __half22float2(bits_h2(u.x)), a1 = __half22float2(bits_h2(u.y));
        const float2 b0 = __half22float2(bits_h2(u.z)), b1 = __half22float2(bits_h2(u.w));
        const float even = a0.x + a0.y + b0.x + b0.y, odd = a1.x + a1.y + b1.x + b1.y;
        float s1 = even + odd, sx = even + 16.0f * odd;
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) {
            s1 += __shfl_xor_sync(0xffffffffu, s1, o);
            sx += __shfl_xor_sync(0xffffffffu, sx, o);
        }
        if (j < nit) {
            wxh[j] = u;
            if ((j & 7) == 0) {
                wsum[j / 8] = 1024.0f * s1;
                wsum[ngr + j / 8] = sx;
            }
        }
    }
    __syncwarp();
    xh = wxh - base;
    off = wsum - base / 8;
    xsum = wsum + ngr - base / 8;
    return xk;
}

/* The x side of warp `warp` of a block of NW warps (gemv_mma / gemv_stream), x_area the kernel's x area:
 * REGS (mg_x_regs_ok): mg_warp_x; else the input transform (gemv_prologue) of token 0 into s_x[0..cols)
 * (s_red: NW floats) and mg_block_x_tail, the block's fragments in x_area as [s_x | s_xh | s_off | s_xsum]
 * with one xk for all warps. A compile-time choice: with both paths in one kernel the streamed GEMV spills.
 * Returns this warp's xk (the caller divides the warp's dot products by it). */
template <int IN_MODE, int NW, int KS, bool REGS>
__device__ __forceinline__ float mg_x_side(const gemv_input &in, int cols, float *x_area, float *s_red, const uint4 *&xh,
                                           const float *&off, const float *&xsum)
{
    if constexpr (REGS) {
        return mg_warp_x<IN_MODE, NW, KS>(in, cols, x_area, xh, off, xsum);
    } else {
        uint4 *s_xh = reinterpret_cast<uint4 *>(x_area + cols);
        float *s_off = x_area + cols + cols / 2, *s_xsum = s_off + cols / 64;
        gemv_prologue<IN_MODE, NW, false>(in, 0, cols, x_area, s_red);
        const float xk = mg_block_x_tail<NW>(x_area, cols, s_xh, s_off, s_xsum);
        xh = s_xh, off = s_off, xsum = s_xsum;
        return xk;
    }
}

#endif
