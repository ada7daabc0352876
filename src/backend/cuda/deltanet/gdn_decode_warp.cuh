/* gdn_decode_warp.cuh — one warp's share of the Gated DeltaNet decode step (docs/MODEL.md §4.4 steps 2-7):
 * value head j, the 4 state columns c0 .. c0 + 3 (one float4 of every state row) over all dk rows, lane l
 * the rows l*RPL .. l*RPL + RPL - 1 (RPL = dk / 32). The math of deltanet_decode.cu (see there): causal
 * conv + SiLU of the lane's q/k rows and of v channel c0 + l % 4 (broadcast by shuffles), q/k L2 norms, β, g, the delta rule on
 * the 4 columns, o = Sᵀq; every reduction over rows by warp shuffles (no block barrier). Written once
 * for the two kernels that run it: gdn_decode_kernel (deltanet_decode.cu, 4 warps per block) and
 * gdn_out_fused_kernel (gdn_out_fused.cu: out_proj's streamed GEMV whose warps run the scan first).
 *
 * load() reads what the previous kernel does not produce (state rows, conv taps and history, A_log,
 * dt_bias) and may run before pdl_wait(): it keeps per channel only the conv's history part and its last
 * tap (same operations in the same order as the whole conv) and writes the shifted history into the
 * other conv-state buffer. run() then reads this token's mixed channels and b/a, computes, writes the 4
 * state columns in place and the new conv state's last row (v channels by lanes 0..3, q/k channels by
 * every lane of the warp with c0 == 0 of the first value head of each key head), and returns o for
 * column c0 + lane in lanes 0..3 (0 in the others).
 */
#ifndef LILY_GDN_DECODE_WARP_CUH
#define LILY_GDN_DECODE_WARP_CUH

#include "deltanet.cuh"

#define GDN1_CPW 4 /* columns per warp: one float4 */

/* One 16-byte store (p 16-byte aligned). A plain float4 store may be split by the register allocator into
 * scalar stores (it did, at 95 registers: 2 of the 4 state rows, 2.5x the store instructions and L2 sector
 * writes of the state; docs/BENCHMARKS.md, "The fused scan's regression separated"); the v4 store cannot. */
__device__ __forceinline__ void gdn_st_v4(float *p, float4 v)
{
    asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}

template <int DK>
struct gdn_decode_warp {
    static constexpr int RPL = DK / 32;
    float4 S[RPL];
    /* per q/k row of the lane and its v channel c0 + lane % 4: the conv's history part Σ_{s<K-1} w_s·h_s
     * (accumulated in the order the whole conv takes) and the tap on this token's input */
    float cq[RPL], ck[RPL], wq[RPL], wk[RPL], cv, wv;
    float A, dtb;
    int par; /* the conv-state buffer read: *a.step & 1, read once before the wait */

    /* before the wait: state rows, conv taps and history (the last K-1 inputs; the history's shifted part
     * already written to the other conv-state buffer, which nobody reads in this forward call), gate
     * parameters of head j, columns c0... Every load is issued before the first store: the compiler cannot
     * tell the conv-state stores from the loaded arrays, so a store between loads would make each channel's
     * loads wait for the previous channel's round trip (a chain of 2·RPL + 1 dependent loads before the wait,
     * instead of one batch). */
    __device__ __forceinline__ void load(const gdn_args &a, int j, int c0, int lane)
    {
        constexpr int NCH = 2 * RPL + 1; /* channels: q rows, k rows (interleaved), this lane's v channel */
        const int kh = j / (a.Hv / a.Hk), r0 = lane * RPL;
        const int key_dim = a.Hk * DK, K = a.K, Km1 = K - 1;
        par = *a.step & 1; /* written by the previous forward call (complete) */
        const float *cs_in = a.conv_state + (size_t)par * Km1 * a.conv_dim;
        float *cs_out = a.conv_state + (size_t)(par ^ 1) * Km1 * a.conv_dim;
        const int chq = kh * DK + r0, chk = key_dim + kh * DK + r0, chv = 2 * key_dim + j * a.dv + c0 + (lane & 3);
        const bool qk_writer = c0 == 0 && j % (a.Hv / a.Hk) == 0; /* the first warp that reads key head kh */
        const float *st = a.state + ((size_t)j * DK + r0) * a.dv + c0;
        int ch[NCH];
#pragma unroll
        for (int r = 0; r < RPL; r++) {
            ch[2 * r] = chq + r;
            ch[2 * r + 1] = chk + r;
        }
        ch[2 * RPL] = chv;
#pragma unroll
        for (int r = 0; r < RPL; r++)
            S[r] = *reinterpret_cast<const float4 *>(st + (size_t)r * a.dv);
        float w[NCH][4], h[NCH][3];
#pragma unroll
        for (int c = 0; c < NCH; c++) {
#pragma unroll
            for (int tap = 0; tap < 4; tap++)
                w[c][tap] = tap < K ? a.conv_w[(size_t)ch[c] * K + tap] : 0.0f;
#pragma unroll
            for (int s = 0; s < 3; s++)
                h[c][s] = s < Km1 ? cs_in[(size_t)s * a.conv_dim + ch[c]] : 0.0f;
        }
        A = -expf(a.A_log[j]);
        dtb = a.dt_bias[j];
        /* per channel: the history part of the conv (the whole conv's order) and the tap on x */
        float acc[NCH], wl[NCH];
#pragma unroll
        for (int c = 0; c < NCH; c++) {
            acc[c] = 0.0f;
#pragma unroll
            for (int s = 0; s < 3; s++)
                if (s < Km1)
                    acc[c] = fmaf(w[c][s], h[c][s], acc[c]);
            wl[c] = w[c][0];
#pragma unroll
            for (int s = 1; s < 4; s++)
                if (s == Km1)
                    wl[c] = w[c][s];
        }
#pragma unroll
        for (int r = 0; r < RPL; r++) {
            cq[r] = acc[2 * r], wq[r] = wl[2 * r];
            ck[r] = acc[2 * r + 1], wk[r] = wl[2 * r + 1];
        }
        cv = acc[2 * RPL], wv = wl[2 * RPL];
        /* the shifted history out (after every load) */
#pragma unroll
        for (int c = 0; c < NCH; c++)
            if (c == 2 * RPL ? lane < GDN1_CPW : qk_writer)
#pragma unroll
                for (int s = 0; s + 1 < 3; s++)
                    if (s + 1 < Km1)
                        cs_out[(size_t)s * a.conv_dim + ch[c]] = h[c][s + 1];
    }

    /* after the wait: the step of head j, columns c0.. (as load()); returns o[c0 + lane] in lanes 0..3 */
    __device__ __forceinline__ float run(const gdn_args &a, int j, int c0, int lane)
    {
        const int kh = j / (a.Hv / a.Hk), r0 = lane * RPL;
        const int key_dim = a.Hk * DK, Km1 = a.K - 1;
        float *cs_out = a.conv_state + (size_t)(par ^ 1) * Km1 * a.conv_dim;
        const int chq = kh * DK + r0, chk = key_dim + kh * DK + r0, chv = 2 * key_dim + j * a.dv + c0 + (lane & 3);
        float *st = a.state + ((size_t)j * DK + r0) * a.dv + c0;

        float xq[RPL], xk[RPL];
#pragma unroll
        for (int r = 0; r < RPL; r++) {
            xq[r] = a.mixed[chq + r];
            xk[r] = a.mixed[chk + r];
        }
        const float xv = a.mixed[chv];
        const float bb = a.ba[j], aa = a.ba[a.Hv + j] + dtb;

        /* causal conv + SiLU: the history part (load()) plus the tap K-1 on x */
        float q[RPL], k[RPL], v[GDN1_CPW];
        float ss[3] = {0.0f, 0.0f, 0.0f}; /* q·q, k·k, k·q over this lane's rows */
#pragma unroll
        for (int r = 0; r < RPL; r++) {
            q[r] = silu_f(fmaf(wq[r], xq[r], cq[r]));
            k[r] = silu_f(fmaf(wk[r], xk[r], ck[r]));
            ss[0] = fmaf(q[r], q[r], ss[0]);
            ss[1] = fmaf(k[r], k[r], ss[1]);
            ss[2] = fmaf(k[r], q[r], ss[2]);
        }
        const float v_mine = silu_f(fmaf(wv, xv, cv)); /* lane l: channel c0 + l % 4, broadcast to the warp */
#pragma unroll
        for (int c = 0; c < GDN1_CPW; c++)
            v[c] = __shfl_sync(0xffffffffu, v_mine, c);
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
            gdn_st_v4(st + (size_t)r * a.dv, S[r]);
        }
        float out = 0.0f;
        if (lane < GDN1_CPW) {
            float oc = 0.0f, dc = 0.0f;
#pragma unroll
            for (int c = 0; c < GDN1_CPW; c++)
                if (c == lane) {
                    oc = po[c];
                    dc = delta[c];
                }
            out = oc * qs + dc * kq;
        }

        /* the new conv state's last row: this token's input (v channels by lanes 0..3, q/k channels by the
         * warp with c0 == 0 of the first value head that reads key head kh) */
        float *last = cs_out + (size_t)(Km1 - 1) * a.conv_dim;
        if (Km1 > 0 && lane < GDN1_CPW)
            last[chv] = xv;
        if (Km1 > 0 && c0 == 0 && j % (a.Hv / a.Hk) == 0) {
#pragma unroll
            for (int r = 0; r < RPL; r++) {
                last[chq + r] = xq[r];
                last[chk + r] = xk[r];
            }
        }
        return out;
    }
};

#endif
