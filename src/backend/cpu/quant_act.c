/* quant_act.c — activations to two int8 digits per value, per block of 32, for the fast CPU path
 * (quant_dot.h).
 *
 * Owns: the block scale d = max|x| / (127 · 254), the digits xq = round(x / (254 d)) and
 * xr = round(x / d - 254 xq) (both round-to-nearest, in [-127, 127]), the whole values v = 254 xq + xr as int16, the fp32 block sum that folds the
 * weights' affine bias, and the even/odd order the kernels read.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_internal.h"
#include "quant_dot.h"

/* (the helpers below are static and inlined: the vector-return ABI note GCC gives for the default clone does not apply) */
#pragma GCC diagnostic ignored "-Wpsabi"

/* Eight fp32 / int32 lanes (GCC vector extensions: SSE pairs by default, one AVX2 register in the clone). */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef int16_t v8s __attribute__((vector_size(16)));
typedef int8_t v8b __attribute__((vector_size(8)));

/* Round to nearest (ties to even) for |v| < 2^22 lane by lane without a library call: adding 1.5 · 2^23
 * leaves no fraction bits. Needs IEEE fp32 arithmetic as built (no -ffast-math, no x87). */
static inline v8f round_nearest(v8f v)
{
    const v8f magic = {12582912.0f, 12582912.0f, 12582912.0f, 12582912.0f,
                       12582912.0f, 12582912.0f, 12582912.0f, 12582912.0f};
    return (v + magic) - magic;
}

/* v clamped to [-127, 127] lane by lane (NaN-free input). */
static inline v8f clamp127(v8f v)
{
    const v8f hi = {127, 127, 127, 127, 127, 127, 127, 127};
    const v8i over = v > hi, under = v < -hi;
    return (v8f)(((v8i)hi & over) | ((v8i)-hi & under) | ((v8i)v & ~(over | under)));
}

static inline v8f max8(v8f a, v8f b) { return (v8f)(((v8i)a & (a > b)) | ((v8i)b & ~(a > b))); }

/* The block's values in slots [16 even | 16 odd] (quant_dot.h's order): c0..c3 hold elements 0-7 .. 24-31. */
static inline void even_odd(v8f c0, v8f c1, v8f c2, v8f c3, v8f *xs)
{
    const v8i ev = {0, 2, 4, 6, 8, 10, 12, 14}, od = {1, 3, 5, 7, 9, 11, 13, 15};
    xs[0] = __builtin_shuffle(c0, c1, ev);
    xs[1] = __builtin_shuffle(c2, c3, ev);
    xs[2] = __builtin_shuffle(c0, c1, od);
    xs[3] = __builtin_shuffle(c2, c3, od);
}

/* Also built for AVX2 (CPU_VEC8_CLONES: the same IEEE operations per lane, so the same values). */
CPU_VEC8_CLONES void cpu_quantize_act(const float *x, int n, int64_t cols, cpu_qact *a)
{
    const int64_t nb = cols / CPU_QBLOCK;
    a->cols = cols;
    for (int t = 0; t < n; t++) {
        const float *xt = x + (int64_t)t * cols;
        for (int64_t k = 0; k < nb; k++) {
            const float *xb = xt + k * CPU_QBLOCK;
            v8f c[4];
            memcpy(c, xb, sizeof c);
            /* |x| maximum and sum in 8 interleaved lanes (the sum's order is fixed: lane l adds elements l,
             * l + 8, l + 16, l + 24 to 0 in turn) */
            const v8i sign = {INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN};
            v8f mx = {0}, part = {0};
            for (int i = 0; i < 4; i++) {
                mx = max8((v8f)((v8i)c[i] & ~sign), mx);
                part += c[i];
            }
            float amax = 0;
            for (int l = 0; l < 8; l++)
                amax = mx[l] > amax ? mx[l] : amax;
            const float sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
            /* x / d in [-127 · 254, 127 · 254]; its high digit rounds it to a multiple of 254 */
            const float inv_d = amax > 0 ? 127.0f * CPU_QDIGIT / amax : 0.0f;
            int8_t *qb = a->q + (int64_t)t * cols + k * CPU_QBLOCK;
            int8_t *rb = a->r + (int64_t)t * cols + k * CPU_QBLOCK;
            int16_t *vb = a->v + (int64_t)t * cols + k * CPU_QBLOCK;
            v8f xs[4];
            even_odd(c[0], c[1], c[2], c[3], xs);
            for (int i = 0; i < 4; i++) {
                const v8f v = xs[i] * inv_d; /* in [-127 · 254, 127 · 254] */
                const v8f hi = clamp127(round_nearest(v * (1.0f / CPU_QDIGIT)));
                const v8f lo = clamp127(round_nearest(v - hi * (float)CPU_QDIGIT));
                const v8i hq = __builtin_convertvector(hi, v8i), lq = __builtin_convertvector(lo, v8i);
                const v8b qv = __builtin_convertvector(__builtin_convertvector(hq, v8s), v8b),
                          rv = __builtin_convertvector(__builtin_convertvector(lq, v8s), v8b);
                const v8s vv = __builtin_convertvector(hq * CPU_QDIGIT + lq, v8s);
                memcpy(qb + 8 * i, &qv, sizeof qv);
                memcpy(rb + 8 * i, &rv, sizeof rv);
                memcpy(vb + 8 * i, &vv, sizeof vv);
            }
            a->d[t * nb + k] = amax / (127.0f * CPU_QDIGIT);
            a->sum[t * nb + k] = sum;
        }
    }
}
