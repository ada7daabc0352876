/* norm_rope.cu — the gated-attention front end after the q/k/v GEMV (docs/MODEL.md §4.3 steps 2-4):
 * per head RMSNorm of q and k (q_norm / k_norm, 1 + w form), partial rotate-half RoPE on the first
 * rot_dim dims (pairs (i, i + rot/2), inv_freq = theta^(-2i/rot), fp32 angle, cos/sin in double),
 * then k and v appended to the KV cache (bf16, or fp32 in exact mode: attn_args.k_cache_f32) at positions
 * pos .. pos + n - 1; q kept fp32.
 * grid = n tokens, block = 32 * (n_heads + 2 * n_kv): one warp per q head, k head and v head, the token's
 * RoPE cos / sin computed once per block (a thread per pair) into shared memory before the PDL wait; with
 * a.q_fused (a prefill chunk whose attention kernel norms and rotates q itself) the q warps are left
 * out: block = 32 * 2 * n_kv, a.q untouched. The norm / RoPE math lives in norm_rope.cuh.
 */
#include "norm_rope.cuh"

#define ROPE_MAX_DIM 256

/* Element i of KV head h's row p of the K (is_v false) or V cache := x, in the cache's type. */
__device__ __forceinline__ void kv_store(const attn_args &a, bool is_v, int h, int p, int i, float x)
{
    const size_t at = ((size_t)h * a.max_ctx + p) * a.head_dim + i;
    if (a.k_cache_f32)
        (is_v ? a.v_cache_f32 : a.k_cache_f32)[at] = x;
    else
        (is_v ? a.v_cache : a.k_cache)[at] = __float2bfloat16(x);
}

__global__ void qk_norm_rope_append_kernel(attn_args a)
{
    tl_block<> tl(a.timeline);
    __shared__ float s_x[32][ROPE_MAX_DIM];
    __shared__ double s_cos[ROPE_MAX_DIM / 2], s_sin[ROPE_MAX_DIM / 2];
    pdl_trigger(); /* the attention kernel reads nothing before its own wait */
    /* w: head slot in q heads | k heads | v heads; the q slots are skipped when q is fused */
    const int t = blockIdx.x, w = (threadIdx.x >> 5) + (a.q_fused ? a.n_heads : 0), lane = threadIdx.x & 31;
    /* the position was written by the previous forward call (complete), so the token's cos / sin (fp64
     * pow and sincos: the slow part of this kernel) are computed before the wait, once per pair for the
     * whole block instead of by every head's warp */
    const int D = a.head_dim, p = *a.pos + t, half = a.rot_dim / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x)
        rope_cos_sin(p, i, a.rot_dim, a.rope_theta, &s_cos[i], &s_sin[i]);
    __syncthreads();
    pdl_wait();
    tl.waited();
    const float *row = a.qkv + (size_t)t * a.qkv_stride;
    const int n_q = a.n_heads, n_kv = a.n_kv;
    float *sx = s_x[threadIdx.x >> 5];
    if (w >= n_q + n_kv) { /* v head: copy into the cache */
        const int h = w - n_q - n_kv;
        const float *src = row + (size_t)n_q * 2 * D + (size_t)n_kv * D + (size_t)h * D;
        float vv[ROPE_MAX_DIM / 32];
#pragma unroll
        for (int k = 0; k < ROPE_MAX_DIM / 32; k++)
            vv[k] = lane + 32 * k < D ? src[lane + 32 * k] : 0.0f;
#pragma unroll
        for (int k = 0; k < ROPE_MAX_DIM / 32; k++)
            if (lane + 32 * k < D)
                kv_store(a, true, h, p, lane + 32 * k, vv[k]);
        return;
    }
    const bool is_q = w < n_q;
    const int h = is_q ? w : w - n_q;
    const float *src = is_q ? row + (size_t)h * 2 * D : row + (size_t)n_q * 2 * D + (size_t)h * D;
    const float *nw = is_q ? a.q_norm : a.k_norm;
    float v[ROPE_MAX_DIM / 32], nwv[ROPE_MAX_DIM / 32]; /* loads issued together */
#pragma unroll
    for (int k = 0; k < ROPE_MAX_DIM / 32; k++) {
        const int d = lane + 32 * k;
        v[k] = d < D ? src[d] : 0.0f;
        nwv[k] = d < D ? nw[d] : 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < ROPE_MAX_DIM / 32; k++)
        ss = fmaf(v[k], v[k], ss);
    ss = warp_sum(ss);
    const float r = head_rms_inv(ss, D, a.eps);
#pragma unroll
    for (int k = 0; k < ROPE_MAX_DIM / 32; k++)
        if (lane + 32 * k < D)
            sx[lane + 32 * k] = v[k] * r * nwv[k];
    __syncwarp();
    for (int d = lane; d < D; d += 32) {
        float v = sx[d];
        if (d < a.rot_dim) {
            const int i = d < half ? d : d - half;
            const double c = s_cos[i], sn = s_sin[i];
            v = d < half ? rope_first(sx[d], sx[d + half], c, sn) : rope_second(sx[d - half], sx[d], c, sn);
        }
        if (is_q)
            a.q[((size_t)t * n_q + h) * D + d] = v;
        else
            kv_store(a, false, h, p, d, v);
    }
}

cudaError_t launch_qk_norm_rope_append(const attn_args &a, int n_tokens, cudaStream_t s)
{
    const int warps = (a.q_fused ? 0 : a.n_heads) + 2 * a.n_kv;
    if (warps > 32 || a.head_dim > ROPE_MAX_DIM || a.rot_dim > a.head_dim)
        return cudaErrorInvalidValue;
    return launch_pdl(qk_norm_rope_append_kernel, dim3(n_tokens), dim3(32 * warps), 0, s, a);
}
