/* matmul.c — CPU linear layers in exact mode: y = x · Wᵀ for any lily_tensor (MODEL.md §3, §4); in fast
 * mode the 4/8-bit ones go to matmul_fast.c instead.
 *
 * Owns: exact dequantization of weight rows (plain F32/F16/BF16 widened; MLX affine 4/8-bit as
 * float(scale) * q + float(bias)) and the row-blocked matmul that reuses each dequantized block of
 * weight rows for every token row of the call. Work is split over output rows across the thread pool.
 */
#include <string.h>

#include "base/base.h"
#include "cpu_internal.h"

/* Floats of dequantized weights one task holds (on its stack): 64 KiB. */
#define MATMUL_BLOCK_FLOATS CPU_MATMUL_MAX_COLS

static const uint8_t *row_ptr(const void *base, int64_t stride_bytes, int64_t physical_row)
{
    return (const uint8_t *)base + physical_row * stride_bytes;
}

/* One group of `group` values from packed words: o[i] = s * q_i + b. BITS is a constant in each
 * instantiation so the unpacking unrolls and vectorizes. */
#define DEQUANT_GROUP(BITS)                                                                        \
    do {                                                                                           \
        for (int m = 0; m < group / (32 / (BITS)); m++) {                                          \
            uint32_t word;                                                                         \
            memcpy(&word, gw + 4 * m, 4); /* files are little-endian, as is every supported host */ \
            for (int j = 0; j < 32 / (BITS); j++)                                                  \
                o[m * (32 / (BITS)) + j] = s * (float)((word >> ((BITS) * j)) & ((1u << (BITS)) - 1u)) + b; \
        }                                                                                          \
    } while (0)

static void dequant_row_quantized(const lily_tensor *w, int64_t prow, int64_t cols, float *out)
{
    const uint8_t *words = row_ptr(w->data, w->row_bytes, prow);
    const uint8_t *scales = row_ptr(w->scales, w->scale_row_bytes, prow);
    const uint8_t *biases = row_ptr(w->biases, w->scale_row_bytes, prow);
    const int bits = w->bits;
    const int group = w->group_size;
    const int64_t n_groups = cols / group;
    for (int64_t g = 0; g < n_groups; g++) {
        const float s = lily_load_f32(scales, w->scale_dtype, g);
        const float b = lily_load_f32(biases, w->scale_dtype, g);
        float *o = out + g * group;
        const uint8_t *gw = words + (size_t)(g * group * bits / 32) * 4;
        if (bits == 4) {
            /* the 16 possible values of this group, each exactly s * q + b, then a lookup per element */
            float lut[16];
            for (int q = 0; q < 16; q++)
                lut[q] = s * (float)q + b;
            for (int m = 0; m < group / 8; m++) {
                uint32_t word;
                memcpy(&word, gw + 4 * m, 4); /* files are little-endian, as is every supported host */
                float *om = o + 8 * m;
                om[0] = lut[word & 15];
                om[1] = lut[(word >> 4) & 15];
                om[2] = lut[(word >> 8) & 15];
                om[3] = lut[(word >> 12) & 15];
                om[4] = lut[(word >> 16) & 15];
                om[5] = lut[(word >> 20) & 15];
                om[6] = lut[(word >> 24) & 15];
                om[7] = lut[word >> 28];
            }
        } else if (bits == 8)
            DEQUANT_GROUP(8);
        else
            LILY_ASSERT(!"matmul: only 4- and 8-bit weights");
    }
}

void cpu_dequant_rows(const lily_tensor *w, int64_t expert, int64_t row0, int n_rows, float *out)
{
    const int64_t cols = lily_tensor_cols(w);
    const int64_t base = w->ndim == 3 ? expert * w->expert_stride : 0;
    for (int r = 0; r < n_rows; r++) {
        const int64_t prow = base + row0 + r;
        float *o = out + (int64_t)r * cols;
        if (w->bits) {
            dequant_row_quantized(w, prow, cols, o);
            continue;
        }
        const uint8_t *src = row_ptr(w->data, w->row_bytes, prow);
        switch (w->dtype) {
        case LILY_DTYPE_F32:
            memcpy(o, src, (size_t)cols * sizeof(float));
            break;
        case LILY_DTYPE_BF16:
            for (int64_t i = 0; i < cols; i++) {
                uint16_t h;
                memcpy(&h, src + 2 * i, 2);
                o[i] = lily_bf16_to_f32(h);
            }
            break;
        case LILY_DTYPE_F16:
            for (int64_t i = 0; i < cols; i++) {
                uint16_t h;
                memcpy(&h, src + 2 * i, 2);
                o[i] = lily_f16_to_f32(h);
            }
            break;
        default:
            LILY_ASSERT(!"matmul: unsupported weight dtype");
        }
    }
}

/* fp32 dot product with 8 independent partial sums (vectorizable, and closer to the pairwise sums
 * of the reference BLAS than one running sum). */
static float dot(const float *a, const float *b, int64_t n)
{
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * b[i + j];
    float tail = 0;
    for (; i < n; i++)
        tail += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

typedef struct {
    const lily_tensor *w;
    int64_t expert;
    const float *x;
    int n;
    float *y;
    int64_t rows, cols;
    int block_rows;
    bool inputs_f16;
} matmul_job;

static void matmul_task(void *arg, int task, int thread)
{
    (void)thread;
    const matmul_job *j = arg;
    float wbuf[MATMUL_BLOCK_FLOATS];
    const int64_t row0 = (int64_t)task * j->block_rows;
    const int nr = (int)LILY_MIN((int64_t)j->block_rows, j->rows - row0);
    cpu_dequant_rows(j->w, j->expert, row0, nr, wbuf);
    float xr[MATMUL_BLOCK_FLOATS];
    for (int t = 0; t < j->n; t++) {
        const float *xt = j->x + (int64_t)t * j->cols;
        if (j->inputs_f16) {
            for (int64_t i = 0; i < j->cols; i++)
                xr[i] = lily_f16_to_f32(lily_f32_to_f16(xt[i]));
            xt = xr;
        }
        float *yt = j->y + (int64_t)t * j->rows + row0;
        for (int r = 0; r < nr; r++)
            yt[r] = dot(xt, wbuf + (int64_t)r * j->cols, j->cols);
    }
}

void cpu_matmul_expert(const cpu_ctx *c, const lily_tensor *w, int64_t expert, const float *x, int n, float *y)
{
    lily_threadpool *pool = c->pool;
    const int64_t rows = lily_tensor_rows(w), cols = lily_tensor_cols(w);
    LILY_ASSERT(cols <= MATMUL_BLOCK_FLOATS);
    if (cpu_matmul_fast_ok(c, w)) {
        cpu_qact a = c->qact;
        a.cols = cols;
        cpu_quantize_act_rows(c, x, n, cols, &a);
        cpu_qmatmul_expert(c, w, expert, &a, n, y);
        return;
    }
    LILY_ASSERT(w->ndim == 3 ? expert >= 0 && expert < w->shape[0] : expert == 0);
    int block_rows = (int)(MATMUL_BLOCK_FLOATS / cols);
    if (block_rows > 64)
        block_rows = 64;
    /* keep every thread busy on small matrices (decode): at least ~4 tasks per thread */
    const int threads = lily_threadpool_size(pool);
    while (block_rows > 1 && (rows + block_rows - 1) / block_rows < 4 * threads)
        block_rows /= 2;
    matmul_job job = {w, expert, x, n, y, rows, cols, block_rows, c->matmul_inputs_f16};
    parallel_for(pool, (int)((rows + block_rows - 1) / block_rows), matmul_task, &job);
}

void cpu_matmul(const cpu_ctx *c, const lily_tensor *w, const float *x, int n, float *y)
{
    cpu_matmul_expert(c, w, 0, x, n, y);
}
