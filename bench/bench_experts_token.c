/* bench_experts_token.c — one decode token's routed experts on the host's cores (experts_token.h), as the
 * CUDA backend's --host-experts runs them inside the GPU's decode step: ns per token for each arithmetic
 * (CUDA rounding on every fdot.h kernel set this CPU runs, and the int8 fast mode) on the 35B-A3B expert
 * shape (hidden 2048, inter 512, 4-bit, groups of 64).
 *
 * usage: bench_experts_token [THREADS=0 (every core)] [KS=4,8] [TOKENS=32] [ROUNDS=7] [EXPERTS=64]
 * Two cases per k: "hot", the same k experts every token (their 1.5 MiB each stay in the caches), and
 * "cold", k distinct random experts of EXPERTS per token (as decode: mostly memory reads). Prints the best
 * round's ns per token and the weight bytes read per second, with the load average before and after
 * (the machine may be shared). Not a test: numbers go to docs/BENCHMARKS.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/experts_token.h"
#include "base/base.h"
#include "base/clock.h"

enum { H = 2048, I = 512, G = 64 };

static unsigned rng = 12345u;
static unsigned next_rand(void) { return rng = rng * 1664525u + 1013904223u; }
static float frand(void) { return (float)(next_rand() >> 8) / (float)(1u << 24) * 2.0f - 1.0f; }

static int make_stack(lily_tensor *t, int E, int rows, int cols)
{
    const int64_t rb = cols / 2, ng = cols / G, prow = (int64_t)E * rows;
    uint8_t *q = malloc((size_t)(prow * rb));
    uint16_t *s = malloc((size_t)(prow * ng) * 2), *b = malloc((size_t)(prow * ng) * 2);
    if (!q || !s || !b)
        return -1;
    for (int64_t i = 0; i < prow * rb; i++)
        q[i] = (uint8_t)(next_rand() >> 24);
    for (int64_t i = 0; i < prow * ng; i++) {
        s[i] = lily_f32_to_bf16(0.02f * frand());
        b[i] = lily_f32_to_bf16(0.1f * frand());
    }
    memset(t, 0, sizeof *t);
    t->name = "bench.experts";
    t->data = q;
    t->dtype = LILY_DTYPE_U32;
    t->ndim = 3;
    t->shape[0] = E;
    t->shape[1] = rows;
    t->shape[2] = cols;
    t->bits = 4;
    t->group_size = G;
    t->scales = s;
    t->biases = b;
    t->scale_dtype = LILY_DTYPE_BF16;
    t->expert_stride = rows;
    t->row_bytes = rb;
    t->scale_row_bytes = ng * 2;
    return 0;
}

static void print_load(const char *when)
{
    FILE *f = fopen("/proc/loadavg", "r");
    char buf[128] = "?";
    if (f) {
        if (!fgets(buf, sizeof buf, f))
            strcpy(buf, "?\n");
        fclose(f);
    }
    printf("load average %s: %s", when, buf);
}

int main(int argc, char **argv)
{
    const int threads = argc > 1 ? atoi(argv[1]) : 0;
    const char *ks = argc > 2 ? argv[2] : "4,8";
    const int tokens = argc > 3 ? atoi(argv[3]) : 32, rounds = argc > 4 ? atoi(argv[4]) : 7;
    const int E = argc > 5 ? atoi(argv[5]) : 64;
    if (threads < 0 || tokens < 1 || rounds < 1 || E < 16) {
        fprintf(stderr, "bench_experts_token: bad arguments\n");
        return 2;
    }
    lily_tensor gate, up, down;
    if (make_stack(&gate, E, I, H) || make_stack(&up, E, I, H) || make_stack(&down, E, H, I)) {
        fprintf(stderr, "bench_experts_token: out of memory\n");
        return 1;
    }
    float x[H], out[H];
    for (int i = 0; i < H; i++)
        x[i] = frand();
    int *ids = malloc((size_t)tokens * 16 * sizeof(int));
    float w[16];
    for (int i = 0; i < 16; i++)
        w[i] = 1.0f / 16;
    if (!ids)
        return 1;
    const cpu_fdot_kernels *sets[CPU_FDOT_MAX_SETS];
    const int n_sets = cpu_fdot_available(sets);
    print_load("before");
    printf("hidden %d, inter %d, 4-bit groups of %d, %d experts, %d tokens per round, best of %d\n", H, I, G, E, tokens,
           rounds);
    for (const char *p = ks; *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p)) {
        const int k = atoi(p);
        if (k < 1 || k > 16 || k > E)
            continue;
        for (int cold = 0; cold < 2; cold++) {
            for (int t = 0; t < tokens; t++) /* k distinct ids per token */
                for (int i = 0; i < k; i++) {
                    int e, dup;
                    do {
                        e = cold ? (int)(next_rand() >> 8) % E : i;
                        dup = 0;
                        for (int j = 0; j < i; j++)
                            dup |= ids[t * 16 + j] == e;
                    } while (dup);
                    ids[t * 16 + i] = e;
                }
            for (int v = 0; v <= n_sets; v++) { /* the fdot sets, then the int8 fast mode */
                const cpu_experts_arith arith = v < n_sets ? CPU_EXPERTS_CUDA_ROUNDING : CPU_EXPERTS_FAST;
                lily_error err;
                cpu_experts_token *tok;
                if (cpu_experts_token_create(H, I, 16, threads, arith, &tok, &err) != LILY_OK) {
                    fprintf(stderr, "bench_experts_token: %s\n", err.message);
                    return 1;
                }
                if (v < n_sets)
                    cpu_experts_token_set_kernels(tok, sets[v]);
                double best = 1e30;
                for (int r = 0; r < rounds + 1; r++) { /* round 0 warms up */
                    const double t0 = lily_wall_seconds();
                    for (int t = 0; t < tokens; t++)
                        cpu_experts_token_run(tok, &gate, &up, &down, true, x, k, ids + t * 16, w, out);
                    const double dt = (lily_wall_seconds() - t0) / tokens;
                    if (r > 0 && dt < best)
                        best = dt;
                }
                const double bytes = (double)k * (3.0 * H * I / 2 + 3.0 * H * I / G * 4);
                printf("k %d %-4s %-18s %2d threads: %9.0f ns/token  %6.1f GB/s of weights\n", k, cold ? "cold" : "hot",
                       v < n_sets ? sets[v]->name : "int8 (fast mode)", cpu_experts_token_threads(tok), best * 1e9,
                       bytes / best * 1e-9);
                cpu_experts_token_destroy(tok);
            }
        }
    }
    print_load("after");
    return 0;
}
