/* norm_rope.cu — the gated-attention front end after the q/k/v GEMV (MODEL.md §4.3 steps 2-4):
 * per head RMSNorm of q and k (q_norm / k_norm, 1 + w form), partial rotate-half RoPE on the first
 * rot_dim dims (pairs (i, i + rot/2), inv_freq = theta^(-2i/rot), fp32 angle, cos/sin in double),
 * then k and v appended to the bf16 KV cache at positions pos .. pos + n - 1; q kept fp32.
 * grid = n tokens, block = 32 * (n_heads + 2 * n_kv): one warp per q head, k head and v head.
 */
#include "cuda_common.cuh"

#define ROPE_MAX_DIM 256

__global__ void qk_norm_rope_append_kernel(attn_args a)
{
    __shared__ float s_x[32][ROPE_MAX_DIM];
    pdl_trigger(); /* the attention kernel reads nothing before its own wait */
    pdl_wait();
    const int t = blockIdx.x, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int D = a.head_dim, p = *a.pos + t;
    const float *row = a.qkv + (size_t)t * a.qkv_stride;
    const int n_q = a.n_heads, n_kv = a.n_kv;
    float *sx = s_x[w];
    if (w >= n_q + n_kv) { /* v head: copy into the cache */
        const int h = w - n_q - n_kv;
        const float *src = row + (size_t)n_q * 2 * D + (size_t)n_kv * D + (size_t)h * D;
        __nv_bfloat16 *dst = a.v_cache + ((size_t)h * a.max_ctx + p) * D;
        float vv[ROPE_MAX_DIM / 32];
#pragma unroll
        for (int k = 0; k < ROPE_MAX_DIM / 32; k++)
            vv[k] = lane + 32 * k < D ? src[lane + 32 * k] : 0.0f;
#pragma unroll
        for (int k = 0; k < ROPE_MAX_DIM / 32; k++)
            if (lane + 32 * k < D)
                dst[lane + 32 * k] = __float2bfloat16(vv[k]);
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
    const float r = rsqrtf(ss / (float)D + a.eps);
#pragma unroll
    for (int k = 0; k < ROPE_MAX_DIM / 32; k++)
        if (lane + 32 * k < D)
            sx[lane + 32 * k] = v[k] * r * nwv[k];
    __syncwarp();
    const int half = a.rot_dim / 2;
    for (int d = lane; d < D; d += 32) {
        float v = sx[d];
        if (d < a.rot_dim) {
            const int i = d < half ? d : d - half;
            const float inv_freq = 1.0f / powf(a.rope_theta, (float)(2 * i) / (float)a.rot_dim);
            const float ang = (float)p * inv_freq;
            const double c = cos((double)ang), sn = sin((double)ang);
            v = d < half ? (float)(sx[d] * c - sx[d + half] * sn) : (float)(sx[d] * c + sx[d - half] * sn);
        }
        if (is_q)
            a.q[((size_t)t * n_q + h) * D + d] = v;
        else
            a.k_cache[((size_t)h * a.max_ctx + p) * D + d] = __float2bfloat16(v);
    }
}

cudaError_t launch_qk_norm_rope_append(const attn_args &a, int n_tokens, cudaStream_t s)
{
    const int warps = a.n_heads + 2 * a.n_kv;
    if (warps > 32 || a.head_dim > ROPE_MAX_DIM || a.rot_dim > a.head_dim)
        return cudaErrorInvalidValue;
    return launch_pdl(qk_norm_rope_append_kernel, dim3(n_tokens), dim3(32 * warps), 0, s, a);
}
