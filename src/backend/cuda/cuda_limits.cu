/* cuda_limits.cu — the hardware ceilings `lily bench` reports speed against (lily_hw_limits, backend.h), measured on
 * the GPU: device-to-device copy bandwidth (bytes read + written), the dense fp16 tensor-core rate of
 * mma.sync m16n8k16 (the instruction lily's prefill GEMMs and decode GEMVs use; Hopper's wgmma peak is
 * higher), and device memory in use.
 */
#include <stdio.h>
#include <string.h>

#include "cuda_backend.h"
#include "cuda_common.cuh"
#include "mma_common.cuh"

#include "cuda_internal.cuh"

extern "C" lily_status lily_cuda_membw(int device, size_t bytes, int reps, double *gbps, lily_error *err)
{
    *gbps = 0;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        cudaGetLastError();
        return lily_error_set(err, LILY_ERR_BACKEND, "cuda: no usable NVIDIA GPU/driver found");
    }
    CUDA_TRY(cudaSetDevice(device));
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    lily_status rs = LILY_OK;
    cudaError_t e;
#define CK(call)                                                                                   \
    do {                                                                                           \
        if ((e = (call)) != cudaSuccess) {                                                         \
            rs = lily_cuda_error(err, e, #call, __FILE__, __LINE__);                               \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice)); /* warm-up */
    CK(cudaEventRecord(e0));
    for (int i = 0; i < reps; i++)
        CK(cudaMemcpyAsync((i & 1) ? a : b, (i & 1) ? b : a, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    {
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        *gbps = 2.0 * (double)bytes * reps / (ms * 1e-3) / 1e9;
    }
done:
#undef CK
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return rs;
}

/* Each warp runs `iters` rounds of 8 independent mma.sync m16n8k16 (register operands only). */
#define RATE_CHAINS 8
__global__ void __launch_bounds__(256) mma_rate_kernel(int iters, float *sink)
{
    float d[RATE_CHAINS][4];
#pragma unroll
    for (int k = 0; k < RATE_CHAINS; k++)
        d[k][0] = d[k][1] = d[k][2] = d[k][3] = 0.0f;
    const uint32_t a0 = 0x3C003C00u + threadIdx.x; /* ~1.0 in fp16, varied so nothing folds */
    const uint32_t A[4] = {a0, a0 ^ 1u, a0 ^ 2u, a0 ^ 3u};
    for (int i = 0; i < iters; i++) {
#pragma unroll
        for (int k = 0; k < RATE_CHAINS; k++)
            mma16816(d[k], A, a0, a0 ^ (uint32_t)k);
    }
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < RATE_CHAINS; k++)
        s += d[k][0] + d[k][1] + d[k][2] + d[k][3];
    if (s == 12345.678f) /* never true in practice; keeps the work */
        sink[threadIdx.x] = s;
}

/* Dense fp16 tensor-core rate of mma.sync (FLOP/s, 2 per multiply-add), best of 3 timed launches. */
static lily_status mma_rate(int device, double *flops, lily_error *err)
{
    *flops = 0;
    int sms = 0;
    CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    float *sink = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    CUDA_TRY(cudaMalloc(&sink, 256 * sizeof(float)));
    cudaError_t e = cudaEventCreate(&e0);
    if (e == cudaSuccess)
        e = cudaEventCreate(&e1);
    const int blocks = sms * 4, iters = 4096;
    for (int rep = 0; rep < 4 && e == cudaSuccess; rep++) {
        e = cudaEventRecord(e0);
        if (e == cudaSuccess) {
            mma_rate_kernel<<<blocks, 256>>>(iters, sink);
            e = cudaGetLastError();
        }
        if (e == cudaSuccess)
            e = cudaEventRecord(e1);
        if (e == cudaSuccess)
            e = cudaEventSynchronize(e1);
        float ms = 0;
        if (e == cudaSuccess)
            e = cudaEventElapsedTime(&ms, e0, e1);
        const double f = (double)blocks * 8 * iters * RATE_CHAINS * (2.0 * 16 * 8 * 16) / (ms * 1e-3);
        if (e == cudaSuccess && rep > 0 && f > *flops) /* rep 0 is the warm-up */
            *flops = f;
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(sink);
    if (e != cudaSuccess)
        return lily_cuda_error(err, e, "mma rate", __FILE__, __LINE__);
    return LILY_OK;
}

extern "C" lily_status lily_cuda_device_memory(int device, size_t *used, size_t *total, lily_error *err)
{
    size_t free_b = 0, total_b = 0;
    CUDA_TRY(cudaSetDevice(device));
    CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    *used = total_b - free_b;
    *total = total_b;
    return LILY_OK;
}

/* The backend's measure_limits op (backend.h). */
lily_status cuda_measure_limits(int device, lily_hw_limits *out, lily_error *err)
{
    memset(out, 0, sizeof *out);
    double gbps = 0;
    lily_status st = lily_cuda_membw(device, (size_t)2 << 30, 20, &gbps, err);
    if (st != LILY_OK)
        return st;
    cudaDeviceProp p;
    CUDA_TRY(cudaGetDeviceProperties(&p, device));
    snprintf(out->device, sizeof out->device, "%.200s (%d SMs, %.0f GiB)", p.name, p.multiProcessorCount,
             p.totalGlobalMem / 1073741824.0);
    out->copy_bytes_per_s = gbps * 1e9;
    out->bandwidth = out->copy_bytes_per_s;
    st = mma_rate(device, &out->matmul_flops_per_s, err);
    if (st != LILY_OK)
        return st;
    snprintf(out->matmul_kind, sizeof out->matmul_kind, "fp16 mma.sync m16n8k16 (tensor cores)");
    return LILY_OK;
}
