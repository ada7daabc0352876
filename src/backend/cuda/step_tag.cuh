/* step_tag.cuh — tagged words: the fine-grained dependencies of a decode forward call. A producer writes a
 * 64-bit word whose tag names the forward call and layer; a consumer polls until the word carries its own
 * call's tag. Words that hold an older call's tag (or zero, after a reset or load) never match, so nothing is
 * reset between calls. The words live in the session's cuda_counters and are copied with them, so a restored
 * state never sees tags ahead of its step counter. Used by the MoE top-k and router logits (moe_topk.cuh) and
 * by the DeltaNet in_proj tiles that the scan polls (gemv_stream.cu, deltanet_decode.cu).
 */
#ifndef LILY_CUDA_STEP_TAG_CUH
#define LILY_CUDA_STEP_TAG_CUH

/* The tag of layer (< 256) in the forward call made at counter value step: (step + 1) << 8 | layer. Zero
 * never matches; it wraps only after 2^24 forward calls. */
__device__ __forceinline__ unsigned int step_tag(int step, int layer)
{
    return (((unsigned int)step + 1u) << 8) | ((unsigned int)layer & 255u);
}
__device__ __forceinline__ void st_relaxed_u64(unsigned long long *p, unsigned long long v)
{
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long ld_relaxed_u64(const unsigned long long *p)
{
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release_u64(unsigned long long *p, unsigned long long v)
{
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long ld_acquire_u64(const unsigned long long *p)
{
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

#endif
