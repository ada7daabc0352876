/* test_synthetic.c — in-memory synthetic weights (model/synthetic.h): for tiny-a's shape every tensor
 * has the names, shapes, bits, strides and dtypes the loader binds from tests/data/tiny-a/mlx4; values
 * are the same whatever the thread count; dequantized weights are zero-mean with the documented std;
 * layer 0's router spreads a prompt over the experts (max/mean <= 3); and when the CPU backend is built,
 * a forward pass gives finite logits of O(1) scale. */
#include "test_support.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/clock.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/synthetic.h"
#include "model/weights.h"

static const size_t layer_fields[] = {
    offsetof(lily_layer_weights, input_norm),   offsetof(lily_layer_weights, post_attention_norm),
    offsetof(lily_layer_weights, q_proj),       offsetof(lily_layer_weights, k_proj),
    offsetof(lily_layer_weights, v_proj),       offsetof(lily_layer_weights, o_proj),
    offsetof(lily_layer_weights, q_norm),       offsetof(lily_layer_weights, k_norm),
    offsetof(lily_layer_weights, in_proj_qkv),  offsetof(lily_layer_weights, in_proj_z),
    offsetof(lily_layer_weights, in_proj_b),    offsetof(lily_layer_weights, in_proj_a),
    offsetof(lily_layer_weights, conv1d),       offsetof(lily_layer_weights, dt_bias),
    offsetof(lily_layer_weights, A_log),        offsetof(lily_layer_weights, gdn_norm),
    offsetof(lily_layer_weights, out_proj),     offsetof(lily_layer_weights, router),
    offsetof(lily_layer_weights, experts_gate), offsetof(lily_layer_weights, experts_up),
    offsetof(lily_layer_weights, experts_down), offsetof(lily_layer_weights, shared_gate),
    offsetof(lily_layer_weights, shared_up),    offsetof(lily_layer_weights, shared_down),
    offsetof(lily_layer_weights, shared_expert_gate),
};
#define N_LAYER_FIELDS (sizeof layer_fields / sizeof layer_fields[0])

static const lily_tensor *layer_tensor(const lily_weights *w, int layer, size_t field)
{
    return (const lily_tensor *)((const char *)&w->layers[layer] + layer_fields[field]);
}

static void assert_same_tensor(const lily_tensor *got, const lily_tensor *want)
{
    if (!want->data) {
        if (got->data)
            fail_msg("synthetic has %s, the fixture does not", got->name);
        return;
    }
    if (!got->data)
        fail_msg("synthetic lacks %s", want->name);
    if (strcmp(got->name, want->name))
        fail_msg("name %s, fixture %s", got->name, want->name);
    if (got->ndim != want->ndim || got->bits != want->bits || got->group_size != want->group_size ||
        got->dtype != want->dtype || (want->bits && got->scale_dtype != want->scale_dtype) ||
        got->expert_stride != want->expert_stride || got->row_bytes != want->row_bytes ||
        got->scale_row_bytes != want->scale_row_bytes)
        fail_msg("%s: ndim %d/%d bits %d/%d group %d/%d dtype %d/%d stride %lld/%lld row_bytes %lld/%lld "
                 "scale_row_bytes %lld/%lld (synthetic/fixture)",
                 want->name, got->ndim, want->ndim, got->bits, want->bits, got->group_size, want->group_size,
                 got->dtype, want->dtype, (long long)got->expert_stride, (long long)want->expert_stride,
                 (long long)got->row_bytes, (long long)want->row_bytes, (long long)got->scale_row_bytes,
                 (long long)want->scale_row_bytes);
    for (int d = 0; d < want->ndim; d++)
        if (got->shape[d] != want->shape[d])
            fail_msg("%s: shape[%d] %lld, fixture %lld", want->name, d, (long long)got->shape[d],
                     (long long)want->shape[d]);
}

static void test_synthetic_tiny_a_matches_loader_binding(void **state)
{
    (void)state;
    lily_error err = {0};
    lily_config cfg;
    lily_checkpoint ckpt;
    lily_weights w;
    const char *dir = test_data_path("tiny-a/mlx4");
    assert_int_equal(lily_config_load(dir, &cfg, &err), LILY_OK);
    assert_int_equal(lily_checkpoint_open(dir, &ckpt, &err), LILY_OK);
    assert_int_equal(lily_weights_bind(&cfg, &ckpt, &w, &err), LILY_OK);

    lily_synthetic *s = NULL;
    if (lily_synthetic_new("tiny-a", 1, 2, &s, &err) != LILY_OK)
        fail_msg("%s", err.message);
    const lily_config *c = &s->cfg;
    assert_int_equal(c->vocab_size, cfg.vocab_size);
    assert_int_equal(c->hidden, cfg.hidden);
    assert_int_equal(c->n_layers, cfg.n_layers);
    for (int i = 0; i < c->n_layers; i++)
        assert_int_equal(c->layer_types[i], cfg.layer_types[i]);
    assert_int_equal(c->n_heads, cfg.n_heads);
    assert_int_equal(c->n_kv_heads, cfg.n_kv_heads);
    assert_int_equal(c->head_dim, cfg.head_dim);
    assert_int_equal(c->rotary_dim, cfg.rotary_dim);
    assert_int_equal(c->gdn_n_key_heads, cfg.gdn_n_key_heads);
    assert_int_equal(c->gdn_n_value_heads, cfg.gdn_n_value_heads);
    assert_int_equal(c->gdn_key_head_dim, cfg.gdn_key_head_dim);
    assert_int_equal(c->gdn_value_head_dim, cfg.gdn_value_head_dim);
    assert_int_equal(c->gdn_conv_kernel, cfg.gdn_conv_kernel);
    assert_int_equal(c->n_experts, cfg.n_experts);
    assert_int_equal(c->n_experts_used, cfg.n_experts_used);
    assert_int_equal(c->moe_intermediate, cfg.moe_intermediate);
    assert_int_equal(c->shared_intermediate, cfg.shared_intermediate);
    assert_int_equal(c->quant_bits, cfg.quant_bits);
    assert_int_equal(c->quant_group_size, cfg.quant_group_size);
    assert_true(c->rope_theta == cfg.rope_theta && c->rms_norm_eps == cfg.rms_norm_eps);

    assert_int_equal(s->weights.layout, w.layout);
    assert_int_equal(s->weights.norms_zero_centred, w.norms_zero_centred);
    assert_int_equal(s->weights.quant_bits, w.quant_bits);
    assert_same_tensor(&s->weights.embed, &w.embed);
    assert_same_tensor(&s->weights.final_norm, &w.final_norm);
    assert_same_tensor(&s->weights.lm_head, &w.lm_head);
    for (int i = 0; i < c->n_layers; i++)
        for (size_t f = 0; f < N_LAYER_FIELDS; f++)
            assert_same_tensor(layer_tensor(&s->weights, i, f), layer_tensor(&w, i, f));

    lily_synthetic_free(s);
    lily_weights_free(&w);
    lily_checkpoint_close(&ckpt);
}

static void test_synthetic_same_values_any_thread_count(void **state)
{
    (void)state;
    lily_error err = {0};
    lily_synthetic *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(lily_synthetic_new("tiny-a", 5, 1, &a, &err), LILY_OK);
    assert_int_equal(lily_synthetic_new("tiny-a", 5, 3, &b, &err), LILY_OK);
    assert_int_equal(lily_synthetic_new("tiny-a", 6, 2, &c, &err), LILY_OK);
    assert_int_equal(a->buffer_size, b->buffer_size);
    assert_int_equal(memcmp(a->buffer, b->buffer, a->buffer_size), 0);
    assert_int_not_equal(memcmp(a->buffer, c->buffer, a->buffer_size), 0);
    lily_synthetic_free(a);
    lily_synthetic_free(b);
    lily_synthetic_free(c);
}

/* mean and std of every dequantized element of t */
static void tensor_stats(const lily_tensor *t, double *mean, double *std)
{
    int64_t experts = t->ndim == 3 ? t->shape[0] : 1, rows = lily_tensor_rows(t), cols = lily_tensor_cols(t);
    float *row = malloc((size_t)cols * sizeof *row);
    assert_non_null(row);
    double s = 0, q = 0;
    for (int64_t e = 0; e < experts; e++)
        for (int64_t r = 0; r < rows; r++) {
            lily_tensor_dequant_row(t, e, r, 0, cols, row);
            for (int64_t j = 0; j < cols; j++) {
                s += row[j];
                q += (double)row[j] * row[j];
            }
        }
    double n = (double)(experts * rows * cols);
    *mean = s / n;
    *std = sqrt(q / n - *mean * *mean);
    free(row);
}

/* Dequantized weights: zero mean, std 1/sqrt(in_features), output projections also / sqrt(2 n_layers). */
static void test_synthetic_weight_scale(void **state)
{
    (void)state;
    lily_error err = {0};
    lily_synthetic *s = NULL;
    assert_int_equal(lily_synthetic_new("tiny-a", 3, 2, &s, &err), LILY_OK);
    const double out_mul = 1.0 / sqrt(2.0 * s->cfg.n_layers);
    int checked = 0;
    for (int i = 0; i < s->cfg.n_layers; i++)
        for (size_t f = 0; f < N_LAYER_FIELDS; f++) {
            const lily_tensor *t = layer_tensor(&s->weights, i, f);
            if (!t->data || !t->bits)
                continue;
            int is_out = t == &s->weights.layers[i].o_proj || t == &s->weights.layers[i].out_proj ||
                         t == &s->weights.layers[i].experts_down || t == &s->weights.layers[i].shared_down;
            double want = (is_out ? out_mul : 1.0) / sqrt((double)lily_tensor_cols(t));
            double mean, std;
            tensor_stats(t, &mean, &std);
            /* one-row tensors (shared_expert_gate) have few elements: looser bounds */
            double tol = lily_tensor_rows(t) * (t->ndim == 3 ? t->shape[0] : 1) < 8 ? 0.25 : 0.08;
            if (fabs(std / want - 1) > tol || fabs(mean) > 0.1 * want)
                fail_msg("%s: mean %.4g std %.4g, expected mean 0 std %.4g", t->name, mean, std, want);
            checked++;
        }
    assert_true(checked > 30);
    lily_synthetic_free(s);
}

/* Layer 0's router on every token's embedding (RMS-normed twice with the stored norms, as the MoE
 * block sees it when the mixer adds little): top-k counts must be spread, max/mean <= 3. */
static void test_synthetic_router_spreads_tokens(void **state)
{
    (void)state;
    lily_error err = {0};
    lily_synthetic *s = NULL;
    assert_int_equal(lily_synthetic_new("tiny-a", 1, 2, &s, &err), LILY_OK);
    const lily_config *c = &s->cfg;
    const lily_layer_weights *L = &s->weights.layers[0];
    int H = c->hidden, E = c->n_experts, k = c->n_experts_used;
    float *x = malloc((size_t)H * sizeof *x), *nw = malloc((size_t)H * sizeof *nw), *gate = malloc((size_t)E * H * sizeof *gate);
    int *counts = calloc((size_t)E, sizeof *counts);
    assert_true(x && nw && gate && counts);
    for (int e = 0; e < E; e++)
        lily_tensor_dequant_row(&L->router, 0, e, 0, H, gate + (size_t)e * H);
    for (int tok = 0; tok < c->vocab_size; tok++) {
        lily_tensor_dequant_row(&s->weights.embed, 0, tok, 0, H, x);
        const lily_tensor *norms[2] = {&L->input_norm, &L->post_attention_norm};
        for (int n = 0; n < 2; n++) {
            lily_tensor_dequant_row(norms[n], 0, 0, 0, H, nw);
            double ss = 0;
            for (int j = 0; j < H; j++)
                ss += (double)x[j] * x[j];
            float inv = (float)(1.0 / sqrt(ss / H + c->rms_norm_eps));
            for (int j = 0; j < H; j++)
                x[j] = x[j] * inv * nw[j];
        }
        float logits[256];
        assert_true(E <= 256);
        for (int e = 0; e < E; e++) {
            double d = 0;
            for (int j = 0; j < H; j++)
                d += (double)x[j] * gate[(size_t)e * H + j];
            logits[e] = (float)d;
        }
        for (int r = 0; r < k; r++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (logits[e] > -1e30f && (best < 0 || logits[e] > logits[best]))
                    best = e;
            counts[best]++;
            logits[best] = -1e31f;
        }
    }
    int max = 0;
    for (int e = 0; e < E; e++)
        max = counts[e] > max ? counts[e] : max;
    double mean = (double)c->vocab_size * k / E;
    print_message("expert load over %d tokens: max %d, mean %.1f (%.2fx)\n", c->vocab_size, max, mean, max / mean);
    assert_true(max / mean <= 3.0);
    free(x);
    free(nw);
    free(gate);
    free(counts);
    lily_synthetic_free(s);
}

/* The tiny-a synthetic model for a test through the CPU backend; skips the test when that backend is not built. */
static lily_synthetic *tiny_a_on_cpu(void)
{
    const lily_backend_ops *ops = lily_backend_find("cpu");
    if (!ops || !ops->create) {
        print_message("skipped: the CPU backend is not built yet\n");
        skip();
    }
    lily_error err = {0};
    lily_synthetic *s = NULL;
    assert_int_equal(lily_synthetic_new("tiny-a", 1, 2, &s, &err), LILY_OK);
    return s;
}

/* A CPU backend on s with options bo, and in *st a state of 64 positions (the test fails on an error). */
static void cpu_open(const lily_synthetic *s, const lily_backend_options *bo, lily_backend *b, void **st)
{
    lily_error err = {0};
    if (lily_backend_create("cpu", &s->cfg, &s->weights, bo, b, &err) != LILY_OK)
        fail_msg("%s", err.message);
    *st = NULL;
    assert_int_equal(b->ops->state_new(b->ctx, 64, st, &err), LILY_OK);
}

/* Through the CPU backend (when built): finite logits with std in [0.3, 3] for 16 tokens. */
static void test_synthetic_forward_logits_are_finite(void **state)
{
    (void)state;
    lily_error err = {0};
    lily_synthetic *s = tiny_a_on_cpu();
    lily_backend b;
    const lily_backend_options bo = {.n_threads = 2, .max_chunk = 16};
    void *st;
    cpu_open(s, &bo, &b, &st);
    int32_t tokens[16];
    for (int i = 0; i < 16; i++)
        tokens[i] = (i * 97 + 13) % s->cfg.vocab_size;
    int V = s->cfg.vocab_size;
    float *logits = malloc((size_t)16 * V * sizeof *logits);
    assert_non_null(logits);
    assert_int_equal(b.ops->forward(b.ctx, st, tokens, 16, LILY_LOGITS_ALL, logits, &err), LILY_OK);
    double sum = 0, sq = 0;
    for (int i = 0; i < 16 * V; i++) {
        assert_true(isfinite(logits[i]));
        sum += logits[i];
        sq += (double)logits[i] * logits[i];
    }
    double mean = sum / (16.0 * V), std = sqrt(sq / (16.0 * V) - mean * mean);
    print_message("logits std %.3f\n", std);
    assert_true(std >= 0.3 && std <= 3.0);
    free(logits);
    b.ops->state_free(b.ctx, st);
    lily_backend_destroy(&b);
    lily_synthetic_free(s);
}

/* The CPU backend's stage profile (lily_backend_options.profile): after a prefill chunk and a decode step every
 * stage either model part runs has been counted, the stages add up to the time inside forward(), which is no
 * more than the wall time around the calls; taking the profile starts the sums again; without the option it is
 * empty. */
static void test_cpu_profile_stages_sum_to_forward_time(void **state)
{
    (void)state;
    lily_error err = {0};
    lily_synthetic *s = tiny_a_on_cpu();
    for (int on = 0; on < 2; on++) {
        lily_backend b;
        const lily_backend_options bo = {.n_threads = 2, .max_chunk = 32, .profile = on};
        void *st;
        cpu_open(s, &bo, &b, &st);
        assert_non_null(b.ops->profile_take);
        int32_t tokens[32];
        for (int i = 0; i < 32; i++)
            tokens[i] = (i * 97 + 13) % s->cfg.vocab_size;
        float *logits = malloc((size_t)s->cfg.vocab_size * sizeof *logits);
        assert_non_null(logits);
        const double t0 = lily_wall_seconds();
        assert_int_equal(b.ops->forward(b.ctx, st, tokens, 32, LILY_LOGITS_LAST, logits, &err), LILY_OK);
        assert_int_equal(b.ops->forward(b.ctx, st, tokens, 1, LILY_LOGITS_LAST, logits, &err), LILY_OK);
        const double wall = lily_wall_seconds() - t0;
        lily_stage_profile p;
        b.ops->profile_take(b.ctx, &p);
        if (!on) {
            assert_int_equal(p.n_stages, 0);
        } else {
            assert_true(p.n_stages > 0 && p.n_stages <= LILY_PROFILE_MAX_STAGES);
            assert_int_equal(p.forwards, 2);
            const char *must[] = {"embed", "gdn delta rule", "attn softmax(qk)v", "moe experts gate/up", "lm head"};
            for (size_t m = 0; m < sizeof must / sizeof must[0]; m++) {
                int found = 0;
                for (int i = 0; i < p.n_stages; i++)
                    if (!strcmp(p.names[i], must[m])) {
                        found = 1;
                        assert_true(p.calls[i] >= 2 && p.seconds[i] > 0);
                    }
                if (!found)
                    fail_msg("stage \"%s\" missing from the profile", must[m]);
            }
            double sum = 0;
            for (int i = 0; i < p.n_stages; i++) {
                assert_true(p.seconds[i] >= 0);
                sum += p.seconds[i];
            }
            print_message("stages %.3f ms, forward %.3f ms, wall %.3f ms\n", sum * 1e3, p.forward_seconds * 1e3,
                          wall * 1e3);
            assert_true(sum > 0 && sum <= p.forward_seconds + 1e-9 && p.forward_seconds <= wall);
            b.ops->profile_take(b.ctx, &p); /* the sums started again */
            assert_int_equal(p.forwards, 0);
            for (int i = 0; i < p.n_stages; i++)
                assert_true(p.calls[i] == 0 && p.seconds[i] == 0);
        }
        free(logits);
        b.ops->state_free(b.ctx, st);
        lily_backend_destroy(&b);
    }
    lily_synthetic_free(s);
}

/* Fast mode's values do not depend on the thread count: a 40-token prefill (every token's logits) and a decode
 * step on 1, 3 and 8 threads (the per-token glue in row blocks, the delta rule in value-column blocks, the
 * prefill attention in token blocks) give the same bits. */
static void test_cpu_fast_same_bits_any_thread_count(void **state)
{
    (void)state;
    lily_error err = {0};
    lily_synthetic *s = tiny_a_on_cpu();
    const int n = 40, V = s->cfg.vocab_size;
    float *ref = malloc((size_t)(n + 1) * V * sizeof *ref), *got = malloc((size_t)(n + 1) * V * sizeof *got);
    assert_true(ref && got);
    int32_t tokens[41];
    for (int i = 0; i < n + 1; i++)
        tokens[i] = (i * 131 + 7) % V;
    const int threads[] = {1, 3, 8};
    for (int ti = 0; ti < 3; ti++) {
        lily_backend b;
        const lily_backend_options bo = {.n_threads = threads[ti], .max_chunk = n};
        void *st;
        cpu_open(s, &bo, &b, &st);
        float *out = ti == 0 ? ref : got;
        assert_int_equal(b.ops->forward(b.ctx, st, tokens, n, LILY_LOGITS_ALL, out, &err), LILY_OK);
        assert_int_equal(b.ops->forward(b.ctx, st, tokens + n, 1, LILY_LOGITS_LAST, out + (size_t)n * V, &err), LILY_OK);
        if (ti > 0)
            assert_memory_equal(got, ref, (size_t)(n + 1) * V * sizeof *ref);
        b.ops->state_free(b.ctx, st);
        lily_backend_destroy(&b);
    }
    free(ref);
    free(got);
    lily_synthetic_free(s);
}

static void test_synthetic_rejects_unknown_preset(void **state)
{
    (void)state;
    lily_error err = {0};
    lily_synthetic *s = NULL;
    assert_int_equal(lily_synthetic_new("qwen9-1t", 1, 1, &s, &err), LILY_ERR_INVALID_ARGUMENT);
    assert_null(s);
    assert_non_null(strstr(err.message, "qwen9-1t"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_synthetic_tiny_a_matches_loader_binding),
        cmocka_unit_test(test_synthetic_same_values_any_thread_count),
        cmocka_unit_test(test_synthetic_weight_scale),
        cmocka_unit_test(test_synthetic_router_spreads_tokens),
        cmocka_unit_test(test_synthetic_forward_logits_are_finite),
        cmocka_unit_test(test_cpu_profile_stages_sum_to_forward_time),
        cmocka_unit_test(test_cpu_fast_same_bits_any_thread_count),
        cmocka_unit_test(test_synthetic_rejects_unknown_preset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
