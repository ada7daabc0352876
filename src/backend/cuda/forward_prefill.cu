/* forward_prefill.cu — the prefill stages of the layer loop (chunks of at least prefill_min_tokens
 * tokens) on tensor cores: a projection is gemm_prep (input transform -> fp16) + one GEMM over the
 * batch of matrices; the sparse MoE block is, with no host sync:
 *   prep(post-attention RMSNorm) -> GEMM(router | shared_expert_gate) -> top-k -> plan (histogram,
 *   offsets, scatter, tile map) -> grouped GEMM(gate, up; silu·up) -> GEMM(shared gate, up; silu·up)
 *   -> prep(hid) -> grouped GEMM(down) -> GEMM(shared down) -> combine (+= residual).
 * Knobs (cuda_backend.h): moe_router (the gate logit moves to the top-k kernel, the router GEMM's tile),
 * moe_plan (multi-block plan), moe_y_bf16 (per-slot down outputs in bf16; the shared expert's stay fp32),
 * moe_hid_h16 (routed SwiGLU output as fp16 per 64-column group, regrouped instead of the fp32 pre-pass),
 * moe_shared_add (the shared expert's down GEMM adds its gated output to h itself).
 * Each stage is its own launch (per-stage events work). cuda_forward.cu picks this path per stage.
 */
#include <string.h>

#include "cuda_internal.cuh"

static gemm_act act_at(const cuda_ctx *c, size_t row0, int cols)
{
    gemm_act a;
    a.x = c->pf_x + row0 * cols;
    a.xs = c->pf_xs + row0 * (cols / 64);
    a.scale = c->pf_xscale + row0;
    a.cols = cols;
    return a;
}

static lily_status act_fits(const cuda_ctx *c, size_t rows, int cols, lily_error *err)
{
    if (rows * (size_t)cols > c->pf_x_elems || rows > c->pf_x_rows)
        return lily_error_set(err, LILY_ERR_BACKEND, "cuda: prefill scratch too small for %zu x %d", rows, cols);
    return LILY_OK;
}

/* A grouped GEMM walks the tile map moe_plan built: T-token tiles of expert-ordered rows. */
static void grouped_by_expert(const cuda_ctx *c, int n, int K, int E, int T, gemm_args *a)
{
    a->tile_expert = c->pf_tile_expert;
    a->tile_start = c->pf_tile_start;
    a->n_tiles = c->pf_n_tiles;
    a->offsets = c->pf_offsets;
    a->max_tiles = moe_max_tiles(n, K, E, T);
    a->tile_tokens = T;
}

lily_status cuda_prefill_proj(cuda_ctx *c, const gemv_batch &b, const gemv_input &in, int out_mode, int n,
                              lily_error *err)
{
    const int cols = b.m[0].cols;
    lily_status st = act_fits(c, (size_t)n, cols, err);
    if (st != LILY_OK)
        return st;
    const gemm_act act = act_at(c, 0, cols);
    LAUNCH(launch_gemm_prep(in, cols, n, act, c->stream));
    gemm_args a;
    memset(&a, 0, sizeof a);
    for (int k = 0; k < b.n_mats; k++) {
        a.m[k] = b.m[k];
        a.y[k] = b.y[k];
        a.y_stride[k] = b.y_stride[k];
        a.row_start[k + 1] = b.row_start[k + 1];
    }
    a.n_mats = b.n_mats;
    a.act = act;
    a.epi = out_mode == GEMV_OUT_ADD ? GEMM_EPI_ADD : GEMM_EPI_STORE;
    LAUNCH(launch_gemm(a, n, c->stream));
    return LILY_OK;
}

lily_status cuda_prefill_moe(cuda_ctx *c, const cuda_layer *L, int n, lily_error *err)
{
    const lily_config *cfg = &c->cfg;
    const int H = cfg->hidden, E = cfg->n_experts, K = cfg->n_experts_used;
    const int inter = cfg->moe_intermediate, sinter = cfg->shared_intermediate;
    const int hs = inter > sinter ? inter : sinter; /* row stride of c->hid */
    const size_t nk = (size_t)n * K;
    cudaStream_t s = c->stream;
    lily_status st;
    if ((st = act_fits(c, (size_t)n, H, err)) != LILY_OK)
        return st;
    if (nk * inter + (size_t)n * sinter > c->pf_x_elems || nk + n > c->pf_x_rows)
        return lily_error_set(err, LILY_ERR_BACKEND, "cuda: prefill MoE scratch too small for %d tokens", n);

    /* x = RMSNorm(h) in fp16, shared by the router and both gate/up GEMMs */
    gemv_input in;
    memset(&in, 0, sizeof in);
    in.act = c->h;
    in.act_stride = H;
    in.mode = GEMV_IN_RMSNORM;
    in.norm_w = L->post_norm;
    in.eps = cfg->rms_norm_eps;
    const gemm_act xa = act_at(c, 0, H);
    LAUNCH(launch_gemm_prep(in, H, n, xa, s));

    /* moe_router 0: router | shared_expert_gate in one GEMM; 1-3: the router rows alone at 64/32/16-token
     * tiles (the 257th row would take a third block row), the gate logit in the top-k kernel */
    const int rmode = g_cuda_tuning.moe_router;
    const bool gate_in_topk = rmode >= 1 && rmode <= 3;
    gemm_args a;
    memset(&a, 0, sizeof a);
    a.m[0] = L->router;
    a.m[1] = L->shared_expert_gate;
    a.y[0] = c->router;
    a.y[1] = c->router + E;
    a.y_stride[0] = a.y_stride[1] = E + 1;
    a.row_start[1] = L->router.rows;
    a.row_start[2] = L->router.rows + L->shared_expert_gate.rows;
    a.n_mats = gate_in_topk ? 1 : 2;
    a.tile_tokens = rmode == 1 ? 64 : rmode == 2 ? 32 : rmode == 3 ? 16 : 0;
    a.act = xa;
    a.epi = GEMM_EPI_STORE;
    LAUNCH(launch_gemm(a, n, s));

    if (gate_in_topk)
        LAUNCH(launch_moe_topk_gate(c->router, E + 1, E, K, n, c->topk_idx, c->topk_w, xa, L->shared_expert_gate, s));
    else
        LAUNCH(launch_moe_topk(c->router, E + 1, E, K, n, c->topk_idx, c->topk_w, s));
    const int T = gemm_grouped_tile((double)nk / E);
    LAUNCH(launch_moe_plan(c->topk_idx, n, K, E, T, c->pf_offsets, c->pf_gather, c->pf_slot_pos, c->pf_tile_expert,
                           c->pf_tile_start, c->pf_n_tiles, g_cuda_tuning.moe_plan == 1 ? c->pf_plan_counts : NULL,
                           s));

    /* routed gate/up: hid rows = expert-ordered positions [0, nk); moe_hid_h16: as fp16 at a scale per row
     * and 64 columns (h16a: in c->hid, then the groups' exponents; launch_gemm_regroup makes ha of it) */
    const bool h16 = g_cuda_tuning.moe_hid_h16 == 1 && inter % 64 == 0 && inter <= 1024;
    gemm_act h16a;
    h16a.x = reinterpret_cast<__half *>(c->hid);
    h16a.xs = reinterpret_cast<float *>(h16a.x + nk * inter); /* 2·nk·inter + nk·inter/16 bytes <= nk·hs·4 */
    h16a.scale = NULL;
    h16a.cols = inter;
    memset(&a, 0, sizeof a);
    a.m[0] = L->ex_gate;
    a.m[1] = L->ex_up;
    a.n_mats = 2;
    a.y[0] = c->hid;
    a.y_stride[0] = hs;
    a.act = xa;
    a.epi = h16 ? GEMM_EPI_SWIGLU_H16 : GEMM_EPI_SWIGLU;
    a.out_act = h16a;
    grouped_by_expert(c, n, K, E, T, &a);
    a.gather = c->pf_gather;
    LAUNCH(launch_gemm(a, n, s));

    /* shared expert gate/up: hid rows nk + t */
    memset(&a, 0, sizeof a);
    a.m[0] = L->sh_gate;
    a.m[1] = L->sh_up;
    a.n_mats = 2;
    a.y[0] = c->hid + nk * hs;
    a.y_stride[0] = hs;
    a.act = xa;
    a.epi = GEMM_EPI_SWIGLU;
    LAUNCH(launch_gemm(a, n, s));

    /* hid -> fp16 (overwrites x, no longer needed) */
    memset(&in, 0, sizeof in);
    in.mode = GEMV_IN_PLAIN;
    in.act = c->hid;
    in.act_stride = hs;
    const gemm_act ha = act_at(c, 0, inter);
    if (h16)
        LAUNCH(launch_gemm_regroup(h16a, ha, (int)nk, s));
    else
        LAUNCH(launch_gemm_prep(in, inter, (int)nk, ha, s));
    in.act = c->hid + nk * hs;
    gemm_act hsa;
    hsa.x = c->pf_x + nk * inter;
    hsa.xs = c->pf_xs + nk * (inter / 64);
    hsa.scale = c->pf_xscale + nk;
    hsa.cols = sinter;
    LAUNCH(launch_gemm_prep(in, sinter, n, hsa, s));

    /* routed down: y rows = positions */
    memset(&a, 0, sizeof a);
    a.m[0] = L->ex_down;
    a.n_mats = 1;
    a.row_start[1] = L->ex_down.rows;
    const bool y_bf16 = g_cuda_tuning.moe_y_bf16 == 1 && H % 8 == 0; /* bf16 rows in the first half of pf_y */
    a.y[0] = c->pf_y;
    a.y_stride[0] = H;
    a.act = ha;
    a.act_rows = (int)nk; /* gemm_variant 10: X tiles by TMA */
    a.epi = y_bf16 ? GEMM_EPI_STORE_BF16 : GEMM_EPI_STORE;
    grouped_by_expert(c, n, K, E, T, &a);
    LAUNCH(launch_gemm(a, n, s));

    /* shared down: rows nk + t of pf_y; moe_shared_add: h += sigmoid(gate logit) · (shared down), the
     * combine adds the routed slots only */
    const bool sh_add = g_cuda_tuning.moe_shared_add == 1;
    memset(&a, 0, sizeof a);
    a.m[0] = L->sh_down;
    a.n_mats = 1;
    a.row_start[1] = L->sh_down.rows;
    a.y[0] = sh_add ? c->h : c->pf_y + nk * H;
    a.y_stride[0] = H;
    a.act = hsa;
    a.epi = sh_add ? GEMM_EPI_ADD : GEMM_EPI_STORE;
    a.gate_logits = sh_add ? c->router + E : NULL;
    a.gate_stride = E + 1;
    LAUNCH(launch_gemm(a, n, s));
    const float *ysh = sh_add ? NULL : c->pf_y + nk * H;

    if (y_bf16)
        LAUNCH(launch_moe_combine_bf16(c->h, H, n, K, c->topk_w, c->pf_slot_pos,
                                       reinterpret_cast<const __nv_bfloat16 *>(c->pf_y), ysh, c->router,
                                       E + 1, E, s));
    else
        LAUNCH(launch_moe_combine(c->h, H, n, K, c->topk_w, c->pf_slot_pos, c->pf_y, ysh, c->router, E + 1, E, s));
    return LILY_OK;
}
