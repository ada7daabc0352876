/* tokenizer_internal.h — the lily_tokenizer struct, shared by tokenizer_load.c (building it from JSON),
 * tokenizer_encode.c (added tokens, normalizer, pre-tokenizer, BPE) and tokenizer_decode.c.
 * Not a public header.
 */
#ifndef LILY_TEXT_TOKENIZER_INTERNAL_H
#define LILY_TEXT_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>

#include "text/tokenizer.h"

/* One added token from tokenizer.json's added_tokens. */
typedef struct {
    char *content;
    size_t len;
    int32_t id;
    bool special;     /* skipped by parse_special = false and by decode(skip_special) */
    bool normalized;  /* matched in the normalized text instead of the raw text */
    bool lstrip, rstrip, single_word;
} tok_added_token;

typedef enum { PRE_SPLIT, PRE_BYTE_LEVEL } tok_pre_kind;

/* HF SplitDelimiterBehavior. */
typedef enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_WITH_PREVIOUS, SPLIT_MERGED_WITH_NEXT, SPLIT_CONTIGUOUS } tok_split_behavior;

/* One pre-tokenizer step; applied in order, each to every piece the previous one produced. */
typedef struct {
    tok_pre_kind kind;
    pcre2_code *re;              /* Split's pattern, or ByteLevel's GPT-2 pattern when use_regex; else NULL */
    tok_split_behavior behavior; /* ByteLevel's regex split is Isolated */
    bool invert;
    bool add_prefix_space; /* ByteLevel only */
} tok_pre_step;

/* One merge in the open-addressing table: the pair (left id, right id) -> rank and merged id. */
#define TOK_BYTE_WEIGHT_ONE (1u << 24) /* the weight of an id (bpe_byte_weight) */

typedef struct {
    uint64_t pair; /* (uint64)left << 32 | right; TOK_EMPTY_PAIR when the slot is free */
    int32_t rank;
    int32_t merged;
} tok_merge;
#define TOK_EMPTY_PAIR UINT64_MAX

/* Cache of BPE results for repeated pieces (byte strings up to TOK_CACHE_MAX_PIECE bytes). */
#define TOK_CACHE_MAX_PIECE 64
typedef struct {
    uint64_t *hash;        /* [capacity], 0 = free */
    uint32_t *key_offset;  /* into keys */
    uint16_t *key_len;
    uint32_t *ids_offset;  /* into ids */
    uint16_t *ids_len;
    uint32_t capacity, count; /* capacity a power of two; cleared when count reaches capacity / 2 */
    char *keys;
    size_t keys_used, keys_cap;
    int32_t *ids;
    size_t ids_used, ids_cap;
} tok_cache;

struct lily_tokenizer {
    int32_t vocab_size;        /* max id + 1 */
    /* bytes of every id: token_blob[token_offset[id] .. + token_len[id]]; token_len -1 for holes */
    uint32_t *token_offset;
    int32_t *token_len;
    char *token_blob;
    uint8_t *token_flags;      /* TOK_FLAG_* */
    /* BPE vocabulary as raw bytes -> id: open addressing, vocab_table[slot] = id or -1 */
    int32_t *vocab_table;
    uint32_t vocab_mask;
    tok_merge *merges;
    uint32_t merge_mask;
    int32_t byte_id[256];      /* id of the single-byte token, -1 if the vocab lacks it */
    /* A lower bound on the ids BPE makes: byte b weighs floor(2^24 / m(b)), m(b) the length in bytes of the
     * longest vocab entry holding b (0 when the vocab has no entry for b: such bytes are dropped). An id of
     * len bytes holds only bytes with m >= len, so its bytes weigh at most 2^24: a piece makes at least
     * (sum of its weights) / 2^24 ids. */
    uint32_t bpe_byte_weight[256];
    bool ignore_merges;

    tok_added_token *added;    /* sorted by length, longest first */
    int n_added;
    uint8_t added_first_byte[256]; /* bit 0: some raw-matched token starts with this byte; bit 1: normalized */

    int normalize_options;     /* utf8proc options, 0 = no normalizer */

    tok_pre_step *steps;
    int n_steps;

    int32_t eos_id, bos_id, pad_id;

    pthread_mutex_t cache_lock; /* encode uses the cache only when trylock succeeds */
    tok_cache cache;
};

#define TOK_FLAG_ADDED 1
#define TOK_FLAG_SPECIAL 2

/* 64-bit hash of a byte string (FNV-1a, then mixed), never 0. */
uint64_t tok_hash_bytes(const void *data, size_t len);

/* Bytes -> BPE vocab id, -1 if absent. */
int32_t tok_vocab_find(const lily_tokenizer *tok, const char *bytes, size_t len);

/* Merge table lookup; returns NULL when (left, right) is not a merge. */
const tok_merge *tok_merge_find(const lily_tokenizer *tok, int32_t left, int32_t right);

/* Compile a pattern with PCRE2_UTF | PCRE2_UCP (+ JIT); on failure set LILY_ERR_TOKENIZER and return NULL. */
pcre2_code *tok_compile_regex(const char *pattern, size_t len, bool literal, lily_error *err);

/* GPT-2 byte-level alphabet: byte -> code point and code point -> byte (-1 for none). */
uint32_t tok_byte_to_codepoint(uint8_t b);
int tok_codepoint_to_byte(uint32_t cp);

void tok_cache_free(tok_cache *c);

/* NFC of s (valid UTF-8, n bytes) with utf8proc options (UTF8PROC_STABLE | UTF8PROC_COMPOSE): *out is
 * malloc'd (*out_len bytes), or stays NULL when s is already NFC (the common case: checked without
 * normalizing). Errors: LILY_ERR_OUT_OF_MEMORY, LILY_ERR_TOKENIZER if utf8proc fails. */
lily_status tok_nfc_quick(const char *s, size_t n, int options, char **out, size_t *out_len, lily_error *err);

/* Classify the UTF-8 sequence starting at s (n > 0 bytes available), per Unicode's well-formed table:
 * 1 -> a complete valid character of *len bytes; 0 -> a valid start that needs more bytes (*len = n);
 * -1 -> invalid, *len = the maximal invalid subpart (>= 1 byte) to replace with one U+FFFD. */
int tok_utf8_sequence(const unsigned char *s, size_t n, int *len);

#endif
