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

/* Eight fp32 / int32 lanes (GCC vector extensions: SSE pairs by default, one AVX2 register in the clone).
 * The helpers are macros: a function taking or returning a 32-byte vector would warn of the AVX ABI. */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef int16_t v8s __attribute__((vector_size(16)));
typedef int8_t v8b __attribute__((vector_size(8)));

/* Round to nearest (ties to even) for |v| < 2^22 lane by lane without a library call: adding MAGIC =
 * 1.5 · 2^23 leaves no fraction bits. Needs IEEE fp32 arithmetic as built (no -ffast-math, no x87). */
#define ROUND_NEAREST(v) (((v) + MAGIC) - MAGIC)
/* Lane by lane `a > b ? a : b` and `a > b ? b : a` (blends through the compare mask; NaN-free input). */
#define MAX8(a, b) ((v8f)(((v8i)(a) & ((a) > (b))) | ((v8i)(b) & ~((a) > (b)))))
#define MIN8(a, b) ((v8f)(((v8i)(b) & ((a) > (b))) | ((v8i)(a) & ~((a) > (b)))))
/* v clamped to [-LIM, LIM] lane by lane. */
#define CLAMP8(v) MAX8(MIN8(v, LIM), -LIM)

/* Also built for AVX2 and for AVX-512 (x86-64-v4: one-instruction narrowing and blends), each clone the
 * same IEEE operations per lane with no multiply-add fused (fp-contract off), so the same values. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define QUANT_ACT_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default"), optimize("fp-contract=off")))
#else
#define QUANT_ACT_CLONES CPU_VEC8_CLONES
#endif
QUANT_ACT_CLONES void cpu_quantize_act(const float *x, int n, int64_t cols, cpu_qact *a)
{
    const int64_t nb = cols / CPU_QBLOCK;
    const v8f MAGIC = {12582912.0f, 12582912.0f, 12582912.0f, 12582912.0f,
                       12582912.0f, 12582912.0f, 12582912.0f, 12582912.0f};
    const v8f LIM = {127, 127, 127, 127, 127, 127, 127, 127};
    const v8i sign = {INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN};
    const v8i even = {0, 2, 4, 6, 8, 10, 12, 14}, odd = {1, 3, 5, 7, 9, 11, 13, 15};
    a->cols = cols;
    for (int t = 0; t < n; t++) {
        const float *xt = x + (int64_t)t * cols;
        for (int64_t k = 0; k < nb; k++) {
            const float *xb = xt + k * CPU_QBLOCK;
            v8f c[4];
            memcpy(c, xb, sizeof c);
            /* |x| maximum and sum in 8 interleaved lanes (the sum's order is fixed: lane l adds elements l,
             * l + 8, l + 16, l + 24 to 0 in turn) */
            v8f mx = {0}, part = {0};
            for (int i = 0; i < 4; i++) {
                const v8f m = (v8f)((v8i)c[i] & ~sign);
                mx = MAX8(m, mx);
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
            /* slots [16 even | 16 odd] (quant_dot.h's order) */
            const v8f xs[4] = {__builtin_shuffle(c[0], c[1], even), __builtin_shuffle(c[2], c[3], even),
                               __builtin_shuffle(c[0], c[1], odd), __builtin_shuffle(c[2], c[3], odd)};
            for (int i = 0; i < 4; i++) {
                const v8f v = xs[i] * inv_d; /* in [-127 · 254, 127 · 254] */
                const v8f vh = ROUND_NEAREST(v * (1.0f / CPU_QDIGIT));
                const v8f hi = CLAMP8(vh);
                const v8f vl = ROUND_NEAREST(v - hi * (float)CPU_QDIGIT);
                const v8f lo = CLAMP8(vl);
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
