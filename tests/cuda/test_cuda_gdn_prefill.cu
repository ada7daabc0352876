/* test_cuda_gdn_prefill.cu — the Gated DeltaNet prefill paths against a double-precision CPU twin of
 * MODEL.md §4.4 steps 2-7, over a sequence of forward calls on one state, each case per variant: "recur"
 * (deltanet_prefill.cu: gdn_prep_kernel + gdn_recur_kernel, GDN_KERNEL_RECURRENCE) and "chunked"
 * (deltanet_chunked.cu: gdn_prep_kernel + the WY chunked form on tensor cores, GDN_KERNEL_CHUNKED). Calls of
 * n > 1 tokens take the variant's launch (as cuda_enqueue_forward does), n == 1 the decode kernel
 * (launch_gdn_decode), so state and conv-state carry between chunks and prefill -> decode -> prefill
 * hand-offs (conv ping-pong parity) are all checked. Outputs and the prep and chunk scratch are
 * NaN-poisoned. Shapes: the tiny fixture's, the full model's (16/32 heads, dk = dv = 128),
 * odd ones (dv != dk, 3 v heads per k head, K = 1..4), n up to 4096, and decays from fast (underflow
 * to 0) to slow (the running-decay rescale of the recurrence). Exits 77 when no GPU is present.
 *
 * Bound: |gpu - cpu| <= rel * mag + 1e-5, mag = Σ|S·q| + 1e-2 per output (rel 1e-3), 1 per state
 * element (rel 1e-4), 0 for the conv state (a copy).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "backend/cuda/deltanet/deltanet.cuh"
#include "backend/cuda/sample.cuh"

#define CUDA_TEST_SEED 0x9e3779b97f4a7c15ull
#include "cuda_test_util.cuh"
#include "cuda_test_check.cuh"

/* 0: recurrence (launch_gdn_prefill); 1: chunked (launch_gdn_prefill_chunked) */
#define N_VAR 2
static const char *const VARIANT[N_VAR] = {"recur", "chunked"};

enum { DECAY_MIXED, DECAY_SLOW, DECAY_FAST };

/* One state, forward calls of calls[0], calls[1], ... tokens; every output, the final state and the
 * final conv state checked against the twin run over the whole sequence. */
static void test_case(int Hk, int Hv, int dk, int dv, int K, std::vector<int> calls, int decay_mode = DECAY_MIXED)
{
    const int key_dim = Hk * dk, conv_dim = 2 * key_dim + Hv * dv, stride = conv_dim + 7, ba_stride = 2 * Hv + 3;
    const int Km1 = K - 1;
    int n = 0, nmax = 0;
    for (int m : calls) {
        n += m;
        nmax = m > nmax ? m : nmax;
    }
    std::vector<float> mixed = rand_vec((size_t)n * stride, -1, 1), ba = rand_vec((size_t)n * ba_stride, -2, 2);
    std::vector<float> cw = rand_vec((size_t)conv_dim * K, -0.5f, 0.5f), dtb = rand_vec(Hv, -1, 1);
    std::vector<float> Al = decay_mode == DECAY_SLOW   ? rand_vec(Hv, -6, -3)
                            : decay_mode == DECAY_FAST ? rand_vec(Hv, 2, 5)
                                                       : rand_vec(Hv, -1, 1);
    std::vector<float> S0 = rand_vec((size_t)Hv * dk * dv, -0.3f, 0.3f);
    std::vector<float> cs0 = rand_vec((size_t)2 * Km1 * conv_dim, -1, 1);

    const size_t pre_floats = (size_t)nmax * gdn_prefill_stride(conv_dim, Hv);
    char what[200], desc[120];
    int len = snprintf(desc, sizeof desc, "Hk %d Hv %d dk %d dv %d K %d%s n", Hk, Hv, dk, dv, K,
                       decay_mode == DECAY_SLOW ? " slow decay" : decay_mode == DECAY_FAST ? " fast decay" : "");
    for (size_t i = 0; i < calls.size() && len < (int)sizeof desc - 8; i++)
        len += snprintf(desc + len, sizeof desc - len, "%s%d", i ? "+" : " ", calls[i]);

    /* the same call sequence through each prefill variant, from the same initial state */
    std::vector<float> got[N_VAR], Sg[N_VAR], csg[N_VAR];
    bool ran[N_VAR] = {false};
    for (int var = 0; var < N_VAR; var++) {
        gdn_args a;
        memset(&a, 0, sizeof a);
        a.Hk = Hk, a.Hv = Hv, a.dk = dk, a.dv = dv, a.K = K, a.conv_dim = conv_dim;
        const bool ok = var ? gdn_chunked_supported(a) : gdn_prefill_supported(a);
        if (!ok) {
            printf("FAIL gdn prefill %s %s: shape not supported\n", VARIANT[var], desc);
            g_fail++;
            continue;
        }
        float *dmixed = dev_copy(mixed), *dba = dev_copy(ba);
        a.mixed_stride = stride;
        a.ba_stride = ba_stride;
        a.conv_w = dev_copy(cw);
        a.A_log = dev_copy(Al);
        a.dt_bias = dev_copy(dtb);
        a.conv_state = dev_copy(cs0);
        a.state = dev_copy(S0);
        int *dstep;
        CK(cudaMalloc(&dstep, 4));
        a.step = dstep;
        float *dout = dev_nan((size_t)n * Hv * dv);
        std::vector<float> nanp(pre_floats, NAN);
        float *dpre = dev_copy(nanp);
        /* chunked: W|U|Attn scratch poisoned once (stale records of earlier calls stay behind) */
        float *dwy = var ? dev_nan(gdn_chunked_scratch_floats(nmax, Hv, dk, dv)) : NULL;
        int t0 = 0;
        bool failed = false;
        for (size_t i = 0; i < calls.size() && !failed; i++) {
            const int m = calls[i];
            CK(launch_set_int(dstep, (int)i, 0)); /* the forward-call counter (conv ping-pong parity) */
            a.mixed = dmixed + (size_t)t0 * stride;
            a.ba = dba + (size_t)t0 * ba_stride;
            a.out = dout + (size_t)t0 * Hv * dv;
            CK(cudaMemcpy(dpre, nanp.data(), pre_floats * sizeof(float), cudaMemcpyHostToDevice));
            cudaError_t e = m == 1 ? launch_gdn_decode(a, 0)
                            : var  ? launch_gdn_prefill_chunked(a, dpre, dwy, m, 0)
                                   : launch_gdn_prefill(a, dpre, m, 0);
            if (e == cudaSuccess)
                e = cudaDeviceSynchronize();
            if (e != cudaSuccess) {
                printf("FAIL gdn prefill %s %s: launch of call %zu: %s\n", VARIANT[var], desc, i, cudaGetErrorString(e));
                g_fail++;
                failed = true;
            }
            t0 += m;
        }
        if (!failed) {
            got[var] = host_copy(dout, (size_t)n * Hv * dv);
            Sg[var] = host_copy(a.state, (size_t)Hv * dk * dv);
            csg[var] = host_copy(a.conv_state, (size_t)2 * Km1 * conv_dim);
            ran[var] = true;
        }
        cudaFree(dmixed), cudaFree(dba), cudaFree((void *)a.conv_w), cudaFree((void *)a.A_log), cudaFree((void *)a.dt_bias);
        cudaFree(a.conv_state), cudaFree(a.state), cudaFree(dstep), cudaFree(dout), cudaFree(dpre);
        if (dwy)
            cudaFree(dwy);
    }
    bool any = false;
    for (int var = 0; var < N_VAR; var++)
        any = any || ran[var];
    if (!any)
        return;

    /* CPU twin over the whole sequence (calls only split it) */
    std::vector<double> S(S0.begin(), S0.end());
    const std::vector<double> X = ref_conv_history(cs0, mixed, K, n, conv_dim, stride); /* conv history: state rows, then mixed rows */
    std::vector<double> want((size_t)n * Hv * dv), mag((size_t)n * Hv * dv);
    std::vector<double> y(conv_dim);
    for (int t = 0; t < n; t++) {
        ref_conv_silu(X, cw, K, conv_dim, t, y);
        for (int j = 0; j < Hv; j++) {
            const int kh = j / (Hv / Hk);
            ref_gdn_head(y, key_dim, kh, j, dk, dv, (double)ba[(size_t)t * ba_stride + j], (double)ba[(size_t)t * ba_stride + Hv + j] + dtb[j], (double)Al[j],
                         &S[(size_t)j * dk * dv], &want[((size_t)t * Hv + j) * dv], &mag[((size_t)t * Hv + j) * dv]);
        }
    }
    std::vector<double> Sw(S.begin(), S.end()), Smag(S.size(), 1.0);
    std::vector<double> cwant((size_t)Km1 * conv_dim), cm((size_t)Km1 * conv_dim, 0.0);
    for (int s = 0; s < Km1; s++)
        for (int c = 0; c < conv_dim; c++) cwant[(size_t)s * conv_dim + c] = X[(size_t)(n + s) * conv_dim + c];
    for (int var = 0; var < N_VAR; var++) {
        if (!ran[var])
            continue;
        snprintf(what, sizeof what, "gdn prefill %s %s output", VARIANT[var], desc);
        check(what, got[var], want, mag, 1e-3, true);
        snprintf(what, sizeof what, "gdn prefill %s %s state", VARIANT[var], desc);
        check(what, Sg[var], Sw, Smag, 1e-4, true);
        if (Km1 > 0) {
            /* after call i (counter i) the conv state lives in buffer (i & 1) ^ 1 */
            const int buf = (((int)calls.size() - 1) & 1) ^ 1;
            std::vector<float> cg(csg[var].begin() + (size_t)buf * Km1 * conv_dim,
                                  csg[var].begin() + (size_t)(buf + 1) * Km1 * conv_dim);
            snprintf(what, sizeof what, "gdn prefill %s %s conv state", VARIANT[var], desc);
            check(what, cg, cwant, cm, 0.0, true);
        }
    }
}

int main(void)
{
    if (cuda_test_no_device())
        return 77;
    /* tiny-a shape: single chunks, two chunks, prefill -> decode -> prefill, decode -> prefill */
    const int ns[] = {2, 7, 64, 513};
    for (int i = 0; i < 4; i++)
        test_case(2, 4, 32, 32, 4, {ns[i]});
    test_case(2, 4, 32, 32, 4, {7, 64});
    test_case(2, 4, 32, 32, 4, {2, 2, 3});
    test_case(2, 4, 32, 32, 4, {64, 1, 1, 17});
    test_case(2, 4, 32, 32, 4, {1, 513, 1});
    /* dk 64, and the full model's head shape */
    test_case(4, 8, 64, 64, 4, {2, 5});
    test_case(4, 8, 64, 64, 4, {64, 1, 7});
    test_case(16, 32, 128, 128, 4, {7, 64});
    test_case(16, 32, 128, 128, 4, {513, 1});
    test_case(16, 32, 128, 128, 4, {2, 1, 33});
    /* chunk boundaries of the chunked form: exact multiples of 64, one past, one short */
    test_case(16, 32, 128, 128, 4, {128, 65, 1, 63});
    test_case(2, 4, 128, 128, 4, {200}, DECAY_FAST);
    /* long chunks (fewer heads to keep the twin fast) */
    test_case(2, 4, 128, 128, 4, {4096, 1});
    test_case(2, 4, 128, 128, 4, {4096, 64}, DECAY_SLOW);
    test_case(1, 2, 128, 128, 4, {1000, 3000}, DECAY_SLOW);
    test_case(2, 4, 64, 64, 4, {300, 200}, DECAY_FAST);
    /* odd shapes: dv != dk, 3 v heads per k head, short conv kernels, chunks shorter than K-1 */
    test_case(3, 9, 64, 32, 4, {33, 17});
    test_case(1, 3, 128, 96, 3, {2, 19, 1, 5});
    test_case(2, 2, 32, 64, 2, {5, 1, 40});
    test_case(2, 6, 128, 32, 1, {9, 16});
    test_case(1, 1, 32, 32, 4, {2, 2, 2, 2, 100});
    return cuda_test_summary();
}
