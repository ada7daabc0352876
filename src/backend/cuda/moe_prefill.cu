/* moe_prefill.cu — the MoE routing of the prefill path, on the device with no host sync
 * (MODEL.md §4.5): top-k per token, the expert plan (histogram of rows per expert, exclusive scan into
 * offsets, scatter of (token, slot) into expert-grouped positions, tile map for the grouped GEMM), and
 * the combine (routing-weighted sum of the per-slot expert outputs + sigmoid-gated shared expert,
 * added to the residual stream; deterministic: each token sums its own slots in slot order).
 *
 *   moe_topk_kernel:    grid n, 256 threads (rank by counting, ties to the lower expert id; softmax
 *                       over the selected logits = softmax renormalised over the top k)
 *   moe_plan_kernel:    1 block of 1024 threads (shared-memory histogram and Hillis-Steele scans; each
 *                       thread's reads of idx are issued 8 at a time before their atomics)
 *   moe_combine_kernel: grid n, 256 threads, float4 over the hidden dim
 */
#include "gemm_prefill.cuh"
#include "moe_topk.cuh"

#define MOE_PF_MAX_E 1024
#define MOE_PF_MAX_K 32
#define MOE_TOPK_THREADS 256
#define MOE_PLAN_THREADS 1024
#define MOE_PLAN_BATCH 8

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

/* The experts of slots i0 + u·MOE_PLAN_THREADS (u < MOE_PLAN_BATCH), clamped to [0, E); -1 past nk. The
 * loads are issued together: the plan's loops are latency-bound. */
__device__ __forceinline__ void plan_load_experts(const int *idx, int i0, int nk, int E, int (&e)[MOE_PLAN_BATCH])
{
#pragma unroll
    for (int u = 0; u < MOE_PLAN_BATCH; u++) {
        const int i = i0 + u * MOE_PLAN_THREADS;
        e[u] = i < nk ? min(max(idx[i], 0), E - 1) : -1;
    }
}

__global__ void __launch_bounds__(MOE_PLAN_THREADS)
moe_plan_kernel(const int *idx, int n, int K, int E, int T, int *offsets, int *gather, int *slot_pos,
                int *tile_expert, int *tile_start, int *n_tiles)
{
    __shared__ int s_cnt[MOE_PLAN_THREADS], s_off[MOE_PLAN_THREADS], s_toff[MOE_PLAN_THREADS];
    __shared__ int s_cur[MOE_PLAN_THREADS];
    const int tid = threadIdx.x;
    const int nk = n * K;
    s_cnt[tid] = 0;
    __syncthreads();
    /* MOE_PLAN_BATCH loads in flight per thread before their atomics (the loop is latency-bound) */
    for (int i0 = tid; i0 < nk; i0 += MOE_PLAN_THREADS * MOE_PLAN_BATCH) {
        int e[MOE_PLAN_BATCH];
        plan_load_experts(idx, i0, nk, E, e);
#pragma unroll
        for (int u = 0; u < MOE_PLAN_BATCH; u++)
            if (e[u] >= 0)
                atomicAdd(&s_cnt[e[u]], 1);
    }
    __syncthreads();
    const int c = tid < E ? s_cnt[tid] : 0;
    const int tl = (c + T - 1) / T;
    s_off[tid] = c;
    s_toff[tid] = tl;
    __syncthreads();
    for (int d = 1; d < MOE_PLAN_THREADS; d <<= 1) {
        const int v1 = tid >= d ? s_off[tid - d] : 0;
        const int v2 = tid >= d ? s_toff[tid - d] : 0;
        __syncthreads();
        s_off[tid] += v1;
        s_toff[tid] += v2;
        __syncthreads();
    }
    const int excl = s_off[tid] - c, texcl = s_toff[tid] - tl;
    if (tid < E) {
        offsets[tid] = excl;
        s_cur[tid] = excl;
        for (int j = 0; j < tl; j++) {
            tile_expert[texcl + j] = tid;
            tile_start[texcl + j] = excl + j * T;
        }
    }
    if (tid == E - 1) {
        offsets[E] = s_off[tid];
        *n_tiles = s_toff[tid];
    }
    __syncthreads();
    /* positions within an expert are taken in atomic order; every row's result is independent of its
     * tile mates, so the outputs do not depend on it */
    for (int i0 = tid; i0 < nk; i0 += MOE_PLAN_THREADS * MOE_PLAN_BATCH) {
        int e[MOE_PLAN_BATCH], pos[MOE_PLAN_BATCH];
        plan_load_experts(idx, i0, nk, E, e);
#pragma unroll
        for (int u = 0; u < MOE_PLAN_BATCH; u++)
            pos[u] = e[u] >= 0 ? atomicAdd(&s_cur[e[u]], 1) : 0;
#pragma unroll
        for (int u = 0; u < MOE_PLAN_BATCH; u++) {
            const int i = i0 + u * MOE_PLAN_THREADS;
            if (e[u] >= 0) {
                gather[pos[u]] = i / K;
                slot_pos[i] = pos[u];
            }
        }
    }
}

cudaError_t launch_moe_plan(const int *idx, int n, int K, int E, int T, int *offsets, int *gather, int *slot_pos,
                            int *tile_expert, int *tile_start, int *n_tiles, cudaStream_t s)
{
    if (E < 1 || E > MOE_PLAN_THREADS || K < 1 || n < 1 || T < 1)
        return cudaErrorInvalidValue;
    moe_plan_kernel<<<1, MOE_PLAN_THREADS, 0, s>>>(idx, n, K, E, T, offsets, gather, slot_pos, tile_expert,
                                                   tile_start, n_tiles);
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
