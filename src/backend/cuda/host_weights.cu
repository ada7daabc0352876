/* host_weights.cu — weights kept in host memory that the kernels read over PCIe (--n-cpu-moe): pinned
 * host allocations mapped into the device's address space (zero-copy). A kernel's load from such a
 * pointer crosses the bus each time, so only the bytes a launch touches move: in decode, the selected
 * experts' rows; the results are the all-device ones bit for bit, since the same kernels run.
 *
 * Write-combined: the host only writes these pages, once at upload; the device's reads skip the host's
 * caches (CUDA C Programming Guide, "Write-Combining Memory").
 */
#include "cuda_internal.cuh"

lily_status cuda_host_weight_alloc(size_t bytes, void **host, void **device, lily_error *err)
{
    *host = *device = NULL;
    CUDA_TRY(cudaHostAlloc(host, bytes ? bytes : 16,
                           cudaHostAllocMapped | cudaHostAllocPortable | cudaHostAllocWriteCombined));
    const cudaError_t e = cudaHostGetDevicePointer(device, *host, 0);
    if (e != cudaSuccess) {
        cudaFreeHost(*host);
        *host = NULL;
        CUDA_TRY(e);
    }
    return LILY_OK;
}

bool cuda_layer_experts_on_host(const cuda_ctx *c, int layer)
{
    return layer < c->opts.n_cpu_moe;
}
