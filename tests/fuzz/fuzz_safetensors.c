/* fuzz_safetensors.c — libFuzzer target for the safetensors header parser (lily_st_parse).
 *
 * Build: cmake -S . -B build-fuzz -DLILY_FUZZ=ON -DLILY_CUDA=OFF -DCMAKE_C_COMPILER=clang
 *        cmake --build build-fuzz --target fuzz_safetensors
 * Run:   ./build-fuzz/tests/fuzz/fuzz_safetensors -max_total_time=60 tests/fuzz/corpus
 * On success every tensor must lie inside the input, and no two may overlap.
 */
#include <stdint.h>
#include <stdlib.h>

#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lily_st_tensor *tensors;
    int n;
    lily_error err;
    if (lily_st_parse(data, size, &tensors, &n, &err) != LILY_OK)
        return 0;
    for (int i = 0; i < n; i++) {
        const uint8_t *p = tensors[i].data;
        if (p < data || p + tensors[i].nbytes > data + size)
            abort();
        if (tensors[i].nbytes) /* touch the first and last byte so ASan checks the range */
            (void)(volatile uint8_t)(p[0] + p[tensors[i].nbytes - 1]);
    }
    lily_st_tensors_free(tensors, n);
    return 0;
}
