/* cuda_test_util.cuh — helpers shared by the GPU tests in tests/cuda: the seeded LCG random source
 * (rnd_u32, rnd_f, rand_vec), the CK error-check macro, host <-> device copies (dev_copy, host_copy,
 * dev_nan for NaN-poisoned outputs), silu_d and ref_gemv_input (the double-precision twin of the
 * GEMV input transform), ref_conv_history / ref_conv_silu / ref_gdn_head (the twin of the
 * Gated DeltaNet conv and head step) and cuda_test_no_device() (the skip at the start of main). Header of static
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

#include "backend/cuda/gemv/gemv.cuh"

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

/* The twin's conv history, double [(K-1+n)][conv_dim]: the K-1 conv-state rows of cs0, then the n rows of
 * mixed (row stride `stride`). */
static inline std::vector<double> ref_conv_history(const std::vector<float> &cs0, const std::vector<float> &mixed, int K,
                                                   int n, int conv_dim, int stride)
{
    std::vector<double> X((size_t)(K - 1 + n) * conv_dim);
    for (int s = 0; s < K - 1; s++)
        for (int c = 0; c < conv_dim; c++) X[(size_t)s * conv_dim + c] = cs0[(size_t)s * conv_dim + c];
    for (int t = 0; t < n; t++)
        for (int c = 0; c < conv_dim; c++) X[(size_t)(K - 1 + t) * conv_dim + c] = mixed[(size_t)t * stride + c];
    return X;
}

/* y[c] = silu(Σ_j cw[c][j] · X[t + j][c]): the causal depthwise conv (K taps) of token t, then SiLU. */
static inline void ref_conv_silu(const std::vector<double> &X, const std::vector<float> &cw, int K, int conv_dim, int t,
                                 std::vector<double> &y)
{
    for (int c = 0; c < conv_dim; c++) {
        double acc = 0;
        for (int j = 0; j < K; j++) acc += cw[(size_t)c * K + j] * X[(size_t)(t + j) * conv_dim + c];
        y[c] = silu_d(acc);
    }
}

/* CPU twin (double) of one Gated DeltaNet token for v head j of key head kh (MODEL.md §4.4 steps 4-7):
 * q, k from the conv output y (L2-normed, eps 1e-6; q also / sqrt(dk)), v = y[2·key_dim + j·dv ..],
 * beta = sigmoid(b), decay = exp(-exp(a_log) · softplus(aa)); Sj [dk][dv] decays, takes the delta-rule
 * update, and o[c] = Σ_i S[i][c] q[i] with mag[c] = Σ|S[i][c] q[i]| + 1e-2 (the check's magnitude). */
static inline void ref_gdn_head(const std::vector<double> &y, int key_dim, int kh, int j, int dk, int dv, double b,
                                double aa, double a_log, double *Sj, double *o_out, double *mag_out)
{
    std::vector<double> q(dk), k(dk), v(dv);
    double qs = 0, ks = 0;
    for (int i = 0; i < dk; i++) {
        q[i] = y[kh * dk + i];
        k[i] = y[key_dim + kh * dk + i];
        qs += q[i] * q[i];
        ks += k[i] * k[i];
    }
    for (int i = 0; i < dk; i++) {
        q[i] = q[i] / sqrt(qs + 1e-6) / sqrt((double)dk);
        k[i] = k[i] / sqrt(ks + 1e-6);
    }
    for (int i = 0; i < dv; i++) v[i] = y[2 * key_dim + j * dv + i];
    const double beta = 1.0 / (1.0 + exp(-b));
    const double sp = aa > 20 ? aa : log1p(exp(aa));
    const double decay = exp(-exp(a_log) * sp);
    for (size_t i = 0; i < (size_t)dk * dv; i++) Sj[i] *= decay;
    for (int c = 0; c < dv; c++) {
        double m = 0;
        for (int i = 0; i < dk; i++) m += Sj[(size_t)i * dv + c] * k[i];
        const double delta = beta * (v[c] - m);
        double o = 0, om = 0;
        for (int i = 0; i < dk; i++) {
            Sj[(size_t)i * dv + c] += k[i] * delta;
            o += Sj[(size_t)i * dv + c] * q[i];
            om += fabs(Sj[(size_t)i * dv + c] * q[i]);
        }
        o_out[c] = o;
        mag_out[c] = om + 1e-2;
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
