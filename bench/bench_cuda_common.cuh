/* bench_cuda_common.cuh — what the standalone CUDA benchmarks (bench/bench_cuda_*.cu) share: a CUDA call that
 * ends the program with the call's text on failure (a benchmark's main, never library code), a fixed-seed
 * xorshift for random weights and inputs, and a host vector copied to a new device buffer. */
#ifndef LILY_BENCH_CUDA_COMMON_CUH
#define LILY_BENCH_CUDA_COMMON_CUH

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#include <cuda_runtime.h>

#define CK(x)                                                                                                  \
    do {                                                                                                       \
        cudaError_t e_ = (x);                                                                                  \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

/* xorshift64, the same sequence in every run (timing does not depend on the values) */
static uint64_t g_rng = 0x243f6a8885a308d3ull;
static inline uint32_t rnd(void)
{
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}

template <typename T> static T *dev_upload(const std::vector<T> &h)
{
    T *d;
    CK(cudaMalloc(&d, h.size() * sizeof(T)));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

#endif
