/* hw_limits.h — what the hardware can do at best: memory bandwidth and matrix rate, measured.
 *
 * Owns: the CPU measurements (a multi-threaded streaming read and memcpy; an fp32 matmul with a
 * register-tiled kernel, AVX2+FMA where the CPU has it), a short name of the machine; a GPU backend
 * measures itself (its measure_limits op, backend.h). `lily bench` divides the cost model (cost_model.h) by these to
 * print each row's fraction of the hardware limit (DESIGN.md §6).
 */
#ifndef LILY_HW_LIMITS_H
#define LILY_HW_LIMITS_H

#include "backend/backend.h" /* lily_hw_limits */
#include "lily.h"


/* The CPU's model name and core count, e.g. "Intel(R) Xeon(R) Processor (2 cores)". */
void lily_cpu_describe(char *buf, size_t size);

/* Measure the CPU: streaming read and memcpy over `bytes` (0 = 512 MiB) split across n_threads
 * (0 = all cores), best of a few passes; fp32 matmul of 256-wide tiles on every thread. Takes ~1-2 s.
 * Errors: LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_cpu_measure_limits(int n_threads, size_t bytes, lily_hw_limits *out, lily_error *err);

/* Measure the limits of the device `backend` runs on ("cpu", or a backend with measure_limits such as
 * "cuda"; device = GPU ordinal).
 * Errors: LILY_ERR_UNSUPPORTED when the backend is not in this build or has no measurement; as the
 * measurement. */
lily_status lily_measure_limits(const char *backend, int device, int n_threads, lily_hw_limits *out, lily_error *err);


#endif
