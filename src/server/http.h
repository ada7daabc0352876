/* http.h — the HTTP front of `lily serve`: a libmicrohttpd daemon that routes, authenticates, reads
 * bodies, validates requests and hands jobs to the scheduler.
 *
 * Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health, GET /metrics
 * (Prometheus text), POST /tokenize, POST /detokenize (also without the /v1 prefix for the OpenAI ones).
 * Errors are OpenAI JSON: 400 bad request, 401 bad bearer token, 403 a browser page from an origin not
 * allowed (cors_origins), 404 unknown route, 405 wrong method, 413 body over max_body (a chunked one as soon as
 * it passes the limit, and the connection is closed unread), 415 a POST body that is not JSON, 503 queue full
 * or model loading, 400 a control character in the URL's path (never routed) and 414 a URL over 8 KiB or with
 * more than 1024 query arguments (server/target.h). A client that disconnects before its answer's end (before it
 * begins, or in the middle of a stream) is logged and counted in /metrics as 499 (nginx's "client closed
 * request"), not as a 5xx nor a 200; malformed HTTP is answered by microhttpd (400/413, a short HTML page) and
 * counted too. Each connection has its own thread (it may block waiting for its job); the engine worker is the
 * scheduler's and never waits for a socket.
 */
#ifndef LILY_SERVER_HTTP_H
#define LILY_SERVER_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "lily.h"
#include "server/scheduler.h"

typedef struct {
    const char *host;         /* address to bind; default "127.0.0.1"; "localhost" binds 127.0.0.1 and ::1 (the
                               * same port; 127.0.0.1 alone where there is no IPv6 loopback) */
    int port;                 /* 0 = any free port (lily_http_port says which) */
    const char *api_key;      /* NULL: no authentication */
    size_t max_body;          /* bytes; default 16 MiB */
    const char *model_name;   /* the id /v1/models lists and responses carry */
    int max_connections;      /* default 256, on all listeners together (localhost: 127.0.0.1 and ::1); one
                               * in eight is kept free for new clients by closing the
                               * oldest idle connections (every one whose request the engine does not
                               * hold: keep-alive, sending its request, reading a finished answer) */
    int idle_timeout_s;       /* seconds a connection may stay silent (headers, body, or reading its answer)
                               * before it is closed; default 10 */
    const char *cors_origins; /* NULL: browser pages on this machine only (loopback origins, and the server's
                               * own address); "A,B": those origins too; "*": any origin */
    /* More Prometheus text for GET /metrics (e.g. the prefix cache's counters): a malloc'd string the
     * server frees, or NULL. Called on a connection thread: it must be thread-safe. May be NULL. */
    char *(*metrics_extra)(void *user);
    void *metrics_user;
    /* The context in tokens (prompt and reply) once the model is loaded, else 0: /v1/models's max_model_len,
     * vLLM's field, which clients read to size their prompts. NULL: not given. */
    int (*context_length)(void *user);
    void *context_user;
    /* Runs a job that needs the tokenizer but not the engine (/tokenize, /detokenize,
     * /v1/messages/count_tokens) to its end on the calling connection's thread, once the model is loaded, so
     * that it does not wait in the queue behind a generation (llama.cpp answers these at once); at most 4 at a
     * time (more are queued). Thread-safe. NULL: such jobs are queued like any other. */
    void (*run_without_engine)(void *user, lily_job *job);
    void *run_user;
} lily_http_options;

typedef struct lily_http_server lily_http_server;

/* Bind and start serving; jobs go to sched (started by the caller, which outlives the server).
 * Errors: LILY_ERR_INVALID_ARGUMENT (bad host), LILY_ERR_IO (cannot bind: the message names host:port). */
lily_status lily_http_start(const lily_http_options *opts, lily_scheduler *sched, lily_http_server **out,
                            lily_error *err);

/* The port actually bound. */
int lily_http_port(const lily_http_server *srv);

/* Whether host "localhost" listens on ::1 too (false: another host, or no IPv6 loopback on this machine). */
bool lily_http_dual_loopback(const lily_http_server *srv);

/* Stop accepting connections (already-running responses keep going). */
void lily_http_quiesce(lily_http_server *srv);

/* Close every connection and free the server. Call after lily_scheduler_stop so responses are complete. */
void lily_http_stop(lily_http_server *srv);

#endif
