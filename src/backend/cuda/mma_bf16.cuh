/* mma_bf16.cuh — the PTX wrappers the bf16 tensor-core kernels share (attention/, deltanet/; sm_80+):
 * cp.async 16-byte copies, ldmatrix (plain and transposed), mma.sync
 * m16n8k16 with bf16 inputs and fp32 accumulators, and fp32 -> bf16x2 packing.
 */
#ifndef LILY_MMA_BF16_CUH
#define LILY_MMA_BF16_CUH

#include "cuda_common.cuh"

__device__ __forceinline__ unsigned int smem_addr(const void *p)
{
    return (unsigned int)__cvta_generic_to_shared(p);
}

/* 16-byte async copy; src_bytes 0 zero-fills the destination without reading (src must still be valid) */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* four 8x8 bf16 matrices; lanes 8i..8i+7 give the row addresses of matrix i; register i = matrix i,
 * lane l holds row l/4, columns 2(l%4), 2(l%4)+1 (.trans: column l/4, rows 2(l%4), 2(l%4)+1) */
__device__ __forceinline__ void ldsm_x4(unsigned int (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned int (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}

/* c (16x8 fp32) += a (16x16 bf16, row) * b (16x8 bf16, col).
 * lane l, g = l/4, q = l%4: a0 = A[g][2q..2q+1], a1 = A[g+8][2q..], a2 = A[g][2q+8..], a3 = A[g+8][2q+8..];
 * b0 = B[2q..2q+1][g], b1 = B[2q+8..2q+9][g]; c0,c1 = C[g][2q..2q+1], c2,c3 = C[g+8][2q..2q+1]. */
__device__ __forceinline__ void mma_bf16(float (&c)[4], const unsigned int (&a)[4], unsigned int b0, unsigned int b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* two fp32 -> packed bf16x2 (lo in the low half), round to nearest even; also returns the rounded values */
__device__ __forceinline__ unsigned int pack_bf16(float lo, float hi, float &lo_r, float &hi_r)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    lo_r = __low2float(v);
    hi_r = __high2float(v);
    return *reinterpret_cast<unsigned int *>(&v);
}

#endif
