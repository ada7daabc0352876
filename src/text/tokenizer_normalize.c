/* tokenizer_normalize.c — NFC for the tokenizer, skipping the text NFC cannot change.
 *
 * Owns: the NFC quick check (which characters are "inert") and normalizing only the regions around
 * characters that are not. utf8proc does the normalizing itself.
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/base.h"
#include "text/tokenizer_internal.h"

/* A character is "inert" when it is a starter (canonical combining class 0), is its own NFC, and never
 * composes with a character before it. NFC leaves a run of text unchanged up to the next inert character
 * whatever follows it, so text is normalized only between the inert character before a non-inert one and
 * the next inert one; all other text (nearly all real text) is copied through untouched. */

/* Starters that are the second half of a canonical composition (UnicodeData 14: every two-character
 * canonical decomposition whose second character has class 0), besides Hangul V and T jamo. */
static const uint32_t COMPOSING_STARTERS[] = {
    0x09BE, 0x09D7, 0x0B3E, 0x0B56, 0x0B57, 0x0BBE, 0x0BD7, 0x0CC2, 0x0CD5, 0x0CD6, 0x0D3E, 0x0D57, 0x0DCF,
    0x0DDF, 0x0FB5, 0x0FB7, 0x102E, 0x1B35, 0x11127, 0x1133E, 0x11357, 0x114B0, 0x114BA, 0x114BD, 0x115AF, 0x11930,
};

#define INERT_TABLE_SIZE 0x40000
static uint8_t inert_table[INERT_TABLE_SIZE]; /* 0 unknown, 1 inert, 2 not inert; racing writers agree */

static bool compute_inert(utf8proc_int32_t cp, int options)
{
    if (utf8proc_get_property(cp)->combining_class != 0)
        return false;
    if ((cp >= 0x1161 && cp <= 0x1175) || (cp >= 0x11A8 && cp <= 0x11C2))
        return false;
    for (size_t i = 0; i < sizeof COMPOSING_STARTERS / sizeof COMPOSING_STARTERS[0]; i++)
        if ((uint32_t)cp == COMPOSING_STARTERS[i])
            return false;
    utf8proc_uint8_t buf[8], *out = NULL;
    utf8proc_ssize_t n = utf8proc_encode_char(cp, buf);
    utf8proc_ssize_t m = utf8proc_map(buf, n, &out, (utf8proc_option_t)options);
    bool same = m == n && !memcmp(out, buf, (size_t)n);
    free(out);
    return same;
}

static bool is_inert(utf8proc_int32_t cp, int options)
{
    if (cp < 0x300)
        return true;
    if (cp >= INERT_TABLE_SIZE)
        return compute_inert(cp, options);
    uint8_t v = __atomic_load_n(&inert_table[cp], __ATOMIC_RELAXED);
    if (!v) {
        v = compute_inert(cp, options) ? 1 : 2;
        __atomic_store_n(&inert_table[cp], v, __ATOMIC_RELAXED);
    }
    return v == 1;
}

/* Append bytes to a growing buffer; false on OOM. */
static bool append(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (n == 0)
        return true;
    if (*len + n > *cap) {
        size_t c = LILY_MAX(2 * *cap, *len + n + 64);
        char *p = realloc(*buf, c);
        if (!p)
            return false;
        *buf = p;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    return true;
}

/* NFC of s (valid UTF-8) into *out (malloc'd, *out_len bytes); *out stays NULL when s is already NFC. */
lily_status tok_nfc_quick(const char *s, size_t n, int options, char **out, size_t *out_len, lily_error *err)
{
    *out = NULL;
    size_t cap = 0, len = 0, copied = 0; /* s[0 .. copied) is already in out */
    size_t last_inert = 0;               /* start of the last inert character seen */
    size_t i = 0;
    while (i < n) {
        if ((unsigned char)s[i] < 0x80) {
            last_inert = i++;
            continue;
        }
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (is_inert(cp, options)) {
            last_inert = i;
            i += (size_t)k;
            continue;
        }
        /* a region that NFC may change: from the last inert character to the next one */
        size_t start = last_inert < copied ? copied : last_inert, end = i + (size_t)k;
        while (end < n) {
            utf8proc_ssize_t k2 = utf8proc_iterate((const utf8proc_uint8_t *)s + end, (utf8proc_ssize_t)(n - end), &cp);
            if ((unsigned char)s[end] < 0x80 || is_inert(cp, options))
                break;
            end += (size_t)k2;
        }
        utf8proc_uint8_t *nfc = NULL;
        utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s + start, (utf8proc_ssize_t)(end - start), &nfc,
                                          (utf8proc_option_t)options);
        if (m < 0 || !append(out, &len, &cap, s + copied, start - copied) ||
            !append(out, &len, &cap, (const char *)nfc, (size_t)m)) {
            free(nfc);
            free(*out);
            *out = NULL;
            if (m >= 0 || m == UTF8PROC_ERROR_NOMEM)
                return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory normalizing text");
            return lily_error_set(err, LILY_ERR_TOKENIZER, "normalizer failed: %s", utf8proc_errmsg(m));
        }
        free(nfc);
        copied = end;
        last_inert = end;
        i = end;
    }
    if (*out && !append(out, &len, &cap, s + copied, n - copied)) {
        free(*out);
        *out = NULL;
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory normalizing text");
    }
    *out_len = len;
    return LILY_OK;
}
