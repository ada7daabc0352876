/* cmd_run.c — `lily run`. Not implemented yet. */
#include <stdio.h>

#include "commands.h"

int cmd_run(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "lily run: not implemented yet\n");
    return 1;
}
