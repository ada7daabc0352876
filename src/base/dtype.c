/* dtype.c — dtype names as safetensors spells them. */
#include "dtype.h"

static const struct { lily_dtype t; const char *name; } dtype_names[] = {
    {LILY_DTYPE_F32, "F32"}, {LILY_DTYPE_F16, "F16"}, {LILY_DTYPE_BF16, "BF16"}, {LILY_DTYPE_U32, "U32"},
    {LILY_DTYPE_I32, "I32"}, {LILY_DTYPE_I64, "I64"}, {LILY_DTYPE_U8, "U8"},    {LILY_DTYPE_I8, "I8"},
    {LILY_DTYPE_F64, "F64"}, {LILY_DTYPE_BOOL, "BOOL"},
};

const char *lily_dtype_name(lily_dtype t)
{
    for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++)
        if (dtype_names[i].t == t)
            return dtype_names[i].name;
    return "UNKNOWN";
}

lily_dtype lily_dtype_from_name(const char *name)
{
    for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++)
        if (strcmp(dtype_names[i].name, name) == 0)
            return dtype_names[i].t;
    return LILY_DTYPE_UNKNOWN;
}
