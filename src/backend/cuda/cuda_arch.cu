/* cuda_arch.cu — whether the GPU code this process runs was compiled for sm_90: PDL (griddepcontrol)
 * and the streamed GEMV's bulk copies and mbarriers exist only there. A build for "90a-real;80-virtual"
 * runs the sm_90a machine code on compute capability 9.0 and JIT-compiles the compute_80 PTX on every
 * other GPU (sm_80 ... 8.9, and anything newer than 9.0), where those instructions are compiled out: the
 * host must then neither launch programmatically nor pick the streamed kernel. */
#include "cuda_common.cuh"

__global__ void arch_probe_kernel(int *x)
{
    if (x)
        *x = 0;
}

bool cuda_sm90a_image(cudaError_t read, int flag)
{
    int dev = 0, major = 0, minor = 0;
    const bool yes = read == cudaSuccess && flag == 1 && cudaGetDevice(&dev) == cudaSuccess &&
                     cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                     cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                     major == 9 && minor == 0;
    (void)cudaGetLastError(); /* a failed query leaves no sticky error */
    return yes;
}

bool cuda_sm90_code(void)
{
    static int have = -1;
    if (have < 0) {
        cudaFuncAttributes fa;
        have = cudaFuncGetAttributes(&fa, arch_probe_kernel) == cudaSuccess && fa.ptxVersion >= 90 && fa.binaryVersion >= 90;
        (void)cudaGetLastError(); /* a failed query (no device) leaves no sticky error */
    }
    return have == 1;
}
