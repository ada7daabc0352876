/* quant_dot_amx.c — gemm_q4 (quant_dot.h's cpu_qgemm_fn) on Intel AMX tiles (AMX-TILE + AMX-INT8, with
 * AVX-512 for the fp32 steps): the avx512-amx set's tile kernel (quant_dot_dispatch.c picks the set where
 * the CPU has AMX and Linux grants the tile data state).
 *
 * A tile of 16 tokens x 16 weight rows, per activation block k of 32 values: the tokens' int8 digits xq
 * (and xr) are the A operand, 16 rows of 32 bytes read in place from the quantized activations (stride
 * a->cols); the rows' 4-bit weights, widened to bytes, are the B operand in the tile unit's layout (B row i
 * holds, for each of the 16 weight rows, its block values 4i .. 4i+3); TDPBSUD (signed x unsigned bytes,
 * int32 sums) gives C_q[j][r] = Σ xq q and C_r[j][r] = Σ xr q. Then (float) isum = fma(254, (float) C_q,
 * (float) C_r), exactly: isum = 254 C_q + C_r = Σ q v and every term are integers below 2^24
 * (quant_dot_avx2.c's bound), and per (row, token) the fp32 steps of quant_dot_avx2.c in its
 * order: G = fma((float) isum_k, d_k, G) over the group's blocks, acc = fma(G_g, s_g, acc) over the
 * groups. So every result is the AVX2 set's, bit for bit (tested). The block order inside A and B is
 * the activations' [16 even | 16 odd] (quant_dot.h), so the weights widen as their 16 low nibbles then
 * their 16 high nibbles. C's rows are tokens, so a token's 16 results leave as one 16-float store. With
 * groups of two blocks (MLX's default 64) both blocks' products are in flight at once (C tiles 0-3), which
 * hides the tile unit's latency before the stores of C.
 *
 * Tile state: each call loads its tile configuration and releases the tiles before returning (the state
 * is per thread; Linux's permission, asked once per process, is quant_dot_dispatch.c's).
 */
#include "quant_dot.h"

#if CPU_QDOT_HAVE_AMX
#include <immintrin.h>
#include <string.h>

#define AMX_TARGET "avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,amx-tile,amx-int8"
#define AMX_TILE 16 /* tokens and weight rows per tile */
/* Weight bytes (widened) per pass of rows, packed once per call and pass for every token tile. */
#define AMX_PASS_BYTES 65536

/* The tile configuration (palette 1): tiles 0-1 C (16 x 64 bytes: C_q, C_r), 2-3 A (16 x 32: xq, xr),
 * 4 B (8 x 64). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) amx_tilecfg;

/* 16 rows (rows >= nrows zero) widened into B tiles: bt[k * 512 + i * 64 + r * 4 + m] = row r's value at
 * position 4i + m of block k ([16 even | 16 odd]): B rows 0-3 are the low nibbles of the block's 4 words
 * (bytes 4i .. 4i+3 hold elements 8i, 8i+2, .. in their low nibbles), rows 4-7 their high nibbles. One
 * gather per word (its 16 rows), then a mask or a shift and a mask. */
__attribute__((target(AMX_TARGET))) static void pack_b(const uint8_t *w, int64_t row_bytes, int64_t nrows, int64_t nb,
                                                      uint8_t *bt)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    const __mmask16 valid = nrows >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nrows) - 1);
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int32_t)row_bytes));
    for (int64_t k = 0; k < nb; k++)
        for (int i = 0; i < 4; i++) {
            const __m512i d = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, idx,
                                                          (const void *)(w + k * (CPU_QBLOCK / 2) + 4 * i), 1);
            _mm512_storeu_si512((void *)(bt + k * 512 + i * 64), _mm512_and_si512(d, lo4));
            _mm512_storeu_si512((void *)(bt + k * 512 + (i + 4) * 64), _mm512_and_si512(_mm512_srli_epi16(d, 4), lo4));
        }
}

__attribute__((target(AMX_TARGET))) void cpu_qdot_amx_gemm_q4(const uint8_t *w, int64_t row_bytes, int64_t nrows,
                                                             const float *ws, int64_t ws_stride, int group,
                                                             const cpu_qact *a, int t0, int nt, const float *bias,
                                                             int64_t ldb, float *out, int64_t ldo)
{
    const int64_t cols = a->cols, nb = cols / CPU_QBLOCK, n_groups = cols / group;
    const int per_group = group / CPU_QBLOCK;
    /* row tiles per pass */
    const int64_t pass_tiles = AMX_PASS_BYTES / (AMX_TILE * cols) > 0 ? AMX_PASS_BYTES / (AMX_TILE * cols) : 1;
    uint8_t bpk[AMX_PASS_BYTES > AMX_TILE * CPU_QGEMM_MAX_COLS ? AMX_PASS_BYTES : AMX_TILE * CPU_QGEMM_MAX_COLS]
        __attribute__((aligned(64)));
    /* the pass's row scales: [row tile][g][16 rows] */
    float wst[AMX_PASS_BYTES / CPU_QBLOCK > CPU_QGEMM_MAX_COLS / CPU_QBLOCK * AMX_TILE ? AMX_PASS_BYTES / CPU_QBLOCK
                                                                                   : CPU_QGEMM_MAX_COLS / CPU_QBLOCK * AMX_TILE]
        __attribute__((aligned(64)));
    int32_t cq[AMX_TILE * AMX_TILE] __attribute__((aligned(64))), cr[AMX_TILE * AMX_TILE] __attribute__((aligned(64)));
    int32_t c2[4][AMX_TILE * AMX_TILE] __attribute__((aligned(64))); /* two blocks' sums: [block][digit] */
    /* a last partial token tile's digits, copied once with zero rows past its tokens (the row stride cols) */
    int8_t padq[AMX_TILE * CPU_QGEMM_MAX_COLS] __attribute__((aligned(64)));
    int8_t padr[AMX_TILE * CPU_QGEMM_MAX_COLS] __attribute__((aligned(64)));
    float acc[AMX_TILE][AMX_TILE] __attribute__((aligned(64)));
    float dT[CPU_QGEMM_MAX_COLS / CPU_QBLOCK * AMX_TILE] __attribute__((aligned(64))); /* [k][16 tokens] */

    amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 4; i++) /* C: 16 tokens x 16 int32 */
        cfg.rows[i] = AMX_TILE, cfg.colsb[i] = 64;
    cfg.rows[4] = cfg.rows[5] = AMX_TILE, cfg.colsb[4] = cfg.colsb[5] = CPU_QBLOCK; /* A: 16 tokens x 32 digits */
    cfg.rows[6] = cfg.rows[7] = 8, cfg.colsb[6] = cfg.colsb[7] = 64;                 /* B: 8 x (16 rows x 4) */
    _tile_loadconfig(&cfg);
    const __m512 f254 = _mm512_set1_ps((float)CPU_QDIGIT);

    for (int64_t p0 = 0; p0 < nrows; p0 += pass_tiles * AMX_TILE) {
        const int64_t p1 = nrows - p0 < pass_tiles * AMX_TILE ? nrows : p0 + pass_tiles * AMX_TILE;
        for (int64_t r0 = p0; r0 < p1; r0 += AMX_TILE)
            pack_b(w + r0 * row_bytes, row_bytes, p1 - r0, nb, bpk + (r0 - p0) / AMX_TILE * nb * 512);
        for (int64_t r0 = p0; r0 < p1; r0 += AMX_TILE) /* the rows' scales with the rows as lanes (padding: 0) */
            for (int64_t g = 0; g < n_groups; g++)
                for (int r = 0; r < AMX_TILE; r++)
                    wst[((r0 - p0) / AMX_TILE * n_groups + g) * AMX_TILE + r] =
                        r0 + r < p1 ? ws[(r0 + r) * ws_stride + g] : 0.0f;
        for (int j0 = 0; j0 < nt; j0 += AMX_TILE) {
            const int nj = nt - j0 < AMX_TILE ? nt - j0 : AMX_TILE;
            const int8_t *xq = a->q + (int64_t)(t0 + j0) * cols, *xr = a->r + (int64_t)(t0 + j0) * cols;
            if (nj < AMX_TILE) {
                memcpy(padq, xq, (size_t)(nj * cols));
                memcpy(padr, xr, (size_t)(nj * cols));
                memset(padq + nj * cols, 0, (size_t)((AMX_TILE - nj) * cols));
                memset(padr + nj * cols, 0, (size_t)((AMX_TILE - nj) * cols));
                xq = padq;
                xr = padr;
            }
            const float *xd = a->d + (int64_t)(t0 + j0) * nb;
            for (int64_t k = 0; k < nb; k++) /* the tokens' block scales with the tokens as rows (padding: 0) */
                for (int j = 0; j < AMX_TILE; j++)
                    dT[k * AMX_TILE + j] = j < nj ? xd[j * nb + k] : 0.0f;
            for (int64_t r0 = p0; r0 < p1; r0 += AMX_TILE) {
                const int64_t vr = p1 - r0 < AMX_TILE ? p1 - r0 : AMX_TILE;
                const uint8_t *bt = bpk + (r0 - p0) / AMX_TILE * nb * 512;
                const float *wsr = wst + (r0 - p0) / AMX_TILE * n_groups * AMX_TILE;
                if (per_group == 2) {
                    /* groups of two blocks: both blocks' products in flight at once (C tiles 0-1 and 2-3), then
                     * per token G = fma(isum_0, d_0, 0), G = fma(isum_1, d_1, G), acc = fma(G, s_g, acc) */
                    __m512 A[AMX_TILE];
#pragma GCC unroll 16
                    for (int j = 0; j < AMX_TILE; j++)
                        A[j] = _mm512_setzero_ps();
                    for (int64_t k0 = 0, g = 0; k0 < nb; k0 += 2, g++) {
                        _tile_zero(0);
                        _tile_zero(1);
                        _tile_zero(2);
                        _tile_zero(3);
                        _tile_loadd(4, xq + k0 * CPU_QBLOCK, cols);
                        _tile_loadd(5, xr + k0 * CPU_QBLOCK, cols);
                        _tile_loadd(6, bt + k0 * 512, 64);
                        _tile_dpbsud(0, 4, 6);
                        _tile_dpbsud(1, 5, 6);
                        _tile_loadd(4, xq + (k0 + 1) * CPU_QBLOCK, cols);
                        _tile_loadd(5, xr + (k0 + 1) * CPU_QBLOCK, cols);
                        _tile_loadd(7, bt + (k0 + 1) * 512, 64);
                        _tile_dpbsud(2, 4, 7);
                        _tile_dpbsud(3, 5, 7);
                        _tile_stored(0, c2[0], 64);
                        _tile_stored(1, c2[1], 64);
                        _tile_stored(2, c2[2], 64);
                        _tile_stored(3, c2[3], 64);
                        const __m512 s = _mm512_load_ps(wsr + g * AMX_TILE);
#pragma GCC unroll 16
                        for (int j = 0; j < AMX_TILE; j++) {
                            /* (float) isum = 254 (float) C_q + (float) C_r in one FMA, exactly: every term and
                             * the sum are integers below 2^24 */
                            const __m512 f0 = _mm512_fmadd_ps(
                                _mm512_cvtepi32_ps(_mm512_load_si512((const void *)(c2[0] + j * AMX_TILE))), f254,
                                _mm512_cvtepi32_ps(_mm512_load_si512((const void *)(c2[1] + j * AMX_TILE))));
                            const __m512 f1 = _mm512_fmadd_ps(
                                _mm512_cvtepi32_ps(_mm512_load_si512((const void *)(c2[2] + j * AMX_TILE))), f254,
                                _mm512_cvtepi32_ps(_mm512_load_si512((const void *)(c2[3] + j * AMX_TILE))));
                            __m512 G = _mm512_fmadd_ps(f0, _mm512_set1_ps(dT[k0 * AMX_TILE + j]), _mm512_setzero_ps());
                            G = _mm512_fmadd_ps(f1, _mm512_set1_ps(dT[(k0 + 1) * AMX_TILE + j]), G);
                            A[j] = _mm512_fmadd_ps(G, s, A[j]);
                        }
                    }
#pragma GCC unroll 16
                    for (int j = 0; j < AMX_TILE; j++)
                        _mm512_store_ps(acc[j], A[j]);
                } else {
                memset(acc, 0, sizeof acc);
                for (int64_t k0 = 0, g = 0; k0 < nb; k0 += per_group, g++) {
                    __m512 G[AMX_TILE];
#pragma GCC unroll 16
                    for (int j = 0; j < AMX_TILE; j++)
                        G[j] = _mm512_setzero_ps();
                    for (int64_t k = k0; k < k0 + per_group; k++) {
                        _tile_zero(0);
                        _tile_zero(1);
                        _tile_loadd(4, xq + k * CPU_QBLOCK, cols);
                        _tile_loadd(5, xr + k * CPU_QBLOCK, cols);
                        _tile_loadd(6, bt + k * 512, 64);
                        _tile_dpbsud(0, 4, 6);
                        _tile_dpbsud(1, 5, 6);
                        _tile_stored(0, cq, 64);
                        _tile_stored(1, cr, 64);
#pragma GCC unroll 16
                        for (int j = 0; j < AMX_TILE; j++) {
                            const __m512 f = _mm512_fmadd_ps( /* (float) isum, exactly (as above) */
                                _mm512_cvtepi32_ps(_mm512_load_si512((const void *)(cq + j * AMX_TILE))), f254,
                                _mm512_cvtepi32_ps(_mm512_load_si512((const void *)(cr + j * AMX_TILE))));
                            G[j] = _mm512_fmadd_ps(f, _mm512_set1_ps(dT[k * AMX_TILE + j]), G[j]);
                        }
                    }
                    const __m512 s = _mm512_load_ps(wsr + g * AMX_TILE);
#pragma GCC unroll 16
                    for (int j = 0; j < AMX_TILE; j++)
                        _mm512_store_ps(acc[j], _mm512_fmadd_ps(G[j], s, _mm512_load_ps(acc[j])));
                }
                }
                /* token j's results for the tile's rows: one (masked) store each, plus the bias terms */
                const __mmask16 m = (__mmask16)((1u << vr) - 1);
                for (int j = 0; j < nj; j++) {
                    __m512 v = _mm512_load_ps(acc[j]);
                    if (bias)
                        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + (int64_t)(j0 + j) * ldb + r0));
                    _mm512_mask_storeu_ps(out + (int64_t)(j0 + j) * ldo + r0, m, v);
                }
            }
        }
    }
    _tile_release();
}
#endif
