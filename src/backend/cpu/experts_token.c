/* experts_token.c — one token's routed experts on the host's cores (experts_token.h).
 *
 * Two passes over the pool, as moe_fast.c runs them for a chunk: pass 1 — every (slot, block of
 * intermediate rows) a task: gate and up rows, then silu(gate) ⊙ up — and pass 2 — every block of hidden
 * rows a task: each slot's down rows, added into out with its weight in ascending expert id. The inputs
 * of each pass are prepared once on the calling thread in between (CUDA rounding: fdot.h's prep, x with
 * one scale, each slot's silu(gate) ⊙ up with its own; fast: int8 digits). Each selected expert's weight
 * bytes are read once; nothing is allocated per call.
 */
#include "experts_token.h"

#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cpu_internal.h"

#define MAX_K 64

struct cpu_experts_token {
    int hidden, inter, top_k;
    cpu_experts_arith arith;
    lily_threadpool *pool;
    const cpu_qdot_kernels *qdot; /* CPU_EXPERTS_FAST */
    cpu_qact qx;     /* [1, hidden] */
    cpu_qact qh;     /* [top_k, inter] */
    float *gsum_x;   /* [hidden / 32] */
    float *gsum_h;   /* [top_k, inter / 32] */
    const cpu_fdot_kernels *fdot; /* CPU_EXPERTS_CUDA_ROUNDING */
    float *xe_x, *xs_x; /* [hidden], [hidden / 32]: x as fdot.h's prep writes it, its group sums */
    float *xe_h, *xs_h; /* [top_k, inter], [top_k, inter / 32]: each slot's silu(gate) ⊙ up, prepared */
    float xk_x, xk_h[MAX_K]; /* their x scales k */
    float *g, *u;    /* [top_k, inter] */
    /* the call in flight (read by the tasks) */
    const lily_tensor *gate, *up, *down;
    int k;
    int ids[MAX_K];  /* ascending */
    float w[MAX_K];
    int br1, nb1, br2;
    float *out;
};

static lily_status qact_alloc(cpu_qact *a, int rows, int cols)
{
    const size_t n = (size_t)rows * cols, nb = n / CPU_QBLOCK;
    a->q = malloc(n);
    a->r = malloc(n);
    a->v = malloc(n * sizeof(int16_t));
    a->d = malloc(nb * sizeof(float));
    a->sum = malloc(nb * sizeof(float));
    a->cols = cols;
    return a->q && a->r && a->v && a->d && a->sum ? LILY_OK : LILY_ERR_OUT_OF_MEMORY;
}

static void qact_free(cpu_qact *a)
{
    free(a->q);
    free(a->r);
    free(a->v);
    free(a->d);
    free(a->sum);
}

void cpu_experts_token_destroy(cpu_experts_token *t)
{
    if (!t)
        return;
    lily_threadpool_destroy(t->pool);
    qact_free(&t->qx);
    qact_free(&t->qh);
    free(t->gsum_x);
    free(t->gsum_h);
    free(t->xe_x);
    free(t->xs_x);
    free(t->xe_h);
    free(t->xs_h);
    free(t->g);
    free(t->u);
    free(t);
}

lily_status cpu_experts_token_create(int hidden, int inter, int top_k, int n_threads, cpu_experts_arith arith,
                                     cpu_experts_token **out, lily_error *err)
{
    *out = NULL;
    if (hidden <= 0 || inter <= 0 || hidden % CPU_QBLOCK || inter % CPU_QBLOCK || top_k < 1 || top_k > MAX_K ||
        (arith != CPU_EXPERTS_CUDA_ROUNDING && arith != CPU_EXPERTS_FAST))
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cpu experts: hidden %d / inter %d / top-k %d unsupported",
                              hidden, inter, top_k);
    cpu_experts_token *t = calloc(1, sizeof *t);
    if (!t)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cpu experts: out of memory");
    t->hidden = hidden;
    t->inter = inter;
    t->top_k = top_k;
    t->arith = arith;
    lily_status st = LILY_OK;
    if (arith == CPU_EXPERTS_FAST) {
        t->qdot = cpu_qdot_best();
        st = qact_alloc(&t->qx, 1, hidden);
        if (st == LILY_OK)
            st = qact_alloc(&t->qh, top_k, inter);
        t->gsum_x = malloc((size_t)hidden / CPU_QBLOCK * sizeof(float));
        t->gsum_h = malloc((size_t)top_k * inter / CPU_QBLOCK * sizeof(float));
        if (!t->gsum_x || !t->gsum_h)
            st = LILY_ERR_OUT_OF_MEMORY;
    } else {
        t->fdot = cpu_fdot_best();
        t->xe_x = malloc((size_t)hidden * sizeof(float));
        t->xs_x = malloc((size_t)hidden / CPU_QBLOCK * sizeof(float));
        t->xe_h = malloc((size_t)top_k * inter * sizeof(float));
        t->xs_h = malloc((size_t)top_k * inter / CPU_QBLOCK * sizeof(float));
        if (!t->xe_x || !t->xs_x || !t->xe_h || !t->xs_h)
            st = LILY_ERR_OUT_OF_MEMORY;
    }
    t->g = malloc((size_t)top_k * inter * sizeof(float));
    t->u = malloc((size_t)top_k * inter * sizeof(float));
    if (st != LILY_OK || !t->g || !t->u) {
        cpu_experts_token_destroy(t);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cpu experts: out of memory");
    }
    st = lily_threadpool_create(n_threads, &t->pool, err);
    if (st != LILY_OK) {
        cpu_experts_token_destroy(t);
        return st;
    }
    *out = t;
    return LILY_OK;
}

int cpu_experts_token_threads(const cpu_experts_token *t) { return lily_threadpool_size(t->pool); }

void cpu_experts_token_set_kernels(cpu_experts_token *t, const cpu_fdot_kernels *k)
{
    if (t->arith == CPU_EXPERTS_CUDA_ROUNDING && k)
        t->fdot = k;
}

const float *cpu_experts_token_hid(const cpu_experts_token *t) { return t->g; }

static bool stack_ok(const lily_tensor *w, int rows, int cols)
{
    return w->data && w->ndim == 3 && (w->bits == 4 || w->bits == 8) && w->group_size > 0 &&
           w->group_size % CPU_QBLOCK == 0 && cols % w->group_size == 0 && lily_tensor_rows(w) == rows &&
           lily_tensor_cols(w) == cols && w->scale_dtype == LILY_DTYPE_BF16 &&
           w->scale_row_bytes == lily_tensor_cols(w) / w->group_size * lily_dtype_size(w->scale_dtype);
}

bool cpu_experts_token_ok(const lily_tensor *gate, const lily_tensor *up, const lily_tensor *down, int hidden, int inter)
{
    return stack_ok(gate, inter, hidden) && stack_ok(up, inter, hidden) && stack_ok(down, hidden, inter) &&
           gate->group_size == up->group_size;
}

/* Rows [r0, r0 + n) of expert e of w against a prepared vector (xe, xs: fdot.h), into y (not divided by k). */
static void fdot_rows(const cpu_fdot_kernels *k, const lily_tensor *w, int e, int64_t r0, int n, const float *xe,
                      const float *xs, float *y)
{
    const int64_t row = (int64_t)e * w->expert_stride + r0, sbs = w->scale_row_bytes / 2;
    const cpu_fdot_rows_fn fn = w->bits == 4 ? k->rows_q4 : k->rows_q8;
    fn((const uint8_t *)w->data + row * w->row_bytes, w->row_bytes, (const uint16_t *)w->scales + row * sbs,
       (const uint16_t *)w->biases + row * sbs, sbs, n, (int)w->group_size, xe, xs, lily_tensor_cols(w), y);
}

static void gate_up_task(void *arg, int task, int thread)
{
    (void)thread;
    cpu_experts_token *t = arg;
    const int s = task / t->nb1, I = t->inter;
    const int64_t r0 = (int64_t)(task % t->nb1) * t->br1, r1 = LILY_MIN(r0 + t->br1, (int64_t)I);
    float *g = t->g + (int64_t)s * I + r0, *u = t->u + (int64_t)s * I + r0;
    if (t->arith == CPU_EXPERTS_FAST) {
        cpu_qmatmul_rows(t->qdot, t->gate, t->ids[s], r0, r1, &t->qx, 0, 1, t->gsum_x, g, I);
        cpu_qmatmul_rows(t->qdot, t->up, t->ids[s], r0, r1, &t->qx, 0, 1, t->gsum_x, u, I);
        for (int64_t r = 0; r < r1 - r0; r++)
            g[r] = cpu_silu(g[r]) * u[r];
        return;
    }
    fdot_rows(t->fdot, t->gate, t->ids[s], r0, (int)(r1 - r0), t->xe_x, t->xs_x, g);
    fdot_rows(t->fdot, t->up, t->ids[s], r0, (int)(r1 - r0), t->xe_x, t->xs_x, u);
    const float k = t->xk_x;
    for (int64_t r = 0; r < r1 - r0; r++)
        g[r] = cpu_silu(g[r] / k) * (u[r] / k);
}

#define DOWN_MAX_ROWS 256

static void down_task(void *arg, int task, int thread)
{
    (void)thread;
    cpu_experts_token *t = arg;
    const int64_t r0 = (int64_t)task * t->br2, r1 = LILY_MIN(r0 + t->br2, (int64_t)t->hidden);
    const int I = t->inter, ng = I / (int)t->down->group_size;
    float y[DOWN_MAX_ROWS], *o = t->out + r0;
    for (int64_t r = 0; r < r1 - r0; r++)
        o[r] = 0.0f;
    for (int s = 0; s < t->k; s++) { /* ascending expert id: moe_fast.c's order */
        const float wgt = t->w[s];
        if (t->arith == CPU_EXPERTS_FAST) {
            cpu_qmatmul_rows(t->qdot, t->down, t->ids[s], r0, r1, &t->qh, s, 1, t->gsum_h, y, 0);
            for (int64_t r = 0; r < r1 - r0; r++)
                o[r] += y[r] * wgt;
        } else {
            fdot_rows(t->fdot, t->down, t->ids[s], r0, (int)(r1 - r0), t->xe_h + (int64_t)s * I, t->xs_h + (int64_t)s * ng, y);
            const float k = t->xk_h[s];
            for (int64_t r = 0; r < r1 - r0; r++)
                o[r] += wgt * y[r] / k;
        }
    }
}

/* Rows per task: about 4 tasks per thread, whole runs of CPU_QROWS (the 4-row decode kernels), at most cap. */
static int block_rows(int64_t rows, int threads, int cap)
{
    const int64_t b = LILY_MIN((int64_t)cap, (rows + 4 * threads - 1) / (4 * threads));
    return (int)((LILY_MAX(b, (int64_t)1) + CPU_QROWS - 1) / CPU_QROWS * CPU_QROWS);
}

/* fdot.h's preparation of x [cols] for rows of w's width (bits, group), fp16 inputs or fp32; returns k. */
static float fdot_prep(const cpu_fdot_kernels *k, const lily_tensor *w, bool x_fp16, const float *x, int64_t cols,
                       float *xe, float *xs)
{
    if (w->bits == 4 && x_fp16)
        return k->prep_q4(x, cols, (int)w->group_size, xe, xs);
    if (w->bits == 4)
        cpu_fdot_prep_q4_fp32(x, cols, (int)w->group_size, xe, xs);
    else
        cpu_fdot_prep_q8(x, cols, (int)w->group_size, xe, xs);
    return 1.0f;
}

void cpu_experts_token_run(cpu_experts_token *t, const lily_tensor *gate, const lily_tensor *up, const lily_tensor *down,
                           bool x_fp16, const float *x, int k, const int *ids, const float *w, float *out)
{
    const int K = LILY_MAX(1, LILY_MIN(k, t->top_k)), threads = lily_threadpool_size(t->pool);
    /* the slots in ascending expert id (insertion sort of K) */
    t->k = K;
    for (int i = 0; i < K; i++) {
        int j = i;
        for (; j > 0 && t->ids[j - 1] > ids[i]; j--) {
            t->ids[j] = t->ids[j - 1];
            t->w[j] = t->w[j - 1];
        }
        t->ids[j] = ids[i];
        t->w[j] = w[i];
    }
    t->gate = gate;
    t->up = up;
    t->down = down;
    t->out = out;

    /* pass 1: g[s] = silu(x · gate[e_s]ᵀ) ⊙ (x · up[e_s]ᵀ) */
    if (t->arith == CPU_EXPERTS_FAST) {
        cpu_quantize_act(x, 1, t->hidden, &t->qx);
        cpu_qact_group_sums(&t->qx, 1, gate->group_size, t->gsum_x);
    } else {
        t->xk_x = fdot_prep(t->fdot, gate, x_fp16, x, t->hidden, t->xe_x, t->xs_x);
    }
    t->br1 = block_rows((int64_t)K * t->inter, threads, 64);
    t->nb1 = (t->inter + t->br1 - 1) / t->br1;
    parallel_for(t->pool, K * t->nb1, gate_up_task, t);

    /* pass 2: out = Σ_s w_s · g[s] · down[e_s]ᵀ */
    if (t->arith == CPU_EXPERTS_FAST) {
        cpu_quantize_act(t->g, K, t->inter, &t->qh);
        cpu_qact_group_sums(&t->qh, K, down->group_size, t->gsum_h);
    } else {
        const int I = t->inter, ng = I / (int)down->group_size;
        for (int s = 0; s < K; s++) /* each slot its own scale, as moe_down_mma's warp per slot */
            t->xk_h[s] = fdot_prep(t->fdot, down, x_fp16, t->g + (int64_t)s * I, I, t->xe_h + (int64_t)s * I,
                                   t->xs_h + (int64_t)s * ng);
    }
    t->br2 = block_rows(t->hidden, threads, DOWN_MAX_ROWS / 4); /* K experts' rows per task */
    parallel_for(t->pool, (t->hidden + t->br2 - 1) / t->br2, down_task, t);
}
