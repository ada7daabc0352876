/* cmd_bench.c — `lily bench`. Not implemented yet. */
#include <stdio.h>

#include "commands.h"

int cmd_bench(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "lily bench: not implemented yet\n");
    return 1;
}
