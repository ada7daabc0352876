/* cmd_debug.c — `lily debug`. Not implemented yet. */
#include <stdio.h>

#include "commands.h"

int cmd_debug(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "lily debug: not implemented yet\n");
    return 1;
}
