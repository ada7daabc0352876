/* backend.h — THE contract between the runtime and hardware (DESIGN.md §3).
 *
 * The contract is model-shaped: a backend receives the bound weights and implements whole-model
 * operations with an explicit token count, so one signature serves prefill (n > 1) and decode (n == 1).
 * The runtime chunks long prompts; a backend never sees more than max_chunk tokens at once.
 * Backends register through lily_backend_find(); a build without CUDA links a stub that finds nothing.
 */
#ifndef LILY_BACKEND_H
#define LILY_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "lily.h"
#include "model/config.h"
#include "model/weights.h"

/* Stage names for the debug hook (DESIGN.md §3). Layer -1 = before the first layer / after the last. */
#define LILY_STAGE_EMBED "embed"             /* [n, hidden] token embeddings (layer -1) */
#define LILY_STAGE_ATTN_NORM "attn_norm"     /* [n, hidden] input_layernorm output */
#define LILY_STAGE_ATTENTION_OUT "attention_out" /* [n, hidden] gated attention block output (mixer_out) */
#define LILY_STAGE_DELTANET_OUT "deltanet_out"   /* [n, hidden] Gated DeltaNet block output (mixer_out) */
#define LILY_STAGE_MOE_NORM "moe_norm"       /* [n, hidden] post_attention_layernorm output */
#define LILY_STAGE_MOE_OUT "moe_out"         /* [n, hidden] sparse MoE block output */
#define LILY_STAGE_RESIDUAL "residual"       /* [n, hidden] residual stream after the layer */
#define LILY_STAGE_FINAL_NORM "final_norm"   /* [n, hidden] (layer -1) */
#define LILY_STAGE_LOGITS "logits"           /* [n_rows, vocab] (layer -1) */

/* Called after a stage with its fp32 output on the host, [n_tokens, width] row-major. */
typedef void (*lily_debug_hook)(void *user, int layer, const char *stage, const float *data, int n_tokens,
                                int width);

typedef struct {
    int n_threads;        /* CPU worker threads; 0 = all cores */
    int max_chunk;        /* the most tokens one forward() call receives; scratch is sized by it */
    int device;           /* GPU ordinal for GPU backends */
    /* Gated DeltaNet delta rule for multi-token calls: false (default) = the recurrent form for every n,
     * so results do not depend on how tokens are split into forward() calls (the prefix cache's cold ==
     * cached exactness rests on this); true = the chunked form (chunk 64) for n > 1, as transformers'
     * torch_chunk_gated_delta_rule computes it. Both match the fixture references to ~1e-4. */
    bool deltanet_chunked;
    /* CPU backend only, a precision study: round every matmul input to fp16 first, as the CUDA kernels
     * feed the tensor cores (bench_cuda_accuracy --cpu-f16). Default false (exact fp32). */
    bool cpu_matmul_inputs_f16;
    /* Precision: false (default) = each backend's fast kernels; true = exact fp32 everywhere, the reference
     * mode. The CPU backend's fast mode multiplies the MLX 4/8-bit weights with activations quantized to two
     * int8 digits per value (16-bit, per block of 32) in integer dot products (matmul_fast.c); exact dequantizes
     * every weight to fp32 (plain bf16/f16/f32 weights take that path in both modes). The CUDA backend then keeps the KV cache in fp32
     * (twice the bytes of its bf16 default) and runs every stage on its fp32 SIMT kernels: GEMVs instead of
     * tensor-core GEMMs for every projection, the MoE block and the LM head, SIMT attention for decode and
     * prefill, the recurrent Gated DeltaNet prefill (no tf32 chunked form). Slower (no tensor cores), and
     * agrees with the CPU backend to fp32 rounding (summation order only). */
    bool exact;
    /* CUDA only, a precision study: decode runs every layer's MoE router as its own GEMV, as the layers whose
     * experts the host's cores compute do, instead of inside the MoE gate/up kernel (moe_router_fused; the
     * same operands, another summation order) (bench_cuda_accuracy --router-unfused). Default false. */
    bool moe_router_unfused;
    /* CUDA only, for comparison: decode computes each layer's MoE router inside the MoE gate/up kernel
     * (moe_router_fused: its logits exchanged within that kernel's grid) instead of summing it in the
     * residual projection before the MoE block (the default where supported: moe_router_partials; the
     * same operands, another summation order). Default false. */
    bool moe_router_gate_up;
    /* The routed experts (gate, up and down projections with their scales and biases) of layers
     * [0, n_cpu_moe) kept in host memory, not the device's (llama.cpp's --n-cpu-moe); >= n_layers: every
     * layer's; 0 (default): none. CUDA: pinned host memory mapped into the device's address space, read
     * over PCIe by the same kernels, so results are bit-identical to the all-device ones. Host-only backends
     * ignore it. */
    int n_cpu_moe;
    /* How decode runs the routed experts of those layers (CUDA): LILY_HOST_EXPERTS_AUTO (0) as the backend's
     * measured rule picks for the layer count; LILY_HOST_EXPERTS_ZERO_COPY: the GPU reads the selected
     * experts over PCIe (the same kernels: bit-identical to the all-device path); N > 0: the host's cores
     * compute the last N of each token's top-k experts (LILY_HOST_EXPERTS_CPU or any N >= top-k: all of
     * them; n_threads threads, 0 = every core but one; the CPU backend's fast-mode arithmetic, so not
     * bit-identical) while the GPU runs the shared expert and the other routed ones over PCIe. Prefill stages
     * the experts to the GPU either way. */
    int host_experts;
    /* Time forward()'s stages (ops->profile_take reads the sums); false (default): no clock is read. Backends
     * without profile_take ignore it. */
    bool profile;
    lily_debug_hook debug_hook;
    void *debug_user;
} lily_backend_options;

/* The most stages a backend's profile names. */
#define LILY_PROFILE_MAX_STAGES 32

/* forward()'s wall time by stage, summed since the last profile_take (lily_backend_options.profile): every
 * interval between two of the backend's marks inside forward() is added to the stage that the later mark
 * names, so the stages' seconds add up to forward_seconds (less the calls' entry checks). Stages in the
 * backend's fixed order; names are the backend's static strings. */
typedef struct {
    int n_stages;
    const char *names[LILY_PROFILE_MAX_STAGES];
    double seconds[LILY_PROFILE_MAX_STAGES]; /* wall seconds */
    int64_t calls[LILY_PROFILE_MAX_STAGES];  /* intervals counted */
    double forward_seconds;                  /* wall seconds inside forward() */
    int64_t forwards;                        /* forward() calls */
} lily_stage_profile;

/* lily_backend_options.host_experts */
enum { LILY_HOST_EXPERTS_ZERO_COPY = -1, LILY_HOST_EXPERTS_AUTO = 0, LILY_HOST_EXPERTS_CPU = 1 << 20 };

/* Which rows of logits forward() writes. */
typedef enum {
    LILY_LOGITS_NONE = 0, /* none (a prefill chunk that is not the last) */
    LILY_LOGITS_LAST = 1, /* [1, vocab]: the last token's */
    LILY_LOGITS_ALL = 2,  /* [n, vocab]: every token's */
} lily_logits_mode;

/* What the hardware can do at best: memory bandwidth and matrix rate, measured (measure_limits; the CPU's
 * in runtime/hw_limits.c). `lily bench` divides the cost model by these. */
typedef struct {
    char device[256];          /* "Intel(R) Xeon(R) Processor, 2 cores" / "NVIDIA H200" */
    double read_bytes_per_s;   /* streaming read bandwidth (0 = not measured) */
    double copy_bytes_per_s;   /* copy bandwidth counting bytes read + bytes written (0 = not measured) */
    double bandwidth;          /* the one the decode floor uses: CPU: read; GPU: copy */
    double matmul_flops_per_s; /* dense matmul rate (CPU: fp32; GPU: bf16 tensor cores) */
    char matmul_kind[64];      /* "fp32 avx2+fma", "bf16 tensor core", ... */
} lily_hw_limits;

/* What a backend instance would hold in device memory (memory_needs), bytes. */
typedef struct {
    size_t device_free, device_total; /* the device's memory now, its runtime's own context already made */
    size_t runtime_bytes;      /* held by the device runtime beside the backend's allocations (context, kernel
                                * images, graphs): an estimate */
    size_t weight_bytes;       /* the uploaded weights */
    size_t scratch_bytes;      /* the scratch for opts->max_chunk tokens */
    size_t kv_bytes_per_token; /* one session, per token of max_ctx: KV rows of every attention layer and the
                                * token buffers */
    size_t state_bytes;        /* one session, besides that: conv + recurrent state, counters */
    size_t expert_layer_bytes; /* the routed experts of one layer (every layer alike): counted in weight_bytes
                                * unless opts->n_cpu_moe keeps the layer's in host memory */
    int n_expert_layers;       /* layers with routed experts */
    size_t expert_stage_bytes; /* scratch added when any layer's experts are in host memory (CUDA: a device
                                * buffer a long prefill chunk copies one layer's experts into) */
} lily_backend_memory;

typedef struct lily_backend_ops lily_backend_ops;

/* The most alternatives a token's logprobs list (OpenAI's top_logprobs limit). */
#define LILY_TOP_LOGPROBS_MAX 20

/* A chosen token's log-probability and the most likely alternatives: the log-softmax of forward()'s raw
 * logits (before logit bias, penalties and temperature), as the OpenAI API reports logprobs. */
typedef struct {
    float logprob;                               /* of the chosen token */
    int n_top;                                   /* 0 .. LILY_TOP_LOGPROBS_MAX */
    int32_t top_ids[LILY_TOP_LOGPROBS_MAX];      /* most likely first; equal logits: the lower id first */
    float top_logprobs[LILY_TOP_LOGPROBS_MAX];
} lily_token_logprobs;

/* What decode_loop draws with: runtime/sampler.h's settings, its penalty history and its draw index, so
 * that a device draws the token sampler.h would (the same candidate set and the same Gumbel-max noise of
 * base/philox.h; a token can differ only where float rounding moves a cut or a near tie). */
typedef struct {
    float temperature;        /* < 1e-5 (e.g. 0): greedy argmax of the penalized logits, ties to the lower id */
    int top_k;                /* keep the top_k most likely; <= 0 or >= vocab: off; 1: greedy */
    float top_p;              /* (0, 1]: the smallest most-likely set (of the top_k ones) with mass >= top_p */
    float min_p;              /* [0, 1]: keep p >= min_p * p_max; 0 = off */
    float presence_penalty;   /* sampler.h's penalties, over the history below and the tokens drawn here */
    float frequency_penalty;
    float repetition_penalty; /* > 0; 1 = off */
    const int32_t *bias_ids;  /* [n_bias] logit bias: bias_values[j] is added to token bias_ids[j]'s logit */
    const float *bias_values;
    int n_bias;
    const int32_t *history_ids;     /* [n_history] distinct tokens in the context (prompt and generated) */
    const uint32_t *history_counts; /* [n_history] how often each was generated */
    int n_history;
    uint64_t seed;            /* draw seed */
    uint64_t draw0;           /* step i draws with draw index draw0 + i (sampler.h's lily_sampler_draw_index) */
    int top_logprobs;         /* < 0: no logprobs; 0 .. LILY_TOP_LOGPROBS_MAX: each token's logprobs with this
                                 many alternatives are passed to on_token */
    /* Constrained decoding (NULL: none). Step i chooses among the tokens whose bit (bit id & 31 of word
     * id >> 5) is set in bits[(vocab + 31) / 32] as token_mask(mask_user, i, bits) wrote them (it returns
     * 1), or among all tokens (it returns 0). decode_loop calls it, on the thread that called decode_loop,
     * for step 0 before the first step and for step i + 1 right after on_token(i) returned 0 (when
     * i + 1 < n); the step's forward pass runs meanwhile and only its sampling waits for the mask.
     * Disallowed tokens get -infinity logits before the logit bias, penalties and temperature; logprobs
     * stay those of the raw logits. */
    int (*token_mask)(void *user, int index, uint32_t *bits);
    void *mask_user;
} lily_device_sampling;

/* Greedy and nothing else (no penalties, logit bias or logprobs): the settings of a plain decode. */
static inline lily_device_sampling lily_device_sampling_greedy(void)
{
    lily_device_sampling ds;
    memset(&ds, 0, sizeof ds); /* not a designated initializer: CUDA's C++ compile warns of the members it omits */
    ds.temperature = 0.0f;
    ds.top_k = 1;
    ds.top_p = 1.0f;
    ds.repetition_penalty = 1.0f;
    ds.top_logprobs = -1;
    return ds;
}

/* decode_loop's per-token call, on the thread that called decode_loop: token `index` (0-based) was just
 * chosen; logprobs: its logprobs when sampling->top_logprobs >= 0, else NULL. Return 0 to go on, nonzero
 * to stop. */
typedef int (*lily_decode_token_fn)(void *user, int32_t token, int index, const lily_token_logprobs *logprobs);

/* Where a piece of saved state lives (the optional split-state ops below): host memory when host is
 * non-NULL, else `offset` bytes into a device pool made by device_pool_new. */
typedef struct {
    void *host;
    void *device_pool;
    size_t offset;
} lily_state_loc;

/* A loaded backend instance: the ops table plus its private context. */
typedef struct {
    const lily_backend_ops *ops;
    void *ctx;
    const lily_config *cfg;
} lily_backend;

struct lily_backend_ops {
    const char *name; /* "cpu", "cuda" */

    /* Repack / upload weights once (kept 4-bit) and allocate scratch for opts->max_chunk tokens.
     * Errors: LILY_ERR_OUT_OF_MEMORY, LILY_ERR_BACKEND, LILY_ERR_UNSUPPORTED. */
    lily_status (*create)(const lily_config *cfg, const lily_weights *w, const lily_backend_options *opts,
                          void **ctx, lily_error *err);
    void (*destroy)(void *ctx);
    /* Optional (NULL on host-only backends): what create() with these options, and each state_new(), would
     * allocate on the device (the memory plan, runtime/memory_plan.h). Allocates nothing but the device
     * runtime's context. Errors: LILY_ERR_BACKEND (no usable device), LILY_ERR_INVALID_ARGUMENT. */
    lily_status (*memory_needs)(const lily_config *cfg, const lily_weights *w, const lily_backend_options *opts,
                                lily_backend_memory *out, lily_error *err);

    /* Session state for up to max_ctx tokens: KV cache of the full-attention layers, conv + fp32
     * recurrent state of the Gated DeltaNet layers, the position. Zeroed (position 0). */
    lily_status (*state_new)(void *ctx, int max_ctx, void **state, lily_error *err);
    void (*state_free)(void *ctx, void *state);
    /* Reset to position 0 without freeing. */
    void (*state_reset)(void *ctx, void *state);
    /* Tokens processed so far (the next token's position). */
    int (*state_position)(void *ctx, void *state);
    /* dst := src (same max_ctx). Only KV rows [0, position) are copied. */
    lily_status (*state_copy)(void *ctx, void *dst, const void *src, lily_error *err);
    /* Serialize to host memory: state_save_size() bytes for the current position, then state_save()
     * writes them; state_restore() reads such a buffer back (bit-exact). */
    size_t (*state_save_size)(void *ctx, const void *state);
    lily_status (*state_save)(void *ctx, const void *state, void *buf, size_t size, lily_error *err);
    lily_status (*state_restore)(void *ctx, void *state, const void *buf, size_t size, lily_error *err);

    /* Run n tokens (1 <= n <= max_chunk) at the state's position through all layers, advancing it by n.
     * logits: fp32 [1 or n, vocab] per `mode` (may be NULL for LILY_LOGITS_NONE).
     * Errors: LILY_ERR_CONTEXT_LENGTH when position + n > max_ctx (state unchanged);
     * LILY_ERR_INVALID_ARGUMENT for a token id outside [0, vocab); LILY_ERR_BACKEND. */
    lily_status (*forward)(void *ctx, void *state, const int32_t *tokens, int n, lily_logits_mode mode,
                           float *logits, lily_error *err);

    /* ---- Optional (NULL when a backend lacks them): the state in parts, so the prefix cache can share
     * KV rows between checkpoints and keep checkpoints in device memory. Called between forward() calls,
     * never inside one or inside a graph capture. Copies from or to host memory finish before a call
     * returns; a save to a device pool may still be under way on the device when kv_save / recurrent_save
     * return (the caller need not wait for it: every later call of the backend, including a load of those
     * bytes, comes after it; an error it meets is reported by a later call).
     * kv_row_bytes: bytes of one position's KV rows (K and V of every attention layer) as kv_save lays
     *   them out. kv_save: rows [row0, row0 + n) of state (row0 + n <= position) to n * kv_row_bytes
     *   bytes at loc. kv_load: such bytes into rows [row0, row0 + n) (row0 + n <= max_ctx); the position
     *   is unchanged.
     * recurrent_bytes / recurrent_save / recurrent_load: everything but the KV rows (conv + recurrent
     *   state of every Gated DeltaNet layer, the position and its counters); recurrent_load sets the
     *   position to the saved one. kv_load of rows [0, p) then recurrent_load of a save taken at p gives
     *   the state as it was at p, bit for bit.
     * Errors: LILY_ERR_INVALID_ARGUMENT (rows out of range; a device loc on a backend without device
     * pools), LILY_ERR_BACKEND. */
    size_t (*kv_row_bytes)(void *ctx);
    lily_status (*kv_save)(void *ctx, const void *state, int row0, int n, lily_state_loc loc, lily_error *err);
    lily_status (*kv_load)(void *ctx, void *state, int row0, int n, lily_state_loc loc, lily_error *err);
    size_t (*recurrent_bytes)(void *ctx);
    lily_status (*recurrent_save)(void *ctx, const void *state, lily_state_loc loc, lily_error *err);
    lily_status (*recurrent_load)(void *ctx, void *state, lily_state_loc loc, lily_error *err);
    /* Optional (NULL on host-only backends): one device-memory allocation of `bytes` for checkpoints,
     * made here and only here (never during decode or graph capture); the caller manages offsets in it.
     * Errors: LILY_ERR_OUT_OF_MEMORY, LILY_ERR_BACKEND. */
    lily_status (*device_pool_new)(void *ctx, size_t bytes, void **pool, lily_error *err);
    void (*device_pool_free)(void *ctx, void *pool);

    /* Optional (NULL when a backend lacks it): decode without the host in the loop. Step i (0 <= i < n)
     * runs one token at the state's position (first_token for i = 0, else the token step i - 1 chose),
     * and chooses token i from its logits on the device per `sampling`; the chosen token is the next
     * step's input without a round trip through the host. on_token (may be NULL) gets token i as soon as
     * the host can see it. When it returns nonzero it is not called again and no further step starts,
     * but steps already queued finish: *n_run (i + 1 <= *n_run <= n) is the number of steps run. Without
     * a stop all n tokens are delivered and *n_run = n. The state advances by *n_run (the token of the
     * last step run is chosen, not run). last_logits: when non-NULL and on_token asked to stop, the
     * [vocab] fp32 logits of step *n_run - 1 (as forward() gives them); untouched otherwise.
     * Greedy chooses what an argmax of forward()'s logits would; sampled draws are sampler.h's (above).
     * Every step's logits are checked: one that holds a NaN or an infinity ends the loop with
     * LILY_ERR_BACKEND before its token is delivered (the steps already queued finish; *n_run counts them).
     * With sampling->token_mask, a step whose mask does not arrive within the backend's timeout (CUDA:
     * 10 s) ends the loop the same way; when the loop stops, steps still waiting for a mask are released
     * and finish unconstrained (their tokens are never delivered).
     * Errors: LILY_ERR_CONTEXT_LENGTH (position + n > max_ctx; state unchanged); LILY_ERR_INVALID_ARGUMENT
     * (n < 1, first_token outside [0, vocab), sampling outside the ranges of lily_device_sampling);
     * LILY_ERR_UNSUPPORTED (this instance cannot, e.g. a debug hook is set: state unchanged, nothing run;
     * the caller decodes with forward() instead); LILY_ERR_BACKEND. */
    lily_status (*decode_loop)(void *ctx, void *state, int32_t first_token, int n, const lily_device_sampling *sampling,
                               lily_decode_token_fn on_token, void *user, float *last_logits, int *n_run,
                               lily_error *err);

    /* Optional (NULL when a backend has no profile): *out = the stage times summed since create or the last
     * call (out->n_stages 0 when created without lily_backend_options.profile), and the sums start again. */
    void (*profile_take)(void *ctx, lily_stage_profile *out);

    /* Optional (NULL on host-only backends): measure GPU `device`: out->device its name, copy_bytes_per_s a
     * device-to-device copy rate (bytes read + written), bandwidth the rate the decode floor uses,
     * matmul_flops_per_s a dense tensor-core rate and matmul_kind its instruction. Takes about a second.
     * Errors: LILY_ERR_BACKEND (no usable device), LILY_ERR_OUT_OF_MEMORY. */
    lily_status (*measure_limits)(int device, lily_hw_limits *out, lily_error *err);

    /* Optional (NULL on host-only backends): `bytes` of page-locked host memory, which the state copies
     * above (a lily_state_loc whose .host points into it) move at the host link's full speed; for the prefix
     * cache's host checkpoints. Made once (pinning takes a fraction of a second per GiB), never during
     * decode. Errors: LILY_ERR_OUT_OF_MEMORY, LILY_ERR_BACKEND. */
    lily_status (*host_pool_new)(void *ctx, size_t bytes, void **pool, lily_error *err);
    void (*host_pool_free)(void *ctx, void *pool);

    /* Optional (NULL when a backend lacks it; lily_session_append_mark then makes two forward() calls and a
     * recurrent_save between them): forward() of n tokens (2 <= n <= max_chunk) that also takes the state at
     * row `mark` (0 < mark < n) inside the pass: mark_loc gets the recurrent part as recurrent_save would write
     * it after a forward() of tokens[0, mark) (a save to a device pool may still be queued when this returns,
     * as recurrent_save's), mark_logits (fp32 [vocab]; NULL: not wanted, and the pass runs no LM head over row
     * mark - 1) that call's logits of its last token. KV rows [0, mark) are the pass's, the ones kv_save then
     * reads. The state ends as after forward(tokens[0, mark)) and forward(tokens[mark, n)) (two calls'
     * counters); results may differ from those two calls' in the last bits where a kernel choice depends on the
     * token count (the last n - mark rows take the n-row kernels). CUDA: the Gated DeltaNet delta rule runs
     * once over rows [0, mark) and once over [mark, n), as in two calls; every other stage runs once over the n
     * rows. Errors: as forward(); LILY_ERR_INVALID_ARGUMENT for a mark outside (0, n) or no location. */
    lily_status (*forward_mark)(void *ctx, void *state, const int32_t *tokens, int n, int mark, lily_state_loc mark_loc,
                                float *mark_logits, lily_logits_mode mode, float *logits, lily_error *err);
};

/* The backend registered under `name` ("cpu", "cuda"), or NULL. */
const lily_backend_ops *lily_backend_find(const char *name);

/* Create a backend by name: on success b->ops/ctx are set.
 * Errors: LILY_ERR_UNSUPPORTED for an unknown or not-compiled-in backend; as ops->create. */
lily_status lily_backend_create(const char *name, const lily_config *cfg, const lily_weights *w,
                                const lily_backend_options *opts, lily_backend *b, lily_error *err);
void lily_backend_destroy(lily_backend *b);

/* Registered implementations (backend_registry.c links them). */
extern const lily_backend_ops lily_cpu_backend_ops;
const lily_backend_ops *lily_cuda_backend_ops_get(void); /* NULL in a build without CUDA */

#endif
