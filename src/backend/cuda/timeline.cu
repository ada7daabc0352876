/* timeline.cu — the %globaltimer resolution probe of the timeline bench (timeline.cuh). */
#include "timeline.cuh"

#include "cuda_common.cuh"

#define TL_PROBE_READS 200000

/* out: [0] smallest nonzero step (ns), [1] changes seen, [2] first..last span (ns), [3] clock64 cycles over it */
__global__ void tl_probe_kernel(unsigned long long *out)
{
    unsigned long long prev = tl_globaltimer(), first = prev, least = ~0ull, changes = 0;
    const long long c0 = clock64();
    for (int i = 0; i < TL_PROBE_READS; i++) {
        const unsigned long long t = tl_globaltimer();
        if (t != prev) {
            least = t - prev < least ? t - prev : least;
            changes++;
            prev = t;
        }
    }
    out[0] = least;
    out[1] = changes;
    out[2] = prev - first;
    out[3] = (unsigned long long)(clock64() - c0);
}

cudaError_t tl_timer_resolution(cudaStream_t s, double *step_ns, double *update_ns, double *cycles_per_update)
{
    unsigned long long *d = NULL, h[4] = {0, 0, 0, 0};
    cudaError_t e = cudaMalloc((void **)&d, sizeof h);
    if (e != cudaSuccess)
        return e;
    tl_probe_kernel<<<1, 1, 0, s>>>(d);
    e = cudaGetLastError();
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    cudaFree(d);
    if (e != cudaSuccess)
        return e;
    const double changes = h[1] ? (double)h[1] : 1.0;
    *step_ns = h[1] ? (double)h[0] : 0.0;
    *update_ns = (double)h[2] / changes;
    *cycles_per_update = (double)h[3] / changes;
    return cudaSuccess;
}
