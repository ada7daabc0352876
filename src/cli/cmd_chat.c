/* cmd_chat.c — `lily chat`. Not implemented yet. */
#include <stdio.h>

#include "commands.h"

int cmd_chat(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "lily chat: not implemented yet\n");
    return 1;
}
