/* deltanet_chunked.cuh — the chunked delta rule's (deltanet_chunked.cu) chunk geometry, WY record layout
 * and 3xTF32 mma.sync helpers (see deltanet_chunked.cu's header for the math and the fragment layouts). */
#ifndef LILY_DELTANET_CHUNKED_CUH
#define LILY_DELTANET_CHUNKED_CUH

#include "backend/cuda/mma_bf16.cuh"
#include "deltanet.cuh"

#define GDC_C 64       /* chunk length */
#define GDC_THREADS 256
#define GDC_COLS 32    /* state columns per block of gdn_chunk_state_kernel */
#define GDC_ALD 68     /* ld of the 64x64 shared matrices (≡ 4 mod 32: conflict-free A fragments) */
#define GDC_VLD 40     /* ld of 32-column shared matrices used as B (≡ 8 mod 32) */

__host__ __device__ __forceinline__ static int record_floats(int dk, int dv)
{
    return GDC_C * (dk + dv) + GDC_C * GDC_C + 2 * GDC_C;
}
/* ---- 3xTF32 tensor-core helpers ---------------------------------------------------------------- */

struct frag_a {
    uint32_t h[4], l[4];
};
struct frag_b {
    uint32_t h[2], l[2];
};

/* x = hi + lo as two tf32 values: hi rounded to nearest (ties away) by one add + one mask on the bits (finite
 * inputs), lo = x - hi (exact in fp32) truncated to tf32 by a mask (error 2^-21 of |x|, against the 2^-22
 * of the a_lo·b_lo term that mma3 drops anyway). */
static __device__ __forceinline__ void split_tf32(float x, uint32_t &hi, uint32_t &lo)
{
    hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi)) & 0xffffe000u;
}

static __device__ __forceinline__ void set_a(frag_a &f, float a0, float a1, float a2, float a3)
{
    split_tf32(a0, f.h[0], f.l[0]);
    split_tf32(a1, f.h[1], f.l[1]);
    split_tf32(a2, f.h[2], f.l[2]);
    split_tf32(a3, f.h[3], f.l[3]);
}
static __device__ __forceinline__ void set_b(frag_b &f, float b0, float b1)
{
    split_tf32(b0, f.h[0], f.l[0]);
    split_tf32(b1, f.h[1], f.l[1]);
}

/* A tile (16 x 8) of a row-major matrix at p (leading dimension ld) */
static __device__ __forceinline__ void load_a(frag_a &f, const float *p, int ld, int g, int t)
{
    set_a(f, p[g * ld + t], p[(g + 8) * ld + t], p[g * ld + t + 4], p[(g + 8) * ld + t + 4]);
}
/* B tile (8 x 8) of a matrix stored pre-split: hi parts at ph, lo parts at pl (same layout) */
static __device__ __forceinline__ void load_b_split(frag_b &f, const uint32_t *ph, const uint32_t *pl, int ld, int g, int t)
{
    f.h[0] = ph[t * ld + g], f.h[1] = ph[(t + 4) * ld + g];
    f.l[0] = pl[t * ld + g], f.l[1] = pl[(t + 4) * ld + g];
}
/* x split once into the hi/lo arrays */
static __device__ __forceinline__ void store_split(uint32_t *ph, uint32_t *pl, int i, float x)
{
    uint32_t h, l;
    split_tf32(x, h, l);
    ph[i] = h, pl[i] = l;
}

static __device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
/* d += a·b, small terms first; a_lo·b_lo (2^-22 relative) dropped */
static __device__ __forceinline__ void mma3(float (&d)[4], const frag_a &a, const frag_b &b)
{
    mma_tf32(d, a.l, b.h);
    mma_tf32(d, a.h, b.l);
    mma_tf32(d, a.h, b.h);
}

#endif
