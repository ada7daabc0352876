/* json_load.c — JSON text with out-of-range numbers read as reals (json_load.h).
 *
 * One pass finds the number literals (outside strings) jansson would refuse: integers (no '.', 'e' or
 * 'E') outside int64, and any literal whose magnitude overflows a double. A copy of the text then gets
 * ".0" after each such integer (jansson reads it as a real) and the largest double, with the literal's
 * sign, in place of each overflowing literal. Only a literal of JSON's number grammar is rewritten: a
 * malformed one (1e400e5, 1e400.5) is left for jansson to report, as is all other malformed text.
 */
#include "base/json_load.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"

#define MAX_DOUBLE_TEXT "1.7976931348623157e308"

/* A literal to rewrite: text[start, end) becomes itself + ".0" (widen) or MAX_DOUBLE_TEXT with its sign. */
typedef struct {
    size_t start, end;
    bool widen;
} rewrite;

/* True when the integer literal digits[n] (no sign) is outside int64 with the given sign:
 * > 9223372036854775807, or > 9223372036854775808 when negative. */
static bool out_of_int64(const char *digits, size_t n, bool negative)
{
    static const char max_pos[] = "9223372036854775807", max_neg[] = "9223372036854775808";
    while (n > 1 && digits[0] == '0') {
        digits++;
        n--;
    }
    if (n != sizeof max_pos - 1)
        return n > sizeof max_pos - 1;
    return memcmp(digits, negative ? max_neg : max_pos, n) > 0;
}

/* True when the literal text[0, n) overflows a double (strtod on a NUL-terminated copy). */
static bool overflows_double(const char *text, size_t n)
{
    char small[64];
    char *copy = n < sizeof small ? small : malloc(n + 1);
    if (!copy)
        return false; /* jansson then reports it */
    memcpy(copy, text, n);
    copy[n] = 0;
    errno = 0;
    const double v = strtod(copy, NULL);
    const bool overflow = errno == ERANGE && (v > 1.0 || v < -1.0);
    if (copy != small)
        free(copy);
    return overflow;
}

/* True when text[0, n) is one JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? (RFC 8259 section 6).
 * strtod reads a prefix of anything, so a literal whose prefix overflows (1e400e5) must not be taken for one. */
static bool number_literal(const char *text, size_t n)
{
    size_t i = text[0] == '-';
    const size_t int_start = i;
    while (i < n && text[i] >= '0' && text[i] <= '9')
        i++;
    if (i == int_start || (text[int_start] == '0' && i - int_start > 1))
        return false;
    if (i < n && text[i] == '.') {
        const size_t frac = ++i;
        while (i < n && text[i] >= '0' && text[i] <= '9')
            i++;
        if (i == frac)
            return false;
    }
    if (i < n && (text[i] == 'e' || text[i] == 'E')) {
        i++;
        if (i < n && (text[i] == '+' || text[i] == '-'))
            i++;
        const size_t exp = i;
        while (i < n && text[i] >= '0' && text[i] <= '9')
            i++;
        if (i == exp)
            return false;
    }
    return i == n;
}

/* The number of literals to rewrite in text; the first `cap` go to out (may be NULL). */
static size_t find_rewrites(const char *text, size_t len, rewrite *out, size_t cap)
{
    size_t count = 0;
    for (size_t i = 0; i < len;) {
        const char c = text[i];
        if (c == '"') { /* skip the string, escapes included */
            for (i++; i < len && text[i] != '"'; i++)
                if (text[i] == '\\')
                    i++;
            i++;
            continue;
        }
        if (c != '-' && (c < '0' || c > '9')) {
            i++;
            continue;
        }
        const size_t start = i;
        const bool negative = c == '-';
        bool integer = true;
        for (i++; i < len; i++) {
            const char d = text[i];
            if (d == '.' || d == 'e' || d == 'E' || d == '+')
                integer = false;
            else if ((d < '0' || d > '9') && d != '-')
                break;
        }
        const size_t digits = start + (negative ? 1 : 0);
        if (i == digits || !number_literal(text + start, i - start))
            continue; /* malformed: jansson reports it */
        const bool big_integer = integer && out_of_int64(text + digits, i - digits, negative);
        const bool overflow = (!integer || big_integer) && overflows_double(text + start, i - start);
        if (big_integer || overflow) {
            if (out && count < cap)
                out[count] = (rewrite){start, i, !overflow};
            count++;
        }
    }
    return count;
}

json_t *lily_json_loadb(const char *text, size_t len, size_t flags, json_error_t *error)
{
    const size_t n = find_rewrites(text, len, NULL, 0);
    if (n == 0)
        return json_loadb(text, len, flags, error);
    rewrite *rw = malloc(n * sizeof *rw);
    char *copy = rw ? malloc(len + n * sizeof MAX_DOUBLE_TEXT) : NULL;
    if (!copy) {
        free(rw);
        if (error) {
            memset(error, 0, sizeof *error);
            strcpy(error->text, "out of memory");
        }
        return NULL;
    }
    find_rewrites(text, len, rw, n);
    size_t from = 0, to = 0;
    for (size_t k = 0; k < n; k++) {
        const size_t keep = rw[k].widen ? rw[k].end : rw[k].start + (text[rw[k].start] == '-');
        memcpy(copy + to, text + from, keep - from);
        to += keep - from;
        const char *add = rw[k].widen ? ".0" : MAX_DOUBLE_TEXT;
        memcpy(copy + to, add, strlen(add));
        to += strlen(add);
        from = rw[k].end;
    }
    memcpy(copy + to, text + from, len - from);
    to += len - from;
    json_t *root = json_loadb(copy, to, flags, error);
    free(copy);
    free(rw);
    return root;
}

json_t *lily_json_load_file(const char *path, size_t max_bytes, size_t flags, json_error_t *error)
{
    char *text;
    size_t len;
    lily_error err;
    if (lily_read_file(path, max_bytes, &text, &len, &err) != LILY_OK) {
        if (error) {
            memset(error, 0, sizeof *error);
            snprintf(error->text, sizeof error->text, "%.159s", err.message);
        }
        return NULL;
    }
    json_t *root = lily_json_loadb(text, len, flags, error);
    free(text);
    return root;
}
