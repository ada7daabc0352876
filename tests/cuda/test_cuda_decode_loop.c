/* test_cuda_decode_loop.c — lily_generate's device loop (the CUDA backend's decode_loop op) against its
 * host sampler (LILY_DECODE_HOST: forward() + sampler.h per token) on tests/data/tiny-a/mlx4.
 *
 * Greedy cases (no stop; a stop id inside a batch; the callback stopping inside a batch; a full
 * context), each followed by a second turn on the same session: the generated ids must be identical, the
 * sessions must hold the same ids, and the last logits must agree (printed: max |Δlogit|, and whether the
 * state_save bytes are bit-identical; the decode graph's layer kernels are forward(n = 1)'s, so 0 is
 * expected). Sampled case: the same seed repeats, and the session equals a fresh one fed the same ids one
 * forward() at a time. Every sampler setting (top-k off, Qwen's, top-p, min-p + repetition, logit bias,
 * logprobs) gives the host sampler's tokens; a NaN at a later step is an error on every path.
 * Constrained decoding (a toy constraint's mask computed on the host per step while the device runs the
 * step's forward pass): greedy and seeded sampling give the host sampler's tokens and sessions, the value
 * ending mid-batch, after an unconstrained opening, and with the callback stopping the loop early. Host synchronizations are counted: the device loop adds a few per batch, the host
 * sampler one per token. One line per case: PASS/FAIL with the numbers. Exits 77 without a GPU.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_test_compare.h"

#include "backend/cuda/cuda_backend.h"
#include "runtime/engine.h"
#include "runtime/generate.h"

#include "../test_fake_detok.h"
#include "../test_toy_constraint.h"

#define MAX_GEN 256
#define LOGIT_BOUND 1e-3 /* far below a wrong position's O(1) change; 0 expected */

static lily_engine *g_engine;
static int g_vocab;

static void die(const char *what, const lily_error *err)
{
    printf("FAIL: %s: %s\n", what, err->message);
    exit(1);
}

typedef struct {
    int32_t tokens[MAX_GEN];
    int n_tokens;
    int stop_after;
    lily_token_logprobs current;   /* filled by lily_generate when logprobs are asked for */
    lily_token_logprobs *lps;      /* [MAX_GEN] or NULL */
} streamed_lp;

static int on_token(void *user, int32_t token, const char *text, size_t len)
{
    (void)text, (void)len;
    streamed_lp *o = user;
    if (token >= 0 && o->n_tokens < MAX_GEN) {
        if (o->lps)
            o->lps[o->n_tokens] = o->current;
        o->tokens[o->n_tokens++] = token;
    }
    return o->stop_after && o->n_tokens >= o->stop_after;
}

typedef struct {
    lily_session *s;
    streamed_lp out;
    lily_generate_result r;
    long long syncs;
} outcome;

typedef struct {
    float temperature;
    int top_k;
    float top_p;
    float min_p, presence_penalty, repetition_penalty;
    const lily_logit_bias *bias;
    int n_bias;
    int logprobs;      /* 0: none; else 1 + the alternatives asked for */
    lily_token_logprobs *lps; /* [MAX_GEN] each token's logprobs when logprobs > 0 */
    uint64_t seed;
    int max_tokens;
    int32_t stop_id; /* -1: none */
    int stop_after;
    int max_ctx;
    int constrain;          /* > 0: the toy constraint (test_toy_constraint.h) with this limit */
    int32_t constrain_after; /* its opening token (-1: constrained at once) */
} case_params;

static const int32_t prompt[] = {11, 5, 93, 200, 301, 7, 42, 480, 3, 64};
#define N_PROMPT ((int)(sizeof prompt / sizeof *prompt))
static const int32_t follow_up[] = {17, 250, 9, 333};

/* One generation on `o->s` (a fresh session when NULL). */
static void generate(const case_params *c, bool device, const int32_t *ids, int n_ids, outcome *o)
{
    lily_error err = {0};
    if (!o->s && lily_session_new(g_engine, c->max_ctx ? c->max_ctx : 1024, &o->s, &err) != LILY_OK)
        die("session", &err);
    memset(&o->out, 0, sizeof o->out);
    fake_detok detok;
    lily_generate_params p = lily_generate_defaults();
    p.sampling.temperature = c->temperature;
    p.sampling.top_k = c->top_k;
    p.sampling.top_p = c->top_p > 0 ? c->top_p : 1.0f;
    p.sampling.seed = c->seed;
    p.sampling.min_p = c->min_p;
    p.sampling.presence_penalty = c->presence_penalty;
    p.sampling.repetition_penalty = c->repetition_penalty > 0 ? c->repetition_penalty : 1.0f;
    p.sampling.logit_bias = c->bias;
    p.sampling.n_logit_bias = c->n_bias;
    if (c->logprobs > 0) {
        p.logprobs = c->logprobs - 1;
        p.token_logprobs = &o->out.current;
        o->out.lps = c->lps + (device ? MAX_GEN : 0);
    }
    p.max_tokens = c->max_tokens;
    p.stop_ids = &c->stop_id;
    p.n_stop_ids = c->stop_id >= 0 ? 1 : 0;
    p.detok = (lily_detok_interface){&detok, detok_feed, NULL};
    p.on_token = on_token;
    p.user = &o->out;
    o->out.stop_after = c->stop_after;
    p.decode = device ? LILY_DECODE_AUTO : LILY_DECODE_HOST;
    toy_constraint toy;
    const lily_token_constraint tc = toy_constraint_hook(&toy, c->constrain, c->constrain_after);
    if (c->constrain > 0)
        p.constraint = &tc;
    const long long s0 = lily_cuda_host_syncs(g_engine->backend.ctx);
    if (lily_generate(o->s, ids, n_ids, &p, &o->r, &err) != LILY_OK)
        die("generate", &err);
    o->syncs = lily_cuda_host_syncs(g_engine->backend.ctx) - s0;
}

static double max_dlogit(const lily_session *a, const lily_session *b)
{
    double m = 0;
    for (int v = 0; v < g_vocab; v++) {
        const double d = fabs((double)a->logits[v] - b->logits[v]);
        m = d > m || d != d ? d : m;
    }
    return m;
}

static bool same_state_bytes(const lily_session *a, const lily_session *b)
{
    lily_error err = {0};
    lily_session_snapshot sa, sb;
    if (lily_session_save(a, &sa, &err) != LILY_OK || lily_session_save(b, &sb, &err) != LILY_OK)
        die("save", &err);
    const bool same = sa.state_size == sb.state_size && !memcmp(sa.state_buf, sb.state_buf, sa.state_size);
    lily_session_snapshot_free(&sa);
    lily_session_snapshot_free(&sb);
    return same;
}

/* Compare a host-sampler and a device-loop outcome; print one line. */
static void compare(const char *name, const outcome *h, const outcome *d)
{
    const bool same_ids = h->out.n_tokens == d->out.n_tokens &&
                          !memcmp(h->out.tokens, d->out.tokens, (size_t)h->out.n_tokens * sizeof(int32_t));
    const bool same_session = h->s->n_tokens == d->s->n_tokens &&
                              !memcmp(h->s->tokens, d->s->tokens, (size_t)h->s->n_tokens * sizeof(int32_t));
    const bool same_result = h->r.finish == d->r.finish && h->r.n_generated == d->r.n_generated &&
                             h->r.n_decode_steps == d->r.n_decode_steps && h->r.stop_token == d->r.stop_token &&
                             h->r.last_token == d->r.last_token;
    const double dl = max_dlogit(h->s, d->s);
    const bool ok = same_ids && same_session && same_result && dl <= LOGIT_BOUND && d->r.device_loop &&
                    !h->r.device_loop;
    g_fail |= !ok;
    printf("%s %-28s ids %s (%d vs %d) | session %s (%d) | result %s (%s) | max|dlogit| %.3g (bound %.0e) | "
           "state bytes %s | device loop %s, %d batches, %d re-run | syncs host %lld device %lld\n",
           ok ? "PASS" : "FAIL", name, same_ids ? "same" : "DIFFER", h->out.n_tokens, d->out.n_tokens,
           same_session ? "same" : "DIFFER", d->s->n_tokens, same_result ? "same" : "DIFFER",
           lily_finish_reason_name(d->r.finish), dl, LOGIT_BOUND, same_state_bytes(h->s, d->s) ? "identical" : "differ",
           d->r.device_loop ? "yes" : "NO", d->r.n_device_batches, d->r.n_replayed, h->syncs, d->syncs);
}

/* The case on both paths, then a greedy second turn on both sessions. */
static void run_case(const char *name, const case_params *c)
{
    outcome h = {0}, d = {0};
    generate(c, false, prompt, N_PROMPT, &h);
    generate(c, true, prompt, N_PROMPT, &d);
    compare(name, &h, &d);
    if (h.s->max_ctx - h.s->n_tokens >= 4 + 24) {
        char turn2[64];
        snprintf(turn2, sizeof turn2, "%s, turn 2", name);
        const case_params c2 = {.temperature = 0, .max_tokens = 24, .stop_id = -1};
        generate(&c2, false, follow_up, 4, &h);
        generate(&c2, true, follow_up, 4, &d);
        compare(turn2, &h, &d);
    }
    lily_session_free(h.s);
    lily_session_free(d.s);
}

/* Every sampler setting on the device loop against the host sampler: the same Gumbel-max draws on the
 * same logits (the decode graph computes forward(n = 1)'s), so the same tokens; logprobs within 1e-4. */
static void sampled_against_host(void)
{
    static const lily_logit_bias bias[] = {{5, 3.0f}, {93, -100.0f}, {480, 2.5f}};
    static lily_token_logprobs lps[2 * MAX_GEN];
    case_params cases[6];
    const char *names[6] = {"t 1, top-k off", "Qwen t 1, top-k 20, top-p 0.95, presence 1.5", "t 1, top-p 0.95",
                            "t 0.7, min-p 0.1, repetition 1.2", "t 0.9, logit bias", "greedy + logprobs 5"};
    for (int i = 0; i < 6; i++)
        cases[i] = (case_params){.temperature = 1.0f, .seed = 11 + (uint64_t)i, .max_tokens = 80, .stop_id = -1};
    cases[1].top_k = 20, cases[1].top_p = 0.95f, cases[1].presence_penalty = 1.5f, cases[1].logprobs = 1 + 5;
    cases[2].top_p = 0.95f;
    cases[3].temperature = 0.7f, cases[3].min_p = 0.1f, cases[3].repetition_penalty = 1.2f;
    cases[4].temperature = 0.9f, cases[4].bias = bias, cases[4].n_bias = 3;
    cases[5].temperature = 0.0f, cases[5].logprobs = 1 + 5;
    for (int i = 0; i < 6; i++) {
        case_params c = cases[i];
        c.lps = lps;
        outcome h = {0}, d = {0};
        generate(&c, false, prompt, N_PROMPT, &h);
        generate(&c, true, prompt, N_PROMPT, &d);
        const bool same = h.out.n_tokens == d.out.n_tokens &&
                          !memcmp(h.out.tokens, d.out.tokens, (size_t)h.out.n_tokens * sizeof(int32_t));
        double worst = 0;
        int bad_ids = 0;
        for (int t = 0; c.logprobs && same && t < h.out.n_tokens; t++) {
            const lily_token_logprobs *a = &lps[t], *b = &lps[MAX_GEN + t];
            worst = fmax(worst, fabs((double)a->logprob - b->logprob));
            bad_ids += a->n_top != b->n_top;
            for (int k = 0; k < a->n_top && k < b->n_top; k++) {
                bad_ids += a->top_ids[k] != b->top_ids[k];
                worst = fmax(worst, fabs((double)a->top_logprobs[k] - b->top_logprobs[k]));
            }
        }
        const bool ok = same && d.r.device_loop && worst <= 1e-4 && bad_ids == 0;
        g_fail |= !ok;
        printf("%s sampled %s: %d tokens, identical to the host sampler's %s | logprobs worst |d| %.3g, %d bad ids "
               "| %s\n",
               ok ? "PASS" : "FAIL", names[i], d.out.n_tokens, same ? "yes" : "NO", worst, bad_ids, d.r.decode_path);
        lily_session_free(h.s);
        lily_session_free(d.s);
    }
}

/* Constrained decoding on the device loop against the host sampler's, each case then a second turn;
 * every constrained token obeys the mask. opening: a token greedy first generates at index opening_at. */
static void constrained_against_host(int32_t opening, int opening_at)
{
    case_params cases[5];
    const char *names[5] = {"constrained greedy, 37", "constrained t 1, top-k off, 50",
                            "constrained Qwen sampling, 60", "constrained greedy after an opening",
                            "constrained greedy, callback stop at 20"};
    for (int i = 0; i < 5; i++)
        cases[i] = (case_params){.temperature = 0.0f, .max_tokens = 120, .stop_id = -1, .constrain_after = -1};
    cases[0].constrain = 37;
    cases[1].temperature = 1.0f, cases[1].seed = 5, cases[1].constrain = 50;
    cases[2].temperature = 1.0f, cases[2].top_k = 20, cases[2].top_p = 0.95f, cases[2].presence_penalty = 1.5f;
    cases[2].seed = 9, cases[2].constrain = 60;
    cases[3].constrain = 25, cases[3].constrain_after = opening;
    cases[4].constrain = 100, cases[4].stop_after = 20;
    for (int i = 0; i < 5; i++) {
        outcome h = {0}, d = {0};
        generate(&cases[i], false, prompt, N_PROMPT, &h);
        generate(&cases[i], true, prompt, N_PROMPT, &d);
        compare(names[i], &h, &d);
        const int wait = i == 3 ? opening_at + 1 : 0;
        int bad = 0;
        for (int k = wait; k < d.out.n_tokens; k++)
            bad += !toy_allows_at(k - wait, d.out.tokens[k]);
        const int want = i == 4 ? 20 : wait + cases[i].constrain;
        const bool ok = bad == 0 && d.out.n_tokens == want && !strcmp(d.r.decode_path, "device loop");
        g_fail |= !ok;
        printf("%s %s: %d tokens (want %d), %d outside the mask, finish %s, %s\n", ok ? "PASS" : "FAIL", names[i],
               d.out.n_tokens, want, bad, lily_finish_reason_name(d.r.finish), d.r.decode_path);
        lily_session_free(h.s);
        lily_session_free(d.s);
    }
}

/* A step whose forward pass goes non-finite (lily_cuda_debug_poison: a NaN hidden state at the device
 * loop's sixth step) ends the generation with LILY_ERR_BACKEND on the device loop, greedy and sampled, as
 * on the host sampler. */
static void poisoned_steps(void)
{
    for (int k = 0; k < 3; k++) {
        const bool device = k > 0;
        lily_cuda_debug_poison(g_engine->backend.ctx, 6); /* prefill is step 0, the device loop's i-th is 1 + i */
        lily_error err = {0};
        lily_session *s = NULL;
        if (lily_session_new(g_engine, 256, &s, &err) != LILY_OK)
            die("session", &err);
        streamed_lp out = {0};
        lily_generate_params p = lily_generate_defaults();
        p.sampling.temperature = k == 2 ? 1.0f : 0.0f;
        p.max_tokens = 40;
        p.on_token = on_token;
        p.user = &out;
        p.decode = device ? LILY_DECODE_AUTO : LILY_DECODE_HOST;
        lily_generate_result r;
        const lily_status st = lily_generate(s, prompt, N_PROMPT, &p, &r, &err);
        lily_cuda_debug_poison(g_engine->backend.ctx, -1);
        const bool ok = st == LILY_ERR_BACKEND && strstr(err.message, "non-finite") && out.n_tokens >= 5 &&
                        out.n_tokens < 40;
        g_fail |= !ok;
        printf("%s NaN logits at a later step (%s): status %d after %d tokens: %s\n", ok ? "PASS" : "FAIL",
               k == 0 ? "host sampler" : k == 1 ? "device loop, greedy" : "device loop, sampled", (int)st,
               out.n_tokens, st == LILY_OK ? "(no error)" : err.message);
        lily_session_free(s);
    }
}

/* The first index >= from whose token does not occur before it, or -1. */
static int first_new_at(const int32_t *ids, int n, int from)
{
    for (int i = from; i < n; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++)
            seen |= ids[j] == ids[i];
        if (!seen)
            return i;
    }
    return -1;
}

/* The in-kernel timeline of greedy steps after the prompt (lily_cuda_timeline_decode): every decode kernel
 * of the step stamped (6 per DeltaNet layer, 8 per attention layer with the split-KV merge, the LM head),
 * each block's entry <= PDL wait release <= exit, each kernel's wait released only after the kernel launched
 * before it has ended (programmatic dependent launch), %globaltimer finer than 1 µs, the step's span
 * covering its kernels. The stamps prove the graph ran the kernels in order with their waits honoured. */
static void timeline_stamps(void)
{
    lily_error err = {0};
    lily_session *s = NULL;
    if (lily_session_new(g_engine, 256, &s, &err) != LILY_OK || lily_session_append(s, prompt, N_PROMPT, NULL, &err) != LILY_OK)
        die("timeline session", &err);
    lily_cuda_timeline *t = calloc(1, sizeof *t);
    if (!t) {
        printf("FAIL: timeline: out of memory\n");
        exit(1);
    }
    if (lily_cuda_timeline_decode(g_engine->backend.ctx, s->state, 5, 4, t, &err) != LILY_OK)
        die("timeline", &err);
    const int n_att = lily_config_n_full_attention_layers(&g_engine->cfg);
    const int want = 6 * (g_engine->cfg.n_layers - n_att) + 8 * n_att + 1;
    int bad = 0, unstamped = 0, early = 0;
    double worst = 0; /* most negative wait(k) - end(k - 1), µs */
    for (int k = 0; k < t->n; k++) {
        const lily_cuda_timeline_kernel *K = &t->k[k];
        unstamped += K->blocks == 0;
        bad += !(K->start_us >= 0 && K->start_us <= K->wait_us && K->wait_us <= K->end_us && K->end_us <= t->step_us + 1e-3);
        if (k > 0 && K->wait_us < t->k[k - 1].end_us) {
            early++;
            worst = fmin(worst, K->wait_us - t->k[k - 1].end_us);
        }
    }
    const bool ok = t->n == want && !unstamped && !bad && !early && t->timer_step_ns > 0 && t->timer_step_ns < 1000 &&
                    t->step_us > 0;
    g_fail |= !ok;
    printf("%s timeline: %d kernels stamped (want %d), %d without stamps, %d out of order, %d waits released before "
           "the previous kernel ended (worst %.3f µs), %%globaltimer step %.0f ns, step %.1f µs\n",
           ok ? "PASS" : "FAIL", t->n, want, unstamped, bad, early, worst, t->timer_step_ns, t->step_us);
    free(t);
    lily_session_free(s);
}

int main(void)
{
    if (cuda_test_no_device())
        return 77;
    lily_error err = {0};
    lily_engine_options opts = {.model_dir = LILY_TEST_DATA_DIR "/tiny-a/mlx4", .backend = "cuda"};
    if (lily_engine_open(&opts, &g_engine, &err) != LILY_OK)
        die("engine", &err);
    g_vocab = g_engine->cfg.vocab_size;

    /* the greedy reference picks a stop id that first appears inside a batch */
    case_params ref = {.temperature = 0, .max_tokens = 120, .stop_id = -1};
    outcome r0 = {0};
    generate(&ref, false, prompt, N_PROMPT, &r0);
    const int stop_at = first_new_at(r0.out.tokens, r0.out.n_tokens, 37);
    lily_session_free(r0.s);

    run_case("greedy, 120 tokens", &ref);
    if (stop_at >= 0) {
        const case_params c = {.temperature = 0, .max_tokens = 200, .stop_id = r0.out.tokens[stop_at]};
        printf("stop id %d (first at token %d)\n", (int)c.stop_id, stop_at);
        run_case("greedy, stop id", &c);
    } else {
        printf("FAIL greedy, stop id: no new token after 37 in the reference\n");
        g_fail = 1;
    }
    case_params cb = {.temperature = 0, .max_tokens = 200, .stop_id = -1, .stop_after = 30};
    run_case("greedy, callback stop at 30", &cb);
    case_params full = {.temperature = 0, .stop_id = -1, .max_ctx = N_PROMPT + 50};
    run_case("greedy, context full", &full);

    /* sampled: reproducible, and the session is the one the kept ids give */
    case_params sc = {.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .seed = 7, .max_tokens = 200,
                      .stop_id = -1, .stop_after = 45};
    outcome a = {0}, b = {0}, h = {0};
    generate(&sc, true, prompt, N_PROMPT, &a);
    generate(&sc, true, prompt, N_PROMPT, &b);
    if (lily_session_new(g_engine, 1024, &h.s, &err) != LILY_OK ||
        lily_session_append(h.s, prompt, N_PROMPT, NULL, &err) != LILY_OK)
        die("replay", &err);
    for (int i = 0; i + 1 < a.out.n_tokens; i++)
        if (lily_session_append(h.s, &a.out.tokens[i], 1, NULL, &err) != LILY_OK)
            die("replay", &err);
    const bool repeat = a.out.n_tokens == b.out.n_tokens &&
                        !memcmp(a.out.tokens, b.out.tokens, (size_t)a.out.n_tokens * sizeof(int32_t));
    const double dl = max_dlogit(h.s, a.s);
    const bool ok = repeat && a.r.device_loop && a.out.n_tokens == 45 && h.s->n_tokens == a.s->n_tokens && dl <= LOGIT_BOUND;
    g_fail |= !ok;
    printf("%s sampled (T 0.8, top-k 20, top-p 0.9, seed 7): same seed repeats %s | %d tokens | session vs "
           "replayed ids max|dlogit| %.3g | device loop %s, %d batches, %d re-run, %lld syncs\n",
           ok ? "PASS" : "FAIL", repeat ? "yes" : "NO", a.out.n_tokens, dl, a.r.device_loop ? "yes" : "NO",
           a.r.n_device_batches, a.r.n_replayed, a.syncs);
    lily_session_free(a.s);
    lily_session_free(b.s);
    lily_session_free(h.s);

    sampled_against_host();
    const int opening_at = first_new_at(r0.out.tokens, r0.out.n_tokens, 9);
    if (opening_at >= 0) {
        constrained_against_host(r0.out.tokens[opening_at], opening_at);
    } else {
        printf("FAIL constrained: no new token after 9 in the reference\n");
        g_fail = 1;
    }
    poisoned_steps();
    timeline_stamps();

    lily_engine_close(g_engine);
    printf("%s\n", g_fail ? "FAIL" : "PASS");
    return g_fail ? 1 : 0;
}
