/* attention_prefill_q.cuh — the q staging of the prefill attention kernels (attention_prefill.cu,
 * attention_prefill_wg.cu): a block's query rows (row r = t * G + h, see
 * attention_prefill.cu) read from the raw q in qkv, RMSNormed and partially rotated with norm_rope.cuh's
 * math (the same bits as the q norm_rope.cu writes) and stored as bf16 in the kernel's shared layout; and
 * the epilogue both kernels share (apf_write_rows: normalise + gate, or the split's partials).
 */
#ifndef LILY_ATTENTION_PREFILL_Q_CUH
#define LILY_ATTENTION_PREFILL_Q_CUH

#include "norm_rope.cuh"

/* Fused q staging: rows r0 .. r0 + BM - 1 of the block's bf16 Q tile (element (r, d) at q_at(r, d), the
 * kernel's shared layout) from the raw q in qkv, normed + rotated as in norm_rope.cu; rows past the chunk
 * zero. All NW * 32 threads call it (a barrier between its two steps: s_r[BM] is read across warps:
 * __syncthreads, or with BAR > 0 the named barrier BAR over threads 0 .. NW * 32 - 1, for a kernel whose
 * other warps do something else); the caller's next barrier publishes the tile. */
template <int D, int BM, int NW, int BAR = 0, typename QAt>
__device__ __forceinline__ void apf_stage_q_fused(const attn_args &a, int n_tokens, int r0, int g, int pos,
                                                  float *s_r, QAt q_at)
{
    const int G = a.n_heads / a.n_kv, n_rows = n_tokens * G, rot = a.rot_dim;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    /* 1: a warp per row (rows warp, warp + NW, ...): 1/rms (kept in s_r for step 2) and the dims past
     * rot_dim; rows past the chunk are all zero (their x = 0). Four rows' loads are issued together (the
     * raw q comes from L2 / DRAM right after the projection). */
#pragma unroll 1
    for (int rb = 0; rb < BM / NW; rb += 4) {
        float v[4][D / 32];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int gr = r0 + warp + NW * (rb + u);
            const float *src = a.qkv + (size_t)(gr / G) * a.qkv_stride + (size_t)(g * G + gr % G) * 2 * D;
#pragma unroll
            for (int k = 0; k < D / 32; k++)
                v[u][k] = gr < n_rows ? src[lane + 32 * k] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int r = warp + NW * (rb + u);
            const bool pad = r0 + r >= n_rows;
            float ss = 0.0f; /* same order as norm_rope.cu: the same bits */
#pragma unroll
            for (int k = 0; k < D / 32; k++)
                ss = fmaf(v[u][k], v[u][k], ss);
            ss = warp_sum(ss);
            const float rr = head_rms_inv(ss, D, a.eps);
            if (lane == 0)
                s_r[r] = rr;
#pragma unroll
            for (int k = 0; k < D / 32; k++) {
                const int d = lane + 32 * k;
                if (d >= rot || pad)
                    *q_at(r, d) = __float2bfloat16(v[u][k] * rr * a.q_norm[d]);
            }
        }
    }
    if constexpr (BAR > 0)
        asm volatile("bar.sync %0, %1;\n" ::"n"(BAR), "n"(NW * 32) : "memory");
    else
        __syncthreads();
    /* 2: rotary pairs (j, j + half): one cos/sin per (token, pair), applied to the token's heads in the tile */
    const int half = rot / 2;
    if (half == 0)
        return;
    const int t_first = r0 / G, t_end = min(n_tokens, (r0 + BM - 1) / G + 1);
    const int n_pairs = (t_end - t_first) * half;
    for (int i = tid; i < n_pairs; i += NW * 32) {
        const int t = t_first + i / half, j = i % half;
        double c, sn;
        rope_cos_sin(pos + t, j, rot, a.rope_theta, &c, &sn);
        const float w0 = a.q_norm[j], w1 = a.q_norm[j + half];
        const int h_lo = max(0, r0 - t * G), h_hi = min(G, r0 + BM - t * G); /* rows t*G+h in the tile */
        const float *row = a.qkv + (size_t)t * a.qkv_stride + (size_t)g * G * 2 * D;
        for (int h = h_lo; h < h_hi; h++) {
            const int r = t * G + h - r0;
            const float rr = s_r[r];
            const float x = row[(size_t)h * 2 * D + j] * rr * w0, y = row[(size_t)h * 2 * D + j + half] * rr * w1;
            *q_at(r, j) = __float2bfloat16(rope_first(x, y, c, sn));
            *q_at(r, j + half) = __float2bfloat16(rope_second(x, y, c, sn));
        }
    }
}

/* The epilogue of a prefill flash-attention warp (attention_prefill.cu, attention_prefill_wg.cu): its
 * rows row0 and row0 + 8 (i = 0, 1; row = token x head in the group, rows past n_rows skipped) with the
 * accumulators o[D/8][4] (thread qid of the row's quad holds columns jd·8 + 2·qid, +1), the running max
 * m and the per-thread partial denominators l (summed over the quad here). One split: out = o / l ·
 * sigmoid(gate); several: the unnormalised o and (m, l) into part_o / part_ml for the merge kernel. */
template <int D>
__device__ __forceinline__ void apf_write_rows(const attn_args &a, const float (&o)[D / 8][4], const float (&m)[2],
                                               float (&l)[2], int row0, int g, int n_rows, int n_tokens,
                                               int n_splits, int split, int qid)
{
    const int G = a.n_heads / a.n_kv;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int gr = row0 + 8 * i;
        if (gr >= n_rows)
            continue;
        const int t = gr / G, hg = g * G + gr % G;
        const size_t orow = ((size_t)t * a.n_heads + hg) * D;
        if (n_splits == 1) {
            const float inv = 1.0f / l[i];
            const float *gate = a.qkv + (size_t)t * a.qkv_stride + (size_t)hg * 2 * D + D;
#pragma unroll
            for (int jd = 0; jd < D / 8; jd++) {
                const int d = jd * 8 + 2 * qid;
                float2 v;
                v.x = o[jd][2 * i] * inv * sigmoid_f(gate[d]);
                v.y = o[jd][2 * i + 1] * inv * sigmoid_f(gate[d + 1]);
                *reinterpret_cast<float2 *>(a.out + orow + d) = v;
            }
        } else {
            const size_t prow = (size_t)split * n_tokens * a.n_heads + (size_t)t * a.n_heads + hg;
            float *po = a.part_o + prow * D;
#pragma unroll
            for (int jd = 0; jd < D / 8; jd++) {
                const int d = jd * 8 + 2 * qid;
                *reinterpret_cast<float2 *>(po + d) = make_float2(o[jd][2 * i], o[jd][2 * i + 1]);
            }
            if (qid == 0)
                *reinterpret_cast<float2 *>(a.part_ml + prow * 2) = make_float2(m[i], l[i]);
        }
    }
}

#endif
