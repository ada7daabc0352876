/* quant_dot_avx2.c — the quant_dot.h kernels with AVX2 + FMA (x86-64): the weight values widened to
 * int16 meet the activations' whole int16 values (v = 254 xq + xr) in vpmaddwd, one multiply per value
 * (the two int8 digits through vpmaddubsw took two, plus the digits' combination). Compiled for AVX2 by
 * function attribute, run only where the CPU has it (quant_dot_dispatch.c).
 *
 * 8-bit rows: each block's 8 int32 lanes are scaled in fp32 lane by lane and the lanes summed at the end.
 * 4-bit rows: each block's sum is formed exactly in int32 first (|Σ q_i v_i| <= 32 · 15 · 32258 < 2^24,
 * so its conversion to fp32 is exact too), and then, per (row, token), in this order:
 *     G_g = 0;  G_g = fma((float) isum_k, d_k, G_g) for the blocks k of group g in order
 *     acc = 0;  acc = fma(G_g, s_g, acc) for the groups g in order
 * — the same fp32 steps in the one-row (dot_q4), four-row (rows_q4) and tile (gemm_q4) kernels, whatever
 * holds the lanes. That order lets prefill's tile kernel keep tokens in the vector lanes: a block of one
 * weight row meets 8 tokens with one broadcast per pair of weights, and the int32 sums need no fp32 work
 * until the block ends (one convert and one FMA per 32 values instead of per 4).
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#include "quant_dot.h"
#include "quant_dot_x86.h"

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

/* The 8-bit entry points: the token count and MLX's default group of 64 (the block loop unrolled) picked
 * at run time among the constant-argument instantiations. */
__attribute__((target("avx2,fma"))) void cpu_qdot_avx2_rows_q8(const uint8_t *w, int64_t row_bytes, const float *ws,
                                                        int64_t ws_stride, int group, const cpu_qact *a, int t,
                                                        float *out)
{
    if (group == 2 * CPU_QBLOCK)
        qdot_rows(w, row_bytes, ws, ws_stride, group, a, t, out, 8, 2);
    else
        qdot_rows(w, row_bytes, ws, ws_stride, group, a, t, out, 8, 0);
}

__attribute__((target("avx2,fma"))) void cpu_qdot_avx2_dot_q8(const uint8_t *w, const float *ws, int group,
                                                       const cpu_qact *a, int t0, int nt, float *out)
{
    switch (nt * 4 + (group == 2 * CPU_QBLOCK ? 2 : 0)) {
    case 4: qdot_tile(w, ws, group, a, t0, out, 1, 8, 0); break;
    case 6: qdot_tile(w, ws, group, a, t0, out, 1, 8, 2); break;
    case 8: qdot_tile(w, ws, group, a, t0, out, 2, 8, 0); break;
    case 10: qdot_tile(w, ws, group, a, t0, out, 2, 8, 2); break;
    case 12: qdot_tile(w, ws, group, a, t0, out, 3, 8, 0); break;
    case 14: qdot_tile(w, ws, group, a, t0, out, 3, 8, 2); break;
    case 18: qdot_tile(w, ws, group, a, t0, out, 4, 8, 2); break;
    default: qdot_tile(w, ws, group, a, t0, out, 4, 8, 0); break;
    }
}

/* ---- 4-bit rows: exact block sums (the order at the top of the file) ---- */

/* The sum of p's 8 int32 lanes. */
AVX2 int32_t hsum_epi32(__m256i p)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* [Σ lanes of p0, of p1, of p2, of p3] (int32, exact). */
AVX2 __m128i hsum4_epi32(__m256i p0, __m256i p1, __m256i p2, __m256i p3)
{
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* One 4-bit row against token t. */
AVX2 float q4_dot_one(const uint8_t *w, const float *ws, int per_group, const cpu_qact *a, int t)
{
    const int64_t nb = a->cols / CPU_QBLOCK;
    const int16_t *xv = a->v + (int64_t)t * a->cols;
    const float *xd = a->d + (int64_t)t * nb;
    __m128 acc = _mm_setzero_ps();
    for (int64_t k0 = 0, g = 0; k0 < nb; k0 += per_group, g++) {
        __m128 G = _mm_setzero_ps();
        for (int64_t k = k0; k < k0 + per_group; k++) {
            __m256i e, o;
            unpack_q4(w, k, &e, &o);
            const int32_t isum = hsum_epi32(block_dot(e, o, xv + k * CPU_QBLOCK));
            G = _mm_fmadd_ss(_mm_cvtsi32_ss(_mm_setzero_ps(), isum), _mm_load_ss(xd + k), G);
        }
        acc = _mm_fmadd_ss(G, _mm_load_ss(ws + g), acc);
    }
    return _mm_cvtss_f32(acc);
}

__attribute__((target("avx2,fma"))) void cpu_qdot_avx2_dot_q4(const uint8_t *w, const float *ws, int group,
                                                       const cpu_qact *a, int t0, int nt, float *out)
{
    for (int j = 0; j < nt; j++)
        out[j] = q4_dot_one(w, ws, group / CPU_QBLOCK, a, t0 + j);
}

/* CPU_QROWS 4-bit rows against token t: the four rows' block sums side by side in one 4-lane vector
 * (one horizontal-add tree per block for the four rows), each row's weights asked for QROWS_PREFETCH
 * bytes ahead. */
AVX2 void q4_rows(const uint8_t *w, int64_t row_bytes, const float *ws, int64_t ws_stride, int group,
                  const cpu_qact *a, int t, float *out, const int PER_GROUP)
{
    const int64_t nb = a->cols / CPU_QBLOCK;
    const int per_group = PER_GROUP ? PER_GROUP : group / CPU_QBLOCK;
    const int16_t *xv = a->v + (int64_t)t * a->cols;
    const float *xd = a->d + (int64_t)t * nb;
    __m128 acc = _mm_setzero_ps();
    for (int64_t k0 = 0, g = 0; k0 < nb; k0 += per_group, g++) {
        __m128 G = _mm_setzero_ps();
#pragma GCC unroll 2
        for (int64_t k = k0; k < k0 + per_group; k++) {
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xv + k * CPU_QBLOCK));
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xv + k * CPU_QBLOCK + CPU_QBLOCK / 2));
            __m256i p[CPU_QROWS];
#pragma GCC unroll 4
            for (int r = 0; r < CPU_QROWS; r++) {
                __m256i e, o;
                if ((k & 3) == 0)
                    _mm_prefetch((const char *)w + r * row_bytes + k * (CPU_QBLOCK / 2) + QROWS_PREFETCH, _MM_HINT_T0);
                unpack_q4(w + r * row_bytes, k, &e, &o);
                p[r] = _mm256_add_epi32(_mm256_madd_epi16(e, x0), _mm256_madd_epi16(o, x1));
            }
            G = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum4_epi32(p[0], p[1], p[2], p[3])), _mm_broadcast_ss(xd + k), G);
        }
        acc = _mm_fmadd_ps(G, _mm_setr_ps(ws[g], ws[ws_stride + g], ws[2 * ws_stride + g], ws[3 * ws_stride + g]), acc);
    }
    _mm_storeu_ps(out, acc);
}

__attribute__((target("avx2,fma"))) static void rows_q4(const uint8_t *w, int64_t row_bytes, const float *ws,
                                                        int64_t ws_stride, int group, const cpu_qact *a, int t,
                                                        float *out)
{
    if (group == 2 * CPU_QBLOCK)
        q4_rows(w, row_bytes, ws, ws_stride, group, a, t, out, 2);
    else
        q4_rows(w, row_bytes, ws, ws_stride, group, a, t, out, 0);
}

/* Decode's four-row kernel on 16-bit words (prep_q4, rows_q4_prep; quant_dot_avx512.c's form on 256-bit
 * vectors). A 4-bit row read as 16-bit words: word j holds elements 4j .. 4j + 3 at bits 0, 4, 8, 12, so
 * nibble c of every word is one shift and one mask: a chunk of 2 blocks (32 bytes) becomes 4 vectors of
 * 16 int16 weights with no byte widening (the vpmovzxbw of q4_rows, a shuffle-port operation per block and
 * row). prep_q4 lays the token's values out to match, once per call of the driver:
 * xn[ch * 64 + c * 16 + j] = v of element 4j + c of chunk ch (j < 16), zeros past the last block. */
__attribute__((target("avx2,fma"))) static void prep_q4(const cpu_qact *a, int t, int16_t *xn)
{
    const int64_t nb = a->cols / CPU_QBLOCK, nch = (nb + 1) / 2;
    const int16_t *v = a->v + (int64_t)t * a->cols;
    for (int64_t ch = 0; ch < nch; ch++)
        for (int c = 0; c < 4; c++)
            for (int j = 0; j < 16; j++) {
                const int64_t k = 2 * ch + j / 8; /* the block; element 4 (j % 8) + c in it */
                const int e = 4 * (j % 8) + c;
                /* the stored [16 even | 16 odd] order */
                xn[ch * 64 + c * 16 + j] = k < nb ? v[k * CPU_QBLOCK + (e % 2 ? 16 + e / 2 : e / 2)] : 0;
            }
}

AVX2 void q4_rows_prep(const uint8_t *w, int64_t row_bytes, const float *wst, int64_t ld, int group,
                       const int16_t *xn, const float *xd, int64_t cols, float *out, const int PER_GROUP)
{
    const int64_t nb = cols / CPU_QBLOCK, nch = (nb + 1) / 2;
    const int per_group = PER_GROUP ? PER_GROUP : group / CPU_QBLOCK;
    const __m256i m15 = _mm256_set1_epi16(15);
    __m128 acc = _mm_setzero_ps(), G = _mm_setzero_ps();
    int64_t k = 0, g = 0;
    int left = per_group; /* blocks left in group g */
    for (int64_t ch = 0; ch < nch; ch++) {
        const int nblk = nb - 2 * ch < 2 ? 1 : 2;
        const __m256i A0 = _mm256_loadu_si256((const __m256i *)(xn + ch * 64));
        const __m256i A1 = _mm256_loadu_si256((const __m256i *)(xn + ch * 64 + 16));
        const __m256i A2 = _mm256_loadu_si256((const __m256i *)(xn + ch * 64 + 32));
        const __m256i A3 = _mm256_loadu_si256((const __m256i *)(xn + ch * 64 + 48));
        __m256i R[CPU_QROWS];
#pragma GCC unroll 4
        for (int r = 0; r < CPU_QROWS; r++) {
            const uint8_t *wr = w + r * row_bytes + ch * 32;
            if ((ch & 1) == 0)
                _mm_prefetch((const char *)wr + QROWS_PREFETCH, _MM_HINT_T0);
            const __m256i b = nblk == 2 ? _mm256_loadu_si256((const __m256i *)wr)
                                        : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)wr));
            const __m256i p01 = _mm256_add_epi32(_mm256_madd_epi16(_mm256_and_si256(b, m15), A0),
                                                 _mm256_madd_epi16(_mm256_and_si256(_mm256_srli_epi16(b, 4), m15), A1));
            const __m256i p23 = _mm256_add_epi32(_mm256_madd_epi16(_mm256_and_si256(_mm256_srli_epi16(b, 8), m15), A2),
                                                 _mm256_madd_epi16(_mm256_srli_epi16(b, 12), A3));
            R[r] = _mm256_add_epi32(p01, p23);
        }
        /* per 128-bit half (a block): lanes of R[r] summed into lane r (exact int32) */
        const __m256i t01 = _mm256_add_epi32(_mm256_unpacklo_epi32(R[0], R[1]), _mm256_unpackhi_epi32(R[0], R[1]));
        const __m256i t23 = _mm256_add_epi32(_mm256_unpacklo_epi32(R[2], R[3]), _mm256_unpackhi_epi32(R[2], R[3]));
        const __m256 F = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_unpacklo_epi64(t01, t23), _mm256_unpackhi_epi64(t01, t23)));
        const __m128 f[2] = {_mm256_castps256_ps128(F), _mm256_extractf128_ps(F, 1)};
#pragma GCC unroll 2
        for (int b = 0; b < 2; b++) {
            if (b >= nblk)
                break;
            G = _mm_fmadd_ps(f[b], _mm_broadcast_ss(xd + k), G);
            k++;
            if (--left == 0) {
                acc = _mm_fmadd_ps(G, _mm_loadu_ps(wst + g * ld), acc);
                G = _mm_setzero_ps();
                g++;
                left = per_group;
            }
        }
    }
    _mm_storeu_ps(out, acc);
}

__attribute__((target("avx2,fma"))) static void rows_q4_prep(const uint8_t *w, int64_t row_bytes, const float *wst,
                                                             int64_t ld, int group, const int16_t *xn, const float *xd,
                                                             int64_t cols, float *out)
{
    if (group == 2 * CPU_QBLOCK)
        q4_rows_prep(w, row_bytes, wst, ld, group, xn, xd, cols, out, 2);
    else
        q4_rows_prep(w, row_bytes, wst, ld, group, xn, xd, cols, out, 0);
}

#define LILY_QMAX(a, b) ((a) > (b) ? (a) : (b))
#define LILY_QMIN(a, b) ((a) < (b) ? (a) : (b))
/* Bytes of unpacked weight rows per pass of gemm_q4, and of packed token tiles per tile group: each tile
 * is packed once per call, each weight row once per tile group. */
#define QGEMM_PASS_BYTES 65536
#define QGEMM_TILE_BYTES 131072

/* Weight rows [0, nrows) of w unpacked for gemm_q4, rows [nrows, rows_pad) zero: pk[r * nb * 16 + k * 16 + p]
 * holds row r's elements 2p and 2p + 1 of block k as the low and high int16 of one int32 (the pair one
 * vpmaddwd lane multiplies). */
__attribute__((target("avx2,fma"))) void cpu_qdot_avx2_pack_rows(const uint8_t *w, int64_t row_bytes, int64_t nrows,
                                                               int64_t rows_pad, int64_t nb, int32_t *pk)
{
    for (int64_t r = 0; r < rows_pad; r++) {
        int32_t *dst = pk + r * nb * 16;
        if (r >= nrows) {
            memset(dst, 0, (size_t)nb * 16 * sizeof(int32_t));
            continue;
        }
        for (int64_t k = 0; k < nb; k++) {
            __m256i e, o;
            unpack_q4(w + r * row_bytes, k, &e, &o);
            /* per 128-bit lane: pairs 0-3 | 8-11 (lo) and 4-7 | 12-15 (hi) */
            const __m256i lo = _mm256_unpacklo_epi16(e, o), hi = _mm256_unpackhi_epi16(e, o);
            _mm256_storeu_si256((__m256i *)(dst + k * 16), _mm256_permute2x128_si256(lo, hi, 0x20));
            _mm256_storeu_si256((__m256i *)(dst + k * 16 + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
        }
    }
}

/* m[i] lane j -> m[j] lane i (8 x 8 int32). */
AVX2 void transpose8_epi32(__m256i *m)
{
    const __m256i t0 = _mm256_unpacklo_epi32(m[0], m[1]), t1 = _mm256_unpackhi_epi32(m[0], m[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(m[2], m[3]), t3 = _mm256_unpackhi_epi32(m[2], m[3]);
    const __m256i t4 = _mm256_unpacklo_epi32(m[4], m[5]), t5 = _mm256_unpackhi_epi32(m[4], m[5]);
    const __m256i t6 = _mm256_unpacklo_epi32(m[6], m[7]), t7 = _mm256_unpackhi_epi32(m[6], m[7]);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    m[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
    m[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
    m[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
    m[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
    m[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
    m[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
    m[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
    m[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

/* Tokens t0 .. t0 + nt - 1 (0 <= nt <= QGEMM_TOKENS) of a as 8 lanes of a tile `lanes` wide (8, or 16
 * where two calls fill its halves): xt[(k * 16 + p) * lanes + j] holds token j's elements 2p and 2p + 1 of
 * block k as an int16 pair (the weights' pairing), dt[k * lanes + j] its block scale; lanes j >= nt are
 * zero. */
__attribute__((target("avx2,fma"))) void cpu_qdot_avx2_pack_tile(const cpu_qact *a, int t0, int nt, int64_t nb,
                                                               int lanes, int32_t *xt, float *dt)
{
    const int64_t cols = a->cols;
    for (int64_t k = 0; k < nb; k++) {
        __m256i lo8[QGEMM_TOKENS], hi8[QGEMM_TOKENS]; /* token j's pairs 0-7, 8-15 */
        for (int j = 0; j < QGEMM_TOKENS; j++) {
            if (j >= nt) {
                lo8[j] = hi8[j] = _mm256_setzero_si256();
                dt[k * lanes + j] = 0.0f;
                continue;
            }
            const int16_t *x = a->v + (int64_t)(t0 + j) * cols + k * CPU_QBLOCK;
            const __m256i ev = _mm256_loadu_si256((const __m256i *)x); /* elements 0, 2, .., 30 */
            const __m256i od = _mm256_loadu_si256((const __m256i *)(x + CPU_QBLOCK / 2)); /* 1, 3, .., 31 */
            const __m256i lo = _mm256_unpacklo_epi16(ev, od), hi = _mm256_unpackhi_epi16(ev, od);
            lo8[j] = _mm256_permute2x128_si256(lo, hi, 0x20);
            hi8[j] = _mm256_permute2x128_si256(lo, hi, 0x31);
            dt[k * lanes + j] = a->d[(int64_t)(t0 + j) * nb + k];
        }
        transpose8_epi32(lo8);
        transpose8_epi32(hi8);
        for (int p = 0; p < 8; p++) {
            _mm256_storeu_si256((__m256i *)(xt + (k * 16 + p) * lanes), lo8[p]);
            _mm256_storeu_si256((__m256i *)(xt + (k * 16 + 8 + p) * lanes), hi8[p]);
        }
    }
}

/* QGEMM_ROWS unpacked rows (pk, row r at pk + r * nb * 16; scales wsr[r]) against a packed tile: res[r]
 * lane j = row r's result for token j. Per block: 16 pairs x 4 rows of (broadcast weight pair, vpmaddwd
 * with the 8 tokens' pairs, int32 add), then one convert and one FMA per row. */
__attribute__((target("avx2,fma"))) static void q4_gemm_tile(const int32_t *pk, int64_t nb, const int32_t *xt,
                                                             const float *dt, const float *const *wsr, int per_group,
                                                             float *res)
{
    __m256 acc[QGEMM_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < QGEMM_ROWS; r++)
        acc[r] = _mm256_setzero_ps();
    for (int64_t k0 = 0, g = 0; k0 < nb; k0 += per_group, g++) {
        __m256 G[QGEMM_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < QGEMM_ROWS; r++)
            G[r] = _mm256_setzero_ps();
        for (int64_t k = k0; k < k0 + per_group; k++) {
            __m256i ia[QGEMM_ROWS];
#pragma GCC unroll 4
            for (int r = 0; r < QGEMM_ROWS; r++)
                ia[r] = _mm256_setzero_si256();
#pragma GCC unroll 16
            for (int p = 0; p < 16; p++) {
                const __m256i b = _mm256_loadu_si256((const __m256i *)(xt + (k * 16 + p) * QGEMM_TOKENS));
#pragma GCC unroll 4
                for (int r = 0; r < QGEMM_ROWS; r++) {
                    ia[r] = _mm256_add_epi32(ia[r], _mm256_madd_epi16(_mm256_set1_epi32(pk[r * nb * 16 + k * 16 + p]), b));
                    /* keeps each row's sum one chain in a register (GCC otherwise re-associates the 16 adds into
                     * a tree and spills its partial sums) */
                    __asm__("" : "+x"(ia[r]));
                }
            }
            const __m256 d = _mm256_loadu_ps(dt + k * QGEMM_TOKENS);
#pragma GCC unroll 4
            for (int r = 0; r < QGEMM_ROWS; r++)
                G[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[r]), d, G[r]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < QGEMM_ROWS; r++)
            acc[r] = _mm256_fmadd_ps(G[r], _mm256_broadcast_ss(wsr[r] + g), acc[r]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < QGEMM_ROWS; r++)
        _mm256_storeu_ps(res + r * QGEMM_TOKENS, acc[r]);
}

void cpu_qdot_x86_gemm_q4(const uint8_t *w, int64_t row_bytes, int64_t nrows, const float *ws, int64_t ws_stride,
                          int group, const cpu_qact *a, int t0, int nt, const float *bias, int64_t ldb, float *out,
                          int64_t ldo, cpu_qgemm_pack_rows_fn pack_rows, cpu_qgemm_tile_fn tile8,
                          cpu_qgemm_tile_fn tile16)
{
    const int64_t nb = a->cols / CPU_QBLOCK, row_ints = nb * 16;
    const int per_group = group / CPU_QBLOCK;
    /* tiles of 16 tokens where the set has that kernel and more than 8 tokens are left, else of 8; each
     * tile's pairs at xt + its token offset * row_ints (its lanes side by side), scales at dt + offset * nb */
    const int width = tile16 ? 2 * QGEMM_TOKENS : QGEMM_TOKENS;
    /* rows per pass (at least one register tile) and tokens per tile group (at least one widest tile)
     * within the buffers */
    const int64_t pass = LILY_QMAX(QGEMM_PASS_BYTES / 4 / row_ints / QGEMM_ROWS * QGEMM_ROWS, QGEMM_ROWS);
    const int group_tokens = (int)LILY_QMAX(QGEMM_TILE_BYTES / 4 / (row_ints * width), 1) * width;
    int32_t pk[LILY_QMAX(QGEMM_PASS_BYTES / 4, QGEMM_ROWS * CPU_QGEMM_MAX_COLS / 2)];
    int32_t xt[LILY_QMAX(QGEMM_TILE_BYTES / 4, CPU_QGEMM_MAX_COLS / 2 * 2 * QGEMM_TOKENS)];
    float dt[LILY_QMAX(QGEMM_TILE_BYTES / 4, CPU_QGEMM_MAX_COLS / 2 * 2 * QGEMM_TOKENS) / 16];
    for (int j0 = 0; j0 < nt; j0 += group_tokens) {
        const int nj_group = LILY_QMIN(nt - j0, group_tokens);
        int tile_start[QGEMM_TILE_BYTES / 4 / 16 / QGEMM_TOKENS + 2], tile_width[QGEMM_TILE_BYTES / 4 / 16 / QGEMM_TOKENS + 2];
        int n_tiles = 0;
        for (int j = 0; j < nj_group; n_tiles++) {
            tile_start[n_tiles] = j;
            tile_width[n_tiles] = tile16 && nj_group - j > QGEMM_TOKENS ? 2 * QGEMM_TOKENS : QGEMM_TOKENS;
            for (int h = 0; h < tile_width[n_tiles]; h += QGEMM_TOKENS) /* 8-lane halves */
                cpu_qdot_avx2_pack_tile(a, t0 + j0 + j + h, LILY_QMAX(0, LILY_QMIN(QGEMM_TOKENS, nj_group - j - h)), nb,
                                        tile_width[n_tiles], xt + j * row_ints + h, dt + j * nb + h);
            j += tile_width[n_tiles];
        }
        for (int64_t r0 = 0; r0 < nrows; r0 += pass) {
            const int64_t nr = nrows - r0 < pass ? nrows - r0 : pass;
            const int64_t nr_pad = (nr + QGEMM_ROWS - 1) / QGEMM_ROWS * QGEMM_ROWS;
            pack_rows(w + r0 * row_bytes, row_bytes, nr, nr_pad, nb, pk);
            for (int i = 0; i < n_tiles; i++) {
                const int tw = tile_width[i], jt = j0 + tile_start[i], nj = LILY_QMIN(tw, nt - jt);
                const cpu_qgemm_tile_fn fn = tw > QGEMM_TOKENS ? tile16 : tile8;
                for (int64_t p0 = 0; p0 < nr_pad; p0 += QGEMM_ROWS) {
                    const float *wsr[QGEMM_ROWS];
                    for (int r = 0; r < QGEMM_ROWS; r++) /* padding rows read a real row's scales */
                        wsr[r] = ws + (r0 + p0 + r < nrows ? r0 + p0 + r : nrows - 1) * ws_stride;
                    float tile[QGEMM_ROWS * 2 * QGEMM_TOKENS];
                    fn(pk + p0 * row_ints, nb, xt + tile_start[i] * row_ints, dt + tile_start[i] * nb, wsr, per_group,
                       tile);
                    const int64_t vr = nr - p0 < QGEMM_ROWS ? nr - p0 : QGEMM_ROWS;
                    int j = 0;
                    if (vr == QGEMM_ROWS) /* 4 tokens at a time: a 4 x 4 transpose, 4 row-runs stored */
                        for (; j + 4 <= nj; j += 4) {
                            __m128 m0 = _mm_loadu_ps(tile + j), m1 = _mm_loadu_ps(tile + tw + j);
                            __m128 m2 = _mm_loadu_ps(tile + 2 * tw + j), m3 = _mm_loadu_ps(tile + 3 * tw + j);
                            _MM_TRANSPOSE4_PS(m0, m1, m2, m3);
                            const __m128 m[4] = {m0, m1, m2, m3};
                            for (int i = 0; i < 4; i++) {
                                const int64_t jj = jt + j + i;
                                __m128 v = m[i];
                                if (bias)
                                    v = _mm_add_ps(v, _mm_loadu_ps(bias + jj * ldb + r0 + p0));
                                _mm_storeu_ps(out + jj * ldo + r0 + p0, v);
                            }
                        }
                    for (; j < nj; j++)
                        for (int64_t r = 0; r < vr; r++) {
                            const int64_t jj = jt + j;
                            out[jj * ldo + r0 + p0 + r] =
                                bias ? tile[r * tw + j] + bias[jj * ldb + r0 + p0 + r] : tile[r * tw + j];
                        }
                }
            }
        }
    }
}

static void gemm_q4(const uint8_t *w, int64_t row_bytes, int64_t nrows, const float *ws, int64_t ws_stride, int group,
                    const cpu_qact *a, int t0, int nt, const float *bias, int64_t ldb, float *out, int64_t ldo)
{
    cpu_qdot_x86_gemm_q4(w, row_bytes, nrows, ws, ws_stride, group, a, t0, nt, bias, ldb, out, ldo, cpu_qdot_avx2_pack_rows, q4_gemm_tile, NULL);
}

const cpu_qdot_kernels cpu_qdot_avx2 = {"avx2", cpu_qdot_avx2_dot_q4, cpu_qdot_avx2_dot_q8, rows_q4,
                                       cpu_qdot_avx2_rows_q8, gemm_q4, prep_q4, rows_q4_prep, NULL};
#endif
