/* cost_model.c — bytes per decode token and FLOPs per prefill token (TARGETS.md "The hardware limit").
 *
 * Owns: the arithmetic behind the hardware-limit fractions `lily bench` prints. Every count follows the
 * tensor shapes of MODEL.md §2.3 (the MLX 4-bit layout) for the config at hand; the test
 * tests/test_cost_model.c checks the Qwen3.6-35B-A3B numbers against TARGETS.md's table.
 */
#include "cost_model.h"

#include <string.h>

static double quantized_bytes_per_weight(int bits, int group_size)
{
    if (bits <= 0 || bits >= 16)
        return 2.0; /* bf16 */
    if (group_size <= 0)
        group_size = 64;
    /* bits per weight + a bf16 scale and a bf16 bias per group (MODEL.md §3) */
    return bits / 8.0 + 4.0 / group_size;
}

void lily_cost_model_init(const lily_config *cfg, int bits, int router_bits, int group_size, lily_cost_model *cm)
{
    memset(cm, 0, sizeof *cm);
    if (router_bits <= 0)
        router_bits = bits;
    cm->bytes_per_weight = quantized_bytes_per_weight(bits, group_size);
    cm->bytes_per_router_weight = quantized_bytes_per_weight(router_bits, group_size);
    cm->kv_bytes_per_element = 2;

    const double H = cfg->hidden;
    int n_full = 0;
    for (int i = 0; i < cfg->n_layers; i++)
        n_full += cfg->layer_types[i] == LILY_LAYER_FULL_ATTENTION;
    const int n_gdn = cfg->n_layers - n_full;
    const double conv_dim = lily_config_gdn_conv_dim(cfg);
    const double value_dim = lily_config_gdn_value_dim(cfg);
    const double Hv = cfg->gdn_n_value_heads, dk = cfg->gdn_key_head_dim, dv = cfg->gdn_value_head_dim;
    const double q_out = 2.0 * cfg->n_heads * cfg->head_dim; /* query + gate */
    const double kv_out = (double)cfg->n_kv_heads * cfg->head_dim;
    const double attn_dim = (double)cfg->n_heads * cfg->head_dim;

    /* in_proj_qkv + in_proj_z + in_proj_b + in_proj_a + out_proj */
    double gdn_layer = conv_dim * H + value_dim * H + 2.0 * Hv * H + H * value_dim;
    double attn_layer = q_out * H + 2.0 * kv_out * H + H * attn_dim;
    double moe_layer = 3.0 * H * ((double)cfg->n_experts_used * cfg->moe_intermediate + cfg->shared_intermediate);
    double router_layer = (double)cfg->n_experts * H + H;

    cm->gdn_params = n_gdn * gdn_layer;
    cm->attention_params = n_full * attn_layer;
    cm->moe_params = cfg->n_layers * moe_layer;
    cm->router_params = cfg->n_layers * router_layer;
    cm->lm_head_params = (double)cfg->vocab_size * H;

    cm->gdn_bytes = cm->gdn_params * cm->bytes_per_weight;
    cm->attention_bytes = cm->attention_params * cm->bytes_per_weight;
    cm->moe_bytes = cm->moe_params * cm->bytes_per_weight;
    cm->router_bytes = cm->router_params * cm->bytes_per_router_weight;
    cm->lm_head_bytes = cm->lm_head_params * cm->bytes_per_weight;
    /* bf16 norms (2 per layer + final, q/k norms, gdn norm), conv1d [conv_dim, K], A_log, dt_bias;
     * one embedding row. */
    double small = 2.0 * (2.0 * cfg->n_layers * H + H);
    small += n_full * 2.0 * (2.0 * cfg->head_dim);
    small += n_gdn * (2.0 * (conv_dim * cfg->gdn_conv_kernel + dv) + 6.0 * Hv);
    small += H * cm->bytes_per_weight;
    cm->small_bytes = small;
    cm->weight_bytes = cm->gdn_bytes + cm->attention_bytes + cm->moe_bytes + cm->router_bytes + cm->lm_head_bytes +
                       cm->small_bytes;

    cm->kv_bytes_per_position = (double)n_full * 2.0 * kv_out * cm->kv_bytes_per_element;
    cm->recurrent_state_bytes = 2.0 * n_gdn * Hv * dk * dv * 4.0;
    cm->conv_state_bytes = 2.0 * n_gdn * conv_dim * (cfg->gdn_conv_kernel - 1) * 2.0;

    cm->matmul_flops_per_token = 2.0 * (cm->gdn_params + cm->attention_params + cm->moe_params + cm->router_params);
    cm->lm_head_flops = 2.0 * cm->lm_head_params;
    /* scores q.k (2 * head_dim) and the weighted sum of v (2 * head_dim), every query head */
    cm->attention_flops_per_position = n_full * 4.0 * attn_dim;
    /* decay, S^T k, rank-1 update, S^T q: ~8 dk dv per value head (chunked form: about the same) */
    cm->gdn_flops_per_token = n_gdn * 8.0 * Hv * dk * dv;
}

double lily_cost_decode_bytes(const lily_cost_model *cm, int64_t context)
{
    return cm->weight_bytes + (double)context * cm->kv_bytes_per_position + cm->recurrent_state_bytes +
           cm->conv_state_bytes;
}

double lily_cost_prefill_flops_per_token(const lily_cost_model *cm, int64_t prompt_len)
{
    if (prompt_len < 1)
        prompt_len = 1;
    double mean_positions = ((double)prompt_len + 1.0) / 2.0;
    return cm->matmul_flops_per_token + cm->gdn_flops_per_token + mean_positions * cm->attention_flops_per_position +
           cm->lm_head_flops / (double)prompt_len;
}

double lily_cost_prefill_flops_per_token_all_logits(const lily_cost_model *cm, int64_t prompt_len)
{
    if (prompt_len < 1)
        prompt_len = 1;
    double mean_positions = ((double)prompt_len + 1.0) / 2.0;
    return cm->matmul_flops_per_token + cm->gdn_flops_per_token + mean_positions * cm->attention_flops_per_position +
           cm->lm_head_flops;
}
