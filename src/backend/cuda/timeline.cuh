/* timeline.cuh — in-kernel timeline stamps of the decode kernels (bench_cuda_decode --timeline).
 *
 * A kernel that takes a timeline pointer (the `timeline` field of its argument struct: gemv_batch,
 * gdn_args, attn_args, moe_args) records, per block, TL_WORDS 64-bit words at timeline + TL_WORDS * b
 * (b = the linear block index, blocks >= TL_MAX_BLOCKS unrecorded):
 *   [0] %globaltimer (ns) when thread 0 enters the kernel,
 *   [1] %globaltimer when thread 0 has passed the PDL wait (griddepcontrol.wait),
 *   [2] %globaltimer when the block's last warp leaves the kernel (atomicMax of every warp's lane 0),
 *   [3] the SM the block ran on (%smid),
 *   [4] %globaltimer when thread 0 reached the kernel's mark() (GEMVs and the MoE kernels: x ready in shared
 *       memory; 0 in kernels without one).
 * The buffer is zeroed before each step (word 2 is a running maximum). A NULL pointer (every launch outside
 * the timeline bench) costs one uniform branch per stamp. The attention launch records the split-KV kernel
 * at `timeline` and its merge kernel in the next slot (timeline + TL_SLOT_WORDS).
 */
#ifndef LILY_CUDA_TIMELINE_CUH
#define LILY_CUDA_TIMELINE_CUH

#define TL_WORDS 5
#define TL_MAX_BLOCKS 1024
#define TL_SLOT_WORDS (TL_WORDS * TL_MAX_BLOCKS) /* one kernel's records */

__device__ __forceinline__ unsigned long long tl_globaltimer(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned int tl_smid(void)
{
    unsigned int s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}

/* The linear index of this block's record, or -1 when it is past TL_MAX_BLOCKS. */
__device__ __forceinline__ int tl_block_index(void)
{
    const unsigned int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    return b < TL_MAX_BLOCKS ? (int)b : -1;
}

/* The stamps of one block: constructed first thing in the kernel from the argument struct's pointer (a
 * kernel parameter: kept by reference, so no register holds it through the kernel) (entry stamp),
 * waited() right after the kernel's pdl_wait(), mark() at a kernel-specific point, the exit stamp by the
 * destructor on every return path. */
template <int SLOT = 0> /* the kernel's slot after the pointer's (the attention merge: 1) */
struct tl_block {
    unsigned long long *const &tl;
    __device__ __forceinline__ explicit tl_block(unsigned long long *const &param) : tl(param)
    {
        if (tl && threadIdx.x == 0 && tl_block_index() >= 0) {
            unsigned long long *rec = tl + (size_t)SLOT * TL_SLOT_WORDS + (size_t)TL_WORDS * tl_block_index();
            rec[0] = tl_globaltimer();
            rec[3] = tl_smid();
        }
    }
    __device__ __forceinline__ void waited() const
    {
        if (tl && threadIdx.x == 0 && tl_block_index() >= 0)
            tl[(size_t)SLOT * TL_SLOT_WORDS + (size_t)TL_WORDS * tl_block_index() + 1] = tl_globaltimer();
    }
    __device__ __forceinline__ void mark() const
    {
        if (tl && threadIdx.x == 0 && tl_block_index() >= 0)
            tl[(size_t)SLOT * TL_SLOT_WORDS + (size_t)TL_WORDS * tl_block_index() + 4] = tl_globaltimer();
    }
    __device__ __forceinline__ ~tl_block()
    {
        if (tl && (threadIdx.x & 31) == 0 && tl_block_index() >= 0)
            atomicMax(tl + (size_t)SLOT * TL_SLOT_WORDS + (size_t)TL_WORDS * tl_block_index() + 2, tl_globaltimer());
    }
    tl_block(const tl_block &) = delete;
    tl_block &operator=(const tl_block &) = delete;
};

/* timeline.cu: the resolution of %globaltimer on this GPU, read back-to-back by one thread: *step_ns the
 * smallest nonzero increment seen, *update_ns the mean time between changes, *cycles_per_update the SM
 * clock cycles (clock64) between changes. Synchronizes the stream. */
cudaError_t tl_timer_resolution(cudaStream_t s, double *step_ns, double *update_ns, double *cycles_per_update);

#endif
