/* norm_rope.cuh — the device math of the gated-attention front end (docs/MODEL.md §4.3 steps 2-3), shared by
 * the q/k norm + RoPE + KV-append kernel (norm_rope.cu) and the prefill attention kernel, which norms and
 * rotates q itself while staging it (attention_prefill.cu, attn_args.q_fused): per-head RMSNorm scale
 * and the rotate-half partial RoPE. Both kernels evaluate the same expressions, so q gets the same bits
 * on either path.
 */
#ifndef LILY_CUDA_NORM_ROPE_CUH
#define LILY_CUDA_NORM_ROPE_CUH

#include "attention.cuh"

/* 1 / rms of one head from its sum of squares over D dims: rsqrt(ss / D + eps), fp32. The normed value
 * is x * r * w with w the q_norm / k_norm weight (already in 1 + w form), evaluated as (x * r) * w. */
__device__ __forceinline__ float head_rms_inv(float ss, int D, float eps) { return rsqrtf(ss / (float)D + eps); }

/* cos and sin of RoPE pair i (0 <= i < rot_dim / 2) at position p: inv_freq = theta^(-2i / rot_dim) and the
 * angle p * inv_freq in fp32, bit for bit as the CPU backend (and the reference) computes them, cos/sin in
 * double. The build's --use_fast_math would make powf __powf and 1.0f / x approximate (up to ~1e-5 relative
 * in inv_freq: the angle drifts by ~1e-5 * p * inv_freq rad, ~0.8 rad at p = 131072), so the power is taken
 * in double (fast math leaves double alone) and rounded to fp32 once, and the divisions are IEEE. */
__device__ __forceinline__ void rope_cos_sin(int p, int i, int rot_dim, float theta, double *c, double *s)
{
    const float e = __fdiv_rn((float)(2 * i), (float)rot_dim);
    const float inv_freq = __fdiv_rn(1.0f, (float)pow((double)theta, (double)e));
    const float ang = __fmul_rn((float)p, inv_freq);
    sincos((double)ang, s, c);
}

/* Rotate-half on the normed pair (x = dim i, y = dim i + rot_dim / 2): dim i becomes x c - y s and dim
 * i + rot_dim / 2 becomes y c + x s, in double, rounded once to fp32 (explicit fma / mul: no contraction
 * choice left to the compiler, so every kernel gets the same bits). */
__device__ __forceinline__ float rope_first(float x, float y, double c, double s)
{
    return (float)__fma_rn((double)x, c, -__dmul_rn((double)y, s));
}
__device__ __forceinline__ float rope_second(float x, float y, double c, double s)
{
    return (float)__fma_rn((double)y, c, __dmul_rn((double)x, s));
}

#endif
