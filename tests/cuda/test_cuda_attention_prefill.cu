/* test_cuda_attention_prefill.cu — the tensor-core prefill attention (attention_prefill.cu) against a
 * double-precision CPU twin: random q, bf16 KV cache and gates, n = 1, 2, 7, 64, 513 (+ odd sizes) at
 * pos = 0 and deep positions, one split and split-KV; outputs and partial buffers poisoned with NaN, and
 * the cache rows past pos + n are NaN too (the kernel must never read them into a result).
 * Exits 77 (CTest: skipped) when no GPU is present.
 *
 * The kernel rounds q to bf16 (the twin does the same) and the softmax weights P to bf16 before P·V, with
 * the denominator summed over the rounded weights: each weight is off by at most 2^-9 relative, so
 * |gpu - cpu| <= 2 * 2^-9 * sum_k p_k |v_k| / sum_k p_k * sigmoid(gate) = 3.9e-3 * mag (reached by rows of
 * a few keys with cancelling values), + fp32 accumulation and exp2 approximation: bound 5e-3 * mag + 1e-5.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "base/dtype.h"
}

#define CUDA_TEST_SEED 0x9e3779b97f4a7c15ull
#include "cuda_test_util.cuh"

static int g_fail = 0, g_checks = 0;

/* splits: 1 = one split, > 1 = that many, 0 = attention_prefill_splits' choice (capacity 64 like decode) */
static void test_prefill(int nh, int nkv, int D, int pos0, int n, int splits)
{
    const int G = nh / nkv, max_ctx = pos0 + n + 5, qkv_stride = nh * 2 * D + 2 * nkv * D + 4;
    std::vector<float> q((size_t)n * nh * D), qkv((size_t)n * qkv_stride);
    for (auto &x : q) x = rnd_f(-3, 3);
    for (auto &x : qkv) x = rnd_f(-3, 3);
    std::vector<uint16_t> kc((size_t)nkv * max_ctx * D), vc((size_t)nkv * max_ctx * D);
    for (int h = 0; h < nkv; h++)
        for (int k = 0; k < max_ctx; k++)
            for (int d = 0; d < D; d++) {
                const size_t i = ((size_t)h * max_ctx + k) * D + d;
                const bool live = k < pos0 + n;
                kc[i] = live ? lily_f32_to_bf16(rnd_f(-1, 1)) : 0x7fc0; /* NaN past the chunk */
                vc[i] = live ? lily_f32_to_bf16(rnd_f(-1, 1)) : 0x7fc0;
            }

    attn_args a;
    memset(&a, 0, sizeof a);
    a.qkv = dev_copy(qkv);
    a.qkv_stride = qkv_stride;
    a.q = dev_copy(q);
    a.k_cache = (__nv_bfloat16 *)dev_copy(kc);
    a.v_cache = (__nv_bfloat16 *)dev_copy(vc);
    a.max_ctx = max_ctx;
    std::vector<int> p0(1, pos0);
    a.pos = dev_copy(p0);
    a.n_heads = nh, a.n_kv = nkv, a.head_dim = D, a.rot_dim = 0, a.rope_theta = 1e7f;
    std::vector<float> nan_out((size_t)n * nh * D, NAN);
    a.out = dev_copy(nan_out);
    a.n_splits = splits > 0 ? splits : attention_prefill_splits(a, n, pos0, 64);
    std::vector<float> nan_po((size_t)a.n_splits * n * nh * D, NAN), nan_pml((size_t)a.n_splits * n * nh * 2, NAN);
    a.part_o = dev_copy(nan_po);
    a.part_ml = dev_copy(nan_pml);

    char what[160];
    snprintf(what, sizeof what, "attention_prefill heads %d/%d D %d pos %d n %d splits %d", nh, nkv, D, pos0, n,
             a.n_splits);
    cudaError_t e = launch_attention_prefill(a, n, 0);
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize();
    g_checks++;
    if (e != cudaSuccess) {
        printf("FAIL %s: launch/run %s\n", what, cudaGetErrorString(e));
        g_fail++;
        exit(1); /* a device fault poisons the context: stop here */
    }
    std::vector<float> got((size_t)n * nh * D);
    CK(cudaMemcpy(got.data(), a.out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));

    /* twin on every token of small chunks, every 5th (+ the last two) of large ones; NaN check on all */
    size_t n_nan = 0, first_nan = 0;
    for (size_t i = 0; i < got.size(); i++)
        if (got[i] != got[i] && !n_nan++)
            first_nan = i;
    const int stride = n > 100 ? 5 : 1;
    double worst = 0, max_err = 0, bound_at_worst = 0;
    size_t bad = 0, n_cmp = 0;
    int bad_t = -1, bad_h = -1, bad_d = -1;
    double bad_got = 0, bad_want = 0;
    std::vector<double> sc(pos0 + n), qb(D);
    for (int t = 0; t < n; t++) {
        if (t % stride && t < n - 2)
            continue;
        for (int h = 0; h < nh; h++) {
            const int g = h / G, L = pos0 + t + 1;
            for (int d = 0; d < D; d++) qb[d] = lily_bf16_to_f32(lily_f32_to_bf16(q[((size_t)t * nh + h) * D + d]));
            double mx = -INFINITY;
            for (int k = 0; k < L; k++) {
                double s = 0;
                const uint16_t *kr = &kc[((size_t)g * max_ctx + k) * D];
                for (int d = 0; d < D; d++) s += qb[d] * lily_bf16_to_f32(kr[d]);
                sc[k] = s / sqrt((double)D);
                mx = fmax(mx, sc[k]);
            }
            double den = 0;
            for (int k = 0; k < L; k++) den += (sc[k] = exp(sc[k] - mx));
            for (int d = 0; d < D; d++) {
                double o = 0, om = 0;
                for (int k = 0; k < L; k++) {
                    const double v = lily_bf16_to_f32(vc[((size_t)g * max_ctx + k) * D + d]);
                    o += sc[k] * v;
                    om += sc[k] * fabs(v);
                }
                const double gate = 1.0 / (1.0 + exp(-(double)qkv[(size_t)t * qkv_stride + (size_t)h * 2 * D + D + d]));
                const double want = o / den * gate, tol = 5e-3 * om / den * gate + 1e-5;
                const double gv = got[((size_t)t * nh + h) * D + d], err = fabs(gv - want);
                n_cmp++;
                if (!(err <= tol)) {
                    if (!bad) {
                        bad_t = t, bad_h = h, bad_d = d;
                        bad_got = gv, bad_want = want;
                    }
                    bad++;
                }
                if (err > max_err || gv != gv)
                    max_err = gv != gv ? INFINITY : err;
                if (err / tol > worst || gv != gv) {
                    worst = gv != gv ? INFINITY : err / tol;
                    bound_at_worst = tol;
                }
            }
        }
    }
    if (bad || n_nan) {
        g_fail++;
        printf("FAIL %s: %zu of %zu compared outside the bound, %zu NaN of %zu outputs; max err %.3g, worst %.3g of "
               "the bound (bound there %.3g)",
               what, bad, n_cmp, n_nan, got.size(), max_err, worst, bound_at_worst);
        if (bad)
            printf("; first t %d h %d d %d: got %.6g want %.6g", bad_t, bad_h, bad_d, bad_got, bad_want);
        if (n_nan)
            printf("; first NaN t %zu h %zu d %zu", first_nan / ((size_t)nh * D), first_nan / D % nh, first_nan % D);
        printf("\n");
    } else {
        printf("PASS %s: max err %.3g, worst %.3f of the bound (bound there %.3g), %zu compared\n", what, max_err,
               worst, bound_at_worst, n_cmp);
    }
    cudaFree(a.qkv);
    cudaFree(a.q);
    cudaFree(a.k_cache);
    cudaFree(a.v_cache);
    cudaFree((void *)a.pos);
    cudaFree(a.out);
    cudaFree(a.part_o);
    cudaFree(a.part_ml);
}

int main(void)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const int ns[] = {1, 2, 7, 64, 513};
    const int poss[] = {0, 1000};
    for (int pi = 0; pi < 2; pi++)
        for (int i = 0; i < 5; i++) {
            test_prefill(16, 2, 256, poss[pi], ns[i], 1); /* Qwen3.5/3.6 */
            test_prefill(8, 2, 64, poss[pi], ns[i], 1);   /* tiny-a */
        }
    /* odd shapes: G = 4 / 1, head_dim 128, chunks that do not fill a 64-row tile */
    test_prefill(12, 3, 128, 77, 33, 1);
    test_prefill(4, 4, 128, 5, 70, 1);
    test_prefill(16, 2, 256, 3, 5, 1);
    test_prefill(8, 2, 64, 31, 129, 1);
    /* lily-tiny: G = 3 (6 query heads over 2 KV heads), head_dim 64 */
    test_prefill(6, 2, 64, 0, 2, 1);
    test_prefill(6, 2, 64, 0, 7, 1);
    test_prefill(6, 2, 64, 20, 15, 1);
    test_prefill(6, 2, 64, 0, 40, 1);
    test_prefill(6, 2, 64, 700, 7, 4);
    /* split-KV: explicit counts (some splits empty), and the launcher's own choice */
    test_prefill(16, 2, 256, 1000, 1, 64);
    test_prefill(16, 2, 256, 1000, 2, 8);
    test_prefill(16, 2, 256, 5000, 7, 9);
    test_prefill(8, 2, 64, 300, 3, 5);
    test_prefill(16, 2, 256, 4000, 2, 0);
    test_prefill(8, 2, 64, 2000, 9, 0);
    printf("%d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
