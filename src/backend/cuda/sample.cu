/* sample.cu — choosing the next token on the device and the step bookkeeping of the decode graph.
 *
 * Greedy: the LM-head GEMV already folded an atomicMax of (logit, -row) into *argmax; finish_greedy
 * turns it into the token, writes it into the next step's input slot (two slots alternating by the
 * step counter), into out_tokens and into mapped host memory for the host to stream while the GPU
 * runs on, and advances pos and step. No host sync.
 * The greedy argmax is checked too: every logit is NaN when the forward pass overflowed, and a NaN (or
 * +inf) wins the argmax, so a non-finite winner flags the step in the token info ring.
 * Every other setting: sampling/ (the full sampler on the logits row).
 */
#include "sample.cuh"

#include "sampling/sampling.cuh"

__global__ void finish_greedy_kernel(sample_args a)
{
    const unsigned long long k = *a.argmax;
    *a.argmax = 0ull;
    const int tok = argmax_key_row(k);
    const unsigned int u = (unsigned int)(k >> 32);
    const float best = __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
    const int step = *a.step;
    a.token_slots[(step + 1) & 1] = tok;
    const int i = *a.n_generated;
    if (i < a.out_cap)
        a.out_tokens[i] = tok;
    *a.n_generated = i + 1;
    if (a.token_info) {
        sample_token_info *info = &((sample_token_info *)a.token_info)[i % SAMPLE_INFO_RING];
        info->flags = isfinite(best) ? 0 : SAMPLE_FLAG_NONFINITE;
        info->has_logprobs = 0;
    }
    sample_publish_token(a, i, tok);
    *a.pos += 1;
    *a.step = step + 1;
}

cudaError_t launch_finish_greedy(const sample_args &a, cudaStream_t s)
{
    finish_greedy_kernel<<<1, 1, 0, s>>>(a);
    return cudaGetLastError();
}

__global__ void advance_kernel(int *pos, int *step, int n)
{
    *pos += n;
    *step += 1;
}

cudaError_t launch_advance(int *pos, int *step, int n, cudaStream_t s)
{
    advance_kernel<<<1, 1, 0, s>>>(pos, step, n);
    return cudaGetLastError();
}

__global__ void fetch_token_kernel(const int *slots, const int *step, int *tokens)
{
    tokens[0] = slots[*step & 1];
}

cudaError_t launch_fetch_token(const int *token_slots, const int *step, int *tokens, cudaStream_t s)
{
    fetch_token_kernel<<<1, 1, 0, s>>>(token_slots, step, tokens);
    return cudaGetLastError();
}

__device__ __forceinline__ unsigned long long mix64(unsigned long long x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__global__ void poison_hidden_kernel(float *h, int n, const int *step, int at)
{
    if (*step != at)
        return;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        h[i] = __int_as_float(0x7fffffff);
}

cudaError_t launch_poison_hidden(float *h, int n, const int *step, int at, cudaStream_t s)
{
    poison_hidden_kernel<<<1, 256, 0, s>>>(h, n, step, at);
    return cudaGetLastError();
}

__global__ void set_int_kernel(int *p, int v) { *p = v; }

cudaError_t launch_set_int(int *p, int v, cudaStream_t s)
{
    set_int_kernel<<<1, 1, 0, s>>>(p, v);
    return cudaGetLastError();
}

/* Element i of the bench fill pattern for `seed`: uniform in [-1, 1). */
__device__ __forceinline__ float fill_random_value(unsigned int seed, size_t i)
{
    const unsigned long long r = mix64(((unsigned long long)seed << 40) ^ i);
    return (float)(r >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

__global__ void fill_random_bf16_kernel(__nv_bfloat16 *p, size_t n, unsigned int seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2bfloat16(fill_random_value(seed, i));
}

__global__ void fill_random_f32_kernel(float *p, size_t n, unsigned int seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = __bfloat162float(__float2bfloat16(fill_random_value(seed, i)));
}

cudaError_t launch_fill_random_bf16(__nv_bfloat16 *p, size_t n, unsigned int seed, cudaStream_t s)
{
    fill_random_bf16_kernel<<<1024, 256, 0, s>>>(p, n, seed);
    return cudaGetLastError();
}

cudaError_t launch_fill_random_f32(float *p, size_t n, unsigned int seed, cudaStream_t s)
{
    fill_random_f32_kernel<<<1024, 256, 0, s>>>(p, n, seed);
    return cudaGetLastError();
}
