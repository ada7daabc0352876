/* bench_cuda_accuracy.c — how far the CUDA backend is from the CPU backend (the exact fp32 reference
 * mode) on the full-size synthetic model (random MLX 4-bit weights, src/model/synthetic.h), for one
 * n-token prompt of random ids:
 *   - logits: mean KL(cpu‖cuda), top-1 agreement, max |Δlogit|, overall and by position bucket (the
 *     issue's check: mean KL <= 1e-2 for n = 512);
 *   - --layers: through the backends' debug hook, the relative error ‖cuda − cpu‖ / ‖cpu‖ of every
 *     layer's mixer output (attention or Gated DeltaNet), MoE output and residual stream, and how many
 *     tokens' MoE output is off by more than 10% (a changed top-k set looks like that): where the
 *     error enters and how it grows with depth;
 *   - --decode: the same tokens one per forward() call, i.e. through the decode kernels;
 *   - --cpu-chunked: the CPU backend with the chunked delta rule against the recurrent one (fp32, another
 *     summation order): how strongly this random model amplifies rounding by itself;
 *   - --cpu-f16: the CPU backend with every matmul input rounded to fp16 (what the CUDA GEMV/GEMM kernels
 *     feed the tensor cores; lily_backend_options.cpu_matmul_inputs_f16) against the exact one: the
 *     part of the CUDA-vs-CPU difference that operand precision alone explains;
 *   - --exact: the CUDA backend in its exact mode (lily_backend_options.exact: fp32 KV cache, fp32 kernels
 *     only): what is left is summation order and the fast-math exp / rsqrt
 *     (~2e-7 relative; expected mean KL ~1e-6, the CPU's own reordering band, unless a rare route flips);
 *   - --cpu-f16-chunked (CPU only, no GPU needed): the CPU backend with fp16 matmul inputs twice, recurrent
 *     and chunked delta rule, against each other and the reference: what fp32 reordering alone does once
 *     every matmul input is rounded to fp16 as the CUDA kernels round them (a reordered sum moves a value
 *     across an fp16 rounding boundary now and then, and a near-tied top-8 route flips): the distance two
 *     correct fp16-operand implementations of this random model keep from each other;
 *   - --router-unfused (with --n-cpu-moe): also the all-device decode with every layer's router as its own
 *     GEMV (lily_backend_options.moe_router_unfused), as the host-experts split's layers run it: against
 *     the default all-device decode (what the router's summation order alone does) and against the split
 *     (what the CPU's experts add to that);
 *   - --router-ab (CUDA only, no CPU reference): the decode (n one-token calls) with each layer's router
 *     summed in the residual projection before its MoE block (the default) against the router inside MoE
 *     gate/up (lily_backend_options.moe_router_gate_up): what the router's summation order alone does;
 *   - --n-cpu-moe L [--host-experts N]: the CUDA backend's decode (n one-token calls) with the routed
 *     experts of layers [0, L) in host memory, N of each token's top-k computed by the host's cores
 *     (lily_backend_options.host_experts: -1 zero-copy, 0 auto, 1048576 all), and the same decode with
 *     every expert on the device, each against the CPU and against each other (issue 23's KL check).
 *
 * usage: bench_cuda_accuracy [--preset 35b] [-n 512] [--layers] [--decode] [--cpu-chunked] [--cpu-f16] [--exact]
 *                            [--cpu-f16-chunked] [--seed N] [--n-cpu-moe L [--host-experts N] [--router-unfused]]
 *                            [--router-ab] (--seed: the prompt's random token ids, default 42)
 * The CPU forward runs on all cores of the machine (the GPU machine's CPUs).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "model/synthetic.h"

#define MAX_LAYERS 64
enum { PROBE_MIXER, PROBE_MOE, PROBE_RESIDUAL, PROBE_N };
static const char *probe_names[PROBE_N] = {"mixer", "moe", "residual"};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        return 1;                                                                                  \
    } while (0)

/* The same token stream as bench_cuda_decode (LCG seeded 42). */
static unsigned long long g_rng = 42;
static int rnd_token(int vocab)
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (int)((g_rng >> 33) % (unsigned long long)vocab);
}

/* Debug-hook state: the reference pass stores every layer's probes, a compared pass accumulates errors. */
typedef struct {
    int record, n, hidden, row0, oom;
    float *ref[MAX_LAYERS][PROBE_N]; /* [n][hidden] */
    double d2[MAX_LAYERS][PROBE_N], r2[MAX_LAYERS][PROBE_N], tok_max[MAX_LAYERS][PROBE_N];
    int tok_off[MAX_LAYERS][PROBE_N]; /* tokens with relative error > 0.1 */
    int first_off[MAX_LAYERS][PROBE_N]; /* the first such token's position, -1 none */
} layer_probe;

static int probe_index(const char *stage)
{
    if (!strcmp(stage, LILY_STAGE_ATTENTION_OUT) || !strcmp(stage, LILY_STAGE_DELTANET_OUT))
        return PROBE_MIXER;
    if (!strcmp(stage, LILY_STAGE_MOE_OUT))
        return PROBE_MOE;
    if (!strcmp(stage, LILY_STAGE_RESIDUAL))
        return PROBE_RESIDUAL;
    return -1;
}

static void probe_hook(void *user, int layer, const char *stage, const float *data, int n_tokens, int width)
{
    layer_probe *p = user;
    const int k = probe_index(stage);
    if (k < 0 || layer < 0 || layer >= MAX_LAYERS || width != p->hidden || p->row0 + n_tokens > p->n)
        return;
    if (p->record) {
        if (!p->ref[layer][k] && !(p->ref[layer][k] = malloc(sizeof(float) * (size_t)p->n * width))) {
            p->oom = 1;
            return;
        }
        memcpy(p->ref[layer][k] + (size_t)p->row0 * width, data, sizeof(float) * (size_t)n_tokens * width);
        return;
    }
    if (!p->ref[layer][k])
        return;
    for (int t = 0; t < n_tokens; t++) {
        const float *r = p->ref[layer][k] + (size_t)(p->row0 + t) * width, *g = data + (size_t)t * width;
        double d2 = 0, r2 = 0;
        for (int i = 0; i < width; i++) {
            const double d = (double)g[i] - r[i];
            d2 += d * d;
            r2 += (double)r[i] * r[i];
        }
        p->d2[layer][k] += d2;
        p->r2[layer][k] += r2;
        const double rel = sqrt(d2 / (r2 > 0 ? r2 : 1e-30));
        if (!(rel <= p->tok_max[layer][k]))
            p->tok_max[layer][k] = rel;
        if (!(rel <= 0.1) && (p->first_off[layer][k] < 0 || p->row0 + t < p->first_off[layer][k]))
            p->first_off[layer][k] = p->row0 + t;
        p->tok_off[layer][k] += !(rel <= 0.1);
    }
}

static void probe_clear(layer_probe *p)
{
    memset(p->d2, 0, sizeof p->d2);
    memset(p->r2, 0, sizeof p->r2);
    memset(p->tok_max, 0, sizeof p->tok_max);
    memset(p->tok_off, 0, sizeof p->tok_off);
    memset(p->first_off, 0xff, sizeof p->first_off); /* -1 */
}

static void probe_print(const layer_probe *p, const lily_config *cfg)
{
    printf("\n| layer | mixer | rel err mixer | rel err moe | rel err residual | max token rel err moe | tokens with moe off > 10%% | first such position |\n"
           "|---:|---|---:|---:|---:|---:|---:|---:|\n");
    for (int l = 0; l < cfg->n_layers && l < MAX_LAYERS; l++) {
        double rel[PROBE_N];
        for (int k = 0; k < PROBE_N; k++)
            rel[k] = sqrt(p->d2[l][k] / (p->r2[l][k] > 0 ? p->r2[l][k] : 1e-30));
        printf("| %d | %s | %.2e | %.2e | %.2e | %.2e | %d | %d |\n", l,
               cfg->layer_types[l] == LILY_LAYER_FULL_ATTENTION ? "attention" : "deltanet", rel[PROBE_MIXER],
               rel[PROBE_MOE], rel[PROBE_RESIDUAL], p->tok_max[l][PROBE_MOE], p->tok_off[l][PROBE_MOE],
               p->first_off[l][PROBE_MOE]);
    }
    (void)probe_names;
}

/* KL(ref‖got) of one row (natural log), its argmaxes and max |Δ|. */
static double row_kl(const float *a, const float *b, int vocab, int *ia_out, int *ib_out, double *maxd)
{
    int ia = 0, ib = 0;
    for (int v = 0; v < vocab; v++) {
        if (a[v] > a[ia]) ia = v;
        if (b[v] > b[ib]) ib = v;
        const double d = fabs((double)a[v] - b[v]);
        if (!(d <= *maxd)) *maxd = d;
    }
    double za = 0, zb = 0;
    for (int v = 0; v < vocab; v++) {
        za += exp(a[v] - a[ia]);
        zb += exp(b[v] - b[ib]);
    }
    double kl = 0;
    for (int v = 0; v < vocab; v++) {
        const double la = a[v] - a[ia] - log(za), lb = b[v] - b[ib] - log(zb);
        kl += exp(la) * (la - lb);
    }
    *ia_out = ia, *ib_out = ib;
    return kl;
}

/* The summary row and the by-position buckets. */
static void compare_logits(const char *label, const float *ref, const float *got, int rows, int vocab)
{
    static const int edges[] = {0, 16, 64, 128, 256, 512, 1 << 30};
    double kl_sum = 0, maxd = 0, b_kl[8] = {0};
    int top1 = 0, b_n[8] = {0}, b_top1[8] = {0};
    for (int r = 0; r < rows; r++) {
        int ia, ib;
        const double kl = row_kl(ref + (size_t)r * vocab, got + (size_t)r * vocab, vocab, &ia, &ib, &maxd);
        int b = 0;
        while (r >= edges[b + 1]) b++;
        kl_sum += kl, top1 += ia == ib;
        b_kl[b] += kl, b_n[b]++, b_top1[b] += ia == ib;
    }
    printf("\n%s: rows %d, top-1 %.4f, mean KL %.3e, max |dlogit| %.3e -> %s (mean KL <= 1e-2)\n", label, rows,
           (double)top1 / rows, kl_sum / rows, maxd, kl_sum / rows <= 1e-2 ? "pass" : "FAIL");
    printf("  by position:");
    for (int b = 0; b < 6; b++)
        if (b_n[b])
            printf(" [%d,%d) KL %.2e top-1 %.2f;", edges[b], edges[b] + b_n[b], b_kl[b] / b_n[b],
                   (double)b_top1[b] / b_n[b]);
    printf("\n");
}

/* One forward() call of the CPU backend over the n tokens with options o; logits [n, V] into out. */
static int cpu_forward_run(const lily_synthetic *syn, const lily_backend_options *o, const int32_t *toks, int n,
                           float *out)
{
    lily_error err = {0};
    lily_backend cpu;
    void *st = NULL;
    if (lily_backend_create("cpu", &syn->cfg, &syn->weights, o, &cpu, &err) != LILY_OK ||
        cpu.ops->state_new(cpu.ctx, n + 8, &st, &err) != LILY_OK ||
        cpu.ops->forward(cpu.ctx, st, toks, n, LILY_LOGITS_ALL, out, &err) != LILY_OK)
        DIE("cpu: %s", err.message);
    cpu.ops->state_free(cpu.ctx, st);
    lily_backend_destroy(&cpu);
    return 0;
}

/* n one-token forward() calls of the CUDA backend with options o; logits [n, V] into out. */
static int cuda_decode_run(const lily_synthetic *syn, const lily_backend_options *o, const int32_t *toks, int n,
                           float *out)
{
    lily_error err = {0};
    lily_backend be;
    void *st = NULL;
    const int V = syn->cfg.vocab_size;
    if (lily_backend_create("cuda", &syn->cfg, &syn->weights, o, &be, &err) != LILY_OK ||
        be.ops->state_new(be.ctx, n + 8, &st, &err) != LILY_OK)
        DIE("cuda: %s", err.message);
    const double t0 = now_s();
    for (int i = 0; i < n; i++)
        if (be.ops->forward(be.ctx, st, toks + i, 1, LILY_LOGITS_LAST, out + (size_t)i * V, &err) != LILY_OK)
            DIE("cuda decode: %s", err.message);
    printf("cuda decode of %d tokens (n_cpu_moe %d, host_experts %d): %.2f s\n", n, o->n_cpu_moe, o->host_experts,
           now_s() - t0);
    be.ops->state_free(be.ctx, st);
    lily_backend_destroy(&be);
    return 0;
}

int main(int argc, char **argv)
{
    const char *preset = "35b";
    int n = 512, layers = 0, decode = 0, cpu_chunked = 0, cpu_f16 = 0, exact = 0, n_cpu_moe = 0, host_experts = 0,
        cpu_f16_chunked = 0, router_unfused = 0, router_ab = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--preset") && i + 1 < argc) preset = argv[++i];
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers")) layers = 1;
        else if (!strcmp(argv[i], "--decode")) decode = 1;
        else if (!strcmp(argv[i], "--cpu-chunked")) cpu_chunked = 1;
        else if (!strcmp(argv[i], "--cpu-f16")) cpu_f16 = 1;
        else if (!strcmp(argv[i], "--exact")) exact = 1;
        else if (!strcmp(argv[i], "--cpu-f16-chunked")) cpu_f16_chunked = 1;
        else if (!strcmp(argv[i], "--router-unfused")) router_unfused = 1;
        else if (!strcmp(argv[i], "--router-ab")) router_ab = 1;
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) g_rng = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--n-cpu-moe") && i + 1 < argc) n_cpu_moe = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--host-experts") && i + 1 < argc) host_experts = atoi(argv[++i]);
        else DIE("usage: %s [--preset 35b] [-n 512] [--layers] [--decode] [--cpu-chunked] [--cpu-f16] [--exact] "
                 "[--cpu-f16-chunked] [--seed N] [--n-cpu-moe L [--host-experts N] [--router-unfused]] [--router-ab]", argv[0]);
    }
    if (n < 1 || n > 8192)
        DIE("-n must be in [1, 8192]");

    lily_error err = {0};
    lily_synthetic *syn = NULL;
    if (lily_synthetic_new(preset, 1, 0, &syn, &err) != LILY_OK)
        DIE("synthetic: %s", err.message);
    const lily_config *cfg = &syn->cfg;
    const int V = cfg->vocab_size;
    if (cfg->n_layers > MAX_LAYERS)
        DIE("more than %d layers", MAX_LAYERS);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n);
    float *lr = malloc(sizeof(float) * (size_t)n * V), *lc = malloc(sizeof(float) * (size_t)n * V);
    layer_probe *probe = calloc(1, sizeof *probe);
    if (!toks || !lr || !lc || !probe)
        DIE("out of memory");
    for (int i = 0; i < n; i++)
        toks[i] = rnd_token(V);
    probe->n = n, probe->hidden = cfg->hidden;

    if (router_ab) { /* two CUDA decodes, the router's place the only difference */
        lily_backend_options o;
        memset(&o, 0, sizeof o);
        o.max_chunk = n;
        if (cuda_decode_run(syn, &o, toks, n, lr))
            return 1;
        o.moe_router_gate_up = true;
        if (cuda_decode_run(syn, &o, toks, n, lc))
            return 1;
        compare_logits("CUDA decode, router summed in the residual projection, vs the router inside MoE gate/up", lc, lr,
                       n, V);
        free(probe), free(lc), free(lr), free(toks);
        lily_synthetic_free(syn);
        return 0;
    }

    /* reference: the CPU backend, recurrent delta rule, one forward() call */
    lily_backend_options co;
    memset(&co, 0, sizeof co);
    co.max_chunk = n;
    co.exact = true; /* the reference: the CPU backend's exact fp32 mode */
    if (layers) {
        co.debug_hook = probe_hook;
        co.debug_user = probe;
        probe->record = 1;
    }
    lily_backend cpu;
    void *cst = NULL;
    double t0 = now_s();
    if (lily_backend_create("cpu", cfg, &syn->weights, &co, &cpu, &err) != LILY_OK ||
        cpu.ops->state_new(cpu.ctx, n + 8, &cst, &err) != LILY_OK ||
        cpu.ops->forward(cpu.ctx, cst, toks, n, LILY_LOGITS_ALL, lr, &err) != LILY_OK)
        DIE("cpu: %s", err.message);
    if (probe->oom)
        DIE("out of memory (layer probes)");
    printf("cpu forward of %d tokens: %.1f s\n", n, now_s() - t0);
    cpu.ops->state_free(cpu.ctx, cst);
    lily_backend_destroy(&cpu);
    probe->record = 0;

    if (cpu_f16_chunked) { /* fp16 operands, two summation orders of the delta rule: each vs exact, then each other */
        float *lf[2];
        for (int v = 0; v < 2; v++) {
            lf[v] = malloc(sizeof(float) * (size_t)n * V);
            if (!lf[v])
                DIE("out of memory");
            lily_backend_options vo = co;
            vo.debug_hook = NULL;
            vo.cpu_matmul_inputs_f16 = true;
            vo.deltanet_chunked = v == 1;
            t0 = now_s();
            if (cpu_forward_run(syn, &vo, toks, n, lf[v]))
                return 1;
            printf("cpu forward, fp16 matmul inputs, %s delta rule: %.1f s\n", v ? "chunked" : "recurrent", now_s() - t0);
        }
        compare_logits("CPU fp16 inputs, recurrent delta rule, vs CPU exact", lr, lf[0], n, V);
        compare_logits("CPU fp16 inputs, chunked delta rule, vs CPU exact", lr, lf[1], n, V);
        compare_logits("CPU fp16 inputs: chunked vs recurrent delta rule (fp32 reordering only)", lf[0], lf[1], n, V);
        free(lf[0]), free(lf[1]);
        if (n_cpu_moe <= 0) {
            free(probe), free(lc), free(lr), free(toks);
            lily_synthetic_free(syn);
            return 0;
        }
    }

    if (n_cpu_moe > 0) { /* the host-experts decode and the all-device decode, each against the CPU and each other */
        float *ld = malloc(sizeof(float) * (size_t)n * V);
        if (!ld)
            DIE("out of memory");
        lily_backend_options o;
        memset(&o, 0, sizeof o);
        o.max_chunk = n;
        if (cuda_decode_run(syn, &o, toks, n, ld))
            return 1;
        o.n_cpu_moe = n_cpu_moe;
        o.host_experts = host_experts;
        if (cuda_decode_run(syn, &o, toks, n, lc))
            return 1;
        char label[256];
        compare_logits("CUDA decode, every expert on the device, vs CPU", lr, ld, n, V);
        snprintf(label, sizeof label, "CUDA decode, experts of %d layers in host memory (host_experts %d), vs CPU",
                 n_cpu_moe, host_experts);
        compare_logits(label, lr, lc, n, V);
        snprintf(label, sizeof label, "CUDA decode, experts of %d layers in host memory (host_experts %d), vs every "
                 "expert on the device", n_cpu_moe, host_experts);
        compare_logits(label, ld, lc, n, V);
        if (router_unfused) {
            float *lu = malloc(sizeof(float) * (size_t)n * V);
            if (!lu)
                DIE("out of memory");
            lily_backend_options uo;
            memset(&uo, 0, sizeof uo);
            uo.max_chunk = n;
            uo.moe_router_unfused = true;
            if (cuda_decode_run(syn, &uo, toks, n, lu))
                return 1;
            compare_logits("CUDA decode, every expert on the device, router as its own GEMV, vs the default (router "
                           "inside gate/up)", ld, lu, n, V);
            snprintf(label, sizeof label, "CUDA decode, experts of %d layers in host memory (host_experts %d), vs every "
                     "expert on the device with the router as its own GEMV", n_cpu_moe, host_experts);
            compare_logits(label, lu, lc, n, V);
            free(lu);
        }
        free(ld), free(probe), free(lc), free(lr), free(toks);
        lily_synthetic_free(syn);
        return 0;
    }

    for (int v = 0; v < 2; v++) { /* the model's own sensitivity: another summation order; fp16 inputs */
        if (!(v == 0 ? cpu_chunked : cpu_f16))
            continue;
        lily_backend_options vo = co;
        vo.deltanet_chunked = v == 0;
        vo.cpu_matmul_inputs_f16 = v == 1;
        probe_clear(probe);
        if (cpu_forward_run(syn, &vo, toks, n, lc))
            return 1;
        compare_logits(v == 0 ? "CPU chunked delta rule vs CPU recurrent" : "CPU with fp16 matmul inputs vs CPU exact", lr,
                       lc, n, V);
        if (layers)
            probe_print(probe, cfg);
    }

    lily_backend_options go;
    memset(&go, 0, sizeof go);
    go.max_chunk = n;
    go.exact = exact;
    if (layers) {
        go.debug_hook = probe_hook;
        go.debug_user = probe;
    }
    lily_backend be;
    void *st = NULL;
    if (lily_backend_create("cuda", cfg, &syn->weights, &go, &be, &err) != LILY_OK ||
        be.ops->state_new(be.ctx, n + 8, &st, &err) != LILY_OK)
        DIE("cuda: %s", err.message);
    {
        char label[512];
        snprintf(label, sizeof label, "CUDA%s prefill (one call of %d tokens) vs CPU", exact ? " exact" : "", n);
        be.ops->state_reset(be.ctx, st);
        probe_clear(probe);
        probe->row0 = 0;
        if (be.ops->forward(be.ctx, st, toks, n, LILY_LOGITS_ALL, lc, &err) != LILY_OK)
            DIE("cuda forward: %s", err.message);
        compare_logits(label, lr, lc, n, V);
        if (layers)
            probe_print(probe, cfg);
        if (decode) {
            be.ops->state_reset(be.ctx, st);
            probe_clear(probe);
            for (int i = 0; i < n; i++) {
                probe->row0 = i;
                if (be.ops->forward(be.ctx, st, toks + i, 1, LILY_LOGITS_LAST, lc + (size_t)i * V, &err) != LILY_OK)
                    DIE("cuda decode: %s", err.message);
            }
            snprintf(label, sizeof label, "CUDA%s decode (%d calls of 1 token) vs CPU", exact ? " exact" : "", n);
            compare_logits(label, lr, lc, n, V);
            if (layers)
                probe_print(probe, cfg);
        }
        fflush(stdout);
    }
    be.ops->state_free(be.ctx, st);
    lily_backend_destroy(&be);
    for (int l = 0; l < MAX_LAYERS; l++)
        for (int k = 0; k < PROBE_N; k++)
            free(probe->ref[l][k]);
    free(probe);
    free(lc);
    free(lr);
    free(toks);
    lily_synthetic_free(syn);
    return 0;
}
