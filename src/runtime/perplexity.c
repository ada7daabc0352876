/* perplexity.c — teacher-forced perplexity over windows, and agreement with reference logits (perplexity.h).
 *
 * Definitions (as llama.cpp's perplexity and the seed engine's accuracy check report them): perplexity =
 * exp(mean over scored positions of -log p(token[i+1] | tokens[..i])); top-1 agreement = the fraction of
 * positions whose argmax equals the reference's; KL = sum_v p_ref(v) (log p_ref(v) - log p(v)), averaged.
 * All in double precision from fp32 logits.
 */
#include "perplexity.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double lily_logsumexp(const float *logits, int n)
{
    float m = logits[0];
    for (int j = 1; j < n; j++)
        m = logits[j] > m ? logits[j] : m;
    double s = 0;
    for (int j = 0; j < n; j++)
        s += exp((double)logits[j] - m);
    return (double)m + log(s);
}

int lily_argmax(const float *logits, int n)
{
    int best = 0;
    for (int j = 1; j < n; j++)
        if (logits[j] > logits[best])
            best = j;
    return best;
}

/* KL(ref || ours) for one position, given both log-normalisers. */
static double kl_row(const float *ref, double ref_lse, const float *ours, double ours_lse, int n)
{
    double kl = 0;
    for (int j = 0; j < n; j++) {
        double lp_ref = (double)ref[j] - ref_lse;
        double p_ref = exp(lp_ref);
        if (p_ref > 0)
            kl += p_ref * (lp_ref - ((double)ours[j] - ours_lse));
    }
    return kl > 0 ? kl : 0; /* rounding can make a ~0 divergence slightly negative */
}

double lily_kl_divergence(const float *ref, const float *ours, int n)
{
    return kl_row(ref, lily_logsumexp(ref, n), ours, lily_logsumexp(ours, n), n);
}

lily_status lily_perplexity_run(lily_session *s, const int32_t *tokens, int64_t n, const lily_perplexity_options *opts,
                                lily_perplexity_result *out, lily_error *err)
{
    memset(out, 0, sizeof *out);
    const int vocab = s->engine->cfg.vocab_size;
    int ctx = opts && opts->ctx > 0 ? opts->ctx : s->max_ctx;
    int chunk = opts && opts->chunk > 0 ? opts->chunk : 64;
    const float *ref = opts ? opts->ref_logits : NULL;
    int64_t ref_rows = ref ? opts->ref_rows : 0;
    if (n < 2)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "perplexity: needs at least 2 tokens (got %lld)",
                              (long long)n);
    if (ctx < 2 || ctx > s->max_ctx)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT,
                              "perplexity: window of %d tokens must be in [2, %d] (the session's context)", ctx,
                              s->max_ctx);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT,
                                  "perplexity: token %lld at position %lld is outside the vocabulary [0, %d)",
                                  (long long)tokens[i], (long long)i, vocab);
    if (chunk > ctx)
        chunk = ctx;
    float *logits = malloc((size_t)chunk * (size_t)vocab * sizeof *logits);
    if (!logits)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "perplexity: no memory for [%d, %d] logits", chunk, vocab);

    double ref_nll = 0, lily_ref_nll = 0;
    for (int64_t w0 = 0; w0 < n; w0 += ctx) {
        int64_t w1 = w0 + ctx < n ? w0 + ctx : n;
        if (w1 - w0 < 2 && out->n_windows > 0)
            break; /* a 1-token tail has nothing to score */
        out->n_windows++;
        lily_session_reset(s);
        for (int64_t c0 = w0; c0 < w1; c0 += chunk) {
            int m = (int)(w1 - c0 < chunk ? w1 - c0 : chunk);
            lily_status st = lily_session_append(s, tokens + c0, m, logits, err);
            if (st != LILY_OK) {
                free(logits);
                return st;
            }
            for (int r = 0; r < m; r++) {
                int64_t pos = c0 + r;
                const float *row = logits + (size_t)r * vocab;
                double lse = lily_logsumexp(row, vocab);
                int scored = pos + 1 < w1;
                const double nll = scored ? lse - (double)row[tokens[pos + 1]] : 0;
                if (scored) {
                    out->nll_sum += nll;
                    out->n_scored++;
                }
                if (pos < ref_rows) {
                    const float *rrow = ref + (size_t)pos * vocab;
                    double rlse = lily_logsumexp(rrow, vocab);
                    double kl = kl_row(rrow, rlse, row, lse, vocab);
                    out->kl_sum += kl;
                    out->kl_max = kl > out->kl_max ? kl : out->kl_max;
                    out->top1_agree += lily_argmax(row, vocab) == lily_argmax(rrow, vocab);
                    out->n_compared++;
                    if (scored) {
                        ref_nll += rlse - (double)rrow[tokens[pos + 1]];
                        lily_ref_nll += nll;
                        out->ref_n_scored++;
                    }
                }
            }
            if (opts && opts->progress)
                opts->progress(opts->progress_user, c0 + m, n);
        }
    }
    free(logits);
    out->nll_mean = out->n_scored ? out->nll_sum / (double)out->n_scored : 0;
    out->perplexity = exp(out->nll_mean);
    if (out->n_compared) {
        out->top1_agreement = (double)out->top1_agree / (double)out->n_compared;
        out->kl_mean = out->kl_sum / (double)out->n_compared;
    }
    if (out->ref_n_scored) {
        out->ref_nll_mean = ref_nll / (double)out->ref_n_scored;
        out->ref_perplexity = exp(out->ref_nll_mean);
        out->lily_ref_nll_mean = lily_ref_nll / (double)out->ref_n_scored;
        out->lily_ref_perplexity = exp(out->lily_ref_nll_mean);
    }
    return LILY_OK;
}
