/* debug_render.c — `lily debug render`. Not implemented yet. */
#include <stdio.h>

#include "commands.h"

int debug_render(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "lily debug render: not implemented yet\n");
    return 1;
}
