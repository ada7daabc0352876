/* memory_plan.c — choose the prefill chunk, context size and checkpoint pool that fit a GPU memory
 * budget (memory_plan.h). Pure arithmetic: unit-tested on the CPU (tests/test_memory_plan.c).
 */
#include "memory_plan.h"

#include <stdio.h>
#include <string.h>

#define GIB(b) ((double)(b) / 1073741824.0)
#define CTX_ROUND 256

/* Tokens of context that `bytes` hold for every session, rounded down to CTX_ROUND, at most ctx_max. */
static int ctx_that_fits(const lily_memory_plan_input *in, size_t bytes, int ctx_max)
{
    const size_t per = in->kv_bytes_per_token * (size_t)in->n_sessions;
    if (per == 0)
        return ctx_max;
    const size_t t = bytes / per;
    if (t >= (size_t)ctx_max)
        return ctx_max;
    return (int)(t / CTX_ROUND * CTX_ROUND);
}

/* The context a plan aims at: the requested one, else min(ctx_max, LILY_PLAN_MIN_AUTO_CTX). */
static int target_ctx(const lily_memory_plan_input *in)
{
    const int ctx_max = in->ctx_max > 0 ? in->ctx_max : LILY_PLAN_MIN_AUTO_CTX;
    return in->ctx_requested ? in->ctx_requested : ctx_max < LILY_PLAN_MIN_AUTO_CTX ? ctx_max : LILY_PLAN_MIN_AUTO_CTX;
}

/* The plan with the weights of `in` on the device as given (no experts moved). */
static lily_status choose_on_device(const lily_memory_plan_input *in, lily_memory_plan *out, lily_error *err)
{
    const size_t S = (size_t)in->n_sessions;
    const int ctx_max = in->ctx_max > 0 ? in->ctx_max : LILY_PLAN_MIN_AUTO_CTX;
    const size_t fixed = in->runtime_bytes + in->weight_bytes + S * in->state_bytes;
    if (fixed > in->budget_bytes)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY,
                              "the model needs %.2f GiB of GPU memory before any context (weights %.2f GiB, "
                              "recurrent state %.2f GiB, GPU runtime %.2f GiB) but the budget is %.2f GiB: raise "
                              "--gpu-memory or use a GPU with more free memory",
                              GIB(fixed), GIB(in->weight_bytes), GIB(S * in->state_bytes), GIB(in->runtime_bytes),
                              GIB(in->budget_bytes));
    const int target = target_ctx(in);
    const size_t kv_target = S * in->kv_bytes_per_token * (size_t)target;
    int pick = in->n_chunks - 1;
    for (int i = 0; i < in->n_chunks; i++)
        if (fixed + in->scratch_bytes[i] + kv_target <= in->budget_bytes) {
            pick = i;
            break;
        }
    const size_t scratch = in->scratch_bytes[pick];
    if (fixed + scratch > in->budget_bytes)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY,
                              "the model's %.2f GiB plus %.2f GiB of prefill scratch (chunk %d) exceed the %.2f GiB "
                              "budget: lower --prefill-chunk or raise --gpu-memory",
                              GIB(fixed), GIB(scratch), in->chunk[pick], GIB(in->budget_bytes));
    const size_t left = in->budget_bytes - fixed - scratch;
    int ctx;
    size_t pool;
    if (in->ctx_requested) {
        if (kv_target > left) {
            const int fits = ctx_that_fits(in, left, ctx_max);
            return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY,
                                  "--ctx-size %d needs %.2f GiB of KV cache but %.2f GiB of the %.2f GiB budget are "
                                  "left after the weights and prefill scratch (chunk %d): lower --ctx-size (at most "
                                  "%d fits), lower --prefill-chunk, or raise --gpu-memory",
                                  in->ctx_requested, GIB(kv_target), GIB(left), GIB(in->budget_bytes), in->chunk[pick],
                                  fits);
        }
        ctx = in->ctx_requested;
        pool = left - kv_target < in->pool_requested ? left - kv_target : in->pool_requested;
    } else {
        pool = kv_target <= left ? (left - kv_target < in->pool_requested ? left - kv_target : in->pool_requested) : 0;
        ctx = ctx_that_fits(in, left - pool, ctx_max);
        if (ctx < CTX_ROUND && ctx < ctx_max)
            return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY,
                                  "fewer than %d tokens of context fit in the %.2f GiB budget (%.2f GiB left after "
                                  "the weights and prefill scratch of chunk %d): raise --gpu-memory",
                                  CTX_ROUND, GIB(in->budget_bytes), GIB(left), in->chunk[pick]);
    }
    memset(out, 0, sizeof *out);
    out->chunk = in->chunk[pick];
    out->ctx = ctx;
    out->pool_bytes = pool;
    out->pool_requested = in->pool_requested;
    out->weights = in->weight_bytes;
    out->kv = S * in->kv_bytes_per_token * (size_t)ctx;
    out->state = S * in->state_bytes;
    out->scratch = scratch;
    out->runtime = in->runtime_bytes;
    out->total = fixed + scratch + out->kv + pool;
    out->budget = in->budget_bytes;
    return LILY_OK;
}

lily_status lily_memory_plan_choose(const lily_memory_plan_input *in, lily_memory_plan *out, lily_error *err)
{
    if (in->n_chunks < 1 || in->n_chunks > LILY_PLAN_MAX_CHUNKS || in->n_sessions < 1 || in->ctx_requested < 0 ||
        in->n_layers < 0 || in->n_cpu_moe < LILY_N_CPU_MOE_NONE ||
        (size_t)in->n_layers * in->expert_layer_bytes > in->weight_bytes)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "memory plan: %d chunk candidates, %d sessions, "
                              "context %d, %d expert layers of %zu bytes in %zu bytes of weights, n_cpu_moe %d",
                              in->n_chunks, in->n_sessions, in->ctx_requested, in->n_layers, in->expert_layer_bytes,
                              in->weight_bytes, in->n_cpu_moe);
    int n_host = in->n_cpu_moe == LILY_N_CPU_MOE_NONE ? 0 : in->n_cpu_moe > in->n_layers ? in->n_layers : in->n_cpu_moe;
    if (in->n_cpu_moe == LILY_N_CPU_MOE_AUTO) {
        /* the fewest layers whose move leaves room for the largest chunk and the target context: a prefill
         * chunk stages every host layer's experts to the device once, so a smaller chunk multiplies the bus
         * traffic (on the H200, 4K of prompt with 12 layers moved: 4,009 tok/s in chunks of 512) by more
         * than one more moved layer slows decode */
        const size_t S = (size_t)in->n_sessions;
        const size_t rest = in->runtime_bytes + S * in->state_bytes + in->scratch_bytes[0] +
                            S * in->kv_bytes_per_token * (size_t)target_ctx(in);
        while (n_host < in->n_layers && rest + in->weight_bytes - (size_t)n_host * in->expert_layer_bytes +
                                                (n_host > 0 ? in->expert_stage_bytes : 0) > in->budget_bytes)
            n_host++;
    }
    lily_memory_plan_input on_device = *in;
    on_device.weight_bytes = in->weight_bytes - (size_t)n_host * in->expert_layer_bytes;
    if (n_host > 0)
        for (int i = 0; i < in->n_chunks; i++)
            on_device.scratch_bytes[i] += in->expert_stage_bytes;
    lily_status st = choose_on_device(&on_device, out, err);
    if (st != LILY_OK) {
        if (n_host > 0)
            lily_error_prefix(err, "with the routed experts of %d of %d layers in host memory", n_host, in->n_layers);
        return st;
    }
    out->n_cpu_moe = n_host;
    out->n_layers = in->n_layers;
    out->n_cpu_moe_chosen = in->n_cpu_moe == LILY_N_CPU_MOE_AUTO && n_host > 0;
    out->host_experts = (size_t)n_host * in->expert_layer_bytes;
    out->expert_stage = n_host > 0 ? in->expert_stage_bytes : 0;
    return LILY_OK;
}

void lily_memory_plan_format(const lily_memory_plan *p, char *buf, size_t size)
{
    int w = snprintf(buf, size,
             "GPU memory plan: weights %.2f GiB + KV cache %d tokens %.2f GiB + DeltaNet state %.2f GiB + prefill "
             "scratch (chunk %d) %.2f GiB + checkpoint pool %.2f GiB + GPU runtime %.2f GiB = %.2f of %.2f GiB",
             GIB(p->weights), p->ctx, GIB(p->kv), GIB(p->state), p->chunk, GIB(p->scratch), GIB(p->pool_bytes),
             GIB(p->runtime), GIB(p->total), GIB(p->budget));
    if (p->n_cpu_moe > 0 && w >= 0 && (size_t)w < size)
        snprintf(buf + w, size - (size_t)w, "; routed experts of %d of %d layers in host memory: %.2f GiB (not in "
                 "the total; the scratch holds %.2f GiB to stage them for prefill)", p->n_cpu_moe, p->n_layers,
                 GIB(p->host_experts), GIB(p->expert_stage));
}
