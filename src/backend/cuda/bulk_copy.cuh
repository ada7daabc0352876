/* bulk_copy.cuh — sm_90 bulk copies from global to shared memory completing on an mbarrier (PTX ISA 8.0,
 * cp.async.bulk / mbarrier), and the shared-memory layout of one staged 16-row tile of a 4-bit matrix, as
 * the streamed decode GEMV (gemv/gemv_stream.cu) and MoE gate/up (moe/moe_decode.cu) stage their weights.
 *
 * Staged tile of `cols` columns: row r (0..15) at r * (cols / 2 + BULK_ROW_PAD) bytes (the pad puts rows g
 * and g + 1 of a quarter-warp's 16-byte reads in different banks: mg_load_smem), then the 16 rows' bf16
 * scales (16 x cols / 64), then their biases, as in global memory. One bulk copy per row and one each for
 * the scales and the biases.
 *
 * The asm below exists only on sm_90 and later: call these only from code compiled for __CUDA_ARCH__ >= 900.
 */
#ifndef LILY_BULK_COPY_CUH
#define LILY_BULK_COPY_CUH

#include <stdint.h>

#define BULK_ROW_PAD 64 /* bytes after each staged row */

/* Bytes of one staged 16-row tile of `cols` 4-bit columns: padded rows, scales, biases. */
__host__ __device__ __forceinline__ int bulk_tile_bytes(int cols) { return 16 * (cols / 2 + BULK_ROW_PAD) + 16 * (cols / 64) * 4; }

__device__ __forceinline__ uint32_t bulk_saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* An mbarrier expecting `count` arrivals, before the copies that complete on it; then bulk_mbar_init_fence
 * (the initialisation visible to the copies) and a block barrier before other threads use it. */
__device__ __forceinline__ void bulk_mbar_init(uint64_t *bar, unsigned int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bulk_saddr(bar)), "r"(count) : "memory");
}

/* Orders this thread's bulk_mbar_init before the bulk copies that complete on those mbarriers. */
__device__ __forceinline__ void bulk_mbar_init_fence(void) { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

/* One arrival that also expects `bytes` more of transaction count (the copies' complete_tx). */
__device__ __forceinline__ void bulk_mbar_expect_tx(uint64_t *bar, unsigned int bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bulk_saddr(bar)), "r"(bytes) : "memory");
}

/* Wait until the phase of parity `parity` has completed (acquire: the copied bytes are visible). */
__device__ __forceinline__ void bulk_mbar_wait(uint64_t *bar, unsigned int parity)
{
    unsigned int done = 0;
    while (!done)
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bulk_saddr(bar)), "r"(parity)
                     : "memory");
}

/* bytes (a multiple of 16, both addresses 16-byte aligned) from global src to shared dst, completing on bar. */
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, unsigned int bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(bulk_saddr(dst)),
                 "l"(src), "r"(bytes), "r"(bulk_saddr(bar))
                 : "memory");
}

#endif
