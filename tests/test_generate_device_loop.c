/* test_generate_device_loop.c — lily_generate's device loop (generate.h) against its host sampler, on the
 * real CPU engine (tests/data/tiny-a/mlx4) with a test-only decode_loop op.
 *
 * The shim: the CPU backend's ops plus a decode_loop that runs forward() one token at a time and picks
 * the next token itself with what backend.h's lily_device_sampling hands a device (the settings, the
 * penalty history, the draw index), like a device would. It runs `g_ahead` steps past the tokens it has delivered, as the CUDA loop keeps steps
 * queued, so a stop inside a batch finds the state ahead of the stop and generate must undo those steps.
 * With a token mask (constrained decoding) step k samples only once the mask of step k was published (so
 * it runs one step ahead), and a stop releases the queued steps unconstrained, as the CUDA loop's abort.
 *
 * Every case runs the same parameters through both paths and asserts equal results: the streamed ids and
 * text, the finish fields and counts, the session's token ids, its last logits and its backend state
 * (bit for bit: state_save bytes), and a follow-up turn on each session that continues identically. */
#include "test_support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/logprobs.h"
#include "runtime/sampler.h"
#include "test_fake_detok.h"
#include "test_toy_constraint.h"

/* ---- the shim backend ------------------------------------------------------------------------------ */

static lily_backend_ops g_shim_ops;
static int g_vocab;
static int g_ahead;        /* steps the fake device runs past the last token it delivered */
static int g_loop_calls;   /* decode_loop calls */
static bool g_decline;     /* decode_loop answers LILY_ERR_UNSUPPORTED (as CUDA with a debug hook) */
static int g_fail_call;    /* this decode_loop call (1-based; 0 = none) fails after delivering 2 tokens */

/* The device's sampler, mirrored: runtime/sampler.h set up from the decode_loop settings (its penalty
 * history, its logit bias), drawing step k with draw index draw0 + k and counting each token it chooses,
 * as the CUDA sampler does. Errors: the sampler's. */
static lily_status shim_sampler(const lily_device_sampling *ds, lily_sampler **out, lily_error *err)
{
    lily_sampler_params sp = lily_sampler_defaults();
    sp.temperature = ds->temperature;
    sp.top_k = ds->top_k;
    sp.top_p = ds->top_p;
    sp.min_p = ds->min_p;
    sp.presence_penalty = ds->presence_penalty;
    sp.frequency_penalty = ds->frequency_penalty;
    sp.repetition_penalty = ds->repetition_penalty;
    sp.seed = ds->seed;
    lily_logit_bias bias[16];
    assert_true(ds->n_bias <= 16);
    for (int i = 0; i < ds->n_bias; i++)
        bias[i] = (lily_logit_bias){ds->bias_ids[i], ds->bias_values[i]};
    sp.logit_bias = bias;
    sp.n_logit_bias = ds->n_bias;
    lily_status st = lily_sampler_new(&sp, g_vocab, out, err);
    if (st != LILY_OK)
        return st;
    st = lily_sampler_add_context(*out, ds->history_ids, ds->n_history, err);
    for (int i = 0; i < ds->n_history && st == LILY_OK; i++)
        for (uint32_t k = 0; k < ds->history_counts[i] && st == LILY_OK; k++)
            st = lily_sampler_accept(*out, ds->history_ids[i], err);
    return st;
}

static lily_status shim_decode_loop(void *ctx, void *state, int32_t first_token, int n,
                                    const lily_device_sampling *ds, lily_decode_token_fn on_token, void *user,
                                    float *last_logits, int *n_run, lily_error *err)
{
    const lily_backend_ops *cpu = &lily_cpu_backend_ops;
    *n_run = 0;
    if (n < 1)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "shim: %d steps", n);
    if (g_decline)
        return lily_error_set(err, LILY_ERR_UNSUPPORTED, "shim: declined");
    float *logits = malloc((size_t)g_vocab * sizeof(float));
    int32_t *chosen = malloc((size_t)n * sizeof(int32_t));
    lily_token_logprobs *lps = malloc((size_t)n * sizeof *lps);
    lily_sampler *sampler = NULL;
    lily_status st = LILY_OK;
    if (!logits || !chosen || !lps)
        st = lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "shim: out of memory");
    else
        st = shim_sampler(ds, &sampler, err);
    g_loop_calls++;
    int run = 0, delivered = 0, published = 0;
    bool stop = false, all = true;
    int32_t token = first_token;
    uint32_t *bits = calloc((size_t)(g_vocab + 31) / 32, sizeof *bits);
    float *masked = malloc((size_t)g_vocab * sizeof(float));
    if (st == LILY_OK && (!bits || !masked))
        st = lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "shim: out of memory");
    if (st == LILY_OK && ds->token_mask) {
        all = !ds->token_mask(ds->mask_user, 0, bits);
        published = 1;
    }
    while (st == LILY_OK && !stop && delivered < n) {
        if (run < n && run - delivered <= g_ahead && (!ds->token_mask || run < published)) { /* the device runs on */
            st = cpu->forward(ctx, state, &token, 1, LILY_LOGITS_LAST, logits, err);
            if (st != LILY_OK)
                break;
            lily_sampler_set_draw_index(sampler, ds->draw0 + (uint64_t)run);
            memcpy(masked, logits, (size_t)g_vocab * sizeof(float));
            if (ds->token_mask && !all)
                for (int v = 0; v < g_vocab; v++)
                    if (!((bits[v >> 5] >> (v & 31)) & 1u))
                        masked[v] = -INFINITY;
            token = lily_sampler_sample(sampler, masked);
            if ((st = lily_sampler_accept(sampler, token, err)) != LILY_OK)
                break;
            if (ds->top_logprobs >= 0)
                lily_logprobs_compute(logits, g_vocab, token, ds->top_logprobs, &lps[run]);
            chosen[run++] = token;
        } else { /* the host sees the next token */
            stop = on_token && on_token(user, chosen[delivered], delivered,
                                        ds->top_logprobs >= 0 ? &lps[delivered] : NULL) != 0;
            delivered++;
            if (!stop && ds->token_mask && delivered < n) {
                all = !ds->token_mask(ds->mask_user, delivered, bits);
                published = delivered + 1;
            }
            if (g_fail_call == g_loop_calls && delivered == 2) {
                st = lily_error_set(err, LILY_ERR_BACKEND, "shim: injected failure");
                break;
            }
        }
    }
    /* the steps queued behind a constrained one run on when the host stops (unconstrained) */
    for (int k = 0; st == LILY_OK && stop && ds->token_mask && k < g_ahead && run < n; k++, run++) {
        st = cpu->forward(ctx, state, &token, 1, LILY_LOGITS_LAST, logits, err);
        lily_sampler_set_draw_index(sampler, ds->draw0 + (uint64_t)run);
        token = lily_sampler_sample(sampler, logits);
    }
    if (st == LILY_OK && stop && last_logits)
        memcpy(last_logits, logits, (size_t)g_vocab * sizeof(float));
    *n_run = run;
    free(bits);
    free(masked);
    lily_sampler_free(sampler);
    free(logits);
    free(chosen);
    free(lps);
    return st;
}

/* ---- fixture ----------------------------------------------------------------------------------------- */

typedef struct {
    lily_engine *engine;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    lily_error err = {0};
    lily_engine_options opts = {.model_dir = test_data_path("tiny-a/mlx4"), .backend = "cpu", .n_threads = 1};
    if (lily_engine_open(&opts, &f->engine, &err) != LILY_OK)
        fail_msg("engine: %s", err.message);
    g_vocab = f->engine->cfg.vocab_size;
    g_shim_ops = lily_cpu_backend_ops;
    g_shim_ops.name = "cpu+shim";
    g_shim_ops.decode_loop = shim_decode_loop;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    f->engine->backend.ops = &lily_cpu_backend_ops;
    lily_engine_close(f->engine);
    free(f);
    return 0;
}

typedef test_streamed streamed;

/* What one case varies. */
typedef struct {
    lily_sampler_params sampling;
    int max_tokens;
    int32_t stop_id;          /* -1: none */
    const char *stop_string;  /* NULL: none */
    int stop_after, cancel_after;
    int max_ctx;              /* 0: 256 */
    const int32_t *think_close; /* with n_think_close > 0: a reasoning budget (the prompt opened the block) */
    int n_think_close;
    int reasoning_budget;
    int32_t think_end_id;
    int constrain;            /* > 0: a toy constraint (toy_constraint) that ends the value after this many tokens */
    int32_t constrain_after;  /* the toy constraint waits for this token first (-1: constrains at once) */
} case_params;


typedef struct {
    lily_session *s;
    streamed out;
    lily_generate_result r;
} outcome;

static const int32_t prompt[] = {11, 5, 93, 200, 301, 7, 42, 480, 3, 64};
static const int32_t follow_up[] = {17, 250, 9, 333};

/* Generate on a fresh session with the host sampler or the shim's device loop. */
static void generate(fixture *f, const case_params *c, bool device, outcome *o)
{
    lily_error err = {0};
    f->engine->backend.ops = device ? &g_shim_ops : &lily_cpu_backend_ops;
    memset(o, 0, sizeof *o);
    assert_int_equal(lily_session_new(f->engine, c->max_ctx ? c->max_ctx : 256, &o->s, &err), LILY_OK);
    fake_detok detok;
    lily_generate_params p = lily_generate_defaults();
    p.sampling = c->sampling;
    p.max_tokens = c->max_tokens;
    p.stop_ids = &c->stop_id;
    p.n_stop_ids = c->stop_id >= 0 ? 1 : 0;
    p.stop_strings = &c->stop_string;
    p.n_stop_strings = c->stop_string ? 1 : 0;
    p.detok = (lily_detok_interface){&detok, detok_feed, NULL};
    p.on_token = test_on_token;
    p.user = &o->out;
    p.cancel = &o->out.cancel;
    o->out.stop_after = c->stop_after;
    o->out.cancel_after = c->cancel_after;
    p.decode = device ? LILY_DECODE_AUTO : LILY_DECODE_HOST;
    toy_constraint toy;
    const lily_token_constraint tc = toy_constraint_hook(&toy, c->constrain, c->constrain_after);
    if (c->constrain > 0)
        p.constraint = &tc;
    if (c->n_think_close > 0) {
        p.think_close = c->think_close;
        p.n_think_close = c->n_think_close;
        p.reasoning_budget = c->reasoning_budget;
        p.think_end_id = c->think_end_id;
    }
    if (lily_generate(o->s, prompt, (int)(sizeof prompt / sizeof *prompt), &p, &o->r, &err) != LILY_OK)
        fail_msg("generate: %s", err.message);
    assert_int_equal(o->r.device_loop, device);
}

/* The session's state, bit for bit, as state_save writes it (KV rows [0, position) and the rest). */
static void assert_same_session(const lily_session *a, const lily_session *b)
{
    lily_error err = {0};
    assert_int_equal(a->n_tokens, b->n_tokens);
    assert_memory_equal(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof(int32_t));
    assert_memory_equal(a->logits, b->logits, (size_t)g_vocab * sizeof(float));
    lily_session_snapshot sa, sb;
    assert_int_equal(lily_session_save(a, &sa, &err), LILY_OK);
    assert_int_equal(lily_session_save(b, &sb, &err), LILY_OK);
    assert_int_equal(sa.state_size, sb.state_size);
    assert_memory_equal(sa.state_buf, sb.state_buf, sa.state_size);
    lily_session_snapshot_free(&sa);
    lily_session_snapshot_free(&sb);
}

static void assert_same_outcome(const outcome *h, const outcome *d)
{
    assert_int_equal(h->out.n_tokens, d->out.n_tokens);
    assert_memory_equal(h->out.tokens, d->out.tokens, (size_t)h->out.n_tokens * sizeof(int32_t));
    assert_string_equal(h->out.text, d->out.text);
    assert_int_equal(h->r.finish, d->r.finish);
    assert_int_equal(h->r.n_prompt, d->r.n_prompt);
    assert_int_equal(h->r.n_generated, d->r.n_generated);
    assert_int_equal(h->r.n_decode_steps, d->r.n_decode_steps);
    assert_int_equal(h->r.stop_token, d->r.stop_token);
    assert_int_equal(h->r.stop_string, d->r.stop_string);
    assert_int_equal(h->r.last_token, d->r.last_token);
    assert_same_session(h->s, d->s);
}

/* A second turn on both sessions (greedy, 12 tokens, the device loop on the device session): the same. */
static void assert_same_follow_up(fixture *f, outcome *h, outcome *d)
{
    if (h->s->max_ctx - h->s->n_tokens < 4)
        return; /* a full context: no second turn */
    outcome next[2];
    for (int k = 0; k < 2; k++) {
        outcome *o = &next[k];
        lily_error err = {0};
        f->engine->backend.ops = k ? &g_shim_ops : &lily_cpu_backend_ops;
        memset(o, 0, sizeof *o);
        o->s = k ? d->s : h->s;
        lily_generate_params p = lily_generate_defaults();
        p.sampling.temperature = 0.0f;
        p.max_tokens = 12;
        p.on_token = test_on_token;
        p.user = &o->out;
        p.decode = k ? LILY_DECODE_AUTO : LILY_DECODE_HOST;
        if (lily_generate(o->s, follow_up, 4, &p, &o->r, &err) != LILY_OK)
            fail_msg("follow-up: %s", err.message);
        assert_int_equal(o->r.device_loop, k == 1);
    }
    assert_int_equal(next[0].out.n_tokens, 12);
    assert_same_outcome(&next[0], &next[1]);
}

static void run_case(fixture *f, const case_params *c, outcome *h, outcome *d)
{
    generate(f, c, false, h);
    generate(f, c, true, d);
    assert_same_outcome(h, d);
    assert_same_follow_up(f, h, d);
}

static void free_outcomes(outcome *h, outcome *d)
{
    lily_session_free(h->s);
    lily_session_free(d->s);
}

static case_params greedy_case(void)
{
    case_params c = {.sampling = lily_sampler_defaults(), .stop_id = -1};
    c.sampling.temperature = 0.0f;
    return c;
}

/* The greedy reference: 48 tokens with no stop. */
static void reference(fixture *f, int32_t *ids, int n)
{
    case_params c = greedy_case();
    c.max_tokens = n;
    outcome h;
    generate(f, &c, false, &h);
    assert_int_equal(h.out.n_tokens, n);
    memcpy(ids, h.out.tokens, (size_t)n * sizeof *ids);
    lily_session_free(h.s);
}

/* ---- cases ------------------------------------------------------------------------------------------- */

static void test_greedy_max_tokens(void **state)
{
    fixture *f = *state;
    for (int ahead = 0; ahead <= 3; ahead += 3) {
        g_ahead = ahead;
        case_params c = greedy_case();
        c.max_tokens = 45; /* the first token on the host, then batches of 8 capped by max_tokens */
        outcome h, d;
        g_loop_calls = 0;
        run_case(f, &c, &h, &d);
        assert_int_equal(d.r.finish, LILY_FINISH_LENGTH);
        assert_int_equal(d.r.n_generated, 45);
        assert_true(g_loop_calls >= 6);
        assert_int_equal(d.r.n_replayed, 0); /* a batch never runs past max_tokens */
        assert_string_equal(d.r.decode_path, "device loop");
        /* distinct tokens: the fixture does not just repeat one id */
        int distinct = 0;
        for (int i = 0; i < h.out.n_tokens; i++) {
            bool seen = false;
            for (int j = 0; j < i; j++)
                seen |= h.out.tokens[j] == h.out.tokens[i];
            distinct += !seen;
        }
        assert_true(distinct >= 8);
        free_outcomes(&h, &d);
    }
}

/* Whether the k-th generated token (1-based) falls before the end of a device batch: the first token is
 * the host's, then batches of DEVICE_BATCH_MIN = 8 (while fewer than 81 tokens were generated). */
static bool mid_batch(int k) { return (k - 1) % 8 != 0; }

/* The first index >= from whose token does not occur before it. */
static int first_new_token_at(const int32_t *ids, int n, int from)
{
    for (int i = from; i < n; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++)
            seen |= ids[j] == ids[i];
        if (!seen)
            return i;
    }
    fail_msg("no new token after %d", from);
    return -1;
}

static void test_greedy_stop_id_mid_batch(void **state)
{
    fixture *f = *state;
    int32_t ref[48];
    reference(f, ref, 48);
    const int at = first_new_token_at(ref, 48, 13); /* inside the second device batch */
    for (int ahead = 0; ahead <= 3; ahead += 3) {
        g_ahead = ahead;
        case_params c = greedy_case();
        c.max_tokens = 100;
        c.stop_id = ref[at];
        outcome h, d;
        run_case(f, &c, &h, &d);
        assert_int_equal(d.r.finish, LILY_FINISH_STOP);
        assert_int_equal(d.r.stop_token, ref[at]);
        assert_int_equal(d.r.n_generated, at);
        /* the prompt, the `at` tokens before the stop, then the follow-up's 4 + 11 (its 12th not appended) */
        assert_int_equal(d.s->n_tokens, (int)(sizeof prompt / sizeof *prompt) + at + 4 + 11);
        if (ahead == 0 || !mid_batch(at + 1))
            assert_int_equal(d.r.n_replayed, 0);
        else
            assert_true(d.r.n_replayed > 0);
        free_outcomes(&h, &d);
    }
}

static void test_greedy_stop_string_mid_batch(void **state)
{
    fixture *f = *state;
    int32_t ref[48];
    reference(f, ref, 48);
    const int at = first_new_token_at(ref, 48, 20);
    char stop[64];
    snprintf(stop, sizeof stop, " t%d t%d", (int)ref[at - 1], (int)ref[at]);
    g_ahead = 3;
    case_params c = greedy_case();
    c.max_tokens = 100;
    c.stop_string = stop;
    outcome h, d;
    run_case(f, &c, &h, &d);
    assert_int_equal(d.r.finish, LILY_FINISH_STOP);
    assert_int_equal(d.r.stop_string, 0);
    assert_true(d.r.n_generated <= at + 1);
    if (mid_batch(d.r.n_generated))
        assert_true(d.r.n_replayed > 0);
    free_outcomes(&h, &d);
}

static void test_callback_stop_and_cancel_flag(void **state)
{
    fixture *f = *state;
    g_ahead = 3;
    case_params c = greedy_case();
    c.max_tokens = 100;
    c.stop_after = 11;
    outcome h, d;
    run_case(f, &c, &h, &d);
    assert_int_equal(d.r.finish, LILY_FINISH_CANCELLED);
    assert_int_equal(d.r.n_generated, 11);
    assert_int_equal(d.r.last_token, d.out.tokens[10]);
    free_outcomes(&h, &d);

    c.stop_after = 0;
    c.cancel_after = 17; /* the flag is seen before the 18th token is taken */
    run_case(f, &c, &h, &d);
    assert_int_equal(d.r.finish, LILY_FINISH_CANCELLED);
    assert_int_equal(d.r.n_generated, 17);
    assert_int_equal(d.r.last_token, -1);
    assert_true(d.r.n_replayed > 0);
    free_outcomes(&h, &d);
}

static void test_context_full(void **state)
{
    fixture *f = *state;
    g_ahead = 3;
    case_params c = greedy_case();
    c.max_ctx = (int)(sizeof prompt / sizeof *prompt) + 21;
    outcome h, d;
    run_case(f, &c, &h, &d);
    assert_int_equal(d.r.finish, LILY_FINISH_LENGTH);
    /* prompt + reply == the context (never one more); the last token streamed, not appended */
    assert_int_equal(d.r.n_generated, 21);
    assert_int_equal(d.r.n_prompt + d.r.n_generated, d.s->max_ctx);
    assert_int_equal(d.s->n_tokens, d.s->max_ctx - 1);
    assert_int_equal(d.r.n_replayed, 0);
    free_outcomes(&h, &d);
}

/* Sampling on the "device" with every sampler setting: the same draws as the host sampler (the same
 * draw index and penalty history reach the device), so the same tokens, text and session; a stop inside
 * a batch (stop_after) makes generate undo the steps run past it. */
static void test_sampled_device_loop(void **state)
{
    fixture *f = *state;
    g_ahead = 3;
    static const lily_logit_bias bias[] = {{5, 3.0f}, {93, -100.0f}, {480, 2.5f}};
    lily_sampler_params sets[7];
    for (int i = 0; i < 7; i++) {
        sets[i] = lily_sampler_defaults();
        sets[i].temperature = 0.8f;
        sets[i].seed = 7 + (uint64_t)i;
    }
    sets[0].top_k = 20, sets[0].top_p = 0.9f;             /* the old device subset */
    sets[1].top_k = 0;                                    /* off: the whole vocab */
    sets[2].top_p = 0.95f, sets[2].top_k = 20;            /* Qwen's recommendation */
    sets[2].presence_penalty = 1.5f;
    sets[3].top_k = 300, sets[3].min_p = 0.05f;
    sets[4].repetition_penalty = 1.3f, sets[4].frequency_penalty = 0.4f, sets[4].top_p = 0.9f;
    sets[5].logit_bias = bias, sets[5].n_logit_bias = 3;
    sets[6].temperature = 0.0f, sets[6].presence_penalty = 2.0f; /* greedy with a penalty */
    for (int i = 0; i < 7; i++) {
        case_params c = {.sampling = sets[i], .stop_id = -1, .max_tokens = 60, .stop_after = i == 1 ? 29 : 0};
        outcome h, d;
        run_case(f, &c, &h, &d);
        if (i == 1) {
            assert_int_equal(d.out.n_tokens, 29);
            assert_true(d.r.n_replayed > 0);
        }
        free_outcomes(&h, &d);
    }
}

typedef struct {
    streamed out;
    lily_token_logprobs lp[64];
    lily_token_logprobs current;
} logprob_run;

static int logprob_on_token(void *user, int32_t token, const char *text, size_t len)
{
    logprob_run *r = user;
    if (token >= 0 && r->out.n_tokens < 64)
        r->lp[r->out.n_tokens] = r->current;
    return test_on_token(&r->out, token, text, len);
}

/* Logprobs on the device path: each token's, with 5 alternatives, equal to the host path's. */
static void test_logprobs_device_loop(void **state)
{
    fixture *f = *state;
    g_ahead = 2;
    logprob_run *runs = calloc(2, sizeof *runs);
    for (int k = 0; k < 2; k++) {
        lily_error err = {0};
        f->engine->backend.ops = k ? &g_shim_ops : &lily_cpu_backend_ops;
        lily_session *s = NULL;
        assert_int_equal(lily_session_new(f->engine, 128, &s, &err), LILY_OK);
        lily_generate_params p = lily_generate_defaults();
        p.sampling.temperature = 0.7f;
        p.sampling.seed = 3;
        p.max_tokens = 20;
        p.on_token = logprob_on_token;
        p.user = &runs[k];
        p.logprobs = 5;
        p.token_logprobs = &runs[k].current;
        p.decode = k ? LILY_DECODE_AUTO : LILY_DECODE_HOST;
        lily_generate_result r;
        assert_int_equal(lily_generate(s, prompt, 10, &p, &r, &err), LILY_OK);
        assert_int_equal(r.device_loop, k == 1);
        lily_session_free(s);
    }
    assert_int_equal(runs[0].out.n_tokens, 20);
    assert_int_equal(runs[1].out.n_tokens, 20);
    assert_memory_equal(runs[0].out.tokens, runs[1].out.tokens, 20 * sizeof(int32_t));
    for (int i = 0; i < 20; i++) {
        assert_int_equal(runs[1].lp[i].n_top, 5);
        assert_memory_equal(&runs[0].lp[i], &runs[1].lp[i], sizeof runs[0].lp[i]);
        assert_true(runs[0].lp[i].logprob <= 0.0f && runs[0].lp[i].top_logprobs[0] >= runs[0].lp[i].logprob);
    }
    free(runs);
}

/* A backend that declines (LILY_ERR_UNSUPPORTED before any step) leaves the host loop in charge: the
 * same results as the host sampler's. */
static void test_declined_device_loop(void **state)
{
    fixture *f = *state;
    g_ahead = 3;
    case_params c = greedy_case();
    c.max_tokens = 20;
    outcome h, d;
    generate(f, &c, false, &h);
    g_decline = true;
    lily_error err = {0};
    f->engine->backend.ops = &g_shim_ops;
    assert_int_equal(lily_session_new(f->engine, 256, &d.s, &err), LILY_OK);
    memset(&d.out, 0, sizeof d.out);
    fake_detok detok;
    lily_generate_params p = lily_generate_defaults();
    p.sampling = c.sampling;
    p.max_tokens = c.max_tokens;
    p.detok = (lily_detok_interface){&detok, detok_feed, NULL};
    p.on_token = test_on_token;
    p.user = &d.out;
    assert_int_equal(lily_generate(d.s, prompt, (int)(sizeof prompt / sizeof *prompt), &p, &d.r, &err), LILY_OK);
    g_decline = false;
    assert_false(d.r.device_loop);
    assert_int_equal(d.r.n_device_batches, 0);
    assert_string_equal(d.r.decode_path, "host sampler (the backend declined the device loop)");
    assert_same_outcome(&h, &d);
    free_outcomes(&h, &d);
}

/* A decode_loop that fails in a later batch: lily_generate returns its error and leaves the session at
 * that batch's start, whole: its logits are those of its last token (what a continuation samples from),
 * as a session holding the same tokens appended one at a time has them. */
static void test_error_in_later_batch(void **state)
{
    fixture *f = *state;
    g_ahead = 3;
    lily_error err = {0};
    f->engine->backend.ops = &g_shim_ops;
    lily_session *d = NULL;
    assert_int_equal(lily_session_new(f->engine, 256, &d, &err), LILY_OK);
    streamed out;
    memset(&out, 0, sizeof out);
    lily_generate_params p = lily_generate_defaults();
    p.sampling.temperature = 0.0f;
    p.max_tokens = 100;
    p.on_token = test_on_token;
    p.user = &out;
    lily_generate_result r;
    g_loop_calls = 0;
    g_fail_call = 3; /* batches 1 and 2 complete (8 + 8 steps kept), the third fails */
    const lily_status st = lily_generate(d, prompt, (int)(sizeof prompt / sizeof *prompt), &p, &r, &err);
    g_fail_call = 0;
    assert_int_equal(st, LILY_ERR_BACKEND);
    assert_int_equal(g_loop_calls, 3);
    const int n_prompt = (int)(sizeof prompt / sizeof *prompt);
    assert_int_equal(d->n_tokens, n_prompt + 8 + 8); /* the first token is batch 1's first input */
    assert_memory_equal(d->tokens, prompt, sizeof prompt);
    assert_memory_equal(d->tokens + n_prompt, out.tokens, (size_t)(d->n_tokens - n_prompt) * sizeof(int32_t));

    f->engine->backend.ops = &lily_cpu_backend_ops;
    lily_session *h = NULL;
    assert_int_equal(lily_session_new(f->engine, 256, &h, &err), LILY_OK);
    assert_int_equal(lily_session_append(h, prompt, n_prompt, NULL, &err), LILY_OK);
    for (int i = n_prompt; i < d->n_tokens; i++)
        assert_int_equal(lily_session_append(h, &d->tokens[i], 1, NULL, &err), LILY_OK);
    assert_same_session(h, d);
    lily_session_free(h);
    lily_session_free(d);
}

/* What still keeps the host loop on a backend with the op: asking for it. */
static void test_host_only_settings(void **state)
{
    fixture *f = *state;
    lily_error err = {0};
    f->engine->backend.ops = &g_shim_ops;
    lily_session *s = NULL;
    assert_int_equal(lily_session_new(f->engine, 64, &s, &err), LILY_OK);
    lily_generate_params p = lily_generate_defaults();
    p.sampling.top_k = 0;
    p.max_tokens = 5;
    p.decode = LILY_DECODE_HOST;
    lily_generate_result r;
    g_loop_calls = 0;
    assert_int_equal(lily_generate(s, prompt, 3, &p, &r, &err), LILY_OK);
    assert_false(r.device_loop);
    assert_int_equal(g_loop_calls, 0);
    assert_int_equal(r.n_generated, 5);
    assert_string_equal(r.decode_path, "host sampler (asked for)");
    lily_session_free(s);
}

/* A reasoning budget on the device loop: batches end where the budget is spent, the host forces the close
 * tokens and the loop resumes: the host path's tokens, text and session, greedy and sampled, for budgets
 * spent at once, mid-batch, at a batch edge, later than the model's own close, and never. */
static void test_reasoning_budget_device_loop(void **state)
{
    fixture *f = *state;
    g_ahead = 3;
    static const int32_t close[] = {7, 8, 9};
    int32_t ref[48];
    reference(f, ref, 48);
    const int at = first_new_token_at(ref, 48, 15); /* greedy "closes" its think block itself there */
    const int32_t think_end = ref[at];
    const int budgets[] = {0, 1, 5, 9, 30, 100};
    for (int i = 0; i < 6; i++)
        for (int sampled = 0; sampled < 2; sampled++) {
            case_params c = greedy_case();
            if (sampled) {
                c.sampling.temperature = 0.8f;
                c.sampling.top_k = 0;
                c.sampling.seed = 3 + (uint64_t)i;
            }
            c.max_tokens = 40;
            c.think_close = close;
            c.n_think_close = 3;
            c.reasoning_budget = budgets[i];
            c.think_end_id = sampled ? -1 : think_end;
            outcome h, d;
            g_loop_calls = 0;
            run_case(f, &c, &h, &d);
            assert_true(g_loop_calls >= 1);
            assert_int_equal(h.r.reasoning_cut, d.r.reasoning_cut);
            assert_int_equal(h.r.n_reasoning, d.r.n_reasoning);
            if (sampled ? budgets[i] < 40 : budgets[i] <= at) { /* cut: the close follows the last reasoning token */
                assert_true(d.r.reasoning_cut);
                assert_int_equal(d.r.n_reasoning, budgets[i]);
                assert_memory_equal(&d.out.tokens[budgets[i]], close, sizeof close);
            } else { /* the model closed it first */
                assert_false(d.r.reasoning_cut);
            }
            free_outcomes(&h, &d);
        }
}

/* Constrained decoding on the device loop: the mask of each step computed on the host as the previous
 * token arrives; the host path's tokens, text and session, greedy and sampled, for a value that ends
 * mid-batch (the device ran past: undone), at a batch's last step, and after a think block that closes
 * mid-batch; with a stop string firing first; every constrained token obeys the mask. */
static void test_constrained_device_loop(void **state)
{
    fixture *f = *state;
    int32_t ref[48];
    reference(f, ref, 48);
    const int close_at = first_new_token_at(ref, 48, 5); /* greedy's "</think>" */
    static const int limits[] = {13, 16, 9, 30};
    for (int ahead = 1; ahead <= 3; ahead += 2)
        for (int i = 0; i < 4; i++)
            for (int sampled = 0; sampled < 3; sampled++) {
                g_ahead = ahead;
                case_params c = greedy_case();
                if (sampled) {
                    c.sampling.temperature = 0.9f;
                    c.sampling.top_k = sampled == 1 ? 0 : 40;
                    c.sampling.top_p = sampled == 2 ? 0.9f : 1.0f;
                    c.sampling.presence_penalty = sampled == 2 ? 0.5f : 0.0f;
                    c.sampling.seed = 11 + (uint64_t)i;
                }
                c.max_tokens = 60;
                c.constrain = limits[i];
                c.constrain_after = i == 3 && !sampled ? ref[close_at] : -1;
                outcome h, d;
                run_case(f, &c, &h, &d);
                assert_string_equal(d.r.decode_path, "device loop");
                const int wait = c.constrain_after >= 0 ? close_at + 1 : 0;
                if (d.r.finish == LILY_FINISH_STOP && d.r.stop_token < 0) /* the value ended it */
                    assert_int_equal(d.r.n_generated, wait + limits[i]);
                for (int k = wait; k < d.out.n_tokens; k++)
                    assert_true(toy_allows_at(k - wait, d.out.tokens[k]));
                if (i == 0 && !sampled) {
                    assert_int_equal(d.r.finish, LILY_FINISH_STOP);
                    assert_true(d.r.n_replayed > 0 || ahead == 1);
                }
                free_outcomes(&h, &d);
            }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_max_tokens),
        cmocka_unit_test(test_greedy_stop_id_mid_batch),
        cmocka_unit_test(test_greedy_stop_string_mid_batch),
        cmocka_unit_test(test_callback_stop_and_cancel_flag),
        cmocka_unit_test(test_context_full),
        cmocka_unit_test(test_sampled_device_loop),
        cmocka_unit_test(test_logprobs_device_loop),
        cmocka_unit_test(test_declined_device_loop),
        cmocka_unit_test(test_error_in_later_batch),
        cmocka_unit_test(test_host_only_settings),
        cmocka_unit_test(test_reasoning_budget_device_loop),
        cmocka_unit_test(test_constrained_device_loop),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
