/* scheduler.h — jobs, the bounded FIFO queue, and the one engine worker thread that runs them.
 *
 * Owns: a job's life between the HTTP connection that made it and the worker that runs it (a byte pipe
 * with a condition variable, a cancel flag, a reference count), the queue (503 when full), the worker
 * thread, and its model-loading phase (/health reports it). Does not own: what running a job means
 * (a lily_job_runner: server/service.c for the model, a fake in the tests) nor HTTP (server/http.c).
 *
 * Threads: connection threads create, submit and read jobs; the worker writes them. A job's output is an
 * HTTP status decided once (lily_job_begin), then bytes (lily_job_write), then the end (lily_job_finish).
 */
#ifndef LILY_SERVER_SCHEDULER_H
#define LILY_SERVER_SCHEDULER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "lily.h"
#include "server/openai.h"

typedef enum {
    LILY_ROUTE_CHAT = 0,      /* POST /v1/chat/completions */
    LILY_ROUTE_COMPLETIONS,   /* POST /v1/completions */
    LILY_ROUTE_TOKENIZE,      /* POST /tokenize */
    LILY_ROUTE_DETOKENIZE,    /* POST /detokenize */
    LILY_ROUTE_COUNT_TOKENS,  /* POST /v1/messages/count_tokens (req.anthropic); /v1/messages runs as CHAT */
} lily_route;

/* What the request log line reports. Written by the worker, read after lily_job_finish. */
typedef struct {
    int prompt_tokens, completion_tokens, cached_tokens;
    double prefill_tok_s, decode_tok_s;
    /* where the time to the first token went (milliseconds from the worker taking the job): the prompt
     * (template + tokenizer), a checkpoint restore, the prefill's forward passes (`pieces` of them), its
     * checkpoints; ttft_ms is the reply's first token's delivery (generated, or forced: a tool-call opening;
     * 0 when the reply has no token); flush_ms the checkpoints the prefill
     * deferred until after it (lily_prefix_cache_defer). decode_path: which decode ran and why (a static
     * string, NULL when no decode ran) */
    double prompt_ms, restore_ms, forward_ms, checkpoint_ms, ttft_ms, flush_ms;
    double worker_start_s;    /* lily_wall_seconds() when the worker took the job (0: never), for the queue wait */
    int pieces;
    const char *decode_path;
    bool has_seed;            /* the sampler's seed is known (the request got as far as sampling) */
    uint64_t seed;            /* the seed it sampled with: the request's, --seed's, or a random one */
} lily_job_stats;

/* The most bytes a stream may hold that its client has not read: past it the job is cancelled (the engine
 * never waits for a socket) and the connection closed. */
#define LILY_JOB_MAX_PENDING (4u << 20)

typedef struct lily_job {
    lily_route route;
    lily_oai_request req;     /* validated (chat / completions) */
    json_t *body;             /* the parsed body (tokenize / detokenize), owned */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int http_status;          /* 0 until lily_job_begin */
    bool streaming;           /* the response is an SSE stream */
    int sequence_number;      /* a Responses API stream (req.responses): the next event's sequence_number, kept
                               * by the worker, for an error event (lily_job_fail) */
    char *out;                /* bytes written by the worker, not yet read: out[out_off, out_len) */
    size_t out_len, out_cap, out_off;
    size_t written;           /* bytes written since the start (out_len restarts when all was read) */
    /* the first generated output (lily_job_write_output): where it ends in the body (0: none yet) and when
     * the worker wrote it (lily_wall_seconds), for the log's time to the first byte */
    size_t first_output_end;
    double first_output_s;
    bool finished;
    int refs;
    atomic_bool cancelled;    /* the client went away or the server is stopping */
    bool overflowed;          /* cancelled because the reader fell LILY_JOB_MAX_PENDING bytes behind */
    bool aborted;             /* cancelled by the server's shutdown: its client still waits for an answer */
    lily_job_stats stats;
} lily_job;

/* A job holding one reference for its creator. NULL on OOM. */
lily_job *lily_job_new(lily_route route);
void lily_job_unref(lily_job *job);

/* Worker side. begin sets the HTTP status (once) and whether the body is an SSE stream; write appends
 * bytes (LILY_ERR_OUT_OF_MEMORY, or LILY_ERR_CANCELLED when nobody will read them or when a stream's
 * unread bytes would pass LILY_JOB_MAX_PENDING: the job is then cancelled); finish ends the body. */
void lily_job_begin(lily_job *job, int http_status, bool streaming);
lily_status lily_job_write(lily_job *job, const char *data, size_t len);
void lily_job_finish(lily_job *job);
/* lily_job_write of generated output (a token's text, not the role chunk or an echo): the first such write
 * is remembered, where it ends in the body and when, in the same step (the reader never sees it unmarked). */
lily_status lily_job_write_output(lily_job *job, const char *data, size_t len);
/* The JSON error body with e's status, then finish: for a job that has not begun or whose whole body is
 * not sent yet (not streaming: what was written is replaced); after begin of a stream the error goes into
 * the stream as an SSE error event instead (the Messages API's "event: error", the Responses API's "error"
 * event with the stream's sequence_number). Written even when the job was aborted (lily_job_abort). */
void lily_job_fail(lily_job *job, const lily_oai_error *e);
bool lily_job_cancelled(lily_job *job);
/* True when the job was cancelled because its stream's reader fell behind (see LILY_JOB_MAX_PENDING). */
bool lily_job_overflowed(lily_job *job);
void lily_job_cancel(lily_job *job);
/* Cancel for the server's shutdown (lily_scheduler_abort): the worker stops at its next decode step and
 * answers with lily_job_fail, which its client still reads. */
void lily_job_abort(lily_job *job);
bool lily_job_aborted(lily_job *job);

/* Connection side: wait up to timeout_ms for the status (true when decided). */
bool lily_job_wait_begin(lily_job *job, int timeout_ms);
/* Copy up to max available bytes into buf, waiting up to timeout_ms for some. Returns the count (0 on a
 * timeout), or -1 when the job is finished and everything was read. */
long lily_job_read(lily_job *job, char *buf, size_t max, int timeout_ms);
/* Where the first generated output ends in the body (0: not written yet) and *written_s, when the worker
 * wrote it (lily_wall_seconds, CLOCK_MONOTONIC). */
size_t lily_job_first_output(lily_job *job, double *written_s);
/* Take the whole output once finished (caller frees); NULL with *len 0 when empty. */
char *lily_job_take_output(lily_job *job, size_t *len);

/* Runs one job on the worker thread: must call lily_job_begin ... lily_job_finish (or lily_job_fail), and
 * poll lily_job_cancelled at least once per decode step. */
typedef void (*lily_job_runner)(void *user, lily_job *job);
/* Loads the model on the worker thread before the first job (NULL: nothing to load). */
typedef lily_status (*lily_job_loader)(void *user, lily_error *err);

typedef enum { LILY_SCHED_LOADING = 0, LILY_SCHED_READY, LILY_SCHED_FAILED, LILY_SCHED_STOPPED } lily_sched_state;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* signals the worker: a job, or stop */
    lily_job **queue;         /* ring of queue_cap waiting jobs */
    int queue_cap, queue_head, queue_len;
    lily_job *running;
    bool stopping;
    lily_sched_state state;
    lily_error load_error;
    pthread_t worker;
    bool launched;            /* the worker thread runs (lily_scheduler_launch) */
    lily_job_runner run;
    lily_job_loader load;
    void *user;
} lily_scheduler;

/* Make the scheduler without its worker: state LOADING, submit refuses jobs (503) until the worker has
 * loaded. queue_cap >= 1 waiting jobs. Errors: LILY_ERR_INVALID_ARGUMENT, LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_scheduler_init(lily_scheduler *s, int queue_cap, lily_job_loader load, lily_job_runner run,
                                void *user, lily_error *err);
/* Start the worker of an initialized scheduler: it calls load (if any), then runs jobs in FIFO order.
 * (A server can listen first, so that a port it cannot take fails before the model loads.)
 * Errors: LILY_ERR_IO (thread creation; the state becomes FAILED). */
lily_status lily_scheduler_launch(lily_scheduler *s, lily_error *err);

/* Queue a job (takes a reference). LILY_ERR_UNSUPPORTED when the queue is full or the server is stopping
 * or not ready; the job is untouched then and the caller answers 503. */
lily_status lily_scheduler_submit(lily_scheduler *s, lily_job *job);

lily_sched_state lily_scheduler_state(lily_scheduler *s, int *n_waiting, int *n_running);

/* Wait for the load to end (READY or FAILED). */
lily_sched_state lily_scheduler_wait_loaded(lily_scheduler *s);

/* Stop taking jobs and fail the waiting ones with 503; the running one goes on. */
void lily_scheduler_drain(lily_scheduler *s);
/* True when no job runs or waits (and the model is not loading). */
bool lily_scheduler_idle(lily_scheduler *s);
/* lily_scheduler_drain, and cancel the running job (it ends at its next decode step). */
void lily_scheduler_abort(lily_scheduler *s);

/* Stop taking jobs, fail the waiting ones with 503, let the running one finish, join the worker (if
 * launched). */
void lily_scheduler_stop(lily_scheduler *s);

#endif
