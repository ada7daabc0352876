/* target.c — checks on an HTTP request-target (target.h). */
#include "server/target.h"

#include <stdbool.h>
#include <string.h>

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static bool is_control(unsigned char c)
{
    return c < 0x20 || c == 0x7f;
}

lily_target_verdict lily_http_check_target(const char *target, size_t *n_args)
{
    if (!target)
        target = "";
    const char *query = strchr(target, '?');
    const size_t path_len = query ? (size_t)(query - target) : strlen(target);
    size_t len = path_len, args = 0;
    if (query) { /* one pass: its length and its '&' */
        size_t amps = 0;
        const char *p = query + 1;
        for (; *p; p++)
            amps += *p == '&';
        len = (size_t)(p - target);
        args = amps + 1;
    }
    if (n_args)
        *n_args = args;
    if (len > LILY_HTTP_MAX_TARGET)
        return LILY_TARGET_TOO_LONG;
    if (args > LILY_HTTP_MAX_QUERY_ARGS)
        return LILY_TARGET_TOO_MANY_ARGS;
    for (size_t i = 0; i < path_len; i++) {
        if (is_control((unsigned char)target[i]))
            return LILY_TARGET_CONTROL_CHAR;
        /* "%XX" as microhttpd decodes it (a digit can be neither '?' nor the terminating NUL, so the reads
         * stay within the path) */
        const int hi = target[i] == '%' ? hex_value(target[i + 1]) : -1;
        const int lo = hi >= 0 ? hex_value(target[i + 2]) : -1;
        if (lo >= 0 && is_control((unsigned char)(hi * 16 + lo)))
            return LILY_TARGET_CONTROL_CHAR;
    }
    return LILY_TARGET_OK;
}
