/* cmd_run.c — `lily run`: one prompt in, the reply streamed to stdout, speed on stderr.
 *
 *   lily run [-m DIR] (-p PROMPT | -p - | -f FILE) [-n N] [--temp T] [--top-p P] [--top-k K] [--min-p P] [--seed S]
 *            [--no-think] [--raw] [--hide-reasoning] [--system TEXT] [--ctx-size N]
 *            [--backend cpu|cuda] [--precision fast|exact] [--threads N] [--prefill-chunk N] [--show-ids]
 *            [--host-sampler] [--verbose]
 *
 * The prompt is rendered as one user message (after an optional system message) with the chat
 * template, thinking on unless --no-think; --raw encodes the prompt text as it is (special tokens
 * written in it recognized) and prints the continuation verbatim. Generation stops at the model's stop
 * ids (config.json, generation_config.json, the tokenizer's <|im_end|> / <|endoftext|>), -n tokens (by
 * default generation_config.json's max_new_tokens when it has one), a full context, or Ctrl-C (exit
 * status 130 then). `-p -` reads the prompt from stdin, `-f FILE` from a file (one trailing newline dropped
 * unless --raw). stderr gets the token counts and prefill / decode tok/s
 * at the end.
 */
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "commands.h"
#include "text/chat_template.h"

static atomic_int run_cancel;

static void on_sigint(int sig)
{
    (void)sig;
    atomic_store(&run_cancel, 1);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: lily run [-m DIR] (-p PROMPT | -p - | -f FILE) [options]\n\n"
               "Generates a reply to one prompt and streams it to stdout; speed goes to stderr. The reasoning\n"
               "is printed dimmed on a terminal and between <think> and </think> lines otherwise\n"
               "(--hide-reasoning drops it). Without -n a reply stops at the model's max_new_tokens\n"
               "(generation_config.json) when it sets one, else at a stop token or the full context.\n"
               "Ctrl-C stops the reply (the speed line still printed) and exits with status 130.\n"
               "  -p, --prompt TEXT      the user's message (with --raw: the whole prompt text); - reads stdin\n"
               "  -f, --file FILE        read the prompt from FILE (one trailing newline dropped unless --raw)\n"
               "      --raw              no chat template: encode the prompt as is, print the continuation verbatim\n"
               "      --show-ids         print the prompt's and the reply's token ids on stderr\n");
    cli_gen_options_usage(f);
}

typedef struct {
    cli_printer printer;
    int32_t *ids;
    int n, cap;
} run_stream;

static int on_token(void *user, int32_t token, const char *text, size_t len)
{
    run_stream *rs = user;
    if (token >= 0) {
        if (rs->n == rs->cap) {
            int cap = rs->cap ? 2 * rs->cap : 256;
            int32_t *grown = realloc(rs->ids, sizeof(int32_t) * (size_t)cap);
            if (!grown)
                return 1;
            rs->ids = grown;
            rs->cap = cap;
        }
        rs->ids[rs->n++] = token;
    }
    return cli_printer_on_token(&rs->printer, token, text, len);
}

static void print_ids(const char *label, const int32_t *ids, int n)
{
    fprintf(stderr, "%s:", label);
    for (int i = 0; i < n; i++)
        fprintf(stderr, " %d", (int)ids[i]);
    fputc('\n', stderr);
}

/* The chat prompt for one user message. Returns NULL after printing an error. */
static char *render_prompt(const cli_gen_options *o, const char *prompt)
{
    json_t *messages = json_array();
    if (o->system)
        json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "system", "content", o->system));
    json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "user", "content", prompt));
    lily_chat_options co;
    lily_chat_options_init(&co);
    co.enable_thinking = o->no_think ? 0 : 1;
    co.add_generation_prompt = 1;
    char *text = NULL;
    lily_error err = {0};
    if (json_array_size(messages) != (o->system ? 2u : 1u))
        lily_error_set(&err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
    else
        lily_chat_render(messages, &co, &text, &err);
    json_decref(messages);
    if (!text)
        fprintf(stderr, "lily run: %s\n", err.message);
    return text;
}

static int run_prompt(cli_gen_options *po, const char *prompt, bool raw, bool show_ids);

int cmd_run(int argc, char **argv)
{
    cli_gen_options o;
    cli_gen_options_init(&o);
    const char *prompt = NULL, *prompt_file = NULL;
    char *prompt_owned = NULL;
    bool raw = false, show_ids = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--raw")) {
            raw = true;
            continue;
        }
        if (!strcmp(a, "--show-ids")) {
            show_ids = true;
            continue;
        }
        if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "lily run: %s needs a value\n", a);
                return 2;
            }
            prompt = argv[++i];
            continue;
        }
        if (!strncmp(a, "--prompt=", 9)) {
            prompt = a + 9;
            continue;
        }
        if (!strncmp(a, "--file=", 7)) {
            prompt_file = a + 7;
            continue;
        }
        if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "lily run: %s needs a value\n", a);
                return 2;
            }
            prompt_file = argv[++i];
            continue;
        }
        int r = cli_gen_option("run", argc, argv, &i, &o);
        if (r < 0)
            return 2;
        if (r == 0) {
            cli_unknown_argument("run", a);
            usage(stderr);
            return 2;
        }
    }
    if (prompt && prompt_file) {
        fprintf(stderr, "lily run: give the prompt once: -p or -f, not both\n\n");
        usage(stderr);
        return 2;
    }
    if (!prompt && !prompt_file) {
        fprintf(stderr, "lily run: -p PROMPT (or -p - for stdin, or -f FILE) is required\n\n");
        usage(stderr);
        return 2;
    }
    if (raw && (o.system || o.no_think || o.hide_reasoning)) { /* the chat template's options: nothing to act on */
        fprintf(stderr, "lily run: %s has no effect with --raw (no chat template: the prompt is encoded as is and "
                        "the continuation printed verbatim)\n",
                o.system ? "--system" : o.no_think ? "--no-think" : "--hide-reasoning");
        return 2;
    }
    if (prompt && !strcmp(prompt, "-"))
        prompt_file = "-";
    if (prompt_file) {
        if (!(prompt_owned = cli_read_prompt("run", prompt_file)))
            return 1;
        size_t pl = strlen(prompt_owned);
        if (!raw && pl > 0 && prompt_owned[pl - 1] == '\n')
            prompt_owned[--pl] = 0;
        if (pl == 0) { /* nothing was piped or the file is empty: most likely a mistake, never a prompt */
            fprintf(stderr, "lily run: the prompt from %s is empty\n", strcmp(prompt_file, "-") ? prompt_file : "stdin");
            free(prompt_owned);
            return 1;
        }
        prompt = prompt_owned;
    }
    if (!*prompt) { /* as an empty stdin or file: an unset shell variable, most likely, never a prompt */
        fprintf(stderr, "lily run: the prompt is empty (-p \"\")\n");
        return 1;
    }
    if (!raw && !prompt[strspn(prompt, " \t\n\r\v\f")]) { /* the template trims it: the empty message above */
        fprintf(stderr, "lily run: the prompt is empty (only whitespace, which the chat template trims)\n");
        free(prompt_owned);
        return 1;
    }
    int rc = run_prompt(&o, prompt, raw, show_ids);
    free(prompt_owned);
    return rc;
}

static int run_prompt(cli_gen_options *po, const char *prompt, bool raw, bool show_ids)
{
    cli_gen_options o = *po;
    if (cli_check_utf8("run", "the prompt", prompt))
        return 2;

    cli_model m;
    if (cli_model_open("run", &o, raw, &m))
        return 1;
    int rc = 1;
    char *text = NULL;
    int32_t *ids = NULL;
    int n_ids = 0;
    lily_session *s = NULL;
    lily_detokenizer detok;
    lily_detokenizer_init(&detok, m.tok, false);
    run_stream rs = {0};
    lily_error err = {0};

    text = raw ? strdup(prompt) : render_prompt(&o, prompt);
    if (!text) {
        if (raw)
            fprintf(stderr, "lily run: out of memory\n");
        goto done;
    }
    if (cli_encode("run", &m, text, &ids, &n_ids))
        goto done;
    if (n_ids == 0) {
        fprintf(stderr, "lily run: the prompt is empty\n");
        goto done;
    }
    if (lily_session_new(m.engine, o.ctx_size, &s, &err) != LILY_OK) {
        fprintf(stderr, "lily run: %s\n", err.message);
        goto done;
    }
    if (n_ids >= s->max_ctx) { /* as lily serve's 400: a prompt that fills the context leaves no room for a reply */
        fprintf(stderr, "lily run: prompt is %d tokens, context is %d%s (raise --ctx-size or shorten the prompt)\n",
                n_ids, s->max_ctx, n_ids == s->max_ctx ? ": no room for the reply" : "");
        goto done;
    }
    if (show_ids)
        print_ids("prompt ids", ids, n_ids);
    const size_t tl = strlen(text);
    const bool thinking = !raw && tl >= 8 && !strcmp(text + tl - 8, "<think>\n");
    if (cli_printer_init(&rs.printer, stdout, raw, thinking, o.hide_reasoning))
        goto done;

    lily_generate_params gp = lily_generate_defaults();
    gp.sampling = o.sampling;
    gp.max_tokens = o.max_tokens;
    gp.stop_ids = m.stop_ids;
    gp.n_stop_ids = m.n_stop_ids;
    gp.detok = lily_detok_for_tokenizer(&detok);
    gp.on_token = on_token;
    gp.user = &rs;
    gp.cancel = &run_cancel;
    gp.decode = o.host_sampler ? LILY_DECODE_HOST : LILY_DECODE_AUTO;
    struct sigaction sa = {0}, old_sa;
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_sa);
    lily_generate_result res;
    lily_status st = lily_generate(s, ids, n_ids, &gp, &res, &err);
    sigaction(SIGINT, &old_sa, NULL);
    if (st != LILY_OK) {
        cli_printer_finish(&rs.printer, false);
        fprintf(stderr, "lily run: %s\n", err.message);
        goto done;
    }
    if (cli_printer_finish(&rs.printer, res.finish == LILY_FINISH_LENGTH))
        goto done;
    if (show_ids)
        print_ids("generated ids", rs.ids, rs.n);
    char finish[160];
    cli_print_speed("", res.n_prompt, res.prefill_seconds, res.n_generated, res.n_decode_steps, res.decode_seconds,
                    cli_finish_text(&res, &o, s->max_ctx, finish, sizeof finish));
    if (o.verbose)
        cli_print_decode_path("", &res);
    /* stopped by Ctrl-C: 128 + SIGINT, as shells report a program the signal ended */
    rc = res.finish == LILY_FINISH_CANCELLED && atomic_load(&run_cancel) ? 128 + SIGINT : 0;
done:
    cli_printer_free(&rs.printer);
    free(rs.ids);
    lily_detokenizer_free(&detok);
    lily_session_free(s);
    free(ids);
    free(text);
    cli_model_close(&m);
    return rc;
}
