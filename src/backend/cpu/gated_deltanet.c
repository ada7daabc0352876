/* gated_deltanet.c — CPU Gated DeltaNet layer (MODEL.md §4.4), exact mode, fp32 throughout.
 *
 * Owns: the causal depthwise conv (K taps, SiLU) with its K-1 row state, the q/k L2 norm, the gates
 * g = -exp(A_log) · softplus(a + dt_bias) and beta = sigmoid(b), the gated delta rule and the
 * gated RMSNorm with SiLU(z). By default the forward pass runs the delta rule in its recurrent form for
 * every n, so the state after a token does not depend on how the tokens were split into forward() calls
 * (prefill in one piece, in pieces, or decode one by one give bit-identical states and logits): the prefix
 * cache's cold == cached exactness rests on this. On a CPU it costs nothing measurable (the delta rule is
 * ~1% of a token's FLOPs). With lily_backend_options.deltanet_chunked, calls with n > 1 use the chunked
 * form (chunk 64, transformers' torch_chunk_gated_delta_rule), cpu_gdn_delta_rule_chunked.
 * Does not own: the projections (matmul.c) or the state memory (the state).
 */
#include <math.h>
#include <string.h>

#include "base/base.h"
#include "cpu_internal.h"

#define GDN_CHUNK 64

int64_t cpu_gdn_chunk_scratch_floats(const cpu_gdn_dims *d)
{
    const int64_t C = GDN_CHUNK, dk = d->key_head_dim, dv = d->value_head_dim;
    /* T, attn [C, C]; gamma, row [C]; k_beta, w [C, dk]; v_beta, u, v_new [C, dv] */
    return 2 * C * C + 2 * C + 2 * C * dk + 3 * C * dv;
}

void cpu_gdn_delta_rule_recurrent(const float *q, const float *k, int qk_stride, const float *v, int v_stride,
                                  const float *g, const float *beta, int gb_stride, int n, int dk, int dv,
                                  float *state, float *out, int out_stride)
{
    for (int t = 0; t < n; t++) {
        const float *qt = q + (int64_t)t * qk_stride, *kt = k + (int64_t)t * qk_stride;
        const float *vt = v + (int64_t)t * v_stride;
        const float decay = expf(g[(int64_t)t * gb_stride]), bt = beta[(int64_t)t * gb_stride];
        float *o = out + (int64_t)t * out_stride; /* holds kv_mem, then delta, then the output */
        for (int64_t i = 0; i < (int64_t)dk * dv; i++)
            state[i] *= decay;
        memset(o, 0, (size_t)dv * sizeof(float));
        for (int a = 0; a < dk; a++) {
            const float *row = state + (int64_t)a * dv;
            for (int b = 0; b < dv; b++)
                o[b] += row[b] * kt[a];
        }
        for (int b = 0; b < dv; b++)
            o[b] = (vt[b] - o[b]) * bt;
        for (int a = 0; a < dk; a++) {
            float *row = state + (int64_t)a * dv;
            for (int b = 0; b < dv; b++)
                row[b] += kt[a] * o[b];
        }
        memset(o, 0, (size_t)dv * sizeof(float));
        for (int a = 0; a < dk; a++) {
            const float *row = state + (int64_t)a * dv;
            for (int b = 0; b < dv; b++)
                o[b] += row[b] * qt[a];
        }
    }
}

static float dot_f32(const float *a, const float *b, int n)
{
    float s = 0;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

void cpu_gdn_delta_rule_chunked(const float *q, const float *k, int qk_stride, const float *v, int v_stride,
                                const float *g, const float *beta, int gb_stride, int n, int dk, int dv,
                                float *state, float *out, int out_stride, float *scratch)
{
    const int C = GDN_CHUNK;
    float *T = scratch;                   /* [C, C] (I + A)^-1, unit lower triangular */
    float *attn = T + C * C;              /* [C, C] (Q Kᵀ) ⊙ D, lower triangular with the diagonal */
    float *gamma = attn + C * C;          /* [C] cumulative log-decay within the chunk */
    float *row = gamma + C;               /* [C] */
    float *k_beta = row + C;              /* [C, dk] */
    float *w = k_beta + (int64_t)C * dk;  /* [C, dk] W = T (β ⊙ exp(γ) ⊙ K) */
    float *v_beta = w + (int64_t)C * dk;  /* [C, dv] */
    float *u = v_beta + (int64_t)C * dv;  /* [C, dv] U = T (β ⊙ V) */
    float *v_new = u + (int64_t)C * dv;   /* [C, dv] V' = U - W S */

    /* Padded rows of the reference (zero q, k, v, β, g) change nothing for the real rows, so each chunk
     * simply stops at its last real row; γ of the padded tail equals γ of the last real row. */
    for (int t0 = 0; t0 < n; t0 += C) {
        const int L = LILY_MIN(C, n - t0);
#define Q(i) (q + (int64_t)(t0 + (i)) * qk_stride)
#define K(i) (k + (int64_t)(t0 + (i)) * qk_stride)
#define V(i) (v + (int64_t)(t0 + (i)) * v_stride)
        for (int i = 0; i < L; i++) {
            const float gi = g[(int64_t)(t0 + i) * gb_stride], bi = beta[(int64_t)(t0 + i) * gb_stride];
            gamma[i] = (i ? gamma[i - 1] : 0.0f) + gi;
            for (int a = 0; a < dk; a++)
                k_beta[(int64_t)i * dk + a] = K(i)[a] * bi;
            for (int b = 0; b < dv; b++)
                v_beta[(int64_t)i * dv + b] = V(i)[b] * bi;
        }
        /* T starts as -A: -(β_i k_i·k_j) D_ij below the diagonal */
        for (int i = 0; i < L; i++)
            for (int j = 0; j < L; j++)
                T[i * C + j] = j < i ? -(dot_f32(k_beta + (int64_t)i * dk, K(j), dk) * expf(gamma[i] - gamma[j])) : 0.0f;
        /* forward substitution, row by row as the reference does: T[i,:i] += Σ_m T[i,m] T[m,:i] */
        for (int i = 1; i < L; i++) {
            for (int j = 0; j < i; j++)
                row[j] = T[i * C + j];
            for (int j = 0; j < i; j++) {
                float s = 0;
                for (int m = 0; m < i; m++)
                    s += row[m] * T[m * C + j];
                T[i * C + j] = row[j] + s;
            }
        }
        for (int i = 0; i < L; i++)
            T[i * C + i] = 1.0f;
        /* U = T (β ⊙ V), W = T (β ⊙ exp(γ) ⊙ K); the sums run over j ascending */
        for (int j = 0; j < L; j++) {
            const float eg = expf(gamma[j]);
            for (int a = 0; a < dk; a++)
                k_beta[(int64_t)j * dk + a] *= eg; /* k_beta is only needed as β ⊙ exp(γ) ⊙ K from here */
        }
        for (int i = 0; i < L; i++) {
            float *ui = u + (int64_t)i * dv, *wi = w + (int64_t)i * dk;
            memset(ui, 0, (size_t)dv * sizeof(float));
            memset(wi, 0, (size_t)dk * sizeof(float));
            for (int j = 0; j <= i; j++) {
                const float tij = T[i * C + j];
                const float *vb = v_beta + (int64_t)j * dv, *kb = k_beta + (int64_t)j * dk;
                for (int b = 0; b < dv; b++)
                    ui[b] += tij * vb[b];
                for (int a = 0; a < dk; a++)
                    wi[a] += tij * kb[a];
            }
        }
        /* intra-chunk attention (Q Kᵀ) ⊙ D, diagonal included */
        for (int i = 0; i < L; i++)
            for (int j = 0; j <= i; j++)
                attn[i * C + j] = dot_f32(Q(i), K(j), dk) * expf(gamma[i] - gamma[j]);
        /* V' = U - W S (row by row; each sum over a ascending) */
        for (int i = 0; i < L; i++) {
            float *vn = v_new + (int64_t)i * dv;
            const float *wi = w + (int64_t)i * dk;
            memset(vn, 0, (size_t)dv * sizeof(float));
            for (int a = 0; a < dk; a++) {
                const float *srow = state + (int64_t)a * dv;
                for (int b = 0; b < dv; b++)
                    vn[b] += wi[a] * srow[b];
            }
            const float *ui = u + (int64_t)i * dv;
            for (int b = 0; b < dv; b++)
                vn[b] = ui[b] - vn[b];
        }
        /* O = (exp(γ) ⊙ Q) S + attn V' */
        for (int i = 0; i < L; i++) {
            float *o = out + (int64_t)(t0 + i) * out_stride;
            const float eg = expf(gamma[i]);
            memset(o, 0, (size_t)dv * sizeof(float));
            for (int a = 0; a < dk; a++) {
                const float qa = Q(i)[a] * eg, *srow = state + (int64_t)a * dv;
                for (int b = 0; b < dv; b++)
                    o[b] += qa * srow[b];
            }
            float *acc = u + (int64_t)i * dv; /* U row i is consumed: reuse it for attn V' */
            memset(acc, 0, (size_t)dv * sizeof(float));
            for (int j = 0; j <= i; j++) {
                const float aij = attn[i * C + j], *vn = v_new + (int64_t)j * dv;
                for (int b = 0; b < dv; b++)
                    acc[b] += aij * vn[b];
            }
            for (int b = 0; b < dv; b++)
                o[b] += acc[b];
        }
        /* S = exp(γ_last) S + (exp(γ_last - γ) ⊙ K)ᵀ V' */
        const float g_last = gamma[L - 1], e_last = expf(g_last);
        float *k_decay = w; /* W is consumed: reuse it for exp(γ_last - γ_i) k_i */
        for (int i = 0; i < L; i++) {
            const float d = expf(g_last - gamma[i]);
            for (int a = 0; a < dk; a++)
                k_decay[(int64_t)i * dk + a] = K(i)[a] * d;
        }
        float *acc = v_beta; /* consumed too: [dv] accumulator */
        for (int a = 0; a < dk; a++) {
            float *srow = state + (int64_t)a * dv;
            memset(acc, 0, (size_t)dv * sizeof(float));
            for (int i = 0; i < L; i++) {
                const float kd = k_decay[(int64_t)i * dk + a], *vn = v_new + (int64_t)i * dv;
                for (int b = 0; b < dv; b++)
                    acc[b] += kd * vn[b];
            }
            for (int b = 0; b < dv; b++)
                srow[b] = srow[b] * e_last + acc[b];
        }
#undef Q
#undef K
#undef V
    }
}

typedef struct {
    cpu_ctx *c;
    float *recurrent_state; /* [Hv, dk, dv] */
    int n;
    int n_cblocks, cblock; /* fast mode: each head's value columns in n_cblocks blocks of cblock */
} delta_rule_job;

/* One task = value head task / n_cblocks, its column block task % n_cblocks (one block but in fast mode). */
static void delta_rule_head_task(void *arg, int task, int thread)
{
    const delta_rule_job *j = arg;
    const int hv = task / j->n_cblocks, cb = task % j->n_cblocks;
    const lily_config *cfg = j->c->cfg;
    const int Hk = cfg->gdn_n_key_heads, Hv = cfg->gdn_n_value_heads;
    const int dk = cfg->gdn_key_head_dim, dv = cfg->gdn_value_head_dim;
    const int key_dim = Hk * dk, conv_dim = lily_config_gdn_conv_dim(cfg), value_dim = Hv * dv;
    const int hk = hv / (Hv / Hk);
    const float *conv = j->c->gdn_conv;
    const float *q = conv + (int64_t)hk * dk, *k = conv + key_dim + (int64_t)hk * dk;
    const float *v = conv + 2 * key_dim + (int64_t)hv * dv;
    float *state = j->recurrent_state + (int64_t)hv * dk * dv;
    float *out = j->c->gdn_o + (int64_t)hv * dv;
    if (j->c->deltanet_chunked && j->n > 1) {
        cpu_gdn_delta_rule_chunked(q, k, conv_dim, v, conv_dim, j->c->gdn_g + hv, j->c->gdn_beta + hv, Hv, j->n, dk,
                                   dv, state, out, value_dim,
                                   j->c->gdn_chunk_scratch + (int64_t)thread * j->c->gdn_chunk_scratch_floats);
        return;
    }
    if (!j->c->exact && cpu_gdn_fast_step_ok(dv)) {
        cpu_gdn_delta_rule_recurrent_fast_cols(q, k, conv_dim, v, conv_dim, j->c->gdn_g + hv, j->c->gdn_beta + hv, Hv,
                                               j->n, dk, dv, cb * j->cblock, LILY_MIN(dv, (cb + 1) * j->cblock), state,
                                               out, value_dim);
        return;
    }
    cpu_gdn_delta_rule_recurrent(q, k, conv_dim, v, conv_dim, j->c->gdn_g + hv, j->c->gdn_beta + hv, Hv, j->n, dk,
                                 dv, state, out, value_dim);
}

/* Channels per block of causal_conv_silu (a block's taps transposed on the stack). */
#define CONV_CHANNEL_BLOCK 64
#define CONV_MAX_TAPS 8

/* Causal depthwise conv over the pre-conv rows `mixed` [n, C] preceded by `conv_state` [K-1, C], then SiLU,
 * for channels [c0, c0 + nc) (nc <= CONV_CHANNEL_BLOCK) of tokens [t0, t1) (t1 <= n). weight: [C, K], tap K-1 = current token.
 * Per channel: acc = 0, then acc += weight[j] · x_j for the taps j in order — walked a block of channels
 * at a time so that the loop over channels vectorizes (the same operations per channel). */
CPU_VEC8_CLONES static void causal_conv_silu_block(const float *mixed, int t0, int t1, int channels, int K,
                                                   const float *weight, const float *conv_state, float *y, int c0,
                                                   int nc)
{
    const int hist = K - 1;
    float wt[CONV_MAX_TAPS][CONV_CHANNEL_BLOCK]; /* (a config with more taps reads them in place) */
    for (int c = 0; c < nc && K <= CONV_MAX_TAPS; c++)
        for (int j = 0; j < K; j++)
            wt[j][c] = weight[(int64_t)(c0 + c) * K + j];
    if (nc == CONV_CHANNEL_BLOCK && K <= CONV_MAX_TAPS) { /* a whole block: loops of a fixed count vectorize */
        for (int t = t0; t < t1; t++) {
            float acc[CONV_CHANNEL_BLOCK] = {0};
            for (int j = 0; j < K; j++) {
                const int r = t - hist + j;
                const float *xr =
                    r >= 0 ? mixed + (int64_t)r * channels + c0 : conv_state + (int64_t)(hist + r) * channels + c0;
                for (int c = 0; c < CONV_CHANNEL_BLOCK; c++)
                    acc[c] += wt[j][c] * xr[c];
            }
            float *yt = y + (int64_t)t * channels + c0;
            for (int c = 0; c < CONV_CHANNEL_BLOCK; c++)
                yt[c] = cpu_silu(acc[c]);
        }
        return;
    }
    for (int t = t0; t < t1; t++) {
        float acc[CONV_CHANNEL_BLOCK] = {0};
        for (int j = 0; j < K; j++) {
            const int r = t - hist + j; /* row of mixed; < 0 reads the state */
            const float *xr = r >= 0 ? mixed + (int64_t)r * channels + c0 : conv_state + (int64_t)(hist + r) * channels + c0;
            if (K <= CONV_MAX_TAPS)
                for (int c = 0; c < nc; c++)
                    acc[c] += wt[j][c] * xr[c];
            else
                for (int c = 0; c < nc; c++)
                    acc[c] += weight[(int64_t)(c0 + c) * K + j] * xr[c];
        }
        float *yt = y + (int64_t)t * channels + c0;
        for (int c = 0; c < nc; c++)
            yt[c] = cpu_silu(acc[c]);
    }
}

/* The conv state becomes the last K-1 rows of concat(conv_state, mixed). */
static void conv_state_update(const float *mixed, int n, int channels, int K, float *conv_state)
{
    const int hist = K - 1;
    if (n >= hist) {
        memcpy(conv_state, mixed + (int64_t)(n - hist) * channels, (size_t)hist * channels * sizeof(float));
    } else {
        memmove(conv_state, conv_state + (int64_t)n * channels, (size_t)(hist - n) * channels * sizeof(float));
        memcpy(conv_state + (int64_t)(hist - n) * channels, mixed, (size_t)n * channels * sizeof(float));
    }
}

static void l2norm_inplace(float *x, int dim, float scale)
{
    float s = 0;
    for (int i = 0; i < dim; i++)
        s += x[i] * x[i];
    const float inv = 1.0f / sqrtf(s + 1e-6f);
    for (int i = 0; i < dim; i++)
        x[i] = (x[i] * inv) * scale;
}

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Fewest tokens for which the element-wise steps around the delta rule go over the pool (decode's one token
 * is less work than a pool pass). */
#define GDN_PARALLEL_MIN_TOKENS 16
/* Tokens per task of those steps. */
#define GDN_TOKENS_PER_TASK 16

typedef struct {
    cpu_ctx *c;
    const cpu_layer_params *lp;
    const float *conv_state;
    int n;
    int n_cblocks, tblock; /* the conv's tasks: channel blocks x blocks of tblock tokens */
} gdn_step_job;

/* Task: channel block task % n_cblocks of the causal conv + SiLU over token block task / n_cblocks. */
static void conv_task(void *arg, int task, int thread)
{
    (void)thread;
    const gdn_step_job *j = arg;
    const lily_config *cfg = j->c->cfg;
    const int conv_dim = lily_config_gdn_conv_dim(cfg), c0 = task % j->n_cblocks * CONV_CHANNEL_BLOCK;
    const int t0 = task / j->n_cblocks * j->tblock;
    causal_conv_silu_block(j->c->gdn_mixed, t0, LILY_MIN(j->n, t0 + j->tblock), conv_dim, cfg->gdn_conv_kernel,
                           j->lp->conv1d, j->conv_state, j->c->gdn_conv, c0, LILY_MIN(CONV_CHANNEL_BLOCK, conv_dim - c0));
}

/* Task: tokens [16 task, 16 task + 16) of q/k's L2 norms and the gates β, g. */
static void qk_norm_gates_task(void *arg, int task, int thread)
{
    (void)thread;
    const gdn_step_job *j = arg;
    const lily_config *cfg = j->c->cfg;
    cpu_ctx *c = j->c;
    const int Hk = cfg->gdn_n_key_heads, Hv = cfg->gdn_n_value_heads, dk = cfg->gdn_key_head_dim;
    const int key_dim = Hk * dk, conv_dim = lily_config_gdn_conv_dim(cfg);
    const float q_scale = 1.0f / sqrtf((float)dk);
    for (int t = task * GDN_TOKENS_PER_TASK; t < LILY_MIN(j->n, (task + 1) * GDN_TOKENS_PER_TASK); t++) {
        float *row = c->gdn_conv + (int64_t)t * conv_dim;
        for (int h = 0; h < Hk; h++) {
            l2norm_inplace(row + (int64_t)h * dk, dk, q_scale);
            l2norm_inplace(row + key_dim + (int64_t)h * dk, dk, 1.0f);
        }
        for (int h = 0; h < Hv; h++) {
            const int64_t i = (int64_t)t * Hv + h;
            c->gdn_beta[i] = cpu_sigmoid(c->gdn_b[i]);
            c->gdn_g[i] = j->lp->neg_exp_A[h] * softplus(c->gdn_a[i] + j->lp->dt_bias[h]);
        }
    }
}

/* Task: tokens [16 task, 16 task + 16) of the gated RMSNorm per (token, value head): (w ⊙ RMS(o)) ⊙ silu(z). */
static void gated_norm_task(void *arg, int task, int thread)
{
    (void)thread;
    const gdn_step_job *j = arg;
    const lily_config *cfg = j->c->cfg;
    cpu_ctx *c = j->c;
    const int Hv = cfg->gdn_n_value_heads, dv = cfg->gdn_value_head_dim;
    const int t0 = task * GDN_TOKENS_PER_TASK, t1 = LILY_MIN(j->n, t0 + GDN_TOKENS_PER_TASK);
    float *o = c->gdn_o + (int64_t)t0 * Hv * dv;
    const float *z = c->gdn_z + (int64_t)t0 * Hv * dv;
    cpu_rmsnorm(o, j->lp->gdn_norm, (t1 - t0) * Hv, dv, cfg->rms_norm_eps, o);
    for (int64_t i = 0; i < (int64_t)(t1 - t0) * Hv * dv; i++)
        o[i] *= cpu_silu(z[i]);
}

/* fn over its n_tasks: through the pool for GDN_PARALLEL_MIN_TOKENS tokens or more, else on the caller. */
static void gdn_steps(cpu_ctx *c, int n, int n_tasks, lily_task_fn fn, void *arg)
{
    if (n >= GDN_PARALLEL_MIN_TOKENS)
        parallel_for(c->pool, n_tasks, fn, arg);
    else
        for (int i = 0; i < n_tasks; i++)
            fn(arg, i, 0);
}

void cpu_gdn_forward(cpu_ctx *c, int layer, cpu_state *st, const float *x, int n, float *out)
{
    const lily_config *cfg = c->cfg;
    const lily_layer_weights *lw = &c->w->layers[layer];
    const cpu_layer_params *lp = &c->layers[layer];
    const int Hv = cfg->gdn_n_value_heads, conv_dim = lily_config_gdn_conv_dim(cfg), dv = cfg->gdn_value_head_dim;

    const lily_tensor *in_w[] = {&lw->in_proj_qkv, &lw->in_proj_z, &lw->in_proj_b, &lw->in_proj_a};
    float *const in_y[] = {c->gdn_mixed, c->gdn_z, c->gdn_b, c->gdn_a};
    cpu_matmul_many(c, 4, in_w, x, n, in_y);
    cpu_prof_mark(c, CPU_STAGE_GDN_IN_PROJ);

    /* the conv in channel blocks, and in token blocks too when those are fewer than two per thread */
    const int n_cblocks = (conv_dim + CONV_CHANNEL_BLOCK - 1) / CONV_CHANNEL_BLOCK;
    const int n_tblocks = LILY_MAX(1, LILY_MIN((2 * c->n_threads + n_cblocks - 1) / n_cblocks,
                                               (n + GDN_TOKENS_PER_TASK - 1) / GDN_TOKENS_PER_TASK));
    gdn_step_job steps = {c, lp, st->conv_state[layer], n, n_cblocks, (n + n_tblocks - 1) / n_tblocks};
    gdn_steps(c, n, n_cblocks * ((n + steps.tblock - 1) / steps.tblock), conv_task, &steps);
    conv_state_update(c->gdn_mixed, n, conv_dim, cfg->gdn_conv_kernel, st->conv_state[layer]);
    cpu_prof_mark(c, CPU_STAGE_GDN_CONV);
    const int token_tasks = (n + GDN_TOKENS_PER_TASK - 1) / GDN_TOKENS_PER_TASK;
    gdn_steps(c, n, token_tasks, qk_norm_gates_task, &steps);
    cpu_prof_mark(c, CPU_STAGE_GDN_QK_GATES);

    /* fast mode's recurrent rule: fewer heads than threads split their value columns too, in blocks of a
     * multiple of 16 floats (one cache line of gdn_o, 64-byte aligned: no two threads write one line of a
     * token's output; 8 where dv is not a multiple of 16), as few as give every thread one */
    delta_rule_job job = {c, st->recurrent_state[layer], n, 1, dv};
    if (!(c->deltanet_chunked && n > 1) && !c->exact && cpu_gdn_fast_step_ok(dv) && Hv < c->n_threads) {
        const int unit = dv % 16 == 0 ? 16 : 8;
        const int blocks = LILY_MIN(dv / unit, (c->n_threads + Hv - 1) / Hv);
        job.cblock = (dv / unit + blocks - 1) / blocks * unit;
        job.n_cblocks = (dv + job.cblock - 1) / job.cblock;
    }
    parallel_for(c->pool, Hv * job.n_cblocks, delta_rule_head_task, &job);
    cpu_prof_mark(c, CPU_STAGE_GDN_DELTA);

    gdn_steps(c, n, token_tasks, gated_norm_task, &steps);
    cpu_prof_mark(c, CPU_STAGE_GDN_NORM);

    cpu_matmul(c, &lw->out_proj, c->gdn_o, n, out);
    cpu_prof_mark(c, CPU_STAGE_GDN_OUT_PROJ);
}
