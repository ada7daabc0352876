/* threadpool.c — persistent pthread pool behind parallel_for() (threadpool.h).
 *
 * Owns: worker start/stop and the hand-out of tasks. The hot path takes no lock. One atomic word holds
 * the job's state: its generation (bumped per job), a closed bit, and how many workers are inside it. The
 * caller publishes a job by storing a new generation; a worker enters the job by a compare-and-swap that
 * adds itself to the count while the job is open, claims task indices from an atomic counter, and leaves
 * by decrementing the count. The caller runs tasks too; when none is left it closes the job and waits only
 * for the workers inside — a worker that has not entered by then (descheduled on a loaded machine) is not
 * waited for, its share having gone to the threads that ran.
 *
 * Both sides spin (with the CPU's pause hint) before they sleep on a condition variable: between jobs a
 * worker for up to CPU_POOL_SPIN_NS — decode issues hundreds of small jobs per token, and a wake-up from
 * sleep costs more than most of them — and the caller at the end of a job for CPU_POOL_WAIT_SPIN_NS plus
 * as long as it ran tasks itself (at most CPU_POOL_WAIT_SPIN_MAX_NS): a worker that entered a little after
 * the caller finishes its last task up to about that much later. A caller that slept there instead would
 * be woken a futex wake-up late (~40 µs on the 2-vCPU VM), and at a job of long tasks — the delta rule's,
 * 0.1-0.2 ms each — it slept in nearly every pass (docs/BENCHMARKS.md, issue 24 session 16). The spins are
 * bounded because on a loaded machine a spinning thread holds a core that another thread may need. The
 * mutex is taken only when the other side is asleep.
 *
 * Sleeping without a lost wake-up: a sleeper registers (n_sleeping, caller_sleeping) under the mutex and
 * then re-reads the condition; the waker changes the condition and then reads the registration (both
 * sequentially consistent), so either the sleeper sees the change or the waker sees the sleeper and
 * signals under the mutex.
 */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/base.h"
#include "base/clock.h"

/* How long an idle worker spins before it sleeps, and the least and most the caller spins waiting for the
 * workers at the end of a job before it sleeps (all in nanoseconds of CLOCK_MONOTONIC). */
#define CPU_POOL_SPIN_NS 50000
#define CPU_POOL_WAIT_SPIN_NS 20000
#define CPU_POOL_WAIT_SPIN_MAX_NS 1000000

/* The job state word. */
#define STATE_GEN_SHIFT 16
#define STATE_CLOSED 0x8000u
#define STATE_COUNT 0x7FFFu
static inline unsigned state_gen(unsigned s) { return s >> STATE_GEN_SHIFT; }

typedef struct {
    lily_threadpool *pool;
    int index; /* 1 .. n_threads-1; the caller is thread 0 */
} worker_arg;

struct lily_threadpool {
    int n_threads;
    pthread_t *workers;       /* [n_threads - 1] */
    worker_arg *worker_args;  /* [n_threads - 1] */
    int n_started;
    pthread_mutex_t mutex;    /* only for sleeping and waking */
    pthread_cond_t start_cv, done_cv;
    atomic_uint state;        /* generation << STATE_GEN_SHIFT | STATE_CLOSED | workers inside */
    atomic_bool stop;
    atomic_bool busy;         /* a job is in flight (re-entrance check) */
    atomic_int n_sleeping;    /* workers waiting on start_cv */
    atomic_bool caller_sleeping; /* the caller waits on done_cv */
    /* the current job: written by the caller before it publishes the generation, read by workers once
     * they have entered it; not rewritten while any worker is inside */
    lily_task_fn fn;
    void *arg;
    int n_tasks;
    /* the task counter on a cache line of its own: every claim writes it, while waiting threads read state */
    char pad0[64];
    atomic_int next_task;
    char pad1[64 - sizeof(atomic_int)];
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void run_tasks(lily_threadpool *pool, lily_task_fn fn, void *arg, int n_tasks, int thread)
{
    for (;;) {
        int t = atomic_fetch_add_explicit(&pool->next_task, 1, memory_order_relaxed);
        if (t >= n_tasks)
            break;
        fn(arg, t, thread);
    }
}

/* Wait until the job generation differs from `seen`: spin first, then sleep. Returns the new one. */
static unsigned wait_for_job(lily_threadpool *pool, unsigned seen)
{
    const int64_t start = lily_wall_ns();
    for (int i = 1;; i++) {
        const unsigned g = state_gen(atomic_load_explicit(&pool->state, memory_order_acquire));
        if (g != seen)
            return g;
        cpu_relax();
        if ((i & 255) == 0 && lily_wall_ns() - start > CPU_POOL_SPIN_NS)
            break;
    }
    pthread_mutex_lock(&pool->mutex);
    atomic_fetch_add(&pool->n_sleeping, 1);
    unsigned g;
    while ((g = state_gen(atomic_load(&pool->state))) == seen)
        pthread_cond_wait(&pool->start_cv, &pool->mutex);
    atomic_fetch_sub(&pool->n_sleeping, 1);
    pthread_mutex_unlock(&pool->mutex);
    return g;
}

/* Enter job `gen` if it is still the open job: true when this worker is counted inside it. */
static bool enter_job(lily_threadpool *pool, unsigned gen)
{
    unsigned s = atomic_load(&pool->state);
    while (state_gen(s) == gen && !(s & STATE_CLOSED))
        if (atomic_compare_exchange_weak(&pool->state, &s, s + 1))
            return true;
    return false;
}

static void *worker_main(void *p)
{
    worker_arg *wa = p;
    lily_threadpool *pool = wa->pool;
    unsigned seen = 0;
    for (;;) {
        seen = wait_for_job(pool, seen);
        if (atomic_load_explicit(&pool->stop, memory_order_acquire))
            break;
        if (!enter_job(pool, seen))
            continue; /* closed (or replaced) before this worker came: nothing to wait for */
        run_tasks(pool, pool->fn, pool->arg, pool->n_tasks, wa->index);
        const unsigned before = atomic_fetch_sub(&pool->state, 1);
        if ((before & STATE_COUNT) == 1 && (before & STATE_CLOSED) && atomic_load(&pool->caller_sleeping)) {
            pthread_mutex_lock(&pool->mutex);
            pthread_cond_signal(&pool->done_cv);
            pthread_mutex_unlock(&pool->mutex);
        }
    }
    return NULL;
}

/* Publish a new, open job generation (no worker inside) and wake any sleeping worker. Only the caller
 * (or destroy) writes it, when no worker is inside the previous job. */
static void publish_job(lily_threadpool *pool)
{
    const unsigned gen = state_gen(atomic_load(&pool->state)) + 1;
    atomic_store(&pool->state, gen << STATE_GEN_SHIFT);
    if (atomic_load(&pool->n_sleeping) > 0) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_broadcast(&pool->start_cv);
        pthread_mutex_unlock(&pool->mutex);
    }
}

lily_status lily_threadpool_create(int n_threads, lily_threadpool **out, lily_error *err)
{
    *out = NULL;
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    lily_threadpool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "thread pool: out of memory");
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->start_cv, NULL);
    pthread_cond_init(&pool->done_cv, NULL);
    atomic_init(&pool->state, 0);
    atomic_init(&pool->stop, false);
    atomic_init(&pool->busy, false);
    atomic_init(&pool->n_sleeping, 0);
    atomic_init(&pool->next_task, 0);
    atomic_init(&pool->caller_sleeping, false);
    if (n_threads > 1) {
        pool->workers = calloc((size_t)n_threads - 1, sizeof *pool->workers);
        pool->worker_args = calloc((size_t)n_threads - 1, sizeof *pool->worker_args);
        if (!pool->workers || !pool->worker_args) {
            lily_threadpool_destroy(pool);
            return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "thread pool: out of memory");
        }
        for (int i = 0; i < n_threads - 1; i++) {
            pool->worker_args[i] = (worker_arg){pool, i + 1};
            if (pthread_create(&pool->workers[i], NULL, worker_main, &pool->worker_args[i]) != 0) {
                lily_threadpool_destroy(pool);
                return lily_error_set(err, LILY_ERR_BACKEND, "thread pool: cannot start thread %d of %d", i + 2,
                                      n_threads);
            }
            pool->n_started++;
        }
    }
    *out = pool;
    return LILY_OK;
}

void lily_threadpool_destroy(lily_threadpool *pool)
{
    if (!pool)
        return;
    atomic_store(&pool->stop, true);
    publish_job(pool);
    for (int i = 0; i < pool->n_started; i++)
        pthread_join(pool->workers[i], NULL);
    pthread_cond_destroy(&pool->start_cv);
    pthread_cond_destroy(&pool->done_cv);
    pthread_mutex_destroy(&pool->mutex);
    free(pool->workers);
    free(pool->worker_args);
    free(pool);
}

int lily_threadpool_size(const lily_threadpool *pool) { return pool ? pool->n_threads : 1; }

void parallel_for(lily_threadpool *pool, int n_tasks, lily_task_fn fn, void *arg)
{
    if (n_tasks <= 0)
        return;
    if (!pool || pool->n_started == 0 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++)
            fn(arg, t, 0);
        return;
    }
    const bool was_busy = atomic_exchange(&pool->busy, true);
    LILY_ASSERT(!was_busy); /* parallel_for is not re-entrant */
    pool->fn = fn;
    pool->arg = arg;
    pool->n_tasks = n_tasks;
    atomic_store_explicit(&pool->next_task, 0, memory_order_relaxed);
    publish_job(pool);

    const int64_t run_start = lily_wall_ns();
    run_tasks(pool, fn, arg, n_tasks, 0);

    /* no task left to claim: close the job, then wait for the workers inside it — spinning for about as
     * long as the caller ran tasks (a worker's last task began at most that long ago) */
    unsigned s = atomic_fetch_or(&pool->state, STATE_CLOSED) | STATE_CLOSED;
    const int64_t start = lily_wall_ns();
    const int64_t spin_ns = CPU_POOL_WAIT_SPIN_NS + LILY_MIN(start - run_start, (int64_t)CPU_POOL_WAIT_SPIN_MAX_NS);
    for (int i = 1; (s & STATE_COUNT) != 0; i++) {
        cpu_relax();
        s = atomic_load_explicit(&pool->state, memory_order_acquire);
        if ((s & STATE_COUNT) != 0 && (i & 255) == 0 && lily_wall_ns() - start > spin_ns) {
            /* a worker inside was likely descheduled (a loaded machine): sleep until it leaves */
            pthread_mutex_lock(&pool->mutex);
            atomic_store(&pool->caller_sleeping, true);
            while (atomic_load(&pool->state) & STATE_COUNT)
                pthread_cond_wait(&pool->done_cv, &pool->mutex);
            atomic_store(&pool->caller_sleeping, false);
            pthread_mutex_unlock(&pool->mutex);
            break;
        }
    }
    atomic_store(&pool->busy, false);
}
