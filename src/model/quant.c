/* quant.c — exact reference dequantization of one lily_tensor row (MODEL.md §3).
 *
 * Owns: lily_tensor_dequant_row, the slow, obviously-correct path the tests and the exact-mode
 * backends compare against. MLX affine: w = float(scale) * q + float(bias), in fp32; element j of a
 * uint32 word sits at bits [bits*j, bits*j + bits) from the least-significant end (X-CPU `quantize`,
 * X-OPS `affine_dequantize`). Plain tensors are widened exactly from F32/F16/BF16.
 * Reads go through memcpy: the data offsets of a safetensors file need not be 4-byte aligned.
 */
#include <string.h>

#include "base/base.h"
#include "weights.h"

/* scale * q + bias rounded twice, as the fp32 references compute it; a fused multiply-add would differ
 * by an ulp. (GCC contracts only with -ffp-contract=fast on FMA targets; clang honours the pragma.) */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

void lily_tensor_dequant_row(const lily_tensor *t, int64_t expert, int64_t row, int64_t col0, int64_t n_cols,
                             float *out)
{
    LILY_ASSERT(t->data != NULL);
    LILY_ASSERT(row >= 0 && row < lily_tensor_rows(t));
    LILY_ASSERT(col0 >= 0 && n_cols >= 0 && col0 + n_cols <= lily_tensor_cols(t));
    LILY_ASSERT(expert >= 0 && (t->ndim == 3 ? expert < t->shape[0] : expert == 0));
    int64_t physical_row = expert * t->expert_stride + row;
    const char *data = (const char *)t->data + physical_row * t->row_bytes;

    if (t->bits == 0) {
        for (int64_t c = 0; c < n_cols; c++)
            out[c] = lily_load_f32(data, t->dtype, col0 + c);
        return;
    }

    LILY_ASSERT(t->bits == 4 || t->bits == 8);
    const int bits = t->bits, per_word = 32 / bits;
    const uint32_t mask = (1u << bits) - 1u;
    const char *scales = (const char *)t->scales + physical_row * t->scale_row_bytes;
    const char *biases = (const char *)t->biases + physical_row * t->scale_row_bytes;
    int64_t group = -1;
    float scale = 0.0f, bias = 0.0f;
    uint32_t word = 0;
    int64_t word_index = -1;
    for (int64_t i = 0; i < n_cols; i++) {
        int64_t c = col0 + i;
        if (c / t->group_size != group) {
            group = c / t->group_size;
            scale = lily_load_f32(scales, t->scale_dtype, group);
            bias = lily_load_f32(biases, t->scale_dtype, group);
        }
        if (c / per_word != word_index) {
            word_index = c / per_word;
            memcpy(&word, data + 4 * word_index, 4); /* little-endian host assumed, as the files are */
        }
        uint32_t q = (word >> (bits * (int)(c % per_word))) & mask;
        out[i] = scale * (float)q + bias;
    }
}
