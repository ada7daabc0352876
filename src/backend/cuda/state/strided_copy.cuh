/* strided_copy.cuh — one kernel that copies many strided byte ranges on the device (the prefix cache's
 * checkpoint saves and restores between a session's state and a device pool: every attention layer's K
 * and V rows, every Gated DeltaNet layer's conv and recurrent state), in place of one cudaMemcpy2DAsync
 * per range (~7 µs of host time each, ~460 of them for a 4K prompt's two checkpoints).
 */
#ifndef LILY_CUDA_STRIDED_COPY_CUH
#define LILY_CUDA_STRIDED_COPY_CUH

#include "backend/cuda/cuda_common.cuh"

#define STRIDED_COPY_MAX_PARTS 64

/* Part p copies `rows` rows of `width` bytes: row r from src[p] + r * src_pitch[p] to dst[p] + r *
 * dst_pitch[p]. Every pointer, pitch and width a multiple of 16 bytes (strided_copy_aligned). */
struct strided_copy_args {
    uint8_t *dst[STRIDED_COPY_MAX_PARTS];
    const uint8_t *src[STRIDED_COPY_MAX_PARTS];
    size_t dst_pitch[STRIDED_COPY_MAX_PARTS], src_pitch[STRIDED_COPY_MAX_PARTS];
    size_t width;
    int rows, n_parts;
};

/* Whether a.dst/src/pitches/width (parts [0, n_parts)) are all 16-byte aligned, as the kernel needs. */
bool strided_copy_aligned(const strided_copy_args &a);
/* The copy (device memory on both sides; the ranges do not overlap). cudaErrorInvalidValue for more than
 * STRIDED_COPY_MAX_PARTS parts, rows < 1 or an unaligned range. */
cudaError_t launch_strided_copy(const strided_copy_args &a, cudaStream_t s);

#endif
