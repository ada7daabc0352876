/* sample.cuh — what sample.cu defines: the end of a greedy decode step on the device (the argmax into the
 * next input slot), the position/step counters and small fill kernels; the arguments the samplers of
 * sampling/ share. */
#ifndef LILY_CUDA_SAMPLE_CUH
#define LILY_CUDA_SAMPLE_CUH

#include "cuda_common.cuh"

struct sample_args {
    unsigned long long *argmax; /* greedy: packed (value,row) from the LM-head GEMV, reset here */
    const float *logits;        /* [vocab] */
    int vocab;
    int *token_slots;           /* [2] next-step input slots */
    int *out_tokens;            /* [cap] generated ids */
    int out_cap;
    int *step;                  /* forward-call counter, advanced here */
    int *pos;                   /* position, advanced by n here */
    int *n_generated;
    int *host_tokens;           /* mapped host memory [out_cap + 1] (tokens, then the count), or NULL */
    void *token_info;           /* the device address of the token info ring (sampling/sampling.cuh), or NULL */
};
/* Greedy: token = argmax; writes slot[(step+1)&1], out_tokens[n_generated++]; advances pos/step. */
cudaError_t launch_finish_greedy(const sample_args &a, cudaStream_t s);
/* Advance pos by n and step by 1 (used by forward()). */
cudaError_t launch_advance(int *pos, int *step, int n, cudaStream_t s);
/* *p = v (a kernel, so the host never waits on a pageable copy). */
cudaError_t launch_set_int(int *p, int v, cudaStream_t s);
/* Fill n bf16 values with a deterministic pseudo-random pattern in [-1, 1] (bench: a KV cache at depth). */
cudaError_t launch_fill_random_bf16(__nv_bfloat16 *p, size_t n, unsigned int seed, cudaStream_t s);
/* The same values (as bf16 rounds them) stored fp32, for an exact-mode KV cache. */
cudaError_t launch_fill_random_f32(float *p, size_t n, unsigned int seed, cudaStream_t s);
/* Tests (lily_cuda_debug_poison): h[0, n) := NaN when *step == at. */
cudaError_t launch_poison_hidden(float *h, int n, const int *step, int at, cudaStream_t s);
/* Reads the current input token from slot[step & 1] into tokens[0] (decode graph's first node). */
cudaError_t launch_fetch_token(const int *token_slots, const int *step, int *tokens, cudaStream_t s);

#endif
