/* sampler.c — logit bias, penalties, temperature, top-k / top-p / min-p and a seeded draw (sampler.h).
 *
 * Owns: the per-token history (generated counts, context flags) and the scratch rows a draw needs.
 * Cost per draw with a 248K vocab: one pass to copy and penalize, one to scale and find the max, then
 * top-k by a k-sized heap (one comparison per token after the first k), top-p by one exp-and-bin pass
 * that finds the cut without sorting the vocab, and no sort at all for the draw itself: the candidate
 * set is a rank cut plus a min-p threshold, and the draw is the Gumbel-max of base/philox.h over it (the
 * same numbers the CUDA sampler draws with).
 */
#include "runtime/sampler.h"

#include <math.h>

#include "base/philox.h"
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

/* Tokens this many nats below the max have probability ratio < 4e-18: below the float resolution of any
 * total that includes the max, so they are treated as impossible. */
#define NEGLIGIBLE 40.0f
enum { EXP_TABLE_SIZE = 40 * 32 + 1 };
/* Temperatures below this are greedy (as in vLLM): dividing by them would overflow the logits. */
#define GREEDY_BELOW 1e-5f

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
    float *weight;               /* [vocab] exp(z - max), for the top-p cut */
    candidate *cand;             /* [vocab] */
    float exp_table[EXP_TABLE_SIZE]; /* exp(-j / 32), see neg_exp */
    uint64_t draws;              /* lily_sampler_sample calls since the reset: the next draw's index */
};

lily_sampler_params lily_sampler_defaults(void)
{
    lily_sampler_params p = {0};
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    return p;
}

lily_sampler_params lily_sampler_recommended(void)
{
    lily_sampler_params p = lily_sampler_defaults();
    p.top_p = 0.95f;
    p.top_k = 20;
    return p;
}

lily_sampler_params lily_sampler_params_normalize(lily_sampler_params p)
{
    if (p.top_p == 0.0f) {
        p.temperature = 0.0f;
        p.top_p = 1.0f;
    }
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
    s->weight = malloc((size_t)vocab * sizeof *s->weight);
    s->cand = malloc((size_t)vocab * sizeof *s->cand);
    if (p->n_logit_bias > 0) {
        s->logit_bias = malloc((size_t)p->n_logit_bias * sizeof *s->logit_bias);
        if (s->logit_bias)
            memcpy(s->logit_bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof *s->logit_bias);
    }
    s->params.logit_bias = s->logit_bias;
    if (!s->generated_count || !s->in_context || !s->work || !s->weight || !s->cand || (p->n_logit_bias > 0 && !s->logit_bias)) {
        lily_sampler_free(s);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "sampler: out of memory for vocab %d", vocab);
    }
    for (int j = 0; j < EXP_TABLE_SIZE; j++)
        s->exp_table[j] = (float)exp(-j / 32.0);
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
    free(s->weight);
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
    s->draws = 0;
}

uint64_t lily_sampler_draw_index(const lily_sampler *s) { return s->draws; }

void lily_sampler_set_draw_index(lily_sampler *s, uint64_t draw) { s->draws = draw; }

int lily_sampler_history(const lily_sampler *s, int32_t *ids, uint32_t *counts)
{
    if (ids)
        for (int i = 0; i < s->n_touched; i++) {
            ids[i] = s->touched[i];
            counts[i] = s->generated_count[s->touched[i]];
        }
    return s->n_touched;
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

/* exp(-d) for d >= 0, 0 beyond NEGLIGIBLE: a table at steps of 1/32 times a cubic for the remainder
 * r < 1/32 (truncation error r^4/24 < 4e-8, under float resolution); cheaper than expf when every
 * token of a 248K vocab needs a weight. */
static inline float neg_exp(const float *table, float d)
{
    if (!(d < NEGLIGIBLE))
        return 0.0f;
    float x = d * 32.0f;
    int j = (int)x;
    float r = (x - (float)j) * (1.0f / 32.0f);
    return table[j] * (1.0f - r * (1.0f - r * (0.5f - r * (1.0f / 6.0f))));
}

/* a ranks before b: higher logit, then lower id. */
static inline bool ranks_before(candidate a, candidate b) { return a.z > b.z || (a.z == b.z && a.id < b.id); }

static int compare_candidates(const void *pa, const void *pb)
{
    candidate a = *(const candidate *)pa, b = *(const candidate *)pb;
    return ranks_before(a, b) ? -1 : ranks_before(b, a) ? 1 : 0;
}

/* Lowest id among the largest values; NaN never wins. */
static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    float best_value = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > best_value) {
            best_value = x[i];
            best = i;
        }
    return best;
}

/* The k best of work[vocab] into cand[0, k), sorted. A min-heap of the k best so far, worst at the root;
 * after the first k tokens almost every token fails the one comparison with the root. */
static int select_top_k(lily_sampler *s, int k)
{
    candidate *h = s->cand;
    int n = 0;
    for (int i = 0; i < s->vocab; i++) {
        candidate c = {s->work[i], i};
        if (c.z != c.z)
            c.z = -INFINITY; /* NaN never wins */
        if (n < k) {
            int j = n++;
            while (j > 0 && ranks_before(h[(j - 1) / 2], c)) {
                h[j] = h[(j - 1) / 2];
                j = (j - 1) / 2;
            }
            h[j] = c;
        } else if (c.z >= h[0].z && ranks_before(c, h[0])) {
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

/* Top-p over the whole vocab without sorting it: the last token of the smallest rank-ordered prefix
 * whose mass reaches `target`. weight[i] = exp(z_i - m) is filled for every token. Tokens are binned by
 * their distance below the max (TOP_P_BINS bins of 1/32 nat; the last bin takes everything further);
 * the bins' masses locate the bin holding the cut, and only that bin is sorted. Exact up to the order
 * of float additions. */
enum { TOP_P_BINS = 1024 };
static candidate top_p_cut(lily_sampler *s, float m, double p)
{
    double bin_mass[TOP_P_BINS] = {0};
    double total = 0.0;
    for (int i = 0; i < s->vocab; i++) {
        if (s->work[i] < m - NEGLIGIBLE) {
            s->weight[i] = 0.0f;
            continue;
        }
        float w = neg_exp(s->exp_table, m - s->work[i]);
        s->weight[i] = w;
        float d = (m - s->work[i]) * (TOP_P_BINS / 32.0f);
        int b = d < (float)(TOP_P_BINS - 1) ? (int)d : TOP_P_BINS - 1;
        bin_mass[b] += w;
        total += w;
    }
    const double target = p * total;
    double cum = 0.0;
    int cut_bin = TOP_P_BINS - 1;
    for (int b = 0; b < TOP_P_BINS; b++) {
        if (cum + bin_mass[b] >= target) {
            cut_bin = b;
            break;
        }
        cum += bin_mass[b];
    }
    int n = 0;
    for (int i = 0; i < s->vocab; i++) {
        if (s->work[i] < m - NEGLIGIBLE)
            continue;
        float d = (m - s->work[i]) * (TOP_P_BINS / 32.0f);
        int b = d < (float)(TOP_P_BINS - 1) ? (int)d : TOP_P_BINS - 1;
        if (b == cut_bin)
            s->cand[n++] = (candidate){s->work[i], i};
    }
    qsort(s->cand, (size_t)n, sizeof *s->cand, compare_candidates);
    for (int i = 0; i < n; i++) {
        cum += s->weight[s->cand[i].id];
        if (cum >= target)
            return s->cand[i];
    }
    return s->cand[n - 1]; /* rounding: the whole bin */
}

/* Fill s->cand[0, n) with the final candidate set. want_sorted: rank order, each .z replaced by its
 * unnormalized probability exp(z - max); else (the draw) .z the scaled logit z, in rank order with top-k
 * and id order otherwise (the draw needs no ranks, and skipping the sort keeps a 248K-token vocab cheap).
 * Greedy: one candidate, the argmax. Returns n >= 1. */
static int compute_candidates(lily_sampler *s, const float *logits, bool want_sorted)
{
    const lily_sampler_params *p = &s->params;
    const int V = s->vocab;
    lily_sampler_apply_penalties(s, logits, s->work);
    if (p->temperature < GREEDY_BELOW || p->top_k == 1) {
        s->cand[0] = (candidate){1.0f, argmax(s->work, V)};
        return 1;
    }
    const float inv_t = 1.0f / p->temperature;
    int n = 0;
    bool ranked = false;
    float m;
    if (p->top_k > 0 && p->top_k < V) {
        /* Rank on the unscaled logits (temperature > 0 keeps the order) and scale only the k kept. */
        n = select_top_k(s, p->top_k);
        ranked = true;
        for (int i = 0; i < n; i++)
            s->cand[i].z *= inv_t;
        m = s->cand[0].z;
    } else {
        m = -INFINITY;
        for (int i = 0; i < V; i++) {
            float z = s->work[i] * inv_t;
            z = z == z ? z : -INFINITY; /* NaN never wins */
            s->work[i] = z;
            m = z > m ? z : m;
        }
    }
    if (m == -INFINITY || isinf(m)) { /* every token banned, or a +inf logit: fall back to the argmax */
        s->cand[0] = (candidate){1.0f, ranked ? s->cand[0].id : argmax(s->work, V)};
        return 1;
    }
    /* min-p: p_i >= min_p * p_max  <=>  z_i >= m + log(min_p) */
    float lo = p->min_p > 0.0f ? m + logf(p->min_p) : -INFINITY;
    if (lo < m - NEGLIGIBLE)
        lo = m - NEGLIGIBLE;
    if (ranked) {
        if (p->top_p < 1.0f) { /* over the top-k set, renormalized */
            double mass = 0.0, cum = 0.0;
            for (int i = 0; i < n; i++)
                mass += neg_exp(s->exp_table, m - s->cand[i].z);
            for (int i = 0; i < n; i++) {
                cum += neg_exp(s->exp_table, m - s->cand[i].z);
                if (cum >= (double)p->top_p * mass) {
                    n = i + 1;
                    break;
                }
            }
        }
        while (n > 1 && !(s->cand[n - 1].z >= lo)) /* ranked: min-p cuts a suffix */
            n--;
    } else if (p->top_p < 1.0f) {
        candidate cut = top_p_cut(s, m, (double)p->top_p);
        for (int i = 0; i < V; i++) {
            candidate c = {s->work[i], i};
            if ((c.z > cut.z || (c.z == cut.z && i <= cut.id)) && c.z >= lo)
                s->cand[n++] = c;
        }
    } else {
        for (int i = 0; i < V; i++)
            if (s->work[i] >= lo)
                s->cand[n++] = (candidate){s->work[i], i};
    }
    if (n == 0) /* cannot happen: the max itself always passes; keep the argmax to be safe */
        s->cand[n++] = (candidate){m, argmax(s->work, V)};
    if (!want_sorted)
        return n;
    if (!ranked)
        qsort(s->cand, (size_t)n, sizeof *s->cand, compare_candidates);
    /* From here on cand[i].z holds the unnormalized probability exp(z - m) (top_p_cut computed it). */
    if (!ranked && p->top_p < 1.0f)
        for (int i = 0; i < n; i++)
            s->cand[i].z = s->weight[s->cand[i].id];
    else
        for (int i = 0; i < n; i++)
            s->cand[i].z = neg_exp(s->exp_table, m - s->cand[i].z);
    return n;
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
    const uint64_t draw = s->draws++;
    const int n = compute_candidates(s, logits, false);
    if (n == 1)
        return s->cand[0].id;
    /* Gumbel-max over the candidates (base/philox.h): the largest z + noise, ties to the lower id. Start
     * from the likeliest candidate, then skip without the logarithms every token that provably cannot
     * beat the best key K: z - log(E) > K needs E = -log(u) < r = exp(z - K), and E >= 1 - u, so
     * 1 - u >= r (with margin for neg_exp's rounding) rules it out. */
    const uint64_t seed = s->params.seed;
    int top = 0;
    for (int i = 1; i < n; i++)
        if (s->cand[i].z > s->cand[top].z || (s->cand[i].z == s->cand[top].z && s->cand[i].id < s->cand[top].id))
            top = i;
    int32_t best = s->cand[top].id;
    double best_key = (double)s->cand[top].z + lily_gumbel_noise(seed, draw, (uint32_t)best);
    lily_philox_block block = {{0, 0, 0, 0}};
    uint32_t block_group = UINT32_MAX;
    for (int i = 0; i < n; i++) {
        const uint32_t id = (uint32_t)s->cand[i].id;
        if (i == top)
            continue;
        if (id >> 2 != block_group) {
            block = lily_philox_draw_block(seed, draw, id);
            block_group = id >> 2;
        }
        const double u = lily_philox_token_uniform(block, id);
        const double below = best_key - (double)s->cand[i].z;
        if (below > 0.0 && 1.0 - u >= (double)neg_exp(s->exp_table, (float)below) * (1.0 + 1e-5) + 1e-15)
            continue;
        const double key = (double)s->cand[i].z + lily_gumbel_of_uniform(u);
        if (key > best_key || (key == best_key && (int32_t)id < best)) {
            best_key = key;
            best = (int32_t)id;
        }
    }
    return best;
}
