/* quant_dot_avx2.c — the quant_dot.h kernels with AVX2 + FMA (x86-64): vpmaddubsw multiplies the
 * unsigned weight values by the signed int8 activations into int16 pairs, vpmaddwd sums those into
 * int32 lanes, and each block's lanes are scaled once in fp32. Compiled for AVX2 by function attribute,
 * run only where the CPU has it (quant_dot_dispatch.c).
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "quant_dot.h"

#define AVX2 __attribute__((target("avx2,fma"), always_inline)) static inline

/* Horizontal sum of 8 fp32 lanes (a fixed order). */
AVX2 float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Σ w·(254 xq + xr) of one block of 32 as 8 int32 lanes, each lane's pair sums times `mul` (w unsigned
 * 0..15 or a nibble, xq and xr int8: every int16 pair sum fits, and so does the int32 total). */
AVX2 __m256i block_dot(__m256i w, const int8_t *xq, const int8_t *xr, short mul)
{
    const __m256i ph = _mm256_maddubs_epi16(w, _mm256_loadu_si256((const __m256i *)xq));
    const __m256i pl = _mm256_maddubs_epi16(w, _mm256_loadu_si256((const __m256i *)xr));
    return _mm256_add_epi32(_mm256_madd_epi16(ph, _mm256_set1_epi16((short)(CPU_QDIGIT * mul))),
                            _mm256_madd_epi16(pl, _mm256_set1_epi16(mul)));
}

/* The 32 values of 4-bit block k as bytes in the activations' order: [low nibbles | high nibbles]. */
AVX2 __m256i unpack_q4(const uint8_t *w, int64_t k)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)(w + k * (CPU_QBLOCK / 2)));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(15));
}

/* NT is a constant in each call below, so the accumulators stay in registers. */
AVX2 void q4_tile(const uint8_t *w, const float *ws, int group, const cpu_qact *a, int t0, float *out, const int NT)
{
    const int64_t nb = a->cols / CPU_QBLOCK;
    const int per_group = group / CPU_QBLOCK;
    __m256 acc[CPU_QTILE];
    for (int j = 0; j < NT; j++)
        acc[j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < nb; k++) {
        const __m256i wv = unpack_q4(w, k);
        const float s = ws[k / per_group];
        for (int j = 0; j < NT; j++) {
            const int64_t t = t0 + j, off = t * a->cols + k * CPU_QBLOCK;
            const __m256i p = block_dot(wv, a->q + off, a->r + off, 1);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(a->d[t * nb + k] * s), acc[j]);
        }
    }
    for (int j = 0; j < NT; j++)
        out[j] = hsum(acc[j]);
}

/* 8-bit block k: 32 bytes in element order, reordered to [even | odd] (a byte shuffle in each 128-bit
 * lane, then the middle 64-bit quarters swapped), split into high and low nibbles: q = 16 hi + lo. */
AVX2 void unpack_q8(const uint8_t *w, int64_t k, __m256i *hi, __m256i *lo)
{
    const __m256i v = _mm256_loadu_si256((const __m256i *)(w + k * CPU_QBLOCK));
    const __m256i evens_odds = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                                0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m256i r = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, evens_odds), 0xD8);
    const __m256i m4 = _mm256_set1_epi8(15);
    *lo = _mm256_and_si256(r, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(r, 4), m4);
}

AVX2 void q8_tile(const uint8_t *w, const float *ws, int group, const cpu_qact *a, int t0, float *out, const int NT)
{
    const int64_t nb = a->cols / CPU_QBLOCK;
    const int per_group = group / CPU_QBLOCK;
    __m256 acc[CPU_QTILE];
    for (int j = 0; j < NT; j++)
        acc[j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < nb; k++) {
        __m256i hi, lo;
        unpack_q8(w, k, &hi, &lo);
        const float s = ws[k / per_group];
        for (int j = 0; j < NT; j++) {
            const int64_t t = t0 + j, off = t * a->cols + k * CPU_QBLOCK;
            /* 16 · (the high nibbles' sums) + the low nibbles' */
            const __m256i pi = _mm256_add_epi32(block_dot(hi, a->q + off, a->r + off, 16),
                                                block_dot(lo, a->q + off, a->r + off, 1));
            const __m256 p = _mm256_cvtepi32_ps(pi);
            acc[j] = _mm256_fmadd_ps(p, _mm256_set1_ps(a->d[t * nb + k] * s), acc[j]);
        }
    }
    for (int j = 0; j < NT; j++)
        out[j] = hsum(acc[j]);
}

__attribute__((target("avx2,fma"))) static void dot_q4(const uint8_t *w, const float *ws, int group,
                                                       const cpu_qact *a, int t0, int nt, float *out)
{
    switch (nt) {
    case 1: q4_tile(w, ws, group, a, t0, out, 1); break;
    case 2: q4_tile(w, ws, group, a, t0, out, 2); break;
    case 3: q4_tile(w, ws, group, a, t0, out, 3); break;
    default: q4_tile(w, ws, group, a, t0, out, 4); break;
    }
}

__attribute__((target("avx2,fma"))) static void dot_q8(const uint8_t *w, const float *ws, int group,
                                                       const cpu_qact *a, int t0, int nt, float *out)
{
    switch (nt) {
    case 1: q8_tile(w, ws, group, a, t0, out, 1); break;
    case 2: q8_tile(w, ws, group, a, t0, out, 2); break;
    case 3: q8_tile(w, ws, group, a, t0, out, 3); break;
    default: q8_tile(w, ws, group, a, t0, out, 4); break;
    }
}

const cpu_qdot_kernels cpu_qdot_avx2 = {"avx2", dot_q4, dot_q8};
#endif
