/* test_json_load.c — base/json_load.h: number literals jansson refuses (integers outside int64, reals
 * beyond the double range) load as reals; everything else exactly as jansson reads it. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "base/json_load.h"
#include "test_support.h"

static json_t *load(const char *text)
{
    json_error_t jerr;
    json_t *j = lily_json_loadb(text, strlen(text), 0, &jerr);
    if (!j)
        fail_msg("'%s': %s", text, jerr.text);
    return j;
}

static void test_out_of_range_numbers_load_as_reals(void **state)
{
    (void)state;
    json_t *j = load("{\"model_max_length\": 1000000000000000019884624838656, \"max\": 9223372036854775807,"
                     " \"min\": -9223372036854775808, \"over\": 9223372036854775808, \"under\": -9223372036854775809,"
                     " \"big\": 1e400, \"neg\": -2.5E+999,"
                     " \"list\": [18446744073709551616, 1, \"18446744073709551616\"], \"tiny\": 1e-400}");
    json_t *v = json_object_get(j, "model_max_length");
    assert_true(json_is_real(v) && json_real_value(v) == 1e30);
    assert_true(json_is_integer(json_object_get(j, "max")));
    assert_true(json_integer_value(json_object_get(j, "max")) == INT64_MAX);
    assert_true(json_is_integer(json_object_get(j, "min")));
    assert_true(json_integer_value(json_object_get(j, "min")) == INT64_MIN);
    assert_true(json_real_value(json_object_get(j, "over")) == 9223372036854775808.0);
    assert_true(json_real_value(json_object_get(j, "under")) == -9223372036854775808.0);
    assert_true(json_real_value(json_object_get(j, "big")) == DBL_MAX);
    assert_true(json_real_value(json_object_get(j, "neg")) == -DBL_MAX);
    json_t *list = json_object_get(j, "list");
    assert_true(json_real_value(json_array_get(list, 0)) == 18446744073709551616.0);
    assert_int_equal(json_integer_value(json_array_get(list, 1)), 1);
    assert_string_equal(json_string_value(json_array_get(list, 2)), "18446744073709551616");
    assert_true(json_real_value(json_object_get(j, "tiny")) == 0.0);
    json_decref(j);
}

static void test_strings_and_errors_untouched(void **state)
{
    (void)state;
    /* digits inside strings, escaped quotes before them */
    json_t *j = load("[\"a\\\"99999999999999999999999\", \"\\\\\", 99999999999999999999999]");
    assert_string_equal(json_string_value(json_array_get(j, 0)), "a\"99999999999999999999999");
    assert_string_equal(json_string_value(json_array_get(j, 1)), "\\");
    assert_true(json_is_real(json_array_get(j, 2)));
    json_decref(j);
    /* malformed text is still refused, with jansson's message */
    json_error_t jerr;
    assert_null(lily_json_loadb("{\"a\": 99999999999999999999999,", 30, 0, &jerr));
    assert_null(lily_json_loadb("[1, 2", 5, 0, &jerr));
    assert_int_equal(jerr.line, 1);
    assert_null(lily_json_loadb("-", 1, JSON_DECODE_ANY, &jerr));
    assert_null(lily_json_loadb("[-0000000000000000000000000000001]", 34, 0, &jerr)); /* leading zeros */
    /* a malformed literal whose prefix overflows a double (strtod reads the prefix) or is past int64 is still
     * refused: rewritten as the largest double, it would pass, and a caller that keeps the text as written (the
     * output parser's tool-call arguments) would hand a client invalid JSON */
    static const char *const malformed[] = {
        "[1e400e5]", "[-1e400-]", "[1e400.5]", "[1E400+]", "{\"a\": 1e999.5}", "[1e400-3]", "[--1e400]",
        "[1e+400e]", "[18446744073709551616-]", "[18446744073709551616e]", "[18446744073709551616.]",
        "[018446744073709551616]", "[00e400]", "[1.e400]",
    };
    for (size_t i = 0; i < sizeof malformed / sizeof *malformed; i++)
        if (lily_json_loadb(malformed[i], strlen(malformed[i]), JSON_DECODE_ANY, &jerr))
            fail_msg("'%s' loaded", malformed[i]);
    char huge[512] = "[1";
    memset(huge + 2, '0', 400);
    memcpy(huge + 402, "-]", 3); /* a 401-digit integer, then '-' */
    assert_null(lily_json_loadb(huge, strlen(huge), 0, &jerr));
    huge[402] = ']'; /* the integer alone loads, as the largest double */
    json_t *h = lily_json_loadb(huge, 403, 0, &jerr);
    assert_non_null(h);
    assert_true(json_real_value(json_array_get(h, 0)) == DBL_MAX);
    json_decref(h);
    /* a length that cuts the text: nothing beyond it is read */
    assert_null(lily_json_loadb("[99999999999999999999999]", 10, 0, &jerr));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_out_of_range_numbers_load_as_reals),
        cmocka_unit_test(test_strings_and_errors_untouched),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
