/* stop_strings.c — hold back possible stop-string starts, release the rest (stop_strings.h).
 *
 * After each feed the buffer holds only text from the first position where some stop string is still a
 * partial match (the buffer ends inside it). Released text therefore never contains or begins a stop.
 * The held text is at most the longest stop string minus one byte, so rescanning it each feed is cheap.
 */
#include "runtime/stop_strings.h"

#include <stdlib.h>
#include <string.h>

struct lily_stop_matcher {
    char **stops;
    size_t *stop_len;
    int n_stops;
    char *buf;         /* held text, then (during a feed) held + new text */
    size_t len, cap;
    size_t released;   /* the first `released` bytes of buf were handed out by the last call */
    int matched;       /* index of the matched stop, or -1 */
};

lily_status lily_stop_matcher_new(const char *const *stops, int n, lily_stop_matcher **out, lily_error *err)
{
    *out = NULL;
    lily_stop_matcher *m = calloc(1, sizeof *m);
    if (!m)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "stop strings: out of memory");
    m->matched = -1;
    if (n > 0) {
        m->stops = calloc((size_t)n, sizeof *m->stops);
        m->stop_len = calloc((size_t)n, sizeof *m->stop_len);
        if (!m->stops || !m->stop_len)
            goto oom;
        for (int i = 0; i < n; i++) {
            m->stops[i] = strdup(stops[i] ? stops[i] : "");
            if (!m->stops[i])
                goto oom;
            m->stop_len[i] = strlen(m->stops[i]);
        }
        m->n_stops = n;
    }
    *out = m;
    return LILY_OK;
oom:
    m->n_stops = n;
    lily_stop_matcher_free(m);
    return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "stop strings: out of memory");
}

void lily_stop_matcher_free(lily_stop_matcher *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_stops; i++)
        free(m->stops ? m->stops[i] : NULL);
    free(m->stops);
    free(m->stop_len);
    free(m->buf);
    free(m);
}

void lily_stop_matcher_reset(lily_stop_matcher *m)
{
    m->len = 0;
    m->released = 0;
    m->matched = -1;
}

size_t lily_stop_matcher_held(const lily_stop_matcher *m) { return m->len - m->released; }

/* Drop the bytes handed out by the previous call. */
static void drop_released(lily_stop_matcher *m)
{
    if (m->released > 0) {
        memmove(m->buf, m->buf + m->released, m->len - m->released);
        m->len -= m->released;
        m->released = 0;
    }
}

/* Left to right: at each position, a stop that matches in full wins unless a stop of lower index is still
 * a partial match there (the buffer ends inside it): then wait for more text. The first position with any
 * partial match starts the held text. Decisions depend on the end of the buffer only through "partial",
 * which a later feed (or the end of text, at_end) resolves the same way the whole text would: the result
 * does not depend on how the text was split. */
static int scan(lily_stop_matcher *m, bool at_end, const char **out, size_t *out_len)
{
    *out = m->buf;
    for (size_t pos = 0; pos < m->len; pos++) {
        int full = -1, partial = -1;
        for (int i = 0; i < m->n_stops; i++) {
            size_t sl = m->stop_len[i], avail = m->len - pos;
            if (sl == 0 || (at_end && sl > avail))
                continue;
            size_t k = sl < avail ? sl : avail;
            if (memcmp(m->buf + pos, m->stops[i], k))
                continue;
            if (k == sl) {
                if (full < 0)
                    full = i;
            } else if (partial < 0) {
                partial = i;
            }
        }
        if (full >= 0 && (partial < 0 || partial > full)) {
            m->matched = full;
            *out_len = pos;
            m->released = m->len; /* nothing after the stop is ever released */
            return full;
        }
        if (partial >= 0) {
            *out_len = pos;
            m->released = pos;
            return -1;
        }
    }
    *out_len = m->len;
    m->released = m->len;
    return -1;
}

int lily_stop_matcher_feed(lily_stop_matcher *m, const char *text, size_t len, const char **out, size_t *out_len,
                           lily_error *err)
{
    *out = "";
    *out_len = 0;
    if (m->matched >= 0)
        return m->matched;
    drop_released(m);
    if (m->len + len + 1 > m->cap) {
        size_t cap = m->cap ? m->cap : 64;
        while (cap < m->len + len + 1)
            cap *= 2;
        char *b = realloc(m->buf, cap);
        if (!b) {
            lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "stop strings: out of memory");
            return -2;
        }
        m->buf = b;
        m->cap = cap;
    }
    memcpy(m->buf + m->len, text, len);
    m->len += len;
    m->buf[m->len] = '\0';

    return scan(m, false, out, out_len);
}

int lily_stop_matcher_flush(lily_stop_matcher *m, const char **out, size_t *out_len)
{
    *out = "";
    *out_len = 0;
    if (m->matched >= 0)
        return m->matched;
    drop_released(m);
    if (!m->buf)
        return -1;
    return scan(m, true, out, out_len);
}
