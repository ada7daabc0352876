/* attention_prefill.cu — causal flash attention for a prefill chunk over the bf16 KV cache, with the
 * output gate (docs/MODEL.md §4.3 steps 4-5): the same inputs and output as attention_decode.cu with n > 1
 * tokens, on tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate; sm_80+).
 *
 * Rows: the G = n_heads / n_kv query heads that share KV head g are packed with the tokens into the M
 * dimension, row r = t * G + h (t = token of the chunk, h = head within the group), so one K/V tile load
 * serves all G heads. A block (q tile, KV head g, split s) owns APF_BM = 64 rows (4 warps x 16 rows) and
 * walks keys [kstart, kend) of its split in tiles of APF_BN = 32 keys: K and V tiles are cp.async
 * double-buffered in shared memory (rows padded by 16 bytes: ldmatrix is bank-conflict free), Q is
 * converted once to bf16 into shared memory. Per warp: S = Q K^T (16 x 32, fp32), causal mask
 * (key <= pos + t) and split mask (key < kend), online softmax in fp32 (exp2 domain), P rounded to bf16,
 * O += P V with O (16 x head_dim fp32) in registers. The denominator sums the bf16-rounded P, so the
 * weights applied to V sum to exactly the normaliser.
 *
 * Split-KV (a short chunk deep in the context): grid.z = n_splits cuts the keys of each q tile into
 * chunks (multiples of APF_BN); each split writes (unnormalised O, max, sum) per row into part_o /
 * part_ml ([split][t][head][head_dim], [split][t][head][2]) and attention_prefill_merge_kernel combines
 * them. With n_splits == 1 the block normalises and writes out directly.
 * Output: out[t][h][d] = attn * sigmoid(gate[t][h][d]), gate = second half of q_proj's head row.
 * a.prefill_kernel ATTN_PREFILL_WGMMA (an sm_90a GPU): the wgmma kernel of attention_prefill_wg.cu instead
 * (same results up to fp32 summation order; this file's merge kernel combines its splits).
 *
 * Q is staged from the raw q (first half of q_proj's head row in qkv) with the q RMSNorm and partial RoPE
 * of norm_rope.cu (the shared math of norm_rope.cuh, same bits as the q that kernel writes;
 * attention_prefill_q.cuh): a warp per row sums the squares (same order as norm_rope.cu) and stores the
 * non-rotary dims, then one thread per (token, rotary pair) of the tile computes cos/sin once and rotates
 * that pair for each of the token's heads in the tile. With a.q_fused norm_rope.cu only appends k and v.
 */
#include "attention.cuh"
#include "backend/cuda/mma_bf16.cuh"
#include "attention_prefill_q.cuh"
#include "attention_prefill_wg.cuh"

#define APF_BM 64   /* query rows (token x head) per block */
#define APF_BN 32   /* keys per tile */
#define APF_WARPS 4 /* 16 rows each */
#define APF_PAD 8   /* bf16 elements of padding per shared-memory row */

/* ---- the kernel ------------------------------------------------------------------------------------ */

template <int D> constexpr size_t apf_smem_bytes(void)
{
    return (size_t)(APF_BM + 4 * APF_BN) * (D + APF_PAD) * sizeof(__nv_bfloat16);
}

template <int D>
__global__ void __launch_bounds__(APF_WARPS * 32) attention_prefill_kernel(attn_args a, int n_tokens)
{
    constexpr int LD = D + APF_PAD; /* shared row stride (bf16 elements; 16-byte multiple) */
    extern __shared__ __align__(16) unsigned char apf_smem[];
    __nv_bfloat16 *sQ = reinterpret_cast<__nv_bfloat16 *>(apf_smem); /* [APF_BM][LD] */
    __nv_bfloat16 *sK = sQ + APF_BM * LD;                              /* [2][APF_BN][LD] */
    __nv_bfloat16 *sV = sK + 2 * APF_BN * LD;                          /* [2][APF_BN][LD] */

    const int G = a.n_heads / a.n_kv;
    const int g = blockIdx.y, split = blockIdx.z, n_splits = gridDim.z;
    const int r0 = (gridDim.x - 1 - blockIdx.x) * APF_BM; /* first packed row; the longest (last) tiles start first */
    const int n_rows = n_tokens * G;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    pdl_wait();
    pdl_trigger();
    const int pos = *a.pos;
    const int t_last = min(n_tokens - 1, (r0 + APF_BM - 1) / G);
    const int L = pos + t_last + 1; /* keys any row of this block attends to: [0, L) */
    int chunk = (L + n_splits - 1) / n_splits;
    chunk = (chunk + APF_BN - 1) / APF_BN * APF_BN;
    const int kstart = min(L, split * chunk), kend = min(L, kstart + chunk);
    const int n_kt = (kend - kstart + APF_BN - 1) / APF_BN;

    const __nv_bfloat16 *kc = a.k_cache + (size_t)g * a.max_ctx * D;
    const __nv_bfloat16 *vc = a.v_cache + (size_t)g * a.max_ctx * D;
    /* K and V tile j -> buffer b: 16-byte chunks, keys >= kend zero-filled (V must be finite: P = 0 there) */
    auto load_kv = [&](int j, int b) {
        const int k0 = kstart + j * APF_BN;
        constexpr int CPR = D / 8; /* 16-byte chunks per row */
        for (int i = tid; i < APF_BN * CPR; i += APF_WARPS * 32) {
            const int r = i / CPR, c = i % CPR, key = k0 + r;
            const bool ok = key < kend;
            const size_t off = (size_t)(ok ? key : 0) * D + c * 8;
            cp_async16(sK + (b * APF_BN + r) * LD + c * 8, kc + off, ok ? 16 : 0);
            cp_async16(sV + (b * APF_BN + r) * LD + c * 8, vc + off, ok ? 16 : 0);
        }
    };
    if (n_kt > 0) {
        load_kv(0, 0);
        cp_async_commit();
    }

    /* Q -> bf16 shared, rows past the chunk zero: the raw q normed + rotated here */
    __shared__ float s_r[APF_BM]; /* 1/rms per row */
    apf_stage_q_fused<D, APF_BM, APF_WARPS>(a, n_tokens, r0, g, pos, s_r,
                                              [&](int r, int d) { return sQ + r * LD + d; });

    /* this lane's two rows (fragment rows lane/4 and lane/4 + 8 of the warp's 16) */
    const int quad = lane >> 2, qid = lane & 3;
    int lim[2]; /* keys < lim[i] are visible to row i */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int gr = r0 + warp * 16 + quad + 8 * i;
        const int t = min(gr / G, n_tokens - 1); /* padding rows behave like the last token (not stored) */
        lim[i] = min(pos + t + 1, kend);
    }
    const float sl2 = rsqrtf((float)D) * 1.4426950408889634f; /* scale * log2(e) */

    float o[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    const __nv_bfloat16 *qrow = sQ + (warp * 16 + (lane & 15)) * LD + (lane >> 4) * 8;
    for (int j = 0; j < n_kt; j++) {
        const int b = j & 1;
        if (j + 1 < n_kt) {
            load_kv(j + 1, b ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const __nv_bfloat16 *kb = sK + b * APF_BN * LD, *vb = sV + b * APF_BN * LD;

        /* S = Q K^T: 4 n-tiles of 8 keys */
        float s[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        /* K fragment rows: matrices (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 0-7), (keys 8-15, d 8-15) */
        const __nv_bfloat16 *krow = kb + ((lane & 7) + 8 * (lane >> 4)) * LD + 8 * ((lane >> 3) & 1);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            unsigned int qa[4];
            ldsm_x4(qa, qrow + kk * 16);
#pragma unroll
            for (int np = 0; np < 2; np++) {
                unsigned int kf[4];
                ldsm_x4(kf, krow + np * 16 * LD + kk * 16);
                mma_bf16(s[2 * np], qa, kf[0], kf[1]);
                mma_bf16(s[2 * np + 1], qa, kf[2], kf[3]);
            }
        }

        /* mask, online softmax (exp2 domain) */
        const int k0 = kstart + j * APF_BN;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = k0 + nt * 8 + 2 * qid + (e & 1);
                const float v = key < lim[e >> 1] ? s[nt][e] * sl2 : -INFINITY;
                s[nt][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        float corr[2], mu[2];
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
        /* P as bf16 A fragments: k-step ks = keys 16ks..16ks+15 = n-tiles 2ks, 2ks+1 */
        unsigned int pa[2][4];
#pragma unroll
        for (int ks = 0; ks < 2; ks++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int nt = 2 * ks + hf;
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    float p0, p1;
                    pa[ks][2 * hf + i] = pack_bf16(exp2f(s[nt][2 * i] - mu[i]), exp2f(s[nt][2 * i + 1] - mu[i]), p0, p1);
                    l[i] += p0 + p1;
                }
            }
#pragma unroll
        for (int jd = 0; jd < D / 8; jd++) {
            o[jd][0] *= corr[0];
            o[jd][1] *= corr[0];
            o[jd][2] *= corr[1];
            o[jd][3] *= corr[1];
        }
        /* O += P V. V fragment rows (.trans): matrices (keys 0-7, d 0-7), (keys 8-15, d 0-7),
         * (keys 0-7, d 8-15), (keys 8-15, d 8-15) */
        const __nv_bfloat16 *vrow = vb + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 8 * (lane >> 4);
#pragma unroll
        for (int ks = 0; ks < 2; ks++)
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                unsigned int vf[4];
                ldsm_x4_trans(vf, vrow + ks * 16 * LD + dp * 16);
                mma_bf16(o[2 * dp], pa[ks], vf[0], vf[1]);
                mma_bf16(o[2 * dp + 1], pa[ks], vf[2], vf[3]);
            }
        __syncthreads(); /* buffer b is refilled by the next iteration's load */
    }

    /* epilogue: quad sums; normalise + gate, or publish the split's partial */
    apf_write_rows<D>(a, o, m, l, r0 + warp * 16 + quad, g, n_rows, n_tokens, n_splits, split, qid);
}

/* Combine the splits of one (token, head) row: grid n_tokens * n_heads, block 128. */
__global__ void __launch_bounds__(128) attention_prefill_merge_kernel(attn_args a, int n_tokens, int n_splits)
{
    pdl_wait();
    pdl_trigger();
    const int row = blockIdx.x, t = row / a.n_heads, hg = row % a.n_heads, D = a.head_dim;
    const size_t stride = (size_t)n_tokens * a.n_heads; /* rows per split */
    float M = -INFINITY;
    for (int sp = 0; sp < n_splits; sp++)
        M = fmaxf(M, a.part_ml[(sp * stride + row) * 2]);
    float Ls = 0.0f;
    for (int sp = 0; sp < n_splits; sp++) {
        const float ms = a.part_ml[(sp * stride + row) * 2];
        Ls += ms == -INFINITY ? 0.0f : a.part_ml[(sp * stride + row) * 2 + 1] * exp2f(ms - M);
    }
    const float *gate = a.qkv + (size_t)t * a.qkv_stride + (size_t)hg * 2 * D + D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.0f;
        for (int sp = 0; sp < n_splits; sp++) {
            const float ms = a.part_ml[(sp * stride + row) * 2];
            if (ms != -INFINITY)
                acc = fmaf(a.part_o[(sp * stride + row) * D + d], exp2f(ms - M), acc);
        }
        a.out[(size_t)row * D + d] = acc / Ls * sigmoid_f(gate[d]);
    }
}

/* ---- launch ------------------------------------------------------------------------------------------ */

template <int D>
static cudaError_t apf_launch(const attn_args &a, int n_tokens, int n_splits, cudaStream_t s)
{
    constexpr size_t smem = apf_smem_bytes<D>();
    /* per call (host-side, cheap): the attribute belongs to the current device's context */
    cudaError_t e = cudaFuncSetAttribute(attention_prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess)
        return e;
    const int G = a.n_heads / a.n_kv;
    dim3 grid((n_tokens * G + APF_BM - 1) / APF_BM, a.n_kv, n_splits);
    return launch_pdl(attention_prefill_kernel<D>, grid, dim3(APF_WARPS * 32), smem, s, a, n_tokens);
}

bool attention_prefill_supported(const attn_args &a)
{
    if (a.k_cache_f32) /* an fp32 (exact-mode) cache: the SIMT kernel only */
        return false;
    if (!a.q_norm || a.rot_dim < 0 || a.rot_dim > a.head_dim || a.rot_dim % 2) /* q is normed + rotated here */
        return false;
    return a.n_kv > 0 && a.n_heads % a.n_kv == 0 && (a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256);
}

int attention_prefill_splits(const attn_args &a, int n_tokens, int ctx, int cap_splits)
{
    if (n_tokens < 1 || a.n_kv < 1 || a.n_heads % a.n_kv)
        return 1;
    static int n_sm = 0;
    if (n_sm <= 0) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            n_sm = 132;
    }
    /* the wgmma kernel: 128-row blocks, 64-key tiles, one block per SM */
    const bool wg = a.prefill_kernel == ATTN_PREFILL_WGMMA && attention_prefill_wg_supported(a);
    const int bm = wg ? APF_WG_BM : APF_BM, bn = wg ? APF_WG_BN : APF_BN, per_sm = wg ? 1 : 2;
    const int G = a.n_heads / a.n_kv;
    const int blocks = (n_tokens * G + bm - 1) / bm * a.n_kv;
    int sp = (per_sm * n_sm + blocks - 1) / blocks; /* about per_sm blocks per SM */
    sp = min(sp, cap_splits / n_tokens);            /* partial buffers */
    sp = min(sp, (ctx + n_tokens) / (8 * bn));      /* at least 8 key tiles per split */
    return max(sp, 1);
}

attn_prefill_kernel attn_prefill_kernel_choose(void)
{
    return attention_prefill_wg_available() ? ATTN_PREFILL_WGMMA : ATTN_PREFILL_MMA;
}

cudaError_t launch_attention_prefill(const attn_args &a, int n_tokens, cudaStream_t s)
{
    const int n_splits = max(a.n_splits, 1);
    if (!attention_prefill_supported(a) || n_tokens < 1 || (n_splits > 1 && (!a.part_o || !a.part_ml)))
        return cudaErrorInvalidValue;
    cudaError_t e;
    if (a.prefill_kernel == ATTN_PREFILL_WGMMA && attention_prefill_wg_supported(a))
        e = launch_attention_prefill_wg(a, n_tokens, n_splits, s);
    else if (a.head_dim == 64)
        e = apf_launch<64>(a, n_tokens, n_splits, s);
    else if (a.head_dim == 128)
        e = apf_launch<128>(a, n_tokens, n_splits, s);
    else if (a.head_dim == 256)
        e = apf_launch<256>(a, n_tokens, n_splits, s);
    else
        return cudaErrorInvalidValue;
    if (e != cudaSuccess || n_splits == 1)
        return e;
    return launch_pdl(attention_prefill_merge_kernel, dim3(n_tokens * a.n_heads), dim3(128), 0, s, a, n_tokens,
                      n_splits);
}
