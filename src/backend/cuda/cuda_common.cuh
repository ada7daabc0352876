/* cuda_common.cuh — what every CUDA kernel file of the backend shares: the error-check macro, the
 * device view of a weight matrix (dmat), warp reductions, activation and dtype helpers, programmatic
 * dependent launch (PDL) and the launch-shape queries. Each op's launchers are declared in its folder's
 * header (gemv/gemv.cuh, gemm/gemm_prefill.cuh, attention/attention.cuh, deltanet/deltanet.cuh,
 * moe/moe.cuh; embed.cuh, sample.cuh).
 *
 * Conventions: activations, residual stream, norms, softmax, DeltaNet state in fp32; weights as
 * uploaded (MLX affine 4/8-bit words with bf16 scale/bias per group of 64, or bf16); KV cache bf16 (fp32 in
 * exact mode, lily_backend_options.exact: then only fp32 kernels run, see the ops' `exact` fields).
 * Every launch wrapper returns cudaError_t (the launch error); the backend turns it into a lily_status.
 */
#ifndef LILY_CUDA_COMMON_CUH
#define LILY_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "lily.h"
}

/* Record a CUDA failure as LILY_ERR_BACKEND / LILY_ERR_OUT_OF_MEMORY naming the call (cuda_backend.cu). */
lily_status lily_cuda_error(lily_error *err, cudaError_t e, const char *call, const char *file, int line);

/* A weight matrix (or a stack of expert matrices) on the device.
 * bits 4/8: data = uint32 words, row r at data + r*row_bytes; scales/biases bf16, cols/64 per row.
 * bits 16: data = bf16 [rows][cols]. Expert e's row r is physical row e*rows + r. */
struct dmat {
    const uint8_t *data;
    const __nv_bfloat16 *scales;
    const __nv_bfloat16 *biases;
    int bits;      /* 4, 8 or 16 */
    int rows;      /* per expert */
    int cols;
    int n_experts; /* 1 for a plain matrix */
    int64_t row_bytes;
};

/* ---- error checking ---------------------------------------------------------------------------- */

/* Evaluate a CUDA runtime call; on failure record "call: error name (text)" in the backend's error
 * and return LILY_ERR_BACKEND (or LILY_ERR_OUT_OF_MEMORY for cudaErrorMemoryAllocation). Used inside
 * functions that have `lily_error *err` in scope. */
#define CUDA_TRY(call)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return lily_cuda_error(err, e_, #call, __FILE__, __LINE__);                            \
    } while (0)

/* ---- device helpers ----------------------------------------------------------------------------- */

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float bf2f(__nv_bfloat16 v) { return __bfloat162float(v); }

/* Programmatic dependent launch (sm_90): kernels are launched with launch_pdl() so the next kernel's
 * blocks may start while this one drains. Every kernel calls pdl_wait() before it reads anything an
 * earlier kernel of the same forward call wrote, or writes anything (only immutable weights, and state
 * last written by an earlier forward call, may be read before it: each forward call begins with a plain
 * launch, embed; the one write before it is the DeltaNet decode's shifted conv history, into the conv-state
 * buffer no kernel of the forward call reads, gdn_decode_warp.cuh), and pdl_trigger() so its own dependent may start — in decode kernels at the very
 * start, so the next kernel's weight prefetch overlaps this one. Both are no-ops when launched without
 * the attribute. */
__device__ __forceinline__ void pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/* cuda_arch.cu: whether the running GPU code was compiled for sm_90 (false on the compute_80 PTX path). */
bool cuda_sm90_code(void);
/* Whether the current device is compute capability 9.0 and runs the sm_90a image of the kernels: the
 * caller reads its own __device__ int that is 1 only in that image (cudaMemcpyFromSymbol must run in the
 * file that defines the symbol: wgmma kernels, gemm_prefill_wgmma.cu, attention_prefill_wg.cu) and passes
 * the read's status and the value. Queries that fail answer false and leave no sticky error. */
bool cuda_sm90a_image(cudaError_t read, int flag);

/* Launch kernel k<<<grid, block, smem, s>>>(args...) with programmatic stream serialization. */
template <typename... KArgs, typename... Args>
static inline cudaError_t launch_pdl(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                     Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    /* programmatic launch needs the sm_90 code (pdl_wait is compiled out of the compute_80 PTX, which
     * every GPU other than compute capability 9.0 runs): plain launches there */
    cfg.numAttrs = cuda_sm90_code() ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, k, ((KArgs)args)...);
    return e != cudaSuccess ? e : cudaGetLastError();
}

/* The number of SMs of the current device in *sms. */
static inline cudaError_t cuda_sm_count(int *sms)
{
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev);
    return e;
}

/* How many blocks of kernel k (threads per block, smem dynamic bytes) fit on the current GPU at once:
 * SMs · max(1, blocks per SM). Asked only while *resident is 0: the caller keeps *resident in a static
 * of its own, one per kernel instance, so each instance asks once. On an error *resident stays 0. */
template <typename K>
static inline cudaError_t cuda_resident_blocks(K k, int threads, size_t smem, int *resident)
{
    if (*resident)
        return cudaSuccess;
    int sms = 0, per_sm = 0;
    cudaError_t e = cuda_sm_count(&sms);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, threads, smem);
    if (e != cudaSuccess)
        return e;
    *resident = sms * (per_sm > 0 ? per_sm : 1);
    return cudaSuccess;
}

/* Opt kernel k in to smem bytes of dynamic shared memory when that is above *smem_set, the amount it is
 * already allowed (the caller's static, one per kernel instance, starting at the 48 KiB default). */
template <typename K>
static inline cudaError_t cuda_smem_opt_in(K k, size_t smem, size_t *smem_set)
{
    if (smem <= *smem_set)
        return cudaSuccess;
    const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    *smem_set = smem;
    return cudaSuccess;
}

/* Order-preserving key of (value, row) for atomicMax: larger value wins, then the lower row. */
__device__ __forceinline__ unsigned long long argmax_key(float v, int row)
{
    unsigned int u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (unsigned long long)(0xffffffffu - (unsigned int)row);
}
__device__ __forceinline__ int argmax_key_row(unsigned long long k)
{
    return (int)(0xffffffffu - (unsigned int)(k & 0xffffffffu));
}

#endif
