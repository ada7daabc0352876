/* cuda_test_check.cuh — the error-bound check shared by the GPU kernel tests (test_cuda_kernels,
 * test_cuda_gdn_prefill, test_cuda_attention_prefill): the counters g_fail / g_checks, check() (one
 * compare with its ok/FAIL line) and cuda_test_summary() (the last line and the exit code). Include after
 * cuda_test_util.cuh; static, one copy per test.
 */
#ifndef LILY_CUDA_TEST_CHECK_CUH
#define LILY_CUDA_TEST_CHECK_CUH

#include <math.h>
#include <stdio.h>
#include <vector>

/* Checks run and failed by this test (every test's summary line counts them). */
static int g_fail = 0, g_checks = 0;

/* One check: every |got - want| <= rel * mag + 1e-5 (NaN fails). Prints "ok   what (worst error ...)" or
 * "FAIL what: ..." naming the first bad element, and with fail_worst also the worst ratio to the bound. */
static inline void check(const char *what, const std::vector<float> &got, const std::vector<double> &want,
                         const std::vector<double> &mag, double rel = 1e-4, bool fail_worst = false)
{
    double worst = 0;
    size_t bad = 0, first = (size_t)-1;
    for (size_t i = 0; i < want.size(); i++) {
        const double tol = rel * mag[i] + 1e-5;
        const double d = fabs((double)got[i] - want[i]);
        if (!(d <= tol)) {
            bad++;
            if (first == (size_t)-1)
                first = i;
        }
        if (d / tol > worst || got[i] != got[i])
            worst = got[i] != got[i] ? INFINITY : d / tol;
    }
    g_checks++;
    if (bad) {
        g_fail++;
        if (fail_worst)
            printf("FAIL %s: %zu of %zu outside the bound (first %zu: got %g want %g; worst %.3g of the bound)\n", what,
                   bad, want.size(), first, got[first], want[first], worst);
        else
            printf("FAIL %s: %zu of %zu outside the bound (first %zu: got %g want %g)\n", what, bad, want.size(), first,
                   got[first], want[first]);
    } else {
        printf("ok   %s (worst error %.3f of the bound)\n", what, worst);
    }
}

/* The last line of a test ("N checks, M failed") and its exit code. */
static inline int cuda_test_summary(void)
{
    printf("%d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}

#endif
