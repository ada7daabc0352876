/* gemv_stream.cu — the 4-bit decode GEMV (one activation row, y = W·x on tensor cores, the tile math
 * of mma_gemv.cuh, results bit-identical to gemv_mma.cu) with the weights streamed through a
 * shared-memory ring by sm_90 bulk copies (cp.async.bulk + mbarrier), so that ~80-160 KB per SM (the
 * rings of two blocks: GS_BLOCKS_PER_SM) are in flight instead of the ~32 KB gemv_mma keeps in registers:
 * at ~2 µs loaded latency an SM needs ~64 KB in flight to draw its 1/132 of the H200's ~4.2 TB/s.
 *
 * Shape (as gemv_mma): a tile is 16 rows of one matrix; KS = cols / 512 warps split its columns (a
 * warp owns 512 columns, 4 mma steps); a block of 8 warps consumes a group of RT = 8 / KS tiles, groups
 * grid-stride (grid = blocks resident at once). Ring: `stages` slots per tile position rt, a slot holds
 * one whole tile — 16 rows of row_bytes + 64 bytes (the pad puts rows g and g + 1 of a quarter-warp's
 * 16-byte reads in different banks) and the tile's scales and biases as in global memory. Copies: one
 * bulk copy per row and one each for scales and biases, issued by lanes 0..17 of the tile's first warp,
 * completing on the slot's mbarrier (expect_tx = the bytes). The first `stages` groups are issued
 * before pdl_wait() (weights only), so a small matrix is entirely in flight while the previous kernel
 * finishes. Per group each warp waits on its slot's mbarrier, builds its fragment from shared memory
 * (mg_load_smem), runs mg_dot, and the KS warps of a tile meet at one named barrier (none when KS = 1)
 * that both publishes the column partials (s_part, double-buffered by group parity) and frees the
 * slot; the tile's first warp then refills the slot with the group `stages` ahead and lanes 0..15
 * reduce and store one row each (STORE / ADD / ARGMAX exactly as gemv_mma). x side as gemv_mma's
 * (mg_x_side: per warp, no block barrier but an RMSNorm's sum of squares); none after it.
 *
 * Requirements (gemv_stream_supported; otherwise gemv_mma runs): gemv_mma_supported, cols in {512, 1024,
 * 2048, 4096}, rows 16-byte aligned, the sm_90 code running (cuda_sm90_code: the compute_80 PTX has an
 * empty body).
 */
#include "gemv_common.cuh"
#include "mma_gemv.cuh"
#include "backend/cuda/bulk_copy.cuh"

#define GS_WARPS 8
#define GS_MAX_STAGES 8
/* The ring is sized so that this many blocks fit on one SM (when one stage does): two blocks of a few stages
 * keep as many bytes in flight as one block of a deep ring, and the second block's input transform and
 * tail overlap the first's (H200, 35B-A3B decode: 434 -> 447 tok/s at 4K, 337 -> 345 at 128K against the
 * deepest ring that fits one block). */
#define GS_BLOCKS_PER_SM 2

/* Barrier `id` (1..15; 0 is __syncthreads) among n threads (whole warps). */
__device__ __forceinline__ void gs_bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

template <int IN_MODE, int OUT_MODE, int KS, bool REGS>
__global__ void __launch_bounds__(GS_WARPS * 32, 2)
gemv_stream_kernel(gemv_batch b, gemv_input in, int n_tiles, int stages, unsigned long long *argmax)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    tl_block<> tl(b.timeline);
    constexpr int RT = GS_WARPS / KS; /* tiles per group */
    extern __shared__ __align__(128) unsigned char gs_ring[];
    __shared__ __align__(8) uint64_t s_full[RT * GS_MAX_STAGES]; /* [rt][slot] */
    __shared__ float s_part[2][GS_WARPS][16];
    __shared__ float s_red[GS_WARPS];
    const int cols = b.m[0].cols, CW = cols / KS, steps = CW / 128, gpr = cols / 64;
    const int row_bytes = cols / 2, ws = row_bytes + BULK_ROW_PAD, slot_bytes = bulk_tile_bytes(cols);
    float *x_area = reinterpret_cast<float *>(gs_ring + (size_t)stages * RT * slot_bytes); /* mg_x_side's */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int ks = warp % KS, rt = warp / KS;
    const int n_groups = (n_tiles + RT - 1) / RT;
    unsigned char *my_slots = gs_ring + (size_t)rt * slot_bytes; /* slot k at + k * RT * slot_bytes */
    uint64_t *my_full = s_full + rt * GS_MAX_STAGES;

    if (threadIdx.x < RT * GS_MAX_STAGES && threadIdx.x % GS_MAX_STAGES < stages)
        bulk_mbar_init(&s_full[threadIdx.x], 1);
    bulk_mbar_init_fence();
    __syncthreads();

    /* the tile's first warp: copy this block's i-th group's tile rt into slot k (nothing past the end) */
    auto fill = [&](int i, int k) {
        const int grp = blockIdx.x + i * gridDim.x, tile = grp * RT + rt;
        if (grp >= n_groups || tile >= n_tiles)
            return;
        int m = 0, r0 = 0;
        mg_locate(b, tile, &m, &r0);
        const dmat &W = b.m[m];
        const int nrows = min(16, W.rows - r0);
        unsigned char *slot = my_slots + (size_t)k * RT * slot_bytes;
        if (lane == 0)
            bulk_mbar_expect_tx(&my_full[k], (unsigned int)(nrows * (row_bytes + 4 * gpr)));
        __syncwarp();
        if (lane < nrows)
            bulk_copy(slot + lane * ws, W.data + (int64_t)(r0 + lane) * W.row_bytes, row_bytes, &my_full[k]);
        else if (lane == 16)
            bulk_copy(slot + 16 * ws, W.scales + (int64_t)r0 * gpr, nrows * gpr * 2, &my_full[k]);
        else if (lane == 17)
            bulk_copy(slot + 16 * ws + 32 * gpr, W.biases + (int64_t)r0 * gpr, nrows * gpr * 2, &my_full[k]);
    };
    if (ks == 0)
        for (int i = 0; i < stages; i++)
            fill(i, i); /* weights only: before the previous kernel has finished */
    gemv_input_prefetch<GS_WARPS>(in, cols);
    /* the fused DeltaNet conv: the first group's taps and history (old state), before the wait */
    const bool conv = OUT_MODE == GEMV_OUT_STORE && b.conv_w;
    const int cpar = conv ? (__ldcg(b.step) & 1) : 0;
    float4 cw0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float ch0[3] = {0.0f, 0.0f, 0.0f};
    if (conv && ks == 0 && lane < 16) {
        const int row = (blockIdx.x * RT + rt) * 16 + lane; /* matrix 0 starts at tile 0 */
        if ((int)blockIdx.x < n_groups && row < b.conv_rows) {
            cw0 = __ldg(reinterpret_cast<const float4 *>(b.conv_w) + row);
            const float *hs = b.conv_state + (size_t)cpar * 3 * b.conv_rows + row;
#pragma unroll
            for (int q = 0; q < 3; q++)
                ch0[q] = hs[(size_t)q * b.conv_rows];
        }
    }
    pdl_trigger();
    pdl_wait();
    tl.waited();
    /* ADD: the values the first group's rows add into, loaded now so the read overlaps the input transform */
    float y_first = 0.0f;
    if (OUT_MODE == GEMV_OUT_ADD && ks == 0 && lane < 16 && (int)blockIdx.x < n_groups && (int)blockIdx.x * RT + rt < n_tiles) {
        int m = 0, r0 = 0;
        mg_locate(b, blockIdx.x * RT + rt, &m, &r0);
        if (r0 + lane < b.m[m].rows)
            y_first = b.y[m][r0 + lane];
    }

    /* x: the input transform, then fp16 fragments in the order each thread feeds them (as gemv_mma) */
    const uint4 *s_xh;
    const float *s_off, *s_xsum;
    const float xk = mg_x_side<IN_MODE, GS_WARPS, KS, REGS>(in, cols, x_area, s_red, s_xh, s_off, s_xsum);
    tl.mark();

    float best = -INFINITY;
    int best_row = 0x7fffffff;
    int k = 0;
    unsigned int parity = 0;
    for (int i = 0;; i++) {
        const int grp = blockIdx.x + i * gridDim.x, tile = grp * RT + rt;
        if (grp >= n_groups || tile >= n_tiles) /* a dead tile is in the last group only */
            break;
        const unsigned char *slot = my_slots + (size_t)k * RT * slot_bytes;
        bulk_mbar_wait(&my_full[k], parity);
        mg_frag f;
        mg_load_smem(slot, ws, reinterpret_cast<const __nv_bfloat16 *>(slot + 16 * ws),
                     reinterpret_cast<const __nv_bfloat16 *>(slot + 16 * ws + 32 * gpr), gpr, ks * CW, steps, g, t, f);
        float acc_a = 0.0f, acc_b = 0.0f;
        mg_dot(f, ks * CW, steps, s_xh, s_off, s_xsum, g, t, acc_a, acc_b);
        float *part = s_part[i & 1][warp];
        if (t == 0) { /* this warp's x scale undone (a power of two: exact) */
            part[g] = acc_a / xk;
            part[g + 8] = acc_b / xk;
        }
        /* the tile's KS warps: partials published, slot read by all of them */
        if (KS == 1)
            __syncwarp();
        else
            gs_bar_sync(1 + rt, KS * 32);
        if (ks == 0) {
            fill(i + stages, k);
            int m = 0, r0 = 0;
            mg_locate(b, tile, &m, &r0);
            const int row = r0 + lane;
            if (lane < 16 && row < b.m[m].rows) {
                float v = 0.0f;
#pragma unroll
                for (int q = 0; q < KS; q++)
                    v += s_part[i & 1][rt * KS + q][lane];
                if (conv && m == 0 && row < b.conv_rows) {
                    float4 w = cw0;
                    float h[3] = {ch0[0], ch0[1], ch0[2]};
                    if (i > 0) { /* later groups' taps and history: loaded now */
                        w = __ldg(reinterpret_cast<const float4 *>(b.conv_w) + row);
                        const float *hs = b.conv_state + (size_t)cpar * 3 * b.conv_rows + row;
#pragma unroll
                        for (int q = 0; q < 3; q++)
                            h[q] = hs[(size_t)q * b.conv_rows];
                    }
                    float *ho = b.conv_state + (size_t)(cpar ^ 1) * 3 * b.conv_rows + row;
                    ho[0] = h[1];
                    ho[b.conv_rows] = h[2];
                    ho[2 * (size_t)b.conv_rows] = v;
                    float acc = 0.0f;
                    acc = fmaf(w.x, h[0], acc);
                    acc = fmaf(w.y, h[1], acc);
                    acc = fmaf(w.z, h[2], acc);
                    v = silu_f(fmaf(w.w, v, acc));
                }
                float *y = b.y[m] + row;
                if (OUT_MODE == GEMV_OUT_ADD)
                    *y = (i == 0 ? y_first : *y) + v;
                else
                    *y = v;
                if (OUT_MODE == GEMV_OUT_ARGMAX && v > best) {
                    best = v;
                    best_row = b.row_start[m] + row;
                }
            }
        }
        if (++k == stages) {
            k = 0;
            parity ^= 1u;
        }
    }
    if (OUT_MODE == GEMV_OUT_ARGMAX)
        warp_argmax_publish(best, best_row, lane, argmax);
#endif
}

/* ---- dispatch ------------------------------------------------------------------------------------ */

static int64_t gs_weight_bytes(const gemv_batch &b)
{
    int64_t bytes = 0;
    for (int k = 0; k < b.n_mats; k++)
        bytes += (int64_t)b.m[k].rows * (b.m[k].cols / 2 + (b.m[k].cols / 64) * 4);
    return bytes;
}

bool gemv_stream_supported(const gemv_batch &b, int n_tokens)
{
    if (!gemv_mma_supported(b, n_tokens))
        return false;
    const int cols = b.m[0].cols;
    if (!(cols == 512 || cols == 1024 || cols == 2048 || cols == 4096))
        return false;
    for (int k = 0; k < b.n_mats; k++)
        if (b.m[k].n_experts > 1 || b.m[k].row_bytes % 16 || b.m[k].row_bytes < cols / 2)
            return false;
    if (gs_weight_bytes(b) < 1024)
        return false;
    return cuda_sm90_code(); /* bulk copies and mbarrier transaction counts: the sm_90 code only */
}

template <int IM, int OM, int KS, bool REGS>
static cudaError_t gs_go(const gemv_batch &b, const gemv_input &in, unsigned long long *argmax, cudaStream_t s)
{
    void (*kern)(gemv_batch, gemv_input, int, int, unsigned long long *) = gemv_stream_kernel<IM, OM, KS, REGS>;
    constexpr int RT = GS_WARPS / KS;
    int tiles = 0;
    for (int k = 0; k < b.n_mats; k++)
        tiles += (b.m[k].rows + 15) / 16;
    const int groups = (tiles + RT - 1) / RT, cols = b.m[0].cols;
    const size_t stage_bytes = (size_t)RT * bulk_tile_bytes(cols);
    const size_t x_bytes = REGS ? (size_t)mg_warp_x_floats(cols, GS_WARPS) * 4
                                : (size_t)cols * 4 + (size_t)cols * 2 + (size_t)(cols / 64) * 8;
    /* asked once per instantiation: SMs, the opt-in shared memory per block (less the static part), the
     * dynamic shared memory of one block when GS_BLOCKS_PER_SM share an SM */
    static int sms = 0, dyn_max = 0, dyn_shared = 0, per_sm[GS_MAX_STAGES + 1];
    if (!sms) {
        int dev = 0, optin = 0, n = 0, per_mp = 0, reserved = 0;
        cudaFuncAttributes fa;
        cudaError_t e = cudaGetDevice(&dev);
        if (e == cudaSuccess)
            e = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
        if (e == cudaSuccess)
            e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        if (e == cudaSuccess)
            e = cudaDeviceGetAttribute(&per_mp, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
        if (e == cudaSuccess)
            e = cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev);
        if (e == cudaSuccess)
            e = cudaFuncGetAttributes(&fa, kern);
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - (int)fa.sharedSizeBytes);
        if (e != cudaSuccess)
            return e;
        dyn_max = optin - (int)fa.sharedSizeBytes;
        dyn_shared = per_mp / GS_BLOCKS_PER_SM - reserved - (int)fa.sharedSizeBytes;
        sms = n;
    }
    if ((size_t)dyn_max < x_bytes + stage_bytes)
        return cudaErrorInvalidValue;
    const int budget = dyn_shared > 0 && (size_t)dyn_shared >= x_bytes + stage_bytes ? dyn_shared : dyn_max;
    int fit = (int)(((size_t)budget - x_bytes) / stage_bytes);
    fit = fit < GS_MAX_STAGES ? fit : GS_MAX_STAGES;
    const int s0 = fit;
    if (!per_sm[s0]) {
        int n = 0;
        const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, GS_WARPS * 32, x_bytes + s0 * stage_bytes);
        if (e != cudaSuccess)
            return e;
        per_sm[s0] = n > 0 ? n : 1;
    }
    const int resident = sms * per_sm[s0], grid = groups < resident ? groups : resident;
    const int per_block = (groups + grid - 1) / grid;
    const int stages = s0 < per_block ? s0 : per_block; /* no slot this block would never fill */
    return launch_pdl(kern, dim3(grid), dim3(GS_WARPS * 32), x_bytes + stages * stage_bytes, s, b, in, tiles, stages, argmax);
}

template <int IM, int OM>
static cudaError_t gs_ks(const gemv_batch &b, const gemv_input &in, unsigned long long *argmax, cudaStream_t s)
{
    const bool regs = mg_x_regs_ok<IM, GS_WARPS>(in, b.m[0].cols);
    switch (b.m[0].cols / 512) {
    case 1: return regs ? gs_go<IM, OM, 1, true>(b, in, argmax, s) : gs_go<IM, OM, 1, false>(b, in, argmax, s);
    case 2: return regs ? gs_go<IM, OM, 2, true>(b, in, argmax, s) : gs_go<IM, OM, 2, false>(b, in, argmax, s);
    case 4: return regs ? gs_go<IM, OM, 4, true>(b, in, argmax, s) : gs_go<IM, OM, 4, false>(b, in, argmax, s);
    case 8: return regs ? gs_go<IM, OM, 8, true>(b, in, argmax, s) : gs_go<IM, OM, 8, false>(b, in, argmax, s);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t launch_gemv_stream(const gemv_batch &b, const gemv_input &in, int out_mode, unsigned long long *argmax,
                               cudaStream_t s)
{
    if (!gemv_stream_supported(b, 1) ||
        (b.conv_w && (out_mode != GEMV_OUT_STORE || !b.step || b.conv_rows > b.m[0].rows)))
        return cudaErrorInvalidValue;
    if (in.mode == GEMV_IN_PLAIN) {
        if (out_mode == GEMV_OUT_STORE) return gs_ks<GEMV_IN_PLAIN, GEMV_OUT_STORE>(b, in, argmax, s);
        if (out_mode == GEMV_OUT_ADD) return gs_ks<GEMV_IN_PLAIN, GEMV_OUT_ADD>(b, in, argmax, s);
    } else if (in.mode == GEMV_IN_RMSNORM) {
        if (out_mode == GEMV_OUT_STORE) return gs_ks<GEMV_IN_RMSNORM, GEMV_OUT_STORE>(b, in, argmax, s);
        if (out_mode == GEMV_OUT_ARGMAX) return gs_ks<GEMV_IN_RMSNORM, GEMV_OUT_ARGMAX>(b, in, argmax, s);
    } else if (in.mode == GEMV_IN_GATED) {
        if (out_mode == GEMV_OUT_ADD) return gs_ks<GEMV_IN_GATED, GEMV_OUT_ADD>(b, in, argmax, s);
    }
    return cudaErrorInvalidValue;
}
