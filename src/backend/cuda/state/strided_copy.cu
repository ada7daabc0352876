/* strided_copy.cu — strided_copy.cuh's kernel: grid (x: 16-byte words of a row, y: part x row), each thread
 * copying words of one row with a grid-stride loop. */
#include "strided_copy.cuh"

#define SC_THREADS 256
#define SC_MAX_X 64 /* blocks per row: the loop covers the rest */

__global__ void __launch_bounds__(SC_THREADS) strided_copy_kernel(strided_copy_args a)
{
    const int part = blockIdx.y / a.rows, r = blockIdx.y % a.rows;
    const uint4 *src = reinterpret_cast<const uint4 *>(a.src[part] + (size_t)r * a.src_pitch[part]);
    uint4 *dst = reinterpret_cast<uint4 *>(a.dst[part] + (size_t)r * a.dst_pitch[part]);
    const size_t words = a.width / 16;
    for (size_t i = (size_t)blockIdx.x * SC_THREADS + threadIdx.x; i < words; i += (size_t)gridDim.x * SC_THREADS)
        dst[i] = src[i];
}

bool strided_copy_aligned(const strided_copy_args &a)
{
    if (a.width % 16)
        return false;
    for (int p = 0; p < a.n_parts; p++)
        if (((uintptr_t)a.dst[p] | (uintptr_t)a.src[p] | a.dst_pitch[p] | a.src_pitch[p]) % 16)
            return false;
    return true;
}

cudaError_t launch_strided_copy(const strided_copy_args &a, cudaStream_t s)
{
    if (a.n_parts < 1 || a.n_parts > STRIDED_COPY_MAX_PARTS || a.rows < 1 || a.width == 0 || !strided_copy_aligned(a))
        return cudaErrorInvalidValue;
    if ((size_t)a.n_parts * a.rows > 65535)
        return cudaErrorInvalidValue;
    const size_t words = a.width / 16;
    size_t bx = (words + SC_THREADS - 1) / SC_THREADS;
    if (bx > SC_MAX_X)
        bx = SC_MAX_X;
    strided_copy_kernel<<<dim3((unsigned)bx, (unsigned)(a.n_parts * a.rows)), SC_THREADS, 0, s>>>(a);
    return cudaGetLastError();
}
