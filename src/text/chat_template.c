/* chat_template.c — the Qwen3.6 chat template (chat_template.jinja, sha256 e84f32a2...) in C.
 *
 * Owns: rendering an OpenAI chat request to the prompt, following the template statement by statement
 * (the comments quote the Jinja being reproduced), and Python's str.strip() for the `trim` filter.
 * Does not own: json.dumps formatting (py_json.c), the model-directory check (chat_template_check.c).
 *
 * The request is preprocessed the way vLLM's OpenAI server does before rendering: tool-call arguments
 * given as a JSON string are parsed, null/"" arguments become {}; lily also maps role "developer" to
 * "system" (the template itself would raise on it) and, when asked (lily_chat_options.fold_system), joins a
 * system message after the first into the leading system block. Where the template would print a Python
 * repr of a wrong type (e.g. a non-string text part prints "None"/"5"), lily refuses with a clear error
 * instead.
 */
#include "text/chat_template.h"

#include <stdio.h>
#include <string.h>

#include "base/json_load.h"
#include "text/chat_internal.h"

/* ------------------------------------------------------------------------------------------ strings */

typedef struct {
    const char *p;
    size_t n;
} slice;

/* Code point at s[0..n) (valid UTF-8 assumed: jansson only produces valid UTF-8); *len = its bytes. */
static unsigned decode_utf8(const unsigned char *s, size_t n, size_t *len)
{
    unsigned c = s[0];
    size_t need = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    if (need > n)
        need = 1;
    *len = need;
    if (need == 1)
        return c;
    unsigned cp = c & (0x7f >> need);
    for (size_t i = 1; i < need; i++)
        cp = cp << 6 | (s[i] & 0x3f);
    return cp;
}

/* Python's str.isspace(): Unicode White_Space-ish set CPython uses (bidi WS/B/S or category Zs). */
static int py_isspace(unsigned cp)
{
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}

/* Jinja's `trim` filter: Python str.strip() with no argument. */
static slice py_strip(slice s)
{
    const unsigned char *p = (const unsigned char *)s.p;
    size_t start = 0, end = s.n, len;
    while (start < end && py_isspace(decode_utf8(p + start, end - start, &len)))
        start += len;
    while (end > start) {
        size_t b = end - 1;
        while (b > start && (p[b] & 0xc0) == 0x80)
            b--;
        if (!py_isspace(decode_utf8(p + b, end - b, &len)))
            break;
        end = b;
    }
    return (slice){s.p + start, end - start};
}

static slice lstrip_newlines(slice s)
{
    while (s.n && s.p[0] == '\n')
        s.p++, s.n--;
    return s;
}

static slice rstrip_newlines(slice s)
{
    while (s.n && s.p[s.n - 1] == '\n')
        s.n--;
    return s;
}

/* memmem without relying on _GNU_SOURCE. */
static const char *find_bytes(const char *hay, size_t n, const char *needle, size_t k)
{
    for (size_t i = 0; k <= n && i <= n - k; i++)
        if (hay[i] == needle[0] && !memcmp(hay + i, needle, k))
            return hay + i;
    return NULL;
}

/* First / last occurrence of needle in s, or NULL. */
static const char *find_first(slice s, const char *needle)
{
    return find_bytes(s.p, s.n, needle, strlen(needle));
}

static const char *find_last(slice s, const char *needle)
{
    const char *last = NULL, *at;
    size_t k = strlen(needle);
    slice rest = s;
    while ((at = find_bytes(rest.p, rest.n, needle, k))) {
        last = at;
        rest.n -= (size_t)(at + 1 - rest.p);
        rest.p = at + 1;
    }
    return last;
}

static int starts_with(slice s, const char *prefix)
{
    size_t k = strlen(prefix);
    return s.n >= k && !memcmp(s.p, prefix, k);
}

static int ends_with(slice s, const char *suffix)
{
    size_t k = strlen(suffix);
    return s.n >= k && !memcmp(s.p + s.n - k, suffix, k);
}

static void put(chat_buf *b, slice s) { chat_buf_append(b, s.p, s.n); }

/* Python truthiness of a JSON value (`{% if x %}`). */
static int py_truthy(const json_t *v)
{
    switch (v ? json_typeof(v) : JSON_NULL) {
    case JSON_NULL:
    case JSON_FALSE: return 0;
    case JSON_TRUE: return 1;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0;
    case JSON_STRING: return json_string_length(v) != 0;
    case JSON_ARRAY: return json_array_size(v) != 0;
    case JSON_OBJECT: return json_object_size(v) != 0;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ render */

typedef struct {
    const json_t *messages;
    size_t n_messages;
    const json_t *tools; /* non-empty array, or NULL */
    int enable_thinking, preserve_thinking, add_generation_prompt, add_vision_id;
    int continue_final_message; /* the last (assistant) message stays open: no <|im_end|> after it */
    int fold_system;            /* every system message joins the system block (lily_chat_options) */
    int image_count, video_count; /* the template's namespace counters */
    lily_error *err;
} render_state;

static lily_status template_error(render_state *st, const char *fmt, const char *detail, size_t index)
{
    char what[512];
    snprintf(what, sizeof what, fmt, detail);
    if (index == (size_t)-1)
        return lily_error_set(st->err, LILY_ERR_TEMPLATE, "chat template: %s", what);
    return lily_error_set(st->err, LILY_ERR_TEMPLATE, "chat template: messages[%zu]: %s", index, what);
}

/* The message's role as the template sees it: "developer" is rendered as "system". */
static const char *role_of(const json_t *message)
{
    const char *role = json_string_value(json_object_get(message, "role"));
    return role && !strcmp(role, "developer") ? "system" : role;
}

static int has_role(const json_t *message, const char *role)
{
    const char *r = role_of(message);
    return r && !strcmp(r, role);
}

/* {%- macro render_content(content, do_vision_count, is_system_content=false) %}, appended to dst. */
static lily_status render_content(render_state *st, size_t index, int do_vision_count, int is_system_content,
                                  chat_buf *dst)
{
    const json_t *content = json_object_get(json_array_get(st->messages, index), "content");
    if (!content || json_is_null(content))
        return LILY_OK; /* {{- '' }} */
    if (json_is_string(content)) {
        chat_buf_append(dst, json_string_value(content), json_string_length(content));
        return LILY_OK;
    }
    if (!json_is_array(content))
        return template_error(st, "Unexpected content type (%s): expected a string, null or a list of parts",
                              json_is_object(content) ? "an object" : "a number or boolean", index);
    size_t i;
    const json_t *item;
    json_array_foreach(content, i, item) {
        if (!json_is_object(item)) {
            char what[64];
            snprintf(what, sizeof what, "content[%zu]", i);
            return template_error(st, "%s: expected an object ({\"type\": \"text\", \"text\": ...})", what, index);
        }
        const char *type = json_string_value(json_object_get(item, "type"));
        char label[64];
        if (json_object_get(item, "image") || json_object_get(item, "image_url") || (type && !strcmp(type, "image"))) {
            if (is_system_content)
                return template_error(st, "%s", "System message cannot contain images.", index);
            if (do_vision_count)
                st->image_count++;
            if (st->add_vision_id) {
                snprintf(label, sizeof label, "Picture %d: ", st->image_count);
                chat_buf_puts(dst, label);
            }
            chat_buf_puts(dst, "<|vision_start|><|image_pad|><|vision_end|>");
        } else if (json_object_get(item, "video") || (type && !strcmp(type, "video"))) {
            if (is_system_content)
                return template_error(st, "%s", "System message cannot contain videos.", index);
            if (do_vision_count)
                st->video_count++;
            if (st->add_vision_id) {
                snprintf(label, sizeof label, "Video %d: ", st->video_count);
                chat_buf_puts(dst, label);
            }
            chat_buf_puts(dst, "<|vision_start|><|video_pad|><|vision_end|>");
        } else if (json_object_get(item, "text")) {
            const json_t *text = json_object_get(item, "text");
            if (!json_is_string(text)) {
                snprintf(label, sizeof label, "content[%zu].text", i);
                return template_error(st, "%s: expected a string", label, index);
            }
            chat_buf_append(dst, json_string_value(text), json_string_length(text));
        } else {
            snprintf(label, sizeof label, "content[%zu]", i);
            return template_error(st, "Unexpected item type in content (%s has no text, image or video).", label,
                                  index);
        }
    }
    return LILY_OK;
}

/* render_content(...)|trim into *tmp (reset first); *trimmed points into tmp. */
static lily_status render_content_trimmed(render_state *st, size_t index, int do_vision_count, int is_system_content,
                                          chat_buf *tmp, slice *trimmed)
{
    tmp->len = 0;
    chat_buf_append(tmp, "", 0); /* make data non-NULL */
    lily_status s = render_content(st, index, do_vision_count, is_system_content, tmp);
    if (s != LILY_OK)
        return s;
    if (tmp->failed)
        return lily_error_set(st->err, LILY_ERR_OUT_OF_MEMORY, "chat template: out of memory");
    *trimmed = py_strip((slice){tmp->data, tmp->len});
    return LILY_OK;
}

/* The system block: tools listing and/or messages[0] when it is a system message (with fold_system, every
 * system message: their stripped texts in order, the non-empty ones joined by a blank line). */
static lily_status render_system(render_state *st, chat_buf *out, chat_buf *tmp)
{
    chat_buf joined = {0};
    int has_system = 0;
    for (size_t i = 0; i < (st->fold_system ? st->n_messages : 1); i++) {
        if (!has_role(json_array_get(st->messages, i), "system"))
            continue;
        slice text;
        lily_status s = render_content_trimmed(st, i, 0, 1, tmp, &text);
        if (s != LILY_OK) {
            chat_buf_free(&joined);
            return s;
        }
        if (text.n && joined.len)
            chat_buf_puts(&joined, "\n\n");
        put(&joined, text);
        has_system = 1;
    }
    if (joined.failed) {
        chat_buf_free(&joined);
        return lily_error_set(st->err, LILY_ERR_OUT_OF_MEMORY, "chat template: out of memory");
    }
    slice content = {joined.data, joined.len};
    if (st->tools) {
        chat_buf_puts(out, "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>");
        size_t i;
        const json_t *tool;
        json_array_foreach(st->tools, i, tool) {
            chat_buf_puts(out, "\n");
            py_json_append(out, tool); /* {{- tool | tojson }} */
        }
        chat_buf_puts(out,
                      "\n</tools>"
                      "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
                      "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
                      "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
                      "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\n"
                      "Reminder:\n- Function calls MUST follow the specified format: an inner "
                      "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
                      "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
                      "function call in natural language BEFORE the function call, but NOT after\n- If there is "
                      "no function call available, answer the question like normal with your current knowledge "
                      "and do not tell the user about function calls\n</IMPORTANT>");
        if (content.n) {
            chat_buf_puts(out, "\n\n");
            put(out, content);
        }
        chat_buf_puts(out, "<|im_end|>\n");
    } else if (has_system) {
        chat_buf_puts(out, "<|im_start|>system\n");
        put(out, content);
        chat_buf_puts(out, "<|im_end|>\n");
    }
    chat_buf_free(&joined);
    return LILY_OK;
}

/* ns.last_query_index: the last user message that is not only a <tool_response> block. */
static lily_status find_last_query(render_state *st, chat_buf *tmp, size_t *last_query_index)
{
    for (size_t k = st->n_messages; k-- > 0;) {
        if (!has_role(json_array_get(st->messages, k), "user"))
            continue;
        slice content;
        lily_status s = render_content_trimmed(st, k, 0, 0, tmp, &content);
        if (s != LILY_OK)
            return s;
        if (!(starts_with(content, "<tool_response>") && ends_with(content, "</tool_response>"))) {
            *last_query_index = k;
            return LILY_OK;
        }
    }
    return template_error(st, "No user query found in messages (a user message is required%s).",
                          ", one that is not only a <tool_response> block", (size_t)-1);
}

/* One assistant tool call: <tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n...</tool_call>. */
static lily_status render_tool_call(render_state *st, size_t index, size_t call_index, const json_t *tool_call,
                                    slice content, chat_buf *out)
{
    char where[64];
    snprintf(where, sizeof where, "tool_calls[%zu]", call_index);
    if (!json_is_object(tool_call))
        return template_error(st, "%s: expected an object", where, index);
    if (json_object_get(tool_call, "function")) { /* {%- if tool_call.function is defined %} */
        tool_call = json_object_get(tool_call, "function");
        if (!json_is_object(tool_call))
            return template_error(st, "%s.function: expected an object", where, index);
    }
    const json_t *name = json_object_get(tool_call, "name");
    if (!json_is_string(name))
        return template_error(st, "%s: the function needs a string \"name\"", where, index);
    if (call_index == 0)
        chat_buf_puts(out, py_strip(content).n ? "\n\n<tool_call>\n<function=" : "<tool_call>\n<function=");
    else
        chat_buf_puts(out, "\n<tool_call>\n<function=");
    chat_buf_append(out, json_string_value(name), json_string_length(name));
    chat_buf_puts(out, ">\n");

    const json_t *arguments = json_object_get(tool_call, "arguments");
    json_t *parsed = NULL;
    if (arguments && json_is_string(arguments) && json_string_length(arguments) > 0) {
        json_error_t jerr;
        /* U+0000 as the request's strings may hold; a number past int64 / the double range as the request
         * body's own numbers (base/json_load.h: the nearest double), where jansson alone refuses the text */
        parsed = lily_json_loadb(json_string_value(arguments), json_string_length(arguments),
                                 JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
        if (!parsed) {
            char what[400];
            snprintf(what, sizeof what, "%s.arguments: not valid JSON (%s at column %d)", where, jerr.text,
                     jerr.column);
            return template_error(st, "%s", what, index);
        }
        arguments = parsed;
    } else if (arguments && (json_is_null(arguments) || json_is_string(arguments))) {
        arguments = NULL; /* vLLM: null or "" arguments become {} */
    }
    lily_status status = LILY_OK;
    if (arguments && !json_is_object(arguments)) {
        status = template_error(st, "%s.arguments: expected a JSON object (or a string holding one)", where, index);
    } else if (arguments) {
        const char *key;
        size_t key_len;
        json_t *value;
        json_object_keylen_foreach((json_t *)arguments, key, key_len, value) {
            chat_buf_puts(out, "<parameter=");
            chat_buf_append(out, key, key_len);
            chat_buf_puts(out, ">\n");
            /* {%- set args_value = args_value | string if args_value is string else args_value | tojson %} */
            if (json_is_string(value))
                chat_buf_append(out, json_string_value(value), json_string_length(value));
            else
                py_json_append(out, value);
            chat_buf_puts(out, "\n</parameter>\n");
        }
    }
    json_decref(parsed);
    if (status == LILY_OK)
        chat_buf_puts(out, "</function>\n</tool_call>");
    return status;
}

static lily_status render_assistant(render_state *st, size_t index, size_t last_query_index, slice content,
                                    chat_buf *out)
{
    const json_t *message = json_array_get(st->messages, index);
    const json_t *reasoning_json = json_object_get(message, "reasoning_content");
    slice reasoning = {"", 0};
    if (json_is_string(reasoning_json)) {
        reasoning = (slice){json_string_value(reasoning_json), json_string_length(reasoning_json)};
    } else if (find_first(content, "</think>")) {
        /* reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
        const char *close = find_first(content, "</think>");
        slice before = rstrip_newlines((slice){content.p, (size_t)(close - content.p)});
        const char *open = find_last(before, "<think>");
        if (open)
            before = (slice){open + 7, before.n - (size_t)(open + 7 - before.p)};
        reasoning = lstrip_newlines(before);
        /* content = content.split('</think>')[-1].lstrip('\n') */
        const char *last_close = find_last(content, "</think>");
        content = lstrip_newlines((slice){last_close + 8, content.n - (size_t)(last_close + 8 - content.p)});
    }
    reasoning = py_strip(reasoning);
    if (st->preserve_thinking || index > last_query_index) {
        chat_buf_puts(out, "<|im_start|>assistant\n<think>\n");
        put(out, reasoning);
        chat_buf_puts(out, "\n</think>\n\n");
    } else {
        chat_buf_puts(out, "<|im_start|>assistant\n");
    }
    put(out, content);

    const json_t *tool_calls = json_object_get(message, "tool_calls");
    if (tool_calls && !json_is_null(tool_calls)) {
        if (!json_is_array(tool_calls))
            return template_error(st, "%s", "tool_calls: expected an array", index);
        size_t k;
        const json_t *tool_call;
        json_array_foreach(tool_calls, k, tool_call) {
            lily_status s = render_tool_call(st, index, k, tool_call, content, out);
            if (s != LILY_OK)
                return s;
        }
    }
    if (!(st->continue_final_message && index + 1 == st->n_messages))
        chat_buf_puts(out, "<|im_end|>\n");
    return LILY_OK;
}

/* The message before (step -1) or after (+1) messages[i] as the template's loop sees it (NULL: none). With
 * fold_system the loop runs over the folded list: the system messages are one leading message, so a late one
 * is no neighbour, and the message before the first non-system one is that leading system message. */
static const json_t *neighbor(const render_state *st, size_t i, int step)
{
    if (!st->fold_system)
        return step < 0 ? (i > 0 ? json_array_get(st->messages, i - 1) : NULL) : json_array_get(st->messages, i + 1);
    const json_t *first_system = NULL;
    for (size_t k = i; step < 0 ? k-- > 0 : ++k < st->n_messages;) {
        const json_t *m = json_array_get(st->messages, k);
        if (!has_role(m, "system"))
            return m;
        first_system = m;
    }
    if (step < 0 && !first_system) /* a system message after i still leads the folded list */
        for (size_t k = i + 1; k < st->n_messages && !first_system; k++)
            if (has_role(json_array_get(st->messages, k), "system"))
                first_system = json_array_get(st->messages, k);
    return step < 0 ? first_system : NULL;
}

/* The body: {%- for message in messages %} ... {%- endfor %}. */
static lily_status render_messages(render_state *st, size_t last_query_index, chat_buf *out, chat_buf *tmp)
{
    for (size_t i = 0; i < st->n_messages; i++) {
        const json_t *message = json_array_get(st->messages, i);
        const char *role = role_of(message);
        slice content;
        lily_status s = render_content_trimmed(st, i, 1, 0, tmp, &content);
        if (s != LILY_OK)
            return s;
        if (!strcmp(role, "system")) {
            if (i != 0 && !st->fold_system) /* folded: rendered in the system block */
                return template_error(st, "%s", "System message must be at the beginning.", i);
        } else if (!strcmp(role, "user")) {
            chat_buf_puts(out, "<|im_start|>user\n");
            put(out, content);
            chat_buf_puts(out, "<|im_end|>\n");
        } else if (!strcmp(role, "assistant")) {
            s = render_assistant(st, i, last_query_index, content, out);
            if (s != LILY_OK)
                return s;
        } else if (!strcmp(role, "tool")) {
            /* consecutive tool results share one user turn (loop.previtem / loop.nextitem) */
            const json_t *prev = neighbor(st, i, -1), *next = neighbor(st, i, +1);
            if (prev && !has_role(prev, "tool"))
                chat_buf_puts(out, "<|im_start|>user");
            chat_buf_puts(out, "\n<tool_response>\n");
            put(out, content);
            chat_buf_puts(out, "\n</tool_response>");
            if (!next || !has_role(next, "tool"))
                chat_buf_puts(out, "<|im_end|>\n");
        } else {
            return template_error(st,
                                  "Unexpected message role \"%s\" (expected system, developer, user, assistant or "
                                  "tool).",
                                  role, i);
        }
    }
    return LILY_OK;
}

/* A boolean kwarg: absent -> dflt, null -> null_value, true/false; other types are an error. */
static lily_status read_bool(render_state *st, const json_t *obj, const char *key, const char *where, int dflt,
                             int null_value, int *value)
{
    const json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v) {
        *value = dflt;
    } else if (json_is_null(v)) {
        *value = null_value;
    } else if (json_is_boolean(v)) {
        *value = json_is_true(v);
    } else {
        char what[128];
        snprintf(what, sizeof what, "%s%s", where, key);
        return template_error(st, "%s: expected true or false", what, (size_t)-1);
    }
    return LILY_OK;
}

/* Read and check the request's fields into st. */
static lily_status read_request(render_state *st, const json_t *request, const lily_chat_options *opts)
{
    const json_t *kwargs = NULL;
    if (json_is_array(request)) {
        st->messages = request;
    } else if (json_is_object(request)) {
        st->messages = json_object_get(request, "messages");
        if (!json_is_array(st->messages))
            return template_error(st, "%s", "the request needs a \"messages\" array", (size_t)-1);
        kwargs = json_object_get(request, "chat_template_kwargs");
        if (kwargs && !json_is_null(kwargs) && !json_is_object(kwargs))
            return template_error(st, "%s", "chat_template_kwargs: expected an object", (size_t)-1);
        if (json_is_null(kwargs))
            kwargs = NULL;
        const json_t *tools = json_object_get(request, "tools");
        if (tools && !json_is_null(tools) && !json_is_array(tools))
            return template_error(st, "%s", "tools: expected an array", (size_t)-1);
        st->tools = json_array_size(tools) ? tools : NULL;
    } else {
        return template_error(st, "%s", "expected a request object or a messages array", (size_t)-1);
    }
    st->n_messages = json_array_size(st->messages);
    if (st->n_messages == 0)
        return template_error(st, "%s", "No messages provided.", (size_t)-1);
    for (size_t i = 0; i < st->n_messages; i++) {
        const json_t *message = json_array_get(st->messages, i);
        if (!json_is_object(message))
            return template_error(st, "%s", "expected an object with \"role\" and \"content\"", i);
        if (!json_is_string(json_object_get(message, "role")))
            return template_error(st, "%s", "needs a string \"role\"", i);
    }

    lily_status s;
    /* {%- if enable_thinking is defined and enable_thinking is false %}: null leaves thinking on */
    if ((s = read_bool(st, kwargs, "enable_thinking", "chat_template_kwargs.", 1, 1, &st->enable_thinking)))
        return s;
    /* {%- if preserve_thinking is defined and preserve_thinking is true %} */
    if ((s = read_bool(st, kwargs, "preserve_thinking", "chat_template_kwargs.", 0, 0, &st->preserve_thinking)))
        return s;
    st->add_vision_id = kwargs ? py_truthy(json_object_get(kwargs, "add_vision_id")) : 0;
    if ((s = read_bool(st, json_is_object(request) ? request : NULL, "add_generation_prompt", "", 1, 1,
                       &st->add_generation_prompt)))
        return s;
    if (opts && opts->enable_thinking >= 0)
        st->enable_thinking = opts->enable_thinking;
    if (opts && opts->preserve_thinking >= 0)
        st->preserve_thinking = opts->preserve_thinking;
    if (opts && opts->add_generation_prompt >= 0)
        st->add_generation_prompt = opts->add_generation_prompt;
    st->fold_system = opts && opts->fold_system > 0;
    /* vLLM's continue_final_message: the reply continues the last message, which must be the assistant's */
    if ((s = read_bool(st, json_is_object(request) ? request : NULL, "continue_final_message", "", 0, 0,
                       &st->continue_final_message)))
        return s;
    if (st->continue_final_message && st->add_generation_prompt)
        return template_error(st, "%s", "continue_final_message and add_generation_prompt cannot both be true",
                              (size_t)-1);
    if (st->continue_final_message && !has_role(json_array_get(st->messages, st->n_messages - 1), "assistant"))
        return template_error(st, "%s", "continue_final_message: the last message must be the assistant's",
                              st->n_messages - 1);
    return LILY_OK;
}

void lily_chat_options_init(lily_chat_options *opts)
{
    opts->enable_thinking = -1;
    opts->preserve_thinking = -1;
    opts->add_generation_prompt = -1;
    opts->fold_system = -1;
}

lily_status lily_chat_render(const json_t *request, const lily_chat_options *opts, char **out, lily_error *err)
{
    size_t len;
    return lily_chat_render_n(request, opts, out, &len, err);
}

lily_status lily_chat_render_n(const json_t *request, const lily_chat_options *opts, char **out, size_t *len,
                               lily_error *err)
{
    *out = NULL;
    *len = 0;
    render_state st = {0};
    st.err = err;
    chat_buf text = {0}, tmp = {0};
    size_t last_query_index = 0;
    lily_status s = read_request(&st, request, opts);
    if (s == LILY_OK)
        s = render_system(&st, &text, &tmp);
    if (s == LILY_OK)
        s = find_last_query(&st, &tmp, &last_query_index);
    if (s == LILY_OK)
        s = render_messages(&st, last_query_index, &text, &tmp);
    if (s == LILY_OK && st.add_generation_prompt)
        chat_buf_puts(&text, st.enable_thinking ? "<|im_start|>assistant\n<think>\n"
                                                : "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    chat_buf_append(&text, "", 0);
    if (s == LILY_OK && (text.failed || tmp.failed))
        s = lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "chat template: out of memory");
    chat_buf_free(&tmp);
    if (s != LILY_OK) {
        chat_buf_free(&text);
        return s;
    }
    *out = text.data;
    *len = text.len;
    return LILY_OK;
}
