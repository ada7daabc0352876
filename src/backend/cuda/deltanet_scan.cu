/* deltanet_scan.cu — the Gated DeltaNet mixer between its input projections and out_proj, for n >= 1
 * tokens in one kernel per layer (MODEL.md §4.4 steps 2-7): causal depthwise conv (K taps) + SiLU,
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
 */
#include "cuda_common.cuh"

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

cudaError_t launch_gdn_scan(const gdn_args &a, int n_tokens, cudaStream_t s)
{
    if (a.dv % GDN_COLS || a.Hv % a.Hk || a.K < 1 || a.K > 4)
        return cudaErrorInvalidValue;
    dim3 grid(a.Hv * (a.dv / GDN_COLS));
    switch (a.dk) {
    case 32: return launch_pdl(gdn_scan_kernel<32>, grid, dim3(GDN_THREADS), 0, s, a, n_tokens);
    case 64: return launch_pdl(gdn_scan_kernel<64>, grid, dim3(GDN_THREADS), 0, s, a, n_tokens);
    case 128: return launch_pdl(gdn_scan_kernel<128>, grid, dim3(GDN_THREADS), 0, s, a, n_tokens);
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
