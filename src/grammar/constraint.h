/* constraint.h — a compiled grammar as the generation loop's token constraint (runtime/generate.h).
 *
 * Owns: the vocabulary trie of a tokenizer (built once per model), and per generation a matcher that
 * masks each step's logits to the tokens the grammar accepts, lets the stop tokens through once the value
 * is complete, and leaves a think block unconstrained until its "</think>".
 */
#ifndef LILY_GRAMMAR_CONSTRAINT_H
#define LILY_GRAMMAR_CONSTRAINT_H

#include "grammar/grammar.h"
#include "runtime/generate.h"
#include "text/tokenizer.h"

/* The trie of tok's tokens for a model vocabulary of `vocab` ids (ids the tokenizer lacks and special
 * tokens are never allowed). Errors: LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_vocab_trie_new(const lily_tokenizer *tok, int vocab, lily_token_trie **out, lily_error *err);

typedef struct lily_grammar_constraint lily_grammar_constraint;

typedef struct {
    const lily_grammar *grammar;
    const lily_token_trie *trie;
    const lily_tokenizer *tok;
    int vocab;
    const int32_t *stop_ids;  /* [n_stop_ids] allowed once the value is complete */
    int n_stop_ids;
    int32_t think_close;      /* wait for this token ("</think>") before constraining; -1: constrain at once */
} lily_grammar_constraint_options;

/* Errors: LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_grammar_constraint_new(const lily_grammar_constraint_options *o, lily_grammar_constraint **out,
                                        lily_error *err);
void lily_grammar_constraint_free(lily_grammar_constraint *c);

/* The hook for lily_generate_params.constraint (valid while c lives). */
lily_token_constraint lily_grammar_constraint_hook(lily_grammar_constraint *c);

/* Feed text the caller wrote itself (a forced prefix) to the grammar. False: rejected. */
bool lily_grammar_constraint_feed(lily_grammar_constraint *c, const char *text, size_t len);

/* The value is complete (the output so far parses and satisfies the grammar). */
bool lily_grammar_constraint_complete(const lily_grammar_constraint *c);

#endif
