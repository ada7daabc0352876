/* test_cpu_kernels.c — the CPU backend's kernels on small random inputs: thread pool, exact dequant +
 * matmul for every weight kind (4/8-bit affine with negative scales, bf16, f16, f32), the fast path's
 * int8 activation quantization and integer dot products (every kernel set this CPU runs, against a
 * double-precision evaluation of the same formula and against the exact matmul), the chunked gated
 * delta rule against the recurrent rule, and router top-k tie breaking. */
#include "test_support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/experts_token.h"
#include "base/dtype.h"

static uint32_t rng_state = 12345;
static float frand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)((rng_state >> 8) & 0xffffff) / 8388608.0f - 1.0f;
}

/* ---- thread pool ---- */
typedef struct {
    int *hits;
} pool_job;
static void count_task(void *arg, int task, int thread)
{
    (void)thread;
    __atomic_fetch_add(&((pool_job *)arg)->hits[task], 1, __ATOMIC_RELAXED);
}

static void test_parallel_for_runs_every_task_once(void **state)
{
    (void)state;
    lily_threadpool *pool;
    lily_error err;
    assert_int_equal(lily_threadpool_create(3, &pool, &err), LILY_OK);
    assert_int_equal(lily_threadpool_size(pool), 3);
    for (int round = 0; round < 50; round++) {
        int n = 1 + round * 7;
        int *hits = calloc((size_t)n, sizeof(int));
        pool_job job = {hits};
        parallel_for(pool, n, count_task, &job);
        for (int i = 0; i < n; i++)
            assert_int_equal(hits[i], 1);
        free(hits);
    }
    lily_threadpool_destroy(pool);
}

/* Jobs back to back (workers still spinning) and jobs after a pause longer than the spin (workers asleep):
 * every task runs once, and every worker wakes for the job — the first 4 tasks each wait until 4 tasks have
 * started, which only 4 different threads can do (a thread inside one task cannot claim another). */
typedef struct {
    int *hits;
    int started, timed_out;
} pool_job_wake;
static void rendezvous_task(void *arg, int task, int thread)
{
    (void)thread;
    pool_job_wake *j = arg;
    j->hits[task]++; /* each task index is claimed by exactly one thread */
    if (task >= 4)
        return;
    __atomic_fetch_add(&j->started, 1, __ATOMIC_SEQ_CST);
    for (int i = 0; __atomic_load_n(&j->started, __ATOMIC_SEQ_CST) < 4; i++) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
        if (i > 100000) { /* 10 s: a worker never woke */
            __atomic_store_n(&j->timed_out, 1, __ATOMIC_SEQ_CST);
            return;
        }
    }
}

static void test_parallel_for_spin_then_sleep(void **state)
{
    (void)state;
    lily_threadpool *pool;
    lily_error err;
    assert_int_equal(lily_threadpool_create(4, &pool, &err), LILY_OK);
    for (int round = 0; round < 40; round++) {
        if (round % 10 == 9) {
            struct timespec ts = {0, 5000000}; /* 5 ms, past the workers' spin: they sleep */
            nanosleep(&ts, NULL);
        }
        const int n = round % 2 ? 4 : 64;
        int hits[64] = {0};
        pool_job_wake job = {hits, 0, 0};
        parallel_for(pool, n, rendezvous_task, &job);
        assert_int_equal(job.timed_out, 0);
        assert_int_equal(job.started, 4);
        for (int i = 0; i < 64; i++)
            assert_int_equal(hits[i], i < n);
    }
    lily_threadpool_destroy(pool);
}

/* ---- dequant + matmul ---- */

/* A quantized [rows, cols] tensor from known q, scales and biases (bf16). */
typedef struct {
    lily_tensor t;
    uint32_t *words;
    uint16_t *scales, *biases;
    float *dense; /* the exact dequantized values */
} qtensor;

static qtensor make_quantized_group(int rows, int cols, int bits, int n_experts, int group)
{
    qtensor q;
    memset(&q, 0, sizeof q);
    const int per_word = 32 / bits, words_per_row = cols / per_word, groups = cols / group;
    const int prow = rows * (n_experts ? n_experts : 1);
    q.words = calloc((size_t)prow * words_per_row, 4);
    q.scales = calloc((size_t)prow * groups, 2);
    q.biases = calloc((size_t)prow * groups, 2);
    q.dense = calloc((size_t)prow * cols, sizeof(float));
    for (int r = 0; r < prow; r++) {
        for (int g = 0; g < groups; g++) {
            /* alternate signs: negative scales are legal (MODEL.md §3) */
            q.scales[r * groups + g] = lily_f32_to_bf16((g + r) % 2 ? -0.03125f * (1 + frand()) : 0.02f * (1.5f + frand()));
            q.biases[r * groups + g] = lily_f32_to_bf16(0.5f * frand());
        }
        for (int col = 0; col < cols; col++) {
            uint32_t v = (uint32_t)(rng_state = rng_state * 1664525u + 1013904223u) >> 24;
            v &= (1u << bits) - 1u;
            q.words[(size_t)r * words_per_row + col / per_word] |= v << (bits * (col % per_word));
            const int g = col / group;
            q.dense[(size_t)r * cols + col] =
                lily_bf16_to_f32(q.scales[r * groups + g]) * (float)v + lily_bf16_to_f32(q.biases[r * groups + g]);
        }
    }
    lily_tensor *t = &q.t;
    t->name = "test.weight";
    t->data = q.words;
    t->dtype = LILY_DTYPE_U32;
    t->ndim = n_experts ? 3 : 2;
    if (n_experts) {
        t->shape[0] = n_experts; t->shape[1] = rows; t->shape[2] = cols;
    } else {
        t->shape[0] = rows; t->shape[1] = cols;
    }
    t->bits = bits;
    t->group_size = group;
    t->scales = q.scales;
    t->biases = q.biases;
    t->scale_dtype = LILY_DTYPE_BF16;
    t->expert_stride = rows;
    t->row_bytes = (int64_t)words_per_row * 4;
    t->scale_row_bytes = (int64_t)groups * 2;
    return q;
}

static qtensor make_quantized(int rows, int cols, int bits, int n_experts)
{
    return make_quantized_group(rows, cols, bits, n_experts, 64);
}

static void free_quantized(qtensor *q)
{
    free(q->words); free(q->scales); free(q->biases); free(q->dense);
}

/* y = x · Wᵀ in double from dense [rows, cols] */
static void naive_matmul(const float *x, int n, const float *w, int rows, int cols, float *y)
{
    for (int t = 0; t < n; t++)
        for (int r = 0; r < rows; r++) {
            double s = 0;
            for (int c = 0; c < cols; c++)
                s += (double)x[t * cols + c] * w[(size_t)r * cols + c];
            y[t * rows + r] = (float)s;
        }
}

static void check_matmul(lily_threadpool *pool, const lily_tensor *t, int64_t expert, const float *dense_expert, int n)
{
    const int rows = (int)lily_tensor_rows(t), cols = (int)lily_tensor_cols(t);
    float *x = malloc(sizeof(float) * n * cols), *y = malloc(sizeof(float) * n * rows), *ref = malloc(sizeof(float) * n * rows);
    for (int i = 0; i < n * cols; i++)
        x[i] = frand();
    for (int i = 0; i < n * rows; i++)
        y[i] = NAN; /* poison */
    cpu_ctx c;
    memset(&c, 0, sizeof c);
    c.pool = pool;
    c.exact = true;
    cpu_matmul_expert(&c, t, expert, x, n, y);
    naive_matmul(x, n, dense_expert, rows, cols, ref);
    float worst = test_max_abs_diff(y, ref, (size_t)n * rows);
    if (worst > 1e-4f)
        print_error("matmul %s bits=%d n=%d: max |Δ| %g\n", t->name, t->bits, n, worst);
    assert_true(worst <= 1e-4f);
    free(x); free(y); free(ref);
}

static void test_dequant_and_matmul_quantized(void **state)
{
    (void)state;
    lily_threadpool *pool;
    lily_error err;
    assert_int_equal(lily_threadpool_create(2, &pool, &err), LILY_OK);
    for (int bits = 4; bits <= 8; bits += 4) {
        qtensor q = make_quantized(37, 192, bits, 0);
        float *row = malloc(sizeof(float) * 3 * 192);
        cpu_dequant_rows(&q.t, 0, 5, 3, row);
        for (int i = 0; i < 3 * 192; i++)
            assert_true(row[i] == q.dense[5 * 192 + i]); /* bit-exact */
        free(row);
        for (int n = 1; n <= 9; n += 4)
            check_matmul(pool, &q.t, 0, q.dense, n);
        free_quantized(&q);
        /* 3-D experts: expert 2 of 3 */
        qtensor e = make_quantized(20, 128, bits, 3);
        check_matmul(pool, &e.t, 2, e.dense + 2 * 20 * 128, 3);
        free_quantized(&e);
    }
    lily_threadpool_destroy(pool);
}

static void test_matmul_plain_dtypes(void **state)
{
    (void)state;
    lily_threadpool *pool;
    lily_error err;
    assert_int_equal(lily_threadpool_create(2, &pool, &err), LILY_OK);
    const int rows = 33, cols = 80;
    float *dense = malloc(sizeof(float) * rows * cols);
    uint16_t *half = malloc(2 * rows * cols);
    float *f32 = malloc(sizeof(float) * rows * cols);
    for (int i = 0; i < rows * cols; i++)
        f32[i] = frand();
    lily_tensor t = {.name = "plain", .ndim = 2, .shape = {rows, cols}};
    /* bf16 */
    for (int i = 0; i < rows * cols; i++) {
        half[i] = lily_f32_to_bf16(f32[i]);
        dense[i] = lily_bf16_to_f32(half[i]);
    }
    t.data = half; t.dtype = LILY_DTYPE_BF16; t.row_bytes = 2 * cols;
    check_matmul(pool, &t, 0, dense, 4);
    /* f16: values k/1024 are exact in half precision */
    for (int i = 0; i < rows * cols; i++) {
        int k = (int)(f32[i] * 1024);
        dense[i] = (float)k / 1024.0f;
        /* encode: sign, exponent, mantissa via float -> half for these exact values */
        float v = fabsf(dense[i]);
        uint16_t h = 0;
        if (v != 0) {
            int e;
            float m = frexpf(v, &e); /* v = m * 2^e, m in [0.5, 1) */
            int he = e - 1 + 15;
            if (he <= 0) /* subnormal */
                h = (uint16_t)lrintf(v * 16777216.0f);
            else
                h = (uint16_t)((he << 10) | ((int)lrintf((m * 2 - 1) * 1024) & 0x3ff));
        }
        half[i] = (uint16_t)(h | (dense[i] < 0 ? 0x8000 : 0));
        assert_true(lily_f16_to_f32(half[i]) == dense[i]);
    }
    t.dtype = LILY_DTYPE_F16;
    check_matmul(pool, &t, 0, dense, 2);
    /* f32 */
    t.data = f32; t.dtype = LILY_DTYPE_F32; t.row_bytes = 4 * cols;
    check_matmul(pool, &t, 0, f32, 3);
    free(dense); free(half); free(f32);
    lily_threadpool_destroy(pool);
}

/* ---- gated delta rule ---- */

typedef struct {
    int n, dk, dv;
    float *q, *k, *v, *g, *beta;
} gdn_inputs;

static void l2n(float *x, int d, float scale)
{
    float s = 0;
    for (int i = 0; i < d; i++)
        s += x[i] * x[i];
    for (int i = 0; i < d; i++)
        x[i] = x[i] / sqrtf(s + 1e-6f) * scale;
}

static gdn_inputs make_gdn_inputs(int n, int dk, int dv)
{
    gdn_inputs in = {n, dk, dv, malloc(sizeof(float) * n * dk), malloc(sizeof(float) * n * dk),
                     malloc(sizeof(float) * n * dv), malloc(sizeof(float) * n), malloc(sizeof(float) * n)};
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < dk; i++) {
            in.q[t * dk + i] = frand();
            in.k[t * dk + i] = frand();
        }
        l2n(in.q + t * dk, dk, 1.0f / sqrtf((float)dk));
        l2n(in.k + t * dk, dk, 1.0f);
        for (int i = 0; i < dv; i++)
            in.v[t * dv + i] = 2 * frand();
        in.g[t] = -0.5f * (1.0f + frand()); /* log decay in (-1, 0] */
        in.beta[t] = 0.5f + 0.5f * frand();
    }
    return in;
}

static void free_gdn_inputs(gdn_inputs *in)
{
    free(in->q); free(in->k); free(in->v); free(in->g); free(in->beta);
}

static void test_gdn_chunked_matches_recurrent(void **state)
{
    (void)state;
    const int dk = 16, dv = 24;
    const int lengths[] = {2, 5, 63, 64, 65, 130};
    cpu_gdn_dims d = {1, 1, dk, dv};
    float *scratch = malloc(sizeof(float) * (size_t)cpu_gdn_chunk_scratch_floats(&d));
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
        const int n = lengths[li];
        gdn_inputs in = make_gdn_inputs(n, dk, dv);
        float *s_chunk = calloc((size_t)dk * dv, sizeof(float)), *s_rec = calloc((size_t)dk * dv, sizeof(float));
        /* a non-zero initial state, as a continuation chunk has */
        for (int i = 0; i < dk * dv; i++)
            s_chunk[i] = s_rec[i] = 0.3f * frand();
        float *o_chunk = malloc(sizeof(float) * n * dv), *o_rec = malloc(sizeof(float) * n * dv);
        cpu_gdn_delta_rule_chunked(in.q, in.k, dk, in.v, dv, in.g, in.beta, 1, n, dk, dv, s_chunk, o_chunk, dv, scratch);
        cpu_gdn_delta_rule_recurrent(in.q, in.k, dk, in.v, dv, in.g, in.beta, 1, n, dk, dv, s_rec, o_rec, dv);
        float dout = test_max_abs_diff(o_chunk, o_rec, (size_t)n * dv);
        float dstate = test_max_abs_diff(s_chunk, s_rec, (size_t)dk * dv);
        if (dout > 2e-5f || dstate > 2e-5f)
            print_error("n=%d: output max |Δ| %g, state max |Δ| %g\n", n, dout, dstate);
        assert_true(dout <= 2e-5f && dstate <= 2e-5f);
        free(s_chunk); free(s_rec); free(o_chunk); free(o_rec);
        free_gdn_inputs(&in);
    }
    free(scratch);
}

/* The fast mode's fused, vectorized recurrent step against the reference recurrent rule; splitting the
 * tokens over calls changes no bit. */
static void test_gdn_fast_step_matches_recurrent(void **state)
{
    (void)state;
    const int dk = 16, dv = 40, n = 70; /* dv = 32 + 8: the 4-vector and the 1-vector column runs */
    assert_true(cpu_gdn_fast_step_ok(dv) && !cpu_gdn_fast_step_ok(20));
    gdn_inputs in = make_gdn_inputs(n, dk, dv);
    float *s_ref = calloc((size_t)dk * dv, sizeof(float)), *s_fast = calloc((size_t)dk * dv, sizeof(float));
    float *s_split = calloc((size_t)dk * dv, sizeof(float));
    for (int i = 0; i < dk * dv; i++)
        s_ref[i] = s_fast[i] = s_split[i] = 0.3f * frand();
    float *o_ref = malloc(sizeof(float) * n * dv), *o_fast = malloc(sizeof(float) * n * dv);
    float *o_split = malloc(sizeof(float) * n * dv);
    cpu_gdn_delta_rule_recurrent(in.q, in.k, dk, in.v, dv, in.g, in.beta, 1, n, dk, dv, s_ref, o_ref, dv);
    cpu_gdn_delta_rule_recurrent_fast(in.q, in.k, dk, in.v, dv, in.g, in.beta, 1, n, dk, dv, s_fast, o_fast, dv);
    cpu_gdn_delta_rule_recurrent_fast(in.q, in.k, dk, in.v, dv, in.g, in.beta, 1, 9, dk, dv, s_split, o_split, dv);
    cpu_gdn_delta_rule_recurrent_fast(in.q + 9 * dk, in.k + 9 * dk, dk, in.v + 9 * dv, dv, in.g + 9, in.beta + 9, 1,
                                      n - 9, dk, dv, s_split, o_split + 9 * dv, dv);
    const float dout = test_max_abs_diff(o_fast, o_ref, (size_t)n * dv);
    const float dstate = test_max_abs_diff(s_fast, s_ref, (size_t)dk * dv);
    if (dout > 2e-5f || dstate > 2e-5f)
        print_error("fast step: output max |Δ| %g, state max |Δ| %g\n", dout, dstate);
    assert_true(dout <= 2e-5f && dstate <= 2e-5f);
    assert_memory_equal(o_split, o_fast, sizeof(float) * n * dv);
    assert_memory_equal(s_split, s_fast, sizeof(float) * dk * dv);
    /* value columns in blocks (8, 16 and 16 wide: the 1- and 2-vector runs), as threads take them: the same bits */
    for (int i = 0; i < n * dv; i++)
        o_split[i] = 0;
    for (int i = 0; i < dk * dv; i++)
        s_split[i] = 0.3f * (float)((i * 37) % 11 - 5) / 5;
    float *s_whole = calloc((size_t)dk * dv, sizeof(float));
    memcpy(s_whole, s_split, sizeof(float) * dk * dv);
    cpu_gdn_delta_rule_recurrent_fast(in.q, in.k, dk, in.v, dv, in.g, in.beta, 1, n, dk, dv, s_whole, o_fast, dv);
    const int cols[] = {0, 8, 24, 40};
    for (int b = 2; b >= 0; b--) /* (any order) */
        cpu_gdn_delta_rule_recurrent_fast_cols(in.q, in.k, dk, in.v, dv, in.g, in.beta, 1, n, dk, dv, cols[b], cols[b + 1],
                                               s_split, o_split, dv);
    assert_memory_equal(o_split, o_fast, sizeof(float) * n * dv);
    assert_memory_equal(s_split, s_whole, sizeof(float) * dk * dv);
    free(s_whole);
    free(s_ref); free(s_fast); free(s_split); free(o_ref); free(o_fast); free(o_split);
    free_gdn_inputs(&in);
}

/* ---- router ---- */

static void test_top_k_ties_lower_id_first(void **state)
{
    (void)state;
    const float probs[2 * 6] = {0.1f, 0.25f, 0.05f, 0.25f, 0.25f, 0.1f, /* three-way tie */
                                0.3f, 0.1f, 0.2f, 0.1f, 0.2f, 0.1f};
    int ids[2 * 3];
    float w[2 * 3];
    cpu_moe_top_k(probs, 2, 6, 3, true, ids, w);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 4);
    assert_int_equal(ids[3], 0);
    assert_int_equal(ids[4], 2);
    assert_int_equal(ids[5], 4);
    assert_float_equal(w[0] + w[1] + w[2], 1.0f, 1e-6f);
    assert_float_equal(w[3], 0.3f / 0.7f, 1e-6f);
}

/* ---- fast-mode attention ---- */

/* cpu_attention_head_fast against softmax attention in double, and n tokens in one call against one token
 * per call (bit for bit). hd = 24: three 8-wide vectors. */
static void test_attention_head_fast_matches_double(void **state)
{
    (void)state;
    enum { HD = 24, N = 9, KV_STRIDE = 2 * HD };
    assert_true(cpu_attention_fast_ok(HD) && !cpu_attention_fast_ok(20));
    float q[N * HD], k[N * KV_STRIDE], v[N * KV_STRIDE], o[N * HD], o1[N * HD], scores[N];
    float part[CPU_ATTN_DECODE_MAX_CHUNKS * CPU_ATTN_DECODE_PART(HD)];
    for (int i = 0; i < N * HD; i++)
        q[i] = frand();
    for (int i = 0; i < N * KV_STRIDE; i++) {
        k[i] = frand();
        v[i] = frand();
    }
    const float scale = 1.0f / sqrtf((float)HD);
    /* the second KV head of the rows: offset HD */
    cpu_attention_head_fast(q, HD, k + HD, v + HD, KV_STRIDE, N, 0, HD, scale, scores, part, o, HD);
    for (int t = 0; t < N; t++)
        cpu_attention_head_fast(q + t * HD, HD, k + HD, v + HD, KV_STRIDE, 1, t, HD, scale, scores, part, o1 + t * HD, HD);
    assert_memory_equal(o, o1, sizeof o);
    for (int t = 0; t < N; t++) {
        double sc[N], mx = -1e300, sum = 0;
        for (int s = 0; s <= t; s++) {
            double d = 0;
            for (int i = 0; i < HD; i++)
                d += (double)q[t * HD + i] * k[s * KV_STRIDE + HD + i];
            sc[s] = d * scale;
            mx = fmax(mx, sc[s]);
        }
        for (int s = 0; s <= t; s++)
            sum += sc[s] = exp(sc[s] - mx);
        for (int i = 0; i < HD; i++) {
            double want = 0;
            for (int s = 0; s <= t; s++)
                want += sc[s] / sum * v[s * KV_STRIDE + HD + i];
            assert_float_equal(o[t * HD + i], want, 1e-5);
        }
    }
}

/* Fast-mode decode (cpu_attention_decode_split / _chunk / _merge: the query heads of a KV head together,
 * split-KV over chunks of keys) against exact mode's per-head attention (cpu_attention_head_exact) to 1e-5
 * of the head's largest output, at depths 1, 7, 64, 1000, 2500 (the most chunks) and GQA groups 1, 4, 8 (1 and 2 KV heads, the
 * second offset in the rows), head sizes 24 and 256; q scaled up (sharp softmax) and not. Each head's output
 * and its e_s = exp(score_s - chunk max) equal the prefill path's (cpu_attention_head_fast) bit for bit. */
static void test_attention_decode_matches_exact(void **state)
{
    (void)state;
    const int depths[] = {1, 7, 64, 1000, 2500}, groups[] = {1, 4, 8}, hds[] = {24, 256};
    for (int hi = 0; hi < 2; hi++)
        for (int gi = 0; gi < 3; gi++)
            for (int nkv = 1; nkv <= 2; nkv++)
                for (int di = 0; di < 5; di++)
                    for (int sharp = 0; sharp < 2; sharp++) {
                        const int hd = hds[hi], group = groups[gi], n_keys = depths[di], nh = group * nkv;
                        const int kv_stride = nkv * hd;
                        const int64_t part_floats = CPU_ATTN_DECODE_PART(hd);
                        float *q = malloc(sizeof(float) * nh * hd);
                        float *k = malloc(sizeof(float) * n_keys * kv_stride);
                        float *v = malloc(sizeof(float) * n_keys * kv_stride);
                        float *sc = malloc(sizeof(float) * nh * n_keys);
                        float *sc1 = malloc(sizeof(float) * n_keys);
                        float *part = malloc(sizeof(float) * nh * CPU_ATTN_DECODE_MAX_CHUNKS * part_floats);
                        float *part1 = malloc(sizeof(float) * CPU_ATTN_DECODE_MAX_CHUNKS * part_floats);
                        float *o = malloc(sizeof(float) * hd), *want = malloc(sizeof(float) * hd);
                        assert_non_null(q && k && v && sc && sc1 && part && part1 && o && want);
                        for (int i = 0; i < nh * hd; i++)
                            q[i] = frand() * (sharp ? 8.0f : 1.0f);
                        for (int i = 0; i < n_keys * kv_stride; i++) {
                            k[i] = frand();
                            v[i] = frand();
                        }
                        const float scale = 1.0f / sqrtf((float)hd);
                        int chunk_len;
                        const int n_chunks = cpu_attention_decode_split(n_keys, hd, &chunk_len);
                        assert_true(n_chunks >= 1 && n_chunks <= CPU_ATTN_DECODE_MAX_CHUNKS);
                        assert_true((n_chunks - 1) * chunk_len < n_keys && n_chunks * chunk_len >= n_keys);
                        for (int kv = 0; kv < nkv; kv++)
                            for (int c = n_chunks - 1; c >= 0; c--) { /* any order: chunks are independent */
                                const int key0 = c * chunk_len;
                                const int len = n_keys - key0 < chunk_len ? n_keys - key0 : chunk_len;
                                cpu_attention_decode_chunk(q + kv * group * hd, group, k + kv * hd, v + kv * hd, kv_stride,
                                                           key0, len, hd, scale, sc + (int64_t)kv * group * n_keys + key0, n_keys,
                                                           part + ((int64_t)kv * group * CPU_ATTN_DECODE_MAX_CHUNKS + c) * part_floats,
                                                           CPU_ATTN_DECODE_MAX_CHUNKS * part_floats);
                            }
                        for (int h = 0; h < nh; h++) {
                            const int kv = h / group;
                            cpu_attention_decode_merge(part + (int64_t)h * CPU_ATTN_DECODE_MAX_CHUNKS * part_floats, part_floats,
                                                       n_chunks, hd, o);
                            cpu_attention_head_exact(q + h * hd, hd, k + kv * hd, v + kv * hd, kv_stride, 1, n_keys - 1, hd,
                                                     scale, sc1, want, hd);
                            float amax = 0;
                            for (int i = 0; i < hd; i++)
                                amax = fmaxf(amax, fabsf(want[i]));
                            for (int i = 0; i < hd; i++)
                                assert_float_equal(o[i], want[i], 1e-5 * amax);
                            /* the prefill path (one head, tokens in turn) gives this token the same bits */
                            cpu_attention_head_fast(q + h * hd, hd, k + kv * hd, v + kv * hd, kv_stride, 1, n_keys - 1, hd,
                                                    scale, sc1, part1, want, hd);
                            assert_memory_equal(o, want, sizeof(float) * hd);
                            assert_memory_equal(sc + (int64_t)h * n_keys, sc1, sizeof(float) * n_keys);
                        }
                        free(q), free(k), free(v), free(sc), free(sc1), free(part), free(part1), free(o), free(want);
                    }
}

/* Prefill of a KV head's query heads together (cpu_attention_group_fast, K and V rows shared) gives every head
 * the bits of cpu_attention_head_fast, for tokens past a prefix (pos0 > 0) and past a chunk split. */
static void test_attention_group_matches_head(void **state)
{
    (void)state;
    const int hd = 24, group = 4, nkv = 2, nh = group * nkv, pos0 = 5, n = 1200, kv_stride = nkv * hd;
    const int q_dim = nh * hd, total = pos0 + n;
    const int64_t head_parts = CPU_ATTN_DECODE_MAX_CHUNKS * CPU_ATTN_DECODE_PART(hd);
    float *q = malloc(sizeof(float) * n * q_dim), *o = malloc(sizeof(float) * n * q_dim);
    float *want = malloc(sizeof(float) * n * q_dim);
    float *k = malloc(sizeof(float) * total * kv_stride), *v = malloc(sizeof(float) * total * kv_stride);
    int longest;
    cpu_attention_decode_split(total, hd, &longest);
    float *sc = malloc(sizeof(float) * group * longest), *sc1 = malloc(sizeof(float) * total);
    float *part = malloc(sizeof(float) * group * head_parts);
    assert_non_null(q && o && want && k && v && sc && sc1 && part);
    for (int i = 0; i < n * q_dim; i++)
        q[i] = 3.0f * frand();
    for (int i = 0; i < total * kv_stride; i++) {
        k[i] = frand();
        v[i] = frand();
    }
    const float scale = 1.0f / sqrtf((float)hd);
    for (int kv = 0; kv < nkv; kv++)
        cpu_attention_group_fast(q + kv * group * hd, q_dim, group, k + kv * hd, v + kv * hd, kv_stride, n, pos0, hd,
                                 scale, sc, longest, part, o + kv * group * hd, q_dim);
    for (int h = 0; h < nh; h++)
        cpu_attention_head_fast(q + h * hd, q_dim, k + h / group * hd, v + h / group * hd, kv_stride, n, pos0, hd, scale,
                                sc1, part, want + h * hd, q_dim);
    assert_memory_equal(o, want, sizeof(float) * n * q_dim);
    free(q), free(o), free(want), free(k), free(v), free(sc), free(sc1), free(part);
}

/* ---- RoPE ---- */

static void test_rope_rotates_pairs_i_and_i_plus_half(void **state)
{
    (void)state;
    const int head_dim = 8, rot = 4;
    float inv_freq[2];
    cpu_rope_inv_freq(rot, 10000.0f, inv_freq);
    assert_float_equal(inv_freq[0], 1.0f, 0);
    assert_float_equal(inv_freq[1], 0.01f, 1e-8f);
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    cpu_rope(x, 1, head_dim, 1, head_dim, rot, 3, inv_freq);
    /* pair (0, 2) at angle 3, pair (1, 3) at angle 0.03; dims 4.. untouched */
    assert_float_equal(x[0], 1 * cosf(3) - 3 * sinf(3), 1e-6f);
    assert_float_equal(x[2], 3 * cosf(3) + 1 * sinf(3), 1e-6f);
    assert_float_equal(x[1], 2 * cosf(0.03f) - 4 * sinf(0.03f), 1e-6f);
    assert_float_equal(x[3], 4 * cosf(0.03f) + 2 * sinf(0.03f), 1e-6f);
    assert_float_equal(x[4], 5, 0);
    assert_float_equal(x[7], 8, 0);
}

/* ---- fast path: int8 activations and integer dot products ---- */

static void test_quantize_act_blocks(void **state)
{
    (void)state;
    enum { N = 3, COLS = 96 };
    float x[N * COLS];
    for (int i = 0; i < N * COLS; i++)
        x[i] = 3.0f * frand();
    x[5] = 0; /* an all-zero block quantizes to zeros with d = 0 */
    for (int i = COLS; i < COLS + 32; i++)
        x[i] = 0;
    int8_t q[N * COLS], r[N * COLS];
    int16_t v16[N * COLS];
    float d[N * COLS / 32], sum[N * COLS / 32];
    cpu_qact a = {q, r, d, sum, COLS, v16};
    cpu_quantize_act(x, N, COLS, &a);
    for (int t = 0; t < N; t++)
        for (int k = 0; k < COLS / 32; k++) {
            const float *xb = x + t * COLS + k * 32;
            float amax = 0, s = 0;
            for (int i = 0; i < 32; i++) {
                amax = fmaxf(amax, fabsf(xb[i]));
                s += xb[i];
            }
            const int b = t * (COLS / 32) + k;
            assert_float_equal(d[b], amax / (127.0f * 254.0f), 0);
            assert_float_equal(sum[b], s, 1e-5);
            for (int i = 0; i < 32; i++) {
                /* element i sits at slot i/2 (even) or 16 + i/2 (odd) */
                const int slot = t * COLS + k * 32 + (i & 1 ? 16 + i / 2 : i / 2);
                const int v = 254 * q[slot] + r[slot];
                assert_int_equal(v16[slot], v); /* the whole value is the digits' */
                /* the high digit alone is within half its step, and both within half of d */
                assert_true(fabsf(q[slot] * 254.0f * d[b] - xb[i]) <= 0.5f * 254.0f * d[b] * 1.0001f);
                assert_true(fabsf((float)v * d[b] - xb[i]) <= 0.5f * d[b] * 1.001f + 1e-12f);
                assert_true(q[slot] != -128 && r[slot] != -128);
            }
        }
}

/* The formula of quant_dot.h in double from the unpacked values: Σ_g s_g Σ_k d_k Σ_i q_i (254 xq_i + xr_i);
 * *mag = Σ_k |s_g d_k Σ_i q_i (254 xq_i + xr_i)|, the scale of the fp32 rounding a kernel may add. */
static double qdot_double(const qtensor *qt, int64_t prow, const cpu_qact *a, int t, double *mag)
{
    const lily_tensor *w = &qt->t;
    const int64_t cols = lily_tensor_cols(w), nb = cols / 32;
    const int per_word = 32 / w->bits;
    double total = 0;
    for (int64_t k = 0; k < nb; k++) {
        int64_t isum = 0;
        for (int i = 0; i < 32; i++) {
            const int64_t col = k * 32 + i;
            const uint32_t word = qt->words[prow * (cols / per_word) + col / per_word];
            const int qv = (int)((word >> (w->bits * (col % per_word))) & ((1u << w->bits) - 1u));
            const int64_t slot = t * cols + k * 32 + (i & 1 ? 16 + i / 2 : i / 2);
            isum += (int64_t)qv * (254 * a->q[slot] + a->r[slot]);
        }
        const double s = lily_bf16_to_f32(qt->scales[prow * (cols / w->group_size) + k * 32 / w->group_size]);
        total += s * a->d[t * nb + k] * (double)isum;
        *mag += fabs(s * a->d[t * nb + k] * (double)isum);
    }
    return total;
}

static void test_quant_dot_every_kernel_set(void **state)
{
    (void)state;
    const cpu_qdot_kernels *sets[CPU_QDOT_MAX_SETS];
    const int n_sets = cpu_qdot_available(sets);
    assert_true(n_sets >= 1 && !strcmp(sets[0]->name, "ref"));
    assert_ptr_equal(cpu_qdot_best(), sets[n_sets - 1]);
    print_message("quant_dot kernel sets on this CPU:");
    for (int s = 0; s < n_sets; s++)
        print_message(" %s", sets[s]->name);
    print_message("\n");
    enum { ROWS = 5, COLS = 256, N = 27 }; /* up to 27 tokens: tiles of 16, 8 and a remainder */
    /* extreme = 1: every weight at its largest value and every activation at ±its block's maximum, so each
     * block's integer sum is the largest the kernels must hold (32 · 15 · 32258 for 4-bit: exact in int32
     * and in fp32) */
    for (int extreme = 0; extreme <= 1; extreme++)
    for (int bits = 4; bits <= 8; bits += 4)
        for (int group = 32; group <= 128; group *= 2) {
            qtensor qt = make_quantized_group(ROWS, COLS, bits, 0, group);
            float x[N * COLS];
            for (int i = 0; i < N * COLS; i++)
                x[i] = extreme ? ((i / 32 + i / COLS) % 2 ? -1.0f : 1.0f) : frand() * (i % 7 == 0 ? 4.0f : 1.0f);
            if (extreme)
                memset(qt.words, 0xff, (size_t)ROWS * qt.t.row_bytes);
            int8_t q[N * COLS], r[N * COLS];
            int16_t v16[N * COLS];
            float d[N * COLS / 32], sum[N * COLS / 32];
            cpu_qact a = {q, r, d, sum, COLS, v16};
            cpu_quantize_act(x, N, COLS, &a);
            /* the x86 sets (avx2, avx512-vnni) take the same fp32 steps after the same exact int32 block sums:
             * the same bits, and so do every set's tile and four-row kernels */
            float x86_single[ROWS][N];
            int have_x86 = 0;
            for (int s = 0; s < n_sets; s++) {
                const cpu_qdot_fn fn = bits == 4 ? sets[s]->dot_q4 : sets[s]->dot_q8;
                float all_ws[ROWS * COLS / 32], all_single[ROWS][N];
                for (int r = 0; r < ROWS; r++) {
                    const uint8_t *wrow = (const uint8_t *)qt.words + r * qt.t.row_bytes;
                    float *ws = all_ws + r * (COLS / group), *single = all_single[r];
                    for (int g = 0; g < COLS / group; g++)
                        ws[g] = lily_bf16_to_f32(qt.scales[r * (COLS / group) + g]);
                    for (int t = 0; t < N; t++)
                        fn(wrow, ws, group, &a, t, 1, &single[t]);
                    for (int t = 0; t < N; t++) {
                        double mag = 0;
                        const double want = qdot_double(&qt, r, &a, t, &mag);
                        /* (the extreme case's blocks cancel: want is 0 from terms of ~100, and a compiler that
                         * fuses the reference kernel's multiply-add, as GCC does on AArch64, leaves their
                         * rounding) */
                        if (!(fabs(single[t] - want) <= 1e-5 * (1 + fabs(want)) + 1e-6 * mag))
                            fail_msg("%s bits %d group %d extreme %d row %d token %d: %.9g, want %.9g", sets[s]->name, bits, group, extreme,
                                     r, t, single[t], want);
                    }
                    /* a tile of several tokens gives each token's single-token result, bit for bit */
                    for (int nt = 2; nt <= CPU_QTILE; nt++) {
                        float tile[CPU_QTILE];
                        fn(wrow, ws, group, &a, N - nt, nt, tile);
                        for (int j = 0; j < nt; j++)
                            assert_memory_equal(&tile[j], &single[N - nt + j], sizeof(float));
                    }
                }
                if (!strcmp(sets[s]->name, "avx2") || !strcmp(sets[s]->name, "avx512-vnni") || !strcmp(sets[s]->name, "avx512-amx")) {
                    if (have_x86)
                        assert_memory_equal(all_single, x86_single, sizeof x86_single);
                    memcpy(x86_single, all_single, sizeof x86_single);
                    have_x86 = 1;
                }
                /* CPU_QROWS rows in one call give each row's single-token result, bit for bit */
                const cpu_qdot_rows_fn rows_fn = bits == 4 ? sets[s]->rows_q4 : sets[s]->rows_q8;
                for (int r0 = 0; rows_fn && r0 + CPU_QROWS <= ROWS; r0++)
                    for (int t = 0; t < N; t++) {
                        float out[CPU_QROWS];
                        rows_fn((const uint8_t *)qt.words + r0 * qt.t.row_bytes, qt.t.row_bytes,
                                all_ws + r0 * (COLS / group), COLS / group, group, &a, t, out);
                        for (int q = 0; q < CPU_QROWS; q++)
                            assert_memory_equal(&out[q], &all_single[r0 + q][t], sizeof(float));
                    }
                /* so does the four-row kernel on the set's own activation layout (prep_q4, rows_q4_prep) */
                if (bits == 4 && sets[s]->rows_q4_prep)
                    for (int t = 0; t < N; t++) {
                        int16_t xn[COLS];
                        sets[s]->prep_q4(&a, t, xn);
                        for (int r0 = 0; r0 + CPU_QROWS <= ROWS; r0++) {
                            float out[CPU_QROWS], wst[COLS / 32 * CPU_QROWS]; /* scales transposed: [g][row] */
                            for (int g = 0; g < COLS / group; g++)
                                for (int q = 0; q < CPU_QROWS; q++)
                                    wst[g * CPU_QROWS + q] = all_ws[(r0 + q) * (COLS / group) + g];
                            sets[s]->rows_q4_prep((const uint8_t *)qt.words + r0 * qt.t.row_bytes, qt.t.row_bytes,
                                                  wst, CPU_QROWS, group, xn, a.d + t * (COLS / 32), COLS, out);
                            for (int q = 0; q < CPU_QROWS; q++)
                                assert_memory_equal(&out[q], &all_single[r0 + q][t], sizeof(float));
                        }
                    }
                /* the tile kernel gives every (row, token) its single-token result, bit for bit: 1 .. ROWS rows
                 * (register tiles of 4 and a remainder), 1 .. N tokens (tiles of 16 and 8, and a remainder) */
                if (bits == 4 && sets[s]->gemm_q4)
                    for (int nr = 1; nr <= ROWS; nr++)
                        for (int nt = 1; nt <= N; nt++) {
                            float out[N * ROWS], bias[N * (ROWS + 3)];
                            sets[s]->gemm_q4((const uint8_t *)qt.words, qt.t.row_bytes, nr, all_ws, COLS / group, group,
                                             &a, N - nt, nt, NULL, 0, out, ROWS);
                            for (int j = 0; j < nt; j++)
                                for (int r = 0; r < nr; r++)
                                    assert_memory_equal(&out[j * ROWS + r], &all_single[r][N - nt + j], sizeof(float));
                            /* with bias terms (row stride ROWS + 3): each result plus its term in one fp32 add */
                            for (int i = 0; i < N * (ROWS + 3); i++)
                                bias[i] = (float)((i * 37) % 101 - 50) * 0.37f;
                            sets[s]->gemm_q4((const uint8_t *)qt.words, qt.t.row_bytes, nr, all_ws, COLS / group, group,
                                             &a, N - nt, nt, bias, ROWS + 3, out, ROWS);
                            for (int j = 0; j < nt; j++)
                                for (int r = 0; r < nr; r++) {
                                    const float want = all_single[r][N - nt + j] + bias[j * (ROWS + 3) + r];
                                    assert_memory_equal(&out[j * ROWS + r], &want, sizeof(float));
                                }
                        }
            }
            free_quantized(&qt);
        }
}

/* Every set's tile kernel over many rows and wide inputs (several 16-row tiles and a remainder, passes of
 * rows, groups of 1, 2 and 4 blocks, a token offset and a partial token tile) gives each (row, token) the
 * set's one-row result bit for bit, with the bias terms added in one fp32 add. */
static void test_quant_gemm_many_rows_wide_inputs(void **state)
{
    (void)state;
    const cpu_qdot_kernels *sets[CPU_QDOT_MAX_SETS];
    const int n_sets = cpu_qdot_available(sets);
    enum { ROWS = 37, N = 35, T0 = 3 };
    static const int col_list[] = {96, 512, CPU_QGEMM_MAX_COLS}; /* 96: an odd block count */
    for (int ci = 0; ci < 3; ci++)
        for (int group = 32; group <= 128; group *= 2) {
            const int cols = col_list[ci];
            if (cols % group)
                continue;
            qtensor qt = make_quantized_group(ROWS, cols, 4, 0, group);
            const int nb = cols / 32, ng = cols / group;
            float *x = malloc(sizeof(float) * N * cols), *out = malloc(sizeof(float) * N * ROWS);
            float *bias = malloc(sizeof(float) * N * ROWS), *ws = malloc(sizeof(float) * ROWS * ng);
            int8_t *q = malloc((size_t)N * cols), *r = malloc((size_t)N * cols);
            int16_t *v16 = malloc(sizeof(int16_t) * N * cols);
            float *d = malloc(sizeof(float) * N * nb), *sum = malloc(sizeof(float) * N * nb);
            assert_true(x && out && bias && ws && q && r && v16 && d && sum);
            for (int i = 0; i < N * cols; i++)
                x[i] = frand() * (i % 5 == 0 ? 3.0f : 1.0f);
            for (int i = 0; i < N * ROWS; i++)
                bias[i] = frand();
            for (int i = 0; i < ROWS * ng; i++)
                ws[i] = lily_bf16_to_f32(qt.scales[i]);
            cpu_qact a = {q, r, d, sum, cols, v16};
            cpu_quantize_act(x, N, cols, &a);
            for (int s = 0; s < n_sets; s++) {
                if (!sets[s]->gemm_q4)
                    continue;
                sets[s]->gemm_q4((const uint8_t *)qt.words, qt.t.row_bytes, ROWS, ws, ng, group, &a, T0, N - T0, bias,
                                 ROWS, out, ROWS);
                for (int row = 0; row < ROWS; row++) {
                    float one[N];
                    for (int t = T0; t < N; t++)
                        sets[s]->dot_q4((const uint8_t *)qt.words + row * qt.t.row_bytes, ws + row * ng, group, &a, t, 1,
                                        &one[t]);
                    for (int j = 0; j < N - T0; j++) {
                        const float want = one[T0 + j] + bias[j * ROWS + row];
                        if (memcmp(&out[j * ROWS + row], &want, sizeof want))
                            fail_msg("%s cols %d group %d row %d token %d: %.9g, want %.9g", sets[s]->name, cols, group,
                                     row, T0 + j, out[j * ROWS + row], want);
                    }
                    /* the decode kernel on the set's own layout: row quads from this row, the same bits */
                    if (sets[s]->rows_q4_prep && row + CPU_QROWS <= ROWS)
                        for (int t = T0; t < N; t++) {
                            int16_t xn[CPU_QGEMM_MAX_COLS];
                            float wst[CPU_QGEMM_MAX_COLS / 32 * CPU_QROWS], o4[CPU_QROWS];
                            sets[s]->prep_q4(&a, t, xn);
                            for (int g = 0; g < ng; g++)
                                for (int qq = 0; qq < CPU_QROWS; qq++)
                                    wst[g * CPU_QROWS + qq] = ws[(row + qq) * ng + g];
                            sets[s]->rows_q4_prep((const uint8_t *)qt.words + row * qt.t.row_bytes, qt.t.row_bytes, wst,
                                                  CPU_QROWS, group, xn, d + t * nb, cols, o4);
                            float want;
                            sets[s]->dot_q4((const uint8_t *)qt.words + row * qt.t.row_bytes, ws + row * ng, group, &a, t,
                                            1, &want);
                            if (memcmp(&o4[0], &want, sizeof want))
                                fail_msg("%s rows_q4_prep cols %d group %d row %d token %d: %.9g, want %.9g",
                                         sets[s]->name, cols, group, row, t, o4[0], want);
                        }
                }
            }
            free(x); free(out); free(bias); free(ws); free(q); free(r); free(v16); free(d); free(sum);
            free_quantized(&qt);
        }
}

/* A fast-mode context for the matmul tests: the pool, max_chunk n, the quantized-input buffers. */
static cpu_ctx fast_ctx(lily_threadpool *pool, int n, cpu_qact qact, float *qgsum)
{
    cpu_ctx c;
    memset(&c, 0, sizeof c);
    c.pool = pool;
    c.max_chunk = n;
    c.qdot = cpu_qdot_best();
    c.qact = qact;
    c.qgsum = qgsum;
    return c;
}

/* The fast matmul against the exact values in double: the error is at most Σ_i |w_i| d_k / 2 (the
 * digits' rounding), plus fp32 slack. Splitting the tokens over calls changes no bit. Groups of 64 and
 * 32 (3 and 6 per row: the driver's 4 x 4 transposed bias blocks and their remainder), 602 rows (not a
 * multiple of 4 or 8; tasks of more than 64 rows), 19 tokens (full 8-token tiles and a remainder that goes
 * token by token). */
static void test_fast_matmul_error_bound_and_batch_invariance(void **state)
{
    (void)state;
    lily_threadpool *pool;
    lily_error err;
    assert_int_equal(lily_threadpool_create(2, &pool, &err), LILY_OK);
    enum { ROWS = 602, COLS = 192, N = 19 };
    int8_t qbuf[N * COLS], rbuf[N * COLS];
    int16_t vbuf[N * COLS];
    float dbuf[N * COLS / 32], sbuf[N * COLS / 32], gbuf[N * COLS / 32];
    cpu_ctx c = fast_ctx(pool, N, (cpu_qact){qbuf, rbuf, dbuf, sbuf, COLS, vbuf}, gbuf);
    for (int bits = 4; bits <= 8; bits += 4)
    for (int group = 32; group <= 64; group += 32) {
        qtensor qt = make_quantized_group(ROWS, COLS, bits, 3, group);
        assert_true(cpu_matmul_fast_ok(&c, &qt.t));
        float x[N * COLS], y[N * ROWS], y1[N * ROWS];
        for (int i = 0; i < N * COLS; i++)
            x[i] = frand();
        cpu_matmul_expert(&c, &qt.t, 1, x, N, y);
        for (int t = 0; t < N; t++)
            cpu_matmul_expert(&c, &qt.t, 1, x + t * COLS, 1, y1 + t * ROWS);
        assert_memory_equal(y, y1, sizeof y);
        const float *dense = qt.dense + (size_t)ROWS * COLS; /* expert 1 */
        for (int t = 0; t < N; t++)
            for (int r = 0; r < ROWS; r++) {
                double want = 0, bound = 0;
                for (int k = 0; k < COLS / 32; k++) {
                    float amax = 0;
                    for (int i = 0; i < 32; i++)
                        amax = fmaxf(amax, fabsf(x[t * COLS + k * 32 + i]));
                    for (int i = 0; i < 32; i++) {
                        const double wv = dense[r * COLS + k * 32 + i];
                        want += wv * x[t * COLS + k * 32 + i];
                        bound += fabs(wv) * amax / (127.0 * 254.0) / 2;
                    }
                }
                const double got = y[t * ROWS + r];
                if (!(fabs(got - want) <= bound + 2e-5 * (1 + fabs(want))))
                    fail_msg("bits %d group %d token %d row %d: %.7g vs exact %.7g (bound %.3g)", bits, group, t, r, got, want,
                             bound);
            }
        free_quantized(&qt);
    }
    /* exact mode keeps the reference path */
    c.exact = true;
    qtensor qt = make_quantized(8, 64, 4, 0);
    assert_false(cpu_matmul_fast_ok(&c, &qt.t));
    free_quantized(&qt);
    lily_threadpool_destroy(pool);
}

/* cpu_matmul_many() gives each matrix exactly what its own cpu_matmul() call gives, with runs of fused
 * matrices (one group size), a matrix of another group size and a plain bf16 one in the list. */
static void test_matmul_many_matches_single_calls(void **state)
{
    (void)state;
    lily_threadpool *pool;
    lily_error err;
    assert_int_equal(lily_threadpool_create(2, &pool, &err), LILY_OK);
    enum { COLS = 128, N = 5, M = 5 };
    int8_t qbuf[N * COLS], rbuf[N * COLS];
    int16_t vbuf[N * COLS];
    float dbuf[N * COLS / 32], sbuf[N * COLS / 32], gbuf[N * COLS / 32];
    cpu_ctx c = fast_ctx(pool, N, (cpu_qact){qbuf, rbuf, dbuf, sbuf, COLS, vbuf}, gbuf);
    qtensor qt[4] = {make_quantized_group(70, COLS, 4, 0, 64), make_quantized_group(9, COLS, 8, 0, 64),
                     make_quantized_group(3, COLS, 4, 0, 32), make_quantized_group(130, COLS, 4, 0, 32)};
    const int rows[M] = {70, 9, 3, 6, 130}; /* of w[i] */
    uint16_t plain[6 * COLS];
    for (int i = 0; i < 6 * COLS; i++)
        plain[i] = lily_f32_to_bf16(frand());
    lily_tensor bf = {.name = "plain", .ndim = 2, .shape = {6, COLS}, .data = plain, .dtype = LILY_DTYPE_BF16,
                      .row_bytes = 2 * COLS};
    const lily_tensor *w[M] = {&qt[0].t, &qt[1].t, &qt[2].t, &bf, &qt[3].t};
    float x[N * COLS];
    for (int i = 0; i < N * COLS; i++)
        x[i] = frand();
    float *y[M], *want[M];
    for (int i = 0; i < M; i++) {
        y[i] = malloc(sizeof(float) * N * 130);
        want[i] = malloc(sizeof(float) * N * 130);
        cpu_matmul(&c, w[i], x, N, want[i]);
    }
    cpu_matmul_many(&c, M, w, x, N, y);
    for (int i = 0; i < M; i++)
        assert_memory_equal(y[i], want[i], sizeof(float) * N * rows[i]);
    for (int i = 0; i < M; i++) {
        free(y[i]);
        free(want[i]);
    }
    for (int i = 0; i < 4; i++)
        free_quantized(&qt[i]);
    lily_threadpool_destroy(pool);
}

/* cpu_experts_token_run() (one token's routed experts, as the CUDA backend's --host-experts cpu runs them)
 * gives what the fast matmuls give expert by expert — silu(gate x) ⊙ (up x), its down projection, the
 * weighted sum in ascending expert id — bit for bit, whatever order the ids come in; and within the
 * quantization's error of the exact dequantized values. */
static void test_experts_token_matches_fast_matmuls(void **state)
{
    (void)state;
    enum { E = 6, H = 128, I = 64, K = 3 };
    qtensor gate = make_quantized(I, H, 4, E), up = make_quantized(I, H, 4, E), down = make_quantized(H, I, 4, E);
    assert_true(cpu_experts_token_ok(&gate.t, &up.t, &down.t, H, I));
    assert_false(cpu_experts_token_ok(&gate.t, &up.t, &down.t, H, 2 * I));
    lily_error err;
    cpu_experts_token *tok;
    assert_int_equal(cpu_experts_token_create(H, I, K + 2, 3, &tok, &err), LILY_OK); /* room for more than K */
    assert_int_equal(cpu_experts_token_threads(tok), 3);
    lily_threadpool *pool;
    assert_int_equal(lily_threadpool_create(2, &pool, &err), LILY_OK);
    int8_t qbuf[H], rbuf[H];
    int16_t vbuf[H];
    float dbuf[H / 32], sbuf[H / 32], gbuf[H / 32];
    cpu_ctx c = fast_ctx(pool, 1, (cpu_qact){qbuf, rbuf, dbuf, sbuf, H, vbuf}, gbuf);
    float x[H];
    for (int i = 0; i < H; i++)
        x[i] = frand();
    const int ids[K] = {4, 1, 3};
    const float w[K] = {0.5f, 0.3f, 0.2f};
    float got[H], want[H], exact[H];
    for (int i = 0; i < H; i++)
        got[i] = NAN; /* poison */
    cpu_experts_token_run(tok, &gate.t, &up.t, &down.t, x, K, ids, w, got);
    memset(want, 0, sizeof want);
    memset(exact, 0, sizeof exact);
    const int order[K] = {1, 2, 0}; /* slots by ascending id */
    for (int k = 0; k < K; k++) {
        const int s = order[k], e = ids[s];
        float g[I], u[I], y[H];
        cpu_matmul_expert(&c, &gate.t, e, x, 1, g);
        cpu_matmul_expert(&c, &up.t, e, x, 1, u);
        for (int r = 0; r < I; r++)
            g[r] = cpu_silu(g[r]) * u[r];
        cpu_matmul_expert(&c, &down.t, e, g, 1, y);
        for (int r = 0; r < H; r++)
            want[r] += y[r] * w[s];
        /* exact: dequantized weights in double */
        double gd[I];
        for (int r = 0; r < I; r++) {
            double a = 0, b = 0;
            for (int col = 0; col < H; col++) {
                a += (double)gate.dense[((size_t)e * I + r) * H + col] * x[col];
                b += (double)up.dense[((size_t)e * I + r) * H + col] * x[col];
            }
            gd[r] = a / (1 + exp(-a)) * b;
        }
        for (int r = 0; r < H; r++) {
            double a = 0;
            for (int col = 0; col < I; col++)
                a += (double)down.dense[((size_t)e * H + r) * I + col] * gd[col];
            exact[r] += (float)(a * w[s]);
        }
    }
    assert_memory_equal(got, want, sizeof got);
    double num = 0, den = 0;
    for (int r = 0; r < H; r++) {
        num += (double)(got[r] - exact[r]) * (got[r] - exact[r]);
        den += (double)exact[r] * exact[r];
    }
    if (!(sqrt(num / den) < 1e-3))
        fail_msg("relative L2 error %.3g against the exact experts", sqrt(num / den));
    cpu_experts_token_destroy(tok);
    lily_threadpool_destroy(pool);
    free_quantized(&gate);
    free_quantized(&up);
    free_quantized(&down);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parallel_for_runs_every_task_once),
        cmocka_unit_test(test_parallel_for_spin_then_sleep),
        cmocka_unit_test(test_dequant_and_matmul_quantized),
        cmocka_unit_test(test_matmul_plain_dtypes),
        cmocka_unit_test(test_quantize_act_blocks),
        cmocka_unit_test(test_quant_dot_every_kernel_set),
        cmocka_unit_test(test_quant_gemm_many_rows_wide_inputs),
        cmocka_unit_test(test_fast_matmul_error_bound_and_batch_invariance),
        cmocka_unit_test(test_matmul_many_matches_single_calls),
        cmocka_unit_test(test_experts_token_matches_fast_matmuls),
        cmocka_unit_test(test_gdn_chunked_matches_recurrent),
        cmocka_unit_test(test_gdn_fast_step_matches_recurrent),
        cmocka_unit_test(test_top_k_ties_lower_id_first),
        cmocka_unit_test(test_rope_rotates_pairs_i_and_i_plus_half),
        cmocka_unit_test(test_attention_head_fast_matches_double),
        cmocka_unit_test(test_attention_decode_matches_exact),
        cmocka_unit_test(test_attention_group_matches_head),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
