/* mma_common.cuh — the tensor-core instruction the CUDA kernels share (sm_80+): mma.sync m16n8k16 with
 * fp16 A/B fragments and fp32 accumulators, and the fp16x2 <-> bit-pattern moves around it.
 *
 * Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16"), g = lane / 4, t = lane % 4:
 *   A (16 x 16, row major): a0 = (row g, k 2t..2t+1), a1 = (row g+8, k 2t..), a2 = (row g, k 2t+8..),
 *                           a3 = (row g+8, k 2t+8..);  the lower half of a register is the lower k.
 *   B (16 x 8):             b0 = (k 2t..2t+1, col g), b1 = (k 2t+8..2t+9, col g).
 *   C/D (16 x 8, fp32):     c0 = (row g, col 2t), c1 = (row g, col 2t+1), c2/c3 = the same for row g+8.
 */
#ifndef LILY_MMA_COMMON_CUH
#define LILY_MMA_COMMON_CUH

#include <cuda_fp16.h>
#include <stdint.h>

/* d += a · b, m16n8k16, fp16 inputs, fp32 accumulators */
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t *>(&h); }
__device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *reinterpret_cast<__half2 *>(&u); }

#endif
