/* cuda_shapes.cu — the CUDA backend's up-front shape check (called by cuda_create before any upload):
 * every stage of the layer loop (cuda_forward.cu, forward_prefill.cu) must have a kernel for the model's
 * dimensions at n = 1 (decode), 2..15 (GEMV chunks) and >= 16 (prefill GEMMs), so that an unsupported
 * model fails at load with LILY_ERR_UNSUPPORTED naming the dimension, never with cudaErrorInvalidValue
 * in the middle of a generation. The limits mirror the dispatch tables of the launch wrappers
 * (gemv_cols_supported, moe_route_supported, attention / DeltaNet / norm-rope checks).
 */
#include <stdio.h>

#include "cuda_internal.cuh"

/* Device storage width of a tensor: 4 / 8 kept as stored, plain converted to bf16. */
static int dev_bits(const lily_tensor *t) { return t->bits ? t->bits : 16; }

#define UNSUP(...) lily_error_set(err, LILY_ERR_UNSUPPORTED, "cuda: " __VA_ARGS__)

/* One GEMV batch (matrices that read the same input): same width and columns, a lane shape for them. */
static lily_status check_batch(const lily_tensor *const *ts, int n, const char *where, lily_error *err)
{
    const lily_tensor *t0 = NULL;
    for (int k = 0; k < n; k++) {
        const lily_tensor *t = ts[k];
        if (!t->data)
            continue; /* missing: upload reports it */
        const int bits = dev_bits(t), cols = (int)lily_tensor_cols(t);
        if (!gemv_cols_supported(bits, cols))
            return UNSUP("%s%s: %d columns at %d bits have no GEMV kernel shape (columns / (128 / bits) must be "
                         "4..128 (a power of two) or 3 x 4..32)",
                         where, t->name ? t->name : "?", cols, bits);
        if (!t0) {
            t0 = t;
        } else if (dev_bits(t) != dev_bits(t0) || lily_tensor_cols(t) != lily_tensor_cols(t0)) {
            return UNSUP("%s%s (%d-bit) and %s (%d-bit) share one GEMV launch and must have the same storage "
                         "width and columns",
                         where, t0->name ? t0->name : "?", dev_bits(t0), t->name ? t->name : "?", dev_bits(t));
        }
    }
    return LILY_OK;
}

lily_status cuda_check_shapes(const lily_config *cfg, const lily_weights *w, lily_error *err)
{
    const int H = cfg->hidden;
    if (H <= 0 || H % 64)
        return UNSUP("hidden_size %d is not a multiple of 64", H);
    bool any_attn = false, any_gdn = false;
    for (int l = 0; l < cfg->n_layers; l++) {
        if (cfg->layer_types[l] == LILY_LAYER_FULL_ATTENTION)
            any_attn = true;
        else
            any_gdn = true;
    }

    if (any_attn) {
        const int D = cfg->head_dim, nh = cfg->n_heads, nkv = cfg->n_kv_heads;
        if (D != 64 && D != 128 && D != 256)
            return UNSUP("head_dim %d (the attention kernels take 64, 128 or 256)", D);
        if (nkv <= 0 || nh <= 0 || nh % nkv)
            return UNSUP("num_attention_heads %d is not a multiple of num_key_value_heads %d", nh, nkv);
        if (nh / nkv > 8)
            return UNSUP("%d query heads per KV head (num_attention_heads / num_key_value_heads; at most 8)", nh / nkv);
        if (nh + 2 * nkv > 32)
            return UNSUP("num_attention_heads + 2 * num_key_value_heads = %d (the q/k norm + RoPE kernel takes at "
                         "most 32)",
                         nh + 2 * nkv);
        if (cfg->rotary_dim < 0 || cfg->rotary_dim > D || cfg->rotary_dim % 2)
            return UNSUP("rotary dim %d (must be even and <= head_dim %d)", cfg->rotary_dim, D);
    }
    if (any_gdn) {
        const int dk = cfg->gdn_key_head_dim, dv = cfg->gdn_value_head_dim;
        const int Hk = cfg->gdn_n_key_heads, Hv = cfg->gdn_n_value_heads;
        if (dk != 32 && dk != 64 && dk != 128)
            return UNSUP("linear_key_head_dim %d (the DeltaNet kernels take 32, 64 or 128)", dk);
        if (dv <= 0 || dv % 32 || dv > 512)
            return UNSUP("linear_value_head_dim %d (must be a multiple of 32, at most 512)", dv);
        if (Hk <= 0 || Hv % Hk)
            return UNSUP("linear_num_value_heads %d is not a multiple of linear_num_key_heads %d", Hv, Hk);
        if (cfg->gdn_conv_kernel < 1 || cfg->gdn_conv_kernel > 4)
            return UNSUP("linear_conv_kernel_dim %d (at most 4)", cfg->gdn_conv_kernel);
        if (lily_config_gdn_value_dim(cfg) % 64)
            return UNSUP("DeltaNet value dim %d (heads x head dim) is not a multiple of 64",
                         lily_config_gdn_value_dim(cfg));
    }
    const int E = cfg->n_experts, K = cfg->n_experts_used;
    if (K < 1 || K > 16)
        return UNSUP("num_experts_per_tok %d (the MoE kernels take 1..16)", K);
    if (E < K || E > 512)
        return UNSUP("num_experts %d (the MoE kernels take top-k..512)", E);
    if (cfg->moe_intermediate <= 0 || cfg->moe_intermediate % 64 || cfg->shared_intermediate <= 0 ||
        cfg->shared_intermediate % 64)
        return UNSUP("moe_intermediate_size %d / shared_expert_intermediate_size %d (multiples of 64)",
                     cfg->moe_intermediate, cfg->shared_intermediate);

    const lily_tensor *lm[1] = {&w->lm_head};
    lily_status st = check_batch(lm, 1, "", err);
    if (st != LILY_OK)
        return st;
    for (int l = 0; l < w->n_layers && l < cfg->n_layers; l++) {
        const lily_layer_weights *L = &w->layers[l];
        char where[32];
        snprintf(where, sizeof where, "layer %d: ", l);
        if (cfg->layer_types[l] == LILY_LAYER_FULL_ATTENTION) {
            const lily_tensor *qkv[3] = {&L->q_proj, &L->k_proj, &L->v_proj}, *o[1] = {&L->o_proj};
            if ((st = check_batch(qkv, 3, where, err)) != LILY_OK || (st = check_batch(o, 1, where, err)) != LILY_OK)
                return st;
        } else {
            const lily_tensor *in[4] = {&L->in_proj_qkv, &L->in_proj_z, &L->in_proj_b, &L->in_proj_a};
            const lily_tensor *o[1] = {&L->out_proj};
            if ((st = check_batch(in, 4, where, err)) != LILY_OK || (st = check_batch(o, 1, where, err)) != LILY_OK)
                return st;
        }
        const lily_tensor *router[2] = {&L->router, &L->shared_expert_gate};
        if ((st = check_batch(router, 2, where, err)) != LILY_OK)
            return st;
        const lily_tensor *gu[4] = {&L->experts_gate, &L->experts_up, &L->shared_gate, &L->shared_up};
        const lily_tensor *dn[2] = {&L->experts_down, &L->shared_down};
        int gu_bits = 0, dn_bits = 0;
        for (int k = 0; k < 4; k++) {
            if (!gu[k]->data)
                continue;
            if (gu_bits && dev_bits(gu[k]) != gu_bits)
                return UNSUP("layer %d: the routed and shared experts' gate/up projections differ in storage width", l);
            gu_bits = dev_bits(gu[k]);
        }
        for (int k = 0; k < 2; k++) {
            if (!dn[k]->data)
                continue;
            if (dn_bits && dev_bits(dn[k]) != dn_bits)
                return UNSUP("layer %d: the routed and shared experts' down projections differ in storage width", l);
            dn_bits = dev_bits(dn[k]);
        }
        if (gu_bits && dn_bits &&
            !moe_route_supported(gu_bits, dn_bits, H, cfg->moe_intermediate, cfg->shared_intermediate, E, K))
            return UNSUP("layer %d: no MoE kernel shape for hidden %d (%d-bit gate/up) with moe_intermediate %d / "
                         "shared_expert_intermediate %d (%d-bit down)",
                         l, H, gu_bits, cfg->moe_intermediate, cfg->shared_intermediate, dn_bits);
    }
    return LILY_OK;
}
