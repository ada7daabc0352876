/* test_cuda_attention_prefill.cu — the tensor-core prefill attention (attention_prefill.cu) against a
 * double-precision CPU twin: random q, bf16 KV cache and gates, n = 1, 2, 7, 64, 513 (+ odd sizes) at
 * pos = 0 and deep positions, one split and split-KV; outputs and partial buffers poisoned with NaN, and
 * the cache rows past pos + n are NaN too (the kernel must never read them into a result).
 * Every case runs the mma.sync kernel (ATTN_PREFILL_MMA) and, on an sm_90a GPU, the wgmma kernel
 * (ATTN_PREFILL_WGMMA, attention_prefill_wg.cu; lines tagged "wgmma"; its own split count), each against
 * the same twin and bound. Exits 77 (CTest: skipped) when no GPU is present.
 *
 * The kernel rounds q to bf16 (the twin does the same) and the softmax weights P to bf16 before P·V, with
 * the denominator summed over the rounded weights: each weight is off by at most 2^-9 relative, so
 * |gpu - cpu| <= 2 * 2^-9 * sum_k p_k |v_k| / sum_k p_k * sigmoid(gate) = 3.9e-3 * mag (reached by rows of
 * a few keys with cancelling values), + fp32 accumulation and exp2 approximation: bound 5e-3 * mag + 1e-5.
 *
 * q: the kernel reads the raw q from qkv and applies the q RMSNorm and partial RoPE (rot_dim 0 .. D)
 * itself; the twin does norm + RoPE in double (the angle in fp32 as MODEL.md
 * §4.3 specifies it) and rounds q to bf16. The GPU's fp32 q differs from the twin's by at most
 * Delta_d = (|x_d| + |x_pair|) * (2e-6 + dang) (fp32 norm; --use_fast_math makes powf __powf =
 * exp2(e * lg2.approx(theta)), e = 2i / rot_dim: inv_freq within 1.5e-6 + 1e-5 e relative, a generous
 * margin, so dang = that * |angle|), so each bf16 q element can differ by
 * u_d = |bf16(q + Delta) - bf16(q - Delta)| (zero away from a rounding boundary).
 * That moves each score by at most e_k = sum_d u_d |k_d| / sqrt(D) <= E, each softmax weight by a factor
 * within exp(+-2E): the bound gains (exp(2E) - 1) * mag ("q slack" below; small at shallow positions).
 * Each case also compares norm_rope.cu's k/v-only launch (a.q_fused) with the full one (cache rows
 * bit-identical, q untouched). Last, an fp32 (exact-mode) cache must be refused.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "backend/cuda/attention/attention_prefill_wg.cuh"

extern "C" {
#include "base/dtype.h"
}

#define CUDA_TEST_SEED 0x9e3779b97f4a7c15ull
#include "cuda_test_util.cuh"
#include "cuda_test_check.cuh"

static bool g_wg; /* the wgmma variant runs on this GPU (attention_prefill_wg_available) */
#define N_VAR 2   /* attn_prefill_kernel: ATTN_PREFILL_MMA, ATTN_PREFILL_WGMMA */

/* bf16 rounding of a double through fp32, back as double */
static double bf16_round(double x) { return lily_bf16_to_f32(lily_f32_to_bf16((float)x)); }

/* Twin of the fused q staging for token t (position p), head h: q (double, normed + rotated) and the
 * bound u on |gpu bf16 q - bf16(q)| per dim (see the header). */
static void twin_q_fused(const std::vector<float> &qkv, int qkv_stride, int t, int h, int D, int rot, int p,
                         const std::vector<float> &qn, std::vector<double> &q, std::vector<double> &u)
{
    const float *src = &qkv[(size_t)t * qkv_stride + (size_t)h * 2 * D];
    double ss = 0;
    for (int d = 0; d < D; d++) ss += (double)src[d] * src[d];
    const double r = 1.0 / sqrt(ss / D + (double)1e-6f);
    std::vector<double> x(D), dl(D);
    for (int d = 0; d < D; d++) {
        x[d] = src[d] * r * qn[d];
        q[d] = x[d];
        dl[d] = 2e-6 * fabs(x[d]);
    }
    const int half = rot / 2;
    for (int i = 0; i < half; i++) {
        const float e = (float)(2 * i) / (float)rot;
        const float inv = 1.0f / powf(1e7f, e);
        const float ang = (float)p * inv;
        const double c = cos((double)ang), sn = sin((double)ang);
        const double dang = fabs((double)ang) * (1.5e-6 + 1e-5 * e);
        const double a0 = x[i], a1 = x[i + half], slack = (fabs(a0) + fabs(a1)) * (2e-6 + dang);
        q[i] = a0 * c - a1 * sn;
        q[i + half] = a1 * c + a0 * sn;
        dl[i] = slack + 1.2e-7 * fabs(q[i]);
        dl[i + half] = slack + 1.2e-7 * fabs(q[i + half]);
    }
    for (int d = 0; d < D; d++) u[d] = fabs(bf16_round(q[d] + dl[d]) - bf16_round(q[d] - dl[d]));
}

/* norm_rope.cu's k/v-only launch (a.q_fused, what precedes the flash kernel) against its full launch over
 * copies of the cache: the same cache bits, q untouched. */
static void check_norm_rope_kv_only(const attn_args &a, int n, const char *what, const std::vector<uint16_t> &kc,
                                    const std::vector<uint16_t> &vc)
{
    const size_t nq = (size_t)n * a.n_heads * a.head_dim, nc = kc.size();
    attn_args full = a, kv = a;
    full.q_fused = 0;
    full.q = dev_nan(nq);
    full.k_cache = (__nv_bfloat16 *)dev_copy(kc);
    full.v_cache = (__nv_bfloat16 *)dev_copy(vc);
    kv.q_fused = 1;
    kv.q = dev_nan(nq);
    kv.k_cache = (__nv_bfloat16 *)dev_copy(kc);
    kv.v_cache = (__nv_bfloat16 *)dev_copy(vc);
    cudaError_t e = launch_qk_norm_rope_append(full, n, 0);
    if (e == cudaSuccess)
        e = launch_qk_norm_rope_append(kv, n, 0);
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize();
    g_checks++;
    if (e != cudaSuccess) {
        printf("FAIL %s: norm_rope launch/run %s\n", what, cudaGetErrorString(e));
        g_fail++;
        exit(1);
    }
    const std::vector<float> qkv_only = host_copy(kv.q, nq);
    const std::vector<uint16_t> kf = host_copy((const uint16_t *)full.k_cache, nc),
                                vf = host_copy((const uint16_t *)full.v_cache, nc),
                                kk = host_copy((const uint16_t *)kv.k_cache, nc),
                                vk = host_copy((const uint16_t *)kv.v_cache, nc);
    size_t kv_diff = 0, q_written = 0, appended = 0;
    for (size_t i = 0; i < nc; i++) {
        kv_diff += kf[i] != kk[i] || vf[i] != vk[i];
        appended += kf[i] != kc[i];
    }
    for (size_t i = 0; i < nq; i++) q_written += qkv_only[i] == qkv_only[i];
    if (kv_diff || q_written || !appended) {
        g_fail++;
        printf("FAIL %s: norm_rope k/v only: %zu of %zu cache values differ from the full launch, %zu q values "
               "written, %zu k values appended\n", what, kv_diff, 2 * nc, q_written, appended);
    } else {
        printf("PASS %s: norm_rope k/v only: cache identical to the full launch, q untouched\n", what);
    }
    cudaFree(full.q);
    cudaFree(full.k_cache);
    cudaFree(full.v_cache);
    cudaFree(kv.q);
    cudaFree(kv.k_cache);
    cudaFree(kv.v_cache);
}

/* splits: 1 = one split, > 1 = that many, 0 = attention_prefill_splits' choice (capacity 64 like decode).
 * rot: the rotary dims (0: q normed, not rotated). */
static void test_prefill(int nh, int nkv, int D, int pos0, int n, int splits, int rot = 0)
{
    const int G = nh / nkv, max_ctx = pos0 + n + 5, qkv_stride = nh * 2 * D + 2 * nkv * D + 4;
    std::vector<float> qkv((size_t)n * qkv_stride);
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

    /* q_norm weight (1 + w form) */
    const std::vector<float> qn = rand_vec(D, 0.5f, 1.5f);

    attn_args a;
    memset(&a, 0, sizeof a);
    a.qkv = dev_copy(qkv);
    a.qkv_stride = qkv_stride;
    a.q = dev_nan((size_t)n * nh * D); /* never read */
    a.q_norm = dev_copy(qn);
    a.k_norm = a.q_norm; /* the norm_rope comparison norms k too */
    a.eps = 1e-6f;
    a.q_fused = 1;
    a.k_cache = (__nv_bfloat16 *)dev_copy(kc);
    a.v_cache = (__nv_bfloat16 *)dev_copy(vc);
    a.max_ctx = max_ctx;
    std::vector<int> p0(1, pos0);
    a.pos = dev_copy(p0);
    a.n_heads = nh, a.n_kv = nkv, a.head_dim = D, a.rot_dim = rot, a.rope_theta = 1e7f;
    /* one launch per kernel (mma.sync; wgmma where it runs), each compared with the same twin below */
    static const char *const var_tag[N_VAR] = {"", " wgmma"};
    const int n_var = g_wg ? N_VAR : 1;
    std::vector<float> got[N_VAR];
    std::vector<int> var_splits(n_var);
    char what[N_VAR][160];
    for (int v = 0; v < n_var; v++) {
        a.prefill_kernel = v == 0 ? ATTN_PREFILL_MMA : ATTN_PREFILL_WGMMA;
        a.n_splits = splits > 0 ? splits : attention_prefill_splits(a, n, pos0, 64);
        var_splits[v] = a.n_splits;
        std::vector<float> nan_out((size_t)n * nh * D, NAN);
        a.out = dev_copy(nan_out);
        std::vector<float> nan_po((size_t)a.n_splits * n * nh * D, NAN), nan_pml((size_t)a.n_splits * n * nh * 2, NAN);
        a.part_o = dev_copy(nan_po);
        a.part_ml = dev_copy(nan_pml);
        char fq[32];
        snprintf(fq, sizeof fq, " rot %d", rot);
        snprintf(what[v], sizeof what[v], "attention_prefill%s heads %d/%d D %d pos %d n %d splits %d%s", var_tag[v], nh,
                 nkv, D, pos0, n, a.n_splits, fq);
        cudaError_t e = launch_attention_prefill(a, n, 0);
        if (e == cudaSuccess)
            e = cudaDeviceSynchronize();
        g_checks++;
        if (e != cudaSuccess) {
            printf("FAIL %s: launch/run %s\n", what[v], cudaGetErrorString(e));
            g_fail++;
            exit(1); /* a device fault poisons the context: stop here */
        }
        got[v] = host_copy(a.out, (size_t)n * nh * D);
        if (v == 0)
            check_norm_rope_kv_only(a, n, what[v], kc, vc);
        cudaFree(a.out);
        cudaFree(a.part_o);
        cudaFree(a.part_ml);
    }

    /* twin on every token of small chunks, every 5th (+ the last two) of large ones; NaN check on all */
    struct stats {
        double worst = 0, max_err = 0, bound_at_worst = 0;
        size_t bad = 0, n_nan = 0, first_nan = 0;
        int bad_t = -1, bad_h = -1, bad_d = -1;
        double bad_got = 0, bad_want = 0;
    } stv[N_VAR];
    for (int v = 0; v < n_var; v++)
        for (size_t i = 0; i < got[v].size(); i++)
            if (got[v][i] != got[v][i] && !stv[v].n_nan++)
                stv[v].first_nan = i;
    const int stride = n > 100 ? 5 : 1;
    double max_slack = 0;
    size_t n_cmp = 0;
    std::vector<double> sc(pos0 + n), qb(D), qf(D), u(D, 0.0);
    for (int t = 0; t < n; t++) {
        if (t % stride && t < n - 2)
            continue;
        for (int h = 0; h < nh; h++) {
            const int g = h / G, L = pos0 + t + 1;
            twin_q_fused(qkv, qkv_stride, t, h, D, rot, pos0 + t, qn, qf, u);
            for (int d = 0; d < D; d++) qb[d] = bf16_round(qf[d]);
            double mx = -INFINITY, E = 0;
            for (int k = 0; k < L; k++) {
                double s = 0, ek = 0;
                const uint16_t *kr = &kc[((size_t)g * max_ctx + k) * D];
                for (int d = 0; d < D; d++) {
                    const double kv = lily_bf16_to_f32(kr[d]);
                    s += qb[d] * kv;
                    ek += u[d] * fabs(kv);
                }
                sc[k] = s / sqrt((double)D);
                mx = fmax(mx, sc[k]);
                E = fmax(E, ek / sqrt((double)D));
            }
            const double slack = expm1(2 * E); /* q rounding differences */
            max_slack = fmax(max_slack, slack);
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
                const double want = o / den * gate, tol = (5e-3 + slack) * om / den * gate + 1e-5;
                n_cmp++;
                for (int v = 0; v < n_var; v++) {
                    stats &S = stv[v];
                    const double gv = got[v][((size_t)t * nh + h) * D + d], err = fabs(gv - want);
                    if (!(err <= tol)) {
                        if (!S.bad) {
                            S.bad_t = t, S.bad_h = h, S.bad_d = d;
                            S.bad_got = gv, S.bad_want = want;
                        }
                        S.bad++;
                    }
                    if (err > S.max_err || gv != gv)
                        S.max_err = gv != gv ? INFINITY : err;
                    if (err / tol > S.worst || gv != gv) {
                        S.worst = gv != gv ? INFINITY : err / tol;
                        S.bound_at_worst = tol;
                    }
                }
            }
        }
    }
    for (int v = 0; v < n_var; v++) {
        const stats &S = stv[v];
        if (S.bad || S.n_nan) {
            g_fail++;
            printf("FAIL %s: %zu of %zu compared outside the bound, %zu NaN of %zu outputs; max err %.3g, worst %.3g of "
                   "the bound (bound there %.3g)",
                   what[v], S.bad, n_cmp, S.n_nan, got[v].size(), S.max_err, S.worst, S.bound_at_worst);
            if (S.bad)
                printf("; first t %d h %d d %d: got %.6g want %.6g", S.bad_t, S.bad_h, S.bad_d, S.bad_got, S.bad_want);
            if (S.n_nan)
                printf("; first NaN t %zu h %zu d %zu", S.first_nan / ((size_t)nh * D), S.first_nan / D % nh,
                       S.first_nan % D);
            printf("\n");
        } else {
            printf("PASS %s: max err %.3g, worst %.3f of the bound (bound there %.3g), %zu compared", what[v], S.max_err,
                   S.worst, S.bound_at_worst, n_cmp);
            printf(", q slack up to %.3g of mag\n", max_slack);
        }
    }
    cudaFree(a.qkv);
    cudaFree(a.q);
    cudaFree((void *)a.q_norm);
    cudaFree(a.k_cache);
    cudaFree(a.v_cache);
    cudaFree((void *)a.pos);
}

/* Exact mode's fp32 KV cache (attn_args.k_cache_f32) is for the SIMT kernel only: the tensor-core prefill
 * attention must refuse it (attention_prefill_supported false, the launch cudaErrorInvalidValue, nothing run). */
static void test_rejects_f32_cache(void)
{
    attn_args a;
    memset(&a, 0, sizeof a);
    a.n_heads = 16, a.n_kv = 2, a.head_dim = 256, a.max_ctx = 64, a.n_splits = 1;
    a.k_cache_f32 = dev_nan((size_t)a.n_kv * a.max_ctx * a.head_dim);
    a.v_cache_f32 = dev_nan((size_t)a.n_kv * a.max_ctx * a.head_dim);
    const bool supported = attention_prefill_supported(a);
    const cudaError_t e = launch_attention_prefill(a, 8, 0);
    cudaGetLastError();
    const bool ok = !supported && e == cudaErrorInvalidValue;
    g_checks++;
    if (!ok)
        g_fail++;
    printf("%s prefill attention refuses an fp32 KV cache (supported %d, launch %s)\n", ok ? "ok  " : "FAIL",
           (int)supported, cudaGetErrorName(e));
    cudaFree(a.k_cache_f32);
    cudaFree(a.v_cache_f32);
}

int main(void)
{
    if (cuda_test_no_device())
        return 77;
    g_wg = attention_prefill_wg_available();
    printf("%s\n", g_wg ? "wgmma kernel available: every case runs both kernels"
                        : "NOTE: no sm_90a wgmma kernel on this GPU: only the mma.sync kernel is checked");
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
    /* rotary dims: Qwen3.5/3.6 (rot 64 of 256), tiny-a (16 of 64), G = 3
     * and 4 with 128 (rot 32), full rotary, no rotary; chunks at position 0, at small nonzero positions
     * (RoPE positions, short rows: a wrong angle shows), deep, and split-KV */
    const int fns[] = {1, 2, 7, 64, 513};
    for (int i = 0; i < 5; i++) {
        test_prefill(16, 2, 256, 0, fns[i], 1, 64);
        test_prefill(8, 2, 64, 0, fns[i], 1, 16);
    }
    test_prefill(16, 2, 256, 37, 33, 1, 64);
    test_prefill(8, 2, 64, 5, 70, 1, 16);
    test_prefill(12, 3, 128, 77, 33, 1, 32);
    test_prefill(4, 4, 128, 19, 70, 1, 128);
    test_prefill(6, 2, 64, 20, 15, 1, 16);
    test_prefill(8, 2, 64, 31, 129, 1, 0);
    test_prefill(16, 2, 256, 1000, 64, 1, 64);
    test_prefill(8, 2, 64, 1000, 7, 1, 16);
    test_prefill(16, 2, 256, 1000, 1, 64, 64);
    test_prefill(16, 2, 256, 1000, 2, 8, 64);
    test_prefill(16, 2, 256, 5000, 7, 9, 64);
    test_prefill(8, 2, 64, 300, 3, 5, 16);
    test_prefill(6, 2, 64, 700, 7, 4, 16);
    test_prefill(16, 2, 256, 4000, 2, 0, 64);
    test_prefill(8, 2, 64, 2000, 9, 0, 16);
    test_rejects_f32_cache();
    return cuda_test_summary();
}
