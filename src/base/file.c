/* file.c — the whole-file reader (file.h). */
#include "file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

lily_status lily_check_regular_file(const char *path, lily_error *err)
{
    struct stat sb;
    if (stat(path, &sb) != 0 || S_ISREG(sb.st_mode))
        return LILY_OK;
    lily_error_set(err, LILY_ERR_IO, "%s: not a regular file (%s)", path,
                   S_ISFIFO(sb.st_mode) ? "a FIFO" : S_ISDIR(sb.st_mode) ? "a directory" : "a device or socket");
    errno = EINVAL;
    return LILY_ERR_IO;
}

lily_status lily_read_file(const char *path, size_t max_bytes, char **out, size_t *len, lily_error *err)
{
    *out = NULL;
    if (len)
        *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        lily_error_set(err, LILY_ERR_IO, "%s: cannot open (%s)", path, strerror(e));
        errno = e;
        return LILY_ERR_IO;
    }
    size_t cap = 1 << 14, n = 0;
    char *buf = malloc(cap + 1);
    lily_status st = LILY_OK;
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break; /* end of file or an error: ferror() below tells which */
        if (max_bytes && cap > max_bytes) {
            st = lily_error_set(err, LILY_ERR_FORMAT, "%s: larger than %zu bytes", path, max_bytes);
            break;
        }
        char *bigger = realloc(buf, 2 * cap + 1);
        if (!bigger) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = bigger;
        cap *= 2;
    }
    int read_errno = ferror(f) ? errno : 0;
    fclose(f);
    if (!buf)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    if (st == LILY_OK && read_errno)
        st = lily_error_set(err, LILY_ERR_IO, "%s: read failed (%s)", path, strerror(read_errno));
    if (st == LILY_OK && max_bytes && n > max_bytes)
        st = lily_error_set(err, LILY_ERR_FORMAT, "%s: larger than %zu bytes", path, max_bytes);
    if (st != LILY_OK) {
        free(buf);
        errno = read_errno ? read_errno : errno;
        return st;
    }
    buf[n] = '\0';
    *out = buf;
    if (len)
        *len = n;
    return LILY_OK;
}
