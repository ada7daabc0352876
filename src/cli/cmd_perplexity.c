/* cmd_perplexity.c — `lily perplexity`. Not implemented yet. */
#include <stdio.h>

#include "commands.h"

int cmd_perplexity(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "lily perplexity: not implemented yet\n");
    return 1;
}
