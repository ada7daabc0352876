/* test_toy_constraint.h — a toy token constraint (generate.h's lily_token_constraint, both mask forms) for
 * the device-loop tests: after an optional opening token, the k-th constrained token (from 0) must be
 * = k (mod 3) or id 0 or 1, and nothing may follow the `limit`-th. Header-only. */
#ifndef LILY_TEST_TOY_CONSTRAINT_H
#define LILY_TEST_TOY_CONSTRAINT_H

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "runtime/generate.h"

typedef struct {
    int limit, k;
    int32_t after;
    bool waiting;
} toy_constraint;

/* Whether the k-th constrained token may be id v. */
static inline bool toy_allows_at(int k, int v) { return v % 3 == k % 3 || v < 2; }

/* What both mask forms return before they look at tokens: 0 while waiting, -1 once the value is complete,
 * else 1 (constrained). */
static inline int toy_phase(const toy_constraint *t) { return t->waiting ? 0 : t->k >= t->limit ? -1 : 1; }

static inline int toy_mask(void *user, float *logits, int vocab)
{
    toy_constraint *t = user;
    if (toy_phase(t) <= 0)
        return toy_phase(t);
    int n = 0;
    for (int v = 0; v < vocab; v++) {
        if (toy_allows_at(t->k, v))
            n++;
        else
            logits[v] = -INFINITY;
    }
    return n;
}

static inline int toy_allowed(void *user, uint32_t *bits, int vocab)
{
    toy_constraint *t = user;
    if (toy_phase(t) <= 0)
        return toy_phase(t);
    int n = 0;
    memset(bits, 0, (size_t)(vocab + 31) / 32 * sizeof *bits);
    for (int v = 0; v < vocab; v++)
        if (toy_allows_at(t->k, v)) {
            bits[v >> 5] |= 1u << (v & 31);
            n++;
        }
    return n;
}

static inline void toy_accept(void *user, int32_t token)
{
    toy_constraint *t = user;
    if (t->waiting)
        t->waiting = token != t->after;
    else
        t->k++;
}

/* t reset: `limit` constrained tokens after the token `after` (-1: at once). */
static inline lily_token_constraint toy_constraint_hook(toy_constraint *t, int limit, int32_t after)
{
    *t = (toy_constraint){.limit = limit, .after = after, .waiting = after >= 0};
    return (lily_token_constraint){.user = t, .mask = toy_mask, .allowed = toy_allowed, .accept = toy_accept};
}

#endif
