/* bench_cuda_persistent.cu — probe for issue 21: does a persistent kernel shorten a chain of dependent
 * decode GEMVs, with the same tile math, against one kernel per stage in a CUDA graph?
 *
 * The chain stands for the decode step's dependency structure (per layer, Qwen3.6-35B-A3B shapes, hidden
 * 2048, 4-bit weights as MLX stores them, random values):
 *   A  in_proj:   y_a = W_a · RMSNorm(h)           W_a 12352 x 2048 (qkv | z | b | a rows)
 *   E  element-wise: e = silu(y_a[0 .. 4096))       no weights: stands for the DeltaNet scan
 *   B  out_proj:  h += W_b · e                      W_b 2048 x 4096
 *   C  gate/up:   y_c = W_c · RMSNorm(h)           W_c 9216 x 2048 (the bytes of 8 routed experts' and
 *                                                   the shared expert's gate and up rows)
 *   D  down:      h += W_d · y_c[0 .. 4096)         W_d 2048 x 4096 (about the 9 experts' down bytes)
 * times L layers (default 40: 200 dependent stages, 1.37 GB of weights per token).
 *
 * Two ways on the same buffers:
 *   graph       one gemv_stream_kernel per GEMV stage (launch_gemv with GEMV_KERNEL_STREAM: lily's decode
 *               kernel for these shapes) and one small kernel per E stage, programmatic dependent launch,
 *               captured once as a CUDA graph and replayed: what lily's decode does today.
 *   persistent  one kernel, one block per SM (all co-resident), walks the stage table. A block is NT teams
 *               of 8 compute warps (a team works one ring item at a time; NT = 2 spills at the 96 registers
 *               544 threads leave) and one producer warp. Each block's tiles of every stage ("items": a
 *               group of 8 / KS 16-row tiles, as gemv_stream's) pass in order through one shared-memory ring
 *               of bulk copies (5 slots of 38 KB) that the producer keeps full across stage boundaries: the
 *               next stages' weights stream in while a stage waits for its input. Slot k: mbarrier full[k]
 *               (the copies landed), empty[k] (the 8 warps have its fragments in registers). Order between
 *               stages: a done counter per stage; each block adds 1 after its share (fence + atomicAdd:
 *               release); a stage's thread 0 polls its predecessor's counter for grid x launch number
 *               (ld.acquire) and the compute warps meet at a barrier. Activations are read through L2 only
 *               (ld.global.cg: L1 is not coherent within a kernel). The tile math (x fragments per warp
 *               slice, mma.sync on the OR'd nibbles, the per-tile column-partial sums) is gemv_stream's, so
 *               the final h must be bit-identical to the graph's.
 * Reports ms per token for both (CUDA events, mean over -r replays), whether h is bit-identical, and the
 * persistent kernel's time per stage kind from in-kernel %globaltimer stamps (the last block's done; block
 * 0's wait release, x side, items and ring waits) against the stage's byte time at the measured copy rate,
 * also for compile-time variants that leave parts of an item out (SKIP_*: timing only, results wrong).
 * Measurements: docs/BENCHMARKS.md, "A persistent kernel for a chain of decode GEMVs".
 *
 * usage: bench_cuda_persistent [-L LAYERS (40)] [-r REPS (50)]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_internal.cuh"
#include "bench_cuda_common.cuh"
#include "backend/cuda/gemv/mma_gemv.cuh"
#include "backend/cuda/bulk_copy.cuh"

#define PW 8          /* compute warps per block; one more warp issues the ring's copies */
#define P_MAX_SLOTS 8 /* ring slots per block */

enum { STAGE_GEMV = 0, STAGE_SILU = 1 };
/* persistent_chain_kernel's SKIP: parts of every item left out, to time them by difference (results wrong) */
enum { SKIP_DOT = 1, SKIP_LOAD = 2, SKIP_STORE = 4, SKIP_SYNC = 8 };

struct pstage {
    dmat W;               /* STAGE_GEMV: rows x cols, 4-bit */
    const float *x;       /* input: cols (GEMV) or n (SILU) floats */
    float *y;             /* output */
    const float *norm_w;  /* GEMV_IN_RMSNORM: cols */
    int kind, in_mode, out_mode;
    int n;                /* SILU: elements */
    int ks, rt, n_tiles, n_groups; /* GEMV: warps per tile (cols / 512), tiles per group (8 / ks) */
};

struct pargs {
    const pstage *st;
    int n_stages;
    unsigned int *done;          /* [n_stages], grows by gridDim.x per launch */
    unsigned int target;         /* gridDim.x x launch number */
    unsigned long long *stamp;   /* [n_stages + 1]: launch start, then each stage's last done */
    unsigned long long *bst;     /* [n_stages][4], block 0: wait passed, x side done, items done, ns in ring waits */
    int slots, slot_bytes;
    int ahead;                   /* 1: the producer fills across stage boundaries; 0: a stage's copies only after its wait */
    int big_copies;              /* 1 (timing only, with SKIP_LOAD): one bulk copy per tile's rows, unpadded */
    float eps;
};

/* A block has NT teams of PW compute warps (a team works one ring item at a time) and one producer warp.
 * Barrier 1 + team among a team's warps, barrier 3 among all compute warps (never the producer). */
__device__ __forceinline__ void team_sync(int team) { asm volatile("bar.sync %0, %1;\n" ::"r"(1 + team), "r"(PW * 32) : "memory"); }
template <int NT> __device__ __forceinline__ void compute_sync(void) { asm volatile("bar.sync 3, %0;\n" ::"r"(NT * PW * 32) : "memory"); }
__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bulk_saddr(bar)) : "memory");
}

__device__ __forceinline__ unsigned int ld_acquire(const unsigned int *p)
{
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long gtimer(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* mg_warp_x (mma_gemv.cuh) for PLAIN and RMSNORM with the activation loads through L2 (ld.global.cg):
 * same values, same order. */
template <int IN_MODE, int KS>
__device__ __forceinline__ float p_warp_x(const float *act, const float *norm_w, float eps, int cols, float *x_area,
                                          const uint4 *&xh, const float *&off, const float *&xsum, int team)
{
    __shared__ float s_ss_all[2][KS];
    float *s_ss = s_ss_all[team];
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) % PW, ks = warp % KS, rt = warp / KS;
    const int CW = cols / KS, nit = CW / 8, base = ks * nit, ngr = CW / 64;
    uint4 *wxh = reinterpret_cast<uint4 *>(x_area) + warp * nit;
    float *wsum = x_area + PW * (CW / 2) + warp * 2 * ngr;
    float v[MG_X_ITEMS][8], w[MG_X_ITEMS][8];
#pragma unroll
    for (int k = 0; k < MG_X_ITEMS; k++) {
        const int j = lane + 32 * k, i = base + j;
        const bool ok = j < nit;
        const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
        const float4 *pa = reinterpret_cast<const float4 *>(act + 8 * i);
        float4 a0 = ok ? __ldcg(pa) : zero, a1 = ok ? __ldcg(pa + 1) : zero;
        v[k][0] = a0.x, v[k][1] = a0.y, v[k][2] = a0.z, v[k][3] = a0.w;
        v[k][4] = a1.x, v[k][5] = a1.y, v[k][6] = a1.z, v[k][7] = a1.w;
        if (IN_MODE == GEMV_IN_RMSNORM) {
            const float4 *pw = reinterpret_cast<const float4 *>(norm_w + 8 * i);
            a0 = ok ? __ldg(pw) : zero, a1 = ok ? __ldg(pw + 1) : zero;
            w[k][0] = a0.x, w[k][1] = a0.y, w[k][2] = a0.z, w[k][3] = a0.w;
            w[k][4] = a1.x, w[k][5] = a1.y, w[k][6] = a1.z, w[k][7] = a1.w;
        }
    }
    if (IN_MODE == GEMV_IN_RMSNORM) {
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < MG_X_ITEMS; k++)
#pragma unroll
            for (int e = 0; e < 8; e++)
                ss = fmaf(v[k][e], v[k][e], ss);
        if (rt == 0) {
            ss = warp_sum(ss);
            if (lane == 0)
                s_ss[ks] = ss;
        }
        team_sync(team);
        float tot = 0.0f;
#pragma unroll
        for (int q = 0; q < KS; q++)
            tot += s_ss[q];
        const float r = rsqrtf(tot / (float)cols + eps);
#pragma unroll
        for (int k = 0; k < MG_X_ITEMS; k++)
#pragma unroll
            for (int e = 0; e < 8; e++)
                v[k][e] = v[k][e] * (r * w[k][e]);
    }
    float mx = 0.0f;
#pragma unroll
    for (int k = 0; k < MG_X_ITEMS; k++)
#pragma unroll
        for (int e = 0; e < 8; e++)
            mx = fmaxf(mx, fabsf(v[k][e]));
    const float xk = mg_x_scale(warp_max(mx));
#pragma unroll
    for (int k = 0; k < MG_X_ITEMS; k++) {
        const int j = lane + 32 * k;
        float h[8];
#pragma unroll
        for (int e = 0; e < 8; e++)
            h[e] = v[k][e] * xk;
        const uint4 u = make_uint4(h2_bits(__floats2half2_rn(h[0], h[4])),
                                   h2_bits(__floats2half2_rn(h[1] * 0.0625f, h[5] * 0.0625f)),
                                   h2_bits(__floats2half2_rn(h[2], h[6])),
                                   h2_bits(__floats2half2_rn(h[3] * 0.0625f, h[7] * 0.0625f)));
        const float2 a0 = __half22float2(bits_h2(u.x)), a1 = __half22float2(bits_h2(u.y));
        const float2 b0 = __half22float2(bits_h2(u.z)), b1 = __half22float2(bits_h2(u.w));
        const float even = a0.x + a0.y + b0.x + b0.y, odd = a1.x + a1.y + b1.x + b1.y;
        float s1 = even + odd, sx = even + 16.0f * odd;
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) {
            s1 += __shfl_xor_sync(0xffffffffu, s1, o);
            sx += __shfl_xor_sync(0xffffffffu, sx, o);
        }
        if (j < nit) {
            wxh[j] = u;
            if ((j & 7) == 0) {
                wsum[j / 8] = 1024.0f * s1;
                wsum[ngr + j / 8] = sx;
            }
        }
    }
    __syncwarp();
    xh = wxh - base;
    off = wsum - base / 8;
    xsum = wsum + ngr - base / 8;
    return xk;
}

/* The ring: item q of this block's sequence (stage by stage, its groups blockIdx.x + i x grid of each
 * GEMV stage) sits in slot q % slots. full[k] completes a phase when the item's copies have landed (the
 * producer warp's expect_tx + the copies), empty[k] when the PW compute warps have read it into registers. */
struct p_cursor {
    int s, i; /* the item: stage, the block's i-th group of that stage */
};

__device__ __forceinline__ void p_advance(const pargs &a, p_cursor &c)
{
    c.i++;
    while (c.s < a.n_stages && (a.st[c.s].kind != STAGE_GEMV || (int)blockIdx.x + c.i * (int)gridDim.x >= a.st[c.s].n_groups)) {
        c.s++;
        c.i = 0;
    }
}

/* The producer warp: copy item c into slot k (one bulk copy per row and per tile's scales / biases). */
__device__ __forceinline__ void p_fill(const pargs &a, const p_cursor &c, unsigned char *ring, uint64_t *full, int k)
{
    const pstage &S = a.st[c.s];
    const int lane = threadIdx.x & 31, grp = blockIdx.x + c.i * gridDim.x, cols = S.W.cols, gpr = cols / 64;
    const int row_bytes = cols / 2, ws = row_bytes + BULK_ROW_PAD, tb = bulk_tile_bytes(cols);
    unsigned int bytes = 0;
    for (int rt = 0; rt < S.rt; rt++) {
        const int tile = grp * S.rt + rt;
        if (tile < S.n_tiles)
            bytes += (unsigned int)(min(16, S.W.rows - tile * 16) * (row_bytes + 4 * gpr));
    }
    if (lane == 0)
        bulk_mbar_expect_tx(&full[k], bytes);
    __syncwarp();
    unsigned char *slot = ring + (size_t)k * a.slot_bytes;
    /* per tile: a copy per row, then the scales and the biases (big_copies: the rows, contiguous in global memory,
     * in one copy, unpadded: timing only, their fragments are not read) */
    const int per_tile = a.big_copies ? 3 : 18, n_row_copies = a.big_copies ? 1 : 16;
    for (int q = lane; q < S.rt * per_tile; q += 32) {
        const int rt = q / per_tile, j = q % per_tile, tile = grp * S.rt + rt;
        if (tile >= S.n_tiles)
            continue;
        const int r0 = tile * 16, nrows = min(16, S.W.rows - r0);
        unsigned char *t = slot + (size_t)rt * tb;
        if (a.big_copies && j == 0)
            bulk_copy(t, S.W.data + (int64_t)r0 * S.W.row_bytes, nrows * row_bytes, &full[k]);
        else if (j < n_row_copies && j < nrows)
            bulk_copy(t + j * ws, S.W.data + (int64_t)(r0 + j) * S.W.row_bytes, row_bytes, &full[k]);
        else if (j == n_row_copies)
            bulk_copy(t + 16 * ws, S.W.scales + (int64_t)r0 * gpr, nrows * gpr * 2, &full[k]);
        else if (j == n_row_copies + 1)
            bulk_copy(t + 16 * ws + 32 * gpr, S.W.biases + (int64_t)r0 * gpr, nrows * gpr * 2, &full[k]);
    }
}

/* One GEMV stage's share of this block (compute warps of team `team` of NT): the block's groups i of the
 * stage with i % NT == team, from the ring; item i is ring item q0 + i. */
template <int IN_MODE, int OUT_MODE, int KS, int NT, int SKIP>
__device__ __forceinline__ void p_gemv(const pargs &a, const pstage &S, unsigned char *ring, uint64_t *full, uint64_t *empty,
                                       float *x_area, float (*s_part)[PW][16], int q0, int s_index, int team)
{
    constexpr int RT = PW / KS;
    if ((int)blockIdx.x + team * (int)gridDim.x >= S.n_groups)
        return;
    const int cols = S.W.cols, CW = cols / KS, steps = CW / 128, gpr = cols / 64;
    const int ws = cols / 2 + BULK_ROW_PAD, tb = bulk_tile_bytes(cols);
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) % PW, g = lane >> 2, t = lane & 3, ks = warp % KS, rt = warp / KS;
    const uint4 *xh;
    const float *off, *xsum;
    const float xk = p_warp_x<IN_MODE, KS>(S.x, S.norm_w, a.eps, cols, x_area, xh, off, xsum, team);
    if (a.bst && blockIdx.x == 0 && threadIdx.x == 0)
        a.bst[4 * s_index + 1] = gtimer();
    for (int i = team;; i += NT) {
        const int grp = blockIdx.x + i * gridDim.x, tile = grp * RT + rt;
        if (grp >= S.n_groups)
            break;
        const int q = q0 + i, k = q % a.slots;
        const unsigned long long w0 = a.bst && threadIdx.x == 0 ? gtimer() : 0ull;
        bulk_mbar_wait(&full[k], (unsigned int)(q / a.slots) & 1u);
        if (a.bst && blockIdx.x == 0 && threadIdx.x == 0)
            a.bst[4 * s_index + 3] += gtimer() - w0;
        const bool live = tile < S.n_tiles;
        mg_frag f;
        if (live && (SKIP & SKIP_LOAD)) {
            for (int st = 0; st < MG_MAX_STEPS; st++)
                f.wa[st] = f.wb[st] = make_uint4(0u, 0u, 0u, 0u), f.sa[st] = f.sb[st] = f.ba[st] = f.bb[st] = 0u;
        } else if (live) {
            const unsigned char *tp = ring + (size_t)k * a.slot_bytes + (size_t)rt * tb;
            mg_load_smem(tp, ws, reinterpret_cast<const __nv_bfloat16 *>(tp + 16 * ws),
                         reinterpret_cast<const __nv_bfloat16 *>(tp + 16 * ws + 32 * gpr), gpr, ks * CW, steps, g, t, f);
        }
        __syncwarp();
        if (lane == 0)
            mbar_arrive(&empty[k]); /* this warp is done with slot k */
        const int pb = (i / NT) & 1;
        if (live) {
            float acc_a = 0.0f, acc_b = 0.0f;
            if (SKIP & SKIP_DOT)
                acc_a = __uint_as_float(f.wa[0].x & 0x3fffffffu), acc_b = __uint_as_float(f.wb[MG_MAX_STEPS - 1].w & 0x3fffffffu);
            else
                mg_dot(f, ks * CW, steps, xh, off, xsum, g, t, acc_a, acc_b);
            if (t == 0) {
                s_part[pb][warp][g] = acc_a / xk;
                s_part[pb][warp][g + 8] = acc_b / xk;
            }
        }
        if (!(SKIP & SKIP_SYNC))
            team_sync(team); /* partials published */
        if (ks == 0 && live && lane < 16 && !(SKIP & SKIP_STORE)) {
            const int row = tile * 16 + lane;
            if (row < S.W.rows) {
                float v = 0.0f;
#pragma unroll
                for (int qq = 0; qq < KS; qq++)
                    v += s_part[pb][rt * KS + qq][lane];
                float *y = S.y + row;
                *y = OUT_MODE == GEMV_OUT_ADD ? __ldcg(y) + v : v;
            }
        }
    }
}

/* Items of stage S this block takes (its groups). */
__device__ __forceinline__ int p_items(const pstage &S)
{
    if (S.kind != STAGE_GEMV || (int)blockIdx.x >= S.n_groups)
        return 0;
    return (S.n_groups - 1 - (int)blockIdx.x) / (int)gridDim.x + 1;
}

template <int NT, int SKIP>
__global__ void __launch_bounds__((NT * PW + 1) * 32, 1) persistent_chain_kernel(pargs a)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char ring[];
    __shared__ __align__(8) uint64_t full[P_MAX_SLOTS], empty[P_MAX_SLOTS];
    __shared__ float s_part[NT][2][PW][16];
    __shared__ volatile int s_stage; /* the stage the compute warps have passed the wait of (-a 0) */
    const int warp = threadIdx.x >> 5, team = warp / PW;
    float *x_area = reinterpret_cast<float *>(ring + (size_t)a.slots * a.slot_bytes) + (team < NT ? team : 0) * mg_warp_x_floats(4096, PW);
    if (threadIdx.x < a.slots) {
        bulk_mbar_init(&full[threadIdx.x], 1);
        bulk_mbar_init(&empty[threadIdx.x], PW);
    }
    if (threadIdx.x == 0)
        s_stage = 0;
    bulk_mbar_init_fence();
    __syncthreads();
    if (a.stamp && blockIdx.x == 0 && threadIdx.x == 0)
        a.stamp[0] = gtimer();

    if (warp == NT * PW) { /* the producer: every item of this block in order, as slots free */
        p_cursor cur = {0, -1};
        p_advance(a, cur);
        for (int q = 0; cur.s < a.n_stages; q++) {
            const int k = q % a.slots;
            if (q >= a.slots)
                bulk_mbar_wait(&empty[k], (unsigned int)(q / a.slots - 1) & 1u);
            if (!a.ahead)
                while (s_stage < cur.s)
                    ;
            p_fill(a, cur, ring, full, k);
            p_advance(a, cur);
        }
        return;
    }

    int q0 = 0;
    for (int s = 0; s < a.n_stages; s++) {
        const pstage S = a.st[s];
        if (s > 0) { /* the predecessor's output complete and visible */
            if (threadIdx.x == 0) {
                while (ld_acquire(&a.done[s - 1]) < a.target)
                    ;
                s_stage = s;
            }
            compute_sync<NT>();
        }
        if (a.bst && blockIdx.x == 0 && threadIdx.x == 0)
            a.bst[4 * s] = a.bst[4 * s + 1] = gtimer(), a.bst[4 * s + 3] = 0ull;
        if (S.kind == STAGE_SILU) {
            for (int j = blockIdx.x * NT * PW * 32 + threadIdx.x; j < S.n; j += gridDim.x * NT * PW * 32)
                S.y[j] = silu_f(__ldcg(S.x + j));
        } else if (S.in_mode == GEMV_IN_RMSNORM && S.out_mode == GEMV_OUT_STORE && S.ks == 4) {
            p_gemv<GEMV_IN_RMSNORM, GEMV_OUT_STORE, 4, NT, SKIP>(a, S, ring, full, empty, x_area, s_part[team], q0, s, team);
        } else if (S.in_mode == GEMV_IN_PLAIN && S.out_mode == GEMV_OUT_ADD && S.ks == 8) {
            p_gemv<GEMV_IN_PLAIN, GEMV_OUT_ADD, 8, NT, SKIP>(a, S, ring, full, empty, x_area, s_part[team], q0, s, team);
        }
        q0 += p_items(S);
        if (a.bst && blockIdx.x == 0 && threadIdx.x == 0)
            a.bst[4 * s + 2] = gtimer();
        compute_sync<NT>(); /* every output of this block stored */
        if (threadIdx.x == 0) {
            __threadfence();
            const unsigned int old = atomicAdd(&a.done[s], 1u);
            if (a.stamp && old == a.target - 1)
                a.stamp[s + 1] = gtimer();
        }
    }
#endif
}

__global__ void silu_stage_kernel(const float *x, float *y, int n)
{
    pdl_trigger();
    pdl_wait();
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x)
        y[j] = silu_f(x[j]);
}

/* ---- host ------------------------------------------------------------------------------------------- */

/* rows x cols 4-bit: random nibbles, scales ~0.01, biases centred so that w has mean ~0 */
static dmat make_q4(int rows, int cols)
{
    const size_t rb = (size_t)cols / 2, gpr = (size_t)cols / 64;
    std::vector<uint8_t> data((size_t)rows * rb);
    for (auto &b : data)
        b = (uint8_t)rnd();
    std::vector<__nv_bfloat16> sc((size_t)rows * gpr), bi((size_t)rows * gpr);
    for (size_t i = 0; i < sc.size(); i++) {
        const float s = 0.005f + 0.01f * (rnd() & 1023) / 1024.0f;
        sc[i] = __float2bfloat16(s);
        bi[i] = __float2bfloat16(-7.5f * s + 0.01f * ((int)(rnd() & 1023) - 512) / 512.0f);
    }
    dmat m;
    memset(&m, 0, sizeof m);
    m.data = dev_upload(data);
    m.scales = dev_upload(sc);
    m.biases = dev_upload(bi);
    m.bits = 4, m.rows = rows, m.cols = cols, m.n_experts = 1, m.row_bytes = (int64_t)rb;
    return m;
}

static float *dev_floats(size_t n, float v)
{
    return dev_upload(std::vector<float>(n, v));
}

static double stage_bytes(const pstage &S) { return S.kind == STAGE_GEMV ? (double)S.W.rows * (S.W.cols / 2 + S.W.cols / 64 * 4) : 0.0; }

int main(int argc, char **argv)
{
    int L = 40, reps = 50;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-L") && i + 1 < argc) L = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [-L LAYERS] [-r REPS]\n", argv[0]);
            return 2;
        }
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0 || L < 1 || reps < 1) {
        fprintf(stderr, "no CUDA device (or L < 1, reps < 1)\n");
        return 1;
    }
    if (!cuda_sm90_code()) {
        fprintf(stderr, "needs the sm_90 code (bulk copies)\n");
        return 1;
    }
    const int H = 2048;
    const float eps = 1e-6f;
    float *h = dev_floats(H, 0.0f), *ya = dev_floats(12352, 0.0f), *e = dev_floats(4096, 0.0f), *yc = dev_floats(9216, 0.0f);
    std::vector<float> h0(H);
    for (auto &v : h0)
        v = ((int)(rnd() & 4095) - 2048) / 1024.0f;
    std::vector<float> nw(H);
    for (auto &v : nw)
        v = 0.5f + (rnd() & 1023) / 1024.0f;
    float *norm_a = dev_upload(nw), *norm_c = dev_upload(nw);

    std::vector<pstage> st;
    for (int l = 0; l < L; l++) {
        pstage s;
        memset(&s, 0, sizeof s);
        s.kind = STAGE_GEMV, s.W = make_q4(12352, H), s.x = h, s.y = ya, s.norm_w = norm_a;
        s.in_mode = GEMV_IN_RMSNORM, s.out_mode = GEMV_OUT_STORE;
        st.push_back(s);
        memset(&s, 0, sizeof s);
        s.kind = STAGE_SILU, s.x = ya, s.y = e, s.n = 4096;
        st.push_back(s);
        memset(&s, 0, sizeof s);
        s.kind = STAGE_GEMV, s.W = make_q4(H, 4096), s.x = e, s.y = h, s.in_mode = GEMV_IN_PLAIN, s.out_mode = GEMV_OUT_ADD;
        st.push_back(s);
        memset(&s, 0, sizeof s);
        s.kind = STAGE_GEMV, s.W = make_q4(9216, H), s.x = h, s.y = yc, s.norm_w = norm_c;
        s.in_mode = GEMV_IN_RMSNORM, s.out_mode = GEMV_OUT_STORE;
        st.push_back(s);
        memset(&s, 0, sizeof s);
        s.kind = STAGE_GEMV, s.W = make_q4(H, 4096), s.x = yc, s.y = h, s.in_mode = GEMV_IN_PLAIN, s.out_mode = GEMV_OUT_ADD;
        st.push_back(s);
    }
    int slot_bytes = 0;
    double bytes = 0.0;
    for (auto &s : st) {
        if (s.kind == STAGE_GEMV) {
            s.ks = s.W.cols / 512, s.rt = PW / s.ks;
            s.n_tiles = (s.W.rows + 15) / 16, s.n_groups = (s.n_tiles + s.rt - 1) / s.rt;
            slot_bytes = std::max(slot_bytes, s.rt * bulk_tile_bytes(s.W.cols));
        }
        bytes += stage_bytes(s);
    }
    const int n_st = (int)st.size();
    pstage *d_st = dev_upload(st);
    double gbps = 0.0; /* the copy rate lily bench measures its decode floor against (bytes read + written) */
    lily_error lerr;
    memset(&lerr, 0, sizeof lerr);
    if (lily_cuda_membw(0, (size_t)1 << 30, 5, &gbps, &lerr) != LILY_OK) {
        fprintf(stderr, "%s\n", lerr.message);
        return 1;
    }
    const double rate = gbps * 1e9;
    printf("chain: %d layers, %d stages, %.3f GB of weights per token; copy rate %.0f GB/s -> byte floor %.3f ms\n", L, n_st,
           bytes / 1e9, rate / 1e9, bytes / rate * 1e3);

    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    /* graph: lily's kernels, one per stage (one eager pass first: the launchers' one-time setup) */
    cudaGraph_t graph;
    cudaGraphExec_t gexec;
    for (int pass = 0; pass < 2; pass++) {
    if (pass == 1)
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (auto &S : st) {
        if (S.kind == STAGE_SILU) {
            CK(launch_pdl(silu_stage_kernel, dim3(16), dim3(256), 0, s, S.x, S.y, S.n));
            continue;
        }
        gemv_batch b;
        memset(&b, 0, sizeof b);
        b.m[0] = S.W, b.y[0] = S.y, b.y_stride[0] = S.W.rows, b.row_start[1] = S.W.rows, b.n_mats = 1;
        b.kernel = GEMV_KERNEL_STREAM;
        gemv_input in;
        memset(&in, 0, sizeof in);
        in.act = S.x, in.act_stride = S.W.cols, in.mode = S.in_mode, in.norm_w = S.norm_w, in.eps = eps;
        CK(launch_gemv(b, in, S.out_mode, 1, NULL, s));
    }
    if (pass == 0)
        CK(cudaStreamSynchronize(s));
    }
    CK(cudaStreamEndCapture(s, &graph));
    CK(cudaGraphInstantiate(&gexec, graph, 0));

    /* persistent: one block per SM (all co-resident: checked), NT teams of PW compute warps + the producer */
    struct pconf {
        void (*k)(pargs);
        int nt, skip, slots, regs, big;
        size_t dyn;
    } conf[8];
    /* 0: one team, 1: two teams, 2..6: one team with parts of the items left out (timing only) */
    conf[0].k = persistent_chain_kernel<1, 0>, conf[0].nt = 1, conf[0].skip = 0;
    conf[1].k = persistent_chain_kernel<2, 0>, conf[1].nt = 2, conf[1].skip = 0;
    conf[2].k = persistent_chain_kernel<1, SKIP_DOT>, conf[2].skip = SKIP_DOT;
    conf[3].k = persistent_chain_kernel<1, SKIP_DOT | SKIP_LOAD>, conf[3].skip = SKIP_DOT | SKIP_LOAD;
    conf[4].k = persistent_chain_kernel<1, SKIP_DOT | SKIP_LOAD | SKIP_STORE>, conf[4].skip = SKIP_DOT | SKIP_LOAD | SKIP_STORE;
    conf[5].k = persistent_chain_kernel<1, SKIP_DOT | SKIP_LOAD | SKIP_STORE | SKIP_SYNC>;
    conf[5].skip = SKIP_DOT | SKIP_LOAD | SKIP_STORE | SKIP_SYNC;
    conf[6].k = persistent_chain_kernel<1, SKIP_SYNC>, conf[6].skip = SKIP_SYNC;
    conf[7] = conf[5]; /* everything left out, and one bulk copy per tile's rows */
    for (int c = 0; c < 8; c++)
        conf[c].big = c == 7;
    for (int c = 2; c < 8; c++)
        conf[c].nt = 1;
    int dev = 0, sms = 0, optin = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    const int grid = sms;
    for (int c = 0; c < 8; c++) {
        pconf &P = conf[c];
        cudaFuncAttributes fa;
        CK(cudaFuncGetAttributes(&fa, P.k));
        const int x_bytes = P.nt * mg_warp_x_floats(4096, PW) * 4;
        const int dyn_max = optin - (int)fa.sharedSizeBytes;
        CK(cudaFuncSetAttribute(P.k, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn_max));
        P.slots = std::min(P_MAX_SLOTS, (dyn_max - x_bytes) / slot_bytes);
        P.dyn = (size_t)P.slots * slot_bytes + x_bytes;
        P.regs = fa.numRegs;
        int per_sm = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, P.k, (P.nt * PW + 1) * 32, P.dyn));
        if (per_sm < 1) {
            fprintf(stderr, "persistent kernel (%d teams) does not fit (%d slots of %d bytes)\n", P.nt, P.slots, slot_bytes);
            return 1;
        }
        if (c < 2)
            printf("persistent, %d team(s): grid %d x %d threads, %d ring slots of %d bytes (%.0f KB per SM), %d registers\n", P.nt,
               grid, (P.nt * PW + 1) * 32, P.slots, slot_bytes, P.dyn / 1024.0, P.regs);
    }
    unsigned int *done;
    unsigned long long *stamp, *bst;
    CK(cudaMalloc(&bst, 4 * n_st * sizeof(unsigned long long)));
    CK(cudaMalloc(&done, n_st * sizeof(unsigned int)));
    CK(cudaMemset(done, 0, n_st * sizeof(unsigned int)));
    CK(cudaMalloc(&stamp, (n_st + 1) * sizeof(unsigned long long)));
    unsigned int launches = 0;
    auto run_persistent = [&](const pconf &P, int ahead, unsigned long long *stp) {
        pargs a;
        a.st = d_st, a.n_stages = n_st, a.done = done, a.target = (unsigned int)grid * ++launches;
        a.stamp = stp, a.bst = stp ? bst : NULL, a.slots = P.slots, a.slot_bytes = slot_bytes;
        a.ahead = ahead, a.eps = eps, a.big_copies = P.big;
        P.k<<<grid, (P.nt * PW + 1) * 32, P.dyn, s>>>(a);
        CK(cudaGetLastError());
    };

    /* correctness: h after one token, both ways, from the same h0 */
    std::vector<float> hg(H), hp(H);
    CK(cudaMemcpy(h, h0.data(), H * 4, cudaMemcpyHostToDevice));
    CK(cudaGraphLaunch(gexec, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(hg.data(), h, H * 4, cudaMemcpyDeviceToHost));
    for (int v = 0; v < 4; v++) {
        const int ahead = v & 1, c = v >> 1;
        CK(cudaMemcpy(h, h0.data(), H * 4, cudaMemcpyHostToDevice));
        run_persistent(conf[c], ahead, NULL);
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(hp.data(), h, H * 4, cudaMemcpyDeviceToHost));
        int diff = 0;
        double maxd = 0.0, maxh = 0.0;
        for (int i = 0; i < H; i++) {
            if (memcmp(&hg[i], &hp[i], 4))
                diff++;
            maxd = std::max(maxd, (double)fabsf(hg[i] - hp[i]));
            maxh = std::max(maxh, (double)fabsf(hg[i]));
        }
        printf("h after one token, persistent (%d team(s), ahead %d) vs graph: %d of %d values differ (max |diff| %.3g, max |h| %.3g)%s\n",
               conf[c].nt, ahead, diff, H, maxd, maxh, diff ? "  MISMATCH" : "  bit-identical");
    }

    /* timing: alternate, twice; h reset before each batch (values stay bounded) */
    for (int round = 0; round < 2; round++) {
        for (int way = 0; way < 3; way++) {
            CK(cudaMemcpy(h, h0.data(), H * 4, cudaMemcpyHostToDevice));
            for (int r = 0; r < 3 + reps; r++) {
                if (r == 3)
                    CK(cudaEventRecord(e0, s));
                if (way == 0)
                    CK(cudaGraphLaunch(gexec, s));
                else
                    run_persistent(conf[way == 1 ? 0 : 1], 1, NULL);
            }
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            const double per = ms / reps;
            static const char *way_name[3] = {"graph (gemv_stream, PDL)", "persistent, 1 team", "persistent, 2 teams"};
            printf("round %d  %-28s %.4f ms per token (%.1f tokens/s), %.1f%% of the byte floor\n", round, way_name[way], per,
                   1e3 / per, 100.0 * bytes / rate * 1e3 / per);
        }
    }

    /* per stage kind from the stamps (mean over layers of the last block's done minus the previous one's) */
    static const int order[8] = {0, 2, 3, 4, 5, 7, 6, 1};
    for (int v = 0; v < 8; v++) { /* 1 team, then with parts of the items left out; 2 teams */
        const int ahead = 1, c = order[v], skip = conf[c].skip;
        if (conf[c].big)
            printf("(one bulk copy per tile's rows instead of 16)\n");
        if (skip)
            printf("(left out:%s%s%s%s)\n", skip & SKIP_DOT ? " tile arithmetic" : "", skip & SKIP_LOAD ? ", fragment loads" : "",
                   skip & SKIP_STORE ? ", reduce + store" : "", skip & SKIP_SYNC ? ", partials barrier" : "");
        CK(cudaMemcpy(h, h0.data(), H * 4, cudaMemcpyHostToDevice));
        std::vector<unsigned long long> t(n_st + 1), t3(4 * n_st);
        std::vector<double> sum(5, 0.0), lag(5, 0.0), xs(5, 0.0), items(5, 0.0), rw(5, 0.0);
        const int runs = 5;
        for (int r = 0; r < runs; r++) {
            run_persistent(conf[c], ahead, stamp);
            CK(cudaStreamSynchronize(s));
            CK(cudaMemcpy(t.data(), stamp, t.size() * 8, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(t3.data(), bst, t3.size() * 8, cudaMemcpyDeviceToHost));
            for (int i = 0; i < n_st; i++) {
                sum[i % 5] += (double)(t[i + 1] - t[i]) / 1e3;
                lag[i % 5] += ((double)t3[4 * i] - (double)t[i]) / 1e3;
                xs[i % 5] += ((double)t3[4 * i + 1] - (double)t3[4 * i]) / 1e3;
                items[i % 5] += ((double)t3[4 * i + 2] - (double)t3[4 * i + 1]) / 1e3;
                rw[i % 5] += (double)t3[4 * i + 3] / 1e3;
            }
        }
        static const char *name[5] = {"A in_proj 12352x2048 RMSNorm", "E silu 4096", "B out_proj 2048x4096 +=",
                                      "C gate/up-size 9216x2048 RMSNorm", "D down-size 2048x4096 +="};
        printf("persistent (%d team(s), ahead %d), per stage (us, mean over %d layers x %d runs; byte time at the copy rate; block 0: "
               "predecessor's last done -> wait passed, x side, its items (of which ring waits)):\n", conf[c].nt, ahead, L, runs);
        double tot = 0.0;
        for (int k = 0; k < 5; k++) {
            const double us = sum[k] / (L * runs);
            tot += us;
            const double n = (double)(L * runs);
            printf("  %-34s %6.2f us   bytes %5.2f us   block 0: %5.2f %5.2f %5.2f (%5.2f)\n", name[k], us, stage_bytes(st[k]) / rate * 1e6,
                   lag[k] / n, xs[k] / n, items[k] / n, rw[k] / n);
        }
        printf("  %-34s %6.2f us\n", "layer", tot);
    }
    return 0;
}
