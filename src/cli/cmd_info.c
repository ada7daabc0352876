/* cmd_info.c — `lily info [--model DIR]`: what a model directory holds, without running it.
 *
 * Owns: the printout of the config summary, the detected layout and quantization (with the per-module
 * bit overrides found in the tensors), and the tensor count and bytes by dtype. Loads through the same
 * config/checkpoint/weights code as every other command, so a directory `info` accepts will load.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cli_common.h"
#include "commands.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: lily info [--model DIR]\n\n"
               "Prints the config summary, checkpoint layout (hf/mlx), quantization and tensor bytes of DIR.\n"
               "  -m, --model DIR   model directory (config.json + *.safetensors; default: $LILY_MODEL, else the\n"
               "                    bundled model)\n");
}

/* The per-layer tensors by field, for the quantization summary. */
static const struct { size_t offset; const char *name; } layer_fields[] = {
#define F(x) {offsetof(lily_layer_weights, x), #x}
    F(input_norm), F(post_attention_norm), F(q_proj), F(k_proj), F(v_proj), F(o_proj), F(q_norm), F(k_norm),
    F(in_proj_qkv), F(in_proj_z), F(in_proj_b), F(in_proj_a), F(conv1d), F(dt_bias), F(A_log), F(gdn_norm),
    F(out_proj), F(router), F(experts_gate), F(experts_up), F(experts_down), F(shared_gate), F(shared_up),
    F(shared_down), F(shared_expert_gate),
#undef F
};
#define N_LAYER_FIELDS (sizeof layer_fields / sizeof layer_fields[0])

static void print_quantization(const lily_config *cfg, const lily_weights *w)
{
    if (w->quant_bits == 0 && w->embed.bits == 0) {
        printf("quantization none (weights %s)\n", lily_dtype_name(w->embed.dtype));
        return;
    }
    printf("quantization %d-bit affine, group_size %d (config: %d-bit, group_size %d)\n", w->quant_bits,
           w->embed.group_size ? w->embed.group_size : w->layers[0].experts_gate.group_size, cfg->quant_bits,
           cfg->quant_group_size);
    /* Tensors whose width differs from the bulk, grouped by field: "router 8-bit x4". */
    for (size_t f = 0; f < N_LAYER_FIELDS; f++) {
        int count[9] = {0}, group = 0;
        for (int i = 0; i < w->n_layers; i++) {
            const lily_tensor *t = (const lily_tensor *)((const char *)&w->layers[i] + layer_fields[f].offset);
            /* vectors and the conv1d are never quantized (nn.Conv1d has no to_quantized) */
            if (t->data && t->ndim >= 2 && t != &w->layers[i].conv1d && t->bits != w->quant_bits && t->bits <= 8) {
                count[t->bits]++;
                group = t->group_size;
            }
        }
        for (int bits = 0; bits <= 8; bits++) {
            if (!count[bits])
                continue;
            if (bits)
                printf("  override   %-20s %d-bit in %d layer(s), group_size %d\n", layer_fields[f].name, bits,
                       count[bits], group);
            else
                printf("  override   %-20s unquantized in %d layer(s)\n", layer_fields[f].name, count[bits]);
        }
    }
    const struct { const char *name; const lily_tensor *t; } globals[] = {{"embed", &w->embed}, {"lm_head", &w->lm_head}};
    for (int g = 0; g < 2; g++)
        if (globals[g].t->bits != w->quant_bits)
            printf("  override   %-20s %d-bit\n", globals[g].name, globals[g].t->bits);
}

int cmd_info(int argc, char **argv)
{
    const char *model_dir = NULL;
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "--model") || !strcmp(argv[i], "-m")) && i + 1 < argc) {
            model_dir = argv[++i];
        } else if (!strncmp(argv[i], "--model=", 8)) {
            model_dir = argv[i] + 8;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--model") || !strcmp(argv[i], "-m")) {
            fprintf(stderr, "lily info: %s needs a value\n", argv[i]);
            usage(stderr);
            return 2;
        } else {
            cli_unknown_argument("info", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!model_dir) {
        bool is_test_model;
        model_dir = cli_default_model("info", &is_test_model);
    }

    lily_error err = {0};
    lily_config cfg;
    lily_checkpoint ckpt;
    lily_weights w;
    if (lily_config_load(model_dir, &cfg, &err) != LILY_OK) {
        fprintf(stderr, "lily info: %s\n", err.message);
        return 1;
    }
    if (lily_checkpoint_open(model_dir, &ckpt, &err) != LILY_OK) {
        fprintf(stderr, "lily info: %s\n", err.message);
        return 1;
    }
    if (lily_weights_bind(&cfg, &ckpt, &w, &err) != LILY_OK) {
        fprintf(stderr, "lily info: %s: %s\n", model_dir, err.message);
        lily_checkpoint_close(&ckpt);
        return 1;
    }

    int n_full = lily_config_n_full_attention_layers(&cfg);
    printf("model        %s\n", model_dir);
    printf("layers       %d (%d linear_attention, %d full_attention)\n", cfg.n_layers, cfg.n_layers - n_full, n_full);
    printf("hidden       %d, vocab %d, rms_norm_eps %g, max_position_embeddings %d\n", cfg.hidden, cfg.vocab_size,
           cfg.rms_norm_eps, cfg.max_position_embeddings);
    printf("attention    %d heads, %d kv heads, head_dim %d\n", cfg.n_heads, cfg.n_kv_heads, cfg.head_dim);
    printf("rope         rope_theta %g, partial_rotary_factor %g, rotary_dim %d\n", cfg.rope_theta,
           cfg.partial_rotary_factor, cfg.rotary_dim);
    printf("deltanet     %d key heads x %d, %d value heads x %d, conv kernel %d, conv_dim %d\n", cfg.gdn_n_key_heads,
           cfg.gdn_key_head_dim, cfg.gdn_n_value_heads, cfg.gdn_value_head_dim, cfg.gdn_conv_kernel,
           lily_config_gdn_conv_dim(&cfg));
    printf("moe          %d experts, top-%d, moe_intermediate %d, shared_intermediate %d, norm_topk_prob %s\n",
           cfg.n_experts, cfg.n_experts_used, cfg.moe_intermediate, cfg.shared_intermediate,
           cfg.norm_topk_prob ? "true" : "false");
    printf("tokens       bos %d, stop ids", cfg.bos_token_id);
    for (int i = 0; i < cfg.n_stop_ids; i++)
        printf(" %d", cfg.stop_ids[i]);
    printf("%s\n", cfg.n_stop_ids ? "" : " (none)");
    printf("layout       %s (norms %s)\n", w.layout == LILY_LAYOUT_MLX ? "mlx" : "hf",
           w.norms_zero_centred ? "zero-centred: the model uses 1 + w" : "stored as 1 + w");
    print_quantization(&cfg, &w);

    uint64_t by_dtype[LILY_DTYPE_BOOL + 1] = {0}, total = 0;
    for (int i = 0; i < ckpt.n_tensors; i++) {
        by_dtype[ckpt.tensors[i].dtype] += ckpt.tensors[i].nbytes;
        total += ckpt.tensors[i].nbytes;
    }
    printf("tensors      %d in %d file(s)\n", ckpt.n_tensors, ckpt.n_shards);
    printf("bytes       ");
    for (int d = 0; d <= LILY_DTYPE_BOOL; d++)
        if (by_dtype[d])
            printf(" %s %llu", lily_dtype_name((lily_dtype)d), (unsigned long long)by_dtype[d]);
    printf("\ntotal        %llu bytes (%.2f MiB)\n", (unsigned long long)total, (double)total / (1024.0 * 1024));

    lily_weights_free(&w);
    lily_checkpoint_close(&ckpt);
    return 0;
}
