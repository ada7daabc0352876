/* test_sampler.c — the sampler on fixed logits: greedy, cuts, penalties, seeds and the drawn distribution. */
#include "test_support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/philox.h"
#include "runtime/sampler.h"

static lily_sampler *make(const lily_sampler_params *p, int vocab)
{
    lily_sampler *s = NULL;
    lily_error err = {0};
    lily_status st = lily_sampler_new(p, vocab, &s, &err);
    if (st != LILY_OK)
        fail_msg("lily_sampler_new: %s", err.message);
    return s;
}

/* Four tokens with probabilities 0.15, 0.5, 0.05, 0.3 at temperature 1 (ids out of rank order). */
static void four_logits(float *logits)
{
    const double p[4] = {0.15, 0.5, 0.05, 0.3};
    for (int i = 0; i < 4; i++)
        logits[i] = (float)log(p[i]) + 3.0f; /* a shift changes nothing */
}

static void test_rng_matches_xoshiro256starstar_reference(void **state)
{
    (void)state;
    /* Reference outputs for state {1, 2, 3, 4}, from Blackman & Vigna's xoshiro256starstar.c
     * (as checked by the rand_xoshiro crate). */
    const uint64_t expected[10] = {11520ull, 0ull, 1509978240ull, 1215971899390074240ull,
                                   1216172134540287360ull, 607988272756665600ull, 16172922978634559625ull,
                                   8476171486693032832ull, 10595114339597558777ull, 2904607092377533576ull};
    lily_rng r = {{1, 2, 3, 4}};
    for (int i = 0; i < 10; i++)
        assert_true(lily_rng_next(&r) == expected[i]);
    lily_rng_seed(&r, 42);
    for (int i = 0; i < 1000; i++) {
        double u = lily_rng_uniform(&r);
        assert_true(u >= 0.0 && u < 1.0);
    }
}

static void test_greedy_picks_argmax_lowest_id_on_ties(void **state)
{
    (void)state;
    lily_sampler_params p = lily_sampler_defaults();
    p.temperature = 0.0f;
    lily_sampler *s = make(&p, 6);
    float logits[6] = {0.5f, -1.0f, 2.0f, 1.0f, 2.0f, NAN};
    for (int i = 0; i < 5; i++)
        assert_int_equal(lily_sampler_sample(s, logits), 2);
    logits[5] = 3.0f;
    assert_int_equal(lily_sampler_sample(s, logits), 5);
    lily_sampler_free(s);
}

static void test_top_k_1_equals_greedy(void **state)
{
    (void)state;
    enum { V = 1000 };
    float *logits = malloc(V * sizeof *logits);
    lily_rng r;
    lily_rng_seed(&r, 7);
    for (int i = 0; i < V; i++)
        logits[i] = (float)(lily_rng_uniform(&r) * 4.0);
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best])
            best = i;
    lily_sampler_params p = lily_sampler_defaults();
    p.top_k = 1;
    p.temperature = 1.5f;
    p.seed = 123;
    lily_sampler *s = make(&p, V);
    for (int i = 0; i < 50; i++)
        assert_int_equal(lily_sampler_sample(s, logits), best);
    lily_sampler_free(s);
    free(logits);
}

static int candidates(const lily_sampler_params *p, const float *logits, int vocab, int32_t *ids, float *probs);

static void test_tiny_temperature_is_greedy_and_negative_top_k_is_off(void **state)
{
    (void)state;
    float logits[4];
    four_logits(logits);
    int32_t ids[4];
    float probs[4];
    lily_sampler_params p = lily_sampler_defaults();
    p.temperature = 1e-7f;
    assert_int_equal(candidates(&p, logits, 4, ids, probs), 1);
    assert_int_equal(ids[0], 1);
    p = lily_sampler_defaults();
    p.top_k = -1;
    assert_int_equal(candidates(&p, logits, 4, ids, probs), 4);
}

/* top_p 0 (OpenAI's API takes it; lily run and serve too) keeps the most likely token alone: normalized to
 * greedy, whatever the temperature and seed; any other top_p is left as it is. */
static void test_top_p_zero_normalizes_to_greedy(void **state)
{
    (void)state;
    float logits[4];
    four_logits(logits);
    int32_t ids[4];
    float probs[4];
    lily_sampler_params p = lily_sampler_defaults();
    p.temperature = 1.5f;
    p.top_p = 0.0f;
    p.top_k = 3;
    p.seed = 99;
    lily_sampler_params n = lily_sampler_params_normalize(p);
    assert_true(n.temperature == 0.0f && n.top_p == 1.0f && n.top_k == 3 && n.seed == 99);
    assert_int_equal(candidates(&n, logits, 4, ids, probs), 1);
    assert_int_equal(ids[0], 1);
    p.top_p = 0.5f;
    n = lily_sampler_params_normalize(p);
    assert_true(n.temperature == 1.5f && n.top_p == 0.5f);
}

static int candidates(const lily_sampler_params *p, const float *logits, int vocab, int32_t *ids, float *probs)
{
    lily_sampler *s = make(p, vocab);
    int n = lily_sampler_candidates(s, logits, ids, probs);
    lily_sampler_free(s);
    return n;
}

static void test_top_p_keeps_smallest_set_reaching_p(void **state)
{
    (void)state;
    float logits[4];
    four_logits(logits);
    int32_t ids[4];
    float probs[4];
    lily_sampler_params p = lily_sampler_defaults();

    int n = candidates(&p, logits, 4, ids, probs); /* no cut: all four, ranked */
    assert_int_equal(n, 4);
    const int32_t rank[4] = {1, 3, 0, 2};
    const float rank_p[4] = {0.5f, 0.3f, 0.15f, 0.05f};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ids[i], rank[i]);
        assert_float_equal(probs[i], rank_p[i], 1e-6);
    }

    p.top_p = 0.7f; /* 0.5 < 0.7 <= 0.8 */
    n = candidates(&p, logits, 4, ids, probs);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    assert_float_equal(probs[0], 0.625f, 1e-6);
    assert_float_equal(probs[1], 0.375f, 1e-6);

    p.top_p = 0.85f; /* 0.8 < 0.85 <= 0.95 */
    n = candidates(&p, logits, 4, ids, probs);
    assert_int_equal(n, 3);
    assert_int_equal(ids[2], 0);
    assert_float_equal(probs[2], 0.15f / 0.95f, 1e-6);

    p.top_p = 0.4f; /* the top token alone */
    n = candidates(&p, logits, 4, ids, probs);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 1);
    assert_float_equal(probs[0], 1.0f, 0);
}

static void test_top_p_is_over_the_top_k_set(void **state)
{
    (void)state;
    float logits[4];
    four_logits(logits);
    int32_t ids[4];
    float probs[4];
    lily_sampler_params p = lily_sampler_defaults();
    p.top_k = 2; /* {0.5, 0.3} renormalized: 0.625, 0.375 */
    int n = candidates(&p, logits, 4, ids, probs);
    assert_int_equal(n, 2);
    assert_float_equal(probs[0], 0.625f, 1e-6);
    p.top_p = 0.6f; /* 0.625 >= 0.6 over the top-k set (it would be 0.5 < 0.6 over the full vocab) */
    n = candidates(&p, logits, 4, ids, probs);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 1);
    p.top_k = 3; /* {0.5, 0.3, 0.15} / 0.95: 0.526 < 0.6 -> two tokens */
    n = candidates(&p, logits, 4, ids, probs);
    assert_int_equal(n, 2);
}

static void test_min_p_keeps_tokens_above_fraction_of_max(void **state)
{
    (void)state;
    float logits[4];
    four_logits(logits);
    int32_t ids[4];
    float probs[4];
    lily_sampler_params p = lily_sampler_defaults();
    p.min_p = 0.25f; /* p >= 0.125: 0.5, 0.3, 0.15 */
    int n = candidates(&p, logits, 4, ids, probs);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 0);
    assert_float_equal(probs[1], 0.3f / 0.95f, 1e-6);
    p.min_p = 0.5f; /* p >= 0.25: 0.5, 0.3 */
    n = candidates(&p, logits, 4, ids, probs);
    assert_int_equal(n, 2);
    p.min_p = 0.61f; /* p >= 0.305: the top token only */
    n = candidates(&p, logits, 4, ids, probs);
    assert_int_equal(n, 1);
    /* temperature 2 flattens: p ~ sqrt(p), max sqrt(.5)=.707; 0.25 * .707 = .177 keeps sqrt(.05)=.224 too */
    p.temperature = 2.0f;
    p.min_p = 0.25f;
    n = candidates(&p, logits, 4, ids, probs);
    assert_int_equal(n, 4);
}

static void test_penalties_change_logits_by_exact_amounts(void **state)
{
    (void)state;
    lily_sampler_params p = lily_sampler_defaults();
    p.repetition_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    const lily_logit_bias bias[2] = {{4, -1.0f}, {5, 8.0f}};
    p.logit_bias = bias;
    p.n_logit_bias = 2;
    lily_sampler *s = make(&p, 8);
    lily_error err = {0};
    const int32_t prompt[3] = {0, 1, 0};
    assert_int_equal(lily_sampler_add_context(s, prompt, 3, &err), LILY_OK);
    const int32_t generated[4] = {2, 2, 3, 4};
    for (int i = 0; i < 4; i++)
        assert_int_equal(lily_sampler_accept(s, generated[i], &err), LILY_OK);

    const float logits[8] = {2.0f, -2.0f, 1.0f, 0.5f, 3.0f, 0.0f, 1.0f, -1.0f};
    float out[8];
    lily_sampler_apply_penalties(s, logits, out);
    /* id 0: prompt only, repetition: 2 / 2 */
    assert_true(out[0] == 1.0f);
    /* id 1: prompt only, negative: -2 * 2 */
    assert_true(out[1] == -4.0f);
    /* id 2: generated twice: 1/2 - 0.5 - 2 * 0.25 */
    assert_true(out[2] == -0.5f);
    /* id 3: generated once: 0.5/2 - 0.5 - 0.25 */
    assert_true(out[3] == -0.5f);
    /* id 4: bias first (3 - 1 = 2), then repetition (1), then presence + frequency (1 - 0.75) */
    assert_true(out[4] == 0.25f);
    /* id 5: bias only */
    assert_true(out[5] == 8.0f);
    /* untouched */
    assert_true(out[6] == 1.0f && out[7] == -1.0f);

    /* reset forgets the history but keeps the bias */
    lily_sampler_reset(s);
    lily_sampler_apply_penalties(s, logits, out);
    assert_true(out[0] == 2.0f && out[2] == 1.0f && out[4] == 2.0f && out[5] == 8.0f);

    /* an accepted id outside the vocab is an error, not a write out of bounds */
    assert_int_equal(lily_sampler_accept(s, 8, &err), LILY_ERR_INVALID_ARGUMENT);
    lily_sampler_free(s);
}

static void test_logit_bias_bans_and_forces_under_greedy(void **state)
{
    (void)state;
    lily_sampler_params p = lily_sampler_defaults();
    p.temperature = 0.0f;
    const lily_logit_bias bias[1] = {{1, -100.0f}};
    p.logit_bias = bias;
    p.n_logit_bias = 1;
    float logits[4];
    four_logits(logits);
    lily_sampler *s = make(&p, 4);
    assert_int_equal(lily_sampler_sample(s, logits), 3);
    lily_sampler_free(s);
}

static void test_bad_params_are_rejected(void **state)
{
    (void)state;
    lily_sampler *s = NULL;
    lily_error err = {0};
    lily_sampler_params p = lily_sampler_defaults();
    p.top_p = 0.0f;
    assert_int_equal(lily_sampler_new(&p, 10, &s, &err), LILY_ERR_INVALID_ARGUMENT);
    p = lily_sampler_defaults();
    p.temperature = -1.0f;
    assert_int_equal(lily_sampler_new(&p, 10, &s, &err), LILY_ERR_INVALID_ARGUMENT);
    p = lily_sampler_defaults();
    const lily_logit_bias bias[1] = {{10, 1.0f}};
    p.logit_bias = bias;
    p.n_logit_bias = 1;
    assert_int_equal(lily_sampler_new(&p, 10, &s, &err), LILY_ERR_INVALID_ARGUMENT);
    assert_null(s);
}

static void test_same_seed_same_sequence(void **state)
{
    (void)state;
    enum { V = 5000, N = 300 };
    float *logits = malloc(V * sizeof *logits);
    lily_rng r;
    lily_rng_seed(&r, 99);
    for (int i = 0; i < V; i++)
        logits[i] = (float)(lily_rng_uniform(&r) * 6.0);
    lily_sampler_params p = lily_sampler_defaults();
    p.temperature = 0.8f;
    p.top_p = 0.95f;
    p.presence_penalty = 0.3f;
    p.seed = 2026;
    lily_sampler *a = make(&p, V), *b = make(&p, V);
    p.seed = 2027;
    lily_sampler *c = make(&p, V);
    int32_t first[N];
    int differ = 0;
    lily_error err = {0};
    for (int i = 0; i < N; i++) {
        int32_t ta = lily_sampler_sample(a, logits), tb = lily_sampler_sample(b, logits);
        int32_t tc = lily_sampler_sample(c, logits);
        assert_int_equal(ta, tb);
        differ += ta != tc;
        first[i] = ta;
        assert_int_equal(lily_sampler_accept(a, ta, &err), LILY_OK);
        assert_int_equal(lily_sampler_accept(b, tb, &err), LILY_OK);
        assert_int_equal(lily_sampler_accept(c, tc, &err), LILY_OK);
    }
    assert_true(differ > N / 2);
    /* reset reseeds: the same sequence again */
    lily_sampler_reset(a);
    for (int i = 0; i < N; i++) {
        int32_t t = lily_sampler_sample(a, logits);
        assert_int_equal(t, first[i]);
        assert_int_equal(lily_sampler_accept(a, t, &err), LILY_OK);
    }
    lily_sampler_free(a);
    lily_sampler_free(b);
    lily_sampler_free(c);
    free(logits);
}

/* Draw N times; every frequency must be within 5 standard errors of the expected probability. */
static void check_frequencies(const lily_sampler_params *p, const float *logits, int vocab, const double *expect)
{
    enum { N = 100000 };
    lily_sampler *s = make(p, vocab);
    int *count = calloc((size_t)vocab, sizeof *count);
    for (int i = 0; i < N; i++) {
        int32_t t = lily_sampler_sample(s, logits);
        assert_true(t >= 0 && t < vocab);
        count[t]++;
    }
    for (int i = 0; i < vocab; i++) {
        double f = (double)count[i] / N;
        double se = sqrt(expect[i] * (1.0 - expect[i]) / N);
        if (fabs(f - expect[i]) > 5.0 * se + 1e-9)
            fail_msg("token %d: frequency %.5f, expected %.5f (se %.5f)", i, f, expect[i], se);
    }
    free(count);
    lily_sampler_free(s);
}

static void test_draws_follow_softmax(void **state)
{
    (void)state;
    enum { V = 8 };
    const float logits[V] = {1.0f, 0.0f, -1.0f, 2.0f, 0.5f, -3.0f, 1.5f, 0.25f};
    double expect[V], z = 0.0;
    lily_sampler_params p = lily_sampler_defaults();
    p.seed = 5;
    for (int t = 0; t < 2; t++) {
        p.temperature = t == 0 ? 1.0f : 0.7f;
        z = 0.0;
        for (int i = 0; i < V; i++)
            z += expect[i] = exp(logits[i] / p.temperature);
        for (int i = 0; i < V; i++)
            expect[i] /= z;
        check_frequencies(&p, logits, V, expect);
    }
    /* top-k 3 at temperature 1: ids 3, 6, 0 renormalized */
    p.temperature = 1.0f;
    p.top_k = 3;
    z = exp(2.0) + exp(1.5) + exp(1.0);
    for (int i = 0; i < V; i++)
        expect[i] = 0.0;
    expect[3] = exp(2.0) / z;
    expect[6] = exp(1.5) / z;
    expect[0] = exp(1.0) / z;
    check_frequencies(&p, logits, V, expect);
}

/* On a Qwen-sized vocab, the windowed top-p gather and the heap top-k give exactly the sets a full sort
 * gives. */
static int compare_desc(const void *a, const void *b)
{
    const double *x = a, *y = b;
    return x[0] > y[0] ? -1 : x[0] < y[0] ? 1 : (x[1] < y[1] ? -1 : 1);
}

static void test_large_vocab_cuts_match_full_sort(void **state)
{
    (void)state;
    enum { V = 248320 };
    float *logits = malloc(V * sizeof *logits);
    double *sorted = malloc(2 * V * sizeof *sorted);
    int32_t *ids = malloc(V * sizeof *ids);
    float *probs = malloc(V * sizeof *probs);
    lily_rng r;
    lily_rng_seed(&r, 11);
    for (int i = 0; i < V; i++) /* roughly Gaussian, std 2.5, plus a few strong tokens */
        logits[i] = (float)((lily_rng_uniform(&r) + lily_rng_uniform(&r) + lily_rng_uniform(&r) - 1.5) * 5.0);
    logits[17] = 14.0f;
    logits[99999] = 13.5f;
    logits[200000] = 12.0f;
    for (int i = 0; i < V; i++) {
        sorted[2 * i] = logits[i];
        sorted[2 * i + 1] = i;
    }
    qsort(sorted, V, 2 * sizeof *sorted, compare_desc);
    double total = 0.0;
    for (int i = 0; i < V; i++)
        total += exp(sorted[2 * i] - sorted[0]);

    const float top_ps[3] = {0.5f, 0.9f, 0.99f};
    for (int t = 0; t < 3; t++) {
        lily_sampler_params p = lily_sampler_defaults();
        p.top_p = top_ps[t];
        int expect_n = 0;
        double cum = 0.0;
        while (cum < p.top_p * total)
            cum += exp(sorted[2 * expect_n++] - sorted[0]);
        int n = candidates(&p, logits, V, ids, probs);
        assert_int_equal(n, expect_n);
        for (int i = 0; i < n; i++)
            assert_int_equal(ids[i], (int32_t)sorted[2 * i + 1]);
    }
    lily_sampler_params p = lily_sampler_defaults();
    p.top_k = 40;
    int n = candidates(&p, logits, V, ids, probs);
    assert_int_equal(n, 40);
    for (int i = 0; i < n; i++)
        assert_int_equal(ids[i], (int32_t)sorted[2 * i + 1]);
    free(logits);
    free(sorted);
    free(ids);
    free(probs);
}

/* Philox4x32-10 against the published known-answer vectors (Random123's kat_vectors: counter and key all
 * zero, all ones, and the digits of pi). */
static void test_philox_known_answers(void **state)
{
    (void)state;
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
        {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
         {0xffffffffu, 0xffffffffu},
         {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
        {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
         {0xa4093822u, 0x299f31d0u},
         {0xd16cfe09u, 0x94fdcceBu, 0x5001e420u, 0x24126ea1u}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        lily_philox_block c = {{kat[i].ctr[0], kat[i].ctr[1], kat[i].ctr[2], kat[i].ctr[3]}};
        lily_philox_block r = lily_philox4x32_10(c, kat[i].key[0], kat[i].key[1]);
        for (int k = 0; k < 4; k++)
            assert_int_equal(r.v[k], kat[i].out[k]);
    }
    /* the uniform is strictly inside (0, 1), and the noise a pure function of (seed, draw, token) */
    double lo = 1.0, hi = 0.0;
    for (uint32_t t = 0; t < 10000; t++) {
        const double u = lily_philox_uniform(42, 7, t);
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
    }
    assert_true(lo > 0.0 && lo < 0.001 && hi < 1.0 && hi > 0.999);
    assert_true(lily_gumbel_noise(42, 7, 3) == lily_gumbel_noise(42, 7, 3));
    assert_true(lily_gumbel_noise(42, 7, 3) != lily_gumbel_noise(42, 8, 3));
    assert_true(lily_gumbel_noise(42, 7, 3) != lily_gumbel_noise(43, 7, 3));
}

/* A draw is a function of (seed, draw index, logits, history): setting the draw index reproduces a draw
 * made elsewhere (the device loop), and the draw equals the Gumbel-max over the candidate set computed
 * by hand from the public pieces. */
static void test_draw_index_and_gumbel_max(void **state)
{
    (void)state;
    enum { V = 3000, N = 200 };
    float *logits = malloc(V * sizeof *logits);
    lily_rng r;
    lily_rng_seed(&r, 5);
    for (int i = 0; i < V; i++)
        logits[i] = (float)(lily_rng_uniform(&r) * 8.0);
    lily_sampler_params p = lily_sampler_defaults();
    p.temperature = 0.7f;
    p.top_p = 0.9f;
    p.seed = 77;
    lily_sampler *a = make(&p, V), *b = make(&p, V);
    int32_t *ids = malloc(V * sizeof *ids);
    float *probs = malloc(V * sizeof *probs);
    int32_t seq[N];
    for (int i = 0; i < N; i++) {
        assert_true(lily_sampler_draw_index(a) == (uint64_t)i);
        seq[i] = lily_sampler_sample(a, logits);
        /* by hand: the candidates' z = logit / T (no penalties here) plus the noise, the largest wins */
        const int n = lily_sampler_candidates(b, logits, ids, probs);
        int32_t best = -1;
        double best_key = -INFINITY;
        for (int k = 0; k < n; k++) {
            const double key = (double)(logits[ids[k]] * (1.0f / p.temperature)) +
                               lily_gumbel_noise(p.seed, (uint64_t)i, (uint32_t)ids[k]);
            if (key > best_key || (key == best_key && ids[k] < best)) {
                best_key = key;
                best = ids[k];
            }
        }
        assert_int_equal(seq[i], best);
    }
    /* draws 150..199 again, out of order, after moving the index */
    for (int i = N - 1; i >= 150; i--) {
        lily_sampler_set_draw_index(b, (uint64_t)i);
        assert_int_equal(lily_sampler_sample(b, logits), seq[i]);
    }
    lily_sampler_free(a);
    lily_sampler_free(b);
    free(ids);
    free(probs);
    free(logits);
}

/* lily_sampler_history: the distinct context tokens in first-seen order with their generated counts. */
static void test_history_export(void **state)
{
    (void)state;
    lily_sampler_params p = lily_sampler_defaults();
    p.presence_penalty = 1.0f;
    lily_sampler *s = make(&p, 50);
    lily_error err = {0};
    const int32_t prompt[] = {4, 9, 4, 60, 12}; /* 60: outside the vocab, ignored */
    assert_int_equal(lily_sampler_add_context(s, prompt, 5, &err), LILY_OK);
    assert_int_equal(lily_sampler_accept(s, 9, &err), LILY_OK);
    assert_int_equal(lily_sampler_accept(s, 30, &err), LILY_OK);
    assert_int_equal(lily_sampler_accept(s, 9, &err), LILY_OK);
    int32_t ids[50];
    uint32_t counts[50];
    assert_int_equal(lily_sampler_history(s, NULL, NULL), 4);
    assert_int_equal(lily_sampler_history(s, ids, counts), 4);
    const int32_t want_ids[] = {4, 9, 12, 30};
    const uint32_t want_counts[] = {0, 2, 0, 1};
    assert_memory_equal(ids, want_ids, sizeof want_ids);
    assert_memory_equal(counts, want_counts, sizeof want_counts);
    lily_sampler_reset(s);
    assert_int_equal(lily_sampler_history(s, NULL, NULL), 0);
    assert_true(lily_sampler_draw_index(s) == 0);
    lily_sampler_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rng_matches_xoshiro256starstar_reference),
        cmocka_unit_test(test_greedy_picks_argmax_lowest_id_on_ties),
        cmocka_unit_test(test_top_k_1_equals_greedy),
        cmocka_unit_test(test_tiny_temperature_is_greedy_and_negative_top_k_is_off),
        cmocka_unit_test(test_top_p_keeps_smallest_set_reaching_p),
        cmocka_unit_test(test_top_p_is_over_the_top_k_set),
        cmocka_unit_test(test_top_p_zero_normalizes_to_greedy),
        cmocka_unit_test(test_min_p_keeps_tokens_above_fraction_of_max),
        cmocka_unit_test(test_penalties_change_logits_by_exact_amounts),
        cmocka_unit_test(test_logit_bias_bans_and_forces_under_greedy),
        cmocka_unit_test(test_bad_params_are_rejected),
        cmocka_unit_test(test_same_seed_same_sequence),
        cmocka_unit_test(test_draws_follow_softmax),
        cmocka_unit_test(test_large_vocab_cuts_match_full_sort),
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_draw_index_and_gumbel_max),
        cmocka_unit_test(test_history_export),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
