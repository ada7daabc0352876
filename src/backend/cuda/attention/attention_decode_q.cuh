/* attention_decode_q.cuh — the front end that the tensor-core decode kernel (attention_decode.cu,
 * ATTN_DECODE_MMA_FUSED) runs itself instead of norm_rope.cu's kernel: the q of its KV head's G query
 * heads RMSNormed and partially rotated from the raw q in qkv, and, in the one block whose key range holds
 * the current position, the new k row (normed + rotated) and v row, appended to the bf16 KV cache.
 * The math and its evaluation order are norm_rope.cu's (norm_rope.cuh; a warp per head, lane l summing
 * dims l, l + 32, ... then warp_sum), so q and the cache rows get the same bits on either path.
 */
#ifndef LILY_ATTENTION_DECODE_Q_CUH
#define LILY_ATTENTION_DECODE_Q_CUH

#include "norm_rope.cuh"

#define ADQ_ROWS 10 /* rows of the staging buffer: q heads 0..7, then the new k row (ADQ_K) and v row (ADQ_V) */
#define ADQ_K 8
#define ADQ_V 9

/* RoPE cos / sin of the rot_dim / 2 pairs at position pos: cos of pair i at s_cs[i], sin at s_cs[D / 2 + i]
 * (s_cs: D doubles). All NT threads call it; the fp64 pow / sincos do not depend on earlier kernels of the
 * forward call, so it runs before the PDL wait. The caller's next barrier publishes it. */
template <int D, int NT>
__device__ __forceinline__ void adq_rope_table(const attn_args &a, int pos, double *s_cs)
{
    for (int i = threadIdx.x; i < a.rot_dim / 2; i += NT)
        rope_cos_sin(pos, i, a.rot_dim, a.rope_theta, &s_cs[i], &s_cs[D / 2 + i]);
}

/* Token 0's front end for KV head g, by NW warps (a warp per task: q heads 0 .. G - 1, then with own_new the
 * k and v rows; every task's loads issued before the first reduction). s_new [ADQ_ROWS][D] fp32: row h < G the
 * normed + rotated q of head g * G + h, row ADQ_K the normed + rotated k, row ADQ_V the v (own_new only).
 * With own_new the k and v rows are also stored (bf16) at row pos of KV head g in the cache. s_cs from
 * adq_rope_table, published. All NW * 32 threads call it; the caller's next barrier publishes s_new. */
template <int D, int NW>
__device__ __forceinline__ void adq_stage(const attn_args &a, int g, int pos, bool own_new, float *s_new,
                                          const double *s_cs)
{
    constexpr int DPL = D / 32, U = (ADQ_ROWS + NW - 1) / NW;
    const int G = a.n_heads / a.n_kv, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n_task = G + (own_new ? 2 : 0);
    const float *kv_row = a.qkv + (size_t)a.n_heads * 2 * D; /* token 0: k heads, then v heads */
    float x[U][DPL], w[U][DPL];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int j = warp + NW * u;
        const bool live = j < n_task, normed = j <= G;
        const float *src = j < G ? a.qkv + (size_t)(g * G + j) * 2 * D
                                 : kv_row + (size_t)(j == G ? g : a.n_kv + g) * D;
        const float *nw = j < G ? a.q_norm : a.k_norm;
#pragma unroll
        for (int k = 0; k < DPL; k++) {
            x[u][k] = live ? src[lane + 32 * k] : 0.0f;
            w[u][k] = live && normed ? nw[lane + 32 * k] : 0.0f;
        }
    }
    const int half = a.rot_dim / 2;
    const size_t crow = ((size_t)g * a.max_ctx + pos) * D; /* the new row in the cache */
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int j = warp + NW * u;
        if (j >= n_task)
            continue;
        if (j == G + 1) { /* v: copied */
#pragma unroll
            for (int k = 0; k < DPL; k++) {
                s_new[ADQ_V * D + lane + 32 * k] = x[u][k];
                a.v_cache[crow + lane + 32 * k] = __float2bfloat16(x[u][k]);
            }
            continue;
        }
        float ss = 0.0f; /* norm_rope.cu's order */
#pragma unroll
        for (int k = 0; k < DPL; k++)
            ss = fmaf(x[u][k], x[u][k], ss);
        ss = warp_sum(ss);
        const float r = head_rms_inv(ss, a.head_dim, a.eps);
        float *sr = s_new + (j < G ? j : ADQ_K) * D;
#pragma unroll
        for (int k = 0; k < DPL; k++)
            sr[lane + 32 * k] = x[u][k] * r * w[u][k];
        __syncwarp();
        for (int i = lane; i < half; i += 32) { /* pair (i, i + half) in place by one lane */
            const float xi = sr[i], yi = sr[i + half];
            const double c = s_cs[i], sn = s_cs[D / 2 + i];
            sr[i] = rope_first(xi, yi, c, sn);
            sr[i + half] = rope_second(xi, yi, c, sn);
        }
        __syncwarp();
        if (j == G)
#pragma unroll
            for (int k = 0; k < DPL; k++)
                a.k_cache[crow + lane + 32 * k] = __float2bfloat16(sr[lane + 32 * k]);
    }
}

#endif
