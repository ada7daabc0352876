/* moe_route.cu — the sparse MoE block after the router GEMV, on the device with no host sync
 * (docs/MODEL.md §4.5):
 *
 *   moe_gate_up: every block ranks the top-k over the router logits (moe_topk.cuh), applies the post-attention RMSNorm to the
 *     residual stream, and computes hid = silu(x·Wg[e]ᵀ) ⊙ (x·Wu[e]ᵀ) for its rows of the selected experts
 *     (slot top_k = the shared expert). Only selected experts' rows are read.
 *     grid = (slots * ceil(inter / rows_per_block), n_tokens), 256 threads; x normalised once per block
 *     into shared memory; the shared expert's rows are loaded before pdl_wait().
 *   Both kernels call pdl_trigger() before pdl_wait(): what they read before the wait is weights only,
 *   so the next kernel may launch at once and prefetch its own weights (see gemv_mma.cu).
 *   moe_down: out[r] += Σ_k w_k · (Wd[e_k] hid_k)[r] + sigmoid(shared_gate) · (Wd_shared hid_s)[r]
 *     (routing weights, shared-expert gate and the residual add fused). One warp per slot,
 *     16 output rows per block: grid = (ceil(hidden / 16), n_tokens), 32 * (top_k + 1) threads.
 *     When the shared expert is wider or narrower than a routed one (inter != shared_inter, e.g.
 *     lily-tiny: 64 vs 256), moe_down_kernel<..., MIXED = true> runs instead: the lane shape covers the wider of the
 *     two and each slot's warp masks the vectors past its own column count (zero x and weights).
 *   moe_args.cpu_slots > 0 (decode with host experts on the CPU, cpu_experts.cu): both grids leave out the
 *     last cpu_slots routed slots (the shared expert's blocks and warp come right after the others).
 */
#include "backend/cuda/gemv/gemv_common.cuh"
#include "moe_topk.cuh"

#define MOE_WARPS 8
#define MOE_GU_UNROLL 4
#define MOE_DOWN_ROWS 16

template <int BITS, int LPR, int VPL>
__global__ void __launch_bounds__(MOE_WARPS * 32, VPL <= 2 ? 2 : 1) moe_gate_up_kernel(moe_args a, int chunks)
{
    tl_block<> tl(a.timeline);
    constexpr int CPV = 128 / BITS;
    constexpr int RPW = 32 / LPR;
    constexpr int U = VPL > 2 ? 2 : VPL == 2 ? 3 : MOE_GU_UNROLL;
    extern __shared__ float s_x[]; /* [hidden] */
    __shared__ int s_idx[MOE_MAX_K];
    __shared__ float s_w[MOE_MAX_K];
    __shared__ unsigned int s_key[MOE_MAX_E];
    __shared__ float s_red[MOE_WARPS];
    const int t = blockIdx.y;
    const int si = blockIdx.x / chunks, chunk = blockIdx.x % chunks; /* slots here: top_k - cpu_slots routed, shared */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int li = lane % LPR, sub = lane / LPR;
    const bool shared = si == a.top_k - a.cpu_slots;
    const int slot = shared ? a.top_k : si;
    const dmat &G = shared ? a.sgate : a.gate;
    const dmat &Up = shared ? a.sup : a.up;
    const int n_rows = shared ? a.shared_inter : a.inter;
    const int r0 = (chunk * MOE_WARPS + warp) * RPW * U;
    row_frag<BITS, VPL> fg[U], fu[U];
    auto load_rows = [&](int64_t ebase) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int row = r0 + u * RPW + sub;
            if (row < n_rows) {
                row_load<BITS, LPR, VPL>(G, ebase + row, li, fg[u]);
                row_load<BITS, LPR, VPL>(Up, ebase + row, li, fu[u]);
            }
        }
    };
    if (shared)
        load_rows(0); /* the shared expert's weights do not depend on the router */
    /* weights only so far: let the down projection start (it prefetches nothing that depends on us) */
    pdl_trigger();
    pdl_wait();
    tl.waited();
    const gemv_input in = gemv_input_rmsnorm(a.h, a.hidden, a.norm_w, a.eps);
    gemv_prologue<GEMV_IN_RMSNORM, MOE_WARPS>(in, t, a.hidden, s_x, s_red);
    tl.mark();
    moe_topk_block(a.router_logits + (int64_t)t * a.logit_stride, a.n_experts, a.top_k, s_idx, s_w, s_key);
    if (blockIdx.x == 0 && threadIdx.x < a.top_k) {
        a.topk_idx[t * a.top_k + threadIdx.x] = s_idx[threadIdx.x];
        a.topk_w[t * a.top_k + threadIdx.x] = s_w[threadIdx.x];
    }
    if (!shared)
        load_rows((int64_t)s_idx[slot] * a.inter);
    if (r0 >= n_rows)
        return;
    float x[VPL][CPV];
    x_from_smem<BITS, LPR, VPL>(s_x, li, x);
    float xs[VPL];
    x_sums<BITS, VPL>(x, xs);
    x_prescale4<BITS, VPL>(x);
    const int hid_stride = max(a.inter, a.shared_inter);
    float *hid = a.hid + ((int64_t)t * (a.top_k + 1) + slot) * hid_stride;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int row = r0 + u * RPW + sub;
        const float gv = group_sum<LPR>(row_dot<BITS, VPL>(fg[u], x, xs));
        const float uv = group_sum<LPR>(row_dot<BITS, VPL>(fu[u], x, xs));
        if (row < n_rows && li == 0)
            hid[row] = silu_f(gv) * uv;
    }
}

/* Vector v = j * LPR + li of a row (weights, scale, bias), or zeros when v >= nv (this slot's vectors). */
template <int BITS, int LPR, int VPL>
__device__ __forceinline__ void row_load_masked(const dmat &m, int64_t prow, int li, int nv, row_frag<BITS, VPL> &f)
{
    constexpr int CPV = gemv_traits<BITS>::CPV;
    const uint4 *p = reinterpret_cast<const uint4 *>(m.data + prow * m.row_bytes);
    const int gpr = m.cols / 64;
#pragma unroll
    for (int j = 0; j < VPL; j++) {
        const int v = j * LPR + li;
        f.v[j] = make_uint4(0u, 0u, 0u, 0u);
        f.s[j] = f.b[j] = 0.0f;
        if (v < nv) { /* past nv: nothing read (the last expert's last row ends the allocation) */
            f.v[j] = __ldg(p + v);
            if (BITS < 16) {
                const int64_t g = prow * gpr + (v * CPV) / 64;
                f.s[j] = bf2f(m.scales[g]);
                f.b[j] = bf2f(m.biases[g]);
            }
        }
    }
}

/* x_load with the vectors past nv zeroed. */
template <int BITS, int LPR, int VPL>
__device__ __forceinline__ void x_load_masked(const float *act, int li, int nv, float (&x)[VPL][128 / BITS])
{
    constexpr int CPV = 128 / BITS;
#pragma unroll
    for (int j = 0; j < VPL; j++) {
        const int v = j * LPR + li;
        const float4 *p = reinterpret_cast<const float4 *>(act + v * CPV);
#pragma unroll
        for (int c = 0; c < CPV / 4; c++) {
            float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (v < nv)
                t = p[c];
            x[j][4 * c] = t.x;
            x[j][4 * c + 1] = t.y;
            x[j][4 * c + 2] = t.z;
            x[j][4 * c + 3] = t.w;
        }
    }
}

/* MIXED (inter != shared_inter): LPR * VPL vectors cover max(inter, shared_inter) columns; slot k's warp
 * reads only its own nv = (k == top_k ? shared_inter : inter) / CPV vectors (the masked ones contribute
 * s * 0 + b * 0 = 0). Same grid, block, outputs and summation order either way. */
template <int BITS, int LPR, int VPL, bool MIXED>
__global__ void moe_down_kernel(moe_args a)
{
    constexpr int CPV = 128 / BITS;
    constexpr int RPW = 32 / LPR;
    constexpr int U0 = MOE_DOWN_ROWS / RPW > 0 ? MOE_DOWN_ROWS / RPW : 1;
    constexpr int U = U0 < 8 / VPL ? U0 : 8 / VPL; /* rows of loads in flight per lane group */
    __shared__ float s_part[MOE_MAX_K + 1][MOE_DOWN_ROWS];
    tl_block<> tl(a.timeline);
    pdl_trigger(); /* nothing read yet: the next layer's input projections may start their prefetch */
    pdl_wait();
    tl.waited();
    const int t = blockIdx.y;
    const int lane = threadIdx.x & 31, n_gpu = a.top_k - a.cpu_slots;
    const bool shared = (int)(threadIdx.x >> 5) == n_gpu; /* warps: n_gpu routed slots, then the shared */
    const int slot = shared ? a.top_k : threadIdx.x >> 5;
    const int li = lane % LPR, sub = lane / LPR;
    const int r0 = blockIdx.x * MOE_DOWN_ROWS;
    const dmat &D = shared ? a.sdown : a.down;
    const int nv = (shared ? a.shared_inter : a.inter) / CPV;
    const int64_t ebase = shared ? 0 : (int64_t)a.topk_idx[t * a.top_k + slot] * a.hidden;
    const int hid_stride = max(a.inter, a.shared_inter);

    float x[VPL][CPV];
    if (MIXED)
        x_load_masked<BITS, LPR, VPL>(a.hid + ((int64_t)t * (a.top_k + 1) + slot) * hid_stride, li, nv, x);
    else
        x_load<BITS, LPR, VPL>(a.hid + ((int64_t)t * (a.top_k + 1) + slot) * hid_stride, li, x);
    float xs[VPL];
    x_sums<BITS, VPL>(x, xs);
    x_prescale4<BITS, VPL>(x);
    for (int rb = 0; rb < MOE_DOWN_ROWS; rb += RPW * U) {
        row_frag<BITS, VPL> f[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int r = rb + u * RPW + sub;
            if (r < MOE_DOWN_ROWS && r0 + r < a.hidden) {
                if (MIXED)
                    row_load_masked<BITS, LPR, VPL>(D, ebase + r0 + r, li, nv, f[u]);
                else
                    row_load<BITS, LPR, VPL>(D, ebase + r0 + r, li, f[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int r = rb + u * RPW + sub;
            const float d = group_sum<LPR>(row_dot<BITS, VPL>(f[u], x, xs));
            if (r < MOE_DOWN_ROWS && li == 0)
                s_part[slot][r] = d;
        }
    }
    __syncthreads();
    if (threadIdx.x < MOE_DOWN_ROWS && r0 + (int)threadIdx.x < a.hidden) {
        const int r = threadIdx.x;
        float acc = 0.0f;
        for (int k = 0; k < n_gpu; k++)
            acc = fmaf(a.topk_w[t * a.top_k + k], s_part[k][r], acc);
        const float sg = sigmoid_f(a.router_logits[(int64_t)t * a.logit_stride + a.n_experts]);
        acc = fmaf(sg, s_part[a.top_k][r], acc);
        a.out[(int64_t)t * a.hidden + r0 + r] += acc;
    }
}

template <int BITS, int LPR, int VPL>
static cudaError_t gate_up_go(const moe_args &a, int n_tokens, cudaStream_t s)
{
    const int rows = max(a.inter, a.shared_inter);
    const int rows_per_block = MOE_WARPS * (32 / LPR) * (VPL > 2 ? 2 : VPL == 2 ? 3 : MOE_GU_UNROLL);
    const int chunks = (rows + rows_per_block - 1) / rows_per_block;
    dim3 grid(chunks * (a.top_k - a.cpu_slots + 1), n_tokens);
    return launch_pdl(moe_gate_up_kernel<BITS, LPR, VPL>, grid, dim3(MOE_WARPS * 32), (size_t)a.hidden * sizeof(float), s,
                      a, chunks);
}

template <int BITS>
static cudaError_t gate_up_bits(const moe_args &a, int n_tokens, cudaStream_t s)
{
    switch (a.hidden / (128 / BITS)) {
    case 4: return gate_up_go<BITS, 4, 1>(a, n_tokens, s);
    case 8: return gate_up_go<BITS, 8, 1>(a, n_tokens, s);
    case 16: return gate_up_go<BITS, 16, 1>(a, n_tokens, s);
    case 32: return gate_up_go<BITS, 32, 1>(a, n_tokens, s);
    case 64: return gate_up_go<BITS, 32, 2>(a, n_tokens, s);
    case 128: return gate_up_go<BITS, 32, 4>(a, n_tokens, s);
    case 256: if constexpr (BITS == 16) return gate_up_go<BITS, 32, 8>(a, n_tokens, s); else return cudaErrorInvalidValue;
    /* three vectors per lane (hidden 384 / 768 / 1536 / 3072 at 4 or 8 bits), as gemv_decode.cu */
    case 12: return gate_up_go<BITS, 4, 3>(a, n_tokens, s);
    case 24: return gate_up_go<BITS, 8, 3>(a, n_tokens, s);
    case 48: return gate_up_go<BITS, 16, 3>(a, n_tokens, s);
    case 96: return gate_up_go<BITS, 32, 3>(a, n_tokens, s);
    default: return cudaErrorInvalidValue;
    }
}

static bool gate_up_nvec_ok(int bits, int nvec)
{
    switch (nvec) { /* the cases of gate_up_bits */
    case 4: case 8: case 16: case 32: case 64: case 128: case 12: case 24: case 48: case 96: return true;
    case 256: return bits == 16;
    default: return false;
    }
}

cudaError_t launch_moe_gate_up(const moe_args &a, int n_tokens, cudaStream_t s)
{
    if (moe_decode_mma_supported(a, n_tokens))
        return launch_moe_gate_up_mma(a, s); /* moe_decode.cu */
    if (a.logit_pub || a.router_acc) /* the fused router and the router sums are moe_decode.cu's only */
        return cudaErrorInvalidValue;
    if (a.top_k > MOE_MAX_K || a.top_k > 32 || a.n_experts > MOE_MAX_E || a.gate.bits != a.sgate.bits)
        return cudaErrorInvalidValue;
    switch (a.gate.bits) {
    case 4: return gate_up_bits<4>(a, n_tokens, s);
    case 8: return gate_up_bits<8>(a, n_tokens, s);
    case 16: return gate_up_bits<16>(a, n_tokens, s);
    default: return cudaErrorInvalidValue;
    }
}

template <int BITS, int LPR, int VPL, bool MIXED>
static cudaError_t down_go(const moe_args &a, int n_tokens, cudaStream_t s)
{
    dim3 grid((a.hidden + MOE_DOWN_ROWS - 1) / MOE_DOWN_ROWS, n_tokens);
    return launch_pdl(moe_down_kernel<BITS, LPR, VPL, MIXED>, grid, dim3(32 * (a.top_k - a.cpu_slots + 1)), 0, s, a);
}

/* The lane shape from the row width: inter, or the wider of inter and shared_inter when they differ. */
template <int BITS, bool MIXED>
static cudaError_t down_bits(const moe_args &a, int n_tokens, cudaStream_t s)
{
    switch ((MIXED ? max(a.inter, a.shared_inter) : a.inter) / (128 / BITS)) {
    case 2: if constexpr (BITS == 4) return down_go<BITS, 2, 1, MIXED>(a, n_tokens, s); else return cudaErrorInvalidValue;
    case 4: return down_go<BITS, 4, 1, MIXED>(a, n_tokens, s);
    case 8: return down_go<BITS, 8, 1, MIXED>(a, n_tokens, s);
    case 16: return down_go<BITS, 16, 1, MIXED>(a, n_tokens, s);
    case 32: return down_go<BITS, 32, 1, MIXED>(a, n_tokens, s);
    case 64: return down_go<BITS, 32, 2, MIXED>(a, n_tokens, s);
    case 128: return down_go<BITS, 32, 4, MIXED>(a, n_tokens, s);
    default: return cudaErrorInvalidValue;
    }
}

static bool down_nvec_ok(int bits, int nvec)
{
    switch (nvec) { /* the cases of down_bits */
    case 2: return bits == 4;
    case 4: case 8: case 16: case 32: case 64: case 128: return true;
    default: return false;
    }
}

cudaError_t launch_moe_down(const moe_args &a, int n_tokens, cudaStream_t s)
{
    if (moe_decode_mma_supported(a, n_tokens))
        return launch_moe_down_mma(a, s); /* moe_decode.cu */
    if (a.top_k + 1 > 32 || a.down.bits != a.sdown.bits)
        return cudaErrorInvalidValue;
    if (a.inter != a.shared_inter) {
        const int cpv = 128 / a.down.bits;
        if (a.inter <= 0 || a.shared_inter <= 0 || a.inter % cpv || a.shared_inter % cpv)
            return cudaErrorInvalidValue;
        switch (a.down.bits) {
        case 4: return down_bits<4, true>(a, n_tokens, s);
        case 8: return down_bits<8, true>(a, n_tokens, s);
        case 16: return down_bits<16, true>(a, n_tokens, s);
        default: return cudaErrorInvalidValue;
        }
    }
    switch (a.down.bits) {
    case 4: return down_bits<4, false>(a, n_tokens, s);
    case 8: return down_bits<8, false>(a, n_tokens, s);
    case 16: return down_bits<16, false>(a, n_tokens, s);
    default: return cudaErrorInvalidValue;
    }
}

bool moe_route_supported(int gu_bits, int down_bits, int hidden, int inter, int shared_inter, int n_experts, int top_k)
{
    if ((gu_bits != 4 && gu_bits != 8 && gu_bits != 16) || (down_bits != 4 && down_bits != 8 && down_bits != 16))
        return false;
    if (top_k < 1 || top_k > MOE_MAX_K || top_k + 1 > 32 || n_experts < top_k || n_experts > MOE_MAX_E)
        return false;
    const int gcpv = 128 / gu_bits, dcpv = 128 / down_bits;
    if (hidden <= 0 || hidden % gcpv || (size_t)hidden * sizeof(float) > 48 * 1024 || !gate_up_nvec_ok(gu_bits, hidden / gcpv))
        return false;
    if (inter <= 0 || shared_inter <= 0 || inter % dcpv || shared_inter % dcpv)
        return false;
    return down_nvec_ok(down_bits, max(inter, shared_inter) / dcpv);
}
