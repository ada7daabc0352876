/* memory_plan.h — what lily will hold in GPU memory, and the defaults that fit a budget.
 *
 * Owns: the arithmetic only (no device calls): given the sizes a backend reports (weights, KV bytes per
 * token, per-session state, prefill scratch per candidate chunk, the runtime's own overhead) and a budget,
 * choose the prefill chunk, the context size and the device checkpoint pool, or say what to lower.
 * The engine (engine.c) fills the input from the backend's memory_needs op and prints the plan.
 */
#ifndef LILY_MEMORY_PLAN_H
#define LILY_MEMORY_PLAN_H

#include <stdbool.h>
#include <stddef.h>

#include "lily.h"

#define LILY_PLAN_MAX_CHUNKS 8
/* With no --ctx-size, the context the chunk choice keeps room for before the pool takes its share; the
 * context then grows into what is left, up to the model's maximum. */
#define LILY_PLAN_MIN_AUTO_CTX 32768

typedef struct {
    size_t budget_bytes;         /* all lily may hold on the device, the runtime's overhead included */
    size_t runtime_bytes;        /* the device runtime's own memory (context, kernels, graphs) */
    size_t weight_bytes;
    size_t kv_bytes_per_token;   /* one session, per token of context: KV rows of every attention layer */
    size_t state_bytes;          /* one session, besides the KV cache: DeltaNet conv + recurrent state */
    int n_sessions;              /* sessions the command holds at once (>= 1) */
    int n_chunks;                /* candidates, largest first (one when the chunk is given) */
    int chunk[LILY_PLAN_MAX_CHUNKS];           /* prefill chunk sizes in tokens */
    size_t scratch_bytes[LILY_PLAN_MAX_CHUNKS]; /* prefill scratch of each */
    int ctx_requested;           /* 0: as large as fits up to ctx_max */
    int ctx_max;                 /* the model's max_position_embeddings */
    size_t pool_requested;       /* device checkpoint pool wanted (shrunk, down to 0, to fit) */
    /* Routed experts in host memory (llama.cpp's --n-cpu-moe): */
    size_t expert_layer_bytes;   /* the routed experts of one layer, part of weight_bytes (all layers alike) */
    int n_layers;                /* layers with routed experts (0: none may move) */
    size_t expert_stage_bytes;   /* scratch added to every chunk's when any layer's experts are in host memory */
    int n_cpu_moe;               /* the first n_cpu_moe layers' experts in host memory (clamped to n_layers);
                                  * LILY_N_CPU_MOE_AUTO: the fewest layers that fit (see below);
                                  * LILY_N_CPU_MOE_NONE: none */
} lily_memory_plan_input;

#define LILY_N_CPU_MOE_AUTO 0
#define LILY_N_CPU_MOE_NONE (-1)

typedef struct {
    int chunk, ctx;
    size_t pool_bytes;           /* at most pool_requested */
    size_t pool_requested;       /* 0: the caller declared no pool, so none is planned (or capped) */
    /* the parts, bytes: */
    size_t weights, kv, state, scratch, runtime, total; /* weights: on the device (host experts excluded) */
    size_t budget;
    int n_cpu_moe;               /* layers whose routed experts are in host memory */
    int n_layers;                /* of how many */
    bool n_cpu_moe_chosen;       /* n_cpu_moe was LILY_N_CPU_MOE_AUTO and the plan moved experts */
    size_t host_experts;         /* bytes of routed experts in host memory (= GPU memory saved) */
    size_t expert_stage;         /* of scratch: expert_stage_bytes when n_cpu_moe > 0, else 0 */
} lily_memory_plan;

/* Choose, in this order: the layers whose routed experts stay in host memory (n_cpu_moe as given, or with
 * LILY_N_CPU_MOE_AUTO the fewest, from 0, whose remaining weights leave room for the largest chunk's
 * scratch and the target context below; all layers when no count does, and the steps below then fail or
 * fit a smaller context), the chunk (the largest candidate that leaves room for the target context: the
 * requested one, or min(ctx_max, LILY_PLAN_MIN_AUTO_CTX) tokens when none is requested; the smallest when
 * none does),
 * the pool (up to pool_requested, from what that context leaves), then the context
 * (the requested one, else everything left, rounded down to 256 tokens, at most ctx_max).
 * Errors (out untouched): LILY_ERR_OUT_OF_MEMORY with a message naming what to lower when the weights and
 * runtime exceed the budget, when a requested context does not fit with the smallest possible chunk (it
 * says how many tokens do), or when fewer than 256 tokens of context fit; LILY_ERR_INVALID_ARGUMENT for
 * an input out of range (no candidates, n_sessions < 1, more than LILY_PLAN_MAX_CHUNKS). */
lily_status lily_memory_plan_choose(const lily_memory_plan_input *in, lily_memory_plan *out, lily_error *err);

/* One line: "GPU memory plan: weights 18.17 GiB + KV cache 32768 tokens 0.63 GiB + ... = 21.43 of 24.00 GiB",
 * with "; routed experts of N of L layers in host memory: X GiB (not in the total)" when N > 0. */
void lily_memory_plan_format(const lily_memory_plan *p, char *buf, size_t size);

#endif
