/* test_chat_template.c — the C Qwen3.6 chat template against jinja2 renderings of the real template.
 *
 * References: tests/data/tokenizers/qwen35/chat_template_examples.json (10 renderings made with HF's
 * jinja2 setup) and tests/data/chat_template_cases.json (made by tools/make_template_cases.py with the
 * same setup plus vLLM's request preprocessing), both byte-exact; Python's repr for float formatting;
 * FIPS 180-4 test vectors for SHA-256.
 */
#include "test_support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json_load.h"
#include "base/sha256.h"
#include "text/chat_template.h"
#include "text/py_json.h"

/* Up to 60 bytes of s with newlines and tabs made visible, into buf. */
static const char *visible(const char *s, char *buf, size_t size)
{
    size_t o = 0;
    for (size_t i = 0; s[i] && i < 60 && o + 3 < size; i++) {
        if (s[i] == '\n' || s[i] == '\t') {
            buf[o++] = '\\';
            buf[o++] = s[i] == '\n' ? 'n' : 't';
        } else {
            buf[o++] = s[i];
        }
    }
    buf[o] = '\0';
    return buf;
}

/* Render request; on a mismatch print the case name and the first differing byte. Returns 1 if equal. */
static int check_rendering(const char *name, const json_t *request, const char *expected)
{
    char *got = NULL;
    lily_error err = {0};
    lily_status st = lily_chat_render(request, NULL, &got, &err);
    if (st != LILY_OK) {
        print_message("%s: render failed: %s\n", name, err.message);
        return 0;
    }
    int same = !strcmp(got, expected);
    if (!same) {
        size_t i = 0;
        while (got[i] && got[i] == expected[i])
            i++;
        size_t from = i > 30 ? i - 30 : 0;
        char a[256], b[256];
        print_message("%s: differs at byte %zu\n  got:      ...%s\n  expected: ...%s\n", name, i,
                      visible(got + from, a, sizeof a), visible(expected + from, b, sizeof b));
    }
    free(got);
    return same;
}

static void test_template_hf_examples_byte_exact(void **state)
{
    (void)state;
    json_error_t jerr;
    json_t *examples = json_load_file(test_data_path("tokenizers/qwen35/chat_template_examples.json"), 0, &jerr);
    assert_non_null(examples);
    assert_int_equal(json_array_size(examples), 10);
    size_t i, passed = 0;
    json_t *ex;
    json_array_foreach(examples, i, ex) {
        /* the examples pass template variables directly; as a request, thinking switches go in kwargs */
        json_t *kwargs = json_object_get(ex, "kwargs");
        json_t *request = json_object();
        json_t *chat_kwargs = json_object();
        const char *key;
        json_t *value;
        json_object_foreach(kwargs, key, value) {
            if (!strcmp(key, "enable_thinking") || !strcmp(key, "preserve_thinking"))
                json_object_set(chat_kwargs, key, value);
            else
                json_object_set(request, key, value);
        }
        json_object_set_new(request, "chat_template_kwargs", chat_kwargs);
        passed += check_rendering(json_string_value(json_object_get(ex, "name")), request,
                                  json_string_value(json_object_get(ex, "rendered")));
        json_decref(request);
    }
    json_decref(examples);
    assert_int_equal(passed, 10);
}

/* Every case of a generated file: renderings byte-exact, refusals refused. */
static void check_case_file(const char *relative, size_t min_rendered, size_t min_errors)
{
    json_error_t jerr;
    json_t *cases = json_load_file(test_data_path(relative), 0, &jerr);
    if (!cases)
        print_message("%s: line %d: %s\n", relative, jerr.line, jerr.text);
    assert_non_null(cases);
    size_t i, n_rendered = 0, n_errors = 0, failed = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const json_t *request = json_object_get(c, "request");
        const json_t *rendered = json_object_get(c, "rendered");
        if (rendered) {
            n_rendered++;
            failed += !check_rendering(name, request, json_string_value(rendered));
        } else {
            n_errors++;
            char *got = NULL;
            lily_error err = {0};
            lily_status st = lily_chat_render(request, NULL, &got, &err);
            if (st != LILY_ERR_TEMPLATE || got || !err.message[0]) {
                print_message("%s: expected a template error (jinja2: %s), got status %d\n", name,
                              json_string_value(json_object_get(c, "error")), st);
                failed++;
            }
            free(got);
        }
    }
    json_decref(cases);
    print_message("%s: %zu renderings, %zu refusals\n", relative, n_rendered, n_errors);
    assert_true(n_rendered >= min_rendered);
    assert_true(n_errors >= min_errors);
    assert_int_equal(failed, 0);
}

/* Named cases: every feature of the template (tools/make_template_cases.py CASES). */
static void test_template_generated_cases_byte_exact(void **state)
{
    (void)state;
    check_case_file("chat_template_cases.json", 60, 13);
}

/* Random requests from a fixed seed (tools/make_template_cases.py random_cases). */
static void test_template_random_cases_byte_exact(void **state)
{
    (void)state;
    check_case_file("chat_template_random.json", 140, 1);
}

/* Render a request given as JSON text with the default options; returns the status, *out malloc'd. */
static lily_status render_text(const char *request_json, const lily_chat_options *opts, char **out, lily_error *err)
{
    json_error_t jerr;
    json_t *request = json_loads(request_json, 0, &jerr);
    assert_non_null(request);
    lily_status st = lily_chat_render(request, opts, out, err);
    json_decref(request);
    return st;
}

static void expect_template_error(const char *request_json, const char *message_part)
{
    char *out = (char *)1;
    lily_error err = {0};
    lily_status st = render_text(request_json, NULL, &out, &err);
    if (st != LILY_ERR_TEMPLATE || !strstr(err.message, message_part))
        print_message("request %s\n  status %d, message \"%s\", expected to contain \"%s\"\n", request_json, st,
                      err.message, message_part);
    assert_int_equal(st, LILY_ERR_TEMPLATE);
    assert_null(out);
    assert_non_null(strstr(err.message, message_part));
}

static void test_template_rejects_bad_requests(void **state)
{
    (void)state;
    expect_template_error("{\"messages\": []}", "No messages provided");
    expect_template_error("{\"model\": \"x\"}", "\"messages\" array");
    expect_template_error("{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}]}", "No user query");
    expect_template_error("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"bot\", \"content\": "
                          "\"x\"}]}",
                          "messages[1]: Unexpected message role \"bot\"");
    expect_template_error("{\"messages\": [{\"content\": \"hi\"}]}", "messages[0]: needs a string \"role\"");
    expect_template_error("{\"messages\": [\"hi\"]}", "messages[0]: expected an object");
    expect_template_error("{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "Unexpected content type");
    expect_template_error("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": 5}]}]}",
                          "content[0].text: expected a string");
    expect_template_error("{\"messages\": [{\"role\": \"user\", \"content\": [\"hi\"]}]}", "content[0]: expected an object");
    expect_template_error("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"developer\", "
                          "\"content\": \"late\"}]}",
                          "System message must be at the beginning");
    expect_template_error("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": {\"a\": 1}}",
                          "tools: expected an array");
    expect_template_error("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"chat_template_kwargs\": "
                          "{\"enable_thinking\": \"no\"}}",
                          "chat_template_kwargs.enable_thinking: expected true or false");
    expect_template_error("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"add_generation_prompt\": 1}",
                          "add_generation_prompt: expected true or false");
    /* tool calls */
    const char *call_fmt = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
                           "\"content\": \"\", \"tool_calls\": %s}]}";
    static const struct {
        const char *tool_calls, *message;
    } calls[] = {
        {"[{\"function\": {\"name\": \"f\", \"arguments\": \"[1, 2]\"}}]", "tool_calls[0].arguments: expected a JSON object"},
        {"[{\"function\": {\"name\": \"f\", \"arguments\": \"{\\\"a\\\": \"}}]", "tool_calls[0].arguments: not valid JSON"},
        {"[{\"function\": {\"name\": \"f\", \"arguments\": \"\\\"text\\\"\"}}]", "expected a JSON object"},
        {"[{\"function\": {\"name\": \"f\", \"arguments\": 3}}]", "expected a JSON object"},
        {"[{\"function\": {\"name\": \"f\", \"arguments\": [1]}}]", "expected a JSON object"},
        {"[{\"function\": {\"name\": \"f\", \"arguments\": {}}}, {\"function\": {\"arguments\": {}}}]",
         "tool_calls[1]: the function needs a string \"name\""},
        {"[{\"function\": {\"name\": 7}}]", "string \"name\""},
        {"[{\"function\": null}]", "tool_calls[0].function: expected an object"},
        {"[\"f\"]", "tool_calls[0]: expected an object"},
        {"{\"function\": {\"name\": \"f\"}}", "tool_calls: expected an array"},
    };
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        char request[512];
        snprintf(request, sizeof request, call_fmt, calls[i].tool_calls);
        expect_template_error(request, calls[i].message);
    }
}

static void test_template_options_override_request(void **state)
{
    (void)state;
    const char *request = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", "
                          "\"content\": \"Yo\", \"reasoning_content\": \"greet\"}, {\"role\": \"user\", \"content\": "
                          "\"Bye\"}], \"chat_template_kwargs\": {\"enable_thinking\": true}}";
    lily_chat_options opts;
    lily_chat_options_init(&opts);
    opts.enable_thinking = 0;
    opts.preserve_thinking = 1;
    char *out = NULL;
    lily_error err = {0};
    assert_int_equal(render_text(request, &opts, &out, &err), LILY_OK);
    assert_string_equal(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\ngreet\n</think>\n\nYo"
                             "<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    free(out);
    opts.add_generation_prompt = 0;
    opts.preserve_thinking = -1;
    assert_int_equal(render_text(request, &opts, &out, &err), LILY_OK);
    assert_string_equal(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n<|im_start|>user\n"
                             "Bye<|im_end|>\n");
    free(out);
    /* a bare messages array is a request with defaults; null kwargs mean defaults too */
    assert_int_equal(render_text("[{\"role\": \"user\", \"content\": \"Hi\"}]", NULL, &out, &err), LILY_OK);
    assert_string_equal(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n");
    free(out);
    assert_int_equal(render_text("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"tools\": null, "
                                 "\"chat_template_kwargs\": {\"enable_thinking\": null}}",
                                 NULL, &out, &err),
                     LILY_OK);
    assert_string_equal(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n");
    free(out);
}

/* fold_system (lily serve): a system / developer message anywhere renders as the template renders one leading
 * system message holding the stripped texts in order, joined by a blank line (the reference: the template's
 * own rendering of that request, byte exact against transformers above). An error still names the index sent. */
static void test_template_fold_system_matches_one_leading_system_message(void **state)
{
    (void)state;
    static const struct {
        const char *request, *reference;
    } cases[] = {
        {"{\"messages\": [{\"role\": \"developer\", \"content\": \" A \"}, {\"role\": \"user\", \"content\": \"hi\"}, "
         "{\"role\": \"assistant\", \"content\": \"ok\"}, {\"role\": \"system\", \"content\": [{\"type\": \"text\", "
         "\"text\": \"B\\n\"}]}, {\"role\": \"user\", \"content\": \"go\"}, {\"role\": \"developer\", \"content\": \"C\"}]}",
         "{\"messages\": [{\"role\": \"system\", \"content\": \"A\\n\\nB\\n\\nC\"}, {\"role\": \"user\", \"content\": "
         "\"hi\"}, {\"role\": \"assistant\", \"content\": \"ok\"}, {\"role\": \"user\", \"content\": \"go\"}]}"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"system\", \"content\": \"B\"}], "
         "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}",
         "{\"messages\": [{\"role\": \"system\", \"content\": \"B\"}, {\"role\": \"user\", \"content\": \"hi\"}], "
         "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}"},
        {"{\"messages\": [{\"role\": \"system\", \"content\": \"A\"}, {\"role\": \"user\", \"content\": \"hi\"}, "
         "{\"role\": \"system\", \"content\": \" \"}]}",
         "{\"messages\": [{\"role\": \"system\", \"content\": \"A\"}, {\"role\": \"user\", \"content\": \"hi\"}]}"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"system\", \"content\": \"\"}]}",
         "{\"messages\": [{\"role\": \"system\", \"content\": \"\"}, {\"role\": \"user\", \"content\": \"hi\"}]}"},
        /* a system message between two tool results: still one user turn holding both (as folded, the loop's
         * previtem / nextitem of a tool message skip it) */
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"\", "
         "\"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {}}}]}, {\"role\": \"tool\", \"content\": "
         "\"r1\"}, {\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"tool\", \"content\": \"r2\"}, {\"role\": "
         "\"developer\", \"content\": \"D\"}]}",
         "{\"messages\": [{\"role\": \"system\", \"content\": \"S\\n\\nD\"}, {\"role\": \"user\", \"content\": \"q\"}, "
         "{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": "
         "{}}}]}, {\"role\": \"tool\", \"content\": \"r1\"}, {\"role\": \"tool\", \"content\": \"r2\"}]}"},
        /* a tool result first: the folded system message is its previtem, so it opens a user turn */
        {"{\"messages\": [{\"role\": \"tool\", \"content\": \"r\"}, {\"role\": \"user\", \"content\": \"q\"}, "
         "{\"role\": \"system\", \"content\": \"S\"}]}",
         "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"tool\", \"content\": \"r\"}, "
         "{\"role\": \"user\", \"content\": \"q\"}]}"},
    };
    lily_chat_options fold;
    lily_chat_options_init(&fold);
    fold.fold_system = 1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = NULL, *want = NULL;
        lily_error err = {0};
        if (render_text(cases[i].request, &fold, &got, &err) != LILY_OK)
            fail_msg("case %zu rejected: %s", i, err.message);
        assert_int_equal(render_text(cases[i].reference, NULL, &want, &err), LILY_OK);
        if (strcmp(got, want))
            fail_msg("case %zu:\n got  %s\n want %s", i, got, want);
        free(got);
        free(want);
    }
    char *out = (char *)1;
    lily_error err = {0};
    assert_int_equal(render_text("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"user\", "
                                 "\"content\": \"x\"}, {\"role\": \"system\", \"content\": [{\"type\": \"image\"}]}]}",
                                 &fold, &out, &err),
                     LILY_ERR_TEMPLATE);
    assert_null(out);
    assert_non_null(strstr(err.message, "messages[2]: System message cannot contain images"));
}

/* A tool call's arguments given as a JSON string may hold U+0000 (\u0000), as every other string of a request
 * may and as lily's own replies do: an agent sends them back unchanged. */
static void test_template_arguments_with_nul(void **state)
{
    (void)state;
    json_error_t jerr;
    json_t *request = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": "
                                 "\"assistant\", \"content\": \"\", \"tool_calls\": [{\"function\": {\"name\": \"f\", "
                                 "\"arguments\": \"{\\\"a\\\": \\\"x\\\\u0000y\\\", "
                                 "\\\"b\\\": [\\\"\\\\u0000\\\"]}\"}}]}], "
                                 "\"add_generation_prompt\": false}",
                                 0, &jerr);
    assert_non_null(request);
    char *out = NULL;
    size_t len = 0;
    lily_error err = {0};
    lily_status st = lily_chat_render_n(request, NULL, &out, &len, &err);
    json_decref(request);
    if (st != LILY_OK)
        fail_msg("rejected: %s", err.message);
    static const char want[] = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
                               "<tool_call>\n<function=f>\n<parameter=a>\nx\0y\n</parameter>\n<parameter=b>\n"
                               "[\"\\u0000\"]\n</parameter>\n</function>\n</tool_call><|im_end|>\n";
    if (len != sizeof want - 1 || memcmp(out, want, len))
        fail_msg("rendered %zu bytes: %s", len, out);
    free(out);
}

/* A tool call's arguments given as a JSON string may hold a number past int64 or the double range, as the
 * request body may (base/json_load.h): it renders as that number in the body renders, the nearest double (the
 * largest double past the range), where it was a 400 "not valid JSON" (jansson: "too big integer"). */
static void test_template_arguments_with_numbers_past_int64(void **state)
{
    (void)state;
    static const char head[] = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": "
                               "\"assistant\", \"content\": \"\", \"tool_calls\": [{\"function\": {\"name\": "
                               "\"f\", \"arguments\": ";
    static const char tail[] = "}}]}], \"add_generation_prompt\": false}";
    char as_string[512], as_object[512];
    snprintf(as_string, sizeof as_string, "%s\"{\\\"n\\\": 99999999999999999999, \\\"x\\\": -1e400}\"%s",
             head, tail);
    snprintf(as_object, sizeof as_object, "%s{\"n\": 99999999999999999999, \"x\": -1e400}%s", head, tail);
    char *out[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        const char *text = i ? as_object : as_string;
        json_error_t jerr;
        json_t *request = lily_json_loadb(text, strlen(text), 0, &jerr); /* as lily serve loads a body */
        if (!request)
            fail_msg("request %s: %s", text, jerr.text);
        lily_error err = {0};
        lily_status st = lily_chat_render(request, NULL, &out[i], &err);
        json_decref(request);
        if (st != LILY_OK)
            fail_msg("%s rejected: %s", i ? "object" : "string", err.message);
    }
    static const char want[] = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
                               "<tool_call>\n<function=f>\n<parameter=n>\n1e+20\n</parameter>\n<parameter=x>\n"
                               "-1.7976931348623157e+308\n</parameter>\n</function>\n</tool_call><|im_end|>\n";
    if (strcmp(out[0], want) || strcmp(out[1], want))
        fail_msg("arguments as a string rendered:\n%s\nas an object:\n%s", out[0], out[1]);
    free(out[0]);
    free(out[1]);
}

/* continue_final_message (vLLM's name): the final assistant message stays open, the rest renders as ever;
 * it needs add_generation_prompt false and an assistant message last. */
static void test_template_continue_final_message(void **state)
{
    (void)state;
    char *out = NULL;
    lily_error err = {0};
    assert_int_equal(render_text("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", "
                                 "\"content\": \"Yo\"}, {\"role\": \"user\", \"content\": \"Bye\"}, {\"role\": "
                                 "\"assistant\", \"content\": \" See you \"}], \"add_generation_prompt\": false, "
                                 "\"continue_final_message\": true}",
                                 NULL, &out, &err),
                     LILY_OK);
    assert_string_equal(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n<|im_start|>user\n"
                             "Bye<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nSee you");
    free(out);
    expect_template_error("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", "
                          "\"content\": \"Yo\"}], \"continue_final_message\": true}",
                          "continue_final_message and add_generation_prompt cannot both be true");
    expect_template_error("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"add_generation_prompt\": false, "
                          "\"continue_final_message\": true}",
                          "messages[0]: continue_final_message: the last message must be the assistant's");
    expect_template_error("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"continue_final_message\": 1}",
                          "continue_final_message: expected true or false");
}

static void test_py_float_repr_matches_python(void **state)
{
    (void)state;
    static const struct {
        const char *hex, *repr;
    } cases[] = {
        {"0x1.999999999999ap-4", "0.1"},
        {"0x1.3333333333334p-2", "0.30000000000000004"},
        {"0x1.5555555555555p-2", "0.3333333333333333"},
        {"0x1.5555555555555p-1", "0.6666666666666666"},
        {"0x1.1c37937e08000p+53", "1e+16"},
        {"0x1.c6bf526340000p+49", "1000000000000000.0"},
        {"0x1.1c37937e07fffp+53", "9999999999999998.0"},
        {"0x1.a36e2eb1c432dp-14", "0.0001"},
        {"0x1.4f8b588e368f1p-17", "1e-05"},
        {"0x0.0000000000001p-1022", "5e-324"},
        {"0x1.fffffffffffffp+1023", "1.7976931348623157e+308"},
        {"0x1.0000000000000p-1022", "2.2250738585072014e-308"},
        {"0x1.b69b4ba630f35p+56", "1.2345678901234568e+17"},
        {"0x1.01f31f46ed246p-13", "0.000123"},
        {"0x1.8000000000000p+0", "1.5"},
        {"0x1.9000000000000p+6", "100.0"},
        {"-0x1.0c6f7a0b5ed8dp-22", "-2.5e-07"},
        {"0x1.1666666666666p+2", "4.35"},
        {"0x1.0f0cf064dd592p+73", "1e+22"},
        {"0x1.52d02c7e14af6p+76", "1e+23"},
        {"0x1.81cd6c8b43958p+13", "12345.678"},
        {"0x1.9d37952e6b438p-53", "1.7920435971799646e-16"},
        {"0x1.4c9c3269e0d37p-619", "5.972115650501124e-187"},
        {"0x1.71ff4a6a3a450p-974", "9.051962159641863e-294"},
        {"0x1.fc209128b2f33p-183", "1.6189867119270557e-55"},
        {"0x1.63a04892f902bp-927", "1.2244687060864793e-279"},
        {"0x1.c66175d9dc9f8p-427", "5.1212003529189705e-129"},
        {"0x1.897650ed90475p-92", "3.1038692546051638e-28"},
        {"0x1.d9d7381e74ef5p-804", "1.7349057328378597e-242"},
        {"0x1.028d6099950d8p-935", "3.47746221006508e-282"},
        {"0x1.355266f03675ap-595", "9.318011888364065e-180"},
    };
    char buf[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lily_py_float_repr(strtod(cases[i].hex, NULL), buf, sizeof buf);
        assert_string_equal(buf, cases[i].repr);
    }
    lily_py_float_repr(-0.0, buf, sizeof buf);
    assert_string_equal(buf, "-0.0");
    lily_py_float_repr(INFINITY, buf, sizeof buf);
    assert_string_equal(buf, "Infinity");
    /* a whole value: json.dumps({"a": [1, 2.0, "\u00e9\n"], "b": {}}, ensure_ascii=False) */
    json_t *v = json_loads("{\"a\": [1, 2.0, \"\\u00e9\\n\\u0007\"], \"b\": {}, \"c\": null}", 0, NULL);
    char *s = lily_py_json_dumps(v);
    assert_string_equal(s, "{\"a\": [1, 2.0, \"\xc3\xa9\\n\\u0007\"], \"b\": {}, \"c\": null}");
    free(s);
    json_decref(v);
}

static void test_sha256_fips_vectors(void **state)
{
    (void)state;
    char hex[65];
    lily_sha256_hex("", 0, hex);
    assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    lily_sha256_hex("abc", 3, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    lily_sha256_hex(two_blocks, strlen(two_blocks), hex);
    assert_string_equal(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    size_t len;
    char *text = test_read_file(test_data_path("tokenizers/qwen35/chat_template.jinja"), &len);
    assert_non_null(text);
    assert_int_equal(len, 7764);
    lily_sha256_hex(text, len, hex);
    assert_string_equal(hex, LILY_CHAT_TEMPLATE_KNOWN_SHA256);
    free(text);
}

static void write_file(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

static void test_template_check_model_directory(void **state)
{
    (void)state;
    char dir[] = "/tmp/lily_chat_template_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char jinja[256], config[256], sha[65];
    snprintf(jinja, sizeof jinja, "%s/chat_template.jinja", dir);
    snprintf(config, sizeof config, "%s/tokenizer_config.json", dir);
    lily_chat_template_match match;
    lily_error err = {0};

    assert_int_equal(lily_chat_template_check(dir, &match, sha, &err), LILY_OK);
    assert_int_equal(match, LILY_CHAT_TEMPLATE_MISSING);

    size_t len;
    char *text = test_read_file(test_data_path("tokenizers/qwen35/chat_template.jinja"), &len);
    assert_non_null(text);
    /* tokenizer_config.json's string, with a trailing newline that does not count */
    json_t *cfg = json_object();
    char *with_newline = malloc(len + 2);
    memcpy(with_newline, text, len);
    memcpy(with_newline + len, "\n", 2);
    json_object_set_new(cfg, "chat_template", json_string(with_newline));
    assert_int_equal(json_dump_file(cfg, config, 0), 0);
    assert_int_equal(lily_chat_template_check(dir, &match, sha, &err), LILY_OK);
    assert_int_equal(match, LILY_CHAT_TEMPLATE_KNOWN);
    assert_string_equal(sha, LILY_CHAT_TEMPLATE_KNOWN_SHA256);

    /* chat_template.jinja takes precedence; one changed byte makes it different */
    text[100] ^= 1;
    write_file(jinja, text, len);
    assert_int_equal(lily_chat_template_check(dir, &match, sha, &err), LILY_OK);
    assert_int_equal(match, LILY_CHAT_TEMPLATE_DIFFERENT);
    text[100] ^= 1;
    write_file(jinja, text, len);
    assert_int_equal(lily_chat_template_check(dir, &match, NULL, &err), LILY_OK);
    assert_int_equal(match, LILY_CHAT_TEMPLATE_KNOWN);
    unlink(jinja);

    /* the list form: [{"name": "default", "template": ...}] */
    json_t *list = json_array();
    json_t *entry = json_object();
    json_object_set_new(entry, "name", json_string("tool_use"));
    json_object_set_new(entry, "template", json_string("{{ x }}"));
    json_array_append_new(list, entry);
    entry = json_object();
    json_object_set_new(entry, "name", json_string("default"));
    json_object_set_new(entry, "template", json_string(text));
    json_array_append_new(list, entry);
    json_object_set_new(cfg, "chat_template", list);
    assert_int_equal(json_dump_file(cfg, config, 0), 0);
    assert_int_equal(lily_chat_template_check(dir, &match, sha, &err), LILY_OK);
    assert_int_equal(match, LILY_CHAT_TEMPLATE_KNOWN);

    write_file(config, "{not json", 9);
    assert_int_equal(lily_chat_template_check(dir, &match, sha, &err), LILY_ERR_FORMAT);
    unlink(config);
    rmdir(dir);
    assert_int_equal(lily_chat_template_check(dir, &match, sha, &err), LILY_ERR_IO);

    json_decref(cfg);
    free(with_newline);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_template_hf_examples_byte_exact),
        cmocka_unit_test(test_template_generated_cases_byte_exact),
        cmocka_unit_test(test_template_random_cases_byte_exact),
        cmocka_unit_test(test_template_rejects_bad_requests),
        cmocka_unit_test(test_template_options_override_request),
        cmocka_unit_test(test_template_fold_system_matches_one_leading_system_message),
        cmocka_unit_test(test_template_continue_final_message),
        cmocka_unit_test(test_template_arguments_with_nul),
        cmocka_unit_test(test_template_arguments_with_numbers_past_int64),
        cmocka_unit_test(test_py_float_repr_matches_python),
        cmocka_unit_test(test_sha256_fips_vectors),
        cmocka_unit_test(test_template_check_model_directory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
