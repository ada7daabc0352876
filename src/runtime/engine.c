/* engine.c — a loaded model: config + mapped checkpoint + bound weights + one backend (engine.h).
 *
 * Owns: the order of loading and its undoing on error. Does not own the sessions (session.c).
 */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int lily_default_prefill_chunk(const char *backend)
{
    /* measured: on the H200 a 4K prompt prefills at 7,989 tok/s in chunks of 4096 and 7,022 in chunks
     * of 512 (docs/BENCHMARKS.md); the CPU backend dequantizes per chunk, 512 keeps its scratch small */
    return backend && !strcmp(backend, "cuda") ? 4096 : 512;
}

lily_status lily_engine_plan(lily_engine *e, const char *backend, const lily_engine_options *opts,
                             lily_backend_options *bo, lily_error *err)
{
    const lily_backend_ops *ops = lily_backend_find(backend);
    if (!ops) /* not in this build: lily_backend_create says so (these lines would name it as ignoring them) */
        return LILY_OK;
    if (!ops->memory_needs) {
        if (opts->gpu_memory_bytes)
            fprintf(stderr, "lily: --gpu-memory applies to --backend cuda only; the %s backend ignores it\n",
                    backend);
        if (opts->n_cpu_moe > 0)
            fprintf(stderr, "lily: --n-cpu-moe / --cpu-moe apply to --backend cuda only; the %s backend keeps "
                    "everything in host memory anyway\n", backend);
        if (opts->device_pool_bytes)
            fprintf(stderr, "lily: --cache-vram applies to --backend cuda only; the %s backend keeps prefix-cache "
                    "checkpoints in host memory (--cache-ram)\n", backend);
        return LILY_OK;
    }
    lily_memory_plan_input in = {
        .n_sessions = opts->n_sessions > 0 ? opts->n_sessions : 1,
        .ctx_requested = opts->ctx_size,
        .ctx_max = e->cfg.max_position_embeddings,
        .pool_requested = opts->device_pool_bytes,
        .n_cpu_moe = opts->n_cpu_moe,
    };
    for (int chunk = e->prefill_chunk; chunk >= 1 && in.n_chunks < LILY_PLAN_MAX_CHUNKS; chunk /= 2) {
        in.chunk[in.n_chunks++] = chunk;
        if (opts->prefill_chunk > 0 || chunk <= 256)
            break;
    }
    lily_backend_memory m;
    for (int i = 0; i < in.n_chunks; i++) {
        lily_backend_options o = *bo;
        o.max_chunk = in.chunk[i];
        o.n_cpu_moe = 0; /* weight_bytes with every expert on the device; the plan moves them */
        lily_status st = ops->memory_needs(&e->cfg, &e->weights, &o, &m, err);
        if (st != LILY_OK)
            return st;
        in.scratch_bytes[i] = m.scratch_bytes;
        if (m.expert_stage_bytes > in.expert_stage_bytes)
            in.expert_stage_bytes = m.expert_stage_bytes;
    }
    in.runtime_bytes = m.runtime_bytes;
    in.weight_bytes = m.weight_bytes;
    in.kv_bytes_per_token = m.kv_bytes_per_token;
    in.state_bytes = m.state_bytes;
    in.expert_layer_bytes = m.expert_layer_bytes;
    in.n_layers = m.n_expert_layers;
    /* without a budget: the free memory, less a reserve for what the plan does not count */
    const size_t reserve = (size_t)256 << 20;
    const size_t avail = m.device_free > reserve ? m.device_free - reserve + m.runtime_bytes : m.runtime_bytes;
    in.budget_bytes = opts->gpu_memory_bytes && opts->gpu_memory_bytes < avail ? opts->gpu_memory_bytes : avail;
    lily_status st = lily_memory_plan_choose(&in, &e->plan, err);
    if (st != LILY_OK)
        return st;
    e->planned = true;
    bo->max_chunk = e->prefill_chunk = e->plan.chunk;
    bo->n_cpu_moe = e->plan.n_cpu_moe;
    char line[640];
    lily_memory_plan_format(&e->plan, line, sizeof line);
    fprintf(stderr, "lily: %s\n", line);
    if (e->plan.n_cpu_moe_chosen)
        fprintf(stderr, "lily: --n-cpu-moe %d chosen: the fewest layers whose routed experts, kept in host memory, "
                "let the rest fit in %.2f GiB (give --n-cpu-moe to choose)\n", e->plan.n_cpu_moe,
                (double)in.budget_bytes / 1073741824.0);
    return LILY_OK;
}

lily_status lily_engine_open(const lily_engine_options *opts, lily_engine **out, lily_error *err)
{
    *out = NULL;
    if (!opts || !opts->model_dir)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "engine: no model directory given");
    if (opts->prefill_chunk < 0)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "engine: prefill chunk must be positive (got %d)",
                              opts->prefill_chunk);
    lily_engine *e = calloc(1, sizeof *e);
    if (!e)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "engine: out of memory");
    e->model_dir = strdup(opts->model_dir);
    if (!e->model_dir) {
        free(e);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "engine: out of memory");
    }
    e->prefill_chunk = opts->prefill_chunk > 0 ? opts->prefill_chunk : lily_default_prefill_chunk(opts->backend);

    lily_status st = lily_config_load(opts->model_dir, &e->cfg, err);
    if (st == LILY_OK) {
        st = lily_checkpoint_open(opts->model_dir, &e->ckpt, err);
        if (st != LILY_OK) {
            free(e->model_dir);
            free(e);
            return st;
        }
    } else {
        free(e->model_dir);
        free(e);
        return st;
    }
    /* scratch is sized by the chunk: no chunk needs to be longer than the model's context */
    if (e->prefill_chunk > e->cfg.max_position_embeddings && e->cfg.max_position_embeddings > 0)
        e->prefill_chunk = e->cfg.max_position_embeddings;
    st = lily_weights_bind(&e->cfg, &e->ckpt, &e->weights, err);
    if (st != LILY_OK) {
        lily_error_prefix(err, "%s", opts->model_dir); /* as config and shard errors name the directory */
        lily_checkpoint_close(&e->ckpt);
        free(e->model_dir);
        free(e);
        return st;
    }
    const char *backend = opts->backend ? opts->backend : "cpu";
    lily_backend_options bo = {
        .n_threads = opts->n_threads,
        .host_experts = opts->host_experts,
        .max_chunk = e->prefill_chunk,
        .device = opts->device,
        .deltanet_chunked = opts->deltanet_chunked,
        .exact = opts->exact,
        .profile = opts->profile,
        .debug_hook = opts->debug_hook,
        .debug_user = opts->debug_user,
    };
    st = lily_engine_plan(e, backend, opts, &bo, err);
    if (st == LILY_OK)
        st = lily_backend_create(backend, &e->cfg, &e->weights, &bo, &e->backend, err);
    if (st != LILY_OK) {
        lily_weights_free(&e->weights);
        lily_checkpoint_close(&e->ckpt);
        free(e->model_dir);
        free(e);
        return st;
    }
    *out = e;
    return LILY_OK;
}

void lily_engine_close(lily_engine *e)
{
    if (!e)
        return;
    lily_backend_destroy(&e->backend);
    lily_weights_free(&e->weights);
    lily_checkpoint_close(&e->ckpt);
    free(e->model_dir);
    free(e);
}
