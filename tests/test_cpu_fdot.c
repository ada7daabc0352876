/* test_cpu_fdot.c — the host experts' CUDA-rounding arithmetic (fdot.h, experts_token.h's
 * CPU_EXPERTS_CUDA_ROUNDING) against a reference written here from the GPU kernels' description
 * (mma_gemv.cuh, moe_decode.cu): fp16 rounding by an independent conversion (double arithmetic), the exact
 * dequantized weights, double sums. For every kernel set this CPU runs: the prepared activations bit for
 * bit, the row kernels and one token's experts to ~1e-6 relative; 4- and 8-bit rows, several group sizes,
 * odd top-k counts.
 */
#include <math.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/experts_token.h"
#include "backend/cpu/fdot.h"
#include "base/dtype.h"

static uint32_t rng_state = 2024;
static uint32_t next_u32(void) { return rng_state = rng_state * 1664525u + 1013904223u; }
static float frand(void) { return (float)((next_u32() >> 8) & 0xffffff) / 8388608.0f - 1.0f; } /* [-1, 1) */

/* ---- the reference -------------------------------------------------------------------------------- */

/* fp16 round-to-nearest-even of v (|v| < 65504), in double: subnormals below 2^-14 (quantum 2^-24), else
 * 11 significant bits. */
static float ref_f16(float v)
{
    const double a = fabs((double)v);
    if (a == 0.0)
        return v;
    int e;
    frexp(a, &e); /* a = m · 2^e, m in [0.5, 1) */
    const double quantum = a < 0x1p-14 ? 0x1p-24 : ldexp(1.0, e - 11);
    const double r = nearbyint(a / quantum) * quantum; /* ties to even (the default rounding mode) */
    return (float)(v < 0 ? -r : r);
}

/* The power of two mma_gemv.cuh's mg_x_scale picks for x [n]. */
static float ref_scale(const float *x, int n)
{
    float m = 0.0f;
    for (int i = 0; i < n; i++)
        m = fmaxf(m, fabsf(x[i]));
    float k = 1.0f;
    while (m * k > 16384.0f)
        k *= 0.5f;
    return k;
}

/* The GPU's view of x [n] for 4-bit rows: the effective values x' (column order) and the group sums as
 * mg_group_sums forms them from the fed fp16 values (fp32). Returns k. */
static float ref_prep_q4(const float *x, int n, int group, float *xp, float *xs)
{
    const float k = ref_scale(x, n);
    for (int c = 0; c < n; c++)
        xp[c] = c % 2 ? 16.0f * ref_f16(x[c] * k * 0.0625f) : ref_f16(x[c] * k);
    for (int g = 0; g < n / group; g++) {
        float s = 0.0f;
        for (int i = g * group; i < (g + 1) * group; i += 8) {
            const float *f = xp + i; /* fed values: f[odd] = x' / 16 */
            const float e = ((f[0] + f[4]) + f[2]) + f[6];
            const float o = ((f[1] / 16 + f[5] / 16) + f[3] / 16) + f[7] / 16;
            s += e + 16.0f * o;
        }
        xs[g] = s;
    }
    return k;
}

/* fdot.h's stored layout of 4-bit x' (fed values: odd columns / 16), for the bitwise comparison. */
static void ref_layout_q4(const float *xp, int n, float *xe)
{
    for (int c = 0; c < n; c++)
        xe[(c / 32) * 32 + (c % 2) * 16 + (c % 32) / 2] = c % 2 ? xp[c] / 16 : xp[c];
}

/* A quantized [E, rows, cols] stack (MLX affine, bf16 scales and biases) and its exact dequantized values. */
typedef struct {
    lily_tensor t;
    uint8_t *bytes;
    uint16_t *scales, *biases;
    double *dense;
} qstack;

static qstack make_stack(int E, int rows, int cols, int bits, int group)
{
    qstack q;
    memset(&q, 0, sizeof q);
    const int64_t prow = (int64_t)E * rows, rb = (int64_t)cols * bits / 8, ng = cols / group;
    q.bytes = calloc((size_t)(prow * rb), 1);
    q.scales = calloc((size_t)(prow * ng), 2);
    q.biases = calloc((size_t)(prow * ng), 2);
    q.dense = calloc((size_t)(prow * cols), sizeof(double));
    assert_non_null(q.bytes);
    assert_non_null(q.scales);
    assert_non_null(q.biases);
    assert_non_null(q.dense);
    for (int64_t r = 0; r < prow; r++) {
        for (int64_t g = 0; g < ng; g++) { /* negative scales are legal (MODEL.md §3) */
            q.scales[r * ng + g] = lily_f32_to_bf16((g + r) % 2 ? -0.03f * (1.1f + frand()) : 0.02f * (1.5f + frand()));
            q.biases[r * ng + g] = lily_f32_to_bf16(0.3f * frand());
        }
        for (int c = 0; c < cols; c++) {
            const unsigned v = (next_u32() >> 24) & ((1u << bits) - 1u);
            if (bits == 4)
                q.bytes[r * rb + c / 2] |= (uint8_t)(v << (4 * (c % 2)));
            else
                q.bytes[r * rb + c] = (uint8_t)v;
            q.dense[r * cols + c] = (double)lily_bf16_to_f32(q.scales[r * ng + c / group]) * v +
                                    (double)lily_bf16_to_f32(q.biases[r * ng + c / group]);
        }
    }
    lily_tensor *t = &q.t;
    t->name = "test.experts";
    t->data = q.bytes;
    t->dtype = LILY_DTYPE_U32;
    t->ndim = 3;
    t->shape[0] = E;
    t->shape[1] = rows;
    t->shape[2] = cols;
    t->bits = bits;
    t->group_size = group;
    t->scales = q.scales;
    t->biases = q.biases;
    t->scale_dtype = LILY_DTYPE_BF16;
    t->expert_stride = rows;
    t->row_bytes = rb;
    t->scale_row_bytes = ng * 2;
    return q;
}

static void free_stack(qstack *q)
{
    free(q->bytes);
    free(q->scales);
    free(q->biases);
    free(q->dense);
}

/* Row r of expert e times x' in double, as Σ_c w_c x'_c, except that the bias terms take the GPU's fp32
 * group sums S_g (b_g S_g): the value the kernels approximate. *mag = Σ |w_c x'_c| + Σ |b_g S_g|. */
static double ref_row(const qstack *q, int e, int r, const float *xp, const float *xs, double *mag)
{
    const lily_tensor *t = &q->t;
    const int cols = (int)t->shape[2], group = (int)t->group_size, ng = cols / group;
    const int64_t row = (int64_t)e * t->shape[1] + r;
    const double *w = q->dense + row * cols;
    double acc = 0.0, m = 0.0;
    for (int g = 0; g < ng; g++) {
        const double b = lily_bf16_to_f32(q->biases[row * ng + g]);
        for (int c = g * group; c < (g + 1) * group; c++) {
            const double p = (w[c] - b) * xp[c];
            acc += p;
            m += fabs(p);
        }
        acc += b * xs[g];
        m += fabs(b * xs[g]);
    }
    *mag = m;
    return acc;
}

/* The reference's view of x for rows of t: x' and S (4-bit with fp16 inputs: ref_prep_q4; else x in fp32,
 * S in column order); returns k. */
static float ref_prep(const lily_tensor *t, bool fp16, const float *x, int n, float *xp, float *xs)
{
    const int group = (int)t->group_size;
    if (t->bits == 4 && fp16)
        return ref_prep_q4(x, n, group, xp, xs);
    for (int g = 0; g < n / group; g++) {
        float s = 0.0f;
        for (int c = g * group; c < (g + 1) * group; c++) {
            xp[c] = x[c];
            s += x[c];
        }
        xs[g] = s;
    }
    return 1.0f;
}

/* Activations with what the rounding must get right: values past 2^14 (so k < 1), values that land in
 * fp16's subnormal range at even and at odd columns (where odd ones lose 4 more bits), exact ties between
 * two fp16 values, and zeros. */
static void fill_x(float *x, int n, float amp)
{
    for (int c = 0; c < n; c++) {
        const int kind = (int)(next_u32() >> 28);
        float v = amp * frand();
        if (kind == 0)
            v = 3e-6f * frand(); /* fp16 subnormal (odd columns: below 2^-10 / 16 after the / 16) */
        else if (kind == 1)
            v = 1e-8f * frand();
        else if (kind == 2) /* a tie: 1 + (2j + 1) 2^-11, times a power of two */
            v = ldexpf(1.0f + (float)(2 * (int)(next_u32() >> 24) % 1024 + 1) * 0x1p-11f, (int)(next_u32() >> 29) - 4);
        else if (kind == 3)
            v = 0.0f;
        x[c] = v;
    }
}

/* ---- tests ---------------------------------------------------------------------------------------- */

/* The independent fp16 rounding agrees with the library's portable one (so either may serve below). */
static void test_reference_fp16_rounding(void **state)
{
    (void)state;
    for (int i = 0; i < 200000; i++) {
        /* exponents 2^-25 .. 2^15 (every fourth value 2^-25 .. 2^-10: the subnormal edge), any sign and fraction */
        const uint32_t r = next_u32(), e = i % 4 ? 102 + r % 41 : 102 + r % 16;
        const uint32_t u = (next_u32() & 0x807fffffu) | e << 23;
        float v;
        memcpy(&v, &u, 4);
        if (fabsf(v) > 65504.0f)
            continue;
        const float a = ref_f16(v), b = lily_f16_to_f32(lily_f32_to_f16(v));
        if (memcmp(&a, &b, 4) != 0)
            fail_msg("fp16(%a): reference %a, dtype.h %a", (double)v, (double)a, (double)b);
    }
}

/* Every set's prep_q4 writes the reference's values, bit for bit, and its x scale. */
static void test_prep_q4_bitwise(void **state)
{
    (void)state;
    const cpu_fdot_kernels *sets[CPU_FDOT_MAX_SETS];
    const int n_sets = cpu_fdot_available(sets);
    enum { N = 2048 };
    static float x[N], xp[N], xs[N / 32], want[N], got[N], gs[N / 32];
    const float amps[4] = {1.0f, 300.0f, 40000.0f, 3e7f};
    const int groups[3] = {32, 64, 128};
    for (int a = 0; a < 4; a++)
        for (int gi = 0; gi < 3; gi++) {
            const int n = a % 2 ? N : 512, group = groups[gi];
            fill_x(x, n, amps[a]);
            const float k = ref_prep_q4(x, n, group, xp, xs);
            ref_layout_q4(xp, n, want);
            for (int s = 0; s < n_sets; s++) {
                const float kk = sets[s]->prep_q4(x, n, group, got, gs);
                if (kk != k)
                    fail_msg("%s: x scale %g, want %g", sets[s]->name, (double)kk, (double)k);
                for (int c = 0; c < n; c++)
                    if (memcmp(&got[c], &want[c], 4) != 0)
                        fail_msg("%s: amp %g: stored value %d = %a, want %a", sets[s]->name, (double)amps[a], c,
                                 (double)got[c], (double)want[c]);
                for (int g = 0; g < n / group; g++)
                    if (memcmp(&gs[g], &xs[g], 4) != 0)
                        fail_msg("%s: group sum %d = %a, want %a", sets[s]->name, g, (double)gs[g], (double)xs[g]);
            }
        }
    /* a scale: max |x| = 40000 needs k = 1/4 (40000 / 2 > 2^14, 40000 / 4 <= 2^14); 2^14 itself keeps 1 */
    assert_true(cpu_fdot_x_scale(40000.0f) == 0.25f);
    assert_true(cpu_fdot_x_scale(16384.0f) == 1.0f);
    assert_true(cpu_fdot_x_scale(NAN) == 1.0f);
}

/* Every set's row kernels against the reference: |got − want| <= 1e-6 · Σ|terms| per row. */
static void test_rows_match_reference(void **state)
{
    (void)state;
    const cpu_fdot_kernels *sets[CPU_FDOT_MAX_SETS];
    const int n_sets = cpu_fdot_available(sets);
    const int shapes[][3] = {{4, 2048, 64}, {4, 512, 64}, {4, 256, 32}, {4, 384, 128}, {4, 1344, 32}, {8, 2048, 64},
                             {8, 512, 32}, {8, 1344, 32}};
    enum { ROWS = 38 }; /* rows 3 .. 37 of expert 1: an offset start, an odd count */
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int bits = shapes[si][0], cols = shapes[si][1], group = shapes[si][2];
        qstack q = make_stack(2, ROWS, cols, bits, group);
        float *x = malloc(cols * sizeof(float)), *xp = malloc(cols * sizeof(float)), *xs = malloc(cols / 32 * sizeof(float));
        float *xe = malloc(cols * sizeof(float)), *ks = malloc(cols / 32 * sizeof(float));
        assert_true(x && xp && xs && xe && ks);
        fill_x(x, cols, 50.0f);
        const float k = ref_prep(&q.t, true, x, cols, xp, xs);
        for (int s = 0; s < n_sets; s++) {
            if (bits == 4)
                assert_true(sets[s]->prep_q4(x, cols, group, xe, ks) == k);
            else
                cpu_fdot_prep_q8(x, cols, group, xe, ks);
            float out[ROWS];
            const int64_t sbs = cols / group;
            const cpu_fdot_rows_fn fn = bits == 4 ? sets[s]->rows_q4 : sets[s]->rows_q8;
            fn(q.bytes + (ROWS + 3) * q.t.row_bytes, q.t.row_bytes, q.scales + (ROWS + 3) * sbs, q.biases + (ROWS + 3) * sbs,
               sbs, ROWS - 3, group, xe, ks, cols, out);
            double worst = 0.0;
            for (int r = 3; r < ROWS; r++) {
                double mag;
                const double want = ref_row(&q, 1, r, xp, xs, &mag);
                worst = fmax(worst, fabs(out[r - 3] - want) / mag);
            }
            if (!(worst <= 1e-6))
                fail_msg("%s: %d-bit cols %d group %d: error %.3g of Σ|terms|", sets[s]->name, bits, cols, group, worst);
        }
        free(x), free(xp), free(xs), free(xe), free(ks);
        free_stack(&q);
    }
}

/* Relative L2 distance of got [n] from want [n]. */
static double rel_l2(const float *got, const double *want, int n)
{
    double num = 0.0, den = 0.0;
    for (int i = 0; i < n; i++) {
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    return sqrt(num / den);
}

/* One token's experts (cpu_experts_token_run, CPU_EXPERTS_CUDA_ROUNDING) for every set against the
 * reference: silu(gate x) ⊙ (up x) of each slot from the reference's x' (rel. L2 <= 1e-6), and the output
 * from the run's own silu ⊙ up fed to down the GPU's way (rel. L2 <= 1e-6). Odd top-k counts, ids in any
 * order, 4- and 8-bit stacks; amp: the activations' size (large ones make the x scales < 1); fp16: the
 * tensor-core path's inputs (else fp32 inputs, moe_route.cu's path). */
static void check_token(int gbits, int ggroup, int dbits, int dgroup, int top_k, int k_run, float amp, bool fp16)
{
    enum { E = 9, H = 512, I = 128 };
    qstack gate = make_stack(E, I, H, gbits, ggroup), up = make_stack(E, I, H, gbits, ggroup);
    qstack down = make_stack(E, H, I, dbits, dgroup);
    assert_true(cpu_experts_token_ok(&gate.t, &up.t, &down.t, H, I));
    const cpu_fdot_kernels *sets[CPU_FDOT_MAX_SETS];
    const int n_sets = cpu_fdot_available(sets);
    lily_error err;
    cpu_experts_token *tok;
    assert_int_equal(cpu_experts_token_create(H, I, top_k, 3, CPU_EXPERTS_CUDA_ROUNDING, &tok, &err), LILY_OK);
    float x[H], xp[H], xs[H / 32], got[H], w[16];
    int ids[16];
    fill_x(x, H, amp);
    for (int i = 0; i < k_run; i++) { /* distinct ids in no particular order */
        ids[i] = (7 * i + 5) % E;
        w[i] = 0.1f + 0.05f * (float)i;
    }
    const float kx = ref_prep(&gate.t, fp16, x, H, xp, xs);
    int order[16]; /* slots by ascending id */
    for (int i = 0; i < k_run; i++)
        order[i] = i;
    for (int i = 1; i < k_run; i++)
        for (int j = i; j > 0 && ids[order[j - 1]] > ids[order[j]]; j--) {
            const int tmp = order[j];
            order[j] = order[j - 1];
            order[j - 1] = tmp;
        }
    double hid_want[16 * I];
    for (int j = 0; j < k_run; j++)
        for (int r = 0; r < I; r++) {
            double mag;
            const double g = ref_row(&gate, ids[order[j]], r, xp, xs, &mag) / kx;
            const double u = ref_row(&up, ids[order[j]], r, xp, xs, &mag) / kx;
            hid_want[j * I + r] = g / (1.0 + exp(-g)) * u;
        }
    for (int s = 0; s < n_sets; s++) {
        cpu_experts_token_set_kernels(tok, sets[s]);
        for (int i = 0; i < H; i++)
            got[i] = NAN; /* poison */
        cpu_experts_token_run(tok, &gate.t, &up.t, &down.t, fp16, x, k_run, ids, w, got);
        const float *hid = cpu_experts_token_hid(tok);
        const double eh = rel_l2(hid, hid_want, k_run * I);
        if (!(eh <= 1e-6))
            fail_msg("%s: silu(gate) ⊙ up: relative L2 error %.3g", sets[s]->name, eh);
        double want[H];
        memset(want, 0, sizeof want);
        for (int j = 0; j < k_run; j++) {
            float hp[I], hs[I / 32];
            const float kh = ref_prep(&down.t, fp16, hid + j * I, I, hp, hs);
            for (int r = 0; r < H; r++) {
                double mag;
                want[r] += (double)w[order[j]] * ref_row(&down, ids[order[j]], r, hp, hs, &mag) / kh;
            }
        }
        const double eo = rel_l2(got, want, H);
        if (!(eo <= 1e-6))
            fail_msg("%s: %d-bit/%d-bit, k %d: output relative L2 error %.3g", sets[s]->name, gbits, dbits, k_run, eo);
    }
    cpu_experts_token_destroy(tok);
    free_stack(&gate);
    free_stack(&up);
    free_stack(&down);
}

static void test_token_q4(void **state)
{
    (void)state;
    check_token(4, 64, 4, 64, 8, 8, 4.0f, true);
    check_token(4, 64, 4, 64, 8, 3, 300.0f, true); /* silu(g) ⊙ u past 2^14: each slot's own down scale */
    check_token(4, 32, 4, 128, 5, 5, 40000.0f, true); /* x past 2^14 too */
    check_token(4, 64, 4, 64, 7, 1, 4.0f, true);
    check_token(4, 64, 4, 64, 5, 5, 300.0f, false); /* the GPU's fp32 path (moe_route.cu) */
}

static void test_token_q8_and_mixed(void **state)
{
    (void)state;
    check_token(8, 64, 8, 64, 3, 3, 4.0f, true);
    check_token(4, 64, 8, 32, 9, 7, 300.0f, true);
    check_token(8, 128, 4, 64, 5, 5, 300.0f, true);
    check_token(8, 64, 4, 32, 3, 3, 4.0f, false);
}

/* What the path refuses: other scale dtypes, groups not a multiple of 32, shapes that do not chain. */
static void test_token_ok_and_create_limits(void **state)
{
    (void)state;
    qstack gate = make_stack(2, 64, 128, 4, 64), up = make_stack(2, 64, 128, 4, 64), down = make_stack(2, 128, 64, 4, 64);
    assert_true(cpu_experts_token_ok(&gate.t, &up.t, &down.t, 128, 64));
    assert_false(cpu_experts_token_ok(&gate.t, &up.t, &down.t, 128, 128));
    up.t.scale_dtype = LILY_DTYPE_F16;
    assert_false(cpu_experts_token_ok(&gate.t, &up.t, &down.t, 128, 64));
    lily_error err;
    cpu_experts_token *tok = NULL;
    assert_int_equal(cpu_experts_token_create(100, 64, 4, 1, CPU_EXPERTS_CUDA_ROUNDING, &tok, &err),
                     LILY_ERR_INVALID_ARGUMENT);
    assert_null(tok);
    assert_int_equal(cpu_experts_token_create(128, 64, 65, 1, CPU_EXPERTS_CUDA_ROUNDING, &tok, &err),
                     LILY_ERR_INVALID_ARGUMENT);
    free_stack(&gate);
    free_stack(&up);
    free_stack(&down);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_fp16_rounding),
        cmocka_unit_test(test_prep_q4_bitwise),
        cmocka_unit_test(test_rows_match_reference),
        cmocka_unit_test(test_token_q4),
        cmocka_unit_test(test_token_q8_and_mixed),
        cmocka_unit_test(test_token_ok_and_create_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
