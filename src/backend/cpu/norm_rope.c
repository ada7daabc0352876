/* norm_rope.c — RMSNorm and rotate-half partial RoPE (MODEL.md §1.4, §4.1), fp32.
 *
 * Owns: the norm arithmetic (the effective weight — 1 + w formed in fp32 for zero-centred norms — is
 * made once by cpu_backend.c) and the rotary tables. transformers computes inv_freq and the angle
 * pos · inv_freq in fp32 and takes cos/sin of that fp32 angle; so do we.
 */
#include <math.h>

#include "cpu_internal.h"

void cpu_rmsnorm(const float *x, const float *weight, int n_rows, int dim, float eps, float *out)
{
    for (int t = 0; t < n_rows; t++) {
        const float *xt = x + (int64_t)t * dim;
        float *ot = out + (int64_t)t * dim;
        double sum_sq = 0;
        for (int i = 0; i < dim; i++)
            sum_sq += (double)xt[i] * xt[i];
        const float mean_sq = (float)(sum_sq / dim);
        const float inv_rms = 1.0f / sqrtf(mean_sq + eps);
        for (int i = 0; i < dim; i++)
            ot[i] = (xt[i] * inv_rms) * weight[i];
    }
}

void cpu_rope_inv_freq(int rotary_dim, float theta, float *inv_freq)
{
    for (int i = 0; i < rotary_dim / 2; i++)
        inv_freq[i] = 1.0f / powf(theta, (float)(2 * i) / (float)rotary_dim);
}

void cpu_rope(float *x, int n_tokens, int stride, int n_heads, int head_dim, int rotary_dim, int pos0,
              const float *inv_freq)
{
    const int half = rotary_dim / 2;
    for (int t = 0; t < n_tokens; t++) {
        const float pos = (float)(pos0 + t);
        for (int i = 0; i < half; i++) {
            const float angle = pos * inv_freq[i];
            const float cs = cosf(angle), sn = sinf(angle);
            for (int h = 0; h < n_heads; h++) {
                float *xh = x + (int64_t)t * stride + (int64_t)h * head_dim;
                const float a = xh[i], b = xh[i + half];
                xh[i] = a * cs - b * sn;
                xh[i + half] = b * cs + a * sn;
            }
        }
    }
}
