/* test_cuda_prefill_gemm.cu — the tensor-core prefill path against double-precision CPU twins: the
 * activation pre-pass's two kernels against each other (gemm_prep.cu), the pre-pass + dense GEMM (4-bit, 8-bit, bf16 weights; plain / RMSNorm / gated-RMSNorm input;
 * store / add output; batches of matrices with odd row counts; n = 1, 2, 7, 64, 513) and the whole
 * MoE block of forward_prefill.cu (router GEMM, top-k, expert plan, grouped gate/up + down GEMMs, shared
 * expert, combine) with router weights built so one expert gets every token, one never gets any and
 * the rest get 0, 1 or many rows. Every case runs under each kernel family (GEMM_KERNEL_MMA: gemm_kernel
 * at 16 tokens, gemm2d_kernel at 64/128; GEMM_KERNEL_MMA_DQ: gemm2d_kernel's fp16-dequantized form for
 * 4-bit weights at 64/128; GEMM_KERNEL_WGMMA on an sm_90a GPU: gemm_wg_kernel for 4-bit weights at 64/128)
 * and dense tile size, the CPU twin computed once per case; a "note" line says whether a configuration
 * reproduced the first one's bits (expected among the integer-weight mma.sync kernels: they issue the
 * same MMAs and folds per output; not for the wgmma kernel and the DQ form with 4-bit weights, which
 * round the weights to fp16). The MoE cases also check the tile map against the rows per expert. Outputs
 * are NaN-poisoned before each launch. gemm_kernel_choose must pick WGMMA where the sm_90a kernel runs,
 * else MMA_DQ. Exits 77 without a GPU.
 *
 * Error bound: activations are rounded to fp16 once (relative 2^-12 after the per-row power-of-two
 * scaling), weights are exact, accumulation fp32: |gpu - cpu| <= rel * Σ|terms| + 1e-5 with rel = 1e-3
 * for a GEMM and 3e-3 for the MoE block (hid is rounded to fp16 again before the down projection).
 * The wgmma kernel and the DQ form also round each 4-bit weight s·q + b to fp16 once (one HFMA2 of fp16 s, q,
 * b, all exact: relative 2^-11 ≈ 4.9e-4 of |w|), so each product carries up to 2 · 2^-11 ≈ 9.8e-4 of
 * |w·x| instead of 4.9e-4: their rel is doubled (2e-3 GEMM, 6e-3 MoE), the same margin over the worst
 * case as before.
 * On a compute capability 9.0 device the test fails if the wgmma kernel is not available (the binary
 * lacks sm_90a code), so the wgmma configurations cannot be skipped silently.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "backend/cuda/cuda_internal.cuh"

extern "C" {
#include "base/dtype.h"
}

#define CUDA_TEST_SEED 0x9e3779b97f4a7c15ull
#include "cuda_test_util.cuh"

static int g_fail = 0, g_checks = 0;

template <typename T> static T *dev_alloc(size_t n)
{
    T *d;
    CK(cudaMalloc(&d, n * sizeof(T) + 16));
    CK(cudaMemset(d, 0xff, n * sizeof(T) + 16)); /* poison: NaN for floats/halves, -1 for ints */
    return d;
}

static void check(const char *what, const std::vector<float> &got, const std::vector<double> &want,
                  const std::vector<double> &mag, double rel)
{
    double worst = 0;
    size_t bad = 0, first = (size_t)-1;
    double max_err = 0;
    for (size_t i = 0; i < want.size(); i++) {
        const double tol = rel * mag[i] + 1e-5;
        const double d = fabs((double)got[i] - want[i]);
        if (!(d <= tol)) {
            bad++;
            if (first == (size_t)-1)
                first = i;
        }
        if (d > max_err || got[i] != got[i])
            max_err = got[i] != got[i] ? INFINITY : d;
        if (d / tol > worst || got[i] != got[i])
            worst = got[i] != got[i] ? INFINITY : d / tol;
    }
    g_checks++;
    if (bad) {
        g_fail++;
        printf("FAIL %s: %zu of %zu outside the bound (first %zu: got %g want %g bound %g), max err %.3g\n", what,
               bad, want.size(), first, got[first], want[first], rel * mag[first] + 1e-5, max_err);
    } else {
        printf("PASS %s: max err %.3g, worst %.3f of the bound (rel %.0e)\n", what, max_err, worst, rel);
    }
}

/* ---- a random quantized matrix with its exact dequantization ---------------------------------------- */

struct hmat {
    int bits, rows, cols, E;
    std::vector<unsigned char> data;
    std::vector<uint16_t> scales, biases;
    std::vector<float> w; /* dequantized [E*rows][cols] */
    dmat d;
};

static void make_host(hmat &m, int bits, int E, int rows, int cols)
{
    m.bits = bits, m.rows = rows, m.cols = cols, m.E = E;
    const size_t R = (size_t)E * rows;
    m.w.assign(R * cols, 0.0f);
    if (bits == 16) {
        m.data.resize(R * cols * 2);
        for (size_t i = 0; i < R * cols; i++) {
            const uint16_t b = lily_f32_to_bf16(rnd_f(-0.1f, 0.1f));
            memcpy(&m.data[2 * i], &b, 2);
            m.w[i] = lily_bf16_to_f32(b);
        }
        return;
    }
    const size_t rb = (size_t)cols * bits / 8, gpr = cols / 64;
    m.data.resize(R * rb);
    for (auto &b : m.data)
        b = (unsigned char)rnd_u32();
    m.scales.resize(R * gpr);
    m.biases.resize(R * gpr);
    const float smax = bits == 4 ? 0.02f : 0.0012f; /* similar weight ranges for 4 and 8 bits */
    for (size_t i = 0; i < R * gpr; i++) {
        m.scales[i] = lily_f32_to_bf16(rnd_f(-smax, smax));
        m.biases[i] = lily_f32_to_bf16(rnd_f(-0.1f, 0.1f));
    }
    for (size_t r = 0; r < R; r++)
        for (int c = 0; c < cols; c++) {
            unsigned int q;
            if (bits == 4) {
                const unsigned char byte = m.data[r * rb + c / 2];
                q = (c & 1) ? byte >> 4 : byte & 15;
            } else {
                q = m.data[r * rb + c];
            }
            const size_t g = r * gpr + c / 64;
            m.w[r * cols + c] = lily_bf16_to_f32(m.scales[g]) * (float)q + lily_bf16_to_f32(m.biases[g]);
        }
}

/* Every weight of (row, group) = v (quantized: scale 0, bias v). */
static void set_group(hmat &m, int row, int group, float v)
{
    const uint16_t b = lily_f32_to_bf16(v);
    const float vb = lily_bf16_to_f32(b);
    for (int c = group * 64; c < group * 64 + 64; c++) {
        m.w[(size_t)row * m.cols + c] = vb;
        if (m.bits == 16)
            memcpy(&m.data[2 * ((size_t)row * m.cols + c)], &b, 2);
    }
    if (m.bits != 16) {
        m.scales[(size_t)row * (m.cols / 64) + group] = lily_f32_to_bf16(0.0f);
        m.biases[(size_t)row * (m.cols / 64) + group] = b;
    }
}

static void upload(hmat &m)
{
    memset(&m.d, 0, sizeof m.d);
    m.d.bits = m.bits;
    m.d.rows = m.rows;
    m.d.cols = m.cols;
    m.d.n_experts = m.E;
    m.d.row_bytes = (int64_t)m.cols * m.bits / 8;
    m.d.data = dev_copy(m.data);
    if (m.bits != 16) {
        m.d.scales = (const __nv_bfloat16 *)dev_copy(m.scales);
        m.d.biases = (const __nv_bfloat16 *)dev_copy(m.biases);
    }
}

static void make_mat(hmat &m, int bits, int E, int rows, int cols)
{
    make_host(m, bits, E, rows, cols);
    upload(m);
}

/* ---- kernel family x tile configurations --------------------------------------------------------- */

/* (kernel family, dense tile; 0: gemm_dense_tile): GEMM_KERNEL_MMA runs gemm_kernel at 16 tokens and
 * gemm2d_kernel at 64/128; GEMM_KERNEL_WGMMA runs gemm_wg_kernel for 4-bit weights at 64/128 (X by TMA for
 * every dense launch; the gathered MoE gate/up by cp.async on mbarriers) and the MMA kernels otherwise;
 * GEMM_KERNEL_MMA_DQ runs gemm2d_kernel's DQ form for 4-bit weights at 64/128 and the MMA kernels
 * otherwise. The MoE block takes the family's automatic grouped tile (gemm_grouped_tile: the shapes in
 * main give 16, 64 and 128). The WGMMA configurations run only where the sm_90a kernel is available. */
struct gemm_cfg {
    int kernel, tile;
};
static const gemm_cfg k_dense_cfgs[] = {{GEMM_KERNEL_MMA, 16},     {GEMM_KERNEL_MMA, 64},     {GEMM_KERNEL_MMA, 128},
                                        {GEMM_KERNEL_MMA, 0},      {GEMM_KERNEL_MMA_DQ, 64},  {GEMM_KERNEL_MMA_DQ, 128},
                                        {GEMM_KERNEL_MMA_DQ, 0},   {GEMM_KERNEL_WGMMA, 64},   {GEMM_KERNEL_WGMMA, 128},
                                        {GEMM_KERNEL_WGMMA, 0}};
static const gemm_cfg k_moe_cfgs[] = {{GEMM_KERNEL_MMA, 0}, {GEMM_KERNEL_MMA_DQ, 0}, {GEMM_KERNEL_WGMMA, 0}};
static bool g_wg = false; /* gemm_wgmma_available() */
static std::vector<gemm_cfg> cfg_list(bool moe)
{
    std::vector<gemm_cfg> v;
    const gemm_cfg *c = moe ? k_moe_cfgs : k_dense_cfgs;
    const size_t n = moe ? sizeof k_moe_cfgs / sizeof k_moe_cfgs[0] : sizeof k_dense_cfgs / sizeof k_dense_cfgs[0];
    for (size_t i = 0; i < n; i++)
        if (c[i].kernel != GEMM_KERNEL_WGMMA || g_wg)
            v.push_back(c[i]);
    return v;
}

/* Error bound factor of a configuration: 2 for the wgmma kernel and the DQ form (fp16-rounded 4-bit weights). */
static double cfg_rel(const gemm_cfg &k, int bits)
{
    return k.kernel != GEMM_KERNEL_MMA && bits == 4 ? 2.0 : 1.0;
}

static const char *cfg_name(const gemm_cfg &k)
{
    return k.kernel == GEMM_KERNEL_WGMMA ? "wgmma" : k.kernel == GEMM_KERNEL_MMA_DQ ? "dq" : "mma";
}

/* Informational: are two runs' outputs the same bits (both kernels do the same MMAs and folds)? */
static void note_same(const char *what, const std::vector<float> &a, const std::vector<float> &b)
{
    if (a.size() != b.size())
        return;
    size_t diff = 0;
    for (size_t i = 0; i < a.size(); i++)
        diff += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    printf("note %s: %s the first configuration's bits (%zu of %zu differ)\n", what, diff ? "differs from" : "same as",
           diff, a.size());
}

/* ---- dense GEMM ------------------------------------------------------------------------------------- */

/* The activation pre-pass: launch_gemm_prep (the rows kernel where it takes the shape) against the block
 * kernel (launch_gemm_prep_block) on the same input. The norms sum in different orders, so an fp16 value may differ by one unit in
 * the last place (relative 2^-10) and a group sum by float rounding; the row scales must be equal. */
static void test_prep(int cols, int n, int mode, int hd, int stride)
{
    std::vector<float> act = rand_vec((size_t)n * stride, -1, 1), nw = rand_vec(cols, 0.5f, 1.5f);
    std::vector<float> z = rand_vec((size_t)n * stride, -2, 2), gw = rand_vec(hd, 0.5f, 1.5f);
    if (n > 3)
        for (int c = 0; c < stride; c++) {
            act[(size_t)1 * stride + c] *= 3000.0f;
            act[(size_t)2 * stride + c] *= 1e-4f;
        }
    gemv_input in;
    memset(&in, 0, sizeof in);
    in.act = dev_copy(act);
    in.act_stride = stride;
    in.mode = mode;
    in.eps = 1e-6f;
    in.norm_w = dev_copy(mode == GEMV_IN_GATED ? gw : nw);
    in.z = dev_copy(z);
    in.z_stride = stride;
    in.head_dim = hd;
    std::vector<__half> x[2];
    std::vector<float> xs[2], sc[2];
    for (int v = 0; v < 2; v++) {
        gemm_act ga;
        ga.x = dev_alloc<__half>((size_t)n * cols);
        ga.xs = dev_alloc<float>((size_t)n * cols / 64);
        ga.scale = dev_alloc<float>(n);
        ga.cols = cols;
        CK(v ? launch_gemm_prep(in, cols, n, ga, 0) : launch_gemm_prep_block(in, cols, n, ga, 0));
        CK(cudaDeviceSynchronize());
        x[v].resize((size_t)n * cols);
        CK(cudaMemcpy(x[v].data(), ga.x, x[v].size() * sizeof(__half), cudaMemcpyDeviceToHost));
        xs[v] = host_copy(ga.xs, (size_t)n * cols / 64);
        sc[v] = host_copy(ga.scale, n);
        CK(cudaFree(ga.x));
        CK(cudaFree(ga.xs));
        CK(cudaFree(ga.scale));
    }
    double worst_x = 0, worst_s = 0;
    int bad_scale = 0;
    for (int t = 0; t < n; t++) {
        bad_scale += !(sc[0][t] == sc[1][t]);
        for (int c = 0; c < cols; c++) {
            const double a = __half2float(x[0][(size_t)t * cols + c]), b = __half2float(x[1][(size_t)t * cols + c]);
            const double e = fabs(a - b) / (fabs(a) * 0x1p-10 + 0x1p-24);
            worst_x = e > worst_x || e != e ? e : worst_x;
        }
        for (int g = 0; g < cols / 64; g++) {
            double mg = 0;
            for (int c = 0; c < 64; c++)
                mg += fabs(__half2float(x[0][(size_t)t * cols + g * 64 + c]));
            const double e = fabs((double)xs[0][(size_t)t * cols / 64 + g] - xs[1][(size_t)t * cols / 64 + g]) /
                             (mg * 0x1p-10 + 1e-30);
            worst_s = e > worst_s || e != e ? e : worst_s;
        }
    }
    g_checks++;
    const bool ok = bad_scale == 0 && worst_x <= 1.0 && worst_s <= 1.0;
    if (!ok)
        g_fail++;
    printf("%s prep rows vs block cols %4d n %3d mode %d hd %3d stride %4d: x %.3f, group sums %.3f of the bound, "
           "%d row scales differ\n",
           ok ? "PASS" : "FAIL", cols, n, mode, hd, stride, worst_x, worst_s, bad_scale);
    CK(cudaFree((void *)in.act));
    CK(cudaFree((void *)in.norm_w));
    CK(cudaFree((void *)in.z));
}

static void test_dense(int bits, int cols, int rows, int n, int mode, int out_mode, int n_mats)
{
    hmat m[3];
    gemv_batch b;
    memset(&b, 0, sizeof b);
    int total = 0;
    for (int k = 0; k < n_mats; k++) {
        make_mat(m[k], bits, 1, rows + 3 * k, cols);
        b.m[k] = m[k].d;
        b.row_start[k + 1] = b.row_start[k] + m[k].rows;
        total += m[k].rows;
    }
    b.n_mats = n_mats;
    const int stride = total + 5;
    std::vector<float> act = rand_vec((size_t)n * cols, -1, 1), nw = rand_vec(cols, 0.5f, 1.5f);
    if (n > 3) /* a row with a large value (power-of-two scaling) and a tiny one */
        for (int c = 0; c < cols; c++) {
            act[(size_t)1 * cols + c] *= 3000.0f;
            act[(size_t)2 * cols + c] *= 1e-4f;
        }
    const int hd = 32;
    std::vector<float> z = rand_vec((size_t)n * cols, -2, 2), gw = rand_vec(hd, 0.5f, 1.5f);
    std::vector<float> y0 = rand_vec((size_t)n * stride, -1, 1);
    float *dy = dev_nan((size_t)n * stride);
    int off = 0;
    for (int k = 0; k < n_mats; k++) {
        b.y[k] = dy + off;
        b.y_stride[k] = stride;
        off += m[k].rows;
    }
    gemv_input in;
    memset(&in, 0, sizeof in);
    in.act = dev_copy(act);
    in.act_stride = cols;
    in.mode = mode;
    in.eps = 1e-6f;
    in.norm_w = dev_copy(mode == GEMV_IN_GATED ? gw : nw);
    in.z = dev_copy(z);
    in.z_stride = cols;
    in.head_dim = hd;
    gemm_act ga;
    ga.x = dev_alloc<__half>((size_t)n * cols);
    ga.xs = dev_alloc<float>((size_t)n * cols / 64);
    ga.scale = dev_alloc<float>(n);
    ga.cols = cols;
    gemm_args a;
    memset(&a, 0, sizeof a);
    for (int k = 0; k < n_mats; k++) {
        a.m[k] = b.m[k];
        a.y[k] = b.y[k];
        a.y_stride[k] = b.y_stride[k];
        a.row_start[k + 1] = b.row_start[k + 1];
    }
    a.n_mats = n_mats;
    a.act = ga;
    a.epi = out_mode == GEMV_OUT_ADD ? GEMM_EPI_ADD : GEMM_EPI_STORE;

    /* CPU twin, once for every configuration */
    std::vector<double> want((size_t)n * total), mag((size_t)n * total);
    std::vector<double> x(cols);
    for (int t = 0; t < n; t++) {
        ref_gemv_input(mode, &act[(size_t)t * cols], cols, nw, gw, hd, z, t, x);
        int o = 0;
        for (int k = 0; k < n_mats; k++)
            for (int r = 0; r < m[k].rows; r++, o++) {
                double acc = 0, mg = 0;
                for (int c = 0; c < cols; c++) {
                    acc += (double)m[k].w[(size_t)r * cols + c] * x[c];
                    mg += fabs((double)m[k].w[(size_t)r * cols + c] * x[c]);
                }
                if (out_mode == GEMV_OUT_ADD) acc += y0[(size_t)t * stride + o], mg += fabs(y0[(size_t)t * stride + o]);
                want[(size_t)t * total + o] = acc;
                mag[(size_t)t * total + o] = mg;
            }
    }
    std::vector<float> first;
    for (const gemm_cfg &k : cfg_list(false)) {
        a.kernel = k.kernel;
        a.tile_tokens = k.tile;
        if (out_mode == GEMV_OUT_ADD)
            CK(cudaMemcpy(dy, y0.data(), y0.size() * sizeof(float), cudaMemcpyHostToDevice));
        else
            CK(cudaMemset(dy, 0xff, (size_t)n * stride * sizeof(float)));
        cudaError_t e = launch_gemm_prep(in, cols, n, ga, 0);
        if (e == cudaSuccess)
            e = launch_gemm(a, n, 0);
        if (e == cudaSuccess)
            e = cudaDeviceSynchronize();
        char what[200];
        snprintf(what, sizeof what, "gemm %-5s T%3d bits %2d cols %4d rows %4d n %3d in %d out %d mats %d", cfg_name(k),
                 k.tile ? k.tile : gemm_dense_tile(k.kernel, n), bits, cols, rows, n, mode, out_mode, n_mats);
        if (e != cudaSuccess) {
            printf("FAIL %s: launch %s\n", what, cudaGetErrorString(e));
            g_fail++;
            cudaGetLastError();
            continue;
        }
        std::vector<float> got = host_copy(dy, (size_t)n * stride);
        std::vector<float> gotc((size_t)n * total);
        for (int t = 0; t < n; t++)
            for (int o = 0; o < total; o++)
                gotc[(size_t)t * total + o] = got[(size_t)t * stride + o];
        check(what, gotc, want, mag, 1e-3 * cfg_rel(k, bits));
        if (first.empty())
            first = gotc;
        else
            note_same(what, gotc, first);
        /* the padding column past the batch's rows stays untouched */
        bool ok = true;
        for (int t = 0; t < n; t++)
            for (int c = total; c < stride; c++) {
                const float p = got[(size_t)t * stride + c], q = y0[(size_t)t * stride + c];
                ok = ok && (out_mode == GEMV_OUT_ADD ? memcmp(&p, &q, sizeof p) == 0 : p != p);
            }
        g_checks++;
        if (!ok) {
            g_fail++;
            printf("FAIL %s: wrote past the last row\n", what);
        }
    }
}

/* ---- the MoE block (forward_prefill.cu) -------------------------------------------------------------- */

/* CPU twin of the MoE block given the GPU's router logits lg (top-k taken from them, so near-ties
 * cannot flip an expert): per-slot hid and down outputs (slot = t·(K+1) + k, k == K the shared expert),
 * the block output, and the rows per expert. */
struct moe_twin {
    std::vector<double> want, mag, lw, lm, hw, hmg, yw, ymg;
    std::vector<int> idx, rows_of; /* [n][K], [E] */
    std::vector<double> wts;       /* [n][K] renormalised routing weights */
};

static void moe_reference(const hmat &rt, const hmat &sgt, const hmat &g, const hmat &u, const hmat &d, const hmat &sg,
                          const hmat &su, const hmat &sd, const std::vector<float> &h, const std::vector<float> &nw,
                          const std::vector<float> &lg, int H, int E, int K, int inter, int n, moe_twin &tw)
{
    tw.want.assign((size_t)n * H, 0.0);
    tw.mag.assign((size_t)n * H, 0.0);
    tw.lw.assign((size_t)n * (E + 1), 0.0);
    tw.lm.assign((size_t)n * (E + 1), 0.0);
    tw.hw.assign((size_t)n * (K + 1) * inter, 0.0);
    tw.hmg.assign((size_t)n * (K + 1) * inter, 0.0);
    tw.yw.assign((size_t)n * (K + 1) * H, 0.0);
    tw.ymg.assign((size_t)n * (K + 1) * H, 0.0);
    tw.idx.assign((size_t)n * K, 0);
    tw.wts.assign((size_t)n * K, 0.0);
    tw.rows_of.assign(E, 0);
    for (int t = 0; t < n; t++) {
        std::vector<double> x(H);
        double ss = 0;
        for (int cc = 0; cc < H; cc++) ss += (double)h[(size_t)t * H + cc] * h[(size_t)t * H + cc];
        const double r = 1.0 / sqrt(ss / H + 1e-6);
        for (int cc = 0; cc < H; cc++) x[cc] = h[(size_t)t * H + cc] * r * nw[cc];
        for (int e = 0; e <= E; e++) {
            const hmat &R = e < E ? rt : sgt;
            const int row = e < E ? e : 0;
            double acc = 0, mg = 0;
            for (int cc = 0; cc < H; cc++) {
                acc += (double)R.w[(size_t)row * H + cc] * x[cc];
                mg += fabs((double)R.w[(size_t)row * H + cc] * x[cc]);
            }
            tw.lw[(size_t)t * (E + 1) + e] = acc;
            tw.lm[(size_t)t * (E + 1) + e] = mg;
        }
        const float *l = &lg[(size_t)t * (E + 1)];
        std::vector<int> idx;
        std::vector<bool> taken(E, false);
        std::vector<double> p;
        double sel = 0;
        for (int k = 0; k < K; k++) {
            int bi = -1;
            for (int e = 0; e < E; e++)
                if (!taken[e] && (bi < 0 || l[e] > l[bi])) bi = e;
            taken[bi] = true;
            idx.push_back(bi);
            tw.rows_of[bi]++;
            p.push_back(exp((double)l[bi] - l[idx[0]]));
            sel += p.back();
        }
        for (int k = 0; k < K; k++) {
            tw.idx[(size_t)t * K + k] = idx[k];
            tw.wts[(size_t)t * K + k] = p[k] / sel;
        }
        std::vector<double> out(H, 0.0), om(H, 0.0);
        for (int k = 0; k <= K; k++) {
            const size_t slot = (size_t)t * (K + 1) + k;
            const bool sh = k == K;
            const hmat &G = sh ? sg : g, &U = sh ? su : u, &Dm = sh ? sd : d;
            const size_t eb = sh ? 0 : (size_t)idx[k];
            const double wk = sh ? 1.0 / (1.0 + exp(-(double)l[E])) : p[k] / sel;
            std::vector<double> hid(inter), hm(inter);
            for (int i = 0; i < inter; i++) {
                double a1 = 0, a2 = 0, m1 = 0, m2 = 0;
                for (int cc = 0; cc < H; cc++) {
                    a1 += (double)G.w[(eb * inter + i) * H + cc] * x[cc];
                    a2 += (double)U.w[(eb * inter + i) * H + cc] * x[cc];
                    m1 += fabs((double)G.w[(eb * inter + i) * H + cc] * x[cc]);
                    m2 += fabs((double)U.w[(eb * inter + i) * H + cc] * x[cc]);
                }
                hid[i] = silu_d(a1) * a2;
                /* magnitude of hid's error terms: |silu'| <= 1.1 */
                hm[i] = fabs(hid[i]) + 1.1 * m1 * fabs(a2) + fabs(silu_d(a1)) * m2;
                tw.hw[slot * inter + i] = hid[i];
                tw.hmg[slot * inter + i] = hm[i];
            }
            for (int rr = 0; rr < H; rr++) {
                double acc = 0, mg = 0;
                for (int i = 0; i < inter; i++) {
                    acc += (double)Dm.w[(eb * H + rr) * inter + i] * hid[i];
                    mg += fabs((double)Dm.w[(eb * H + rr) * inter + i]) * hm[i];
                }
                out[rr] += wk * acc;
                om[rr] += fabs(wk) * mg;
                tw.yw[slot * H + rr] = acc;
                tw.ymg[slot * H + rr] = mg;
            }
        }
        for (int rr = 0; rr < H; rr++) {
            tw.want[(size_t)t * H + rr] = h[(size_t)t * H + rr] + out[rr];
            tw.mag[(size_t)t * H + rr] = fabs(h[(size_t)t * H + rr]) + om[rr];
        }
    }
}

static void poison(void *p, size_t bytes) { CK(cudaMemset(p, 0xff, bytes)); }

/* The MoE block's expert plan (launch_moe_plan) places each expert's rows in token order; every kernel
 * configuration runs on it. */

static void test_moe(int bits, int rbits, int H, int E, int K, int inter, int n)
{
    cuda_ctx c;
    memset(&c, 0, sizeof c);
    c.cfg.hidden = H;
    c.cfg.n_experts = E;
    c.cfg.n_experts_used = K;
    c.cfg.moe_intermediate = inter;
    c.cfg.shared_intermediate = inter;
    c.cfg.rms_norm_eps = 1e-6f;
    c.stream = 0;
    c.max_chunk = n;
    c.prefill_min_tokens = PREFILL_GEMM_MIN_TOKENS;
    /* scratch as alloc_scratch sizes it */
    const size_t C = n;
    c.pf_x_elems = C * H > C * K * inter + C * inter ? C * H : C * K * inter + C * inter;
    c.pf_x_rows = C * (K + 1);
    c.pf_x = dev_alloc<__half>(c.pf_x_elems);
    c.pf_xs = dev_alloc<float>(c.pf_x_elems / 64 + 1);
    c.pf_xscale = dev_alloc<float>(c.pf_x_rows);
    c.pf_y = dev_alloc<float>(C * (K + 1) * H);
    c.pf_gather = dev_alloc<int>(C * K);
    c.pf_slot_pos = dev_alloc<int>(C * K);
    c.pf_offsets = dev_alloc<int>(E + 1);
    c.pf_plan_counts = dev_alloc<int>((size_t)moe_plan_chunks(n) * E);
    c.pf_tile_expert = dev_alloc<int>(C * K + E + 1);
    c.pf_tile_start = dev_alloc<int>(C * K + E + 1);
    c.pf_n_tiles = dev_alloc<int>(1);
    c.router = dev_nan(C * (E + 1));
    c.hid = dev_nan(C * (K + 1) * inter);
    c.topk_idx = dev_alloc<int>(C * K);
    c.topk_w = dev_nan(C * K);

    hmat rt, sgt, g, u, d, sg, su, sd;
    make_host(rt, rbits, 1, E, H);
    /* columns 0..63 of x are large and positive: expert 0 weighs them +0.5 (every token picks it),
     * expert E-1 -0.5 (never picked), the others 0 (their choice comes from the random columns) */
    set_group(rt, 0, 0, 0.5f);
    set_group(rt, E - 1, 0, -0.5f);
    for (int e = 1; e < E - 1; e++)
        set_group(rt, e, 0, 0.0f);
    upload(rt);
    make_mat(sgt, rbits, 1, 1, H);
    make_mat(g, bits, E, inter, H);
    make_mat(u, bits, E, inter, H);
    make_mat(d, bits, E, H, inter);
    make_mat(sg, bits, 1, inter, H);
    make_mat(su, bits, 1, inter, H);
    make_mat(sd, bits, 1, H, inter);
    cuda_layer L;
    memset(&L, 0, sizeof L);
    std::vector<float> h = rand_vec((size_t)n * H, -1, 1), nw = rand_vec(H, 0.5f, 1.5f);
    for (int t = 0; t < n; t++)
        for (int cc = 0; cc < 64; cc++)
            h[(size_t)t * H + cc] = 1.0f;
    L.post_norm = dev_copy(nw);
    L.router = rt.d;
    L.shared_expert_gate = sgt.d;
    L.ex_gate = g.d, L.ex_up = u.d, L.ex_down = d.d;
    L.sh_gate = sg.d, L.sh_up = su.d, L.sh_down = sd.d;
    c.h = dev_copy(h);

    moe_twin tw;
    std::vector<float> twin_lg, first_out;
    const std::vector<gemm_cfg> cfgs = cfg_list(true);
    const int n_cfgs = (int)cfgs.size();
    for (int ci = 0; ci < n_cfgs; ci++) {
        const gemm_cfg &kc = cfgs[ci];
        c.kernels.gemm = (gemm_kernel_id)kc.kernel;
        const int T = gemm_grouped_tile(kc.kernel, (double)n * K / E);
        /* fresh input and poisoned outputs for every configuration */
        CK(cudaMemcpy(c.h, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
        poison(c.router, C * (E + 1) * sizeof(float));
        poison(c.hid, C * (K + 1) * inter * sizeof(float));
        poison(c.pf_x, c.pf_x_elems * sizeof(__half));
        poison(c.pf_xs, (c.pf_x_elems / 64 + 1) * sizeof(float));
        poison(c.pf_xscale, c.pf_x_rows * sizeof(float));
        poison(c.pf_y, C * (K + 1) * H * sizeof(float));
        poison(c.pf_gather, C * K * sizeof(int));
        poison(c.pf_slot_pos, C * K * sizeof(int));
        poison(c.pf_offsets, (E + 1) * sizeof(int));
        poison(c.pf_tile_expert, (C * K + E + 1) * sizeof(int));
        poison(c.pf_tile_start, (C * K + E + 1) * sizeof(int));
        poison(c.topk_idx, C * K * sizeof(int));
        poison(c.topk_w, C * K * sizeof(float));
        lily_error err;
        memset(&err, 0, sizeof err);
        char what[200];
        snprintf(what, sizeof what, "moe %-5s T%3d bits %2d router %2d hidden %4d E %3d top-%d inter %3d n %3d",
                 cfg_name(kc), T, bits, rbits, H, E, K, inter, n);
        lily_status st = cuda_prefill_moe(&c, &L, n, &err);
        cudaError_t ce = cudaDeviceSynchronize();
        if (st != LILY_OK || ce != cudaSuccess) {
            printf("FAIL %s: %s %s\n", what, st != LILY_OK ? err.message : "", cudaGetErrorString(ce));
            g_fail++;
            cudaGetLastError();
            continue;
        }
        std::vector<float> got = host_copy(c.h, (size_t)n * H);
        std::vector<float> lg = host_copy(c.router, (size_t)n * (E + 1));
        std::vector<int> gidx = host_copy(c.topk_idx, (size_t)n * K);
        std::vector<float> gw = host_copy(c.topk_w, (size_t)n * K);
        std::vector<int> off = host_copy(c.pf_offsets, (size_t)E + 1);
        std::vector<int> gat = host_copy(c.pf_gather, (size_t)n * K), spos = host_copy(c.pf_slot_pos, (size_t)n * K);
        std::vector<int> ntl = host_copy(c.pf_n_tiles, 1);
        std::vector<int> tex = host_copy(c.pf_tile_expert, (size_t)n * K + E + 1);
        std::vector<int> tst = host_copy(c.pf_tile_start, (size_t)n * K + E + 1);
        std::vector<float> ghid = host_copy(c.hid, (size_t)n * (K + 1) * inter);
        std::vector<float> gy = host_copy(c.pf_y, (size_t)n * (K + 1) * H);
        /* the twin depends on the logits only (top-k from the GPU's logits): recompute when they change */
        if (twin_lg.size() != lg.size() || memcmp(twin_lg.data(), lg.data(), lg.size() * sizeof(float)) != 0) {
            if (!twin_lg.empty())
                printf("note %s: router logits differ from the previous configuration's, twin recomputed\n", what);
            moe_reference(rt, sgt, g, u, d, sg, su, sd, h, nw, lg, H, E, K, inter, n, tw);
            twin_lg = lg;
        }
        /* GPU per-slot intermediates in the twin's slot order */
        std::vector<float> hgot((size_t)n * (K + 1) * inter), ygot((size_t)n * (K + 1) * H);
        int map_bad = 0, topk_bad = 0;
        for (int t = 0; t < n; t++) {
            for (int k = 0; k < K; k++)
                if (gidx[(size_t)t * K + k] != tw.idx[(size_t)t * K + k] ||
                    !(fabs(gw[(size_t)t * K + k] - tw.wts[(size_t)t * K + k]) <= 1e-5))
                    topk_bad++;
            for (int k = 0; k <= K; k++) {
                int grow = (int)((size_t)n * K + t); /* GPU row of this slot: expert position or nk + t */
                if (k < K) {
                    grow = spos[(size_t)t * K + k];
                    if (grow < 0 || grow >= n * K || gat[grow] != t) {
                        map_bad++;
                        grow = -1;
                    }
                }
                const size_t slot = (size_t)t * (K + 1) + k;
                for (int i = 0; i < inter; i++)
                    hgot[slot * inter + i] = grow >= 0 ? ghid[(size_t)grow * inter + i] : NAN;
                for (int rr = 0; rr < H; rr++)
                    ygot[slot * H + rr] = grow >= 0 ? gy[(size_t)grow * H + rr] : NAN;
            }
        }
        char w2[400];
        snprintf(w2, sizeof w2, "%s router logits", what);
        check(w2, lg, tw.lw, tw.lm, 1e-3 * cfg_rel(kc, rbits));
        g_checks++;
        if (topk_bad) {
            g_fail++;
            printf("FAIL %s: %d top-k slots differ from the CPU top-k of the same logits\n", what, topk_bad);
        }
        /* offsets = exclusive scan of the rows per expert */
        int zero = 0, one = 0, many = 0, acc_off = 0;
        bool off_ok = true;
        for (int e = 0; e < E; e++) {
            off_ok = off_ok && off[e] == acc_off;
            acc_off += tw.rows_of[e];
            zero += tw.rows_of[e] == 0;
            one += tw.rows_of[e] == 1;
            many += tw.rows_of[e] > 1;
        }
        off_ok = off_ok && off[E] == acc_off && tw.rows_of[0] == n && tw.rows_of[E - 1] == 0;
        g_checks++;
        if (!off_ok) {
            g_fail++;
            printf("FAIL %s: expert offsets (or the forced routing) wrong\n", what);
        }
        /* tile map: ceil(rows / T) tiles per expert in expert order, T apart */
        int want_tiles = 0;
        bool map_ok = true;
        for (int e = 0; e < E && map_ok; e++)
            for (int j = 0; j * T < tw.rows_of[e]; j++, want_tiles++)
                map_ok = map_ok && want_tiles < moe_max_tiles(n, K, E, T) && tex[want_tiles] == e &&
                         tst[want_tiles] == off[e] + j * T;
        map_ok = map_ok && ntl[0] == want_tiles;
        g_checks++;
        if (!map_ok) {
            g_fail++;
            printf("FAIL %s: tile map (%d tiles, want %d) wrong for T %d\n", what, ntl[0], want_tiles, T);
        }
        g_checks++;
        if (map_bad) {
            g_fail++;
            printf("FAIL %s: %d (token, slot) positions not mapped back to their token\n", what, map_bad);
        }
        { /* positions within an expert in token order */
            int unordered = 0;
            for (int e = 0; e < E; e++)
                for (int p = off[e] + 1; p < off[e + 1] && p < n * K; p++)
                    unordered += !(p > 0 && p < n * K && gat[p] > gat[p - 1]);
            g_checks++;
            if (unordered) {
                g_fail++;
                printf("FAIL %s: %d positions out of token order within their expert\n", what, unordered);
            } else {
                printf("PASS %s: positions in token order within every expert\n", what);
            }
        }
        snprintf(w2, sizeof w2, "%s hid (silu(gate)*up per slot)", what);
        check(w2, hgot, tw.hw, tw.hmg, 1e-3 * cfg_rel(kc, bits));
        snprintf(w2, sizeof w2, "%s down per slot", what);
        check(w2, ygot, tw.yw, tw.ymg, 3e-3 * cfg_rel(kc, bits));
        snprintf(w2, sizeof w2, "%s out (experts with 0/1/many rows: %d/%d/%d)", what, zero, one, many);
        check(w2, got, tw.want, tw.mag, 3e-3 * cfg_rel(kc, bits));
        if (first_out.empty())
            first_out = got;
        else
            note_same(what, got, first_out);
    }
}

int main(void)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    {
        int major = 0, minor = 0;
        CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
        CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
        g_wg = gemm_wgmma_available();
        printf("note: compute capability %d.%d, wgmma kernel %s\n", major, minor,
               g_wg ? "available" : "not available: only the mma.sync kernels are checked");
        if (!LILY_BUILD_SM90A) {
            printf("NOTE: a build without sm_90a code: the wgmma availability check is skipped\n");
        } else {
            g_checks++;
            if (major == 9 && minor == 0 && !g_wg) {
                g_fail++;
                printf("FAIL wgmma kernel not available on a compute capability 9.0 device (binary without sm_90a?)\n");
            }
        }
        /* the one choice of the prefill GEMM family: wgmma where its kernel runs, else the DQ form */
        const gemm_kernel_id want = g_wg ? GEMM_KERNEL_WGMMA : GEMM_KERNEL_MMA_DQ, got = gemm_kernel_choose();
        g_checks++;
        if (got != want) {
            g_fail++;
            printf("FAIL gemm_kernel_choose: %d, want %d\n", (int)got, (int)want);
        } else {
            printf("PASS gemm_kernel_choose: %s\n", g_wg ? "wgmma" : "mma.sync on fp16-dequantized weights (dq)");
        }
    }
    const int ns[] = {1, 2, 7, 64, 513};
    const int bitss[] = {4, 8, 16};
    /* 1-8 warps per row (cols 64..8192), odd row counts, a padded stride, gated heads of 32..256, and
     * shapes the rows kernel leaves to the block kernel (1088: 68 chunks per warp) */
    {
        const int pc[] = {64, 192, 512, 960, 1024, 2048, 4096, 8192, 1088};
        for (int i = 0; i < 9; i++)
            for (int m = 0; m < 3; m++)
                test_prep(pc[i], i % 2 ? 513 : 37, m, pc[i] % 256 ? 32 : 128, pc[i]);
        test_prep(512, 100, GEMV_IN_PLAIN, 32, 516);
        test_prep(4096, 9, GEMV_IN_GATED, 256, 4096);
        test_prep(2048, 33, GEMV_IN_GATED, 64, 2048);
    }
    for (int bi = 0; bi < 3; bi++) {
        const int bits = bitss[bi];
        for (int i = 0; i < 5; i++)
            test_dense(bits, 128, 37, ns[i], GEMV_IN_RMSNORM, GEMV_OUT_STORE, 1);
        test_dense(bits, 512, 61, 64, GEMV_IN_PLAIN, GEMV_OUT_ADD, 3);
        test_dense(bits, 256, 129, 17, GEMV_IN_GATED, GEMV_OUT_ADD, 1);
        test_dense(bits, 2048, 200, 70, GEMV_IN_RMSNORM, GEMV_OUT_STORE, 2);
        /* 1, 3 groups: fewer groups than pipeline stages */
        test_dense(bits, 64, 45, 131, GEMV_IN_RMSNORM, GEMV_OUT_STORE, 1);
        test_dense(bits, 192, 77, 129, GEMV_IN_PLAIN, GEMV_OUT_ADD, 2);
    }
    test_dense(4, 2048, 300, 513, GEMV_IN_RMSNORM, GEMV_OUT_STORE, 3);
    test_dense(4, 4096, 131, 33, GEMV_IN_GATED, GEMV_OUT_ADD, 1);
    test_dense(16, 4096, 64, 100, GEMV_IN_PLAIN, GEMV_OUT_ADD, 1);
    /* MoE: tiny-a shape (4-bit experts, 8-bit router; bf16), every tile width, a wide shape; n 130 and
     * 513 give expert 0 ragged 128-token tiles (2 and 1 rows in the last), 700 an automatic 128 */
    for (int i = 0; i < 5; i++)
        test_moe(4, 8, 128, 16, 4, 64, ns[i]);
    test_moe(4, 8, 128, 16, 4, 64, 130);
    test_moe(4, 8, 128, 16, 4, 64, 700);
    test_moe(8, 8, 128, 16, 4, 128, 300);
    test_moe(16, 16, 128, 16, 4, 64, 64);
    test_moe(16, 16, 128, 16, 4, 64, 300);
    test_moe(8, 8, 256, 32, 8, 128, 40);
    test_moe(4, 8, 1024, 64, 8, 256, 96);
    test_moe(4, 8, 2048, 256, 8, 512, 20);
    /* the wgmma kernel's TMA X tiles: ragged last tiles (n 70, 131, 513, 33), ADD, several matrices, a
     * gated input */
    test_dense(4, 2048, 200, 70, GEMV_IN_RMSNORM, GEMV_OUT_STORE, 2);
    test_dense(4, 192, 77, 131, GEMV_IN_PLAIN, GEMV_OUT_ADD, 2);
    test_dense(4, 2048, 300, 513, GEMV_IN_RMSNORM, GEMV_OUT_STORE, 3);
    test_dense(4, 4096, 131, 33, GEMV_IN_GATED, GEMV_OUT_ADD, 1);
    test_dense(4, 64, 45, 131, GEMV_IN_RMSNORM, GEMV_OUT_STORE, 1);
    printf("%d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
