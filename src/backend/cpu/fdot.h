/* fdot.h — fp32 dot products of MLX affine 4/8-bit weight rows against one activation vector rounded the
 * way the CUDA backend's decode MoE feeds it, so that a CPU computing some of a token's experts
 * (experts_token.h) differs from the GPU only by the order of fp32 sums.
 *
 * The math (the GPU's: src/backend/cuda/gemv/mma_gemv.cuh for 4-bit weights, gemv_common.cuh's row_dot
 * for 8-bit). A weight group g of G values (G a multiple of 32) holds unsigned q_c with w_c = s_g q_c + b_g
 * (s_g, b_g bf16; MODEL.md §3). Then
 *     Σ_c w_c x_c  =  (1 / k) Σ_g [ s_g Σ_{c in g} q_c x'_c  +  b_g S_g ]
 * with, for 4-bit rows (the tensor-core path):
 *     k    = the power of two mg_x_scale picks: 1, halved while max_c |x_c| · k > 2^14 (fp32 products)
 *     x'_c = fp16(x_c k)                    (c even; round to nearest even, subnormals kept)
 *     x'_c = 16 · fp16(x_c k · 0.0625)      (c odd: the GPU feeds odd nibbles as 16 q with x / 16)
 *     S_g  = mg_group_sums' sum of x' over the group, in its order: per 8 columns c0..c7 in turn,
 *            S += e + 16 o with e = ((f0 + f4) + f2) + f6 and o = ((f1 + f5) + f3) + f7 (f: the fp16
 *            values as fed, f_odd = x'_odd / 16), all in fp32
 * and, for 8-bit rows (the fp32 path, moe_route.cu's kernels; 4-bit rows of shapes the tensor-core kernels
 * do not take too): k = 1, x' = x, S_g = Σ x' in column order (fp32). Products q x' are exact in fp32; each
 * Σ q x' and the group combination are fp32 sums in this file's order, not the GPU's.
 *
 * Activation layout (a prep function writes it once per vector): 4-bit: each block of 32 columns as its
 * 16 even columns' fed values f then its 16 odd columns' f (= x' / 16), the order a block's 16 bytes
 * unpack into (low nibble = even column, MLX packs column j of a word at bits 4j), so a kernel multiplies
 * the low nibble q and the high nibble in place (16 q) by the stored values with no shuffle; 8-bit: x in
 * column order. S [cols / G] beside it.
 */
#ifndef LILY_CPU_FDOT_H
#define LILY_CPU_FDOT_H

#include <stdint.h>

/* 4-bit: xe [cols] and S [cols / group] of x [cols] (cols a multiple of group, group of 32) as the header
 * describes; returns k. Every set writes the same bits. */
typedef float (*cpu_fdot_prep_fn)(const float *x, int64_t cols, int group, float *xe, float *xsum);

/* out[r] = Σ_g [ s_g Σ_{c in g} q_c x'_c + b_g S_g ] for rows r < nrows (not divided by k): row r's packed
 * weights at w + r * row_bytes, its bf16 scales and biases at s + r * sb_stride and b + r * sb_stride
 * (elements), xe / xsum as the prep wrote them for the same cols and group. */
typedef void (*cpu_fdot_rows_fn)(const uint8_t *w, int64_t row_bytes, const uint16_t *s, const uint16_t *b,
                                 int64_t sb_stride, int nrows, int group, const float *xe, const float *xsum,
                                 int64_t cols, float *out);

/* A set of kernels for one instruction set. */
typedef struct {
    const char *name; /* "ref", "avx2", "avx512" */
    cpu_fdot_prep_fn prep_q4;
    cpu_fdot_rows_fn rows_q4, rows_q8;
} cpu_fdot_kernels;

/* 4-bit: S [cols / group] from xe as laid out above, in mg_group_sums' order (the sets' prep_q4 end with it). */
void cpu_fdot_group_sums_q4(const float *xe, int64_t cols, int group, float *xsum);
/* 4-bit rows against x in fp32 (the GPU's other path, moe_route.cu, for shapes the tensor-core kernels do
 * not take): xe in the 4-bit layout from x itself (odd columns x / 16: exact in fp32), S = Σ x per group in
 * column order, k = 1. Portable. */
void cpu_fdot_prep_q4_fp32(const float *x, int64_t cols, int group, float *xe, float *xsum);
/* 8-bit: xe = x (column order), S per group in column order. Portable (every set uses it). */
void cpu_fdot_prep_q8(const float *x, int64_t cols, int group, float *xe, float *xsum);

/* The power of two k of the header for max |x| = max_abs (mg_x_scale's loop; a NaN max gives 1). */
float cpu_fdot_x_scale(float max_abs);

/* The kernels for this CPU (x86-64: AVX-512 F → avx512, AVX2 + FMA + F16C → avx2; else ref). */
const cpu_fdot_kernels *cpu_fdot_best(void);
/* Every set this CPU runs into out[CPU_FDOT_MAX_SETS], the portable one first, the best last; returns the count. */
#define CPU_FDOT_MAX_SETS 3
int cpu_fdot_available(const cpu_fdot_kernels **out);

extern const cpu_fdot_kernels cpu_fdot_ref;
#if defined(__x86_64__) || defined(__i386__)
extern const cpu_fdot_kernels cpu_fdot_avx2, cpu_fdot_avx512;
/* The AVX2 set's prep_q4 (AVX2 + FMA + F16C), which the AVX-512 set shares. */
float cpu_fdot_avx2_prep_q4(const float *x, int64_t cols, int group, float *xe, float *xsum);
#endif

#endif
