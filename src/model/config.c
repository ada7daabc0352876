/* config.c — config.json (+ generation_config.json) -> lily_config (MODEL.md §1).
 *
 * Owns: field lookup with the spellings the published checkpoints use (nested `text_config` or flat,
 * `rope_parameters` or `rope_scaling` + `rope_theta`, `layer_types` or `full_attention_interval`, the MLX
 * `quantization` block at the root), defaults where transformers' Qwen3_5MoeTextConfig has one (T-CFG),
 * and validation of the result. Every error names the field that is missing or ill-typed.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>

#include "base/file.h"
#include "base/json_load.h"
#include "model/gguf_check.h"

int lily_config_n_full_attention_layers(const lily_config *c)
{
    int n = 0;
    for (int i = 0; i < c->n_layers; i++)
        n += c->layer_types[i] == LILY_LAYER_FULL_ATTENTION;
    return n;
}

/* Where the text fields live: `text` is text_config (or the root when flat), `root` the top level. */
typedef struct {
    json_t *root;
    json_t *text;
    const char *text_path; /* "text_config." or "" for messages */
    lily_error *err;
} fields;

static const char *json_type_word(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "number";
    case JSON_TRUE: case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* An integer field of `text`; *out keeps def when absent and !required. */
static lily_status get_int(fields *f, const char *key, bool required, int def, int *out)
{
    json_t *v = json_object_get(f->text, key);
    if (!v || json_is_null(v)) {
        if (required)
            return lily_error_set(f->err, LILY_ERR_FORMAT, "config.json: missing required field '%s%s'",
                                  f->text_path, key);
        *out = def;
        return LILY_OK;
    }
    if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v))) /* beyond int64 (json_load.h) */
        return lily_error_set(f->err, LILY_ERR_FORMAT, "config.json: field '%s%s' = %.17g is out of range",
                              f->text_path, key, json_real_value(v));
    if (!json_is_integer(v))
        return lily_error_set(f->err, LILY_ERR_FORMAT, "config.json: field '%s%s' must be an integer, found %s",
                              f->text_path, key, json_type_word(v));
    json_int_t x = json_integer_value(v);
    if (x < -2147483647LL || x > 2147483647LL)
        return lily_error_set(f->err, LILY_ERR_FORMAT, "config.json: field '%s%s' = %lld is out of range",
                              f->text_path, key, (long long)x);
    *out = (int)x;
    return LILY_OK;
}

/* A number in object obj (path for messages); *found says whether it was there. */
static lily_status get_number_in(lily_error *err, json_t *obj, const char *path, const char *key, double *out,
                                 bool *found)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    *found = false;
    if (!v || json_is_null(v))
        return LILY_OK;
    if (!json_is_number(v))
        return lily_error_set(err, LILY_ERR_FORMAT, "config.json: field '%s%s' must be a number, found %s", path,
                              key, json_type_word(v));
    *out = json_number_value(v);
    *found = true;
    return LILY_OK;
}

static lily_status get_bool(fields *f, const char *key, bool def, bool *out)
{
    json_t *v = json_object_get(f->text, key);
    if (!v || json_is_null(v)) {
        v = json_object_get(f->root, key);
        if (!v || json_is_null(v)) {
            *out = def;
            return LILY_OK;
        }
    }
    if (!json_is_boolean(v))
        return lily_error_set(f->err, LILY_ERR_FORMAT, "config.json: field '%s%s' must be a boolean, found %s",
                              f->text_path, key, json_type_word(v));
    *out = json_is_true(v);
    return LILY_OK;
}

/* Add the ids of `v` (an integer or a list of integers; null is nothing) to cfg->stop_ids, skipping
 * duplicates. `what` names the field for messages. */
static lily_status add_stop_ids(lily_config *cfg, json_t *v, const char *what, lily_error *err)
{
    if (!v || json_is_null(v))
        return LILY_OK;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (!json_is_array(v) && !json_is_integer(v))
        return lily_error_set(err, LILY_ERR_FORMAT, "%s must be an integer or a list of integers, found %s", what,
                              json_type_word(v));
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return lily_error_set(err, LILY_ERR_FORMAT, "%s[%zu] must be a non-negative integer", what, i);
        const json_int_t x = json_integer_value(e);
        if (x > 2147483647LL || (cfg->vocab_size > 0 && x >= cfg->vocab_size))
            return lily_error_set(err, LILY_ERR_FORMAT, "%s: token id %lld is outside the vocabulary (vocab_size %d)",
                                  what, (long long)x, cfg->vocab_size);
        const int id = (int)x;
        bool seen = false;
        for (int k = 0; k < cfg->n_stop_ids; k++)
            seen |= cfg->stop_ids[k] == id;
        if (seen)
            continue;
        if (cfg->n_stop_ids >= LILY_MAX_STOP_IDS)
            return lily_error_set(err, LILY_ERR_FORMAT, "%s: more than %d distinct stop ids", what,
                                  LILY_MAX_STOP_IDS);
        cfg->stop_ids[cfg->n_stop_ids++] = id;
    }
    return LILY_OK;
}

static lily_status parse_rope(fields *f, lily_config *cfg)
{
    /* transformers >= 5 writes rope_parameters (with rope_theta inside); 4.57-style configs write
     * rope_scaling plus a sibling rope_theta. Either may sit in text_config or, for flat configs, the root. */
    const char *rope_key = "rope_parameters";
    json_t *rope = json_object_get(f->text, rope_key);
    if (!rope || json_is_null(rope)) {
        rope_key = "rope_scaling";
        rope = json_object_get(f->text, rope_key);
    }
    if (rope && json_is_null(rope))
        rope = NULL;
    if (rope && !json_is_object(rope))
        return lily_error_set(f->err, LILY_ERR_FORMAT, "config.json: field '%s%s' must be an object, found %s",
                              f->text_path, rope_key, json_type_word(rope));
    char rope_path[64];
    snprintf(rope_path, sizeof rope_path, "%s%s.", f->text_path, rope_key);

    if (rope) {
        json_t *type = json_object_get(rope, "rope_type");
        if (!type)
            type = json_object_get(rope, "type");
        if (type && json_is_string(type) && strcmp(json_string_value(type), "default") != 0 &&
            strcmp(json_string_value(type), "mrope") != 0)
            return lily_error_set(f->err, LILY_ERR_UNSUPPORTED, "config.json: %srope_type '%s' is not supported",
                                  rope_path, json_string_value(type));
    }

    double theta = 0;
    bool found = false;
    lily_status st = get_number_in(f->err, rope, rope_path, "rope_theta", &theta, &found);
    if (st == LILY_OK && !found)
        st = get_number_in(f->err, f->text, f->text_path, "rope_theta", &theta, &found);
    if (st == LILY_OK && !found)
        st = get_number_in(f->err, f->root, "", "rope_theta", &theta, &found);
    if (st != LILY_OK)
        return st;
    if (!found)
        return lily_error_set(f->err, LILY_ERR_FORMAT,
                              "config.json: missing required field 'rope_theta' (looked in %srope_parameters, "
                              "%srope_theta and rope_theta)",
                              f->text_path, f->text_path);
    cfg->rope_theta = (float)theta;

    double prf = 0.25; /* T-CFG default for qwen3_5_moe */
    st = get_number_in(f->err, rope, rope_path, "partial_rotary_factor", &prf, &found);
    if (st == LILY_OK && !found)
        st = get_number_in(f->err, f->text, f->text_path, "partial_rotary_factor", &prf, &found);
    if (st == LILY_OK && !found)
        st = get_number_in(f->err, f->root, "", "partial_rotary_factor", &prf, &found);
    if (st != LILY_OK)
        return st;
    if (!(prf > 0.0 && prf <= 1.0))
        return lily_error_set(f->err, LILY_ERR_FORMAT, "config.json: partial_rotary_factor %g is not in (0, 1]", prf);
    cfg->partial_rotary_factor = (float)prf;
    cfg->rotary_dim = (int)(cfg->head_dim * prf); /* int() truncation, as transformers */
    return LILY_OK;
}

static lily_status parse_layer_types(fields *f, lily_config *cfg)
{
    json_t *types = json_object_get(f->text, "layer_types");
    if (types && !json_is_null(types)) {
        if (!json_is_array(types))
            return lily_error_set(f->err, LILY_ERR_FORMAT,
                                  "config.json: field '%slayer_types' must be a list of strings, found %s",
                                  f->text_path, json_type_word(types));
        if ((int)json_array_size(types) != cfg->n_layers)
            return lily_error_set(f->err, LILY_ERR_FORMAT,
                                  "config.json: '%slayer_types' has %zu entries but num_hidden_layers is %d",
                                  f->text_path, json_array_size(types), cfg->n_layers);
        for (int i = 0; i < cfg->n_layers; i++) {
            const char *s = json_string_value(json_array_get(types, (size_t)i));
            if (s && !strcmp(s, "full_attention"))
                cfg->layer_types[i] = LILY_LAYER_FULL_ATTENTION;
            else if (s && !strcmp(s, "linear_attention"))
                cfg->layer_types[i] = LILY_LAYER_LINEAR_ATTENTION;
            else
                return lily_error_set(f->err, LILY_ERR_FORMAT,
                                      "config.json: '%slayer_types[%d]' must be \"full_attention\" or "
                                      "\"linear_attention\"",
                                      f->text_path, i);
        }
        return LILY_OK;
    }
    int interval = 4;
    lily_status st = get_int(f, "full_attention_interval", false, 4, &interval);
    if (st != LILY_OK)
        return st;
    if (interval <= 0)
        return lily_error_set(f->err, LILY_ERR_FORMAT, "config.json: '%sfull_attention_interval' must be positive",
                              f->text_path);
    for (int i = 0; i < cfg->n_layers; i++) /* T-CFG __post_init__, M-Q35 DecoderLayer */
        cfg->layer_types[i] = (i + 1) % interval == 0 ? LILY_LAYER_FULL_ATTENTION : LILY_LAYER_LINEAR_ATTENTION;
    return LILY_OK;
}

static lily_status parse_quantization(fields *f, lily_config *cfg)
{
    /* mlx-lm / mlx-vlm write `quantization` and an identical `quantization_config` at the root. HF
     * quantized checkpoints use quantization_config with a quant_method; those are not MLX affine. */
    json_t *q = json_object_get(f->root, "quantization");
    const char *key = "quantization";
    if (!q || json_is_null(q)) {
        q = json_object_get(f->root, "quantization_config");
        key = "quantization_config";
        if (q && json_is_object(q) && json_object_get(q, "quant_method"))
            return lily_error_set(f->err, LILY_ERR_UNSUPPORTED,
                                  "config.json: quantization_config.quant_method '%s' is not supported (only MLX "
                                  "affine 4/8-bit and unquantized checkpoints)",
                                  json_is_string(json_object_get(q, "quant_method"))
                                      ? json_string_value(json_object_get(q, "quant_method"))
                                      : "?");
    }
    cfg->quant_bits = 0;
    cfg->quant_group_size = 0;
    if (!q || json_is_null(q))
        return LILY_OK;
    if (!json_is_object(q))
        return lily_error_set(f->err, LILY_ERR_FORMAT, "config.json: field '%s' must be an object, found %s", key,
                              json_type_word(q));
    json_t *mode = json_object_get(q, "mode");
    if (mode && json_is_string(mode) && strcmp(json_string_value(mode), "affine") != 0)
        return lily_error_set(f->err, LILY_ERR_UNSUPPORTED,
                              "config.json: %s.mode '%s' is not supported (only affine)", key,
                              json_string_value(mode));
    fields qf = {f->root, q, key, f->err};
    char path[40];
    snprintf(path, sizeof path, "%s.", key);
    qf.text_path = path;
    lily_status st = get_int(&qf, "bits", false, 4, &cfg->quant_bits);
    if (st == LILY_OK)
        st = get_int(&qf, "group_size", false, 64, &cfg->quant_group_size);
    return st;
}

static lily_status validate(const lily_config *c, lily_error *err)
{
    const struct { const char *name; int v; } pos[] = {
        {"vocab_size", c->vocab_size},
        {"hidden_size", c->hidden},
        {"num_hidden_layers", c->n_layers},
        {"num_attention_heads", c->n_heads},
        {"num_key_value_heads", c->n_kv_heads},
        {"head_dim", c->head_dim},
        {"linear_num_key_heads", c->gdn_n_key_heads},
        {"linear_num_value_heads", c->gdn_n_value_heads},
        {"linear_key_head_dim", c->gdn_key_head_dim},
        {"linear_value_head_dim", c->gdn_value_head_dim},
        {"linear_conv_kernel_dim", c->gdn_conv_kernel},
        {"num_experts", c->n_experts},
        {"num_experts_per_tok", c->n_experts_used},
        {"moe_intermediate_size", c->moe_intermediate},
        {"shared_expert_intermediate_size", c->shared_intermediate},
        {"max_position_embeddings", c->max_position_embeddings},
    };
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0)
            return lily_error_set(err, LILY_ERR_FORMAT, "config.json: %s must be positive, found %d", pos[i].name,
                                  pos[i].v);
    if (c->n_layers > LILY_MAX_LAYERS)
        return lily_error_set(err, LILY_ERR_UNSUPPORTED, "config.json: num_hidden_layers %d exceeds lily's limit %d",
                              c->n_layers, LILY_MAX_LAYERS);
    if (c->n_heads % c->n_kv_heads != 0)
        return lily_error_set(err, LILY_ERR_FORMAT,
                              "config.json: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                              c->n_heads, c->n_kv_heads);
    if (c->gdn_n_value_heads % c->gdn_n_key_heads != 0)
        return lily_error_set(err, LILY_ERR_FORMAT,
                              "config.json: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d",
                              c->gdn_n_value_heads, c->gdn_n_key_heads);
    if (c->rotary_dim <= 0 || c->rotary_dim % 2 != 0 || c->rotary_dim > c->head_dim)
        return lily_error_set(err, LILY_ERR_FORMAT,
                              "config.json: rotary dim int(head_dim %d * partial_rotary_factor %g) = %d must be even, "
                              "positive and <= head_dim",
                              c->head_dim, c->partial_rotary_factor, c->rotary_dim);
    if (c->n_experts_used > c->n_experts)
        return lily_error_set(err, LILY_ERR_FORMAT, "config.json: num_experts_per_tok %d > num_experts %d",
                              c->n_experts_used, c->n_experts);
    if (!(c->rms_norm_eps > 0.0f) || !isfinite(c->rope_theta) || !(c->rope_theta > 0.0f))
        return lily_error_set(err, LILY_ERR_FORMAT, "config.json: rms_norm_eps and rope_theta must be positive");
    if (c->vocab_size < 0 || (int64_t)c->vocab_size * c->hidden > ((int64_t)1 << 40))
        return lily_error_set(err, LILY_ERR_FORMAT, "config.json: vocab_size * hidden_size is implausibly large");
    if (c->quant_bits != 0 && c->quant_bits != 4 && c->quant_bits != 8)
        return lily_error_set(err, LILY_ERR_UNSUPPORTED, "config.json: quantization.bits %d is not supported (4 or 8)",
                              c->quant_bits);
    if (c->quant_bits != 0 && c->quant_group_size <= 0)
        return lily_error_set(err, LILY_ERR_FORMAT, "config.json: quantization.group_size must be positive");
    return LILY_OK;
}

/* After a required field failed (err says which, missing or ill-typed): a config whose model_type names
 * another model family (Llama, Qwen3 dense, Qwen3-MoE, ...) says that instead, since no field added would
 * make it load. A Qwen3.5/3.6-MoE model_type, or none, keeps the field's message. */
static lily_status other_family(json_t *root, json_t *text, lily_status st, lily_error *err)
{
    const char *type = json_string_value(json_object_get(root, "model_type")); /* the family's name */
    if (!type)
        type = json_string_value(json_object_get(text, "model_type"));
    if (!type || !strncmp(type, "qwen3_5_moe", 11))
        return st;
    if (!err)
        return LILY_ERR_UNSUPPORTED;
    const char *arch = json_string_value(json_array_get(json_object_get(root, "architectures"), 0));
    char missing[sizeof err->message];
    const char *prefix = "config.json: ";
    snprintf(missing, sizeof missing, "%s",
             err->message + (strncmp(err->message, prefix, strlen(prefix)) ? 0 : strlen(prefix)));
    return lily_error_set(err, LILY_ERR_UNSUPPORTED, "config.json: model_type '%s'%s%s%s is not a Qwen3.5/3.6 "
                          "MoE model (model_type 'qwen3_5_moe'), the only family lily runs (%s)", type,
                          arch ? " (" : "", arch ? arch : "", arch ? ")" : "", missing);
}

static lily_status parse_root(json_t *root, lily_config *cfg, lily_error *err)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->generation = (lily_generation_defaults){.temperature = NAN, .top_p = NAN, .min_p = NAN,
                                                  .repetition_penalty = NAN, .presence_penalty = NAN};
    fields f = {root, root, "", err};
    json_t *text = json_object_get(root, "text_config");
    if (text && !json_is_null(text)) {
        if (!json_is_object(text))
            return lily_error_set(err, LILY_ERR_FORMAT, "config.json: field 'text_config' must be an object, found %s",
                                  json_type_word(text));
        f.text = text;
        f.text_path = "text_config.";
    }

    const struct { const char *key; int *out; } required[] = {
        {"vocab_size", &cfg->vocab_size},
        {"hidden_size", &cfg->hidden},
        {"num_hidden_layers", &cfg->n_layers},
        {"num_attention_heads", &cfg->n_heads},
        {"num_key_value_heads", &cfg->n_kv_heads},
        {"head_dim", &cfg->head_dim},
        {"linear_num_key_heads", &cfg->gdn_n_key_heads},
        {"linear_num_value_heads", &cfg->gdn_n_value_heads},
        {"linear_key_head_dim", &cfg->gdn_key_head_dim},
        {"linear_value_head_dim", &cfg->gdn_value_head_dim},
        {"linear_conv_kernel_dim", &cfg->gdn_conv_kernel},
        {"num_experts", &cfg->n_experts},
        {"num_experts_per_tok", &cfg->n_experts_used},
        {"moe_intermediate_size", &cfg->moe_intermediate},
        {"shared_expert_intermediate_size", &cfg->shared_intermediate},
    };
    lily_status st = LILY_OK;
    for (size_t i = 0; i < sizeof required / sizeof required[0] && st == LILY_OK; i++)
        st = get_int(&f, required[i].key, true, 0, required[i].out);
    if (st != LILY_OK)
        return other_family(root, f.text, st, err);
    st = get_int(&f, "max_position_embeddings", false, 32768, &cfg->max_position_embeddings);
    if (st != LILY_OK)
        return st;
    if (cfg->n_layers > LILY_MAX_LAYERS || cfg->n_layers <= 0 || cfg->head_dim <= 0)
        return validate(cfg, err);

    double eps = 1e-6;
    bool found;
    st = get_number_in(err, f.text, f.text_path, "rms_norm_eps", &eps, &found);
    if (st != LILY_OK)
        return st;
    cfg->rms_norm_eps = (float)eps;

    if ((st = parse_rope(&f, cfg)) != LILY_OK || (st = parse_layer_types(&f, cfg)) != LILY_OK ||
        (st = get_bool(&f, "norm_topk_prob", true, &cfg->norm_topk_prob)) != LILY_OK ||
        (st = get_bool(&f, "tie_word_embeddings", false, &cfg->tie_word_embeddings)) != LILY_OK ||
        (st = parse_quantization(&f, cfg)) != LILY_OK)
        return st;

    /* bos: text_config then root; null or absent -> -1 */
    cfg->bos_token_id = -1;
    json_t *bos = json_object_get(f.text, "bos_token_id");
    if (!bos || json_is_null(bos))
        bos = json_object_get(root, "bos_token_id");
    if (bos && !json_is_null(bos)) {
        if (!json_is_integer(bos) || json_integer_value(bos) < 0 || json_integer_value(bos) > 2147483647LL)
            return lily_error_set(err, LILY_ERR_FORMAT, "config.json: field 'bos_token_id' must be a non-negative integer");
        cfg->bos_token_id = (int)json_integer_value(bos);
    }

    char what[64];
    snprintf(what, sizeof what, "config.json: '%seos_token_id'", f.text_path);
    if ((st = add_stop_ids(cfg, json_object_get(f.text, "eos_token_id"), what, err)) != LILY_OK)
        return st;
    if (f.text != root && (st = add_stop_ids(cfg, json_object_get(root, "eos_token_id"),
                                             "config.json: 'eos_token_id'", err)) != LILY_OK)
        return st;
    return validate(cfg, err);
}

lily_status lily_config_parse(const char *json_text, size_t len, lily_config *cfg, lily_error *err)
{
    json_error_t jerr;
    json_t *root = lily_json_loadb(json_text, len, 0, &jerr);
    if (!root)
        return lily_error_set(err, LILY_ERR_FORMAT, "config.json: invalid JSON at line %d column %d: %s", jerr.line,
                              jerr.column, jerr.text);
    lily_status st;
    if (!json_is_object(root))
        st = lily_error_set(err, LILY_ERR_FORMAT, "config.json: top level must be an object, found %s",
                            json_type_word(root));
    else
        st = parse_root(root, cfg, err);
    json_decref(root);
    return st;
}

#define LILY_CONFIG_MAX_BYTES ((size_t)64 << 20) /* a config is a few KB; refuse anything absurd */

/* A number field of generation_config.json in [min, max] (open at an end where the flag says so) into
 * *out; absent or null leaves *out as it is. */
static lily_status gen_number(json_t *gen, const char *key, double min, bool min_open, double max, float *out,
                              lily_error *err)
{
    json_t *v = json_object_get(gen, key);
    if (!v || json_is_null(v))
        return LILY_OK;
    const double x = json_is_number(v) ? json_number_value(v) : NAN;
    if (!json_is_number(v) || !isfinite(x) || x < min || (min_open && x == min) || x > max) {
        char range[64];
        if (isinf(max))
            snprintf(range, sizeof range, "%s %g", min_open ? ">" : ">=", min);
        else
            snprintf(range, sizeof range, "in %c%g, %g]", min_open ? '(' : '[', min, max);
        if (!json_is_number(v))
            return lily_error_set(err, LILY_ERR_FORMAT, "generation_config.json: '%s' must be a number %s, found %s",
                                  key, range, json_type_word(v));
        return lily_error_set(err, LILY_ERR_FORMAT, "generation_config.json: '%s' must be a number %s, found %g",
                              key, range, x);
    }
    *out = (float)x;
    return LILY_OK;
}

/* generation_config.json's sampling fields and max_new_tokens, checked as transformers' GenerationConfig
 * does (temperature >= 0, top_p and min_p probabilities, repetition_penalty > 0, top_k and max_new_tokens
 * integers, max_new_tokens > 0, do_sample a boolean), so a bad value is refused at load, naming the field,
 * instead of failing every request. */
static lily_status parse_generation_defaults(json_t *gen, lily_generation_defaults *g, lily_error *err)
{
    lily_status st;
    if ((st = gen_number(gen, "temperature", 0, false, INFINITY, &g->temperature, err)) != LILY_OK ||
        (st = gen_number(gen, "top_p", 0, true, 1, &g->top_p, err)) != LILY_OK ||
        (st = gen_number(gen, "min_p", 0, false, 1, &g->min_p, err)) != LILY_OK ||
        (st = gen_number(gen, "repetition_penalty", 0, true, INFINITY, &g->repetition_penalty, err)) != LILY_OK ||
        (st = gen_number(gen, "presence_penalty", -INFINITY, false, INFINITY, &g->presence_penalty, err)) != LILY_OK)
        return st;
    json_t *v = json_object_get(gen, "top_k");
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < INT32_MIN || json_integer_value(v) > INT32_MAX)
            return lily_error_set(err, LILY_ERR_FORMAT, "generation_config.json: 'top_k' must be an integer "
                                  "(0 = off), found %s", json_type_word(v));
        g->top_k = (int)json_integer_value(v);
        g->has_top_k = true;
    }
    v = json_object_get(gen, "max_new_tokens");
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > INT32_MAX)
            return lily_error_set(err, LILY_ERR_FORMAT, "generation_config.json: 'max_new_tokens' must be an "
                                  "integer in [1, %d]", INT32_MAX);
        g->max_new_tokens = (int)json_integer_value(v);
    }
    v = json_object_get(gen, "do_sample");
    if (v && !json_is_null(v) && !json_is_boolean(v))
        return lily_error_set(err, LILY_ERR_FORMAT, "generation_config.json: 'do_sample' must be true or false, "
                              "found %s", json_type_word(v));
    if (json_is_false(v))
        g->temperature = 0; /* transformers' generate(): greedy */
    return LILY_OK;
}

/* Whether name is written as a Hugging Face repo id, ORG/NAME: two parts of [A-Za-z0-9._-] joined by one '/',
 * neither starting with '.' or '-' (huggingface_hub's repo-id rule, which "./x" and "../x" fail). */
static bool looks_like_repo_id(const char *name)
{
    const char *slash = strchr(name, '/');
    if (!slash || strchr(slash + 1, '/') || slash == name || !slash[1])
        return false;
    for (const char *p = name; *p; p++)
        if (p != slash && !(isalnum((unsigned char)*p) || *p == '.' || *p == '_' || *p == '-'))
            return false;
    return name[0] != '.' && name[0] != '-' && slash[1] != '.' && slash[1] != '-';
}

/* The Hugging Face hub cache folder as huggingface_hub places it: $HF_HUB_CACHE, else $HF_HOME/hub, else
 * $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub. Empty when none of these is set. */
static void hf_hub_cache(char *out, size_t n)
{
    const char *v;
    if ((v = getenv("HF_HUB_CACHE")) && *v)
        snprintf(out, n, "%s", v);
    else if ((v = getenv("HF_HOME")) && *v)
        snprintf(out, n, "%s/hub", v);
    else if ((v = getenv("XDG_CACHE_HOME")) && *v)
        snprintf(out, n, "%s/huggingface/hub", v);
    else if ((v = getenv("HOME")) && *v)
        snprintf(out, n, "%s/.cache/huggingface/hub", v);
    else
        out[0] = '\0';
}

/* -m ORG/NAME that is no path here: lily reads local files only. Names the snapshot of ORG/NAME in the hub
 * cache when there is one (refs/main's revision, else the only one), else how to download it. */
static lily_status repo_id_error(const char *repo, lily_error *err)
{
    char cache[2048], folder[4096], rev[256] = "";
    hf_hub_cache(cache, sizeof cache);
    snprintf(folder, sizeof folder, "%s/models--%.*s--%s", cache, (int)(strchr(repo, '/') - repo), repo,
             strchr(repo, '/') + 1);
    char path[4400];
    snprintf(path, sizeof path, "%s/refs/main", folder);
    FILE *f = cache[0] ? fopen(path, "r") : NULL;
    if (f) {
        if (!fgets(rev, sizeof rev, f))
            rev[0] = '\0';
        rev[strcspn(rev, "\r\n")] = '\0';
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/snapshots", folder);
    DIR *d = cache[0] ? opendir(path) : NULL;
    if (d) {
        char only[256] = "";
        int n = 0;
        for (struct dirent *e; (e = readdir(d));)
            if (e->d_name[0] != '.' && n++ == 0)
                snprintf(only, sizeof only, "%s", e->d_name);
        closedir(d);
        char snap[4800];
        struct stat sb;
        snprintf(snap, sizeof snap, "%s/%s", path, rev);
        if (rev[0] && (stat(snap, &sb) != 0 || !S_ISDIR(sb.st_mode)))
            rev[0] = '\0'; /* refs/main names a revision not downloaded */
        if (!rev[0] && n == 1)
            snprintf(rev, sizeof rev, "%s", only);
        if (n)
            return lily_error_set(err, LILY_ERR_IO, "model directory %s: No such file or directory; the Hugging "
                                  "Face cache holds %s: pass its snapshot, -m %s/%s", repo, repo, path,
                                  rev[0] ? rev : "REVISION");
    }
    return lily_error_set(err, LILY_ERR_IO, "model directory %s: No such file or directory (lily downloads nothing: "
                          "if %s is a Hugging Face repo, `hf download %s --local-dir DIR`, then -m DIR)", repo, repo,
                          repo);
}

lily_status lily_check_model_dir(const char *model_dir, lily_error *err)
{
    struct stat sb;
    if (stat(model_dir, &sb) != 0) {
        if (errno == ENOENT && looks_like_repo_id(model_dir))
            return repo_id_error(model_dir, err);
        return lily_error_set(err, LILY_ERR_IO, "model directory %s: %s", model_dir, strerror(errno));
    }
    char path[4096];
    if (!S_ISDIR(sb.st_mode)) {
        /* a file of a model directory (model.safetensors, config.json), as llama.cpp's -m takes its one file:
         * name the directory that holds it */
        const char *slash = strrchr(model_dir, '/');
        int dir_len = slash ? (slash == model_dir ? 1 : (int)(slash - model_dir)) : 1;
        const char *dir = slash ? model_dir : ".";
        snprintf(path, sizeof path, "%.*s/config.json", dir_len, dir);
        if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
            return lily_error_set(err, LILY_ERR_IO, "%s is a file, not a model directory: pass the directory that "
                                  "holds it, -m %.*s", model_dir, dir_len, dir);
        return lily_error_set(err, LILY_ERR_IO, "%s is not a model directory (expected a directory with config.json, "
                              "*.safetensors and tokenizer.json)", model_dir);
    }
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    if (lstat(path, &sb) == 0 || errno != ENOENT) { /* there (or unreadable: opening it says why) */
        /* a model lily does not run (another family, a rope type or quantization it lacks) is said here, before
         * the tokenizer loads: that one's error (a SentencePiece tokenizer's) would hide the cause */
        char *text;
        size_t len;
        lily_error perr;
        lily_config cfg;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || /* a FIFO would block: loading says what it is */
            lily_read_file(path, LILY_CONFIG_MAX_BYTES, &text, &len, &perr) != LILY_OK)
            return LILY_OK;
        lily_status st = lily_config_parse(text, len, &cfg, &perr);
        free(text);
        if (st == LILY_ERR_UNSUPPORTED)
            return lily_error_set(err, st, "%s: %s", model_dir, perr.message);
        return LILY_OK;
    }
    /* a Hugging Face hub cache folder (models--ORG--NAME) keeps the files under snapshots/REVISION/ */
    snprintf(path, sizeof path, "%s/snapshots", model_dir);
    DIR *d = opendir(path);
    if (d) {
        char revision[256] = "";
        int n = 0;
        for (struct dirent *e; (e = readdir(d));)
            if (e->d_name[0] != '.' && n++ == 0)
                snprintf(revision, sizeof revision, "%s", e->d_name);
        closedir(d);
        return lily_error_set(err, LILY_ERR_IO, "%s is a Hugging Face cache folder, not a model directory: pass its "
                              "snapshot, %s/%s", model_dir, path, n == 1 ? revision : "REVISION");
    }
    return lily_error_set(err, LILY_ERR_IO, "%s is not a model directory: it has no config.json (expected a directory "
                          "with config.json, *.safetensors and tokenizer.json)", model_dir);
}

lily_status lily_config_load(const char *model_dir, lily_config *cfg, lily_error *err)
{
    lily_status gst = lily_check_not_gguf(model_dir, err);
    if (gst != LILY_OK)
        return gst;
    if ((gst = lily_check_model_dir(model_dir, err)) != LILY_OK)
        return gst;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    char *text;
    size_t len;
    lily_status st = lily_check_regular_file(path, err);
    if (st == LILY_OK)
        st = lily_read_file(path, LILY_CONFIG_MAX_BYTES, &text, &len, err);
    if (st != LILY_OK)
        return st;
    st = lily_config_parse(text, len, cfg, err);
    free(text);
    if (st != LILY_OK) {
        lily_error_prefix(err, "%s", model_dir);
        return st;
    }

    snprintf(path, sizeof path, "%s/generation_config.json", model_dir);
    if ((st = lily_check_regular_file(path, err)) != LILY_OK)
        return st;
    FILE *probe = fopen(path, "rb");
    if (!probe) {
        if (errno == ENOENT)
            return LILY_OK; /* optional */
        return lily_error_set(err, LILY_ERR_IO, "%s: cannot open (%s)", path, strerror(errno));
    }
    fclose(probe);
    if ((st = lily_read_file(path, LILY_CONFIG_MAX_BYTES, &text, &len, err)) != LILY_OK)
        return st;
    json_error_t jerr;
    json_t *gen = lily_json_loadb(text, len, 0, &jerr);
    free(text);
    if (!gen)
        return lily_error_set(err, LILY_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", path, jerr.line,
                              jerr.column, jerr.text);
    if (!json_is_object(gen))
        st = lily_error_set(err, LILY_ERR_FORMAT, "generation_config.json: top level must be an object, found %s",
                            json_type_word(gen));
    else
        st = add_stop_ids(cfg, json_object_get(gen, "eos_token_id"), "generation_config.json: 'eos_token_id'", err);
    if (st == LILY_OK && cfg->bos_token_id < 0) {
        json_t *bos = json_object_get(gen, "bos_token_id");
        if (json_is_integer(bos) && json_integer_value(bos) >= 0 && json_integer_value(bos) <= 2147483647LL)
            cfg->bos_token_id = (int)json_integer_value(bos);
    }
    if (st == LILY_OK)
        st = parse_generation_defaults(gen, &cfg->generation, err);
    json_decref(gen);
    if (st != LILY_OK)
        lily_error_prefix(err, "%s", model_dir);
    return st;
}
