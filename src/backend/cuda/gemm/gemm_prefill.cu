/* gemm_prefill.cu — tensor-core GEMMs for prefill (n tokens per forward call): Y (=, +=, swiglu) X·Wᵀ
 * over weights kept as stored (MLX affine 4/8-bit or bf16), with X in gemm_act form (gemm_prep.cu),
 * dense (rows of X = tokens) or grouped by expert from a device tile map (MoE).
 *
 * gemm_kernel<BITS, NT, EPI, GROUPED>: 256 threads (8 warps), a block owns 128 weight rows (SWIGLU: 64
 * gate rows + the same 64 up rows) x T = 8·NT tokens; warp w owns rows 16w..16w+15 and all T tokens
 * (NT mma tiles of m16n8k16, fp16 x fp16 -> fp32). K advances one quantization group (64 columns) per
 * step through a 3-stage cp.async pipeline in shared memory (weights: the group's 32/64/128 bytes of
 * each row; activations: T rows of 128 bytes, 16-byte chunks XOR-swizzled by row; group sums). A
 * thread's A fragments of a group come from 8/16/32 contiguous bytes of its row: 4-bit words unpack
 * to fp16 integers with one LOP3 + one HSUB2/HFMA2 per pair (the activation columns are permuted to
 * the unpack order, gemm_perm16); 8-bit adds a PRMT; bf16 converts via fp32. Per group and row the
 * fp32 MMA sum folds as acc += s·Σqx + b·Σx; the epilogue multiplies by the row's activation scale.
 * launch_gemm runs this kernel for 16-token tiles, the 2D-warp-tiled one (gemm_prefill_2d.cu) for 64 and
 * 128 (with GEMM_KERNEL_MMA_DQ its form on fp16-dequantized 4-bit weights), or, with GEMM_KERNEL_WGMMA,
 * the wgmma one (gemm_prefill_wgmma.cu) for 4-bit weights at 64 and 128;
 * the shared device helpers are in gemm_prefill_dev.cuh.
 */
#include "gemm_prefill_dev.cuh"

#define GEMM_STAGES 3

/* ---- the GEMM ------------------------------------------------------------------------------------------ */

template <int BITS, int NT>
struct gemm_shape {
    static constexpr int T = NT * 8;
    static constexpr int WB = 8 * BITS;         /* weight bytes per row per group */
    static constexpr int CPR = WB / 16;         /* 16-byte chunks per row per group */
    static constexpr int W_STAGE = GEMM_ROWS * WB;
    static constexpr int X_STAGE = T * 128;
    static constexpr int STAGE = W_STAGE + X_STAGE + T * 4;
    static constexpr int SMEM = GEMM_STAGES * STAGE;
    static constexpr int WPT = GEMM_ROWS * CPR / GEMM_THREADS; /* weight chunks per thread per stage */
};

template <int BITS, int NT, int EPI, bool GROUPED>
__global__ void __launch_bounds__(GEMM_THREADS) gemm_kernel(gemm_args a, int n_tokens)
{
    typedef gemm_shape<BITS, NT> S;
    constexpr int T = S::T;
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ int s_tok[T];
    __shared__ float s_scale[T];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tig = lane & 3;

    int e, base, count;
    if (!gemm_tile_rows<T, GROUPED>(a, n_tokens, e, base, count, s_tok, s_scale))
        return;
    const int cols = a.act.cols, n_groups = cols / 64;

    /* this thread's weight chunks (same rows every group) */
    const unsigned char *wsrc[S::WPT];
    int wdst[S::WPT];
    bool wok[S::WPT];
#pragma unroll
    for (int i = 0; i < S::WPT; i++) {
        const int q = tid + i * GEMM_THREADS, br = q / S::CPR, part = q % S::CPR;
        int mi, lr;
        wok[i] = gemm_row<EPI>(a, br, mi, lr);
        const dmat &m = a.m[mi];
        wsrc[i] = wok[i] ? m.data + ((int64_t)e * m.rows + lr) * m.row_bytes + part * 16
                         : reinterpret_cast<const unsigned char *>(a.act.x);
        wdst[i] = br * S::WB + (BITS == 16 ? (part ^ (br & 1)) : part) * 16;
    }
    /* scale/bias rows of this thread's fragment rows */
    const __nv_bfloat16 *sp[2] = {NULL, NULL}, *bp[2] = {NULL, NULL};
    if (BITS < 16) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int mi, lr;
            if (gemm_row<EPI>(a, warp * 16 + g + 8 * h, mi, lr)) {
                const dmat &m = a.m[mi];
                const int64_t pr = (int64_t)e * m.rows + lr;
                sp[h] = m.scales + pr * n_groups;
                bp[h] = m.biases + pr * n_groups;
            }
        }
    }
    __syncthreads(); /* s_tok */

    auto load_stage = [&](int k, int st) {
        unsigned char *sw = smem + st * S::STAGE;
#pragma unroll
        for (int i = 0; i < S::WPT; i++)
            cp_async16(sw + wdst[i], wok[i] ? wsrc[i] + (size_t)k * S::WB : wsrc[i], wok[i]);
        unsigned char *sx = sw + S::W_STAGE;
        for (int q = tid; q < T * 8; q += GEMM_THREADS) {
            const int r = q >> 3, c = q & 7;
            const __half *src = a.act.x + (size_t)s_tok[r] * cols + k * 64 + c * 8;
            cp_async16(sx + r * 128 + ((c ^ (r & 7)) * 16), src, r < count);
        }
        if (tid < T)
            cp_async4(sx + S::X_STAGE + tid * 4, a.act.xs + (size_t)s_tok[tid] * n_groups + k, tid < count);
    };

    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
        acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
    for (int st = 0; st < GEMM_STAGES - 1; st++) {
        if (st < n_groups)
            load_stage(st, st);
        cp_async_commit();
    }
    float sc[2] = {0.0f, 0.0f}, bi[2] = {0.0f, 0.0f};
    if (BITS < 16)
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (sp[h]) {
                sc[h] = bf2f(sp[h][0]);
                bi[h] = bf2f(bp[h][0]);
            }

    for (int k = 0; k < n_groups; k++) {
        cp_async_wait<GEMM_STAGES - 2>();
        __syncthreads();
        {
            const int kn = k + GEMM_STAGES - 1;
            if (kn < n_groups)
                load_stage(kn, kn % GEMM_STAGES);
            cp_async_commit();
        }
        float scn[2] = {0.0f, 0.0f}, bin[2] = {0.0f, 0.0f};
        if (BITS < 16 && k + 1 < n_groups)
#pragma unroll
            for (int h = 0; h < 2; h++)
                if (sp[h]) {
                    scn[h] = bf2f(sp[h][k + 1]);
                    bin[h] = bf2f(bp[h][k + 1]);
                }
        const unsigned char *sw = smem + (k % GEMM_STAGES) * S::STAGE;
        const unsigned char *sx = sw + S::W_STAGE;
        const float *sxs = reinterpret_cast<const float *>(sx + S::X_STAGE);
        uint32_t A[4][4];
        load_a<BITS>(sw, warp * 16 + g, tig, A);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int r = nt * 8 + g;
            float c4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            float(&d)[4] = BITS == 16 ? acc[nt] : c4;
#pragma unroll
            for (int jj = 0; jj < 2; jj++) {
                const uint4 bv = *reinterpret_cast<const uint4 *>(sx + r * 128 + (((2 * tig + jj) ^ g) * 16));
                mma16816(d, A[2 * jj], bv.x, bv.y);
                mma16816(d, A[2 * jj + 1], bv.z, bv.w);
            }
            if (BITS < 16) {
                const float2 xs = *reinterpret_cast<const float2 *>(sxs + nt * 8 + tig * 2);
                acc[nt][0] = fmaf(sc[0], c4[0], fmaf(bi[0], xs.x, acc[nt][0]));
                acc[nt][1] = fmaf(sc[0], c4[1], fmaf(bi[0], xs.y, acc[nt][1]));
                acc[nt][2] = fmaf(sc[1], c4[2], fmaf(bi[1], xs.x, acc[nt][2]));
                acc[nt][3] = fmaf(sc[1], c4[3], fmaf(bi[1], xs.y, acc[nt][3]));
            }
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            sc[h] = scn[h];
            bi[h] = bin[h];
        }
    }
    cp_async_wait<0>();
    __syncthreads(); /* pipeline buffers free: the SWIGLU epilogue reuses them */

    gemm_epilogue_w16<EPI, NT>(a, acc, warp, g, tig, base, count, s_scale, reinterpret_cast<float *>(smem));
}

/* ---- dispatch: the one place that maps (bits, tokens, epilogue) to a kernel ------------------------ */

template <int BITS, int NT, int EPI, bool GROUPED>
static cudaError_t gemm_go(const gemm_args &a, int n_tokens, cudaStream_t s)
{
    typedef gemm_shape<BITS, NT> S;
    static_assert(S::SMEM >= 64 * S::T * 4, "SWIGLU epilogue needs 64 x T floats");
    static size_t smem_set = 48 * 1024; /* opted in once per instance */
    dim3 grid;
    cudaError_t e = cuda_smem_opt_in(gemm_kernel<BITS, NT, EPI, GROUPED>, S::SMEM, &smem_set);
    if (e == cudaSuccess)
        e = gemm_grid(a, n_tokens, GROUPED, S::T, EPI, &grid);
    if (e != cudaSuccess)
        return e;
    gemm_kernel<BITS, NT, EPI, GROUPED><<<grid, GEMM_THREADS, S::SMEM, s>>>(a, n_tokens);
    return cudaGetLastError();
}

template <int BITS, int NT>
static cudaError_t gemm_epi(const gemm_args &a, int n_tokens, bool grouped, cudaStream_t s)
{
    if (grouped) {
        if (a.epi == GEMM_EPI_STORE) return gemm_go<BITS, NT, GEMM_EPI_STORE, true>(a, n_tokens, s);
        if (a.epi == GEMM_EPI_SWIGLU) return gemm_go<BITS, NT, GEMM_EPI_SWIGLU, true>(a, n_tokens, s);
        return cudaErrorInvalidValue;
    }
    if (a.epi == GEMM_EPI_STORE) return gemm_go<BITS, NT, GEMM_EPI_STORE, false>(a, n_tokens, s);
    if (a.epi == GEMM_EPI_ADD) return gemm_go<BITS, NT, GEMM_EPI_ADD, false>(a, n_tokens, s);
    if (a.epi == GEMM_EPI_SWIGLU) return gemm_go<BITS, NT, GEMM_EPI_SWIGLU, false>(a, n_tokens, s);
    return cudaErrorInvalidValue;
}

template <int BITS>
static cudaError_t gemm_bits(const gemm_args &a, int n_tokens, bool grouped, int T, cudaStream_t s)
{
    return T == 16 ? gemm_epi<BITS, 2>(a, n_tokens, grouped, s) : cudaErrorInvalidValue;
}

gemm_kernel_id gemm_kernel_choose(void)
{
    return gemm_wgmma_available() ? GEMM_KERNEL_WGMMA : GEMM_KERNEL_MMA_DQ;
}

int gemm_grouped_tile(int kernel, double avg_rows)
{
    /* measured (H200, docs/BENCHMARKS.md "Prefill GEMM variant x MoE tile by prompt length" and "The
     * non-Hopper path"): with the mma.sync kernels (MMA and MMA_DQ) 128-token tiles lost at every length
     * and 64 wins from ~24 rows per expert; the wgmma kernel's dequantization is amortised over the tile's
     * tokens, so it takes 128 from 80 rows (bench_cuda_gemm: 128 faster for both grouped GEMMs at 80-128
     * rows per expert, docs/BENCHMARKS.md "MoE tile threshold") */
    if (kernel == GEMM_KERNEL_WGMMA)
        return avg_rows >= 80.0 ? 128 : avg_rows >= 24.0 ? 64 : 16;
    return avg_rows >= 24.0 ? 64 : 16;
}

int gemm_dense_tile(int kernel, int n_tokens)
{
    if (n_tokens <= 16)
        return 16;
    return (kernel == GEMM_KERNEL_WGMMA || kernel == GEMM_KERNEL_MMA_DQ) && n_tokens >= 128 ? 128 : 64;
}

cudaError_t launch_gemm(const gemm_args &a, int n_tokens, cudaStream_t s)
{
    if (a.n_mats < 1 || a.n_mats > GEMV_MAX_MATS || a.act.cols % 64 || a.act.cols <= 0)
        return cudaErrorInvalidValue;
    for (int k = 0; k < a.n_mats; k++)
        if (a.m[k].cols != a.act.cols || a.m[k].bits != a.m[0].bits || !a.m[k].data)
            return cudaErrorInvalidValue;
    if (gemm_swiglu(a.epi) && (a.n_mats != 2 || a.m[0].rows != a.m[1].rows))
        return cudaErrorInvalidValue;
    const bool grouped = a.tile_expert != NULL;
    if (grouped) {
        if (a.epi == GEMM_EPI_ADD || (a.epi == GEMM_EPI_STORE && a.n_mats != 1) ||
            !a.tile_start || !a.n_tiles || !a.offsets || a.max_tiles <= 0)
            return cudaErrorInvalidValue;
    } else if (n_tokens <= 0) {
        return cudaErrorInvalidValue;
    }
    const int T = a.tile_tokens ? a.tile_tokens : gemm_dense_tile(a.kernel, n_tokens);
    if (T != 16 && T != 64 && T != 128)
        return cudaErrorInvalidValue;
    /* the wgmma kernel and the DQ form take 4-bit weights at 64/128-token tiles; every other case (8-bit /
     * bf16 weights, 16-token tiles) runs the integer-weight mma.sync kernels */
    if (a.kernel == GEMM_KERNEL_WGMMA && a.m[0].bits == 4 && T != 16) {
        if (!gemm_wgmma_available())
            return cudaErrorInvalidValue;
        return launch_gemm_wgmma(a, n_tokens, grouped, T, s);
    }
    if (T != 16)
        return launch_gemm2d(a, n_tokens, grouped, T, a.kernel == GEMM_KERNEL_MMA_DQ && a.m[0].bits == 4, s);
    switch (a.m[0].bits) {
    case 4: return gemm_bits<4>(a, n_tokens, grouped, T, s);
    case 8: return gemm_bits<8>(a, n_tokens, grouped, T, s);
    case 16: return gemm_bits<16>(a, n_tokens, grouped, T, s);
    default: return cudaErrorInvalidValue;
    }
}
