/* int_range.c — integer and number ranges as digit strings, and the digit step (int_range.h has the math).
 * Bounds are signed counts of units in 128-bit integers (a number's reach 10^20 * 10^16). */
#include "grammar/int_range.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned __int128 u128;
typedef __int128 i128;

/* m in decimal, zero-padded to at least min_digits digits; the digit count. */
static int u128_text(u128 m, int min_digits, char *out)
{
    char tmp[LILY_INT_RANGE_MAX_DIGITS + 1];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + (int)(m % 10));
        m /= 10;
    } while (m && n < LILY_INT_RANGE_MAX_DIGITS);
    while (n < min_digits)
        tmp[n++] = '0';
    for (int i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    out[n] = 0;
    return n;
}

static u128 magnitude(i128 v) { return v < 0 ? (u128)(-(v + 1)) + 1 : (u128)v; }

static void set_lo_end(lily_digit_range *d)
{
    d->lo_end = d->n_lo;
    while (d->lo_end > 0 && d->lo[d->lo_end - 1] == '0')
        d->lo_end--;
}

static void set_nines(lily_digit_range *d, int digits)
{
    memset(d->hi, '9', (size_t)digits);
    d->hi[digits] = 0;
    d->n_hi = digits;
}

/* r from signed bounds in units (integers: 1; numbers: 10^-frac, every text at least frac digits):
 * magnitudes [max(lo, first_pos), hi] and [max(-hi, 1), -lo]; an open side up to `digits` digits. */
static void init_sides(lily_int_range *r, bool has_lo, i128 lo, bool has_hi, i128 hi, int digits, int frac,
                       i128 first_pos)
{
    memset(r, 0, sizeof *r);
    if (!has_hi || hi >= first_pos) {
        r->pos.n_lo = u128_text(magnitude(has_lo && lo > first_pos ? lo : first_pos), frac, r->pos.lo);
        set_lo_end(&r->pos);
        if (has_hi)
            r->pos.n_hi = u128_text(magnitude(hi), frac, r->pos.hi);
        else
            set_nines(&r->pos, digits);
    }
    if (!has_lo || lo <= -1) {
        r->neg.n_lo = u128_text(magnitude(has_hi && hi < -1 ? hi : 1), frac, r->neg.lo);
        set_lo_end(&r->neg);
        if (has_lo)
            r->neg.n_hi = u128_text(magnitude(lo), frac, r->neg.hi);
        else
            set_nines(&r->neg, digits);
    }
}

static int digit_count(u128 m)
{
    char tmp[LILY_INT_RANGE_MAX_DIGITS + 1];
    return u128_text(m, 0, tmp);
}

bool lily_int_range_init(lily_int_range *r, bool has_lo, int64_t lo, bool has_hi, int64_t hi, int max_digits)
{
    memset(r, 0, sizeof *r);
    if (has_lo && has_hi && lo > hi)
        return false;
    int digits = max_digits;
    if (has_lo && digit_count(magnitude(lo)) > digits)
        digits = digit_count(magnitude(lo));
    if (has_hi && digit_count(magnitude(hi)) > digits)
        digits = digit_count(magnitude(hi));
    init_sides(r, has_lo, lo, has_hi, hi, digits, 0, 1);
    r->zero = (!has_lo || lo <= 0) && (!has_hi || hi >= 0);
    return true;
}

/* x (finite, |x| < 10^20) times 10^LILY_NUMBER_FRACTION_DIGITS, from x's shortest decimal that reads back as
 * x: *trunc the integer toward zero, *inexact whether digits were dropped. */
static void number_units(double x, i128 *trunc, bool *inexact)
{
    char text[64];
    for (int p = 1; p <= 17; p++) {
        snprintf(text, sizeof text, "%.*e", p - 1, x);
        if (strtod(text, NULL) == x)
            break;
    }
    /* text: [-]d[.ddd]e[+-]dd: digits D with the point after the first, times 10^e */
    const char *s = text + (text[0] == '-');
    char digits[32];
    int n = 0;
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9')
            digits[n++] = *s;
    const int e = atoi(s + 1);
    const int keep = 1 + e + LILY_NUMBER_FRACTION_DIGITS; /* digits of D left of the unit's point */
    u128 m = 0;
    *inexact = false;
    for (int i = 0; i < n || i < keep; i++) {
        const int d = i < n ? digits[i] - '0' : 0;
        if (i < keep)
            m = m * 10 + (u128)d;
        else if (d)
            *inexact = true;
    }
    *trunc = x < 0 ? -(i128)m : (i128)m;
}

bool lily_number_range_init(lily_int_range *r, bool has_lo, double lo, bool lo_exclusive, bool has_hi, double hi,
                            bool hi_exclusive, int max_int_digits)
{
    memset(r, 0, sizeof *r);
    const double limit = 1e20;
    if ((has_lo && !(fabs(lo) < limit)) || (has_hi && !(fabs(hi) < limit)))
        return false;
    i128 ulo = 0, uhi = 0, t;
    bool inexact;
    if (has_lo) { /* the least unit count >= lo (> lo) */
        number_units(lo, &t, &inexact);
        const bool above = lo > 0 && inexact; /* the truncation fell below lo */
        ulo = lo_exclusive ? (lo < 0 && inexact ? t : t + 1) : (above ? t + 1 : t);
    }
    if (has_hi) { /* the greatest unit count <= hi (< hi) */
        number_units(hi, &t, &inexact);
        const bool below = hi < 0 && inexact; /* the truncation rose above hi */
        uhi = hi_exclusive ? (hi > 0 && inexact ? t : t - 1) : (below ? t - 1 : t);
    }
    if (has_lo && has_hi && ulo > uhi)
        return false;
    int digits = max_int_digits + LILY_NUMBER_FRACTION_DIGITS;
    if (has_lo && digit_count(magnitude(ulo)) > digits)
        digits = digit_count(magnitude(ulo));
    if (has_hi && digit_count(magnitude(uhi)) > digits)
        digits = digit_count(magnitude(uhi));
    init_sides(r, has_lo, ulo, has_hi, uhi, digits, LILY_NUMBER_FRACTION_DIGITS, 0);
    return true;
}

bool lily_digit_range_open(const lily_digit_range *r, const lily_digit_state *s, int min_len, int max_len)
{
    const int a = r->n_lo, b = r->n_hi;
    const int from = min_len > s->digits ? min_len : s->digits, to = max_len < b ? max_len : b;
    if ((from > a + 1 ? from : a + 1) <= (to < b - 1 ? to : b - 1))
        return true; /* a length strictly between lo's and hi's: any digits */
    if (from <= a && a <= to && s->cmp_lo >= 0 && (a < b || s->cmp_hi <= 0))
        return true; /* lo's length */
    return a < b && from <= b && b <= to && s->cmp_hi <= 0; /* hi's length */
}

static int32_t cmp_digit(unsigned char b, char bound)
{
    return b < (unsigned char)bound ? -1 : b > (unsigned char)bound;
}

bool lily_digit_range_step(const lily_digit_range *r, lily_digit_state *s, unsigned char b, int min_len,
                           int max_len)
{
    if (b < '0' || b > '9' || s->digits >= r->n_hi)
        return false;
    lily_digit_state next = *s;
    if (next.digits < r->n_lo && next.cmp_lo == 0)
        next.cmp_lo = cmp_digit(b, r->lo[next.digits]);
    if (next.cmp_hi == 0)
        next.cmp_hi = cmp_digit(b, r->hi[next.digits]);
    next.digits++;
    if (!lily_digit_range_open(r, &next, min_len, max_len))
        return false;
    *s = next;
    return true;
}

bool lily_digit_range_complete(const lily_digit_range *r, const lily_digit_state *s, int len)
{
    const int32_t cmp_lo = s->cmp_lo != 0 || s->digits >= r->lo_end ? s->cmp_lo : -1; /* after the zeros */
    return len >= 1 && len >= r->n_lo && len <= r->n_hi && (len > r->n_lo || cmp_lo >= 0) &&
           (len < r->n_hi || s->cmp_hi <= 0);
}
