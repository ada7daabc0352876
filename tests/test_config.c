/* test_config.c — config.json parsing (MODEL.md §1): nested vs flat, rope spellings, layer types,
 * generation_config stop ids, the MLX quantization block, and errors that name the field. */
#include "test_support.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/config.h"

/* The tiny-a config (MODEL.md §1 shape of the real one, tests/data/tiny-a/README.md). */
static json_t *load_tiny_config(const char *layout)
{
    char rel[64];
    snprintf(rel, sizeof rel, "tiny-a/%s/config.json", layout);
    json_error_t jerr;
    json_t *root = json_load_file(test_data_path(rel), 0, &jerr);
    assert_non_null(root);
    return root;
}

static lily_status parse_json(json_t *root, lily_config *cfg, lily_error *err)
{
    char *text = json_dumps(root, JSON_COMPACT);
    assert_non_null(text);
    lily_status st = lily_config_parse(text, strlen(text), cfg, err);
    free(text);
    return st;
}

static void assert_tiny_a(const lily_config *c)
{
    assert_int_equal(c->vocab_size, 512);
    assert_int_equal(c->hidden, 128);
    assert_int_equal(c->n_layers, 4);
    assert_int_equal(c->n_heads, 8);
    assert_int_equal(c->n_kv_heads, 2);
    assert_int_equal(c->head_dim, 64);
    assert_int_equal(c->rotary_dim, 16);
    assert_true(c->partial_rotary_factor == 0.25f);
    assert_true(c->rope_theta == 1e7f);
    assert_true(c->rms_norm_eps == 1e-6f);
    assert_int_equal(c->gdn_n_key_heads, 2);
    assert_int_equal(c->gdn_n_value_heads, 4);
    assert_int_equal(c->gdn_key_head_dim, 32);
    assert_int_equal(c->gdn_value_head_dim, 32);
    assert_int_equal(c->gdn_conv_kernel, 4);
    assert_int_equal(lily_config_gdn_conv_dim(c), 2 * 64 + 128);
    assert_int_equal(c->n_experts, 16);
    assert_int_equal(c->n_experts_used, 4);
    assert_int_equal(c->moe_intermediate, 64);
    assert_int_equal(c->shared_intermediate, 64);
    assert_true(c->norm_topk_prob);
    assert_int_equal(c->max_position_embeddings, 8192);
    assert_int_equal(c->layer_types[0], LILY_LAYER_LINEAR_ATTENTION);
    assert_int_equal(c->layer_types[2], LILY_LAYER_LINEAR_ATTENTION);
    assert_int_equal(c->layer_types[3], LILY_LAYER_FULL_ATTENTION);
    assert_int_equal(lily_config_n_full_attention_layers(c), 1);
    assert_int_equal(c->bos_token_id, -1);
    assert_int_equal(c->n_stop_ids, 1);
    assert_int_equal(c->stop_ids[0], 510);
    assert_false(c->tie_word_embeddings);
}

static void test_config_nested_hf(void **state)
{
    (void)state;
    lily_config c;
    lily_error err = {0};
    assert_int_equal(lily_config_load(test_data_path("tiny-a/hf"), &c, &err), LILY_OK);
    assert_tiny_a(&c);
    assert_int_equal(c.quant_bits, 0);
    assert_int_equal(c.quant_group_size, 0);
}

static void test_config_mlx_quantization_block(void **state)
{
    (void)state;
    lily_config c;
    lily_error err = {0};
    assert_int_equal(lily_config_load(test_data_path("tiny-a/mlx4"), &c, &err), LILY_OK);
    assert_tiny_a(&c);
    assert_int_equal(c.quant_bits, 4);
    assert_int_equal(c.quant_group_size, 64);
}

/* A flat config (mlx-lm accepts one; M-Q35 ModelArgs.from_dict) with the transformers-4.57 spelling:
 * rope_scaling + a sibling rope_theta, and full_attention_interval instead of layer_types. */
static void test_config_flat_rope_scaling_interval(void **state)
{
    (void)state;
    json_t *root = load_tiny_config("hf");
    json_t *text = json_incref(json_object_get(root, "text_config"));
    json_decref(root);
    json_t *rope = json_object_get(text, "rope_parameters");
    json_object_set_new(text, "rope_theta", json_real(5e6));
    json_object_del(rope, "rope_theta");
    json_object_del(rope, "partial_rotary_factor");
    json_object_set(text, "rope_scaling", rope);
    json_object_del(text, "rope_parameters");
    json_object_set_new(text, "partial_rotary_factor", json_real(0.5));
    json_object_del(text, "layer_types");
    json_object_set_new(text, "num_hidden_layers", json_integer(8));
    json_object_set_new(text, "full_attention_interval", json_integer(4));
    json_object_set_new(text, "eos_token_id", json_pack("[i,i]", 7, 9));
    json_object_set_new(text, "norm_topk_prob", json_false());

    lily_config c;
    lily_error err = {0};
    assert_int_equal(parse_json(text, &c, &err), LILY_OK);
    assert_true(c.rope_theta == 5e6f);
    assert_true(c.partial_rotary_factor == 0.5f);
    assert_int_equal(c.rotary_dim, 32);
    assert_int_equal(c.n_layers, 8);
    for (int i = 0; i < 8; i++)
        assert_int_equal(c.layer_types[i], (i + 1) % 4 == 0 ? LILY_LAYER_FULL_ATTENTION : LILY_LAYER_LINEAR_ATTENTION);
    assert_int_equal(lily_config_n_full_attention_layers(&c), 2);
    assert_int_equal(c.n_stop_ids, 2);
    assert_int_equal(c.stop_ids[0], 7);
    assert_int_equal(c.stop_ids[1], 9);
    assert_false(c.norm_topk_prob);

    /* no interval either: the default is 4 (T-CFG) */
    json_object_del(text, "full_attention_interval");
    assert_int_equal(parse_json(text, &c, &err), LILY_OK);
    assert_int_equal(lily_config_n_full_attention_layers(&c), 2);
    assert_int_equal(c.layer_types[7], LILY_LAYER_FULL_ATTENTION);
    json_decref(text);
}

/* rope_parameters wins over rope_scaling; partial_rotary_factor from rope_parameters beats text_config. */
static void test_config_rope_parameters_precedence(void **state)
{
    (void)state;
    json_t *root = load_tiny_config("hf");
    json_t *text = json_object_get(root, "text_config");
    json_object_set_new(text, "rope_scaling", json_pack("{s:f,s:f}", "rope_theta", 1.0e4, "partial_rotary_factor", 0.5));
    json_object_set_new(text, "partial_rotary_factor", json_real(0.5));
    json_object_set_new(text, "rope_theta", json_real(1.0e4));
    lily_config c;
    lily_error err = {0};
    assert_int_equal(parse_json(root, &c, &err), LILY_OK);
    assert_true(c.rope_theta == 1e7f);
    assert_int_equal(c.rotary_dim, 16);
    json_decref(root);
}

/* layer_types is used when present, even when full_attention_interval disagrees. */
static void test_config_layer_types_beat_interval(void **state)
{
    (void)state;
    json_t *root = load_tiny_config("hf");
    json_t *text = json_object_get(root, "text_config");
    json_object_set_new(text, "full_attention_interval", json_integer(2));
    json_object_set_new(text, "layer_types",
                        json_pack("[s,s,s,s]", "full_attention", "linear_attention", "full_attention", "linear_attention"));
    lily_config c;
    lily_error err = {0};
    assert_int_equal(parse_json(root, &c, &err), LILY_OK);
    assert_int_equal(c.layer_types[0], LILY_LAYER_FULL_ATTENTION);
    assert_int_equal(c.layer_types[1], LILY_LAYER_LINEAR_ATTENTION);
    assert_int_equal(c.layer_types[2], LILY_LAYER_FULL_ATTENTION);
    assert_int_equal(c.layer_types[3], LILY_LAYER_LINEAR_ATTENTION);

    json_object_set_new(text, "layer_types", json_pack("[s,s,s]", "full_attention", "linear_attention", "x"));
    assert_int_equal(parse_json(root, &c, &err), LILY_ERR_FORMAT);
    assert_non_null(strstr(err.message, "layer_types"));
    json_decref(root);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

/* generation_config.json eos ids (int or list) join config.json's, without duplicates (MODEL.md §1.2). */
static void test_config_generation_config_stop_ids(void **state)
{
    (void)state;
    char dir[] = "/tmp/lily_test_config_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    size_t len;
    char *cfg_text = test_read_file(test_data_path("tiny-a/hf/config.json"), &len);
    assert_non_null(cfg_text);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, cfg_text);
    free(cfg_text);
    char gen[256];
    snprintf(gen, sizeof gen, "%s/generation_config.json", dir);
    write_text(gen, "{\"bos_token_id\": 505, \"eos_token_id\": [511, 510], \"pad_token_id\": 510}");

    lily_config c;
    lily_error err = {0};
    assert_int_equal(lily_config_load(dir, &c, &err), LILY_OK);
    assert_int_equal(c.n_stop_ids, 2);
    assert_int_equal(c.stop_ids[0], 510);
    assert_int_equal(c.stop_ids[1], 511);
    assert_int_equal(c.bos_token_id, 505);

    write_text(gen, "{\"eos_token_id\": 509}");
    assert_int_equal(lily_config_load(dir, &c, &err), LILY_OK);
    assert_int_equal(c.n_stop_ids, 2);
    assert_int_equal(c.stop_ids[1], 509);

    write_text(gen, "{\"eos_token_id\": \"x\"}");
    assert_int_equal(lily_config_load(dir, &c, &err), LILY_ERR_FORMAT);
    assert_non_null(strstr(err.message, "generation_config.json"));

    unlink(gen);
    unlink(path);
    rmdir(dir);
}

static void test_config_missing_field_named(void **state)
{
    (void)state;
    json_t *root = load_tiny_config("hf");
    json_object_del(json_object_get(root, "text_config"), "moe_intermediate_size");
    lily_config c;
    lily_error err = {0};
    assert_int_equal(parse_json(root, &c, &err), LILY_ERR_FORMAT);
    assert_non_null(strstr(err.message, "text_config.moe_intermediate_size"));
    json_decref(root);
}

/* A config of another model family (Llama's as transformers writes it; Qwen3.5 dense, nested) is named as
 * such: it said only "missing required field 'linear_num_key_heads'" (or 'head_dim'). A Qwen3.5-MoE config,
 * or one without a model_type, still names the missing field; err NULL gets the same status. */
static void test_config_other_family_named(void **state)
{
    (void)state;
    static const char llama[] =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 4096, "
        "\"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"num_key_value_heads\": 8, \"head_dim\": 128, "
        "\"vocab_size\": 128256}";
    lily_config c;
    lily_error err = {0};
    assert_int_equal(lily_config_parse(llama, strlen(llama), &c, &err), LILY_ERR_UNSUPPORTED);
    assert_string_equal(err.message, "config.json: model_type 'llama' (LlamaForCausalLM) is not a Qwen3.5/3.6 MoE "
                                     "model (model_type 'qwen3_5_moe'), the only family lily runs (missing required "
                                     "field 'linear_num_key_heads')");
    static const char dense[] = "{\"model_type\": \"qwen3_5\", \"text_config\": {\"model_type\": \"qwen3_5_text\"}}";
    assert_int_equal(lily_config_parse(dense, strlen(dense), &c, &err), LILY_ERR_UNSUPPORTED);
    assert_string_equal(err.message, "config.json: model_type 'qwen3_5' is not a Qwen3.5/3.6 MoE model (model_type "
                                     "'qwen3_5_moe'), the only family lily runs (missing required field "
                                     "'text_config.vocab_size')");
    assert_int_equal(lily_config_parse(dense, strlen(dense), &c, NULL), LILY_ERR_UNSUPPORTED);

    json_t *root = load_tiny_config("hf"); /* model_type qwen3_5_moe / qwen3_5_moe_text */
    json_object_del(json_object_get(root, "text_config"), "num_experts");
    assert_int_equal(parse_json(root, &c, &err), LILY_ERR_FORMAT);
    assert_string_equal(err.message, "config.json: missing required field 'text_config.num_experts'");
    json_object_del(root, "model_type");
    json_object_del(json_object_get(root, "text_config"), "model_type");
    assert_int_equal(parse_json(root, &c, &err), LILY_ERR_FORMAT);
    json_decref(root);
}

static void test_config_wrong_type_named(void **state)
{
    (void)state;
    json_t *root = load_tiny_config("hf");
    json_object_set_new(json_object_get(root, "text_config"), "num_experts", json_string("16"));
    lily_config c;
    lily_error err = {0};
    assert_int_equal(parse_json(root, &c, &err), LILY_ERR_FORMAT);
    assert_non_null(strstr(err.message, "num_experts"));
    assert_non_null(strstr(err.message, "string"));
    json_decref(root);
}

static void test_config_validation(void **state)
{
    (void)state;
    lily_config c;
    lily_error err = {0};
    json_t *root = load_tiny_config("hf");
    json_t *text = json_object_get(root, "text_config");
    json_object_set_new(text, "num_key_value_heads", json_integer(3));
    assert_int_equal(parse_json(root, &c, &err), LILY_ERR_FORMAT);
    assert_non_null(strstr(err.message, "num_key_value_heads"));
    json_object_set_new(text, "num_key_value_heads", json_integer(2));

    json_object_set_new(text, "linear_num_value_heads", json_integer(5));
    assert_int_equal(parse_json(root, &c, &err), LILY_ERR_FORMAT);
    assert_non_null(strstr(err.message, "linear_num_key_heads"));
    json_object_set_new(text, "linear_num_value_heads", json_integer(4));

    /* int(64 * 0.3) = 19: odd rotary dim */
    json_object_set_new(json_object_get(text, "rope_parameters"), "partial_rotary_factor", json_real(0.3));
    assert_int_equal(parse_json(root, &c, &err), LILY_ERR_FORMAT);
    assert_non_null(strstr(err.message, "rotary"));
    json_decref(root);

    assert_int_equal(lily_config_parse("{\"text_config\": ", 16, &c, &err), LILY_ERR_FORMAT);
    assert_non_null(strstr(err.message, "invalid JSON"));
    assert_int_equal(lily_config_parse("[1]", 3, &c, &err), LILY_ERR_FORMAT);
    assert_int_equal(lily_config_load("/nonexistent-lily-dir", &c, &err), LILY_ERR_IO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_nested_hf),
        cmocka_unit_test(test_config_mlx_quantization_block),
        cmocka_unit_test(test_config_flat_rope_scaling_interval),
        cmocka_unit_test(test_config_rope_parameters_precedence),
        cmocka_unit_test(test_config_layer_types_beat_interval),
        cmocka_unit_test(test_config_generation_config_stop_ids),
        cmocka_unit_test(test_config_missing_field_named),
        cmocka_unit_test(test_config_other_family_named),
        cmocka_unit_test(test_config_wrong_type_named),
        cmocka_unit_test(test_config_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
