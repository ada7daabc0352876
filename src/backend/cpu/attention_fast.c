/* attention_fast.c — causal softmax attention in fast mode (MODEL.md §4.3), on 8-wide vectors (GCC/Clang
 * vector extensions: AVX2 or SSE pairs on x86-64, NEON pairs on AArch64).
 *
 * The same math as attention.c's exact loop — scores q·k · scale, softmax, o = Σ p v — with each dot
 * product summed in 8 interleaved lanes (then a fixed pairwise sum) instead of one serial chain, the value
 * rows added 8 wide, and the keys split into chunks whose partial softmax sums are merged (split-KV, as in
 * flash-decoding). Decode runs the chunks of a KV head's query heads together and in parallel; prefill runs
 * one head's tokens one after another through the same chunk and merge code. fp32; the rounding differs
 * from exact mode's, and each token's result does not depend on how many tokens a call takes (decode and
 * prefill give the same bits, which the prefix cache relies on).
 */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"

typedef float v8f __attribute__((vector_size(32)));

/* Unaligned 8-float load / store (macros: a function returning a 32-byte vector would warn of the AVX ABI). */
#define LOAD8(dst, p) memcpy(&(dst), (p), sizeof(v8f))
#define STORE8(p, v) memcpy((p), &(v), sizeof(v8f))

/* The pairwise sum of an 8-lane accumulator (the fixed order every score uses). */
__attribute__((always_inline)) static inline float sum8(v8f acc)
{
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* scores[s] = (q · k_s) · scale for s < n_keys, each dot product summed in 8 lanes over hd in order and
 * then by sum8; four keys at a time on independent accumulators (the same operations per key). */
__attribute__((always_inline)) static inline void scores8(const float *q, const float *k_cache, int kv_stride, int n_keys, int hd, float scale,
                    float *scores)
{
    int s = 0;
    for (; s + 4 <= n_keys; s += 4) {
        const float *k0 = k_cache + (int64_t)s * kv_stride;
        v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, x, y;
        for (int i = 0; i < hd; i += 8) {
            LOAD8(x, q + i);
            LOAD8(y, k0 + i);
            a0 += x * y;
            LOAD8(y, k0 + kv_stride + i);
            a1 += x * y;
            LOAD8(y, k0 + 2 * kv_stride + i);
            a2 += x * y;
            LOAD8(y, k0 + 3 * (int64_t)kv_stride + i);
            a3 += x * y;
        }
        scores[s] = sum8(a0) * scale;
        scores[s + 1] = sum8(a1) * scale;
        scores[s + 2] = sum8(a2) * scale;
        scores[s + 3] = sum8(a3) * scale;
    }
    for (; s < n_keys; s++) {
        const float *k = k_cache + (int64_t)s * kv_stride;
        v8f acc = {0}, x, y;
        for (int i = 0; i < hd; i += 8) {
            LOAD8(x, q + i);
            LOAD8(y, k + i);
            acc += x * y;
        }
        scores[s] = sum8(acc) * scale;
    }
}

/* Columns of a head the value sum holds in registers at once (8 vectors of 8). */
#define PV_COLS 64

bool cpu_attention_fast_ok(int head_dim) { return head_dim % 8 == 0; }

/* ---- decode: the query heads of one KV head together, split over the keys ------------------------- */

int cpu_attention_decode_split(int n_keys, int hd, int *chunk_len)
{
    const int min_len = CPU_ATTN_DECODE_MIN_CHUNK_FLOATS / hd > 8 ? CPU_ATTN_DECODE_MIN_CHUNK_FLOATS / hd : 8;
    int len = (n_keys + CPU_ATTN_DECODE_MAX_CHUNKS - 1) / CPU_ATTN_DECODE_MAX_CHUNKS;
    if (len < min_len)
        len = min_len;
    *chunk_len = len;
    return (n_keys + len - 1) / len;
}

/* Keys per tile of the two passes over a chunk: a tile's K (then V) rows, 32 KiB, stay in L1 while every
 * head of the group reads them, so each row comes from memory once for the group. */
#define DECODE_TILE_FLOATS 8192

CPU_VEC8_CLONES void cpu_attention_decode_chunk(const float *q, int group, const float *k_cache, const float *v_cache,
                                                int kv_stride, int key0, int n_keys, int hd, float scale, float *scores,
                                                int64_t scores_stride, float *part, int64_t part_stride)
{
    int tile = DECODE_TILE_FLOATS / hd;
    if (tile < 4)
        tile = 4;
    /* scores of every head, tile by tile (scores8: the same operations per key as cpu_attention_head_fast) */
    for (int t0 = 0; t0 < n_keys; t0 += tile) {
        const int tl = n_keys - t0 < tile ? n_keys - t0 : tile;
        for (int g = 0; g < group; g++)
            scores8(q + (int64_t)g * hd, k_cache + (int64_t)(key0 + t0) * kv_stride, kv_stride, tl, hd, scale,
                    scores + g * scores_stride + t0);
    }
    /* per head: the chunk's maximum, e_s = exp(score_s - max) in place, their sum; the value sums start at 0 */
    for (int g = 0; g < group; g++) {
        float *sc = scores + g * scores_stride;
        float *pg = part + g * part_stride;
        float max_score = -INFINITY;
        for (int s = 0; s < n_keys; s++)
            max_score = sc[s] > max_score ? sc[s] : max_score;
        float sum = 0;
        for (int s = 0; s < n_keys; s++) {
            sc[s] = expf(sc[s] - max_score);
            sum += sc[s];
        }
        pg[hd] = max_score;
        pg[hd + 1] = sum;
        memset(pg, 0, (size_t)hd * sizeof(float));
    }
    /* acc_g += e_s v_s over the keys in order, tile by tile, PV_COLS columns of a head in registers */
    for (int t0 = 0; t0 < n_keys; t0 += tile) {
        const int tl = n_keys - t0 < tile ? n_keys - t0 : tile;
        const float *vt = v_cache + (int64_t)(key0 + t0) * kv_stride;
        for (int g = 0; g < group; g++) {
            const float *e = scores + g * scores_stride + t0;
            float *acc_out = part + g * part_stride;
            for (int i0 = 0; i0 < hd; i0 += PV_COLS) {
                const int nv = (hd - i0 < PV_COLS ? hd - i0 : PV_COLS) / 8;
                v8f acc[PV_COLS / 8];
                if (nv == PV_COLS / 8) {
#pragma GCC unroll 8
                    for (int c = 0; c < PV_COLS / 8; c++)
                        LOAD8(acc[c], acc_out + i0 + 8 * c);
                    for (int s = 0; s < tl; s++) {
                        const float p = e[s];
                        const float *vs = vt + (int64_t)s * kv_stride + i0;
#pragma GCC unroll 8
                        for (int c = 0; c < PV_COLS / 8; c++) {
                            v8f v;
                            LOAD8(v, vs + 8 * c);
                            acc[c] += p * v;
                        }
                    }
#pragma GCC unroll 8
                    for (int c = 0; c < PV_COLS / 8; c++)
                        STORE8(acc_out + i0 + 8 * c, acc[c]);
                    continue;
                }
                for (int c = 0; c < nv; c++)
                    LOAD8(acc[c], acc_out + i0 + 8 * c);
                for (int s = 0; s < tl; s++) {
                    const float p = e[s];
                    const float *vs = vt + (int64_t)s * kv_stride + i0;
                    for (int c = 0; c < nv; c++) {
                        v8f v;
                        LOAD8(v, vs + 8 * c);
                        acc[c] += p * v;
                    }
                }
                for (int c = 0; c < nv; c++)
                    STORE8(acc_out + i0 + 8 * c, acc[c]);
            }
        }
    }
}

void cpu_attention_decode_merge(const float *part, int64_t chunk_stride, int n_chunks, int hd, float *o)
{
    float max_score = -INFINITY;
    for (int c = 0; c < n_chunks; c++) {
        const float m = part[c * chunk_stride + hd];
        max_score = m > max_score ? m : max_score;
    }
    float sum = 0;
    for (int c = 0; c < n_chunks; c++)
        sum += expf(part[c * chunk_stride + hd] - max_score) * part[c * chunk_stride + hd + 1];
    const float inv_sum = 1.0f / sum;
    for (int c = 0; c < n_chunks; c++) {
        const float *pc = part + c * chunk_stride;
        const float w = expf(pc[hd] - max_score) * inv_sum;
        if (c == 0)
            for (int i = 0; i < hd; i++)
                o[i] = w * pc[i];
        else
            for (int i = 0; i < hd; i++)
                o[i] += w * pc[i];
    }
}

void cpu_attention_group_fast(const float *q, int q_stride, int group, const float *k_cache, const float *v_cache,
                              int kv_stride, int n, int pos0, int hd, float scale, float *scores, int64_t scores_stride,
                              float *part, float *o, int o_stride)
{
    const int64_t part_floats = CPU_ATTN_DECODE_PART(hd), head_parts = CPU_ATTN_DECODE_MAX_CHUNKS * part_floats;
    for (int t = 0; t < n; t++) {
        const int n_keys = pos0 + t + 1; /* causal: keys 0 .. pos0 + t */
        int chunk_len;
        const int n_chunks = cpu_attention_decode_split(n_keys, hd, &chunk_len);
        for (int c = 0; c < n_chunks; c++) {
            const int key0 = c * chunk_len;
            cpu_attention_decode_chunk(q + (int64_t)t * q_stride, group, k_cache, v_cache, kv_stride, key0,
                                       n_keys - key0 < chunk_len ? n_keys - key0 : chunk_len, hd, scale, scores,
                                       scores_stride, part + c * part_floats, head_parts);
        }
        for (int g = 0; g < group; g++)
            cpu_attention_decode_merge(part + g * head_parts, part_floats, n_chunks, hd, o + (int64_t)t * o_stride + g * hd);
    }
}

void cpu_attention_head_fast(const float *q, int q_stride, const float *k_cache, const float *v_cache, int kv_stride,
                             int n, int pos0, int hd, float scale, float *scores, float *part, float *o, int o_stride)
{
    const int64_t part_floats = CPU_ATTN_DECODE_PART(hd);
    for (int t = 0; t < n; t++) {
        const int n_keys = pos0 + t + 1; /* causal: keys 0 .. pos0 + t */
        int chunk_len;
        const int n_chunks = cpu_attention_decode_split(n_keys, hd, &chunk_len);
        for (int c = 0; c < n_chunks; c++) {
            const int key0 = c * chunk_len;
            cpu_attention_decode_chunk(q + (int64_t)t * q_stride, 1, k_cache, v_cache, kv_stride, key0,
                                       n_keys - key0 < chunk_len ? n_keys - key0 : chunk_len, hd, scale, scores + key0, 0,
                                       part + c * part_floats, part_floats);
        }
        cpu_attention_decode_merge(part, part_floats, n_chunks, hd, o + (int64_t)t * o_stride);
    }
}
