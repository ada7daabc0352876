/* deltanet_chunked.cu — the Gated DeltaNet delta rule of a prefill chunk in its chunked (WY / UT
 * transform) form on tensor cores: same inputs (the scratch `pre` of gdn_prep_kernel), outputs and final
 * state as gdn_recur_kernel (deltanet_prefill.cu), the math of docs/MODEL.md §4.4 step 8 (transformers'
 * torch_chunk_gated_delta_rule, chunk C = 64; the CPU twin is cpu_gdn_delta_rule_chunked). Two kernels
 * after gdn_prep_kernel:
 *
 *  gdn_wy_kernel: per (chunk, value head j), all chunks in parallel. γ_i = Σ_{s<=i} g_s within the chunk
 *    (double: D_ij = exp(γ_i - γ_j) stays exact where it matters even when γ is large and a decay
 *    underflows to 0), then on tensor cores K Kᵀ and Q Kᵀ (lower 16x16 blocks only), A = β_i (k_i·k_j) D_ij
 *    (strictly lower) into shared memory, Attn = (Q Kᵀ) ⊙ D (diagonal included) out; T = (I + A)⁻¹ by
 *    forward substitution (thread = (column, rows ≡ sub mod 4), registers, one shuffle per row, no
 *    barrier); W = T (β ⊙ exp(γ) ⊙ K) and U = T (β ⊙ V) on tensor cores out; exp(γ_i) and
 *    exp(γ_63 - γ_i) out. Rows past the end of the last chunk are zero (q, k, v, β) with g = 0, so W, U,
 *    Attn rows are 0 there and γ_63 = γ of the last real row: every chunk is computed as a full 64.
 *    One record per (chunk, j) in the scratch `wy` (gdn_chunked_record_floats):
 *      W [64][dk] | U [64][dv] | Attn [64][64] (blocks above the 16x16 diagonal unspecified) | eg [64] | ed [64]
 *    grid (chunks, Hv), 256 threads, 87 KB shared (dk = dv = 128): two blocks per SM.
 *
 *  gdn_chunk_state_kernel: the sequential part. Block = (value head j, 32 columns of S): the columns of
 *    S evolve independently. S (dk x 32, fp32) stays in the accumulators of warps w < dk/16 (rows
 *    16w..16w+15) and is mirrored into shared memory as the B operand. Per chunk:
 *      P1  warps 0-3: WS = W S (16 rows each), V' = U - WS into shared memory;
 *          warps 4-7: QS = Q S, rows scaled by exp(γ_i);
 *      P3  warps 4-7: O = QS + Attn V' (lower blocks only), written for the chunk's real rows;
 *          warps w < dk/16: S <- exp(γ_63) S + (exp(γ_63 - γ) ⊙ K)ᵀ V'.
 *    S and V' live in shared memory split into tf32 hi/lo parts; the next chunk's W and Q (single
 *    buffers) are issued once P1 is done, eg/ed double-buffered; K and Attn are issued at the top and
 *    needed only in P3. grid Hv·dv/32 (128 blocks for the full model), 256 threads.
 *
 * Precision: every product on tensor cores is 3xTF32 (a = a_hi + a_lo, b likewise: hi rounded to nearest,
 * lo the truncated rest; d += a_lo b_hi + a_hi b_lo + a_hi b_hi, fp32 accumulation), about fp32 accuracy:
 * plain tf32 (or fp16) rounds k and V' to 11 bits; in a CPU emulation of these kernels single-pass tf32
 * missed test_cuda_gdn_prefill's state bound (1e-4 absolute) by 2-6x, 3xTF32 stayed under 0.5% of it.
 * The forward substitution, γ scan and gates are fp32/double SIMT.
 *
 * Both kernels split an operand with one add and two masks (split_tf32), and keep T, S and V' split once
 * into hi/lo arrays in shared memory (docs/BENCHMARKS.md has the measurements behind this form
 * and the forms tried and removed).
 *
 * mma.sync m16n8k8 tf32 fragments (PTX ISA), g = lane / 4, t = lane % 4:
 *   A (16x8, row): a0 = (g, t), a1 = (g+8, t), a2 = (g, t+4), a3 = (g+8, t+4)
 *   B (8x8, col):  b0 = (k t, n g), b1 = (k t+4, n g)
 *   C (16x8):      c0 = (g, 2t), c1 = (g, 2t+1), c2 = (g+8, 2t), c3 = (g+8, 2t+1)
 */
#include "deltanet_chunked.cuh"

int gdn_chunked_record_floats(int dk, int dv) { return record_floats(dk, dv); }

size_t gdn_chunked_scratch_floats(int max_tokens, int Hv, int dk, int dv)
{
    const size_t chunks = ((size_t)max_tokens + GDC_C - 1) / GDC_C;
    return chunks * (size_t)Hv * (size_t)record_floats(dk, dv);
}

bool gdn_chunked_supported(const gdn_args &a)
{
    return gdn_prefill_supported(a) && (a.dk == 32 || a.dk == 64 || a.dk == 128) && a.dv % GDC_COLS == 0 &&
           a.dv <= 128;
}

/* ---- kernel 1: the intra-chunk matrices ---------------------------------------------------------- */

/* the lo parts of T ([C][ALD]) follow A/T */
template <int DK> static size_t wy_smem_bytes(int dv)
{
    const int qv = DK + 4 > dv + 8 ? DK + 4 : dv + 8;
    return GDC_C * sizeof(double) + 2 * GDC_C * sizeof(float) + (size_t)GDC_C * ((DK + 4) + qv + 2 * GDC_ALD) * sizeof(float);
}

template <int DK>
__global__ void __launch_bounds__(GDC_THREADS, 2) gdn_wy_kernel(gdn_args a, const float *__restrict__ pre,
                                                                  int pre_stride, float *__restrict__ wy, int n)
{
    constexpr int KLD = DK + 4; /* k and q rows (≡ 4 mod 32) */
    constexpr int C = GDC_C;
    extern __shared__ __align__(16) unsigned char gdc_smem[];
    const int dv = a.dv, VLD = dv + 8, QV = KLD > VLD ? KLD : VLD;
    double *s_gam = reinterpret_cast<double *>(gdc_smem); /* [C] γ */
    float *s_beta = reinterpret_cast<float *>(s_gam + C); /* [C] β */
    float *s_sk = s_beta + C;                             /* [C] β exp(γ) */
    float *s_k = s_sk + C;                                /* [C][KLD] */
    float *s_q = s_k + C * KLD;                           /* [C][KLD] q, later v [C][VLD] */
    float *s_v = s_q;
    float *s_a = s_q + C * QV; /* [C][ALD] A, then T's tf32 hi parts */
    uint32_t *s_alo = reinterpret_cast<uint32_t *>(s_a + C * GDC_ALD); /* [C][ALD] T's lo parts */

    const int ch = blockIdx.x, j = blockIdx.y, t0 = ch * C, L = min(C, n - t0);
    const int kh = j / (a.Hv / a.Hk), key_dim = a.Hk * DK;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    float *rec = wy + ((size_t)ch * a.Hv + j) * record_floats(DK, dv);
    float *rW = rec, *rU = rec + C * DK, *rAttn = rU + C * dv, *rEg = rAttn + C * C, *rEd = rEg + C;

    pdl_trigger(); /* the state kernel may launch: it waits for this grid before reading wy */
    pdl_wait();    /* pre comes from gdn_prep_kernel */

    /* q and k of key head kh, rows past the chunk's end zero-filled (pre holds stale rows there) */
    constexpr int R4 = DK / 4;
    for (int idx = tid; idx < 2 * C * R4; idx += GDC_THREADS) {
        const int which = idx / (C * R4), rem = idx - which * (C * R4), r = rem / R4, c4 = rem - r * R4;
        const bool live = r < L;
        const float *src = pre + (size_t)(t0 + (live ? r : 0)) * pre_stride + (which ? key_dim : 0) + kh * DK + 4 * c4;
        cp_async16((which ? s_k : s_q) + r * KLD + 4 * c4, src, live ? 16 : 0);
    }
    cp_async_commit();
    if (warp == 0) {
        /* gates of tokens lane and lane + 32; inclusive scan of g in double */
        double gv[2];
        float bv[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = lane + 32 * h;
            float4 gr = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < L)
                gr = *reinterpret_cast<const float4 *>(pre + (size_t)(t0 + r) * pre_stride + a.conv_dim + 4 * j);
            bv[h] = gr.x;
            gv[h] = (double)gr.w; /* g = log decay (gdn_prep_kernel) */
        }
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const double u0 = __shfl_up_sync(0xffffffffu, gv[0], o), u1 = __shfl_up_sync(0xffffffffu, gv[1], o);
            if (lane >= o) {
                gv[0] += u0;
                gv[1] += u1;
            }
        }
        gv[1] += __shfl_sync(0xffffffffu, gv[0], 31);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = lane + 32 * h;
            s_gam[r] = gv[h];
            s_beta[r] = bv[h];
            s_sk[r] = bv[h] * expf((float)gv[h]);
        }
    }
    cp_async_wait<0>();
    __syncthreads();

    /* K Kᵀ -> A (shared), Q Kᵀ -> Attn (global): 2 x 10 lower 16x16 blocks over 8 warps */
    for (int task = warp; task < 20; task += GDC_THREADS / 32) {
        const int mat = task / 10; /* 0: K Kᵀ, 1: Q Kᵀ */
        int b = task - mat * 10, mi = 0;
        while (b > mi) {
            b -= mi + 1;
            mi++;
        }
        const int nj = b;
        const float *arow = (mat ? s_q : s_k) + 16 * mi * KLD;
        float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll 4
        for (int ks = 0; ks < DK / 8; ks++) {
            frag_a fa;
            load_a(fa, arow + 8 * ks, KLD, g, t);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                /* B[k = feature][n = token 16nj + 8h + g] = k_n[feature] */
                const float *kp = s_k + (16 * nj + 8 * h + g) * KLD + 8 * ks;
                frag_b fb;
                set_b(fb, kp[t], kp[t + 4]);
                mma3(acc[h], fa, fb);
            }
        }
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int e2 = 0; e2 < 2; e2++) {
                const int i = 16 * mi + g + 8 * e2, c = 16 * nj + 8 * h + 2 * t;
                float v[2];
#pragma unroll
                for (int e1 = 0; e1 < 2; e1++) {
                    const int jj = c + e1;
                    const bool keep = mat ? jj <= i : jj < i;
                    v[e1] = keep ? acc[h][2 * e2 + e1] * expf((float)(s_gam[i] - s_gam[jj])) : 0.0f;
                }
                if (mat) {
                    *reinterpret_cast<float2 *>(rAttn + i * C + c) = make_float2(v[0], v[1]);
                } else {
                    s_a[i * GDC_ALD + c] = s_beta[i] * v[0];
                    s_a[i * GDC_ALD + c + 1] = s_beta[i] * v[1];
                }
            }
    }
    __syncthreads(); /* A complete; q no longer needed: v may land in its place */

    {
        const int V4 = dv / 4;
        for (int idx = tid; idx < C * V4; idx += GDC_THREADS) {
            const int r = idx / V4, c4 = idx - r * V4;
            const bool live = r < L;
            const float *src = pre + (size_t)(t0 + (live ? r : 0)) * pre_stride + 2 * key_dim + (size_t)j * dv + 4 * c4;
            cp_async16(s_v + r * VLD + 4 * c4, src, live ? 16 : 0);
        }
        cp_async_commit();
    }

    /* T = (I + A)⁻¹: column col = tid / 4 solved by 4 threads (rows ≡ sub mod 4), right-looking:
     * after step m, x_m is final and x_i -= A[i][m] x_m for the rows below. A is zero on and above the
     * diagonal (within the diagonal blocks; blocks above are never read), so no guards are needed. */
    {
        const int col = tid >> 2, sub = tid & 3;
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; r++)
            x[r] = 4 * r + sub == col ? 1.0f : 0.0f;
#pragma unroll
        for (int mg = 0; mg < 16; mg++) {
            float4 av[16];
#pragma unroll
            for (int r = mg; r < 16; r++)
                av[r] = *reinterpret_cast<const float4 *>(s_a + (4 * r + sub) * GDC_ALD + 4 * mg);
#pragma unroll
            for (int mm = 0; mm < 4; mm++) {
                const float xm = __shfl_sync(0xffffffffu, x[mg], (lane & ~3) | mm);
#pragma unroll
                for (int r = mg; r < 16; r++) {
                    const float am = mm == 0 ? av[r].x : mm == 1 ? av[r].y : mm == 2 ? av[r].z : av[r].w;
                    x[r] = fmaf(-am, xm, x[r]);
                }
            }
        }
        __syncthreads(); /* everyone is done reading A */
#pragma unroll
        for (int r = 0; r < 16; r++) {
            store_split(reinterpret_cast<uint32_t *>(s_a), s_alo, (4 * r + sub) * GDC_ALD + col, x[r]);
        }
    }
    if (tid < C) {
        rEg[tid] = expf((float)s_gam[tid]);
        rEd[tid] = expf((float)(s_gam[C - 1] - s_gam[tid]));
    }
    cp_async_wait<0>();
    __syncthreads(); /* T and v in place */

    /* W = T (β exp(γ) ⊙ K) | U = T (β ⊙ V): n-tiles of 8 columns over the concatenation [dk | dv] */
    const int NT = (DK + dv) / 8;
    { /* warp's n-tiles warp + 8i (i < 4: NT <= 32) at once, each T fragment loaded once */
        constexpr int NW = GDC_THREADS / 32;
        const uint32_t *th = reinterpret_cast<const uint32_t *>(s_a);
        float acc[4][4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc[i][mi][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < C / 8; ks++) {
            const int m0 = 8 * ks + t;
            frag_b fb[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int nt = warp + NW * i;
                if (nt < NT) {
                    const bool isk = nt < DK / 8;
                    const float *bp = isk ? s_k + 8 * nt : s_v + 8 * (nt - DK / 8);
                    const int bld = isk ? KLD : VLD;
                    const float *scale = isk ? s_sk : s_beta;
                    set_b(fb[i], bp[m0 * bld + g] * scale[m0], bp[(m0 + 4) * bld + g] * scale[m0 + 4]);
                }
            }
#pragma unroll
            for (int mi = ks / 2; mi < 4; mi++) { /* T[i][m] = 0 for m > i */
                frag_a fa;
                const int o = (16 * mi + g) * GDC_ALD + 8 * ks + t;
                fa.h[0] = th[o], fa.h[1] = th[o + 8 * GDC_ALD], fa.h[2] = th[o + 4], fa.h[3] = th[o + 8 * GDC_ALD + 4];
                fa.l[0] = s_alo[o], fa.l[1] = s_alo[o + 8 * GDC_ALD], fa.l[2] = s_alo[o + 4], fa.l[3] = s_alo[o + 8 * GDC_ALD + 4];
#pragma unroll
                for (int i = 0; i < 4; i++)
                    if (warp + NW * i < NT)
                        mma3(acc[i][mi], fa, fb[i]);
            }
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int nt = warp + NW * i;
            if (nt < NT) {
                const bool isk = nt < DK / 8;
                float *dst = isk ? rW + 8 * nt : rU + 8 * (nt - DK / 8);
                const int dld = isk ? DK : dv;
#pragma unroll
                for (int mi = 0; mi < 4; mi++) {
                    const int r = 16 * mi + g;
                    *reinterpret_cast<float2 *>(dst + r * dld + 2 * t) = make_float2(acc[i][mi][0], acc[i][mi][1]);
                    *reinterpret_cast<float2 *>(dst + (r + 8) * dld + 2 * t) = make_float2(acc[i][mi][2], acc[i][mi][3]);
                }
            }
        }
    }
}

/* ---- kernel 2: the inter-chunk recurrence ------------------------------------------------------- */

/* S and V' are kept in shared memory already split into tf32 hi/lo parts (split once by the writer
 * instead of by each of the 8 reading warps), the A operands are split by split_tf32, and
 * W and Q are single-buffered: the next chunk's W, Q are issued once this chunk's P1 is done (they are
 * read only in P1), which frees the shared memory for S and V'. */
template <int DK> static constexpr size_t state_smem_bytes()
{
    return sizeof(float) * ((size_t)2 * GDC_C * (DK + 4)   /* W, Q */
                            + (size_t)GDC_C * (DK + 8)      /* K */
                            + (size_t)GDC_C * GDC_ALD       /* Attn */
                            + (size_t)2 * DK * GDC_VLD      /* S hi, lo */
                            + (size_t)2 * GDC_C * GDC_VLD   /* V' hi, lo */
                            + (size_t)2 * 2 * GDC_C);       /* eg, ed double-buffered */
}

template <int DK>
__global__ void __launch_bounds__(GDC_THREADS, 1) gdn_chunk_state_kernel(gdn_args a, const float *__restrict__ pre,
                                                                          int pre_stride,
                                                                          const float *__restrict__ wy, int n)
{
    constexpr int C = GDC_C, WLD = DK + 4, KTLD = DK + 8, SW = DK / 16, VLD = GDC_VLD;
    extern __shared__ __align__(16) unsigned char gdc_smem[];
    float *s_w = reinterpret_cast<float *>(gdc_smem);                /* [C][WLD] */
    float *s_q = s_w + C * WLD;                                       /* [C][WLD] */
    float *s_k = s_q + C * WLD;                                       /* [C][KTLD] */
    float *s_at = s_k + C * KTLD;                                     /* [C][ALD] */
    uint32_t *s_sh = reinterpret_cast<uint32_t *>(s_at + C * GDC_ALD); /* [DK][VLD] */
    uint32_t *s_sl = s_sh + DK * VLD;                                 /* [DK][VLD] */
    uint32_t *s_vh = s_sl + DK * VLD;                                 /* [C][VLD] */
    uint32_t *s_vl = s_vh + C * VLD;                                  /* [C][VLD] */
    float *s_eg = reinterpret_cast<float *>(s_vl + C * VLD);          /* [2][C] */
    float *s_ed = s_eg + 2 * C;                                       /* [2][C] */

    const int dv = a.dv, slices = dv / GDC_COLS;
    const int j = blockIdx.x / slices, c0 = (blockIdx.x % slices) * GDC_COLS;
    const int kh = j / (a.Hv / a.Hk), key_dim = a.Hk * DK;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int rec_floats = record_floats(DK, dv), n_chunks = (n + C - 1) / C;
    const int mat = warp >> 2, mi = warp & 3; /* P1/P3 roles: mat 0 W S -> V', mat 1 Q S -> O */

    float sacc[4][4];
    float *st = a.state + (size_t)j * DK * dv + c0;
    if (warp < SW) {
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
            const float2 lo = *reinterpret_cast<const float2 *>(st + (size_t)(16 * warp + g) * dv + 8 * ni + 2 * t);
            const float2 hi = *reinterpret_cast<const float2 *>(st + (size_t)(16 * warp + g + 8) * dv + 8 * ni + 2 * t);
            sacc[ni][0] = lo.x, sacc[ni][1] = lo.y, sacc[ni][2] = hi.x, sacc[ni][3] = hi.y;
        }
    }
    pdl_trigger();
    pdl_wait();

    auto store_s = [&]() {
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
            const int o = (16 * warp + g) * VLD + 8 * ni + 2 * t;
            store_split(s_sh, s_sl, o, sacc[ni][0]);
            store_split(s_sh, s_sl, o + 1, sacc[ni][1]);
            store_split(s_sh, s_sl, o + 8 * VLD, sacc[ni][2]);
            store_split(s_sh, s_sl, o + 8 * VLD + 1, sacc[ni][3]);
        }
    };
    if (warp < SW)
        store_s();

    constexpr int R4 = DK / 4;
    auto stage_wq = [&](int ch, int b) {
        const float *rec = wy + ((size_t)ch * a.Hv + j) * rec_floats;
        const int t0 = ch * C, L = min(C, n - t0);
        for (int idx = tid; idx < 2 * C * R4 + C / 2; idx += GDC_THREADS) {
            if (idx < C * R4) {
                const int r = idx / R4, c4 = idx - r * R4;
                cp_async16(s_w + r * WLD + 4 * c4, rec + r * DK + 4 * c4, 16);
            } else if (idx < 2 * C * R4) {
                const int i2 = idx - C * R4, r = i2 / R4, c4 = i2 - r * R4;
                const bool live = r < L;
                cp_async16(s_q + r * WLD + 4 * c4, pre + (size_t)(t0 + (live ? r : 0)) * pre_stride + kh * DK + 4 * c4,
                           live ? 16 : 0);
            } else {
                const int i2 = idx - 2 * C * R4;
                const int which = i2 / (C / 4), c4 = i2 - which * (C / 4);
                cp_async16((which ? s_ed : s_eg) + b * C + 4 * c4, rec + C * (DK + dv) + C * C + which * C + 4 * c4, 16);
            }
        }
    };
    auto stage_ka = [&](int ch) {
        const float *rec = wy + ((size_t)ch * a.Hv + j) * rec_floats;
        const int t0 = ch * C, L = min(C, n - t0);
        for (int idx = tid; idx < C * R4 + C * C / 4; idx += GDC_THREADS) {
            if (idx < C * R4) {
                const int r = idx / R4, c4 = idx - r * R4;
                const bool live = r < L;
                cp_async16(s_k + r * KTLD + 4 * c4, pre + (size_t)(t0 + (live ? r : 0)) * pre_stride + key_dim + kh * DK + 4 * c4,
                           live ? 16 : 0);
            } else {
                const int i2 = idx - C * R4, r = i2 / (C / 4), c4 = i2 - r * (C / 4);
                cp_async16(s_at + r * GDC_ALD + 4 * c4, rec + C * (DK + dv) + r * C + 4 * c4, 16);
            }
        }
    };

    stage_wq(0, 0);
    cp_async_commit();
    const size_t out_stride = (size_t)a.Hv * dv;
    for (int ch = 0; ch < n_chunks; ch++) {
        const int b = ch & 1, t0 = ch * C;
        stage_ka(ch);
        cp_async_commit();
        float2 u[4][2];
        if (mat == 0) {
            const float *rU = wy + ((size_t)ch * a.Hv + j) * rec_floats + C * DK + c0;
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                u[ni][0] = *reinterpret_cast<const float2 *>(rU + (16 * mi + g) * dv + 8 * ni + 2 * t);
                u[ni][1] = *reinterpret_cast<const float2 *>(rU + (16 * mi + g + 8) * dv + 8 * ni + 2 * t);
            }
        }
        cp_async_wait<1>(); /* W, q, eg/ed of this chunk (k, Attn may still fly) */
        __syncthreads();    /* ... for everyone; S in shared memory */

        float acc[4][4];
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[ni][e] = 0.0f;
        {
            const float *ap = (mat ? s_q : s_w) + 16 * mi * WLD;
#pragma unroll 4
            for (int ks = 0; ks < DK / 8; ks++) {
                frag_a fa;
                load_a(fa, ap + 8 * ks, WLD, g, t);
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    frag_b fb;
                    load_b_split(fb, s_sh + 8 * ks * VLD + 8 * ni, s_sl + 8 * ks * VLD + 8 * ni, VLD, g, t);
                    mma3(acc[ni], fa, fb);
                }
            }
        }
        if (mat == 0) {
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                const int o = (16 * mi + g) * VLD + 8 * ni + 2 * t;
                store_split(s_vh, s_vl, o, u[ni][0].x - acc[ni][0]);
                store_split(s_vh, s_vl, o + 1, u[ni][0].y - acc[ni][1]);
                store_split(s_vh, s_vl, o + 8 * VLD, u[ni][1].x - acc[ni][2]);
                store_split(s_vh, s_vl, o + 8 * VLD + 1, u[ni][1].y - acc[ni][3]);
            }
        } else {
            const float e0 = s_eg[b * C + 16 * mi + g], e1 = s_eg[b * C + 16 * mi + g + 8];
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                acc[ni][0] *= e0, acc[ni][1] *= e0, acc[ni][2] *= e1, acc[ni][3] *= e1;
            }
        }
        cp_async_wait<0>(); /* k, Attn of this chunk */
        __syncthreads();    /* ... for everyone; V' complete; W, q free */
        if (ch + 1 < n_chunks)
            stage_wq(ch + 1, b ^ 1);
        cp_async_commit(); /* possibly empty: keeps the group count uniform */

        if (mat == 1) {
#pragma unroll
            for (int ks = 0; ks < 8; ks++) {
                if (ks < 2 * mi + 2) {
                    frag_a fa;
                    load_a(fa, s_at + 16 * mi * GDC_ALD + 8 * ks, GDC_ALD, g, t);
#pragma unroll
                    for (int ni = 0; ni < 4; ni++) {
                        frag_b fb;
                        load_b_split(fb, s_vh + 8 * ks * VLD + 8 * ni, s_vl + 8 * ks * VLD + 8 * ni, VLD, g, t);
                        mma3(acc[ni], fa, fb);
                    }
                }
            }
            const int r0 = 16 * mi + g;
            float *o = a.out + (size_t)j * dv + c0 + 2 * t;
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                if (t0 + r0 < n)
                    *reinterpret_cast<float2 *>(o + (size_t)(t0 + r0) * out_stride + 8 * ni) = make_float2(acc[ni][0], acc[ni][1]);
                if (t0 + r0 + 8 < n)
                    *reinterpret_cast<float2 *>(o + (size_t)(t0 + r0 + 8) * out_stride + 8 * ni) = make_float2(acc[ni][2], acc[ni][3]);
            }
        }
        if (warp < SW) {
            const float el = s_eg[b * C + C - 1];
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    sacc[ni][e] *= el;
            const float *kp = s_k + 16 * warp + g;
#pragma unroll
            for (int ks = 0; ks < 8; ks++) {
                const int m0 = 8 * ks + t;
                const float d0 = s_ed[b * C + m0], d1 = s_ed[b * C + m0 + 4];
                frag_a fa;
                set_a(fa, kp[m0 * KTLD] * d0, kp[m0 * KTLD + 8] * d0, kp[(m0 + 4) * KTLD] * d1, kp[(m0 + 4) * KTLD + 8] * d1);
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    frag_b fb;
                    load_b_split(fb, s_vh + 8 * ks * VLD + 8 * ni, s_vl + 8 * ks * VLD + 8 * ni, VLD, g, t);
                    mma3(sacc[ni], fa, fb);
                }
            }
            store_s(); /* S in shared memory was last read in P1 */
        }
        __syncthreads(); /* k, Attn, V' free; S complete */
    }
    cp_async_wait<0>();
    if (warp < SW) {
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
            *reinterpret_cast<float2 *>(st + (size_t)(16 * warp + g) * dv + 8 * ni + 2 * t) = make_float2(sacc[ni][0], sacc[ni][1]);
            *reinterpret_cast<float2 *>(st + (size_t)(16 * warp + g + 8) * dv + 8 * ni + 2 * t) = make_float2(sacc[ni][2], sacc[ni][3]);
        }
    }
}

/* ---- launch ------------------------------------------------------------------------------------------ */

template <int DK> static cudaError_t gdc_launch(const gdn_args &a, float *pre, int stride, float *wy, int n, cudaStream_t s)
{
    const size_t wsm = wy_smem_bytes<DK>(a.dv), ssm = state_smem_bytes<DK>();
    auto wyk = gdn_wy_kernel<DK>;
    auto stk = gdn_chunk_state_kernel<DK>;
    /* per call (host-side, cheap): the attribute belongs to the current device's context */
    cudaError_t e = cudaFuncSetAttribute(wyk, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)wsm);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(stk, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ssm);
    if (e != cudaSuccess)
        return e;
    const int chunks = (n + GDC_C - 1) / GDC_C;
    e = launch_pdl(wyk, dim3(chunks, a.Hv), dim3(GDC_THREADS), wsm, s, a, (const float *)pre, stride, wy, n);
    if (e != cudaSuccess)
        return e;
    return launch_pdl(stk, dim3(a.Hv * (a.dv / GDC_COLS)), dim3(GDC_THREADS), ssm, s, a, (const float *)pre, stride,
                      (const float *)wy, n);
}

cudaError_t launch_gdn_prefill_chunked(const gdn_args &a, float *pre, float *wy, int n_tokens, cudaStream_t s)
{
    if (!gdn_chunked_supported(a) || n_tokens < 1 || !pre || !wy)
        return cudaErrorInvalidValue;
    cudaError_t e = launch_gdn_prep(a, pre, n_tokens, s);
    if (e != cudaSuccess)
        return e;
    const int stride = gdn_prefill_stride(a.conv_dim, a.Hv);
    switch (a.dk) {
    case 32: return gdc_launch<32>(a, pre, stride, wy, n_tokens, s);
    case 64: return gdc_launch<64>(a, pre, stride, wy, n_tokens, s);
    case 128: return gdc_launch<128>(a, pre, stride, wy, n_tokens, s);
    default: return cudaErrorInvalidValue;
    }
}
