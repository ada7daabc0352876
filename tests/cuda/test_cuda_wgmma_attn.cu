/* test_cuda_wgmma_attn.cu — probe of the two wgmma operand layouts the Hopper prefill attention
 * (attention_prefill_wg.cu) relies on, one warpgroup, one tile, small integers (every product and sum
 * exact in fp32, so the GPU must match the CPU exactly):
 *   S = Q K^T (64 x 64): A = Q and B = K both K-major in shared memory, [D/64][rows][128 B] with the
 *     128-byte swizzle, wgmma m64n64k16 bf16 per k16 slice (descriptor start + 32 B per slice, + rows x
 *     128 B per 64-column block);
 *   O = P V (64 x D): A = P (64 x 64 bf16) from registers in the m16n8k16 A fragment layout, B = V (64
 *     keys x D) MN-major (imm-trans-b 1) in [D/64][64 keys][128 B] swizzled, wgmma m64nDk16 per 16 keys
 *     with descriptor start + 2048 B per slice, LBO = distance between the 64-column blocks, SBO = 1024.
 * The P V case also runs with LBO and SBO swapped, so one run says which reading of the PTX ISA holds
 * (the expected one is "LBO = 64-column block distance"). Skipped (77) without a GPU; on a GPU that is
 * not compute capability 9.0 it prints a NOTE and passes (the kernels are stubs there).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "backend/cuda/wgmma_common.cuh"

extern "C" {
#include "base/dtype.h"
}

#define CUDA_TEST_SEED 0x243f6a8885a308d3ull
#include "cuda_test_util.cuh"
#include "cuda_test_check.cuh"

#define PROBE_SMEM (64 * 1024 + 1024)

/* byte offset of (r, c) in a [cols/64][ROWS][128 B] 128-byte-swizzled tile */
__device__ __forceinline__ uint32_t probe_off(int rows, int r, int c)
{
    return (uint32_t)((c >> 6) * rows * 128 + r * 128 + ((((c >> 3) & 7) ^ (r & 7)) << 4) + (c & 7) * 2);
}

/* Q [64][256], K [64][256] (bf16 bits, row-major) -> S [64][64] fp32 */
__global__ void probe_qk(const uint16_t *Q, const uint16_t *K, float *S)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(16) unsigned char raw[];
    unsigned char *sm = raw + ((1024u - ((uint32_t)__cvta_generic_to_shared(raw) & 1023u)) & 1023u);
    unsigned char *sq = sm, *sk = sm + 32768;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    for (int i = tid; i < 64 * 256; i += 128) {
        const int r = i / 256, c = i % 256;
        *reinterpret_cast<uint16_t *>(sq + probe_off(64, r, c)) = Q[i];
        *reinterpret_cast<uint16_t *>(sk + probe_off(64, r, c)) = K[i];
    }
    fence_proxy_async();
    __syncthreads();
    const uint32_t aq = (uint32_t)__cvta_generic_to_shared(sq), ak = (uint32_t)__cvta_generic_to_shared(sk);
    float d[8][4];
    for (int j = 0; j < 8; j++)
        d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.0f;
    wg_fence();
    for (int kk = 0; kk < 16; kk++)
        wgmma_bf16_ss<64>(d, wg_desc(aq + (kk >> 2) * 64 * 128 + (kk & 3) * 32),
                          wg_desc(ak + (kk >> 2) * 64 * 128 + (kk & 3) * 32), kk > 0);
    wg_commit();
    wg_wait<0>();
    for (int j = 0; j < 8; j++) {
        const int r = warp * 16 + g, c = 8 * j + 2 * t;
        S[r * 64 + c] = d[j][0];
        S[r * 64 + c + 1] = d[j][1];
        S[(r + 8) * 64 + c] = d[j][2];
        S[(r + 8) * 64 + c + 1] = d[j][3];
    }
#else
    (void)Q, (void)K, (void)S;
#endif
}

/* P [64][64], V [64 keys][D] (bf16 bits, row-major) -> O [64][D] fp32, descriptor LBO / SBO given */
template <int D> __global__ void probe_pv(const uint16_t *P, const uint16_t *V, float *O, int lbo, int sbo)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(16) unsigned char raw[];
    unsigned char *sv = raw + ((1024u - ((uint32_t)__cvta_generic_to_shared(raw) & 1023u)) & 1023u);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    for (int i = tid; i < 64 * D; i += 128)
        *reinterpret_cast<uint16_t *>(sv + probe_off(64, i / D, i % D)) = V[i];
    fence_proxy_async();
    __syncthreads();
    const uint32_t av = (uint32_t)__cvta_generic_to_shared(sv);
    float d[D / 8][4];
    for (int j = 0; j < D / 8; j++)
        d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.0f;
    uint32_t a[4][4];
    auto pk = [&](int r, int k) { return (uint32_t)P[r * 64 + k] | ((uint32_t)P[r * 64 + k + 1] << 16); };
    for (int ks = 0; ks < 4; ks++) {
        const int r = warp * 16 + g, k = ks * 16 + 2 * t;
        a[ks][0] = pk(r, k);
        a[ks][1] = pk(r + 8, k);
        a[ks][2] = pk(r, k + 8);
        a[ks][3] = pk(r + 8, k + 8);
    }
    wg_fence();
    for (int ks = 0; ks < 4; ks++)
        wgmma_bf16_rs_tb<D>(d, a[ks], wg_desc_sw128(av + ks * 2048, lbo, sbo));
    wg_commit();
    wg_wait<0>();
    for (int j = 0; j < D / 8; j++) {
        const int r = warp * 16 + g, c = 8 * j + 2 * t;
        O[r * D + c] = d[j][0];
        O[r * D + c + 1] = d[j][1];
        O[(r + 8) * D + c] = d[j][2];
        O[(r + 8) * D + c + 1] = d[j][3];
    }
#else
    (void)P, (void)V, (void)O, (void)lbo, (void)sbo;
#endif
}

static std::vector<uint16_t> small_ints(size_t n, int lo, int hi)
{
    std::vector<uint16_t> v(n);
    for (auto &x : v)
        x = lily_f32_to_bf16((float)(lo + (int)(rnd_u32() % (unsigned)(hi - lo + 1))));
    return v;
}

/* exact compare: prints one PASS/FAIL line; returns whether it matched */
static bool compare(const char *what, const std::vector<float> &got, const std::vector<double> &want, int cols,
                    bool count_failure)
{
    size_t bad = 0, first = 0;
    double max_err = 0;
    for (size_t i = 0; i < want.size(); i++) {
        const double e = fabs((double)got[i] - want[i]);
        if (!(e == 0)) {
            if (!bad++)
                first = i;
            max_err = e == e ? fmax(max_err, e) : INFINITY;
        }
    }
    g_checks++;
    if (bad) {
        if (count_failure)
            g_fail++;
        printf("%s %s: %zu of %zu differ, max err %.3g (bound 0: exact integers); first row %zu col %zu got %g want %g\n",
               count_failure ? "FAIL" : "NOTE", what, bad, want.size(), max_err, first / cols, first % cols,
               got[first], want[first]);
    } else {
        printf("PASS %s: %zu values exact (max err 0, bound 0)\n", what, want.size());
    }
    return !bad;
}

template <int D> static void test_pv(void)
{
    const std::vector<uint16_t> P = small_ints(64 * 64, 0, 3), V = small_ints((size_t)64 * D, -3, 3);
    std::vector<double> want((size_t)64 * D, 0.0);
    for (int r = 0; r < 64; r++)
        for (int k = 0; k < 64; k++)
            for (int c = 0; c < D; c++)
                want[(size_t)r * D + c] += (double)lily_bf16_to_f32(P[r * 64 + k]) * lily_bf16_to_f32(V[(size_t)k * D + c]);
    uint16_t *dP = dev_copy(P), *dV = dev_copy(V);
    float *dO = dev_nan((size_t)64 * D);
    CK(cudaFuncSetAttribute(probe_pv<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, PROBE_SMEM));
    const int variants[2][2] = {{64 * 128, 1024}, {1024, 64 * 128}}; /* {LBO, SBO}: expected, swapped */
    for (int v = 0; v < 2; v++) {
        CK(cudaMemset(dO, 0xff, (size_t)64 * D * sizeof(float)));
        probe_pv<D><<<1, 128, PROBE_SMEM>>>(dP, dV, dO, variants[v][0], variants[v][1]);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        char what[128];
        snprintf(what, sizeof what, "wgmma P·V m64n%dk16 bf16, V MN-major SW128, LBO %d SBO %d%s", D, variants[v][0],
                 variants[v][1], v ? " (swapped reading, informational)" : "");
        compare(what, host_copy(dO, (size_t)64 * D), want, D, v == 0);
    }
    cudaFree(dP);
    cudaFree(dV);
    cudaFree(dO);
}

int main(void)
{
    if (cuda_test_no_device())
        return 77;
    int dev = 0, major = 0, minor = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major != 9 || minor != 0 || !LILY_BUILD_SM90A) {
        printf("NOTE: compute capability %d.%d, %s sm_90a code: no wgmma to probe (skipped)\n", major, minor,
               LILY_BUILD_SM90A ? "a build with" : "a build without");
        return cuda_test_summary();
    }
    /* S = Q K^T */
    {
        const std::vector<uint16_t> Q = small_ints(64 * 256, -2, 2), K = small_ints(64 * 256, -2, 2);
        std::vector<double> want(64 * 64, 0.0);
        for (int r = 0; r < 64; r++)
            for (int k = 0; k < 64; k++)
                for (int d = 0; d < 256; d++)
                    want[r * 64 + k] += (double)lily_bf16_to_f32(Q[r * 256 + d]) * lily_bf16_to_f32(K[k * 256 + d]);
        uint16_t *dQ = dev_copy(Q), *dK = dev_copy(K);
        float *dS = dev_nan(64 * 64);
        CK(cudaFuncSetAttribute(probe_qk, cudaFuncAttributeMaxDynamicSharedMemorySize, PROBE_SMEM));
        probe_qk<<<1, 128, PROBE_SMEM>>>(dQ, dK, dS);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        compare("wgmma S = Q·K^T m64n64k16 bf16, Q and K K-major SW128 (4 column blocks)", host_copy(dS, 64 * 64),
                want, 64, true);
        cudaFree(dQ);
        cudaFree(dK);
        cudaFree(dS);
    }
    test_pv<64>();
    test_pv<128>();
    test_pv<256>();
    return cuda_test_summary();
}
