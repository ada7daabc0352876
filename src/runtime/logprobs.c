/* logprobs.c — log-softmax of one row of logits for a token and its top alternatives (logprobs.h). */
#include "runtime/logprobs.h"

#include <math.h>
#include <string.h>

void lily_logprobs_compute(const float *logits, int vocab, int32_t token, int n_top, lily_token_logprobs *out)
{
    memset(out, 0, sizeof *out);
    float max = -INFINITY;
    for (int i = 0; i < vocab; i++)
        max = logits[i] > max ? logits[i] : max;
    double sum = 0;
    for (int i = 0; i < vocab; i++)
        sum += exp((double)(logits[i] - max));
    const float lse = max + (float)log(sum);
    out->logprob = logits[token] - lse;
    if (n_top > LILY_TOP_LOGPROBS_MAX)
        n_top = LILY_TOP_LOGPROBS_MAX;
    int32_t *top = out->top_ids;
    int n = 0;
    for (int i = 0; i < vocab && n_top > 0; i++) { /* insertion into the top n_top (ties: lower id first) */
        if (n == n_top && logits[i] <= logits[top[n - 1]])
            continue;
        int k = n < n_top ? n++ : n - 1;
        while (k > 0 && logits[top[k - 1]] < logits[i]) {
            top[k] = top[k - 1];
            k--;
        }
        top[k] = i;
    }
    for (int k = 0; k < n; k++)
        out->top_logprobs[k] = logits[top[k]] - lse;
    out->n_top = n;
}
