/* logprobs.h — a token's log-probability and the most likely alternatives from a row of logits (host).
 *
 * The OpenAI API's logprobs: the log-softmax of the raw logits (before logit bias, penalties and
 * temperature). The CUDA decode loop computes the same on the device (backend.h's lily_token_logprobs).
 */
#ifndef LILY_LOGPROBS_H
#define LILY_LOGPROBS_H

#include <stdint.h>

#include "backend/backend.h"

/* out := the logprob of `token` under log-softmax(logits[vocab]) and the n_top (clamped to
 * [0, LILY_TOP_LOGPROBS_MAX]) most likely tokens, largest first, equal logits: the lower id first.
 * log-sum-exp as max + log(sum exp(logit - max)) with the sum in double. */
void lily_logprobs_compute(const float *logits, int vocab, int32_t token, int n_top, lily_token_logprobs *out);

#endif
