/* int_range.c — integer ranges as digit strings, and the digit step (int_range.h has the math). */
#include "grammar/int_range.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* v's magnitude in decimal (INT64_MIN too). */
static int magnitude_text(int64_t v, char *out)
{
    const uint64_t m = v < 0 ? (uint64_t)(-(v + 1)) + 1 : (uint64_t)v;
    return snprintf(out, LILY_INT_RANGE_MAX_DIGITS + 1, "%" PRIu64, m);
}

static void set_side(char *text, int *n, int64_t v)
{
    *n = magnitude_text(v, text);
}

static void set_nines(char *text, int *n, int digits)
{
    memset(text, '9', (size_t)digits);
    text[digits] = 0;
    *n = digits;
}

bool lily_int_range_init(lily_int_range *r, bool has_lo, int64_t lo, bool has_hi, int64_t hi, int max_digits)
{
    memset(r, 0, sizeof *r);
    if (has_lo && has_hi && lo > hi)
        return false;
    char tmp[LILY_INT_RANGE_MAX_DIGITS + 1];
    int digits = max_digits;
    if (has_lo && magnitude_text(lo, tmp) > digits)
        digits = (int)strlen(tmp);
    if (has_hi && magnitude_text(hi, tmp) > digits)
        digits = (int)strlen(tmp);
    r->zero = (!has_lo || lo <= 0) && (!has_hi || hi >= 0);
    if (!has_hi || hi >= 1) { /* positive values [max(lo, 1), hi] */
        set_side(r->pos.lo, &r->pos.n_lo, has_lo && lo > 1 ? lo : 1);
        if (has_hi)
            set_side(r->pos.hi, &r->pos.n_hi, hi);
        else
            set_nines(r->pos.hi, &r->pos.n_hi, digits);
    }
    if (!has_lo || lo <= -1) { /* negative values [lo, min(hi, -1)]: magnitudes [max(-hi, 1), -lo] */
        set_side(r->neg.lo, &r->neg.n_lo, has_hi && hi < -1 ? hi : 1);
        if (has_lo)
            set_side(r->neg.hi, &r->neg.n_hi, lo);
        else
            set_nines(r->neg.hi, &r->neg.n_hi, digits);
    }
    return true;
}

/* Some length L >= s->digits completes the digits so far in range (int_range.h). */
static bool completable(const lily_digit_range *r, const lily_digit_state *s)
{
    const int k = s->digits, a = r->n_lo, b = r->n_hi;
    if ((k > a ? k : a + 1) <= b - 1)
        return true; /* a length strictly between lo's and hi's: any digits */
    if (k <= a && s->cmp_lo >= 0 && (a < b || s->cmp_hi <= 0))
        return true; /* lo's length */
    return a < b && k <= b && s->cmp_hi <= 0; /* hi's length */
}

static int32_t cmp_digit(unsigned char b, char bound) { return b < (unsigned char)bound ? -1 : b > (unsigned char)bound; }

bool lily_digit_range_step(const lily_digit_range *r, lily_digit_state *s, unsigned char b)
{
    if (b < '0' || b > '9' || (b == '0' && s->digits == 0) || s->digits >= r->n_hi)
        return false;
    lily_digit_state next = *s;
    if (next.digits < r->n_lo && next.cmp_lo == 0)
        next.cmp_lo = cmp_digit(b, r->lo[next.digits]);
    if (next.cmp_hi == 0)
        next.cmp_hi = cmp_digit(b, r->hi[next.digits]);
    next.digits++;
    if (!completable(r, &next))
        return false;
    *s = next;
    return true;
}

bool lily_digit_range_complete(const lily_digit_range *r, const lily_digit_state *s)
{
    const int k = s->digits;
    return k >= 1 && k >= r->n_lo && k <= r->n_hi && (k > r->n_lo || s->cmp_lo >= 0) &&
           (k < r->n_hi || s->cmp_hi <= 0);
}
