/* cuda_internal.cuh — the CUDA backend's context and session state, shared by cuda_backend.cu
 * (memory, upload, state, ops table) and cuda_forward.cu (the layer loop, graphs, fast paths).
 */
#ifndef LILY_CUDA_INTERNAL_CUH
#define LILY_CUDA_INTERNAL_CUH

extern "C" {
#include "backend/backend.h"
}
#include "attention/attention.cuh"
#include "cuda_common.cuh"
#include "deltanet/deltanet.cuh"
#include "embed.cuh"
#include "gemm/gemm_prefill.cuh"
#include "gemv/gemv.cuh"
#include "moe/moe.cuh"
#include "sample.cuh"
#include "sampling/sampling.cuh"
#include "state/strided_copy.cuh"

/* Split-KV for decode: each KV head's keys are cut into at most ATT_SPLITS chunks of at least
 * ATT_MIN_CHUNK keys (measured on the H200: see docs/BENCHMARKS.md). */
#define ATT_SPLITS_DEFAULT 64
#define ATT_MIN_CHUNK_DEFAULT 128

/* Forward calls of at least this many tokens run the projections, the MoE block and the all-rows LM
 * head as tensor-core GEMMs (forward_prefill.cu); smaller ones (decode) use the GEMV kernels. */
#define PREFILL_GEMM_MIN_TOKENS 16

/* Rows of the device logits buffer: LILY_LOGITS_ALL of a longer forward call runs the LM head in blocks of
 * this many rows, each copied out before the next ([128, vocab] fp32 is 121 MiB at Qwen3.6's 248,320). */
#define LOGITS_BLOCK_ROWS 128

typedef struct {
    bool full_attention;
    float *input_norm, *post_norm; /* [hidden], (1 + w) form */
    /* attention */
    dmat q_proj, k_proj, v_proj, o_proj;
    float *q_norm, *k_norm;
    /* Gated DeltaNet */
    dmat in_qkv, in_z, in_b, in_a, out_proj;
    float *conv_w, *dt_bias, *A_log, *gdn_norm;
    /* MoE */
    dmat router, shared_expert_gate;
    dmat ex_gate, ex_up, ex_down, sh_gate, sh_up, sh_down;
} cuda_layer;

/* The kernel family of each op whose choice depends on the device, made once at backend creation. */
typedef struct {
    gemm_kernel_id gemm;              /* gemm_kernel_choose */
    attn_prefill_kernel attn_prefill; /* attn_prefill_kernel_choose */
} cuda_kernels;

/* Timeline bench (lily_cuda_timeline_decode): what each stamped kernel of a captured step is. */
#define TL_MAX_KERNELS 320
typedef struct {
    int stage;            /* cuda_forward.cu's stage index */
    int layer;            /* -1: not a layer's */
    double bytes;         /* bytes it moves, less the KV cache */
    double bytes_per_pos; /* KV cache bytes per context position */
} cuda_tl_kernel;

typedef struct {
    lily_config cfg;
    cuda_kernels kernels;
    lily_backend_options opts; /* opts.exact: the exact mode (fp32 KV cache, fp32 kernels only; cuda_forward.cu) */
    size_t kv_elem;            /* bytes per KV cache element: 2 (bf16), 4 (fp32 in exact mode) */
    int device;
    cudaStream_t stream;
    size_t weight_bytes;       /* device memory of the weights */
    size_t host_weight_bytes;  /* host memory of the weights (routed experts of opts.n_cpu_moe layers) */
    void **allocs; /* every weight allocation, freed at destroy */
    int n_allocs, cap_allocs;
    void **host_allocs; /* those in mapped host memory (cudaFreeHost at destroy) */
    int n_host_allocs, cap_host_allocs;
    bool alloc_on_host; /* upload_mat places what it allocates in mapped host memory */
    bool host_experts_cpu; /* decode runs host layers' experts on the CPU (cpu_experts.cu); their pages are
                            * then cacheable, else write-combined (cuda_host_weight_alloc) */
    struct cuda_cpu_experts *cpu_experts; /* cpu_experts.cu's worker and mailbox; NULL when not host_experts_cpu */
    /* prefill staging of host layers' experts (host_weights.cu) */
    void *stage_buf;           /* one layer's experts on the device; NULL: no staging */
    size_t stage_buf_bytes;
    cudaStream_t stage_stream; /* the copies */
    cudaEvent_t stage_free, stage_done;
    int staged_layer;          /* the layer whose experts the buffer receives in this call, or -1 */
    dmat staged_gate, staged_up, staged_down; /* its dmats, pointing into stage_buf */

    dmat embed, lm_head;
    float *final_norm;
    cuda_layer *layers;

    /* scratch for max_chunk tokens */
    int max_chunk;
    int *d_tokens;
    float *h;        /* [C][hidden] residual stream */
    float *proj;     /* [C][proj_stride]: GDN mixed | z | b,a ; attention q(+gate) | k | v */
    int proj_stride;
    float *mix;      /* [C][max(value_dim, n_heads*head_dim)] */
    float *gdn_pre;  /* [C][gdn_prefill_stride]: DeltaNet prefill q|k|v|gates (deltanet_prefill.cu) */
    float *gdn_wy;   /* gdn_chunked_scratch_floats(C, ...): chunked delta rule W|U|Attn|gates (deltanet_chunked.cu),
                      * NULL when the shape has no chunked kernel */
    float *q;        /* [C][n_heads*head_dim] */
    float *router;   /* [C][n_experts + 1] */
    float *hid;      /* [C][top_k + 1][inter] */
    int *topk_idx;
    float *topk_w;
    float *logits;   /* [logits_rows][vocab] */
    int logits_rows; /* LOGITS_BLOCK_ROWS, or max_chunk (when smaller, or with a debug hook) */
    unsigned long long *argmax; /* [C] */
    int att_splits, att_min_chunk;
    float *part_o, *part_ml;
    unsigned int *att_counter;
    int *mark_step;  /* [1] the step counter a marked pass's second delta-rule launch reads (cuda_mark) */
    /* prefill GEMM scratch (forward_prefill.cu) */
    int prefill_min_tokens; /* PREFILL_GEMM_MIN_TOKENS */
    __half *pf_x;    /* gemm_act rows: [pf_x_rows] x cols, pf_x_elems halves in all */
    float *pf_xs, *pf_xscale;
    size_t pf_x_elems, pf_x_rows;
    float *pf_y;     /* [C * (top_k + 1)][hidden]: per-slot expert outputs, then the shared expert's */
    int *pf_gather, *pf_slot_pos;           /* [C * top_k] */
    int *pf_offsets;                         /* [n_experts + 1] */
    int *pf_plan_counts;                     /* [moe_plan_chunks(C)][n_experts]: the multi-block plan's scratch */
    int *pf_tile_expert, *pf_tile_start;     /* [C * top_k + n_experts] */
    int *pf_n_tiles;
    float *h_host;   /* debug hook staging [C][max(hidden, vocab)] */
    float *h_prev;

    long long host_syncs; /* host waits on the device (a test asserts decode adds none per token) */
    sample_workspace sampling; /* the device sampler's buffers (sampling/) */
    int poison_step;      /* tests: the forward call with this step counter gets a NaN hidden state; -1 = none */
    /* timeline (lily_cuda_timeline_decode): while its step graph is captured, tl_buf holds TL_MAX_KERNELS
     * slots of TL_SLOT_WORDS stamps and each decode kernel launched takes the next (tl_k describes it);
     * NULL otherwise (no kernel stamps) */
    unsigned long long *tl_buf;
    int tl_n;
    cuda_tl_kernel tl_k[TL_MAX_KERNELS];
    /* profiling (lily_cuda_profile_decode / lily_cuda_profile_prefill): while one runs, the CUDA events
     * recorded between stages (cuda_forward.cu); NULL otherwise (no events recorded) */
    struct cuda_prof *prof;
} cuda_ctx;

/* Device-side counters of a session: one allocation so graphs read them by pointer. */
typedef struct {
    int pos;         /* tokens processed */
    int step;        /* forward calls (conv-state ping-pong parity, token slot parity) */
    int n_generated; /* tokens written to out_tokens by the decode graph */
    int slots[2];    /* next-step input token slots */
    /* decode MoE top-k as (tag << 32 | payload) words written by moe_gate_up_mma and polled by
     * moe_down_mma before its PDL wait (early ids; tag from step and layer, moe_decode.cu);
     * zero after a reset or load, copied with the counters (tags never ahead of step) */
    __align__(128) unsigned long long moe_topk_pub[MOE_PUB_WORDS];
    /* decode router logits as (tag << 32 | bits) words written and polled by moe_gate_up_mma when the
     * router is fused into it (moe_router_fused); zeroed and copied as moe_topk_pub */
    __align__(128) unsigned long long moe_logit_pub[MOE_LOGIT_WORDS];
    /* decode DeltaNet in_proj tiles stored, as step_tag words written by gemv_stream and polled by the
     * scan (gemv_batch.tile_done, gdn_args.tile_done); zeroed and copied as moe_topk_pub */
    __align__(128) unsigned long long gdn_tile_done[GDN_TILE_WORDS];
} cuda_counters;

/* One layer's launch arguments that stay the same for every forward call of a state (weights, norms,
 * scratch, cache and state pointers, shapes), built once by cuda_state_args_build; a call sets only what
 * depends on it (token count, split-KV shape, kernel per token count). */
typedef struct {
    gemv_batch mix_in;    /* DeltaNet: in_proj_qkv | z | b | a; attention: q (with gate) | k | v; into c->proj */
    gemv_input mix_in_x;  /* input RMSNorm of h */
    gemv_batch mix_out;   /* DeltaNet out_proj / attention o_proj, added into h */
    gemv_input mix_out_x; /* DeltaNet: gated RMSNorm of the delta-rule output (z gate); attention: plain */
    attn_args attn;       /* attention layers */
    gdn_args gdn;         /* DeltaNet layers */
    gemv_batch router;    /* router | shared_expert_gate (decode path; prefill: cuda_prefill_moe) */
    gemv_input router_x;  /* post-attention RMSNorm of h */
    moe_args moe;
} cuda_layer_args;

typedef struct {
    int max_ctx;
    int pos;         /* host mirror of counters.pos */
    int step;        /* host mirror of counters.step */
    cuda_counters *ctr;      /* device */
    uint8_t **k_cache, **v_cache; /* [n_layers] (NULL for DeltaNet layers): [n_kv][max_ctx][head_dim]
                                   * elements of cuda_ctx.kv_elem bytes (bf16, or fp32 in exact mode) */
    float **conv_state, **rec_state;     /* [n_layers] (NULL for attention layers) */
    int *out_tokens;         /* [out_cap] */
    int *host_tokens;        /* pinned, mapped host memory: [out_cap] tokens, then the count (streaming) */
    int *host_tokens_dev;    /* the device's address of host_tokens */
    int out_cap;
    cudaGraphExec_t graph_greedy;  /* decode step: token slot -> next token slot */
    cudaGraphExec_t graph_logits;  /* decode step: d_tokens[0] -> logits[0] */
    cuda_layer_args *args;         /* [n_layers] (cuda_state_args_build) */
} cuda_state;

/* Evaluate a kernel launch (a launch_* wrapper's cudaError_t) in a function with `lily_error *err` in
 * scope; on failure record the call and the error and return (as CUDA_TRY). Used by the forward passes. */
#define LAUNCH(call)                                                                               \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return lily_cuda_error(err, e_, #call, __FILE__, __LINE__);                            \
    } while (0)

/* A checkpoint taken inside a forward pass (the forward_mark op): each Gated DeltaNet layer runs its delta
 * rule over rows [0, row) and then [row, n) as two forward calls would (the second reading the conv
 * state the first wrote: its step counter is step_next, holding the state's step + 1), and between the
 * two its conv state (both ping-pong buffers, conv_bytes) and recurrent state (rec_bytes) are copied
 * with `kind` to ext, layer after layer (recurrent_save's layout after its header); then, when logits is
 * not NULL, the logits of row - 1 go to the host's logits [vocab]. The pass advances the step counter
 * twice (two calls'). */
typedef struct {
    int row;
    uint8_t *ext;
    cudaMemcpyKind kind;
    size_t conv_bytes, rec_bytes;
    int *step_next;
    float *logits;
} cuda_mark;

/* cuda_forward.cu: enqueue embed + all layers + (optionally) the LM head for n tokens at the state's
 * device position; never synchronizes except for a mark's logits (mark: NULL = none). lm_mode:
 * LILY_LOGITS_* or 3 = greedy argmax (n == 1). */
lily_status cuda_enqueue_forward(cuda_ctx *c, cuda_state *st, int n, int lm_mode, bool decode_splits,
                                 const cuda_mark *mark, lily_error *err);
lily_status cuda_sync(cuda_ctx *c, lily_error *err);
/* cuda_forward.cu: fill st->args (allocated here, freed with the state) from the context's weights and
 * scratch and the state's caches. LILY_ERR_OUT_OF_MEMORY. */
lily_status cuda_state_args_build(const cuda_ctx *c, cuda_state *st, lily_error *err);
/* cuda_limits.cu: the measure_limits op. */
lily_status cuda_measure_limits(int device, lily_hw_limits *out, lily_error *err);
/* Enqueue the final norm + LM head of `rows` rows of c->h starting at row `row0` into c->logits
 * (rows <= c->logits_rows). */
lily_status cuda_enqueue_lm_head(cuda_ctx *c, int row0, int rows, lily_error *err);

/* cuda_forward.cu: backend.h's decode_loop op (the decode graph replayed, tokens streamed from mapped
 * host memory, launches kept a few steps ahead of the host so a stop wastes little). */
lily_status cuda_decode_loop(void *vctx, void *vst, int32_t first_token, int n, const lily_device_sampling *sampling,
                             lily_decode_token_fn on_token, void *user, float *last_logits, int *n_run,
                             lily_error *err);
/* host_weights.cu: `bytes` of pinned host memory mapped into the device's address space (write-combined when asked);
 * *host to write and free it (cudaFreeHost), *device the address kernels read. LILY_ERR_OUT_OF_MEMORY,
 * LILY_ERR_BACKEND. */
lily_status cuda_host_weight_alloc(size_t bytes, bool write_combined, void **host, void **device, lily_error *err);
/* host_weights.cu: whether layer `layer`'s routed experts live in host memory (opts.n_cpu_moe). */
bool cuda_layer_experts_on_host(const cuda_ctx *c, int layer);
/* Prefill calls of at least this many tokens copy a host layer's experts to the device once (at 256 tokens
 * of top-8 of 256 experts nearly every expert is routed to) instead of reading them in place per tile. */
#define CUDA_MOE_STAGE_MIN_TOKENS 256
/* host_weights.cu: device bytes of the staging buffer for experts of expert_layer_bytes (alignment added). */
size_t cuda_experts_stage_bytes(size_t expert_layer_bytes);
/* host_weights.cu: after upload, the staging buffer, stream and events when opts.n_cpu_moe > 0, not exact
 * and max_chunk reaches the staging threshold (else nothing). LILY_ERR_OUT_OF_MEMORY, LILY_ERR_BACKEND. */
lily_status cuda_experts_stage_init(cuda_ctx *c, lily_error *err);
void cuda_experts_stage_free(cuda_ctx *c);
/* host_weights.cu: at the start of layer `layer` of an n-token call whose MoE block runs as grouped GEMMs:
 * when staging applies to it, queue the copy of its experts into the buffer on the staging stream, after
 * the work queued so far on c->stream. LILY_ERR_BACKEND. */
lily_status cuda_experts_stage(cuda_ctx *c, int layer, int n, lily_error *err);
/* host_weights.cu: the expert dmats the MoE block of layer L (an element of c->layers, or a stand-in) reads: the staged copy (c->stream then waits
 * for its copy) or the layer's own. LILY_ERR_BACKEND. */
lily_status cuda_layer_experts(cuda_ctx *c, const cuda_layer *L, dmat *gate, dmat *up, dmat *down, lily_error *err);

/* cpu_experts.cu: how many of each token's top-k routed experts of host layers decode runs on the CPU for these
 * options (0: none, the GPU reads them all over PCIe); the rule of LILY_HOST_EXPERTS_AUTO lives here. */
int cuda_host_experts_cpu_slots(const lily_backend_options *o, const lily_config *cfg);
/* cpu_experts.cu: after upload, when c->host_experts_cpu: host views of the host layers' experts, the mailbox,
 * the worker thread and its pool. LILY_ERR_UNSUPPORTED (shapes the CPU path lacks), LILY_ERR_OUT_OF_MEMORY,
 * LILY_ERR_BACKEND. */
lily_status cuda_cpu_experts_init(cuda_ctx *c, lily_error *err);
/* cpu_experts.cu: stop the worker (after the stream is idle) and free everything; prints its counts. */
void cuda_cpu_experts_free(cuda_ctx *c);
/* cpu_experts.cu: whether layer `layer`'s MoE block of an n-token call runs its routed experts on the CPU. */
bool cuda_cpu_experts_layer(const cuda_ctx *c, int layer, int n);
/* cpu_experts.cu: at the start / end of an n-token forward call: wake the worker from a host function on a
 * side stream (n == 1 with CPU experts; else nothing), and join that stream back. LILY_ERR_BACKEND. */
lily_status cuda_cpu_experts_wake(cuda_ctx *c, int n, lily_error *err);
lily_status cuda_cpu_experts_join(cuda_ctx *c, int n, lily_error *err);
/* cpu_experts.cu: a decode MoE block after the router GEMV (m: the layer's moe_args): publish x and the
 * top-k to the CPU, the shared expert on the GPU, then h += the CPU's routed sum. LILY_ERR_BACKEND. */
lily_status cuda_cpu_experts_moe(cuda_ctx *c, const moe_args &m, lily_error *err);

/* cuda_shapes.cu: LILY_ERR_UNSUPPORTED (naming the dimension) when some stage of the forward pass has no
 * CUDA kernel for the model's shapes; called by create before anything is uploaded. */
lily_status cuda_check_shapes(const lily_config *cfg, const lily_weights *w, lily_error *err);

/* forward_prefill.cu: a batch of projections for n >= prefill_min_tokens rows (out_mode STORE or ADD),
 * and the whole sparse MoE block (h += MoE(RMSNorm(h))), on tensor cores; enqueue only. */
lily_status cuda_prefill_proj(cuda_ctx *c, const gemv_batch &b, const gemv_input &in, int out_mode, int n,
                              lily_error *err);
lily_status cuda_prefill_moe(cuda_ctx *c, const cuda_layer *L, int n, lily_error *err);

#endif
