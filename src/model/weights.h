/* weights.h — the model's tensors, bound by name from a checkpoint (MODEL.md §2).
 *
 * Owns: lily_tensor (a typed handle to weights that stay where the loader mapped them, quantized or
 * not), lily_weights (every tensor of the text decoder, per layer), and binding them from the HF bf16
 * and MLX 4/8-bit layouts with shape/dtype checks that name the tensor, the expected and the actual value.
 * Does not own: the file mapping (safetensors.h) or the math (backends).
 */
#ifndef LILY_WEIGHTS_H
#define LILY_WEIGHTS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"
#include "config.h"
#include "lily.h"

/* A weight tensor as a backend sees it.
 *
 * Logical shape: [rows, cols] for a matrix (rows = out features, cols = in features), or
 * [n_experts, rows, cols] for stacked expert weights, or [n] for vectors. `cols` is always the
 * unpacked input dimension, whatever the storage.
 *
 * Plain (bits == 0): `data` holds rows of `cols` elements of `dtype` (F32, F16 or BF16).
 * Quantized (bits == 4 or 8, MLX affine, MODEL.md §3): `data` holds uint32 words, cols*bits/32 per row,
 * element j of a word at bits [bits*j, bits*j+bits) from the least-significant end; `scales` and `biases`
 * hold cols/group_size values per row in `scale_dtype`; w = float(scale) * q + float(bias).
 *
 * Row r of expert e lives at physical row e * expert_stride + r of data/scales/biases (expert_stride
 * == rows unless the tensor is a view into a fused HF gate_up_proj, where it is 2 * rows).
 * `row_bytes`, `scale_row_bytes`: bytes between consecutive physical rows. */
typedef struct {
    const char *name;         /* checkpoint name (of .weight when quantized); NULL when absent */
    const void *data;
    lily_dtype dtype;         /* storage dtype of data: F32/F16/BF16, or U32 when quantized */
    int ndim;                 /* 1, 2 or 3 */
    int64_t shape[3];         /* logical, see above */
    int bits;                 /* 0 (plain), 4 or 8 */
    int group_size;           /* 64 when quantized */
    const void *scales, *biases;
    lily_dtype scale_dtype;   /* BF16 in MLX checkpoints */
    int64_t expert_stride;    /* physical rows between experts (3-D only) */
    int64_t row_bytes;
    int64_t scale_row_bytes;
} lily_tensor;

static inline int64_t lily_tensor_rows(const lily_tensor *t) { return t->ndim == 1 ? 1 : t->shape[t->ndim - 2]; }
static inline int64_t lily_tensor_cols(const lily_tensor *t) { return t->shape[t->ndim - 1]; }
/* Bytes the tensor occupies (data + scales + biases) for one expert (or the whole tensor when 2-D/1-D). */
int64_t lily_tensor_bytes_per_matrix(const lily_tensor *t);

/* Weights of one decoder layer. Fields of the other mixer kind have data == NULL. */
typedef struct {
    lily_tensor input_norm;        /* [hidden] */
    lily_tensor post_attention_norm; /* [hidden] */

    /* gated full attention (MODEL.md §4.3) */
    lily_tensor q_proj;            /* [n_heads * head_dim * 2, hidden]: per head [query(head_dim), gate(head_dim)] */
    lily_tensor k_proj, v_proj;    /* [n_kv_heads * head_dim, hidden] */
    lily_tensor o_proj;            /* [hidden, n_heads * head_dim] */
    lily_tensor q_norm, k_norm;    /* [head_dim] */

    /* Gated DeltaNet (MODEL.md §4.4) */
    lily_tensor in_proj_qkv;       /* [conv_dim, hidden]: [q | k | v], head-major */
    lily_tensor in_proj_z;         /* [value_dim, hidden] */
    lily_tensor in_proj_b, in_proj_a; /* [Hv, hidden] */
    lily_tensor conv1d;            /* [conv_dim, K] (HF [C,1,K] and MLX [C,K,1] have this memory layout); tap K-1 = current token */
    lily_tensor dt_bias, A_log;    /* [Hv] */
    lily_tensor gdn_norm;          /* [dv], plain weight (never 1 + w) */
    lily_tensor out_proj;          /* [hidden, value_dim] */

    /* sparse MoE (MODEL.md §4.5) */
    lily_tensor router;            /* [n_experts, hidden] (8-bit in MLX) */
    lily_tensor experts_gate;      /* [n_experts, moe_intermediate, hidden] */
    lily_tensor experts_up;        /* [n_experts, moe_intermediate, hidden] */
    lily_tensor experts_down;      /* [n_experts, hidden, moe_intermediate] */
    lily_tensor shared_gate, shared_up; /* [shared_intermediate, hidden] */
    lily_tensor shared_down;       /* [hidden, shared_intermediate] */
    lily_tensor shared_expert_gate;/* [1, hidden] (8-bit in MLX) */
} lily_layer_weights;

typedef enum { LILY_LAYOUT_HF = 0, LILY_LAYOUT_MLX = 1 } lily_layout;

struct lily_checkpoint; /* safetensors.h */

typedef struct {
    lily_layout layout;
    /* true for HF checkpoints: input/post-attention/final/q/k norms hold w and the model uses (1 + w),
     * formed in fp32. false for MLX: the file already holds (1 + w). gdn_norm is plain in both. */
    bool norms_zero_centred;
    int quant_bits;                /* bits of the bulk of the weights: 0 (plain), 4 or 8 */
    lily_tensor embed;             /* [vocab, hidden] */
    lily_tensor final_norm;        /* [hidden] */
    lily_tensor lm_head;           /* [vocab, hidden] */
    int n_layers;
    lily_layer_weights *layers;    /* [n_layers] */
    void *owned;                   /* buffers made at bind time (per-expert HF tensors stacked); freed with the weights */
} lily_weights;

/* Bind every tensor the config requires from an opened checkpoint. Detects the layout (MLX when
 * `.scales` siblings exist; norm convention from the conv1d shape, MODEL.md §2.3). Skips vision_tower.*,
 * model.visual.* and mtp.*. Errors: LILY_ERR_MODEL naming the tensor and the expected and actual
 * shape/dtype; LILY_ERR_MODEL naming the tensor (its .scales / .biases when quantized) and the element
 * when a float value is NaN or infinite (every element is read once: norms, biases, scales and plain
 * BF16/F16/F32 weights); LILY_ERR_OUT_OF_MEMORY. On error *w is left empty (safe to free). */
lily_status lily_weights_bind(const lily_config *cfg, const struct lily_checkpoint *ckpt, lily_weights *w,
                              lily_error *err);
void lily_weights_free(lily_weights *w);

/* Dequantize (or widen) `n_cols` consecutive elements of logical row `row` of expert `expert` (0 for 2-D)
 * starting at column `col0` into out (fp32), exactly: float(scale) * q + float(bias). col0 and n_cols
 * must be multiples of group_size when quantized. */
void lily_tensor_dequant_row(const lily_tensor *t, int64_t expert, int64_t row, int64_t col0, int64_t n_cols,
                             float *out);

#endif
