/* stop_strings.h — stop strings matched across token boundaries, never emitted.
 *
 * Owns: the text held back because it could still be the start of a stop string. Text goes in piece by
 * piece (one token's bytes at a time); what comes out is every byte that can no longer belong to a stop
 * string, so a stop string split over several tokens is caught and none of it reaches the caller.
 * The output for any split of the input equals the output for the whole input at once.
 */
#ifndef LILY_STOP_STRINGS_H
#define LILY_STOP_STRINGS_H

#include <stdbool.h>
#include <stddef.h>

#include "lily.h"

typedef struct lily_stop_matcher lily_stop_matcher;

/* A matcher for stops[n] (NUL-terminated; empty strings are ignored; copied). n may be 0.
 * Errors: LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_stop_matcher_new(const char *const *stops, int n, lily_stop_matcher **out, lily_error *err);
void lily_stop_matcher_free(lily_stop_matcher *m);

/* Forget held text and any match. */
void lily_stop_matcher_reset(lily_stop_matcher *m);

/* Feed len bytes. *out and *out_len receive the bytes released by this call (valid until the next call
 * on m). Returns the index of the stop string that matched, or -1. The match is the earliest start in
 * the text (at equal starts, the lowest index); the released text ends just before it and everything
 * after it is dropped. After a match, further feeds release nothing and return the same index.
 * Errors: LILY_ERR_OUT_OF_MEMORY (returned as -2, err set). */
int lily_stop_matcher_feed(lily_stop_matcher *m, const char *text, size_t len, const char **out, size_t *out_len,
                           lily_error *err);

/* End of text: release what is still held. A stop string wholly inside the held text can still match here
 * (e.g. stops "abcx" and "bc" with "abc" held): the return value is then its index and only the text
 * before it is released; otherwise -1. Nothing is released after a match. */
int lily_stop_matcher_flush(lily_stop_matcher *m, const char **out, size_t *out_len);

/* Bytes currently held back. */
size_t lily_stop_matcher_held(const lily_stop_matcher *m);

#endif
