/* attention_prefill_wg.cuh — the Hopper (sm_90a) wgmma kernel of the prefill flash attention
 * (attention_prefill_wg.cu), run by launch_attention_prefill for ATTN_PREFILL_WGMMA when
 * attention_prefill_wg_supported(): same inputs, outputs and split-KV partials as the mma.sync kernel
 * (attention_prefill.cu), 128 query rows per block, 64 keys per tile.
 */
#ifndef LILY_ATTENTION_PREFILL_WG_CUH
#define LILY_ATTENTION_PREFILL_WG_CUH

#include "attention.cuh"

#define APF_WG_BM 128 /* query rows (token x head) per block: 2 warpgroups x 64 */
#define APF_WG_BN 64  /* keys per tile */

/* The current device is compute capability 9.0 and runs the sm_90a image (the real kernel, not the stub
 * every other image compiles). Asked once per process. */
bool attention_prefill_wg_available(void);
/* attention_prefill_wg_available(), head_dim 64, 128 or 256 (and the generic attention_prefill_supported). */
bool attention_prefill_wg_supported(const attn_args &a);
/* The wgmma kernel for n_tokens >= 1 with n_splits >= 1 (the merge kernel is the caller's, as for the
 * mma.sync kernel). cudaErrorInvalidValue when !attention_prefill_wg_supported(a). */
cudaError_t launch_attention_prefill_wg(const attn_args &a, int n_tokens, int n_splits, cudaStream_t s);

#endif
