/* test_generate_engine.c — lily_generate on the real CPU engine and tokenizer (tests/data/tiny-chat):
 * greedy generation equals a hand-written argmax loop over lily_session_append, the streamed text equals
 * the detokenizer's text for the streamed ids, and a seeded sampler repeats itself. */
#include "test_support.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/engine.h"
#include "runtime/generate.h"
#include "text/tokenizer.h"

typedef test_streamed streamed;

typedef struct {
    lily_engine *engine;
    lily_tokenizer *tok;
    int32_t *prompt;
    int n_prompt;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    lily_error err = {0};
    lily_engine_options opts = {.model_dir = test_data_path("tiny-chat"), .backend = "cpu", .n_threads = 1};
    if (lily_engine_open(&opts, &f->engine, &err) != LILY_OK)
        fail_msg("engine: %s", err.message);
    if (lily_tokenizer_load(test_data_path("tiny-chat"), &f->tok, &err) != LILY_OK)
        fail_msg("tokenizer: %s", err.message);
    const char *prompt = "<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\n<think>\n";
    if (lily_tokenizer_encode(f->tok, prompt, strlen(prompt), true, &f->prompt, &f->n_prompt, &err) != LILY_OK)
        fail_msg("encode: %s", err.message);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    free(f->prompt);
    lily_tokenizer_free(f->tok);
    lily_engine_close(f->engine);
    free(f);
    return 0;
}

/* Generate with params on a fresh session; returns what was streamed. */
static streamed run(fixture *f, lily_generate_params *p, lily_generate_result *r, int *session_tokens)
{
    lily_session *s = NULL;
    lily_error err = {0};
    assert_int_equal(lily_session_new(f->engine, 256, &s, &err), LILY_OK);
    lily_detokenizer detok;
    lily_detokenizer_init(&detok, f->tok, false);
    streamed out = {0};
    p->detok = lily_detok_for_tokenizer(&detok);
    p->on_token = test_on_token;
    p->user = &out;
    if (lily_generate(s, f->prompt, f->n_prompt, p, r, &err) != LILY_OK)
        fail_msg("generate: %s", err.message);
    *session_tokens = s->n_tokens;
    lily_detokenizer_free(&detok);
    lily_session_free(s);
    return out;
}

static void test_greedy_generate_matches_argmax_loop(void **state)
{
    fixture *f = *state;
    lily_generate_params p = lily_generate_defaults();
    p.sampling.temperature = 0.0f;
    p.max_tokens = 12;
    p.stop_ids = (const int32_t *)f->engine->cfg.stop_ids;
    p.n_stop_ids = f->engine->cfg.n_stop_ids;
    lily_generate_result r;
    int n_session;
    streamed out = run(f, &p, &r, &n_session);

    /* the reference: append, argmax, repeat */
    lily_session *s = NULL;
    lily_error err = {0};
    assert_int_equal(lily_session_new(f->engine, 256, &s, &err), LILY_OK);
    assert_int_equal(lily_session_append(s, f->prompt, f->n_prompt, NULL, &err), LILY_OK);
    int32_t expect[64];
    int n_expect = 0;
    const int vocab = f->engine->cfg.vocab_size;
    for (;;) {
        int32_t best = 0;
        for (int v = 1; v < vocab; v++)
            if (s->logits[v] > s->logits[best])
                best = v;
        bool stop = false;
        for (int i = 0; i < f->engine->cfg.n_stop_ids; i++)
            stop |= best == f->engine->cfg.stop_ids[i];
        if (stop)
            break;
        expect[n_expect++] = best;
        if (n_expect == p.max_tokens)
            break;
        assert_int_equal(lily_session_append(s, &best, 1, NULL, &err), LILY_OK);
    }
    lily_session_free(s);

    assert_int_equal(out.n_tokens, n_expect);
    assert_memory_equal(out.tokens, expect, (size_t)n_expect * sizeof *expect);
    assert_int_equal(r.n_generated, n_expect);
    assert_int_equal(r.n_prompt, f->n_prompt);
    if (r.finish == LILY_FINISH_LENGTH) {
        assert_int_equal(n_expect, p.max_tokens);
        assert_int_equal(r.last_token, expect[n_expect - 1]);
        assert_int_equal(n_session, f->n_prompt + n_expect - 1);
    } else {
        assert_int_equal(n_session, f->n_prompt + n_expect);
    }
    /* the streamed text is what the detokenizer makes of the streamed ids (the tiny model's random text
     * may hold invalid UTF-8, which the detokenizer turns into U+FFFD, so compare with it, not decode) */
    lily_detokenizer d;
    lily_detokenizer_init(&d, f->tok, false);
    char ref[8192];
    size_t ref_len = 0;
    for (int i = 0; i <= n_expect; i++) {
        const char *piece;
        size_t len;
        if (i < n_expect)
            assert_int_equal(lily_detokenizer_feed(&d, expect[i], &piece, &len, &err), LILY_OK);
        else
            assert_int_equal(lily_detokenizer_flush(&d, &piece, &len, &err), LILY_OK);
        memcpy(ref + ref_len, piece, len);
        ref_len += len;
    }
    lily_detokenizer_free(&d);
    assert_int_equal(out.len, ref_len);
    assert_memory_equal(out.text, ref, ref_len);
}

static void test_seeded_generate_repeats(void **state)
{
    fixture *f = *state;
    lily_generate_params p = lily_generate_defaults();
    p.sampling.temperature = 1.0f;
    p.sampling.top_p = 0.95f;
    p.sampling.seed = 1234;
    p.max_tokens = 10;
    lily_generate_result r1, r2;
    int n1, n2;
    streamed a = run(f, &p, &r1, &n1);
    streamed b = run(f, &p, &r2, &n2);
    assert_int_equal(a.n_tokens, 10);
    assert_int_equal(a.n_tokens, b.n_tokens);
    assert_memory_equal(a.tokens, b.tokens, (size_t)a.n_tokens * sizeof a.tokens[0]);
    assert_string_equal(a.text, b.text);
    assert_int_equal(r1.n_decode_steps, 9);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_generate_matches_argmax_loop),
        cmocka_unit_test(test_seeded_generate_repeats),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
