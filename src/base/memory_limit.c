/* memory_limit.c — the machine's memory, lowered by the process's cgroup limit (memory_limit.h). */
#include "base/memory_limit.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"

uint64_t lily_cgroup_limit_parse(const char *text)
{
    if (!text)
        return 0;
    while (isspace((unsigned char)*text))
        text++;
    if (!isdigit((unsigned char)*text)) /* "max", "", "-1", garbage */
        return 0;
    char *end;
    errno = 0;
    const unsigned long long v = strtoull(text, &end, 10);
    while (isspace((unsigned char)*end))
        end++;
    if (errno || *end || v >= (1ull << 62))
        return 0;
    return (uint64_t)v;
}

/* The limit in the file at path (0: none, missing or unreadable). */
static uint64_t limit_in_file(const char *path)
{
    char *text = NULL;
    size_t len = 0;
    lily_error ignored = {0};
    if (lily_read_file(path, 4096, &text, &len, &ignored) != LILY_OK)
        return 0;
    const uint64_t v = lily_cgroup_limit_parse(text);
    free(text);
    return v;
}

static uint64_t lower(uint64_t a, uint64_t b) { return !a ? b : !b ? a : a < b ? a : b; }

/* The lowest limit in file `name` of base+path and each directory above it up to base. */
static uint64_t limit_up_tree(const char *base, const char *path, const char *name)
{
    char dir[PATH_MAX];
    const size_t base_len = strlen(base);
    if (snprintf(dir, sizeof dir, "%s%s", base, path[0] == '/' ? path : "/") >= (int)sizeof dir)
        return 0;
    size_t n = strlen(dir);
    while (n > base_len && dir[n - 1] == '/') /* "PATH/" and "/" end at a name, or at base */
        dir[--n] = 0;
    uint64_t limit = 0;
    for (;;) {
        char file[PATH_MAX + 64];
        snprintf(file, sizeof file, "%s/%s", dir, name);
        limit = lower(limit, limit_in_file(file));
        if (n <= base_len)
            break;
        while (n > base_len && dir[n - 1] != '/') /* up one directory */
            n--;
        while (n > base_len && dir[n - 1] == '/')
            n--;
        dir[n] = 0;
    }
    return limit;
}

/* Whether the comma-separated controller list [s, s + n) names "memory". */
static bool lists_memory(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t k = i;
        while (k < n && s[k] != ',')
            k++;
        if (k - i == 6 && !memcmp(s + i, "memory", 6))
            return true;
        i = k + 1;
    }
    return false;
}

uint64_t lily_cgroup_memory_limit(const char *root)
{
    if (!root)
        root = "";
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    char *text = NULL;
    size_t len = 0;
    lily_error ignored = {0};
    /* "/" when the file is missing: the cgroup roots as mounted (a container sees its own there) */
    char v2[PATH_MAX] = "/", v1[PATH_MAX] = "/";
    if (lily_read_file(path, 1 << 20, &text, &len, &ignored) == LILY_OK) {
        for (char *line = text; line && *line;) {
            char *next = strchr(line, '\n');
            if (next)
                *next++ = 0;
            char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
            if (c2 && c2[1] == '/' && strlen(c2 + 1) < sizeof v2) {
                if (c1 - line == 1 && line[0] == '0' && c2 == c1 + 1) /* "0::PATH": cgroup v2 */
                    strcpy(v2, c2 + 1);
                else if (lists_memory(c1 + 1, (size_t)(c2 - c1 - 1))) /* "N:memory:PATH": v1 */
                    strcpy(v1, c2 + 1);
            }
            line = next;
        }
        free(text);
    }
    char base[PATH_MAX];
    uint64_t limit = 0;
    if (snprintf(base, sizeof base, "%s/sys/fs/cgroup", root) < (int)sizeof base)
        limit = lower(limit, limit_up_tree(base, v2, "memory.max"));
    if (snprintf(base, sizeof base, "%s/sys/fs/cgroup/memory", root) < (int)sizeof base)
        limit = lower(limit, limit_up_tree(base, v1, "memory.limit_in_bytes"));
    return limit;
}

uint64_t lily_memory_limit_bytes(void)
{
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const uint64_t phys = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    return lower(phys, lily_cgroup_memory_limit(NULL));
}
