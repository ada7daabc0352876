/* fuzz_support.h — what the libFuzzer targets in tests/fuzz share: a tokenizer loaded once, a UTF-8
 * check, and a crash that says why (abort() leaves the input for libFuzzer to save).
 */
#ifndef LILY_FUZZ_SUPPORT_H
#define LILY_FUZZ_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "text/tokenizer.h"

#define FUZZ_CHECK(cond)                                                                                   \
    do {                                                                                                   \
        if (!(cond)) {                                                                                     \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);                     \
            abort();                                                                                       \
        }                                                                                                  \
    } while (0)

/* The tokenizer of the model directory `dir` under tests/data (LILY_FUZZ_DATA_DIR), loaded on the first
 * call and kept for the process. Aborts when it cannot be loaded. */
static inline lily_tokenizer *fuzz_tokenizer(const char *dir)
{
    static lily_tokenizer *tok;
    if (!tok) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", LILY_FUZZ_DATA_DIR, dir);
        lily_error err;
        if (lily_tokenizer_load(path, &tok, &err) != LILY_OK) {
            fprintf(stderr, "fuzz: cannot load the tokenizer %s: %s\n", path, err.message);
            abort();
        }
    }
    return tok;
}

/* True when s[n] is valid UTF-8 (no surrogates, no overlongs, at most U+10FFFF). */
static inline bool fuzz_valid_utf8(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!len || i + len > n || (len == 2 && c < 0xC2) || (len == 4 && c > 0xF4))
            return false;
        for (size_t k = 1; k < len; k++)
            if ((p[i + k] & 0xC0) != 0x80)
                return false;
        if ((len == 3 && c == 0xE0 && p[i + 1] < 0xA0) || (len == 3 && c == 0xED && p[i + 1] >= 0xA0) ||
            (len == 4 && c == 0xF0 && p[i + 1] < 0x90) || (len == 4 && c == 0xF4 && p[i + 1] >= 0x90))
            return false;
        i += len;
    }
    return true;
}

#endif
