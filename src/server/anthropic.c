/* anthropic.c — the Anthropic Messages API wire format (anthropic.h). */
#include "server/anthropic.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_load.h"


/* ---------------------------------------------------------------------------------------------------
 * request -> the OpenAI chat request the engine path runs
 */

/* A 400 invalid_request_error naming param; false, for `return bad(...)`. */
#define bad(e, param, ...) (lily_oai_error_set(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__), false)

/* Text gathered from strings and text blocks; n bytes at p (may hold U+0000, as lily's replies may). */
typedef struct {
    char *p;
    size_t n;
} text_buf;

static bool text_append(text_buf *t, const char *s, size_t n)
{
    char *p = realloc(t->p, t->n + n + 1);
    if (!p)
        return false;
    memcpy(p + t->n, s, n);
    p[t->n + n] = '\0';
    t->p = p;
    t->n += n;
    return true;
}

/* The text of a string or an array of text blocks, appended to *out. */
static bool append_text(json_t *content, const char *where, text_buf *out, lily_oai_error *e)
{
    if (json_is_string(content)) {
        if (!text_append(out, json_string_value(content), json_string_length(content)))
            return bad(e, where, "Out of memory.");
        return true;
    }
    if (!json_is_array(content))
        return bad(e, where, "%s: expected a string or an array of text blocks.", where);
    size_t i;
    json_t *blk;
    json_array_foreach(content, i, blk) {
        const char *type = json_string_value(json_object_get(blk, "type"));
        if (!type || strcmp(type, "text"))
            return bad(e, where, "%s.%zu: only text blocks are supported here (this model takes text only).", where,
                       i);
        if (!json_is_string(json_object_get(blk, "text")))
            return bad(e, where, "%s.%zu.text: expected a string.", where, i);
        if (!append_text(json_object_get(blk, "text"), where, out, e))
            return false;
    }
    return true;
}

/* At most the first 64 bytes of s, ending on a character boundary: printf("%.*s", quoted_len(s), s). */
static int quoted_len(const char *s)
{
    size_t n = strlen(s);
    return (int)lily_oai_utf8_cut(s, n < 64 ? n : 64);
}

/* One Anthropic message as OpenAI messages appended to msgs. tool_use_ids: the ids of the tool_use blocks of
 * the messages before it (a JSON object used as a set), which its own tool_use blocks join; a tool_result
 * block must answer one of them, as on Anthropic's API. */
static bool translate_message(json_t *m, size_t index, json_t *msgs, json_t *tool_use_ids, lily_oai_error *e)
{
    char where[48];
    snprintf(where, sizeof where, "messages.%zu", index);
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!json_is_object(m) || !role || (strcmp(role, "user") && strcmp(role, "assistant")))
        return bad(e, where, "%s: expected {\"role\": \"user\" | \"assistant\", \"content\": ...}.", where);
    json_t *content = json_object_get(m, "content");
    bool assistant = !strcmp(role, "assistant");
    /* as Anthropic: a user turn must say something ("" and [] are refused; an assistant turn may be empty) */
    if (!assistant && ((json_is_string(content) && json_string_length(content) == 0) ||
                       (json_is_array(content) && json_array_size(content) == 0)))
        return bad(e, where, "%s.content: a user message must have non-empty content.", where);
    if (json_is_string(content))
        return !json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", role, "content", content));
    if (!json_is_array(content))
        return bad(e, where, "%s.content: expected a string or an array of content blocks.", where);
    text_buf text = {0}, thinking = {0};
    json_t *calls = json_array();
    bool ok = calls != NULL;
    int n_results = 0;
    size_t i;
    json_t *blk;
    json_array_foreach(content, i, blk) {
        if (!ok)
            break;
        char bw[96];
        snprintf(bw, sizeof bw, "%s.content.%zu", where, i);
        const char *type = json_string_value(json_object_get(blk, "type"));
        if (!json_is_object(blk) || !type) {
            ok = bad(e, bw, "%s: expected a content block with a 'type'.", bw);
        } else if (!strcmp(type, "text") || (!strcmp(type, "thinking") && assistant)) {
            char fw[sizeof bw + 10]; /* the block's own field: messages.N.content.K.text (.thinking) */
            snprintf(fw, sizeof fw, "%s.%s", bw, type);
            ok = append_text(json_object_get(blk, type), fw, !strcmp(type, "text") ? &text : &thinking, e);
        } else if (!strcmp(type, "redacted_thinking") && assistant) {
            continue;
        } else if (!strcmp(type, "tool_use") && assistant) {
            const char *id = json_string_value(json_object_get(blk, "id"));
            const char *name = json_string_value(json_object_get(blk, "name"));
            json_t *input = json_object_get(blk, "input");
            char *args = json_is_object(input) ? json_dumps(input, JSON_COMPACT) : NULL;
            if (!id || !name || !args)
                ok = bad(e, bw, "%s: a tool_use block needs 'id', 'name' and an object 'input'.", bw);
            else if (json_object_set_new(tool_use_ids, id, json_true()))
                ok = false;
            else
                json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function",
                                                       "function", "name", name, "arguments", args));
            free(args);
        } else if (!strcmp(type, "tool_result") && !assistant) {
            const char *id = json_string_value(json_object_get(blk, "tool_use_id"));
            json_t *rc = json_object_get(blk, "content");
            n_results++;
            text_buf result = {0};
            char rw[sizeof bw + 8]; /* the result's own content: messages.N.content.K.content */
            snprintf(rw, sizeof rw, "%s.content", bw);
            if (!id)
                ok = bad(e, bw, "%s: a tool_result block needs 'tool_use_id'.", bw);
            else if (!json_object_get(tool_use_ids, id))
                ok = bad(e, bw, "%s: tool_use_id '%.*s' matches no tool_use block in an earlier message: each "
                         "tool_result block must answer a tool_use block of the assistant.", bw, quoted_len(id), id);
            else if (json_is_true(json_object_get(blk, "is_error")) && !text_append(&result, "Error: ", 7))
                ok = false;
            else if (rc && !json_is_null(rc) && !append_text(rc, rw, &result, e))
                ok = false;
            if (ok)
                ok = !json_array_append_new(msgs, json_pack("{s:s, s:s, s:s%}", "role", "tool", "tool_call_id", id,
                                                            "content", result.p ? result.p : "", result.n));
            free(result.p);
        } else {
            ok = bad(e, bw, "%s: unsupported content block type '%.32s' in a %s message.", bw, type, role);
        }
    }
    /* a user turn of tool results only becomes tool messages, without an empty user message */
    if (ok && (assistant ? text.p || thinking.p || json_array_size(calls) : text.p || !n_results)) {
        json_t *om = json_pack("{s:s, s:s%}", "role", role, "content", text.p ? text.p : "", text.n);
        if (om && thinking.p)
            json_object_set_new(om, "reasoning_content", json_stringn(thinking.p, thinking.n));
        if (om && json_array_size(calls))
            json_object_set(om, "tool_calls", calls);
        ok = om && !json_array_append_new(msgs, om);
    }
    json_decref(calls);
    free(text.p);
    free(thinking.p);
    if (!ok && e->http_status != 400) /* out of memory on the way (a rejection set e already) */
        lily_oai_error_set(e, 500, "server_error", NULL, NULL, "Out of memory.");
    return ok;
}

/* tools and tool_choice as OpenAI's. names: an empty JSON object, filled with the tools' names (each to
 * its index in tools). */
static bool translate_tools(json_t *b, json_t *oai, json_t *names, lily_oai_error *e)
{
    json_t *tools = json_object_get(b, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools))
            return bad(e, "tools", "tools: expected an array.");
        json_t *out = json_array();
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t) {
            const char *name = json_string_value(json_object_get(t, "name"));
            json_t *schema = json_object_get(t, "input_schema");
            json_t *desc = json_object_get(t, "description");
            json_t *first = name ? json_object_get(names, name) : NULL;
            const char *problem = !name || !json_is_object(schema) ? "shape"
                                : !lily_oai_valid_tool_name(json_object_get(t, "name"), LILY_ANTH_MAX_TOOL_NAME)
                                    ? "name"
                                : first ? "duplicate" : NULL;
            if (problem) {
                json_decref(out);
                if (!strcmp(problem, "shape"))
                    return bad(e, "tools", "tools.%zu: expected {\"name\": ..., \"input_schema\": {...}} (server "
                                           "tools are not supported).", i);
                if (!strcmp(problem, "name"))
                    return bad(e, "tools", "tools.%zu.name: '%.*s' does not match '^[a-zA-Z0-9_-]{1,%d}$'.", i,
                               quoted_len(name), name, LILY_ANTH_MAX_TOOL_NAME);
                return bad(e, "tools", "tools: tool names must be unique: '%s' is tools.%lld.name and tools.%zu.name.",
                           name, (long long)json_integer_value(first), i);
            }
            if (json_object_set_new(names, name, json_integer((json_int_t)i))) {
                json_decref(out);
                return bad(e, "tools", "Out of memory.");
            }
            json_t *fn = json_pack("{s:s, s:O}", "name", name, "parameters", schema);
            if (fn && json_is_string(desc))
                json_object_set(fn, "description", desc);
            json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn));
        }
        json_object_set_new(oai, "tools", out);
    }
    json_t *tc = json_object_get(b, "tool_choice");
    if (!tc || json_is_null(tc))
        return true;
    const char *type = json_string_value(json_object_get(tc, "type"));
    if (!type)
        return bad(e, "tool_choice", "tool_choice: expected {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}.");
    if (!strcmp(type, "auto") || !strcmp(type, "none"))
        json_object_set_new(oai, "tool_choice", json_string(type));
    else if (!strcmp(type, "any"))
        json_object_set_new(oai, "tool_choice", json_string("required"));
    else if (!strcmp(type, "tool") && json_is_string(json_object_get(tc, "name"))) {
        const char *name = json_string_value(json_object_get(tc, "name"));
        if (json_object_size(names) && !json_object_get(names, name))
            return bad(e, "tool_choice", "tool_choice.name: no tool named '%.*s' in tools.", quoted_len(name), name);
        json_object_set_new(oai, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name",
                                                          json_object_get(tc, "name")));
    } else
        return bad(e, "tool_choice", "tool_choice: expected type 'auto', 'any', 'none', or 'tool' with a 'name'.");
    json_t *dp = json_object_get(tc, "disable_parallel_tool_use");
    if (dp && !json_is_null(dp) && !json_is_boolean(dp))
        return bad(e, "tool_choice", "tool_choice.disable_parallel_tool_use: expected a boolean.");
    if (json_is_true(dp)) /* at most one tool_use block, as OpenAI's parallel_tool_calls false */
        json_object_set_new(oai, "parallel_tool_calls", json_false());
    return true;
}

/* Whether the translated request's tool_choice forces a tool call (Anthropic's 'any' or 'tool'). */
static bool forces_tool_call(json_t *oai)
{
    json_t *tc = json_object_get(oai, "tool_choice");
    return json_is_object(tc) || (json_is_string(tc) && !strcmp(json_string_value(tc), "required"));
}

/* A final assistant message prefills the reply: the model continues its text (the prompt ends with it: no
 * end of turn, no new assistant turn), and the response holds only what follows. As Anthropic: empty
 * content is a reply from scratch; content ending in whitespace is refused (the template strips it, so the
 * model would continue from other text than the client's), and so is a prefill with thinking on. A
 * prefill cannot start a forced tool call or a structured output (their grammars begin at the reply's
 * first token), nor follow a tool_use block (its tool_result must come first). *prefill: the request
 * continues the final message. */
static bool final_assistant(json_t *b, json_t *oai, bool think, bool *prefill, lily_oai_error *e)
{
    *prefill = false;
    json_t *messages = json_object_get(b, "messages"), *msgs = json_object_get(oai, "messages");
    const size_t n = json_array_size(messages), n_oai = json_array_size(msgs);
    json_t *last = json_array_get(msgs, n_oai - 1);
    const char *role = json_string_value(json_object_get(json_array_get(messages, n - 1), "role"));
    if (!role || strcmp(role, "assistant") || !last ||
        strcmp(json_string_value(json_object_get(last, "role")), "assistant"))
        return true;
    char where[48];
    snprintf(where, sizeof where, "messages.%zu", n - 1);
    if (json_object_get(last, "tool_calls"))
        return bad(e, where, "%s: the final assistant message has a tool_use block: send its tool_result in a user "
                   "message after it (a prefill is text only).", where);
    const char *text = json_string_value(json_object_get(last, "content"));
    const size_t len = json_string_length(json_object_get(last, "content"));
    if (!len && !json_object_get(last, "reasoning_content"))
        return !json_array_remove(msgs, n_oai - 1); /* nothing to continue: an ordinary reply */
    if (len && memchr(" \t\n\r\v\f", text[len - 1], 6))
        return bad(e, where, "%s: final assistant content cannot end with trailing whitespace.", where);
    if (think)
        return bad(e, "thinking", "%s: prefilling the assistant's reply (a final assistant message) is not supported "
                   "with thinking enabled, as on Anthropic's API: disable thinking or end with a user message.", where);
    if (json_object_get(oai, "response_format"))
        return bad(e, "output_config.format", "%s: output_config.format cannot be combined with a prefilled assistant "
                   "reply (the final assistant message): the schema constrains the reply from its first token.", where);
    if (forces_tool_call(oai))
        return bad(e, "tool_choice", "%s: tool_choice 'any' or 'tool' cannot be combined with a prefilled assistant "
                   "reply (the final assistant message): the forced tool call must open the reply.", where);
    *prefill = true;
    return true;
}

static bool translate(json_t *b, bool count_only, json_t *oai, bool *prefill, lily_oai_error *e)
{
    json_t *msgs = json_array();
    json_object_set_new(oai, "messages", msgs);
    json_t *system = json_object_get(b, "system");
    if (system && !json_is_null(system)) {
        text_buf text = {0};
        if (!append_text(system, "system", &text, e)) {
            free(text.p);
            return false;
        }
        json_array_append_new(msgs, json_pack("{s:s, s:s%}", "role", "system", "content", text.p ? text.p : "",
                                              text.n));
        free(text.p);
    }
    json_t *messages = json_object_get(b, "messages");
    if (!json_is_array(messages) || !json_array_size(messages))
        return bad(e, "messages", "messages: Field required (a non-empty array).");
    json_t *ids = json_object(), *names = json_object(); /* sets: tool_use ids, tool names */
    bool ok = ids && names;
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) if (ok && !translate_message(m, i, msgs, ids, e)) ok = false;
    ok = ok && translate_tools(b, oai, names, e);
    if (!ids || !names)
        lily_oai_error_set(e, 500, "server_error", NULL, NULL, "Out of memory.");
    json_decref(ids);
    json_decref(names);
    if (!ok)
        return false;

    json_t *mt = json_object_get(b, "max_tokens");
    if (!count_only && !mt)
        return bad(e, "max_tokens", "max_tokens: Field required");
    if (mt && (!json_is_integer(mt) || json_integer_value(mt) < 1))
        return bad(e, "max_tokens", "max_tokens: expected an integer >= 1.");
    if (mt && !count_only)
        json_object_set(oai, "max_tokens", mt);
    json_t *thinking = json_object_get(b, "thinking");
    bool think = false;
    if (thinking && !json_is_null(thinking)) {
        const char *type = json_string_value(json_object_get(thinking, "type"));
        json_t *budget = json_object_get(thinking, "budget_tokens");
        if (type && !strcmp(type, "enabled")) {
            if (!budget || json_is_null(budget))
                return bad(e, "thinking.budget_tokens", "thinking.budget_tokens: Field required (an integer >= 0).");
            if (!json_is_integer(budget) || json_integer_value(budget) < 0)
                return bad(e, "thinking.budget_tokens", "thinking.budget_tokens: expected an integer >= 0.");
            /* as Anthropic: a budget that leaves no room for the answer is a mistake, not a silent cut */
            if (mt && json_integer_value(budget) >= json_integer_value(mt))
                return bad(e, "max_tokens", "max_tokens must be greater than thinking.budget_tokens (%lld >= %lld).",
                           (long long)json_integer_value(budget), (long long)json_integer_value(mt));
            think = true;
            json_object_set(oai, "reasoning_budget", budget);
        } else if (type && (!strcmp(type, "adaptive") || !strcmp(type, "between_tools"))) {
            think = true; /* the model decides how long: no budget */
        } else if (!type || strcmp(type, "disabled")) {
            return bad(e, "thinking", "thinking: expected {\"type\": \"enabled\", \"budget_tokens\": N}, "
                                      "{\"type\": \"adaptive\"} or {\"type\": \"disabled\"}.");
        }
    }
    /* as Anthropic: thinking (enabled or adaptive) allows only tool_choice auto or none; a forced call opens
     * the reply with the tool call, which would leave no room for the think block */
    if (think && forces_tool_call(oai))
        return bad(e, "tool_choice", "tool_choice '%s' forces a tool call, which cannot be combined with thinking "
                   "(thinking.type '%s'): use tool_choice 'auto' or 'none', or disable thinking.",
                   json_is_object(json_object_get(oai, "tool_choice")) ? "tool" : "any",
                   json_string_value(json_object_get(thinking, "type")));
    /* structured outputs: as OpenAI's response_format json_schema. output_format is the beta's name for it
     * (structured-outputs-2025-11-13), which older SDKs' client.beta.messages.create sent (anthropic 2.x's
     * messages.parse(output_format=Model) sends output_config.format) */
    json_t *format = json_object_get(json_object_get(b, "output_config"), "format");
    json_t *beta_format = json_object_get(b, "output_format");
    const char *fparam = "output_config.format";
    if (format && !json_is_null(format) && beta_format && !json_is_null(beta_format) &&
        !json_equal(format, beta_format))
        return bad(e, "output_format", "output_format and output_config.format differ: give one of them.");
    if ((!format || json_is_null(format)) && beta_format && !json_is_null(beta_format)) {
        format = beta_format;
        fparam = "output_format";
    }
    if (format && !json_is_null(format)) {
        const char *type = json_string_value(json_object_get(format, "type"));
        json_t *schema = json_object_get(format, "schema");
        if (!type || strcmp(type, "json_schema") || !json_is_object(schema))
            return bad(e, fparam, "%s: expected {\"type\": \"json_schema\", \"schema\": {...}}.", fparam);
        json_object_set_new(oai, "response_format", json_pack("{s:s, s:{s:s, s:O}}", "type", "json_schema",
                                                              "json_schema", "name", "output", "schema", schema));
    }
    json_object_set_new(oai, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", think));
    json_t *stops = json_object_get(b, "stop_sequences");
    if (stops && !json_is_null(stops)) {
        if (!json_is_array(stops))
            return bad(e, "stop_sequences", "stop_sequences: expected an array of strings.");
        if (json_array_size(stops) > LILY_OAI_MAX_STOP)
            return bad(e, "stop_sequences", "stop_sequences: at most %d stop sequences are supported.",
                       LILY_OAI_MAX_STOP);
        size_t k;
        json_t *stop;
        json_array_foreach(stops, k, stop) {
            if (!json_is_string(stop))
                return bad(e, "stop_sequences", "stop_sequences.%zu: expected a string.", k);
            if (strlen(json_string_value(stop)) != json_string_length(stop))
                return bad(e, "stop_sequences", "stop_sequences.%zu: a stop sequence cannot contain U+0000.", k);
        }
        json_object_set(oai, "stop", stops);
    }
    static const char *const copied[] = {"temperature", "top_p", "top_k", "stream", "model"};
    for (size_t k = 0; k < sizeof copied / sizeof copied[0]; k++)
        if (json_object_get(b, copied[k]))
            json_object_set(oai, copied[k], json_object_get(b, copied[k]));
    json_t *temp = json_object_get(b, "temperature");
    if (json_is_number(temp) && json_number_value(temp) > 1)
        return bad(e, "temperature", "temperature: must be in [0, 1].");
    return final_assistant(b, oai, think, prefill, e);
}

bool lily_anth_parse_request(const char *body, size_t len, bool count_only, lily_oai_request *req,
                             lily_oai_error *e)
{
    memset(req, 0, sizeof *req);
    e->http_status = 0;
    json_t *b = NULL; /* the same bounds (depth, value count) and number rules as the OpenAI routes */
    if (!lily_oai_json_load(body, len, &b, e))
        return false;
    if (!json_is_object(b)) {
        json_decref(b);
        return bad(e, NULL, "The request body is not a JSON object.");
    }
    json_t *oai = json_object();
    bool prefill = false;
    bool ok = oai && translate(b, count_only, oai, &prefill, e);
    char *text = ok ? json_dumps(oai, JSON_COMPACT) : NULL;
    json_decref(oai);
    json_decref(b);
    if (ok && !text)
        return bad(e, NULL, "Out of memory.");
    if (!ok)
        return false;
    ok = lily_oai_parse_translated_request(text, strlen(text), req, e); /* json_dumps escapes U+0000 */
    free(text);
    if (ok) {
        req->anthropic = true;
        req->continue_final = prefill;
    }
    return ok;
}

int lily_anth_http_status(int http_status)
{
    return http_status == 503 ? 529 : http_status;
}

char *lily_anth_error_json(const lily_oai_error *e)
{
    const char *type = e->type;
    if (e->http_status == 401)
        type = "authentication_error";
    else if (e->http_status == 403)
        type = "permission_error";
    else if (e->http_status == 404 || e->http_status == 405)
        type = "not_found_error";
    else if (e->http_status == 413)
        type = "request_too_large";
    else if (e->http_status == 503)
        type = "overloaded_error";
    else if (e->http_status >= 500)
        type = "api_error";
    else
        type = "invalid_request_error";
    json_t *o = json_pack("{s:s, s:{s:s, s:o}}", "type", "error", "error", "type", type, "message",
                          lily_oai_string(e->message, strlen(e->message)));
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

/* ---------------------------------------------------------------------------------------------------
 * responses
 */

const char *lily_anth_stop_reason(const char *finish, const char *stop_sequence)
{
    if (!strcmp(finish, "tool_calls"))
        return "tool_use";
    if (!strcmp(finish, "length"))
        return "max_tokens";
    return stop_sequence ? "stop_sequence" : "end_turn";
}

/* "toolu_" + the id's part after "call_". */
static json_t *tool_use_id(const char *call_id)
{
    char id[48];
    snprintf(id, sizeof id, "toolu_%s", strncmp(call_id, "call_", 5) ? call_id : call_id + 5);
    return json_string(id);
}

static json_t *usage_json(const lily_anth_usage *u)
{
    return json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", u->input_tokens, "cache_creation_input_tokens", 0,
                     "cache_read_input_tokens", u->cache_read_input_tokens, "output_tokens", u->output_tokens);
}

json_t *lily_anth_message(const char *id, const char *model, const lily_parsed_output *o, char (*call_ids)[40],
                          int n_call_ids, const char *stop_reason, const char *stop_sequence,
                          const lily_anth_usage *u)
{
    json_t *content = json_array();
    if (!content)
        return NULL;
    if (o->reasoning_len)
        json_array_append_new(content, json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking",
                                                 lily_oai_string(o->reasoning, o->reasoning_len), "signature", ""));
    if (o->content_len)
        json_array_append_new(content, json_pack("{s:s, s:o}", "type", "text", "text",
                                                 lily_oai_string(o->content, o->content_len)));
    for (int i = 0; i < o->n_tool_calls; i++) {
        /* a \u0000 the model wrote; an integer past int64 (base/json_load.h: the nearest double, where jansson
         * alone gave an empty input; the streamed input_json_delta keeps its digits) */
        const char *arguments = o->tool_calls[i].arguments;
        json_t *input = lily_json_loadb(arguments, strlen(arguments), JSON_ALLOW_NUL, NULL);
        if (!json_is_object(input)) {
            json_decref(input);
            input = json_object();
        }
        char fallback[40];
        if (i >= n_call_ids)
            lily_oai_tool_call_id(fallback);
        json_array_append_new(content, json_pack("{s:s, s:o, s:s, s:o}", "type", "tool_use", "id",
                                                 tool_use_id(i < n_call_ids ? call_ids[i] : fallback), "name",
                                                 o->tool_calls[i].name, "input", input));
    }
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:o}", "id", id, "type", "message", "role", "assistant",
                     "model", model, "content", content, "stop_reason", stop_reason, "stop_sequence",
                     stop_sequence ? json_string(stop_sequence) : json_null(), "usage", usage_json(u));
}

int lily_anth_stream_start(const char *id, const char *model, const lily_anth_usage *u, json_t *out[2])
{
    out[0] = json_pack("{s:s, s:{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:o}}", "type", "message_start", "message", "id",
                       id, "type", "message", "role", "assistant", "model", model, "content", "stop_reason",
                       "stop_sequence", "usage", usage_json(u));
    out[1] = json_pack("{s:s}", "type", "ping");
    return 2;
}

static json_t *block_stop(int index) { return json_pack("{s:s, s:i}", "type", "content_block_stop", "index", index); }

int lily_anth_stream_event(lily_anth_stream *st, const lily_output_event *ev, const char *call_id, json_t *out[3])
{
    int n = 0;
    if (ev->kind == LILY_OUTPUT_TOOL_CALL_END) {
        if (st->index >= 0 && st->kind == LILY_OUTPUT_TOOL_CALL_START)
            out[n++] = block_stop(st->index);
        st->kind = -1;
        return n;
    }
    int kind = ev->kind == LILY_OUTPUT_TOOL_ARGUMENTS ? LILY_OUTPUT_TOOL_CALL_START : (int)ev->kind;
    if (ev->kind == LILY_OUTPUT_TOOL_CALL_START || st->index < 0 || st->kind != kind) {
        if (st->index >= 0 && st->kind >= 0)
            out[n++] = block_stop(st->index);
        st->index = st->index < 0 ? 0 : st->index + 1;
        st->kind = kind;
        json_t *block = NULL;
        if (kind == LILY_OUTPUT_REASONING)
            block = json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", "");
        else if (kind == LILY_OUTPUT_CONTENT)
            block = json_pack("{s:s, s:s}", "type", "text", "text", "");
        else
            block = json_pack("{s:s, s:o, s:o, s:{}}", "type", "tool_use", "id", tool_use_id(call_id ? call_id : "call_"),
                              "name", lily_oai_string(ev->kind == LILY_OUTPUT_TOOL_CALL_START ? ev->text : "",
                                                      ev->kind == LILY_OUTPUT_TOOL_CALL_START ? strlen(ev->text) : 0),
                              "input");
        out[n++] = json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", st->index, "content_block", block);
        if (ev->kind == LILY_OUTPUT_TOOL_CALL_START)
            return n;
    }
    json_t *delta = NULL;
    if (kind == LILY_OUTPUT_REASONING)
        delta = json_pack("{s:s, s:o}", "type", "thinking_delta", "thinking", lily_oai_string(ev->text, ev->len));
    else if (kind == LILY_OUTPUT_CONTENT)
        delta = json_pack("{s:s, s:o}", "type", "text_delta", "text", lily_oai_string(ev->text, ev->len));
    else
        delta = json_pack("{s:s, s:o}", "type", "input_json_delta", "partial_json", lily_oai_string(ev->text, ev->len));
    out[n++] = json_pack("{s:s, s:i, s:o}", "type", "content_block_delta", "index", st->index, "delta", delta);
    return n;
}

int lily_anth_stream_end(lily_anth_stream *st, const char *stop_reason, const char *stop_sequence,
                         const lily_anth_usage *u, json_t *out[3])
{
    int n = 0;
    if (st->index >= 0 && st->kind >= 0)
        out[n++] = block_stop(st->index);
    st->kind = -1;
    out[n++] = json_pack("{s:s, s:{s:s, s:o}, s:o}", "type", "message_delta", "delta", "stop_reason", stop_reason,
                         "stop_sequence", stop_sequence ? json_string(stop_sequence) : json_null(), "usage",
                         usage_json(u));
    out[n++] = json_pack("{s:s}", "type", "message_stop");
    return n;
}
