/* hw_limits.h — what the hardware can do at best: memory bandwidth and matrix rate, measured.
 *
 * Owns: the CPU measurements (a multi-threaded streaming read and memcpy; an fp32 matmul with a
 * register-tiled kernel, AVX2+FMA where the CPU has it), a short name of the machine, and the hook a GPU
 * backend fills with its own measurements. `lily bench` divides the cost model (cost_model.h) by these to
 * print each row's fraction of the hardware limit (DESIGN.md §6).
 */
#ifndef LILY_HW_LIMITS_H
#define LILY_HW_LIMITS_H

#include "lily.h"

typedef struct {
    char device[256];          /* "Intel(R) Xeon(R) Processor, 2 cores" / "NVIDIA H200" */
    double read_bytes_per_s;   /* streaming read bandwidth (0 = not measured) */
    double copy_bytes_per_s;   /* copy bandwidth counting bytes read + bytes written (0 = not measured) */
    double bandwidth;          /* the one the decode floor uses: CPU: read; GPU: copy (TARGETS.md) */
    double matmul_flops_per_s; /* dense matmul rate (CPU: fp32; GPU: bf16 tensor cores) */
    char matmul_kind[64];      /* "fp32 avx2+fma", "bf16 tensor core", ... */
} lily_hw_limits;

/* The CPU's model name and core count, e.g. "Intel(R) Xeon(R) Processor (2 cores)". */
void lily_cpu_describe(char *buf, size_t size);

/* Measure the CPU: streaming read and memcpy over `bytes` (0 = 512 MiB) split across n_threads
 * (0 = all cores), best of a few passes; fp32 matmul of 256-wide tiles on every thread. Takes ~1-2 s.
 * Errors: LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_cpu_measure_limits(int n_threads, size_t bytes, lily_hw_limits *out, lily_error *err);

/* Measure the limits of the device `backend` runs on ("cpu" or "cuda"; device = GPU ordinal).
 * Errors: LILY_ERR_UNSUPPORTED when the backend has no measurement (see lily_cuda_measure_limits);
 * as the measurement. */
lily_status lily_measure_limits(const char *backend, int device, int n_threads, lily_hw_limits *out, lily_error *err);

/* Implemented by the CUDA backend (src/backend/cuda/, as extern "C"): fill out->device with the GPU's
 * name, out->copy_bytes_per_s with a device-to-device copy rate (bytes read + written, as TARGETS.md's
 * ~4.3 TB/s), out->bandwidth with the rate the decode floor should use, and out->matmul_flops_per_s
 * with a dense bf16 matmul rate (TARGETS.md: ~790 TFLOP/s on the H200).
 * TODO(cuda): the default here is a weak symbol that returns LILY_ERR_UNSUPPORTED; define the real one
 * in a .cu file and it replaces this one at link time. */
lily_status lily_cuda_measure_limits(int device, lily_hw_limits *out, lily_error *err);

#endif
