/* config.h — the model's hyperparameters, read once from config.json (MODEL.md §1) and validated.
 *
 * Owns: lily_config and its parsing. Accepts the nested (`text_config`) and flat layouts,
 * `rope_parameters` or `rope_scaling` + `rope_theta`, `layer_types` or `full_attention_interval`,
 * and the MLX `quantization` block at the root. generation_config.json, when present, adds stop ids and
 * the sampling defaults.
 */
#ifndef LILY_CONFIG_H
#define LILY_CONFIG_H

#include <stdbool.h>

#include "lily.h"

#define LILY_MAX_LAYERS 256
#define LILY_MAX_STOP_IDS 8

typedef enum { LILY_LAYER_LINEAR_ATTENTION = 0, LILY_LAYER_FULL_ATTENTION = 1 } lily_layer_type;

typedef struct {
    float temperature;        /* >= 0 */
    float top_p;              /* (0, 1] */
    float min_p;              /* [0, 1] */
    float repetition_penalty; /* > 0 */
    float presence_penalty;   /* finite */
    int top_k;                /* <= 0 = off; meaningful only when has_top_k */
    bool has_top_k;
    int max_new_tokens;       /* >= 1; 0 = absent */
} lily_generation_defaults;

typedef struct {
    int vocab_size;                 /* 248320 */
    int hidden;                     /* 2048 */
    int n_layers;                   /* 40 */
    lily_layer_type layer_types[LILY_MAX_LAYERS];
    float rms_norm_eps;             /* 1e-6 */
    int max_position_embeddings;    /* 262144 */

    /* gated full attention */
    int n_heads, n_kv_heads;        /* 16, 2: query head h reads KV head h / (n_heads / n_kv_heads) */
    int head_dim;                   /* 256 */
    int rotary_dim;                 /* int(head_dim * partial_rotary_factor) = 64 */
    float partial_rotary_factor;    /* 0.25 */
    float rope_theta;               /* 1e7 */

    /* Gated DeltaNet */
    int gdn_n_key_heads;            /* Hk = 16 */
    int gdn_n_value_heads;          /* Hv = 32: value head j reads key head j / (Hv / Hk) */
    int gdn_key_head_dim;           /* dk = 128 */
    int gdn_value_head_dim;         /* dv = 128 */
    int gdn_conv_kernel;            /* K = 4 */

    /* sparse MoE */
    int n_experts;                  /* 256 */
    int n_experts_used;             /* top-k = 8 */
    int moe_intermediate;           /* 512 */
    int shared_intermediate;        /* 512 */
    bool norm_topk_prob;            /* renormalise the top-k weights (true; HF does it unconditionally) */

    /* tokens */
    int bos_token_id;               /* -1 when absent */
    int stop_ids[LILY_MAX_STOP_IDS];/* eos ids from config.json and generation_config.json */
    int n_stop_ids;

    /* MLX quantization defaults from the root `quantization` block (0 when the checkpoint is unquantized).
     * Per-module overrides are not stored: bits and group size are inferred from tensor shapes. */
    int quant_bits;
    int quant_group_size;

    bool tie_word_embeddings;       /* lm_head shares embed_tokens (false for 35B-A3B) */

    /* generation_config.json's sampling defaults (transformers' names), validated at load: NAN where the
     * file or the field is absent (top_k: has_top_k false; max_new_tokens: 0). do_sample false is stored
     * as temperature 0 (greedy, as transformers' generate()). */
    lily_generation_defaults generation;
} lily_config;

/* Derived sizes (MODEL.md §1.3). */
static inline int lily_config_gdn_key_dim(const lily_config *c) { return c->gdn_n_key_heads * c->gdn_key_head_dim; }
static inline int lily_config_gdn_value_dim(const lily_config *c) { return c->gdn_n_value_heads * c->gdn_value_head_dim; }
static inline int lily_config_gdn_conv_dim(const lily_config *c) { return 2 * lily_config_gdn_key_dim(c) + lily_config_gdn_value_dim(c); }
int lily_config_n_full_attention_layers(const lily_config *c);

/* Parse config.json text (len bytes, not NUL-terminated) into cfg and validate it (positive sizes,
 * heads divisible, rotary_dim even and <= head_dim, layer count <= LILY_MAX_LAYERS).
 * Errors: LILY_ERR_FORMAT for invalid JSON or a missing/ill-typed field (the message names the field). */
lily_status lily_config_parse(const char *json_text, size_t len, lily_config *cfg, lily_error *err);

/* Read DIR/config.json and, when present, DIR/generation_config.json (its eos_token_id, int or list, is
 * merged into stop_ids; its sampling fields and max_new_tokens go to cfg->generation). Errors: LILY_ERR_IO
 * when config.json, or a generation_config.json that exists, cannot be read; LILY_ERR_FORMAT as
 * lily_config_parse, or for a generation_config.json field of the wrong type or out of range (named). */
lily_status lily_config_load(const char *model_dir, lily_config *cfg, lily_error *err);

/* Whether model_dir is a directory with a config.json (what lily_config_load checks first, after the GGUF
 * check): LILY_OK, or LILY_ERR_IO with "model directory DIR: <strerror>", "DIR is not a model directory
 * (...)" ("FILE is a file, not a model directory: pass the directory that holds it, -m DIR" for a file beside
 * a config.json, such as DIR/model.safetensors), or, for a Hugging Face hub cache folder (no config.json, a
 * snapshots/ folder), the snapshot to pass instead. A missing model_dir written as a repo id (ORG/NAME) says
 * lily downloads nothing and names that repo's snapshot in the hub cache ($HF_HUB_CACHE, $HF_HOME/hub,
 * ~/.cache/huggingface/hub) if any. A config.json lily_config_parse refuses as LILY_ERR_UNSUPPORTED (another
 * model family, ...) is that error here, so callers say it before loading the tokenizer; its other errors are
 * left to lily_config_load. */
lily_status lily_check_model_dir(const char *model_dir, lily_error *err);

#endif
