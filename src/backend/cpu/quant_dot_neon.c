/* quant_dot_neon.c — the quant_dot.h kernels with NEON (AArch64): every AArch64 CPU has the base form
 * (vmull_s8 / vpadalq_s16 into int32 lanes); CPUs with the dot-product extension (ARMv8.2 FEAT_DotProd)
 * run the sdot form (vdotq_s32: four int8 products summed into each int32 lane). Weight values go in as
 * signed bytes: a 4-bit value (0..15) as is, an 8-bit one as its two nibbles (q = 16 hi + lo).
 */
#if defined(__aarch64__)
#include <arm_neon.h>

#include "quant_dot.h"

#define NEON_INLINE __attribute__((always_inline)) static inline
#define DOTPROD_INLINE __attribute__((target("arch=armv8.2-a+dotprod"), always_inline)) static inline

/* Σ a_i b_i of two 16-byte vectors as 4 int32 partial sums (base NEON; products fit int16 in pairs). */
NEON_INLINE int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b)
{
    int16x8_t p = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    p = vmlal_high_s8(p, a, b);
    return vpadalq_s16(acc, p);
}

DOTPROD_INLINE int32x4_t dot16_sdot(int32x4_t acc, int8x16_t a, int8x16_t b) { return vdotq_s32(acc, a, b); }

/* Σ of one block's 32 products: E (even elements) against the digits' first 16, O against the rest. */
#define DOT_BLOCK(DOT, E, O, X) DOT(DOT(vdupq_n_s32(0), E, vld1q_s8(X)), O, vld1q_s8((X) + CPU_QBLOCK / 2))

/* The tile loops for both kernel sets; DOT is dot16 or dot16_sdot, NT a constant. Block k of a 4-bit
 * row: 16 bytes, low nibbles = even elements, high = odd ones. Block k of an 8-bit row: vld2q_u8 splits
 * its 32 bytes into even and odd elements. */
#define Q4_TILE(DOT)                                                                                    \
    const int64_t nb = a->cols / CPU_QBLOCK;                                                            \
    const int per_group = group / CPU_QBLOCK;                                                           \
    float32x4_t acc[CPU_QTILE];                                                                         \
    for (int j = 0; j < NT; j++)                                                                        \
        acc[j] = vdupq_n_f32(0);                                                                        \
    for (int64_t k = 0; k < nb; k++) {                                                                  \
        const uint8x16_t v = vld1q_u8(w + k * (CPU_QBLOCK / 2));                                         \
        const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(15)));                          \
        const int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));                                     \
        const float s = ws[k / per_group];                                                              \
        for (int j = 0; j < NT; j++) {                                                                  \
            const int64_t t = t0 + j;                                                                   \
            const int64_t off = t * a->cols + k * CPU_QBLOCK;                                           \
            const int32x4_t pq = DOT_BLOCK(DOT, lo, hi, a->q + off);                                    \
            const int32x4_t p = vmlaq_n_s32(DOT_BLOCK(DOT, lo, hi, a->r + off), pq, CPU_QDIGIT);         \
            acc[j] = vfmaq_f32(acc[j], vcvtq_f32_s32(p), vdupq_n_f32(a->d[t * nb + k] * s));            \
        }                                                                                               \
    }                                                                                                   \
    for (int j = 0; j < NT; j++)                                                                        \
        out[j] = vaddvq_f32(acc[j]);

#define Q8_TILE(DOT)                                                                                    \
    const int64_t nb = a->cols / CPU_QBLOCK;                                                            \
    const int per_group = group / CPU_QBLOCK;                                                           \
    const uint8x16_t m4 = vdupq_n_u8(15);                                                               \
    float32x4_t acc[CPU_QTILE];                                                                         \
    for (int j = 0; j < NT; j++)                                                                        \
        acc[j] = vdupq_n_f32(0);                                                                        \
    for (int64_t k = 0; k < nb; k++) {                                                                  \
        const uint8x16x2_t v = vld2q_u8(w + k * CPU_QBLOCK);                                             \
        const int8x16_t lo_e = vreinterpretq_s8_u8(vandq_u8(v.val[0], m4));                             \
        const int8x16_t hi_e = vreinterpretq_s8_u8(vshrq_n_u8(v.val[0], 4));                            \
        const int8x16_t lo_o = vreinterpretq_s8_u8(vandq_u8(v.val[1], m4));                             \
        const int8x16_t hi_o = vreinterpretq_s8_u8(vshrq_n_u8(v.val[1], 4));                            \
        const float s = ws[k / per_group];                                                              \
        for (int j = 0; j < NT; j++) {                                                                  \
            const int64_t t = t0 + j;                                                                   \
            const int64_t off = t * a->cols + k * CPU_QBLOCK;                                           \
            const int32x4_t pq = vaddq_s32(vshlq_n_s32(DOT_BLOCK(DOT, hi_e, hi_o, a->q + off), 4),      \
                                           DOT_BLOCK(DOT, lo_e, lo_o, a->q + off));                     \
            const int32x4_t pr = vaddq_s32(vshlq_n_s32(DOT_BLOCK(DOT, hi_e, hi_o, a->r + off), 4),      \
                                           DOT_BLOCK(DOT, lo_e, lo_o, a->r + off));                     \
            const int32x4_t p = vmlaq_n_s32(pr, pq, CPU_QDIGIT);                                        \
            acc[j] = vfmaq_f32(acc[j], vcvtq_f32_s32(p), vdupq_n_f32(a->d[t * nb + k] * s));            \
        }                                                                                               \
    }                                                                                                   \
    for (int j = 0; j < NT; j++)                                                                        \
        out[j] = vaddvq_f32(acc[j]);

NEON_INLINE void q4_tile(const uint8_t *w, const float *ws, int group, const cpu_qact *a, int t0, float *out,
                         const int NT)
{
    Q4_TILE(dot16)
}
NEON_INLINE void q8_tile(const uint8_t *w, const float *ws, int group, const cpu_qact *a, int t0, float *out,
                         const int NT)
{
    Q8_TILE(dot16)
}
DOTPROD_INLINE void q4_tile_sdot(const uint8_t *w, const float *ws, int group, const cpu_qact *a, int t0,
                                 float *out, const int NT)
{
    Q4_TILE(dot16_sdot)
}
DOTPROD_INLINE void q8_tile_sdot(const uint8_t *w, const float *ws, int group, const cpu_qact *a, int t0,
                                 float *out, const int NT)
{
    Q8_TILE(dot16_sdot)
}

/* The kernel entry points: nt picks a constant-NT instantiation. */
#define ENTRY(NAME, TILE, ATTR)                                                                         \
    ATTR static void NAME(const uint8_t *w, const float *ws, int group, const cpu_qact *a, int t0, int nt, \
                          float *out)                                                                   \
    {                                                                                                   \
        switch (nt) {                                                                                   \
        case 1: TILE(w, ws, group, a, t0, out, 1); break;                                               \
        case 2: TILE(w, ws, group, a, t0, out, 2); break;                                               \
        case 3: TILE(w, ws, group, a, t0, out, 3); break;                                               \
        default: TILE(w, ws, group, a, t0, out, 4); break;                                              \
        }                                                                                               \
    }

ENTRY(dot_q4, q4_tile, )
ENTRY(dot_q8, q8_tile, )
ENTRY(dot_q4_sdot, q4_tile_sdot, __attribute__((target("arch=armv8.2-a+dotprod"))))
ENTRY(dot_q8_sdot, q8_tile_sdot, __attribute__((target("arch=armv8.2-a+dotprod"))))

const cpu_qdot_kernels cpu_qdot_neon = {"neon", dot_q4, dot_q8, NULL, NULL, NULL, NULL, NULL, NULL};
const cpu_qdot_kernels cpu_qdot_neon_dotprod = {"neon-dotprod", dot_q4_sdot, dot_q8_sdot, NULL, NULL, NULL, NULL, NULL, NULL};
#endif
