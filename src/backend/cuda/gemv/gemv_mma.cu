/* gemv_mma.cu — the decode GEMV for 4-bit weights (one activation row): y = W·x on tensor cores, so
 * that dequantization costs ~0.7 instructions per weight instead of 3 (at 4.3 TB/s an H200 SM must
 * consume ~33 weights per clock; fp32 dequant + FMA would need ~80% of its issue slots). The tile math
 * (nibbles OR'd into fp16 1024 + q, offsets removed per group in fp32) is in mma_gemv.cuh.
 *
 * Shape: a warp owns a tile of 16 rows × CW columns (CW = min(cols, 512)), KS = cols / CW warps split
 * the columns of one tile and are reduced in shared memory; a block of 8 warps holds a group of 8 / KS
 * tiles and walks groups grid-stride (grid = blocks resident at once), loading the next group's weights
 * while it computes one. The first group's weights, scales and biases (≤ 2 × 4 16-byte vectors + 16
 * words per thread) are loaded before pdl_wait(), overlapping the previous kernel, and pdl_trigger()
 * comes before the wait so the next kernel may start prefetching its own weights.
 * x side (mg_x_side): each warp loads and transforms the x of its own column slice and builds its fp16
 * fragments itself (mg_warp_x: no block barrier, one for an RMSNorm's sum of squares; gemv_prologue +
 * mg_block_x_tail for the inputs it does not take); fp16 overflow is avoided by scaling the slice's x by a
 * power of two when its max|x| > 2^14 (undone on the warp's dot products).
 *
 * Requirements (gemv_kernel_choose picks gemv_decode.cu's kernel otherwise): 4-bit, n_tokens == 1,
 * cols % 128 == 0 and cols / min(cols, 512) in {1, 2, 4, 8}, 16-byte aligned data.
 */
#include "gemv_common.cuh"
#include "mma_gemv.cuh"

#define GM_WARPS 8

/* Grid-stride over groups of RT tiles (grid <= what fits at once): the next group's weights are
 * loaded into registers while the current one is computed, and the x side runs once per warp (REGS) or
 * block. */
template <int IN_MODE, int OUT_MODE, int KS, bool REGS>
__global__ void __launch_bounds__(GM_WARPS * 32, 1)
gemv_mma_kernel(gemv_batch b, gemv_input in, int n_tiles, unsigned long long *argmax)
{
    tl_block<> tl(b.timeline);
    constexpr int RT = GM_WARPS / KS; /* row tiles per group */
    extern __shared__ __align__(16) float gm_smem[];
    const int cols = b.m[0].cols, CW = cols / KS, steps = CW / 128;
    __shared__ float s_red[GM_WARPS];
    __shared__ float s_part[GM_WARPS][16];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int ks = warp % KS, rt = warp / KS;
    const int n_groups = (n_tiles + RT - 1) / RT;

    /* this warp's loads for group grp (rows clamped inside the matrix; dead tiles read row 0) */
    auto load = [&](int grp, mg_frag &f) {
        const int tile = grp * RT + rt;
        int m = 0, r0 = 0;
        mg_locate(b, tile < n_tiles ? tile : 0, &m, &r0);
        const dmat &W = b.m[m];
        const int ra = min(r0 + g, W.rows - 1), rb = min(r0 + g + 8, W.rows - 1);
        mg_load(W, ra, rb, ks * CW, steps, t, f);
    };
    mg_frag f0, f1;
    int grp = blockIdx.x;
    if (grp < n_groups)
        load(grp, f0);
    gemv_input_prefetch<GM_WARPS>(in, cols);
    pdl_trigger(); /* weights only so far: the next kernel may launch and prefetch its own */
    pdl_wait();
    tl.waited();

    /* x: the input transform, then fp16 fragments in the order each thread feeds them (gm_smem: the x area) */
    const uint4 *s_xh;
    const float *s_off, *s_xsum;
    const float xk = mg_x_side<IN_MODE, GM_WARPS, KS, REGS>(in, cols, gm_smem, s_red, s_xh, s_off, s_xsum);
    tl.mark();

    float best = -INFINITY;
    int best_row = 0x7fffffff;
    /* one group: dot, reduce the KS column slices of each tile, store (thread i < RT*16 owns row i % 16
     * of tile i / 16) */
    auto compute = [&](int grp, const mg_frag &f) {
        float acc_a = 0.0f, acc_b = 0.0f;
        mg_dot(f, ks * CW, steps, s_xh, s_off, s_xsum, g, t, acc_a, acc_b);
        if (t == 0) { /* this warp's x scale undone (a power of two: exact) */
            s_part[warp][g] = acc_a / xk;
            s_part[warp][g + 8] = acc_b / xk;
        }
        __syncthreads();
        if (threadIdx.x < RT * 16) {
            const int trt = threadIdx.x / 16, r = threadIdx.x % 16;
            const int tl = grp * RT + trt;
            int mm = 0, r0 = 0;
            mg_locate(b, tl, &mm, &r0);
            const int row = r0 + r;
            if (tl < n_tiles && row < b.m[mm].rows) {
                float v = 0.0f;
#pragma unroll
                for (int k = 0; k < KS; k++)
                    v += s_part[trt * KS + k][r];
                float *y = b.y[mm] + row;
                if (OUT_MODE == GEMV_OUT_ADD)
                    *y += v;
                else
                    *y = v;
                if (OUT_MODE == GEMV_OUT_ARGMAX && v > best) {
                    best = v;
                    best_row = b.row_start[mm] + row;
                }
            }
        }
        __syncthreads(); /* s_part is reused by the next group */
    };
    while (grp < n_groups) { /* two groups per pass so the double buffer stays in registers */
        const int g1 = grp + gridDim.x, g2 = g1 + gridDim.x;
        if (g1 < n_groups)
            load(g1, f1);
        compute(grp, f0);
        if (g1 >= n_groups)
            break;
        if (g2 < n_groups)
            load(g2, f0);
        compute(g1, f1);
        grp = g2;
    }
    if (OUT_MODE == GEMV_OUT_ARGMAX)
        warp_argmax_publish(best, best_row, lane, argmax);
}

/* ---- dispatch ------------------------------------------------------------------------------------ */

bool gemv_mma_supported(const gemv_batch &b, int n_tokens)
{
    if (n_tokens != 1 || b.m[0].bits != 4 || b.m[0].cols % 128 != 0)
        return false;
    if (b.exact) /* exact mode: fp16 operands are not wanted */
        return false;
    const int cols = b.m[0].cols, CW = cols < 512 ? cols : 512, ks = cols / CW;
    if (cols % CW || !(ks == 1 || ks == 2 || ks == 4 || ks == 8))
        return false;
    for (int k = 0; k < b.n_mats; k++)
        if (((uintptr_t)b.m[k].data | (uintptr_t)b.m[k].scales | (uintptr_t)b.m[k].biases) & 15)
            return false;
    return true;
}

template <int IM, int OM, int KS, bool REGS>
static cudaError_t gm_go(const gemv_batch &b, const gemv_input &in, unsigned long long *argmax, cudaStream_t s)
{
    int tiles = 0;
    for (int k = 0; k < b.n_mats; k++)
        tiles += (b.m[k].rows + 15) / 16;
    constexpr int RT = GM_WARPS / KS;
    const int cols = b.m[0].cols;
    const size_t smem = (REGS ? (size_t)mg_warp_x_floats(cols, GM_WARPS) : (size_t)cols + cols / 2 + 2 * (cols / 64)) *
                        sizeof(float);
    static size_t smem_set = 48 * 1024; /* opt in above the default once per instantiation */
    cudaError_t e = cuda_smem_opt_in(gemv_mma_kernel<IM, OM, KS, REGS>, smem, &smem_set);
    if (e != cudaSuccess)
        return e;
    static int resident = 0; /* blocks that fit on the GPU at once (asked once per instantiation) */
    e = cuda_resident_blocks(gemv_mma_kernel<IM, OM, KS, REGS>, GM_WARPS * 32, smem, &resident);
    if (e != cudaSuccess)
        return e;
    const int groups = (tiles + RT - 1) / RT;
    return launch_pdl(gemv_mma_kernel<IM, OM, KS, REGS>, dim3(groups < resident ? groups : resident), dim3(GM_WARPS * 32), smem,
                      s, b, in, tiles, argmax);
}

template <int IM, int OM>
static cudaError_t gm_ks(const gemv_batch &b, const gemv_input &in, unsigned long long *argmax, cudaStream_t s)
{
    const int cols = b.m[0].cols, CW = cols < 512 ? cols : 512;
    const bool regs = mg_x_regs_ok<IM, GM_WARPS>(in, cols);
    switch (cols / CW) {
    case 1: return regs ? gm_go<IM, OM, 1, true>(b, in, argmax, s) : gm_go<IM, OM, 1, false>(b, in, argmax, s);
    case 2: return regs ? gm_go<IM, OM, 2, true>(b, in, argmax, s) : gm_go<IM, OM, 2, false>(b, in, argmax, s);
    case 4: return regs ? gm_go<IM, OM, 4, true>(b, in, argmax, s) : gm_go<IM, OM, 4, false>(b, in, argmax, s);
    case 8: return regs ? gm_go<IM, OM, 8, true>(b, in, argmax, s) : gm_go<IM, OM, 8, false>(b, in, argmax, s);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t launch_gemv_mma(const gemv_batch &b, const gemv_input &in, int out_mode, unsigned long long *argmax,
                            cudaStream_t s)
{
    if (!gemv_mma_supported(b, 1))
        return cudaErrorInvalidValue;
    if (in.mode == GEMV_IN_PLAIN) {
        if (out_mode == GEMV_OUT_STORE) return gm_ks<GEMV_IN_PLAIN, GEMV_OUT_STORE>(b, in, argmax, s);
        if (out_mode == GEMV_OUT_ADD) return gm_ks<GEMV_IN_PLAIN, GEMV_OUT_ADD>(b, in, argmax, s);
    } else if (in.mode == GEMV_IN_RMSNORM) {
        if (out_mode == GEMV_OUT_STORE) return gm_ks<GEMV_IN_RMSNORM, GEMV_OUT_STORE>(b, in, argmax, s);
        if (out_mode == GEMV_OUT_ARGMAX) return gm_ks<GEMV_IN_RMSNORM, GEMV_OUT_ARGMAX>(b, in, argmax, s);
    } else if (in.mode == GEMV_IN_GATED) {
        if (out_mode == GEMV_OUT_ADD) return gm_ks<GEMV_IN_GATED, GEMV_OUT_ADD>(b, in, argmax, s);
    }
    return cudaErrorInvalidValue;
}
