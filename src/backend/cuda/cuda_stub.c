/* cuda_stub.c — linked when nvcc is not found: the CUDA backend is absent. */
#include "backend/backend.h"

const lily_backend_ops *lily_cuda_backend_ops_get(void) { return NULL; }
