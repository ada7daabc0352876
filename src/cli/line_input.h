/* line_input.h — reading one chat message from the user: line editing and history on a terminal (libedit,
 * when the build found it), plain lines otherwise, and multi-line messages either way.
 *
 * A message is one line, or several joined with newlines when a line ends with a backslash (the backslash
 * is dropped and the next line continues the message) or when a line that is exactly three double quotes
 * opens a block that runs to the next such line. On a terminal each finished message enters the history
 * (up / down arrows recall it); continuation lines are prompted with "... ". */
#ifndef LILY_CLI_LINE_INPUT_H
#define LILY_CLI_LINE_INPUT_H

#include <stdbool.h>
#include <stddef.h>

/* One message without its final line ending, malloc'd and NUL-terminated, its length in bytes in *len (more
 * than strlen when the input held a NUL byte: the caller refuses such a message); NULL at end of input (or
 * out of memory). prompt is printed before the first line when interactive (stdin is a terminal). A block
 * still open at end of input is returned as far as it got. */
char *line_input_read(const char *prompt, bool interactive, size_t *len);

/* Whether this build edits lines with libedit ("libedit") or reads them plainly ("plain"). */
const char *line_input_backend(void);

#endif
