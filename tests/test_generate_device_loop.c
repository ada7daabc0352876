/* test_generate_device_loop.c — lily_generate's device loop (generate.h) against its host sampler, on the
 * real CPU engine (tests/data/tiny-a/mlx4) with a test-only decode_loop op.
 *
 * The shim: the CPU backend's ops plus a decode_loop that runs forward() one token at a time and picks
 * the next token itself (greedy argmax, or a seeded top-k / top-p draw like the CUDA kernel's), like a
 * device would. It runs `g_ahead` steps past the tokens it has delivered, as the CUDA loop keeps steps
 * queued, so a stop inside a batch finds the state ahead of the stop and generate must undo those steps.
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
#include "test_fake_detok.h"

/* ---- the shim backend ------------------------------------------------------------------------------ */

static lily_backend_ops g_shim_ops;
static int g_vocab;
static int g_ahead;        /* steps the fake device runs past the last token it delivered */
static int g_loop_calls;   /* decode_loop calls */
static bool g_decline;     /* decode_loop answers LILY_ERR_UNSUPPORTED (as CUDA with a debug hook) */
static int g_fail_call;    /* this decode_loop call (1-based; 0 = none) fails after delivering 2 tokens */

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Greedy: argmax, ties to the lower id. Else top-k by repeated argmax, softmax at the temperature, the
 * top-p prefix, a draw keyed by (seed, position) as the CUDA kernel keys it by (seed, step). */
static int32_t shim_choose(const float *logits, const lily_device_sampling *ds, int position)
{
    int best = 0;
    for (int v = 1; v < g_vocab; v++)
        if (logits[v] > logits[best])
            best = v;
    if (ds->temperature < 1e-5f)
        return best;
    int ids[LILY_DEVICE_TOP_K_MAX];
    double w[LILY_DEVICE_TOP_K_MAX], total = 0.0;
    const int k = ds->top_k < g_vocab ? ds->top_k : g_vocab;
    for (int r = 0; r < k; r++) {
        int pick = -1;
        for (int v = 0; v < g_vocab; v++) {
            bool taken = false;
            for (int q = 0; q < r; q++)
                taken |= ids[q] == v;
            if (!taken && (pick < 0 || logits[v] > logits[pick]))
                pick = v;
        }
        ids[r] = pick;
        w[r] = exp((double)(logits[pick] - logits[ids[0]]) / ds->temperature);
        total += w[r];
    }
    int keep = k;
    double cum = 0.0;
    for (int r = 0; r < k; r++) {
        cum += w[r];
        if (cum >= ds->top_p * total) {
            keep = r + 1;
            break;
        }
    }
    double kept = 0.0;
    for (int r = 0; r < keep; r++)
        kept += w[r];
    const double u = (double)(splitmix64(ds->seed ^ splitmix64((uint64_t)position)) >> 11) * (1.0 / 9007199254740992.0);
    double c = 0.0;
    for (int r = 0; r < keep; r++) {
        c += w[r];
        if (u * kept < c)
            return ids[r];
    }
    return ids[keep - 1];
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
    if (!logits || !chosen) {
        free(logits);
        free(chosen);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "shim: out of memory");
    }
    g_loop_calls++;
    lily_status st = LILY_OK;
    int run = 0, delivered = 0;
    bool stop = false;
    int32_t token = first_token;
    while (!stop && delivered < n) {
        if (run < n && run - delivered <= g_ahead) { /* the device runs on */
            const int position = cpu->state_position(ctx, state);
            st = cpu->forward(ctx, state, &token, 1, LILY_LOGITS_LAST, logits, err);
            if (st != LILY_OK)
                break;
            token = chosen[run++] = shim_choose(logits, ds, position);
        } else { /* the host sees the next token */
            stop = on_token && on_token(user, chosen[delivered], delivered) != 0;
            delivered++;
            if (g_fail_call == g_loop_calls && delivered == 2) {
                st = lily_error_set(err, LILY_ERR_BACKEND, "shim: injected failure");
                break;
            }
        }
    }
    if (st == LILY_OK && stop && last_logits)
        memcpy(last_logits, logits, (size_t)g_vocab * sizeof(float));
    *n_run = run;
    free(logits);
    free(chosen);
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
    assert_int_equal(d.r.n_generated, 22); /* the last one streamed, not appended */
    assert_int_equal(d.s->n_tokens, d.s->max_ctx);
    assert_int_equal(d.r.n_replayed, 0);
    free_outcomes(&h, &d);
}

/* Sampling on the "device": its own draws, so no comparison with the host sampler's tokens; instead the
 * same seed repeats, and the session equals the host loop's for the same tokens (a host-sampler run whose
 * stop id list forces nothing, replaying the device's ids through lily_session_append). */
static void test_sampled_device_loop(void **state)
{
    fixture *f = *state;
    g_ahead = 3;
    case_params c = {.sampling = lily_sampler_defaults(), .stop_id = -1, .max_tokens = 100, .stop_after = 29};
    c.sampling.temperature = 0.8f;
    c.sampling.top_k = 20;
    c.sampling.top_p = 0.9f;
    c.sampling.seed = 7;
    outcome a, b;
    generate(f, &c, true, &a);
    generate(f, &c, true, &b);
    assert_int_equal(a.out.n_tokens, 29);
    assert_memory_equal(a.out.tokens, b.out.tokens, 29 * sizeof(int32_t));
    assert_true(a.r.n_replayed > 0);
    /* the same session as appending the prompt and the kept tokens one at a time */
    lily_error err = {0};
    f->engine->backend.ops = &lily_cpu_backend_ops;
    lily_session *s = NULL;
    assert_int_equal(lily_session_new(f->engine, 256, &s, &err), LILY_OK);
    assert_int_equal(lily_session_append(s, prompt, (int)(sizeof prompt / sizeof *prompt), NULL, &err), LILY_OK);
    for (int i = 0; i + 1 < a.out.n_tokens; i++) /* the last streamed token is not appended */
        assert_int_equal(lily_session_append(s, &a.out.tokens[i], 1, NULL, &err), LILY_OK);
    assert_same_session(s, a.s);
    lily_session_free(s);
    free_outcomes(&a, &b);
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

/* Settings only the host sampler has keep the host loop even on a backend with the op. */
static void test_host_only_settings(void **state)
{
    fixture *f = *state;
    lily_sampler_params sets[4];
    for (int i = 0; i < 4; i++) {
        sets[i] = lily_sampler_defaults();
        sets[i].temperature = 0.7f;
        sets[i].top_k = 20;
    }
    sets[0].top_k = 0;                /* off: the whole vocab */
    sets[1].top_k = 65;
    sets[2].min_p = 0.05f;
    sets[3].repetition_penalty = 1.1f;
    for (int i = 0; i < 4; i++) {
        case_params c = {.sampling = sets[i], .stop_id = -1, .max_tokens = 5};
        outcome h;
        lily_error err = {0};
        f->engine->backend.ops = &g_shim_ops;
        assert_int_equal(lily_session_new(f->engine, 64, &h.s, &err), LILY_OK);
        memset(&h.out, 0, sizeof h.out);
        lily_generate_params p = lily_generate_defaults();
        p.sampling = c.sampling;
        p.max_tokens = c.max_tokens;
        g_loop_calls = 0;
        assert_int_equal(lily_generate(h.s, prompt, 3, &p, &h.r, &err), LILY_OK);
        assert_false(h.r.device_loop);
        assert_int_equal(g_loop_calls, 0);
        assert_int_equal(h.r.n_generated, 5);
        assert_true(strncmp(h.r.decode_path, "host sampler (", 14) == 0);
        lily_session_free(h.s);
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
        cmocka_unit_test(test_declined_device_loop),
        cmocka_unit_test(test_error_in_later_batch),
        cmocka_unit_test(test_host_only_settings),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
