/* cmd_serve.c — `lily serve`. Not implemented yet. */
#include <stdio.h>

#include "commands.h"

int cmd_serve(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "lily serve: not implemented yet\n");
    return 1;
}
