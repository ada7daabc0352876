/* cpu_profile.c — forward()'s wall time by stage (lily_backend_options.profile; lily bench --profile).
 *
 * Owns: the stage names, the marks (cpu_internal.h: each adds the time since the previous mark to its
 * stage) and handing the sums out (profile_take). The sums live in the backend context (cpu_ctx.prof);
 * with profiling off no clock is read.
 */
#include <string.h>

#include "base/clock.h"
#include "cpu_internal.h"

static const char *const stage_names[CPU_STAGE_COUNT] = {
    [CPU_STAGE_EMBED] = "embed",
    [CPU_STAGE_NORM] = "residual add + rmsnorm",
    [CPU_STAGE_QUANTIZE] = "quantize input",
    [CPU_STAGE_GDN_IN_PROJ] = "gdn in_proj",
    [CPU_STAGE_GDN_CONV] = "gdn conv",
    [CPU_STAGE_GDN_QK_GATES] = "gdn qk norm + gates",
    [CPU_STAGE_GDN_DELTA] = "gdn delta rule",
    [CPU_STAGE_GDN_NORM] = "gdn gated norm",
    [CPU_STAGE_GDN_OUT_PROJ] = "gdn out_proj",
    [CPU_STAGE_ATTN_IN_PROJ] = "attn q/k/v proj",
    [CPU_STAGE_ATTN_PREP] = "attn q/k norm + rope + cache",
    [CPU_STAGE_ATTN_CORE] = "attn softmax(qk)v",
    [CPU_STAGE_ATTN_O_PROJ] = "attn o_proj",
    [CPU_STAGE_MOE_ROUTER] = "moe router (+ shared gate/up)",
    [CPU_STAGE_MOE_TOPK] = "moe top-k + grouping",
    [CPU_STAGE_MOE_GATHER] = "moe gather rows",
    [CPU_STAGE_MOE_GATE_UP] = "moe experts gate/up",
    [CPU_STAGE_MOE_DOWN] = "moe experts down",
    [CPU_STAGE_MOE_COMBINE] = "moe weighted sum",
    [CPU_STAGE_MOE_EXPERTS] = "moe experts (exact)",
    [CPU_STAGE_MOE_SHARED] = "moe shared expert",
    [CPU_STAGE_MOE_SHARED_ADD] = "moe shared add",
    [CPU_STAGE_LM_HEAD] = "lm head",
};

void cpu_prof_mark_now(cpu_profile *p, cpu_stage stage)
{
    const int64_t t = lily_wall_ns();
    p->ns[stage] += t - p->last_ns;
    p->calls[stage]++;
    p->last_ns = t;
}

void cpu_prof_forward_begin(cpu_profile *p)
{
    p->forward_start_ns = p->last_ns = lily_wall_ns();
}

void cpu_prof_forward_end(cpu_profile *p)
{
    p->forward_ns += lily_wall_ns() - p->forward_start_ns;
    p->forwards++;
}

void cpu_profile_take(void *ctx, lily_stage_profile *out)
{
    cpu_ctx *c = ctx;
    memset(out, 0, sizeof *out);
    if (!c->prof)
        return;
    _Static_assert(CPU_STAGE_COUNT <= LILY_PROFILE_MAX_STAGES, "more stages than lily_stage_profile holds");
    out->n_stages = CPU_STAGE_COUNT;
    for (int s = 0; s < CPU_STAGE_COUNT; s++) {
        out->names[s] = stage_names[s];
        out->seconds[s] = c->prof->ns[s] * 1e-9;
        out->calls[s] = c->prof->calls[s];
    }
    out->forward_seconds = c->prof->forward_ns * 1e-9;
    out->forwards = c->prof->forwards;
    memset(c->prof, 0, sizeof *c->prof);
}
