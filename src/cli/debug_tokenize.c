/* debug_tokenize.c — `lily debug tokenize`. Not implemented yet. */
#include <stdio.h>

#include "commands.h"

int debug_tokenize(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "lily debug tokenize: not implemented yet\n");
    return 1;
}
