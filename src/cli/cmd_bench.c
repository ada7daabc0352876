/* cmd_bench.c — `lily bench`: prefill and decode speed over prompt lengths and context depths, in the
 * spirit of llama.cpp's llama-bench, with each row's fraction of the hardware limit (DESIGN.md §6).
 *
 *   lily bench (-m DIR | --synthetic NAME|CONFIG) [-p 256,512,...] [-n 128] [-d 0,4096,...] [-r 3]
 *              [--backend cpu|cuda] [--precision fast|exact] [-o md|json|csv] [--plot FILE.png] [--threads N]
 *              [--ctx-size N] [--profile]
 *   lily bench --membw [--backend cpu|cuda] [--threads N]
 *
 * Prefill row "pp<P>": a fresh state each repetition, P random token ids appended (chunked as the engine
 * does), timed to the last token's logits. Decode row "tg<N> @ d<D>": the state is first filled with D
 * random tokens by prefill (untimed, once per row, then copied for each repetition), then N single-token
 * steps are timed. One warm-up (a short prefill and a few decode steps) runs before the sweep.
 * Limits: decode bytes per token (cost_model.h, at the mean depth of the row) over the bandwidth, prefill
 * FLOPs per token over the matrix rate, both measured on the backend's device (hw_limits.h).
 * A default sweep (no -p / -d) stops before a length whose row would take more than --max-seconds
 * (default 60): a row's time is at least proportional to its length, so the next of a doubling sweep is
 * estimated as the last one's time x the ratio of the lengths. md and csv rows are printed as they
 * finish; Ctrl-C stops after the step in progress and prints the table (and the plot) of the rows done.
 *
 * Owns: option parsing, the timing loop, the table (md/json/csv) and the gnuplot chart.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"
#include "base/clock.h"
#include "cli_common.h"
#include "commands.h"
#include "model/synthetic.h"
#include "runtime/cost_model.h"
#include "runtime/engine.h"
#include "runtime/hw_limits.h"

#ifndef LILY_GIT_DESCRIBE
#define LILY_GIT_DESCRIBE "unknown"
#endif

#define MAX_POINTS 64

typedef struct {
    const char *model_dir;
    const char *synthetic;
    const char *backend;
    bool exact; /* --precision exact */
    const char *output;
    const char *plot;
    int prompt_lengths[MAX_POINTS], n_prompt_lengths;
    int depths[MAX_POINTS], n_depths;
    int n_decode;
    int reps;
    int n_threads;
    int ctx_size;
    int prefill_chunk;
    size_t gpu_memory_bytes;
    int n_cpu_moe;       /* --n-cpu-moe / --cpu-moe (lily_engine_options.n_cpu_moe) */
    int host_experts;    /* --host-experts (lily_engine_options.host_experts) */
    int device;
    uint64_t seed;
    int warmup;
    int membw_only;
    bool profile; /* --profile: the backend's stage times per row, on stderr */
    int default_prompt_lengths, default_depths; /* -p / -d not given: the sweep up to the model's length */
    double max_seconds;  /* a default sweep stops before a row estimated to take longer (--max-seconds) */
    char sampling_list[256]; /* --sampling: the device decode loop's sampler presets, comma-separated */
    const char *samplings[8]; /* each preset (NULL = greedy) */
    int n_samplings;
} bench_options;

/* Ctrl-C: finish the step in progress, then print what was measured (a second Ctrl-C ends at once). */
static atomic_int bench_interrupted;

static void on_sigint(int sig)
{
    atomic_store(&bench_interrupted, 1);
    signal(sig, SIG_DFL);
}

typedef struct {
    char test[32];
    int is_decode;
    int length;       /* prompt length (prefill) or depth (decode) */
    int n_tokens;     /* tokens timed per repetition */
    double mean, stddev;   /* tok/s */
    double cost;           /* FLOPs (prefill) or bytes (decode) per token */
    double floor;          /* tok/s the hardware allows; 0 when unknown */
} bench_row;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lily bench [-m DIR | --synthetic NAME|CONFIG] [options]   (default: the bundled model)\n"
            "       lily bench --membw [--backend cpu|cuda] [--threads N]\n\n"
            "Prefill tok/s per prompt length (fresh state each time) and decode tok/s of -n tokens after a\n"
            "context of each depth (filled by prefilling random tokens), mean +- stddev over -r repetitions,\n"
            "each with its fraction of the hardware limit (bytes/token over measured bandwidth for decode,\n"
            "FLOPs/token over measured matmul rate for prefill).\n\n"
            "  -m, --model DIR        model directory\n"
            "  --synthetic SPEC       random weights in memory instead: qwen3.6-35b-a3b, qwen3.6-35b-a3b-4l,\n"
            "                         small, tiny-a, or a config.json (the shape; weights are MLX 4-bit)\n"
            "  -p LIST                prompt lengths (default 256,512,...,131072, up to the model's\n"
            "                         max_position_embeddings; 'none' skips prefill)\n"
            "  -n N                   decode tokens per repetition (default 128; 0 skips decode)\n"
            "  -d LIST                context depths for decode (default 256,512,...,131072, while depth + N is\n"
            "                         at most max_position_embeddings)\n"
            "  -r N                   repetitions (default 3)\n"
            "  --max-seconds S        a default sweep (no -p / -d) stops before a row estimated to take\n"
            "                         longer than S seconds (default 60; the estimate is the last row's time\n"
            "                         times the ratio of the lengths)\n"
            "  --backend cpu|cuda     (default cpu)\n"
            "  --precision P          fast (default) or exact: fp32 everywhere (cuda: fp32 KV cache, no tensor\n"
            "                         cores; slower; cpu: no int8 dot products), the reference\n"
            "  -o md|json|csv         output format (default md)\n"
            "  --plot FILE.png        chart of tok/s against length (prefill and decode panels, the hardware\n"
            "                         ceiling dashed), via gnuplot; FILE.svg writes SVG\n"
            "  --membw                only measure and print the device's bandwidth and matmul rate\n"
            "  -t, --threads N        " CLI_THREADS_HELP "\n"
            "  --ctx-size N           session context size (default: the largest length the sweep needs)\n"
            "  --prefill-chunk N      tokens per forward pass during prefill (default 512, 4096 with cuda)\n"
            "  --device N             GPU ordinal (default 0)\n"
            "  --gpu-memory GIB       " CLI_GPU_MEMORY_HELP "\n"
            "  --cpu-moe              " CLI_CPU_MOE_HELP "\n"
            "  --n-cpu-moe N          " CLI_N_CPU_MOE_HELP "\n"
            "  --host-experts M       " CLI_HOST_EXPERTS_HELP "\n"
            "                         " CLI_HOST_EXPERTS_DEFAULT_HELP "\n"
            "  --seed N               token ids and synthetic weights (default 1)\n"
            "  --no-warmup            skip the warm-up run\n"
            "  --profile              after each row, the backend's time by stage over its timed runs (stderr;\n"
            "                         cpu)\n"
            "  --sampling LIST        decode rows per sampler preset of the device decode loop (cuda; default\n"
            "                         greedy: the LM head's fused argmax): greedy, qwen (temperature 1, top-p\n"
            "                         0.95, top-k 20, presence penalty 1.5), openai (temperature 1, top-p 1,\n"
            "                         top-k off), logprobs (openai + 5 top logprobs), bias (openai + 16\n"
            "                         logit-bias entries)\n"
            "Lists take commas and k suffixes: -p 512,4k,32k. A length past the model's max_position_embeddings\n"
            "is measured, with a warning on stderr. Rows are printed as they finish (md, csv); Ctrl-C stops\n"
            "after the current step and prints the rows (and the plot) measured so far.\n");
}

static int parse_int(const char *s, long min, long max, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s)
        return -1;
    if (*end == 'k' || *end == 'K') {
        v *= 1024;
        end++;
    }
    if (*end || v < min || v > max)
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_list(const char *s, int *out, int *n, long min)
{
    *n = 0;
    if (!strcmp(s, "none") || !*s)
        return 0;
    /* comma-separated items; an empty one (",", "64,,128", "64,") is an error, not skipped */
    for (const char *p = s;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[32];
        if (len == 0 || len >= sizeof item || *n >= MAX_POINTS)
            return -1;
        memcpy(item, p, len);
        item[len] = 0;
        if (parse_int(item, min, 1L << 24, &out[*n]) != 0)
            return -1;
        (*n)++;
        if (!comma)
            return 0;
        p = comma + 1;
    }
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void random_tokens(uint64_t *rng, int vocab, int32_t *out, int n)
{
    for (int i = 0; i < n; i++)
        out[i] = (int32_t)(rng_next(rng) % (uint64_t)vocab);
}

/* ---- the model: a checkpoint directory or synthetic weights ------------------------------------- */

typedef struct {
    lily_engine *engine;
    lily_synthetic *synthetic; /* non-NULL: the engine was assembled here and is closed here */
} bench_model;

static lily_status model_open(const bench_options *o, bench_model *m, lily_error *err)
{
    memset(m, 0, sizeof *m);
    /* the sweep's two sessions (prefill, decode at depth) */
    const lily_engine_options eo = {.model_dir = o->model_dir, .backend = o->backend, .n_threads = o->n_threads,
                                    .prefill_chunk = o->prefill_chunk, .device = o->device, .exact = o->exact,
                                    .gpu_memory_bytes = o->gpu_memory_bytes, .ctx_size = o->ctx_size,
                                    .n_sessions = 2, .n_cpu_moe = o->n_cpu_moe, .host_experts = o->host_experts,
                                    .profile = o->profile};
    if (o->model_dir) {
        return lily_engine_open(&eo, &m->engine, err);
    }
    double t0 = lily_wall_seconds();
    lily_status st = lily_synthetic_new(o->synthetic, o->seed, o->n_threads, &m->synthetic, err);
    if (st != LILY_OK)
        return st;
    double dt = lily_wall_seconds() - t0;
    fprintf(stderr, "lily bench: synthetic weights: %.2f GB in %.1f s (%.2f GB/s)\n",
            (double)m->synthetic->buffer_size / 1e9, dt, (double)m->synthetic->buffer_size / 1e9 / dt);
    lily_engine *e = calloc(1, sizeof *e);
    if (!e) {
        lily_synthetic_free(m->synthetic);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
    }
    e->cfg = m->synthetic->cfg;
    e->weights = m->synthetic->weights;
    e->prefill_chunk = o->prefill_chunk > 0 ? o->prefill_chunk : lily_default_prefill_chunk(o->backend);
    lily_backend_options bo = {.n_threads = o->n_threads, .max_chunk = e->prefill_chunk, .device = o->device,
                               .exact = o->exact, .host_experts = o->host_experts, .profile = o->profile};
    st = lily_engine_plan(e, o->backend, &eo, &bo, err);
    if (st == LILY_OK)
        st = lily_backend_create(o->backend, &e->cfg, &e->weights, &bo, &e->backend, err);
    if (st != LILY_OK) {
        free(e);
        lily_synthetic_free(m->synthetic);
        return st;
    }
    m->engine = e;
    return LILY_OK;
}

static void model_close(bench_model *m)
{
    if (m->synthetic) {
        if (m->engine)
            lily_backend_destroy(&m->engine->backend);
        free(m->engine);
        lily_synthetic_free(m->synthetic);
    } else {
        lily_engine_close(m->engine);
    }
}

/* ---- header --------------------------------------------------------------------------------------- */

typedef struct {
    char machine[600];
    char model[512];
    char shape[256];
    char quantization[128];
    char build[128];
    char date[64];
    char limits[256];
    char memory[128]; /* device memory in use after the sweep (CUDA), or "" */
    int threads;
} bench_header;

static void describe_quantization(const lily_weights *w, char *buf, size_t size)
{
    const lily_tensor *bulk = w->n_layers > 0 ? &w->layers[0].experts_gate : &w->embed;
    const lily_tensor *router = w->n_layers > 0 ? &w->layers[0].router : NULL;
    if (!bulk->bits) {
        snprintf(buf, size, "%s (unquantized)", lily_dtype_name(bulk->dtype));
        return;
    }
    snprintf(buf, size, "MLX affine %d-bit, group %d%s", bulk->bits, bulk->group_size,
             router && router->bits && router->bits != bulk->bits ? ", router 8-bit" : "");
}

static void build_header(const bench_options *o, const bench_model *m, const lily_hw_limits *hw, int have_hw,
                         bench_header *h)
{
    memset(h, 0, sizeof *h);
    const lily_config *c = &m->engine->cfg;
    char cpu[256];
    lily_cpu_describe(cpu, sizeof cpu);
    if (!strcmp(o->backend, "cpu") || !have_hw)
        snprintf(h->machine, sizeof h->machine, "%s", cpu);
    else
        snprintf(h->machine, sizeof h->machine, "%s; host %s", hw->device, cpu);
    if (m->synthetic)
        snprintf(h->model, sizeof h->model, "synthetic %s (random weights, seed %llu)", o->synthetic,
                 (unsigned long long)o->seed);
    else
        snprintf(h->model, sizeof h->model, "%s", o->model_dir);
    snprintf(h->shape, sizeof h->shape,
             "%d layers (%d full attention), hidden %d, %d experts top-%d, vocab %d", c->n_layers,
             lily_config_n_full_attention_layers(c), c->hidden, c->n_experts, c->n_experts_used, c->vocab_size);
    describe_quantization(&m->engine->weights, h->quantization, sizeof h->quantization);
    snprintf(h->build, sizeof h->build, "lily %s (%s, built %s %s)", LILY_VERSION, LILY_GIT_DESCRIBE, __DATE__,
             __TIME__);
    time_t t = time(NULL);
    strftime(h->date, sizeof h->date, "%Y-%m-%d %H:%M UTC", gmtime(&t));
    if (have_hw)
        snprintf(h->limits, sizeof h->limits, "bandwidth %.1f GB/s (read %.1f, copy %.1f), matmul %.1f GFLOP/s (%s)",
                 hw->bandwidth / 1e9, hw->read_bytes_per_s / 1e9, hw->copy_bytes_per_s / 1e9,
                 hw->matmul_flops_per_s / 1e9, hw->matmul_kind);
    else
        snprintf(h->limits, sizeof h->limits, "not measured on this backend");
    h->threads = o->n_threads > 0 ? o->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
}

/* ---- measuring ------------------------------------------------------------------------------------ */

static void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void progress(const char *fmt, ...)
{
    static int tty = -1;
    if (tty < 0)
        tty = isatty(STDERR_FILENO);
    va_list ap;
    va_start(ap, fmt);
    fputs(tty ? "\r\033[K" : "", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(tty ? "" : "\n", stderr);
    va_end(ap);
    fflush(stderr);
}

static void stats(const double *v, int n, double *mean, double *stddev)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += v[i];
    *mean = s / n;
    double q = 0;
    for (int i = 0; i < n; i++)
        q += (v[i] - *mean) * (v[i] - *mean);
    *stddev = n > 1 ? sqrt(q / (n - 1)) : 0.0;
}

/* --profile: the stage sums so far dropped (before a row's timed runs). */
static void profile_discard(lily_engine *e)
{
    lily_stage_profile p;
    if (e->backend.ops->profile_take)
        e->backend.ops->profile_take(e->backend.ctx, &p);
}

/* --profile: the stage sums since profile_discard, one line per stage (ms, % of the time in forward(),
 * intervals), to stderr, beside the row's timed seconds (reps runs of `tokens` at tps[k] tokens/s). */
static void profile_print(lily_engine *e, const char *row, int tokens, const double *tps, int reps)
{
    lily_stage_profile p;
    if (!e->backend.ops->profile_take)
        return;
    double wall = 0;
    for (int k = 0; k < reps; k++)
        wall += tokens / tps[k];
    e->backend.ops->profile_take(e->backend.ctx, &p);
    if (p.n_stages == 0)
        return;
    double sum = 0;
    for (int i = 0; i < p.n_stages; i++)
        sum += p.seconds[i];
    fprintf(stderr, "profile %s: %lld forward calls, %.3f ms in forward (stages %.3f ms) of %.3f ms timed\n", row,
            (long long)p.forwards, p.forward_seconds * 1e3, sum * 1e3, wall * 1e3);
    fprintf(stderr, "  %-36s %10s %7s %9s\n", "stage", "ms", "%", "calls");
    for (int i = 0; i < p.n_stages; i++)
        if (p.calls[i] > 0)
            fprintf(stderr, "  %-36s %10.3f %6.1f%% %9lld\n", p.names[i], p.seconds[i] * 1e3,
                    p.forward_seconds > 0 ? 100.0 * p.seconds[i] / p.forward_seconds : 0.0, (long long)p.calls[i]);
}

/* Append n tokens in slices of PROGRESS_SLICE (a multiple of any sane prefill chunk, so the engine does the
 * same work as in one call; each slice costs one extra last-token LM head, < 0.01% at this size), showing
 * progress between slices. */
#define PROGRESS_SLICE 16384

static lily_status append_with_progress(lily_session *s, const int32_t *tokens, int n, const char *what, int rep,
                                        int reps, lily_error *err)
{
    for (int done = 0; done < n;) {
        if (atomic_load(&bench_interrupted))
            return lily_error_set(err, LILY_ERR_CANCELLED, "interrupted");
        int m = n - done < PROGRESS_SLICE ? n - done : PROGRESS_SLICE;
        if (n > PROGRESS_SLICE)
            progress("bench: %s  rep %d/%d  %d/%d tokens", what, rep, reps, done, n);
        lily_status st = lily_session_append(s, tokens + done, m, NULL, err);
        if (st != LILY_OK)
            return st;
        done += m;
    }
    return LILY_OK;
}

static lily_status bench_prefill(lily_session *s, int length, int reps, uint64_t *rng, int32_t *tokens, double *tps,
                                 lily_error *err)
{
    int vocab = s->engine->cfg.vocab_size;
    char what[32];
    snprintf(what, sizeof what, "pp%d", length);
    profile_discard(s->engine);
    for (int r = 0; r < reps; r++) {
        progress("bench: pp%d  rep %d/%d", length, r + 1, reps);
        lily_session_reset(s);
        random_tokens(rng, vocab, tokens, length);
        double t0 = lily_wall_seconds();
        lily_status st = append_with_progress(s, tokens, length, what, r + 1, reps, err);
        double t1 = lily_wall_seconds();
        if (st != LILY_OK)
            return st;
        tps[r] = length / (t1 - t0);
    }
    return LILY_OK;
}

/* The --sampling presets (static tables: the settings point into them). False for an unknown name. */
static bool bench_sampling(const char *name, lily_device_sampling *ds)
{
    static const int32_t bias_ids[16] = {11, 220, 271, 314, 1000, 2000, 3000, 4000,
                                         5000, 6000, 7000, 8000, 9000, 10000, 20000, 30000};
    static const float bias_values[16] = {2, -1, 3, -100, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -5, 5};
    *ds = lily_device_sampling_greedy();
    if (!strcmp(name, "greedy"))
        return true;
    ds->temperature = 1.0f;
    ds->top_k = 0;
    ds->seed = 1;
    if (!strcmp(name, "qwen")) {
        ds->top_p = 0.95f;
        ds->top_k = 20;
        ds->presence_penalty = 1.5f;
    } else if (!strcmp(name, "logprobs")) {
        ds->top_logprobs = 5;
    } else if (!strcmp(name, "bias")) {
        ds->bias_ids = bias_ids;
        ds->bias_values = bias_values;
        ds->n_bias = 16;
    } else if (strcmp(name, "openai")) {
        return false;
    }
    return true;
}

/* Fill `base` to `depth` tokens (prefill, untimed) and time n single-token steps from a copy of it.
 * sampling: the device decode loop's preset (NULL: greedy); backends without the loop decode greedy. */
static lily_status bench_decode(lily_session *base, lily_session *work, int depth, int n, int reps, uint64_t *rng,
                                int32_t *tokens, double *tps, const char *sampling, lily_error *err)
{
    int vocab = base->engine->cfg.vocab_size;
    lily_session_reset(base);
    if (depth > 0) {
        char what[48];
        snprintf(what, sizeof what, "tg%d @ d%d  filling the context", n, depth);
        progress("bench: %s", what);
        random_tokens(rng, vocab, tokens, depth);
        lily_status st = append_with_progress(base, tokens, depth, what, 1, 1, err);
        if (st != LILY_OK)
            return st;
    }
    profile_discard(base->engine);
    for (int r = 0; r < reps; r++) {
        lily_status st = lily_session_copy(work, base, err);
        if (st != LILY_OK)
            return st;
        random_tokens(rng, vocab, tokens, n);
        const lily_backend_ops *ops = work->engine->backend.ops;
        if (ops->decode_loop && n > 0) {
            /* the device decode loop: graph replay, next token chosen (greedy) and fed back on the device */
            lily_device_sampling ds;
            bench_sampling(sampling ? sampling : "greedy", &ds);
            int n_run = 0;
            progress("bench: tg%d @ d%d  rep %d/%d  (device decode loop, %s)", n, depth, r + 1, reps,
                     sampling ? sampling : "greedy");
            double t0 = lily_wall_seconds();
            st = ops->decode_loop(work->engine->backend.ctx, work->state, tokens[0], n, &ds, NULL, NULL, NULL, &n_run,
                                  err);
            tps[r] = n_run / (lily_wall_seconds() - t0);
            if (st != LILY_OK)
                return st;
            continue;
        }
        double t0 = lily_wall_seconds();
        for (int i = 0; i < n; i++) {
            if (atomic_load(&bench_interrupted))
                return lily_error_set(err, LILY_ERR_CANCELLED, "interrupted");
            if (i % 16 == 0)
                progress("bench: tg%d @ d%d  rep %d/%d  token %d", n, depth, r + 1, reps, i);
            if ((st = lily_session_append(work, tokens + i, 1, NULL, err)) != LILY_OK)
                return st;
        }
        tps[r] = n / (lily_wall_seconds() - t0);
    }
    return LILY_OK;
}

/* ---- output --------------------------------------------------------------------------------------- */

/* 1.234 GB, 12.3 MFLOP, ... */
static void format_si(char *buf, size_t size, double v, const char *unit)
{
    const char *prefix[] = {"", "k", "M", "G", "T", "P"};
    int i = 0;
    while (v >= 1000.0 && i < 5) {
        v /= 1000.0;
        i++;
    }
    snprintf(buf, size, "%.3g %s%s", v, prefix[i], unit);
}

/* The precision the run used: "exact" with --precision exact, else "fast". */
static const char *precision_name(const bench_options *o)
{
    return o->exact ? "exact" : "fast";
}

static void print_md_head(const bench_header *h, const bench_options *o)
{
    printf("## lily bench — %s\n\n", h->date);
    printf("- machine: %s\n- backend: %s, %d threads\n- precision: %s\n- model: %s\n- shape: %s\n"
           "- quantization: %s\n- build: %s\n- limits: %s\n- repetitions: %d (mean ± stddev)\n",
           h->machine, o->backend, h->threads, precision_name(o), h->model, h->shape, h->quantization,
           h->build, h->limits, o->reps);
    printf("\n");
    printf("| test | length | tok/s | ± | cost/token | floor tok/s | %% of floor |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|\n");
}

static void print_md_row(const bench_row *r)
{
    {
        char cost[32], floor[32], frac[32];
        format_si(cost, sizeof cost, r->cost, r->is_decode ? "B" : "FLOP");
        if (r->floor > 0) {
            snprintf(floor, sizeof floor, "%.2f", r->floor);
            snprintf(frac, sizeof frac, "%.1f%%", 100.0 * r->mean / r->floor);
        } else {
            snprintf(floor, sizeof floor, "-");
            snprintf(frac, sizeof frac, "-");
        }
        printf("| %s | %d | %.2f | %.2f | %s | %s | %s |\n", r->test, r->length, r->mean, r->stddev, cost, floor, frac);
    }
}

static void print_md_tail(const bench_header *h, int top_k)
{
    if (h->memory[0])
        printf("\n- device memory: %s\n", h->memory);
    printf("\ncost/token: prefill = FLOPs per prompt token (matmuls + causal attention + delta rule + one LM head "
           "per prompt); decode = bytes per token (active weights with top-%d experts + KV cache at the mean depth + "
           "recurrent state read and write). Decode contexts are filled by prefilling random tokens.\n",
           top_k);
}

static void print_csv_head(void)
{
    printf("test,kind,length,n_tokens,tok_s,stddev,cost_per_token,floor_tok_s,fraction_of_floor,backend,precision,model,"
           "date\n");
}

static void print_csv_row(const bench_header *h, const bench_options *o, const bench_row *r)
{
    {
        printf("%s,%s,%d,%d,%.4f,%.4f,%.6g,%.4f,%.5f,%s,%s,\"%s\",%s\n", r->test, r->is_decode ? "decode" : "prefill",
               r->length, r->n_tokens, r->mean, r->stddev, r->cost, r->floor, r->floor > 0 ? r->mean / r->floor : 0.0,
               o->backend, precision_name(o), h->model, h->date);
    }
}

static void print_json(const bench_header *h, const bench_options *o, const lily_hw_limits *hw, int have_hw,
                       const bench_row *rows, int n_rows)
{
    json_t *root = json_object();
    json_object_set_new(root, "date", json_string(h->date));
    json_object_set_new(root, "machine", json_string(h->machine));
    json_object_set_new(root, "backend", json_string(o->backend));
    json_object_set_new(root, "precision", json_string(precision_name(o)));
    json_object_set_new(root, "threads", json_integer(h->threads));
    json_object_set_new(root, "model", json_string(h->model));
    json_object_set_new(root, "shape", json_string(h->shape));
    json_object_set_new(root, "quantization", json_string(h->quantization));
    json_object_set_new(root, "build", json_string(h->build));
    json_object_set_new(root, "repetitions", json_integer(o->reps));
    if (have_hw) {
        json_t *lim = json_object();
        json_object_set_new(lim, "device", json_string(hw->device));
        json_object_set_new(lim, "bandwidth_bytes_per_s", json_real(hw->bandwidth));
        json_object_set_new(lim, "read_bytes_per_s", json_real(hw->read_bytes_per_s));
        json_object_set_new(lim, "copy_bytes_per_s", json_real(hw->copy_bytes_per_s));
        json_object_set_new(lim, "matmul_flops_per_s", json_real(hw->matmul_flops_per_s));
        json_object_set_new(lim, "matmul_kind", json_string(hw->matmul_kind));
        json_object_set_new(root, "limits", lim);
    }
    json_t *arr = json_array();
    for (int i = 0; i < n_rows; i++) {
        const bench_row *r = &rows[i];
        json_t *row = json_object();
        json_object_set_new(row, "test", json_string(r->test));
        json_object_set_new(row, "kind", json_string(r->is_decode ? "decode" : "prefill"));
        json_object_set_new(row, r->is_decode ? "depth" : "prompt_length", json_integer(r->length));
        json_object_set_new(row, "n_tokens", json_integer(r->n_tokens));
        json_object_set_new(row, "tok_s", json_real(r->mean));
        json_object_set_new(row, "stddev", json_real(r->stddev));
        json_object_set_new(row, r->is_decode ? "bytes_per_token" : "flops_per_token", json_real(r->cost));
        if (r->floor > 0) {
            json_object_set_new(row, "floor_tok_s", json_real(r->floor));
            json_object_set_new(row, "fraction_of_floor", json_real(r->mean / r->floor));
        }
        json_array_append_new(arr, row);
    }
    json_object_set_new(root, "rows", arr);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (text)
        printf("%s\n", text);
    free(text);
    json_decref(root);
}

/* s as a gnuplot single-quoted string: a quote doubled (gnuplot's only escape there), a line break as a
 * space (it would end the command). */
static void gp_string(FILE *g, const char *s)
{
    fputc('\'', g);
    for (; *s; s++) {
        if (*s == '\'')
            fputs("''", g);
        else
            fputc(*s == '\n' || *s == '\r' ? ' ' : *s, g);
    }
    fputc('\'', g);
}

/* Whether the --plot path names a PNG or an SVG file (what plot() writes), by its extension. */
static bool plot_path_svg(const char *path, bool *svg)
{
    size_t n = strlen(path);
    *svg = n >= 4 && !strcasecmp(path + n - 4, ".svg");
    return *svg || (n >= 4 && !strcasecmp(path + n - 4, ".png"));
}

/* gnuplot: a panel for prefill and one for decode (only those with rows), tok/s against length on a log2
 * axis, with the hardware ceiling (the tok/s the measured matmul rate or bandwidth allows: the "floor tok/s"
 * column) dashed. A panel of one length gets an explicit x range (an octave either side) and its ceiling as a
 * level line, so gnuplot neither warns of an empty x range nor leaves the ceiling undrawn. */
static int plot(const char *path, const bench_header *h, const bench_options *o, const bench_row *rows, int n_rows)
{
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        fprintf(stderr, "lily bench: --plot needs gnuplot, which is not on PATH (Debian: apt-get install gnuplot-nox)\n");
        return 1;
    }
    int n_block[2] = {0, 0};
    for (int i = 0; i < n_rows; i++)
        n_block[rows[i].is_decode != 0]++;
    if (!n_block[0] && !n_block[1]) {
        fprintf(stderr, "lily bench: no rows measured; %s not written\n", path);
        return 1;
    }
    bool svg;
    plot_path_svg(path, &svg);
    const char *term = svg ? "svg" : system("gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1") == 0 ? "pngcairo" : "png";
    char data_path[] = "/tmp/lily-bench-XXXXXX";
    int fd = mkstemp(data_path);
    if (fd < 0) {
        fprintf(stderr, "lily bench: cannot create a temporary file for gnuplot: %s\n", strerror(errno));
        return 1;
    }
    FILE *d = fdopen(fd, "w");
    for (int block = 0; block < 2; block++) { /* gnuplot's data sets: only those with rows, so none is empty */
        if (!n_block[block])
            continue;
        fprintf(d, "# %s\n", block ? "decode" : "prefill");
        for (int i = 0; i < n_rows; i++)
            if ((rows[i].is_decode != 0) == block)
                fprintf(d, "%d %.6g %.6g %.6g\n", rows[i].length > 0 ? rows[i].length : 1, rows[i].mean,
                        rows[i].stddev, rows[i].floor);
        fprintf(d, "\n\n");
    }
    fclose(d);

    char script_path[] = "/tmp/lily-bench-gp-XXXXXX";
    fd = mkstemp(script_path);
    if (fd < 0) {
        remove(data_path);
        fprintf(stderr, "lily bench: cannot create a temporary file for gnuplot: %s\n", strerror(errno));
        return 1;
    }
    FILE *g = fdopen(fd, "w");
    const int n_panels = (n_block[0] > 0) + (n_block[1] > 0);
    fprintf(g, "set terminal %s size %d,560\nset output ", term, n_panels == 2 ? 1400 : 760);
    gp_string(g, path);
    char title[sizeof h->model + sizeof h->machine + 64];
    snprintf(title, sizeof title, "lily bench: %s, %s, %s", h->model, o->backend, h->machine);
    fprintf(g, "\nset multiplot layout 1,%d title ", n_panels);
    gp_string(g, title);
    fprintf(g, " noenhanced\n");
    fprintf(g, "set logscale x 2\nset grid\nset key top right noenhanced\nset ylabel 'tok/s'\nset logscale y 10\n");
    for (int block = 0, index = 0; block < 2; block++) {
        if (!n_block[block])
            continue;
        if (block)
            fprintf(g, "set xlabel 'context depth (tokens; 0 drawn at 1)'\n"
                       "set title 'decode (%d tokens at context depth)'\n", o->n_decode);
        else
            fprintf(g, "set xlabel 'prompt length (tokens)'\nset title 'prefill (prompt length)'\n");
        /* one length only: gnuplot cannot autoscale an empty x range (it warns) nor draw a line through one
         * point, so the range is an octave either side and the ceiling a level line across it */
        int x_min = INT32_MAX, x_max = 0;
        double ceiling = 0;
        for (int i = 0; i < n_rows; i++)
            if ((rows[i].is_decode != 0) == block) {
                const int x = rows[i].length > 0 ? rows[i].length : 1;
                x_min = x < x_min ? x : x_min;
                x_max = x > x_max ? x : x_max;
                ceiling = rows[i].floor;
            }
        const bool one_x = x_min == x_max;
        if (one_x)
            fprintf(g, "set xrange [%g:%g]\n", x_min / 2.0, x_max * 2.0);
        else
            fprintf(g, "set autoscale x\n");
        fprintf(g, "plot ");
        gp_string(g, data_path);
        fprintf(g, " index %d using 1:2:3 with yerrorlines lw 2 title 'tok/s', ", index);
        if (one_x && ceiling > 0)
            fprintf(g, "%.6g", ceiling);
        else
            fprintf(g, "'' index %d using 1:4", index);
        fprintf(g, " with lines dt 2 title 'hardware ceiling (measured %s)'\n",
                block ? "memory bandwidth" : "matmul rate");
        index++;
    }
    fprintf(g, "unset multiplot\n");
    fclose(g);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "gnuplot '%s'", script_path);
    int rc = system(cmd);
    remove(data_path);
    remove(script_path);
    if (rc != 0) {
        fprintf(stderr, "lily bench: gnuplot failed (%s %d) writing %s\n",
                WIFEXITED(rc) ? "exit status" : "signal", WIFEXITED(rc) ? WEXITSTATUS(rc) : WTERMSIG(rc), path);
        return 1;
    }
    fprintf(stderr, "lily bench: wrote %s\n", path);
    return 0;
}

/* --plot's checks before the sweep, so that a plot that cannot be written fails at once rather than after
 * it: gnuplot on PATH, a .png or .svg name, and a file that can be created (tried, then removed when it
 * did not exist before). Returns 0, or 2 (usage) / 1 printed. */
static int plot_precheck(const char *path)
{
    bool svg;
    if (!plot_path_svg(path, &svg)) {
        fprintf(stderr, "lily bench: --plot writes PNG or SVG: give a FILE.png or FILE.svg, got \"%s\"\n", path);
        return 2;
    }
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        fprintf(stderr, "lily bench: --plot needs gnuplot, which is not on PATH (Debian: apt-get install gnuplot-nox)\n");
        return 1;
    }
    const bool existed = access(path, F_OK) == 0;
    FILE *f = fopen(path, "ab");
    if (!f) {
        fprintf(stderr, "lily bench: --plot %s: cannot write: %s\n", path, strerror(errno));
        return 1;
    }
    fclose(f);
    if (!existed)
        remove(path);
    return 0;
}

/* ---- main ----------------------------------------------------------------------------------------- */

static int parse_args(int argc, char **argv, bench_options *o)
{
    memset(o, 0, sizeof *o);
    o->backend = "cpu";
    o->output = "md";
    o->n_decode = 128;
    o->reps = 3;
    o->max_seconds = 60;
    o->seed = 1;
    o->n_samplings = 1; /* greedy */
    o->warmup = 1;
    o->default_prompt_lengths = o->default_depths = 1; /* filled by default_sweep once the model is known */
    const char *cpu_moe_option = NULL; /* --cpu-moe or --n-cpu-moe, whichever came */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int bad = 0;
        char want[96] = ""; /* what a bad value should have been, for the message */
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return -1;
        } else if (!strcmp(a, "--membw")) {
            o->membw_only = 1;
            continue;
        } else if (!strcmp(a, "--no-warmup")) {
            o->warmup = 0;
            continue;
        } else if (!strcmp(a, "--profile")) {
            o->profile = true;
            continue;
        } else if (!strcmp(a, "--cpu-moe")) {
            if (cli_note_cpu_moe_option("bench", a, &cpu_moe_option))
                return 2;
            o->n_cpu_moe = CLI_CPU_MOE_ALL;
            continue;
        }
        static const cli_value_option opts[] = {
            {"--model", "-m"}, {"--synthetic", NULL}, {"-p", NULL}, {"-d", NULL}, {"-n", NULL}, {"-r", NULL},
            {"--backend", NULL}, {"--precision", NULL}, {"-o", NULL}, {"--plot", NULL}, {"--threads", "-t"},
            {"--ctx-size", "-c"}, {"--prefill-chunk", NULL}, {"--device", NULL}, {"--seed", NULL},
            {"--max-seconds", NULL}, {"--gpu-memory", NULL}, {"--sampling", NULL}, {"--n-cpu-moe", NULL},
            {"--host-experts", NULL}};
        const char *val = NULL;
        int r = cli_match_option("bench", argc, argv, &i, opts, sizeof opts / sizeof opts[0], &a, &val);
        if (r < 0)
            return 2;
        if (r == 0) {
            cli_unknown_argument("bench", a);
            usage(stderr);
            return 2;
        } else if (!strcmp(a, "--model")) {
            o->model_dir = val;
        } else if (!strcmp(a, "--synthetic")) {
            o->synthetic = val;
        } else if (!strcmp(a, "-p")) {
            bad = parse_list(val, o->prompt_lengths, &o->n_prompt_lengths, 1);
            snprintf(want, sizeof want, "up to %d comma-separated lengths in [1, %d] (4k = 4096), or none",
                     MAX_POINTS, 1 << 24);
            o->default_prompt_lengths = 0;
        } else if (!strcmp(a, "-d")) {
            bad = parse_list(val, o->depths, &o->n_depths, 0);
            snprintf(want, sizeof want, "up to %d comma-separated depths in [0, %d] (4k = 4096), or none",
                     MAX_POINTS, 1 << 24);
            o->default_depths = 0;
        } else if (!strcmp(a, "-n")) {
            bad = parse_int(val, 0, 1 << 20, &o->n_decode);
            snprintf(want, sizeof want, "an integer in [0, %d]", 1 << 20);
        } else if (!strcmp(a, "-r")) {
            bad = parse_int(val, 1, 1000, &o->reps);
            snprintf(want, sizeof want, "an integer in [1, 1000]");
        } else if (!strcmp(a, "--max-seconds")) {
            int secs;
            bad = parse_int(val, 1, 1 << 30, &secs);
            snprintf(want, sizeof want, "a whole number of seconds in [1, %d]", 1 << 30);
            o->max_seconds = secs;
        } else if (!strcmp(a, "--backend")) {
            if (cli_check_backend("bench", val))
                return 2;
            o->backend = val;
        } else if (!strcmp(a, "--precision")) {
            if (cli_parse_precision("bench", val, &o->exact))
                return 2;
        } else if (!strcmp(a, "-o")) {
            o->output = val;
            bad = strcmp(val, "md") && strcmp(val, "json") && strcmp(val, "csv");
            snprintf(want, sizeof want, "md, json or csv");
        } else if (!strcmp(a, "--plot")) {
            o->plot = val;
        } else if (!strcmp(a, "--threads")) {
            if (cli_parse_threads("bench", a, val, &o->n_threads))
                return 2;
        } else if (!strcmp(a, "--ctx-size")) {
            bad = parse_int(val, 1, 1 << 24, &o->ctx_size);
            snprintf(want, sizeof want, "an integer in [1, %d]", 1 << 24);
        } else if (!strcmp(a, "--prefill-chunk")) {
            bad = parse_int(val, 1, 1 << 20, &o->prefill_chunk);
            snprintf(want, sizeof want, "an integer in [1, %d]", 1 << 20);
        } else if (!strcmp(a, "--gpu-memory")) {
            if (cli_parse_gib("bench", a, val, &o->gpu_memory_bytes))
                return 2;
        } else if (!strcmp(a, "--n-cpu-moe")) {
            if (cli_note_cpu_moe_option("bench", a, &cpu_moe_option) ||
                cli_parse_n_cpu_moe("bench", a, val, &o->n_cpu_moe))
                return 2;
        } else if (!strcmp(a, "--host-experts")) {
            if (cli_parse_host_experts("bench", a, val, &o->host_experts))
                return 2;
        } else if (!strcmp(a, "--device")) {
            bad = parse_int(val, 0, 64, &o->device);
            snprintf(want, sizeof want, "a GPU ordinal in [0, 64]");
        } else if (!strcmp(a, "--sampling")) {
            snprintf(o->sampling_list, sizeof o->sampling_list, "%s", val);
            o->n_samplings = 0;
            char *save = NULL;
            for (char *t = strtok_r(o->sampling_list, ",", &save); t && !bad; t = strtok_r(NULL, ",", &save)) {
                lily_device_sampling ds;
                bad = o->n_samplings == 8 || !bench_sampling(t, &ds);
                if (!bad)
                    o->samplings[o->n_samplings++] = strcmp(t, "greedy") ? t : NULL;
            }
            bad |= o->n_samplings == 0;
            snprintf(want, sizeof want, "at most 8 of greedy, qwen, openai, logprobs, bias (comma-separated)");
        } else { /* --seed */
            int s;
            bad = parse_int(val, 0, 0x7fffffff, &s);
            snprintf(want, sizeof want, "an integer in [0, %d]", 0x7fffffff);
            o->seed = (uint64_t)s;
        }
        if (bad) {
            fprintf(stderr, "lily bench: %s expects %s, got \"%s\"\n", a, want, val);
            return 2;
        }
    }
    if (!o->membw_only && !o->default_prompt_lengths && o->n_prompt_lengths == 0 &&
        (o->n_decode == 0 || (!o->default_depths && o->n_depths == 0))) {
        fprintf(stderr, "lily bench: nothing to measure: -p none leaves no prefill rows and %s no decode rows\n",
                o->n_decode == 0 ? "-n 0" : "-d none");
        return 2;
    }
    if (!o->membw_only && !o->model_dir && !o->synthetic) {
        bool is_test_model;
        o->model_dir = cli_default_model("bench", &is_test_model);
    }
    if (!o->membw_only && o->model_dir && o->synthetic) {
        fprintf(stderr, "lily bench: give either -m DIR or --synthetic NAME|CONFIG, not both\n\n");
        usage(stderr);
        return 2;
    }
    if (strcmp(o->backend, "cuda") && (o->n_samplings > 1 || o->samplings[0])) {
        /* only the device decode loop samples; elsewhere every row would time the same forward passes */
        fprintf(stderr, "lily bench: --sampling applies to --backend cuda only (the device decode loop's sampler); "
                        "the %s backend times decode without sampling, one row per depth\n", o->backend);
        o->n_samplings = 1;
        o->samplings[0] = NULL;
    }
    if (strcmp(o->backend, "cuda") && o->device != 0)
        fprintf(stderr, "lily bench: --device applies to --backend cuda only; the %s backend ignores it\n",
                o->backend);
    return 0;
}

/* The default sweep for lists not given: prompt lengths 256, 512, ..., 131072 up to max_pos, and decode
 * depths 256, ..., 131072 while depth + n_decode <= max_pos (at least one point each: max_pos itself, or
 * max_pos - n_decode). Then a warning on stderr for each length past max_pos. */
static void default_sweep(bench_options *o, int max_pos)
{
    if (o->default_prompt_lengths) {
        o->n_prompt_lengths = 0;
        for (int v = 256; v <= 131072 && v <= max_pos; v *= 2)
            o->prompt_lengths[o->n_prompt_lengths++] = v;
        if (o->n_prompt_lengths == 0)
            o->prompt_lengths[o->n_prompt_lengths++] = max_pos > 0 ? max_pos : 1;
    }
    if (o->default_depths) {
        o->n_depths = 0;
        for (int v = 256; v <= 131072 && (long)v + o->n_decode <= max_pos; v *= 2)
            o->depths[o->n_depths++] = v;
        if (o->n_depths == 0)
            o->depths[o->n_depths++] = max_pos > o->n_decode ? max_pos - o->n_decode : 0;
    }
    for (int i = 0; i < o->n_prompt_lengths; i++)
        if (o->prompt_lengths[i] > max_pos)
            fprintf(stderr, "lily bench: warning: prompt length %d is beyond the model's max_position_embeddings %d "
                            "(speed is still measured; quality past that length is untested)\n",
                    o->prompt_lengths[i], max_pos);
    for (int i = 0; o->n_decode > 0 && i < o->n_depths; i++)
        if ((long)o->depths[i] + o->n_decode > max_pos)
            fprintf(stderr, "lily bench: warning: depth %d + %d decode tokens is beyond the model's "
                            "max_position_embeddings %d (speed is still measured; quality past that length is "
                            "untested)\n",
                    o->depths[i], o->n_decode, max_pos);
}

static int run_membw(const bench_options *o)
{
    lily_hw_limits hw;
    lily_error err = {0};
    fprintf(stderr, "lily bench: measuring the %s device...\n", o->backend);
    if (lily_measure_limits(o->backend, o->device, o->n_threads, &hw, &err) != LILY_OK) {
        fprintf(stderr, "lily bench: %s\n", err.message);
        return 1;
    }
    printf("device: %s\n", hw.device);
    if (hw.read_bytes_per_s > 0)
        printf("read bandwidth:   %8.2f GB/s\n", hw.read_bytes_per_s / 1e9);
    if (hw.copy_bytes_per_s > 0)
        printf("copy bandwidth:   %8.2f GB/s (bytes read + written)\n", hw.copy_bytes_per_s / 1e9);
    printf("used for decode:  %8.2f GB/s\n", hw.bandwidth / 1e9);
    printf("matmul rate:      %8.2f GFLOP/s (%s)\n", hw.matmul_flops_per_s / 1e9, hw.matmul_kind);
    return 0;
}

/* One finished row, printed at once (md, csv; json is printed whole at the end). */
static void emit_row(const bench_header *h, const bench_options *o, const bench_row *r)
{
    if (isatty(STDERR_FILENO))
        fputs("\r\033[K", stderr); /* the progress line */
    if (!strcmp(o->output, "md"))
        print_md_row(r);
    else if (!strcmp(o->output, "csv"))
        print_csv_row(h, o, r);
    else
        progress("bench: %s  %.2f ± %.2f tok/s", r->test, r->mean, r->stddev);
    fflush(stdout);
}

/* Whether a default sweep stops after the row of length `done` (it took `seconds`) instead of measuring
 * `next`: its time is estimated as seconds * next / done (cost grows at least linearly with length). */
static bool sweep_stops(const char *what, int done, int next, double seconds, double max_seconds)
{
    double estimate = seconds * (double)next / done;
    if (estimate <= max_seconds)
        return false;
    fprintf(stderr, "lily bench: the default %s sweep stops at %d: %d would take about %.0f s (over --max-seconds "
                    "%.0f; list the lengths with -p / -d to measure them anyway)\n", what, done, next, estimate,
            max_seconds);
    return true;
}

int cmd_bench(int argc, char **argv)
{
    bench_options o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    if (o.membw_only)
        return run_membw(&o);
    if (o.plot && (rc = plot_precheck(o.plot)) != 0)
        return rc;

    lily_error err = {0};
    fprintf(stderr, "lily bench: loading %s%s...\n", o.synthetic ? "synthetic " : "",
            o.synthetic ? o.synthetic : o.model_dir);
    bench_model m;
    if (model_open(&o, &m, &err) != LILY_OK) {
        fprintf(stderr, "lily bench: %s\n", err.message);
        return 1;
    }
    default_sweep(&o, m.engine->cfg.max_position_embeddings);
    int max_len = 1;
    for (int i = 0; i < o.n_prompt_lengths; i++)
        max_len = o.prompt_lengths[i] > max_len ? o.prompt_lengths[i] : max_len;
    if (o.n_decode > 0)
        for (int i = 0; i < o.n_depths; i++)
            max_len = o.depths[i] + o.n_decode > max_len ? o.depths[i] + o.n_decode : max_len;
    int ctx = o.ctx_size > 0 ? o.ctx_size : max_len;
    if (ctx < max_len) {
        fprintf(stderr, "lily bench: --ctx-size %d is smaller than the sweep needs (%d)\n", ctx, max_len);
        model_close(&m);
        return 2;
    }
    lily_hw_limits hw;
    int have_hw = 0;
    fprintf(stderr, "lily bench: measuring the %s device's bandwidth and matmul rate...\n", o.backend);
    if (lily_measure_limits(o.backend, o.device, o.n_threads, &hw, &err) == LILY_OK)
        have_hw = 1;
    else
        fprintf(stderr, "lily bench: no hardware limits: %s\n", err.message);

    const lily_config *c = &m.engine->cfg;
    const lily_weights *w = &m.engine->weights;
    int bits = w->n_layers > 0 ? w->layers[0].experts_gate.bits : w->embed.bits;
    int router_bits = w->n_layers > 0 ? w->layers[0].router.bits : bits;
    int group = w->n_layers > 0 && w->layers[0].experts_gate.group_size ? w->layers[0].experts_gate.group_size : 64;
    lily_cost_model cm;
    lily_cost_model_init(c, bits, router_bits, group, &cm);

    bench_header h;
    build_header(&o, &m, &hw, have_hw, &h);

    lily_session *s = NULL, *work = NULL;
    int32_t *tokens = malloc((size_t)(max_len > 1024 ? max_len : 1024) * sizeof *tokens);
    bench_row *rows = calloc((size_t)(o.n_prompt_lengths + o.n_depths * o.n_samplings), sizeof *rows);
    double *tps = calloc((size_t)o.reps, sizeof *tps);
    int n_rows = 0;
    rc = 1;
    if (!tokens || !rows || !tps) {
        fprintf(stderr, "lily bench: out of memory\n");
        goto done;
    }
    if (lily_session_new(m.engine, ctx, &s, &err) != LILY_OK ||
        (o.n_decode > 0 && o.n_depths > 0 && lily_session_new(m.engine, ctx, &work, &err) != LILY_OK)) {
        fprintf(stderr, "lily bench: session of %d tokens: %s\n", ctx, err.message);
        goto done;
    }
    uint64_t rng = o.seed * 0x9e3779b97f4a7c15ull + 1;
    if (o.warmup) {
        int n = ctx < 1024 ? ctx / 2 : 512;
        n = n > 0 ? n : 1;
        progress("bench: warm-up");
        random_tokens(&rng, c->vocab_size, tokens, n + 8);
        lily_session_reset(s);
        if (lily_session_append(s, tokens, n, NULL, &err) != LILY_OK)
            goto fail;
        for (int i = 0; i < 8 && n + i < ctx; i++)
            if (lily_session_append(s, tokens + n + i, 1, NULL, &err) != LILY_OK)
                goto fail;
    }
    bool md = !strcmp(o.output, "md"), csv = !strcmp(o.output, "csv");
    if (md)
        print_md_head(&h, &o);
    else if (csv)
        print_csv_head();
    fflush(stdout);
    struct sigaction sa = {0}, old_sa;
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_sa);
    lily_status st = LILY_OK;
    for (int i = 0; st == LILY_OK && i < o.n_prompt_lengths; i++) {
        int p = o.prompt_lengths[i];
        double t0 = lily_wall_seconds();
        if ((st = bench_prefill(s, p, o.reps, &rng, tokens, tps, &err)) != LILY_OK)
            break;
        bench_row *r = &rows[n_rows++];
        snprintf(r->test, sizeof r->test, "pp%d", p);
        r->length = p;
        r->n_tokens = p;
        stats(tps, o.reps, &r->mean, &r->stddev);
        r->cost = lily_cost_prefill_flops_per_token(&cm, p);
        r->floor = have_hw && hw.matmul_flops_per_s > 0 ? hw.matmul_flops_per_s / r->cost : 0;
        emit_row(&h, &o, r);
        if (o.profile)
            profile_print(m.engine, r->test, p, tps, o.reps);
        if (o.default_prompt_lengths && i + 1 < o.n_prompt_lengths &&
            sweep_stops("pp", p, o.prompt_lengths[i + 1], lily_wall_seconds() - t0, o.max_seconds))
            break;
    }
    for (int i = 0; st == LILY_OK && o.n_decode > 0 && i < o.n_depths; i++) {
        int d = o.depths[i];
        double t0 = lily_wall_seconds();
        for (int k = 0; st == LILY_OK && k < o.n_samplings; k++) {
            const char *sampling = o.samplings[k];
            if ((st = bench_decode(s, work, d, o.n_decode, o.reps, &rng, tokens, tps, sampling, &err)) != LILY_OK)
                break;
            bench_row *r = &rows[n_rows++];
            snprintf(r->test, sizeof r->test, "tg%d @ d%d%s%s", o.n_decode, d, sampling ? " " : "",
                     sampling ? sampling : "");
            r->is_decode = 1;
            r->length = d;
            r->n_tokens = o.n_decode;
            stats(tps, o.reps, &r->mean, &r->stddev);
            r->cost = lily_cost_decode_bytes(&cm, d + o.n_decode / 2);
            r->floor = have_hw && hw.bandwidth > 0 ? hw.bandwidth / r->cost : 0;
            emit_row(&h, &o, r);
            if (o.profile)
                profile_print(m.engine, r->test, o.n_decode, tps, o.reps);
        }
        if (st == LILY_OK && o.default_depths && i + 1 < o.n_depths &&
            sweep_stops("tg @ d", d > 0 ? d : 1, o.depths[i + 1], (lily_wall_seconds() - t0) / o.n_samplings,
                        o.max_seconds))
            break;
    }
    sigaction(SIGINT, &old_sa, NULL);
    if (isatty(STDERR_FILENO))
        fputs("\r\033[K", stderr);
    bool interrupted = st == LILY_ERR_CANCELLED && atomic_load(&bench_interrupted);
    if (st != LILY_OK && !interrupted)
        goto fail;
    if (interrupted)
        fprintf(stderr, "lily bench: interrupted (Ctrl-C); the %d row%s measured so far:\n", n_rows,
                n_rows == 1 ? "" : "s");
    if (!strcmp(o.backend, "cuda")) { /* everything is allocated up front, so this is the peak */
        size_t used = 0, total = 0;
        lily_error merr = {0};
        if (lily_cuda_device_memory(o.device, &used, &total, &merr) == LILY_OK)
            snprintf(h.memory, sizeof h.memory, "%.2f of %.2f GiB in use after the sweep (weights, KV cache and state for "
                     "the longest context, scratch for one prefill chunk)", used / 1073741824.0, total / 1073741824.0);
    }

    if (!strcmp(o.output, "json"))
        print_json(&h, &o, &hw, have_hw, rows, n_rows);
    else if (md)
        print_md_tail(&h, c->n_experts_used);
    fflush(stdout);
    rc = o.plot ? plot(o.plot, &h, &o, rows, n_rows) : 0;
    if (interrupted)
        rc = 128 + SIGINT;
    goto done;
fail:
    fprintf(stderr, "\nlily bench: %s\n", err.message);
    rc = 1;
done:
    lily_session_free(work);
    lily_session_free(s);
    free(tokens);
    free(rows);
    free(tps);
    model_close(&m);
    return rc;
}
