/* launch_chain.cu — how long one kernel boundary costs on this GPU, the floor under lily's decode step
 * (~260 dependent kernels per token). Standalone (not part of the CMake build):
 *   nvcc -O2 -arch=sm_90a -o launch_chain bench/cuda/launch_chain.cu && ./launch_chain
 * Measures, for chains of N dependent kernels captured in one CUDA graph and replayed:
 *   - plain launches vs programmatic dependent launch (PDL: griddepcontrol.launch_dependents first,
 *     griddepcontrol.wait before reading the predecessor's output), grids of 1, 132 and 264 blocks;
 *   - the same number of grid-wide barriers inside one persistent kernel (a sense-reversing atomic
 *     barrier over co-resident blocks), the alternative a per-layer persistent kernel would pay;
 *   - the same number of cluster barriers (barrier.cluster, sm_90) in one kernel of thread-block clusters of
 *     2..16 blocks, each step handing a value to the next block of the cluster through distributed shared
 *     memory: what a chain costs whose dependencies stay inside a cluster (a head's or an expert's blocks).
 * Each kernel does a dependent read-modify-write of one value, so the chain is a real dependency chain.
 */
#include <cstdio>
#include <cstdlib>
#include <cooperative_groups.h>
#include <cuda_runtime.h>

namespace cg = cooperative_groups;

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

/* ms of `reps` calls of launch() (each returning a cudaError_t) in stream s, after the calls before it. */
template <class F>
static int time_reps(cudaStream_t s, int reps, F launch, float *ms)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a, s));
    for (int r = 0; r < reps; r++)
        CK(launch());
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(ms, a, b));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return 0;
}

/* n_steps dependent steps inside each cluster: block r reads block r+1's value — from its shared memory
 * (DSMEM), or (GLOBAL) from global memory through L2 as a stage's activations would come — adds one and
 * stores it in its own double-buffered slot; one cluster barrier (release / acquire) per step. */
template <bool GLOBAL>
__global__ void cluster_kernel(float *out, float *gbuf, int n_steps)
{
    __shared__ float val[2];
    cg::cluster_group cl = cg::this_cluster();
    const unsigned int rank = cl.block_rank(), nb = cl.num_blocks();
    float *mine = gbuf + 2 * blockIdx.x, *next = gbuf + 2 * (blockIdx.x - rank + (rank + 1) % nb);
    if (threadIdx.x == 0) {
        val[0] = val[1] = 0.0f;
        if (GLOBAL)
            mine[0] = mine[1] = 0.0f;
    }
    cl.sync();
    for (int b = 0; b < n_steps; b++) {
        if (threadIdx.x == 0) {
            if (GLOBAL) {
                mine[(b + 1) & 1] = __ldcg(next + (b & 1)) + 1.0f;
            } else {
                const float *peer = cl.map_shared_rank(&val[b & 1], (rank + 1) % nb);
                val[(b + 1) & 1] = *peer + 1.0f;
            }
        }
        cl.sync();
    }
    if (threadIdx.x == 0 && rank == 0)
        out[blockIdx.x / nb] = GLOBAL ? mine[n_steps & 1] : val[n_steps & 1];
}

template <bool GLOBAL>
static int time_cluster(int n, int csize, int sms, float *d_v, float *d_g, cudaStream_t s, double *us_per_step, int *grid)
{
    CK(cudaFuncSetAttribute(cluster_kernel<GLOBAL>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = csize;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.blockDim = dim3(256);
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cfg.gridDim = dim3(csize);
    int clusters = 0;
    CK(cudaOccupancyMaxActiveClusters(&clusters, cluster_kernel<GLOBAL>, &cfg));
    clusters = clusters < sms / csize ? clusters : sms / csize; /* at most one block per SM */
    if (clusters < 1)
        return *grid = 0, 0;
    cfg.gridDim = dim3(clusters * csize);
    *grid = clusters * csize;
    CK(cudaLaunchKernelEx(&cfg, cluster_kernel<GLOBAL>, d_v, d_g, n));
    const int reps = 20;
    float ms = 0;
    if (time_reps(s, reps, [&] { return cudaLaunchKernelEx(&cfg, cluster_kernel<GLOBAL>, d_v, d_g, n); }, &ms))
        return 1;
    *us_per_step = ms * 1e3 / reps / n;
    float first = 0;
    CK(cudaMemcpy(&first, d_v, sizeof first, cudaMemcpyDeviceToHost));
    if (first != (float)n) /* every step added one along the cluster's ring */
        fprintf(stderr, "cluster chain of %d: got %.0f, want %d\n", csize, first, n);
    return 0;
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
    const int reps = 20;
    float ms = 0;
    if (time_reps(s, reps, [&] { return cudaGraphLaunch(exec, s); }, &ms))
        return 1;
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
        barrier_kernel<<<bgrids[g], 256, 0, s>>>(d_v, d_bar, d_bar + 1, n);
        const int reps = 20;
        float ms = 0;
        if (time_reps(s, reps, [&] {
                barrier_kernel<<<bgrids[g], 256, 0, s>>>(d_v, d_bar, d_bar + 1, n);
                return cudaGetLastError();
            }, &ms))
            return 1;
        printf("| grid barrier in one persistent kernel | %d | %.2f |\n", bgrids[g], ms * 1e3 / reps / n);
    }
    float *d_g;
    CK(cudaMalloc(&d_g, sizeof(float) * 2 * sms));
    for (int global = 0; global < 2; global++)
        for (int c = 2; c <= 16; c *= 2) {
            double us = 0;
            int grid = 0;
            if ((global ? time_cluster<true>(n, c, sms, d_v, d_g, s, &us, &grid)
                        : time_cluster<false>(n, c, sms, d_v, d_g, s, &us, &grid)))
                return 1;
            if (grid)
                printf("| cluster barrier, hand-off through %s, clusters of %d | %d | %.3f |\n",
                       global ? "global memory (L2)" : "distributed shared memory", c, grid, us);
            else
                printf("| clusters of %d: none fit |\n", c);
        }
    CK(cudaGetLastError());
    return 0;
}
