/* cpu_backend.c — placeholder until the CPU backend lands. */
#include "backend/backend.h"

const lily_backend_ops lily_cpu_backend_ops = {.name = "cpu"};
