/* deltanet_scan.cu — the Gated DeltaNet mixer between its input projections and out_proj, for n >= 1
 * tokens in one kernel per layer (docs/MODEL.md §4.4 steps 2-7): causal depthwise conv (K taps) + SiLU,
 * q/k L2 norms (eps 1e-6 inside the root, q scaled by dk^-1/2), β = sigmoid(b),
 * g = -exp(A_log)·softplus(a + dt_bias), and the delta rule in its recurrent form
 *   S <- exp(g) S;  δ = β (v - Sᵀk);  S <- S + k δᵀ;  o = Sᵀq   (= (exp(g)S)ᵀq + δ (k·q))
 * with the fp32 state held in registers for the whole chunk (a sequential scan: decode is n = 1).
 * The gated RMSNorm (z, norm.weight) is fused into out_proj's GEMV input (gemv_decode.cu).
 *
 * Columns of S are independent, so a head is split over dv/32 blocks: block (value head j, slice s)
 * keeps S[:, 32s .. 32s+32) (dk x 32 fp32) in 128 threads (thread = column cj, row quarter ri).
 * grid = (Hv * dv / 32), block = 128. Conv state: ping-pong buffers by the forward-call counter so blocks
 * that read channel c (several per q/k channel) never race the one block that writes it.
 * Decode (n == 1) has its own barrier-free kernel, gdn_decode_kernel (below; GDN_KERNEL_DECODE).
 */
#include "deltanet.cuh"

#define GDN_THREADS 128
#define GDN_COLS 32

template <int DK>
__global__ void __launch_bounds__(GDN_THREADS) gdn_scan_kernel(gdn_args a, int n)
{
    constexpr int NR = DK / 4;
    __shared__ float s_q[2][DK], s_k[2][DK], s_v[2][GDN_COLS];
    __shared__ float s_red_m[2][4][GDN_COLS], s_red_o[2][4][GDN_COLS];
    __shared__ float s_scal[2][4]; /* decay, beta, k·q, unused */
    __shared__ float s_ss[2][3];

    const int slices = a.dv / GDN_COLS;
    const int j = blockIdx.x / slices, sl = blockIdx.x % slices;
    const int c0 = sl * GDN_COLS;
    const int kh = j / (a.Hv / a.Hk);
    const int tid = threadIdx.x, ri = tid >> 5, cj = tid & 31;
    const int key_dim = a.Hk * a.dk, Km1 = a.K - 1;
    const int par = *a.step & 1;
    const float *cs_in = a.conv_state + (size_t)par * Km1 * a.conv_dim;
    float *cs_out = a.conv_state + (size_t)(par ^ 1) * Km1 * a.conv_dim;

    /* channel of local index ch in [0, 2*DK + 32): q, k of key head kh, then this block's v columns */
    auto channel = [&](int ch) {
        if (ch < DK) return kh * DK + ch;
        if (ch < 2 * DK) return key_dim + kh * DK + (ch - DK);
        return 2 * key_dim + j * a.dv + c0 + (ch - 2 * DK);
    };

    float S[NR];
    float *st = a.state + ((size_t)j * DK) * a.dv + c0 + cj;
#pragma unroll
    for (int r = 0; r < NR; r++)
        S[r] = st[(size_t)(ri * NR + r) * a.dv];
    const float A = -expf(a.A_log[j]), dtb = a.dt_bias[j];
    /* the state, conv state and weights above were last written by this layer's previous step (long
     * complete: every forward call starts with a plain launch of embed); the projections (mixed, ba)
     * come from the kernel just before: wait for it here. Nothing read so far is written by this
     * kernel's dependents, so they may launch now (out_proj prefetches its weights). */
    pdl_trigger();
    pdl_wait();

    for (int t = 0; t < n; t++) {
        const int p = t & 1;
        /* A: conv + SiLU of this token's q, k and v-slice channels */
        constexpr int NCH = (2 * DK + GDN_COLS + GDN_THREADS - 1) / GDN_THREADS;
#pragma unroll
        for (int ci = 0; ci < NCH; ci++) {
            const int ch = tid + ci * GDN_THREADS;
            if (ch >= 2 * DK + GDN_COLS)
                break;
            const int c = channel(ch);
            float acc = 0.0f;
            for (int tap = 0; tap < a.K; tap++) {
                const int tau = t - Km1 + tap;
                const float xv = tau >= 0 ? a.mixed[(size_t)tau * a.mixed_stride + c] : cs_in[(size_t)(Km1 + tau) * a.conv_dim + c];
                acc = fmaf(a.conv_w[(size_t)c * a.K + tap], xv, acc);
            }
            const float y = silu_f(acc);
            if (ch < DK) s_q[p][ch] = y;
            else if (ch < 2 * DK) s_k[p][ch - DK] = y;
            else s_v[p][ch - 2 * DK] = y;
        }
        __syncthreads();
        /* sums for the L2 norms and k·q; gates */
        if (ri < 3) {
            float acc = 0.0f;
            for (int i = cj; i < DK; i += 32) {
                const float qv = s_q[p][i], kv = s_k[p][i];
                acc += ri == 0 ? qv * qv : ri == 1 ? kv * kv : kv * qv;
            }
            acc = warp_sum(acc);
            if (cj == 0)
                s_ss[p][ri] = acc;
        } else if (cj == 0) {
            const float bb = a.ba[(size_t)t * a.ba_stride + j];
            const float aa = a.ba[(size_t)t * a.ba_stride + a.Hv + j] + dtb;
            const float sp = aa > 20.0f ? aa : log1pf(expf(aa));
            s_scal[p][0] = expf(A * sp);
            s_scal[p][1] = sigmoid_f(bb);
        }
        __syncthreads();
        const float qs = rsqrtf(s_ss[p][0] + 1e-6f) * rsqrtf((float)DK);
        const float ks = rsqrtf(s_ss[p][1] + 1e-6f);
        const float kq = s_ss[p][2] * qs * ks;
        const float decay = s_scal[p][0], beta = s_scal[p][1];
        /* B: decay, S^T k and S^T q partials over this thread's rows */
        float pm = 0.0f, po = 0.0f;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            S[r] *= decay;
            pm = fmaf(S[r], s_k[p][ri * NR + r], pm);
            po = fmaf(S[r], s_q[p][ri * NR + r], po);
        }
        s_red_m[p][ri][cj] = pm * ks;
        s_red_o[p][ri][cj] = po * qs;
        __syncthreads();
        const float m = s_red_m[p][0][cj] + s_red_m[p][1][cj] + s_red_m[p][2][cj] + s_red_m[p][3][cj];
        const float oq = s_red_o[p][0][cj] + s_red_o[p][1][cj] + s_red_o[p][2][cj] + s_red_o[p][3][cj];
        const float delta = beta * (s_v[p][cj] - m);
#pragma unroll
        for (int r = 0; r < NR; r++)
            S[r] = fmaf(s_k[p][ri * NR + r] * ks, delta, S[r]);
        if (ri == 0)
            a.out[(size_t)t * a.Hv * a.dv + (size_t)j * a.dv + c0 + cj] = oq + delta * kq;
    }
#pragma unroll
    for (int r = 0; r < NR; r++)
        st[(size_t)(ri * NR + r) * a.dv] = S[r];

    /* new conv state: the last K-1 (<= 3) rows of concat(old state, mixed); loads batched */
    const bool owns_qk = (j % (a.Hv / a.Hk)) == 0 && sl == 0;
    constexpr int NCH = (2 * DK + GDN_COLS + GDN_THREADS - 1) / GDN_THREADS;
    float cv[NCH][3];
#pragma unroll
    for (int ci = 0; ci < NCH; ci++) {
        const int ch = tid + ci * GDN_THREADS;
        const bool mine = ch < 2 * DK + GDN_COLS && (owns_qk || ch >= 2 * DK);
        const int c = mine ? channel(ch) : 0;
#pragma unroll
        for (int s = 0; s < 3; s++) {
            const int tau = n - Km1 + s;
            cv[ci][s] = !mine || s >= Km1 ? 0.0f
                        : tau >= 0 ? a.mixed[(size_t)tau * a.mixed_stride + c]
                                   : cs_in[(size_t)(Km1 + tau) * a.conv_dim + c];
        }
    }
#pragma unroll
    for (int ci = 0; ci < NCH; ci++) {
        const int ch = tid + ci * GDN_THREADS;
        if (ch < 2 * DK + GDN_COLS && (owns_qk || ch >= 2 * DK)) {
            const int c = channel(ch);
#pragma unroll
            for (int s = 0; s < 3; s++)
                if (s < Km1)
                    cs_out[(size_t)s * a.conv_dim + c] = cv[ci][s];
        }
    }
}

/* ---- one token (decode) ------------------------------------------------------------------------------
 *
 * Block (value head j, slice of GDN1_COLS = 16 columns), 4 warps; warp w owns 4 columns (one float4 of
 * every state row) over all dk rows, lane l the rows l*RPL .. l*RPL + RPL - 1 (RPL = dk / 32). Every
 * reduction over rows (q/k norms, k·q, Sᵀk, Sᵀq) is a warp shuffle, so the kernel has no block barrier;
 * each lane computes the conv + SiLU of the q/k channels of its own rows and of the warp's 4 v channels
 * itself (a few redundant FMAs instead of a shared-memory phase). Everything not produced by the kernel
 * just before (state, conv weights, conv history, A_log, dt_bias) is loaded before the PDL wait; after it
 * one batch of loads (this token's mixed channels, b, a), then shuffles only. grid = Hv * dv / 16. */

#define GDN1_WARPS 4
#define GDN1_CPW 4 /* columns per warp: one float4 */
#define GDN1_COLS (GDN1_WARPS * GDN1_CPW)

template <int DK>
__global__ void __launch_bounds__(GDN1_WARPS * 32) gdn_decode_kernel(gdn_args a)
{
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
    const float A = -expf(a.A_log[j]), dtb = a.dt_bias[j];
    pdl_trigger(); /* out_proj may launch and prefetch its weights */
    pdl_wait();    /* mixed and b/a come from the projection kernel just before */

    float xq[RPL], xk[RPL], xv[GDN1_CPW];
#pragma unroll
    for (int r = 0; r < RPL; r++) {
        xq[r] = a.mixed[chq + r];
        xk[r] = a.mixed[chk + r];
    }
#pragma unroll
    for (int c = 0; c < GDN1_CPW; c++)
        xv[c] = a.mixed[chv + c];
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
        q[r] = conv(wq[r], hq[r], xq[r]);
        k[r] = conv(wk[r], hk[r], xk[r]);
        ss[0] = fmaf(q[r], q[r], ss[0]);
        ss[1] = fmaf(k[r], k[r], ss[1]);
        ss[2] = fmaf(k[r], q[r], ss[2]);
    }
#pragma unroll
    for (int c = 0; c < GDN1_CPW; c++)
        v[c] = conv(wv[c], hv[c], xv[c]);
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
    if (lane < GDN1_CPW) {
#pragma unroll
        for (int c = 0; c < GDN1_CPW; c++)
            if (c == lane)
#pragma unroll
                for (int s = 0; s < 3; s++)
                    if (s < Km1)
                        cs_out[(size_t)s * a.conv_dim + chv + c] = s + 1 < Km1 ? hv[c][s + 1 < 3 ? s + 1 : 2] : xv[c];
    }
    if (warp == 0 && sl == 0 && j % (a.Hv / a.Hk) == 0) {
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

cudaError_t launch_gdn_scan(const gdn_args &a, int n_tokens, cudaStream_t s)
{
    if (a.dv % GDN_COLS || a.Hv % a.Hk || a.K < 1 || a.K > 4)
        return cudaErrorInvalidValue;
    if (n_tokens == 1 && a.kernel != GDN_KERNEL_SCAN && a.dv % GDN1_COLS == 0) {
        dim3 grid1(a.Hv * (a.dv / GDN1_COLS));
        switch (a.dk) {
        case 32: return launch_pdl(gdn_decode_kernel<32>, grid1, dim3(GDN1_WARPS * 32), 0, s, a);
        case 64: return launch_pdl(gdn_decode_kernel<64>, grid1, dim3(GDN1_WARPS * 32), 0, s, a);
        case 128: return launch_pdl(gdn_decode_kernel<128>, grid1, dim3(GDN1_WARPS * 32), 0, s, a);
        default: return cudaErrorInvalidValue;
        }
    }
    dim3 grid(a.Hv * (a.dv / GDN_COLS));
    switch (a.dk) {
    case 32: return launch_pdl(gdn_scan_kernel<32>, grid, dim3(GDN_THREADS), 0, s, a, n_tokens);
    case 64: return launch_pdl(gdn_scan_kernel<64>, grid, dim3(GDN_THREADS), 0, s, a, n_tokens);
    case 128: return launch_pdl(gdn_scan_kernel<128>, grid, dim3(GDN_THREADS), 0, s, a, n_tokens);
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

gdn_kernel gdn_kernel_choose(const gdn_args &a, int n_tokens, bool exact)
{
    if (n_tokens == 1)
        return a.dv % GDN1_COLS == 0 ? GDN_KERNEL_DECODE : GDN_KERNEL_SCAN;
    if (!exact && n_tokens >= GDN_CHUNKED_MIN_TOKENS && gdn_chunked_supported(a))
        return GDN_KERNEL_CHUNKED;
    if (gdn_prefill_supported(a))
        return GDN_KERNEL_RECURRENCE;
    return GDN_KERNEL_SCAN;
}

cudaError_t launch_gdn(const gdn_args &a, float *pre, float *wy, int n_tokens, cudaStream_t s)
{
    const int k = a.kernel != GDN_KERNEL_AUTO ? a.kernel : gdn_kernel_choose(a, n_tokens, false);
    if (k == GDN_KERNEL_CHUNKED && n_tokens > 1 && pre && wy)
        return launch_gdn_prefill_chunked(a, pre, wy, n_tokens, s);
    if ((k == GDN_KERNEL_CHUNKED || k == GDN_KERNEL_RECURRENCE) && n_tokens > 1 && pre)
        return launch_gdn_prefill(a, pre, n_tokens, s);
    gdn_args g = a;
    g.kernel = k == GDN_KERNEL_DECODE ? GDN_KERNEL_DECODE : GDN_KERNEL_SCAN;
    return launch_gdn_scan(g, n_tokens, s);
}
