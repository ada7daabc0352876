/* constraint.c — a grammar as a per-token logits mask (constraint.h). */
#include "grammar/constraint.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct lily_grammar_constraint {
    lily_grammar_constraint_options o;
    lily_grammar_matcher *m;
    uint8_t *allowed;         /* [vocab] */
    uint8_t *is_stop;         /* [vocab] */
    bool waiting;             /* inside the think block */
    bool broken;              /* a token the grammar rejected was kept (cannot happen through the mask) */
};

lily_status lily_vocab_trie_new(const lily_tokenizer *tok, int vocab, lily_token_trie **out, lily_error *err)
{
    const char **bytes = calloc((size_t)vocab + 1, sizeof *bytes);
    size_t *lens = calloc((size_t)vocab + 1, sizeof *lens);
    bool *excluded = calloc((size_t)vocab + 1, sizeof *excluded);
    lily_status st;
    if (!bytes || !lens || !excluded) {
        st = lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "grammar: out of memory");
    } else {
        for (int id = 0; id < vocab && id < lily_tokenizer_vocab_size(tok); id++) {
            bytes[id] = lily_tokenizer_token_bytes(tok, id, &lens[id]);
            excluded[id] = lily_tokenizer_is_special(tok, id);
        }
        st = lily_token_trie_new(bytes, lens, excluded, vocab, out, err);
    }
    free(bytes);
    free(lens);
    free(excluded);
    return st;
}

lily_status lily_grammar_constraint_new(const lily_grammar_constraint_options *o, lily_grammar_constraint **out,
                                        lily_error *err)
{
    *out = NULL;
    lily_grammar_constraint *c = calloc(1, sizeof *c);
    if (!c)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "grammar: out of memory");
    c->o = *o;
    c->waiting = o->think_close >= 0;
    c->allowed = malloc((size_t)o->vocab);
    c->is_stop = calloc((size_t)o->vocab, 1);
    lily_status st = c->allowed && c->is_stop ? lily_grammar_matcher_new(o->grammar, &c->m, err)
                                              : lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "grammar: out of memory");
    if (st != LILY_OK) {
        lily_grammar_constraint_free(c);
        return st;
    }
    for (int i = 0; i < o->n_stop_ids; i++)
        if (o->stop_ids[i] >= 0 && o->stop_ids[i] < o->vocab)
            c->is_stop[o->stop_ids[i]] = 1;
    *out = c;
    return LILY_OK;
}

void lily_grammar_constraint_free(lily_grammar_constraint *c)
{
    if (!c)
        return;
    lily_grammar_matcher_free(c->m);
    free(c->allowed);
    free(c->is_stop);
    free(c);
}

/* The tokens allowed next into c->allowed[0, min(vocab, c->o.vocab)) (the grammar's, and the stop tokens
 * once the value is complete): how many, or -1 when none; 0 while waiting for the think block's end (no
 * constraint: c->allowed untouched). */
static int compute_allowed(lily_grammar_constraint *c, int vocab)
{
    if (c->waiting)
        return 0;
    if (c->broken)
        return -1;
    lily_grammar_matcher_mask(c->m, c->o.trie, c->allowed);
    const bool accepting = lily_grammar_matcher_accepting(c->m);
    int n = 0;
    for (int v = 0; v < vocab && v < c->o.vocab; v++) {
        c->allowed[v] = c->allowed[v] || (accepting && c->is_stop[v]);
        n += c->allowed[v];
    }
    return n > 0 ? n : -1;
}

static int mask(void *user, float *logits, int vocab)
{
    lily_grammar_constraint *c = user;
    const int n = compute_allowed(c, vocab);
    if (n <= 0)
        return n;
    for (int v = 0; v < vocab; v++)
        if (v >= c->o.vocab || !c->allowed[v])
            logits[v] = -INFINITY;
    return n;
}

static int allowed_bits(void *user, uint32_t *bits, int vocab)
{
    lily_grammar_constraint *c = user;
    const int n = compute_allowed(c, vocab);
    if (n <= 0)
        return n;
    memset(bits, 0, (size_t)(vocab + 31) / 32 * sizeof *bits);
    for (int v = 0; v < vocab && v < c->o.vocab; v++)
        if (c->allowed[v])
            bits[v >> 5] |= 1u << (v & 31);
    return n;
}

static void accept(void *user, int32_t token)
{
    lily_grammar_constraint *c = user;
    if (c->waiting) {
        c->waiting = token != c->o.think_close;
        return;
    }
    size_t len = 0;
    const char *bytes = lily_tokenizer_token_bytes(c->o.tok, token, &len);
    if (!bytes || !lily_grammar_matcher_feed(c->m, bytes, len))
        c->broken = true;
}

static bool masking(void *user)
{
    const lily_grammar_constraint *c = user;
    return !c->waiting;
}

lily_token_constraint lily_grammar_constraint_hook(lily_grammar_constraint *c)
{
    return (lily_token_constraint){.user = c, .mask = mask, .allowed = allowed_bits, .accept = accept,
                                   .masking = masking};
}

bool lily_grammar_constraint_feed(lily_grammar_constraint *c, const char *text, size_t len)
{
    c->waiting = false;
    return lily_grammar_matcher_feed(c->m, text, len);
}

bool lily_grammar_constraint_complete(const lily_grammar_constraint *c)
{
    return !c->waiting && !c->broken && lily_grammar_matcher_accepting(c->m);
}
