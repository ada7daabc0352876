/* attention_decode.cu — causal softmax attention over the bf16 KV cache with the output gate
 * (MODEL.md §4.3 steps 4-5), for decode (split-KV) and prefill (one split).
 *
 * Block (split s, KV head g, token t), 8 warps: the G = n_heads / n_kv query heads that share KV head g
 * are handled together, so each K and V row is read once for all of them (coalesced: a warp reads a
 * whole row, lane l its D/32 contiguous dims). Online softmax (fp32) per warp, merged in shared memory.
 * Split-KV: a token's L = pos + t + 1 keys are cut into chunks of max(min_chunk, ceil(L / n_splits));
 * each block writes (max, sum, unnormalised output); the last block of a KV head to finish (atomic
 * counter) merges them. With n_splits == 1 the block normalises and writes directly.
 * Output: out[t][h][d] = attn * sigmoid(gate[t][h][d]).
 */
#include "cuda_common.cuh"

#define ATT_WARPS 8

template <int G, int DPL>
__device__ __forceinline__ void load_row(const __nv_bfloat16 *p, float (&v)[DPL])
{
    if (DPL == 8) {
        const uint4 u = *reinterpret_cast<const uint4 *>(p);
        const unsigned int w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[2 * k] = __uint_as_float(w[k] << 16);
            v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
    } else if (DPL == 4) {
        const uint2 u = *reinterpret_cast<const uint2 *>(p);
        v[0] = __uint_as_float(u.x << 16);
        v[1] = __uint_as_float(u.x & 0xffff0000u);
        v[2] = __uint_as_float(u.y << 16);
        v[3] = __uint_as_float(u.y & 0xffff0000u);
    } else {
#pragma unroll
        for (int e = 0; e < DPL; e++)
            v[e] = bf2f(p[e]);
    }
}

template <int G, int DPL>
__global__ void __launch_bounds__(ATT_WARPS * 32) attention_kernel(attn_args a)
{
    constexpr int D = DPL * 32;
    __shared__ float s_acc[G * D];
    __shared__ float s_m[ATT_WARPS][G], s_l[ATT_WARPS][G];
    __shared__ float s_M[G], s_L[G];
    __shared__ unsigned int s_last;
    pdl_trigger(); /* o_proj may launch and prefetch its weights */
    pdl_wait();
    const int s = blockIdx.x, g = blockIdx.y, t = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int L = *a.pos + t + 1;
    int chunk = (L + a.n_splits - 1) / a.n_splits;
    chunk = max(chunk, a.min_chunk);
    const int start = s * chunk, end = min(L, start + chunk);
    const float scale = rsqrtf((float)D);

    float q[G][DPL], acc[G][DPL], m[G], l[G];
#pragma unroll
    for (int h = 0; h < G; h++) {
        const float *qp = a.q + ((size_t)t * a.n_heads + g * G + h) * D + lane * DPL;
#pragma unroll
        for (int e = 0; e < DPL; e++) {
            q[h][e] = qp[e] * scale;
            acc[h][e] = 0.0f;
        }
        m[h] = -INFINITY;
        l[h] = 0.0f;
    }

    const __nv_bfloat16 *kc = a.k_cache + (size_t)g * a.max_ctx * D + lane * DPL;
    const __nv_bfloat16 *vc = a.v_cache + (size_t)g * a.max_ctx * D + lane * DPL;
    constexpr int UK = 4; /* keys per warp iteration: 8 row loads in flight per lane */
    for (int k0 = start + warp; k0 < end; k0 += UK * ATT_WARPS) {
        float kr[UK][DPL], vr[UK][DPL];
#pragma unroll
        for (int u = 0; u < UK; u++) {
            const int k = min(k0 + u * ATT_WARPS, end - 1); /* clamped rows are masked below */
            load_row<G, DPL>(kc + (size_t)k * D, kr[u]);
            load_row<G, DPL>(vc + (size_t)k * D, vr[u]);
        }
        float sc[UK][G];
#pragma unroll
        for (int u = 0; u < UK; u++)
#pragma unroll
            for (int h = 0; h < G; h++) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < DPL; e++)
                    d = fmaf(q[h][e], kr[u][e], d);
                sc[u][h] = d;
            }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int u = 0; u < UK; u++)
#pragma unroll
                for (int h = 0; h < G; h++)
                    sc[u][h] += __shfl_xor_sync(0xffffffffu, sc[u][h], o);
#pragma unroll
        for (int u = 0; u < UK; u++)
            if (k0 + u * ATT_WARPS >= end)
#pragma unroll
                for (int h = 0; h < G; h++)
                    sc[u][h] = -INFINITY;
#pragma unroll
        for (int h = 0; h < G; h++) {
            float mn = m[h];
#pragma unroll
            for (int u = 0; u < UK; u++)
                mn = fmaxf(mn, sc[u][h]);
            const float corr = expf(m[h] - mn);
            float p[UK], ps = 0.0f;
#pragma unroll
            for (int u = 0; u < UK; u++) {
                p[u] = expf(sc[u][h] - mn);
                ps += p[u];
            }
            l[h] = l[h] * corr + ps;
#pragma unroll
            for (int e = 0; e < DPL; e++) {
                float v = acc[h][e] * corr;
#pragma unroll
                for (int u = 0; u < UK; u++)
                    v = fmaf(p[u], vr[u][e], v);
                acc[h][e] = v;
            }
            m[h] = mn;
        }
    }
    if (lane == 0)
#pragma unroll
        for (int h = 0; h < G; h++) {
            s_m[warp][h] = m[h];
            s_l[warp][h] = l[h];
        }
    __syncthreads();
    if (threadIdx.x < G) {
        const int h = threadIdx.x;
        float M = -INFINITY;
        for (int w = 0; w < ATT_WARPS; w++)
            M = fmaxf(M, s_m[w][h]);
        float Ls = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            Ls += s_m[w][h] == -INFINITY ? 0.0f : s_l[w][h] * expf(s_m[w][h] - M);
        s_M[h] = M;
        s_L[h] = Ls;
    }
    __syncthreads();
    /* merge the warps' accumulators: one warp at a time (no shared-memory atomics, which are CAS
     * loops for fp32 and serialise under the 8-way contention) */
    float f[G];
#pragma unroll
    for (int h = 0; h < G; h++)
        f[h] = m[h] == -INFINITY ? 0.0f : expf(m[h] - s_M[h]);
    for (int w = 0; w < ATT_WARPS; w++) {
        if (warp == w)
#pragma unroll
            for (int h = 0; h < G; h++)
#pragma unroll
                for (int e = 0; e < DPL; e++) {
                    float *p = &s_acc[h * D + lane * DPL + e];
                    *p = (w == 0 ? 0.0f : *p) + acc[h][e] * f[h];
                }
        __syncthreads();
    }

    const float *gate_row = a.qkv + (size_t)t * a.qkv_stride;
    if (a.n_splits == 1) {
        for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
            const int h = i / D, d = i % D, hg = g * G + h;
            const float o = s_acc[i] / s_L[h];
            a.out[((size_t)t * a.n_heads + hg) * D + d] = o * sigmoid_f(gate_row[(size_t)hg * 2 * D + D + d]);
        }
        return;
    }
    /* split-KV: publish this split, the last block of KV head g merges */
    float *po = a.part_o + ((size_t)g * a.n_splits + s) * G * D;
    float *pml = a.part_ml + ((size_t)g * a.n_splits + s) * G * 2;
    if (start < L) {
        for (int i = threadIdx.x; i < G * D; i += blockDim.x)
            po[i] = s_acc[i];
        if (threadIdx.x < G) {
            pml[2 * threadIdx.x] = s_M[threadIdx.x];
            pml[2 * threadIdx.x + 1] = s_L[threadIdx.x];
        }
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        s_last = atomicAdd(a.counter + g, 1u) == (unsigned int)(a.n_splits - 1);
    __syncthreads();
    if (!s_last)
        return;
    __threadfence();
    const int n_used = (L + chunk - 1) / chunk;
    const float *pmlg = a.part_ml + (size_t)g * a.n_splits * G * 2;
    const float *pog = a.part_o + (size_t)g * a.n_splits * G * D;
    /* per head: merged max and sum by one warp (lanes over splits), weights f_s to shared memory */
    float *s_f = s_acc; /* reuse: [G][n_used] <= G * D floats since n_used <= n_splits <= D */
    for (int h = warp; h < G; h += ATT_WARPS) {
        float ms[8], ls[8]; /* n_used <= 256 splits: 8 per lane, loaded in one round */
#pragma unroll
        for (int q = 0; q < 8; q++) {
            const int sp = lane + 32 * q;
            ms[q] = sp < n_used ? __ldcg(pmlg + (size_t)sp * G * 2 + 2 * h) : -INFINITY;
            ls[q] = sp < n_used ? __ldcg(pmlg + (size_t)sp * G * 2 + 2 * h + 1) : 0.0f;
        }
        float M = -INFINITY;
#pragma unroll
        for (int q = 0; q < 8; q++)
            M = fmaxf(M, ms[q]);
        M = warp_max(M);
        float Ls = 0.0f;
#pragma unroll
        for (int q = 0; q < 8; q++)
            Ls += ms[q] == -INFINITY ? 0.0f : ls[q] * expf(ms[q] - M);
        Ls = warp_sum(Ls);
#pragma unroll
        for (int q = 0; q < 8; q++) {
            const int sp = lane + 32 * q;
            if (sp < n_used)
                s_f[h * n_used + sp] = ms[q] == -INFINITY ? 0.0f : expf(ms[q] - M) / Ls;
        }
    }
    __syncthreads();
    /* each thread owns NO outputs; 4 splits x NO loads in flight per round */
    constexpr int NO = (G * D + ATT_WARPS * 32 - 1) / (ATT_WARPS * 32);
    float O[NO];
#pragma unroll
    for (int k = 0; k < NO; k++)
        O[k] = 0.0f;
    for (int sp = 0; sp < n_used; sp += 4) {
        float v[4][NO];
#pragma unroll
        for (int q = 0; q < 4; q++)
#pragma unroll
            for (int k = 0; k < NO; k++) {
                const int i = threadIdx.x + k * ATT_WARPS * 32;
                v[q][k] = (sp + q < n_used && i < G * D) ? __ldcg(pog + (size_t)(sp + q) * G * D + i) : 0.0f;
            }
#pragma unroll
        for (int q = 0; q < 4; q++)
#pragma unroll
            for (int k = 0; k < NO; k++) {
                const int i = threadIdx.x + k * ATT_WARPS * 32;
                if (sp + q < n_used && i < G * D)
                    O[k] = fmaf(v[q][k], s_f[(i / D) * n_used + sp + q], O[k]);
            }
    }
#pragma unroll
    for (int k = 0; k < NO; k++) {
        const int i = threadIdx.x + k * ATT_WARPS * 32;
        if (i < G * D) {
            const int h = i / D, d = i % D, hg = g * G + h;
            a.out[((size_t)t * a.n_heads + hg) * D + d] = O[k] * sigmoid_f(gate_row[(size_t)hg * 2 * D + D + d]);
        }
    }
    if (threadIdx.x == 0)
        a.counter[g] = 0;
}

template <int G>
static cudaError_t att_g(const attn_args &a, dim3 grid, cudaStream_t s)
{
    switch (a.head_dim / 32) {
    case 2: return launch_pdl(attention_kernel<G, 2>, grid, dim3(ATT_WARPS * 32), 0, s, a);
    case 4: return launch_pdl(attention_kernel<G, 4>, grid, dim3(ATT_WARPS * 32), 0, s, a);
    case 8: return launch_pdl(attention_kernel<G, 8>, grid, dim3(ATT_WARPS * 32), 0, s, a);
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

cudaError_t launch_attention(const attn_args &a, int n_tokens, cudaStream_t s)
{
    if (a.head_dim % 32 || a.n_heads % a.n_kv || (a.n_splits > 1 && n_tokens != 1) || a.n_splits > a.head_dim)
        return cudaErrorInvalidValue;
    dim3 grid(a.n_splits, a.n_kv, n_tokens);
    switch (a.n_heads / a.n_kv) {
    case 2: return att_g<2>(a, grid, s);
    case 4: return att_g<4>(a, grid, s);
    case 8: return att_g<8>(a, grid, s);
    default: return cudaErrorInvalidValue;
    }
}
