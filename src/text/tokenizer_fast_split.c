/* tokenizer_fast_split.c — a hand-written matcher for the Qwen2/3 and Qwen3.5 Split regexes.
 *
 * Owns: recognizing those two patterns (exact text) and finding, at a position, the end of the match
 * PCRE2 would find there. The result must equal PCRE2's on every input: \p{L}, \p{N} and \p{M} are taken
 * from PCRE2 itself, one code point at a time, \s is the White_Space set tok_compile_regex writes into the
 * pattern, and tests/test_tokenizer.c compares both paths on the parity corpus and on random strings. Any
 * other pattern runs in PCRE2.
 *
 * The patterns, alternatives tried in order at each position (Qwen3.5 adds \p{M} where marked):
 *   A1 (?i:'s|'t|'re|'ve|'m|'ll|'d)
 *   A2 [^\r\n\p{L}\p{N}]?\p{L}+              Qwen3.5: [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+
 *   A3 \p{N}
 *   A4  ?[^\s\p{L}\p{N}]+[\r\n]*             Qwen3.5: [^\s\p{L}\p{M}\p{N}]
 *   A5 \s*[\r\n]+
 *   A6 \s+(?!\S)
 *   A7 \s+
 * Every character starts a match (a letter A2, a number A3, whitespace A5-A7, anything else A4), so the
 * matches tile the text and the matcher only needs the end of the match starting at a position.
 */
#include <pthread.h>
#include <string.h>

#include "text/tokenizer_internal.h"

static const char QWEN2_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN35_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

tok_fast_split tok_fast_split_for(const char *pattern, size_t len)
{
    if (len == sizeof QWEN2_PATTERN - 1 && !memcmp(pattern, QWEN2_PATTERN, len))
        return FAST_SPLIT_QWEN2;
    if (len == sizeof QWEN35_PATTERN - 1 && !memcmp(pattern, QWEN35_PATTERN, len))
        return FAST_SPLIT_QWEN35;
    return FAST_SPLIT_NONE;
}

/* ---- character classes, as PCRE2 (UTF + UCP) sees them ------------------------------------------------ */

enum { CLASS_L = 1, CLASS_N = 2, CLASS_M = 4, CLASS_S = 8, CLASS_KNOWN = 128 };

#define CLASS_TABLE_SIZE 0x110000
static uint8_t class_table[CLASS_TABLE_SIZE]; /* 0 = not yet asked; racing writers store the same value */
static pcre2_code *class_re[3];               /* \p{L}, \p{N}, \p{M}, anchored */
static pcre2_match_data *class_match;
static pthread_mutex_t class_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t class_once = PTHREAD_ONCE_INIT;

static void class_init(void)
{
    static const char *const patterns[3] = {"\\p{L}", "\\p{N}", "\\p{M}"};
    for (int i = 0; i < 3; i++) {
        int code;
        PCRE2_SIZE offset;
        class_re[i] = pcre2_compile((PCRE2_SPTR)patterns[i], PCRE2_ZERO_TERMINATED,
                                    PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &code, &offset, NULL);
    }
    class_match = pcre2_match_data_create(1, NULL);
}

static unsigned classify_slow(uint32_t cp)
{
    pthread_once(&class_once, class_init);
    unsigned char buf[4];
    size_t n;
    if (cp < 0x80) {
        buf[0] = (unsigned char)cp;
        n = 1;
    } else if (cp < 0x800) {
        buf[0] = (unsigned char)(0xC0 | cp >> 6);
        buf[1] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        buf[0] = (unsigned char)(0xE0 | cp >> 12);
        buf[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        buf[2] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        buf[0] = (unsigned char)(0xF0 | cp >> 18);
        buf[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        buf[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        buf[3] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    unsigned c = CLASS_KNOWN;
    pthread_mutex_lock(&class_lock); /* one match-data block for all threads: first sightings only */
    for (int i = 0; i < 3; i++)
        if (class_re[i] && pcre2_match(class_re[i], buf, n, 0, PCRE2_NO_UTF_CHECK, class_match, NULL) >= 0)
            c |= 1u << i;
    pthread_mutex_unlock(&class_lock);
    /* \s: Unicode White_Space, the set tok_compile_regex writes out for PCRE2 */
    if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
        (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000)
        c |= CLASS_S;
    return c;
}

static inline unsigned classify(uint32_t cp)
{
    unsigned c = __atomic_load_n(&class_table[cp], __ATOMIC_RELAXED);
    if (!c) {
        c = classify_slow(cp);
        __atomic_store_n(&class_table[cp], (uint8_t)c, __ATOMIC_RELAXED);
    }
    return c;
}

/* Decode the (valid) UTF-8 character at s[i]; *k = its length. */
static inline uint32_t decode_at(const unsigned char *s, size_t i, size_t *k)
{
    unsigned c = s[i];
    if (c < 0x80) {
        *k = 1;
        return c;
    }
    if (c < 0xE0) {
        *k = 2;
        return (c & 0x1F) << 6 | (s[i + 1] & 0x3F);
    }
    if (c < 0xF0) {
        *k = 3;
        return (c & 0x0F) << 12 | (s[i + 1] & 0x3F) << 6 | (s[i + 2] & 0x3F);
    }
    *k = 4;
    return (c & 0x07) << 18 | (s[i + 1] & 0x3F) << 12 | (s[i + 2] & 0x3F) << 6 | (s[i + 3] & 0x3F);
}

/* A1 at s[i] == '\'': the end of the contraction, or 0. Caseless as PCRE2 with UCP: 's' also matches
 * U+017F LATIN SMALL LETTER LONG S. */
static size_t contraction_end(const unsigned char *s, size_t n, size_t i)
{
    if (i + 1 >= n)
        return 0;
    unsigned c = s[i + 1] | 0x20; /* ASCII lower case (non-letters never match below) */
    if (c == 's' || c == 't' || c == 'm' || c == 'd')
        return s[i + 1] == c || s[i + 1] == (c & ~0x20u) ? i + 2 : 0;
    if (s[i + 1] == 0xC5 && i + 2 < n && s[i + 2] == 0xBF)
        return i + 3;
    if (i + 2 >= n || !((s[i + 1] >= 'A' && s[i + 1] <= 'Z') || (s[i + 1] >= 'a' && s[i + 1] <= 'z')))
        return 0;
    unsigned c2 = s[i + 2] | 0x20;
    bool letter2 = (s[i + 2] >= 'A' && s[i + 2] <= 'Z') || (s[i + 2] >= 'a' && s[i + 2] <= 'z');
    if (letter2 && ((c == 'r' && c2 == 'e') || (c == 'v' && c2 == 'e') || (c == 'l' && c2 == 'l')))
        return i + 3;
    return 0;
}

size_t tok_fast_split_match(tok_fast_split kind, const char *text, size_t n, size_t i)
{
    const unsigned char *s = (const unsigned char *)text;
    const unsigned letter = kind == FAST_SPLIT_QWEN35 ? CLASS_L | CLASS_M : CLASS_L;
    const unsigned not_punct = kind == FAST_SPLIT_QWEN35 ? CLASS_S | CLASS_L | CLASS_M | CLASS_N
                                                         : CLASS_S | CLASS_L | CLASS_N;
    if (s[i] == '\'') {
        size_t end = contraction_end(s, n, i);
        if (end)
            return end;
    }
    size_t k0, k;
    uint32_t cp0 = decode_at(s, i, &k0);
    unsigned c0 = classify(cp0);
    /* A2: an optional leading character, then a letter run */
    size_t j = i;
    if (!(c0 & (CLASS_L | CLASS_N)) && cp0 != '\r' && cp0 != '\n' && i + k0 < n &&
        (classify(decode_at(s, i + k0, &k)) & letter))
        j = i + k0;
    else if (!(c0 & letter))
        j = SIZE_MAX;
    if (j != SIZE_MAX) {
        while (j < n) {
            uint32_t cp = decode_at(s, j, &k);
            if (!(classify(cp) & letter))
                break;
            j += k;
        }
        return j;
    }
    /* A3 */
    if (c0 & CLASS_N)
        return i + k0;
    /* A4: an optional space, a run of "punctuation", trailing newlines */
    j = i + (s[i] == ' ' ? 1 : 0);
    size_t run = j;
    while (run < n) {
        uint32_t cp = decode_at(s, run, &k);
        if (classify(cp) & not_punct)
            break;
        run += k;
    }
    if (run > j) {
        while (run < n && (s[run] == '\r' || s[run] == '\n'))
            run++;
        return run;
    }
    /* c0 is whitespace here: A5 up to the last newline of the run, else A6 / A7 */
    size_t end = i, last_newline = SIZE_MAX, last_start = i;
    while (end < n) {
        uint32_t cp = decode_at(s, end, &k);
        if (!(classify(cp) & CLASS_S))
            break;
        if (cp == '\r' || cp == '\n')
            last_newline = end;
        last_start = end;
        end += k;
    }
    if (end == i) /* cannot happen: every character matches one of A2-A7; be safe */
        return i + k0;
    if (last_newline != SIZE_MAX)
        return last_newline + 1;
    if (end == n || last_start == i)
        return end;
    return last_start; /* \s+(?!\S): leave the last whitespace character to the next match */
}
