/* test_memory_limit.c — base/memory_limit.h: the cgroup limit files' text ("max", a count, v1's "none"),
 * the limit read from a fixture tree (v2, v1, a parent's limit, missing files), and the prefix cache's
 * default RAM cap under a memory limit (a container's), runtime/prefix_cache.h. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/memory_limit.h"
#include "runtime/prefix_cache.h"
#include "test_support.h"

static void test_limit_text(void **state)
{
    (void)state;
    assert_true(lily_cgroup_limit_parse("max\n") == 0);           /* v2: no limit */
    assert_true(lily_cgroup_limit_parse("max") == 0);
    assert_true(lily_cgroup_limit_parse("1073741824\n") == 1073741824ull);
    assert_true(lily_cgroup_limit_parse("  536870912  \n") == 536870912ull);
    assert_true(lily_cgroup_limit_parse("9223372036854771712\n") == 0); /* v1: no limit */
    assert_true(lily_cgroup_limit_parse("4611686018427387904") == 0);   /* 2^62: no limit */
    assert_true(lily_cgroup_limit_parse("4611686018427387903") == 4611686018427387903ull);
    assert_true(lily_cgroup_limit_parse("99999999999999999999999") == 0); /* overflows: not a count */
    assert_true(lily_cgroup_limit_parse("") == 0);
    assert_true(lily_cgroup_limit_parse("\n") == 0);
    assert_true(lily_cgroup_limit_parse("-1") == 0);
    assert_true(lily_cgroup_limit_parse("12k") == 0);
    assert_true(lily_cgroup_limit_parse("1 2") == 0);
    assert_true(lily_cgroup_limit_parse(NULL) == 0);
}

/* A fixture tree under a temp dir: files written by put(), removed by rm -r at the end. */
static char root[PATH_MAX];

static void put(const char *rel, const char *text)
{
    char path[PATH_MAX * 2], cmd[PATH_MAX * 2 + 16];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    char *slash = strrchr(path, '/');
    *slash = 0;
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", path);
    assert_int_equal(system(cmd), 0);
    *slash = '/';
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int make_root(void **state)
{
    (void)state;
    snprintf(root, sizeof root, "/tmp/lily_memory_limit_XXXXXX");
    return mkdtemp(root) ? 0 : -1;
}

static int remove_root(void **state)
{
    (void)state;
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_no_files_no_limit(void **state)
{
    (void)state;
    assert_true(lily_cgroup_memory_limit(root) == 0); /* nothing under root: no /proc/self/cgroup, no cgroup fs */
}

static void test_v2_limit(void **state)
{
    (void)state;
    /* a container with its own cgroup namespace: "0::/", the limit at the mount's root */
    put("proc/self/cgroup", "0::/\n");
    put("sys/fs/cgroup/memory.max", "2147483648\n");
    assert_true(lily_cgroup_memory_limit(root) == 2147483648ull);
    put("sys/fs/cgroup/memory.max", "max\n");
    assert_true(lily_cgroup_memory_limit(root) == 0);
    /* a systemd unit: the process's own cgroup has none, a parent slice has one; the lower of two counts */
    put("proc/self/cgroup", "0::/user.slice/app.service\n");
    put("sys/fs/cgroup/user.slice/app.service/memory.max", "max\n");
    put("sys/fs/cgroup/user.slice/memory.max", "1073741824\n");
    assert_true(lily_cgroup_memory_limit(root) == 1073741824ull);
    put("sys/fs/cgroup/user.slice/app.service/memory.max", "536870912\n");
    assert_true(lily_cgroup_memory_limit(root) == 536870912ull);
    /* a path the mount does not have (another namespace's view): the mount's root still counts */
    put("proc/self/cgroup", "0::/elsewhere/unit\n");
    put("sys/fs/cgroup/memory.max", "3221225472\n");
    assert_true(lily_cgroup_memory_limit(root) == 3221225472ull);
}

static void test_v1_limit(void **state)
{
    (void)state;
    /* v1 as a docker container without a cgroup namespace sees it: the host's path, its own cgroup mounted */
    put("proc/self/cgroup", "12:pids:/docker/abc\n4:cpu,memory:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n");
    put("sys/fs/cgroup/memory/memory.limit_in_bytes", "805306368\n");
    assert_true(lily_cgroup_memory_limit(root) == 805306368ull);
    put("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n"); /* none */
    assert_true(lily_cgroup_memory_limit(root) == 0);
    put("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "268435456\n");
    assert_true(lily_cgroup_memory_limit(root) == 268435456ull);
    /* "memory" must be a whole controller name, not part of one */
    put("proc/self/cgroup", "4:memoryx:/docker/abc\n");
    assert_true(lily_cgroup_memory_limit(root) == 0);
    /* no /proc/self/cgroup: the mounts' roots */
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    assert_int_equal(unlink(path), 0);
    put("sys/fs/cgroup/memory/memory.limit_in_bytes", "402653184\n");
    assert_true(lily_cgroup_memory_limit(root) == 402653184ull);
    /* garbage in a limit file is no limit, not an error */
    put("sys/fs/cgroup/memory/memory.limit_in_bytes", "not a number\n");
    assert_true(lily_cgroup_memory_limit(root) == 0);
}

static void test_this_process(void **state)
{
    (void)state;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const uint64_t phys = (uint64_t)pages * (uint64_t)page;
    const uint64_t cg = lily_cgroup_memory_limit(NULL), limit = lily_memory_limit_bytes();
    assert_true(limit > 0 && limit <= phys);
    assert_true(limit == (cg && cg < phys ? cg : phys));
}

static void test_prefix_cache_default_under_a_limit(void **state)
{
    (void)state;
    const size_t mib = 1 << 20;
    /* no limit: 4 states within [64, 4096] MiB, as before */
    assert_true(lily_prefix_cache_default_ram_bytes(1 * mib, 0) == 64 * mib);
    assert_true(lily_prefix_cache_default_ram_bytes(100 * mib, 0) == 400 * mib);
    assert_true(lily_prefix_cache_default_ram_bytes(2048 * mib, 0) == 4096 * mib);
    /* a 64 GiB machine: the quarter (16 GiB) is above the 4096 MiB ceiling, no change */
    assert_true(lily_prefix_cache_default_ram_bytes(2048 * mib, (uint64_t)64 << 30) == 4096 * mib);
    /* a container of 1 GiB: a quarter of it, 256 MiB, not 400 */
    assert_true(lily_prefix_cache_default_ram_bytes(100 * mib, (uint64_t)1 << 30) == 256 * mib);
    /* ... and 128 MiB: 32 MiB, below the 64 MiB floor (the floor would take half of it) */
    assert_true(lily_prefix_cache_default_ram_bytes(1 * mib, (uint64_t)128 << 20) == 32 * mib);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limit_text),
        cmocka_unit_test_setup_teardown(test_no_files_no_limit, make_root, remove_root),
        cmocka_unit_test_setup_teardown(test_v2_limit, make_root, remove_root),
        cmocka_unit_test_setup_teardown(test_v1_limit, make_root, remove_root),
        cmocka_unit_test(test_this_process),
        cmocka_unit_test(test_prefix_cache_default_under_a_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
