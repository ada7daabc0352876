/* cmd_eval.c — `lily eval`. Not implemented yet. */
#include <stdio.h>

#include "commands.h"

int cmd_eval(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "lily eval: not implemented yet\n");
    return 1;
}
