/* http.c — the libmicrohttpd daemon of `lily serve` (http.h).
 *
 * Owns: the request line's checks (target.h: a 414 written at the request line, a 400 before routing), routing,
 * the cross-origin policy (Origin check, preflight) and the JSON content-type check, the
 * bearer-token check, body accumulation with the --max-body cap, request validation (through openai.c)
 * before a job is queued, blocking on the job's pipe in the connection's own thread, SSE responses from a
 * content-reader callback, client-disconnect detection (the socket is polled while waiting, so a vanished
 * client cancels its job within one decode step), the connection slots (idle timeout, closing the oldest
 * idle connections to keep slots free), the /metrics counters and the per-request log line.
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include "server/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "base/clock.h"
#include "server/anthropic.h"
#include "server/responses.h"
#include "server/openai.h"
#include "server/target.h"
#include "server/webui.h"

/* GET /metrics status labels: one per status_class */
static const char *const status_labels[] = {"2xx", "400", "401", "403", "404_405", "413", "415", "4xx", "499",
                                            "503_529", "5xx"};
#define N_STATUS_CLASSES ((int)(sizeof status_labels / sizeof status_labels[0]))
#define STATUS_CLASS_OTHER_4XX 7 /* "4xx" */

/* One open connection (MHD's socket context). busy: the engine holds its request (queued or running: from
 * the job's submission to its end); every other connection is idle: a keep-alive one between requests, one
 * still sending its headers or body, or one whose answer is complete and still being written (a client that
 * sends or reads a byte now and then is not silent, so only the slot policy bounds it). */
typedef struct conn_slot {
    struct conn_slot *prev, *next;
    int fd;
    bool busy, evicted;
} conn_slot;

struct lily_http_server {
    struct MHD_Daemon *daemon;
    struct MHD_Daemon *daemon6; /* --host localhost: the ::1 listener beside daemon's 127.0.0.1 (NULL: none) */
    lily_scheduler *sched;
    lily_http_options opts;
    char *host, *api_key, *model_name;
    int port;
    atomic_int in_flight;     /* requests wholly received and not yet completely answered: the shutdown
                               * drains these (a client still sending its request gets no answer anyway) */
    /* GET /metrics counters, added to when a request completes */
    atomic_ullong n_by_status[N_STATUS_CLASSES]; /* by status_class */
    char **cors;              /* --cors-origin: origins allowed besides the loopback ones */
    int n_cors;
    bool cors_any;            /* --cors-origin '*' */
    /* open connections, oldest first, for keeping slots free (on_connection) */
    pthread_mutex_t conn_mu;
    struct conn_slot *conn_head, *conn_tail;
    int n_connections;        /* open on all listeners (both loopbacks of localhost): --max-connections bounds it */
    atomic_ullong n_cancelled, prompt_tokens, completion_tokens, cached_tokens;
    long long started;        /* unix seconds, for /v1/models */
    atomic_int n_without_engine; /* jobs running on connection threads now (run_or_submit) */
};

/* One request's state across the access-handler calls (MHD's con_cls). */
typedef struct {
    lily_http_server *srv;
    char method[8];
    char path[128];
    char *body;
    size_t body_len, body_cap;
    bool too_large;
    bool chunked;             /* the body comes in chunks (Transfer-Encoding: chunked): no length is declared */
    bool responded;
    int status;
    lily_job *job;            /* a queued job, shared with the worker */
    bool holds_engine;        /* the connection is marked busy: job submitted, not finished (conn_slot) */
    bool in_flight;           /* counted in lily_http_server.in_flight: the whole request is in */
    bool close_after;         /* answer with "Connection: close" (the request's framing is in doubt) */
    char allow_origin[256];   /* Access-Control-Allow-Origin of the answer ("" = none) */
    int fd;                   /* the connection's socket, polled for a vanished client */
    struct MHD_Connection *conn;
    struct timespec t0;
    /* when a stream's first generated output was handed to microhttpd, which writes it to the socket at once
     * in this connection's thread (CLOCK_MONOTONIC seconds; 0 until then) */
    double first_handed_s;
} request;

static void set_busy(lily_http_server *srv, struct MHD_Connection *c, bool busy);

/* The connection is no longer busy once its job has finished: what is left is writing the answer. */
static void release_engine_hold(request *r)
{
    if (r->holds_engine) {
        set_busy(r->srv, r->conn, false);
        r->holds_engine = false;
    }
}

/* The status microhttpd answered this connection's malformed request with (see on_mhd_log), else 0. */
static _Thread_local int mhd_error_status;

/* The request-target of this connection's request as sent (cut to 127 bytes) and the verdict on it
 * (target.h), from on_request_target: the request line is read before the access handler runs, in the same
 * thread. */
static _Thread_local char request_target[128];
static _Thread_local lily_target_verdict target_verdict;

/* This connection's request was answered at its request line (answer_at_request_line): what microhttpd logs
 * about it afterwards (its pool running out, the connection closed) is not news, nor its own 431. */
static _Thread_local bool target_refused;

/* This connection's stream was ended because its client left or fell too far behind (stream_reader): the
 * "application error" microhttpd then logs is that, already said by the request's log line. */
static _Thread_local bool stream_ended_for_client;

/* This connection's chunked body went past --max-body and was answered 413 at once (refuse_unbounded_body):
 * the "application reported internal error" microhttpd then logs is that closing. */
static _Thread_local bool body_refused;

/* ---------------------------------------------------------------------------------------------------
 * responses
 */

static void add_cors_headers(struct MHD_Response *resp, const request *r)
{
    if (!r->allow_origin[0])
        return;
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->allow_origin);
    if (strcmp(r->allow_origin, "*"))
        MHD_add_response_header(resp, "Vary", "Origin");
}

static enum MHD_Result send_body(struct MHD_Connection *c, request *r, int status, const char *content_type,
                                 char *body, size_t len, const char *allow)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", content_type);
    if (r->close_after)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    add_cors_headers(resp, r);
    if (allow)
        MHD_add_response_header(resp, "Allow", allow);
    if (status == 401)
        MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    if (status == 503 || status == 529) /* busy, loading or stopping: the SDKs wait this long, then retry */
        MHD_add_response_header(resp, "Retry-After", "1");
    r->status = status;
    r->responded = true;
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, request *r, int status, json_t *j)
{
    char *s = j ? lily_oai_dump(j) : NULL;
    json_decref(j);
    if (!s)
        return MHD_NO;
    return send_body(c, r, status, "application/json", s, strlen(s), NULL);
}

/* The Messages API's routes answer errors in Anthropic's shape. */
static bool anthropic_path(const char *path)
{
    return !strncmp(path, "/v1/messages", 12) || !strncmp(path, "/messages", 9);
}

/* The error's JSON body for r's route (a malloc'd string; NULL: out of memory) and its HTTP status in *status. */
static char *error_body(const request *r, const lily_oai_error *e, int *status)
{
    bool anthropic = anthropic_path(r->path);
    *status = anthropic ? lily_anth_http_status(e->http_status) : e->http_status;
    return anthropic ? lily_anth_error_json(e) : lily_oai_error_json(e);
}

static enum MHD_Result send_error(struct MHD_Connection *c, request *r, const lily_oai_error *e, const char *allow)
{
    int status;
    char *s = error_body(r, e, &status);
    if (!s)
        return MHD_NO;
    return send_body(c, r, status, "application/json", s, strlen(s), allow);
}

static enum MHD_Result send_simple_error(struct MHD_Connection *c, request *r, int status, const char *type,
                                         const char *code, const char *allow, const char *message)
{
    lily_oai_error e;
    lily_oai_error_set(&e, status, type, NULL, code, "%s", message);
    return send_error(c, r, &e, allow);
}

/* ---------------------------------------------------------------------------------------------------
 * the client is gone?
 */

/* True when the peer closed its end (FIN or RST). A pipelined request (readable data) is not a close. A client
 * that only half-closes (shutdown(SHUT_WR) after its request) sends the same FIN as one that left, and nothing
 * short of writing to it tells the two apart (a write to a closed peer draws a RST); no byte can go out before
 * the answer's status is known, so it is taken as gone, as nginx takes it (499). */
static bool client_gone(int fd)
{
    if (fd < 0)
        return false;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0)
        return false;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL))
        return true;
    if (p.revents & POLLIN) {
        char b;
        ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return false;
}

/* Wait until the worker decides the status; false when the client went away first. */
static bool wait_begin(request *r)
{
    while (!lily_job_wait_begin(r->job, 50))
        if (client_gone(r->fd))
            return false;
    return true;
}

/* The client went away before its response: cancel the job and end the request as 499 (nginx's "client
 * closed request"; the log and /metrics show it). An empty response with "Connection: close" is queued
 * (written into the void, or not at all) rather than returning MHD_NO, which microhttpd logs as
 * "Application reported internal error". */
static enum MHD_Result client_closed(struct MHD_Connection *c, request *r)
{
    lily_job_cancel(r->job);
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    r->status = 499;
    r->responded = true;
    enum MHD_Result ret = MHD_queue_response(c, 499, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* Start the connection's idle clock again. microhttpd counts the time our code spends waiting for the
 * engine (a queued request, a long prefill) as the client's silence; after such a wait the idle timeout
 * must measure the client from now. (Setting the timeout from 0 resets the clock.) */
static void restart_idle_clock(request *r)
{
    MHD_set_connection_option(r->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    MHD_set_connection_option(r->conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)r->srv->opts.idle_timeout_s);
}

/* The SSE body: whatever the worker wrote, as it comes. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    request *r = cls;
    for (;;) {
        if (lily_job_overflowed(r->job)) {
            stream_ended_for_client = true;
            return MHD_CONTENT_READER_END_WITH_ERROR; /* it fell too far behind: close */
        }
        long n = lily_job_read(r->job, buf, max, 50);
        if (r->holds_engine) {
            pthread_mutex_lock(&r->job->mu);
            bool finished = r->job->finished;
            pthread_mutex_unlock(&r->job->mu);
            if (finished)
                release_engine_hold(r);
        }
        if (n > 0) {
            restart_idle_clock(r);
            double written_s;
            const size_t first_end = r->first_handed_s > 0 ? 0 : lily_job_first_output(r->job, &written_s);
            if (first_end && pos + (uint64_t)n >= first_end) /* pos: the body bytes handed before these */
                r->first_handed_s = lily_wall_seconds();
            return n;
        }
        if (n < 0)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (client_gone(r->fd)) {
            lily_job_cancel(r->job);
            stream_ended_for_client = true;
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static enum MHD_Result respond_job(struct MHD_Connection *c, request *r)
{
    if (!wait_begin(r))
        return client_closed(c, r);
    restart_idle_clock(r);
    lily_job *job = r->job;
    if (job->streaming) {
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, r, NULL);
        if (!resp)
            return MHD_NO;
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        add_cors_headers(resp, r);
        r->status = job->http_status;
        r->responded = true;
        enum MHD_Result ret = MHD_queue_response(c, (unsigned)job->http_status, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    /* a whole body: wait for the end, watching the socket */
    for (;;) {
        pthread_mutex_lock(&job->mu);
        bool finished = job->finished;
        pthread_mutex_unlock(&job->mu);
        if (finished)
            break;
        if (client_gone(r->fd))
            return client_closed(c, r);
        pthread_mutex_lock(&job->mu);
        if (!job->finished) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&job->cv, &job->mu, &ts);
        }
        pthread_mutex_unlock(&job->mu);
    }
    release_engine_hold(r);
    restart_idle_clock(r);
    size_t len;
    char *out = lily_job_take_output(job, &len);
    if (!out) {
        out = strdup("");
        if (!out)
            return MHD_NO;
    }
    return send_body(c, r, job->http_status, "application/json", out, len, NULL);
}

/* ---------------------------------------------------------------------------------------------------
 * routes
 */

static bool path_is(const char *path, const char *want)
{
    if (!strcmp(path, want))
        return true;
    return !strncmp(want, "/v1/", 4) && !strcmp(path, want + 3); /* /chat/completions, /models, ... */
}

typedef enum {
    R_NONE, R_CHAT, R_COMPLETIONS, R_MODELS, R_MODEL, R_HEALTH, R_METRICS, R_TOKENIZE, R_DETOKENIZE, R_MESSAGES,
    R_COUNT_TOKENS, R_RESPONSES, R_WEBUI
} route_id;

static route_id route_of(const char *path, const char **allow)
{
    static const struct {
        const char *path;
        route_id id;
        const char *method;
    } routes[] = {
        {"/v1/chat/completions", R_CHAT, "POST"}, {"/v1/completions", R_COMPLETIONS, "POST"},
        {"/v1/models", R_MODELS, "GET"},         {"/health", R_HEALTH, "GET"},
        {"/v1/health", R_HEALTH, "GET"},         {"/tokenize", R_TOKENIZE, "POST"},
        {"/detokenize", R_DETOKENIZE, "POST"},   {"/metrics", R_METRICS, "GET"},
        {"/v1/messages", R_MESSAGES, "POST"},    {"/v1/messages/count_tokens", R_COUNT_TOKENS, "POST"},
        {"/v1/responses", R_RESPONSES, "POST"},  {"/", R_WEBUI, "GET"},
        {"/index.html", R_WEBUI, "GET"},
    };
    if (!strncmp(path, "/v1/models/", 11) || !strncmp(path, "/models/", 8)) { /* GET /v1/models/{id} */
        *allow = "GET";
        return R_MODEL;
    }
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (path_is(path, routes[i].path)) {
            *allow = routes[i].method;
            return routes[i].id;
        }
    return R_NONE;
}

/* Whether rest (a path without its /v1) is name or under name/: "/embeddings", "/embeddings/x", not "/embeddingsx". */
static bool path_under(const char *rest, const char *name)
{
    size_t n = strlen(name);
    return !strncmp(rest, name, n) && (rest[n] == 0 || rest[n] == '/');
}

/* What to say after "Unknown request URL" for a path a client of another API or a misset base URL sends:
 * the Responses API's routes for stored responses (retrieve, delete, cancel, input_items), the OpenAI API's
 * routes for other kinds of model (embeddings, audio, images, ...: a client that shares one base URL for
 * chat and embeddings calls them), Ollama's own API, a base URL ending in /v1 that the client extended with /v1
 * again. NULL for any other path. */
static const char *unknown_url_hint(const char *path)
{
    static const char *const other_models[] = {"/embeddings", "/audio", "/images", "/moderations", "/rerank",
                                               "/realtime"};
    const char *rest = !strncmp(path, "/v1/", 4) ? path + 3 : path; /* the routes answer without /v1 too */
    for (size_t i = 0; i < sizeof other_models / sizeof other_models[0]; i++)
        if (path_under(rest, other_models[i]))
            return " lily serves one chat model for text generation and has no such route: its routes are POST "
                   "/v1/chat/completions, /v1/completions, /v1/responses and /v1/messages (give this client "
                   "another server for embeddings, audio, images, moderation or reranking).";
    if (!strncmp(rest, "/responses/", 11))
        return " lily's Responses API is stateless: POST /v1/responses answers, but no response is stored to "
               "retrieve, cancel or delete.";
    if (!strncmp(path, "/api/", 5))
        return " lily does not speak Ollama's API: configure the client for an OpenAI-compatible server, base URL "
               "http://HOST:PORT/v1.";
    if (!strncmp(path, "/v1/v1/", 7))
        return " The client's base URL ends in /v1 and the client added /v1 again: give it http://HOST:PORT.";
    return NULL;
}

/* Constant-time comparison of the presented token with the key (time depends on the key's length only). */
static bool token_matches(const char *given, const char *key)
{
    size_t glen = strlen(given), klen = strlen(key);
    unsigned char diff = glen != klen;
    for (size_t i = 0; i < klen; i++)
        diff |= (unsigned char)(key[i] ^ (i < glen ? given[i] : 0));
    return diff == 0;
}

static bool authorized(struct MHD_Connection *c, const char *api_key)
{
    if (!api_key || !*api_key)
        return true;
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"); /* Anthropic's header */
    if (x && token_matches(x, api_key))
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7))
        return false;
    h += 7;
    while (*h == ' ')
        h++;
    return token_matches(h, api_key);
}

static enum MHD_Result handle_health(struct MHD_Connection *c, request *r)
{
    int waiting = 0, running = 0;
    lily_sched_state st = lily_scheduler_state(r->srv->sched, &waiting, &running);
    if (st == LILY_SCHED_LOADING)
        return send_simple_error(c, r, 503, "unavailable_error", NULL, NULL, "Loading model");
    if (st == LILY_SCHED_FAILED)
        return send_simple_error(c, r, 503, "unavailable_error", NULL, NULL, "The model failed to load");
    if (st == LILY_SCHED_STOPPED)
        return send_simple_error(c, r, 503, "unavailable_error", NULL, NULL, "The server is shutting down");
    return send_json(c, r, 200, json_pack("{s:s, s:i, s:i}", "status", "ok", "requests_processing", running,
                                          "requests_waiting", waiting));
}

/* The served model as both APIs describe one: OpenAI's {id, object, created, owned_by} and Anthropic's {id,
 * type, display_name, created_at (RFC 3339)}; "created" is when the server started. max_model_len, vLLM's
 * field (the context in tokens, prompt and reply together), once the model is loaded. */
static json_t *model_object(const lily_http_server *srv)
{
    char when[32];
    time_t t = (time_t)srv->started;
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    json_t *model = json_pack("{s:s, s:s, s:I, s:s, s:s, s:s, s:s}", "id", srv->model_name, "object", "model",
                              "created", (json_int_t)srv->started, "owned_by", "lily", "type", "model", "display_name",
                              srv->model_name, "created_at", when);
    int context_length = srv->opts.context_length ? srv->opts.context_length(srv->opts.context_user) : 0;
    if (model && context_length > 0)
        json_object_set_new(model, "max_model_len", json_integer(context_length));
    return model;
}

/* GET /v1/models: OpenAI's list, with Anthropic's paging fields (one page). */
static enum MHD_Result handle_models(struct MHD_Connection *c, request *r)
{
    return send_json(c, r, 200, json_pack("{s:s, s:[o], s:b, s:s, s:s}", "object", "list", "data",
                                          model_object(r->srv), "has_more", 0, "first_id", r->srv->model_name,
                                          "last_id", r->srv->model_name));
}

static void printable_ascii(char *dst, size_t cap, const char *s);

/* GET /v1/models/{id}: the model object when id is the served model's, else OpenAI's 404 model_not_found. */
static enum MHD_Result handle_model(struct MHD_Connection *c, request *r, const char *url)
{
    const char *id = !strncmp(url, "/v1/", 4) ? url + 11 : url + 8; /* after "/v1/models/" or "/models/" */
    if (strcmp(id, r->srv->model_name)) {
        char msg[256], id_text[160];
        printable_ascii(id_text, sizeof id_text, id);
        snprintf(msg, sizeof msg, "The model '%s' does not exist (this server serves '%s').", id_text,
                 r->srv->model_name);
        return send_simple_error(c, r, 404, "invalid_request_error", "model_not_found", NULL, msg);
    }
    return send_json(c, r, 200, model_object(r->srv));
}

/* GET /: the chat page (webui.h). */
static enum MHD_Result handle_webui(struct MHD_Connection *c, request *r)
{
    size_t len;
    const char *page = lily_webui_page(&len);
    char *body = malloc(len ? len : 1);
    if (!body)
        return MHD_NO;
    memcpy(body, page, len);
    return send_body(c, r, 200, "text/html; charset=utf-8", body, len, NULL);
}

/* The index in status_labels. A 503 (queue full, model loading, shutting down; 529 on the Messages API) is
 * not counted as a server error: it says "come back later". A 505 is only ever microhttpd's answer to a
 * request line of another HTTP version (an HTTP/2 preface, a probe): the client's error, counted with the
 * other 4xx so that "5xx" stays the server's own errors. */
static int status_class(int status)
{
    static const int codes[] = {0, 400, 401, 403, 404, 413, 415};
    if (status < 400)
        return 0;
    if (status == 405)
        return 4;
    for (int i = 1; i < (int)(sizeof codes / sizeof codes[0]); i++)
        if (status == codes[i])
            return i;
    if (status < 499 || status == 505)
        return STATUS_CLASS_OTHER_4XX;
    return status == 499 ? 8 : status == 503 || status == 529 ? 9 : 10;
}

static enum MHD_Result handle_metrics(struct MHD_Connection *c, request *r)
{
    lily_http_server *srv = r->srv;
    int waiting = 0, running = 0;
    lily_scheduler_state(srv->sched, &waiting, &running);
    char *extra = srv->opts.metrics_extra ? srv->opts.metrics_extra(srv->opts.metrics_user) : NULL;
    size_t cap = 2048 + (extra ? strlen(extra) : 0);
    char *out = malloc(cap);
    if (!out) {
        free(extra);
        return MHD_NO;
    }
    int n = snprintf(out, cap, "# HELP lily_requests_total Requests answered, by status (499: the client closed the connection first).\n# TYPE lily_requests_total counter\n");
    for (int i = 0; i < N_STATUS_CLASSES; i++)
        n += snprintf(out + n, cap - (size_t)n, "lily_requests_total{status=\"%s\"} %llu\n", status_labels[i],
                      (unsigned long long)atomic_load(&srv->n_by_status[i]));
    n += snprintf(out + n, cap - (size_t)n,
                  "# HELP lily_requests_cancelled_total Generations cancelled by a client that went away.\n"
                  "# TYPE lily_requests_cancelled_total counter\nlily_requests_cancelled_total %llu\n"
                  "# HELP lily_prompt_tokens_total Prompt tokens of finished requests.\n"
                  "# TYPE lily_prompt_tokens_total counter\nlily_prompt_tokens_total %llu\n"
                  "# HELP lily_completion_tokens_total Generated tokens.\n"
                  "# TYPE lily_completion_tokens_total counter\nlily_completion_tokens_total %llu\n"
                  "# HELP lily_cached_tokens_total Prompt tokens reused from the session instead of prefilled.\n"
                  "# TYPE lily_cached_tokens_total counter\nlily_cached_tokens_total %llu\n"
                  "# HELP lily_requests_processing Requests the engine is running.\n"
                  "# TYPE lily_requests_processing gauge\nlily_requests_processing %d\n"
                  "# HELP lily_requests_waiting Requests waiting in the queue.\n"
                  "# TYPE lily_requests_waiting gauge\nlily_requests_waiting %d\n%s",
                  (unsigned long long)atomic_load(&srv->n_cancelled), (unsigned long long)atomic_load(&srv->prompt_tokens),
                  (unsigned long long)atomic_load(&srv->completion_tokens),
                  (unsigned long long)atomic_load(&srv->cached_tokens), running, waiting, extra ? extra : "");
    free(extra);
    return send_body(c, r, 200, "text/plain; version=0.0.4", out, strlen(out), NULL);
}

/* The most text /tokenize takes: its token ids and their JSON stay within a few tens of MB. */
#define LILY_TOKENIZE_MAX_CONTENT (1 << 20)

/* /tokenize {"content": str, "add_special"?: bool, "with_pieces"?: bool};
 * /detokenize {"tokens": [int]} — llama.cpp's server shapes. Validated here, run by the worker. */
static bool check_tokenize_body(route_id id, json_t *body, lily_oai_error *e)
{
    if (!json_is_object(body)) {
        lily_oai_error_set(e, 400, "invalid_request_error", NULL, NULL, "Invalid request body: expected a JSON object.");
        return false;
    }
    if (id == R_TOKENIZE) {
        if (!json_is_string(json_object_get(body, "content"))) {
            lily_oai_error_set(e, 400, "invalid_request_error", "content", NULL,
                               "Missing or invalid 'content': expected a string.");
            return false;
        }
        if (json_string_length(json_object_get(body, "content")) > LILY_TOKENIZE_MAX_CONTENT) {
            lily_oai_error_set(e, 400, "invalid_request_error", "content", NULL,
                               "Invalid 'content': %zu bytes is over the limit of %d bytes for /tokenize.",
                               json_string_length(json_object_get(body, "content")), LILY_TOKENIZE_MAX_CONTENT);
            return false;
        }
        return true;
    }
    json_t *tokens = json_object_get(body, "tokens");
    if (!json_is_array(tokens)) {
        lily_oai_error_set(e, 400, "invalid_request_error", "tokens", NULL,
                           "Missing or invalid 'tokens': expected an array of token ids.");
        return false;
    }
    size_t i;
    json_t *t;
    json_array_foreach(tokens, i, t) {
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX) {
            lily_oai_error_set(e, 400, "invalid_request_error", "tokens", NULL,
                               "Invalid 'tokens[%zu]': expected a non-negative integer token id.", i);
            return false;
        }
    }
    return true;
}

static enum MHD_Result submit(struct MHD_Connection *c, request *r, lily_job *job)
{
    if (lily_scheduler_submit(r->srv->sched, job) != LILY_OK) {
        lily_sched_state st = lily_scheduler_state(r->srv->sched, NULL, NULL);
        lily_job_unref(job);
        if (st == LILY_SCHED_LOADING)
            return send_simple_error(c, r, 503, "unavailable_error", NULL, NULL, "Loading model");
        if (st == LILY_SCHED_STOPPED)
            return send_simple_error(c, r, 503, "unavailable_error", NULL, NULL, "The server is shutting down");
        if (st == LILY_SCHED_FAILED)
            return send_simple_error(c, r, 503, "unavailable_error", NULL, NULL, "The model failed to load");
        return send_simple_error(c, r, 503, "unavailable_error", "queue_full", NULL,
                                 "The server is busy: the request queue is full (--queue). Retry later.");
    }
    r->job = job;
    set_busy(r->srv, c, true);
    r->holds_engine = true;
    return respond_job(c, r);
}

/* At most this many jobs without the engine run on connection threads at once; more wait in the queue, so that
 * a burst of 1 MiB /tokenize requests takes a few cores, not one per connection, beside the engine. */
#define LILY_HTTP_MAX_WITHOUT_ENGINE 4

/* A job that needs no engine (http.h, run_without_engine): run here once the model is loaded, else queued (the
 * queue answers 503 while the model loads or the server stops, as for any job). */
static enum MHD_Result run_or_submit(struct MHD_Connection *c, request *r, lily_job *job)
{
    lily_http_server *srv = r->srv;
    if (!srv->opts.run_without_engine || lily_scheduler_state(srv->sched, NULL, NULL) != LILY_SCHED_READY)
        return submit(c, r, job);
    if (atomic_fetch_add(&srv->n_without_engine, 1) >= LILY_HTTP_MAX_WITHOUT_ENGINE) {
        atomic_fetch_sub(&srv->n_without_engine, 1);
        return submit(c, r, job);
    }
    srv->opts.run_without_engine(srv->opts.run_user, job);
    atomic_fetch_sub(&srv->n_without_engine, 1);
    r->job = job;
    return respond_job(c, r);
}

static enum MHD_Result handle_post(struct MHD_Connection *c, request *r, route_id id)
{
    lily_oai_error e;
    if (id == R_MESSAGES || id == R_COUNT_TOKENS) {
        lily_job *job = lily_job_new(id == R_MESSAGES ? LILY_ROUTE_CHAT : LILY_ROUTE_COUNT_TOKENS);
        if (!job)
            return send_simple_error(c, r, 500, "server_error", NULL, NULL, "Out of memory.");
        if (!lily_anth_parse_request(r->body ? r->body : "", r->body_len, id == R_COUNT_TOKENS, &job->req, &e)) {
            lily_job_unref(job);
            return send_error(c, r, &e, NULL);
        }
        return id == R_COUNT_TOKENS ? run_or_submit(c, r, job) : submit(c, r, job);
    }
    if (id == R_RESPONSES) {
        lily_job *job = lily_job_new(LILY_ROUTE_CHAT);
        if (!job)
            return send_simple_error(c, r, 500, "server_error", NULL, NULL, "Out of memory.");
        if (!lily_resp_parse_request(r->body ? r->body : "", r->body_len, &job->req, &e)) {
            lily_job_unref(job);
            return send_error(c, r, &e, NULL);
        }
        return submit(c, r, job);
    }
    if (id == R_CHAT || id == R_COMPLETIONS) {
        lily_job *job = lily_job_new(id == R_CHAT ? LILY_ROUTE_CHAT : LILY_ROUTE_COMPLETIONS);
        if (!job)
            return send_simple_error(c, r, 500, "server_error", NULL, NULL, "Out of memory.");
        if (!lily_oai_parse_request(r->body ? r->body : "", r->body_len, id == R_CHAT, &job->req, &e)) {
            lily_job_unref(job);
            return send_error(c, r, &e, NULL);
        }
        return submit(c, r, job);
    }
    json_t *body;
    if (!lily_oai_json_load(r->body ? r->body : "", r->body_len, &body, &e))
        return send_error(c, r, &e, NULL);
    if (!check_tokenize_body(id, body, &e)) {
        json_decref(body);
        return send_error(c, r, &e, NULL);
    }
    lily_job *job = lily_job_new(id == R_TOKENIZE ? LILY_ROUTE_TOKENIZE : LILY_ROUTE_DETOKENIZE);
    if (!job) {
        json_decref(body);
        return send_simple_error(c, r, 500, "server_error", NULL, NULL, "Out of memory.");
    }
    job->body = body;
    return run_or_submit(c, r, job);
}

/* ---------------------------------------------------------------------------------------------------
 * cross-origin requests and content types
 */

/* "http://" or "https://" followed by a loopback host and an optional port: a page served from this machine. */
static bool loopback_origin(const char *origin)
{
    const char *h = !strncasecmp(origin, "http://", 7) ? origin + 7 : !strncasecmp(origin, "https://", 8) ? origin + 8 : NULL;
    if (!h)
        return false;
    static const char *const hosts[] = {"localhost", "127.0.0.1", "[::1]"};
    for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++) {
        size_t n = strlen(hosts[i]);
        if (strncasecmp(h, hosts[i], n))
            continue;
        const char *p = h + n;
        if (!*p)
            return true;
        if (*p++ != ':' || !*p)
            return false;
        while (*p >= '0' && *p <= '9')
            p++;
        return !*p;
    }
    return false;
}

/* A page served by this server itself, reached by an IP address (http://ADDR[:PORT] equal to the Host
 * header). A host name is not trusted this way: a page could point its own name at this address (DNS
 * rebinding); --cors-origin names such origins. */
static bool same_origin_by_address(const char *origin, const char *host)
{
    if (!host || strncasecmp(origin, "http://", 7) || strcasecmp(origin + 7, host))
        return false;
    if (host[0] == '[')
        return true;
    char addr[64];
    size_t n = strcspn(host, ":");
    if (n >= sizeof addr)
        return false;
    memcpy(addr, host, n);
    addr[n] = 0;
    struct in_addr a;
    return inet_pton(AF_INET, addr, &a) == 1;
}

/* Whether a request with this Origin header (NULL: none, as from curl or an SDK outside a browser) may be
 * served; *allow is then the Access-Control-Allow-Origin to answer with ("" for none). */
static bool origin_allowed(const lily_http_server *srv, const char *origin, const char *host, char *allow, size_t cap)
{
    allow[0] = 0;
    if (!origin)
        return true;
    bool ok = srv->cors_any || loopback_origin(origin) || same_origin_by_address(origin, host);
    for (int i = 0; !ok && i < srv->n_cors; i++)
        ok = !strcasecmp(origin, srv->cors[i]);
    const char *echo = srv->cors_any ? "*" : origin;
    if (ok && strlen(echo) < cap) /* an origin too long to echo is refused */
        snprintf(allow, cap, "%s", echo);
    return ok && allow[0];
}

/* A request header a browser client may send cross-origin: the OpenAI SDKs' and the Anthropic API's. */
static bool allowed_request_header(const char *name, size_t n)
{
    static const char *const names[] = {"authorization", "content-type", "accept", "openai-organization",
                                        "openai-project", "openai-beta", "x-api-key", "anthropic-version",
                                        "anthropic-beta", "anthropic-dangerous-direct-browser-access",
                                        "x-request-id"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i]) == n && !strncasecmp(name, names[i], n))
            return true;
    return n > 12 && !strncasecmp(name, "x-stainless-", 12);
}

/* Access-Control-Allow-Headers for a preflight: the headers it asks for that are allowed. */
static void preflight_allow_headers(const char *requested, char *out, size_t cap)
{
    snprintf(out, cap, "Authorization, Content-Type");
    size_t len = strlen(out);
    for (const char *p = requested; p && *p;) {
        p += strspn(p, " \t,");
        size_t n = strcspn(p, ",");
        size_t k = n;
        while (k > 0 && (p[k - 1] == ' ' || p[k - 1] == '\t'))
            k--;
        if (k && allowed_request_header(p, k) && strncasecmp(p, "authorization", k) && strncasecmp(p, "content-type", k) &&
            len + k + 3 < cap) {
            memcpy(out + len, ", ", 2);
            memcpy(out + len + 2, p, k);
            len += k + 2;
            out[len] = 0;
        }
        p += n;
    }
}

/* A JSON media type (application/json, or any ...+json), whatever its parameters. No header: accepted. */
static bool json_content_type(const char *ct)
{
    if (!ct)
        return true;
    ct += strspn(ct, " \t");
    size_t n = strcspn(ct, "; \t");
    return (n == 16 && !strncasecmp(ct, "application/json", 16)) || (n > 5 && !strncasecmp(ct + n - 5, "+json", 5));
}

/* ---------------------------------------------------------------------------------------------------
 * connections: slots kept free for new clients
 */

static conn_slot *slot_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void set_busy(lily_http_server *srv, struct MHD_Connection *c, bool busy)
{
    pthread_mutex_lock(&srv->conn_mu);
    conn_slot *slot = slot_of(c);
    if (slot)
        slot->busy = busy;
    pthread_mutex_unlock(&srv->conn_mu);
}

/* A new connection is refused (closed at once, as microhttpd's own limit does) when max_connections are open
 * on all listeners together: microhttpd's limit counts each daemon's alone, and localhost has two. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    (void)addr;
    (void)addrlen;
    lily_http_server *srv = cls;
    pthread_mutex_lock(&srv->conn_mu);
    const bool room = srv->n_connections < srv->opts.max_connections;
    pthread_mutex_unlock(&srv->conn_mu);
    return room ? MHD_YES : MHD_NO;
}

/* A connection opened or closed. When the open connections reach max_connections less a reserve (one in
 * eight), the oldest idle ones (see conn_slot) are shut down, so idle clients, and clients that send their
 * request or read their answer a byte at a time, can never take the slots a new client needs; busy ones
 * (the engine holds their request: at most --queue + 1) are never touched. One over max_connections (two
 * listeners' accepts passed on_accept at once) is shut down itself. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    lily_http_server *srv = cls;
    pthread_mutex_lock(&srv->conn_mu);
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_slot *slot = calloc(1, sizeof *slot);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const bool over = ++srv->n_connections > srv->opts.max_connections;
        if (over && ci)
            shutdown(ci->connect_fd, SHUT_RDWR); /* its thread sees the close and ends the connection */
        if (slot) {
            slot->evicted = over;
            slot->fd = ci ? ci->connect_fd : -1;
            slot->prev = srv->conn_tail;
            if (srv->conn_tail)
                srv->conn_tail->next = slot;
            else
                srv->conn_head = slot;
            srv->conn_tail = slot;
        }
        *socket_context = slot;
        int keep = srv->opts.max_connections - LILY_MAX(1, srv->opts.max_connections / 8);
        int open = 0;
        for (conn_slot *p = srv->conn_head; p; p = p->next)
            open += !p->evicted;
        for (conn_slot *p = srv->conn_head; p && open > keep && !over; p = p->next)
            if (!p->busy && !p->evicted && p != slot && p->fd >= 0) {
                shutdown(p->fd, SHUT_RDWR); /* its thread sees the close and ends the connection */
                p->evicted = true;
                open--;
            }
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        srv->n_connections--;
    }
    if (toe == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) {
        conn_slot *slot = *socket_context;
        if (slot->prev)
            slot->prev->next = slot->next;
        else
            srv->conn_head = slot->next;
        if (slot->next)
            slot->next->prev = slot->prev;
        else
            srv->conn_tail = slot->prev;
        free(slot);
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&srv->conn_mu);
}

/* s as printable ASCII for an error message: at most cap - 1 bytes, each byte outside '!'..'~' written as %XX,
 * so the message stays valid UTF-8 (JSON) whatever the client sent (a URL that unescapes to invalid UTF-8,
 * or a cut would split a character). */
static void printable_ascii(char *dst, size_t cap, const char *s)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && n + 4 <= cap; p++) {
        if (*p >= '!' && *p <= '~')
            dst[n++] = (char)*p;
        else
            n += (size_t)snprintf(dst + n, cap - n, "%%%02X", *p);
    }
    dst[n] = 0;
}

/* The request's body framing headers, for request_framing_ambiguous. */
typedef struct {
    const char *content_length; /* the first Content-Length */
    const char *coding;         /* the first Transfer-Encoding */
    bool lengths_differ, chunked;
    bool other_coding;          /* a Transfer-Encoding other than one "chunked" */
} framing_scan;

static enum MHD_Result scan_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    framing_scan *f = cls;
    value = value ? value : "";
    if (!strcasecmp(key, "Content-Length")) {
        if (!f->content_length)
            f->content_length = value;
        else if (strcmp(f->content_length, value))
            f->lengths_differ = true;
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        f->other_coding |= f->chunked || strcasecmp(value, "chunked"); /* what microhttpd decodes */
        if (!f->coding)
            f->coding = value;
        f->chunked = true;
    }
    return MHD_YES;
}

/* Whether the body's end is in doubt: Content-Length headers that disagree, or a Content-Length beside a
 * Transfer-Encoding. A proxy in front of lily may frame such a request otherwise (request smuggling), so it
 * is refused and its connection closed (RFC 9112, sections 6.1 and 6.3). */
static bool request_framing_ambiguous(const framing_scan *f)
{
    return f->lengths_differ || (f->content_length && f->chunked);
}

/* The request's Transfer-Encoding when it is not a single "chunked" (gzip, "gzip, chunked", identity, or the
 * header twice), else NULL. microhttpd decodes only chunked; it reads any other coded body to the end of the
 * connection, so such a request would never be answered (until the idle timeout closes it). A server that
 * cannot decode a request's transfer coding refuses it (RFC 9112 section 6.1). */
static const char *unsupported_transfer_coding(const framing_scan *f)
{
    return f->other_coding ? f->coding : NULL;
}

/* The path of a request-target: an absolute-form target ("http://host:port/v1/models", what a client talking
 * to a proxy sends; servers must accept it, RFC 9112 section 3.2.2) by its path, "/" when it has none; an
 * origin-form target ("/v1/models") as it is. */
static const char *request_path(const char *url)
{
    size_t scheme = !strncasecmp(url, "http://", 7) ? 7 : !strncasecmp(url, "https://", 8) ? 8 : 0;
    if (!scheme)
        return url;
    const char *slash = strchr(url + scheme, '/');
    return slash ? slash : "/";
}

static void log_request_line(const char *method, const char *path, int status, const char *tail, double secs);

/* Write all of data to the connection's socket (non-blocking: waits up to 1 s for room). False on failure. */
static bool write_socket(int fd, const char *data, size_t len)
{
    while (len) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n > 0) {
            data += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK) || poll(&p, 1, 1000) <= 0)
            return false;
    }
    return true;
}

/* Answer a request-target microhttpd cannot parse safely (target.h) with 414, before it tries. microhttpd
 * cannot be asked to answer at this point, and with too many query arguments its own 431 would be lost
 * (target.h), so lily writes the response to the socket itself and ends its side: the client reads the answer,
 * then the end of the connection; the access handler, if microhttpd calls it, closes the connection. Nothing
 * is allocated for the request (microhttpd may end such a connection without telling on_completed), so it is
 * logged and counted here. */
static void answer_at_request_line(lily_http_server *srv, struct MHD_Connection *c, const char *target,
                                   size_t n_args)
{
    char msg[256];
    if (target_verdict == LILY_TARGET_TOO_LONG)
        snprintf(msg, sizeof msg, "The request URL is longer than %d bytes.", LILY_HTTP_MAX_TARGET);
    else
        snprintf(msg, sizeof msg, "The request URL has %zu query arguments; at most %d are accepted.", n_args,
                 LILY_HTTP_MAX_QUERY_ARGS);
    lily_oai_error e;
    lily_oai_error_set(&e, 414, "invalid_request_error", NULL, "uri_too_long", "%s", msg);
    char *body = anthropic_path(target) ? lily_anth_error_json(&e) : lily_oai_error_json(&e);
    char head[256];
    int n = snprintf(head, sizeof head, "HTTP/1.1 414 URI Too Long\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n", body ? strlen(body) : 0);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) {
        if (write_socket(ci->connect_fd, head, (size_t)n) && body)
            write_socket(ci->connect_fd, body, strlen(body));
        shutdown(ci->connect_fd, SHUT_WR);
    }
    free(body);
    atomic_fetch_add(&srv->n_by_status[status_class(414)], 1);
    log_request_line("-", target, 414, "", 0.0);
}

/* A chunked body past --max-body: answer 413 now and close the connection, without reading the rest. Such a
 * body declares no end, so reading and dropping it to answer afterwards (as a declared Content-Length is) could
 * go on as long as the client sends. microhttpd (0.9.75, and its source up to today) refuses a response queued
 * while a body is being read: MHD_queue_response answers MHD_NO in every state between the headers and the
 * whole request. So lily writes the response to the socket itself (nothing else is being written then: the
 * connection's own thread runs this, before any answer), ends its side, and returns MHD_NO, which makes
 * microhttpd close the connection (the client, still sending, may see a reset after the answer). */
static enum MHD_Result refuse_unbounded_body(request *r)
{
    char msg[256];
    snprintf(msg, sizeof msg, "Request body exceeds the limit of %zu bytes (--max-body).", r->srv->opts.max_body);
    lily_oai_error e;
    lily_oai_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large", "%s", msg);
    int status;
    char *body = error_body(r, &e, &status);
    char cors[400] = "";
    if (r->allow_origin[0])
        snprintf(cors, sizeof cors, "Access-Control-Allow-Origin: %s\r\n%s", r->allow_origin,
                 strcmp(r->allow_origin, "*") ? "Vary: Origin\r\n" : "");
    char head[640];
    const char *reason = MHD_get_reason_phrase_for((unsigned)status);
    int n = snprintf(head, sizeof head, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n%s\r\n", status, reason ? reason : "", body ? strlen(body) : 0, cors);
    if (r->fd >= 0) {
        if (n > 0 && (size_t)n < sizeof head && write_socket(r->fd, head, (size_t)n) && body)
            write_socket(r->fd, body, strlen(body));
        shutdown(r->fd, SHUT_WR);
    }
    free(body);
    r->status = status;
    r->responded = true;
    body_refused = true;
    return MHD_NO;
}

/* microhttpd's URI log callback: called with the request-target as sent (NULL: none), once the request line is
 * read and before microhttpd parses its query or decodes its path (which cuts it at a %00). Checks the target
 * (target.h) for the access handler, which runs next in this thread; answers one microhttpd cannot parse. */
static void *on_request_target(void *cls, const char *uri, struct MHD_Connection *c)
{
    snprintf(request_target, sizeof request_target, "%s", uri ? uri : "");
    size_t n_args = 0;
    target_verdict = lily_http_check_target(uri, &n_args);
    target_refused = target_verdict == LILY_TARGET_TOO_LONG || target_verdict == LILY_TARGET_TOO_MANY_ARGS;
    if (target_refused)
        answer_at_request_line(cls, c, request_target, n_args);
    return NULL;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    url = request_path(url);
    lily_http_server *srv = cls;
    request *r = *con_cls;
    if (target_refused) /* answered already (answer_at_request_line): close */
        return MHD_NO;
    if (!r) { /* first call: headers only */
        r = calloc(1, sizeof *r);
        if (!r)
            return MHD_NO;
        r->srv = srv;
        r->conn = c;
        r->fd = -1;
        snprintf(r->method, sizeof r->method, "%s", method);
        snprintf(r->path, sizeof r->path, "%s", url);
        clock_gettime(CLOCK_MONOTONIC, &r->t0);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci)
            r->fd = ci->connect_fd;
        *con_cls = r;
        mhd_error_status = 0;
        stream_ended_for_client = false;
        body_refused = false;

        framing_scan framing = {0};
        MHD_get_connection_values(c, MHD_HEADER_KIND, scan_framing, &framing);
        if (request_framing_ambiguous(&framing)) {
            r->close_after = true;
            return send_simple_error(c, r, 400, "invalid_request_error", "ambiguous_framing", NULL,
                                     "Conflicting Content-Length headers, or Content-Length with Transfer-Encoding: "
                                     "the request's body has no single end.");
        }
        const char *coding = unsupported_transfer_coding(&framing);
        if (coding) {
            char coding_text[120], msg[300];
            printable_ascii(coding_text, sizeof coding_text, coding);
            snprintf(msg, sizeof msg, "Unsupported Transfer-Encoding '%s': send the body with Content-Length, or "
                     "with 'Transfer-Encoding: chunked' alone.", coding_text);
            r->close_after = true;
            return send_simple_error(c, r, 400, "invalid_request_error", "unsupported_transfer_encoding", NULL, msg);
        }
        if (target_verdict == LILY_TARGET_CONTROL_CHAR) { /* never routed: the decoded path may be cut there */
            snprintf(r->path, sizeof r->path, "%s", request_target); /* the log line shows it as sent */
            char msg[300], target_text[160];
            printable_ascii(target_text, sizeof target_text, request_target);
            snprintf(msg, sizeof msg, "Invalid request URL '%s': its path holds a control character (%%00-%%1F or "
                     "%%7F).", target_text);
            return send_simple_error(c, r, 400, "invalid_request_error", "invalid_url", NULL, msg);
        }
        const char *allow = NULL;
        route_id id = route_of(url, &allow);
        const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
        if (!origin_allowed(srv, origin, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host"), r->allow_origin,
                            sizeof r->allow_origin)) {
            char origin_text[160], msg[512];
            printable_ascii(origin_text, sizeof origin_text, origin);
            snprintf(msg, sizeof msg, "Cross-origin request from %s refused: only pages on this machine may call "
                     "this server (start it with --cors-origin %s to allow that origin).", origin_text, origin_text);
            return send_simple_error(c, r, 403, "permission_error", "origin_not_allowed", NULL, msg);
        }
        if (!strcmp(method, "OPTIONS")) { /* CORS preflight, for browser chat UIs */
            struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
            if (!resp)
                return MHD_NO;
            char allow_headers[1024];
            preflight_allow_headers(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers"),
                                    allow_headers, sizeof allow_headers);
            add_cors_headers(resp, r);
            MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            MHD_add_response_header(resp, "Access-Control-Allow-Headers", allow_headers);
            MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
            r->status = 204;
            r->responded = true;
            enum MHD_Result ret = MHD_queue_response(c, 204, resp);
            MHD_destroy_response(resp);
            return ret;
        }
        char method_text[40], url_text[160];
        printable_ascii(method_text, sizeof method_text, method);
        printable_ascii(url_text, sizeof url_text, url);
        if (id == R_NONE) {
            const char *hint = unknown_url_hint(url);
            char msg[512];
            snprintf(msg, sizeof msg, "Unknown request URL: %s %s.%s", method_text, url_text, hint ? hint : "");
            return send_simple_error(c, r, 404, "invalid_request_error", "unknown_url", NULL, msg);
        }
        bool head_as_get = !strcmp(method, "HEAD") && !strcmp(allow, "GET");
        if (strcmp(method, allow) && !head_as_get) {
            char msg[256];
            snprintf(msg, sizeof msg, "Method %s is not allowed for %s; use %s.", method_text, url_text, allow);
            return send_simple_error(c, r, 405, "invalid_request_error", "method_not_allowed", allow, msg);
        }
        if (id != R_HEALTH && id != R_WEBUI && !authorized(c, srv->api_key)) /* the page asks for the key */
            return send_simple_error(c, r, 401, "invalid_request_error", "invalid_api_key", NULL,
                                     "Incorrect API key provided. Pass it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'.");
        const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
        if (!strcmp(allow, "POST") && !json_content_type(ct)) {
            char ct_text[120], msg[300];
            printable_ascii(ct_text, sizeof ct_text, ct);
            snprintf(msg, sizeof msg, "Unsupported Content-Type '%s': send the body as JSON with 'Content-Type: "
                     "application/json'.", ct_text);
            return send_simple_error(c, r, 415, "invalid_request_error", "unsupported_media_type", NULL, msg);
        }
        /* A body over the limit: a client waiting for "100 Continue" is told at once (it sends nothing);
         * any other is answered after its body is read and dropped, since most clients read no response
         * before they have sent the whole request, and closing on them loses the 413 (up to 1 GiB of it).
         * A chunked body declares no length: it is answered once it passes the limit (refuse_unbounded_body). */
        r->chunked = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding") != NULL;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        const char *expect = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Expect");
        unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
        if (declared > srv->opts.max_body && !(expect && !strcasecmp(expect, "100-continue")) && declared <= (1ull << 30))
            r->too_large = true;
        else if (declared > srv->opts.max_body) {
            char msg[256];
            snprintf(msg, sizeof msg, "Request body of %s bytes exceeds the limit of %zu bytes (--max-body).", cl,
                     srv->opts.max_body);
            return send_simple_error(c, r, 413, "invalid_request_error", "request_too_large", NULL, msg);
        }
        return MHD_YES;
    }
    if (r->responded) { /* an early error was queued; discard whatever body follows */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size) { /* a piece of the body */
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (r->too_large || r->body_len + n > srv->opts.max_body) {
            if (r->chunked)
                return refuse_unbounded_body(r);
            r->too_large = true;
            return MHD_YES;
        }
        if (r->body_len + n + 1 > r->body_cap) {
            size_t cap = r->body_cap ? r->body_cap : 4096;
            while (cap < r->body_len + n + 1)
                cap *= 2;
            char *p = realloc(r->body, cap);
            if (!p)
                return MHD_NO;
            r->body = p;
            r->body_cap = cap;
        }
        memcpy(r->body + r->body_len, upload_data, n);
        r->body_len += n;
        r->body[r->body_len] = 0;
        return MHD_YES;
    }
    /* the whole request is in */
    if (!r->in_flight) {
        r->in_flight = true;
        atomic_fetch_add(&srv->in_flight, 1);
    }
    if (r->too_large) {
        char msg[256];
        snprintf(msg, sizeof msg, "Request body exceeds the limit of %zu bytes (--max-body).", srv->opts.max_body);
        return send_simple_error(c, r, 413, "invalid_request_error", "request_too_large", NULL, msg);
    }
    const char *allow = NULL;
    route_id id = route_of(url, &allow);
    switch (id) {
    case R_HEALTH: return handle_health(c, r);
    case R_MODELS: return handle_models(c, r);
    case R_MODEL: return handle_model(c, r, url);
    case R_WEBUI: return handle_webui(c, r);
    case R_METRICS: return handle_metrics(c, r);
    case R_NONE: return MHD_NO; /* answered on the first call */
    default: return handle_post(c, r, id);
    }
}

/* The request's log line on stderr: time (UTC), method, path, status, tail (the generation's counts), seconds. */
static void log_request_line(const char *method, const char *path, int status, const char *tail, double secs)
{
    char when[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", gmtime_r(&now, &tm));
    /* the method and URL as the client sent them (URL unescaped) may hold any byte: a newline would forge a
     * log line, an escape sequence would drive the terminal */
    char method_text[40], path_text[400];
    printable_ascii(method_text, sizeof method_text, method);
    printable_ascii(path_text, sizeof path_text, path);
    fprintf(stderr, "%s %s %s %d%s %.3f s\n", when, method_text, path_text, status, tail, secs);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    lily_http_server *srv = cls;
    request *r = *con_cls;
    if (!r)
        return;
    *con_cls = NULL;
    set_busy(srv, c, false);
    if (r->job && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
        lily_job_cancel(r->job); /* the stream's write failed or the client left */
    if (r->job) { /* the worker notices a cancel within one decode step; log its final counts */
        pthread_mutex_lock(&r->job->mu);
        while (!r->job->finished)
            pthread_cond_wait(&r->job->cv, &r->job->mu);
        pthread_mutex_unlock(&r->job->mu);
    }
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - r->t0.tv_sec) + (double)(t1.tv_nsec - r->t0.tv_nsec) * 1e-9;
    char tail[768] = "";
    if (r->job && (r->job->route == LILY_ROUTE_CHAT || r->job->route == LILY_ROUTE_COMPLETIONS)) {
        const lily_job_stats *s = &r->job->stats;
        /* the time to the first token from the request's arrival: its wait in the queue, then the worker's */
        const double t_arrival = (double)r->t0.tv_sec + (double)r->t0.tv_nsec * 1e-9; /* CLOCK_MONOTONIC too */
        const double queued_ms = s->worker_start_s > t_arrival ? 1e3 * (s->worker_start_s - t_arrival) : 0.0;
        /* a stream's time to its first byte of generated output, as it goes to the socket: what the client
         * can see of the first token. held: the token's text waited for later tokens (incomplete UTF-8, a
         * possible tag or stop string); handoff: from the worker's write to this connection's thread */
        char first_byte[128] = "";
        double output_s = 0;
        lily_job_first_output(r->job, &output_s);
        if (r->first_handed_s > 0 && s->ttft_ms > 0)
            snprintf(first_byte, sizeof first_byte, " first_byte=%.1f ms (held %.1f, handoff %.1f)",
                     1e3 * (r->first_handed_s - t_arrival),
                     LILY_MAX(0.0, 1e3 * (output_s - s->worker_start_s) - s->ttft_ms), /* forced text: before */
                     1e3 * (r->first_handed_s - output_s));
        /* the seed, so a reply sampled with a random one (no seed, or -1) can be drawn again */
        char seed[40] = "";
        if (s->has_seed)
            snprintf(seed, sizeof seed, " seed=%llu", (unsigned long long)s->seed);
        snprintf(tail, sizeof tail,
                 " prompt=%d completion=%d cached=%d prefill=%.1f tok/s decode=%.1f tok/s ttft=%.1f ms"
                 " (queued %.1f, prompt %.1f, restore %.1f, forward %.1f in %d passes, checkpoints %.1f"
                 " + %.1f after the first token)%s"
                 " decode_path=\"%s\"%s%s",
                 s->prompt_tokens, s->completion_tokens, s->cached_tokens, s->prefill_tok_s, s->decode_tok_s,
                 s->ttft_ms > 0 ? queued_ms + s->ttft_ms : 0.0, queued_ms, s->prompt_ms, s->restore_ms,
                 s->forward_ms, s->pieces, s->checkpoint_ms, s->flush_ms, first_byte,
                 s->decode_path ? s->decode_path : "none", seed,
                 lily_job_cancelled(r->job) ? " cancelled" : "");
    }
    /* microhttpd answered a malformed request itself (a bad chunk): on_mhd_log counted it */
    bool mhd_answered = !r->responded && mhd_error_status;
    /* a client that left before its answer's end (closed its stream, or the socket a body was written to) is
     * 499, nginx's "client closed request", as one that left before the answer began: a cancelled stream
     * logged as 200 read as a success. The server's own ends (shutdown, the idle timeout, a reader too far
     * behind) keep the status sent. */
    const bool server_ended = toe == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN ||
                              toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED ||
                              (r->job && (lily_job_overflowed(r->job) || lily_job_aborted(r->job)));
    const bool client_left = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !server_ended;
    int status = r->status ? (r->status < 300 && client_left ? 499 : r->status)
               : mhd_answered ? mhd_error_status
               : (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? 200 : 499);
    if (!mhd_answered)
        atomic_fetch_add(&srv->n_by_status[status_class(status)], 1);
    if (r->job && !(status >= 400 && status < 499)) { /* a rejected request (400) processed no tokens */
        atomic_fetch_add(&srv->prompt_tokens, (unsigned long long)r->job->stats.prompt_tokens);
        atomic_fetch_add(&srv->completion_tokens, (unsigned long long)r->job->stats.completion_tokens);
        atomic_fetch_add(&srv->cached_tokens, (unsigned long long)r->job->stats.cached_tokens);
        if (lily_job_cancelled(r->job))
            atomic_fetch_add(&srv->n_cancelled, 1);
    }
    if (r->job && lily_job_overflowed(r->job))
        snprintf(tail + strlen(tail), sizeof tail - strlen(tail), " (the client fell too far behind reading the stream)");
    log_request_line(r->method, r->path, status, tail, secs);
    lily_job_unref(r->job);
    if (r->in_flight)
        atomic_fetch_sub(&srv->in_flight, 1);
    free(r->body);
    free(r);
}

/* microhttpd answers malformed HTTP itself (a bad request line or chunk, an impossible Content-Length) and
 * says so only in its log: count those answers by status. Each connection has its own thread, so the
 * thread-local status also tells on_completed that the request it ends was answered this way. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    lily_http_server *srv = cls;
    if (target_refused)
        return;
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    unsigned status;
    if (sscanf(msg, "Error processing request (HTTP response code is %u", &status) == 1 && status >= 400 &&
        status < 600) {
        mhd_error_status = (int)status;
        atomic_fetch_add(&srv->n_by_status[status_class((int)status)], 1);
    }
    if (strstr(msg, "closed by remote side") || strstr(msg, "forcibly closed by remote peer") || /* FIN, RST */
        strstr(msg, "detected connection closure") ||
        (stream_ended_for_client && strstr(msg, "application error generating response")) ||
        (body_refused && strstr(msg, "Application reported internal error")))
        return; /* a client that left (or a connection closed to keep a slot free): not news */
    fprintf(stderr, "lily serve: microhttpd: %s", msg);
}

/* A daemon listening on addr (AF_INET or AF_INET6; its port: 0 = any free one), serving srv; NULL with errno
 * set when it cannot. */
static struct MHD_Daemon *start_daemon(lily_http_server *srv, const struct sockaddr *addr, bool ipv6)
{
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | MHD_USE_POLL;
    if (ipv6)
        flags |= MHD_USE_IPv6;
    /* the address holds the port; microhttpd's bind error names this one */
    const uint16_t port = ntohs(ipv6 ? ((const struct sockaddr_in6 *)addr)->sin6_port
                                     : ((const struct sockaddr_in *)addr)->sin_port);
    return MHD_start_daemon(flags, port, on_accept, srv, on_request, srv,
                            MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, srv,
                            MHD_OPTION_SOCK_ADDR, addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                            MHD_OPTION_URI_LOG_CALLBACK, on_request_target, srv,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)srv->opts.max_connections,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv,
                            /* an idle connection, or one that sends its headers or body or reads its
                             * answer no faster than this, is closed */
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)srv->opts.idle_timeout_s,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(256 * 1024),
                            MHD_OPTION_END);
}

/* Whether this machine has an IPv6 loopback to listen on: a socket binds [::1]:0 (not where IPv6 is off, or
 * the kernel or a sandbox has no ::1). */
static bool ipv6_loopback_usable(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd < 0)
        return false;
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_addr = in6addr_loopback};
    const bool ok = bind(fd, (const struct sockaddr *)&a6, sizeof a6) == 0;
    close(fd);
    return ok;
}

lily_status lily_http_start(const lily_http_options *opts, lily_scheduler *sched, lily_http_server **out,
                            lily_error *err)
{
    *out = NULL;
    lily_http_server *srv = calloc(1, sizeof *srv);
    if (!srv)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
    srv->sched = sched;
    srv->opts = *opts;
    srv->host = strdup(opts->host ? opts->host : "127.0.0.1");
    srv->api_key = opts->api_key ? strdup(opts->api_key) : NULL;
    srv->model_name = strdup(opts->model_name ? opts->model_name : "lily");
    srv->started = (long long)time(NULL);
    atomic_init(&srv->in_flight, 0);
    pthread_mutex_init(&srv->conn_mu, NULL);
    if (!srv->opts.idle_timeout_s)
        srv->opts.idle_timeout_s = 10;
    for (const char *p = opts->cors_origins; p && *p;) { /* "A,B,C" or "*" */
        p += strspn(p, " ,");
        size_t n = strcspn(p, ",");
        size_t k = n;
        while (k > 0 && p[k - 1] == ' ')
            k--;
        while (k > 0 && p[k - 1] == '/') /* "http://host:1234/" as browsers never send it */
            k--;
        if (k == 1 && *p == '*') {
            srv->cors_any = true;
        } else if (k) {
            char **c = realloc(srv->cors, (size_t)(srv->n_cors + 1) * sizeof *c);
            if (!c || !(c[srv->n_cors] = strndup(p, k))) {
                if (c)
                    srv->cors = c;
                lily_http_stop(srv);
                return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
            }
            srv->cors = c;
            srv->n_cors++;
        }
        p += n;
    }
    if (!srv->opts.max_body)
        srv->opts.max_body = 16u << 20;
    if (!srv->opts.max_connections)
        srv->opts.max_connections = 256;
    if (!srv->host || !srv->model_name || (opts->api_key && !srv->api_key)) {
        lily_http_stop(srv);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
    }

    const bool localhost = !strcasecmp(srv->host, "localhost");
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV | AI_PASSIVE};
    struct addrinfo *ai = NULL;
    char port_text[16];
    snprintf(port_text, sizeof port_text, "%d", opts->port);
    /* localhost is both loopbacks, whatever the resolver lists first (or only): a client that resolves it to
     * ::1 (curl, Node's fetch) finds the server as one that takes 127.0.0.1 does */
    int gai = getaddrinfo(localhost ? "127.0.0.1" : srv->host, port_text, &hints, &ai);
    if (gai || !ai) {
        lily_http_stop(srv);
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "cannot resolve host '%s': %s", opts->host,
                              gai_strerror(gai));
    }
    srv->daemon = start_daemon(srv, ai->ai_addr, ai->ai_family == AF_INET6);
    freeaddrinfo(ai);
    if (!srv->daemon) {
        int e = errno;
        lily_http_stop(srv);
        return lily_error_set(err, LILY_ERR_IO, "cannot listen on %s:%d: %s", opts->host ? opts->host : "127.0.0.1",
                              opts->port, e ? strerror(e) : "microhttpd failed to start");
    }
    /* ::1 on the same port; where the machine has no IPv6 loopback, 127.0.0.1 alone (lily_http_dual_loopback
     * says so). Port 0: a port ::1 has taken already is given up for another free one. */
    for (int attempt = 0; localhost && ipv6_loopback_usable() && attempt < 16; attempt++) {
        const union MHD_DaemonInfo *bi = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
        const int port4 = bi ? bi->port : opts->port;
        struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port4),
                                  .sin6_addr = in6addr_loopback};
        if ((srv->daemon6 = start_daemon(srv, (const struct sockaddr *)&a6, true)))
            break;
        int e = errno;
        if (opts->port == 0 && attempt + 1 < 16) {
            struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
            MHD_stop_daemon(srv->daemon);
            if ((srv->daemon = start_daemon(srv, (const struct sockaddr *)&a4, false)))
                continue;
            e = errno;
        }
        lily_http_stop(srv);
        return lily_error_set(err, LILY_ERR_IO, "cannot listen on [::1]:%d (localhost's IPv6 loopback): %s", port4,
                              e ? strerror(e) : "microhttpd failed to start");
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di ? di->port : opts->port;
    *out = srv;
    return LILY_OK;
}

int lily_http_port(const lily_http_server *srv)
{
    return srv->port;
}

bool lily_http_dual_loopback(const lily_http_server *srv)
{
    return srv->daemon6 != NULL;
}

void lily_http_quiesce(lily_http_server *srv)
{
    if (!srv || !srv->daemon)
        return;
    MHD_socket fd = MHD_quiesce_daemon(srv->daemon);
    if (fd != MHD_INVALID_SOCKET)
        close(fd);
    if (srv->daemon6 && (fd = MHD_quiesce_daemon(srv->daemon6)) != MHD_INVALID_SOCKET)
        close(fd);
}

void lily_http_stop(lily_http_server *srv)
{
    if (!srv)
        return;
    if (srv->daemon) {
        /* let responses still being written (the last tokens of a stream) drain for up to 10 s */
        for (int i = 0; i < 1000 && atomic_load(&srv->in_flight) > 0; i++) {
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
        }
        MHD_stop_daemon(srv->daemon);
    }
    if (srv->daemon6)
        MHD_stop_daemon(srv->daemon6);
    for (int i = 0; i < srv->n_cors; i++)
        free(srv->cors[i]);
    free(srv->cors);
    pthread_mutex_destroy(&srv->conn_mu);
    free(srv->host);
    free(srv->api_key);
    free(srv->model_name);
    free(srv);
}
