/* fdot_ref.c — the fdot.h kernels in portable C (any CPU), and what every set shares: the 4-bit group
 * sums, the 8-bit preparation and the x scale.
 */
#include <math.h>

#include "base/dtype.h"
#include "fdot.h"

float cpu_fdot_x_scale(float max_abs)
{
    float k = 1.0f;
    while (max_abs * k > 16384.0f)
        k *= 0.5f;
    return k;
}

void cpu_fdot_group_sums_q4(const float *xe, int64_t cols, int group, float *xsum)
{
    for (int64_t g = 0; g < cols / group; g++) {
        float s = 0.0f;
        for (int64_t i = g * group / 8; i < (g + 1) * group / 8; i++) { /* 8 columns 8i .. 8i + 7 */
            const float *ev = xe + (i / 4) * 32 + (i % 4) * 4, *od = ev + 16; /* f0 f2 f4 f6 | f1 f3 f5 f7 */
            const float e = ((ev[0] + ev[2]) + ev[1]) + ev[3], o = ((od[0] + od[2]) + od[1]) + od[3];
            s += e + 16.0f * o;
        }
        xsum[g] = s;
    }
}

void cpu_fdot_prep_q4_fp32(const float *x, int64_t cols, int group, float *xe, float *xsum)
{
    for (int64_t c = 0; c < cols; c++)
        xe[(c / 32) * 32 + (c & 1) * 16 + (c % 32) / 2] = c & 1 ? x[c] * 0.0625f : x[c];
    for (int64_t g = 0; g < cols / group; g++) {
        float s = 0.0f;
        for (int64_t c = g * group; c < (g + 1) * group; c++)
            s += x[c];
        xsum[g] = s;
    }
}

void cpu_fdot_prep_q8(const float *x, int64_t cols, int group, float *xe, float *xsum)
{
    for (int64_t g = 0; g < cols / group; g++) {
        float s = 0.0f;
        for (int64_t c = g * group; c < (g + 1) * group; c++) {
            xe[c] = x[c];
            s += x[c];
        }
        xsum[g] = s;
    }
}

static float prep_q4(const float *x, int64_t cols, int group, float *xe, float *xsum)
{
    float m = 0.0f;
    for (int64_t c = 0; c < cols; c++)
        m = fmaxf(m, fabsf(x[c]));
    const float k = cpu_fdot_x_scale(m);
    for (int64_t c = 0; c < cols; c++) {
        float v = x[c] * k;
        if (c & 1)
            v *= 0.0625f;
        xe[(c / 32) * 32 + (c & 1) * 16 + (c % 32) / 2] = lily_f16_to_f32(lily_f32_to_f16(v));
    }
    cpu_fdot_group_sums_q4(xe, cols, group, xsum);
    return k;
}

/* Per group, 8 partial sums (column i of each 8 into lane i % 8: independent chains a compiler may keep
 * in one vector), added at the group's end. */
static void rows_q4(const uint8_t *w, int64_t row_bytes, const uint16_t *s, const uint16_t *b, int64_t sb_stride,
                    int nrows, int group, const float *xe, const float *xsum, int64_t cols, float *out)
{
    for (int r = 0; r < nrows; r++) {
        const uint8_t *wr = w + r * row_bytes;
        float acc = 0.0f;
        for (int64_t g = 0; g < cols / group; g++) {
            float d[8] = {0};
            for (int64_t k = g * group / 32; k < (g + 1) * group / 32; k++)
                for (int i = 0; i < 16; i++) {
                    const unsigned v = wr[k * 16 + i];
                    d[i % 8] += (float)(v & 15u) * xe[k * 32 + i] + (float)(v & 240u) * xe[k * 32 + 16 + i];
                }
            const float dg = ((d[0] + d[1]) + (d[2] + d[3])) + ((d[4] + d[5]) + (d[6] + d[7]));
            acc += lily_bf16_to_f32(s[r * sb_stride + g]) * dg + lily_bf16_to_f32(b[r * sb_stride + g]) * xsum[g];
        }
        out[r] = acc;
    }
}

static void rows_q8(const uint8_t *w, int64_t row_bytes, const uint16_t *s, const uint16_t *b, int64_t sb_stride,
                    int nrows, int group, const float *xe, const float *xsum, int64_t cols, float *out)
{
    for (int r = 0; r < nrows; r++) {
        const uint8_t *wr = w + r * row_bytes;
        float acc = 0.0f;
        for (int64_t g = 0; g < cols / group; g++) {
            float d[8] = {0};
            for (int64_t c = g * group; c < (g + 1) * group; c++)
                d[c % 8] += (float)wr[c] * xe[c];
            const float dg = ((d[0] + d[1]) + (d[2] + d[3])) + ((d[4] + d[5]) + (d[6] + d[7]));
            acc += lily_bf16_to_f32(s[r * sb_stride + g]) * dg + lily_bf16_to_f32(b[r * sb_stride + g]) * xsum[g];
        }
        out[r] = acc;
    }
}

const cpu_fdot_kernels cpu_fdot_ref = {"ref", prep_q4, rows_q4, rows_q8};
