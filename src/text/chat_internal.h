/* chat_internal.h — a growable byte buffer shared by chat_template.c and py_json.c (not a public API).
 *
 * Appends never fail loudly: the first failed allocation sets `failed`, later appends are no-ops, and the
 * owner turns `failed` into LILY_ERR_OUT_OF_MEMORY once, at the end.
 */
#ifndef LILY_TEXT_CHAT_INTERNAL_H
#define LILY_TEXT_CHAT_INTERNAL_H

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *data; /* NUL-terminated when len > 0 or after chat_buf_finish */
    size_t len, cap;
    int failed;
} chat_buf;

static inline void chat_buf_append(chat_buf *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static inline void chat_buf_puts(chat_buf *b, const char *s) { chat_buf_append(b, s, strlen(s)); }

static inline void chat_buf_free(chat_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->failed = 0;
}

/* Append json.dumps(value, ensure_ascii=False) (py_json.c). */
void py_json_append(chat_buf *b, const json_t *value);

#endif
