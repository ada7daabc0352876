/* scheduler.c — jobs, the bounded FIFO queue and the engine worker thread (scheduler.h).
 *
 * Owns: the job pipe (worker writes, connection reads), job reference counting, the queue and the worker
 * loop. The worker is the only thread that touches the model and the session, so generation needs no
 * locks; the queue lock is held only to move a job pointer.
 */
#include "server/scheduler.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "base/clock.h"
#include "server/anthropic.h"
#include "server/responses.h"


lily_job *lily_job_new(lily_route route)
{
    lily_job *job = calloc(1, sizeof *job);
    if (!job)
        return NULL;
    if (pthread_mutex_init(&job->mu, NULL)) {
        free(job);
        return NULL;
    }
    if (pthread_cond_init(&job->cv, NULL)) {
        pthread_mutex_destroy(&job->mu);
        free(job);
        return NULL;
    }
    job->route = route;
    job->refs = 1;
    atomic_init(&job->cancelled, false);
    return job;
}

void lily_job_unref(lily_job *job)
{
    if (!job)
        return;
    pthread_mutex_lock(&job->mu);
    int refs = --job->refs;
    pthread_mutex_unlock(&job->mu);
    if (refs > 0)
        return;
    lily_oai_request_free(&job->req);
    json_decref(job->body);
    free(job->out);
    pthread_cond_destroy(&job->cv);
    pthread_mutex_destroy(&job->mu);
    free(job);
}

static void deadline_after(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

void lily_job_begin(lily_job *job, int http_status, bool streaming)
{
    pthread_mutex_lock(&job->mu);
    if (!job->http_status) {
        job->http_status = http_status;
        job->streaming = streaming;
    }
    pthread_cond_broadcast(&job->cv);
    pthread_mutex_unlock(&job->mu);
}

/* Append len bytes to the job's output; job->mu held. */
static lily_status append_locked(lily_job *job, const char *data, size_t len)
{
    if (job->out_off > 0 && job->out_off == job->out_len)
        job->out_off = job->out_len = 0;
    if (job->out_len + len + 1 > job->out_cap) {
        size_t cap = job->out_cap ? job->out_cap : 4096;
        while (cap < job->out_len + len + 1)
            cap *= 2;
        char *p = realloc(job->out, cap);
        if (!p)
            return LILY_ERR_OUT_OF_MEMORY;
        job->out = p;
        job->out_cap = cap;
    }
    memcpy(job->out + job->out_len, data, len);
    job->out_len += len;
    job->written += len;
    job->out[job->out_len] = 0;
    pthread_cond_broadcast(&job->cv);
    return LILY_OK;
}

static lily_status job_write(lily_job *job, const char *data, size_t len, bool output)
{
    if (atomic_load(&job->cancelled))
        return LILY_ERR_CANCELLED;
    pthread_mutex_lock(&job->mu);
    /* the worker never waits for a socket: a stream whose reader fell this far behind is cancelled */
    if (job->streaming && job->out_len - job->out_off + len > LILY_JOB_MAX_PENDING) {
        job->overflowed = true;
        atomic_store(&job->cancelled, true);
        pthread_cond_broadcast(&job->cv);
        pthread_mutex_unlock(&job->mu);
        return LILY_ERR_CANCELLED;
    }
    lily_status st = append_locked(job, data, len);
    if (st == LILY_OK && output && len && !job->first_output_end) {
        job->first_output_end = job->written;
        job->first_output_s = lily_wall_seconds();
    }
    pthread_mutex_unlock(&job->mu);
    return st;
}

lily_status lily_job_write(lily_job *job, const char *data, size_t len)
{
    return job_write(job, data, len, false);
}

lily_status lily_job_write_output(lily_job *job, const char *data, size_t len)
{
    return job_write(job, data, len, true);
}

size_t lily_job_first_output(lily_job *job, double *written_s)
{
    pthread_mutex_lock(&job->mu);
    const size_t end = job->first_output_end;
    *written_s = job->first_output_s;
    pthread_mutex_unlock(&job->mu);
    return end;
}

void lily_job_finish(lily_job *job)
{
    pthread_mutex_lock(&job->mu);
    if (!job->http_status)
        job->http_status = 500;
    job->finished = true;
    pthread_cond_broadcast(&job->cv);
    pthread_mutex_unlock(&job->mu);
}

void lily_job_fail(lily_job *job, const lily_oai_error *e)
{
    char *body = job->req.anthropic ? lily_anth_error_json(e) : lily_oai_error_json(e);
    pthread_mutex_lock(&job->mu);
    /* a client gone for good reads nothing; an aborted job's client still waits for the error */
    bool writable = !atomic_load(&job->cancelled) || job->aborted;
    if (!job->http_status || !job->streaming) { /* nothing sent yet: the error is the whole answer */
        job->http_status = job->req.anthropic ? lily_anth_http_status(e->http_status) : e->http_status;
        job->streaming = false;
        job->out_len = job->out_off = 0;
        if (body && writable)
            append_locked(job, body, strlen(body));
    } else if (body && writable && job->req.responses) {
        /* the Responses API's in-band error: an "error" event in the stream's sequence */
        json_t *ev = lily_resp_error_event(e, job->sequence_number);
        size_t len = 0;
        char *sse = ev ? lily_oai_sse_event(ev, &len) : NULL;
        json_decref(ev);
        if (sse)
            append_locked(job, sse, len);
        free(sse);
    } else if (body && writable) {
        /* the status line is gone: an in-band error event, which the OpenAI SDKs raise as an APIError */
        if (job->req.anthropic) /* Anthropic's in-band error: an "error" event */
            append_locked(job, "event: error\n", 13);
        append_locked(job, "data: ", 6);
        append_locked(job, body, strlen(body));
        append_locked(job, "\n\n", 2);
    }
    pthread_cond_broadcast(&job->cv);
    pthread_mutex_unlock(&job->mu);
    free(body);
    lily_job_finish(job);
}

bool lily_job_cancelled(lily_job *job)
{
    return atomic_load(&job->cancelled);
}

void lily_job_cancel(lily_job *job)
{
    atomic_store(&job->cancelled, true);
    pthread_mutex_lock(&job->mu);
    pthread_cond_broadcast(&job->cv);
    pthread_mutex_unlock(&job->mu);
}

void lily_job_abort(lily_job *job)
{
    pthread_mutex_lock(&job->mu);
    job->aborted = true;
    pthread_mutex_unlock(&job->mu);
    lily_job_cancel(job);
}

bool lily_job_aborted(lily_job *job)
{
    pthread_mutex_lock(&job->mu);
    bool a = job->aborted;
    pthread_mutex_unlock(&job->mu);
    return a;
}

bool lily_job_overflowed(lily_job *job)
{
    pthread_mutex_lock(&job->mu);
    bool o = job->overflowed;
    pthread_mutex_unlock(&job->mu);
    return o;
}

bool lily_job_wait_begin(lily_job *job, int timeout_ms)
{
    pthread_mutex_lock(&job->mu);
    if (!job->http_status && timeout_ms > 0) {
        struct timespec ts;
        deadline_after(&ts, timeout_ms);
        while (!job->http_status && pthread_cond_timedwait(&job->cv, &job->mu, &ts) != ETIMEDOUT) {
        }
    }
    bool begun = job->http_status != 0;
    pthread_mutex_unlock(&job->mu);
    return begun;
}

long lily_job_read(lily_job *job, char *buf, size_t max, int timeout_ms)
{
    pthread_mutex_lock(&job->mu);
    if (job->out_off == job->out_len && !job->finished && timeout_ms > 0) {
        struct timespec ts;
        deadline_after(&ts, timeout_ms);
        while (job->out_off == job->out_len && !job->finished &&
               pthread_cond_timedwait(&job->cv, &job->mu, &ts) != ETIMEDOUT) {
        }
    }
    long n;
    if (job->out_off < job->out_len) {
        size_t k = LILY_MIN(max, job->out_len - job->out_off);
        memcpy(buf, job->out + job->out_off, k);
        job->out_off += k;
        n = (long)k;
        pthread_cond_broadcast(&job->cv); /* a writer may wait for room */
    } else {
        n = job->finished ? -1 : 0;
    }
    pthread_mutex_unlock(&job->mu);
    return n;
}

char *lily_job_take_output(lily_job *job, size_t *len)
{
    pthread_mutex_lock(&job->mu);
    char *out = NULL;
    *len = 0;
    if (job->out && job->out_off < job->out_len) {
        if (job->out_off)
            memmove(job->out, job->out + job->out_off, job->out_len - job->out_off);
        *len = job->out_len - job->out_off;
        out = job->out;
        job->out = NULL;
        job->out_len = job->out_off = job->out_cap = 0;
    }
    pthread_mutex_unlock(&job->mu);
    return out;
}

/* ---------------------------------------------------------------------------------------------------
 * the queue and the worker
 */

static void fail_unavailable(lily_job *job, const char *why)
{
    lily_oai_error e;
    lily_oai_error_set(&e, 503, "unavailable_error", NULL, NULL, "%s", why);
    lily_job_fail(job, &e);
}

static void *worker_main(void *arg)
{
    lily_scheduler *s = arg;
    lily_error err = {0};
    lily_status st = s->load ? s->load(s->user, &err) : LILY_OK;
    pthread_mutex_lock(&s->mu);
    s->state = st == LILY_OK ? LILY_SCHED_READY : LILY_SCHED_FAILED;
    if (st != LILY_OK)
        s->load_error = err;
    pthread_cond_broadcast(&s->cv);
    for (;;) {
        while (!s->queue_len && !s->stopping)
            pthread_cond_wait(&s->cv, &s->mu);
        if (!s->queue_len)
            break; /* stopping, nothing left */
        lily_job *job = s->queue[s->queue_head];
        s->queue_head = (s->queue_head + 1) % s->queue_cap;
        s->queue_len--;
        s->running = job;
        bool failed = s->state != LILY_SCHED_READY;
        pthread_mutex_unlock(&s->mu);

        if (failed)
            fail_unavailable(job, "The model failed to load.");
        else if (lily_job_cancelled(job))
            lily_job_finish(job); /* its client is gone: nothing to run */
        else
            s->run(s->user, job);
        if (!job->finished) /* a runner that forgot: never leave a connection waiting */
            lily_job_finish(job);
        lily_job_unref(job);

        pthread_mutex_lock(&s->mu);
        s->running = NULL;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

lily_status lily_scheduler_init(lily_scheduler *s, int queue_cap, lily_job_loader load, lily_job_runner run,
                                void *user, lily_error *err)
{
    memset(s, 0, sizeof *s);
    if (queue_cap < 1)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "queue size must be at least 1 (got %d)", queue_cap);
    s->queue = calloc((size_t)queue_cap, sizeof *s->queue);
    if (!s->queue)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory for a queue of %d", queue_cap);
    s->queue_cap = queue_cap;
    s->load = load;
    s->run = run;
    s->user = user;
    s->state = LILY_SCHED_LOADING;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    return LILY_OK;
}

lily_status lily_scheduler_launch(lily_scheduler *s, lily_error *err)
{
    if (pthread_create(&s->worker, NULL, worker_main, s)) {
        pthread_mutex_lock(&s->mu); /* a server already answering /health sees a failed load, not a loading one */
        s->state = LILY_SCHED_FAILED;
        lily_error_set(&s->load_error, LILY_ERR_IO, "cannot start the engine worker thread");
        pthread_mutex_unlock(&s->mu);
        return lily_error_set(err, LILY_ERR_IO, "cannot start the engine worker thread");
    }
    s->launched = true;
    return LILY_OK;
}

lily_status lily_scheduler_submit(lily_scheduler *s, lily_job *job)
{
    pthread_mutex_lock(&s->mu);
    lily_status st = LILY_OK;
    if (s->stopping || s->state != LILY_SCHED_READY || s->queue_len == s->queue_cap) {
        st = LILY_ERR_UNSUPPORTED;
    } else {
        pthread_mutex_lock(&job->mu);
        job->refs++;
        pthread_mutex_unlock(&job->mu);
        s->queue[(s->queue_head + s->queue_len) % s->queue_cap] = job;
        s->queue_len++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

lily_sched_state lily_scheduler_state(lily_scheduler *s, int *n_waiting, int *n_running)
{
    pthread_mutex_lock(&s->mu);
    lily_sched_state st = s->stopping ? LILY_SCHED_STOPPED : s->state;
    if (n_waiting)
        *n_waiting = s->queue_len;
    if (n_running)
        *n_running = s->running != NULL;
    pthread_mutex_unlock(&s->mu);
    return st;
}

lily_sched_state lily_scheduler_wait_loaded(lily_scheduler *s)
{
    pthread_mutex_lock(&s->mu);
    while (s->state == LILY_SCHED_LOADING)
        pthread_cond_wait(&s->cv, &s->mu);
    lily_sched_state st = s->state;
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* Fail the waiting jobs with 503 (s->mu held). */
static void fail_waiting(lily_scheduler *s)
{
    while (s->queue_len) {
        lily_job *job = s->queue[s->queue_head];
        s->queue_head = (s->queue_head + 1) % s->queue_cap;
        s->queue_len--;
        fail_unavailable(job, "The server is shutting down.");
        lily_job_unref(job);
    }
}

void lily_scheduler_drain(lily_scheduler *s)
{
    if (!s->queue)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    fail_waiting(s);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

bool lily_scheduler_idle(lily_scheduler *s)
{
    pthread_mutex_lock(&s->mu);
    bool idle = !s->running && !s->queue_len && s->state != LILY_SCHED_LOADING;
    pthread_mutex_unlock(&s->mu);
    return idle;
}

void lily_scheduler_abort(lily_scheduler *s)
{
    if (!s->queue)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    fail_waiting(s);
    if (s->running)
        lily_job_abort(s->running);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void lily_scheduler_stop(lily_scheduler *s)
{
    if (!s->queue)
        return;
    lily_scheduler_drain(s); /* waiting jobs get 503 now; the running one finishes its response */
    if (s->launched)
        pthread_join(s->worker, NULL);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s->queue);
    s->queue = NULL;
}
