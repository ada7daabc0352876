/* grammar.h — constrained decoding: a JSON Schema compiled to a byte-level pushdown automaton, and the
 * token mask it allows over a vocabulary.
 *
 * Owns: compiling a schema (types string / integer / number / boolean / null / object / array, properties,
 * required, enum, const, anyOf, type lists, allOf of one schema, $ref into $defs / definitions, items,
 * prefixItems, minItems / maxItems, minLength / maxLength, minimum / maximum / exclusiveMinimum /
 * exclusiveMaximum of an integer or a number (int_range.h), string formats date, time, date-time and uuid,
 * additionalProperties (the values of an object without properties, and of required names properties
 * lack), minProperties / maxProperties of such an object), matching bytes against it, and masking a
 * vocabulary through a trie of the tokens' bytes (one walk of the trie per step, pruned at the first byte
 * the automaton rejects). The trie is built once per vocabulary from the tokens sorted by their bytes, in
 * one pass (lily_token_trie_new; the one-by-one insertion build is kept as its oracle, grammar_internal.h).
 *
 * Two surface syntaxes for the same schemas:
 *   LILY_GRAMMAR_JSON: compact JSON (no whitespace between tokens, except up to two leading newlines or
 *     spaces before the value, where a model's "</think>\n\n" habit puts them). Properties come in the
 *     schema's order; optional ones may be left out.
 *   LILY_GRAMMAR_QWEN_TOOL: the arguments of one Qwen3.5/3.6 tool call after "<function=NAME>\n":
 *     "<parameter=KEY>\nVALUE\n</parameter>\n"... then "</function>\n</tool_call>", the object at the root
 *     (its properties as parameters). A string VALUE is raw text on one line without '<' (what
 *     text/output_parser.h keeps verbatim); any other VALUE is compact JSON, as the parser converts it.
 *
 * The state is a set of parse stacks (anyOf and free values fork it; dead forks are dropped), bounded by
 * LILY_GRAMMAR_MAX_FORKS stacks of LILY_GRAMMAR_MAX_DEPTH frames: deeper nesting is rejected.
 */
#ifndef LILY_GRAMMAR_H
#define LILY_GRAMMAR_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lily.h"

#define LILY_GRAMMAR_MAX_DEPTH 48
#define LILY_GRAMMAR_MAX_FORKS 16

typedef enum {
    LILY_GRAMMAR_JSON = 0,
    LILY_GRAMMAR_QWEN_TOOL,
} lily_grammar_syntax;

typedef struct lily_grammar lily_grammar;

/* Compile schema (a JSON Schema object; NULL = any JSON object, OpenAI's json_object mode).
 * Errors: LILY_ERR_INVALID_ARGUMENT with a message naming the unsupported or malformed keyword (an
 * unknown type, a $ref that does not resolve, QWEN_TOOL with a root that is not an object, bounds with
 * no integer / number between them or a bound that is not a number);
 * LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_grammar_compile(const json_t *schema, lily_grammar_syntax syntax, lily_grammar **out,
                                 lily_error *err);
void lily_grammar_free(lily_grammar *g);

/* A matcher: the parse state of one generation. */
typedef struct lily_grammar_matcher lily_grammar_matcher;

lily_status lily_grammar_matcher_new(const lily_grammar *g, lily_grammar_matcher **out, lily_error *err);
void lily_grammar_matcher_free(lily_grammar_matcher *m);

/* Feed n bytes. Returns false (and leaves the state unchanged) when the grammar rejects them. */
bool lily_grammar_matcher_feed(lily_grammar_matcher *m, const char *bytes, size_t n);

/* The bytes so far form a complete value (generation may stop here). */
bool lily_grammar_matcher_accepting(const lily_grammar_matcher *m);

/* No byte can follow: the value is complete and closed. */
bool lily_grammar_matcher_finished(const lily_grammar_matcher *m);

/* A vocabulary as a trie of its tokens' bytes. Tokens with excluded[id] (special tokens) or no bytes are
 * never allowed by a mask. */
typedef struct lily_token_trie lily_token_trie;

/* bytes[id], lens[id] for id in [0, n_tokens). excluded may be NULL. Errors: LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_token_trie_new(const char *const *bytes, const size_t *lens, const bool *excluded, int n_tokens,
                                lily_token_trie **out, lily_error *err);
void lily_token_trie_free(lily_token_trie *t);

/* The tokens whose bytes are a prefix of bytes[0, len) (non-empty; special ones never: as in the trie), by
 * one walk down the trie: up to cap ids into ids (each once, shorter tokens first). Returns how many there
 * are (more than cap: only cap written). */
int lily_token_trie_prefixes(const lily_token_trie *t, const char *bytes, size_t len, int32_t *ids, int cap);

/* allowed[id] := 1 when the grammar accepts all of token id's bytes from the matcher's state, else 0
 * (allowed has n_tokens entries). Returns how many are allowed. Cost: one matcher step per trie node
 * whose byte path the grammar accepts. */
int lily_grammar_matcher_mask(const lily_grammar_matcher *m, const lily_token_trie *t, uint8_t *allowed);

#endif
