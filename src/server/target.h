/* target.h — checks on an HTTP request-target (the URL of the request line) before it is routed.
 *
 * Two things are refused. A target microhttpd 0.9.75 cannot parse safely: over LILY_HTTP_MAX_TARGET bytes or
 * with more than LILY_HTTP_MAX_QUERY_ARGS query arguments (see below), answered 414 URI Too Long. A path that
 * holds a control character, raw or percent-encoded (%00-%1F, %7F): microhttpd decodes the path in place, so
 * "/v1/models%00junk" would reach the router as "/v1/models"; answered 400.
 */
#ifndef LILY_SERVER_TARGET_H
#define LILY_SERVER_TARGET_H

#include <stddef.h>

/* Why these bounds: microhttpd keeps each query argument ("a=1", "a", even an empty one between two '&') as a
 * 64-byte record in the connection's memory pool (256 KiB, MHD_OPTION_CONNECTION_MEMORY_LIMIT in http.c), of
 * which about half is free once a request line within its first read buffer (half the pool) is read. When the
 * records exhaust the pool, microhttpd 0.9.75 queues its own 431 but then carries on parsing the request line
 * as if nothing happened, and the client gets no answer at all. 1024 records (64 KiB) in a line of at most
 * 8 KiB (the usual limit: nginx, Apache) always fit, with room left for the headers and the answer. */
#define LILY_HTTP_MAX_TARGET 8192
#define LILY_HTTP_MAX_QUERY_ARGS 1024

typedef enum {
    LILY_TARGET_OK,
    LILY_TARGET_TOO_LONG,      /* over LILY_HTTP_MAX_TARGET bytes: 414 */
    LILY_TARGET_TOO_MANY_ARGS, /* more than LILY_HTTP_MAX_QUERY_ARGS query arguments: 414 */
    LILY_TARGET_CONTROL_CHAR,  /* a control character in the path (before any '?'): 400 */
} lily_target_verdict;

/* The verdict on target, the request-target as the client sent it (still percent-encoded; NUL-terminated;
 * NULL counts as ""). *n_args (may be NULL): the number of query arguments as microhttpd splits them (one
 * more than the '&' after the first '?'; 0 without a '?'). */
lily_target_verdict lily_http_check_target(const char *target, size_t *n_args);

#endif
