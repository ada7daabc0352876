/* sampling.cuh — choosing a token on the device with every setting of runtime/sampler.h.
 *
 * Per decode step, after the logits graph (enqueue only, no host sync):
 *   wait     (constrained decoding only) one thread waits until the host has published this step's token
 *            mask in mapped host memory (sample_mask_channel), or the host aborts, or a timeout passes
 *   prep     the mask, logit bias, repetition / presence / frequency penalties, temperature -> work[vocab];
 *            the max; a non-finite-logit flag
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
enum { SAMPLE_FLAG_NONFINITE = 1, SAMPLE_FLAG_MASK_TIMEOUT = 2 };

/* How long a constrained step's sampling waits for its mask before it gives up (the host then reports
 * the error): far beyond any mask's cost (~0.2 ms) or a busy host's scheduling delay, short of a hang. */
#define SAMPLE_MASK_TIMEOUT_NS 10000000000ull

/* The host-to-device channel of constrained decoding, in page-locked mapped host memory. The host writes
 * the mask of step i (bits, or all = 1 for every token), then published = i + 1; the step's wait kernel
 * polls published; abort (set by the host when it stops the loop) releases every waiting step at once. */
typedef struct {
    volatile int published;
    volatile int abort;
    volatile int all;
    int pad;
    unsigned int bits[1]; /* [(vocab + 31) / 32]: bit id & 31 of word id >> 5 set = token id allowed */
} sample_mask_channel;
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
    sample_mask_channel *mask_host; /* mapped host memory: the constrained-decoding channel */
    sample_mask_channel *mask_dev;  /* its device address */
} sample_workspace;

/* Device bytes of the workspace for `vocab` (the memory plan counts them with the scratch). */
size_t cuda_sampling_bytes(int vocab);
/* Allocate / free the workspace (zeroed). Errors: cudaErrorMemoryAllocation and other CUDA errors. */
cudaError_t cuda_sampling_new(int vocab, sample_workspace *ws);
void cuda_sampling_free(sample_workspace *ws);

/* Before a decode loop: the request's penalty history and logit bias into the device tables (clears what
 * an earlier request left). Copies from pageable memory: returns when the host arrays may be reused. */
cudaError_t cuda_sampling_upload(const sample_workspace *ws, const lily_device_sampling *ds, cudaStream_t s);

/* Whether a request can take the fast path (the LM head's fused argmax, no sampling kernels: no mask). */
bool cuda_sampling_is_plain_greedy(const lily_device_sampling *ds);

/* Enqueue the sampling kernels of one step on c->logits[0, vocab) (fp32): the chosen token goes where
 * sample_args says (the step counter already advanced by the logits graph: slot step & 1), its info into
 * ws->info_dev[n_generated % SAMPLE_INFO_RING]. With ds->token_mask the step first waits for mask
 * n_generated on ws->mask_dev (cuda_sampling_mask_*). */
cudaError_t cuda_sampling_enqueue(const sample_workspace *ws, const sample_args &a, const lily_device_sampling *ds,
                                  cudaStream_t s);

/* Constrained decoding, host side: before a decode loop (no step of an earlier one running) reset the
 * channel; publish the mask of step `index` as ds->token_mask writes it into the channel; abort releases
 * every step still waiting (call it before waiting for the stream when the loop stops or fails). */
void cuda_sampling_mask_reset(const sample_workspace *ws);
void cuda_sampling_mask_publish(const sample_workspace *ws, const lily_device_sampling *ds, int index);
void cuda_sampling_mask_abort(const sample_workspace *ws);

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
