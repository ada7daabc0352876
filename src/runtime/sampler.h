/* sampler.h — picks the next token from a row of logits.
 *
 * Owns: logit bias, the repetition / presence / frequency penalties (with the token history they need),
 * temperature, the top-k / top-p / min-p cuts, and a seeded PRNG (xoshiro256**), so the same seed gives
 * the same tokens. Does not own: stop ids, stop strings and max tokens (generate.h).
 *
 * Order, as in HF transformers' LogitsProcessorList and vLLM:
 *   logit bias -> repetition penalty -> presence/frequency penalties -> (greedy: argmax)
 *   -> temperature -> top-k -> top-p (over the top-k set, renormalized) -> min-p -> draw.
 * Ties between equal logits are broken by the lower token id everywhere, so results never depend on
 * the order a sort happened to leave them in.
 */
#ifndef LILY_SAMPLER_H
#define LILY_SAMPLER_H

#include <stdint.h>

#include "lily.h"

typedef struct {
    int32_t token;
    float bias;              /* added to the token's logit; OpenAI's range is [-100, 100] */
} lily_logit_bias;

typedef struct {
    float temperature;        /* < 1e-5 (e.g. 0) = greedy argmax; default 1 */
    int top_k;                /* keep the k most likely tokens; 0 or negative (vLLM's -1) = off */
    float top_p;              /* keep the smallest most-likely set with probability >= top_p; 1 = off */
    float min_p;              /* keep tokens with p >= min_p * p_max; 0 = off */
    float presence_penalty;   /* OpenAI: logit -= presence_penalty when the token was generated; 0 = off */
    float frequency_penalty;  /* OpenAI: logit -= frequency_penalty * (times generated); 0 = off */
    float repetition_penalty; /* CTRL (Keskar et al. 2019) / HF: over every token in the context (prompt
                                 and generated), logit > 0 ? logit / r : logit * r; 1 = off */
    const lily_logit_bias *logit_bias; /* [n_logit_bias], copied at lily_sampler_new */
    int n_logit_bias;
    uint64_t seed;            /* PRNG seed: the same seed and inputs give the same tokens */
} lily_sampler_params;

/* temperature 1, top_k 0, top_p 1, min_p 0, no penalties, no bias, seed 0. */
lily_sampler_params lily_sampler_defaults(void);

typedef struct lily_sampler lily_sampler;

/* A sampler for a vocabulary of `vocab` tokens.
 * Errors: LILY_ERR_INVALID_ARGUMENT (vocab < 1, temperature < 0 or not finite, top_p outside (0, 1], min_p
 * outside [0, 1], repetition_penalty <= 0, penalties not finite,
 * a logit-bias token outside [0, vocab)); LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_sampler_new(const lily_sampler_params *params, int vocab, lily_sampler **out, lily_error *err);
void lily_sampler_free(lily_sampler *s);

/* Forget the history and reseed the PRNG with params.seed. */
void lily_sampler_reset(lily_sampler *s);

/* Record context tokens (e.g. the prompt) for the repetition penalty only. Ids outside the vocab are
 * ignored. Errors: LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_sampler_add_context(lily_sampler *s, const int32_t *tokens, int n, lily_error *err);

/* Record a generated token: it counts for the presence/frequency penalties and the repetition penalty.
 * Errors: LILY_ERR_INVALID_ARGUMENT for an id outside the vocab; LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_sampler_accept(lily_sampler *s, int32_t token, lily_error *err);

/* out[vocab] := logits[vocab] after logit bias and penalties (before temperature). For tests and
 * debugging; lily_sampler_sample applies the same transform. */
void lily_sampler_apply_penalties(const lily_sampler *s, const float *logits, float *out);

/* The candidate set a draw chooses from: ids[n] in decreasing probability (ties: lower id first) and
 * their probabilities probs[n] renormalized over the set (sum 1). ids and probs have room for vocab
 * entries. Greedy returns the argmax with probability 1. Returns n >= 1. Does not advance the PRNG. */
int lily_sampler_candidates(lily_sampler *s, const float *logits, int32_t *ids, float *probs);

/* Sample one token from logits[vocab] (fp32, not modified). Advances the PRNG unless greedy. Does not
 * record the token: call lily_sampler_accept with the token that is kept. */
int32_t lily_sampler_sample(lily_sampler *s, const float *logits);

/* The sampler's PRNG (xoshiro256**, Blackman & Vigna 2018, seeded by splitmix64), exposed for tests. */
typedef struct {
    uint64_t s[4];
} lily_rng;
void lily_rng_seed(lily_rng *r, uint64_t seed); /* the four words from splitmix64(seed) */
uint64_t lily_rng_next(lily_rng *r);            /* the next 64 random bits */
double lily_rng_uniform(lily_rng *r); /* [0, 1) with 53 random bits */

#endif
