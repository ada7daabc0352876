/* tokenizer_load.c — build a lily_tokenizer from tokenizer.json (+ tokenizer_config.json).
 *
 * Owns: reading and validating the JSON (jansson), the vocabulary (converted from the GPT-2 byte-level
 * alphabet back to raw bytes), the merge table, the added tokens, the normalizer / pre-tokenizer /
 * decoder configuration, the eos/bos/pad names, the small queries (token_id, vocab_size, ...) and free.
 * Does not own: encoding (tokenizer_encode.c) or decoding (tokenizer_decode.c).
 */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "base/base.h"
#include "base/file.h"
#include "base/json_load.h"
#include "model/gguf_check.h"
#include "text/tokenizer_internal.h"

/* The largest token id lily loads: the id space is allocated densely (~13 bytes an id), and real
 * vocabularies stay far below (Qwen3.6: 248,320 ids). */
#define LILY_TOKENIZER_MAX_ID ((1 << 24) - 1)

/* GPT-2's pattern, used by a ByteLevel pre-tokenizer with use_regex = true (HF byte_level.rs). */
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- byte-level alphabet ----------------------------------------------------------------------------- */

/* GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to 256, 257, ...
 * in byte order. */
static bool is_printable_byte(unsigned b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
}

uint32_t tok_byte_to_codepoint(uint8_t b)
{
    if (is_printable_byte(b))
        return b;
    uint32_t n = 0;
    for (unsigned x = 0; x < b; x++)
        n += !is_printable_byte(x);
    return 256 + n;
}

static int codepoint_to_byte_table[256 + 68];
static pthread_once_t codepoint_to_byte_once = PTHREAD_ONCE_INIT;

static void build_codepoint_to_byte(void)
{
    for (int i = 0; i < 256 + 68; i++)
        codepoint_to_byte_table[i] = -1;
    for (int b = 0; b < 256; b++)
        codepoint_to_byte_table[tok_byte_to_codepoint((uint8_t)b)] = b;
}

int tok_codepoint_to_byte(uint32_t cp)
{
    pthread_once(&codepoint_to_byte_once, build_codepoint_to_byte);
    return cp < 256 + 68 ? codepoint_to_byte_table[cp] : -1;
}

/* A vocab key in the byte-level alphabet -> raw bytes (out holds at least strlen(key) bytes). Returns the
 * byte count, or -1 when the key has a character outside the alphabet. */
static long byte_level_to_bytes(const char *key, size_t key_len, char *out)
{
    const utf8proc_uint8_t *s = (const utf8proc_uint8_t *)key;
    size_t i = 0;
    long n = 0;
    while (i < key_len) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(s + i, (utf8proc_ssize_t)(key_len - i), &cp);
        if (k <= 0)
            return -1;
        int b = tok_codepoint_to_byte((uint32_t)cp);
        if (b < 0)
            return -1;
        out[n++] = (char)b;
        i += (size_t)k;
    }
    return n;
}

/* ---- hashing ----------------------------------------------------------------------------------------- */

uint64_t tok_hash_bytes(const void *data, size_t len)
{
    const unsigned char *p = data;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 1099511628211ULL;
    h ^= h >> 31;
    h *= 0x9E3779B97F4A7C15ULL;
    h ^= h >> 29;
    return h ? h : 1;
}

static uint64_t hash_pair(uint64_t pair)
{
    pair ^= pair >> 33;
    pair *= 0xff51afd7ed558ccdULL;
    pair ^= pair >> 33;
    pair *= 0xc4ceb9fe1a85ec53ULL;
    pair ^= pair >> 33;
    return pair;
}

static uint32_t pow2_at_least(size_t n)
{
    uint32_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

int32_t tok_vocab_find(const lily_tokenizer *tok, const char *bytes, size_t len)
{
    uint32_t slot = (uint32_t)tok_hash_bytes(bytes, len) & tok->vocab_mask;
    for (;;) {
        int32_t id = tok->vocab_table[slot];
        if (id < 0)
            return -1;
        if ((size_t)tok->token_len[id] == len && !memcmp(tok->token_blob + tok->token_offset[id], bytes, len))
            return id;
        slot = (slot + 1) & tok->vocab_mask;
    }
}

const tok_merge *tok_merge_find(const lily_tokenizer *tok, int32_t left, int32_t right)
{
    uint64_t pair = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    uint32_t slot = (uint32_t)hash_pair(pair) & tok->merge_mask;
    for (;;) {
        const tok_merge *m = &tok->merges[slot];
        if (m->pair == pair)
            return m;
        if (m->pair == TOK_EMPTY_PAIR)
            return NULL;
        slot = (slot + 1) & tok->merge_mask;
    }
}

/* \s as Oniguruma (HF tokenizers' regex engine) and the Unicode White_Space property define it. PCRE2's
 * \s also matches U+180E MONGOLIAN VOWEL SEPARATOR (a format character since Unicode 6.3), which would
 * split text differently from HF, so \s is written out as this set before compiling. */
static const char WHITE_SPACE_ITEMS[] =
    "\\t\\n\\x0b\\f\\r\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";

/* pattern with \s -> [WHITE_SPACE_ITEMS] (the items alone inside a class) and \S -> [^...] outside a
 * class; malloc'd, NUL-terminated. Other escapes and classes are copied as they are. */
static char *expand_white_space(const char *p, size_t n, size_t *out_len)
{
    size_t items = sizeof WHITE_SPACE_ITEMS - 1, cap = n + 1, len = 0;
    for (size_t i = 0; i + 1 < n; i++)
        if (p[i] == '\\')
            cap += items + 3, i++;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char d = p[++i];
            if (d == 's' || (d == 'S' && !in_class)) {
                if (!in_class)
                    out[len++] = '[';
                if (d == 'S')
                    out[len++] = '^';
                memcpy(out + len, WHITE_SPACE_ITEMS, items);
                len += items;
                if (!in_class)
                    out[len++] = ']';
            } else {
                out[len++] = c;
                out[len++] = d;
            }
            continue;
        }
        out[len++] = c;
        if (!in_class && c == '[') {
            in_class = true;
            if (i + 1 < n && p[i + 1] == '^')
                out[len++] = p[++i];
            if (i + 1 < n && p[i + 1] == ']') /* a leading ] is literal */
                out[len++] = p[++i];
        } else if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') {
            while (++i < n) { /* a POSIX class [:name:] inside the class */
                out[len++] = p[i];
                if (p[i] == ']')
                    break;
            }
        } else if (in_class && c == ']') {
            in_class = false;
        }
    }
    out[len] = 0;
    *out_len = len;
    return out;
}

pcre2_code *tok_compile_regex(const char *pattern, size_t len, bool literal, lily_error *err)
{
    int code;
    PCRE2_SIZE offset;
    uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP); /* LITERAL refuses UCP */
    char *expanded = NULL;
    if (!literal) {
        expanded = expand_white_space(pattern, len, &len);
        if (!expanded) {
            lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
            return NULL;
        }
        pattern = expanded;
    }
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, options, &code, &offset, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        lily_error_set(err, LILY_ERR_TOKENIZER, "pre-tokenizer regex rejected by PCRE2 at offset %zu%s: %s",
                       (size_t)offset, expanded ? " (after writing out \\s)" : "", (char *)msg);
        free(expanded);
        return NULL;
    }
    free(expanded);
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional: matching falls back to the interpreter */
    return re;
}

/* ---- JSON helpers ------------------------------------------------------------------------------------ */

static bool json_bool_or(const json_t *obj, const char *key, bool dflt)
{
    json_t *v = json_object_get(obj, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static const char *json_type_name(const json_t *obj)
{
    const char *t = json_string_value(json_object_get(obj, "type"));
    return t ? t : "(no type)";
}

/* ---- the parts of tokenizer.json --------------------------------------------------------------------- */

static lily_status add_normalizer(lily_tokenizer *tok, const json_t *n, lily_error *err)
{
    if (!n || json_is_null(n))
        return LILY_OK;
    const char *type = json_type_name(n);
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(n, "normalizers");
        size_t i;
        const json_t *e;
        if (!json_is_array(list))
            return lily_error_set(err, LILY_ERR_TOKENIZER, "normalizer Sequence has no \"normalizers\" array");
        json_array_foreach(list, i, e) {
            lily_status st = add_normalizer(tok, e, err);
            if (st != LILY_OK)
                return st;
        }
        return LILY_OK;
    }
    int options;
    if (!strcmp(type, "NFC"))
        options = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    else if (!strcmp(type, "NFD"))
        options = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    else if (!strcmp(type, "NFKC"))
        options = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else if (!strcmp(type, "NFKD"))
        options = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    else
        return lily_error_set(err, LILY_ERR_TOKENIZER, "unsupported normalizer type \"%s\"", type);
    if (tok->normalize_options)
        return lily_error_set(err, LILY_ERR_TOKENIZER, "unsupported normalizer: more than one Unicode normal form");
    tok->normalize_options = options;
    return LILY_OK;
}

static lily_status add_pre_step(lily_tokenizer *tok, const tok_pre_step *step, lily_error *err)
{
    tok_pre_step *s = realloc(tok->steps, (size_t)(tok->n_steps + 1) * sizeof *s);
    if (!s)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
    tok->steps = s;
    tok->steps[tok->n_steps++] = *step;
    return LILY_OK;
}

static lily_status add_pre_tokenizer(lily_tokenizer *tok, const json_t *p, lily_error *err)
{
    if (!p || json_is_null(p))
        return LILY_OK;
    const char *type = json_type_name(p);
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(p, "pretokenizers");
        size_t i;
        const json_t *e;
        if (!json_is_array(list))
            return lily_error_set(err, LILY_ERR_TOKENIZER, "pre_tokenizer Sequence has no \"pretokenizers\" array");
        json_array_foreach(list, i, e) {
            lily_status st = add_pre_tokenizer(tok, e, err);
            if (st != LILY_OK)
                return st;
        }
        return LILY_OK;
    }
    tok_pre_step step = {0};
    if (!strcmp(type, "Split")) {
        const json_t *pattern = json_object_get(p, "pattern");
        const char *regex = json_string_value(json_object_get(pattern, "Regex"));
        const char *literal = json_string_value(json_object_get(pattern, "String"));
        if (!regex && !literal)
            return lily_error_set(err, LILY_ERR_TOKENIZER, "pre_tokenizer Split has no pattern {\"Regex\"} or {\"String\"}");
        const char *behavior = json_string_value(json_object_get(p, "behavior"));
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        int b = -1;
        for (int i = 0; i < 5 && behavior; i++)
            if (!strcmp(behavior, names[i]))
                b = i;
        if (b < 0)
            return lily_error_set(err, LILY_ERR_TOKENIZER, "pre_tokenizer Split: unknown behavior \"%s\"",
                                  behavior ? behavior : "(none)");
        step.kind = PRE_SPLIT;
        step.behavior = (tok_split_behavior)b;
        step.invert = json_bool_or(p, "invert", false);
        const json_t *pj = json_object_get(pattern, regex ? "Regex" : "String");
        step.re = tok_compile_regex(json_string_value(pj), json_string_length(pj), !regex, err);
        if (!step.re)
            return LILY_ERR_TOKENIZER;
    } else if (!strcmp(type, "ByteLevel")) {
        step.kind = PRE_BYTE_LEVEL;
        step.add_prefix_space = json_bool_or(p, "add_prefix_space", true);
        step.behavior = SPLIT_ISOLATED;
        if (json_bool_or(p, "use_regex", true)) {
            step.re = tok_compile_regex(GPT2_PATTERN, sizeof GPT2_PATTERN - 1, false, err);
            if (!step.re)
                return LILY_ERR_TOKENIZER;
        }
    } else {
        return lily_error_set(err, LILY_ERR_TOKENIZER, "unsupported pre_tokenizer type \"%s\"", type);
    }
    lily_status st = add_pre_step(tok, &step, err);
    if (st != LILY_OK && step.re)
        pcre2_code_free(step.re);
    return st;
}

static lily_status check_decoder(const json_t *d, bool *byte_level, lily_error *err)
{
    if (!d || json_is_null(d))
        return LILY_OK;
    const char *type = json_type_name(d);
    if (!strcmp(type, "ByteLevel")) {
        *byte_level = true;
        return LILY_OK;
    }
    if (!strcmp(type, "Sequence")) {
        size_t i;
        const json_t *e;
        json_array_foreach(json_object_get(d, "decoders"), i, e) {
            lily_status st = check_decoder(e, byte_level, err);
            if (st != LILY_OK)
                return st;
        }
        return LILY_OK;
    }
    return lily_error_set(err, LILY_ERR_TOKENIZER, "unsupported decoder type \"%s\" (lily decodes ByteLevel only)", type);
}

static int cmp_added_longest_first(const void *a, const void *b)
{
    const tok_added_token *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id - y->id;
}

/* Store the bytes of id (holes stay -1). blob has room: sized from the JSON up front. */
static lily_status set_token_bytes(lily_tokenizer *tok, int32_t id, const char *bytes, size_t len, size_t *blob_used,
                                   lily_error *err)
{
    if (tok->token_len[id] >= 0 && !(tok->token_flags[id] & TOK_FLAG_ADDED))
        return lily_error_set(err, LILY_ERR_TOKENIZER, "model.vocab: id %d appears twice", (int)id);
    memcpy(tok->token_blob + *blob_used, bytes, len);
    tok->token_offset[id] = (uint32_t)*blob_used;
    tok->token_len[id] = (int32_t)len;
    *blob_used += len;
    return LILY_OK;
}

/* model.vocab into the token table: byte-level keys -> raw bytes; keys outside the alphabet keep their
 * UTF-8 (HF's decoder does the same) and cannot be produced by BPE, so they stay out of the lookup table.
 * Then the id of every single byte. */
static lily_status load_vocab(lily_tokenizer *tok, json_t *vocab, size_t *blob_used, lily_error *err)
{
    const char *key;
    json_t *value;
    uint32_t longest[256] = {0};
    json_object_foreach(vocab, key, value) {
        int32_t id = (int32_t)json_integer_value(value);
        size_t key_len = strlen(key);
        long nb = byte_level_to_bytes(key, key_len, tok->token_blob + *blob_used);
        const char *bytes = tok->token_blob + *blob_used;
        lily_status st = nb >= 0 ? set_token_bytes(tok, id, bytes, (size_t)nb, blob_used, err)
                                 : set_token_bytes(tok, id, key, key_len, blob_used, err);
        if (st != LILY_OK)
            return st;
        if (nb < 0)
            continue;
        for (long i = 0; i < nb; i++) { /* m(b) for bpe_byte_weight: the longest entry holding each byte */
            unsigned char b = (unsigned char)tok->token_blob[tok->token_offset[id] + (size_t)i];
            longest[b] = LILY_MAX(longest[b], (uint32_t)nb);
        }
        uint32_t slot = (uint32_t)tok_hash_bytes(tok->token_blob + tok->token_offset[id], (size_t)nb) & tok->vocab_mask;
        while (tok->vocab_table[slot] >= 0)
            slot = (slot + 1) & tok->vocab_mask;
        tok->vocab_table[slot] = id;
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        tok->byte_id[b] = tok_vocab_find(tok, &c, 1);
        tok->bpe_byte_weight[b] = tok->byte_id[b] >= 0 && longest[b] ? TOK_BYTE_WEIGHT_ONE / longest[b] : 0;
    }
    return LILY_OK;
}

/* model.merges into the merge table: rank = position; a repeated pair keeps its last rank (as HF's
 * HashMap collect does). Either JSON form: "a b" strings or ["a", "b"] pairs. */
static lily_status load_merges(lily_tokenizer *tok, const json_t *merges, json_t *vocab, lily_error *err)
{
    size_t i;
    const json_t *e;
    size_t n_merges = json_array_size(merges);
    tok->merge_mask = pow2_at_least(2 * n_merges + 2) - 1;
    tok->merges = malloc(((size_t)tok->merge_mask + 1) * sizeof *tok->merges);
    if (!tok->merges)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory for %zu merges", n_merges);
    for (size_t s = 0; s <= tok->merge_mask; s++)
        tok->merges[s].pair = TOK_EMPTY_PAIR;
    char *joined = NULL;
    size_t joined_cap = 0;
    lily_status st = LILY_OK;
    json_array_foreach(merges, i, e) {
        const char *left, *right;
        size_t left_len, right_len;
        if (json_is_string(e)) {
            left = json_string_value(e);
            const char *space = strchr(left, ' ');
            if (!space || strchr(space + 1, ' ')) {
                st = lily_error_set(err, LILY_ERR_TOKENIZER, "model.merges[%zu] \"%.60s\" is not two tokens separated by one space", i, left);
                break;
            }
            left_len = (size_t)(space - left);
            right = space + 1;
            right_len = strlen(right);
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            left = json_string_value(json_array_get(e, 0));
            left_len = json_string_length(json_array_get(e, 0));
            right = json_string_value(json_array_get(e, 1));
            right_len = json_string_length(json_array_get(e, 1));
        } else {
            st = lily_error_set(err, LILY_ERR_TOKENIZER, "model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", i);
            break;
        }
        if (left_len + right_len + 1 > joined_cap) {
            joined_cap = 2 * (left_len + right_len + 1);
            char *j = realloc(joined, joined_cap);
            if (!j) {
                st = lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
                break;
            }
            joined = j;
        }
        memcpy(joined, left, left_len);
        memcpy(joined + left_len, right, right_len);
        joined[left_len + right_len] = 0;
        const json_t *merged_id = json_object_get(vocab, joined);
        joined[left_len] = 0;
        const json_t *left_id = json_object_get(vocab, joined);
        const json_t *right_id = json_object_get(vocab, right);
        if (!left_id || !right_id || !merged_id) {
            joined[left_len] = right[0];
            st = lily_error_set(err, LILY_ERR_TOKENIZER, "model.merges[%zu] (\"%.*s\" + \"%.60s\"): %s is not in the vocab", i,
                                (int)LILY_MIN(left_len, 60), left, right,
                                !left_id ? "the left token" : !right_id ? "the right token" : "the merged token");
            break;
        }
        int32_t l = (int32_t)json_integer_value(left_id), r = (int32_t)json_integer_value(right_id);
        uint64_t pair = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
        uint32_t slot = (uint32_t)hash_pair(pair) & tok->merge_mask;
        while (tok->merges[slot].pair != TOK_EMPTY_PAIR && tok->merges[slot].pair != pair)
            slot = (slot + 1) & tok->merge_mask;
        tok->merges[slot] = (tok_merge){pair, (int32_t)i, (int32_t)json_integer_value(merged_id)};
    }
    free(joined);
    return st;
}

/* added_tokens, content verbatim, with their flags; an added token overrides the vocab's entry for its
 * id. Sorted longest first for the leftmost-longest split. */
static lily_status load_added_tokens(lily_tokenizer *tok, const json_t *added, size_t *blob_used, lily_error *err)
{
    size_t i;
    const json_t *e;
    tok->n_added = (int)json_array_size(added);
    tok->added = calloc((size_t)tok->n_added + 1, sizeof *tok->added);
    if (!tok->added)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
    json_array_foreach(added, i, e) {
        tok_added_token *a = &tok->added[i];
        const json_t *content = json_object_get(e, "content");
        a->id = (int32_t)json_integer_value(json_object_get(e, "id"));
        a->len = json_string_length(content);
        a->content = malloc(a->len + 1);
        if (!a->content)
            return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
        memcpy(a->content, json_string_value(content), a->len + 1);
        a->special = json_bool_or(e, "special", false);
        a->normalized = json_bool_or(e, "normalized", !a->special);
        a->lstrip = json_bool_or(e, "lstrip", false);
        a->rstrip = json_bool_or(e, "rstrip", false);
        a->single_word = json_bool_or(e, "single_word", false);
        /* an added token overrides whatever the vocab has for its id */
        tok->token_len[a->id] = -1;
        tok->token_flags[a->id] = TOK_FLAG_ADDED | (a->special ? TOK_FLAG_SPECIAL : 0);
        lily_status st = set_token_bytes(tok, a->id, a->content, a->len, blob_used, err);
        if (st != LILY_OK)
            return st;
        tok->added_first_byte[(unsigned char)a->content[0]] |= a->normalized ? 2 : 1;
    }
    qsort(tok->added, (size_t)tok->n_added, sizeof *tok->added, cmp_added_longest_first);
    return LILY_OK;
}

/* tokenizer.json's "model" (byte-level BPE) and "added_tokens": check the options lily implements, size
 * the id space and the byte blob, then load_vocab, load_merges and load_added_tokens fill them. */
static lily_status load_model(lily_tokenizer *tok, const json_t *root, lily_error *err)
{
    const json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return lily_error_set(err, LILY_ERR_TOKENIZER, "no \"model\" object");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (type && strcmp(type, "BPE"))
        return lily_error_set(err, LILY_ERR_TOKENIZER, "unsupported model type \"%s\" (lily implements byte-level BPE)", type);
    const char *prefix = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    const char *suffix = json_string_value(json_object_get(model, "end_of_word_suffix"));
    if ((prefix && *prefix) || (suffix && *suffix))
        return lily_error_set(err, LILY_ERR_TOKENIZER, "unsupported BPE option: continuing_subword_prefix / end_of_word_suffix");
    tok->ignore_merges = json_bool_or(model, "ignore_merges", false);

    json_t *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges");
    const json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab))
        return lily_error_set(err, LILY_ERR_TOKENIZER, "model.vocab is missing or not an object");
    if (!json_is_array(merges))
        return lily_error_set(err, LILY_ERR_TOKENIZER, "model.merges is missing or not an array");
    if (added && !json_is_array(added))
        return lily_error_set(err, LILY_ERR_TOKENIZER, "added_tokens is not an array");

    /* the id space and the blob size */
    int64_t max_id = -1;
    size_t blob_size = 1;
    const char *key;
    json_t *value;
    json_object_foreach(vocab, key, value) {
        if (!json_is_integer(value) || json_integer_value(value) < 0)
            return lily_error_set(err, LILY_ERR_TOKENIZER, "model.vocab[\"%.60s\"] is not a valid id", key);
        if (json_integer_value(value) > LILY_TOKENIZER_MAX_ID)
            return lily_error_set(err, LILY_ERR_TOKENIZER, "model.vocab[\"%.60s\"]: id %lld is larger than %d",
                                  key, (long long)json_integer_value(value), LILY_TOKENIZER_MAX_ID);
        max_id = LILY_MAX(max_id, json_integer_value(value));
        blob_size += strlen(key);
    }
    size_t i;
    const json_t *e;
    json_array_foreach(added, i, e) {
        const json_t *id = json_object_get(e, "id");
        const json_t *content = json_object_get(e, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || !json_is_string(content) ||
            json_string_length(content) == 0)
            return lily_error_set(err, LILY_ERR_TOKENIZER, "added_tokens[%zu] needs an \"id\" >= 0 and a non-empty \"content\"", i);
        if (json_integer_value(id) > LILY_TOKENIZER_MAX_ID)
            return lily_error_set(err, LILY_ERR_TOKENIZER, "added_tokens[%zu]: id %lld is larger than %d", i,
                                  (long long)json_integer_value(id), LILY_TOKENIZER_MAX_ID);
        max_id = LILY_MAX(max_id, json_integer_value(id));
        blob_size += json_string_length(content);
    }
    if (max_id < 0)
        return lily_error_set(err, LILY_ERR_TOKENIZER, "the vocabulary is empty");
    tok->vocab_size = (int32_t)(max_id + 1);
    size_t n = (size_t)tok->vocab_size;
    tok->token_offset = calloc(n, sizeof *tok->token_offset);
    tok->token_len = malloc(n * sizeof *tok->token_len);
    tok->token_flags = calloc(n, 1);
    tok->token_blob = malloc(blob_size);
    tok->vocab_mask = pow2_at_least(2 * json_object_size(vocab)) - 1;
    tok->vocab_table = malloc(((size_t)tok->vocab_mask + 1) * sizeof *tok->vocab_table);
    if (!tok->token_offset || !tok->token_len || !tok->token_flags || !tok->token_blob || !tok->vocab_table)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory for a vocabulary of %zu ids", n);
    memset(tok->token_len, 0xff, n * sizeof *tok->token_len);
    memset(tok->vocab_table, 0xff, ((size_t)tok->vocab_mask + 1) * sizeof *tok->vocab_table);

    size_t blob_used = 0;
    lily_status st = load_vocab(tok, vocab, &blob_used, err);
    if (st == LILY_OK)
        st = load_merges(tok, merges, vocab, err);
    if (st == LILY_OK)
        st = load_added_tokens(tok, added, &blob_used, err);
    return st;
}

/* tokenizer_config.json's eos_token etc.: a string or {"content": ...}. */
static int32_t config_token_id(const lily_tokenizer *tok, const json_t *config, const char *key)
{
    const json_t *v = json_object_get(config, key);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    const char *name = json_string_value(v);
    return name ? lily_tokenizer_token_id(tok, name) : -1;
}

/* Parse a JSON file read whole (json_load_file reads it a character at a time: 3x slower on 11 MB). */
static lily_status load_json(const char *path, json_t **out, lily_error *err)
{
    *out = NULL;
    char *buf;
    size_t size;
    lily_status st = lily_check_regular_file(path, err);
    if (st == LILY_OK)
        st = lily_read_file(path, 0, &buf, &size, err);
    if (st == LILY_ERR_IO) { /* "PATH: cannot open (reason)": a tokenizer error to the caller */
        if (err)
            err->status = LILY_ERR_TOKENIZER;
        return LILY_ERR_TOKENIZER;
    }
    if (st != LILY_OK)
        return st;
    json_error_t jerr;
    *out = lily_json_loadb(buf, size, 0, &jerr);
    free(buf);
    if (*out)
        return LILY_OK;
    return lily_error_set(err, LILY_ERR_TOKENIZER, "%s: malformed JSON at line %d column %d: %s", path, jerr.line,
                          jerr.column, jerr.text);
}

lily_status lily_tokenizer_load(const char *path, lily_tokenizer **out, lily_error *err)
{
    *out = NULL;
    if (!path)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "tokenizer path is NULL");
    lily_status gst = lily_check_not_gguf(path, err);
    if (gst != LILY_OK)
        return gst;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return lily_error_set(err, LILY_ERR_TOKENIZER, "%s: cannot open (%s); expected a model directory holding tokenizer.json",
                              path, strerror(errno));
    bool is_dir = S_ISDIR(sb.st_mode);
    size_t plen = strlen(path);
    char *file = malloc(plen + 32), *config_file = malloc(plen + 32);
    if (!file || !config_file) {
        free(file);
        free(config_file);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
    }
    if (is_dir) {
        snprintf(file, plen + 32, "%s/tokenizer.json", path);
        snprintf(config_file, plen + 32, "%s/tokenizer_config.json", path);
    } else {
        memcpy(file, path, plen + 1);
        const char *slash = strrchr(path, '/');
        if (slash)
            snprintf(config_file, plen + 32, "%.*s/tokenizer_config.json", (int)(slash - path), path);
        else
            snprintf(config_file, plen + 32, "tokenizer_config.json");
    }

    json_t *root = NULL;
    lily_tokenizer *tok = calloc(1, sizeof *tok);
    lily_status st = tok ? LILY_OK : lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
    if (tok) {
        pthread_mutex_init(&tok->cache_lock, NULL);
        tok->eos_id = tok->bos_id = tok->pad_id = -1;
    }
    if (st == LILY_OK)
        st = load_json(file, &root, err);
    if (st == LILY_OK && !json_is_object(root))
        st = lily_error_set(err, LILY_ERR_TOKENIZER, "%s: not a JSON object", file);
    if (st == LILY_OK)
        st = load_model(tok, root, err);
    if (st == LILY_OK)
        st = add_normalizer(tok, json_object_get(root, "normalizer"), err);
    if (st == LILY_OK)
        st = add_pre_tokenizer(tok, json_object_get(root, "pre_tokenizer"), err);
    bool decoder_byte_level = false;
    if (st == LILY_OK)
        st = check_decoder(json_object_get(root, "decoder"), &decoder_byte_level, err);
    if (st == LILY_OK) {
        bool pre_byte_level = false;
        for (int i = 0; i < tok->n_steps; i++)
            pre_byte_level |= tok->steps[i].kind == PRE_BYTE_LEVEL;
        if (!pre_byte_level || !decoder_byte_level)
            st = lily_error_set(err, LILY_ERR_TOKENIZER,
                                "not a byte-level BPE tokenizer (needs a ByteLevel pre_tokenizer and decoder)");
    }
    if (st != LILY_OK && tok && err && err->status == st && strncmp(err->message, file, strlen(file)))
        lily_error_prefix(err, "%s", file);
    json_decref(root);

    if (st == LILY_OK) {
        json_t *config = NULL;
        if (stat(config_file, &sb) == 0) {
            lily_error cerr;
            st = load_json(config_file, &config, err ? err : &cerr);
        }
        if (config) {
            tok->eos_id = config_token_id(tok, config, "eos_token");
            tok->bos_id = config_token_id(tok, config, "bos_token");
            tok->pad_id = config_token_id(tok, config, "pad_token");
            json_decref(config);
        }
    }
    free(file);
    free(config_file);
    if (st != LILY_OK) {
        lily_tokenizer_free(tok);
        return st;
    }
    *out = tok;
    return LILY_OK;
}

void tok_cache_free(tok_cache *c)
{
    free(c->hash);
    free(c->key_offset);
    free(c->key_len);
    free(c->ids_offset);
    free(c->ids_len);
    free(c->keys);
    free(c->ids);
    memset(c, 0, sizeof *c);
}

void lily_tokenizer_free(lily_tokenizer *tok)
{
    if (!tok)
        return;
    free(tok->token_offset);
    free(tok->token_len);
    free(tok->token_blob);
    free(tok->token_flags);
    free(tok->vocab_table);
    free(tok->merges);
    for (int i = 0; tok->added && i < tok->n_added; i++)
        free(tok->added[i].content);
    free(tok->added);
    for (int i = 0; i < tok->n_steps; i++)
        pcre2_code_free(tok->steps[i].re);
    free(tok->steps);
    tok_cache_free(&tok->cache);
    pthread_mutex_destroy(&tok->cache_lock);
    free(tok);
}

lily_status lily_tokenizer_set_pretokenize_regex(lily_tokenizer *tok, const char *pattern, lily_error *err)
{
    for (int i = 0; i < tok->n_steps; i++) {
        if (tok->steps[i].kind != PRE_SPLIT)
            continue;
        pcre2_code *re = tok_compile_regex(pattern, strlen(pattern), false, err);
        if (!re)
            return LILY_ERR_TOKENIZER;
        pcre2_code_free(tok->steps[i].re);
        tok->steps[i].re = re;
        tok_cache_free(&tok->cache);
        return LILY_OK;
    }
    return lily_error_set(err, LILY_ERR_TOKENIZER, "the tokenizer has no Split pre-tokenizer whose regex could be replaced");
}

int32_t lily_tokenizer_token_id(const lily_tokenizer *tok, const char *token)
{
    size_t len = strlen(token);
    for (int i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == len && !memcmp(tok->added[i].content, token, len))
            return tok->added[i].id;
    char *bytes = malloc(len + 1);
    if (!bytes)
        return -1;
    long nb = byte_level_to_bytes(token, len, bytes);
    int32_t id = nb > 0 ? tok_vocab_find(tok, bytes, (size_t)nb) : -1;
    free(bytes);
    return id;
}

const char *lily_tokenizer_token_bytes(const lily_tokenizer *tok, int32_t id, size_t *len)
{
    if (id < 0 || id >= tok->vocab_size || tok->token_len[id] < 0)
        return NULL;
    *len = (size_t)tok->token_len[id];
    return tok->token_blob + tok->token_offset[id];
}

bool lily_tokenizer_is_special(const lily_tokenizer *tok, int32_t id)
{
    return id >= 0 && id < tok->vocab_size && (tok->token_flags[id] & TOK_FLAG_SPECIAL);
}

int32_t lily_tokenizer_vocab_size(const lily_tokenizer *tok) { return tok->vocab_size; }
int32_t lily_tokenizer_eos_id(const lily_tokenizer *tok) { return tok->eos_id; }
int32_t lily_tokenizer_bos_id(const lily_tokenizer *tok) { return tok->bos_id; }
int32_t lily_tokenizer_pad_id(const lily_tokenizer *tok) { return tok->pad_id; }
