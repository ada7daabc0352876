/* cpu_backend.c — the CPU backend (backend.h), exact mode: fp32 activations, weights dequantized
 * exactly, fp32 KV cache and recurrent state (MODEL.md §4, §6).
 *
 * Owns: create/destroy (small weights made fp32 once, scratch sized by max_chunk), the session state
 * (new/free/reset/position/copy/save/restore) and forward(): embedding, the per-layer loop, final norm,
 * LM head, and the debug hook after every stage. The stages live in attention.c, gated_deltanet.c,
 * moe.c, norm_rope.c and matmul.c.
 */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cpu_internal.h"

/* ---- create / destroy ---------------------------------------------------------------------- */

/* n floats of a vector (or flat small matrix) tensor, widened; +1 in fp32 when zero_centred. */
static float *load_vector(const lily_tensor *t, int64_t n, bool zero_centred, bool *ok)
{
    float *v = malloc((size_t)n * sizeof(float));
    if (!v) {
        *ok = false;
        return NULL;
    }
    for (int64_t i = 0; i < n; i++)
        v[i] = lily_load_f32(t->data, t->dtype, i) + (zero_centred ? 1.0f : 0.0f);
    return v;
}

/* n floats, zeroed, on a 64-byte cache line boundary: threads that write neighbouring column blocks of a row
 * (per head, per value-column block) share no line at a block edge that is a multiple of 16 floats. */
static void *alloc_floats(int64_t n, bool *ok)
{
    const size_t bytes = ((size_t)(n > 0 ? n : 1) * sizeof(float) + 63) / 64 * 64;
    void *p = aligned_alloc(64, bytes);
    if (!p)
        *ok = false;
    else
        memset(p, 0, bytes);
    return p;
}

/* bytes on a 64-byte line boundary (not zeroed), NULL when out of memory: the quantized activations, whose rows
 * the tile kernels load */
static void *alloc_lines(size_t bytes)
{
    return aligned_alloc(64, (bytes > 0 ? bytes + 63 : 64) / 64 * 64);
}

static void cpu_destroy(void *ctx)
{
    cpu_ctx *c = ctx;
    if (!c)
        return;
    lily_threadpool_destroy(c->pool);
    free(c->prof);
    if (c->layers) {
        for (int l = 0; l < c->cfg->n_layers; l++) {
            cpu_layer_params *p = &c->layers[l];
            free(p->input_norm); free(p->post_attention_norm); free(p->q_norm); free(p->k_norm);
            free(p->conv1d); free(p->neg_exp_A); free(p->dt_bias); free(p->gdn_norm);
        }
        free(c->layers);
    }
    void *bufs[] = {c->final_norm, c->rope_inv_freq, c->hidden, c->normed, c->mixer_out, c->moe_out, c->attn_qg,
                    c->attn_q, c->attn_k, c->attn_v, c->attn_o, c->gdn_mixed, c->gdn_conv, c->gdn_z, c->gdn_b, c->gdn_a,
                    c->gdn_g, c->gdn_beta, c->gdn_o, c->gdn_chunk_scratch, c->router_probs, c->topk_ids,
                    c->topk_weights, c->expert_count, c->expert_offset, c->expert_rows, c->moe_x, c->moe_gate,
                    c->moe_up, c->moe_y, c->shared_gate_logit, c->qact.q, c->qact.r, c->qact.v, c->qact.d, c->qact.sum, c->qgsum, c->moe_active, c->moe_slot_row,
                    c->moe_qx.q, c->moe_qx.r, c->moe_qx.v, c->moe_qx.d, c->moe_qx.sum, c->moe_qh.q, c->moe_qh.r,
                    c->moe_qh.v, c->moe_qh.d, c->moe_qh.sum, c->moe_gsum, c->moe_h, c->moe_u, c->moe_yk};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    free(c);
}

static lily_status cpu_create(const lily_config *cfg, const lily_weights *w, const lily_backend_options *opts,
                              void **out, lily_error *err)
{
    *out = NULL;
    if (opts->max_chunk < 1)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cpu backend: max_chunk must be >= 1 (got %d)",
                              opts->max_chunk);
    const int widest = LILY_MAX(LILY_MAX(cfg->hidden, cfg->n_heads * cfg->head_dim),
                                LILY_MAX(lily_config_gdn_value_dim(cfg), LILY_MAX(cfg->moe_intermediate, cfg->shared_intermediate)));
    if (widest > CPU_MATMUL_MAX_COLS)
        return lily_error_set(err, LILY_ERR_UNSUPPORTED, "cpu backend: a linear layer with %d inputs (at most %d)", widest,
                              CPU_MATMUL_MAX_COLS);
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cpu backend: out of memory");
    c->cfg = cfg;
    c->w = w;
    c->max_chunk = opts->max_chunk;
    c->matmul_inputs_f16 = opts->cpu_matmul_inputs_f16;
    c->exact = opts->exact;
    c->qdot = cpu_qdot_best();
    c->debug_hook = opts->debug_hook;
    c->debug_user = opts->debug_user;
    c->deltanet_chunked = opts->deltanet_chunked;
    if (opts->profile && !(c->prof = calloc(1, sizeof *c->prof))) {
        cpu_destroy(c);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cpu backend: out of memory");
    }
    lily_status st = lily_threadpool_create(opts->n_threads, &c->pool, err);
    if (st != LILY_OK) {
        cpu_destroy(c);
        return st;
    }
    c->n_threads = lily_threadpool_size(c->pool);

    const int64_t mc = opts->max_chunk, H = cfg->hidden, hd = cfg->head_dim;
    const int Hv = cfg->gdn_n_value_heads, dv = cfg->gdn_value_head_dim, K = cfg->gdn_conv_kernel;
    const int64_t conv_dim = lily_config_gdn_conv_dim(cfg), value_dim = lily_config_gdn_value_dim(cfg);
    const bool zc = w->norms_zero_centred;
    bool ok = true;

    c->layers = calloc((size_t)cfg->n_layers, sizeof *c->layers);
    ok = c->layers != NULL;
    for (int l = 0; ok && l < cfg->n_layers; l++) {
        const lily_layer_weights *lw = &w->layers[l];
        cpu_layer_params *p = &c->layers[l];
        p->input_norm = load_vector(&lw->input_norm, H, zc, &ok);
        p->post_attention_norm = load_vector(&lw->post_attention_norm, H, zc, &ok);
        if (cfg->layer_types[l] == LILY_LAYER_FULL_ATTENTION) {
            p->q_norm = load_vector(&lw->q_norm, hd, zc, &ok);
            p->k_norm = load_vector(&lw->k_norm, hd, zc, &ok);
        } else {
            p->conv1d = load_vector(&lw->conv1d, conv_dim * K, false, &ok);
            p->neg_exp_A = load_vector(&lw->A_log, Hv, false, &ok);
            for (int h = 0; ok && h < Hv; h++)
                p->neg_exp_A[h] = -expf(p->neg_exp_A[h]);
            p->dt_bias = load_vector(&lw->dt_bias, Hv, false, &ok);
            p->gdn_norm = load_vector(&lw->gdn_norm, dv, false, &ok);
        }
    }
    if (ok)
        c->final_norm = load_vector(&w->final_norm, H, zc, &ok);
    c->rope_inv_freq = alloc_floats(cfg->rotary_dim / 2, &ok);
    if (ok)
        cpu_rope_inv_freq(cfg->rotary_dim, cfg->rope_theta, c->rope_inv_freq);

    const int64_t q_dim = (int64_t)cfg->n_heads * hd, kv_dim = (int64_t)cfg->n_kv_heads * hd;
    const int64_t inter = LILY_MAX(cfg->moe_intermediate, cfg->shared_intermediate);
    c->hidden = alloc_floats(mc * H, &ok);
    c->normed = alloc_floats(mc * H, &ok);
    c->mixer_out = alloc_floats(mc * H, &ok);
    c->moe_out = alloc_floats(mc * H, &ok);
    c->attn_qg = alloc_floats(mc * 2 * q_dim, &ok);
    c->attn_q = alloc_floats(mc * q_dim, &ok);
    c->attn_k = alloc_floats(mc * kv_dim, &ok);
    c->attn_v = alloc_floats(mc * kv_dim, &ok);
    c->attn_o = alloc_floats(mc * q_dim, &ok);
    c->gdn_mixed = alloc_floats(mc * conv_dim, &ok);
    c->gdn_conv = alloc_floats(mc * conv_dim, &ok);
    c->gdn_z = alloc_floats(mc * value_dim, &ok);
    c->gdn_b = alloc_floats(mc * Hv, &ok);
    c->gdn_a = alloc_floats(mc * Hv, &ok);
    c->gdn_g = alloc_floats(mc * Hv, &ok);
    c->gdn_beta = alloc_floats(mc * Hv, &ok);
    c->gdn_o = alloc_floats(mc * value_dim, &ok);
    cpu_gdn_dims dims = {cfg->gdn_n_key_heads, Hv, cfg->gdn_key_head_dim, dv};
    c->gdn_chunk_scratch_floats = cpu_gdn_chunk_scratch_floats(&dims);
    c->gdn_chunk_scratch = alloc_floats(c->n_threads * c->gdn_chunk_scratch_floats, &ok);
    c->router_probs = alloc_floats(mc * cfg->n_experts, &ok);
    c->topk_ids = calloc((size_t)(mc * cfg->n_experts_used), sizeof(int));
    c->topk_weights = alloc_floats(mc * cfg->n_experts_used, &ok);
    c->expert_count = calloc((size_t)cfg->n_experts, sizeof(int));
    c->expert_offset = calloc((size_t)cfg->n_experts + 1, sizeof(int));
    c->expert_rows = calloc((size_t)(mc * cfg->n_experts_used), sizeof(int));
    c->moe_x = alloc_floats(mc * H, &ok);
    c->moe_gate = alloc_floats(mc * inter, &ok);
    c->moe_up = alloc_floats(mc * inter, &ok);
    c->moe_y = alloc_floats(mc * H, &ok);
    c->shared_gate_logit = alloc_floats(mc, &ok);
    if (!c->exact) {
        const int64_t qcols = (widest + CPU_QBLOCK - 1) / CPU_QBLOCK * CPU_QBLOCK;
        c->qact.q = alloc_lines((size_t)(mc * qcols));
        c->qact.r = alloc_lines((size_t)(mc * qcols));
        c->qact.v = alloc_lines((size_t)(mc * qcols) * sizeof(int16_t));
        c->qact.d = alloc_floats(mc * qcols / CPU_QBLOCK, &ok);
        c->qact.sum = alloc_floats(mc * qcols / CPU_QBLOCK, &ok);
        c->qgsum = alloc_floats(mc * qcols / CPU_QBLOCK, &ok);
        ok = ok && c->qact.q && c->qact.r && c->qact.v;
        const int64_t mk = mc * cfg->n_experts_used, mi = cfg->moe_intermediate;
        const int64_t gcols = LILY_MAX(H, mi);
        c->moe_active = calloc((size_t)cfg->n_experts, sizeof(int));
        c->moe_slot_row = calloc((size_t)mk, sizeof(int));
        c->moe_qx = (cpu_qact){alloc_lines((size_t)(mk * H)), alloc_lines((size_t)(mk * H)), alloc_floats(mk * H / CPU_QBLOCK, &ok),
                               alloc_floats(mk * H / CPU_QBLOCK, &ok), H,
                               alloc_lines((size_t)(mk * H) * sizeof(int16_t))};
        c->moe_qh = (cpu_qact){alloc_lines((size_t)(mk * mi)), alloc_lines((size_t)(mk * mi)),
                               alloc_floats(mk * mi / CPU_QBLOCK, &ok), alloc_floats(mk * mi / CPU_QBLOCK, &ok), mi,
                               alloc_lines((size_t)(mk * mi) * sizeof(int16_t))};
        c->moe_gsum = alloc_floats(mk * gcols / CPU_QBLOCK, &ok);
        c->moe_h = alloc_floats(mk * mi, &ok);
        c->moe_u = alloc_floats(mk * mi, &ok);
        c->moe_yk = alloc_floats(mk * H, &ok);
        ok = ok && c->moe_active && c->moe_slot_row && c->moe_qx.q && c->moe_qx.r && c->moe_qx.v && c->moe_qh.q &&
             c->moe_qh.r && c->moe_qh.v;
    }
    if (!ok || !c->topk_ids || !c->expert_count || !c->expert_offset || !c->expert_rows) {
        cpu_destroy(c);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cpu backend: out of memory for %d-token scratch",
                              opts->max_chunk);
    }
    *out = c;
    return LILY_OK;
}

/* ---- session state ------------------------------------------------------------------------- */

static int64_t kv_floats_per_token(const lily_config *cfg) { return (int64_t)cfg->n_kv_heads * cfg->head_dim; }
static int64_t conv_state_floats(const lily_config *cfg)
{
    return (int64_t)(cfg->gdn_conv_kernel - 1) * lily_config_gdn_conv_dim(cfg);
}
static int64_t recurrent_state_floats(const lily_config *cfg)
{
    return (int64_t)cfg->gdn_n_value_heads * cfg->gdn_key_head_dim * cfg->gdn_value_head_dim;
}

static void cpu_state_free(void *ctx, void *state)
{
    cpu_ctx *c = ctx;
    cpu_state *s = state;
    if (!s)
        return;
    for (int l = 0; l < c->cfg->n_layers; l++) {
        if (s->k_cache) free(s->k_cache[l]);
        if (s->v_cache) free(s->v_cache[l]);
        if (s->conv_state) free(s->conv_state[l]);
        if (s->recurrent_state) free(s->recurrent_state[l]);
    }
    free(s->k_cache);
    free(s->v_cache);
    free(s->conv_state);
    free(s->recurrent_state);
    free(s->attn_scores);
    free(s->attn_dec_scores);
    free(s->attn_dec_part);
    free(s->attn_dec_done);
    free(s->attn_pre_part);
    free(s->attn_pre_scores);
    free(s);
}

static lily_status cpu_state_new(void *ctx, int max_ctx, void **out, lily_error *err)
{
    cpu_ctx *c = ctx;
    const lily_config *cfg = c->cfg;
    *out = NULL;
    if (max_ctx < 1)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cpu backend: max_ctx must be >= 1 (got %d)", max_ctx);
    cpu_state *s = calloc(1, sizeof *s);
    if (!s)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cpu backend: out of memory for the session state");
    s->max_ctx = max_ctx;
    const size_t L = (size_t)cfg->n_layers;
    s->k_cache = calloc(L, sizeof(float *));
    s->v_cache = calloc(L, sizeof(float *));
    s->conv_state = calloc(L, sizeof(float *));
    s->recurrent_state = calloc(L, sizeof(float *));
    bool ok = s->k_cache && s->v_cache && s->conv_state && s->recurrent_state;
    for (int l = 0; ok && l < cfg->n_layers; l++) {
        if (cfg->layer_types[l] == LILY_LAYER_FULL_ATTENTION) {
            s->k_cache[l] = alloc_floats((int64_t)max_ctx * kv_floats_per_token(cfg), &ok);
            s->v_cache[l] = alloc_floats((int64_t)max_ctx * kv_floats_per_token(cfg), &ok);
        } else {
            s->conv_state[l] = alloc_floats(conv_state_floats(cfg), &ok);
            s->recurrent_state[l] = alloc_floats(recurrent_state_floats(cfg), &ok);
        }
    }
    if (ok)
        s->attn_scores = alloc_floats((int64_t)c->n_threads * max_ctx, &ok);
    if (ok && !c->exact && cpu_attention_fast_ok(cfg->head_dim)) {
        s->attn_dec_scores = alloc_floats((int64_t)cfg->n_heads * max_ctx, &ok);
        s->attn_dec_part = alloc_floats((int64_t)cfg->n_heads * CPU_ATTN_DECODE_MAX_CHUNKS * CPU_ATTN_DECODE_PART(cfg->head_dim), &ok);
        s->attn_dec_done = calloc((size_t)(cfg->n_heads > 0 ? cfg->n_heads : 1), sizeof(int));
        const int group = cfg->n_heads / (cfg->n_kv_heads > 0 ? cfg->n_kv_heads : 1);
        int longest = 0;
        cpu_attention_decode_split(max_ctx, cfg->head_dim, &longest);
        s->attn_pre_scores_stride = longest;
        s->attn_pre_part = alloc_floats((int64_t)c->n_threads * group * CPU_ATTN_DECODE_MAX_CHUNKS *
                                            CPU_ATTN_DECODE_PART(cfg->head_dim), &ok);
        s->attn_pre_scores = alloc_floats((int64_t)c->n_threads * group * longest, &ok);
        ok = ok && s->attn_dec_done;
    }
    if (!ok) {
        cpu_state_free(c, s);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cpu backend: out of memory for a %d-token state", max_ctx);
    }
    *out = s;
    return LILY_OK;
}

static void cpu_state_reset(void *ctx, void *state)
{
    cpu_ctx *c = ctx;
    cpu_state *s = state;
    s->position = 0;
    for (int l = 0; l < c->cfg->n_layers; l++) {
        if (s->conv_state[l])
            memset(s->conv_state[l], 0, (size_t)conv_state_floats(c->cfg) * sizeof(float));
        if (s->recurrent_state[l])
            memset(s->recurrent_state[l], 0, (size_t)recurrent_state_floats(c->cfg) * sizeof(float));
    }
}

static int cpu_state_position(void *ctx, void *state)
{
    (void)ctx;
    return ((cpu_state *)state)->position;
}

/* Visit every piece of state in a fixed order: fn(user, ptr, bytes) for KV rows [0, position), conv and
 * recurrent states, layer by layer. Save, restore and copy all walk this order. */
typedef void (*state_visit_fn)(void *user, float *data, size_t bytes);
static void visit_state(const cpu_ctx *c, const cpu_state *s, int position, state_visit_fn fn, void *user)
{
    const lily_config *cfg = c->cfg;
    for (int l = 0; l < cfg->n_layers; l++) {
        if (cfg->layer_types[l] == LILY_LAYER_FULL_ATTENTION) {
            const size_t kv = (size_t)position * kv_floats_per_token(cfg) * sizeof(float);
            fn(user, s->k_cache[l], kv);
            fn(user, s->v_cache[l], kv);
        } else {
            fn(user, s->conv_state[l], (size_t)conv_state_floats(cfg) * sizeof(float));
            fn(user, s->recurrent_state[l], (size_t)recurrent_state_floats(cfg) * sizeof(float));
        }
    }
}

#define STATE_MAGIC "LILYCPU1"
typedef struct {
    char magic[8];
    int32_t position;
    int32_t n_layers;
    int32_t kv_floats_per_token;
    int32_t conv_state_floats;
    int32_t recurrent_state_floats;
    int32_t reserved;
} state_header;

static size_t state_size_at(const cpu_ctx *c, int position)
{
    const lily_config *cfg = c->cfg;
    size_t size = sizeof(state_header);
    for (int l = 0; l < cfg->n_layers; l++)
        size += cfg->layer_types[l] == LILY_LAYER_FULL_ATTENTION
                    ? 2 * (size_t)position * kv_floats_per_token(cfg) * sizeof(float)
                    : (size_t)(conv_state_floats(cfg) + recurrent_state_floats(cfg)) * sizeof(float);
    return size;
}

static size_t cpu_state_save_size(void *ctx, const void *state)
{
    return state_size_at(ctx, ((const cpu_state *)state)->position);
}

typedef struct {
    uint8_t *cursor;
} byte_cursor;
static void visit_save(void *user, float *data, size_t bytes)
{
    byte_cursor *bc = user;
    if (bytes)
        memcpy(bc->cursor, data, bytes);
    bc->cursor += bytes;
}
static void visit_restore(void *user, float *data, size_t bytes)
{
    byte_cursor *bc = user;
    if (bytes)
        memcpy(data, bc->cursor, bytes);
    bc->cursor += bytes;
}

static state_header make_header(const cpu_ctx *c, int position)
{
    state_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, STATE_MAGIC, 8);
    h.position = position;
    h.n_layers = c->cfg->n_layers;
    h.kv_floats_per_token = (int32_t)kv_floats_per_token(c->cfg);
    h.conv_state_floats = (int32_t)conv_state_floats(c->cfg);
    h.recurrent_state_floats = (int32_t)recurrent_state_floats(c->cfg);
    return h;
}

static lily_status cpu_state_save(void *ctx, const void *state, void *buf, size_t size, lily_error *err)
{
    const cpu_ctx *c = ctx;
    const cpu_state *s = state;
    const size_t need = state_size_at(c, s->position);
    if (size < need)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cpu state save: buffer of %zu bytes, need %zu", size,
                              need);
    state_header h = make_header(c, s->position);
    memcpy(buf, &h, sizeof h);
    byte_cursor bc = {(uint8_t *)buf + sizeof h};
    visit_state(c, s, s->position, visit_save, &bc);
    return LILY_OK;
}

static lily_status cpu_state_restore(void *ctx, void *state, const void *buf, size_t size, lily_error *err)
{
    const cpu_ctx *c = ctx;
    cpu_state *s = state;
    state_header h;
    if (size < sizeof h)
        return lily_error_set(err, LILY_ERR_FORMAT, "cpu state restore: %zu bytes is too short for a header", size);
    memcpy(&h, buf, sizeof h);
    state_header want = make_header(c, h.position);
    if (memcmp(&h, &want, sizeof h) != 0 || h.position < 0)
        return lily_error_set(err, LILY_ERR_FORMAT, "cpu state restore: the snapshot is not of this model's CPU state");
    if (h.position > s->max_ctx)
        return lily_error_set(err, LILY_ERR_CONTEXT_LENGTH,
                              "cpu state restore: the snapshot holds %d tokens, the state only %d", h.position,
                              s->max_ctx);
    if (size != state_size_at(c, h.position))
        return lily_error_set(err, LILY_ERR_FORMAT, "cpu state restore: %zu bytes, expected %zu", size,
                              state_size_at(c, h.position));
    byte_cursor bc = {(uint8_t *)buf + sizeof h};
    visit_state(c, s, h.position, visit_restore, &bc);
    s->position = h.position;
    return LILY_OK;
}

/* state_copy: first collect the destination's buffers in visit order, then copy the source's into them. */
typedef struct {
    float **dst_ptrs;
    int i;
} copy_walk;
static void visit_collect(void *user, float *data, size_t bytes)
{
    (void)bytes;
    copy_walk *cw = user;
    cw->dst_ptrs[cw->i++] = data;
}
static void visit_copy(void *user, float *data, size_t bytes)
{
    copy_walk *cw = user;
    float *dst = cw->dst_ptrs[cw->i++];
    if (bytes)
        memcpy(dst, data, bytes);
}

static lily_status cpu_state_copy(void *ctx, void *dst_state, const void *src_state, lily_error *err)
{
    const cpu_ctx *c = ctx;
    cpu_state *dst = dst_state;
    const cpu_state *src = src_state;
    if (dst == src)
        return LILY_OK;
    if (src->position > dst->max_ctx)
        return lily_error_set(err, LILY_ERR_CONTEXT_LENGTH, "cpu state copy: source holds %d tokens, destination only %d",
                              src->position, dst->max_ctx);
    float *ptrs[2 * LILY_MAX_LAYERS];
    copy_walk collect = {ptrs, 0}, apply = {ptrs, 0};
    visit_state(c, dst, 0, visit_collect, &collect);
    visit_state(c, src, src->position, visit_copy, &apply);
    dst->position = src->position;
    return LILY_OK;
}

/* ---- the state in parts (backend.h's optional split-state ops; host memory only) ------------------ */

/* KV rows of a position: per attention layer, K then V, kv_floats_per_token floats each. */
static size_t cpu_kv_row_bytes(void *ctx)
{
    const cpu_ctx *c = ctx;
    size_t n = 0;
    for (int l = 0; l < c->cfg->n_layers; l++)
        if (c->cfg->layer_types[l] == LILY_LAYER_FULL_ATTENTION)
            n += 2 * (size_t)kv_floats_per_token(c->cfg) * sizeof(float);
    return n;
}

/* Rows [row0, row0 + n) of every attention layer's K and V to (save) or from buf, in that order. */
static lily_status kv_transfer(const cpu_ctx *c, const cpu_state *s, int row0, int n, int limit, lily_state_loc loc,
                               bool save, lily_error *err)
{
    if (!loc.host)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cpu backend: state parts live in host memory only");
    if (row0 < 0 || n < 0 || (int64_t)row0 + n > limit)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cpu backend: KV rows [%d, %d) outside [0, %d)", row0,
                              row0 + n, limit);
    const int64_t kvt = kv_floats_per_token(c->cfg);
    const size_t bytes = (size_t)n * kvt * sizeof(float);
    uint8_t *p = loc.host;
    for (int l = 0; l < c->cfg->n_layers; l++) {
        if (c->cfg->layer_types[l] != LILY_LAYER_FULL_ATTENTION)
            continue;
        float *rows[2] = {s->k_cache[l] + (int64_t)row0 * kvt, s->v_cache[l] + (int64_t)row0 * kvt};
        for (int i = 0; i < 2; i++, p += bytes) {
            if (!bytes)
                continue;
            if (save)
                memcpy(p, rows[i], bytes);
            else
                memcpy(rows[i], p, bytes);
        }
    }
    return LILY_OK;
}

static lily_status cpu_kv_save(void *ctx, const void *state, int row0, int n, lily_state_loc loc, lily_error *err)
{
    const cpu_state *s = state;
    return kv_transfer(ctx, s, row0, n, s->position, loc, true, err);
}

static lily_status cpu_kv_load(void *ctx, void *state, int row0, int n, lily_state_loc loc, lily_error *err)
{
    const cpu_state *s = state;
    return kv_transfer(ctx, s, row0, n, s->max_ctx, loc, false, err);
}

/* The recurrent part: a state_header (its position field the saved position), then per Gated DeltaNet
 * layer the conv state and the recurrent state. */
static size_t cpu_recurrent_bytes(void *ctx)
{
    const cpu_ctx *c = ctx;
    return state_size_at(c, 0);
}

static lily_status cpu_recurrent_save(void *ctx, const void *state, lily_state_loc loc, lily_error *err)
{
    const cpu_ctx *c = ctx;
    const cpu_state *s = state;
    if (!loc.host)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cpu backend: state parts live in host memory only");
    state_header h = make_header(c, s->position);
    memcpy(loc.host, &h, sizeof h);
    byte_cursor bc = {(uint8_t *)loc.host + sizeof h};
    visit_state(c, s, 0, visit_save, &bc); /* position 0: no KV rows, only the DeltaNet states */
    return LILY_OK;
}

static lily_status cpu_recurrent_load(void *ctx, void *state, lily_state_loc loc, lily_error *err)
{
    const cpu_ctx *c = ctx;
    cpu_state *s = state;
    if (!loc.host)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cpu backend: state parts live in host memory only");
    state_header h;
    memcpy(&h, loc.host, sizeof h);
    state_header want = make_header(c, h.position);
    if (memcmp(&h, &want, sizeof h) != 0 || h.position < 0)
        return lily_error_set(err, LILY_ERR_FORMAT, "cpu state restore: not this model's CPU recurrent state");
    if (h.position > s->max_ctx)
        return lily_error_set(err, LILY_ERR_CONTEXT_LENGTH,
                              "cpu state restore: the snapshot holds %d tokens, the state only %d", h.position,
                              s->max_ctx);
    byte_cursor bc = {(uint8_t *)loc.host + sizeof h};
    visit_state(c, s, 0, visit_restore, &bc);
    s->position = h.position;
    return LILY_OK;
}

/* ---- forward ------------------------------------------------------------------------------- */

static void hook(const cpu_ctx *c, int layer, const char *stage, const float *data, int n, int width)
{
    if (c->debug_hook)
        c->debug_hook(c->debug_user, layer, stage, data, n, width);
}

static lily_status cpu_forward(void *ctx, void *state, const int32_t *tokens, int n, lily_logits_mode mode,
                               float *logits, lily_error *err)
{
    cpu_ctx *c = ctx;
    cpu_state *st = state;
    const lily_config *cfg = c->cfg;
    const int H = cfg->hidden;
    if (n < 1 || n > c->max_chunk)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cpu forward: %d tokens, must be 1..%d", n, c->max_chunk);
    if ((int64_t)st->position + n > st->max_ctx)
        return lily_error_set(err, LILY_ERR_CONTEXT_LENGTH,
                              "context length exceeded: %d tokens held + %d new > context size %d", st->position, n,
                              st->max_ctx);
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= cfg->vocab_size)
            return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "token id %d (at %d) is outside the vocabulary [0, %d)",
                                  tokens[t], t, cfg->vocab_size);
    if (mode != LILY_LOGITS_NONE && !logits)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cpu forward: logits requested into a NULL buffer");

    if (c->prof)
        cpu_prof_forward_begin(c->prof);
    cpu_embed_rows(c, tokens, n);
    cpu_prof_mark(c, CPU_STAGE_EMBED);
    hook(c, -1, LILY_STAGE_EMBED, c->hidden, n, H);

    /* each residual add is fused with the RMSNorm after it (the next layer's input norm, the final norm) */
    cpu_add_rmsnorm_rows(c, c->hidden, NULL, cfg->n_layers > 0 ? c->layers[0].input_norm : c->final_norm, n, H,
                         cfg->rms_norm_eps, c->normed);
    cpu_prof_mark(c, CPU_STAGE_NORM);
    for (int l = 0; l < cfg->n_layers; l++) {
        const cpu_layer_params *p = &c->layers[l];
        hook(c, l, LILY_STAGE_ATTN_NORM, c->normed, n, H);
        if (cfg->layer_types[l] == LILY_LAYER_FULL_ATTENTION) {
            cpu_attention_forward(c, l, st, c->normed, n, c->mixer_out);
            hook(c, l, LILY_STAGE_ATTENTION_OUT, c->mixer_out, n, H);
        } else {
            cpu_gdn_forward(c, l, st, c->normed, n, c->mixer_out);
            hook(c, l, LILY_STAGE_DELTANET_OUT, c->mixer_out, n, H);
        }
        cpu_add_rmsnorm_rows(c, c->hidden, c->mixer_out, p->post_attention_norm, n, H, cfg->rms_norm_eps, c->normed);
        cpu_prof_mark(c, CPU_STAGE_NORM);
        hook(c, l, LILY_STAGE_MOE_NORM, c->normed, n, H);
        cpu_moe_forward(c, l, c->normed, n, c->moe_out);
        hook(c, l, LILY_STAGE_MOE_OUT, c->moe_out, n, H);
        const float *next_norm = l + 1 < cfg->n_layers ? c->layers[l + 1].input_norm : c->final_norm;
        cpu_add_rmsnorm_rows(c, c->hidden, c->moe_out, next_norm, n, H, cfg->rms_norm_eps, c->normed);
        cpu_prof_mark(c, CPU_STAGE_NORM);
        hook(c, l, LILY_STAGE_RESIDUAL, c->hidden, n, H);
    }
    st->position += n;

    hook(c, -1, LILY_STAGE_FINAL_NORM, c->normed, n, H);
    if (mode == LILY_LOGITS_ALL) {
        cpu_matmul(c, &c->w->lm_head, c->normed, n, logits);
        cpu_prof_mark(c, CPU_STAGE_LM_HEAD);
        hook(c, -1, LILY_STAGE_LOGITS, logits, n, cfg->vocab_size);
    } else if (mode == LILY_LOGITS_LAST) {
        cpu_matmul(c, &c->w->lm_head, c->normed + (int64_t)(n - 1) * H, 1, logits);
        cpu_prof_mark(c, CPU_STAGE_LM_HEAD);
        hook(c, -1, LILY_STAGE_LOGITS, logits, 1, cfg->vocab_size);
    }
    if (c->prof)
        cpu_prof_forward_end(c->prof);
    return LILY_OK;
}

const lily_backend_ops lily_cpu_backend_ops = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .state_new = cpu_state_new,
    .state_free = cpu_state_free,
    .state_reset = cpu_state_reset,
    .state_position = cpu_state_position,
    .state_copy = cpu_state_copy,
    .state_save_size = cpu_state_save_size,
    .state_save = cpu_state_save,
    .state_restore = cpu_state_restore,
    .forward = cpu_forward,
    .kv_row_bytes = cpu_kv_row_bytes,
    .kv_save = cpu_kv_save,
    .kv_load = cpu_kv_load,
    .recurrent_bytes = cpu_recurrent_bytes,
    .recurrent_save = cpu_recurrent_save,
    .recurrent_load = cpu_recurrent_load,
    .profile_take = cpu_profile_take,
    /* device_pool_new / device_pool_free: NULL (checkpoints stay in host memory); decode_loop: NULL (the
     * host sampler decodes) */
};
