/* token_ids.c — reading token-id lists for `lily eval` and `lily perplexity` (cli_common.h).
 *
 * Owns: the one parser of "1, 2, 3" / "[1 2 3]" id lists and reading them from a file. The ids are not
 * checked against a vocabulary here: lily_session_append does that with the model at hand.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "cli_common.h"

#define ID_SEPARATORS " \t\r\n,[]"

int cli_parse_token_ids(const char *cmd, const char *text, int32_t **out, int *n_out)
{
    *out = NULL;
    *n_out = 0;
    int cap = 1024, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids)
        return fprintf(stderr, "lily %s: out of memory reading token ids\n", cmd), -1;
    for (const char *p = text;;) {
        /* a comma ends an item: two in one run of separators, or one before the first id or after the
         * last, leave an empty item ("1,,2"), which is a mistake rather than a list of two */
        const char *sep = p;
        p += strspn(p, ID_SEPARATORS);
        int commas = 0;
        for (const char *q = sep; q < p; q++)
            commas += *q == ',';
        if (commas > (n > 0 && *p ? 1 : 0)) {
            fprintf(stderr, "lily %s: empty item in the token id list near \"%.*s\"\n", cmd,
                    (int)(p - sep < 20 ? p - sep : 20), sep);
            free(ids);
            return -1;
        }
        if (!*p)
            break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && !strchr(ID_SEPARATORS, *end))) {
            fprintf(stderr, "lily %s: bad token id near \"%.20s\" (ids are non-negative integers)\n", cmd, p);
            free(ids);
            return -1;
        }
        if (n == cap) {
            int32_t *bigger = cap <= INT32_MAX / 2 ? realloc(ids, 2 * (size_t)cap * sizeof *ids) : NULL;
            if (!bigger) {
                free(ids);
                return fprintf(stderr, "lily %s: out of memory reading token ids\n", cmd), -1;
            }
            ids = bigger;
            cap *= 2;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

int cli_read_token_ids_file(const char *cmd, const char *path, int32_t **out, int *n_out)
{
    *out = NULL;
    *n_out = 0;
    char *text;
    lily_error err = {0};
    if (lily_read_file(path, 0, &text, NULL, &err) != LILY_OK)
        return fprintf(stderr, "lily %s: %s\n", cmd, err.message), 1;
    int rc = cli_parse_token_ids(cmd, text, out, n_out);
    free(text);
    return rc;
}
