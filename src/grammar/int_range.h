/* int_range.h — an integer range [lo, hi] (int64 bounds) as the decimal texts the grammar accepts for it,
 * and the matcher's digit-by-digit step through one sign's magnitudes.
 *
 * Owns: splitting [lo, hi] into zero, the positive magnitudes and the negative magnitudes, each a range of
 * digit strings [lo, hi] without leading zeros; deciding, after each digit, whether the digits so far are
 * still the start of a magnitude in range (so the matcher never takes a digit it cannot finish) and whether
 * they are one already. Does not own: reading the schema (json_schema.c), signs and frames (grammar.c).
 *
 * The math: a magnitude of L digits lies in [lo, hi] (lo of A digits, hi of B) when A < L < B, or L = A and
 * it is >= lo, or L = B and it is <= hi (both when A = B). Numbers of equal length compare as their digit
 * strings, so a prefix P of k digits needs only its order against lo's and hi's first k digits (cmp_lo,
 * cmp_hi: -1, 0, 1, fixed at the first digit that differs). P can be completed in range when some length
 * L >= k qualifies: A < L < B always; L = A when cmp_lo >= 0 (and cmp_hi <= 0 if A = B); L = B when
 * cmp_hi <= 0.
 */
#ifndef LILY_INT_RANGE_H
#define LILY_INT_RANGE_H

#include <stdbool.h>
#include <stdint.h>

#define LILY_INT_RANGE_MAX_DIGITS 20

/* The magnitudes [lo, hi] (decimal, no leading zero, 1 <= lo <= hi) of one sign; n_hi 0: none. */
typedef struct {
    int n_lo, n_hi;
    char lo[LILY_INT_RANGE_MAX_DIGITS + 1], hi[LILY_INT_RANGE_MAX_DIGITS + 1];
} lily_digit_range;

typedef struct {
    bool zero;            /* 0 is in range ("0"; never "-0") */
    lily_digit_range pos; /* the positive values' magnitudes */
    lily_digit_range neg; /* the negative values' magnitudes */
} lily_int_range;

/* The integers in [lo, hi] (a side without has_*: unbounded, up to max_digits digits, or the other
 * bound's digit count when that is more). At least one of has_lo, has_hi; 1 <= max_digits <= 19. Returns
 * false when no integer is in range (has_lo && has_hi && lo > hi). */
bool lily_int_range_init(lily_int_range *r, bool has_lo, int64_t lo, bool has_hi, int64_t hi, int max_digits);

/* The state of a magnitude's digits so far (the matcher's frame holds it; zeroed before the first digit). */
typedef struct {
    int32_t digits, cmp_lo, cmp_hi;
} lily_digit_state;

/* Take digit b ('0'-'9'; the first digit of a magnitude must not be '0') when the digits after it can still
 * be completed to a magnitude in r. Returns false (s unchanged) otherwise. */
bool lily_digit_range_step(const lily_digit_range *r, lily_digit_state *s, unsigned char b);

/* The digits so far are a magnitude in r. */
bool lily_digit_range_complete(const lily_digit_range *r, const lily_digit_state *s);

#endif
