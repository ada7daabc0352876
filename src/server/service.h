/* service.h — what the engine worker of `lily serve` does with a job: the model side of the server.
 *
 * Owns: the engine, the one session, the prefix cache, the tokenizer, and the per-request pipeline: render
 * the chat template, tokenize, check the context, prefill (resuming from the deepest cached prefix),
 * sample token by token, cut at stop ids / stop strings / max tokens, parse reasoning, content and tool
 * calls, and write the OpenAI response or SSE chunks into the job. Runs on the scheduler's worker thread
 * only (lily_service_load and lily_service_run are a lily_job_loader and a lily_job_runner).
 */
#ifndef LILY_SERVER_SERVICE_H
#define LILY_SERVER_SERVICE_H

#include <stdbool.h>
#include <stdint.h>

#include "lily.h"
#include "server/scheduler.h"

/* Server-side defaults for the fields a request leaves out (`lily serve --temp ...`); a request's own field
 * always wins. */
typedef struct {
    double temperature, top_p, min_p; /* NAN: generation_config.json's value, else the sampler's default */
    int top_k;                /* -1: the same */
    int enable_thinking;      /* -1: the chat template's default (on); 0 off; 1 on */
    int reasoning_budget;     /* -1: none; else the think-block tokens after which lily closes it (generate.h) */
    int max_tokens;           /* -1: none (chat: until the context is full; completions: 16, as OpenAI) */
    bool has_seed;            /* false: a random seed per request (--seed -1, as llama.cpp's server) */
    uint64_t seed;            /* the sampler seed of a request that sets none (has_seed) */
} lily_request_defaults;

/* No server-side defaults: every field unset. */
lily_request_defaults lily_request_defaults_none(void);

typedef struct {
    const char *model_dir;
    const char *backend;      /* "cpu" (default) or "cuda" */
    bool exact;               /* lily_backend_options.exact (--precision exact) */
    int n_threads;            /* 0 = all cores */
    int ctx_size;             /* tokens; 0 = the model's maximum (capped by the runtime) */
    const char *model_name;   /* the id responses carry */
    size_t cache_ram_bytes;   /* prefix cache host cap (runtime/prefix_cache.h); 0 = sized from the model at
                                 load (lily_prefix_cache_default_ram_bytes), said on stderr */
    size_t cache_vram_bytes;  /* prefix cache device pool (CUDA backend); 0 = none */
    size_t gpu_memory_bytes;  /* lily_engine_options.gpu_memory_bytes (0 = all free) */
    int n_cpu_moe;            /* lily_engine_options.n_cpu_moe (0 = as the memory plan chooses) */
    int host_experts;         /* lily_engine_options.host_experts (0 = the backend's rule) */
    int checkpoint_every;     /* prefix cache checkpoint interval in tokens; 0 = 4096, < 0 = none */
    bool host_sampler;        /* --host-sampler: every request samples on the host (LILY_DECODE_HOST, generate.h) */
    const lily_request_defaults *request_defaults; /* NULL: none (lily_request_defaults_none) */
} lily_service_options;

typedef struct lily_service lily_service;

/* Remember the options; loads nothing (lily_service_load does, on the worker). Errors: OOM. */
lily_status lily_service_new(const lily_service_options *opts, lily_service **out, lily_error *err);
void lily_service_free(lily_service *svc);

/* lily_job_loader: open the engine, the session and the tokenizer; warn on stderr when the model's chat
 * template is not the one lily renders. Errors: as lily_engine_open, lily_session_new, lily_tokenizer_load. */
lily_status lily_service_load(void *svc, lily_error *err);

/* lily_job_runner: run one chat, completions, tokenize or detokenize job to its end. */
void lily_service_run(void *svc, lily_job *job);

/* lily_http_options.run_without_engine: run a tokenize, detokenize or count_tokens job to its end on the
 * caller's thread, after lily_service_load succeeded. These read only what loading fixed (the tokenizer, whose
 * const functions are thread-safe, the chat template, the context size and the request defaults), so any
 * number may run beside the engine worker. A chat or completions job is a programming error (LILY_ASSERT). */
void lily_service_run_without_engine(void *svc, lily_job *job);

/* lily_http_options.metrics_extra: the prefix cache's counters as Prometheus text (malloc'd). Thread-safe. */
char *lily_service_metrics(void *svc);

/* lily_http_options.context_length: the context the session holds, in tokens (prompt and reply together), once
 * the model is loaded; 0 while it loads. Thread-safe. */
int lily_service_context_length(void *svc);

#endif
