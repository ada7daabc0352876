/* fdot_avx512.c — the fdot.h kernels with AVX-512 F (x86-64): fdot_avx2.c's arithmetic at twice the width,
 * a whole block of 32 columns (16 bytes) per vpmovzxbd; prep_q4 is the AVX2 set's. Compiled by function
 * attribute and run only where the CPU has it (fdot_dispatch.c).
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "fdot.h"

#define AVX512_TARGET "avx512f,avx2,fma,f16c"
#define AVX512 __attribute__((target(AVX512_TARGET), always_inline)) static inline

AVX512 float bf16f(uint16_t h) { return _mm_cvtss_f32(_mm_castsi128_ps(_mm_cvtsi32_si128((int)h << 16))); }

AVX512 float row_q4(const uint8_t *w, const uint16_t *s, const uint16_t *b, int group, const float *xe,
                    const float *xsum, int64_t cols)
{
    const __m512i lo = _mm512_set1_epi32(15), hi = _mm512_set1_epi32(240);
    __m512 acc = _mm512_setzero_ps();
    float bias = 0.0f;
    for (int64_t g = 0; g < cols / group; g++) {
        __m512 d0 = _mm512_setzero_ps(), d1 = d0;
        for (int64_t k = g * group / 32; k < (g + 1) * group / 32; k++) { /* block k: bytes 16k .. 16k + 15 */
            const __m512i i = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + 16 * k)));
            d0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(i, lo)), _mm512_loadu_ps(xe + 32 * k), d0);
            d1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(i, hi)), _mm512_loadu_ps(xe + 32 * k + 16), d1);
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(bf16f(s[g])), _mm512_add_ps(d0, d1), acc);
        bias = __builtin_fmaf(bf16f(b[g]), xsum[g], bias);
    }
    return _mm512_reduce_add_ps(acc) + bias;
}

AVX512 float row_q8(const uint8_t *w, const uint16_t *s, const uint16_t *b, int group, const float *xe,
                    const float *xsum, int64_t cols)
{
    __m512 acc = _mm512_setzero_ps();
    float bias = 0.0f;
    for (int64_t g = 0; g < cols / group; g++) {
        __m512 d0 = _mm512_setzero_ps(), d1 = d0;
        for (int64_t c = g * group; c < (g + 1) * group; c += 32) {
            d0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + c)))),
                                 _mm512_loadu_ps(xe + c), d0);
            d1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + c + 16)))),
                                 _mm512_loadu_ps(xe + c + 16), d1);
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(bf16f(s[g])), _mm512_add_ps(d0, d1), acc);
        bias = __builtin_fmaf(bf16f(b[g]), xsum[g], bias);
    }
    return _mm512_reduce_add_ps(acc) + bias;
}

__attribute__((target(AVX512_TARGET))) static void rows_q4(const uint8_t *w, int64_t row_bytes, const uint16_t *s,
                                                           const uint16_t *b, int64_t sb_stride, int nrows, int group,
                                                           const float *xe, const float *xsum, int64_t cols, float *out)
{
    for (int r = 0; r < nrows; r++)
        out[r] = row_q4(w + r * row_bytes, s + r * sb_stride, b + r * sb_stride, group, xe, xsum, cols);
}

__attribute__((target(AVX512_TARGET))) static void rows_q8(const uint8_t *w, int64_t row_bytes, const uint16_t *s,
                                                           const uint16_t *b, int64_t sb_stride, int nrows, int group,
                                                           const float *xe, const float *xsum, int64_t cols, float *out)
{
    for (int r = 0; r < nrows; r++)
        out[r] = row_q8(w + r * row_bytes, s + r * sb_stride, b + r * sb_stride, group, xe, xsum, cols);
}

const cpu_fdot_kernels cpu_fdot_avx512 = {"avx512", cpu_fdot_avx2_prep_q4, rows_q4, rows_q8};
#endif
