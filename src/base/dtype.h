/* dtype.h — storage dtypes of checkpoint tensors and exact conversions to fp32.
 *
 * bf16 and f16 are widened exactly (every bf16/f16 value is representable in fp32). The narrowing
 * f32 -> bf16 rounds to nearest even, as torch does.
 */
#ifndef LILY_DTYPE_H
#define LILY_DTYPE_H

#include <stdint.h>
#include <string.h>

typedef enum {
    LILY_DTYPE_UNKNOWN = 0,
    LILY_DTYPE_F32,
    LILY_DTYPE_F16,
    LILY_DTYPE_BF16,
    LILY_DTYPE_U32, /* MLX packed quantized weights */
    LILY_DTYPE_I32,
    LILY_DTYPE_I64,
    LILY_DTYPE_U8,
    LILY_DTYPE_I8,
    LILY_DTYPE_F64,
    LILY_DTYPE_BOOL,
} lily_dtype;

/* Bytes per element; 0 for UNKNOWN. */
static inline int lily_dtype_size(lily_dtype t)
{
    switch (t) {
    case LILY_DTYPE_F32: case LILY_DTYPE_U32: case LILY_DTYPE_I32: return 4;
    case LILY_DTYPE_F16: case LILY_DTYPE_BF16: return 2;
    case LILY_DTYPE_I64: case LILY_DTYPE_F64: return 8;
    case LILY_DTYPE_U8: case LILY_DTYPE_I8: case LILY_DTYPE_BOOL: return 1;
    default: return 0;
    }
}

/* The safetensors spelling ("F32", "BF16", ...). */
const char *lily_dtype_name(lily_dtype t);
/* Parse a safetensors dtype string; LILY_DTYPE_UNKNOWN if not recognised. */
lily_dtype lily_dtype_from_name(const char *name);

/* bf16 -> fp32: exact (bf16 is the top 16 bits of an fp32). */
static inline float lily_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* fp32 -> bf16, round to nearest even (as torch's .to(torch.bfloat16)); NaN stays a quiet NaN. */
static inline uint16_t lily_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a quiet NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* float -> IEEE half, round to nearest even (as torch's .to(torch.float16)); overflow to inf, NaN stays a
 * quiet NaN, values below 2^-14 become subnormals. */
static inline uint16_t lily_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)
        return sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u);
    if (ax >= 0x477ff000u) /* >= 65520: rounds to inf */
        return sign | 0x7c00u;
    if (ax < 0x38800000u) { /* below 2^-14: multiples of 2^-24, round half to even */
        float a;
        memcpy(&a, &ax, 4);
        const float q = a * 16777216.0f; /* exact: a power-of-two scale */
        uint32_t n = (uint32_t)q;
        const float rem = q - (float)n;
        n += rem > 0.5f || (rem == 0.5f && (n & 1u));
        return sign | (uint16_t)n;
    }
    const uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

/* IEEE half -> float, exact (handles subnormals, inf, NaN). */
static inline float lily_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400u)) {
                mant <<= 1;
                exp--;
            }
            mant &= 0x3ffu;
            u = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Read element i of a float-typed buffer (F32, F16 or BF16) as fp32. */
static inline float lily_load_f32(const void *data, lily_dtype t, int64_t i)
{
    switch (t) {
    case LILY_DTYPE_F32: { float f; memcpy(&f, (const char *)data + 4 * i, 4); return f; }
    case LILY_DTYPE_BF16: { uint16_t h; memcpy(&h, (const char *)data + 2 * i, 2); return lily_bf16_to_f32(h); }
    case LILY_DTYPE_F16: { uint16_t h; memcpy(&h, (const char *)data + 2 * i, 2); return lily_f16_to_f32(h); }
    default: return 0.0f;
    }
}

#endif
