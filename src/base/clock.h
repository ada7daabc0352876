/* clock.h — the clocks lily times itself with (generation speed, bench, eval).
 *
 * Owns: reading the monotonic wall clock and the process CPU time, in seconds. Timing never decides a
 * result: tests do not time anything (STYLE.md).
 */
#ifndef LILY_BASE_CLOCK_H
#define LILY_BASE_CLOCK_H

#include <stdint.h>

/* Seconds on the monotonic clock (CLOCK_MONOTONIC, nanosecond resolution); meaningful only as a
 * difference between two calls. Cannot fail. */
double lily_wall_seconds(void);
/* The same clock in integer nanoseconds (for sums of many short intervals). Cannot fail. */
int64_t lily_wall_ns(void);

/* CPU seconds used by this process so far, user + system, all threads (getrusage RUSAGE_SELF): the
 * steadier number on a shared machine. Cannot fail. */
double lily_process_cpu_seconds(void);

#endif
