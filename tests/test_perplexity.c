/* test_perplexity.c — teacher-forced perplexity (runtime/perplexity.h) on tiny-a mlx4 against the value
 * computed here from the reference logits (tests/data/tiny-a/reference.safetensors, case5, 300 tokens,
 * transformers' forward pass): within 1e-3 relative; against the same logits as a reference run, top-1
 * agreement 1 and KL ~ 0; windowing counts; and the argument checks. */
#include "test_support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"
#include "runtime/engine.h"
#include "runtime/perplexity.h"

typedef struct {
    uint8_t *file;
    lily_st_tensor *tensors;
    int n_tensors;
    const int32_t *tokens;
    int n;
    const float *logits; /* [n, vocab] */
} reference;

static void load_reference(reference *r, const char *case_name)
{
    size_t len = 0;
    memset(r, 0, sizeof *r);
    r->file = (uint8_t *)test_read_file(test_data_path("tiny-a/reference.safetensors"), &len);
    assert_non_null(r->file);
    lily_error err = {0};
    if (lily_st_parse(r->file, len, &r->tensors, &r->n_tensors, &err) != LILY_OK)
        fail_msg("%s", err.message);
    char tok_name[64], logit_name[64];
    snprintf(tok_name, sizeof tok_name, "%s.tokens", case_name);
    snprintf(logit_name, sizeof logit_name, "%s.logits.mlx4", case_name);
    for (int i = 0; i < r->n_tensors; i++) {
        if (!strcmp(r->tensors[i].name, tok_name)) {
            r->tokens = r->tensors[i].data;
            r->n = (int)r->tensors[i].shape[0];
        } else if (!strcmp(r->tensors[i].name, logit_name)) {
            r->logits = r->tensors[i].data;
        }
    }
    assert_non_null(r->tokens);
    assert_non_null(r->logits);
}

static void free_reference(reference *r)
{
    lily_st_tensors_free(r->tensors, r->n_tensors);
    free(r->file);
}

/* exp(mean -log softmax(logits_i)[tokens[i+1]]) over one window, straight from the definition. */
static double expected_perplexity(const reference *r, int vocab)
{
    double nll = 0;
    for (int i = 0; i + 1 < r->n; i++) {
        const float *row = r->logits + (size_t)i * vocab;
        double m = row[0];
        for (int j = 1; j < vocab; j++)
            m = row[j] > m ? row[j] : m;
        double s = 0;
        for (int j = 0; j < vocab; j++)
            s += exp(row[j] - m);
        nll += m + log(s) - row[r->tokens[i + 1]];
    }
    return exp(nll / (r->n - 1));
}

typedef struct {
    lily_engine *engine;
    lily_session *session;
} model;

static void open_model(model *m, int max_ctx)
{
    lily_error err = {0};
    lily_engine_options eo = {.model_dir = test_data_path("tiny-a/mlx4"), .backend = "cpu", .n_threads = 2,
                              .exact = true}; /* the reference's logits to ~1e-5 */
    if (lily_engine_open(&eo, &m->engine, &err) != LILY_OK)
        fail_msg("%s", err.message);
    if (lily_session_new(m->engine, max_ctx, &m->session, &err) != LILY_OK)
        fail_msg("%s", err.message);
}

static void close_model(model *m)
{
    lily_session_free(m->session);
    lily_engine_close(m->engine);
}

static void test_perplexity_matches_reference_logits(void **state)
{
    (void)state;
    reference r;
    load_reference(&r, "case5");
    model m;
    open_model(&m, 512);
    int vocab = m.engine->cfg.vocab_size;
    double want = expected_perplexity(&r, vocab);

    lily_error err = {0};
    lily_perplexity_result res;
    lily_perplexity_options po = {.ctx = r.n, .chunk = 37, .ref_logits = r.logits, .ref_rows = r.n};
    if (lily_perplexity_run(m.session, r.tokens, r.n, &po, &res, &err) != LILY_OK)
        fail_msg("%s", err.message);
    print_message("perplexity %.6f, from the reference logits %.6f; top-1 %.4f, KL mean %.3g max %.3g\n",
                  res.perplexity, want, res.top1_agreement, res.kl_mean, res.kl_max);
    assert_int_equal(res.n_windows, 1);
    assert_int_equal(res.n_scored, r.n - 1);
    if (fabs(res.perplexity / want - 1) > 1e-3)
        fail_msg("perplexity %.6f vs %.6f from the reference logits", res.perplexity, want);
    /* the reference's own perplexity is the same definition on the same logits */
    assert_true(fabs(res.ref_perplexity / want - 1) < 1e-9);
    assert_int_equal(res.n_compared, r.n);
    assert_true(res.top1_agreement == 1.0);
    assert_true(res.kl_mean < 1e-6 && res.kl_max < 1e-5);
    close_model(&m);
    free_reference(&r);
}

/* Windows of 64 over 300 tokens: 5 windows, the first token of each is context only. */
static void test_perplexity_windows(void **state)
{
    (void)state;
    reference r;
    load_reference(&r, "case5");
    model m;
    open_model(&m, 64);
    lily_error err = {0};
    lily_perplexity_result res;
    lily_perplexity_options po = {.ctx = 64};
    assert_int_equal(lily_perplexity_run(m.session, r.tokens, r.n, &po, &res, &err), LILY_OK);
    assert_int_equal(res.n_windows, 5);
    assert_int_equal(res.n_scored, r.n - 5);
    assert_int_equal(res.n_compared, 0);
    assert_true(isfinite(res.perplexity) && res.perplexity > 1);
    /* a window longer than the session is refused */
    po.ctx = 65;
    assert_int_equal(lily_perplexity_run(m.session, r.tokens, r.n, &po, &res, &err), LILY_ERR_INVALID_ARGUMENT);
    int32_t bad[2] = {1, 99999};
    po.ctx = 2;
    assert_int_equal(lily_perplexity_run(m.session, bad, 2, &po, &res, &err), LILY_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "99999"));
    close_model(&m);
    free_reference(&r);
}

static void test_logsumexp_and_argmax(void **state)
{
    (void)state;
    float v[4] = {1000.0f, 1000.0f, -5.0f, 999.0f};
    double want = 1000.0 + log(2.0 + exp(-1005.0) + exp(-1.0));
    assert_true(fabs(lily_logsumexp(v, 4) - want) < 1e-9);
    assert_int_equal(lily_argmax(v, 4), 0); /* lowest index on ties */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_perplexity_matches_reference_logits),
        cmocka_unit_test(test_perplexity_windows),
        cmocka_unit_test(test_logsumexp_and_argmax),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
