/* forward_prefill.cu — the prefill stages of the layer loop (chunks of at least prefill_min_tokens
 * tokens) on tensor cores: a projection is gemm_prep (input transform -> fp16) + one GEMM over the
 * batch of matrices; the sparse MoE block is, with no host sync:
 *   prep(post-attention RMSNorm) -> GEMM(router | shared_expert_gate) -> top-k -> plan (histogram,
 *   offsets, scatter, tile map) -> grouped GEMM(gate, up; silu·up) -> GEMM(shared gate, up; silu·up)
 *   -> prep(hid) -> grouped GEMM(down) -> GEMM(shared down) -> combine (+= residual).
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

/* A grouped GEMM walks the tile map launch_moe_plan built: T-token tiles of expert-ordered rows. */
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
    a.kernel = c->kernels.gemm;
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
    dmat ex_gate, ex_up, ex_down; /* the layer's, or their staged copy (host_weights.cu) */
    if ((st = cuda_layer_experts(c, L, &ex_gate, &ex_up, &ex_down, err)) != LILY_OK)
        return st;

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

    /* router | shared_expert_gate in one GEMM */
    gemm_args a;
    memset(&a, 0, sizeof a);
    a.kernel = c->kernels.gemm;
    a.m[0] = L->router;
    a.m[1] = L->shared_expert_gate;
    a.y[0] = c->router;
    a.y[1] = c->router + E;
    a.y_stride[0] = a.y_stride[1] = E + 1;
    a.row_start[1] = L->router.rows;
    a.row_start[2] = L->router.rows + L->shared_expert_gate.rows;
    a.n_mats = 2;
    a.act = xa;
    a.epi = GEMM_EPI_STORE;
    LAUNCH(launch_gemm(a, n, s));

    LAUNCH(launch_moe_topk(c->router, E + 1, E, K, n, c->topk_idx, c->topk_w, s));
    const int T = gemm_grouped_tile(c->kernels.gemm, (double)nk / E);
    LAUNCH(launch_moe_plan(c->topk_idx, n, K, E, T, c->pf_offsets, c->pf_gather, c->pf_slot_pos, c->pf_tile_expert,
                           c->pf_tile_start, c->pf_n_tiles, c->pf_plan_counts,
                           s));

    /* routed gate/up: hid rows = expert-ordered positions [0, nk) */
    memset(&a, 0, sizeof a);
    a.kernel = c->kernels.gemm;
    a.m[0] = ex_gate;
    a.m[1] = ex_up;
    a.n_mats = 2;
    a.y[0] = c->hid;
    a.y_stride[0] = hs;
    a.act = xa;
    a.epi = GEMM_EPI_SWIGLU;
    grouped_by_expert(c, n, K, E, T, &a);
    a.gather = c->pf_gather;
    LAUNCH(launch_gemm(a, n, s));

    /* shared expert gate/up: hid rows nk + t */
    memset(&a, 0, sizeof a);
    a.kernel = c->kernels.gemm;
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
    a.kernel = c->kernels.gemm;
    a.m[0] = ex_down;
    a.n_mats = 1;
    a.row_start[1] = ex_down.rows;
    a.y[0] = c->pf_y;
    a.y_stride[0] = H;
    a.act = ha;
    a.act_rows = (int)nk; /* lets the wgmma kernel load X tiles by TMA */
    a.epi = GEMM_EPI_STORE;
    grouped_by_expert(c, n, K, E, T, &a);
    LAUNCH(launch_gemm(a, n, s));

    /* shared down: rows nk + t of pf_y */
    memset(&a, 0, sizeof a);
    a.kernel = c->kernels.gemm;
    a.m[0] = L->sh_down;
    a.n_mats = 1;
    a.row_start[1] = L->sh_down.rows;
    a.y[0] = c->pf_y + nk * H;
    a.y_stride[0] = H;
    a.act = hsa;
    a.epi = GEMM_EPI_STORE;
    LAUNCH(launch_gemm(a, n, s));

    LAUNCH(launch_moe_combine(c->h, H, n, K, c->topk_w, c->pf_slot_pos, c->pf_y, c->pf_y + nk * H, c->router, E + 1,
                              E, s));
    return LILY_OK;
}
