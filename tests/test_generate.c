/* test_generate.c — the generation loop on a scripted fake session: stop ids, stop strings across tokens,
 * max tokens, a full context, cancellation, continuing a session, seeded sampling.
 *
 * The fake: this file defines lily_session_append itself, so the linker takes it instead of the real
 * engine's (lily_generate is the only caller, and nothing here pulls the engine object in). After each
 * append the logits make next_of[last token] the argmax, so greedy decoding follows a fixed script. */
#include "test_support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/generate.h"

enum { VOCAB = 8, EOS = 0, ENDOFTEXT = 6, PROMPT = 7 };
static const char *const token_text[VOCAB] = {"<|im_end|>", "Hello", " wor", "ld", "!", " Bye", "<|endoftext|>", "<p>"};
static const int32_t next_of[VOCAB] = {1, 2, 3, 4, 5, EOS, 1, 1};
static bool uniform_logits; /* every token equally likely instead of the script */
static int n_appends;
static atomic_int *cancel_at_append; /* when set: raised by the append that brings n_appends to cancel_after */
static int cancel_after;
static const int32_t *script; /* when set: after k tokens, script[k - 1] is next (vocab = script_vocab) */
static int script_len, script_vocab;

lily_status lily_session_append(lily_session *s, const int32_t *tokens, int n, float *logits_all, lily_error *err)
{
    (void)logits_all;
    if (s->n_tokens + n > s->max_ctx)
        return lily_error_set(err, LILY_ERR_CONTEXT_LENGTH, "fake: %d + %d tokens exceed the context of %d",
                              s->n_tokens, n, s->max_ctx);
    const int vocab = script ? script_vocab : VOCAB;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "fake: token %d", tokens[i]);
    memcpy(s->tokens + s->n_tokens, tokens, (size_t)n * sizeof *tokens);
    s->n_tokens += n;
    if (++n_appends == cancel_after && cancel_at_append)
        atomic_store(cancel_at_append, 1); /* as Ctrl-C during this forward pass */
    if (script) {
        int32_t next = s->n_tokens - 1 < script_len ? script[s->n_tokens - 1] : 0;
        for (int v = 0; v < vocab; v++)
            s->logits[v] = v == next ? 10.0f : 0.0f;
        return LILY_OK;
    }
    int32_t last = s->tokens[s->n_tokens - 1];
    for (int v = 0; v < VOCAB; v++)
        s->logits[v] = uniform_logits ? 0.0f : v == next_of[last] ? 10.0f : (float)v * 0.1f;
    return LILY_OK;
}

/* A fake detokenizer that, like a real one inside a UTF-8 character, holds back the text of "!" until
 * the next token or the flush. */
typedef struct {
    char out[256];
    bool holding_bang;
} fake_detok;

static lily_status detok_feed(void *state, int32_t token, const char **text, size_t *len, lily_error *err)
{
    (void)err;
    fake_detok *d = state;
    snprintf(d->out, sizeof d->out, "%s%s", d->holding_bang ? "!" : "", token == 4 ? "" : token_text[token]);
    d->holding_bang = token == 4;
    *text = d->out;
    *len = strlen(d->out);
    return LILY_OK;
}

static lily_status detok_flush(void *state, const char **text, size_t *len, lily_error *err)
{
    (void)err;
    fake_detok *d = state;
    snprintf(d->out, sizeof d->out, "%s", d->holding_bang ? "!" : "");
    d->holding_bang = false;
    *text = d->out;
    *len = strlen(d->out);
    return LILY_OK;
}

typedef struct {
    char text[1024];
    int32_t tokens[64];
    int n_tokens;
    int stop_after; /* return nonzero from the callback after this many tokens (0 = never) */
} streamed;

static int on_token(void *user, int32_t token, const char *text, size_t len)
{
    streamed *o = user;
    strncat(o->text, text, len);
    if (token >= 0)
        o->tokens[o->n_tokens++] = token;
    return o->stop_after && o->n_tokens >= o->stop_after;
}

typedef struct {
    lily_engine engine;
    lily_session session;
    int32_t tokens[64];
    float logits[VOCAB];
    fake_detok detok;
    streamed out;
    lily_generate_params params;
} fixture;

static void setup(fixture *f, int max_ctx)
{
    memset(f, 0, sizeof *f);
    f->engine.cfg.vocab_size = VOCAB;
    f->session = (lily_session){.engine = &f->engine, .max_ctx = max_ctx, .tokens = f->tokens, .logits = f->logits};
    f->params = lily_generate_defaults();
    f->params.sampling.temperature = 0.0f;
    f->params.detok = (lily_detok_interface){&f->detok, detok_feed, detok_flush};
    f->params.on_token = on_token;
    f->params.user = &f->out;
    uniform_logits = false;
    n_appends = 0;
    cancel_at_append = NULL;
    cancel_after = 0;
}

static void assert_session(const fixture *f, const int32_t *expect, int n)
{
    assert_int_equal(f->session.n_tokens, n);
    for (int i = 0; i < n; i++)
        assert_int_equal(f->session.tokens[i], expect[i]);
}

static const int32_t prompt[1] = {PROMPT};
static const int32_t stop_ids[2] = {EOS, ENDOFTEXT};

static void test_generate_stops_at_stop_id(void **state)
{
    (void)state;
    fixture f;
    setup(&f, 64);
    f.params.stop_ids = stop_ids;
    f.params.n_stop_ids = 2;
    lily_generate_result r;
    lily_error err = {0};
    assert_int_equal(lily_generate(&f.session, prompt, 1, &f.params, &r, &err), LILY_OK);
    assert_string_equal(f.out.text, "Hello world! Bye");
    assert_int_equal(r.finish, LILY_FINISH_STOP);
    assert_string_equal(lily_finish_reason_name(r.finish), "stop");
    assert_int_equal(r.stop_token, EOS);
    assert_int_equal(r.stop_string, -1);
    assert_int_equal(r.last_token, -1);
    assert_int_equal(r.n_prompt, 1);
    assert_int_equal(r.n_generated, 5);
    assert_int_equal(r.n_decode_steps, 5);
    const int32_t expect[6] = {PROMPT, 1, 2, 3, 4, 5}; /* every streamed token, not the stop token */
    assert_session(&f, expect, 6);
    assert_int_equal(f.out.n_tokens, 5);
    assert_true(r.prefill_seconds >= 0.0 && r.decode_seconds >= 0.0);
}

static void test_generate_max_tokens_flushes_held_text(void **state)
{
    (void)state;
    fixture f;
    setup(&f, 64);
    f.params.max_tokens = 4;
    lily_generate_result r;
    lily_error err = {0};
    assert_int_equal(lily_generate(&f.session, prompt, 1, &f.params, &r, &err), LILY_OK);
    assert_string_equal(f.out.text, "Hello world!"); /* "!" came from the detokenizer's flush */
    assert_int_equal(r.finish, LILY_FINISH_LENGTH);
    assert_int_equal(r.n_generated, 4);
    assert_int_equal(r.n_decode_steps, 3);
    assert_int_equal(r.last_token, 4);
    const int32_t expect[4] = {PROMPT, 1, 2, 3};
    assert_session(&f, expect, 4);
}

static void test_generate_stop_string_across_tokens(void **state)
{
    (void)state;
    const struct {
        const char *stop;
        const char *text;
        int32_t last_token;
    } cases[] = {
        {"world", "Hello ", 3},       /* " wor" + "ld" */
        {"ld! B", "Hello wor", 5},    /* "ld", then "!" held by the detokenizer, then " Bye" */
        {"Bye", "Hello world! ", 5},
        {"wox", "Hello world! Bye", -1}, /* a false start: everything is released */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fixture f;
        setup(&f, 64);
        f.params.stop_ids = stop_ids;
        f.params.n_stop_ids = 2;
        const char *stops[2] = {"never", cases[i].stop};
        f.params.stop_strings = stops;
        f.params.n_stop_strings = 2;
        lily_generate_result r;
        lily_error err = {0};
        assert_int_equal(lily_generate(&f.session, prompt, 1, &f.params, &r, &err), LILY_OK);
        assert_string_equal(f.out.text, cases[i].text);
        assert_int_equal(r.finish, LILY_FINISH_STOP);
        assert_int_equal(r.stop_string, cases[i].last_token >= 0 ? 1 : -1);
        assert_int_equal(r.last_token, cases[i].last_token);
    }
}

static void test_generate_context_full_is_length(void **state)
{
    (void)state;
    fixture f;
    setup(&f, 3);
    lily_generate_result r;
    lily_error err = {0};
    assert_int_equal(lily_generate(&f.session, prompt, 1, &f.params, &r, &err), LILY_OK);
    /* prompt + reply fill the context and never exceed it (vLLM: prompt + completion <= max_model_len):
     * the second token takes the last position, streamed and not appended */
    assert_string_equal(f.out.text, "Hello wor");
    assert_int_equal(r.finish, LILY_FINISH_LENGTH);
    assert_int_equal(r.n_generated, 2);
    assert_int_equal(r.n_prompt + r.n_generated, 3);
    assert_int_equal(r.last_token, 2);
    assert_int_equal(f.session.n_tokens, 2);

    /* a prompt that fills the context: no reply at all, finish length */
    setup(&f, 3);
    static const int32_t full[3] = {PROMPT, PROMPT, PROMPT};
    assert_int_equal(lily_generate(&f.session, full, 3, &f.params, &r, &err), LILY_OK);
    assert_string_equal(f.out.text, "");
    assert_int_equal(r.finish, LILY_FINISH_LENGTH);
    assert_int_equal(r.n_generated, 0);
    assert_int_equal(f.session.n_tokens, 3);

    /* a prompt that does not fit: the error, and nothing streamed */
    setup(&f, 3);
    const int32_t long_prompt[4] = {PROMPT, PROMPT, PROMPT, PROMPT};
    assert_int_equal(lily_generate(&f.session, long_prompt, 4, &f.params, &r, &err), LILY_ERR_CONTEXT_LENGTH);
    assert_int_equal(f.session.n_tokens, 0);
    assert_int_equal(f.out.n_tokens, 0);
}

/* The prompt is prefilled a chunk (engine->prefill_chunk) per append, and a cancel raised during one stops
 * before the next (lily run's Ctrl-C waited for the whole prompt: minutes for a long one on a CPU); without
 * a cancel the chunks add up to the whole prompt and the same reply. Whole-prompt errors come before the
 * first chunk, as from one append. */
static void test_generate_prefill_chunks_and_cancel(void **state)
{
    (void)state;
    const int32_t five[5] = {PROMPT, PROMPT, PROMPT, PROMPT, 1};
    fixture f;
    setup(&f, 64);
    f.engine.prefill_chunk = 2;
    f.params.max_tokens = 2;
    lily_generate_result r;
    lily_error err = {0};
    assert_int_equal(lily_generate(&f.session, five, 5, &f.params, &r, &err), LILY_OK);
    assert_int_equal(r.n_prompt, 5);
    assert_int_equal(n_appends, 3 + 1); /* 2 + 2 + 1, then the first generated token's decode step */
    assert_string_equal(f.out.text, " world");
    const int32_t expect[7] = {PROMPT, PROMPT, PROMPT, PROMPT, 1, 2, 3};
    assert_session(&f, expect, 6); /* the last sampled token is not appended */

    setup(&f, 64);
    f.engine.prefill_chunk = 2;
    atomic_int cancel = 0;
    f.params.cancel = &cancel;
    cancel_at_append = &cancel;
    cancel_after = 1;
    assert_int_equal(lily_generate(&f.session, five, 5, &f.params, &r, &err), LILY_OK);
    assert_int_equal(r.finish, LILY_FINISH_CANCELLED);
    assert_int_equal(r.n_prompt, 2);
    assert_int_equal(r.n_generated, 0);
    assert_int_equal(f.out.n_tokens, 0);
    assert_session(&f, five, 2);

    setup(&f, 4); /* 5 ids in a context of 4: nothing appended */
    f.engine.prefill_chunk = 2;
    assert_int_equal(lily_generate(&f.session, five, 5, &f.params, &r, &err), LILY_ERR_CONTEXT_LENGTH);
    assert_int_equal(f.session.n_tokens, 0);
    setup(&f, 64);
    f.engine.prefill_chunk = 2;
    const int32_t bad[5] = {PROMPT, PROMPT, PROMPT, PROMPT, VOCAB};
    assert_int_equal(lily_generate(&f.session, bad, 5, &f.params, &r, &err), LILY_ERR_INVALID_ARGUMENT);
    assert_int_equal(f.session.n_tokens, 0);
    assert_non_null(strstr(err.message, "token id 8 (at 4) is outside the vocabulary [0, 8)"));
}

static void test_generate_cancellation(void **state)
{
    (void)state;
    fixture f;
    setup(&f, 64);
    atomic_int cancel = 1;
    f.params.cancel = &cancel;
    lily_generate_result r;
    lily_error err = {0};
    assert_int_equal(lily_generate(&f.session, prompt, 1, &f.params, &r, &err), LILY_OK);
    assert_int_equal(r.finish, LILY_FINISH_CANCELLED);
    assert_int_equal(r.n_generated, 0);
    assert_int_equal(f.session.n_tokens, 1); /* the prompt was prefilled */

    setup(&f, 64);
    f.out.stop_after = 2; /* the callback asks to stop after " wor" */
    assert_int_equal(lily_generate(&f.session, prompt, 1, &f.params, &r, &err), LILY_OK);
    assert_int_equal(r.finish, LILY_FINISH_CANCELLED);
    assert_string_equal(lily_finish_reason_name(r.finish), "cancelled");
    assert_string_equal(f.out.text, "Hello wor");
    assert_int_equal(r.n_generated, 2);
    assert_int_equal(r.last_token, 2);
    const int32_t expect[2] = {PROMPT, 1};
    assert_session(&f, expect, 2);
}

static void test_generate_continues_a_session(void **state)
{
    (void)state;
    fixture f;
    setup(&f, 64);
    f.params.max_tokens = 2;
    lily_generate_result r;
    lily_error err = {0};
    assert_int_equal(lily_generate(&f.session, prompt, 1, &f.params, &r, &err), LILY_OK);
    assert_string_equal(f.out.text, "Hello wor");
    /* keep the session: append the token that was streamed but not appended, then continue */
    assert_int_equal(lily_session_append(&f.session, &r.last_token, 1, NULL, &err), LILY_OK);
    f.out = (streamed){0};
    assert_int_equal(lily_generate(&f.session, NULL, 0, &f.params, &r, &err), LILY_OK);
    assert_string_equal(f.out.text, "ld!");
    assert_int_equal(r.n_prompt, 0);
    const int32_t expect[4] = {PROMPT, 1, 2, 3};
    assert_session(&f, expect, 4);

    /* nothing to continue from */
    setup(&f, 64);
    assert_int_equal(lily_generate(&f.session, NULL, 0, &f.params, &r, &err), LILY_ERR_INVALID_ARGUMENT);
}

static void test_generate_seeded_sampling_repeats(void **state)
{
    (void)state;
    int32_t runs[3][20];
    const uint64_t seeds[3] = {42, 42, 43};
    for (int k = 0; k < 3; k++) {
        fixture f;
        setup(&f, 64);
        uniform_logits = true;
        f.params.sampling.temperature = 1.0f;
        f.params.sampling.seed = seeds[k];
        f.params.max_tokens = 20;
        lily_generate_result r;
        lily_error err = {0};
        assert_int_equal(lily_generate(&f.session, prompt, 1, &f.params, &r, &err), LILY_OK);
        assert_int_equal(f.out.n_tokens, 20);
        memcpy(runs[k], f.out.tokens, sizeof runs[k]);
        assert_int_equal(n_appends, 20); /* the prompt, then 19 decode steps */
    }
    assert_memory_equal(runs[0], runs[1], sizeof runs[0]);
    assert_memory_not_equal(runs[0], runs[2], sizeof runs[0]);
}

static void test_generate_rejects_bad_arguments(void **state)
{
    (void)state;
    fixture f;
    setup(&f, 64);
    const char *stops[1] = {"x"};
    f.params.stop_strings = stops;
    f.params.n_stop_strings = 1;
    f.params.detok.feed = NULL;
    lily_generate_result r;
    lily_error err = {0};
    assert_int_equal(lily_generate(&f.session, prompt, 1, &f.params, &r, &err), LILY_ERR_INVALID_ARGUMENT);
    setup(&f, 64);
    f.params.sampling.top_p = 2.0f;
    assert_int_equal(lily_generate(&f.session, prompt, 1, &f.params, &r, &err), LILY_ERR_INVALID_ARGUMENT);
    assert_int_equal(f.session.n_tokens, 0);
}

/* The real tokenizer's streaming detokenizer behind the loop: multi-byte characters split over byte-level
 * tokens come out whole, and a stop string spread over several tokens is cut exactly. */
static void test_generate_with_tokenizer_detokenizer(void **state)
{
    (void)state;
    lily_tokenizer *tok = NULL;
    lily_error err = {0};
    if (lily_tokenizer_load(test_data_path("tiny-chat"), &tok, &err) != LILY_OK)
        fail_msg("%s", err.message);
    const char *text = "Café 世界 says: the answer is 42.</answer> and more";
    int32_t *ids = NULL;
    int n_ids = 0;
    if (lily_tokenizer_encode(tok, text, strlen(text), false, &ids, &n_ids, &err) != LILY_OK)
        fail_msg("%s", err.message);
    assert_true(n_ids > 10);
    const int vocab = lily_tokenizer_vocab_size(tok);
    float *logits = calloc((size_t)vocab, sizeof *logits);
    int32_t tokens[256];
    lily_engine engine = {0};
    engine.cfg.vocab_size = vocab;
    lily_session session = {.engine = &engine, .max_ctx = 256, .tokens = tokens, .logits = logits};
    script = ids;
    script_len = n_ids;
    script_vocab = vocab;

    lily_detokenizer detok;
    lily_detokenizer_init(&detok, tok, false);
    streamed out = {0};
    lily_generate_params p = lily_generate_defaults();
    p.sampling.temperature = 0.0f;
    p.detok = lily_detok_for_tokenizer(&detok);
    p.on_token = on_token;
    p.user = &out;
    const char *stops[1] = {"</answer>"};
    p.stop_strings = stops;
    p.n_stop_strings = 1;
    const int32_t first[1] = {ids[0]};
    script = ids + 1; /* the prompt is the first token; the rest is "generated" */
    script_len = n_ids - 1;
    lily_generate_result r;
    assert_int_equal(lily_generate(&session, first, 1, &p, &r, &err), LILY_OK);
    char expect[256];
    const char *cut = strstr(text, "</answer>");
    /* the first token's text was the prompt, not streamed */
    const char *decoded_first = NULL;
    size_t first_len = 0;
    lily_detokenizer probe;
    lily_detokenizer_init(&probe, tok, false);
    assert_int_equal(lily_detokenizer_feed(&probe, ids[0], &decoded_first, &first_len, &err), LILY_OK);
    snprintf(expect, sizeof expect, "%.*s", (int)(cut - text - (int)first_len), text + first_len);
    assert_string_equal(out.text, expect);
    assert_int_equal(r.finish, LILY_FINISH_STOP);
    assert_int_equal(r.stop_string, 0);
    lily_detokenizer_free(&probe);
    lily_detokenizer_free(&detok);
    script = NULL;
    free(ids);
    free(logits);
    lily_tokenizer_free(tok);
}

/* The reasoning budget: after `budget` tokens inside the think block lily forces the close tokens (here
 * "!" and " Bye", with " Bye" standing for "</think>"), streamed and appended like sampled ones; the model
 * then continues from them (the script's next token after " Bye" is the stop id). A model that closes
 * the block itself before the budget is never forced; a budget of 0 closes it at once. */
static void run_budget(fixture *f, int budget, int32_t end_id, lily_generate_result *r)
{
    static const int32_t close_ids[2] = {4, 5};
    setup(f, 64);
    f->params.stop_ids = stop_ids;
    f->params.n_stop_ids = 2;
    f->params.reasoning_budget = budget;
    f->params.think_close = close_ids;
    f->params.n_think_close = 2;
    f->params.think_end_id = end_id;
    assert_int_equal(lily_generate(&f->session, prompt, 1, &f->params, r, NULL), LILY_OK);
}

static void test_generate_reasoning_budget(void **state)
{
    (void)state;
    fixture f;
    lily_generate_result r;
    run_budget(&f, 2, 5, &r); /* Hello, wor, then the forced "!" " Bye", then the stop id */
    const int32_t cut[] = {1, 2, 4, 5};
    assert_int_equal(f.out.n_tokens, 4);
    assert_memory_equal(f.out.tokens, cut, sizeof cut);
    assert_string_equal(f.out.text, "Hello wor! Bye");
    assert_true(r.reasoning_cut);
    assert_int_equal(r.n_reasoning, 2);
    assert_int_equal(r.n_generated, 4);
    assert_int_equal(r.finish, LILY_FINISH_STOP);
    assert_string_equal(r.decode_path, "host sampler (the backend has no device loop)");
    const int32_t in_session[] = {PROMPT, 1, 2, 4, 5};
    assert_session(&f, in_session, 5);

    run_budget(&f, 5, 2, &r); /* " wor" closes the block at the 2nd token: nothing forced */
    const int32_t free_run[] = {1, 2, 3, 4, 5};
    assert_int_equal(f.out.n_tokens, 5);
    assert_memory_equal(f.out.tokens, free_run, sizeof free_run);
    assert_false(r.reasoning_cut);
    assert_int_equal(r.n_reasoning, 1);

    run_budget(&f, 0, 5, &r); /* closed at once */
    const int32_t at_once[] = {4, 5};
    assert_int_equal(f.out.n_tokens, 2);
    assert_memory_equal(f.out.tokens, at_once, sizeof at_once);
    assert_true(r.reasoning_cut);
    assert_int_equal(r.n_reasoning, 0);

    setup(&f, 64); /* no think_close: the budget does nothing */
    f.params.stop_ids = stop_ids;
    f.params.n_stop_ids = 2;
    f.params.reasoning_budget = 0;
    assert_int_equal(lily_generate(&f.session, prompt, 1, &f.params, &r, NULL), LILY_OK);
    assert_int_equal(f.out.n_tokens, 5);
    assert_false(r.reasoning_cut);
}

/* A constraint: step 0 allows only " Bye"; step 1 lets the model be; after 3 tokens nothing may follow. */
typedef struct {
    int n_accepted;
    int32_t accepted[16];
} fake_constraint;

static int constraint_mask(void *user, float *logits, int vocab)
{
    fake_constraint *c = user;
    if (c->n_accepted >= 3)
        return -1;
    if (c->n_accepted > 0)
        return 0;
    for (int v = 0; v < vocab; v++)
        if (v != 5)
            logits[v] = -INFINITY;
    return 1;
}

static void constraint_accept(void *user, int32_t token)
{
    fake_constraint *c = user;
    c->accepted[c->n_accepted++] = token;
}

static void test_generate_constraint(void **state)
{
    (void)state;
    fixture f;
    setup(&f, 64);
    fake_constraint c = {0};
    lily_token_constraint tc = {.user = &c, .mask = constraint_mask, .accept = constraint_accept};
    f.params.constraint = &tc;
    lily_generate_result r;
    lily_error err = {0};
    assert_int_equal(lily_generate(&f.session, prompt, 1, &f.params, &r, &err), LILY_OK);
    /* " Bye" forced by the mask, then the script: EOS (no stop ids here), "Hello"; then the mask ends it */
    assert_string_equal(f.out.text, " Bye<|im_end|>Hello");
    assert_int_equal(c.n_accepted, 3);
    assert_int_equal(c.accepted[0], 5);
    assert_int_equal(r.finish, LILY_FINISH_STOP);
    assert_string_equal(r.decode_path, "host sampler (the constraint has no token bit mask)");
}

/* A constraint that masks nothing itself but says it masks (generate.h's masking) from the token `after` on. */
typedef struct {
    int32_t after;
    bool on;
} masking_constraint;

static int masking_mask(void *user, float *logits, int vocab)
{
    (void)user, (void)logits, (void)vocab;
    return 0;
}

static void masking_accept(void *user, int32_t token)
{
    masking_constraint *c = user;
    c->on = c->on || token == c->after;
}

static bool masking_on(void *user) { return ((const masking_constraint *)user)->on; }

/* Stop strings are not matched inside constrained text (a structured reply, a forced tool call's arguments:
 * a stop string cut them short, into JSON that did not parse); before it they are, and the text the matcher
 * held when the constraint took over is released with that token (or ends at a stop string wholly inside
 * it). The script: "Hello", " wor", "ld", "!" (held by the detokenizer), " Bye", EOS. */
static void test_generate_no_stop_strings_in_constrained_text(void **state)
{
    (void)state;
    const struct {
        int32_t after;            /* the constraint masks from this token on */
        const char *stops[2];
        const char *text;
        int stop_string;
        int32_t last_token;
        lily_finish_reason finish;
    } cases[] = {
        {1, {"world", "Bye"}, "Hello world! Bye", -1, -1, LILY_FINISH_STOP},       /* after "Hello": none */
        {3, {"Hello world", "x"}, "Hello world! Bye", -1, -1, LILY_FINISH_STOP},   /* held, then released */
        {3, {"lo w", "x"}, "Hel", 0, 2, LILY_FINISH_STOP},                           /* matched before it */
        {3, {"Hello worlds", "wor"}, "Hello ", 1, 3, LILY_FINISH_STOP},             /* wholly in held text */
        {-1, {"wor", "Bye"}, "Hello ", 0, 2, LILY_FINISH_STOP},                    /* never masking */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fixture f;
        setup(&f, 64);
        f.params.stop_ids = stop_ids;
        f.params.n_stop_ids = 2;
        masking_constraint mc = {.after = cases[i].after};
        lily_token_constraint tc = {.user = &mc, .mask = masking_mask, .accept = masking_accept,
                                    .masking = masking_on};
        f.params.constraint = &tc;
        f.params.stop_strings = cases[i].stops;
        f.params.n_stop_strings = 2;
        lily_generate_result r;
        lily_error err = {0};
        assert_int_equal(lily_generate(&f.session, prompt, 1, &f.params, &r, &err), LILY_OK);
        assert_string_equal(f.out.text, cases[i].text);
        assert_int_equal(r.finish, cases[i].finish);
        assert_int_equal(r.stop_string, cases[i].stop_string);
        assert_int_equal(r.last_token, cases[i].last_token);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_stops_at_stop_id),
        cmocka_unit_test(test_generate_max_tokens_flushes_held_text),
        cmocka_unit_test(test_generate_stop_string_across_tokens),
        cmocka_unit_test(test_generate_context_full_is_length),
        cmocka_unit_test(test_generate_cancellation),
        cmocka_unit_test(test_generate_prefill_chunks_and_cancel),
        cmocka_unit_test(test_generate_continues_a_session),
        cmocka_unit_test(test_generate_seeded_sampling_repeats),
        cmocka_unit_test(test_generate_rejects_bad_arguments),
        cmocka_unit_test(test_generate_with_tokenizer_detokenizer),
        cmocka_unit_test(test_generate_reasoning_budget),
        cmocka_unit_test(test_generate_constraint),
        cmocka_unit_test(test_generate_no_stop_strings_in_constrained_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
