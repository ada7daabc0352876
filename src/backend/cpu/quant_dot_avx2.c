/* quant_dot_avx2.c — the quant_dot.h kernels with AVX2 + FMA (x86-64): the weight values widened to
 * int16 meet the activations' whole int16 values (v = 254 xq + xr) in vpmaddwd, one multiply per value
 * (the two int8 digits through vpmaddubsw took two, plus the digits' combination), summed into int32
 * lanes, and each block's lanes are scaled once in fp32. Compiled for AVX2 by function attribute,
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

/* Σ q_i v_i of one block of 32 as 8 int32 lanes: e and o hold the block's even and odd weight values
 * as int16 (0..255), x points at the block's 32 int16 activations [16 even | 16 odd]. Every product
 * pair fits int32 (255 · 32258 · 2), and so does the block. */
AVX2 __m256i block_dot(__m256i e, __m256i o, const int16_t *x)
{
    return _mm256_add_epi32(_mm256_madd_epi16(e, _mm256_loadu_si256((const __m256i *)x)),
                            _mm256_madd_epi16(o, _mm256_loadu_si256((const __m256i *)(x + CPU_QBLOCK / 2))));
}

/* 4-bit block k: 16 bytes, low nibbles = even elements, high nibbles = odd ones, widened to int16:
 * each byte zero-extends to a 16-bit lane, whose low nibble is the even value and whose value >> 4 is the
 * odd one (the lane's high byte is zero). */
AVX2 void unpack_q4(const uint8_t *w, int64_t k, __m256i *e, __m256i *o)
{
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(w + k * (CPU_QBLOCK / 2))));
    *e = _mm256_and_si256(b, _mm256_set1_epi16(15));
    *o = _mm256_srli_epi16(b, 4);
}

/* 8-bit block k: 32 bytes in element order, reordered to [even | odd] (a byte shuffle in each 128-bit
 * lane, then the middle 64-bit quarters swapped), widened to int16. */
AVX2 void unpack_q8(const uint8_t *w, int64_t k, __m256i *e, __m256i *o)
{
    const __m256i v = _mm256_loadu_si256((const __m256i *)(w + k * CPU_QBLOCK));
    const __m256i evens_odds = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                                0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m256i r = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, evens_odds), 0xD8);
    *e = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(r));
    *o = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(r, 1));
}

/* One row against NT token rows (NT a constant in each instantiation; the token loops are unrolled, so
 * the accumulators and row pointers stay in registers). Blocks are walked group by group: each block's
 * weights are unpacked once for all NT tokens, its int32 lanes scaled by the activation block's d into a
 * group sum, and each group sum by the weight scale once. BITS picks the unpacking. */
AVX2 void qdot_tile(const uint8_t *w, const float *ws, int group, const cpu_qact *a, int t0, float *out, const int NT,
                    const int BITS, const int PER_GROUP)
{
    const int64_t nb = a->cols / CPU_QBLOCK, cols = a->cols;
    const int per_group = PER_GROUP ? PER_GROUP : group / CPU_QBLOCK;
    const int16_t *xv[CPU_QTILE];
    const float *xd[CPU_QTILE];
    __m256 acc[CPU_QTILE];
#pragma GCC unroll 4
    for (int j = 0; j < NT; j++) {
        acc[j] = _mm256_setzero_ps();
        xv[j] = a->v + (t0 + j) * cols;
        xd[j] = a->d + (t0 + j) * nb;
    }
    for (int64_t k0 = 0, g = 0; k0 < nb; k0 += per_group, g++) {
        __m256 gacc[CPU_QTILE];
#pragma GCC unroll 4
        for (int j = 0; j < NT; j++)
            gacc[j] = _mm256_setzero_ps();
#pragma GCC unroll 2
        for (int64_t k = k0; k < k0 + per_group; k++) {
            __m256i e, o;
            if (BITS == 4)
                unpack_q4(w, k, &e, &o);
            else
                unpack_q8(w, k, &e, &o);
#pragma GCC unroll 4
            for (int j = 0; j < NT; j++) {
                const __m256i p = block_dot(e, o, xv[j] + k * CPU_QBLOCK);
                gacc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(xd[j] + k), gacc[j]);
            }
        }
        const __m256 s = _mm256_broadcast_ss(ws + g);
#pragma GCC unroll 4
        for (int j = 0; j < NT; j++)
            acc[j] = _mm256_fmadd_ps(gacc[j], s, acc[j]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < NT; j++)
        out[j] = hsum(acc[j]);
}

/* out[0..3] = hsum of each of a[0..3] in hsum's order: the four vectors transposed so that lane j of
 * each partial holds row j, then the same pairings hsum makes ((l0 + l2) + (l1 + l3) of lo + hi). */
AVX2 void hsum4(const __m256 *a, float *out)
{
    __m128 s0 = _mm_add_ps(_mm256_castps256_ps128(a[0]), _mm256_extractf128_ps(a[0], 1));
    __m128 s1 = _mm_add_ps(_mm256_castps256_ps128(a[1]), _mm256_extractf128_ps(a[1], 1));
    __m128 s2 = _mm_add_ps(_mm256_castps256_ps128(a[2]), _mm256_extractf128_ps(a[2], 1));
    __m128 s3 = _mm_add_ps(_mm256_castps256_ps128(a[3]), _mm256_extractf128_ps(a[3], 1));
    _MM_TRANSPOSE4_PS(s0, s1, s2, s3);
    _mm_storeu_ps(out, _mm_add_ps(_mm_add_ps(s0, s2), _mm_add_ps(s1, s3)));
}

/* Bytes ahead of each row's current block that qdot_rows asks the memory system for, one cache line
 * at a time: four rows read side by side are four streams the hardware prefetcher follows less well than
 * one (a 131072 x 1024 4-bit matrix out of DRAM, one thread: ~6.6-9 G multiply-adds/s without, about the one-row kernel's ~8.5; ~11 with it). */
#ifndef QROWS_PREFETCH
#define QROWS_PREFETCH 4096
#endif

/* CPU_QROWS rows against one token: qdot_tile's operations for NT = 1, per row, with the activation
 * block loaded once for the four rows and the rows' chains interleaved. */
AVX2 void qdot_rows(const uint8_t *w, int64_t row_bytes, const float *ws, int64_t ws_stride, int group,
                    const cpu_qact *a, int t, float *out, const int BITS, const int PER_GROUP)
{
    const int64_t nb = a->cols / CPU_QBLOCK;
    const int per_group = PER_GROUP ? PER_GROUP : group / CPU_QBLOCK;
    const int16_t *xv = a->v + (int64_t)t * a->cols;
    const float *xd = a->d + (int64_t)t * nb;
    __m256 acc[CPU_QROWS];
#pragma GCC unroll 4
    for (int r = 0; r < CPU_QROWS; r++)
        acc[r] = _mm256_setzero_ps();
    for (int64_t k0 = 0, g = 0; k0 < nb; k0 += per_group, g++) {
        __m256 gacc[CPU_QROWS];
#pragma GCC unroll 4
        for (int r = 0; r < CPU_QROWS; r++)
            gacc[r] = _mm256_setzero_ps();
#pragma GCC unroll 2
        for (int64_t k = k0; k < k0 + per_group; k++) {
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xv + k * CPU_QBLOCK));
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xv + k * CPU_QBLOCK + CPU_QBLOCK / 2));
            const __m256 d = _mm256_broadcast_ss(xd + k);
#pragma GCC unroll 4
            for (int r = 0; r < CPU_QROWS; r++) {
                __m256i e, o;
                if ((k & (BITS == 4 ? 3 : 1)) == 0)
                    _mm_prefetch((const char *)w + r * row_bytes + k * (CPU_QBLOCK * BITS / 8) + QROWS_PREFETCH,
                                 _MM_HINT_T0);
                if (BITS == 4)
                    unpack_q4(w + r * row_bytes, k, &e, &o);
                else
                    unpack_q8(w + r * row_bytes, k, &e, &o);
                const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(e, x0), _mm256_madd_epi16(o, x1));
                gacc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), d, gacc[r]);
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < CPU_QROWS; r++)
            acc[r] = _mm256_fmadd_ps(gacc[r], _mm256_broadcast_ss(ws + r * ws_stride + g), acc[r]);
    }
    hsum4(acc, out);
}

/* The entry points for BITS-bit weights: the token count and MLX's default group of 64 (the block loop
 * unrolled) picked at run time among the constant-argument instantiations. */
#define QDOT_ENTRIES(BITS)                                                                                  \
    __attribute__((target("avx2,fma"))) static void rows_q##BITS(const uint8_t *w, int64_t row_bytes,    \
                                                                 const float *ws, int64_t ws_stride,     \
                                                                 int group, const cpu_qact *a, int t,    \
                                                                 float *out)                             \
    {                                                                                                    \
        if (group == 2 * CPU_QBLOCK)                                                                     \
            qdot_rows(w, row_bytes, ws, ws_stride, group, a, t, out, BITS, 2);                           \
        else                                                                                             \
            qdot_rows(w, row_bytes, ws, ws_stride, group, a, t, out, BITS, 0);                           \
    }                                                                                                    \
    __attribute__((target("avx2,fma"))) static void dot_q##BITS(const uint8_t *w, const float *ws,       \
                                                                int group, const cpu_qact *a, int t0,    \
                                                                int nt, float *out)                      \
    {                                                                                                    \
        switch (nt * 4 + (group == 2 * CPU_QBLOCK ? 2 : 0)) {                                            \
        case 4: qdot_tile(w, ws, group, a, t0, out, 1, BITS, 0); break;                                  \
        case 6: qdot_tile(w, ws, group, a, t0, out, 1, BITS, 2); break;                                  \
        case 8: qdot_tile(w, ws, group, a, t0, out, 2, BITS, 0); break;                                  \
        case 10: qdot_tile(w, ws, group, a, t0, out, 2, BITS, 2); break;                                 \
        case 12: qdot_tile(w, ws, group, a, t0, out, 3, BITS, 0); break;                                 \
        case 14: qdot_tile(w, ws, group, a, t0, out, 3, BITS, 2); break;                                 \
        case 18: qdot_tile(w, ws, group, a, t0, out, 4, BITS, 2); break;                                 \
        default: qdot_tile(w, ws, group, a, t0, out, 4, BITS, 0); break;                                 \
        }                                                                                                \
    }

QDOT_ENTRIES(4)
QDOT_ENTRIES(8)

const cpu_qdot_kernels cpu_qdot_avx2 = {"avx2", dot_q4, dot_q8, rows_q4, rows_q8};
#endif
