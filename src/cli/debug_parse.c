/* debug_parse.c — `lily debug parse`. Not implemented yet. */
#include <stdio.h>

#include "commands.h"

int debug_parse(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "lily debug parse: not implemented yet\n");
    return 1;
}
