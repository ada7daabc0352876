/* gemm_prefill_dev.cuh — device helpers shared by the prefill GEMM kernels (gemm_prefill.cu: the
 * one-warp-row kernel; gemm_prefill_2d.cu: the 2D-warp-tiled kernel): cp.async wrappers, the 4/8-bit
 * and bf16 A-fragment unpacking (load_a), the block-row -> (matrix, row) map (gemm_row), the tile's token
 * rows (gemm_tile_rows) and the 8-warp epilogue (gemm_epilogue_w16, also gemm_prefill_wgmma.cu's). The
 * kernels run GEMM_THREADS threads over GEMM_ROWS weight rows per block.
 */
#ifndef LILY_GEMM_PREFILL_DEV_CUH
#define LILY_GEMM_PREFILL_DEV_CUH

#include "gemm_prefill.cuh"
#include "backend/cuda/gemv/gemv_common.cuh"
#include "backend/cuda/mma_common.cuh"

#define GEMM_THREADS 256
#define GEMM_ROWS 128

/* The 2D-warp-tiled kernel (gemm_prefill_2d.cu) for T = 64 or 128 tokens per block (8 warps), called by
 * launch_gemm after it has checked the arguments; dq: the form on fp16-dequantized 4-bit weights
 * (GEMM_KERNEL_MMA_DQ). cudaErrorInvalidValue for other T or bits (dq: bits other than 4). */
cudaError_t launch_gemm2d(const gemm_args &a, int n_tokens, bool grouped, int T, bool dq, cudaStream_t s);

/* The Hopper wgmma kernel (gemm_prefill_wgmma.cu) for 4-bit weights and T = 64 or 128 tokens per block;
 * cudaErrorInvalidValue otherwise. Only when gemm_wgmma_available(). */
cudaError_t launch_gemm_wgmma(const gemm_args &a, int n_tokens, bool grouped, int T, cudaStream_t s);

/* The grid of a prefill GEMM launch: x = blocks of GEMM_ROWS weight rows (SWIGLU: 64 gate rows and the
 * same up rows), y = tiles of T tokens (dense) or the tile map's bound a.max_tiles (grouped).
 * cudaErrorInvalidValue when the grid is empty or has more than 65535 tiles. */
/* SWIGLU: a block owns 64 gate rows and the same up rows. */
__host__ __device__ constexpr bool gemm_swiglu(int epi) { return epi == GEMM_EPI_SWIGLU; }

static inline cudaError_t gemm_grid(const gemm_args &a, int n_tokens, bool grouped, int T, int epi, dim3 *grid)
{
    const int rows = gemm_swiglu(epi) ? a.m[0].rows : a.row_start[a.n_mats];
    const int per_block = gemm_swiglu(epi) ? 64 : GEMM_ROWS;
    const int gx = (rows + per_block - 1) / per_block;
    const int gy = grouped ? a.max_tiles : (n_tokens + T - 1) / T;
    if (gx <= 0 || gy <= 0 || gy > 65535)
        return cudaErrorInvalidValue;
    *grid = dim3(gx, gy);
    return cudaSuccess;
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid)
{
    const unsigned int sa = (unsigned int)__cvta_generic_to_shared(smem);
    const int n = valid ? 16 : 0; /* 0: zero-fill, nothing read */
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem, bool valid)
{
    const unsigned int sa = (unsigned int)__cvta_generic_to_shared(smem);
    const int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(sa), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* 4-bit word w (nibbles n0..n7, column 8m+i at bits 4i): odd = 0 gives lo = {n0, n4}, hi = {n1, n5};
 * odd = 1 gives lo = {n2, n6}, hi = {n3, n7}, as fp16 integers. */
__device__ __forceinline__ void dq4(uint32_t w, int odd, uint32_t &lo, uint32_t &hi)
{
    if (odd)
        w >>= 8;
    const __half2 k1024 = bits_h2(0x64006400u), k16th = bits_h2(0x2C002C00u), km64 = bits_h2(0xD400D400u);
    lo = h2_bits(__hsub2(bits_h2((w & 0x000F000Fu) | 0x64006400u), k1024));
    hi = h2_bits(__hfma2(bits_h2((w & 0x00F000F0u) | 0x64006400u), k16th, km64));
}

/* 8-bit: x = bytes [c0, c1, c4, c5] gathered by PRMT; lo = {c0, c4}, hi = {c1, c5} */
__device__ __forceinline__ void dq8(uint32_t x, uint32_t &lo, uint32_t &hi)
{
    const __half2 k1024 = bits_h2(0x64006400u);
    lo = h2_bits(__hsub2(bits_h2((x & 0x00FF00FFu) | 0x64006400u), k1024));
    hi = h2_bits(__hsub2(bits_h2(((x >> 8) & 0x00FF00FFu) | 0x64006400u), k1024));
}

__device__ __forceinline__ uint32_t bf_pair_f16(uint32_t a, uint32_t b, bool high)
{
    const float fa = __uint_as_float(high ? (a & 0xffff0000u) : (a << 16));
    const float fb = __uint_as_float(high ? (b & 0xffff0000u) : (b << 16));
    return h2_bits(__floats2half2_rn(fa, fb));
}

/* A fragments of the 4 k16 steps of one group for block rows r0 and r0 + 8 (r0 = the warp's first row
 * + g), from the stage's weight bytes. A[j] = {a0 (row g, k lo), a1 (row g+8, k lo), a2 (row g, k hi), a3 (row g+8, k hi)}. */
template <int BITS>
__device__ __forceinline__ void load_a(const unsigned char *sw, int r0, int tig, uint32_t (&A)[4][4])
{
    constexpr int WB = 8 * BITS;
    if (BITS == 4) {
        const uint2 w0 = *reinterpret_cast<const uint2 *>(sw + r0 * WB + tig * 8);
        const uint2 w1 = *reinterpret_cast<const uint2 *>(sw + (r0 + 8) * WB + tig * 8);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            dq4(j < 2 ? w0.x : w0.y, j & 1, A[j][0], A[j][2]);
            dq4(j < 2 ? w1.x : w1.y, j & 1, A[j][1], A[j][3]);
        }
    } else if (BITS == 8) {
        const uint4 v0 = *reinterpret_cast<const uint4 *>(sw + r0 * WB + tig * 16);
        const uint4 v1 = *reinterpret_cast<const uint4 *>(sw + (r0 + 8) * WB + tig * 16);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const unsigned int sel = (j & 1) ? 0x7632u : 0x5410u;
            dq8(__byte_perm(j < 2 ? v0.x : v0.z, j < 2 ? v0.y : v0.w, sel), A[j][0], A[j][2]);
            dq8(__byte_perm(j < 2 ? v1.x : v1.z, j < 2 ? v1.y : v1.w, sel), A[j][1], A[j][3]);
        }
    } else {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = r0 + 8 * h;
            const int sw1 = r & 1; /* chunk swizzle of bf16 rows (see load_stage) */
            const uint4 u0 = *reinterpret_cast<const uint4 *>(sw + r * WB + ((2 * tig) ^ sw1) * 16);
            const uint4 u1 = *reinterpret_cast<const uint4 *>(sw + r * WB + ((2 * tig + 1) ^ sw1) * 16);
            const uint32_t u[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int m0 = 4 * (j >> 1) + (j & 1);
                A[j][h] = bf_pair_f16(u[m0], u[m0 + 2], false);
                A[j][2 + h] = bf_pair_f16(u[m0], u[m0 + 2], true);
            }
        }
    }
}

/* load_a<4>'s fragments dequantized to fp16: w = s·q + b, one HFMA2 per pair on the exact integers q
 * (one rounding, relative 2^-11 of |w|; the wgmma kernel's weights, gemm_prefill_wgmma.cu). s0/b0: scale
 * and bias of row r0 as fp16 pairs, s1/b1 of row r0 + 8 (A[j][0], A[j][2] are row r0's, A[j][1], A[j][3]
 * row r0 + 8's). */
__device__ __forceinline__ void load_a4_dq(const unsigned char *sw, int r0, int tig, __half2 s0, __half2 b0, __half2 s1,
                                           __half2 b1, uint32_t (&A)[4][4])
{
    load_a<4>(sw, r0, tig, A);
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            A[j][i] = h2_bits(__hfma2(bits_h2(A[j][i]), (i & 1) ? s1 : s0, (i & 1) ? b1 : b0));
}

/* Block row br (0..127) -> matrix, row within it; false past the last row. */
template <int EPI>
__device__ __forceinline__ bool gemm_row(const gemm_args &a, int br, int &mi, int &lr)
{
    if (gemm_swiglu(EPI)) {
        mi = br >= 64 ? 1 : 0;
        lr = blockIdx.x * 64 + (br & 63);
        return lr < a.m[0].rows;
    }
    const int R = blockIdx.x * GEMM_ROWS + br;
    mi = 0;
#pragma unroll
    for (int k = 1; k < GEMV_MAX_MATS; k++)
        if (k < a.n_mats && R >= a.row_start[k])
            mi = k;
    lr = R - a.row_start[mi];
    return R < a.row_start[a.n_mats];
}

/* The block's tile of T token rows: dense = rows blockIdx.y·T.., grouped = tile blockIdx.y of the device
 * tile map (expert *e, positions *base.. of its group). Fills s_tok (X row of each tile row, 0 past the
 * end) and s_scale (its activation scale; 0 past the end); *count = live rows. Returns false for a
 * grouped tile past the device count (the whole block exits before any barrier). */
template <int T, bool GROUPED>
__device__ __forceinline__ bool gemm_tile_rows(const gemm_args &a, int n_tokens, int &e, int &base, int &count,
                                               int *s_tok, float *s_scale)
{
    const int tid = threadIdx.x;
    e = 0;
    if (GROUPED) {
        const int i = blockIdx.y;
        if (i >= *a.n_tiles)
            return false;
        e = a.tile_expert[i];
        base = a.tile_start[i];
        count = min(T, a.offsets[e + 1] - base);
    } else {
        base = blockIdx.y * T;
        count = min(T, n_tokens - base);
    }
    if (tid < T) {
        int row = 0;
        float sc = 0.0f;
        if (tid < count) {
            row = a.gather ? a.gather[base + tid] : base + tid;
            sc = a.act.scale[row];
        }
        s_tok[tid] = row;
        s_scale[tid] = sc;
    }
    return true;
}

/* One output element of the STORE / ADD epilogues: y[i] (=, +=) v. */
template <int EPI> __device__ __forceinline__ void gemm_store(float *y, size_t i, float v)
{
    if constexpr (EPI == GEMM_EPI_ADD)
        y[i] += v;
    else
        y[i] = v;
}

/* Epilogue of a block whose warp w (0..7) holds rows 16w + g and 16w + g + 8 of the block's 128 rows x
 * T = 8·NT tokens as acc[nt][i] = (row 16w + g + 8·(i >> 1), token 8·nt + 2·tig + (i & 1)) — the
 * m16n8k16 accumulator layout, also that of a warpgroup's wgmma m64nN (gemm_kernel, gemm_wg_kernel).
 * Multiplies by the token's activation scale; STORE / ADD write y[base + token][row] for tokens < count
 * (gemm_store);
 * SWIGLU (warps 0-3 gate, 4-7 up) stages the gate values in s_g ([64][T] floats, the free pipeline
 * buffers) and needs a __syncthreads-safe call by all threads. FRAG: s_g holds the gate
 * warps' fragments as they are (float4 (nt) of lane l of warp w at [(w·NT + nt)·32 + l]): warp w + 4
 * holds the up values of the same (row, token) pairs in the same places, so the exchange is one
 * conflict-free float4 store and load per n8 block instead of 8-way bank conflicts on [64][T]; same
 * results. */
template <int EPI, int NT, bool FRAG = false>
__device__ __forceinline__ void gemm_epilogue_w16(const gemm_args &a, const float (&acc)[NT][4], int warp, int g,
                                                  int tig, int base, int count, const float *s_scale, float *s_g)
{
    constexpr int T = 8 * NT;
    if constexpr (EPI == GEMM_EPI_SWIGLU && FRAG) {
        float4 *s_g4 = reinterpret_cast<float4 *>(s_g);
        const int lane = threadIdx.x & 31;
        if (warp < 4)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                s_g4[(warp * NT + nt) * 32 + lane] = make_float4(acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]);
        __syncthreads();
        if (warp >= 4) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const float4 gq = s_g4[((warp - 4) * NT + nt) * 32 + lane];
                const float gv4[4] = {gq.x, gq.y, gq.z, gq.w};
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int lr = blockIdx.x * 64 + (warp - 4) * 16 + g + 8 * h;
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        const int tok = nt * 8 + tig * 2 + j;
                        if (lr < a.m[0].rows && tok < count) {
                            const float gv = gv4[2 * h + j] * s_scale[tok];
                            const float uv = acc[nt][2 * h + j] * s_scale[tok];
                            a.y[0][(size_t)(base + tok) * a.y_stride[0] + lr] = silu_f(gv) * uv;
                        }
                    }
                }
            }
        }
    } else if constexpr (gemm_swiglu(EPI)) {
        /* s_g: [64][T] gate values */
        if (warp < 4)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    s_g[(warp * 16 + g + 8 * (i >> 1)) * T + nt * 8 + tig * 2 + (i & 1)] = acc[nt][i];
        __syncthreads();
        if (warp >= 4) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int rl = (warp - 4) * 16 + g + 8 * h;
                const int lr = blockIdx.x * 64 + rl;
                if (lr >= a.m[0].rows)
                    continue;
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        const int tok = nt * 8 + tig * 2 + j;
                        if (tok < count) {
                            const float gv = s_g[rl * T + tok] * s_scale[tok];
                            const float uv = acc[nt][2 * h + j] * s_scale[tok];
                            a.y[0][(size_t)(base + tok) * a.y_stride[0] + lr] = silu_f(gv) * uv;
                        }
                    }
            }
        }
    } else {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int mi, lr;
            if (!gemm_row<EPI>(a, warp * 16 + g + 8 * h, mi, lr))
                continue;
            float *y = a.y[mi];
            const int ys = a.y_stride[mi];
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int tok = nt * 8 + tig * 2 + j;
                    if (tok < count)
                        gemm_store<EPI>(y, (size_t)(base + tok) * ys + lr, acc[nt][2 * h + j] * s_scale[tok]);
                }
        }
    }
}

#endif
