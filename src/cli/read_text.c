/* read_text.c — reading a whole text input (stdin or a file) for the commands (cli_common.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"

char *cli_read_all(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (n < cap - 1) {
            if (ferror(f)) {
                int e = errno; /* the read's reason (EISDIR for a directory), for the caller's message */
                free(buf);
                errno = e;
                return NULL;
            }
            break;
        }
        char *p = realloc(buf, cap * 2);
        if (!p)
            free(buf);
        buf = p;
        cap *= 2;
    }
    if (!buf)
        return NULL;
    buf[n] = 0;
    *len = n;
    return buf;
}

char *cli_read_prompt(const char *cmd, const char *path)
{
    bool from_stdin = !strcmp(path, "-");
    FILE *f = from_stdin ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "lily %s: cannot open %s: %s\n", cmd, path, strerror(errno));
        return NULL;
    }
    size_t len = 0;
    errno = 0;
    char *text = cli_read_all(f, &len);
    int read_errno = errno;
    if (!from_stdin)
        fclose(f);
    if (!text) {
        fprintf(stderr, "lily %s: cannot read %s: %s\n", cmd, from_stdin ? "stdin" : path,
                strerror(read_errno ? read_errno : EIO));
        return NULL;
    }
    if (strlen(text) != len) {
        fprintf(stderr, "lily %s: %s holds a NUL byte: not a text prompt\n", cmd, from_stdin ? "stdin" : path);
        free(text);
        return NULL;
    }
    return text;
}
