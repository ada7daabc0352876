/* cuda_test_compare.h — helpers shared by the end-to-end GPU tests written in C (test_cuda_fixture,
 * test_cuda_lily_tiny, test_cuda_decode_loop, test_cuda_prefix_cache): the failure counter g_fail and
 * REQUIRE, the no-device skip, argmax, the logits comparison (top-1 agreement, mean KL, max |Δlogit|)
 * of the backend against a reference, and a token log for decode_loop. Header of static functions, one copy per test.
 */
#ifndef LILY_CUDA_TEST_COMPARE_H
#define LILY_CUDA_TEST_COMPARE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"

/* Failed checks of this test (main's exit code). */
static int g_fail;

/* Fail the check (printing "FAIL: ...") and return from the calling void function. */
#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL: " __VA_ARGS__);                                                          \
            printf("\n");                                                                          \
            g_fail++;                                                                              \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* Nonzero (after printing "no CUDA device: skipped") when no GPU is present: main then returns 77. */
static inline int cuda_test_no_device(void)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("no CUDA device: skipped\n");
        return 1;
    }
    return 0;
}

/* The first index of the largest of x[0..n). */
static inline int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* Running totals of a logits comparison: rows compared, rows whose argmax agrees, Σ KL(ref || got)
 * (double, log-softmax of each row), max |ref - got| (NaN propagates). */
typedef struct {
    long rows, top1;
    double kl_sum, max_dlogit;
} logit_stats;

/* Add `rows` rows of `vocab` logits (ref and got, row-major) to *s. */
static inline void logit_score(logit_stats *s, const float *ref, const float *got, int rows, int vocab)
{
    for (int r = 0; r < rows; r++) {
        const float *a = ref + (size_t)r * vocab, *b = got + (size_t)r * vocab;
        int ia = 0, ib = 0;
        double ma = a[0], mb = b[0];
        for (int v = 0; v < vocab; v++) {
            if (a[v] > ma) ma = a[v], ia = v;
            if (b[v] > mb) mb = b[v], ib = v;
            const double d = fabs((double)a[v] - b[v]);
            if (!(d <= s->max_dlogit))
                s->max_dlogit = d; /* NaN propagates */
        }
        double za = 0, zb = 0;
        for (int v = 0; v < vocab; v++) {
            za += exp(a[v] - ma);
            zb += exp(b[v] - mb);
        }
        double kl = 0;
        for (int v = 0; v < vocab; v++) {
            const double lpa = a[v] - ma - log(za), lpb = b[v] - mb - log(zb);
            kl += exp(lpa) * (lpa - lpb);
        }
        s->kl_sum += kl;
        s->top1 += ia == ib;
        s->rows++;
    }
}

/* The tokens a backend's decode_loop hands to log_token (its on_token), in order. */
typedef struct {
    int32_t *tok;
    int n;
} token_log;

static inline int log_token(void *user, int32_t token, int index, const lily_token_logprobs *logprobs)
{
    (void)logprobs;
    token_log *l = (token_log *)user;
    if (index == l->n)
        l->tok[l->n++] = token;
    return 0;
}

#endif
