/* bench_cuda_decode.c — decode speed of the CUDA backend on the full-size synthetic model (random MLX
 * 4-bit weights, src/model/synthetic.h), through the device-side greedy fast path (graph replay, no
 * host sync per token), at context depths placed with lily_cuda_state_set_position (KV rows filled with
 * pseudo-random bf16). Prints a markdown table with the fraction of the bandwidth floor (bytes per token
 * from cost_model.h over the measured device-to-device copy rate), a per-stage profile (CUDA events),
 * an optional split-KV sweep, and knob A/Bs (`--tune`; `--knobs SPEC` sets them for the whole run,
 * bench/cuda_knobs.h). CUDA-vs-CPU agreement is bench_cuda_accuracy's job.
 *
 * Prefill GEMM knobs (lily_cuda_tuning, set before anything runs): --gemm-variant 0..4 (one-warp-row,
 * 2D-tiled, 2D-tiled with 16 warps at 128 tokens, Hopper wgmma for 4-bit weights, the same with one
 * group in flight; 7, 9-11: cuda_backend.h), --moe-tile 0|16|32|64|128 (grouped MoE tile, 0 auto),
 * --dense-tile 0|16|64|128; --moe-tile-sweep [LIST] prints prefill tok/s for prompt lengths (default 256..16384) x
 * (variant, MoE tile, dense tile) configurations, in chunks of --chunk tokens.
 *
 * usage: bench_cuda_decode [--preset 35b] [-n 128] [-d 256,4096,...] [--profile 4096,131072] [--chunk 512] [--profile-prefill]
 *                          [--sweep-split] [--tune] [--tune-list "SPEC;SPEC;..."] [--knobs SPEC] [--prefill N] [--gdn-prefill LIST]
 * --gdn-prefill LIST (e.g. 1,2): the DeltaNet prefill knob (lily_cuda_tuning.gdn_prefill: 1 recurrence,
 * 2 chunked, 3 chunked from GDN_CHUNKED_MIN_TOKENS); the prefill timing (and --profile-prefill) runs once
 * per value, the first value stays set for everything else.
 * --prefill-knobs "SPEC;SPEC;...": the same for whole knob sets (bench/cuda_knobs.h, each applied to the
 * defaults, e.g. "default;gemm_variant=4"): an A/B of prefill kernels on one loaded model; the timed
 * prefill runs twice per set and the faster run is printed. --knobs stays set for everything else.
 *                          [--gemm-variant N] [--moe-tile N] [--dense-tile N] [--moe-tile-sweep [LIST]]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "cuda_knobs.h"
#include "model/synthetic.h"
#include "runtime/cost_model.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int parse_list(const char *s, int *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        out[n++] = atoi(s);
        const char *c = strchr(s, ',');
        if (!c)
            break;
        s = c + 1;
    }
    return n;
}

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        return 1;                                                                                  \
    } while (0)

static void count_token(void *user, int32_t token, int index)
{
    (void)token, (void)index;
    (*(int *)user)++;
}

static unsigned long long g_rng = 42;
static int rnd_token(int vocab)
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (int)((g_rng >> 33) % (unsigned long long)vocab);
}

int main(int argc, char **argv)
{
    const char *preset = "35b";
    const char *tune_list = NULL; /* --tune-list "spec;spec;...": the knob sets --tune compares */
    char *pf_specs[16], *pf_list = NULL; /* --prefill-knobs "spec;spec;...": prefill A/B knob sets */
    int n_pf_specs = 0;
    int n_gen = 128, depths[32], n_depths = 0, prof[8], n_prof = 0, sweep = 0, prefill = 512, tune = 0, chunk = 512, prof_prefill = 0, gdn_list[8], n_gdn = 0;
    lily_cuda_tuning knobs = LILY_CUDA_TUNING_DEFAULT;
    int gemm_variant = -1, moe_tile = -1, dense_tile = -1, tile_sweep[16], n_tile_sweep = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--preset") && i + 1 < argc) preset = argv[++i];
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) n_gen = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-d") && i + 1 < argc) n_depths = parse_list(argv[++i], depths, 32);
        else if (!strcmp(argv[i], "--profile") && i + 1 < argc) n_prof = parse_list(argv[++i], prof, 8);
        else if (!strcmp(argv[i], "--sweep-split")) sweep = 1;
        else if (!strcmp(argv[i], "--tune")) tune = 1;
        else if (!strcmp(argv[i], "--tune-list") && i + 1 < argc) tune = 1, tune_list = argv[++i];
        else if (!strcmp(argv[i], "--knobs") && i + 1 < argc) {
            if (cuda_knobs_parse(argv[++i], &knobs)) DIE("bad --knobs '%s'", argv[i]);
        }
        else if (!strcmp(argv[i], "--prefill") && i + 1 < argc) prefill = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) chunk = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--profile-prefill")) prof_prefill = 1;
        else if (!strcmp(argv[i], "--gdn-prefill") && i + 1 < argc) n_gdn = parse_list(argv[++i], gdn_list, 8);
        else if (!strcmp(argv[i], "--prefill-knobs") && i + 1 < argc) {
            char *save = NULL;
            free(pf_list);
            n_pf_specs = 0;
            if (!(pf_list = strdup(argv[++i]))) DIE("oom");
            for (char *tok = strtok_r(pf_list, ";", &save); tok && n_pf_specs < 16; tok = strtok_r(NULL, ";", &save))
                pf_specs[n_pf_specs++] = tok;
        }
        else if (!strcmp(argv[i], "--gemm-variant") && i + 1 < argc) gemm_variant = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--moe-tile") && i + 1 < argc) moe_tile = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dense-tile") && i + 1 < argc) dense_tile = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--moe-tile-sweep")) {
            if (i + 1 < argc && argv[i + 1][0] >= '0' && argv[i + 1][0] <= '9')
                n_tile_sweep = parse_list(argv[++i], tile_sweep, 16);
            else
                for (int p = 256; p <= 16384; p *= 2)
                    tile_sweep[n_tile_sweep++] = p;
        }
        else DIE("usage: %s [--preset 35b] [-n N] [-d LIST] [--profile LIST] [--sweep-split] [--tune] [--tune-list SPECS] [--knobs SPEC] [--prefill N] [--chunk N] [--profile-prefill] [--gdn-prefill LIST] [--prefill-knobs SPECS] [--gemm-variant N] [--moe-tile N] [--dense-tile N] [--moe-tile-sweep [LIST]]", argv[0]);
    }
    const int gdn_prefill = n_gdn > 0 ? gdn_list[0] : -1;
    if (gdn_prefill >= 0)
        knobs.gdn_prefill = gdn_prefill;
    if (gemm_variant >= 0)
        knobs.gemm_variant = gemm_variant;
    if (moe_tile >= 0)
        knobs.moe_tile = moe_tile;
    if (dense_tile >= 0)
        knobs.dense_tile = dense_tile;
    if (!n_depths) {
        for (int d = 256; d <= 131072; d *= 2)
            depths[n_depths++] = d;
    }
    lily_cuda_set_tuning(&knobs);
    printf("knobs: ");
    cuda_knobs_print(stdout, &knobs);
    printf("\n");
    lily_error err = {0};
    double gbps = 0;
    if (lily_cuda_membw(0, (size_t)2 << 30, 20, &gbps, &err) != LILY_OK)
        DIE("membw: %s", err.message);
    printf("device-to-device copy: %.1f GB/s (read + write)\n", gbps);

    double t0 = now_s();
    lily_synthetic *syn = NULL;
    if (lily_synthetic_new(preset, 1, 0, &syn, &err) != LILY_OK)
        DIE("synthetic: %s", err.message);
    printf("synthetic %s: %.2f GB in %.1f s\n", preset, syn->buffer_size / 1e9, now_s() - t0);
    const lily_config *cfg = &syn->cfg;
    lily_backend_options opts;
    memset(&opts, 0, sizeof opts);
    opts.max_chunk = chunk;
    lily_backend be;
    t0 = now_s();
    if (lily_backend_create("cuda", cfg, &syn->weights, &opts, &be, &err) != LILY_OK)
        DIE("cuda: %s", err.message);
    printf("upload: %.1f s\n", now_s() - t0);
    lily_cost_model cm;
    lily_cost_model_init(cfg, 4, 8, 64, &cm);

    int max_depth = 0;
    for (int i = 0; i < n_depths; i++) max_depth = depths[i] > max_depth ? depths[i] : max_depth;
    for (int i = 0; i < n_prof; i++) max_depth = prof[i] > max_depth ? prof[i] : max_depth;
    if (sweep && max_depth < 131072) max_depth = 131072;
    int max_prompt = prefill;
    for (int i = 0; i < n_tile_sweep; i++) max_prompt = tile_sweep[i] > max_prompt ? tile_sweep[i] : max_prompt;
    const int max_ctx = max_depth + n_gen + 64 > max_prompt + 64 ? max_depth + n_gen + 64 : max_prompt + 64;
    void *st = NULL;
    if (be.ops->state_new(be.ctx, max_ctx, &st, &err) != LILY_OK)
        DIE("state: %s", err.message);

    int32_t *toks = malloc(sizeof(int32_t) * ((size_t)max_prompt + 64));
    int32_t *out = malloc(sizeof(int32_t) * (size_t)(n_gen + 64));
    if (!toks || !out) DIE("oom");

    /* prefill, once per --gdn-prefill value or --prefill-knobs set */
    const int n_pf_runs = n_pf_specs > 0 ? n_pf_specs : n_gdn > 0 ? n_gdn : 1;
    for (int gi = 0; prefill > 0 && gi < n_pf_runs; gi++) {
        if (n_pf_specs > 0) {
            lily_cuda_tuning t;
            if (cuda_knobs_parse(pf_specs[gi], &t) != 0)
                DIE("--prefill-knobs: bad knob set '%s'", pf_specs[gi]);
            lily_cuda_set_tuning(&t);
            printf("\nprefill knobs %s: ", pf_specs[gi]);
            cuda_knobs_print(stdout, &t);
            printf("\n");
        } else if (n_gdn > 0) {
            lily_cuda_tuning t = knobs;
            t.gdn_prefill = gdn_list[gi];
            lily_cuda_set_tuning(&t);
            printf("\nDeltaNet prefill knob gdn_prefill = %d\n", gdn_list[gi]);
        }
        for (int i = 0; gi == 0 && i < prefill; i++) toks[i] = rnd_token(cfg->vocab_size); /* same prompt per value */
        float *lg = malloc(sizeof(float) * cfg->vocab_size);
        if (!lg) DIE("oom");
        be.ops->state_reset(be.ctx, st);
        if (be.ops->forward(be.ctx, st, toks, prefill < chunk ? prefill : chunk, LILY_LOGITS_LAST, lg, &err) != LILY_OK)
            DIE("prefill: %s", err.message);
        double best = 0;
        for (int rep = 0; rep < (n_pf_specs > 0 ? 2 : 1); rep++) {
            be.ops->state_reset(be.ctx, st);
            t0 = now_s();
            for (int p = 0; p < prefill; p += chunk) {
                const int m = prefill - p < chunk ? prefill - p : chunk;
                if (be.ops->forward(be.ctx, st, toks + p, m, LILY_LOGITS_LAST, lg, &err) != LILY_OK)
                    DIE("prefill: %s", err.message);
            }
            const double dt = now_s() - t0;
            best = rep == 0 || dt < best ? dt : best;
        }
        printf("prefill %d tokens in chunks of %d: %.1f tok/s\n", prefill, chunk, prefill / best);
        size_t used = 0, total = 0;
        if (lily_cuda_device_memory(0, &used, &total, &err) == LILY_OK)
            printf("device memory in use: %.2f of %.2f GiB\n", used / 1073741824.0, total / 1073741824.0);
        if (prof_prefill) {
            /* the last chunk of the prompt: the earlier chunks run untimed, so a long prompt's profile
             * shows attention over the whole context */
            const int m = prefill < chunk ? prefill : chunk, at = prefill - m;
            lily_cuda_profile p;
            be.ops->state_reset(be.ctx, st);
            for (int q = 0; q < at; q += chunk)
                if (be.ops->forward(be.ctx, st, toks + q, at - q < chunk ? at - q : chunk, LILY_LOGITS_LAST, lg, &err) != LILY_OK)
                    DIE("prefill: %s", err.message);
            if (lily_cuda_profile_prefill(be.ctx, st, toks + at, m, &p, &err) != LILY_OK)
                DIE("profile prefill: %s", err.message);
            printf("\n## Prefill profile, one chunk of %d tokens at position %d (CUDA events between stages; ms)\n\n", m, at);
            printf("| stage | ms | share |\n|---|---:|---:|\n");
            for (int k = 0; k < p.n; k++)
                if (p.ms[k] > 0)
                    printf("| %s | %.3f | %.1f%% |\n", !strcmp(p.names[k], "moe_router") ? "moe (router, top-k, experts)" : p.names[k],
                           p.ms[k], 100.0 * p.ms[k] / p.total_ms);
            printf("| total | %.3f | (%.0f tok/s) |\n", p.total_ms, m / (p.total_ms * 1e-3));
        }
        free(lg);
    }
    if (n_gdn > 1 || n_pf_specs > 0)
        lily_cuda_set_tuning(&knobs);

    if (n_tile_sweep > 0) { /* prompt length x (GEMM variant, MoE tile, dense tile; 0 auto) -> prefill tok/s */
        static const int tcfg[][3] = {{0, 0, 0}, {0, 16, 0}, {0, 32, 0}, {0, 64, 0}, {1, 0, 0}, {1, 64, 0},
                                      {1, 128, 0}, {1, 0, 64}, {1, 0, 128}, {2, 0, 0}, {2, 128, 0},
                                      {3, 0, 0}, {3, 64, 0}, {3, 128, 0}, {3, 0, 64}, {4, 0, 0}, {4, 64, 0}};
        const int n_cfg = (int)(sizeof tcfg / sizeof tcfg[0]);
        float *lg = malloc(sizeof(float) * cfg->vocab_size);
        if (!lg) DIE("oom");
        for (int i = 0; i < max_prompt; i++) toks[i] = rnd_token(cfg->vocab_size);
        printf("\n## Prefill tok/s by prompt length x GEMM variant / MoE tile / dense tile (a: auto), chunks of %d tokens, best of 2-3 runs\n\n| prompt |", chunk);
        for (int k = 0; k < n_cfg; k++) {
            printf(" v%d", tcfg[k][0]);
            if (tcfg[k][1]) printf(" T%d", tcfg[k][1]); else printf(" Ta");
            if (tcfg[k][2]) printf(" d%d |", tcfg[k][2]); else printf(" da |");
        }
        printf("\n|---:|");
        for (int k = 0; k < n_cfg; k++) printf("---:|");
        printf("\n");
        for (int i = 0; i < n_tile_sweep; i++) {
            const int p = tile_sweep[i];
            const int reps = p >= 8192 ? 2 : 3;
            printf("| %d |", p);
            for (int k = 0; k < n_cfg; k++) {
                lily_cuda_tuning kt = knobs;
                kt.gemm_variant = tcfg[k][0];
                kt.moe_tile = tcfg[k][1];
                kt.dense_tile = tcfg[k][2];
                lily_cuda_set_tuning(&kt);
                be.ops->state_reset(be.ctx, st); /* warm-up: kernel attributes, caches */
                if (be.ops->forward(be.ctx, st, toks, p < chunk ? p : chunk, LILY_LOGITS_LAST, lg, &err) != LILY_OK)
                    DIE("tile sweep: %s", err.message);
                double best = 0;
                for (int r = 0; r < reps; r++) {
                    be.ops->state_reset(be.ctx, st);
                    t0 = now_s();
                    for (int q = 0; q < p; q += chunk) {
                        const int m = p - q < chunk ? p - q : chunk;
                        if (be.ops->forward(be.ctx, st, toks + q, m, LILY_LOGITS_LAST, lg, &err) != LILY_OK)
                            DIE("tile sweep: %s", err.message);
                    }
                    const double tps = p / (now_s() - t0);
                    best = tps > best ? tps : best;
                }
                printf(" %.0f |", best);
                fflush(stdout);
            }
            printf("\n");
        }
        lily_cuda_set_tuning(&knobs);
        free(lg);
    }

    printf("\n## Decode, greedy fast path (graph replay), %d tokens per depth\n\n", n_gen);
    printf("| depth | tok/s | ms/token | bytes/token | floor tok/s | fraction of floor | host syncs/token |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n_depths; i++) {
        const int d = depths[i];
        be.ops->state_reset(be.ctx, st);
        if (lily_cuda_state_set_position(be.ctx, st, d, &err) != LILY_OK)
            DIE("depth %d: %s", d, err.message);
        if (lily_cuda_generate_greedy(be.ctx, st, 1, 8, out, &err) != LILY_OK) /* warm-up (+ graph capture) */
            DIE("decode: %s", err.message);
        const long long s0 = lily_cuda_host_syncs(be.ctx);
        t0 = now_s();
        int streamed = 0; /* tokens reach the host while the GPU decodes (mapped memory, no sync) */
        if (lily_cuda_generate_greedy_stream(be.ctx, st, out[7], n_gen, out, count_token, &streamed, &err) != LILY_OK)
            DIE("decode: %s", err.message);
        if (streamed != n_gen)
            DIE("decode: %d of %d tokens streamed", streamed, n_gen);
        const double dt = now_s() - t0;
        const long long syncs = lily_cuda_host_syncs(be.ctx) - s0;
        const double bytes = lily_cost_decode_bytes(&cm, d + 8 + n_gen / 2);
        const double floor_tps = gbps * 1e9 / bytes;
        printf("| %d | %.1f | %.3f | %.3g | %.0f | %.1f%% | %.4f |\n", d, n_gen / dt, dt * 1e3 / n_gen, bytes, floor_tps,
               100.0 * (n_gen / dt) / floor_tps, (double)syncs / n_gen);
        fflush(stdout);
    }

    for (int i = 0; i < n_prof; i++) {
        const int d = prof[i];
        be.ops->state_reset(be.ctx, st);
        if (lily_cuda_state_set_position(be.ctx, st, d, &err) != LILY_OK)
            DIE("depth %d: %s", d, err.message);
        lily_cuda_profile p;
        if (lily_cuda_profile_decode(be.ctx, st, 1, 17, &p, &err) != LILY_OK)
            DIE("profile: %s", err.message);
        printf("\n## Decode profile at depth %d (graph replay with CUDA events between stages; ms per token)\n\n", d);
        printf("| stage | ms | share |\n|---|---:|---:|\n");
        for (int k = 0; k < p.n; k++)
            printf("| %s | %.4f | %.1f%% |\n", p.names[k], p.ms[k], 100.0 * p.ms[k] / p.total_ms);
        printf("| total (profiled graph) | %.4f | |\n", p.total_ms);
    }

    if (sweep) {
        const int sd[3] = {4096, 32768, 131072};
        const int sp[][2] = {{1, 1}, {16, 256}, {32, 128}, {64, 64}, {64, 128}, {128, 64}, {128, 128}, {256, 64}};
        printf("\n## Split-KV sweep (splits per KV head x min chunk), decode tok/s\n\n| splits x min_chunk |");
        for (int j = 0; j < 3; j++) printf(" d%d |", sd[j]);
        printf("\n|---|---:|---:|---:|\n");
        for (size_t k = 0; k < sizeof sp / sizeof sp[0]; k++) {
            printf("| %d x %d |", sp[k][0], sp[k][1]);
            for (int j = 0; j < 3; j++) {
                be.ops->state_reset(be.ctx, st);
                if (lily_cuda_set_attention_split(be.ctx, st, sp[k][0], sp[k][1], &err) != LILY_OK ||
                    lily_cuda_state_set_position(be.ctx, st, sd[j], &err) != LILY_OK ||
                    lily_cuda_generate_greedy(be.ctx, st, 1, 4, out, &err) != LILY_OK)
                    DIE("sweep: %s", err.message);
                t0 = now_s();
                if (lily_cuda_generate_greedy(be.ctx, st, out[3], 64, out, &err) != LILY_OK)
                    DIE("sweep: %s", err.message);
                printf(" %.1f |", 64 / (now_s() - t0));
                fflush(stdout);
            }
            printf("\n");
        }
    }

    if (tune) { /* knobs at depths 4096 and 131072 (where the context allows): PDL, GEMV shape, attention
                 * and DeltaNet decode kernels */
        static const char *kn[] = {"default", "gemv_mma=2", "pdl=0", "gemv_mma=0", "att_mma=0", "gdn_decode=0",
                                   "gemv_mma=0,att_mma=0,gdn_decode=0", "moe_gate_up_blocks=2",
                                   "moe_gate_up_blocks=3", "gemv_mma_blocks=1", "gemv_mma_blocks=2",
                                   "moe_gate_up_blocks=3,gemv_mma_blocks=2", "gemv_stream=1", "gemv_stream=2048",
                                   "gemv_stream=8192", "gemv_stream=65536", "gemv_stream=1,gemv_stream_stages=2",
                                   "gemv_stream=1,gemv_stream_stages=4"};
        const char *kl[32];
        size_t n_kl = 0;
        char *tl_copy = tune_list ? strdup(tune_list) : NULL;
        if (tl_copy)
            for (char *sv = NULL, *tok = strtok_r(tl_copy, ";", &sv); tok && n_kl < 32; tok = strtok_r(NULL, ";", &sv))
                kl[n_kl++] = tok;
        else
            for (; n_kl < sizeof kn / sizeof kn[0]; n_kl++)
                kl[n_kl] = kn[n_kl];
        const int td[2] = {4096, 131072};
        printf("\n## Launch knobs, decode tok/s (bench/cuda_knobs.h names, over the defaults)\n\n| knobs | d4096 | d131072 |\n|---|---:|---:|\n");
        for (size_t k = 0; k < n_kl; k++) {
            lily_cuda_tuning t;
            if (cuda_knobs_parse(kl[k], &t) != 0)
                DIE("--tune-list: bad knob spec '%s'", kl[k]);
            lily_cuda_set_tuning(&t);
            printf("| %s |", kl[k]);
            for (int j = 0; j < 2; j++) {
                if (td[j] + 80 > max_ctx) {
                    printf(" - |");
                    continue;
                }
                be.ops->state_reset(be.ctx, st);
                if (lily_cuda_set_attention_split(be.ctx, st, 64, 128, &err) != LILY_OK ||
                    lily_cuda_state_set_position(be.ctx, st, td[j], &err) != LILY_OK ||
                    lily_cuda_generate_greedy(be.ctx, st, 1, 4, out, &err) != LILY_OK)
                    DIE("tune: %s", err.message);
                t0 = now_s();
                if (lily_cuda_generate_greedy(be.ctx, st, out[3], 64, out, &err) != LILY_OK)
                    DIE("tune: %s", err.message);
                printf(" %.1f |", 64 / (now_s() - t0));
                fflush(stdout);
            }
            printf("\n");
        }
        free(tl_copy);
        lily_cuda_set_tuning(&knobs);
        lily_cuda_set_attention_split(be.ctx, st, 64, 128, &err);
    }

    be.ops->state_free(be.ctx, st);
    lily_backend_destroy(&be);
    lily_synthetic_free(syn);
    free(toks);
    free(pf_list);
    free(out);
    return 0;
}
