/* error.c — the lily_error record (include/lily.h). */
#include "lily.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

lily_status lily_error_set(lily_error *err, lily_status status, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->status = status;
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return status;
}

void lily_error_prefix(lily_error *err, const char *fmt, ...)
{
    if (!err)
        return;
    char prefix[512], old[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->message, sizeof old);
    /* prefix + ": " + old, truncated to the buffer */
    size_t n = strlen(prefix), cap = sizeof err->message - 1;
    n = n < cap ? n : cap;
    memcpy(err->message, prefix, n);
    for (const char *p = ": "; *p && n < cap; p++)
        err->message[n++] = *p;
    size_t m = strlen(old);
    m = m < cap - n ? m : cap - n;
    memcpy(err->message + n, old, m);
    err->message[n + m] = 0;
}

const char *lily_status_name(lily_status status)
{
    switch (status) {
    case LILY_OK: return "ok";
    case LILY_ERR_INVALID_ARGUMENT: return "invalid_argument";
    case LILY_ERR_IO: return "io";
    case LILY_ERR_FORMAT: return "format";
    case LILY_ERR_MODEL: return "model";
    case LILY_ERR_UNSUPPORTED: return "unsupported";
    case LILY_ERR_OUT_OF_MEMORY: return "out_of_memory";
    case LILY_ERR_CONTEXT_LENGTH: return "context_length";
    case LILY_ERR_BACKEND: return "backend";
    case LILY_ERR_TOKENIZER: return "tokenizer";
    case LILY_ERR_TEMPLATE: return "template";
    case LILY_ERR_CANCELLED: return "cancelled";
    }
    return "unknown";
}
