/* attention.c — CPU gated full attention of one layer (MODEL.md §4.3), exact mode.
 *
 * Owns: the split of q_proj into per-head query and gate, q/k RMSNorm, RoPE, the append to the fp32
 * KV cache, causal softmax attention with GQA (query head h reads KV head h / (n_heads / n_kv_heads)),
 * the sigmoid output gate. The projections are matmul.c's; the cache memory is the state's; fast mode's
 * per-head softmax attention (and its decode split over KV heads and chunks of keys) is attention_fast.c's.
 */
#include <math.h>
#include <string.h>

#include "base/base.h"
#include "cpu_internal.h"

typedef struct {
    const cpu_ctx *c;
    const cpu_state *st;
    const float *k_cache, *v_cache; /* [max_ctx, n_kv_heads * head_dim] */
    int n, pos0;
    int n_chunks, chunk_len; /* fast-mode decode's split of the keys (cpu_attention_decode_split) */
    int n_hblocks, hblock_len; /* and of each KV head's query heads */
    int n_tblocks, tblock_len; /* prefill: each head's tokens in blocks */
} attention_job;

/* The output gate: o[i] *= sigmoid(gate[i]), gate the second half of the head's q_proj block. */
static void apply_gate(float *o, const float *gate, int hd)
{
    for (int i = 0; i < hd; i++)
        o[i] *= cpu_sigmoid(gate[i]);
}

static void decode_merge_head(const attention_job *j, int head);

/* Fast-mode decode, one task = one chunk of keys of one KV head, for a block of its query heads (all of
 * them unless the chunks are too few to keep the threads busy; the heads' results do not depend on the
 * blocks); the block's last chunk to finish also merges and gates its heads: one pass over the pool. */
static void decode_chunk_task(void *arg, int task, int thread)
{
    (void)thread;
    const attention_job *j = arg;
    const lily_config *cfg = j->c->cfg;
    const int hd = cfg->head_dim, group = cfg->n_heads / cfg->n_kv_heads;
    const int kv_dim = cfg->n_kv_heads * hd;
    const int hblock = task % j->n_hblocks, chunk = task / j->n_hblocks % j->n_chunks;
    const int kv_head = task / j->n_hblocks / j->n_chunks;
    const int key0 = chunk * j->chunk_len;
    const int n_keys = j->pos0 + 1 - key0 < j->chunk_len ? j->pos0 + 1 - key0 : j->chunk_len;
    const int g0 = hblock * j->hblock_len;
    const int n_g = group - g0 < j->hblock_len ? group - g0 : j->hblock_len;
    const int64_t part = CPU_ATTN_DECODE_PART(hd);
    const int head0 = kv_head * group + g0;
    cpu_attention_decode_chunk(j->c->attn_q + (int64_t)head0 * hd, n_g, j->k_cache + (int64_t)kv_head * hd,
                               j->v_cache + (int64_t)kv_head * hd, kv_dim, key0, n_keys, hd, 1.0f / sqrtf((float)hd),
                               j->st->attn_dec_scores + (int64_t)head0 * j->st->max_ctx + key0, j->st->max_ctx,
                               j->st->attn_dec_part + ((int64_t)head0 * CPU_ATTN_DECODE_MAX_CHUNKS + chunk) * part,
                               CPU_ATTN_DECODE_MAX_CHUNKS * part);
    /* the last of the block's chunks to finish merges them (in chunk order, whichever thread it is) */
    int *done = &j->st->attn_dec_done[kv_head * j->n_hblocks + hblock];
    if (j->n_chunks == 1 || __atomic_add_fetch(done, 1, __ATOMIC_ACQ_REL) == j->n_chunks)
        for (int g = 0; g < n_g; g++)
            decode_merge_head(j, head0 + g);
}

/* Fast-mode decode, one query head once all its chunks are done: merge them, then the output gate. */
static void decode_merge_head(const attention_job *j, int head)
{
    const int hd = j->c->cfg->head_dim;
    const int64_t part = CPU_ATTN_DECODE_PART(hd);
    float *o = j->c->attn_o + (int64_t)head * hd;
    cpu_attention_decode_merge(j->st->attn_dec_part + (int64_t)head * CPU_ATTN_DECODE_MAX_CHUNKS * part, part, j->n_chunks,
                               hd, o);
    apply_gate(o, j->c->attn_qg + (int64_t)head * 2 * hd + hd, hd);
}

void cpu_attention_head_exact(const float *q, int q_stride, const float *k_cache, const float *v_cache, int kv_stride,
                              int n, int pos0, int hd, float scale, float *scores, float *o, int o_stride)
{
    for (int t = 0; t < n; t++) {
        const float *qt = q + (int64_t)t * q_stride;
        const int n_keys = pos0 + t + 1; /* causal: keys 0 .. pos0 + t */
        float max_score = -INFINITY;
        for (int s = 0; s < n_keys; s++) {
            const float *k = k_cache + (int64_t)s * kv_stride;
            float dotv = 0;
            for (int i = 0; i < hd; i++)
                dotv += qt[i] * k[i];
            scores[s] = dotv * scale;
            if (scores[s] > max_score)
                max_score = scores[s];
        }
        float sum = 0;
        for (int s = 0; s < n_keys; s++) {
            scores[s] = expf(scores[s] - max_score);
            sum += scores[s];
        }
        const float inv_sum = 1.0f / sum;
        float *ot = o + (int64_t)t * o_stride;
        memset(ot, 0, (size_t)hd * sizeof(float));
        for (int s = 0; s < n_keys; s++) {
            const float p = scores[s] * inv_sum;
            const float *v = v_cache + (int64_t)s * kv_stride;
            for (int i = 0; i < hd; i++)
                ot[i] += p * v[i];
        }
    }
}

/* Prefill in fast mode: one task = the query heads of one KV head over one block of tokens (each token's
 * output depends on its own query only; the heads share each K and V row), the blocks of the last tokens,
 * which see the most keys, first. */
static void attention_group_task(void *arg, int task, int thread)
{
    const attention_job *j = arg;
    const lily_config *cfg = j->c->cfg;
    const int nkv = cfg->n_kv_heads, group = cfg->n_heads / nkv, hd = cfg->head_dim;
    const int kv_head = task % nkv, tb = j->n_tblocks - 1 - task / nkv;
    const int t0 = tb * j->tblock_len, nt = LILY_MIN(j->tblock_len, j->n - t0);
    const int q_dim = cfg->n_heads * hd, head0 = kv_head * group;
    const cpu_state *st = j->st;
    float *o = j->c->attn_o + (int64_t)t0 * q_dim + (int64_t)head0 * hd;
    cpu_attention_group_fast(j->c->attn_q + (int64_t)t0 * q_dim + (int64_t)head0 * hd, q_dim, group,
                             j->k_cache + (int64_t)kv_head * hd, j->v_cache + (int64_t)kv_head * hd, nkv * hd, nt,
                             j->pos0 + t0, hd, 1.0f / sqrtf((float)hd),
                             st->attn_pre_scores + (int64_t)thread * group * st->attn_pre_scores_stride,
                             st->attn_pre_scores_stride,
                             st->attn_pre_part + (int64_t)thread * group * CPU_ATTN_DECODE_MAX_CHUNKS * CPU_ATTN_DECODE_PART(hd),
                             o, q_dim);
    for (int t = t0; t < t0 + nt; t++)
        for (int g = 0; g < group; g++)
            apply_gate(j->c->attn_o + (int64_t)t * q_dim + (int64_t)(head0 + g) * hd,
                       j->c->attn_qg + (int64_t)t * 2 * q_dim + (int64_t)(head0 + g) * 2 * hd + hd, hd);
}

/* Exact mode: one task = one query head over one block of tokens, the last blocks first. */
static void attention_head_task(void *arg, int task, int thread)
{
    const attention_job *j = arg;
    const int head = task % j->c->cfg->n_heads, tb = j->n_tblocks - 1 - task / j->c->cfg->n_heads;
    const int t0 = tb * j->tblock_len, nt = LILY_MIN(j->tblock_len, j->n - t0);
    const lily_config *cfg = j->c->cfg;
    const int hd = cfg->head_dim;
    const int kv_dim = cfg->n_kv_heads * hd;
    const int q_dim = cfg->n_heads * hd;
    const int kv_head = head / (cfg->n_heads / cfg->n_kv_heads);
    const float scale = 1.0f / sqrtf((float)hd);
    float *scores = j->st->attn_scores + (int64_t)thread * j->st->max_ctx;
    const float *q = j->c->attn_q + (int64_t)t0 * q_dim + (int64_t)head * hd;
    float *o = j->c->attn_o + (int64_t)t0 * q_dim + (int64_t)head * hd;
    cpu_attention_head_exact(q, q_dim, j->k_cache + (int64_t)kv_head * hd, j->v_cache + (int64_t)kv_head * hd, kv_dim, nt,
                             j->pos0 + t0, hd, scale, scores, o, q_dim);
    for (int t = t0; t < t0 + nt; t++)
        apply_gate(j->c->attn_o + (int64_t)t * q_dim + (int64_t)head * hd,
                   j->c->attn_qg + (int64_t)t * 2 * q_dim + (int64_t)head * 2 * hd + hd, hd);
}

typedef struct {
    const cpu_ctx *c;
    const cpu_layer_params *lp;
    float *k_cache, *v_cache;
    int pos0;
} prep_job;

/* Tokens [t0, t1): the per-head split of q_proj's output into [query(hd), gate(hd)], q_norm / k_norm per head
 * over head_dim, RoPE, and k, v appended to the cache. */
static void prep_rows(void *arg, int t0, int t1)
{
    const prep_job *j = arg;
    const cpu_ctx *c = j->c;
    const lily_config *cfg = c->cfg;
    const int hd = cfg->head_dim, nh = cfg->n_heads, nkv = cfg->n_kv_heads;
    const int q_dim = nh * hd, kv_dim = nkv * hd, n = t1 - t0;
    for (int t = t0; t < t1; t++)
        for (int h = 0; h < nh; h++)
            memcpy(c->attn_q + (int64_t)t * q_dim + (int64_t)h * hd, c->attn_qg + (int64_t)t * 2 * q_dim + (int64_t)h * 2 * hd,
                   (size_t)hd * sizeof(float));
    float *q = c->attn_q + (int64_t)t0 * q_dim, *k = c->attn_k + (int64_t)t0 * kv_dim;
    cpu_rmsnorm(q, j->lp->q_norm, n * nh, hd, cfg->rms_norm_eps, q);
    cpu_rmsnorm(k, j->lp->k_norm, n * nkv, hd, cfg->rms_norm_eps, k);
    cpu_rope(q, n, q_dim, nh, hd, cfg->rotary_dim, j->pos0 + t0, c->rope_inv_freq);
    cpu_rope(k, n, kv_dim, nkv, hd, cfg->rotary_dim, j->pos0 + t0, c->rope_inv_freq);
    memcpy(j->k_cache + (int64_t)(j->pos0 + t0) * kv_dim, k, (size_t)n * kv_dim * sizeof(float));
    memcpy(j->v_cache + (int64_t)(j->pos0 + t0) * kv_dim, c->attn_v + (int64_t)t0 * kv_dim,
           (size_t)n * kv_dim * sizeof(float));
}

void cpu_attention_forward(cpu_ctx *c, int layer, cpu_state *st, const float *x, int n, float *out)
{
    const lily_config *cfg = c->cfg;
    const lily_layer_weights *lw = &c->w->layers[layer];
    const cpu_layer_params *lp = &c->layers[layer];
    const int hd = cfg->head_dim, nh = cfg->n_heads, nkv = cfg->n_kv_heads;
    const int pos0 = st->position;

    const lily_tensor *in_w[] = {&lw->q_proj, &lw->k_proj, &lw->v_proj};
    float *const in_y[] = {c->attn_qg, c->attn_k, c->attn_v};
    cpu_matmul_many(c, 3, in_w, x, n, in_y);
    cpu_prof_mark(c, CPU_STAGE_ATTN_IN_PROJ);

    float *k_cache = st->k_cache[layer], *v_cache = st->v_cache[layer];
    prep_job pj = {c, lp, k_cache, v_cache, pos0};
    cpu_parallel_rows(c, n, prep_rows, &pj);
    cpu_prof_mark(c, CPU_STAGE_ATTN_PREP);

    attention_job job = {c, st, k_cache, v_cache, n, pos0, 0, 0, 1, nh / nkv, 1, n};
    if (n == 1 && st->attn_dec_part) { /* fast-mode decode: per (KV head, chunk of keys, heads), then per head */
        job.n_chunks = cpu_attention_decode_split(pos0 + 1, hd, &job.chunk_len);
        /* too few chunks for two tasks per thread: the heads of a KV head in blocks too */
        const int want = 2 * c->n_threads, have = nkv * job.n_chunks;
        if (have < want) {
            const int blocks = LILY_MIN((want + have - 1) / have, nh / nkv);
            job.hblock_len = (nh / nkv + blocks - 1) / blocks;
            job.n_hblocks = (nh / nkv + job.hblock_len - 1) / job.hblock_len;
        }
        memset(st->attn_dec_done, 0, (size_t)(nkv * job.n_hblocks) * sizeof(int));
        parallel_for(c->pool, nkv * job.n_chunks * job.n_hblocks, decode_chunk_task, &job);
    } else {
        /* tasks of a KV head's query heads (fast mode) or of one head, over blocks of tokens: about 4 tasks
         * per thread (a token's cost grows with its position), blocks of at least 8 tokens */
        const bool grouped = st->attn_pre_part != NULL;
        const int units = grouped ? nkv : nh;
        const int blocks = LILY_MAX(1, LILY_MIN((4 * c->n_threads + units - 1) / units, (n + 7) / 8));
        job.tblock_len = (n + blocks - 1) / blocks;
        job.n_tblocks = (n + job.tblock_len - 1) / job.tblock_len;
        parallel_for(c->pool, units * job.n_tblocks, grouped ? attention_group_task : attention_head_task, &job);
    }
    cpu_prof_mark(c, CPU_STAGE_ATTN_CORE);

    cpu_matmul(c, &lw->o_proj, c->attn_o, n, out);
    cpu_prof_mark(c, CPU_STAGE_ATTN_O_PROJ);
}
