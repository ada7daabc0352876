/* memory_limit.h — how much memory this process may use: the machine's physical memory, lowered by the
 * cgroup memory limit a container (docker --memory, a Kubernetes limit) or a systemd unit puts on it.
 *
 * Owns: reading the cgroup limit, v2 (memory.max) and v1 (memory.limit_in_bytes), for the process's own
 * cgroup and its ancestors (a parent's limit binds its children), as the kernel's documentation
 * (admin-guide/cgroup-v2.rst "memory.max", cgroup-v1/memory.rst "memory.limit_in_bytes") describes them.
 * Defaults sized from the machine (the prefix cache's RAM cap) use lily_memory_limit_bytes, so a container
 * gets a default that fits inside it.
 */
#ifndef LILY_BASE_MEMORY_LIMIT_H
#define LILY_BASE_MEMORY_LIMIT_H

#include <stdint.h>

/* The limit a cgroup memory file's text states, in bytes: a decimal count (surrounding whitespace and a
 * trailing newline allowed). 0 means no limit: "max" (v2's word for none), a count of 2^62 or more (v1
 * writes none as the largest page-aligned int64, 9223372036854771712), and anything that is not a count
 * (empty, garbage, negative). */
uint64_t lily_cgroup_limit_parse(const char *text);

/* The lowest cgroup memory limit on this process, in bytes (0: none found), read from the files under root
 * (NULL or "" for the real filesystem; a test passes a fixture tree): the process's cgroups from
 * ROOT/proc/self/cgroup ("0::PATH" for v2; "N:...memory...:PATH" for v1), then memory.max in
 * ROOT/sys/fs/cgroup/PATH and each directory above it up to ROOT/sys/fs/cgroup, and memory.limit_in_bytes in
 * ROOT/sys/fs/cgroup/memory/PATH and each directory above it (a missing /proc/self/cgroup: PATH "/"). A file
 * that is missing or unreadable is skipped. */
uint64_t lily_cgroup_memory_limit(const char *root);

/* The memory this process may use, in bytes: the machine's physical memory (sysconf) or the cgroup limit
 * (lily_cgroup_memory_limit(NULL)), whichever is lower; 0 when neither is known. */
uint64_t lily_memory_limit_bytes(void);

#endif
