/* test_server_anthropic_format.c — server/anthropic.c: a Messages request translated into the chat request
 * the engine runs (system, tool_use, tool_result, tools, tool_choice, thinking, stop_sequences), an
 * assistant prefill rendered as the prompt the model continues, its validation errors, and the stream's event sequence and the message's content blocks. */
#define _GNU_SOURCE /* memmem */
#include <stdlib.h>
#include <string.h>

#include "server/anthropic.h"
#include "test_support.h"
#include "text/chat_template.h"

static char *compact(const json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    assert_non_null(s);
    return s;
}

static void test_translation(void **state)
{
    (void)state;
    const char *body =
        "{\"model\":\"m\",\"max_tokens\":164,\"system\":[{\"type\":\"text\",\"text\":\"Be brief.\"}],"
        "\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\",\"signature\":\"\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get\",\"input\":{\"city\":\"Paris\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"is_error\":true,"
        "\"content\":[{\"type\":\"text\",\"text\":\"down\"}]},{\"type\":\"text\",\"text\":\"retry\"}]}],"
        "\"tools\":[{\"name\":\"get\",\"input_schema\":{\"type\":\"object\"}}],"
        "\"tool_choice\":{\"type\":\"auto\"},\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":99},"
        "\"stop_sequences\":[\"END\"],\"temperature\":0.5,\"top_k\":20,\"metadata\":{\"user_id\":\"u\"}}";
    lily_oai_request req;
    lily_oai_error e;
    if (!lily_anth_parse_request(body, strlen(body), false, &req, &e))
        fail_msg("rejected: %s", e.message);
    assert_true(req.anthropic && req.is_chat);
    char *msgs = compact(req.messages);
    assert_string_equal(msgs,
                        "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Weather?\"},"
                        "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"hm\",\"tool_calls\":[{\"id\":"
                        "\"toolu_1\",\"type\":\"function\",\"function\":{\"name\":\"get\",\"arguments\":"
                        "\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"toolu_1\","
                        "\"content\":\"Error: down\"},{\"role\":\"user\",\"content\":\"retry\"}]");
    free(msgs);
    assert_int_equal(req.tool_choice, LILY_TOOL_CHOICE_AUTO);
    assert_int_equal(req.enable_thinking, 1);
    assert_int_equal(req.reasoning_budget, 99);
    assert_int_equal(req.max_tokens, 164);
    assert_int_equal(req.n_stop, 1);
    assert_string_equal(req.stop[0], "END");
    assert_int_equal(req.top_k, 20);
    assert_true(req.temperature == 0.5);
    lily_oai_request_free(&req);

    const char *named = "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                        "\"tool_choice\":{\"type\":\"tool\",\"name\":\"get\"},\"tools\":[{\"name\":\"get\","
                        "\"input_schema\":{}}],\"thinking\":{\"type\":\"disabled\"}}";
    assert_true(lily_anth_parse_request(named, strlen(named), false, &req, &e));
    assert_int_equal(req.tool_choice, LILY_TOOL_CHOICE_NAMED);
    assert_string_equal(req.tool_name, "get");
    assert_int_equal(req.enable_thinking, 0);
    lily_oai_request_free(&req);

    const char *plain = "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                        "\"tool_choice\":{\"type\":\"any\"},\"tools\":[{\"name\":\"t\",\"input_schema\":{}}]}";
    assert_true(lily_anth_parse_request(plain, strlen(plain), false, &req, &e));
    assert_int_equal(req.enable_thinking, 0); /* thinking is off unless asked for, as Anthropic's models */
    assert_int_equal(req.tool_choice, LILY_TOOL_CHOICE_REQUIRED);
    assert_false(req.single_tool_call);
    lily_oai_request_free(&req);
    const char *single = "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                         "\"tool_choice\":{\"type\":\"auto\",\"disable_parallel_tool_use\":true},"
                         "\"tools\":[{\"name\":\"t\",\"input_schema\":{}}]}";
    assert_true(lily_anth_parse_request(single, strlen(single), false, &req, &e));
    assert_true(req.single_tool_call); /* at most one tool_use block, as OpenAI's parallel_tool_calls false */
    lily_oai_request_free(&req);
}

static void assert_rejected(const char *body, bool count_only, const char *needle)
{
    lily_oai_request req;
    lily_oai_error e;
    if (lily_anth_parse_request(body, strlen(body), count_only, &req, &e)) {
        lily_oai_request_free(&req);
        fail_msg("accepted: %s", body);
    }
    assert_int_equal(e.http_status, 400);
    if (!strstr(e.message, needle))
        fail_msg("message '%s' lacks '%s'", e.message, needle);
    char *j = lily_anth_error_json(&e);
    assert_non_null(strstr(j, "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\""));
    free(j);
}

static void test_validation(void **state)
{
    (void)state;
    assert_rejected("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", false, "max_tokens");
    assert_rejected("{\"max_tokens\":1,\"messages\":[]}", false, "messages");
    /* tool_choice any / tool forces a call, which cannot write a parameter name with '<' (<parameter=NAME>) */
    assert_rejected("{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                    "\"tool_choice\":{\"type\":\"any\"},\"tools\":[{\"name\":\"t\",\"input_schema\":"
                    "{\"type\":\"object\",\"properties\":{\"x<y\":{\"type\":\"string\"}}}}]}",
                    false, "Invalid parameter name 'x<y' in tool 't'");
    assert_rejected("{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                    "\"tool_choice\":{\"type\":\"tool\",\"name\":\"t\"},\"tools\":[{\"name\":\"t\",\"input_schema\":"
                    "{\"type\":\"object\",\"properties\":{\"x>y\":{\"type\":\"string\"}}}}]}",
                    false, "Invalid parameter name 'x>y' in tool 't'");
    assert_rejected("{\"max_tokens\":1,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", false, "role");
    assert_rejected("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]}", false,
                    "image");
    assert_rejected("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":"
                    "{\"type\":\"enabled\"}}", false, "thinking.budget_tokens: Field required");
    assert_rejected("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":"
                    "{\"type\":\"enabled\",\"budget_tokens\":-1}}", false, "budget_tokens: expected an integer >= 0");
    assert_rejected("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":1.5}",
                    false, "temperature");
    assert_rejected("{\"max_tokens\":512,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":"
                    "{\"type\":\"enabled\",\"budget_tokens\":1024}}", false,
                    "max_tokens must be greater than thinking.budget_tokens (1024 >= 512)");
    /* as Anthropic: thinking allows tool_choice auto or none only (a forced call would drop the thinking) */
    static const char *const thinks[] = {"{\"type\":\"enabled\",\"budget_tokens\":4}", "{\"type\":\"adaptive\"}"};
    static const char *const forced[][2] = {{"{\"type\":\"any\"}", "tool_choice 'any'"},
                                            {"{\"type\":\"tool\",\"name\":\"t\"}", "tool_choice 'tool'"}};
    for (size_t i = 0; i < 2; i++)
        for (size_t j = 0; j < 2; j++)
            for (int count_only = 0; count_only < 2; count_only++) {
                char body[400], want[200];
                snprintf(body, sizeof body, "{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":"
                         "\"x\"}],\"tools\":[{\"name\":\"t\",\"input_schema\":{}}],\"tool_choice\":%s,"
                         "\"thinking\":%s}", forced[j][0], thinks[i]);
                snprintf(want, sizeof want, "%s forces a tool call, which cannot be combined with thinking "
                         "(thinking.type '%s'): use tool_choice 'auto' or 'none', or disable thinking.",
                         forced[j][1], i ? "adaptive" : "enabled");
                assert_rejected(body, count_only, want);
            }
    assert_rejected("[1]", false, "JSON object");
    assert_rejected("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"\"}]}", false, "non-empty");
    assert_rejected("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[]}]}", false, "non-empty");
    /* the OpenAI routes' bounds hold here too: checked on the text, before a document is built */
    char deep[400] = "{\"max_tokens\":1,\"metadata\":";
    for (int i = 0; i < 100; i++)
        strcat(deep, "[");
    assert_rejected(deep, false, "deeper than");
    lily_oai_request req;
    lily_oai_error e;
    const char *count = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    assert_true(lily_anth_parse_request(count, strlen(count), true, &req, &e)); /* count_tokens: no max_tokens */
    lily_oai_request_free(&req);
    lily_oai_error_set(&e, 401, "invalid_request_error", NULL, "invalid_api_key", "bad key");
    char *j = lily_anth_error_json(&e);
    assert_string_equal(j, "{\"type\":\"error\",\"error\":{\"type\":\"authentication_error\",\"message\":\"bad key\"}}");
    free(j);
}

/* Validation errors name the Messages request's own fields (stop_sequences, tools.N.name, tool_choice.name), not
 * the OpenAI request lily translates it into (stop, tools[N].function.name, tool_choice.function.name); tools
 * with the same name, and a tool_result whose tool_use_id no earlier tool_use block has, are refused as
 * Anthropic's API refuses them. */
static void test_errors_name_anthropic_fields(void **state)
{
    (void)state;
#define ASK "\"max_tokens\":64,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define TOOL(name) "{\"name\":\"" name "\",\"input_schema\":{\"type\":\"object\"}}"
    static const struct {
        const char *body, *want;
    } cases[] = {
        {"{" ASK ",\"stop_sequences\":[\"a\",1]}", "stop_sequences.1: expected a string."},
        {"{" ASK ",\"stop_sequences\":[\"a\\u0000b\"]}", "stop_sequences.0: a stop sequence cannot contain U+0000."},
        {"{" ASK ",\"stop_sequences\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\","
         "\"13\",\"14\",\"15\",\"16\",\"17\"]}", "stop_sequences: at most 16 stop sequences are supported."},
        {"{" ASK ",\"tools\":[" TOOL("my tool") "]}",
         "tools.0.name: 'my tool' does not match '^[a-zA-Z0-9_-]{1,128}$'."},
        {"{" ASK ",\"tools\":[" TOOL("a") "," TOOL("") "]}", "tools.1.name: '' does not match"},
        {"{" ASK ",\"tools\":[" TOOL("t") "," TOOL("u") "," TOOL("t") "]}",
         "tools: tool names must be unique: 't' is tools.0.name and tools.2.name."},
        {"{" ASK ",\"tools\":[" TOOL("t") "],\"tool_choice\":{\"type\":\"tool\",\"name\":\"u\"}}",
         "tool_choice.name: no tool named 'u' in tools."},
        {"{\"max_tokens\":64,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
         "\"tool_use_id\":\"toolu_1\",\"content\":\"x\"}]}]}",
         "messages.0.content.0: tool_use_id 'toolu_1' matches no tool_use block in an earlier message"},
        {"{\"max_tokens\":64,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":"
         "[{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"t\",\"input\":{}}]},{\"role\":\"user\",\"content\":"
         "[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":\"x\"},{\"type\":\"tool_result\","
         "\"tool_use_id\":\"toolu_2\",\"content\":\"y\"}]}]}",
         "messages.2.content.1: tool_use_id 'toolu_2' matches no tool_use block"},
        /* a text block without a string 'text' is not "only text blocks are supported" */
        {"{\"max_tokens\":64,\"system\":[{\"type\":\"text\"}],\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
         "system.0.text: expected a string."},
        /* a block's own field is named as such (they said messages.0.content.0, messages.2.content.0.0) */
        {"{\"max_tokens\":64,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
         "messages.0.content.0.text: expected a string or an array of text blocks."},
        {"{\"max_tokens\":64,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":"
         "[{\"type\":\"thinking\",\"thinking\":5}]}]}",
         "messages.1.content.0.thinking: expected a string or an array of text blocks."},
        {"{\"max_tokens\":64,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":"
         "[{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"t\",\"input\":{}}]},{\"role\":\"user\",\"content\":"
         "[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":[{\"type\":\"image\"}]}]}]}",
         "messages.2.content.0.content.0: only text blocks are supported here"},
        {"{\"max_tokens\":64,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":"
         "[{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"t\",\"input\":{}}]},{\"role\":\"user\",\"content\":"
         "[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":5}]}]}",
         "messages.2.content.0.content: expected a string or an array of text blocks."},
    };
    static const char *const openai_names[] = {"'stop", "function", "tool_call", "[0]", "[1]", "[2]"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_rejected(cases[i].body, false, cases[i].want);
        lily_oai_request req;
        lily_oai_error e;
        assert_false(lily_anth_parse_request(cases[i].body, strlen(cases[i].body), false, &req, &e));
        for (size_t k = 0; k < sizeof openai_names / sizeof openai_names[0]; k++)
            if (strstr(e.message, openai_names[k]))
                fail_msg("case %zu: '%s' names an OpenAI field ('%s')", i, e.message, openai_names[k]);
    }
    /* what is fine: a tool_result answering an earlier tool_use (also two turns back), distinct tool names */
    static const char *const fine[] = {
        "{\"max_tokens\":64,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":"
        "[{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"t\",\"input\":{}},{\"type\":\"tool_use\",\"id\":"
        "\"toolu_2\",\"name\":\"u\",\"input\":{}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
        "\"tool_use_id\":\"toolu_1\",\"content\":\"x\"},{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_2\"}]}],"
        "\"tools\":[" TOOL("t") "," TOOL("u") "],\"tool_choice\":{\"type\":\"tool\",\"name\":\"u\"}}",
        "{" ASK ",\"stop_sequences\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\","
        "\"13\",\"14\",\"15\",\"16\"]}",
    };
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
        lily_oai_request req;
        lily_oai_error e;
        if (!lily_anth_parse_request(fine[i], strlen(fine[i]), false, &req, &e))
            fail_msg("rejected: %s", e.message);
        lily_oai_request_free(&req);
    }
#undef ASK
#undef TOOL
}

/* The prompt the chat template renders for a Messages request body. */
static char *render_messages_request(const char *body, lily_oai_request *req)
{
    lily_oai_error e;
    if (!lily_anth_parse_request(body, strlen(body), false, req, &e))
        fail_msg("rejected: %s", e.message);
    json_t *t = lily_oai_template_request(req);
    assert_non_null(t);
    char *prompt = NULL;
    size_t len = 0;
    lily_error err;
    if (lily_chat_render_n(t, NULL, &prompt, &len, &err) != LILY_OK)
        fail_msg("render: %s", err.message);
    json_decref(t);
    return prompt;
}

/* A final assistant message is a prefill: the prompt ends with its text (no <|im_end|>, no new assistant
 * turn), as Anthropic continues it; empty content is an ordinary reply; and the combinations Anthropic
 * refuses (or lily cannot honour) are 400s naming the conflict. */
static void test_prefill(void **state)
{
    (void)state;
    lily_oai_request req;
    char *prompt = render_messages_request("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"Name a "
                                           "color.\"},{\"role\":\"assistant\",\"content\":\"The color is\"}]}", &req);
    assert_true(req.continue_final);
    assert_string_equal(prompt, "<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\n<think>\n\n"
                                "</think>\n\nThe color is");
    free(prompt);
    lily_oai_request_free(&req);
    /* text blocks, and a thinking block the model continues after */
    prompt = render_messages_request("{\"max_tokens\":5,\"system\":\"S\",\"messages\":[{\"role\":\"user\",\"content\":"
                                     "\"Q\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":"
                                     "\"hm\",\"signature\":\"\"},{\"type\":\"text\",\"text\":\"{\\\"a\\\":\"}]}]}", &req);
    assert_true(req.continue_final);
    assert_string_equal(prompt, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>"
                                "assistant\n<think>\nhm\n</think>\n\n{\"a\":");
    free(prompt);
    lily_oai_request_free(&req);
    /* an empty final assistant message (string or no blocks) continues nothing: an ordinary reply */
    static const char *const empty[] = {"\"\"", "[]"};
    for (int i = 0; i < 2; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},"
                                    "{\"role\":\"assistant\",\"content\":%s}]}", empty[i]);
        prompt = render_messages_request(body, &req);
        assert_false(req.continue_final);
        assert_string_equal(prompt, "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
        free(prompt);
        lily_oai_request_free(&req);
    }
    /* a user message last: no prefill */
    prompt = render_messages_request("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},{\"role\":"
                                     "\"assistant\",\"content\":\"A\"},{\"role\":\"user\",\"content\":\"R\"}]}", &req);
    assert_false(req.continue_final);
    free(prompt);
    lily_oai_request_free(&req);

#define PREFILL_ASK "{\"max_tokens\":50,\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},"
    assert_rejected(PREFILL_ASK "{\"role\":\"assistant\",\"content\":\"Sure, \"}]}", false,
                    "messages.1: final assistant content cannot end with trailing whitespace");
    assert_rejected(PREFILL_ASK "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"a\\n\"}]}]}", false,
                    "trailing whitespace");
    assert_rejected(PREFILL_ASK "{\"role\":\"assistant\",\"content\":\"Sure\"}],\"thinking\":{\"type\":\"enabled\","
                    "\"budget_tokens\":10}}", false, "not supported with thinking enabled");
    assert_rejected(PREFILL_ASK "{\"role\":\"assistant\",\"content\":\"Sure\"}],\"thinking\":{\"type\":\"adaptive\"}}",
                    false, "not supported with thinking enabled");
    assert_rejected(PREFILL_ASK "{\"role\":\"assistant\",\"content\":\"{\"}],\"output_config\":{\"format\":{\"type\":"
                    "\"json_schema\",\"schema\":{\"type\":\"object\"}}}}", false,
                    "output_config.format cannot be combined with a prefilled assistant reply");
    static const char *const forced[] = {"{\"type\":\"any\"}", "{\"type\":\"tool\",\"name\":\"t\"}"};
    for (int i = 0; i < 2; i++) {
        char body[512];
        snprintf(body, sizeof body, PREFILL_ASK "{\"role\":\"assistant\",\"content\":\"Sure\"}],\"tools\":[{\"name\":"
                 "\"t\",\"input_schema\":{}}],\"tool_choice\":%s}", forced[i]);
        assert_rejected(body, false, "tool_choice 'any' or 'tool' cannot be combined with a prefilled");
    }
    assert_rejected(PREFILL_ASK "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"toolu_1\","
                    "\"name\":\"t\",\"input\":{}}]}]}", false, "has a tool_use block: send its tool_result");
#undef PREFILL_ASK
    /* tool_choice auto and thinking disabled combine with a prefill */
    const char *ok = "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},{\"role\":\"assistant\","
                     "\"content\":\"Sure\"}],\"tools\":[{\"name\":\"t\",\"input_schema\":{}}],\"tool_choice\":{\"type\":"
                     "\"auto\"},\"thinking\":{\"type\":\"disabled\"}}";
    lily_oai_error e;
    assert_true(lily_anth_parse_request(ok, strlen(ok), false, &req, &e));
    assert_true(req.continue_final);
    lily_oai_request_free(&req);
}

/* Bodies go through the same gate as chat completions: the JSON value limit, U+0000 taken back whole (in
 * string content, text blocks, system blocks and tool results: not cut at the first U+0000),
 * stop_sequences an array, 403 a permission_error. */
static void test_limits_and_nul(void **state)
{
    (void)state;
    size_t cap = 3 * (size_t)LILY_OAI_MAX_JSON_VALUES + 200;
    char *many = malloc(cap);
    assert_non_null(many);
    size_t m = (size_t)snprintf(many, cap, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"x\":[");
    for (int i = 0; i <= LILY_OAI_MAX_JSON_VALUES; i++)
        m += (size_t)snprintf(many + m, cap - m, "0,");
    snprintf(many + m, cap - m, "0]}");
    assert_rejected(many, false, "more than 262144 values");
    free(many);

    const char *nul =
        "{\"max_tokens\":4,\"system\":[{\"type\":\"text\",\"text\":\"s\\u0000t\"}],\"messages\":["
        "{\"role\":\"user\",\"content\":\"a\\u0000b\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"c\\u0000d\"},"
        "{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\",\"input\":{}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"is_error\":true,"
        "\"content\":\"e\\u0000f\"},{\"type\":\"text\",\"text\":\"g\\u0000h\"}]}]}";
    lily_oai_request req;
    lily_oai_error e;
    if (!lily_anth_parse_request(nul, strlen(nul), false, &req, &e))
        fail_msg("U+0000 rejected: %s", e.message);
    char *msgs = json_dumps(req.messages, JSON_COMPACT);
    assert_non_null(msgs);
    assert_string_equal(msgs, "[{\"role\":\"system\",\"content\":\"s\\u0000t\"},{\"role\":\"user\",\"content\":"
                              "\"a\\u0000b\"},{\"role\":\"assistant\",\"content\":\"c\\u0000d\",\"tool_calls\":[{\"id\":"
                              "\"t1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
                              "{\"role\":\"tool\",\"tool_call_id\":\"t1\",\"content\":\"Error: e\\u0000f\"},"
                              "{\"role\":\"user\",\"content\":\"g\\u0000h\"}]");
    free(msgs);
    lily_oai_request_free(&req);

    /* a tool_use input holding U+0000 (as lily's own tool_use blocks may) renders: its arguments text is parsed
     * again */
    const char *nul_input = "{\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
                            "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\","
                            "\"input\":{\"p\":\"x\\u0000y\"}}]},{\"role\":\"user\",\"content\":[{\"type\":"
                            "\"tool_result\",\"tool_use_id\":\"t1\",\"content\":\"ok\"}]}]}";
    if (!lily_anth_parse_request(nul_input, strlen(nul_input), false, &req, &e))
        fail_msg("U+0000 in a tool_use input rejected: %s", e.message);
    json_t *treq = lily_oai_template_request(&req);
    char *prompt = NULL;
    size_t plen = 0;
    lily_error err = {0};
    if (lily_chat_render_n(treq, NULL, &prompt, &plen, &err) != LILY_OK)
        fail_msg("not rendered: %s", err.message);
    static const char param[] = "<parameter=p>\nx\0y\n</parameter>";
    assert_non_null(memmem(prompt, plen, param, sizeof param - 1));
    free(prompt);
    json_decref(treq);
    lily_oai_request_free(&req);
    /* and a reply's call whose arguments hold \u0000 keeps them in its tool_use input */
    lily_tool_call call = {.name = "f", .arguments = "{\"p\":\"x\\u0000y\"}"};
    lily_parsed_output o = {.reasoning = "", .content = "", .tool_calls = &call, .n_tool_calls = 1};
    char ids[1][40] = {"call_1"};
    lily_anth_usage u = {0};
    json_t *message = lily_anth_message("msg_1", "m", &o, ids, 1, "tool_use", NULL, &u);
    char *content = compact(json_object_get(message, "content"));
    assert_string_equal(content, "[{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\",\"input\":{\"p\":"
                                 "\"x\\u0000y\"}}]");
    free(content);
    json_decref(message);
    /* a call whose arguments hold an integer past int64 keeps its input (it was {}): the integer as the
     * nearest double, the only number a jansson object holds, and the other arguments as written */
    lily_tool_call big = {.name = "f", .arguments = "{\"id\":18446744073709551615,\"a\":\"x\"}"};
    o.tool_calls = &big;
    message = lily_anth_message("msg_1", "m", &o, ids, 1, "tool_use", NULL, &u);
    json_t *input = json_object_get(json_array_get(json_object_get(message, "content"), 0), "input");
    assert_true(json_is_real(json_object_get(input, "id")));
    assert_true(json_real_value(json_object_get(input, "id")) == 18446744073709551615.0);
    assert_string_equal(json_string_value(json_object_get(input, "a")), "x");
    json_decref(message);

    assert_rejected("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop_sequences\":"
                    "\"END\"}", false, "stop_sequences: expected an array of strings");
    lily_oai_error_set(&e, 403, "permission_error", NULL, "origin_not_allowed", "no");
    char *j = lily_anth_error_json(&e);
    assert_string_equal(j, "{\"type\":\"error\",\"error\":{\"type\":\"permission_error\",\"message\":\"no\"}}");
    free(j);
}

/* The events of one reply: thinking, text, a tool call, then the end. */
static void test_stream_events(void **state)
{
    (void)state;
    lily_anth_stream st = {.index = -1, .kind = -1};
    const lily_output_event evs[] = {
        {LILY_OUTPUT_REASONING, -1, "hm", 2, false},     {LILY_OUTPUT_REASONING, -1, "m", 1, false},
        {LILY_OUTPUT_CONTENT, -1, "Hi", 2, false},       {LILY_OUTPUT_TOOL_CALL_START, 0, "get", 3, false},
        {LILY_OUTPUT_TOOL_ARGUMENTS, 0, "{\"a\"", 4, false}, {LILY_OUTPUT_TOOL_ARGUMENTS, 0, ":1}", 3, false},
        {LILY_OUTPUT_TOOL_CALL_END, 0, "", 0, false},
    };
    char seq[2048] = "";
    json_t *out[3];
    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++) {
        int n = lily_anth_stream_event(&st, &evs[i], "call_abc", out);
        for (int k = 0; k < n; k++) {
            json_t *d = json_object_get(out[k], "delta");
            json_t *b = json_object_get(out[k], "content_block");
            char item[160];
            snprintf(item, sizeof item, "%s%s%s%s%s:%lld ", json_string_value(json_object_get(out[k], "type")),
                     d ? "/" : "", d ? json_string_value(json_object_get(d, "type")) : "", b ? "/" : "",
                     b ? json_string_value(json_object_get(b, "type")) : "",
                     (long long)json_integer_value(json_object_get(out[k], "index")));
            strcat(seq, item);
            if (b && !strcmp(json_string_value(json_object_get(b, "type")), "tool_use"))
                assert_string_equal(json_string_value(json_object_get(b, "id")), "toolu_abc");
            json_decref(out[k]);
        }
    }
    lily_anth_usage u = {.input_tokens = 3, .cache_read_input_tokens = 7, .output_tokens = 9};
    int n = lily_anth_stream_end(&st, "tool_use", NULL, &u, out);
    assert_int_equal(n, 2); /* the tool block is closed already */
    char *delta = compact(out[0]);
    assert_string_equal(delta, "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},"
                               "\"usage\":{\"input_tokens\":3,\"cache_creation_input_tokens\":0,"
                               "\"cache_read_input_tokens\":7,\"output_tokens\":9}}");
    size_t len = 0;
    char *sse = lily_oai_sse_event(out[1], &len);
    assert_string_equal(sse, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    assert_int_equal(len, strlen(sse));
    free(sse);
    free(delta);
    json_decref(out[0]);
    json_decref(out[1]);
    assert_string_equal(seq, "content_block_start/thinking:0 content_block_delta/thinking_delta:0 "
                             "content_block_delta/thinking_delta:0 content_block_stop:0 content_block_start/text:1 "
                             "content_block_delta/text_delta:1 content_block_stop:1 content_block_start/tool_use:2 "
                             "content_block_delta/input_json_delta:2 content_block_delta/input_json_delta:2 "
                             "content_block_stop:2 ");
    assert_string_equal(lily_anth_stop_reason("stop", "END"), "stop_sequence");
    assert_string_equal(lily_anth_stop_reason("stop", NULL), "end_turn");
    assert_string_equal(lily_anth_stop_reason("length", NULL), "max_tokens");
    assert_string_equal(lily_anth_stop_reason("tool_calls", NULL), "tool_use");
}

/* A stream fed by the output parser's events: the partial_json of its input_json_delta events joined. */
typedef struct {
    lily_anth_stream st;
    char partial[256];
} json_deltas;

static void stream_input(void *user, const lily_output_event *ev)
{
    json_deltas *d = user;
    json_t *out[3];
    int n = lily_anth_stream_event(&d->st, ev, "call_1", out);
    for (int k = 0; k < n; k++) {
        json_t *delta = json_object_get(out[k], "delta");
        const char *type = json_string_value(json_object_get(delta, "type"));
        if (type && !strcmp(type, "input_json_delta"))
            strncat(d->partial, json_string_value(json_object_get(delta, "partial_json")),
                    sizeof d->partial - 1 - strlen(d->partial));
        json_decref(out[k]);
    }
}

/* A tool call whose arguments hold integers past int64, in the JSON form and in the XML form with a schema that
 * takes integers: streamed, the input_json_delta text joined is the model's digits (as the chat route's
 * arguments); the whole message's tool_use input holds them as the nearest double (a jansson object holds no
 * other number), the same for both forms. */
static void test_tool_use_with_big_integers(void **state)
{
    (void)state;
    static const char *const texts[] = {
        "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"id\": 18446744073709551615, "
        "\"n\": 123456789012345678901234567890}}\n</tool_call>",
        "<tool_call>\n<function=get>\n<parameter=id>\n18446744073709551615\n</parameter>\n"
        "<parameter=n>\n123456789012345678901234567890\n</parameter>\n</function>\n</tool_call>",
    };
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":{\"type\":"
                               "\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"n\":{\"type\":"
                               "\"integer\"}}}}}]", 0, NULL);
    assert_non_null(tools);
    for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
        json_deltas d = {.st = {.index = -1, .kind = -1}, .partial = ""};
        lily_output_parser *p = NULL;
        lily_error err = {0};
        lily_output_parser_options opt = {.tools = tools, .on_event = stream_input, .user = &d};
        assert_int_equal(lily_output_parser_new(&opt, &p, &err), LILY_OK);
        assert_int_equal(lily_output_parser_feed(p, texts[t], strlen(texts[t]), &err), LILY_OK);
        assert_int_equal(lily_output_parser_finish(p, false, &err), LILY_OK);
        assert_string_equal(d.partial, "{\"id\":18446744073709551615,\"n\":123456789012345678901234567890}");
        char ids[1][40] = {"call_1"};
        lily_anth_usage u = {0};
        json_t *message = lily_anth_message("msg_1", "m", lily_output_parser_result(p), ids, 1, "tool_use", NULL, &u);
        json_t *block = json_array_get(json_object_get(message, "content"), 0);
        assert_string_equal(json_string_value(json_object_get(block, "type")), "tool_use");
        json_t *input = json_object_get(block, "input");
        assert_int_equal(json_object_size(input), 2);
        assert_true(json_real_value(json_object_get(input, "id")) == 18446744073709551615.0);
        assert_true(json_real_value(json_object_get(input, "n")) == 123456789012345678901234567890.0);
        json_decref(message);
        lily_output_parser_free(p);
    }
    json_decref(tools);
}

/* Tool names as the Messages API takes them, ^[a-zA-Z0-9_-]{1,128}$: Claude Code names an MCP tool
 * mcp__SERVER__TOOL, which can run past OpenAI's 64 (every request of such a session was a 400). In tools
 * and in a forced tool_choice; 129 characters are refused, and the OpenAI route keeps its 64. */
static void test_long_tool_names(void **state)
{
    (void)state;
    char name[130], body[1024];
    memset(name, 'x', sizeof name);
    memcpy(name, "mcp__", 5);
    name[128] = 0;
    snprintf(body, sizeof body, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
             "\"tools\":[{\"name\":\"%s\",\"input_schema\":{\"type\":\"object\"}}],"
             "\"tool_choice\":{\"type\":\"tool\",\"name\":\"%s\"}}", name, name);
    lily_oai_request req;
    lily_oai_error e;
    if (!lily_anth_parse_request(body, strlen(body), false, &req, &e))
        fail_msg("refused: %s", e.message);
    assert_int_equal(req.tool_choice, LILY_TOOL_CHOICE_NAMED);
    assert_string_equal(req.tool_name, name);
    lily_oai_request_free(&req);

    name[128] = 'x';
    name[129] = 0;
    snprintf(body, sizeof body, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
             "\"tools\":[{\"name\":\"%s\",\"input_schema\":{\"type\":\"object\"}}]}", name);
    assert_rejected(body, false, "does not match '^[a-zA-Z0-9_-]{1,128}$'.");

    name[65] = 0;
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"type\":"
             "\"function\",\"function\":{\"name\":\"%s\"}}]}", name);
    assert_false(lily_oai_parse_request(body, strlen(body), true, &req, &e));
    assert_non_null(strstr(e.message, "does not match '^[a-zA-Z0-9_-]{1,64}$'."));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_translation),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_errors_name_anthropic_fields),
        cmocka_unit_test(test_long_tool_names),
        cmocka_unit_test(test_prefill),
        cmocka_unit_test(test_limits_and_nul),
        cmocka_unit_test(test_stream_events),
        cmocka_unit_test(test_tool_use_with_big_integers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
