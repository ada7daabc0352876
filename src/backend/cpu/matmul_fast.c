/* matmul_fast.c — CPU linear layers in fast mode: y = x · Wᵀ with W kept in its MLX affine 4/8-bit
 * form and x quantized to int8 per block of 32, through the integer kernels of quant_dot.h.
 *
 * Owns: the row split over the thread pool (each task a run of whole weight rows, so each weight byte
 * is read from memory once per call), the walk inside a task (chunks of 16 weight rows; per chunk, each
 * token tile of CPU_QTILE rows meets every row of the chunk, so the tile's activations stay in L1 and the
 * chunk's weights in L1/L2), the per-row fp32 scales, and the affine bias folded as
 * Σ_g b_g · (Σ x over group g).
 */
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "base/base.h"
#include "cpu_internal.h"

bool cpu_matmul_fast_ok(const cpu_ctx *c, const lily_tensor *w)
{
    /* scale and bias rows back to back (cpu_qmatmul_rows converts a chunk's in one run) */
    return !c->exact && (w->bits == 4 || w->bits == 8) && w->group_size % CPU_QBLOCK == 0 &&
           lily_tensor_cols(w) % CPU_QBLOCK == 0 &&
           w->scale_row_bytes == lily_tensor_cols(w) / w->group_size * lily_dtype_size(w->scale_dtype);
}

typedef struct {
    const float *x;
    int n, rows_per_task;
    cpu_qact *a;
} quantize_job;

static void quantize_task(void *arg, int task, int thread)
{
    (void)thread;
    const quantize_job *j = arg;
    const int64_t cols = j->a->cols, nb = cols / CPU_QBLOCK;
    const int r0 = task * j->rows_per_task, r1 = LILY_MIN(j->n, r0 + j->rows_per_task);
    cpu_qact part = *j->a; /* rows r0 .. r1 - 1 */
    part.q += r0 * cols;
    part.r += r0 * cols;
    part.v += r0 * cols;
    part.d += r0 * nb;
    part.sum += r0 * nb;
    cpu_quantize_act(j->x + (int64_t)r0 * cols, r1 - r0, cols, &part);
}

/* Rows below which quantizing stays on the calling thread. */
#define QUANTIZE_PARALLEL_MIN_ROWS 16

void cpu_quantize_act_rows(const cpu_ctx *c, const float *x, int n, int64_t cols, cpu_qact *a)
{
    const int threads = lily_threadpool_size(c->pool);
    a->cols = cols;
    if (n < QUANTIZE_PARALLEL_MIN_ROWS || threads < 2) {
        cpu_quantize_act(x, n, cols, a);
        return;
    }
    const int per_task = (n + 2 * threads - 1) / (2 * threads);
    quantize_job job = {x, n, per_task, a};
    parallel_for(c->pool, (n + per_task - 1) / per_task, quantize_task, &job);
}

void cpu_qact_group_sums(const cpu_qact *a, int n, int group, float *gsum)
{
    const int64_t nb = a->cols / CPU_QBLOCK, per_group = group / CPU_QBLOCK, n_groups = a->cols / group;
    for (int t = 0; t < n; t++)
        for (int64_t g = 0; g < n_groups; g++) {
            float s = 0;
            for (int64_t k = 0; k < per_group; k++)
                s += a->sum[t * nb + g * per_group + k];
            gsum[t * n_groups + g] = s;
        }
}

/* A bf16 value's bits widened to fp32's. */
static inline uint32_t bf16_bits_to_f32_bits(uint16_t h) { return (uint32_t)h << 16; }

/* 16-bit element i of p, at any alignment (a checkpoint's tensor need not be aligned: MLX writes the
 * safetensors header unpadded). */
static inline uint16_t u16_at(const void *p, int64_t i)
{
    uint16_t v;
    memcpy(&v, (const char *)p + 2 * i, 2);
    return v;
}

/* n values of a scale or bias row (fp32, bf16 or fp16; any alignment) as fp32, the dtype switch outside the
 * loop; the bf16 case in runs of 8 the compiler vectorizes (the common MLX checkpoint's dtype). */
CPU_VEC8_CLONES static void load_row_f32(const void *src, lily_dtype dtype, int64_t n, float *dst)
{
    int64_t i = 0;
    switch (dtype) {
    case LILY_DTYPE_BF16: {
        uint32_t bits[8];
        for (; i + 8 <= n; i += 8) {
            for (int l = 0; l < 8; l++)
                bits[l] = bf16_bits_to_f32_bits(u16_at(src, i + l));
            memcpy(dst + i, bits, sizeof bits);
        }
        for (; i < n; i++)
            dst[i] = lily_bf16_to_f32(u16_at(src, i));
        break;
    }
    case LILY_DTYPE_F16:
        for (; i < n; i++)
            dst[i] = lily_f16_to_f32(u16_at(src, i));
        break;
    default:
        for (; i < n; i++)
            dst[i] = lily_load_f32(src, dtype, i);
        break;
    }
}

/* dst[g * ld + r] = the fp32 value of src[r * n_groups + g] for r < nr, 0 for nr <= r < ld (ld a multiple of
 * 8): a chunk's scale or bias rows (row-major, n_groups per row) transposed so that rows are the lanes of
 * bias_terms. The bf16 case on x86-64 in 4 x 4 blocks (SSE2: bf16 to fp32 is the 16 bits placed high, then
 * one transpose per block); the values are the same either way. */
CPU_VEC8_CLONES static void load_rows_transposed(const void *src, lily_dtype dtype, int64_t nr, int64_t n_groups, int64_t ld,
                                 float *restrict dst)
{
    int64_t g0 = 0;
#if defined(__x86_64__)
    if (dtype == LILY_DTYPE_BF16) {
        const uint16_t *h = src;
        const __m128i zero = _mm_setzero_si128();
        for (; g0 + 4 <= n_groups; g0 += 4)
            for (int64_t r = 0; r < ld; r += 4) {
                __m128 m[4];
                if (r + 4 <= nr) /* (the branch-free common case) */
                    for (int i = 0; i < 4; i++)
                        m[i] = _mm_castsi128_ps(
                            _mm_unpacklo_epi16(zero, _mm_loadl_epi64((const __m128i *)(h + (r + i) * n_groups + g0))));
                else
                    for (int i = 0; i < 4; i++)
                        m[i] = r + i < nr ? _mm_castsi128_ps(_mm_unpacklo_epi16(
                                                zero, _mm_loadl_epi64((const __m128i *)(h + (r + i) * n_groups + g0))))
                                          : _mm_setzero_ps();
                _MM_TRANSPOSE4_PS(m[0], m[1], m[2], m[3]);
                for (int i = 0; i < 4; i++)
                    _mm_storeu_ps(dst + (g0 + i) * ld + r, m[i]);
            }
    }
#endif
    for (int64_t g = g0; g < n_groups; g++)
        for (int64_t r = 0; r < ld; r++)
            dst[g * ld + r] = r < nr ? lily_load_f32(src, dtype, r * n_groups + g) : 0.0f;
}

/* load_rows_transposed with the kernel set's transposition (bf16) for the rows and groups it takes. */
static void load_rows_transposed_set(const cpu_qdot_kernels *kern, const void *src, lily_dtype dtype, int64_t nr,
                                     int64_t n_groups, int64_t ld, float *restrict dst)
{
    if (!kern->transpose_bf16 || dtype != LILY_DTYPE_BF16 || nr < 16 || n_groups < 4) {
        load_rows_transposed(src, dtype, nr, n_groups, ld, dst);
        return;
    }
    const int64_t nr16 = nr / 16 * 16;
    kern->transpose_bf16(src, nr, n_groups, ld, dst);
    for (int64_t g = 0; g < n_groups; g++)
        for (int64_t r = nr16; r < ld; r++)
            dst[g * ld + r] = r < nr ? lily_load_f32(src, dtype, r * n_groups + g) : 0.0f;
}

/* Scale floats a row chunk's fp32 scales and biases may take on the stack (each). */
#define QMATMUL_SCALE_FLOATS 4096
/* Weight bytes per chunk of rows: one token tile's activations stay in L1 while the chunk's weight rows
 * pass by, so weights and activations are each read from L2 about once per tile; short rows come in
 * longer chunks (at most 64 rows) to spread the per-chunk work. */
#define QMATMUL_CHUNK_BYTES 8192

/* bt[r] = Σ_g wbt[g * ld + r] · gs[g] for r < ld (ld a multiple of 8): the affine bias terms of a chunk's
 * rows for one token, the biases transposed so that rows are the vector lanes (fixed runs of 8 the
 * compiler vectorizes); each row's sum runs over g in order, whichever path asks. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
/* (also for AVX-512: runs of 16 in one register; no multiply-add fused, so every clone's values are the same) */
#define BIAS_TERMS_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default"), optimize("fp-contract=off")))
#else
#define BIAS_TERMS_CLONES CPU_VEC8_CLONES
#endif
BIAS_TERMS_CLONES static void bias_terms(const float *restrict wbt, int64_t ld, int64_t n_groups,
                                         const float *restrict gs, float *restrict bt)
{
    int64_t r = 0;
    for (; r + 16 <= ld; r += 16) { /* (the same operations per row as the runs of 8) */
        float acc[16] = {0};
        for (int64_t g = 0; g < n_groups; g++) {
            const float s = gs[g], *col = wbt + g * ld + r;
            for (int l = 0; l < 16; l++)
                acc[l] += col[l] * s;
        }
        for (int l = 0; l < 16; l++)
            bt[r + l] = acc[l];
    }
    for (; r < ld; r += 8) {
        float acc[8] = {0};
        for (int64_t g = 0; g < n_groups; g++) {
            const float s = gs[g], *col = wbt + g * ld + r;
            for (int l = 0; l < 8; l++)
                acc[l] += col[l] * s;
        }
        for (int l = 0; l < 8; l++)
            bt[r + l] = acc[l];
    }
}

/* The most rows in a chunk; with the set's tile kernel (several tokens), the most rows per call of it (it
 * packs each token tile once per call). */
#define QMATMUL_CHUNK_ROWS 64
#define QMATMUL_GEMM_ROWS 256
/* Fewest tokens for a set's tile kernel (below, its four-row kernel per token is faster: ~23 against
 * ~48 G multiply-adds/s for a full tile of 8 on the AVX2 development VM). */
#define QMATMUL_GEMM_MIN_TOKENS 4
/* Bias-term floats of one run of the tile kernel (64 tokens of a 256-row chunk: 64 KiB on the stack). */
#define QMATMUL_GEMM_BIAS_FLOATS 16384

void cpu_qmatmul_rows(const cpu_qdot_kernels *kern, const lily_tensor *w, int64_t expert, int64_t row0, int64_t row1,
                      const cpu_qact *a, int t0, int n, const float *gsum, float *y, int64_t ldy)
{
    const int64_t n_groups = a->cols / w->group_size;
    const int64_t base = w->ndim == 3 ? expert * w->expert_stride : 0;
    const cpu_qdot_fn dot = w->bits == 4 ? kern->dot_q4 : kern->dot_q8;
    const cpu_qdot_rows_fn rows_fn = w->bits == 4 ? kern->rows_q4 : kern->rows_q8;
    /* several tokens: the set's tile kernel where it has one, over chunks of as many rows as the scale
     * buffers take (it unpacks each chunk's rows once for all the tokens); below QMATMUL_GEMM_MIN_TOKENS
     * (it pads to tiles of 8) such a set's four-row kernel token by token (the same bits) */
    const bool tile_set = w->bits == 4 && kern->gemm_q4 && a->cols <= CPU_QGEMM_MAX_COLS;
    const cpu_qgemm_fn gemm = tile_set && n >= QMATMUL_GEMM_MIN_TOKENS ? kern->gemm_q4 : NULL;
    /* tokens for the tile kernel: the last partial tile of 8 goes token by token when it is short */
    const int n_gemm = !gemm ? 0 : n % 8 != 0 && n % 8 < QMATMUL_GEMM_MIN_TOKENS ? n - n % 8 : n;
    const int tile_tokens = tile_set && rows_fn ? 1 : CPU_QTILE;
    const int64_t chunk =
        gemm ? LILY_MAX((int64_t)8, LILY_MIN(QMATMUL_SCALE_FLOATS / n_groups, (int64_t)QMATMUL_GEMM_ROWS) / 8 * 8)
             : LILY_MAX((int64_t)1,
                        LILY_MIN(QMATMUL_SCALE_FLOATS / n_groups,
                                 LILY_MIN((int64_t)QMATMUL_CHUNK_ROWS,
                                          n == 1 ? QMATMUL_CHUNK_ROWS /* one token: no tile to keep in L1 */
                                                 : LILY_MAX((int64_t)16, QMATMUL_CHUNK_BYTES / w->row_bytes))));
    float ws[QMATMUL_SCALE_FLOATS + 8 * 64], wbt[QMATMUL_SCALE_FLOATS + 8 * 64];
    float bt[CPU_QTILE][QMATMUL_GEMM_ROWS]; /* chunks are at most QMATMUL_GEMM_ROWS rows */
    float gbt[QMATMUL_GEMM_BIAS_FLOATS];     /* the tile kernel's bias terms: [tokens of a run][ld] */
    LILY_ASSERT(n_groups <= QMATMUL_SCALE_FLOATS);
    /* a lone token (decode) on 4-bit rows: the set's four-row kernel on its own activation layout where it
     * has one (the same bits as rows_fn), the layout made once per call */
    int16_t xn[CPU_QGEMM_MAX_COLS];
    const bool prep = n == 1 && w->bits == 4 && kern->rows_q4_prep && a->cols <= CPU_QGEMM_MAX_COLS;
    if (prep)
        kern->prep_q4(a, t0, xn);
    const float *xd = a->d + (int64_t)t0 * (a->cols / CPU_QBLOCK);
    for (int64_t c0 = row0; c0 < row1; c0 += chunk) {
        const int64_t c1 = LILY_MIN(c0 + chunk, row1), nr = c1 - c0;
        /* the next chunk's scale and bias rows asked for now, a cache line at a time: they are read in a
         * burst at the chunk's start, which would otherwise wait on memory */
        if (c1 < row1) {
            const int64_t off = (base + c1) * w->scale_row_bytes;
            const int64_t bytes = (LILY_MIN(c1 + chunk, row1) - c1) * w->scale_row_bytes;
            for (int64_t i = 0; i < bytes; i += 64) {
                __builtin_prefetch((const uint8_t *)w->scales + off + i);
                __builtin_prefetch((const uint8_t *)w->biases + off + i);
            }
        }
        /* the chunk's scale (bias) rows lie back to back: one conversion each; the biases transposed */
        const int64_t ld = (nr + 7) / 8 * 8; /* rows padded to the lanes of bias_terms */
        if (prep) /* the scales transposed too (rows_q4_prep reads a group's four rows in one load) */
            load_rows_transposed_set(kern, (const uint8_t *)w->scales + (base + c0) * w->scale_row_bytes,
                                     w->scale_dtype, nr, n_groups, ld, ws);
        else
            load_row_f32((const uint8_t *)w->scales + (base + c0) * w->scale_row_bytes, w->scale_dtype, nr * n_groups,
                         ws);
        load_rows_transposed_set(kern, (const uint8_t *)w->biases + (base + c0) * w->scale_row_bytes, w->scale_dtype,
                                 nr, n_groups, ld, wbt);
        /* the tile kernel in runs of tokens whose bias terms fit gbt (whole tiles of 16), each run's bias
         * terms made first and added by the kernel as it stores (the output is written once) */
        const int run = (int)LILY_MAX(16, QMATMUL_GEMM_BIAS_FLOATS / ld / 16 * 16);
        for (int i0 = 0; i0 < n_gemm; i0 += run) {
            const int ni = LILY_MIN(run, n_gemm - i0);
            for (int i = 0; i < ni; i++)
                bias_terms(wbt, ld, n_groups, gsum + (int64_t)(t0 + i0 + i) * n_groups, gbt + (int64_t)i * ld);
            gemm((const uint8_t *)w->data + (base + c0) * w->row_bytes, w->row_bytes, nr, ws, n_groups, w->group_size,
                 a, t0 + i0, ni, gbt, ld, y + (int64_t)i0 * ldy + (c0 - row0), ldy);
        }
        for (int i0 = n_gemm; i0 < n; i0 += tile_tokens) {
            const int nt = LILY_MIN(tile_tokens, n - i0);
            for (int i = 0; i < nt; i++)
                bias_terms(wbt, ld, n_groups, gsum + (int64_t)(t0 + i0 + i) * n_groups, bt[i]);
            int64_t r = c0;
            /* a lone token (decode): CPU_QROWS rows per kernel call where the set has such a kernel */
            if (nt == 1 && rows_fn)
                for (; r + CPU_QROWS <= c1; r += CPU_QROWS) {
                    float out[CPU_QROWS];
                    if (prep)
                        kern->rows_q4_prep((const uint8_t *)w->data + (base + r) * w->row_bytes, w->row_bytes,
                                           ws + (r - c0), ld, w->group_size, xn, xd, a->cols, out);
                    else
                        rows_fn((const uint8_t *)w->data + (base + r) * w->row_bytes, w->row_bytes,
                                ws + (r - c0) * n_groups, n_groups, w->group_size, a, t0 + i0, out);
                    for (int q = 0; q < CPU_QROWS; q++)
                        y[(int64_t)i0 * ldy + (r + q - row0)] = out[q] + bt[0][r + q - c0];
                }
            for (; r < c1; r++) {
                float out[CPU_QTILE], rs[CPU_QGEMM_MAX_COLS / CPU_QBLOCK];
                const float *wsr = ws + (r - c0) * n_groups;
                if (prep) { /* the row's scales out of the transposed layout */
                    for (int64_t g = 0; g < n_groups; g++)
                        rs[g] = ws[g * ld + (r - c0)];
                    wsr = rs;
                }
                dot((const uint8_t *)w->data + (base + r) * w->row_bytes, wsr, w->group_size, a, t0 + i0, nt, out);
                for (int i = 0; i < nt; i++)
                    y[(int64_t)(i0 + i) * ldy + (r - row0)] = out[i] + bt[i][r - c0];
            }
        }
    }
}

int cpu_qmatmul_block_rows(const cpu_ctx *c, int64_t rows, int n)
{
    const int threads = lily_threadpool_size(c->pool);
    /* several tokens: about 2 tasks per thread of at most 256 rows (each task packs the token tiles once,
     * so fewer tasks pack less; 4 per thread were ~3% slower on small pp256); one token
     * over many rows (an LM head): about 16 tasks per thread, each claim of a task being a cache-line
     * transfer between cores (tasks of 64 rows made 2,374 claims per token of a 151,936-row head) */
    int64_t b = n >= 2 ? LILY_MIN((int64_t)QMATMUL_GEMM_ROWS, (rows + 2 * threads - 1) / (2 * threads))
                       : LILY_MIN((int64_t)64, (rows + 4 * threads - 1) / (4 * threads));
    if (n == 1)
        b = LILY_MAX(b, (rows + 16 * threads - 1) / (16 * threads));
    /* whole runs of CPU_QROWS rows, so the 4-row decode kernels take every row */
    return (int)((LILY_MAX(b, (int64_t)1) + CPU_QROWS - 1) / CPU_QROWS * CPU_QROWS);
}

typedef struct {
    const cpu_ctx *c;
    int m;                                  /* matrices */
    const lily_tensor *w[CPU_MATMUL_MANY_MAX];
    float *y[CPU_MATMUL_MANY_MAX];
    int64_t rows[CPU_MATMUL_MANY_MAX];
    int first_task[CPU_MATMUL_MANY_MAX + 1]; /* matrix i's tasks: [first_task[i], first_task[i + 1]) */
    int64_t expert;
    const cpu_qact *a;
    int n;
    int block_rows;
} qmatmul_job;

static void qmatmul_task(void *arg, int task, int thread)
{
    (void)thread;
    const qmatmul_job *j = arg;
    int i = 0;
    while (task >= j->first_task[i + 1])
        i++;
    const int64_t row0 = (int64_t)(task - j->first_task[i]) * j->block_rows;
    const int64_t row1 = LILY_MIN(row0 + j->block_rows, j->rows[i]);
    cpu_qmatmul_rows(j->c->qdot, j->w[i], j->expert, row0, row1, j->a, 0, j->n, j->c->qgsum, j->y[i] + row0,
                     j->rows[i]);
}

/* Matrices w[0..m-1] (one input width and group size) against a in one parallel_for: the row blocks of
 * all of them are one task list, sized by their total rows. */
static void qmatmul_run(const cpu_ctx *c, int m, const lily_tensor *const *w, int64_t expert, const cpu_qact *a, int n,
                        float *const *y)
{
    const int64_t cols = lily_tensor_cols(w[0]);
    LILY_ASSERT(m >= 1 && m <= CPU_MATMUL_MANY_MAX && a->cols == cols && cols <= CPU_MATMUL_MAX_COLS &&
                n <= c->max_chunk);
    qmatmul_job job = {.c = c, .m = m, .expert = expert, .a = a, .n = n};
    int64_t total = 0;
    for (int i = 0; i < m; i++) {
        LILY_ASSERT(cpu_matmul_fast_ok(c, w[i]) && lily_tensor_cols(w[i]) == cols &&
                    w[i]->group_size == w[0]->group_size);
        LILY_ASSERT(w[i]->ndim == 3 ? expert >= 0 && expert < w[i]->shape[0] : expert == 0);
        job.w[i] = w[i];
        job.y[i] = y[i];
        job.rows[i] = lily_tensor_rows(w[i]);
        total += job.rows[i];
    }
    cpu_qact_group_sums(a, n, w[0]->group_size, c->qgsum);
    job.block_rows = cpu_qmatmul_block_rows(c, total, n);
    job.first_task[0] = 0;
    for (int i = 0; i < m; i++)
        job.first_task[i + 1] = job.first_task[i] + (int)((job.rows[i] + job.block_rows - 1) / job.block_rows);
    cpu_prof_mark(c, CPU_STAGE_QUANTIZE); /* the input's quantization (the caller's) and group sums */
    parallel_for(c->pool, job.first_task[m], qmatmul_task, &job);
}

void cpu_qmatmul_expert(const cpu_ctx *c, const lily_tensor *w, int64_t expert, const cpu_qact *a, int n, float *y)
{
    qmatmul_run(c, 1, &w, expert, a, n, &y);
}

bool cpu_matmul_many(const cpu_ctx *c, int m, const lily_tensor *const *w, const float *x, int n, float *const *y)
{
    bool quantized = false;
    for (int i = 0; i < m;) {
        /* the run of matrices from i that share the fast path, the input width and the group size */
        int j = i + 1;
        if (cpu_matmul_fast_ok(c, w[i]))
            while (j < m && j - i < CPU_MATMUL_MANY_MAX && cpu_matmul_fast_ok(c, w[j]) &&
                   lily_tensor_cols(w[j]) == lily_tensor_cols(w[i]) && w[j]->group_size == w[i]->group_size)
                j++;
        if (j - i == 1) {
            cpu_matmul(c, w[i], x, n, y[i]);
            quantized = false; /* cpu_matmul overwrote c->qact */
        } else {
            cpu_qact a = c->qact;
            if (!quantized)
                cpu_quantize_act_rows(c, x, n, lily_tensor_cols(w[i]), &a);
            a.cols = lily_tensor_cols(w[i]);
            quantized = true;
            qmatmul_run(c, j - i, w + i, 0, &a, n, y + i);
        }
        i = j;
    }
    return quantized;
}
