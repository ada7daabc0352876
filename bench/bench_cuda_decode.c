/* bench_cuda_decode.c — decode speed of the CUDA backend on the full-size synthetic model (random MLX
 * 4-bit weights, src/model/synthetic.h), through the backend's decode_loop (graph replay, the next token
 * chosen greedily on the device, no host sync per token), at context depths placed with lily_cuda_state_set_position (KV rows filled with
 * pseudo-random bf16). Prints a markdown table with the fraction of the bandwidth floor (bytes per token
 * from cost_model.h over the measured device-to-device copy rate), a per-stage profile (CUDA events),
 * the prefill speed (and its per-stage profile) and an optional split-KV sweep. CUDA-vs-CPU agreement is
 * bench_cuda_accuracy's job. The kernels are the backend's own choice for the device (no overrides).
 *
 * --timeline LIST: the in-kernel timeline of one decode step at each depth (lily_cuda_timeline_decode: the
 * plain step graph, every decode kernel stamping %globaltimer per block at entry, PDL wait release and exit):
 * one DeltaNet layer's and one attention layer's kernels, then each stage summed over the layers, against
 * the byte time of what each kernel moves at the measured copy rate.
 *
 * usage: bench_cuda_decode [--preset 35b] [-n 128] [-d 256,4096,...] [--profile 4096,131072] [--chunk 512]
 *                          [--profile-prefill] [--sweep-split] [--prefill N] [--timeline 4096,131072]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
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

/* The tokens streamed to the host: how many, and their FNV-1a hash (two builds or kernel variants that
 * decode the same tokens print the same hash). */
typedef struct {
    int n;
    unsigned long long hash;
} token_count;

static int count_token(void *user, int32_t token, int index, const lily_token_logprobs *logprobs)
{
    (void)index, (void)logprobs;
    token_count *tc = (token_count *)user;
    tc->n++;
    for (int b = 0; b < 4; b++)
        tc->hash = (tc->hash ^ ((uint32_t)token >> (8 * b) & 255u)) * 0x100000001b3ull;
    return 0;
}

/* n greedy decode steps from token `first` through the backend's decode_loop (on_token may be NULL). */
static lily_status decode_greedy(lily_backend *be, void *st, int32_t first, int n, lily_decode_token_fn on_token,
                                 void *user, lily_error *err)
{
    const lily_device_sampling greedy = lily_device_sampling_greedy();
    int n_run = 0;
    return be->ops->decode_loop(be->ctx, st, first, n, &greedy, on_token, user, NULL, &n_run, err);
}

/* One kernel's row: times from the previous kernel's last block exit (prev_end), µs. */
static void timeline_row(const lily_cuda_timeline *t, int k, double prev_end, double gbps)
{
    const lily_cuda_timeline_kernel *K = &t->k[k];
    char mark[32] = "";
    if (K->mark_us > 0)
        snprintf(mark, sizeof mark, "%.2f", K->mark_us - K->wait_us);
    printf("| %s | %d | %+.2f | %+.2f | %+.2f | %.2f | %.2f | %s | %.2f | %.2f |\n", t->stage_names[K->stage], K->blocks,
           K->start_us - prev_end, K->last_start_us - prev_end, K->wait_us - prev_end, K->end_us - prev_end,
           K->end_us - K->wait_us, mark, K->bytes / 1e6, K->bytes / (gbps * 1e3));
}

/* The layer's kernels (launch order), each against the kernel launched before it. */
static void timeline_layer(const lily_cuda_timeline *t, int layer, double gbps)
{
    printf("| kernel | blocks | first start | last start | last wait release | last end (step) | post-wait | wait → x ready | MB | byte µs |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    double sum = 0, bytes = 0;
    for (int k = 1; k < t->n; k++)
        if (t->k[k].layer == layer) {
            timeline_row(t, k, t->k[k - 1].end_us, gbps);
            sum += t->k[k].end_us - t->k[k - 1].end_us;
            bytes += t->k[k].bytes;
        }
    printf("| layer %d | | | | | %.2f | | | %.2f | %.2f |\n", layer, sum, bytes / 1e6, bytes / (gbps * 1e3));
}

static void print_timeline(const lily_cuda_timeline *t, int depth, double gbps)
{
    printf("\n## Decode timeline at depth %d (in-kernel %%globaltimer stamps, plain step graph; µs)\n\n", depth);
    printf("%%globaltimer: smallest step %.0f ns, updates every %.0f ns (%.0f SM cycles); step %.1f µs from the first "
           "stamp to the last\n\n",
           t->timer_step_ns, t->timer_update_ns, t->timer_update_cycles, t->step_us);
    printf("Columns: from the previous kernel's last block exit to this kernel's first block entry, last block entry, "
           "last PDL wait release and last block exit; post-wait = last exit - last wait release; wait → x ready = the "
           "last block's input transform done (GEMVs, MoE) - last wait release; byte µs = the bytes it moves at the copy "
           "rate.\n\n");
    int gdn = -1, att = -1;
    for (int k = 0; k < t->n; k++) {
        const char *s = t->stage_names[t->k[k].stage];
        if (gdn < 0 && t->k[k].layer >= 4 && !strcmp(s, "deltanet_scan"))
            gdn = t->k[k].layer;
        if (att < 0 && t->k[k].layer >= 4 && !strcmp(s, "attention"))
            att = t->k[k].layer;
    }
    if (gdn >= 0) {
        printf("DeltaNet layer %d:\n\n", gdn);
        timeline_layer(t, gdn, gbps);
    }
    if (att >= 0) {
        printf("\nAttention layer %d:\n\n", att);
        timeline_layer(t, att, gbps);
    }
    printf("\nPer stage, summed over its kernels (each against the kernel launched before it):\n\n");
    printf("| stage | kernels | Σ step (end - prev end) | Σ post-wait | Σ wait release - prev end | Σ first start - prev end "
           "| Σ wait → x ready | Σ byte µs | step / byte |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    double tot = 0, tot_b = 0;
    for (int s = 0; s < t->n_stages; s++) {
        int n = 0;
        double step = 0, post = 0, rel = 0, start = 0, bytes = 0, xr = 0;
        int n_xr = 0;
        for (int k = 1; k < t->n; k++)
            if (t->k[k].stage == s) {
                const double pe = t->k[k - 1].end_us;
                n++;
                step += t->k[k].end_us - pe;
                post += t->k[k].end_us - t->k[k].wait_us;
                rel += t->k[k].wait_us - pe;
                start += t->k[k].start_us - pe;
                bytes += t->k[k].bytes;
                if (t->k[k].mark_us > 0)
                    xr += t->k[k].mark_us - t->k[k].wait_us, n_xr++;
            }
        if (!n)
            continue;
        const double bu = bytes / (gbps * 1e3);
        char xrs[32] = "";
        if (n_xr)
            snprintf(xrs, sizeof xrs, "%.1f", xr);
        printf("| %s | %d | %.1f | %.1f | %.1f | %.1f | %s | %.1f | %.1f |\n", t->stage_names[s], n, step, post, rel, start,
               xrs, bu, bu > 0 ? step / bu : 0.0);
        tot += step;
        tot_b += bu;
    }
    printf("| total (kernels 2..%d) | %d | %.1f | | | | | %.1f | %.1f |\n", t->n, t->n - 1, tot, tot_b, tot / tot_b);
    fflush(stdout);
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
    int n_gen = 128, depths[32], n_depths = 0, prof[8], n_prof = 0, sweep = 0, prefill = 512, chunk = 512, prof_prefill = 0;
    int tl_depths[8], n_tl = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--preset") && i + 1 < argc) preset = argv[++i];
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) n_gen = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-d") && i + 1 < argc) n_depths = parse_list(argv[++i], depths, 32);
        else if (!strcmp(argv[i], "--profile") && i + 1 < argc) n_prof = parse_list(argv[++i], prof, 8);
        else if (!strcmp(argv[i], "--sweep-split")) sweep = 1;
        else if (!strcmp(argv[i], "--prefill") && i + 1 < argc) prefill = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) chunk = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--profile-prefill")) prof_prefill = 1;
        else if (!strcmp(argv[i], "--timeline") && i + 1 < argc) n_tl = parse_list(argv[++i], tl_depths, 8);
        else DIE("usage: %s [--preset 35b] [-n N] [-d LIST] [--profile LIST] [--sweep-split] [--prefill N] [--chunk N] [--profile-prefill] [--timeline LIST]", argv[0]);
    }
    if (!n_depths) {
        for (int d = 256; d <= 131072; d *= 2)
            depths[n_depths++] = d;
    }
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
    for (int i = 0; i < n_tl; i++) max_depth = tl_depths[i] > max_depth ? tl_depths[i] : max_depth;
    if (sweep && max_depth < 131072) max_depth = 131072;
    const int max_prompt = prefill;
    const int max_ctx = max_depth + n_gen + 64 > max_prompt + 64 ? max_depth + n_gen + 64 : max_prompt + 64;
    void *st = NULL;
    if (be.ops->state_new(be.ctx, max_ctx, &st, &err) != LILY_OK)
        DIE("state: %s", err.message);

    int32_t *toks = malloc(sizeof(int32_t) * ((size_t)max_prompt + 64));
    if (!toks) DIE("oom");

    /* prefill: warm-up, then the timed run */
    if (prefill > 0) {
        for (int i = 0; i < prefill; i++) toks[i] = rnd_token(cfg->vocab_size);
        float *lg = malloc(sizeof(float) * cfg->vocab_size);
        if (!lg) DIE("oom");
        be.ops->state_reset(be.ctx, st);
        if (be.ops->forward(be.ctx, st, toks, prefill < chunk ? prefill : chunk, LILY_LOGITS_LAST, lg, &err) != LILY_OK)
            DIE("prefill: %s", err.message);
        be.ops->state_reset(be.ctx, st);
        t0 = now_s();
        for (int p = 0; p < prefill; p += chunk) {
            const int m = prefill - p < chunk ? prefill - p : chunk;
            if (be.ops->forward(be.ctx, st, toks + p, m, LILY_LOGITS_LAST, lg, &err) != LILY_OK)
                DIE("prefill: %s", err.message);
        }
        printf("prefill %d tokens in chunks of %d: %.1f tok/s\n", prefill, chunk, prefill / (now_s() - t0));
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

    printf("\n## Decode, greedy fast path (graph replay), %d tokens per depth\n\n", n_gen);
    printf("| depth | tok/s | ms/token | bytes/token | floor tok/s | fraction of floor | host syncs/token | tokens (FNV-1a) |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (int i = 0; i < n_depths; i++) {
        const int d = depths[i];
        be.ops->state_reset(be.ctx, st);
        if (lily_cuda_state_set_position(be.ctx, st, d, &err) != LILY_OK)
            DIE("depth %d: %s", d, err.message);
        if (decode_greedy(&be, st, 1, 8, NULL, NULL, &err) != LILY_OK) /* warm-up (+ graph capture) */
            DIE("decode: %s", err.message);
        const long long s0 = lily_cuda_host_syncs(be.ctx);
        t0 = now_s();
        token_count streamed = {0, 0xcbf29ce484222325ull}; /* tokens reach the host while the GPU decodes (mapped memory, no sync) */
        if (decode_greedy(&be, st, 1, n_gen, count_token, &streamed, &err) != LILY_OK)
            DIE("decode: %s", err.message);
        if (streamed.n != n_gen)
            DIE("decode: %d of %d tokens streamed", streamed.n, n_gen);
        const double dt = now_s() - t0;
        const long long syncs = lily_cuda_host_syncs(be.ctx) - s0;
        const double bytes = lily_cost_decode_bytes(&cm, d + 8 + n_gen / 2);
        const double floor_tps = gbps * 1e9 / bytes;
        printf("| %d | %.1f | %.3f | %.3g | %.0f | %.1f%% | %.4f | %016llx |\n", d, n_gen / dt, dt * 1e3 / n_gen, bytes,
               floor_tps, 100.0 * (n_gen / dt) / floor_tps, (double)syncs / n_gen, streamed.hash);
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

    if (n_tl) {
        lily_cuda_timeline *tl = malloc(sizeof *tl);
        if (!tl) DIE("oom");
        for (int i = 0; i < n_tl; i++) {
            be.ops->state_reset(be.ctx, st);
            if (lily_cuda_state_set_position(be.ctx, st, tl_depths[i], &err) != LILY_OK)
                DIE("depth %d: %s", tl_depths[i], err.message);
            if (lily_cuda_timeline_decode(be.ctx, st, 1, 16, tl, &err) != LILY_OK)
                DIE("timeline: %s", err.message);
            print_timeline(tl, tl_depths[i], gbps);
        }
        free(tl);
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
                    decode_greedy(&be, st, 1, 4, NULL, NULL, &err) != LILY_OK)
                    DIE("sweep: %s", err.message);
                t0 = now_s();
                if (decode_greedy(&be, st, 1, 64, NULL, NULL, &err) != LILY_OK)
                    DIE("sweep: %s", err.message);
                printf(" %.1f |", 64 / (now_s() - t0));
                fflush(stdout);
            }
            printf("\n");
        }
    }

    be.ops->state_free(be.ctx, st);
    lily_backend_destroy(&be);
    lily_synthetic_free(syn);
    free(toks);
    return 0;
}
