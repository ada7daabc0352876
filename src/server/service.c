/* service.c — the model side of `lily serve` (service.h), run by the engine worker thread.
 *
 * Owns: one request's trip through the pipeline — template (text/chat_template), tokenizer
 * (text/tokenizer), prefill into the one session (runtime/engine: reused when the session already holds a
 * prefix of the prompt), the generation loop (runtime/generate: sampler, stop ids, stop strings, max
 * tokens), the output parser (text/output_parser) — and the OpenAI JSON it writes into the job
 * (server/openai). Enforces tool_choice "required" / named by making the generation open a tool call:
 * named appends the tokens of "<tool_call>\n<function=NAME>\n"; required appends "<tool_call>\n<function="
 * and then masks the logits so the name spelled is one of the tools'. The call's arguments, and the content
 * under response_format, are decoded under a grammar (server/structured.h, grammar/constraint.h); a
 * request from POST /v1/messages (req.anthropic) is answered in Anthropic's shapes (server/anthropic.h), one
 * from POST /v1/responses (req.responses) in the Responses API's (server/responses.h).
 */
#include "server/service.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "base/clock.h"
#include "base/json_load.h"
#include "base/memory_limit.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/logprobs.h"
#include "runtime/prefix_cache.h"
#include "runtime/sampler.h"
#include "grammar/constraint.h"
#include "model/config.h"
#include "model/gguf_check.h"
#include "server/anthropic.h"
#include "server/openai.h"
#include "server/responses.h"
#include "server/structured.h"
#include "text/chat_template.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

#define MAX_STOP_IDS 16

struct lily_service {
    char *model_dir, *backend, *model_name;
    int n_threads, ctx_size;
    atomic_int context_length; /* the session's max_ctx once it is made (0 before): lily_service_context_length */
    bool exact;               /* lily_service_options.exact */
    bool host_sampler;        /* lily_service_options.host_sampler */
    lily_engine *engine;
    lily_session *session;
    lily_prefix_cache *cache; /* checkpoints of the session by token prefix; made in lily_service_new */
    size_t cache_vram_bytes;  /* the device pool asked for */
    size_t gpu_memory_bytes;  /* lily_service_options.gpu_memory_bytes */
    int n_cpu_moe;            /* lily_service_options.n_cpu_moe */
    int host_experts;         /* lily_service_options.host_experts */
    size_t cache_ram_bytes;   /* the host cap asked for; 0 = sized from the model at load */
    int32_t im_start, im_end, think; /* the chat marks' token ids (-1 when missing) */
    int32_t call_open;               /* "<tool_call>" (-1 when missing) */
    lily_tokenizer *tok;
    int vocab;
    int32_t stop_ids[MAX_STOP_IDS];
    int n_stop_ids;
    lily_sampler_params defaults; /* generation_config.json's sampling fields over the sampler defaults, then
                                     the server's (request_defaults) over those */
    lily_request_defaults request_defaults;
    int32_t *think_close;     /* the reasoning budget's forced close (generate.h); NULL when the vocabulary has none */
    int n_think_close;
    int32_t think_end;
    float *scratch;           /* [vocab] masked logits */
    lily_token_trie *trie;    /* the vocabulary for grammar masks, built at load (not in a request's time) */
    int32_t *special_ids;     /* [n_special_ids] the special tokens (the trie leaves them out) */
    int n_special_ids;
    unsigned long long n_requests;
};

lily_request_defaults lily_request_defaults_none(void)
{
    return (lily_request_defaults){.temperature = NAN, .top_p = NAN, .min_p = NAN, .top_k = -1,
                                   .enable_thinking = -1, .reasoning_budget = -1, .max_tokens = -1};
}

lily_status lily_service_new(const lily_service_options *opts, lily_service **out, lily_error *err)
{
    *out = NULL;
    lily_service *svc = calloc(1, sizeof *svc);
    if (!svc)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
    svc->model_dir = strdup(opts->model_dir ? opts->model_dir : "");
    svc->backend = strdup(opts->backend ? opts->backend : "cpu");
    svc->model_name = strdup(opts->model_name ? opts->model_name : "lily");
    svc->n_threads = opts->n_threads;
    svc->ctx_size = opts->ctx_size;
    svc->exact = opts->exact;
    svc->host_sampler = opts->host_sampler;
    svc->cache_vram_bytes = opts->cache_vram_bytes;
    svc->request_defaults = opts->request_defaults ? *opts->request_defaults : lily_request_defaults_none();
    svc->gpu_memory_bytes = opts->gpu_memory_bytes;
    svc->n_cpu_moe = opts->n_cpu_moe;
    svc->host_experts = opts->host_experts;
    svc->cache_ram_bytes = opts->cache_ram_bytes;
    if (!svc->model_dir || !svc->backend || !svc->model_name) {
        lily_service_free(svc);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
    }
    lily_prefix_cache_options co = {.ram_bytes = opts->cache_ram_bytes, .device_bytes = opts->cache_vram_bytes,
                                    .checkpoint_every = opts->checkpoint_every};
    lily_status st = lily_prefix_cache_new(&co, &svc->cache, err);
    if (st != LILY_OK) {
        lily_service_free(svc);
        return st;
    }
    *out = svc;
    return LILY_OK;
}

void lily_service_free(lily_service *svc)
{
    if (!svc)
        return;
    lily_prefix_cache_free(svc->cache);
    lily_session_free(svc->session);
    lily_engine_close(svc->engine);
    lily_tokenizer_free(svc->tok);
    free(svc->think_close);
    lily_token_trie_free(svc->trie);
    free(svc->special_ids);
    free(svc->scratch);
    free(svc->model_dir);
    free(svc->backend);
    free(svc->model_name);
    free(svc);
}

static void add_stop_id(lily_service *svc, int32_t id)
{
    if (id < 0 || id >= svc->vocab)
        return;
    for (int i = 0; i < svc->n_stop_ids; i++)
        if (svc->stop_ids[i] == id)
            return;
    if (svc->n_stop_ids < MAX_STOP_IDS)
        svc->stop_ids[svc->n_stop_ids++] = id;
}

/* generation_config.json's temperature, top_p, top_k, min_p, repetition_penalty and presence_penalty are the
 * defaults a request's missing fields take (as vLLM's --generation-config auto does); a field the file lacks
 * (or the whole file) takes Qwen's recommended sampling (lily_sampler_recommended); do_sample false means
 * greedy. */
static void load_generation_defaults(lily_service *svc)
{
    svc->defaults = lily_sampler_recommended(); /* per field, as `lily run` (cli/model_open.c) */
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", svc->model_dir);
    json_t *g = lily_json_load_file(path, 0, 0, NULL);
    if (!json_is_object(g)) {
        json_decref(g);
        return;
    }
    json_t *v;
    if (json_is_number(v = json_object_get(g, "temperature")))
        svc->defaults.temperature = (float)json_number_value(v);
    if (json_is_number(v = json_object_get(g, "top_p")))
        svc->defaults.top_p = (float)json_number_value(v);
    if (json_is_integer(v = json_object_get(g, "top_k")))
        svc->defaults.top_k = (int)json_integer_value(v);
    if (json_is_number(v = json_object_get(g, "min_p")))
        svc->defaults.min_p = (float)json_number_value(v);
    if (json_is_number(v = json_object_get(g, "repetition_penalty")))
        svc->defaults.repetition_penalty = (float)json_number_value(v);
    if (json_is_number(v = json_object_get(g, "presence_penalty")))
        svc->defaults.presence_penalty = (float)json_number_value(v);
    if (json_is_false(json_object_get(g, "do_sample")))
        svc->defaults.temperature = 0.0f; /* transformers' generate(): greedy */
    json_decref(g);
}

/* The server's --temp, --top-p, --top-k and --min-p over generation_config.json's values. */
static void apply_server_defaults(lily_service *svc)
{
    const lily_request_defaults *d = &svc->request_defaults;
    if (!isnan(d->temperature))
        svc->defaults.temperature = (float)d->temperature;
    if (!isnan(d->top_p))
        svc->defaults.top_p = (float)d->top_p;
    if (!isnan(d->min_p))
        svc->defaults.min_p = (float)d->min_p;
    if (d->top_k >= 0)
        svc->defaults.top_k = d->top_k;
}

/* On a device backend, before the first request: the forward-pass shapes requests run, so the device
 * runtime has loaded every kernel they use (CUDA loads a kernel at its first launch: ~60 ms over a first
 * request otherwise) and made its decode graphs. Prefill pieces of a whole chunk, of WARM_LONG tokens
 * (prompts shorter than a chunk: the MoE's grouped GEMM takes smaller tiles below 128 rows per expert), of
 * WARM_MID tokens (a turn-2 prefill after a restore: the smallest tensor-core GEMM tiles, the sequential
 * Gated DeltaNet recurrence, attention over a long cached history), one pass of WARM_MID + WARM_TAIL with
 * a checkpoint inside it (a prompt's <think> mark: lily_session_append_mark) and one of WARM_TAIL (fewer
 * than 16 tokens take the GEMVs); two greedy and two sampled decode steps. Then the session is reset.
 * Nothing is checkpointed. */
#define WARM_LONG 1024
#define WARM_MID 24
#define WARM_TAIL 4
static lily_status warm_up(lily_service *svc, lily_error *err)
{
    const lily_backend *be = &svc->engine->backend;
    if (!be->ops->decode_loop)
        return LILY_OK;
    lily_session *s = svc->session;
    const int chunk = svc->engine->prefill_chunk;
    const int room = s->max_ctx - 8 - 2 * (WARM_MID + WARM_TAIL); /* for the chunk and the long piece */
    const int n = chunk < room ? chunk : room;
    const int n_long = chunk > WARM_LONG && n + WARM_LONG <= room ? WARM_LONG : 0;
    if (n < 1)
        return LILY_OK;
    const int total = n + n_long + 2 * (WARM_MID + WARM_TAIL);
    int32_t *ids = malloc((size_t)total * sizeof *ids);
    void *mark_state = NULL;
    const bool marked = be->ops->forward_mark && be->ops->recurrent_bytes && chunk >= WARM_MID + WARM_TAIL &&
                        (mark_state = malloc(be->ops->recurrent_bytes(be->ctx)));
    if (!ids) {
        free(mark_state);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int i = 0; i < total; i++)
        ids[i] = (int32_t)(i % (svc->vocab < 1000 ? svc->vocab : 1000));
    const double t0 = lily_wall_seconds();
    int at = 0;
    lily_status st = lily_session_append(s, ids, n, NULL, err);
    at += n;
    if (st == LILY_OK && n_long) {
        st = lily_session_append(s, ids + at, n_long, NULL, err);
        at += n_long;
    }
    if (st == LILY_OK) {
        st = lily_session_append(s, ids + at, WARM_MID, NULL, err);
        at += WARM_MID;
    }
    if (st == LILY_OK && marked) {
        const lily_state_loc loc = {mark_state, NULL, 0};
        /* no mark logits, as the prefix cache's marked passes */
        st = lily_session_append_mark(s, ids + at, WARM_MID + WARM_TAIL, WARM_MID, loc, NULL, err);
        at += WARM_MID + WARM_TAIL;
    }
    free(mark_state);
    lily_generate_params gp = lily_generate_defaults();
    gp.max_tokens = 2;
    gp.sampling.temperature = 0.0f;
    lily_generate_result res;
    if (st == LILY_OK)
        st = lily_generate(s, ids + at, WARM_TAIL, &gp, &res, err);
    gp.sampling = lily_sampler_recommended();
    if (st == LILY_OK)
        st = lily_generate(s, NULL, 0, &gp, &res, err);
    free(ids);
    lily_session_reset(s);
    if (st == LILY_OK)
        fprintf(stderr, "lily serve: warmed up (prefill pieces of %d, %d, %d, %d%s and %d tokens, 4 decode steps) in "
                        "%.2f s\n", n, n_long, WARM_MID, WARM_MID + WARM_TAIL, marked ? " with a checkpoint inside" : "",
                WARM_TAIL, lily_wall_seconds() - t0);
    return st;
}

lily_status lily_service_load(void *user, lily_error *err)
{
    lily_service *svc = user;
    /* the directory before the tokenizer: its error would hide these */
    lily_status st = lily_check_not_gguf(svc->model_dir, err);
    if (st == LILY_OK)
        st = lily_check_model_dir(svc->model_dir, err);
    if (st == LILY_OK)
        st = lily_tokenizer_load(svc->model_dir, &svc->tok, err);
    if (st != LILY_OK)
        return st;
    lily_engine_options eo = {.model_dir = svc->model_dir, .backend = svc->backend, .n_threads = svc->n_threads,
                              .exact = svc->exact, .gpu_memory_bytes = svc->gpu_memory_bytes, .n_cpu_moe = svc->n_cpu_moe,
                              .host_experts = svc->host_experts,
                              .ctx_size = svc->ctx_size, .device_pool_bytes = svc->cache_vram_bytes};
    st = lily_engine_open(&eo, &svc->engine, err);
    if (st != LILY_OK)
        return st;
    /* as run and chat (cli/model_open.c), and llama.cpp for n_ctx > n_ctx_train: served, with a warning */
    if (svc->ctx_size > svc->engine->cfg.max_position_embeddings)
        fprintf(stderr, "lily serve: warning: --ctx-size %d is beyond the model's max_position_embeddings %d; "
                        "quality past that length is untested\n",
                svc->ctx_size, svc->engine->cfg.max_position_embeddings);
    svc->vocab = svc->engine->cfg.vocab_size;
    if (lily_tokenizer_vocab_size(svc->tok) > svc->vocab)
        return lily_error_set(err, LILY_ERR_TOKENIZER,
                              "%s/tokenizer.json has token ids up to %d but the model's vocabulary is %d",
                              svc->model_dir, lily_tokenizer_vocab_size(svc->tok) - 1, svc->vocab);
    st = lily_session_new(svc->engine, svc->ctx_size, &svc->session, err);
    if (st != LILY_OK)
        return st;
    atomic_store(&svc->context_length, svc->session->max_ctx);
    lily_prefix_cache_stats cs;
    const double state_mib = (double)lily_prefix_cache_state_bytes(svc->session) / (1 << 20);
    if (!svc->cache_ram_bytes) {
        /* a quarter of the memory lily may use at most: a container's cgroup limit counts (base/memory_limit.h) */
        const uint64_t limit = lily_memory_limit_bytes();
        const size_t state_bytes = lily_prefix_cache_state_bytes(svc->session);
        lily_prefix_cache_set_ram_bytes(svc->cache, lily_prefix_cache_default_ram_bytes(state_bytes, limit));
        lily_prefix_cache_stats_get(svc->cache, &cs);
        char capped[128] = "";
        if (cs.ram_bytes < lily_prefix_cache_default_ram_bytes(state_bytes, 0))
            snprintf(capped, sizeof capped, ", and at most a quarter of the %llu MiB this process may use",
                     (unsigned long long)(limit >> 20));
        fprintf(stderr,
                "lily serve: prefix cache: up to %zu MiB of host memory (%d full-context states of %.1f MiB, "
                "within [%d, %d] MiB%s; --cache-ram sets it)\n",
                cs.ram_bytes >> 20, LILY_PREFIX_CACHE_DEFAULT_STATES, state_mib, LILY_PREFIX_CACHE_DEFAULT_MIN_MIB,
                LILY_PREFIX_CACHE_DEFAULT_MAX_MIB, capped);
    } else {
        fprintf(stderr, "lily serve: prefix cache: up to %zu MiB of host memory (--cache-ram; one full-context "
                        "state is %.1f MiB)\n", svc->cache_ram_bytes >> 20, state_mib);
    }
    /* its pools, once the host cap is known: the device pool, and the pinned host pool of the cap's size */
    st = lily_prefix_cache_attach(svc->cache, svc->engine, err);
    /* the prompt's checkpoints after the first token has gone out (flush_checkpoints), not before it */
    lily_prefix_cache_defer(svc->cache, true);
    if (st != LILY_OK)
        return st;
    lily_prefix_cache_stats_get(svc->cache, &cs);
    if (cs.host_pinned_bytes)
        fprintf(stderr, "lily serve: prefix cache: %zu MiB of page-locked host memory for checkpoints\n",
                cs.host_pinned_bytes >> 20);
    if (svc->cache_vram_bytes && svc->engine->backend.ops->device_pool_new && !cs.device_capacity_bytes)
        fprintf(stderr, "lily serve: warning: no room for a %zu MiB prefix-cache pool in GPU memory (--cache-vram); "
                        "checkpoints stay in host memory\n", svc->cache_vram_bytes >> 20);
    svc->scratch = malloc((size_t)svc->vocab * sizeof *svc->scratch);
    if (!svc->scratch)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
    /* the grammar masks' vocabulary trie now, so that no structured request waits for it */
    if ((st = lily_vocab_trie_new(svc->tok, svc->vocab, &svc->trie, err)) != LILY_OK)
        return st;
    const int n_tok = LILY_MIN(svc->vocab, lily_tokenizer_vocab_size(svc->tok));
    for (int pass = 0; pass < 2; pass++) { /* count, then list */
        svc->n_special_ids = 0;
        for (int32_t id = 0; id < n_tok; id++)
            if (lily_tokenizer_is_special(svc->tok, id)) {
                if (pass == 1)
                    svc->special_ids[svc->n_special_ids] = id;
                svc->n_special_ids++;
            }
        if (pass == 0 && !(svc->special_ids = malloc(((size_t)svc->n_special_ids + 1) * sizeof *svc->special_ids)))
            return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int i = 0; i < svc->engine->cfg.n_stop_ids; i++)
        add_stop_id(svc, svc->engine->cfg.stop_ids[i]);
    add_stop_id(svc, lily_tokenizer_eos_id(svc->tok));
    add_stop_id(svc, lily_tokenizer_token_id(svc->tok, "<|im_end|>"));
    add_stop_id(svc, lily_tokenizer_token_id(svc->tok, "<|endoftext|>"));
    svc->im_start = lily_tokenizer_token_id(svc->tok, "<|im_start|>");
    svc->im_end = lily_tokenizer_token_id(svc->tok, "<|im_end|>");
    svc->think = lily_tokenizer_token_id(svc->tok, "<think>");
    svc->call_open = lily_tokenizer_token_id(svc->tok, "<tool_call>");
    load_generation_defaults(svc);
    apply_server_defaults(svc);
    lily_error terr0; /* without "</think>" there is no reasoning budget (requests asking for one get none) */
    if (lily_think_close_tokens(svc->tok, &svc->think_close, &svc->n_think_close, &svc->think_end, &terr0) != LILY_OK) {
        svc->think_end = -1;
        if (svc->request_defaults.reasoning_budget >= 0)
            fprintf(stderr, "lily serve: warning: --reasoning-budget ignored: %s\n", terr0.message);
    }

    if ((st = warm_up(svc, err)) != LILY_OK)
        return st;

    lily_chat_template_match match;
    lily_error terr;
    if (lily_chat_template_check(svc->model_dir, &match, NULL, &terr) == LILY_OK) {
        if (match == LILY_CHAT_TEMPLATE_DIFFERENT)
            fprintf(stderr, "lily serve: warning: %s has a chat template that differs from Qwen3.6's; lily renders "
                            "prompts with its built-in Qwen3.6 template\n", svc->model_dir);
        else if (match == LILY_CHAT_TEMPLATE_MISSING)
            fprintf(stderr, "lily serve: note: %s has no chat template; using the built-in Qwen3.6 template\n",
                    svc->model_dir);
    }
    return LILY_OK;
}

/* ---------------------------------------------------------------------------------------------------
 * one generation
 */

typedef struct {
    char *data;
    size_t len, cap;
} buffer;

static bool buffer_add(buffer *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p)
            return false;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
    return true;
}

typedef struct {
    lily_service *svc;
    lily_job *job;
    lily_oai_request *req;
    lily_oai_ident ident;
    bool stream;
    bool failed;              /* out of memory while writing: stop generating */
    lily_output_parser *parser; /* chat only */
    char (*call_ids)[40];     /* [n_calls] */
    int n_calls;
    bool thinking;            /* the prompt opened a think block */
    bool reasoning_done;      /* the parser has left the think block */
    bool think_closed;        /* "</think>" was generated: later tokens are not reasoning */
    bool one_call;            /* tool_choice names a function, or parallel_tool_calls is false: stop once
                               * the first call is closed */
    bool call_closed;
    int reasoning_tokens;
    lily_grammar *grammar;    /* what the content or the forced call's arguments must follow, or NULL */
    lily_grammar_constraint *constraint;
    lily_token_constraint hook;
    lily_structured_or_call or_call; /* response_format beside tools under "auto": the hook, or a call */
    lily_token_constraint or_call_hook;
    lily_anth_stream anth;    /* Messages API stream: the open content block */
    lily_resp_output resp;    /* Responses API: the Response's output items (streamed or not) */
    const char *stop_sequence; /* the stop string that ended the reply, or NULL */
    buffer text;              /* completions: the generated text */
    lily_oai_logprob *lps;    /* logprobs of the tokens not yet sent (stream) or of all tokens */
    lily_token_logprobs token_logprobs; /* the current token's, filled by lily_generate */
    int n_lps, cap_lps;
    int lp_text_offset;       /* completions stream: text_offset of the next logprob */
    bool prompt_logprobs;     /* completions echo + logprobs: the prompt's tokens get logprobs too */
    char *echo_text;          /* a stream's echo, sent once the prefill has scored it (prompt_logprobs) */
    size_t echo_len;          /* its bytes (a prompt may hold U+0000) */
    double t_start;           /* lily_wall_seconds() when the worker took the job (for job->stats.ttft_ms) */
    bool in_output;           /* the chunks being sent carry generated text (lily_job_write_output) */
    bool flushed;             /* the prefill's deferred checkpoints are stored (flush_checkpoints) */
} generation;

static void send_json_chunk(generation *g, json_t *chunk)
{
    if (!chunk) {
        g->failed = true;
        return;
    }
    size_t len;
    char *s = lily_oai_sse(chunk, &len);
    json_decref(chunk);
    if (!s || (g->in_output ? lily_job_write_output : lily_job_write)(g->job, s, len) == LILY_ERR_OUT_OF_MEMORY)
        g->failed = true;
    free(s);
}

/* Typed stream events of the Messages or the Responses API (each stolen). */
static void send_events(generation *g, json_t **events, int n)
{
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        char *s = events[i] ? lily_oai_sse_event(events[i], &len) : NULL;
        json_decref(events[i]);
        if (!s || (g->in_output ? lily_job_write_output : lily_job_write)(g->job, s, len) == LILY_ERR_OUT_OF_MEMORY)
            g->failed = true;
        free(s);
    }
    if (g->req->responses) /* an error event after these takes the next number */
        g->job->sequence_number = g->resp.seq;
}

/* The logprobs JSON of the tokens waiting to be sent, and forget them. NULL when logprobs are off, and when
 * no token waits in a chat reply or a streamed chunk (the final chunk, after the last token's): OpenAI's and
 * vLLM's "logprobs": null on a chunk without tokens (their role chunk), where {"content": []} (chat) or empty
 * "tokens", "token_logprobs", ... arrays (completions) were sent. A whole completion keeps its arrays. */
static json_t *take_logprobs(generation *g)
{
    if (!g->req->logprobs || (g->n_lps == 0 && (g->req->is_chat || g->stream)))
        return NULL;
    json_t *j;
    if (g->req->is_chat) {
        j = lily_oai_chat_logprobs_json(g->lps, g->n_lps);
    } else {
        j = lily_oai_completion_logprobs_json(g->lps, g->n_lps, g->lp_text_offset);
        for (int i = 0; i < g->n_lps; i++)
            g->lp_text_offset += g->lps[i].token_len;
    }
    for (int i = 0; i < g->n_lps; i++)
        lily_oai_logprob_clear(&g->lps[i]);
    g->n_lps = 0;
    return j;
}

static void on_parser_event(void *user, const lily_output_event *ev)
{
    generation *g = user;
    if (ev->kind != LILY_OUTPUT_REASONING)
        g->reasoning_done = true;
    if (ev->kind == LILY_OUTPUT_TOOL_CALL_END)
        g->call_closed = true;
    if (ev->kind == LILY_OUTPUT_TOOL_CALL_START && ev->tool_index >= g->n_calls) {
        char(*ids)[40] = realloc(g->call_ids, (size_t)(ev->tool_index + 1) * sizeof *ids);
        if (!ids) {
            g->failed = true;
            return;
        }
        g->call_ids = ids;
        while (g->n_calls <= ev->tool_index)
            lily_oai_tool_call_id(g->call_ids[g->n_calls++]);
    }
    const char *call_id = ev->tool_index >= 0 && ev->tool_index < g->n_calls ? g->call_ids[ev->tool_index] : NULL;
    if (g->req->responses) { /* the items are gathered whether or not they stream */
        json_t *events[LILY_RESP_MAX_EVENTS];
        send_events(g, events, lily_resp_output_event(&g->resp, ev, call_id, g->stream ? events : NULL));
        g->failed |= g->resp.failed;
        return;
    }
    if (!g->stream)
        return;
    if (g->req->anthropic) {
        json_t *events[3];
        send_events(g, events, lily_anth_stream_event(&g->anth, ev, call_id, events));
        return;
    }
    json_t *delta = NULL;
    switch (ev->kind) {
    case LILY_OUTPUT_REASONING: delta = lily_oai_delta_text("reasoning_content", ev->text, ev->len); break;
    case LILY_OUTPUT_CONTENT: delta = lily_oai_delta_text("content", ev->text, ev->len); break;
    case LILY_OUTPUT_TOOL_CALL_START:
        if (ev->tool_index < g->n_calls)
            delta = lily_oai_delta_tool_open(ev->tool_index, g->call_ids[ev->tool_index], ev->text);
        break;
    case LILY_OUTPUT_TOOL_ARGUMENTS: delta = lily_oai_delta_tool_args(ev->tool_index, ev->text, ev->len); break;
    case LILY_OUTPUT_TOOL_CALL_END: break;
    }
    if (delta)
        send_json_chunk(g, lily_oai_chat_chunk(&g->ident, delta, NULL, take_logprobs(g), g->req->include_usage));
}

/* Generated text that got past the stop strings. */
static lily_status deliver_text_now(generation *g, const char *text, size_t len, lily_error *err)
{
    if (g->parser)
        return lily_output_parser_feed(g->parser, text, len, err);
    if (g->stream) {
        send_json_chunk(g, lily_oai_completion_chunk(&g->ident, text, len, NULL, take_logprobs(g),
                                                     g->req->include_usage));
        return LILY_OK;
    }
    if (!buffer_add(&g->text, text, len))
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
    return LILY_OK;
}

/* Generated text on to the parser (chat), the stream or the body; what it streams is output (the first of
 * it is remembered for the log's time to the first byte: lily_job_write_output). */
static lily_status deliver_text(generation *g, const char *text, size_t len, lily_error *err)
{
    if (!len)
        return LILY_OK;
    g->in_output = true;
    lily_status st = deliver_text_now(g, text, len, err);
    g->in_output = false;
    return st;
}

/* A token's logprobs (runtime/logprobs.h) with the tokens' text, appended to the ones to send. */
static lily_status record_logprob(generation *g, const lily_token_logprobs *tl, int32_t token, lily_error *err)
{
    lily_service *svc = g->svc;
    if (g->n_lps == g->cap_lps) {
        int cap = g->cap_lps ? g->cap_lps * 2 : 16;
        lily_oai_logprob *p = realloc(g->lps, (size_t)cap * sizeof *p);
        if (!p)
            return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
        g->lps = p;
        g->cap_lps = cap;
    }
    lily_oai_logprob *lp = &g->lps[g->n_lps];
    memset(lp, 0, sizeof *lp);
    size_t len = 0;
    const char *bytes = lily_tokenizer_token_bytes(svc->tok, token, &len);
    lp->token = strndup(bytes ? bytes : "", bytes ? len : 0);
    lp->token_len = (int)(bytes ? len : 0);
    lp->logprob = tl->logprob;
    const int n = LILY_MIN(tl->n_top, LILY_MIN(g->req->top_logprobs, 20));
    for (int k = 0; k < n; k++) {
        bytes = lily_tokenizer_token_bytes(svc->tok, tl->top_ids[k], &len);
        lp->top[k].token = strndup(bytes ? bytes : "", bytes ? len : 0);
        lp->top[k].token_len = (int)(bytes ? len : 0);
        lp->top[k].logprob = tl->top_logprobs[k];
    }
    lp->n_top = n;
    g->n_lps++;
    if (!lp->token)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
    return LILY_OK;
}

/* tool_choice "required": the tool names (each followed by ">\n") the model may spell after "<function=". */
typedef struct {
    char **names;
    int n;
    buffer spelled;
    bool active;
} name_constraint;

/* Whether token bytes b[len] keep `spelled` a prefix of some "NAME>\n" (its bytes a prefix of a name's rest). */
static bool name_continues(const name_constraint *nc, const char *b, size_t len)
{
    for (int i = 0; b && len && i < nc->n; i++) {
        size_t nl = strlen(nc->names[i]);
        if (nc->spelled.len + len <= nl &&
            (!nc->spelled.len || !memcmp(nc->names[i], nc->spelled.data, nc->spelled.len)) &&
            !memcmp(nc->names[i] + nc->spelled.len, b, len))
            return true;
    }
    return false;
}

static int compare_ids(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Mask logits to the tokens that keep `spelled` a prefix of some "NAME>\n": the trie's tokens along each
 * name's rest (lily_token_trie_prefixes, one walk per name instead of a look at every token), and the
 * special tokens (not in the trie) checked on their own. Returns how many are allowed, or -1 out of memory. */
static int constrain_name(const lily_service *svc, const name_constraint *nc, const float *logits, float *out)
{
    for (int32_t id = 0; id < svc->vocab; id++)
        out[id] = -INFINITY;
    int n = 0, cap = 0;
    int32_t *ids = NULL;
    for (int pass = 0; pass < 2; pass++) { /* count, then list */
        n = 0;
        for (int i = 0; i < nc->n; i++) {
            const size_t nl = strlen(nc->names[i]);
            if (nc->spelled.len >= nl || (nc->spelled.len && memcmp(nc->names[i], nc->spelled.data, nc->spelled.len)))
                continue;
            n += lily_token_trie_prefixes(svc->trie, nc->names[i] + nc->spelled.len, nl - nc->spelled.len,
                                          ids ? ids + n : NULL, ids ? cap - n : 0);
        }
        if (pass == 0 && !(ids = malloc(((size_t)n + 1) * sizeof *ids)))
            return -1;
        cap = n;
    }
    qsort(ids, (size_t)n, sizeof *ids, compare_ids); /* a token along two names' rests counts once */
    int allowed = 0;
    for (int k = 0; k < n; k++)
        if (k == 0 || ids[k] != ids[k - 1]) {
            out[ids[k]] = logits[ids[k]];
            allowed++;
        }
    free(ids);
    for (int k = 0; k < svc->n_special_ids; k++) {
        size_t len = 0;
        const int32_t id = svc->special_ids[k];
        if (name_continues(nc, lily_tokenizer_token_bytes(svc->tok, id, &len), len)) {
            out[id] = logits[id];
            allowed++;
        }
    }
    return allowed;
}

static bool name_complete(const name_constraint *nc)
{
    for (int i = 0; i < nc->n; i++)
        if (nc->spelled.len && nc->spelled.len == strlen(nc->names[i]) &&
            !memcmp(nc->names[i], nc->spelled.data, nc->spelled.len))
            return true;
    return false;
}

static void name_constraint_free(name_constraint *nc)
{
    for (int i = 0; i < nc->n; i++)
        free(nc->names[i]);
    free(nc->names);
    free(nc->spelled.data);
}

static lily_sampler_params sampler_params(const lily_service *svc, const lily_oai_request *req,
                                          lily_logit_bias *bias)
{
    lily_sampler_params p = svc->defaults;
    if (!isnan(req->temperature))
        p.temperature = (float)req->temperature;
    if (!isnan(req->top_p))
        p.top_p = (float)req->top_p;
    p = lily_sampler_params_normalize(p); /* top_p 0: greedy */
    if (req->top_k >= 0)
        p.top_k = req->top_k;
    if (!isnan(req->min_p))
        p.min_p = (float)req->min_p;
    if (!isnan(req->presence_penalty))
        p.presence_penalty = (float)req->presence_penalty;
    if (!isnan(req->frequency_penalty))
        p.frequency_penalty = (float)req->frequency_penalty;
    if (!isnan(req->repetition_penalty))
        p.repetition_penalty = (float)req->repetition_penalty;
    for (int i = 0; i < req->n_logit_bias; i++) { /* ids checked against the vocabulary by logit_bias_ok */
        bias[i].token = req->logit_bias[i].token;
        bias[i].bias = req->logit_bias[i].bias;
    }
    p.logit_bias = bias;
    p.n_logit_bias = req->n_logit_bias;
    /* a request's seed -1 is a random one, as llama.cpp's server takes it (its clients send -1 for "random":
     * as a fixed seed every regenerated reply came out the same); without one, --seed's, else random */
    if (req->has_seed && req->seed != UINT64_MAX) {
        p.seed = req->seed;
    } else if (!req->has_seed && svc->request_defaults.has_seed) {
        p.seed = svc->request_defaults.seed;
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        /* within int64, so the seed the request log gives can be sent back as a request's seed */
        p.seed = ((uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec ^ svc->n_requests) & INT64_MAX;
    }
    return p;
}

static void fail_with(lily_job *job, int http_status, const char *type, const char *param, const char *code,
                      const char *message)
{
    lily_oai_error e;
    lily_oai_error_set(&e, http_status, type, param, code, "%s", message);
    lily_job_fail(job, &e);
}

/* Answer 200 with the JSON object r as the body; r is consumed (NULL = out of memory), and a failure to
 * build or serialize it answers 500 instead. */
static void respond_json(lily_job *job, json_t *r)
{
    char *s = r ? lily_oai_dump(r) : NULL;
    json_decref(r);
    if (!s) {
        fail_with(job, 500, "server_error", NULL, NULL, "Out of memory.");
        return;
    }
    lily_job_begin(job, 200, false);
    lily_job_write(job, s, strlen(s));
    free(s);
    lily_job_finish(job);
}

static int job_cancelled(void *job) { return lily_job_cancelled(job); }

/* A job the server's shutdown cancelled (lily_job_abort): its client still waits, so it gets a 503 (or an
 * error event on its stream), never a 200 with an empty or cut body. A job whose client left gets nothing. */
static void answer_aborted(lily_job *job)
{
    if (lily_job_aborted(job))
        fail_with(job, 503, "unavailable_error", NULL, NULL,
                  "The server is shutting down: this response was cancelled before its end.");
}

/* Prefill the prompt into the session through the prefix cache: resume from the deepest cached (or live)
 * prefix, prefill the rest, checkpoint on the way (runtime/prefix_cache.h). A vanished client stops a
 * long prefill between forward passes. *reused: tokens not recomputed. */
static lily_status prefill(lily_service *svc, lily_job *job, const int32_t *ids, int n, int *reused, lily_error *err)
{
    /* a prefill (continue_final) follows the continued turn's <think> block: the marks are those of the prompt
     * up to that <think>, where the next turn's request (which renders this turn without it) leaves this one */
    int n_head = n;
    for (int i = n - 1; job->req.continue_final && svc->think >= 0 && i > 0; i--)
        if (ids[i] == svc->think) {
            n_head = i + 1;
            break;
        }
    int marks[2];
    const int n_marks = lily_prefix_cache_chat_marks(ids, n_head, svc->im_start, svc->im_end, svc->think, marks);
    lily_status st = lily_prefix_cache_prefill(svc->cache, svc->session, ids, n, marks, n_marks, job_cancelled, job,
                                               reused, err);
    if (st != LILY_OK && st != LILY_ERR_CANCELLED) /* a cancelled prefill keeps the prefix it computed */
        lily_session_reset(svc->session);
    return st;
}

/* echo with logprobs (completions): prefill the prompt without the prefix cache, in pieces whose every row of
 * logits is kept, and record each prompt token's logprob under the logits of the position before it (the
 * first token's is NaN: nothing predicts it), as OpenAI's and vLLM's echo report them. Pieces hold at most
 * 64 MiB of logits (*n_pieces: how many). A vanished client stops it between pieces (LILY_ERR_CANCELLED). */
static lily_status prefill_scored(generation *g, const int32_t *ids, int n, int *n_pieces, lily_error *err)
{
    lily_service *svc = g->svc;
    lily_session *s = svc->session;
    const int vocab = svc->vocab;
    const size_t row_bytes = (size_t)vocab * sizeof(float);
    const int rows = (int)LILY_MAX(1, LILY_MIN((size_t)svc->engine->prefill_chunk, ((size_t)64 << 20) / row_bytes));
    float *logits = malloc((size_t)rows * row_bytes);
    if (!logits)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory for the prompt's logits");
    lily_session_reset(s);
    lily_token_logprobs tl = {.logprob = NAN};
    lily_status st = record_logprob(g, &tl, ids[0], err);
    for (int at = 0; st == LILY_OK && at < n; at += rows) {
        if (lily_job_cancelled(g->job)) {
            st = lily_error_set(err, LILY_ERR_CANCELLED, "cancelled");
            break;
        }
        const int k = LILY_MIN(rows, n - at);
        st = lily_session_append(s, ids + at, k, logits, err);
        (*n_pieces)++;
        for (int i = 0; st == LILY_OK && i < k && at + i + 1 < n; i++) {
            lily_logprobs_compute(logits + (size_t)i * vocab, vocab, ids[at + i + 1], g->req->top_logprobs, &tl);
            st = record_logprob(g, &tl, ids[at + i + 1], err);
        }
    }
    free(logits);
    if (st != LILY_OK && st != LILY_ERR_CANCELLED)
        lily_session_reset(s);
    return st;
}

char *lily_service_metrics(void *user)
{
    lily_service *svc = user;
    return lily_prefix_cache_metrics(svc->cache);
}

int lily_service_context_length(void *user)
{
    lily_service *svc = user;
    return atomic_load(&svc->context_length);
}

static lily_status detok_feed(void *state, int32_t token, const char **text, size_t *len, lily_error *err)
{
    return lily_detokenizer_feed(state, token, text, len, err);
}

static lily_status detok_flush(void *state, const char **text, size_t *len, lily_error *err)
{
    return lily_detokenizer_flush(state, text, len, err);
}

/* lily_generate's per-token callback: logprobs (lily_generate filled g->token_logprobs), the reasoning
 * count, and the text on to the parser or the stream. */
/* The checkpoints the prefill deferred (lily_prefix_cache_defer: the end of the prompt, a mark inside its
 * last pass): stored once the first token's text is on its way to the client, before anything is appended
 * to the session. A failure loses the checkpoints, not the request. */
static void flush_checkpoints(generation *g)
{
    if (g->flushed)
        return;
    g->flushed = true;
    lily_error err = {0};
    if (lily_prefix_cache_flush(g->svc->cache, g->svc->session, &err) != LILY_OK)
        fprintf(stderr, "lily serve: warning: the prompt's checkpoints were not kept (%s)\n", err.message);
    lily_prefix_cache_stats pcs;
    lily_prefix_cache_stats_get(g->svc->cache, &pcs);
    g->job->stats.flush_ms = 1e3 * pcs.last_flush_s;
}

/* The reply's first token is chosen (generated, or forced by the server: a tool-call opening): the log's ttft.
 * A reply made only of forced tokens has one too (it read 0.0). */
static void note_first_token(generation *g)
{
    if (g->job->stats.ttft_ms == 0)
        g->job->stats.ttft_ms = LILY_MAX(1e3 * (lily_wall_seconds() - g->t_start), 1e-3);
}

static int on_token(void *user, int32_t token, const char *text, size_t len)
{
    generation *g = user;
    lily_error err;
    if (token >= 0) {
        note_first_token(g);
        if (g->req->logprobs && record_logprob(g, &g->token_logprobs, token, &err) != LILY_OK)
            g->failed = true;
        if (token == g->svc->think_end)
            g->think_closed = true;
        else if (g->thinking && !g->reasoning_done && !g->think_closed)
            g->reasoning_tokens++;
    }
    if (deliver_text(g, text, len, &err) != LILY_OK)
        g->failed = true;
    if (token >= 0) /* before lily_generate appends it */
        flush_checkpoints(g);
    return g->failed || lily_job_cancelled(g->job) || (g->one_call && g->call_closed);
}

/* Append one token the server chose (a forced tool-call opening) as if generated: logprob, text, session. */
static lily_status append_chosen(generation *g, int32_t token, lily_error *err)
{
    lily_session *s = g->svc->session;
    if (s->n_tokens + 1 > s->max_ctx)
        return lily_error_set(err, LILY_ERR_CONTEXT_LENGTH, "context full");
    if (g->req->logprobs) {
        lily_logprobs_compute(s->logits, g->svc->vocab, token, g->req->top_logprobs, &g->token_logprobs);
        lily_status st = record_logprob(g, &g->token_logprobs, token, err);
        if (st != LILY_OK)
            return st;
    }
    size_t len = 0;
    const char *bytes = lily_tokenizer_token_bytes(g->svc->tok, token, &len);
    note_first_token(g);
    lily_status st = deliver_text(g, bytes ? bytes : "", bytes ? len : 0, err);
    if (st != LILY_OK)
        return st;
    flush_checkpoints(g);
    return lily_session_append(s, &token, 1, NULL, err);
}

/* append_chosen for tokens[0, n) without their logprobs, in one forward pass: their text, then the session
 * (the tokens the context holds; LILY_ERR_CONTEXT_LENGTH after them when not all fit). *n_appended: how many. */
static lily_status append_chosen_run(generation *g, const int32_t *tokens, int n, int *n_appended, lily_error *err)
{
    lily_session *s = g->svc->session;
    const int fit = LILY_MIN(n, LILY_MAX(s->max_ctx - s->n_tokens, 0));
    lily_status st = LILY_OK;
    if (fit > 0)
        note_first_token(g);
    for (int i = 0; i < fit && st == LILY_OK; i++) {
        size_t len = 0;
        const char *bytes = lily_tokenizer_token_bytes(g->svc->tok, tokens[i], &len);
        st = deliver_text(g, bytes ? bytes : "", bytes ? len : 0, err);
    }
    if (st != LILY_OK)
        return st;
    flush_checkpoints(g);
    if (fit > 0 && (st = lily_session_append(s, tokens, fit, NULL, err)) != LILY_OK)
        return st;
    *n_appended += fit;
    return fit < n ? lily_error_set(err, LILY_ERR_CONTEXT_LENGTH, "context full") : LILY_OK;
}

/* tool_choice required: after "<function=", draw the tool's name token by token from the logits masked to
 * the listed names, so the call names a real tool whatever the model prefers; *n_tokens (the reply's tokens
 * so far) stops at max_tokens, leaving the name unfinished. */
static lily_status spell_tool_name(generation *g, name_constraint *nc, const lily_sampler_params *sp, int *n_tokens,
                                   int max_tokens, lily_error *err)
{
    lily_service *svc = g->svc;
    lily_sampler *sampler = NULL;
    lily_status st = lily_sampler_new(sp, svc->vocab, &sampler, err);
    while (st == LILY_OK && !name_complete(nc) && *n_tokens < max_tokens) {
        int32_t token = -1;
        const int n_allowed = constrain_name(svc, nc, svc->session->logits, svc->scratch);
        if (n_allowed < 0) {
            st = lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
            break;
        }
        if (n_allowed > 0) {
            token = lily_sampler_sample(sampler, svc->scratch);
        } else { /* no single token continues a name here: spell the rest of the first name that fits */
            for (int i = 0; i < nc->n && token < 0; i++)
                if (!memcmp(nc->names[i], nc->spelled.data ? nc->spelled.data : "", nc->spelled.len)) {
                    int32_t *rest = NULL;
                    int n_rest = 0;
                    const char *tail = nc->names[i] + nc->spelled.len;
                    if (lily_tokenizer_encode(svc->tok, tail, strlen(tail), false, &rest, &n_rest, err) == LILY_OK &&
                        n_rest > 0)
                        token = rest[0];
                    free(rest);
                }
            if (token < 0)
                break;
        }
        size_t blen = 0;
        const char *b = lily_tokenizer_token_bytes(svc->tok, token, &blen);
        if (!buffer_add(&nc->spelled, b ? b : "", b ? blen : 0))
            st = lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
        else if ((st = lily_sampler_accept(sampler, token, err)) == LILY_OK &&
                 (st = append_chosen(g, token, err)) == LILY_OK)
            (*n_tokens)++;
    }
    lily_sampler_free(sampler);
    return st;
}

/* Every logit_bias key is a token id of the model's vocabulary; else a 400 written to the job (false), as
 * for out-of-vocabulary prompt ids (OpenAI rejects unknown ids too). */
static bool logit_bias_ok(const lily_service *svc, lily_job *job)
{
    const lily_oai_request *req = &job->req;
    for (int i = 0; i < req->n_logit_bias; i++)
        if (req->logit_bias[i].token >= svc->vocab) {
            char msg[160];
            snprintf(msg, sizeof msg, "Invalid key in 'logit_bias': token id %d is outside the vocabulary (%d).",
                     req->logit_bias[i].token, svc->vocab);
            fail_with(job, 400, "invalid_request_error", "logit_bias", NULL, msg);
            return false;
        }
    return true;
}

/* The prompt's token ids, or an error already written to the job (returns false; *ids may still need freeing).
 * reply_room: the tokens of reply the context must hold after the prompt: 1 for a generation (a prompt that
 * leaves no room for one token is an error), 0 for a completion that only scores its prompt (echo with
 * max_tokens 0: a prompt of the full context fits), -1 for none (count_tokens counts any length: a client
 * asks it to learn whether the prompt fits). */
static bool prompt_ids(lily_service *svc, lily_job *job, int reply_room, bool *thinking, int32_t **ids, int *n_ids)
{
    lily_oai_request *req = &job->req;
    lily_error err = {0};
    lily_status st;
    const bool must_fit = reply_room >= 0;
    /* A prompt that must fit stops tokenizing at twice the context: a huge one is refused at little cost, and
     * one up to twice too long still gets its count in the error (a client trims by it). */
    int max_ids = must_fit ? svc->session->max_ctx - reply_room : -1;
    int count_ids = (int)LILY_MIN(2 * (int64_t)svc->session->max_ctx, INT32_MAX - 1);
    *thinking = false;
    if (req->enable_thinking < 0) /* the request did not say (nor reasoning_effort): the server's default */
        req->enable_thinking = svc->request_defaults.enable_thinking;
    if (req->reasoning_budget < 0) /* the request set none: the server's --reasoning-budget (decode_reply uses it) */
        req->reasoning_budget = svc->request_defaults.reasoning_budget;
    if (req->max_tokens < 0) /* as OpenAI, a completion without max_tokens is 16 tokens; a chat reply is not cut */
        req->max_tokens = svc->request_defaults.max_tokens >= 0 ? svc->request_defaults.max_tokens
                        : req->is_chat ? -1 : 16;
    if (req->is_chat) {
        char *prompt = NULL;
        size_t plen = 0;
        json_t *treq = lily_oai_template_request(req);
        lily_chat_options co; /* a system / developer message after a user turn, as agents send: folded */
        lily_chat_options_init(&co);
        co.fold_system = 1;
        st = treq ? lily_chat_render_n(treq, &co, &prompt, &plen, &err)
                  : lily_error_set(&err, LILY_ERR_OUT_OF_MEMORY, "Out of memory.");
        json_decref(treq);
        if (st == LILY_ERR_TEMPLATE && req->responses) { /* named by the Responses input item sent */
            lily_oai_error e;
            lily_resp_template_error(req, err.message, &e);
            lily_job_fail(job, &e);
            return false;
        }
        if (st != LILY_OK) {
            fail_with(job, st == LILY_ERR_TEMPLATE ? 400 : 500,
                      st == LILY_ERR_TEMPLATE ? "invalid_request_error" : "server_error",
                      st == LILY_ERR_TEMPLATE ? "messages" : NULL, NULL, err.message);
            return false;
        }
        *thinking = plen >= 8 && !memcmp(prompt + plen - 8, "<think>\n", 8);
        st = lily_tokenizer_encode_max(svc->tok, prompt, plen, true, max_ids, count_ids, ids, n_ids, &err);
        free(prompt);
    } else if (req->prompt_text) {
        st = lily_tokenizer_encode_max(svc->tok, req->prompt_text, req->prompt_text_len, true, max_ids, count_ids,
                                       ids, n_ids, &err);
    } else {
        for (int i = 0; i < req->n_prompt_ids; i++)
            if (req->prompt_ids[i] >= svc->vocab) {
                char msg[160];
                snprintf(msg, sizeof msg, "Invalid 'prompt[%d]': token id %d is outside the vocabulary (%d).", i,
                         req->prompt_ids[i], svc->vocab);
                fail_with(job, 400, "invalid_request_error", "prompt", NULL, msg);
                return false;
            }
        *ids = malloc((size_t)req->n_prompt_ids * sizeof **ids);
        if (*ids)
            memcpy(*ids, req->prompt_ids, (size_t)req->n_prompt_ids * sizeof **ids);
        *n_ids = req->n_prompt_ids;
        st = *ids ? LILY_OK : lily_error_set(&err, LILY_ERR_OUT_OF_MEMORY, "Out of memory.");
    }
    if (st != LILY_OK) {
        fail_with(job, st == LILY_ERR_INVALID_ARGUMENT ? 400 : 500,
                  st == LILY_ERR_INVALID_ARGUMENT ? "invalid_request_error" : "server_error", NULL, NULL, err.message);
        return false;
    }
    int max_ctx = svc->session->max_ctx;
    job->stats.prompt_tokens = *n_ids; /* the request log's prompt=, also for a 400 below */
    if (*n_ids == 0 || (must_fit && *n_ids > max_ctx - reply_room)) {
        const char *what = req->responses ? "input" : req->is_chat ? "messages" : "prompt";
        char msg[256];
        if (*n_ids == 0)
            snprintf(msg, sizeof msg, "The prompt is empty.");
        else
            snprintf(msg, sizeof msg, "This model's maximum context length is %d tokens. However, your %s resulted "
                     "in %s%d tokens, %s. Please reduce the length of the %s.", max_ctx, what,
                     *ids ? "" : "more than ", *ids ? *n_ids : *n_ids - 1,
                     reply_room > 0 ? "which leaves no room for the reply (at least one token)" : "more than it holds",
                     what);
        fail_with(job, 400, "invalid_request_error", what, *n_ids ? "context_length_exceeded" : NULL, msg);
        return false;
    }
    return true;
}

/* tool_choice required / named: the token ids the reply must open with into *forced ("<tool_call>\n<function=NAME>\n"
 * for a named tool; up to "<function=" for required, with the listed names, each as "NAME>\n", into nc for
 * spell_tool_name), after "\n</think>\n\n" when the prompt opened a think block (thinking). False: an error
 * already written to the job. */
static bool tool_call_opening(lily_service *svc, lily_job *job, bool thinking, int32_t **forced, int *n_forced,
                              name_constraint *nc)
{
    const lily_oai_request *req = &job->req;
    lily_error err = {0};
    char head[512];
    /* a prompt that opened a think block: close it first (empty reasoning), so the reply stays well formed */
    snprintf(head, sizeof head, req->tool_choice == LILY_TOOL_CHOICE_NAMED ? "%s<tool_call>\n<function=%s>\n"
                                                                           : "%s<tool_call>\n<function=",
             thinking ? "\n</think>\n\n" : "", req->tool_name);
    if (lily_tokenizer_encode(svc->tok, head, strlen(head), true, forced, n_forced, &err) != LILY_OK) {
        fail_with(job, 500, "server_error", NULL, NULL, err.message);
        return false;
    }
    if (req->tool_choice == LILY_TOOL_CHOICE_REQUIRED) {
        nc->names = calloc(json_array_size(req->tools) + 1, sizeof *nc->names);
        for (size_t i = 0; nc->names && i < json_array_size(req->tools); i++) {
            const char *name =
                json_string_value(json_object_get(json_object_get(json_array_get(req->tools, i), "function"), "name"));
            if (!(nc->names[nc->n] = malloc(strlen(name) + 3)))
                break;
            sprintf(nc->names[nc->n++], "%s>\n", name);
        }
    }
    return true;
}

/* The status is decided: start the response (200), the stream's role chunk, and a completion's echoed
 * prompt (sent on a stream, else kept for the body). A Messages API stream starts after the prefill. */
static void begin_response(generation *g, const int32_t *ids, int n_ids)
{
    const lily_oai_request *req = g->req;
    lily_error err = {0};
    lily_job_begin(g->job, 200, g->stream);
    if (g->stream && req->anthropic) /* message_start follows the prefill (anthropic_stream_start) */
        return;
    if (g->stream && req->responses) {
        json_t *events[2];
        send_events(g, events, lily_resp_stream_start(&g->resp, events));
        return;
    }
    if (g->stream && req->is_chat)
        send_json_chunk(g, lily_oai_chat_chunk(&g->ident, lily_oai_delta_role(), NULL, NULL, req->include_usage));
    if (!req->is_chat && req->echo) {
        const char *echo = req->prompt_text;
        char *decoded = NULL;
        size_t elen = req->prompt_text_len;
        if (!echo && lily_tokenizer_decode(g->svc->tok, ids, n_ids, false, &decoded, &elen, &err) == LILY_OK)
            echo = decoded;
        if (echo && g->stream && g->prompt_logprobs) { /* sent with its logprobs after the prefill */
            if ((g->echo_text = malloc(elen + 1))) {
                memcpy(g->echo_text, echo, elen);
                g->echo_text[elen] = 0;
                g->echo_len = elen;
            } else {
                g->failed = true;
            }
        } else if (echo && g->stream)
            send_json_chunk(g, lily_oai_completion_chunk(&g->ident, echo, elen, NULL, NULL, req->include_usage));
        else if (echo)
            buffer_add(&g->text, echo, elen);
        /* text_offset counts from the echoed prompt's start: its own tokens' when they are scored */
        g->lp_text_offset = echo && !g->prompt_logprobs ? (int)elen : 0;
        free(decoded);
    }
}

/* A Messages API stream's message_start and ping, once the prefill has said how many prompt tokens came from the
 * prefix cache: its usage splits the prompt into input_tokens and cache_read_input_tokens as Anthropic's
 * does (and as the closing message_delta does). */
static void anthropic_stream_start(generation *g, int n_ids, int reused)
{
    json_t *events[2];
    lily_anth_usage u = {.input_tokens = n_ids - reused, .cache_read_input_tokens = reused};
    send_events(g, events, lily_anth_stream_start(g->ident.id, g->ident.model, &u, events));
}

/* Constrain the rest of the generation by g->grammar (when set): a matcher on the vocabulary trie (built at
 * load) that waits for "</think>" when the reply is still inside a think block (think_close >= 0). */
static lily_status start_constraint(generation *g, int32_t think_close, lily_generate_params *gp, lily_error *err)
{
    lily_service *svc = g->svc;
    if (!g->grammar)
        return LILY_OK;
    lily_status st = LILY_OK;
    lily_grammar_constraint_options o = {.grammar = g->grammar, .trie = svc->trie, .tok = svc->tok, .vocab = svc->vocab,
                                         .stop_ids = svc->stop_ids, .n_stop_ids = svc->n_stop_ids,
                                         .think_close = think_close};
    if ((st = lily_grammar_constraint_new(&o, &g->constraint, err)) != LILY_OK)
        return st;
    g->hook = lily_grammar_constraint_hook(g->constraint);
    gp->constraint = &g->hook;
    const lily_oai_request *req = g->req;
    if (req->is_chat && req->json_output && req->tools && req->tool_choice == LILY_TOOL_CHOICE_AUTO &&
        svc->call_open >= 0) { /* the model may still call a tool instead of answering in the format */
        g->or_call = (lily_structured_or_call){.inner = g->hook, .tok = svc->tok, .call_open = svc->call_open,
                                               .think_close = think_close};
        g->or_call_hook = lily_structured_or_call_hook(&g->or_call);
        gp->constraint = &g->or_call_hook;
    }
    return LILY_OK;
}

/* Decode: the forced opening, the constrained tool name, then the model on its own (lily_generate) up to
 * max_tokens counting the chosen tokens: a max_tokens below the opening's length cuts the opening there, as
 * it cuts any reply (usage never counts more). A context filled by the chosen tokens ends the reply as
 * "length" (LILY_OK). *n_chosen: the tokens the server chose; *res: lily_generate's result (finish LENGTH
 * when it did not run). */
static lily_status decode_reply(generation *g, const int32_t *forced, int n_forced, name_constraint *nc,
                                lily_generate_params *gp, lily_detokenizer *detok, lily_generate_result *res,
                                int *n_chosen, lily_error *err)
{
    lily_service *svc = g->svc;
    const lily_oai_request *req = g->req;
    lily_status st = LILY_OK;
    const int cap = req->max_tokens < 0 ? INT_MAX : req->max_tokens;
    if (req->logprobs) { /* each token's logprob from the logits before it: one forward pass per token */
        for (int i = 0; i < n_forced && *n_chosen < cap && st == LILY_OK; i++)
            if ((st = append_chosen(g, forced[i], err)) == LILY_OK)
                (*n_chosen)++;
    } else if (n_forced > 0 && cap > 0) {
        st = append_chosen_run(g, forced, LILY_MIN(n_forced, cap), n_chosen, err);
    }
    if (st == LILY_OK && nc->n > 0 && *n_chosen == n_forced) {
        st = spell_tool_name(g, nc, &gp->sampling, n_chosen, cap, err);
        if (st == LILY_OK && name_complete(nc) && nc->spelled.len > 2) /* "NAME>\n": the arguments of that tool */
            g->grammar = lily_structured_tool_grammar(req, nc->spelled.data, nc->spelled.len - 2);
    }
    if (st == LILY_OK) /* a tool call's arguments at once; response_format content after the think block */
        st = start_constraint(g, req->json_output && n_forced == 0 && g->thinking ? svc->think_end : -1, gp, err);
    /* the reasoning budget watches an open think block; a forced tool-call opening has already closed it */
    if (st == LILY_OK && g->thinking && n_forced == 0 && svc->think_close && req->reasoning_budget >= 0) {
        gp->reasoning_budget = req->reasoning_budget;
        gp->think_close = svc->think_close;
        gp->n_think_close = svc->n_think_close;
        gp->think_end_id = svc->think_end;
    }
    *res = (lily_generate_result){.finish = LILY_FINISH_LENGTH};
    if (st == LILY_ERR_CONTEXT_LENGTH) {
        st = LILY_OK;
    } else if (st == LILY_OK && (req->max_tokens < 0 || *n_chosen < req->max_tokens)) {
        gp->max_tokens = req->max_tokens < 0 ? 0 : req->max_tokens - *n_chosen;
        gp->stop_ids = svc->stop_ids;
        gp->n_stop_ids = svc->n_stop_ids;
        gp->stop_strings = (const char *const *)req->stop;
        gp->n_stop_strings = req->n_stop;
        gp->detok = (lily_detok_interface){.state = detok, .feed = detok_feed, .flush = detok_flush};
        gp->on_token = on_token;
        gp->user = g;
        st = lily_generate(svc->session, NULL, 0, gp, res, err);
    }
    return st;
}

/* The whole response body of a request that did not stream: the chat message (content, reasoning, tool
 * calls with the ids the parser events gave them) or the completion text. NULL when out of memory. */
static json_t *response_json(generation *g, const char *finish, const lily_oai_usage *usage)
{
    json_t *resp;
    if (g->req->is_chat) {
        const lily_parsed_output *o = lily_output_parser_result(g->parser);
        lily_oai_tool_call *calls = calloc((size_t)o->n_tool_calls + 1, sizeof *calls);
        for (int i = 0; calls && i < o->n_tool_calls; i++) {
            if (i < g->n_calls)
                memcpy(calls[i].id, g->call_ids[i], sizeof calls[i].id);
            else
                lily_oai_tool_call_id(calls[i].id);
            calls[i].name = o->tool_calls[i].name;
            calls[i].arguments = o->tool_calls[i].arguments;
        }
        resp = calls ? lily_oai_chat_response(&g->ident, o->content, o->content_len, o->reasoning, o->reasoning_len,
                                              calls, o->n_tool_calls, finish, take_logprobs(g), usage)
                     : NULL;
        free(calls);
    } else {
        resp = lily_oai_completion_response(&g->ident, g->text.data ? g->text.data : "", g->text.len, finish,
                                            take_logprobs(g), usage);
    }
    return resp;
}

/* finish_reply for the Messages API: message_delta + message_stop on a stream, else the message. */
static void finish_anthropic(generation *g, const char *finish, const lily_oai_usage *usage)
{
    const char *stop_reason = lily_anth_stop_reason(finish, g->stop_sequence);
    lily_anth_usage u = {.input_tokens = usage->prompt_tokens - usage->cached_tokens,
                         .cache_read_input_tokens = usage->cached_tokens, .output_tokens = usage->completion_tokens};
    if (g->stream) {
        json_t *events[3];
        send_events(g, events, lily_anth_stream_end(&g->anth, stop_reason, g->stop_sequence, &u, events));
        lily_job_finish(g->job);
        return;
    }
    json_t *msg = lily_anth_message(g->ident.id, g->ident.model, lily_output_parser_result(g->parser), g->call_ids,
                                    g->n_calls, stop_reason, g->stop_sequence, &u);
    respond_json(g->job, msg);
}

/* finish_reply for the Responses API: the open item closed, then response.completed (or .incomplete) on a
 * stream, else the Response. */
static void finish_responses(generation *g, const char *finish, const lily_oai_usage *usage)
{
    const bool incomplete = !strcmp(finish, "length");
    json_t *events[4];
    send_events(g, events, lily_resp_output_end(&g->resp, incomplete, usage, g->stream ? events : NULL));
    if (g->failed || g->resp.failed) {
        fail_with(g->job, 500, "server_error", NULL, NULL, "Out of memory.");
        return;
    }
    if (g->stream) {
        lily_job_finish(g->job);
        return;
    }
    respond_json(g->job, lily_resp_response(&g->resp, incomplete ? "incomplete" : "completed", usage));
}

/* The end of a generated reply: flush the output parser (its finish_reason wins: tool_calls), fill the
 * usage, then on a stream the last chunk, the usage chunk and [DONE]; else the whole body. Errors are
 * written to the job. */
static void finish_reply(generation *g, const char *finish, int n_prompt, int n_generated, int reused)
{
    const lily_oai_request *req = g->req;
    lily_job *job = g->job;
    lily_error err = {0};
    g->in_output = true; /* text the parser held to the end */
    lily_status pst = !g->parser        ? LILY_OK
                      : g->stop_sequence ? lily_output_parser_finish_stopped(g->parser, &err) /* a cut name: no call */
                                         : lily_output_parser_finish(g->parser, !strcmp(finish, "length"), &err);
    g->in_output = false;
    if (pst != LILY_OK) {
        fail_with(job, 500, "server_error", NULL, NULL, err.message);
        return;
    }
    if (g->parser) { /* a stop string that cut a call short ended the reply: "stop", the call kept unfinished */
        const lily_parsed_output *o = lily_output_parser_result(g->parser);
        finish = g->stop_sequence && o->call_unfinished && !o->cut_by_length ? "stop" : lily_output_finish_reason(o);
    }
    lily_oai_usage usage = {.prompt_tokens = n_prompt, .completion_tokens = n_generated, .cached_tokens = reused,
                            .reasoning_tokens = g->reasoning_tokens};
    if (req->anthropic) {
        finish_anthropic(g, finish, &usage);
        return;
    }
    if (req->responses) {
        finish_responses(g, finish, &usage);
        return;
    }
    if (g->stream) {
        if (req->is_chat)
            send_json_chunk(g, lily_oai_chat_chunk(&g->ident, json_object(), finish, take_logprobs(g),
                                                   req->include_usage));
        else
            send_json_chunk(g, lily_oai_completion_chunk(&g->ident, "", 0, finish, take_logprobs(g),
                                                         req->include_usage));
        if (req->include_usage)
            send_json_chunk(g, lily_oai_usage_chunk(&g->ident, req->is_chat, &usage));
        lily_job_write(job, "data: [DONE]\n\n", 14);
        lily_job_finish(job);
        return;
    }
    json_t *resp = response_json(g, finish, &usage);
    char *body = resp ? lily_oai_dump(resp) : NULL;
    json_decref(resp);
    if (!body) {
        fail_with(job, 500, "server_error", NULL, NULL, "Out of memory.");
        return;
    }
    lily_job_write(job, body, strlen(body));
    free(body);
    lily_job_finish(job);
}

static void run_generation(lily_service *svc, lily_job *job)
{
    lily_oai_request *req = &job->req;
    lily_session *s = svc->session;
    lily_error err = {0};
    lily_status st = LILY_OK;
    int32_t *ids = NULL, *forced = NULL;
    int n_ids = 0, n_forced = 0;
    lily_detokenizer detok;
    bool detok_ready = false;
    name_constraint nc = {0};
    lily_logit_bias *bias = NULL;
    generation g = {.svc = svc, .job = job, .req = req, .stream = req->stream,
                    .prompt_logprobs = !req->is_chat && req->echo && req->logprobs,
                    .one_call = req->is_chat && (req->tool_choice == LILY_TOOL_CHOICE_NAMED || req->single_tool_call),
                    .anth = {.index = -1, .kind = -1}, .t_start = lily_wall_seconds()};
    job->stats.worker_start_s = g.t_start;
    lily_oai_ident_init(&g.ident, req->is_chat, svc->model_name);
    if (req->anthropic || req->responses) { /* msg_ / resp_ and the same random part */
        const char *prefix = req->anthropic ? "msg_" : "resp_";
        const char *tail = g.ident.id + strlen("chatcmpl-");
        memmove(g.ident.id + strlen(prefix), tail, strlen(tail) + 1);
        memcpy(g.ident.id, prefix, strlen(prefix));
    }
    if (req->responses && !lily_resp_output_init(&g.resp, &g.ident, req->responses)) {
        fail_with(job, 500, "server_error", NULL, NULL, "Out of memory.");
        goto done;
    }
    svc->n_requests++;

    /* 1. the prompt's token ids (a bad conversation, a prompt over the context or a logit_bias id outside the
     *    vocabulary ends here with a 400) */
    /* max_tokens 0 (a completion with echo) only scores the prompt: it may fill the whole context */
    if (!logit_bias_ok(svc, job) || !prompt_ids(svc, job, req->max_tokens == 0 ? 0 : 1, &g.thinking, &ids, &n_ids))
        goto done;
    job->stats.prompt_ms = 1e3 * (lily_wall_seconds() - g.t_start);

    /* 2. tool_choice required / named: the text the reply must open with */
    if (req->is_chat && (req->tool_choice == LILY_TOOL_CHOICE_NAMED || req->tool_choice == LILY_TOOL_CHOICE_REQUIRED) &&
        !tool_call_opening(svc, job, g.thinking, &forced, &n_forced, &nc))
        goto done;

    /* the grammar of the named tool's arguments (a required call's is known once its name is spelled) or of
     * the content (response_format) */
    if (req->is_chat && req->tool_choice == LILY_TOOL_CHOICE_NAMED) {
        g.grammar = lily_structured_tool_grammar(req, req->tool_name, strlen(req->tool_name));
    } else if ((!req->is_chat || req->tool_choice != LILY_TOOL_CHOICE_REQUIRED) &&
               (st = lily_structured_response_grammar(req, &g.grammar, &err)) != LILY_OK) {
        fail_with(job, st == LILY_ERR_INVALID_ARGUMENT ? 400 : 500,
                  st == LILY_ERR_INVALID_ARGUMENT ? "invalid_request_error" : "server_error",
                  st != LILY_ERR_INVALID_ARGUMENT ? NULL : req->responses ? "text.format" : "response_format", NULL,
                  err.message);
        goto done;
    }

    /* 3. the parts of the pipeline */
    lily_output_parser_options po = {.thinking = g.thinking, .continuation = req->continue_final, .tools = req->tools,
                                     /* response_format's JSON is content as written, tags and all */
                                     .verbatim_answer = req->json_output && g.grammar &&
                                                        req->tool_choice != LILY_TOOL_CHOICE_NAMED &&
                                                        req->tool_choice != LILY_TOOL_CHOICE_REQUIRED,
                                     .on_event = on_parser_event, .user = &g};
    bias = calloc((size_t)req->n_logit_bias + 1, sizeof *bias);
    if (!bias || (req->is_chat && (st = lily_output_parser_new(&po, &g.parser, &err)) != LILY_OK)) {
        fail_with(job, 500, "server_error", NULL, NULL, bias ? err.message : "Out of memory.");
        goto done;
    }
    lily_generate_params gp = lily_generate_defaults();
    gp.sampling = sampler_params(svc, req, bias);
    job->stats.seed = gp.sampling.seed;
    job->stats.has_seed = true;
    if (svc->host_sampler)
        gp.decode = LILY_DECODE_HOST;
    if (req->logprobs) { /* on either decode path: the device loop computes them on the GPU */
        gp.logprobs = LILY_MIN(req->top_logprobs, LILY_TOP_LOGPROBS_MAX);
        gp.token_logprobs = &g.token_logprobs;
    }
    lily_sampler *probe = NULL; /* the sampler rejects bad parameters here, before the response starts */
    if ((st = lily_sampler_new(&gp.sampling, svc->vocab, &probe, &err)) != LILY_OK) {
        fail_with(job, 400, "invalid_request_error", NULL, NULL, err.message);
        goto done;
    }
    lily_sampler_free(probe);
    lily_detokenizer_init(&detok, svc->tok, false);
    detok_ready = true;

    /* 4. the status is decided: the response starts */
    begin_response(&g, ids, n_ids);

    /* 5. prefill */
    double t0 = lily_wall_seconds();
    int reused = 0;
    int n_pieces = 0;
    st = g.prompt_logprobs ? prefill_scored(&g, ids, n_ids, &n_pieces, &err)
                           : prefill(svc, job, ids, n_ids, &reused, &err);
    double t1 = lily_wall_seconds();
    job->stats.prompt_tokens = n_ids;
    job->stats.cached_tokens = reused;
    const int prefilled = s->n_tokens > reused ? s->n_tokens - reused : 0; /* a cancel stops short of n_ids */
    job->stats.prefill_tok_s = t1 > t0 ? prefilled / (t1 - t0) : 0;
    if (g.prompt_logprobs) { /* the prefix cache did not run: the time is forward passes */
        job->stats.forward_ms = 1e3 * (t1 - t0);
        job->stats.pieces = n_pieces;
    } else {
        lily_prefix_cache_stats pcs;
        lily_prefix_cache_stats_get(svc->cache, &pcs);
        job->stats.restore_ms = 1e3 * pcs.last_restore_s;
        job->stats.forward_ms = 1e3 * pcs.last_forward_s;
        job->stats.checkpoint_ms = 1e3 * pcs.last_checkpoint_s;
        job->stats.pieces = pcs.last_pieces;
    }
    if (st != LILY_OK) {
        if (st != LILY_ERR_CANCELLED)
            fail_with(job, 500, "server_error", NULL, NULL, err.message);
        else
            answer_aborted(job);
        goto done;
    }

    if (g.stream && req->anthropic)
        anthropic_stream_start(&g, n_ids, reused);
    if (g.echo_text) /* the echoed prompt with its tokens' logprobs */
        send_json_chunk(&g, lily_oai_completion_chunk(&g.ident, g.echo_text, g.echo_len, NULL,
                                                      take_logprobs(&g), req->include_usage));

    /* max_tokens 0 (a completion with echo: the prompt scored): nothing to generate; "length", as vLLM */
    if (req->max_tokens == 0) {
        flush_checkpoints(&g);
        finish_reply(&g, "length", n_ids, 0, reused);
        goto done;
    }

    /* 6. decode: the forced opening, the constrained tool name, then the model on its own */
    int n_chosen = 0;
    lily_generate_result res;
    st = decode_reply(&g, forced, n_forced, &nc, &gp, &detok, &res, &n_chosen, &err);
    flush_checkpoints(&g); /* no token came (a stop id first, an error): the prompt's are still valid */
    int n_generated = n_chosen + res.n_generated;
    job->stats.completion_tokens = n_generated;
    job->stats.decode_tok_s = res.decode_tokens_per_second;
    job->stats.decode_path = res.decode_path;
    if (gp.n_think_close > 0) /* the budget's forced close is not reasoning */
        g.reasoning_tokens = res.n_reasoning;
    if (gp.constraint && svc->engine->backend.ops->decode_loop)
        fprintf(stderr, "lily serve: structured output decoded with the %s\n", res.decode_path);
    if (lily_job_cancelled(job)) {
        if (st != LILY_OK) /* an error on the way out may have left the session between states */
            lily_session_reset(s);
        answer_aborted(job);
        goto done;
    }
    if (res.finish == LILY_FINISH_CANCELLED && g.one_call && g.call_closed && !g.failed)
        res.finish = LILY_FINISH_STOP; /* the named (or only allowed) call is complete: as OpenAI, one call */
    if (st != LILY_OK || g.failed || res.finish == LILY_FINISH_CANCELLED) {
        lily_session_reset(s);
        fail_with(job, 500, "server_error", NULL, NULL, st != LILY_OK ? err.message : "Out of memory.");
        goto done;
    }
    const char *finish = res.finish == LILY_FINISH_LENGTH ? "length" : "stop";
    if (res.stop_string >= 0 && res.stop_string < req->n_stop)
        g.stop_sequence = req->stop[res.stop_string];
    /* the end of the generation: what a follow-up request (this prompt + this reply) resumes from */
    lily_error cerr = {0};
    if (lily_prefix_cache_checkpoint(svc->cache, s, &cerr) != LILY_OK)
        fprintf(stderr, "lily serve: warning: no checkpoint after the generation (%s)\n", cerr.message);

    /* 7. the end: finish_reason, usage, [DONE] */
    finish_reply(&g, finish, n_ids, n_generated, reused);

done:
    if (!job->finished)
        lily_job_finish(job);
    if (detok_ready)
        lily_detokenizer_free(&detok);
    for (int i = 0; i < g.n_lps; i++)
        lily_oai_logprob_clear(&g.lps[i]);
    free(g.lps);
    free(g.call_ids);
    free(g.text.data);
    free(g.echo_text);
    lily_output_parser_free(g.parser);
    lily_resp_output_free(&g.resp);
    lily_grammar_constraint_free(g.constraint);
    lily_grammar_free(g.grammar);
    name_constraint_free(&nc);
    free(bias);
    free(forced);
    free(ids);
}

/* ---------------------------------------------------------------------------------------------------
 * /tokenize and /detokenize (llama.cpp's shapes)
 */

static void run_tokenize(lily_service *svc, lily_job *job)
{
    lily_error err;
    json_t *b = job->body;
    const char *content = json_string_value(json_object_get(b, "content"));
    json_t *ps = json_object_get(b, "parse_special");
    bool parse_special = !json_is_false(ps);
    bool with_pieces = json_is_true(json_object_get(b, "with_pieces"));
    int32_t *ids = NULL;
    int n = 0;
    lily_status st = lily_tokenizer_encode_max(svc->tok, content, json_string_length(json_object_get(b, "content")),
                                               parse_special, LILY_OAI_MAX_JSON_VALUES, LILY_OAI_MAX_JSON_VALUES, &ids,
                                               &n, &err);
    if (st != LILY_OK) {
        fail_with(job, st == LILY_ERR_INVALID_ARGUMENT ? 400 : 500,
                  st == LILY_ERR_INVALID_ARGUMENT ? "invalid_request_error" : "server_error", "content", NULL,
                  err.message);
        return;
    }
    if (n > LILY_OAI_MAX_JSON_VALUES) { /* the reply would be a bigger document than a request may be */
        free(ids);
        char msg[160];
        snprintf(msg, sizeof msg, "Invalid 'content': it makes more than %d tokens, the limit for /tokenize.",
                 LILY_OAI_MAX_JSON_VALUES);
        fail_with(job, 400, "invalid_request_error", "content", NULL, msg);
        return;
    }
    json_t *tokens = json_array();
    for (int i = 0; tokens && i < n; i++) {
        if (with_pieces) {
            size_t len = 0;
            const char *bytes = lily_tokenizer_token_bytes(svc->tok, ids[i], &len);
            json_array_append_new(tokens, json_pack("{s:i, s:o}", "id", ids[i], "piece",
                                                    lily_oai_string(bytes ? bytes : "", bytes ? len : 0)));
        } else {
            json_array_append_new(tokens, json_integer(ids[i]));
        }
    }
    free(ids);
    json_t *r = json_pack("{s:o}", "tokens", tokens);
    respond_json(job, r);
}

static void run_detokenize(lily_service *svc, lily_job *job)
{
    lily_error err;
    json_t *tokens = json_object_get(job->body, "tokens");
    size_t n = json_array_size(tokens);
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    if (!ids) {
        fail_with(job, 500, "server_error", NULL, NULL, "Out of memory.");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        json_int_t id = json_integer_value(json_array_get(tokens, i));
        if (id < 0 || id >= lily_tokenizer_vocab_size(svc->tok)) {
            free(ids);
            char msg[160];
            snprintf(msg, sizeof msg, "tokens[%zu] = %lld is outside the tokenizer's ids [0, %d).", i, (long long)id,
                     (int)lily_tokenizer_vocab_size(svc->tok));
            fail_with(job, 400, "invalid_request_error", "tokens", NULL, msg);
            return;
        }
        ids[i] = (int32_t)id;
    }
    char *text = NULL;
    size_t len = 0;
    lily_status st = lily_tokenizer_decode(svc->tok, ids, (int)n, false, &text, &len, &err);
    free(ids);
    if (st != LILY_OK) {
        fail_with(job, 500, "server_error", NULL, NULL, err.message);
        return;
    }
    json_t *r = json_pack("{s:o}", "content", lily_oai_string(text, len));
    free(text);
    respond_json(job, r);
}

/* POST /v1/messages/count_tokens: the rendered prompt's length, {"input_tokens": N}. */
static void run_count_tokens(lily_service *svc, lily_job *job)
{
    bool thinking = false;
    int32_t *ids = NULL;
    int n_ids = 0;
    const bool ok = prompt_ids(svc, job, -1, &thinking, &ids, &n_ids);
    free(ids);
    if (!ok)
        return;
    respond_json(job, json_pack("{s:i}", "input_tokens", n_ids));
}

void lily_service_run_without_engine(void *user, lily_job *job)
{
    LILY_ASSERT(job->route == LILY_ROUTE_COUNT_TOKENS || job->route == LILY_ROUTE_TOKENIZE ||
                job->route == LILY_ROUTE_DETOKENIZE); /* a generation needs the engine: lily_service_run */
    lily_service_run(user, job);
}

void lily_service_run(void *user, lily_job *job)
{
    lily_service *svc = user;
    switch (job->route) {
    case LILY_ROUTE_COUNT_TOKENS: run_count_tokens(svc, job); break;
    case LILY_ROUTE_TOKENIZE: run_tokenize(svc, job); break;
    case LILY_ROUTE_DETOKENIZE: run_detokenize(svc, job); break;
    case LILY_ROUTE_CHAT:
    case LILY_ROUTE_COMPLETIONS: run_generation(svc, job); break;
    }
}
