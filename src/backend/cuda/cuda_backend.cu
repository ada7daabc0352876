/* cuda_backend.cu — the CUDA backend's ops table (backend.h): device selection, weight upload (once,
 * kept 4/8-bit as stored; plain weights as bf16; norm/gate vectors as fp32), scratch sized by
 * max_chunk, and session state (bf16 KV cache, fp32 in exact mode; fp32 conv + recurrent state) preallocated
 * for max_ctx.
 * Every CUDA call is checked (CUDA_TRY) and reported as LILY_ERR_BACKEND / LILY_ERR_OUT_OF_MEMORY.
 * The layer loop, graphs and fast paths live in cuda_forward.cu.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "cuda_internal.cuh"

extern "C" {
#include "base/base.h"
#include "base/dtype.h"
}

lily_status lily_cuda_error(lily_error *err, cudaError_t e, const char *call, const char *file, int line)
{
    const bool oom = e == cudaErrorMemoryAllocation;
    if (oom) {
        size_t fr = 0, tot = 0;
        cudaGetLastError();
        cudaMemGetInfo(&fr, &tot);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY,
                              "cuda: out of GPU memory in %s (%s:%d): %.2f GiB free of %.2f GiB; use a smaller "
                              "--ctx-size or a smaller model",
                              call, file, line, fr / 1073741824.0, tot / 1073741824.0);
    }
    return lily_error_set(err, LILY_ERR_BACKEND, "cuda: %s failed at %s:%d: %s (%s)", call, file, line,
                          cudaGetErrorName(e), cudaGetErrorString(e));
}

/* ---- allocation ------------------------------------------------------------------------------------ */

/* Room for one more pointer in a list that doubles. */
static lily_status list_reserve(void ***list, int n, int *cap, lily_error *err)
{
    if (n < *cap)
        return LILY_OK;
    const int nc = *cap ? 2 * *cap : 256;
    void **na = (void **)realloc(*list, nc * sizeof *na);
    if (!na)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cuda: host allocation failed");
    *list = na;
    *cap = nc;
    return LILY_OK;
}

/* A weight allocation: device memory, or mapped host memory while c->alloc_on_host (*p is then the
 * device's address of it). Either way the bytes are written with cudaMemcpy(..., cudaMemcpyDefault). */
static lily_status ctx_alloc(cuda_ctx *c, void **p, size_t bytes, lily_error *err)
{
    *p = NULL;
    lily_status st = list_reserve(&c->allocs, c->n_allocs, &c->cap_allocs, err);
    if (st == LILY_OK && c->alloc_on_host)
        st = list_reserve(&c->host_allocs, c->n_host_allocs, &c->cap_host_allocs, err);
    if (st != LILY_OK)
        return st;
    if (c->alloc_on_host) {
        void *host;
        if ((st = cuda_host_weight_alloc(bytes, !c->host_experts_cpu, &host, p, err)) != LILY_OK)
            return st;
        c->host_allocs[c->n_host_allocs++] = host;
        c->host_weight_bytes += bytes;
        return LILY_OK;
    }
    CUDA_TRY(cudaMalloc(p, bytes ? bytes : 16));
    c->allocs[c->n_allocs++] = *p;
    c->weight_bytes += bytes;
    return LILY_OK;
}

/* Upload a matrix (or expert stack): quantized kept as-is (compacted so expert e's rows follow e-1's),
 * plain converted to bf16. */
static lily_status upload_mat(cuda_ctx *c, const lily_tensor *t, dmat *out, lily_error *err)
{
    memset(out, 0, sizeof *out);
    if (!t->data)
        return lily_error_set(err, LILY_ERR_MODEL, "cuda: tensor %s missing", t->name ? t->name : "(unnamed)");
    const int64_t rows = lily_tensor_rows(t), cols = lily_tensor_cols(t);
    const int64_t E = t->ndim == 3 ? t->shape[0] : 1;
    const int64_t estride = t->ndim == 3 ? t->expert_stride : rows;
    out->rows = (int)rows;
    out->cols = (int)cols;
    out->n_experts = (int)E;
    lily_status st;
    if (t->bits == 4 || t->bits == 8) {
        if (t->group_size != 64 || cols % 64)
            return lily_error_set(err, LILY_ERR_UNSUPPORTED, "cuda: %s: group size %d / cols %lld unsupported",
                                  t->name, t->group_size, (long long)cols);
        out->bits = t->bits;
        out->row_bytes = cols * t->bits / 8;
        const int64_t gpr = cols / 64;
        const size_t nrow = (size_t)(E * rows);
        uint8_t *hw = (uint8_t *)malloc(nrow * out->row_bytes);
        uint16_t *hs = (uint16_t *)malloc(nrow * gpr * 2), *hb = (uint16_t *)malloc(nrow * gpr * 2);
        if (!hw || !hs || !hb) {
            free(hw), free(hs), free(hb);
            return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cuda: host staging for %s", t->name);
        }
        for (int64_t e = 0; e < E; e++)
            for (int64_t r = 0; r < rows; r++) {
                const int64_t pr = e * estride + r, dr = e * rows + r;
                memcpy(hw + dr * out->row_bytes, (const uint8_t *)t->data + pr * t->row_bytes, out->row_bytes);
                for (int64_t g = 0; g < gpr; g++) {
                    const uint8_t *sp = (const uint8_t *)t->scales + pr * t->scale_row_bytes;
                    const uint8_t *bp = (const uint8_t *)t->biases + pr * t->scale_row_bytes;
                    if (t->scale_dtype == LILY_DTYPE_BF16) {
                        memcpy(hs + dr * gpr + g, sp + 2 * g, 2);
                        memcpy(hb + dr * gpr + g, bp + 2 * g, 2);
                    } else {
                        hs[dr * gpr + g] = lily_f32_to_bf16(lily_load_f32(sp, t->scale_dtype, g));
                        hb[dr * gpr + g] = lily_f32_to_bf16(lily_load_f32(bp, t->scale_dtype, g));
                    }
                }
            }
        void *dw, *ds, *db;
        st = ctx_alloc(c, &dw, nrow * out->row_bytes, err);
        if (st == LILY_OK) st = ctx_alloc(c, &ds, nrow * gpr * 2, err);
        if (st == LILY_OK) st = ctx_alloc(c, &db, nrow * gpr * 2, err);
        cudaError_t ce = cudaSuccess;
        if (st == LILY_OK) ce = cudaMemcpy(dw, hw, nrow * out->row_bytes, cudaMemcpyDefault);
        if (st == LILY_OK && ce == cudaSuccess) ce = cudaMemcpy(ds, hs, nrow * gpr * 2, cudaMemcpyDefault);
        if (st == LILY_OK && ce == cudaSuccess) ce = cudaMemcpy(db, hb, nrow * gpr * 2, cudaMemcpyDefault);
        free(hw), free(hs), free(hb);
        if (st != LILY_OK)
            return st;
        CUDA_TRY(ce);
        out->data = (const uint8_t *)dw;
        out->scales = (const __nv_bfloat16 *)ds;
        out->biases = (const __nv_bfloat16 *)db;
        return LILY_OK;
    }
    if (t->bits != 0)
        return lily_error_set(err, LILY_ERR_UNSUPPORTED, "cuda: %s: %d-bit weights unsupported", t->name, t->bits);
    if (cols % 8)
        return lily_error_set(err, LILY_ERR_UNSUPPORTED, "cuda: %s: cols %lld not a multiple of 8", t->name,
                              (long long)cols);
    out->bits = 16;
    out->row_bytes = cols * 2;
    const size_t nrow = (size_t)(E * rows);
    uint16_t *hw = (uint16_t *)malloc(nrow * cols * 2);
    if (!hw)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cuda: host staging for %s", t->name);
    const int esz = lily_dtype_size(t->dtype);
    for (int64_t e = 0; e < E; e++)
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *src = (const uint8_t *)t->data + (e * estride + r) * t->row_bytes;
            uint16_t *dst = hw + (e * rows + r) * cols;
            if (t->dtype == LILY_DTYPE_BF16)
                memcpy(dst, src, cols * 2);
            else
                for (int64_t k = 0; k < cols; k++)
                    dst[k] = lily_f32_to_bf16(lily_load_f32(src, t->dtype, k));
            (void)esz;
        }
    void *dw;
    st = ctx_alloc(c, &dw, nrow * cols * 2, err);
    cudaError_t ce = st == LILY_OK ? cudaMemcpy(dw, hw, nrow * cols * 2, cudaMemcpyDefault) : cudaSuccess;
    free(hw);
    if (st != LILY_OK)
        return st;
    CUDA_TRY(ce);
    out->data = (const uint8_t *)dw;
    return LILY_OK;
}

/* Upload a vector (or [C, K] conv weight) as fp32, optionally as (1 + w). */
static lily_status upload_vec(cuda_ctx *c, const lily_tensor *t, int64_t n, bool plus_one, float **out,
                              lily_error *err)
{
    if (!t->data || t->bits)
        return lily_error_set(err, LILY_ERR_MODEL, "cuda: vector %s missing or quantized", t->name ? t->name : "?");
    float *h = (float *)malloc(n * sizeof(float));
    if (!h)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cuda: host staging");
    for (int64_t i = 0; i < n; i++)
        h[i] = lily_load_f32(t->data, t->dtype, i) + (plus_one ? 1.0f : 0.0f);
    void *d;
    lily_status st = ctx_alloc(c, &d, n * sizeof(float), err);
    cudaError_t ce = st == LILY_OK ? cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice) : cudaSuccess;
    free(h);
    if (st != LILY_OK)
        return st;
    CUDA_TRY(ce);
    *out = (float *)d;
    return LILY_OK;
}

/* ---- create / destroy ---------------------------------------------------------------------------- */

static void cuda_destroy(void *vctx)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    if (!c)
        return;
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream);
    cuda_cpu_experts_free(c); /* its worker reads the host experts */
    for (int i = 0; i < c->n_allocs; i++)
        cudaFree(c->allocs[i]);
    free(c->allocs);
    cuda_experts_stage_free(c);
    for (int i = 0; i < c->n_host_allocs; i++)
        cudaFreeHost(c->host_allocs[i]);
    free(c->host_allocs);
    cuda_sampling_free(&c->sampling);
    free(c->layers);
    if (c->h_host)
        cudaFreeHost(c->h_host);
    free(c->h_prev);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c);
}

static size_t tensor_device_bytes(const lily_tensor *t)
{
    if (!t->data)
        return 0;
    const size_t rows = (size_t)lily_tensor_rows(t) * (t->ndim == 3 ? (size_t)t->shape[0] : 1);
    const size_t cols = (size_t)lily_tensor_cols(t);
    if (t->bits)
        return rows * (cols * t->bits / 8 + 2 * 2 * (cols / 64));
    return rows * cols * 2;
}

/* Device bytes of layer l's routed experts (gate, up, down with scales and biases). */
static size_t expert_layer_bytes(const lily_weights *w, int l)
{
    const lily_layer_weights *L = &w->layers[l];
    return tensor_device_bytes(&L->experts_gate) + tensor_device_bytes(&L->experts_up) +
           tensor_device_bytes(&L->experts_down);
}

/* Predicted device bytes of the weights with the routed experts of layers [0, n_cpu_moe) in host memory
 * (for a clear error before uploading anything, and the memory plan). */
static size_t weights_device_bytes(const lily_weights *w, int n_cpu_moe)
{
    size_t total = tensor_device_bytes(&w->embed) + tensor_device_bytes(&w->lm_head);
    for (int l = 0; l < w->n_layers; l++) {
        const lily_layer_weights *L = &w->layers[l];
        const lily_tensor *ts[] = {&L->q_proj, &L->k_proj, &L->v_proj, &L->o_proj, &L->in_proj_qkv, &L->in_proj_z,
                                   &L->in_proj_b, &L->in_proj_a, &L->out_proj, &L->router, &L->shared_gate,
                                   &L->shared_up, &L->shared_down, &L->shared_expert_gate};
        for (size_t k = 0; k < sizeof ts / sizeof *ts; k++)
            total += tensor_device_bytes(ts[k]);
        if (l >= n_cpu_moe)
            total += expert_layer_bytes(w, l);
    }
    return total;
}

static lily_status upload_layer(cuda_ctx *c, const lily_weights *w, int l, lily_error *err)
{
    const lily_config *cfg = &c->cfg;
    const lily_layer_weights *L = &w->layers[l];
    cuda_layer *d = &c->layers[l];
    const bool zc = w->norms_zero_centred;
    const int H = cfg->hidden;
    lily_status st;
#define UP(call)                                                                                   \
    do {                                                                                           \
        st = (call);                                                                               \
        if (st != LILY_OK) {                                                                       \
            lily_error_prefix(err, "layer %d", l);                                                 \
            return st;                                                                             \
        }                                                                                          \
    } while (0)
    d->full_attention = cfg->layer_types[l] == LILY_LAYER_FULL_ATTENTION;
    UP(upload_vec(c, &L->input_norm, H, zc, &d->input_norm, err));
    UP(upload_vec(c, &L->post_attention_norm, H, zc, &d->post_norm, err));
    if (d->full_attention) {
        UP(upload_mat(c, &L->q_proj, &d->q_proj, err));
        UP(upload_mat(c, &L->k_proj, &d->k_proj, err));
        UP(upload_mat(c, &L->v_proj, &d->v_proj, err));
        UP(upload_mat(c, &L->o_proj, &d->o_proj, err));
        UP(upload_vec(c, &L->q_norm, cfg->head_dim, zc, &d->q_norm, err));
        UP(upload_vec(c, &L->k_norm, cfg->head_dim, zc, &d->k_norm, err));
    } else {
        UP(upload_mat(c, &L->in_proj_qkv, &d->in_qkv, err));
        UP(upload_mat(c, &L->in_proj_z, &d->in_z, err));
        UP(upload_mat(c, &L->in_proj_b, &d->in_b, err));
        UP(upload_mat(c, &L->in_proj_a, &d->in_a, err));
        UP(upload_mat(c, &L->out_proj, &d->out_proj, err));
        UP(upload_vec(c, &L->conv1d, (int64_t)lily_config_gdn_conv_dim(cfg) * cfg->gdn_conv_kernel, false, &d->conv_w,
                      err));
        UP(upload_vec(c, &L->dt_bias, cfg->gdn_n_value_heads, false, &d->dt_bias, err));
        UP(upload_vec(c, &L->A_log, cfg->gdn_n_value_heads, false, &d->A_log, err));
        UP(upload_vec(c, &L->gdn_norm, cfg->gdn_value_head_dim, false, &d->gdn_norm, err));
    }
    UP(upload_mat(c, &L->router, &d->router, err));
    UP(upload_mat(c, &L->shared_expert_gate, &d->shared_expert_gate, err));
    c->alloc_on_host = cuda_layer_experts_on_host(c, l);
    st = upload_mat(c, &L->experts_gate, &d->ex_gate, err);
    if (st == LILY_OK)
        st = upload_mat(c, &L->experts_up, &d->ex_up, err);
    if (st == LILY_OK)
        st = upload_mat(c, &L->experts_down, &d->ex_down, err);
    c->alloc_on_host = false;
    UP(st);
    UP(upload_mat(c, &L->shared_gate, &d->sh_gate, err));
    UP(upload_mat(c, &L->shared_up, &d->sh_up, err));
    UP(upload_mat(c, &L->shared_down, &d->sh_down, err));
#undef UP
    return LILY_OK;
}

/* The scratch for c->max_chunk tokens: allocated when `count` is NULL, else only its bytes added up into
 * *count (the memory plan's estimate; one function so the two cannot drift apart). */
static lily_status scratch_layout(cuda_ctx *c, size_t *count, lily_error *err)
{
    const lily_config *cfg = &c->cfg;
    const size_t C = c->max_chunk, H = cfg->hidden;
    const size_t attn_proj = (size_t)cfg->n_heads * cfg->head_dim * 2 + 2 * (size_t)cfg->n_kv_heads * cfg->head_dim;
    const size_t gdn_proj = (size_t)lily_config_gdn_conv_dim(cfg) + lily_config_gdn_value_dim(cfg) +
                            2 * (size_t)cfg->gdn_n_value_heads;
    c->proj_stride = (int)((LILY_MAX(attn_proj, gdn_proj) + 3) / 4 * 4);
    const size_t mixw = LILY_MAX((size_t)lily_config_gdn_value_dim(cfg), (size_t)cfg->n_heads * cfg->head_dim);
    const size_t inter = LILY_MAX(cfg->moe_intermediate, cfg->shared_intermediate);
    const size_t G = cfg->n_heads / cfg->n_kv_heads;
    c->att_splits = ATT_SPLITS_DEFAULT;
    c->att_min_chunk = ATT_MIN_CHUNK_DEFAULT;
    lily_status st;
#define AL(ptr, bytes)                                                                             \
    do {                                                                                           \
        void *p_ = NULL;                                                                           \
        if (count)                                                                                 \
            *count += ((size_t)(bytes) + 511) / 512 * 512;                                         \
        else if ((st = ctx_alloc(c, &p_, (bytes), err)) != LILY_OK)                                \
            return st;                                                                             \
        *(void **)&(ptr) = p_;                                                                     \
    } while (0)
    AL(c->d_tokens, C * sizeof(int));
    AL(c->h, C * H * 4);
    AL(c->proj, C * c->proj_stride * 4);
    AL(c->mix, C * mixw * 4);
    if (cfg->gdn_n_value_heads > 0) {
        AL(c->gdn_pre, C * (size_t)gdn_prefill_stride(lily_config_gdn_conv_dim(cfg), cfg->gdn_n_value_heads) * 4);
        gdn_args ga;
        memset(&ga, 0, sizeof ga);
        ga.Hk = cfg->gdn_n_key_heads, ga.Hv = cfg->gdn_n_value_heads, ga.dk = cfg->gdn_key_head_dim;
        ga.dv = cfg->gdn_value_head_dim, ga.K = cfg->gdn_conv_kernel, ga.conv_dim = lily_config_gdn_conv_dim(cfg);
        if (gdn_chunked_supported(ga)) /* chunked delta rule (gdn_prefill 2-6): 303 MB at C = 4096, full model */
            AL(c->gdn_wy, gdn_chunked_scratch_floats((int)C, ga.Hv, ga.dk, ga.dv) * 4);
    }
    AL(c->q, C * cfg->n_heads * cfg->head_dim * 4);
    AL(c->router, C * (cfg->n_experts + 1) * 4);
    AL(c->hid, C * (cfg->n_experts_used + 1) * inter * 4);
    AL(c->topk_idx, C * cfg->n_experts_used * 4);
    AL(c->topk_w, C * cfg->n_experts_used * 4);
    AL(c->logits, (size_t)c->logits_rows * cfg->vocab_size * 4);
    AL(c->argmax, C * 8);
    AL(c->part_o, (size_t)cfg->n_kv_heads * c->att_splits * G * cfg->head_dim * 4);
    AL(c->part_ml, (size_t)cfg->n_kv_heads * c->att_splits * G * 2 * 4);
    AL(c->att_counter, (size_t)cfg->n_kv_heads * 4);
    AL(c->mark_step, 4);
    /* prefill GEMM: activations of the widest projection input, or of the MoE hidden rows */
    {
        const size_t K = cfg->n_experts_used, E = cfg->n_experts;
        size_t xcols = LILY_MAX((size_t)H, mixw);
        const size_t ex = LILY_MAX(C * xcols, C * K * cfg->moe_intermediate + C * cfg->shared_intermediate);
        c->prefill_min_tokens = PREFILL_GEMM_MIN_TOKENS;
        c->pf_x_elems = ex;
        c->pf_x_rows = C * (K + 1);
        AL(c->pf_x, ex * 2);
        AL(c->pf_xs, (ex / 64 + 1) * 4);
        AL(c->pf_xscale, c->pf_x_rows * 4);
        AL(c->pf_y, C * (K + 1) * H * 4);
        AL(c->pf_gather, C * K * 4);
        AL(c->pf_slot_pos, C * K * 4);
        AL(c->pf_offsets, (E + 1) * 4);
        AL(c->pf_plan_counts, (C + 63) / 64 * E * 4);
        AL(c->pf_tile_expert, (C * K + E + 1) * 4);
        AL(c->pf_tile_start, (C * K + E + 1) * 4);
        AL(c->pf_n_tiles, 4);
    }
#undef AL
    if (count)
        return LILY_OK;
    CUDA_TRY(cudaMemset(c->att_counter, 0, (size_t)cfg->n_kv_heads * 4));
    CUDA_TRY(cudaMemset(c->argmax, 0, C * 8));
    return LILY_OK;
}

/* Rows of logits kept on the device: LILY_LOGITS_ALL of a longer call runs the LM head in blocks of this
 * many rows (cuda_forward), so the scratch does not grow with chunk x vocabulary. The debug hook sees
 * every row at once (one LILY_STAGE_LOGITS call), so with a hook the whole chunk is kept. */
static int logits_rows(const lily_backend_options *opts, int max_chunk)
{
    return opts->debug_hook || max_chunk < LOGITS_BLOCK_ROWS ? max_chunk : LOGITS_BLOCK_ROWS;
}

static lily_status cuda_create(const lily_config *cfg, const lily_weights *w, const lily_backend_options *opts,
                               void **out, lily_error *err)
{
    *out = NULL;
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0) {
        cudaGetLastError();
        /* no GPU, or no (or a too old) driver: CUDA's own text for the latter says "driver version is
         * insufficient" even when there is no driver at all */
        if (e == cudaSuccess || e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
            return lily_error_set(err, LILY_ERR_BACKEND, "cuda: no usable NVIDIA GPU/driver found (no GPU visible, "
                                  "or the NVIDIA driver is missing or older than this build's CUDA)");
        return lily_error_set(err, LILY_ERR_BACKEND, "cuda: no usable NVIDIA GPU/driver found (%s)",
                              cudaGetErrorString(e));
    }
    if (opts->device < 0 || opts->device >= n_dev)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: device %d out of range (%d devices)",
                              opts->device, n_dev);
    lily_status shapes = cuda_check_shapes(cfg, w, err); /* cuda_shapes.cu: a clear error before any upload */
    if (shapes != LILY_OK)
        return shapes;
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    if (!c)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cuda: context");
    c->cfg = *cfg;
    c->opts = *opts;
    c->kv_elem = opts->exact ? sizeof(float) : sizeof(__nv_bfloat16);
    c->device = opts->device;
    c->max_chunk = opts->max_chunk > 0 ? opts->max_chunk : 512;
    c->logits_rows = logits_rows(opts, c->max_chunk);
    c->host_experts_cpu = cuda_host_experts_cpu_slots(opts, cfg) > 0;
    lily_status st = LILY_OK;
#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            st = lily_cuda_error(err, e_, #call, __FILE__, __LINE__);                              \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)
    CK(cudaSetDevice(c->device));
    /* the kernel family of each device-dependent op, once (the choices read device flags: outside capture) */
    c->kernels.gemm = gemm_kernel_choose();
    c->kernels.attn_prefill = attn_prefill_kernel_choose();
    CK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    {
        size_t fr = 0, tot = 0;
        CK(cudaMemGetInfo(&fr, &tot));
        const size_t need = weights_device_bytes(w, opts->n_cpu_moe);
        if (need + ((size_t)256 << 20) > fr) {
            st = lily_error_set(err, LILY_ERR_OUT_OF_MEMORY,
                                "cuda: the model needs %.2f GiB of GPU memory for its weights but only %.2f GiB "
                                "of %.2f GiB are free",
                                need / 1073741824.0, fr / 1073741824.0, tot / 1073741824.0);
            goto fail;
        }
    }
    c->layers = (cuda_layer *)calloc(cfg->n_layers, sizeof *c->layers);
    if (!c->layers) {
        st = lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cuda: layers");
        goto fail;
    }
    if ((st = upload_mat(c, &w->embed, &c->embed, err)) != LILY_OK)
        goto fail;
    if ((st = upload_mat(c, &w->lm_head, &c->lm_head, err)) != LILY_OK)
        goto fail;
    if ((st = upload_vec(c, &w->final_norm, cfg->hidden, w->norms_zero_centred, &c->final_norm, err)) != LILY_OK)
        goto fail;
    for (int l = 0; l < cfg->n_layers; l++)
        if ((st = upload_layer(c, w, l, err)) != LILY_OK)
            goto fail;
    if ((st = scratch_layout(c, NULL, err)) != LILY_OK)
        goto fail;
    if ((st = cuda_experts_stage_init(c, err)) != LILY_OK)
        goto fail;
    if ((st = cuda_cpu_experts_init(c, err)) != LILY_OK)
        goto fail;
    c->poison_step = -1;
    CK(cuda_sampling_new(cfg->vocab_size, &c->sampling));
    if (opts->debug_hook) { /* host staging for the debug hook only */
        const size_t hb = (size_t)c->max_chunk * LILY_MAX(cfg->hidden, cfg->vocab_size) * sizeof(float);
        CK(cudaMallocHost((void **)&c->h_host, hb));
        c->h_prev = (float *)malloc((size_t)c->max_chunk * cfg->hidden * sizeof(float));
        if (!c->h_prev) {
            st = lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cuda: host staging");
            goto fail;
        }
    }
    *out = c;
    return LILY_OK;
fail:
#undef CK
    cuda_destroy(c);
    return st;
}

/* ---- session state -------------------------------------------------------------------------------- */

static void cuda_state_free(void *vctx, void *vst)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    cuda_state *s = (cuda_state *)vst;
    if (!s)
        return;
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream);
    if (s->graph_greedy)
        cudaGraphExecDestroy(s->graph_greedy);
    if (s->graph_logits)
        cudaGraphExecDestroy(s->graph_logits);
    for (int l = 0; l < c->cfg.n_layers; l++) {
        if (s->k_cache) cudaFree(s->k_cache[l]);
        if (s->v_cache) cudaFree(s->v_cache[l]);
        if (s->conv_state) cudaFree(s->conv_state[l]);
        if (s->rec_state) cudaFree(s->rec_state[l]);
    }
    free(s->k_cache), free(s->v_cache), free(s->conv_state), free(s->rec_state);
    free(s->args);
    cudaFree(s->ctr);
    cudaFree(s->out_tokens);
    if (s->host_tokens)
        cudaFreeHost(s->host_tokens);
    free(s);
}

/* Bytes of one KV head's row of one position (head_dim elements: bf16, fp32 in exact mode). */
static size_t kv_head_row_bytes(const cuda_ctx *c)
{
    return (size_t)c->cfg.head_dim * c->kv_elem;
}
/* Bytes of one attention layer's K (or V) cache: [n_kv_heads][max_ctx][head_dim]. */
static size_t kv_bytes(const cuda_ctx *c, int max_ctx)
{
    return (size_t)c->cfg.n_kv_heads * max_ctx * kv_head_row_bytes(c);
}
static size_t conv_bytes(const lily_config *cfg)
{
    return 2 * (size_t)(cfg->gdn_conv_kernel - 1) * lily_config_gdn_conv_dim(cfg) * sizeof(float);
}
static size_t rec_bytes(const lily_config *cfg)
{
    return (size_t)cfg->gdn_n_value_heads * cfg->gdn_key_head_dim * cfg->gdn_value_head_dim * sizeof(float);
}

static void cuda_state_reset(void *vctx, void *vst)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    cuda_state *s = (cuda_state *)vst;
    cudaSetDevice(c->device);
    for (int l = 0; l < c->cfg.n_layers; l++) {
        if (s->conv_state[l]) cudaMemsetAsync(s->conv_state[l], 0, conv_bytes(&c->cfg), c->stream);
        if (s->rec_state[l]) cudaMemsetAsync(s->rec_state[l], 0, rec_bytes(&c->cfg), c->stream);
    }
    cudaMemsetAsync(s->ctr, 0, sizeof(cuda_counters), c->stream);
    s->pos = 0;
    s->step = 0;
}

static lily_status cuda_state_new(void *vctx, int max_ctx, void **out, lily_error *err)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    const lily_config *cfg = &c->cfg;
    *out = NULL;
    if (max_ctx <= 0)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: max_ctx %d", max_ctx);
    CUDA_TRY(cudaSetDevice(c->device));
    {
        size_t fr = 0, tot = 0;
        CUDA_TRY(cudaMemGetInfo(&fr, &tot));
        size_t n_attn = 0;
        for (int l = 0; l < cfg->n_layers; l++)
            n_attn += cfg->layer_types[l] == LILY_LAYER_FULL_ATTENTION;
        const size_t need = n_attn * 2 * kv_bytes(c, max_ctx) +
                            ((size_t)cfg->n_layers - n_attn) * (conv_bytes(cfg) + rec_bytes(cfg)) +
                            (size_t)max_ctx * sizeof(int);
        if (need + ((size_t)64 << 20) > fr)
            return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY,
                                  "cuda: a session of %d tokens needs %.2f GiB of GPU memory (KV cache + states) "
                                  "but only %.2f GiB are free; use a smaller --ctx-size",
                                  max_ctx, need / 1073741824.0, fr / 1073741824.0);
    }
    cuda_state *s = (cuda_state *)calloc(1, sizeof *s);
    if (!s)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cuda: state");
    s->max_ctx = max_ctx;
    const int L = cfg->n_layers;
    s->k_cache = (uint8_t **)calloc(L, sizeof(void *));
    s->v_cache = (uint8_t **)calloc(L, sizeof(void *));
    s->conv_state = (float **)calloc(L, sizeof(void *));
    s->rec_state = (float **)calloc(L, sizeof(void *));
    lily_status st = LILY_OK;
    cudaError_t e = cudaSuccess;
    if (!s->k_cache || !s->v_cache || !s->conv_state || !s->rec_state) {
        st = lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cuda: state");
        goto fail;
    }
#define CK(call)                                                                                   \
    do {                                                                                           \
        if ((e = (call)) != cudaSuccess) {                                                         \
            st = lily_cuda_error(err, e, #call, __FILE__, __LINE__);                               \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)
    for (int l = 0; l < L; l++) {
        if (cfg->layer_types[l] == LILY_LAYER_FULL_ATTENTION) {
            CK(cudaMalloc((void **)&s->k_cache[l], kv_bytes(c, max_ctx)));
            CK(cudaMalloc((void **)&s->v_cache[l], kv_bytes(c, max_ctx)));
        } else {
            CK(cudaMalloc((void **)&s->conv_state[l], conv_bytes(cfg)));
            CK(cudaMalloc((void **)&s->rec_state[l], rec_bytes(cfg)));
        }
    }
    CK(cudaMalloc((void **)&s->ctr, sizeof(cuda_counters)));
    s->out_cap = max_ctx;
    CK(cudaMalloc((void **)&s->out_tokens, (size_t)s->out_cap * sizeof(int)));
    CK(cudaHostAlloc((void **)&s->host_tokens, ((size_t)s->out_cap + 1) * sizeof(int), cudaHostAllocMapped));
    CK(cudaHostGetDevicePointer((void **)&s->host_tokens_dev, s->host_tokens, 0));
#undef CK
    if ((st = cuda_state_args_build(c, s, err)) != LILY_OK)
        goto fail;
    cuda_state_reset(c, s);
    if ((e = cudaGetLastError()) != cudaSuccess) {
        st = lily_cuda_error(err, e, "state reset", __FILE__, __LINE__);
        goto fail;
    }
    *out = s;
    return LILY_OK;
fail:
    cuda_state_free(c, s);
    return st;
}

static int cuda_state_position(void *vctx, void *vst)
{
    (void)vctx;
    return ((cuda_state *)vst)->pos;
}

static lily_status cuda_state_copy(void *vctx, void *vdst, const void *vsrc, lily_error *err)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    cuda_state *d = (cuda_state *)vdst;
    const cuda_state *s = (const cuda_state *)vsrc;
    if (d->max_ctx != s->max_ctx)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: state_copy between different max_ctx");
    CUDA_TRY(cudaSetDevice(c->device));
    const lily_config *cfg = &c->cfg;
    const size_t row = kv_head_row_bytes(c);
    for (int l = 0; l < cfg->n_layers; l++) {
        if (s->k_cache[l]) {
            for (int h = 0; h < cfg->n_kv_heads; h++) {
                const size_t off = (size_t)h * s->max_ctx * row;
                if (s->pos) {
                    CUDA_TRY(cudaMemcpyAsync(d->k_cache[l] + off, s->k_cache[l] + off, s->pos * row,
                                             cudaMemcpyDeviceToDevice, c->stream));
                    CUDA_TRY(cudaMemcpyAsync(d->v_cache[l] + off, s->v_cache[l] + off, s->pos * row,
                                             cudaMemcpyDeviceToDevice, c->stream));
                }
            }
        } else {
            CUDA_TRY(cudaMemcpyAsync(d->conv_state[l], s->conv_state[l], conv_bytes(cfg), cudaMemcpyDeviceToDevice,
                                     c->stream));
            CUDA_TRY(cudaMemcpyAsync(d->rec_state[l], s->rec_state[l], rec_bytes(cfg), cudaMemcpyDeviceToDevice,
                                     c->stream));
        }
    }
    CUDA_TRY(cudaMemcpyAsync(d->ctr, s->ctr, sizeof(cuda_counters), cudaMemcpyDeviceToDevice, c->stream));
    d->pos = s->pos;
    d->step = s->step;
    return cuda_sync(c, err);
}

/* Serialized layout: header {pos, step}, then per attention layer K then V rows [0, pos) per KV head,
 * per DeltaNet layer both conv-state buffers and the recurrent state. */
static size_t cuda_state_save_size(void *vctx, const void *vst)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    const cuda_state *s = (const cuda_state *)vst;
    const lily_config *cfg = &c->cfg;
    size_t n = 2 * sizeof(int);
    for (int l = 0; l < cfg->n_layers; l++)
        n += s->k_cache[l] ? 2 * (size_t)cfg->n_kv_heads * s->pos * kv_head_row_bytes(c)
                           : conv_bytes(cfg) + rec_bytes(cfg);
    return n;
}

static lily_status state_transfer(cuda_ctx *c, cuda_state *s, uint8_t *buf, size_t size, bool save, int pos,
                                  lily_error *err)
{
    const lily_config *cfg = &c->cfg;
    const size_t row = kv_head_row_bytes(c);
    size_t off = 2 * sizeof(int);
    const cudaMemcpyKind kind = save ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
#define XFER(dev, bytes)                                                                           \
    do {                                                                                           \
        if (off + (bytes) > size)                                                                  \
            return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: state buffer too small"); \
        if (save)                                                                                  \
            CUDA_TRY(cudaMemcpyAsync(buf + off, (dev), (bytes), kind, c->stream));                 \
        else                                                                                       \
            CUDA_TRY(cudaMemcpyAsync((dev), buf + off, (bytes), kind, c->stream));                 \
        off += (bytes);                                                                            \
    } while (0)
    for (int l = 0; l < cfg->n_layers; l++) {
        if (s->k_cache[l]) {
            for (int h = 0; h < cfg->n_kv_heads; h++)
                if (pos) XFER(s->k_cache[l] + (size_t)h * s->max_ctx * row, pos * row);
            for (int h = 0; h < cfg->n_kv_heads; h++)
                if (pos) XFER(s->v_cache[l] + (size_t)h * s->max_ctx * row, pos * row);
        } else {
            XFER(s->conv_state[l], conv_bytes(cfg));
            XFER(s->rec_state[l], rec_bytes(cfg));
        }
    }
#undef XFER
    return cuda_sync(c, err);
}

static lily_status cuda_state_save(void *vctx, const void *vst, void *buf, size_t size, lily_error *err)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    cuda_state *s = (cuda_state *)vst;
    if (size < cuda_state_save_size(c, s))
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: state buffer too small");
    CUDA_TRY(cudaSetDevice(c->device));
    int hdr[2] = {s->pos, s->step};
    memcpy(buf, hdr, sizeof hdr);
    return state_transfer(c, s, (uint8_t *)buf, size, true, s->pos, err);
}

static lily_status cuda_state_restore(void *vctx, void *vst, const void *buf, size_t size, lily_error *err)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    cuda_state *s = (cuda_state *)vst;
    if (size < 2 * sizeof(int))
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: state buffer too small");
    int hdr[2];
    memcpy(hdr, buf, sizeof hdr);
    if (hdr[0] < 0 || hdr[0] > s->max_ctx)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: saved position %d exceeds max_ctx %d", hdr[0],
                              s->max_ctx);
    CUDA_TRY(cudaSetDevice(c->device));
    lily_status st = state_transfer(c, s, (uint8_t *)buf, size, false, hdr[0], err);
    if (st != LILY_OK)
        return st;
    s->pos = hdr[0];
    s->step = hdr[1];
    cuda_counters ctr = {hdr[0], hdr[1], 0, {0, 0}, {0}, {0}, {0}};
    CUDA_TRY(cudaMemcpy(s->ctr, &ctr, sizeof ctr, cudaMemcpyHostToDevice));
    return LILY_OK;
}

/* ---- the state in parts, for the prefix cache (backend.h's optional split-state ops) --------------
 * A location is host memory (loc.host) or bytes in a device pool (cuda_device_pool_new); device
 * locations are read and written with device-to-device copies on the backend's stream. */

static uint8_t *loc_bytes(lily_state_loc loc)
{
    return loc.host ? (uint8_t *)loc.host : loc.device_pool ? (uint8_t *)loc.device_pool + loc.offset : NULL;
}

/* KV rows of a position, per attention layer: K then V, each [n_kv_heads][rows][head_dim] bf16 (fp32 in
 * exact mode). */
static size_t cuda_kv_row_bytes(void *vctx)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    const lily_config *cfg = &c->cfg;
    size_t n = 0;
    for (int l = 0; l < cfg->n_layers; l++)
        if (cfg->layer_types[l] == LILY_LAYER_FULL_ATTENTION)
            n += 2 * (size_t)cfg->n_kv_heads * kv_head_row_bytes(c);
    return n;
}

static lily_status kv_rows_transfer(cuda_ctx *c, cuda_state *s, int row0, int n, int limit, lily_state_loc loc,
                                    bool save, lily_error *err)
{
    const lily_config *cfg = &c->cfg;
    uint8_t *ext = loc_bytes(loc);
    if (!ext)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: no location for the KV rows");
    if (row0 < 0 || n < 0 || (long long)row0 + n > limit)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: KV rows [%d, %d) outside [0, %d)", row0, row0 + n,
                              limit);
    if (n == 0)
        return LILY_OK;
    CUDA_TRY(cudaSetDevice(c->device));
    const cudaMemcpyKind kind =
        loc.host ? (save ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice) : cudaMemcpyDeviceToDevice;
    const size_t row = kv_head_row_bytes(c);
    const size_t width = (size_t)n * row, pitch = (size_t)s->max_ctx * row; /* one KV head's rows */
    if (!loc.host) { /* device to device: one kernel for every layer's K and V (strided_copy.cuh) */
        strided_copy_args a;
        memset(&a, 0, sizeof a);
        a.width = width;
        a.rows = cfg->n_kv_heads;
        size_t off = 0;
        for (int l = 0; l < cfg->n_layers && a.n_parts < STRIDED_COPY_MAX_PARTS; l++) {
            if (!s->k_cache[l])
                continue;
            uint8_t *caches[2] = {s->k_cache[l], s->v_cache[l]};
            for (int i = 0; i < 2 && a.n_parts < STRIDED_COPY_MAX_PARTS; i++, a.n_parts++) {
                uint8_t *rows = caches[i] + (size_t)row0 * row;
                a.dst[a.n_parts] = save ? ext + off : rows;
                a.src[a.n_parts] = save ? rows : ext + off;
                a.dst_pitch[a.n_parts] = save ? width : pitch;
                a.src_pitch[a.n_parts] = save ? pitch : width;
                off += width * cfg->n_kv_heads;
            }
        }
        if (off == (size_t)n * cuda_kv_row_bytes(c) && strided_copy_aligned(a)) {
            LAUNCH(launch_strided_copy(a, c->stream));
            return save ? LILY_OK : cuda_sync(c, err);
        }
    }
    for (int l = 0; l < cfg->n_layers; l++) {
        if (!s->k_cache[l])
            continue;
        uint8_t *caches[2] = {s->k_cache[l], s->v_cache[l]};
        for (int i = 0; i < 2; i++) {
            uint8_t *rows = caches[i] + (size_t)row0 * row;
            if (save)
                CUDA_TRY(cudaMemcpy2DAsync(ext, width, rows, pitch, width, cfg->n_kv_heads, kind, c->stream));
            else
                CUDA_TRY(cudaMemcpy2DAsync(rows, pitch, ext, width, width, cfg->n_kv_heads, kind, c->stream));
            ext += width * cfg->n_kv_heads;
        }
    }
    /* a save to a device pool stays queued on the stream (backend.h): no host round trip per checkpoint */
    return save && !loc.host ? LILY_OK : cuda_sync(c, err);
}

static lily_status cuda_kv_save(void *vctx, const void *vst, int row0, int n, lily_state_loc loc, lily_error *err)
{
    cuda_state *s = (cuda_state *)vst;
    return kv_rows_transfer((cuda_ctx *)vctx, s, row0, n, s->pos, loc, true, err);
}

static lily_status cuda_kv_load(void *vctx, void *vst, int row0, int n, lily_state_loc loc, lily_error *err)
{
    cuda_state *s = (cuda_state *)vst;
    return kv_rows_transfer((cuda_ctx *)vctx, s, row0, n, s->max_ctx, loc, false, err);
}

/* The recurrent part: a header {pos, step} padded to RECURRENT_HEADER bytes, then per Gated DeltaNet
 * layer both conv-state buffers (the ping-pong pair; step's parity says which is current) and the
 * recurrent state. */
#define RECURRENT_HEADER 256

static size_t cuda_recurrent_bytes(void *vctx)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    const lily_config *cfg = &c->cfg;
    size_t n = RECURRENT_HEADER;
    for (int l = 0; l < cfg->n_layers; l++)
        if (cfg->layer_types[l] != LILY_LAYER_FULL_ATTENTION)
            n += conv_bytes(cfg) + rec_bytes(cfg);
    return n;
}

static lily_status recurrent_transfer(cuda_ctx *c, cuda_state *s, uint8_t *ext, cudaMemcpyKind kind, bool save,
                                      lily_error *err)
{
    const lily_config *cfg = &c->cfg;
    ext += RECURRENT_HEADER;
    if (kind == cudaMemcpyDeviceToDevice) { /* one kernel for the conv states, one for the recurrent ones */
        strided_copy_args a[2];
        memset(a, 0, sizeof a);
        a[0].width = conv_bytes(cfg);
        a[1].width = rec_bytes(cfg);
        a[0].rows = a[1].rows = 1;
        uint8_t *e = ext;
        bool fits = true;
        for (int l = 0; l < cfg->n_layers && fits; l++) {
            if (!s->conv_state[l])
                continue;
            void *parts[2] = {s->conv_state[l], s->rec_state[l]};
            fits = a[0].n_parts < STRIDED_COPY_MAX_PARTS;
            for (int i = 0; i < 2 && fits; i++) {
                const int p = a[i].n_parts++;
                a[i].dst[p] = save ? e : (uint8_t *)parts[i];
                a[i].src[p] = save ? (const uint8_t *)parts[i] : e;
                e += a[i].width;
            }
        }
        if (fits && a[0].n_parts > 0 && strided_copy_aligned(a[0]) && strided_copy_aligned(a[1])) {
            LAUNCH(launch_strided_copy(a[0], c->stream));
            LAUNCH(launch_strided_copy(a[1], c->stream));
            return LILY_OK;
        }
    }
    for (int l = 0; l < cfg->n_layers; l++) {
        if (!s->conv_state[l])
            continue;
        void *parts[2] = {s->conv_state[l], s->rec_state[l]};
        const size_t sizes[2] = {conv_bytes(cfg), rec_bytes(cfg)};
        for (int i = 0; i < 2; i++) {
            if (save)
                CUDA_TRY(cudaMemcpyAsync(ext, parts[i], sizes[i], kind, c->stream));
            else
                CUDA_TRY(cudaMemcpyAsync(parts[i], ext, sizes[i], kind, c->stream));
            ext += sizes[i];
        }
    }
    return LILY_OK;
}

static lily_status cuda_recurrent_save(void *vctx, const void *vst, lily_state_loc loc, lily_error *err)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    cuda_state *s = (cuda_state *)vst;
    uint8_t *ext = loc_bytes(loc);
    if (!ext)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: no location for the recurrent state");
    CUDA_TRY(cudaSetDevice(c->device));
    if (loc.host) {
        const int hdr[2] = {s->pos, s->step};
        memcpy(ext, hdr, sizeof hdr);
    } else { /* in stream order, like the copies after it */
        LAUNCH(launch_set_int((int *)ext, s->pos, c->stream));
        LAUNCH(launch_set_int((int *)ext + 1, s->step, c->stream));
    }
    lily_status st = recurrent_transfer(c, s, ext, loc.host ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice,
                                        true, err);
    if (st != LILY_OK || !loc.host) /* a save to a device pool stays queued on the stream (backend.h) */
        return st;
    return cuda_sync(c, err);
}

static lily_status cuda_recurrent_load(void *vctx, void *vst, lily_state_loc loc, lily_error *err)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    cuda_state *s = (cuda_state *)vst;
    uint8_t *ext = loc_bytes(loc);
    if (!ext)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: no location for the recurrent state");
    CUDA_TRY(cudaSetDevice(c->device));
    int hdr[2];
    if (loc.host) {
        memcpy(hdr, ext, sizeof hdr);
    } else { /* on the stream: after a save to these bytes that may still be queued */
        CUDA_TRY(cudaMemcpyAsync(hdr, ext, sizeof hdr, cudaMemcpyDeviceToHost, c->stream));
        lily_status st = cuda_sync(c, err);
        if (st != LILY_OK)
            return st;
    }
    if (hdr[0] < 0 || hdr[0] > s->max_ctx || hdr[1] < 0)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: saved position %d exceeds max_ctx %d", hdr[0],
                              s->max_ctx);
    lily_status st = recurrent_transfer(c, s, ext, loc.host ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice,
                                        false, err);
    if (st != LILY_OK)
        return st;
    const cuda_counters ctr = {hdr[0], hdr[1], 0, {0, 0}, {0}, {0}, {0}};
    CUDA_TRY(cudaMemcpyAsync(s->ctr, &ctr, sizeof ctr, cudaMemcpyHostToDevice, c->stream));
    st = cuda_sync(c, err);
    if (st != LILY_OK)
        return st;
    s->pos = hdr[0];
    s->step = hdr[1];
    return LILY_OK;
}

/* The prefix cache's device pool: one cudaMalloc, here, with 256 MiB of the device left free for the
 * rest of the work (LILY_ERR_OUT_OF_MEMORY otherwise: the cache then keeps host checkpoints). */
static lily_status cuda_device_pool_new(void *vctx, size_t bytes, void **pool, lily_error *err)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    *pool = NULL;
    CUDA_TRY(cudaSetDevice(c->device));
    size_t fr = 0, tot = 0;
    CUDA_TRY(cudaMemGetInfo(&fr, &tot));
    if (bytes + ((size_t)256 << 20) > fr)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY,
                              "cuda: a prefix-cache pool of %.2f GiB does not fit: %.2f GiB of GPU memory free",
                              bytes / 1073741824.0, fr / 1073741824.0);
    CUDA_TRY(cudaMalloc(pool, bytes));
    return LILY_OK;
}

static void cuda_device_pool_free(void *vctx, void *pool)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream);
    cudaFree(pool);
}

/* The prefix cache's host pool: page-locked, so checkpoint copies run at the link's speed instead of
 * through the driver's pageable staging. */
static lily_status cuda_host_pool_new(void *vctx, size_t bytes, void **pool, lily_error *err)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    *pool = NULL;
    CUDA_TRY(cudaSetDevice(c->device));
    const cudaError_t e = cudaHostAlloc(pool, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *pool = NULL;
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cuda: cannot page-lock %.2f GiB of host memory: %s",
                              bytes / 1073741824.0, cudaGetErrorString(e));
    }
    return LILY_OK;
}

static void cuda_host_pool_free(void *vctx, void *pool)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream);
    cudaFreeHost(pool);
}

/* The device runtime's own memory beside lily's allocations: the CUDA context with its kernel images, the
 * decode graphs, the allocator's rounding. Measured on the H200: nvidia-smi's peak for `lily serve` on the
 * full-size model was ~150 MiB under the plan with this figure, i.e. ~620 MiB (docs/BENCHMARKS.md). */
#define CUDA_RUNTIME_BYTES ((size_t)768 << 20)

static lily_status cuda_memory_needs(const lily_config *cfg, const lily_weights *w, const lily_backend_options *opts,
                                     lily_backend_memory *out, lily_error *err)
{
    memset(out, 0, sizeof *out);
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        cudaGetLastError();
        return lily_error_set(err, LILY_ERR_BACKEND, "cuda: no usable NVIDIA GPU/driver found");
    }
    if (opts->device < 0 || opts->device >= n_dev)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: device %d out of range (%d devices)",
                              opts->device, n_dev);
    CUDA_TRY(cudaSetDevice(opts->device));
    CUDA_TRY(cudaFree(NULL)); /* makes the context, so the free memory below excludes it */
    CUDA_TRY(cudaMemGetInfo(&out->device_free, &out->device_total));
    cuda_ctx c; /* a dry run of create()'s sizes: nothing is allocated */
    memset(&c, 0, sizeof c);
    c.cfg = *cfg;
    c.opts = *opts;
    c.kv_elem = opts->exact ? sizeof(float) : sizeof(__nv_bfloat16);
    c.max_chunk = opts->max_chunk > 0 ? opts->max_chunk : 512;
    c.logits_rows = logits_rows(opts, c.max_chunk);
    lily_status st = scratch_layout(&c, &out->scratch_bytes, err);
    if (st != LILY_OK)
        return st;
    out->scratch_bytes += cuda_sampling_bytes(cfg->vocab_size);
    size_t n_attn = 0;
    for (int l = 0; l < cfg->n_layers; l++)
        n_attn += cfg->layer_types[l] == LILY_LAYER_FULL_ATTENTION;
    out->runtime_bytes = CUDA_RUNTIME_BYTES;
    out->weight_bytes = weights_device_bytes(w, opts->n_cpu_moe);
    out->expert_layer_bytes = w->n_layers > 0 && w->layers ? expert_layer_bytes(w, 0) : 0;
    out->n_expert_layers = cfg->n_layers;
    if (!opts->exact && c.max_chunk >= CUDA_MOE_STAGE_MIN_TOKENS && c.max_chunk >= PREFILL_GEMM_MIN_TOKENS)
        out->expert_stage_bytes = cuda_experts_stage_bytes(out->expert_layer_bytes);
    out->kv_bytes_per_token = n_attn * 2 * kv_bytes(&c, 1) + sizeof(int); /* + out_tokens */
    out->state_bytes = ((size_t)cfg->n_layers - n_attn) * (conv_bytes(cfg) + rec_bytes(cfg)) + sizeof(cuda_counters);
    return LILY_OK;
}

static lily_status cuda_forward(void *vctx, void *vst, const int32_t *tokens, int n, lily_logits_mode mode,
                                float *logits, lily_error *err);
static lily_status cuda_forward_mark(void *vctx, void *vst, const int32_t *tokens, int n, int mark,
                                     lily_state_loc mark_loc, float *mark_logits, lily_logits_mode mode, float *logits,
                                     lily_error *err);

static const lily_backend_ops cuda_ops = {
    "cuda",
    cuda_create,
    cuda_destroy,
    cuda_memory_needs,
    cuda_state_new,
    cuda_state_free,
    cuda_state_reset,
    cuda_state_position,
    cuda_state_copy,
    cuda_state_save_size,
    cuda_state_save,
    cuda_state_restore,
    cuda_forward,
    cuda_kv_row_bytes,
    cuda_kv_save,
    cuda_kv_load,
    cuda_recurrent_bytes,
    cuda_recurrent_save,
    cuda_recurrent_load,
    cuda_device_pool_new,
    cuda_device_pool_free,
    cuda_decode_loop,
    NULL, /* profile_take: the CUDA backend's per-stage times come from bench_cuda_decode --profile / --timeline */
    cuda_measure_limits,
    cuda_host_pool_new,
    cuda_host_pool_free,
    cuda_forward_mark,
};

extern "C" const lily_backend_ops *lily_cuda_backend_ops_get(void) { return &cuda_ops; }

/* ---- forward (host tokens in, host logits out) ---------------------------------------------------- */

lily_status cuda_sync(cuda_ctx *c, lily_error *err)
{
    c->host_syncs++;
    CUDA_TRY(cudaStreamSynchronize(c->stream));
    return LILY_OK;
}

lily_status cuda_forward_logits_graph(cuda_ctx *c, cuda_state *st, lily_error *err); /* cuda_forward.cu */

/* forward() and, with mk, forward_mark() (mk->ext past the recurrent header, which the caller wrote). */
static lily_status forward_pass(cuda_ctx *c, cuda_state *s, const int32_t *tokens, int n, lily_logits_mode mode,
                                float *logits, const cuda_mark *mk, lily_error *err)
{
    if (n < 1 || n > c->max_chunk)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: forward of %d tokens (max_chunk %d)", n,
                              c->max_chunk);
    if (s->pos + n > s->max_ctx)
        return lily_error_set(err, LILY_ERR_CONTEXT_LENGTH, "cuda: %d + %d tokens exceed the context of %d", s->pos,
                              n, s->max_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->cfg.vocab_size)
            return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: token id %d outside [0, %d)", tokens[i],
                                  c->cfg.vocab_size);
    if (mode != LILY_LOGITS_NONE && !logits)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: logits buffer is NULL");
    CUDA_TRY(cudaSetDevice(c->device));
    CUDA_TRY(cudaMemcpyAsync(c->d_tokens, tokens, (size_t)n * sizeof(int), cudaMemcpyHostToDevice, c->stream));
    lily_status st;
    const bool blocks = mode == LILY_LOGITS_ALL && n > c->logits_rows; /* the LM head block by block, below */
    if (n == 1 && !c->opts.debug_hook && mode != LILY_LOGITS_NONE && !mk)
        st = cuda_forward_logits_graph(c, s, err);
    else
        st = cuda_enqueue_forward(c, s, n, blocks ? LILY_LOGITS_NONE : mode, n == 1, mk, err);
    if (st != LILY_OK)
        return st;
    const size_t V = c->cfg.vocab_size;
    if (blocks) {
        /* stream order: each block's copy is done before the next block's LM head writes c->logits */
        for (int r0 = 0; r0 < n; r0 += c->logits_rows) {
            const int rows = LILY_MIN(c->logits_rows, n - r0);
            if ((st = cuda_enqueue_lm_head(c, r0, rows, err)) != LILY_OK)
                return st;
            CUDA_TRY(cudaMemcpyAsync(logits + (size_t)r0 * V, c->logits, (size_t)rows * V * sizeof(float),
                                     cudaMemcpyDeviceToHost, c->stream));
        }
    } else {
        const size_t rows = mode == LILY_LOGITS_ALL ? (size_t)n : mode == LILY_LOGITS_LAST ? 1 : 0;
        if (rows)
            CUDA_TRY(cudaMemcpyAsync(logits, c->logits, rows * V * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
    }
    st = cuda_sync(c, err);
    if (st != LILY_OK)
        return st;
    s->pos += n;
    s->step += mk ? 2 : 1;
    return LILY_OK;
}

static lily_status cuda_forward(void *vctx, void *vst, const int32_t *tokens, int n, lily_logits_mode mode,
                                float *logits, lily_error *err)
{
    return forward_pass((cuda_ctx *)vctx, (cuda_state *)vst, tokens, n, mode, logits, NULL, err);
}

static lily_status cuda_forward_mark(void *vctx, void *vst, const int32_t *tokens, int n, int mark,
                                     lily_state_loc mark_loc, float *mark_logits, lily_logits_mode mode, float *logits,
                                     lily_error *err)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    cuda_state *s = (cuda_state *)vst;
    uint8_t *ext = loc_bytes(mark_loc);
    if (mark <= 0 || mark >= n || !ext)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cuda: a marked pass of %d tokens at %d", n, mark);
    if (n > c->max_chunk || s->pos + n > s->max_ctx) /* forward_pass says which */
        return forward_pass(c, s, tokens, n, mode, logits, NULL, err);
    CUDA_TRY(cudaSetDevice(c->device));
    /* the header recurrent_save writes after a call of `mark` tokens */
    if (mark_loc.host) {
        const int hdr[2] = {s->pos + mark, s->step + 1};
        memcpy(ext, hdr, sizeof hdr);
    } else {
        LAUNCH(launch_set_int((int *)ext, s->pos + mark, c->stream));
        LAUNCH(launch_set_int((int *)ext + 1, s->step + 1, c->stream));
    }
    LAUNCH(launch_set_int(c->mark_step, s->step + 1, c->stream));
    cuda_mark mk;
    mk.row = mark;
    mk.ext = ext + RECURRENT_HEADER;
    mk.kind = mark_loc.host ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
    mk.conv_bytes = conv_bytes(&c->cfg);
    mk.rec_bytes = rec_bytes(&c->cfg);
    mk.step_next = c->mark_step;
    mk.logits = mark_logits;
    return forward_pass(c, s, tokens, n, mode, logits, &mk, err);
}

