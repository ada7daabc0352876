/* test_memory_plan.c — the GPU memory plan's arithmetic (runtime/memory_plan.h) with the sizes of
 * Qwen3.6-35B-A3B MLX 4-bit on the CUDA backend: weights 18,603 MiB, 20 KiB of KV per token (+ 4 bytes of
 * token buffer), 66 MiB of DeltaNet state, prefill scratch per chunk. */
#include "test_support.h"

#include <stdio.h>
#include <string.h>

#include "runtime/memory_plan.h"

#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

static lily_memory_plan_input qwen36(size_t budget)
{
    lily_memory_plan_input in = {
        .budget_bytes = budget,
        .runtime_bytes = 768 * MIB,
        .weight_bytes = 18603 * MIB,
        .kv_bytes_per_token = 20 * 1024 + 4,
        .state_bytes = 66 * MIB,
        .n_sessions = 1,
        .n_chunks = 5,
        .chunk = {4096, 2048, 1024, 512, 256},
        .scratch_bytes = {1160 * MIB, 600 * MIB, 320 * MIB, 180 * MIB, 110 * MIB},
        .ctx_max = 262144,
        .pool_requested = 2048 * MIB,
    };
    return in;
}

static size_t fixed_bytes(const lily_memory_plan_input *in)
{
    return in->runtime_bytes + in->weight_bytes + in->state_bytes * (size_t)in->n_sessions;
}

static void assert_consistent(const lily_memory_plan_input *in, const lily_memory_plan *p)
{
    assert_int_equal(p->kv, in->kv_bytes_per_token * (size_t)in->n_sessions * (size_t)p->ctx);
    assert_int_equal(p->total, fixed_bytes(in) + p->scratch + p->kv + p->pool_bytes);
    assert_true(p->total <= in->budget_bytes);
}

/* 24 GiB, nothing requested: the 4096 chunk, the whole 2 GiB pool, and the rest as context (>= 32K). */
static void test_24gib_defaults(void **state)
{
    (void)state;
    lily_memory_plan_input in = qwen36(24 * GIB);
    lily_memory_plan p;
    lily_error err = {0};
    assert_int_equal(lily_memory_plan_choose(&in, &p, &err), LILY_OK);
    assert_int_equal(p.chunk, 4096);
    assert_int_equal(p.pool_bytes, 2048 * MIB);
    const size_t left = 24 * GIB - fixed_bytes(&in) - 1160 * MIB - 2048 * MIB;
    assert_int_equal(p.ctx, (int)(left / in.kv_bytes_per_token / 256 * 256));
    assert_true(p.ctx >= 32768);
    assert_int_equal(p.ctx % 256, 0);
    assert_consistent(&in, &p);
}

/* A large card: the model's maximum context, the default chunk and pool. */
static void test_large_card_takes_model_max(void **state)
{
    (void)state;
    lily_memory_plan_input in = qwen36(139 * GIB);
    lily_memory_plan p;
    lily_error err = {0};
    assert_int_equal(lily_memory_plan_choose(&in, &p, &err), LILY_OK);
    assert_int_equal(p.chunk, 4096);
    assert_int_equal(p.ctx, 262144);
    assert_int_equal(p.pool_bytes, 2048 * MIB);
    assert_consistent(&in, &p);
}

/* --ctx-size 131072 in 24 GiB fits; the pool shrinks to what that context leaves. */
static void test_requested_ctx_shrinks_pool(void **state)
{
    (void)state;
    lily_memory_plan_input in = qwen36(24 * GIB);
    in.ctx_requested = 131072;
    lily_memory_plan p;
    lily_error err = {0};
    assert_int_equal(lily_memory_plan_choose(&in, &p, &err), LILY_OK);
    assert_int_equal(p.ctx, 131072);
    assert_int_equal(p.chunk, 4096);
    assert_int_equal(p.pool_bytes, 24 * GIB - fixed_bytes(&in) - 1160 * MIB - 131072 * in.kv_bytes_per_token);
    assert_true(p.pool_bytes < 2048 * MIB);
    assert_consistent(&in, &p);
}

/* --ctx-size 262144 does not fit 24 GiB even with the smallest chunk: the error names what to lower and
 * how much fits. */
static void test_requested_ctx_too_large_says_what_fits(void **state)
{
    (void)state;
    lily_memory_plan_input in = qwen36(24 * GIB);
    in.ctx_requested = 262144;
    lily_memory_plan p;
    memset(&p, 0x5a, sizeof p);
    lily_error err = {0};
    assert_int_equal(lily_memory_plan_choose(&in, &p, &err), LILY_ERR_OUT_OF_MEMORY);
    assert_non_null(strstr(err.message, "lower --ctx-size"));
    const size_t left = 24 * GIB - fixed_bytes(&in) - 110 * MIB; /* chunk 256 */
    char want[64];
    snprintf(want, sizeof want, "at most %d fits", (int)(left / in.kv_bytes_per_token / 256 * 256));
    assert_non_null(strstr(err.message, want));
    assert_int_equal(p.chunk, 0x5a5a5a5a); /* untouched */
}

/* 20 GiB: the largest chunk that still leaves 32K of context is 1024. */
static void test_small_budget_lowers_the_chunk(void **state)
{
    (void)state;
    lily_memory_plan_input in = qwen36(20 * GIB);
    lily_memory_plan p;
    lily_error err = {0};
    assert_int_equal(lily_memory_plan_choose(&in, &p, &err), LILY_OK);
    assert_int_equal(p.chunk, 1024);
    assert_true(p.ctx >= 32768);
    assert_consistent(&in, &p);
}

/* The weights alone exceed the budget: an error naming --gpu-memory. */
static void test_weights_over_budget(void **state)
{
    (void)state;
    lily_memory_plan_input in = qwen36(18 * GIB);
    lily_memory_plan p;
    lily_error err = {0};
    assert_int_equal(lily_memory_plan_choose(&in, &p, &err), LILY_ERR_OUT_OF_MEMORY);
    assert_non_null(strstr(err.message, "--gpu-memory"));
}

/* Two sessions (lily bench) hold two KV caches and two states. */
static void test_two_sessions(void **state)
{
    (void)state;
    lily_memory_plan_input in = qwen36(24 * GIB);
    in.n_sessions = 2;
    in.ctx_requested = 32768;
    lily_memory_plan p;
    lily_error err = {0};
    assert_int_equal(lily_memory_plan_choose(&in, &p, &err), LILY_OK);
    assert_int_equal(p.ctx, 32768);
    assert_int_equal(p.state, 2 * 66 * MIB);
    assert_consistent(&in, &p);
}

/* A model without attention layers needs no KV: the context is the model's maximum. */
static void test_no_kv_takes_model_max(void **state)
{
    (void)state;
    lily_memory_plan_input in = qwen36(24 * GIB);
    in.kv_bytes_per_token = 0;
    lily_memory_plan p;
    lily_error err = {0};
    assert_int_equal(lily_memory_plan_choose(&in, &p, &err), LILY_OK);
    assert_int_equal(p.ctx, 262144);
}

static void test_bad_input(void **state)
{
    (void)state;
    lily_memory_plan_input in = qwen36(24 * GIB);
    lily_memory_plan p;
    lily_error err = {0};
    in.n_sessions = 0;
    assert_int_equal(lily_memory_plan_choose(&in, &p, &err), LILY_ERR_INVALID_ARGUMENT);
    in = qwen36(24 * GIB);
    in.n_chunks = 0;
    assert_int_equal(lily_memory_plan_choose(&in, &p, &err), LILY_ERR_INVALID_ARGUMENT);
}

static void test_format_names_every_part(void **state)
{
    (void)state;
    lily_memory_plan_input in = qwen36(24 * GIB);
    in.ctx_requested = 32768;
    lily_memory_plan p;
    lily_error err = {0};
    assert_int_equal(lily_memory_plan_choose(&in, &p, &err), LILY_OK);
    char line[512];
    lily_memory_plan_format(&p, line, sizeof line);
    assert_non_null(strstr(line, "weights 18.17 GiB"));
    assert_non_null(strstr(line, "KV cache 32768 tokens 0.63 GiB"));
    assert_non_null(strstr(line, "prefill scratch (chunk 4096) 1.13 GiB"));
    assert_non_null(strstr(line, "checkpoint pool 2.00 GiB"));
    assert_non_null(strstr(line, "of 24.00 GiB"));
}

/* Qwen3.6-35B-A3B's routed experts: 40 layers of 256 experts, gate and up [512, 2048] and down [2048, 512]
 * in 4 bits with a bf16 scale and bias per 64 weights: 432 MiB per layer, 17,280 of the 18,603 MiB. */
#define EXPERT_LAYER (432 * MIB)

static lily_memory_plan_input qwen36_experts(size_t budget, int n_cpu_moe)
{
    lily_memory_plan_input in = qwen36(budget);
    in.expert_layer_bytes = EXPERT_LAYER;
    in.n_layers = 40;
    in.n_cpu_moe = n_cpu_moe;
    in.expert_stage_bytes = EXPERT_LAYER + 2304; /* the CUDA backend's prefill staging buffer */
    return in;
}

/* 12 GiB, no count given: the fewest layers whose experts, moved to host memory, leave room for the
 * largest chunk and 32K of context: 768 + 66 + 1160 MiB + 32768 tokens of KV + (18603 - 432 N) MiB + the
 * staging buffer (432 MiB) <= 12 GiB gives N = 22. */
static void test_auto_moves_the_fewest_layers(void **state)
{
    (void)state;
    lily_memory_plan_input in = qwen36_experts(12 * GIB, LILY_N_CPU_MOE_AUTO);
    const size_t rest = in.runtime_bytes + in.state_bytes + 1160 * MIB + 32768 * in.kv_bytes_per_token;
    int expect = 0;
    while (rest + in.weight_bytes - (size_t)expect * EXPERT_LAYER + (expect ? in.expert_stage_bytes : 0) > 12 * GIB)
        expect++;
    assert_int_equal(expect, 22);
    lily_memory_plan p;
    lily_error err = {0};
    assert_int_equal(lily_memory_plan_choose(&in, &p, &err), LILY_OK);
    assert_int_equal(p.n_cpu_moe, 22);
    assert_int_equal(p.n_layers, 40);
    assert_true(p.n_cpu_moe_chosen);
    assert_int_equal(p.chunk, 4096);
    assert_int_equal(p.host_experts, 22 * EXPERT_LAYER);
    assert_int_equal(p.weights, 18603 * MIB - 22 * EXPERT_LAYER);
    assert_int_equal(p.expert_stage, in.expert_stage_bytes);
    assert_int_equal(p.scratch, 1160 * MIB + in.expert_stage_bytes);
    assert_true(p.ctx >= 32768);
    assert_true(p.total <= 12 * GIB);
    assert_int_equal(p.total, p.runtime + p.weights + p.state + p.scratch + p.kv + p.pool_bytes);
    /* one layer fewer leaves room for 32K of context only with a smaller chunk */
    lily_memory_plan_input fewer = qwen36_experts(12 * GIB, 21);
    lily_memory_plan q;
    const lily_status st = lily_memory_plan_choose(&fewer, &q, &err);
    assert_true(st != LILY_OK || q.chunk < 4096 || q.ctx < 32768);
    char line[640];
    lily_memory_plan_format(&p, line, sizeof line);
    assert_non_null(strstr(line, "routed experts of 22 of 40 layers in host memory: 9.28 GiB"));
}

/* 16 GiB: fewer layers move; 24 GiB: none (the plan is the one without experts in host memory). */
static void test_auto_moves_none_when_it_fits(void **state)
{
    (void)state;
    lily_memory_plan p;
    lily_error err = {0};
    lily_memory_plan_input in = qwen36_experts(16 * GIB, LILY_N_CPU_MOE_AUTO);
    assert_int_equal(lily_memory_plan_choose(&in, &p, &err), LILY_OK);
    assert_int_equal(p.n_cpu_moe, 13); /* 18603 - 432 N + 432 <= 16384 - 2634.1 */
    in = qwen36_experts(24 * GIB, LILY_N_CPU_MOE_AUTO);
    assert_int_equal(lily_memory_plan_choose(&in, &p, &err), LILY_OK);
    assert_int_equal(p.n_cpu_moe, 0);
    assert_false(p.n_cpu_moe_chosen);
    assert_int_equal(p.host_experts, 0);
    assert_int_equal(p.expert_stage, 0);
    assert_int_equal(p.weights, 18603 * MIB);
    assert_int_equal(p.scratch, 1160 * MIB);
    char line[640];
    lily_memory_plan_format(&p, line, sizeof line);
    assert_null(strstr(line, "host memory"));
}

/* A count given is kept (clamped to the layers: --cpu-moe), even where fewer would fit; NONE never moves. */
static void test_explicit_counts(void **state)
{
    (void)state;
    lily_memory_plan p;
    lily_error err = {0};
    lily_memory_plan_input in = qwen36_experts(24 * GIB, 1 << 30);
    assert_int_equal(lily_memory_plan_choose(&in, &p, &err), LILY_OK);
    assert_int_equal(p.n_cpu_moe, 40);
    assert_false(p.n_cpu_moe_chosen);
    assert_int_equal(p.weights, (18603 - 40 * 432) * MIB);
    in = qwen36_experts(24 * GIB, 5);
    assert_int_equal(lily_memory_plan_choose(&in, &p, &err), LILY_OK);
    assert_int_equal(p.n_cpu_moe, 5);
    assert_int_equal(p.host_experts, 5 * EXPERT_LAYER);
    in = qwen36_experts(12 * GIB, LILY_N_CPU_MOE_NONE);
    assert_int_equal(lily_memory_plan_choose(&in, &p, &err), LILY_ERR_OUT_OF_MEMORY);
    assert_non_null(strstr(err.message, "--gpu-memory"));
}

/* Too small even with every expert in host memory: the error says so. */
static void test_auto_too_small_even_with_all_moved(void **state)
{
    (void)state;
    lily_memory_plan_input in = qwen36_experts(1 * GIB, LILY_N_CPU_MOE_AUTO);
    lily_memory_plan p;
    lily_error err = {0};
    assert_int_equal(lily_memory_plan_choose(&in, &p, &err), LILY_ERR_OUT_OF_MEMORY);
    assert_non_null(strstr(err.message, "routed experts of 40 of 40 layers in host memory"));
    in = qwen36_experts(24 * GIB, LILY_N_CPU_MOE_AUTO);
    in.expert_layer_bytes = in.weight_bytes; /* 40 layers of it: more than the weights */
    assert_int_equal(lily_memory_plan_choose(&in, &p, &err), LILY_ERR_INVALID_ARGUMENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_24gib_defaults),
        cmocka_unit_test(test_large_card_takes_model_max),
        cmocka_unit_test(test_requested_ctx_shrinks_pool),
        cmocka_unit_test(test_requested_ctx_too_large_says_what_fits),
        cmocka_unit_test(test_small_budget_lowers_the_chunk),
        cmocka_unit_test(test_weights_over_budget),
        cmocka_unit_test(test_two_sessions),
        cmocka_unit_test(test_no_kv_takes_model_max),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_format_names_every_part),
        cmocka_unit_test(test_auto_moves_the_fewest_layers),
        cmocka_unit_test(test_auto_moves_none_when_it_fits),
        cmocka_unit_test(test_explicit_counts),
        cmocka_unit_test(test_auto_too_small_even_with_all_moved),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
