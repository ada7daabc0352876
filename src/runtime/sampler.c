/* sampler.c — logit bias, penalties, temperature, top-k / top-p / min-p and a seeded draw (sampler.h).
 *
 * Owns: the per-token history (generated counts, context flags) and the scratch rows a draw needs.
 * Cost per draw with a 248K vocab: one pass to copy and penalize, one to scale and find the max, then
 * top-k by a k-sized heap (O(vocab log k)), top-p by gathering tokens within a widening logit window
 * of the max until they hold enough mass (usually a few hundred tokens to sort, never the whole vocab
 * unless the distribution is nearly flat), and no sort at all when neither cut is on.
 */
#include "runtime/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* ---- PRNG ------------------------------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void lily_rng_seed(lily_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t lily_rng_next(lily_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double lily_rng_uniform(lily_rng *r) { return (double)(lily_rng_next(r) >> 11) * 0x1.0p-53; }

/* ---- sampler state --------------------------------------------------------------------------------- */

typedef struct {
    float z;    /* logit after penalties and temperature */
    int32_t id;
} candidate;

struct lily_sampler {
    lily_sampler_params params;
    lily_logit_bias *logit_bias; /* own copy of params.logit_bias */
    int vocab;
    uint32_t *generated_count;   /* [vocab] times each token was generated */
    uint8_t *in_context;         /* [vocab] 1 when the token is in the context (prompt or generated) */
    int32_t *touched;            /* ids with in_context set, each once: penalties visit only these */
    int n_touched, touched_cap;
    float *work;                 /* [vocab] penalized, then scaled logits */
    candidate *cand;             /* [vocab] */
    lily_rng rng;
};

lily_sampler_params lily_sampler_defaults(void)
{
    lily_sampler_params p = {0};
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    return p;
}

lily_status lily_sampler_new(const lily_sampler_params *params, int vocab, lily_sampler **out, lily_error *err)
{
    *out = NULL;
    const lily_sampler_params *p = params;
    if (vocab < 1)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "sampler: vocab %d < 1", vocab);
    if (!(p->temperature >= 0.0f) || isinf(p->temperature))
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "sampler: temperature %g must be >= 0",
                              (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "sampler: top_p %g must be in (0, 1]",
                              (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "sampler: min_p %g must be in [0, 1]",
                              (double)p->min_p);
    if (p->top_k < 0)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "sampler: top_k %d must be >= 0", p->top_k);
    if (!(p->repetition_penalty > 0.0f) || isinf(p->repetition_penalty))
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "sampler: repetition_penalty %g must be > 0",
                              (double)p->repetition_penalty);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "sampler: presence/frequency penalty not finite");
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "sampler: bad logit_bias list");
    for (int i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].token < 0 || p->logit_bias[i].token >= vocab || !isfinite(p->logit_bias[i].bias))
            return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT,
                                  "sampler: logit_bias entry %d: token %d outside [0, %d) or bias not finite", i,
                                  (int)p->logit_bias[i].token, vocab);

    lily_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "sampler: out of memory");
    s->params = *p;
    s->vocab = vocab;
    s->generated_count = calloc((size_t)vocab, sizeof *s->generated_count);
    s->in_context = calloc((size_t)vocab, 1);
    s->work = malloc((size_t)vocab * sizeof *s->work);
    s->cand = malloc((size_t)vocab * sizeof *s->cand);
    if (p->n_logit_bias > 0) {
        s->logit_bias = malloc((size_t)p->n_logit_bias * sizeof *s->logit_bias);
        if (s->logit_bias)
            memcpy(s->logit_bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof *s->logit_bias);
    }
    s->params.logit_bias = s->logit_bias;
    if (!s->generated_count || !s->in_context || !s->work || !s->cand || (p->n_logit_bias > 0 && !s->logit_bias)) {
        lily_sampler_free(s);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "sampler: out of memory for vocab %d", vocab);
    }
    lily_rng_seed(&s->rng, p->seed);
    *out = s;
    return LILY_OK;
}

void lily_sampler_free(lily_sampler *s)
{
    if (!s)
        return;
    free(s->logit_bias);
    free(s->generated_count);
    free(s->in_context);
    free(s->touched);
    free(s->work);
    free(s->cand);
    free(s);
}

void lily_sampler_reset(lily_sampler *s)
{
    for (int i = 0; i < s->n_touched; i++) {
        s->generated_count[s->touched[i]] = 0;
        s->in_context[s->touched[i]] = 0;
    }
    s->n_touched = 0;
    lily_rng_seed(&s->rng, s->params.seed);
}

static lily_status touch(lily_sampler *s, int32_t token, lily_error *err)
{
    if (s->in_context[token])
        return LILY_OK;
    if (s->n_touched == s->touched_cap) {
        int cap = s->touched_cap ? 2 * s->touched_cap : 256;
        int32_t *t = realloc(s->touched, (size_t)cap * sizeof *t);
        if (!t)
            return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "sampler: out of memory for the token history");
        s->touched = t;
        s->touched_cap = cap;
    }
    s->touched[s->n_touched++] = token;
    s->in_context[token] = 1;
    return LILY_OK;
}

lily_status lily_sampler_add_context(lily_sampler *s, const int32_t *tokens, int n, lily_error *err)
{
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= s->vocab)
            continue;
        lily_status st = touch(s, tokens[i], err);
        if (st != LILY_OK)
            return st;
    }
    return LILY_OK;
}

lily_status lily_sampler_accept(lily_sampler *s, int32_t token, lily_error *err)
{
    if (token < 0 || token >= s->vocab)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "sampler: token %d outside [0, %d)", (int)token,
                              s->vocab);
    lily_status st = touch(s, token, err);
    if (st != LILY_OK)
        return st;
    s->generated_count[token]++;
    return LILY_OK;
}

void lily_sampler_apply_penalties(const lily_sampler *s, const float *logits, float *out)
{
    const lily_sampler_params *p = &s->params;
    if (out != logits)
        memcpy(out, logits, (size_t)s->vocab * sizeof *out);
    for (int i = 0; i < p->n_logit_bias; i++)
        out[p->logit_bias[i].token] += p->logit_bias[i].bias;
    const float r = p->repetition_penalty;
    for (int i = 0; i < s->n_touched; i++) {
        int32_t id = s->touched[i];
        float x = out[id];
        if (r != 1.0f)
            x = x > 0.0f ? x / r : x * r;
        uint32_t c = s->generated_count[id];
        if (c > 0)
            x -= p->presence_penalty + p->frequency_penalty * (float)c;
        out[id] = x;
    }
}

/* ---- candidate selection --------------------------------------------------------------------------- */

/* a ranks before b: higher logit, then lower id. */
static inline bool ranks_before(candidate a, candidate b) { return a.z > b.z || (a.z == b.z && a.id < b.id); }

static int compare_candidates(const void *pa, const void *pb)
{
    candidate a = *(const candidate *)pa, b = *(const candidate *)pb;
    return ranks_before(a, b) ? -1 : ranks_before(b, a) ? 1 : 0;
}

static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best] || (isnan(x[best]) && !isnan(x[i])))
            best = i;
    return best;
}

/* The k best of work[vocab] into cand[0, k), sorted. A min-heap of the k best so far, worst at the root. */
static int select_top_k(lily_sampler *s, int k)
{
    candidate *h = s->cand;
    int n = 0;
    for (int i = 0; i < s->vocab; i++) {
        candidate c = {s->work[i], i};
        if (n < k) {
            int j = n++;
            while (j > 0 && ranks_before(h[(j - 1) / 2], c)) {
                h[j] = h[(j - 1) / 2];
                j = (j - 1) / 2;
            }
            h[j] = c;
        } else if (ranks_before(c, h[0])) {
            int j = 0;
            for (;;) {
                int l = 2 * j + 1, r = l + 1, worst = l;
                if (l >= n)
                    break;
                if (r < n && ranks_before(h[l], h[r]))
                    worst = r;
                if (!ranks_before(c, h[worst]))
                    break;
                h[j] = h[worst];
                j = worst;
            }
            h[j] = c;
        }
    }
    qsort(h, (size_t)n, sizeof *h, compare_candidates);
    return n;
}

/* Tokens within `window` of the max m that hold at least `mass` of exp(z - m) into cand, sorted; the
 * window doubles until they do (or covers everything). Exact: every token of the top-p set lies in any
 * logit-ordered prefix whose mass reaches the target. */
static int gather_mass(lily_sampler *s, float m, double mass)
{
    for (float window = 8.0f;; window *= 2.0f) {
        const float lo = m - window;
        double got = 0.0;
        int n = 0;
        for (int i = 0; i < s->vocab; i++)
            if (s->work[i] >= lo) {
                s->cand[n++] = (candidate){s->work[i], i};
                got += expf(s->work[i] - m);
            }
        if (got >= mass || n == s->vocab || isinf(window)) {
            qsort(s->cand, (size_t)n, sizeof *s->cand, compare_candidates);
            return n;
        }
    }
}

/* Fill s->cand[0, n) with the final candidate set, each .z replaced by its unnormalized probability
 * exp(z - max). The set is in rank order unless neither top-k nor top-p is on and want_sorted is false
 * (the draw then walks in id order, which saves a sort of the whole vocab). Returns n >= 1. */
static int compute_candidates(lily_sampler *s, const float *logits, bool want_sorted)
{
    const lily_sampler_params *p = &s->params;
    const int V = s->vocab;
    lily_sampler_apply_penalties(s, logits, s->work);
    if (p->temperature <= 0.0f || p->top_k == 1) {
        s->cand[0] = (candidate){1.0f, argmax(s->work, V)};
        return 1;
    }
    const float inv_t = 1.0f / p->temperature;
    float m = -INFINITY;
    for (int i = 0; i < V; i++) {
        float z = s->work[i] * inv_t;
        if (isnan(z))
            z = -INFINITY;
        s->work[i] = z;
        if (z > m)
            m = z;
    }
    if (m == -INFINITY || isinf(m)) { /* every token banned, or a +inf logit: fall back to the argmax */
        s->cand[0] = (candidate){1.0f, argmax(s->work, V)};
        return 1;
    }

    int n;
    bool top_p_on = p->top_p < 1.0f;
    double set_mass = 0.0; /* the mass top-p is a fraction of */
    if (p->top_k > 0 && p->top_k < V) {
        n = select_top_k(s, p->top_k);
        for (int i = 0; i < n; i++)
            set_mass += expf(s->cand[i].z - m);
    } else if (top_p_on) {
        for (int i = 0; i < V; i++)
            set_mass += expf(s->work[i] - m);
        n = gather_mass(s, m, (double)p->top_p * set_mass);
    } else {
        n = 0;
        for (int i = 0; i < V; i++)
            s->cand[n++] = (candidate){s->work[i], i};
        if (want_sorted)
            qsort(s->cand, (size_t)n, sizeof *s->cand, compare_candidates);
    }

    if (top_p_on) {
        const double target = (double)p->top_p * set_mass;
        double cum = 0.0;
        for (int i = 0; i < n; i++) {
            cum += expf(s->cand[i].z - m);
            if (cum >= target) {
                n = i + 1;
                break;
            }
        }
    }

    /* min-p: p_i >= min_p * p_max  <=>  z_i >= m + log(min_p); also drops zero-probability tokens. */
    const float lo = p->min_p > 0.0f ? m + logf(p->min_p) : -INFINITY;
    int kept = 0;
    for (int i = 0; i < n; i++)
        if (s->cand[i].z >= lo && s->cand[i].z > -INFINITY)
            s->cand[kept++] = s->cand[i];
    if (kept == 0) /* cannot happen: the max itself always passes; keep the argmax to be safe */
        s->cand[kept++] = (candidate){m, argmax(s->work, V)};
    /* From here on cand[i].z holds the unnormalized probability exp(z - m). */
    for (int i = 0; i < kept; i++)
        s->cand[i].z = expf(s->cand[i].z - m);
    return kept;
}

int lily_sampler_candidates(lily_sampler *s, const float *logits, int32_t *ids, float *probs)
{
    int n = compute_candidates(s, logits, true);
    double total = 0.0;
    for (int i = 0; i < n; i++)
        total += s->cand[i].z;
    for (int i = 0; i < n; i++) {
        ids[i] = s->cand[i].id;
        probs[i] = (float)(s->cand[i].z / total);
    }
    return n;
}

int32_t lily_sampler_sample(lily_sampler *s, const float *logits)
{
    int n = compute_candidates(s, logits, false);
    if (n == 1)
        return s->cand[0].id;
    double total = 0.0;
    for (int i = 0; i < n; i++)
        total += s->cand[i].z;
    const double u = lily_rng_uniform(&s->rng) * total;
    double cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += s->cand[i].z;
        if (u < cum)
            return s->cand[i].id;
    }
    return s->cand[n - 1].id; /* u within rounding of total */
}
