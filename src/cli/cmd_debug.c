/* cmd_debug.c — `lily debug tokenize | render | parse`: the text pipeline, without weights. */
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
    fprintf(stderr, "usage: lily debug tokenize|render|parse --model DIR [options]\n");
    return 2;
}
