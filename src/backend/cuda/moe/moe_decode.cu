/* moe_decode.cu — the sparse MoE block of one decode token (n_tokens == 1) for 4-bit experts, on tensor
 * cores (the 16-row tile of mma_gemv.cuh), after the router GEMV, or with the router computed by gate/up
 * itself (moe_router_fused: the ROUTER kernel below; its logits exchanged as tagged words within the grid):
 *
 *   moe_gate_up_mma: block = one (16-row tile, slot) item, 8 warps = {gate, up} × 4 column slices of
 *     hidden (by default one wave of resident blocks, the shared-expert items past it staged: STAGED
 *     below); the top-k is ranked by each routed block (moe_topk.cuh; the block of item 0 publishes it
 *     for moe_down_mma);
 *     hid[slot][r] = silu(x·Wg[e]ᵀ) ⊙ (x·Wu[e]ᵀ), x = RMSNorm(h) · post_norm; slot top_k = the shared
 *     expert, whose rows are loaded before pdl_wait(); a routed slot reads its expert id right after the
 *     wait and issues its loads before normalising x: gate's rows into registers, up's (STAGED, sm_90) as
 *     18 bulk copies into a staged tile in shared memory (bulk_copy.cuh) issued by one warp, which halves
 *     the register loads that stall at issue (both matrices staged: 39 KB more shared memory per block,
 *     which keeps gate/up's blocks off their SMs longer: slower; docs/BENCHMARKS.md).
 *   moe_down_mma: block = 16 output rows, one warp per slot (top_k + 1 warps), each building its own
 *     slot's x fragments from hid[slot]; out[r] += Σ_k w_k·(Wd[e_k] hid_k)[r] + sigmoid(g_s)·(Wd_s hid_s)[r].
 * Both call pdl_trigger() first: they read nothing before pdl_wait() that a dependent could write.
 *
 * Early ids (with PDL): the gate/up block of item 0, which ranks the top-k,
 * also writes it as
 * tagged words (moe_args.topk_pub, moe_topk.cuh: hi = tag, lo = expert id / weight bits; tag =
 * step_tag(step, layer), unique per forward call and layer of the session), and the consumers poll them
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
#include "backend/cuda/bulk_copy.cuh"

/* sm_90 code: a routed gate/up block's rows of `up` come by bulk copies into a staged tile (below) */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MD_UP_BULK 1
#else
#define MD_UP_BULK 0
#endif

#define MD_WARPS 8
#define MD_MAX_SLOTS 16
#define MD_X_PER 8 /* values of h per thread in moe_gate_up_mma: hidden <= MD_X_PER * 32 * MD_WARPS */
/* moe_down_mma_kernel's register cap: 9 warps x 112 registers + a streamed GEMV block (8 warps x 128)
 * fit one SM's 64K registers, so the next layer's input projection can launch (PDL) and prefetch its
 * weights while this kernel runs */
#define MD_DOWN_MAX_REGS 112
/* chunks of 8 hid values per lane in moe_down_mma (inter <= 8 * 32 * this) */
#define MD_HID_CHUNKS 2
static_assert(8 * 32 * MD_HID_CHUNKS >= 512, "moe_decode_mma_supported's widest inter fits the hid chunks");
/* router rows per moe_gate_up_mma block when the router is fused into it (E + 1 <= this x the grid) */
#define MD_ROUTER_ROWS 2

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
 * pdl_wait(), so there is no second wave whose loads would start only after the top-k.
 * ROUTER (STAGED only; moe_router_fused): block b < n_rb also computes router rows b and b + n_rb (8-bit,
 * their bytes loaded before pdl_wait) from the same RMSNorm as the experts and publishes them as tagged
 * words (moe_topk.cuh); the routed blocks' warp 0 polls all E of them and ranks the top-k. */
template <bool STAGED, bool ROUTER>
__global__ void __launch_bounds__(MD_WARPS * 32, 2) moe_gate_up_mma_kernel(moe_args a, int tiles)
{
    static_assert(STAGED || !ROUTER, "the fused router needs one wave of co-resident blocks");
    tl_block<> tl(a.timeline);
    extern __shared__ __align__(16) float md_smem[];
    const int H = a.hidden;
    float *s_x = md_smem;                                   /* [H] */
    uint4 *s_xh = reinterpret_cast<uint4 *>(md_smem + H);   /* [H / 8] */
    float *s_off = md_smem + H + H / 2, *s_xsum = s_off + H / 64;
    unsigned char *s_stage = reinterpret_cast<unsigned char *>(s_xsum + H / 64); /* STAGED: [MG_STAGE_BYTES][threads] */
#if MD_UP_BULK
    unsigned char *s_up = s_stage + (STAGED ? MG_STAGE_BYTES * MD_WARPS * 32 : 0); /* STAGED: up's tile [bulk_tile_bytes(H)] */
    __shared__ __align__(8) uint64_t s_up_full;
#endif
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
    /* STAGED routed items on sm_90: up's 16 rows by bulk copies into s_up, issued by warp 4 at once after
     * the top-k (gate's rows into registers as before); the up warps build their fragments from s_up */
    const bool up_bulk = MD_UP_BULK && STAGED && !shared;
#if MD_UP_BULK
    if (up_bulk && threadIdx.x == 0) {
        bulk_mbar_init(&s_up_full, 1);
        bulk_mbar_init_fence();
    }
#endif
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
    /* moe_early_ids (a.topk_pub set): item 0 publishes the top-k it ranks; ROUTER: every block tags its logits */
    const bool pub = a.topk_pub && item == 0;
    const int step = pub || ROUTER ? __ldcg(a.step) : 0; /* written by an earlier forward call only */
    /* ROUTER: thread t holds columns [8t, 8t + 8) (one group of 64) of h, the norm weight and its router rows */
    const int cx = threadIdx.x * 8;
    const bool xin = ROUTER && cx < H;
    /* ROUTER: rows j = b + q * n_rb of the first n_rb blocks, which launch first (the highest block indices
     * become resident last, as the previous kernel's blocks leave, and would publish last) */
    const int n_rb = (a.n_experts + MD_ROUTER_ROWS) / MD_ROUTER_ROWS; /* E + 1 rows */
    uint2 rq[MD_ROUTER_ROWS];
    float rs[MD_ROUTER_ROWS], rbias[MD_ROUTER_ROWS];
    float4 nw0, nw1;
    if (ROUTER) {
        const int nr = a.router.rows;
#pragma unroll
        for (int q = 0; q < MD_ROUTER_ROWS; q++) {
            const int j = blockIdx.x + q * n_rb;
            rq[q] = make_uint2(0u, 0u);
            rs[q] = rbias[q] = 0.0f;
            if (xin && (int)blockIdx.x < n_rb && j <= a.n_experts) {
                const dmat &R = j < nr ? a.router : a.router_shared;
                const int64_t row = j < nr ? j : j - nr;
                rq[q] = __ldg(reinterpret_cast<const uint2 *>(R.data + row * R.row_bytes + cx));
                rs[q] = bf2f(R.scales[row * (R.cols / 64) + cx / 64]);
                rbias[q] = bf2f(R.biases[row * (R.cols / 64) + cx / 64]);
            }
        }
        nw0 = nw1 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (xin) {
            nw0 = __ldg(reinterpret_cast<const float4 *>(a.norm_w + cx));
            nw1 = __ldg(reinterpret_cast<const float4 *>(a.norm_w + cx + 4));
        }
    } else if (threadIdx.x < H / 32) { /* the RMSNorm weight into L2 (gemv_input_prefetch) */
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a.norm_w + threadIdx.x * 32));
    }
    pdl_trigger();
    pdl_wait();
    tl.waited();
    __shared__ int s_idx[MOE_MAX_K];
    __shared__ float s_w[MOE_MAX_K];
    __shared__ unsigned int s_key[MOE_MAX_E];
    /* a routed item once the top-k is in s_idx / s_w: item 0 hands it to moe_down_mma (tagged words when
     * pub), then this item's expert rows are loaded */
    auto routed_start = [&]() {
        if (tile == 0 && slot == 0 && threadIdx.x < a.top_k) {
            const int i = threadIdx.x;
            if (pub)
                moe_pub_write(a.topk_pub, step_tag(step, a.layer), i, s_idx[i], s_w[i]);
            a.topk_idx[i] = s_idx[i];
            a.topk_w[i] = s_w[i];
        }
        const int64_t e = s_idx[slot];
        if (!up_bulk || mat == 0)
            mg_load(W, e * rows + ra, e * rows + rb, ks * CW, steps, t, f);
#if MD_UP_BULK
        if (up_bulk && warp == 4) { /* lane r < 16: row r; lanes 16, 17: the scales, the biases */
            const int gpr = H / 64, nrows = min(16, rows - r0), ws = H / 2 + BULK_ROW_PAD;
            const int64_t r = e * rows + r0;
            if (lane == 0)
                bulk_mbar_expect_tx(&s_up_full, (unsigned int)(nrows * (H / 2 + 4 * gpr)));
            __syncwarp();
            if (lane < nrows)
                bulk_copy(s_up + lane * ws, a.up.data + (r + lane) * a.up.row_bytes, H / 2, &s_up_full);
            else if (lane == 16 || lane == 17)
                bulk_copy(s_up + 16 * ws + (lane - 16) * 16 * gpr * 2, (lane == 16 ? a.up.scales : a.up.biases) + r * gpr,
                          nrows * gpr * 2, &s_up_full);
        }
#endif
    };
    float xk;
    if constexpr (ROUTER) {
        /* x = RMSNorm(h) · norm_w as gemv_prologue (x_c = h_c · (r · w_c)); the router rows as
         * logit_j = r · Σ_c w_jc · (h_c · w_c) with w_jc = s·q + b folded per 8 columns (s·Σ q·y + b·Σ y), so
         * their block sums share the sum of squares' barrier. Then the fp16 fragments (thread t: item t,
         * its own 8 columns) and the group sums (warps 1..7) while warp 0 polls and ranks the top-k. */
        float4 h0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), h1 = h0;
        if (xin) {
            h0 = *reinterpret_cast<const float4 *>(a.h + cx);
            h1 = *reinterpret_cast<const float4 *>(a.h + cx + 4);
        }
        const float hv[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        const float wv[8] = {nw0.x, nw0.y, nw0.z, nw0.w, nw1.x, nw1.y, nw1.z, nw1.w};
        __shared__ float s_rp[MD_ROUTER_ROWS][MD_WARPS];
        float ss = 0.0f, ys = 0.0f, yv[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            ss = fmaf(hv[e], hv[e], ss);
            yv[e] = hv[e] * wv[e];
            ys += yv[e];
        }
        ss = warp_sum(ss);
        if (lane == 0)
            s_red[warp] = ss;
#pragma unroll
        for (int q = 0; q < MD_ROUTER_ROWS; q++) {
            if ((int)blockIdx.x >= n_rb || (int)blockIdx.x + q * n_rb > a.n_experts) /* block-uniform: no row q here */
                break;
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const unsigned int byte = ((e < 4 ? rq[q].x : rq[q].y) >> (8 * (e & 3))) & 0xffu;
                d = fmaf(__uint_as_float(0x4B000000u | byte) - 8388608.0f, yv[e], d);
            }
            const float p = warp_sum(fmaf(rs[q], d, rbias[q] * ys));
            if (lane == 0)
                s_rp[q][warp] = p;
        }
        __syncthreads();
        float tot = 0.0f;
#pragma unroll
        for (int w = 0; w < MD_WARPS; w++)
            tot += s_red[w];
        const float r = rsqrtf(tot / (float)H + a.eps);
        const unsigned int tag = step_tag(step, a.layer);
        if (threadIdx.x < MD_ROUTER_ROWS) {
            const int q = threadIdx.x, j = blockIdx.x + q * n_rb;
            if ((int)blockIdx.x < n_rb && j <= a.n_experts) {
                float p = 0.0f;
#pragma unroll
                for (int w = 0; w < MD_WARPS; w++)
                    p += s_rp[q][w];
                const float logit = r * p;
                moe_logit_write(a.logit_pub, tag, j, logit);
                a.router_logits[j] = logit; /* moe_down's shared gate (after its wait) */
            }
        }
        float xv[8], mx = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            xv[e] = hv[e] * (r * wv[e]);
            mx = fmaxf(mx, fabsf(xv[e]));
        }
        /* mg_block_x_tail's steps, from registers */
        __shared__ float s_mx[MD_WARPS];
        mx = warp_max(mx);
        if (lane == 0)
            s_mx[warp] = mx;
        __syncthreads();
        float M = 0.0f;
#pragma unroll
        for (int w = 0; w < MD_WARPS; w++)
            M = fmaxf(M, s_mx[w]);
        xk = mg_x_scale(M);
        if (xin) {
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; e++)
                v[e] = xv[e] * xk;
            s_xh[threadIdx.x] = make_uint4(h2_bits(__floats2half2_rn(v[0], v[4])), h2_bits(__floats2half2_rn(v[1] * 0.0625f, v[5] * 0.0625f)),
                                           h2_bits(__floats2half2_rn(v[2], v[6])), h2_bits(__floats2half2_rn(v[3] * 0.0625f, v[7] * 0.0625f)));
        }
        __syncthreads();
        if (warp == 0) {
            if (!shared)
                moe_topk_poll_warp0(a.logit_pub, tag, a.n_experts, a.top_k, s_idx, s_w, s_key);
        } else {
            mg_group_sums(s_xh, H, s_off, s_xsum, threadIdx.x - 32, (MD_WARPS - 1) * 32);
        }
        __syncthreads();
        if (!shared)
            routed_start();
    } else {
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
        if (!shared)
            routed_start();
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
        xk = mg_block_x_tail<MD_WARPS>(s_x, H, s_xh, s_off, s_xsum);
    }
#if MD_UP_BULK
    if (up_bulk && mat == 1) {
        bulk_mbar_wait(&s_up_full, 0);
        const int ws = H / 2 + BULK_ROW_PAD;
        const __nv_bfloat16 *sc = reinterpret_cast<const __nv_bfloat16 *>(s_up + 16 * ws);
        mg_load_smem(s_up, ws, sc, sc + 16 * (H / 64), H / 64, ks * CW, steps, g, t, f);
    }
#endif
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
            const unsigned int want = step_tag(__ldcg(a.step), a.layer);
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
    /* one batch of loads: lane holds chunks i = lane + 32q of 8 values (I <= 512: at most MD_HID_CHUNKS), the
     * max |x| and the fp16 fragments both from registers (one L2 round trip, not one each) */
    float hv[MD_HID_CHUNKS][8], mx = 0.0f;
#pragma unroll
    for (int q = 0; q < MD_HID_CHUNKS; q++) {
        const int i = lane + 32 * q;
        float4 p0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), p1 = p0;
        if (i < I / 8) {
            p0 = __ldcg(reinterpret_cast<const float4 *>(hx + i * 8));
            p1 = __ldcg(reinterpret_cast<const float4 *>(hx + i * 8 + 4));
        }
        hv[q][0] = p0.x, hv[q][1] = p0.y, hv[q][2] = p0.z, hv[q][3] = p0.w;
        hv[q][4] = p1.x, hv[q][5] = p1.y, hv[q][6] = p1.z, hv[q][7] = p1.w;
    }
#pragma unroll
    for (int q = 0; q < MD_HID_CHUNKS; q++)
#pragma unroll
        for (int e = 0; e < 8; e++)
            mx = fmaxf(mx, fabsf(hv[q][e]));
    const float xk = mg_x_scale(warp_max(mx));
#pragma unroll
    for (int q = 0; q < MD_HID_CHUNKS; q++) {
        const int i = lane + 32 * q;
        if (i < I / 8) {
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; e++)
                v[e] = hv[q][e] * xk;
            xh[i] = make_uint4(h2_bits(__floats2half2_rn(v[0], v[4])), h2_bits(__floats2half2_rn(v[1] * 0.0625f, v[5] * 0.0625f)),
                               h2_bits(__floats2half2_rn(v[2], v[6])), h2_bits(__floats2half2_rn(v[3] * 0.0625f, v[7] * 0.0625f)));
        }
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

/* Dynamic shared memory of moe_gate_up_mma_kernel (STAGED: + the shared-expert tail's staging area). */
static size_t gate_up_smem(const moe_args &a, bool staged)
{
    const int H = a.hidden;
    size_t smem = ((size_t)H + H / 2 + 2 * (H / 64)) * sizeof(float);
    if (staged)
        smem += (size_t)MG_STAGE_BYTES * MD_WARPS * 32;
    if (staged && cuda_sm90_code()) /* up's staged tile (MD_UP_BULK) */
        smem += (size_t)bulk_tile_bytes(H);
    return smem;
}

/* The STAGED launch's grid (the blocks resident at once, at most the items), or 0 when more than the
 * shared-expert tiles lie past one wave (then the plain 2D grid runs). ROUTER: that instance's occupancy. */
template <bool ROUTER>
static cudaError_t gate_up_staged_grid(const moe_args &a, int *grid)
{
    const int tiles = (max(a.inter, a.shared_inter) + 15) / 16, items = (a.top_k - a.cpu_slots + 1) * tiles;
    const size_t smem = gate_up_smem(a, true);
    static size_t smem_set = 48 * 1024;
    cudaError_t e = cuda_smem_opt_in(moe_gate_up_mma_kernel<true, ROUTER>, smem, &smem_set);
    if (e != cudaSuccess)
        return e;
    static int resident = 0; /* blocks that fit on the GPU at once (asked once) */
    e = cuda_resident_blocks(moe_gate_up_mma_kernel<true, ROUTER>, MD_WARPS * 32, smem, &resident);
    if (e != cudaSuccess)
        return e;
    *grid = items - resident > tiles ? 0 : items < resident ? items : resident;
    return cudaSuccess;
}

/* Router rows as moe_router_fused takes them: 8-bit, hidden columns, E + 1 in all. */
static bool router_rows_ok(const moe_args &a)
{
    const dmat &R = a.router, &S = a.router_shared;
    if (!R.data || R.bits != 8 || R.cols != a.hidden || R.n_experts != 1)
        return false;
    const int ns = S.data ? S.rows : 0;
    if (ns && (S.bits != 8 || S.cols != a.hidden || S.n_experts != 1))
        return false;
    return R.rows + ns == a.n_experts + 1 && a.n_experts + 1 <= MOE_LOGIT_WORDS;
}

bool moe_router_fused(const moe_args &a, int n_tokens)
{
    if (!a.logit_pub || !moe_decode_mma_supported(a, n_tokens) || !moe_early_ids_on(a) || !router_rows_ok(a))
        return false;
    int grid = 0;
    if (gate_up_staged_grid<true>(a, &grid) != cudaSuccess)
        return false;
    return grid > 0 && a.n_experts + 1 <= MD_ROUTER_ROWS * grid;
}

cudaError_t launch_moe_gate_up_mma(const moe_args &a0, cudaStream_t s)
{
    moe_args a = a0;
    if (!moe_early_ids_on(a))
        a.topk_pub = NULL; /* nothing polls: publish nothing */
    const int tiles = (max(a.inter, a.shared_inter) + 15) / 16;
    if (a.logit_pub) { /* the caller launched no router: moe_router_fused said yes */
        int grid = 0;
        cudaError_t e = gate_up_staged_grid<true>(a, &grid);
        if (e != cudaSuccess)
            return e;
        if (!moe_router_fused(a, 1))
            return cudaErrorInvalidValue;
        return launch_pdl(moe_gate_up_mma_kernel<true, true>, dim3(grid), dim3(MD_WARPS * 32), gate_up_smem(a, true), s,
                          a, tiles);
    }
    int grid = 0;
    cudaError_t e = gate_up_staged_grid<false>(a, &grid);
    if (e != cudaSuccess)
        return e;
    if (grid > 0)
        return launch_pdl(moe_gate_up_mma_kernel<true, false>, dim3(grid), dim3(MD_WARPS * 32), gate_up_smem(a, true), s,
                          a, tiles);
    static size_t smem_set = 48 * 1024;
    const size_t smem = gate_up_smem(a, false);
    e = cuda_smem_opt_in(moe_gate_up_mma_kernel<false, false>, smem, &smem_set);
    if (e != cudaSuccess)
        return e;
    return launch_pdl(moe_gate_up_mma_kernel<false, false>, dim3(tiles, a.top_k - a.cpu_slots + 1), dim3(MD_WARPS * 32),
                      smem, s, a, tiles);
}

cudaError_t launch_moe_down_mma(const moe_args &a, cudaStream_t s)
{
    const int slots = a.top_k - a.cpu_slots + 1, I = a.inter;
    const size_t smem = ((size_t)slots * (I / 2) + 2 * (size_t)slots * (I / 64)) * sizeof(float);
    if (moe_early_ids_on(a))
        return launch_pdl(moe_down_mma_kernel<true>, dim3((a.hidden + 15) / 16), dim3(slots * 32), smem, s, a);
    return launch_pdl(moe_down_mma_kernel<false>, dim3((a.hidden + 15) / 16), dim3(slots * 32), smem, s, a);
}
