/* test_cost_model.c — the bench's floor arithmetic against TARGETS.md's table for Qwen3.6-35B-A3B 4-bit. */
#include "test_support.h"

#include <math.h>
#include <stdio.h>

#include "model/synthetic.h"
#include "runtime/cost_model.h"

static void assert_near(const char *what, double got, double want, double rel)
{
    if (fabs(got - want) > rel * fabs(want)) {
        print_error("%s: got %.6g, TARGETS.md says %.6g (tolerance %.1f%%)\n", what, got, want, 100 * rel);
        fail();
    }
}

static void cost_model_35b(lily_cost_model *cm)
{
    lily_config cfg;
    lily_error err;
    assert_int_equal(lily_synthetic_preset("qwen3.6-35b-a3b", &cfg, &err), LILY_OK);
    lily_cost_model_init(&cfg, 4, 8, 64, cm);
}

/* TARGETS.md "Bytes read per decode token, MLX 4-bit": each part and the ~1.67 GB total. */
static void test_decode_weight_bytes_match_targets_table(void **state)
{
    (void)state;
    lily_cost_model cm;
    cost_model_35b(&cm);
    assert_near("bytes per 4-bit weight", cm.bytes_per_weight, 4.5 / 8, 1e-12);
    assert_near("GDN params", cm.gdn_params, 30 * 33.7e6, 0.005);
    assert_near("GDN bytes", cm.gdn_bytes, 569e6, 0.005);
    assert_near("attention params", cm.attention_params, 10 * 27.3e6, 0.005);
    assert_near("attention bytes", cm.attention_bytes, 153e6, 0.005);
    assert_near("MoE params", cm.moe_params, 40 * 28.3e6, 0.005);
    assert_near("MoE bytes", cm.moe_bytes, 637e6, 0.005);
    assert_near("router bytes", cm.router_bytes, 22e6, 0.02);
    assert_near("LM head params", cm.lm_head_params, 508.6e6, 0.001);
    assert_near("LM head bytes", cm.lm_head_bytes, 286e6, 0.005);
    assert_near("weights total", cm.weight_bytes, 1.67e9, 0.01);
    double params = cm.gdn_params + cm.attention_params + cm.moe_params + cm.router_params + cm.lm_head_params;
    assert_near("active params", params, 2.92e9, 0.01);
}

/* TARGETS.md: KV 20 KiB per context token (84 MB at 4K, 2.7 GB at 128K); GDN state read + write 126 MB. */
static void test_kv_and_state_bytes_match_targets_table(void **state)
{
    (void)state;
    lily_cost_model cm;
    cost_model_35b(&cm);
    assert_true(cm.kv_bytes_per_position == 20480.0);
    assert_near("KV at 4K", 4096 * cm.kv_bytes_per_position, 84e6, 0.01);
    assert_near("KV at 128K", 131072 * cm.kv_bytes_per_position, 2.7e9, 0.01);
    assert_near("recurrent state read + write", cm.recurrent_state_bytes, 126e6, 0.005);
    /* decode at 4K: weights + KV + state; the conv state adds ~3 MB */
    double at4k = lily_cost_decode_bytes(&cm, 4096);
    assert_near("decode bytes at 4K", at4k, 1.67e9 + 84e6 + 126e6, 0.01);
    assert_true(cm.conv_state_bytes > 0 && cm.conv_state_bytes < 4e6);
}

/* TARGETS.md: "Prefill needs ~6.3 GFLOP per token at 4K (2 x 2.92 B + attention)". */
static void test_prefill_flops_match_targets(void **state)
{
    (void)state;
    lily_cost_model cm;
    cost_model_35b(&cm);
    assert_near("prefill FLOP/token at 4K, all logits", lily_cost_prefill_flops_per_token_all_logits(&cm, 4096), 6.3e9,
                0.03);
    /* lily computes the LM head once per prompt: the difference is 2 * 508.6 M * (1 - 1/4096) */
    double diff = lily_cost_prefill_flops_per_token_all_logits(&cm, 4096) - lily_cost_prefill_flops_per_token(&cm, 4096);
    assert_near("LM head share", diff, 2 * 508.6e6 * (1 - 1.0 / 4096), 0.002);
    /* attention grows linearly with the prompt: 10 layers x 4 x 16 heads x 256 per (query, key) */
    assert_true(cm.attention_flops_per_position == 10 * 4 * 16 * 256);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_weight_bytes_match_targets_table),
        cmocka_unit_test(test_kv_and_state_bytes_match_targets_table),
        cmocka_unit_test(test_prefill_flops_match_targets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
