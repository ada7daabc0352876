/* bulk_copy.cuh — sm_90 bulk copies (cp.async.bulk, PTX ISA 8.0) into shared memory completing on
 * mbarriers, and the padded shared-memory layout of one 16-row tile of a 4-bit matrix that mg_load_smem
 * (mma_gemv.cuh) reads: used by the streamed GEMV's ring (gemv_stream.cu) and by moe_down_mma's staged
 * expert tiles (moe_decode.cu). sm_90 only: in device code for older targets (the compute_80 PTX) the
 * helpers compile to __trap(), so a caller's kernel builds there but must only run where cuda_sm90_code().
 *
 * Tile layout (gs_slot_bytes): 16 rows of row_bytes = cols / 2 bytes, each followed by GS_ROW_PAD bytes
 * (rows g and g + 1 of a quarter-warp's 16-byte reads then fall in different banks), then the tile's
 * scales and its biases as in global memory (bf16, 16 × cols / 64 each).
 */
#ifndef LILY_BULK_COPY_CUH
#define LILY_BULK_COPY_CUH

#include "gemv_common.cuh"

#define GS_ROW_PAD 64 /* bytes after each staged row */
/* 1 where the PTX below may be emitted (sm_90 device code; the host pass never calls the helpers) */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define GS_SM90 1
#else
#define GS_SM90 0
#endif

__device__ __forceinline__ uint32_t gs_saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void gs_mbar_init(uint64_t *bar, unsigned int count)
{
#if GS_SM90
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(gs_saddr(bar)), "r"(count) : "memory");
#else
    __trap();
#endif
}

/* One arrival that also expects `bytes` more of transaction count (the copies' complete_tx). */
__device__ __forceinline__ void gs_mbar_expect_tx(uint64_t *bar, unsigned int bytes)
{
#if GS_SM90
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(gs_saddr(bar)), "r"(bytes) : "memory");
#else
    __trap();
#endif
}

/* Wait until the phase of parity `parity` has completed (acquire: the copied bytes are visible). */
__device__ __forceinline__ void gs_mbar_wait(uint64_t *bar, unsigned int parity)
{
    unsigned int done = 0;
    while (!done)
#if GS_SM90
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(gs_saddr(bar)), "r"(parity)
                     : "memory");
#else
        __trap();
#endif
}

/* bytes (a multiple of 16, both addresses 16-byte aligned) from global src to shared dst, completing on bar. */
__device__ __forceinline__ void gs_bulk_copy(void *dst, const void *src, unsigned int bytes, uint64_t *bar)
{
#if GS_SM90
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(gs_saddr(dst)),
                 "l"(src), "r"(bytes), "r"(gs_saddr(bar))
                 : "memory");
#else
    __trap();
#endif
}

/* Orders gs_mbar_init before bulk copies that other threads issue (with a barrier among them after it). */
__device__ __forceinline__ void gs_mbar_init_fence(void)
{
#if GS_SM90
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
    __trap();
#endif
}

/* Bytes of one staged tile of `cols` columns (padded rows, scales, biases). */
__host__ __device__ __forceinline__ int gs_slot_bytes(int cols) { return 16 * (cols / 2 + GS_ROW_PAD) + 16 * (cols / 64) * 4; }

/* One warp copies rows r0 .. r0 + nrows - 1 (physical rows of W, experts folded in; nrows <= 16) into the
 * tile at `slot` (gs_slot_bytes(cols) bytes, 16-byte aligned; row_bytes = cols / 2, ws = row_bytes +
 * GS_ROW_PAD, gpr = cols / 64 passed in as the caller has them): lane 0 arms `bar` with the bytes, then
 * lanes 0..nrows-1 copy one row each, lane 16 the scales, lane 17 the biases (18 bulk copies). Requires
 * W.row_bytes % 16 == 0 and 16-byte aligned data / scales / biases rows (2 · gpr · r0 % 16 == 0).
 * Completion: gs_mbar_wait(bar, phase parity); the tile is then read with mg_load_smem(slot, ws,
 * slot + 16 · ws, slot + 16 · ws + 32 · gpr, ...). */
__device__ __forceinline__ void gs_fill_tile(unsigned char *slot, const dmat &W, int r0, int nrows, int row_bytes, int ws,
                                             int gpr, uint64_t *bar, int lane)
{
    if (lane == 0)
        gs_mbar_expect_tx(bar, (unsigned int)(nrows * (row_bytes + 4 * gpr)));
    __syncwarp();
    if (lane < nrows)
        gs_bulk_copy(slot + lane * ws, W.data + (int64_t)(r0 + lane) * W.row_bytes, row_bytes, bar);
    else if (lane == 16)
        gs_bulk_copy(slot + 16 * ws, W.scales + (int64_t)r0 * gpr, nrows * gpr * 2, bar);
    else if (lane == 17)
        gs_bulk_copy(slot + 16 * ws + 32 * gpr, W.biases + (int64_t)r0 * gpr, nrows * gpr * 2, bar);
}

#endif
