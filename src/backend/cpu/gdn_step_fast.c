/* gdn_step_fast.c — the gated delta rule's recurrent form in fast mode (MODEL.md §4.4 step 7), one token at
 * a time in two passes over the [dk, dv] state instead of four, on 8-wide vectors (GCC/Clang vector
 * extensions: AVX2 or SSE pairs on x86-64, NEON pairs on AArch64).
 *
 * Per token t with decay γ = exp(g_t): kv[b] = γ Σ_a S[a][b] k[a];  δ[b] = β (v[b] - kv[b]);
 * S[a][b] ← γ S[a][b] + k[a] δ[b];  o[b] = Σ_a S[a][b] q[a]  — the reference's steps with the decay folded
 * into the first sum and the update fused with the output (fp32; the rounding differs from exact mode's).
 * Each value column b of the state is independent of the others (its own kv, δ and o), so the columns can
 * be split over threads with no change to any bit.
 */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"

typedef float v8f __attribute__((vector_size(32)));
typedef float v16f __attribute__((vector_size(64)));

/* Unaligned 8-float load / store (macros: a function returning a 32-byte vector would warn of the AVX ABI). */
#define LOAD8(dst, p) memcpy(&(dst), (p), sizeof(v8f))
#define STORE8(p, v) memcpy((p), &(v), sizeof(v8f))
#define LOADV(dst, p) memcpy(&(dst), (p), sizeof(dst))
#define STOREV(p, v) memcpy((p), &(v), sizeof(v))

bool cpu_gdn_fast_step_ok(int dv) { return dv % 8 == 0 && dv <= CPU_GDN_FAST_MAX_DV; }

/* Columns [b, b + W NB) of both passes, NB vectors of W lanes (VT) at a time: NB independent accumulators
 * per sum, so the adds of successive rows a overlap instead of waiting on one another. Each lane's
 * operations are the same for any W and NB. */
#define GDN_PASS1(VT, W, NB)                                                                           \
    do {                                                                                               \
        VT kv[NB] = {0}, s;                                                                            \
        for (int a = 0; a < dk; a++)                                                                   \
            for (int i = 0; i < NB; i++) {                                                             \
                LOADV(s, state + (int64_t)a * dv + b + W * i);                                         \
                kv[i] += s * kt[a];                                                                    \
            }                                                                                          \
        for (int i = 0; i < NB; i++) {                                                                 \
            VT vv;                                                                                     \
            LOADV(vv, vt + b + W * i);                                                                 \
            const VT d = (vv - kv[i] * decay) * bt;                                                    \
            STOREV(delta + b + W * i, d);                                                              \
        }                                                                                              \
    } while (0)

#define GDN_PASS2(VT, W, NB)                                                                           \
    do {                                                                                               \
        VT d[NB], acc[NB] = {0}, s;                                                                    \
        for (int i = 0; i < NB; i++)                                                                   \
            LOADV(d[i], delta + b + W * i);                                                            \
        for (int a = 0; a < dk; a++)                                                                   \
            for (int i = 0; i < NB; i++) {                                                             \
                float *row = state + (int64_t)a * dv + b + W * i;                                      \
                LOADV(s, row);                                                                         \
                s = s * decay + d[i] * kt[a];                                                          \
                STOREV(row, s);                                                                        \
                acc[i] += s * qt[a];                                                                   \
            }                                                                                          \
        for (int i = 0; i < NB; i++)                                                                   \
            STOREV(o + b + W * i, acc[i]);                                                             \
    } while (0)

/* Tokens ahead whose q, k, v and output rows are prefetched: those rows were written by other threads'
 * tasks of the step before (other cores' caches), and a token's work is a few hundred cycles. */
#define GDN_PREFETCH_AHEAD 2

/* Also built for AVX-512 (x86-64-v4: the 16-lane vectors in one register each), every clone the same IEEE
 * operations per lane with no multiply-add fused (fp-contract off), so the same values. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define GDN_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default"), optimize("fp-contract=off")))
#else
#define GDN_CLONES CPU_VEC8_CLONES
#endif
GDN_CLONES void cpu_gdn_delta_rule_recurrent_fast_cols(const float *q, const float *k, int qk_stride, const float *v,
                                                       int v_stride, const float *g, const float *beta, int gb_stride,
                                                       int n, int dk, int dv, int col0, int col1, float *state,
                                                       float *out, int out_stride)
{
    float delta[CPU_GDN_FAST_MAX_DV];
    for (int t = 0; t < n; t++) {
        const float *qt = q + (int64_t)t * qk_stride, *kt = k + (int64_t)t * qk_stride;
        const float *vt = v + (int64_t)t * v_stride;
        const float decay = expf(g[(int64_t)t * gb_stride]), bt = beta[(int64_t)t * gb_stride];
        float *o = out + (int64_t)t * out_stride;
        if (t + GDN_PREFETCH_AHEAD < n) { /* each token's rows are a page apart: no hardware prefetch */
            const int64_t r = (int64_t)(t + GDN_PREFETCH_AHEAD);
            for (int a = 0; a < dk; a += 16) {
                __builtin_prefetch(q + r * qk_stride + a);
                __builtin_prefetch(k + r * qk_stride + a);
            }
            for (int c = col0; c < col1; c += 16) {
                __builtin_prefetch(v + r * v_stride + c);
                __builtin_prefetch(out + r * out_stride + c, 1);
            }
        }
        int b = col0;
        for (; b + 64 <= col1; b += 64)
            GDN_PASS1(v16f, 16, 4);
        for (; b + 32 <= col1; b += 32)
            GDN_PASS1(v8f, 8, 4);
        for (; b + 16 <= col1; b += 16)
            GDN_PASS1(v8f, 8, 2);
        for (; b < col1; b += 8)
            GDN_PASS1(v8f, 8, 1);
        for (b = col0; b + 64 <= col1; b += 64)
            GDN_PASS2(v16f, 16, 4);
        for (; b + 32 <= col1; b += 32)
            GDN_PASS2(v8f, 8, 4);
        for (; b + 16 <= col1; b += 16)
            GDN_PASS2(v8f, 8, 2);
        for (; b < col1; b += 8)
            GDN_PASS2(v8f, 8, 1);
    }
}

void cpu_gdn_delta_rule_recurrent_fast(const float *q, const float *k, int qk_stride, const float *v, int v_stride,
                                       const float *g, const float *beta, int gb_stride, int n, int dk, int dv,
                                       float *state, float *out, int out_stride)
{
    cpu_gdn_delta_rule_recurrent_fast_cols(q, k, qk_stride, v, v_stride, g, beta, gb_stride, n, dk, dv, 0, dv, state, out,
                                           out_stride);
}
