/* fdot_avx2.c — the fdot.h kernels with AVX2 + FMA + F16C (x86-64), compiled by function attribute and
 * run only where the CPU has them (fdot_dispatch.c). 4-bit rows: 8 bytes (16 columns) widen to 8 int32
 * lanes (vpmovzxbd); byte & 15 is the even column's q and byte & 240 the odd column's 16 q, each
 * converted to fp32 and multiplied by the stored values in place (fdot.h's layout): 7 vector operations
 * per 16 weights. Per group four FMA chains, their sums times the scale into two lane accumulators, the
 * bias terms in a third, summed across lanes at the row's end. One row at a time (two rows sharing the
 * activation loads spill: 16 registers).
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "fdot.h"

#define AVX2_TARGET "avx2,fma,f16c"
#define AVX2 __attribute__((target(AVX2_TARGET), always_inline)) static inline

AVX2 float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 float bf16f(uint16_t h) { return _mm_cvtss_f32(_mm_castsi128_ps(_mm_cvtsi32_si128((int)((uint32_t)h << 16)))); }

__attribute__((target(AVX2_TARGET))) float cpu_fdot_avx2_prep_q4(const float *x, int64_t cols, int group, float *xe,
                                                                 float *xsum)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int64_t c = 0; c < cols; c += 8) /* a NaN |x| (first operand) leaves m */
        m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + c)), m);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float k = cpu_fdot_x_scale(_mm_cvtss_f32(m4));
    const __m256 kv = _mm256_set1_ps(k), odd = _mm256_setr_ps(1.0f, 0.0625f, 1.0f, 0.0625f, 1.0f, 0.0625f, 1.0f, 0.0625f);
    for (int64_t c = 0; c < cols; c += 16) { /* 16 columns: half c % 32 / 16 of block c / 32 */
        __m256 a = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + c), kv), odd);
        __m256 b = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + c + 8), kv), odd);
        a = _mm256_cvtph_ps(_mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        b = _mm256_cvtph_ps(_mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        /* a0 a2 b0 b2 | a4 a6 b4 b6 -> a0 a2 a4 a6 b0 b2 b4 b6 (and the odd ones alike) */
        const __m256 ev = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
        const __m256 od = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
        float *dst = xe + (c / 32) * 32 + (c % 32) / 2;
        _mm256_storeu_ps(dst, ev);
        _mm256_storeu_ps(dst + 16, od);
    }
    cpu_fdot_group_sums_q4(xe, cols, group, xsum);
    return k;
}

/* The fp32 values of bf16 src[0..n), n <= 8, in lanes 0..n-1 (the others 0). */
AVX2 __m256 bf16_chunk(const uint16_t *src, int64_t n)
{
    if (n == 8)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)src)), 16));
    float v[8] = {0};
    for (int64_t i = 0; i < n; i++)
        v[i] = bf16f(src[i]);
    return _mm256_loadu_ps(v);
}

/* One 4-bit row. Per group the scale multiplies the partial sums (broadcast from the row's scales,
 * converted 8 groups at a time); the bias terms accumulate in lanes; one sum across lanes at the end. */
AVX2 float row_q4(const uint8_t *w, const uint16_t *s, const uint16_t *b, int group, const float *xe,
                  const float *xsum, int64_t cols)
{
    const __m256i lo = _mm256_set1_epi32(15), hi = _mm256_set1_epi32(240);
    const int64_t ng = cols / group, bpg = group / 32;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, bias = acc0;
    float sf[8];
    for (int64_t g0 = 0; g0 < ng; g0 += 8) {
        const int64_t n = ng - g0 < 8 ? ng - g0 : 8;
        float xs8[8] = {0};
        for (int64_t j = 0; j < n; j++)
            xs8[j] = xsum[g0 + j];
        _mm256_storeu_ps(sf, bf16_chunk(s + g0, n));
        bias = _mm256_fmadd_ps(bf16_chunk(b + g0, n), _mm256_loadu_ps(xs8), bias);
        for (int64_t j = 0; j < n; j++) {
            const int64_t k0 = (g0 + j) * bpg;
            __m256 d0 = _mm256_setzero_ps(), d1 = d0, d2 = d0, d3 = d0;
            for (int64_t k = k0; k < k0 + bpg; k++) { /* block k: bytes 16k .. 16k + 15, two halves of 8 */
                const float *xk = xe + 32 * k;
                const __m256i i0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w + 16 * k)));
                const __m256i i1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w + 16 * k + 8)));
                d0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(i0, lo)), _mm256_loadu_ps(xk), d0);
                d1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(i0, hi)), _mm256_loadu_ps(xk + 16), d1);
                d2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(i1, lo)), _mm256_loadu_ps(xk + 8), d2);
                d3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(i1, hi)), _mm256_loadu_ps(xk + 24), d3);
            }
            const __m256 sv = _mm256_set1_ps(sf[j]);
            acc0 = _mm256_fmadd_ps(sv, _mm256_add_ps(d0, d2), acc0);
            acc1 = _mm256_fmadd_ps(sv, _mm256_add_ps(d1, d3), acc1);
        }
    }
    return hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), bias));
}

AVX2 float row_q8(const uint8_t *w, const uint16_t *s, const uint16_t *b, int group, const float *xe,
                  const float *xsum, int64_t cols)
{
    __m256 acc = _mm256_setzero_ps();
    float bias = 0.0f;
    for (int64_t g = 0; g < cols / group; g++) {
        __m256 d0 = _mm256_setzero_ps(), d1 = d0, d2 = d0, d3 = d0;
        for (int64_t c = g * group; c < (g + 1) * group; c += 32) {
            d0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w + c)))),
                                 _mm256_loadu_ps(xe + c), d0);
            d1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w + c + 8)))),
                                 _mm256_loadu_ps(xe + c + 8), d1);
            d2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w + c + 16)))),
                                 _mm256_loadu_ps(xe + c + 16), d2);
            d3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w + c + 24)))),
                                 _mm256_loadu_ps(xe + c + 24), d3);
        }
        const __m256 d = _mm256_add_ps(_mm256_add_ps(d0, d1), _mm256_add_ps(d2, d3));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(bf16f(s[g])), d, acc);
        bias = __builtin_fmaf(bf16f(b[g]), xsum[g], bias);
    }
    return hsum(acc) + bias;
}

__attribute__((target(AVX2_TARGET))) static void rows_q4(const uint8_t *w, int64_t row_bytes, const uint16_t *s,
                                                         const uint16_t *b, int64_t sb_stride, int nrows, int group,
                                                         const float *xe, const float *xsum, int64_t cols, float *out)
{
    for (int r = 0; r < nrows; r++)
        out[r] = row_q4(w + r * row_bytes, s + r * sb_stride, b + r * sb_stride, group, xe, xsum, cols);
}

__attribute__((target(AVX2_TARGET))) static void rows_q8(const uint8_t *w, int64_t row_bytes, const uint16_t *s,
                                                         const uint16_t *b, int64_t sb_stride, int nrows, int group,
                                                         const float *xe, const float *xsum, int64_t cols, float *out)
{
    for (int r = 0; r < nrows; r++)
        out[r] = row_q8(w + r * row_bytes, s + r * sb_stride, b + r * sb_stride, group, xe, xsum, cols);
}

const cpu_fdot_kernels cpu_fdot_avx2 = {"avx2", cpu_fdot_avx2_prep_q4, rows_q4, rows_q8};
#endif
