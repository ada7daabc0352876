/* int_range.h — an integer range [lo, hi] as the decimal texts the grammar accepts for it, and the
 * matcher's digit-by-digit step through one sign's magnitudes. A JSON number with bounds is the same
 * thing counted in units of 10^-LILY_NUMBER_FRACTION_DIGITS: its magnitude's digit string is its integer
 * part's digits (none for "0") followed by its fraction padded with zeros to that many digits.
 *
 * Owns: splitting [lo, hi] into the non-negative and the negative magnitudes, each a range of digit
 * strings; a number bound (a double) as units, rounded inward; deciding, after each digit, whether the
 * digits so far are still the start of a magnitude in range (so the matcher never takes a digit it cannot
 * finish) and whether they are one already. Does not own: reading the schema (json_schema.c), signs,
 * points and frames (grammar.c).
 *
 * The math: digit strings of one length compare as numbers (lexicographically), and a longer one is larger
 * (no leading zero, except that a number's strings all have at least LILY_NUMBER_FRACTION_DIGITS digits
 * and the bounds are padded to that too). A magnitude of L digits lies in [lo, hi] (lo of A digits, hi of
 * B) when A < L < B, or L = A and it is >= lo, or L = B and it is <= hi (both when A = B). So a prefix P
 * of k digits needs only its order against lo's and hi's first k digits (cmp_lo, cmp_hi: -1, 0, 1, fixed at
 * the first digit that differs), and it can be completed in range when some allowed length L >= k
 * qualifies: A < L < B always; L = A when cmp_lo >= 0 (and cmp_hi <= 0 if A = B); L = B when cmp_hi <= 0.
 */
#ifndef LILY_INT_RANGE_H
#define LILY_INT_RANGE_H

#include <stdbool.h>
#include <stdint.h>

#define LILY_INT_RANGE_MAX_DIGITS 40
#define LILY_NUMBER_FRACTION_DIGITS 16 /* a bounded number's fraction digits at most (its unit 10^-16) */

/* The magnitudes [lo, hi] of one sign as digit strings of n_lo and n_hi digits; n_hi 0: none. lo_end: lo's
 * digits up to its last nonzero one (lo[lo_end..] are zeros). */
typedef struct {
    int n_lo, n_hi, lo_end;
    char lo[LILY_INT_RANGE_MAX_DIGITS + 1], hi[LILY_INT_RANGE_MAX_DIGITS + 1];
} lily_digit_range;

typedef struct {
    bool zero;            /* integer: 0 is in range ("0"; never "-0"); a number's zero is in pos */
    lily_digit_range pos; /* integer: the positive values' magnitudes; number: the non-negative ones' */
    lily_digit_range neg; /* the negative values' magnitudes */
} lily_int_range;

/* The integers in [lo, hi] (a side without has_*: unbounded, up to max_digits digits, or the other
 * bound's digit count when that is more). At least one of has_lo, has_hi; 1 <= max_digits <= 19. Returns
 * false when no integer is in range (has_lo && has_hi && lo > hi). */
bool lily_int_range_init(lily_int_range *r, bool has_lo, int64_t lo, bool has_hi, int64_t hi, int max_digits);

/* The numbers with at most LILY_NUMBER_FRACTION_DIGITS fraction digits in [lo, hi] (doubles, as the
 * shortest decimals that read back as them; exclusive: (lo, hi) on that side). A side without has_*:
 * unbounded, up to max_int_digits integer digits (or the other bound's when more). Returns false when no
 * such number is in range, or a bound's magnitude is 10^20 or more (has_* false for those on their open
 * side: they constrain nothing). */
bool lily_number_range_init(lily_int_range *r, bool has_lo, double lo, bool lo_exclusive, bool has_hi, double hi,
                            bool hi_exclusive, int max_int_digits);

/* The state of a magnitude's digits so far (the matcher's frame holds it; zeroed before the first digit). */
typedef struct {
    int32_t digits, cmp_lo, cmp_hi;
} lily_digit_state;

/* Whether the digits so far can be completed to a magnitude in r of min_len to max_len digits. */
bool lily_digit_range_open(const lily_digit_range *r, const lily_digit_state *s, int min_len, int max_len);

/* Take digit b ('0'-'9'; leading zeros are the caller's to refuse) when the digits after it can still be
 * completed to a magnitude in r of min_len to max_len digits. Returns false (s unchanged) otherwise. */
bool lily_digit_range_step(const lily_digit_range *r, lily_digit_state *s, unsigned char b, int min_len,
                           int max_len);

/* The digits so far, followed by zeros up to len digits (len >= s->digits), are a magnitude in r. O(1):
 * zeros compare below hi's digits or equal, and below lo's unless lo's are zeros from there on. */
bool lily_digit_range_complete(const lily_digit_range *r, const lily_digit_state *s, int len);

#endif
