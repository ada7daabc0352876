/* embed.cuh — the token embedding lookup (embed.cu). */
#ifndef LILY_CUDA_EMBED_CUH
#define LILY_CUDA_EMBED_CUH

#include "cuda_common.cuh"

cudaError_t launch_embed(const dmat &e, const int *tokens, int n, float *h, int hidden, int *bad_token,
                         cudaStream_t s);

#endif
