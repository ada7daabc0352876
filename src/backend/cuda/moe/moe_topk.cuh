/* moe_topk.cuh — the router's top-k for one token, computed by one whole block (docs/MODEL.md §4.5):
 * experts ranked by logit (ties to the lower expert id), weights = softmax over the selected logits
 * (= softmax over all E renormalised over the top k), fp32. One warp ranks (K rounds of a warp argmax over
 * keys kept in registers: a max tree per lane and two redux.sync per round; the earlier rank-by-counting
 * over the block cost every thread ~5 instructions per expert, ~2.7 µs per decode MoE block). Used by the
 * decode MoE kernels (per block) and the prefill top-k kernel.
 */
#ifndef LILY_MOE_TOPK_CUH
#define LILY_MOE_TOPK_CUH

#include "moe.cuh"
#include "backend/cuda/step_tag.cuh"

#define MOE_MAX_K 16
#define MOE_MAX_E 512

/* Tagged top-k words (moe_args.topk_pub, moe_decode.cu's early ids; step_tag.cuh): word 2k = tag << 32 |
 * expert id of slot k, word 2k + 1 = tag << 32 | its weight's bits, written by the kernel that ranks (the
 * router GEMV's last block, or the gate/up block of item 0) and polled by the MoE kernels before their PDL
 * wait; tag = step_tag(step, layer).
 * Publish slot i (id, weight) under tag. */
__device__ __forceinline__ void moe_pub_write(unsigned long long *pub, unsigned int tag, int i, int id, float w)
{
    const unsigned long long hi = (unsigned long long)tag << 32;
    st_relaxed_u64(pub + 2 * i, hi | (unsigned int)id);
    st_relaxed_u64(pub + 2 * i + 1, hi | __float_as_uint(w));
}

/* The logit of an order-preserving key (argmax_key's high word, cuda_common.cuh), bit for bit. */
__device__ __forceinline__ float moe_key_value(unsigned int u)
{
    return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}

/* Top-k of E <= 32·PER router logits of one token by the 32 lanes of one warp, from their keys: lane l
 * holds experts e = l + 32j (j < PER) as order-preserving 32-bit keys (argmax_key's high word) in u[j]
 * (SMEM: in s_key[e] instead, written by this lane before a __syncwarp) and a taken mask (set for e >= E).
 * The lane's candidates c[j] (0 where taken) stay in registers; each of the K rounds takes the warp's
 * largest untaken key (the lane's best by a max tree, then redux.sync) and the lowest expert id holding
 * it (the lane's lowest j with that key, then redux.sync): the CPU twin's order, larger logit, then lower
 * id. The owner marks the winner taken. Lane k < K ends with slot k's key and id. Weights = softmax over
 * the selected logits (= softmax over all E renormalised over the top k). */
template <int PER, bool SMEM>
static __device__ void moe_topk_rank(const unsigned int (&u)[PER], unsigned int taken, int E, int K, int *idx, float *w,
                                     const unsigned int *s_key)
{
    const int lane = threadIdx.x & 31;
    unsigned int c[PER];
#pragma unroll
    for (int j = 0; j < PER; j++)
        c[j] = ((taken >> j) & 1u) ? 0u : SMEM ? s_key[min(lane + 32 * j, E - 1)] : u[j];
    unsigned int mine_u = 0u, mine_id = 0u;
    for (int k = 0; k < K; k++) {
        unsigned int t[PER];
#pragma unroll
        for (int j = 0; j < PER; j++)
            t[j] = c[j];
#pragma unroll
        for (int s = 1; s < PER; s *= 2)
#pragma unroll
            for (int j = 0; j + s < PER; j += 2 * s)
                t[j] = max(t[j], t[j + s]);
        /* the largest untaken key (a taken slot's 0 never beats an untaken one: 0 only ties the smallest key) */
        const unsigned int m = __reduce_max_sync(0xffffffffu, t[0]);
        unsigned int eq = 0u;
#pragma unroll
        for (int j = 0; j < PER; j++)
            eq |= (!((taken >> j) & 1u) && c[j] == m) ? 1u << j : 0u;
        const unsigned int my_id = eq ? (unsigned int)(lane + 32 * (__ffs(eq) - 1)) : 0xffffffffu;
        const unsigned int id = __reduce_min_sync(0xffffffffu, my_id);
#pragma unroll
        for (int j = 0; j < PER; j++)
            if (id == (unsigned int)(lane + 32 * j)) {
                taken |= 1u << j;
                c[j] = 0u;
            }
        if (lane == k) {
            mine_u = m;
            mine_id = id;
        }
    }
    const float v = moe_key_value(mine_u), mx = __shfl_sync(0xffffffffu, v, 0);
    const float p = lane < K ? expf(v - mx) : 0.0f;
    const float sum = warp_sum(p);
    if (lane < K) {
        idx[lane] = mine_id < (unsigned int)E ? (int)mine_id : 0;
        w[lane] = p / sum;
    }
}

/* moe_topk_rank of the logits in memory (may be this kernel's: read through L2). */
template <int PER, bool SMEM>
static __device__ void moe_topk_warp_n(const float *logits, int E, int K, int *idx, float *w, unsigned int *s_key)
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
        else if (SMEM)
            s_key[e] = u[j];
    }
    if (SMEM)
        __syncwarp();
    moe_topk_rank<PER, SMEM>(u, taken, E, K, idx, w, s_key);
}

/* moe_topk_warp_n for E <= 1024 (more experts: nothing is written), keys in registers. Called by every
 * lane of one warp. */
static __device__ void moe_topk_warp(const float *logits, int E, int K, int *idx, float *w)
{
    if (E <= 256)
        moe_topk_warp_n<8, false>(logits, E, K, idx, w, NULL);
    else if (E <= 512)
        moe_topk_warp_n<16, false>(logits, E, K, idx, w, NULL);
    else if (E <= 1024)
        moe_topk_warp_n<32, false>(logits, E, K, idx, w, NULL);
}

/* The same in warp 0 of a block (E <= MOE_MAX_E; the other warps return at once): ranks into idx/w
 * (shared memory) with its keys in s_key (shared memory, MOE_MAX_E words: the block kernels that call
 * this are register-bound). The caller's __syncthreads publishes idx/w to the block. */
static __device__ void moe_topk_warp0(const float *logits, int E, int K, int *idx, float *w, unsigned int *s_key)
{
    if (threadIdx.x < 32) {
        if (E <= 256)
            moe_topk_warp_n<8, true>(logits, E, K, idx, w, s_key);
        else if (E <= MOE_MAX_E)
            moe_topk_warp_n<MOE_MAX_E / 32, true>(logits, E, K, idx, w, s_key);
    }
}

/* moe_topk_warp0, everyone waits; ends with __syncthreads. */
static __device__ void moe_topk_block(const float *logits, int E, int K, int *idx, float *w, unsigned int *s_key)
{
    moe_topk_warp0(logits, E, K, idx, w, s_key);
    __syncthreads();
}

/* Tagged router logits (moe_args.logit_pub: the router fused into moe_gate_up_mma): word e = tag << 32 | the
 * bits of row e's logit (rows 0..E-1 the experts, row E the shared-expert gate), tag = step_tag(step,
 * layer) as for the top-k words, written by the gate/up block that computes row e. */
__device__ __forceinline__ void moe_logit_write(unsigned long long *pub, unsigned int tag, int e, float v)
{
    st_relaxed_u64(pub + e, (unsigned long long)tag << 32 | __float_as_uint(v));
}

/* moe_topk_rank over the tagged logits, by one whole warp: lane l polls words e = l + 32j (j < PER, e < E)
 * until every one carries tag (a word with this call's tag holds this call's logit: single-copy atomic
 * 64-bit accesses, so no fence), backing off up to 64 ns between rounds; traps after ~seconds (a missing
 * publisher is a bug, not a hang). Keys in s_key (MOE_MAX_E words). */
template <int PER>
static __device__ void moe_topk_poll_n(const unsigned long long *pub, unsigned int tag, int E, int K, int *idx, float *w,
                                       unsigned int *s_key)
{
    const int lane = threadIdx.x & 31;
    unsigned int u[PER], pending = 0u;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        u[j] = 0u;
        if (lane + 32 * j < E)
            pending |= 1u << j;
    }
    unsigned int ns = 0, polls = 0;
    for (;;) {
#pragma unroll
        for (int j = 0; j < PER; j++) {
            if ((pending >> j) & 1u) {
                const int e = lane + 32 * j;
                const unsigned long long v = ld_relaxed_u64(pub + e);
                if ((unsigned int)(v >> 32) == tag) {
                    u[j] = (unsigned int)(argmax_key(__uint_as_float((unsigned int)v), e) >> 32);
                    pending &= ~(1u << j);
                }
            }
        }
        if (!__any_sync(0xffffffffu, pending != 0u))
            break;
        ns = ns ? min(2 * ns, 64u) : 16u;
        __nanosleep(ns);
        if (++polls > (1u << 26))
            __trap();
    }
    unsigned int taken = 0u;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int e = lane + 32 * j;
        if (e >= E)
            taken |= 1u << j;
        else
            s_key[e] = u[j];
    }
    __syncwarp();
    moe_topk_rank<PER, true>(u, taken, E, K, idx, w, s_key);
}

/* moe_topk_poll_n in warp 0 of a block (E <= MOE_MAX_E; the other warps return at once). */
static __device__ void moe_topk_poll_warp0(const unsigned long long *pub, unsigned int tag, int E, int K, int *idx, float *w,
                                           unsigned int *s_key)
{
    if (threadIdx.x < 32) {
        if (E <= 256)
            moe_topk_poll_n<8>(pub, tag, E, K, idx, w, s_key);
        else if (E <= MOE_MAX_E)
            moe_topk_poll_n<MOE_MAX_E / 32>(pub, tag, E, K, idx, w, s_key);
    }
}

#endif
