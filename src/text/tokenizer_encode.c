/* tokenizer_encode.c — text -> token ids, the HF `tokenizers` pipeline for byte-level BPE.
 *
 * Owns, in pipeline order: splitting out added tokens (raw text, leftmost-longest), the normalizer
 * (utf8proc; NFC through tok_nfc_quick in tokenizer_normalize.c), the second added-token pass for "normalized" added tokens, the pre-tokenizer steps (PCRE2
 * Split / ByteLevel), and BPE by merge rank with a cache of repeated pieces.
 * BPE works on raw bytes: the vocabulary was converted out of the byte-level alphabet at load, so the
 * byte -> unicode mapping never runs here.
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/base.h"
#include "text/tokenizer_internal.h"

/* Pieces up to this many symbols merge by a linear scan over cached pair ranks; longer ones use a heap. */
#define BPE_LINEAR_MAX 48
#define CACHE_INITIAL_CAPACITY 8192u
#define CACHE_MAX_CAPACITY (1u << 17)
/* encode_max skips a piece this long (bytes) unmerged once its lower bound shows the text is too long. */
#define LONG_PIECE 1024

typedef struct {
    const lily_tokenizer *tok;
    bool parse_special;
    lily_error *err;
    lily_status st;
    int32_t *ids;
    size_t n_ids, cap_ids;
    size_t count_ids; /* stop once more than this many ids are made (SIZE_MAX: never) */
    size_t max_ids;   /* the caller's limit (<= count_ids): a long piece that alone passes it is not merged */
    bool over;        /* stopped: the text makes at least `lower` ids, more than max_ids */
    size_t lower;
    pcre2_match_data *match;
    pcre2_match_context *match_ctx; /* its match limit follows the text left to search (next_match) */
    tok_cache *cache; /* NULL when another thread holds it */
    /* BPE scratch, sized for the longest piece so far */
    int32_t *sym, *prev, *next, *rank;
    uint64_t *heap;
    size_t sym_cap;
    /* ByteLevel add_prefix_space copies, one per step */
    char **prefix_buf;
    size_t *prefix_cap;
} encoder;

static void fail(encoder *e, lily_status st, const char *what)
{
    if (e->st == LILY_OK)
        e->st = lily_error_set(e->err, st, "%s", what);
}

/* Still encoding: no error, and not stopped at the id limit. */
static bool going(const encoder *e)
{
    return e->st == LILY_OK && !e->over;
}

static void push_id(encoder *e, int32_t id)
{
    if (e->n_ids >= e->count_ids) { /* this id would be one more than the limit */
        e->over = true;
        e->lower = e->count_ids + 1;
        return;
    }
    if (e->n_ids == e->cap_ids) {
        size_t cap = e->cap_ids ? 2 * e->cap_ids : 256;
        int32_t *p = realloc(e->ids, cap * sizeof *p);
        if (!p) {
            fail(e, LILY_ERR_OUT_OF_MEMORY, "out of memory for token ids");
            return;
        }
        e->ids = p;
        e->cap_ids = cap;
    }
    e->ids[e->n_ids++] = id;
}

/* ---- UTF-8 ------------------------------------------------------------------------------------------- */

int tok_utf8_sequence(const unsigned char *s, size_t n, int *len)
{
    unsigned c = s[0];
    if (c < 0x80) {
        *len = 1;
        return 1;
    }
    int need;
    unsigned lo = 0x80, hi = 0xBF; /* the allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF)
        need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else {
        *len = 1;
        return -1;
    }
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) {
            *len = (int)n;
            return 0;
        }
        unsigned b = s[i];
        if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF)) {
            *len = i;
            return -1;
        }
    }
    *len = need;
    return 1;
}

/* Offset of the first invalid byte, or len when all of text is valid UTF-8. */
static size_t utf8_valid_prefix(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int k;
        if (tok_utf8_sequence(s + i, len - i, &k) != 1)
            return i;
        i += (size_t)k;
    }
    return len;
}

static bool is_whitespace_at(const unsigned char *s, size_t n, int *k)
{
    utf8proc_int32_t cp;
    *k = (int)utf8proc_iterate(s, (utf8proc_ssize_t)n, &cp);
    if (*k <= 0)
        return false;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || cp == 0x85)
        return true;
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

static bool is_word_codepoint(utf8proc_int32_t cp)
{
    if (cp == '_')
        return true;
    utf8proc_category_t c = utf8proc_category(cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

/* ---- BPE --------------------------------------------------------------------------------------------- */

static bool ensure_scratch(encoder *e, size_t n)
{
    if (n <= e->sym_cap)
        return true;
    size_t cap = LILY_MAX(n, 2 * e->sym_cap);
    free(e->sym);
    free(e->prev);
    free(e->next);
    free(e->rank);
    free(e->heap);
    e->sym = malloc(cap * sizeof *e->sym);
    e->prev = malloc(cap * sizeof *e->prev);
    e->next = malloc(cap * sizeof *e->next);
    e->rank = malloc(cap * sizeof *e->rank);
    e->heap = malloc(cap * 3 * sizeof *e->heap); /* m - 1 initial pairs + 2 per merge */
    e->sym_cap = cap;
    if (!e->sym || !e->prev || !e->next || !e->rank || !e->heap) {
        e->sym_cap = 0;
        fail(e, LILY_ERR_OUT_OF_MEMORY, "out of memory for BPE scratch");
        return false;
    }
    return true;
}

static int32_t pair_rank(const lily_tokenizer *tok, int32_t left, int32_t right)
{
    const tok_merge *m = tok_merge_find(tok, left, right);
    return m ? m->rank : INT32_MAX;
}

/* Min-heap of (rank << 32 | position). */
static void heap_push(uint64_t *heap, size_t *n, uint64_t v)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (heap[parent] <= v)
            break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = v;
}

static uint64_t heap_pop(uint64_t *heap, size_t *n)
{
    uint64_t top = heap[0], v = heap[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && heap[c + 1] < heap[c])
            c++;
        if (heap[c] >= v)
            break;
        heap[i] = heap[c];
        i = c;
    }
    heap[i] = v;
    return top;
}

/* Merge symbols 0..m-1 (linked by prev/next) lowest rank first, leftmost among equals — HF's
 * Word::merge_all order. Leaves the result in the linked list starting at 0. */
static void bpe_merge(encoder *e, int m)
{
    const lily_tokenizer *tok = e->tok;
    int32_t *sym = e->sym, *prev = e->prev, *next = e->next, *rank = e->rank;
    if (m <= BPE_LINEAR_MAX) {
        /* rank[k]: rank of the pair (k, next[k]) */
        for (int k = 0; k < m - 1; k++)
            rank[k] = pair_rank(tok, sym[k], sym[k + 1]);
        rank[m - 1] = INT32_MAX;
        for (;;) {
            int best = -1;
            int32_t best_rank = INT32_MAX;
            for (int k = 0; k >= 0; k = next[k])
                if (rank[k] < best_rank) {
                    best_rank = rank[k];
                    best = k;
                }
            if (best < 0)
                return;
            int right = next[best];
            sym[best] = tok_merge_find(tok, sym[best], sym[right])->merged;
            next[best] = next[right];
            if (next[right] >= 0)
                prev[next[right]] = best;
            rank[best] = next[best] >= 0 ? pair_rank(tok, sym[best], sym[next[best]]) : INT32_MAX;
            if (prev[best] >= 0)
                rank[prev[best]] = pair_rank(tok, sym[prev[best]], sym[best]);
        }
    }
    uint64_t *heap = e->heap;
    size_t n_heap = 0;
    for (int k = 0; k < m - 1; k++) {
        int32_t r = pair_rank(tok, sym[k], sym[k + 1]);
        if (r != INT32_MAX)
            heap_push(heap, &n_heap, (uint64_t)r << 32 | (uint32_t)k);
    }
    while (n_heap) {
        uint64_t top = heap_pop(heap, &n_heap);
        int k = (int)(uint32_t)top;
        int32_t r = (int32_t)(top >> 32);
        if (sym[k] < 0 || next[k] < 0)
            continue;
        int right = next[k];
        const tok_merge *mg = tok_merge_find(tok, sym[k], sym[right]);
        if (!mg || mg->rank != r)
            continue; /* stale: one side was merged since this entry was pushed */
        sym[k] = mg->merged;
        sym[right] = -1;
        next[k] = next[right];
        if (next[right] >= 0)
            prev[next[right]] = k;
        if (prev[k] >= 0) {
            int32_t pr = pair_rank(tok, sym[prev[k]], sym[k]);
            if (pr != INT32_MAX)
                heap_push(heap, &n_heap, (uint64_t)pr << 32 | (uint32_t)prev[k]);
        }
        if (next[k] >= 0) {
            int32_t nr = pair_rank(tok, sym[k], sym[next[k]]);
            if (nr != INT32_MAX)
                heap_push(heap, &n_heap, (uint64_t)nr << 32 | (uint32_t)k);
        }
    }
}

static bool cache_grow(tok_cache *c, uint32_t capacity)
{
    tok_cache_free(c);
    c->hash = calloc(capacity, sizeof *c->hash);
    c->key_offset = malloc(capacity * sizeof *c->key_offset);
    c->key_len = malloc(capacity * sizeof *c->key_len);
    c->ids_offset = malloc(capacity * sizeof *c->ids_offset);
    c->ids_len = malloc(capacity * sizeof *c->ids_len);
    c->keys_cap = (size_t)capacity * 16;
    c->ids_cap = (size_t)capacity * 4;
    c->keys = malloc(c->keys_cap);
    c->ids = malloc(c->ids_cap * sizeof *c->ids);
    c->capacity = capacity;
    if (!c->hash || !c->key_offset || !c->key_len || !c->ids_offset || !c->ids_len || !c->keys || !c->ids) {
        tok_cache_free(c);
        return false;
    }
    return true;
}

/* Returns the slot holding (s, n) or the free slot where it belongs. */
static uint32_t cache_slot(const tok_cache *c, const char *s, size_t n, uint64_t h)
{
    uint32_t mask = c->capacity - 1, slot = (uint32_t)h & mask;
    while (c->hash[slot] && !(c->hash[slot] == h && c->key_len[slot] == n && !memcmp(c->keys + c->key_offset[slot], s, n)))
        slot = (slot + 1) & mask;
    return slot;
}

static void cache_insert(tok_cache *c, const char *s, size_t n, uint64_t h, const int32_t *ids, size_t n_ids)
{
    if (c->count + 1 > c->capacity / 2 || c->keys_used + n > c->keys_cap || c->ids_used + n_ids > c->ids_cap) {
        /* full: grow while small, otherwise start over (the working set of pieces is what matters) */
        uint32_t capacity = c->capacity ? LILY_MIN(2 * c->capacity, CACHE_MAX_CAPACITY) : CACHE_INITIAL_CAPACITY;
        if (!cache_grow(c, capacity))
            return;
    }
    uint32_t slot = cache_slot(c, s, n, h);
    if (n)
        memcpy(c->keys + c->keys_used, s, n);
    if (n_ids)
        memcpy(c->ids + c->ids_used, ids, n_ids * sizeof *ids);
    c->hash[slot] = h;
    c->key_offset[slot] = (uint32_t)c->keys_used;
    c->key_len[slot] = (uint16_t)n;
    c->ids_offset[slot] = (uint32_t)c->ids_used;
    c->ids_len[slot] = (uint16_t)n_ids;
    c->keys_used += n;
    c->ids_used += n_ids;
    c->count++;
}

/* One pre-token (raw bytes) -> ids appended to e->ids. */
static void bpe_piece(encoder *e, const char *s, size_t n)
{
    const lily_tokenizer *tok = e->tok;
    if (n == 1) {
        int32_t id = tok->byte_id[(unsigned char)s[0]];
        if (id >= 0)
            push_id(e, id);
        return;
    }
    if (tok->ignore_merges) {
        int32_t id = tok_vocab_find(tok, s, n);
        if (id >= 0) {
            push_id(e, id);
            return;
        }
    }
    uint64_t h = 0;
    tok_cache *c = n <= TOK_CACHE_MAX_PIECE ? e->cache : NULL;
    if (c) {
        h = tok_hash_bytes(s, n);
        if (c->capacity) {
            uint32_t slot = cache_slot(c, s, n, h);
            if (c->hash[slot]) {
                for (uint32_t i = 0; i < c->ids_len[slot]; i++)
                    push_id(e, c->ids[c->ids_offset[slot] + i]);
                return;
            }
        }
    }
    if (e->count_ids != SIZE_MAX) {
        /* A lower bound on this piece's ids (bpe_byte_weight). Stop before the merges when they cannot be
         * counted, or when a long piece (O(n log n) time, ~40 bytes of scratch per byte) alone shows the text
         * is over max_ids: its exact count is not worth that. 2^24 * n fits in 64 bits under 2^40 bytes. */
        uint64_t weight = 0;
        for (size_t i = 0; i < n; i++)
            weight += tok->bpe_byte_weight[(unsigned char)s[i]];
        const size_t bound = (size_t)(weight / TOK_BYTE_WEIGHT_ONE);
        if (bound > e->count_ids - e->n_ids || (n >= LONG_PIECE && e->n_ids + bound > e->max_ids)) {
            e->over = true;
            e->lower = e->n_ids + bound;
            return;
        }
    }
    if (!ensure_scratch(e, n))
        return;
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = tok->byte_id[(unsigned char)s[i]];
        if (id < 0)
            continue; /* a byte the vocab lacks is dropped, as HF BPE does without an unk_token */
        e->sym[m] = id;
        e->prev[m] = m - 1;
        e->next[m] = m + 1;
        m++;
    }
    if (m == 0)
        return;
    e->next[m - 1] = -1;
    bpe_merge(e, m);
    size_t first = e->n_ids;
    for (int k = 0; k >= 0; k = e->next[k])
        push_id(e, e->sym[k]);
    if (c && going(e))
        cache_insert(c, s, n, h, e->ids + first, e->n_ids - first);
}

/* ---- pre-tokenizer ----------------------------------------------------------------------------------- */

static void pre_tokenize(encoder *e, int level, const char *s, size_t n);

typedef struct {
    size_t start, end;
    bool is_match;
} span;

/* Find the next match at or after *from; false when there is none. */
static bool next_match(encoder *e, const pcre2_code *re, const char *s, size_t n, size_t from, size_t *start, size_t *end)
{
    if (from > n)
        return false;
    /* PCRE2's default match limit (10^7 backtracking steps per match) fails a legitimate long text: the
     * Qwen pattern's \s*[\r\n]+ walks back over a whole run of spaces before \s+(?!\S) takes it, so a run
     * of 10^7 spaces failed. The pre-tokenizer patterns cost a few steps per byte they look at, so the
     * limit grows with the text left: it still stops a runaway pattern, not a long input. */
    size_t limit = (size_t)10000000 + 16 * (n - from);
    pcre2_set_match_limit(e->match_ctx, limit > UINT32_MAX ? UINT32_MAX : (uint32_t)limit);
    int rc = pcre2_jit_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, e->match, e->match_ctx);
    if (rc == PCRE2_ERROR_JIT_BADOPTION || rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, e->match, e->match_ctx);
    if (rc == PCRE2_ERROR_NOMATCH)
        return false;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        if (e->st == LILY_OK)
            e->st = lily_error_set(e->err, LILY_ERR_TOKENIZER, "pre-tokenizer regex failed: %s", (char *)msg);
        return false;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->match);
    *start = ov[0];
    *end = ov[1];
    return true;
}

/* Where to search after a match ending at end (an empty match moves on by one character). */
static size_t after_match(const char *s, size_t n, size_t start, size_t end)
{
    if (end > start)
        return end;
    size_t i = end + 1;
    while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80)
        i++;
    return i;
}

static void emit(encoder *e, int level, const char *s, size_t start, size_t end)
{
    if (end > start && going(e))
        pre_tokenize(e, level + 1, s + start, end - start);
}

/* HF Split with any behavior: materialize (span, is_match) then fold as normalizer.rs does. */
static void split_general(encoder *e, int level, const tok_pre_step *step, const char *s, size_t n)
{
    size_t cap = 16, count = 0;
    span *spans = malloc(cap * sizeof *spans);
    if (!spans) {
        fail(e, LILY_ERR_OUT_OF_MEMORY, "out of memory");
        return;
    }
    size_t from = 0, prev_end = 0, ms, me;
    for (;;) {
        bool found = next_match(e, step->re, s, n, from, &ms, &me);
        if (count + 2 > cap) {
            cap *= 2;
            span *p = realloc(spans, cap * sizeof *spans);
            if (!p) {
                free(spans);
                fail(e, LILY_ERR_OUT_OF_MEMORY, "out of memory");
                return;
            }
            spans = p;
        }
        if (!found) {
            if (prev_end != n || count == 0)
                spans[count++] = (span){prev_end, n, false};
            break;
        }
        if (ms != prev_end)
            spans[count++] = (span){prev_end, ms, false};
        spans[count++] = (span){ms, me, true};
        prev_end = me;
        from = after_match(s, n, ms, me);
    }
    for (size_t i = 0; i < count; i++)
        spans[i].is_match ^= step->invert;
    size_t out = 0;
    bool previous_match = false;
    switch (step->behavior) {
    case SPLIT_ISOLATED:
        out = count;
        break;
    case SPLIT_REMOVED:
        for (size_t i = 0; i < count; i++)
            if (!spans[i].is_match)
                spans[out++] = spans[i];
        break;
    case SPLIT_MERGED_WITH_PREVIOUS:
    case SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < count; i++) {
            bool merge = step->behavior == SPLIT_CONTIGUOUS ? spans[i].is_match == previous_match
                                                            : spans[i].is_match && !previous_match;
            if (merge && out > 0)
                spans[out - 1].end = spans[i].end;
            else
                spans[out++] = spans[i];
            previous_match = spans[i].is_match;
        }
        break;
    case SPLIT_MERGED_WITH_NEXT: /* the same fold, from the right */
        out = count;
        for (size_t i = count; i-- > 0;) {
            bool merge = spans[i].is_match && !previous_match;
            previous_match = spans[i].is_match;
            if (merge && out < count) {
                spans[out].start = spans[i].start;
            } else {
                spans[--out] = spans[i];
            }
        }
        memmove(spans, spans + out, (count - out) * sizeof *spans);
        out = count - out;
        break;
    }
    for (size_t i = 0; i < out; i++)
        emit(e, level, s, spans[i].start, spans[i].end);
    free(spans);
}

static void pre_tokenize(encoder *e, int level, const char *s, size_t n)
{
    const lily_tokenizer *tok = e->tok;
    if (level == tok->n_steps) {
        bpe_piece(e, s, n);
        return;
    }
    const tok_pre_step *step = &tok->steps[level];
    if (step->kind == PRE_BYTE_LEVEL && step->add_prefix_space && (n == 0 || s[0] != ' ')) {
        if (e->prefix_cap[level] < n + 1) {
            char *p = realloc(e->prefix_buf[level], 2 * n + 16);
            if (!p) {
                fail(e, LILY_ERR_OUT_OF_MEMORY, "out of memory");
                return;
            }
            e->prefix_buf[level] = p;
            e->prefix_cap[level] = 2 * n + 16;
        }
        e->prefix_buf[level][0] = ' ';
        if (n)
            memcpy(e->prefix_buf[level] + 1, s, n);
        s = e->prefix_buf[level];
        n++;
    }
    if (!step->re) {
        emit(e, level, s, 0, n);
        return;
    }
    if (step->behavior != SPLIT_ISOLATED) {
        split_general(e, level, step, s, n);
        return;
    }
    /* Isolated (the common case): every gap and every match is a piece, streamed */
    size_t from = 0, prev_end = 0, ms, me;
    while (going(e) && next_match(e, step->re, s, n, from, &ms, &me)) {
        emit(e, level, s, prev_end, ms);
        emit(e, level, s, ms, me);
        prev_end = me;
        from = after_match(s, n, ms, me);
    }
    emit(e, level, s, prev_end, n);
}

/* ---- added tokens and the normalizer ----------------------------------------------------------------- */

/* Does an added token (of this pass) match at s[i]? Leftmost-longest: tokens are sorted longest first.
 * Returns the token and the span it covers after lstrip / rstrip. */
static const tok_added_token *match_added(const encoder *e, bool normalized_pass, const char *s, size_t n, size_t i,
                                          size_t floor, size_t *start, size_t *end)
{
    const lily_tokenizer *tok = e->tok;
    for (int t = 0; t < tok->n_added; t++) {
        const tok_added_token *a = &tok->added[t];
        if (a->normalized != normalized_pass || (a->special && !e->parse_special))
            continue;
        if (a->len > n - i || memcmp(s + i, a->content, a->len))
            continue;
        size_t b = i, f = i + a->len;
        if (a->single_word) {
            utf8proc_int32_t cp;
            if (b > 0) {
                size_t p = b - 1;
                while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80)
                    p--;
                if (utf8proc_iterate((const utf8proc_uint8_t *)s + p, (utf8proc_ssize_t)(b - p), &cp) > 0 &&
                    is_word_codepoint(cp))
                    continue;
            }
            if (f < n && utf8proc_iterate((const utf8proc_uint8_t *)s + f, (utf8proc_ssize_t)(n - f), &cp) > 0 &&
                is_word_codepoint(cp))
                continue;
        }
        if (a->lstrip) {
            /* back over whitespace, one character at a time, not past the previous match */
            for (;;) {
                size_t p = b;
                if (p <= floor)
                    break;
                p--;
                while (p > floor && ((unsigned char)s[p] & 0xC0) == 0x80)
                    p--;
                int k;
                if (!is_whitespace_at((const unsigned char *)s + p, b - p, &k))
                    break;
                b = p;
            }
        }
        if (a->rstrip) {
            int k;
            while (f < n && is_whitespace_at((const unsigned char *)s + f, n - f, &k))
                f += (size_t)k;
        }
        *start = b;
        *end = f;
        return a;
    }
    return NULL;
}

static void normalized_segment(encoder *e, const char *s, size_t n, bool has_normalized_added);

/* Split s into (text, added token) runs; text goes to the normalizer (raw pass) or the pre-tokenizer. */
static void split_added(encoder *e, bool normalized_pass, const char *s, size_t n)
{
    const lily_tokenizer *tok = e->tok;
    unsigned bit = normalized_pass ? 2 : 1;
    size_t seg = 0;
    bool has_normalized = false;
    for (int b = 0; b < 256 && !normalized_pass; b++)
        has_normalized |= (tok->added_first_byte[b] & 2) != 0;
    for (size_t i = 0; i < n && going(e); i++) {
        if (!(tok->added_first_byte[(unsigned char)s[i]] & bit))
            continue;
        size_t start, end;
        const tok_added_token *a = match_added(e, normalized_pass, s, n, i, seg, &start, &end);
        if (!a)
            continue;
        if (start > seg) {
            if (normalized_pass)
                pre_tokenize(e, 0, s + seg, start - seg);
            else
                normalized_segment(e, s + seg, start - seg, has_normalized);
        }
        push_id(e, a->id);
        seg = end;
        i = end - 1;
    }
    if (seg < n && going(e)) {
        if (normalized_pass)
            pre_tokenize(e, 0, s + seg, n - seg);
        else
            normalized_segment(e, s + seg, n - seg, has_normalized);
    }
}

static void normalized_segment(encoder *e, const char *s, size_t n, bool has_normalized_added)
{
    int options = e->tok->normalize_options;
    char *normalized = NULL;
    size_t normalized_len = 0;
    if (options == (UTF8PROC_STABLE | UTF8PROC_COMPOSE)) {
        lily_status st = tok_nfc_quick(s, n, options, &normalized, &normalized_len, e->err);
        if (st != LILY_OK) {
            e->st = st;
            return;
        }
    } else if (options) {
        bool ascii = true;
        for (size_t i = 0; i < n && ascii; i++)
            ascii = (unsigned char)s[i] < 0x80;
        if (!ascii) {
            utf8proc_uint8_t *out = NULL;
            utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &out, (utf8proc_option_t)options);
            if (m < 0) {
                free(out);
                if (e->st == LILY_OK)
                    e->st = lily_error_set(e->err, m == UTF8PROC_ERROR_NOMEM ? LILY_ERR_OUT_OF_MEMORY : LILY_ERR_TOKENIZER,
                                           "normalizer failed: %s", utf8proc_errmsg(m));
                return;
            }
            normalized = (char *)out;
            normalized_len = (size_t)m;
        }
    }
    if (normalized) {
        s = normalized;
        n = normalized_len;
    }
    if (has_normalized_added)
        split_added(e, true, s, n);
    else
        pre_tokenize(e, 0, s, n);
    free(normalized);
}

lily_status lily_tokenizer_encode_max(const lily_tokenizer *tok, const char *text, size_t len, bool parse_special,
                                      int max_ids, int count_ids, int32_t **ids, int *n_ids, lily_error *err)
{
    *ids = NULL;
    *n_ids = 0;
    size_t valid = utf8_valid_prefix((const unsigned char *)text, len);
    if (valid != len)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "text is not valid UTF-8 (byte %zu of %zu)", valid, len);

    encoder e = {.tok = tok, .parse_special = parse_special, .err = err, .st = LILY_OK,
                 .count_ids = max_ids < 0 ? SIZE_MAX : (size_t)LILY_MAX(count_ids, max_ids),
                 .max_ids = max_ids < 0 ? SIZE_MAX : (size_t)max_ids};
    e.prefix_buf = calloc((size_t)tok->n_steps + 1, sizeof *e.prefix_buf);
    e.prefix_cap = calloc((size_t)tok->n_steps + 1, sizeof *e.prefix_cap);
    e.match = pcre2_match_data_create(1, NULL);
    e.match_ctx = pcre2_match_context_create(NULL);
    e.ids = malloc(256 * sizeof *e.ids);
    e.cap_ids = 256;
    if (!e.prefix_buf || !e.prefix_cap || !e.match || !e.match_ctx || !e.ids)
        fail(&e, LILY_ERR_OUT_OF_MEMORY, "out of memory");
    lily_tokenizer *mut = (lily_tokenizer *)tok; /* only the cache and its lock are written */
    bool locked = pthread_mutex_trylock(&mut->cache_lock) == 0;
    if (locked)
        e.cache = &mut->cache;

    if (e.st == LILY_OK)
        split_added(&e, false, text, len);

    if (locked)
        pthread_mutex_unlock(&mut->cache_lock);
    for (int i = 0; e.prefix_buf && i < tok->n_steps; i++)
        free(e.prefix_buf[i]);
    free(e.prefix_buf);
    free(e.prefix_cap);
    pcre2_match_data_free(e.match);
    pcre2_match_context_free(e.match_ctx);
    free(e.sym);
    free(e.prev);
    free(e.next);
    free(e.rank);
    free(e.heap);
    if (e.st != LILY_OK) {
        free(e.ids);
        return e.st;
    }
    if (e.over) {
        free(e.ids);
        *n_ids = (int)LILY_MIN(e.lower, (size_t)INT32_MAX);
        return LILY_OK;
    }
    if (e.n_ids > INT32_MAX) {
        free(e.ids);
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "text too long: more than 2^31 tokens");
    }
    *ids = e.ids;
    *n_ids = (int)e.n_ids;
    return LILY_OK;
}

lily_status lily_tokenizer_encode(const lily_tokenizer *tok, const char *text, size_t len, bool parse_special,
                                  int32_t **ids, int *n_ids, lily_error *err)
{
    return lily_tokenizer_encode_max(tok, text, len, parse_special, -1, -1, ids, n_ids, err);
}
