/* gemv_stream.cuh — the streamed 4-bit decode GEMV (gemv_stream.cu: the design) as a device function, so
 * that a kernel may run other work in the same launch around the GEMV: gs_run is the whole kernel body
 * with two hooks of a Front object, before_wait() (after the ring's first groups are issued and the PDL
 * trigger, before the wait: weights and old state only) and x_side() (after the wait: builds this warp's x
 * fragments, as mg_x_side, and returns its x scale). gemv_stream_kernel's Front is gs_front_plain;
 * deltanet/gdn_out_fused.cu's runs the DeltaNet decode scan first. gs_launch_shape sizes the ring and the
 * grid (the blocks resident at once) for a kernel built on gs_run.
 */
#ifndef LILY_GEMV_STREAM_CUH
#define LILY_GEMV_STREAM_CUH

#include "gemv_common.cuh"
#include "mma_gemv.cuh"

#define GS_WARPS 8
#define GS_MAX_STAGES 8
#define GS_ROW_PAD 64 /* bytes after each staged row */
/* The ring is sized so that this many blocks fit on one SM (when one stage does): two blocks of a few stages
 * keep as many bytes in flight as one block of a deep ring, and the second block's input transform and
 * tail overlap the first's (H200, 35B-A3B decode: 434 -> 447 tok/s at 4K, 337 -> 345 at 128K against the
 * deepest ring that fits one block). */
#define GS_BLOCKS_PER_SM 2

/* ---- sm_90 bulk copies and mbarriers (PTX ISA 8.0) ------------------------------------------------ */

__device__ __forceinline__ uint32_t gs_saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void gs_mbar_init(uint64_t *bar, unsigned int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(gs_saddr(bar)), "r"(count) : "memory");
}

/* One arrival that also expects `bytes` more of transaction count (the copies' complete_tx). */
__device__ __forceinline__ void gs_mbar_expect_tx(uint64_t *bar, unsigned int bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(gs_saddr(bar)), "r"(bytes) : "memory");
}

/* Wait until the phase of parity `parity` has completed (acquire: the copied bytes are visible). */
__device__ __forceinline__ void gs_mbar_wait(uint64_t *bar, unsigned int parity)
{
    unsigned int done = 0;
    while (!done)
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(gs_saddr(bar)), "r"(parity)
                     : "memory");
}

/* bytes (a multiple of 16, both addresses 16-byte aligned) from global src to shared dst, completing on bar. */
__device__ __forceinline__ void gs_bulk_copy(void *dst, const void *src, unsigned int bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(gs_saddr(dst)),
                 "l"(src), "r"(bytes), "r"(gs_saddr(bar))
                 : "memory");
}

/* Barrier `id` (1..15; 0 is __syncthreads) among n threads (whole warps). */
__device__ __forceinline__ void gs_bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

/* Bytes of one ring slot (a whole 16-row tile of `cols` columns: padded rows, scales, biases). */
__host__ __device__ __forceinline__ int gs_slot_bytes(int cols) { return 16 * (cols / 2 + GS_ROW_PAD) + 16 * (cols / 64) * 4; }

/* The x side of a plain streamed GEMV: mg_x_side. */
template <int IN_MODE, int KS, bool REGS>
struct gs_front_plain {
    __device__ __forceinline__ void before_wait() {}
    __device__ __forceinline__ float x_side(const gemv_input &in, int cols, float *x_area, float *s_red, const uint4 *&xh,
                                            const float *&off, const float *&xsum)
    {
        return mg_x_side<IN_MODE, GS_WARPS, KS, REGS>(in, cols, x_area, s_red, xh, off, xsum);
    }
};

/* The body of a streamed-GEMV kernel of GS_WARPS warps (gemv_stream.cu's header comment); sm_90 code only
 * (the caller guards with __CUDA_ARCH__ >= 900). Dynamic shared memory: the ring, then the x area. */
template <int IN_MODE, int OUT_MODE, int KS, class Front>
__device__ __forceinline__ void gs_run(const gemv_batch &b, const gemv_input &in, int n_tiles, int stages,
                                       unsigned long long *argmax, Front &front)
{
    tl_block<> tl(b.timeline);
    constexpr int RT = GS_WARPS / KS; /* tiles per group */
    extern __shared__ __align__(128) unsigned char gs_ring[];
    __shared__ __align__(8) uint64_t s_full[RT * GS_MAX_STAGES]; /* [rt][slot] */
    __shared__ float s_part[2][GS_WARPS][16];
    __shared__ float s_red[GS_WARPS];
    const int cols = b.m[0].cols, CW = cols / KS, steps = CW / 128, gpr = cols / 64;
    const int row_bytes = cols / 2, ws = row_bytes + GS_ROW_PAD, slot_bytes = gs_slot_bytes(cols);
    float *x_area = reinterpret_cast<float *>(gs_ring + (size_t)stages * RT * slot_bytes); /* mg_x_side's */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int ks = warp % KS, rt = warp / KS;
    const int n_groups = (n_tiles + RT - 1) / RT;
    unsigned char *my_slots = gs_ring + (size_t)rt * slot_bytes; /* slot k at + k * RT * slot_bytes */
    uint64_t *my_full = s_full + rt * GS_MAX_STAGES;

    if (threadIdx.x < RT * GS_MAX_STAGES && threadIdx.x % GS_MAX_STAGES < stages)
        gs_mbar_init(&s_full[threadIdx.x], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
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
            gs_mbar_expect_tx(&my_full[k], (unsigned int)(nrows * (row_bytes + 4 * gpr)));
        __syncwarp();
        if (lane < nrows)
            gs_bulk_copy(slot + lane * ws, W.data + (int64_t)(r0 + lane) * W.row_bytes, row_bytes, &my_full[k]);
        else if (lane == 16)
            gs_bulk_copy(slot + 16 * ws, W.scales + (int64_t)r0 * gpr, nrows * gpr * 2, &my_full[k]);
        else if (lane == 17)
            gs_bulk_copy(slot + 16 * ws + 32 * gpr, W.biases + (int64_t)r0 * gpr, nrows * gpr * 2, &my_full[k]);
    };
    if (ks == 0)
        for (int i = 0; i < stages; i++)
            fill(i, i); /* weights only: before the previous kernel has finished */
    gemv_input_prefetch<GS_WARPS>(in, cols);
    pdl_trigger(); /* before the Front's pre-wait work, which may wait on its own loads */
    front.before_wait();
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
    const float xk = front.x_side(in, cols, x_area, s_red, s_xh, s_off, s_xsum);
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
        gs_mbar_wait(&my_full[k], parity);
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
}

/* What one instantiation of a gs_run kernel asks of the device once (gs_launch_shape fills it). */
struct gs_occupancy {
    int sms, dyn_max, dyn_shared, per_sm[GS_MAX_STAGES + 1];
};

/* The launch shape of a gs_run kernel `kern` (GS_WARPS warps; `occ` the instantiation's own cache, zero at
 * first) for `tiles` 16-row tiles of `cols` columns, groups of RT tiles, x_bytes of x area: *grid = the
 * groups or the blocks resident at once if fewer (so every block of the grid is resident at once),
 * *stages ring slots per tile position, *smem the dynamic shared memory. The ring is sized so that
 * GS_BLOCKS_PER_SM blocks fit on an SM where one stage does. cudaErrorInvalidValue when not even one stage
 * fits. */
template <typename Kern>
static cudaError_t gs_launch_shape(Kern kern, gs_occupancy &occ, int tiles, int cols, int RT, size_t x_bytes, int *grid,
                                   int *stages, size_t *smem)
{
    const int groups = (tiles + RT - 1) / RT;
    const size_t stage_bytes = (size_t)RT * gs_slot_bytes(cols);
    if (!occ.sms) { /* SMs, the opt-in shared memory per block (less the static part), the dynamic shared
                     * memory of one block when GS_BLOCKS_PER_SM share an SM */
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
        occ.dyn_max = optin - (int)fa.sharedSizeBytes;
        occ.dyn_shared = per_mp / GS_BLOCKS_PER_SM - reserved - (int)fa.sharedSizeBytes;
        occ.sms = n;
    }
    if ((size_t)occ.dyn_max < x_bytes + stage_bytes)
        return cudaErrorInvalidValue;
    const int budget = occ.dyn_shared > 0 && (size_t)occ.dyn_shared >= x_bytes + stage_bytes ? occ.dyn_shared : occ.dyn_max;
    int fit = (int)(((size_t)budget - x_bytes) / stage_bytes);
    fit = fit < GS_MAX_STAGES ? fit : GS_MAX_STAGES;
    const int s0 = fit;
    if (!occ.per_sm[s0]) {
        int n = 0;
        const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, GS_WARPS * 32, x_bytes + s0 * stage_bytes);
        if (e != cudaSuccess)
            return e;
        occ.per_sm[s0] = n > 0 ? n : 1;
    }
    const int resident = occ.sms * occ.per_sm[s0], g = groups < resident ? groups : resident;
    const int per_block = (groups + g - 1) / g;
    *grid = g;
    *stages = s0 < per_block ? s0 : per_block; /* no slot this block would never fill */
    *smem = x_bytes + (size_t)*stages * stage_bytes;
    return cudaSuccess;
}

#endif
