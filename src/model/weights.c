/* weights.c — bind the decoder's tensors from an opened checkpoint (MODEL.md §2).
 *
 * Owns: layout detection (HF `model.language_model.` / `model.` names, MLX `language_model.model.`
 * names, MLX affine triplets found by their `.scales` sibling, norm convention from the conv1d shape),
 * the expected shape of every tensor from the config, the checks that name the tensor with the expected
 * and actual shape/dtype, HF fused gate_up_proj views and per-expert stacking into owned buffers.
 * Does not own: the mapping (safetensors.c) or dequantization (quant.c).
 */
#include "weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

/* A buffer made at bind time, kept on a list in lily_weights.owned. */
typedef struct owned_block {
    struct owned_block *next;
    void *data;
} owned_block;

static void *owned_alloc(lily_weights *w, size_t size)
{
    owned_block *b = malloc(sizeof *b);
    if (!b)
        return NULL;
    b->data = aligned_alloc(64, (size + 63) / 64 * 64);
    if (!b->data) {
        free(b);
        return NULL;
    }
    b->next = w->owned;
    w->owned = b;
    return b->data;
}

static char *owned_strdup(lily_weights *w, const char *s)
{
    char *p = owned_alloc(w, strlen(s) + 1);
    if (p)
        memcpy(p, s, strlen(s) + 1);
    return p;
}

void lily_weights_free(lily_weights *w)
{
    if (!w)
        return;
    for (owned_block *b = w->owned, *next; b; b = next) {
        next = b->next;
        free(b->data);
        free(b);
    }
    free(w->layers);
    memset(w, 0, sizeof *w);
}

int64_t lily_tensor_bytes_per_matrix(const lily_tensor *t)
{
    if (!t->data)
        return 0;
    int64_t rows = lily_tensor_rows(t);
    return rows * t->row_bytes + (t->bits ? 2 * rows * t->scale_row_bytes : 0);
}

/* --- non-finite values ---------------------------------------------------------------------------- */

/* Element i of p as its bits: memcpy, since a tensor need not be aligned to its element size (MLX writes the
 * safetensors header unpadded, so the data section starts at any byte). */
static inline uint32_t bits32_at(const uint8_t *p, int64_t i)
{
    uint32_t v;
    memcpy(&v, p + 4 * i, 4);
    return v;
}

static inline uint16_t bits16_at(const uint8_t *p, int64_t i)
{
    uint16_t v;
    memcpy(&v, p + 2 * i, 2);
    return v;
}

/* Index of the first NaN or infinity among n elements of float dtype t at p (any alignment), or -1. A NaN or
 * infinity has every exponent bit set: 0x7f80 (BF16), 0x7c00 (F16), 0x7f800000 (F32). The loop ORs a block's
 * flags before looking for the index, so the common all-finite case is one compare per element. */
static int64_t first_non_finite(const void *data, lily_dtype t, int64_t n)
{
    const uint8_t *p = data;
    const int64_t block = 4096;
    for (int64_t i0 = 0; i0 < n; i0 += block) {
        const int64_t i1 = n - i0 < block ? n : i0 + block;
        int any = 0;
        if (t == LILY_DTYPE_F32) {
            for (int64_t i = i0; i < i1; i++)
                any |= (bits32_at(p, i) & 0x7f800000u) == 0x7f800000u;
        } else {
            const uint16_t e = t == LILY_DTYPE_BF16 ? 0x7f80 : 0x7c00;
            for (int64_t i = i0; i < i1; i++)
                any |= (bits16_at(p, i) & e) == e;
        }
        if (!any)
            continue;
        for (int64_t i = i0; i < i1; i++) {
            const int bad = t == LILY_DTYPE_F32 ? (bits32_at(p, i) & 0x7f800000u) == 0x7f800000u
                            : t == LILY_DTYPE_BF16 ? (bits16_at(p, i) & 0x7f80) == 0x7f80
                                                   : (bits16_at(p, i) & 0x7c00) == 0x7c00;
            if (bad)
                return i;
        }
    }
    return -1;
}

/* LILY_ERR_MODEL naming `name` (with `suffix` in place of a trailing ".weight" when suffix is not NULL)
 * when one of the n elements of dtype t at p is a NaN or an infinity. */
static lily_status check_finite(const char *name, const char *suffix, const void *p, lily_dtype t, int64_t n,
                                lily_error *err)
{
    const int64_t at = first_non_finite(p, t, n);
    if (at < 0)
        return LILY_OK;
    size_t len = strlen(name);
    if (suffix && len > 7 && !strcmp(name + len - 7, ".weight"))
        len -= 7;
    return lily_error_set(err, LILY_ERR_MODEL,
                          "%.*s%s: element %lld of %lld is not finite (NaN or infinity): the checkpoint is corrupt",
                          (int)len, name, suffix ? suffix : "", (long long)at, (long long)n);
}

/* Every float value t holds: a plain tensor's elements, or a quantized one's scales and biases (the packed
 * codes are integers). Physical rows of a 3-D view run to (n_experts - 1) * expert_stride + rows. */
static lily_status tensor_check_finite(const lily_tensor *t, lily_error *err)
{
    if (!t->data)
        return LILY_OK;
    const int64_t rows = lily_tensor_rows(t);
    const int64_t phys_rows = t->ndim == 3 ? (t->shape[0] - 1) * t->expert_stride + rows : rows;
    if (!t->bits)
        return check_finite(t->name, NULL, t->data, t->dtype, phys_rows * lily_tensor_cols(t), err);
    const int64_t n = phys_rows * (t->scale_row_bytes / lily_dtype_size(t->scale_dtype));
    lily_status st = check_finite(t->name, ".scales", t->scales, t->scale_dtype, n, err);
    if (st == LILY_OK)
        st = check_finite(t->name, ".biases", t->biases, t->scale_dtype, n, err);
    return st;
}

/* Every tensor of w, once (a tied lm_head is the embedding). */
static lily_status weights_check_finite(const lily_weights *w, lily_error *err)
{
    lily_status st = tensor_check_finite(&w->embed, err);
    if (st == LILY_OK)
        st = tensor_check_finite(&w->final_norm, err);
    if (st == LILY_OK && w->lm_head.data != w->embed.data)
        st = tensor_check_finite(&w->lm_head, err);
    for (int i = 0; i < w->n_layers && st == LILY_OK; i++) {
        const lily_layer_weights *L = &w->layers[i];
        const lily_tensor *all[] = {&L->input_norm, &L->post_attention_norm, &L->q_proj, &L->k_proj, &L->v_proj,
                                    &L->o_proj, &L->q_norm, &L->k_norm, &L->in_proj_qkv, &L->in_proj_z,
                                    &L->in_proj_b, &L->in_proj_a, &L->conv1d, &L->dt_bias, &L->A_log,
                                    &L->gdn_norm, &L->out_proj, &L->router, &L->experts_gate, &L->experts_up,
                                    &L->experts_down, &L->shared_gate, &L->shared_up, &L->shared_down,
                                    &L->shared_expert_gate};
        _Static_assert(sizeof all / sizeof *all == sizeof(lily_layer_weights) / sizeof(lily_tensor),
                       "a layer tensor missing from the non-finite check");
        for (size_t k = 0; k < sizeof all / sizeof *all && st == LILY_OK; k++)
            st = tensor_check_finite(all[k], err);
    }
    return st;
}

/* --- binding context ----------------------------------------------------------------------------- */

typedef struct {
    const lily_config *cfg;
    const lily_checkpoint *ckpt;
    lily_weights *w;
    lily_error *err;
    const char *prefix;    /* "model.language_model.", "model." or "language_model.model." */
    const char *lm_head;   /* "lm_head" or "language_model.lm_head" (no .weight) */
    char name[1024];       /* scratch */
} binder;

static bool is_float(lily_dtype t)
{
    return t == LILY_DTYPE_F32 || t == LILY_DTYPE_F16 || t == LILY_DTYPE_BF16;
}

static void shape_str(char *buf, size_t size, int ndim, const int64_t *shape)
{
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < ndim && n < size; d++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", d ? "," : "", (long long)shape[d]);
    if (n < size)
        snprintf(buf + n, size - n, "]");
}

static lily_status mismatch(binder *b, const char *name, int ndim, const int64_t *expected, const char *expected_dtype,
                            const lily_st_tensor *found)
{
    char e[128], f[128];
    shape_str(e, sizeof e, ndim, expected);
    shape_str(f, sizeof f, found->ndim, found->shape);
    return lily_error_set(b->err, LILY_ERR_MODEL, "%s: expected %s %s, found %s %s", name, e, expected_dtype, f,
                          lily_dtype_name(found->dtype));
}

static const lily_st_tensor *find(binder *b, const char *name)
{
    return lily_checkpoint_find(b->ckpt, name);
}

static lily_status missing(binder *b, const char *name, const char *what)
{
    return lily_error_set(b->err, LILY_ERR_MODEL, "%s: missing tensor (%s)", name, what);
}

static bool shape_is(const lily_st_tensor *t, int ndim, const int64_t *shape)
{
    if (t->ndim != ndim)
        return false;
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] != shape[d])
            return false;
    return true;
}

/* Fill the plain-tensor fields of out from st with logical shape [ndim, shape]. */
static void set_plain(lily_tensor *out, const lily_st_tensor *st, int ndim, const int64_t *shape)
{
    memset(out, 0, sizeof *out);
    out->name = st->name;
    out->data = st->data;
    out->dtype = st->dtype;
    out->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        out->shape[d] = shape[d];
    out->row_bytes = shape[ndim - 1] * lily_dtype_size(st->dtype);
    out->expert_stride = ndim == 1 ? 1 : shape[ndim - 2];
    out->scale_dtype = LILY_DTYPE_UNKNOWN;
}

/* A plain float tensor `name` of exactly the given shape. */
static lily_status bind_plain(binder *b, const char *name, int ndim, const int64_t *shape, const char *what,
                              lily_tensor *out)
{
    const lily_st_tensor *st = find(b, name);
    if (!st)
        return missing(b, name, what);
    if (!is_float(st->dtype) || !shape_is(st, ndim, shape))
        return mismatch(b, name, ndim, shape, "BF16|F16|F32", st);
    set_plain(out, st, ndim, shape);
    return LILY_OK;
}

static lily_status bind_vector(binder *b, const char *suffix, int64_t n, const char *what, lily_tensor *out)
{
    snprintf(b->name, sizeof b->name, "%s%s", b->prefix, suffix);
    return bind_plain(b, b->name, 1, &n, what, out);
}

/* A linear weight, [rows, cols] or [n_experts, rows, cols] when n_experts > 0, stored at `base`.weight:
 * plain, or MLX affine when `base`.scales exists (bits and group_size inferred from the shapes with the
 * known cols, MODEL.md §2.3). */
static lily_status bind_linear(binder *b, const char *base, int64_t n_experts, int64_t rows, int64_t cols,
                               const char *what, lily_tensor *out)
{
    char wname[600], sname[600], bname[600];
    snprintf(wname, sizeof wname, "%s.weight", base);
    snprintf(sname, sizeof sname, "%s.scales", base);
    snprintf(bname, sizeof bname, "%s.biases", base);
    int ndim = n_experts > 0 ? 3 : 2;
    int64_t shape[3];
    if (n_experts > 0) {
        shape[0] = n_experts;
        shape[1] = rows;
        shape[2] = cols;
    } else {
        shape[0] = rows;
        shape[1] = cols;
    }
    const lily_st_tensor *scales = find(b, sname);
    if (!scales)
        return bind_plain(b, wname, ndim, shape, what, out);

    const lily_st_tensor *wt = find(b, wname), *biases = find(b, bname);
    if (!wt)
        return missing(b, wname, what);
    if (!biases)
        return lily_error_set(b->err, LILY_ERR_UNSUPPORTED,
                              "%s: quantized (has .scales) but no %s: only MLX affine quantization is supported",
                              wname, bname);
    /* expected packed shape at the common widths, for the message */
    int64_t e4[3], e8[3];
    memcpy(e4, shape, sizeof e4);
    memcpy(e8, shape, sizeof e8);
    e4[ndim - 1] = cols * 4 / 32;
    e8[ndim - 1] = cols * 8 / 32;
    bool lead_ok = wt->ndim == ndim && wt->dtype == LILY_DTYPE_U32;
    for (int d = 0; lead_ok && d < ndim - 1; d++)
        lead_ok = wt->shape[d] == shape[d];
    if (!lead_ok || wt->shape[ndim - 1] <= 0) {
        char ex4[128], ex8[128], f[128];
        shape_str(ex4, sizeof ex4, ndim, e4);
        shape_str(ex8, sizeof ex8, ndim, e8);
        shape_str(f, sizeof f, wt->ndim, wt->shape);
        return lily_error_set(b->err, LILY_ERR_MODEL, "%s: expected %s U32 (4-bit) or %s U32 (8-bit), found %s %s",
                              wname, ex4, ex8, f, lily_dtype_name(wt->dtype));
    }
    int64_t packed = wt->shape[ndim - 1];
    if ((32 * packed) % cols != 0) {
        char ex4[128], f[128];
        shape_str(ex4, sizeof ex4, ndim, e4);
        shape_str(f, sizeof f, wt->ndim, wt->shape);
        return lily_error_set(b->err, LILY_ERR_MODEL,
                              "%s: expected %s U32 (4-bit), found %s U32: %lld packed words do not hold %lld columns at a "
                              "whole number of bits",
                              wname, ex4, f, (long long)packed, (long long)cols);
    }
    int bits = (int)(32 * packed / cols);
    if (bits != 4 && bits != 8)
        return lily_error_set(b->err, LILY_ERR_UNSUPPORTED, "%s: %d-bit weights are not supported (only 4 and 8 bits)",
                              wname, bits);

    /* scales and biases: same leading dims, cols / group_size columns, one float dtype */
    if (!is_float(scales->dtype) || scales->ndim != ndim || scales->shape[ndim - 1] <= 0 ||
        cols % scales->shape[ndim - 1] != 0) {
        int64_t es[3];
        memcpy(es, shape, sizeof es);
        es[ndim - 1] = cols / 64;
        return mismatch(b, sname, ndim, es, "BF16|F16|F32", scales);
    }
    int64_t group_size = cols / scales->shape[ndim - 1];
    int64_t es[3];
    memcpy(es, shape, sizeof es);
    es[ndim - 1] = scales->shape[ndim - 1];
    if (!shape_is(scales, ndim, es))
        return mismatch(b, sname, ndim, es, lily_dtype_name(scales->dtype), scales);
    if (!shape_is(biases, ndim, es) || biases->dtype != scales->dtype)
        return mismatch(b, bname, ndim, es, lily_dtype_name(scales->dtype), biases);
    if ((group_size * bits) % 32 != 0)
        return lily_error_set(b->err, LILY_ERR_UNSUPPORTED,
                              "%s: group size %lld at %d bits does not start every group on a 32-bit word", wname,
                              (long long)group_size, bits);

    memset(out, 0, sizeof *out);
    out->name = wt->name;
    out->data = wt->data;
    out->dtype = LILY_DTYPE_U32;
    out->ndim = ndim;
    memcpy(out->shape, shape, sizeof shape);
    out->bits = bits;
    out->group_size = (int)group_size;
    out->scales = scales->data;
    out->biases = biases->data;
    out->scale_dtype = scales->dtype;
    out->expert_stride = rows;
    out->row_bytes = packed * 4;
    out->scale_row_bytes = es[ndim - 1] * lily_dtype_size(scales->dtype);
    return LILY_OK;
}

/* HF per-expert tensors `prefix`mlp.experts.{e}.`proj`.weight, each [rows, cols], stacked into one owned
 * [n_experts, rows, cols] buffer (MODEL.md §2.2: the MTP head, and possibly other re-saves). */
static lily_status stack_experts(binder *b, const char *layer_prefix, const char *proj, int64_t rows, int64_t cols,
                                 lily_tensor *out)
{
    int64_t n_experts = b->cfg->n_experts;
    int64_t shape[2] = {rows, cols};
    const lily_st_tensor *first = NULL;
    char *data = NULL;
    size_t matrix_bytes = 0;
    for (int64_t e = 0; e < n_experts; e++) {
        snprintf(b->name, sizeof b->name, "%smlp.experts.%lld.%s.weight", layer_prefix, (long long)e, proj);
        const lily_st_tensor *st = find(b, b->name);
        if (!st)
            return missing(b, b->name, "per-expert MoE weight");
        if (!is_float(st->dtype) || !shape_is(st, 2, shape) || (first && st->dtype != first->dtype))
            return mismatch(b, b->name, 2, shape, first ? lily_dtype_name(first->dtype) : "BF16|F16|F32", st);
        if (!first) {
            first = st;
            matrix_bytes = (size_t)st->nbytes;
            data = owned_alloc(b->w, matrix_bytes * (size_t)n_experts);
            if (!data)
                return lily_error_set(b->err, LILY_ERR_OUT_OF_MEMORY, "%s: out of memory stacking %lld experts",
                                      b->name, (long long)n_experts);
        }
        memcpy(data + (size_t)e * matrix_bytes, st->data, matrix_bytes);
    }
    snprintf(b->name, sizeof b->name, "%smlp.experts.*.%s.weight", layer_prefix, proj);
    int64_t shape3[3] = {n_experts, rows, cols};
    lily_st_tensor stacked = *first;
    stacked.data = data;
    set_plain(out, &stacked, 3, shape3);
    out->name = owned_strdup(b->w, b->name);
    if (!out->name)
        return lily_error_set(b->err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
    return LILY_OK;
}

/* The routed experts of one layer in whichever form the checkpoint has (MODEL.md §2.1-2.3). */
static lily_status bind_experts(binder *b, const char *lp, lily_layer_weights *L)
{
    const lily_config *c = b->cfg;
    int64_t E = c->n_experts, I = c->moe_intermediate, H = c->hidden;
    char base[512];
    lily_status st;

    /* MLX: switch_mlp.{gate,up,down}_proj, quantized or plain */
    snprintf(base, sizeof base, "%smlp.switch_mlp.gate_proj", lp);
    snprintf(b->name, sizeof b->name, "%s.weight", base);
    if (find(b, b->name)) {
        if ((st = bind_linear(b, base, E, I, H, "MoE expert gate_proj", &L->experts_gate)) != LILY_OK)
            return st;
        snprintf(base, sizeof base, "%smlp.switch_mlp.up_proj", lp);
        if ((st = bind_linear(b, base, E, I, H, "MoE expert up_proj", &L->experts_up)) != LILY_OK)
            return st;
        snprintf(base, sizeof base, "%smlp.switch_mlp.down_proj", lp);
        return bind_linear(b, base, E, H, I, "MoE expert down_proj", &L->experts_down);
    }

    /* HF fused: gate_up_proj [E, 2I, H] (gate = rows 0..I-1 of each expert, up = rows I..2I-1) */
    char gate_up[512];
    snprintf(gate_up, sizeof gate_up, "%smlp.experts.gate_up_proj", lp);
    const lily_st_tensor *fused = find(b, gate_up);
    if (fused) {
        int64_t shape[3] = {E, 2 * I, H};
        if (!is_float(fused->dtype) || !shape_is(fused, 3, shape))
            return mismatch(b, gate_up, 3, shape, "BF16|F16|F32", fused);
        int64_t gate_shape[3] = {E, I, H};
        set_plain(&L->experts_gate, fused, 3, gate_shape);
        L->experts_gate.expert_stride = 2 * I;
        L->experts_up = L->experts_gate;
        L->experts_up.data = (const char *)fused->data + I * L->experts_gate.row_bytes;
        snprintf(b->name, sizeof b->name, "%smlp.experts.down_proj", lp);
        int64_t down_shape[3] = {E, H, I};
        return bind_plain(b, b->name, 3, down_shape, "MoE expert down_proj", &L->experts_down);
    }

    /* HF per-expert */
    snprintf(b->name, sizeof b->name, "%smlp.experts.0.gate_proj.weight", lp);
    if (find(b, b->name)) {
        if ((st = stack_experts(b, lp, "gate_proj", I, H, &L->experts_gate)) != LILY_OK ||
            (st = stack_experts(b, lp, "up_proj", I, H, &L->experts_up)) != LILY_OK)
            return st;
        return stack_experts(b, lp, "down_proj", H, I, &L->experts_down);
    }
    if (!strncmp(b->prefix, "language_model.", 15)) {
        snprintf(b->name, sizeof b->name, "%smlp.switch_mlp.gate_proj.weight", lp);
        return missing(b, b->name, "MoE experts");
    }
    return missing(b, gate_up, "fused MoE experts; per-expert mlp.experts.0.gate_proj.weight not found either");
}

/* conv1d: HF [C,1,K] or MLX [C,K,1]; both are [C,K] in memory. Reports which one through *mlx_shape. */
static lily_status bind_conv1d(binder *b, const char *lp, lily_tensor *out, int *mlx_shape)
{
    const lily_config *c = b->cfg;
    int64_t C = lily_config_gdn_conv_dim(c), K = c->gdn_conv_kernel;
    snprintf(b->name, sizeof b->name, "%slinear_attn.conv1d.weight", lp);
    const lily_st_tensor *st = find(b, b->name);
    if (!st)
        return missing(b, b->name, "Gated DeltaNet depthwise conv");
    int64_t hf[3] = {C, 1, K}, mlx[3] = {C, K, 1};
    bool is_hf = shape_is(st, 3, hf), is_mlx = shape_is(st, 3, mlx);
    if (!is_float(st->dtype) || (!is_hf && !is_mlx)) {
        char e1[64], e2[64], f[128];
        shape_str(e1, sizeof e1, 3, hf);
        shape_str(e2, sizeof e2, 3, mlx);
        shape_str(f, sizeof f, st->ndim, st->shape);
        return lily_error_set(b->err, LILY_ERR_MODEL, "%s: expected %s or %s BF16|F16|F32, found %s %s", b->name, e1,
                              e2, f, lily_dtype_name(st->dtype));
    }
    int64_t shape[2] = {C, K};
    set_plain(out, st, 2, shape);
    *mlx_shape = K == 1 ? -1 : is_mlx; /* K == 1 cannot tell the layouts apart */
    return LILY_OK;
}

static lily_status bind_layer(binder *b, int i, lily_layer_weights *L, int *conv_mlx)
{
    const lily_config *c = b->cfg;
    int64_t H = c->hidden;
    char lp[256], base[512];
    snprintf(lp, sizeof lp, "%slayers.%d.", b->prefix, i);
    lily_status st;
#define VEC(field, suffix, n, what)                                                                        \
    do {                                                                                                   \
        snprintf(base, sizeof base, "layers.%d.%s", i, suffix);                                            \
        if ((st = bind_vector(b, base, n, what, &L->field)) != LILY_OK)                                    \
            return st;                                                                                     \
    } while (0)
#define LIN(field, suffix, rows, cols, what)                                                               \
    do {                                                                                                   \
        snprintf(base, sizeof base, "%s%s", lp, suffix);                                                   \
        if ((st = bind_linear(b, base, 0, rows, cols, what, &L->field)) != LILY_OK)                        \
            return st;                                                                                     \
    } while (0)

    VEC(input_norm, "input_layernorm.weight", H, "input RMSNorm");
    VEC(post_attention_norm, "post_attention_layernorm.weight", H, "post-attention RMSNorm");

    if (c->layer_types[i] == LILY_LAYER_FULL_ATTENTION) {
        int64_t q_dim = (int64_t)c->n_heads * c->head_dim, kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
        LIN(q_proj, "self_attn.q_proj", 2 * q_dim, H, "attention q_proj (query + gate per head)");
        LIN(k_proj, "self_attn.k_proj", kv_dim, H, "attention k_proj");
        LIN(v_proj, "self_attn.v_proj", kv_dim, H, "attention v_proj");
        LIN(o_proj, "self_attn.o_proj", H, q_dim, "attention o_proj");
        VEC(q_norm, "self_attn.q_norm.weight", c->head_dim, "attention q_norm");
        VEC(k_norm, "self_attn.k_norm.weight", c->head_dim, "attention k_norm");
    } else {
        int64_t value_dim = lily_config_gdn_value_dim(c), Hv = c->gdn_n_value_heads;
        LIN(in_proj_qkv, "linear_attn.in_proj_qkv", lily_config_gdn_conv_dim(c), H, "Gated DeltaNet in_proj_qkv");
        LIN(in_proj_z, "linear_attn.in_proj_z", value_dim, H, "Gated DeltaNet in_proj_z");
        LIN(in_proj_b, "linear_attn.in_proj_b", Hv, H, "Gated DeltaNet in_proj_b");
        LIN(in_proj_a, "linear_attn.in_proj_a", Hv, H, "Gated DeltaNet in_proj_a");
        int mlx_shape = -1;
        if ((st = bind_conv1d(b, lp, &L->conv1d, &mlx_shape)) != LILY_OK)
            return st;
        if (mlx_shape >= 0) {
            if (*conv_mlx >= 0 && *conv_mlx != mlx_shape)
                return lily_error_set(b->err, LILY_ERR_MODEL,
                                      "%s: conv1d layout differs from earlier layers (mixed HF [C,1,K] and MLX "
                                      "[C,K,1])",
                                      L->conv1d.name);
            *conv_mlx = mlx_shape;
        }
        VEC(dt_bias, "linear_attn.dt_bias", Hv, "Gated DeltaNet dt_bias");
        VEC(A_log, "linear_attn.A_log", Hv, "Gated DeltaNet A_log");
        VEC(gdn_norm, "linear_attn.norm.weight", c->gdn_value_head_dim, "Gated DeltaNet gated RMSNorm");
        LIN(out_proj, "linear_attn.out_proj", H, value_dim, "Gated DeltaNet out_proj");
    }

    LIN(router, "mlp.gate", c->n_experts, H, "MoE router");
    if ((st = bind_experts(b, lp, L)) != LILY_OK)
        return st;
    LIN(shared_gate, "mlp.shared_expert.gate_proj", c->shared_intermediate, H, "shared expert gate_proj");
    LIN(shared_up, "mlp.shared_expert.up_proj", c->shared_intermediate, H, "shared expert up_proj");
    LIN(shared_down, "mlp.shared_expert.down_proj", H, c->shared_intermediate, "shared expert down_proj");
    LIN(shared_expert_gate, "mlp.shared_expert_gate", 1, H, "shared expert gate");
#undef VEC
#undef LIN
    return LILY_OK;
}

lily_status lily_weights_bind(const lily_config *cfg, const lily_checkpoint *ckpt, lily_weights *w, lily_error *err)
{
    memset(w, 0, sizeof *w);
    binder b = {.cfg = cfg, .ckpt = ckpt, .w = w, .err = err};

    /* Naming (MODEL.md §2.1, §2.3): MLX renames model.language_model.X -> language_model.model.X. */
    static const struct { const char *prefix, *lm_head; lily_layout layout; } namings[] = {
        {"language_model.model.", "language_model.lm_head", LILY_LAYOUT_MLX},
        {"model.language_model.", "lm_head", LILY_LAYOUT_HF},
        {"model.", "lm_head", LILY_LAYOUT_HF},
    };
    int which = -1;
    for (int i = 0; i < 3 && which < 0; i++) {
        char name[256];
        snprintf(name, sizeof name, "%sembed_tokens.weight", namings[i].prefix);
        if (lily_checkpoint_find(ckpt, name))
            which = i;
    }
    if (which < 0)
        return lily_error_set(err, LILY_ERR_MODEL,
                              "no embedding tensor found: looked for language_model.model.embed_tokens.weight, "
                              "model.language_model.embed_tokens.weight and model.embed_tokens.weight (%d tensors in "
                              "the checkpoint)",
                              ckpt->n_tensors);
    b.prefix = namings[which].prefix;
    b.lm_head = namings[which].lm_head;
    w->layout = namings[which].layout;
    w->n_layers = cfg->n_layers;
    w->layers = calloc((size_t)cfg->n_layers, sizeof *w->layers);
    if (!w->layers)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory binding %d layers", cfg->n_layers);

    lily_status st;
    char base[512];
    snprintf(base, sizeof base, "%sembed_tokens", b.prefix);
    st = bind_linear(&b, base, 0, cfg->vocab_size, cfg->hidden, "token embedding", &w->embed);
    if (st == LILY_OK)
        st = bind_vector(&b, "norm.weight", cfg->hidden, "final RMSNorm", &w->final_norm);
    if (st == LILY_OK) {
        snprintf(base, sizeof base, "%s.weight", b.lm_head);
        if (!lily_checkpoint_find(ckpt, base) && cfg->tie_word_embeddings)
            w->lm_head = w->embed;
        else
            st = bind_linear(&b, b.lm_head, 0, cfg->vocab_size, cfg->hidden, "lm_head (tie_word_embeddings is false)",
                             &w->lm_head);
    }
    int conv_mlx = -1;
    for (int i = 0; i < cfg->n_layers && st == LILY_OK; i++)
        st = bind_layer(&b, i, &w->layers[i], &conv_mlx);
    if (st == LILY_OK)
        st = weights_check_finite(w, err);
    if (st != LILY_OK) {
        lily_weights_free(w);
        return st;
    }

    /* Norm convention from the conv1d shape (MODEL.md §2.3, the test mlx-lm applies at load); the
     * naming decides only when there is no linear-attention layer to look at. */
    if (conv_mlx < 0)
        conv_mlx = w->layout == LILY_LAYOUT_MLX;
    w->norms_zero_centred = !conv_mlx;
    if (conv_mlx || w->embed.bits)
        w->layout = LILY_LAYOUT_MLX;
    w->quant_bits = cfg->n_layers > 0 ? w->layers[0].experts_gate.bits : w->embed.bits;
    return LILY_OK;
}
