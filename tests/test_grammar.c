/* test_grammar.c — the JSON Schema grammar engine: which strings a schema accepts and rejects, in both
 * syntaxes (compact JSON, Qwen tool-call parameters), the token masks it computes over a vocabulary, and
 * the generation constraint's two forms of a mask (logits set to -inf for the host sampler, bits for the
 * device loop). */
#include "test_support.h"

#include <stdlib.h>
#include <string.h>

#include "grammar/constraint.h"
#include "grammar/grammar.h"
#include "grammar/grammar_internal.h"

static lily_grammar *compile_text(const char *schema_text, lily_grammar_syntax syntax)
{
    json_error_t jerr;
    json_t *schema = schema_text ? json_loads(schema_text, 0, &jerr) : NULL;
    if (schema_text && !schema)
        fail_msg("bad test schema: %s", jerr.text);
    lily_grammar *g = NULL;
    lily_error err = {0};
    if (lily_grammar_compile(schema, syntax, &g, &err) != LILY_OK)
        fail_msg("compile: %s", err.message);
    json_decref(schema);
    return g;
}

/* Whether the whole text is accepted as a complete value. */
static bool accepts(const lily_grammar *g, const char *text)
{
    lily_grammar_matcher *m = NULL;
    lily_error err = {0};
    assert_int_equal(lily_grammar_matcher_new(g, &m, &err), LILY_OK);
    bool ok = lily_grammar_matcher_feed(m, text, strlen(text)) && lily_grammar_matcher_accepting(m);
    lily_grammar_matcher_free(m);
    return ok;
}

/* Whether the text is a prefix of some accepted value. */
static bool prefix_ok(const lily_grammar *g, const char *text)
{
    lily_grammar_matcher *m = NULL;
    lily_error err = {0};
    assert_int_equal(lily_grammar_matcher_new(g, &m, &err), LILY_OK);
    bool ok = lily_grammar_matcher_feed(m, text, strlen(text));
    lily_grammar_matcher_free(m);
    return ok;
}

static void test_object_properties_required_enum(void **state)
{
    (void)state;
    lily_grammar *g = compile_text(
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
        "\"color\":{\"enum\":[\"red\",\"green\"]},\"ok\":{\"type\":\"boolean\"}},"
        "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
        LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "{\"name\":\"Ann\",\"age\":31}"));
    assert_true(accepts(g, "{\"name\":\"A\\\"n\\u00e9\",\"age\":-7,\"color\":\"green\",\"ok\":true}"));
    assert_true(accepts(g, "{\"name\":\"\",\"age\":0,\"ok\":false}"));
    assert_true(accepts(g, "\n\n{\"name\":\"x\",\"age\":1}")); /* leading newlines, as after </think> */
    assert_false(accepts(g, "{\"age\":31,\"name\":\"Ann\"}"));     /* order */
    assert_false(accepts(g, "{\"name\":\"Ann\"}"));                /* age required */
    assert_false(accepts(g, "{\"name\":\"Ann\",\"age\":3.5}"));     /* integer */
    assert_false(accepts(g, "{\"name\":\"Ann\",\"age\":01}"));
    assert_false(accepts(g, "{\"name\":\"Ann\",\"age\":1,\"color\":\"blue\"}"));
    assert_false(accepts(g, "{\"name\":\"Ann\",\"age\":1,\"extra\":1}"));
    assert_false(accepts(g, "{\"name\":\"Ann\",\"age\":1} "));      /* nothing after the value */
    assert_false(accepts(g, "{\"name\":\"a\nb\",\"age\":1}"));      /* raw control character */
    assert_false(accepts(g, "{\"name\":\"Ann\",\"age\":1"));        /* incomplete */
    assert_true(prefix_ok(g, "{\"name\":\"Ann\",\"age\":1"));
    assert_false(prefix_ok(g, "{\"nam\":"));
    lily_grammar_free(g);
}

static void test_arrays_nested_anyof_ref(void **state)
{
    (void)state;
    lily_grammar *g = compile_text(
        "{\"$defs\":{\"Item\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},"
        "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":3},\"minItems\":1,\"maxItems\":2}},"
        "\"required\":[\"id\",\"tags\"]}},"
        "\"type\":\"object\",\"properties\":{\"items\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/Item\"}},"
        "\"note\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]},\"score\":{\"type\":\"number\"},"
        "\"kind\":{\"const\":\"v1\"}},\"required\":[\"items\",\"note\",\"score\",\"kind\"]}",
        LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "{\"items\":[],\"note\":null,\"score\":1.5e3,\"kind\":\"v1\"}"));
    assert_true(accepts(g, "{\"items\":[{\"id\":1,\"tags\":[\"a\",\"bcd\"]}],\"note\":\"hi\",\"score\":-0.25,\"kind\":\"v1\"}"));
    assert_false(accepts(g, "{\"items\":[{\"id\":1,\"tags\":[]}],\"note\":null,\"score\":1,\"kind\":\"v1\"}"));  /* minItems */
    assert_false(accepts(g, "{\"items\":[{\"id\":1,\"tags\":[\"a\",\"b\",\"c\"]}],\"note\":null,\"score\":1,\"kind\":\"v1\"}"));
    assert_false(accepts(g, "{\"items\":[{\"id\":1,\"tags\":[\"abcd\"]}],\"note\":null,\"score\":1,\"kind\":\"v1\"}")); /* maxLength */
    assert_false(accepts(g, "{\"items\":[],\"note\":null,\"score\":1,\"kind\":\"v2\"}"));
    assert_false(accepts(g, "{\"items\":[],\"note\":3,\"score\":1,\"kind\":\"v1\"}"));
    lily_grammar_free(g);
}

static void test_free_json_formats_and_errors(void **state)
{
    (void)state;
    lily_grammar *g = compile_text(NULL, LILY_GRAMMAR_JSON); /* json_object */
    assert_true(accepts(g, "{}"));
    assert_true(accepts(g, "{\"a\":[1,{\"b\":null},\"x\",true,-2.5E+3],\"c\":{}}"));
    assert_false(accepts(g, "[1]"));
    assert_false(accepts(g, "{\"a\":tru}"));
    assert_false(accepts(g, "{a:1}"));
    lily_grammar_free(g);

    g = compile_text("{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},"
                     "\"u\":{\"type\":\"string\",\"format\":\"uuid\"}},\"required\":[\"d\",\"u\"]}",
                     LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "{\"d\":\"2026-12-02\",\"u\":\"123e4567-e89b-12d3-a456-426614174000\"}"));
    assert_false(accepts(g, "{\"d\":\"2026-1-02\",\"u\":\"123e4567-e89b-12d3-a456-426614174000\"}"));
    lily_grammar_free(g);

    /* dates and times within their ranges: month 01-12, day 01-31, hour 00-23, minutes and seconds 00-59 */
    g = compile_text("{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},"
                     "\"t\":{\"type\":\"string\",\"format\":\"time\"},"
                     "\"dt\":{\"type\":\"string\",\"format\":\"date-time\"}},\"required\":[\"d\",\"t\",\"dt\"]}",
                     LILY_GRAMMAR_JSON);
    static const char *const good[] = {"{\"d\":\"1999-01-31\",\"t\":\"00:00:00Z\",\"dt\":\"2026-12-02T23:59:59Z\"}",
                                       "{\"d\":\"2024-10-09\",\"t\":\"19:05:30Z\",\"dt\":\"1000-09-30T20:00:00Z\"}"};
    static const char *const bad_values[] = {
        "{\"d\":\"1951-19-01\",\"t\":\"00:00:00Z\",\"dt\":\"2026-12-02T23:59:59Z\"}", /* month 19 */
        "{\"d\":\"1951-00-01\",\"t\":\"00:00:00Z\",\"dt\":\"2026-12-02T23:59:59Z\"}", /* month 00 */
        "{\"d\":\"1951-01-32\",\"t\":\"00:00:00Z\",\"dt\":\"2026-12-02T23:59:59Z\"}", /* day 32 */
        "{\"d\":\"1951-01-00\",\"t\":\"00:00:00Z\",\"dt\":\"2026-12-02T23:59:59Z\"}", /* day 00 */
        "{\"d\":\"0951-01-01\",\"t\":\"00:00:00Z\",\"dt\":\"2026-12-02T23:59:59Z\"}", /* year 0951 */
        "{\"d\":\"1951-01-01\",\"t\":\"71:23:32Z\",\"dt\":\"2026-12-02T23:59:59Z\"}", /* hour 71 */
        "{\"d\":\"1951-01-01\",\"t\":\"24:00:00Z\",\"dt\":\"2026-12-02T23:59:59Z\"}", /* hour 24 */
        "{\"d\":\"1951-01-01\",\"t\":\"23:60:00Z\",\"dt\":\"2026-12-02T23:59:59Z\"}", /* minute 60 */
        "{\"d\":\"1951-01-01\",\"t\":\"23:00:60Z\",\"dt\":\"2026-12-02T23:59:59Z\"}", /* second 60 */
        "{\"d\":\"1951-01-01\",\"t\":\"23:00:00Z\",\"dt\":\"4312-16-26T12:16:14Z\"}", /* month 16 */
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        assert_true(accepts(g, good[i]));
    for (size_t i = 0; i < sizeof bad_values / sizeof *bad_values; i++)
        assert_false(accepts(g, bad_values[i]));
    lily_grammar_free(g);

    json_t *bad = json_loads("{\"type\":\"strin\"}", 0, NULL);
    lily_grammar *out = NULL;
    lily_error err = {0};
    assert_int_equal(lily_grammar_compile(bad, LILY_GRAMMAR_JSON, &out, &err), LILY_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "strin"));
    assert_null(out);
    json_decref(bad);
    bad = json_loads("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"x\"},"
                     "\"c\":{}}}", 0, NULL); /* fails midway: nothing leaks (ASan) */
    assert_int_equal(lily_grammar_compile(bad, LILY_GRAMMAR_JSON, &out, &err), LILY_ERR_INVALID_ARGUMENT);
    json_decref(bad);
    bad = json_loads("{\"$ref\":\"#/$defs/Missing\"}", 0, NULL);
    assert_int_equal(lily_grammar_compile(bad, LILY_GRAMMAR_JSON, &out, &err), LILY_ERR_INVALID_ARGUMENT);
    json_decref(bad);
}

/* The compile error for schema_text, or NULL when it compiles. */
static const char *compile_error(const char *schema_text, lily_grammar_syntax syntax, lily_error *err)
{
    json_t *schema = json_loads(schema_text, 0, NULL);
    assert_non_null(schema);
    lily_grammar *g = NULL;
    const lily_status st = lily_grammar_compile(schema, syntax, &g, err);
    json_decref(schema);
    lily_grammar_free(g);
    return st == LILY_OK ? NULL : err->message;
}

/* Schemas no matcher could run are refused at compile time (they hung or overflowed the stack in the
 * matcher): a $ref that reaches itself with no value in between, an empty type list, a value that can only
 * recurse without end. Branches that can never finish are not offered. */
static void test_unrunnable_schemas(void **state)
{
    (void)state;
    static const char *const left_recursive[] = {
        "{\"$ref\":\"#\"}",
        "{\"allOf\":[{\"$ref\":\"#\"}]}",
        "{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"string\"}]}",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/x\"}},"
        "\"$defs\":{\"x\":{\"$ref\":\"#/$defs/y\"},\"y\":{\"anyOf\":[{\"$ref\":\"#/$defs/x\"}]}}}",
    };
    lily_error err = {0};
    for (size_t i = 0; i < sizeof left_recursive / sizeof *left_recursive; i++) {
        const char *msg = compile_error(left_recursive[i], LILY_GRAMMAR_JSON, &err);
        assert_non_null(msg);
        assert_non_null(strstr(msg, "$ref reaches itself"));
    }
    const char *msg = compile_error("{\"type\":[]}", LILY_GRAMMAR_JSON, &err);
    assert_non_null(msg);
    assert_non_null(strstr(msg, "type must be a non-empty array"));
    msg = compile_error("{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},\"required\":[\"a\"]}",
                        LILY_GRAMMAR_JSON, &err);
    assert_non_null(msg);
    assert_non_null(strstr(msg, "no finite JSON value"));
    msg = compile_error("{\"type\":\"object\",\"properties\":{\"n\":{\"$ref\":\"#/$defs/L\"}},\"required\":[\"n\"],"
                        "\"$defs\":{\"L\":{\"type\":\"array\",\"minItems\":1,\"items\":{\"$ref\":\"#/$defs/L\"}}}}",
                        LILY_GRAMMAR_QWEN_TOOL, &err);
    assert_non_null(msg);
    assert_non_null(strstr(msg, "no finite JSON value"));

    /* recursion with a way out compiles, and the endless branch is never entered */
    lily_grammar *g = compile_text("{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},"
                                   "\"required\":[\"a\"]},{\"type\":\"string\"}]}",
                                   LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "\"x\""));
    assert_true(accepts(g, "{\"a\":{\"a\":\"x\"}}"));
    lily_grammar_free(g);
    g = compile_text("{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#/$defs/E\"},\"v\":{\"type\":\"integer\"}},"
                     "\"$defs\":{\"E\":{\"type\":\"array\",\"minItems\":1,\"items\":{\"$ref\":\"#/$defs/E\"}}}}",
                     LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "{\"v\":1}"));
    assert_false(prefix_ok(g, "{\"n")); /* the optional property that could never end is not offered */
    lily_grammar_free(g);
    g = compile_text("{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}", LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "[[],[[]]]"));
    lily_grammar_free(g);

    /* deeper than the matcher's stack: refused when every value is (it wrote '[' to the limit and stopped,
     * half a value), and a branch or optional property that deep is never entered */
    static const char wrap[] = "{\"type\":\"array\",\"minItems\":1,\"items\":";
    char deep[4096] = "{\"type\":\"string\"}";
    for (int i = 0; i < LILY_GRAMMAR_MAX_DEPTH + 4; i++) { /* deep = wrap + deep + "}" */
        const size_t len = strlen(deep);
        assert_true(len + sizeof wrap + 1 < sizeof deep);
        memmove(deep + sizeof wrap - 1, deep, len);
        memcpy(deep, wrap, sizeof wrap - 1);
        memcpy(deep + sizeof wrap - 1 + len, "}", 2);
    }
    msg = compile_error(deep, LILY_GRAMMAR_JSON, &err);
    assert_non_null(msg);
    assert_non_null(strstr(msg, "nested too deeply"));
    char text[sizeof deep + 256];
    snprintf(text, sizeof text, "{\"anyOf\":[%s,{\"type\":\"integer\"}]}", deep);
    g = compile_text(text, LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "12"));
    assert_false(prefix_ok(g, "["));
    lily_grammar_free(g);
    snprintf(text, sizeof text, "{\"type\":\"object\",\"properties\":{\"d\":%s,\"v\":{\"type\":\"integer\"}}}", deep);
    g = compile_text(text, LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "{\"v\":1}"));
    assert_false(prefix_ok(g, "{\"d"));
    lily_grammar_free(g);
}

/* additionalProperties: a free object's values follow its schema (pydantic's dict[str, float]), its keys
 * number minProperties to maxProperties; false
 * without properties is only {}; a required name that properties lack is written with that schema (and is
 * refused when additionalProperties is false: nothing could satisfy it). */
static void test_additional_and_unlisted_required(void **state)
{
    (void)state;
    lily_grammar *g = compile_text("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"number\"}}",
                                   LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "{}"));
    assert_true(accepts(g, "{\"a\":1.5,\"b c\":-2}"));
    assert_false(prefix_ok(g, "{\"a\":\""));   /* a string value */
    assert_false(prefix_ok(g, "{\"a\":1,\"b\":["));
    lily_grammar_free(g);
    g = compile_text("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"},\"minProperties\":1,"
                     "\"maxProperties\":2}",
                     LILY_GRAMMAR_JSON); /* pydantic's dict[str, int] = Field(min_length=1, max_length=2) */
    assert_true(accepts(g, "{\"a\":1}"));
    assert_true(accepts(g, "{\"a\":1,\"b\":2}"));
    assert_false(accepts(g, "{}"));
    assert_false(prefix_ok(g, "{\"a\":1,\"b\":2,"));
    lily_grammar_free(g);
    g = compile_text("{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}", LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "{}"));
    assert_false(prefix_ok(g, "{\""));
    lily_grammar_free(g);
    g = compile_text("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"b\"],"
                     "\"additionalProperties\":{\"type\":\"boolean\"}}",
                     LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "{\"b\":true}"));
    assert_true(accepts(g, "{\"a\":3,\"b\":false}"));
    assert_false(accepts(g, "{}"));
    assert_false(accepts(g, "{\"a\":3}"));
    assert_false(prefix_ok(g, "{\"b\":1"));
    lily_grammar_free(g);
    g = compile_text("{\"type\":\"object\",\"required\":[\"x\"]}", LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "{\"x\":[1,\"y\"]}"));
    assert_false(accepts(g, "{}"));
    lily_grammar_free(g);
    g = compile_text("{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"days\"]}",
                     LILY_GRAMMAR_QWEN_TOOL);
    assert_true(accepts(g, "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"));
    assert_false(accepts(g, "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"));
    lily_grammar_free(g);
    lily_error err = {0};
    const char *msg = compile_error("{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"],"
                                    "\"additionalProperties\":false}",
                                    LILY_GRAMMAR_JSON, &err);
    assert_non_null(msg);
    assert_non_null(strstr(msg, "not in properties"));
    msg = compile_error("{\"type\":\"object\",\"additionalProperties\":false,\"minProperties\":1}", LILY_GRAMMAR_JSON,
                        &err);
    assert_non_null(msg);
    assert_non_null(strstr(msg, "minProperties"));
}

/* prefixItems: item i follows prefixItems[i], the rest items (false: none), as pydantic writes tuple[int, str]
 * (its items were free values); the items array of drafts before 2020-12 with additionalItems the same. */
static void test_tuples(void **state)
{
    (void)state;
    lily_grammar *g = compile_text("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],"
                                   "\"minItems\":2,\"maxItems\":2}",
                                   LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "[3,\"x\"]"));
    assert_false(prefix_ok(g, "[\"x\""));
    assert_false(prefix_ok(g, "[3,4"));
    assert_false(prefix_ok(g, "[3,\"x\","));
    assert_false(accepts(g, "[3]"));
    lily_grammar_free(g);
    g = compile_text("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"boolean\"}],\"items\":{\"type\":\"null\"}}",
                     LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "[]"));
    assert_true(accepts(g, "[true,null,null]"));
    assert_false(prefix_ok(g, "[true,true"));
    lily_grammar_free(g);
    g = compile_text("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"number\"},{\"type\":\"number\"}],"
                     "\"items\":false}",
                     LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "[1,2.5]"));
    assert_true(accepts(g, "[1]"));
    assert_false(prefix_ok(g, "[1,2,"));
    lily_grammar_free(g);
    g = compile_text("{\"type\":\"array\",\"items\":[{\"const\":\"a\"}],\"additionalItems\":false}", LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "[\"a\"]"));
    assert_false(prefix_ok(g, "[\"a\","));
    lily_grammar_free(g);
    lily_error err = {0};
    const char *msg = compile_error("{\"type\":\"array\",\"prefixItems\":[{}],\"items\":false,\"minItems\":2}",
                                    LILY_GRAMMAR_JSON, &err);
    assert_non_null(msg);
    assert_non_null(strstr(msg, "prefixItems"));
}

/* Numbers are finite doubles: at most two exponent digits (1e999 is infinity to one parser, an error to
 * another). Strings hold no \uD800-\uDFFF escape (a lone surrogate is an error to a strict parser). */
static void test_numbers_finite_strings_without_surrogates(void **state)
{
    (void)state;
    lily_grammar *g = compile_text("{\"type\":\"array\",\"items\":{\"type\":\"number\"}}", LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "[1e99,-9999999999999999.9999999999999999E+99,2.5e-99,0E0]"));
    assert_false(prefix_ok(g, "[1e400"));
    assert_false(prefix_ok(g, "[1e100"));
    assert_false(prefix_ok(g, "[1.5E-100"));
    lily_grammar_free(g);
    /* an integer is canonical, bounded or not: "0", never "-0" (a number may be "-0": JSON's grammar) */
    g = compile_text("{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}", LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "[0,-1,-10,9007199254740993,-9999999999999999]"));
    assert_false(prefix_ok(g, "[-0"));
    assert_false(prefix_ok(g, "[1,-0"));
    assert_false(prefix_ok(g, "[01"));
    assert_false(prefix_ok(g, "[1.0"));
    lily_grammar_free(g);
    g = compile_text("{\"type\":\"number\"}", LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "-0") && accepts(g, "-0.5"));
    lily_grammar_free(g);
    /* bounded integers, negative ranges and one-sided bounds: every integer in range, never "-0" */
    g = compile_text("{\"type\":\"integer\",\"minimum\":-5,\"maximum\":-1}", LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "-5") && accepts(g, "-1") && accepts(g, "-3"));
    assert_false(accepts(g, "0") || accepts(g, "-6") || prefix_ok(g, "-0"));
    lily_grammar_free(g);
    g = compile_text("{\"type\":\"integer\",\"maximum\":0}", LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "0") && accepts(g, "-1") && accepts(g, "-10"));
    assert_false(accepts(g, "1") || prefix_ok(g, "-0"));
    lily_grammar_free(g);
    g = compile_text("{\"type\":\"integer\",\"exclusiveMinimum\":-1,\"maximum\":10}", LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "0") && accepts(g, "10"));
    assert_false(accepts(g, "-1") || prefix_ok(g, "-0"));
    lily_grammar_free(g);
    g = compile_text("{\"type\":\"number\",\"minimum\":-1,\"maximum\":1}", LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "-0.5") && accepts(g, "0") && accepts(g, "-1") && accepts(g, "1"));
    lily_grammar_free(g);
    g = compile_text("{\"type\":[\"integer\",\"null\"]}", LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "0") && accepts(g, "-7") && accepts(g, "null"));
    assert_false(prefix_ok(g, "-0"));
    lily_grammar_free(g);
    g = compile_text("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}},\"required\":[\"n\"]}",
                     LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "{\"n\":-0}") == false && accepts(g, "{\"n\":0}") && accepts(g, "{\"n\":-20}"));
    lily_grammar_free(g);
    g = compile_text("{\"type\":\"string\"}", LILY_GRAMMAR_JSON);
    assert_true(accepts(g, "\"\\u00e9\\uD7FF\\uE000\\uffff\\u0000\""));
    assert_false(prefix_ok(g, "\"\\ud800"));
    assert_false(prefix_ok(g, "\"\\uDBFF"));
    assert_false(prefix_ok(g, "\"\\udc00"));
    assert_false(prefix_ok(g, "\"\\uDFFF"));
    assert_false(prefix_ok(g, "\"a\\ud83d\\ude00"));
    assert_true(accepts(g, "\"\xf0\x9f\x98\x80\"")); /* the character itself */
    lily_grammar_free(g);
}

/* A wide object (4000 properties, every 1000th required): the candidates a key may take run from the next
 * property to the next required one, in order; none past it, none before. */
static void test_wide_object(void **state)
{
    (void)state;
    enum { N = 4000 };
    json_t *props = json_object(), *required = json_array();
    assert_non_null(props);
    assert_non_null(required);
    for (int i = 0; i < N; i++) {
        char key[16];
        snprintf(key, sizeof key, "p%d", i);
        json_object_set_new(props, key, json_pack("{s:s}", "type", "integer"));
        if (i % 1000 == 999)
            json_array_append_new(required, json_string(key));
    }
    json_t *schema = json_pack("{s:s,s:o,s:o}", "type", "object", "properties", props, "required", required);
    lily_grammar *g = NULL;
    lily_error err = {0};
    assert_int_equal(lily_grammar_compile(schema, LILY_GRAMMAR_JSON, &g, &err), LILY_OK);
    json_decref(schema);
    assert_true(accepts(g, "{\"p999\":1,\"p1999\":2,\"p2999\":3,\"p3999\":4}"));
    assert_true(accepts(g, "{\"p5\":0,\"p999\":1,\"p1000\":7,\"p1999\":2,\"p2999\":3,\"p3998\":5,\"p3999\":4}"));
    assert_false(prefix_ok(g, "{\"p999\":1,\"p2999\"")); /* skips the required p1999 */
    assert_false(prefix_ok(g, "{\"p999\":1,\"p5\""));    /* goes back */
    assert_false(accepts(g, "{\"p999\":1,\"p1999\":2,\"p2999\":3}"));
    lily_grammar_free(g);
}

static void test_qwen_tool_syntax(void **state)
{
    (void)state;
    lily_grammar *g = compile_text(
        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
        "\"unit\":{\"enum\":[\"c\",\"f\"]}},\"required\":[\"city\",\"days\"]}",
        LILY_GRAMMAR_QWEN_TOOL);
    assert_true(accepts(g, "<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
                           "</function>\n</tool_call>"));
    assert_true(accepts(g, "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n12\n</parameter>\n"
                           "<parameter=unit>\nf\n</parameter>\n</function>\n</tool_call>"));
    assert_false(accepts(g, "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>")); /* days */
    assert_false(accepts(g, "<parameter=city>\nPa<b\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
                            "</function>\n</tool_call>"));
    assert_false(accepts(g, "<parameter=city>\nParis\n</parameter>\n<parameter=days>\nthree\n</parameter>\n"
                            "</function>\n</tool_call>"));
    lily_grammar_free(g);
}

static void test_mask(void **state)
{
    (void)state;
    const char *vocab[] = {"{", "}", "{\"", "\"", "a", ":", "1", "12", ",", "true", " ", "\"a\":", "x\"}", "<|im_end|>"};
    const int n = (int)(sizeof vocab / sizeof vocab[0]);
    size_t lens[sizeof vocab / sizeof vocab[0]];
    bool excluded[sizeof vocab / sizeof vocab[0]] = {0};
    for (int i = 0; i < n; i++)
        lens[i] = strlen(vocab[i]);
    excluded[n - 1] = true; /* a special token */
    lily_token_trie *t = NULL;
    lily_error err = {0};
    assert_int_equal(lily_token_trie_new(vocab, lens, excluded, n, &t, &err), LILY_OK);
    lily_grammar *g = compile_text("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                                   "\"required\":[\"a\"]}", LILY_GRAMMAR_JSON);
    lily_grammar_matcher *m = NULL;
    assert_int_equal(lily_grammar_matcher_new(g, &m, &err), LILY_OK);
    uint8_t allowed[sizeof vocab / sizeof vocab[0]];
    assert_int_equal(lily_grammar_matcher_mask(m, t, allowed), 3); /* "{", "{\"", " " (leading space) */
    assert_true(allowed[0] && allowed[2] && allowed[10]);
    assert_true(lily_grammar_matcher_feed(m, "{", 1));
    assert_int_equal(lily_grammar_matcher_mask(m, t, allowed), 2); /* "\"", "\"a\":" */
    assert_true(allowed[3] && allowed[11]);
    assert_true(lily_grammar_matcher_feed(m, "\"a\":", 4));
    assert_int_equal(lily_grammar_matcher_mask(m, t, allowed), 2); /* "1", "12" */
    assert_true(allowed[6] && allowed[7]);
    assert_true(lily_grammar_matcher_feed(m, "12", 2));
    assert_false(lily_grammar_matcher_accepting(m));
    lily_grammar_matcher_mask(m, t, allowed);
    assert_true(allowed[1] && allowed[6] && allowed[7] && !allowed[8]); /* "}" or more digits, no ',' */
    assert_false(lily_grammar_matcher_feed(m, ",", 1));
    assert_true(lily_grammar_matcher_feed(m, "}", 1));
    assert_true(lily_grammar_matcher_accepting(m));
    assert_true(lily_grammar_matcher_finished(m));
    assert_int_equal(lily_grammar_matcher_mask(m, t, allowed), 0);
    lily_grammar_matcher_free(m);
    lily_grammar_free(g);

    /* inside a free string: plain tokens through the precomputed set, the rest through the walk */
    g = compile_text("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]}",
                     LILY_GRAMMAR_JSON);
    assert_int_equal(lily_grammar_matcher_new(g, &m, &err), LILY_OK);
    assert_true(lily_grammar_matcher_feed(m, "{\"a\":\"", 6));
    assert_int_equal(lily_grammar_matcher_mask(m, t, allowed), 12);
    for (int i = 0; i < n - 1; i++) /* every token but "\"a\":" (a quote closes the string; 'a' cannot follow) */
        assert_int_equal(allowed[i], i != 11);
    assert_false(allowed[n - 1]); /* special */
    lily_grammar_matcher_free(m);
    lily_grammar_free(g);
    lily_token_trie_free(t);
}

/* Inside strings with a length limit (maxLength; a raw tool parameter's too) the mask counts each plain
 * token's characters against the room left: the same mask as feeding every token to the matcher, at each
 * step of filling the string up to its limit (multi-byte characters count once). */
static void test_mask_length_limit(void **state)
{
    (void)state;
    const char *vocab[] = {"a", "ab", "abc", "abcd", "\xc3\xa9", "\xc3\xa9\xc3\xa9x", "\"", "x\"", "\\n", " ", "}", "\"}",
                           "<", "\n"};
    const int n = (int)(sizeof vocab / sizeof vocab[0]);
    size_t lens[sizeof vocab / sizeof vocab[0]];
    for (int i = 0; i < n; i++)
        lens[i] = strlen(vocab[i]);
    lily_token_trie *t = NULL;
    lily_error err = {0};
    assert_int_equal(lily_token_trie_new(vocab, lens, NULL, n, &t, &err), LILY_OK);
    static const struct {
        const char *schema, *prefix;
        lily_grammar_syntax syntax;
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"maxLength\":5}},\"required\":[\"s\"]}",
         "{\"s\":\"", LILY_GRAMMAR_JSON},
        {"{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":4}},"
         "\"required\":[\"s\"]}", "{\"s\":\"", LILY_GRAMMAR_JSON},
        {"{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\",\"maxLength\":3}},\"required\":[\"q\"]}",
         "<parameter=q>\n", LILY_GRAMMAR_QWEN_TOOL},
    };
    char text[128];
    uint8_t allowed[sizeof vocab / sizeof vocab[0]];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        lily_grammar *g = compile_text(cases[c].schema, cases[c].syntax);
        /* fill the string one "a" at a time, then one "\xc3\xa9" past it, checking the mask at each length */
        for (int filled = 0; filled <= 6; filled++) {
            snprintf(text, sizeof text, "%s", cases[c].prefix);
            for (int k = 0; k < filled; k++)
                strcat(text, k == 1 ? "\xc3\xa9" : "a");
            if (!prefix_ok(g, text))
                break;
            lily_grammar_matcher *m = NULL;
            assert_int_equal(lily_grammar_matcher_new(g, &m, &err), LILY_OK);
            assert_true(lily_grammar_matcher_feed(m, text, strlen(text)));
            const int got = lily_grammar_matcher_mask(m, t, allowed);
            int want = 0;
            for (int id = 0; id < n; id++) {
                char next[160];
                snprintf(next, sizeof next, "%s%s", text, vocab[id]);
                const bool ok = prefix_ok(g, next);
                want += ok;
                if (allowed[id] != ok)
                    fail_msg("case %zu, %d characters: token %d (\"%s\") mask %d, matcher %d", c, filled, id, vocab[id],
                             allowed[id], ok);
            }
            assert_int_equal(got, want);
            lily_grammar_matcher_free(m);
        }
        lily_grammar_free(g);
    }
    lily_token_trie_free(t);
}

/* The constraint's bit mask (the device loop's) allows exactly the tokens its logits mask (the host
 * sampler's) leaves finite, at every step of a document: none while waiting for "</think>", the grammar's
 * tokens, then the stop token once the value is complete; ids past the tokenizer's vocabulary never;
 * -1 from both once nothing may follow. */
static void test_constraint_bits_match_mask(void **state)
{
    (void)state;
    lily_error err = {0};
    lily_tokenizer *tok = NULL;
    if (lily_tokenizer_load(test_data_path("tiny-chat"), &tok, &err) != LILY_OK)
        fail_msg("tokenizer: %s", err.message);
    const int vocab = lily_tokenizer_vocab_size(tok) + 40; /* a model vocabulary padded past the tokenizer's */
    lily_token_trie *trie = NULL;
    assert_int_equal(lily_vocab_trie_new(tok, vocab, &trie, &err), LILY_OK);
    lily_grammar *g = compile_text("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"},"
                                   "\"s\":{\"type\":\"string\"}},\"required\":[\"n\",\"s\"]}",
                                   LILY_GRAMMAR_JSON);
    const int32_t think_end = lily_tokenizer_token_id(tok, "</think>");
    const int32_t stop = lily_tokenizer_token_id(tok, "<|im_end|>");
    assert_true(think_end >= 0 && stop >= 0);
    lily_grammar_constraint_options o = {.grammar = g, .trie = trie, .tok = tok, .vocab = vocab,
                                         .stop_ids = &stop, .n_stop_ids = 1, .think_close = think_end};
    lily_grammar_constraint *c = NULL;
    assert_int_equal(lily_grammar_constraint_new(&o, &c, &err), LILY_OK);
    const lily_token_constraint h = lily_grammar_constraint_hook(c);
    assert_non_null(h.allowed);
    static const char doc[] = "hmm</think>{\"n\":42,\"s\":\"a b\"}";
    int32_t *ids = NULL;
    int n_ids = 0;
    assert_int_equal(lily_tokenizer_encode(tok, doc, sizeof doc - 1, true, &ids, &n_ids, &err), LILY_OK);
    float *logits = malloc((size_t)vocab * sizeof *logits);
    const int words = (vocab + 31) / 32;
    uint32_t *bits = malloc((size_t)words * sizeof *bits);
    bool waited = false, constrained = false;
    for (int step = 0; step <= n_ids; step++) {
        for (int v = 0; v < vocab; v++)
            logits[v] = 0.5f;
        memset(bits, 0xa5, (size_t)words * sizeof *bits);
        const int nm = h.mask(h.user, logits, vocab);
        const int nb = h.allowed(h.user, bits, vocab);
        assert_int_equal(nm, nb);
        if (nb == 0) { /* waiting: neither touches its output */
            waited = true;
            for (int v = 0; v < vocab; v++)
                assert_true(logits[v] == 0.5f);
            assert_int_equal(bits[0], 0xa5a5a5a5u);
        } else {
            assert_true(nb > 0);
            constrained = true;
            int count = 0;
            for (int v = 0; v < vocab; v++) {
                const bool bit = (bits[v >> 5] >> (v & 31)) & 1u;
                assert_int_equal(bit, logits[v] == 0.5f);
                count += bit;
            }
            assert_int_equal(count, nb);
            for (int v = lily_tokenizer_vocab_size(tok); v < vocab; v++)
                assert_false((bits[v >> 5] >> (v & 31)) & 1u);
            assert_int_equal((bits[stop >> 5] >> (stop & 31)) & 1u, step == n_ids); /* complete only at the end */
            if (step < n_ids)
                assert_true((bits[ids[step] >> 5] >> (ids[step] & 31)) & 1u); /* the document's next token */
        }
        if (step < n_ids)
            h.accept(h.user, ids[step]);
    }
    assert_true(waited && constrained);
    assert_true(lily_grammar_constraint_complete(c));
    h.accept(h.user, ids[0]); /* a token the grammar rejects after the value: nothing may follow */
    assert_int_equal(h.mask(h.user, logits, vocab), -1);
    assert_int_equal(h.allowed(h.user, bits, vocab), -1);
    free(ids);
    free(logits);
    free(bits);
    lily_grammar_constraint_free(c);
    lily_grammar_free(g);
    lily_token_trie_free(trie);
    lily_tokenizer_free(tok);
}

/* Both tries' masks at every step of feeding text to g token by token (as tok splits it): the same
 * allowed set and count, and the next token allowed. */
static void assert_same_masks(const lily_tokenizer *tok, const lily_token_trie *fast, const lily_token_trie *ref,
                              int vocab, const char *schema, lily_grammar_syntax syntax, const char *text)
{
    lily_error err = {0};
    lily_grammar *g = compile_text(schema, syntax);
    lily_grammar_matcher *m = NULL;
    assert_int_equal(lily_grammar_matcher_new(g, &m, &err), LILY_OK);
    int32_t *ids = NULL;
    int n_ids = 0;
    assert_int_equal(lily_tokenizer_encode(tok, text, strlen(text), false, &ids, &n_ids, &err), LILY_OK);
    uint8_t *a = malloc((size_t)vocab), *b = malloc((size_t)vocab);
    assert_true(a && b);
    for (int step = 0; step <= n_ids; step++) {
        const int na = lily_grammar_matcher_mask(m, fast, a);
        const int nb = lily_grammar_matcher_mask(m, ref, b);
        assert_int_equal(na, nb);
        if (memcmp(a, b, (size_t)vocab))
            fail_msg("%s: the masks differ at step %d", schema ? schema : "json_object", step);
        if (step == n_ids)
            break;
        if (!a[ids[step]])
            fail_msg("%s: the text's token %d is masked out", schema ? schema : "json_object", step);
        size_t len = 0;
        const char *bytes = lily_tokenizer_token_bytes(tok, ids[step], &len);
        assert_true(lily_grammar_matcher_feed(m, bytes, len));
    }
    assert_true(lily_grammar_matcher_accepting(m));
    free(a);
    free(b);
    free(ids);
    lily_grammar_matcher_free(m);
    lily_grammar_free(g);
}

/* The trie built from the tokens sorted by their bytes (lily_token_trie_new) against the reference that
 * inserts them one by one: the same tree (lily_token_trie_equal), and the same masks through documents of
 * several schemas, on the Qwen3 vocabulary (151,643 tokens and the special ones) and on a random one dense
 * in duplicates, prefixes of each other, empty tokens, NUL and 0xff bytes and long shared runs. */
static void test_sorted_trie_matches_insertion(void **state)
{
    (void)state;
    lily_error err = {0};
    lily_tokenizer *tok = NULL;
    if (lily_tokenizer_load(test_data_path("tokenizers/qwen3"), &tok, &err) != LILY_OK)
        fail_msg("tokenizer: %s", err.message);
    const int vocab = lily_tokenizer_vocab_size(tok) + 7; /* a model vocabulary padded past the tokenizer's */
    const char **bytes = calloc((size_t)vocab, sizeof *bytes);
    size_t *lens = calloc((size_t)vocab, sizeof *lens);
    bool *excluded = calloc((size_t)vocab, sizeof *excluded);
    assert_true(bytes && lens && excluded);
    for (int id = 0; id < lily_tokenizer_vocab_size(tok); id++) {
        bytes[id] = lily_tokenizer_token_bytes(tok, id, &lens[id]);
        excluded[id] = lily_tokenizer_is_special(tok, id);
    }
    lily_token_trie *fast = NULL, *ref = NULL, *model = NULL;
    assert_int_equal(lily_token_trie_new(bytes, lens, excluded, vocab, &fast, &err), LILY_OK);
    assert_int_equal(lily_token_trie_new_by_insertion(bytes, lens, excluded, vocab, &ref, &err), LILY_OK);
    assert_int_equal(lily_vocab_trie_new(tok, vocab, &model, &err), LILY_OK);
    assert_true(lily_token_trie_equal(fast, ref));
    assert_true(lily_token_trie_equal(model, ref));
    static const struct {
        const char *schema, *text;
        lily_grammar_syntax syntax;
    } docs[] = {
        {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":400},\"tags\":{\"type\":"
         "\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":40}},\"required\":[\"name\",\"tags\"],"
         "\"additionalProperties\":false}",
         "\n{\"name\":\"kernel memory \\u00e9t\\u00e9 \\\"quoted\\\" caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\",\"tags\":"
         "[\"alpha\",\"\",\"x y\"]}", LILY_GRAMMAR_JSON},
        {"{\"type\":\"object\",\"properties\":{\"status\":{\"enum\":[\"open\",\"paid\",\"shipped\"]},\"n\":{\"type\":"
         "\"number\"},\"when\":{\"type\":\"string\",\"format\":\"date-time\"},\"note\":{\"anyOf\":[{\"type\":"
         "\"string\"},{\"type\":\"null\"}]}},\"required\":[\"status\",\"n\",\"when\",\"note\"]}",
         "{\"status\":\"paid\",\"n\":-12.5e3,\"when\":\"2026-12-03T09:34:11Z\",\"note\":null}", LILY_GRAMMAR_JSON},
        {NULL, "{\"query\":\"weather in Paris\",\"filters\":{\"days\":[1,2,3],\"verbose\":false}}", LILY_GRAMMAR_JSON},
        {"{\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\"},\"limit\":{\"type\":\"integer\"}},"
         "\"required\":[\"query\"]}",
         "<parameter=query>\nbest b-free raw text\tand caf\xc3\xa9\n</parameter>\n<parameter=limit>\n20\n"
         "</parameter>\n</function>\n</tool_call>", LILY_GRAMMAR_QWEN_TOOL},
    };
    for (size_t d = 0; d < sizeof docs / sizeof docs[0]; d++)
        assert_same_masks(tok, fast, ref, vocab, docs[d].schema, docs[d].syntax, docs[d].text);
    lily_token_trie_free(fast);
    lily_token_trie_free(ref);
    lily_token_trie_free(model);
    free(bytes);
    free(lens);
    free(excluded);
    lily_tokenizer_free(tok);

    /* random tokens over a five-byte alphabet, 0-40 bytes long (a 30-byte run of 'a' shared by many) */
    enum { N = 6000 };
    static const char alphabet[] = {0, 'a', '"', (char)0xfe, (char)0xff};
    static char store[N][40];
    static const char *rbytes[N];
    static size_t rlens[N];
    static bool rexcluded[N];
    uint32_t x = 12345;
    for (int id = 0; id < N; id++) {
        x = x * 1664525u + 1013904223u;
        rlens[id] = (x >> 8) % 13 + ((x >> 20) % 4 == 0 ? 27 : 0);
        for (size_t k = 0; k < rlens[id]; k++) {
            x = x * 1664525u + 1013904223u;
            store[id][k] = rlens[id] > 26 && k < 30 ? 'a' : alphabet[(x >> 16) % 5];
        }
        rbytes[id] = id % 97 == 5 ? NULL : store[id];
        rexcluded[id] = id % 89 == 3;
    }
    assert_int_equal(lily_token_trie_new(rbytes, rlens, rexcluded, N, &fast, &err), LILY_OK);
    assert_int_equal(lily_token_trie_new_by_insertion(rbytes, rlens, rexcluded, N, &ref, &err), LILY_OK);
    assert_true(lily_token_trie_equal(fast, ref));
    lily_token_trie_free(fast);
    int changed = N / 2; /* one byte of a token in the tries changed: the check sees it */
    while (!rbytes[changed] || !rlens[changed] || rexcluded[changed])
        changed++;
    store[changed][0] = store[changed][0] == 'a' ? '"' : 'a';
    assert_int_equal(lily_token_trie_new(rbytes, rlens, rexcluded, N, &fast, &err), LILY_OK);
    assert_false(lily_token_trie_equal(fast, ref));
    lily_token_trie_free(fast);
    lily_token_trie_free(ref);
}

static int compare_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* lily_token_trie_prefixes (the walk down the trie that `lily serve` masks a tool name with) finds exactly
 * the tokens a scan of the whole vocabulary finds, those with non-empty bytes that are a prefix of the text
 * and not special, for every suffix of a few tool names and texts on the Qwen3 vocabulary; a small cap
 * still counts them all. */
static void test_trie_prefixes_match_scan(void **state)
{
    (void)state;
    lily_error err = {0};
    lily_tokenizer *tok = NULL;
    if (lily_tokenizer_load(test_data_path("tokenizers/qwen3"), &tok, &err) != LILY_OK)
        fail_msg("tokenizer: %s", err.message);
    const int vocab = lily_tokenizer_vocab_size(tok);
    lily_token_trie *trie = NULL;
    assert_int_equal(lily_vocab_trie_new(tok, vocab, &trie, &err), LILY_OK);
    static const char *texts[] = {"search>\n", "get_weather>\n", "get_current_time_in_zone>\n", " hello world",
                                  "<tool_call>\n<function=", "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e>\n", "<|im_end|>"};
    int32_t got[512], want[512];
    int checked = 0;
    for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++)
        for (size_t from = 0; from < strlen(texts[t]); from++) {
            const char *text = texts[t] + from;
            const size_t len = strlen(text);
            int n_want = 0;
            for (int32_t id = 0; id < vocab; id++) {
                size_t tl = 0;
                const char *b = lily_tokenizer_token_bytes(tok, id, &tl);
                if (b && tl && tl <= len && !memcmp(b, text, tl) && !lily_tokenizer_is_special(tok, id)) {
                    assert_true(n_want < 512);
                    want[n_want++] = id;
                }
            }
            const int n_got = lily_token_trie_prefixes(trie, text, len, got, 512);
            assert_int_equal(n_got, n_want);
            qsort(got, (size_t)n_got, sizeof *got, compare_i32);
            assert_memory_equal(got, want, (size_t)n_want * sizeof *want);
            assert_int_equal(lily_token_trie_prefixes(trie, text, len, got, 1), n_want);
            checked += n_want;
        }
    assert_true(checked > 50);
    lily_token_trie_free(trie);
    lily_tokenizer_free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_object_properties_required_enum),
        cmocka_unit_test(test_arrays_nested_anyof_ref),
        cmocka_unit_test(test_free_json_formats_and_errors),
        cmocka_unit_test(test_unrunnable_schemas),
        cmocka_unit_test(test_additional_and_unlisted_required),
        cmocka_unit_test(test_numbers_finite_strings_without_surrogates),
        cmocka_unit_test(test_tuples),
        cmocka_unit_test(test_wide_object),
        cmocka_unit_test(test_qwen_tool_syntax),
        cmocka_unit_test(test_mask),
        cmocka_unit_test(test_mask_length_limit),
        cmocka_unit_test(test_constraint_bits_match_mask),
        cmocka_unit_test(test_sorted_trie_matches_insertion),
        cmocka_unit_test(test_trie_prefixes_match_scan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
