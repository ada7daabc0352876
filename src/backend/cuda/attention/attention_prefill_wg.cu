/* attention_prefill_wg.cu — the Hopper (sm_90a) kernel of the causal prefill flash attention
 * (attn_prefill_kernel_choose picks it on an sm_90a device): the inputs, output, masks, split-KV partials and softmax arithmetic of
 * attention_prefill.cu (read its header first), with wgmma.mma_async instead of mma.sync.
 *
 * A block is 2 warpgroups (256 threads) and owns APF_WG_BM = 128 packed rows (row r = t * G + h: 16
 * tokens x 8 heads for Qwen3.5/3.6); warpgroup w owns rows 64w..64w+63 (warp i of it: 16 rows, the
 * m16n8 fragment rows). Keys come in tiles of APF_WG_BN = 64:
 *   S = Q K^T: per k16 slice of head_dim, one wgmma m64n64k16 with A = Q and B = K both from shared
 *     memory (K-major: head_dim is contiguous in both), fp32 accumulators (32 registers per thread);
 *   mask (key <= pos + t, key < the split's end), online softmax in the exp2 domain, P rounded to bf16
 *     straight from the accumulators into the A register fragment (the m16n8 C layout of two adjacent
 *     n8 blocks is the m16n8k16 A layout), the denominator summing the rounded weights;
 *   O += P V: per 16 keys one wgmma m64nDk16 with A = P from registers and B = V from shared memory
 *     MN-major (imm-trans-b 1: the cache rows are keys x head_dim, head_dim contiguous), O (64 x D fp32
 *     per warpgroup, D / 2 registers per thread) in registers for the whole walk.
 * Shared memory (128-byte swizzle, wgmma_common.cuh): Q [D/64][128 rows][128 B] (bf16, staged once from
 * the raw q with the RMSNorm + RoPE of attention_prefill_q.cuh), then two
 * stages of K and V tiles [D/64][64 keys][128 B], filled by cp.async (keys past the split's end
 * zero-filled); K and V have separate 2-stage rings. Step j waits for its loads, fences the async proxy,
 * passes one barrier (which also proves every warpgroup finished the wgmmas that read the other stages),
 * refills K j + 1 and V j, issues S of tile j, then P·V of tile j - 1, waits for S alone (wait_group 1)
 * and does tile j's softmax while the tensor cores run that P·V, then waits for it and rescales O (as
 * FlashAttention-3's intra-warpgroup overlap). head_dim 256: 64 + 2 x 64 KB of shared memory, one block
 * per SM. Measurements: docs/BENCHMARKS.md ("One kernel per op and shape").
 * Compiled for sm_90a only (__CUDA_ARCH_FEAT_SM90_ALL); elsewhere the kernel is an empty stub and
 * attention_prefill_wg_available() says false, so launch_attention_prefill keeps the mma.sync kernel.
 */
#include "backend/cuda/mma_bf16.cuh"
#include "attention_prefill_q.cuh"
#include "attention_prefill_wg.cuh"
#include "backend/cuda/wgmma_common.cuh"

#define AWG_THREADS 256

template <int D> struct awg_shape {
    static constexpr int Q_BYTES = D * APF_WG_BM * 2; /* D/64 blocks x 128 rows x 128 B */
    static constexpr int T_BYTES = D * APF_WG_BN * 2; /* one K or V tile */
    static constexpr int STAGE = 2 * T_BYTES;
    static constexpr int SMEM = Q_BYTES + 2 * STAGE + 1024; /* + slack to align the base to 1024 */
};

/* Byte offset of element (r, d) in a [D/64][ROWS][128 B] tile with the 128-byte swizzle. */
template <int ROWS> __device__ __forceinline__ uint32_t awg_off(int r, int d)
{
    return (uint32_t)((d >> 6) * ROWS * 128 + r * 128 + ((((d >> 3) & 7) ^ (r & 7)) << 4) + (d & 7) * 2);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* issue S (64 x 64 fp32, this warpgroup's rows) = Q K^T: Q rows at sq, the K tile at sk (no fence, commit
 * or wait) */
template <int D, int NT> __device__ __forceinline__ void awg_issue_s(float (&s)[NT][4], uint32_t sq, uint32_t sk)
{
    constexpr int BN = NT * 8; /* keys per tile */
    wgmma_bf16_ss_first<BN>(s, wg_desc(sq), wg_desc(sk)); /* s is not live before: no zeroing */
#pragma unroll
    for (int kk = 1; kk < D / 16; kk++)
        wgmma_bf16_ss<BN>(s, wg_desc(sq + (kk >> 2) * APF_WG_BM * 128 + (kk & 3) * 32),
                          wg_desc(sk + (kk >> 2) * BN * 128 + (kk & 3) * 32), 1);
}

/* issue O += P V: V MN-major at sv, 64-column blocks BN * 128 bytes apart (LBO), 8-key groups 1024 (SBO) */
template <int D, int NS>
__device__ __forceinline__ void awg_issue_pv(float (&o)[D / 8][4], const uint32_t (&pa)[NS][4], uint32_t sv)
{
#pragma unroll
    for (int ks = 0; ks < NS; ks++)
        wgmma_bf16_rs_tb<D>(o, pa[ks], wg_desc_sw128(sv + ks * 16 * 128, NS * 16 * 128, 1024));
}

/* Mask (when masked: key k0 + column visible to row i iff < lim[i]) and online softmax in the exp2 domain
 * (m, l: this lane's two rows; the quad's 4 lanes share a row), in place: s becomes the weights P rounded
 * to bf16 (held as fp32; l sums exactly these) and corr the factor O needs. */
template <int NT>
__device__ __forceinline__ void awg_softmax(float (&s)[NT][4], int k0, bool masked, const int (&lim)[2],
                                            int qid, float sl2, float (&m)[2], float (&l)[2], float (&corr)[2])
{
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int key = k0 + nt * 8 + 2 * qid + (e & 1);
            const float v = !masked || key < lim[e >> 1] ? s[nt][e] * sl2 : -INFINITY;
            s[nt][e] = v;
            mx[e >> 1] = fmaxf(mx[e >> 1], v);
        }
    float mu[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        const float mn = fmaxf(m[i], mx[i]);
        mu[i] = mn == -INFINITY ? 0.0f : mn; /* no visible key yet: every p below is 0 */
        corr[i] = exp2f(m[i] - mu[i]);
        m[i] = mn;
        l[i] *= corr[i];
    }
    /* the order of the sums: n8 blocks in pairs (k16 slices), as attention_prefill.cu */
#pragma unroll
    for (int ks = 0; ks < NT / 2; ks++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int nt = 2 * ks + hf;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                pack_bf16(exp2f(s[nt][2 * i] - mu[i]), exp2f(s[nt][2 * i + 1] - mu[i]), s[nt][2 * i], s[nt][2 * i + 1]);
                l[i] += s[nt][2 * i] + s[nt][2 * i + 1];
            }
        }
}

/* P (bf16-exact values in s) as bf16 A fragments: k16 slice ks = keys 16ks..16ks+15 = n8 blocks 2ks, 2ks+1
 * (the m16n8 C layout of two adjacent n8 blocks is the m16n8k16 A layout) */
template <int NT> __device__ __forceinline__ void awg_pack_p(const float (&s)[NT][4], uint32_t (&pa)[NT / 2][4])
{
#pragma unroll
    for (int ks = 0; ks < NT / 2; ks++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float x0, x1;
                pa[ks][2 * hf + i] = pack_bf16(s[2 * ks + hf][2 * i], s[2 * ks + hf][2 * i + 1], x0, x1);
            }
}

/* O *= corr per row; skipped when no row of the warp changed its max (corr exactly 1: the common case deep
 * in a long context, and multiplying by 1 would change nothing) */
template <int D> __device__ __forceinline__ void awg_rescale(float (&o)[D / 8][4], const float (&corr)[2])
{
    if (!__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f))
        return;
#pragma unroll
    for (int jd = 0; jd < D / 8; jd++) {
        o[jd][0] *= corr[0];
        o[jd][1] *= corr[0];
        o[jd][2] *= corr[1];
        o[jd][3] *= corr[1];
    }
}

#endif

template <int D>
__global__ void __launch_bounds__(AWG_THREADS, 1) attention_prefill_wg_kernel(attn_args a, int n_tokens)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef awg_shape<D> S;
    constexpr int BM = APF_WG_BM, BN = APF_WG_BN;
    static_assert(D % 64 == 0 && BN * (D / 8) % AWG_THREADS == 0, "tile shape");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t raw = smem_addr(smem_raw);
    unsigned char *smem = smem_raw + ((1024u - (raw & 1023u)) & 1023u);
    const uint32_t sbase = smem_addr(smem);

    const int G = a.n_heads / a.n_kv;
    const int g = blockIdx.y, split = blockIdx.z, n_splits = gridDim.z;
    const int r0 = (gridDim.x - 1 - blockIdx.x) * BM; /* first packed row; the longest (last) tiles start first */
    const int n_rows = n_tokens * G;
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;

    pdl_wait();
    pdl_trigger();
    const int pos = *a.pos;
    const int t_first = r0 / G, t_last = min(n_tokens - 1, (r0 + BM - 1) / G);
    const int L = pos + t_last + 1; /* keys any row of this block attends to: [0, L) */
    int chunk = (L + n_splits - 1) / n_splits;
    chunk = (chunk + BN - 1) / BN * BN;
    const int kstart = min(L, split * chunk), kend = min(L, kstart + chunk);
    const int n_kt = (kend - kstart + BN - 1) / BN;
    const int k_all = min(pos + t_first + 1, kend); /* keys < k_all are visible to every row of the block */

    const __nv_bfloat16 *kc = a.k_cache + (size_t)g * a.max_ctx * D;
    const __nv_bfloat16 *vc = a.v_cache + (size_t)g * a.max_ctx * D;
    /* K or V tile j -> stage st: 16-byte chunks, keys >= kend zero-filled (V must be finite: P = 0 there) */
    auto load_tile = [&](const __nv_bfloat16 *src, int j, unsigned char *dst) {
        const int k0 = kstart + j * BN;
        constexpr int CPR = D / 8; /* 16-byte chunks per row */
#pragma unroll
        for (int it = 0; it < BN * CPR / AWG_THREADS; it++) {
            const int i = tid + it * AWG_THREADS, r = i / CPR, c = i % CPR, key = k0 + r;
            const bool ok = key < kend;
            cp_async16(dst + awg_off<BN>(r, c * 8), src + (size_t)(ok ? key : 0) * D + c * 8, ok ? 16 : 0);
        }
    };
    auto load_k = [&](int j, int st) { load_tile(kc, j, smem + S::Q_BYTES + st * S::STAGE); };
    auto load_v = [&](int j, int st) { load_tile(vc, j, smem + S::Q_BYTES + st * S::STAGE + S::T_BYTES); };
    if (n_kt > 0)
        load_k(0, 0);
    cp_async_commit();

    /* Q -> bf16 shared (swizzled), rows past the chunk zero: the raw q normed + rotated here */
    __shared__ float s_r[BM]; /* 1/rms per row */
    apf_stage_q_fused<D, BM, AWG_THREADS / 32>(a, n_tokens, r0, g, pos, s_r, [&](int r, int d) {
        return reinterpret_cast<__nv_bfloat16 *>(smem + awg_off<BM>(r, d));
    });
    fence_proxy_async(); /* the Q writes -> the async proxy; published by the loop's first barrier */

    /* this lane's two rows (fragment rows lane/4 and lane/4 + 8 of its warp's 16) */
    const int quad = lane >> 2, qid = lane & 3;
    const int wrow = 64 * wg + 16 * warp + quad; /* + 8 i: row within the block */
    int lim[2]; /* keys < lim[i] are visible to row i */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int gr = r0 + wrow + 8 * i;
        const int t = min(gr / G, n_tokens - 1); /* padding rows behave like the last token (not stored) */
        lim[i] = min(pos + t + 1, kend);
    }
    const float sl2 = rsqrtf((float)D) * 1.4426950408889634f; /* scale * log2(e) */

    float o[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    const uint32_t sq = sbase + wg * 64 * 128; /* this warpgroup's 64 rows in each 64-column block */
    auto k_stage = [&](int st) { return sbase + S::Q_BYTES + st * S::STAGE; };
    auto v_stage = [&](int st) { return sbase + S::Q_BYTES + st * S::STAGE + S::T_BYTES; };
    float s[BN / 8][4];
    uint32_t pa[BN / 16][4];
    float corr[2];
    if (n_kt > 0) {
        /* S of tile j is issued before P·V of tile j - 1 and waited alone (wait_group 1), so the softmax of
         * tile j (in place on its fp32 scores) runs while the tensor cores do P·V of tile j - 1; then O is
         * rescaled and P j packed into the one A array. */
        cp_async_wait<0>(); /* K 0 */
        fence_proxy_async();
        __syncthreads();
        if (1 < n_kt)
            load_k(1, 1);
        load_v(0, 0);
        cp_async_commit();
        wg_fence();
        awg_issue_s<D>(s, sq, k_stage(0));
        wg_commit();
        wg_wait<0>();
        wg_fence_regs(s);
        awg_softmax(s, kstart, kstart + BN > k_all, lim, qid, sl2, m, l, corr); /* O is still 0 */
        awg_pack_p(s, pa);
        for (int j = 1; j < n_kt; j++) {
            cp_async_wait<0>(); /* K j, V j - 1 */
            fence_proxy_async();
            __syncthreads(); /* ... complete; S j - 1 and P·V j - 2 finished in every warpgroup */
            if (j + 1 < n_kt)
                load_k(j + 1, (j + 1) & 1);
            load_v(j, j & 1);
            cp_async_commit();
            wg_fence();
            awg_issue_s<D>(s, sq, k_stage(j & 1));
            wg_commit();
            awg_issue_pv<D>(o, pa, v_stage((j - 1) & 1));
            wg_commit();
            wg_wait<1>(); /* S j */
            wg_fence_regs(s);
            awg_softmax(s, kstart + j * BN, kstart + j * BN + BN > k_all, lim, qid, sl2, m, l, corr);
            wg_wait<0>(); /* P·V j - 1 */
            wg_fence_regs(o);
            wg_fence_regs(pa); /* live until here: the P·V just waited for read it */
            awg_rescale<D>(o, corr);
            awg_pack_p(s, pa); /* P j: written only now, one P array (as FlashAttention-3) */
        }
        cp_async_wait<0>(); /* V n_kt - 1 */
        fence_proxy_async();
        __syncthreads();
        wg_fence();
        awg_issue_pv<D>(o, pa, v_stage((n_kt - 1) & 1));
        wg_commit();
        wg_wait<0>();
        wg_fence_regs(o);
        wg_fence_regs(pa);
    }

    /* epilogue: quad sums; normalise + gate, or publish the split's partial */
    apf_write_rows<D>(a, o, m, l, r0 + wrow, g, n_rows, n_tokens, n_splits, split, qid);
#else
    (void)a;
    (void)n_tokens;
#endif
}

/* ---- launch ------------------------------------------------------------------------------------------ */

/* 1 in the sm_90a image (the real kernel), 0 in every other image (the stub). */
__device__ int g_attn_wg_real =
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    1;
#else
    0;
#endif

bool attention_prefill_wg_available(void)
{
    static int avail = -1;
    if (avail < 0) {
        int real = 0;
        const cudaError_t read = cudaMemcpyFromSymbol(&real, g_attn_wg_real, sizeof real);
        avail = cuda_sm90a_image(read, real);
    }
    return avail == 1;
}

bool attention_prefill_wg_supported(const attn_args &a)
{
    return attention_prefill_supported(a) && (a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256) &&
           attention_prefill_wg_available();
}

template <int D>
static cudaError_t awg_launch(const attn_args &a, int n_tokens, int n_splits, cudaStream_t s)
{
    static size_t smem_set = 48 * 1024; /* opted in once per instance */
    cudaError_t e = cuda_smem_opt_in(attention_prefill_wg_kernel<D>, awg_shape<D>::SMEM, &smem_set);
    if (e != cudaSuccess)
        return e;
    const int G = a.n_heads / a.n_kv;
    dim3 grid((n_tokens * G + APF_WG_BM - 1) / APF_WG_BM, a.n_kv, n_splits);
    return launch_pdl(attention_prefill_wg_kernel<D>, grid, dim3(AWG_THREADS), awg_shape<D>::SMEM, s, a, n_tokens);
}

cudaError_t launch_attention_prefill_wg(const attn_args &a, int n_tokens, int n_splits, cudaStream_t s)
{
    if (!attention_prefill_wg_supported(a) || n_tokens < 1 || n_splits < 1)
        return cudaErrorInvalidValue;
    switch (a.head_dim) {
    case 64: return awg_launch<64>(a, n_tokens, n_splits, s);
    case 128: return awg_launch<128>(a, n_tokens, n_splits, s);
    case 256: return awg_launch<256>(a, n_tokens, n_splits, s);
    default: return cudaErrorInvalidValue;
    }
}
