/* test_cuda_prefix_cache.c — the prefix cache (runtime/prefix_cache.h) on the CUDA backend with
 * tests/data/tiny-chat, greedy: cold runs (a fresh session, the whole prompt in one lily_session_append)
 * against cached runs (one session through lily_prefix_cache_prefill, as the server does), for the
 * issue's scenarios: two-turn chat (thinking off and on), exact repeat, shared system prompt, mid-prompt
 * edit, 30 requests alternating 3 conversations. Each scenario runs with three cache setups: device pool
 * large enough for everything (device-to-device restores), no device pool (host checkpoints through the
 * same split-state ops), and a small device pool that fills up (host fallback).
 *
 * Per scenario it prints: identical tokens yes/no (requests whose greedy ids and reply bytes match),
 * whether the prompt's last logits are bit-identical, and their max |Δlogit|. Prefill and decode kernels
 * may round differently, so a cached run can differ from a cold one where the cold run prefills tokens the
 * cached run had decoded: identity of tokens is asserted (FAIL) only where the reused prefix was itself
 * prefilled in the same pieces (exact repeat, shared system prompt, mid edit); the two-turn chats are
 * reported; for the 30 alternating requests the logits must agree with the cold run's to a rounding
 * bound (a near-tie can pick another token; a leak between conversations would move logits by O(1)).
 * Prefill also rounds differently for pieces of < 16 tokens (GEMV) and >= 16 (tensor-core GEMM), and the
 * cache prefills in pieces that end at the marks, so the prompt logits of a cold one-append run may differ
 * in the last bits even then. The cache's own exactness is therefore also asserted against a "same-split"
 * cold run (a fresh session and an empty cache: the same forward-call pieces) where the cached history has
 * the same pieces (exact repeat, shared system prompt, mid edit): bit-identical prompt logits, tokens and
 * final logits. Always asserted: restoring a checkpoint and decoding gives bit-identical logits to the
 * session that was saved, tokens reused match the expected checkpoint, the device pool is used when
 * present. Then the device and host setups again on a backend in exact mode (lily_backend_options.exact: an
 * fp32 KV cache, so the KV rows the cache saves and restores are twice as wide; asserted).
 * Exits 77 when no GPU is present.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_test_compare.h"

#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/prefix_cache.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

#define MAX_NEW 8
#define CTX 4096

typedef struct {
    lily_engine *engine;
    lily_tokenizer *tok;
    int32_t im_start, im_end, think;
    int vocab;
    size_t device_bytes; /* the cache setup under test */
    const char *setup;
    int every;           /* the scenario's checkpoint_every (for the same-split cold run) */
} fixture;

typedef struct {
    float *prefill_logits, *final_logits;
    int32_t tokens[MAX_NEW];
    int n_tokens, reused;
    char *reply;
} run_out;

/* What one scenario saw over its requests. */
typedef struct {
    const char *name;
    bool asserted;       /* token identity with the cold run */
    bool split_asserted; /* bit identity with the same-split cold run */
    double logit_bound;  /* > 0: max |dlogit| against the cold run must stay within it (rounding only) */
    int requests, same_tokens, same_logits, same_split;
    double max_dlogit;
    bool ok;  /* everything asserted regardless of rounding (reuse counts, API calls) */
} tally;

#define CHECK(t, cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL [%s/%s]: ", f->setup, (t)->name);                                         \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            (t)->ok = false;                                                                       \
        }                                                                                          \
    } while (0)

static void die(const char *what, const lily_error *err)
{
    printf("FAIL: %s: %s\n", what, err->message);
    exit(1);
}

static void out_free(run_out *o)
{
    free(o->prefill_logits);
    free(o->final_logits);
    free(o->reply);
    memset(o, 0, sizeof *o);
}

static void generate(fixture *f, lily_session *s, run_out *o)
{
    lily_error err = {0};
    o->prefill_logits = malloc((size_t)f->vocab * sizeof(float));
    o->final_logits = malloc((size_t)f->vocab * sizeof(float));
    if (!o->prefill_logits || !o->final_logits) {
        printf("FAIL: out of memory\n");
        exit(1);
    }
    memcpy(o->prefill_logits, s->logits, (size_t)f->vocab * sizeof(float));
    lily_generate_params p = lily_generate_defaults();
    p.sampling.temperature = 0.0f;
    p.max_tokens = MAX_NEW;
    const int32_t stop = f->im_end;
    p.stop_ids = &stop;
    p.n_stop_ids = 1;
    const int before = s->n_tokens;
    lily_generate_result r;
    if (lily_generate(s, NULL, 0, &p, &r, &err) != LILY_OK)
        die("generate", &err);
    memcpy(o->final_logits, s->logits, (size_t)f->vocab * sizeof(float));
    o->n_tokens = s->n_tokens - before;
    memcpy(o->tokens, s->tokens + before, (size_t)o->n_tokens * sizeof(int32_t));
    if (r.last_token >= 0 && o->n_tokens < MAX_NEW)
        o->tokens[o->n_tokens++] = r.last_token;
    size_t len = 0;
    if (lily_tokenizer_decode(f->tok, o->tokens, o->n_tokens, true, &o->reply, &len, &err) != LILY_OK)
        die("decode", &err);
}

static void run_cold(fixture *f, const int32_t *ids, int n, run_out *o)
{
    lily_session *s = NULL;
    lily_error err = {0};
    if (lily_session_new(f->engine, CTX, &s, &err) != LILY_OK || lily_session_append(s, ids, n, NULL, &err) != LILY_OK)
        die("cold prefill", &err);
    generate(f, s, o);
    lily_session_free(s);
}

static lily_prefix_cache *new_cache(fixture *f, int every);

/* The same-split cold run: a fresh session through an empty cache (the cached run's pieces, when its
 * history has the same ones). */
static void run_cold_split(fixture *f, const int32_t *ids, int n, run_out *o)
{
    lily_prefix_cache *pc = new_cache(f, f->every);
    lily_session *s = NULL;
    lily_error err = {0};
    int marks[2];
    const int n_marks = lily_prefix_cache_chat_marks(ids, n, f->im_start, f->im_end, f->think, marks);
    if (lily_session_new(f->engine, CTX, &s, &err) != LILY_OK ||
        lily_prefix_cache_prefill(pc, s, ids, n, marks, n_marks, NULL, NULL, &o->reused, &err) != LILY_OK)
        die("same-split cold prefill", &err);
    generate(f, s, o);
    lily_session_free(s);
    lily_prefix_cache_free(pc);
}

static void run_cached(fixture *f, lily_prefix_cache *pc, lily_session *s, const int32_t *ids, int n, run_out *o)
{
    lily_error err = {0};
    int marks[2];
    const int n_marks = lily_prefix_cache_chat_marks(ids, n, f->im_start, f->im_end, f->think, marks);
    if (lily_prefix_cache_prefill(pc, s, ids, n, marks, n_marks, NULL, NULL, &o->reused, &err) != LILY_OK)
        die("prefix cache prefill", &err);
    generate(f, s, o);
    if (lily_prefix_cache_checkpoint(pc, s, &err) != LILY_OK)
        die("checkpoint", &err);
}

static double max_abs_diff(const float *a, const float *b, int n)
{
    double m = 0;
    for (int i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        if (!(d <= m))
            m = d; /* NaN propagates */
    }
    return m;
}

/* Cold and cached runs of one request, tallied; returns the tokens reused. */
static int check_request(fixture *f, tally *t, lily_prefix_cache *pc, lily_session *s, const int32_t *ids, int n,
                         char **reply)
{
    run_out cold = {0}, cached = {0};
    run_cold(f, ids, n, &cold);
    run_cached(f, pc, s, ids, n, &cached);
    const bool same_tokens = cold.n_tokens == cached.n_tokens &&
                             !memcmp(cold.tokens, cached.tokens, (size_t)cold.n_tokens * sizeof(int32_t)) &&
                             !strcmp(cold.reply, cached.reply);
    const bool same_logits =
        !memcmp(cold.prefill_logits, cached.prefill_logits, (size_t)f->vocab * sizeof(float));
    const double d = max_abs_diff(cold.prefill_logits, cached.prefill_logits, f->vocab);
    t->requests++;
    t->same_tokens += same_tokens;
    t->same_logits += same_logits;
    if (!(d <= t->max_dlogit))
        t->max_dlogit = d;
    if (t->split_asserted) {
        run_out split = {0};
        run_cold_split(f, ids, n, &split);
        const bool exact = split.n_tokens == cached.n_tokens &&
                           !memcmp(split.tokens, cached.tokens, (size_t)split.n_tokens * sizeof(int32_t)) &&
                           !memcmp(split.prefill_logits, cached.prefill_logits, (size_t)f->vocab * sizeof(float)) &&
                           !memcmp(split.final_logits, cached.final_logits, (size_t)f->vocab * sizeof(float));
        t->same_split += exact;
        if (!exact)
            printf("  [%s/%s] request %d: cached != same-split cold (prompt max |dlogit| %.3g, final %.3g)\n",
                   f->setup, t->name, t->requests, max_abs_diff(split.prefill_logits, cached.prefill_logits, f->vocab),
                   max_abs_diff(split.final_logits, cached.final_logits, f->vocab));
        out_free(&split);
    }
    const int reused = cached.reused;
    if (reply)
        *reply = strdup(cached.reply);
    out_free(&cold);
    out_free(&cached);
    return reused;
}

static int32_t *render(fixture *f, json_t *messages, bool thinking, int *n)
{
    lily_error err = {0};
    lily_chat_options co;
    lily_chat_options_init(&co);
    co.enable_thinking = thinking ? 1 : 0;
    co.add_generation_prompt = 1;
    char *text = NULL;
    if (lily_chat_render(messages, &co, &text, &err) != LILY_OK)
        die("render", &err);
    int32_t *ids = NULL;
    if (lily_tokenizer_encode(f->tok, text, strlen(text), true, &ids, n, &err) != LILY_OK)
        die("encode", &err);
    free(text);
    return ids;
}

/* {role, content} with the content's printable ASCII only (a random model's reply may be broken UTF-8). */
static void add_message(json_t *messages, const char *role, const char *content)
{
    char *clean = malloc(strlen(content) + 1);
    size_t k = 0;
    for (const char *c = content; *c; c++)
        if ((unsigned char)*c >= 0x20 && (unsigned char)*c < 0x7f)
            clean[k++] = *c;
    clean[k] = 0;
    json_array_append_new(messages, json_pack("{s:s, s:s}", "role", role, "content", clean));
    free(clean);
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb)
{
    int i = 0;
    while (i < na && i < nb && a[i] == b[i])
        i++;
    return i;
}

static lily_prefix_cache *new_cache(fixture *f, int every)
{
    lily_prefix_cache *pc = NULL;
    lily_error err = {0};
    /* a cap that holds every checkpoint of these tiny states; also the size of the page-locked host pool
     * made per cache (the 4 GiB default would be pinned anew for every case) */
    lily_prefix_cache_options o = {.ram_bytes = (size_t)256 << 20, .checkpoint_every = every,
                                   .device_bytes = f->device_bytes, .block_rows = 64};
    if (lily_prefix_cache_new(&o, &pc, &err) != LILY_OK)
        die("cache", &err);
    return pc;
}

static lily_session *new_session(fixture *f)
{
    lily_session *s = NULL;
    lily_error err = {0};
    if (lily_session_new(f->engine, CTX, &s, &err) != LILY_OK)
        die("session", &err);
    return s;
}

/* The device pool is used when the setup has one, never otherwise. */
static void check_pool(fixture *f, tally *t, lily_prefix_cache *pc)
{
    lily_prefix_cache_stats st;
    lily_prefix_cache_stats_get(pc, &st);
    if (f->device_bytes)
        CHECK(t, st.device_capacity_bytes == f->device_bytes && st.device_bytes > 0,
              "device pool %zu of %zu bytes used", st.device_bytes, st.device_capacity_bytes);
    else
        CHECK(t, st.device_capacity_bytes == 0 && st.device_bytes == 0, "no device pool expected");
}

static void two_turn(fixture *f, tally *t, bool thinking)
{
    lily_prefix_cache *pc = new_cache(f, 0);
    lily_session *s = new_session(f);
    json_t *m = json_array();
    add_message(m, "system", "You are a helpful assistant. Answer briefly.");
    add_message(m, "user", "What does the zip function return?");
    int n1, n2;
    int32_t *ids1 = render(f, m, thinking, &n1);
    char *reply = NULL;
    CHECK(t, check_request(f, t, pc, s, ids1, n1, &reply) == 0, "turn 1 reused tokens");
    add_message(m, "assistant", reply);
    add_message(m, "user", "And what happens with unequal lengths?");
    int32_t *ids2 = render(f, m, thinking, &n2);
    const int lcp = common_prefix(ids1, n1, ids2, n2);
    const int reused = check_request(f, t, pc, s, ids2, n2, NULL);
    CHECK(t, reused == lcp, "turn 2 reused %d tokens, expected %d", reused, lcp);
    check_pool(f, t, pc);
    free(reply), free(ids1), free(ids2);
    json_decref(m);
    lily_session_free(s);
    lily_prefix_cache_free(pc);
}

/* Also the same-path check: a restored checkpoint decodes exactly like the session it was saved from. */
static void exact_repeat(fixture *f, tally *t)
{
    lily_prefix_cache *pc = new_cache(f, 0);
    lily_session *s = new_session(f);
    json_t *m = json_array();
    add_message(m, "user", "Explain what a context manager is.");
    int n;
    int32_t *ids = render(f, m, true, &n);
    CHECK(t, check_request(f, t, pc, s, ids, n, NULL) == 0, "first request reused tokens");
    CHECK(t, check_request(f, t, pc, s, ids, n, NULL) == n, "the repeat did not restore the whole prompt");

    /* same path: session a prefills through the cache and decodes; b restores and decodes */
    lily_session *b = new_session(f);
    run_out ra = {0}, rb = {0};
    lily_error err = {0};
    lily_session_reset(s);
    lily_prefix_cache_clear(pc);
    if (lily_prefix_cache_prefill(pc, s, ids, n, NULL, 0, NULL, NULL, &ra.reused, &err) != LILY_OK ||
        lily_prefix_cache_prefill(pc, b, ids, n, NULL, 0, NULL, NULL, &rb.reused, &err) != LILY_OK)
        die("prefill", &err);
    generate(f, s, &ra);
    generate(f, b, &rb);
    CHECK(t, rb.reused == n, "restore reused %d of %d", rb.reused, n);
    const bool exact = ra.n_tokens == rb.n_tokens &&
                       !memcmp(ra.tokens, rb.tokens, (size_t)ra.n_tokens * sizeof(int32_t)) &&
                       !memcmp(ra.final_logits, rb.final_logits, (size_t)f->vocab * sizeof(float));
    printf("  [%s] restore then decode vs the saved session: %s (max |dlogit| %.3g after %d tokens)\n", f->setup,
           exact ? "bit-identical" : "DIFFERS", max_abs_diff(ra.final_logits, rb.final_logits, f->vocab),
           ra.n_tokens);
    CHECK(t, exact, "a restored checkpoint does not decode bit-identically to the saved session");
    check_pool(f, t, pc);
    out_free(&ra), out_free(&rb);
    lily_session_free(b);
    free(ids);
    json_decref(m);
    lily_session_free(s);
    lily_prefix_cache_free(pc);
}

static void shared_system_prompt(fixture *f, tally *t)
{
    lily_prefix_cache *pc = new_cache(f, 0);
    lily_session *s = new_session(f);
    const char *sentence = "Return a new list containing all items from the iterable in ascending order. ";
    char *system = malloc(strlen(sentence) * 24 + 64);
    strcpy(system, "You are a careful assistant for Python questions. ");
    for (int i = 0; i < 24; i++)
        strcat(system, sentence);
    json_t *a = json_array(), *b = json_array();
    add_message(a, "system", system);
    add_message(b, "system", system);
    add_message(a, "user", "How do I sort a dictionary by value?");
    add_message(b, "user", "What is a generator expression?");
    int na, nb;
    int32_t *ida = render(f, a, false, &na), *idb = render(f, b, false, &nb);
    int marks[2];
    lily_prefix_cache_chat_marks(ida, na, f->im_start, f->im_end, f->think, marks);
    check_request(f, t, pc, s, ida, na, NULL);
    const int reused = check_request(f, t, pc, s, idb, nb, NULL);
    CHECK(t, reused == marks[0], "b reused %d tokens, expected the system block's %d", reused, marks[0]);
    CHECK(t, check_request(f, t, pc, s, ida, na, NULL) == na, "back to a: not an exact repeat");
    check_pool(f, t, pc);
    free(ida), free(idb), free(system);
    json_decref(a), json_decref(b);
    lily_session_free(s);
    lily_prefix_cache_free(pc);
}

static void mid_edit(fixture *f, tally *t)
{
    const int every = 64;
    lily_prefix_cache *pc = new_cache(f, every);
    lily_session *s = new_session(f);
    enum { N = 400, EDIT = 233 };
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = 20 + (int32_t)((i * 7919u) % 480u);
    check_request(f, t, pc, s, ids, N, NULL);
    ids[EDIT] = ids[EDIT] == 30 ? 31 : 30;
    const int reused = check_request(f, t, pc, s, ids, N, NULL);
    CHECK(t, reused == EDIT / every * every, "reused %d, expected %d", reused, EDIT / every * every);
    check_pool(f, t, pc);
    lily_session_free(s);
    lily_prefix_cache_free(pc);
}

static void alternate(fixture *f, tally *t)
{
    lily_prefix_cache *pc = new_cache(f, 0);
    lily_session *s = new_session(f);
    static const char *const topics[3] = {"lists", "file objects", "the logging module"};
    json_t *conv[3];
    int32_t *last_ids[3] = {0};
    int last_n[3] = {0};
    for (int c = 0; c < 3; c++) {
        conv[c] = json_array();
        char sys[128];
        snprintf(sys, sizeof sys, "You answer questions about %s.", topics[c]);
        add_message(conv[c], "system", sys);
    }
    for (int r = 0; r < 30; r++) {
        const int c = r % 3;
        char question[128];
        snprintf(question, sizeof question, "Question %d about %s: what should I know?", r / 3 + 1, topics[c]);
        add_message(conv[c], "user", question);
        int n;
        int32_t *ids = render(f, conv[c], r % 2 == 0, &n);
        char *reply = NULL;
        const int reused = check_request(f, t, pc, s, ids, n, &reply);
        if (last_ids[c]) {
            const int lcp = common_prefix(last_ids[c], last_n[c], ids, n);
            CHECK(t, reused == lcp, "request %d reused %d, expected %d", r, reused, lcp);
        }
        add_message(conv[c], "assistant", reply);
        free(reply);
        free(last_ids[c]);
        last_ids[c] = ids;
        last_n[c] = n;
    }
    check_pool(f, t, pc);
    for (int c = 0; c < 3; c++) {
        json_decref(conv[c]);
        free(last_ids[c]);
    }
    lily_session_free(s);
    lily_prefix_cache_free(pc);
}

static void report(fixture *f, tally *t)
{
    const bool identical = t->same_tokens == t->requests;
    printf("  [%s] %-22s identical tokens: %s (%d/%d requests), prompt logits bit-identical %d/%d, "
           "max |dlogit| %.3g%s\n",
           f->setup, t->name, identical ? "yes" : "no", t->same_tokens, t->requests, t->same_logits, t->requests,
           t->max_dlogit, t->asserted ? "" : " (reported, not asserted)");
    if (t->split_asserted)
        printf("  [%s] %-22s same-split cold run: %d/%d requests bit-identical (prompt and final logits, tokens)\n",
               f->setup, t->name, t->same_split, t->requests);
    if (t->asserted && !identical)
        printf("FAIL [%s/%s]: cached tokens differ from cold ones where the reused prefix was prefilled (when the "
               "same-split run above is bit-identical, the cause is kernel rounding that depends on how tokens are "
               "split into forward calls, e.g. GEMV below 16 tokens vs GEMM, not the cache)\n",
               f->setup, t->name);
    if (t->split_asserted && t->same_split != t->requests)
        printf("FAIL [%s/%s]: cached outputs differ from the same-split cold run (a restore is not exact)\n", f->setup,
               t->name);
    const bool within = !(t->logit_bound > 0) || t->max_dlogit <= t->logit_bound;
    if (t->logit_bound > 0)
        printf("  [%s] %-22s max |dlogit| %.3g against the rounding bound %.3g: %s\n", f->setup, t->name, t->max_dlogit,
               t->logit_bound, within ? "within" : "OUTSIDE (state leaked or a restore is wrong)");
    const bool pass = t->ok && within && (!t->asserted || identical) && (!t->split_asserted || t->same_split == t->requests);
    printf("%s [%s/%s]\n", pass ? "PASS" : "FAIL", f->setup, t->name);
    if (!pass)
        g_fail++;
}

static void run_setup(fixture *f, const char *name, size_t device_bytes)
{
    f->setup = name;
    f->device_bytes = device_bytes;
    printf("setup %s: device pool %zu bytes\n", name, device_bytes);
    tally t[6] = {{.name = "two-turn chat"},       {.name = "two-turn thinking"},
                  {.name = "exact repeat"},        {.name = "shared system prompt"},
                  {.name = "mid-prompt edit"},     {.name = "30 alternating"}};
    for (int i = 0; i < 6; i++) {
        t[i].asserted = i >= 2 && i <= 4;       /* the reused prefix was prefilled in the same pieces */
        t[i].split_asserted = i >= 2 && i <= 4; /* the cached history has the same-split run's pieces */
        t[i].ok = true;
    }
    /* 30 alternating: each request's reused prefix ends where that conversation's previous prompt was
     * prefilled, but the cold run prefills it in other pieces, so the kernels round differently (GEMV
     * under 16 tokens vs GEMM) and a near-tie may pick another token. A leak between conversations would
     * move logits by O(1): assert agreement to rounding instead of identical tokens. */
    t[5].logit_bound = 0.05;
    f->every = 0;
    two_turn(f, &t[0], false);
    two_turn(f, &t[1], true);
    exact_repeat(f, &t[2]);
    shared_system_prompt(f, &t[3]);
    f->every = 64;
    mid_edit(f, &t[4]);
    f->every = 0;
    alternate(f, &t[5]);
    for (int i = 0; i < 6; i++)
        report(f, &t[i]);
}

/* backend.h's forward_mark against two forward() calls with recurrent_save between them, on an engine
 * of `chunk`-token prefill pieces: a pass of n ids with its mark at `mark`, the recurrent part to host
 * memory or a device pool. Asserted: the saved headers (position, step) match exactly; the mark's logits,
 * the pass's logits, and a session restored from the pass's mark (its KV rows + recurrent part) then fed
 * the rest agree with the two calls' logits within bound (the rows after the mark take the n-row kernels:
 * GEMM instead of GEMV under 16 rows); reported: whether the mark's state and logits are bit-identical. */
static void marked_pass(lily_engine *e, int n, int mark, bool device, double bound)
{
    const lily_backend *b = &e->backend;
    const lily_backend_ops *o = b->ops;
    const int vocab = e->cfg.vocab_size;
    const size_t rb = o->recurrent_bytes(b->ctx), kvb = (size_t)mark * o->kv_row_bytes(b->ctx);
    lily_error err = {0};
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    uint8_t *ra = malloc(rb), *rb_host = malloc(rb), *ka = malloc(kvb), *kb = malloc(kvb), *fa = malloc(rb),
            *fb = malloc(rb);
    float *la = malloc((size_t)vocab * 4), *lb = malloc((size_t)vocab * 4), *xa = malloc((size_t)vocab * 4),
          *xb = malloc((size_t)vocab * 4);
    if (!ids || !ra || !rb_host || !ka || !kb || !fa || !fb || !la || !lb || !xa || !xb) {
        printf("FAIL: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < n; i++)
        ids[i] = 20 + (int32_t)((i * 7919u) % 480u);
    void *pool = NULL;
    if (device && o->device_pool_new(b->ctx, rb, &pool, &err) != LILY_OK)
        die("device pool", &err);
    const lily_state_loc host_a = {ra, NULL, 0}, host_fa = {fa, NULL, 0}, host_fb = {fb, NULL, 0},
                         host_ka = {ka, NULL, 0}, host_kb = {kb, NULL, 0};
    const lily_state_loc mark_loc = device ? (lily_state_loc){NULL, pool, 0} : (lily_state_loc){rb_host, NULL, 0};
    lily_session *sa = NULL, *sb = NULL, *sc = NULL;
    if (lily_session_new(e, CTX, &sa, &err) != LILY_OK || lily_session_new(e, CTX, &sb, &err) != LILY_OK ||
        lily_session_new(e, CTX, &sc, &err) != LILY_OK)
        die("sessions", &err);
    /* two calls */
    if (lily_session_append(sa, ids, mark, NULL, &err) != LILY_OK ||
        o->recurrent_save(b->ctx, sa->state, host_a, &err) != LILY_OK ||
        o->kv_save(b->ctx, sa->state, 0, mark, host_ka, &err) != LILY_OK)
        die("first call", &err);
    memcpy(la, sa->logits, (size_t)vocab * 4);
    if (lily_session_append(sa, ids + mark, n - mark, NULL, &err) != LILY_OK ||
        o->recurrent_save(b->ctx, sa->state, host_fa, &err) != LILY_OK)
        die("second call", &err);
    memcpy(xa, sa->logits, (size_t)vocab * 4);
    /* one marked pass, then a session restored from its mark fed the rest */
    if (lily_session_append_mark(sb, ids, n, mark, mark_loc, lb, &err) != LILY_OK ||
        o->recurrent_save(b->ctx, sb->state, host_fb, &err) != LILY_OK ||
        o->kv_save(b->ctx, sb->state, 0, mark, host_kb, &err) != LILY_OK)
        die("marked pass", &err);
    memcpy(xb, sb->logits, (size_t)vocab * 4);
    if (o->kv_load(b->ctx, sc->state, 0, mark, host_kb, &err) != LILY_OK ||
        o->recurrent_load(b->ctx, sc->state, mark_loc, &err) != LILY_OK)
        die("restore of the mark", &err);
    memcpy(sc->tokens, ids, (size_t)mark * sizeof *ids);
    sc->n_tokens = mark;
    if (lily_session_append(sc, ids + mark, n - mark, NULL, &err) != LILY_OK)
        die("after the mark", &err);
    if (device && cudaMemcpy(rb_host, pool, rb, cudaMemcpyDeviceToHost) != cudaSuccess) {
        printf("FAIL: copy of the device pool\n");
        exit(1);
    }
    const int *ha = (const int *)ra, *hb = (const int *)rb_host, *hfa = (const int *)fa, *hfb = (const int *)fb;
    const bool headers = ha[0] == hb[0] && ha[1] == hb[1] && hfa[0] == hfb[0] && hfa[1] == hfb[1] && hb[0] == mark &&
                         hfb[0] == n && sb->n_tokens == n;
    const double d_mark = max_abs_diff(la, lb, vocab), d_pass = max_abs_diff(xa, xb, vocab),
                 d_restored = max_abs_diff(xa, sc->logits, vocab);
    const bool same_state = !memcmp(ra + 256, rb_host + 256, rb - 256) && !memcmp(ka, kb, kvb) &&
                            !memcmp(la, lb, (size_t)vocab * 4);
    /* the device-pool copies (one strided_copy kernel per save) against the host ones (cudaMemcpy2DAsync) */
    bool copies = true;
    if (device) {
        const size_t kv_off = (kvb + 255) / 256 * 256;
        void *pool2 = NULL;
        uint8_t *back = malloc(kv_off + rb);
        const lily_state_loc kv_dev = {NULL, NULL, 0}, rec_dev = {NULL, NULL, kv_off};
        lily_state_loc kd = kv_dev, rd = rec_dev;
        if (!back || o->device_pool_new(b->ctx, kv_off + rb, &pool2, &err) != LILY_OK)
            die("device pool", &err);
        kd.device_pool = rd.device_pool = pool2;
        if (o->kv_save(b->ctx, sb->state, 0, mark, kd, &err) != LILY_OK ||
            o->recurrent_save(b->ctx, sb->state, rd, &err) != LILY_OK)
            die("device saves", &err);
        if (cudaMemcpy(back, pool2, kv_off + rb, cudaMemcpyDeviceToHost) != cudaSuccess) {
            printf("FAIL: copy of the device pool\n");
            exit(1);
        }
        copies = !memcmp(back, kb, kvb) && !memcmp(back + kv_off, fb, 8) && !memcmp(back + kv_off + 256, fb + 256, rb - 256);
        /* and back: the device KV rows into a fresh session, saved to host memory again */
        lily_session *sd = NULL;
        if (lily_session_new(e, CTX, &sd, &err) != LILY_OK || o->kv_load(b->ctx, sd->state, 0, mark, kd, &err) != LILY_OK ||
            o->recurrent_load(b->ctx, sd->state, rd, &err) != LILY_OK ||
            o->kv_save(b->ctx, sd->state, 0, mark, host_ka, &err) != LILY_OK ||
            o->recurrent_save(b->ctx, sd->state, host_fa, &err) != LILY_OK)
            die("device loads", &err);
        copies = copies && !memcmp(ka, kb, kvb) && !memcmp(fa + 256, fb + 256, rb - 256);
        printf("%s device-pool KV and recurrent saves and loads (strided_copy) equal the host copies byte for byte\n",
               copies ? "PASS" : "FAIL");
        lily_session_free(sd);
        o->device_pool_free(b->ctx, pool2);
        free(back);
    }
    /* the same pass without the mark's logits (the prefix cache's form: no LM head over row mark - 1):
     * the state at the mark, the state after the pass and the pass's logits are the same bits */
    bool no_logits_same = true;
    {
        lily_session *se = NULL;
        uint8_t *re = malloc(rb), *fe = malloc(rb);
        const lily_state_loc host_re = {re, NULL, 0}, host_fe = {fe, NULL, 0};
        if (!re || !fe || lily_session_new(e, CTX, &se, &err) != LILY_OK ||
            lily_session_append_mark(se, ids, n, mark, host_re, NULL, &err) != LILY_OK ||
            o->recurrent_save(b->ctx, se->state, host_fe, &err) != LILY_OK)
            die("marked pass without the mark's logits", &err);
        /* the headers' first 8 bytes (position, step) and the parts after the 256-byte header */
        no_logits_same = !memcmp(re, rb_host, 8) && !memcmp(re + 256, rb_host + 256, rb - 256) &&
                         !memcmp(fe, fb, 8) && !memcmp(fe + 256, fb + 256, rb - 256) &&
                         !memcmp(se->logits, xb, (size_t)vocab * 4) && se->n_tokens == n;
        printf("%s marked pass of %d ids at %d without the mark's logits: the mark's state, the final state and "
               "the logits are the same bits as with them\n", no_logits_same ? "PASS" : "FAIL", n, mark);
        lily_session_free(se);
        free(re), free(fe);
    }
    const bool pass = headers && copies && no_logits_same && d_mark <= bound && d_pass <= bound && d_restored <= bound;
    printf("%s marked pass of %d ids at %d (%s mark): headers %s (pos %d step %d; after %d step %d), max |dlogit| "
           "mark %.3g, pass %.3g, restored mark + rest %.3g (bound %.3g); the mark's state and logits %s the first "
           "call's\n",
           pass ? "PASS" : "FAIL", n, mark, device ? "device" : "host", headers ? "match" : "DIFFER", hb[0], hb[1],
           hfb[0], hfb[1], d_mark, d_pass, d_restored, bound, same_state ? "bit-identical to" : "differ from");
    if (!pass)
        g_fail++;
    lily_session_free(sa), lily_session_free(sb), lily_session_free(sc);
    if (pool)
        o->device_pool_free(b->ctx, pool);
    free(ids), free(ra), free(rb_host), free(ka), free(kb), free(fa), free(fb), free(la), free(lb), free(xa), free(xb);
}

int main(void)
{
    if (cuda_test_no_device())
        return 77;
    fixture fx = {0}, *f = &fx;
    lily_error err = {0};
    lily_engine_options opts = {.model_dir = LILY_TEST_DATA_DIR "/tiny-chat", .backend = "cuda", .prefill_chunk = 128};
    if (lily_engine_open(&opts, &f->engine, &err) != LILY_OK)
        die("engine", &err);
    if (lily_tokenizer_load(LILY_TEST_DATA_DIR "/tiny-chat", &f->tok, &err) != LILY_OK)
        die("tokenizer", &err);
    f->im_start = lily_tokenizer_token_id(f->tok, "<|im_start|>");
    f->im_end = lily_tokenizer_token_id(f->tok, "<|im_end|>");
    f->think = lily_tokenizer_token_id(f->tok, "<think>");
    f->vocab = f->engine->cfg.vocab_size;
    const lily_backend *b = &f->engine->backend;
    if (!b->ops->kv_save || !b->ops->device_pool_new) {
        printf("FAIL: the CUDA backend lacks the split-state / device-pool ops\n");
        return 1;
    }
    const size_t kv_row_fast = b->ops->kv_row_bytes(b->ctx);
    printf("tiny-chat on CUDA: %zu bytes of KV rows per position, %zu bytes of recurrent state\n", kv_row_fast,
           b->ops->recurrent_bytes(b->ctx));
    run_setup(f, "device", (size_t)64 << 20);
    run_setup(f, "host", 0);
    run_setup(f, "small-device", (size_t)256 << 10); /* fills up: later pieces fall back to host memory */
    lily_engine_close(f->engine);

    /* exact mode: fp32 KV rows (twice the bytes), the same cache behaviour */
    opts.exact = true;
    if (lily_engine_open(&opts, &f->engine, &err) != LILY_OK)
        die("engine (exact)", &err);
    b = &f->engine->backend;
    const size_t kv_row_exact = b->ops->kv_row_bytes(b->ctx);
    const bool wide = kv_row_exact == 2 * kv_row_fast;
    printf("%s exact mode: %zu bytes of KV rows per position (fast mode %zu: half)\n", wide ? "PASS" : "FAIL",
           kv_row_exact, kv_row_fast);
    if (!wide)
        g_fail++;
    run_setup(f, "exact/device", (size_t)64 << 20);
    run_setup(f, "exact/host", 0);
    marked_pass(f->engine, 100, 96, true, 0.05);
    lily_engine_close(f->engine);

    /* marked passes on pieces of up to 512: the chunked delta rule before the mark (>= 256 rows), the
     * recurrence after it; a mark one row before the end (the decode kernel after it) or after one row */
    opts.exact = false;
    opts.prefill_chunk = 512;
    if (lily_engine_open(&opts, &f->engine, &err) != LILY_OK)
        die("engine (chunk 512)", &err);
    marked_pass(f->engine, 300, 296, true, 0.05);
    marked_pass(f->engine, 300, 296, false, 0.05);
    marked_pass(f->engine, 100, 60, true, 0.05);
    marked_pass(f->engine, 20, 19, true, 0.05);
    marked_pass(f->engine, 20, 1, false, 0.05);
    lily_tokenizer_free(f->tok);
    lily_engine_close(f->engine);
    printf("%s\n", g_fail ? "FAILED" : "all passed");
    return g_fail ? 1 : 0;
}
