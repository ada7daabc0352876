/* gdn_step_fast.c — the gated delta rule's recurrent form in fast mode (MODEL.md §4.4 step 7), one token at
 * a time in two passes over the [dk, dv] state instead of four, on 8-wide vectors (GCC/Clang vector
 * extensions: AVX2 or SSE pairs on x86-64, NEON pairs on AArch64).
 *
 * Per token t with decay γ = exp(g_t): kv[b] = γ Σ_a S[a][b] k[a];  δ[b] = β (v[b] - kv[b]);
 * S[a][b] ← γ S[a][b] + k[a] δ[b];  o[b] = Σ_a S[a][b] q[a]  — the reference's steps with the decay folded
 * into the first sum and the update fused with the output (fp32; the rounding differs from exact mode's).
 */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"

typedef float v8f __attribute__((vector_size(32)));

/* Unaligned 8-float load / store (macros: a function returning a 32-byte vector would warn of the AVX ABI). */
#define LOAD8(dst, p) memcpy(&(dst), (p), sizeof(v8f))
#define STORE8(p, v) memcpy((p), &(v), sizeof(v8f))

bool cpu_gdn_fast_step_ok(int dv) { return dv % 8 == 0 && dv <= CPU_GDN_FAST_MAX_DV; }

/* Columns [b, b + 8 NB) of both passes, NB (1 or 4) vectors at a time: NB independent accumulators per
 * sum, so the adds of successive rows a overlap instead of waiting on one another. Each lane's operations
 * are the same for either NB. */
#define GDN_PASS1(NB)                                                                                  \
    do {                                                                                               \
        v8f kv[NB] = {0}, s;                                                                           \
        for (int a = 0; a < dk; a++)                                                                   \
            for (int i = 0; i < NB; i++) {                                                             \
                LOAD8(s, state + (int64_t)a * dv + b + 8 * i);                                         \
                kv[i] += s * kt[a];                                                                    \
            }                                                                                          \
        for (int i = 0; i < NB; i++) {                                                                 \
            v8f vv;                                                                                    \
            LOAD8(vv, vt + b + 8 * i);                                                                 \
            const v8f d = (vv - kv[i] * decay) * bt;                                                   \
            STORE8(delta + b + 8 * i, d);                                                              \
        }                                                                                              \
    } while (0)

#define GDN_PASS2(NB)                                                                                  \
    do {                                                                                               \
        v8f d[NB], acc[NB] = {0}, s;                                                                   \
        for (int i = 0; i < NB; i++)                                                                   \
            LOAD8(d[i], delta + b + 8 * i);                                                            \
        for (int a = 0; a < dk; a++)                                                                   \
            for (int i = 0; i < NB; i++) {                                                             \
                float *row = state + (int64_t)a * dv + b + 8 * i;                                      \
                LOAD8(s, row);                                                                         \
                s = s * decay + d[i] * kt[a];                                                          \
                STORE8(row, s);                                                                        \
                acc[i] += s * qt[a];                                                                   \
            }                                                                                          \
        for (int i = 0; i < NB; i++)                                                                   \
            STORE8(o + b + 8 * i, acc[i]);                                                             \
    } while (0)

CPU_VEC8_CLONES void cpu_gdn_delta_rule_recurrent_fast(const float *q, const float *k, int qk_stride, const float *v, int v_stride,
                                       const float *g, const float *beta, int gb_stride, int n, int dk, int dv,
                                       float *state, float *out, int out_stride)
{
    float delta[CPU_GDN_FAST_MAX_DV];
    for (int t = 0; t < n; t++) {
        const float *qt = q + (int64_t)t * qk_stride, *kt = k + (int64_t)t * qk_stride;
        const float *vt = v + (int64_t)t * v_stride;
        const float decay = expf(g[(int64_t)t * gb_stride]), bt = beta[(int64_t)t * gb_stride];
        float *o = out + (int64_t)t * out_stride;
        int b = 0;
        for (; b + 32 <= dv; b += 32)
            GDN_PASS1(4);
        for (; b < dv; b += 8)
            GDN_PASS1(1);
        for (b = 0; b + 32 <= dv; b += 32)
            GDN_PASS2(4);
        for (; b < dv; b += 8)
            GDN_PASS2(1);
    }
}
