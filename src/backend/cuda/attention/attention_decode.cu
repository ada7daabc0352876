/* attention_decode.cu — causal softmax attention over the KV cache with the output gate
 * (docs/MODEL.md §4.3 steps 4-5), for decode (split-KV) and prefill (one split).
 * The SIMT kernel reads a bf16 cache or, in exact mode, an fp32 one (attn_args.k_cache_f32; template
 * parameter KV); the tensor-core decode kernel a bf16 cache only.
 *
 * Block (split s, KV head g, token t), 8 warps: the G = n_heads / n_kv query heads that share KV head g
 * are handled together, so each K and V row is read once for all of them (coalesced: a warp reads a
 * whole row, lane l its D/32 contiguous dims). Online softmax (fp32) per warp, merged in shared memory.
 * Split-KV: a token's L = pos + t + 1 keys are cut into chunks of max(min_chunk, ceil(L / n_splits));
 * each block writes (max, sum, unnormalised output); the last block of a KV head to finish (atomic
 * counter) merges them. With n_splits == 1 the block normalises and writes directly.
 * Output: out[t][h][d] = attn * sigmoid(gate[t][h][d]).
 * Decode (one token) runs on tensor cores instead where supported (attention_decode_mma_kernel below,
 * attn_decode_kernel_choose); this SIMT kernel serves the fp32 cache of exact mode, shapes the tensor-core
 * kernels do not take, and chunks without the prefill kernel.
 */
#include "attention.cuh"
#include "attention_decode_q.cuh"
#include "backend/cuda/mma_bf16.cuh"

#define ATT_WARPS 8

template <int G, int DPL>
__device__ __forceinline__ void load_row(const __nv_bfloat16 *p, float (&v)[DPL])
{
    if (DPL == 8) {
        const uint4 u = *reinterpret_cast<const uint4 *>(p);
        const unsigned int w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[2 * k] = __uint_as_float(w[k] << 16);
            v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
    } else if (DPL == 4) {
        const uint2 u = *reinterpret_cast<const uint2 *>(p);
        v[0] = __uint_as_float(u.x << 16);
        v[1] = __uint_as_float(u.x & 0xffff0000u);
        v[2] = __uint_as_float(u.y << 16);
        v[3] = __uint_as_float(u.y & 0xffff0000u);
    } else {
#pragma unroll
        for (int e = 0; e < DPL; e++)
            v[e] = bf2f(p[e]);
    }
}

/* An fp32 row (exact mode): 16-byte loads when DPL allows. */
template <int G, int DPL>
__device__ __forceinline__ void load_row(const float *p, float (&v)[DPL])
{
    if (DPL % 4 == 0) {
#pragma unroll
        for (int k = 0; k < DPL / 4; k++) {
            const float4 u = reinterpret_cast<const float4 *>(p)[k];
            v[4 * k] = u.x;
            v[4 * k + 1] = u.y;
            v[4 * k + 2] = u.z;
            v[4 * k + 3] = u.w;
        }
    } else {
#pragma unroll
        for (int e = 0; e < DPL; e++)
            v[e] = p[e];
    }
}

/* The cache of element type KV: bf16, or fp32 in exact mode. */
__device__ __forceinline__ void kv_bases(const attn_args &a, const __nv_bfloat16 *&k, const __nv_bfloat16 *&v)
{
    k = a.k_cache;
    v = a.v_cache;
}
__device__ __forceinline__ void kv_bases(const attn_args &a, const float *&k, const float *&v)
{
    k = a.k_cache_f32;
    v = a.v_cache_f32;
}

template <typename KV, int G, int DPL>
__global__ void __launch_bounds__(ATT_WARPS * 32) attention_kernel(attn_args a)
{
    constexpr int D = DPL * 32;
    __shared__ float s_acc[G * D];
    __shared__ float s_m[ATT_WARPS][G], s_l[ATT_WARPS][G];
    __shared__ float s_M[G], s_L[G];
    __shared__ unsigned int s_last;
    tl_block<> tl(a.timeline);
    pdl_trigger(); /* o_proj may launch and prefetch its weights */
    pdl_wait();
    tl.waited();
    const int s = blockIdx.x, g = blockIdx.y, t = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int L = *a.pos + t + 1;
    int chunk = (L + a.n_splits - 1) / a.n_splits;
    chunk = max(chunk, a.min_chunk);
    const int start = s * chunk, end = min(L, start + chunk);
    const float scale = rsqrtf((float)D);

    float q[G][DPL], acc[G][DPL], m[G], l[G];
#pragma unroll
    for (int h = 0; h < G; h++) {
        const float *qp = a.q + ((size_t)t * a.n_heads + g * G + h) * D + lane * DPL;
#pragma unroll
        for (int e = 0; e < DPL; e++) {
            q[h][e] = qp[e] * scale;
            acc[h][e] = 0.0f;
        }
        m[h] = -INFINITY;
        l[h] = 0.0f;
    }

    const KV *kc, *vc;
    kv_bases(a, kc, vc);
    kc += (size_t)g * a.max_ctx * D + lane * DPL;
    vc += (size_t)g * a.max_ctx * D + lane * DPL;
    constexpr int UK = 4; /* keys per warp iteration: 8 row loads in flight per lane */
    for (int k0 = start + warp; k0 < end; k0 += UK * ATT_WARPS) {
        float kr[UK][DPL], vr[UK][DPL];
#pragma unroll
        for (int u = 0; u < UK; u++) {
            const int k = min(k0 + u * ATT_WARPS, end - 1); /* clamped rows are masked below */
            load_row<G, DPL>(kc + (size_t)k * D, kr[u]);
            load_row<G, DPL>(vc + (size_t)k * D, vr[u]);
        }
        float sc[UK][G];
#pragma unroll
        for (int u = 0; u < UK; u++)
#pragma unroll
            for (int h = 0; h < G; h++) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < DPL; e++)
                    d = fmaf(q[h][e], kr[u][e], d);
                sc[u][h] = d;
            }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int u = 0; u < UK; u++)
#pragma unroll
                for (int h = 0; h < G; h++)
                    sc[u][h] += __shfl_xor_sync(0xffffffffu, sc[u][h], o);
#pragma unroll
        for (int u = 0; u < UK; u++)
            if (k0 + u * ATT_WARPS >= end)
#pragma unroll
                for (int h = 0; h < G; h++)
                    sc[u][h] = -INFINITY;
#pragma unroll
        for (int h = 0; h < G; h++) {
            float mn = m[h];
#pragma unroll
            for (int u = 0; u < UK; u++)
                mn = fmaxf(mn, sc[u][h]);
            const float corr = expf(m[h] - mn);
            float p[UK], ps = 0.0f;
#pragma unroll
            for (int u = 0; u < UK; u++) {
                p[u] = expf(sc[u][h] - mn);
                ps += p[u];
            }
            l[h] = l[h] * corr + ps;
#pragma unroll
            for (int e = 0; e < DPL; e++) {
                float v = acc[h][e] * corr;
#pragma unroll
                for (int u = 0; u < UK; u++)
                    v = fmaf(p[u], vr[u][e], v);
                acc[h][e] = v;
            }
            m[h] = mn;
        }
    }
    if (lane == 0)
#pragma unroll
        for (int h = 0; h < G; h++) {
            s_m[warp][h] = m[h];
            s_l[warp][h] = l[h];
        }
    __syncthreads();
    if (threadIdx.x < G) {
        const int h = threadIdx.x;
        float M = -INFINITY;
        for (int w = 0; w < ATT_WARPS; w++)
            M = fmaxf(M, s_m[w][h]);
        float Ls = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            Ls += s_m[w][h] == -INFINITY ? 0.0f : s_l[w][h] * expf(s_m[w][h] - M);
        s_M[h] = M;
        s_L[h] = Ls;
    }
    __syncthreads();
    /* merge the warps' accumulators: one warp at a time (no shared-memory atomics, which are CAS
     * loops for fp32 and serialise under the 8-way contention) */
    float f[G];
#pragma unroll
    for (int h = 0; h < G; h++)
        f[h] = m[h] == -INFINITY ? 0.0f : expf(m[h] - s_M[h]);
    for (int w = 0; w < ATT_WARPS; w++) {
        if (warp == w)
#pragma unroll
            for (int h = 0; h < G; h++)
#pragma unroll
                for (int e = 0; e < DPL; e++) {
                    float *p = &s_acc[h * D + lane * DPL + e];
                    *p = (w == 0 ? 0.0f : *p) + acc[h][e] * f[h];
                }
        __syncthreads();
    }

    const float *gate_row = a.qkv + (size_t)t * a.qkv_stride;
    if (a.n_splits == 1) {
        for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
            const int h = i / D, d = i % D, hg = g * G + h;
            const float o = s_acc[i] / s_L[h];
            a.out[((size_t)t * a.n_heads + hg) * D + d] = o * sigmoid_f(gate_row[(size_t)hg * 2 * D + D + d]);
        }
        return;
    }
    /* split-KV: publish this split, the last block of KV head g merges */
    float *po = a.part_o + ((size_t)g * a.n_splits + s) * G * D;
    float *pml = a.part_ml + ((size_t)g * a.n_splits + s) * G * 2;
    if (start < L) {
        for (int i = threadIdx.x; i < G * D; i += blockDim.x)
            po[i] = s_acc[i];
        if (threadIdx.x < G) {
            pml[2 * threadIdx.x] = s_M[threadIdx.x];
            pml[2 * threadIdx.x + 1] = s_L[threadIdx.x];
        }
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        s_last = atomicAdd(a.counter + g, 1u) == (unsigned int)(a.n_splits - 1);
    __syncthreads();
    if (!s_last)
        return;
    __threadfence();
    const int n_used = (L + chunk - 1) / chunk;
    const float *pmlg = a.part_ml + (size_t)g * a.n_splits * G * 2;
    const float *pog = a.part_o + (size_t)g * a.n_splits * G * D;
    /* per head: merged max and sum by one warp (lanes over splits), weights f_s to shared memory */
    float *s_f = s_acc; /* reuse: [G][n_used] <= G * D floats since n_used <= n_splits <= D */
    for (int h = warp; h < G; h += ATT_WARPS) {
        float ms[8], ls[8]; /* n_used <= 256 splits: 8 per lane, loaded in one round */
#pragma unroll
        for (int q = 0; q < 8; q++) {
            const int sp = lane + 32 * q;
            ms[q] = sp < n_used ? __ldcg(pmlg + (size_t)sp * G * 2 + 2 * h) : -INFINITY;
            ls[q] = sp < n_used ? __ldcg(pmlg + (size_t)sp * G * 2 + 2 * h + 1) : 0.0f;
        }
        float M = -INFINITY;
#pragma unroll
        for (int q = 0; q < 8; q++)
            M = fmaxf(M, ms[q]);
        M = warp_max(M);
        float Ls = 0.0f;
#pragma unroll
        for (int q = 0; q < 8; q++)
            Ls += ms[q] == -INFINITY ? 0.0f : ls[q] * expf(ms[q] - M);
        Ls = warp_sum(Ls);
#pragma unroll
        for (int q = 0; q < 8; q++) {
            const int sp = lane + 32 * q;
            if (sp < n_used)
                s_f[h * n_used + sp] = ms[q] == -INFINITY ? 0.0f : expf(ms[q] - M) / Ls;
        }
    }
    __syncthreads();
    /* each thread owns NO outputs; 4 splits x NO loads in flight per round */
    constexpr int NO = (G * D + ATT_WARPS * 32 - 1) / (ATT_WARPS * 32);
    float O[NO];
#pragma unroll
    for (int k = 0; k < NO; k++)
        O[k] = 0.0f;
    for (int sp = 0; sp < n_used; sp += 4) {
        float v[4][NO];
#pragma unroll
        for (int q = 0; q < 4; q++)
#pragma unroll
            for (int k = 0; k < NO; k++) {
                const int i = threadIdx.x + k * ATT_WARPS * 32;
                v[q][k] = (sp + q < n_used && i < G * D) ? __ldcg(pog + (size_t)(sp + q) * G * D + i) : 0.0f;
            }
#pragma unroll
        for (int q = 0; q < 4; q++)
#pragma unroll
            for (int k = 0; k < NO; k++) {
                const int i = threadIdx.x + k * ATT_WARPS * 32;
                if (sp + q < n_used && i < G * D)
                    O[k] = fmaf(v[q][k], s_f[(i / D) * n_used + sp + q], O[k]);
            }
    }
#pragma unroll
    for (int k = 0; k < NO; k++) {
        const int i = threadIdx.x + k * ATT_WARPS * 32;
        if (i < G * D) {
            const int h = i / D, d = i % D, hg = g * G + h;
            a.out[((size_t)t * a.n_heads + hg) * D + d] = O[k] * sigmoid_f(gate_row[(size_t)hg * 2 * D + D + d]);
        }
    }
    if (threadIdx.x == 0)
        a.counter[g] = 0;
}

/* ---- decode (one token) on tensor cores --------------------------------------------------------------
 *
 * Block (split s, KV head g), 4 warps. The split's keys are cut into tiles of ADM_BN = 16 keys dealt
 * round-robin to the warps; each warp streams its own tiles through a private ring of STAGES cp.async
 * buffers (no block barrier in the loop) and keeps its own online softmax. Roles are swapped against the
 * prefill kernel so that no mma row is padding: S^T = K Q^T (m16n8k16: M = 16 keys, N = 8 heads, K = 16
 * dims; Q^T fragments in registers for the whole split), O^T += V^T P^T (M = 16 dims, N = 8 heads,
 * K = 16 keys; V^T fragments by ldmatrix.trans from the row-major V tile). P^T's B fragments are the
 * transposed S^T accumulators, moved with 4 shuffles of bf16 pairs per tile. q and P are rounded to
 * bf16 (fp32 accumulate, softmax in fp32, exp2 domain); the denominator sums the rounded P.
 * The warps' (max, sum, O) are combined in shared memory; with one split the block writes the gated
 * output, else (O, max, sum) per head go to part_o / part_ml and attention_decode_merge_kernel (grid:
 * heads x 64-dim slices, 4 groups of splits per dim) combines them. K/V rows below the current
 * position are prefetched before the PDL wait (written by earlier forward calls); q, the new row and
 * the gate after it. G <= 8 (heads past G are zero columns).
 * FUSED (ATTN_DECODE_MMA_FUSED): no norm_rope.cu kernel before this one. The block computes the RoPE
 * cos / sin before the wait and, after it, norms and rotates its heads' q from the raw q in qkv
 * (attention_decode_q.cuh, norm_rope.cu's bits); the block whose keys end at the position also computes
 * the new k / v row, stores it into the cache (the one writer of that row) and puts it into its last tile
 * from shared memory instead of copying it from the cache, so every warp's prologue (the other rows) is
 * issued before the wait. */

#define ADM_WARPS 4
#define ADM_BN 16 /* keys per warp tile */
#define ADM_PAD 8 /* bf16 padding per shared row: ldmatrix rows land on distinct banks */
#define ADM_MERGE_DIMS 64
#define ADM_MERGE_GROUPS 4
#define ADM_MAX_SPLITS 256

template <int D> struct adm_shape {
    static constexpr int LD = D + ADM_PAD;
    static constexpr int STAGES = D >= 256 ? 3 : 4;
    static constexpr int TILE = ADM_BN * LD; /* bf16 elements of one K (or V) tile */
    static constexpr size_t SMEM = (size_t)ADM_WARPS * STAGES * 2 * TILE * sizeof(__nv_bfloat16);
    static_assert(SMEM >= (size_t)ADM_WARPS * 8 * D * sizeof(float), "merge slab reuses the stages");
};

/* keys per split (a multiple of the tile); the same on both kernels */
__device__ __forceinline__ int adm_chunk(int L, int n_splits, int min_chunk)
{
    const int chunk = max((L + n_splits - 1) / n_splits, min_chunk);
    return (chunk + ADM_BN - 1) / ADM_BN * ADM_BN;
}

template <int D, bool FUSED>
__global__ void __launch_bounds__(ADM_WARPS * 32, 1) attention_decode_mma_kernel(attn_args a)
{
    tl_block<> tl(a.timeline);
    using SH = adm_shape<D>;
    constexpr int LD = SH::LD, STAGES = SH::STAGES;
    extern __shared__ __align__(16) unsigned char adm_smem[];
    __shared__ float s_m[ADM_WARPS][8], s_l[ADM_WARPS][8];
    __shared__ __align__(16) float s_new[FUSED ? ADQ_ROWS * D : 1]; /* FUSED: q of the G heads, new k, v */
    __shared__ double s_cs[FUSED ? D : 1];                          /* FUSED: RoPE cos | sin */
    const int s = blockIdx.x, g = blockIdx.y, n_splits = gridDim.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int G = a.n_heads / a.n_kv;
    pdl_trigger(); /* the merge (or o_proj) may launch now */
    /* the position was written by the previous forward call's last kernel (complete) */
    const int pos = *a.pos, L = pos + 1;
    const int chunk = adm_chunk(L, n_splits, a.min_chunk);
    const int start = s * chunk;
    if (start >= L)
        return; /* an unused split: the merge reads only the first ceil(L / chunk) */
    const int end = min(L, start + chunk);
    const int n_tiles = (end - start + ADM_BN - 1) / ADM_BN;
    const int nt = n_tiles > warp ? (n_tiles - warp + ADM_WARPS - 1) / ADM_WARPS : 0; /* this warp's tiles */
    const bool own_new = FUSED && end == L; /* FUSED: this block computes and appends row pos */
    const int new_key = own_new ? pos : -1;  /* the row put from s_new instead of copied from the cache */
    /* this warp's tile holding row pos, else -1 */
    const int new_tile = own_new && (pos - start) / ADM_BN % ADM_WARPS == warp ? (pos - start) / ADM_BN / ADM_WARPS : -1;

    __nv_bfloat16 *sK = reinterpret_cast<__nv_bfloat16 *>(adm_smem) + (size_t)warp * STAGES * 2 * SH::TILE;
    __nv_bfloat16 *sV = sK + STAGES * SH::TILE;
    const __nv_bfloat16 *kc = a.k_cache + (size_t)g * a.max_ctx * D;
    const __nv_bfloat16 *vc = a.v_cache + (size_t)g * a.max_ctx * D;
    /* this warp's tile i -> stage i % STAGES; a warp instruction copies one whole row; keys >= end
     * zero-filled without reading (V must be finite there: P = 0) */
    auto load_tile = [&](int i) {
        const int k0 = start + (warp + ADM_WARPS * i) * ADM_BN, b = i % STAGES;
        constexpr int CPR = D / 8; /* 16-byte chunks per row */
#pragma unroll
        for (int c = lane; c < ADM_BN * CPR; c += 32) {
            const int r = c / CPR, cc = c % CPR, key = k0 + r;
            if (FUSED && key == new_key)
                continue; /* put_new's */
            const bool ok = key < end;
            const size_t off = (size_t)(ok ? key : 0) * D + cc * 8;
            cp_async16(sK + b * SH::TILE + r * LD + cc * 8, kc + off, ok ? 16 : 0);
            cp_async16(sV + b * SH::TILE + r * LD + cc * 8, vc + off, ok ? 16 : 0);
        }
    };
    /* FUSED: row pos of this warp's tile i (new_tile) from s_new, rounded as the cache stores it; after
     * adq_stage's barrier, before the tile's consumer's __syncwarp */
    auto put_new = [&](int i) {
        __nv_bfloat16 *dk = sK + (i % STAGES) * SH::TILE + (pos - start - (warp + ADM_WARPS * i) * ADM_BN) * LD;
        __nv_bfloat16 *dv = dk + STAGES * SH::TILE;
        for (int cc = lane; cc < D / 8; cc += 32) {
            const float *kn = s_new + ADQ_K * D + cc * 8, *vn = s_new + ADQ_V * D + cc * 8;
            uint4 ku, vu;
            unsigned int *kw = &ku.x, *vw = &vu.x;
            float r0, r1;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                kw[e] = pack_bf16(kn[2 * e], kn[2 * e + 1], r0, r1);
                vw[e] = pack_bf16(vn[2 * e], vn[2 * e + 1], r0, r1);
            }
            *reinterpret_cast<uint4 *>(dk + cc * 8) = ku;
            *reinterpret_cast<uint4 *>(dv + cc * 8) = vu;
        }
    };
    auto prologue = [&]() {
#pragma unroll
        for (int i = 0; i < STAGES - 1; i++) {
            if (i < nt)
                load_tile(i);
            cp_async_commit(); /* one group per slot, loaded or not: the wait counts stay uniform */
        }
    };
    /* rows < pos are earlier forward calls' (complete); row pos is appended by the kernel just before
     * (FUSED: by this kernel, put from s_new after the wait, so every warp copies the rest before it) */
    const int np = min(nt, STAGES - 1);
    const bool early = FUSED || np == 0 || min(end, start + (warp + ADM_WARPS * (np - 1) + 1) * ADM_BN) <= pos;
    if (early)
        prologue();
    if (FUSED) /* after the copies are issued */
        adq_rope_table<D, ADM_WARPS * 32>(a, pos, s_cs);
    pdl_wait();
    tl.waited();
    if (FUSED) {
        __syncthreads(); /* s_cs */
        adq_stage<D, ADM_WARPS>(a, g, pos, own_new, s_new, s_cs);
        __syncthreads(); /* s_new: every warp's q fragments, the new row */
        if (new_tile >= 0 && new_tile < np) /* a prologue tile */
            put_new(new_tile);
    }
    if (!early)
        prologue();

    /* Q^T as B fragments: lane (gq, tq) holds head gq, dims 16kk + 2tq, +1 (b0) and +8, +9 (b1) */
    const int gq = lane >> 2, tq = lane & 3;
    unsigned int qb[D / 16][2];
    {
        const bool live = gq < G;
        const float *qp = FUSED ? s_new + (size_t)(live ? gq : 0) * D + 2 * tq
                                : a.q + ((size_t)g * G + (live ? gq : 0)) * D + 2 * tq;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            const float2 lo = live ? *reinterpret_cast<const float2 *>(qp + kk * 16) : make_float2(0.0f, 0.0f);
            const float2 hi = live ? *reinterpret_cast<const float2 *>(qp + kk * 16 + 8) : make_float2(0.0f, 0.0f);
            float r0, r1;
            qb[kk][0] = pack_bf16(lo.x, lo.y, r0, r1);
            qb[kk][1] = pack_bf16(hi.x, hi.y, r0, r1);
        }
    }
    const float sl2 = rsqrtf((float)D) * 1.4426950408889634f; /* scale * log2(e) */
    /* O^T accumulators: tile dp = dims 16dp + gq (c0, c1) and + 8 (c2, c3), heads 2tq (c0, c2), 2tq + 1 */
    float o[D / 16][4];
#pragma unroll
    for (int dp = 0; dp < D / 16; dp++)
        o[dp][0] = o[dp][1] = o[dp][2] = o[dp][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* heads 2tq, 2tq + 1; l over this lane's keys */
    const unsigned int sel = (gq & 1) ? 0x7632u : 0x5410u;   /* high or low bf16 halves of two words */
    const int src0 = 8 * tq + (gq >> 1), src1 = src0 + 4;     /* lanes holding keys 2tq, 2tq + 1 */
    /* ldmatrix row addresses: K (non-trans) matrices (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7,
     * d 8-15), (keys 8-15, d 8-15) = a0..a3 of S^T; V (.trans) matrices (keys 0-7, d 0-7), (keys 0-7,
     * d 8-15), (keys 8-15, d 0-7), (keys 8-15, d 8-15) = a0..a3 of O^T (rows = dims, k = keys) */
    const int krow = ((lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 8 * (lane >> 4);
    const int vrow = ((lane & 7) + 8 * (lane >> 4)) * LD + 8 * ((lane >> 3) & 1);

    for (int i = 0; i < nt; i++) {
        if (i + STAGES - 1 < nt) {
            load_tile(i + STAGES - 1);
            if (FUSED && i + STAGES - 1 == new_tile)
                put_new(new_tile);
        }
        cp_async_commit();
        cp_async_wait<STAGES - 1>(); /* tile i landed (this lane's copies) */
        __syncwarp();                /* ... and every lane's */
        const __nv_bfloat16 *kb = sK + (i % STAGES) * SH::TILE, *vb = sV + (i % STAGES) * SH::TILE;

        /* S^T (16 keys x 8 heads): two accumulator chains over the dims */
        float sa[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int kk = 0; kk < D / 16; kk += 2) {
            unsigned int ka[4], kb2[4];
            ldsm_x4(ka, kb + krow + kk * 16);
            ldsm_x4(kb2, kb + krow + (kk + 1) * 16);
            mma_bf16(sa, ka, qb[kk][0], qb[kk][1]);
            mma_bf16(sb, kb2, qb[kk + 1][0], qb[kk + 1][1]);
        }
        /* mask keys past the split; online softmax per head (column): keys are spread over gq */
        const int k0 = start + (warp + ADM_WARPS * i) * ADM_BN;
        float sc[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
            sc[e] = k0 + gq + 8 * (e >> 1) < end ? (sa[e] + sb[e]) * sl2 : -INFINITY;
        float mx[2] = {fmaxf(sc[0], sc[2]), fmaxf(sc[1], sc[3])};
        float corr[2], mu[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 4));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 8));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 16));
            const float mn = fmaxf(m[h], mx[h]);
            mu[h] = mn == -INFINITY ? 0.0f : mn;
            corr[h] = exp2f(m[h] - mu[h]);
            m[h] = mn;
        }
        float p0, p1, p2, p3;
        const unsigned int plo = pack_bf16(exp2f(sc[0] - mu[0]), exp2f(sc[1] - mu[1]), p0, p1); /* key gq */
        const unsigned int phi = pack_bf16(exp2f(sc[2] - mu[0]), exp2f(sc[3] - mu[1]), p2, p3); /* key gq + 8 */
        l[0] = l[0] * corr[0] + p0 + p2;
        l[1] = l[1] * corr[1] + p1 + p3;
        /* P^T B fragments: b0 = keys 2tq, 2tq + 1 of head gq, b1 = keys 2tq + 8, 2tq + 9 */
        const unsigned int x0 = __shfl_sync(0xffffffffu, plo, src0), x1 = __shfl_sync(0xffffffffu, plo, src1);
        const unsigned int y0 = __shfl_sync(0xffffffffu, phi, src0), y1 = __shfl_sync(0xffffffffu, phi, src1);
        const unsigned int pb0 = __byte_perm(x0, x1, sel), pb1 = __byte_perm(y0, y1, sel);
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            o[dp][0] *= corr[0];
            o[dp][1] *= corr[1];
            o[dp][2] *= corr[0];
            o[dp][3] *= corr[1];
            unsigned int va[4];
            ldsm_x4_trans(va, vb + vrow + dp * 16);
            mma_bf16(o[dp], va, pb0, pb1);
        }
        __syncwarp(); /* stage i % STAGES is refilled by a later iteration */
    }
    cp_async_wait<0>();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 4);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 8);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 16);
    }
    __syncthreads(); /* every warp is done with its stages: the slab below reuses them */
    float *slab = reinterpret_cast<float *>(adm_smem); /* [ADM_WARPS][8 heads][D] */
    if (gq == 0) {
        s_m[warp][2 * tq] = m[0];
        s_m[warp][2 * tq + 1] = m[1];
        s_l[warp][2 * tq] = l[0];
        s_l[warp][2 * tq + 1] = l[1];
    }
    {
        float *w0 = slab + (size_t)(warp * 8 + 2 * tq) * D + gq, *w1 = w0 + D;
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            w0[16 * dp] = o[dp][0];
            w1[16 * dp] = o[dp][1];
            w0[16 * dp + 8] = o[dp][2];
            w1[16 * dp + 8] = o[dp][3];
        }
    }
    __syncthreads();
    const float *gate = a.qkv + (size_t)g * G * 2 * D + D; /* token 0; head h at + h * 2D */
    for (int idx = threadIdx.x; idx < G * D; idx += ADM_WARPS * 32) {
        const int h = idx / D, d = idx % D;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < ADM_WARPS; w++)
            M = fmaxf(M, s_m[w][h]);
        float O = 0.0f, Ls = 0.0f;
#pragma unroll
        for (int w = 0; w < ADM_WARPS; w++) {
            const float f = s_m[w][h] == -INFINITY ? 0.0f : exp2f(s_m[w][h] - M);
            O = fmaf(f, slab[(size_t)(w * 8 + h) * D + d], O);
            Ls = fmaf(f, s_l[w][h], Ls);
        }
        if (n_splits == 1) {
            a.out[((size_t)g * G + h) * D + d] = O / Ls * sigmoid_f(gate[(size_t)h * 2 * D + d]);
        } else {
            const size_t row = ((size_t)g * n_splits + s) * G + h;
            a.part_o[row * D + d] = O;
            if (d == 0) {
                a.part_ml[row * 2] = M;
                a.part_ml[row * 2 + 1] = Ls;
            }
        }
    }
}

/* Combine the splits of decode attention: block (query head, 64-dim slice), 256 threads = 64 dims x 4
 * groups of splits; the split weights exp2(m_s - M) / L once per block in shared memory. The (max, sum)
 * pairs, the first U partial outputs of every thread and the output gate are loaded in one batch right
 * after the PDL wait (one memory round trip before the first barrier instead of three in a row). */
__global__ void __launch_bounds__(ADM_MERGE_DIMS *ADM_MERGE_GROUPS) attention_decode_merge_kernel(attn_args a)
{
    constexpr int U = 16; /* partial outputs in flight per thread per pass */
    __shared__ float s_f[ADM_MAX_SPLITS];
    __shared__ float s_part[ADM_MERGE_GROUPS][ADM_MERGE_DIMS];
    tl_block<1> tl(a.timeline);
    pdl_trigger(); /* o_proj may launch and prefetch its weights (it reads nothing of ours before its wait) */
    const int hg = blockIdx.x, G = a.n_heads / a.n_kv, g = hg / G, h = hg % G, D = a.head_dim;
    const int n_splits = a.n_splits, tid = threadIdx.x;
    const int L = *a.pos + 1; /* written by the previous forward call (complete) */
    const int chunk = adm_chunk(L, n_splits, a.min_chunk);
    const int n_used = (L + chunk - 1) / chunk;
    const int dl = tid % ADM_MERGE_DIMS, grp = tid / ADM_MERGE_DIMS, d = blockIdx.y * ADM_MERGE_DIMS + dl;
    const float *pml = a.part_ml + ((size_t)g * n_splits * G + h) * 2;     /* split sp at + sp * 2G */
    const float *po = a.part_o + ((size_t)g * n_splits * G + h) * D + d; /* split sp at + sp * G * D */
    pdl_wait();
    tl.waited();
    /* one batch of loads after the wait: the splits' (max, sum) by warp 0, every thread's first pass of
     * partial outputs, the output gate; the weights' barrier comes after all of them are in flight */
    float ms[ADM_MAX_SPLITS / 32], ls[ADM_MAX_SPLITS / 32];
    if (tid < 32) {
#pragma unroll
        for (int q = 0; q < ADM_MAX_SPLITS / 32; q++) {
            const int sp = tid + 32 * q;
            ms[q] = sp < n_used ? __ldcg(pml + (size_t)sp * 2 * G) : -INFINITY;
            ls[q] = sp < n_used ? __ldcg(pml + (size_t)sp * 2 * G + 1) : 0.0f;
        }
    }
    float v[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int sp = grp + u * ADM_MERGE_GROUPS;
        v[u] = d < D && sp < n_used ? __ldcg(po + (size_t)sp * G * D) : 0.0f;
    }
    const float gate = grp == 0 && d < D ? __ldcg(a.qkv + (size_t)hg * 2 * D + D + d) : 0.0f;
    if (tid < 32) {
        float M = -INFINITY;
#pragma unroll
        for (int q = 0; q < ADM_MAX_SPLITS / 32; q++)
            M = fmaxf(M, ms[q]);
        M = warp_max(M);
        float Ls = 0.0f;
#pragma unroll
        for (int q = 0; q < ADM_MAX_SPLITS / 32; q++)
            Ls += ms[q] == -INFINITY ? 0.0f : ls[q] * exp2f(ms[q] - M);
        Ls = warp_sum(Ls);
#pragma unroll
        for (int q = 0; q < ADM_MAX_SPLITS / 32; q++) {
            const int sp = tid + 32 * q;
            if (sp < n_used)
                s_f[sp] = ms[q] == -INFINITY ? 0.0f : exp2f(ms[q] - M) / Ls;
        }
    }
    __syncthreads();
    float acc = 0.0f;
    if (d < D) {
        for (int sp0 = grp;;) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int sp = sp0 + u * ADM_MERGE_GROUPS;
                if (sp < n_used)
                    acc = fmaf(v[u], s_f[sp], acc);
            }
            sp0 += U * ADM_MERGE_GROUPS;
            if (sp0 >= n_used)
                break;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int sp = sp0 + u * ADM_MERGE_GROUPS;
                v[u] = sp < n_used ? __ldcg(po + (size_t)sp * G * D) : 0.0f;
            }
        }
    }
    s_part[grp][dl] = acc;
    __syncthreads();
    if (grp == 0 && d < D) {
        float O = 0.0f;
#pragma unroll
        for (int q = 0; q < ADM_MERGE_GROUPS; q++)
            O += s_part[q][dl];
        a.out[(size_t)hg * D + d] = O * sigmoid_f(gate);
    }
}

template <int D, bool FUSED> static cudaError_t adm_launch(const attn_args &a, cudaStream_t s)
{
    constexpr size_t smem = adm_shape<D>::SMEM;
    cudaError_t e = cudaFuncSetAttribute(attention_decode_mma_kernel<D, FUSED>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) { /* a GPU with less shared memory per block (sm_80 at D = 256): the SIMT kernel */
        cudaGetLastError();
        return cudaErrorNotSupported;
    }
    e = launch_pdl(attention_decode_mma_kernel<D, FUSED>, dim3(a.n_splits, a.n_kv), dim3(ADM_WARPS * 32), smem, s, a);
    if (e != cudaSuccess || a.n_splits == 1)
        return e;
    return launch_pdl(attention_decode_merge_kernel, dim3(a.n_heads, (D + ADM_MERGE_DIMS - 1) / ADM_MERGE_DIMS),
                      dim3(ADM_MERGE_DIMS * ADM_MERGE_GROUPS), 0, s, a);
}

bool attention_decode_mma_supported(const attn_args &a, int n_tokens)
{
    return n_tokens == 1 && !a.k_cache_f32 && a.n_kv > 0 && a.n_heads % a.n_kv == 0 && a.n_heads / a.n_kv <= 8 &&
           (a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256) && a.n_splits >= 1 &&
           a.n_splits <= ADM_MAX_SPLITS && (a.n_splits == 1 || (a.part_o && a.part_ml));
}

template <typename KV, int G>
static cudaError_t att_g(const attn_args &a, dim3 grid, cudaStream_t s)
{
    switch (a.head_dim / 32) {
    case 2: return launch_pdl(attention_kernel<KV, G, 2>, grid, dim3(ATT_WARPS * 32), 0, s, a);
    case 4: return launch_pdl(attention_kernel<KV, G, 4>, grid, dim3(ATT_WARPS * 32), 0, s, a);
    case 8: return launch_pdl(attention_kernel<KV, G, 8>, grid, dim3(ATT_WARPS * 32), 0, s, a);
    default: return cudaErrorInvalidValue;
    }
}

template <typename KV>
static cudaError_t att_kv(const attn_args &a, dim3 grid, cudaStream_t s)
{
    switch (a.n_heads / a.n_kv) {
    case 1: return att_g<KV, 1>(a, grid, s);
    case 2: return att_g<KV, 2>(a, grid, s);
    case 3: return att_g<KV, 3>(a, grid, s); /* lily-tiny: 6 query heads over 2 KV heads */
    case 4: return att_g<KV, 4>(a, grid, s);
    case 8: return att_g<KV, 8>(a, grid, s);
    default: return cudaErrorInvalidValue;
    }
}

bool attention_decode_fused_supported(const attn_args &a, int n_tokens)
{
    return attention_decode_mma_supported(a, n_tokens) && a.q_norm && a.k_norm && a.rot_dim >= 0 &&
           a.rot_dim % 2 == 0 && a.rot_dim <= a.head_dim;
}

attn_decode_kernel attn_decode_kernel_choose(const attn_args &a, int n_tokens)
{
    if (attention_decode_fused_supported(a, n_tokens))
        return ATTN_DECODE_MMA_FUSED;
    return attention_decode_mma_supported(a, n_tokens) ? ATTN_DECODE_MMA : ATTN_DECODE_SIMT;
}

template <bool FUSED> static cudaError_t adm_launch_d(const attn_args &a, cudaStream_t s)
{
    switch (a.head_dim) {
    case 64: return adm_launch<64, FUSED>(a, s);
    case 128: return adm_launch<128, FUSED>(a, s);
    case 256: return adm_launch<256, FUSED>(a, s);
    default: return cudaErrorNotSupported;
    }
}

cudaError_t launch_attention(const attn_args &a, int n_tokens, cudaStream_t s)
{
    const int k = a.decode_kernel != ATTN_DECODE_AUTO ? a.decode_kernel : attn_decode_kernel_choose(a, n_tokens);
    if (k == ATTN_DECODE_MMA_FUSED) {
        if (!attention_decode_fused_supported(a, n_tokens))
            return cudaErrorInvalidValue;
        cudaError_t e = adm_launch_d<true>(a, s);
        if (e != cudaErrorNotSupported)
            return e;
        /* a GPU with less shared memory per block: the separate front end (q into a.q), then the SIMT kernel */
        attn_args b = a;
        b.q_fused = 0;
        b.decode_kernel = ATTN_DECODE_SIMT;
        b.timeline = NULL;
        e = launch_qk_norm_rope_append(b, n_tokens, s);
        b.timeline = a.timeline;
        return e != cudaSuccess ? e : launch_attention(b, n_tokens, s);
    }
    if (a.q_fused) /* the kernels below read the normed + rotated a.q */
        return cudaErrorInvalidValue;
    if (k == ATTN_DECODE_MMA && attention_decode_mma_supported(a, n_tokens)) {
        const cudaError_t e = adm_launch_d<false>(a, s);
        if (e != cudaErrorNotSupported)
            return e;
    }
    if (a.head_dim % 32 || a.n_heads % a.n_kv || (a.n_splits > 1 && n_tokens != 1) || a.n_splits > a.head_dim ||
        !a.k_cache_f32 != !a.v_cache_f32)
        return cudaErrorInvalidValue;
    dim3 grid(a.n_splits, a.n_kv, n_tokens);
    return a.k_cache_f32 ? att_kv<float>(a, grid, s) : att_kv<__nv_bfloat16>(a, grid, s);
}
