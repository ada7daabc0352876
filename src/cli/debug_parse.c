/* debug_parse.c — `lily debug parse`: raw model output on stdin -> the OpenAI choice JSON on stdout.
 *
 * Shows what the output parser (text/output_parser.h) makes of a generation: content, reasoning_content,
 * tool_calls (arguments as a JSON string) and finish_reason. Needs no weights.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_load.h"
#include "cli_common.h"
#include "commands.h"
#include "text/output_parser.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: lily debug parse [--model DIR] [--thinking] [--tools FILE] [--length]\n"
               "\n"
               "Reads raw model output on stdin and prints the OpenAI choice JSON\n"
               "(message.content, message.reasoning_content, message.tool_calls, finish_reason).\n"
               "\n"
               "  --model DIR   accepted for symmetry with the other debug commands (not read)\n"
               "  --thinking    the prompt opened a think block (ended with \"<think>\\n\")\n"
               "  --tools FILE  OpenAI tools (a JSON array, or a request object with \"tools\") for\n"
               "                converting parameter values by their schema types\n"
               "  --length      the text was cut by max tokens (finish_reason \"length\")\n");
}

static char *read_stdin(size_t *len)
{
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    if (!buf)
        return NULL;
    for (;;) {
        if (n == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) {
                free(buf);
                return NULL;
            }
            buf = b;
        }
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(stdin)) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

int debug_parse(int argc, char **argv)
{
    bool thinking = false, length = false;
    const char *tools_path = NULL;
    static const cli_value_option vopts[] = {{"--model", "-m"}, {"--tools", NULL}};
    for (int i = 1; i < argc; i++) {
        const char *name, *value;
        int r = cli_match_option("debug parse", argc, argv, &i, vopts, 2, &name, &value);
        if (r < 0)
            return 2;
        if (r > 0) {
            if (!strcmp(name, "--tools"))
                tools_path = value; /* --model is not needed: parsing uses no model files */
        } else if (!strcmp(argv[i], "--thinking")) {
            thinking = true;
        } else if (!strcmp(argv[i], "--length")) {
            length = true;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "lily debug parse: unknown or incomplete option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }

    json_t *tools = NULL;
    if (tools_path) {
        json_error_t jerr;
        json_t *j = lily_json_load_file(tools_path, 0, 0, &jerr); /* lily serve's loader, as its tools */
        if (!j) {
            if (jerr.line > 0) /* a JSON error has a line; a file that cannot be read has none (the text names it) */
                fprintf(stderr, "lily debug parse: %s:%d: %s\n", tools_path, jerr.line, jerr.text);
            else
                fprintf(stderr, "lily debug parse: --tools: %s\n", jerr.text);
            return 1;
        }
        tools = json_is_object(j) ? json_incref(json_object_get(j, "tools")) : json_incref(j);
        json_decref(j);
        if (!json_is_array(tools)) {
            fprintf(stderr, "lily debug parse: %s: expected a tools array or an object with \"tools\"\n",
                    tools_path);
            json_decref(tools);
            return 1;
        }
    }

    size_t len = 0;
    char *text = read_stdin(&len);
    if (!text) {
        fprintf(stderr, "lily debug parse: cannot read stdin\n");
        json_decref(tools);
        return 1;
    }

    lily_output_parser_options opts = {.thinking = thinking, .tools = tools};
    lily_output_parser *p = NULL;
    lily_error err = {0};
    int rc = 1;
    json_t *choice = NULL;
    if (lily_output_parser_new(&opts, &p, &err) != LILY_OK || lily_output_parser_feed(p, text, len, &err) != LILY_OK ||
        lily_output_parser_finish(p, length, &err) != LILY_OK) {
        fprintf(stderr, "lily debug parse: %s\n", err.message);
        goto done;
    }
    choice = lily_output_choice_json(lily_output_parser_result(p), "call_");
    if (!choice || json_dumpf(choice, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0) {
        fprintf(stderr, "lily debug parse: cannot write the result\n");
        goto done;
    }
    fputc('\n', stdout);
    rc = 0;
done:
    json_decref(choice);
    lily_output_parser_free(p);
    json_decref(tools);
    free(text);
    return rc;
}
