/* test_cuda_gdn_fused.cu — the out_proj-fused DeltaNet decode (GDN_KERNEL_DECODE_FUSED,
 * deltanet/gdn_out_fused.cu) against (1) the unfused GPU path, gdn_decode_kernel then the streamed out_proj
 * GEMV, bit for bit (delta-rule output o, recurrent state, conv state, h), and (2) the CPU twins (double):
 * the delta rule (o within 1e-3 of its magnitude, state within 1e-4, as test_cuda_kernels' test_gdn) and
 * the gated RMSNorm + 4-bit out_proj + residual add from the GPU's o and previous h (1e-4 of the terms'
 * magnitude). Several steps per shape (state, conv state and h carried; the step counter, hence the tags
 * and the conv-state parity, advanced), o NaN-poisoned before every step. Shapes: the 35B-A3B layer (Hk 16,
 * Hv 32, dk = dv = 128, hidden 2048: one scan item per warp) and smaller ones where warps take several
 * items or none. Exits 77 (CTest: skipped) when no GPU is present.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>

#include "backend/cuda/deltanet/deltanet.cuh"
#include "backend/cuda/gemv/gemv.cuh"
#include "backend/cuda/sample.cuh"

extern "C" {
#include "base/dtype.h"
}

#define CUDA_TEST_SEED 0x6d6e7a21ull
#include "cuda_test_util.cuh"
#include "cuda_test_check.cuh"

/* A random MLX 4-bit matrix [rows][cols] on the device and its exact dequantization w. */
static dmat make_q4(int rows, int cols, std::vector<float> &w)
{
    const size_t rb = (size_t)cols / 2, gpr = cols / 64;
    std::vector<unsigned char> data((size_t)rows * rb);
    for (auto &b : data)
        b = (unsigned char)rnd_u32();
    std::vector<uint16_t> sc((size_t)rows * gpr), bi((size_t)rows * gpr);
    for (size_t i = 0; i < sc.size(); i++) {
        sc[i] = lily_f32_to_bf16(rnd_f(-0.02f, 0.02f));
        bi[i] = lily_f32_to_bf16(rnd_f(-0.1f, 0.1f));
    }
    w.assign((size_t)rows * cols, 0.0f);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const unsigned char byte = data[(size_t)r * rb + c / 2];
            const unsigned int q = (c & 1) ? byte >> 4 : byte & 15;
            const size_t g = (size_t)r * gpr + c / 64;
            w[(size_t)r * cols + c] = lily_bf16_to_f32(sc[g]) * (float)q + lily_bf16_to_f32(bi[g]);
        }
    dmat d;
    memset(&d, 0, sizeof d);
    d.bits = 4, d.rows = rows, d.cols = cols, d.n_experts = 1, d.row_bytes = (int64_t)rb;
    d.data = dev_copy(data);
    d.scales = (const __nv_bfloat16 *)dev_copy(sc);
    d.biases = (const __nv_bfloat16 *)dev_copy(bi);
    return d;
}

template <typename T> static bool same_bits(const std::vector<T> &a, const std::vector<T> &b, size_t *first)
{
    for (size_t i = 0; i < a.size(); i++)
        if (memcmp(&a[i], &b[i], sizeof(T))) {
            *first = i;
            return false;
        }
    return true;
}

/* One DeltaNet layer (Hk, Hv, dk, dv, conv K 4, out_proj hidden x Hv·dv) for `steps` decode steps. */
static void test_fused(int Hk, int Hv, int dk, int dv, int hidden, int steps, int layer)
{
    const int K = 4, key_dim = Hk * dk, cols = Hv * dv, conv_dim = 2 * key_dim + cols, stride = conv_dim + 2 * cols + 2 * Hv;
    /* in_proj's output row per step: mixed | z | b | a (as the forward pass lays it out) */
    std::vector<float> proj = rand_vec((size_t)steps * stride, -1, 1);
    for (int t = 0; t < steps; t++)
        for (int i = 0; i < 2 * Hv; i++)
            proj[(size_t)t * stride + conv_dim + cols + i] *= 2.0f;
    std::vector<float> cw = rand_vec((size_t)conv_dim * K, -0.5f, 0.5f), Al = rand_vec(Hv, -1, 1), dtb = rand_vec(Hv, -1, 1);
    std::vector<float> S0 = rand_vec((size_t)Hv * dk * dv, -0.3f, 0.3f), cs0 = rand_vec((size_t)2 * (K - 1) * conv_dim, -1, 1);
    std::vector<float> gw = rand_vec(dv, 0.5f, 1.5f), h0 = rand_vec(hidden, -1, 1), W;
    const dmat Wd = make_q4(hidden, cols, W);

    /* two copies of everything written: [0] the fused launch, [1] scan + out_proj */
    float *dproj = dev_copy(proj), *dcw = dev_copy(cw), *dAl = dev_copy(Al), *ddtb = dev_copy(dtb), *dgw = dev_copy(gw);
    float *dS[2] = {dev_copy(S0), dev_copy(S0)}, *dcs[2] = {dev_copy(cs0), dev_copy(cs0)}, *dh[2] = {dev_copy(h0), dev_copy(h0)};
    float *dout[2] = {dev_nan(cols), dev_nan(cols)};
    int *dstep;
    CK(cudaMalloc(&dstep, 4));
    unsigned long long *dpub;
    CK(cudaMalloc(&dpub, GDN_PUB_WORDS * 8));
    CK(cudaMemset(dpub, 0, GDN_PUB_WORDS * 8));

    gdn_args a[2];
    gemv_batch b[2];
    gemv_input in[2];
    for (int p = 0; p < 2; p++) {
        memset(&a[p], 0, sizeof a[p]);
        a[p].mixed_stride = stride, a[p].ba_stride = stride;
        a[p].conv_w = dcw, a[p].A_log = dAl, a[p].dt_bias = ddtb;
        a[p].conv_state = dcs[p], a[p].state = dS[p], a[p].step = dstep, a[p].out = dout[p];
        a[p].Hk = Hk, a[p].Hv = Hv, a[p].dk = dk, a[p].dv = dv, a[p].K = K, a[p].conv_dim = conv_dim;
        memset(&b[p], 0, sizeof b[p]);
        b[p].m[0] = Wd;
        b[p].y[0] = dh[p];
        b[p].y_stride[0] = hidden;
        b[p].row_start[1] = hidden;
        b[p].n_mats = 1;
        memset(&in[p], 0, sizeof in[p]);
        in[p].act = dout[p], in[p].act_stride = cols, in[p].mode = GEMV_IN_GATED, in[p].norm_w = dgw;
        in[p].z_stride = cols, in[p].head_dim = dv, in[p].eps = 1e-6f;
    }
    a[0].fuse_out = &b[0], a[0].fuse_out_x = &in[0], a[0].pub = dpub, a[0].layer = layer;

    char what[200];
    snprintf(what, sizeof what, "gdn fused Hk %2d Hv %2d dk %3d dv %3d hidden %4d", Hk, Hv, dk, dv, hidden);
    g_checks++;
    const gdn_kernel kc = gdn_kernel_choose(a[0], 1, false), kx = gdn_kernel_choose(a[0], 1, true);
    const gdn_kernel ku = gdn_kernel_choose(a[1], 1, false);
    if (kc != GDN_KERNEL_DECODE_FUSED || kx != GDN_KERNEL_DECODE || ku != GDN_KERNEL_DECODE ||
        gemv_kernel_choose(b[1], 1) != GEMV_KERNEL_STREAM) {
        g_fail++;
        printf("FAIL %s: kernel choice fused %d exact %d unfused %d gemv %d\n", what, kc, kx, ku, gemv_kernel_choose(b[1], 1));
        return;
    }
    printf("ok   %s: chosen DECODE_FUSED (exact mode and no out_proj offered: DECODE)\n", what);

    /* the twin's carried state (double) and conv history */
    std::vector<double> S(S0.begin(), S0.end());
    const std::vector<double> X = ref_conv_history(std::vector<float>(cs0.begin(), cs0.begin() + (size_t)(K - 1) * conv_dim),
                                                   proj, K, steps, conv_dim, stride);
    bool bits_ok = true;
    std::string bits_what;
    for (int t = 0; t < steps; t++) {
        CK(launch_set_int(dstep, t, 0)); /* conv-state parity t & 1: step 0 reads buffer 0, as cs0's first rows */
        const std::vector<float> hprev = host_copy(dh[0], hidden);
        for (int p = 0; p < 2; p++) {
            CK(cudaMemcpy(dout[p], std::vector<float>(cols, NAN).data(), cols * 4, cudaMemcpyHostToDevice));
            a[p].mixed = dproj + (size_t)t * stride;
            a[p].ba = dproj + (size_t)t * stride + conv_dim + cols;
            in[p].z = dproj + (size_t)t * stride + conv_dim;
        }
        a[0].kernel = GDN_KERNEL_DECODE_FUSED;
        a[1].kernel = GDN_KERNEL_DECODE;
        cudaError_t e = launch_gdn(a[0], NULL, NULL, 1, 0);
        if (e == cudaSuccess)
            e = launch_gdn(a[1], NULL, NULL, 1, 0);
        if (e == cudaSuccess)
            e = launch_gemv(b[1], in[1], GEMV_OUT_ADD, 1, NULL, 0);
        if (e == cudaSuccess)
            e = cudaDeviceSynchronize();
        if (e != cudaSuccess) {
            g_fail++;
            printf("FAIL %s step %d: launch %s\n", what, t, cudaGetErrorString(e));
            return;
        }
        /* bit for bit against the unfused path */
        const std::vector<float> o0 = host_copy(dout[0], cols), o1 = host_copy(dout[1], cols);
        const std::vector<float> S_0 = host_copy(dS[0], S0.size()), S_1 = host_copy(dS[1], S0.size());
        const std::vector<float> c_0 = host_copy(dcs[0], cs0.size()), c_1 = host_copy(dcs[1], cs0.size());
        const std::vector<float> h_0 = host_copy(dh[0], hidden), h_1 = host_copy(dh[1], hidden);
        size_t f = 0;
        const char *bad = !same_bits(o0, o1, &f) ? "o" : !same_bits(S_0, S_1, &f) ? "state" : !same_bits(c_0, c_1, &f) ? "conv state"
                          : !same_bits(h_0, h_1, &f) ? "h" : NULL;
        if (bad && bits_ok) {
            bits_ok = false;
            char m[160];
            snprintf(m, sizeof m, "step %d: %s differs (first at %zu)", t, bad, f);
            bits_what = m;
        }
        /* the twins: the delta rule (state carried in double), then gated norm + out_proj from the GPU's o */
        std::vector<double> y(conv_dim), want(cols), mag(cols);
        ref_conv_silu(X, cw, K, conv_dim, t, y);
        for (int j = 0; j < Hv; j++) {
            const float *ba = &proj[(size_t)t * stride + conv_dim + cols];
            ref_gdn_head(y, key_dim, j / (Hv / Hk), j, dk, dv, (double)ba[j], ba[Hv + j] + dtb[j], (double)Al[j],
                         &S[(size_t)j * dk * dv], &want[(size_t)j * dv], &mag[(size_t)j * dv]);
        }
        char w2[240];
        snprintf(w2, sizeof w2, "%s step %d o", what, t);
        check(w2, o0, want, mag, 1e-3);
        std::vector<double> Sw(S.begin(), S.end()), Sm(S.size(), 1.0);
        snprintf(w2, sizeof w2, "%s step %d state", what, t);
        check(w2, S_0, Sw, Sm, 1e-4);
        std::vector<double> x(cols), hw(hidden), hm(hidden);
        const std::vector<float> zrow(proj.begin() + (size_t)t * stride + conv_dim, proj.begin() + (size_t)t * stride + conv_dim + cols);
        ref_gemv_input(GEMV_IN_GATED, o0.data(), cols, gw, gw, dv, zrow, 0, x);
        for (int r = 0; r < hidden; r++) {
            double acc = 0, mg = 0;
            for (int c = 0; c < cols; c++) {
                acc += (double)W[(size_t)r * cols + c] * x[c];
                mg += fabs((double)W[(size_t)r * cols + c] * x[c]);
            }
            hw[r] = hprev[r] + acc;
            hm[r] = mg + fabs(hprev[r]);
        }
        snprintf(w2, sizeof w2, "%s step %d h += out_proj(gated norm(o))", what, t);
        check(w2, h_0, hw, hm);
        if (t == steps - 1) { /* the conv state after the last step: buffer (t + 1) & 1, the last K-1 inputs */
            std::vector<float> cg(c_0.begin() + (size_t)((t + 1) & 1) * (K - 1) * conv_dim,
                                  c_0.begin() + (size_t)(((t + 1) & 1) + 1) * (K - 1) * conv_dim);
            std::vector<double> cwant((size_t)(K - 1) * conv_dim), cm((size_t)(K - 1) * conv_dim, 0.0);
            for (int s = 0; s < K - 1; s++)
                for (int c = 0; c < conv_dim; c++)
                    cwant[(size_t)s * conv_dim + c] = X[(size_t)(t + 1 + s) * conv_dim + c];
            snprintf(w2, sizeof w2, "%s after %d steps: conv state", what, steps);
            check(w2, cg, cwant, cm);
        }
    }
    /* the tagged words of the last step: tag ((steps - 1) + 1) << 8 | layer, value o's bits */
    const std::vector<unsigned long long> P = host_copy(dpub, (size_t)cols);
    const std::vector<float> olast = host_copy(dout[0], cols);
    const unsigned long long tag = (unsigned long long)(((unsigned int)steps << 8) | (unsigned int)layer) << 32;
    bool pub_ok = true;
    for (int c = 0; c < cols; c++) {
        unsigned int u;
        memcpy(&u, &olast[c], 4);
        pub_ok &= P[c] == (tag | u);
    }
    g_checks += 2;
    g_fail += !bits_ok + !pub_ok;
    printf("%s %s, %d steps: o, state, conv state and h bit-identical to gdn_decode + gemv_stream: %s%s%s | tagged words %s\n",
           bits_ok && pub_ok ? "ok  " : "FAIL", what, steps, bits_ok ? "yes" : "NO (", bits_ok ? "" : bits_what.c_str(),
           bits_ok ? "" : ")", pub_ok ? "ok" : "WRONG");
    for (int p = 0; p < 2; p++)
        cudaFree(dS[p]), cudaFree(dcs[p]), cudaFree(dh[p]), cudaFree(dout[p]);
    cudaFree(dproj), cudaFree(dcw), cudaFree(dAl), cudaFree(ddtb), cudaFree(dgw), cudaFree(dstep), cudaFree(dpub);
    cudaFree((void *)Wd.data), cudaFree((void *)Wd.scales), cudaFree((void *)Wd.biases);
}

int main(void)
{
    if (cuda_test_no_device())
        return 77;
    if (!LILY_BUILD_SM90A) { /* the fused kernel is the streamed GEMV's: sm_90 code only */
        printf("no sm_90a code in this build: skipped\n");
        return 77;
    }
    test_fused(16, 32, 128, 128, 2048, 4, 3); /* Qwen3.6-35B-A3B: 128 blocks x 8 warps = 1024 scan items */
    test_fused(16, 32, 128, 64, 2048, 3, 0);  /* head_dim 64 (cols 2048) */
    test_fused(8, 16, 128, 128, 3000, 3, 255); /* cols 2048, ragged last tile, warps without an item */
    test_fused(4, 8, 64, 64, 1024, 3, 7);     /* cols 512: 8 blocks, 2 items per warp */
    test_fused(2, 4, 32, 128, 256, 3, 1);     /* 2 blocks, 8 items per warp, dk 32 */
    return cuda_test_summary();
}
