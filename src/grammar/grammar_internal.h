/* grammar_internal.h — the compiled grammar's node graph, shared by json_schema.c (builds it) and
 * grammar.c (matches bytes against it). Not part of the public interface (grammar.h).
 */
#ifndef LILY_GRAMMAR_INTERNAL_H
#define LILY_GRAMMAR_INTERNAL_H

#include "grammar/grammar.h"
#include "grammar/int_range.h"

typedef enum {
    G_LITSET,      /* one of strs[n] (bytes); an entry that is a prefix of another may end early */
    G_ALT,         /* one of kids[n_kids] */
    G_OBJECT,      /* properties in order: key strs[i] (first) / keys_next[i] (after one), value kids[i];
                      candidate n_props is the closing literal; tool: Qwen tags, sep after each value */
    G_FREE_OBJECT, /* {"key":value,...} with min..max keys: kids[0] the key string, kids[1] the value */
    G_ARRAY,       /* [item,...] with min..max items (max -1: unbounded): item i is kids[i] for i < n_prefix
                      (prefixItems), then kids[n_prefix] (items; none: no more) */
    G_STRING,      /* a JSON string of min..max characters, optionally a fixed pattern (grammar.h) */
    G_RAW,         /* a tool parameter's raw text: one line, no '<', min..max characters, optional pattern */
    G_NUMBER,      /* a JSON number (integer: no fraction or exponent; range: an integer in it) */
    G_WS,          /* up to max spaces / newlines */
    G_REF,         /* target (a $ref, compiled once so recursive schemas stay finite) */
} gnode_kind;

/* The most digits of a number's integer part (and of its fraction): a model cannot write one forever. An
 * integer with a bound may have as many as the bound (int64: 19). */
#define NUMBER_MAX_DIGITS 16

#define G_ENDLESS (1 << 30) /* min_depth of a node no finite text matches */

typedef struct gnode gnode;
struct gnode {
    gnode_kind kind;
    char **strs;
    size_t *lens;
    int n;
    gnode **kids;
    int n_kids;
    int n_props;
    int n_prefix;         /* array: positional items (prefixItems) */
    char **keys_next;
    size_t *lens_next;
    bool *required;
    int *next_required;   /* object: [k] the first required property at or after k (n_props: none), k <= n_props */
    bool tool;
    gnode *sep;           /* tool object: "\n</parameter>\n" */
    int min, max;
    const char *pattern;  /* static */
    bool integer;
    lily_int_range *range; /* integer with bounds (minimum / maximum ...); NULL: none */
    gnode *target;
    int id;               /* index in lily_grammar.nodes */
    int min_depth;        /* stack frames the cheapest complete value needs, its own included (json_schema.c);
                             G_ENDLESS: no finite value. The matcher enters a node only where they fit. */
};

struct lily_grammar {
    lily_grammar_syntax syntax;
    gnode *root;
    gnode *lead;          /* JSON: leading whitespace before the value */
    gnode *any;           /* the free JSON value, built on first use */
    gnode **nodes;        /* every node, for freeing */
    int n_nodes, cap_nodes;
};

/* lily_token_trie_new by the reference algorithm: each token inserted on its own, in id order (the oracle of
 * the build from the tokens sorted by their bytes). Same arguments and errors. */
lily_status lily_token_trie_new_by_insertion(const char *const *bytes, const size_t *lens, const bool *excluded,
                                             int n_tokens, lily_token_trie **out, lily_error *err);

/* Whether two tries hold the same tokens on the same byte paths (sibling order and the order of tokens with
 * equal bytes aside), with the same plain-text tables and the same tries of the other tokens. */
bool lily_token_trie_equal(const lily_token_trie *a, const lily_token_trie *b);

#endif
