/* test_cuda_gdn_fused_model.c — the out_proj-fused DeltaNet decode (GDN_KERNEL_DECODE_FUSED) inside the
 * whole CUDA forward pass: synthetic models whose DeltaNet out_proj takes the streamed GEMV ("small":
 * Hv·dv 512, hidden 512; "qwen3.6-35b-a3b-4l": the 35B-A3B layer shapes, 4 layers), run twice from the
 * same prompt, fused (the default) and unfused (lily_cuda_set_deltanet_fusion 0). Required: every decode
 * step's logits bit-identical (eager forward() of one token at a time) and the same greedy tokens from the
 * device decode loop (graph replay); the timeline of one step must show the fused path taken (one kernel
 * fewer per DeltaNet layer, no deltanet_scan stage) on a build with sm_90 code, else the same kernels.
 * Exits 77 without a GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "model/synthetic.h"

#define PROMPT 9
#define STEPS 12
#define LOOP 24

static int g_fail = 0;

static int first_token(void *user, int32_t token, int index, const lily_token_logprobs *logprobs)
{
    (void)logprobs;
    if (index < LOOP)
        ((int32_t *)user)[index] = token;
    return 0;
}

/* One run from a reset state: the prompt, STEPS eager single-token forward calls (greedy on the host),
 * then LOOP tokens of the device decode loop. logits: [STEPS][vocab]; toks: [LOOP]. */
static int run(lily_backend *be, void *st, const lily_config *cfg, int fused, float *logits, int32_t *toks, lily_error *err)
{
    if (lily_cuda_set_deltanet_fusion(be->ctx, st, fused, err) != LILY_OK)
        return -1;
    be->ops->state_reset(be->ctx, st);
    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = (int32_t)((i * 7919 + 13) % cfg->vocab_size);
    float *lg = logits;
    if (be->ops->forward(be->ctx, st, prompt, PROMPT, LILY_LOGITS_LAST, lg, err) != LILY_OK)
        return -1;
    for (int s = 0; s < STEPS; s++) {
        const float *prev = lg;
        int best = 0;
        for (int v = 1; v < cfg->vocab_size; v++)
            if (prev[v] > prev[best])
                best = v;
        int32_t t = best;
        lg = logits + (size_t)s * cfg->vocab_size;
        if (be->ops->forward(be->ctx, st, &t, 1, LILY_LOGITS_LAST, lg, err) != LILY_OK)
            return -1;
    }
    const lily_device_sampling greedy = lily_device_sampling_greedy();
    int n_run = 0;
    memset(toks, 0xff, LOOP * sizeof(int32_t));
    if (be->ops->decode_loop(be->ctx, st, 1, LOOP, &greedy, first_token, toks, NULL, &n_run, err) != LILY_OK)
        return -1;
    return n_run == LOOP ? 0 : -1;
}

static void test_model(const char *preset)
{
    lily_error err = {0};
    lily_synthetic *syn = NULL;
    if (lily_synthetic_new(preset, 1, 0, &syn, &err) != LILY_OK) {
        printf("FAIL %s: synthetic: %s\n", preset, err.message);
        g_fail++;
        return;
    }
    const lily_config *cfg = &syn->cfg;
    lily_backend_options opts;
    memset(&opts, 0, sizeof opts);
    opts.max_chunk = 64;
    lily_backend be;
    if (lily_backend_create("cuda", cfg, &syn->weights, &opts, &be, &err) != LILY_OK) {
        printf("FAIL %s: backend: %s\n", preset, err.message);
        g_fail++;
        lily_synthetic_free(syn);
        return;
    }
    void *st = NULL;
    const size_t V = (size_t)cfg->vocab_size;
    float *lf = malloc(sizeof(float) * V * STEPS), *lu = malloc(sizeof(float) * V * STEPS);
    int32_t tf[LOOP], tu[LOOP];
    int n_gdn = 0;
    for (int l = 0; l < cfg->n_layers; l++)
        n_gdn += cfg->layer_types[l] != LILY_LAYER_FULL_ATTENTION;
    if (!lf || !lu || be.ops->state_new(be.ctx, 256, &st, &err) != LILY_OK || run(&be, st, cfg, 1, lf, tf, &err) ||
        run(&be, st, cfg, 0, lu, tu, &err)) {
        printf("FAIL %s: %s\n", preset, err.message[0] ? err.message : "out of memory or a short decode loop");
        g_fail++;
    } else {
        size_t differ = 0, first = 0;
        for (size_t i = 0; i < V * STEPS; i++)
            if (memcmp(&lf[i], &lu[i], sizeof(float)) && !differ++)
                first = i;
        const int same_toks = !memcmp(tf, tu, sizeof tf);
        /* which path ran: kernels of one decode step */
        static lily_cuda_timeline tl[2];
        int n_k[2] = {-1, -1}, scan_k[2] = {0, 0};
        for (int p = 0; p < 2; p++) {
            be.ops->state_reset(be.ctx, st);
            if (lily_cuda_set_deltanet_fusion(be.ctx, st, p == 0, &err) != LILY_OK ||
                lily_cuda_timeline_decode(be.ctx, st, 1, 2, &tl[p], &err) != LILY_OK)
                break;
            n_k[p] = tl[p].n;
            for (int k = 0; k < tl[p].n; k++)
                scan_k[p] += !strcmp(tl[p].stage_names[tl[p].k[k].stage], "deltanet_scan");
        }
        /* sm_90 code: the fused launch (no scan kernels); otherwise both runs take the scan kernel */
        const int fused_taken = n_k[0] >= 0 && n_k[1] == n_k[0] + n_gdn && scan_k[0] == 0 && scan_k[1] == n_gdn;
        const int same_path = n_k[0] >= 0 && n_k[0] == n_k[1] && scan_k[0] == n_gdn;
        const int ok = !differ && same_toks && (fused_taken || (!LILY_BUILD_SM90A && same_path));
        g_fail += !ok;
        printf("%s %s (%d DeltaNet layers): %d decode steps' logits fused vs unfused %s", ok ? "PASS" : "FAIL", preset,
               n_gdn, STEPS, differ ? "DIFFER" : "bit-identical");
        if (differ)
            printf(" (%zu of %zu, first step %zu id %zu: %.9g vs %.9g)", differ, V * STEPS, first / V, first % V, lf[first],
                   lu[first]);
        printf("; decode loop %d tokens %s; kernels per step fused %d, unfused %d, scan kernels %d / %d (%s)\n", LOOP,
               same_toks ? "identical" : "DIFFER", n_k[0], n_k[1], scan_k[0], scan_k[1],
               fused_taken ? "fused launch taken" : same_path ? "no fused launch in this build" : "WRONG");
    }
    free(lf);
    free(lu);
    if (st)
        be.ops->state_free(be.ctx, st);
    lily_backend_destroy(&be);
    lily_synthetic_free(syn);
}

int main(void)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    test_model("small");
    test_model("qwen3.6-35b-a3b-4l");
    printf("%s\n", g_fail ? "FAILED" : "all passed");
    return g_fail ? 1 : 0;
}
