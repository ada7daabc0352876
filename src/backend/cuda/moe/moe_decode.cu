/* moe_decode.cu — the sparse MoE block of one decode token (n_tokens == 1) for 4-bit experts, on tensor
 * cores (the 16-row tile of mma_gemv.cuh), after the router GEMV:
 *
 *   moe_gate_up_mma: block = one (16-row tile, slot) item, 8 warps = {gate, up} × 4 column slices of
 *     hidden (by default one wave of resident blocks, the shared-expert items past it staged: STAGED
 *     below); the top-k is ranked by each routed block (moe_topk.cuh; the block of item 0 publishes it
 *     for moe_down_mma);
 *     hid[slot][r] = silu(x·Wg[e]ᵀ) ⊙ (x·Wu[e]ᵀ), x = RMSNorm(h) · post_norm; slot top_k = the shared
 *     expert, whose rows are loaded before pdl_wait(); a routed slot reads its expert id right after the
 *     wait and issues its loads before normalising x.
 *   moe_down_mma: block = 16 output rows, one warp per slot (top_k + 1 warps), each building its own
 *     slot's x fragments from hid[slot]; out[r] += Σ_k w_k·(Wd[e_k] hid_k)[r] + sigmoid(g_s)·(Wd_s hid_s)[r].
 * Both call pdl_trigger() first: they read nothing before pdl_wait() that a dependent could write.
 *
 * Early ids (with PDL): the gate/up block of item 0, which ranks the top-k,
 * also writes it as
 * tagged words (moe_args.topk_pub, moe_topk.cuh: hi = tag, lo = expert id / weight bits; tag =
 * moe_pub_tag(step, layer), unique per forward call and layer of the session), and the consumers poll them
 * BEFORE their pdl_wait(): moe_down_mma's shared-expert warp for all slots, then its routed warps issue their
 * expert loads while gate/up still runs (otherwise they wait for the whole gate/up grid). Each word carries its own tag, so no fence orders
 * them: a word with this call's tag holds this call's value (single-copy atomic 64-bit accesses).
 * Deadlock-free: a kernel is launched only when every block of its predecessor has executed pdl_trigger()
 * (gate/up and down: first thing) or exited, so the publishing block is already resident when a consumer
 * starts to poll, and what the publisher waits on (its own pdl_wait: the router) never waits on the
 * polling kernel; the pollers hold no
 * resources a publisher still needs. Without PDL (the compute_80 PTX build, where pdl_wait is compiled
 * out: cuda_sm90_code()) nothing is published or polled and the ids are read after
 * the wait as before (moe_early_ids_wanted). Results are bit-identical either way (the same ids and
 * weights feed the same arithmetic).
 *
 * moe_args.cpu_slots > 0 (host experts on the CPU, cpu_experts.cu): the items and warps cover only the first
 * top_k - cpu_slots routed slots and the shared expert (hid and topk indices keep the slot numbers), the
 * ranking and weights still all top_k; cpu_slots == 0 is the grid and arithmetic above unchanged.
 *
 * Requirements (moe_route.cu's kernels otherwise): 4-bit routed and shared experts, hidden 512..2048 (% 512),
 * inter == shared_inter == 512 or 256 or 128, top_k + 1 <= 16, n_tokens == 1, E <= MOE_MAX_E.
 */
#include "backend/cuda/gemv/gemv_common.cuh"
#include "backend/cuda/gemv/mma_gemv.cuh"
#include "moe_topk.cuh"

#define MD_WARPS 8
#define MD_MAX_SLOTS 16
#define MD_X_PER 8 /* values of h per thread in moe_gate_up_mma: hidden <= MD_X_PER * 32 * MD_WARPS */
/* moe_down_mma_kernel's register cap: 9 warps x 112 registers + a streamed GEMV block (8 warps x 128)
 * fit one SM's 64K registers, so the next layer's input projection can launch (PDL) and prefetch its
 * weights while this kernel runs */
#define MD_DOWN_MAX_REGS 112

static_assert(MOE_PUB_WORDS >= 2 * MOE_MAX_K, "moe_args.topk_pub holds 2 words per top-k slot");

bool moe_early_ids_wanted(int layer)
{
    return cuda_sm90_code() && layer >= 0 && layer < 256;
}

/* Whether this launch publishes / polls the tagged top-k (the same answer for both kernels of a layer). */
static bool moe_early_ids_on(const moe_args &a)
{
    return moe_early_ids_wanted(a.layer) && a.topk_pub && a.step;
}

/* Registers capped for 2 blocks per SM (__launch_bounds__).
 * STAGED: a 1D grid of the blocks resident at once (items = (slot, 16-row tile) slot-major, block b owns
 * item b); the items past the grid are tiles of the shared expert (the last slot), which block
 * b - gridDim.x also computes: their weights are copied into shared memory (mg_load_async) before
 * pdl_wait(), so there is no second wave whose loads would start only after the top-k. */
template <bool STAGED>
__global__ void __launch_bounds__(MD_WARPS * 32, 2) moe_gate_up_mma_kernel(moe_args a, int tiles)
{
    tl_block<> tl(a.timeline);
    extern __shared__ __align__(16) float md_smem[];
    const int H = a.hidden;
    float *s_x = md_smem;                                   /* [H] */
    uint4 *s_xh = reinterpret_cast<uint4 *>(md_smem + H);   /* [H / 8] */
    float *s_off = md_smem + H + H / 2, *s_xsum = s_off + H / 64;
    unsigned char *s_stage = reinterpret_cast<unsigned char *>(s_xsum + H / 64); /* STAGED: [MG_STAGE_BYTES][threads] */
    __shared__ float s_red[MD_WARPS];
    __shared__ float s_part[MD_WARPS][16];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int item = STAGED ? blockIdx.x : blockIdx.y * tiles + blockIdx.x;
    const int n_gpu = a.top_k - a.cpu_slots; /* items: n_gpu routed slots, then the shared expert (slot top_k) */
    const int tile = item % tiles, shared = item / tiles == n_gpu, slot = shared ? a.top_k : item / tiles;
    const int mat = warp / 4, ks = warp % 4, CW = H / 4, steps = CW / 128;
    const dmat &W = shared ? (mat ? a.sup : a.sgate) : (mat ? a.up : a.gate);
    const int rows = shared ? a.shared_inter : a.inter;
    const int r0 = tile * 16;
    const bool live = r0 < rows;
    const int ra = live ? r0 + g : 0, rb = live ? r0 + g + 8 : 0;
    /* STAGED: the extra item (a shared-expert tile) of this block, or -1 */
    const int x_item = (int)(blockIdx.x + gridDim.x), x_tile = STAGED && x_item < (n_gpu + 1) * tiles ? x_item - n_gpu * tiles : -1;
    if (STAGED && x_tile >= 0) {
        const dmat &Ws = mat ? a.sup : a.sgate;
        const bool xl = x_tile * 16 < a.shared_inter;
        mg_load_async(Ws, xl ? x_tile * 16 + g : 0, xl ? x_tile * 16 + g + 8 : 0, ks * CW, steps, t, s_stage, threadIdx.x,
                      MD_WARPS * 32);
    }

    mg_frag f;
    if (shared)
        mg_load(W, ra, rb, ks * CW, steps, t, f);
    /* moe_early_ids (a.topk_pub set): item 0 publishes the top-k it ranks */
    const bool pub = a.topk_pub && item == 0;
    const int step = pub ? __ldcg(a.step) : 0; /* written by an earlier forward call only */
    if (threadIdx.x < H / 32) /* the RMSNorm weight into L2 (gemv_input_prefetch) */
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a.norm_w + threadIdx.x * 32));
    pdl_trigger();
    pdl_wait();
    tl.waited();
    /* x = RMSNorm(h) · norm_w (gemv_prologue's arithmetic): this thread's MD_X_PER values of h and the
     * weight are loaded first, so they arrive while warp 0 ranks the top-k; the sum of squares' block
     * reduction and the top-k's hand-over share one barrier; the expert loads are issued right after it */
    constexpr int NT = MD_WARPS * 32;
    float hv[MD_X_PER], wv[MD_X_PER];
#pragma unroll
    for (int k = 0; k < MD_X_PER; k++) {
        const int c = threadIdx.x + k * NT;
        hv[k] = c < H ? a.h[c] : 0.0f;
        wv[k] = c < H ? a.norm_w[c] : 0.0f;
    }
    __shared__ int s_idx[MOE_MAX_K];
    __shared__ float s_w[MOE_MAX_K];
    __shared__ unsigned int s_key[MOE_MAX_E];
    if (!shared)
        moe_topk_warp0(a.router_logits, a.n_experts, a.top_k, s_idx, s_w, s_key);
    {
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < MD_X_PER; k++)
            ss = fmaf(hv[k], hv[k], ss);
        ss = warp_sum(ss);
        if (lane == 0)
            s_red[warp] = ss;
    }
    __syncthreads();
    if (!shared) {
        if (tile == 0 && slot == 0 && threadIdx.x < a.top_k) { /* for moe_down_mma */
            const int i = threadIdx.x;
            if (pub)
                moe_pub_write(a.topk_pub, moe_pub_tag(step, a.layer), i, s_idx[i], s_w[i]);
            a.topk_idx[i] = s_idx[i];
            a.topk_w[i] = s_w[i];
        }
        const int64_t e = s_idx[slot];
        mg_load(W, e * rows + ra, e * rows + rb, ks * CW, steps, t, f);
    }
    {
        float tot = 0.0f;
#pragma unroll
        for (int w = 0; w < MD_WARPS; w++)
            tot += s_red[w];
        const float r = rsqrtf(tot / (float)H + a.eps);
#pragma unroll
        for (int k = 0; k < MD_X_PER; k++) {
            const int c = threadIdx.x + k * NT;
            if (c < H)
                s_x[c] = hv[k] * (r * wv[k]);
        }
    }
    const float xk = mg_block_x_tail<MD_WARPS>(s_x, H, s_xh, s_off, s_xsum);
    tl.mark();
    float acc_a = 0.0f, acc_b = 0.0f;
    mg_dot(f, ks * CW, steps, s_xh, s_off, s_xsum, g, t, acc_a, acc_b);
    if (t == 0) {
        s_part[warp][g] = acc_a;
        s_part[warp][g + 8] = acc_b;
    }
    __syncthreads();
    const int hid_stride = max(a.inter, a.shared_inter);
    if (threadIdx.x < 16 && live) {
        const int r = threadIdx.x;
        const float gv = (s_part[0][r] + s_part[1][r] + s_part[2][r] + s_part[3][r]) / xk;
        const float uv = (s_part[4][r] + s_part[5][r] + s_part[6][r] + s_part[7][r]) / xk;
        a.hid[(int64_t)slot * hid_stride + r0 + r] = silu_f(gv) * uv;
    }
    if (STAGED && x_tile >= 0) { /* the extra shared-expert tile, from the staged copy */
        mg_stage_wait();
        mg_load_staged(s_stage, steps, threadIdx.x, MD_WARPS * 32, f);
        acc_a = acc_b = 0.0f;
        mg_dot(f, ks * CW, steps, s_xh, s_off, s_xsum, g, t, acc_a, acc_b);
        __syncthreads(); /* s_part of the first item has been read */
        if (t == 0) {
            s_part[warp][g] = acc_a;
            s_part[warp][g + 8] = acc_b;
        }
        __syncthreads();
        if (threadIdx.x < 16 && x_tile * 16 + (int)threadIdx.x < a.shared_inter) {
            const int r = threadIdx.x;
            const float gv = (s_part[0][r] + s_part[1][r] + s_part[2][r] + s_part[3][r]) / xk;
            const float uv = (s_part[4][r] + s_part[5][r] + s_part[6][r] + s_part[7][r]) / xk;
            a.hid[(int64_t)a.top_k * hid_stride + x_tile * 16 + r] = silu_f(gv) * uv;
        }
    }
}

/* EARLY: the ids and weights from the tagged words, polled before pdl_wait (moe_early_ids_on). */
template <bool EARLY>
__global__ void __maxnreg__(MD_DOWN_MAX_REGS) moe_down_mma_kernel(moe_args a)
{
    tl_block<> tl(a.timeline);
    extern __shared__ __align__(16) float md_smem[];
    const int I = a.inter, slots = a.top_k - a.cpu_slots + 1; /* warps: the routed slots here, then the shared */
    uint4 *s_xh = reinterpret_cast<uint4 *>(md_smem);             /* [slots][I / 8] */
    float *s_off = md_smem + slots * I / 2, *s_xsum = s_off + slots * (I / 64);
    __shared__ float s_part[MD_MAX_SLOTS][16];
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const bool shared = wi == slots - 1;
    const int slot = shared ? a.top_k : wi;
    const dmat &W = shared ? a.sdown : a.down;
    const int r0 = blockIdx.x * 16, steps = I / 128;
    const int ra = min(r0 + g, a.hidden - 1), rb = min(r0 + g + 8, a.hidden - 1);

    mg_frag f;
    if (shared)
        mg_load(W, ra, rb, 0, steps, t, f);
    pdl_trigger();
    float wk = 0.0f;
    if (EARLY) {
        /* the shared-expert warp (loads already issued) polls the 2K tagged words until all carry this
         * forward call's tag (lane 2k: id of slot k, lane 2k+1: its weight), hands them over in shared
         * memory; the routed warps then issue their expert loads, all before pdl_wait (see the top) */
        __shared__ int s_e[MD_MAX_SLOTS];
        __shared__ float s_w[MD_MAX_SLOTS];
        if (shared) {
            const int nw = 2 * a.top_k;
            /* the first poll is issued before the step counter's load, so the two round trips overlap */
            unsigned long long v = lane < nw ? ld_relaxed_u64(a.topk_pub + lane) : 0ull;
            const unsigned int want = moe_pub_tag(__ldcg(a.step), a.layer);
            unsigned int ns = 0, polls = 0;
            while (!__all_sync(0xffffffffu, lane >= nw || (unsigned int)(v >> 32) == want)) {
                ns = ns ? min(2 * ns, 128u) : 16u;
                __nanosleep(ns);
                if (++polls > (1u << 26)) /* seconds: a missing publisher is a bug, not a hang */
                    __trap();
                if (lane < nw)
                    v = ld_relaxed_u64(a.topk_pub + lane);
            }
            if (lane < nw) {
                if (lane & 1)
                    s_w[lane >> 1] = __uint_as_float((unsigned int)v);
                else
                    s_e[lane >> 1] = (int)(unsigned int)v;
            }
        }
        __syncthreads();
        if (!shared) {
            const int64_t e = s_e[slot];
            mg_load(W, e * a.hidden + ra, e * a.hidden + rb, 0, steps, t, f);
            wk = s_w[slot];
        }
        pdl_wait();
        tl.waited();
        if (shared)
            wk = sigmoid_f(__ldcg(a.router_logits + a.n_experts));
    } else {
        pdl_wait();
        tl.waited();
        if (!shared) {
            const int64_t e = __ldcg(a.topk_idx + slot);
            mg_load(W, e * a.hidden + ra, e * a.hidden + rb, 0, steps, t, f);
            wk = __ldcg(a.topk_w + slot);
        } else {
            wk = sigmoid_f(__ldcg(a.router_logits + a.n_experts));
        }
    }
    /* the residual values this block adds into, loaded now so the read overlaps the x fragments */
    const float out_prev = threadIdx.x < 16 && r0 + (int)threadIdx.x < a.hidden ? a.out[r0 + threadIdx.x] : 0.0f;
    /* this warp's x = hid[slot] (I values): scale, fragments, group sums — warp-local */
    const int hid_stride = max(a.inter, a.shared_inter);
    const float *hx = a.hid + (int64_t)slot * hid_stride;
    uint4 *xh = s_xh + wi * (I / 8);
    float *off = s_off + wi * (I / 64), *xsum = s_xsum + wi * (I / 64);
    float mx = 0.0f;
    for (int c = lane; c < I; c += 32)
        mx = fmaxf(mx, fabsf(__ldcg(hx + c)));
    const float xk = mg_x_scale(warp_max(mx));
    for (int i = lane; i < I / 8; i += 32) {
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; e++)
            v[e] = __ldcg(hx + i * 8 + e) * xk;
        xh[i] = make_uint4(h2_bits(__floats2half2_rn(v[0], v[4])), h2_bits(__floats2half2_rn(v[1] * 0.0625f, v[5] * 0.0625f)),
                           h2_bits(__floats2half2_rn(v[2], v[6])), h2_bits(__floats2half2_rn(v[3] * 0.0625f, v[7] * 0.0625f)));
    }
    __syncwarp();
    mg_group_sums(xh, I, off, xsum, lane, 32);
    __syncwarp();
    tl.mark();
    float acc_a = 0.0f, acc_b = 0.0f;
    mg_dot(f, 0, steps, xh, off, xsum, g, t, acc_a, acc_b);
    if (t == 0) {
        s_part[wi][g] = wk * acc_a / xk;
        s_part[wi][g + 8] = wk * acc_b / xk;
    }
    __syncthreads();
    if (threadIdx.x < 16 && r0 + (int)threadIdx.x < a.hidden) {
        float acc = 0.0f;
        for (int k = 0; k < slots; k++)
            acc += s_part[k][threadIdx.x];
        a.out[r0 + threadIdx.x] = out_prev + acc;
    }
}

bool moe_decode_mma_supported(const moe_args &a, int n_tokens)
{
    const bool inter_ok = a.inter == a.shared_inter && (a.inter == 128 || a.inter == 256 || a.inter == 512);
    if (a.exact) /* exact mode: moe_route.cu's fp32 kernels */
        return false;
    return n_tokens == 1 && a.n_experts <= MOE_MAX_E && a.top_k <= MOE_MAX_K && a.gate.bits == 4 && a.sgate.bits == 4 &&
           a.down.bits == 4 && a.sdown.bits == 4 && a.hidden % 512 == 0 && a.hidden <= MD_X_PER * 32 * MD_WARPS && inter_ok &&
           a.top_k + 1 <= MD_MAX_SLOTS;
}

template <bool STAGED>
static cudaError_t gate_up_go(const moe_args &a, cudaStream_t s)
{
    const int H = a.hidden, tiles = (max(a.inter, a.shared_inter) + 15) / 16, items = (a.top_k - a.cpu_slots + 1) * tiles;
    size_t smem = ((size_t)H + H / 2 + 2 * (H / 64)) * sizeof(float);
    if (STAGED)
        smem += (size_t)MG_STAGE_BYTES * MD_WARPS * 32;
    static size_t smem_set = 48 * 1024;
    cudaError_t e = cuda_smem_opt_in(moe_gate_up_mma_kernel<STAGED>, smem, &smem_set);
    if (e != cudaSuccess)
        return e;
    if (!STAGED)
        return launch_pdl(moe_gate_up_mma_kernel<STAGED>, dim3(tiles, a.top_k - a.cpu_slots + 1), dim3(MD_WARPS * 32), smem,
                          s, a, tiles);
    static int resident = 0; /* blocks that fit on the GPU at once (asked once) */
    e = cuda_resident_blocks(moe_gate_up_mma_kernel<STAGED>, MD_WARPS * 32, smem, &resident);
    if (e != cudaSuccess)
        return e;
    /* one wave when the items past the resident blocks are all shared-expert tiles, else the plain grid */
    if (items - resident > tiles)
        return gate_up_go<false>(a, s);
    const int grid = items < resident ? items : resident;
    return launch_pdl(moe_gate_up_mma_kernel<STAGED>, dim3(grid), dim3(MD_WARPS * 32), smem, s, a, tiles);
}

cudaError_t launch_moe_gate_up_mma(const moe_args &a0, cudaStream_t s)
{
    moe_args a = a0;
    if (!moe_early_ids_on(a))
        a.topk_pub = NULL; /* nothing polls: publish nothing */
    return gate_up_go<true>(a, s);
}

cudaError_t launch_moe_down_mma(const moe_args &a, cudaStream_t s)
{
    const int slots = a.top_k - a.cpu_slots + 1, I = a.inter;
    const size_t smem = ((size_t)slots * (I / 2) + 2 * (size_t)slots * (I / 64)) * sizeof(float);
    if (moe_early_ids_on(a))
        return launch_pdl(moe_down_mma_kernel<true>, dim3((a.hidden + 15) / 16), dim3(slots * 32), smem, s, a);
    return launch_pdl(moe_down_mma_kernel<false>, dim3((a.hidden + 15) / 16), dim3(slots * 32), smem, s, a);
}
