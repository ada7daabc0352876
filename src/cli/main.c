/* main.c — `lily <command> [options]`: dispatch to the subcommands (commands.h). */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "lily.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"run", cmd_run, "generate a reply to one prompt, streamed to stdout"},
    {"chat", cmd_chat, "multi-turn chat in the terminal"},
    {"serve", cmd_serve, "OpenAI- and Anthropic-compatible HTTP server"},
    {"bench", cmd_bench, "prefill and decode speed over prompt lengths and context depths"},
    {"perplexity", cmd_perplexity, "teacher-forced perplexity of a text"},
    {"eval", cmd_eval, "logits for given token ids, optionally compared with a reference"},
    {"info", cmd_info, "config, layout, quantization and tensor summary of a model"},
    {"debug", cmd_debug, "tokenize | render | parse: the text pipeline without weights"},
};

/* Output lost (a full disk, a closed pipe) is a failure, not a silent success: rc, else 1 after saying so. */
static int flushed(const char *command, int rc)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "lily%s%s: error writing the output\n", command ? " " : "", command ? command : "");
        return rc ? rc : 1;
    }
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "lily %s — local inference for Qwen3.5/3.6 hybrid MoE models\n\nusage: lily <command> [options]\n\n",
            LILY_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n`lily <command> --help` (or `lily help <command>`) lists a command's options; `lily --version`.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "help") && argc > 2) { /* "lily help run" = "lily run --help", as git and ollama */
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
            if (!strcmp(argv[2], commands[i].name)) {
                char *help_argv[] = {argv[2], "--help", NULL};
                return flushed(argv[2], commands[i].run(2, help_argv));
            }
        fprintf(stderr, "lily: unknown command '%s'\n\n", argv[2]);
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return flushed(NULL, 0);
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V") || !strcmp(argv[1], "version")) {
        printf("lily %s\n", LILY_VERSION);
        return flushed(NULL, 0);
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return flushed(argv[1], commands[i].run(argc - 1, argv + 1));
    fprintf(stderr, "lily: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
