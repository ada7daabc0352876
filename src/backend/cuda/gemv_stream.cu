/* gemv_stream.cu — the decode GEMV (one activation row, n_tokens == 1): y = W·x for every matrix of a
 * gemv_batch, with the same input transforms and output modes as gemv_decode.cu, built so that one
 * kernel's weight traffic overlaps the previous kernel's work.
 *
 * Each block owns one contiguous range of rows (grid = at most one block per SM) and streams it through
 * shared memory in stages of SR rows with cp.async (16-byte copies, GS_STAGES stages in flight, no
 * registers held by loads in flight). Weights never depend on earlier kernels, so the first stages are
 * issued before pdl_wait() and the block calls pdl_trigger() at once: the next kernel in the stream
 * starts on the other half of each SM (a block uses ≤ ~100 KB of shared memory and ≤ 128 registers per
 * thread) and issues its own weight stages while this one computes. After the wait, the input transform
 * is applied once per block into shared memory (gemv_prologue), each lane keeps its x values in
 * registers, and each warp takes rows of a stage (a lane group of LPR lanes per row, the same dequant
 * and dot as gemv_common.cuh, fp32 accumulation).
 *
 * Requirements (launch_gemv falls back to gemv_decode.cu otherwise): n_tokens == 1, cols % 512 == 0
 * (so every row's data, scales and biases are whole 16-byte chunks), 16-byte aligned matrices.
 */
#include "gemv_common.cuh"
#include "moe_topk.cuh"

#define GS_WARPS 8
#define GS_STAGES 3
#define GS_STAGE_BYTES (28 * 1024)

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
    const unsigned int s = (unsigned int)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Stage layout in shared memory: data [SR][row_bytes] | scales [SR][gpr] | biases [SR][gpr] (bf16). */
struct gs_layout {
    int sr;         /* rows per stage */
    int row_bytes;  /* bytes of one row's data */
    int gpr;        /* groups per row (0 for bf16 weights) */
    int stage_bytes;
    int early_trigger; /* 1: pdl_trigger() before pdl_wait() (default), 0: after (bench knob) */
};

/* Copy rows [r0, r0 + nr) of the batch (global row index) into stage buffer buf. */
__device__ __forceinline__ void gs_issue(const gemv_batch &b, const gs_layout &L, int r0, int nr, uint8_t *buf)
{
    const int cdata = L.row_bytes / 16, csc = L.gpr * 2 / 16, cpr = cdata + 2 * csc;
    const int total = nr * cpr;
    for (int c = threadIdx.x; c < total; c += GS_WARPS * 32) {
        const int row = c / cpr, k = c - row * cpr;
        const int gr = r0 + row;
        int m = 0;
#pragma unroll
        for (int q = 1; q < GEMV_MAX_MATS; q++)
            if (q < b.n_mats && gr >= b.row_start[q])
                m = q;
        const int64_t lr = gr - b.row_start[m];
        const uint8_t *src;
        uint8_t *dst;
        if (k < cdata) {
            src = b.m[m].data + lr * L.row_bytes + k * 16;
            dst = buf + (size_t)row * L.row_bytes + k * 16;
        } else if (k < cdata + csc) {
            src = reinterpret_cast<const uint8_t *>(b.m[m].scales) + lr * L.gpr * 2 + (k - cdata) * 16;
            dst = buf + (size_t)L.sr * L.row_bytes + (size_t)row * L.gpr * 2 + (k - cdata) * 16;
        } else {
            src = reinterpret_cast<const uint8_t *>(b.m[m].biases) + lr * L.gpr * 2 + (k - cdata - csc) * 16;
            dst = buf + (size_t)L.sr * (L.row_bytes + L.gpr * 2) + (size_t)row * L.gpr * 2 + (k - cdata - csc) * 16;
        }
        cp_async16(dst, src);
    }
}

template <int BITS, int LPR, int VPL, int IN_MODE, int OUT_MODE>
__global__ void __launch_bounds__(GS_WARPS * 32, 2)
gemv_stream_kernel(gemv_batch b, gemv_input in, int total_rows, int rows_per_block, gs_layout L,
                   unsigned long long *argmax)
{
    constexpr int CPV = 128 / BITS;
    constexpr int RPW = 32 / LPR;     /* rows per warp pass */
    constexpr bool XREG = VPL <= 2;   /* x in registers; wider rows read x from shared memory per row */
    constexpr int U = XREG ? 3 : 1;   /* rows per lane group per pass (wide rows already give VPL chains) */
    extern __shared__ __align__(16) uint8_t gs_smem[];
    const int cols = b.m[0].cols, nvec = cols / CPV;
    float *s_x = reinterpret_cast<float *>(gs_smem);
    float *s_xs = s_x + cols; /* [nvec] per-vector sums of x (shared-memory mode) */
    uint8_t *stages = gs_smem + (size_t)(cols + (nvec + 3) / 4 * 4) * sizeof(float);
    __shared__ float s_red[GS_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int li = lane % LPR, sub = lane / LPR;

    const int rb0 = blockIdx.x * rows_per_block;
    const int rb1 = min(total_rows, rb0 + rows_per_block);
    const int n_stages = rb1 > rb0 ? (rb1 - rb0 + L.sr - 1) / L.sr : 0;
#pragma unroll
    for (int s = 0; s < GS_STAGES; s++) {
        if (s < n_stages)
            gs_issue(b, L, rb0 + s * L.sr, min(L.sr, rb1 - rb0 - s * L.sr), stages + (size_t)s * L.stage_bytes);
        cp_async_commit();
    }
    if (L.early_trigger)
        pdl_trigger(); /* weights only so far: the next kernel may start its own prefetch */
    pdl_wait();
    if (!L.early_trigger)
        pdl_trigger();
    gemv_prologue<IN_MODE, GS_WARPS>(in, 0, cols, s_x, s_red);

    float x[XREG ? VPL : 1][CPV];
    float xs[XREG ? VPL : 1];
    if constexpr (XREG) {
        x_from_smem<BITS, LPR, VPL>(s_x, li, x);
        x_sums<BITS, VPL>(x, xs);
        x_prescale4<BITS, VPL>(x);
    } else {
        /* per 16-byte vector: its sum, then prescale in place (each vector owned by one thread) */
        for (int v = threadIdx.x; v < nvec; v += GS_WARPS * 32) {
            float xv[1][CPV], sv[1];
#pragma unroll
            for (int c = 0; c < CPV; c++)
                xv[0][c] = s_x[v * CPV + c];
            x_sums<BITS, 1>(xv, sv);
            x_prescale4<BITS, 1>(xv);
            s_xs[v] = sv[0];
#pragma unroll
            for (int c = 0; c < CPV; c++)
                s_x[v * CPV + c] = xv[0][c];
        }
        __syncthreads();
    }

    float best = -INFINITY;
    int best_row = 0x7fffffff;
    for (int s = 0; s < n_stages; s++) {
        cp_async_wait<GS_STAGES - 1>();
        __syncthreads();
        const uint8_t *buf = stages + (size_t)(s % GS_STAGES) * L.stage_bytes;
        const __nv_bfloat16 *sc = reinterpret_cast<const __nv_bfloat16 *>(buf + (size_t)L.sr * L.row_bytes);
        const __nv_bfloat16 *bi = sc + (size_t)L.sr * L.gpr;
        const int r0 = rb0 + s * L.sr, nr = min(L.sr, rb1 - r0);
        /* a warp pass covers U * RPW rows: U independent dot chains per lane for instruction-level
         * parallelism (the dequant is ~3 instructions per weight, near the issue limit at full bandwidth) */
        for (int p = warp; p * RPW * U < nr; p += GS_WARPS) {
            float dot[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int rl = (p * U + u) * RPW + sub;
                const int rc = rl < nr ? rl : 0; /* lanes past the stage read row 0 and store nothing */
                row_frag<BITS, VPL> f;
                const uint4 *wp = reinterpret_cast<const uint4 *>(buf + (size_t)rc * L.row_bytes);
#pragma unroll
                for (int j = 0; j < VPL; j++) {
                    f.v[j] = wp[j * LPR + li];
                    if (BITS < 16) {
                        const int g = ((j * LPR + li) * CPV) / 64;
                        f.s[j] = bf2f(sc[rc * L.gpr + g]);
                        f.b[j] = bf2f(bi[rc * L.gpr + g]);
                    }
                }
                if constexpr (XREG) {
                    dot[u] = row_dot<BITS, VPL>(f, x, xs);
                } else {
                    dot[u] = 0.0f;
#pragma unroll
                    for (int j = 0; j < VPL; j++) {
                        float xv[1][CPV], sv[1];
                        const float4 *xp = reinterpret_cast<const float4 *>(s_x + (j * LPR + li) * CPV);
#pragma unroll
                        for (int c = 0; c < CPV / 4; c++) {
                            const float4 t = xp[c];
                            xv[0][4 * c] = t.x;
                            xv[0][4 * c + 1] = t.y;
                            xv[0][4 * c + 2] = t.z;
                            xv[0][4 * c + 3] = t.w;
                        }
                        sv[0] = s_xs[j * LPR + li];
                        row_frag<BITS, 1> f1;
                        f1.v[0] = f.v[j];
                        f1.s[0] = f.s[j];
                        f1.b[0] = f.b[j];
                        dot[u] += row_dot<BITS, 1>(f1, xv, sv);
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int rl = (p * U + u) * RPW + sub;
                const float acc = group_sum<LPR>(dot[u]);
                if (rl < nr && li == 0) {
                    const int row = r0 + rl;
                    int m = 0;
#pragma unroll
                    for (int q = 1; q < GEMV_MAX_MATS; q++)
                        if (q < b.n_mats && row >= b.row_start[q])
                            m = q;
                    float *y = b.y[m] + (row - b.row_start[m]);
                    if (OUT_MODE == GEMV_OUT_ADD)
                        *y += acc;
                    else
                        *y = acc;
                    if (OUT_MODE == GEMV_OUT_ARGMAX && acc > best) {
                        best = acc;
                        best_row = row;
                    }
                }
            }
        }
        __syncthreads(); /* stage buffer s % GS_STAGES is free again */
        if (s + GS_STAGES < n_stages)
            gs_issue(b, L, r0 + GS_STAGES * L.sr, min(L.sr, rb1 - r0 - GS_STAGES * L.sr),
                     stages + (size_t)(s % GS_STAGES) * L.stage_bytes);
        cp_async_commit();
    }
    if (OUT_MODE == GEMV_OUT_ARGMAX) {
        unsigned long long k = best_row == 0x7fffffff ? 0ull : argmax_key(best, best_row);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            unsigned long long k2 = __shfl_xor_sync(0xffffffffu, k, o);
            k = k2 > k ? k2 : k;
        }
        if (lane == 0 && k)
            atomicMax(argmax, k);
    }
    if (b.topk_k > 0) { /* router: the last block to finish publishes the top-k once */
        __shared__ int s_idx[MOE_MAX_K];
        __shared__ float s_w[MOE_MAX_K];
        __shared__ float s_l[MOE_MAX_E];
        __shared__ unsigned int s_last;
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0)
            s_last = atomicAdd(b.topk_counter, 1u) == gridDim.x - 1;
        __syncthreads();
        if (!s_last)
            return;
        __threadfence();
        moe_topk_block(b.y[0], b.topk_n, b.topk_k, s_idx, s_w, s_l);
        if (threadIdx.x < b.topk_k) {
            b.topk_idx[threadIdx.x] = s_idx[threadIdx.x];
            b.topk_w[threadIdx.x] = s_w[threadIdx.x];
        }
        if (threadIdx.x == 0)
            *b.topk_counter = 0;
    }
}

/* ---- dispatch ------------------------------------------------------------------------------------ */

template <int BITS, int LPR, int VPL, int IM, int OM>
static cudaError_t gs_go(const gemv_batch &b, const gemv_input &in, unsigned long long *argmax, cudaStream_t s)
{
    static int sms = 0;
    if (!sms) {
        int dev = 0;
        cudaError_t e = cudaGetDevice(&dev);
        if (e == cudaSuccess)
            e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (e != cudaSuccess)
            return e;
    }
    const int total = b.row_start[b.n_mats];
    gs_layout L;
    L.row_bytes = (int)b.m[0].row_bytes;
    L.gpr = BITS < 16 ? b.m[0].cols / 64 : 0;
    const int row_total = L.row_bytes + 4 * L.gpr;
    constexpr int RPW = 32 / LPR, U = VPL <= 2 ? 3 : 1, PASS = RPW * U; /* rows of one warp pass */
    int sr = GS_STAGE_BYTES / row_total;
    sr = sr < GS_WARPS * PASS ? sr : GS_WARPS * PASS; /* at most one pass per warp per stage */
    sr = sr / PASS * PASS;
    if (sr < PASS)
        sr = PASS;
    L.sr = sr;
    L.stage_bytes = (sr * row_total + 15) / 16 * 16;
    L.early_trigger = g_cuda_tuning.gemv_stream == 1;
    int grid = (total + sr - 1) / sr;
    grid = grid < sms ? grid : sms;
    int rpb = (total + grid - 1) / grid;
    rpb = (rpb + sr - 1) / sr * sr; /* whole stages per block */
    grid = (total + rpb - 1) / rpb;
    const int nvec = b.m[0].cols / (128 / BITS);
    const size_t smem = (size_t)(b.m[0].cols + (nvec + 3) / 4 * 4) * sizeof(float) + (size_t)GS_STAGES * L.stage_bytes;
    static size_t smem_set = 0; /* opt-in above 48 KB, once per instantiation (largest size seen) */
    if (smem > smem_set) {
        cudaError_t e = cudaFuncSetAttribute(gemv_stream_kernel<BITS, LPR, VPL, IM, OM>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess)
            return e;
        smem_set = smem;
    }
    return launch_pdl(gemv_stream_kernel<BITS, LPR, VPL, IM, OM>, dim3(grid), dim3(GS_WARPS * 32), smem, s, b, in,
                      total, rpb, L, argmax);
}

template <int BITS, int LPR, int VPL>
static cudaError_t gs_modes(const gemv_batch &b, const gemv_input &in, int out_mode, unsigned long long *argmax,
                            cudaStream_t s)
{
    if (in.mode == GEMV_IN_PLAIN) {
        if (out_mode == GEMV_OUT_STORE) return gs_go<BITS, LPR, VPL, GEMV_IN_PLAIN, GEMV_OUT_STORE>(b, in, argmax, s);
        if (out_mode == GEMV_OUT_ADD) return gs_go<BITS, LPR, VPL, GEMV_IN_PLAIN, GEMV_OUT_ADD>(b, in, argmax, s);
    } else if (in.mode == GEMV_IN_RMSNORM) {
        if (out_mode == GEMV_OUT_STORE) return gs_go<BITS, LPR, VPL, GEMV_IN_RMSNORM, GEMV_OUT_STORE>(b, in, argmax, s);
        if (out_mode == GEMV_OUT_ARGMAX) return gs_go<BITS, LPR, VPL, GEMV_IN_RMSNORM, GEMV_OUT_ARGMAX>(b, in, argmax, s);
    } else if (in.mode == GEMV_IN_GATED) {
        if (out_mode == GEMV_OUT_ADD) return gs_go<BITS, LPR, VPL, GEMV_IN_GATED, GEMV_OUT_ADD>(b, in, argmax, s);
    }
    return cudaErrorInvalidValue;
}

template <int BITS>
static cudaError_t gs_bits(const gemv_batch &b, const gemv_input &in, int out_mode, unsigned long long *argmax,
                           cudaStream_t s)
{
    switch (b.m[0].cols / (128 / BITS)) { /* 16-byte vectors per row */
    case 16: return gs_modes<BITS, 16, 1>(b, in, out_mode, argmax, s);
    case 32: return gs_modes<BITS, 32, 1>(b, in, out_mode, argmax, s);
    case 64: return gs_modes<BITS, 32, 2>(b, in, out_mode, argmax, s);
    case 128: return gs_modes<BITS, 32, 4>(b, in, out_mode, argmax, s);
    case 256: if constexpr (BITS == 16) return gs_modes<BITS, 32, 8>(b, in, out_mode, argmax, s); else return cudaErrorNotSupported;
    default: return cudaErrorNotSupported;
    }
}

/* The streaming decode GEMV; cudaErrorNotSupported when the shape is not one it handles (the caller
 * then uses the general kernel). */
bool gemv_stream_supported(const gemv_batch &b, int n_tokens)
{
    if (n_tokens != 1 || !g_cuda_tuning.gemv_stream || b.m[0].cols % 512 != 0)
        return false;
    const int nvec = b.m[0].cols / (128 / b.m[0].bits);
    if (!(nvec == 16 || nvec == 32 || nvec == 64 || nvec == 128 || (nvec == 256 && b.m[0].bits == 16)))
        return false;
    for (int k = 0; k < b.n_mats; k++) {
        const dmat &m = b.m[k];
        if (((uintptr_t)m.data | (uintptr_t)m.scales | (uintptr_t)m.biases) & 15)
            return false;
    }
    return b.topk_k <= MOE_MAX_K && b.topk_n <= MOE_MAX_E;
}

cudaError_t launch_gemv_stream(const gemv_batch &b, const gemv_input &in, int out_mode, unsigned long long *argmax,
                               cudaStream_t s)
{
    if (!gemv_stream_supported(b, 1))
        return cudaErrorNotSupported;
    switch (b.m[0].bits) {
    case 4: return gs_bits<4>(b, in, out_mode, argmax, s);
    case 8: return gs_bits<8>(b, in, out_mode, argmax, s);
    case 16: return gs_bits<16>(b, in, out_mode, argmax, s);
    default: return cudaErrorNotSupported;
    }
}
