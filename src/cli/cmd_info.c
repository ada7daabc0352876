/* cmd_info.c — `lily info`. Not implemented yet. */
#include <stdio.h>

#include "commands.h"

int cmd_info(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "lily info: not implemented yet\n");
    return 1;
}
