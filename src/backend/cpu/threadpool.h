/* threadpool.h — a persistent pool of pthreads for the CPU backend's data-parallel loops.
 *
 * Owns: the worker threads and the one primitive the kernels use, parallel_for(). The calling thread
 * takes part in the work, so a pool of n threads starts n - 1 workers. Not re-entrant: a task must not
 * call parallel_for() on the same pool.
 */
#ifndef LILY_CPU_THREADPOOL_H
#define LILY_CPU_THREADPOOL_H

#include "lily.h"

/* One unit of work: `task` in [0, n_tasks), `thread` in [0, pool size) names the thread running it
 * (for per-thread scratch). */
typedef void (*lily_task_fn)(void *arg, int task, int thread);

typedef struct lily_threadpool lily_threadpool;

/* A pool of n_threads threads in all, the caller included (0 = every online core).
 * Errors: LILY_ERR_OUT_OF_MEMORY, LILY_ERR_BACKEND when a thread cannot be started. */
lily_status lily_threadpool_create(int n_threads, lily_threadpool **out, lily_error *err);
void lily_threadpool_destroy(lily_threadpool *pool);
/* Threads in the pool (1 for a NULL pool). */
int lily_threadpool_size(const lily_threadpool *pool);

/* Run fn(arg, task, thread) for every task in [0, n_tasks) and return when all are done. Tasks are
 * handed out dynamically; a NULL pool runs them in order on the caller. */
void parallel_for(lily_threadpool *pool, int n_tasks, lily_task_fn fn, void *arg);

#endif
