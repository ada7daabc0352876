/* test_server_openai_format.c — request validation and response JSON of server/openai.c against the shapes
 * OpenAI's API reference gives (chat.completion, chat.completion.chunk, text_completion, error objects).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server/openai.h"
#include "test_support.h"
#include "text/output_parser.h"

static bool parse(const char *body, bool chat, lily_oai_request *req, lily_oai_error *e)
{
    return lily_oai_parse_request(body, strlen(body), chat, req, e);
}

/* A 400 naming `param`. */
static void assert_rejected(const char *body, bool chat, const char *param)
{
    lily_oai_request req;
    lily_oai_error e;
    if (parse(body, chat, &req, &e)) {
        print_error("accepted: %s\n", body);
        lily_oai_request_free(&req);
        fail();
    }
    assert_int_equal(e.http_status, 400);
    assert_string_equal(e.type, "invalid_request_error");
    if (param && strcmp(e.param, param)) {
        print_error("param '%s' (want '%s') for %s: %s\n", e.param, param, body, e.message);
        fail();
    }
}

/* The compact JSON text of j (j is stolen); caller frees. */
static char *dump(json_t *j)
{
    assert_non_null(j);
    char *s = lily_oai_dump(j);
    json_decref(j);
    return s;
}

static void test_openai_request_defaults_are_unset(void **state)
{
    (void)state;
    lily_oai_request req;
    lily_oai_error e;
    assert_true(parse("{\"model\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", true, &req, &e));
    assert_true(isnan(req.temperature) && isnan(req.top_p) && isnan(req.min_p) && isnan(req.repetition_penalty));
    assert_int_equal(req.max_tokens, -1);
    assert_int_equal(req.top_k, -1);
    assert_int_equal(req.enable_thinking, -1);
    assert_false(req.stream);
    assert_int_equal(req.tool_choice, LILY_TOOL_CHOICE_AUTO);
    assert_null(req.tools);
    lily_oai_request_free(&req);
}

static void test_openai_request_fields(void **state)
{
    (void)state;
    lily_oai_request req;
    lily_oai_error e;
    const char *body =
        "{\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":[{\"type\":"
        "\"text\",\"text\":\"hi\"}]}],\"max_completion_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":20,"
        "\"min_p\":0.05,\"presence_penalty\":1.5,\"frequency_penalty\":-0.5,\"repetition_penalty\":1.1,\"seed\":42,"
        "\"stop\":[\"a\",\"\",\"bc\"],\"logprobs\":true,\"top_logprobs\":3,\"logit_bias\":{\"5\":-100,\"7\":2.5},"
        "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"reasoning_effort\":\"none\"}";
    assert_true(parse(body, true, &req, &e));
    assert_int_equal(req.max_tokens, 7);
    assert_true(req.temperature == 0.5 && req.top_p == 0.9 && req.min_p == 0.05);
    assert_int_equal(req.top_k, 20);
    assert_true(req.presence_penalty == 1.5 && req.frequency_penalty == -0.5 && req.repetition_penalty == 1.1);
    assert_true(req.has_seed);
    assert_int_equal(req.seed, 42);
    assert_int_equal(req.n_stop, 2); /* the empty stop string is dropped */
    assert_string_equal(req.stop[0], "a");
    assert_string_equal(req.stop[1], "bc");
    assert_true(req.logprobs);
    assert_int_equal(req.top_logprobs, 3);
    assert_int_equal(req.n_logit_bias, 2);
    assert_int_equal(req.logit_bias[1].token, 7);
    assert_true(req.logit_bias[1].bias == 2.5f);
    assert_true(req.stream && req.include_usage);
    assert_int_equal(req.enable_thinking, 0);
    /* the template sees enable_thinking false */
    json_t *t = lily_oai_template_request(&req);
    assert_true(json_is_false(json_object_get(json_object_get(t, "chat_template_kwargs"), "enable_thinking")));
    assert_true(json_is_true(json_object_get(t, "add_generation_prompt")));
    assert_null(json_object_get(t, "tools"));
    json_decref(t);
    lily_oai_request_free(&req);

    /* a seed written as an integral real is that integer (as max_tokens 16.0 is 16); a fraction is a type error,
     * never "outside the int64 range" */
    static const struct {
        const char *literal;
        int64_t seed;
    } real_seeds[] = {{"7.0", 7}, {"-3.0", -3}, {"1e3", 1000}, {"0.0", 0}};
    for (size_t i = 0; i < sizeof real_seeds / sizeof real_seeds[0]; i++) {
        char sb[160];
        snprintf(sb, sizeof sb, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"seed\":%s}",
                 real_seeds[i].literal);
        assert_true(parse(sb, true, &req, &e));
        assert_true(req.has_seed);
        assert_true(req.seed == (uint64_t)real_seeds[i].seed);
        lily_oai_request_free(&req);
    }
    assert_false(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"seed\":1.5}", true, &req, &e));
    assert_string_equal(e.param, "seed");
    assert_string_equal(e.message, "Invalid type for 'seed': expected an integer, but got a number instead.");

    /* stream_options without stream is a 400, as OpenAI (on both routes; null is as absent) */
    assert_rejected("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream_options\":{\"include_usage\":"
                    "true}}", true, "stream_options");
    assert_rejected("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":false,\"stream_options\":{}}",
                    true, "stream_options");
    assert_rejected("{\"prompt\":\"hi\",\"stream_options\":{\"include_usage\":true}}", false, "stream_options");
    assert_false(parse("{\"prompt\":\"hi\",\"stream_options\":{}}", false, &req, &e));
    assert_non_null(strstr(e.message, "only allowed when 'stream' is enabled"));
    /* a single stop string */
    assert_true(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream_options\":null,"
                      "\"stop\":\"END\",\"max_tokens\":3}", true, &req, &e));
    assert_false(req.include_usage);
    assert_int_equal(req.n_stop, 1);
    assert_string_equal(req.stop[0], "END");
    lily_oai_request_free(&req);
}

static const char *tools_json = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
                                "{\"type\":\"object\"}}}]";

static void test_openai_tool_choice(void **state)
{
    (void)state;
    lily_oai_request req;
    lily_oai_error e;
    char body[1024];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s,\"tool_choice\":{\"type\":"
             "\"function\",\"function\":{\"name\":\"get_weather\"}}}", tools_json);
    assert_true(parse(body, true, &req, &e));
    assert_int_equal(req.tool_choice, LILY_TOOL_CHOICE_NAMED);
    assert_string_equal(req.tool_name, "get_weather");
    assert_non_null(req.tools);
    lily_oai_request_free(&req);

    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s,\"tool_choice\":\"none\"}",
             tools_json);
    assert_true(parse(body, true, &req, &e));
    assert_null(req.tools); /* none: the tools are left out of the prompt */
    json_t *t = lily_oai_template_request(&req);
    assert_null(json_object_get(t, "tools"));
    json_decref(t);
    lily_oai_request_free(&req);

    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s,\"tool_choice\":"
             "\"required\"}", tools_json);
    assert_true(parse(body, true, &req, &e));
    assert_int_equal(req.tool_choice, LILY_TOOL_CHOICE_REQUIRED);
    lily_oai_request_free(&req);

    /* parallel_tool_calls: default true (any number of calls); false: the reply ends after its first call */
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s}", tools_json);
    assert_true(parse(body, true, &req, &e));
    assert_false(req.single_tool_call);
    lily_oai_request_free(&req);
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s,"
             "\"parallel_tool_calls\":false}", tools_json);
    assert_true(parse(body, true, &req, &e));
    assert_true(req.single_tool_call);
    lily_oai_request_free(&req);
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s,"
             "\"parallel_tool_calls\":\"no\"}", tools_json);
    assert_rejected(body, true, "parallel_tool_calls");

    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s,\"tool_choice\":{\"type\":"
             "\"function\",\"function\":{\"name\":\"get_time\"}}}", tools_json);
    assert_rejected(body, true, "tool_choice");
    assert_rejected("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tool_choice\":\"required\"}", true,
                    "tool_choice");
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s,\"tool_choice\":\"maybe\"}",
             tools_json);
    assert_rejected(body, true, "tool_choice");
    assert_rejected("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"type\":\"function\"}]}",
                    true, "tools[0]");

    /* a forced call cannot write a parameter name with '<', '>' or a newline (<parameter=NAME>): a 400
     * naming it, where it was a call that never completed; not forced (auto), the request stands */
    static const char *const names[] = {"a<b", "a>b", "a\\nb"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        static const char *const choices[] = {"\"required\"",
                                              "{\"type\":\"function\",\"function\":{\"name\":\"odd\"}}"};
        for (size_t c = 0; c < 2; c++) {
            snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":["
                     "{\"type\":\"function\",\"function\":{\"name\":\"plain\",\"parameters\":{\"type\":\"object\"}}},"
                     "{\"type\":\"function\",\"function\":{\"name\":\"odd\",\"parameters\":{\"type\":\"object\","
                     "\"properties\":{\"ok\":{\"type\":\"string\"},\"%s\":{\"type\":\"string\"}}}}}],"
                     "\"tool_choice\":%s}", names[k], choices[c]);
            assert_rejected(body, true, "tools[1].function.parameters.properties");
            assert_false(parse(body, true, &req, &e));
            assert_non_null(strstr(e.message, "Invalid parameter name 'a"));
            assert_non_null(strstr(e.message, "in tool 'odd'"));
        }
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":["
                 "{\"type\":\"function\",\"function\":{\"name\":\"odd\",\"parameters\":{\"type\":\"object\","
                 "\"properties\":{\"%s\":{\"type\":\"string\"}}}}}],\"tool_choice\":\"auto\"}", names[k]);
        assert_true(parse(body, true, &req, &e));
        lily_oai_request_free(&req);
    }
}

static void test_openai_rejects_bad_requests(void **state)
{
    (void)state;
    const char *user = "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
    char body[512];
    assert_rejected("{", true, NULL);
    assert_rejected("[]", true, NULL);
    assert_rejected("{}", true, "messages");
    assert_rejected("{\"messages\":[]}", true, "messages");
    assert_rejected("{\"messages\":{}}", true, "messages");
    assert_rejected("{\"messages\":[1]}", true, "messages[0]");
    assert_rejected("{\"messages\":[{\"content\":\"x\"}]}", true, "messages[0].role");
    assert_rejected("{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", true, "messages[0].role");
    assert_rejected("{\"messages\":[{\"role\":\"user\"}]}", true, "messages[0].content");
    assert_rejected("{\"messages\":[{\"role\":\"user\",\"content\":5}]}", true, "messages[0].content");
    assert_rejected("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", true,
                    "messages[0].content");
    assert_rejected("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
                    "\"arguments\":5}}]}]}", true, "messages[0].tool_calls");
    static const char *const bad_fields[][2] = {
        {"\"n\":2", "n"},
        {"\"n\":\"1\"", "n"},
        {"\"temperature\":\"hot\"", "temperature"},
        {"\"temperature\":3", "temperature"},
        {"\"top_p\":1.5", "top_p"},
        {"\"max_tokens\":0", "max_tokens"},
        {"\"max_tokens\":1.5", "max_tokens"},
        {"\"max_completion_tokens\":-1", "max_completion_tokens"},
        {"\"stream\":\"yes\"", "stream"},
        {"\"stream_options\":1", "stream_options"},
        {"\"seed\":\"x\"", "seed"},
        {"\"stop\":5", "stop"},
        {"\"stop\":[\"a\",1]", "stop"},
        {"\"logit_bias\":{\"x\":1}", "logit_bias"},
        {"\"logit_bias\":{\"1.5\":1}", "logit_bias"},
        {"\"logit_bias\":{\" 5\":1}", "logit_bias"},
        {"\"logit_bias\":{\"+5\":1}", "logit_bias"},
        {"\"logit_bias\":{\"-1\":1}", "logit_bias"},
        {"\"logit_bias\":{\"3\":500}", "logit_bias"},
        {"\"top_logprobs\":3", "top_logprobs"},
        {"\"logprobs\":true,\"top_logprobs\":21", "top_logprobs"},
        {"\"chat_template_kwargs\":[]", "chat_template_kwargs"},
        {"\"chat_template_kwargs\":{\"enable_thinking\":\"no\"}", "chat_template_kwargs.enable_thinking"},
        {"\"reasoning_effort\":\"extreme\"", "reasoning_effort"},
        {"\"reasoning_budget\":5,\"max_reasoning_tokens\":7", "max_reasoning_tokens"}, /* two names, two values */
        {"\"model\":7", "model"},
    };
    for (size_t i = 0; i < sizeof bad_fields / sizeof bad_fields[0]; i++) {
        snprintf(body, sizeof body, "{%s,%s}", user, bad_fields[i][0]);
        assert_rejected(body, true, bad_fields[i][1]);
    }
    /* completions */
    assert_rejected("{}", false, "prompt");
    assert_rejected("{\"prompt\":5}", false, "prompt");
    assert_rejected("{\"prompt\":[]}", false, "prompt");
    assert_rejected("{\"prompt\":[\"a\",\"b\"]}", false, "prompt");
    assert_rejected("{\"prompt\":[1,-2]}", false, "prompt");
    { /* a non-integer token id is named as such, not as a batch of prompts */
        lily_oai_request req;
        lily_oai_error e;
        assert_false(parse("{\"prompt\":[1.5]}", false, &req, &e));
        assert_string_equal(e.message, "Invalid 'prompt[0]': expected a token id (an integer), but got a number "
                                       "instead.");
    }
    assert_rejected("{\"prompt\":\"x\",\"logprobs\":true}", false, "logprobs");
    /* max_tokens 0: a completion with echo scores its prompt; without echo (or in a chat, above) it is refused */
    assert_rejected("{\"prompt\":\"x\",\"max_tokens\":0}", false, "max_tokens");
    assert_rejected("{\"prompt\":\"x\",\"max_tokens\":0,\"echo\":false}", false, "max_tokens");
    {
        lily_oai_request req;
        lily_oai_error e;
        assert_true(parse("{\"prompt\":\"x\",\"max_tokens\":0,\"echo\":true,\"logprobs\":2}", false, &req, &e));
        assert_int_equal(req.max_tokens, 0);
        lily_oai_request_free(&req);
    }
    /* fields lily does not implement are refused unless at their defaults, never silently ignored */
    assert_rejected("{\"prompt\":\"x\",\"suffix\":\"y\"}", false, "suffix");
    assert_rejected("{\"prompt\":\"x\",\"suffix\":5}", false, "suffix");
    assert_rejected("{\"prompt\":\"x\",\"best_of\":3}", false, "best_of");
    assert_rejected("{\"prompt\":\"x\",\"best_of\":0}", false, "best_of");
    assert_rejected("{\"prompt\":\"x\",\"best_of\":\"2\"}", false, "best_of");
    lily_oai_request req;
    lily_oai_error e;
    assert_true(parse("{\"prompt\":\"x\",\"suffix\":null,\"best_of\":1}", false, &req, &e));
    lily_oai_request_free(&req);
    assert_true(parse("{\"prompt\":\"x\",\"suffix\":\"\"}", false, &req, &e));
    lily_oai_request_free(&req);
    /* the reasoning budget's two names agree, or one is given: that value */
    assert_true(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"reasoning_budget\":5,"
                      "\"max_reasoning_tokens\":5}", true, &req, &e));
    assert_int_equal(req.reasoning_budget, 5);
    lily_oai_request_free(&req);
    assert_true(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_reasoning_tokens\":7}", true,
                      &req, &e));
    assert_int_equal(req.reasoning_budget, 7);
    lily_oai_request_free(&req);
}

static void test_openai_completions_prompt_forms(void **state)
{
    (void)state;
    lily_oai_request req;
    lily_oai_error e;
    assert_true(parse("{\"prompt\":\"Once\",\"logprobs\":2,\"echo\":false}", false, &req, &e));
    assert_string_equal(req.prompt_text, "Once");
    assert_true(req.logprobs && !req.echo);
    assert_int_equal(req.top_logprobs, 2);
    lily_oai_request_free(&req);
    assert_true(parse("{\"prompt\":\"Once\",\"logprobs\":null,\"echo\":true}", false, &req, &e));
    assert_true(!req.logprobs && req.echo);
    lily_oai_request_free(&req);
    assert_true(parse("{\"prompt\":\"Once\",\"logprobs\":0,\"echo\":true}", false, &req, &e));
    assert_true(req.logprobs && req.echo); /* the prompt's logprobs too (service.c) */
    lily_oai_request_free(&req);
    assert_true(parse("{\"prompt\":[[1,2,3]]}", false, &req, &e));
    assert_int_equal(req.n_prompt_ids, 3);
    assert_int_equal(req.prompt_ids[2], 3);
    lily_oai_request_free(&req);
    assert_true(parse("{\"prompt\":[\"one\"]}", false, &req, &e));
    assert_string_equal(req.prompt_text, "one");
    lily_oai_request_free(&req);
}

static void test_openai_error_json(void **state)
{
    (void)state;
    lily_oai_error e;
    lily_oai_error_set(&e, 400, "invalid_request_error", "messages", "context_length_exceeded", "too long: %d", 9);
    char *s = lily_oai_error_json(&e);
    assert_string_equal(s, "{\"error\":{\"message\":\"too long: 9\",\"type\":\"invalid_request_error\",\"param\":"
                           "\"messages\",\"code\":\"context_length_exceeded\"}}");
    free(s);
    lily_oai_error_set(&e, 404, "invalid_request_error", NULL, NULL, "nope");
    s = lily_oai_error_json(&e);
    assert_string_equal(s, "{\"error\":{\"message\":\"nope\",\"type\":\"invalid_request_error\",\"param\":null,"
                           "\"code\":null}}");
    free(s);
}

static const lily_oai_ident ident = {.id = "chatcmpl-abc", .created = 1700000000, .model = "m"};

static void test_openai_chat_response_shape(void **state)
{
    (void)state;
    lily_oai_usage u = {.prompt_tokens = 10, .completion_tokens = 4, .cached_tokens = 6, .reasoning_tokens = 2};
    lily_oai_tool_call call = {.id = "call_1", .name = "get_weather", .arguments = "{\"city\":\"Paris\"}"};
    char *s = dump(lily_oai_chat_response(&ident, "", 0, "thought", 7, &call, 1, "tool_calls", NULL, &u));
    assert_string_equal(s, "{\"id\":\"chatcmpl-abc\",\"object\":\"chat.completion\",\"created\":1700000000,\"model\":"
                           "\"m\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":null,"
                           "\"reasoning_content\":\"thought\",\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
                           "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
                           "\"logprobs\":null,\"finish_reason\":\"tool_calls\"}],\"system_fingerprint\":null,\"usage\":"
                           "{\"prompt_tokens\":10,\"completion_tokens\":4,\"total_tokens\":14,\"prompt_tokens_details\":"
                           "{\"cached_tokens\":6},\"completion_tokens_details\":{\"reasoning_tokens\":2}}}");
    free(s);
}

/* The streamed arguments of a chat reply as a client assembles them: each TOOL_ARGUMENTS event sent as its
 * chunk's JSON text, read back, its "arguments" fragment appended to user (a 256-byte buffer). */
static void stream_arguments(void *user, const lily_output_event *ev)
{
    if (ev->kind != LILY_OUTPUT_TOOL_ARGUMENTS)
        return;
    char *s = dump(lily_oai_chat_chunk(&ident, lily_oai_delta_tool_args(ev->tool_index, ev->text, ev->len), NULL,
                                       NULL, false));
    json_t *chunk = json_loads(s, 0, NULL);
    json_t *fn = json_object_get(json_array_get(json_object_get(json_object_get(json_array_get(json_object_get(
                                                    chunk, "choices"), 0), "delta"), "tool_calls"), 0), "function");
    assert_true(json_is_string(json_object_get(fn, "arguments")));
    strncat(user, json_string_value(json_object_get(fn, "arguments")), 255 - strlen(user));
    json_decref(chunk);
    free(s);
}

/* A tool call whose arguments hold integers past int64 (a uint64 id), in the JSON form and in the XML form with
 * a schema that takes integers: the output parser makes it a call, and the reply's arguments string, as a
 * client reads it (the whole reply, and the streamed fragments joined), holds the model's digits (never rounded
 * through a double, which would give 18446744073709551616 or 1.8446744073709552e+19, nor a string). */
static void test_openai_chat_response_keeps_big_integer_arguments(void **state)
{
    (void)state;
    static const char *const texts[] = {
        "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"id\": 18446744073709551615, "
        "\"n\": -123456789012345678901234567890}}\n</tool_call>",
        "<tool_call>\n<function=get>\n<parameter=id>\n18446744073709551615\n</parameter>\n"
        "<parameter=n>\n-123456789012345678901234567890\n</parameter>\n</function>\n</tool_call>",
    };
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":{\"type\":"
                               "\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"n\":{\"type\":"
                               "\"number\"}}}}}]", 0, NULL);
    assert_non_null(tools);
    static const char want[] = "{\"id\":18446744073709551615,\"n\":-123456789012345678901234567890}";
    for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
        char streamed[256] = "";
        lily_output_parser *p = NULL;
        lily_error err = {0};
        lily_output_parser_options opt = {.tools = tools, .on_event = stream_arguments, .user = streamed};
        assert_int_equal(lily_output_parser_new(&opt, &p, &err), LILY_OK);
        assert_int_equal(lily_output_parser_feed(p, texts[t], strlen(texts[t]), &err), LILY_OK);
        assert_int_equal(lily_output_parser_finish(p, false, &err), LILY_OK);
        const lily_parsed_output *o = lily_output_parser_result(p);
        assert_int_equal(o->n_tool_calls, 1);
        lily_oai_tool_call call = {.id = "call_1", .name = o->tool_calls[0].name,
                                   .arguments = o->tool_calls[0].arguments};
        lily_oai_usage u = {0};
        char *s = dump(lily_oai_chat_response(&ident, "", 0, "", 0, &call, 1, "tool_calls", NULL, &u));
        json_t *reply = json_loads(s, 0, NULL);
        json_t *fn = json_object_get(json_array_get(json_object_get(json_object_get(json_array_get(json_object_get(
                                                        reply, "choices"), 0), "message"), "tool_calls"), 0), "function");
        assert_string_equal(json_string_value(json_object_get(fn, "name")), "get");
        assert_string_equal(json_string_value(json_object_get(fn, "arguments")), want);
        assert_string_equal(streamed, want);
        json_decref(reply);
        free(s);
        lily_output_parser_free(p);
    }
    json_decref(tools);
}

static void test_openai_chunk_shapes(void **state)
{
    (void)state;
    char *s = dump(lily_oai_chat_chunk(&ident, lily_oai_delta_role(), NULL, NULL, true));
    assert_string_equal(s, "{\"id\":\"chatcmpl-abc\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
                           "\"model\":\"m\",\"system_fingerprint\":null,\"choices\":[{\"index\":0,\"delta\":{\"role\":"
                           "\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}");
    free(s);
    s = dump(lily_oai_delta_tool_open(0, "call_x", "f"));
    assert_string_equal(s, "{\"tool_calls\":[{\"index\":0,\"id\":\"call_x\",\"type\":\"function\",\"function\":{\"name\":"
                           "\"f\",\"arguments\":\"\"}}]}");
    free(s);
    s = dump(lily_oai_delta_tool_args(1, "{\"a\":", 5));
    assert_string_equal(s, "{\"tool_calls\":[{\"index\":1,\"function\":{\"arguments\":\"{\\\"a\\\":\"}}]}");
    free(s);
    lily_oai_usage u = {.prompt_tokens = 3, .completion_tokens = 2};
    s = dump(lily_oai_usage_chunk(&ident, true, &u));
    assert_non_null(strstr(s, "\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5"));
    free(s);
    json_t *last = lily_oai_chat_chunk(&ident, json_object(), "length", NULL, false);
    size_t len;
    char *sse = lily_oai_sse(last, &len);
    json_decref(last);
    assert_int_equal(len, strlen(sse));
    assert_true(!strncmp(sse, "data: {", 7) && !strcmp(sse + len - 2, "\n\n"));
    assert_non_null(strstr(sse, "\"delta\":{},\"logprobs\":null,\"finish_reason\":\"length\"}]}"));
    free(sse);
}

static void test_openai_logprobs_and_invalid_utf8(void **state)
{
    (void)state;
    json_t *j = lily_oai_string("a\xff" "b\xe2\x82", 5);
    assert_string_equal(json_string_value(j), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD");
    json_decref(j);
    lily_oai_logprob lp = {.token = strdup("\xe2\x82"), .token_len = 2, .logprob = -0.5f, .n_top = 1};
    lp.top[0].token = strdup("A");
    lp.top[0].token_len = 1;
    lp.top[0].logprob = -0.25f;
    char *s = dump(lily_oai_chat_logprobs_json(&lp, 1));
    assert_string_equal(s, "{\"content\":[{\"token\":\"\xEF\xBF\xBD\xEF\xBF\xBD\",\"logprob\":-0.5,\"bytes\":[226,130],"
                           "\"top_logprobs\":[{\"token\":\"A\",\"logprob\":-0.25,\"bytes\":[65]}]}],\"refusal\":null}");
    free(s);
    s = dump(lily_oai_completion_logprobs_json(&lp, 1, 4));
    assert_non_null(strstr(s, "\"token_logprobs\":[-0.5]"));
    assert_non_null(strstr(s, "\"text_offset\":[4]"));
    /* the sampled token is always among the legacy top_logprobs (OpenAI: "up to logprobs+1 elements"; vLLM) */
    assert_non_null(strstr(s, "\"top_logprobs\":[{\"A\":-0.25,\"\xEF\xBF\xBD\xEF\xBF\xBD\":-0.5}]"));
    free(s);
    lp.n_top = 0; /* logprobs: 0 still reports the sampled token */
    s = dump(lily_oai_completion_logprobs_json(&lp, 1, 0));
    assert_non_null(strstr(s, "\"top_logprobs\":[{\"\xEF\xBF\xBD\xEF\xBF\xBD\":-0.5}]"));
    free(s);
    lp.n_top = 1;
    lily_oai_logprob_clear(&lp);
    /* tokens holding U+0000 are keys of their own, not cut at it (the sampled "x\0" is not "x") */
    lily_oai_logprob nul = {.token = malloc(2), .token_len = 2, .logprob = -0.5f, .n_top = 2};
    nul.top[0].token = malloc(1);
    nul.top[0].token_len = 1;
    nul.top[0].logprob = -0.25f;
    nul.top[1].token = strdup("x");
    nul.top[1].token_len = 1;
    nul.top[1].logprob = -0.75f;
    assert_true(nul.token && nul.top[0].token);
    memcpy(nul.token, "x", 2);
    nul.top[0].token[0] = 0;
    s = dump(lily_oai_completion_logprobs_json(&nul, 1, 0));
    assert_non_null(strstr(s, "\"top_logprobs\":[{\"\\u0000\":-0.25,\"x\":-0.75,\"x\\u0000\":-0.5}]"));
    free(s);
    lily_oai_logprob_clear(&nul);
}

/* Other engines' fields that change what the reply is (vLLM's guided decoding, stop ids, beam search, prompt
 * logprobs, chat echo; llama.cpp's grammar and json_schema; SGLang's regex and ebnf; OpenAI's deprecated
 * functions / function_call) are refused when set, not dropped: a reply made without them would silently be
 * another reply. At their defaults they are accepted. */
static void test_openai_refuses_unimplemented_extensions(void **state)
{
    (void)state;
    static const struct {
        const char *field, *param;
        bool chat_only;
    } set[] = {
        {"\"include_stop_str_in_output\":true", "include_stop_str_in_output", false},
        {"\"stop_token_ids\":[13]", "stop_token_ids", false},
        {"\"use_beam_search\":true", "use_beam_search", false},
        {"\"prompt_logprobs\":1", "prompt_logprobs", false},
        {"\"guided_json\":{\"type\":\"object\"}", "guided_json", false},
        {"\"guided_regex\":\"a+\"", "guided_regex", false},
        {"\"guided_choice\":[\"a\",\"b\"]", "guided_choice", false},
        {"\"guided_grammar\":\"root ::= \\\"a\\\"\"", "guided_grammar", false},
        {"\"structured_outputs\":{\"json\":{\"type\":\"object\"}}", "structured_outputs", false},
        {"\"grammar\":\"root ::= \\\"a\\\"\"", "grammar", false},
        {"\"json_schema\":{\"type\":\"object\"}", "json_schema", false},
        {"\"regex\":\"a+\"", "regex", false},
        {"\"ebnf\":\"root ::= \\\"a\\\"\"", "ebnf", false},
        {"\"echo\":true", "echo", true},
        {"\"best_of\":2", "best_of", true},
        {"\"functions\":[{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}]", "functions", true},
        {"\"function_call\":{\"name\":\"f\"}", "function_call", true},
    };
    char body[512];
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++)
        for (int chat = 1; chat >= (set[i].chat_only ? 1 : 0); chat--) {
            snprintf(body, sizeof body, chat ? "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s}"
                                             : "{\"prompt\":\"hi\",%s}", set[i].field);
            assert_rejected(body, chat, set[i].param);
        }
    /* OpenAI's deprecated function calling, in the history too: tool_calls and role "tool" carry it */
    assert_rejected("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":null,"
                    "\"function_call\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}", true, "messages[1].function_call");
    static const char *const defaults =
        "\"include_stop_str_in_output\":false,\"stop_token_ids\":[],\"use_beam_search\":false,"
        "\"prompt_logprobs\":null,\"guided_json\":null,\"guided_regex\":null,\"guided_choice\":null,"
        "\"guided_grammar\":null,\"structured_outputs\":null,\"grammar\":\"\",\"json_schema\":null,"
        "\"regex\":null,\"ebnf\":null,\"best_of\":1,\"functions\":[],\"function_call\":null";
    for (int chat = 0; chat < 2; chat++) {
        snprintf(body, sizeof body, chat ? "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"echo\":false,%s}"
                                         : "{\"prompt\":\"hi\",%s}", defaults);
        lily_oai_request req;
        lily_oai_error e;
        if (!parse(body, chat, &req, &e)) {
            print_error("refused (%s): %s\n", e.message, body);
            fail();
        }
        lily_oai_request_free(&req);
    }
}

/* Every prefix of a full request, and every single-byte corruption of it, parses or fails cleanly. */
static void test_openai_truncated_and_corrupted_bodies_never_crash(void **state)
{
    (void)state;
    const char *full =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":"
        "[{\"type\":\"text\",\"text\":\"hi\"}]},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":"
        "\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\","
        "\"tool_call_id\":\"c\",\"content\":\"r\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
        "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}},\"stop\":[\"x\"],\"logit_bias\":"
        "{\"1\":2},\"seed\":1,\"stream\":true,\"stream_options\":{\"include_usage\":true},\"logprobs\":true,"
        "\"top_logprobs\":2,\"chat_template_kwargs\":{\"enable_thinking\":false}}";
    size_t n = strlen(full);
    lily_oai_request req;
    lily_oai_error e;
    assert_true(lily_oai_parse_request(full, n, true, &req, &e));
    lily_oai_request_free(&req);
    char *buf = malloc(n + 1);
    static const char replacements[] = {'"', '{', '}', '[', ']', ',', ':', '0', 'x', '\\', '\0', '-'};
    int accepted = 0;
    for (size_t cut = 0; cut < n; cut++)
        if (lily_oai_parse_request(full, cut, true, &req, &e)) {
            accepted++;
            lily_oai_request_free(&req);
        } else {
            assert_int_equal(e.http_status, 400);
        }
    assert_int_equal(accepted, 0); /* no proper prefix of an object is JSON */
    for (size_t i = 0; i < n; i++)
        for (size_t r = 0; r < sizeof replacements; r++) {
            memcpy(buf, full, n);
            buf[i] = replacements[r];
            bool ok = lily_oai_parse_request(buf, n, true, &req, &e);
            if (ok)
                lily_oai_request_free(&req);
            else
                assert_int_equal(e.http_status, 400);
            ok = lily_oai_parse_request(buf, n, false, &req, &e);
            if (ok)
                lily_oai_request_free(&req);
        }
    free(buf);
}

/* jansson allocations not yet freed (json_set_alloc_funcs) */
static long live_json_allocs;
static void *counting_malloc(size_t n)
{
    live_json_allocs++;
    return malloc(n);
}
static void counting_free(void *p)
{
    if (p)
        live_json_allocs--;
    free(p);
}

/* The lossy path of lily_oai_string (invalid UTF-8) frees every string it builds: it once leaked one per
 * multi-byte character. U+0000 is kept (JSON carries it as \u0000). */
static void test_openai_string_lossy_path_frees_everything(void **state)
{
    (void)state;
    json_set_alloc_funcs(counting_malloc, counting_free);
    live_json_allocs = 0;
    static const char text[] = "\xC3\xA9\xC3\xA9\xE2\x82\xAC-\xF0\x9F\x98\x80\x00z\xC3"; /* ends cut inside an 'é' */
    json_t *j = lily_oai_string(text, sizeof text - 1);
    assert_non_null(j);
    assert_int_equal(json_string_length(j), 2 + 2 + 3 + 1 + 4 + 1 + 1 + 3);
    assert_memory_equal(json_string_value(j), "\xC3\xA9\xC3\xA9\xE2\x82\xAC-\xF0\x9F\x98\x80\x00z\xEF\xBF\xBD", 18);
    json_decref(j);
    assert_int_equal(live_json_allocs, 0);
    json_set_alloc_funcs(malloc, free);
}

/* An error message longer than its buffer is cut on a character boundary, and quoted client text too. */
static void test_openai_error_messages_cut_on_a_character(void **state)
{
    (void)state;
    char long_text[2000] = "a";
    for (int i = 0; i < 900; i++)
        strcat(long_text + 1 + 2 * i, "\xC3\xA9");
    lily_oai_error e;
    lily_oai_error_set(&e, 400, NULL, NULL, NULL, "%s", long_text);
    size_t n = strlen(e.message);
    assert_true(n >= sizeof e.message - 4);
    assert_int_equal(n % 2, 1); /* "a" then whole 2-byte characters */
    json_t *j = json_stringn(e.message, n);
    assert_non_null(j); /* valid UTF-8 as it is */
    json_decref(j);
    assert_int_equal(lily_oai_utf8_cut("ab\xE2\x82", 4), 2);
    assert_int_equal(lily_oai_utf8_cut("ab\xE2\x82\xAC", 5), 5);
    assert_int_equal(lily_oai_utf8_cut("ab\xF0\x9F\x98", 5), 2);
    assert_int_equal(lily_oai_utf8_cut("abc", 3), 3);

    char body[2100];
    long_text[1 + 2 * 100] = 0; /* "a" and 100 'é': quoted cut at 64 bytes, inside a character */
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"%s\",\"content\":\"x\"}]}", long_text);
    lily_oai_request req;
    assert_false(parse(body, true, &req, &e));
    assert_null(strstr(e.message, "\xEF\xBF\xBD"));
    j = json_string(e.message);
    assert_non_null(j);
    json_decref(j);
}

/* Tool names as OpenAI allows them: ^[a-zA-Z0-9_-]{1,64}$, in tools and a named tool_choice. */
static void test_openai_tool_names_validated(void **state)
{
    (void)state;
    static const char *const bad_names[] = {"<|im_end|>", "a</function>", "get weather", "f\\u0000", "caf\xC3\xA9",
                                            "a.b",
                                            "x123456789012345678901234567890123456789012345678901234567890123456"};
    char body[512];
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
                 "\"function\",\"function\":{\"name\":\"%s\"}}]}", bad_names[i]);
        assert_rejected(body, true, "tools[0]");
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
                 "\"function\",\"function\":{\"name\":\"ok\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":"
                 "{\"name\":\"%s\"}}}", bad_names[i]);
        assert_rejected(body, true, "tool_choice");
    }
    lily_oai_request req;
    lily_oai_error e;
    assert_true(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
                      "\"function\":{\"name\":\"Get_Weather-2\"}}],\"tool_choice\":{\"type\":\"function\","
                      "\"function\":{\"name\":\"Get_Weather-2\"}}}",
                      true, &req, &e));
    assert_int_equal(req.tool_choice, LILY_TOOL_CHOICE_NAMED);
    lily_oai_request_free(&req);
}

/* A small body cannot make a big document: nesting and the number of values are checked on the text
 * before jansson builds anything; U+0000 in strings is accepted (lily may write it in a reply). */
static void test_openai_body_bounds_and_nul(void **state)
{
    (void)state;
    size_t cap = 4u << 20;
    char *body = malloc(cap);
    assert_non_null(body);
    /* 300000 ignored values */
    size_t n = (size_t)sprintf(body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"x\":[0");
    for (int i = 0; i < 300000; i++)
        n += (size_t)sprintf(body + n, ",0");
    sprintf(body + n, "]}");
    lily_oai_request req;
    lily_oai_error e;
    json_set_alloc_funcs(counting_malloc, counting_free);
    live_json_allocs = 0;
    long peak_before = live_json_allocs;
    assert_false(parse(body, true, &req, &e));
    assert_int_equal(live_json_allocs, peak_before); /* nothing was built */
    json_set_alloc_funcs(malloc, free);
    assert_int_equal(e.http_status, 400);
    assert_non_null(strstr(e.message, "more than 262144 values"));
    /* a comma inside a string is no value */
    n = (size_t)sprintf(body, "{\"messages\":[{\"role\":\"user\",\"content\":\"");
    for (int i = 0; i < 300000; i++)
        body[n++] = ',';
    sprintf(body + n, "\"}]}");
    assert_true(parse(body, true, &req, &e));
    lily_oai_request_free(&req);
    /* 65 levels */
    n = (size_t)sprintf(body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"x\":");
    for (int i = 0; i < 65; i++)
        body[n++] = '[';
    for (int i = 0; i < 65; i++)
        body[n++] = ']';
    sprintf(body + n, "}");
    assert_false(parse(body, true, &req, &e));
    assert_non_null(strstr(e.message, "deeper than 64 levels"));
    free(body);

    assert_true(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", true, &req, &e));
    assert_int_equal(json_string_length(json_object_get(json_array_get(req.messages, 0), "content")), 3);
    lily_oai_request_free(&req);
    assert_true(parse("{\"prompt\":\"a\\u0000b\"}", false, &req, &e));
    assert_int_equal(req.prompt_text_len, 3);
    assert_memory_equal(req.prompt_text, "a\0b", 3);
    lily_oai_request_free(&req);
    assert_rejected("{\"prompt\":\"a\",\"stop\":[\"x\\u0000y\"]}", false, "stop");
}

/* RFC 8259 §8.1: a parser may ignore a byte order mark; vLLM (Python's json.loads on bytes) and llama.cpp
 * (nlohmann::json) do; a body file Windows PowerShell wrote with -Encoding utf8 starts with one. Only at the
 * start: a BOM elsewhere is still text (inside a string) or an error (between tokens). */
static void test_openai_body_with_utf8_bom(void **state)
{
    (void)state;
    lily_oai_request req;
    lily_oai_error e;
    assert_true(parse("\xEF\xBB\xBF{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3}", true,
                      &req, &e));
    assert_int_equal(req.max_tokens, 3);
    lily_oai_request_free(&req);
    assert_true(parse("\xEF\xBB\xBF{\"prompt\":\"a\xEF\xBB\xBF\"}", false, &req, &e));
    assert_int_equal(req.prompt_text_len, 4);
    lily_oai_request_free(&req);
    assert_false(parse("\xEF\xBB\xBF\xEF\xBB\xBF{\"prompt\":\"a\"}", false, &req, &e));
    assert_int_equal(e.http_status, 400);
    assert_false(parse("{\"prompt\":\xEF\xBB\xBF\"a\"}", false, &req, &e));
    assert_false(parse("\xEF\xBB", false, &req, &e));
    assert_false(parse("\xEF\xBB\xBF", false, &req, &e));
    assert_non_null(strstr(e.message, "could not parse"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_openai_request_defaults_are_unset),
        cmocka_unit_test(test_openai_request_fields),
        cmocka_unit_test(test_openai_tool_choice),
        cmocka_unit_test(test_openai_rejects_bad_requests),
        cmocka_unit_test(test_openai_refuses_unimplemented_extensions),
        cmocka_unit_test(test_openai_completions_prompt_forms),
        cmocka_unit_test(test_openai_error_json),
        cmocka_unit_test(test_openai_chat_response_shape),
        cmocka_unit_test(test_openai_chat_response_keeps_big_integer_arguments),
        cmocka_unit_test(test_openai_chunk_shapes),
        cmocka_unit_test(test_openai_logprobs_and_invalid_utf8),
        cmocka_unit_test(test_openai_truncated_and_corrupted_bodies_never_crash),
        cmocka_unit_test(test_openai_string_lossy_path_frees_everything),
        cmocka_unit_test(test_openai_error_messages_cut_on_a_character),
        cmocka_unit_test(test_openai_tool_names_validated),
        cmocka_unit_test(test_openai_body_bounds_and_nul),
        cmocka_unit_test(test_openai_body_with_utf8_bom),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
