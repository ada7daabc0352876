/* attention_prefill_wg.cuh — the Hopper (sm_90a) wgmma variant of the prefill flash attention
 * (attention_prefill_wg.cu), chosen by launch_attention_prefill when g_cuda_tuning.att_prefill is 2 (or
 * 3, 4: the pipelined forms) and attention_prefill_wg_supported(): same inputs, outputs and split-KV partials as the mma.sync kernel
 * (attention_prefill.cu), 128 query rows per block, 64 keys per tile.
 */
#ifndef LILY_ATTENTION_PREFILL_WG_CUH
#define LILY_ATTENTION_PREFILL_WG_CUH

#include "cuda_common.cuh"

#define APF_WG_BM 128 /* query rows (token x head) per block: 2 warpgroups x 64 */
#define APF_WG_BN 64  /* keys per tile */

/* The current device is compute capability 9.0 and runs the sm_90a image (the real kernel, not the stub
 * every other image compiles). Asked once per process. */
bool attention_prefill_wg_available(void);
/* attention_prefill_wg_available(), head_dim 64, 128 or 256 (and the generic attention_prefill_supported). */
bool attention_prefill_wg_supported(const attn_args &a);
/* The wgmma kernel for n_tokens >= 1 with n_splits >= 1 (the merge kernel is the caller's, as for the
 * mma.sync kernel); variant 0 (att_prefill 2): plain; 1 (att_prefill 3): a tile's softmax overlaps the
 * previous tile's P·V; 2 (att_prefill 4): as 1 with the refills issued after the wgmmas.
 * cudaErrorInvalidValue when !attention_prefill_wg_supported(a) or another variant. */
cudaError_t launch_attention_prefill_wg(const attn_args &a, int n_tokens, int n_splits, int variant, cudaStream_t s);

#endif
