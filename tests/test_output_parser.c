/* test_output_parser.c — reasoning / content / Qwen XML tool calls, the required cases verbatim,
 * and incremental == whole: every case is also parsed one byte at a time, split in two at every point,
 * and split at random, and must give the same result and the same concatenated deltas. */
#include "test_support.h"

#include <stdlib.h>
#include <string.h>

#include "base/json_load.h"
#include "runtime/sampler.h" /* lily_rng for random splits */
#include "text/output_parser.h"

/* ---- a case and how to check it -------------------------------------------------------------------- */

typedef struct {
    const char *text;
    bool thinking;
    const char *tools;     /* JSON tools array, or NULL */
    bool cut_by_length;
    bool cut_by_stop;      /* finished by lily_output_parser_finish_stopped: a stop string ended the text */
    const char *reasoning;
    const char *content;
    int n_calls;
    const char *names[4];
    const char *arguments[4];
    const char *finish_reason;
    bool verbatim_answer;  /* options.verbatim_answer: think tags may reach content as the answer's text */
} parse_case;

/* What one parse produced: the final result, copied, and the concatenation of its deltas. */
typedef struct {
    char *reasoning, *content, *delta_reasoning, *delta_content;
    int n_calls, n_started, n_ended;
    char *names[8], *arguments[8], *delta_names[8], *delta_arguments[8];
    char *finish_reason;
    char *choice_json;
} outcome;

static void append(char **dst, const char *s, size_t n)
{
    size_t old = *dst ? strlen(*dst) : 0;
    char *d = realloc(*dst, old + n + 1);
    assert_non_null(d);
    memcpy(d + old, s, n);
    d[old + n] = '\0';
    *dst = d;
}

static void on_event(void *user, const lily_output_event *ev)
{
    outcome *o = user;
    assert_int_equal(strlen(ev->text), ev->len);
    switch (ev->kind) {
    case LILY_OUTPUT_REASONING:
        assert_true(ev->len > 0);
        append(&o->delta_reasoning, ev->text, ev->len);
        break;
    case LILY_OUTPUT_CONTENT:
        assert_true(ev->len > 0);
        append(&o->delta_content, ev->text, ev->len);
        break;
    case LILY_OUTPUT_TOOL_CALL_START:
        assert_int_equal(ev->tool_index, o->n_started);
        assert_int_equal(o->n_ended, o->n_started);
        append(&o->delta_names[o->n_started++], ev->text, ev->len);
        append(&o->delta_arguments[ev->tool_index], "", 0);
        break;
    case LILY_OUTPUT_TOOL_ARGUMENTS:
        assert_int_equal(ev->tool_index, o->n_started - 1);
        assert_int_equal(o->n_ended, o->n_started - 1);
        append(&o->delta_arguments[ev->tool_index], ev->text, ev->len);
        break;
    case LILY_OUTPUT_TOOL_CALL_END:
        assert_int_equal(ev->tool_index, o->n_ended);
        o->n_ended++;
        break;
    }
}

static char *or_empty(char *s) { return s ? s : strdup(""); }

/* Parse c->text fed in pieces[] (0-terminated list of lengths; NULL = all at once). */
static outcome parse(const parse_case *c, const size_t *pieces)
{
    outcome o = {0};
    json_t *tools = NULL;
    if (c->tools) {
        json_error_t jerr;
        tools = json_loads(c->tools, 0, &jerr);
        if (!tools)
            fail_msg("bad tools JSON in test: %s", jerr.text);
    }
    lily_output_parser_options opts = {.thinking = c->thinking, .tools = tools, .verbatim_answer = c->verbatim_answer,
                                       .on_event = on_event, .user = &o};
    lily_output_parser *p = NULL;
    lily_error err = {0};
    assert_int_equal(lily_output_parser_new(&opts, &p, &err), LILY_OK);
    json_decref(tools); /* the parser holds its own reference */
    size_t n = strlen(c->text), at = 0;
    for (int i = 0; at < n; i++) {
        size_t k = pieces && pieces[i] ? pieces[i] : n - at;
        if (k > n - at)
            k = n - at;
        assert_int_equal(lily_output_parser_feed(p, c->text + at, k, &err), LILY_OK);
        at += k;
    }
    assert_int_equal(c->cut_by_stop ? lily_output_parser_finish_stopped(p, &err)
                                    : lily_output_parser_finish(p, c->cut_by_length, &err),
                     LILY_OK);
    assert_int_equal(lily_output_parser_feed(p, "x", 1, &err), LILY_ERR_INVALID_ARGUMENT);
    const lily_parsed_output *r = lily_output_parser_result(p);
    assert_true(r->finished);
    o.reasoning = strdup(r->reasoning);
    o.content = strdup(r->content);
    o.n_calls = r->n_tool_calls;
    for (int i = 0; i < r->n_tool_calls && i < 8; i++) {
        o.names[i] = strdup(r->tool_calls[i].name);
        o.arguments[i] = strdup(r->tool_calls[i].arguments);
    }
    o.finish_reason = strdup(lily_output_finish_reason(r));
    json_t *choice = lily_output_choice_json(r, "call_");
    assert_non_null(choice);
    o.choice_json = json_dumps(choice, JSON_COMPACT);
    json_decref(choice);
    lily_output_parser_free(p);
    o.delta_reasoning = or_empty(o.delta_reasoning);
    o.delta_content = or_empty(o.delta_content);
    return o;
}

static void free_outcome(outcome *o)
{
    free(o->reasoning);
    free(o->content);
    free(o->delta_reasoning);
    free(o->delta_content);
    for (int i = 0; i < 8; i++) {
        free(o->names[i]);
        free(o->arguments[i]);
        free(o->delta_names[i]);
        free(o->delta_arguments[i]);
    }
    free(o->finish_reason);
    free(o->choice_json);
}

#define CHECK_STR(what, got, want, how)                                                                    \
    do {                                                                                                    \
        if (strcmp((got), (want)))                                                                          \
            fail_msg("%s (%s):\n  got      '%s'\n  expected '%s'\n  text '%s'", what, how, got, want, c->text); \
    } while (0)

/* The outcome must match the case's expectations, and its deltas the final result. */
static void check_outcome(const parse_case *c, const outcome *o, const char *how)
{
    CHECK_STR("reasoning", o->reasoning, c->reasoning, how);
    CHECK_STR("content", o->content, c->content, how);
    CHECK_STR("reasoning deltas", o->delta_reasoning, c->reasoning, how);
    CHECK_STR("content deltas", o->delta_content, c->content, how);
    if (o->n_calls != c->n_calls || o->n_started != c->n_calls || o->n_ended != c->n_calls)
        fail_msg("%s: %d calls (%d started, %d ended), expected %d; text '%s'", how, o->n_calls, o->n_started,
                 o->n_ended, c->n_calls, c->text);
    for (int i = 0; i < c->n_calls; i++) {
        CHECK_STR("tool name", o->names[i], c->names[i], how);
        CHECK_STR("tool name delta", o->delta_names[i], c->names[i], how);
        CHECK_STR("arguments", o->arguments[i], c->arguments[i], how);
        CHECK_STR("argument deltas", o->delta_arguments[i], c->arguments[i], how);
        json_error_t jerr;
        /* lily serve's loader: an integer past int64 is JSON, as a client's (Python's json) reads it */
        json_t *args = lily_json_loadb(o->arguments[i], strlen(o->arguments[i]), JSON_ALLOW_NUL, &jerr);
        if (!json_is_object(args))
            fail_msg("arguments '%s' are not a JSON object: %s", o->arguments[i], jerr.text);
        json_decref(args);
    }
    CHECK_STR("finish_reason", o->finish_reason, c->finish_reason, how);
    for (const char *s = o->content; *s && !c->verbatim_answer; s++) /* no think tag ever reaches content */
        assert_false(!strncmp(s, "<think>", 7) || !strncmp(s, "</think>", 8));
}

/* Whole, one byte at a time, every split in two, and random splits: all must agree with the case. */
static void check_case(const parse_case *c)
{
    const size_t n = strlen(c->text);
    outcome whole = parse(c, NULL);
    check_outcome(c, &whole, "whole");
    size_t *pieces = calloc(n + 2, sizeof *pieces);
    for (size_t i = 0; i < n; i++)
        pieces[i] = 1;
    outcome o = parse(c, pieces);
    check_outcome(c, &o, "1 byte at a time");
    assert_string_equal(o.choice_json, whole.choice_json);
    free_outcome(&o);
    for (size_t k = 1; k < n; k++) {
        size_t two[3] = {k, n - k, 0};
        o = parse(c, two);
        char how[64];
        snprintf(how, sizeof how, "split at %zu", k);
        check_outcome(c, &o, how);
        free_outcome(&o);
    }
    lily_rng r;
    lily_rng_seed(&r, n);
    for (int t = 0; t < 20; t++) {
        size_t at = 0, i = 0;
        while (at < n) {
            pieces[i] = 1 + lily_rng_next(&r) % 9;
            at += pieces[i++];
        }
        pieces[i] = 0;
        o = parse(c, pieces);
        check_outcome(c, &o, "random split");
        free_outcome(&o);
    }
    free(pieces);
    free_outcome(&whole);
}

/* ---- the five cases the issue requires ------------------------------------------------------------ */

static void test_parameter_name_ending_at_newline(void **state)
{
    (void)state;
    const parse_case c = {
        .text = "<tool_call>\n<function=get_weather>\n<parameter=city\nParis\n</parameter>\n<parameter=unit>\n"
                "celsius\n</parameter>\n</function>\n</tool_call>",
        .reasoning = "",
        .content = "",
        .n_calls = 1,
        .names = {"get_weather"},
        .arguments = {"{\"city\":\"Paris\",\"unit\":\"celsius\"}"},
        .finish_reason = "tool_calls",
    };
    check_case(&c);
}

static void test_html_value_without_closing_parameter_kept_verbatim(void **state)
{
    (void)state;
    const parse_case c = {
        .text = "<tool_call>\n<function=write_file>\n<parameter=path>\nindex.html\n</parameter>\n"
                "<parameter=content>\n<div class=\"a\">x < y && y > z</div>\n</function>\n</tool_call>",
        .reasoning = "",
        .content = "",
        .n_calls = 1,
        .names = {"write_file"},
        .arguments = {"{\"path\":\"index.html\",\"content\":\"<div class=\\\"a\\\">x < y && y > z</div>\"}"},
        .finish_reason = "tool_calls",
    };
    check_case(&c);
    /* the same with </function> directly after the value, no newline */
    const parse_case d = {
        .text = "<tool_call>\n<function=write_file>\n<parameter=content>\n<div class=\"a\">x < y && y > z</div>"
                "</function>\n</tool_call>",
        .reasoning = "",
        .content = "",
        .n_calls = 1,
        .names = {"write_file"},
        .arguments = {"{\"content\":\"<div class=\\\"a\\\">x < y && y > z</div>\"}"},
        .finish_reason = "tool_calls",
    };
    check_case(&d);
}

static void test_reasoning_then_tool_call_without_closing_think(void **state)
{
    (void)state;
    const parse_case c = {
        .text = "I should open the file first.\n<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/main.c\n"
                "</parameter>\n</function>\n</tool_call>",
        .thinking = true,
        .reasoning = "I should open the file first.",
        .content = "",
        .n_calls = 1,
        .names = {"read_file"},
        .arguments = {"{\"path\":\"src/main.c\"}"},
        .finish_reason = "tool_calls",
    };
    check_case(&c);
    outcome o = parse(&c, NULL);
    assert_string_equal(o.choice_json,
                        "{\"message\":{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"I should open "
                        "the file first.\",\"tool_calls\":[{\"id\":\"call_0\",\"type\":\"function\",\"function\":{"
                        "\"name\":\"read_file\",\"arguments\":\"{\\\"path\\\":\\\"src/main.c\\\"}\"}}]},"
                        "\"finish_reason\":\"tool_calls\"}");
    free_outcome(&o);
}

static void test_thinking_cut_by_length_is_all_reasoning(void **state)
{
    (void)state;
    const parse_case c = {
        .text = "The user wants a haiku about rain.\nFirst line: five syllables, maybe \"soft rain on the",
        .thinking = true,
        .cut_by_length = true,
        .reasoning = "The user wants a haiku about rain.\nFirst line: five syllables, maybe \"soft rain on the",
        .content = "",
        .n_calls = 0,
        .finish_reason = "length",
    };
    check_case(&c);
    /* cut right inside a closing tag: the partial tag is reasoning text, content still empty */
    const parse_case d = {
        .text = "Almost done.\n</thi",
        .thinking = true,
        .cut_by_length = true,
        .reasoning = "Almost done.\n</thi",
        .content = "",
        .finish_reason = "length",
    };
    check_case(&d);
}

/* A reply cut by max_tokens inside the "</tool_call>" after a complete call: the partial tag is not content,
 * for every cut point. */
static void test_cut_inside_tool_call_close(void **state)
{
    (void)state;
    static const char head[] = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                               "</function>\n";
    static const char close[] = "</tool_call>";
    for (size_t k = 1; k < sizeof close - 1; k++) {
        char text[256];
        snprintf(text, sizeof text, "%s%.*s", head, (int)k, close);
        const parse_case c = {
            .text = text,
            .cut_by_length = true,
            .reasoning = "",
            .content = "",
            .n_calls = 1,
            .names = {"get_weather"},
            .arguments = {"{\"city\":\"Paris\"}"},
            .finish_reason = "length",
        };
        check_case(&c);
    }
}

static void test_thinking_off_no_think_tags_reach_content(void **state)
{
    (void)state;
    const parse_case cases[] = {
        {.text = "Hello! How can I help?", .content = "Hello! How can I help?", .reasoning = "", .finish_reason = "stop"},
        /* the model opens a think block anyway: it becomes reasoning, the tags vanish */
        {.text = "<think>\nLet me see.\n</think>\n\nParis is the capital.",
         .reasoning = "Let me see.",
         .content = "Paris is the capital.",
         .finish_reason = "stop"},
        {.text = "<think>\n\n</think>\n\nHi.", .reasoning = "", .content = "Hi.", .finish_reason = "stop"},
        /* stray tags */
        {.text = "A</think> B<think>C</think>D", .reasoning = "C", .content = "A BD", .finish_reason = "stop"},
        {.text = "</think></think>ok", .reasoning = "", .content = "ok", .finish_reason = "stop"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(&cases[i]);
}

/* ---- more of what real output does ---------------------------------------------------------------- */

static void test_reasoning_content_and_two_calls(void **state)
{
    (void)state;
    const parse_case c = {
        .text = "<think>\nTwo cities.\n</think>\n\nLet me check both.\n\n<tool_call>\n<function=get_weather>\n"
                "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
                "<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>",
        .thinking = true,
        .reasoning = "Two cities.",
        .content = "Let me check both.",
        .n_calls = 2,
        .names = {"get_weather", "get_weather"},
        .arguments = {"{\"city\":\"Paris\"}", "{\"city\":\"Oslo\"}"},
        .finish_reason = "tool_calls",
    };
    check_case(&c);
}

/* A constrained answer (response_format's JSON: options.verbatim_answer) is content as written from its first
 * byte: a key or string value holding a tag ("</think>", "<tool_call>", "<function=") is text of the JSON,
 * not structure (without the option "{"</think>":1}" lost its key and "{"<tool_call>":1}" became a call).
 * Before the answer a tool call still opens (response_format beside tools under tool_choice auto), and
 * after a call the tags are read again (the call's text is not the constrained answer). */
static void test_verbatim_answer_keeps_tags_as_text(void **state)
{
    (void)state;
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                        "\"properties\":{\"x\":{\"type\":\"integer\"}}}}}]";
    const parse_case cases[] = {
        {.text = "{\"</think>\":\"<tool_call>\\n<function=f>\\n</tool_call>\",\"<think>\":[\"<function=g>\"]}",
         .verbatim_answer = true, .reasoning = "",
         .content = "{\"</think>\":\"<tool_call>\\n<function=f>\\n</tool_call>\",\"<think>\":[\"<function=g>\"]}",
         .finish_reason = "stop"},
        {.text = "Plan it.</think>\n\n{\"a\":\"</think><tool_call>\"}", .thinking = true, .verbatim_answer = true,
         .reasoning = "Plan it.", .content = "{\"a\":\"</think><tool_call>\"}", .finish_reason = "stop"},
        {.text = "\n<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
         .verbatim_answer = true, .tools = tools, .reasoning = "", .content = "", .n_calls = 1, .names = {"f"},
         .arguments = {"{\"x\":1}"}, .finish_reason = "tool_calls"},
        {.text = "<tool_call>\n<function=f>\n</function>\n</tool_call>\nok<tool_call>\n<function=f>\n</function>\n"
                 "</tool_call>",
         .verbatim_answer = true, .tools = tools, .reasoning = "", .content = "ok", .n_calls = 2, .names = {"f", "f"},
         .arguments = {"{}", "{}"}, .finish_reason = "tool_calls"},
        /* the same text as the first case without the option: its tags are structure */
        {.text = "{\"</think>\":1}", .reasoning = "", .content = "{\"\":1}", .finish_reason = "stop"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(&cases[i]);
}

static void test_tolerates_missing_closing_tags_and_stray_whitespace(void **state)
{
    (void)state;
    const parse_case cases[] = {
        /* no </tool_call> at the end of the sequence */
        {.text = "<tool_call>\n<function=ls>\n<parameter=dir>\n/tmp\n</parameter>\n</function>\n",
         .reasoning = "", .content = "", .n_calls = 1, .names = {"ls"}, .arguments = {"{\"dir\":\"/tmp\"}"},
         .finish_reason = "tool_calls"},
        /* no </parameter>, </function>, </tool_call> */
        {.text = "<tool_call>\n<function=ls>\n<parameter=dir>\n/tmp\n", .reasoning = "", .content = "",
         .n_calls = 1, .names = {"ls"}, .arguments = {"{\"dir\":\"/tmp\"}"}, .finish_reason = "tool_calls"},
        /* missing </parameter> before the next parameter */
        {.text = "<tool_call>\n<function=f>\n<parameter=a>\n1\n<parameter=b>\n2\n</parameter>\n</function>\n</tool_call>",
         .reasoning = "", .content = "", .n_calls = 1, .names = {"f"}, .arguments = {"{\"a\":\"1\",\"b\":\"2\"}"},
         .finish_reason = "tool_calls"},
        /* stray whitespace everywhere, names trimmed */
        {.text = "  <tool_call>  \n <function= get_weather >\n  <parameter= city >\nParis\n</parameter>\n  </function>  \n</tool_call>  \n",
         .reasoning = "", .content = "", .n_calls = 1, .names = {"get_weather"},
         .arguments = {"{\"city\":\"Paris\"}"}, .finish_reason = "tool_calls"},
        /* function name ending at a newline, no parameters */
        {.text = "<tool_call>\n<function=list_files\n</function>\n</tool_call>", .reasoning = "", .content = "",
         .n_calls = 1, .names = {"list_files"}, .arguments = {"{}"}, .finish_reason = "tool_calls"},
        /* a bare <function= block without <tool_call> */
        {.text = "Sure.\n<function=ls>\n<parameter=dir>\n.\n</parameter>\n</function>", .reasoning = "",
         .content = "Sure.", .n_calls = 1, .names = {"ls"}, .arguments = {"{\"dir\":\".\"}"},
         .finish_reason = "tool_calls"},
        /* cut inside the function name by max tokens: no call (the name may be a prefix of the real one, a
         * tool that does not exist), no markup in content; the finish reason says it was cut */
        {.text = "<tool_call>\n<function=get_wea", .cut_by_length = true, .reasoning = "", .content = "",
         .finish_reason = "length"},
        {.text = "Let me check.\n<tool_call>\n<function=get_weather", .cut_by_length = true, .reasoning = "",
         .content = "Let me check.", .finish_reason = "length"},
        /* ... after a whole call: that one is kept */
        {.text = "<tool_call>\n<function=f>\n</function>\n</tool_call>\n<tool_call>\n<function=g", .cut_by_length = true,
         .reasoning = "", .content = "", .n_calls = 1, .names = {"f"}, .arguments = {"{}"}, .finish_reason = "length"},
        /* a name the model ended its reply in (a stop token, not the cut) is closed as written */
        {.text = "<tool_call>\n<function=list_files", .reasoning = "", .content = "", .n_calls = 1,
         .names = {"list_files"}, .arguments = {"{}"}, .finish_reason = "tool_calls"},
        /* cut once the name ended: the call is kept, its arguments as far as they got */
        {.text = "<tool_call>\n<function=get_weather>", .cut_by_length = true, .reasoning = "", .content = "",
         .n_calls = 1, .names = {"get_weather"}, .arguments = {"{}"}, .finish_reason = "length"},
        /* cut inside a parameter name: that argument is dropped (its key may be a prefix), the ones before kept */
        {.text = "<tool_call>\n<function=f>\n<parameter=ci", .cut_by_length = true, .reasoning = "", .content = "",
         .n_calls = 1, .names = {"f"}, .arguments = {"{}"}, .finish_reason = "length"},
        {.text = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=ci", .cut_by_length = true,
         .reasoning = "", .content = "", .n_calls = 1, .names = {"f"}, .arguments = {"{\"a\":\"1\"}"},
         .finish_reason = "length"},
        /* a stop string that cut the text is a cut too: a function or parameter name it ended in is dropped
         * (the chat route reported a call to "get_wea"); a name it ended after is kept */
        {.text = "<tool_call>\n<function=get_wea", .cut_by_stop = true, .reasoning = "", .content = "",
         .finish_reason = "stop"},
        {.text = "<tool_call>\n<function=f>\n<parameter=ci", .cut_by_stop = true, .reasoning = "", .content = "",
         .n_calls = 1, .names = {"f"}, .arguments = {"{}"}, .finish_reason = "tool_calls"},
        {.text = "<tool_call>\n<function=get_weather>", .cut_by_stop = true, .reasoning = "", .content = "",
         .n_calls = 1, .names = {"get_weather"}, .arguments = {"{}"}, .finish_reason = "tool_calls"},
        /* a stop string inside the tags, a value, after the second call's name, or in a JSON call */
        {.text = "<tool_call>\n<func", .cut_by_stop = true, .reasoning = "", .content = "", .finish_reason = "stop"},
        {.text = "<tool_call>\n<function=", .cut_by_stop = true, .reasoning = "", .content = "",
         .finish_reason = "stop"},
        {.text = "<tool_call>\n<function=f>\n<parameter=a>\nhel", .cut_by_stop = true, .reasoning = "",
         .content = "", .n_calls = 1, .names = {"f"}, .arguments = {"{\"a\":\"hel\"}"}, .finish_reason = "tool_calls"},
        {.text = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
                 "<function=g", .cut_by_stop = true, .reasoning = "", .content = "", .n_calls = 1, .names = {"f"},
         .arguments = {"{\"a\":\"1\"}"}, .finish_reason = "tool_calls"},
        {.text = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=b", .cut_by_stop = true,
         .reasoning = "", .content = "", .n_calls = 1, .names = {"f"}, .arguments = {"{\"a\":\"1\"}"},
         .finish_reason = "tool_calls"},
        {.text = "<tool_call>\n<function=f\n", .cut_by_stop = true, .reasoning = "", .content = "", .n_calls = 1,
         .names = {"f"}, .arguments = {"{}"}, .finish_reason = "tool_calls"},
        /* an empty tool_call block is no call */
        {.text = "<tool_call>\n</tool_call>\nDone.", .reasoning = "", .content = "Done.", .finish_reason = "stop"},
        /* text after </function> without </tool_call> is content */
        {.text = "<tool_call>\n<function=f>\n</function>\nAll set.", .reasoning = "", .content = "All set.",
         .n_calls = 1, .names = {"f"}, .arguments = {"{}"}, .finish_reason = "tool_calls"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(&cases[i]);
}

static void test_values_keep_text_exactly(void **state)
{
    (void)state;
    const parse_case cases[] = {
        /* one leading and one trailing newline go; inner and extra newlines stay */
        {.text = "<tool_call>\n<function=w>\n<parameter=body>\n\nline1\n\tline2 \"q\" \\ end\n\n</parameter>\n"
                 "</function>\n</tool_call>",
         .reasoning = "", .content = "", .n_calls = 1, .names = {"w"},
         .arguments = {"{\"body\":\"\\nline1\\n\\tline2 \\\"q\\\" \\\\ end\\n\"}"}, .finish_reason = "tool_calls"},
        /* UTF-8 and a value that looks like tags but is not one of ours */
        {.text = "<tool_call>\n<function=say>\n<parameter=text>\nhéllo 世界 <b>bold</b> <tool_call> <parameter\n"
                 "</parameter>\n</function>\n</tool_call>",
         .reasoning = "", .content = "", .n_calls = 1, .names = {"say"},
         .arguments = {"{\"text\":\"héllo 世界 <b>bold</b> <tool_call> <parameter\"}"}, .finish_reason = "tool_calls"},
        /* a key that needs escaping */
        {.text = "<tool_call>\n<function=f>\n<parameter=a\"b>\nx\n</parameter>\n</function>\n</tool_call>",
         .reasoning = "", .content = "", .n_calls = 1, .names = {"f"}, .arguments = {"{\"a\\\"b\":\"x\"}"},
         .finish_reason = "tool_calls"},
        /* content with < and > that are not tags, and a partial tag at the end of text */
        {.text = "if a < b && c > d: x <tool", .reasoning = "", .content = "if a < b && c > d: x <tool",
         .finish_reason = "stop"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(&cases[i]);
}

static void test_json_tool_call_form(void **state)
{
    (void)state;
    const parse_case cases[] = {
        {.text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n"
                 "</tool_call>",
         .reasoning = "", .content = "", .n_calls = 1, .names = {"get_weather"},
         .arguments = {"{\"city\":\"Paris\",\"days\":3}"}, .finish_reason = "tool_calls"},
        /* arguments as a JSON string, no closing tag at the end */
        {.text = "Let me look.\n<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": [1, 2]}\"}",
         .reasoning = "", .content = "Let me look.", .n_calls = 1, .names = {"f"}, .arguments = {"{\"a\":[1,2]}"},
         .finish_reason = "tool_calls"},
        /* no arguments */
        {.text = "<tool_call>{\"name\": \"now\"}</tool_call>", .reasoning = "", .content = "", .n_calls = 1,
         .names = {"now"}, .arguments = {"{}"}, .finish_reason = "tool_calls"},
        /* \u0000 in a value is JSON (a string may hold U+0000) */
        {.text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"x\\u0000\"}}\n</tool_call>",
         .reasoning = "", .content = "", .n_calls = 1, .names = {"f"}, .arguments = {"{\"a\":\"x\\u0000\"}"},
         .finish_reason = "tool_calls"},
        {.text = "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": \\\"\\\\u0000\\\"}\"}\n</tool_call>",
         .reasoning = "", .content = "", .n_calls = 1, .names = {"f"}, .arguments = {"{\"a\":\"\\u0000\"}"},
         .finish_reason = "tool_calls"},
        /* an integer past int64 (a uint64 id) and a number past the double range are a call, as lily serve's
         * loader reads them (it was content: jansson's "too big integer"); the digits reach the client as
         * written, never rounded through a double; spaces inside strings stay */
        {.text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"id\": 18446744073709551615, \"x\": -1e400,\n"
                 "  \"s\": \"a \\\" b\", \"l\": [ 1 , {\"k\": 99999999999999999999} ]}}\n</tool_call>",
         .reasoning = "", .content = "", .n_calls = 1, .names = {"f"},
         .arguments = {"{\"id\":18446744073709551615,\"x\":-1e400,\"s\":\"a \\\" b\",\"l\":[1,{\"k\":99999999999999999999}]}"},
         .finish_reason = "tool_calls"},
        {.text = "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"id\\\": 18446744073709551615}\"}\n</tool_call>",
         .reasoning = "", .content = "", .n_calls = 1, .names = {"f"}, .arguments = {"{\"id\":18446744073709551615}"},
         .finish_reason = "tool_calls"},
        /* duplicate keys: the last one, as jansson keeps it; a key written with an escape is the same key */
        {.text = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"argu\\u006dents\": {\"b\": 2}}</tool_call>",
         .reasoning = "", .content = "", .n_calls = 1, .names = {"f"}, .arguments = {"{\"b\":2}"},
         .finish_reason = "tool_calls"},
        {.text = "<tool_call>{\"parameters\": {\"a\": \"}\"}, \"name\": \"f\"}</tool_call>", .reasoning = "",
         .content = "", .n_calls = 1, .names = {"f"}, .arguments = {"{\"a\":\"}\"}"}, .finish_reason = "tool_calls"},
        /* not a call: the text is content */
        {.text = "<tool_call>\n{\"name\": oops}\n</tool_call>", .reasoning = "", .content = "{\"name\": oops}",
         .finish_reason = "stop"},
        /* nor with a malformed number whose prefix overflows a double, in the object or in the arguments string
         * (the loader once read it as the largest double, and the call's arguments went out as written) */
        {.text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1e400e5}}\n</tool_call>", .reasoning = "",
         .content = "{\"name\": \"f\", \"arguments\": {\"x\": 1e400e5}}", .finish_reason = "stop"},
        {.text = "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": [-1e400-]}\"}</tool_call>", .reasoning = "",
         .content = "{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": [-1e400-]}\"}", .finish_reason = "stop"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(&cases[i]);
}

static const char *const weather_tools =
    "[{\"type\":\"function\",\"function\":{\"name\":\"forecast\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"metric\":{\"type\":\"boolean\"},"
    "\"where\":{\"type\":\"object\"},\"hours\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}},"
    "\"ratio\":{\"type\":\"number\"},\"limit\":{\"type\":[\"integer\",\"null\"]},"
    "\"zip\":{\"type\":[\"string\",\"integer\"]},\"level\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"null\"}]}"
    "}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"other\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"days\":{\"type\":\"string\"}}}}}]";

static void test_values_converted_by_schema_type(void **state)
{
    (void)state;
    const parse_case c = {
        .text = "<tool_call>\n<function=forecast>\n"
                "<parameter=city>\n42\n</parameter>\n"
                "<parameter=days>\n3\n</parameter>\n"
                "<parameter=metric>\nTrue\n</parameter>\n"
                "<parameter=where>\n{\"lat\": 48.85, \"lon\": 2.35, \"name\": \"\\u0000\"}\n</parameter>\n"
                "<parameter=hours>\n[6, 12, 18]\n</parameter>\n"
                "<parameter=ratio>\n0.1\n</parameter>\n"
                "<parameter=limit>\nnull\n</parameter>\n"
                "<parameter=zip>\n75001\n</parameter>\n"
                "<parameter=level>\n2\n</parameter>\n"
                "<parameter=unknown>\n7\n</parameter>\n"
                "</function>\n</tool_call>",
        .tools = weather_tools,
        .reasoning = "",
        .content = "",
        .n_calls = 1,
        .names = {"forecast"},
        .arguments = {"{\"city\":\"42\",\"days\":3,\"metric\":true,"
                      "\"where\":{\"lat\": 48.85, \"lon\": 2.35, \"name\": \"\\u0000\"},\"hours\":[6, 12, 18],"
                      "\"ratio\":0.1,\"limit\":null,\"zip\":\"75001\",\"level\":2,"
                      "\"unknown\":\"7\"}"},
        .finish_reason = "tool_calls",
    };
    check_case(&c);
    /* unparsable values stay strings; the schema is per tool */
    const parse_case d = {
        .text = "<tool_call>\n<function=forecast>\n"
                "<parameter=days>\nthree\n</parameter>\n"
                "<parameter=metric>\nyes\n</parameter>\n"
                "<parameter=where>\n{'lat': 1}\n</parameter>\n"
                "<parameter=hours>\n{\"a\":1}\n</parameter>\n"
                "<parameter=ratio>\n</parameter>\n"
                "</function>\n</tool_call>\n<tool_call>\n<function=other>\n<parameter=days>\n3\n</parameter>\n"
                "</function>\n</tool_call>",
        .tools = weather_tools,
        .reasoning = "",
        .content = "",
        .n_calls = 2,
        .names = {"forecast", "other"},
        .arguments = {"{\"days\":\"three\",\"metric\":\"yes\",\"where\":\"{'lat': 1}\",\"hours\":\"{\\\"a\\\":1}\","
                      "\"ratio\":\"\"}",
                      "{\"days\":\"3\"}"},
        .finish_reason = "tool_calls",
    };
    check_case(&d);
    /* an integer past int64 (a uint64 id) where the schema takes an integer or number is that number, its
     * digits as written, as in the JSON form (it was a string: jansson's "too big integer"); past the double
     * range for a number too; inside an object or array as well. Not an integer where only a string or an
     * integer within the double-exact range is taken ("1e400" for an integer) */
    const parse_case big = {
        .text = "<tool_call>\n<function=forecast>\n"
                "<parameter=days>\n18446744073709551615\n</parameter>\n"
                "<parameter=level>\n-123456789012345678901234567890\n</parameter>\n"
                "<parameter=limit>\n123456789012345678901234567890\n</parameter>\n"
                "<parameter=ratio>\n-1e400\n</parameter>\n"
                "<parameter=hours>\n[1, 99999999999999999999]\n</parameter>\n"
                "<parameter=where>\n{\"id\": 18446744073709551616}\n</parameter>\n"
                "<parameter=zip>\n18446744073709551615\n</parameter>\n"
                "<parameter=metric>\n18446744073709551615\n</parameter>\n"
                "</function>\n</tool_call>\n<tool_call>\n<function=forecast>\n"
                "<parameter=days>\n1e400\n</parameter>\n"
                "<parameter=limit>\n1844674407370955161.5\n</parameter>\n"
                "</function>\n</tool_call>",
        .tools = weather_tools,
        .reasoning = "",
        .content = "",
        .n_calls = 2,
        .names = {"forecast", "forecast"},
        .arguments = {"{\"days\":18446744073709551615,\"level\":-123456789012345678901234567890,"
                      "\"limit\":123456789012345678901234567890,\"ratio\":-1e400,"
                      "\"hours\":[1, 99999999999999999999],\"where\":{\"id\": 18446744073709551616},"
                      "\"zip\":\"18446744073709551615\",\"metric\":\"18446744073709551615\"}",
                      "{\"days\":\"1e400\",\"limit\":\"1844674407370955161.5\"}"},
        .finish_reason = "tool_calls",
    };
    check_case(&big);
    /* odd literals: a malformed number whose prefix overflows a double (the loader once took it for the
     * largest double, and its text went out as written: invalid JSON) is a string, as any malformed one;
     * "-0", an exponent, spaces and blank lines around the value are numbers; leading zeros and "+" are not */
    const parse_case odd = {
        .text = "<tool_call>\n<function=forecast>\n"
                "<parameter=ratio>\n1e400e5\n</parameter>\n"
                "<parameter=days>\n-0\n</parameter>\n"
                "<parameter=level>\n 1e5 \n</parameter>\n"
                "<parameter=limit>\n\n\n-12\n\n</parameter>\n"
                "<parameter=where>\n{\"a\": -1e400-}\n</parameter>\n"
                "<parameter=hours>\n[1, 1e999.5]\n</parameter>\n"
                "</function>\n</tool_call>\n<tool_call>\n<function=forecast>\n"
                "<parameter=ratio>\n-1E400+\n</parameter>\n"
                "<parameter=days>\n007\n</parameter>\n"
                "<parameter=limit>\n+5\n</parameter>\n"
                "<parameter=level>\n-\n</parameter>\n"
                "</function>\n</tool_call>",
        .tools = weather_tools,
        .reasoning = "",
        .content = "",
        .n_calls = 2,
        .names = {"forecast", "forecast"},
        .arguments = {"{\"ratio\":\"1e400e5\",\"days\":-0,\"level\":1e5,\"limit\":-12,"
                      "\"where\":\"{\\\"a\\\": -1e400-}\",\"hours\":\"[1, 1e999.5]\"}",
                      "{\"ratio\":\"-1E400+\",\"days\":\"007\",\"limit\":\"+5\",\"level\":\"-\"}"},
        .finish_reason = "tool_calls",
    };
    check_case(&odd);
}

/* Schemas as pydantic writes them: nested models by $ref (to $defs or definitions), Optional[...] as anyOf with
 * null, allOf of one $ref, Literal values as enum / const without a type, objects and arrays known by their
 * properties / items. Their values are JSON, as the tool grammar makes them; string ones stay raw. */
static void test_values_converted_through_refs(void **state)
{
    (void)state;
    const char *tools =
        "[{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":{\"type\":\"object\","
        "\"$defs\":{\"Item\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"}}},"
        "\"Tag\":{\"type\":\"string\"},\"Loop\":{\"$ref\":\"#/$defs/Loop\"}},"
        "\"definitions\":{\"Old\":{\"type\":\"array\"}},\"properties\":{"
        "\"item\":{\"$ref\":\"#/$defs/Item\"},\"maybe\":{\"anyOf\":[{\"$ref\":\"#/$defs/Item\"},{\"type\":\"null\"}]},"
        "\"wrapped\":{\"allOf\":[{\"$ref\":\"#/$defs/Item\"}],\"description\":\"d\"},"
        "\"old\":{\"$ref\":\"#/definitions/Old\"},\"tag\":{\"$ref\":\"#/$defs/Tag\"},"
        "\"level\":{\"enum\":[1,2,3]},\"mode\":{\"enum\":[\"a\",1]},\"one\":{\"const\":1},"
        "\"word\":{\"const\":\"1\"},\"shape\":{\"properties\":{\"w\":{}}},\"list\":{\"items\":{}},"
        "\"loop\":{\"$ref\":\"#/$defs/Loop\"},\"missing\":{\"$ref\":\"#/$defs/None\"},"
        "\"self\":{\"$ref\":\"#\"}}}}}]";
    const parse_case c = {
        .text = "<tool_call>\n<function=add>\n"
                "<parameter=item>\n{\"v\": 1}\n</parameter>\n"
                "<parameter=maybe>\nnull\n</parameter>\n"
                "<parameter=wrapped>\n{\"v\": 2}\n</parameter>\n"
                "<parameter=old>\n[1]\n</parameter>\n"
                "<parameter=tag>\n{\"v\": 3}\n</parameter>\n"
                "<parameter=level>\n2\n</parameter>\n"
                "<parameter=mode>\n1\n</parameter>\n"
                "<parameter=one>\n1\n</parameter>\n"
                "<parameter=word>\n1\n</parameter>\n"
                "<parameter=shape>\n{\"w\": true}\n</parameter>\n"
                "<parameter=list>\n[]\n</parameter>\n"
                "<parameter=loop>\n{}\n</parameter>\n"
                "<parameter=missing>\n{}\n</parameter>\n"
                "<parameter=self>\n{}\n</parameter>\n"
                "</function>\n</tool_call>",
        .tools = tools,
        .reasoning = "",
        .content = "",
        .n_calls = 1,
        .names = {"add"},
        .arguments = {"{\"item\":{\"v\": 1},\"maybe\":null,\"wrapped\":{\"v\": 2},\"old\":[1],"
                      "\"tag\":\"{\\\"v\\\": 3}\","
                      "\"level\":2,\"mode\":\"1\",\"one\":1,\"word\":\"1\",\"shape\":{\"w\": true},\"list\":[],"
                      "\"loop\":\"{}\",\"missing\":\"{}\",\"self\":{}}"},
        .finish_reason = "tool_calls",
    };
    check_case(&c);
}

static void test_finish_reason_stop_and_length(void **state)
{
    (void)state;
    const parse_case stop = {.text = "<think>\nshort\n</think>\n\nDone.", .thinking = true, .reasoning = "short",
                             .content = "Done.", .finish_reason = "stop"};
    check_case(&stop);
    const parse_case length = {.text = "</think>\n\nA long answer that got cu", .thinking = true,
                               .cut_by_length = true, .reasoning = "", .content = "A long answer that got cu",
                               .finish_reason = "length"};
    check_case(&length);
    /* max tokens cut a tool call's value: the call keeps what was written, but the reply is "length", never
     * "tool_calls" (a client must not run a call whose arguments were cut) */
    const parse_case cut_call = {.text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
                                 .tools = weather_tools, .cut_by_length = true, .reasoning = "", .content = "",
                                 .n_calls = 1, .names = {"get_weather"}, .arguments = {"{\"city\":\"Par\"}"},
                                 .finish_reason = "length"};
    check_case(&cut_call);
    const parse_case whole_call = {.text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                                           "</parameter>\n</function>\n</tool_call>",
                                   .tools = weather_tools, .reasoning = "", .content = "", .n_calls = 1,
                                   .names = {"get_weather"}, .arguments = {"{\"city\":\"Paris\"}"},
                                   .finish_reason = "tool_calls"};
    check_case(&whole_call);
}

/* call_unfinished: the text ended inside a call (the server then reports a stop string that cut it as "stop",
 * not "tool_calls"), for every cut point before </function>; not after it, nor for text without a call. */
static void on_end_event(void *user, const lily_output_event *ev)
{
    if (ev->kind == LILY_OUTPUT_TOOL_CALL_END)
        *(int *)user = ev->unfinished;
}

static bool unfinished_after(const char *text, size_t len)
{
    int end_unfinished = -1; /* the TOOL_CALL_END event's unfinished flag (-1: no such event) */
    lily_output_parser_options opts = {.on_event = on_end_event, .user = &end_unfinished};
    lily_output_parser *p = NULL;
    lily_error err = {0};
    assert_int_equal(lily_output_parser_new(&opts, &p, &err), LILY_OK);
    assert_int_equal(lily_output_parser_feed(p, text, len, &err), LILY_OK);
    assert_int_equal(lily_output_parser_finish(p, false, &err), LILY_OK);
    bool unfinished = lily_output_parser_result(p)->call_unfinished;
    lily_output_parser_free(p);
    if (end_unfinished >= 0 && end_unfinished != unfinished) /* the event says what the result says */
        fail_msg("TOOL_CALL_END's unfinished %d, call_unfinished %d for %.*s", end_unfinished, unfinished, (int)len,
                 text);
    return unfinished;
}

static void test_call_unfinished_marks_a_call_cut_short(void **state)
{
    (void)state;
    static const char call[] = "Sure.<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                               "</function>\n</tool_call>";
    const char *body = strstr(call, "<tool_call>"), *end = strstr(call, "</function>");
    for (size_t k = 0; k <= sizeof call - 1; k++) {
        bool inside = call + k >= body + strlen("<tool_call>") && call + k < end + strlen("</function>");
        if (unfinished_after(call, k) != inside)
            fail_msg("cut after %zu bytes (%.*s): call_unfinished %d, want %d", k, (int)k, call, !inside, inside);
    }
    static const char json_form[] = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1";
    assert_true(unfinished_after(json_form, sizeof json_form - 1));
    assert_false(unfinished_after("plain text", 10));
}

/* Random tag soup: whatever the parser decides, it must decide the same for every split, and every
 * arguments string must be a JSON object. */
static void test_random_tag_soup_is_split_invariant(void **state)
{
    (void)state;
    static const char *const pieces[] = {
        "<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>", "<think>",
        "</think>", ">", "\n", " ", "a", "<", "x y", "{\"k\": [1]}", "7", "true", "</", "<tool", "\"", "\\",
        "é", "days", "forecast", "</para", "<par"};
    const int n_pieces = (int)(sizeof pieces / sizeof pieces[0]);
    lily_rng r;
    lily_rng_seed(&r, 77);
    char text[512];
    size_t splits[512];
    for (int trial = 0; trial < 400; trial++) {
        text[0] = '\0';
        int n = 1 + (int)(lily_rng_next(&r) % 30);
        for (int i = 0; i < n; i++)
            strcat(text, pieces[lily_rng_next(&r) % (uint64_t)n_pieces]);
        parse_case c = {.text = text, .thinking = lily_rng_next(&r) & 1, .tools = (lily_rng_next(&r) & 1) ? weather_tools : NULL,
                        .cut_by_length = lily_rng_next(&r) & 1};
        outcome whole = parse(&c, NULL);
        /* the whole-text outcome is the expectation for the splits */
        c.reasoning = whole.reasoning;
        c.content = whole.content;
        c.n_calls = whole.n_calls;
        if (whole.n_calls > 4) {
            free_outcome(&whole);
            continue;
        }
        for (int i = 0; i < c.n_calls; i++) {
            c.names[i] = whole.names[i];
            c.arguments[i] = whole.arguments[i];
        }
        c.finish_reason = whole.finish_reason;
        check_outcome(&c, &whole, "whole");
        size_t len = strlen(text);
        for (size_t i = 0; i < len; i++)
            splits[i] = 1;
        splits[len] = 0;
        outcome o = parse(&c, splits);
        check_outcome(&c, &o, "1 byte at a time");
        free_outcome(&o);
        size_t at = 0, k = 0;
        while (at < len) {
            splits[k] = 1 + lily_rng_next(&r) % 13;
            at += splits[k++];
        }
        splits[k] = 0;
        o = parse(&c, splits);
        check_outcome(&c, &o, "random split");
        free_outcome(&o);
        free_outcome(&whole);
    }
}

static void test_prompt_opens_thinking(void **state)
{
    (void)state;
    const char *on = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n";
    const char *off = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    const char *none = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    assert_true(lily_prompt_opens_thinking(on, strlen(on)));
    assert_false(lily_prompt_opens_thinking(off, strlen(off)));
    assert_false(lily_prompt_opens_thinking(none, strlen(none)));
    assert_false(lily_prompt_opens_thinking("", 0));
}

/* Continuing a prefill, content keeps its leading whitespace (streamed and whole); trailing whitespace is
 * still held back and dropped at the end; without the option the same text is trimmed. */
static void test_continuation_keeps_leading_whitespace(void **state)
{
    (void)state;
    static const char *const pieces[] = {" ", " blue", " sky. ", "\n"};
    for (int continuation = 0; continuation < 2; continuation++) {
        lily_output_parser_options opts = {.continuation = continuation};
        lily_output_parser *p = NULL;
        lily_error err = {0};
        assert_int_equal(lily_output_parser_new(&opts, &p, &err), LILY_OK);
        for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++)
            assert_int_equal(lily_output_parser_feed(p, pieces[i], strlen(pieces[i]), &err), LILY_OK);
        assert_int_equal(lily_output_parser_finish(p, false, &err), LILY_OK);
        assert_string_equal(lily_output_parser_result(p)->content, continuation ? "  blue sky." : "blue sky.");
        lily_output_parser_free(p);
    }
}

static void test_rejects_tools_that_are_not_an_array(void **state)
{
    (void)state;
    json_t *obj = json_object();
    lily_output_parser_options opts = {.tools = obj};
    lily_output_parser *p = NULL;
    lily_error err = {0};
    assert_int_equal(lily_output_parser_new(&opts, &p, &err), LILY_ERR_INVALID_ARGUMENT);
    assert_null(p);
    json_decref(obj);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parameter_name_ending_at_newline),
        cmocka_unit_test(test_html_value_without_closing_parameter_kept_verbatim),
        cmocka_unit_test(test_reasoning_then_tool_call_without_closing_think),
        cmocka_unit_test(test_thinking_cut_by_length_is_all_reasoning),
        cmocka_unit_test(test_thinking_off_no_think_tags_reach_content),
        cmocka_unit_test(test_reasoning_content_and_two_calls),
        cmocka_unit_test(test_tolerates_missing_closing_tags_and_stray_whitespace),
        cmocka_unit_test(test_values_keep_text_exactly),
        cmocka_unit_test(test_values_converted_by_schema_type),
        cmocka_unit_test(test_values_converted_through_refs),
        cmocka_unit_test(test_json_tool_call_form),
        cmocka_unit_test(test_finish_reason_stop_and_length),
        cmocka_unit_test(test_call_unfinished_marks_a_call_cut_short),
        cmocka_unit_test(test_verbatim_answer_keeps_tags_as_text),
        cmocka_unit_test(test_random_tag_soup_is_split_invariant),
        cmocka_unit_test(test_prompt_opens_thinking),
        cmocka_unit_test(test_continuation_keeps_leading_whitespace),
        cmocka_unit_test(test_cut_inside_tool_call_close),
        cmocka_unit_test(test_rejects_tools_that_are_not_an_array),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
