/* sample.cu — choosing the next token on the device and the step bookkeeping of the decode graph.
 *
 * Greedy: the LM-head GEMV already folded an atomicMax of (logit, -row) into *argmax; finish_greedy
 * turns it into the token, writes it into the next step's input slot (two slots alternating by the
 * step counter), into out_tokens and into mapped host memory for the host to stream while the GPU
 * runs on, and advances pos and step. No host sync.
 * Top-k / top-p: one block scans the logits (per-thread top-16 lists), merges them by k rounds of
 * block argmax, applies temperature and the top-p cut, and draws with a counter-based hash RNG.
 */
#include "sample.cuh"

/* Stream token i to the host: the token into mapped host memory, then (after a system-wide fence, so
 * the host never sees the count before the token) the count. The host polls the count; no sync. */
__device__ __forceinline__ void publish_token(const sample_args &a, int i, int tok)
{
    if (!a.host_tokens || i >= a.out_cap)
        return;
    a.host_tokens[i] = tok;
    __threadfence_system();
    *(volatile int *)&a.host_tokens[a.out_cap] = i + 1;
}

__global__ void finish_greedy_kernel(sample_args a)
{
    const unsigned long long k = *a.argmax;
    *a.argmax = 0ull;
    const int tok = argmax_key_row(k);
    const int step = *a.step;
    a.token_slots[(step + 1) & 1] = tok;
    const int i = *a.n_generated;
    if (i < a.out_cap)
        a.out_tokens[i] = tok;
    *a.n_generated = i + 1;
    publish_token(a, i, tok);
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

#define SAMPLE_THREADS 1024
#define SAMPLE_LOCAL 16
#define SAMPLE_MAX_K 64

__device__ __forceinline__ unsigned long long mix64(unsigned long long x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_topk_topp_kernel(sample_args a, float temperature, int top_k, float top_p, unsigned long long seed)
{
    __shared__ unsigned long long s_red[SAMPLE_THREADS / 32];
    __shared__ float s_val[SAMPLE_MAX_K];
    __shared__ int s_idx[SAMPLE_MAX_K];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* per-thread top-SAMPLE_LOCAL as packed keys, descending */
    unsigned long long loc[SAMPLE_LOCAL];
#pragma unroll
    for (int i = 0; i < SAMPLE_LOCAL; i++)
        loc[i] = 0ull;
    for (int v = tid; v < a.vocab; v += SAMPLE_THREADS) {
        unsigned long long k = argmax_key(a.logits[v], v);
        if (k <= loc[SAMPLE_LOCAL - 1])
            continue;
#pragma unroll
        for (int i = 0; i < SAMPLE_LOCAL; i++) {
            if (k > loc[i]) {
                const unsigned long long tmp = loc[i];
                loc[i] = k;
                k = tmp;
            }
        }
    }
    int head = 0; /* next unconsumed entry of loc */
    for (int r = 0; r < top_k; r++) {
        unsigned long long mine = 0ull;
#pragma unroll
        for (int i = 0; i < SAMPLE_LOCAL; i++)
            if (i == head)
                mine = loc[i];
        unsigned long long best = mine;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const unsigned long long b2 = __shfl_xor_sync(0xffffffffu, best, o);
            best = b2 > best ? b2 : best;
        }
        if (lane == 0)
            s_red[warp] = best;
        __syncthreads();
        if (warp == 0) {
            best = s_red[lane];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const unsigned long long b2 = __shfl_xor_sync(0xffffffffu, best, o);
                best = b2 > best ? b2 : best;
            }
            if (lane == 0)
                s_red[0] = best;
        }
        __syncthreads();
        best = s_red[0];
        if (mine == best && best != 0ull)
            head++;
        if (tid == 0) {
            const int row = argmax_key_row(best);
            s_idx[r] = row;
            s_val[r] = a.logits[row];
        }
        __syncthreads();
    }
    if (tid == 0) {
        const float inv_t = 1.0f / fmaxf(temperature, 1e-6f);
        float tot = 0.0f;
        for (int r = 0; r < top_k; r++) {
            s_val[r] = expf((s_val[r] - s_val[0]) * inv_t);
            tot += s_val[r];
        }
        int keep = top_k;
        float cum = 0.0f;
        for (int r = 0; r < top_k; r++) {
            cum += s_val[r];
            if (cum >= top_p * tot) {
                keep = r + 1;
                break;
            }
        }
        float kept = 0.0f;
        for (int r = 0; r < keep; r++)
            kept += s_val[r];
        const int step = *a.step;
        const int slot = a.pos ? (step + 1) & 1 : step & 1; /* pos == NULL: the step was already advanced */
        const double u = (double)(mix64(seed ^ mix64((unsigned long long)step)) >> 11) * (1.0 / 9007199254740992.0);
        const float target = (float)u * kept;
        int tok = s_idx[keep - 1];
        float c = 0.0f;
        for (int r = 0; r < keep; r++) {
            c += s_val[r];
            if (target < c) {
                tok = s_idx[r];
                break;
            }
        }
        a.token_slots[slot] = tok;
        const int i = *a.n_generated;
        if (i < a.out_cap)
            a.out_tokens[i] = tok;
        *a.n_generated = i + 1;
        publish_token(a, i, tok);
        if (a.pos) {
            *a.pos += 1;
            *a.step = step + 1;
        }
    }
}

cudaError_t launch_sample_topk_topp(const sample_args &a, float temperature, int top_k, float top_p,
                                    unsigned long long seed, float *scratch, cudaStream_t s)
{
    (void)scratch;
    if (top_k <= 0 || top_k > SAMPLE_MAX_K)
        top_k = SAMPLE_MAX_K;
    if (top_k > a.vocab)
        top_k = a.vocab;
    sample_topk_topp_kernel<<<1, SAMPLE_THREADS, 0, s>>>(a, temperature, top_k, top_p, seed);
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
