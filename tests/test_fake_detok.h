/* test_fake_detok.h — a detokenizer for a model without a tokenizer, shared by the generate tests
 * (test_generate_device_loop.c, cuda/test_cuda_decode_loop.c): token t reads " t<id>". Use it as
 * (lily_detok_interface){&state, detok_feed, NULL} with a fake_detok state. Header of static functions.
 */
#ifndef LILY_TEST_FAKE_DETOK_H
#define LILY_TEST_FAKE_DETOK_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "lily.h"

typedef struct {
    char text[32];
} fake_detok;

/* The lily_detok_interface feed: the text of `token` in state's buffer (valid until the next call). */
static inline lily_status detok_feed(void *state, int32_t token, const char **text, size_t *len, lily_error *err)
{
    (void)err;
    fake_detok *d = state;
    snprintf(d->text, sizeof d->text, " t%d", (int)token);
    *text = d->text;
    *len = strlen(d->text);
    return LILY_OK;
}

#endif
