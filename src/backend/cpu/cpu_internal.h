/* cpu_internal.h — what the CPU backend's stage files share: the backend context, the session state,
 * and the kernels of each stage (MODEL.md §4). Exact mode: fp32 activations, weights dequantized exactly
 * (the reference). Fast mode (the default): the same, except that the linear layers with 4/8-bit weights
 * run as integer dot products on int8-quantized activations (matmul_fast.c, quant_dot.h).
 *
 * Owns: the shapes of the scratch buffers (sized by max_chunk at create time) and of the state.
 * The files: matmul.c (linear layers), matmul_fast.c and quant_*.c (fast mode), norm_rope.c, attention.c, gated_deltanet.c, moe.c, and
 * cpu_backend.c (create/destroy, state, the per-layer loop).
 */
#ifndef LILY_CPU_INTERNAL_H
#define LILY_CPU_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "quant_dot.h"
#include "threadpool.h"

/* Fast-mode loops written on GCC/Clang 8-float vectors (attention_fast.c, gdn_step_fast.c) get a second
 * copy built for AVX2, picked at load time where the CPU has it (one 256-bit operation per vector instead
 * of two SSE halves). AVX2 without FMA: the same IEEE operations per lane, so both copies give the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#define CPU_VEC8_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CPU_VEC8_CLONES
#endif

/* ---- weights made fp32 once at create time (all small vectors) ---------------------------------- */
typedef struct {
    float *input_norm, *post_attention_norm; /* [hidden]: the effective weight (1 + w in fp32 for HF) */
    float *q_norm, *k_norm;                  /* [head_dim] effective weight (full-attention layers) */
    float *conv1d;                           /* [conv_dim, K] (Gated DeltaNet layers) */
    float *neg_exp_A;                        /* [Hv]: -exp(A_log) */
    float *dt_bias;                          /* [Hv] */
    float *gdn_norm;                         /* [dv], plain weight */
} cpu_layer_params;

/* ---- the stage profile (cpu_profile.c; lily_backend_options.profile) ------------------------------ */
/* forward()'s stages, in the order the profile lists them. A mark closes the interval since the previous
 * one (or since forward() began) and adds it to its stage: marks sit right after each pool pass and each
 * serial step, so the serial glue between passes is a stage of its own. */
typedef enum {
    CPU_STAGE_EMBED,
    CPU_STAGE_NORM,          /* the residual adds and the RMSNorms after them (the layers' input and
                              * post-attention norms, the final one) */
    CPU_STAGE_QUANTIZE,      /* fast mode: a matmul's input to int8 and its per-group sums */
    CPU_STAGE_GDN_IN_PROJ,
    CPU_STAGE_GDN_CONV,      /* causal conv + SiLU, conv state update */
    CPU_STAGE_GDN_QK_GATES,  /* q/k L2 norms, gates */
    CPU_STAGE_GDN_DELTA,     /* the delta rule */
    CPU_STAGE_GDN_NORM,      /* gated RMSNorm */
    CPU_STAGE_GDN_OUT_PROJ,
    CPU_STAGE_ATTN_IN_PROJ,
    CPU_STAGE_ATTN_PREP,     /* q/gate split, q/k norms, RoPE, KV cache append */
    CPU_STAGE_ATTN_CORE,     /* softmax(q kᵀ) v and the output gate */
    CPU_STAGE_ATTN_O_PROJ,
    CPU_STAGE_MOE_ROUTER,    /* router (+ fast mode: shared expert gate/up and its gate logit) */
    CPU_STAGE_MOE_TOPK,      /* softmax, top-k, grouping by expert (the grouping serial) */
    CPU_STAGE_MOE_GATHER,    /* fast mode: quantized rows gathered by expert */
    CPU_STAGE_MOE_GATE_UP,   /* fast mode: routed experts' gate/up + SwiGLU */
    CPU_STAGE_MOE_DOWN,      /* fast mode: routed experts' down projection */
    CPU_STAGE_MOE_COMBINE,   /* the routed outputs' weighted sum */
    CPU_STAGE_MOE_EXPERTS,   /* exact mode: the routed experts, expert by expert */
    CPU_STAGE_MOE_SHARED,    /* shared expert: (exact: gate/up,) SwiGLU, down */
    CPU_STAGE_MOE_SHARED_ADD,/* its gated add */
    CPU_STAGE_LM_HEAD,
    CPU_STAGE_COUNT
} cpu_stage;

typedef struct {
    int64_t last_ns;                 /* CLOCK_MONOTONIC at the last mark */
    int64_t forward_start_ns;
    int64_t ns[CPU_STAGE_COUNT];
    int64_t calls[CPU_STAGE_COUNT];
    int64_t forward_ns, forwards;
} cpu_profile;

/* ---- the backend context --------------------------------------------------------------------- */
typedef struct {
    const lily_config *cfg;
    const lily_weights *w;
    lily_threadpool *pool;
    int n_threads;
    int max_chunk;
    bool matmul_inputs_f16; /* lily_backend_options.cpu_matmul_inputs_f16 (exact mode) */
    bool exact;             /* lily_backend_options.exact: every linear layer on the fp32 reference path */
    const cpu_qdot_kernels *qdot; /* fast mode's integer kernels for this CPU (quant_dot_dispatch.c) */
    cpu_qact qact;          /* [mc, widest input] the quantized input of the current fast-mode matmul */
    float *qgsum;           /* [mc, widest input / 32] its sums per weight group */
    lily_debug_hook debug_hook;
    void *debug_user;
    cpu_profile *prof;      /* the stage sums (lily_backend_options.profile), NULL when off */

    cpu_layer_params *layers; /* [n_layers] */
    float *final_norm;        /* [hidden] effective weight */
    float *rope_inv_freq;     /* [rotary_dim / 2] */

    /* residual stream and per-layer scratch, all [max_chunk, ...] */
    float *hidden;            /* [mc, hidden] residual stream h */
    float *normed;            /* [mc, hidden] norm output */
    float *mixer_out;         /* [mc, hidden] attention / deltanet output */
    float *moe_out;           /* [mc, hidden] */

    /* gated attention */
    float *attn_qg;           /* [mc, n_heads * head_dim * 2] q_proj output: per head [query, gate] */
    float *attn_q;            /* [mc, n_heads * head_dim] */
    float *attn_k, *attn_v;   /* [mc, n_kv_heads * head_dim] */
    float *attn_o;            /* [mc, n_heads * head_dim] */

    /* Gated DeltaNet */
    float *gdn_mixed;         /* [mc, conv_dim] in_proj_qkv output (pre-conv) */
    float *gdn_conv;          /* [mc, conv_dim] conv + SiLU output: q | k | v */
    float *gdn_z;             /* [mc, value_dim] */
    float *gdn_b, *gdn_a;     /* [mc, Hv] */
    float *gdn_g, *gdn_beta;  /* [mc, Hv] log-decay and beta */
    float *gdn_o;             /* [mc, value_dim] delta-rule output, then gated norm output */
    float *gdn_chunk_scratch; /* [n_threads, gdn_chunk_scratch_floats] */
    int64_t gdn_chunk_scratch_floats;
    bool deltanet_chunked;    /* chunked delta rule for n > 1 (lily_backend_options) */

    /* sparse MoE */
    float *router_probs;      /* [mc, n_experts] */
    int *topk_ids;            /* [mc, top_k] */
    float *topk_weights;      /* [mc, top_k] */
    int *expert_count;        /* [n_experts] */
    int *expert_offset;       /* [n_experts + 1] */
    int *expert_rows;         /* [mc * top_k] (token, slot) pairs grouped by expert: token * top_k + slot */
    float *moe_x;             /* [mc, hidden] rows gathered for one expert */
    float *moe_gate, *moe_up; /* [mc, max(moe_intermediate, shared_intermediate)] */
    float *moe_y;             /* [mc, hidden] */
    float *shared_gate_logit; /* [mc] */
    /* fast mode's routed experts (moe_fast.c), rows grouped by expert as expert_rows orders them */
    int *moe_active;          /* [n_experts] the experts with rows in this chunk, ascending */
    int *moe_slot_row;        /* [mc * top_k] the grouped row of each (token, slot) pair: expert_rows inverted */
    cpu_qact moe_qx;          /* [mc * top_k, hidden] quantized input rows */
    cpu_qact moe_qh;          /* [mc * top_k, moe_intermediate] quantized silu(gate) ⊙ up */
    float *moe_gsum;          /* [mc * top_k, max(hidden, moe_intermediate) / 32] per-group sums */
    float *moe_h, *moe_u;     /* [mc * top_k, moe_intermediate] */
    float *moe_yk;            /* [mc * top_k, hidden] */
} cpu_ctx;

/* ---- the session state ----------------------------------------------------------------------- */
typedef struct {
    int max_ctx;
    int position;
    float **k_cache, **v_cache; /* per layer: [max_ctx, n_kv_heads * head_dim] (full-attention layers) */
    float **conv_state;         /* per layer: [K - 1, conv_dim] last pre-conv rows, oldest first (GDN) */
    float **recurrent_state;    /* per layer: [Hv, dk, dv] fp32 (GDN) */
    float *attn_scores;         /* [n_threads, max_ctx] scratch */
    /* fast-mode decode attention (attention_fast.c), when cpu_attention_fast_ok(head_dim) and not exact */
    float *attn_dec_scores;     /* [n_heads, max_ctx] each query head's e_s */
    float *attn_dec_part;       /* [n_heads, CPU_ATTN_DECODE_MAX_CHUNKS, CPU_ATTN_DECODE_PART(head_dim)]
                                 * chunk partials per query head (decode) */
    int *attn_dec_done;         /* [n_heads] decode: chunks finished per (KV head, block of its query heads) */
    float *attn_pre_part;       /* [n_threads, group, CPU_ATTN_DECODE_MAX_CHUNKS, CPU_ATTN_DECODE_PART(head_dim)]
                                 * prefill (fast mode): the chunk partials of the token a thread is on, for the
                                 * group = n_heads / n_kv_heads query heads of a KV head */
    float *attn_pre_scores;     /* [n_threads, group, attn_pre_scores_stride] prefill: their chunk's e_s */
    int attn_pre_scores_stride; /* the longest chunk of keys (cpu_attention_decode_split for max_ctx keys) */
} cpu_state;

/* ---- cpu_profile.c ----------------------------------------------------------------------------- */
void cpu_prof_mark_now(cpu_profile *p, cpu_stage stage);
/* Close the interval since the last mark into `stage` (nothing when profiling is off: one test). */
static inline void cpu_prof_mark(const cpu_ctx *c, cpu_stage stage)
{
    if (c->prof)
        cpu_prof_mark_now(c->prof, stage);
}
/* forward()'s start and end. */
void cpu_prof_forward_begin(cpu_profile *p);
void cpu_prof_forward_end(cpu_profile *p);
/* lily_backend_ops.profile_take. */
void cpu_profile_take(void *ctx, lily_stage_profile *out);

/* ---- token_rows.c ------------------------------------------------------------------------------- */
/* fn(arg, r0, r1) over row blocks [r0, r1) covering [0, n): over c->pool for 16 rows or more (about two
 * blocks per thread), else one call on the caller. fn must treat rows independently. */
typedef void (*cpu_rows_fn)(void *arg, int r0, int r1);
void cpu_parallel_rows(const cpu_ctx *c, int n, cpu_rows_fn fn, void *arg);
/* c->hidden [n, hidden] = the embedding rows of tokens[0..n-1] (exact dequantization). */
void cpu_embed_rows(const cpu_ctx *c, const int32_t *tokens, int n);
/* Per row t < n of dim: h[t] += x[t] (x NULL: nothing added), then out[t] = cpu_rmsnorm(h[t], weight). */
void cpu_add_rmsnorm_rows(const cpu_ctx *c, float *h, const float *x, const float *weight, int n, int dim, float eps,
                          float *out);

/* ---- matmul.c ---------------------------------------------------------------------------------- */
/* The widest input dimension a linear layer may have (a task's dequantized block lives on its stack). */
#define CPU_MATMUL_MAX_COLS 16384

/* Dequantize (or widen) rows [row0, row0 + n_rows) of expert `expert` (0 for 2-D) of w into
 * out [n_rows, cols] fp32, exactly: float(scale) * q + float(bias) (MODEL.md §3). */
void cpu_dequant_rows(const lily_tensor *w, int64_t expert, int64_t row0, int n_rows, float *out);

/* y[n, rows] = x[n, cols] · W[expert]ᵀ with W any lily_tensor (F32/F16/BF16 or 4/8-bit affine), fp32
 * accumulation, on c->pool. Work is split over output rows; each block of weight rows is dequantized
 * once and reused for all n token rows. With c->matmul_inputs_f16 every x value is first rounded to
 * fp16 (a precision study, lily_backend_options.cpu_matmul_inputs_f16). */
void cpu_matmul_expert(const cpu_ctx *c, const lily_tensor *w, int64_t expert, const float *x, int n, float *y);
/* The 2-D case: y[n, rows] = x[n, cols] · Wᵀ. */
void cpu_matmul(const cpu_ctx *c, const lily_tensor *w, const float *x, int n, float *y);
/* In fast mode cpu_matmul_expert() quantizes x into c->qact and runs these when cpu_matmul_fast_ok():
 * w is 4- or 8-bit affine with groups and columns multiples of 32, and c is not exact. */
bool cpu_matmul_fast_ok(const cpu_ctx *c, const lily_tensor *w);
/* y[n, rows] = a[n, cols] · W[expert]ᵀ (+ the affine bias), a quantized by cpu_quantize_act(); fp32 out.
 * Rows are split over c->pool; uses c->qgsum as scratch, so a must not be c->qgsum's user elsewhere. */
void cpu_qmatmul_expert(const cpu_ctx *c, const lily_tensor *w, int64_t expert, const cpu_qact *a, int n, float *y);
/* The piece one task runs: weight rows [row0, row1) of W[expert] against activation rows t0 .. t0 + n - 1
 * of a, into y[i * ldy + (r - row0)] for the i-th row; gsum [rows of a, cols / group]: Σ x per weight
 * group (cpu_qact_group_sums). Each weight row is read once and serves every token tile. */
void cpu_qmatmul_rows(const cpu_qdot_kernels *kern, const lily_tensor *w, int64_t expert, int64_t row0, int64_t row1,
                      const cpu_qact *a, int t0, int n, const float *gsum, float *y, int64_t ldy);
/* The most matrices cpu_matmul_many() runs in one pass over the pool. */
#define CPU_MATMUL_MANY_MAX 4
/* y[i][n, rows_i] = x[n, cols] · w[i]ᵀ for i < m (2-D weights, every w[i] with cols inputs), the same
 * values as m cpu_matmul() calls: in fast mode the matrices that share the int8 path and group size
 * quantize x once and split their rows over the pool as one task list (one parallel_for instead of m,
 * the small ones balanced with the large). Returns whether c->qact holds x quantized (cols inputs) on
 * return, for a caller that multiplies x by more int8-path matrices (the last run of matrices took it). */
bool cpu_matmul_many(const cpu_ctx *c, int m, const lily_tensor *const *w, const float *x, int n, float *const *y);
/* cpu_quantize_act() of x [n, cols] into a, the rows split over c->pool when there are many (prefill);
 * the same values either way. */
void cpu_quantize_act_rows(const cpu_ctx *c, const float *x, int n, int64_t cols, cpu_qact *a);
/* gsum[t, g] = Σ x over weight group g (of `group` values) of row t, t < n, from a's block sums. */
void cpu_qact_group_sums(const cpu_qact *a, int n, int group, float *gsum);
/* Rows of a weight matrix one task takes for n tokens (a mean where experts take different counts): for
 * one token about 4 tasks per thread and at most 64 rows (unless that makes more than ~16 tasks per
 * thread), for several about 2 tasks per thread and at most 256 rows; a multiple of CPU_QROWS. */
int cpu_qmatmul_block_rows(const cpu_ctx *c, int64_t rows, int n);

/* ---- norm_rope.c ------------------------------------------------------------------------------- */
/* out[t] = x[t] * rsqrt(mean(x[t]²) + eps) * weight, per row of dim, in fp32 (in place allowed).
 * weight is the effective weight (1 + w already formed for zero-centred norms). */
void cpu_rmsnorm(const float *x, const float *weight, int n_rows, int dim, float eps, float *out);
/* inv_freq[i] = theta^(-2i/rotary_dim), i < rotary_dim / 2, computed in fp32 as transformers does. */
void cpu_rope_inv_freq(int rotary_dim, float theta, float *inv_freq);
/* Rotate-half RoPE in place on the first rotary_dim dims of each head of x [n_tokens, n_heads,
 * head_dim] (row stride `stride` floats between tokens); token t is at position pos0 + t. */
void cpu_rope(float *x, int n_tokens, int stride, int n_heads, int head_dim, int rotary_dim, int pos0,
              const float *inv_freq);
static inline float cpu_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float cpu_silu(float x) { return x / (1.0f + expf(-x)); }

/* ---- attention.c ------------------------------------------------------------------------------- */
/* Gated full attention of one layer (MODEL.md §4.3) for n tokens at st->position:
 * x [n, hidden] (normed) -> out [n, hidden]; appends k, v to the layer's KV cache. */
void cpu_attention_forward(cpu_ctx *c, int layer, cpu_state *st, const float *x, int n, float *out);
/* Exact mode's causal softmax attention of one query head (the reference for the fast paths), serial fp32
 * sums in key / dimension order; the same arguments as cpu_attention_head_fast below. */
void cpu_attention_head_exact(const float *q, int q_stride, const float *k_cache, const float *v_cache, int kv_stride,
                              int n, int pos0, int hd, float scale, float *scores, float *o, int o_stride);

/* ---- attention_fast.c -------------------------------------------------------------------------- */
/* Whether fast mode's attention handles this head size (a multiple of 8). */
bool cpu_attention_fast_ok(int head_dim);
/* Decode (one query token) in fast mode: the G query heads of a KV head share each K and V row, and the
 * keys are split into chunks merged as in split-KV (flash-decoding) softmax: chunk c keeps its maximum
 * m_c, l_c = Σ_s exp(score_s - m_c) and acc_c = Σ_s exp(score_s - m_c) v_s; then with M = max_c m_c,
 * o = Σ_c exp(m_c - M) acc_c / Σ_c exp(m_c - M) l_c. Chunks: at most CPU_ATTN_DECODE_MAX_CHUNKS of at least
 * CPU_ATTN_DECODE_MIN_CHUNK_FLOATS / head_dim keys (32 KiB of K rows: a task big enough to outweigh its
 * dispatch), from the key count and head size alone (the result does not depend on the threads). */
#define CPU_ATTN_DECODE_MAX_CHUNKS 64
#define CPU_ATTN_DECODE_MIN_CHUNK_FLOATS 8192
/* Floats of one (head, chunk) partial: acc [hd], then m, l (padded to a multiple of 8). */
#define CPU_ATTN_DECODE_PART(hd) ((hd) + 8)
/* The chunks of n_keys >= 1 keys of head size hd: returns their count; *chunk_len = keys per chunk (the last
 * may have fewer). */
int cpu_attention_decode_split(int n_keys, int hd, int *chunk_len);
/* One chunk, keys key0 .. key0 + n_keys - 1, of the `group` query heads q [group, hd] (contiguous) of one
 * KV head: k_cache, v_cache rows s of hd at kv_stride (the KV head already offset). Head g's scores are
 * computed in 8 lanes per key (the same bits however the keys are tiled, and whatever the group); writes
 * e_s into scores[g * scores_stride + s - key0] (scratch, from the chunk's first key) and acc, m, l into
 * part + g * part_stride (CPU_ATTN_DECODE_PART(hd) floats).
 * hd a multiple of 8. */
void cpu_attention_decode_chunk(const float *q, int group, const float *k_cache, const float *v_cache, int kv_stride,
                                int key0, int n_keys, int hd, float scale, float *scores, int64_t scores_stride,
                                float *part, int64_t part_stride);
/* o [hd] = the merge of one head's n_chunks partials at part + c * chunk_stride (formula above). */
void cpu_attention_decode_merge(const float *part, int64_t chunk_stride, int n_chunks, int hd, float *o);

/* One query head, n tokens at positions pos0 .. pos0 + n - 1 (prefill), causal softmax attention in fp32:
 * o[t] = Σ_{s ≤ pos0 + t} softmax_s(q[t] · k[s] · scale) v[s], each token through the chunks and merge above
 * with group 1, so each token's o is the decode path's bit for bit. q [n] rows of hd at q_stride; k_cache,
 * v_cache rows s of hd at kv_stride (this head's KV head already offset); scores: scratch of pos0 + n floats;
 * part: scratch of CPU_ATTN_DECODE_MAX_CHUNKS * CPU_ATTN_DECODE_PART(hd) floats; o [n] rows of hd at o_stride.
 * hd a multiple of 8 (cpu_attention_fast_ok). */
/* The same for the `group` query heads of one KV head together (each K and V row read once for them), token t's
 * heads at q + t * q_stride ([group, hd] contiguous) and o + t * o_stride: every head's output is
 * cpu_attention_head_fast's, bit for bit. scores: scratch of group rows of scores_stride floats, at least the
 * longest chunk cpu_attention_decode_split gives for pos0 + n keys; part: scratch of group *
 * CPU_ATTN_DECODE_MAX_CHUNKS * CPU_ATTN_DECODE_PART(hd) floats. */
void cpu_attention_group_fast(const float *q, int q_stride, int group, const float *k_cache, const float *v_cache,
                              int kv_stride, int n, int pos0, int hd, float scale, float *scores, int64_t scores_stride,
                              float *part, float *o, int o_stride);
void cpu_attention_head_fast(const float *q, int q_stride, const float *k_cache, const float *v_cache, int kv_stride,
                             int n, int pos0, int hd, float scale, float *scores, float *part, float *o, int o_stride);

/* ---- gated_deltanet.c -------------------------------------------------------------------------- */
typedef struct {
    int n_key_heads, n_value_heads; /* Hk, Hv: value head j reads key head j / (Hv / Hk) */
    int key_head_dim, value_head_dim; /* dk, dv */
} cpu_gdn_dims;

/* Floats of per-thread scratch cpu_gdn_delta_rule_chunked() needs. */
int64_t cpu_gdn_chunk_scratch_floats(const cpu_gdn_dims *d);

/* The gated delta rule for n tokens of value head `head`, updating its state in place.
 * q, k: [n] rows of dk at q + t * qk_stride (q L2-normed and scaled by dk^-1/2, k L2-normed)
 * v: [n] rows of dv at v + t * v_stride;  g: log-decay, beta: [n] at g[t * gb_stride]
 * state: [dk, dv] fp32;  out: [n] rows of dv at out + t * out_stride.
 * Chunked: transformers torch_chunk_gated_delta_rule, chunk 64 (MODEL.md §4.4 step 8); scratch is
 * cpu_gdn_chunk_scratch_floats() floats. Recurrent: torch_recurrent_gated_delta_rule (step 7). */
void cpu_gdn_delta_rule_chunked(const float *q, const float *k, int qk_stride, const float *v, int v_stride,
                                const float *g, const float *beta, int gb_stride, int n, int dk, int dv,
                                float *state, float *out, int out_stride, float *scratch);
void cpu_gdn_delta_rule_recurrent(const float *q, const float *k, int qk_stride, const float *v, int v_stride,
                                  const float *g, const float *beta, int gb_stride, int n, int dk, int dv,
                                  float *state, float *out, int out_stride);

/* gdn_step_fast.c: the recurrent form as above, fused into two passes over the state and vectorized (fast
 * mode; fp32, rounding differs from the reference). Needs cpu_gdn_fast_step_ok(dv): dv % 8 == 0 and
 * dv <= CPU_GDN_FAST_MAX_DV. */
#define CPU_GDN_FAST_MAX_DV 1024
bool cpu_gdn_fast_step_ok(int dv);
void cpu_gdn_delta_rule_recurrent_fast(const float *q, const float *k, int qk_stride, const float *v, int v_stride,
                                       const float *g, const float *beta, int gb_stride, int n, int dk, int dv,
                                       float *state, float *out, int out_stride);
/* The same for value columns [col0, col1) only (multiples of 8, col1 <= dv): the state's columns and the
 * output's, with v and out still indexed from column 0; the other columns are not touched. Each column's
 * values are the same as in a whole-row call (the columns do not interact). */
void cpu_gdn_delta_rule_recurrent_fast_cols(const float *q, const float *k, int qk_stride, const float *v, int v_stride,
                                            const float *g, const float *beta, int gb_stride, int n, int dk, int dv,
                                            int col0, int col1, float *state, float *out, int out_stride);

/* Gated DeltaNet of one layer (MODEL.md §4.4) for n tokens: x [n, hidden] (normed) -> out [n, hidden];
 * updates the layer's conv and recurrent state. */
void cpu_gdn_forward(cpu_ctx *c, int layer, cpu_state *st, const float *x, int n, float *out);

/* ---- moe.c ------------------------------------------------------------------------------------- */
/* Router top-k for n rows of probabilities [n, n_experts]: ids [n, k] by descending probability (ties:
 * lower expert id first) and weights [n, k] renormalised to sum 1 when `renormalize`. */
void cpu_moe_top_k(const float *probs, int n, int n_experts, int k, bool renormalize, int *ids, float *weights);

/* Sparse MoE block of one layer (MODEL.md §4.5): x [n, hidden] (normed) -> out [n, hidden]. */
void cpu_moe_forward(cpu_ctx *c, int layer, const float *x, int n, float *out);

/* ---- moe_fast.c -------------------------------------------------------------------------------- */
/* Whether the layer's experts can take the fast path (4/8-bit, fast mode, one group size for gate/up). */
bool cpu_moe_fast_ok(const cpu_ctx *c, const lily_layer_weights *lw);
/* The routed experts' weighted sum into out [n, hidden] for x [n, hidden], after the router has filled
 * topk_weights and the grouping (expert_count, expert_offset, expert_rows). x_in_qact: c->qact already
 * holds x quantized (cpu_quantize_act_rows of the n rows, hidden wide), so it is not quantized again. */
void cpu_moe_experts_fast(cpu_ctx *c, int layer, const float *x, bool x_in_qact, int n, float *out);

#endif
