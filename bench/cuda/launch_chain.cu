/* launch_chain.cu — how long one kernel boundary costs on this GPU, the floor under lily's decode step
 * (~260 dependent kernels per token). Standalone (not part of the CMake build):
 *   nvcc -O2 -arch=sm_90a -o launch_chain bench/cuda/launch_chain.cu && ./launch_chain
 * Measures, for chains of N dependent kernels captured in one CUDA graph and replayed:
 *   - plain launches vs programmatic dependent launch (PDL: griddepcontrol.launch_dependents first,
 *     griddepcontrol.wait before reading the predecessor's output), grids of 1, 132 and 264 blocks;
 *   - the same number of grid-wide barriers inside one persistent kernel (a sense-reversing atomic
 *     barrier over co-resident blocks), the alternative a per-layer persistent kernel would pay.
 * Each kernel does a dependent read-modify-write of one value, so the chain is a real dependency chain.
 */
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CK(x)                                                                                           \
    do {                                                                                                \
        cudaError_t e_ = (x);                                                                           \
        if (e_ != cudaSuccess) {                                                                        \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));         \
            return 1;                                                                                   \
        }                                                                                               \
    } while (0)

__global__ void chain_kernel(float *v, int i, int pdl)
{
    if (pdl) {
        asm volatile("griddepcontrol.launch_dependents;" :::);
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
    if (blockIdx.x == 0 && threadIdx.x == 0)
        v[i + 1] = v[i] + 1.0f;
}

/* n_barriers grid-wide barriers; gridDim.x blocks must be co-resident (checked by the host). */
__global__ void barrier_kernel(float *v, unsigned int *count, volatile unsigned int *gen, int n_barriers)
{
    for (int b = 0; b < n_barriers; b++) {
        if (blockIdx.x == 0 && threadIdx.x == 0)
            v[b + 1] = v[b] + 1.0f;
        __syncthreads();
        if (threadIdx.x == 0) {
            const unsigned int g = *gen;
            __threadfence();
            if (atomicAdd(count, 1) == gridDim.x - 1) {
                *count = 0;
                __threadfence();
                *gen = g + 1;
            } else {
                while (*gen == g)
                    ;
            }
            __threadfence();
        }
        __syncthreads();
    }
}

static int time_chain(int n, int blocks, int pdl, float *d_v, cudaStream_t s, double *us_per_kernel)
{
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < n; i++) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        cfg.gridDim = dim3(blocks);
        cfg.blockDim = dim3(256);
        cfg.stream = s;
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = pdl ? 1 : 0;
        CK(cudaLaunchKernelEx(&cfg, chain_kernel, d_v, i, pdl));
    }
    CK(cudaStreamEndCapture(s, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int w = 0; w < 3; w++)
        CK(cudaGraphLaunch(exec, s));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const int reps = 20;
    CK(cudaEventRecord(a, s));
    for (int r = 0; r < reps; r++)
        CK(cudaGraphLaunch(exec, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    *us_per_kernel = ms * 1e3 / reps / n;
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    return 0;
}

int main(void)
{
    const int n = 256;
    float *d_v;
    unsigned int *d_bar;
    cudaStream_t s;
    CK(cudaMalloc(&d_v, sizeof(float) * (n + 8)));
    CK(cudaMalloc(&d_bar, 2 * sizeof(unsigned int)));
    CK(cudaMemset(d_v, 0, sizeof(float) * (n + 8)));
    CK(cudaMemset(d_bar, 0, 2 * sizeof(unsigned int)));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    printf("| chain of %d dependent kernels in one graph | blocks | us per kernel |\n|---|---:|---:|\n", n);
    const int grids[3] = {1, sms, 2 * sms};
    for (int pdl = 0; pdl < 2; pdl++)
        for (int g = 0; g < 3; g++) {
            double us = 0;
            if (time_chain(n, grids[g], pdl, d_v, s, &us))
                return 1;
            printf("| %s | %d | %.2f |\n", pdl ? "PDL" : "plain", grids[g], us);
        }
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, barrier_kernel, 256, 0));
    const int bgrids[2] = {sms, 2 * sms};
    for (int g = 0; g < 2; g++) {
        if (bgrids[g] > per_sm * sms)
            continue;
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        barrier_kernel<<<bgrids[g], 256, 0, s>>>(d_v, d_bar, d_bar + 1, n);
        CK(cudaEventRecord(a, s));
        const int reps = 20;
        for (int r = 0; r < reps; r++)
            barrier_kernel<<<bgrids[g], 256, 0, s>>>(d_v, d_bar, d_bar + 1, n);
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        printf("| grid barrier in one persistent kernel | %d | %.2f |\n", bgrids[g], ms * 1e3 / reps / n);
    }
    CK(cudaGetLastError());
    return 0;
}
