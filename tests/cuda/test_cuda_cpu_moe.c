/* test_cuda_cpu_moe.c — routed experts in host memory (lily_backend_options.n_cpu_moe, --n-cpu-moe /
 * --cpu-moe) on the bundled model models/lily-tiny (8 layers, 24 experts top-4) and on the tiny-a MLX
 * fixture: with the experts of every layer, and of the first half of the layers, in mapped host memory,
 * the same kernels read them over PCIe, so the logits must equal the all-device backend's bit for bit in
 * every path — full prefill (grouped MoE GEMM), chunks of 7 (the decode-shaped MoE kernels, n = 2..7),
 * prefill then single-token decode (the captured decode graph) — and greedy decoding through the graph
 * must choose the same tokens. memory_needs counts those experts out of the device's weight bytes.
 *
 * With --host-experts cpu (lily_backend_options.host_experts, cpu_experts.cu) decode steps run those
 * layers' routed experts on the host's cores with the decode MoE kernels' rounding (experts_token.h's
 * CPU_EXPERTS_CUDA_ROUNDING: the same fp16 activations, exact weights, fp32 sums in another order), so decode
 * logits are close, not equal: mean KL against the all-device backend <= 1e-4
 * (the bound; printed), every row's argmax the same, and the same greedy tokens through the
 * captured decode graph; prefill (staged or zero-copy GEMMs) stays bit-identical. The same with
 * --host-experts 2: the CPU takes the last 2 of each token's top-4, the GPU the first 2 over PCIe.
 * Exits 77 when no GPU is present.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"

#include "cuda_test_compare.h"

#define N_PROMPT 40
#define N_GEN 24

/* What one backend instance produces for the token ids: logits of every path, greedy tokens. */
typedef struct {
    float *full;    /* [N_PROMPT, V] one forward of all tokens */
    float *chunked; /* [N_PROMPT, V] forwards of 7 */
    float *decode;  /* [N_PROMPT / 2, V] prefill of half, then one token per forward (rows of the second half) */
    int32_t greedy[N_GEN];
} outputs;

static void outputs_free(outputs *o)
{
    free(o->full);
    free(o->chunked);
    free(o->decode);
}

/* Run every path on a backend with the given n_cpu_moe; 0 on success. */
static int run_paths(const lily_config *cfg, const lily_weights *w, const int32_t *tok, int n_cpu_moe, int host_experts,
                     outputs *o)
{
    const int V = cfg->vocab_size, half = N_PROMPT / 2;
    memset(o, 0, sizeof *o);
    o->full = malloc((size_t)N_PROMPT * V * sizeof(float));
    o->chunked = malloc((size_t)N_PROMPT * V * sizeof(float));
    o->decode = malloc((size_t)half * V * sizeof(float));
    if (!o->full || !o->chunked || !o->decode) {
        printf("FAIL: out of host memory\n");
        return -1;
    }
    lily_backend_options opts;
    memset(&opts, 0, sizeof opts);
    opts.max_chunk = 64;
    opts.n_cpu_moe = n_cpu_moe;
    opts.host_experts = host_experts;
    opts.n_threads = 4;
    lily_backend be;
    lily_error err = {0};
    if (lily_backend_create("cuda", cfg, w, &opts, &be, &err) != LILY_OK) {
        printf("FAIL: cuda create (n_cpu_moe %d): %s\n", n_cpu_moe, err.message);
        return -1;
    }
    const lily_backend_ops *ops = be.ops;
    void *st = NULL;
    lily_status rs = ops->state_new(be.ctx, 256, &st, &err);
    if (rs == LILY_OK)
        rs = ops->forward(be.ctx, st, tok, N_PROMPT, LILY_LOGITS_ALL, o->full, &err);
    if (rs == LILY_OK)
        ops->state_reset(be.ctx, st);
    for (int p = 0; p < N_PROMPT && rs == LILY_OK; p += 7) {
        const int m = N_PROMPT - p < 7 ? N_PROMPT - p : 7;
        rs = ops->forward(be.ctx, st, tok + p, m, LILY_LOGITS_ALL, o->chunked + (size_t)p * V, &err);
    }
    if (rs == LILY_OK) {
        ops->state_reset(be.ctx, st);
        rs = ops->forward(be.ctx, st, tok, half, LILY_LOGITS_NONE, NULL, &err);
    }
    for (int p = half; p < N_PROMPT && rs == LILY_OK; p++)
        rs = ops->forward(be.ctx, st, tok + p, 1, LILY_LOGITS_LAST, o->decode + (size_t)(p - half) * V, &err);
    if (rs == LILY_OK) { /* greedy through the device decode loop */
        const lily_device_sampling greedy = lily_device_sampling_greedy();
        token_log tl = {o->greedy + 1, 0};
        int n_run = 0;
        o->greedy[0] = argmax(o->decode + (size_t)(half - 1) * V, V);
        rs = ops->decode_loop(be.ctx, st, o->greedy[0], N_GEN - 1, &greedy, log_token, &tl, NULL, &n_run, &err);
        if (rs == LILY_OK && tl.n != N_GEN - 1)
            rs = lily_error_set(&err, LILY_ERR_BACKEND, "decode_loop: %d of %d tokens", tl.n, N_GEN - 1);
    }
    if (rs != LILY_OK)
        printf("FAIL: n_cpu_moe %d: %s\n", n_cpu_moe, err.message);
    if (st)
        ops->state_free(be.ctx, st);
    lily_backend_destroy(&be);
    return rs == LILY_OK ? 0 : -1;
}

static void expect_same(const char *model, const char *what, int n_cpu_moe, const void *ref, const void *got,
                        size_t bytes)
{
    const int same = !memcmp(ref, got, bytes);
    printf("%s %s, experts of %d layers in host memory: %s identical to the all-device backend\n",
           same ? "PASS" : "FAIL", model, n_cpu_moe, what);
    if (!same)
        g_fail++;
}

/* --host-experts he with n_cpu_moe layers on the host against the all-device outputs ref: prefill equal,
 * decode logits close (mean KL <= 1e-4, every argmax the same), the same greedy tokens. */
static void check_cpu_experts(const char *model, const lily_config *cfg, const lily_weights *w, const int32_t *tok,
                              int n_cpu_moe, int he, const outputs *ref)
{
    const int V = cfg->vocab_size;
    char what[64];
    if (he >= cfg->n_experts_used)
        snprintf(what, sizeof what, "all of each token's top-%d", cfg->n_experts_used);
    else
        snprintf(what, sizeof what, "%d of each token's top-%d", he, cfg->n_experts_used);
    outputs got;
    if (run_paths(cfg, w, tok, n_cpu_moe, he, &got) != 0) {
        g_fail++;
        outputs_free(&got);
        return;
    }
    const int same_prefill = !memcmp(ref->full, got.full, (size_t)N_PROMPT * V * 4);
    printf("%s %s, %d host layers, %s on the CPU: full-prefill logits identical to the all-device backend\n",
           same_prefill ? "PASS" : "FAIL", model, n_cpu_moe, what);
    g_fail += !same_prefill;
    logit_stats s = {0};
    logit_score(&s, ref->decode, got.decode, N_PROMPT / 2, V);
    const double kl = s.kl_sum / (double)s.rows;
    const int ok = kl <= 1e-4 && s.top1 == s.rows;
    printf("%s %s, %d host layers, %s on the CPU: decode logits mean KL %.3g, max |dlogit| %.3g, argmax %ld/%ld "
           "rows as the all-device backend\n", ok ? "PASS" : "FAIL", model, n_cpu_moe, what, kl, s.max_dlogit, s.top1,
           s.rows);
    g_fail += !ok;
    int same = 0;
    while (same < N_GEN && ref->greedy[same] == got.greedy[same])
        same++;
    printf("%s %s, %d host layers, %s on the CPU: %d of %d greedy tokens as the all-device backend\n",
           same == N_GEN ? "PASS" : "FAIL", model, n_cpu_moe, what, same, N_GEN);
    g_fail += same != N_GEN;
    outputs_free(&got);
}

static void check_model(const char *dir, const char *model)
{
    lily_error err = {0};
    lily_config cfg;
    lily_checkpoint ck;
    lily_weights w;
    memset(&ck, 0, sizeof ck);
    memset(&w, 0, sizeof w);
    REQUIRE(lily_config_load(dir, &cfg, &err) == LILY_OK, "config %s: %s", dir, err.message);
    REQUIRE(lily_checkpoint_open(dir, &ck, &err) == LILY_OK, "checkpoint %s: %s", dir, err.message);
    REQUIRE(lily_weights_bind(&cfg, &ck, &w, &err) == LILY_OK, "bind %s: %s", dir, err.message);
    const int V = cfg.vocab_size, L = cfg.n_layers;
    int32_t tok[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) /* spread over the vocabulary so many experts are routed to */
        tok[i] = (int32_t)((1 + 7919u * (unsigned)i) % (unsigned)V);

    /* memory_needs: the host-resident experts leave the device's weight bytes */
    const lily_backend_ops *ops = lily_backend_find("cuda");
    lily_backend_options o;
    memset(&o, 0, sizeof o);
    o.max_chunk = 64;
    lily_backend_memory all, moved;
    REQUIRE(ops->memory_needs(&cfg, &w, &o, &all, &err) == LILY_OK, "memory_needs: %s", err.message);
    o.n_cpu_moe = L / 2;
    REQUIRE(ops->memory_needs(&cfg, &w, &o, &moved, &err) == LILY_OK, "memory_needs: %s", err.message);
    const int ok = all.n_expert_layers == L && all.expert_layer_bytes > 0 &&
                   moved.weight_bytes == all.weight_bytes - (size_t)(L / 2) * all.expert_layer_bytes;
    printf("%s %s memory_needs: %d expert layers of %zu bytes; weights %zu bytes on the device, %zu with %d "
           "layers' experts in host memory\n", ok ? "PASS" : "FAIL", model, all.n_expert_layers,
           all.expert_layer_bytes, all.weight_bytes, moved.weight_bytes, L / 2);
    if (!ok)
        g_fail++;

    outputs ref, got;
    if (run_paths(&cfg, &w, tok, 0, LILY_HOST_EXPERTS_AUTO, &ref) == 0) {
        const int counts[2] = {L, L / 2};
        for (int k = 0; k < 2; k++) {
            /* the CPU computes the decode experts (all, or 2 of each token's top-k) */
            check_cpu_experts(model, &cfg, &w, tok, counts[k], LILY_HOST_EXPERTS_CPU, &ref);
            check_cpu_experts(model, &cfg, &w, tok, counts[k], 2, &ref);
            if (run_paths(&cfg, &w, tok, counts[k], LILY_HOST_EXPERTS_ZERO_COPY, &got) != 0) {
                g_fail++;
                outputs_free(&got);
                continue;
            }
            expect_same(model, "full-prefill logits", counts[k], ref.full, got.full, (size_t)N_PROMPT * V * 4);
            expect_same(model, "chunks-of-7 logits", counts[k], ref.chunked, got.chunked, (size_t)N_PROMPT * V * 4);
            expect_same(model, "decode logits", counts[k], ref.decode, got.decode, (size_t)(N_PROMPT / 2) * V * 4);
            expect_same(model, "greedy tokens", counts[k], ref.greedy, got.greedy, sizeof ref.greedy);
            outputs_free(&got);
        }
    } else {
        g_fail++;
    }
    outputs_free(&ref);
    lily_weights_free(&w);
    lily_checkpoint_close(&ck);
}

int main(void)
{
    if (cuda_test_no_device())
        return 77;
    check_model(LILY_TEST_DATA_DIR "/../../models/lily-tiny", "lily-tiny");
    check_model(LILY_TEST_DATA_DIR "/tiny-a/mlx4", "tiny-a mlx4");
    printf("%s\n", g_fail ? "FAILED" : "all passed");
    return g_fail ? 1 : 0;
}
