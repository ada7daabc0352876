/* test_prefix_cache.c — the prefix cache (runtime/prefix_cache.h) is exact: on the CPU engine with
 * tests/data/tiny-chat and greedy decoding, a request served from the cache gives bit-identical prompt
 * logits, generated ids and final logits to a cold run (a fresh session that prefills the whole prompt in
 * one lily_session_append), for: a two-turn chat with thinking off and on, an exact repeat, two
 * conversations sharing a long system prompt, a prompt edited in its middle, and 30 requests alternating
 * between 3 conversations (also with a pool so small that checkpoints are evicted). Each case also checks
 * how many tokens were reused against the checkpoint positions that should serve it. Checkpoints of one
 * conversation share their KV blocks (pool bytes = one copy of the rows). */
#include "test_support.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
} fixture;

typedef struct {
    float *prefill_logits; /* [vocab] after the prompt */
    float *final_logits;   /* [vocab] after the generation */
    int32_t tokens[MAX_NEW];
    int n_tokens;
    int reused;
    char *reply;           /* the generated ids as text, special tokens skipped */
} run_out;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    lily_error err = {0};
    lily_engine_options opts = {.model_dir = test_data_path("tiny-chat"), .backend = "cpu", .n_threads = 1,
                                .prefill_chunk = 128};
    if (lily_engine_open(&opts, &f->engine, &err) != LILY_OK)
        fail_msg("engine: %s", err.message);
    if (lily_tokenizer_load(test_data_path("tiny-chat"), &f->tok, &err) != LILY_OK)
        fail_msg("tokenizer: %s", err.message);
    f->im_start = lily_tokenizer_token_id(f->tok, "<|im_start|>");
    f->im_end = lily_tokenizer_token_id(f->tok, "<|im_end|>");
    f->think = lily_tokenizer_token_id(f->tok, "<think>");
    f->vocab = f->engine->cfg.vocab_size;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    lily_tokenizer_free(f->tok);
    lily_engine_close(f->engine);
    free(f);
    return 0;
}

static void out_free(run_out *o)
{
    free(o->prefill_logits);
    free(o->final_logits);
    free(o->reply);
    memset(o, 0, sizeof *o);
}

/* Greedy generation from what s holds (the prompt is already in), recording into o. */
static void generate(fixture *f, lily_session *s, run_out *o)
{
    lily_error err = {0};
    o->prefill_logits = malloc((size_t)f->vocab * sizeof(float));
    o->final_logits = malloc((size_t)f->vocab * sizeof(float));
    assert_non_null(o->prefill_logits);
    assert_non_null(o->final_logits);
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
        fail_msg("generate: %s", err.message);
    memcpy(o->final_logits, s->logits, (size_t)f->vocab * sizeof(float));
    o->n_tokens = s->n_tokens - before;
    memcpy(o->tokens, s->tokens + before, (size_t)o->n_tokens * sizeof(int32_t));
    if (r.last_token >= 0 && o->n_tokens < MAX_NEW)
        o->tokens[o->n_tokens++] = r.last_token;
    size_t len = 0;
    if (lily_tokenizer_decode(f->tok, o->tokens, o->n_tokens, true, &o->reply, &len, &err) != LILY_OK)
        fail_msg("decode: %s", err.message);
}

/* A fresh session, the whole prompt in one append, greedy. */
static void run_cold(fixture *f, const int32_t *ids, int n, run_out *o)
{
    lily_session *s = NULL;
    lily_error err = {0};
    assert_int_equal(lily_session_new(f->engine, CTX, &s, &err), LILY_OK);
    if (lily_session_append(s, ids, n, NULL, &err) != LILY_OK)
        fail_msg("append: %s", err.message);
    generate(f, s, o);
    lily_session_free(s);
}

/* Through the cache on a session that persists across requests, as the server does. */
static void run_cached(fixture *f, lily_prefix_cache *pc, lily_session *s, const int32_t *ids, int n, run_out *o)
{
    lily_error err = {0};
    int marks[2];
    const int n_marks = lily_prefix_cache_chat_marks(ids, n, f->im_start, f->im_end, f->think, marks);
    if (lily_prefix_cache_prefill(pc, s, ids, n, marks, n_marks, NULL, NULL, &o->reused, &err) != LILY_OK)
        fail_msg("prefix cache prefill: %s", err.message);
    assert_int_equal(s->n_tokens, n);
    assert_memory_equal(s->tokens, ids, (size_t)n * sizeof(int32_t));
    generate(f, s, o);
    if (lily_prefix_cache_checkpoint(pc, s, &err) != LILY_OK)
        fail_msg("checkpoint: %s", err.message);
}

/* Cold and cached agree bit for bit. */
static void assert_same(fixture *f, const run_out *cold, const run_out *cached)
{
    assert_memory_equal(cold->prefill_logits, cached->prefill_logits, (size_t)f->vocab * sizeof(float));
    assert_int_equal(cold->n_tokens, cached->n_tokens);
    assert_memory_equal(cold->tokens, cached->tokens, (size_t)cold->n_tokens * sizeof(int32_t));
    assert_memory_equal(cold->final_logits, cached->final_logits, (size_t)f->vocab * sizeof(float));
    assert_string_equal(cold->reply, cached->reply);
}

/* Both runs of one request; returns the tokens reused. */
static int check_request(fixture *f, lily_prefix_cache *pc, lily_session *s, const int32_t *ids, int n, char **reply)
{
    run_out cold = {0}, cached = {0};
    run_cold(f, ids, n, &cold);
    run_cached(f, pc, s, ids, n, &cached);
    assert_same(f, &cold, &cached);
    const int reused = cached.reused;
    if (reply)
        *reply = strdup(cached.reply);
    out_free(&cold);
    out_free(&cached);
    return reused;
}

/* Render messages with the chat template and encode; *n ids, malloc'd. */
static int32_t *render(fixture *f, json_t *messages, bool thinking, int *n)
{
    lily_error err = {0};
    lily_chat_options co;
    lily_chat_options_init(&co);
    co.enable_thinking = thinking ? 1 : 0;
    co.add_generation_prompt = 1;
    char *text = NULL;
    if (lily_chat_render(messages, &co, &text, &err) != LILY_OK)
        fail_msg("render: %s", err.message);
    int32_t *ids = NULL;
    if (lily_tokenizer_encode(f->tok, text, strlen(text), true, &ids, n, &err) != LILY_OK)
        fail_msg("encode: %s", err.message);
    free(text);
    return ids;
}

/* Append {role, content}. The random model's replies can hold broken UTF-8: the content keeps their
 * printable ASCII (what a client would send back is some text; the cache must not care which). */
static void add_message(json_t *messages, const char *role, const char *content)
{
    char *clean = malloc(strlen(content) + 1);
    assert_non_null(clean);
    size_t k = 0;
    for (const char *c = content; *c; c++)
        if ((unsigned char)*c >= 0x20 && (unsigned char)*c < 0x7f)
            clean[k++] = *c;
    clean[k] = 0;
    json_t *m = json_pack("{s:s, s:s}", "role", role, "content", clean);
    free(clean);
    assert_non_null(m);
    assert_int_equal(json_array_append_new(messages, m), 0);
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb)
{
    int i = 0;
    while (i < na && i < nb && a[i] == b[i])
        i++;
    return i;
}

static size_t g_device_bytes; /* the device pool of new caches (test_device_pool); 0 elsewhere */

static lily_prefix_cache *new_cache(size_t ram_bytes, int every)
{
    lily_prefix_cache *pc = NULL;
    lily_error err = {0};
    lily_prefix_cache_options o = {.ram_bytes = ram_bytes, .checkpoint_every = every, .device_bytes = g_device_bytes};
    assert_int_equal(lily_prefix_cache_new(&o, &pc, &err), LILY_OK);
    return pc;
}

/* Turn 1, then turn 2 = turn 1's messages + the reply + a new user message. The template renders the
 * earlier assistant turn as "<|im_start|>assistant\n" + content, without the <think> block the generation
 * prompt had, so turn 2 leaves turn 1's ids at that <think>: the mark checkpoint serves it. */
static void two_turn(fixture *f, bool thinking)
{
    lily_error err = {0};
    lily_prefix_cache *pc = new_cache(0, 0);
    lily_session *s = NULL;
    assert_int_equal(lily_session_new(f->engine, CTX, &s, &err), LILY_OK);
    json_t *m = json_array();
    add_message(m, "system", "You are a helpful assistant. Answer briefly.");
    add_message(m, "user", "What does the zip function return?");
    int n1, n2;
    int32_t *ids1 = render(f, m, thinking, &n1);
    char *reply = NULL;
    assert_int_equal(check_request(f, pc, s, ids1, n1, &reply), 0);
    add_message(m, "assistant", reply);
    add_message(m, "user", "And what happens with unequal lengths?");
    int32_t *ids2 = render(f, m, thinking, &n2);
    const int lcp = common_prefix(ids1, n1, ids2, n2);
    assert_int_equal(ids1[lcp], f->think); /* the divergence is at the generation prompt's <think> */
    const int reused = check_request(f, pc, s, ids2, n2, NULL);
    assert_int_equal(reused, lcp);         /* everything turn 2 shares with turn 1 */
    lily_prefix_cache_stats st;
    lily_prefix_cache_stats_get(pc, &st);
    assert_int_equal(st.hits, 1);
    assert_int_equal(st.misses, 1);
    assert_int_equal(st.reused_tokens, (uint64_t)lcp);
    assert_int_equal(st.prefilled_tokens, (uint64_t)(n1 + n2 - lcp));
    free(reply);
    free(ids1);
    free(ids2);
    json_decref(m);
    lily_session_free(s);
    lily_prefix_cache_free(pc);
}

static void test_two_turn_chat(void **state) { two_turn(*state, false); }
static void test_two_turn_chat_thinking(void **state) { two_turn(*state, true); }

/* The same prompt twice (the session holds prompt + reply in between): the end-of-prefill checkpoint is
 * restored with its logits and nothing is prefilled. */
static void test_exact_repeat(void **state)
{
    fixture *f = *state;
    lily_error err = {0};
    lily_prefix_cache *pc = new_cache(0, 0);
    lily_session *s = NULL;
    assert_int_equal(lily_session_new(f->engine, CTX, &s, &err), LILY_OK);
    json_t *m = json_array();
    add_message(m, "user", "Explain what a context manager is.");
    int n;
    int32_t *ids = render(f, m, true, &n);
    assert_int_equal(check_request(f, pc, s, ids, n, NULL), 0);
    lily_prefix_cache_stats before, after;
    lily_prefix_cache_stats_get(pc, &before);
    assert_int_equal(check_request(f, pc, s, ids, n, NULL), n);
    lily_prefix_cache_stats_get(pc, &after);
    assert_int_equal(after.prefilled_tokens, before.prefilled_tokens); /* nothing prefilled */
    assert_int_equal(after.checkpoints_taken, before.checkpoints_taken); /* same states: none new */
    free(ids);
    json_decref(m);
    lily_session_free(s);
    lily_prefix_cache_free(pc);
}

static char *long_system_prompt(void)
{
    const char *sentence = "Return a new list containing all items from the iterable in ascending order. ";
    const size_t len = strlen(sentence);
    char *text = malloc(len * 24 + 64);
    strcpy(text, "You are a careful assistant for Python questions. ");
    for (int i = 0; i < 24; i++)
        strcat(text, sentence);
    return text;
}

/* Two conversations with the same long system prompt and different questions: the second reuses the
 * system block (the first-turn mark checkpoint), never more. */
static void test_shared_system_prompt(void **state)
{
    fixture *f = *state;
    lily_error err = {0};
    lily_prefix_cache *pc = new_cache(0, 0);
    lily_session *s = NULL;
    assert_int_equal(lily_session_new(f->engine, CTX, &s, &err), LILY_OK);
    char *system = long_system_prompt();
    json_t *a = json_array(), *b = json_array();
    add_message(a, "system", system);
    add_message(b, "system", system);
    add_message(a, "user", "How do I sort a dictionary by value?");
    add_message(b, "user", "What is a generator expression?");
    int na, nb;
    int32_t *ida = render(f, a, false, &na), *idb = render(f, b, false, &nb);
    int marks[2];
    {   /* a one-message conversation: only the <think> mark (the first turn ends a few ids before it) */
        json_t *one = json_array();
        add_message(one, "user", "What is a generator expression?");
        int n1;
        int32_t *id1 = render(f, one, true, &n1);
        assert_int_equal(lily_prefix_cache_chat_marks(id1, n1, f->im_start, f->im_end, f->think, marks), 1);
        assert_int_equal(id1[marks[0]], f->think);
        assert_true(marks[0] >= n1 - 8);
        free(id1);
        json_decref(one);
    }
    assert_true(lily_prefix_cache_chat_marks(ida, na, f->im_start, f->im_end, f->think, marks) == 2);
    const int system_end = marks[0];
    assert_true(system_end > 300);
    assert_int_equal(ida[system_end], f->im_start);
    assert_int_equal(check_request(f, pc, s, ida, na, NULL), 0);
    assert_true(common_prefix(ida, na, idb, nb) >= system_end);
    assert_int_equal(check_request(f, pc, s, idb, nb, NULL), system_end);
    assert_int_equal(check_request(f, pc, s, ida, na, NULL), na); /* back to a: an exact repeat */
    free(ida);
    free(idb);
    free(system);
    json_decref(a);
    json_decref(b);
    lily_session_free(s);
    lily_prefix_cache_free(pc);
}

/* A raw prompt (no template) edited in its middle: reuse up to the deepest checkpoint_every boundary at
 * or before the edit, recompute the rest. */
static void test_edit_in_the_middle(void **state)
{
    fixture *f = *state;
    lily_error err = {0};
    const int every = 64;
    lily_prefix_cache *pc = new_cache(0, every);
    lily_session *s = NULL;
    assert_int_equal(lily_session_new(f->engine, CTX, &s, &err), LILY_OK);
    enum { N = 400, EDIT = 233 };
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = 20 + (int32_t)((i * 7919u) % 480u);
    assert_int_equal(check_request(f, pc, s, ids, N, NULL), 0);
    lily_prefix_cache_stats st;
    lily_prefix_cache_stats_get(pc, &st);
    assert_true(st.n_checkpoints >= N / every + 1); /* 64..384, end of prefill (and of the generation) */
    ids[EDIT] = ids[EDIT] == 30 ? 31 : 30;
    assert_int_equal(check_request(f, pc, s, ids, N, NULL), EDIT / every * every);
    ids[5] = ids[5] == 30 ? 31 : 30; /* before the first checkpoint: nothing to reuse */
    assert_int_equal(check_request(f, pc, s, ids, N, NULL), 0);
    lily_session_free(s);
    lily_prefix_cache_free(pc);
}

/* 30 requests, alternating between 3 conversations that each grow by a turn per visit: every request
 * is exact, each resumes its own conversation (never another's), none is a miss after the first round. */
static void alternate(fixture *f, size_t ram_bytes, int n_requests, bool expect_evictions)
{
    lily_error err = {0};
    lily_prefix_cache *pc = new_cache(ram_bytes, 0);
    lily_session *s = NULL;
    assert_int_equal(lily_session_new(f->engine, CTX, &s, &err), LILY_OK);
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
    for (int r = 0; r < n_requests; r++) {
        const int c = r % 3;
        char question[128];
        snprintf(question, sizeof question, "Question %d about %s: what should I know?", r / 3 + 1, topics[c]);
        add_message(conv[c], "user", question);
        int n;
        int32_t *ids = render(f, conv[c], r % 2 == 0, &n);
        char *reply = NULL;
        const int reused = check_request(f, pc, s, ids, n, &reply);
        if (last_ids[c]) {
            const int lcp = common_prefix(last_ids[c], last_n[c], ids, n);
            if (!expect_evictions)
                assert_int_equal(reused, lcp); /* its own previous turn's mark (or more) */
            assert_true(reused <= lcp);
        }
        add_message(conv[c], "assistant", reply);
        free(reply);
        free(last_ids[c]);
        last_ids[c] = ids;
        last_n[c] = n;
    }
    lily_prefix_cache_stats st;
    lily_prefix_cache_stats_get(pc, &st);
    assert_int_equal(st.hits + st.misses, (uint64_t)n_requests);
    if (expect_evictions)
        assert_true(st.evictions > 0);
    else
        assert_int_equal(st.misses, 3);
    assert_true(st.bytes <= (ram_bytes ? ram_bytes : (size_t)LILY_PREFIX_CACHE_DEFAULT_RAM_MIB << 20));
    for (int c = 0; c < 3; c++) {
        json_decref(conv[c]);
        free(last_ids[c]);
    }
    lily_session_free(s);
    lily_prefix_cache_free(pc);
}

static void test_thirty_requests_three_conversations(void **state) { alternate(*state, 0, 30, false); }

/* 12 such requests with a pool of about three checkpoints: evictions, still exact. */
static void test_thirty_requests_small_pool(void **state)
{
    fixture *f = *state;
    lily_session *s = NULL;
    lily_error err = {0};
    assert_int_equal(lily_session_new(f->engine, CTX, &s, &err), LILY_OK);
    const lily_backend *b = &f->engine->backend;
    int32_t ids[200];
    for (int i = 0; i < 200; i++)
        ids[i] = 20 + i;
    assert_int_equal(lily_session_append(s, ids, 200, NULL, &err), LILY_OK);
    const size_t one = b->ops->state_save_size(b->ctx, s->state) + 200 * sizeof(int32_t) +
                       (size_t)f->vocab * sizeof(float);
    lily_session_free(s);
    alternate(f, 3 * one, 12, true);
}

/* Checkpoints of one conversation share their KV blocks: a prefill of 600 ids with a mark at 590 (in five
 * forward passes: the mark's checkpoint is taken inside the last) and the generation after it leave three
 * checkpoints (590, 600, 608) that hold one copy of the block rows
 * [0, 576) plus each its own tail, not three copies; a request that parts from them at 595 restores the
 * mark and one that repeats them restores the end of the prefill, both bit-identical to cold runs; a
 * second conversation with the same first 300 ids shares the first 4 blocks. */
static void test_checkpoints_share_blocks(void **state)
{
    fixture *f = *state;
    lily_error err = {0};
    enum { N = 600, MARK = 590, B = 64 };
    lily_prefix_cache *pc = NULL;
    lily_prefix_cache_options o = {.checkpoint_every = -1, .block_rows = B, .device_bytes = (size_t)64 << 20};
    assert_int_equal(lily_prefix_cache_new(&o, &pc, &err), LILY_OK);
    lily_session *s = NULL;
    assert_int_equal(lily_session_new(f->engine, CTX, &s, &err), LILY_OK);
    const lily_backend *b = &f->engine->backend;
    const size_t row = b->ops->kv_row_bytes(b->ctx), rec = b->ops->recurrent_bytes(b->ctx);
    assert_true(row > 0 && rec > 0);
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = 20 + (int32_t)((i * 7919u) % 480u);
    const int mark = MARK;

    run_out cold = {0}, cached = {0};
    run_cold(f, ids, N, &cold);
    if (lily_prefix_cache_prefill(pc, s, ids, N, &mark, 1, NULL, NULL, &cached.reused, &err) != LILY_OK)
        fail_msg("prefill: %s", err.message);
    generate(f, s, &cached);
    assert_same(f, &cold, &cached);
    const int n_gen = s->n_tokens - N;
    assert_int_equal(lily_prefix_cache_checkpoint(pc, s, &err), LILY_OK);
    out_free(&cold);
    out_free(&cached);

    lily_prefix_cache_stats st;
    lily_prefix_cache_stats_get(pc, &st);
    /* pieces of 128 up to 512, then one pass over [512, 600) that takes the mark's checkpoint inside it
     * (lily_session_append_mark): no forward pass of its own for the 10 ids after the mark */
    assert_int_equal(st.last_pieces, 5);
    assert_int_equal(st.n_checkpoints, 3);
    assert_int_equal(st.n_blocks, N / B); /* 9 blocks, [0, 576), held once */
    assert_int_equal(st.device_capacity_bytes, 0); /* the CPU backend has no device pools */
    assert_int_equal(st.device_bytes, 0);
    const size_t tails = (size_t)(MARK - N / B * B) + (N - N / B * B) + (N + n_gen - N / B * B);
    const size_t rows_once = (size_t)(N / B * B) + tails;
    const size_t per_checkpoint = rec + (size_t)f->vocab * sizeof(float) + (size_t)(N + n_gen) * sizeof(int32_t);
    const size_t slack = 3 * 1024 + (size_t)(N / B) * (B * sizeof(int32_t) + 256);
    assert_true(st.bytes >= rows_once * row + 3 * rec);
    assert_true(st.bytes <= rows_once * row + 3 * per_checkpoint + slack);
    print_message("3 checkpoints: %zu bytes held; KV rows once %zu, three whole copies %zu\n", st.bytes,
                  rows_once * row, (size_t)(MARK + N + N + n_gen) * row);
    /* three whole snapshots would hold MARK + N + N + n_gen rows */
    assert_true(st.bytes * 2 < (size_t)(MARK + N + N + n_gen) * row);

    /* parts at 595: the mark checkpoint (shared blocks + its tail) restores exactly */
    int32_t edited[N];
    memcpy(edited, ids, sizeof ids);
    edited[595] = edited[595] == 30 ? 31 : 30;
    assert_int_equal(check_request(f, pc, s, edited, N, NULL), MARK);
    assert_int_equal(check_request(f, pc, s, ids, N, NULL), N); /* the end of the prefill */
    /* a request that ends at the mark: the mark's checkpoint, taken inside a pass, has no logits, so it is
     * not restored as the whole request; that request's own end-of-prefill checkpoint gives it its logits,
     * and a repeat restores it whole */
    assert_int_equal(check_request(f, pc, s, ids, MARK, NULL), 0);
    assert_int_equal(check_request(f, pc, s, ids, MARK, NULL), MARK);

    /* another conversation sharing ids [0, 300): blocks [0, 256) shared, new ones after */
    lily_prefix_cache_stats_get(pc, &st);
    const int blocks_before = st.n_blocks;
    int32_t other[N];
    memcpy(other, ids, sizeof ids);
    for (int i = 300; i < N; i++)
        other[i] = 20 + (int32_t)((i * 104729u) % 480u);
    assert_int_equal(check_request(f, pc, s, other, N, NULL), 0); /* no checkpoint inside [0, 300) */
    lily_prefix_cache_stats_get(pc, &st);
    assert_int_equal(st.n_blocks, blocks_before + N / B - 300 / B);

    lily_prefix_cache_clear(pc);
    lily_prefix_cache_stats_get(pc, &st);
    assert_int_equal(st.n_blocks, 0);
    assert_int_equal(st.bytes, 0);
    lily_session_free(s);
    lily_prefix_cache_free(pc);
}

/* lily_prefix_cache_defer (what lily serve sets): the checkpoints a prefill takes after its last forward pass
 * (a mark inside that pass, the end of the prompt) wait for lily_prefix_cache_flush. Flushed while the
 * session still holds the prompt, they are the checkpoints an undeferred prefill takes (later requests
 * restore them and match cold runs bit for bit); after an append the end's is dropped and the mark's kept;
 * after a reset both are dropped. */
static void test_deferred_checkpoints(void **state)
{
    fixture *f = *state;
    lily_error err = {0};
    enum { N = 300, MARK = 290 };
    lily_prefix_cache *pc = NULL;
    lily_prefix_cache_options o = {.checkpoint_every = -1, .block_rows = 64};
    assert_int_equal(lily_prefix_cache_new(&o, &pc, &err), LILY_OK);
    lily_prefix_cache_defer(pc, true);
    lily_session *s = NULL;
    assert_int_equal(lily_session_new(f->engine, CTX, &s, &err), LILY_OK);
    int32_t ids[N], other[N], third[N];
    for (int i = 0; i < N; i++) {
        ids[i] = 20 + (int32_t)((i * 7919u) % 480u);
        other[i] = 20 + (int32_t)((i * 104729u) % 480u);
        third[i] = 20 + (int32_t)((i * 15485863u) % 480u);
    }
    const int mark = MARK;
    lily_prefix_cache_stats st;
    int reused = -1;
    assert_int_equal(lily_prefix_cache_prefill(pc, s, ids, N, &mark, 1, NULL, NULL, &reused, &err), LILY_OK);
    lily_prefix_cache_stats_get(pc, &st);
    assert_int_equal(st.n_checkpoints, 0); /* both pending */
    assert_int_equal(lily_prefix_cache_flush(pc, s, &err), LILY_OK);
    lily_prefix_cache_stats_get(pc, &st);
    assert_int_equal(st.n_checkpoints, 2);
    assert_int_equal(lily_prefix_cache_flush(pc, s, &err), LILY_OK); /* nothing left: a no-op */
    lily_prefix_cache_stats_get(pc, &st);
    assert_int_equal(st.n_checkpoints, 2);
    /* restored: the whole prompt (its logits kept), and the mark under an edit after it */
    assert_int_equal(check_request(f, pc, s, ids, N, NULL), N);
    int32_t edited[N];
    memcpy(edited, ids, sizeof ids);
    edited[295] = edited[295] == 30 ? 31 : 30;
    assert_int_equal(check_request(f, pc, s, edited, N, NULL), MARK);

    /* a token appended before the flush: the end's checkpoint is dropped, the mark's kept */
    lily_prefix_cache_stats_get(pc, &st);
    int before = st.n_checkpoints;
    assert_int_equal(lily_prefix_cache_prefill(pc, s, other, N, &mark, 1, NULL, NULL, &reused, &err), LILY_OK);
    assert_int_equal(reused, 0);
    const int32_t next = 42;
    assert_int_equal(lily_session_append(s, &next, 1, NULL, &err), LILY_OK);
    assert_int_equal(lily_prefix_cache_flush(pc, s, &err), LILY_OK);
    lily_prefix_cache_stats_get(pc, &st);
    assert_int_equal(st.n_checkpoints, before + 1);
    assert_int_equal(check_request(f, pc, s, other, N, NULL), MARK);

    /* a reset before the flush: both dropped */
    lily_prefix_cache_stats_get(pc, &st);
    before = st.n_checkpoints;
    assert_int_equal(lily_prefix_cache_prefill(pc, s, third, N, &mark, 1, NULL, NULL, &reused, &err), LILY_OK);
    lily_session_reset(s);
    assert_int_equal(lily_prefix_cache_flush(pc, s, &err), LILY_OK);
    lily_prefix_cache_stats_get(pc, &st);
    assert_int_equal(st.n_checkpoints, before);
    /* pending at the end: freed with the cache (ASan) */
    assert_int_equal(lily_prefix_cache_prefill(pc, s, third, N, &mark, 1, NULL, NULL, &reused, &err), LILY_OK);
    lily_session_free(s);
    lily_prefix_cache_free(pc);
}

/* A stand-in for a backend with device pools: the CPU backend whose "device pool" is host memory, so the
 * cache's device path (pool allocator, placement, host fallback when it is full, accounting, eviction)
 * runs here; the CUDA copies themselves are tests/cuda/test_cuda_prefix_cache.c's. */
static lily_backend_ops g_fake_ops;
static int g_fake_pools;
static lily_state_loc fake_host(lily_state_loc loc)
{
    if (!loc.host)
        loc.host = (uint8_t *)loc.device_pool + loc.offset;
    return loc;
}
static lily_status fake_pool_new(void *ctx, size_t bytes, void **pool, lily_error *err)
{
    (void)ctx;
    *pool = malloc(bytes);
    g_fake_pools += *pool != NULL;
    return *pool ? LILY_OK : lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "fake pool");
}
static void fake_pool_free(void *ctx, void *pool)
{
    (void)ctx;
    g_fake_pools--;
    free(pool);
}
static lily_status fake_kv_save(void *ctx, const void *st, int row0, int n, lily_state_loc loc, lily_error *err)
{
    return lily_cpu_backend_ops.kv_save(ctx, st, row0, n, fake_host(loc), err);
}
static lily_status fake_kv_load(void *ctx, void *st, int row0, int n, lily_state_loc loc, lily_error *err)
{
    return lily_cpu_backend_ops.kv_load(ctx, st, row0, n, fake_host(loc), err);
}
static lily_status fake_rec_save(void *ctx, const void *st, lily_state_loc loc, lily_error *err)
{
    return lily_cpu_backend_ops.recurrent_save(ctx, st, fake_host(loc), err);
}
static lily_status fake_rec_load(void *ctx, void *st, lily_state_loc loc, lily_error *err)
{
    return lily_cpu_backend_ops.recurrent_load(ctx, st, fake_host(loc), err);
}

/* With a device pool that fills up: checkpoints go to the pool first, then to host memory, all exact; the
 * pool's space comes back whole when they go; then the 30 alternating requests (a pool that fills, and a
 * host pool so small that checkpoints are evicted) are exact too. */
static void test_device_pool(void **state)
{
    fixture *f = *state;
    lily_error err = {0};
    const lily_backend_ops *cpu = f->engine->backend.ops;
    g_fake_ops = *cpu;
    g_fake_ops.device_pool_new = fake_pool_new;
    g_fake_ops.device_pool_free = fake_pool_free;
    g_fake_ops.kv_save = fake_kv_save;
    g_fake_ops.kv_load = fake_kv_load;
    g_fake_ops.recurrent_save = fake_rec_save;
    g_fake_ops.recurrent_load = fake_rec_load;
    f->engine->backend.ops = &g_fake_ops;
    const size_t row = cpu->kv_row_bytes(f->engine->backend.ctx), rec = cpu->recurrent_bytes(f->engine->backend.ctx);

    enum { N = 300 };
    g_device_bytes = ((size_t)N * row + 2 * rec) / 256 * 256; /* about one checkpoint of N tokens */
    lily_prefix_cache *pc = new_cache(0, 100);
    lily_session *s = NULL;
    assert_int_equal(lily_session_new(f->engine, CTX, &s, &err), LILY_OK);
    assert_int_equal(lily_prefix_cache_attach(pc, f->engine, &err), LILY_OK);
    assert_int_equal(g_fake_pools, 1);
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = 20 + (int32_t)((i * 7919u) % 480u);
    assert_int_equal(check_request(f, pc, s, ids, N, NULL), 0); /* checkpoints at 100, 200, 300, 308 */
    lily_prefix_cache_stats st;
    lily_prefix_cache_stats_get(pc, &st);
    assert_int_equal(st.device_capacity_bytes, g_device_bytes);
    assert_true(st.device_bytes > g_device_bytes / 2 && st.device_bytes <= g_device_bytes);
    assert_true(st.bytes > 0); /* the rest fell back to host memory */
    const size_t device_first = st.device_bytes;
    ids[250] = ids[250] == 30 ? 31 : 30;
    assert_int_equal(check_request(f, pc, s, ids, N, NULL), 200);
    ids[150] = ids[150] == 30 ? 31 : 30;
    assert_int_equal(check_request(f, pc, s, ids, N, NULL), 100);
    lily_prefix_cache_clear(pc);
    lily_prefix_cache_stats_get(pc, &st);
    assert_int_equal(st.device_bytes, 0);
    assert_int_equal(st.bytes, 0);
    ids[150] = ids[150] == 30 ? 31 : 30;
    ids[250] = ids[250] == 30 ? 31 : 30;
    assert_int_equal(check_request(f, pc, s, ids, N, NULL), 0);
    lily_prefix_cache_stats_get(pc, &st);
    assert_int_equal(st.device_bytes, device_first); /* the freed extents merged back: same placement */
    lily_session_free(s);
    lily_prefix_cache_free(pc);
    assert_int_equal(g_fake_pools, 0);

    g_device_bytes = 96 << 10;
    alternate(f, 0, 30, false);
    int32_t probe[200];
    for (int i = 0; i < 200; i++)
        probe[i] = 20 + i;
    assert_int_equal(lily_session_new(f->engine, CTX, &s, &err), LILY_OK);
    assert_int_equal(lily_session_append(s, probe, 200, NULL, &err), LILY_OK);
    const size_t one = cpu->state_save_size(f->engine->backend.ctx, s->state) + 200 * sizeof(int32_t) +
                       (size_t)f->vocab * sizeof(float);
    lily_session_free(s);
    alternate(f, 3 * one, 12, true);
    assert_int_equal(g_fake_pools, 0);
    g_device_bytes = 0;
    f->engine->backend.ops = cpu;
}

/* A backend with a page-locked host pool (here plain malloc): host checkpoints are carved from it, each
 * save lands inside it, restores stay exact, the pool goes with the cache; when it cannot be made, host
 * checkpoints are malloc'd as before. */
static int g_host_pools;
static bool g_host_pool_fails;
static uint8_t *g_host_base;
static size_t g_host_size;
static int g_saves_in_pool, g_saves_outside;
static lily_status fake_host_pool_new(void *ctx, size_t bytes, void **pool, lily_error *err)
{
    (void)ctx;
    *pool = g_host_pool_fails ? NULL : malloc(bytes);
    if (!*pool)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "fake host pool");
    g_host_pools++;
    g_host_base = *pool;
    g_host_size = bytes;
    return LILY_OK;
}
static void fake_host_pool_free(void *ctx, void *pool)
{
    (void)ctx;
    g_host_pools--;
    free(pool);
}
static void count_save(lily_state_loc loc)
{
    const uint8_t *p = loc.host;
    if (p && g_host_base && p >= g_host_base && p < g_host_base + g_host_size)
        g_saves_in_pool++;
    else
        g_saves_outside++;
}
static lily_status counting_kv_save(void *ctx, const void *st, int row0, int n, lily_state_loc loc, lily_error *err)
{
    count_save(loc);
    return lily_cpu_backend_ops.kv_save(ctx, st, row0, n, loc, err);
}
static lily_status counting_rec_save(void *ctx, const void *st, lily_state_loc loc, lily_error *err)
{
    count_save(loc);
    return lily_cpu_backend_ops.recurrent_save(ctx, st, loc, err);
}

static void test_host_pool(void **state)
{
    fixture *f = *state;
    lily_error err = {0};
    const lily_backend_ops *cpu = f->engine->backend.ops;
    g_fake_ops = *cpu;
    g_fake_ops.host_pool_new = fake_host_pool_new;
    g_fake_ops.host_pool_free = fake_host_pool_free;
    g_fake_ops.kv_save = counting_kv_save;
    g_fake_ops.recurrent_save = counting_rec_save;
    f->engine->backend.ops = &g_fake_ops;

    enum { N = 300 };
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = 20 + (int32_t)((i * 7919u) % 480u);
    for (int fails = 0; fails < 2; fails++) {
        g_host_pool_fails = fails;
        g_saves_in_pool = g_saves_outside = 0;
        const size_t cap = (size_t)8 << 20;
        lily_prefix_cache *pc = new_cache(cap, 100);
        lily_session *s = NULL;
        assert_int_equal(lily_session_new(f->engine, CTX, &s, &err), LILY_OK);
        assert_int_equal(lily_prefix_cache_attach(pc, f->engine, &err), LILY_OK);
        assert_int_equal(g_host_pools, fails ? 0 : 1);
        lily_prefix_cache_stats st = {0};
        lily_prefix_cache_stats_get(pc, &st);
        assert_int_equal(st.host_pinned_bytes, fails ? 0 : cap);
        assert_int_equal(check_request(f, pc, s, ids, N, NULL), 0); /* checkpoints at 100, 200, 300, 308 */
        ids[250] = ids[250] == 30 ? 31 : 30;
        assert_int_equal(check_request(f, pc, s, ids, N, NULL), 200);
        ids[150] = ids[150] == 30 ? 31 : 30;
        assert_int_equal(check_request(f, pc, s, ids, N, NULL), 100);
        assert_true(fails ? g_saves_in_pool == 0 : g_saves_outside == 0);
        assert_true(fails ? g_saves_outside > 0 : g_saves_in_pool > 0);
        lily_prefix_cache_clear(pc);
        lily_prefix_cache_stats_get(pc, &st);
        assert_int_equal(st.bytes, 0);
        lily_session_free(s);
        lily_prefix_cache_free(pc);
        assert_int_equal(g_host_pools, 0);
        g_host_base = NULL;
    }
    g_host_pool_fails = false;
    f->engine->backend.ops = cpu;
}

/* ---- a tight host cap -------------------------------------------------------------------------------- */

static void fill_ids(int32_t *ids, int n, int first)
{
    for (int i = 0; i < n; i++)
        ids[i] = (first + i) % 400 + 20;
}

/* s := exactly ids[n] (reset, one append). */
static void session_hold(lily_session *s, const int32_t *ids, int n)
{
    lily_error err = {0};
    lily_session_reset(s);
    if (lily_session_append(s, ids, n, NULL, &err) != LILY_OK)
        fail_msg("append: %s", err.message);
}

static lily_prefix_cache_stats stats_of(lily_prefix_cache *pc)
{
    lily_prefix_cache_stats st;
    lily_prefix_cache_stats_get(pc, &st);
    return st;
}

/* A checkpoint larger than the whole cap is skipped without evicting the ones held. */
static void test_tight_cap_checks_fit_before_evicting(void **state)
{
    fixture *f = *state;
    lily_error err = {0};
    lily_session *s = NULL;
    assert_int_equal(lily_session_new(f->engine, CTX, &s, &err), LILY_OK);
    lily_prefix_cache *pc = new_cache(0, 0);
    int32_t ids[1500];
    fill_ids(ids, 1500, 0);
    session_hold(s, ids, 60);
    assert_int_equal(lily_prefix_cache_checkpoint(pc, s, &err), LILY_OK);
    const size_t one = stats_of(pc).bytes;
    lily_prefix_cache_set_ram_bytes(pc, 3 * one);
    session_hold(s, ids + 100, 1400); /* about 1.4 MB of KV rows alone: more than the cap */
    assert_int_equal(lily_prefix_cache_checkpoint(pc, s, &err), LILY_OK);
    const lily_prefix_cache_stats st = stats_of(pc);
    assert_int_equal(st.n_checkpoints, 1);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.bytes, one);
    assert_int_equal(st.checkpoints_taken, 1);
    lily_session_free(s);
    lily_prefix_cache_free(pc);
}

/* A prefill with marks at 30 (the system block) and 70 (the turn-resume <think>) leaves checkpoints at 30,
 * 70 and 80; three unrelated checkpoints then push the pool over its cap. The marks outlive the rest (the
 * end of the prefill and the older unrelated ones go first), so the next turn, which parts from the first
 * at 70, still reuses 70 tokens, bit-identical to a cold run. */
static void test_tight_cap_keeps_mark_checkpoints(void **state)
{
    fixture *f = *state;
    lily_error err = {0};
    lily_session *s = NULL;
    assert_int_equal(lily_session_new(f->engine, CTX, &s, &err), LILY_OK);
    lily_prefix_cache *pc = new_cache(0, 0);
    int32_t turn1[80], turn2[110], other[80];
    fill_ids(turn1, 80, 0);
    fill_ids(turn2, 110, 0);
    for (int i = 70; i < 110; i++)
        turn2[i] = 450 + i % 40; /* parts from turn 1 at 70 */
    const int marks[2] = {30, 70};
    int reused = -1;
    assert_int_equal(lily_prefix_cache_prefill(pc, s, turn1, 80, marks, 2, NULL, NULL, &reused, &err), LILY_OK);
    assert_int_equal(stats_of(pc).n_checkpoints, 3);
    const size_t three = stats_of(pc).bytes;
    session_hold(s, turn1, 80); /* the size of one 80-token checkpoint, measured in a second cache */
    lily_prefix_cache *probe = new_cache(0, 0);
    assert_int_equal(lily_prefix_cache_checkpoint(probe, s, &err), LILY_OK);
    const size_t one80 = stats_of(probe).bytes;
    lily_prefix_cache_free(probe);
    lily_prefix_cache_set_ram_bytes(pc, three + one80 / 2);
    for (int k = 0; k < 3; k++) {
        fill_ids(other, 80, 200 + 7 * k);
        session_hold(s, other, 80);
        assert_int_equal(lily_prefix_cache_checkpoint(pc, s, &err), LILY_OK);
    }
    const lily_prefix_cache_stats st = stats_of(pc);
    assert_true(st.evictions >= 3);
    assert_true(st.bytes <= three + one80 / 2);
    lily_session_reset(s);
    assert_int_equal(check_request(f, pc, s, turn2, 110, NULL), 70);
    lily_session_free(s);
    lily_prefix_cache_free(pc);
}

static int cancel_on_third_poll(void *user)
{
    int *polls = user;
    return ++*polls >= 3;
}

/* A prefill cancelled after two pieces (128 tokens each, the fixture's prefill_chunk) keeps them: the
 * session holds 256 tokens and so does a checkpoint, which a retry of the request restores (after
 * another request replaced the live session), bit-identical to a cold run. Its stats' last_* are its own. */
static void test_cancelled_prefill_keeps_what_it_computed(void **state)
{
    fixture *f = *state;
    lily_error err = {0};
    lily_session *s = NULL;
    assert_int_equal(lily_session_new(f->engine, CTX, &s, &err), LILY_OK);
    lily_prefix_cache *pc = new_cache(0, 0);
    int32_t ids[400];
    fill_ids(ids, 400, 3);
    int polls = 0, reused = -1;
    assert_int_equal(lily_prefix_cache_prefill(pc, s, ids, 400, NULL, 0, cancel_on_third_poll, &polls, &reused, &err),
                     LILY_ERR_CANCELLED);
    assert_int_equal(s->n_tokens, 256);
    assert_memory_equal(s->tokens, ids, 256 * sizeof(int32_t));
    assert_int_equal(stats_of(pc).n_checkpoints, 1);
    assert_int_equal(stats_of(pc).prefilled_tokens, 256);
    /* the request log's times are this prefill's (they were the previous one's: here none, 0 pieces) */
    assert_int_equal(stats_of(pc).last_pieces, 2);
    assert_true(stats_of(pc).last_forward_s > 0);
    session_hold(s, ids + 50, 20); /* another request in between */
    assert_int_equal(check_request(f, pc, s, ids, 400, NULL), 256);
    lily_session_free(s);
    lily_prefix_cache_free(pc);
}

static int cancel_always(void *user)
{
    (void)user;
    return 1;
}

/* A prefill cancelled before its first forward pass, right after restoring a mark's checkpoint (which
 * carries no logits): the session must not be left holding the mark's ids with the logits of whatever it
 * held before, since a later request whose prompt is exactly those ids would take them as the live
 * session's (no forward pass) and sample from logits of another sequence. */
static void test_cancel_after_logitless_restore(void **state)
{
    fixture *f = *state;
    lily_error err = {0};
    enum { N = 300, MARK = 290 };
    lily_prefix_cache *pc = NULL;
    lily_prefix_cache_options o = {.checkpoint_every = -1, .block_rows = 64};
    assert_int_equal(lily_prefix_cache_new(&o, &pc, &err), LILY_OK);
    lily_session *s = NULL;
    assert_int_equal(lily_session_new(f->engine, CTX, &s, &err), LILY_OK);
    int32_t ids[N], edited[N];
    for (int i = 0; i < N; i++)
        ids[i] = 20 + (int32_t)((i * 7919u) % 480u);
    memcpy(edited, ids, sizeof ids);
    edited[295] = edited[295] == 30 ? 31 : 30;
    const int mark = MARK;
    int reused = -1;
    assert_int_equal(lily_prefix_cache_prefill(pc, s, ids, N, &mark, 1, NULL, NULL, &reused, &err), LILY_OK);
    assert_int_equal(stats_of(pc).n_checkpoints, 2); /* the mark's (no logits) and the end's */
    const int32_t next = 42; /* a reply token: the session's logits are now those after ids + next */
    assert_int_equal(lily_session_append(s, &next, 1, NULL, &err), LILY_OK);
    assert_int_equal(lily_prefix_cache_prefill(pc, s, edited, N, &mark, 1, cancel_always, NULL, &reused, &err),
                     LILY_ERR_CANCELLED);
    assert_int_equal(reused, MARK);
    /* the prompt that ends at the mark: cold and cached agree (nothing is reused: the mark's checkpoint is
     * not restored as a whole request, and the cancelled prefill left no session) */
    assert_int_equal(check_request(f, pc, s, ids, MARK, NULL), 0);
    lily_session_free(s);
    lily_prefix_cache_free(pc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_turn_chat),
        cmocka_unit_test(test_two_turn_chat_thinking),
        cmocka_unit_test(test_exact_repeat),
        cmocka_unit_test(test_shared_system_prompt),
        cmocka_unit_test(test_edit_in_the_middle),
        cmocka_unit_test(test_thirty_requests_three_conversations),
        cmocka_unit_test(test_thirty_requests_small_pool),
        cmocka_unit_test(test_checkpoints_share_blocks),
        cmocka_unit_test(test_deferred_checkpoints),
        cmocka_unit_test(test_device_pool),
        cmocka_unit_test(test_host_pool),
        cmocka_unit_test(test_tight_cap_checks_fit_before_evicting),
        cmocka_unit_test(test_tight_cap_keeps_mark_checkpoints),
        cmocka_unit_test(test_cancelled_prefill_keeps_what_it_computed),
        cmocka_unit_test(test_cancel_after_logitless_restore),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
