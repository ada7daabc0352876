/* grammar.c — matching bytes against a compiled grammar, and the vocabulary mask (grammar.h).
 *
 * The state is a set of parse stacks. A stack's frames each hold a node and its progress; the top frame
 * takes the next byte. A node that is complete and may still grow (a number, a raw parameter value, an
 * enum entry that prefixes a longer one, leading whitespace) hands a byte it cannot take to the frame
 * below it; an alternative (anyOf, the free JSON value) replaces itself by one stack per branch and each
 * takes the byte. Stacks that reject the byte are dropped, equal stacks merged.
 * The trie is built from the tokens sorted by their bytes (an MSD radix sort): each token shares its path
 * with the previous one up to their common prefix, and its new nodes are appended as the last children of
 * their parents, so the build is linear in the vocabulary's bytes and the nodes come out in depth-first
 * order (the reference build inserts each token on its own, scanning each node's children for its byte).
 * The mask walks a trie of the vocabulary depth first, stepping a copy of the state per trie edge and
 * pruning a subtree at the first rejected byte: inside a free string nearly the whole trie is visited,
 * inside structure only a few branches.
 */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"

typedef struct {
    const gnode *n;
    int32_t stage;
    int32_t pos;     /* bytes of the current literal candidate matched; a bounded number's integer digits */
    int32_t cur;     /* the literal candidate being matched (-1: none yet); a bounded number's sign (1: -) */
    int32_t count;   /* characters, items, digits, next property */
    int32_t aux;     /* UTF-8 continuation bytes expected, hex digits of a \u escape; a bound's comparison */
    int32_t first;   /* object: no property written yet */
    int32_t last;    /* string: the last character taken (a format's next position may depend on it); a bound's
                        comparison */
    int32_t level;   /* the frame's index in its stack */
} frame;

typedef struct {
    int depth;
    frame f[LILY_GRAMMAR_MAX_DEPTH];
} stack;

typedef struct {
    int n;
    stack s[LILY_GRAMMAR_MAX_FORKS];
} stack_set;

struct lily_grammar_matcher {
    const lily_grammar *g;
    stack_set cur, next;
    stack_set *levels;    /* the mask walk's state per trie depth */
    int n_levels;
};

static void copy_stack(stack *dst, const stack *src)
{
    dst->depth = src->depth;
    memcpy(dst->f, src->f, (size_t)src->depth * sizeof *src->f);
}

static void emit(stack_set *out, const stack *s)
{
    for (int i = 0; i < out->n; i++)
        if (out->s[i].depth == s->depth && !memcmp(out->s[i].f, s->f, (size_t)s->depth * sizeof *s->f))
            return;
    if (out->n < LILY_GRAMMAR_MAX_FORKS)
        copy_stack(&out->s[out->n++], s);
}

static bool push(stack *s, const gnode *n)
{
    while (n && n->kind == G_REF)
        n = n->target;
    if (!n || s->depth + n->min_depth > LILY_GRAMMAR_MAX_DEPTH) /* no room to finish it (or no finite value) */
        return false;
    frame *f = &s->f[s->depth];
    memset(f, 0, sizeof *f);
    f->level = s->depth++;
    f->n = n;
    f->cur = -1;
    f->first = 1;
    if (n->kind == G_OBJECT && n->tool)
        f->stage = 1; /* no opening brace */
    return true;
}

/* Literal candidate i of a frame (NULL when not allowed here). */
static const char *candidate(const frame *f, int i, size_t *len)
{
    const gnode *n = f->n;
    if (n->kind == G_LITSET) {
        if (i < 0 || i >= n->n)
            return NULL;
        *len = n->lens[i];
        return n->strs[i];
    }
    /* object: properties from f->count on, skipping only optional ones; n_props is the close; a property
     * whose value could never be finished is not offered */
    if (i < f->count || i > n->next_required[f->count] ||
        (i < n->n_props && f->level + 1 + (n->sep ? 1 : 0) + n->kids[i]->min_depth > LILY_GRAMMAR_MAX_DEPTH))
        return NULL;
    if (f->first || i == n->n_props) {
        *len = n->lens[i];
        return n->strs[i];
    }
    *len = n->lens_next[i];
    return n->keys_next[i];
}

/* The candidates a frame may take lie in [first, end): an object's run from the next property to the first
 * required one (or the close), so a byte costs the allowed candidates, not all of them. */
static int first_candidate(const frame *f) { return f->n->kind == G_LITSET ? 0 : f->count; }
static int end_candidate(const frame *f)
{
    return f->n->kind == G_LITSET ? f->n->n : f->n->next_required[f->count] + 1;
}

typedef enum { LIT_FAIL, LIT_MORE, LIT_DONE, LIT_PASS } lit_result;

/* One byte of a literal choice. LIT_DONE: a candidate is complete and nothing longer shares its prefix;
 * LIT_PASS: complete already and b does not extend it (the byte belongs to the frame below). */
static lit_result literal_step(frame *f, unsigned char b)
{
    size_t len = 0, clen = 0;
    const char *cs = f->cur >= 0 ? candidate(f, f->cur, &clen) : NULL;
    if (!(cs && (size_t)f->pos < clen && (unsigned char)cs[f->pos] == b)) {
        int found = -1;
        for (int i = first_candidate(f); i < end_candidate(f) && found < 0; i++) {
            const char *s = candidate(f, i, &len);
            if (s && len > (size_t)f->pos && (unsigned char)s[f->pos] == b && (!f->pos || !memcmp(s, cs, (size_t)f->pos)))
                found = i;
        }
        if (found < 0)
            return cs && (size_t)f->pos == clen ? LIT_PASS : LIT_FAIL;
        f->cur = found;
        cs = candidate(f, found, &clen);
    }
    f->pos++;
    if ((size_t)f->pos < clen)
        return LIT_MORE;
    for (int i = first_candidate(f); i < end_candidate(f); i++) {
        const char *s = candidate(f, i, &len);
        if (s && len > clen && !memcmp(s, cs, clen))
            return LIT_MORE; /* complete, and may grow */
    }
    return LIT_DONE;
}

static bool literal_complete(const frame *f)
{
    size_t len = 0;
    return f->cur >= 0 && candidate(f, f->cur, &len) && (size_t)f->pos == len && f->pos > 0;
}

static bool is_digit(unsigned char b) { return b >= '0' && b <= '9'; }
static bool is_hex(unsigned char b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

/* Whether a format template's position p (json_schema.c's format_pattern) takes byte b after `last`:
 * 'd' a digit, 'h' a hex digit, 'Y' 1-9 (a year's first digit), 'M' 0-1 and 'm' the month's second digit
 * (01-12), 'D' 0-3 and 'e' the day's second digit (01-31), 'H' 0-2 and 'u' the hour's second digit (00-23),
 * 'S' 0-5 (minutes, seconds); anything else itself. */
static bool pattern_allows(char p, unsigned char b, int32_t last)
{
    switch (p) {
    case 'd': return is_digit(b);
    case 'h': return is_hex(b);
    case 'Y': return b >= '1' && b <= '9';
    case 'M': return b == '0' || b == '1';
    case 'm': return last == '0' ? b >= '1' && b <= '9' : b >= '0' && b <= '2';
    case 'D': return b >= '0' && b <= '3';
    case 'e': return last == '0' ? b >= '1' && b <= '9' : last == '3' ? b == '0' || b == '1' : is_digit(b);
    case 'H': return b >= '0' && b <= '2';
    case 'u': return last == '2' ? b >= '0' && b <= '3' : is_digit(b);
    case 'S': return b >= '0' && b <= '5';
    default: return p == (char)b;
    }
}

/* One character of string text (not a quote or an escape). False: not allowed. */
static bool text_char(frame *f, unsigned char b)
{
    const gnode *n = f->n;
    if (f->aux > 0) { /* inside a UTF-8 sequence */
        if ((b & 0xC0) != 0x80)
            return false;
        f->aux--;
        return true;
    }
    if (b < 0x20 && !(n->kind == G_RAW && b == '\t'))
        return false;
    if (n->max >= 0 && f->count >= n->max)
        return false;
    if (n->pattern) {
        const char p = n->pattern[f->count];
        if (!p || !pattern_allows(p, b, f->last))
            return false;
    }
    if (b >= 0x80) {
        if (b >= 0xC2 && b <= 0xDF)
            f->aux = 1;
        else if (b >= 0xE0 && b <= 0xEF)
            f->aux = 2;
        else if (b >= 0xF0 && b <= 0xF4)
            f->aux = 3;
        else
            return false;
    }
    f->count++;
    f->last = b;
    return true;
}

/* Number stages: 0 start, 1 after '-', 2 integer digits, 3 after a leading 0, 4 after '.', 5 fraction
 * digits, 6 after e/E, 7 after the exponent sign, 8 exponent digits. Digits per part are capped (count,
 * NUMBER_MAX_DIGITS)
 * so a model cannot write one forever; the exponent at two digits, so every number is a finite double
 * (below 1e16 * 1e99: a parser that refuses an overflow, or reads it as infinity, never sees one). An
 * integer is never "-0", as a bounded one (int_step): its zero is "0". */
#define NUMBER_MAX_EXPONENT_DIGITS 2
static bool number_can_end(int stage) { return stage == 2 || stage == 3 || stage == 5 || stage == 8; }

static bool number_step(frame *f, unsigned char b)
{
    bool integer = f->n->integer;
    switch (f->stage) {
    case 0:
        if (b == '-') return f->stage = 1, true;
        /* fall through */
    case 1:
        if (b == '0' && integer && f->stage == 1) return false;
        if (b == '0') return f->stage = 3, true;
        if (b >= '1' && b <= '9') return f->stage = 2, f->count = 1, true;
        return false;
    case 2:
        if (is_digit(b) && f->count < NUMBER_MAX_DIGITS) return f->count++, true;
        /* fall through */
    case 3:
        if (integer) return false;
        if (b == '.') return f->stage = 4, f->count = 0, true;
        if (b == 'e' || b == 'E') return f->stage = 6, f->count = 0, true;
        return false;
    case 4:
    case 5:
        if (is_digit(b) && f->count < NUMBER_MAX_DIGITS) return f->stage = 5, f->count++, true;
        if (f->stage == 5 && (b == 'e' || b == 'E')) return f->stage = 6, f->count = 0, true;
        return false;
    case 6:
        if (b == '+' || b == '-') return f->stage = 7, true;
        /* fall through */
    case 7:
    case 8:
        if (is_digit(b) && f->count < NUMBER_MAX_EXPONENT_DIGITS) return f->stage = 8, f->count++, true;
        return false;
    }
    return false;
}

/* An integer with bounds (n->range, int_range.h). Stages: 0 start, 1 after '-', 2 a positive magnitude's
 * digits, 3 after "0" (nothing follows), 4 a negative magnitude's digits; count, aux and last hold the
 * magnitude's lily_digit_state (digits, cmp_lo, cmp_hi). "-0" and leading zeros are never taken. */
static bool int_step(frame *f, unsigned char b)
{
    const lily_int_range *r = f->n->range;
    if (f->stage == 0 && b == '-') {
        if (r->neg.n_hi == 0)
            return false;
        f->stage = 1;
        return true;
    }
    if (f->stage == 0 && b == '0') {
        if (!r->zero)
            return false;
        f->stage = 3;
        return true;
    }
    if (f->stage == 3)
        return false;
    const bool negative = f->stage == 1 || f->stage == 4;
    lily_digit_state d = {f->count, f->aux, f->last};
    if ((b == '0' && d.digits == 0) || !lily_digit_range_step(negative ? &r->neg : &r->pos, &d, b, 0, INT32_MAX))
        return false;
    f->stage = negative ? 4 : 2;
    f->count = d.digits;
    f->aux = d.cmp_lo;
    f->last = d.cmp_hi;
    return true;
}

static bool int_can_end(const frame *f)
{
    const lily_int_range *r = f->n->range;
    const lily_digit_state d = {f->count, f->aux, f->last};
    return f->stage == 3 || (f->stage == 2 && lily_digit_range_complete(&r->pos, &d, d.digits)) ||
           (f->stage == 4 && lily_digit_range_complete(&r->neg, &d, d.digits));
}

/* A number with bounds (n->range, int_range.h: magnitudes in units of 10^-LILY_NUMBER_FRACTION_DIGITS):
 * -?(0|[1-9][0-9]*)(.[0-9]{1,16})?, no exponent. Stages: 0 start, 1 after '-', 2 integer digits, 3 after a
 * leading "0", 4 after '.', 5 fraction digits; cur the sign (1: negative); pos the integer digits, so the
 * magnitude's digit string will have pos + 16 digits once the point (or the end) fixes it; count, aux
 * and last its lily_digit_state. "-0" (and "-0.0...") never completes: zero is in the positive side. */
static bool bounded_number_step(frame *f, unsigned char b)
{
    const lily_int_range *r = f->n->range;
    const int frac = LILY_NUMBER_FRACTION_DIGITS;
    if (f->stage == 0) {
        f->cur = 0;
        if (b == '-') {
            if (r->neg.n_hi == 0)
                return false;
            f->stage = 1;
            f->cur = 1;
            return true;
        }
    }
    const lily_digit_range *side = f->cur == 1 ? &r->neg : &r->pos;
    lily_digit_state d = {f->count, f->aux, f->last};
    switch (f->stage) {
    case 0:
    case 1:
        if (b == '0') { /* the integer part is empty: the fraction's digits are the magnitude's */
            if (!lily_digit_range_open(side, &d, frac, frac))
                return false;
            f->stage = 3;
            return true;
        }
        if (b < '1' || b > '9' || !lily_digit_range_step(side, &d, b, 1 + frac, INT32_MAX))
            return false;
        f->stage = 2;
        f->pos = 1;
        break;
    case 2:
        if (b == '.') {
            if (!lily_digit_range_open(side, &d, f->pos + frac, f->pos + frac))
                return false;
            f->stage = 4;
            return true;
        }
        if (!lily_digit_range_step(side, &d, b, f->pos + 1 + frac, INT32_MAX))
            return false;
        f->pos++;
        break;
    case 3:
        if (b != '.')
            return false;
        f->stage = 4;
        return true;
    case 4:
    case 5:
        if (d.digits >= f->pos + frac || !lily_digit_range_step(side, &d, b, f->pos + frac, f->pos + frac))
            return false;
        f->stage = 5;
        break;
    default: return false;
    }
    f->count = d.digits;
    f->aux = d.cmp_lo;
    f->last = d.cmp_hi;
    return true;
}

static bool bounded_number_can_end(const frame *f)
{
    if (f->stage != 2 && f->stage != 3 && f->stage != 5)
        return false;
    const lily_digit_state d = {f->count, f->aux, f->last};
    return lily_digit_range_complete(f->cur == 1 ? &f->n->range->neg : &f->n->range->pos, &d,
                                     f->pos + LILY_NUMBER_FRACTION_DIGITS);
}

/* Item i of array n (grammar_internal.h), or NULL when the array takes no such item. */
static const gnode *array_item(const gnode *n, int i)
{
    if (i < n->n_prefix)
        return n->kids[i];
    return n->n_kids > n->n_prefix ? n->kids[n->n_prefix] : NULL;
}

static bool frame_can_end(const frame *f)
{
    switch (f->n->kind) {
    case G_WS: return true;
    case G_NUMBER:
        if (!f->n->range)
            return number_can_end(f->stage);
        return f->n->integer ? int_can_end(f) : bounded_number_can_end(f);
    case G_RAW: return f->aux == 0 && f->count >= f->n->min && (!f->n->pattern || !f->n->pattern[f->count]);
    case G_LITSET: return literal_complete(f);
    default: return false;
    }
}

/* Feed byte b to stack s (modified in place; a scratch copy), adding every resulting stack to out. */
static void step(stack *s, unsigned char b, stack_set *out)
{
    for (;;) {
        if (s->depth == 0)
            return;
        frame *f = &s->f[s->depth - 1];
        const gnode *n = f->n;
        switch (n->kind) {
        case G_REF: return; /* never on a stack (push follows it) */
        case G_WS:
            if ((b == ' ' || b == '\n') && f->count < n->max) {
                f->count++;
                emit(out, s);
                return;
            }
            s->depth--;
            continue;
        case G_ALT: {
            s->depth--;
            stack fork;
            for (int k = 0; k < n->n_kids; k++) {
                copy_stack(&fork, s);
                if (push(&fork, n->kids[k]))
                    step(&fork, b, out);
            }
            return;
        }
        case G_LITSET: {
            lit_result r = literal_step(f, b);
            if (r == LIT_FAIL)
                return;
            if (r == LIT_PASS) {
                s->depth--;
                continue;
            }
            if (r == LIT_DONE)
                s->depth--;
            emit(out, s);
            return;
        }
        case G_OBJECT: {
            if (f->stage == 0) {
                if (b != '{')
                    return;
                f->stage = 1;
                emit(out, s);
                return;
            }
            lit_result r = literal_step(f, b);
            if (r == LIT_FAIL || r == LIT_PASS)
                return;
            if (r == LIT_DONE) {
                int i = f->cur;
                if (i == n->n_props) {
                    s->depth--;
                } else {
                    f->count = i + 1;
                    f->first = 0;
                    f->pos = 0;
                    f->cur = -1;
                    if ((n->sep && !push(s, n->sep)) || !push(s, n->kids[i]))
                        return;
                }
            }
            emit(out, s);
            return;
        }
        case G_FREE_OBJECT:
            switch (f->stage) {
            case 0:
                if (b != '{')
                    return;
                f->stage = 1;
                emit(out, s);
                return;
            case 1: /* after '{' */
            case 2: /* after a value; count: the keys so far (minProperties / maxProperties: min, max) */
                if (b == '}') {
                    if (f->count < n->min)
                        return;
                    s->depth--;
                    emit(out, s);
                    return;
                }
                if (n->max >= 0 && f->count >= n->max)
                    return;
                if (f->stage == 2) {
                    if (b != ',')
                        return;
                    f->stage = 4;
                    f->count++;
                    emit(out, s);
                    return;
                }
                f->stage = 3; /* the first key starts with this byte */
                f->count = 1;
                if (!push(s, n->kids[0]))
                    return;
                continue;
            case 4: /* a key */
                f->stage = 3;
                if (!push(s, n->kids[0]))
                    return;
                continue;
            case 3: /* after the key */
                if (b != ':')
                    return;
                f->stage = 2;
                if (push(s, n->kids[1]))
                    emit(out, s);
                return;
            }
            return;
        case G_ARRAY:
            if (f->stage == 0) {
                if (b != '[')
                    return;
                f->stage = 1;
                emit(out, s);
                return;
            }
            if (b == ']' && f->count >= n->min) {
                s->depth--;
                emit(out, s);
                return;
            }
            if (f->stage == 1) { /* the first item starts with this byte */
                if (n->max == 0 || !array_item(n, 0))
                    return;
                f->stage = 2;
                f->count = 1;
                if (!push(s, array_item(n, 0)))
                    return;
                continue;
            }
            if (b != ',' || (n->max >= 0 && f->count >= n->max) || !array_item(n, f->count))
                return;
            if (push(s, array_item(n, f->count++)))
                emit(out, s);
            return;
        case G_STRING:
            switch (f->stage) {
            case 0:
                if (b != '"')
                    return;
                f->stage = 1;
                break;
            case 1:
                if (f->aux == 0 && b == '"') {
                    if (f->count < n->min || (n->pattern && n->pattern[f->count]))
                        return;
                    s->depth--;
                    break;
                }
                if (f->aux == 0 && b == '\\') {
                    if (n->pattern || (n->max >= 0 && f->count >= n->max))
                        return;
                    f->stage = 2;
                    break;
                }
                if (!text_char(f, b))
                    return;
                break;
            case 2:
                if (b == 'u') {
                    f->stage = 3;
                    f->aux = 0;
                    break;
                }
                if (!strchr("\"\\/bfnrt", b) || !b)
                    return;
                f->stage = 1;
                f->count++;
                break;
            case 3: /* no surrogate (\uD800-\uDFFF): a strict parser refuses one alone, and a character
                     * outside the BMP can be written as itself */
                if (!is_hex(b) || (f->aux == 1 && (f->last == 'd' || f->last == 'D') && !(b >= '0' && b <= '7')))
                    return;
                if (f->aux == 0)
                    f->last = b; /* the escape's first digit (a string with an escape has no pattern) */
                if (++f->aux == 4) {
                    f->aux = 0;
                    f->stage = 1;
                    f->count++;
                }
                break;
            }
            emit(out, s);
            return;
        case G_RAW:
            if (f->aux == 0 && b == '\n') {
                if (!frame_can_end(f))
                    return;
                s->depth--;
                continue;
            }
            if (b == '<' || b == '\r' || !text_char(f, b))
                return;
            emit(out, s);
            return;
        case G_NUMBER:
            if (!n->range ? number_step(f, b) : n->integer ? int_step(f, b) : bounded_number_step(f, b)) {
                emit(out, s);
                return;
            }
            if (!frame_can_end(f))
                return;
            s->depth--;
            continue;
        }
        return;
    }
}

static void step_set(const stack_set *in, unsigned char b, stack_set *out)
{
    stack scratch;
    out->n = 0;
    for (int i = 0; i < in->n; i++) {
        copy_stack(&scratch, &in->s[i]);
        step(&scratch, b, out);
    }
}

lily_status lily_grammar_matcher_new(const lily_grammar *g, lily_grammar_matcher **out, lily_error *err)
{
    *out = NULL;
    lily_grammar_matcher *m = calloc(1, sizeof *m);
    if (!m)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "grammar: out of memory");
    m->g = g;
    m->cur.n = 1;
    stack *s = &m->cur.s[0];
    s->depth = 0;
    if (!push(s, g->root) || (g->lead && !push(s, g->lead))) {
        free(m);
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "grammar: empty");
    }
    *out = m;
    return LILY_OK;
}

void lily_grammar_matcher_free(lily_grammar_matcher *m)
{
    if (!m)
        return;
    free(m->levels);
    free(m);
}

bool lily_grammar_matcher_feed(lily_grammar_matcher *m, const char *bytes, size_t n)
{
    stack_set *saved = malloc(sizeof *saved);
    if (!saved)
        return false;
    *saved = m->cur;
    for (size_t i = 0; i < n; i++) {
        step_set(&m->cur, (unsigned char)bytes[i], &m->next);
        if (m->next.n == 0) {
            m->cur = *saved;
            free(saved);
            return false;
        }
        m->cur = m->next;
    }
    free(saved);
    return true;
}

static bool stack_accepting(const stack *s)
{
    for (int i = 0; i < s->depth; i++)
        if (!frame_can_end(&s->f[i]))
            return false;
    return true;
}

bool lily_grammar_matcher_accepting(const lily_grammar_matcher *m)
{
    for (int i = 0; i < m->cur.n; i++)
        if (stack_accepting(&m->cur.s[i]))
            return true;
    return false;
}

bool lily_grammar_matcher_finished(const lily_grammar_matcher *m)
{
    for (int i = 0; i < m->cur.n; i++)
        if (m->cur.s[i].depth > 0)
            return false;
    return true;
}

/* ---- the vocabulary trie ----------------------------------------------------------------------------- */

typedef struct {
    int32_t first_child, next_sibling;
    int32_t token;        /* the first token whose bytes end here, or -1 */
    unsigned char byte;
} trie_node;

struct lily_token_trie {
    trie_node *nodes;
    int n_nodes, cap_nodes;
    int32_t *same_next;   /* [n_tokens] the next token with the same bytes, or -1 */
    int n_tokens;
    int max_len;
    /* Inside free text (a JSON string or a raw parameter value without a pattern) a token made of plain
     * characters only is allowed whenever its characters fit the length limit: plain[k][id] is its number
     * of characters for each kind of text (0: not plain; at most PLAIN_CHARS_MAX), and rest[k] is the trie
     * of the other tokens, the only ones that need a walk there. */
    uint8_t *plain[2];
    struct lily_token_trie *rest[2];
};

enum { TEXT_JSON = 0, TEXT_RAW = 1 };

/* The most characters a token counted as plain may have (longer ones take the walk). */
#define PLAIN_CHARS_MAX 255

/* The number of characters of bytes[len] when they are characters the text kind takes anywhere in its
 * body: no quote, backslash or control character (JSON); no '<', newline or control character other than
 * tab (raw); whole UTF-8 sequences with the lead bytes text_char accepts. 0 otherwise (or more than
 * PLAIN_CHARS_MAX characters). */
static int plain_text(const char *bytes, size_t len, int kind)
{
    int pending = 0, chars = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)bytes[i];
        if (pending) {
            if ((b & 0xC0) != 0x80)
                return false;
            pending--;
            continue;
        }
        if (b < 0x20 && !(kind == TEXT_RAW && b == '\t'))
            return false;
        if ((kind == TEXT_JSON && (b == '"' || b == '\\')) || (kind == TEXT_RAW && b == '<'))
            return false;
        if (b >= 0x80) {
            if (b >= 0xC2 && b <= 0xDF)
                pending = 1;
            else if (b >= 0xE0 && b <= 0xEF)
                pending = 2;
            else if (b >= 0xF0 && b <= 0xF4)
                pending = 3;
            else
                return 0;
        }
        chars++;
    }
    return pending == 0 && chars <= PLAIN_CHARS_MAX ? chars : 0;
}

/* The text kind when every stack of the set is inside free text with no partial character pending, else
 * -1: then a token of c plain characters is allowed exactly when c <= *room (the most characters any
 * stack's length limit leaves; INT32_MAX without one), and only the rest need a walk. */
static int free_text_kind(const stack_set *set, int32_t *room)
{
    int kind = -1;
    *room = 0;
    for (int i = 0; i < set->n; i++) {
        const stack *s = &set->s[i];
        if (s->depth == 0)
            return -1;
        const frame *f = &s->f[s->depth - 1];
        const gnode *n = f->n;
        int k = n->kind == G_STRING && f->stage == 1 ? TEXT_JSON : n->kind == G_RAW ? TEXT_RAW : -1;
        if (k < 0 || f->aux || n->pattern || (kind >= 0 && k != kind))
            return -1;
        kind = k;
        const int32_t r = n->max < 0 ? INT32_MAX : n->max - f->count;
        *room = r > *room ? r : *room;
    }
    return kind;
}

static int32_t trie_child(lily_token_trie *t, int32_t parent, unsigned char b, bool create)
{
    int32_t prev = -1;
    for (int32_t c = t->nodes[parent].first_child; c >= 0; prev = c, c = t->nodes[c].next_sibling)
        if (t->nodes[c].byte == b)
            return c;
    if (!create)
        return -1;
    if (t->n_nodes == t->cap_nodes) {
        int cap = t->cap_nodes * 2;
        trie_node *p = realloc(t->nodes, (size_t)cap * sizeof *p);
        if (!p)
            return -2;
        t->nodes = p;
        t->cap_nodes = cap;
    }
    int32_t c = t->n_nodes++;
    t->nodes[c] = (trie_node){.first_child = -1, .next_sibling = -1, .token = -1, .byte = b};
    if (prev >= 0)
        t->nodes[prev].next_sibling = c;
    else
        t->nodes[parent].first_child = c;
    return c;
}

static lily_token_trie *trie_alloc(int n_tokens, int cap_nodes)
{
    lily_token_trie *t = calloc(1, sizeof *t);
    if (t) {
        t->cap_nodes = cap_nodes > 0 ? cap_nodes : 1;
        t->nodes = malloc((size_t)t->cap_nodes * sizeof *t->nodes);
        t->same_next = malloc(((size_t)n_tokens + 1) * sizeof *t->same_next);
    }
    if (!t || !t->nodes || !t->same_next) {
        lily_token_trie_free(t);
        return NULL;
    }
    t->n_tokens = n_tokens;
    t->n_nodes = 1;
    t->nodes[0] = (trie_node){.first_child = -1, .next_sibling = -1, .token = -1};
    for (int id = 0; id < n_tokens; id++)
        t->same_next[id] = -1;
    return t;
}

/* The reference build (the oracle of the sorted one below): the trie of the tokens with keep[id] (all when
 * keep is NULL), excluded ones left out, inserted one by one in id order (each byte a scan of the node's
 * children). */
static lily_token_trie *trie_build_by_insertion(const char *const *bytes, const size_t *lens, const bool *excluded,
                                                const uint8_t *keep, int n_tokens)
{
    lily_token_trie *t = trie_alloc(n_tokens, 1024);
    for (int id = 0; t && id < n_tokens; id++) {
        if ((excluded && excluded[id]) || !bytes[id] || !lens[id] || (keep && !keep[id]))
            continue;
        int32_t node = 0;
        for (size_t k = 0; k < lens[id] && node >= 0; k++)
            node = trie_child(t, node, (unsigned char)bytes[id][k], true);
        if (node < 0) {
            lily_token_trie_free(t);
            return NULL;
        }
        t->same_next[id] = t->nodes[node].token;
        t->nodes[node].token = id;
        if ((int)lens[id] > t->max_len)
            t->max_len = (int)lens[id];
    }
    return t;
}

/* The byte at depth d of token id as a sort key: 0 past its end (a prefix sorts first), else byte + 1. */
static int sort_key(const char *const *bytes, const size_t *lens, int32_t id, size_t d)
{
    return d < lens[id] ? (unsigned char)bytes[id][d] + 1 : 0;
}

/* Sort ids[0, n) by their bytes from depth d on (all share bytes [0, d)): most significant byte first, one
 * counting pass per depth into tmp[0, n); short runs by insertion. Stable. */
static void sort_by_bytes(const char *const *bytes, const size_t *lens, int32_t *ids, int32_t *tmp, int n, size_t d)
{
    while (n > 1) {
        if (n <= 16) {
            for (int i = 1; i < n; i++) {
                const int32_t id = ids[i];
                int j = i;
                for (; j > 0; j--) {
                    const int32_t o = ids[j - 1];
                    const size_t common = lens[o] < lens[id] ? lens[o] : lens[id];
                    int c = common > d ? memcmp(bytes[o] + d, bytes[id] + d, common - d) : 0;
                    if (c < 0 || (c == 0 && lens[o] <= lens[id]))
                        break;
                    ids[j] = o;
                }
                ids[j] = id;
            }
            return;
        }
        int count[258] = {0};
        for (int i = 0; i < n; i++)
            count[sort_key(bytes, lens, ids[i], d) + 1]++;
        for (int k = 1; k < 258; k++)
            count[k] += count[k - 1];
        for (int i = 0; i < n; i++)
            tmp[count[sort_key(bytes, lens, ids[i], d)]++] = ids[i];
        memcpy(ids, tmp, (size_t)n * sizeof *ids);
        /* bucket k is now [count[k - 1], count[k]); bucket 0 (the tokens that end at depth d) holds equal
         * bytes, in order already */
        for (int k = 1; k < 256; k++)
            if (count[k] - count[k - 1] > 1)
                sort_by_bytes(bytes, lens, ids + count[k - 1], tmp, count[k] - count[k - 1], d + 1);
        ids += count[255]; /* the last bucket (byte 0xff) by the loop instead of a call */
        n -= count[255];
        d++;
    }
}

/* The trie of the tokens order[0, n_order) (sorted by their bytes) with keep[id] (all when keep is NULL),
 * built in one pass: a token shares its path with the previous one up to their common prefix, and its new
 * nodes are the last children of their parents. Nodes come out in depth-first order, children by byte. */
static lily_token_trie *trie_build_sorted(const char *const *bytes, const size_t *lens, const int32_t *order,
                                          int n_order, int max_len, const uint8_t *keep, int n_tokens)
{
    int32_t *path = malloc(((size_t)max_len + 1) * sizeof *path);      /* the previous token's nodes per depth */
    int32_t *last = malloc(((size_t)max_len + 1) * sizeof *last);      /* their last children so far */
    lily_token_trie *t = path && last ? trie_alloc(n_tokens, 1024) : NULL;
    if (t) {
        path[0] = 0;
        last[0] = -1;
    }
    int32_t prev = -1;
    for (int i = 0; t && i < n_order; i++) {
        const int32_t id = order[i];
        if (keep && !keep[id])
            continue;
        const char *b = bytes[id];
        const size_t len = lens[id];
        size_t d = 0;
        if (prev >= 0) {
            const size_t plen = lens[prev];
            while (d < len && d < plen && bytes[prev][d] == b[d])
                d++;
        }
        for (; d < len; d++) {
            if (t->n_nodes == t->cap_nodes) {
                const int cap = t->cap_nodes * 2;
                trie_node *p = realloc(t->nodes, (size_t)cap * sizeof *p);
                if (!p) {
                    lily_token_trie_free(t);
                    t = NULL;
                    break;
                }
                t->nodes = p;
                t->cap_nodes = cap;
            }
            const int32_t c = t->n_nodes++;
            t->nodes[c] = (trie_node){.first_child = -1, .next_sibling = -1, .token = -1, .byte = (unsigned char)b[d]};
            if (last[d] >= 0)
                t->nodes[last[d]].next_sibling = c;
            else
                t->nodes[path[d]].first_child = c;
            last[d] = c;
            path[d + 1] = c;
            last[d + 1] = -1;
        }
        if (!t)
            break;
        const int32_t node = path[len];
        t->same_next[id] = t->nodes[node].token;
        t->nodes[node].token = id;
        if ((int)len > t->max_len)
            t->max_len = (int)len;
        prev = id;
    }
    free(path);
    free(last);
    return t;
}

static bool token_usable(const char *const *bytes, const size_t *lens, const bool *excluded, int id)
{
    return !(excluded && excluded[id]) && bytes[id] && lens[id];
}

/* lily_token_trie_new's tries by insertion (reference) or from the tokens sorted by their bytes. */
static lily_status token_trie_new(const char *const *bytes, const size_t *lens, const bool *excluded, int n_tokens,
                                  bool by_insertion, lily_token_trie **out, lily_error *err)
{
    *out = NULL;
    int32_t *order = NULL, *tmp = NULL;
    int n_order = 0, max_len = 0;
    lily_token_trie *t = NULL;
    if (by_insertion) {
        t = trie_build_by_insertion(bytes, lens, excluded, NULL, n_tokens);
    } else {
        order = malloc(((size_t)n_tokens + 1) * sizeof *order);
        tmp = malloc(((size_t)n_tokens + 1) * sizeof *tmp);
        if (order && tmp) {
            for (int id = 0; id < n_tokens; id++)
                if (token_usable(bytes, lens, excluded, id)) {
                    order[n_order++] = id;
                    max_len = (int)lens[id] > max_len ? (int)lens[id] : max_len;
                }
            sort_by_bytes(bytes, lens, order, tmp, n_order, 0);
            t = trie_build_sorted(bytes, lens, order, n_order, max_len, NULL, n_tokens);
        }
    }
    uint8_t *other = malloc((size_t)n_tokens + 1);
    bool ok = t && other;
    for (int k = 0; ok && k < 2; k++) {
        ok = (t->plain[k] = calloc((size_t)n_tokens + 1, 1)) != NULL;
        for (int id = 0; ok && id < n_tokens; id++) {
            bool usable = token_usable(bytes, lens, excluded, id);
            t->plain[k][id] = usable ? (uint8_t)plain_text(bytes[id], lens[id], k) : 0;
            other[id] = usable && !t->plain[k][id];
        }
        ok = ok && (t->rest[k] = by_insertion ? trie_build_by_insertion(bytes, lens, excluded, other, n_tokens)
                                              : trie_build_sorted(bytes, lens, order, n_order, max_len, other,
                                                                  n_tokens)) != NULL;
    }
    free(other);
    free(order);
    free(tmp);
    if (!ok) {
        lily_token_trie_free(t);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "grammar: out of memory for the token trie");
    }
    *out = t;
    return LILY_OK;
}

lily_status lily_token_trie_new(const char *const *bytes, const size_t *lens, const bool *excluded, int n_tokens,
                                lily_token_trie **out, lily_error *err)
{
    return token_trie_new(bytes, lens, excluded, n_tokens, false, out, err);
}

lily_status lily_token_trie_new_by_insertion(const char *const *bytes, const size_t *lens, const bool *excluded,
                                             int n_tokens, lily_token_trie **out, lily_error *err)
{
    return token_trie_new(bytes, lens, excluded, n_tokens, true, out, err);
}

/* Whether node na of a and node nb of b end the same tokens and have children with the same bytes whose
 * subtries are equal, in any order of siblings and of tokens with equal bytes. */
static bool trie_nodes_equal(const lily_token_trie *a, int32_t na, const lily_token_trie *b, int32_t nb)
{
    int n_a = 0, n_b = 0;
    for (int32_t id = a->nodes[na].token; id >= 0; id = a->same_next[id], n_a++) {
        int32_t j = b->nodes[nb].token;
        while (j >= 0 && j != id)
            j = b->same_next[j];
        if (j < 0)
            return false;
    }
    for (int32_t id = b->nodes[nb].token; id >= 0; id = b->same_next[id])
        n_b++;
    if (n_a != n_b)
        return false;
    int kids_a = 0, kids_b = 0;
    for (int32_t c = b->nodes[nb].first_child; c >= 0; c = b->nodes[c].next_sibling)
        kids_b++;
    for (int32_t c = a->nodes[na].first_child; c >= 0; c = a->nodes[c].next_sibling, kids_a++) {
        int32_t d = b->nodes[nb].first_child;
        while (d >= 0 && b->nodes[d].byte != a->nodes[c].byte)
            d = b->nodes[d].next_sibling;
        if (d < 0 || !trie_nodes_equal(a, c, b, d))
            return false;
    }
    return kids_a == kids_b;
}

static bool trie_equal(const lily_token_trie *a, const lily_token_trie *b)
{
    return a->n_tokens == b->n_tokens && a->n_nodes == b->n_nodes && a->max_len == b->max_len &&
           trie_nodes_equal(a, 0, b, 0);
}

bool lily_token_trie_equal(const lily_token_trie *a, const lily_token_trie *b)
{
    if (!trie_equal(a, b))
        return false;
    for (int k = 0; k < 2; k++)
        if ((!a->plain[k]) != (!b->plain[k]) || (!a->rest[k]) != (!b->rest[k]) ||
            (a->plain[k] && memcmp(a->plain[k], b->plain[k], (size_t)a->n_tokens)) ||
            (a->rest[k] && !trie_equal(a->rest[k], b->rest[k])))
            return false;
    return true;
}

void lily_token_trie_free(lily_token_trie *t)
{
    if (!t)
        return;
    for (int k = 0; k < 2; k++) {
        free(t->plain[k]);
        lily_token_trie_free(t->rest[k]);
    }
    free(t->nodes);
    free(t->same_next);
    free(t);
}

int lily_token_trie_prefixes(const lily_token_trie *t, const char *bytes, size_t len, int32_t *ids, int cap)
{
    int n = 0;
    int32_t node = 0;
    for (size_t k = 0; k < len; k++) {
        int32_t c = t->nodes[node].first_child;
        while (c >= 0 && t->nodes[c].byte != (unsigned char)bytes[k])
            c = t->nodes[c].next_sibling;
        if (c < 0)
            break;
        node = c;
        for (int32_t id = t->nodes[c].token; id >= 0; id = t->same_next[id], n++)
            if (n < cap)
                ids[n] = id;
    }
    return n;
}

static int mask_walk(lily_grammar_matcher *m, const lily_token_trie *t, int32_t node, const stack_set *state,
                     int level, uint8_t *allowed)
{
    int n_allowed = 0;
    stack_set *next = &m->levels[level];
    for (int32_t c = t->nodes[node].first_child; c >= 0; c = t->nodes[c].next_sibling) {
        step_set(state, t->nodes[c].byte, next);
        if (next->n == 0)
            continue;
        for (int32_t id = t->nodes[c].token; id >= 0; id = t->same_next[id]) {
            allowed[id] = 1;
            n_allowed++;
        }
        if (t->nodes[c].first_child >= 0)
            n_allowed += mask_walk(m, t, c, next, level + 1, allowed);
    }
    return n_allowed;
}

int lily_grammar_matcher_mask(const lily_grammar_matcher *cm, const lily_token_trie *t, uint8_t *allowed)
{
    lily_grammar_matcher *m = (lily_grammar_matcher *)cm; /* the walk's scratch levels only */
    memset(allowed, 0, (size_t)t->n_tokens);
    if (m->n_levels < t->max_len) {
        stack_set *levels = realloc(m->levels, (size_t)t->max_len * sizeof *levels);
        if (!levels)
            return 0;
        m->levels = levels;
        m->n_levels = t->max_len;
    }
    int32_t room;
    int kind = free_text_kind(&m->cur, &room);
    if (kind < 0)
        return mask_walk(m, t, 0, &m->cur, 0, allowed);
    int n = 0;
    const uint8_t *plain = t->plain[kind];
    for (int id = 0; id < t->n_tokens; id++)
        n += allowed[id] = plain[id] > 0 && plain[id] <= room;
    return n + mask_walk(m, t->rest[kind], 0, &m->cur, 0, allowed);
}
