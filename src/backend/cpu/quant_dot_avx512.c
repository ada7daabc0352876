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
                    const cpu_qact *a, int t0, int nt, float *out, int64_t ldo)
{
    cpu_qdot_x86_gemm_q4(w, row_bytes, nrows, ws, ws_stride, group, a, t0, nt, out, ldo, pack_rows, q4_gemm_tile, q4_gemm_tile16);
}

const cpu_qdot_kernels cpu_qdot_avx512_vnni = {"avx512-vnni", cpu_qdot_avx2_dot_q4, cpu_qdot_avx2_dot_q8, rows_q4,
                                               cpu_qdot_avx2_rows_q8, gemm_q4};
#endif
