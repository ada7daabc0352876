/* responses.c — OpenAI's Responses API wire format (responses.h). */
#include "server/responses.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A 400 invalid_request_error naming param; false, for `return bad(...)`. */
#define bad(e, param, ...) (lily_oai_error_set(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__), false)


/* At most the first 64 bytes of s, ending on a character boundary: printf("%.*s", quoted_len(s), s). */
static int quoted_len(const char *s)
{
    size_t n = strlen(s);
    return (int)lily_oai_utf8_cut(s, n < 64 ? n : 64);
}

/* Append n bytes to the NUL-terminated *p of *len bytes (capacity *cap). False when out of memory. */
static bool bytes_append(char **p, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 64;
        while (c < *len + n + 1)
            c *= 2;
        char *q = realloc(*p, c);
        if (!q)
            return false;
        *p = q;
        *cap = c;
    }
    memcpy(*p + *len, s, n);
    *len += n;
    (*p)[*len] = '\0';
    return true;
}

/* Text gathered from strings and content parts: n bytes at p (may hold U+0000, as lily's replies may). */
typedef struct {
    char *p;
    size_t n, cap;
} text_buf;

static bool text_append(text_buf *t, const char *s, size_t n) { return bytes_append(&t->p, &t->n, &t->cap, s, n); }

/* ---------------------------------------------------------------------------------------------------
 * request -> the chat request the engine runs
 */

/* The text of a message item's content: a string, or an array of input_text / output_text parts (an
 * assistant's refusal part as its text), appended to out. where: "input[3].content". */
static bool content_text(json_t *content, const char *where, text_buf *out, lily_oai_error *e)
{
    if (!content)
        return bad(e, where, "Missing required parameter: '%s'.", where);
    if (json_is_string(content))
        return text_append(out, json_string_value(content), json_string_length(content)) || lily_oai_out_of_memory(e);
    if (!json_is_array(content))
        return bad(e, where, "Invalid type for '%s': expected a string or an array of content parts, but got %s "
                             "instead.", where, lily_oai_json_kind(content));
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part) {
        char pw[64];
        snprintf(pw, sizeof pw, "%s[%zu]", where, i);
        const char *type = json_string_value(json_object_get(part, "type"));
        if (!json_is_object(part) || !type)
            return bad(e, pw, "Invalid '%s': expected a content part with a 'type'.", pw);
        const char *field = !strcmp(type, "input_text") || !strcmp(type, "output_text") ? "text"
                          : !strcmp(type, "refusal")                                     ? "refusal"
                                                                                         : NULL;
        if (!field && (!strncmp(type, "input_", 6)))
            return bad(e, pw, "Unsupported content part type '%.*s' in '%s': this model takes text only.",
                       quoted_len(type), type, pw);
        if (!field)
            return bad(e, pw, "Invalid value for '%s.type': '%.*s'. Supported values are: 'input_text' and "
                              "'output_text'.", pw, quoted_len(type), type);
        json_t *text = json_object_get(part, field);
        if (!json_is_string(text))
            return bad(e, pw, "Invalid type for '%s.%s': expected a string, but got %s instead.", pw, field,
                       lily_oai_json_kind(text));
        if (!text_append(out, json_string_value(text), json_string_length(text)))
            return lily_oai_out_of_memory(e);
    }
    return true;
}

/* The assistant turn being gathered from consecutive reasoning, assistant message and function_call items
 * (the order the model writes them in: reasoning, then content, then calls). */
typedef struct {
    text_buf reasoning, content;
    json_t *calls;            /* chat tool_calls, or NULL */
    json_t *origin;           /* its entry of the chat messages' origins (translate_input), or NULL */
    int stage;                /* the last item's: 0 reasoning, 1 content, 2 function_call; -1 when empty */
} assistant_turn;

static void assistant_turn_clear(assistant_turn *t)
{
    free(t->reasoning.p);
    free(t->content.p);
    json_decref(t->calls);
    json_decref(t->origin);
    *t = (assistant_turn){.stage = -1};
}

/* The gathered turn as one chat assistant message appended to msgs, its origin to origins (nothing when
 * empty); the turn is cleared. */
static bool flush_assistant(assistant_turn *t, json_t *msgs, json_t *origins, lily_oai_error *e)
{
    bool ok = true;
    if (t->stage >= 0) {
        json_t *m = json_pack("{s:s, s:s%}", "role", "assistant", "content", t->content.p ? t->content.p : "",
                              t->content.n);
        if (m && t->reasoning.p)
            json_object_set_new(m, "reasoning_content", json_stringn(t->reasoning.p, t->reasoning.n));
        if (m && t->calls)
            json_object_set(m, "tool_calls", t->calls);
        ok = m && !json_array_append_new(msgs, m) && !json_array_append(origins, t->origin);
    }
    assistant_turn_clear(t);
    return ok || lily_oai_out_of_memory(e);
}

/* Start a new assistant turn for input[index] of this stage unless it continues the gathered one. */
static bool assistant_item(assistant_turn *t, int stage, size_t index, json_t *msgs, json_t *origins,
                           lily_oai_error *e)
{
    if (t->stage > stage || (t->stage == stage && stage != 2))
        if (!flush_assistant(t, msgs, origins, e))
            return false;
    if (t->stage < 0 && !(t->origin = json_pack("[I]", (json_int_t)index)))
        return lily_oai_out_of_memory(e);
    t->stage = stage;
    return true;
}

/* A reasoning item: its content's reasoning_text parts, else its summary's summary_text parts. */
static bool reasoning_item(json_t *item, const char *where, assistant_turn *t, lily_oai_error *e)
{
    json_t *content = json_object_get(item, "content");
    json_t *parts = json_is_array(content) && json_array_size(content) ? content : json_object_get(item, "summary");
    if (!json_is_array(parts) && !json_is_null(parts) && parts)
        return bad(e, where, "Invalid '%s.summary': expected an array of summary_text parts.", where);
    size_t i;
    json_t *part;
    json_array_foreach(parts, i, part) {
        json_t *text = json_object_get(part, "text");
        if (!json_is_string(text))
            return bad(e, where, "Invalid '%s': each reasoning part needs a string 'text'.", where);
        if ((i && !text_append(&t->reasoning, "\n", 1)) ||
            !text_append(&t->reasoning, json_string_value(text), json_string_length(text)))
            return lily_oai_out_of_memory(e);
    }
    if (!t->reasoning.p && !text_append(&t->reasoning, "", 0))
        return lily_oai_out_of_memory(e);
    return true;
}

/* A function_call item, input[index], as a chat tool call; its call_id joins call_ids (a JSON object used as a
 * set). */
static bool function_call_item(json_t *item, const char *where, size_t index, assistant_turn *t, json_t *call_ids,
                               lily_oai_error *e)
{
    static const char *const fields[] = {"call_id", "name", "arguments"};
    for (size_t k = 0; k < 3; k++)
        if (!json_is_string(json_object_get(item, fields[k]))) {
            char fw[64];
            snprintf(fw, sizeof fw, "%s.%s", where, fields[k]);
            return bad(e, fw, "Invalid '%s': a function_call item needs the strings 'call_id', 'name' and "
                              "'arguments'.", fw);
        }
    const char *call_id = json_string_value(json_object_get(item, "call_id"));
    if (!t->calls && !(t->calls = json_array()))
        return lily_oai_out_of_memory(e);
    if (json_object_set_new(call_ids, call_id, json_true()) ||
        json_array_append_new(t->origin, json_integer((json_int_t)index)) ||
        json_array_append_new(t->calls, json_pack("{s:s, s:s, s:{s:O, s:O}}", "id", call_id, "type", "function",
                                                  "function", "name", json_object_get(item, "name"), "arguments",
                                                  json_object_get(item, "arguments"))))
        return lily_oai_out_of_memory(e);
    return true;
}

/* A function_call_output item as a chat tool message: it must answer a function_call item before it. */
static bool function_call_output_item(json_t *item, const char *where, json_t *msgs, json_t *call_ids,
                                      lily_oai_error *e)
{
    char fw[64];
    const char *call_id = json_string_value(json_object_get(item, "call_id"));
    snprintf(fw, sizeof fw, "%s.call_id", where);
    if (!call_id)
        return bad(e, fw, "Missing required parameter: '%s'.", fw);
    if (!json_object_get(call_ids, call_id))
        return bad(e, fw, "No tool call found for function call output with call_id '%.*s': each "
                          "function_call_output item must answer a function_call item before it (lily is "
                          "stateless: send the call in 'input' too).", quoted_len(call_id), call_id);
    text_buf out = {0};
    snprintf(fw, sizeof fw, "%s.output", where);
    bool ok = content_text(json_object_get(item, "output"), fw, &out, e);
    if (ok && json_array_append_new(msgs, json_pack("{s:s, s:s, s:s%}", "role", "tool", "tool_call_id", call_id,
                                                    "content", out.p ? out.p : "", out.n)))
        ok = lily_oai_out_of_memory(e);
    free(out.p);
    return ok;
}

/* One input item, input[index] (where: "input[index]"), appended to msgs with its origin [index], or to the
 * gathered assistant turn. */
static bool input_item(json_t *item, const char *where, size_t index, json_t *msgs, json_t *origins,
                       assistant_turn *turn, json_t *call_ids, lily_oai_error *e)
{
    if (!json_is_object(item))
        return bad(e, where, "Invalid type for '%s': expected an object, but got %s instead.", where,
                   lily_oai_json_kind(item));
    json_t *type_json = json_object_get(item, "type");
    if (type_json && !json_is_string(type_json))
        return bad(e, where, "Invalid type for '%s.type': expected a string.", where);
    const char *type = type_json ? json_string_value(type_json) : "message"; /* EasyInputMessage: no type */
    if (!strcmp(type, "message")) {
        const char *role = json_string_value(json_object_get(item, "role"));
        char fw[64];
        snprintf(fw, sizeof fw, "%s.role", where);
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
                      strcmp(role, "developer")))
            return bad(e, fw, "Invalid value for '%s': expected 'user', 'assistant', 'system' or 'developer'.", fw);
        snprintf(fw, sizeof fw, "%s.content", where);
        json_t *content = json_object_get(item, "content");
        if (!strcmp(role, "assistant"))
            return assistant_item(turn, 1, index, msgs, origins, e) && content_text(content, fw, &turn->content, e);
        text_buf text = {0};
        bool ok = flush_assistant(turn, msgs, origins, e) && content_text(content, fw, &text, e);
        if (ok && (json_array_append_new(msgs, json_pack("{s:s, s:s%}", "role", role, "content",
                                                         text.p ? text.p : "", text.n)) ||
                   json_array_append_new(origins, json_pack("[I]", (json_int_t)index))))
            ok = lily_oai_out_of_memory(e);
        free(text.p);
        return ok;
    }
    if (!strcmp(type, "reasoning"))
        return assistant_item(turn, 0, index, msgs, origins, e) && reasoning_item(item, where, turn, e);
    if (!strcmp(type, "function_call"))
        return assistant_item(turn, 2, index, msgs, origins, e) &&
               function_call_item(item, where, index, turn, call_ids, e);
    if (!strcmp(type, "function_call_output"))
        return flush_assistant(turn, msgs, origins, e) &&
               function_call_output_item(item, where, msgs, call_ids, e) &&
               (!json_array_append_new(origins, json_pack("[I]", (json_int_t)index)) || lily_oai_out_of_memory(e));
    if (!strcmp(type, "item_reference"))
        return bad(e, where, "Invalid '%s': item_reference is not supported: lily's Responses API is stateless "
                             "(nothing is stored); send the item itself.", where);
    return bad(e, where, "Invalid value for '%s.type': '%.*s'. Supported values are: 'message', 'reasoning', "
                         "'function_call' and 'function_call_output'.", where, quoted_len(type), type);
}

/* instructions and input as chat messages: the instructions as a system message, then the items in order. A
 * system / developer item stays where it is: the server joins every system message into the chat template's
 * one system block (lily_chat_options.fold_system). origins gets each message's origin (lily_oai_request.
 * responses_origins). */
static bool translate_input(json_t *b, json_t *msgs, json_t *origins, lily_oai_error *e)
{
    json_t *instructions = json_object_get(b, "instructions");
    if (instructions && !json_is_null(instructions) && !json_is_string(instructions))
        return bad(e, "instructions", "Invalid type for 'instructions': expected a string, but got %s instead.",
                   lily_oai_json_kind(instructions));
    json_t *input = json_object_get(b, "input");
    if (!input || json_is_null(input))
        return bad(e, "input", "Missing required parameter: 'input' (lily's Responses API is stateless: the whole "
                               "conversation comes in 'input').");
    if (!json_is_string(input) && !json_is_array(input))
        return bad(e, "input", "Invalid type for 'input': expected a string or an array of input items, but got %s "
                               "instead.", lily_oai_json_kind(input));
    if (json_is_array(input) && !json_array_size(input))
        return bad(e, "input", "Invalid 'input': empty array. Expected an array with minimum length 1.");
    json_t *items = json_is_string(input) ? json_pack("[{s:s, s:O}]", "role", "user", "content", input)
                                          : json_incref(input);
    json_t *call_ids = json_object();
    bool ok = items && call_ids;
    if (!ok)
        lily_oai_out_of_memory(e);
    if (ok && json_string_length(instructions) > 0 && /* "": no instructions */
        (json_array_append_new(msgs, json_pack("{s:s, s:s%}", "role", "system", "content",
                                               json_string_value(instructions), json_string_length(instructions))) ||
         json_array_append_new(origins, json_pack("[i]", -1))))
        ok = lily_oai_out_of_memory(e);
    assistant_turn turn = {.stage = -1};
    size_t i;
    json_t *item;
    json_array_foreach(items, i, item) {
        if (!ok)
            break;
        char where[48];
        snprintf(where, sizeof where, "input[%zu]", i);
        ok = input_item(item, where, i, msgs, origins, &turn, call_ids, e);
    }
    ok = ok && flush_assistant(&turn, msgs, origins, e);
    assistant_turn_clear(&turn);
    json_decref(items);
    json_decref(call_ids);
    return ok;
}

/* Flat function tools as chat tools; hosted tools are refused. */
static bool translate_tools(json_t *b, json_t *oai, lily_oai_error *e)
{
    json_t *tools = json_object_get(b, "tools");
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return bad(e, "tools", "Invalid type for 'tools': expected an array, but got %s instead.",
                   lily_oai_json_kind(tools));
    json_t *out = json_array(), *names = json_object();
    if (!out || !names) {
        json_decref(out);
        json_decref(names);
        return lily_oai_out_of_memory(e);
    }
    if (json_is_array(tools)) /* (none: the chat route says a forcing tool_choice needs tools) */
        json_object_set(oai, "tools", out);
    json_decref(out);
    size_t i;
    json_t *t;
    bool ok = true;
    json_array_foreach(tools, i, t) {
        char where[48];
        snprintf(where, sizeof where, "tools[%zu]", i);
        const char *type = json_string_value(json_object_get(t, "type"));
        json_t *name = json_object_get(t, "name");
        json_t *params = json_object_get(t, "parameters");
        json_t *desc = json_object_get(t, "description");
        json_t *strict = json_object_get(t, "strict");
        if (!json_is_object(t) || !type) {
            ok = bad(e, where, "Invalid '%s': expected {\"type\": \"function\", \"name\": ..., \"parameters\": {...}}.",
                     where);
        } else if (strcmp(type, "function")) {
            ok = bad(e, where, "Invalid value for '%s.type': '%.*s': only 'function' tools are supported (lily runs "
                               "no hosted tools).", where, quoted_len(type), type);
        } else if (!lily_oai_valid_tool_name(name, LILY_OAI_MAX_TOOL_NAME)) {
            const char *s = json_string_value(name);
            ok = bad(e, where, "Invalid '%s.name': '%.*s' does not match '^[a-zA-Z0-9_-]{1,%d}$'.", where,
                     s ? quoted_len(s) : 0, s ? s : "", LILY_OAI_MAX_TOOL_NAME);
        } else if (json_object_get(names, json_string_value(name))) {
            ok = bad(e, where, "Invalid 'tools': the function name '%s' is given twice.", json_string_value(name));
        } else if (params && !json_is_null(params) && !json_is_object(params)) {
            ok = bad(e, where, "Invalid type for '%s.parameters': expected a JSON schema object, but got %s instead.",
                     where, lily_oai_json_kind(params));
        } else if (desc && !json_is_null(desc) && !json_is_string(desc)) {
            ok = bad(e, where, "Invalid type for '%s.description': expected a string.", where);
        } else if (strict && !json_is_null(strict) && !json_is_boolean(strict)) {
            ok = bad(e, where, "Invalid type for '%s.strict': expected a boolean.", where);
        }
        if (!ok) {
            json_decref(names);
            return false;
        }
        json_t *fn = json_pack("{s:O}", "name", name);
        if (fn && json_is_object(params))
            json_object_set(fn, "parameters", params);
        if (fn && json_is_string(desc))
            json_object_set(fn, "description", desc);
        if (fn && json_is_boolean(strict))
            json_object_set(fn, "strict", strict);
        if (!fn || json_object_set_new(names, json_string_value(name), json_true()) ||
            json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn))) {
            json_decref(names);
            return lily_oai_out_of_memory(e);
        }
    }
    json_decref(names);
    json_t *tc = json_object_get(b, "tool_choice");
    if (!tc || json_is_null(tc))
        return true;
    if (json_is_string(tc)) { /* auto, none, required: the chat route checks the value */
        json_object_set(oai, "tool_choice", tc);
        return true;
    }
    const char *type = json_string_value(json_object_get(tc, "type"));
    json_t *name = json_object_get(tc, "name");
    if (type && !strcmp(type, "allowed_tools")) { /* as the chat route's: {"type": "function", "function": {name}} */
        json_t *list = json_object_get(tc, "tools"), *a, *names = json_array();
        size_t i;
        if (!names)
            return lily_oai_out_of_memory(e);
        json_array_foreach(list, i, a) {
            const char *atype = json_string_value(json_object_get(a, "type"));
            json_t *aname = json_object_get(a, "name");
            if (!atype || strcmp(atype, "function") || !json_is_string(aname)) {
                json_decref(names);
                return bad(e, "tool_choice.tools", "Invalid 'tool_choice.tools[%zu]': only {\"type\": \"function\", "
                                                   "\"name\": ...} tools are supported.", i);
            }
            if (json_array_append_new(names, json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", aname))) {
                json_decref(names);
                return lily_oai_out_of_memory(e);
            }
        }
        json_t *at = json_object(), *mode = json_object_get(tc, "mode");
        bool failed = !at || (mode && json_object_set(at, "mode", mode)) ||
                      (json_is_array(list) && json_object_set(at, "tools", names));
        json_decref(names);
        if (failed || json_object_set_new(oai, "tool_choice", json_pack("{s:s, s:O}", "type", "allowed_tools",
                                                                        "allowed_tools", at))) {
            json_decref(at);
            return lily_oai_out_of_memory(e);
        }
        json_decref(at);
        return true;
    }
    if (!json_is_object(tc) || !type || strcmp(type, "function") || !json_is_string(name))
        return bad(e, "tool_choice", "Invalid 'tool_choice': expected 'auto', 'none', 'required', {\"type\": "
                                     "\"function\", \"name\": ...} or {\"type\": \"allowed_tools\", ...}.");
    json_object_set_new(oai, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name));
    return true;
}

/* text.format as the chat route's response_format. */
static bool translate_text_format(json_t *b, json_t *oai, lily_oai_error *e)
{
    json_t *text = json_object_get(b, "text");
    if (!text || json_is_null(text))
        return true;
    if (!json_is_object(text))
        return bad(e, "text", "Invalid type for 'text': expected an object, but got %s instead.",
                   lily_oai_json_kind(text));
    json_t *format = json_object_get(text, "format");
    if (!format || json_is_null(format))
        return true;
    const char *type = json_string_value(json_object_get(format, "type"));
    if (!json_is_object(format) || !type)
        return bad(e, "text.format", "Invalid 'text.format': expected an object with a 'type'.");
    if (!strcmp(type, "text"))
        return true;
    if (!strcmp(type, "json_object")) {
        json_object_set_new(oai, "response_format", json_pack("{s:s}", "type", "json_object"));
        return true;
    }
    if (strcmp(type, "json_schema"))
        return bad(e, "text.format.type", "Invalid value for 'text.format.type': '%.*s'. Supported values are: "
                                          "'text', 'json_object' and 'json_schema'.", quoted_len(type), type);
    json_t *schema = json_object_get(format, "schema");
    json_t *name = json_object_get(format, "name");
    json_t *strict = json_object_get(format, "strict");
    if (!json_is_object(schema))
        return bad(e, "text.format.schema", "Invalid 'text.format.schema': expected a JSON schema object%s.",
                   schema ? "" : " (missing)");
    if (name && !json_is_string(name))
        return bad(e, "text.format.name", "Invalid type for 'text.format.name': expected a string.");
    if (strict && !json_is_null(strict) && !json_is_boolean(strict))
        return bad(e, "text.format.strict", "Invalid type for 'text.format.strict': expected a boolean.");
    json_t *js = json_pack("{s:s, s:O}", "name", name ? json_string_value(name) : "output", "schema", schema);
    if (js && json_is_boolean(strict))
        json_object_set(js, "strict", strict);
    json_object_set_new(oai, "response_format", json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js));
    return true;
}

/* Fields that would need stored state, refused rather than dropped: the reply would answer another
 * conversation than the client meant. */
static bool check_stateless(json_t *b, lily_oai_error *e)
{
    static const char *const stored[] = {"previous_response_id", "conversation", "prompt"};
    for (size_t i = 0; i < sizeof stored / sizeof stored[0]; i++) {
        json_t *v = json_object_get(b, stored[i]);
        if (v && !json_is_null(v))
            return bad(e, stored[i], "Invalid parameter '%s': lily's Responses API is stateless (no response, "
                       "conversation or prompt is stored): send the whole conversation in 'input', with store "
                       "false.", stored[i]);
    }
    json_t *background = json_object_get(b, "background");
    if (background && !json_is_null(background) && !json_is_boolean(background))
        return bad(e, "background", "Invalid type for 'background': expected a boolean.");
    if (json_is_true(background))
        return bad(e, "background", "Invalid value for 'background': background responses need stored state; "
                                    "lily's Responses API is stateless (use stream instead).");
    json_t *store = json_object_get(b, "store");
    if (store && !json_is_null(store) && !json_is_boolean(store))
        return bad(e, "store", "Invalid type for 'store': expected a boolean, but got %s instead.",
                   lily_oai_json_kind(store));
    json_t *metadata = json_object_get(b, "metadata");
    if (metadata && !json_is_null(metadata)) {
        if (!json_is_object(metadata))
            return bad(e, "metadata", "Invalid type for 'metadata': expected an object, but got %s instead.",
                       lily_oai_json_kind(metadata));
        const char *k;
        json_t *v;
        json_object_foreach(metadata, k, v) if (!json_is_string(v))
            return bad(e, "metadata", "Invalid 'metadata.%.*s': expected a string value, but got %s instead.",
                       quoted_len(k), k, lily_oai_json_kind(v));
    }
    return true;
}

/* The Responses request as a chat request (oai), the fields the Response echoes (echo), and the origin of
 * each chat message (origins). */
static bool translate(json_t *b, json_t *oai, json_t *echo, json_t *origins, lily_oai_error *e)
{
    json_t *msgs = json_array();
    if (!msgs)
        return lily_oai_out_of_memory(e);
    json_object_set_new(oai, "messages", msgs);
    if (!check_stateless(b, e) || !translate_input(b, msgs, origins, e) || !translate_tools(b, oai, e) ||
        !translate_text_format(b, oai, e))
        return false;
    json_t *mt = json_object_get(b, "max_output_tokens");
    if (mt && !json_is_null(mt)) {
        if (!json_is_integer(mt) || json_integer_value(mt) < 1 || json_integer_value(mt) > INT_MAX)
            return bad(e, "max_output_tokens", "Invalid 'max_output_tokens': expected an integer >= 1 and <= %d.",
                       INT_MAX);
        json_object_set(oai, "max_tokens", mt);
    }
    json_t *user = json_object_get(b, "user"); /* echoed: a typed client reads a string or null there */
    if (user && !json_is_null(user) && !json_is_string(user))
        return bad(e, "user", "Invalid type for 'user': expected a string, but got %s instead.",
                   lily_oai_json_kind(user));
    json_t *reasoning = json_object_get(b, "reasoning");
    json_t *effort = json_object_get(reasoning, "effort");
    if (reasoning && !json_is_null(reasoning) && !json_is_object(reasoning))
        return bad(e, "reasoning", "Invalid type for 'reasoning': expected an object, but got %s instead.",
                   lily_oai_json_kind(reasoning));
    if (effort && !json_is_null(effort)) {
        static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
        bool known = false;
        for (size_t i = 0; json_is_string(effort) && i < sizeof efforts / sizeof efforts[0]; i++)
            known |= !strcmp(json_string_value(effort), efforts[i]);
        if (!known)
            return bad(e, "reasoning.effort", "Invalid value for 'reasoning.effort': supported values are 'none', "
                                              "'minimal', 'low', 'medium', 'high' and 'xhigh'.");
        json_object_set(oai, "reasoning_effort", effort); /* as the chat route: 'none' turns thinking off */
    }
    /* the Responses fields the chat route reads under the same name, and lily's chat extensions (vLLM's) */
    static const char *const copied[] = {"model", "stream", "temperature", "top_p", "parallel_tool_calls", "top_k",
                                         "min_p", "repetition_penalty", "seed", "chat_template_kwargs",
                                         "reasoning_budget", "max_reasoning_tokens"};
    for (size_t k = 0; k < sizeof copied / sizeof copied[0]; k++)
        if (json_object_get(b, copied[k]))
            json_object_set(oai, copied[k], json_object_get(b, copied[k]));

    /* the echo: the request's own values (OpenAI's defaults where it left them out) */
    json_t *text = json_object_get(b, "text");
    json_t *metadata = json_object_get(b, "metadata");
    json_t *tools = json_object_get(b, "tools");
    json_t *tc = json_object_get(b, "tool_choice");
    json_t *ptc = json_object_get(b, "parallel_tool_calls");
    static const char *const nullable[] = {"instructions", "max_output_tokens", "temperature", "top_p", "user"};
    for (size_t k = 0; k < sizeof nullable / sizeof nullable[0]; k++) {
        json_t *v = json_object_get(b, nullable[k]);
        json_object_set_new(echo, nullable[k], v ? json_incref(v) : json_null());
    }
    json_object_set_new(echo, "metadata", json_is_object(metadata) ? json_incref(metadata) : json_object());
    json_object_set_new(echo, "parallel_tool_calls", json_is_boolean(ptc) ? json_incref(ptc) : json_true());
    json_object_set_new(echo, "reasoning", json_pack("{s:O?, s:n}", "effort", effort, "summary"));
    json_object_set_new(echo, "text", json_is_object(json_object_get(text, "format"))
                                          ? json_incref(text) : json_pack("{s:{s:s}}", "format", "type", "text"));
    json_object_set_new(echo, "tool_choice", tc && !json_is_null(tc) ? json_incref(tc) : json_string("auto"));
    json_object_set_new(echo, "tools", json_is_array(tools) ? json_incref(tools) : json_array());
    json_object_set_new(echo, "truncation", json_string("disabled"));
    return true;
}

bool lily_resp_parse_request(const char *body, size_t len, lily_oai_request *req, lily_oai_error *e)
{
    memset(req, 0, sizeof *req);
    e->http_status = 0;
    json_t *b = NULL; /* the same bounds (depth, value count) and number rules as the chat route */
    if (!lily_oai_json_load(body, len, &b, e))
        return false;
    if (!json_is_object(b)) {
        const char *kind = lily_oai_json_kind(b);
        json_decref(b);
        return bad(e, NULL, "Invalid request body: expected a JSON object, but got %s instead.", kind);
    }
    json_t *oai = json_object(), *echo = json_object(), *origins = json_array();
    bool ok = oai && echo && origins ? translate(b, oai, echo, origins, e) : lily_oai_out_of_memory(e);
    char *text = ok ? json_dumps(oai, JSON_COMPACT) : NULL;
    json_decref(oai);
    json_decref(b);
    if (ok && !text)
        ok = lily_oai_out_of_memory(e);
    ok = ok && lily_oai_parse_request(text, strlen(text), true, req, e); /* json_dumps escapes U+0000 */
    free(text);
    if (!ok) {
        json_decref(echo);
        json_decref(origins);
        return false;
    }
    req->responses = echo;
    req->responses_origins = origins;
    return true;
}

void lily_resp_template_error(const lily_oai_request *req, const char *message, lily_oai_error *e)
{
    size_t n = 0, k = 0;
    int head = 0, call = 0;
    /* "chat template: messages[N]: REST", REST maybe "tool_calls[K].FIELD: ..." */
    sscanf(message, "chat template: messages[%zu]: %n", &n, &head);
    const json_t *origin = head ? json_array_get(req->responses_origins, n) : NULL;
    if (!origin) {
        lily_oai_error_set(e, 400, "invalid_request_error", "input", NULL, "%s", message);
        return;
    }
    const char *rest = message + head;
    sscanf(rest, "tool_calls[%zu]%n", &k, &call);
    const json_t *item = call ? json_array_get(origin, 1 + k) : NULL;
    if (item) { /* the function_call item itself: its field in param ("input[3].arguments") */
        rest += call;
        char param[64];
        int len = snprintf(param, sizeof param, "input[%lld]", (long long)json_integer_value(item));
        size_t field = strcspn(rest, ": ");
        snprintf(param + len, sizeof param - (size_t)len, "%.*s", (int)field, rest);
        lily_oai_error_set(e, 400, "invalid_request_error", param, NULL, "chat template: input[%lld]%s",
                           (long long)json_integer_value(item), rest);
        return;
    }
    json_int_t index = json_integer_value(json_array_get(origin, 0));
    char param[48];
    if (index < 0)
        snprintf(param, sizeof param, "instructions");
    else
        snprintf(param, sizeof param, "input[%lld]", (long long)index);
    lily_oai_error_set(e, 400, "invalid_request_error", param, NULL, "chat template: %s: %s", param, rest);
}

/* ---------------------------------------------------------------------------------------------------
 * the Response and its stream
 */

static json_t *usage_json(const lily_oai_usage *u)
{
    return json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", u->prompt_tokens, "input_tokens_details",
                     "cached_tokens", u->cached_tokens, "output_tokens", u->completion_tokens, "output_tokens_details",
                     "reasoning_tokens", u->reasoning_tokens, "total_tokens", u->prompt_tokens + u->completion_tokens);
}

json_t *lily_resp_response(const lily_resp_output *o, const char *status, const lily_oai_usage *u)
{
    json_t *r = json_pack("{s:s, s:s, s:I, s:s, s:n, s:o, s:s, s:o, s:o, s:b, s:n}", "id", o->ident->id, "object",
                          "response", "created_at", (json_int_t)o->ident->created, "status", status, "error",
                          "incomplete_details",
                          strcmp(status, "incomplete") ? json_null()
                                                       : json_pack("{s:s}", "reason", "max_output_tokens"),
                          "model", o->ident->model, "output", json_copy(o->output), "usage",
                          u ? usage_json(u) : json_null(),
                          "store", false, "previous_response_id");
    if (r && o->echo && json_object_update_missing(r, (json_t *)o->echo)) {
        json_decref(r);
        return NULL;
    }
    return r;
}

json_t *lily_resp_error_event(const lily_oai_error *e, int seq)
{
    return json_pack("{s:s, s:o, s:o, s:o, s:i}", "type", "error", "code",
                     e->code[0] ? json_string(e->code) : json_string(e->type), "message",
                     lily_oai_string(e->message, strlen(e->message)), "param",
                     e->param[0] ? json_string(e->param) : json_null(), "sequence_number", seq);
}

bool lily_resp_output_init(lily_resp_output *o, const lily_oai_ident *ident, const json_t *echo)
{
    *o = (lily_resp_output){.ident = ident, .echo = echo, .open = -1, .output = json_array()};
    return o->output != NULL;
}

void lily_resp_output_free(lily_resp_output *o)
{
    json_decref(o->output);
    free(o->name);
    free(o->text);
    *o = (lily_resp_output){.open = -1};
}

/* An event of this type: its type, the fields of `fields` (stolen) and the next sequence_number. */
static json_t *event(lily_resp_output *o, const char *type, json_t *fields)
{
    json_t *ev = fields ? json_pack("{s:s}", "type", type) : NULL;
    if (ev && json_object_update(ev, fields)) {
        json_decref(ev);
        ev = NULL;
    }
    json_decref(fields);
    if (ev)
        json_object_set_new(ev, "sequence_number", json_integer(o->seq++));
    return ev;
}

int lily_resp_stream_start(lily_resp_output *o, json_t *out[2])
{
    static const char *const types[] = {"response.created", "response.in_progress"};
    for (int i = 0; i < 2; i++)
        out[i] = event(o, types[i], json_pack("{s:o}", "response", lily_resp_response(o, "in_progress", NULL)));
    return 2;
}

/* The open item as its JSON, with its text so far and this status; "in_progress": as just added, without
 * its content part (response.content_part.added brings it). */
static json_t *open_item(const lily_resp_output *o, const char *status)
{
    json_t *text = lily_oai_string(o->text ? o->text : "", o->text_len);
    if (o->open != LILY_OUTPUT_TOOL_CALL_START && !strcmp(status, "in_progress")) {
        json_decref(text);
        return o->open == LILY_OUTPUT_REASONING
                   ? json_pack("{s:s, s:s, s:[], s:[], s:s}", "id", o->item_id, "type", "reasoning", "summary",
                               "content", "status", status)
                   : json_pack("{s:s, s:s, s:s, s:s, s:[]}", "id", o->item_id, "type", "message", "status", status,
                               "role", "assistant", "content");
    }
    if (o->open == LILY_OUTPUT_REASONING)
        return json_pack("{s:s, s:s, s:[], s:[{s:s, s:o}], s:s}", "id", o->item_id, "type", "reasoning", "summary",
                         "content", "type", "reasoning_text", "text", text, "status", status);
    if (o->open == LILY_OUTPUT_CONTENT)
        return json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:o, s:[], s:[]}]}", "id", o->item_id, "type", "message",
                         "status", status, "role", "assistant", "content", "type", "output_text", "text", text,
                         "annotations", "logprobs");
    return json_pack("{s:s, s:s, s:s, s:o, s:o, s:s}", "id", o->item_id, "type", "function_call", "call_id",
                     o->call_id, "name", lily_oai_string(o->name ? o->name : "", o->name ? strlen(o->name) : 0),
                     "arguments", text, "status", status);
}

/* The open item's content part with its text so far. */
static json_t *open_part(const lily_resp_output *o)
{
    json_t *text = lily_oai_string(o->text ? o->text : "", o->text_len);
    if (o->open == LILY_OUTPUT_REASONING)
        return json_pack("{s:s, s:o}", "type", "reasoning_text", "text", text);
    return json_pack("{s:s, s:o, s:[], s:[]}", "type", "output_text", "text", text, "annotations", "logprobs");
}

/* Close the open item: its done events into out[n..) (when out), the item into the output. */
static int close_item(lily_resp_output *o, const char *status, json_t **out)
{
    int n = 0;
    if (o->open < 0)
        return 0;
    size_t index = json_array_size(o->output);
    json_t *text = lily_oai_string(o->text ? o->text : "", o->text_len);
    if (out && o->open == LILY_OUTPUT_TOOL_CALL_START) {
        out[n++] = event(o, "response.function_call_arguments.done",
                         json_pack("{s:s, s:i, s:o, s:O}", "item_id", o->item_id, "output_index", (int)index, "name",
                                   lily_oai_string(o->name ? o->name : "", o->name ? strlen(o->name) : 0),
                                   "arguments", text));
    } else if (out) {
        bool reasoning = o->open == LILY_OUTPUT_REASONING;
        json_t *done = json_pack("{s:s, s:i, s:i, s:O}", "item_id", o->item_id, "output_index", (int)index,
                                 "content_index", 0, "text", text);
        if (done && !reasoning)
            json_object_set_new(done, "logprobs", json_array());
        out[n++] = event(o, reasoning ? "response.reasoning_text.done" : "response.output_text.done", done);
        out[n++] = event(o, "response.content_part.done",
                         json_pack("{s:s, s:i, s:i, s:o}", "item_id", o->item_id, "output_index", (int)index,
                                   "content_index", 0, "part", open_part(o)));
    }
    json_decref(text);
    json_t *item = open_item(o, status);
    if (!item || json_array_append(o->output, item))
        o->failed = true;
    if (out)
        out[n++] = event(o, "response.output_item.done",
                         json_pack("{s:i, s:O}", "output_index", (int)index, "item", item));
    json_decref(item);
    o->open = -1;
    o->text_len = 0;
    if (o->text)
        o->text[0] = '\0';
    free(o->name);
    o->name = NULL;
    return n;
}

/* Open an item of this kind: its added events into out[n..) (when out). */
static int open_new_item(lily_resp_output *o, int kind, const char *name, const char *call_id, json_t **out)
{
    static const char *const prefix[] = {[LILY_OUTPUT_REASONING] = "rs", [LILY_OUTPUT_CONTENT] = "msg",
                                         [LILY_OUTPUT_TOOL_CALL_START] = "fc"};
    size_t index = json_array_size(o->output);
    const char *tail = strchr(o->ident->id, '_'); /* the response id's random part */
    snprintf(o->item_id, sizeof o->item_id, "%s_%s%zu", prefix[kind], tail ? tail + 1 : o->ident->id, index);
    o->open = kind;
    if (kind == LILY_OUTPUT_TOOL_CALL_START) {
        snprintf(o->call_id, sizeof o->call_id, "%s", call_id ? call_id : "call_");
        if (!(o->name = strdup(name)))
            o->failed = true;
    }
    int n = 0;
    if (!out)
        return 0;
    out[n++] = event(o, "response.output_item.added",
                     json_pack("{s:i, s:o}", "output_index", (int)index, "item", open_item(o, "in_progress")));
    if (kind != LILY_OUTPUT_TOOL_CALL_START)
        out[n++] = event(o, "response.content_part.added",
                         json_pack("{s:s, s:i, s:i, s:o}", "item_id", o->item_id, "output_index", (int)index,
                                   "content_index", 0, "part", open_part(o)));
    return n;
}

int lily_resp_output_event(lily_resp_output *o, const lily_output_event *ev, const char *call_id, json_t **out)
{
    int n = 0;
    if (ev->kind == LILY_OUTPUT_TOOL_CALL_END)
        return o->open == LILY_OUTPUT_TOOL_CALL_START ? close_item(o, ev->unfinished ? "incomplete" : "completed", out)
                                                      : 0; /* a call cut short is no completed call */
    if (ev->kind == LILY_OUTPUT_TOOL_CALL_START) {
        n += close_item(o, "completed", out ? out + n : NULL);
        return n + open_new_item(o, LILY_OUTPUT_TOOL_CALL_START, ev->text, call_id, out ? out + n : NULL);
    }
    int kind = ev->kind == LILY_OUTPUT_TOOL_ARGUMENTS ? LILY_OUTPUT_TOOL_CALL_START : (int)ev->kind;
    if (!ev->len || (kind == LILY_OUTPUT_TOOL_CALL_START && o->open != kind)) /* nothing, or arguments of no call */
        return 0;
    if (o->open != kind) {
        n += close_item(o, "completed", out ? out + n : NULL);
        n += open_new_item(o, kind, NULL, NULL, out ? out + n : NULL);
    }
    if (!bytes_append(&o->text, &o->text_len, &o->text_cap, ev->text, ev->len))
        o->failed = true;
    if (!out)
        return n;
    size_t index = json_array_size(o->output);
    json_t *delta = json_pack("{s:s, s:i, s:o}", "item_id", o->item_id, "output_index", (int)index, "delta",
                              lily_oai_string(ev->text, ev->len));
    const char *type = "response.function_call_arguments.delta";
    if (delta && kind != LILY_OUTPUT_TOOL_CALL_START) {
        json_object_set_new(delta, "content_index", json_integer(0));
        type = "response.reasoning_text.delta";
        if (kind == LILY_OUTPUT_CONTENT) {
            json_object_set_new(delta, "logprobs", json_array());
            type = "response.output_text.delta";
        }
    }
    out[n++] = event(o, type, delta);
    return n;
}

int lily_resp_output_end(lily_resp_output *o, bool incomplete, const lily_oai_usage *u, json_t **out)
{
    int n = close_item(o, incomplete ? "incomplete" : "completed", out);
    if (out) {
        const char *status = incomplete ? "incomplete" : "completed";
        out[n] = event(o, incomplete ? "response.incomplete" : "response.completed",
                       json_pack("{s:o}", "response", lily_resp_response(o, status, u)));
        n++;
    }
    return n;
}
