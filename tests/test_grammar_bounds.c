/* test_grammar_bounds.c — integers and numbers with minimum / maximum / exclusiveMinimum /
 * exclusiveMaximum. Integers: for fixed and random ranges (negative, across zero, one-sided, up to int64's
 * ends), the grammar accepts an integer's text exactly when the integer is in range (checked against the
 * bounds for every integer in windows around the bounds, zero and the powers of ten), every prefix it
 * takes can still be completed (random walks through the digit step, each ending on an integer in range).
 * Numbers: the same against the bounds as doubles for decimals of several precisions around the bounds
 * and zero, and random walks through the mask that end in range. Schemas with nothing in range are
 * refused. */
#include "test_support.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/grammar_internal.h"
#include "grammar/int_range.h"

typedef struct {
    bool has_lo, has_hi;
    int64_t lo, hi;
} range;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void) /* xorshift64 */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* The decimal digits of |v|. */
static int magnitude_digits(int64_t v)
{
    uint64_t m = v < 0 ? (uint64_t)(-(v + 1)) + 1 : (uint64_t)v;
    int d = 1;
    while (m >= 10)
        m /= 10, d++;
    return d;
}

/* The grammar's set: in [lo, hi], and within the digits an unbounded side allows (16, or a bound's). */
static bool expected(const range *r, int64_t v)
{
    int cap = NUMBER_MAX_DIGITS;
    if (r->has_lo && magnitude_digits(r->lo) > cap)
        cap = magnitude_digits(r->lo);
    if (r->has_hi && magnitude_digits(r->hi) > cap)
        cap = magnitude_digits(r->hi);
    return (!r->has_lo || v >= r->lo) && (!r->has_hi || v <= r->hi) && magnitude_digits(v) <= cap;
}

/* The schema for r in one of several equivalent spellings (style): inclusive integers, exclusive
 * integers, reals rounded inward, draft 4's boolean exclusive forms. An unspellable style falls back to
 * the inclusive one. */
static char *schema_text(const range *r, int style, const char *wrap)
{
    char lo[96] = "", hi[96] = "";
    const int64_t exact = 1ll << 50; /* bounds a double holds with room for the half */
    const bool small_lo = r->lo > -exact && r->lo < exact, small_hi = r->hi > -exact && r->hi < exact;
    if (r->has_lo) {
        if (style == 1 && r->lo > INT64_MIN)
            snprintf(lo, sizeof lo, ",\"exclusiveMinimum\":%" PRId64, r->lo - 1);
        else if (style == 2 && small_lo)
            snprintf(lo, sizeof lo, ",\"minimum\":%.1f", (double)r->lo - 0.5); /* ceil: lo */
        else if (style == 3 && small_lo)
            snprintf(lo, sizeof lo, ",\"exclusiveMinimum\":%.2f", (double)r->lo - 0.75); /* floor + 1: lo */
        else if (style == 4 && r->lo > INT64_MIN)
            snprintf(lo, sizeof lo, ",\"minimum\":%" PRId64 ",\"exclusiveMinimum\":true", r->lo - 1);
        else
            snprintf(lo, sizeof lo, ",\"minimum\":%" PRId64, r->lo);
    }
    if (r->has_hi) {
        if (style == 1 && r->hi < INT64_MAX)
            snprintf(hi, sizeof hi, ",\"exclusiveMaximum\":%" PRId64, r->hi + 1);
        else if (style == 2 && small_hi)
            snprintf(hi, sizeof hi, ",\"maximum\":%.1f", (double)r->hi + 0.5); /* floor: hi */
        else if (style == 3 && small_hi)
            snprintf(hi, sizeof hi, ",\"exclusiveMaximum\":%.2f", (double)r->hi + 0.75); /* ceil - 1: hi */
        else if (style == 4 && r->hi < INT64_MAX)
            snprintf(hi, sizeof hi, ",\"maximum\":%" PRId64 ",\"exclusiveMaximum\":true", r->hi + 1);
        else
            snprintf(hi, sizeof hi, ",\"maximum\":%" PRId64, r->hi);
    }
    char *out = malloc(512);
    assert_non_null(out);
    char inner[256];
    snprintf(inner, sizeof inner, "{\"type\":\"integer\"%s%s}", lo, hi);
    if (wrap)
        snprintf(out, 512, wrap, inner);
    else
        snprintf(out, 512, "%s", inner);
    return out;
}

static lily_grammar *compile_or_fail(const char *text)
{
    json_error_t jerr;
    json_t *schema = json_loads(text, 0, &jerr);
    if (!schema)
        fail_msg("bad test schema %s: %s", text, jerr.text);
    lily_grammar *g = NULL;
    lily_error err = {0};
    if (lily_grammar_compile(schema, LILY_GRAMMAR_JSON, &g, &err) != LILY_OK)
        fail_msg("compile %s: %s", text, err.message);
    json_decref(schema);
    return g;
}

/* The tokens "0".."9", "-", ".", "e", ",", "]": the bytes a number and what may follow it are made of. */
static const char *const byte_vocab[] = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "-", ".", "e", ",", "]"};
#define N_BYTE_VOCAB 15
#define N_NUMBER_BYTES 12 /* the first ones: digits, '-', '.' */

/* Feed text byte by byte; after each byte taken the state must be complete or allow a next byte (the mask
 * over byte_vocab), so no prefix the grammar takes is a dead end. Returns whether all of text is taken and
 * complete. */
static bool accepts_checking_prefixes(const lily_grammar *g, const lily_token_trie *t, const char *text)
{
    lily_grammar_matcher *m = NULL;
    lily_error err = {0};
    assert_int_equal(lily_grammar_matcher_new(g, &m, &err), LILY_OK);
    uint8_t allowed[N_BYTE_VOCAB];
    bool ok = true;
    for (size_t i = 0; text[i] && ok; i++) {
        ok = lily_grammar_matcher_feed(m, text + i, 1);
        if (ok && !lily_grammar_matcher_accepting(m) && lily_grammar_matcher_mask(m, t, allowed) == 0)
            fail_msg("%s: the prefix %.*s is taken but cannot be completed", text, (int)i + 1, text);
    }
    ok = ok && lily_grammar_matcher_accepting(m);
    lily_grammar_matcher_free(m);
    return ok;
}

/* Every integer in [c - w, c + w] (within int64): accepted exactly when expected. */
static void check_window(const lily_grammar *g, const lily_token_trie *t, const range *r, int64_t c, int w,
                         const char *schema)
{
    for (int d = -w; d <= w; d++) {
        int64_t v;
        if (__builtin_add_overflow(c, (int64_t)d, &v))
            continue;
        char text[32];
        snprintf(text, sizeof text, "%" PRId64, v);
        const bool want = expected(r, v), got = accepts_checking_prefixes(g, t, text);
        if (want != got)
            fail_msg("%s: %s %s, expected %s", schema, text, got ? "accepted" : "rejected", want ? "in" : "out");
    }
}

/* Random walks through the digit step from the empty magnitude: at each state either complete (and the
 * walk may stop) or some digit is taken; every end is a magnitude in [lo, hi] (as digit strings). */
static void walk_digits(const lily_digit_range *d)
{
    if (d->n_hi == 0)
        return;
    for (int walk = 0; walk < 200; walk++) {
        lily_digit_state s = {0};
        char text[LILY_INT_RANGE_MAX_DIGITS + 1];
        for (;;) {
            const bool complete = lily_digit_range_complete(d, &s, s.digits);
            if (complete && rng() % 4 == 0)
                break;
            unsigned char options[10];
            int n = 0;
            for (unsigned char b = '0'; b <= '9'; b++) {
                lily_digit_state probe = s;
                if ((b != '0' || s.digits > 0) && lily_digit_range_step(d, &probe, b, 0, INT32_MAX))
                    options[n++] = b;
            }
            if (n == 0) {
                assert_true(complete); /* a dead end must be a complete magnitude */
                break;
            }
            /* bias toward the bounds' own digits, where the comparisons stay open */
            unsigned char b = options[rng() % (uint64_t)n];
            const int k = s.digits;
            if (rng() % 2 && k < d->n_hi && memchr(options, d->hi[k], (size_t)n))
                b = (unsigned char)d->hi[k];
            else if (rng() % 2 && k < d->n_lo && memchr(options, d->lo[k], (size_t)n))
                b = (unsigned char)d->lo[k];
            assert_true(lily_digit_range_step(d, &s, b, 0, INT32_MAX));
            text[k] = (char)b;
        }
        text[s.digits] = 0;
        const int len = (int)strlen(text);
        const bool above_lo = len > d->n_lo || (len == d->n_lo && strcmp(text, d->lo) >= 0);
        const bool below_hi = len < d->n_hi || (len == d->n_hi && strcmp(text, d->hi) <= 0);
        if (!above_lo || !below_hi)
            fail_msg("walk ended on %s outside [%s, %s]", text, d->lo, d->hi);
    }
}

static void check_range(const lily_token_trie *t, const range *r, int style)
{
    char *schema = schema_text(r, style, NULL);
    lily_grammar *g = compile_or_fail(schema);
    int64_t centers[64];
    int n = 0;
    centers[n++] = 0;
    if (r->has_lo)
        centers[n++] = r->lo;
    if (r->has_hi)
        centers[n++] = r->hi;
    int64_t p = 1;
    for (int k = 0; k <= 18; k++, p = k <= 18 ? p * 10 : p) {
        const bool near = (r->has_lo && r->lo <= p + 2 && r->lo >= -p - 2) ||
                          (r->has_hi && r->hi >= -p - 2 && r->hi <= p + 2) ||
                          (r->has_lo && r->has_hi && r->lo <= p && r->hi >= -p);
        if (near && n + 2 <= 64) {
            centers[n++] = p;
            centers[n++] = -p;
        }
    }
    for (int i = 0; i < n; i++)
        check_window(g, t, r, centers[i], i < 3 ? 12 : 2, schema);
    /* texts past int64 and not canonical are never taken */
    static const char *const never[] = {"-0", "00", "01", "-01", "+1", "1.0", "1e2", "--1", "-"};
    for (size_t i = 0; i < sizeof never / sizeof *never; i++)
        assert_false(accepts_checking_prefixes(g, t, never[i]));
    lily_int_range ir;
    assert_true(lily_int_range_init(&ir, r->has_lo, r->lo, r->has_hi, r->hi, NUMBER_MAX_DIGITS));
    walk_digits(&ir.pos);
    walk_digits(&ir.neg);
    lily_grammar_free(g);
    free(schema);
}

static lily_token_trie *byte_trie(void)
{
    size_t lens[N_BYTE_VOCAB];
    for (int i = 0; i < N_BYTE_VOCAB; i++)
        lens[i] = strlen(byte_vocab[i]);
    lily_token_trie *t = NULL;
    lily_error err = {0};
    assert_int_equal(lily_token_trie_new(byte_vocab, lens, NULL, N_BYTE_VOCAB, &t, &err), LILY_OK);
    return t;
}

static void test_fixed_ranges(void **state)
{
    (void)state;
    lily_token_trie *t = byte_trie();
    static const range fixed[] = {
        {true, true, 5, 7},
        {true, true, 0, 0},
        {true, true, 1, 1},
        {true, true, -1, -1},
        {true, true, -7, -5},
        {true, true, -12, 345},
        {true, true, 0, 150},
        {true, true, 1, 9},
        {true, true, 10, 99},
        {true, true, 9, 10},
        {true, true, 99, 1000},
        {true, true, 100, 199},
        {true, true, 123, 129},
        {true, true, 1995, 2026},
        {true, true, -1000, -999},
        {true, true, -500, 499},
        {true, true, 8, 81},
        {true, true, 1, 9223372036854775807ll},
        {true, true, INT64_MIN, INT64_MAX},
        {true, true, INT64_MIN, INT64_MIN + 5},
        {true, true, INT64_MAX - 5, INT64_MAX},
        {true, true, 999999999999999999ll, 1000000000000000001ll},
        {true, false, 5, 0},
        {true, false, 0, 0},
        {true, false, -3, 0},
        {true, false, 1000000000000000000ll, 0},
        {true, false, INT64_MIN, 0},
        {false, true, 0, 5},
        {false, true, 0, -5},
        {false, true, 0, 0},
        {false, true, 0, -1000000000000000000ll},
        {false, true, 0, INT64_MAX},
    };
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++)
        for (int style = 0; style < 5; style++)
            check_range(t, &fixed[i], style);
    lily_token_trie_free(t);
}

/* A random magnitude of 1 to 18 digits with a random sign (sometimes int64's ends). */
static int64_t random_value(void)
{
    if (rng() % 16 == 0)
        return rng() % 2 ? INT64_MAX - (int64_t)(rng() % 3) : INT64_MIN + (int64_t)(rng() % 3);
    int64_t p = 1;
    for (int k = (int)(rng() % 18); k > 0; k--)
        p *= 10;
    const int64_t v = (int64_t)(rng() % (uint64_t)p) + (rng() % 3 == 0 ? p : 0);
    return rng() % 3 == 0 ? -v : v;
}

static void test_random_ranges(void **state)
{
    (void)state;
    lily_token_trie *t = byte_trie();
    for (int i = 0; i < 150; i++) {
        range r = {rng() % 6 != 0, rng() % 6 != 0, random_value(), random_value()};
        if (!r.has_lo && !r.has_hi)
            r.has_lo = true;
        if (rng() % 4 == 0 && r.lo < INT64_MAX - 1000) /* a small range */
            r.hi = r.lo + (int64_t)(rng() % 1000);
        if (r.has_lo && r.has_hi && r.lo > r.hi) {
            const int64_t x = r.lo;
            r.lo = r.hi;
            r.hi = x;
        }
        check_range(t, &r, (int)(rng() % 5));
    }
    lily_token_trie_free(t);
}

/* Bounds inside structure: the integer ends at ',' / ']' / '}' only once it is in range; type lists and
 * tool parameters take the bounds too; texts past int64 are refused. */
static void test_bounds_in_structure(void **state)
{
    (void)state;
    lily_grammar *g = compile_or_fail("{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":5,\"maximum\":7}}");
    static const char *const good[] = {"[]", "[5]", "[5,6,7]", "[7,5]"};
    static const char *const bad[] = {"[4]", "[8]", "[1000005595011001]", "[50]", "[-5]", "[05]", "[0]"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        lily_grammar_matcher *m = NULL;
        lily_error err = {0};
        assert_int_equal(lily_grammar_matcher_new(g, &m, &err), LILY_OK);
        assert_true(lily_grammar_matcher_feed(m, good[i], strlen(good[i])) && lily_grammar_matcher_accepting(m));
        lily_grammar_matcher_free(m);
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        lily_grammar_matcher *m = NULL;
        lily_error err = {0};
        assert_int_equal(lily_grammar_matcher_new(g, &m, &err), LILY_OK);
        assert_false(lily_grammar_matcher_feed(m, bad[i], strlen(bad[i])) && lily_grammar_matcher_accepting(m));
        lily_grammar_matcher_free(m);
    }
    lily_grammar_free(g);

    struct {
        const char *schema, *text;
        lily_grammar_syntax syntax;
        bool ok;
    } cases[] = {
        {"{\"type\":[\"integer\",\"null\"],\"minimum\":1,\"maximum\":3}", "null", LILY_GRAMMAR_JSON, true},
        {"{\"type\":[\"integer\",\"null\"],\"minimum\":1,\"maximum\":3}", "3", LILY_GRAMMAR_JSON, true},
        {"{\"type\":[\"integer\",\"null\"],\"minimum\":1,\"maximum\":3}", "4", LILY_GRAMMAR_JSON, false},
        {"{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"exclusiveMinimum\":0}},\"required\":[\"n\"]}",
         "{\"n\":1}", LILY_GRAMMAR_JSON, true},
        {"{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"exclusiveMinimum\":0}},\"required\":[\"n\"]}",
         "{\"n\":0}", LILY_GRAMMAR_JSON, false},
        {"{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":-2,\"maximum\":2}}}",
         "<parameter=n>\n-2\n</parameter>\n</function>\n</tool_call>", LILY_GRAMMAR_QWEN_TOOL, true},
        {"{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":-2,\"maximum\":2}}}",
         "<parameter=n>\n-3\n</parameter>\n</function>\n</tool_call>", LILY_GRAMMAR_QWEN_TOOL, false},
        {"{\"type\":\"integer\",\"maximum\":9223372036854775807}", "9223372036854775807", LILY_GRAMMAR_JSON, true},
        {"{\"type\":\"integer\",\"maximum\":9223372036854775807}", "9223372036854775808", LILY_GRAMMAR_JSON, false},
        {"{\"type\":\"integer\",\"minimum\":-9223372036854775808}", "-9223372036854775808", LILY_GRAMMAR_JSON, true},
        {"{\"type\":\"integer\",\"minimum\":-9223372036854775808}", "-9223372036854775809", LILY_GRAMMAR_JSON, false},
        {"{\"type\":\"integer\",\"minimum\":1}", "9999999999999999", LILY_GRAMMAR_JSON, true}, /* 16 digits */
        {"{\"type\":\"integer\",\"minimum\":1}", "10000000000000000", LILY_GRAMMAR_JSON, false},
        {"{\"type\":\"integer\",\"minimum\":-1e300}", "-12", LILY_GRAMMAR_JSON, true}, /* beyond int64: no bound */
        {"{\"type\":\"integer\",\"maximum\":1e300,\"minimum\":3}", "12", LILY_GRAMMAR_JSON, true},
        {"{\"type\":\"integer\",\"minimum\":2.5,\"maximum\":3.5}", "3", LILY_GRAMMAR_JSON, true},
        {"{\"type\":\"integer\",\"minimum\":2.5,\"maximum\":3.5}", "2", LILY_GRAMMAR_JSON, false},
        {"{\"type\":\"integer\",\"minimum\":-3.5,\"maximum\":-2.5}", "-3", LILY_GRAMMAR_JSON, true},
        {"{\"type\":\"integer\",\"minimum\":5,\"exclusiveMinimum\":6}", "6", LILY_GRAMMAR_JSON, false}, /* tighter */
        {"{\"type\":\"integer\",\"minimum\":5,\"exclusiveMinimum\":false}", "5", LILY_GRAMMAR_JSON, true},
        {"{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"number\",\"minimum\":0,\"maximum\":1}},"
         "\"required\":[\"p\"]}", "{\"p\":0.25}", LILY_GRAMMAR_JSON, true},
        {"{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"number\",\"minimum\":0,\"maximum\":1}},"
         "\"required\":[\"p\"]}", "{\"p\":1.5}", LILY_GRAMMAR_JSON, false},
        {"{\"type\":\"number\",\"minimum\":1,\"exclusiveMinimum\":1}", "1", LILY_GRAMMAR_JSON, false},
        {"{\"type\":\"number\",\"minimum\":1,\"exclusiveMinimum\":1}", "1.0000000000000001", LILY_GRAMMAR_JSON, true},
        {"{\"type\":\"number\",\"minimum\":1,\"exclusiveMinimum\":1}", "1.00000000000000001", LILY_GRAMMAR_JSON, false},
        {"{\"type\":\"number\",\"minimum\":-1e300}", "-1.5e3", LILY_GRAMMAR_JSON, true}, /* no bound: any number */
        {"{\"type\":\"number\",\"minimum\":0}", "1.5e3", LILY_GRAMMAR_JSON, false}, /* bounded: no exponent */
        {"{\"type\":\"number\",\"minimum\":0}", "9999999999999999.9999999999999999", LILY_GRAMMAR_JSON, true},
        {"{\"type\":\"number\",\"minimum\":0}", "10000000000000000", LILY_GRAMMAR_JSON, false},
        {"{\"type\":\"number\",\"maximum\":-1.2345678901234567e19}", "-12345678901234567000.5", LILY_GRAMMAR_JSON, true},
        {"{\"type\":[\"number\",\"null\"],\"exclusiveMaximum\":0}", "-0.0001", LILY_GRAMMAR_JSON, true},
        {"{\"type\":[\"number\",\"null\"],\"exclusiveMaximum\":0}", "0", LILY_GRAMMAR_JSON, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *schema = json_loads(cases[i].schema, 0, NULL);
        assert_non_null(schema);
        lily_error err = {0};
        assert_int_equal(lily_grammar_compile(schema, cases[i].syntax, &g, &err), LILY_OK);
        json_decref(schema);
        lily_grammar_matcher *m = NULL;
        assert_int_equal(lily_grammar_matcher_new(g, &m, &err), LILY_OK);
        const bool got = lily_grammar_matcher_feed(m, cases[i].text, strlen(cases[i].text)) &&
                         lily_grammar_matcher_accepting(m);
        if (got != cases[i].ok)
            fail_msg("%s: %s %s", cases[i].schema, cases[i].text, got ? "accepted" : "rejected");
        lily_grammar_matcher_free(m);
        lily_grammar_free(g);
    }
}

/* No integer in range, bounds past int64 on the closed side, or a bound that is not a number: a compile
 * error naming the keywords (the server's 400). */
static void test_empty_and_malformed_bounds(void **state)
{
    (void)state;
    static const struct {
        const char *schema, *needle;
    } cases[] = {
        {"{\"type\":\"integer\",\"minimum\":8,\"maximum\":7}", "no integer lies between"},
        {"{\"type\":\"integer\",\"minimum\":2.2,\"maximum\":2.8}", "no integer lies between"},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":5,\"exclusiveMaximum\":6}", "no integer lies between"},
        {"{\"type\":\"integer\",\"minimum\":5,\"exclusiveMinimum\":true,\"maximum\":5}", "no integer lies between"},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":9223372036854775807}", "no integer lies between"},
        {"{\"type\":\"integer\",\"exclusiveMaximum\":-9223372036854775808}", "no integer lies between"},
        {"{\"type\":\"integer\",\"minimum\":1e19}", "no integer lies between"},
        {"{\"type\":\"integer\",\"maximum\":-1e19}", "no integer lies between"},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":3,\"maximum\":1}}", "no integer lies between"},
        {"{\"type\":\"number\",\"minimum\":1,\"exclusiveMaximum\":1}", "no number lies between"},
        {"{\"type\":\"number\",\"minimum\":0.5,\"maximum\":0.25}", "no number lies between"},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1e-17}", "no number lies between"},
        {"{\"type\":\"number\",\"minimum\":1e25}", "no number lies between"},
        {"{\"type\":\"number\",\"maximum\":\"1\"}", "maximum"},
        {"{\"type\":\"integer\",\"minimum\":\"5\"}", "minimum"},
        {"{\"type\":\"integer\",\"exclusiveMaximum\":null}", "exclusiveMaximum"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *schema = json_loads(cases[i].schema, 0, NULL);
        assert_non_null(schema);
        lily_grammar *g = NULL;
        lily_error err = {0};
        assert_int_equal(lily_grammar_compile(schema, LILY_GRAMMAR_JSON, &g, &err), LILY_ERR_INVALID_ARGUMENT);
        assert_null(g);
        if (!strstr(err.message, cases[i].needle))
            fail_msg("%s: message %s lacks %s", cases[i].schema, err.message, cases[i].needle);
        json_decref(schema);
    }
}

typedef struct {
    bool has_lo, has_hi, lo_exclusive, hi_exclusive;
    double lo, hi;
} number_range;

static bool number_expected(const number_range *r, const char *text)
{
    const double v = strtod(text, NULL);
    if (text[0] == '-' && v == 0)
        return false; /* "-0..." is never written */
    if (r->has_lo && (r->lo_exclusive ? !(v > r->lo) : !(v >= r->lo)))
        return false;
    return !r->has_hi || (r->hi_exclusive ? v < r->hi : v <= r->hi);
}

static char *number_schema(const number_range *r)
{
    char *out = malloc(256);
    assert_non_null(out);
    char lo[64] = "", hi[64] = "";
    if (r->has_lo)
        snprintf(lo, sizeof lo, ",\"%s\":%.17g", r->lo_exclusive ? "exclusiveMinimum" : "minimum", r->lo);
    if (r->has_hi)
        snprintf(hi, sizeof hi, ",\"%s\":%.17g", r->hi_exclusive ? "exclusiveMaximum" : "maximum", r->hi);
    snprintf(out, 256, "{\"type\":\"number\"%s%s}", lo, hi);
    return out;
}

/* Random walks through the mask (digits, '-', '.'): every step allows something or is complete, and
 * every walk ends on a number within the bounds (compared as doubles, inclusive: a decimal inside the
 * bounds reads back inside them). */
static void walk_numbers(const lily_grammar *g, const lily_token_trie *t, const number_range *r, const char *schema)
{
    for (int walk = 0; walk < 60; walk++) {
        lily_grammar_matcher *m = NULL;
        lily_error err = {0};
        assert_int_equal(lily_grammar_matcher_new(g, &m, &err), LILY_OK);
        char text[64];
        int n = 0;
        uint8_t allowed[N_BYTE_VOCAB];
        for (;;) {
            const bool done = lily_grammar_matcher_accepting(m);
            if (done && (rng() % 3 == 0 || n > 40))
                break;
            lily_grammar_matcher_mask(m, t, allowed);
            int options[N_BYTE_VOCAB], k = 0;
            for (int i = 0; i < N_BYTE_VOCAB; i++)
                if (allowed[i])
                    options[k++] = i;
            if (k == 0) {
                assert_true(done);
                break;
            }
            const char *tok = byte_vocab[options[rng() % (uint64_t)k]];
            assert_true(lily_grammar_matcher_feed(m, tok, 1));
            text[n++] = tok[0];
            assert_true(n < 60);
        }
        text[n] = 0;
        lily_grammar_matcher_free(m);
        const double v = strtod(text, NULL);
        if ((r->has_lo && !(v >= r->lo)) || (r->has_hi && !(v <= r->hi)) || (text[0] == '-' && v == 0))
            fail_msg("%s: the walk ended on %s", schema, text);
    }
}

/* lily_digit_range_complete's reference: the implied zeros fed one by one through the digit step. */
static bool complete_by_steps(const lily_digit_range *d, const lily_digit_state *s, int len)
{
    lily_digit_state z = *s;
    while (z.digits < len)
        if (!lily_digit_range_step(d, &z, '0', len, len))
            return false;
    return len >= 1 && len >= d->n_lo && len <= d->n_hi && (len > d->n_lo || z.cmp_lo >= 0) &&
           (len < d->n_hi || z.cmp_hi <= 0);
}

/* At every state of random walks of a fixed length (a number's integer digits then 16 fraction digits),
 * complete (O(1)) agrees with feeding the zeros. */
static void check_complete_against_steps(const lily_digit_range *d)
{
    for (int walk = 0; walk < 100 && d->n_hi > 0; walk++) {
        const int len = LILY_NUMBER_FRACTION_DIGITS + (int)(rng() % 4);
        lily_digit_state s = {0};
        for (;;) {
            assert_int_equal(lily_digit_range_complete(d, &s, len), complete_by_steps(d, &s, len));
            unsigned char options[10];
            int n = 0;
            for (unsigned char b = '0'; b <= '9'; b++) {
                lily_digit_state probe = s;
                if ((b != '0' || s.digits > 0 || len == LILY_NUMBER_FRACTION_DIGITS) &&
                    lily_digit_range_step(d, &probe, b, len, len))
                    options[n++] = b;
            }
            if (n == 0)
                break;
            unsigned char b = options[rng() % (uint64_t)n];
            if (rng() % 2 && s.digits < d->n_lo && memchr(options, d->lo[s.digits], (size_t)n))
                b = (unsigned char)d->lo[s.digits];
            else if (rng() % 3 == 0 && memchr(options, '0', (size_t)n))
                b = '0';
            assert_true(lily_digit_range_step(d, &s, b, len, len));
        }
    }
}

static void check_number_range(const lily_token_trie *t, const number_range *r)
{
    char *schema = number_schema(r);
    lily_grammar *g = compile_or_fail(schema);
    double centers[3] = {0};
    int n = 1;
    if (r->has_lo)
        centers[n++] = r->lo;
    if (r->has_hi)
        centers[n++] = r->hi;
    static const double steps[] = {1, 0.1, 0.01, 0.001, 1e-6};
    static const int precision[] = {0, 1, 2, 3, 6};
    for (int c = 0; c < n; c++)
        for (int s = 0; s < 5; s++)
            for (int j = -4; j <= 4; j++)
                for (int p = 0; p < 5; p++) {
                    char text[64];
                    snprintf(text, sizeof text, "%.*f", precision[p], centers[c] + j * steps[s]);
                    const bool want = number_expected(r, text), got = accepts_checking_prefixes(g, t, text);
                    if (want != got)
                        fail_msg("%s: %s %s", schema, text, got ? "accepted" : "rejected");
                }
    static const char *const never[] = {"-0", "-0.0", "00", "01", "+1", "1.", ".5", "1e2", "1.5E1", "--1", "-"};
    for (size_t i = 0; i < sizeof never / sizeof *never; i++)
        assert_false(accepts_checking_prefixes(g, t, never[i]));
    walk_numbers(g, t, r, schema);
    check_complete_against_steps(&g->root->range->pos);
    check_complete_against_steps(&g->root->range->neg);
    lily_grammar_free(g);
    free(schema);
}

/* A bound with few significant digits (so the doubles compare as the decimals do). */
static double random_bound(void)
{
    static const double scales[] = {1, 0.1, 0.01, 0.001, 10, 1000, 1e-6};
    const double v = (double)(rng() % 2000) * scales[rng() % 7];
    return rng() % 3 == 0 ? -v : v;
}

static void test_number_ranges(void **state)
{
    (void)state;
    lily_token_trie *t = byte_trie();
    static const number_range fixed[] = {
        {true, true, false, false, 0, 1},     {true, true, true, true, 0, 1},     {true, true, false, false, -1, 1},
        {true, true, false, false, 0.1, 0.2}, {true, true, true, false, 0.5, 0.5 + 1e-3},
        {true, true, false, false, -2.5, -2.25}, {true, true, false, false, 5, 7}, {true, true, false, false, 0, 0},
        {true, true, false, false, 1e-6, 2e-6}, {true, true, false, false, 99.5, 100.5},
        {true, false, false, false, 0, 0},    {true, false, true, false, 0, 0},    {false, true, false, true, 0, 0},
        {false, true, false, false, -3.75, 0}, {true, false, false, false, 1234.5678, 0},
        {true, true, false, false, -1e6, 1e6},
    };
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++)
        check_number_range(t, &fixed[i]);
    for (int i = 0; i < 60; i++) {
        number_range r = {rng() % 5 != 0, rng() % 5 != 0, rng() % 2, rng() % 2, random_bound(), random_bound()};
        if (!r.has_lo && !r.has_hi)
            r.has_hi = true;
        if (r.has_lo && r.has_hi && r.lo > r.hi) {
            const double x = r.lo;
            r.lo = r.hi;
            r.hi = x;
        }
        if (r.has_lo && r.has_hi && r.lo == r.hi)
            r.lo_exclusive = r.hi_exclusive = false;
        check_number_range(t, &r);
    }
    lily_token_trie_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixed_ranges),
        cmocka_unit_test(test_random_ranges),
        cmocka_unit_test(test_number_ranges),
        cmocka_unit_test(test_bounds_in_structure),
        cmocka_unit_test(test_empty_and_malformed_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
