/* test_server_http.c — the HTTP front, the scheduler and the OpenAI wire format, with a fake model.
 *
 * A fake runner stands in for the engine (it writes fixed chunks, or waits to be released or cancelled), so
 * these tests check routing, status codes, auth, body limits, SSE framing, queueing and cancellation on a
 * real loopback socket without weights. The model path is covered by tests/test_server.sh.
 */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <errno.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "server/http.h"
#include "server/openai.h"
#include "server/scheduler.h"
#include "server/target.h"
#include "test_support.h"

/* ---- the fake model ---- */

static atomic_int release_blocked; /* a "block" job waits for this */
static atomic_int cancelled_jobs;  /* jobs that saw their cancel flag */
static atomic_int running_block;   /* a "block" job is running */
static atomic_int first_read;      /* the client of a "first" job has read its first token's event */
static atomic_int second_waited;   /* a "first" job wrote its second token only after that */

static void emit(lily_job *job, json_t *chunk)
{
    size_t len;
    char *s = lily_oai_sse(chunk, &len);
    json_decref(chunk);
    lily_job_write(job, s, len);
    free(s);
}

static void fake_run(void *user, lily_job *job)
{
    (void)user;
    if (job->route == LILY_ROUTE_TOKENIZE || job->route == LILY_ROUTE_DETOKENIZE) {
        lily_job_begin(job, 200, false);
        const char *body = job->route == LILY_ROUTE_TOKENIZE ? "{\"tokens\":[1,2,3]}" : "{\"content\":\"abc\"}";
        lily_job_write(job, body, strlen(body));
        lily_job_finish(job);
        return;
    }
    lily_oai_request *req = &job->req;
    const char *mode = req->is_chat ? json_string_value(json_object_get(json_array_get(req->messages, 0), "content"))
                                    : req->prompt_text;
    if (mode && !strcmp(mode, "too long")) {
        lily_oai_error e;
        lily_oai_error_set(&e, 400, "invalid_request_error", "messages", "context_length_exceeded",
                           "This model's maximum context length is 16 tokens.");
        lily_job_fail(job, &e);
        return;
    }
    lily_oai_ident id;
    lily_oai_ident_init(&id, req->is_chat, "fake");
    lily_oai_usage usage = {.prompt_tokens = 5, .completion_tokens = 2};
    if (mode && !strcmp(mode, "block")) { /* stream until released or cancelled */
        lily_job_begin(job, 200, true);
        atomic_store(&running_block, 1);
        emit(job, lily_oai_chat_chunk(&id, lily_oai_delta_role(), NULL, NULL, false));
        while (!atomic_load(&release_blocked) && !lily_job_cancelled(job)) {
            emit(job, lily_oai_chat_chunk(&id, lily_oai_delta_text("content", "x", 1), NULL, NULL, false));
            usleep(2000);
        }
        if (lily_job_cancelled(job))
            atomic_fetch_add(&cancelled_jobs, 1);
        atomic_store(&running_block, 0);
        lily_job_write(job, "data: [DONE]\n\n", 14);
        lily_job_finish(job);
        return;
    }
    if (mode && !strcmp(mode, "first")) { /* token 1, then token 2 only once the client has read token 1 */
        lily_job_begin(job, 200, true);
        job->stats.worker_start_s = lily_wall_seconds();
        emit(job, lily_oai_chat_chunk(&id, lily_oai_delta_role(), NULL, NULL, false));
        job->stats.ttft_ms = 1e3 * (lily_wall_seconds() - job->stats.worker_start_s);
        json_t *one = lily_oai_chat_chunk(&id, lily_oai_delta_text("content", "one", 3), NULL, NULL, false);
        size_t len;
        char *sse = lily_oai_sse(one, &len);
        json_decref(one);
        lily_job_write_output(job, sse, len);
        free(sse);
        for (int i = 0; i < 500 && !atomic_load(&first_read) && !lily_job_cancelled(job); i++)
            usleep(10000);
        atomic_store(&second_waited, atomic_load(&first_read));
        emit(job, lily_oai_chat_chunk(&id, lily_oai_delta_text("content", "two", 3), "stop", NULL, false));
        lily_job_write(job, "data: [DONE]\n\n", 14);
        lily_job_finish(job);
        return;
    }
    if (mode && !strcmp(mode, "pause")) { /* a stream whose next token takes 3 s (longer than the idle timeout) */
        lily_job_begin(job, 200, true);
        emit(job, lily_oai_chat_chunk(&id, lily_oai_delta_role(), NULL, NULL, false));
        for (int i = 0; i < 300 && !lily_job_cancelled(job); i++)
            usleep(10000);
        emit(job, lily_oai_chat_chunk(&id, lily_oai_delta_text("content", "late", 4), "stop", NULL, false));
        lily_job_write(job, "data: [DONE]\n\n", 14);
        lily_job_finish(job);
        return;
    }
    if (mode && !strcmp(mode, "flood")) { /* stream 64 KiB chunks until the job is cancelled */
        lily_job_begin(job, 200, true);
        atomic_store(&running_block, 1);
        static char piece[65536];
        memset(piece, 'x', sizeof piece);
        while (lily_job_write(job, piece, sizeof piece) == LILY_OK)
            ;
        if (lily_job_cancelled(job))
            atomic_fetch_add(&cancelled_jobs, 1);
        atomic_store(&running_block, 0);
        lily_job_finish(job);
        return;
    }
    if (mode && !strcmp(mode, "drip")) { /* a 4 KiB chunk every 10 ms until cancelled (a client keeps up) */
        lily_job_begin(job, 200, true);
        static char piece[4096];
        memset(piece, 'x', sizeof piece);
        while (!lily_job_cancelled(job) && lily_job_write(job, piece, sizeof piece) == LILY_OK)
            usleep(10000);
        if (lily_job_cancelled(job))
            atomic_fetch_add(&cancelled_jobs, 1);
        lily_job_finish(job);
        return;
    }
    if (mode && !strcmp(mode, "quiet")) { /* a stream that starts, then writes nothing until cancelled */
        lily_job_begin(job, 200, true);
        emit(job, lily_oai_chat_chunk(&id, lily_oai_delta_role(), NULL, NULL, false));
        atomic_store(&running_block, 1);
        while (!lily_job_cancelled(job))
            usleep(2000);
        atomic_fetch_add(&cancelled_jobs, 1);
        atomic_store(&running_block, 0);
        lily_job_finish(job);
        return;
    }
    if (mode && !strcmp(mode, "hold")) { /* a whole-body answer that waits until released or cancelled */
        lily_job_begin(job, 200, false);
        atomic_store(&running_block, 1);
        while (!atomic_load(&release_blocked) && !lily_job_cancelled(job))
            usleep(2000);
        if (lily_job_cancelled(job))
            atomic_fetch_add(&cancelled_jobs, 1);
        atomic_store(&running_block, 0);
        lily_job_write(job, "{}", 2);
        lily_job_finish(job);
        return;
    }
    if (mode && !strcmp(mode, "big")) { /* a whole-body answer of 6 MiB (more than the socket buffers), at once */
        lily_job_begin(job, 200, false);
        static char piece[65536];
        memset(piece, 'x', sizeof piece);
        for (int i = 0; i < 96; i++)
            lily_job_write(job, piece, sizeof piece);
        lily_job_finish(job);
        return;
    }
    if (!req->stream) {
        json_t *r = req->is_chat ? lily_oai_chat_response(&id, "Hello world", 11, NULL, 0, NULL, 0, "stop", NULL,
                                                          &usage)
                                 : lily_oai_completion_response(&id, "Hello world", 11, "length", NULL, &usage);
        char *s = lily_oai_dump(r);
        json_decref(r);
        lily_job_begin(job, 200, false);
        lily_job_write(job, s, strlen(s));
        free(s);
        lily_job_finish(job);
        return;
    }
    lily_job_begin(job, 200, true);
    emit(job, lily_oai_chat_chunk(&id, lily_oai_delta_role(), NULL, NULL, req->include_usage));
    emit(job, lily_oai_chat_chunk(&id, lily_oai_delta_text("content", "Hello", 5), NULL, NULL, req->include_usage));
    emit(job, lily_oai_chat_chunk(&id, json_object(), "stop", NULL, req->include_usage));
    if (req->include_usage)
        emit(job, lily_oai_usage_chunk(&id, true, &usage));
    lily_job_write(job, "data: [DONE]\n\n", 14);
    lily_job_finish(job);
}

/* ---- a minimal HTTP client ---- */

static int port;

static int connect_server(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* Everything the server sends on fd until it closes the connection, into buf (cap bytes, NUL-terminated);
 * closes fd. */
static void read_to_close(int fd, char *buf, size_t cap)
{
    size_t len = 0;
    ssize_t n;
    while ((n = read(fd, buf + len, cap - 1 - len)) > 0)
        len += (size_t)n;
    buf[len] = 0;
    close(fd);
}

/* The raw bytes req sent on a new connection, and the answer until the server closes it (read_to_close). */
static void raw_exchange(const char *req, char *buf, size_t cap)
{
    int fd = connect_server();
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    read_to_close(fd, buf, cap);
}

static void send_request(int fd, const char *method, const char *path, const char *headers, const char *body)
{
    char head[1024];
    int n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%sContent-Length: %zu\r\n\r\n",
                     method, path, headers ? headers : "", body ? strlen(body) : 0);
    assert_int_equal(write(fd, head, (size_t)n), n);
    if (body && *body)
        assert_int_equal(write(fd, body, strlen(body)), (ssize_t)strlen(body));
}

/* The whole response (status line, headers, body) as a malloc'd string; *status the HTTP status. */
static char *http(const char *method, const char *path, const char *headers, const char *body, int *status)
{
    int fd = connect_server();
    send_request(fd, method, path, headers, body);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 4096 > cap)
            buf = realloc(buf, cap *= 2);
        ssize_t n = read(fd, buf + len, cap - len - 1);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    buf[len] = 0;
    close(fd);
    *status = 0;
    sscanf(buf, "HTTP/1.%*d %d", status);
    return buf;
}

static int status_of(const char *method, const char *path, const char *headers, const char *body, const char *expect)
{
    int status;
    char *r = http(method, path, headers, body, &status);
    if (expect && !strstr(r, expect)) {
        print_error("response lacks '%s':\n%s\n", expect, r);
        fail();
    }
    free(r);
    return status;
}

static lily_scheduler sched;
static lily_http_server *srv;

static int setup(void **state)
{
    (void)state;
    lily_error err;
    if (lily_scheduler_init(&sched, 1, NULL, fake_run, NULL, &err) != LILY_OK)
        return -1;
    if (lily_scheduler_launch(&sched, &err) != LILY_OK) {
        lily_scheduler_stop(&sched);
        return -1;
    }
    lily_scheduler_wait_loaded(&sched);
    lily_http_options o = {.host = "127.0.0.1", .port = 0, .api_key = NULL, .max_body = 1024, .model_name = "fake",
                           .max_connections = 16, .idle_timeout_s = 2};
    if (lily_http_start(&o, &sched, &srv, &err) != LILY_OK)
        return -1;
    port = lily_http_port(srv);
    return port > 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    lily_http_quiesce(srv);
    lily_scheduler_stop(&sched);
    lily_http_stop(srv);
    return 0;
}

static void test_http_routes_and_methods(void **state)
{
    (void)state;
    assert_int_equal(status_of("GET", "/health", NULL, NULL, "\"status\":\"ok\""), 200);
    assert_int_equal(status_of("GET", "/v1/models", NULL, NULL, "\"id\":\"fake\""), 200);
    assert_int_equal(status_of("GET", "/metrics", NULL, NULL, "lily_requests_total{status=\"2xx\"} 2\n"), 200);
    assert_int_equal(status_of("GET", "/nope", NULL, NULL, "\"error\""), 404);
    assert_int_equal(status_of("GET", "/v1/chat/completions", NULL, NULL, "\"error\""), 405);
    assert_int_equal(status_of("POST", "/v1/models", NULL, "{}", "Allow: GET"), 405);
    assert_int_equal(status_of("POST", "/tokenize", NULL, "{\"content\":\"abc\"}", "{\"tokens\":[1,2,3]}"), 200);
    assert_int_equal(status_of("POST", "/detokenize", NULL, "{\"tokens\":[1,2]}", "{\"content\":\"abc\"}"), 200);
    assert_int_equal(status_of("POST", "/detokenize", NULL, "{\"tokens\":[\"a\"]}", "\"param\":\"tokens\""), 400);
    /* the model as Anthropic's SDKs read it too: type, display_name, created_at; the list's paging fields */
    assert_int_equal(status_of("GET", "/v1/models", NULL, NULL,
                               "\"type\":\"model\",\"display_name\":\"fake\",\"created_at\":\"20"),
                     200);
    assert_int_equal(status_of("GET", "/v1/models", NULL, NULL,
                               "],\"has_more\":false,\"first_id\":\"fake\",\"last_id\":\"fake\"}"),
                     200);
    assert_int_equal(status_of("GET", "/v1/models/fake", NULL, NULL, "\"display_name\":\"fake\""), 200);
    /* absolute-form request-targets (RFC 9112 section 3.2.2), as a client configured with a proxy sends them */
    assert_int_equal(status_of("GET", "http://127.0.0.1/v1/models/fake", NULL, NULL, "\"display_name\":\"fake\""), 200);
    assert_int_equal(status_of("POST", "HTTP://localhost:8080/tokenize", NULL, "{\"content\":\"abc\"}", "[1,2,3]"), 200);
    assert_int_equal(status_of("GET", "http://localhost:8080", NULL, NULL, NULL), 200); /* "/": the web page */
    assert_int_equal(status_of("GET", "http://localhost/nope", NULL, NULL, "\"error\""), 404);
}

static void test_http_bad_requests_are_openai_400s(void **state)
{
    (void)state;
    const char *path = "/v1/chat/completions";
    assert_int_equal(status_of("POST", path, NULL, "{not json", "\"type\":\"invalid_request_error\""), 400);
    assert_int_equal(status_of("POST", path, NULL, "{\"messages\":[]}", "\"param\":\"messages\""), 400);
    assert_int_equal(status_of("POST", path, NULL, "{\"messages\":\"hi\"}", "\"param\":\"messages\""), 400);
    assert_int_equal(status_of("POST", path, NULL,
                               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"n\":2}", "\"param\":\"n\""),
                     400);
    assert_int_equal(status_of("POST", path, NULL,
                               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"temperature\":\"hot\"}",
                               "\"param\":\"temperature\""),
                     400);
    assert_int_equal(status_of("POST", path, NULL,
                               "{\"messages\":[{\"role\":\"user\",\"content\":\"too long\"}]}",
                               "\"code\":\"context_length_exceeded\""),
                     400);
    assert_int_equal(status_of("POST", path, NULL, "[1,2]", "\"error\""), 400);
    assert_int_equal(status_of("POST", path, NULL, "", "\"error\""), 400);
}

static void test_http_body_over_limit_is_413(void **state)
{
    (void)state;
    char body[2048];
    memset(body, ' ', sizeof body - 1);
    body[sizeof body - 1] = 0;
    body[0] = '{';
    body[sizeof body - 2] = '}';
    assert_int_equal(status_of("POST", "/v1/chat/completions", NULL, body, "\"code\":\"request_too_large\""), 413);
    /* the server still works */
    assert_int_equal(status_of("GET", "/health", NULL, NULL, NULL), 200);
}

static void test_http_chat_non_stream_and_stream(void **state)
{
    (void)state;
    const char *path = "/v1/chat/completions";
    int status;
    char *r = http("POST", path, NULL, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &status);
    assert_int_equal(status, 200);
    assert_non_null(strstr(r, "\"object\":\"chat.completion\""));
    assert_non_null(strstr(r, "\"content\":\"Hello world\""));
    free(r);
    r = http("POST", path, NULL, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true}", &status);
    assert_int_equal(status, 200);
    assert_non_null(strstr(r, "Content-Type: text/event-stream"));
    assert_non_null(strstr(r, "data: {\"id\":\"chatcmpl-"));
    assert_non_null(strstr(r, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"}"));
    assert_non_null(strstr(r, "\"finish_reason\":\"stop\""));
    assert_non_null(strstr(r, "data: [DONE]"));
    assert_null(strstr(r, "\"usage\""));
    free(r);
    r = http("POST", path, NULL,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true}}",
             &status);
    assert_non_null(strstr(r, "\"choices\":[],\"usage\":{\"prompt_tokens\":5"));
    free(r);
}

/* The first token's event reaches the client while the engine has not produced the second (nothing holds it
 * back to fill a buffer), and the request's log line says when it went out: first_byte (from the request's
 * arrival) = ttft + held + handoff, each >= 0. */
static void test_http_first_event_is_not_held_for_the_second(void **state)
{
    (void)state;
    char path[] = "/tmp/lily_test_first_byte_XXXXXX";
    int log_fd = mkstemp(path);
    assert_true(log_fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(log_fd, 2); /* the request log line */
    atomic_store(&first_read, 0);
    atomic_store(&second_waited, 0);
    int fd = connect_server();
    send_request(fd, "POST", "/v1/chat/completions", NULL,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"first\"}],\"stream\":true}");
    char buf[8192];
    size_t len = 0;
    while (len < sizeof buf - 1) {
        ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
        buf[len] = 0;
        if (strstr(buf, "\"content\":\"one\"")) {
            atomic_store(&first_read, 1);
            break;
        }
    }
    buf[len] = 0;
    bool saw_one = strstr(buf, "\"content\":\"one\"") != NULL, saw_two = strstr(buf, "\"content\":\"two\"") != NULL;
    while (len < sizeof buf - 1) { /* the rest of the stream */
        ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    buf[len] = 0;
    close(fd);
    char logbuf[4096] = "";
    for (int i = 0; i < 200 && !strstr(logbuf, " s\n"); i++) { /* the line is written as the request completes */
        usleep(10000);
        ssize_t n = pread(log_fd, logbuf, sizeof logbuf - 1, 0);
        logbuf[n > 0 ? n : 0] = 0;
    }
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(log_fd);
    unlink(path);
    assert_true(saw_one);
    assert_false(saw_two);
    assert_true(atomic_load(&second_waited));
    assert_non_null(strstr(buf, "\"content\":\"two\""));
    const char *t = strstr(logbuf, " ttft="), *b = strstr(logbuf, " first_byte=");
    if (!t || !b) {
        print_error("log line without ttft / first_byte: %s\n", logbuf);
        fail();
    }
    double ttft, first, held, handoff;
    assert_int_equal(sscanf(t, " ttft=%lf ms", &ttft), 1);
    if (sscanf(b, " first_byte=%lf ms (held %lf, handoff %lf)", &first, &held, &handoff) != 3) {
        print_error("log line: %s\n", logbuf);
        fail();
    }
    assert_true(held >= 0.0 && handoff >= 0.0);
    assert_true(first >= ttft - 0.15 && fabs(first - (ttft + held + handoff)) <= 0.25);
    assert_true(first < 5000.0); /* not the 5 s the fake waits for a client that never reads */
}

/* A streamed chat request whose first message is `mode` (the fake's behaviour), left once its stream starts. */
static void stream_then_leave(const char *mode)
{
    char body[128];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"stream\":true}", mode);
    int fd = connect_server();
    send_request(fd, "POST", "/v1/chat/completions", NULL, body);
    char buf[512];
    assert_true(read(fd, buf, sizeof buf) > 0); /* the stream started */
    close(fd);
}

static long long metric(const char *series);

/* A stream its client leaves: the job is cancelled, the worker free for the next request, and the request
 * counted as 499 (it was a 200: the stream had begun). */
static void test_http_disconnect_cancels_then_next_request_completes(void **state)
{
    (void)state;
    int before = atomic_load(&cancelled_jobs);
    const long long n_499 = metric("lily_requests_total{status=\"499\"} ");
    atomic_store(&release_blocked, 0);
    stream_then_leave("block");
    /* the job sees its cancel flag; the worker is then free for the next request */
    assert_int_equal(status_of("POST", "/v1/chat/completions", NULL,
                               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "Hello world"),
                     200);
    assert_int_equal(atomic_load(&cancelled_jobs), before + 1);
    /* the cancelled request is counted when microhttpd's thread completes it, which may come after the next
     * request's answer on a loaded machine: wait for it (up to 5 s) */
    char *m = NULL;
    for (int i = 0; i < 250; i++) {
        int st;
        free(m);
        m = http("GET", "/metrics", NULL, NULL, &st);
        if (st == 200 && strstr(m, "lily_requests_cancelled_total 1\n"))
            break;
        usleep(20000);
    }
    if (!strstr(m, "lily_requests_cancelled_total 1\n"))
        fail_msg("/metrics lacks lily_requests_cancelled_total 1:\n%s", m);
    free(m);
    assert_int_equal(metric("lily_requests_total{status=\"499\"} "), n_499 + 1);
}

/* stderr (the server's log) into a temporary file while a test runs; the text it got, then the real stderr. */
typedef struct {
    char path[64];
    int fd, saved;
} log_capture;

static void log_capture_begin(log_capture *c)
{
    snprintf(c->path, sizeof c->path, "/tmp/test_server_http_XXXXXX");
    c->fd = mkstemp(c->path);
    assert_true(c->fd >= 0);
    fflush(stderr);
    c->saved = dup(2);
    dup2(c->fd, 2);
}

static char *log_capture_read(const log_capture *c)
{
    fflush(stderr);
    return test_read_file(c->path, NULL);
}

static char *log_capture_end(log_capture *c)
{
    char *text = log_capture_read(c);
    dup2(c->saved, 2);
    close(c->saved);
    close(c->fd);
    unlink(c->path);
    return text;
}

/* After a client left a stream: wait for its job's cancellation (cancelled_jobs past before) and for the
 * request's log line (" cancelled"; it comes when the connection thread is done), end the capture and return
 * what it caught (malloc'd, non-NULL). */
static char *wait_cancelled_log(log_capture *cap, int before)
{
    for (int i = 0; i < 500 && atomic_load(&cancelled_jobs) == before; i++)
        usleep(10000);
    assert_int_equal(atomic_load(&cancelled_jobs), before + 1);
    char *log = NULL;
    for (int i = 0; i < 500; i++) {
        free(log);
        log = log_capture_read(cap);
        if (log && strstr(log, " cancelled"))
            break;
        usleep(10000);
    }
    free(log);
    log = log_capture_end(cap);
    assert_non_null(log);
    return log;
}

/* A client that leaves a stream while the engine has nothing to send (a long prefill, a slow token): the job is
 * cancelled, and microhttpd's "application error" for the stream lily ended is not logged (the request's own
 * log line says "cancelled"). */
static void test_http_stream_left_while_quiet(void **state)
{
    (void)state;
    int before = atomic_load(&cancelled_jobs);
    log_capture cap;
    log_capture_begin(&cap);
    stream_then_leave("quiet");
    char *log = wait_cancelled_log(&cap, before);
    assert_non_null(strstr(log, " cancelled"));
    if (strstr(log, "application error"))
        fail_msg("microhttpd's error for a stream its client left was logged:\n%s", log);
    free(log);
}

/* A client that resets a stream being written (SO_LINGER 0: RST, not FIN): microhttpd's failed send ("forcibly
 * closed by remote peer") is a client that left, not news: only the request's own line (499 ... cancelled). */
static void test_http_stream_reset_by_client_is_not_logged(void **state)
{
    (void)state;
    int before = atomic_load(&cancelled_jobs);
    log_capture cap;
    log_capture_begin(&cap);
    int fd = connect_server();
    send_request(fd, "POST", "/v1/chat/completions", NULL,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"drip\"}],\"stream\":true}");
    char buf[4096];
    assert_true(read(fd, buf, sizeof buf) > 0); /* the stream started; unread bytes keep coming */
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg), 0);
    close(fd);
    char *log = wait_cancelled_log(&cap, before);
    if (!strstr(log, " 499 "))
        fail_msg("no 499 for a stream its client reset:\n%s", log);
    if (strstr(log, "microhttpd"))
        fail_msg("microhttpd's error for a stream its client reset was logged:\n%s", log);
    free(log);
}

static void *blocked_client(void *arg)
{
    int *status = arg;
    char *r = http("POST", "/v1/chat/completions", NULL,
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"block\"}],\"stream\":true}", status);
    free(r);
    return NULL;
}

static void *queued_client(void *arg)
{
    int *status = arg;
    char *r = http("POST", "/v1/chat/completions", NULL, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                   status);
    free(r);
    return NULL;
}

static long long metric(const char *series);

static void test_http_queue_full_is_503(void **state)
{
    (void)state;
    atomic_store(&release_blocked, 0);
    int s1 = 0, s2 = 0, waiting = 0, running = 0;
    pthread_t t1, t2;
    pthread_create(&t1, NULL, blocked_client, &s1);
    while (!atomic_load(&running_block))
        usleep(1000);
    pthread_create(&t2, NULL, queued_client, &s2);
    do {
        usleep(1000);
        lily_scheduler_state(&sched, &waiting, &running);
    } while (waiting < 1);
    /* one running, one waiting, a queue of 1: the third is turned away, told when to retry */
    long long n_busy = metric("lily_requests_total{status=\"503_529\"} ");
    long long n_5xx = metric("lily_requests_total{status=\"5xx\"} ");
    assert_int_equal(status_of("POST", "/v1/chat/completions", NULL,
                               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "\"code\":\"queue_full\""),
                     503);
    assert_int_equal(status_of("POST", "/v1/chat/completions", NULL,
                               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "\r\nRetry-After: 1\r\n"),
                     503);
    /* the Messages API answers as Anthropic's does when overloaded: 529 overloaded_error (its SDK retries it) */
    const char *msg = "{\"model\":\"fake\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    assert_int_equal(status_of("POST", "/v1/messages", NULL, msg, "\"type\":\"overloaded_error\""), 529);
    assert_int_equal(status_of("POST", "/v1/messages", NULL, msg, "\r\nRetry-After: 1\r\n"), 529);
    assert_int_equal(metric("lily_requests_total{status=\"503_529\"} "), n_busy + 4);
    assert_int_equal(metric("lily_requests_total{status=\"5xx\"} "), n_5xx);
    atomic_store(&release_blocked, 1);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    assert_int_equal(s1, 200);
    assert_int_equal(s2, 200);
}

static void test_http_bearer_auth_is_401(void **state)
{
    (void)state;
    lily_http_options o = {.host = "127.0.0.1", .port = 0, .api_key = "sekret", .max_body = 1024, .model_name = "fake"};
    lily_http_server *authed;
    lily_error err;
    assert_int_equal(lily_http_start(&o, &sched, &authed, &err), LILY_OK);
    int saved = port;
    port = lily_http_port(authed);
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    assert_int_equal(status_of("POST", "/v1/chat/completions", NULL, body, "\"code\":\"invalid_api_key\""), 401);
    assert_int_equal(status_of("POST", "/v1/chat/completions", "Authorization: Bearer sekreT\r\n", body, NULL), 401);
    assert_int_equal(status_of("POST", "/v1/chat/completions", "Authorization: Bearer sekret2\r\n", body, NULL), 401);
    assert_int_equal(status_of("GET", "/v1/models", "Authorization: Basic sekret\r\n", NULL, NULL), 401);
    assert_int_equal(status_of("POST", "/v1/chat/completions", "Authorization: Bearer sekret\r\n", body, "Hello"), 200);
    assert_int_equal(status_of("GET", "/health", NULL, NULL, NULL), 200); /* health needs no key */
    port = saved;
    lily_http_stop(authed);
}

/* The value of one /metrics line that starts with `series` (e.g. "lily_requests_total{status=\"5xx\"}"), or -1. */
static long long metric(const char *series)
{
    int status;
    char *m = http("GET", "/metrics", NULL, NULL, &status);
    const char *at = strstr(m, series);
    long long v = at ? strtoll(at + strlen(series), NULL, 10) : -1;
    free(m);
    return v;
}

/* A client that leaves before its whole-body answer: the job is cancelled, the request counts as 499 (not
 * 5xx) in /metrics, and microhttpd logs no "internal error" for it. */
static void test_http_disconnect_before_body_is_499(void **state)
{
    (void)state;
    int before = atomic_load(&cancelled_jobs);
    long long n_5xx = metric("lily_requests_total{status=\"5xx\"} ");
    const long long n_499_before = metric("lily_requests_total{status=\"499\"} ");
    atomic_store(&release_blocked, 0);
    log_capture cap;
    log_capture_begin(&cap);
    int fd = connect_server();
    send_request(fd, "POST", "/v1/chat/completions", NULL, "{\"messages\":[{\"role\":\"user\",\"content\":\"hold\"}]}");
    while (!atomic_load(&running_block))
        usleep(1000);
    close(fd);
    assert_int_equal(status_of("POST", "/v1/chat/completions", NULL,
                               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "Hello world"),
                     200);
    assert_int_equal(atomic_load(&cancelled_jobs), before + 1);
    long long n_499 = 0;
    for (int i = 0; i < 200 && n_499 != n_499_before + 1; i++) { /* counted once its connection thread is done */
        n_499 = metric("lily_requests_total{status=\"499\"} ");
        usleep(5000);
    }
    char *log = log_capture_end(&cap);
    assert_int_equal(n_499, n_499_before + 1);
    assert_int_equal(metric("lily_requests_total{status=\"5xx\"} "), n_5xx);
    assert_non_null(log);
    assert_non_null(strstr(log, " 499 "));
    assert_null(strstr(log, "internal error"));
    free(log);
}


/* Browser pages: a page on this machine (any port) or none (curl, SDKs) is served with its origin echoed;
 * any other origin gets 403 before anything runs; a preflight allows the headers the OpenAI and Anthropic
 * SDKs send; a POST body that says it is not JSON gets 415. */
static void test_http_cors_and_content_type(void **state)
{
    (void)state;
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    int status;
    char *r = http("GET", "/v1/models", "Origin: http://localhost:5173\r\n", NULL, &status);
    assert_int_equal(status, 200);
    assert_non_null(strstr(r, "Access-Control-Allow-Origin: http://localhost:5173\r\n"));
    assert_non_null(strstr(r, "Vary: Origin\r\n"));
    free(r);
    r = http("GET", "/v1/models", NULL, NULL, &status);
    assert_int_equal(status, 200);
    assert_null(strstr(r, "Access-Control-Allow-Origin")); /* no Origin: not a browser, nothing to allow */
    free(r);
    assert_int_equal(status_of("POST", "/v1/chat/completions", "Origin: http://[::1]:3000\r\n", chat, "Hello"), 200);
    assert_int_equal(status_of("POST", "/v1/chat/completions", "Origin: https://evil.example\r\n", chat,
                               "\"code\":\"origin_not_allowed\""), 403);
    assert_int_equal(status_of("POST", "/v1/chat/completions", "Origin: http://localhost.evil.example\r\n", chat, NULL),
                     403);
    assert_int_equal(status_of("OPTIONS", "/v1/chat/completions", "Origin: null\r\n", NULL, NULL), 403);
    r = http("OPTIONS", "/v1/chat/completions",
             "Origin: http://127.0.0.1:8000\r\nAccess-Control-Request-Method: POST\r\n"
             "Access-Control-Request-Headers: authorization,content-type,x-stainless-os,x-stainless-retry-count,"
             "openai-organization,x-api-key,anthropic-version,anthropic-beta,x-evil\r\n", NULL, &status);
    assert_int_equal(status, 204);
    assert_non_null(strstr(r, "Access-Control-Allow-Origin: http://127.0.0.1:8000\r\n"));
    assert_non_null(strstr(r, "Access-Control-Allow-Headers: Authorization, Content-Type, x-stainless-os, "
                              "x-stainless-retry-count, openai-organization, x-api-key, anthropic-version, "
                              "anthropic-beta\r\n"));
    free(r);
    assert_int_equal(status_of("POST", "/v1/chat/completions", "Content-Type: text/plain\r\n", chat,
                               "\"code\":\"unsupported_media_type\""), 415);
    assert_int_equal(status_of("POST", "/tokenize", "Content-Type: application/x-www-form-urlencoded\r\n",
                               "{\"content\":\"abc\"}", NULL), 415);
    assert_int_equal(status_of("POST", "/v1/chat/completions", "Content-Type: Application/JSON; charset=utf-8\r\n",
                               chat, "Hello"), 200);

    /* --cors-origin: the listed origins too, or any with '*' */
    lily_error err;
    lily_http_server *open_srv = NULL;
    lily_http_options o = {.host = "127.0.0.1", .max_body = 1024, .model_name = "fake",
                           .cors_origins = "https://chat.example.com/, https://b.example"};
    assert_int_equal(lily_http_start(&o, &sched, &open_srv, &err), LILY_OK);
    int saved = port;
    port = lily_http_port(open_srv);
    assert_int_equal(status_of("GET", "/v1/models", "Origin: https://chat.example.com\r\n", NULL,
                               "Access-Control-Allow-Origin: https://chat.example.com\r\n"), 200);
    assert_int_equal(status_of("GET", "/v1/models", "Origin: https://b.example\r\n", NULL, NULL), 200);
    assert_int_equal(status_of("GET", "/v1/models", "Origin: https://c.example\r\n", NULL, NULL), 403);
    lily_http_stop(open_srv);
    o.cors_origins = "*";
    assert_int_equal(lily_http_start(&o, &sched, &open_srv, &err), LILY_OK);
    port = lily_http_port(open_srv);
    assert_int_equal(status_of("GET", "/v1/models", "Origin: https://c.example\r\n", NULL,
                               "Access-Control-Allow-Origin: *\r\n"), 200);
    lily_http_stop(open_srv);
    port = saved;
}

/* Idle connections (never sending a byte) and slow-header clients cannot take every slot: with all 16
 * slots held, /health still answers, and a connection silent for idle_timeout_s (2 s) is closed. */
static void test_http_idle_connections_do_not_lock_out(void **state)
{
    (void)state;
    int idle[24];
    for (int i = 0; i < 24; i++) {
        idle[i] = connect_server();
        if (i % 2) /* half of them send part of a request line, then nothing */
            assert_int_equal(write(idle[i], "GET /hea", 8), 8);
        usleep(2000);
    }
    assert_int_equal(status_of("GET", "/health", NULL, NULL, "\"status\":\"ok\""), 200);
    assert_int_equal(status_of("GET", "/v1/models", NULL, NULL, "\"id\":\"fake\""), 200);
    for (int i = 0; i < 24; i++)
        close(idle[i]);

    int fd = connect_server();
    assert_int_equal(write(fd, "GET /health HTTP/1.1\r\nHo", 24), 24);
    struct timeval tv = {.tv_sec = 8};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const double t0 = lily_wall_seconds();
    char b[512];
    ssize_t n;
    while ((n = read(fd, b, sizeof b)) > 0)
        ;
    const double t1 = lily_wall_seconds();
    close(fd);
    const double secs = t1 - t0;
    assert_true(n == 0 || errno == ECONNRESET); /* closed by the server, not by our 8 s receive timeout */
    assert_true(secs < 6.0);
}

/* Read what has arrived on each slow reader, and send one more body byte on each slow sender. */
static void drip(const int *readers, int n_readers, const int *senders, int n_senders)
{
    char b[4096];
    for (int i = 0; i < n_readers; i++)
        (void)!recv(readers[i], b, sizeof b, MSG_DONTWAIT);
    for (int i = 0; i < n_senders; i++)
        (void)!send(senders[i], " ", 1, MSG_NOSIGNAL);
}

/* /health answers 4 times out of 4, a few tenths of a second apart, while the slow clients keep dripping. */
static int health_among(const int *readers, int n_readers, const int *senders, int n_senders)
{
    int ok = 0;
    for (int k = 0; k < 4; k++) {
        drip(readers, n_readers, senders, n_senders);
        int status;
        free(http("GET", "/health", NULL, NULL, &status));
        ok += status == 200;
        usleep(200000);
    }
    return ok;
}

/* Clients that are never silent but never done cannot take every slot either: with 16 slots, 16 clients
 * sending a request body a byte at a time (slow POST), then 16 reading a whole 6 MiB answer (more than the
 * socket buffers hold) 4 KiB at a time (slow read), each within the 2 s idle timeout, leave /health
 * answering. Only connections whose request the engine holds (queued or running) are never closed for room. */
static void test_http_slow_clients_do_not_lock_out(void **state)
{
    (void)state;
    enum { N = 16 };
    int fds[N];
    static const char head[] = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               "Content-Length: 100000\r\n\r\n{";
    for (int i = 0; i < N; i++) {
        fds[i] = connect_server();
        (void)!send(fds[i], head, strlen(head), MSG_NOSIGNAL);
        usleep(50000); /* its headers are in before the next one connects */
        drip(NULL, 0, fds, i + 1);
    }
    int ok = health_among(NULL, 0, fds, N);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    assert_int_equal(ok, 4);

    for (int i = 0; i < N; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        int small = 4096;
        setsockopt(fds[i], SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
        struct timeval tv = {.tv_sec = 5};
        setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fds[i], (struct sockaddr *)&a, sizeof a) == 0) {
            static const char big[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"big\"}]}";
            char req[256], b[64];
            int n = snprintf(req, sizeof req, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu"
                             "\r\n\r\n%s", strlen(big), big);
            (void)!send(fds[i], req, (size_t)n, MSG_NOSIGNAL);
            (void)!recv(fds[i], b, sizeof b, MSG_WAITALL); /* its answer has started: the job is done */
        }
        usleep(50000);
        drip(fds, i + 1, NULL, 0);
    }
    ok = health_among(fds, N, NULL, 0);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    assert_int_equal(ok, 4);
    assert_int_equal(status_of("GET", "/health", NULL, NULL, "\"status\":\"ok\""), 200);
}

/* A connection to port on 127.0.0.1 (ipv6 false) or ::1. */
static int connect_loopback(bool ipv6, int to_port)
{
    int fd = socket(ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)to_port)};
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)to_port),
                              .sin6_addr = in6addr_loopback};
    a4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(ipv6 ? connect(fd, (struct sockaddr *)&a6, sizeof a6) : connect(fd, (struct sockaddr *)&a4, sizeof a4),
                     0);
    return fd;
}

/* --host localhost listens on 127.0.0.1 and ::1 (two microhttpd daemons, each with its own limit): the
 * connection limit bounds the two together. With 8 slots, 12 clients whose requests the engine holds (so never
 * closed for room), 6 on each loopback: 8 are served (their requests running or queued), 4 are closed at once. */
/* 12 clients whose requests the engine holds, alternating loopbacks: how many were served (their requests running
 * or queued) and how many closed at once; then the jobs are released, the clients closed, and the engine idle. */
static void hold_twelve(lily_http_server *local, lily_scheduler *big, int *served_out, int *refused_out)
{
    int fds[12], served = 0, refused = 0;
    atomic_store(&release_blocked, 0);
    for (int i = 0; i < 12; i++) {
        static const char body[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"block\"}],\"stream\":true}";
        char req[256];
        int n = snprintf(req, sizeof req, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu"
                         "\r\n\r\n%s", strlen(body), body);
        fds[i] = connect_loopback(i % 2, lily_http_port(local));
        (void)!send(fds[i], req, (size_t)n, MSG_NOSIGNAL); /* a refused one may be closed already */
        int waiting = 0, running = 0, counted = served;
        bool closed = false;
        for (int ms = 0; ms < 5000 && counted == served && !closed; ms++) {
            usleep(1000);
            lily_scheduler_state(big, &waiting, &running);
            counted = waiting + running;
            char b;
            ssize_t r = recv(fds[i], &b, 1, MSG_DONTWAIT | MSG_PEEK);
            closed = r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
        }
        if (counted > served) {
            served++;
            usleep(20000); /* the server marks the connection busy just after it queues the job */
        } else {
            refused += closed;
        }
    }
    atomic_store(&release_blocked, 1);
    for (int i = 0; i < 12; i++)
        close(fds[i]);
    int waiting = 1, running = 1;
    for (int ms = 0; ms < 10000 && waiting + running > 0; ms++) {
        usleep(1000);
        lily_scheduler_state(big, &waiting, &running);
    }
    *served_out = served;
    *refused_out = refused;
}

/* --host localhost listens on 127.0.0.1 and ::1 (two microhttpd daemons, each with its own limit): the
 * connection limit bounds the two together. With 8 slots, 12 clients whose requests the engine holds (so never
 * closed for room), 6 on each loopback: 8 are served (their requests running or queued), 4 are closed at once. */
static void test_http_connection_limit_spans_both_loopbacks(void **state)
{
    (void)state;
    lily_error err;
    lily_scheduler big; /* a queue for all 12 */
    assert_int_equal(lily_scheduler_init(&big, 16, NULL, fake_run, NULL, &err), LILY_OK);
    assert_int_equal(lily_scheduler_launch(&big, &err), LILY_OK);
    lily_scheduler_wait_loaded(&big);
    lily_http_server *local;
    lily_http_options o = {.host = "localhost", .port = 0, .max_body = 1024, .model_name = "fake",
                           .max_connections = 8, .idle_timeout_s = 30};
    assert_int_equal(lily_http_start(&o, &big, &local, &err), LILY_OK);
    int served = 0, refused = 0;
    const bool dual = lily_http_dual_loopback(local);
    if (dual)
        hold_twelve(local, &big, &served, &refused);
    lily_http_quiesce(local);
    lily_scheduler_stop(&big);
    lily_http_stop(local);
    if (!dual) {
        print_message("skipped: no IPv6 loopback here, so localhost is 127.0.0.1 alone\n");
        return;
    }
    print_message("served %d, refused %d\n", served, refused);
    assert_int_equal(served, 8);
    assert_int_equal(refused, 4);
}

typedef struct {
    int port, seed;
} storm_arg;

/* One client of the storm: connections on both loopbacks that close at once, reset, send half a request,
 * half-close, ask /health, or say nothing a while. */
static void *storm_client(void *p)
{
    const storm_arg *a = p;
    unsigned seed = (unsigned)a->seed;
    for (int i = 0; i < 40; i++) {
        const bool ipv6 = rand_r(&seed) & 1;
        int fd = socket(ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)a->port)};
        struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)a->port),
                                  .sin6_addr = in6addr_loopback};
        a4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd < 0 || (ipv6 ? connect(fd, (struct sockaddr *)&a6, sizeof a6)
                            : connect(fd, (struct sockaddr *)&a4, sizeof a4))) {
            if (fd >= 0)
                close(fd);
            continue;
        }
        static const char health[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
        char b[256];
        switch (rand_r(&seed) % 6) {
        case 0: /* at once */
            break;
        case 1: { /* a reset */
            struct linger l = {1, 0};
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
            break;
        }
        case 2: /* half a request line */
            (void)!send(fd, "POST /v1/chat/comp", 18, MSG_NOSIGNAL);
            usleep((useconds_t)(rand_r(&seed) % 5000));
            break;
        case 3: /* half-closed, then silent */
            shutdown(fd, SHUT_WR);
            usleep((useconds_t)(rand_r(&seed) % 20000));
            break;
        case 4: /* a request, its answer read or not */
            (void)!send(fd, health, sizeof health - 1, MSG_NOSIGNAL);
            if (rand_r(&seed) & 1)
                (void)!recv(fd, b, sizeof b, 0);
            break;
        default: /* silent a while */
            usleep((useconds_t)(rand_r(&seed) % 30000));
            break;
        }
        close(fd);
    }
    return NULL;
}

/* The shared count (--max-connections over both loopbacks) survives a storm: 16 clients opening and dropping
 * connections every way at once, on 127.0.0.1 and ::1, three times over; after each, the limit is exactly what
 * it was (8 of 12 held clients served, 4 closed at once: no slot leaked, none counted twice) and /health
 * answers. */
static void test_http_connection_count_survives_a_storm(void **state)
{
    (void)state;
    lily_error err;
    lily_scheduler big;
    assert_int_equal(lily_scheduler_init(&big, 16, NULL, fake_run, NULL, &err), LILY_OK);
    assert_int_equal(lily_scheduler_launch(&big, &err), LILY_OK);
    lily_scheduler_wait_loaded(&big);
    lily_http_server *local;
    lily_http_options o = {.host = "localhost", .port = 0, .max_body = 1024, .model_name = "fake",
                           .max_connections = 8, .idle_timeout_s = 2};
    assert_int_equal(lily_http_start(&o, &big, &local, &err), LILY_OK);
    const bool dual = lily_http_dual_loopback(local);
    int served[3] = {0}, refused[3] = {0};
    bool healthy[3] = {false};
    for (int round = 0; round < 3 && dual; round++) {
        pthread_t t[16];
        storm_arg args[16];
        for (int i = 0; i < 16; i++) {
            args[i] = (storm_arg){lily_http_port(local), 1000 * round + i};
            assert_int_equal(pthread_create(&t[i], NULL, storm_client, &args[i]), 0);
        }
        for (int i = 0; i < 16; i++)
            pthread_join(t[i], NULL);
        usleep(300000); /* the server sees the last closes */
        hold_twelve(local, &big, &served[round], &refused[round]);
        usleep(300000);
        int fd = connect_loopback(round & 1, lily_http_port(local));
        static const char health[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        (void)!send(fd, health, sizeof health - 1, MSG_NOSIGNAL);
        char b[512] = {0};
        size_t got = 0;
        for (ssize_t r; got < sizeof b - 1 && (r = recv(fd, b + got, sizeof b - 1 - got, 0)) > 0;)
            got += (size_t)r;
        healthy[round] = strstr(b, "200 OK") != NULL;
        close(fd);
        usleep(300000);
    }
    lily_http_quiesce(local);
    lily_scheduler_stop(&big);
    lily_http_stop(local);
    if (!dual) {
        print_message("skipped: no IPv6 loopback here, so localhost is 127.0.0.1 alone\n");
        return;
    }
    for (int round = 0; round < 3; round++) {
        print_message("round %d: served %d, refused %d, health %d\n", round, served[round], refused[round],
                      healthy[round]);
        assert_int_equal(served[round], 8);
        assert_int_equal(refused[round], 4);
        assert_true(healthy[round]);
    }
}

/* Stopping the server drains answers in progress (up to 10 s), not clients still sending their request: with
 * one connection midway through its body and one midway through its headers, lily_http_stop returns at once. */
static void test_http_stop_does_not_wait_for_unfinished_requests(void **state)
{
    (void)state;
    lily_error err;
    lily_http_server *other;
    lily_http_options o = {.host = "127.0.0.1", .port = 0, .max_body = 1024, .model_name = "fake",
                           .max_connections = 16, .idle_timeout_s = 30};
    assert_int_equal(lily_http_start(&o, &sched, &other, &err), LILY_OK);
    const int saved = port;
    port = lily_http_port(other);
    int body = connect_server(), headers = connect_server();
    static const char head[] = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{";
    assert_int_equal(write(body, head, strlen(head)), (ssize_t)strlen(head));
    assert_int_equal(write(headers, "GET /health HTTP/1.1\r\nHo", 24), 24);
    usleep(200000);
    port = saved;
    const double t0 = lily_wall_seconds();
    lily_http_quiesce(other);
    lily_http_stop(other);
    const double t1 = lily_wall_seconds();
    close(body);
    close(headers);
    const double secs = t1 - t0;
    assert_true(secs < 2.0);
}

/* A request whose body has no single end — Content-Length headers that disagree, or Content-Length beside
 * Transfer-Encoding — is a 400 and its connection is closed: what follows (a request smuggled past a proxy
 * that framed it otherwise) is never answered. The same Content-Length twice is one length. */
static void test_http_ambiguous_framing_is_400_and_closed(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 60\r\n\r\n{}"
        "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
        "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
        "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char buf[8192];
        raw_exchange(bad[i], buf, sizeof buf);
        assert_non_null(strstr(buf, "HTTP/1.1 400"));
        assert_non_null(strstr(buf, "ambiguous_framing"));
        assert_null(strstr(buf, "\"object\":\"list\"")); /* the second request got no answer */
        assert_null(strstr(buf + 12, "HTTP/1.1 "));
    }
    assert_int_equal(status_of("POST", "/tokenize", "Content-Length: 17\r\n", "{\"content\":\"abc\"}",
                               "\"tokens\""), 200);
}

/* A body in a transfer coding microhttpd cannot decode (anything but one "chunked") is a 400 at once, on a
 * closed connection: microhttpd would read such a body to the end of the connection, so the request was
 * never answered, and the client only saw the idle timeout (2 s here) close it. "Chunked" in any case is
 * chunked, also after blanks; microhttpd does not decode "chunked " (a blank after it), so that is a 400 too. */
static void test_http_unsupported_transfer_coding_is_400_at_once(void **state)
{
    (void)state;
    static const char *const codings[] = {"gzip", "gzip, chunked", "chunked, gzip", "identity", "chunked ", "chunked\r\n"
                                          "Transfer-Encoding: chunked"};
    for (size_t i = 0; i < sizeof codings / sizeof codings[0]; i++) {
        char req[512];
        snprintf(req, sizeof req, "POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: %s\r\n\r\n"
                 "11\r\n{\"content\":\"abc\"}\r\n0\r\n\r\n", codings[i]);
        const double t0 = lily_wall_seconds();
        char buf[4096];
        raw_exchange(req, buf, sizeof buf);
        const double t1 = lily_wall_seconds();
        const double secs = t1 - t0;
        if (!strstr(buf, "HTTP/1.1 400") || !strstr(buf, "unsupported_transfer_encoding") || secs > 1.0) {
            print_error("Transfer-Encoding: %s: %.2f s:\n%s\n", codings[i], secs, buf);
            fail();
        }
        assert_null(strstr(buf, "\"tokens\""));
    }
    static const char *const chunked[] = {"chunked", "Chunked", "  chunked"};
    for (size_t i = 0; i < sizeof chunked / sizeof chunked[0]; i++) {
        char req[512];
        snprintf(req, sizeof req, "POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 "Transfer-Encoding: %s\r\n\r\n11\r\n{\"content\":\"abc\"}\r\n0\r\n\r\n", chunked[i]);
        char buf[4096];
        raw_exchange(req, buf, sizeof buf);
        if (!strstr(buf, "HTTP/1.1 200") || !strstr(buf, "\"tokens\"")) {
            print_error("Transfer-Encoding: %s:\n%s\n", chunked[i], buf);
            fail();
        }
    }
}

/* A chunked request on a new connection (headers: more header lines, or NULL): body cut into chunks of `piece`
 * bytes; the answer until the server closes the connection (read_to_close). */
static void chunked_exchange(const char *path, const char *headers, const char *body, size_t piece, char *buf,
                             size_t cap)
{
    size_t len = strlen(body), cap_req = 512 + len + (len / piece + 1) * 16;
    char *req = malloc(cap_req);
    assert_non_null(req);
    int at = snprintf(req, cap_req, "POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
                      "application/json\r\n%sTransfer-Encoding: chunked\r\n\r\n", path, headers ? headers : "");
    for (size_t i = 0; i < len; i += piece) {
        size_t n = piece < len - i ? piece : len - i;
        at += snprintf(req + at, cap_req - (size_t)at, "%zx\r\n%.*s\r\n", n, (int)n, body + i);
    }
    at += snprintf(req + at, cap_req - (size_t)at, "0\r\n\r\n");
    raw_exchange(req, buf, cap);
    free(req);
}

/* A client sending a chunked body that never ends: 64-byte chunks, one every 0.2 ms, until a write fails (the
 * server closed the connection) or 5 s pass. */
typedef struct {
    int fd;
    int write_errno; /* the failed write's errno; 0: it ran out its 5 s */
    double ended;    /* lily_wall_seconds() when it stopped */
    long long sent;  /* body bytes sent */
} chunk_flood;

static void *flood_chunks(void *p)
{
    chunk_flood *f = p;
    char chunk[80];
    const int n = snprintf(chunk, sizeof chunk, "40\r\n%064d\r\n", 0);
    const double end = lily_wall_seconds() + 5.0;
    while (lily_wall_seconds() < end) {
        if (send(f->fd, chunk, (size_t)n, MSG_NOSIGNAL) != n) {
            f->write_errno = errno;
            break;
        }
        f->sent += 64;
        usleep(200);
    }
    f->ended = lily_wall_seconds();
    return NULL;
}

/* What the server sends on fd until it closes the connection (its end, or a reset after its answer) or `secs`
 * pass, into buf (NUL-terminated); *closed: it closed. */
static void read_until_closed(int fd, char *buf, size_t cap, double secs, bool *closed)
{
    struct timeval tv = {.tv_sec = 0, .tv_usec = 100000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t len = 0;
    *closed = false;
    const double end = lily_wall_seconds() + secs;
    while (lily_wall_seconds() < end && len < cap - 1) {
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n > 0) {
            len += (size_t)n;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            *closed = true;
            break;
        }
    }
    buf[len] = 0;
}

static const char chunked_chat_head[] = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                        "application/json\r\nTransfer-Encoding: chunked\r\n\r\n";

/* A chunked body is answered 413 as soon as it passes --max-body (1024 bytes here), with the JSON error a body
 * of a declared Content-Length over the limit gets, and its connection is closed unread: a client that keeps
 * sending chunks neither holds the connection (and its thread) nor waits for the idle timeout. The server
 * answers others meanwhile; a chunked body of exactly the limit, in many chunks, is still read whole. */
static void test_http_chunked_body_over_limit_is_413_at_once(void **state)
{
    (void)state;
    char buf[8192];
    /* exactly the limit in 16-byte chunks: read whole; one byte more: 413 */
    char body[1026];
    memset(body, 'x', sizeof body);
    memcpy(body, "{\"content\":\"", 12);
    memcpy(body + 1022, "\"}", 3); /* 1024 bytes */
    chunked_exchange("/tokenize", NULL, body, 16, buf, sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 200 "));
    assert_non_null(strstr(buf, "{\"tokens\":[1,2,3]}"));
    memcpy(body + 1022, "x\"}", 4); /* 1025 bytes */
    chunked_exchange("/tokenize", NULL, body, 16, buf, sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 413 "));
    assert_non_null(strstr(buf, "\"code\":\"request_too_large\""));
    /* on Anthropic's route in its shape, with the CORS headers of an allowed page's request */
    chunked_exchange("/v1/messages", "Origin: http://localhost:3000\r\n", body, 16, buf, sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 413 "));
    assert_non_null(strstr(buf, "\r\nAccess-Control-Allow-Origin: http://localhost:3000\r\nVary: Origin\r\n"));
    assert_non_null(strstr(buf, "\r\n\r\n{\"type\":\"error\",\"error\":{\"type\":\"request_too_large\","));

    /* the answer to a declared Content-Length over the limit, read and dropped: the chunked one must match */
    char big[2048];
    memset(big, ' ', sizeof big - 1);
    big[sizeof big - 1] = 0;
    int status;
    char *declared = http("POST", "/v1/chat/completions", NULL, big, &status);
    assert_int_equal(status, 413);
    const char *declared_json = strstr(declared, "\r\n\r\n");
    assert_non_null(declared_json);

    const long long n_413 = metric("lily_requests_total{status=\"413\"} ");
    int fd = connect_server();
    assert_int_equal(write(fd, chunked_chat_head, strlen(chunked_chat_head)), (ssize_t)strlen(chunked_chat_head));
    static const char part[] = "100\r\n{\"messages\":[%0243d\r\n"; /* 256 bytes of body, under the limit */
    char first[300];
    const int n_first = snprintf(first, sizeof first, part, 0);
    assert_int_equal(write(fd, first, (size_t)n_first), n_first);
    usleep(50000);
    assert_int_equal(status_of("GET", "/health", NULL, NULL, "\"status\":\"ok\""), 200); /* meanwhile */
    const double t0 = lily_wall_seconds();
    chunk_flood f = {.fd = fd};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, flood_chunks, &f), 0);
    bool closed;
    read_until_closed(fd, buf, sizeof buf, 4.0, &closed);
    const double t1 = lily_wall_seconds();
    pthread_join(th, NULL);
    close(fd);
    print_message("the answer ended after %.3f s; the client's write failed after %.3f s (errno %d), %lld bytes sent\n",
                  t1 - t0, f.ended - t0, f.write_errno, f.sent);
    assert_true(closed);
    assert_true(t1 - t0 < 2.0);
    assert_memory_equal(buf, "HTTP/1.1 413 ", 13);
    assert_non_null(strstr(buf, "\r\nContent-Type: application/json\r\n"));
    assert_non_null(strstr(buf, "\r\nConnection: close\r\n"));
    const char *json = strstr(buf, "\r\n\r\n");
    assert_non_null(json);
    assert_string_equal(json, declared_json);
    assert_non_null(strstr(json, "\"message\":\"Request body exceeds the limit of 1024 bytes (--max-body).\""));
    free(declared);
    /* the client's sending ends on the closed connection, not on its own 5 s */
    assert_true(f.write_errno == ECONNRESET || f.write_errno == EPIPE);
    assert_true(f.ended - t0 < 2.5);
    /* counted once as a 413 (when its connection's thread ends it) */
    long long got = 0;
    for (int i = 0; i < 200 && got != n_413 + 1; i++) {
        got = metric("lily_requests_total{status=\"413\"} ");
        usleep(5000);
    }
    assert_int_equal(got, n_413 + 1);
    assert_int_equal(status_of("GET", "/health", NULL, NULL, "\"status\":\"ok\""), 200); /* afterwards */
}

/* The connection of a chunked body over the limit is closed, so its slot is free again: with one slot, held by
 * a chunked upload, a new client is refused; once the upload passes the limit and is answered, one is served. */
static void test_http_chunked_body_over_limit_frees_its_slot(void **state)
{
    (void)state;
    lily_error err;
    lily_http_server *one;
    lily_http_options o = {.host = "127.0.0.1", .port = 0, .max_body = 1024, .model_name = "fake",
                           .max_connections = 1, .idle_timeout_s = 30};
    assert_int_equal(lily_http_start(&o, &sched, &one, &err), LILY_OK);
    const int saved = port;
    port = lily_http_port(one);
    int fd = connect_server();
    assert_int_equal(write(fd, chunked_chat_head, strlen(chunked_chat_head)), (ssize_t)strlen(chunked_chat_head));
    static const char first[] = "10\r\n{\"messages\":[  \r\n";
    assert_int_equal(write(fd, first, strlen(first)), (ssize_t)strlen(first));
    usleep(100000);
    assert_int_equal(status_of("GET", "/health", NULL, NULL, NULL), 0); /* the one slot is held: refused */
    chunk_flood f = {.fd = fd};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, flood_chunks, &f), 0);
    char buf[4096];
    bool closed;
    read_until_closed(fd, buf, sizeof buf, 4.0, &closed);
    pthread_join(th, NULL);
    close(fd);
    assert_true(closed);
    assert_memory_equal(buf, "HTTP/1.1 413 ", 13);
    assert_non_null(strstr(buf, "\"code\":\"request_too_large\""));
    /* the server may still be ending the connection when its client sees the close: up to 1 s */
    int status = 0;
    for (int i = 0; i < 100 && status != 200; i++) {
        status = status_of("GET", "/health", NULL, NULL, NULL);
        if (status != 200)
            usleep(10000);
    }
    assert_int_equal(status, 200);
    port = saved;
    lily_http_quiesce(one);
    lily_http_stop(one);
}

/* Time the engine takes (a request waiting in the queue, a slow token) is not the client's silence: a
 * whole-body answer held 3 s and a stream paused 3 s both arrive whole with a 2 s idle timeout. */
static void test_http_engine_time_is_not_idle_time(void **state)
{
    (void)state;
    atomic_store(&release_blocked, 0);
    int fd = connect_server();
    send_request(fd, "POST", "/v1/chat/completions", NULL, "{\"messages\":[{\"role\":\"user\",\"content\":\"hold\"}]}");
    while (!atomic_load(&running_block))
        usleep(1000);
    sleep(3);
    atomic_store(&release_blocked, 1);
    char buf[4096];
    read_to_close(fd, buf, sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 200"));
    assert_non_null(strstr(buf, "\r\n\r\n{}"));
    atomic_store(&release_blocked, 0);
    assert_int_equal(status_of("POST", "/v1/chat/completions", NULL,
                               "{\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"pause\"}]}",
                               "data: [DONE]"),
                     200);
}

/* A streaming client that stops reading never holds the engine: once 4 MiB wait unread its job is
 * cancelled and the next request is answered. */
static void test_http_slow_reader_does_not_stall_the_worker(void **state)
{
    (void)state;
    int before = atomic_load(&cancelled_jobs);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    send_request(fd, "POST", "/v1/chat/completions", NULL,
                 "{\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"flood\"}]}");
    for (int i = 0; i < 5000 && !atomic_load(&running_block) && atomic_load(&cancelled_jobs) == before; i++)
        usleep(1000); /* the flood runs (or already ran into the bound) */
    /* the flood fills the pipe; the next request must not wait for this client */
    assert_int_equal(status_of("POST", "/v1/chat/completions", NULL,
                               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "Hello world"),
                     200);
    assert_int_equal(atomic_load(&cancelled_jobs), before + 1);
    close(fd);
}

/* /metrics counts what was answered: a malformed chunk is a 400 (answered by microhttpd), not a 499; a
 * 503 is not a server error, nor is microhttpd's 505 to a request line of another HTTP version (a client's
 * protocol error: counted with the other 4xx). */
static void test_http_malformed_requests_are_counted(void **state)
{
    (void)state;
    long long n_400 = metric("lily_requests_total{status=\"400\"} ");
    long long n_499 = metric("lily_requests_total{status=\"499\"} ");
    long long n_413 = metric("lily_requests_total{status=\"413\"} ");
    long long n_4xx = metric("lily_requests_total{status=\"4xx\"} ");
    long long n_5xx = metric("lily_requests_total{status=\"5xx\"} ");
    static const char *const bad[] = {
        "POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n{}\r\n0\r\n\r\n",
        "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}",
        "GET /health HTTP/1.1 junk\r\nHost: x\r\n\r\n",
        "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 18446744073709551616\r\n\r\n{}",
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", /* an HTTP/2 preface: microhttpd's 505, the client's error */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int fd = connect_server();
        assert_int_equal(write(fd, bad[i], strlen(bad[i])), (ssize_t)strlen(bad[i]));
        char b[4096];
        ssize_t n, total = 0;
        while ((n = read(fd, b, sizeof b)) > 0)
            total += n;
        close(fd);
        assert_true(total > 0);
    }
    long long got_400 = 0;
    for (int i = 0; i < 200 && got_400 != n_400 + 3; i++) {
        got_400 = metric("lily_requests_total{status=\"400\"} ");
        usleep(5000);
    }
    assert_int_equal(got_400, n_400 + 3);
    assert_int_equal(metric("lily_requests_total{status=\"413\"} "), n_413 + 1);
    assert_int_equal(metric("lily_requests_total{status=\"499\"} "), n_499);
    assert_int_equal(metric("lily_requests_total{status=\"4xx\"} "), n_4xx + 1);
    assert_int_equal(metric("lily_requests_total{status=\"5xx\"} "), n_5xx);
}

/* A response the server's shutdown cancels (the second SIGTERM: lily_job_abort) still reaches its client:
 * a non-streamed one becomes a 503 with an error body in place of its 200 and partial body, a stream gets
 * an error event; a job whose client left gets nothing written. */
static void test_job_aborted_answers_503(void **state)
{
    (void)state;
    lily_oai_error e;
    lily_oai_error_set(&e, 503, "unavailable_error", NULL, NULL, "shutting down");
    lily_job *job = lily_job_new(LILY_ROUTE_CHAT);
    assert_non_null(job);
    lily_job_begin(job, 200, false);
    assert_int_equal(lily_job_write(job, "{\"partial\"", 11), LILY_OK);
    lily_job_abort(job);
    assert_true(lily_job_cancelled(job) && lily_job_aborted(job));
    lily_job_fail(job, &e);
    size_t len;
    char *out = lily_job_take_output(job, &len);
    assert_int_equal(job->http_status, 503);
    assert_true(job->finished);
    assert_non_null(out);
    assert_string_equal(out, "{\"error\":{\"message\":\"shutting down\",\"type\":\"unavailable_error\","
                             "\"param\":null,\"code\":null}}");
    free(out);
    lily_job_unref(job);

    job = lily_job_new(LILY_ROUTE_CHAT);
    assert_non_null(job);
    lily_job_begin(job, 200, true);
    assert_int_equal(lily_job_write(job, "data: {}\n\n", 10), LILY_OK);
    lily_job_abort(job);
    lily_job_fail(job, &e);
    out = lily_job_take_output(job, &len);
    assert_int_equal(job->http_status, 200);
    assert_non_null(out);
    assert_non_null(strstr(out, "data: {}\n\ndata: {\"error\":{\"message\":\"shutting down\""));
    free(out);
    lily_job_unref(job);

    job = lily_job_new(LILY_ROUTE_CHAT);
    assert_non_null(job);
    lily_job_begin(job, 200, false);
    lily_job_cancel(job); /* the client left */
    lily_job_fail(job, &e);
    out = lily_job_take_output(job, &len);
    assert_true(!out || len == 0);
    free(out);
    lily_job_unref(job);
}

/* A request of head + n copies of unit + tail on a new connection: the answer until the server closes it
 * (read_to_close) into buf, and the seconds that took. */
static double repeated_exchange(const char *head, const char *unit, size_t n, const char *tail, char *buf, size_t cap)
{
    size_t hl = strlen(head), ul = strlen(unit), tl = strlen(tail);
    char *req = malloc(hl + n * ul + tl + 1);
    assert_non_null(req);
    memcpy(req, head, hl);
    for (size_t i = 0; i < n; i++)
        memcpy(req + hl + i * ul, unit, ul);
    memcpy(req + hl + n * ul, tail, tl + 1);
    const double t0 = lily_wall_seconds();
    raw_exchange(req, buf, cap);
    free(req);
    return lily_wall_seconds() - t0;
}

/* A request-target microhttpd cannot parse in its per-connection memory — an 80 KB query of short arguments,
 * or 4000 arguments in 8 KB — got no answer at all (microhttpd lost its own 431). Such a target (over 8 KiB,
 * or more than 1024 query arguments) is a 414 with an error body in the route's API shape, at once, and the
 * server keeps serving; 1024 arguments are served. Longer request lines and too many headers get
 * microhttpd's own 414 and 431. */
static void test_http_long_request_target_is_414(void **state)
{
    (void)state;
    long long n_4xx = metric("lily_requests_total{status=\"4xx\"} ");
    static const struct {
        const char *head, *unit, *tail;
        size_t n;
        const char *want;
    } refused[] = {
        {"GET /v1/models?", "a=1&", "a=1 HTTP/1.1\r\nHost: x\r\n\r\n", 20000, "longer than 8192 bytes"},
        {"GET /v1/models?", "a&", "a HTTP/1.1\r\nHost: x\r\n\r\n", 4000, "has 4001 query arguments; at most 1024"},
        {"GET /health?", "&", " HTTP/1.1\r\nHost: x\r\n\r\n", 1024, "has 1025 query arguments"},
        {"POST /v1/chat/completions?", "a=1&", "a=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 20000,
         "\"code\":\"uri_too_long\""},
        {"POST /v1/messages?", "a=1&", "a=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 20000,
         "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"The request URL is longer"},
    };
    static char buf[1 << 16];
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        const double secs = repeated_exchange(refused[i].head, refused[i].unit, refused[i].n, refused[i].tail, buf,
                                              sizeof buf);
        const char *body = strstr(buf, "\r\n\r\n");
        size_t content_length = 0;
        const char *cl = strstr(buf, "Content-Length: ");
        if (cl)
            content_length = strtoul(cl + 16, NULL, 10);
        if (strncmp(buf, "HTTP/1.1 414 URI Too Long\r\n", 27) || !strstr(buf, "Content-Type: application/json\r\n") ||
            !strstr(buf, refused[i].want) || !body || strlen(body + 4) != content_length || secs > 1.0) {
            print_error("case %zu: %.2f s:\n%.600s\n", i, secs, buf);
            fail();
        }
        assert_int_equal(status_of("GET", "/health", NULL, NULL, "\"status\":\"ok\""), 200);
    }
    long long got_4xx = 0;
    for (int i = 0; i < 200 && got_4xx != n_4xx + 5; i++) {
        got_4xx = metric("lily_requests_total{status=\"4xx\"} ");
        usleep(5000);
    }
    assert_int_equal(got_4xx, n_4xx + 5);

    /* within the bounds: served as before */
    repeated_exchange("GET /v1/models?", "a=1&", 1023, "a=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", buf,
                      sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 200 OK\r\n"));
    assert_non_null(strstr(buf, "\"object\":\"list\""));
    repeated_exchange("GET /v1/models?x=", "a", 8000, " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", buf,
                      sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 200 OK\r\n"));
    assert_int_equal(status_of("GET", "/v1/models?limit=20&after_id=fake", NULL, NULL, "\"object\":\"list\""), 200);

    /* what microhttpd answers itself: a request line longer than its buffer, too many headers */
    repeated_exchange("GET /v1/models?x=", "a", 400000, " HTTP/1.1\r\nHost: x\r\n\r\n", buf, sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 414 "));
    repeated_exchange("GET /v1/models HTTP/1.1\r\nHost: x\r\n", "a: 1\r\n", 16000, "\r\n", buf, sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 431 "));
    assert_int_equal(status_of("GET", "/health", NULL, NULL, "\"status\":\"ok\""), 200);
}

/* A control character in the path, percent-encoded or raw, is a 400 and the request is never routed:
 * microhttpd decodes the path in place, so "/v1/models%00junk" reached the router as "/v1/models" and was
 * answered as the model list. A %00 in the query (not routed on) is no matter. */
static void test_http_control_char_in_path_is_400(void **state)
{
    (void)state;
    static const char *const paths[] = {"/v1/models%00junk", "/v1/models%00", "/health%0a", "/v1/models%7F",
                                        "/v1/models%1f", "/v1/models/fake%00x", "/v1/mo\x01" "dels",
                                        "http://localhost/v1/models%00"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        int status;
        char *r = http("GET", paths[i], NULL, NULL, &status);
        if (status != 400 || !strstr(r, "\"code\":\"invalid_url\"") || strstr(r, "\"object\":\"list\"") ||
            strstr(r, "\"status\":\"ok\"")) {
            print_error("%s:\n%s\n", paths[i], r);
            fail();
        }
        free(r);
    }
    assert_int_equal(status_of("POST", "/tokenize%00", NULL, "{\"content\":\"abc\"}", "\"code\":\"invalid_url\""),
                     400);
    assert_int_equal(status_of("POST", "/v1/messages%00", NULL, "{}",
                               "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\""),
                     400);
    assert_int_equal(status_of("GET", "/v1/models?x=%00", NULL, NULL, "\"object\":\"list\""), 200);
    assert_int_equal(status_of("GET", "/health", NULL, NULL, "\"status\":\"ok\""), 200);
}

/* The Messages route's validation errors reach the client in Anthropic's shape, with the request's own field
 * names, and the server keeps serving. */
static void test_http_anthropic_errors_are_anthropic_shaped(void **state)
{
    (void)state;
    static const struct {
        const char *body, *want;
    } cases[] = {
        {"{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"name\":\"t\","
         "\"input_schema\":{}},{\"name\":\"t\",\"input_schema\":{}}]}",
         "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"tools: tool names must be "
         "unique: 't' is tools.0.name and tools.1.name.\"}}"},
        {"{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":"
         "\"toolu_9\",\"content\":\"x\"}]}]}",
         "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"messages.0.content.0: "
         "tool_use_id 'toolu_9' matches no tool_use block"},
        {"{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stop_sequences\":[7]}",
         "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"stop_sequences.0: expected a "
         "string.\"}}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(status_of("POST", "/v1/messages", NULL, cases[i].body, cases[i].want), 400);
        assert_int_equal(status_of("POST", "/v1/messages/count_tokens", NULL, cases[i].body, cases[i].want), 400);
    }
    assert_int_equal(status_of("GET", "/health", NULL, NULL, "\"status\":\"ok\""), 200);
}

/* lily_http_check_target's bounds and what counts as a control character in the path. */
static void test_target_check(void **state)
{
    (void)state;
    static char t[LILY_HTTP_MAX_TARGET + 2];
    memset(t, 'a', sizeof t - 1);
    t[0] = '/';
    t[LILY_HTTP_MAX_TARGET] = 0;
    assert_int_equal(lily_http_check_target(t, NULL), LILY_TARGET_OK);
    t[LILY_HTTP_MAX_TARGET] = 'a';
    assert_int_equal(lily_http_check_target(t, NULL), LILY_TARGET_TOO_LONG);
    size_t n = 0;
    char q[3000] = "/v1/models?";
    for (int i = 0; i < LILY_HTTP_MAX_QUERY_ARGS - 1; i++)
        strcat(q, "&");
    assert_int_equal(lily_http_check_target(q, &n), LILY_TARGET_OK);
    assert_int_equal(n, LILY_HTTP_MAX_QUERY_ARGS);
    strcat(q, "&");
    assert_int_equal(lily_http_check_target(q, &n), LILY_TARGET_TOO_MANY_ARGS);
    assert_int_equal(n, LILY_HTTP_MAX_QUERY_ARGS + 1);
    assert_int_equal(lily_http_check_target("/v1/models", &n), LILY_TARGET_OK);
    assert_int_equal(n, 0);
    assert_int_equal(lily_http_check_target("/v1/models?", &n), LILY_TARGET_OK);
    assert_int_equal(n, 1);
    assert_int_equal(lily_http_check_target(NULL, &n), LILY_TARGET_OK);
    static const char *const bad[] = {"/v1/models%00junk", "/a%0a", "/a%0D", "/a%1f", "/a%7F", "/a\x01", "/a\x7f",
                                      "/a\tb", "http://h/%00", "/a%%00"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(lily_http_check_target(bad[i], NULL), LILY_TARGET_CONTROL_CHAR);
    static const char *const fine[] = {"/a%20b", "/a%", "/a%0", "/a%0g", "/a%8f", "/a?x=%00", "/a?\x01",
                                       "/a%2F"};
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++)
        assert_int_equal(lily_http_check_target(fine[i], NULL), LILY_TARGET_OK);
}

int main(void)
{
    /* a client write to a connection the server has just closed (an idle or evicted one) must fail with
     * EPIPE, not kill the test */
    signal(SIGPIPE, SIG_IGN);
    if (getenv("TEST_FILTER")) /* e.g. TEST_FILTER='*414*': only the tests whose names match */
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_http_routes_and_methods),
        cmocka_unit_test(test_http_bad_requests_are_openai_400s),
        cmocka_unit_test(test_http_body_over_limit_is_413),
        cmocka_unit_test(test_http_chat_non_stream_and_stream),
        cmocka_unit_test(test_http_first_event_is_not_held_for_the_second),
        cmocka_unit_test(test_http_disconnect_cancels_then_next_request_completes),
        cmocka_unit_test(test_http_stream_left_while_quiet),
        cmocka_unit_test(test_http_stream_reset_by_client_is_not_logged),
        cmocka_unit_test(test_http_queue_full_is_503),
        cmocka_unit_test(test_http_bearer_auth_is_401),
        cmocka_unit_test(test_http_disconnect_before_body_is_499),
        cmocka_unit_test(test_http_cors_and_content_type),
        cmocka_unit_test(test_http_idle_connections_do_not_lock_out),
        cmocka_unit_test(test_http_slow_clients_do_not_lock_out),
        cmocka_unit_test(test_http_ambiguous_framing_is_400_and_closed),
        cmocka_unit_test(test_http_unsupported_transfer_coding_is_400_at_once),
        cmocka_unit_test(test_http_chunked_body_over_limit_is_413_at_once),
        cmocka_unit_test(test_http_chunked_body_over_limit_frees_its_slot),
        cmocka_unit_test(test_http_stop_does_not_wait_for_unfinished_requests),
        cmocka_unit_test(test_http_connection_limit_spans_both_loopbacks),
        cmocka_unit_test(test_http_connection_count_survives_a_storm),
        cmocka_unit_test(test_http_slow_reader_does_not_stall_the_worker),
        cmocka_unit_test(test_http_engine_time_is_not_idle_time),
        cmocka_unit_test(test_http_malformed_requests_are_counted),
        cmocka_unit_test(test_job_aborted_answers_503),
        cmocka_unit_test(test_http_long_request_target_is_414),
        cmocka_unit_test(test_http_control_char_in_path_is_400),
        cmocka_unit_test(test_target_check),
        cmocka_unit_test(test_http_anthropic_errors_are_anthropic_shaped),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
