/* gemv_mma.cu — the decode GEMV for 4-bit weights (one activation row): y = W·x on tensor cores, so
 * that dequantization costs ~0.7 instructions per weight instead of 3 (at 4.3 TB/s an H200 SM must
 * consume ~33 weights per clock; fp32 dequant + FMA would need ~80% of its issue slots).
 *
 * The trick (MLX affine 4-bit, w = s·q + b per group of 64 columns): a 32-bit word holds 8 nibbles
 * q0..q7; (w & 0x000F000F) | 0x64006400 is the fp16 pair (1024 + q0, 1024 + q4) and
 * (w & 0x00F000F0) | 0x64006400 is (1024 + 16·q1, 1024 + 16·q5) — one LOP3 per two weights, no
 * subtraction: those fp16 values go straight into mma.sync m16n8k16 as the A operand, with x (rounded
 * to fp16, and divided by 16 for the odd nibbles) as B, accumulated in fp32. Per group the result is
 *   D = Σ q·x' + 1024·S1   (x' = the x the kernel fed, S1 = Σ of the fed x values),
 * so Σ w·x = s·(D − 1024·S1) + b·Σx', with S1 and Σx' computed once per block from the same fp16 values.
 *
 * Groups: thread t of a quad loads a 16-byte vector = 32 columns = half a group, t < 2 the first group of
 * a 128-column step, t >= 2 the second. The B operand's 8 columns are used to keep the two groups apart:
 * the thread (g, t) supplies x for column g only when (t >= 2) == (g odd), zero otherwise, so D column 2t
 * (even) holds the first group's sum and 2t+1 the second's, for rows g and g+8 — no masking per mma.
 *
 * Shape: a warp owns a tile of 16 rows × CW columns (CW = min(cols, 512)), KS = cols / CW warps split
 * the columns of one tile and are reduced in shared memory; a block of 8 warps holds 8 / KS tiles. All
 * of a warp's weights, scales and biases (≤ 2 × 4 16-byte vectors + 16 words per thread) are loaded
 * before pdl_wait(), so a kernel's whole weight stream is in flight while the previous kernel finishes.
 * The input transform (gemv_prologue) runs once per block; fp16 overflow is avoided by scaling x by a
 * power of two when max|x| > 2^14 (undone on the output).
 *
 * Requirements (launch_gemv uses gemv_decode.cu otherwise): 4-bit, n_tokens == 1, cols % 128 == 0 and
 * cols / min(cols, 512) in {1, 2, 4, 8}, 16-byte aligned data.
 */
#include "gemv_common.cuh"
#include "mma_common.cuh"

#define GM_WARPS 8
#define GM_MAX_STEPS 4 /* 128-column steps per warp: CW <= 512 */

template <int IN_MODE, int OUT_MODE, int KS>
__global__ void __launch_bounds__(GM_WARPS * 32, IN_MODE == GEMV_IN_GATED ? 1 : 2)
gemv_mma_kernel(gemv_batch b, gemv_input in, int n_tiles, unsigned long long *argmax, int early_trigger)
{
    constexpr int RT = GM_WARPS / KS; /* row tiles per block */
    extern __shared__ __align__(16) float gm_smem[];
    const int cols = b.m[0].cols, CW = cols / KS, steps = CW / 128;
    float *s_x = gm_smem;                                          /* [cols] fp32, then reused */
    uint4 *s_xh = reinterpret_cast<uint4 *>(gm_smem + cols);       /* [cols / 8] fp16 fragments */
    float *s_off = gm_smem + cols + cols / 2;                      /* [cols / 64] 1024 * S1 */
    float *s_xsum = s_off + cols / 64;                             /* [cols / 64] Σ x' */
    __shared__ float s_red[GM_WARPS];
    __shared__ float s_part[GM_WARPS][16];
    __shared__ float s_scale;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int ks = warp % KS, rt = warp / KS;
    const int tile = blockIdx.x * RT + rt;

    /* this warp's tile: matrix m, rows r0 .. r0 + 15 of it */
    int m = 0, tile0 = 0;
    {
        int acc = 0;
#pragma unroll
        for (int q = 0; q < GEMV_MAX_MATS; q++) {
            if (q < b.n_mats) {
                const int nt = (b.m[q].rows + 15) / 16;
                if (tile >= acc) {
                    m = q;
                    tile0 = acc;
                }
                acc += nt;
            }
        }
    }
    const dmat &W = b.m[m];
    const int r0 = (tile - tile0) * 16;
    const bool live = tile < n_tiles;
    const int ra = live ? min(r0 + g, W.rows - 1) : 0, rb = live ? min(r0 + g + 8, W.rows - 1) : 0;
    const int gpr = cols / 64;

    uint4 wa[GM_MAX_STEPS], wb[GM_MAX_STEPS];
    uint32_t sa[GM_MAX_STEPS], ba[GM_MAX_STEPS], sb[GM_MAX_STEPS], bb[GM_MAX_STEPS];
#pragma unroll
    for (int st = 0; st < GM_MAX_STEPS; st++) {
        if (st < steps) {
            const int c0 = ks * CW + st * 128;
            wa[st] = __ldg(reinterpret_cast<const uint4 *>(W.data + (int64_t)ra * W.row_bytes + c0 / 2) + t);
            wb[st] = __ldg(reinterpret_cast<const uint4 *>(W.data + (int64_t)rb * W.row_bytes + c0 / 2) + t);
            const int gi = c0 / 64; /* even: the pair (gi, gi + 1) is one aligned 32-bit word */
            sa[st] = __ldg(reinterpret_cast<const uint32_t *>(W.scales + (int64_t)ra * gpr + gi));
            ba[st] = __ldg(reinterpret_cast<const uint32_t *>(W.biases + (int64_t)ra * gpr + gi));
            sb[st] = __ldg(reinterpret_cast<const uint32_t *>(W.scales + (int64_t)rb * gpr + gi));
            bb[st] = __ldg(reinterpret_cast<const uint32_t *>(W.biases + (int64_t)rb * gpr + gi));
        }
    }
    if (early_trigger)
        pdl_trigger(); /* weights only so far: the next kernel may launch and prefetch its own */
    pdl_wait();
    if (!early_trigger)
        pdl_trigger();

    /* x: the input transform, then fp16 fragments in the order each thread feeds them */
    gemv_prologue<IN_MODE, GM_WARPS>(in, 0, cols, s_x, s_red);
    {
        float mx = 0.0f;
        for (int c = threadIdx.x; c < cols; c += GM_WARPS * 32)
            mx = fmaxf(mx, fabsf(s_x[c]));
        mx = warp_max(mx);
        if (lane == 0)
            s_red[warp] = mx;
        __syncthreads();
        if (threadIdx.x == 0) {
            float M = 0.0f;
            for (int w = 0; w < GM_WARPS; w++)
                M = fmaxf(M, s_red[w]);
            float k = 1.0f;
            while (M * k > 16384.0f) /* keep x·1024-scale products and x itself inside fp16 */
                k *= 0.5f;
            s_scale = k;
        }
        __syncthreads();
    }
    const float xk = s_scale;
    /* item i = (step, quad thread tt, word j): 8 columns c = step*128 + 32*tt + 8*j; fragments
     * A.b0 = (x[c], x[c+4]), A.b1 = (x[c+1], x[c+5])/16, B.b0 = (x[c+2], x[c+6]), B.b1 = (x[c+3], x[c+7])/16 */
    for (int i = threadIdx.x; i < cols / 8; i += GM_WARPS * 32) {
        const int c = i * 8; /* items are laid out in column order: i = step*16 + tt*4 + j */
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; e++)
            v[e] = s_x[c + e] * xk;
        const __half2 a0 = __floats2half2_rn(v[0], v[4]), a1 = __floats2half2_rn(v[1] * 0.0625f, v[5] * 0.0625f);
        const __half2 b0 = __floats2half2_rn(v[2], v[6]), b1 = __floats2half2_rn(v[3] * 0.0625f, v[7] * 0.0625f);
        s_xh[i] = make_uint4(h2_bits(a0), h2_bits(a1), h2_bits(b0), h2_bits(b1));
    }
    __syncthreads();
    for (int gi = threadIdx.x; gi < cols / 64; gi += GM_WARPS * 32) {
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
    __syncthreads();

    /* the tile: D per 128-column step, columns 2t / 2t+1 = first / second group of the step */
    const bool feeds = (t >= 2) == ((g & 1) != 0);
    float acc_a = 0.0f, acc_b = 0.0f;
#pragma unroll
    for (int st = 0; st < GM_MAX_STEPS; st++) {
        if (st < steps) {
            const int c0 = ks * CW + st * 128;
            const uint4 *xf = s_xh + c0 / 8 + t * 4;
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const uint32_t wa4[4] = {wa[st].x, wa[st].y, wa[st].z, wa[st].w};
            const uint32_t wb4[4] = {wb[st].x, wb[st].y, wb[st].z, wb[st].w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                uint4 xv = feeds ? xf[j] : make_uint4(0u, 0u, 0u, 0u);
                const uint32_t pa = wa4[j], pb = wb4[j], qa = pa >> 8, qb = pb >> 8;
                const uint32_t A0[4] = {(pa & 0x000F000Fu) | 0x64006400u, (pb & 0x000F000Fu) | 0x64006400u,
                                        (pa & 0x00F000F0u) | 0x64006400u, (pb & 0x00F000F0u) | 0x64006400u};
                const uint32_t A1[4] = {(qa & 0x000F000Fu) | 0x64006400u, (qb & 0x000F000Fu) | 0x64006400u,
                                        (qa & 0x00F000F0u) | 0x64006400u, (qb & 0x00F000F0u) | 0x64006400u};
                mma16816(d, A0, xv.x, xv.y);
                mma16816(d, A1, xv.z, xv.w);
            }
            const int gi = c0 / 64;
            const float o0 = s_off[gi], o1 = s_off[gi + 1], x0 = s_xsum[gi], x1 = s_xsum[gi + 1];
            const float2 Sa = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&sa[st]));
            const float2 Ba = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&ba[st]));
            const float2 Sb = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&sb[st]));
            const float2 Bb = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&bb[st]));
            acc_a = fmaf(Sa.x, d[0] - o0, fmaf(Ba.x, x0, fmaf(Sa.y, d[1] - o1, fmaf(Ba.y, x1, acc_a))));
            acc_b = fmaf(Sb.x, d[2] - o0, fmaf(Bb.x, x0, fmaf(Sb.y, d[3] - o1, fmaf(Bb.y, x1, acc_b))));
        }
    }
    if (t == 0) {
        s_part[warp][g] = acc_a;
        s_part[warp][g + 8] = acc_b;
    }
    __syncthreads();

    /* reduce the KS column slices of each tile and store: thread i < RT*16 owns row i % 16 of tile i / 16 */
    float best = -INFINITY;
    int best_row = 0x7fffffff;
    if (threadIdx.x < RT * 16) {
        const int trt = threadIdx.x / 16, r = threadIdx.x % 16;
        const int tl = blockIdx.x * RT + trt;
        int mm = 0, t0 = 0, acc = 0;
#pragma unroll
        for (int q = 0; q < GEMV_MAX_MATS; q++) {
            if (q < b.n_mats) {
                if (tl >= acc) {
                    mm = q;
                    t0 = acc;
                }
                acc += (b.m[q].rows + 15) / 16;
            }
        }
        const int row = (tl - t0) * 16 + r;
        if (tl < n_tiles && row < b.m[mm].rows) {
            float v = 0.0f;
#pragma unroll
            for (int k = 0; k < KS; k++)
                v += s_part[trt * KS + k][r];
            v /= xk;
            float *y = b.y[mm] + row;
            if (OUT_MODE == GEMV_OUT_ADD)
                *y += v;
            else
                *y = v;
            if (OUT_MODE == GEMV_OUT_ARGMAX) {
                best = v;
                best_row = b.row_start[mm] + row;
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
            atomicMax(argmax, k);
    }
}

/* ---- dispatch ------------------------------------------------------------------------------------ */

bool gemv_mma_supported(const gemv_batch &b, int n_tokens)
{
    if (n_tokens != 1 || !g_cuda_tuning.gemv_mma || b.m[0].bits != 4 || b.m[0].cols % 128 != 0 || b.topk_k > 0)
        return false;
    const int cols = b.m[0].cols, CW = cols < 512 ? cols : 512, ks = cols / CW;
    if (cols % CW || !(ks == 1 || ks == 2 || ks == 4 || ks == 8))
        return false;
    for (int k = 0; k < b.n_mats; k++)
        if (((uintptr_t)b.m[k].data | (uintptr_t)b.m[k].scales | (uintptr_t)b.m[k].biases) & 15)
            return false;
    return true;
}

template <int IM, int OM, int KS>
static cudaError_t gm_go(const gemv_batch &b, const gemv_input &in, unsigned long long *argmax, cudaStream_t s)
{
    int tiles = 0;
    for (int k = 0; k < b.n_mats; k++)
        tiles += (b.m[k].rows + 15) / 16;
    constexpr int RT = GM_WARPS / KS;
    const int cols = b.m[0].cols;
    const size_t smem = ((size_t)cols + cols / 2 + 2 * (cols / 64)) * sizeof(float);
    static size_t smem_set = 48 * 1024; /* opt in above the default once per instantiation */
    if (smem > smem_set) {
        const cudaError_t e = cudaFuncSetAttribute(gemv_mma_kernel<IM, OM, KS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   (int)smem);
        if (e != cudaSuccess)
            return e;
        smem_set = smem;
    }
    return launch_pdl(gemv_mma_kernel<IM, OM, KS>, dim3((tiles + RT - 1) / RT), dim3(GM_WARPS * 32), smem, s, b, in,
                      tiles, argmax, g_cuda_tuning.gemv_mma == 1 ? 1 : 0);
}

template <int IM, int OM>
static cudaError_t gm_ks(const gemv_batch &b, const gemv_input &in, unsigned long long *argmax, cudaStream_t s)
{
    const int cols = b.m[0].cols, CW = cols < 512 ? cols : 512;
    switch (cols / CW) {
    case 1: return gm_go<IM, OM, 1>(b, in, argmax, s);
    case 2: return gm_go<IM, OM, 2>(b, in, argmax, s);
    case 4: return gm_go<IM, OM, 4>(b, in, argmax, s);
    case 8: return gm_go<IM, OM, 8>(b, in, argmax, s);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t launch_gemv_mma(const gemv_batch &b, const gemv_input &in, int out_mode, unsigned long long *argmax,
                            cudaStream_t s)
{
    if (!gemv_mma_supported(b, 1))
        return cudaErrorInvalidValue;
    if (in.mode == GEMV_IN_PLAIN) {
        if (out_mode == GEMV_OUT_STORE) return gm_ks<GEMV_IN_PLAIN, GEMV_OUT_STORE>(b, in, argmax, s);
        if (out_mode == GEMV_OUT_ADD) return gm_ks<GEMV_IN_PLAIN, GEMV_OUT_ADD>(b, in, argmax, s);
    } else if (in.mode == GEMV_IN_RMSNORM) {
        if (out_mode == GEMV_OUT_STORE) return gm_ks<GEMV_IN_RMSNORM, GEMV_OUT_STORE>(b, in, argmax, s);
        if (out_mode == GEMV_OUT_ARGMAX) return gm_ks<GEMV_IN_RMSNORM, GEMV_OUT_ARGMAX>(b, in, argmax, s);
    } else if (in.mode == GEMV_IN_GATED) {
        if (out_mode == GEMV_OUT_ADD) return gm_ks<GEMV_IN_GATED, GEMV_OUT_ADD>(b, in, argmax, s);
    }
    return cudaErrorInvalidValue;
}
