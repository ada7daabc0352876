/* fdot_dispatch.c — the one place that picks the fdot.h kernels for this CPU at run time: x86-64 with
 * AVX-512 F/BW/VL (and AVX2 + FMA + F16C) → avx512, with AVX2 + FMA + F16C → avx2, anything else → ref.
 */
#include "fdot.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* CPUID.1:ECX.F16C[bit 29] (not every compiler's __builtin_cpu_supports knows "f16c"). */
static int has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1u);
}
#endif

int cpu_fdot_available(const cpu_fdot_kernels **out)
{
    int n = 0;
    out[n++] = &cpu_fdot_ref;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c()) {
        out[n++] = &cpu_fdot_avx2;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
            out[n++] = &cpu_fdot_avx512;
    }
#endif
    return n;
}

const cpu_fdot_kernels *cpu_fdot_best(void)
{
    const cpu_fdot_kernels *sets[CPU_FDOT_MAX_SETS];
    const int n = cpu_fdot_available(sets);
    return sets[n - 1];
}
