/* deltanet_decode.cu — the Gated DeltaNet mixer of one decode token (docs/MODEL.md §4.4 steps 2-7), and the
 * op's kernel choice: causal depthwise conv (K taps) + SiLU, q/k L2 norms (eps 1e-6 inside the root, q
 * scaled by dk^-1/2), β = sigmoid(b), g = -exp(A_log)·softplus(a + dt_bias), and the delta rule in its
 * recurrent form
 *   S <- exp(g) S;  δ = β (v - Sᵀk);  S <- S + k δᵀ;  o = Sᵀq   (= (exp(g)S)ᵀq + δ (k·q))
 * with the fp32 state [Hv][dk][dv] in global memory. Chunks of n > 1 tokens run deltanet_prefill.cu or
 * deltanet_chunked.cu. The gated RMSNorm (z, norm.weight) is fused into out_proj's GEMV input
 * (gemv/gemv_decode.cu). Conv state: ping-pong buffers by the forward-call counter, so blocks that read
 * channel c never race the one block that writes it.
 */
#include "deltanet.cuh"

/* ---- one token (decode) ------------------------------------------------------------------------------
 *
 * Block (value head j, slice of GDN1_COLS = 16 columns), 4 warps; warp w owns 4 columns (one float4 of
 * every state row) over all dk rows, lane l the rows l*RPL .. l*RPL + RPL - 1 (RPL = dk / 32). Every
 * reduction over rows (q/k norms, k·q, Sᵀk, Sᵀq) is a warp shuffle, so the kernel has no block barrier;
 * each lane computes the conv + SiLU of the q/k channels of its own rows and of the warp's 4 v channels
 * itself (a few redundant FMAs instead of a shared-memory phase). Everything not produced by the kernel
 * just before (state, conv weights, conv history, A_log, dt_bias) is loaded before the PDL wait; after it
 * one batch of loads (this token's mixed channels, b, a), then shuffles only. grid = Hv * dv / 16.
 * VEC (K == 4, RPL % 4 == 0, 16-byte aligned rows: dk 128 as in Qwen3.5/3.6): the same values loaded as
 * float4 — a channel's 4 taps, a lane's 4 consecutive rows of a history row or of the input — 28 loads
 * per lane before the wait instead of 91 and 5 after it instead of 14. The scalar loads are strided across
 * the lanes (a tap load touches 16 cache lines per warp instruction), so issuing them kept every warp from
 * reaching its PDL wait until ~4 µs after in_proj ended (H200; docs/BENCHMARKS.md, "Which decode kernels
 * can start early"). */

#define GDN1_WARPS 4
#define GDN1_CPW 4 /* columns per warp: one float4 */
#define GDN1_COLS (GDN1_WARPS * GDN1_CPW)

__device__ __forceinline__ float4 gdn_ld4(const float *p) { return *reinterpret_cast<const float4 *>(p); }
__device__ __forceinline__ void gdn_split4(float4 v, float *d) { d[0] = v.x, d[1] = v.y, d[2] = v.z, d[3] = v.w; }

template <int DK, bool VEC, bool CONV_DONE = false>
__global__ void __launch_bounds__(GDN1_WARPS * 32) gdn_decode_kernel(gdn_args a)
{
    tl_block<> tl(a.timeline);
    constexpr int RPL = DK / 32;
    const int slices = a.dv / GDN1_COLS;
    const int j = blockIdx.x / slices, sl = blockIdx.x % slices;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int c0 = sl * GDN1_COLS + warp * GDN1_CPW; /* this warp's first column */
    const int kh = j / (a.Hv / a.Hk), r0 = lane * RPL;
    const int key_dim = a.Hk * DK, K = a.K, Km1 = K - 1;
    const int par = *a.step & 1; /* written by the previous forward call (complete) */
    const float *cs_in = a.conv_state + (size_t)par * Km1 * a.conv_dim;
    float *cs_out = a.conv_state + (size_t)(par ^ 1) * Km1 * a.conv_dim;
    const int chq = kh * DK + r0, chk = key_dim + kh * DK + r0, chv = 2 * key_dim + j * a.dv + c0;

    /* before the wait: state rows, conv taps and history (the last K-1 inputs), gate parameters */
    float4 S[RPL];
    float *st = a.state + ((size_t)j * DK + r0) * a.dv + c0;
#pragma unroll
    for (int r = 0; r < RPL; r++)
        S[r] = *reinterpret_cast<const float4 *>(st + (size_t)r * a.dv);
    float wq[RPL][4], wk[RPL][4], wv[GDN1_CPW][4], hq[RPL][3], hk[RPL][3], hv[GDN1_CPW][3];
    if constexpr (CONV_DONE) {
        /* in_proj applied the conv and advanced the history */
    } else if constexpr (VEC) { /* a channel's K = 4 taps are one float4; so are a lane's 4 rows and the warp's 4 v channels */
#pragma unroll
        for (int r = 0; r < RPL; r++) {
            gdn_split4(gdn_ld4(a.conv_w + (size_t)(chq + r) * 4), wq[r]);
            gdn_split4(gdn_ld4(a.conv_w + (size_t)(chk + r) * 4), wk[r]);
        }
#pragma unroll
        for (int c = 0; c < GDN1_CPW; c++)
            gdn_split4(gdn_ld4(a.conv_w + (size_t)(chv + c) * 4), wv[c]);
#pragma unroll
        for (int s = 0; s < 3; s++) {
            const float *hs = cs_in + (size_t)s * a.conv_dim;
#pragma unroll
            for (int r = 0; r < RPL; r += 4) {
                const float4 q4 = gdn_ld4(hs + chq + r), k4 = gdn_ld4(hs + chk + r);
                hq[r][s] = q4.x, hq[r + 1][s] = q4.y, hq[r + 2][s] = q4.z, hq[r + 3][s] = q4.w;
                hk[r][s] = k4.x, hk[r + 1][s] = k4.y, hk[r + 2][s] = k4.z, hk[r + 3][s] = k4.w;
            }
            const float4 v4 = gdn_ld4(hs + chv);
            hv[0][s] = v4.x, hv[1][s] = v4.y, hv[2][s] = v4.z, hv[3][s] = v4.w;
        }
    } else {
#pragma unroll
        for (int tap = 0; tap < 4; tap++) {
#pragma unroll
            for (int r = 0; r < RPL; r++) {
                wq[r][tap] = tap < K ? a.conv_w[(size_t)(chq + r) * K + tap] : 0.0f;
                wk[r][tap] = tap < K ? a.conv_w[(size_t)(chk + r) * K + tap] : 0.0f;
            }
#pragma unroll
            for (int c = 0; c < GDN1_CPW; c++)
                wv[c][tap] = tap < K ? a.conv_w[(size_t)(chv + c) * K + tap] : 0.0f;
        }
#pragma unroll
        for (int s = 0; s < 3; s++) {
#pragma unroll
            for (int r = 0; r < RPL; r++) {
                hq[r][s] = s < Km1 ? cs_in[(size_t)s * a.conv_dim + chq + r] : 0.0f;
                hk[r][s] = s < Km1 ? cs_in[(size_t)s * a.conv_dim + chk + r] : 0.0f;
            }
#pragma unroll
            for (int c = 0; c < GDN1_CPW; c++)
                hv[c][s] = s < Km1 ? cs_in[(size_t)s * a.conv_dim + chv + c] : 0.0f;
        }
    }
    const float A = -expf(a.A_log[j]), dtb = a.dt_bias[j];
    pdl_trigger(); /* out_proj may launch and prefetch its weights */
    pdl_wait();    /* mixed and b/a come from the projection kernel just before */
    tl.waited();

    float xq[RPL], xk[RPL], xv[GDN1_CPW];
    if constexpr (VEC) {
#pragma unroll
        for (int r = 0; r < RPL; r += 4) {
            gdn_split4(gdn_ld4(a.mixed + chq + r), xq + r);
            gdn_split4(gdn_ld4(a.mixed + chk + r), xk + r);
        }
        gdn_split4(gdn_ld4(a.mixed + chv), xv);
    } else {
#pragma unroll
        for (int r = 0; r < RPL; r++) {
            xq[r] = a.mixed[chq + r];
            xk[r] = a.mixed[chk + r];
        }
#pragma unroll
        for (int c = 0; c < GDN1_CPW; c++)
            xv[c] = a.mixed[chv + c];
    }
    const float bb = a.ba[j], aa = a.ba[a.Hv + j] + dtb;

    /* causal conv over (history, x) + SiLU: tap s < K-1 reads history row s, tap K-1 reads x */
    auto conv = [&](const float (&w)[4], const float (&h)[3], float x) {
        float acc = 0.0f;
#pragma unroll
        for (int s = 0; s < 3; s++)
            if (s < Km1)
                acc = fmaf(w[s], h[s], acc);
        float wl = w[0];
#pragma unroll
        for (int s = 1; s < 4; s++)
            if (s == Km1)
                wl = w[s];
        return silu_f(fmaf(wl, x, acc));
    };
    float q[RPL], k[RPL], v[GDN1_CPW];
    float ss[3] = {0.0f, 0.0f, 0.0f}; /* q·q, k·k, k·q over this lane's rows */
#pragma unroll
    for (int r = 0; r < RPL; r++) {
        q[r] = CONV_DONE ? xq[r] : conv(wq[r], hq[r], xq[r]);
        k[r] = CONV_DONE ? xk[r] : conv(wk[r], hk[r], xk[r]);
        ss[0] = fmaf(q[r], q[r], ss[0]);
        ss[1] = fmaf(k[r], k[r], ss[1]);
        ss[2] = fmaf(k[r], q[r], ss[2]);
    }
#pragma unroll
    for (int c = 0; c < GDN1_CPW; c++)
        v[c] = CONV_DONE ? xv[c] : conv(wv[c], hv[c], xv[c]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int e = 0; e < 3; e++)
            ss[e] += __shfl_xor_sync(0xffffffffu, ss[e], o);
    const float qs = rsqrtf(ss[0] + 1e-6f) * rsqrtf((float)DK);
    const float ks = rsqrtf(ss[1] + 1e-6f);
    const float kq = ss[2] * qs * ks;
    const float sp = aa > 20.0f ? aa : log1pf(expf(aa));
    const float decay = expf(A * sp), beta = sigmoid_f(bb);

    /* decay; Sᵀk and Sᵀq per column over this lane's rows, then over the warp */
    float pm[GDN1_CPW] = {0.0f, 0.0f, 0.0f, 0.0f}, po[GDN1_CPW] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < RPL; r++) {
        float *sr = reinterpret_cast<float *>(&S[r]);
#pragma unroll
        for (int c = 0; c < GDN1_CPW; c++) {
            sr[c] *= decay;
            pm[c] = fmaf(sr[c], k[r], pm[c]);
            po[c] = fmaf(sr[c], q[r], po[c]);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int c = 0; c < GDN1_CPW; c++) {
            pm[c] += __shfl_xor_sync(0xffffffffu, pm[c], o);
            po[c] += __shfl_xor_sync(0xffffffffu, po[c], o);
        }
    float delta[GDN1_CPW];
#pragma unroll
    for (int c = 0; c < GDN1_CPW; c++)
        delta[c] = beta * (v[c] - pm[c] * ks);
#pragma unroll
    for (int r = 0; r < RPL; r++) {
        float *sr = reinterpret_cast<float *>(&S[r]);
        const float kr = k[r] * ks;
#pragma unroll
        for (int c = 0; c < GDN1_CPW; c++)
            sr[c] = fmaf(kr, delta[c], sr[c]);
        *reinterpret_cast<float4 *>(st + (size_t)r * a.dv) = S[r];
    }
    if (lane < GDN1_CPW) {
        float oc = 0.0f, dc = 0.0f;
#pragma unroll
        for (int c = 0; c < GDN1_CPW; c++)
            if (c == lane) {
                oc = po[c];
                dc = delta[c];
            }
        a.out[(size_t)j * a.dv + c0 + lane] = oc * qs + dc * kq;
    }

    /* new conv state: history shifted by one row, x last. v channels: by this warp's lanes 0..3 (one
     * column each); q/k channels: by warp 0 of the first block that reads key head kh */
    if (!CONV_DONE && lane < GDN1_CPW) {
#pragma unroll
        for (int c = 0; c < GDN1_CPW; c++)
            if (c == lane)
#pragma unroll
                for (int s = 0; s < 3; s++)
                    if (s < Km1)
                        cs_out[(size_t)s * a.conv_dim + chv + c] = s + 1 < Km1 ? hv[c][s + 1 < 3 ? s + 1 : 2] : xv[c];
    }
    if (!CONV_DONE && warp == 0 && sl == 0 && j % (a.Hv / a.Hk) == 0) {
#pragma unroll
        for (int s = 0; s < 3; s++)
            if (s < Km1)
#pragma unroll
                for (int r = 0; r < RPL; r++) {
                    cs_out[(size_t)s * a.conv_dim + chq + r] = s + 1 < Km1 ? hq[r][s + 1 < 3 ? s + 1 : 2] : xq[r];
                    cs_out[(size_t)s * a.conv_dim + chk + r] = s + 1 < Km1 ? hk[r][s + 1 < 3 ? s + 1 : 2] : xk[r];
                }
    }
}

cudaError_t launch_gdn_decode(const gdn_args &a, cudaStream_t s)
{
    if (a.dv % GDN1_COLS || a.Hv % a.Hk || a.K < 1 || a.K > 4)
        return cudaErrorInvalidValue;
    const dim3 grid(a.Hv * (a.dv / GDN1_COLS));
    /* 16-byte loads of taps, history and inputs: K == 4, 4 rows per lane, every row start 16-byte aligned */
    const bool vec = a.K == 4 && a.dk / 32 % 4 == 0 && a.conv_dim % 4 == 0 &&
                     ((uintptr_t)a.conv_w | (uintptr_t)a.conv_state | (uintptr_t)a.mixed) % 16 == 0;
    if (a.conv_done)
        return gdn_decode_conv_fusable(a) ? launch_pdl(gdn_decode_kernel<128, true, true>, grid, dim3(GDN1_WARPS * 32), 0, s, a)
                                          : cudaErrorInvalidValue;
    switch (a.dk) {
    case 32: return launch_pdl(gdn_decode_kernel<32, false>, grid, dim3(GDN1_WARPS * 32), 0, s, a);
    case 64: return launch_pdl(gdn_decode_kernel<64, false>, grid, dim3(GDN1_WARPS * 32), 0, s, a);
    case 128:
        return vec ? launch_pdl(gdn_decode_kernel<128, true>, grid, dim3(GDN1_WARPS * 32), 0, s, a)
                   : launch_pdl(gdn_decode_kernel<128, false>, grid, dim3(GDN1_WARPS * 32), 0, s, a);
    default: return cudaErrorInvalidValue;
    }
}

bool gdn_decode_conv_fusable(const gdn_args &a)
{
    return a.K == 4 && a.dk == 128 && a.dv % GDN1_COLS == 0 && a.Hv % a.Hk == 0 && a.conv_dim % 4 == 0 &&
           ((uintptr_t)a.conv_w | (uintptr_t)a.conv_state | (uintptr_t)a.mixed) % 16 == 0;
}

gdn_kernel gdn_kernel_choose(const gdn_args &a, int n_tokens, bool exact)
{
    if (n_tokens == 1)
        return GDN_KERNEL_DECODE;
    if (!exact && n_tokens >= GDN_CHUNKED_MIN_TOKENS && gdn_chunked_supported(a))
        return GDN_KERNEL_CHUNKED;
    return GDN_KERNEL_RECURRENCE;
}

cudaError_t launch_gdn(const gdn_args &a, float *pre, float *wy, int n_tokens, cudaStream_t s)
{
    const int k = a.kernel != GDN_KERNEL_AUTO ? a.kernel : gdn_kernel_choose(a, n_tokens, false);
    if (n_tokens == 1 && k == GDN_KERNEL_DECODE)
        return launch_gdn_decode(a, s);
    if (k == GDN_KERNEL_CHUNKED && pre && wy)
        return launch_gdn_prefill_chunked(a, pre, wy, n_tokens, s);
    if (!pre)
        return cudaErrorInvalidValue;
    return launch_gdn_prefill(a, pre, n_tokens, s); /* RECURRENCE; CHUNKED without its scratch */
}
