/* synthetic.c — random MLX 4-bit weights in memory for `lily bench --synthetic` (synthetic.h).
 *
 * Owns: the preset shapes, the tensor plan (names, shapes, bits, value scale), and the parallel fill.
 * Values come from a counter-based generator (splitmix64 of (seed, tensor, element)), so a model is the
 * same whatever the thread count. Scaling as tools/write_synthetic.py: dequantized weights are zero-mean
 * with std sigma = 1/sqrt(in_features) (codes uniform, so a group's scale is sigma / std(code) jittered
 * +-25% and its bias -mean(code) * scale), output projections also / sqrt(2 n_layers).
 */
#include "synthetic.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "base/dtype.h"
#include "base/file.h"

#define SYN_GROUP_SIZE 64

/* ---- presets ---------------------------------------------------------------------------------- */

static void preset_common(lily_config *c)
{
    memset(c, 0, sizeof *c);
    c->rms_norm_eps = 1e-6f;
    c->partial_rotary_factor = 0.25f;
    c->rope_theta = 1e7f;
    c->gdn_conv_kernel = 4;
    c->norm_topk_prob = true;
    c->quant_bits = 4;
    c->quant_group_size = SYN_GROUP_SIZE;
}

static void preset_layer_types(lily_config *c, int interval)
{
    for (int i = 0; i < c->n_layers; i++)
        c->layer_types[i] = (i + 1) % interval == 0 ? LILY_LAYER_FULL_ATTENTION : LILY_LAYER_LINEAR_ATTENTION;
}

lily_status lily_synthetic_preset(const char *name, lily_config *c, lily_error *err)
{
    if (!strcmp(name, "qwen3.6-35b-a3b") || !strcmp(name, "35b") || !strcmp(name, "qwen3.6-35b-a3b-4l")) {
        /* MODEL.md §1.2 */
        preset_common(c);
        c->vocab_size = 248320;
        c->hidden = 2048;
        c->n_layers = strcmp(name, "qwen3.6-35b-a3b-4l") ? 40 : 4;
        c->max_position_embeddings = 262144;
        c->n_heads = 16;
        c->n_kv_heads = 2;
        c->head_dim = 256;
        c->gdn_n_key_heads = 16;
        c->gdn_n_value_heads = 32;
        c->gdn_key_head_dim = 128;
        c->gdn_value_head_dim = 128;
        c->n_experts = 256;
        c->n_experts_used = 8;
        c->moe_intermediate = 512;
        c->shared_intermediate = 512;
        c->bos_token_id = 248044;
        c->stop_ids[0] = 248044;
        c->stop_ids[1] = 248046;
        c->n_stop_ids = 2;
    } else if (!strcmp(name, "small")) {
        /* a quarter-width 35B-A3B for CPU sweeps: same structure (3 GDN : 1 attention, GQA 4:1, 2 value
         * heads per key head, top-8 of many experts), ~90 MB in 4-bit */
        preset_common(c);
        c->vocab_size = 32768;
        c->hidden = 512;
        c->n_layers = 8;
        c->max_position_embeddings = 262144;
        c->n_heads = 8;
        c->n_kv_heads = 2;
        c->head_dim = 64;
        c->gdn_n_key_heads = 4;
        c->gdn_n_value_heads = 8;
        c->gdn_key_head_dim = 64;
        c->gdn_value_head_dim = 64;
        c->n_experts = 64;
        c->n_experts_used = 8;
        c->moe_intermediate = 128;
        c->shared_intermediate = 128;
        c->bos_token_id = -1;
        c->stop_ids[0] = 0;
        c->n_stop_ids = 1;
    } else if (!strcmp(name, "tiny-a")) {
        /* tests/data/tiny-a/manifest.json */
        preset_common(c);
        c->vocab_size = 512;
        c->hidden = 128;
        c->n_layers = 4;
        c->max_position_embeddings = 8192;
        c->n_heads = 8;
        c->n_kv_heads = 2;
        c->head_dim = 64;
        c->gdn_n_key_heads = 2;
        c->gdn_n_value_heads = 4;
        c->gdn_key_head_dim = 32;
        c->gdn_value_head_dim = 32;
        c->n_experts = 16;
        c->n_experts_used = 4;
        c->moe_intermediate = 64;
        c->shared_intermediate = 64;
        c->bos_token_id = -1;
        c->stop_ids[0] = 510;
        c->n_stop_ids = 1;
    } else {
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT,
                              "unknown synthetic model '%s' (presets: qwen3.6-35b-a3b, qwen3.6-35b-a3b-4l, small, tiny-a; "
                              "or a config.json path)",
                              name);
    }
    c->rotary_dim = (int)(c->head_dim * c->partial_rotary_factor);
    preset_layer_types(c, 4);
    return LILY_OK;
}

/* ---- the tensor plan -------------------------------------------------------------------------- */

typedef enum {
    FILL_QUANT,      /* U32 codes + bf16 scales/biases */
    FILL_NORM,       /* bf16 1 + 0.02 N(0,1) (norms hold 1 + w; the gated norm is plain and ~1 too) */
    FILL_CONV,       /* bf16 N(0, 1/K) */
    FILL_A_LOG,      /* f32 log U(1, 16) */
    FILL_DT_BIAS,    /* bf16 softplus^-1(dt), dt log-uniform in [1e-3, 1e-1] */
} fill_kind;

typedef struct {
    lily_tensor *t;
    fill_kind kind;
    int64_t n_experts, rows, cols; /* n_experts 0 for 2-D/1-D */
    int ndim;
    int bits;
    float sigma;
    size_t data_off, scales_off, biases_off; /* into the buffer */
    size_t data_bytes, scale_bytes;
} plan_entry;

typedef struct {
    plan_entry *e;
    int n, cap;
    size_t size;
    char *names;
    size_t names_used, names_cap;
} plan;

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

static const char *plan_name(plan *p, const char *fmt, int layer, const char *suffix)
{
    char buf[256];
    if (layer >= 0)
        snprintf(buf, sizeof buf, fmt, layer, suffix);
    else
        snprintf(buf, sizeof buf, fmt, suffix);
    size_t len = strlen(buf) + 1;
    if (p->names_used + len > p->names_cap)
        return NULL; /* sized generously by the caller; an overflow is a planning bug */
    char *dst = p->names + p->names_used;
    memcpy(dst, buf, len);
    p->names_used += len;
    return dst;
}

static void plan_add(plan *p, lily_tensor *t, const char *name, fill_kind kind, int64_t n_experts, int64_t rows,
                     int64_t cols, int ndim, int bits, float sigma)
{
    LILY_ASSERT(p->n < p->cap && name);
    plan_entry *e = &p->e[p->n++];
    memset(e, 0, sizeof *e);
    e->t = t;
    e->kind = kind;
    e->n_experts = n_experts;
    e->rows = rows;
    e->cols = cols;
    e->ndim = ndim;
    e->bits = bits;
    e->sigma = sigma;
    int64_t mats = n_experts > 0 ? n_experts : 1;
    if (kind == FILL_QUANT) {
        e->data_bytes = (size_t)(mats * rows * cols * bits / 8);
        e->scale_bytes = (size_t)(mats * rows * (cols / SYN_GROUP_SIZE) * 2);
    } else {
        e->data_bytes = (size_t)(mats * rows * cols) * (kind == FILL_A_LOG ? 4 : 2);
    }
    e->data_off = p->size;
    p->size = align64(p->size + e->data_bytes);
    if (kind == FILL_QUANT) {
        e->scales_off = p->size;
        p->size = align64(p->size + e->scale_bytes);
        e->biases_off = p->size;
        p->size = align64(p->size + e->scale_bytes);
    }

    memset(t, 0, sizeof *t);
    t->name = name;
    t->ndim = ndim;
    if (ndim == 3) {
        t->shape[0] = n_experts;
        t->shape[1] = rows;
        t->shape[2] = cols;
    } else if (ndim == 2) {
        t->shape[0] = rows;
        t->shape[1] = cols;
    } else {
        t->shape[0] = cols;
    }
    t->expert_stride = ndim == 1 ? 1 : rows;
    if (kind == FILL_QUANT) {
        t->dtype = LILY_DTYPE_U32;
        t->bits = bits;
        t->group_size = SYN_GROUP_SIZE;
        t->scale_dtype = LILY_DTYPE_BF16;
        t->row_bytes = cols * bits / 8;
        t->scale_row_bytes = (cols / SYN_GROUP_SIZE) * 2;
    } else {
        t->dtype = kind == FILL_A_LOG ? LILY_DTYPE_F32 : LILY_DTYPE_BF16;
        t->scale_dtype = LILY_DTYPE_UNKNOWN;
        t->row_bytes = cols * lily_dtype_size(t->dtype);
    }
}

#define PFX "language_model.model.layers.%d.%s"

static void plan_quant(plan *p, lily_tensor *t, int layer, const char *suffix, int64_t n_experts, int64_t rows,
                       int64_t cols, int bits, float sigma_mul)
{
    const char *name = layer >= 0 ? plan_name(p, PFX, layer, suffix) : plan_name(p, "%s", -1, suffix);
    plan_add(p, t, name, FILL_QUANT, n_experts, rows, cols, n_experts > 0 ? 3 : 2, bits,
             sigma_mul / sqrtf((float)cols));
}

static void plan_plain(plan *p, lily_tensor *t, int layer, const char *suffix, fill_kind kind, int64_t rows,
                       int64_t cols, int ndim)
{
    const char *name = layer >= 0 ? plan_name(p, PFX, layer, suffix) : plan_name(p, "%s", -1, suffix);
    plan_add(p, t, name, kind, 0, rows, cols, ndim, 0, 0.0f);
}

static void plan_model(plan *p, const lily_config *c, lily_weights *w)
{
    const int64_t H = c->hidden, E = c->n_experts;
    const int64_t conv_dim = lily_config_gdn_conv_dim(c), value_dim = lily_config_gdn_value_dim(c);
    const int64_t Hv = c->gdn_n_value_heads;
    const float out_mul = 1.0f / sqrtf(2.0f * (float)c->n_layers);

    plan_quant(p, &w->embed, -1, "language_model.model.embed_tokens.weight", 0, c->vocab_size, H, 4, 1.0f);
    for (int i = 0; i < c->n_layers; i++) {
        lily_layer_weights *L = &w->layers[i];
        plan_plain(p, &L->input_norm, i, "input_layernorm.weight", FILL_NORM, 1, H, 1);
        plan_plain(p, &L->post_attention_norm, i, "post_attention_layernorm.weight", FILL_NORM, 1, H, 1);
        if (c->layer_types[i] == LILY_LAYER_FULL_ATTENTION) {
            int64_t q_out = 2 * (int64_t)c->n_heads * c->head_dim, kv_out = (int64_t)c->n_kv_heads * c->head_dim;
            plan_quant(p, &L->q_proj, i, "self_attn.q_proj.weight", 0, q_out, H, 4, 1.0f);
            plan_quant(p, &L->k_proj, i, "self_attn.k_proj.weight", 0, kv_out, H, 4, 1.0f);
            plan_quant(p, &L->v_proj, i, "self_attn.v_proj.weight", 0, kv_out, H, 4, 1.0f);
            plan_quant(p, &L->o_proj, i, "self_attn.o_proj.weight", 0, H, (int64_t)c->n_heads * c->head_dim, 4,
                       out_mul);
            plan_plain(p, &L->q_norm, i, "self_attn.q_norm.weight", FILL_NORM, 1, c->head_dim, 1);
            plan_plain(p, &L->k_norm, i, "self_attn.k_norm.weight", FILL_NORM, 1, c->head_dim, 1);
        } else {
            plan_quant(p, &L->in_proj_qkv, i, "linear_attn.in_proj_qkv.weight", 0, conv_dim, H, 4, 1.0f);
            plan_quant(p, &L->in_proj_z, i, "linear_attn.in_proj_z.weight", 0, value_dim, H, 4, 1.0f);
            plan_quant(p, &L->in_proj_b, i, "linear_attn.in_proj_b.weight", 0, Hv, H, 4, 1.0f);
            plan_quant(p, &L->in_proj_a, i, "linear_attn.in_proj_a.weight", 0, Hv, H, 4, 1.0f);
            plan_quant(p, &L->out_proj, i, "linear_attn.out_proj.weight", 0, H, value_dim, 4, out_mul);
            plan_plain(p, &L->conv1d, i, "linear_attn.conv1d.weight", FILL_CONV, conv_dim, c->gdn_conv_kernel, 2);
            plan_plain(p, &L->A_log, i, "linear_attn.A_log", FILL_A_LOG, 1, Hv, 1);
            plan_plain(p, &L->dt_bias, i, "linear_attn.dt_bias", FILL_DT_BIAS, 1, Hv, 1);
            plan_plain(p, &L->gdn_norm, i, "linear_attn.norm.weight", FILL_NORM, 1, c->gdn_value_head_dim, 1);
        }
        plan_quant(p, &L->router, i, "mlp.gate.weight", 0, E, H, 8, 1.0f);
        plan_quant(p, &L->experts_gate, i, "mlp.switch_mlp.gate_proj.weight", E, c->moe_intermediate, H, 4, 1.0f);
        plan_quant(p, &L->experts_up, i, "mlp.switch_mlp.up_proj.weight", E, c->moe_intermediate, H, 4, 1.0f);
        plan_quant(p, &L->experts_down, i, "mlp.switch_mlp.down_proj.weight", E, H, c->moe_intermediate, 4, out_mul);
        plan_quant(p, &L->shared_gate, i, "mlp.shared_expert.gate_proj.weight", 0, c->shared_intermediate, H, 4, 1.0f);
        plan_quant(p, &L->shared_up, i, "mlp.shared_expert.up_proj.weight", 0, c->shared_intermediate, H, 4, 1.0f);
        plan_quant(p, &L->shared_down, i, "mlp.shared_expert.down_proj.weight", 0, H, c->shared_intermediate, 4,
                   out_mul);
        plan_quant(p, &L->shared_expert_gate, i, "mlp.shared_expert_gate.weight", 0, 1, H, 8, 1.0f);
    }
    plan_plain(p, &w->final_norm, -1, "language_model.model.norm.weight", FILL_NORM, 1, H, 1);
    plan_quant(p, &w->lm_head, -1, "language_model.lm_head.weight", 0, c->vocab_size, H, 4, 1.0f);
}

/* ---- the fill --------------------------------------------------------------------------------- */

static inline uint64_t splitmix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Element i of stream `key`: independent of how the work is split. */
static inline uint64_t stream_u64(uint64_t key, uint64_t i) { return splitmix64(key ^ (i * 0xd1b54a32d192ed03ull)); }
static inline float stream_uniform(uint64_t key, uint64_t i) { return (float)(stream_u64(key, i) >> 40) * 0x1p-24f; }
static inline float stream_normal(uint64_t key, uint64_t i)
{
    /* Box-Muller on two 32-bit halves */
    uint64_t r = stream_u64(key, i);
    float u1 = ((float)(r >> 40) + 0.5f) * 0x1p-24f, u2 = (float)((r >> 8) & 0xffffff) * 0x1p-24f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
}

typedef enum { PART_DATA, PART_SCALES_BIASES } fill_part;

typedef struct {
    int entry;
    fill_part part;
    size_t begin, end; /* in elements: u64 words for quantized data, groups for scales, values otherwise */
} fill_job;

typedef struct {
    const plan *p;
    uint8_t *buf;
    uint64_t seed;
    fill_job *jobs;
    int n_jobs;
    atomic_int next;
} fill_ctx;

static void fill_job_run(const fill_ctx *f, const fill_job *j)
{
    const plan_entry *e = &f->p->e[j->entry];
    uint64_t key = splitmix64(f->seed * 0x9e3779b97f4a7c15ull + (uint64_t)j->entry * 2 + (j->part == PART_SCALES_BIASES));
    uint8_t *data = f->buf + e->data_off;
    if (e->kind == FILL_QUANT && j->part == PART_DATA) {
        uint64_t *words = (uint64_t *)data;
        for (size_t i = j->begin; i < j->end; i++)
            words[i] = stream_u64(key, i);
        return;
    }
    if (e->kind == FILL_QUANT) {
        uint16_t *scales = (uint16_t *)(f->buf + e->scales_off), *biases = (uint16_t *)(f->buf + e->biases_off);
        float levels = (float)(1 << e->bits);
        float code_std = sqrtf((levels * levels - 1.0f) / 12.0f), code_mean = (levels - 1.0f) / 2.0f;
        for (size_t g = j->begin; g < j->end; g++) {
            float s = e->sigma / code_std * (0.75f + 0.5f * stream_uniform(key, g));
            uint16_t sb = lily_f32_to_bf16(s);
            scales[g] = sb;
            biases[g] = lily_f32_to_bf16(-code_mean * lily_bf16_to_f32(sb));
        }
        return;
    }
    for (size_t i = j->begin; i < j->end; i++) {
        switch (e->kind) {
        case FILL_NORM:
            ((uint16_t *)data)[i] = lily_f32_to_bf16(1.0f + 0.02f * stream_normal(key, i));
            break;
        case FILL_CONV:
            ((uint16_t *)data)[i] = lily_f32_to_bf16(stream_normal(key, i) / sqrtf((float)e->cols));
            break;
        case FILL_A_LOG:
            ((float *)data)[i] = logf(1.0f + 15.0f * stream_uniform(key, i));
            break;
        case FILL_DT_BIAS: {
            float dt = expf(logf(1e-3f) + (logf(1e-1f) - logf(1e-3f)) * stream_uniform(key, i));
            ((uint16_t *)data)[i] = lily_f32_to_bf16(logf(expm1f(dt)));
            break;
        }
        default:
            LILY_ASSERT(0);
        }
    }
}

static void *fill_worker(void *arg)
{
    fill_ctx *f = arg;
    for (;;) {
        int j = atomic_fetch_add(&f->next, 1);
        if (j >= f->n_jobs)
            return NULL;
        fill_job_run(f, &f->jobs[j]);
    }
}

#define FILL_JOB_ELEMENTS ((size_t)1 << 19) /* 4 MiB of packed words per job */

static lily_status fill_all(const plan *p, uint8_t *buf, uint64_t seed, int n_threads, lily_error *err)
{
    size_t n_jobs = 0;
    for (int pass = 0; pass < 2; pass++) {
        fill_job *jobs = NULL;
        if (pass == 1) {
            jobs = malloc(n_jobs * sizeof *jobs);
            if (!jobs)
                return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "synthetic: out of memory for %zu fill jobs", n_jobs);
        }
        size_t k = 0;
        for (int i = 0; i < p->n; i++) {
            const plan_entry *e = &p->e[i];
            size_t count = e->kind == FILL_QUANT ? e->data_bytes / 8 : e->data_bytes / (e->kind == FILL_A_LOG ? 4 : 2);
            for (int part = 0; part < (e->kind == FILL_QUANT ? 2 : 1); part++) {
                size_t total = part == 0 ? count : e->scale_bytes / 2;
                for (size_t b = 0; b < total; b += FILL_JOB_ELEMENTS) {
                    if (jobs)
                        jobs[k] = (fill_job){i, part ? PART_SCALES_BIASES : PART_DATA, b,
                                             LILY_MIN(total, b + FILL_JOB_ELEMENTS)};
                    k++;
                }
            }
        }
        if (pass == 0) {
            n_jobs = k;
            continue;
        }
        fill_ctx f = {.p = p, .buf = buf, .seed = seed, .jobs = jobs, .n_jobs = (int)n_jobs};
        atomic_init(&f.next, 0);
        if (n_threads <= 0) {
            long n = sysconf(_SC_NPROCESSORS_ONLN);
            n_threads = n > 0 ? (int)n : 1;
        }
        if (n_threads > 256)
            n_threads = 256;
        pthread_t th[256];
        int started = 0;
        for (; started < n_threads - 1; started++)
            if (pthread_create(&th[started], NULL, fill_worker, &f) != 0)
                break; /* the calling thread finishes the work alone */
        fill_worker(&f);
        for (int t = 0; t < started; t++)
            pthread_join(th[t], NULL);
        free(jobs);
    }
    return LILY_OK;
}

/* ---- public ----------------------------------------------------------------------------------- */

static lily_status config_from_spec(const char *spec, lily_config *cfg, lily_error *err)
{
    struct stat sb;
    if (stat(spec, &sb) != 0)
        return lily_synthetic_preset(spec, cfg, err);
    lily_status st;
    if (S_ISDIR(sb.st_mode)) {
        st = lily_config_load(spec, cfg, err);
    } else {
        char *text;
        size_t len;
        if ((st = lily_read_file(spec, 0, &text, &len, err)) != LILY_OK)
            return st;
        st = lily_config_parse(text, len, cfg, err);
        free(text);
        if (st != LILY_OK)
            lily_error_prefix(err, "%s", spec);
    }
    if (st == LILY_OK) {
        /* the synthetic weights are 4-bit whatever the config said */
        cfg->quant_bits = 4;
        cfg->quant_group_size = SYN_GROUP_SIZE;
    }
    return st;
}

lily_status lily_synthetic_new(const char *spec, uint64_t seed, int n_threads, lily_synthetic **out, lily_error *err)
{
    *out = NULL;
    lily_synthetic *s = calloc(1, sizeof *s);
    if (!s)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "synthetic: out of memory");
    snprintf(s->name, sizeof s->name, "%s", spec);
    lily_status st = config_from_spec(spec, &s->cfg, err);
    if (st != LILY_OK) {
        free(s);
        return st;
    }
    const lily_config *c = &s->cfg;
    if (c->hidden % SYN_GROUP_SIZE || c->moe_intermediate % SYN_GROUP_SIZE ||
        c->shared_intermediate % SYN_GROUP_SIZE || lily_config_gdn_value_dim(c) % SYN_GROUP_SIZE ||
        (c->n_heads * c->head_dim) % SYN_GROUP_SIZE) {
        free(s);
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT,
                              "synthetic '%s': every in_features (hidden, moe/shared intermediate, n_heads*head_dim, "
                              "GDN value dim) must be a multiple of the group size %d",
                              spec, SYN_GROUP_SIZE);
    }

    lily_weights *w = &s->weights;
    w->layout = LILY_LAYOUT_MLX;
    w->norms_zero_centred = false;
    w->quant_bits = 4;
    w->n_layers = c->n_layers;
    w->layers = calloc((size_t)c->n_layers, sizeof *w->layers);
    int cap = 4 + c->n_layers * 24;
    plan p = {.e = calloc((size_t)cap, sizeof(plan_entry)), .cap = cap, .names_cap = (size_t)cap * 96};
    s->names = p.names = malloc(p.names_cap);
    if (!w->layers || !p.e || !p.names) {
        free(p.e);
        lily_synthetic_free(s);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "synthetic: out of memory");
    }
    plan_model(&p, c, w);

    if (posix_memalign(&s->buffer, 64, p.size) != 0) {
        s->buffer = NULL;
        free(p.e);
        lily_synthetic_free(s);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "synthetic '%s': cannot allocate %.2f GB of weights", spec,
                              (double)p.size / 1e9);
    }
    s->buffer_size = p.size;
    uint8_t *buf = s->buffer;
    for (int i = 0; i < p.n; i++) {
        plan_entry *e = &p.e[i];
        e->t->data = buf + e->data_off;
        if (e->kind == FILL_QUANT) {
            e->t->scales = buf + e->scales_off;
            e->t->biases = buf + e->biases_off;
        }
    }
    st = fill_all(&p, buf, seed, n_threads, err);
    free(p.e);
    if (st != LILY_OK) {
        lily_synthetic_free(s);
        return st;
    }
    *out = s;
    return LILY_OK;
}

void lily_synthetic_free(lily_synthetic *s)
{
    if (!s)
        return;
    free(s->weights.layers);
    free(s->buffer);
    free(s->names);
    free(s);
}
