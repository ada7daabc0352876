/* cost_model.h — the bytes and FLOPs one token costs: the floor that `lily bench` compares against.
 *
 * Owns: the accounting of TARGETS.md "The hardware limit" — bytes read per decode token (active weights:
 * every projection, the top-k routed experts plus the shared expert, the routers, the LM head, one
 * embedding row; the KV cache read at the current depth; the Gated DeltaNet conv and recurrent state read
 * and written) and FLOPs per prefill token (2 per active weight, attention over the causal prefix, the
 * delta rule). For Qwen3.6-35B-A3B in MLX 4-bit this gives ~1.67 GB of weights, 20 KiB of KV cache per
 * context token and ~126 MB of recurrent state traffic per decode token, and ~6.3 GFLOP per token of a
 * 4K prompt when every token's logits are counted (TARGETS.md's figure), as tests/test_cost_model.c checks.
 * Does not own: measuring the hardware (hw_limits.h) or timing (cli/cmd_bench.c).
 */
#ifndef LILY_COST_MODEL_H
#define LILY_COST_MODEL_H

#include <stdint.h>

#include "model/config.h"

typedef struct {
    /* Storage assumptions the figures were computed with. */
    double bytes_per_weight;        /* bulk weights: bits/8 + 2 bf16 (scale, bias) per group; 2.0 when bf16 */
    double bytes_per_router_weight; /* router + shared_expert_gate (8-bit in MLX checkpoints) */
    int kv_bytes_per_element;       /* 2: a bf16 KV cache */

    /* Active parameters per token, by part (element counts). */
    double gdn_params;              /* all Gated DeltaNet layers: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj */
    double attention_params;        /* all full-attention layers: q_proj (with gate), k_proj, v_proj, o_proj */
    double moe_params;              /* all layers: top-k routed experts + the shared expert (gate, up, down) */
    double router_params;           /* all layers: router + shared_expert_gate */
    double lm_head_params;          /* vocab * hidden */

    /* Decode bytes per token, by part. */
    double gdn_bytes, attention_bytes, moe_bytes, router_bytes, lm_head_bytes;
    double small_bytes;             /* norms, conv1d, A_log, dt_bias, one embedding row */
    double weight_bytes;            /* sum of the above */
    double kv_bytes_per_position;   /* KV cache bytes read per context token (K and V, all full-attention layers) */
    double recurrent_state_bytes;   /* fp32 [Hv, dk, dv] per GDN layer, read + written */
    double conv_state_bytes;        /* bf16 [conv_dim, K-1] per GDN layer, read + written */

    /* Prefill FLOPs. */
    double matmul_flops_per_token;  /* 2 * active params, LM head excluded */
    double lm_head_flops;           /* 2 * vocab * hidden, per row of logits */
    double attention_flops_per_position; /* QK^T + AV per (query, key) pair summed over full-attention layers */
    double gdn_flops_per_token;     /* delta rule per token, all GDN layers (~8 Hv dk dv per layer) */
} lily_cost_model;

/* Fill cm for the model cfg stored with `bits` per bulk weight (4 or 8: MLX affine with bf16 scale and
 * bias per `group_size`; 0 or 16: bf16) and `router_bits` for the router and shared_expert_gate (8 in
 * mlx-community checkpoints; 0 means the same as bits). Source: TARGETS.md table, MODEL.md §1.3, §4. */
void lily_cost_model_init(const lily_config *cfg, int bits, int router_bits, int group_size, lily_cost_model *cm);

/* Bytes one decode token reads (and writes, for the state) with `context` tokens already in the KV cache:
 * weight_bytes + context * kv_bytes_per_position + recurrent and conv state read + write. */
double lily_cost_decode_bytes(const lily_cost_model *cm, int64_t context);

/* Mean FLOPs per token of prefilling a prompt of `prompt_len` tokens from an empty state, the way lily
 * runs it: matmuls of every token, causal attention (token i attends i + 1 positions, so the mean is
 * (prompt_len + 1) / 2 positions), the delta rule, and the LM head once (the last token's logits). */
double lily_cost_prefill_flops_per_token(const lily_cost_model *cm, int64_t prompt_len);

/* The same with logits for every token and attention over the mean position, as TARGETS.md counts
 * "~6.3 GFLOP per token at 4K (2 x 2.92 B + attention)". */
double lily_cost_prefill_flops_per_token_all_logits(const lily_cost_model *cm, int64_t prompt_len);

#endif
