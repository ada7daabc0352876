/* matmul_fast.c — CPU linear layers in fast mode: y = x · Wᵀ with W kept in its MLX affine 4/8-bit
 * form and x quantized to int8 per block of 32, through the integer kernels of quant_dot.h.
 *
 * Owns: the row split over the thread pool (each task a run of whole weight rows, so each weight byte
 * is read once per call and reused, from L1, by every token tile of CPU_QTILE rows), the per-row fp32
 * scales, and the affine bias folded as Σ_g b_g · (Σ x over group g).
 */
#include "base/base.h"
#include "cpu_internal.h"

bool cpu_matmul_fast_ok(const cpu_ctx *c, const lily_tensor *w)
{
    return !c->exact && (w->bits == 4 || w->bits == 8) && w->group_size % CPU_QBLOCK == 0 &&
           lily_tensor_cols(w) % CPU_QBLOCK == 0;
}

typedef struct {
    const lily_tensor *w;
    int64_t base;      /* physical row of the expert's row 0 */
    const cpu_qact *a;
    const float *gsum; /* [n, n_groups]: Σ x over each weight group */
    int n;
    float *y;
    int64_t rows, cols;
    int block_rows;
    cpu_qdot_fn dot;
} qmatmul_job;

static void qmatmul_task(void *arg, int task, int thread)
{
    (void)thread;
    const qmatmul_job *j = arg;
    const lily_tensor *w = j->w;
    const int64_t n_groups = j->cols / w->group_size;
    float ws[CPU_MATMUL_MAX_COLS / CPU_QBLOCK], wb[CPU_MATMUL_MAX_COLS / CPU_QBLOCK];
    const int64_t row0 = (int64_t)task * j->block_rows;
    const int64_t row_end = LILY_MIN(row0 + j->block_rows, j->rows);
    for (int64_t r = row0; r < row_end; r++) {
        const int64_t prow = j->base + r;
        const uint8_t *sp = (const uint8_t *)w->scales + prow * w->scale_row_bytes;
        const uint8_t *bp = (const uint8_t *)w->biases + prow * w->scale_row_bytes;
        for (int64_t g = 0; g < n_groups; g++) {
            ws[g] = lily_load_f32(sp, w->scale_dtype, g);
            wb[g] = lily_load_f32(bp, w->scale_dtype, g);
        }
        const uint8_t *wrow = (const uint8_t *)w->data + prow * w->row_bytes;
        for (int t0 = 0; t0 < j->n; t0 += CPU_QTILE) {
            const int nt = LILY_MIN(CPU_QTILE, j->n - t0);
            float out[CPU_QTILE];
            j->dot(wrow, ws, w->group_size, j->a, t0, nt, out);
            for (int i = 0; i < nt; i++) {
                const float *gs = j->gsum + (int64_t)(t0 + i) * n_groups;
                float bias = 0;
                for (int64_t g = 0; g < n_groups; g++)
                    bias += wb[g] * gs[g];
                j->y[(int64_t)(t0 + i) * j->rows + r] = out[i] + bias;
            }
        }
    }
}

void cpu_qmatmul_expert(const cpu_ctx *c, const lily_tensor *w, int64_t expert, const cpu_qact *a, int n, float *y)
{
    const int64_t rows = lily_tensor_rows(w), cols = lily_tensor_cols(w);
    LILY_ASSERT(cpu_matmul_fast_ok(c, w) && a->cols == cols && cols <= CPU_MATMUL_MAX_COLS && n <= c->max_chunk);
    LILY_ASSERT(w->ndim == 3 ? expert >= 0 && expert < w->shape[0] : expert == 0);
    /* Σ x per weight group, from the blocks' fp32 sums */
    const int64_t n_groups = cols / w->group_size, per_group = w->group_size / CPU_QBLOCK, nb = cols / CPU_QBLOCK;
    for (int t = 0; t < n; t++)
        for (int64_t g = 0; g < n_groups; g++) {
            float s = 0;
            for (int64_t k = 0; k < per_group; k++)
                s += a->sum[t * nb + g * per_group + k];
            c->qgsum[t * n_groups + g] = s;
        }
    /* an even split: about 4 tasks per thread, at most 64 rows a task */
    const int threads = lily_threadpool_size(c->pool);
    int block_rows = (int)LILY_MIN((int64_t)64, (rows + 4 * threads - 1) / (4 * threads));
    if (block_rows < 1)
        block_rows = 1;
    qmatmul_job job = {w,
                       w->ndim == 3 ? expert * w->expert_stride : 0,
                       a,
                       c->qgsum,
                       n,
                       y,
                       rows,
                       cols,
                       block_rows,
                       w->bits == 4 ? c->qdot->dot_q4 : c->qdot->dot_q8};
    parallel_for(c->pool, (int)((rows + block_rows - 1) / block_rows), qmatmul_task, &job);
}
