/* py_json.c — Python json.dumps(ensure_ascii=False) formatting for jansson values (see py_json.h).
 *
 * Owns: string escaping as CPython's encoder does it and float formatting as float.__repr__ does it
 * (shortest digits that round-trip, then the 'r' format rules of PyOS_double_to_string).
 */
#include "text/py_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_internal.h"

void lily_py_float_repr(double x, char *buf, size_t size)
{
    if (isnan(x)) {
        snprintf(buf, size, "NaN");
        return;
    }
    if (isinf(x)) {
        snprintf(buf, size, x < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (x == 0) {
        snprintf(buf, size, signbit(x) ? "-0.0" : "0.0");
        return;
    }
    /* shortest precision whose correctly rounded %e form reads back as x (Python's repr does the same
     * search exactly, with David Gay's dtoa mode 0) */
    char sci[48];
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(sci, sizeof sci, "%.*e", digits - 1, x);
        if (strtod(sci, NULL) == x)
            break;
    }
    /* split "-d.ddde+XX" into sign, digit string, decimal exponent */
    const char *p = sci;
    int negative = 0;
    if (*p == '-') {
        negative = 1;
        p++;
    }
    char digit_str[24];
    int n_digits = 0;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && n_digits < 20)
            digit_str[n_digits++] = *p;
    int exponent = *p == 'e' ? atoi(p + 1) : 0;
    while (n_digits > 1 && digit_str[n_digits - 1] == '0')
        n_digits--;
    digit_str[n_digits] = '\0';
    int decpt = exponent + 1; /* x = 0.d1d2... * 10^decpt */

    char out[64];
    size_t o = 0;
    if (negative)
        out[o++] = '-';
    if (decpt <= -4 || decpt > 16) {
        out[o++] = digit_str[0];
        if (n_digits > 1) {
            out[o++] = '.';
            memcpy(out + o, digit_str + 1, (size_t)n_digits - 1);
            o += (size_t)n_digits - 1;
        }
        int e = decpt - 1;
        o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    } else if (decpt <= 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = 0; i < -decpt; i++)
            out[o++] = '0';
        memcpy(out + o, digit_str, (size_t)n_digits);
        o += (size_t)n_digits;
    } else if (decpt >= n_digits) {
        memcpy(out + o, digit_str, (size_t)n_digits);
        o += (size_t)n_digits;
        for (int i = n_digits; i < decpt; i++)
            out[o++] = '0';
        out[o++] = '.';
        out[o++] = '0';
    } else {
        memcpy(out + o, digit_str, (size_t)decpt);
        o += (size_t)decpt;
        out[o++] = '.';
        memcpy(out + o, digit_str + decpt, (size_t)(n_digits - decpt));
        o += (size_t)(n_digits - decpt);
    }
    out[o] = '\0';
    snprintf(buf, size, "%s", out);
}

/* CPython json encoder, ensure_ascii=False: escape only '"', '\\' and U+0000..U+001F. */
static void append_string(chat_buf *b, const char *s, size_t n)
{
    chat_buf_append(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char hex[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        default:
            if (c < 0x20) {
                snprintf(hex, sizeof hex, "\\u%04x", c);
                esc = hex;
            }
        }
        if (esc) {
            chat_buf_append(b, s + run, i - run);
            chat_buf_puts(b, esc);
            run = i + 1;
        }
    }
    chat_buf_append(b, s + run, n - run);
    chat_buf_append(b, "\"", 1);
}

void py_json_append(chat_buf *b, const json_t *value)
{
    char num[64];
    switch (json_typeof(value)) {
    case JSON_NULL: chat_buf_puts(b, "null"); break;
    case JSON_TRUE: chat_buf_puts(b, "true"); break;
    case JSON_FALSE: chat_buf_puts(b, "false"); break;
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(value));
        chat_buf_puts(b, num);
        break;
    case JSON_REAL:
        lily_py_float_repr(json_real_value(value), num, sizeof num);
        chat_buf_puts(b, num);
        break;
    case JSON_STRING: append_string(b, json_string_value(value), json_string_length(value)); break;
    case JSON_ARRAY: {
        chat_buf_append(b, "[", 1);
        size_t i;
        json_t *item;
        json_array_foreach(value, i, item) {
            if (i)
                chat_buf_append(b, ", ", 2);
            py_json_append(b, item);
        }
        chat_buf_append(b, "]", 1);
        break;
    }
    case JSON_OBJECT: {
        chat_buf_append(b, "{", 1);
        const char *key;
        size_t key_len;
        json_t *item;
        int first = 1;
        /* jansson (>= 2.8) iterates objects in insertion order, as Python dicts do */
        json_object_keylen_foreach((json_t *)value, key, key_len, item) {
            if (!first)
                chat_buf_append(b, ", ", 2);
            first = 0;
            append_string(b, key, key_len);
            chat_buf_append(b, ": ", 2);
            py_json_append(b, item);
        }
        chat_buf_append(b, "}", 1);
        break;
    }
    }
}

char *lily_py_json_dumps(const json_t *value)
{
    chat_buf b = {0};
    py_json_append(&b, value);
    chat_buf_append(&b, "", 0);
    if (b.failed) {
        chat_buf_free(&b);
        return NULL;
    }
    return b.data;
}
