/* cuda_forward.cu — the CUDA backend's forward pass (docs/MODEL.md §4.2): embed, per layer a mixer block
 * (attention_block or deltanet_block) and moe_block, then head_block (final norm, LM head, the step's
 * bookkeeping). Per token chunk the kernels of a layer are
 *   DeltaNet layer:  proj(norm -> qkv|z|b|a)  gdn (deltanet/)  proj(gated norm -> out_proj, += h)
 *   attention layer: proj(norm -> q|k|v)  qk_norm_rope_append  attention (split-KV)  proj(o_proj, += h)
 *                    (a prefill chunk: qk_norm_rope_append does k/v only and the flash kernel norms +
 *                    rotates q itself)
 *   every layer:     gemv(norm -> router|shared gate)  moe_gate_up(top-k)  moe_down(+= h), or, for a
 *                    prefill chunk, the GEMM-based MoE block of forward_prefill.cu
 * proj() runs a batch of projections as a tensor-core GEMM for prefill chunks and as a GEMV otherwise.
 * The launch arguments that do not change between calls are built once per state (cuda_state_args_build).
 * Decode steps are captured once per session as CUDA graphs and replayed (decode_loop). Exact mode
 * (lily_backend_options.exact, c->opts.exact) runs only kernels with fp32 operands: GEMVs for every
 * projection, the MoE block and the LM head, SIMT attention over an fp32 KV cache, the recurrent DeltaNet
 * prefill.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "cuda_internal.cuh"

#define LM_GREEDY 3

enum prof_stage {
    PS_EMBED, PS_GDN_PROJ, PS_GDN_SCAN, PS_GDN_OUT, PS_ATT_PROJ, PS_ATT_ROPE, PS_ATT, PS_ATT_OUT,
    PS_ROUTER, PS_MOE_GATE_UP, PS_MOE_DOWN, PS_LM_HEAD, PS_SAMPLE, PS_COUNT
};
static const char *prof_names[PS_COUNT] = {"embed", "deltanet_in_proj", "deltanet_scan", "deltanet_out_proj",
                                           "attn_qkv_proj", "attn_qk_norm_rope", "attention", "attn_o_proj",
                                           "moe_router", "moe_gate_up", "moe_down", "lm_head", "sample"};

/* the timeline's stage names: the profile's, and the split-KV merge kernel */
static_assert(TL_MAX_KERNELS <= LILY_CUDA_TIMELINE_MAX, "lily_cuda_timeline holds every stamped kernel");
#define TL_STAGE_MERGE PS_COUNT
#define TL_STAGES (PS_COUNT + 1)
static const char *tl_stage_names[TL_STAGES] = {"embed", "deltanet_in_proj", "deltanet_scan", "deltanet_out_proj",
                                                "attn_qkv_proj", "attn_qk_norm_rope", "attention", "attn_o_proj",
                                                "moe_router", "moe_gate_up", "moe_down", "lm_head", "sample",
                                                "attention_merge"};

/* The stamp slots of the next `slots` kernels of a timeline capture (NULL when no timeline is captured or
 * the slots are used up): slot k describes kernel k (stage, layer, bytes; a second slot is the merge). */
static unsigned long long *tl_slot(cuda_ctx *c, int stage, int layer, double bytes, double bytes_per_pos, int slots)
{
    if (!c->tl_buf || c->tl_n + slots > TL_MAX_KERNELS)
        return NULL;
    unsigned long long *p = c->tl_buf + (size_t)c->tl_n * TL_SLOT_WORDS;
    for (int k = 0; k < slots; k++) {
        cuda_tl_kernel *K = &c->tl_k[c->tl_n++];
        K->stage = k ? TL_STAGE_MERGE : stage;
        K->layer = layer;
        K->bytes = k ? 0.0 : bytes;
        K->bytes_per_pos = k ? 0.0 : bytes_per_pos;
    }
    return p;
}

/* Bytes of one matrix (one expert of a stack): packed weights, plus bf16 scale and bias per group of 64. */
static double dmat_bytes(const dmat &m)
{
    return (double)m.rows * (double)m.row_bytes + (m.bits < 16 ? (double)m.rows * (m.cols / 64) * 4.0 : 0.0);
}

/* b with the timeline slot of its next launch (stage, layer), when a timeline is captured. */
static gemv_batch tl_batch(cuda_ctx *c, const gemv_batch &b, int stage, int layer)
{
    gemv_batch t = b;
    if (c->tl_buf) {
        double bytes = 0;
        for (int k = 0; k < b.n_mats; k++)
            bytes += dmat_bytes(b.m[k]);
        t.timeline = tl_slot(c, stage, layer, bytes, 0.0, 1);
    }
    return t;
}

/* A profile's events: ev[k] is recorded where stage[k] begins (the stage runs until ev[k + 1]). */
#define PROF_MAX_EVENTS 1024
struct cuda_prof {
    cudaEvent_t ev[PROF_MAX_EVENTS];
    int stage[PROF_MAX_EVENTS];
    int n;
};

static lily_status prof_begin(cuda_ctx *c, lily_error *err)
{
    c->prof = (cuda_prof *)calloc(1, sizeof(cuda_prof));
    if (!c->prof)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cuda: out of memory for the profile's events");
    return LILY_OK;
}

static void prof_end(cuda_ctx *c)
{
    for (int k = 0; k < PROF_MAX_EVENTS && c->prof->ev[k]; k++)
        cudaEventDestroy(c->prof->ev[k]);
    free(c->prof);
    c->prof = NULL;
}

/* Sum of each stage's event-to-event time (ms) into acc[PS_COUNT]. */
static lily_status prof_accumulate(const cuda_prof *p, double *acc, lily_error *err)
{
    for (int k = 0; k + 1 < p->n; k++) {
        float ms = 0;
        CUDA_TRY(cudaEventElapsedTime(&ms, p->ev[k], p->ev[k + 1]));
        acc[p->stage[k]] += ms;
    }
    return LILY_OK;
}

static lily_status prof_mark(cuda_ctx *c, int stage, lily_error *err)
{
    cuda_prof *p = c->prof;
    if (!p)
        return LILY_OK;
    if (p->n >= PROF_MAX_EVENTS)
        return lily_error_set(err, LILY_ERR_BACKEND, "cuda: profile event buffer full");
    if (!p->ev[p->n])
        CUDA_TRY(cudaEventCreate(&p->ev[p->n]));
    p->stage[p->n] = stage;
    /* external: a real event-record node when captured into a graph (a plain record otherwise) */
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_TRY(cudaStreamIsCapturing(c->stream, &cs));
    if (cs == cudaStreamCaptureStatusActive)
        CUDA_TRY(cudaEventRecordWithFlags(p->ev[p->n], c->stream, cudaEventRecordExternal));
    else
        CUDA_TRY(cudaEventRecord(p->ev[p->n], c->stream));
    p->n++;
    return LILY_OK;
}

#define MARK(stage)                                                                                \
    do {                                                                                           \
        lily_status s_ = prof_mark(c, (stage), err);                                               \
        if (s_ != LILY_OK)                                                                         \
            return s_;                                                                             \
    } while (0)

/* Debug hook: copy [n, width] fp32 from the device and hand it to the hook (sync; debug only). */
static lily_status hook_dev(cuda_ctx *c, int layer, const char *stage, const float *dev, int n, int width,
                            const float *minus, lily_error *err)
{
    CUDA_TRY(cudaMemcpyAsync(c->h_host, dev, (size_t)n * width * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
    lily_status st = cuda_sync(c, err);
    if (st != LILY_OK)
        return st;
    if (minus)
        for (size_t i = 0; i < (size_t)n * width; i++)
            c->h_host[i] -= minus[i];
    c->opts.debug_hook(c->opts.debug_user, layer, stage, c->h_host, n, width);
    return LILY_OK;
}

static lily_status hook_snapshot(cuda_ctx *c, int n, lily_error *err)
{
    const size_t bytes = (size_t)n * c->cfg.hidden * sizeof(float);
    CUDA_TRY(cudaMemcpyAsync(c->h_prev, c->h, bytes, cudaMemcpyDeviceToHost, c->stream));
    return cuda_sync(c, err);
}

static gemv_input in_rms(const float *act, int stride, const float *w, float eps)
{
    gemv_input in;
    memset(&in, 0, sizeof in);
    in.act = act;
    in.act_stride = stride;
    in.mode = GEMV_IN_RMSNORM;
    in.norm_w = w;
    in.eps = eps;
    return in;
}

/* Whether a call of n tokens runs its projections and MoE block as tensor-core GEMMs (never in exact mode). */
static bool prefill_gemm(const cuda_ctx *c, int n)
{
    return !c->opts.exact && n >= c->prefill_min_tokens;
}

/* An empty batch; in exact mode one that only the fp32 GEMV kernel runs. */
static void batch_init(const cuda_ctx *c, gemv_batch *b)
{
    memset(b, 0, sizeof *b);
    b->exact = c->opts.exact;
}

/* A batch of projections: tensor-core GEMM for prefill chunks (n >= prefill_min_tokens), else GEMV
 * (decode: n == 1 always takes the GEMV). */
static lily_status proj(cuda_ctx *c, const gemv_batch &b, const gemv_input &in, int out_mode, int n,
                        lily_error *err)
{
    if (prefill_gemm(c, n) && out_mode != GEMV_OUT_ARGMAX)
        return cuda_prefill_proj(c, b, in, out_mode, n, err);
    LAUNCH(launch_gemv(b, in, out_mode, n, NULL, c->stream));
    return LILY_OK;
}

static void batch_add(gemv_batch *b, const dmat &m, float *y, int y_stride)
{
    const int k = b->n_mats++;
    b->m[k] = m;
    b->y[k] = y;
    b->y_stride[k] = y_stride;
    b->row_start[k + 1] = b->row_start[k] + m.rows;
}

lily_status cuda_enqueue_lm_head(cuda_ctx *c, int row0, int rows, lily_error *err)
{
    const int H = c->cfg.hidden;
    gemv_batch b;
    batch_init(c, &b);
    batch_add(&b, c->lm_head, c->logits, c->cfg.vocab_size);
    const gemv_input in = in_rms(c->h + (size_t)row0 * H, H, c->final_norm, c->cfg.rms_norm_eps);
    if (prefill_gemm(c, rows))
        return cuda_prefill_proj(c, b, in, GEMV_OUT_STORE, rows, err);
    LAUNCH(launch_gemv(b, in, GEMV_OUT_STORE, rows, NULL, c->stream));
    return LILY_OK;
}

/* ---- per-layer arguments, built once per state ------------------------------------------------------ */

lily_status cuda_state_args_build(const cuda_ctx *c, cuda_state *st, lily_error *err)
{
    const lily_config *cfg = &c->cfg;
    const int H = cfg->hidden, D = cfg->head_dim, nh = cfg->n_heads, nkv = cfg->n_kv_heads, E = cfg->n_experts;
    const int conv_dim = lily_config_gdn_conv_dim(cfg), vd = lily_config_gdn_value_dim(cfg);
    const int Hv = cfg->gdn_n_value_heads;
    const float eps = cfg->rms_norm_eps;
    st->args = (cuda_layer_args *)calloc(cfg->n_layers, sizeof *st->args);
    if (!st->args)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cuda: layer arguments");
    for (int l = 0; l < cfg->n_layers; l++) {
        const cuda_layer *L = &c->layers[l];
        cuda_layer_args *A = &st->args[l];
        batch_init(c, &A->mix_in);
        batch_init(c, &A->mix_out);
        A->mix_in_x = in_rms(c->h, H, L->input_norm, eps);
        if (L->full_attention) {
            batch_add(&A->mix_in, L->q_proj, c->proj, c->proj_stride);
            batch_add(&A->mix_in, L->k_proj, c->proj + (size_t)nh * 2 * D, c->proj_stride);
            batch_add(&A->mix_in, L->v_proj, c->proj + (size_t)nh * 2 * D + (size_t)nkv * D, c->proj_stride);
            attn_args &a = A->attn;
            a.qkv = c->proj;
            a.qkv_stride = c->proj_stride;
            a.q_norm = L->q_norm;
            a.k_norm = L->k_norm;
            a.eps = eps;
            a.q = c->q;
            if (c->opts.exact) {
                a.k_cache_f32 = (float *)st->k_cache[l];
                a.v_cache_f32 = (float *)st->v_cache[l];
            } else {
                a.k_cache = (__nv_bfloat16 *)st->k_cache[l];
                a.v_cache = (__nv_bfloat16 *)st->v_cache[l];
            }
            a.max_ctx = st->max_ctx;
            a.pos = &st->ctr->pos;
            a.n_heads = nh;
            a.n_kv = nkv;
            a.head_dim = D;
            a.rot_dim = cfg->rotary_dim;
            a.rope_theta = cfg->rope_theta;
            a.out = c->mix;
            a.prefill_kernel = c->kernels.attn_prefill;
            batch_add(&A->mix_out, L->o_proj, c->h, H);
            A->mix_out_x.act = c->mix;
            A->mix_out_x.act_stride = nh * D;
            A->mix_out_x.mode = GEMV_IN_PLAIN;
        } else {
            batch_add(&A->mix_in, L->in_qkv, c->proj, c->proj_stride);
            batch_add(&A->mix_in, L->in_z, c->proj + conv_dim, c->proj_stride);
            batch_add(&A->mix_in, L->in_b, c->proj + conv_dim + vd, c->proj_stride);
            batch_add(&A->mix_in, L->in_a, c->proj + conv_dim + vd + Hv, c->proj_stride);
            gdn_args &g = A->gdn;
            g.mixed = c->proj;
            g.mixed_stride = c->proj_stride;
            g.ba = c->proj + conv_dim + vd;
            g.ba_stride = c->proj_stride;
            g.conv_w = L->conv_w;
            g.A_log = L->A_log;
            g.dt_bias = L->dt_bias;
            g.conv_state = st->conv_state[l];
            g.state = st->rec_state[l];
            g.step = &st->ctr->step;
            g.out = c->mix;
            g.Hk = cfg->gdn_n_key_heads;
            g.Hv = Hv;
            g.dk = cfg->gdn_key_head_dim;
            g.dv = cfg->gdn_value_head_dim;
            g.K = cfg->gdn_conv_kernel;
            g.conv_dim = conv_dim;
            batch_add(&A->mix_out, L->out_proj, c->h, H);
            gemv_input &x = A->mix_out_x;
            x.act = c->mix;
            x.act_stride = vd;
            x.mode = GEMV_IN_GATED;
            x.norm_w = L->gdn_norm;
            x.z = c->proj + conv_dim;
            x.z_stride = c->proj_stride;
            x.head_dim = g.dv;
            x.eps = eps;
        }
        batch_init(c, &A->router);
        batch_add(&A->router, L->router, c->router, E + 1);
        batch_add(&A->router, L->shared_expert_gate, c->router + E, E + 1);
        A->router_x = in_rms(c->h, H, L->post_norm, eps);
        moe_args &m = A->moe;
        m.gate = L->ex_gate;
        m.up = L->ex_up;
        m.down = L->ex_down;
        m.sgate = L->sh_gate;
        m.sup = L->sh_up;
        m.sdown = L->sh_down;
        m.router_logits = c->router;
        m.logit_stride = E + 1;
        m.n_experts = E;
        m.top_k = cfg->n_experts_used;
        m.inter = cfg->moe_intermediate;
        m.shared_inter = cfg->shared_intermediate;
        m.hidden = H;
        m.h = c->h;
        m.norm_w = L->post_norm;
        m.eps = eps;
        m.hid = c->hid;
        m.topk_idx = c->topk_idx;
        m.topk_w = c->topk_w;
        m.out = c->h;
        m.exact = c->opts.exact;
        m.step = &st->ctr->step; /* early ids: tags of this forward call's published top-k */
        m.topk_pub = st->ctr->moe_topk_pub;
        m.layer = l;
        m.router = L->router; /* the router fused into gate/up where moe_router_fused (moe_block) */
        m.router_shared = L->shared_expert_gate;
        m.logit_pub = st->ctr->moe_logit_pub;
    }
    return LILY_OK;
}

/* ---- the forward pass -------------------------------------------------------------------------------- */

#define TRY(call)                                                                                  \
    do {                                                                                           \
        lily_status s_ = (call);                                                                   \
        if (s_ != LILY_OK)                                                                         \
            return s_;                                                                             \
    } while (0)

/* Gated attention (docs/MODEL.md §4.3): q|k|v projection of RMSNorm(h), q/k RMSNorm + partial RoPE + KV
 * append, causal attention gated by sigmoid(gate), h += o_proj. A chunk (n > 1) takes the flash kernel,
 * which norms and rotates q itself; decode steps split the keys (split-KV) when decode_splits. */
static lily_status attention_block(cuda_ctx *c, cuda_state *st, const cuda_layer_args *A, int layer, int n,
                                   bool decode_splits, lily_error *err)
{
    attn_args a = A->attn;
    a.n_splits = decode_splits && n == 1 ? c->att_splits : 1;
    a.min_chunk = c->att_min_chunk;
    a.part_o = c->part_o;
    a.part_ml = c->part_ml;
    a.counter = c->att_counter;
    const bool flash = n > 1 && attention_prefill_supported(a); /* never exact mode's fp32 cache */
    a.q_fused = flash; /* the flash kernel norms + rotates q itself: norm_rope appends k/v only */
    MARK(PS_ATT_PROJ);
    TRY(proj(c, tl_batch(c, A->mix_in, PS_ATT_PROJ, layer), A->mix_in_x, GEMV_OUT_STORE, n, err));
    MARK(PS_ATT_ROPE);
    a.timeline = tl_slot(c, PS_ATT_ROPE, layer, 0.0, 0.0, 1);
    LAUNCH(launch_qk_norm_rope_append(a, n, c->stream));
    MARK(PS_ATT);
    if (flash) {
        a.timeline = NULL;
        a.n_splits = attention_prefill_splits(a, n, st->pos, c->att_splits);
        LAUNCH(launch_attention_prefill(a, n, c->stream));
    } else {
        /* the tensor-core kernel's split-KV merge is a second kernel (the SIMT kernel merges in its last block) */
        const bool merge = a.n_splits > 1 && attn_decode_kernel_choose(a, n) == ATTN_DECODE_MMA;
        a.timeline = tl_slot(c, PS_ATT, layer, 0.0, 2.0 * a.n_kv * a.head_dim * c->kv_elem, merge ? 2 : 1);
        LAUNCH(launch_attention(a, n, c->stream));
    }
    MARK(PS_ATT_OUT);
    return proj(c, tl_batch(c, A->mix_out, PS_ATT_OUT, layer), A->mix_out_x, GEMV_OUT_ADD, n, err);
}

/* Gated DeltaNet (docs/MODEL.md §4.4): qkv|z|b|a projection of RMSNorm(h), causal conv + SiLU, q/k L2
 * norms, gates and the delta rule, h += out_proj(gated RMSNorm(o, z)). */
static lily_status deltanet_block(cuda_ctx *c, const cuda_layer_args *A, int layer, int n, const cuda_mark *mk,
                                  uint8_t *mark_ext, lily_error *err)
{
    gdn_args g = A->gdn;
    const int n0 = mk ? mk->row : n; /* rows of the first delta-rule launch */
    g.kernel = gdn_kernel_choose(g, n0, c->opts.exact); /* exact: never the TF32 chunked form */
    MARK(PS_GDN_PROJ);
    gemv_batch in_b = tl_batch(c, A->mix_in, PS_GDN_PROJ, layer);
    /* one token with in_proj streamed: its store applies the causal conv (fewer loads before the scan's wait) */
    if (n == 1 && !mk && g.kernel == GDN_KERNEL_DECODE && !prefill_gemm(c, n) && gdn_decode_conv_fusable(g) &&
        gemv_kernel_choose(in_b, 1) == GEMV_KERNEL_STREAM) {
        in_b.conv_w = g.conv_w;
        in_b.conv_state = g.conv_state;
        in_b.conv_rows = g.conv_dim;
        in_b.step = g.step;
        g.conv_done = 1;
    }
    TRY(proj(c, in_b, A->mix_in_x, GEMV_OUT_STORE, n, err));
    MARK(PS_GDN_SCAN);
    /* the recurrent state read and written, the conv history read and written */
    g.timeline = tl_slot(c, PS_GDN_SCAN, layer,
                         2.0 * g.Hv * g.dk * g.dv * sizeof(float) + 2.0 * (g.K - 1) * g.conv_dim * sizeof(float), 0.0, 1);
    LAUNCH(launch_gdn(g, c->gdn_pre, c->gdn_wy, n0, c->stream));
    if (mk) { /* the state after row n0, then rows [n0, n) as a second call */
        CUDA_TRY(cudaMemcpyAsync(mark_ext, g.conv_state, mk->conv_bytes, mk->kind, c->stream));
        CUDA_TRY(cudaMemcpyAsync(mark_ext + mk->conv_bytes, g.state, mk->rec_bytes, mk->kind, c->stream));
        gdn_args g2 = g;
        g2.mixed += (size_t)n0 * g.mixed_stride;
        g2.ba += (size_t)n0 * g.ba_stride;
        g2.out += (size_t)n0 * g.Hv * g.dv;
        g2.step = mk->step_next;
        g2.timeline = NULL;
        g2.kernel = gdn_kernel_choose(g2, n - n0, c->opts.exact);
        LAUNCH(launch_gdn(g2, c->gdn_pre, c->gdn_wy, n - n0, c->stream));
    }
    MARK(PS_GDN_OUT);
    return proj(c, tl_batch(c, A->mix_out, PS_GDN_OUT, layer), A->mix_out_x, GEMV_OUT_ADD, n, err);
}

/* Sparse MoE (docs/MODEL.md §4.5): router | shared gate of RMSNorm(h), top-k, the experts' SwiGLU MLPs and
 * the shared expert's, h += the weighted sum. Prefill chunks run it on GEMMs (forward_prefill.cu). */
static lily_status moe_block(cuda_ctx *c, const cuda_layer *L, const cuda_layer_args *A, int n, lily_error *err)
{
    MARK(PS_ROUTER);
    if (prefill_gemm(c, n))
        return cuda_prefill_moe(c, L, n, err);
    const int l = A->moe.layer;
    moe_args m = A->moe;
    const bool host_cpu = cuda_cpu_experts_layer(c, l, n); /* the routed experts on the host's cores (cpu_experts.cu) */
    if (host_cpu || c->opts.moe_router_unfused || !moe_router_fused(m, n)) { /* else gate/up computes the router rows itself */
        m.logit_pub = NULL;
        LAUNCH(launch_gemv(tl_batch(c, A->router, PS_ROUTER, l), A->router_x, GEMV_OUT_STORE, n, NULL, c->stream));
    }
    MARK(PS_MOE_GATE_UP);
    if (host_cpu)
        return cuda_cpu_experts_moe(c, m, err);
    m.timeline = tl_slot(c, PS_MOE_GATE_UP, l, m.top_k * (dmat_bytes(m.gate) + dmat_bytes(m.up)) + dmat_bytes(m.sgate) +
                         dmat_bytes(m.sup) + (m.logit_pub ? dmat_bytes(m.router) + dmat_bytes(m.router_shared) : 0.0), 0.0, 1);
    LAUNCH(launch_moe_gate_up(m, n, c->stream));
    MARK(PS_MOE_DOWN);
    m.timeline = tl_slot(c, PS_MOE_DOWN, l, m.top_k * dmat_bytes(m.down) + dmat_bytes(m.sdown), 0.0, 1);
    LAUNCH(launch_moe_down(m, n, c->stream));
    return LILY_OK;
}

/* The debug hook's view of h after a stage (minus the snapshot taken before the stage when `delta`). */
static lily_status hook_stage(cuda_ctx *c, int layer, const char *stage, int n, bool delta, lily_error *err)
{
    if (!c->opts.debug_hook)
        return LILY_OK;
    return hook_dev(c, layer, stage, c->h, n, c->cfg.hidden, delta ? c->h_prev : NULL, err);
}
static lily_status hook_mark(cuda_ctx *c, int n, lily_error *err)
{
    return c->opts.debug_hook ? hook_snapshot(c, n, err) : LILY_OK;
}

/* The LM head of the last row (argmax for greedy, or logits) or all rows, and the step's bookkeeping. */
static lily_status head_block(cuda_ctx *c, cuda_state *st, int n, int lm_mode, lily_error *err)
{
    const lily_config *cfg = &c->cfg;
    const int H = cfg->hidden;
    cudaStream_t s = c->stream;
    MARK(PS_LM_HEAD);
    if (c->poison_step >= 0) /* tests: a NaN hidden state at one step, as an overflow would leave it */
        LAUNCH(launch_poison_hidden(c->h + (size_t)(n - 1) * H, H, &st->ctr->step, c->poison_step, s));
    if (lm_mode == LILY_LOGITS_ALL && n > c->logits_rows)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: all-row logits of %d tokens (at most %d at once)",
                              n, c->logits_rows);
    if (lm_mode != LILY_LOGITS_NONE) {
        const int rows = lm_mode == LILY_LOGITS_ALL ? n : 1;
        if (lm_mode == LM_GREEDY) {
            gemv_batch b;
            batch_init(c, &b);
            batch_add(&b, c->lm_head, c->logits, cfg->vocab_size);
            b = tl_batch(c, b, PS_LM_HEAD, -1);
            LAUNCH(launch_gemv(b, in_rms(c->h + (size_t)(n - 1) * H, H, c->final_norm, cfg->rms_norm_eps),
                               GEMV_OUT_ARGMAX, 1, c->argmax, s));
        } else {
            TRY(cuda_enqueue_lm_head(c, lm_mode == LILY_LOGITS_ALL ? 0 : n - 1, rows, err));
        }
        if (c->opts.debug_hook && lm_mode != LM_GREEDY)
            TRY(hook_dev(c, -1, LILY_STAGE_LOGITS, c->logits, rows, cfg->vocab_size, NULL, err));
    }
    MARK(PS_SAMPLE);
    if (lm_mode == LM_GREEDY) {
        sample_args sa;
        memset(&sa, 0, sizeof sa);
        sa.argmax = c->argmax;
        sa.logits = c->logits;
        sa.vocab = cfg->vocab_size;
        sa.token_slots = st->ctr->slots;
        sa.out_tokens = st->out_tokens;
        sa.out_cap = st->out_cap;
        sa.host_tokens = st->host_tokens_dev;
        sa.step = &st->ctr->step;
        sa.pos = &st->ctr->pos;
        sa.n_generated = &st->ctr->n_generated;
        sa.token_info = c->sampling.info_dev;
        LAUNCH(launch_finish_greedy(sa, s));
    } else {
        LAUNCH(launch_advance(&st->ctr->pos, &st->ctr->step, n, s));
    }
    return LILY_OK;
}

lily_status cuda_enqueue_forward(cuda_ctx *c, cuda_state *st, int n, int lm_mode, bool decode_splits,
                                 const cuda_mark *mark, lily_error *err)
{
    uint8_t *mark_ext = mark ? mark->ext : NULL; /* the next DeltaNet layer's part */
    TRY(cuda_cpu_experts_wake(c, n, err)); /* CPU experts: the worker spins from now (cpu_experts.cu) */
    MARK(PS_EMBED);
    LAUNCH(launch_embed(c->embed, c->d_tokens, n, c->h, c->cfg.hidden, NULL, c->stream));
    TRY(hook_stage(c, -1, LILY_STAGE_EMBED, n, false, err));
    for (int l = 0; l < c->cfg.n_layers; l++) {
        const cuda_layer *L = &c->layers[l];
        const cuda_layer_args *A = &st->args[l];
        TRY(hook_mark(c, n, err));
        if (prefill_gemm(c, n)) /* a host layer's experts: their copy to the device starts now (host_weights.cu) */
            TRY(cuda_experts_stage(c, l, n, err));
        if (L->full_attention)
            TRY(attention_block(c, st, A, l, n, decode_splits, err));
        else {
            TRY(deltanet_block(c, A, l, n, mark, mark_ext, err));
            if (mark)
                mark_ext += mark->conv_bytes + mark->rec_bytes;
        }
        TRY(hook_stage(c, l, L->full_attention ? LILY_STAGE_ATTENTION_OUT : LILY_STAGE_DELTANET_OUT, n, true, err));
        TRY(hook_mark(c, n, err));
        TRY(moe_block(c, L, A, n, err));
        TRY(hook_stage(c, l, LILY_STAGE_MOE_OUT, n, true, err));
        TRY(hook_stage(c, l, LILY_STAGE_RESIDUAL, n, false, err));
    }
    TRY(cuda_cpu_experts_join(c, n, err));
    if (!mark)
        return head_block(c, st, n, lm_mode, err);
    /* the mark's logits when wanted (the LM head of row - 1, as the first call's LILY_LOGITS_LAST), then the
     * pass's */
    if (mark->logits) {
        TRY(cuda_enqueue_lm_head(c, mark->row - 1, 1, err));
        CUDA_TRY(cudaMemcpyAsync(mark->logits, c->logits, (size_t)c->cfg.vocab_size * sizeof(float),
                                 cudaMemcpyDeviceToHost, c->stream));
    }
    TRY(head_block(c, st, n, lm_mode, err));
    LAUNCH(launch_advance(&st->ctr->pos, &st->ctr->step, 0, c->stream)); /* the second call's step */
    return LILY_OK;
}

/* ---- graphs ----------------------------------------------------------------------------------------- */

static lily_status capture(cuda_ctx *c, cuda_state *st, int lm_mode, cudaGraphExec_t *exec, lily_error *err)
{
    cudaGraph_t g = NULL;
    CUDA_TRY(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    lily_status rs = LILY_OK;
    if (lm_mode == LM_GREEDY) {
        cudaError_t e = launch_fetch_token(st->ctr->slots, &st->ctr->step, c->d_tokens, c->stream);
        if (e != cudaSuccess)
            rs = lily_cuda_error(err, e, "launch_fetch_token", __FILE__, __LINE__);
    }
    if (rs == LILY_OK)
        rs = cuda_enqueue_forward(c, st, 1, lm_mode, true, NULL, err);
    if (rs == LILY_OK)
        rs = prof_mark(c, PS_COUNT, err); /* closing event of a profiled capture (no-op otherwise) */
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (rs != LILY_OK) {
        if (g)
            cudaGraphDestroy(g);
        return rs;
    }
    CUDA_TRY(e);
    e = cudaGraphInstantiate(exec, g, 0);
    cudaGraphDestroy(g);
    CUDA_TRY(e);
    return LILY_OK;
}

lily_status cuda_forward_logits_graph(cuda_ctx *c, cuda_state *st, lily_error *err)
{
    if (!st->graph_logits) {
        lily_status rs = capture(c, st, LILY_LOGITS_LAST, &st->graph_logits, err);
        if (rs != LILY_OK)
            return rs;
    }
    CUDA_TRY(cudaGraphLaunch(st->graph_logits, c->stream));
    return LILY_OK;
}

/* Capture the step graph a decode loop replays (greedy: token slot -> next token slot; sampled: the
 * logits graph), once per state. */
static lily_status ensure_step_graph(cuda_ctx *c, cuda_state *st, bool greedy, lily_error *err)
{
    if (greedy && !st->graph_greedy)
        return capture(c, st, LM_GREEDY, &st->graph_greedy, err);
    if (!greedy && !st->graph_logits)
        return capture(c, st, LILY_LOGITS_LAST, &st->graph_logits, err);
    return LILY_OK;
}

/* Enqueue one decode step that reads its token from the slot of the step counter and writes the token it
 * chooses into the next slot, into out_tokens and into the mapped host_tokens (never synchronizes).
 * greedy: the step graph with the LM head's fused argmax; else the logits graph and the sampler
 * (sampling/) with the settings of ds. */
static lily_status enqueue_step(cuda_ctx *c, cuda_state *st, bool greedy, const lily_device_sampling *ds,
                                lily_error *err)
{
    if (greedy) {
        CUDA_TRY(cudaGraphLaunch(st->graph_greedy, c->stream));
        return LILY_OK;
    }
    /* logits graph reads d_tokens[0] and advances pos/step; the sampler writes the next slot */
    LAUNCH(launch_fetch_token(st->ctr->slots, &st->ctr->step, c->d_tokens, c->stream));
    CUDA_TRY(cudaGraphLaunch(st->graph_logits, c->stream));
    sample_args sa;
    memset(&sa, 0, sizeof sa);
    sa.logits = c->logits;
    sa.vocab = c->cfg.vocab_size;
    sa.token_slots = st->ctr->slots;
    sa.out_tokens = st->out_tokens;
    sa.out_cap = st->out_cap;
    sa.host_tokens = st->host_tokens_dev;
    sa.step = &st->ctr->step;
    sa.pos = NULL; /* the logits graph already advanced pos/step */
    sa.n_generated = &st->ctr->n_generated;
    sa.token_info = c->sampling.info_dev;
    LAUNCH(cuda_sampling_enqueue(&c->sampling, sa, ds, c->stream));
    return LILY_OK;
}

/* The start of a device decode run of n steps from first_token: context and token checks, the step graph
 * (captured once), first_token into the current input slot, the generated-token counters zeroed (device
 * and the mapped host count: the previous run ended with a sync, so no kernel writes it now).
 * Errors: LILY_ERR_CONTEXT_LENGTH, LILY_ERR_INVALID_ARGUMENT, LILY_ERR_BACKEND. */
static lily_status decode_begin(cuda_ctx *c, cuda_state *st, int32_t first_token, int n, bool greedy, lily_error *err)
{
    if (st->pos + n > st->max_ctx)
        return lily_error_set(err, LILY_ERR_CONTEXT_LENGTH, "cuda: %d + %d tokens exceed the context of %d", st->pos,
                              n, st->max_ctx);
    if (first_token < 0 || first_token >= c->cfg.vocab_size)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: token id %d outside [0, %d)", first_token,
                              c->cfg.vocab_size);
    CUDA_TRY(cudaSetDevice(c->device));
    lily_status rs = ensure_step_graph(c, st, greedy, err);
    if (rs != LILY_OK)
        return rs;
    LAUNCH(launch_set_int(&st->ctr->slots[st->step & 1], first_token, c->stream));
    LAUNCH(launch_set_int(&st->ctr->n_generated, 0, c->stream));
    *(volatile int *)(st->host_tokens + st->out_cap) = 0;
    return LILY_OK;
}

/* Steps the decode loop keeps queued ahead of the tokens the host has seen: enough that the GPU never
 * waits for the host's per-token work, few enough that a stop wastes little GPU time. */
#define DECODE_LOOP_AHEAD 4

/* backend.h's decode_loop: the step graph replayed, DECODE_LOOP_AHEAD steps ahead of the tokens the host
 * has polled from mapped memory, so on_token can stop the loop; one synchronization at the end. */
lily_status cuda_decode_loop(void *vctx, void *vst, int32_t first_token, int n, const lily_device_sampling *sampling,
                             lily_decode_token_fn on_token, void *user, float *last_logits, int *n_run,
                             lily_error *err)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    cuda_state *st = (cuda_state *)vst;
    const lily_device_sampling *ds = sampling;
    *n_run = 0;
    if (n < 1 || n > st->out_cap)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: decode loop of %d steps", n);
    if (!(ds->temperature >= 0.0f) || !(ds->temperature < INFINITY) || !(ds->top_p > 0.0f) || ds->top_p > 1.0f ||
        !(ds->min_p >= 0.0f) || ds->min_p > 1.0f || !(ds->repetition_penalty > 0.0f) ||
        !(ds->repetition_penalty < INFINITY) || !isfinite(ds->presence_penalty) || !isfinite(ds->frequency_penalty) ||
        ds->top_logprobs > LILY_TOP_LOGPROBS_MAX || ds->n_bias < 0 || ds->n_history < 0 ||
        (ds->n_bias > 0 && (!ds->bias_ids || !ds->bias_values)) ||
        (ds->n_history > 0 && (!ds->history_ids || !ds->history_counts)))
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT,
                              "cuda: device sampling settings out of range (temperature %g, top_p %g, min_p %g, "
                              "repetition_penalty %g, top_logprobs %d)",
                              (double)ds->temperature, (double)ds->top_p, (double)ds->min_p,
                              (double)ds->repetition_penalty, ds->top_logprobs);
    if (c->opts.debug_hook) /* the hook syncs per stage: no graphs (forward() runs eagerly instead) */
        return lily_error_set(err, LILY_ERR_UNSUPPORTED, "cuda: no decode loop with a debug hook");
    const bool greedy = cuda_sampling_is_plain_greedy(ds);
    lily_status rs = decode_begin(c, st, first_token, n, greedy, err);
    if (rs != LILY_OK)
        return rs;
    if (!greedy)
        CUDA_TRY(cuda_sampling_upload(&c->sampling, ds, c->stream));
    if (ds->token_mask) { /* step 0's mask before any step starts (the last loop ended with a sync) */
        cuda_sampling_mask_reset(&c->sampling);
        cuda_sampling_mask_publish(&c->sampling, ds, 0);
    }
    volatile int *host_count = st->host_tokens + st->out_cap;
    volatile const int *host_tokens = st->host_tokens;
    int launched = 0, seen = 0;
    bool stop = false;
    while (!stop && seen < n) {
        while (launched < n && launched < seen + DECODE_LOOP_AHEAD) {
            rs = enqueue_step(c, st, greedy, ds, err);
            if (rs != LILY_OK)
                break;
            launched++;
        }
        if (rs != LILY_OK)
            break;
        const int avail = *host_count;
        if (seen < avail) {
            const int32_t token = host_tokens[seen];
            /* the info record was written before the count (the device fenced in between) */
            const volatile sample_token_info *info = &c->sampling.info_host[seen % SAMPLE_INFO_RING];
            if (info->flags & SAMPLE_FLAG_NONFINITE) {
                rs = lily_error_set(err, LILY_ERR_BACKEND,
                                    "the forward pass gave a non-finite logit after %d tokens: the model's arithmetic "
                                    "overflowed or its weights are corrupt",
                                    st->pos + seen + 1);
                break;
            }
            if (info->flags & SAMPLE_FLAG_MASK_TIMEOUT) {
                rs = lily_error_set(err, LILY_ERR_BACKEND,
                                    "cuda: the token mask of decode step %d did not arrive within %llu s", seen,
                                    SAMPLE_MASK_TIMEOUT_NS / 1000000000ull);
                break;
            }
            lily_token_logprobs lp;
            const bool with_lp = ds->top_logprobs >= 0 && info->has_logprobs;
            if (with_lp)
                memcpy(&lp, (const void *)&info->lp, sizeof lp);
            stop = on_token && on_token(user, token, seen, with_lp ? &lp : NULL) != 0;
            seen++;
            if (!stop && ds->token_mask && seen < n) /* the next step's forward pass is running meanwhile */
                cuda_sampling_mask_publish(&c->sampling, ds, seen);
            continue;
        }
        const cudaError_t q = cudaStreamQuery(c->stream); /* non-blocking: ends the loop on an error */
        if (q != cudaSuccess && q != cudaErrorNotReady) {
            rs = lily_cuda_error(err, q, "cudaStreamQuery", __FILE__, __LINE__);
            break;
        }
        if (q == cudaSuccess && *host_count == avail) {
            rs = lily_error_set(err, LILY_ERR_BACKEND, "cuda: decode loop ended after %d of %d tokens", avail,
                                launched);
            break;
        }
    }
    /* the steps launched run to the end whatever happened (those waiting for a mask unconstrained): keep the
     * host mirrors in step with the device */
    if (ds->token_mask)
        cuda_sampling_mask_abort(&c->sampling);
    if (rs == LILY_OK && stop && last_logits) {
        const cudaError_t e = cudaMemcpyAsync(last_logits, c->logits, (size_t)c->cfg.vocab_size * sizeof(float),
                                              cudaMemcpyDeviceToHost, c->stream);
        if (e != cudaSuccess)
            rs = lily_cuda_error(err, e, "cudaMemcpyAsync(last_logits)", __FILE__, __LINE__);
    }
    const lily_status sync = cuda_sync(c, rs == LILY_OK ? err : NULL);
    st->pos += launched;
    st->step += launched;
    *n_run = launched;
    return rs != LILY_OK ? rs : sync;
}

extern "C" void lily_cuda_debug_poison(void *ctx, int step) { ((cuda_ctx *)ctx)->poison_step = step; }

extern "C" long long lily_cuda_host_syncs(void *ctx) { return ((cuda_ctx *)ctx)->host_syncs; }

extern "C" lily_status lily_cuda_state_set_position(void *ctx, void *state, int pos, lily_error *err)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    cuda_state *st = (cuda_state *)state;
    if (pos < 0 || pos >= st->max_ctx)
        return lily_error_set(err, LILY_ERR_CONTEXT_LENGTH, "cuda: position %d outside the context of %d", pos,
                              st->max_ctx);
    CUDA_TRY(cudaSetDevice(c->device));
    const lily_config *cfg = &c->cfg;
    for (int l = 0; l < cfg->n_layers; l++)
        if (st->k_cache[l])
            for (int h = 0; h < cfg->n_kv_heads; h++) {
                const size_t off = (size_t)h * st->max_ctx * cfg->head_dim, n_fill = (size_t)pos * cfg->head_dim;
                if (c->opts.exact) {
                    LAUNCH(launch_fill_random_f32((float *)st->k_cache[l] + off, n_fill, 2 * l + 1, c->stream));
                    LAUNCH(launch_fill_random_f32((float *)st->v_cache[l] + off, n_fill, 2 * l + 2, c->stream));
                } else {
                    __nv_bfloat16 *k = (__nv_bfloat16 *)st->k_cache[l], *v = (__nv_bfloat16 *)st->v_cache[l];
                    LAUNCH(launch_fill_random_bf16(k + off, n_fill, 2 * l + 1, c->stream));
                    LAUNCH(launch_fill_random_bf16(v + off, n_fill, 2 * l + 2, c->stream));
                }
            }
    LAUNCH(launch_set_int(&st->ctr->pos, pos, c->stream));
    st->pos = pos;
    return cuda_sync(c, err);
}

extern "C" lily_status lily_cuda_set_attention_split(void *ctx, void *state, int n_splits, int min_chunk,
                                                     lily_error *err)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    cuda_state *st = (cuda_state *)state;
    if (n_splits < 1 || n_splits > ATT_SPLITS_DEFAULT * 4 || min_chunk < 1)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: split-KV %d x %d", n_splits, min_chunk);
    if (n_splits > c->att_splits) {
        /* grow the partial buffers */
        const lily_config *cfg = &c->cfg;
        const size_t G = cfg->n_heads / cfg->n_kv_heads;
        float *po = NULL, *pml = NULL;
        CUDA_TRY(cudaMalloc((void **)&po, (size_t)cfg->n_kv_heads * n_splits * G * cfg->head_dim * 4));
        CUDA_TRY(cudaMalloc((void **)&pml, (size_t)cfg->n_kv_heads * n_splits * G * 2 * 4));
        c->part_o = po; /* bench-only path: these two are not freed at destroy */
        c->part_ml = pml;
    }
    c->att_splits = n_splits;
    c->att_min_chunk = min_chunk;
    CUDA_TRY(cudaStreamSynchronize(c->stream));
    if (st && st->graph_greedy) {
        cudaGraphExecDestroy(st->graph_greedy);
        st->graph_greedy = NULL;
    }
    if (st && st->graph_logits) {
        cudaGraphExecDestroy(st->graph_logits);
        st->graph_logits = NULL;
    }
    return LILY_OK;
}

/* Per-stage decode profile: one greedy step captured as a graph with an event record between stages
 * (event nodes; they cut the programmatic launch overlap at stage boundaries, so the sum is a little
 * above the plain graph's step time), replayed n_steps times; elapsed times between events summed. */
extern "C" lily_status lily_cuda_profile_decode(void *ctx, void *state, int32_t first_token, int n_steps,
                                                lily_cuda_profile *out, lily_error *err)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    cuda_state *st = (cuda_state *)state;
    memset(out, 0, sizeof *out);
    if (n_steps < 1 || st->pos + n_steps + 1 > st->max_ctx)
        return lily_error_set(err, LILY_ERR_CONTEXT_LENGTH, "cuda: profile exceeds the context");
    CUDA_TRY(cudaSetDevice(c->device));
    cudaGraphExec_t exec = NULL;
    lily_status rs = prof_begin(c, err);
    if (rs != LILY_OK)
        return rs;
    rs = capture(c, st, LM_GREEDY, &exec, err);
    if (rs != LILY_OK) {
        prof_end(c);
        return rs;
    }
    double acc[PS_COUNT] = {0};
    LAUNCH(launch_set_int(&st->ctr->slots[st->step & 1], first_token, c->stream));
    for (int i = 0; i <= n_steps && rs == LILY_OK; i++) {
        cudaError_t e = cudaGraphLaunch(exec, c->stream);
        if (e != cudaSuccess)
            rs = lily_cuda_error(err, e, "cudaGraphLaunch", __FILE__, __LINE__);
        if (rs == LILY_OK)
            rs = cuda_sync(c, err);
        if (rs != LILY_OK)
            break;
        st->pos++;
        st->step++;
        if (i == 0)
            continue; /* warm-up */
        rs = prof_accumulate(c->prof, acc, err);
    }
    cudaGraphExecDestroy(exec);
    prof_end(c);
    if (rs != LILY_OK)
        return rs;
    out->n = PS_COUNT;
    for (int k = 0; k < PS_COUNT; k++) {
        out->names[k] = prof_names[k];
        out->ms[k] = acc[k] / n_steps;
        out->total_ms += out->ms[k];
    }
    return LILY_OK;
}

/* One step's stamps (host copy, n_k slots) folded into out's sums (µs from the step's first entry). */
static void tl_accumulate(const unsigned long long *h, int n_k, lily_cuda_timeline *out)
{
    unsigned long long t0 = ~0ull, t_end = 0;
    for (int k = 0; k < n_k; k++)
        for (int b = 0; b < TL_MAX_BLOCKS; b++) {
            const unsigned long long *r = h + (size_t)k * TL_SLOT_WORDS + (size_t)TL_WORDS * b;
            if (r[0] && r[0] < t0)
                t0 = r[0];
            if (r[2] > t_end)
                t_end = r[2];
        }
    if (t0 == ~0ull)
        return;
    out->step_us += (t_end - t0) * 1e-3;
    for (int k = 0; k < n_k; k++) {
        unsigned long long first = ~0ull, last = 0, wait = 0, end = 0, mark = 0;
        int blocks = 0;
        for (int b = 0; b < TL_MAX_BLOCKS; b++) {
            const unsigned long long *r = h + (size_t)k * TL_SLOT_WORDS + (size_t)TL_WORDS * b;
            if (!r[0])
                continue;
            blocks++;
            first = r[0] < first ? r[0] : first;
            last = r[0] > last ? r[0] : last;
            wait = r[1] > wait ? r[1] : wait;
            end = r[2] > end ? r[2] : end;
            mark = r[4] > mark ? r[4] : mark;
        }
        lily_cuda_timeline_kernel *K = &out->k[k];
        if (!blocks)
            continue;
        K->blocks = blocks;
        K->start_us += (first - t0) * 1e-3;
        K->last_start_us += (last - t0) * 1e-3;
        K->wait_us += ((wait ? wait : first) - t0) * 1e-3;
        K->end_us += (end - t0) * 1e-3;
        K->mark_us += mark ? (mark - t0) * 1e-3 : 0.0;
    }
}

extern "C" lily_status lily_cuda_timeline_decode(void *ctx, void *state, int32_t first_token, int n_steps,
                                                 lily_cuda_timeline *out, lily_error *err)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    cuda_state *st = (cuda_state *)state;
    memset(out, 0, sizeof *out);
    if (n_steps < 1 || st->pos + n_steps + 1 > st->max_ctx)
        return lily_error_set(err, LILY_ERR_CONTEXT_LENGTH, "cuda: timeline exceeds the context");
    CUDA_TRY(cudaSetDevice(c->device));
    CUDA_TRY(tl_timer_resolution(c->stream, &out->timer_step_ns, &out->timer_update_ns, &out->timer_update_cycles));
    const size_t slot_bytes = (size_t)TL_SLOT_WORDS * sizeof(unsigned long long);
    CUDA_TRY(cudaMalloc((void **)&c->tl_buf, (size_t)TL_MAX_KERNELS * slot_bytes));
    c->tl_n = 0;
    cudaGraphExec_t exec = NULL;
    lily_status rs = capture(c, st, LM_GREEDY, &exec, err);
    unsigned long long *dev = c->tl_buf;
    c->tl_buf = NULL;
    const int n_k = c->tl_n;
    unsigned long long *h = rs == LILY_OK ? (unsigned long long *)malloc((size_t)n_k * slot_bytes + 1) : NULL;
    if (rs == LILY_OK && !h)
        rs = lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cuda: timeline host buffer");
    const int pos0 = st->pos + 1; /* the first measured step's position */
    cudaError_t e = cudaSuccess;
    if (rs == LILY_OK)
        e = launch_set_int(&st->ctr->slots[st->step & 1], first_token, c->stream);
    for (int i = 0; i <= n_steps && rs == LILY_OK && e == cudaSuccess; i++) {
        e = cudaMemsetAsync(dev, 0, (size_t)n_k * slot_bytes, c->stream);
        if (e == cudaSuccess)
            e = cudaGraphLaunch(exec, c->stream);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(h, dev, (size_t)n_k * slot_bytes, cudaMemcpyDeviceToHost, c->stream);
        if (e != cudaSuccess)
            break;
        rs = cuda_sync(c, err);
        st->pos++;
        st->step++;
        if (rs == LILY_OK && i > 0) /* i == 0: warm-up */
            tl_accumulate(h, n_k, out);
    }
    if (rs == LILY_OK && e != cudaSuccess)
        rs = lily_cuda_error(err, e, "timeline step", __FILE__, __LINE__);
    if (exec)
        cudaGraphExecDestroy(exec);
    cudaFree(dev);
    free(h);
    if (rs != LILY_OK)
        return rs;
    out->n = n_k;
    out->step_us /= n_steps;
    for (int k = 0; k < n_k; k++) {
        lily_cuda_timeline_kernel *K = &out->k[k];
        K->stage = c->tl_k[k].stage;
        K->layer = c->tl_k[k].layer;
        K->start_us /= n_steps;
        K->last_start_us /= n_steps;
        K->wait_us /= n_steps;
        K->end_us /= n_steps;
        K->mark_us /= n_steps;
        K->bytes = c->tl_k[k].bytes + c->tl_k[k].bytes_per_pos * (pos0 + n_steps / 2);
    }
    out->n_stages = TL_STAGES;
    for (int s = 0; s < TL_STAGES; s++)
        out->stage_names[s] = tl_stage_names[s];
    return LILY_OK;
}

/* Per-stage prefill profile: one forward call of n tokens (n <= max_chunk) at the state's position,
 * launched eagerly with an event between stages (events cut the programmatic launch overlap at stage
 * boundaries); advances the state by n. Stage names as lily_cuda_profile_decode (for a prefill chunk the
 * whole MoE block is reported under moe_router). */
extern "C" lily_status lily_cuda_profile_prefill(void *ctx, void *state, const int32_t *tokens, int n,
                                                 lily_cuda_profile *out, lily_error *err)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    cuda_state *st = (cuda_state *)state;
    memset(out, 0, sizeof *out);
    if (n < 1 || n > c->max_chunk || st->pos + n > st->max_ctx)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: profile of %d tokens at %d (max_chunk %d, context %d)",
                              n, st->pos, c->max_chunk, st->max_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->cfg.vocab_size)
            return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: token id %d outside [0, %d)", tokens[i],
                                  c->cfg.vocab_size);
    CUDA_TRY(cudaSetDevice(c->device));
    CUDA_TRY(cudaMemcpyAsync(c->d_tokens, tokens, (size_t)n * sizeof(int), cudaMemcpyHostToDevice, c->stream));
    lily_status rs = prof_begin(c, err);
    if (rs != LILY_OK)
        return rs;
    rs = cuda_enqueue_forward(c, st, n, LILY_LOGITS_LAST, false, NULL, err);
    if (rs == LILY_OK)
        rs = prof_mark(c, PS_SAMPLE, err); /* closes the last stage */
    if (rs == LILY_OK)
        rs = cuda_sync(c, err);
    double acc[PS_COUNT] = {0};
    if (rs == LILY_OK) {
        st->pos += n;
        st->step += 1;
        rs = prof_accumulate(c->prof, acc, err);
    }
    prof_end(c);
    if (rs != LILY_OK)
        return rs;
    out->n = PS_COUNT;
    for (int k = 0; k < PS_COUNT; k++) {
        out->names[k] = prof_names[k];
        out->ms[k] = acc[k];
        out->total_ms += acc[k];
    }
    return LILY_OK;
}
