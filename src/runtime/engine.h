/* engine.h — a loaded model (engine) and a conversation's state (session): what the CLI and server use.
 *
 * Engine: config + mapped checkpoint + bound weights + one backend. Session: the backend's state
 * (KV cache, conv + recurrent state), the token ids it holds, and the logits of its last token.
 * Long prompts are prefilled in chunks of at most `prefill_chunk` tokens; context is carried across chunks.
 */
#ifndef LILY_ENGINE_H
#define LILY_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "lily.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "runtime/memory_plan.h"

typedef struct {
    const char *model_dir;
    const char *backend;     /* "cpu" (default) or "cuda" */
    int n_threads;           /* 0 = all cores */
    int prefill_chunk;       /* tokens per forward() during prefill; 0 = lily_default_prefill_chunk(backend) */
    int device;              /* GPU ordinal */
    bool deltanet_chunked;   /* see lily_backend_options.deltanet_chunked */
    bool exact;              /* see lily_backend_options.exact (false: the backend's fast kernels) */
    /* The GPU memory plan (backends with device memory only; memory_plan.h): */
    size_t gpu_memory_bytes; /* all lily may hold on the GPU; 0 = the device's free memory */
    int ctx_size;            /* the context sessions will have (0 = as large as fits, up to the model's) */
    size_t device_pool_bytes; /* the device checkpoint pool wanted (the plan shrinks it to fit, and the prefix
                              * cache's pool is capped at what it chose); 0 = not planned (nor capped) */
    int n_sessions;          /* sessions held at once (0 = 1) */
    /* The first n_cpu_moe layers' routed experts in host memory (--n-cpu-moe; >= the layer count: all,
     * --cpu-moe). LILY_N_CPU_MOE_AUTO (0, the default): as the memory plan chooses, none unless the weights
     * leave too little room; LILY_N_CPU_MOE_NONE (-1): none (--n-cpu-moe 0). Backends without a memory
     * plan (cpu) ignore it. */
    int n_cpu_moe;
    int host_experts;        /* lily_backend_options.host_experts (--host-experts; 0 = the backend's rule) */
    bool profile;            /* lily_backend_options.profile (lily bench --profile) */
    lily_debug_hook debug_hook;
    void *debug_user;
} lily_engine_options;

typedef struct {
    char *model_dir;
    lily_config cfg;
    lily_checkpoint ckpt;
    lily_weights weights;
    lily_backend backend;
    int prefill_chunk;
    bool planned;            /* the backend has device memory: plan holds what was chosen */
    lily_memory_plan plan;   /* plan.ctx: lily_session_new's default; plan.pool_bytes: the prefix cache's pool cap */
} lily_engine;

/* Load config, map the checkpoint, bind the weights, plan GPU memory (backends with memory_needs: the
 * prefill chunk, context size and checkpoint pool that fit opts->gpu_memory_bytes, printed to stderr) and
 * create the backend.
 * Errors: as lily_config_load, lily_checkpoint_open, lily_weights_bind, lily_memory_plan_choose,
 * lily_backend_create. */
lily_status lily_engine_open(const lily_engine_options *opts, lily_engine **out, lily_error *err);
void lily_engine_close(lily_engine *e);

/* The GPU memory plan of lily_engine_open, for a caller that assembles an engine itself (e->cfg, e->weights
 * and e->prefill_chunk set, no backend yet): when `backend` has memory_needs, choose the chunk, context and
 * pool from opts (gpu_memory_bytes, prefill_chunk, ctx_size, device_pool_bytes, n_sessions), set e->plan,
 * e->planned, e->prefill_chunk and bo->max_chunk, and print the plan to stderr; else do nothing.
 * Errors: as lily_memory_plan_choose and the backend's memory_needs. */
lily_status lily_engine_plan(lily_engine *e, const char *backend, const lily_engine_options *opts,
                             lily_backend_options *bo, lily_error *err);

typedef struct {
    lily_engine *engine;
    void *state;             /* backend state */
    int max_ctx;             /* context size in tokens */
    int32_t *tokens;         /* [max_ctx] the ids the state holds, [0, n_tokens) */
    int n_tokens;
    float *logits;           /* [vocab] logits after the last token (valid when n_tokens > 0) */
} lily_session;

/* A session with a context of max_ctx tokens (0 = the memory plan's context when the engine has one, else
 * the model's max_position_embeddings capped at 32768).
 * Errors: LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_session_new(lily_engine *e, int max_ctx, lily_session **out, lily_error *err);
void lily_session_free(lily_session *s);
void lily_session_reset(lily_session *s);

/* The prefill chunk used when none is given: 4096 tokens for "cuda" (measured fastest on the H200; the
 * memory plan may choose a smaller one), 512 otherwise. */
int lily_default_prefill_chunk(const char *backend);

/* Append n tokens (prefill in chunks of engine->prefill_chunk). The last token's logits go to s->logits.
 * logits_all, when non-NULL, receives [n, vocab] fp32 logits of every appended token.
 * Errors: LILY_ERR_CONTEXT_LENGTH when n_tokens + n > max_ctx (nothing is appended);
 * LILY_ERR_INVALID_ARGUMENT for an id outside the vocab (nothing is appended); backend errors. */
lily_status lily_session_append(lily_session *s, const int32_t *tokens, int n, float *logits_all, lily_error *err);
/* Whether n > 0 new ids fit the session's context and the vocabulary, as lily_session_append checks them before
 * its first chunk: LILY_OK, or LILY_ERR_CONTEXT_LENGTH / LILY_ERR_INVALID_ARGUMENT with the reason. (Inline: a
 * caller's test may stand in for lily_session_append without linking the session's code.) */
static inline lily_status lily_session_check_new_tokens(const lily_session *s, const int32_t *tokens, int n,
                                                        lily_error *err)
{
    const int vocab = s->engine->cfg.vocab_size;
    if ((int64_t)s->n_tokens + n > s->max_ctx)
        return lily_error_set(err, LILY_ERR_CONTEXT_LENGTH,
                              "context length exceeded: %d tokens held + %d new > context size %d", s->n_tokens, n,
                              s->max_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT,
                                  "token id %d (at %d) is outside the vocabulary [0, %d)", tokens[i], i, vocab);
    return LILY_OK;
}

/* Append n tokens (1 < n <= engine->prefill_chunk) in one forward pass that also saves the state after
 * the first `mark` (0 < mark < n) to mark_loc, as the backend's recurrent_save would after appending only
 * those: the recurrent part there, the logits after token mark - 1 in mark_logits ([vocab] fp32; NULL when
 * not wanted: a device backend then spends no LM head on that row); the KV
 * rows [0, n_tokens + mark) kv_save reads afterwards are that state's too. The last token's logits go to
 * s->logits. A backend without forward_mark (backend.h) gets two forward() calls and a recurrent_save
 * between them (bit-identical to two appends).
 * Errors: LILY_ERR_INVALID_ARGUMENT (mark or n out of range, a bad id, a backend without recurrent_save);
 * LILY_ERR_CONTEXT_LENGTH (nothing is appended); backend errors. */
lily_status lily_session_append_mark(lily_session *s, const int32_t *tokens, int n, int mark, lily_state_loc mark_loc,
                                     float *mark_logits, lily_error *err);

/* dst := src: state, tokens and last logits. Both must belong to the same engine (else
 * LILY_ERR_INVALID_ARGUMENT); src's tokens must fit dst's max_ctx (else LILY_ERR_CONTEXT_LENGTH), so the
 * sessions may differ in max_ctx on the CPU backend; the CUDA backend's state_copy still requires the same
 * max_ctx (LILY_ERR_INVALID_ARGUMENT). */
lily_status lily_session_copy(lily_session *dst, const lily_session *src, lily_error *err);

/* A host-memory snapshot of a session (state + token ids + last logits); restore is bit-exact. */
typedef struct {
    void *state_buf;
    size_t state_size;
    int32_t *tokens;
    int n_tokens;
    float *logits;           /* [vocab] */
} lily_session_snapshot;

/* snap := a copy of s (backend state_save bytes + token ids + last logits), malloc'd; free it with
 * lily_session_snapshot_free. Errors: LILY_ERR_OUT_OF_MEMORY; the backend's state_save errors. */
lily_status lily_session_save(const lily_session *s, lily_session_snapshot *snap, lily_error *err);
/* s := the snapshot (same engine). Errors: LILY_ERR_CONTEXT_LENGTH when it holds more tokens than s's
 * max_ctx (s unchanged); the backend's state_restore errors (a buffer of the wrong size). */
lily_status lily_session_restore(lily_session *s, const lily_session_snapshot *snap, lily_error *err);
/* Free the snapshot's buffers and zero it (NULL and an already-freed snapshot are fine). */
void lily_session_snapshot_free(lily_session_snapshot *snap);

#endif
