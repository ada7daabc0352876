/* sampling.cuh — choosing a token on the device with every setting of runtime/sampler.h.
 *
 * Per decode step, after the logits graph (enqueue only, no host sync):
 *   prep     logit bias, repetition / presence / frequency penalties, temperature -> work[vocab]; the max;
 *            a non-finite-logit flag
 *   select   (top-k, then top-p over the top-k set) each a rank cut found without sorting: a histogram
 *            of 1/32-nat bins below the max (counts and fixed-point masses), a 1/32768-nat histogram of
 *            the bin holding the cut when it is crowded, then an exact rank among the few tokens of the
 *            final bin; the cut is a (logit, id) threshold
 *   draw     Gumbel-max (base/philox.h) over the tokens above both thresholds and min-p; the logprobs of
 *            the raw logits when asked; the token into the next input slot, out_tokens, the penalty
 *            counts and the mapped host ring (token info, then the token and its count)
 * Each kernel runs on many blocks; the last block to finish does the kernel's small serial part.
 */
#ifndef LILY_CUDA_SAMPLING_CUH
#define LILY_CUDA_SAMPLING_CUH

extern "C" {
#include "backend/backend.h"
}
#include "../sample.cuh"

/* Token info records in mapped host memory, a ring indexed by the token's index in the decode loop (the
 * host reads record i before the device can run SAMPLE_INFO_RING steps past it). */
#define SAMPLE_INFO_RING 256
enum { SAMPLE_FLAG_NONFINITE = 1 };
typedef struct {
    int flags;                 /* SAMPLE_FLAG_NONFINITE: this step's logits held a NaN or an infinity */
    int has_logprobs;
    lily_token_logprobs lp;
} sample_token_info;

struct sample_control; /* device-side scratch of one step (sample_select.cu) */

/* The sampler's device buffers, made once per backend instance (cuda_sampling_new). */
typedef struct {
    int vocab;
    float *work;                 /* [vocab] penalized, scaled logits */
    float *bias;                 /* [vocab] dense logit bias (zero where none) */
    unsigned int *counts;        /* [vocab] generated counts of the request */
    unsigned char *in_context;   /* [vocab] 1: the token is in the request's context */
    int *stage_ids;              /* [vocab] upload staging: history ids */
    unsigned int *stage_counts;  /* [vocab] history counts */
    int *stage_bias_ids;         /* [vocab] logit-bias ids */
    float *stage_values;         /* [vocab] logit-bias values */
    struct sample_control *ctl;
    sample_token_info *info_host;  /* mapped host ring [SAMPLE_INFO_RING] */
    sample_token_info *info_dev;   /* its device address */
} sample_workspace;

/* Device bytes of the workspace for `vocab` (the memory plan counts them with the scratch). */
size_t cuda_sampling_bytes(int vocab);
/* Allocate / free the workspace (zeroed). Errors: cudaErrorMemoryAllocation and other CUDA errors. */
cudaError_t cuda_sampling_new(int vocab, sample_workspace *ws);
void cuda_sampling_free(sample_workspace *ws);

/* Before a decode loop: the request's penalty history and logit bias into the device tables (clears what
 * an earlier request left). Copies from pageable memory: returns when the host arrays may be reused. */
cudaError_t cuda_sampling_upload(const sample_workspace *ws, const lily_device_sampling *ds, cudaStream_t s);

/* Whether a request can take the fast path (the LM head's fused argmax, no sampling kernels). */
bool cuda_sampling_is_plain_greedy(const lily_device_sampling *ds);

/* Enqueue the sampling kernels of one step on c->logits[0, vocab) (fp32): the chosen token goes where
 * sample_args says (the step counter already advanced by the logits graph: slot step & 1), its info into
 * ws->info_dev[n_generated % SAMPLE_INFO_RING]. */
cudaError_t cuda_sampling_enqueue(const sample_workspace *ws, const sample_args &a, const lily_device_sampling *ds,
                                  cudaStream_t s);

/* Stream token i to the host: the token into mapped host memory, then (after a system-wide fence, so the
 * host never sees the count before the token or its info) the count. The host polls the count; no sync. */
__device__ __forceinline__ void sample_publish_token(const sample_args &a, int i, int tok)
{
    if (!a.host_tokens || i >= a.out_cap)
        return;
    a.host_tokens[i] = tok;
    __threadfence_system();
    *(volatile int *)&a.host_tokens[a.out_cap] = i + 1;
}

#endif
