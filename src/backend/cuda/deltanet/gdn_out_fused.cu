/* gdn_out_fused.cu — one decode token's Gated DeltaNet mixer and its out_proj in one launch
 * (GDN_KERNEL_DECODE_FUSED): the scan stops being a separate dependent kernel.
 *
 * The launch is the streamed out_proj GEMV (gemv/gemv_stream.cuh: gs_run, weights streamed into a
 * shared-memory ring by bulk copies, the first groups issued before the PDL wait) with a Front that runs
 * the scan first. Its grid is the blocks resident at once (gs_launch_shape), so all its blocks run
 * together and may wait on each other. Warp w of block b takes the scan's warp items (value head j, state
 * columns c0..c0+3: gdn_decode_warp, the work of one warp of gdn_decode_kernel) i = 8b + w, i + 8·grid, ...;
 * the first item's state rows, conv taps and history and gate parameters are loaded before the PDL wait.
 * After the wait each item runs and its lanes 0..3 publish o[j·dv + c0 + lane] as the 64-bit word
 * tag << 32 | bits(o) (tag = ((step + 1) << 8) | layer: a word with this call's tag holds this call's
 * value, single-copy atomic, so no fence and no counter to reset; zeroed words never match). Then each
 * warp builds the x slice of its out_proj columns (gated RMSNorm over whole heads of dv, as gemv_stream's
 * per-warp x side, mg_warp_x_build): it issues the z and norm-weight loads, polls the words of its slice
 * until all carry the tag (backing off up to 64 ns; a trap after ~2^26 rounds: a missing publisher is a
 * bug, not a hang), and the GEMV proceeds as gemv_stream_kernel<GATED, ADD, KS, REGS = true>.
 *
 * Bits: the scan's arithmetic is gdn_decode_warp's (as gdn_decode_kernel), the x side's is mg_warp_x's
 * with act read from the words (the same fp32 values), the GEMV's gs_run's: state, conv state, o and y
 * equal launch_gdn_decode followed by launch_gemv_stream bit for bit.
 */
#include "deltanet.cuh"
#include "gdn_decode_warp.cuh"
#include "backend/cuda/gemv/gemv_stream.cuh"

__device__ __forceinline__ unsigned int gdn_pub_tag(int step, int layer)
{
    return (((unsigned int)step + 1u) << 8) | ((unsigned int)layer & 255u);
}

__device__ __forceinline__ void gdn_st_relaxed_u64(unsigned long long *p, unsigned long long v)
{
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* Two neighbouring words (16-byte aligned), each read single-copy atomic. */
__device__ __forceinline__ void gdn_ld_relaxed_v2(const unsigned long long *p, unsigned long long &x, unsigned long long &y)
{
    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(x), "=l"(y) : "l"(p) : "memory");
}

template <int DK, int KS>
struct gdn_out_front {
    const gdn_args &a;
    gdn_decode_warp<DK> w;
    int item, items, stride, lane;

    __device__ __forceinline__ explicit gdn_out_front(const gdn_args &args) : a(args)
    {
        lane = threadIdx.x & 31;
        item = blockIdx.x * GS_WARPS + (threadIdx.x >> 5);
        items = a.Hv * (a.dv / GDN1_CPW);
        stride = gridDim.x * GS_WARPS;
    }
    __device__ __forceinline__ void before_wait()
    {
        if (item < items) /* warp-uniform */
            w.load(a, item / (a.dv / GDN1_CPW), (item % (a.dv / GDN1_CPW)) * GDN1_CPW, lane);
    }
    __device__ __forceinline__ float x_side(const gemv_input &in, int cols, float *x_area, float * /*s_red*/,
                                            const uint4 *&xh, const float *&off, const float *&xsum)
    {
        const unsigned int tag = gdn_pub_tag(*a.step, a.layer);
        const unsigned long long hi = (unsigned long long)tag << 32;
        for (int it = item; it < items; it += stride) {
            const int j = it / (a.dv / GDN1_CPW), c0 = (it % (a.dv / GDN1_CPW)) * GDN1_CPW;
            if (it != item)
                w.load(a, j, c0, lane);
            const float o = w.run(a, j, c0, lane);
            if (lane < GDN1_CPW) {
                const size_t col = (size_t)j * a.dv + c0 + lane;
                a.out[col] = o;
                gdn_st_relaxed_u64(a.pub + col, hi | __float_as_uint(o));
            }
        }
        /* the x slice: z and the norm weight in one batch, then this lane's items polled from the words */
        float v[MG_X_ITEMS][8], nw[MG_X_ITEMS][8], z[MG_X_ITEMS][8];
        mg_warp_x_loads<GEMV_IN_GATED, KS, false>(in, cols, v, nw, z);
        const int ks = (threadIdx.x >> 5) % KS, CW = cols / KS, nit = CW / 8, base = ks * nit;
        unsigned int pending = 0u;
#pragma unroll
        for (int k = 0; k < MG_X_ITEMS; k++) {
#pragma unroll
            for (int e = 0; e < 8; e++)
                v[k][e] = 0.0f;
            if (lane + 32 * k < nit)
                pending |= 1u << k;
        }
        unsigned int ns = 0, polls = 0;
        for (;;) {
#pragma unroll
            for (int k = 0; k < MG_X_ITEMS; k++) {
                if ((pending >> k) & 1u) {
                    const unsigned long long *p = a.pub + 8 * (base + lane + 32 * k);
                    unsigned long long u[8];
#pragma unroll
                    for (int e = 0; e < 8; e += 2)
                        gdn_ld_relaxed_v2(p + e, u[e], u[e + 1]);
                    bool all = true;
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        all = all && (unsigned int)(u[e] >> 32) == tag;
                    if (all) {
#pragma unroll
                        for (int e = 0; e < 8; e++)
                            v[k][e] = __uint_as_float((unsigned int)u[e]);
                        pending &= ~(1u << k);
                    }
                }
            }
            if (!__any_sync(0xffffffffu, pending != 0u))
                break;
            ns = ns ? min(2 * ns, 64u) : 16u;
            __nanosleep(ns);
            if (++polls > (1u << 26))
                __trap();
        }
        return mg_warp_x_build<GEMV_IN_GATED, GS_WARPS, KS>(in, cols, x_area, v, nw, z, xh, off, xsum);
    }
};

template <int DK, int KS>
__global__ void __launch_bounds__(GS_WARPS * 32, 2)
gdn_out_fused_kernel(gemv_batch b, gemv_input in, gdn_args a, int n_tiles, int stages)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    gdn_out_front<DK, KS> front(a);
    gs_run<GEMV_IN_GATED, GEMV_OUT_ADD, KS>(b, in, n_tiles, stages, NULL, front);
#endif
}

bool gdn_out_fused_supported(const gdn_args &a)
{
    if (!a.fuse_out || !a.fuse_out_x || !a.pub || !a.out)
        return false;
    if (!(a.dk == 32 || a.dk == 64 || a.dk == 128) || a.dv % 16 || a.Hk < 1 || a.Hv % a.Hk || a.K < 1 || a.K > 4)
        return false;
    const gemv_batch &b = *a.fuse_out;
    const gemv_input &in = *a.fuse_out_x;
    const int cols = a.Hv * a.dv;
    if (b.exact || b.n_mats != 1 || b.m[0].cols != cols || cols > GDN_PUB_WORDS || !gemv_stream_supported(b, 1))
        return false;
    return in.mode == GEMV_IN_GATED && in.head_dim == a.dv && in.act == a.out && mg_x_regs_ok<GEMV_IN_GATED, GS_WARPS>(in, cols);
}

template <int DK, int KS>
static cudaError_t gof_go(const gdn_args &a, cudaStream_t s)
{
    void (*kern)(gemv_batch, gemv_input, gdn_args, int, int) = gdn_out_fused_kernel<DK, KS>;
    const gemv_batch &b = *a.fuse_out;
    const int cols = b.m[0].cols, tiles = (b.m[0].rows + 15) / 16;
    static gs_occupancy occ; /* asked once per instantiation */
    int grid = 0, stages = 0;
    size_t smem = 0;
    const cudaError_t e = gs_launch_shape(kern, occ, tiles, cols, GS_WARPS / KS, (size_t)mg_warp_x_floats(cols, GS_WARPS) * 4,
                                          &grid, &stages, &smem);
    if (e != cudaSuccess)
        return e;
    return launch_pdl(kern, dim3(grid), dim3(GS_WARPS * 32), smem, s, b, *a.fuse_out_x, a, tiles, stages);
}

template <int DK>
static cudaError_t gof_ks(const gdn_args &a, cudaStream_t s)
{
    switch (a.fuse_out->m[0].cols / 512) {
    case 1: return gof_go<DK, 1>(a, s);
    case 2: return gof_go<DK, 2>(a, s);
    case 4: return gof_go<DK, 4>(a, s);
    case 8: return gof_go<DK, 8>(a, s);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t launch_gdn_out_fused(const gdn_args &a, cudaStream_t s)
{
    if (!gdn_out_fused_supported(a))
        return cudaErrorInvalidValue;
    switch (a.dk) {
    case 32: return gof_ks<32>(a, s);
    case 64: return gof_ks<64>(a, s);
    case 128: return gof_ks<128>(a, s);
    default: return cudaErrorInvalidValue;
    }
}
