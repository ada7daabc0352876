/* gemm_prefill_wgmma.cu — the Hopper (sm_90a) variant of the 4-bit prefill GEMM (g_cuda_tuning.gemm_variant
 * 3): the same operands and results as gemm_prefill_2d.cu up to fp16 rounding of the weights, with
 * wgmma.mma_async instead of mma.sync so that one instruction covers 64 rows x N tokens x 16 columns.
 *
 * gemm_wg_kernel<N, DEPTH, EPI, GROUPED>: 256 threads = 2 warpgroups; a block owns 128 weight rows (SWIGLU: 64
 * gate rows + the same 64 up rows; gemm_row) x N = 64 or 128 tokens; warpgroup w owns rows 64w..64w+63
 * (warp i of the block: rows 16i..16i+15, gemm_epilogue_w16's layout) and issues, per 64-column group,
 * four wgmma m64nNk16 (fp16 x fp16 -> fp32 in registers) with
 *   A from registers: the weights dequantized to fp16, w = s·q + b by one HFMA2 per pair (q exact as fp16
 *     by the 1024 + q trick, s and b bf16 -> fp16 exactly); A's register fragment per warp is the
 *     m16n8k16 one (a0: row g, k 2t, 2t+1; a1: row g+8; a2/a3: k + 8), PTX ISA "Register fragments and
 *     shared memory matrix layouts" for wgmma .m64nNk16;
 *   B from shared memory: the stage's N token rows x 128 B (64 columns fp16), K-major, 128-byte swizzle
 *     (16-byte chunk c of row r at chunk c ^ (r & 7), the layout gemm_prefill_2d.cu writes), read through
 *     a matrix descriptor; k16 slice s of the group starts 32·s bytes into each row.
 * The activation rows hold each 16-column block permuted (gemm_perm16): physical position p of slice s is
 * column 16s + gemm_perm16(p), so thread t's A pairs are columns {t, t+4} (k 2t, 2t+1) and {8+t, 12+t}
 * (k 2t+8, 2t+9) of the slice: nibbles t and t + 4 of the slice's two 4-bit words, one shift by 4t.
 * No per-group fold and no group sums (gemm_act.xs is unused); the epilogue multiplies the row scale back.
 * Error vs gemm_prefill_2d: each weight is rounded to fp16 once (relative 2^-11).
 * Pipeline: 4 cp.async stages of [activations N x 128 B (1024-byte aligned) | weights 128 rows x 32 B |
 * fp32 scale[128], bias[128]]; a step waits for its stage, makes the cp.async writes visible to the async
 * proxy (fence.proxy.async in the writing threads, then the barrier), refills the slot of step k - 1,
 * dequantizes, issues the 4 wgmmas and waits for them before the next barrier (the stage it read is the
 * next refill). DEPTH 1 (gemm_variant 4): 5 stages, the refill goes to the slot of step k - 2 and the
 * wait for group k - 1's wgmmas moves to just before group k's dequantization, so the tensor pipe keeps
 * working through the barrier, the refill and the weight loads. Compiled for sm_90a only (__CUDA_ARCH_FEAT_SM90_ALL); elsewhere the kernel is an empty
 * stub and gemm_wgmma_available() says false, so launch_gemm falls back to variant 1.
 */
#include "gemm_prefill_dev.cuh"
#include "wgmma_common.cuh" /* descriptors, fences, wait */

/* Blocks per SM promised to ptxas: 2 caps the registers at 128 (N 128: 119-121 used, DEPTH 1 128; N 64:
 * 80-95; no spills, -Xptxas -v) and two blocks fit the shared memory (N 128: 87 KB each, DEPTH 1 109 KB);
 * 1 allows 255. */
#ifndef GEMM_WG_MIN_BLOCKS
#define GEMM_WG_MIN_BLOCKS 2
#endif

template <int N, int DEPTH>
struct gemm_wg_shape {
    static constexpr int STAGES = DEPTH ? 5 : 4; /* DEPTH 1 refills 2 groups behind: keep 3 ahead */
    static constexpr int X_STAGE = N * 128;        /* first: the descriptor's 1024-byte swizzle atoms */
    static constexpr int W_STAGE = GEMM_ROWS * 32; /* 4-bit: 32 bytes per row per group */
    static constexpr int SB_STAGE = 2 * GEMM_ROWS * 4;
    static constexpr int STAGE = X_STAGE + W_STAGE + SB_STAGE;
    static constexpr int SMEM = STAGES * STAGE + 1024; /* + slack to align the base to 1024 */
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* D (64 x N fp32, m16n8 layout per warp and n8 block) += A (64 x 16 fp16, registers) · B (16 x N fp16,
 * K-major in shared memory at desc). */
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
                 "{%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
          "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
          "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
          "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

/* Two weights of one row (low half: k 2t, high: k 2t+1) from a 4-bit word: nibbles sh/4 and sh/4 + 4. */
__device__ __forceinline__ uint32_t dq4_wg(uint32_t w, int sh, __half2 s, __half2 b)
{
    const __half2 q = __hsub2(bits_h2(((w >> sh) & 0x000F000Fu) | 0x64006400u), bits_h2(0x64006400u));
    return h2_bits(__hfma2(q, s, b));
}

template <int N>
__device__ __forceinline__ void wgmma_n(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc)
{
    if constexpr (N == 64)
        wgmma_m64n64k16(d, a, desc);
    else
        wgmma_m64n128k16(d, a, desc);
}

#endif

template <int N, int DEPTH, int EPI, bool GROUPED>
__global__ void __launch_bounds__(GEMM_THREADS, GEMM_WG_MIN_BLOCKS) gemm_wg_kernel(gemm_args a, int n_tokens)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef gemm_wg_shape<N, DEPTH> S;
    constexpr int NT = N / 8, NS = S::STAGES;
    constexpr int PF = DEPTH ? NS - 2 : NS - 1; /* groups loaded ahead: a refill waits for its slot's wgmmas */
    static_assert(S::STAGE % 1024 == 0 && N * 8 % GEMM_THREADS == 0, "stage layout");
    static_assert(S::SMEM - 1024 >= 65 * N * 4, "SWIGLU(_H16) epilogue needs 65 x N floats");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ int s_tok[N];
    __shared__ float s_scale[N];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    unsigned char *smem = smem_raw + ((1024u - (raw & 1023u)) & 1023u);
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tig = lane & 3;

    int e, base, count;
    if (!gemm_tile_rows<N, GROUPED>(a, n_tokens, e, base, count, s_tok, s_scale))
        return;
    const int cols = a.act.cols, n_groups = cols / 64;

    /* one 16-byte weight chunk per thread (128 rows x 2), and the scale (tid < 128) or bias of row tid & 127 */
    const unsigned char *wsrc = reinterpret_cast<const unsigned char *>(a.act.x);
    bool wok;
    const __nv_bfloat16 *sbp = NULL;
    {
        int mi, lr;
        wok = gemm_row<EPI>(a, tid >> 1, mi, lr);
        if (wok)
            wsrc = a.m[mi].data + ((int64_t)e * a.m[mi].rows + lr) * a.m[mi].row_bytes + (tid & 1) * 16;
        if (gemm_row<EPI>(a, tid & (GEMM_ROWS - 1), mi, lr))
            sbp = (tid < GEMM_ROWS ? a.m[mi].scales : a.m[mi].biases) + ((int64_t)e * a.m[mi].rows + lr) * n_groups;
    }
    __syncthreads(); /* s_tok */

    auto load_stage = [&](int k, int st) {
        unsigned char *sx = smem + st * S::STAGE;
        cp_async16(sx + S::X_STAGE + tid * 16, wok ? wsrc + (size_t)k * 32 : wsrc, wok);
#pragma unroll
        for (int i = 0; i < N * 8 / GEMM_THREADS; i++) {
            const int q = tid + i * GEMM_THREADS, r = q >> 3, c = q & 7;
            const __half *src = a.act.x + (size_t)s_tok[r] * cols + k * 64 + c * 8;
            cp_async16(sx + r * 128 + ((c ^ (r & 7)) * 16), src, r < count);
        }
    };
    auto sb_slot = [&](int k) {
        return reinterpret_cast<float *>(smem + (k % NS) * S::STAGE + S::X_STAGE + S::W_STAGE);
    };

    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
        acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
    for (int st = 0; st < PF; st++) {
        if (st < n_groups)
            load_stage(st, st);
        cp_async_commit();
    }
    /* scale/bias of group k: stored at step k - (NS - 2), as in gemm_prefill_2d.cu */
    __nv_bfloat16 sbv = __float2bfloat16(0.0f);
#pragma unroll
    for (int k = 0; k < NS - 2; k++)
        if (k < n_groups)
            sb_slot(k)[tid] = sbp ? bf2f(sbp[k]) : 0.0f;
    if (sbp && NS - 2 < n_groups)
        sbv = sbp[NS - 2];

    const int r0 = warp * 16 + g, sh = 4 * tig;
    /* DEPTH 1: the wgmmas of group k - 1 run through step k's barrier, refill and weight loads; the wait
     * comes just before the dequantization writes A (a register write while a wgmma that reads A or
     * the accumulators is in flight would make ptxas serialize every wgmma, C7513) */
    uint32_t A[4][4];
    for (int k = 0; k < n_groups; k++) {
        cp_async_wait<PF - 1>();
        fence_proxy_async(); /* this thread's cp.async writes -> the async proxy (wgmma reads B) */
        __syncthreads();
        {
            /* the slot of group k - 1 (DEPTH 0) or k - 2 (DEPTH 1): its wgmmas completed before the barrier */
            const int kn = k + PF;
            if (kn < n_groups)
                load_stage(kn, kn % NS);
            cp_async_commit();
        }
        {
            const int ks = k + NS - 2;
            if (ks < n_groups) {
                sb_slot(ks)[tid] = sbp ? bf2f(sbv) : 0.0f;
                if (sbp && ks + 1 < n_groups)
                    sbv = sbp[ks + 1];
            }
        }
        const unsigned char *sx = smem + (k % NS) * S::STAGE;
        const unsigned char *sw = sx + S::X_STAGE;
        const float *ssb = reinterpret_cast<const float *>(sw + S::W_STAGE);
        const uint4 u0l = *reinterpret_cast<const uint4 *>(sw + r0 * 32);
        const uint4 u0h = *reinterpret_cast<const uint4 *>(sw + r0 * 32 + 16);
        const uint4 u1l = *reinterpret_cast<const uint4 *>(sw + (r0 + 8) * 32);
        const uint4 u1h = *reinterpret_cast<const uint4 *>(sw + (r0 + 8) * 32 + 16);
        const uint32_t w0[8] = {u0l.x, u0l.y, u0l.z, u0l.w, u0h.x, u0h.y, u0h.z, u0h.w};
        const uint32_t w1[8] = {u1l.x, u1l.y, u1l.z, u1l.w, u1h.x, u1h.y, u1h.z, u1h.w};
        const __half2 s0 = __float2half2_rn(ssb[r0]), b0 = __float2half2_rn(ssb[GEMM_ROWS + r0]);
        const __half2 s1 = __float2half2_rn(ssb[r0 + 8]), b1 = __float2half2_rn(ssb[GEMM_ROWS + r0 + 8]);
        if (DEPTH)
            wg_wait<0>(); /* group k - 1's wgmmas: A free */
#pragma unroll
        for (int s = 0; s < 4; s++) {
            A[s][0] = dq4_wg(w0[2 * s], sh, s0, b0);
            A[s][1] = dq4_wg(w1[2 * s], sh, s1, b1);
            A[s][2] = dq4_wg(w0[2 * s + 1], sh, s0, b0);
            A[s][3] = dq4_wg(w1[2 * s + 1], sh, s1, b1);
        }
        const uint64_t desc = wg_desc(sbase + (k % NS) * S::STAGE);
        wg_fence();
#pragma unroll
        for (int s = 0; s < 4; s++)
            wgmma_n<N>(acc, A[s], desc + 2 * s); /* + 32 bytes >> 4 per k16 slice */
        wg_commit();
        if (!DEPTH)
            wg_wait<0>();
    }
    if (DEPTH)
        wg_wait<0>();
    cp_async_wait<0>();
    __syncthreads(); /* pipeline buffers free: the SWIGLU epilogue reuses them */
    gemm_epilogue_w16<EPI, NT>(a, acc, warp, g, tig, base, count, s_scale, reinterpret_cast<float *>(smem));
#else
    (void)a;
    (void)n_tokens;
#endif
}

/* ---- dispatch ---------------------------------------------------------------------------------------- */

template <int N, int DEPTH, int EPI, bool GROUPED>
static cudaError_t gemm_wg_go(const gemm_args &a, int n_tokens, cudaStream_t s)
{
    typedef gemm_wg_shape<N, DEPTH> S;
    static size_t smem_set = 48 * 1024; /* opted in once per instance */
    dim3 grid;
    cudaError_t e = cuda_smem_opt_in(gemm_wg_kernel<N, DEPTH, EPI, GROUPED>, S::SMEM, &smem_set);
    if (e == cudaSuccess)
        e = gemm_grid(a, n_tokens, GROUPED, N, EPI, &grid);
    if (e != cudaSuccess)
        return e;
    gemm_wg_kernel<N, DEPTH, EPI, GROUPED><<<grid, GEMM_THREADS, S::SMEM, s>>>(a, n_tokens);
    return cudaGetLastError();
}

template <int N, int DEPTH>
static cudaError_t gemm_wg_epi(const gemm_args &a, int n_tokens, bool grouped, cudaStream_t s)
{
    if (grouped) {
        if (a.epi == GEMM_EPI_STORE) return gemm_wg_go<N, DEPTH, GEMM_EPI_STORE, true>(a, n_tokens, s);
        if (a.epi == GEMM_EPI_SWIGLU) return gemm_wg_go<N, DEPTH, GEMM_EPI_SWIGLU, true>(a, n_tokens, s);
        if (a.epi == GEMM_EPI_STORE_BF16) return gemm_wg_go<N, DEPTH, GEMM_EPI_STORE_BF16, true>(a, n_tokens, s);
        if (a.epi == GEMM_EPI_SWIGLU_H16) return gemm_wg_go<N, DEPTH, GEMM_EPI_SWIGLU_H16, true>(a, n_tokens, s);
        return cudaErrorInvalidValue;
    }
    if (a.epi == GEMM_EPI_STORE) return gemm_wg_go<N, DEPTH, GEMM_EPI_STORE, false>(a, n_tokens, s);
    if (a.epi == GEMM_EPI_ADD) return gemm_wg_go<N, DEPTH, GEMM_EPI_ADD, false>(a, n_tokens, s);
    if (a.epi == GEMM_EPI_SWIGLU) return gemm_wg_go<N, DEPTH, GEMM_EPI_SWIGLU, false>(a, n_tokens, s);
    return cudaErrorInvalidValue;
}

/* 1 in the sm_90a image (the real kernel), 0 in every other image (the stub): the value of the image
 * the runtime loaded for this device. */
__device__ int g_gemm_wg_real =
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    1;
#else
    0;
#endif

bool gemm_wgmma_available(void)
{
    static int avail = -1;
    if (avail < 0) {
        int real = 0;
        const cudaError_t read = cudaMemcpyFromSymbol(&real, g_gemm_wg_real, sizeof real);
        avail = cuda_sm90a_image(read, real);
    }
    return avail == 1;
}

cudaError_t launch_gemm_wgmma(const gemm_args &a, int n_tokens, bool grouped, int T, int depth, cudaStream_t s)
{
    if (a.m[0].bits != 4 || (depth != 0 && depth != 1))
        return cudaErrorInvalidValue;
    if (T == 64)
        return depth ? gemm_wg_epi<64, 1>(a, n_tokens, grouped, s) : gemm_wg_epi<64, 0>(a, n_tokens, grouped, s);
    if (T == 128)
        return depth ? gemm_wg_epi<128, 1>(a, n_tokens, grouped, s) : gemm_wg_epi<128, 0>(a, n_tokens, grouped, s);
    return cudaErrorInvalidValue;
}
