/* moe_prefill.cu — the MoE routing of the prefill path, on the device with no host sync
 * (docs/MODEL.md §4.5): top-k per token, the expert plan (histogram of rows per expert, exclusive scan into
 * offsets, scatter of (token, slot) into expert-grouped positions, tile map for the grouped GEMM), and
 * the combine (routing-weighted sum of the per-slot expert outputs + sigmoid-gated shared expert,
 * added to the residual stream; deterministic: each token sums its own slots in slot order).
 *
 *   moe_topk_kernel:    grid n, 256 threads (rank by counting, ties to the lower expert id; softmax
 *                       over the selected logits = softmax renormalised over the top k)
 *   moe_plan_count_kernel + moe_plan_place_kernel: the plan over chunks of 64 tokens, one block each
 *                       (256 threads), positions within an expert in token order
 *   moe_combine_kernel: grid n, 256 threads, float4 over the hidden dim
 */
#include "moe.cuh"
#include "moe_topk.cuh"

#define MOE_PF_MAX_E 1024
#define MOE_PF_MAX_K 32
#define MOE_TOPK_THREADS 256

/* One warp per token (MOE_TOPK_THREADS / 32 tokens per block): the same ranking and renormalised
 * softmax as decode (moe_topk.cuh), written straight to idx / w [n][K]. */
__global__ void __launch_bounds__(MOE_TOPK_THREADS)
moe_topk_kernel(const float *logits, int stride, int E, int K, int n, int *idx, float *w)
{
    const int t = blockIdx.x * (MOE_TOPK_THREADS / 32) + (threadIdx.x >> 5);
    if (t >= n)
        return;
    moe_topk_warp(logits + (size_t)t * stride, E, K, idx + (size_t)t * K, w + (size_t)t * K);
}

cudaError_t launch_moe_topk(const float *logits, int stride, int E, int K, int n, int *idx, float *w,
                            cudaStream_t s)
{
    if (E < 1 || E > MOE_PF_MAX_E || K < 1 || K > MOE_PF_MAX_K || K > E || n < 1)
        return cudaErrorInvalidValue;
    constexpr int per_block = MOE_TOPK_THREADS / 32;
    moe_topk_kernel<<<(n + per_block - 1) / per_block, MOE_TOPK_THREADS, 0, s>>>(logits, stride, E, K, n, idx, w);
    return cudaGetLastError();
}

/* ---- the expert plan ---------------------------------------------------------------------------------
 * Chunk b = tokens [64b, 64b + 64) of the n·K (token, slot) entries. Per chunk and expert, a 64-bit mask
 * of the chunk's tokens that chose the expert (shared-memory atomicOr: order-free, so deterministic; a
 * token picks an expert at most once). Kernel 1 writes each chunk's counts (popcount); kernel 2 (one
 * block per chunk again) sums the counts of all chunks per expert (totals) and of the chunks before its
 * own (its base within the expert), scans the totals (offsets) and tiles over experts, and places each
 * entry at offsets[e] + base + the number of the chunk's earlier tokens in the mask: positions within an
 * expert are in token order. Block 0 also writes offsets, the tile map and the tile count. */
#define MOE_PLAN2_THREADS 256
#define MOE_PLAN2_TOKENS 64
#define MOE_PLAN2_EPT (MOE_PF_MAX_E / MOE_PLAN2_THREADS) /* experts per thread, at most */

/* s_mask[e] := the chunk's tokens (bit t - 64·blockIdx.x) that chose expert e; ends with __syncthreads. */
__device__ __forceinline__ void plan2_masks(const int *idx, int n, int K, int E, unsigned long long *s_mask)
{
    for (int e = threadIdx.x; e < E; e += MOE_PLAN2_THREADS)
        s_mask[e] = 0ull;
    __syncthreads();
    const int nk = n * K, i0 = blockIdx.x * MOE_PLAN2_TOKENS * K;
    for (int i = threadIdx.x; i < MOE_PLAN2_TOKENS * K; i += MOE_PLAN2_THREADS)
        if (i0 + i < nk)
            atomicOr(&s_mask[min(max(idx[i0 + i], 0), E - 1)], 1ull << (i / K));
    __syncthreads();
}

__global__ void __launch_bounds__(MOE_PLAN2_THREADS) moe_plan_count_kernel(const int *idx, int n, int K, int E, int *counts)
{
    __shared__ unsigned long long s_mask[MOE_PF_MAX_E];
    plan2_masks(idx, n, K, E, s_mask);
    for (int e = threadIdx.x; e < E; e += MOE_PLAN2_THREADS)
        counts[(size_t)blockIdx.x * E + e] = __popcll(s_mask[e]);
}

__global__ void __launch_bounds__(MOE_PLAN2_THREADS)
moe_plan_place_kernel(const int *idx, int n, int K, int E, int T, const int *counts, int *offsets, int *gather,
                      int *slot_pos, int *tile_expert, int *tile_start, int *n_tiles)
{
    __shared__ unsigned long long s_mask[MOE_PF_MAX_E];
    __shared__ int s_base[MOE_PF_MAX_E];
    __shared__ int s_wsum[MOE_PLAN2_THREADS / 32][2];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nb = gridDim.x, b = blockIdx.x;
    const int ept = (E + MOE_PLAN2_THREADS - 1) / MOE_PLAN2_THREADS, e0 = tid * ept; /* experts e0 .. e0+ept-1 */
    int tot[MOE_PLAN2_EPT], pre[MOE_PLAN2_EPT];
    int my_rows = 0, my_tiles = 0;
#pragma unroll
    for (int j = 0; j < MOE_PLAN2_EPT; j++) {
        tot[j] = pre[j] = 0;
        const int e = e0 + j;
        if (j < ept && e < E) {
            /* chunks before this block, then the rest (4 loads in flight per step) */
            int c = 0;
            for (; c + 4 <= nb; c += 4) {
                const int v0 = counts[(size_t)c * E + e], v1 = counts[(size_t)(c + 1) * E + e];
                const int v2 = counts[(size_t)(c + 2) * E + e], v3 = counts[(size_t)(c + 3) * E + e];
                pre[j] += (c < b ? v0 : 0) + (c + 1 < b ? v1 : 0) + (c + 2 < b ? v2 : 0) + (c + 3 < b ? v3 : 0);
                tot[j] += v0 + v1 + v2 + v3;
            }
            for (; c < nb; c++) {
                const int v = counts[(size_t)c * E + e];
                pre[j] += c < b ? v : 0;
                tot[j] += v;
            }
            my_rows += tot[j];
            my_tiles += (tot[j] + T - 1) / T;
        }
    }
    /* exclusive scan of (rows, tiles) over the threads = over experts in order */
    int sr = my_rows, st = my_tiles;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int vr = __shfl_up_sync(0xffffffffu, sr, d), vt = __shfl_up_sync(0xffffffffu, st, d);
        if (lane >= d) {
            sr += vr;
            st += vt;
        }
    }
    if (lane == 31) {
        s_wsum[warp][0] = sr;
        s_wsum[warp][1] = st;
    }
    __syncthreads();
    int er = sr - my_rows, et = st - my_tiles; /* exclusive within the warp, then the warps before */
    for (int w = 0; w < warp; w++) {
        er += s_wsum[w][0];
        et += s_wsum[w][1];
    }
#pragma unroll
    for (int j = 0; j < MOE_PLAN2_EPT; j++) {
        const int e = e0 + j;
        if (j < ept && e < E) {
            s_base[e] = er + pre[j];
            if (b == 0) {
                offsets[e] = er;
                const int tl = (tot[j] + T - 1) / T;
                for (int q = 0; q < tl; q++) {
                    tile_expert[et + q] = e;
                    tile_start[et + q] = er + q * T;
                }
            }
            er += tot[j];
            et += (tot[j] + T - 1) / T;
        }
    }
    if (b == 0 && tid == MOE_PLAN2_THREADS - 1) { /* the last thread ends with the totals */
        offsets[E] = er;
        *n_tiles = et;
    }
    plan2_masks(idx, n, K, E, s_mask); /* its first barrier also publishes s_base */
    const int nk = n * K, i0 = b * MOE_PLAN2_TOKENS * K, t0 = b * MOE_PLAN2_TOKENS;
    for (int i = tid; i < MOE_PLAN2_TOKENS * K; i += MOE_PLAN2_THREADS) {
        if (i0 + i >= nk)
            break;
        const int e = min(max(idx[i0 + i], 0), E - 1), tl = i / K;
        const int pos = s_base[e] + __popcll(s_mask[e] & ((1ull << tl) - 1ull));
        gather[pos] = t0 + tl;
        slot_pos[i0 + i] = pos;
    }
}

cudaError_t launch_moe_plan(const int *idx, int n, int K, int E, int T, int *offsets, int *gather, int *slot_pos,
                            int *tile_expert, int *tile_start, int *n_tiles, int *counts, cudaStream_t s)
{
    if (E < 1 || E > MOE_PF_MAX_E || K < 1 || K > MOE_PF_MAX_K || n < 1 || T < 1 || !counts)
        return cudaErrorInvalidValue;
    const int nb = moe_plan_chunks(n);
    moe_plan_count_kernel<<<nb, MOE_PLAN2_THREADS, 0, s>>>(idx, n, K, E, counts);
    moe_plan_place_kernel<<<nb, MOE_PLAN2_THREADS, 0, s>>>(idx, n, K, E, T, counts, offsets, gather, slot_pos,
                                                          tile_expert, tile_start, n_tiles);
    return cudaGetLastError();
}

__global__ void __launch_bounds__(256)
moe_combine_kernel(float *out, int hidden, int K, const float *w, const int *slot_pos, const float *y,
                   const float *ysh, const float *logits, int logit_stride, int E)
{
    __shared__ int s_pos[MOE_PF_MAX_K];
    __shared__ float s_w[MOE_PF_MAX_K];
    const int t = blockIdx.x;
    if (threadIdx.x < K) {
        s_pos[threadIdx.x] = slot_pos[(size_t)t * K + threadIdx.x];
        s_w[threadIdx.x] = w[(size_t)t * K + threadIdx.x];
    }
    __syncthreads();
    const float sg = sigmoid_f(logits[(size_t)t * logit_stride + E]);
    const int h4 = hidden / 4;
    float4 *o = reinterpret_cast<float4 *>(out + (size_t)t * hidden);
    const float4 *sh = reinterpret_cast<const float4 *>(ysh + (size_t)t * hidden);
    for (int c = threadIdx.x; c < h4; c += blockDim.x) {
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int k = 0; k < K; k++) {
            const float4 v = reinterpret_cast<const float4 *>(y + (size_t)s_pos[k] * hidden)[c];
            acc.x = fmaf(s_w[k], v.x, acc.x);
            acc.y = fmaf(s_w[k], v.y, acc.y);
            acc.z = fmaf(s_w[k], v.z, acc.z);
            acc.w = fmaf(s_w[k], v.w, acc.w);
        }
        const float4 v = sh[c];
        acc.x = fmaf(sg, v.x, acc.x);
        acc.y = fmaf(sg, v.y, acc.y);
        acc.z = fmaf(sg, v.z, acc.z);
        acc.w = fmaf(sg, v.w, acc.w);
        float4 r = o[c];
        r.x += acc.x;
        r.y += acc.y;
        r.z += acc.z;
        r.w += acc.w;
        o[c] = r;
    }
}

cudaError_t launch_moe_combine(float *out, int hidden, int n, int K, const float *w, const int *slot_pos,
                               const float *y, const float *ysh, const float *logits, int logit_stride, int E,
                               cudaStream_t s)
{
    if (hidden % 4 || K < 1 || K > MOE_PF_MAX_K || n < 1)
        return cudaErrorInvalidValue;
    moe_combine_kernel<<<n, 256, 0, s>>>(out, hidden, K, w, slot_pos, y, ysh, logits, logit_stride, E);
    return cudaGetLastError();
}
