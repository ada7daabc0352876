/* cuda_knobs.h — the CUDA backend's bench knobs (lily_cuda_tuning) by name, for the bench tools:
 * "name=value,name=value" specs applied over the defaults, and a one-line print. Header-only (bench/). */
#ifndef LILY_BENCH_CUDA_KNOBS_H
#define LILY_BENCH_CUDA_KNOBS_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"

static const struct {
    const char *name;
    size_t offset;
} cuda_knob_table[] = {
    {"pdl", offsetof(lily_cuda_tuning, pdl)},
    {"gemv_blocks_per_sm", offsetof(lily_cuda_tuning, gemv_blocks_per_sm)},
    {"gemv_mma", offsetof(lily_cuda_tuning, gemv_mma)},
    {"att_mma", offsetof(lily_cuda_tuning, att_mma)},
    {"gdn_decode", offsetof(lily_cuda_tuning, gdn_decode)},
    {"gdn_prefill", offsetof(lily_cuda_tuning, gdn_prefill)},
    {"prefill_gemm", offsetof(lily_cuda_tuning, prefill_gemm)},
    {"att_prefill", offsetof(lily_cuda_tuning, att_prefill)},
    {"moe_gate_up_blocks", offsetof(lily_cuda_tuning, moe_gate_up_blocks)},
    {"gemv_mma_blocks", offsetof(lily_cuda_tuning, gemv_mma_blocks)},
    {"gemm_variant", offsetof(lily_cuda_tuning, gemm_variant)},
    {"moe_tile", offsetof(lily_cuda_tuning, moe_tile)},
    {"dense_tile", offsetof(lily_cuda_tuning, dense_tile)},
    {"att_prefill_fused_q", offsetof(lily_cuda_tuning, att_prefill_fused_q)},
    {"moe_gate_up_staged", offsetof(lily_cuda_tuning, moe_gate_up_staged)},
    {"gemv_stream", offsetof(lily_cuda_tuning, gemv_stream)},
    {"gemv_stream_stages", offsetof(lily_cuda_tuning, gemv_stream_stages)},
    {"moe_early_ids", offsetof(lily_cuda_tuning, moe_early_ids)},
    {"gemm_prep_rows", offsetof(lily_cuda_tuning, gemm_prep_rows)},
};

/* *t := the defaults with the "name=value,..." assignments of spec applied ("" or "default": none).
 * Returns 0, or -1 for an unknown name or a malformed item. */
static inline int cuda_knobs_parse(const char *spec, lily_cuda_tuning *t)
{
    const lily_cuda_tuning dflt = LILY_CUDA_TUNING_DEFAULT;
    *t = dflt;
    if (!spec || !*spec || !strcmp(spec, "default"))
        return 0;
    const char *p = spec;
    while (*p) {
        const char *eq = strchr(p, '='), *end = strchr(p, ',');
        if (!end)
            end = p + strlen(p);
        if (!eq || eq > end)
            return -1;
        size_t k = 0;
        const size_t n = sizeof cuda_knob_table / sizeof cuda_knob_table[0];
        while (k < n && !(strlen(cuda_knob_table[k].name) == (size_t)(eq - p) &&
                          !strncmp(cuda_knob_table[k].name, p, (size_t)(eq - p))))
            k++;
        if (k == n)
            return -1;
        *(int *)((char *)t + cuda_knob_table[k].offset) = atoi(eq + 1);
        p = *end ? end + 1 : end;
    }
    return 0;
}

/* "name=value ..." of every knob. */
static inline void cuda_knobs_print(FILE *f, const lily_cuda_tuning *t)
{
    for (size_t k = 0; k < sizeof cuda_knob_table / sizeof cuda_knob_table[0]; k++)
        fprintf(f, "%s%s=%d", k ? " " : "", cuda_knob_table[k].name,
                *(const int *)((const char *)t + cuda_knob_table[k].offset));
}

#endif
