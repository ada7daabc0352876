/* cpu_experts.cu — decode's routed experts of host layers computed by the host's cores
 * (lily_backend_options.host_experts, --host-experts cpu | N), the other variant of --n-cpu-moe besides the
 * GPU reading the selected experts over PCIe (zero-copy, host_weights.cu), and the mix of the two: the CPU
 * takes the last N of each token's top-k, the GPU the others over PCIe at the same time.
 *
 * One decode MoE block of such a layer, on the stream (inside the captured decode graph like any other):
 *   router GEMV                        (as on the device path)
 *   cpu_moe_publish_kernel             x = RMSNorm(h) · post_norm, the top-k ids and weights (moe_topk.cuh,
 *                                      the device path's ranking) written to a mailbox in mapped host memory,
 *                                      then a sequence number (fence.sc.sys before it)
 *   moe_gate_up / moe_down             the decode MoE kernels with moe_args.cpu_slots = N: the shared expert
 *                                      and the first top_k - N routed slots (read over PCIe), h += their sum
 *   cpu_moe_collect_kernel             one thread polls the mailbox until the CPU's answer carries the
 *                                      sequence number, then h += y (read over PCIe)
 * and on the host a worker thread spins on the mailbox's request word; when it changes it runs the
 * last N slots' experts (cpu_experts_token_run with CPU_EXPERTS_CUDA_ROUNDING: the decode MoE kernels'
 * rounding points, multithreaded), writes y and then the sequence number (release). The GPU's kernels run
 * while the CPU computes.
 *
 * The sequence number is a device counter of the backend (one per context, bumped by each publish), so
 * a stale answer never matches, whatever session or graph runs. The worker spins while decode is active
 * (every forward call of one token wakes it with a host function on a side stream, off the critical
 * path) and sleeps on a condition variable CPU_EXPERTS_SPIN_NS after the last request or wake; a timed
 * wait bounds a missed wake-up to CPU_EXPERTS_NAP_NS. A GPU poll that never ends traps (a bug, not a hang).
 *
 * The host layers' experts are then plain pinned memory (not write-combined: the CPU reads them through
 * its caches), their MLX layout as uploaded (upload_mat), viewed as lily_tensors at their host addresses.
 * Not bit-identical to the device path, but the same arithmetic up to the order of fp32 sums: the CPU rounds
 * x and each slot's silu(gate) ⊙ up to fp16 with the scales the GPU picks, multiplies by the exact weights in
 * fp32 and applies each group's scale and bias with the GPU's group sums (experts_token.h, fdot.h). The x
 * published here is RMSNorm(h) · post_norm as moe_gate_up_mma forms it (h · (r · w), the same sum of squares).
 */
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "cuda_internal.cuh"
#include "moe/moe_topk.cuh"

extern "C" {
#include "backend/cpu/experts_token.h"
}

#define CPU_EXPERTS_SPIN_NS 50000000LL /* 50 ms */
#define CPU_EXPERTS_NAP_NS 5000000LL   /* 5 ms */
#define PUB_THREADS 256

/* The mailbox in mapped host memory; x [hidden] and y [hidden] follow it. */
struct cpu_moe_box {
    unsigned int req; /* GPU -> CPU: sequence number of the request, written last */
    int layer;
    unsigned int pad0[30];
    unsigned int done; /* CPU -> GPU: sequence number of the answer in y, written last */
    unsigned int pad1[31];
    int ids[MOE_MAX_K];
    float w[MOE_MAX_K];
};

struct cuda_cpu_experts {
    cpu_experts_token *tok;
    cpu_moe_box *box_h, *box_d; /* host / device address */
    float *x_h, *x_d, *y_h, *y_d;
    unsigned int *seq; /* device: the last sequence number published */
    lily_tensor *gate, *up, *down; /* [n_layers]: host views of host layers' experts (data NULL otherwise) */
    unsigned char *x_fp16; /* [n_layers]: the layer's decode MoE runs on the tensor-core kernels (set at capture) */
    int n_layers, hidden, top_k;
    int cpu_slots; /* the last cpu_slots of each token's top_k are the CPU's (1..top_k) */
    cudaStream_t side;
    cudaEvent_t fork, join;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned int wake_gen; /* bumped by each wake (atomic) */
    int stop;              /* atomic */
    /* what the worker measured (read after it stops) */
    long long served;
    double compute_s;
};

/* ---- device side ---------------------------------------------------------------------------------- */

struct cpu_moe_pub_args {
    const float *h, *norm_w, *logits;
    float eps;
    int hidden, n_experts, top_k, layer;
    unsigned int *seq;
    cpu_moe_box *box;
    float *x;
};

__global__ void __launch_bounds__(PUB_THREADS) cpu_moe_publish_kernel(cpu_moe_pub_args a)
{
    __shared__ int s_idx[MOE_MAX_K];
    __shared__ float s_w[MOE_MAX_K];
    __shared__ unsigned int s_key[MOE_MAX_E];
    __shared__ float s_red[PUB_THREADS / 32];
    const int H = a.hidden, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < H; c += PUB_THREADS)
        ss = fmaf(a.h[c], a.h[c], ss);
    ss = warp_sum(ss);
    if (lane == 0)
        s_red[warp] = ss;
    moe_topk_block(a.logits, a.n_experts, a.top_k, s_idx, s_w, s_key); /* ends with __syncthreads */
    float tot = 0.0f;
    for (int w = 0; w < PUB_THREADS / 32; w++)
        tot += s_red[w];
    const float r = rsqrtf(tot / (float)H + a.eps);
    for (int c = threadIdx.x; c < H; c += PUB_THREADS)
        a.x[c] = a.h[c] * (r * a.norm_w[c]); /* moe_gate_up_mma's s_x, bit for bit */
    if (threadIdx.x < a.top_k) {
        a.box->ids[threadIdx.x] = s_idx[threadIdx.x];
        a.box->w[threadIdx.x] = s_w[threadIdx.x];
    }
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned int seq = *a.seq + 1u;
        *a.seq = seq;
        a.box->layer = a.layer;
        __threadfence_system();
        asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(&a.box->req), "r"(seq) : "memory");
    }
}

__global__ void __launch_bounds__(PUB_THREADS) cpu_moe_collect_kernel(const unsigned int *seq, const cpu_moe_box *box,
                                                                     const float *y, float *h, int H)
{
    if (threadIdx.x == 0) {
        const unsigned int want = *seq;
        unsigned int v, polls = 0;
        for (;;) {
            asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(&box->done) : "memory");
            if (v == want)
                break;
            if (++polls > (1u << 26)) /* ~a minute (a poll crosses the bus): a silent worker is a bug, not a hang */
                __trap();
            __nanosleep(64);
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < H; c += PUB_THREADS) {
        float v;
        asm volatile("ld.relaxed.sys.global.f32 %0, [%1];" : "=f"(v) : "l"(y + c) : "memory");
        h[c] += v;
    }
}

/* ---- the host worker ------------------------------------------------------------------------------ */

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void *worker_main(void *p)
{
    cuda_cpu_experts *ce = (cuda_cpu_experts *)p;
    cpu_moe_box *box = ce->box_h;
    unsigned int last = __atomic_load_n(&box->req, __ATOMIC_ACQUIRE);
    unsigned int gen = __atomic_load_n(&ce->wake_gen, __ATOMIC_ACQUIRE);
    long long idle_since = now_ns();
    int ids[MOE_MAX_K];
    float w[MOE_MAX_K];
    for (unsigned int i = 1;; i++) {
        const unsigned int req = __atomic_load_n(&box->req, __ATOMIC_ACQUIRE);
        if (req != last) {
            const long long t0 = now_ns();
            const int l = box->layer;
            for (int k = 0; k < ce->top_k; k++) {
                ids[k] = box->ids[k];
                w[k] = box->w[k];
            }
            if (l >= 0 && l < ce->n_layers && ce->gate[l].data)
                cpu_experts_token_run(ce->tok, &ce->gate[l], &ce->up[l], &ce->down[l],
                                      __atomic_load_n(&ce->x_fp16[l], __ATOMIC_RELAXED), ce->x_h, ce->cpu_slots,
                                      ids + (ce->top_k - ce->cpu_slots), w + (ce->top_k - ce->cpu_slots), ce->y_h);
            else /* cannot happen (only host layers publish): answer zeros rather than hang the GPU */
                memset(ce->y_h, 0, (size_t)ce->hidden * sizeof(float));
            __atomic_store_n(&box->done, req, __ATOMIC_RELEASE);
            last = req;
            idle_since = now_ns();
            ce->served++;
            ce->compute_s += (double)(idle_since - t0) * 1e-9;
            continue;
        }
        if (__atomic_load_n(&ce->stop, __ATOMIC_ACQUIRE))
            break;
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
        if (i % 1024)
            continue;
        const unsigned int g = __atomic_load_n(&ce->wake_gen, __ATOMIC_ACQUIRE);
        const long long t = now_ns();
        if (g != gen) {
            gen = g;
            idle_since = t;
        }
        if (t - idle_since < CPU_EXPERTS_SPIN_NS)
            continue;
        /* idle: sleep until a wake, a stop, or the nap's end (then look at the mailbox again) */
        pthread_mutex_lock(&ce->mu);
        if (__atomic_load_n(&ce->wake_gen, __ATOMIC_ACQUIRE) == gen && !__atomic_load_n(&ce->stop, __ATOMIC_ACQUIRE) &&
            __atomic_load_n(&box->req, __ATOMIC_ACQUIRE) == last) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += CPU_EXPERTS_NAP_NS;
            ts.tv_sec += ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
            pthread_cond_timedwait(&ce->cv, &ce->mu, &ts);
        }
        pthread_mutex_unlock(&ce->mu);
    }
    return NULL;
}

static void CUDART_CB wake_fn(void *p)
{
    cuda_cpu_experts *ce = (cuda_cpu_experts *)p;
    pthread_mutex_lock(&ce->mu);
    __atomic_add_fetch(&ce->wake_gen, 1u, __ATOMIC_RELEASE);
    pthread_cond_signal(&ce->cv);
    pthread_mutex_unlock(&ce->mu);
}

/* ---- setup ---------------------------------------------------------------------------------------- */

/* The host address of mapped host memory the device reads at p. */
static lily_status host_view(const void *p, const void **out, lily_error *err)
{
    cudaPointerAttributes at;
    CUDA_TRY(cudaPointerGetAttributes(&at, p));
    if (!at.hostPointer)
        return lily_error_set(err, LILY_ERR_BACKEND, "cuda: host experts: no host address for %p", p);
    *out = at.hostPointer;
    return LILY_OK;
}

static lily_status tensor_view(const dmat &m, lily_tensor *t, lily_error *err)
{
    memset(t, 0, sizeof *t);
    const void *data = NULL, *scales = NULL, *biases = NULL;
    lily_status st = host_view(m.data, &data, err);
    if (st == LILY_OK)
        st = host_view(m.scales, &scales, err);
    if (st == LILY_OK)
        st = host_view(m.biases, &biases, err);
    if (st != LILY_OK)
        return st;
    t->name = "host experts";
    t->data = data;
    t->dtype = LILY_DTYPE_U32;
    t->ndim = 3;
    t->shape[0] = m.n_experts;
    t->shape[1] = m.rows;
    t->shape[2] = m.cols;
    t->bits = m.bits;
    t->group_size = 64;
    t->scales = scales;
    t->biases = biases;
    t->scale_dtype = LILY_DTYPE_BF16;
    t->expert_stride = m.rows;
    t->row_bytes = m.row_bytes;
    t->scale_row_bytes = (int64_t)(m.cols / 64) * 2;
    return LILY_OK;
}

int cuda_host_experts_cpu_slots(const lily_backend_options *o, const lily_config *cfg)
{
    if (o->exact || o->n_cpu_moe <= 0 || o->host_experts == LILY_HOST_EXPERTS_ZERO_COPY)
        return 0;
    if (o->host_experts > 0)
        return o->host_experts < cfg->n_experts_used ? o->host_experts : cfg->n_experts_used;
    /* LILY_HOST_EXPERTS_AUTO: half of each token's top-k on the host's cores when at least 7 threads compute
     * them, else zero-copy. Measured on the H200's host (16 cores, 15 threads, PCIe Gen5, all 40 layers'
     * experts on the host): 4 of 8 on the CPU 97.7 tok/s, zero-copy 60.3, all 8 on the CPU 65.2
     * (docs/BENCHMARKS.md, "Decode of host experts"); the 7-thread floor is from the per-layer times there. */
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const long threads = o->n_threads > 0 ? o->n_threads : cores - 1;
    return threads >= 7 ? cfg->n_experts_used / 2 : 0;
}

lily_status cuda_cpu_experts_init(cuda_ctx *c, lily_error *err)
{
    const int cpu_slots = cuda_host_experts_cpu_slots(&c->opts, &c->cfg);
    if (cpu_slots <= 0)
        return LILY_OK;
    const lily_config *cfg = &c->cfg;
    const int H = cfg->hidden, L = cfg->n_layers, K = cfg->n_experts_used;
    if (K > MOE_MAX_K || cfg->n_experts > MOE_MAX_E)
        return lily_error_set(err, LILY_ERR_UNSUPPORTED, "cuda: --host-experts cpu: %d of %d experts unsupported", K,
                              cfg->n_experts);
    cuda_cpu_experts *ce = (cuda_cpu_experts *)calloc(1, sizeof *ce);
    if (!ce)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cuda: host experts: out of memory");
    c->cpu_experts = ce;
    ce->n_layers = L;
    ce->hidden = H;
    ce->top_k = K;
    ce->cpu_slots = cpu_slots;
    pthread_mutex_init(&ce->mu, NULL);
    pthread_cond_init(&ce->cv, NULL);
    ce->gate = (lily_tensor *)calloc((size_t)L, sizeof(lily_tensor));
    ce->up = (lily_tensor *)calloc((size_t)L, sizeof(lily_tensor));
    ce->down = (lily_tensor *)calloc((size_t)L, sizeof(lily_tensor));
    ce->x_fp16 = (unsigned char *)calloc((size_t)L, 1);
    if (!ce->gate || !ce->up || !ce->down || !ce->x_fp16)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "cuda: host experts: out of memory");
    for (int l = 0; l < L; l++) {
        if (!cuda_layer_experts_on_host(c, l))
            continue;
        const cuda_layer *d = &c->layers[l];
        lily_status st = tensor_view(d->ex_gate, &ce->gate[l], err);
        if (st == LILY_OK)
            st = tensor_view(d->ex_up, &ce->up[l], err);
        if (st == LILY_OK)
            st = tensor_view(d->ex_down, &ce->down[l], err);
        if (st != LILY_OK)
            return st;
        if (!cpu_experts_token_ok(&ce->gate[l], &ce->up[l], &ce->down[l], H, cfg->moe_intermediate))
            return lily_error_set(err, LILY_ERR_UNSUPPORTED,
                                  "cuda: --host-experts cpu: layer %d's experts do not fit the CPU's fast path", l);
    }
    int threads = c->opts.n_threads;
    if (threads <= 0) { /* every core but one, which drives the GPU */
        const long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 1 ? (int)n - 1 : 1;
    }
    lily_status st = cpu_experts_token_create(H, cfg->moe_intermediate, K, threads, CPU_EXPERTS_CUDA_ROUNDING, &ce->tok,
                                              err);
    if (st != LILY_OK)
        return st;
    const size_t vec = ((size_t)H * sizeof(float) + 127) / 128 * 128;
    void *h = NULL;
    CUDA_TRY(cudaHostAlloc(&h, sizeof(cpu_moe_box) + 2 * vec, cudaHostAllocMapped | cudaHostAllocPortable));
    memset(h, 0, sizeof(cpu_moe_box) + 2 * vec);
    ce->box_h = (cpu_moe_box *)h;
    void *d = NULL;
    CUDA_TRY(cudaHostGetDevicePointer(&d, h, 0));
    ce->box_d = (cpu_moe_box *)d;
    ce->x_h = (float *)((char *)h + sizeof(cpu_moe_box));
    ce->y_h = (float *)((char *)h + sizeof(cpu_moe_box) + vec);
    ce->x_d = (float *)((char *)d + sizeof(cpu_moe_box));
    ce->y_d = (float *)((char *)d + sizeof(cpu_moe_box) + vec);
    CUDA_TRY(cudaMalloc((void **)&ce->seq, sizeof(unsigned int)));
    CUDA_TRY(cudaMemset(ce->seq, 0, sizeof(unsigned int)));
    CUDA_TRY(cudaStreamCreateWithFlags(&ce->side, cudaStreamNonBlocking));
    CUDA_TRY(cudaEventCreateWithFlags(&ce->fork, cudaEventDisableTiming));
    CUDA_TRY(cudaEventCreateWithFlags(&ce->join, cudaEventDisableTiming));
    if (pthread_create(&ce->thread, NULL, worker_main, ce) != 0)
        return lily_error_set(err, LILY_ERR_BACKEND, "cuda: host experts: cannot start the worker thread");
    ce->started = true;
    return LILY_OK;
}

void cuda_cpu_experts_free(cuda_ctx *c)
{
    cuda_cpu_experts *ce = c->cpu_experts;
    if (!ce)
        return;
    if (ce->started) {
        pthread_mutex_lock(&ce->mu);
        __atomic_store_n(&ce->stop, 1, __ATOMIC_RELEASE);
        pthread_cond_signal(&ce->cv);
        pthread_mutex_unlock(&ce->mu);
        pthread_join(ce->thread, NULL);
        if (ce->served)
            fprintf(stderr, "lily: host experts: %d of the top-%d on the CPU (%d threads): %lld layer requests, %.1f us "
                    "of compute each\n", ce->cpu_slots, ce->top_k, cpu_experts_token_threads(ce->tok), ce->served,
                    ce->compute_s / (double)ce->served * 1e6);
    }
    if (ce->side) {
        cudaStreamSynchronize(ce->side);
        cudaStreamDestroy(ce->side);
    }
    if (ce->fork)
        cudaEventDestroy(ce->fork);
    if (ce->join)
        cudaEventDestroy(ce->join);
    if (ce->seq)
        cudaFree(ce->seq);
    if (ce->box_h)
        cudaFreeHost(ce->box_h);
    cpu_experts_token_destroy(ce->tok);
    free(ce->gate);
    free(ce->up);
    free(ce->down);
    free(ce->x_fp16);
    pthread_cond_destroy(&ce->cv);
    pthread_mutex_destroy(&ce->mu);
    free(ce);
    c->cpu_experts = NULL;
}

/* ---- the forward pass's part ---------------------------------------------------------------------- */

bool cuda_cpu_experts_layer(const cuda_ctx *c, int layer, int n)
{
    return c->cpu_experts && n == 1 && cuda_layer_experts_on_host(c, layer);
}

lily_status cuda_cpu_experts_wake(cuda_ctx *c, int n, lily_error *err)
{
    cuda_cpu_experts *ce = c->cpu_experts;
    if (!ce || n != 1)
        return LILY_OK;
    CUDA_TRY(cudaEventRecord(ce->fork, c->stream));
    CUDA_TRY(cudaStreamWaitEvent(ce->side, ce->fork, 0));
    CUDA_TRY(cudaLaunchHostFunc(ce->side, wake_fn, ce));
    CUDA_TRY(cudaEventRecord(ce->join, ce->side));
    return LILY_OK;
}

lily_status cuda_cpu_experts_join(cuda_ctx *c, int n, lily_error *err)
{
    cuda_cpu_experts *ce = c->cpu_experts;
    if (!ce || n != 1)
        return LILY_OK;
    CUDA_TRY(cudaStreamWaitEvent(c->stream, ce->join, 0));
    return LILY_OK;
}

lily_status cuda_cpu_experts_moe(cuda_ctx *c, const moe_args &m0, lily_error *err)
{
    cuda_cpu_experts *ce = c->cpu_experts;
    cpu_moe_pub_args p;
    p.h = m0.h;
    p.norm_w = m0.norm_w;
    p.logits = m0.router_logits;
    p.eps = m0.eps;
    p.hidden = m0.hidden;
    p.n_experts = m0.n_experts;
    p.top_k = m0.top_k;
    p.layer = m0.layer;
    p.seq = ce->seq;
    p.box = ce->box_d;
    p.x = ce->x_d;
    cpu_moe_publish_kernel<<<1, PUB_THREADS, 0, c->stream>>>(p);
    CUDA_TRY(cudaGetLastError());
    /* the shared expert and the GPU's routed slots meanwhile: the decode MoE kernels without the CPU's slots */
    moe_args m = m0;
    m.cpu_slots = ce->cpu_slots;
    m.topk_pub = NULL; /* ranked by each block (no early ids) */
    m.timeline = NULL;
    /* the CPU rounds as the kernels launched below do (read by the worker when this layer's request comes) */
    if (m0.layer >= 0 && m0.layer < ce->n_layers)
        __atomic_store_n(&ce->x_fp16[m0.layer], (unsigned char)moe_decode_mma_supported(m, 1), __ATOMIC_RELAXED);
    CUDA_TRY(launch_moe_gate_up(m, 1, c->stream));
    CUDA_TRY(launch_moe_down(m, 1, c->stream));
    cpu_moe_collect_kernel<<<1, PUB_THREADS, 0, c->stream>>>(ce->seq, ce->box_d, ce->y_d, m0.out, m0.hidden);
    CUDA_TRY(cudaGetLastError());
    return LILY_OK;
}
