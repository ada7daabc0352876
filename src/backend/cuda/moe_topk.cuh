/* moe_topk.cuh — the router's top-k for one token, computed by one whole block (MODEL.md §4.5):
 * experts ranked by logit (ties to the lower expert id), weights = softmax over the selected logits
 * (= softmax over all E renormalised over the top k), fp32. Used by moe_gate_up (per block, prefill)
 * and by the router GEMV's last block in decode (gemv_decode.cu), which publishes it once per token.
 */
#ifndef LILY_MOE_TOPK_CUH
#define LILY_MOE_TOPK_CUH

#include "cuda_common.cuh"

#define MOE_MAX_K 16
#define MOE_MAX_E 512

/* Top-k of the router logits of one token by the whole block (E <= MOE_MAX_E): each thread ranks its
 * experts by counting those that beat them (larger logit, or equal logit and lower id), so slot k gets
 * the expert of rank k; weights are softmax over all E renormalised over the top k (= softmax over the
 * selected logits). idx/w in shared memory; ends with __syncthreads. */
static __device__ void moe_topk_block(const float *logits, int E, int K, int *idx, float *w, float *s_l)
{
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        s_l[e] = __ldcg(logits + e); /* may have been written by other blocks of this kernel */
    if (threadIdx.x < K)
        idx[threadIdx.x] = 0; /* stays valid even if NaN logits break the ranking */
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const float v = s_l[e];
        int rank = 0;
        for (int o = 0; o < E; o++) {
            const float u = s_l[o];
            rank += (u > v) || (u == v && o < e);
        }
        if (rank < K)
            idx[rank] = e;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        const float mx = s_l[idx[0]];
        const float p = lane < K ? expf(s_l[idx[lane]] - mx) : 0.0f;
        const float sum = warp_sum(p);
        if (lane < K)
            w[lane] = p / sum;
    }
    __syncthreads();
}

#endif
