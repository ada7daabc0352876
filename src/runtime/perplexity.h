/* perplexity.h — teacher-forced perplexity of a token sequence, and agreement with reference logits.
 *
 * Owns: windowing the input, scoring every next-token prediction (log-softmax in double precision), and
 * the comparison with a reference run (top-1 agreement, KL divergence, the reference's own perplexity on
 * the same positions). Does not own: tokenizing (text/tokenizer.h) or reading files (cli/cmd_perplexity.c).
 */
#ifndef LILY_PERPLEXITY_H
#define LILY_PERPLEXITY_H

#include <stdint.h>

#include "engine.h"
#include "lily.h"

typedef struct {
    int ctx;                 /* window length in tokens (0 = the session's max_ctx) */
    int chunk;               /* tokens per append while scoring (0 = 64): bounds the [chunk, vocab] logits buffer */
    /* Reference logits, fp32 [ref_rows, vocab] (the `lily eval --logits-out` format): row i holds the
     * logits after token i of the same sequence. NULL for none. Only positions < ref_rows are compared;
     * the windows must match how the reference was computed (one window covering it, usually). */
    const float *ref_logits;
    int64_t ref_rows;
    /* Called after each chunk with positions done and total (may be NULL). */
    void (*progress)(void *user, int64_t done, int64_t total);
    void *progress_user;
} lily_perplexity_options;

typedef struct {
    int n_windows;
    int64_t n_scored;        /* predictions scored: n_tokens - n_windows (a window's first token has no context) */
    double nll_sum;          /* sum of -log p(next token), natural log */
    double nll_mean;         /* nll_sum / n_scored */
    double perplexity;       /* exp(nll_mean) */
    /* against the reference (n_compared == 0 without one) */
    int64_t n_compared;      /* positions with both logits: every position of a window, also the last */
    int64_t top1_agree;      /* positions whose argmax matches the reference's */
    double top1_agreement;   /* top1_agree / n_compared */
    double kl_sum;           /* sum over compared positions of KL(reference || lily), nats */
    double kl_mean;
    double kl_max;
    int64_t ref_n_scored;    /* scored positions that have a reference row (fewer than n_scored when the
                                reference is shorter than the input) */
    double ref_nll_mean;     /* the reference's mean NLL on those positions */
    double ref_perplexity;
    double lily_ref_nll_mean; /* lily's own mean NLL on those same positions: what ref_nll_mean compares to */
    double lily_ref_perplexity;
} lily_perplexity_result;

/* Score tokens[0..n) with the session s (reset at the start of every window of opts->ctx tokens): for
 * each position i of a window with a next token in the same window, add -log softmax(logits_i)[tokens[i+1]].
 * The session is left holding the last window.
 * Errors: LILY_ERR_INVALID_ARGUMENT (n < 2, ctx < 2 or > s->max_ctx, a token outside the vocab);
 * LILY_ERR_OUT_OF_MEMORY; as lily_session_append. */
lily_status lily_perplexity_run(lily_session *s, const int32_t *tokens, int64_t n, const lily_perplexity_options *opts,
                                lily_perplexity_result *out, lily_error *err);

/* log-softmax helpers, exposed for tests and `lily eval`: log sum_j exp(logits[j]) in double, and argmax
 * (lowest index on ties). */
double lily_logsumexp(const float *logits, int n);
int lily_argmax(const float *logits, int n);

/* KL(softmax(ref) || softmax(ours)) = sum_j p_ref(j) (log p_ref(j) - log p_ours(j)) in nats, double
 * precision, over two fp32 logit rows of length n; rounding below 0 is clamped to 0. */
double lily_kl_divergence(const float *ref, const float *ours, int n);

#endif
