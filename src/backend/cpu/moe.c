/* moe.c — CPU sparse MoE block (MODEL.md §4.5), exact mode.
 *
 * Owns: the router (softmax in fp32, top-k with ties to the lower expert id, renormalised weights),
 * grouping the chunk's tokens by expert so each expert's weights are dequantized once per chunk, the
 * SwiGLU experts (fast mode: moe_fast.c), and the shared expert scaled by sigmoid(shared_expert_gate). Routed outputs are
 * accumulated in ascending expert id, as transformers' experts loop does.
 */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"

void cpu_moe_top_k(const float *probs, int n, int n_experts, int k, bool renormalize, int *ids, float *weights)
{
    for (int t = 0; t < n; t++) {
        const float *p = probs + (int64_t)t * n_experts;
        int *id = ids + (int64_t)t * k;
        float *wt = weights + (int64_t)t * k;
        float sum = 0;
        for (int s = 0; s < k; s++) {
            int best = -1;
            for (int e = 0; e < n_experts; e++) {
                bool taken = false;
                for (int r = 0; r < s; r++)
                    taken |= id[r] == e;
                if (!taken && (best < 0 || p[e] > p[best])) /* strict: ties keep the lower id */
                    best = e;
            }
            id[s] = best;
            wt[s] = p[best];
            sum += p[best];
        }
        if (renormalize)
            for (int s = 0; s < k; s++)
                wt[s] /= sum;
    }
}

static void softmax_rows(float *x, int n, int dim)
{
    for (int t = 0; t < n; t++) {
        float *r = x + (int64_t)t * dim;
        float m = -INFINITY;
        for (int i = 0; i < dim; i++)
            m = r[i] > m ? r[i] : m;
        float s = 0;
        for (int i = 0; i < dim; i++) {
            r[i] = expf(r[i] - m);
            s += r[i];
        }
        for (int i = 0; i < dim; i++)
            r[i] /= s;
    }
}

typedef struct {
    cpu_ctx *c;
    float *out; /* the block's output [n, hidden] (the shared add) */
} moe_rows_job;

/* Rows [r0, r1): the router's softmax and top-k. */
static void router_rows(void *arg, int r0, int r1)
{
    const moe_rows_job *j = arg;
    cpu_ctx *c = j->c;
    const lily_config *cfg = c->cfg;
    const int E = cfg->n_experts, k = cfg->n_experts_used;
    softmax_rows(c->router_probs + (int64_t)r0 * E, r1 - r0, E);
    cpu_moe_top_k(c->router_probs + (int64_t)r0 * E, r1 - r0, E, k, cfg->norm_topk_prob, c->topk_ids + (int64_t)r0 * k,
                  c->topk_weights + (int64_t)r0 * k);
}

/* hid = silu(gate) ⊙ up over [n, width], into gate */
static void swiglu(float *gate, const float *up, int64_t count)
{
    for (int64_t i = 0; i < count; i++)
        gate[i] = cpu_silu(gate[i]) * up[i];
}

/* Rows [r0, r1): the shared expert's hidden silu(gate) ⊙ up, into moe_gate. */
static void shared_swiglu_rows(void *arg, int r0, int r1)
{
    const moe_rows_job *j = arg;
    const int64_t w = j->c->cfg->shared_intermediate;
    swiglu(j->c->moe_gate + r0 * w, j->c->moe_up + r0 * w, (r1 - r0) * w);
}

/* Rows [r0, r1): out += sigmoid(shared gate logit) · the shared expert's output. */
static void shared_add_rows(void *arg, int r0, int r1)
{
    const moe_rows_job *j = arg;
    const cpu_ctx *c = j->c;
    const int hidden = c->cfg->hidden;
    for (int t = r0; t < r1; t++) {
        const float sg = cpu_sigmoid(c->shared_gate_logit[t]);
        float *o = j->out + (int64_t)t * hidden;
        const float *s = c->moe_y + (int64_t)t * hidden;
        for (int i = 0; i < hidden; i++)
            o[i] += sg * s[i];
    }
}

void cpu_moe_forward(cpu_ctx *c, int layer, const float *x, int n, float *out)
{
    const lily_config *cfg = c->cfg;
    const lily_layer_weights *lw = &c->w->layers[layer];
    const int hidden = cfg->hidden, E = cfg->n_experts, k = cfg->n_experts_used;
    const int inter = cfg->moe_intermediate;

    /* router; in fast mode with it the shared expert's gate and up projections and its gate logit (the
     * routed experts' fast path leaves moe_gate and moe_up alone): one pass over the pool for the four */
    const bool fast = cpu_moe_fast_ok(c, lw);
    const lily_tensor *in_w[] = {&lw->router, &lw->shared_gate, &lw->shared_up, &lw->shared_expert_gate};
    float *const in_y[] = {c->router_probs, c->moe_gate, c->moe_up, c->shared_gate_logit};
    const bool x_in_qact = cpu_matmul_many(c, fast ? 4 : 1, in_w, x, n, in_y);
    cpu_prof_mark(c, CPU_STAGE_MOE_ROUTER);
    moe_rows_job rj = {c, out};
    cpu_parallel_rows(c, n, router_rows, &rj);

    /* group (token, slot) pairs by expert: counting sort keeps tokens ascending within an expert */
    memset(c->expert_count, 0, (size_t)E * sizeof(int));
    for (int i = 0; i < n * k; i++)
        c->expert_count[c->topk_ids[i]]++;
    c->expert_offset[0] = 0;
    for (int e = 0; e < E; e++)
        c->expert_offset[e + 1] = c->expert_offset[e] + c->expert_count[e];
    memset(c->expert_count, 0, (size_t)E * sizeof(int));
    for (int i = 0; i < n * k; i++) {
        const int e = c->topk_ids[i];
        c->expert_rows[c->expert_offset[e] + c->expert_count[e]++] = i;
    }
    cpu_prof_mark(c, CPU_STAGE_MOE_TOPK);

    if (fast) {
        cpu_moe_experts_fast(c, layer, x, x_in_qact, n, out); /* reuses x quantized above when it is */
    } else {
        memset(out, 0, (size_t)n * hidden * sizeof(float));
        for (int e = 0; e < E; e++) {
            const int n_e = c->expert_count[e];
            if (n_e == 0)
                continue;
            const int *rows = c->expert_rows + c->expert_offset[e];
            for (int r = 0; r < n_e; r++)
                memcpy(c->moe_x + (int64_t)r * hidden, x + (int64_t)(rows[r] / k) * hidden, (size_t)hidden * sizeof(float));
            cpu_matmul_expert(c, &lw->experts_gate, e, c->moe_x, n_e, c->moe_gate);
            cpu_matmul_expert(c, &lw->experts_up, e, c->moe_x, n_e, c->moe_up);
            swiglu(c->moe_gate, c->moe_up, (int64_t)n_e * inter);
            cpu_matmul_expert(c, &lw->experts_down, e, c->moe_gate, n_e, c->moe_y);
            for (int r = 0; r < n_e; r++) {
                const float wgt = c->topk_weights[rows[r]];
                float *o = out + (int64_t)(rows[r] / k) * hidden;
                const float *y = c->moe_y + (int64_t)r * hidden;
                for (int i = 0; i < hidden; i++)
                    o[i] += y[i] * wgt;
            }
        }
        cpu_prof_mark(c, CPU_STAGE_MOE_EXPERTS);
    }

    /* shared expert, scaled per token by sigmoid(x · shared_expert_gateᵀ) */
    if (!fast)
        cpu_matmul_many(c, 3, in_w + 1, x, n, in_y + 1);
    cpu_parallel_rows(c, n, shared_swiglu_rows, &rj);
    cpu_prof_mark(c, CPU_STAGE_MOE_SHARED);
    cpu_matmul(c, &lw->shared_down, c->moe_gate, n, c->moe_y);
    cpu_prof_mark(c, CPU_STAGE_MOE_SHARED);
    cpu_parallel_rows(c, n, shared_add_rows, &rj);
    cpu_prof_mark(c, CPU_STAGE_MOE_SHARED_ADD);
}
