/* json_schema.c — JSON Schema -> the grammar's node graph (grammar.h, grammar_internal.h).
 *
 * Owns: reading the schema keywords grammar.h lists and rendering the literal bytes each node matches
 * (property keys with their separators, enum and const values, the Qwen tool-call tags); refusing a graph
 * the matcher could not run, and each node's min_depth (check_graph). Does not own: matching (grammar.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"

typedef enum { MODE_JSON, MODE_TOOL_VALUE } value_mode; /* MODE_TOOL_VALUE: strings raw, the rest JSON */

typedef struct {
    lily_grammar *g;
    const json_t *root;
    lily_error *err;
    lily_status st;
    int depth;
    struct {
        char *ref;
        value_mode mode;
        gnode *node;
    } refs[64];
    int n_refs;
} compiler;

static gnode *new_node(compiler *c, gnode_kind kind)
{
    if (c->st != LILY_OK)
        return NULL;
    if (c->g->n_nodes == c->g->cap_nodes) {
        int cap = c->g->cap_nodes ? 2 * c->g->cap_nodes : 32;
        gnode **p = realloc(c->g->nodes, (size_t)cap * sizeof *p);
        if (!p) {
            c->st = lily_error_set(c->err, LILY_ERR_OUT_OF_MEMORY, "grammar: out of memory");
            return NULL;
        }
        c->g->nodes = p;
        c->g->cap_nodes = cap;
    }
    gnode *n = calloc(1, sizeof *n);
    if (!n) {
        c->st = lily_error_set(c->err, LILY_ERR_OUT_OF_MEMORY, "grammar: out of memory");
        return NULL;
    }
    n->kind = kind;
    n->max = -1;
    n->id = c->g->n_nodes;
    c->g->nodes[c->g->n_nodes++] = n;
    return n;
}

static void *oom(compiler *c)
{
    if (c->st == LILY_OK)
        c->st = lily_error_set(c->err, LILY_ERR_OUT_OF_MEMORY, "grammar: out of memory");
    return NULL;
}

static void *bad(compiler *c, const char *what, const char *detail)
{
    if (c->st == LILY_OK)
        c->st = lily_error_set(c->err, LILY_ERR_INVALID_ARGUMENT, "schema: %s%s%s", what, detail ? ": " : "",
                               detail ? detail : "");
    return NULL;
}

/* Add a literal (copied) to n's strs. */
static bool add_str(compiler *c, gnode *n, const char *s, size_t len)
{
    char **strs = realloc(n->strs, (size_t)(n->n + 1) * sizeof *strs);
    size_t *lens = strs ? realloc(n->lens, (size_t)(n->n + 1) * sizeof *lens) : NULL;
    if (strs)
        n->strs = strs;
    if (lens)
        n->lens = lens;
    char *copy = lens ? malloc(len + 1) : NULL;
    if (!copy)
        return oom(c), false;
    memcpy(copy, s, len);
    copy[len] = 0;
    n->strs[n->n] = copy;
    n->lens[n->n++] = len;
    return true;
}

static bool add_kid(compiler *c, gnode *n, gnode *kid)
{
    if (!kid)
        return false;
    gnode **kids = realloc(n->kids, (size_t)(n->n_kids + 1) * sizeof *kids);
    if (!kids)
        return oom(c), false;
    n->kids = kids;
    n->kids[n->n_kids++] = kid;
    return true;
}

static gnode *literal(compiler *c, const char *s)
{
    gnode *n = new_node(c, G_LITSET);
    if (n && !add_str(c, n, s, strlen(s)))
        return NULL;
    return n;
}

/* A JSON value's compact text (malloc'd), or NULL. */
static char *dump_value(const json_t *v) { return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY); }

/* A literal value (const / enum entry) as the bytes the syntax writes: strings raw in a tool parameter. */
static bool add_value_literal(compiler *c, gnode *n, const json_t *v, value_mode mode)
{
    if (mode == MODE_TOOL_VALUE && json_is_string(v)) {
        const char *s = json_string_value(v);
        if (strchr(s, '<') || strchr(s, '\n'))
            return bad(c, "a string enum value with '<' or a newline cannot be a tool parameter", s), false;
        return add_str(c, n, s, json_string_length(v));
    }
    char *text = dump_value(v);
    if (!text)
        return oom(c), false;
    bool ok = add_str(c, n, text, strlen(text));
    free(text);
    return ok;
}

static gnode *compile(compiler *c, const json_t *s, value_mode mode);

/* The free JSON value (json_object mode, untyped schemas, additionalProperties). */
static gnode *any_value(compiler *c)
{
    if (c->g->any)
        return c->g->any;
    gnode *any = new_node(c, G_ALT);
    c->g->any = any;
    gnode *obj = new_node(c, G_FREE_OBJECT), *arr = new_node(c, G_ARRAY), *str = new_node(c, G_STRING),
          *num = new_node(c, G_NUMBER), *lits = new_node(c, G_LITSET);
    if (!any || !obj || !arr || !str || !num || !lits)
        return NULL;
    arr->min = 0;
    add_kid(c, arr, any);
    add_kid(c, obj, str); /* kids[0]: the key, kids[1]: the value */
    add_kid(c, obj, any);
    add_str(c, lits, "true", 4);
    add_str(c, lits, "false", 5);
    add_str(c, lits, "null", 4);
    add_kid(c, any, obj);
    add_kid(c, any, arr);
    add_kid(c, any, str);
    add_kid(c, any, num);
    add_kid(c, any, lits);
    return c->st == LILY_OK ? any : NULL;
}

static int int_field(const json_t *s, const char *key, int dflt)
{
    json_t *v = json_object_get(s, key);
    if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < (1 << 30))
        return (int)json_integer_value(v);
    return dflt;
}

/* String formats as fixed templates, one class per character (grammar.c's pattern_allows): 'd' a digit,
 * 'h' a hex digit, 'Y' 1-9, 'M' + 'm' a month 01-12, 'D' + 'e' a day 01-31, 'H' + 'u' an hour 00-23, 'S' 0-5;
 * anything else itself. RFC 3339 full-date / partial-time with "Z"; a day past the month's end (02-30) is
 * not excluded. */
static const char *format_pattern(const char *format)
{
    static const struct {
        const char *name, *pattern;
    } formats[] = {
        {"date", "Yddd-Mm-De"},
        {"time", "Hu:Sd:SdZ"},
        {"date-time", "Yddd-Mm-DeTHu:Sd:SdZ"},
        {"uuid", "hhhhhhhh-hhhh-hhhh-hhhh-hhhhhhhhhhhh"},
    };
    for (size_t i = 0; format && i < sizeof formats / sizeof formats[0]; i++)
        if (!strcmp(format, formats[i].name))
            return formats[i].pattern;
    return NULL;
}

static gnode *compile_string(compiler *c, const json_t *s, value_mode mode)
{
    gnode *n = new_node(c, mode == MODE_TOOL_VALUE ? G_RAW : G_STRING);
    if (!n)
        return NULL;
    n->min = int_field(s, "minLength", 0);
    n->max = int_field(s, "maxLength", -1);
    n->pattern = format_pattern(json_string_value(json_object_get(s, "format")));
    if (n->pattern)
        n->min = n->max = (int)strlen(n->pattern);
    if (n->max >= 0 && n->max < n->min)
        return bad(c, "maxLength is below minLength", NULL);
    return n;
}

static gnode *compile_listed_object(compiler *c, const json_t *s, const json_t *props, bool tool_root);

/* An object. Listed properties (and required names not among them, which take additionalProperties'
 * schema) in the schema's order: compile_listed_object. Without any: a free object of minProperties to
 * maxProperties keys whose values follow additionalProperties (a schema, or any value when absent / true:
 * pydantic's dict[str, X]), or only {} when it is false. */
static gnode *compile_object(compiler *c, const json_t *s, bool tool_root)
{
    json_t *props = json_object_get(s, "properties");
    json_t *extra = json_object_get(s, "additionalProperties");
    const bool closed = json_is_false(extra);
    json_t *listed = json_object(); /* properties, then the required names they lack */
    if (!listed)
        return oom(c);
    if (json_is_object(props) && json_object_update(listed, props)) {
        json_decref(listed);
        return oom(c);
    }
    size_t k;
    json_t *r;
    json_array_foreach(json_object_get(s, "required"), k, r) {
        if (!json_is_string(r) || json_object_get(listed, json_string_value(r)))
            continue;
        if (closed) {
            json_decref(listed);
            return bad(c, "a required property is not in properties and additionalProperties is false",
                       json_string_value(r));
        }
        if (json_object_set(listed, json_string_value(r), json_is_object(extra) ? extra : json_true())) {
            json_decref(listed);
            return oom(c);
        }
    }
    gnode *n = NULL;
    if (tool_root || json_object_size(listed) > 0) {
        n = compile_listed_object(c, s, listed, tool_root);
    } else if (closed) {
        if (int_field(s, "minProperties", 0) > 0)
            n = bad(c, "minProperties asks for properties, and additionalProperties is false with none listed", NULL);
        else
            n = literal(c, "{}");
    } else {
        n = new_node(c, G_FREE_OBJECT);
        gnode *key = new_node(c, G_STRING);
        gnode *value = json_is_object(extra) ? compile(c, extra, MODE_JSON) : any_value(c);
        if (n && key && value) {
            add_kid(c, n, key);
            add_kid(c, n, value);
            n->min = int_field(s, "minProperties", 0);
            n->max = int_field(s, "maxProperties", -1);
            if (n->max >= 0 && n->max < n->min)
                bad(c, "maxProperties is below minProperties", NULL);
        }
    }
    json_decref(listed);
    return c->st == LILY_OK ? n : NULL;
}

/* props's properties in order (each required when s's required lists it). In a tool call (root) the keys
 * are the parameter tags. */
static gnode *compile_listed_object(compiler *c, const json_t *s, const json_t *props, bool tool_root)
{
    gnode *n = new_node(c, G_OBJECT);
    if (!n)
        return NULL;
    n->tool = tool_root;
    const char *key;
    json_t *sub;
    int n_props = 0;
    json_object_foreach((json_t *)props, key, sub) n_props++;
    n->required = calloc((size_t)n_props + 1, sizeof *n->required);
    n->next_required = calloc((size_t)n_props + 1, sizeof *n->next_required);
    n->keys_next = calloc((size_t)n_props + 1, sizeof *n->keys_next);
    n->lens_next = calloc((size_t)n_props + 1, sizeof *n->lens_next);
    json_t *required = json_object(); /* the required names as a set: wide objects stay linear */
    size_t k;
    json_t *r;
    json_array_foreach(json_object_get(s, "required"), k, r) {
        if (required && json_is_string(r) && json_object_set(required, json_string_value(r), json_null()))
            json_decref(required), required = NULL;
    }
    if (!n->required || !n->next_required || !n->keys_next || !n->lens_next || !required) {
        json_decref(required);
        return oom(c);
    }
    n->n_props = n_props; /* keys_next[0..n_props] are freed with the node, also when compiling stops midway */
    int i = 0;
    json_object_foreach((json_t *)props, key, sub) {
        json_t *tmp = json_string(key);
        char *name = tmp ? dump_value(tmp) : NULL; /* quoted, escaped */
        json_decref(tmp);
        if (!name) {
            json_decref(required);
            return oom(c);
        }
        if (tool_root && (strchr(key, '>') || strchr(key, '\n'))) {
            free(name);
            json_decref(required);
            return bad(c, "a parameter name with '>' or a newline cannot be written in a tool call", key);
        }
        size_t cap = strlen(name) + strlen(key) + 32;
        char *first = malloc(cap), *next = malloc(cap);
        if (!first || !next) {
            free(name), free(first), free(next);
            json_decref(required);
            return oom(c);
        }
        if (tool_root) {
            snprintf(first, cap, "<parameter=%s>\n", key);
            snprintf(next, cap, "<parameter=%s>\n", key);
        } else {
            snprintf(first, cap, "%s:", name);
            snprintf(next, cap, ",%s:", name);
        }
        free(name);
        bool ok = add_str(c, n, first, strlen(first));
        n->keys_next[i] = next;
        n->lens_next[i] = strlen(next);
        free(first);
        n->required[i] = json_object_get(required, key) != NULL;
        if (!ok || !add_kid(c, n, compile(c, sub, tool_root ? MODE_TOOL_VALUE : MODE_JSON))) {
            json_decref(required);
            return NULL;
        }
        i++;
    }
    json_decref(required);
    n->next_required[n_props] = n_props;
    for (int p = n_props - 1; p >= 0; p--)
        n->next_required[p] = n->required[p] ? p : n->next_required[p + 1];
    /* the closing literal is candidate n_props */
    const char *close = tool_root ? "</function>\n</tool_call>" : "}";
    if (!add_str(c, n, close, strlen(close)))
        return NULL;
    n->keys_next[n_props] = strdup(close);
    n->lens_next[n_props] = strlen(close);
    if (!n->keys_next[n_props])
        return oom(c);
    if (tool_root && !(n->sep = literal(c, "\n</parameter>\n")))
        return NULL;
    return n;
}

typedef enum { BOUND_NONE, BOUND_SET, BOUND_EMPTY } bound_kind; /* EMPTY: no int64 is on the bounded side */

/* An integer bound from keyword value v: the least integer >= v (lower; past v when exclusive), or the
 * greatest <= v (upper). A bound beyond int64 constrains nothing on the open side and excludes all on the
 * other. */
static bound_kind integer_bound(const json_t *v, bool lower, bool exclusive, int64_t *out)
{
    if (json_is_integer(v)) {
        const json_int_t x = json_integer_value(v);
        if (!exclusive) {
            *out = x;
            return BOUND_SET;
        }
        if (lower ? x == INT64_MAX : x == INT64_MIN)
            return BOUND_EMPTY;
        *out = lower ? x + 1 : x - 1;
        return BOUND_SET;
    }
    const double x = json_real_value(v);
    const double b = lower ? (exclusive ? floor(x) + 1 : ceil(x)) : (exclusive ? ceil(x) - 1 : floor(x));
    if (b >= 9223372036854775808.0) /* 2^63 */
        return lower ? BOUND_EMPTY : BOUND_NONE;
    if (b < -9223372036854775808.0)
        return lower ? BOUND_NONE : BOUND_EMPTY;
    *out = (int64_t)b;
    return BOUND_SET;
}

/* A bound keyword's value and whether it is exclusive. */
typedef struct {
    const json_t *v;
    bool exclusive;
} bound_key;

/* The two bound keywords of one side of s into keys (lower: minimum / exclusiveMinimum, else maximum /
 * exclusiveMaximum): the inclusive one (exclusive when draft 4's boolean exclusive keyword is true), then the
 * numeric exclusive one; v NULL where absent. False (c->st set) on a malformed one: not a number, or for the
 * exclusive keyword not a number or a boolean. */
static bool bound_keywords(compiler *c, const json_t *s, bool lower, bound_key keys[2])
{
    const char *inclusive_key = lower ? "minimum" : "maximum";
    const char *exclusive_key = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    const json_t *inc = json_object_get(s, inclusive_key), *exc = json_object_get(s, exclusive_key);
    if (inc && !json_is_number(inc))
        return bad(c, "must be a number", inclusive_key), false;
    if (exc && !json_is_number(exc) && !json_is_boolean(exc))
        return bad(c, "must be a number (or a boolean, as in draft 4)", exclusive_key), false;
    keys[0] = (bound_key){inc, json_is_true(exc)};
    keys[1] = (bound_key){json_is_number(exc) ? exc : NULL, true};
    return true;
}

/* One side of an integer's range (bound_keywords' side): the tighter of its two keywords. False (c->st set)
 * on a malformed keyword. */
static bool integer_side(compiler *c, const json_t *s, bool lower, bound_kind *kind, int64_t *out)
{
    bound_key keys[2];
    if (!bound_keywords(c, s, lower, keys))
        return false;
    *kind = BOUND_NONE;
    for (int i = 0; i < 2; i++) {
        int64_t b = 0;
        const bound_kind k = keys[i].v ? integer_bound(keys[i].v, lower, keys[i].exclusive, &b) : BOUND_NONE;
        if (k == BOUND_EMPTY || *kind == BOUND_EMPTY)
            *kind = BOUND_EMPTY;
        else if (k == BOUND_SET && (*kind == BOUND_NONE || (lower ? b > *out : b < *out))) {
            *kind = BOUND_SET;
            *out = b;
        }
    }
    return true;
}

/* One side of a number's range (bound_keywords' side): the tighter of its two keywords as a double and
 * whether it is exclusive. A bound of magnitude 10^20 or more on its open side constrains nothing. False
 * (c->st set) on a malformed keyword. */
static bool number_side(compiler *c, const json_t *s, bool lower, bool *has, double *out, bool *exclusive)
{
    bound_key keys[2];
    if (!bound_keywords(c, s, lower, keys))
        return false;
    *has = false;
    *exclusive = false;
    for (int i = 0; i < 2; i++) {
        if (!keys[i].v)
            continue;
        const double x = json_number_value(keys[i].v);
        if (lower ? x <= -1e20 : x >= 1e20)
            continue;
        const bool tighter = !*has || (lower ? x > *out : x < *out) || (x == *out && keys[i].exclusive);
        if (tighter) {
            *has = true;
            *out = x;
            *exclusive = keys[i].exclusive;
        }
    }
    return true;
}

/* A number: its range when the schema bounds it (n->range, int_range.h; then no exponent). */
static gnode *compile_number(compiler *c, const json_t *s)
{
    gnode *n = new_node(c, G_NUMBER);
    if (!n)
        return NULL;
    bool has_lo, has_hi, lo_exclusive, hi_exclusive;
    double lo = 0, hi = 0;
    if (!number_side(c, s, true, &has_lo, &lo, &lo_exclusive) || !number_side(c, s, false, &has_hi, &hi, &hi_exclusive))
        return NULL;
    if (!has_lo && !has_hi)
        return n;
    if (!(n->range = malloc(sizeof *n->range)))
        return oom(c);
    if (!lily_number_range_init(n->range, has_lo, lo, lo_exclusive, has_hi, hi, hi_exclusive, NUMBER_MAX_DIGITS))
        return bad(c, "no number lies between minimum / exclusiveMinimum and maximum / exclusiveMaximum "
                      "(lily's bounds are below 1e20 in magnitude, its numbers have at most 16 fraction digits)",
                   NULL);
    return n;
}

/* An integer: its range when the schema bounds it (n->range, int_range.h). */
static gnode *compile_integer(compiler *c, const json_t *s)
{
    gnode *n = new_node(c, G_NUMBER);
    if (!n)
        return NULL;
    n->integer = true;
    bound_kind lo_kind, hi_kind;
    int64_t lo = 0, hi = 0;
    if (!integer_side(c, s, true, &lo_kind, &lo) || !integer_side(c, s, false, &hi_kind, &hi))
        return NULL;
    if (lo_kind == BOUND_NONE && hi_kind == BOUND_NONE)
        return n;
    if (!(n->range = malloc(sizeof *n->range)))
        return oom(c);
    if (lo_kind == BOUND_EMPTY || hi_kind == BOUND_EMPTY ||
        !lily_int_range_init(n->range, lo_kind == BOUND_SET, lo, hi_kind == BOUND_SET, hi, NUMBER_MAX_DIGITS))
        return bad(c, "no integer lies between minimum / exclusiveMinimum and maximum / exclusiveMaximum "
                      "(lily's bounds are 64-bit integers)", NULL);
    return n;
}

static gnode *compile_type(compiler *c, const char *type, const json_t *s, value_mode mode)
{
    if (!strcmp(type, "string"))
        return compile_string(c, s, mode);
    if (!strcmp(type, "integer"))
        return compile_integer(c, s);
    if (!strcmp(type, "number"))
        return compile_number(c, s);
    if (!strcmp(type, "boolean")) {
        gnode *n = new_node(c, G_LITSET);
        if (n && add_str(c, n, "true", 4) && add_str(c, n, "false", 5))
            return n;
        return NULL;
    }
    if (!strcmp(type, "null"))
        return literal(c, "null");
    if (!strcmp(type, "object"))
        return compile_object(c, s, false);
    if (!strcmp(type, "array")) {
        gnode *n = new_node(c, G_ARRAY);
        if (!n)
            return NULL;
        n->min = int_field(s, "minItems", 0);
        n->max = int_field(s, "maxItems", -1);
        if (n->max >= 0 && n->max < n->min)
            return bad(c, "maxItems is below minItems", NULL);
        /* positional items: prefixItems (pydantic's tuple[int, str]), or an items array (before 2020-12) with
         * additionalItems for the rest */
        json_t *items = json_object_get(s, "items"), *rest = items;
        json_t *prefix = json_object_get(s, "prefixItems");
        if (!json_is_array(prefix) && json_is_array(items)) {
            prefix = items;
            rest = json_object_get(s, "additionalItems");
        }
        size_t i;
        json_t *e;
        json_array_foreach(prefix, i, e) {
            if (!add_kid(c, n, compile(c, e, MODE_JSON)))
                return NULL;
            n->n_prefix++;
        }
        if (json_is_false(rest)) { /* no item past the positional ones */
            if (n->min > n->n_prefix)
                return bad(c, "minItems asks for more items than prefixItems has, and items is false", NULL);
            n->max = n->max < 0 || n->max > n->n_prefix ? n->n_prefix : n->max;
        } else {
            add_kid(c, n, json_is_object(rest) ? compile(c, rest, MODE_JSON) : any_value(c));
        }
        return c->st == LILY_OK ? n : NULL;
    }
    return bad(c, "unsupported type", type);
}

static gnode *compile_ref(compiler *c, const char *ref, value_mode mode)
{
    for (int i = 0; i < c->n_refs; i++)
        if (c->refs[i].mode == mode && !strcmp(c->refs[i].ref, ref))
            return c->refs[i].node;
    const json_t *target = NULL;
    static const char *const sections[] = {"$defs", "definitions"};
    for (int i = 0; i < 2 && !target; i++) {
        size_t sl = strlen(sections[i]);
        if (!strncmp(ref, "#/", 2) && !strncmp(ref + 2, sections[i], sl) && ref[2 + sl] == '/')
            target = json_object_get(json_object_get(c->root, sections[i]), ref + 3 + sl);
    }
    if (!strcmp(ref, "#"))
        target = c->root;
    if (!target)
        return bad(c, "$ref does not resolve (only #, #/$defs/NAME and #/definitions/NAME)", ref);
    if (c->n_refs == 64)
        return bad(c, "too many $ref targets", ref);
    gnode *n = new_node(c, G_REF); /* resolved below; recursion reaches it through the table */
    char *copy = strdup(ref);
    if (!n || !copy) {
        free(copy);
        return oom(c);
    }
    c->refs[c->n_refs].ref = copy;
    c->refs[c->n_refs].mode = mode;
    c->refs[c->n_refs++].node = n;
    n->target = compile(c, target, mode);
    return n->target ? n : NULL;
}

static gnode *compile(compiler *c, const json_t *s, value_mode mode)
{
    if (c->st != LILY_OK)
        return NULL;
    if (!s || json_is_true(s))
        return any_value(c);
    if (!json_is_object(s))
        return bad(c, "expected a schema object", NULL);
    if (++c->depth > 64)
        return bad(c, "nested too deeply", NULL);
    gnode *n = NULL;
    json_t *v;
    if (json_is_string(v = json_object_get(s, "$ref"))) {
        n = compile_ref(c, json_string_value(v), mode);
    } else if ((v = json_object_get(s, "const"))) {
        n = new_node(c, G_LITSET);
        if (n && !add_value_literal(c, n, v, mode))
            n = NULL;
    } else if ((v = json_object_get(s, "enum"))) {
        if (!json_is_array(v) || !json_array_size(v))
            return bad(c, "enum must be a non-empty array", NULL);
        n = new_node(c, G_LITSET);
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) if (n && !add_value_literal(c, n, e, mode)) n = NULL;
    } else if (json_is_array(v = json_object_get(s, "anyOf")) || json_is_array(v = json_object_get(s, "oneOf"))) {
        n = new_node(c, G_ALT);
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) if (n && !add_kid(c, n, compile(c, e, mode))) n = NULL;
        if (n && !n->n_kids)
            n = bad(c, "anyOf must not be empty", NULL);
    } else if (json_is_array(v = json_object_get(s, "allOf"))) {
        if (json_array_size(v) != 1)
            return bad(c, "allOf is supported with one schema only", NULL);
        n = compile(c, json_array_get(v, 0), mode);
    } else if (json_is_array(v = json_object_get(s, "type"))) {
        n = new_node(c, G_ALT);
        size_t i;
        json_t *e;
        if (!json_array_size(v))
            return bad(c, "type must be a non-empty array", NULL);
        json_array_foreach(v, i, e) {
            if (!json_is_string(e))
                return bad(c, "type entries must be strings", NULL);
            if (n && !add_kid(c, n, compile_type(c, json_string_value(e), s, mode)))
                n = NULL;
        }
    } else if (json_is_string(v = json_object_get(s, "type"))) {
        n = compile_type(c, json_string_value(v), s, mode);
    } else if (json_object_get(s, "properties")) {
        n = compile_object(c, s, false);
    } else if (json_object_get(s, "items")) {
        n = compile_type(c, "array", s, mode);
    } else {
        n = any_value(c);
    }
    c->depth--;
    return c->st == LILY_OK ? n : NULL;
}

/* True when n, a $ref or an alternative, reaches itself again through $ref targets and alternatives alone
 * (no byte matched in between: {"$ref": "#"}, {"anyOf": [{"$ref": "#"}, ...]}), which no matcher could
 * expand. state[id]: 0 not visited, 1 on the current path, 2 done. */
static bool left_recursive(const gnode *n, unsigned char *state)
{
    if (!n || (n->kind != G_REF && n->kind != G_ALT) || state[n->id] == 2)
        return false;
    if (state[n->id] == 1)
        return true;
    state[n->id] = 1;
    if (n->kind == G_REF && left_recursive(n->target, state))
        return true;
    for (int k = 0; n->kind == G_ALT && k < n->n_kids; k++)
        if (left_recursive(n->kids[k], state))
            return true;
    state[n->id] = 2;
    return false;
}

/* The frames n's cheapest complete value needs (grammar_internal.h), from its kids' current bounds. */
static int min_depth_now(const gnode *n)
{
    int d = G_ENDLESS;
    switch (n->kind) {
    case G_ALT: /* the alternative's frame is replaced by the branch's */
        for (int k = 0; k < n->n_kids; k++)
            d = n->kids[k]->min_depth < d ? n->kids[k]->min_depth : d;
        return d;
    case G_REF: return n->target ? n->target->min_depth : G_ENDLESS;
    case G_ARRAY: /* an item sits on the array's frame; the first min items must each finish */
        d = 1;
        for (int i = 0; i < n->min; i++) {
            const gnode *item = i < n->n_prefix ? n->kids[i] : n->n_kids > n->n_prefix ? n->kids[n->n_prefix] : NULL;
            if (!item || item->min_depth >= G_ENDLESS)
                return G_ENDLESS;
            d = 1 + item->min_depth > d ? 1 + item->min_depth : d;
            if (i >= n->n_prefix)
                break; /* the rest are the same item */
        }
        return d;
    case G_OBJECT: /* a value sits on its object's frame (and a tool call's separator frame) */
        d = 1;
        for (int i = 0; i < n->n_props; i++) {
            if (!n->required[i])
                continue;
            if (n->kids[i]->min_depth >= G_ENDLESS)
                return G_ENDLESS;
            const int need = 1 + (n->sep ? 1 : 0) + n->kids[i]->min_depth;
            d = need > d ? need : d;
        }
        return d;
    case G_LITSET: return n->n > 0 ? 1 : G_ENDLESS;
    case G_FREE_OBJECT: /* a value sits on the object's frame */
        if (n->min == 0)
            return 1;
        return n->n_kids > 1 && n->kids[1]->min_depth < G_ENDLESS ? 1 + n->kids[1]->min_depth : G_ENDLESS;
    default: return 1;
    }
}

/* Refuses graphs the matcher cannot run: left recursion; a root that no finite text matches (a required
 * property or minItems that recurses without end); a root whose every value nests deeper than the
 * matcher's stack. Sets every node's min_depth (the least fixed point, from G_ENDLESS down), so the
 * matcher never enters a branch it could not finish. */
static void check_graph(compiler *c)
{
    lily_grammar *g = c->g;
    unsigned char *state = calloc((size_t)g->n_nodes + 1, 1);
    if (!state) {
        oom(c);
        return;
    }
    for (int i = 0; i < g->n_nodes && c->st == LILY_OK; i++)
        if (left_recursive(g->nodes[i], state))
            bad(c, "a $ref reaches itself through $ref / anyOf / allOf alone, with no value in between", NULL);
    free(state);
    for (int i = 0; i < g->n_nodes; i++)
        g->nodes[i]->min_depth = G_ENDLESS;
    for (bool changed = true; changed && c->st == LILY_OK;) {
        changed = false;
        for (int i = 0; i < g->n_nodes; i++) {
            const int d = min_depth_now(g->nodes[i]);
            if (d < g->nodes[i]->min_depth) {
                g->nodes[i]->min_depth = d;
                changed = true;
            }
        }
    }
    if (c->st == LILY_OK && g->root->min_depth >= G_ENDLESS)
        bad(c, "no finite JSON value matches it (a required property or minItems recurses without end)", NULL);
    else if (c->st == LILY_OK && g->root->min_depth > LILY_GRAMMAR_MAX_DEPTH) {
        char detail[96];
        snprintf(detail, sizeof detail, "its shallowest value nests %d levels, lily's grammar holds %d",
                 g->root->min_depth, LILY_GRAMMAR_MAX_DEPTH);
        bad(c, "nested too deeply", detail);
    }
}

lily_status lily_grammar_compile(const json_t *schema, lily_grammar_syntax syntax, lily_grammar **out,
                                 lily_error *err)
{
    *out = NULL;
    lily_grammar *g = calloc(1, sizeof *g);
    if (!g)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "grammar: out of memory");
    compiler c = {.g = g, .root = schema, .err = err, .st = LILY_OK};
    g->syntax = syntax;
    if (syntax == LILY_GRAMMAR_QWEN_TOOL) {
        const json_t *s = schema;
        json_t *type = json_object_get(s, "type");
        if (s && (!json_is_object(s) || (type && !(json_is_string(type) && !strcmp(json_string_value(type), "object")))))
            bad(&c, "a tool's parameters must be an object schema", NULL);
        else
            g->root = compile_object(&c, s, true);
    } else if (!schema) {
        g->root = compile_object(&c, NULL, false); /* json_object: any object */
    } else {
        g->root = compile(&c, schema, MODE_JSON);
    }
    if (c.st == LILY_OK && !g->root)
        c.st = lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "schema: cannot be compiled");
    if (c.st == LILY_OK && syntax == LILY_GRAMMAR_JSON && !(g->lead = new_node(&c, G_WS)))
        c.st = c.st != LILY_OK ? c.st : lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "grammar: out of memory");
    if (g->lead)
        g->lead->max = 2;
    if (c.st == LILY_OK)
        check_graph(&c);
    for (int i = 0; i < c.n_refs; i++)
        free(c.refs[i].ref);
    if (c.st != LILY_OK) {
        lily_grammar_free(g);
        return c.st;
    }
    *out = g;
    return LILY_OK;
}

void lily_grammar_free(lily_grammar *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->n_nodes; i++) {
        gnode *n = g->nodes[i];
        for (int k = 0; k < n->n; k++)
            free(n->strs[k]);
        for (int k = 0; n->keys_next && k <= n->n_props; k++)
            free(n->keys_next[k]);
        free(n->strs);
        free(n->lens);
        free(n->kids);
        free(n->required);
        free(n->next_required);
        free(n->keys_next);
        free(n->lens_next);
        free(n->range);
        free(n);
    }
    free(g->nodes);
    free(g);
}
