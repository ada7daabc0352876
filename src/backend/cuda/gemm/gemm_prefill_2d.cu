/* gemm_prefill_2d.cu — the 2D-warp-tiled prefill tensor-core GEMM (64- and 128-token tiles where the wgmma
 * kernel does not run: 8-bit and bf16 weights, GPUs other than sm_90a) in two forms:
 *   DQ = false (GEMM_KERNEL_MMA): the same operands, math and results as gemm_kernel in gemm_prefill.cu
 *     (bit for bit: every output element sees the same four MMAs per group in the same order and the
 *     same fold), with less shared-memory traffic per MMA;
 *   DQ = true (GEMM_KERNEL_MMA_DQ, 4-bit weights; what GPUs from sm_80 to sm_89 and sm_120 run): the
 *     weights dequantized to fp16 in registers, w = s·q + b (load_a4_dq), so the MMAs accumulate straight
 *     into the fp32 outputs: no per-group fold (2 FMAs per accumulator per group), no group sums staged
 *     or read. Per 64-column group and warp the ALU work is the A dequantization (fixed per row) instead
 *     of dequantization + a fold per (row, token): at 128-token tiles about half the non-MMA instructions
 *     per MMA of the DQ = false form. The results are the wgmma kernel's up to summation order (weights
 *     rounded to fp16 once, relative 2^-11).
 *
 * gemm2d_kernel<BITS, WN, NTW, EPI, GROUPED, DQ>: 4·WN warps (WN = 2: 256 threads), a block owns 128
 * weight rows (SWIGLU: 64 gate rows + the same 64 up rows) x T = 8·WN·NTW tokens. The warps form a
 * 4 x WN grid: warp w owns rows 32·(w & 3) .. +31 (two m16 tiles) and tokens TW·(w >> 2) .. +TW-1,
 * TW = 8·NTW (NTW n8 tiles), so a dequantized A fragment feeds NTW MMAs and an activation (B) fragment
 * two; per group and warp the activation reads are TW x 128 B instead of T x 128 B (the one-warp-row
 * kernel: every warp reads all T rows). Instances: (WN 2, NTW 4) = 64 tokens, (2, 8) = 128 tokens. A
 * warp whose tokens all lie past the tile's count (ragged MoE tiles) skips its MMAs but
 * keeps loading and synchronizing.
 * Pipeline: one 64-column quantization group per step, 4 cp.async stages (bf16: 3) of [weights: the
 * group's 32/64/128 bytes of 128 rows | activations: T rows x 128 B, 16-byte chunks XOR-swizzled by
 * row | T group sums | fp32 scale and bias of the 128 rows]. The scales/biases are plain loads held in
 * a register one step and stored to the stage (no per-thread scale pointers or prefetch registers).
 * Per group and (row, token) the fp32 MMA sum folds as acc += s·Σqx + b·Σx, as in gemm_prefill.cu (DQ:
 * no fold and no group sums in the stage).
 * The B (activation) fragments need no ldmatrix: the gemm_act column permutation makes a thread's
 * fragments of a whole group two 16-byte chunks of its token row, so two LDS.128 per n8 tile and group
 * (conflict-free through the XOR swizzle) deliver what two ldmatrix.x4 would.
 */
#include "gemm_prefill_dev.cuh"

/* Blocks per SM promised to ptxas: 1 lets it use up to 255 registers, 2 caps them at 128 (the 128-token
 * instance then spills a little; -Xptxas -v). */
#ifndef GEMM2D_MIN_BLOCKS
#define GEMM2D_MIN_BLOCKS 1
#endif

template <int BITS, int WN, int NTW, bool DQ = false>
struct gemm2d_shape {
    static constexpr int NTHR = 128 * WN;          /* threads: 4 x WN warps */
    static constexpr int T = 8 * WN * NTW;         /* tokens per block */
    static constexpr int TW = 8 * NTW;             /* tokens per warp */
    static constexpr int STAGES = BITS == 16 ? 3 : 4;
    static constexpr int WB = 8 * BITS;            /* weight bytes per row per group */
    static constexpr int CPR = WB / 16;            /* 16-byte chunks per row per group */
    static constexpr int W_STAGE = GEMM_ROWS * WB;
    static constexpr int X_STAGE = T * 128;
    static constexpr int XS_STAGE = DQ ? 0 : T * 4;  /* group sums (the fold's Σx) */
    static constexpr int SB_STAGE = BITS < 16 ? 2 * GEMM_ROWS * 4 : 0; /* [scale[128] | bias[128]] fp32 */
    static constexpr int STAGE = W_STAGE + X_STAGE + XS_STAGE + SB_STAGE;
    static constexpr int SMEM = STAGES * STAGE;
    static constexpr int WCH = GEMM_ROWS * CPR;    /* weight chunks per stage */
    static constexpr int WPT = (WCH + NTHR - 1) / NTHR; /* per thread (the last round may be partial) */
    static constexpr int G_STRIDE = T + 4;         /* SWIGLU gate staging: floats per row */
};

template <int BITS, int WN, int NTW, int EPI, bool GROUPED, bool DQ>
__global__ void __launch_bounds__(128 * WN, WN == 2 ? GEMM2D_MIN_BLOCKS : 1) gemm2d_kernel(gemm_args a, int n_tokens)
{
    typedef gemm2d_shape<BITS, WN, NTW, DQ> S;
    constexpr int T = S::T, TW = S::TW, NS = S::STAGES;
    constexpr bool FOLD = BITS < 16 && !DQ; /* per-group fold of integer-weight MMA sums */
    static_assert(!DQ || BITS == 4, "the DQ form takes 4-bit weights");
    static_assert(S::STAGE % 16 == 0, "stage alignment");
    static_assert(T * 8 % S::NTHR == 0 && T <= S::NTHR && 2 * GEMM_ROWS <= S::NTHR, "thread roles");
    static_assert(S::SMEM >= 64 * S::G_STRIDE * 4, "SWIGLU epilogue needs 64 x (T + 4) floats");
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ int s_tok[T];
    __shared__ float s_scale[T];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tig = lane & 3;
    const int wm = warp & 3, wn = warp >> 2; /* rows 32wm .. 32wm+31, tokens TW·wn .. TW·wn+TW-1 */
    constexpr bool w_all = S::WPT * S::NTHR == S::WCH; /* every thread has WPT weight chunks */

    int e, base, count;
    if (!gemm_tile_rows<T, GROUPED>(a, n_tokens, e, base, count, s_tok, s_scale))
        return;
    const int cols = a.act.cols, n_groups = cols / 64;
    const bool active = wn * TW < count; /* warp-uniform */

    /* this thread's weight chunks (same rows every group) */
    const unsigned char *wsrc[S::WPT];
    int wdst[S::WPT];
    bool wok[S::WPT];
#pragma unroll
    for (int i = 0; i < S::WPT; i++) {
        const int q = tid + i * S::NTHR, part = q % S::CPR;
        const int br = w_all ? q / S::CPR : (q / S::CPR) & (GEMM_ROWS - 1);
        int mi, lr;
        wok[i] = gemm_row<EPI>(a, br, mi, lr); /* q >= WCH (partial last round): no copy at all */
        const dmat &m = a.m[mi];
        wsrc[i] = wok[i] ? m.data + ((int64_t)e * m.rows + lr) * m.row_bytes + part * 16
                         : reinterpret_cast<const unsigned char *>(a.act.x);
        wdst[i] = br * S::WB + (BITS == 16 ? (part ^ (br & 1)) : part) * 16;
    }
    /* thread tid < 256 stages the scale (tid < 128) or bias (tid >= 128) of block row tid & 127 */
    const bool sb_thread = S::NTHR == 2 * GEMM_ROWS || tid < 2 * GEMM_ROWS;
    const __nv_bfloat16 *sbp = NULL;
    if (BITS < 16 && sb_thread) {
        int mi, lr;
        if (gemm_row<EPI>(a, tid & (GEMM_ROWS - 1), mi, lr)) {
            const dmat &m = a.m[mi];
            sbp = (tid < GEMM_ROWS ? m.scales : m.biases) + ((int64_t)e * m.rows + lr) * n_groups;
        }
    }
    __syncthreads(); /* s_tok */

    auto load_stage = [&](int k, int st) {
        unsigned char *sw = smem + st * S::STAGE;
#pragma unroll
        for (int i = 0; i < S::WPT; i++)
            if (w_all || tid + i * S::NTHR < S::WCH)
                cp_async16(sw + wdst[i], wok[i] ? wsrc[i] + (size_t)k * S::WB : wsrc[i], wok[i]);
        unsigned char *sx = sw + S::W_STAGE;
#pragma unroll
        for (int i = 0; i < T * 8 / S::NTHR; i++) {
            const int q = tid + i * S::NTHR, r = q >> 3, c = q & 7;
            const __half *src = a.act.x + (size_t)s_tok[r] * cols + k * 64 + c * 8;
            cp_async16(sx + r * 128 + ((c ^ (r & 7)) * 16), src, r < count);
        }
        if (FOLD && tid < T)
            cp_async4(sx + S::X_STAGE + tid * 4, a.act.xs + (size_t)s_tok[tid] * n_groups + k, tid < count);
    };
    auto sb_slot = [&](int k) {
        return reinterpret_cast<float *>(smem + (k % NS) * S::STAGE + S::W_STAGE + S::X_STAGE + S::XS_STAGE);
    };

    float acc[2][NTW][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NTW; nt++)
            acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
#pragma unroll
    for (int st = 0; st < NS - 1; st++) {
        if (st < n_groups)
            load_stage(st, st);
        cp_async_commit();
    }
    /* scale/bias of group k is stored to its stage at step k - (NS - 2) (groups 0..NS-3: here), after
     * the barrier that frees the slot (its previous group, k - NS, was read at step k - NS) and at
     * least one barrier before step k reads it; sbv carries the next group's raw value one step */
    __nv_bfloat16 sbv = __float2bfloat16(0.0f);
    if (BITS < 16 && sb_thread) {
#pragma unroll
        for (int k = 0; k < NS - 2; k++)
            if (k < n_groups)
                sb_slot(k)[tid] = sbp ? bf2f(sbp[k]) : 0.0f;
        if (sbp && NS - 2 < n_groups)
            sbv = sbp[NS - 2];
    }

    for (int k = 0; k < n_groups; k++) {
        cp_async_wait<NS - 2>();
        __syncthreads();
        {
            const int kn = k + NS - 1;
            if (kn < n_groups)
                load_stage(kn, kn % NS);
            cp_async_commit();
        }
        if (BITS < 16 && sb_thread) {
            const int ks = k + NS - 2;
            if (ks < n_groups) {
                sb_slot(ks)[tid] = sbp ? bf2f(sbv) : 0.0f;
                if (sbp && ks + 1 < n_groups)
                    sbv = sbp[ks + 1];
            }
        }
        if (!active)
            continue;
        const unsigned char *sw = smem + (k % NS) * S::STAGE;
        const unsigned char *sx = sw + S::W_STAGE;
        const float *sxs = reinterpret_cast<const float *>(sx + S::X_STAGE);
        const float *ssb = reinterpret_cast<const float *>(sx + S::X_STAGE + S::XS_STAGE);
        uint32_t A[2][4][4];
        float sc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}}, bi[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
            const int r0 = wm * 32 + mt * 16 + g;
            if (DQ) {
                load_a4_dq(sw, r0, tig, __float2half2_rn(ssb[r0]), __float2half2_rn(ssb[GEMM_ROWS + r0]),
                           __float2half2_rn(ssb[r0 + 8]), __float2half2_rn(ssb[GEMM_ROWS + r0 + 8]), A[mt]);
                continue;
            }
            load_a<BITS>(sw, r0, tig, A[mt]);
            if (FOLD)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    sc[mt][h] = ssb[r0 + 8 * h];
                    bi[mt][h] = ssb[GEMM_ROWS + r0 + 8 * h];
                }
        }
#pragma unroll
        for (int nt = 0; nt < NTW; nt++) {
            const int r = wn * TW + nt * 8 + g; /* r & 7 == g: the row's chunk swizzle key */
            const uint4 b0 = *reinterpret_cast<const uint4 *>(sx + r * 128 + (((2 * tig) ^ g) * 16));
            const uint4 b1 = *reinterpret_cast<const uint4 *>(sx + r * 128 + (((2 * tig + 1) ^ g) * 16));
            float2 xs = make_float2(0.0f, 0.0f);
            if (FOLD)
                xs = *reinterpret_cast<const float2 *>(sxs + wn * TW + nt * 8 + tig * 2);
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                float c4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                float(&d)[4] = FOLD ? c4 : acc[mt][nt];
                mma16816(d, A[mt][0], b0.x, b0.y);
                mma16816(d, A[mt][1], b0.z, b0.w);
                mma16816(d, A[mt][2], b1.x, b1.y);
                mma16816(d, A[mt][3], b1.z, b1.w);
                if (FOLD) {
                    acc[mt][nt][0] = fmaf(sc[mt][0], c4[0], fmaf(bi[mt][0], xs.x, acc[mt][nt][0]));
                    acc[mt][nt][1] = fmaf(sc[mt][0], c4[1], fmaf(bi[mt][0], xs.y, acc[mt][nt][1]));
                    acc[mt][nt][2] = fmaf(sc[mt][1], c4[2], fmaf(bi[mt][1], xs.x, acc[mt][nt][2]));
                    acc[mt][nt][3] = fmaf(sc[mt][1], c4[3], fmaf(bi[mt][1], xs.y, acc[mt][nt][3]));
                }
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads(); /* pipeline buffers free: the SWIGLU epilogue reuses them */

    if constexpr (gemm_swiglu(EPI)) {
        float *s_g = reinterpret_cast<float *>(smem); /* [64][G_STRIDE] gate values */
        if (wm < 2)
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < NTW; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int br = wm * 32 + mt * 16 + g + 8 * (i >> 1), tok = wn * TW + nt * 8 + tig * 2 + (i & 1);
                        s_g[br * S::G_STRIDE + tok] = acc[mt][nt][i];
                    }
        __syncthreads();
        if (wm >= 2) {
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int rl = (wm - 2) * 32 + mt * 16 + g + 8 * h; /* the gate row's block row */
                    const int lr = blockIdx.x * 64 + rl;
                    if (lr >= a.m[0].rows)
                        continue;
#pragma unroll
                    for (int nt = 0; nt < NTW; nt++)
#pragma unroll
                        for (int j = 0; j < 2; j++) {
                            const int tok = wn * TW + nt * 8 + tig * 2 + j;
                            if (tok < count) {
                                const float gv = s_g[rl * S::G_STRIDE + tok] * s_scale[tok];
                                const float uv = acc[mt][nt][2 * h + j] * s_scale[tok];
                                a.y[0][(size_t)(base + tok) * a.y_stride[0] + lr] = silu_f(gv) * uv;
                            }
                        }
                }
        }
    } else {
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int mi, lr;
                if (!gemm_row<EPI>(a, wm * 32 + mt * 16 + g + 8 * h, mi, lr))
                    continue;
                float *y = a.y[mi];
                const int ys = a.y_stride[mi];
#pragma unroll
                for (int nt = 0; nt < NTW; nt++)
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        const int tok = wn * TW + nt * 8 + tig * 2 + j;
                        if (tok < count)
                            gemm_store<EPI>(y, (size_t)(base + tok) * ys + lr, acc[mt][nt][2 * h + j] * s_scale[tok]);
                    }
            }
    }
}

/* ---- dispatch ---------------------------------------------------------------------------------------- */

template <int BITS, int WN, int NTW, int EPI, bool GROUPED, bool DQ>
static cudaError_t gemm2d_go(const gemm_args &a, int n_tokens, cudaStream_t s)
{
    typedef gemm2d_shape<BITS, WN, NTW, DQ> S;
    static size_t smem_set = 48 * 1024; /* opted in once per instance */
    dim3 grid;
    cudaError_t e = cuda_smem_opt_in(gemm2d_kernel<BITS, WN, NTW, EPI, GROUPED, DQ>, S::SMEM, &smem_set);
    if (e == cudaSuccess)
        e = gemm_grid(a, n_tokens, GROUPED, S::T, EPI, &grid);
    if (e != cudaSuccess)
        return e;
    gemm2d_kernel<BITS, WN, NTW, EPI, GROUPED, DQ><<<grid, S::NTHR, S::SMEM, s>>>(a, n_tokens);
    return cudaGetLastError();
}

template <int BITS, int WN, int NTW, bool DQ>
static cudaError_t gemm2d_epi(const gemm_args &a, int n_tokens, bool grouped, cudaStream_t s)
{
    if (grouped) {
        if (a.epi == GEMM_EPI_STORE) return gemm2d_go<BITS, WN, NTW, GEMM_EPI_STORE, true, DQ>(a, n_tokens, s);
        if (a.epi == GEMM_EPI_SWIGLU) return gemm2d_go<BITS, WN, NTW, GEMM_EPI_SWIGLU, true, DQ>(a, n_tokens, s);
        return cudaErrorInvalidValue;
    }
    if (a.epi == GEMM_EPI_STORE) return gemm2d_go<BITS, WN, NTW, GEMM_EPI_STORE, false, DQ>(a, n_tokens, s);
    if (a.epi == GEMM_EPI_ADD) return gemm2d_go<BITS, WN, NTW, GEMM_EPI_ADD, false, DQ>(a, n_tokens, s);
    if (a.epi == GEMM_EPI_SWIGLU) return gemm2d_go<BITS, WN, NTW, GEMM_EPI_SWIGLU, false, DQ>(a, n_tokens, s);
    return cudaErrorInvalidValue;
}

template <int BITS, bool DQ = false>
static cudaError_t gemm2d_bits(const gemm_args &a, int n_tokens, bool grouped, int T, cudaStream_t s)
{
    if (T == 64)
        return gemm2d_epi<BITS, 2, 4, DQ>(a, n_tokens, grouped, s);
    if (T == 128)
        return gemm2d_epi<BITS, 2, 8, DQ>(a, n_tokens, grouped, s);
    return cudaErrorInvalidValue;
}

cudaError_t launch_gemm2d(const gemm_args &a, int n_tokens, bool grouped, int T, bool dq, cudaStream_t s)
{
    if (dq)
        return a.m[0].bits == 4 ? gemm2d_bits<4, true>(a, n_tokens, grouped, T, s) : cudaErrorInvalidValue;
    switch (a.m[0].bits) {
    case 4: return gemm2d_bits<4>(a, n_tokens, grouped, T, s);
    case 8: return gemm2d_bits<8>(a, n_tokens, grouped, T, s);
    case 16: return gemm2d_bits<16>(a, n_tokens, grouped, T, s);
    default: return cudaErrorInvalidValue;
    }
}
