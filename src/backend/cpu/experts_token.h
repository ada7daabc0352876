/* experts_token.h — the routed experts of one token on the host's cores, for a backend that keeps some
 * layers' experts in host memory and hands their decode work to the CPU (the CUDA backend's
 * --host-experts cpu, src/backend/cuda/cpu_experts.cu).
 *
 * Owns: a thread pool of its own and the scratch of one token. Two arithmetics (cpu_experts_arith):
 *   CPU_EXPERTS_CUDA_ROUNDING (what the CUDA backend uses): the CUDA decode MoE's rounding points (fdot.h
 *     gives the math). With x_fp16 (the tensor-core kernels, moe_decode.cu on mma_gemv.cuh, 4-bit): x fed
 *     to gate/up as fp16 values of x·k with one power-of-two scale k for the token (odd columns divided by
 *     16 before the rounding, as the GPU feeds them), fp32 products of the exact weights, the groups'
 *     scale and bias applied with the GPU's group sums of the fed values, silu(g) ⊙ u in fp32, and down
 *     fed each slot's silu(g) ⊙ u the same way with that slot's own scale. Without (moe_route.cu's
 *     kernels) and for 8-bit stacks: x and silu(g) ⊙ u in fp32. So the result differs from the GPU's
 *     only by the order of fp32 sums (and by silu's expf).
 *   CPU_EXPERTS_FAST: the CPU backend's fast mode (moe_fast.c for one token: int8-digit activations,
 *     quant_dot.h's kernels), so for the same input, ids and weights the result is moe_fast.c's bit for bit.
 * Both sum the slots in ascending expert id.
 */
#ifndef LILY_CPU_EXPERTS_TOKEN_H
#define LILY_CPU_EXPERTS_TOKEN_H

#include <stdbool.h>

#include "fdot.h"
#include "lily.h"
#include "model/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cpu_experts_token cpu_experts_token;

typedef enum {
    CPU_EXPERTS_CUDA_ROUNDING, /* the CUDA decode MoE's rounding points (fdot.h) */
    CPU_EXPERTS_FAST,          /* the CPU backend's fast mode (int8 digits, quant_dot.h) */
} cpu_experts_arith;

/* Scratch for hidden / inter (multiples of 32) and top_k (1..64) experts in arithmetic arith, and a pool
 * of n_threads threads, the caller of cpu_experts_token_run included (0 = every online core).
 * LILY_ERR_INVALID_ARGUMENT, LILY_ERR_OUT_OF_MEMORY, LILY_ERR_BACKEND (a thread that does not start). */
lily_status cpu_experts_token_create(int hidden, int inter, int top_k, int n_threads, cpu_experts_arith arith,
                                     cpu_experts_token **out, lily_error *err);
void cpu_experts_token_destroy(cpu_experts_token *t);
/* Threads of its pool. */
int cpu_experts_token_threads(const cpu_experts_token *t);
/* CPU_EXPERTS_CUDA_ROUNDING: run on kernel set k (one of cpu_fdot_available's) instead of the best one
 * (tests, benches: every set gives the same result up to the order of fp32 sums). Else nothing. */
void cpu_experts_token_set_kernels(cpu_experts_token *t, const cpu_fdot_kernels *k);
/* silu(gate x) ⊙ (up x) of the last run, [k, inter] fp32, its slots in ascending expert id (tests). */
const float *cpu_experts_token_hid(const cpu_experts_token *t);

/* Whether the three expert stacks take this path: [E, inter, hidden] gate and up, [E, hidden, inter] down,
 * MLX affine 4- or 8-bit with groups a multiple of 32, gate and up sharing a group size, bf16 scale and
 * bias rows back to back. */
bool cpu_experts_token_ok(const lily_tensor *gate, const lily_tensor *up, const lily_tensor *down, int hidden,
                          int inter);

/* out[hidden] = Σ_i w[i] · down[ids[i]] · (silu(gate[ids[i]] · x) ⊙ (up[ids[i]] · x)) for x [hidden] fp32,
 * ids/w [k] (1 <= k <= top_k, distinct ids), summed in ascending expert id (MODEL.md §4.5; the arithmetic
 * of create's arith; x_fp16: CPU_EXPERTS_CUDA_ROUNDING's choice of the GPU path to follow, true where the
 * GPU runs the layer's decode MoE on its tensor-core kernels, moe_decode_mma_supported). Blocks until
 * done; not re-entrant. */
void cpu_experts_token_run(cpu_experts_token *t, const lily_tensor *gate, const lily_tensor *up, const lily_tensor *down,
                           bool x_fp16, const float *x, int k, const int *ids, const float *w, float *out);

#ifdef __cplusplus
}
#endif

#endif
