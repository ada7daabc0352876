/* line_input.c — see line_input.h. libedit's readline interface when LILY_HAVE_LIBEDIT, else fgets. */
#include "line_input.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LILY_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

#define CONTINUATION_PROMPT "... "
#define BLOCK_FENCE "\"\"\""

/* One physical line without its line ending (malloc'd), NULL at end of input. */
static char *plain_line(void)
{
    size_t cap = 1024, len = 0;
    char *buf = malloc(cap);
    if (!buf)
        return NULL;
    for (;;) {
        if (!fgets(buf + len, (int)(cap - len), stdin)) {
            if (len > 0 && feof(stdin))
                break; /* a last line without a newline */
            free(buf);
            return NULL;
        }
        len += strlen(buf + len);
        if (len > 0 && buf[len - 1] == '\n')
            break;
        if (len + 1 == cap) {
            char *grown = realloc(buf, cap *= 2);
            if (!grown) {
                free(buf);
                return NULL;
            }
            buf = grown;
        }
    }
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
        buf[--len] = 0;
    return buf;
}

static char *one_line(const char *prompt, bool interactive)
{
#ifdef LILY_HAVE_LIBEDIT
    if (interactive)
        return readline(prompt); /* malloc'd, no newline; NULL at end of input */
#endif
    if (interactive) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    return plain_line();
}

/* text += piece (+ "\n" when newline), growing it; false when out of memory (text freed). */
static bool append(char **text, size_t *len, const char *piece, bool newline)
{
    size_t n = strlen(piece);
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

char *line_input_read(const char *prompt, bool interactive)
{
    char *line = one_line(prompt, interactive);
    if (!line)
        return NULL;
    char *text = NULL;
    size_t len = 0;
    if (!strcmp(line, BLOCK_FENCE)) { /* a """ block: every line up to the closing """ */
        free(line);
        bool first = true;
        while ((line = one_line(CONTINUATION_PROMPT, interactive)) && strcmp(line, BLOCK_FENCE)) {
            if ((!first && !append(&text, &len, "\n", false)) || !append(&text, &len, line, false)) {
                free(line);
                return NULL;
            }
            first = false;
            free(line);
        }
        free(line);
        if (!text && !append(&text, &len, "", false))
            return NULL;
    } else {
        for (;;) { /* a trailing backslash continues the message on the next line */
            size_t n = strlen(line);
            bool more = n > 0 && line[n - 1] == '\\';
            if (more)
                line[n - 1] = 0;
            bool ok = append(&text, &len, line, more);
            free(line);
            if (!ok)
                return NULL;
            if (!more || !(line = one_line(CONTINUATION_PROMPT, interactive)))
                break;
        }
    }
#ifdef LILY_HAVE_LIBEDIT
    if (interactive && text[0])
        add_history(text);
#endif
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
