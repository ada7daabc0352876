/* cmd_chat.c — `lily chat`: a multi-turn conversation in the terminal that reuses the session state.
 *
 *   lily chat [-m DIR] [sampling / engine options as `lily run`]
 *
 * The conversation is kept as OpenAI messages. Each turn renders the whole conversation with the chat
 * template (preserve_thinking, so earlier reasoning stays in the history), encodes it, and compares the
 * ids with the session's: when the session holds exactly a prefix of them, only the rest is prefilled.
 * Otherwise (the reply's text re-encodes to other ids than the model generated, so the session and the
 * rendering part ways inside the last reply) the prefix cache (runtime/prefix_cache.h) restores its
 * deepest checkpoint that is a prefix: the end of the last prompt's prefill, of an earlier turn, or a
 * --checkpoint-every position; as a last resort everything is prefilled.
 * stderr gets, per turn, the prompt's tokens reused (from the live session, a checkpoint, or none) /
 * prefilled and the prefill and decode speed.
 *
 * Commands: /reset (forget the conversation), /think on|off, /save FILE (the conversation as OpenAI
 * messages JSON), /quit (or end of input), /help. Ctrl-C during a reply stops the reply (what was
 * generated stays in the history); Ctrl-C at the prompt exits. Messages are read by line_input.h: line
 * editing and history on a terminal (libedit), multi-line messages with a trailing backslash or a
 * triple-quote block.
 */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_common.h"
#include "commands.h"
#include "line_input.h"
#include "base/clock.h"
#include "base/memory_limit.h"
#include "runtime/prefix_cache.h"
#include "text/chat_template.h"

static atomic_int chat_cancel;
static volatile sig_atomic_t chat_generating;

/* Ctrl-C: during a reply (prefill included) it sets the cancel flag; anywhere else it exits at once
 * (exiting from the handler has no window in which a signal could be lost before a blocking read). */
static void on_sigint(int sig)
{
    (void)sig;
    if (chat_generating) {
        atomic_store(&chat_cancel, 1);
        return;
    }
    if (write(STDOUT_FILENO, "\n", 1) < 0) {
        /* nothing to do: exiting anyway */
    }
    _exit(0);
}

static void install_sigint(void)
{
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: lily chat [-m DIR] [options]\n\n"
               "A multi-turn chat. Each turn prefills only the tokens the session does not hold yet.\n"
               "Commands: /reset  /think on|off  /save FILE  /quit (or Ctrl-D)  /help; //text sends \"/text\"\n"
               "Arrow keys edit the line and recall earlier messages; a line ending in \\ continues the\n"
               "message on the next line, and a line of three double quotes opens a block that runs to the\n"
               "next such line.\n"
               "Ctrl-C stops a reply in progress; at the prompt it exits.\n\n"
               "  --cache-ram MIB        host memory for checkpoints of the session state (default: 4\n"
               "                         full-context states of the model, at least 64 and at most 4096, and\n"
               "                         at most a quarter of the memory lily may use: the machine's, or a\n"
               "                         container's cgroup limit; more than that memory is a usage error)\n"
               "  --cache-vram MIB       GPU memory for checkpoints (default 2048 with --backend cuda, else 0)\n"
               "  --checkpoint-every N   also checkpoint every N tokens of a long prefill (default 4096;\n"
               "                         0 = never)\n");
    cli_gen_options_usage(f);
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb)
{
    int n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

typedef struct {
    const char *cmd;
    cli_gen_options *o;
    cli_model *m;
    lily_session *s;
    lily_prefix_cache *cache;    /* checkpoints of the session by token prefix */
    int32_t im_start_id, im_end_id, think_id; /* token ids for the cache's chat marks */
    json_t *messages;
    bool think;
    int turn;
} chat_state;

static int chat_cancelled(void *user)
{
    (void)user;
    return atomic_load(&chat_cancel);
}

static void reset_conversation(chat_state *c)
{
    json_array_clear(c->messages);
    if (c->o->system)
        json_array_append_new(c->messages, json_pack("{s:s, s:s}", "role", "system", "content", c->o->system));
    lily_session_reset(c->s);
    lily_prefix_cache_clear(c->cache);
}

/* path with a leading "~" or "~/" as the home directory ($HOME), as a shell writes it: the chat line is not
 * a shell's, and "/save ~/chat.json" failed with "No such file or directory". Else path itself. */
static const char *home_path(const char *path, char *buf, size_t cap)
{
    const char *home = getenv("HOME");
    if (path[0] != '~' || (path[1] && path[1] != '/') || !home || !*home)
        return path;
    snprintf(buf, cap, "%s%s", home, path + 1);
    return buf;
}

/* Write the conversation (OpenAI messages, indented JSON) to path. NULL on success, else why it failed
 * (strerror of the failing open, write or close). */
static const char *save_conversation(const json_t *messages, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return strerror(errno);
    errno = 0;
    int failed = json_dumpf(messages, f, JSON_INDENT(2)) != 0 || fputc('\n', f) == EOF || ferror(f);
    int saved = errno;
    if (fclose(f) != 0 && !failed) {
        failed = 1;
        saved = errno;
    }
    return failed ? strerror(saved ? saved : EIO) : NULL;
}

/* The assistant message for the parsed reply (content, reasoning_content, tool_calls). */
static json_t *assistant_message(const lily_parsed_output *r)
{
    json_t *msg = json_pack("{s:s, s:s%}", "role", "assistant", "content", r->content, r->content_len);
    if (!msg)
        return NULL;
    if (r->reasoning_len > 0)
        json_object_set_new(msg, "reasoning_content", json_stringn(r->reasoning, r->reasoning_len));
    if (r->n_tool_calls > 0) {
        json_t *calls = json_array();
        for (int i = 0; i < r->n_tool_calls; i++)
            json_array_append_new(calls, json_pack("{s:s, s:{s:s, s:s}}", "type", "function", "function", "name",
                                                   r->tool_calls[i].name, "arguments", r->tool_calls[i].arguments));
        json_object_set_new(msg, "tool_calls", calls);
    }
    return msg;
}

/* One user turn. Returns 0 (including errors the REPL survives, which are printed) or 1 (fatal). */
static int chat_turn(chat_state *c, const char *line)
{
    const char *cmd = c->cmd;
    if (cli_check_utf8(cmd, "the message", line))
        return 0; /* the REPL goes on; nothing was sent */
    lily_session *s = c->s;
    lily_error err = {0};
    int rc = 0;
    char *prompt = NULL;
    int32_t *ids = NULL;
    int n = 0;
    lily_detokenizer detok;
    lily_detokenizer_init(&detok, c->m->tok, false);
    cli_printer printer = {0};

    json_t *user = json_pack("{s:s, s:s}", "role", "user", "content", line);
    if (!user || json_array_append_new(c->messages, user) != 0) {
        fprintf(stderr, "lily %s: out of memory\n", cmd);
        return 1;
    }
    lily_chat_options co;
    lily_chat_options_init(&co);
    co.enable_thinking = c->think ? 1 : 0;
    co.preserve_thinking = 1;
    co.add_generation_prompt = 1;
    if (lily_chat_render(c->messages, &co, &prompt, &err) != LILY_OK) {
        fprintf(stderr, "lily %s: %s\n", cmd, err.message);
        goto drop_user;
    }
    if (cli_encode(cmd, c->m, prompt, &ids, &n))
        goto drop_user;
    if (n >= s->max_ctx) { /* as lily run: a prompt that fills the context leaves no room for a reply */
        fprintf(stderr, "lily %s: prompt is %d tokens, context is %d%s (/reset to start over, or raise --ctx-size)\n",
                cmd, n, s->max_ctx, n == s->max_ctx ? ": no room for the reply" : "");
        goto drop_user;
    }

    /* Reuse what the session, or the deepest checkpoint, holds of this prompt. */
    const int live = s->n_tokens > 0 && s->n_tokens <= n && common_prefix(s->tokens, s->n_tokens, ids, n) == s->n_tokens
                         ? s->n_tokens : 0;
    int reuse = 0, marks[2];
    const int n_marks = lily_prefix_cache_chat_marks(ids, n, c->im_start_id, c->im_end_id, c->think_id, marks);
    atomic_store(&chat_cancel, 0);
    chat_generating = 1;
    const double t0 = lily_wall_seconds();
    if (lily_prefix_cache_prefill(c->cache, s, ids, n, marks, n_marks, chat_cancelled, NULL, &reuse, &err) != LILY_OK) {
        chat_generating = 0;
        fprintf(stderr, "lily %s: %s\n", cmd, err.message);
        lily_session_reset(s);
        goto drop_user;
    }
    const double prefill_s = lily_wall_seconds() - t0;
    const char *how = reuse == 0 ? "none" : reuse == live ? "session" : "checkpoint";

    const size_t pl = strlen(prompt);
    const bool thinking = pl >= 8 && !strcmp(prompt + pl - 8, "<think>\n");
    if (cli_printer_init(&printer, stdout, false, thinking, c->o->hide_reasoning)) {
        rc = 1;
        goto done;
    }
    lily_generate_params gp = lily_generate_defaults();
    gp.sampling = c->o->sampling;
    gp.sampling.seed = c->o->sampling.seed + (uint64_t)c->turn;
    gp.max_tokens = c->o->max_tokens;
    gp.stop_ids = c->m->stop_ids;
    gp.n_stop_ids = c->m->n_stop_ids;
    gp.detok = lily_detok_for_tokenizer(&detok);
    gp.on_token = cli_printer_on_token;
    gp.user = &printer;
    gp.cancel = &chat_cancel;
    gp.decode = c->o->host_sampler ? LILY_DECODE_HOST : LILY_DECODE_AUTO;
    lily_generate_result res;
    lily_status st = lily_generate(s, NULL, 0, &gp, &res, &err);
    chat_generating = 0;
    cli_printer_finish(&printer, st == LILY_OK && res.finish == LILY_FINISH_LENGTH);
    if (st != LILY_OK) {
        fprintf(stderr, "lily %s: %s\n", cmd, err.message);
        lily_session_reset(s);
        goto drop_user;
    }
    if (lily_prefix_cache_checkpoint(c->cache, s, &err) != LILY_OK) /* the end of the reply */
        fprintf(stderr, "lily %s: warning: no checkpoint after the reply (%s)\n", cmd, err.message);
    if (res.finish == LILY_FINISH_CANCELLED)
        fprintf(stderr, "[reply stopped]\n");
    json_t *reply = assistant_message(lily_output_parser_result(printer.parser));
    if (!reply || json_array_append_new(c->messages, reply) != 0) {
        fprintf(stderr, "lily %s: out of memory\n", cmd);
        rc = 1;
        goto done;
    }
    c->turn++;
    char finish[160];
    fprintf(stderr, "[turn %d: prompt %d tokens: %d reused (%s), %d prefilled at %.1f tok/s | reply %d tokens at "
                    "%.1f tok/s | %s]\n",
            c->turn, n, reuse, how, n - reuse, n > reuse && prefill_s > 0 ? (n - reuse) / prefill_s : 0.0,
            res.n_generated, res.decode_tokens_per_second,
            cli_finish_text(&res, c->o, c->s->max_ctx, finish, sizeof finish));
    if (c->o->verbose)
        cli_print_decode_path("", &res);
    goto done;
drop_user:
    json_array_remove(c->messages, json_array_size(c->messages) - 1);
done:
    chat_generating = 0;
    cli_printer_free(&printer);
    lily_detokenizer_free(&detok);
    free(ids);
    free(prompt);
    return rc;
}

int cmd_chat(int argc, char **argv)
{
    cli_gen_options o;
    cli_gen_options_init(&o);
    lily_prefix_cache_options cache_opts = {0};
    long cache_vram_mib = -1; /* -1: the backend's default */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        static const cli_value_option cache_opts_names[] = {
            {"--cache-ram", NULL}, {"--cache-vram", NULL}, {"--checkpoint-every", NULL}};
        const char *name, *value;
        int m = cli_match_option("chat", argc, argv, &i, cache_opts_names, 3, &name, &value);
        if (m < 0)
            return 2;
        if (m > 0) {
            if (!strcmp(name, "--cache-ram")) {
                if (cli_parse_cache_ram("chat", name, value, &cache_opts.ram_bytes))
                    return 2;
                continue;
            }
            long v;
            if (cli_parse_int("chat", name, value, 0, 1L << 24, &v))
                return 2;
            if (!strcmp(name, "--cache-vram"))
                cache_vram_mib = v;
            else
                cache_opts.checkpoint_every = v > 0 ? (int)v : -1;
            continue;
        }
        int r = cli_gen_option("chat", argc, argv, &i, &o);
        if (r < 0)
            return 2;
        if (r == 0) {
            cli_unknown_argument("chat", a);
            usage(stderr);
            return 2;
        }
    }
    if (cache_vram_mib < 0)
        cache_vram_mib = o.backend && !strcmp(o.backend, "cuda") ? LILY_PREFIX_CACHE_DEFAULT_VRAM_MIB : 0;
    cache_opts.device_bytes = (size_t)cache_vram_mib << 20;
    o.device_pool_bytes = cache_opts.device_bytes;
    cli_model m;
    if (cli_model_open("chat", &o, false, &m))
        return 1;
    chat_state c = {.cmd = "chat", .o = &o, .m = &m, .think = !o.no_think};
    lily_error err = {0};
    int rc = 1;
    c.messages = json_array();
    if (!c.messages) {
        fprintf(stderr, "lily chat: out of memory\n");
        goto done;
    }
    if (lily_session_new(m.engine, o.ctx_size, &c.s, &err) != LILY_OK ||
        lily_prefix_cache_new(&cache_opts, &c.cache, &err) != LILY_OK ||
        lily_prefix_cache_attach(c.cache, m.engine, &err) != LILY_OK) {
        fprintf(stderr, "lily chat: %s\n", err.message);
        goto done;
    }
    if (!cache_opts.ram_bytes) /* no --cache-ram: sized from the model, as lily serve does */
        lily_prefix_cache_set_ram_bytes(c.cache, lily_prefix_cache_default_ram_bytes(lily_prefix_cache_state_bytes(c.s),
                                                                                     lily_memory_limit_bytes()));
    lily_prefix_cache_stats cs;
    lily_prefix_cache_stats_get(c.cache, &cs);
    if (cache_opts.device_bytes && m.engine->backend.ops->device_pool_new && !cs.device_capacity_bytes)
        fprintf(stderr, "lily chat: warning: no room for a %zu MiB prefix-cache pool in GPU memory (--cache-vram); "
                        "checkpoints stay in host memory\n", cache_opts.device_bytes >> 20);
    c.im_start_id = lily_tokenizer_token_id(m.tok, "<|im_start|>");
    c.im_end_id = lily_tokenizer_token_id(m.tok, "<|im_end|>");
    c.think_id = lily_tokenizer_token_id(m.tok, "<think>");
    reset_conversation(&c);
    const bool interactive = isatty(fileno(stdin));
    if (interactive)
        fprintf(stderr, "lily chat: %s, context %d tokens, thinking %s. /help lists the commands; \"\"\" "
                        "starts a multi-line message.\n", m.model_dir, c.s->max_ctx, c.think ? "on" : "off");
    install_sigint();
    rc = 0;
    for (;;) {
        size_t len = 0;
        char *line = line_input_read("> ", interactive, &len);
        if (!line) {
            if (interactive)
                fputc('\n', stdout);
            break;
        }
        if (strlen(line) != len) { /* as lily run: cutting it at the NUL would send another message */
            fprintf(stderr, "lily chat: the message holds a NUL byte: not text (not sent)\n");
            free(line);
            continue;
        }
        if (!line[strspn(line, " \t\n\r\v\f")]) { /* blank: the template would trim it to an empty message */
            free(line);
            continue;
        }
        if (line[0] == '/' && line[1] == '/') { /* "//text" sends "/text" */
            memmove(line, line + 1, len);
        } else if (line[0] == '/') {
            bool quit = false;
            for (size_t n = strlen(line); n > 1 && strchr(" \t\r", line[n - 1]); n--)
                line[n - 1] = '\0'; /* "/quit " is /quit (it was an unknown command) */
            if (!strcmp(line, "/quit") || !strcmp(line, "/exit"))
                quit = true;
            else if (!strcmp(line, "/reset")) {
                reset_conversation(&c);
                fprintf(stderr, "[conversation cleared]\n");
            } else if (!strcmp(line, "/think on") || !strcmp(line, "/think off")) {
                c.think = !strcmp(line, "/think on");
                fprintf(stderr, "[thinking %s]\n", c.think ? "on" : "off");
            } else if (!strcmp(line, "/think")) {
                fprintf(stderr, "[thinking is %s; /think on|off]\n", c.think ? "on" : "off");
            } else if (!strncmp(line, "/think ", 7)) {
                fprintf(stderr, "/think takes on or off, not '%s'\n", line + 7);
            } else if (!strcmp(line, "/save") || !strcmp(line, "/save ")) {
                fprintf(stderr, "/save needs a file name: /save FILE\n");
            } else if (!strncmp(line, "/save ", 6)) {
                char home_buf[4096];
                const char *path = home_path(line + 6, home_buf, sizeof home_buf);
                const char *why = save_conversation(c.messages, path);
                if (!why)
                    fprintf(stderr, "[conversation saved to %s]\n", path);
                else
                    fprintf(stderr, "[cannot write %s: %s]\n", path, why);
            } else if (!strcmp(line, "/help")) {
                fprintf(stderr, "/reset  forget the conversation\n/think on|off  thinking for the next replies\n"
                                "/save FILE  write the conversation as OpenAI messages (JSON)\n"
                                "/quit  leave (or Ctrl-D)\nCtrl-C stops a reply in progress; at the prompt it exits.\n"
                                "A line ending in \\ continues the message; \"\"\" on a line opens and closes a "
                                "multi-line block; a message that starts with / is written //.\n");
            } else {
                fprintf(stderr, "unknown command %s (/help lists them; //%s sends a message that starts with /)\n",
                        line, line + 1);
            }
            free(line);
            if (quit)
                break;
            continue;
        }
        int fatal = chat_turn(&c, line);
        free(line);
        if (fatal) {
            rc = 1;
            break;
        }
    }
done:
    signal(SIGINT, SIG_DFL);
    lily_prefix_cache_free(c.cache);
    json_decref(c.messages);
    lily_session_free(c.s);
    cli_model_close(&m);
    return rc;
}
