/* quant_act.c — activations to two int8 digits per value, per block of 32, for the fast CPU path
 * (quant_dot.h).
 *
 * Owns: the block scale d = max|x| / (127 · 254), the digits xq = round(x / (254 d)) and
 * xr = round(x / d - 254 xq) (both round-to-nearest, in [-127, 127]), the whole values v = 254 xq + xr as int16, the fp32 block sum that folds the
 * weights' affine bias, and the even/odd order the kernels read.
 */
#include <math.h>

#include "cpu_internal.h"
#include "quant_dot.h"

/* Round to nearest (ties to even) for |v| < 2^22 without a library call, so the loop vectorizes: adding
 * 1.5 · 2^23 leaves no fraction bits. Needs IEEE fp32 arithmetic as built (no -ffast-math, no x87). */
static inline float round_nearest(float v)
{
    const float magic = 12582912.0f;
    return (v + magic) - magic;
}

static inline float clamp127(float v) { return v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v; }

/* Also built for AVX2 (CPU_VEC8_CLONES: the same IEEE operations per lane, so the same values). */
CPU_VEC8_CLONES void cpu_quantize_act(const float *x, int n, int64_t cols, cpu_qact *a)
{
    const int64_t nb = cols / CPU_QBLOCK;
    a->cols = cols;
    for (int t = 0; t < n; t++) {
        const float *xt = x + (int64_t)t * cols;
        for (int64_t k = 0; k < nb; k++) {
            const float *xb = xt + k * CPU_QBLOCK;
            /* |x| maximum and sum in 8 interleaved lanes (the compiler vectorizes; the sum's order is fixed) */
            float mx[8] = {0}, part[8] = {0};
            for (int i = 0; i < CPU_QBLOCK; i += 8)
                for (int l = 0; l < 8; l++) {
                    const float m = fabsf(xb[i + l]);
                    mx[l] = m > mx[l] ? m : mx[l];
                    part[l] += xb[i + l];
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
            /* slot j of the block holds element 2j (j < 16) or 2(j - 16) + 1: the even/odd order of quant_dot.h */
            float xs[CPU_QBLOCK];
            for (int i = 0; i < CPU_QBLOCK / 2; i++) {
                xs[i] = xb[2 * i];
                xs[CPU_QBLOCK / 2 + i] = xb[2 * i + 1];
            }
            for (int j = 0; j < CPU_QBLOCK; j++) {
                const float v = xs[j] * inv_d; /* in [-127 · 254, 127 · 254] */
                const float hi = clamp127(round_nearest(v * (1.0f / CPU_QDIGIT)));
                const float lo = clamp127(round_nearest(v - hi * CPU_QDIGIT));
                qb[j] = (int8_t)hi;
                rb[j] = (int8_t)lo;
                vb[j] = (int16_t)(hi * CPU_QDIGIT + lo);
            }
            a->d[t * nb + k] = amax / (127.0f * CPU_QDIGIT);
            a->sum[t * nb + k] = sum;
        }
    }
}
