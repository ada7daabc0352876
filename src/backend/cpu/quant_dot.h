/* quant_dot.h — the fast CPU path's integer dot products: MLX affine 4/8-bit weight rows against
 * activations quantized to int8 per block of 32.
 *
 * The math (the Q4_x · Q8 scheme of llama.cpp's ggml, applied to MLX's affine groups, with two int8
 * digits per activation): a weight group g of G values (G a multiple of 32) holds unsigned q_i with
 * w_i = s_g * q_i + b_g (MODEL.md §3). An activation block k of 32 values is held as
 *     x_i ≈ d_k (254 xq_i + xr_i),  xq_i, xr_i in [-127, 127],  d_k = max|x_i| / (127 · 254)
 * — xq the int8 quantization of x with step 254 d_k, xr the int8 quantization of what that leaves —
 * so the error is at most d_k / 2 per value (a 16-bit quantization; one int8 digit alone left ~2% relative
 * error per linear layer on trained models, top-1 ~88% after 8 layers). The block also keeps
 * sum_k = Σ x_i in fp32. Then
 *     Σ_i w_i x_i ≈ Σ_g s_g Σ_{k in g} d_k (254 Σ q_i xq_i + Σ q_i xr_i)  +  Σ_g b_g Σ_{k in g} sum_k
 * where both inner sums are exact integer dot products (vpmaddubsw/vpmaddwd, vdotq_s32, or C), their
 * combination is exact in int32, and the affine bias needs no per-element work.
 *
 * The same integers are also kept whole, v_i = 254 xq_i + xr_i in [-32258, 32258] as int16, for kernels
 * that multiply 16-bit values (x86's vpmaddwd: one multiply per value instead of one per digit); every
 * kernel computes the same exact integer sums Σ q_i v_i.
 *
 * Activation layout: each block of 32 values (of xq, xr and v) is stored as its 16 even-indexed values then its 16
 * odd-indexed ones, the order a 4-bit row's 16 bytes unpack into (low nibbles = even elements, high
 * nibbles = odd ones, MLX packs element j of a uint32 word at bits 4j).
 *
 * Every kernel computes each (row, token) result with the same sequence of fp32 operations whether it
 * is called for one token or a tile of several, so a result never depends on how tokens are batched.
 */
#ifndef LILY_CPU_QUANT_DOT_H
#define LILY_CPU_QUANT_DOT_H

#include <stddef.h>
#include <stdint.h>

/* Values per activation block. */
#define CPU_QBLOCK 32
/* The most token rows one kernel call takes (a tile that reuses each unpacked weight block). */
#define CPU_QTILE 4
/* The weight of the activations' high digit. */
#define CPU_QDIGIT 254

/* n rows of `cols` activations (cols a multiple of CPU_QBLOCK), quantized. Row t's digits are
 * q + t * cols and r + t * cols, its whole values v + t * cols, its blocks' scales d + t * (cols / 32),
 * fp32 sums sum + t * (cols / 32). */
typedef struct {
    int8_t *q, *r; /* xq, xr */
    float *d;
    float *sum;
    int64_t cols;
    int16_t *v; /* 254 xq + xr */
} cpu_qact;

/* Quantize x [n, cols] (fp32, cols % 32 == 0) into a (whose buffers hold n rows of cols). Portable C;
 * the same on every CPU, so the kernels all see identical inputs. */
void cpu_quantize_act(const float *x, int n, int64_t cols, cpu_qact *a);

/* One weight row against nt (1..CPU_QTILE) activation rows t0 .. t0 + nt - 1 of a:
 *   out[j] = Σ_g ws[g] Σ_{k in g} d_k · (254 Σ q_i xq_i + Σ q_i xr_i)      (the bias term is the caller's)
 * w: the row's packed weights (cols * bits / 8 bytes, little-endian words as MLX stores them);
 * ws: [cols / group] fp32 scales; group: values per scale (a multiple of 32). */
typedef void (*cpu_qdot_fn)(const uint8_t *w, const float *ws, int group, const cpu_qact *a, int t0, int nt,
                            float *out);

/* Rows processed together by a cpu_qdot_rows_fn. */
#define CPU_QROWS 4

/* CPU_QROWS weight rows against one activation row t of a (decode's shape): row r's packed weights at
 * w + r * row_bytes and its scales at ws + r * ws_stride; out[r] is what the set's cpu_qdot_fn gives
 * for that row and token, bit for bit (the same operations per row; the rows share each activation
 * block's loads and run as independent dependency chains). */
typedef void (*cpu_qdot_rows_fn)(const uint8_t *w, int64_t row_bytes, const float *ws, int64_t ws_stride, int group,
                                 const cpu_qact *a, int t, float *out);

/* Decode's 4-bit kernels on activations laid out for them once per token. A set's prep_q4 writes token t's
 * whole values into xn [a->cols rounded up to a multiple of 128] (int16) in the set's own order; its
 * rows_q4_prep then computes what its cpu_qdot_rows_fn gives for CPU_QROWS rows (row r's packed weights at
 * w + r * row_bytes), bit for bit, from xn, the token's block scales xd [cols / 32] and the rows' fp32
 * scales transposed: row r's scale of group g at wst[g * ld + r] (as cpu_qdot_transpose_fn writes them).
 * cols <= CPU_QGEMM_MAX_COLS. */
typedef void (*cpu_qdot_prep_fn)(const cpu_qact *a, int t, int16_t *xn);
typedef void (*cpu_qdot_rows_prep_fn)(const uint8_t *w, int64_t row_bytes, const float *wst, int64_t ld, int group,
                                      const int16_t *xn, const float *xd, int64_t cols, float *out);
/* dst[g * ld + r] = the fp32 value of src[r * n_groups + g] (bf16, any alignment) for r < nr16 and every g,
 * where nr16 = nr rounded down to a multiple of 16 (the caller does the rest; n_groups >= 4): a row chunk's
 * scale or bias rows with the rows as lanes. */
typedef void (*cpu_qdot_transpose_fn)(const uint16_t *src, int64_t nr, int64_t n_groups, int64_t ld, float *dst);

/* The widest activation rows (cols) a cpu_qgemm_fn takes (it packs a row pass and a token tile on the
 * stack: about 200 KiB at most). */
#define CPU_QGEMM_MAX_COLS 4096

/* nrows weight rows (row r's packed weights at w + r * row_bytes, its scales at ws + r * ws_stride)
 * against nt activation rows t0 .. t0 + nt - 1 of a (prefill's shape: every weight block is unpacked
 * once and meets several tokens at a time): out[j * ldo + r] is what the set's cpu_qdot_fn gives for row r
 * and token t0 + j, bit for bit, plus bias[j * ldb + r] in one fp32 add where bias is not NULL (the
 * caller's affine bias terms, added as the result is stored). a->cols <= CPU_QGEMM_MAX_COLS. */
typedef void (*cpu_qgemm_fn)(const uint8_t *w, int64_t row_bytes, int64_t nrows, const float *ws, int64_t ws_stride,
                             int group, const cpu_qact *a, int t0, int nt, const float *bias, int64_t ldb, float *out,
                             int64_t ldo);

/* A set of kernels for one instruction set. rows_q4 / rows_q8 may be NULL (the caller then loops
 * dot_q4 / dot_q8 over the rows); gemm_q4 may be NULL (the caller then walks token tiles of CPU_QTILE);
 * prep_q4 and rows_q4_prep are both NULL or both set (a lone token's 4-bit rows then take them). */
typedef struct {
    const char *name; /* "ref", "avx2", "avx512-vnni", "neon", "neon-dotprod" */
    cpu_qdot_fn dot_q4, dot_q8;
    cpu_qdot_rows_fn rows_q4, rows_q8;
    cpu_qgemm_fn gemm_q4;
    cpu_qdot_prep_fn prep_q4;
    cpu_qdot_rows_prep_fn rows_q4_prep;
    cpu_qdot_transpose_fn transpose_bf16; /* NULL: the driver's portable transposition */
} cpu_qdot_kernels;

/* The kernels for this CPU: the widest instruction set it has (the backend asks once, at create). */
const cpu_qdot_kernels *cpu_qdot_best(void);
/* Every kernel set this CPU can run into out[CPU_QDOT_MAX_SETS], the portable one first, the best last;
 * returns the count. */
#define CPU_QDOT_MAX_SETS 5
int cpu_qdot_available(const cpu_qdot_kernels **out);

/* The implementations (each file compiles to nothing where its instruction set does not exist). */
extern const cpu_qdot_kernels cpu_qdot_ref;
#if defined(__x86_64__) || defined(__i386__)
extern const cpu_qdot_kernels cpu_qdot_avx2, cpu_qdot_avx512_vnni;
#endif
/* The AMX tile kernel (x86-64 Linux: the tile data state needs the kernel's permission; GCC 11+). */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define CPU_QDOT_HAVE_AMX 1
/* The avx512-vnni set with gemm_q4 on AMX tiles (quant_dot_amx.c); only where cpu_qdot_available lists it. */
extern const cpu_qdot_kernels cpu_qdot_avx512_amx;
void cpu_qdot_amx_gemm_q4(const uint8_t *w, int64_t row_bytes, int64_t nrows, const float *ws, int64_t ws_stride,
                          int group, const cpu_qact *a, int t0, int nt, const float *bias, int64_t ldb, float *out,
                          int64_t ldo);
#else
#define CPU_QDOT_HAVE_AMX 0
#endif
#if defined(__aarch64__)
extern const cpu_qdot_kernels cpu_qdot_neon, cpu_qdot_neon_dotprod;
#endif

#endif
