/* attention_fast.c — causal softmax attention of one query head in fast mode (MODEL.md §4.3), on 8-wide
 * vectors (GCC/Clang vector extensions: AVX2 or SSE pairs on x86-64, NEON pairs on AArch64).
 *
 * The same math as attention.c's exact loop — scores q·k · scale, softmax with the running maximum
 * subtracted, o = Σ p v — with each dot product summed in 8 interleaved lanes (then a fixed pairwise sum)
 * instead of one serial chain, and the value rows added 8 wide. fp32; the rounding differs from exact
 * mode's, and each token's result does not depend on how many tokens a call takes.
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

CPU_VEC8_CLONES void cpu_attention_head_fast(const float *q, int q_stride, const float *k_cache, const float *v_cache, int kv_stride,
                             int n, int pos0, int hd, float scale, float *scores, float *o, int o_stride)
{
    for (int t = 0; t < n; t++) {
        const float *qt = q + (int64_t)t * q_stride;
        const int n_keys = pos0 + t + 1; /* causal: keys 0 .. pos0 + t */
        scores8(qt, k_cache, kv_stride, n_keys, hd, scale, scores);
        float max_score = -INFINITY;
        for (int s = 0; s < n_keys; s++)
            max_score = scores[s] > max_score ? scores[s] : max_score;
        float sum = 0;
        for (int s = 0; s < n_keys; s++) {
            scores[s] = expf(scores[s] - max_score);
            sum += scores[s];
        }
        const float inv_sum = 1.0f / sum;
        float *ot = o + (int64_t)t * o_stride;
        /* o = Σ_s p_s v_s over keys in order, up to PV_COLS columns at a time on independent accumulators */
        for (int i0 = 0; i0 < hd; i0 += PV_COLS) {
            const int nv = (hd - i0 < PV_COLS ? hd - i0 : PV_COLS) / 8;
            if (nv == PV_COLS / 8) { /* all PV_COLS columns: a fixed count, so the sums stay in registers */
                v8f acc[PV_COLS / 8] = {{0}};
                for (int s = 0; s < n_keys; s++) {
                    const float p = scores[s] * inv_sum;
                    const float *vs = v_cache + (int64_t)s * kv_stride + i0;
#pragma GCC unroll 8
                    for (int c = 0; c < PV_COLS / 8; c++) {
                        v8f v;
                        LOAD8(v, vs + 8 * c);
                        acc[c] += p * v;
                    }
                }
                for (int c = 0; c < PV_COLS / 8; c++)
                    STORE8(ot + i0 + 8 * c, acc[c]);
                continue;
            }
            v8f acc[PV_COLS / 8] = {{0}};
            for (int s = 0; s < n_keys; s++) {
                const float p = scores[s] * inv_sum;
                const float *vs = v_cache + (int64_t)s * kv_stride + i0;
                for (int c = 0; c < nv; c++) {
                    v8f v;
                    LOAD8(v, vs + 8 * c);
                    acc[c] += p * v;
                }
            }
            for (int c = 0; c < nv; c++)
                STORE8(ot + i0 + 8 * c, acc[c]);
        }
    }
}
