/* output_parser.c — incremental reasoning / content / Qwen XML tool-call parser (output_parser.h).
 *
 * Owns: a state machine over the structural tags. Each state has a small set of tags it reacts to; the
 * scanner walks the unprocessed text left to right, hands the text before a tag to the state's text
 * handler, and holds back text from the first position where a tag could still begin when the input
 * ends. Every decision depends on the text alone, never on where a piece ended, which is what makes
 * token-by-token parsing give the same result as parsing the whole text.
 */
#include "text/output_parser.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/json_load.h"

/* ---- growable text ------------------------------------------------------------------------------- */

typedef struct {
    char *data; /* NUL-terminated when non-NULL */
    size_t len, cap;
} text_buf;

static bool buf_append(text_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d)
            return false;
        b->data = d;
        b->cap = cap;
    }
    if (n)
        memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return true;
}

static bool buf_append_str(text_buf *b, const char *s) { return buf_append(b, s, strlen(s)); }

static void buf_clear(text_buf *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

/* Take ownership of the contents as a NUL-terminated string ("" when empty); b is left empty. */
static char *buf_take(text_buf *b)
{
    if (!b->data && !buf_append(b, "", 0))
        return NULL;
    char *s = b->data;
    *b = (text_buf){0};
    return s;
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* JSON string body (no quotes) of s[n]: escapes '"', '\\' and control characters; UTF-8 passes through. */
static bool append_json_escaped(text_buf *b, const char *s, size_t n)
{
    size_t run = 0; /* start of the pending run of bytes that need no escape */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char ubuf[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(ubuf, sizeof ubuf, "\\u%04x", c);
                esc = ubuf;
            }
        }
        if (esc) {
            if (!buf_append(b, s + run, i - run) || !buf_append_str(b, esc))
                return false;
            run = i + 1;
        }
    }
    return buf_append(b, s + run, n - run);
}

/* ---- states and their tags ------------------------------------------------------------------------ */

typedef enum {
    S_REASONING,      /* inside a think block */
    S_CONTENT,        /* plain answer text */
    S_TOOL_OPEN,      /* after <tool_call>, before <function= */
    S_FUNCTION_NAME,  /* after <function=, until > or newline */
    S_FUNCTION_BODY,  /* between parameters */
    S_PARAM_NAME,     /* after <parameter=, until > or newline */
    S_PARAM_VALUE,    /* the value, until a closing tag */
    S_AFTER_FUNCTION, /* after </function>, before </tool_call> */
    S_JSON_CALL,      /* {"name": ..., "arguments": {...}} inside <tool_call> (the Qwen2.5/Qwen3 form) */
    S_ANSWER,         /* constrained content (options.verbatim_answer), to the end: no tags */
} parse_state;

typedef enum {
    T_THINK_OPEN,      /* <think> */
    T_THINK_CLOSE,     /* </think> */
    T_TOOL_CALL_OPEN,  /* <tool_call> */
    T_TOOL_CALL_CLOSE, /* </tool_call> */
    T_FUNCTION_OPEN,   /* <function= */
    T_FUNCTION_CLOSE,  /* </function> */
    T_PARAM_OPEN,      /* <parameter= */
    T_PARAM_CLOSE,     /* </parameter> */
    T_NAME_END,        /* > */
    T_NEWLINE,         /* \n (ends a name) */
    T_COUNT
} tag_id;

static const char *const tag_text[T_COUNT] = {
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<function=", "</function>",
    "<parameter=", "</parameter>", ">", "\n",
};

/* The tags each state reacts to. No tag in a set is a prefix or a substring of another in the same set,
 * so at most one can match at a position. */
static const tag_id *state_tags(parse_state s, int *n)
{
    static const tag_id reasoning[] = {T_THINK_OPEN, T_THINK_CLOSE, T_TOOL_CALL_OPEN};
    static const tag_id content[] = {T_THINK_OPEN, T_THINK_CLOSE, T_TOOL_CALL_OPEN, T_FUNCTION_OPEN};
    static const tag_id tool_open[] = {T_FUNCTION_OPEN, T_TOOL_CALL_CLOSE};
    static const tag_id name[] = {T_NAME_END, T_NEWLINE};
    static const tag_id body[] = {T_PARAM_OPEN, T_FUNCTION_CLOSE, T_TOOL_CALL_CLOSE, T_FUNCTION_OPEN};
    static const tag_id value[] = {T_PARAM_CLOSE, T_PARAM_OPEN, T_FUNCTION_CLOSE, T_TOOL_CALL_CLOSE};
    static const tag_id after[] = {T_TOOL_CALL_CLOSE, T_FUNCTION_OPEN, T_TOOL_CALL_OPEN};
    static const tag_id json_call[] = {T_TOOL_CALL_CLOSE};
#define SET(a) (*n = (int)(sizeof a / sizeof a[0]), a)
    switch (s) {
    case S_REASONING: return SET(reasoning);
    case S_CONTENT: return SET(content);
    case S_TOOL_OPEN: return SET(tool_open);
    case S_FUNCTION_NAME:
    case S_PARAM_NAME: return SET(name);
    case S_FUNCTION_BODY: return SET(body);
    case S_PARAM_VALUE: return SET(value);
    case S_AFTER_FUNCTION: return SET(after);
    case S_JSON_CALL: return SET(json_call);
    case S_ANSWER: break;
    }
#undef SET
    *n = 0;
    return NULL;
}

/* ---- parser state --------------------------------------------------------------------------------- */

/* Reasoning or content: leading whitespace dropped, trailing whitespace held until more text follows. */
typedef struct {
    text_buf text;
    text_buf held_space;
    bool started;
} channel;

/* How a parameter's value becomes JSON. */
enum { VALUE_STRING = 0, VALUE_JSON = 1 };
enum { /* allowed JSON types for VALUE_JSON */
    ALLOW_INTEGER = 1, ALLOW_NUMBER = 2, ALLOW_BOOLEAN = 4, ALLOW_OBJECT = 8, ALLOW_ARRAY = 16, ALLOW_NULL = 32,
};

typedef struct {
    text_buf name;
    text_buf arguments;
} tool_call_buf;

struct lily_output_parser {
    lily_output_parser_options opts;
    json_t *tools;          /* referenced */
    parse_state state;
    text_buf pending;       /* input not yet processed (a possible tag start) */
    bool failed;            /* out of memory: unusable */
    bool tool_open_text;    /* S_TOOL_OPEN has seen text other than whitespace */
    channel reasoning, content;

    tool_call_buf *calls;
    int n_calls, calls_cap;
    bool call_open;         /* calls[n_calls - 1] has started but not ended */
    const json_t *parameters; /* the open call's parameters schema ($ref targets live there), or NULL */
    const json_t *properties; /* its "properties": the parameter schemas, or NULL */
    int n_params;           /* parameters written in the open call */
    text_buf name;          /* function or parameter name being read */

    int value_kind;         /* VALUE_STRING / VALUE_JSON */
    int value_allowed;      /* ALLOW_* for VALUE_JSON */
    bool value_started;     /* a byte of the value was seen (the leading newline rule applies once) */
    bool value_held_newline;/* a string value's trailing newline, held */
    text_buf value;         /* a VALUE_JSON value, buffered until it ends */
    text_buf fragment;      /* scratch for one arguments fragment */

    lily_parsed_output result;
};

static void emit(lily_output_parser *p, lily_output_event_kind kind, int index, const char *text, size_t len)
{
    if (p->opts.on_event) {
        /* call_unfinished is set by finish just before it closes a call the text cut short */
        lily_output_event ev = {kind, index, text, len, kind == LILY_OUTPUT_TOOL_CALL_END && p->result.call_unfinished};
        p->opts.on_event(p->opts.user, &ev);
    }
}

static void fail(lily_output_parser *p) { p->failed = true; }

/* ---- reasoning and content ------------------------------------------------------------------------ */

static void channel_text(lily_output_parser *p, channel *ch, lily_output_event_kind kind, const char *s, size_t n)
{
    size_t i = 0;
    if (!ch->started) {
        while (i < n && is_space(s[i]))
            i++;
        if (i == n)
            return;
        ch->started = true;
    }
    size_t last = n; /* one past the last non-space byte */
    while (last > i && is_space(s[last - 1]))
        last--;
    if (last == i) {
        if (!buf_append(&ch->held_space, s + i, n - i))
            fail(p);
        return;
    }
    size_t before = ch->text.len;
    if (!buf_append(&ch->text, ch->held_space.data ? ch->held_space.data : "", ch->held_space.len) ||
        !buf_append(&ch->text, s + i, last - i)) {
        fail(p);
        return;
    }
    buf_clear(&ch->held_space);
    if (!buf_append(&ch->held_space, s + last, n - last)) {
        fail(p);
        return;
    }
    emit(p, kind, -1, ch->text.data + before, ch->text.len - before);
}

/* ---- tool calls ----------------------------------------------------------------------------------- */

static tool_call_buf *open_call(lily_output_parser *p) { return &p->calls[p->n_calls - 1]; }

/* Append s[n] to the open call's arguments and emit it as one fragment. */
static void arguments_fragment(lily_output_parser *p, const char *s, size_t n)
{
    if (n == 0)
        return;
    tool_call_buf *c = open_call(p);
    size_t before = c->arguments.len;
    if (!buf_append(&c->arguments, s, n)) {
        fail(p);
        return;
    }
    emit(p, LILY_OUTPUT_TOOL_ARGUMENTS, p->n_calls - 1, c->arguments.data + before, n);
}

static void trim(const char *s, size_t n, const char **out, size_t *out_n)
{
    while (n && is_space(*s))
        s++, n--;
    while (n && is_space(s[n - 1]))
        n--;
    *out = s;
    *out_n = n;
}

/* The "parameters" object of the tool named `name` in p->tools (OpenAI form, with or without the
 * {"type": "function", "function": {...}} wrapper), or NULL. */
static const json_t *find_parameters(const lily_output_parser *p, const char *name)
{
    size_t i;
    json_t *tool;
    json_array_foreach(p->tools, i, tool)
    {
        json_t *fn = json_object_get(tool, "function");
        if (!json_is_object(fn))
            fn = tool;
        json_t *fname = json_object_get(fn, "name");
        if (json_is_string(fname) && !strcmp(json_string_value(fname), name)) {
            json_t *params = json_object_get(fn, "parameters");
            return json_is_object(params) ? params : NULL;
        }
    }
    return NULL;
}

static void start_call(lily_output_parser *p)
{
    const char *name;
    size_t n;
    trim(p->name.data ? p->name.data : "", p->name.len, &name, &n);
    if (p->n_calls == p->calls_cap) {
        int cap = p->calls_cap ? 2 * p->calls_cap : 4;
        tool_call_buf *c = realloc(p->calls, (size_t)cap * sizeof *c);
        if (!c) {
            fail(p);
            return;
        }
        p->calls = c;
        p->calls_cap = cap;
    }
    tool_call_buf *c = &p->calls[p->n_calls++];
    *c = (tool_call_buf){0};
    if (!buf_append(&c->name, name, n) || !buf_append(&c->arguments, "", 0)) {
        fail(p);
        return;
    }
    p->call_open = true;
    p->n_params = 0;
    p->parameters = p->tools ? find_parameters(p, c->name.data) : NULL;
    p->properties = json_object_get(p->parameters, "properties");
    if (!json_is_object(p->properties))
        p->properties = NULL;
    buf_clear(&p->name);
    emit(p, LILY_OUTPUT_TOOL_CALL_START, p->n_calls - 1, c->name.data, c->name.len);
}

static void end_call(lily_output_parser *p)
{
    if (!p->call_open)
        return;
    arguments_fragment(p, p->n_params ? "}" : "{}", p->n_params ? 1 : 2);
    p->call_open = false;
    emit(p, LILY_OUTPUT_TOOL_CALL_END, p->n_calls - 1, "", 0);
}

/* The ALLOW_* bit of a JSON value's type. */
static int value_type_bit(const json_t *v)
{
    return json_is_integer(v) ? ALLOW_INTEGER
         : json_is_real(v)    ? ALLOW_NUMBER
         : json_is_boolean(v) ? ALLOW_BOOLEAN
         : json_is_object(v)  ? ALLOW_OBJECT
         : json_is_array(v)   ? ALLOW_ARRAY
         : json_is_null(v)    ? ALLOW_NULL
                              : 0;
}

/* The target of a $ref inside root (the tool's parameters): "#", "#/$defs/NAME" or "#/definitions/NAME", the
 * forms the grammar compiler resolves (grammar/json_schema.c); NULL otherwise. */
static const json_t *resolve_ref(const json_t *root, const char *ref)
{
    if (!strcmp(ref, "#"))
        return root;
    static const char *const sections[] = {"$defs", "definitions"};
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++) {
        size_t n = strlen(sections[i]);
        if (!strncmp(ref, "#/", 2) && !strncmp(ref + 2, sections[i], n) && ref[2 + n] == '/')
            return json_object_get(json_object_get(root, sections[i]), ref + 3 + n);
    }
    return NULL;
}

/* Allowed JSON types of a parameter's schema: its "type" (a string or a list) when it has one, else what the
 * grammar compiler (grammar/json_schema.c) makes of it: a $ref (within root), const and enum (the types of
 * their values), anyOf / oneOf alternatives, allOf of one schema, "properties" (an object) or "items" (an
 * array). Returns VALUE_STRING when the schema is absent, admits a string (written raw), or says nothing
 * lily knows; depth bounds $ref cycles. */
static int schema_allowed(const json_t *root, const json_t *schema, int depth, int *allowed)
{
    *allowed = 0;
    if (!json_is_object(schema) || depth > 16)
        return VALUE_STRING;
    json_t *type = json_object_get(schema, "type");
    json_t *v;
    if (json_is_string(type) || json_is_array(type)) {
        size_t n_types = json_is_array(type) ? json_array_size(type) : 1;
        for (size_t i = 0; i < n_types; i++) {
            const char *name = json_string_value(json_is_array(type) ? json_array_get(type, i) : type);
            if (!name)
                continue;
            if (!strcmp(name, "string"))
                return VALUE_STRING;
            else if (!strcmp(name, "integer"))
                *allowed |= ALLOW_INTEGER;
            else if (!strcmp(name, "number"))
                *allowed |= ALLOW_NUMBER;
            else if (!strcmp(name, "boolean"))
                *allowed |= ALLOW_BOOLEAN;
            else if (!strcmp(name, "object"))
                *allowed |= ALLOW_OBJECT;
            else if (!strcmp(name, "array"))
                *allowed |= ALLOW_ARRAY;
            else if (!strcmp(name, "null"))
                *allowed |= ALLOW_NULL;
        }
    } else if (json_is_string(v = json_object_get(schema, "$ref"))) {
        return schema_allowed(root, resolve_ref(root, json_string_value(v)), depth + 1, allowed);
    } else if ((v = json_object_get(schema, "const"))) {
        *allowed = value_type_bit(v); /* 0 for a string: written raw */
    } else if (json_is_array(v = json_object_get(schema, "enum"))) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e)
        {
            int bit = value_type_bit(e);
            if (!bit)
                return VALUE_STRING;
            *allowed |= bit;
        }
    } else if (json_is_array(v = json_object_get(schema, "anyOf")) ||
               json_is_array(v = json_object_get(schema, "oneOf"))) {
        size_t i;
        json_t *alt;
        json_array_foreach(v, i, alt)
        {
            int a;
            if (schema_allowed(root, alt, depth + 1, &a) == VALUE_STRING)
                return VALUE_STRING;
            *allowed |= a;
        }
    } else if (json_is_array(v = json_object_get(schema, "allOf")) && json_array_size(v) == 1) {
        return schema_allowed(root, json_array_get(v, 0), depth + 1, allowed);
    } else if (json_object_get(schema, "properties")) {
        *allowed = ALLOW_OBJECT;
    } else if (json_object_get(schema, "items")) {
        *allowed = ALLOW_ARRAY;
    }
    return *allowed ? VALUE_JSON : VALUE_STRING;
}

static void start_param(lily_output_parser *p)
{
    const char *key;
    size_t n;
    trim(p->name.data ? p->name.data : "", p->name.len, &key, &n);
    const json_t *schema = NULL;
    if (p->properties) {
        char *k = strndup(key, n);
        if (!k) {
            fail(p);
            return;
        }
        schema = json_object_get(p->properties, k);
        free(k);
    }
    p->value_kind = schema_allowed(p->parameters, schema, 0, &p->value_allowed);
    p->value_started = false;
    p->value_held_newline = false;
    buf_clear(&p->value);
    buf_clear(&p->fragment);
    if (!buf_append_str(&p->fragment, p->n_params ? ",\"" : "{\"") || !append_json_escaped(&p->fragment, key, n) ||
        !buf_append_str(&p->fragment, p->value_kind == VALUE_STRING ? "\":\"" : "\":")) {
        fail(p);
        return;
    }
    buf_clear(&p->name);
    p->n_params++;
    arguments_fragment(p, p->fragment.data, p->fragment.len);
}

static void value_text(lily_output_parser *p, const char *s, size_t n)
{
    if (n && !p->value_started) {
        p->value_started = true;
        if (s[0] == '\n')
            s++, n--;
    }
    if (n == 0)
        return;
    if (p->value_kind == VALUE_JSON) {
        if (!buf_append(&p->value, s, n))
            fail(p);
        return;
    }
    buf_clear(&p->fragment);
    bool ok = true;
    if (p->value_held_newline)
        ok = buf_append_str(&p->fragment, "\\n");
    p->value_held_newline = s[n - 1] == '\n';
    ok = ok && append_json_escaped(&p->fragment, s, n - p->value_held_newline);
    if (!ok) {
        fail(p);
        return;
    }
    arguments_fragment(p, p->fragment.data, p->fragment.len);
}

/* The JSON text for a VALUE_JSON value s[n] (already stripped of its newlines), or NULL when it does not
 * parse to an allowed type. Numbers, objects and arrays are written as the model wrote them (after
 * checking they parse with lily serve's loader), so no float is ever reformatted and an integer past int64
 * keeps its digits, as in the JSON form (json_call). */
static const char *json_value_text(int allowed, const char *s, size_t n, size_t *out_n)
{
    const char *t;
    size_t tn;
    trim(s, n, &t, &tn);
    *out_n = tn;
    if (tn == 4 && !strncasecmp(t, "null", 4)) {
        *out_n = 4;
        return "null";
    }
    if (allowed & ALLOW_BOOLEAN) {
        if (tn == 4 && !strncasecmp(t, "true", 4)) {
            *out_n = 4;
            return "true";
        }
        if (tn == 5 && !strncasecmp(t, "false", 5)) {
            *out_n = 5;
            return "false";
        }
    }
    if (tn == 0)
        return NULL;
    json_error_t jerr;
    json_t *j = lily_json_loadb(t, tn, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr); /* lily serve's loader */
    if (!j)
        return NULL;
    /* an integer literal that loads as a real is one past int64 (a uint64 id): an integer, its digits kept */
    bool big_integer = json_is_real(j);
    for (size_t i = 0; i < tn && big_integer; i++)
        big_integer = (t[i] >= '0' && t[i] <= '9') || (i == 0 && t[i] == '-');
    bool integral_real = json_is_real(j) && fabs(json_real_value(j)) < 9e15 &&
                         json_real_value(j) == floor(json_real_value(j)); /* "3.0" for an integer */
    bool fits = ((json_is_integer(j) || big_integer) && (allowed & (ALLOW_INTEGER | ALLOW_NUMBER))) ||
                (json_is_real(j) && (allowed & ALLOW_NUMBER)) || (integral_real && (allowed & ALLOW_INTEGER)) ||
                (json_is_object(j) && (allowed & ALLOW_OBJECT)) || (json_is_array(j) && (allowed & ALLOW_ARRAY));
    json_decref(j);
    return fits ? t : NULL;
}

static void end_param(lily_output_parser *p)
{
    if (p->value_kind == VALUE_STRING) {
        arguments_fragment(p, "\"", 1);
        return;
    }
    const char *s = p->value.data ? p->value.data : "";
    size_t n = p->value.len;
    if (n && s[n - 1] == '\n')
        n--;
    size_t jn;
    const char *j = json_value_text(p->value_allowed, s, n, &jn);
    buf_clear(&p->fragment);
    bool ok = j ? buf_append(&p->fragment, j, jn)
                : buf_append_str(&p->fragment, "\"") && append_json_escaped(&p->fragment, s, n) &&
                      buf_append_str(&p->fragment, "\"");
    if (!ok) {
        fail(p);
        return;
    }
    arguments_fragment(p, p->fragment.data, p->fragment.len);
}

/* The end of the JSON value that starts at s[i] in the valid JSON text s[n]: after a string's closing quote,
 * an object's or array's closing bracket, or a literal's last character. */
static size_t json_value_end(const char *s, size_t n, size_t i)
{
    int depth = 0;
    bool in_string = false;
    for (; i < n; i++) {
        char c = s[i];
        if (in_string) {
            if (c == '\\') {
                i++;
            } else if (c == '"') {
                in_string = false;
                if (depth == 0)
                    return i + 1;
            }
        } else if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (--depth <= 0)
                return depth < 0 ? i : i + 1; /* depth < 0: the end of a literal inside its container */
        } else if (depth == 0 && (c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r')) {
            return i;
        }
    }
    return n;
}

static size_t skip_json_space(const char *s, size_t n, size_t i)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
        i++;
    return i;
}

/* Where the value of the top-level member key of the valid JSON object text s[n] is written: the last
 * member of that name, as jansson keeps the last of duplicate keys (a key written with escapes is compared
 * decoded). Returns false when there is none. */
static bool json_member_span(const char *s, size_t n, const char *key, size_t *start, size_t *end)
{
    bool found = false;
    size_t i = skip_json_space(s, n, 0) + 1; /* past the '{' */
    for (;;) {
        i = skip_json_space(s, n, i);
        if (i >= n || s[i] != '"')
            return found;
        size_t key_start = i;
        i = json_value_end(s, n, i);
        bool same;
        if (memchr(s + key_start, '\\', i - key_start)) {
            json_t *k = json_loadb(s + key_start, i - key_start, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
            same = json_is_string(k) && !strcmp(json_string_value(k), key);
            json_decref(k);
        } else {
            same = i - key_start == strlen(key) + 2 && !memcmp(s + key_start + 1, key, strlen(key));
        }
        i = skip_json_space(s, n, i) + 1; /* past the ':' */
        i = skip_json_space(s, n, i);
        size_t value_start = i;
        i = json_value_end(s, n, i);
        if (same) {
            *start = value_start;
            *end = i;
            found = true;
        }
        i = skip_json_space(s, n, i) + 1; /* past the ',' (or the closing '}': the next key is not found) */
    }
}

/* Append the valid JSON text s[n] without its whitespace outside strings; everything else (numbers, string
 * escapes) as written. */
static bool append_json_compact(text_buf *b, const char *s, size_t n)
{
    bool in_string = false;
    size_t run = 0; /* start of the pending run of bytes to copy */
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            if (!buf_append(b, s + run, i - run))
                return false;
            run = i + 1;
        }
    }
    return buf_append(b, s + run, n - run);
}

/* A complete JSON tool call in p->value: {"name": NAME, "arguments": OBJECT or JSON string} ("parameters"
 * is accepted for "arguments"). It becomes a call like an XML one, its arguments emitted in one fragment:
 * the object's text as the model wrote it, without whitespace, so a number is never reformatted (an
 * integer past int64, which lily serve's loader reads for the check only, keeps its digits). Text that is
 * not such an object becomes content. */
static void json_call(lily_output_parser *p)
{
    const char *text = p->value.data ? p->value.data : "";
    json_t *obj = lily_json_loadb(text, p->value.len, JSON_ALLOW_NUL, NULL); /* lily serve's loader */
    json_t *name = json_object_get(obj, "name");
    const char *key = json_object_get(obj, "arguments") ? "arguments" : "parameters";
    json_t *args = json_object_get(obj, key);
    const char *args_text = NULL; /* the arguments object's JSON text */
    size_t args_start = 0, args_end = 0;
    json_t *parsed = NULL;
    if (json_is_string(args)) {
        parsed = lily_json_loadb(json_string_value(args), json_string_length(args), JSON_ALLOW_NUL, NULL);
        if (parsed) {
            args = parsed;
            args_text = json_string_value(json_object_get(obj, key));
            args_end = json_string_length(json_object_get(obj, key));
        }
    } else if (json_is_object(args) && json_member_span(text, p->value.len, key, &args_start, &args_end)) {
        args_text = text;
    }
    if (!json_is_string(name) || (args && !json_is_object(args))) {
        /* content, without think tags (content never carries them) */
        const char *at = text, *end = text + p->value.len;
        while (at < end) {
            const char *open = strstr(at, "<think>"), *close = strstr(at, "</think>");
            const char *tag = open && (!close || open < close) ? open : close;
            size_t tag_len = tag == open ? 7 : 8;
            if (!tag || tag >= end)
                tag = end, tag_len = 0;
            channel_text(p, &p->content, LILY_OUTPUT_CONTENT, at, (size_t)(tag - at));
            at = tag + tag_len;
        }
        json_decref(parsed);
        json_decref(obj);
        return;
    }
    buf_clear(&p->name);
    if (!buf_append_str(&p->name, json_string_value(name))) {
        fail(p);
    } else {
        start_call(p);
        buf_clear(&p->fragment);
        if (args_text && !append_json_compact(&p->fragment, args_text + args_start, args_end - args_start)) {
            fail(p);
        } else if (args_text && strcmp(p->fragment.data, "{}")) { /* end_call writes "{}" for no parameters */
            arguments_fragment(p, p->fragment.data, p->fragment.len - 1); /* without the closing brace */
            p->n_params = 1;
        }
        end_call(p);
    }
    json_decref(parsed);
    json_decref(obj);
}

/* ---- the state machine ---------------------------------------------------------------------------- */

/* Text between tags in the current state. Returns how many bytes were consumed: fewer than n when the
 * state changed mid-text (the rest must be rescanned with the new state's tags). */
static size_t handle_text(lily_output_parser *p, const char *s, size_t n)
{
    switch (p->state) {
    case S_REASONING:
        channel_text(p, &p->reasoning, LILY_OUTPUT_REASONING, s, n);
        return n;
    case S_CONTENT:
        channel_text(p, &p->content, LILY_OUTPUT_CONTENT, s, n);
        if (p->opts.verbatim_answer && p->n_calls == 0 && p->content.started)
            p->state = S_ANSWER; /* the answer has begun: a tag found after this text is its text (handle_tag) */
        return n;
    case S_ANSWER:
        channel_text(p, &p->content, LILY_OUTPUT_CONTENT, s, n);
        return n;
    case S_FUNCTION_NAME:
    case S_PARAM_NAME:
        if (!buf_append(&p->name, s, n))
            fail(p);
        return n;
    case S_PARAM_VALUE:
        value_text(p, s, n);
        return n;
    case S_TOOL_OPEN: {
        if (p->tool_open_text)
            return n; /* stray text inside a call's structure */
        size_t i = 0;
        while (i < n && is_space(s[i]))
            i++;
        if (i < n && s[i] == '{') { /* the first text after <tool_call> opens a JSON tool call */
            p->state = S_JSON_CALL;
            buf_clear(&p->value);
            return i;
        }
        p->tool_open_text = i < n;
        return n;
    }
    case S_JSON_CALL:
        if (!buf_append(&p->value, s, n))
            fail(p);
        return n;
    case S_FUNCTION_BODY:
        return n; /* stray text inside a call's structure */
    case S_AFTER_FUNCTION: {
        size_t i = 0;
        while (i < n && is_space(s[i]))
            i++;
        if (i < n) /* text after </function> without </tool_call>: the call block is over */
            p->state = S_CONTENT;
        return i;
    }
    }
    return n;
}

static bool name_is_blank(const text_buf *b)
{
    for (size_t i = 0; i < b->len; i++)
        if (!is_space(b->data[i]))
            return false;
    return true;
}

static void handle_tag(lily_output_parser *p, tag_id tag)
{
    switch (p->state) {
    case S_REASONING:
        if (tag == T_THINK_CLOSE)
            p->state = S_CONTENT;
        else if (tag == T_TOOL_CALL_OPEN)
            p->state = S_TOOL_OPEN;
        /* T_THINK_OPEN: a repeated opening tag, dropped */
        break;
    case S_CONTENT:
        if (tag == T_THINK_OPEN)
            p->state = S_REASONING;
        else if (tag == T_TOOL_CALL_OPEN)
            p->state = S_TOOL_OPEN;
        else if (tag == T_FUNCTION_OPEN)
            p->state = S_FUNCTION_NAME;
        /* T_THINK_CLOSE: stray, dropped */
        break;
    case S_TOOL_OPEN:
        p->state = tag == T_FUNCTION_OPEN ? S_FUNCTION_NAME : S_CONTENT;
        break;
    case S_FUNCTION_NAME:
        if (tag == T_NEWLINE && name_is_blank(&p->name))
            break; /* "<function=\nNAME>": keep reading the name */
        start_call(p);
        p->state = S_FUNCTION_BODY;
        break;
    case S_PARAM_NAME:
        if (tag == T_NEWLINE && name_is_blank(&p->name))
            break;
        start_param(p);
        p->state = S_PARAM_VALUE;
        break;
    case S_PARAM_VALUE:
        end_param(p);
        p->state = S_FUNCTION_BODY;
        if (tag == T_PARAM_CLOSE)
            break;
        /* any other tag that ended the value acts as it does in the function body */
        /* fall through */
    case S_FUNCTION_BODY:
        if (tag == T_PARAM_OPEN) {
            p->state = S_PARAM_NAME;
        } else if (tag == T_FUNCTION_CLOSE) {
            end_call(p);
            p->state = S_AFTER_FUNCTION;
        } else if (tag == T_TOOL_CALL_CLOSE) {
            end_call(p);
            p->state = S_CONTENT;
        } else if (tag == T_FUNCTION_OPEN) {
            end_call(p);
            p->state = S_FUNCTION_NAME;
        }
        break;
    case S_JSON_CALL: /* </tool_call> */
        json_call(p);
        p->state = S_CONTENT;
        break;
    case S_ANSWER: /* a tag of S_CONTENT's set right after the text that began the answer: answer text */
        channel_text(p, &p->content, LILY_OUTPUT_CONTENT, tag_text[tag], strlen(tag_text[tag]));
        break;
    case S_AFTER_FUNCTION:
        if (tag == T_TOOL_CALL_CLOSE)
            p->state = S_CONTENT;
        else if (tag == T_FUNCTION_OPEN)
            p->state = S_FUNCTION_NAME;
        else if (tag == T_TOOL_CALL_OPEN)
            p->state = S_TOOL_OPEN;
        break;
    }
    if (p->state == S_TOOL_OPEN) /* every tag handled in S_TOOL_OPEN leaves it: this is a new block */
        p->tool_open_text = false;
}

/* Process p->pending. Unless at_end, text from the first position where a tag is still a partial match
 * stays pending. */
static void process(lily_output_parser *p, bool at_end)
{
    const char *s = p->pending.data;
    const size_t len = p->pending.len;
    size_t pos = 0;
    while (pos < len && !p->failed) {
        int n_tags;
        const tag_id *tags = state_tags(p->state, &n_tags);
        size_t i = pos;
        int found = -1;
        bool partial = false;
        for (; i < len; i++) {
            const char c = s[i];
            if (c != '<' && c != '>' && c != '\n')
                continue;
            for (int t = 0; t < n_tags; t++) {
                const char *tt = tag_text[tags[t]];
                size_t tl = strlen(tt), avail = len - i;
                if (tt[0] != c)
                    continue;
                if (avail >= tl) {
                    if (!memcmp(s + i, tt, tl)) {
                        found = tags[t];
                        break;
                    }
                } else if (!at_end && !memcmp(s + i, tt, avail)) {
                    partial = true;
                    break;
                }
            }
            if (found >= 0 || partial)
                break;
        }
        size_t used = handle_text(p, s + pos, i - pos);
        if (used < i - pos) {
            pos += used; /* the state changed: rescan the rest with its tags */
            continue;
        }
        pos = i;
        if (found >= 0) {
            pos += strlen(tag_text[found]);
            handle_tag(p, (tag_id)found);
        } else if (partial) {
            break;
        }
    }
    if (p->failed)
        return;
    memmove(p->pending.data, p->pending.data + pos, len - pos);
    p->pending.len = len - pos;
    p->pending.data[p->pending.len] = '\0';
}

/* ---- public API ----------------------------------------------------------------------------------- */

lily_status lily_output_parser_new(const lily_output_parser_options *options, lily_output_parser **out,
                                   lily_error *err)
{
    *out = NULL;
    if (options->tools && !json_is_array(options->tools))
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "output parser: tools must be a JSON array");
    lily_output_parser *p = calloc(1, sizeof *p);
    if (!p)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "output parser: out of memory");
    p->opts = *options;
    p->tools = options->tools ? json_incref((json_t *)options->tools) : NULL;
    p->state = options->thinking ? S_REASONING : S_CONTENT;
    p->content.started = options->continuation; /* the content began in the prompt: its spaces are the reply's */
    if (!buf_append(&p->pending, "", 0)) {
        lily_output_parser_free(p);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "output parser: out of memory");
    }
    p->result.reasoning = "";
    p->result.content = "";
    *out = p;
    return LILY_OK;
}

static void free_result_calls(lily_output_parser *p)
{
    for (int i = 0; i < p->result.n_tool_calls; i++) {
        free(p->result.tool_calls[i].name);
        free(p->result.tool_calls[i].arguments);
    }
    free(p->result.tool_calls);
    p->result.tool_calls = NULL;
    p->result.n_tool_calls = 0;
}

void lily_output_parser_free(lily_output_parser *p)
{
    if (!p)
        return;
    json_decref(p->tools);
    free(p->pending.data);
    free(p->reasoning.text.data);
    free(p->reasoning.held_space.data);
    free(p->content.text.data);
    free(p->content.held_space.data);
    for (int i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name.data);
        free(p->calls[i].arguments.data);
    }
    free(p->calls);
    free(p->name.data);
    free(p->value.data);
    free(p->fragment.data);
    free_result_calls(p);
    free(p);
}

/* Point p->result at the current text (the tool calls are copied only at finish). */
static void refresh_result(lily_output_parser *p)
{
    p->result.reasoning = p->reasoning.text.data ? p->reasoning.text.data : "";
    p->result.reasoning_len = p->reasoning.text.len;
    p->result.content = p->content.text.data ? p->content.text.data : "";
    p->result.content_len = p->content.text.len;
}

lily_status lily_output_parser_feed(lily_output_parser *p, const char *text, size_t len, lily_error *err)
{
    if (p->failed)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "output parser: out of memory earlier");
    if (p->result.finished)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "output parser: feed after finish");
    if (!buf_append(&p->pending, text, len))
        fail(p);
    else
        process(p, false);
    refresh_result(p);
    if (p->failed)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "output parser: out of memory");
    return LILY_OK;
}

/* finish; cut: the text may end inside a word (max tokens, the context limit or a stop string cut it). */
static lily_status finish(lily_output_parser *p, bool cut_by_length, bool cut, lily_error *err)
{
    if (p->failed)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "output parser: out of memory earlier");
    if (p->result.finished)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "output parser: finish called twice");
    if (p->state == S_AFTER_FUNCTION) { /* a reply cut inside "</tool_call>": the partial tag is not content */
        const char *close = tag_text[T_TOOL_CALL_CLOSE];
        size_t i = 0;
        while (i < p->pending.len && is_space(p->pending.data[i]))
            i++;
        const size_t rest = p->pending.len - i;
        if (rest > 0 && rest < strlen(close) && !memcmp(p->pending.data + i, close, rest))
            p->pending.len = i;
    }
    process(p, true);
    p->result.call_unfinished = p->state == S_TOOL_OPEN || p->state == S_FUNCTION_NAME ||
                                p->state == S_FUNCTION_BODY || p->state == S_PARAM_NAME ||
                                p->state == S_PARAM_VALUE || p->state == S_JSON_CALL;
    /* A name the text ended in (no ">" or newline after it yet) is closed as written, except when max tokens or
     * a stop string cut it: then it may be a prefix of the real one ("get_wea" of get_weather). A call to a tool
     * that does not exist, or an argument key no schema has, would reach a client that runs calls as they come;
     * so a cut function name is no call (nothing of it was streamed: a call starts once its name ends) and a cut
     * parameter name no argument. vLLM returns such a reply's raw text as content instead; lily keeps tool-call
     * markup out of content (a client would send it back as the assistant's words). The finish reason says
     * "length" either way (a stop string's cut: "stop"). */
    const bool cut_name = cut && (p->state == S_FUNCTION_NAME || p->state == S_PARAM_NAME);
    switch (p->state) { /* close what the text left open */
    case S_FUNCTION_NAME:
        if (!name_is_blank(&p->name) && !cut_name)
            start_call(p);
        break;
    case S_PARAM_NAME:
        if (!name_is_blank(&p->name) && !cut_name) {
            start_param(p);
            end_param(p);
        }
        break;
    case S_PARAM_VALUE:
        end_param(p);
        break;
    case S_JSON_CALL:
        json_call(p);
        break;
    default:
        break;
    }
    end_call(p);
    refresh_result(p);
    if (!p->failed && p->n_calls > 0) {
        p->result.tool_calls = calloc((size_t)p->n_calls, sizeof *p->result.tool_calls);
        if (!p->result.tool_calls) {
            fail(p);
        } else {
            p->result.n_tool_calls = p->n_calls;
            for (int i = 0; i < p->n_calls; i++) {
                p->result.tool_calls[i].name = buf_take(&p->calls[i].name);
                p->result.tool_calls[i].arguments = buf_take(&p->calls[i].arguments);
                if (!p->result.tool_calls[i].name || !p->result.tool_calls[i].arguments)
                    fail(p);
            }
        }
    }
    if (p->failed)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "output parser: out of memory");
    p->result.finished = true;
    p->result.cut_by_length = cut_by_length;
    return LILY_OK;
}

lily_status lily_output_parser_finish(lily_output_parser *p, bool cut_by_length, lily_error *err)
{
    return finish(p, cut_by_length, cut_by_length, err);
}

lily_status lily_output_parser_finish_stopped(lily_output_parser *p, lily_error *err)
{
    return finish(p, false, true, err);
}

const lily_parsed_output *lily_output_parser_result(const lily_output_parser *p) { return &p->result; }

bool lily_prompt_opens_thinking(const char *prompt, size_t len)
{
    static const char open_tag[] = "<think>", close_tag[] = "</think>";
    for (size_t i = len; i-- > 0;) { /* scan back for the last tag of either kind */
        if (i + sizeof open_tag - 1 <= len && !memcmp(prompt + i, open_tag, sizeof open_tag - 1))
            return true;
        if (i + sizeof close_tag - 1 <= len && !memcmp(prompt + i, close_tag, sizeof close_tag - 1))
            return false;
    }
    return false;
}

const char *lily_output_finish_reason(const lily_parsed_output *o)
{
    if (o->cut_by_length) /* as OpenAI: max tokens cut the reply, even inside a tool call's arguments */
        return "length";
    return o->n_tool_calls > 0 ? "tool_calls" : "stop";
}

/* A JSON string of s[n] with invalid UTF-8 replaced by U+FFFD. */
static json_t *json_text(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    if (j)
        return j;
    text_buf b = {0};
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
        json_t *one = k && i + k <= n ? json_stringn(s + i, k) : NULL;
        bool ok = one ? buf_append(&b, s + i, k) : buf_append_str(&b, "\xef\xbf\xbd");
        json_decref(one);
        if (!ok) {
            free(b.data);
            return NULL;
        }
        i += one ? k : 1;
    }
    j = json_stringn(b.data ? b.data : "", b.len);
    free(b.data);
    return j;
}

json_t *lily_output_choice_json(const lily_parsed_output *o, const char *id_prefix)
{
    if (!id_prefix)
        id_prefix = "call_";
    json_t *choice = json_object(), *msg = json_object();
    if (!choice || !msg) {
        json_decref(msg); /* not yet owned by choice */
        goto oom;
    }
    /* json_object_set_new fails (-1) on a NULL value, i.e. a failed allocation, and releases the value */
    if (json_object_set_new(choice, "message", msg) || json_object_set_new(msg, "role", json_string("assistant")) ||
        json_object_set_new(msg, "content", o->content_len ? json_text(o->content, o->content_len) : json_null()) ||
        json_object_set_new(msg, "reasoning_content",
                            o->reasoning_len ? json_text(o->reasoning, o->reasoning_len) : json_null()))
        goto oom;
    if (o->n_tool_calls > 0) {
        json_t *calls = json_array();
        if (!calls || json_object_set_new(msg, "tool_calls", calls))
            goto oom;
        for (int i = 0; i < o->n_tool_calls; i++) {
            char id[128];
            snprintf(id, sizeof id, "%s%d", id_prefix, i);
            json_t *call = json_object(), *fn = json_object();
            if (!call || !fn || json_array_append_new(calls, call)) {
                json_decref(fn);
                goto oom;
            }
            if (json_object_set_new(call, "id", json_string(id)) ||
                json_object_set_new(call, "type", json_string("function"))) {
                json_decref(fn); /* not yet owned by call */
                goto oom;
            }
            if (json_object_set_new(call, "function", fn) ||
                json_object_set_new(fn, "name", json_text(o->tool_calls[i].name, strlen(o->tool_calls[i].name))) ||
                json_object_set_new(fn, "arguments",
                                    json_text(o->tool_calls[i].arguments, strlen(o->tool_calls[i].arguments))))
                goto oom;
        }
    }
    if (json_object_set_new(choice, "finish_reason", json_string(lily_output_finish_reason(o))))
        goto oom;
    return choice;
oom:
    json_decref(choice);
    return NULL;
}
