/* sample_select.cu — the device sampler of sampling.cuh: prep, the top-k / top-p rank cuts, the draw.
 *
 * The math is runtime/sampler.c's, operation for operation where a token could depend on it: the
 * penalized logit x and the scaled logit z = x * (1 / T) use the same IEEE operations (explicitly
 * rounded intrinsics, so --use_fast_math contracts nothing), so the candidates' z and the Gumbel noise
 * of base/philox.h are the host's bit for bit; the cut masses use exp(z - max) summed in 2^-40 fixed
 * point (deterministic whatever the order of the atomics), where the host sums doubles.
 */
#include "sampling.cuh"

#include <math.h>

#include "base/philox.h"

#define SAMPLE_BLOCK 256
#define SAMPLE_MAX_GRID 256
#define SAMPLE_PER_THREAD 8
#define BINS1 1280          /* 1/32-nat bins over the 40 nats below the max (sampler.c's NEGLIGIBLE) */
#define BINS2 1024          /* sub-bins of one bin */
#define GATHER_DIRECT 256   /* a bin with at most this many tokens is ranked without sub-bins */
#define GATHER_CAP 1024     /* the most tokens ranked exactly in one cut; more (ties within 3e-5 nat): all kept */
#define NEGLIGIBLE_NATS 40.0f
#define MASS_ONE 1099511627776.0 /* 2^40: fixed-point unit of a weight exp(z - max) <= 1 */

enum { CUT_TOP_K = 0, CUT_TOP_P = 1 };

struct sample_control {
    unsigned int z_max_key;      /* ordered key of max z (0: none yet) */
    unsigned int raw_max_key;    /* ordered key of the max raw logit */
    unsigned int nonfinite;
    int mask_state;              /* this step's mask: 0 none (or released by an abort), 1 the bits, 2 timed out */
    unsigned int done[4];        /* blocks finished per kernel (hist1, hist2, gather, draw) */
    unsigned int count1[BINS1];
    unsigned long long mass1[BINS1];
    unsigned int count2[BINS2];
    unsigned long long mass2[BINS2];
    /* the cut being located */
    int active, use_sub, bin1, bin2;
    unsigned int need_count, before_count;
    double need_mass;
    unsigned long long before_mass;
    unsigned int n_gather, gather_min_key;
    float gather_z[GATHER_CAP];
    int gather_id[GATHER_CAP];
    /* the cuts found: a token is kept when (z, -id) >= (cut_z, -cut_id) */
    int cut_set[2];
    float cut_z[2];
    int cut_id[2];
    unsigned long long lse_mass; /* sum of exp(raw - raw max), fixed point */
    double best_key[SAMPLE_MAX_GRID];
    int best_id[SAMPLE_MAX_GRID];
    unsigned long long top_keys[SAMPLE_MAX_GRID * LILY_TOP_LOGPROBS_MAX];
};

/* What every kernel of a step reads (by value). */
struct sample_step {
    const float *logits;
    int vocab;
    sample_workspace ws;
    float inv_t;          /* 1 / temperature, rounded as the host rounds it */
    int argmax_mode;      /* greedy or top_k 1: the argmax of the penalized logits */
    int top_k;            /* > 0: the top-k cut runs */
    float top_p;          /* < 1: the top-p cut runs */
    float log_min_p;      /* logf(min_p) as the host computes it; -inf when min_p is 0 */
    float presence, frequency, repetition;
    int penalties, has_bias;
    unsigned long long seed, draw0;
    int top_logprobs;     /* < 0: none */
    int masked;           /* constrained decoding: the wait kernel ran, ctl->mask_state says what applies */
    sample_args a;
};

__device__ __forceinline__ unsigned int ordered_key(float v)
{
    const unsigned int u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float ordered_value(unsigned int k)
{
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* (z, id) ranks at or before (cz, cid): larger z first, then the lower id (sampler.c's ranks_before). */
__device__ __forceinline__ bool at_or_before(float z, int id, float cz, int cid)
{
    return z > cz || (z == cz && id <= cid);
}

/* The fixed-point weight of z below the max m: exp(z - m) in units of 2^-40. */
__device__ __forceinline__ unsigned long long weight_of(float z, float m)
{
    return (unsigned long long)((double)__expf(z - m) * MASS_ONE);
}

/* The 1/32-nat bin of z below m, and the position inside it (monotone in z). */
__device__ __forceinline__ float bin_distance(float z, float m) { return __fmul_rn(__fsub_rn(m, z), 32.0f); }
__device__ __forceinline__ int bin1_of(float d) { return d < (float)(BINS1 - 1) ? (int)d : BINS1 - 1; }
__device__ __forceinline__ int bin2_of(float d, int b1)
{
    const float f = __fmul_rn(__fsub_rn(d, (float)b1), (float)BINS2);
    return f < (float)(BINS2 - 1) ? (f > 0.0f ? (int)f : 0) : BINS2 - 1;
}

/* Whether token (z, id) passes the cuts found so far. */
__device__ __forceinline__ bool passes_cuts(const sample_control *c, float z, int id, int upto)
{
    for (int k = 0; k < upto; k++)
        if (c->cut_set[k] && !at_or_before(z, id, c->cut_z[k], c->cut_id[k]))
            return false;
    return true;
}

template <typename T> __device__ __forceinline__ T block_sum(T v, T *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    T t = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++)
        t += red[w];
    return t;
}

__device__ __forceinline__ unsigned int block_max_u32(unsigned int v, unsigned int *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    unsigned int t = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++)
        t = max(t, red[w]);
    return t;
}

__device__ __forceinline__ unsigned long long block_max_u64(unsigned long long v, unsigned long long *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long o2 = __shfl_xor_sync(0xffffffffu, v, o);
        v = o2 > v ? o2 : v;
    }
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    unsigned long long t = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++)
        t = red[w] > t ? red[w] : t;
    return t;
}

/* True in every thread of the block that finished last (its earlier writes visible to it). */
__device__ __forceinline__ bool last_block(unsigned int *done)
{
    __shared__ bool s_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        s_last = atomicAdd(done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (s_last)
        __threadfence();
    return s_last;
}

/* ---- the mask ------------------------------------------------------------------------------------- */

__device__ __forceinline__ unsigned long long global_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* One thread: wait until the host published the mask of this step's token (index n_generated), the host
 * aborts, or SAMPLE_MASK_TIMEOUT_NS pass; then say in ctl->mask_state what the prep kernel applies. */
__global__ void sample_mask_wait_kernel(sample_step p)
{
    const sample_mask_channel *ch = p.ws.mask_dev;
    const int want = *p.a.n_generated + 1;
    const unsigned long long t0 = global_ns();
    int state = 1;
    while (ch->published < want) {
        if (ch->abort) {
            state = 0;
            break;
        }
        if (global_ns() - t0 > SAMPLE_MASK_TIMEOUT_NS) {
            state = 2;
            break;
        }
        __nanosleep(500);
    }
    if (state == 1 && ch->all)
        state = 0;
    __threadfence_system(); /* the bits are read after the count (the host wrote them before it) */
    p.ws.ctl->mask_state = state;
}

/* ---- prep ------------------------------------------------------------------------------------------ */

__global__ void __launch_bounds__(SAMPLE_BLOCK) sample_prep_kernel(sample_step p)
{
    __shared__ unsigned int red[SAMPLE_BLOCK / 32];
    sample_control *c = p.ws.ctl;
    const volatile unsigned int *bits = p.masked && __ldcg(&c->mask_state) == 1 ? p.ws.mask_dev->bits : NULL;
    unsigned int zmax = 0, rmax = 0, bad = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.vocab; i += gridDim.x * blockDim.x) {
        const float raw = p.logits[i];
        bad |= !isfinite(raw);
        float x = bits && !((bits[i >> 5] >> (i & 31)) & 1u) ? -INFINITY : raw;
        if (p.has_bias)
            x = __fadd_rn(x, p.ws.bias[i]);
        if (p.penalties && p.ws.in_context[i]) {
            if (p.repetition != 1.0f)
                x = x > 0.0f ? __fdiv_rn(x, p.repetition) : __fmul_rn(x, p.repetition);
            const unsigned int n = p.ws.counts[i];
            if (n > 0)
                x = __fsub_rn(x, __fadd_rn(p.presence, __fmul_rn(p.frequency, (float)n)));
        }
        float z = p.argmax_mode ? x : __fmul_rn(x, p.inv_t);
        if (z != z)
            z = -INFINITY; /* NaN never wins */
        p.ws.work[i] = z;
        zmax = max(zmax, ordered_key(z));
        rmax = max(rmax, ordered_key(raw == raw ? raw : -INFINITY));
    }
    zmax = block_max_u32(zmax, red);
    rmax = block_max_u32(rmax, red);
    bad = block_max_u32(bad, red);
    if (threadIdx.x == 0) {
        atomicMax(&c->z_max_key, zmax);
        atomicMax(&c->raw_max_key, rmax);
        if (bad)
            atomicOr(&c->nonfinite, 1u);
    }
}

/* ---- the rank cuts --------------------------------------------------------------------------------- */

/* The max z, or NaN when it is not finite (all banned, or +inf): then no cut runs and the draw takes the
 * argmax, as the host does. */
__device__ __forceinline__ float cut_max(const sample_control *c)
{
    const float m = ordered_value(__ldcg(&c->z_max_key));
    return isfinite(m) ? m : __int_as_float(0x7fffffff);
}

/* In the last block: find the first of n bins whose cumulative count (CUT_TOP_K) or mass (CUT_TOP_P)
 * reaches the target; *before_* then hold the totals of the bins before it. Returns the bin, or -1 when no
 * bin reaches it (rounding: everything is kept). */
__device__ int locate_bin(const unsigned int *count, const unsigned long long *mass, int n, int kind,
                          unsigned int need_count, double need_mass, unsigned int *before_count,
                          unsigned long long *before_mass)
{
    __shared__ unsigned int s_cnt[SAMPLE_BLOCK];
    __shared__ unsigned long long s_mass[SAMPLE_BLOCK];
    __shared__ int s_found;
    const int per = (n + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK, t = threadIdx.x;
    unsigned int cnt = 0;
    unsigned long long ms = 0;
    for (int b = t * per; b < min(n, (t + 1) * per); b++) {
        cnt += __ldcg(&count[b]);
        ms += __ldcg(&mass[b]);
    }
    s_cnt[t] = cnt;
    s_mass[t] = ms;
    if (t == 0)
        s_found = n;
    __syncthreads();
    /* inclusive scan over the threads' chunks (Hillis-Steele) */
    for (int o = 1; o < SAMPLE_BLOCK; o <<= 1) {
        const unsigned int c2 = t >= o ? s_cnt[t - o] : 0u;
        const unsigned long long m2 = t >= o ? s_mass[t - o] : 0ull;
        __syncthreads();
        s_cnt[t] += c2;
        s_mass[t] += m2;
        __syncthreads();
    }
    unsigned int cum_c = t > 0 ? s_cnt[t - 1] : 0u;
    unsigned long long cum_m = t > 0 ? s_mass[t - 1] : 0ull;
    for (int b = t * per; b < min(n, (t + 1) * per); b++) {
        const unsigned int bc = __ldcg(&count[b]);
        const unsigned long long bm = __ldcg(&mass[b]);
        const bool reached = kind == CUT_TOP_K ? cum_c + bc >= need_count : (double)(cum_m + bm) >= need_mass;
        if (reached && bc > 0) {
            atomicMin(&s_found, b);
            break;
        }
        cum_c += bc;
        cum_m += bm;
    }
    __syncthreads();
    const int found = s_found;
    if (found < n && found >= t * per && found < (t + 1) * per) {
        unsigned int bc = t > 0 ? s_cnt[t - 1] : 0u;
        unsigned long long bm = t > 0 ? s_mass[t - 1] : 0ull;
        for (int b = t * per; b < found; b++) {
            bc += __ldcg(&count[b]);
            bm += __ldcg(&mass[b]);
        }
        *before_count = bc;
        *before_mass = bm;
    }
    __syncthreads();
    return found < n ? found : -1;
}

/* One block's share of a histogram pass, added into the global bins: level 1 (b1 < 0) bins every token
 * within NEGLIGIBLE_NATS of m that passed the earlier cuts into 1/32-nat bins; level 2 bins those of
 * bin b1 into its sub-bins. s_count / s_mass: the block's shared bins (n of them). */
__device__ void histogram_pass(const sample_step &p, const sample_control *c, int kind, float m, int b1,
                               unsigned int *s_count, unsigned long long *s_mass, int n, unsigned int *count,
                               unsigned long long *mass)
{
    for (int b = threadIdx.x; b < n; b += blockDim.x) {
        s_count[b] = 0;
        s_mass[b] = 0;
    }
    __syncthreads();
    const float floor_z = __fsub_rn(m, NEGLIGIBLE_NATS);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.vocab; i += gridDim.x * blockDim.x) {
        const float z = p.ws.work[i];
        if (!(z >= floor_z))
            continue;
        const float d = bin_distance(z, m);
        if ((b1 >= 0 && bin1_of(d) != b1) || !passes_cuts(c, z, i, kind))
            continue;
        const int b = b1 < 0 ? bin1_of(d) : bin2_of(d, b1);
        atomicAdd(&s_count[b], 1u);
        atomicAdd(&s_mass[b], weight_of(z, m));
    }
    __syncthreads();
    for (int b = threadIdx.x; b < n; b += blockDim.x)
        if (s_count[b]) {
            atomicAdd(&count[b], s_count[b]);
            atomicAdd(&mass[b], s_mass[b]);
        }
}

/* Histogram of the tokens that passed the earlier cuts (cut `kind` is located next), then in the last
 * block: the total, the target and the bin that holds the cut. */
__global__ void __launch_bounds__(SAMPLE_BLOCK) sample_hist1_kernel(sample_step p, int kind)
{
    __shared__ unsigned int s_count[BINS1];
    __shared__ unsigned long long s_mass[BINS1];
    __shared__ unsigned int red_c[SAMPLE_BLOCK / 32];
    __shared__ unsigned long long red_m[SAMPLE_BLOCK / 32];
    sample_control *c = p.ws.ctl;
    const float m = cut_max(c);
    if (m != m)
        return; /* no cut: c->active stays 0 */
    histogram_pass(p, c, kind, m, -1, s_count, s_mass, BINS1, c->count1, c->mass1);
    if (!last_block(&c->done[0]))
        return;
    unsigned int tc = 0;
    unsigned long long tm = 0;
    for (int b = threadIdx.x; b < BINS1; b += blockDim.x) {
        tc += __ldcg(&c->count1[b]);
        tm += __ldcg(&c->mass1[b]);
    }
    tc = block_sum(tc, red_c);
    tm = block_sum(tm, red_m);
    const unsigned int need_count = kind == CUT_TOP_K ? (unsigned int)p.top_k : 0u;
    const double need_mass = kind == CUT_TOP_P ? (double)p.top_p * (double)tm : 0.0;
    __shared__ unsigned int s_bc;
    __shared__ unsigned long long s_bm;
    int bin = -1;
    if (kind == CUT_TOP_P || tc > need_count) /* top-k over fewer tokens than k cuts nothing */
        bin = locate_bin(c->count1, c->mass1, BINS1, kind, need_count, need_mass, &s_bc, &s_bm);
    __syncthreads();
    if (threadIdx.x == 0) {
        c->done[0] = 0;
        c->active = bin >= 0;
        if (bin >= 0) {
            c->bin1 = bin;
            c->need_count = need_count;
            c->need_mass = need_mass;
            c->before_count = s_bc;
            c->before_mass = s_bm;
            c->use_sub = __ldcg(&c->count1[bin]) > GATHER_DIRECT;
        }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < BINS1; b += blockDim.x) {
        c->count1[b] = 0;
        c->mass1[b] = 0;
    }
}

/* Sub-bins of the crowded bin that holds the cut, then (last block) the sub-bin that holds it. */
__global__ void __launch_bounds__(SAMPLE_BLOCK) sample_hist2_kernel(sample_step p, int kind)
{
    __shared__ unsigned int s_count[BINS2];
    __shared__ unsigned long long s_mass[BINS2];
    sample_control *c = p.ws.ctl;
    if (!__ldcg(&c->active) || !__ldcg(&c->use_sub))
        return;
    const float m = cut_max(c);
    histogram_pass(p, c, kind, m, c->bin1, s_count, s_mass, BINS2, c->count2, c->mass2);
    if (!last_block(&c->done[1]))
        return;
    __shared__ unsigned int s_bc;
    __shared__ unsigned long long s_bm;
    const unsigned int bc0 = c->before_count;
    const unsigned long long bm0 = c->before_mass;
    /* the target within the bin: what the bins before it did not reach */
    const int bin = locate_bin(c->count2, c->mass2, BINS2, kind, c->need_count - bc0,
                               c->need_mass - (double)bm0, &s_bc, &s_bm);
    if (threadIdx.x == 0) {
        c->done[1] = 0;
        if (bin >= 0) {
            c->bin2 = bin;
            c->before_count = bc0 + s_bc;
            c->before_mass = bm0 + s_bm;
        } else {
            c->bin2 = BINS2 - 1;
            c->active = 2; /* rounding: keep the whole bin */
        }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < BINS2; b += blockDim.x) {
        c->count2[b] = 0;
        c->mass2[b] = 0;
    }
}

/* The tokens of the final (sub-)bin, then (last block) their exact ranks and the cut token. */
__global__ void __launch_bounds__(SAMPLE_BLOCK) sample_gather_kernel(sample_step p, int kind)
{
    sample_control *c = p.ws.ctl;
    const int active = __ldcg(&c->active);
    if (!active)
        return;
    const float m = cut_max(c);
    const int b1 = c->bin1, b2 = c->bin2, sub = c->use_sub;
    const float floor_z = __fsub_rn(m, NEGLIGIBLE_NATS);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.vocab; i += gridDim.x * blockDim.x) {
        const float z = p.ws.work[i];
        if (!(z >= floor_z))
            continue;
        const float d = bin_distance(z, m);
        if (bin1_of(d) != b1 || (sub && bin2_of(d, b1) != b2) || !passes_cuts(c, z, i, kind))
            continue;
        atomicMin(&c->gather_min_key, ordered_key(z));
        const unsigned int at = atomicAdd(&c->n_gather, 1u);
        if (at < GATHER_CAP) {
            c->gather_z[at] = z;
            c->gather_id[at] = i;
        }
    }
    if (!last_block(&c->done[2]))
        return;
    __shared__ unsigned int s_pick;
    const unsigned int n = __ldcg(&c->n_gather);
    if (threadIdx.x == 0)
        s_pick = 0xffffffffu;
    __syncthreads();
    if (n <= GATHER_CAP && active == 1) {
        const unsigned int need_c = c->need_count - c->before_count;
        const double need_m = c->need_mass - (double)c->before_mass;
        for (unsigned int j = threadIdx.x; j < n; j += blockDim.x) {
            const float zj = __ldcg(&c->gather_z[j]);
            const int ij = __ldcg(&c->gather_id[j]);
            unsigned int rank = 0;
            unsigned long long before = 0;
            for (unsigned int l = 0; l < n; l++) {
                const float zl = __ldcg(&c->gather_z[l]);
                const int il = __ldcg(&c->gather_id[l]);
                if (zl > zj || (zl == zj && il < ij)) {
                    rank++;
                    before += weight_of(zl, m);
                }
            }
            const bool reached = kind == CUT_TOP_K ? rank + 1 >= need_c
                                                   : (double)(before + weight_of(zj, m)) >= need_m;
            if (reached)
                atomicMin(&s_pick, rank * GATHER_CAP + j);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        if (s_pick != 0xffffffffu) {
            const unsigned int j = s_pick % GATHER_CAP;
            c->cut_z[kind] = __ldcg(&c->gather_z[j]);
            c->cut_id[kind] = __ldcg(&c->gather_id[j]);
        } else { /* too many ties to rank, or rounding: keep the whole (sub-)bin */
            c->cut_z[kind] = ordered_value(__ldcg(&c->gather_min_key));
            c->cut_id[kind] = 0x7fffffff;
        }
        c->cut_set[kind] = 1;
        c->n_gather = 0;
        c->gather_min_key = 0xffffffffu;
        c->active = 0;
        c->use_sub = 0;
        c->done[2] = 0;
    }
}

/* ---- the draw -------------------------------------------------------------------------------------- */

/* The top n of keys[count] (argmax_key packing: larger logit, then lower id; only the first n of each
 * row of LILY_TOP_LOGPROBS_MAX count) or of logits[i0 + k * stride] into out[n], in one block: n rounds
 * of a block max below the previous round's. */
__device__ void block_top_keys(const unsigned long long *keys, int count, const float *logits, int i0, int stride,
                               int n, unsigned long long *out, unsigned long long *red)
{
    unsigned long long prev = ~0ull;
    for (int r = 0; r < n; r++) {
        unsigned long long best = 0;
        if (keys) {
            for (int j = threadIdx.x; j < count; j += blockDim.x) {
                const unsigned long long k = j % LILY_TOP_LOGPROBS_MAX < n ? __ldcg(&keys[j]) : 0ull;
                if (k < prev && k > best)
                    best = k;
            }
        } else {
            for (int i = i0; i < count; i += stride) {
                const float v = logits[i];
                const unsigned long long k = argmax_key(v == v ? v : -INFINITY, i);
                if (k < prev && k > best)
                    best = k;
            }
        }
        best = block_max_u64(best, red);
        if (threadIdx.x == 0)
            out[r] = best;
        prev = best;
    }
}

__global__ void __launch_bounds__(SAMPLE_BLOCK) sample_draw_kernel(sample_step p)
{
    __shared__ double s_key[SAMPLE_BLOCK / 32];
    __shared__ int s_id[SAMPLE_BLOCK / 32];
    __shared__ unsigned long long red[SAMPLE_BLOCK / 32];
    sample_control *c = p.ws.ctl;
    const float m = ordered_value(__ldcg(&c->z_max_key));
    const bool argmax_mode = p.argmax_mode || !isfinite(m);
    float lo = -INFINITY;
    if (!argmax_mode) {
        lo = p.log_min_p > -INFINITY ? __fadd_rn(m, p.log_min_p) : -INFINITY;
        const float floor_z = __fsub_rn(m, NEGLIGIBLE_NATS);
        lo = lo < floor_z ? floor_z : lo;
    }
    const unsigned long long draw = p.draw0 + (unsigned long long)*p.a.n_generated;
    double best = -INFINITY;
    int best_id = 0x7fffffff;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.vocab; i += gridDim.x * blockDim.x) {
        const float z = p.ws.work[i];
        double key;
        if (argmax_mode) {
            key = (double)z;
        } else {
            if (!(z >= lo) || !passes_cuts(c, z, i, 2))
                continue;
            key = (double)z + lily_gumbel_noise(p.seed, draw, (uint32_t)i);
        }
        if (key > best || (key == best && i < best_id)) {
            best = key;
            best_id = i;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const double k2 = __shfl_xor_sync(0xffffffffu, best, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, best_id, o);
        if (k2 > best || (k2 == best && i2 < best_id)) {
            best = k2;
            best_id = i2;
        }
    }
    if (lane == 0) {
        s_key[warp] = best;
        s_id[warp] = best_id;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < SAMPLE_BLOCK / 32; w++)
            if (s_key[w] > best || (s_key[w] == best && s_id[w] < best_id)) {
                best = s_key[w];
                best_id = s_id[w];
            }
        c->best_key[blockIdx.x] = best;
        c->best_id[blockIdx.x] = best_id;
    }
    const int n_top = p.top_logprobs > 0 ? min(p.top_logprobs, LILY_TOP_LOGPROBS_MAX) : 0;
    const float raw_max = ordered_value(__ldcg(&c->raw_max_key));
    if (p.top_logprobs >= 0) {
        unsigned long long s = 0;
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.vocab; i += gridDim.x * blockDim.x)
            s += (unsigned long long)((double)__expf(p.logits[i] - raw_max) * MASS_ONE);
        s = block_sum(s, red);
        if (threadIdx.x == 0)
            atomicAdd(&c->lse_mass, s);
        if (n_top > 0)
            block_top_keys(NULL, p.vocab, p.logits, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x,
                           n_top, &c->top_keys[blockIdx.x * LILY_TOP_LOGPROBS_MAX], red);
    }
    if (!last_block(&c->done[3]))
        return;
    __shared__ unsigned long long s_top[LILY_TOP_LOGPROBS_MAX];
    if (n_top > 0) {
        /* the blocks' lists merged */
        block_top_keys(c->top_keys, gridDim.x * LILY_TOP_LOGPROBS_MAX, NULL, 0, 0, n_top, s_top, red);
    }
    __syncthreads();
    if (threadIdx.x != 0)
        return;
    best = -INFINITY;
    best_id = 0x7fffffff;
    for (int b = 0; b < (int)gridDim.x; b++) {
        const double k = __ldcg(&c->best_key[b]);
        const int id = __ldcg(&c->best_id[b]);
        if (k > best || (k == best && id < best_id)) {
            best = k;
            best_id = id;
        }
    }
    const int tok = best_id < p.vocab ? best_id : 0;
    const sample_args &a = p.a;
    const int step = *a.step;
    a.token_slots[step & 1] = tok; /* the logits graph already advanced the step counter */
    const int i = *a.n_generated;
    if (i < a.out_cap)
        a.out_tokens[i] = tok;
    *a.n_generated = i + 1;
    if (p.penalties) {
        p.ws.counts[tok] += 1;
        p.ws.in_context[tok] = 1;
    }
    sample_token_info *info = &p.ws.info_dev[i % SAMPLE_INFO_RING];
    info->flags = (__ldcg(&c->nonfinite) ? SAMPLE_FLAG_NONFINITE : 0) |
                  (__ldcg(&c->mask_state) == 2 ? SAMPLE_FLAG_MASK_TIMEOUT : 0);
    info->has_logprobs = p.top_logprobs >= 0;
    if (p.top_logprobs >= 0) {
        const float lse = raw_max + (float)log((double)__ldcg(&c->lse_mass) / MASS_ONE);
        info->lp.logprob = p.logits[tok] - lse;
        info->lp.n_top = n_top;
        for (int r = 0; r < n_top; r++) {
            const int id = argmax_key_row(s_top[r]);
            info->lp.top_ids[r] = id;
            info->lp.top_logprobs[r] = p.logits[id] - lse;
        }
    }
    /* the step's scratch back to zero for the next one */
    c->z_max_key = 0;
    c->raw_max_key = 0;
    c->nonfinite = 0;
    c->mask_state = 0;
    c->lse_mass = 0;
    c->cut_set[0] = c->cut_set[1] = 0;
    c->done[3] = 0;
    sample_publish_token(a, i, tok);
}

/* ---- host side ------------------------------------------------------------------------------------- */

static int grid_for(int vocab)
{
    const int per_block = SAMPLE_BLOCK * SAMPLE_PER_THREAD;
    const int g = (vocab + per_block - 1) / per_block;
    return g < 1 ? 1 : g > SAMPLE_MAX_GRID ? SAMPLE_MAX_GRID : g;
}

size_t cuda_sampling_bytes(int vocab)
{
    return (size_t)vocab * (4 + 4 + 4 + 1 + 4 + 4 + 4 + 4) + sizeof(sample_control) + 4096;
}

cudaError_t cuda_sampling_new(int vocab, sample_workspace *ws)
{
    memset(ws, 0, sizeof *ws);
    ws->vocab = vocab;
    const size_t V = (size_t)vocab;
    cudaError_t e;
#define SA(ptr, bytes)                                                                             \
    do {                                                                                           \
        if ((e = cudaMalloc((void **)&(ptr), (bytes))) != cudaSuccess ||                           \
            (e = cudaMemset((ptr), 0, (bytes))) != cudaSuccess)                                    \
            goto fail;                                                                             \
    } while (0)
    SA(ws->work, V * 4);
    SA(ws->bias, V * 4);
    SA(ws->counts, V * 4);
    SA(ws->in_context, V);
    SA(ws->stage_ids, V * 4);
    SA(ws->stage_counts, V * 4);
    SA(ws->stage_bias_ids, V * 4);
    SA(ws->stage_values, V * 4);
    SA(ws->ctl, sizeof(sample_control));
#undef SA
    {
        const unsigned int init = 0xffffffffu;
        if ((e = cudaMemcpy(&ws->ctl->gather_min_key, &init, 4, cudaMemcpyHostToDevice)) != cudaSuccess)
            goto fail;
    }
    if ((e = cudaHostAlloc((void **)&ws->info_host, SAMPLE_INFO_RING * sizeof(sample_token_info),
                           cudaHostAllocMapped)) != cudaSuccess)
        goto fail;
    memset(ws->info_host, 0, SAMPLE_INFO_RING * sizeof(sample_token_info));
    if ((e = cudaHostGetDevicePointer((void **)&ws->info_dev, ws->info_host, 0)) != cudaSuccess)
        goto fail;
    {
        const size_t mask_bytes = sizeof(sample_mask_channel) + (V + 31) / 32 * 4;
        if ((e = cudaHostAlloc((void **)&ws->mask_host, mask_bytes, cudaHostAllocMapped)) != cudaSuccess)
            goto fail;
        memset(ws->mask_host, 0, mask_bytes);
        if ((e = cudaHostGetDevicePointer((void **)&ws->mask_dev, ws->mask_host, 0)) != cudaSuccess)
            goto fail;
    }
    return cudaSuccess;
fail:
    cuda_sampling_free(ws);
    return e;
}

void cuda_sampling_free(sample_workspace *ws)
{
    cudaFree(ws->work);
    cudaFree(ws->bias);
    cudaFree(ws->counts);
    cudaFree(ws->in_context);
    cudaFree(ws->stage_ids);
    cudaFree(ws->stage_counts);
    cudaFree(ws->stage_bias_ids);
    cudaFree(ws->stage_values);
    cudaFree(ws->ctl);
    if (ws->info_host)
        cudaFreeHost(ws->info_host);
    if (ws->mask_host)
        cudaFreeHost(ws->mask_host);
    memset(ws, 0, sizeof *ws);
}

static bool has_penalties(const lily_device_sampling *ds)
{
    return ds->presence_penalty != 0.0f || ds->frequency_penalty != 0.0f || ds->repetition_penalty != 1.0f;
}

bool cuda_sampling_is_plain_greedy(const lily_device_sampling *ds)
{
    return (ds->temperature < 1e-5f || ds->top_k == 1) && !has_penalties(ds) && ds->n_bias == 0 &&
           ds->top_logprobs < 0 && !ds->token_mask;
}

void cuda_sampling_mask_reset(const sample_workspace *ws)
{
    ws->mask_host->abort = 0;
    ws->mask_host->all = 0;
    ws->mask_host->published = 0;
}

void cuda_sampling_mask_publish(const sample_workspace *ws, const lily_device_sampling *ds, int index)
{
    sample_mask_channel *ch = ws->mask_host;
    /* no step reads the bits now: step index - 1 published its token after its prep kernel read them, and
     * step index waits for the count below */
    ch->all = ds->token_mask(ds->mask_user, index, ch->bits) ? 0 : 1;
    __atomic_thread_fence(__ATOMIC_RELEASE); /* the bits and `all` before the count */
    ch->published = index + 1;
}

void cuda_sampling_mask_abort(const sample_workspace *ws)
{
    __atomic_thread_fence(__ATOMIC_RELEASE);
    ws->mask_host->abort = 1;
}

__global__ void scatter_history_kernel(const int *ids, const unsigned int *counts, int n, int vocab,
                                       unsigned int *count_table, unsigned char *in_context)
{
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
        const int id = ids[j];
        if (id >= 0 && id < vocab) {
            count_table[id] = counts[j];
            in_context[id] = 1;
        }
    }
}

__global__ void scatter_bias_kernel(const int *ids, const float *values, int n, int vocab, float *bias)
{
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
        const int id = ids[j];
        if (id >= 0 && id < vocab)
            atomicAdd(&bias[id], values[j]);
    }
}

cudaError_t cuda_sampling_upload(const sample_workspace *ws, const lily_device_sampling *ds, cudaStream_t s)
{
    const size_t V = (size_t)ws->vocab;
    cudaError_t e;
    if (!has_penalties(ds) && ds->n_bias == 0)
        return cudaSuccess;
    if (has_penalties(ds)) {
        const int n = ds->n_history < ws->vocab ? ds->n_history : ws->vocab;
        if ((e = cudaMemsetAsync(ws->counts, 0, V * 4, s)) != cudaSuccess ||
            (e = cudaMemsetAsync(ws->in_context, 0, V, s)) != cudaSuccess)
            return e;
        if (n > 0) {
            if ((e = cudaMemcpyAsync(ws->stage_ids, ds->history_ids, (size_t)n * 4, cudaMemcpyHostToDevice, s)) !=
                    cudaSuccess ||
                (e = cudaMemcpyAsync(ws->stage_counts, ds->history_counts, (size_t)n * 4, cudaMemcpyHostToDevice,
                                     s)) != cudaSuccess)
                return e;
            scatter_history_kernel<<<(n + 255) / 256, 256, 0, s>>>(ws->stage_ids, ws->stage_counts, n, ws->vocab,
                                                                   ws->counts, ws->in_context);
            if ((e = cudaGetLastError()) != cudaSuccess)
                return e;
        }
    }
    if (ds->n_bias > 0) {
        const int n = ds->n_bias < ws->vocab ? ds->n_bias : ws->vocab;
        if ((e = cudaMemsetAsync(ws->bias, 0, V * 4, s)) != cudaSuccess)
            return e;
        int *ids = ws->stage_bias_ids;
        float *values = ws->stage_values;
        if ((e = cudaMemcpyAsync(ids, ds->bias_ids, (size_t)n * 4, cudaMemcpyHostToDevice, s)) != cudaSuccess ||
            (e = cudaMemcpyAsync(values, ds->bias_values, (size_t)n * 4, cudaMemcpyHostToDevice, s)) != cudaSuccess)
            return e;
        scatter_bias_kernel<<<(n + 255) / 256, 256, 0, s>>>(ids, values, n, ws->vocab, ws->bias);
        if ((e = cudaGetLastError()) != cudaSuccess)
            return e;
    }
    /* pageable copies: wait until they were read, so the caller may free its arrays */
    return cudaStreamSynchronize(s);
}

cudaError_t cuda_sampling_enqueue(const sample_workspace *ws, const sample_args &a, const lily_device_sampling *ds,
                                  cudaStream_t s)
{
    sample_step p;
    memset(&p, 0, sizeof p);
    p.logits = a.logits;
    p.vocab = a.vocab;
    p.ws = *ws;
    p.argmax_mode = ds->temperature < 1e-5f || ds->top_k == 1;
    p.inv_t = p.argmax_mode ? 1.0f : 1.0f / ds->temperature;
    p.top_k = !p.argmax_mode && ds->top_k > 0 && ds->top_k < a.vocab ? ds->top_k : 0;
    p.top_p = p.argmax_mode ? 1.0f : ds->top_p;
    p.log_min_p = ds->min_p > 0.0f ? logf(ds->min_p) : -INFINITY;
    p.presence = ds->presence_penalty;
    p.frequency = ds->frequency_penalty;
    p.repetition = ds->repetition_penalty;
    p.penalties = has_penalties(ds);
    p.has_bias = ds->n_bias > 0;
    p.seed = ds->seed;
    p.draw0 = ds->draw0;
    p.top_logprobs = ds->top_logprobs;
    p.masked = ds->token_mask != NULL;
    p.a = a;
    const int g = grid_for(a.vocab);
    if (p.masked)
        sample_mask_wait_kernel<<<1, 1, 0, s>>>(p);
    sample_prep_kernel<<<g, SAMPLE_BLOCK, 0, s>>>(p);
    for (int kind = CUT_TOP_K; kind <= CUT_TOP_P; kind++) {
        if ((kind == CUT_TOP_K && p.top_k == 0) || (kind == CUT_TOP_P && !(p.top_p < 1.0f)))
            continue;
        sample_hist1_kernel<<<g, SAMPLE_BLOCK, 0, s>>>(p, kind);
        sample_hist2_kernel<<<g, SAMPLE_BLOCK, 0, s>>>(p, kind);
        sample_gather_kernel<<<g, SAMPLE_BLOCK, 0, s>>>(p, kind);
    }
    sample_draw_kernel<<<g, SAMPLE_BLOCK, 0, s>>>(p);
    return cudaGetLastError();
}
