/* hw_limits.c — CPU memory bandwidth and fp32 matmul rate, measured (hw_limits.h).
 *
 * Owns: the streaming-read and memcpy passes, the register-tiled fp32 matmul kernel used only to measure
 * the matrix rate (4 x 2W tile of W-wide vectors, B panel resident in L1; AVX-512, AVX2+FMA or generic,
 * chosen at run time).
 */
#include "hw_limits.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "base/clock.h"

static int default_threads(int n_threads)
{
    if (n_threads > 0)
        return n_threads > 256 ? 256 : n_threads;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)(n > 256 ? 256 : n) : 1;
}

void lily_cpu_describe(char *buf, size_t size)
{
    char model[200] = "unknown CPU";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (!strncmp(line, "model name", 10)) {
                char *colon = strchr(line, ':');
                if (colon) {
                    colon++;
                    while (*colon == ' ' || *colon == '\t')
                        colon++;
                    colon[strcspn(colon, "\n")] = 0;
                    snprintf(model, sizeof model, "%s", colon);
                }
                break;
            }
        }
        fclose(f);
    }
    snprintf(buf, size, "%s (%ld cores)", model, sysconf(_SC_NPROCESSORS_ONLN));
}

/* ---- bandwidth -------------------------------------------------------------------------------- */

typedef uint64_t u64x2 __attribute__((vector_size(16)));

/* XOR of every 64-bit word: a pure streaming read the compiler cannot drop. */
#define READ_BODY(vec)                                                                                  \
    const vec *p = (const vec *)src;                                                                    \
    size_t n = bytes / sizeof(vec);                                                                     \
    vec a = {0}, b = {0}, c = {0}, d = {0};                                                             \
    for (size_t i = 0; i + 4 <= n; i += 4) {                                                            \
        a ^= p[i];                                                                                      \
        b ^= p[i + 1];                                                                                  \
        c ^= p[i + 2];                                                                                  \
        d ^= p[i + 3];                                                                                  \
    }                                                                                                   \
    vec s = a ^ b ^ c ^ d;                                                                              \
    uint64_t x = 0;                                                                                     \
    for (size_t i = 0; i < sizeof(vec) / 8; i++)                                                        \
        x ^= s[i];                                                                                      \
    return x;

static uint64_t read_generic(const uint8_t *src, size_t bytes) { READ_BODY(u64x2) }

#if defined(__x86_64__) && defined(__GNUC__)
typedef uint64_t u64x4 __attribute__((vector_size(32)));
__attribute__((target("avx2"))) static uint64_t read_avx2(const uint8_t *src, size_t bytes) { READ_BODY(u64x4) }
#endif

static uint64_t read_pass(const uint8_t *src, size_t bytes)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx2"))
        return read_avx2(src, bytes);
#endif
    return read_generic(src, bytes);
}

typedef struct {
    uint8_t *src, *dst;
    size_t bytes;
    int copy;
    uint64_t sink;
    pthread_barrier_t *barrier;
    double t0, t1;
} bw_task;

static void *bw_worker(void *arg)
{
    bw_task *t = arg;
    pthread_barrier_wait(t->barrier);
    t->t0 = lily_wall_seconds();
    if (t->copy) {
        memcpy(t->dst, t->src, t->bytes);
        t->sink = t->dst[t->bytes - 1];
    } else {
        t->sink = read_pass(t->src, t->bytes);
    }
    t->t1 = lily_wall_seconds();
    return NULL;
}

/* Bytes moved per second by one multi-threaded pass (read: bytes read; copy: bytes read + written). */
static double bw_pass(uint8_t *src, uint8_t *dst, size_t bytes, int n_threads, int copy)
{
    bw_task tasks[256];
    pthread_t th[256];
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)n_threads);
    size_t per = (bytes / (size_t)n_threads) & ~(size_t)4095;
    for (int i = 0; i < n_threads; i++) {
        tasks[i] = (bw_task){.src = src + per * (size_t)i, .dst = dst + per * (size_t)i, .bytes = per, .copy = copy,
                             .barrier = &barrier};
    }
    int started = 1;
    for (; started < n_threads; started++)
        if (pthread_create(&th[started], NULL, bw_worker, &tasks[started]) != 0)
            break;
    LILY_ASSERT(started == n_threads); /* the barrier needs every thread; thread creation is not expected to fail */
    bw_worker(&tasks[0]);
    double t0 = tasks[0].t0, t1 = tasks[0].t1;
    for (int i = 1; i < n_threads; i++) {
        pthread_join(th[i], NULL);
        t0 = tasks[i].t0 < t0 ? tasks[i].t0 : t0;
        t1 = tasks[i].t1 > t1 ? tasks[i].t1 : t1;
    }
    pthread_barrier_destroy(&barrier);
    double moved = (double)per * n_threads * (copy ? 2.0 : 1.0);
    return moved / (t1 - t0);
}

/* ---- matmul rate -------------------------------------------------------------------------------- */

#define MM_N 256 /* C[MM_N, MM_N] += A[MM_N, MM_N] B[MM_N, MM_N] per thread per pass */

typedef float f32x8 __attribute__((vector_size(32)));

#define SPLAT8(v) {(v), (v), (v), (v), (v), (v), (v), (v)}
#define SPLAT16(v) {(v), (v), (v), (v), (v), (v), (v), (v), (v), (v), (v), (v), (v), (v), (v), (v)}

/* C[4 rows, 2W columns] += A[4 rows, :] B[:, 2W columns] with W-wide vectors: a 4 x 2W tile in eight
 * named accumulators (named, so the compiler keeps them in registers), the 2W x MM_N B panel in L1. */
#define MATMUL_BODY(f32xW, W, SPLAT)                                                                    \
    for (int j0 = 0; j0 < MM_N; j0 += 2 * W)                                                            \
        for (int i0 = 0; i0 < MM_N; i0 += 4) {                                                          \
            f32xW c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0}, c30 = {0}, c31 = {0}; \
            const float *a0 = &A[i0 * MM_N], *a1 = a0 + MM_N, *a2 = a1 + MM_N, *a3 = a2 + MM_N;         \
            for (int k = 0; k < MM_N; k++) {                                                            \
                f32xW b0, b1;                                                                           \
                memcpy(&b0, &B[k * MM_N + j0], sizeof b0);                                              \
                memcpy(&b1, &B[k * MM_N + j0 + W], sizeof b1);                                          \
                f32xW x0 = SPLAT(a0[k]), x1 = SPLAT(a1[k]), x2 = SPLAT(a2[k]), x3 = SPLAT(a3[k]);         \
                c00 += x0 * b0;                                                                         \
                c01 += x0 * b1;                                                                         \
                c10 += x1 * b0;                                                                         \
                c11 += x1 * b1;                                                                         \
                c20 += x2 * b0;                                                                         \
                c21 += x2 * b1;                                                                         \
                c30 += x3 * b0;                                                                         \
                c31 += x3 * b1;                                                                         \
            }                                                                                           \
            f32xW acc[8] = {c00, c01, c10, c11, c20, c21, c30, c31};                                    \
            for (int r = 0; r < 4; r++)                                                                 \
                for (int h = 0; h < 2; h++) {                                                           \
                    float *c = &C[(i0 + r) * MM_N + j0 + W * h];                                        \
                    f32xW v;                                                                            \
                    memcpy(&v, c, sizeof v);                                                            \
                    v += acc[2 * r + h];                                                                \
                    memcpy(c, &v, sizeof v);                                                            \
                }                                                                                       \
        }

typedef float f32x16 __attribute__((vector_size(64)));

static void matmul_generic(const float *A, const float *B, float *C) { MATMUL_BODY(f32x8, 8, SPLAT8) }

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) static void matmul_avx2(const float *A, const float *B, float *C)
{
    MATMUL_BODY(f32x8, 8, SPLAT8)
}
__attribute__((target("avx512f"))) static void matmul_avx512(const float *A, const float *B, float *C)
{
    MATMUL_BODY(f32x16, 16, SPLAT16)
}
#endif

typedef struct {
    float *a, *b, *c;
    int reps;
    int simd; /* 0 generic, 1 avx2+fma, 2 avx512f */
    pthread_barrier_t *barrier;
    double t0, t1;
} mm_task;

static void *mm_worker(void *arg)
{
    mm_task *t = arg;
    pthread_barrier_wait(t->barrier);
    t->t0 = lily_wall_seconds();
    for (int r = 0; r < t->reps; r++) {
#if defined(__x86_64__) && defined(__GNUC__)
        if (t->simd == 2) {
            matmul_avx512(t->a, t->b, t->c);
            continue;
        }
        if (t->simd == 1) {
            matmul_avx2(t->a, t->b, t->c);
            continue;
        }
#endif
        matmul_generic(t->a, t->b, t->c);
    }
    t->t1 = lily_wall_seconds();
    return NULL;
}

static lily_status matmul_rate(int n_threads, double *flops, char *kind, size_t kind_size, lily_error *err)
{
    int simd = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        simd = 2;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        simd = 1;
#endif
    snprintf(kind, kind_size, "fp32 %s", simd == 2 ? "avx512f" : simd == 1 ? "avx2+fma" : "generic");
    size_t per = (size_t)MM_N * MM_N;
    float *mem = NULL;
    if (posix_memalign((void **)&mem, 64, sizeof(float) * per * 3 * (size_t)n_threads) != 0)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "matmul rate: out of memory");
    for (size_t i = 0; i < per * 3 * (size_t)n_threads; i++)
        mem[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    double best = 0;
    int reps = 2;
    for (int pass = 0; pass < 4; pass++) {
        mm_task tasks[256];
        pthread_t th[256];
        pthread_barrier_t barrier;
        pthread_barrier_init(&barrier, NULL, (unsigned)n_threads);
        for (int i = 0; i < n_threads; i++) {
            float *base = mem + per * 3 * (size_t)i;
            tasks[i] = (mm_task){.a = base, .b = base + per, .c = base + 2 * per, .reps = reps, .simd = simd,
                                 .barrier = &barrier};
        }
        int started = 1;
        for (; started < n_threads; started++)
            if (pthread_create(&th[started], NULL, mm_worker, &tasks[started]) != 0)
                break;
        LILY_ASSERT(started == n_threads);
        mm_worker(&tasks[0]);
        double t0 = tasks[0].t0, t1 = tasks[0].t1;
        for (int i = 1; i < n_threads; i++) {
            pthread_join(th[i], NULL);
            t0 = tasks[i].t0 < t0 ? tasks[i].t0 : t0;
            t1 = tasks[i].t1 > t1 ? tasks[i].t1 : t1;
        }
        pthread_barrier_destroy(&barrier);
        double rate = 2.0 * MM_N * MM_N * MM_N * (double)reps * n_threads / (t1 - t0);
        best = rate > best ? rate : best;
        if (t1 - t0 < 0.1)
            reps *= 2; /* aim for passes of ~0.1 s */
    }
    free(mem);
    *flops = best;
    return LILY_OK;
}

lily_status lily_cpu_measure_limits(int n_threads, size_t bytes, lily_hw_limits *out, lily_error *err)
{
    memset(out, 0, sizeof *out);
    n_threads = default_threads(n_threads);
    lily_cpu_describe(out->device, sizeof out->device);
    if (bytes == 0)
        bytes = (size_t)512 << 20;
    uint8_t *src = NULL, *dst = NULL;
    if (posix_memalign((void **)&src, 4096, bytes) != 0)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "membw: cannot allocate %zu MiB", bytes >> 20);
    if (posix_memalign((void **)&dst, 4096, bytes) != 0) {
        free(src);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "membw: cannot allocate %zu MiB", bytes >> 20);
    }
    /* touch every page so the passes measure memory, not page faults */
    for (size_t i = 0; i < bytes; i += 64)
        src[i] = (uint8_t)i;
    memset(dst, 1, bytes);
    for (int pass = 0; pass < 3; pass++) {
        double r = bw_pass(src, dst, bytes, n_threads, 0);
        double c = bw_pass(src, dst, bytes, n_threads, 1);
        out->read_bytes_per_s = r > out->read_bytes_per_s ? r : out->read_bytes_per_s;
        out->copy_bytes_per_s = c > out->copy_bytes_per_s ? c : out->copy_bytes_per_s;
    }
    free(src);
    free(dst);
    out->bandwidth = out->read_bytes_per_s; /* decode mostly reads weights */
    return matmul_rate(n_threads, &out->matmul_flops_per_s, out->matmul_kind, sizeof out->matmul_kind, err);
}

lily_status lily_measure_limits(const char *backend, int device, int n_threads, lily_hw_limits *out, lily_error *err)
{
    if (!strcmp(backend, "cpu"))
        return lily_cpu_measure_limits(n_threads, 0, out, err);
    const lily_backend_ops *ops = lily_backend_find(backend);
    if (ops && ops->measure_limits) {
        memset(out, 0, sizeof *out);
        return ops->measure_limits(device, out, err);
    }
    return lily_error_set(err, LILY_ERR_UNSUPPORTED, "no hardware measurement for backend '%s'", backend);
}
