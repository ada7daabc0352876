/* cuda_test_util.cuh — helpers shared by the GPU tests in tests/cuda: the seeded LCG random source
 * (rnd_u32, rnd_f, rand_vec), the CK error-check macro, host <-> device copies (dev_copy, host_copy,
 * dev_nan for NaN-poisoned outputs), silu_d and ref_gemv_input (the double-precision twin of the
 * GEMV input transform) and cuda_test_no_device() (the skip at the start of main). Header of static
 * functions, one copy per test (cuda_test_check.cuh adds the shared check()).
 *
 * Each test defines CUDA_TEST_SEED (the start of its own random stream) before including this file,
 * so every test keeps its own, reproducible inputs.
 */
#ifndef LILY_CUDA_TEST_UTIL_CUH
#define LILY_CUDA_TEST_UTIL_CUH

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"

#ifndef CUDA_TEST_SEED
#error "define CUDA_TEST_SEED (the test's random seed) before including cuda_test_util.cuh"
#endif

static unsigned long long g_rng = CUDA_TEST_SEED;

/* 64-bit LCG (Knuth's MMIX constants); the high 32 bits of each step. */
static inline unsigned int rnd_u32(void)
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (unsigned int)(g_rng >> 32);
}
static inline float rnd_f(float lo, float hi) { return lo + (hi - lo) * (rnd_u32() / 4294967296.0f); }
static inline std::vector<float> rand_vec(size_t n, float lo, float hi)
{
    std::vector<float> v(n);
    for (auto &x : v)
        x = rnd_f(lo, hi);
    return v;
}

static inline double silu_d(double x) { return x / (1.0 + exp(-x)); }

/* CPU twin of the GEMV input transform of token t (double): x = a (GEMV_IN_PLAIN), RMSNorm(a) * nw
 * (GEMV_IN_RMSNORM, eps 1e-6), or per head of hd columns RMSNorm(head) * gw * silu(z) (GEMV_IN_GATED);
 * a is the token's row of cols activations, z the [n][cols] gate. */
static inline void ref_gemv_input(int mode, const float *a, int cols, const std::vector<float> &nw,
                                  const std::vector<float> &gw, int hd, const std::vector<float> &z, int t,
                                  std::vector<double> &x)
{
    if (mode == GEMV_IN_RMSNORM) {
        double ss = 0;
        for (int c = 0; c < cols; c++) ss += (double)a[c] * a[c];
        const double r = 1.0 / sqrt(ss / cols + 1e-6);
        for (int c = 0; c < cols; c++) x[c] = a[c] * r * nw[c];
    } else if (mode == GEMV_IN_GATED) {
        for (int h = 0; h < cols / hd; h++) {
            double ss = 0;
            for (int d = 0; d < hd; d++) ss += (double)a[h * hd + d] * a[h * hd + d];
            const double r = 1.0 / sqrt(ss / hd + 1e-6);
            for (int d = 0; d < hd; d++)
                x[h * hd + d] = a[h * hd + d] * r * gw[d] * silu_d(z[(size_t)t * cols + h * hd + d]);
        }
    } else {
        for (int c = 0; c < cols; c++) x[c] = a[c];
    }
}

/* Abort the test with file:line and the CUDA error string when a runtime call fails. */
#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Device copy of h (16 bytes of slack past the end, for kernels that read a vector ahead). */
template <typename T> static T *dev_copy(const std::vector<T> &h)
{
    T *d;
    CK(cudaMalloc(&d, h.size() * sizeof(T) + 16));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
/* Synchronizes the device, then copies n elements of d back. */
template <typename T> static std::vector<T> host_copy(const T *d, size_t n)
{
    std::vector<T> h(n);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}
/* n floats of NaN on the device: outputs a kernel must overwrite. */
static inline float *dev_nan(size_t n)
{
    std::vector<float> h(n, NAN);
    return dev_copy(h);
}

/* True (after printing "no CUDA device: skipped") when no GPU is present: main then returns 77. */
static inline bool cuda_test_no_device(void)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("no CUDA device: skipped\n");
        return true;
    }
    return false;
}

#endif
