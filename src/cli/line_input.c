/* line_input.c — see line_input.h. libedit's readline interface when LILY_HAVE_LIBEDIT, else fgets. */
#include "line_input.h"

#include <stdio.h>
#include <sys/types.h>
#include <stdlib.h>
#include <string.h>

#ifdef LILY_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

#define CONTINUATION_PROMPT "... "
#define BLOCK_FENCE "\"\"\""

/* One physical line without its line ending (malloc'd; *n its length: a NUL byte read stays in it, so
 * the caller can refuse it rather than cut the line there), NULL at end of input. */
static char *plain_line(size_t *n)
{
    char *buf = NULL;
    size_t cap = 0;
    ssize_t got = getline(&buf, &cap, stdin);
    if (got < 0) {
        free(buf);
        return NULL;
    }
    size_t len = (size_t)got;
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
        buf[--len] = 0;
    *n = len;
    return buf;
}

static char *one_line(const char *prompt, bool interactive, size_t *n)
{
#ifdef LILY_HAVE_LIBEDIT
    if (interactive) {
        char *line = readline(prompt); /* malloc'd, no newline; NULL at end of input */
        if (line)
            *n = strlen(line);
        return line;
    }
#endif
    if (interactive) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    return plain_line(n);
}

/* text += piece[0, n) (+ "\n" when newline), growing it; false when out of memory (text freed). */
static bool append(char **text, size_t *len, const char *piece, size_t n, bool newline)
{
    char *grown = realloc(*text, *len + n + 2);
    if (!grown) {
        free(*text);
        *text = NULL;
        return false;
    }
    memcpy(grown + *len, piece, n);
    *len += n;
    if (newline)
        grown[(*len)++] = '\n';
    grown[*len] = 0;
    *text = grown;
    return true;
}

char *line_input_read(const char *prompt, bool interactive, size_t *len_out)
{
    size_t n = 0;
    char *line = one_line(prompt, interactive, &n);
    if (!line)
        return NULL;
    char *text = NULL;
    size_t len = 0;
    if (!strcmp(line, BLOCK_FENCE)) { /* a """ block: every line up to the closing """ */
        free(line);
        bool first = true;
        while ((line = one_line(CONTINUATION_PROMPT, interactive, &n)) && strcmp(line, BLOCK_FENCE)) {
            if ((!first && !append(&text, &len, "\n", 1, false)) || !append(&text, &len, line, n, false)) {
                free(line);
                return NULL;
            }
            first = false;
            free(line);
        }
        free(line);
        if (!text && !append(&text, &len, "", 0, false))
            return NULL;
    } else {
        for (;;) { /* a trailing backslash continues the message on the next line */
            bool more = n > 0 && line[n - 1] == '\\';
            if (more)
                line[--n] = 0;
            bool ok = append(&text, &len, line, n, more);
            free(line);
            if (!ok)
                return NULL;
            if (!more || !(line = one_line(CONTINUATION_PROMPT, interactive, &n)))
                break;
        }
    }
#ifdef LILY_HAVE_LIBEDIT
    if (interactive && text[0])
        add_history(text);
#endif
    *len_out = len;
    return text;
}

const char *line_input_backend(void)
{
#ifdef LILY_HAVE_LIBEDIT
    return "libedit";
#else
    return "plain";
#endif
}
