/* fuzz_stop_strings.c — libFuzzer target for the stop-string matcher (runtime/stop_strings.h).
 * Input: one byte n (0-7 stop strings), then n NUL-terminated stop strings, then the text.
 * Checks: no crash, leak or undefined behaviour; the same released text and match whether the text is fed
 * whole, one byte at a time or in pieces of 5; the released text is a prefix of the input; with no match
 * everything is released; with a match the stop string follows the released text in the input, and no
 * stop string occurs earlier.
 */
#include <stdint.h>
#include <string.h>

#include "fuzz_support.h"
#include "runtime/stop_strings.h"

/* Feed text in pieces of `step`; the released bytes go to out (room for len), their count to *out_len. */
static int run(const char *const *stops, int n, const char *text, size_t len, size_t step, char *out, size_t *out_len)
{
    lily_stop_matcher *m = NULL;
    lily_error err;
    FUZZ_CHECK(lily_stop_matcher_new(stops, n, &m, &err) == LILY_OK);
    int matched = -1;
    *out_len = 0;
    const char *piece;
    size_t piece_len;
    for (size_t at = 0; at < len; at += step) {
        matched = lily_stop_matcher_feed(m, text + at, len - at < step ? len - at : step, &piece, &piece_len, &err);
        FUZZ_CHECK(matched >= -1 && *out_len + piece_len <= len);
        memcpy(out + *out_len, piece, piece_len);
        *out_len += piece_len;
    }
    if (matched < 0) {
        matched = lily_stop_matcher_flush(m, &piece, &piece_len);
        FUZZ_CHECK(*out_len + piece_len <= len);
        memcpy(out + *out_len, piece, piece_len);
        *out_len += piece_len;
    }
    lily_stop_matcher_free(m);
    return matched;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const int n_stops = data[0] & 7;
    const char *stops[8];
    size_t at = 1;
    for (int i = 0; i < n_stops; i++) {
        const uint8_t *nul = at < size ? memchr(data + at, 0, size - at) : NULL;
        if (!nul)
            return 0;
        stops[i] = (const char *)data + at;
        at = (size_t)(nul - data) + 1;
    }
    const char *text = (const char *)data + at;
    const size_t len = size - at;
    char *a = malloc(len + 1), *b = malloc(len + 1), *c = malloc(len + 1);
    FUZZ_CHECK(a && b && c);
    size_t la, lb, lc;
    const int ma = run(stops, n_stops, text, len, len ? len : 1, a, &la);
    const int mb = run(stops, n_stops, text, len, 1, b, &lb);
    const int mc = run(stops, n_stops, text, len, 5, c, &lc);
    FUZZ_CHECK(ma == mb && ma == mc && la == lb && la == lc && !memcmp(a, b, la) && !memcmp(a, c, la));
    FUZZ_CHECK(!memcmp(a, text, la));
    if (ma < 0) {
        FUZZ_CHECK(la == len);
    } else {
        FUZZ_CHECK(ma < n_stops && stops[ma][0]);
        const size_t sl = strlen(stops[ma]);
        FUZZ_CHECK(la + sl <= len && !memcmp(text + la, stops[ma], sl));
        for (int i = 0; i < n_stops; i++) { /* the match is the earliest start */
            const size_t l = strlen(stops[i]);
            for (size_t p = 0; l && p < la && p + l <= len; p++)
                FUZZ_CHECK(memcmp(text + p, stops[i], l));
        }
    }
    free(a);
    free(b);
    free(c);
    return 0;
}
