/* test_server_responses_format.c — server/responses.c: a Responses request translated into the chat request
 * the engine runs (instructions, input items of a tool round trip, flat tools, tool_choice, text.format,
 * reasoning.effort, max_output_tokens), its 400s in OpenAI's error shape, the Response object, the stream's
 * event sequence with its sequence_numbers, and the in-band error event of a stream (scheduler.c). */
#include <stdlib.h>
#include <string.h>

#include "server/responses.h"
#include "server/scheduler.h"
#include "text/chat_template.h"
#include "test_support.h"

static char *compact(const json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
    assert_non_null(s);
    return s;
}

static void assert_json(const json_t *j, const char *want)
{
    if (!j)
        fail_msg("got NULL, want %s", want);
    char *s = compact(j);
    if (strcmp(s, want))
        fail_msg("got  %s\nwant %s", s, want);
    free(s);
}

static void test_translation_of_a_tool_round_trip(void **state)
{
    (void)state;
    const char *body =
        "{\"model\":\"m\",\"instructions\":\"Be brief.\",\"input\":["
        "{\"role\":\"developer\",\"content\":\"Use tools.\"},"
        "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"Weather \"},"
        "{\"type\":\"input_text\",\"text\":\"in Paris?\"}]},"
        "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\",\"text\":\"hm\"}]},"
        "{\"type\":\"message\",\"id\":\"msg_1\",\"role\":\"assistant\",\"status\":\"completed\",\"content\":"
        "[{\"type\":\"output_text\",\"text\":\"Let me look.\",\"annotations\":[]}]},"
        "{\"type\":\"function_call\",\"id\":\"fc_1\",\"call_id\":\"call_1\",\"name\":\"get\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"},"
        "{\"type\":\"function_call\",\"call_id\":\"call_2\",\"name\":\"get\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"sunny\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_2\",\"output\":[{\"type\":\"input_text\",\"text\":\"rain\"}]},"
        "{\"role\":\"assistant\",\"content\":\"Sunny.\"},{\"role\":\"user\",\"content\":\"Thanks\"}],"
        "\"tools\":[{\"type\":\"function\",\"name\":\"get\",\"description\":\"weather\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}},\"strict\":true}],"
        "\"tool_choice\":{\"type\":\"function\",\"name\":\"get\"},\"parallel_tool_calls\":false,"
        "\"max_output_tokens\":77,\"temperature\":0.5,\"top_p\":0.9,\"metadata\":{\"k\":\"v\"},\"store\":true,"
        "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"W\",\"schema\":{\"type\":\"object\"},"
        "\"strict\":true}},\"reasoning\":{\"effort\":\"none\"},\"include\":[\"reasoning.encrypted_content\"],"
        "\"some_unknown_field\":1}";
    lily_oai_request req;
    lily_oai_error e;
    if (!lily_resp_parse_request(body, strlen(body), &req, &e))
        fail_msg("rejected: %s", e.message);
    assert_true(req.is_chat && req.responses && !req.anthropic);
    assert_json(req.messages,
                "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"developer\",\"content\":\"Use tools.\"},"
                "{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
                "{\"role\":\"assistant\",\"content\":\"Let me look.\",\"reasoning_content\":\"hm\",\"tool_calls\":["
                "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get\",\"arguments\":"
                "\"{\\\"city\\\":\\\"Paris\\\"}\"}},{\"id\":\"call_2\",\"type\":\"function\",\"function\":"
                "{\"name\":\"get\",\"arguments\":\"{}\"}}]},"
                "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"sunny\"},"
                "{\"role\":\"tool\",\"tool_call_id\":\"call_2\",\"content\":\"rain\"},"
                "{\"role\":\"assistant\",\"content\":\"Sunny.\"},{\"role\":\"user\",\"content\":\"Thanks\"}]");
    assert_json(req.tools, "[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":{\"type\":"
                           "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}},\"description\":\"weather\","
                           "\"strict\":true}}]");
    assert_int_equal(req.tool_choice, LILY_TOOL_CHOICE_NAMED);
    assert_string_equal(req.tool_name, "get");
    assert_true(req.single_tool_call);
    assert_int_equal(req.max_tokens, 77);
    assert_true(req.temperature == 0.5 && req.top_p == 0.9);
    assert_true(req.json_output);
    assert_json(req.json_schema, "{\"type\":\"object\"}");
    assert_int_equal(req.enable_thinking, 0); /* reasoning.effort none, as the chat route's reasoning_effort */
    assert_false(req.stream);
    /* the echo: the request's values */
    assert_json(json_object_get(req.responses, "metadata"), "{\"k\":\"v\"}");
    assert_string_equal(json_string_value(json_object_get(req.responses, "instructions")), "Be brief.");
    assert_int_equal(json_integer_value(json_object_get(req.responses, "max_output_tokens")), 77);
    assert_json(json_object_get(req.responses, "tool_choice"), "{\"type\":\"function\",\"name\":\"get\"}");
    assert_json(json_object_get(req.responses, "reasoning"), "{\"effort\":\"none\",\"summary\":null}");
    assert_false(json_is_true(json_object_get(req.responses, "parallel_tool_calls")));
    lily_oai_request_free(&req);

    /* a string input is one user message; OpenAI's defaults in the echo */
    const char *plain = "{\"model\":\"m\",\"input\":\"hi\",\"stream\":true}";
    assert_true(lily_resp_parse_request(plain, strlen(plain), &req, &e));
    assert_json(req.messages, "[{\"role\":\"user\",\"content\":\"hi\"}]");
    assert_true(req.stream);
    assert_int_equal(req.max_tokens, -1);
    assert_int_equal(req.enable_thinking, -1); /* the template's default, as the chat route */
    assert_json(json_object_get(req.responses, "metadata"), "{}");
    assert_json(json_object_get(req.responses, "text"), "{\"format\":{\"type\":\"text\"}}");
    assert_json(json_object_get(req.responses, "tool_choice"), "\"auto\"");
    assert_json(json_object_get(req.responses, "tools"), "[]");
    assert_true(json_is_true(json_object_get(req.responses, "parallel_tool_calls")));
    assert_true(json_is_null(json_object_get(req.responses, "instructions")));
    lily_oai_request_free(&req);

    /* json_object, tool_choice required, a reasoning item's summary when it has no content */
    const char *other = "{\"input\":[{\"role\":\"user\",\"content\":\"q\"},{\"type\":\"reasoning\",\"summary\":"
                        "[{\"type\":\"summary_text\",\"text\":\"a\"},{\"type\":\"summary_text\",\"text\":\"b\"}]},"
                        "{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"t\",\"arguments\":\"{}\"}],"
                        "\"tools\":[{\"type\":\"function\",\"name\":\"t\"}],\"tool_choice\":\"required\","
                        "\"text\":{\"format\":{\"type\":\"json_object\"}}}";
    assert_true(lily_resp_parse_request(other, strlen(other), &req, &e));
    assert_json(req.messages, "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"\","
                              "\"reasoning_content\":\"a\\nb\",\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\","
                              "\"function\":{\"name\":\"t\",\"arguments\":\"{}\"}}]}]");
    assert_int_equal(req.tool_choice, LILY_TOOL_CHOICE_REQUIRED);
    assert_true(req.json_output && !req.json_schema);
    lily_oai_request_free(&req);

    /* a developer item after a user turn stays where it is (rendering joins it to the system block) */
    const char *late = "{\"instructions\":\"\",\"input\":[{\"role\":\"user\",\"content\":\"q\"},"
                       "{\"role\":\"developer\",\"content\":\"late\"}]}";
    assert_true(lily_resp_parse_request(late, strlen(late), &req, &e));
    assert_json(req.messages, "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"developer\",\"content\":"
                              "\"late\"}]");
    lily_oai_request_free(&req);
}

static void assert_rejected(const char *body, const char *param, const char *needle)
{
    lily_oai_request req;
    lily_oai_error e;
    if (lily_resp_parse_request(body, strlen(body), &req, &e))
        fail_msg("accepted: %s", body);
    assert_int_equal(e.http_status, 400);
    assert_string_equal(e.type, "invalid_request_error");
    if (strcmp(e.param, param))
        fail_msg("param '%s' (want '%s') for %s: %s", e.param, param, body, e.message);
    if (!strstr(e.message, needle))
        fail_msg("'%s' not in: %s", needle, e.message);
    assert_null(req.responses);
    lily_oai_request_free(&req);
}

static void test_bad_requests_name_the_responses_field(void **state)
{
    (void)state;
    assert_rejected("{\"input\":", "", "JSON");
    assert_rejected("[1]", "", "expected a JSON object, but got an array");
    assert_rejected("{\"model\":\"m\"}", "input", "Missing required parameter: 'input'");
    assert_rejected("{\"input\":5}", "input", "expected a string or an array of input items, but got an integer");
    assert_rejected("{\"input\":[]}", "input", "empty array");
    assert_rejected("{\"input\":\"hi\",\"previous_response_id\":\"resp_1\"}", "previous_response_id", "stateless");
    assert_rejected("{\"input\":\"hi\",\"conversation\":\"conv_1\"}", "conversation", "stateless");
    assert_rejected("{\"input\":\"hi\",\"background\":true}", "background", "stateless");
    assert_rejected("{\"input\":\"hi\",\"store\":\"yes\"}", "store", "expected a boolean");
    assert_rejected("{\"input\":\"hi\",\"metadata\":{\"k\":1}}", "metadata", "expected a string value");
    assert_rejected("{\"input\":\"hi\",\"instructions\":[1]}", "instructions", "expected a string");
    assert_rejected("{\"input\":[{\"role\":\"robot\",\"content\":\"x\"}]}", "input[0].role", "'user'");
    assert_rejected("{\"input\":[{\"role\":\"user\"}]}", "input[0].content", "Missing required parameter");
    assert_rejected("{\"input\":[{\"role\":\"system\"}]}", "input[0].content", "Missing required parameter");
    assert_rejected("{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"t\",\"arguments\":\"{}\"},"
                    "{\"type\":\"function_call_output\",\"call_id\":\"c\"}]}", "input[1].output",
                    "Missing required parameter");
    assert_rejected("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"u\"}]}]}",
                    "input[0].content[0]", "this model takes text only");
    assert_rejected("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":5}]}]}",
                    "input[0].content[0]", "'input[0].content[0].text': expected a string");
    assert_rejected("{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c9\",\"output\":\"x\"}]}",
                    "input[0].call_id", "No tool call found for function call output with call_id 'c9'");
    assert_rejected("{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"t\"}]}",
                    "input[0].arguments", "needs the strings");
    assert_rejected("{\"input\":[{\"type\":\"item_reference\",\"id\":\"msg_1\"}]}", "input[0]", "stateless");
    assert_rejected("{\"input\":[{\"type\":\"computer_call\"}]}", "input[0]", "'computer_call'");
    assert_rejected("{\"input\":\"hi\",\"tools\":[{\"type\":\"web_search\"}]}", "tools[0]",
                    "only 'function' tools are supported");
    assert_rejected("{\"input\":\"hi\",\"tools\":[{\"type\":\"function\",\"name\":\"a b\"}]}", "tools[0]",
                    "does not match");
    assert_rejected("{\"input\":\"hi\",\"tools\":[{\"type\":\"function\",\"name\":\"t\"},{\"type\":\"function\","
                    "\"name\":\"t\"}]}", "tools[1]", "given twice");
    assert_rejected("{\"input\":\"hi\",\"tools\":[{\"type\":\"function\",\"name\":\"t\",\"parameters\":5}]}",
                    "tools[0]", "parameters");
    assert_rejected("{\"input\":\"hi\",\"tools\":[{\"type\":\"function\",\"name\":\"t\"}],\"tool_choice\":"
                    "{\"type\":\"function\",\"name\":\"u\"}}", "tool_choice", "no function named 'u'");
    assert_rejected("{\"input\":\"hi\",\"tool_choice\":\"required\"}", "tool_choice", "only allowed when 'tools'");
    assert_rejected("{\"input\":\"hi\",\"tools\":[{\"type\":\"function\",\"name\":\"t\"}],\"tool_choice\":"
                    "{\"type\":\"allowed_tools\"}}", "tool_choice", "Invalid 'tool_choice'");
    assert_rejected("{\"input\":\"hi\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"x\"}}}",
                    "text.format.schema", "expected a JSON schema object");
    assert_rejected("{\"input\":\"hi\",\"text\":{\"format\":{\"type\":\"grammar\"}}}", "text.format.type",
                    "'grammar'");
    assert_rejected("{\"input\":\"hi\",\"max_output_tokens\":0}", "max_output_tokens", ">= 1");
    assert_rejected("{\"input\":\"hi\",\"max_output_tokens\":\"5\"}", "max_output_tokens", ">= 1");
    assert_rejected("{\"input\":\"hi\",\"temperature\":\"hot\"}", "temperature", "expected a number");
    assert_rejected("{\"input\":\"hi\",\"top_p\":3}", "top_p", "outside");
    assert_rejected("{\"input\":\"hi\",\"reasoning\":{\"effort\":\"max\"}}", "reasoning.effort", "'low'");
    assert_rejected("{\"input\":\"hi\",\"stream\":1}", "stream", "expected a boolean");
}

/* The chat template's error for a Responses request, through lily_resp_template_error. */
static void assert_template_error(const char *body, const char *param, const char *needle)
{
    lily_oai_request req;
    lily_oai_error e;
    if (!lily_resp_parse_request(body, strlen(body), &req, &e))
        fail_msg("rejected: %s", e.message);
    json_t *treq = lily_oai_template_request(&req);
    lily_chat_options co;
    lily_chat_options_init(&co);
    co.fold_system = 1; /* as the server renders */
    char *prompt = NULL;
    size_t len = 0;
    lily_error err = {0};
    assert_int_equal(lily_chat_render_n(treq, &co, &prompt, &len, &err), LILY_ERR_TEMPLATE);
    json_decref(treq);
    lily_resp_template_error(&req, err.message, &e);
    assert_int_equal(e.http_status, 400);
    assert_string_equal(e.type, "invalid_request_error");
    if (strcmp(e.param, param) || !strstr(e.message, needle))
        fail_msg("param '%s' (want '%s'), message '%s' (want it to hold '%s')", e.param, param, e.message, needle);
    lily_oai_request_free(&req);
}

/* A template error names the input item sent (input[4]), not the chat message it became (messages[2]). */
static void test_template_errors_name_the_input_item(void **state)
{
    (void)state;
    /* items 2..4 are one assistant message (messages[2] after the instructions' and the user's) */
    const char *calls = "{\"instructions\":\"Be brief.\",\"input\":[{\"role\":\"user\",\"content\":\"q\"},"
                        "{\"type\":\"reasoning\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"a\"}]},"
                        "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"t\",\"arguments\":\"{}\"},"
                        "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"t\",\"arguments\":\"%s\"},"
                        "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"x\"},"
                        "{\"role\":\"user\",\"content\":\"r\"}]}";
    char body[1024];
    snprintf(body, sizeof body, calls, "{\\\"a\\\":");
    assert_template_error(body, "input[3].arguments", "chat template: input[3].arguments: not valid JSON");
    snprintf(body, sizeof body, calls, "[1]");
    assert_template_error(body, "input[3].arguments", "chat template: input[3].arguments: expected a JSON object");
    /* an error of a whole message names its first item; one of no message keeps param input */
    lily_oai_request req;
    lily_oai_error e;
    snprintf(body, sizeof body, calls, "{}");
    assert_true(lily_resp_parse_request(body, strlen(body), &req, &e));
    lily_resp_template_error(&req, "chat template: messages[2]: something", &e);
    assert_string_equal(e.param, "input[1]");
    assert_string_equal(e.message, "chat template: input[1]: something");
    lily_resp_template_error(&req, "chat template: messages[4]: something", &e);
    assert_string_equal(e.param, "input[5]");
    lily_resp_template_error(&req, "chat template: messages[0]: something", &e);
    assert_string_equal(e.param, "instructions");
    lily_resp_template_error(&req, "chat template: No user query found in messages", &e);
    assert_string_equal(e.param, "input");
    assert_string_equal(e.message, "chat template: No user query found in messages");
    lily_oai_request_free(&req);

    /* the second assistant turn's second call, after a tool result, a late developer item and no instructions:
     * items 5..7 are messages[5] (user, fco, user, developer, then this turn), its tool_calls[1] input[7] */
    const char *later = "{\"input\":[{\"role\":\"user\",\"content\":\"q\"},"
                        "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"t\",\"arguments\":\"{}\"},"
                        "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"x\"},"
                        "{\"role\":\"user\",\"content\":\"r\"},{\"role\":\"developer\",\"content\":\"d\"},"
                        "{\"type\":\"reasoning\",\"summary\":[]},"
                        "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"t\",\"arguments\":\"{}\"},"
                        "{\"type\":\"function_call\",\"call_id\":\"c3\",\"name\":\"t\",\"arguments\":\"7\"},"
                        "{\"type\":\"function_call_output\",\"call_id\":\"c3\",\"output\":\"y\"}]}";
    assert_template_error(later, "input[7].arguments", "chat template: input[7].arguments: expected a JSON object");
    /* an index past the messages, or a call index past the turn's calls: param input / the turn's first item */
    assert_true(lily_resp_parse_request(later, strlen(later), &req, &e));
    lily_resp_template_error(&req, "chat template: messages[99]: x", &e);
    assert_string_equal(e.param, "input");
    lily_resp_template_error(&req, "chat template: messages[5]: tool_calls[9]: x", &e);
    assert_string_equal(e.param, "input[5]");
    lily_resp_template_error(&req, "chat template: messages[18446744073709551615]: x", &e);
    assert_string_equal(e.param, "input");
    lily_oai_request_free(&req);
}

/* What a careless client sends: each a 400, never a crash (a content part without its text once read the type
 * of a missing field: a NULL dereference in the server). */
static void test_hostile_requests_are_400s(void **state)
{
    (void)state;
    assert_rejected("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\"}]}]}",
                    "input[0].content[0]", "expected a string, but got nothing");
    assert_rejected("{\"input\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"refusal\"}]}]}",
                    "input[0].content[0]", "'input[0].content[0].refusal': expected a string, but got nothing");
    assert_rejected("{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"t\",\"arguments\":\"{}\"},"
                    "{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":[{\"type\":\"output_text\"}]}]}",
                    "input[1].output[0]", "got nothing");
    /* a field the Response echoes keeps its type there: a typed client reads user as a string or null */
    assert_rejected("{\"input\":\"hi\",\"user\":5}", "user", "expected a string, but got an integer");
    /* a chat field's bound is named by its Responses name, not the chat route's max_tokens */
    assert_rejected("{\"input\":\"hi\",\"max_output_tokens\":4611686018427387904}", "max_output_tokens", "<= 2147483647");
}

static const lily_oai_ident IDENT = {.id = "resp_R", .created = 123, .model = "m"};

/* The types of out[0..n) appended to types ("a,b,"), each event's sequence_number checked to follow *seq. */
static void collect(json_t **out, int n, char *types, size_t cap, int *seq)
{
    for (int i = 0; i < n; i++) {
        assert_non_null(out[i]);
        assert_int_equal(json_integer_value(json_object_get(out[i], "sequence_number")), (*seq)++);
        strncat(types, json_string_value(json_object_get(out[i], "type")), cap - strlen(types) - 2);
        strcat(types, ",");
    }
}

/* Reasoning, content, then a tool call, fed to a builder; out NULL: no events. Returns the events' types. */
static void feed(lily_resp_output *o, bool stream, char *types, size_t cap, json_t **last_done)
{
    const lily_output_event evs[] = {
        {LILY_OUTPUT_REASONING, -1, "th", 2, false},  {LILY_OUTPUT_REASONING, -1, "ink", 3, false},
        {LILY_OUTPUT_CONTENT, -1, "Hel", 3, false},   {LILY_OUTPUT_CONTENT, -1, "lo", 2, false},
        {LILY_OUTPUT_TOOL_CALL_START, 0, "get", 3, false}, {LILY_OUTPUT_TOOL_ARGUMENTS, 0, "{\"a\"", 4, false},
        {LILY_OUTPUT_TOOL_ARGUMENTS, 0, ":1}", 3, false},  {LILY_OUTPUT_TOOL_CALL_END, 0, "", 0, false},
    };
    int seq = o->seq;
    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++) {
        json_t *out[LILY_RESP_MAX_EVENTS] = {0};
        int n = lily_resp_output_event(o, &evs[i], "call_X", stream ? out : NULL);
        if (!stream) {
            assert_int_equal(n, 0);
            continue;
        }
        collect(out, n, types, cap, &seq);
        for (int k = 0; k < n; k++) {
            if (!strcmp(json_string_value(json_object_get(out[k], "type")), "response.output_item.done")) {
                json_decref(*last_done);
                *last_done = json_incref(out[k]);
            }
            json_decref(out[k]);
        }
    }
}

static void test_stream_events_and_the_response(void **state)
{
    (void)state;
    json_t *echo = json_pack("{s:{s:s}, s:s}", "metadata", "k", "v", "tool_choice", "auto");
    lily_resp_output o;
    assert_true(lily_resp_output_init(&o, &IDENT, echo));
    char types[2048] = "";
    int seq = 0;
    json_t *out[LILY_RESP_MAX_EVENTS] = {0};
    int n = lily_resp_stream_start(&o, out);
    assert_int_equal(n, 2);
    assert_json(out[0], "{\"type\":\"response.created\",\"response\":{\"id\":\"resp_R\",\"object\":\"response\","
                        "\"created_at\":123,\"status\":\"in_progress\",\"error\":null,\"incomplete_details\":null,"
                        "\"model\":\"m\",\"output\":[],\"usage\":null,\"store\":false,\"previous_response_id\":null,"
                        "\"metadata\":{\"k\":\"v\"},\"tool_choice\":\"auto\"},\"sequence_number\":0}");
    collect(out, n, types, sizeof types, &seq);
    json_decref(out[0]);
    json_decref(out[1]);
    json_t *last_done = NULL;
    feed(&o, true, types, sizeof types, &last_done);
    assert_string_equal(types,
                        "response.created,response.in_progress,"
                        "response.output_item.added,response.content_part.added,response.reasoning_text.delta,"
                        "response.reasoning_text.delta,"
                        "response.reasoning_text.done,response.content_part.done,response.output_item.done,"
                        "response.output_item.added,response.content_part.added,response.output_text.delta,"
                        "response.output_text.delta,"
                        "response.output_text.done,response.content_part.done,response.output_item.done,"
                        "response.output_item.added,response.function_call_arguments.delta,"
                        "response.function_call_arguments.delta,"
                        "response.function_call_arguments.done,response.output_item.done,");
    assert_json(last_done, "{\"type\":\"response.output_item.done\",\"output_index\":2,\"item\":{\"id\":\"fc_R2\","
                           "\"type\":\"function_call\",\"call_id\":\"call_X\",\"name\":\"get\",\"arguments\":"
                           "\"{\\\"a\\\":1}\",\"status\":\"completed\"},\"sequence_number\":20}");
    json_decref(last_done);
    lily_oai_usage u = {.prompt_tokens = 10, .completion_tokens = 7, .cached_tokens = 4, .reasoning_tokens = 2};
    n = lily_resp_output_end(&o, false, &u, out);
    assert_int_equal(n, 1); /* no item was open */
    const char *output =
        "[{\"id\":\"rs_R0\",\"type\":\"reasoning\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\","
        "\"text\":\"think\"}],\"status\":\"completed\"},{\"id\":\"msg_R1\",\"type\":\"message\",\"status\":"
        "\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hello\","
        "\"annotations\":[],\"logprobs\":[]}]},{\"id\":\"fc_R2\",\"type\":\"function_call\",\"call_id\":\"call_X\","
        "\"name\":\"get\",\"arguments\":\"{\\\"a\\\":1}\",\"status\":\"completed\"}]";
    char want[4096];
    snprintf(want, sizeof want,
             "{\"type\":\"response.completed\",\"response\":{\"id\":\"resp_R\",\"object\":\"response\",\"created_at\":"
             "123,\"status\":\"completed\",\"error\":null,\"incomplete_details\":null,\"model\":\"m\",\"output\":%s,"
             "\"usage\":{\"input_tokens\":10,\"input_tokens_details\":{\"cached_tokens\":4},\"output_tokens\":7,"
             "\"output_tokens_details\":{\"reasoning_tokens\":2},\"total_tokens\":17},\"store\":false,"
             "\"previous_response_id\":null,\"metadata\":{\"k\":\"v\"},\"tool_choice\":\"auto\"},"
             "\"sequence_number\":21}", output);
    assert_json(out[0], want);
    json_decref(out[0]);
    size_t len = 0;
    json_t *ping = json_pack("{s:s, s:i}", "type", "response.in_progress", "sequence_number", 1);
    char *sse = lily_oai_sse_event(ping, &len);
    assert_string_equal(sse, "event: response.in_progress\ndata: {\"type\":\"response.in_progress\","
                             "\"sequence_number\":1}\n\n");
    assert_int_equal(len, strlen(sse));
    free(sse);
    json_decref(ping);
    lily_resp_output_free(&o);

    /* the same events, not streamed: the same output; cut by max_output_tokens inside the message: that item
     * and the response are incomplete */
    assert_true(lily_resp_output_init(&o, &IDENT, echo));
    feed(&o, false, types, sizeof types, &last_done);
    assert_int_equal(lily_resp_output_end(&o, false, &u, NULL), 0);
    json_t *r = lily_resp_response(&o, "completed", &u);
    assert_json(json_object_get(r, "output"), output);
    json_decref(r);
    lily_resp_output_free(&o);

    assert_true(lily_resp_output_init(&o, &IDENT, echo));
    lily_output_event ev = {LILY_OUTPUT_CONTENT, -1, "cut", 3, false};
    assert_int_equal(lily_resp_output_event(&o, &ev, NULL, NULL), 0);
    n = lily_resp_output_end(&o, true, &u, out);
    assert_int_equal(n, 4); /* text done, part done, item done, response.incomplete */
    assert_string_equal(json_string_value(json_object_get(out[3], "type")), "response.incomplete");
    r = json_object_get(out[3], "response");
    assert_string_equal(json_string_value(json_object_get(r, "status")), "incomplete");
    assert_json(json_object_get(r, "incomplete_details"), "{\"reason\":\"max_output_tokens\"}");
    assert_json(json_object_get(json_array_get(json_object_get(r, "output"), 0), "status"), "\"incomplete\"");
    assert_json(json_object_get(out[0], "text"), "\"cut\"");
    for (int i = 0; i < n; i++)
        json_decref(out[i]);
    lily_resp_output_free(&o);

    /* a function call cut short (finish closed it: unfinished) is an incomplete item, not a completed call a
     * client would run with arguments as far as they got */
    assert_true(lily_resp_output_init(&o, &IDENT, echo));
    const lily_output_event cut[] = {{LILY_OUTPUT_TOOL_CALL_START, 0, "get", 3, false},
                                     {LILY_OUTPUT_TOOL_ARGUMENTS, 0, "{\"a\":\"\"}", 8, false},
                                     {LILY_OUTPUT_TOOL_CALL_END, 0, "", 0, true}};
    for (size_t i = 0; i < 3; i++) {
        n = lily_resp_output_event(&o, &cut[i], "call_X", out);
        if (i == 2) {
            assert_int_equal(n, 2); /* arguments done, item done */
            assert_json(json_object_get(json_object_get(out[1], "item"), "status"), "\"incomplete\"");
        }
        for (int k = 0; k < n; k++)
            json_decref(out[k]);
    }
    n = lily_resp_output_end(&o, true, &u, out);
    assert_int_equal(n, 1);
    assert_json(json_object_get(json_array_get(json_object_get(json_object_get(out[0], "response"), "output"), 0),
                                "status"), "\"incomplete\"");
    json_decref(out[0]);
    lily_resp_output_free(&o);
    json_decref(echo);
}

/* A builder fed by the output parser's events: streamed ones keep the last function_call_arguments.done. */
typedef struct {
    lily_resp_output *o;
    bool stream;
    json_t *args_done;
} parser_feed;

static void feed_event(void *user, const lily_output_event *ev)
{
    parser_feed *f = user;
    json_t *out[LILY_RESP_MAX_EVENTS] = {0};
    int n = lily_resp_output_event(f->o, ev, "call_X", f->stream ? out : NULL);
    for (int k = 0; k < n; k++) {
        if (!strcmp(json_string_value(json_object_get(out[k], "type")), "response.function_call_arguments.done")) {
            json_decref(f->args_done);
            f->args_done = json_incref(out[k]);
        }
        json_decref(out[k]);
    }
}

/* A tool call whose arguments hold integers past int64, in the JSON form and in the XML form with a schema that
 * takes integers: the function_call item's arguments, streamed (the .done event) and not (the Response), are
 * the model's digits, as the chat route gives them (never a double's digits, nor a string). */
static void test_function_call_keeps_big_integer_arguments(void **state)
{
    (void)state;
    static const char *const texts[] = {
        "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"id\": 18446744073709551615}}\n</tool_call>",
        "<tool_call>\n<function=get>\n<parameter=id>\n18446744073709551615\n</parameter>\n</function>\n"
        "</tool_call>",
    };
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":{\"type\":"
                               "\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}}}}}]", 0, NULL);
    assert_non_null(tools);
    json_t *echo = json_object();
    for (size_t t = 0; t < 2 * sizeof texts / sizeof texts[0]; t++) {
        const char *text = texts[t / 2];
        lily_resp_output o;
        assert_true(lily_resp_output_init(&o, &IDENT, echo));
        parser_feed f = {.o = &o, .stream = t % 2};
        lily_output_parser *p = NULL;
        lily_error err = {0};
        lily_output_parser_options opt = {.tools = tools, .on_event = feed_event, .user = &f};
        assert_int_equal(lily_output_parser_new(&opt, &p, &err), LILY_OK);
        assert_int_equal(lily_output_parser_feed(p, text, strlen(text), &err), LILY_OK);
        assert_int_equal(lily_output_parser_finish(p, false, &err), LILY_OK);
        lily_oai_usage u = {0};
        json_t *out[LILY_RESP_MAX_EVENTS] = {0};
        int n = lily_resp_output_end(&o, false, &u, f.stream ? out : NULL);
        for (int k = 0; k < n; k++)
            json_decref(out[k]);
        json_t *r = lily_resp_response(&o, "completed", &u);
        assert_json(json_object_get(json_array_get(json_object_get(r, "output"), 0), "arguments"),
                    "\"{\\\"id\\\":18446744073709551615}\"");
        if (f.stream)
            assert_json(json_object_get(f.args_done, "arguments"), "\"{\\\"id\\\":18446744073709551615}\"");
        json_decref(f.args_done);
        json_decref(r);
        lily_output_parser_free(p);
        lily_resp_output_free(&o);
    }
    json_decref(echo);
    json_decref(tools);
}

/* A stream that fails after it began gets the Responses API's "error" event, numbered after the last event
 * sent (scheduler.c, lily_job_fail). */
static void test_stream_error_is_an_error_event(void **state)
{
    (void)state;
    lily_job *job = lily_job_new(LILY_ROUTE_CHAT);
    assert_non_null(job);
    job->req.responses = json_object();
    lily_job_begin(job, 200, true);
    assert_int_equal(lily_job_write(job, "event: x\n\n", 10), LILY_OK);
    job->sequence_number = 7;
    lily_oai_error e;
    lily_oai_error_set(&e, 503, "unavailable_error", NULL, NULL, "shutting down");
    lily_job_abort(job);
    lily_job_fail(job, &e);
    size_t len;
    char *out = lily_job_take_output(job, &len);
    assert_int_equal(job->http_status, 200);
    assert_string_equal(out, "event: x\n\nevent: error\ndata: {\"type\":\"error\",\"code\":\"unavailable_error\","
                             "\"message\":\"shutting down\",\"param\":null,\"sequence_number\":7}\n\n");
    free(out);
    lily_oai_request_free(&job->req);
    lily_job_unref(job);

    /* before the stream began: the whole answer is OpenAI's error JSON with the status */
    job = lily_job_new(LILY_ROUTE_CHAT);
    assert_non_null(job);
    job->req.responses = json_object();
    lily_oai_error_set(&e, 400, "invalid_request_error", "input", "context_length_exceeded", "too long");
    lily_job_fail(job, &e);
    out = lily_job_take_output(job, &len);
    assert_int_equal(job->http_status, 400);
    assert_string_equal(out, "{\"error\":{\"message\":\"too long\",\"type\":\"invalid_request_error\",\"param\":"
                             "\"input\",\"code\":\"context_length_exceeded\"}}");
    free(out);
    lily_oai_request_free(&job->req);
    lily_job_unref(job);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_translation_of_a_tool_round_trip),
        cmocka_unit_test(test_bad_requests_name_the_responses_field),
        cmocka_unit_test(test_template_errors_name_the_input_item),
        cmocka_unit_test(test_hostile_requests_are_400s),
        cmocka_unit_test(test_stream_events_and_the_response),
        cmocka_unit_test(test_function_call_keeps_big_integer_arguments),
        cmocka_unit_test(test_stream_error_is_an_error_event),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
