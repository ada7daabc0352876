/* moe_topk.cuh — the router's top-k for one token, computed by one whole block (MODEL.md §4.5):
 * experts ranked by logit (ties to the lower expert id), weights = softmax over the selected logits
 * (= softmax over all E renormalised over the top k), fp32. One warp ranks (K rounds of a warp argmax,
 * ~25 instructions per round for 256 experts; the earlier rank-by-counting over the block cost every
 * thread ~5 instructions per expert, ~2.7 µs per decode MoE block). Used by the decode MoE kernels (per
 * block), the router GEMV's last block (gemv_decode.cu, knob router_topk) and the prefill top-k kernel.
 */
#ifndef LILY_MOE_TOPK_CUH
#define LILY_MOE_TOPK_CUH

#include "cuda_common.cuh"

#define MOE_MAX_K 16
#define MOE_MAX_E 512

/* The logit held in an argmax_key (cuda_common.cuh), bit for bit. */
__device__ __forceinline__ float moe_key_value(unsigned long long k)
{
    const unsigned int u = (unsigned int)(k >> 32);
    return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}

/* Top-k of E <= 32·PER router logits of one token by the 32 lanes of one warp: lane l holds experts
 * e = l + 32j (j < PER) as order-preserving 32-bit keys (argmax_key's high word) and a taken mask; each
 * of the K rounds takes the lane's best untaken expert (lower id on ties), then a warp max over the
 * 64-bit argmax_key (larger logit, then the lower expert id: the CPU twin's order); the owner marks the
 * winner taken. Lane k < K ends with slot k's key. Weights = softmax over the selected logits
 * (= softmax over all E renormalised over the top k). */
template <int PER>
static __device__ void moe_topk_warp_n(const float *logits, int E, int K, int *idx, float *w)
{
    const int lane = threadIdx.x & 31;
    unsigned int u[PER];
    unsigned int taken = 0u;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int e = lane + 32 * j;
        u[j] = e < E ? (unsigned int)(argmax_key(__ldcg(logits + e), e) >> 32) : 0u; /* may be this kernel's */
        if (e >= E)
            taken |= 1u << j;
    }
    unsigned long long mine = 0ull;
    for (int k = 0; k < K; k++) {
        int bj = -1;
        unsigned int bu = 0u;
#pragma unroll
        for (int j = 0; j < PER; j++)
            if (!((taken >> j) & 1u) && (bj < 0 || u[j] > bu)) {
                bj = j;
                bu = u[j];
            }
        /* no untaken expert left in this lane: key 0 (every real key is > 0: its low word is ~id) */
        unsigned long long best = bj < 0 ? 0ull : ((unsigned long long)bu << 32) | (0xffffffffu - (unsigned int)(lane + 32 * bj));
        const unsigned long long own = best;
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
            best = other > best ? other : best;
        }
        if (own == best && bj >= 0)
            taken |= 1u << bj;
        if (lane == k)
            mine = best;
    }
    const float v = moe_key_value(mine), mx = __shfl_sync(0xffffffffu, v, 0);
    const float p = lane < K ? expf(v - mx) : 0.0f;
    const float sum = warp_sum(p);
    if (lane < K) {
        idx[lane] = mine ? argmax_key_row(mine) : 0;
        w[lane] = p / sum;
    }
}

/* moe_topk_warp_n for E <= 1024 (more experts: nothing is written). Called by every lane of one warp. */
static __device__ void moe_topk_warp(const float *logits, int E, int K, int *idx, float *w)
{
    if (E <= 256)
        moe_topk_warp_n<8>(logits, E, K, idx, w);
    else if (E <= 512)
        moe_topk_warp_n<16>(logits, E, K, idx, w);
    else if (E <= 1024)
        moe_topk_warp_n<32>(logits, E, K, idx, w);
}

/* The same for a whole block: warp 0 ranks (moe_topk_warp) into idx/w (shared memory), everyone waits;
 * ends with __syncthreads. */
static __device__ void moe_topk_block(const float *logits, int E, int K, int *idx, float *w)
{
    if (threadIdx.x < 32)
        moe_topk_warp(logits, E, K, idx, w);
    __syncthreads();
}

#endif
