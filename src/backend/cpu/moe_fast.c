/* moe_fast.c — the routed experts of the sparse MoE block in fast mode (MODEL.md §4.5), all experts of a
 * chunk in two passes over the thread pool instead of three per expert.
 *
 * Owns: quantizing the block's input once, gathering its rows by expert (the counting sort of moe.c),
 * pass 1 — every (active expert, block of intermediate rows) a task: gate and up rows for that expert's
 * tokens, then silu(gate) ⊙ up — and pass 2 — every (active expert, block of hidden rows) a task: the down
 * projection — then the weighted sum in ascending expert id, the order of the exact path. Each selected
 * expert's weight bytes are read once per chunk; nothing is allocated per call.
 */
#include <string.h>

#include "base/base.h"
#include "cpu_internal.h"

typedef struct {
    const cpu_ctx *c;
    const lily_layer_weights *lw;
    int n_active, blocks_per_expert, block_rows;
    int64_t rows; /* output rows of the pass's weights */
    const cpu_qact *a;
    const float *gsum;
    float *out, *aux; /* [n * k, rows] (aux: pass 1's up output) */
} moe_pass;

/* What task `task` of a pass covers: expert e, its weight rows [row0, row1), its grouped rows first ..
 * first + n_e - 1. */
typedef struct {
    int e, first, n_e;
    int64_t row0, row1;
} moe_span;

static moe_span task_span(const moe_pass *p, int task)
{
    moe_span s;
    s.e = p->c->moe_active[task / p->blocks_per_expert];
    s.row0 = (int64_t)(task % p->blocks_per_expert) * p->block_rows;
    s.row1 = LILY_MIN(s.row0 + p->block_rows, p->rows);
    s.first = p->c->expert_offset[s.e];
    s.n_e = p->c->expert_count[s.e];
    return s;
}

static void gate_up_task(void *arg, int task, int thread)
{
    (void)thread;
    const moe_pass *p = arg;
    const cpu_ctx *c = p->c;
    const moe_span sp = task_span(p, task);
    const int e = sp.e, first = sp.first, n_e = sp.n_e;
    const int64_t row0 = sp.row0, row1 = sp.row1;
    float *g = p->out + (int64_t)first * p->rows + row0, *u = p->aux + (int64_t)first * p->rows + row0;
    cpu_qmatmul_rows(c->qdot, &p->lw->experts_gate, e, row0, row1, p->a, first, n_e, p->gsum, g, p->rows);
    cpu_qmatmul_rows(c->qdot, &p->lw->experts_up, e, row0, row1, p->a, first, n_e, p->gsum, u, p->rows);
    for (int i = 0; i < n_e; i++)
        for (int64_t r = 0; r < row1 - row0; r++)
            g[i * p->rows + r] = cpu_silu(g[i * p->rows + r]) * u[i * p->rows + r];
}

static void down_task(void *arg, int task, int thread)
{
    (void)thread;
    const moe_pass *p = arg;
    const moe_span sp = task_span(p, task);
    cpu_qmatmul_rows(p->c->qdot, &p->lw->experts_down, sp.e, sp.row0, sp.row1, p->a, sp.first, sp.n_e, p->gsum,
                     p->out + (int64_t)sp.first * p->rows + sp.row0, p->rows);
}

/* Gather quantized row `src` of a into row `dst` of b (same cols). */
static void copy_qrow(const cpu_qact *a, int src, cpu_qact *b, int dst)
{
    const int64_t cols = a->cols, nb = cols / CPU_QBLOCK;
    memcpy(b->q + dst * cols, a->q + src * cols, (size_t)cols);
    memcpy(b->r + dst * cols, a->r + src * cols, (size_t)cols);
    memcpy(b->v + dst * cols, a->v + src * cols, (size_t)cols * sizeof(int16_t));
    memcpy(b->d + dst * nb, a->d + src * nb, (size_t)nb * sizeof(float));
    memcpy(b->sum + dst * nb, a->sum + src * nb, (size_t)nb * sizeof(float));
}

/* The most experts per token the fast path takes (combine_rows sorts a token's on the stack). */
#define MOE_FAST_MAX_TOP_K 64

typedef struct {
    cpu_ctx *c;
    const cpu_qact *a; /* the block's input, quantized */
    cpu_qact *gx;      /* its rows grouped by expert */
    int group;         /* the gate/up weights' group size */
    float *out;        /* [n, hidden] */
} moe_rows_job;

/* Grouped rows [r0, r1): the input row of each gathered, its group sums, and the row's place noted by slot. */
static void gather_rows(void *arg, int r0, int r1)
{
    const moe_rows_job *j = arg;
    cpu_ctx *c = j->c;
    const int k = c->cfg->n_experts_used;
    for (int row = r0; row < r1; row++) {
        const int slot = c->expert_rows[row];
        copy_qrow(j->a, slot / k, j->gx, row);
        c->moe_slot_row[slot] = row;
    }
    cpu_qact part = *j->gx; /* rows r0 .. r1 - 1 (cpu_qact_group_sums reads only the block sums) */
    part.sum += (int64_t)r0 * (part.cols / CPU_QBLOCK);
    cpu_qact_group_sums(&part, r1 - r0, j->group, c->moe_gsum + (int64_t)r0 * (part.cols / j->group));
}

/* Tokens [r0, r1): out[t] = Σ over t's experts in ascending id of weight × y (0 first), the order in which the
 * exact path adds them. */
static void combine_rows(void *arg, int r0, int r1)
{
    const moe_rows_job *j = arg;
    const cpu_ctx *c = j->c;
    const int hidden = c->cfg->hidden, k = c->cfg->n_experts_used;
    for (int t = r0; t < r1; t++) {
        int order[MOE_FAST_MAX_TOP_K]; /* t's slots by ascending expert id (k is small: insertion) */
        for (int s = 0; s < k; s++) {
            int i = s;
            for (; i > 0 && c->topk_ids[t * k + order[i - 1]] > c->topk_ids[t * k + s]; i--)
                order[i] = order[i - 1];
            order[i] = s;
        }
        float *o = j->out + (int64_t)t * hidden;
        memset(o, 0, (size_t)hidden * sizeof(float));
        for (int s = 0; s < k; s++) {
            const int slot = t * k + order[s];
            const float wgt = c->topk_weights[slot];
            const float *y = c->moe_yk + (int64_t)c->moe_slot_row[slot] * hidden;
            for (int i = 0; i < hidden; i++)
                o[i] += y[i] * wgt;
        }
    }
}

bool cpu_moe_fast_ok(const cpu_ctx *c, const lily_layer_weights *lw)
{
    return c->cfg->n_experts_used <= MOE_FAST_MAX_TOP_K && cpu_matmul_fast_ok(c, &lw->experts_gate) && cpu_matmul_fast_ok(c, &lw->experts_up) &&
           cpu_matmul_fast_ok(c, &lw->experts_down) && lw->experts_gate.group_size == lw->experts_up.group_size;
}

void cpu_moe_experts_fast(cpu_ctx *c, int layer, const float *x, bool x_in_qact, int n, float *out)
{
    const lily_config *cfg = c->cfg;
    const lily_layer_weights *lw = &c->w->layers[layer];
    const int hidden = cfg->hidden, E = cfg->n_experts, k = cfg->n_experts_used, inter = cfg->moe_intermediate;

    /* x quantized once (c->qact; already there when x_in_qact), its rows gathered by expert into c->moe_qx */
    cpu_qact a = c->qact;
    a.cols = hidden;
    if (!x_in_qact) {
        cpu_quantize_act_rows(c, x, n, hidden, &a);
        cpu_prof_mark(c, CPU_STAGE_QUANTIZE);
    }
    cpu_qact gx = c->moe_qx;
    gx.cols = hidden;
    int n_active = 0;
    for (int e = 0; e < E; e++)
        if (c->expert_count[e] > 0)
            c->moe_active[n_active++] = e;
    const int rows_k = n * k;
    moe_rows_job rj = {c, &a, &gx, lw->experts_gate.group_size, out};
    cpu_parallel_rows(c, rows_k, gather_rows, &rj);
    cpu_prof_mark(c, CPU_STAGE_MOE_GATHER);

    /* pass 1: moe_h = silu(x · gateᵀ) ⊙ (x · upᵀ), [n * k, inter] grouped by expert */
    int br = cpu_qmatmul_block_rows(c, (int64_t)inter * n_active, rows_k / n_active);
    moe_pass p1 = {c, lw, n_active, (inter + br - 1) / br, br, inter, &gx, c->moe_gsum, c->moe_h, c->moe_u};
    parallel_for(c->pool, n_active * p1.blocks_per_expert, gate_up_task, &p1);
    cpu_prof_mark(c, CPU_STAGE_MOE_GATE_UP);

    /* pass 2: moe_yk = moe_h · downᵀ, [n * k, hidden] */
    cpu_qact gh = c->moe_qh;
    gh.cols = inter;
    cpu_quantize_act_rows(c, c->moe_h, rows_k, inter, &gh);
    cpu_qact_group_sums(&gh, rows_k, lw->experts_down.group_size, c->moe_gsum);
    cpu_prof_mark(c, CPU_STAGE_QUANTIZE);
    br = cpu_qmatmul_block_rows(c, (int64_t)hidden * n_active, rows_k / n_active);
    moe_pass p2 = {c, lw, n_active, (hidden + br - 1) / br, br, hidden, &gh, c->moe_gsum, c->moe_yk, NULL};
    parallel_for(c->pool, n_active * p2.blocks_per_expert, down_task, &p2);
    cpu_prof_mark(c, CPU_STAGE_MOE_DOWN);

    /* out = Σ over the token's experts, ascending id, of weight × y */
    cpu_parallel_rows(c, n, combine_rows, &rj);
    cpu_prof_mark(c, CPU_STAGE_MOE_COMBINE);
}
