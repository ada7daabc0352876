/* test_stop_strings.c — stop strings caught across token boundaries, never emitted, split-invariant. */
#include "test_support.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/sampler.h" /* lily_rng for random splits */
#include "runtime/stop_strings.h"

typedef struct {
    char text[4096];
    size_t len;
    int matched;
} collected;

static lily_stop_matcher *make(const char *const *stops, int n)
{
    lily_stop_matcher *m = NULL;
    lily_error err = {0};
    if (lily_stop_matcher_new(stops, n, &m, &err) != LILY_OK)
        fail_msg("lily_stop_matcher_new: %s", err.message);
    return m;
}

/* Feed text in pieces of the given lengths (0-terminated list, the rest in one piece), then flush. */
static collected run(lily_stop_matcher *m, const char *text, const size_t *pieces)
{
    collected c = {.matched = -1};
    lily_error err = {0};
    size_t n = strlen(text), at = 0;
    lily_stop_matcher_reset(m);
    for (int i = 0; at < n; i++) {
        size_t k = pieces && pieces[i] ? pieces[i] : n - at;
        if (k > n - at)
            k = n - at;
        const char *out;
        size_t out_len;
        int r = lily_stop_matcher_feed(m, text + at, k, &out, &out_len, &err);
        assert_true(r >= -1);
        memcpy(c.text + c.len, out, out_len);
        c.len += out_len;
        if (r >= 0)
            assert_true(c.matched < 0 || c.matched == r);
        if (r >= 0)
            c.matched = r;
        at += k;
    }
    const char *out;
    size_t out_len;
    int r = lily_stop_matcher_flush(m, &out, &out_len);
    memcpy(c.text + c.len, out, out_len);
    c.len += out_len;
    if (r >= 0)
        c.matched = r;
    c.text[c.len] = '\0';
    return c;
}

/* The definition: the earliest position where a stop starts; at equal positions the lowest index. */
static collected reference(const char *const *stops, int n, const char *text)
{
    collected c = {.matched = -1};
    size_t len = strlen(text);
    for (size_t pos = 0; pos <= len && c.matched < 0; pos++)
        for (int i = 0; i < n; i++)
            if (stops[i][0] && !strncmp(text + pos, stops[i], strlen(stops[i]))) {
                c.matched = i;
                c.len = pos;
                break;
            }
    if (c.matched < 0)
        c.len = len;
    memcpy(c.text, text, c.len);
    c.text[c.len] = '\0';
    return c;
}

static void test_stop_string_split_over_tokens_is_not_emitted(void **state)
{
    (void)state;
    const char *stops[2] = {"</answer>", "\n\nUser:"};
    lily_stop_matcher *m = make(stops, 2);
    lily_error err = {0};
    const char *pieces[5] = {"The answer is 42", "</", "ans", "wer>", " more"};
    const char *expect_out[5] = {"The answer is 42", "", "", "", ""};
    const int expect_r[5] = {-1, -1, -1, 0, 0};
    for (int i = 0; i < 5; i++) {
        const char *out;
        size_t out_len;
        int r = lily_stop_matcher_feed(m, pieces[i], strlen(pieces[i]), &out, &out_len, &err);
        assert_int_equal(r, expect_r[i]);
        assert_int_equal(out_len, strlen(expect_out[i]));
        assert_memory_equal(out, expect_out[i], out_len);
    }
    lily_stop_matcher_free(m);
}

static void test_false_start_is_released_when_it_cannot_match(void **state)
{
    (void)state;
    const char *stops[1] = {"STOP"};
    lily_stop_matcher *m = make(stops, 1);
    lily_error err = {0};
    const char *out;
    size_t out_len;
    assert_int_equal(lily_stop_matcher_feed(m, "go ST", 5, &out, &out_len, &err), -1);
    assert_int_equal(out_len, 3);
    assert_memory_equal(out, "go ", 3);
    assert_int_equal(lily_stop_matcher_held(m), 2);
    assert_int_equal(lily_stop_matcher_feed(m, "A", 1, &out, &out_len, &err), -1);
    assert_int_equal(out_len, 3);
    assert_memory_equal(out, "STA", 3);
    assert_int_equal(lily_stop_matcher_feed(m, "RT S", 4, &out, &out_len, &err), -1);
    assert_int_equal(out_len, 3);
    assert_memory_equal(out, "RT ", 3);
    /* end of text: the held "S" is real text */
    assert_int_equal(lily_stop_matcher_flush(m, &out, &out_len), -1);
    assert_int_equal(out_len, 1);
    assert_memory_equal(out, "S", 1);
    lily_stop_matcher_free(m);
}

static void test_no_stops_pass_everything(void **state)
{
    (void)state;
    lily_stop_matcher *m = make(NULL, 0);
    collected c = run(m, "anything <|im_end|> at all", NULL);
    assert_string_equal(c.text, "anything <|im_end|> at all");
    assert_int_equal(c.matched, -1);
    lily_stop_matcher_free(m);
}

static void test_match_inside_held_text_at_end_of_text(void **state)
{
    (void)state;
    const char *stops[2] = {"abcx", "bc"};
    lily_stop_matcher *m = make(stops, 2);
    const size_t by_byte[] = {1, 1, 1, 1, 1, 1, 1, 0};
    collected c = run(m, "zabc", by_byte);
    assert_string_equal(c.text, "za");
    assert_int_equal(c.matched, 1);
    c = run(m, "zabcx!", by_byte);
    assert_string_equal(c.text, "z");
    assert_int_equal(c.matched, 0);
    lily_stop_matcher_free(m);
}

static void test_any_split_gives_the_whole_text_result(void **state)
{
    (void)state;
    const char *stops[4] = {"abca", "bc", "cc", "aab"};
    lily_stop_matcher *m = make(stops, 4);
    lily_rng r;
    lily_rng_seed(&r, 3);
    size_t pieces[64];
    for (int trial = 0; trial < 3000; trial++) {
        char text[40];
        int n = 1 + (int)(lily_rng_next(&r) % 30);
        for (int i = 0; i < n; i++) /* mostly 'a' and 'b' so stops are rare enough to test holding */
            text[i] = "aaabbbcd"[lily_rng_next(&r) % 8];
        text[n] = '\0';
        collected expect = reference(stops, 4, text);
        collected whole = run(m, text, NULL);
        for (int i = 0; i < 64; i++)
            pieces[i] = 1;
        collected bytes = run(m, text, pieces);
        for (int i = 0; i < 63; i++)
            pieces[i] = 1 + lily_rng_next(&r) % 5;
        pieces[63] = 0;
        collected random = run(m, text, pieces);
        const collected *got[3] = {&whole, &bytes, &random};
        for (int k = 0; k < 3; k++)
            if (got[k]->matched != expect.matched || strcmp(got[k]->text, expect.text))
                fail_msg("text '%s' split %d: got '%s' (stop %d), expected '%s' (stop %d)", text, k, got[k]->text,
                         got[k]->matched, expect.text, expect.matched);
    }
    lily_stop_matcher_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_string_split_over_tokens_is_not_emitted),
        cmocka_unit_test(test_false_start_is_released_when_it_cannot_match),
        cmocka_unit_test(test_no_stops_pass_everything),
        cmocka_unit_test(test_match_inside_held_text_at_end_of_text),
        cmocka_unit_test(test_any_split_gives_the_whole_text_result),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
