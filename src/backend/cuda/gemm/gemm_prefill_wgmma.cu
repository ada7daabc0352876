/* gemm_prefill_wgmma.cu — the Hopper (sm_90a) kernel of the 4-bit prefill GEMM (gemm_kernel_choose picks it
 * on an sm_90a device): the same operands and results as gemm_prefill_2d.cu up to fp16 rounding of the
 * weights, with wgmma.mma_async instead of mma.sync so that one instruction covers 64 rows x N tokens x 16
 * columns.
 *
 * gemm_wg_kernel<N, XL, EPI, GROUPED>: 256 threads = 2 warpgroups; a block owns 128 weight rows (SWIGLU:
 * 64 gate rows + the same 64 up rows; gemm_row) x N = 64 or 128 tokens; warpgroup w owns rows
 * 64w..64w+63 (warp i of the block: rows 16i..16i+15, gemm_epilogue_w16's layout) and issues, per
 * 64-column group, four wgmma m64nNk16 (fp16 x fp16 -> fp32 in registers) with
 *   A from registers: the weights dequantized to fp16, w = s·q + b by one HFMA2 per pair (q exact as fp16
 *     by the 1024 + q trick, s and b bf16 -> fp16 exactly); A's register fragment per warp is the
 *     m16n8k16 one (a0: row g, k 2t, 2t+1; a1: row g+8; a2/a3: k + 8), PTX ISA "Register fragments and
 *     shared memory matrix layouts" for wgmma .m64nNk16;
 *   B from shared memory: the stage's N token rows x 128 B (64 columns fp16), K-major, 128-byte swizzle
 *     (16-byte chunk c of row r at chunk c ^ (r & 7), the layout gemm_prefill_2d.cu writes), read through
 *     a matrix descriptor; k16 slice s of the group starts 32·s bytes into each row.
 * The activation rows hold each 16-column block permuted (gemm_perm16): physical position p of slice s is
 * column 16s + gemm_perm16(p), so thread t's A pairs are columns {t, t+4} (k 2t, 2t+1) and {8+t, 12+t}
 * (k 2t+8, 2t+9) of the slice: nibbles t and t + 4 of the slice's two 4-bit words, one shift by 4t.
 * No per-group fold and no group sums (gemm_act.xs is unused); the epilogue multiplies the row scale back.
 * Error vs gemm_prefill_2d: each weight is rounded to fp16 once (relative 2^-11).
 *
 * Pipeline: 5 stages of [activations N x 128 B (1024-byte aligned) | weights 128 rows x 32 B | fp32
 * scale[128], bias[128]]; step k refills the slot of step k - 2 (both warpgroups have retired group k - 2
 * before step k's barrier). One commit group per k16 slice: slice s of group k is dequantized into A[s] as
 * soon as slice s of group k - 1 has retired (wait<3>), so three wgmmas stay queued through each
 * dequantization and through the barrier. The tile rows' X addresses sit in shared memory (s_src), the
 * stage slot is a running counter, and a weight nibble pair takes one LOP3.
 * Ragged tiles: a tile with count <= 32 / 64 / 96 live tokens runs the main loop with wgmma m64n32/64/96k16
 * and skips the loads of its dead token rows (each expert's last MoE tile).
 * X loads (XL): 1 (TMA) for a launch without a gather whose X rows are known (dense, and the routed down
 * GEMM: a.act_rows): thread 0 arms the stage's mbarrier (expect_tx N·128 bytes) and issues one 2D tensor
 * copy (box 64 columns x N rows, 128-byte swizzle; rows past the map arrive as zeros); 2 (MB) for the
 * others: every thread's cp.async of a stage (weights and X) completes on the stage's mbarrier
 * (cp.async.mbarrier.arrive.noinc, 256 arrivals per phase). Either way B arrives without a per-step
 * fence.proxy.async; the block barrier stays (scale/bias stores, slot reuse). Measurements:
 * docs/BENCHMARKS.md ("One kernel per op and shape").
 * Compiled for sm_90a only (__CUDA_ARCH_FEAT_SM90_ALL); elsewhere the kernel is an empty stub and
 * gemm_wgmma_available() says false.
 */
#include "gemm_prefill_dev.cuh"
#include "backend/cuda/wgmma_common.cuh" /* descriptors, fences, wait */

#include <string.h>

#include <cuda.h> /* CUtensorMap (the map itself is encoded through the runtime's driver entry point) */
#include <type_traits>

/* Blocks per SM promised to ptxas: 2 caps the registers at 128 (see the header; no spills) and two
 * blocks fit the shared memory (N 128: 87 KB each with 4 stages, 109 KB with 5); 1 allows 255. */
#ifndef GEMM_WG_MIN_BLOCKS
#define GEMM_WG_MIN_BLOCKS 2
#endif

template <int N>
struct gemm_wg_shape {
    static constexpr int STAGES = 5;               /* refills 2 groups behind: 3 ahead */
    static constexpr int X_STAGE = N * 128;        /* first: the descriptor's 1024-byte swizzle atoms */
    static constexpr int W_STAGE = GEMM_ROWS * 32; /* 4-bit: 32 bytes per row per group */
    static constexpr int SB_STAGE = 2 * GEMM_ROWS * 4;
    static constexpr int STAGE = X_STAGE + W_STAGE + SB_STAGE;
    static constexpr int SMEM = STAGES * STAGE + 1024; /* + slack to align the base to 1024 */
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* D (64 x N fp32, m16n8 layout per warp and n8 block) += A (64 x 16 fp16, registers) · B (16 x N fp16,
 * K-major in shared memory at desc). */
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
                 "{%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
          "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
          "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
          "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

/* m64n32k16, m64n96k16: the narrower forms for tiles of <= 32 / 96 live tokens */
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[4][4], const uint32_t (&a)[4], uint64_t desc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
                 "{%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

__device__ __forceinline__ void wgmma_m64n96k16(float (&d)[12][4], const uint32_t (&a)[4], uint64_t desc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, "
                 "{%48,%49,%50,%51}, %52, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
          "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

/* Two weights of one row (low half: k 2t, high: k 2t+1) from a 4-bit word: nibbles sh/4 and sh/4 + 4;
 * the mask and the 1024 exponent in one LOP3 ((x & m) | e, the magic in a register). */
__device__ __forceinline__ uint32_t dq4_wg(uint32_t w, int sh, __half2 s, __half2 b)
{
    uint32_t x;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(x) : "r"(w >> sh), "n"(0x000F000F), "r"(0x64006400u));
    const __half2 q = __hsub2(bits_h2(x), bits_h2(0x64006400u));
    return h2_bits(__hfma2(q, s, b));
}

template <int N>
__device__ __forceinline__ void wgmma_n(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc)
{
    if constexpr (N == 32)
        wgmma_m64n32k16(d, a, desc);
    else if constexpr (N == 64)
        wgmma_m64n64k16(d, a, desc);
    else if constexpr (N == 96)
        wgmma_m64n96k16(d, a, desc);
    else
        wgmma_m64n128k16(d, a, desc);
}

#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* TMA: the X tile of a dense GEMM as one 2D tensor copy per stage (box 64 columns x N rows,
 * 128-byte swizzle: the layout the descriptor reads), completing on the stage's mbarrier. */
__device__ __forceinline__ void mbar_init(uint64_t *bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"((uint32_t)__cvta_generic_to_shared(bar)), "r"(count)
                 : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(bar)),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity)
{
    asm volatile("{\n.reg .pred P1;\nWAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
                 "@P1 bra DONE_%=;\nbra WAIT_%=;\nDONE_%=:\n}\n" ::"r"((uint32_t)__cvta_generic_to_shared(bar)),
                 "r"(parity)
                 : "memory");
}
__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, int x, int y, uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"((uint32_t)__cvta_generic_to_shared(bar))
                 : "memory");
}
#endif

/* The weights of one group for a thread's rows r0 and r0 + 8: 8 words each (columns 0..63, slice s in
 * words 2s, 2s + 1) and the rows' scale and bias as fp16 pairs. */
struct gemm_wq {
    uint32_t w0[8], w1[8];
    __half2 s0, b0, s1, b1;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void gemm_wq_load(gemm_wq &q, const unsigned char *sw, int r0)
{
    const uint4 u0l = *reinterpret_cast<const uint4 *>(sw + r0 * 32);
    const uint4 u0h = *reinterpret_cast<const uint4 *>(sw + r0 * 32 + 16);
    const uint4 u1l = *reinterpret_cast<const uint4 *>(sw + (r0 + 8) * 32);
    const uint4 u1h = *reinterpret_cast<const uint4 *>(sw + (r0 + 8) * 32 + 16);
    q.w0[0] = u0l.x, q.w0[1] = u0l.y, q.w0[2] = u0l.z, q.w0[3] = u0l.w;
    q.w0[4] = u0h.x, q.w0[5] = u0h.y, q.w0[6] = u0h.z, q.w0[7] = u0h.w;
    q.w1[0] = u1l.x, q.w1[1] = u1l.y, q.w1[2] = u1l.z, q.w1[3] = u1l.w;
    q.w1[4] = u1h.x, q.w1[5] = u1h.y, q.w1[6] = u1h.z, q.w1[7] = u1h.w;
    const float *ssb = reinterpret_cast<const float *>(sw + GEMM_ROWS * 32);
    q.s0 = __float2half2_rn(ssb[r0]), q.b0 = __float2half2_rn(ssb[GEMM_ROWS + r0]);
    q.s1 = __float2half2_rn(ssb[r0 + 8]), q.b1 = __float2half2_rn(ssb[GEMM_ROWS + r0 + 8]);
}

__device__ __forceinline__ void wg_fence_regs4(uint32_t (&x)[4])
{
    asm volatile("" : "+r"(x[0]), "+r"(x[1]), "+r"(x[2]), "+r"(x[3])::"memory");
}

/* A fragment of k16 slice s (wgmma_common.cuh: a0 row g k lo, a1 row g+8 k lo, a2/a3 k hi) */
__device__ __forceinline__ void gemm_wq_slice(uint32_t (&A)[4], const gemm_wq &q, int s, int sh)
{
    A[0] = dq4_wg(q.w0[2 * s], sh, q.s0, q.b0);
    A[1] = dq4_wg(q.w1[2 * s], sh, q.s1, q.b1);
    A[2] = dq4_wg(q.w0[2 * s + 1], sh, q.s0, q.b0);
    A[3] = dq4_wg(q.w1[2 * s + 1], sh, q.s1, q.b1);
}
#endif

template <int N, int XL, int EPI, bool GROUPED>
__global__ void __launch_bounds__(GEMM_THREADS, GEMM_WG_MIN_BLOCKS)
    gemm_wg_kernel(gemm_args a, int n_tokens, const __grid_constant__ CUtensorMap xmap)
{
    static_assert(XL == 1 || XL == 2, "X by TMA (1) or by cp.async on mbarriers (2)");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef gemm_wg_shape<N> S;
    constexpr bool TMA = XL == 1, MB = XL == 2;
    constexpr int NT = N / 8, NS = S::STAGES;
    static_assert(S::STAGE % 1024 == 0 && N * 8 % GEMM_THREADS == 0, "stage layout");
    static_assert(S::SMEM - 1024 >= 64 * N * 4, "SWIGLU epilogue needs 64 x N floats");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ int s_tok[N];
    __shared__ float s_scale[N];
    __shared__ const unsigned char *s_src[N]; /* X row of each tile row */
    __shared__ uint64_t s_full[NS];           /* the stage landed */
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    unsigned char *smem = smem_raw + ((1024u - (raw & 1023u)) & 1023u);
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tig = lane & 3;

    int e, base, count;
    if (!gemm_tile_rows<N, GROUPED>(a, n_tokens, e, base, count, s_tok, s_scale))
        return;
    const int cols = a.act.cols, n_groups = cols / 64;

    /* one 16-byte weight chunk per thread (128 rows x 2), and the scale (tid < 128) or bias of row tid & 127 */
    const unsigned char *wsrc = reinterpret_cast<const unsigned char *>(a.act.x);
    bool wok;
    const __nv_bfloat16 *sbp = NULL;
    {
        int mi, lr;
        wok = gemm_row<EPI>(a, tid >> 1, mi, lr);
        if (wok)
            wsrc = a.m[mi].data + ((int64_t)e * a.m[mi].rows + lr) * a.m[mi].row_bytes + (tid & 1) * 16;
        if (gemm_row<EPI>(a, tid & (GEMM_ROWS - 1), mi, lr))
            sbp = (tid < GEMM_ROWS ? a.m[mi].scales : a.m[mi].biases) + ((int64_t)e * a.m[mi].rows + lr) * n_groups;
    }
    if (tid < N) /* s_tok[tid]: this thread's own write */
        s_src[tid] = reinterpret_cast<const unsigned char *>(a.act.x + (size_t)s_tok[tid] * cols);
    if (tid == 0) {
#pragma unroll
        for (int i = 0; i < NS; i++)
            mbar_init(&s_full[i], TMA ? 1 : GEMM_THREADS);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads(); /* s_tok, s_src, the mbarriers */

    auto load_stage = [&](int k, int st) {
        unsigned char *sx = smem + st * S::STAGE;
        cp_async16(sx + S::X_STAGE + tid * 16, wok ? wsrc + (size_t)k * 32 : wsrc, wok);
        if constexpr (TMA) {
            /* one thread: rows base.. of X (zeros past the map's rows), columns 64k.. (grouped: rows past
             * count belong to the next expert or are zeros; their token columns are never stored) */
            if (tid == 0) {
                mbar_expect_tx(&s_full[st], N * 128);
                tma_load_2d(sx, &xmap, k * 64, base, &s_full[st]);
            }
        } else {
            /* thread tid's chunks: rows (tid >> 3) + 32i, chunk tid & 7 (s_src holds its byte offset), all
             * at the same swizzle (r & 7 = (tid >> 3) & 7): one LDS.64 of the row's address + a 64-bit add */
            const int r = tid >> 3, dst = r * 128 + (((tid & 7) ^ (r & 7)) * 16), off = k * 128 + (tid & 7) * 16;
#pragma unroll
            for (int i = 0; i < N * 8 / GEMM_THREADS; i++) {
                if (r + 32 * i >= count)
                    continue; /* a dead token row is never read (warp-uniform: 4 rows per warp) */
                cp_async16(sx + dst + 4096 * i, s_src[r + 32 * i] + off, true);
            }
            /* every thread, every stage: the phase completes when all 256 threads' copies have */
            asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(
                             (uint32_t)__cvta_generic_to_shared(&s_full[st]))
                         : "memory");
        }
    };
    auto sb_slot = [&](int k) {
        return reinterpret_cast<float *>(smem + (k % NS) * S::STAGE + S::X_STAGE + S::W_STAGE);
    };

    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
        acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
    for (int st = 0; st < NS - 2; st++) {
        if (st < n_groups)
            load_stage(st, st);
        cp_async_commit();
    }
    /* scale/bias of group k: stored at step k - (NS - 2), as in gemm_prefill_2d.cu */
    __nv_bfloat16 sbv = __float2bfloat16(0.0f);
#pragma unroll
    for (int k = 0; k < NS - 2; k++)
        if (k < n_groups)
            sb_slot(k)[tid] = sbp ? bf2f(sbp[k]) : 0.0f;
    if (sbp && NS - 2 < n_groups)
        sbv = sbp[NS - 2];

    const int r0 = warp * 16 + g, sh = 4 * tig;
    /* Step k's front: the barrier, then the refill of the slot of group k + NS - 2 (its last reader, group
     * k - 2, has retired in both warpgroups) and its scale/bias store. The slot of step k is a running
     * counter (cur), phase the parity of its current use. */
    int cur = 0;
    uint32_t phase = 0;
    auto advance = [&]() {
        cur = cur + 1 == NS ? 0 : cur + 1;
        if (cur == 0)
            phase ^= 1u;
    };
    auto front = [&](int k) {
        if (!MB)
            cp_async_wait<NS - 3>(); /* this thread's weight chunk of stage k */
        __syncthreads();
        const int sn = cur >= 2 ? cur - 2 : cur + NS - 2, kn = k + NS - 2;
        if (kn < n_groups) {
            load_stage(kn, sn);
            reinterpret_cast<float *>(smem + sn * S::STAGE + S::X_STAGE + S::W_STAGE)[tid] = sbp ? bf2f(sbv) : 0.0f;
            if (sbp && kn + 1 < n_groups)
                sbv = sbp[kn + 1];
        }
        cp_async_commit();
    };

    /* One commit group per k16 slice; slice s of group k is dequantized into A[s] as soon as slice s of
     * group k - 1 has retired (wait<3>: the three wgmmas issued after it may still run). The loop is
     * instantiated for NP = 32, 64, 96 and N tokens, and a tile runs the narrowest that covers its live
     * tokens (count), with wgmma m64nNPk16 on the first NP/8 accumulator blocks. Token column n of D
     * depends on row n of B only, so the columns past count (garbage, or never loaded) are never stored. */
    auto main_loop = [&](auto np) {
        constexpr int NP = decltype(np)::value;
        float(&accp)[NP / 8][4] = *reinterpret_cast<float(*)[NP / 8][4]>(&acc[0][0]);
        uint32_t A[4][4];
#pragma unroll
        for (int s = 0; s < 4; s++)
            A[s][0] = A[s][1] = A[s][2] = A[s][3] = 0u;
        for (int k = 0; k < n_groups; k++) {
            front(k);
            if (MB) /* the stage's weights and X from every thread's cp.async */
                mbar_wait(&s_full[cur], phase);
            gemm_wq q;
            gemm_wq_load(q, smem + cur * S::STAGE + S::X_STAGE, r0);
            const uint64_t desc = wg_desc(sbase + cur * S::STAGE);
            if (TMA)
                mbar_wait(&s_full[cur], phase);
#pragma unroll
            for (int s = 0; s < 4; s++) {
                wg_wait<3>(); /* slice s of group k - 1 retired: A[s] free */
                wg_fence_regs4(A[s]);
                gemm_wq_slice(A[s], q, s, sh);
                wg_fence();
                wgmma_n<NP>(accp, A[s], desc + 2 * s); /* + 32 bytes >> 4 per k16 slice */
                wg_commit();
            }
            advance();
        }
        wg_wait<0>();
        wg_fence_regs(A);
    };
    if (count <= 32)
        main_loop(std::integral_constant<int, 32>());
    else if (N == 128 && count <= 64)
        main_loop(std::integral_constant<int, 64>());
    else if (N == 128 && count <= 96)
        main_loop(std::integral_constant<int, 96>());
    else
        main_loop(std::integral_constant<int, N>());
    wg_fence_regs(acc);
    cp_async_wait<0>();
    __syncthreads(); /* pipeline buffers free: the SWIGLU epilogue reuses them */
    gemm_epilogue_w16<EPI, NT, true>(a, acc, warp, g, tig, base, count, s_scale, reinterpret_cast<float *>(smem));
#else
    (void)a;
    (void)n_tokens;
    (void)xmap;
#endif
}

/* ---- dispatch ---------------------------------------------------------------------------------------- */

typedef CUresult (*gemm_encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                         const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                         CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* The tensor map of X (rows x cols fp16, box 64 x T, 128-byte swizzle, zeros past the last row); false
 * when the driver lacks cuTensorMapEncodeTiled or rejects the map (the launch then loads X by cp.async). */
static bool gemm_x_map(const gemm_args &a, int rows, int T, CUtensorMap *map)
{
    static gemm_encode_tiled_fn encode = NULL;
    static int tried = 0;
    if (!tried) {
        tried = 1;
        void *fn = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            encode = reinterpret_cast<gemm_encode_tiled_fn>(fn);
        else
            cudaGetLastError();
    }
    if (!encode)
        return false;
    const cuuint64_t dims[2] = {(cuuint64_t)a.act.cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)a.act.cols * sizeof(__half)};
    const cuuint32_t box[2] = {64, (cuuint32_t)T}, estr[2] = {1, 1};
    return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, a.act.x, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int N, int XL, int EPI, bool GROUPED>
static cudaError_t gemm_wg_go(const gemm_args &a, int n_tokens, const CUtensorMap &xmap, cudaStream_t s)
{
    typedef gemm_wg_shape<N> S;
    static size_t smem_set = 48 * 1024; /* opted in once per instance */
    dim3 grid;
    cudaError_t e = cuda_smem_opt_in(gemm_wg_kernel<N, XL, EPI, GROUPED>, S::SMEM, &smem_set);
    if (e == cudaSuccess)
        e = gemm_grid(a, n_tokens, GROUPED, N, EPI, &grid);
    if (e != cudaSuccess)
        return e;
    gemm_wg_kernel<N, XL, EPI, GROUPED><<<grid, GEMM_THREADS, S::SMEM, s>>>(a, n_tokens, xmap);
    return cudaGetLastError();
}

/* X by TMA where the launch has no gather and its X rows are known (dense: n_tokens; grouped: a.act_rows,
 * the routed down GEMM, STORE) and the map can be made; every other launch by cp.async on mbarriers. */
template <int N>
static cudaError_t gemm_wg_epi(const gemm_args &a, int n_tokens, bool grouped, cudaStream_t s)
{
    CUtensorMap xmap;
    memset(&xmap, 0, sizeof xmap);
    const bool tma = !a.gather && (!grouped || (a.act_rows > 0 && a.epi == GEMM_EPI_STORE)) &&
                     gemm_x_map(a, grouped ? a.act_rows : n_tokens, N, &xmap);
    if (grouped) {
        if (a.epi == GEMM_EPI_STORE)
            return tma ? gemm_wg_go<N, 1, GEMM_EPI_STORE, true>(a, n_tokens, xmap, s)
                       : gemm_wg_go<N, 2, GEMM_EPI_STORE, true>(a, n_tokens, xmap, s);
        if (a.epi == GEMM_EPI_SWIGLU)
            return gemm_wg_go<N, 2, GEMM_EPI_SWIGLU, true>(a, n_tokens, xmap, s);
        return cudaErrorInvalidValue;
    }
    switch (a.epi) {
    case GEMM_EPI_STORE:
        return tma ? gemm_wg_go<N, 1, GEMM_EPI_STORE, false>(a, n_tokens, xmap, s)
                   : gemm_wg_go<N, 2, GEMM_EPI_STORE, false>(a, n_tokens, xmap, s);
    case GEMM_EPI_ADD:
        return tma ? gemm_wg_go<N, 1, GEMM_EPI_ADD, false>(a, n_tokens, xmap, s)
                   : gemm_wg_go<N, 2, GEMM_EPI_ADD, false>(a, n_tokens, xmap, s);
    case GEMM_EPI_SWIGLU:
        return tma ? gemm_wg_go<N, 1, GEMM_EPI_SWIGLU, false>(a, n_tokens, xmap, s)
                   : gemm_wg_go<N, 2, GEMM_EPI_SWIGLU, false>(a, n_tokens, xmap, s);
    default: return cudaErrorInvalidValue;
    }
}

/* 1 in the sm_90a image (the real kernel), 0 in every other image (the stub): the value of the image
 * the runtime loaded for this device. */
__device__ int g_gemm_wg_real =
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    1;
#else
    0;
#endif

bool gemm_wgmma_available(void)
{
    static int avail = -1;
    if (avail < 0) {
        int real = 0;
        const cudaError_t read = cudaMemcpyFromSymbol(&real, g_gemm_wg_real, sizeof real);
        avail = cuda_sm90a_image(read, real);
    }
    return avail == 1;
}

cudaError_t launch_gemm_wgmma(const gemm_args &a, int n_tokens, bool grouped, int T, cudaStream_t s)
{
    if (a.m[0].bits != 4 || (T != 64 && T != 128))
        return cudaErrorInvalidValue;
    return T == 64 ? gemm_wg_epi<64>(a, n_tokens, grouped, s) : gemm_wg_epi<128>(a, n_tokens, grouped, s);
}
