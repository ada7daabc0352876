/* deltanet_prefill.cu — the Gated DeltaNet mixer for a prefill chunk (n > 1 tokens; decode, n == 1, stays
 * on deltanet_decode.cu), same inputs, outputs and state as launch_gdn_decode (docs/MODEL.md §4.4 steps 2-7), in
 * two kernels:
 *
 *  gdn_prep_kernel: everything that is parallel over tokens. Causal depthwise conv (K taps; the first K-1
 *    tokens read the previous call's tail from the conv state) + SiLU of every q/k/v channel, q/k L2 norms
 *    per key head (eps 1e-6 inside the root, q also x dk^-1/2), k·q of the normed vectors, β = sigmoid(b)
 *    and decay = exp(-exp(A_log)·softplus(a + dt_bias)); written to the scratch `pre`
 *    [n][gdn_prefill_stride]: q | k | v (the channel layout of `mixed`, conv_dim floats) then per value
 *    head j a float4 {β, decay, k·q of its key head, g = log decay}. Also writes the new conv state (the last K-1
 *    pre-conv rows of concat(old state, mixed)) into the other ping-pong buffer (parity *step & 1, as
 *    the scan kernels, so the next call reads it).
 *    grid (⌈n / 8⌉, Hk + ⌈Hv·dv / 256⌉), 256 thr: block y < Hk = key head (q and k channels, norms in
 *    shared memory, one warp per token), else 256 v channels; one thread per channel slides over 8 tokens.
 *
 *  gdn_recur_kernel: the delta rule only, per token  S <- decay·S;  δ = β(v - Sᵀk);  S <- S + kδᵀ;
 *    o = Sᵀq = (decay·S_old)ᵀq + δ(k·q). Block = (value head j, COLS columns of S), 128 or 256 threads: thread =
 *    one column x RPT rows (rows (i·L + g)·4 .. +3 for i < RPT/4, g = lane group index), L = dk/RPT
 *    threads per column reduce Sᵀk and Sᵀq by xor shuffles (no block barrier per token). The state is
 *    held scaled, S = γ·S' with γ the running product of decays (one uniform scalar per block), so the
 *    per-token work per element is 3 FMAs (Sᵀk, Sᵀq partials and S' += k·δ/γ); γ is folded back into S'
 *    when it drops below 1e-18 (or a decay underflows to 0). Tiles of 16 tokens of q/k (key head),
 *    v (the block's columns) and the gate record are cp.async double-buffered in shared memory: one
 *    barrier per 16 tokens; a full tile is unrolled so the shared-memory reads of later tokens are
 *    scheduled ahead of the current token's reduction.
 *    grid Hv·dv/COLS; dk 128: 256 threads, RPT 16, L 8, COLS 32 (128 blocks of 8 warps: one per SM, k/q
 *    tiles read from L2 once per 32 columns); dk 64: 128 threads, RPT 16, L 4, COLS 32; dk 32: 128/8/4/32.
 *
 * deltanet_chunked.cu replaces gdn_recur_kernel by the chunked form on tensor cores (same pre, same
 * results; GDN_KERNEL_CHUNKED).
 */
#include "backend/cuda/mma_bf16.cuh"
#include "deltanet.cuh"

#define GDP_THREADS 256
#define GDP_TOKENS 8 /* tokens per prep block: one per warp in the norm phase */
#define GDR_TILE 16 /* tokens per staged tile */

int gdn_prefill_stride(int conv_dim, int Hv) { return conv_dim + 4 * Hv; }

__global__ void __launch_bounds__(GDP_THREADS) gdn_prep_kernel(gdn_args a, float *pre, int pre_stride, int n)
{
    __shared__ float s_y[GDP_TOKENS][GDP_THREADS];
    const int t0 = blockIdx.x * GDP_TOKENS, unit = blockIdx.y, tid = threadIdx.x;
    const int dk = a.dk, key_dim = a.Hk * dk, K = a.K, Km1 = K - 1;
    const bool qk = unit < a.Hk; /* block-uniform */
    int c;
    bool live;
    if (qk) {
        live = tid < 2 * dk;
        c = tid < dk ? unit * dk + tid : key_dim + unit * dk + (tid - dk);
    } else {
        c = 2 * key_dim + (unit - a.Hk) * GDP_THREADS + tid;
        live = c < a.conv_dim;
    }
    const int par = *a.step & 1; /* written by the previous forward call (complete) */
    const float *cs_in = a.conv_state + (size_t)par * Km1 * a.conv_dim;
    float *cs_out = a.conv_state + (size_t)(par ^ 1) * Km1 * a.conv_dim;

    /* taps: w[s] for history row s < K-1, wl for the current token */
    float w[3] = {0.0f, 0.0f, 0.0f}, wl = 0.0f;
    if (live) {
#pragma unroll
        for (int s = 0; s < 3; s++)
            if (s < Km1)
                w[s] = a.conv_w[(size_t)c * K + s];
        wl = a.conv_w[(size_t)c * K + Km1];
    }
    pdl_trigger(); /* the recurrence may launch: it waits for this grid before reading pre */
    pdl_wait();    /* mixed and b/a come from the projection kernel just before */

    const int nt = min(GDP_TOKENS, n - t0);
    if (live) {
        /* h[s] = X[t0 - (K-1) + s]: the K-1 inputs before this block's first token */
        float h[3] = {0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int s = 0; s < 3; s++)
            if (s < Km1) {
                const int tau = t0 - Km1 + s;
                h[s] = tau >= 0 ? a.mixed[(size_t)tau * a.mixed_stride + c] : cs_in[(size_t)(Km1 + tau) * a.conv_dim + c];
            }
        float x[GDP_TOKENS];
#pragma unroll
        for (int tt = 0; tt < GDP_TOKENS; tt++)
            x[tt] = tt < nt ? a.mixed[(size_t)(t0 + tt) * a.mixed_stride + c] : 0.0f;
#pragma unroll
        for (int tt = 0; tt < GDP_TOKENS; tt++) {
            float acc = 0.0f;
#pragma unroll
            for (int s = 0; s < 3; s++)
                if (s < Km1)
                    acc = fmaf(w[s], h[s], acc);
            const float y = silu_f(fmaf(wl, x[tt], acc));
#pragma unroll
            for (int s = 0; s < 3; s++)
                if (s < Km1)
                    h[s] = s + 1 < Km1 ? h[s + 1 < 3 ? s + 1 : 2] : x[tt];
            if (qk)
                s_y[tt][tid] = y;
            else if (tt < nt)
                pre[(size_t)(t0 + tt) * pre_stride + c] = y;
        }
        /* new conv state: rows n .. n+K-2 of X = concat(old state, mixed), by the first token block */
        if (blockIdx.x == 0) {
#pragma unroll
            for (int s = 0; s < 3; s++)
                if (s < Km1) {
                    const int tau = n - Km1 + s;
                    cs_out[(size_t)s * a.conv_dim + c] =
                        tau >= 0 ? a.mixed[(size_t)tau * a.mixed_stride + c] : cs_in[(size_t)(n + s) * a.conv_dim + c];
                }
        }
    }
    if (!qk)
        return;
    __syncthreads();
    /* one warp per token: norms, k·q, normed q/k out, then the gate records of this key head's v heads */
    const int warp = tid >> 5, lane = tid & 31;
    if (warp >= nt)
        return;
    const int t = t0 + warp;
    float qq = 0.0f, kk = 0.0f, kq = 0.0f;
    for (int i = lane; i < dk; i += 32) {
        const float qv = s_y[warp][i], kv = s_y[warp][dk + i];
        qq = fmaf(qv, qv, qq);
        kk = fmaf(kv, kv, kk);
        kq = fmaf(kv, qv, kq);
    }
    qq = warp_sum(qq);
    kk = warp_sum(kk);
    kq = warp_sum(kq);
    const float qs = rsqrtf(qq + 1e-6f) * rsqrtf((float)dk), ks = rsqrtf(kk + 1e-6f);
    float *row = pre + (size_t)t * pre_stride;
    for (int i = lane; i < dk; i += 32) {
        row[unit * dk + i] = s_y[warp][i] * qs;
        row[key_dim + unit * dk + i] = s_y[warp][dk + i] * ks;
    }
    const int G = a.Hv / a.Hk;
    for (int l = lane; l < G; l += 32) {
        const int j = unit * G + l;
        const float bb = a.ba[(size_t)t * a.ba_stride + j];
        const float aa = a.ba[(size_t)t * a.ba_stride + a.Hv + j] + a.dt_bias[j];
        const float sp = aa > 20.0f ? aa : log1pf(expf(aa));
        const float lg = -expf(a.A_log[j]) * sp; /* log decay g (the chunked form's cumulative sums) */
        const float decay = expf(lg);
        *reinterpret_cast<float4 *>(row + a.conv_dim + 4 * j) = make_float4(sigmoid_f(bb), decay, kq * qs * ks, lg);
    }
}

template <int DK, int RPT, int THREADS>
__global__ void __launch_bounds__(THREADS, 1) gdn_recur_kernel(gdn_args a, const float *__restrict__ pre,
                                                                 int pre_stride, int n)
{
    constexpr int L = DK / RPT;             /* threads per column */
    constexpr int COLS = THREADS / L;       /* columns per block */
    constexpr int NV = RPT / 4;             /* float4 of q/k per thread */
    constexpr int KQ4 = DK / 4, V4 = COLS / 4, PER_TOK = 2 * KQ4 + V4 + 1;
    static_assert(RPT % 4 == 0 && L >= 1 && L <= 32 && (L & (L - 1)) == 0, "gdn_recur shape");
    __shared__ __align__(16) float s_q[2][GDR_TILE][DK];
    __shared__ __align__(16) float s_k[2][GDR_TILE][DK];
    __shared__ __align__(16) float s_v[2][GDR_TILE][COLS];
    __shared__ __align__(16) float s_g[2][GDR_TILE][4];

    const int slices = a.dv / COLS;
    const int j = blockIdx.x / slices, c0 = (blockIdx.x % slices) * COLS;
    const int kh = j / (a.Hv / a.Hk), key_dim = a.Hk * DK;
    const int tid = threadIdx.x, g = tid % L, col = tid / L, c = c0 + col;

    float S[RPT]; /* S'[row][c], row = (i*L + g)*4 + e for element 4i + e */
    float *st = a.state + (size_t)j * DK * a.dv + c;
#pragma unroll
    for (int i = 0; i < NV; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            S[4 * i + e] = st[(size_t)((i * L + g) * 4 + e) * a.dv];
    /* state last written by this layer's previous forward call; pre comes from gdn_prep_kernel */
    pdl_trigger();
    pdl_wait();

    auto stage = [&](int tile, int b) {
        const int t0 = tile * GDR_TILE, nt = min(GDR_TILE, n - t0);
        for (int idx = tid; idx < nt * PER_TOK; idx += THREADS) {
            const int tt = idx / PER_TOK;
            int r = idx - tt * PER_TOK;
            const float *row = pre + (size_t)(t0 + tt) * pre_stride;
            float *dst;
            const float *src;
            if (r < KQ4) {
                dst = &s_q[b][tt][4 * r];
                src = row + kh * DK + 4 * r;
            } else if (r < 2 * KQ4) {
                r -= KQ4;
                dst = &s_k[b][tt][4 * r];
                src = row + key_dim + kh * DK + 4 * r;
            } else if (r < 2 * KQ4 + V4) {
                r -= 2 * KQ4;
                dst = &s_v[b][tt][4 * r];
                src = row + 2 * key_dim + (size_t)j * a.dv + c0 + 4 * r;
            } else {
                dst = &s_g[b][tt][0];
                src = row + a.conv_dim + 4 * j;
            }
            cp_async16(dst, src, 16);
        }
        cp_async_commit();
    };

    float gam = 1.0f; /* S = gam * S' */
    const int n_tiles = (n + GDR_TILE - 1) / GDR_TILE;
    float *out = a.out + (size_t)j * a.dv + c;
    const size_t out_stride = (size_t)a.Hv * a.dv;
    stage(0, 0);
    for (int tile = 0; tile < n_tiles; tile++) {
        const int b = tile & 1;
        cp_async_wait<0>();
        __syncthreads(); /* tile landed for everyone; everyone is done with the other buffer */
        if (tile + 1 < n_tiles)
            stage(tile + 1, b ^ 1);
        const int nt = min(GDR_TILE, n - tile * GDR_TILE);

        /* one token: operands from the staged tile, S' and gam updated, o written */
        auto step = [&](int tt) {
            float4 kc[NV], qc[NV];
#pragma unroll
            for (int i = 0; i < NV; i++) {
                kc[i] = reinterpret_cast<const float4 *>(s_k[b][tt])[i * L + g];
                qc[i] = reinterpret_cast<const float4 *>(s_q[b][tt])[i * L + g];
            }
            const float vc = s_v[b][tt][col];
            const float4 gc = *reinterpret_cast<const float4 *>(s_g[b][tt]);
            const float beta = gc.x, kq = gc.z;
            float gnew = gam * gc.y;
            if (gnew < 1e-18f) { /* fold the running decay into S' (uniform over the block) */
#pragma unroll
                for (int r = 0; r < RPT; r++)
                    S[r] *= gnew;
                gnew = 1.0f;
            }
            float pm[2] = {0.0f, 0.0f}, po[2] = {0.0f, 0.0f};
#pragma unroll
            for (int i = 0; i < NV; i++) {
                pm[0] = fmaf(S[4 * i + 0], kc[i].x, pm[0]);
                po[0] = fmaf(S[4 * i + 0], qc[i].x, po[0]);
                pm[1] = fmaf(S[4 * i + 1], kc[i].y, pm[1]);
                po[1] = fmaf(S[4 * i + 1], qc[i].y, po[1]);
                pm[0] = fmaf(S[4 * i + 2], kc[i].z, pm[0]);
                po[0] = fmaf(S[4 * i + 2], qc[i].z, po[0]);
                pm[1] = fmaf(S[4 * i + 3], kc[i].w, pm[1]);
                po[1] = fmaf(S[4 * i + 3], qc[i].w, po[1]);
            }
            float m = pm[0] + pm[1], o = po[0] + po[1];
#pragma unroll
            for (int x = L / 2; x > 0; x >>= 1) {
                m += __shfl_xor_sync(0xffffffffu, m, x);
                o += __shfl_xor_sync(0xffffffffu, o, x);
            }
            const float delta = beta * (vc - m * gnew);
            if (g == 0)
                out[(size_t)(tile * GDR_TILE + tt) * out_stride] = fmaf(delta, kq, o * gnew);
            const float dg = delta * (1.0f / gnew);
#pragma unroll
            for (int i = 0; i < NV; i++) {
                S[4 * i + 0] = fmaf(kc[i].x, dg, S[4 * i + 0]);
                S[4 * i + 1] = fmaf(kc[i].y, dg, S[4 * i + 1]);
                S[4 * i + 2] = fmaf(kc[i].z, dg, S[4 * i + 2]);
                S[4 * i + 3] = fmaf(kc[i].w, dg, S[4 * i + 3]);
            }
            gam = gnew;
        };
        if (nt == GDR_TILE) {
            /* full tile unrolled: shared-memory loads of later tokens are scheduled ahead freely */
#pragma unroll
            for (int tt = 0; tt < GDR_TILE; tt++)
                step(tt);
        } else {
            for (int tt = 0; tt < nt; tt++)
                step(tt);
        }
    }
#pragma unroll
    for (int i = 0; i < NV; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            st[(size_t)((i * L + g) * 4 + e) * a.dv] = S[4 * i + e] * gam;
}

/* recurrence shape per key head dim: rows per thread, threads per block; columns = threads / (dk / rpt) */
#define GDR_SHAPE_32 8, 128
#define GDR_SHAPE_64 16, 128
#define GDR_SHAPE_128 16, 256
static int recur_cols(int dk)
{
    switch (dk) {
    case 32: return 128 / (32 / 8);
    case 64: return 128 / (64 / 16);
    case 128: return 256 / (128 / 16);
    default: return 0;
    }
}

bool gdn_prefill_supported(const gdn_args &a)
{
    const int cols = recur_cols(a.dk);
    return cols && a.Hk > 0 && a.Hv % a.Hk == 0 && a.dv % cols == 0 && a.K >= 1 && a.K <= 4 &&
           a.conv_dim == 2 * a.Hk * a.dk + a.Hv * a.dv;
}

cudaError_t launch_gdn_prep(const gdn_args &a, float *pre, int n_tokens, cudaStream_t s)
{
    if (!gdn_prefill_supported(a) || n_tokens < 1 || !pre)
        return cudaErrorInvalidValue;
    const int stride = gdn_prefill_stride(a.conv_dim, a.Hv);
    const int v_units = (a.Hv * a.dv + GDP_THREADS - 1) / GDP_THREADS;
    dim3 pgrid((n_tokens + GDP_TOKENS - 1) / GDP_TOKENS, a.Hk + v_units);
    return launch_pdl(gdn_prep_kernel, pgrid, dim3(GDP_THREADS), 0, s, a, pre, stride, n_tokens);
}

cudaError_t launch_gdn_prefill(const gdn_args &a, float *pre, int n_tokens, cudaStream_t s)
{
    cudaError_t e = launch_gdn_prep(a, pre, n_tokens, s);
    if (e != cudaSuccess)
        return e;
    const int stride = gdn_prefill_stride(a.conv_dim, a.Hv);
    dim3 rgrid(a.Hv * (a.dv / recur_cols(a.dk)));
    switch (a.dk) {
    case 32: return launch_pdl(gdn_recur_kernel<32, GDR_SHAPE_32>, rgrid, dim3(128), 0, s, a, (const float *)pre, stride, n_tokens);
    case 64: return launch_pdl(gdn_recur_kernel<64, GDR_SHAPE_64>, rgrid, dim3(128), 0, s, a, (const float *)pre, stride, n_tokens);
    case 128: return launch_pdl(gdn_recur_kernel<128, GDR_SHAPE_128>, rgrid, dim3(256), 0, s, a, (const float *)pre, stride, n_tokens);
    default: return cudaErrorInvalidValue;
    }
}
