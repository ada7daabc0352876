/* token_rows.c — the per-token steps between the pool's matmul passes, split over blocks of token rows.
 *
 * Owns: cpu_parallel_rows() (a step whose rows are independent, over the pool when a chunk has enough of
 * them) and the forward pass's row-wise glue on it: the embedding lookup and the residual add fused with the
 * next RMSNorm. Each row gets the same operations as on one thread, so the values do not depend on the split.
 */
#include "base/base.h"
#include "cpu_internal.h"

/* Fewest rows that go over the pool (decode's one token stays on the caller), and fewest per task. */
#define ROWS_PARALLEL_MIN 16
#define ROWS_PER_TASK_MIN 4

typedef struct {
    cpu_rows_fn fn;
    void *arg;
    int n, per_task;
} rows_job;

static void rows_task(void *arg, int task, int thread)
{
    (void)thread;
    const rows_job *j = arg;
    const int r0 = task * j->per_task;
    j->fn(j->arg, r0, LILY_MIN(j->n, r0 + j->per_task));
}

void cpu_parallel_rows(const cpu_ctx *c, int n, cpu_rows_fn fn, void *arg)
{
    const int threads = lily_threadpool_size(c->pool);
    if (n < ROWS_PARALLEL_MIN || threads < 2) {
        if (n > 0)
            fn(arg, 0, n);
        return;
    }
    /* about two tasks per thread (dynamic hand-out evens out a late thread) */
    const int per_task = LILY_MAX(ROWS_PER_TASK_MIN, (n + 2 * threads - 1) / (2 * threads));
    rows_job job = {fn, arg, n, per_task};
    parallel_for(c->pool, (n + per_task - 1) / per_task, rows_task, &job);
}

typedef struct {
    const cpu_ctx *c;
    const int32_t *tokens;
} embed_job;

static void embed_rows(void *arg, int r0, int r1)
{
    const embed_job *j = arg;
    const int H = j->c->cfg->hidden;
    for (int t = r0; t < r1; t++)
        cpu_dequant_rows(&j->c->w->embed, 0, j->tokens[t], 1, j->c->hidden + (int64_t)t * H);
}

void cpu_embed_rows(const cpu_ctx *c, const int32_t *tokens, int n)
{
    embed_job job = {c, tokens};
    cpu_parallel_rows(c, n, embed_rows, &job);
}

typedef struct {
    float *h;
    const float *x, *weight;
    int dim;
    float eps;
    float *out;
} add_norm_job;

static void add_norm_rows(void *arg, int r0, int r1)
{
    const add_norm_job *j = arg;
    float *h = j->h + (int64_t)r0 * j->dim;
    if (j->x) {
        const float *x = j->x + (int64_t)r0 * j->dim;
        for (int64_t i = 0; i < (int64_t)(r1 - r0) * j->dim; i++)
            h[i] += x[i];
    }
    cpu_rmsnorm(h, j->weight, r1 - r0, j->dim, j->eps, j->out + (int64_t)r0 * j->dim);
}

void cpu_add_rmsnorm_rows(const cpu_ctx *c, float *h, const float *x, const float *weight, int n, int dim, float eps,
                          float *out)
{
    add_norm_job job = {h, x, weight, dim, eps, out};
    cpu_parallel_rows(c, n, add_norm_rows, &job);
}
