/* quant_dot_x86.h — what the x86-64 kernel sets share (quant_dot_avx2.c defines it, quant_dot_avx512.c
 * reuses it): the AVX2 one- and four-row 8-bit kernels and one-row 4-bit kernel, and gemm_q4's driver
 * and packing, which take the register-tile kernel as an argument.
 */
#ifndef LILY_CPU_QUANT_DOT_X86_H
#define LILY_CPU_QUANT_DOT_X86_H

#include "quant_dot.h"

/* Tokens per tile of gemm_q4 (the fp32 lanes of one 256-bit register) and rows per register tile. */
#define QGEMM_TOKENS 8
#define QGEMM_ROWS 4

/* The AVX2 set's entry points of those kinds (quant_dot.h's contracts; AVX2 + FMA). */
void cpu_qdot_avx2_dot_q4(const uint8_t *w, const float *ws, int group, const cpu_qact *a, int t0, int nt, float *out);
void cpu_qdot_avx2_dot_q8(const uint8_t *w, const float *ws, int group, const cpu_qact *a, int t0, int nt, float *out);
void cpu_qdot_avx2_rows_q8(const uint8_t *w, int64_t row_bytes, const float *ws, int64_t ws_stride, int group,
                           const cpu_qact *a, int t, float *out);

/* QGEMM_ROWS unpacked 4-bit rows against one packed tile of W tokens (W = QGEMM_TOKENS, or twice that for
 * a set's wide tile kernel):
 * pk: row r's int16 weight pairs at pk + r * nb * 16 (block k's pair p at [k * 16 + p]: elements 2p, 2p + 1);
 * xt: the tile's int16 pairs, xt[(k * 16 + p) * W + j] token j's pair p of block k; dt[k * W + j] its block
 * scales; wsr[r]: row r's group scales. res[r * W + j] = row r's result for token j, computed in the order
 * of quant_dot_avx2.c's header (exact int32 block sums, then the fp32 block and group FMA chains). */
typedef void (*cpu_qgemm_tile_fn)(const int32_t *pk, int64_t nb, const int32_t *xt, const float *dt,
                                  const float *const *wsr, int per_group, float *res);

/* Weight rows [0, nrows) of w unpacked into pk in the layout above (row r at pk + r * nb * 16), rows
 * [nrows, rows_pad) zero. */
typedef void (*cpu_qgemm_pack_rows_fn)(const uint8_t *w, int64_t row_bytes, int64_t nrows, int64_t rows_pad,
                                       int64_t nb, int32_t *pk);

/* quant_dot.h's cpu_qgemm_fn contract, each register tile computed by tile8 (8 tokens) or, where given
 * and more than 8 tokens are left, by tile16 (16 tokens); weight rows unpacked by pack_rows. Packs the
 * token tiles with AVX2 + FMA; the functions passed may need more, the caller's set guarantees it. */
void cpu_qdot_x86_gemm_q4(const uint8_t *w, int64_t row_bytes, int64_t nrows, const float *ws, int64_t ws_stride,
                          int group, const cpu_qact *a, int t0, int nt, const float *bias, int64_t ldb, float *out,
                          int64_t ldo, cpu_qgemm_pack_rows_fn pack_rows, cpu_qgemm_tile_fn tile8, cpu_qgemm_tile_fn tile16);

/* The AVX2 set's packing for gemm_q4 (quant_dot_avx2.c documents the layouts). */
void cpu_qdot_avx2_pack_rows(const uint8_t *w, int64_t row_bytes, int64_t nrows, int64_t rows_pad, int64_t nb,
                             int32_t *pk);
void cpu_qdot_avx2_pack_tile(const cpu_qact *a, int t0, int nt, int64_t nb, int lanes, int32_t *xt, float *dt);

#endif
