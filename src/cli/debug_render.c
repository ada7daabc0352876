/* debug_render.c — `lily debug render --model DIR --request FILE`: print the exact prompt for a request.
 *
 * The request is an OpenAI chat-completions JSON (messages, tools, chat_template_kwargs,
 * add_generation_prompt; a system message after the first joins the system block, as in lily serve); FILE
 * "-" reads stdin. stdout gets the prompt and nothing else (no newline is added); warnings (a model
 * template that is not the known Qwen3.6 one) go to stderr. Needs no weights.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_load.h"
#include "cli_common.h"
#include "commands.h"
#include "text/chat_template.h"

static int usage(FILE *f)
{
    fprintf(f,
            "usage: lily debug render --model DIR --request FILE\n"
            "  Prints the prompt the Qwen3.6 chat template renders for an OpenAI chat request (FILE may be -\n"
            "  for stdin): messages, tools, chat_template_kwargs {enable_thinking, preserve_thinking},\n"
            "  add_generation_prompt (default true). As lily serve, a system or developer message after the\n"
            "  first joins the system block. Options:\n"
            "  -m, --model DIR      model directory (only its chat template is read, to warn if it differs)\n"
            "  -r, --request FILE   the request JSON\n"
            "      --no-think       render with enable_thinking false\n"
            "      --no-generation-prompt   render without the assistant turn opener\n");
    return 2;
}

int debug_render(int argc, char **argv)
{
    const char *model_dir = NULL, *request_path = NULL;
    lily_chat_options opts;
    lily_chat_options_init(&opts);
    opts.fold_system = 1; /* as lily serve */
    static const cli_value_option vopts[] = {{"--model", "-m"}, {"--request", "-r"}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *name, *value;
        int r = cli_match_option("debug render", argc, argv, &i, vopts, 2, &name, &value);
        if (r < 0)
            return 2;
        if (r > 0 && !strcmp(name, "--model"))
            model_dir = value;
        else if (r > 0)
            request_path = value;
        else if (!strcmp(a, "--no-think"))
            opts.enable_thinking = 0;
        else if (!strcmp(a, "--no-generation-prompt"))
            opts.add_generation_prompt = 0;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "lily debug render: unknown or incomplete option '%s'\n", a);
            return usage(stderr);
        }
    }
    if (!request_path) {
        fprintf(stderr, "lily debug render: --request FILE is required\n");
        return usage(stderr);
    }

    lily_error err = {0};
    if (model_dir) {
        lily_chat_template_match match;
        char sha[65];
        if (lily_chat_template_check(model_dir, &match, sha, &err) != LILY_OK) {
            fprintf(stderr, "lily debug render: %s\n", err.message);
            return 1;
        }
        if (match == LILY_CHAT_TEMPLATE_DIFFERENT)
            fprintf(stderr,
                    "lily: warning: %s has a chat template that differs from the known Qwen3.6 template "
                    "(sha256 %.12s..., expected %.12s...); lily renders its built-in Qwen3.6 template anyway\n",
                    model_dir, sha, LILY_CHAT_TEMPLATE_KNOWN_SHA256);
        else if (match == LILY_CHAT_TEMPLATE_MISSING)
            fprintf(stderr, "lily: warning: %s has no chat template; lily renders its built-in Qwen3.6 template\n",
                    model_dir);
    }

    /* lily serve's loader (base/json_load.h): a request serve takes (an integer past int64 in a tool call's
     * arguments) renders here too */
    json_error_t jerr;
    json_t *request = NULL;
    if (!strcmp(request_path, "-")) {
        size_t len;
        char *text = cli_read_all(stdin, &len);
        if (!text) {
            fprintf(stderr, "lily debug render: cannot read stdin: %s\n", strerror(errno));
            return 1;
        }
        request = lily_json_loadb(text, len, 0, &jerr);
        free(text);
    } else {
        request = lily_json_load_file(request_path, 0, 0, &jerr);
    }
    if (!request && jerr.line < 1) { /* not a parse error: the file itself (the text names it) */
        fprintf(stderr, "lily debug render: %s\n", jerr.text);
        return 1;
    }
    if (!request) {
        fprintf(stderr, "lily debug render: %s: line %d column %d: %s\n", request_path, jerr.line, jerr.column,
                jerr.text);
        return 1;
    }
    char *prompt = NULL;
    lily_status status = lily_chat_render(request, &opts, &prompt, &err);
    json_decref(request);
    if (status != LILY_OK) {
        fprintf(stderr, "lily debug render: %s: %s\n", request_path, err.message);
        return 1;
    }
    fwrite(prompt, 1, strlen(prompt), stdout);
    free(prompt);
    return fflush(stdout) == 0 ? 0 : 1;
}
