/* cmd_debug.c — `lily debug tokenize | render | parse`: the text pipeline, without weights. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"

int cmd_debug(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "tokenize"))
        return debug_tokenize(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "render"))
        return debug_render(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "parse"))
        return debug_parse(argc - 1, argv + 1);
    const bool help = argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"));
    if (argc >= 2 && !help)
        fprintf(stderr, "lily debug: unknown subcommand '%s'\n", argv[1]);
    FILE *f = help ? stdout : stderr;
    fprintf(f, "usage: lily debug tokenize|render|parse --model DIR [options]\n\n"
               "  tokenize  the token ids of the text on stdin\n"
               "  render    the prompt the chat template renders for an OpenAI chat request\n"
               "  parse     the OpenAI message parsed from raw model output on stdin\n\n"
               "`lily debug <subcommand> --help` lists its options.\n");
    return help ? 0 : 2;
}
