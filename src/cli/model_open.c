/* model_open.c — the shared part of the generating commands (cli_common.h): their options, opening a
 * model directory with every check a new user needs a clear message for, and encoding a prompt.
 *
 * Checks, in order, each an error with exit status 1: the model directory exists; tokenizer.json is
 * present and well-formed (loaded before the weights, so the error comes fast); config.json and the
 * weights load; the tokenizer's largest id fits the model's vocab_size. A chat template other than the
 * known Qwen3.6 one is a warning (lily renders the built-in template anyway).
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <utf8proc.h>

#include "backend/backend.h"
#include "base/memory_limit.h"
#include "cli_common.h"
#include "model/gguf_check.h"
#include "text/chat_template.h"

void cli_gen_options_init(cli_gen_options *o)
{
    memset(o, 0, sizeof *o);
    o->backend = "cpu";
    o->sampling = lily_sampler_defaults();
}

void cli_gen_options_usage(FILE *f)
{
    fprintf(f,
            "  -m, --model DIR        model directory (default: $LILY_MODEL, else the bundled model)\n"
            "  -n, --max-tokens N     generate at most N tokens per reply; 0 = no cap: until a stop token or a\n"
            "                         full context (default: generation_config.json's max_new_tokens when it\n"
            "                         sets one, else no cap)\n"
            "      --temp T           temperature, 0 = greedy (default: generation_config.json, else 1)\n"
            "      --top-p P          nucleus cut in [0, 1]; 0 = greedy (default: generation_config.json,\n"
            "                         else 0.95)\n"
            "      --top-k K          top-k cut, 0 = off (default: generation_config.json, else 20)\n"
            "      --min-p P          min-p cut, 0 = off (default: generation_config.json, else 0)\n"
            "      --seed S           sampler seed (default or -1: a random one, from the clock; -1 prints it)\n"
            "      --no-think         render the prompt with thinking off (an empty think block)\n"
            "      --hide-reasoning   do not print the reasoning\n"
            "      --system TEXT      a system message before the user's\n"
            "  -c, --ctx-size N       context size in tokens, at least 16 (default or 0: the model's, at most\n"
            "                         32768; cuda: as large as fits in GPU memory, up to the model's)\n"
            "      --gpu-memory GIB   " CLI_GPU_MEMORY_HELP "\n"
            "      --cpu-moe          " CLI_CPU_MOE_HELP "\n"
            "      --n-cpu-moe N      " CLI_N_CPU_MOE_HELP "\n"
            "      --host-experts M   " CLI_HOST_EXPERTS_HELP "\n"
            "                         " CLI_HOST_EXPERTS_DEFAULT_HELP "\n"
            "      --backend NAME     cpu (default) or cuda\n"
            "      --precision P      fast (default) or exact: fp32 everywhere (cuda: fp32 KV cache, no tensor\n"
            "                         cores; slower; cpu: no int8 dot products), the reference\n"
            "  -t, --threads N        " CLI_THREADS_HELP "\n"
            "      --prefill-chunk N  at most N tokens per forward pass during prefill (default 512, 4096 with cuda)\n"
            "      --host-sampler     sample every token on the host, never in the backend's device loop (A/B)\n"
            "      --verbose          print the decode path (device loop or host sampler) after each reply\n");
}

int cli_check_backend(const char *cmd, const char *name)
{
    if (!strcmp(name, "cpu") || !strcmp(name, "cuda"))
        return 0;
    fprintf(stderr, "lily %s: unknown backend '%s' (backends: cpu, cuda%s)\n", cmd, name,
            lily_cuda_backend_ops_get() ? "" : "; cuda is not in this build");
    return -1;
}

int cli_parse_precision(const char *cmd, const char *value, bool *exact)
{
    if (!strcmp(value, "fast") || !strcmp(value, "exact")) {
        *exact = !strcmp(value, "exact");
        return 0;
    }
    fprintf(stderr, "lily %s: --precision expects fast or exact, got \"%s\"\n", cmd, value);
    return -1;
}

int cli_parse_int(const char *cmd, const char *opt, const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < min || v > max) {
        fprintf(stderr, "lily %s: %s expects an integer in [%ld, %ld], got \"%s\"\n", cmd, opt, min, max, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_ctx_size(const char *cmd, const char *opt, const char *s, long *out)
{
    long v;
    if (cli_parse_int(cmd, opt, s, 0, 1L << 24, &v))
        return -1;
    if (v > 0 && v < CLI_MIN_CTX_SIZE) {
        fprintf(stderr, "lily %s: %s %ld is too small: the minimum is %d tokens (a chat's template and one "
                        "reply token need 13); 0 = the model's default\n", cmd, opt, v, CLI_MIN_CTX_SIZE);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_cache_ram(const char *cmd, const char *opt, const char *s, size_t *bytes)
{
    long mib;
    if (cli_parse_int(cmd, opt, s, 1, 1L << 24, &mib))
        return -1;
    /* the machine's memory, or a container's cgroup limit when lower: more can never be honoured */
    const unsigned long long limit_mib = (unsigned long long)(lily_memory_limit_bytes() >> 20);
    if (limit_mib && (unsigned long long)mib > limit_mib) {
        fprintf(stderr, "lily %s: %s %ld MiB is more than the memory this process may use (%llu MiB: the machine's, "
                        "or its cgroup's limit): the prefix cache's checkpoints live in host memory\n",
                cmd, opt, mib, limit_mib);
        return -1;
    }
    *bytes = (size_t)mib << 20;
    return 0;
}

int cli_parse_gib(const char *cmd, const char *opt, const char *s, size_t *bytes)
{
    char *end;
    errno = 0;
    const double v = strtod(s, &end);
    if (!*s || *end || errno || !(v > 0 && v <= 65536)) {
        fprintf(stderr, "lily %s: %s expects a number of GiB in (0, 65536], got \"%s\"\n", cmd, opt, s);
        return -1;
    }
    *bytes = (size_t)(v * 1073741824.0);
    return 0;
}

int cli_parse_n_cpu_moe(const char *cmd, const char *opt, const char *s, int *n_cpu_moe)
{
    long v;
    if (cli_parse_int(cmd, opt, s, 0, INT32_MAX, &v))
        return -1;
    *n_cpu_moe = v == 0 ? LILY_N_CPU_MOE_NONE : (int)v;
    return 0;
}

int cli_parse_host_experts(const char *cmd, const char *opt, const char *s, int *host_experts)
{
    char *end;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (!strcmp(s, "zero-copy"))
        *host_experts = LILY_HOST_EXPERTS_ZERO_COPY;
    else if (!strcmp(s, "cpu"))
        *host_experts = LILY_HOST_EXPERTS_CPU;
    else if (*s && !*end && !errno && v >= 1 && v <= 64)
        *host_experts = (int)v;
    else {
        fprintf(stderr, "lily %s: %s expects zero-copy, cpu or a count of experts in [1, 64], got \"%s\"\n", cmd, opt, s);
        return -1;
    }
    return 0;
}

int cli_parse_threads(const char *cmd, const char *opt, const char *s, int *out)
{
    long v;
    if (cli_parse_int(cmd, opt, s, 0, CLI_MAX_THREADS, &v))
        return -1;
    *out = (int)v;
    return 0;
}

int cli_match_option(const char *cmd, int argc, char **argv, int *i, const cli_value_option *opts, size_t n,
                     const char **name, const char **value)
{
    const char *a = argv[*i];
    for (size_t k = 0; k < n; k++) {
        for (int alt = 0; alt < 2; alt++) {
            const char *opt = alt ? opts[k].alt : opts[k].name;
            if (!opt)
                continue;
            size_t len = strlen(opt);
            if (!strcmp(a, opt)) {
                if (*i + 1 >= argc) {
                    fprintf(stderr, "lily %s: %s needs a value\n", cmd, a);
                    return -1;
                }
                *name = opts[k].name;
                *value = argv[++*i];
                return 1;
            }
            if (opt[0] == '-' && opt[1] == '-' && !strncmp(a, opt, len) && a[len] == '=') {
                *name = opts[k].name;
                *value = a + len + 1;
                return 1;
            }
        }
    }
    return 0;
}

static int parse_float(const char *cmd, const char *opt, const char *s, double min, double max, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !(v >= min && v <= max)) {
        fprintf(stderr, "lily %s: %s expects a number in [%g, %g], got \"%s\"\n", cmd, opt, min, max, s);
        return -1;
    }
    *out = (float)v;
    return 0;
}

int cli_note_cpu_moe_option(const char *cmd, const char *option, const char **set_by)
{
    if (*set_by && strcmp(*set_by, option)) {
        fprintf(stderr, "lily %s: %s and %s conflict (--cpu-moe is every layer); give one\n", cmd, *set_by, option);
        return -1;
    }
    *set_by = option;
    return 0;
}

int cli_gen_option(const char *cmd, int argc, char **argv, int *i, cli_gen_options *o)
{
    static const char *const flags[] = {"--no-think", "--hide-reasoning", "--host-sampler", "--verbose",
                                        "--cpu-moe"};
    static const cli_value_option valued[] = {
        {"--model", "-m"}, {"--max-tokens", "-n"}, {"--temp", "--temperature"}, {"--top-p", NULL},
        {"--top-k", NULL}, {"--min-p", NULL}, {"--seed", NULL}, {"--system", NULL}, {"--ctx-size", "-c"},
        {"--backend", NULL}, {"--threads", "-t"}, {"--prefill-chunk", NULL}, {"--precision", NULL},
        {"--gpu-memory", NULL}, {"--n-cpu-moe", NULL}, {"--host-experts", NULL},
    };
    const char *a = argv[*i];
    if (!strcmp(a, flags[0])) {
        o->no_think = true;
        return 1;
    }
    if (!strcmp(a, flags[1])) {
        o->hide_reasoning = true;
        return 1;
    }
    if (!strcmp(a, flags[2])) {
        o->host_sampler = true;
        return 1;
    }
    if (!strcmp(a, flags[3])) {
        o->verbose = true;
        return 1;
    }
    if (!strcmp(a, flags[4])) {
        if (cli_note_cpu_moe_option(cmd, flags[4], &o->cpu_moe_option))
            return -1;
        o->n_cpu_moe = CLI_CPU_MOE_ALL;
        return 1;
    }
    const char *name = NULL, *value = NULL;
    int r = cli_match_option(cmd, argc, argv, i, valued, sizeof valued / sizeof valued[0], &name, &value);
    if (r <= 0)
        return r;
    if (strchr(a, '='))
        a = name; /* "--threads=x": messages name the option, not the whole argument */
    long v;
    if (!strcmp(name, "--model"))
        o->model_dir = value;
    else if (!strcmp(name, "--system")) {
        if (cli_check_utf8(cmd, "--system", value))
            return -1;
        o->system = value;
    }
    else if (!strcmp(name, "--backend")) {
        if (cli_check_backend(cmd, value))
            return -1;
        o->backend = value;
    }
    else if (!strcmp(name, "--precision")) {
        if (cli_parse_precision(cmd, value, &o->exact))
            return -1;
    }
    else if (!strcmp(name, "--max-tokens")) {
        if (cli_parse_int(cmd, a, value, 0, INT32_MAX, &v))
            return -1;
        o->max_tokens = (int)v;
        o->set_max_tokens = true;
    } else if (!strcmp(name, "--ctx-size")) { /* 0: the default, as serve and llama.cpp's -c 0 */
        if (cli_parse_ctx_size(cmd, a, value, &v))
            return -1;
        o->ctx_size = (int)v;
    } else if (!strcmp(name, "--threads")) {
        if (cli_parse_threads(cmd, a, value, &o->n_threads))
            return -1;
    } else if (!strcmp(name, "--gpu-memory")) {
        if (cli_parse_gib(cmd, a, value, &o->gpu_memory_bytes))
            return -1;
    } else if (!strcmp(name, "--host-experts")) {
        if (cli_parse_host_experts(cmd, a, value, &o->host_experts))
            return -1;
    } else if (!strcmp(name, "--n-cpu-moe")) {
        if (cli_note_cpu_moe_option(cmd, name, &o->cpu_moe_option) ||
            cli_parse_n_cpu_moe(cmd, a, value, &o->n_cpu_moe))
            return -1;
    } else if (!strcmp(name, "--prefill-chunk")) {
        if (cli_parse_int(cmd, a, value, 1, INT32_MAX, &v))
            return -1;
        o->prefill_chunk = (int)v;
    } else if (!strcmp(name, "--top-k")) {
        if (cli_parse_int(cmd, a, value, 0, INT32_MAX, &v))
            return -1;
        o->sampling.top_k = (int)v;
        o->set_top_k = true;
    } else if (!strcmp(name, "--seed")) {
        /* -1: a random seed (the clock's), said on stderr once chosen, as llama.cpp's --seed -1 */
        char *end;
        errno = 0;
        unsigned long long s = strtoull(value, &end, 10);
        if (!strcmp(value, "-1")) {
            o->set_seed = false;
            o->random_seed = true;
        } else if (!isdigit((unsigned char)value[0]) || *end || errno) { /* " -5": strtoull wraps it */
            fprintf(stderr, "lily %s: --seed expects a non-negative integer, or -1 for a random seed, got \"%s\"\n",
                    cmd, value);
            return -1;
        } else {
            o->sampling.seed = (uint64_t)s;
            o->set_seed = true;
            o->random_seed = false;
        }
    } else if (!strcmp(name, "--temp")) {
        if (parse_float(cmd, a, value, 0, 100, &o->sampling.temperature))
            return -1;
        o->set_temp = true;
    } else if (!strcmp(name, "--top-p")) {
        if (parse_float(cmd, a, value, 0, 1, &o->sampling.top_p)) /* 0: greedy, as lily serve's top_p 0 */
            return -1;
        o->set_top_p = true;
    } else if (!strcmp(name, "--min-p")) {
        if (parse_float(cmd, a, value, 0, 1, &o->sampling.min_p))
            return -1;
        o->set_min_p = true;
    }
    return 1;
}

/* Sampling defaults for options not given: generation_config.json's temperature / top_p / top_k / min_p /
 * repetition_penalty / presence_penalty (as lily serve takes them; validated at load, model/config.h; do_sample
 * false means greedy), else Qwen's recommended settings (lily_sampler_recommended). Without -n, its
 * max_new_tokens (as transformers' generate() reads it) caps the reply: a model that was never trained to
 * emit a stop token (the bundled and the test model) sets it, others run to a stop id or a full context. */
static void sampling_defaults(const lily_generation_defaults *g, cli_gen_options *o)
{
    const lily_sampler_params rec = lily_sampler_recommended();
    if (!o->set_temp)
        o->sampling.temperature = isnan(g->temperature) ? rec.temperature : g->temperature;
    if (!o->set_top_p)
        o->sampling.top_p = isnan(g->top_p) ? rec.top_p : g->top_p;
    if (!o->set_top_k)
        o->sampling.top_k = !g->has_top_k ? rec.top_k : g->top_k > 0 ? g->top_k : 0;
    if (!o->set_min_p)
        o->sampling.min_p = isnan(g->min_p) ? rec.min_p : g->min_p;
    o->sampling.repetition_penalty = isnan(g->repetition_penalty) ? rec.repetition_penalty : g->repetition_penalty;
    o->sampling.presence_penalty = isnan(g->presence_penalty) ? rec.presence_penalty : g->presence_penalty;
    if (!o->set_max_tokens)
        o->max_tokens = g->max_new_tokens;
    o->sampling = lily_sampler_params_normalize(o->sampling); /* --top-p 0: greedy */
    if (!o->set_seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        o->sampling.seed = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec;
    }
}

static void add_stop_id(cli_model *m, int32_t id)
{
    if (id < 0 || m->n_stop_ids >= (int)(sizeof m->stop_ids / sizeof m->stop_ids[0]))
        return;
    for (int i = 0; i < m->n_stop_ids; i++)
        if (m->stop_ids[i] == id)
            return;
    m->stop_ids[m->n_stop_ids++] = id;
}

int cli_model_open(const char *cmd, cli_gen_options *o, bool raw, cli_model *m)
{
    memset(m, 0, sizeof *m);
    bool test_model = false;
    const char *dir = o->model_dir ? o->model_dir : cli_default_model(cmd, &test_model);
    m->model_dir = dir;
    lily_error gerr;
    if (lily_check_not_gguf(dir, &gerr) != LILY_OK) {
        fprintf(stderr, "lily %s: %s\n", cmd, gerr.message);
        return 1;
    }
    if (lily_check_model_dir(dir, &gerr) != LILY_OK) { /* before the tokenizer: its error would hide this one */
        fprintf(stderr, "lily %s: %s\n", cmd, gerr.message);
        return 1;
    }
    lily_error err = {0};
    if (lily_tokenizer_load(dir, &m->tok, &err) != LILY_OK) {
        fprintf(stderr, "lily %s: %s\n", cmd, err.message);
        return 1;
    }
    lily_engine_options eo = {.model_dir = dir, .backend = o->backend, .n_threads = o->n_threads,
                              .prefill_chunk = o->prefill_chunk, .exact = o->exact,
                              .gpu_memory_bytes = o->gpu_memory_bytes, .ctx_size = o->ctx_size,
                              .device_pool_bytes = o->device_pool_bytes, .n_cpu_moe = o->n_cpu_moe,
                              .host_experts = o->host_experts};
    if (lily_engine_open(&eo, &m->engine, &err) != LILY_OK) {
        fprintf(stderr, "lily %s: %s\n", cmd, err.message);
        cli_model_close(m);
        return 1;
    }
    const int32_t tok_vocab = lily_tokenizer_vocab_size(m->tok);
    if (tok_vocab > m->engine->cfg.vocab_size) {
        fprintf(stderr,
                "lily %s: %s/tokenizer.json does not fit the model: its ids go up to %d (vocab size %d), but "
                "config.json's vocab_size is %d\n",
                cmd, dir, (int)tok_vocab - 1, (int)tok_vocab, m->engine->cfg.vocab_size);
        cli_model_close(m);
        return 1;
    }
    if (o->ctx_size > m->engine->cfg.max_position_embeddings)
        fprintf(stderr, "lily %s: warning: --ctx-size %d is beyond the model's max_position_embeddings %d; "
                        "quality past that length is untested\n",
                cmd, o->ctx_size, m->engine->cfg.max_position_embeddings);
    if (!raw) {
        lily_chat_template_match match;
        char sha[65];
        if (lily_chat_template_check(dir, &match, sha, &err) != LILY_OK) {
            fprintf(stderr, "lily %s: %s\n", cmd, err.message);
            cli_model_close(m);
            return 1;
        }
        if (match == LILY_CHAT_TEMPLATE_DIFFERENT)
            fprintf(stderr,
                    "lily: warning: %s has a chat template that differs from the known Qwen3.6 template "
                    "(sha256 %.12s..., expected %.12s...); lily renders its built-in Qwen3.6 template anyway\n",
                    dir, sha, LILY_CHAT_TEMPLATE_KNOWN_SHA256);
        else if (match == LILY_CHAT_TEMPLATE_MISSING)
            fprintf(stderr, "lily: warning: %s has no chat template; lily renders its built-in Qwen3.6 template\n",
                    dir);
    }
    for (int i = 0; i < m->engine->cfg.n_stop_ids; i++)
        add_stop_id(m, m->engine->cfg.stop_ids[i]);
    add_stop_id(m, lily_tokenizer_token_id(m->tok, "<|im_end|>"));
    add_stop_id(m, lily_tokenizer_token_id(m->tok, "<|endoftext|>"));
    add_stop_id(m, lily_tokenizer_eos_id(m->tok));
    sampling_defaults(&m->engine->cfg.generation, o);
    if (o->random_seed) /* --seed -1: the seed drawn, so the reply can be sampled again */
        fprintf(stderr, "lily %s: --seed -1: sampling with seed %llu\n", cmd, (unsigned long long)o->sampling.seed);
    return 0;
}

void cli_model_close(cli_model *m)
{
    lily_engine_close(m->engine);
    lily_tokenizer_free(m->tok);
    m->engine = NULL;
    m->tok = NULL;
}

int cli_encode(const char *cmd, const cli_model *m, const char *text, int32_t **ids, int *n_ids)
{
    lily_error err = {0};
    if (lily_tokenizer_encode(m->tok, text, strlen(text), true, ids, n_ids, &err) != LILY_OK) {
        fprintf(stderr, "lily %s: %s\n", cmd, err.message);
        return 1;
    }
    return 0;
}

int cli_check_utf8(const char *cmd, const char *what, const char *text)
{
    const size_t len = strlen(text);
    size_t at = 0;
    while (at < len) {
        utf8proc_int32_t cp;
        const utf8proc_ssize_t n =
            utf8proc_iterate((const utf8proc_uint8_t *)text + at, (utf8proc_ssize_t)(len - at), &cp);
        if (n <= 0 || !utf8proc_codepoint_valid(cp)) {
            fprintf(stderr, "lily %s: %s is not valid UTF-8 (byte %zu of %zu)\n", cmd, what, at, len);
            return 1;
        }
        at += (size_t)n;
    }
    return 0;
}

void cli_print_decode_path(const char *prefix, const lily_generate_result *r)
{
    if (r->device_loop)
        fprintf(stderr, "%sdecode path: device loop (%d batches, %d steps re-run after the stop)\n", prefix,
                r->n_device_batches, r->n_replayed);
    else
        fprintf(stderr, "%sdecode path: %s\n", prefix, r->decode_path ? r->decode_path : "host sampler");
}

void cli_print_speed(const char *prefix, int n_prefill, double prefill_s, int n_generated, int n_decode_steps,
                     double decode_s, const char *finish)
{
    fprintf(stderr, "%sprefill: %d tokens, %.1f tok/s (%.3f s) | decode: %d tokens, %.1f tok/s (%.3f s) | %s\n",
            prefix, n_prefill, n_prefill > 0 && prefill_s > 0 ? n_prefill / prefill_s : 0.0, prefill_s, n_generated,
            n_decode_steps > 0 && decode_s > 0 ? n_decode_steps / decode_s : 0.0, decode_s, finish);
}

const char *cli_finish_text(const lily_generate_result *r, const cli_gen_options *o, int max_ctx, char *buf, size_t n)
{
    if (r->finish != LILY_FINISH_LENGTH)
        snprintf(buf, n, "%s", lily_finish_reason_name(r->finish));
    else if (o->max_tokens > 0 && r->n_generated >= o->max_tokens)
        snprintf(buf, n,
                 o->set_max_tokens ? "length (-n %d)"
                                   : "length (max_new_tokens %d of generation_config.json; -n sets another)",
                 o->max_tokens);
    else
        snprintf(buf, n, "length (the context is full: %d tokens; --ctx-size sets it)", max_ctx);
    return buf;
}

void cli_unknown_argument(const char *cmd, const char *arg)
{
    char hint[256];
    if (arg[0] == '-' && arg[1] && cli_foreign_option_hint(arg, hint, sizeof hint))
        fprintf(stderr, "lily %s: unknown option '%s' (%s)\n\n", cmd, arg, hint);
    else if (arg[0] == '-' && arg[1])
        fprintf(stderr, "lily %s: unknown option '%s'\n\n", cmd, arg);
    else if (!strcmp(cmd, "run"))
        fprintf(stderr, "lily run: unexpected argument '%s' (the prompt goes after -p: lily run -p \"%s\")\n\n", arg,
                arg);
    else
        fprintf(stderr, "lily %s: unexpected argument '%s' (every value follows its option, e.g. -m DIR)\n\n", cmd,
                arg);
}
