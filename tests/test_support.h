/* test_support.h — helpers shared by the cmocka tests: data paths, float comparisons, and the collector
 * of what lily_generate streams (test_streamed, test_on_token). */
#ifndef LILY_TEST_SUPPORT_H
#define LILY_TEST_SUPPORT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* "<tests/data>/<relative>" in a static buffer (valid until the next call). */
const char *test_data_path(const char *relative);

/* Read a whole file into a malloc'd NUL-terminated buffer; NULL on failure. *len may be NULL. */
char *test_read_file(const char *path, size_t *len);

/* max |a - b| over n floats. */
float test_max_abs_diff(const float *a, const float *b, size_t n);

/* What lily_generate streamed into test_on_token: the text (NUL-terminated) and the token ids. */
typedef struct {
    char text[8192];
    size_t len;
    int32_t tokens[256];
    int n_tokens;
    int stop_after;       /* the callback returns nonzero at this many tokens (0 = never) */
    int cancel_after;     /* the callback sets the cancel flag at this many tokens (0 = never) */
    atomic_int cancel;
} test_streamed;

/* lily_generate's on_token for a test_streamed user: appends text and id (asserting both fit), raises
 * cancel at cancel_after tokens, and returns nonzero (stop) at stop_after tokens. */
int test_on_token(void *user, int32_t token, const char *text, size_t len);

#endif
