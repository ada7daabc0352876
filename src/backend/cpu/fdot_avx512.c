/* fdot_avx512.c — the fdot.h kernels with AVX-512 F/BW/VL (x86-64): fdot_avx2.c's arithmetic at twice the
 * width, a whole block of 32 columns (16 bytes) per vpmovzxbd, the even columns' q by a table lookup (6
 * vector operations per 32 weights), 4-bit rows two at a time (sharing the activation loads); prep_q4 is
 * the AVX2 set's. Compiled by function attribute and run only where the CPU has it (fdot_dispatch.c).
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "fdot.h"

#define AVX512_TARGET "avx512f,avx512bw,avx512vl,avx2,fma,f16c"
#define AVX512 __attribute__((target(AVX512_TARGET), always_inline)) static inline


/* The fp32 values of bf16 src[0..n), n <= 16, in lanes 0..n-1 (the others 0). */
AVX512 __m512 bf16_chunk(const uint16_t *src, int64_t n)
{
    const __m256i v = _mm256_maskz_loadu_epi16((__mmask16)((1u << n) - 1u), src);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

/* R (1 or 2) 4-bit rows: row r's bytes at w + r * row_bytes, its scales / biases at s / b + r * sbs; the
 * rows share each block's activation loads. Block k (bytes 16k .. 16k + 15) widens to 16 int32 lanes; the
 * even columns' q is the lane's low nibble, looked up in {0, 1, ..., 15} by vpermps (which reads the
 * index's low 4 bits only), the odd columns' 16 q is lane & 240 converted. Per group the scale multiplies
 * the two partial sums (broadcast from the row's scales, converted 16 groups at a time); the bias terms
 * accumulate in lanes; one sum across lanes at the end. */
AVX512 void rows_q4_r(const uint8_t *w, int64_t row_bytes, const uint16_t *s, const uint16_t *b, int64_t sbs,
                      int group, const float *xe, const float *xsum, int64_t cols, float *out, const int R)
{
    const __m512i hi = _mm512_set1_epi32(240);
    const __m512 lut = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const int64_t ng = cols / group, bpg = group / 32;
    __m512 acc0[2], acc1[2], bias[2];
    float sf[2][16];
    for (int r = 0; r < R; r++)
        acc0[r] = acc1[r] = bias[r] = _mm512_setzero_ps();
    for (int64_t g0 = 0; g0 < ng; g0 += 16) {
        const int64_t n = ng - g0 < 16 ? ng - g0 : 16;
        const __m512 xs = _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), xsum + g0);
        for (int r = 0; r < R; r++) {
            _mm512_storeu_ps(sf[r], bf16_chunk(s + r * sbs + g0, n));
            bias[r] = _mm512_fmadd_ps(bf16_chunk(b + r * sbs + g0, n), xs, bias[r]);
        }
        for (int64_t j = 0; j < n; j++) {
            const int64_t k0 = (g0 + j) * bpg;
            __m512 d0[2], d1[2];
            for (int r = 0; r < R; r++)
                d0[r] = d1[r] = _mm512_setzero_ps();
            for (int64_t k = k0; k < k0 + bpg; k++) {
                const __m512 xa = _mm512_loadu_ps(xe + 32 * k), xb = _mm512_loadu_ps(xe + 32 * k + 16);
                for (int r = 0; r < R; r++) {
                    const __m512i i = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + r * row_bytes + 16 * k)));
                    d0[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(i, lut), xa, d0[r]);
                    d1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(i, hi)), xb, d1[r]);
                }
            }
            for (int r = 0; r < R; r++) {
                const __m512 sv = _mm512_set1_ps(sf[r][j]);
                acc0[r] = _mm512_fmadd_ps(sv, d0[r], acc0[r]);
                acc1[r] = _mm512_fmadd_ps(sv, d1[r], acc1[r]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        out[r] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0[r], acc1[r]), bias[r]));
}

AVX512 float row_q8(const uint8_t *w, const uint16_t *s, const uint16_t *b, int group, const float *xe,
                    const float *xsum, int64_t cols)
{
    const int64_t ng = cols / group;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, bias = acc0;
    float sf[16];
    for (int64_t g0 = 0; g0 < ng; g0 += 16) {
        const int64_t n = ng - g0 < 16 ? ng - g0 : 16;
        _mm512_storeu_ps(sf, bf16_chunk(s + g0, n));
        bias = _mm512_fmadd_ps(bf16_chunk(b + g0, n), _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), xsum + g0), bias);
        for (int64_t j = 0; j < n; j++) {
            const int64_t c0 = (g0 + j) * group;
            __m512 d0 = _mm512_setzero_ps(), d1 = d0;
            for (int64_t c = c0; c < c0 + group; c += 32) {
                d0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + c)))),
                                     _mm512_loadu_ps(xe + c), d0);
                d1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + c + 16)))),
                                     _mm512_loadu_ps(xe + c + 16), d1);
            }
            const __m512 sv = _mm512_set1_ps(sf[j]);
            acc0 = _mm512_fmadd_ps(sv, d0, acc0);
            acc1 = _mm512_fmadd_ps(sv, d1, acc1);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), bias));
}

__attribute__((target(AVX512_TARGET))) static void rows_q4(const uint8_t *w, int64_t row_bytes, const uint16_t *s,
                                                           const uint16_t *b, int64_t sb_stride, int nrows, int group,
                                                           const float *xe, const float *xsum, int64_t cols, float *out)
{
    int r = 0;
    for (; r + 2 <= nrows; r += 2)
        rows_q4_r(w + r * row_bytes, row_bytes, s + r * sb_stride, b + r * sb_stride, sb_stride, group, xe, xsum, cols,
                  out + r, 2);
    if (r < nrows)
        rows_q4_r(w + r * row_bytes, row_bytes, s + r * sb_stride, b + r * sb_stride, sb_stride, group, xe, xsum, cols,
                  out + r, 1);
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
