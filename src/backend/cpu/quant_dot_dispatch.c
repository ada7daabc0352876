/* quant_dot_dispatch.c — the one place that picks the quant_dot.h kernels for this CPU at run time:
 * x86-64 with AMX-TILE + AMX-INT8 granted by Linux (and AVX-512 F/BW/VL/DQ + VNNI) → avx512-amx, else with
 * AVX-512 F/BW/VL + VNNI (and AVX2 + FMA) → avx512-vnni, else with AVX2 + FMA → avx2;
 * AArch64 with the dot-product extension → neon-dotprod, else neon;
 * anything else → ref (portable C).
 */
#include <stdbool.h>

#include "quant_dot.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20) /* the Linux AArch64 hwcap bit of FEAT_DotProd */
#endif
#endif

#if CPU_QDOT_HAVE_AMX
#include <sys/syscall.h>
#include <unistd.h>
#define ARCH_REQ_XCOMP_PERM 0x1023 /* arch_prctl: ask for an extended state component (Linux 5.16+) */
#define XFEATURE_XTILEDATA 18      /* AMX tile data */

/* Whether Linux lets this process use the AMX tile data (asked once per process; asking again is a no-op). */
static bool amx_permitted(void) { return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0; }
#endif

int cpu_qdot_available(const cpu_qdot_kernels **out)
{
    int n = 0;
    out[n++] = &cpu_qdot_ref;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        out[n++] = &cpu_qdot_avx2;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")) {
            out[n++] = &cpu_qdot_avx512_vnni;
#if CPU_QDOT_HAVE_AMX
            if (__builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("amx-tile") &&
                __builtin_cpu_supports("amx-int8") && amx_permitted())
                out[n++] = &cpu_qdot_avx512_amx;
#endif
        }
    }
#endif
#if defined(__aarch64__)
    out[n++] = &cpu_qdot_neon;
#if defined(__linux__)
    if (getauxval(AT_HWCAP) & HWCAP_ASIMDDP)
        out[n++] = &cpu_qdot_neon_dotprod;
#endif
#endif
    return n;
}

const cpu_qdot_kernels *cpu_qdot_best(void)
{
    const cpu_qdot_kernels *sets[CPU_QDOT_MAX_SETS];
    const int n = cpu_qdot_available(sets);
    return sets[n - 1];
}
