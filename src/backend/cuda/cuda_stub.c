/* cuda_stub.c — linked when nvcc is not found: the CUDA backend is absent and its fast paths
 * (cuda_backend.h) report LILY_ERR_UNSUPPORTED. */
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

const lily_backend_ops *lily_cuda_backend_ops_get(void) { return NULL; }

static lily_status no_cuda(lily_error *err)
{
    return lily_error_set(err, LILY_ERR_UNSUPPORTED, "this build has no CUDA backend");
}

void lily_cuda_debug_poison(void *ctx, int step)
{
    (void)ctx;
    (void)step;
}

long long lily_cuda_host_syncs(void *ctx)
{
    (void)ctx;
    return 0;
}

lily_status lily_cuda_state_set_position(void *ctx, void *state, int pos, lily_error *err)
{
    (void)ctx, (void)state, (void)pos;
    return no_cuda(err);
}

lily_status lily_cuda_profile_decode(void *ctx, void *state, int32_t first_token, int n_steps,
                                     lily_cuda_profile *out, lily_error *err)
{
    (void)ctx, (void)state, (void)first_token, (void)n_steps, (void)out;
    return no_cuda(err);
}

lily_status lily_cuda_timeline_decode(void *ctx, void *state, int32_t first_token, int n_steps, lily_cuda_timeline *out,
                                      lily_error *err)
{
    (void)ctx, (void)state, (void)first_token, (void)n_steps, (void)out;
    return no_cuda(err);
}

lily_status lily_cuda_profile_prefill(void *ctx, void *state, const int32_t *tokens, int n, lily_cuda_profile *out,
                                      lily_error *err)
{
    (void)ctx, (void)state, (void)tokens, (void)n, (void)out;
    return no_cuda(err);
}

lily_status lily_cuda_device_memory(int device, size_t *used, size_t *total, lily_error *err)
{
    (void)device;
    *used = *total = 0;
    return no_cuda(err);
}

lily_status lily_cuda_membw(int device, size_t bytes, int reps, double *gbps, lily_error *err)
{
    (void)device, (void)bytes, (void)reps, (void)gbps;
    return no_cuda(err);
}

lily_status lily_cuda_set_attention_split(void *ctx, void *state, int n_splits, int min_chunk, lily_error *err)
{
    (void)ctx, (void)state, (void)n_splits, (void)min_chunk;
    return no_cuda(err);
}

lily_status lily_cuda_set_deltanet_fusion(void *ctx, void *state, int fused, lily_error *err)
{
    (void)ctx, (void)state, (void)fused;
    return no_cuda(err);
}
