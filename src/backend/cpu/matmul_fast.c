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

#include "base/base.h"
#include "cpu_internal.h"

bool cpu_matmul_fast_ok(const cpu_ctx *c, const lily_tensor *w)
{
    /* scale and bias rows back to back (cpu_qmatmul_rows converts a chunk's in one run) */
    return !c->exact && (w->bits == 4 || w->bits == 8) && w->group_size % CPU_QBLOCK == 0 &&
           lily_tensor_cols(w) % CPU_QBLOCK == 0 &&
           w->scale_row_bytes == lily_tensor_cols(w) / w->group_size * lily_dtype_size(w->scale_dtype);
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

/* Σ_g wb[g] · gs[g] in a fixed order that depends only on n: one serial sum for n < 8, else eight
 * interleaved partial sums and a pairwise sum (the compiler vectorizes that loop). */
static inline float bias_dot(const float *wb, const float *gs, int64_t n)
{
    if (n < 8) {
        float sum = 0;
        for (int64_t g = 0; g < n; g++)
            sum += wb[g] * gs[g];
        return sum;
    }
    float part[8] = {0};
    int64_t g = 0;
    for (; g + 8 <= n; g += 8)
        for (int l = 0; l < 8; l++)
            part[l] += wb[g + l] * gs[g + l];
    for (int l = 0; g + l < n; l++)
        part[l] += wb[g + l] * gs[g + l];
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

/* A bf16 value's bits widened to fp32's. */
static inline uint32_t bf16_bits_to_f32_bits(uint16_t h) { return (uint32_t)h << 16; }

/* n values of a scale or bias row (fp32, bf16 or fp16) as fp32, the dtype switch outside the loop; the
 * bf16 case in runs of 8 the compiler vectorizes (the common MLX checkpoint's dtype). */
static void load_row_f32(const void *src, lily_dtype dtype, int64_t n, float *dst)
{
    const uint16_t *h = src;
    int64_t i = 0;
    switch (dtype) {
    case LILY_DTYPE_BF16: {
        uint32_t bits[8];
        for (; i + 8 <= n; i += 8) {
            for (int l = 0; l < 8; l++)
                bits[l] = bf16_bits_to_f32_bits(h[i + l]);
            memcpy(dst + i, bits, sizeof bits);
        }
        for (; i < n; i++)
            dst[i] = lily_bf16_to_f32(h[i]);
        break;
    }
    case LILY_DTYPE_F16:
        for (; i < n; i++)
            dst[i] = lily_f16_to_f32(h[i]);
        break;
    default:
        for (; i < n; i++)
            dst[i] = lily_load_f32(src, dtype, i);
        break;
    }
}

/* Scale floats a row chunk's fp32 scales and biases may take on the stack (each). */
#define QMATMUL_SCALE_FLOATS 4096
/* Weight bytes per chunk of rows: one token tile's activations stay in L1 while the chunk's weight rows
 * pass by, so weights and activations are each read from L2 about once per tile; short rows come in
 * longer chunks (at most 64 rows) to spread the per-chunk work. */
#define QMATMUL_CHUNK_BYTES 8192

void cpu_qmatmul_rows(const cpu_qdot_kernels *kern, const lily_tensor *w, int64_t expert, int64_t row0, int64_t row1,
                      const cpu_qact *a, int t0, int n, const float *gsum, float *y, int64_t ldy)
{
    const int64_t n_groups = a->cols / w->group_size;
    const int64_t base = w->ndim == 3 ? expert * w->expert_stride : 0;
    const cpu_qdot_fn dot = w->bits == 4 ? kern->dot_q4 : kern->dot_q8;
    const cpu_qdot_rows_fn rows_fn = w->bits == 4 ? kern->rows_q4 : kern->rows_q8;
    const int64_t chunk = LILY_MAX((int64_t)1, LILY_MIN(QMATMUL_SCALE_FLOATS / n_groups,
                                                        LILY_MIN((int64_t)64, LILY_MAX((int64_t)16, QMATMUL_CHUNK_BYTES / w->row_bytes))));
    float ws[QMATMUL_SCALE_FLOATS], wb[QMATMUL_SCALE_FLOATS];
    LILY_ASSERT(n_groups <= QMATMUL_SCALE_FLOATS);
    for (int64_t c0 = row0; c0 < row1; c0 += chunk) {
        const int64_t c1 = LILY_MIN(c0 + chunk, row1);
        /* the chunk's scale (bias) rows lie back to back: one conversion each */
        load_row_f32((const uint8_t *)w->scales + (base + c0) * w->scale_row_bytes, w->scale_dtype,
                     (c1 - c0) * n_groups, ws);
        load_row_f32((const uint8_t *)w->biases + (base + c0) * w->scale_row_bytes, w->scale_dtype,
                     (c1 - c0) * n_groups, wb);
        for (int i0 = 0; i0 < n; i0 += CPU_QTILE) {
            const int nt = LILY_MIN(CPU_QTILE, n - i0);
            const float *gs = gsum + (int64_t)(t0 + i0) * n_groups;
            int64_t r = c0;
            /* a lone token (decode): CPU_QROWS rows per kernel call where the set has such a kernel */
            if (nt == 1 && rows_fn)
                for (; r + CPU_QROWS <= c1; r += CPU_QROWS) {
                    float out[CPU_QROWS];
                    rows_fn((const uint8_t *)w->data + (base + r) * w->row_bytes, w->row_bytes, ws + (r - c0) * n_groups,
                            n_groups, w->group_size, a, t0 + i0, out);
                    for (int q = 0; q < CPU_QROWS; q++)
                        y[(int64_t)i0 * ldy + (r + q - row0)] = out[q] + bias_dot(wb + (r + q - c0) * n_groups, gs, n_groups);
                }
            for (; r < c1; r++) {
                const float *rs = ws + (r - c0) * n_groups, *rb = wb + (r - c0) * n_groups;
                float out[CPU_QTILE];
                dot((const uint8_t *)w->data + (base + r) * w->row_bytes, rs, w->group_size, a, t0 + i0, nt, out);
                for (int i = 0; i < nt; i++)
                    y[(int64_t)(i0 + i) * ldy + (r - row0)] =
                        out[i] + bias_dot(rb, gsum + (int64_t)(t0 + i0 + i) * n_groups, n_groups);
            }
        }
    }
}

int cpu_qmatmul_block_rows(const cpu_ctx *c, int64_t rows)
{
    const int threads = lily_threadpool_size(c->pool);
    const int64_t b = LILY_MIN((int64_t)64, (rows + 4 * threads - 1) / (4 * threads));
    return b < 1 ? 1 : (int)b;
}

typedef struct {
    const cpu_ctx *c;
    const lily_tensor *w;
    int64_t expert;
    const cpu_qact *a;
    int n;
    float *y;
    int64_t rows;
    int block_rows;
} qmatmul_job;

static void qmatmul_task(void *arg, int task, int thread)
{
    (void)thread;
    const qmatmul_job *j = arg;
    const int64_t row0 = (int64_t)task * j->block_rows, row1 = LILY_MIN(row0 + j->block_rows, j->rows);
    cpu_qmatmul_rows(j->c->qdot, j->w, j->expert, row0, row1, j->a, 0, j->n, j->c->qgsum, j->y + row0, j->rows);
}

void cpu_qmatmul_expert(const cpu_ctx *c, const lily_tensor *w, int64_t expert, const cpu_qact *a, int n, float *y)
{
    const int64_t rows = lily_tensor_rows(w), cols = lily_tensor_cols(w);
    LILY_ASSERT(cpu_matmul_fast_ok(c, w) && a->cols == cols && cols <= CPU_MATMUL_MAX_COLS && n <= c->max_chunk);
    LILY_ASSERT(w->ndim == 3 ? expert >= 0 && expert < w->shape[0] : expert == 0);
    cpu_qact_group_sums(a, n, w->group_size, c->qgsum);
    const int block_rows = cpu_qmatmul_block_rows(c, rows);
    qmatmul_job job = {c, w, expert, a, n, y, rows, block_rows};
    parallel_for(c->pool, (int)((rows + block_rows - 1) / block_rows), qmatmul_task, &job);
}
