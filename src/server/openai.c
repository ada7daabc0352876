/* openai.c — the OpenAI wire format (openai.h): request validation, response and SSE chunk JSON.
 *
 * Owns: field-by-field validation with the messages OpenAI's own API gives (param names the field), and
 * the exact shapes of chat.completion, chat.completion.chunk and text_completion. Does not own: rendering
 * the conversation (text/chat_template), nor what the model generates (server/service.c).
 */
#include "server/openai.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "base/json_load.h"

/* The length of the valid UTF-8 sequence (not NUL) at s[0, len), or 0 when s starts with an invalid one:
 * a stray continuation byte, a truncated sequence, an overlong form, a surrogate or a code point past
 * U+10FFFF (RFC 3629, section 4). */
static size_t utf8_char_len(const unsigned char *s, size_t len)
{
    unsigned c = s[0];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || n > len || c == 0)
        return 0;
    unsigned cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (size_t k = 1; k < n; k++) {
        if ((s[k] >> 6) != 2)
            return 0;
        cp = cp << 6 | (s[k] & 0x3F);
    }
    static const unsigned min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

size_t lily_oai_utf8_cut(const char *s, size_t n)
{
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c >> 6) == 2)
            continue; /* a continuation byte: its lead is further back */
        size_t want = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
        return want > back ? n - back : n;
    }
    return n;
}

void lily_oai_error_set(lily_oai_error *e, int http_status, const char *type, const char *param,
                        const char *code, const char *fmt, ...)
{
    if (!e)
        return;
    e->http_status = http_status;
    snprintf(e->type, sizeof e->type, "%s", type ? type : "invalid_request_error");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof e->message) /* cut: end on a character boundary */
        e->message[lily_oai_utf8_cut(e->message, sizeof e->message - 1)] = 0;
}

bool lily_oai_out_of_memory(lily_oai_error *e)
{
    lily_oai_error_set(e, 500, "server_error", NULL, NULL, "Out of memory.");
    return false;
}

json_t *lily_oai_string(const char *s, size_t len)
{
    json_t *j = json_stringn(s, len);
    if (j)
        return j;
    char *buf = malloc(len * 3 + 1);
    if (!buf)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t n = s[i] == 0 ? 1 : utf8_char_len((const unsigned char *)s + i, len - i);
        if (n) { /* U+0000 is valid JSON (\u0000) */
            memcpy(buf + o, s + i, n);
            o += n;
            i += n;
        } else {
            memcpy(buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    j = json_stringn(buf, o);
    free(buf);
    return j;
}

char *lily_oai_dump(const json_t *j)
{
    return json_dumps(j, JSON_COMPACT);
}

char *lily_oai_error_json(const lily_oai_error *e)
{
    /* lossy: a message quoting the client's text may hold invalid UTF-8, or be cut inside a character */
    json_t *o = json_pack("{s:{s:o, s:s, s:o, s:o}}", "error", "message",
                          lily_oai_string(e->message, strlen(e->message)), "type", e->type, "param",
                          e->param[0] ? json_string(e->param) : json_null(), "code",
                          e->code[0] ? json_string(e->code) : json_null());
    if (!o)
        return NULL;
    char *s = lily_oai_dump(o);
    json_decref(o);
    return s;
}

/* ---------------------------------------------------------------------------------------------------
 * request validation
 */

/* Count the values and the nesting of JSON text without building it: commas, '[' and '{' outside strings
 * (one more value each, which bounds the values jansson would allocate from above up to a factor of 2:
 * an object member is a key and a value). Stops early past the limits. */
static void json_shape(const char *s, size_t len, size_t *values, int *depth)
{
    size_t n = 1;
    int d = 0, max_d = 0;
    bool in_string = false;
    for (size_t i = 0; i < len && n <= LILY_OAI_MAX_JSON_VALUES && max_d <= LILY_OAI_MAX_JSON_DEPTH; i++) {
        char c = s[i];
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = false;
            continue;
        }
        if (c == '"')
            in_string = true;
        else if (c == ',')
            n++;
        else if (c == '[' || c == '{') {
            n++;
            max_d = ++d > max_d ? d : max_d;
        } else if (c == ']' || c == '}')
            d--;
    }
    *values = n;
    *depth = max_d;
}

bool lily_oai_json_load(const char *body, size_t len, json_t **out, lily_oai_error *e)
{
    *out = NULL;
    /* one UTF-8 byte order mark before the text is ignored, as RFC 8259 (8.1) allows and vLLM and llama.cpp
     * do (Windows PowerShell's -Encoding utf8 writes one); anywhere else it is text or an error as before */
    if (len >= 3 && !memcmp(body, "\xEF\xBB\xBF", 3)) {
        body += 3;
        len -= 3;
    }
    size_t values;
    int depth;
    json_shape(body, len, &values, &depth);
    if (depth > LILY_OAI_MAX_JSON_DEPTH) {
        lily_oai_error_set(e, 400, "invalid_request_error", NULL, NULL,
                           "The JSON body of your request nests deeper than %d levels.", LILY_OAI_MAX_JSON_DEPTH);
        return false;
    }
    if (values > LILY_OAI_MAX_JSON_VALUES) {
        lily_oai_error_set(e, 400, "invalid_request_error", NULL, NULL,
                           "The JSON body of your request has more than %d values.", LILY_OAI_MAX_JSON_VALUES);
        return false;
    }
    json_error_t jerr;
    /* U+0000 is valid JSON and lily may write it in a reply: take it back; integers beyond int64 load as
     * reals (base/json_load.h), refused by name only where a field is read */
    *out = lily_json_loadb(body, len, JSON_ALLOW_NUL, &jerr);
    if (!*out) {
        lily_oai_error_set(e, 400, "invalid_request_error", NULL, NULL,
                           "We could not parse the JSON body of your request: %s (line %d, column %d).", jerr.text,
                           jerr.line, jerr.column);
        return false;
    }
    return true;
}

static bool bad(lily_oai_error *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool bad(lily_oai_error *e, const char *param, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    lily_oai_error_set(e, 400, "invalid_request_error", param, NULL, "%s", msg);
    return false;
}

const char *lily_oai_json_kind(const json_t *v)
{
    if (!v) /* a missing field (json_object_get's NULL) */
        return "nothing";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}

/* s for quoting in a message: at most max bytes (max < cap), cut on a character boundary. */
static const char *quoted(char *buf, size_t cap, const char *s, size_t max)
{
    size_t n = strlen(s);
    n = lily_oai_utf8_cut(s, n < max ? n : max);
    n = n < cap ? n : cap - 1;
    memcpy(buf, s, n);
    buf[n] = 0;
    return buf;
}

/* OpenAI's rule for a function name: ^[a-zA-Z0-9_-]{1,64}$ (the Messages API's: {1,128}). Other characters
 * could break the tool-call markup the name is written into (<function=NAME>) or the tool_choice guarantee. */
bool lily_oai_valid_tool_name(const json_t *name, size_t max_len)
{
    size_t n = json_string_length(name);
    const char *s = json_string_value(name);
    if (!s || n < 1 || n > max_len)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '_' || s[i] == '-'))
            return false;
    return true;
}

/* A number field in [lo, hi]; absent or null leaves *out unchanged. */
static bool get_number(json_t *body, const char *key, double lo, double hi, double *out, lily_oai_error *e)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return true;
    if (!json_is_number(v))
        return bad(e, key, "Invalid type for '%s': expected a number, but got %s instead.", key, lily_oai_json_kind(v));
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return bad(e, key, "Invalid value for '%s': %g is outside [%g, %g].", key, x, lo, hi);
    *out = x;
    return true;
}

static bool get_int(json_t *body, const char *key, long long lo, long long hi, long long *out, lily_oai_error *e)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return true;
    if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e15)
        v = NULL; /* 16.0 is accepted as 16 */
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v))) /* beyond int64 (json_load.h) */
        return bad(e, key, "Invalid value for '%s': %.17g is outside [%lld, %lld].", key, json_real_value(v), lo, hi);
    long long x;
    if (v) {
        if (!json_is_integer(v))
            return bad(e, key, "Invalid type for '%s': expected an integer, but got %s instead.", key,
                       lily_oai_json_kind(json_object_get(body, key)));
        x = json_integer_value(v);
    } else {
        x = (long long)json_real_value(json_object_get(body, key));
    }
    if (x < lo || x > hi)
        return bad(e, key, "Invalid value for '%s': %lld is outside [%lld, %lld].", key, x, lo, hi);
    *out = x;
    return true;
}

static bool get_bool(json_t *body, const char *key, bool *out, lily_oai_error *e)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return true;
    if (!json_is_boolean(v))
        return bad(e, key, "Invalid type for '%s': expected a boolean, but got %s instead.", key, lily_oai_json_kind(v));
    *out = json_is_true(v);
    return true;
}

static const char *const known_roles[] = {"system", "developer", "user", "assistant", "tool"};

static bool check_messages(json_t *messages, lily_oai_error *e)
{
    if (!messages)
        return bad(e, "messages", "Missing required parameter: 'messages'.");
    if (!json_is_array(messages))
        return bad(e, "messages", "Invalid type for 'messages': expected an array, but got %s instead.",
                   lily_oai_json_kind(messages));
    if (json_array_size(messages) == 0)
        return bad(e, "messages", "Invalid 'messages': empty array. Expected an array with minimum length 1, "
                                  "but got an empty array instead.");
    size_t i;
    json_t *m;
    char param[64], q[72];
    json_array_foreach(messages, i, m) {
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m))
            return bad(e, param, "Invalid type for '%s': expected an object, but got %s instead.", param,
                       lily_oai_json_kind(m));
        json_t *role = json_object_get(m, "role");
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!role)
            return bad(e, param, "Missing required parameter: '%s'.", param);
        if (!json_is_string(role))
            return bad(e, param, "Invalid type for '%s': expected a string, but got %s instead.", param,
                       lily_oai_json_kind(role));
        bool known = false;
        for (size_t r = 0; r < sizeof known_roles / sizeof known_roles[0]; r++)
            known |= !strcmp(json_string_value(role), known_roles[r]);
        if (!known)
            return bad(e, param, "Invalid value: '%s'. Supported values are: 'system', 'developer', 'user', "
                                 "'assistant', and 'tool'.", quoted(q, sizeof q, json_string_value(role), 64));
        json_t *content = json_object_get(m, "content");
        snprintf(param, sizeof param, "messages[%zu].content", i);
        bool is_assistant = !strcmp(json_string_value(role), "assistant");
        if (!content || json_is_null(content)) {
            if (!is_assistant)
                return bad(e, param, "Missing required parameter: '%s'.", param);
        } else if (json_is_array(content)) {
            size_t k;
            json_t *part;
            json_array_foreach(content, k, part) {
                json_t *type = json_object_get(part, "type");
                json_t *text = json_object_get(part, "text");
                if (!json_is_object(part) || !json_is_string(type))
                    return bad(e, param, "Invalid content part %zu in '%s': expected an object with a 'type'.", k,
                               param);
                if (strcmp(json_string_value(type), "text"))
                    return bad(e, param, "Unsupported content part type '%s' in '%s': this model takes text only.",
                               quoted(q, sizeof q, json_string_value(type), 32), param);
                if (!json_is_string(text))
                    return bad(e, param, "Invalid content part %zu in '%s': 'text' must be a string.", k, param);
            }
        } else if (!json_is_string(content)) {
            return bad(e, param, "Invalid type for '%s': expected a string or an array of content parts, but got "
                                 "%s instead.", param, lily_oai_json_kind(content));
        }
        json_t *legacy_call = json_object_get(m, "function_call");
        if (legacy_call && !json_is_null(legacy_call)) { /* would be dropped from the prompt unseen */
            snprintf(param, sizeof param, "messages[%zu].function_call", i);
            return bad(e, param, "Invalid '%s': the deprecated function calling is not supported; send the call as "
                                 "'tool_calls' and its result as a 'tool' message.", param);
        }
        json_t *calls = json_object_get(m, "tool_calls");
        if (calls && !json_is_null(calls)) {
            snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
            if (!json_is_array(calls))
                return bad(e, param, "Invalid type for '%s': expected an array, but got %s instead.", param,
                           lily_oai_json_kind(calls));
            size_t k;
            json_t *call;
            json_array_foreach(calls, k, call) {
                json_t *fn = json_object_get(call, "function");
                json_t *args = json_object_get(fn, "arguments");
                if (!json_is_object(call) || !json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
                    return bad(e, param, "Invalid '%s[%zu]': expected {\"type\":\"function\",\"function\":"
                                         "{\"name\":..., \"arguments\":...}}.", param, k);
                if (args && !json_is_string(args) && !json_is_object(args))
                    return bad(e, param, "Invalid '%s[%zu].function.arguments': expected a JSON string.", param, k);
            }
        }
    }
    return true;
}

/* A tool call the request forces (tool_choice required or named) is written as "<parameter=NAME>\n..."
 * (the chat template's format): a parameter name holding '<', '>' or a newline cannot be written there and
 * read back, so the call could never complete. Such a name is a 400 naming it (tools[i] is fn's tool). */
static bool check_forced_parameter_names(json_t *fn, size_t i, lily_oai_error *e)
{
    json_t *props = json_object_get(json_object_get(fn, "parameters"), "properties");
    const char *key;
    json_t *v;
    json_object_foreach(props, key, v) {
        if (!strpbrk(key, "<>\n"))
            continue;
        char param[64], q[200];
        snprintf(param, sizeof param, "tools[%zu].function.parameters.properties", i);
        return bad(e, param, "Invalid parameter name '%s' in tool '%s': a forced tool call (tool_choice) cannot "
                             "write a parameter name with '<', '>' or a newline (the chat template writes "
                             "<parameter=NAME>); rename the parameter.", quoted(q, sizeof q, key, 64),
                   json_string_value(json_object_get(fn, "name")));
    }
    return true;
}

/* tool_choice {"type": "allowed_tools", "allowed_tools": {"mode": "auto" | "required", "tools": [{"type":
 * "function", "function": {"name": ...}}, ...]}} (OpenAI's): req->tools becomes the listed tools, in the order of
 * `tools` (the body's "tools" is replaced by them: the prompt shows only what may be called, since an "auto" call
 * is not constrained), and the tool choice the mode's. An empty list under "auto" is tool_choice "none". */
static bool allow_tools(lily_oai_request *req, json_t *tc, lily_oai_error *e)
{
    char q[72];
    json_t *at = json_object_get(tc, "allowed_tools");
    const char *mode = json_string_value(json_object_get(at, "mode"));
    json_t *list = json_object_get(at, "tools");
    if (!json_is_object(at) || !json_is_array(list))
        return bad(e, "tool_choice", "Invalid 'tool_choice': expected {\"type\":\"allowed_tools\",\"allowed_tools\":"
                                     "{\"mode\":\"auto\"|\"required\",\"tools\":[...]}}.");
    if (!mode || (strcmp(mode, "auto") && strcmp(mode, "required")))
        return bad(e, "tool_choice", "Invalid value for 'tool_choice.allowed_tools.mode': expected 'auto' or "
                                     "'required'.");
    if (!req->tools)
        return bad(e, "tool_choice", "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
                                     "specified.");
    size_t i, j;
    json_t *a, *t;
    json_array_foreach(list, i, a) {
        json_t *name = json_object_get(json_object_get(a, "function"), "name");
        const char *type = json_string_value(json_object_get(a, "type"));
        if (!json_is_object(a) || (type && strcmp(type, "function")) || !json_is_string(name))
            return bad(e, "tool_choice", "Invalid 'tool_choice.allowed_tools.tools[%zu]': expected {\"type\":"
                                         "\"function\",\"function\":{\"name\":...}}.", i);
        bool found = false;
        json_array_foreach(req->tools, j, t)
            found |= json_equal(json_object_get(json_object_get(t, "function"), "name"), name);
        if (!found)
            return bad(e, "tool_choice", "Invalid value for 'tool_choice.allowed_tools.tools[%zu]': no function "
                                         "named '%s' was specified in the 'tools' parameter.",
                       i, quoted(q, sizeof q, json_string_value(name), 64));
    }
    json_t *kept = json_array();
    if (!kept)
        return lily_oai_out_of_memory(e);
    json_array_foreach(req->tools, j, t) {
        json_t *name = json_object_get(json_object_get(t, "function"), "name");
        bool allowed = false;
        json_array_foreach(list, i, a)
            allowed |= json_equal(json_object_get(json_object_get(a, "function"), "name"), name);
        if (allowed && json_array_append(kept, t)) {
            json_decref(kept);
            return lily_oai_out_of_memory(e);
        }
    }
    const bool required = !strcmp(mode, "required");
    if (!json_array_size(kept) && required) {
        json_decref(kept);
        return bad(e, "tool_choice", "Invalid value for 'tool_choice.allowed_tools.tools': mode 'required' needs at "
                                     "least one tool.");
    }
    req->tool_choice = !json_array_size(kept) ? LILY_TOOL_CHOICE_NONE
                       : required             ? LILY_TOOL_CHOICE_REQUIRED
                                              : LILY_TOOL_CHOICE_AUTO;
    if (json_object_set_new(req->body, "tools", kept))
        return lily_oai_out_of_memory(e);
    req->tools = json_object_get(req->body, "tools");
    return true;
}

static bool check_tools(lily_oai_request *req, size_t max_name, lily_oai_error *e)
{
    char q[72];
    bool parallel = true;
    if (!get_bool(req->body, "parallel_tool_calls", &parallel, e))
        return false;
    req->single_tool_call = !parallel;
    json_t *tools = json_object_get(req->body, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools))
            return bad(e, "tools", "Invalid type for 'tools': expected an array, but got %s instead.",
                       lily_oai_json_kind(tools));
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t) {
            char param[48];
            snprintf(param, sizeof param, "tools[%zu]", i);
            json_t *type = json_object_get(t, "type");
            json_t *fn = json_object_get(t, "function");
            if (!json_is_object(t) || (type && !json_is_string(type)) || !json_is_object(fn))
                return bad(e, param, "Invalid '%s': expected {\"type\":\"function\",\"function\":{...}}.", param);
            if (type && strcmp(json_string_value(type), "function"))
                return bad(e, param, "Invalid '%s.type': only 'function' tools are supported.", param);
            json_t *name = json_object_get(fn, "name");
            if (!json_is_string(name) || !json_string_length(name))
                return bad(e, param, "Missing required parameter: '%s.function.name'.", param);
            if (!lily_oai_valid_tool_name(name, max_name))
                return bad(e, param, "Invalid '%s.function.name': '%s' does not match '^[a-zA-Z0-9_-]{1,%zu}$'.",
                           param, quoted(q, sizeof q, json_string_value(name), 64), max_name);
            json_t *params = json_object_get(fn, "parameters");
            if (params && !json_is_object(params) && !json_is_null(params))
                return bad(e, param, "Invalid '%s.function.parameters': expected a JSON schema object.", param);
        }
        if (json_array_size(tools))
            req->tools = tools;
    }
    json_t *tc = json_object_get(req->body, "tool_choice");
    if (!tc || json_is_null(tc))
        return true;
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (!strcmp(s, "auto"))
            req->tool_choice = LILY_TOOL_CHOICE_AUTO;
        else if (!strcmp(s, "none"))
            req->tool_choice = LILY_TOOL_CHOICE_NONE;
        else if (!strcmp(s, "required"))
            req->tool_choice = LILY_TOOL_CHOICE_REQUIRED;
        else
            return bad(e, "tool_choice", "Invalid value for 'tool_choice': '%s'. Supported values are: 'none', "
                                         "'auto', 'required', or a named function.", quoted(q, sizeof q, s, 64));
    } else if (json_is_object(tc) && json_is_string(json_object_get(tc, "type")) &&
               !strcmp(json_string_value(json_object_get(tc, "type")), "allowed_tools")) {
        if (!allow_tools(req, tc, e))
            return false;
    } else if (json_is_object(tc)) {
        json_t *name = json_object_get(json_object_get(tc, "function"), "name");
        if (!json_is_string(name))
            return bad(e, "tool_choice", "Invalid 'tool_choice': expected {\"type\":\"function\",\"function\":"
                                         "{\"name\":...}}.");
        if (!lily_oai_valid_tool_name(name, max_name))
            return bad(e, "tool_choice", "Invalid 'tool_choice.function.name': '%s' does not match "
                                         "'^[a-zA-Z0-9_-]{1,%zu}$'.", quoted(q, sizeof q, json_string_value(name), 64),
                       max_name);
        req->tool_choice = LILY_TOOL_CHOICE_NAMED;
        snprintf(req->tool_name, sizeof req->tool_name, "%s", json_string_value(name));
    } else {
        return bad(e, "tool_choice", "Invalid type for 'tool_choice': expected a string or an object, but got %s "
                                     "instead.", lily_oai_json_kind(tc));
    }
    if (req->tool_choice == LILY_TOOL_CHOICE_REQUIRED || req->tool_choice == LILY_TOOL_CHOICE_NAMED) {
        if (!req->tools)
            return bad(e, "tool_choice", "Invalid value for 'tool_choice': 'tool_choice' is only allowed when "
                                         "'tools' are specified.");
    }
    if (req->tool_choice == LILY_TOOL_CHOICE_NAMED) {
        size_t i;
        json_t *t;
        bool found = false;
        json_array_foreach(req->tools, i, t) {
            const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
            found |= n && !strcmp(n, req->tool_name);
        }
        if (!found)
            return bad(e, "tool_choice", "Invalid value for 'tool_choice': no function named '%s' was specified "
                                         "in the 'tools' parameter.", req->tool_name);
    }
    if (req->tool_choice == LILY_TOOL_CHOICE_REQUIRED || req->tool_choice == LILY_TOOL_CHOICE_NAMED) {
        size_t i;
        json_t *t;
        json_array_foreach(req->tools, i, t) {
            json_t *fn = json_object_get(t, "function");
            const char *n = json_string_value(json_object_get(fn, "name"));
            if (req->tool_choice == LILY_TOOL_CHOICE_NAMED && (!n || strcmp(n, req->tool_name)))
                continue;
            if (!check_forced_parameter_names(fn, i, e))
                return false;
        }
    }
    if (req->tool_choice == LILY_TOOL_CHOICE_NONE)
        req->tools = NULL;
    return true;
}

static bool check_stop(lily_oai_request *req, lily_oai_error *e)
{
    json_t *stop = json_object_get(req->body, "stop");
    if (!stop || json_is_null(stop))
        return true;
    if (json_is_string(stop)) {
        if (!json_string_length(stop))
            return true;
        if (strlen(json_string_value(stop)) != json_string_length(stop))
            return bad(e, "stop", "Invalid 'stop': a stop sequence cannot contain U+0000.");
        req->stop = malloc(sizeof *req->stop);
        if (!req->stop || !(req->stop[0] = strdup(json_string_value(stop))))
            return bad(e, "stop", "Out of memory.");
        req->n_stop = 1;
        return true;
    }
    if (!json_is_array(stop))
        return bad(e, "stop", "Invalid type for 'stop': expected a string or an array of strings, but got %s "
                              "instead.", lily_oai_json_kind(stop));
    if (json_array_size(stop) > LILY_OAI_MAX_STOP)
        return bad(e, "stop", "Invalid 'stop': at most %d stop sequences are supported.", LILY_OAI_MAX_STOP);
    req->stop = calloc(json_array_size(stop) + 1, sizeof *req->stop);
    if (!req->stop)
        return bad(e, "stop", "Out of memory.");
    size_t i;
    json_t *s;
    json_array_foreach(stop, i, s) {
        if (!json_is_string(s))
            return bad(e, "stop", "Invalid type for 'stop[%zu]': expected a string, but got %s instead.", i,
                       lily_oai_json_kind(s));
        if (!json_string_length(s))
            continue;
        if (strlen(json_string_value(s)) != json_string_length(s))
            return bad(e, "stop", "Invalid 'stop[%zu]': a stop sequence cannot contain U+0000.", i);
        if (!(req->stop[req->n_stop] = strdup(json_string_value(s))))
            return bad(e, "stop", "Out of memory.");
        req->n_stop++;
    }
    return true;
}

static bool check_logit_bias(lily_oai_request *req, lily_oai_error *e)
{
    json_t *lb = json_object_get(req->body, "logit_bias");
    if (!lb || json_is_null(lb))
        return true;
    if (!json_is_object(lb))
        return bad(e, "logit_bias", "Invalid type for 'logit_bias': expected an object, but got %s instead.",
                   lily_oai_json_kind(lb));
    req->logit_bias = calloc(json_object_size(lb) + 1, sizeof *req->logit_bias);
    if (!req->logit_bias)
        return bad(e, "logit_bias", "Out of memory.");
    const char *key;
    json_t *v;
    char q[40];
    json_object_foreach(lb, key, v) {
        char *end;
        long id = strtol(key, &end, 10);
        if (*key < '0' || *key > '9' || *end || id < 0 || id > INT32_MAX) /* digits only: no sign, no space */
            return bad(e, "logit_bias", "Invalid key in 'logit_bias': '%s' is not a token id.",
                       quoted(q, sizeof q, key, 32));
        if (!json_is_number(v) || !(json_number_value(v) >= -100 && json_number_value(v) <= 100))
            return bad(e, "logit_bias", "Invalid value in 'logit_bias' for token %ld: expected a number in "
                                        "[-100, 100].", id);
        req->logit_bias[req->n_logit_bias].token = (int32_t)id;
        req->logit_bias[req->n_logit_bias].bias = (float)json_number_value(v);
        req->n_logit_bias++;
    }
    return true;
}

static bool check_prompt(lily_oai_request *req, lily_oai_error *e)
{
    json_t *p = json_object_get(req->body, "prompt");
    if (!p)
        return bad(e, "prompt", "Missing required parameter: 'prompt'.");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0); /* ["text"]: a batch of one */
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_array(json_array_get(p, 0)))
        p = json_array_get(p, 0); /* [[ids]] */
    if (json_is_string(p)) {
        req->prompt_text = json_string_value(p);
        req->prompt_text_len = json_string_length(p);
        return true;
    }
    if (!json_is_array(p))
        return bad(e, "prompt", "Invalid type for 'prompt': expected a string or an array of token ids, but got %s "
                                "instead.", lily_oai_json_kind(p));
    if (json_array_size(p) == 0)
        return bad(e, "prompt", "Invalid 'prompt': empty array.");
    req->prompt_ids = malloc(json_array_size(p) * sizeof *req->prompt_ids);
    if (!req->prompt_ids)
        return bad(e, "prompt", "Out of memory.");
    size_t i;
    json_t *v;
    json_array_foreach(p, i, v) {
        if (json_is_string(v) || json_is_array(v))
            return bad(e, "prompt", "Invalid 'prompt': a batch of several prompts is not supported; expected one "
                                    "string or one array of token ids.");
        if (!json_is_integer(v))
            return bad(e, "prompt", "Invalid 'prompt[%zu]': expected a token id (an integer), but got %s instead.",
                       i, lily_oai_json_kind(v));
        if (json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return bad(e, "prompt", "Invalid 'prompt[%zu]': %lld is not a token id.", i,
                       (long long)json_integer_value(v));
        req->prompt_ids[i] = (int32_t)json_integer_value(v);
    }
    req->n_prompt_ids = (int)json_array_size(p);
    return true;
}

static bool check_thinking(lily_oai_request *req, lily_oai_error *e)
{
    json_t *kw = json_object_get(req->body, "chat_template_kwargs");
    if (kw && !json_is_null(kw)) {
        if (!json_is_object(kw))
            return bad(e, "chat_template_kwargs", "Invalid type for 'chat_template_kwargs': expected an object, but "
                                                  "got %s instead.", lily_oai_json_kind(kw));
        req->chat_template_kwargs = kw;
        json_t *v = json_object_get(kw, "enable_thinking");
        if (v && !json_is_null(v)) {
            if (!json_is_boolean(v))
                return bad(e, "chat_template_kwargs.enable_thinking", "Invalid type for "
                           "'chat_template_kwargs.enable_thinking': expected a boolean.");
            req->enable_thinking = json_is_true(v);
        }
        v = json_object_get(kw, "preserve_thinking");
        if (v && !json_is_null(v)) {
            if (!json_is_boolean(v))
                return bad(e, "chat_template_kwargs.preserve_thinking", "Invalid type for "
                           "'chat_template_kwargs.preserve_thinking': expected a boolean.");
            req->preserve_thinking = json_is_true(v);
        }
    }
    json_t *effort = json_object_get(req->body, "reasoning_effort");
    if (effort && !json_is_null(effort)) {
        static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
        bool known = false;
        if (json_is_string(effort))
            for (size_t i = 0; i < sizeof efforts / sizeof efforts[0]; i++)
                known |= !strcmp(json_string_value(effort), efforts[i]);
        if (!known)
            return bad(e, "reasoning_effort", "Invalid value for 'reasoning_effort': supported values are 'none', "
                                              "'minimal', 'low', 'medium' and 'high'.");
        if (!strcmp(json_string_value(effort), "none"))
            req->enable_thinking = 0;
        else if (req->enable_thinking < 0)
            req->enable_thinking = 1;
    }
    return true;
}

/* response_format (OpenAI structured outputs; chat and, as vLLM, completions). */
static bool check_response_format(lily_oai_request *req, lily_oai_error *e)
{
    json_t *rf = json_object_get(req->body, "response_format");
    if (rf && !json_is_null(rf)) {
        const char *type = json_string_value(json_object_get(rf, "type"));
        if (!json_is_object(rf) || !type)
            return bad(e, "response_format", "Invalid 'response_format': expected an object with a 'type'.");
        if (!strcmp(type, "json_object")) {
            req->json_output = true;
        } else if (!strcmp(type, "json_schema")) {
            json_t *js = json_object_get(rf, "json_schema");
            json_t *schema = json_object_get(js, "schema");
            if (!json_is_object(js))
                return bad(e, "response_format.json_schema", "Missing required parameter: "
                                                             "'response_format.json_schema'.");
            if (schema && !json_is_object(schema) && !json_is_boolean(schema))
                return bad(e, "response_format.json_schema.schema", "Invalid 'response_format.json_schema.schema': "
                                                                    "expected a JSON Schema object.");
            if (json_is_false(schema)) /* the schema no value satisfies: no reply could follow it */
                return bad(e, "response_format.json_schema.schema", "Invalid 'response_format.json_schema.schema': "
                                                                    "false matches no JSON value.");
            req->json_output = true;
            req->json_schema = json_is_object(schema) ? schema : NULL;
        } else if (strcmp(type, "text")) {
            return bad(e, "response_format.type", "Invalid value for 'response_format.type': '%.32s'. Supported "
                                                  "values are: 'text', 'json_object' and 'json_schema'.", type);
        }
    }
    return true;
}

/* The reasoning budget (vLLM / SGLang-style fields; chat only: a completion has no think block). */
static bool check_reasoning_budget(lily_oai_request *req, lily_oai_error *e)
{
    long long budget = -1, alias = -1;
    if (!get_int(req->body, "reasoning_budget", 0, INT32_MAX, &budget, e) ||
        !get_int(req->body, "max_reasoning_tokens", 0, INT32_MAX, &alias, e))
        return false;
    if (budget >= 0 && alias >= 0 && budget != alias) /* two names for one limit: neither silently wins */
        return bad(e, "max_reasoning_tokens", "'reasoning_budget' (%lld) and 'max_reasoning_tokens' (%lld) are two "
                   "names for the same limit: set one of them.", budget, alias);
    req->reasoning_budget = (int)(budget >= 0 ? budget : alias);
    return true;
}

/* /v1/completions fields lily does not implement, refused unless they hold their defaults (as vLLM does), so
 * a client never gets a reply made without them: suffix (fill-in-the-middle) null or "", best_of null or 1. */
static bool check_unsupported_completion(json_t *b, lily_oai_error *e)
{
    json_t *suffix = json_object_get(b, "suffix");
    if (suffix && !json_is_null(suffix) && !(json_is_string(suffix) && !json_string_length(suffix)))
        return bad(e, "suffix", "Invalid value for 'suffix': fill-in-the-middle completions are not supported "
                                "(send the prompt alone, or leave 'suffix' out).");
    long long best_of = 1;
    if (!get_int(b, "best_of", 1, 1 << 20, &best_of, e))
        return false;
    if (best_of != 1)
        return bad(e, "best_of", "Invalid value for 'best_of': only best_of=1 is supported (got %lld).", best_of);
    return true;
}

/* Other engines' extensions that lily does not implement, refused unless they hold their defaults, so a client
 * that sends one never gets a reply made without it: vLLM's ignore_eos false, min_tokens 0,
 * include_stop_str_in_output and use_beam_search false, stop_token_ids and prompt_logprobs null (or no ids), the
 * constrained-decoding fields of vLLM, llama.cpp and SGLang null, and on chat echo false, best_of 1, OpenAI's
 * deprecated functions (none) and function_call (null), continue_final_message false and add_generation_prompt
 * true (a prefill goes through /v1/messages). */
static bool check_unsupported_extensions(json_t *b, bool is_chat, lily_oai_error *e)
{
    bool ignore_eos = false, cont = false, gen_prompt = true;
    long long min_tokens = 0;
    if (!get_bool(b, "ignore_eos", &ignore_eos, e) || !get_int(b, "min_tokens", 0, INT32_MAX, &min_tokens, e))
        return false;
    if (ignore_eos)
        return bad(e, "ignore_eos", "Invalid value for 'ignore_eos': not supported (a reply ends at the model's stop "
                                    "tokens; ban them with 'logit_bias' instead).");
    if (min_tokens > 0)
        return bad(e, "min_tokens", "Invalid value for 'min_tokens': not supported (got %lld).", min_tokens);
    /* Constrained decoding under other engines' names (vLLM's guided_* and structured_outputs, llama.cpp's
     * grammar and json_schema, SGLang's regex and ebnf): lily's is response_format; null (and an empty grammar,
     * llama.cpp's default) means none. */
    static const char *const constraints[] = {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                                              "structured_outputs", "grammar", "json_schema", "regex", "ebnf"};
    for (size_t k = 0; k < sizeof constraints / sizeof constraints[0]; k++) {
        json_t *v = json_object_get(b, constraints[k]);
        if (v && !json_is_null(v) && !(json_is_string(v) && !json_string_length(v)))
            return bad(e, constraints[k], "Invalid value for '%s': not supported; for structured output use "
                       "'response_format' ({\"type\": \"json_schema\", ...} or {\"type\": \"json_object\"}).",
                       constraints[k]);
    }
    bool stop_str = false, beam = false;
    if (!get_bool(b, "include_stop_str_in_output", &stop_str, e) || !get_bool(b, "use_beam_search", &beam, e))
        return false;
    if (stop_str)
        return bad(e, "include_stop_str_in_output", "Invalid value for 'include_stop_str_in_output': not supported "
                   "(the reply ends before the stop string; the matched one is not returned).");
    if (beam)
        return bad(e, "use_beam_search", "Invalid value for 'use_beam_search': not supported.");
    json_t *stop_ids = json_object_get(b, "stop_token_ids");
    if (stop_ids && !json_is_null(stop_ids) && !(json_is_array(stop_ids) && !json_array_size(stop_ids)))
        return bad(e, "stop_token_ids", "Invalid value for 'stop_token_ids': not supported (a reply ends at the "
                   "model's stop tokens; use 'stop' strings).");
    json_t *prompt_lps = json_object_get(b, "prompt_logprobs");
    if (prompt_lps && !json_is_null(prompt_lps))
        return bad(e, "prompt_logprobs", "Invalid value for 'prompt_logprobs': not supported%s.",
                   is_chat ? "" : " (/v1/completions scores the prompt with 'echo' and 'logprobs')");
    if (!is_chat)
        return true;
    bool echo = false;
    long long best_of = 1;
    if (!get_bool(b, "echo", &echo, e) || !get_int(b, "best_of", 1, 1 << 20, &best_of, e))
        return false;
    if (echo)
        return bad(e, "echo", "Invalid value for 'echo': not supported on chat completions (/v1/completions takes it).");
    json_t *functions = json_object_get(b, "functions"), *function_call = json_object_get(b, "function_call");
    if (functions && !json_is_null(functions) && !(json_is_array(functions) && !json_array_size(functions)))
        return bad(e, "functions", "Invalid value for 'functions': the deprecated function calling is not supported; "
                                   "send 'tools' (and 'tool_choice') instead.");
    if (function_call && !json_is_null(function_call))
        return bad(e, "function_call", "Invalid value for 'function_call': the deprecated function calling is not "
                                       "supported; send 'tool_choice' (and 'tools') instead.");
    if (best_of != 1)
        return bad(e, "best_of", "Invalid value for 'best_of': only best_of=1 is supported (got %lld).", best_of);
    if (!get_bool(b, "continue_final_message", &cont, e) || !get_bool(b, "add_generation_prompt", &gen_prompt, e))
        return false;
    if (cont)
        return bad(e, "continue_final_message", "Invalid value for 'continue_final_message': not supported on this "
                   "route; to prefill the reply, send a final assistant message to /v1/messages.");
    if (!gen_prompt)
        return bad(e, "add_generation_prompt", "Invalid value for 'add_generation_prompt': only true is supported.");
    return true;
}

static bool parse_request(const char *body, size_t len, bool is_chat, size_t max_tool_name, lily_oai_request *req,
                          lily_oai_error *e)
{
    memset(req, 0, sizeof *req);
    req->is_chat = is_chat;
    req->max_tokens = req->top_k = -1;
    req->enable_thinking = req->preserve_thinking = -1;
    req->reasoning_budget = -1;
    req->temperature = req->top_p = req->min_p = NAN;
    req->presence_penalty = req->frequency_penalty = req->repetition_penalty = NAN;

    if (!lily_oai_json_load(body, len, &req->body, e))
        return false;
    if (!json_is_object(req->body)) {
        bad(e, NULL, "Invalid request body: expected a JSON object, but got %s instead.", lily_oai_json_kind(req->body));
        goto fail;
    }
    json_t *b = req->body;
    json_t *model = json_object_get(b, "model");
    if (model && !json_is_string(model) && !json_is_null(model)) {
        bad(e, "model", "Invalid type for 'model': expected a string, but got %s instead.", lily_oai_json_kind(model));
        goto fail;
    }
    if (is_chat) {
        req->messages = json_object_get(b, "messages");
        if (!check_messages(req->messages, e) || !check_tools(req, max_tool_name, e) || !check_thinking(req, e) ||
            !check_response_format(req, e) || !check_reasoning_budget(req, e))
            goto fail;
    } else {
        if (!check_prompt(req, e) || !get_bool(b, "echo", &req->echo, e) || !check_unsupported_completion(b, e) ||
            !check_response_format(req, e))
            goto fail;
    }

    if (!check_unsupported_extensions(b, is_chat, e))
        goto fail;
    long long n = 1;
    if (!get_int(b, "n", 1, 1 << 20, &n, e))
        goto fail;
    if (n != 1) {
        bad(e, "n", "Invalid value for 'n': only n=1 is supported (got %lld).", n);
        goto fail;
    }
    if (!get_bool(b, "stream", &req->stream, e))
        goto fail;
    json_t *so = json_object_get(b, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            bad(e, "stream_options", "Invalid type for 'stream_options': expected an object, but got %s instead.",
                lily_oai_json_kind(so));
            goto fail;
        }
        if (!req->stream) { /* as OpenAI: a mistake to say, not an option to drop */
            bad(e, "stream_options", "The 'stream_options' parameter is only allowed when 'stream' is enabled.");
            goto fail;
        }
        if (!get_bool(so, "include_usage", &req->include_usage, e))
            goto fail;
    }
    long long mt = -1;
    /* 0 only on a completion with echo (below): scoring a prompt, as the legacy OpenAI API and vLLM allow */
    if (!get_int(b, "max_tokens", is_chat ? 1 : 0, INT32_MAX, &mt, e) ||
        !get_int(b, "max_completion_tokens", 1, INT32_MAX, &mt, e))
        goto fail;
    req->max_tokens = (int)mt;
    if (req->max_tokens == 0 && !req->echo) {
        bad(e, "max_tokens", "Invalid 'max_tokens': 0 is allowed only with 'echo' (the prompt scored, nothing "
                             "generated); otherwise at least 1.");
        goto fail;
    }
    long long top_k = -1;
    if (!get_number(b, "temperature", 0, 2, &req->temperature, e) || !get_number(b, "top_p", 0, 1, &req->top_p, e) ||
        !get_number(b, "min_p", 0, 1, &req->min_p, e) ||
        !get_number(b, "presence_penalty", -2, 2, &req->presence_penalty, e) ||
        !get_number(b, "frequency_penalty", -2, 2, &req->frequency_penalty, e) ||
        !get_number(b, "repetition_penalty", 1e-6, 100, &req->repetition_penalty, e) ||
        !get_int(b, "top_k", -1, INT32_MAX, &top_k, e))
        goto fail;
    req->top_k = top_k == 0 ? -1 : (int)top_k;
    json_t *seed = json_object_get(b, "seed");
    if (seed && !json_is_null(seed)) {
        /* an int64, as OpenAI's API and vLLM take it: a literal outside int64 arrives as an integral real
         * (json_load.h), the nearest double, so only this range can be checked exactly; an integral real
         * written with a fraction or exponent (7.0, 1e3) is that integer, as get_int takes 16.0 */
        if (json_is_integer(seed)) {
            req->seed = (uint64_t)json_integer_value(seed);
        } else if (json_is_real(seed) && json_real_value(seed) == floor(json_real_value(seed)) &&
                   fabs(json_real_value(seed)) < 9e15) {
            req->seed = (uint64_t)(int64_t)json_real_value(seed);
        } else if (!json_is_real(seed) || json_real_value(seed) != floor(json_real_value(seed))) {
            bad(e, "seed", "Invalid type for 'seed': expected an integer, but got %s instead.", lily_oai_json_kind(seed));
            goto fail;
        } else {
            bad(e, "seed", "Invalid value for 'seed': %.0f is outside [-9223372036854775808, 9223372036854775807] "
                "(a 64-bit signed integer).", json_real_value(seed));
            goto fail;
        }
        req->has_seed = true;
    }
    if (!check_stop(req, e) || !check_logit_bias(req, e))
        goto fail;
    if (is_chat) {
        long long top = 0;
        if (!get_bool(b, "logprobs", &req->logprobs, e) || !get_int(b, "top_logprobs", 0, 20, &top, e))
            goto fail;
        if (top > 0 && !req->logprobs) {
            bad(e, "top_logprobs", "Invalid value for 'top_logprobs': 'logprobs' must be set to true when "
                                   "'top_logprobs' is used.");
            goto fail;
        }
        req->top_logprobs = (int)top;
    } else {
        long long lp = -1; /* completions: logprobs is an integer: how many alternatives */
        if (!get_int(b, "logprobs", 0, 20, &lp, e))
            goto fail;
        req->logprobs = lp >= 0;
        req->top_logprobs = lp > 0 ? (int)lp : 0;
    }
    return true;
fail:
    lily_oai_request_free(req);
    return false;
}

bool lily_oai_parse_request(const char *body, size_t len, bool is_chat, lily_oai_request *req, lily_oai_error *e)
{
    return parse_request(body, len, is_chat, LILY_OAI_MAX_TOOL_NAME, req, e);
}

bool lily_oai_parse_translated_request(const char *body, size_t len, lily_oai_request *req, lily_oai_error *e)
{
    return parse_request(body, len, true, LILY_ANTH_MAX_TOOL_NAME, req, e);
}

void lily_oai_request_free(lily_oai_request *req)
{
    if (!req)
        return;
    for (int i = 0; i < req->n_stop; i++)
        free(req->stop[i]);
    free(req->stop);
    free(req->prompt_ids);
    free(req->logit_bias);
    json_decref(req->body);
    json_decref(req->responses);
    json_decref(req->responses_origins);
    memset(req, 0, sizeof *req);
}

json_t *lily_oai_template_request(const lily_oai_request *req)
{
    json_t *kw = req->chat_template_kwargs ? json_deep_copy(req->chat_template_kwargs) : json_object();
    if (!kw)
        return NULL;
    if (req->enable_thinking >= 0)
        json_object_set_new(kw, "enable_thinking", json_boolean(req->enable_thinking));
    json_t *t = json_pack("{s:O, s:o, s:b}", "messages", req->messages, "chat_template_kwargs", kw,
                          "add_generation_prompt", !req->continue_final);
    if (t && req->continue_final)
        json_object_set_new(t, "continue_final_message", json_true());
    if (t && req->tools)
        json_object_set(t, "tools", req->tools);
    return t;
}

/* ---------------------------------------------------------------------------------------------------
 * responses
 */

static void random_alnum(char *out, int n)
{
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char bytes[64];
    LILY_ASSERT(n <= (int)sizeof bytes);
    FILE *f = fopen("/dev/urandom", "rb");
    size_t got = f ? fread(bytes, 1, (size_t)n, f) : 0;
    if (f)
        fclose(f);
    if (got < (size_t)n) { /* no /dev/urandom: time-seeded xorshift, ids need only be unique-ish */
        static unsigned long long s;
        s ^= (unsigned long long)time(NULL) * 0x9E3779B97F4A7C15ull + (unsigned long long)clock();
        for (int i = 0; i < n; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            bytes[i] = (unsigned char)s;
        }
    }
    for (int i = 0; i < n; i++)
        out[i] = alphabet[bytes[i] % (sizeof alphabet - 1)];
    out[n] = 0;
}

void lily_oai_ident_init(lily_oai_ident *ident, bool is_chat, const char *model)
{
    char r[32];
    random_alnum(r, 24);
    snprintf(ident->id, sizeof ident->id, "%s%s", is_chat ? "chatcmpl-" : "cmpl-", r);
    ident->created = (long long)time(NULL);
    ident->model = model ? model : "lily";
}

void lily_oai_tool_call_id(char out[40])
{
    char r[32];
    random_alnum(r, 24);
    snprintf(out, 40, "call_%s", r);
}

json_t *lily_oai_usage_json(const lily_oai_usage *u)
{
    return json_pack("{s:i, s:i, s:i, s:{s:i}, s:{s:i}}", "prompt_tokens", u->prompt_tokens, "completion_tokens",
                     u->completion_tokens, "total_tokens", u->prompt_tokens + u->completion_tokens,
                     "prompt_tokens_details", "cached_tokens", u->cached_tokens, "completion_tokens_details",
                     "reasoning_tokens", u->reasoning_tokens);
}

void lily_oai_logprob_clear(lily_oai_logprob *lp)
{
    free(lp->token);
    for (int i = 0; i < lp->n_top; i++)
        free(lp->top[i].token);
    memset(lp, 0, sizeof *lp);
}

static json_t *bytes_json(const char *s, int len)
{
    json_t *a = json_array();
    for (int i = 0; a && i < len; i++)
        json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

/* A logprob as JSON: NaN (the first prompt token of an echo, which nothing predicts) is null, as OpenAI's;
 * -inf (a token masked by the sampler) is -9999.0, as OpenAI reports it. */
static json_t *logprob_value(float lp)
{
    return isnan(lp) ? json_null() : json_real(isfinite(lp) ? lp : -9999.0);
}

json_t *lily_oai_chat_logprobs_json(const lily_oai_logprob *lps, int n)
{
    json_t *content = json_array();
    for (int i = 0; content && i < n; i++) {
        json_t *top = json_array();
        for (int k = 0; top && k < lps[i].n_top; k++)
            json_array_append_new(top, json_pack("{s:o, s:o, s:o}", "token",
                                                 lily_oai_string(lps[i].top[k].token, lps[i].top[k].token_len), "logprob",
                                                 logprob_value(lps[i].top[k].logprob), "bytes",
                                                 bytes_json(lps[i].top[k].token, lps[i].top[k].token_len)));
        json_array_append_new(content, json_pack("{s:o, s:o, s:o, s:o}", "token",
                                                 lily_oai_string(lps[i].token, lps[i].token_len), "logprob",
                                                 logprob_value(lps[i].logprob), "bytes",
                                                 bytes_json(lps[i].token, lps[i].token_len), "top_logprobs", top));
    }
    return json_pack("{s:o, s:n}", "content", content, "refusal");
}

json_t *lily_oai_completion_logprobs_json(const lily_oai_logprob *lps, int n, int offset0)
{
    json_t *tokens = json_array(), *token_lps = json_array(), *tops = json_array(), *offsets = json_array();
    int offset = offset0;
    for (int i = 0; i < n; i++) {
        json_array_append_new(tokens, lily_oai_string(lps[i].token, lps[i].token_len));
        json_array_append_new(token_lps, logprob_value(lps[i].logprob));
        if (isnan(lps[i].logprob)) { /* an echoed prompt's first token */
            json_array_append_new(tops, json_null());
            json_array_append_new(offsets, json_integer(offset));
            offset += lps[i].token_len;
            continue;
        }
        json_t *top = json_object();
        for (int k = 0; top && k < lps[i].n_top; k++) { /* keys by length: a token may hold U+0000 */
            json_t *key = lily_oai_string(lps[i].top[k].token, lps[i].top[k].token_len);
            if (key)
                json_object_setn_new(top, json_string_value(key), json_string_length(key),
                                     logprob_value(lps[i].top[k].logprob));
            json_decref(key);
        }
        /* The sampled token is always among them, as OpenAI documents ("up to logprobs+1 elements") and vLLM
         * does: `logprobs: 0` gives it alone, and a client may take max(top) as the greedy token's. */
        json_t *sampled = top ? lily_oai_string(lps[i].token, lps[i].token_len) : NULL;
        if (sampled && !json_object_getn(top, json_string_value(sampled), json_string_length(sampled)))
            json_object_setn_new(top, json_string_value(sampled), json_string_length(sampled),
                                 logprob_value(lps[i].logprob));
        json_decref(sampled);
        json_array_append_new(tops, top);
        json_array_append_new(offsets, json_integer(offset));
        offset += lps[i].token_len;
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", token_lps, "top_logprobs", tops,
                     "text_offset", offsets);
}

json_t *lily_oai_chat_response(const lily_oai_ident *ident, const char *content, size_t content_len,
                               const char *reasoning, size_t reasoning_len, const lily_oai_tool_call *calls,
                               int n_calls, const char *finish_reason, json_t *logprobs, const lily_oai_usage *usage)
{
    json_t *msg = json_pack("{s:s}", "role", "assistant");
    if (!msg) {
        json_decref(logprobs);
        return NULL;
    }
    if (!content)
        content_len = 0;
    if (n_calls > 0 && !content_len)
        json_object_set_new(msg, "content", json_null());
    else
        json_object_set_new(msg, "content", lily_oai_string(content ? content : "", content_len));
    json_object_set_new(msg, "reasoning_content",
                        reasoning && reasoning_len ? lily_oai_string(reasoning, reasoning_len) : json_null());
    if (n_calls > 0) {
        json_t *tc = json_array();
        for (int i = 0; tc && i < n_calls; i++)
            json_array_append_new(tc, json_pack("{s:s, s:s, s:{s:o, s:o}}", "id", calls[i].id, "type", "function",
                                                "function", "name",
                                                lily_oai_string(calls[i].name, strlen(calls[i].name)), "arguments",
                                                lily_oai_string(calls[i].arguments, strlen(calls[i].arguments))));
        json_object_set_new(msg, "tool_calls", tc);
    }
    json_t *choice = json_pack("{s:i, s:o, s:o, s:s}", "index", 0, "message", msg, "logprobs",
                               logprobs ? logprobs : json_null(), "finish_reason", finish_reason);
    return json_pack("{s:s, s:s, s:I, s:s, s:[o], s:n, s:o}", "id", ident->id, "object", "chat.completion",
                     "created", (json_int_t)ident->created, "model", ident->model, "choices", choice,
                     "system_fingerprint", "usage", lily_oai_usage_json(usage));
}

json_t *lily_oai_completion_response(const lily_oai_ident *ident, const char *text, size_t text_len,
                                     const char *finish_reason, json_t *logprobs, const lily_oai_usage *usage)
{
    json_t *choice = json_pack("{s:o, s:i, s:o, s:s}", "text", lily_oai_string(text, text_len), "index", 0,
                               "logprobs", logprobs ? logprobs : json_null(), "finish_reason", finish_reason);
    return json_pack("{s:s, s:s, s:I, s:s, s:[o], s:n, s:o}", "id", ident->id, "object", "text_completion",
                     "created", (json_int_t)ident->created, "model", ident->model, "choices", choice,
                     "system_fingerprint", "usage", lily_oai_usage_json(usage));
}

/* The fields every streamed chunk carries around its one choice (choice is stolen, also on failure);
 * usage_null adds "usage": null, as OpenAI sends when include_usage is on. */
static json_t *chunk_envelope(const lily_oai_ident *ident, const char *object, json_t *choice, bool usage_null)
{
    json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:n, s:[o]}", "id", ident->id, "object", object, "created",
                          (json_int_t)ident->created, "model", ident->model, "system_fingerprint", "choices",
                          choice);
    if (c && usage_null)
        json_object_set_new(c, "usage", json_null());
    return c;
}

json_t *lily_oai_chat_chunk(const lily_oai_ident *ident, json_t *delta, const char *finish_reason,
                            json_t *logprobs, bool usage_null)
{
    json_t *choice = json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "delta", delta ? delta : json_object(),
                               "logprobs", logprobs ? logprobs : json_null(), "finish_reason",
                               finish_reason ? json_string(finish_reason) : json_null());
    return chunk_envelope(ident, "chat.completion.chunk", choice, usage_null);
}

json_t *lily_oai_usage_chunk(const lily_oai_ident *ident, bool is_chat, const lily_oai_usage *usage)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:n, s:[], s:o}", "id", ident->id, "object",
                     is_chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)ident->created,
                     "model", ident->model, "system_fingerprint", "choices", "usage", lily_oai_usage_json(usage));
}

json_t *lily_oai_completion_chunk(const lily_oai_ident *ident, const char *text, size_t text_len,
                                  const char *finish_reason, json_t *logprobs, bool usage_null)
{
    json_t *choice = json_pack("{s:o, s:i, s:o, s:o}", "text", lily_oai_string(text, text_len), "index", 0,
                               "logprobs", logprobs ? logprobs : json_null(), "finish_reason",
                               finish_reason ? json_string(finish_reason) : json_null());
    return chunk_envelope(ident, "text_completion", choice, usage_null);
}

json_t *lily_oai_delta_role(void)
{
    return json_pack("{s:s, s:s}", "role", "assistant", "content", "");
}

json_t *lily_oai_delta_text(const char *field, const char *text, size_t len)
{
    json_t *d = json_object();
    if (d)
        json_object_set_new(d, field, lily_oai_string(text, len));
    return d;
}

json_t *lily_oai_delta_tool_open(int index, const char *id, const char *name)
{
    return json_pack("{s:[{s:i, s:s, s:s, s:{s:o, s:s}}]}", "tool_calls", "index", index, "id", id, "type",
                     "function", "function", "name", lily_oai_string(name, strlen(name)), "arguments", "");
}

json_t *lily_oai_delta_tool_args(int index, const char *fragment, size_t len)
{
    return json_pack("{s:[{s:i, s:{s:o}}]}", "tool_calls", "index", index, "function", "arguments",
                     lily_oai_string(fragment, len));
}

char *lily_oai_sse(const json_t *json, size_t *len)
{
    char *s = lily_oai_dump(json);
    if (!s)
        return NULL;
    size_t n = strlen(s);
    char *out = malloc(n + 9);
    if (out) {
        memcpy(out, "data: ", 6);
        memcpy(out + 6, s, n);
        memcpy(out + 6 + n, "\n\n", 3);
        if (len)
            *len = n + 8;
    }
    free(s);
    return out;
}

char *lily_oai_sse_event(const json_t *event, size_t *len)
{
    const char *type = json_string_value(json_object_get(event, "type"));
    char *data = json_dumps(event, JSON_COMPACT);
    if (!data || !type) {
        free(data);
        return NULL;
    }
    size_t n = strlen(type) + strlen(data) + 32;
    char *out = malloc(n);
    if (out)
        *len = (size_t)snprintf(out, n, "event: %s\ndata: %s\n\n", type, data);
    free(data);
    return out;
}
