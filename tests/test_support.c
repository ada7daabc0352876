/* test_support.c — see test_support.h. */
#include "test_support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *test_data_path(const char *relative)
{
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", LILY_TEST_DATA_DIR, relative);
    return buf;
}

char *test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (len)
            *len = (size_t)n;
    }
    return buf;
}

float test_max_abs_diff(const float *a, const float *b, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (d > m || d != d)
            m = d != d ? INFINITY : d;
    }
    return m;
}

int test_on_token(void *user, int32_t token, const char *text, size_t len)
{
    test_streamed *o = user;
    assert_true(o->len + len < sizeof o->text);
    memcpy(o->text + o->len, text, len);
    o->len += len;
    o->text[o->len] = '\0';
    if (token >= 0) {
        assert_true(o->n_tokens < 256);
        o->tokens[o->n_tokens++] = token;
    }
    if (o->cancel_after && o->n_tokens == o->cancel_after)
        atomic_store(&o->cancel, 1);
    return o->stop_after && o->n_tokens >= o->stop_after;
}
