/* bench_quant_dot.c — the fast CPU path's integer matmul (cpu_qmatmul_rows over the quant_dot.h kernels)
 * on one thread, cache-warm, for A/B comparisons of kernel forms on a shared machine: the fastest of many
 * repetitions filters out the time other processes take.
 *
 * usage: bench_quant_dot [ROWS=512] [COLS=1024] [TOKENS=1,4,32] [BITS=4] [GROUP=64] [REPS=50]
 * Prints, per kernel set this CPU runs and per token count, G multiply-adds per second (rows · cols ·
 * tokens / the best time). Random weights and activations; not a test: numbers go to docs/BENCHMARKS.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "base/base.h"
#include "base/clock.h"

static unsigned rng = 12345u;
static unsigned next_rand(void) { return rng = rng * 1664525u + 1013904223u; }
static float frand(void) { return (float)(next_rand() >> 8) / (float)(1u << 24) * 2.0f - 1.0f; }

int main(int argc, char **argv)
{
    const int rows = argc > 1 ? atoi(argv[1]) : 512, cols = argc > 2 ? atoi(argv[2]) : 1024;
    const char *token_list = argc > 3 ? argv[3] : "1,4,32";
    const int bits = argc > 4 ? atoi(argv[4]) : 4, group = argc > 5 ? atoi(argv[5]) : 64;
    const int reps = argc > 6 ? atoi(argv[6]) : 50;
    if (rows < 1 || cols < 32 || cols % group || group % 32 || (bits != 4 && bits != 8) || reps < 1) {
        fprintf(stderr, "bench_quant_dot: bad arguments (cols a multiple of GROUP, GROUP of 32, BITS 4 or 8)\n");
        return 2;
    }
    int max_tokens = 1;
    for (const char *p = token_list; *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p))
        max_tokens = LILY_MAX(max_tokens, atoi(p));
    const int64_t row_bytes = (int64_t)cols * bits / 8, n_groups = cols / group;
    uint8_t *wq = malloc((size_t)(rows * row_bytes));
    uint16_t *scales = malloc((size_t)(rows * n_groups) * 2), *biases = malloc((size_t)(rows * n_groups) * 2);
    float *x = malloc((size_t)max_tokens * cols * sizeof(float));
    float *y = malloc((size_t)max_tokens * rows * sizeof(float));
    float *gsum = malloc((size_t)max_tokens * (cols / 32) * sizeof(float));
    cpu_qact a = {malloc((size_t)max_tokens * cols), malloc((size_t)max_tokens * cols),
                  malloc((size_t)max_tokens * (cols / 32) * sizeof(float)),
                  malloc((size_t)max_tokens * (cols / 32) * sizeof(float)), cols,
                  malloc((size_t)max_tokens * cols * sizeof(int16_t))};
    if (!wq || !scales || !biases || !x || !y || !gsum || !a.q || !a.r || !a.d || !a.sum || !a.v) {
        fprintf(stderr, "bench_quant_dot: out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < rows * row_bytes; i++)
        wq[i] = (uint8_t)(next_rand() >> 24);
    for (int64_t i = 0; i < rows * n_groups; i++) {
        scales[i] = lily_f32_to_bf16(0.02f * frand());
        biases[i] = lily_f32_to_bf16(0.1f * frand());
    }
    for (int64_t i = 0; i < (int64_t)max_tokens * cols; i++)
        x[i] = frand();
    cpu_quantize_act(x, max_tokens, cols, &a);
    cpu_qact_group_sums(&a, max_tokens, group, gsum);
    lily_tensor w;
    memset(&w, 0, sizeof w);
    w.name = "bench.weight";
    w.data = wq;
    w.dtype = LILY_DTYPE_U32;
    w.ndim = 2;
    w.shape[0] = rows;
    w.shape[1] = cols;
    w.bits = bits;
    w.group_size = group;
    w.scales = scales;
    w.biases = biases;
    w.scale_dtype = LILY_DTYPE_BF16;
    w.row_bytes = row_bytes;
    w.scale_row_bytes = n_groups * 2;

    const cpu_qdot_kernels *sets[CPU_QDOT_MAX_SETS];
    const int n_sets = cpu_qdot_available(sets);
    printf("rows %d, cols %d, %d-bit group %d, best of %d, one thread\n", rows, cols, bits, group, reps);
    for (int s = 0; s < n_sets; s++)
        for (const char *p = token_list; *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p)) {
            const int n = atoi(p);
            if (n < 1)
                continue;
            double best = 1e30;
            for (int r = 0; r < reps; r++) {
                const double t0 = lily_wall_seconds();
                cpu_qmatmul_rows(sets[s], &w, 0, 0, rows, &a, 0, n, gsum, y, rows);
                best = LILY_MIN(best, lily_wall_seconds() - t0);
            }
            printf("%-13s tokens %3d: %7.2f GMAC/s (%.1f us)\n", sets[s]->name, n,
                   (double)rows * cols * n / best * 1e-9, best * 1e6);
        }
    return 0;
}
