/* experts_token.h — the routed experts of one token on the host's cores, for a backend that keeps some
 * layers' experts in host memory and hands their decode work to the CPU (the CUDA backend's
 * --host-experts cpu, src/backend/cuda/cpu_experts.cu).
 *
 * Owns: a thread pool of its own and the scratch of one token; the arithmetic is the CPU backend's fast
 * mode (moe_fast.c for one token: int8-digit activations, quant_dot.h's kernels, the weighted sum in
 * ascending expert id), so for the same input, ids and weights the result is moe_fast.c's bit for bit.
 */
#ifndef LILY_CPU_EXPERTS_TOKEN_H
#define LILY_CPU_EXPERTS_TOKEN_H

#include <stdbool.h>

#include "lily.h"
#include "model/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cpu_experts_token cpu_experts_token;

/* Scratch for hidden / inter (multiples of 32) and top_k (1..64) experts, and a pool of n_threads threads,
 * the caller of cpu_experts_token_run included (0 = every online core). LILY_ERR_INVALID_ARGUMENT,
 * LILY_ERR_OUT_OF_MEMORY, LILY_ERR_BACKEND (a thread that does not start). */
lily_status cpu_experts_token_create(int hidden, int inter, int top_k, int n_threads, cpu_experts_token **out,
                                     lily_error *err);
void cpu_experts_token_destroy(cpu_experts_token *t);
/* Threads of its pool. */
int cpu_experts_token_threads(const cpu_experts_token *t);

/* Whether the three expert stacks take this path: [E, inter, hidden] gate and up, [E, hidden, inter] down,
 * MLX affine 4- or 8-bit with groups a multiple of 32, gate and up sharing a group size, scale rows back to
 * back (as the CPU backend's fast mode needs). */
bool cpu_experts_token_ok(const lily_tensor *gate, const lily_tensor *up, const lily_tensor *down, int hidden,
                          int inter);

/* out[hidden] = Σ_i w[i] · down[ids[i]] · (silu(gate[ids[i]] · x) ⊙ (up[ids[i]] · x)) for x [hidden] fp32,
 * ids/w [k] (1 <= k <= top_k, distinct ids), summed in ascending expert id (MODEL.md §4.5; moe_fast.c's
 * arithmetic). Blocks until done; not re-entrant. */
void cpu_experts_token_run(cpu_experts_token *t, const lily_tensor *gate, const lily_tensor *up, const lily_tensor *down,
                           const float *x, int k, const int *ids, const float *w, float *out);

#ifdef __cplusplus
}
#endif

#endif
