/* sampler.h — picks the next token from a row of logits.
 *
 * Owns: logit bias, the repetition / presence / frequency penalties (with the token history they need),
 * temperature, the top-k / top-p / min-p cuts, and a seeded draw: Gumbel-max with the counter-based
 * numbers of base/philox.h keyed by (seed, draw index, token id), so the same seed, logits and draw index
 * give the same token here and on the device (the CUDA decode loop draws with the same numbers).
 * Does not own: stop ids, stop strings and max tokens (generate.h).
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
    uint64_t seed;            /* draw seed: the same seed and inputs give the same tokens */
} lily_sampler_params;

/* temperature 1, top_k 0, top_p 1, min_p 0, no penalties, no bias, seed 0. */
lily_sampler_params lily_sampler_defaults(void);

/* What lily samples with when the model directory has no generation_config.json: the values Qwen ships
 * in the Qwen3.5 / Qwen3.6 checkpoints' generation_config.json and recommends on the model cards for
 * thinking mode: temperature 1, top_p 0.95, top_k 20, min_p 0 (no penalties; the cards' presence_penalty
 * 1.5 for general thinking tasks is for a client to send). */
lily_sampler_params lily_sampler_recommended(void);

/* p as lily_sampler_new takes it: top_p 0, which OpenAI's API accepts (top_p in [0, 1]) and lily's CLI and
 * server take, keeps the smallest most-likely set with probability >= 0, the most likely token alone: it is
 * written as greedy (temperature 0, top_p 1). Any other p is returned unchanged. */
lily_sampler_params lily_sampler_params_normalize(lily_sampler_params p);

typedef struct lily_sampler lily_sampler;

/* A sampler for a vocabulary of `vocab` tokens.
 * Errors: LILY_ERR_INVALID_ARGUMENT (vocab < 1, temperature < 0 or not finite, top_p outside (0, 1], min_p
 * outside [0, 1], repetition_penalty <= 0, penalties not finite,
 * a logit-bias token outside [0, vocab)); LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_sampler_new(const lily_sampler_params *params, int vocab, lily_sampler **out, lily_error *err);
void lily_sampler_free(lily_sampler *s);

/* Forget the history and set the draw index to 0. */
void lily_sampler_reset(lily_sampler *s);

/* The index of the next draw (lily_sampler_sample calls since creation or reset), and setting it: a
 * caller whose draws ran elsewhere (the device loop draws index i + k for its step k) moves it past them. */
uint64_t lily_sampler_draw_index(const lily_sampler *s);
void lily_sampler_set_draw_index(lily_sampler *s, uint64_t draw);

/* The penalty history: the distinct token ids in the context (prompt and generated), in first-seen order,
 * into ids[n], and how often each was generated into counts[n]; returns n. NULL ids: only the count.
 * ids and counts need room for n (at most vocab). */
int lily_sampler_history(const lily_sampler *s, int32_t *ids, uint32_t *counts);

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
 * entries. Greedy returns the argmax with probability 1. Returns n >= 1. Does not advance the draw index. */
int lily_sampler_candidates(lily_sampler *s, const float *logits, int32_t *ids, float *probs);

/* Sample one token from logits[vocab] (fp32, not modified): the candidate set's token with the largest
 * z + lily_gumbel_noise(seed, draw index, id) (z: the logit after penalties and temperature; ties: the lower
 * id), which is distributed as the candidates' renormalized probabilities. Advances the draw index (also
 * when greedy). Does not record the token: call lily_sampler_accept with the token that is kept. */
int32_t lily_sampler_sample(lily_sampler *s, const float *logits);

/* A small PRNG (xoshiro256**, Blackman & Vigna 2018, seeded by splitmix64) for tests and tools that need
 * reproducible random inputs; draws do not use it. */
typedef struct {
    uint64_t s[4];
} lily_rng;
void lily_rng_seed(lily_rng *r, uint64_t seed); /* the four words from splitmix64(seed) */
uint64_t lily_rng_next(lily_rng *r);            /* the next 64 random bits */
double lily_rng_uniform(lily_rng *r); /* [0, 1) with 53 random bits */

#endif
