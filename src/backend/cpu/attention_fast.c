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

static float dot8(const float *a, const float *b, int n)
{
    v8f acc = {0}, x, y;
    for (int i = 0; i < n; i += 8) {
        LOAD8(x, a + i);
        LOAD8(y, b + i);
        acc += x * y;
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

bool cpu_attention_fast_ok(int head_dim) { return head_dim % 8 == 0; }

void cpu_attention_head_fast(const float *q, int q_stride, const float *k_cache, const float *v_cache, int kv_stride,
                             int n, int pos0, int hd, float scale, float *scores, float *o, int o_stride)
{
    for (int t = 0; t < n; t++) {
        const float *qt = q + (int64_t)t * q_stride;
        const int n_keys = pos0 + t + 1; /* causal: keys 0 .. pos0 + t */
        float max_score = -INFINITY;
        for (int s = 0; s < n_keys; s++) {
            scores[s] = dot8(qt, k_cache + (int64_t)s * kv_stride, hd) * scale;
            max_score = scores[s] > max_score ? scores[s] : max_score;
        }
        float sum = 0;
        for (int s = 0; s < n_keys; s++) {
            scores[s] = expf(scores[s] - max_score);
            sum += scores[s];
        }
        const float inv_sum = 1.0f / sum;
        float *ot = o + (int64_t)t * o_stride;
        for (int i = 0; i < hd; i += 8) {
            v8f acc = {0}, v;
            for (int s = 0; s < n_keys; s++) {
                LOAD8(v, v_cache + (int64_t)s * kv_stride + i);
                acc += (scores[s] * inv_sum) * v;
            }
            STORE8(ot + i, acc);
        }
    }
}
