/* commands.h — one entry point per `lily` subcommand; each lives in its own cmd_<name>.c.
 *
 * A command returns the process exit status (0 success, 1 runtime error, 2 usage error) and prints
 * its own errors to stderr. argv[0] is the command name.
 */
#ifndef LILY_CLI_COMMANDS_H
#define LILY_CLI_COMMANDS_H

int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_debug(int argc, char **argv); /* debug tokenize | render | parse */
int debug_tokenize(int argc, char **argv); /* debug_tokenize.c */
int debug_render(int argc, char **argv);   /* debug_render.c */
int debug_parse(int argc, char **argv);    /* debug_parse.c */

#endif
