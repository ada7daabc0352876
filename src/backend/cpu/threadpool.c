/* threadpool.c — persistent pthread pool behind parallel_for() (threadpool.h).
 *
 * Owns: worker start/stop and the hand-out of tasks. A job is published under the mutex with a new
 * generation number; workers wake, claim task indices from an atomic counter, and the last one to
 * finish signals the caller, which also claims tasks while it waits.
 */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/base.h"

typedef struct {
    lily_threadpool *pool;
    int index; /* 1 .. n_threads-1; the caller is thread 0 */
} worker_arg;

struct lily_threadpool {
    int n_threads;
    pthread_t *workers;       /* [n_threads - 1] */
    worker_arg *worker_args;  /* [n_threads - 1] */
    int n_started;
    pthread_mutex_t mutex;
    pthread_cond_t start_cv, done_cv;
    unsigned generation;      /* bumped once per job */
    bool stop;
    bool busy;                /* a job is in flight (re-entrance check) */
    /* the current job */
    lily_task_fn fn;
    void *arg;
    int n_tasks;
    atomic_int next_task;
    int n_running;            /* workers that have not finished the current job */
};

static void run_tasks(lily_threadpool *pool, lily_task_fn fn, void *arg, int n_tasks, int thread)
{
    for (;;) {
        int t = atomic_fetch_add_explicit(&pool->next_task, 1, memory_order_relaxed);
        if (t >= n_tasks)
            break;
        fn(arg, t, thread);
    }
}

static void *worker_main(void *p)
{
    worker_arg *wa = p;
    lily_threadpool *pool = wa->pool;
    unsigned seen = 0;
    pthread_mutex_lock(&pool->mutex);
    for (;;) {
        while (pool->generation == seen && !pool->stop)
            pthread_cond_wait(&pool->start_cv, &pool->mutex);
        if (pool->stop)
            break;
        seen = pool->generation;
        lily_task_fn fn = pool->fn;
        void *arg = pool->arg;
        int n_tasks = pool->n_tasks;
        pthread_mutex_unlock(&pool->mutex);
        run_tasks(pool, fn, arg, n_tasks, wa->index);
        pthread_mutex_lock(&pool->mutex);
        if (--pool->n_running == 0)
            pthread_cond_signal(&pool->done_cv);
    }
    pthread_mutex_unlock(&pool->mutex);
    return NULL;
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
    atomic_init(&pool->next_task, 0);
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
    pthread_mutex_lock(&pool->mutex);
    pool->stop = true;
    pthread_cond_broadcast(&pool->start_cv);
    pthread_mutex_unlock(&pool->mutex);
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
    pthread_mutex_lock(&pool->mutex);
    LILY_ASSERT(!pool->busy); /* parallel_for is not re-entrant */
    pool->busy = true;
    pool->fn = fn;
    pool->arg = arg;
    pool->n_tasks = n_tasks;
    atomic_store_explicit(&pool->next_task, 0, memory_order_relaxed);
    pool->n_running = pool->n_started;
    pool->generation++;
    pthread_cond_broadcast(&pool->start_cv);
    pthread_mutex_unlock(&pool->mutex);

    run_tasks(pool, fn, arg, n_tasks, 0);

    pthread_mutex_lock(&pool->mutex);
    while (pool->n_running > 0)
        pthread_cond_wait(&pool->done_cv, &pool->mutex);
    pool->busy = false;
    pthread_mutex_unlock(&pool->mutex);
}
