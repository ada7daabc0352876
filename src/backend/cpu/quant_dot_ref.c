/* quant_dot_ref.c — the portable C kernels of quant_dot.h: any CPU, and the oracle the SIMD kernels
 * are tested against (their integer block sums must agree exactly).
 */
#include "quant_dot.h"

/* Σ q_i xq_i over one block of 32 in the activations' even/odd order; q[i] is element i of the block. */
static int32_t block_dot(const uint8_t *q, const int8_t *xq)
{
    int32_t s = 0;
    for (int i = 0; i < CPU_QBLOCK / 2; i++)
        s += (int32_t)q[2 * i] * xq[i] + (int32_t)q[2 * i + 1] * xq[CPU_QBLOCK / 2 + i];
    return s;
}

/* The shared loop: `unpack` gives block k's 32 unsigned values in element order. */
#define QDOT_BODY(UNPACK)                                                                          \
    do {                                                                                           \
        const int64_t nb = a->cols / CPU_QBLOCK;                                                   \
        const int per_group = group / CPU_QBLOCK;                                                  \
        float acc[CPU_QTILE] = {0};                                                                \
        uint8_t q[CPU_QBLOCK];                                                                     \
        for (int64_t k = 0; k < nb; k++) {                                                         \
            UNPACK;                                                                                \
            const float s = ws[k / per_group];                                                     \
            for (int j = 0; j < nt; j++) {                                                         \
                const int64_t t = t0 + j;                                                          \
                const int64_t off = t * a->cols + k * CPU_QBLOCK;                                  \
                const int32_t isum = CPU_QDIGIT * block_dot(q, a->q + off) + block_dot(q, a->r + off); \
                acc[j] += (float)isum * (a->d[t * nb + k] * s);                                    \
            }                                                                                      \
        }                                                                                          \
        for (int j = 0; j < nt; j++)                                                               \
            out[j] = acc[j];                                                                       \
    } while (0)

static void dot_q4(const uint8_t *w, const float *ws, int group, const cpu_qact *a, int t0, int nt, float *out)
{
    QDOT_BODY({
        const uint8_t *wb = w + k * (CPU_QBLOCK / 2);
        for (int i = 0; i < CPU_QBLOCK / 2; i++) {
            q[2 * i] = wb[i] & 15;
            q[2 * i + 1] = wb[i] >> 4;
        }
    });
}

static void dot_q8(const uint8_t *w, const float *ws, int group, const cpu_qact *a, int t0, int nt, float *out)
{
    QDOT_BODY({
        const uint8_t *wb = w + k * CPU_QBLOCK;
        for (int i = 0; i < CPU_QBLOCK; i++)
            q[i] = wb[i];
    });
}

const cpu_qdot_kernels cpu_qdot_ref = {"ref", dot_q4, dot_q8, NULL, NULL, NULL, NULL, NULL, NULL};
