/* cmd_serve.c — `lily serve`: the OpenAI- and Anthropic-compatible HTTP server (server/http.h, server/service.h).
 *
 * Owns: the options, the order of start-up (HTTP first, so /health answers 503 while the model loads on
 * the engine worker) and of shutdown (SIGINT/SIGTERM: stop accepting, answer waiting requests 503, let the
 * response in flight finish, then exit 0; a second SIGINT/SIGTERM cancels that response at its next
 * decode step).
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "cli_common.h"
#include "commands.h"
#include "lily.h"

#ifdef LILY_HAVE_SERVER
#include "server/http.h"
#include "server/scheduler.h"
#include "server/service.h"
#include "runtime/prefix_cache.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lily serve [-m DIR] [options]\n"
            "\n"
            "OpenAI- and Anthropic-compatible server: POST /v1/chat/completions, POST /v1/completions,\n"
            "POST /v1/responses (stateless), POST /v1/messages, POST /v1/messages/count_tokens,\n"
            "GET /v1/models, GET /v1/models/{id},\n"
            "GET / (a chat page), GET /health (503 while the model loads), GET /metrics (Prometheus text),\n"
            "POST /tokenize, POST /detokenize.\n"
            "\n"
            "  -m, --model DIR      model directory (config.json, safetensors, tokenizer.json);\n"
            "                       default: $LILY_MODEL, else the bundled models/lily-tiny\n"
            "  --host ADDR          address to bind (default 127.0.0.1; 0.0.0.0 for every interface;\n"
            "                       localhost: 127.0.0.1 and ::1, as clients may try either)\n"
            "  --port N             port (default 8080; 0 = any free port)\n"
            "  --api-key KEY        require 'Authorization: Bearer KEY' (default: $LILY_API_KEY, else none)\n"
            "  --api-key-file F     the key is F's first line (not visible in ps)\n"
            "  --cors-origin LIST   browser origins allowed besides this machine's pages (comma-separated,\n"
            "                       e.g. https://chat.example.com; '*' = any). Default: loopback only\n"
            "  --idle-timeout S     close a connection silent for S seconds: headers, body or reading its\n"
            "                       answer (default 10)\n"
            "  --max-connections N  open connections at most (localhost: its two loopbacks together); the\n"
            "                       oldest idle ones are closed to keep one in eight free for new clients\n"
            "                       (default 256)\n"
            "  --ctx-size N         context size in tokens, at least 16 (default or 0: the model's, at most\n"
            "                       32768; cuda: as large as fits in GPU memory, up to the model's)\n"
            "  --gpu-memory GIB     " CLI_GPU_MEMORY_HELP "\n"
            "  --cpu-moe            " CLI_CPU_MOE_HELP "\n"
            "  --n-cpu-moe N        " CLI_N_CPU_MOE_HELP "\n"
            "  --host-experts M     " CLI_HOST_EXPERTS_HELP "\n"
            "                       " CLI_HOST_EXPERTS_DEFAULT_HELP "\n"
            "  --queue N            requests that may wait while one runs; more get 503 (default 16)\n"
            "  --max-body MIB       largest request body in MiB; larger gets 413 (default 16)\n"
            "  --backend cpu|cuda   compute backend (default cpu)\n"
            "  --precision P        fast (default) or exact: fp32 everywhere (cuda: fp32 KV cache, no tensor\n"
            "                       cores; slower; cpu: no int8 dot products), the reference\n"
            "  -t, --threads N      " CLI_THREADS_HELP "\n"
            "  --alias NAME         the model id clients see (default: the directory's name; ORG/NAME for a\n"
            "                       Hugging Face hub snapshot, .../models--ORG--NAME/snapshots/REV)\n"
            "  --cache-ram MIB      host memory for prefix-cache checkpoints of the session state, reused\n"
            "                       by requests that repeat a cached prefix (default: 4 full-context\n"
            "                       states of the model, at least 64 and at most 4096, and at most a quarter\n"
            "                       of the memory lily may use: the machine's, or a container's cgroup limit;\n"
            "                       said at startup; more than that memory is a usage error)\n"
            "  --cache-vram MIB     GPU memory for prefix-cache checkpoints, allocated once at start;\n"
            "                       what does not fit goes to --cache-ram (default 2048 with --backend\n"
            "                       cuda, 0 = none)\n"
            "  --checkpoint-every N also checkpoint every N tokens of a long prefill (default 4096; 0 = never)\n"
            "  --host-sampler       sample every token on the host, never in the backend's device decode loop\n"
            "                       (a per-token round trip: for A/B comparisons; the request log's decode_path\n"
            "                       says which ran)\n"
            "\n"
            "Defaults for what a request leaves out (a request's own field wins):\n"
            "  --temp T, --top-p P, --top-k K, --min-p P\n"
            "                       sampling (default: the model's generation_config.json; without one,\n"
            "                       Qwen's recommendation: temperature 1, top-p 0.95, top-k 20, min-p 0)\n"
            "  -n, --max-tokens N   reply length cap (default: chat none, completions 16 as OpenAI)\n"
            "  --seed S             sampler seed (default -1: a random one per request, as a request's seed -1;\n"
            "                       the request log's seed= says which was drawn)\n"
            "  --no-think           thinking off (same as --reasoning off)\n"
            "  --reasoning on|off   thinking on or off (default on, the chat template's default);\n"
            "                       a request's chat_template_kwargs.enable_thinking or reasoning_effort wins\n"
            "  --reasoning-budget N at most N tokens of reasoning: then lily closes the think block itself\n"
            "                       and the answer follows (default: no limit; 0 = close it at once)\n");
}

/* The sampling and length options serve shares with run and chat (parsed by cli_gen_option). */
static bool is_shared_option(const char *a)
{
    static const char *const names[] = {"--temp", "--temperature", "--top-p", "--top-k", "--min-p", "--max-tokens",
                                        "-n", "--no-think", "--cpu-moe", "--n-cpu-moe", "--host-sampler",
                                        "--host-experts", "--seed"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        size_t n = strlen(names[k]);
        if (!strncmp(a, names[k], n) && (a[n] == 0 || a[n] == '='))
            return true;
    }
    return false;
}

/* Whether a --host address is reachable only from this machine (127.0.0.0/8, ::1, localhost). */
static bool host_is_loopback(const char *host)
{
    return !strncmp(host, "127.", 4) || !strcmp(host, "::1") || !strcasecmp(host, "localhost");
}

/* --host's value: an address or a name, not a URL nor ADDR:PORT (as other servers' --host 0.0.0.0:8080 or a
 * copied http://127.0.0.1:8080, which only failed to resolve). Returns 0, or 2 printed (a usage error). */
static int check_host(const char *host)
{
    const char *colon = strchr(host, ':');
    if (!*host) {
        fprintf(stderr, "lily serve: --host is empty (leave it out for 127.0.0.1; 0.0.0.0 for every interface)\n");
        return 2;
    }
    if (strstr(host, "://")) {
        fprintf(stderr, "lily serve: --host takes an address, not a URL: got '%s' (e.g. --host 127.0.0.1 --port "
                        "8080)\n", host);
        return 2;
    }
    if (colon && !strchr(colon + 1, ':') && colon[1] && strspn(colon + 1, "0123456789") == strlen(colon + 1)) {
        fprintf(stderr, "lily serve: --host takes an address without a port: got '%s'; give the port with --port "
                        "(--host %.*s --port %s)\n", host, (int)(colon - host), host, colon + 1);
        return 2;
    }
    return 0;
}

/* The API key: --api-key, else --api-key-file's first line, else $LILY_API_KEY, else none (*key NULL), without
 * the spaces and tabs around it (a client cannot send them: HTTP drops them around a header's value, and the
 * bearer check skips them after "Bearer ", so a key file's "KEY " locked every client out). buf (cap bytes)
 * holds the key. An empty key, or both options, is a usage error (returns nonzero after saying so). */
static int resolve_api_key(const char **key, const char *file, char *buf, size_t cap)
{
    if (*key && file) {
        fprintf(stderr, "lily serve: give --api-key or --api-key-file, not both\n");
        return 1;
    }
    const char *from = *key ? "--api-key" : file ? "--api-key-file" : "LILY_API_KEY";
    if (file) {
        FILE *f = fopen(file, "r");
        if (!f) {
            fprintf(stderr, "lily serve: cannot read --api-key-file %s: %s\n", file, strerror(errno));
            return 1;
        }
        errno = 0;
        if (!fgets(buf, (int)cap, f))
            buf[0] = 0;
        bool failed = ferror(f); /* a directory reads as an error (EISDIR), not as an empty key */
        int read_errno = errno;
        fclose(f);
        if (failed) {
            fprintf(stderr, "lily serve: cannot read --api-key-file %s: %s\n", file,
                    strerror(read_errno ? read_errno : EIO));
            return 1;
        }
        buf[strcspn(buf, "\r\n")] = 0;
        *key = buf;
    } else if (!*key) {
        *key = getenv("LILY_API_KEY");
        if (!*key)
            return 0;
    }
    const char *k = *key;
    while (*k == ' ' || *k == '\t')
        k++;
    size_t n = strlen(k);
    while (n > 0 && (k[n - 1] == ' ' || k[n - 1] == '\t'))
        n--;
    if (n == 0) { /* refused, not served without a key: a deployment's unset variable often expands to "" */
        fprintf(stderr, "lily serve: the API key from %s is empty (%s to serve without a key)\n", from,
                file || !strcmp(from, "--api-key") ? "leave the option out" : "unset LILY_API_KEY");
        return 1;
    }
    if (n >= cap) {
        fprintf(stderr, "lily serve: the API key from %s is longer than %zu bytes\n", from, cap - 1);
        return 1;
    }
    memmove(buf, k, n);
    buf[n] = 0;
    *key = buf;
    return 0;
}

/* The path component of dir that ends at end (trailing slashes before end skipped): [*b, *e). */
static void component_before(const char *dir, size_t end, size_t *b, size_t *e)
{
    while (end > 1 && dir[end - 1] == '/')
        end--;
    size_t i = end;
    while (i > 0 && dir[i - 1] != '/')
        i--;
    *b = i;
    *e = end;
}

/* The model id clients see without --alias: the directory's name (a symlink's own name), that of the
 * directory "." or ".." stand for, and for a Hugging Face hub snapshot (models--ORG--NAME/snapshots/REV)
 * the repo id ORG/NAME, as vLLM names the model it loads from that repo (not the revision's hash). */
static void dir_name(const char *dir, char *out, size_t cap)
{
    char real[PATH_MAX];
    size_t b, e;
    component_before(dir, strlen(dir), &b, &e);
    if ((e - b == 1 && dir[b] == '.') || (e - b == 2 && !strncmp(dir + b, "..", 2))) {
        if (realpath(dir, real)) /* else it does not exist: loading says so, and the name is moot */
            dir = real;
        component_before(dir, strlen(dir), &b, &e);
    }
    size_t sb = 0, se = 0, hb = 0, he = 0; /* snapshots/, models--ORG--NAME/ */
    if (b > 0)
        component_before(dir, b - 1, &sb, &se);
    if (sb > 0 && se - sb == 9 && !strncmp(dir + sb, "snapshots", 9))
        component_before(dir, sb - 1, &hb, &he);
    if (he - hb > 8 && !strncmp(dir + hb, "models--", 8)) {
        const char *org = dir + hb + 8, *end = dir + he;
        for (const char *p = org + 1; p + 2 < end; p++)
            if (p[0] == '-' && p[1] == '-') {
                snprintf(out, cap, "%.*s/%.*s", (int)(p - org), org, (int)(end - p - 2), p + 2);
                return;
            }
    }
    snprintf(out, cap, "%.*s", (int)(e - b), dir + b);
}

/* --cors-origin's list: "*", or origins as a browser sends them in its Origin header, scheme://host[:port]
 * (a trailing / is allowed: the server drops it). A bare host name or a path would never match any request,
 * so either is a usage error naming the entry. Returns 0, or 2 printed. */
static int check_cors_origins(const char *list)
{
    if (!list[strspn(list, " ,")]) {
        fprintf(stderr, "lily serve: --cors-origin is empty (leave it out to allow this machine's pages only)\n");
        return 2;
    }
    for (const char *p = list; *p;) {
        p += strspn(p, " ,");
        size_t n = strcspn(p, ","), k = n;
        while (k > 0 && p[k - 1] == ' ')
            k--;
        while (k > 0 && p[k - 1] == '/')
            k--;
        const char *sep = NULL;
        for (size_t j = 0; !sep && j + 3 <= k; j++)
            sep = !strncmp(p + j, "://", 3) ? p + j : NULL;
        const char *host = sep ? sep + 3 : NULL;
        if (k && !(k == 1 && *p == '*') &&
            (!sep || sep == p || host == p + k || memchr(host, '/', (size_t)(p + k - host)))) {
            fprintf(stderr, "lily serve: --cors-origin: '%.*s' is not an origin; write it as a browser sends it, "
                            "scheme://host[:port] (e.g. https://chat.example.com), or '*'\n", (int)k, p);
            return 2;
        }
        p += n;
    }
    return 0;
}

int cmd_serve(int argc, char **argv)
{
    const char *model_dir = NULL, *host = "127.0.0.1", *api_key = NULL, *backend = "cpu", *alias = NULL;
    long port = 8080, ctx = 0, queue = 16, max_body_mib = 16, idle_timeout = 10, max_connections = 256;
    const char *api_key_file = NULL, *cors_origin = NULL;
    int threads = 0;
    size_t gpu_memory = 0;
    size_t cache_ram_bytes = 0 /* from the model */;
    long checkpoint_every = LILY_PREFIX_CACHE_DEFAULT_CHECKPOINT_EVERY;
    long cache_vram_mib = -1; /* -1: the backend's default */
    bool exact = false, reasoning_on = false;
    cli_gen_options go;
    cli_gen_options_init(&go);
    lily_request_defaults rd = lily_request_defaults_none();
    static const cli_value_option opts[] = {
        {"--model", "-m"}, {"--host", NULL}, {"--api-key", NULL}, {"--backend", NULL}, {"--precision", NULL},
        {"--alias", NULL}, {"--port", NULL}, {"--ctx-size", "-c"}, {"--queue", NULL}, {"--max-body", NULL},
        {"--threads", "-t"}, {"--cache-ram", NULL}, {"--cache-vram", NULL}, {"--checkpoint-every", NULL},
        {"--api-key-file", NULL}, {"--cors-origin", NULL}, {"--idle-timeout", NULL}, {"--max-connections", NULL},
        {"--reasoning", NULL}, {"--reasoning-budget", NULL}, {"--gpu-memory", NULL}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (is_shared_option(a)) {
            if (cli_gen_option("serve", argc, argv, &i, &go) < 0)
                return 2;
            continue;
        }
        const char *n = NULL, *v = NULL;
        int r = cli_match_option("serve", argc, argv, &i, opts, sizeof opts / sizeof opts[0], &n, &v);
        if (r < 0)
            return 2;
        if (r == 0) {
            cli_unknown_argument("serve", a);
            usage(stderr);
            return 2;
        }
        int ok = 1;
        if (!strcmp(n, "--model"))
            model_dir = v;
        else if (!strcmp(n, "--host"))
            host = v;
        else if (!strcmp(n, "--api-key"))
            api_key = v;
        else if (!strcmp(n, "--api-key-file"))
            api_key_file = v;
        else if (!strcmp(n, "--cors-origin"))
            cors_origin = v;
        else if (!strcmp(n, "--idle-timeout"))
            ok = cli_parse_int("serve", n, v, 1, 3600, &idle_timeout) == 0;
        else if (!strcmp(n, "--max-connections"))
            ok = cli_parse_int("serve", n, v, 8, 4096, &max_connections) == 0;
        else if (!strcmp(n, "--backend"))
            backend = v;
        else if (!strcmp(n, "--precision"))
            ok = cli_parse_precision("serve", v, &exact) == 0;
        else if (!strcmp(n, "--alias"))
            alias = v;
        else if (!strcmp(n, "--port"))
            ok = cli_parse_int("serve", n, v, 0, 65535, &port) == 0;
        else if (!strcmp(n, "--ctx-size"))
            ok = cli_parse_ctx_size("serve", n, v, &ctx) == 0;
        else if (!strcmp(n, "--queue"))
            ok = cli_parse_int("serve", n, v, 1, 1 << 16, &queue) == 0;
        else if (!strcmp(n, "--max-body"))
            ok = cli_parse_int("serve", n, v, 1, 4096, &max_body_mib) == 0;
        else if (!strcmp(n, "--threads"))
            ok = cli_parse_threads("serve", n, v, &threads) == 0;
        else if (!strcmp(n, "--cache-ram"))
            ok = cli_parse_cache_ram("serve", n, v, &cache_ram_bytes) == 0;
        else if (!strcmp(n, "--gpu-memory"))
            ok = cli_parse_gib("serve", n, v, &gpu_memory) == 0;
        else if (!strcmp(n, "--cache-vram"))
            ok = cli_parse_int("serve", n, v, 0, 1L << 24, &cache_vram_mib) == 0;
        else if (!strcmp(n, "--reasoning")) {
            ok = !strcmp(v, "on") || !strcmp(v, "off");
            if (ok)
                rd.enable_thinking = reasoning_on = !strcmp(v, "on");
            else
                fprintf(stderr, "lily serve: --reasoning expects on or off, got \"%s\"\n", v);
        } else if (!strcmp(n, "--reasoning-budget")) {
            long b;
            ok = cli_parse_int("serve", n, v, -1, INT32_MAX, &b) == 0;
            rd.reasoning_budget = (int)b;
        }
        else /* --checkpoint-every */
            ok = cli_parse_int("serve", n, v, 0, 1L << 24, &checkpoint_every) == 0;
        if (!ok)
            return 2;
    }
    if (go.no_think && reasoning_on) {
        fprintf(stderr, "lily serve: --no-think and --reasoning on conflict; give one\n");
        return 2;
    }
    if (alias && !*alias) {
        fprintf(stderr, "lily serve: --alias is empty (leave it out for the directory's name)\n");
        return 2;
    }
    if (cors_origin && check_cors_origins(cors_origin))
        return 2;
    if (check_host(host))
        return 2;
    /* an IPv6 address as a URL writes it (--host [::1], the form the start-up lines print) is the address */
    char host_buf[256];
    size_t host_len = strlen(host);
    if (host_len >= 2 && host[0] == '[' && host[host_len - 1] == ']' && host_len - 2 < sizeof host_buf) {
        memcpy(host_buf, host + 1, host_len - 2);
        host_buf[host_len - 2] = 0;
        host = host_buf;
    }
    if (cli_check_backend("serve", backend))
        return 2;
    char key_buf[4096];
    if (resolve_api_key(&api_key, api_key_file, key_buf, sizeof key_buf))
        return 2;
    if (go.set_temp)
        rd.temperature = go.sampling.temperature;
    if (go.set_top_p)
        rd.top_p = go.sampling.top_p;
    if (go.set_top_k)
        rd.top_k = go.sampling.top_k;
    if (go.set_min_p)
        rd.min_p = go.sampling.min_p;
    if (go.max_tokens > 0)
        rd.max_tokens = go.max_tokens;
    if (go.set_seed) {
        rd.has_seed = true;
        rd.seed = go.sampling.seed;
    }
    if (go.no_think)
        rd.enable_thinking = 0;
    if (!model_dir) {
        bool is_test_model;
        model_dir = cli_default_model("serve", &is_test_model);
    }
    char name[256];
    if (alias)
        snprintf(name, sizeof name, "%s", alias);
    else
        dir_name(model_dir, name, sizeof name);

    /* signals are taken by sigtimedwait below, never by a handler in some worker thread */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    lily_error err = {0};
    lily_service *svc = NULL;
    lily_service_options so = {.model_dir = model_dir, .backend = backend, .exact = exact, .n_threads = (int)threads,
                               .ctx_size = (int)ctx, .model_name = name, .gpu_memory_bytes = gpu_memory,
                               .n_cpu_moe = go.n_cpu_moe, .host_experts = go.host_experts,
                               .cache_ram_bytes = cache_ram_bytes,
                               .cache_vram_bytes = (size_t)(cache_vram_mib >= 0 ? cache_vram_mib
                                                            : !strcmp(backend, "cuda") ? LILY_PREFIX_CACHE_DEFAULT_VRAM_MIB
                                                                                       : 0) << 20,
                               .checkpoint_every = checkpoint_every > 0 ? (int)checkpoint_every : -1,
                               .host_sampler = go.host_sampler,
                               .request_defaults = &rd};
    if (lily_service_new(&so, &svc, &err) != LILY_OK) {
        fprintf(stderr, "lily serve: %s\n", err.message);
        return 1;
    }
    /* listen first, then load: a port that cannot be taken fails at once, before the model's loading starts */
    lily_scheduler sched;
    if (lily_scheduler_init(&sched, (int)queue, lily_service_load, lily_service_run, svc, &err) != LILY_OK) {
        fprintf(stderr, "lily serve: %s\n", err.message);
        lily_service_free(svc);
        return 1;
    }
    lily_http_options ho = {.host = host, .port = (int)port, .api_key = api_key,
                            .max_body = (size_t)max_body_mib << 20, .model_name = name,
                            .idle_timeout_s = (int)idle_timeout, .max_connections = (int)max_connections,
                            .cors_origins = cors_origin,
                            .metrics_extra = lily_service_metrics, .metrics_user = svc,
                            .context_length = lily_service_context_length, .context_user = svc,
                            .run_without_engine = lily_service_run_without_engine, .run_user = svc};
    lily_http_server *http = NULL;
    if (lily_http_start(&ho, &sched, &http, &err) != LILY_OK) {
        fprintf(stderr, "lily serve: %s\n", err.message);
        lily_scheduler_stop(&sched);
        lily_service_free(svc);
        return 1;
    }
    /* HTTP is up before the model: say that the model is still loading, and whether it then loaded or not */
    fprintf(stderr, "lily serve: loading model '%s' from %s; meanwhile listening on http://%s%s%s:%d%s "
                    "(GET /health answers 503 until the model is loaded)\n",
            name, model_dir, strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "", lily_http_port(http),
            strcasecmp(host, "localhost") ? ""
            : lily_http_dual_loopback(http) ? " (127.0.0.1 and ::1)"
                                            : " (127.0.0.1 only: this machine has no IPv6 loopback)");
    if ((!api_key || !*api_key) && !host_is_loopback(host))
        fprintf(stderr, "lily serve: warning: %s is reachable from other machines and no --api-key is set: anyone "
                        "who can reach it can use the model (give --api-key or --api-key-file, or bind 127.0.0.1)\n",
                host);
    if (lily_scheduler_launch(&sched, &err) != LILY_OK) {
        fprintf(stderr, "lily serve: %s\n", err.message);
        lily_http_quiesce(http);
        lily_scheduler_stop(&sched);
        lily_http_stop(http);
        lily_service_free(svc);
        return 1;
    }

    int rc = 0;
    bool announced = false, stop_requested = false;
    for (;;) {
        struct timespec tick = {0, 100 * 1000000L};
        int sig = sigtimedwait(&stop_signals, NULL, &tick);
        if (sig == SIGINT || sig == SIGTERM) {
            fprintf(stderr, "lily serve: %s: finishing the response in flight, then exiting (again to stop it now)\n",
                    sig == SIGINT ? "SIGINT" : "SIGTERM");
            stop_requested = true;
            break;
        }
        lily_sched_state st = lily_scheduler_state(&sched, NULL, NULL);
        if (st == LILY_SCHED_FAILED) {
            fprintf(stderr, "lily serve: cannot load the model: %s; stopping the server\n", sched.load_error.message);
            rc = 1;
            break;
        }
        if (st == LILY_SCHED_READY && !announced) {
            fprintf(stderr, "lily serve: model loaded; ready on http://%s%s%s:%d\n", strchr(host, ':') ? "[" : "",
                    host, strchr(host, ':') ? "]" : "", lily_http_port(http));
            announced = true;
        }
    }
    lily_http_quiesce(http);
    lily_scheduler_drain(&sched);
    /* the response in flight finishes, unless a second signal cancels it (at its next decode step) */
    while (stop_requested && !lily_scheduler_idle(&sched)) {
        struct timespec tick = {0, 50 * 1000000L};
        int sig = sigtimedwait(&stop_signals, NULL, &tick);
        if (sig == SIGINT || sig == SIGTERM) {
            fprintf(stderr, "lily serve: %s again: cancelling the response in flight\n",
                    sig == SIGINT ? "SIGINT" : "SIGTERM");
            lily_scheduler_abort(&sched);
            break;
        }
    }
    lily_scheduler_stop(&sched);
    lily_http_stop(http);
    lily_service_free(svc);
    return rc;
}

#else /* built without libmicrohttpd */

int cmd_serve(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "lily serve: this lily was built without libmicrohttpd (install libmicrohttpd-dev and rebuild)\n");
    return 1;
}

#endif
