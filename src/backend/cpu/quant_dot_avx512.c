/* quant_dot_avx512.c — the quant_dot.h kernels with AVX-512 VNNI (x86-64 with AVX-512 F/BW/VL + VNNI):
 * vpdpwssd multiplies int16 pairs and adds them into int32 lanes in one instruction, where AVX2 takes a
 * vpmaddwd and a vpaddd (and, in the tile kernel, a broadcast: vpdpwssd takes the weight pair as an
 * embedded-broadcast memory operand). The int16 operands are those of quant_dot_avx2.c (weights 0..15
 * as int16, activations v = 254 xq + xr), every block sum is the same exact int32 (integer addition in any
 * order), and the fp32 steps after it are quant_dot_avx2.c's, in its order: the results are the AVX2
 * set's, bit for bit (tested). The 256-bit forms (AVX-512 VL) keep gemm_q4's packing and driver shared
 * with the AVX2 set; on AMD Zen 4 a 512-bit instruction runs as two 256-bit halves, so the wider form
 * would only halve the instruction count. Compiled by function attribute, run only where the CPU has it
 * (quant_dot_dispatch.c); the 8-bit and one-row kernels are the AVX2 set's.
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#include "quant_dot.h"
#include "quant_dot_x86.h"

#define VNNI_TARGET "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni"
#define VNNI __attribute__((target(VNNI_TARGET), always_inline)) static inline

/* [Σ lanes of p0, of p1, of p2, of p3] (int32, exact). */
VNNI __m128i hsum4_epi32(__m256i p0, __m256i p1, __m256i p2, __m256i p3)
{
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* Bytes ahead of each row's current block asked for (quant_dot_avx2.c's QROWS_PREFETCH). */
#define QROWS_PREFETCH 4096

/* CPU_QROWS 4-bit rows against token t: quant_dot_avx2.c's q4_rows with each block's two vpmaddwd and
 * their add as two vpdpwssd. */
VNNI void q4_rows(const uint8_t *w, int64_t row_bytes, const float *ws, int64_t ws_stride, int group,
                  const cpu_qact *a, int t, float *out, const int PER_GROUP)
{
    const int64_t nb = a->cols / CPU_QBLOCK;
    const int per_group = PER_GROUP ? PER_GROUP : group / CPU_QBLOCK;
    const int16_t *xv = a->v + (int64_t)t * a->cols;
    const float *xd = a->d + (int64_t)t * nb;
    const __m256i m15 = _mm256_set1_epi16(15);
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
                const uint8_t *wr = w + r * row_bytes + k * (CPU_QBLOCK / 2);
                if ((k & 3) == 0)
                    _mm_prefetch((const char *)wr + QROWS_PREFETCH, _MM_HINT_T0);
                const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)wr));
                p[r] = _mm256_dpwssd_epi32(_mm256_madd_epi16(_mm256_and_si256(b, m15), x0), _mm256_srli_epi16(b, 4), x1);
            }
            G = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum4_epi32(p[0], p[1], p[2], p[3])), _mm_broadcast_ss(xd + k), G);
        }
        acc = _mm_fmadd_ps(G, _mm_setr_ps(ws[g], ws[ws_stride + g], ws[2 * ws_stride + g], ws[3 * ws_stride + g]), acc);
    }
    _mm_storeu_ps(out, acc);
}

__attribute__((target(VNNI_TARGET))) static void rows_q4(const uint8_t *w, int64_t row_bytes, const float *ws,
                                                         int64_t ws_stride, int group, const cpu_qact *a, int t,
                                                         float *out)
{
    if (group == 2 * CPU_QBLOCK)
        q4_rows(w, row_bytes, ws, ws_stride, group, a, t, out, 2);
    else
        q4_rows(w, row_bytes, ws, ws_stride, group, a, t, out, 0);
}

/* Decode's four-row kernel on words (prep_q4, rows_q4_prep). A 4-bit row read as 16-bit words: word j
 * holds elements 4j .. 4j + 3 at bits 0, 4, 8, 12, so nibble c of every word, (word >> 4c) & 15, is one
 * shift and one mask: a chunk of 4 blocks (64 bytes, one cache line) becomes 4 vectors of 32 int16 weights
 * with no byte-widening shuffle (the vpmovzxbw of q4_rows, a shuffle-port operation per block and row,
 * bounded that kernel). prep_q4 lays the token's values out to match, once per call of the driver:
 * xn[ch * 128 + c * 32 + j] = v of element 4j + c of chunk ch (j < 32), zeros past the last block. */

/* vpermt2w indices of nibble c (rows of 32): output h * 16 + bb * 8 + jl takes element 4 jl + c of block bb
 * of the pair (blocks 2h, 2h + 1 in the two calls), i.e. source bb * 32 + its index in the stored
 * [16 even | 16 odd] order: 2 jl (c = 0), 16 + 2 jl (1), 2 jl + 1 (2), 17 + 2 jl (3). */
#define NIB_ROW(o)                                                                                              \
    o + 0, o + 2, o + 4, o + 6, o + 8, o + 10, o + 12, o + 14, 32 + o + 0, 32 + o + 2, 32 + o + 4, 32 + o + 6,  \
        32 + o + 8, 32 + o + 10, 32 + o + 12, 32 + o + 14
static const int16_t nibble_idx[4][32] = {{NIB_ROW(0), NIB_ROW(0)},
                                          {NIB_ROW(16), NIB_ROW(16)},
                                          {NIB_ROW(1), NIB_ROW(1)},
                                          {NIB_ROW(17), NIB_ROW(17)}};
#undef NIB_ROW

__attribute__((target(VNNI_TARGET))) static void prep_q4(const cpu_qact *a, int t, int16_t *xn)
{
    const int64_t nb = a->cols / CPU_QBLOCK, nch = (nb + 3) / 4;
    const int16_t *v = a->v + (int64_t)t * a->cols;
    __m512i idx[4];
    for (int c = 0; c < 4; c++)
        idx[c] = _mm512_loadu_si512((const void *)nibble_idx[c]);
    for (int64_t ch = 0; ch < nch; ch++) {
        __m512i B[4];
        for (int b = 0; b < 4; b++)
            B[b] = 4 * ch + b < nb ? _mm512_loadu_si512((const void *)(v + (4 * ch + b) * CPU_QBLOCK))
                                   : _mm512_setzero_si512();
        for (int c = 0; c < 4; c++)
            _mm512_storeu_si512((void *)(xn + ch * 128 + c * 32),
                                _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_permutex2var_epi16(B[0], idx[c], B[1]),
                                                        _mm512_permutex2var_epi16(B[2], idx[c], B[3])));
    }
}

/* Σ over chunk lanes: R[r] holds row r's int32 partials, lanes 4b .. 4b + 3 from block b of the chunk;
 * returns lane 4b + r = row r's block-b sum (exact). */
VNNI __m512i rows_block_sums(const __m512i *R)
{
    const __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(R[0], R[1]), _mm512_unpackhi_epi32(R[0], R[1]));
    const __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(R[2], R[3]), _mm512_unpackhi_epi32(R[2], R[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
}

VNNI void q4_rows_prep(const uint8_t *w, int64_t row_bytes, const float *wst, int64_t ld, int group,
                       const int16_t *xn, const float *xd, int64_t cols, float *out, const int PER_GROUP)
{
    const int64_t nb = cols / CPU_QBLOCK, nch = (nb + 3) / 4;
    const int per_group = PER_GROUP ? PER_GROUP : group / CPU_QBLOCK;
    const __m512i m15 = _mm512_set1_epi16(15);
    __m128 acc = _mm_setzero_ps(), G = _mm_setzero_ps();
    int64_t k = 0, g = 0;
    int left = per_group; /* blocks left in group g */
    for (int64_t ch = 0; ch < nch; ch++) {
        const int nblk = (int)(nb - 4 * ch < 4 ? nb - 4 * ch : 4);
        const __mmask64 wmask = nblk == 4 ? ~(__mmask64)0 : (((__mmask64)1 << (16 * nblk)) - 1);
        const __m512i A0 = _mm512_loadu_si512((const void *)(xn + ch * 128));
        const __m512i A1 = _mm512_loadu_si512((const void *)(xn + ch * 128 + 32));
        const __m512i A2 = _mm512_loadu_si512((const void *)(xn + ch * 128 + 64));
        const __m512i A3 = _mm512_loadu_si512((const void *)(xn + ch * 128 + 96));
        __m512i R[CPU_QROWS];
#pragma GCC unroll 4
        for (int r = 0; r < CPU_QROWS; r++) {
            const uint8_t *wr = w + r * row_bytes + ch * 64;
            _mm_prefetch((const char *)wr + QROWS_PREFETCH, _MM_HINT_T0);
            const __m512i b = nblk == 4 ? _mm512_loadu_si512((const void *)wr) : _mm512_maskz_loadu_epi8(wmask, wr);
            const __m512i p01 = _mm512_dpwssd_epi32(_mm512_madd_epi16(_mm512_and_si512(b, m15), A0),
                                                    _mm512_and_si512(_mm512_srli_epi16(b, 4), m15), A1);
            const __m512i p23 = _mm512_dpwssd_epi32(_mm512_madd_epi16(_mm512_and_si512(_mm512_srli_epi16(b, 8), m15), A2),
                                                    _mm512_srli_epi16(b, 12), A3);
            R[r] = _mm512_add_epi32(p01, p23);
        }
        const __m512 F = _mm512_cvtepi32_ps(rows_block_sums(R));
        __m128 f[4];
        f[0] = _mm512_castps512_ps128(F);
        f[1] = _mm512_extractf32x4_ps(F, 1);
        f[2] = _mm512_extractf32x4_ps(F, 2);
        f[3] = _mm512_extractf32x4_ps(F, 3);
#pragma GCC unroll 4
        for (int b = 0; b < 4; b++) {
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

__attribute__((target(VNNI_TARGET))) static void rows_q4_prep(const uint8_t *w, int64_t row_bytes, const float *wst,
                                                              int64_t ld, int group, const int16_t *xn,
                                                              const float *xd, int64_t cols, float *out)
{
    if (group == 2 * CPU_QBLOCK)
        q4_rows_prep(w, row_bytes, wst, ld, group, xn, xd, cols, out, 2);
    else
        q4_rows_prep(w, row_bytes, wst, ld, group, xn, xd, cols, out, 0);
}

/* quant_dot.h's cpu_qdot_transpose_fn: per 16 rows x 4 groups, two gathers of each row's 4 values (one
 * 64-bit lane per row), one vpermt2w per group that puts the 16 rows side by side, and the bf16 bits
 * widened to fp32 (placed high); the last n_groups % 4 groups one gather each. */
__attribute__((target(VNNI_TARGET))) static void transpose_bf16(const uint16_t *src, int64_t nr, int64_t n_groups,
                                                                int64_t ld, float *dst)
{
    /* idx[g][r] = 4 r + g: row r's value of group g among the two gathered vectors (rows 0-7, then 8-15) */
    static const int16_t idx[4][32] = {
        {0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60},
        {1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53, 57, 61},
        {2, 6, 10, 14, 18, 22, 26, 30, 34, 38, 42, 46, 50, 54, 58, 62},
        {3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47, 51, 55, 59, 63}};
    const int64_t s = 2 * n_groups; /* bytes between rows */
    const __m512i rows = _mm512_setr_epi64(0, s, 2 * s, 3 * s, 4 * s, 5 * s, 6 * s, 7 * s);
    for (int64_t r0 = 0; r0 + 16 <= nr; r0 += 16)
        for (int64_t g0 = 0; g0 + 4 <= n_groups; g0 += 4) {
            const char *p = (const char *)(src + r0 * n_groups + g0);
            const __m512i lo = _mm512_i64gather_epi64(rows, p, 1);
            const __m512i hi = _mm512_i64gather_epi64(rows, p + 16 * n_groups, 1);
            for (int g = 0; g < 4; g++) {
                const __m256i h = _mm512_castsi512_si256(
                    _mm512_permutex2var_epi16(lo, _mm512_loadu_si512((const void *)idx[g]), hi));
                _mm512_storeu_ps(dst + (g0 + g) * ld + r0,
                                 _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
            }
        }
    /* the groups past the last 4 (n_groups >= 4): per group and 16 rows one gather of 32-bit words holding
     * values g - 1 and g of each row (inside the row), the high half kept: value g's bf16 bits placed high */
    const __m512i rows16 = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32((int32_t)s));
    const __m512i high = _mm512_set1_epi32((int32_t)0xFFFF0000u);
    for (int64_t g = n_groups / 4 * 4; g < n_groups && n_groups >= 4; g++)
        for (int64_t r0 = 0; r0 + 16 <= nr; r0 += 16) {
            const __m512i v = _mm512_i32gather_epi32(rows16, (const void *)(src + r0 * n_groups + g - 1), 1);
            _mm512_storeu_ps(dst + g * ld + r0, _mm512_castsi512_ps(_mm512_and_si512(v, high)));
        }
}

/* gemm_q4's register tile (quant_dot_x86.h's cpu_qgemm_tile_fn): per block, 16 pairs x 4 rows of one
 * vpdpwssd (the 8 tokens' pairs times the row's weight pair broadcast from memory), each row's pairs
 * alternating between two accumulators (the instruction's latency would otherwise leave 4 chains too
 * few to keep both multiply pipes busy); then one convert and one FMA per row. */
__attribute__((target(VNNI_TARGET))) static void q4_gemm_tile(const int32_t *pk, int64_t nb, const int32_t *xt,
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
            __m256i ia[QGEMM_ROWS][2];
#pragma GCC unroll 4
            for (int r = 0; r < QGEMM_ROWS; r++)
                ia[r][0] = ia[r][1] = _mm256_setzero_si256();
#pragma GCC unroll 16
            for (int p = 0; p < 16; p++) {
                const __m256i b = _mm256_loadu_si256((const __m256i *)(xt + (k * 16 + p) * QGEMM_TOKENS));
#pragma GCC unroll 4
                for (int r = 0; r < QGEMM_ROWS; r++) {
                    ia[r][p & 1] = _mm256_dpwssd_epi32(ia[r][p & 1], b, _mm256_set1_epi32(pk[r * nb * 16 + k * 16 + p]));
                    __asm__("" : "+v"(ia[r][p & 1])); /* one chain per accumulator (no re-association) */
                }
            }
            const __m256 d = _mm256_loadu_ps(dt + k * QGEMM_TOKENS);
#pragma GCC unroll 4
            for (int r = 0; r < QGEMM_ROWS; r++)
                G[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(ia[r][0], ia[r][1])), d, G[r]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < QGEMM_ROWS; r++)
            acc[r] = _mm256_fmadd_ps(G[r], _mm256_broadcast_ss(wsr[r] + g), acc[r]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < QGEMM_ROWS; r++)
        _mm256_storeu_ps(res + r * QGEMM_TOKENS, acc[r]);
}

/* The same with 16 tokens in 512-bit lanes: per block 16 pairs x 4 rows of one vpdpwssd on 16 tokens
 * (the broadcasts of the weight pairs, load operations, no longer outnumber what the multiply pipes take:
 * the 8-token form issues one load per 8 lanes of multiply-add). */
__attribute__((target(VNNI_TARGET))) static void q4_gemm_tile16(const int32_t *pk, int64_t nb, const int32_t *xt,
                                                                const float *dt, const float *const *wsr,
                                                                int per_group, float *res)
{
    __m512 acc[QGEMM_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < QGEMM_ROWS; r++)
        acc[r] = _mm512_setzero_ps();
    for (int64_t k0 = 0, g = 0; k0 < nb; k0 += per_group, g++) {
        __m512 G[QGEMM_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < QGEMM_ROWS; r++)
            G[r] = _mm512_setzero_ps();
        for (int64_t k = k0; k < k0 + per_group; k++) {
            __m512i ia[QGEMM_ROWS][2];
#pragma GCC unroll 4
            for (int r = 0; r < QGEMM_ROWS; r++)
                ia[r][0] = ia[r][1] = _mm512_setzero_si512();
#pragma GCC unroll 16
            for (int p = 0; p < 16; p++) {
                const __m512i b = _mm512_loadu_si512((const void *)(xt + (k * 16 + p) * 2 * QGEMM_TOKENS));
#pragma GCC unroll 4
                for (int r = 0; r < QGEMM_ROWS; r++) {
                    ia[r][p & 1] = _mm512_dpwssd_epi32(ia[r][p & 1], b, _mm512_set1_epi32(pk[r * nb * 16 + k * 16 + p]));
                    __asm__("" : "+v"(ia[r][p & 1]));
                }
            }
            const __m512 d = _mm512_loadu_ps(dt + k * 2 * QGEMM_TOKENS);
#pragma GCC unroll 4
            for (int r = 0; r < QGEMM_ROWS; r++)
                G[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(ia[r][0], ia[r][1])), d, G[r]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < QGEMM_ROWS; r++)
            acc[r] = _mm512_fmadd_ps(G[r], _mm512_set1_ps(wsr[r][g]), acc[r]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < QGEMM_ROWS; r++)
        _mm512_storeu_ps(res + r * 2 * QGEMM_TOKENS, acc[r]);
}

/* gemm_q4's weight rows unpacked (quant_dot_x86.h's layout): per block, its 16 bytes widened to 16 int32
 * lanes b, and pair p = (b & 15) | ((b >> 4) << 16) formed as (b | b << 12) & 0x000F000F in one ternary
 * logic operation (the AVX2 packer takes ~9 operations per block). */
__attribute__((target(VNNI_TARGET))) static void pack_rows(const uint8_t *w, int64_t row_bytes, int64_t nrows,
                                                           int64_t rows_pad, int64_t nb, int32_t *pk)
{
    const __m512i nibbles = _mm512_set1_epi32(0x000F000F);
    for (int64_t r = 0; r < rows_pad; r++) {
        int32_t *dst = pk + r * nb * 16;
        if (r >= nrows) {
            memset(dst, 0, (size_t)nb * 16 * sizeof(int32_t));
            continue;
        }
        for (int64_t k = 0; k < nb; k++) {
            const __m512i b =
                _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + r * row_bytes + k * (CPU_QBLOCK / 2))));
            /* 0xA8: (A | B) & C */
            _mm512_storeu_si512((void *)(dst + k * 16), _mm512_ternarylogic_epi32(b, _mm512_slli_epi32(b, 12), nibbles, 0xA8));
        }
    }
}

static void gemm_q4(const uint8_t *w, int64_t row_bytes, int64_t nrows, const float *ws, int64_t ws_stride, int group,
                    const cpu_qact *a, int t0, int nt, const float *bias, int64_t ldb, float *out, int64_t ldo)
{
    cpu_qdot_x86_gemm_q4(w, row_bytes, nrows, ws, ws_stride, group, a, t0, nt, bias, ldb, out, ldo, pack_rows, q4_gemm_tile, q4_gemm_tile16);
}

const cpu_qdot_kernels cpu_qdot_avx512_vnni = {"avx512-vnni", cpu_qdot_avx2_dot_q4, cpu_qdot_avx2_dot_q8, rows_q4,
                                               cpu_qdot_avx2_rows_q8, gemm_q4, prep_q4, rows_q4_prep,
                                               transpose_bf16};
#if CPU_QDOT_HAVE_AMX
const cpu_qdot_kernels cpu_qdot_avx512_amx = {"avx512-amx", cpu_qdot_avx2_dot_q4, cpu_qdot_avx2_dot_q8, rows_q4,
                                              cpu_qdot_avx2_rows_q8, cpu_qdot_amx_gemm_q4, prep_q4, rows_q4_prep,
                                              transpose_bf16};
#endif
#endif
