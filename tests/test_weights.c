/* test_weights.c — binding both fixture layouts (tests/data/tiny-a/{hf,mlx4}) with the shapes, bits
 * and views weights.h documents; MLX affine unpacking (MODEL.md §3) on hand-made words; the MLX
 * dequantized weights against the HF bf16 weights they were quantized from; and one test per binding
 * error, on copies of the fixtures with an edited header written to a mkdtemp dir. */
#include "test_support.h"

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"

typedef struct {
    lily_config cfg;
    lily_checkpoint ckpt;
    lily_weights w;
} model;

static lily_status open_model(const char *dir, model *m, lily_error *err)
{
    memset(m, 0, sizeof *m);
    lily_status st = lily_config_load(dir, &m->cfg, err);
    if (st == LILY_OK)
        st = lily_checkpoint_open(dir, &m->ckpt, err);
    if (st == LILY_OK) {
        st = lily_weights_bind(&m->cfg, &m->ckpt, &m->w, err);
        if (st != LILY_OK)
            lily_checkpoint_close(&m->ckpt);
    }
    return st;
}

static void close_model(model *m)
{
    lily_weights_free(&m->w);
    lily_checkpoint_close(&m->ckpt);
}

static void assert_shape(const lily_tensor *t, int ndim, int64_t a, int64_t b, int64_t c)
{
    assert_non_null(t->data);
    assert_int_equal(t->ndim, ndim);
    int64_t want[3] = {a, b, c};
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] != want[d])
            fail_msg("%s: shape[%d] = %lld, expected %lld", t->name, d, (long long)t->shape[d], (long long)want[d]);
}

static void test_bind_hf_fixture(void **state)
{
    (void)state;
    model m;
    lily_error err = {0};
    if (open_model(test_data_path("tiny-a/hf"), &m, &err) != LILY_OK)
        fail_msg("%s", err.message);
    const lily_weights *w = &m.w;
    assert_int_equal(w->layout, LILY_LAYOUT_HF);
    assert_true(w->norms_zero_centred);
    assert_int_equal(w->quant_bits, 0);
    assert_int_equal(w->n_layers, 4);
    assert_shape(&w->embed, 2, 512, 128, 0);
    assert_int_equal(w->embed.dtype, LILY_DTYPE_BF16);
    assert_int_equal(w->embed.row_bytes, 256);
    assert_int_equal(w->embed.bits, 0);
    assert_shape(&w->lm_head, 2, 512, 128, 0);
    assert_string_equal(w->lm_head.name, "lm_head.weight");
    assert_shape(&w->final_norm, 1, 128, 0, 0);

    const lily_layer_weights *L0 = &w->layers[0], *L3 = &w->layers[3];
    assert_null(L0->q_proj.data);
    assert_null(L3->in_proj_qkv.data);
    assert_shape(&L0->in_proj_qkv, 2, 256, 128, 0);
    assert_shape(&L0->in_proj_z, 2, 128, 128, 0);
    assert_shape(&L0->in_proj_b, 2, 4, 128, 0);
    assert_shape(&L0->conv1d, 2, 256, 4, 0);
    assert_int_equal(L0->A_log.dtype, LILY_DTYPE_F32); /* Qwen3.5 keeps these two in f32 (MODEL.md §2.1) */
    assert_int_equal(L0->gdn_norm.dtype, LILY_DTYPE_F32);
    assert_shape(&L0->gdn_norm, 1, 32, 0, 0);
    assert_shape(&L0->out_proj, 2, 128, 128, 0);
    assert_shape(&L3->q_proj, 2, 1024, 128, 0);
    assert_shape(&L3->k_proj, 2, 128, 128, 0);
    assert_shape(&L3->o_proj, 2, 128, 512, 0);
    assert_shape(&L3->q_norm, 1, 64, 0, 0);
    assert_shape(&L0->router, 2, 16, 128, 0);
    assert_shape(&L0->shared_expert_gate, 2, 1, 128, 0);
    assert_shape(&L0->shared_down, 2, 128, 64, 0);

    /* fused gate_up_proj [16, 128, 128]: views with expert_stride 2I, up offset by I rows */
    const lily_st_tensor *fused = lily_checkpoint_find(&m.ckpt, "model.language_model.layers.0.mlp.experts.gate_up_proj");
    assert_shape(&L0->experts_gate, 3, 16, 64, 128);
    assert_shape(&L0->experts_up, 3, 16, 64, 128);
    assert_int_equal(L0->experts_gate.expert_stride, 128);
    assert_int_equal(L0->experts_up.expert_stride, 128);
    assert_ptr_equal(L0->experts_gate.data, fused->data);
    assert_ptr_equal(L0->experts_up.data, (const char *)fused->data + 64 * 256);
    assert_int_equal(lily_tensor_bytes_per_matrix(&L0->experts_gate), 64 * 256);
    assert_shape(&L0->experts_down, 3, 16, 128, 64);
    assert_int_equal(L0->experts_down.expert_stride, 128);
    float row[128];
    lily_tensor_dequant_row(&L0->experts_up, 5, 7, 0, 128, row);
    for (int c = 0; c < 128; c++) /* gate_up[5, 64 + 7, c] */
        assert_true(row[c] == lily_load_f32(fused->data, LILY_DTYPE_BF16, (5 * 128 + 64 + 7) * 128 + c));
    lily_tensor_dequant_row(&L0->experts_gate, 15, 63, 64, 64, row);
    for (int c = 0; c < 64; c++)
        assert_true(row[c] == lily_load_f32(fused->data, LILY_DTYPE_BF16, (15 * 128 + 63) * 128 + 64 + c));
    close_model(&m);
}

static void test_bind_mlx4_fixture(void **state)
{
    (void)state;
    model m;
    lily_error err = {0};
    if (open_model(test_data_path("tiny-a/mlx4"), &m, &err) != LILY_OK)
        fail_msg("%s", err.message);
    const lily_weights *w = &m.w;
    assert_int_equal(w->layout, LILY_LAYOUT_MLX);
    assert_false(w->norms_zero_centred);
    assert_int_equal(w->quant_bits, 4);
    assert_shape(&w->embed, 2, 512, 128, 0);
    assert_int_equal(w->embed.bits, 4);
    assert_int_equal(w->embed.group_size, 64);
    assert_int_equal(w->embed.dtype, LILY_DTYPE_U32);
    assert_int_equal(w->embed.scale_dtype, LILY_DTYPE_BF16);
    assert_int_equal(w->embed.row_bytes, 64);       /* 128 cols * 4 bits / 8 */
    assert_int_equal(w->embed.scale_row_bytes, 4);  /* 2 groups * bf16 */
    assert_string_equal(w->embed.name, "language_model.model.embed_tokens.weight");
    assert_int_equal(w->lm_head.bits, 4);
    assert_string_equal(w->lm_head.name, "language_model.lm_head.weight");
    assert_int_equal(lily_tensor_bytes_per_matrix(&w->embed), 512 * (64 + 2 * 4));

    for (int i = 0; i < 4; i++) {
        const lily_layer_weights *L = &w->layers[i];
        assert_shape(&L->router, 2, 16, 128, 0);
        assert_int_equal(L->router.bits, 8);
        assert_int_equal(L->router.row_bytes, 128);
        assert_shape(&L->shared_expert_gate, 2, 1, 128, 0);
        assert_int_equal(L->shared_expert_gate.bits, 8);
        assert_int_equal(L->shared_gate.bits, 4);
        assert_shape(&L->experts_gate, 3, 16, 64, 128);
        assert_int_equal(L->experts_gate.bits, 4);
        assert_int_equal(L->experts_gate.expert_stride, 64);
        assert_shape(&L->experts_down, 3, 16, 128, 64);
        assert_int_equal(L->experts_down.bits, 4);
        assert_int_equal(L->experts_down.group_size, 64);
        assert_int_equal(L->experts_down.row_bytes, 32);
        assert_int_equal(L->experts_down.scale_row_bytes, 2);
        assert_int_equal(L->input_norm.bits, 0);
    }
    assert_shape(&w->layers[0].conv1d, 2, 256, 4, 0);
    assert_int_equal(w->layers[0].conv1d.bits, 0);
    assert_int_equal(w->layers[0].A_log.dtype, LILY_DTYPE_F32);
    assert_shape(&w->layers[3].q_proj, 2, 1024, 128, 0);
    assert_int_equal(w->layers[3].q_proj.bits, 4);
    assert_shape(&w->layers[3].o_proj, 2, 128, 512, 0);
    assert_int_equal(w->layers[3].o_proj.row_bytes, 256);

    /* an embedding row: finite, and of the magnitude of the HF bf16 row it was quantized from */
    float row[128];
    double sum_sq = 0;
    lily_tensor_dequant_row(&w->embed, 0, 17, 0, 128, row);
    for (int c = 0; c < 128; c++) {
        assert_true(isfinite(row[c]));
        sum_sq += (double)row[c] * row[c];
    }
    double rms = sqrt(sum_sq / 128);
    assert_true(rms > 1e-3 && rms < 10.0);
    close_model(&m);
}

/* Largest |scale| + |bias| of tensor t's row (physical), for the quantization error bound. */
static float row_error_bound(const lily_tensor *t, int64_t expert, int64_t row)
{
    int64_t p = expert * t->expert_stride + row, groups = lily_tensor_cols(t) / t->group_size;
    float bound = 0;
    for (int64_t g = 0; g < groups; g++) {
        float s = fabsf(lily_load_f32((const char *)t->scales + p * t->scale_row_bytes, t->scale_dtype, g));
        float b = fabsf(lily_load_f32((const char *)t->biases + p * t->scale_row_bytes, t->scale_dtype, g));
        /* One step: rounding is half a step, but mlx's s = edge / round(edge / s) can shrink the step so
         * the far extreme clips by up to another half (MODEL.md §3 steps 3-5); plus bf16 rounding. */
        float e = 1.0f * s + (float)((1 << t->bits) - 1) * s / 256.0f + b / 256.0f + 1e-6f;
        bound = e > bound ? e : bound;
    }
    return bound;
}

/* Every row of an MLX tensor dequantized vs the HF tensor the fixture quantized it from: checks the
 * packing order, the scales/biases indexing, the expert strides and the gate/up split. */
static void compare_mlx_to_hf(const lily_tensor *mlx, const lily_tensor *hf)
{
    int64_t experts = mlx->ndim == 3 ? mlx->shape[0] : 1, rows = lily_tensor_rows(mlx), cols = lily_tensor_cols(mlx);
    assert_int_equal(lily_tensor_rows(hf), rows);
    assert_int_equal(lily_tensor_cols(hf), cols);
    float a[512], b[512];
    assert_true(cols <= 512);
    double sum_err = 0, sum_bound = 0;
    for (int64_t e = 0; e < experts; e++)
        for (int64_t r = 0; r < rows; r++) {
            lily_tensor_dequant_row(mlx, e, r, 0, cols, a);
            lily_tensor_dequant_row(hf, e, r, 0, cols, b);
            float bound = row_error_bound(mlx, e, r), d = test_max_abs_diff(a, b, (size_t)cols);
            for (int64_t c = 0; c < cols; c++)
                sum_err += fabsf(a[c] - b[c]);
            sum_bound += (double)bound * (double)cols;
            if (d > bound)
                fail_msg("%s expert %lld row %lld: |mlx - hf| = %g > bound %g", mlx->name, (long long)e, (long long)r,
                         d, bound);
        }
    /* Right unpacking: errors average about a quarter step (uniform rounding); a mis-ordered one
     * averages several steps. */
    if (sum_err / sum_bound > 0.35)
        fail_msg("%s: mean |mlx - hf| is %.3f of the one-step bound", mlx->name, sum_err / sum_bound);
}

static void test_mlx4_dequantized_matches_hf(void **state)
{
    (void)state;
    model hf, mlx;
    lily_error err = {0};
    assert_int_equal(open_model(test_data_path("tiny-a/hf"), &hf, &err), LILY_OK);
    assert_int_equal(open_model(test_data_path("tiny-a/mlx4"), &mlx, &err), LILY_OK);
    compare_mlx_to_hf(&mlx.w.embed, &hf.w.embed);
    compare_mlx_to_hf(&mlx.w.lm_head, &hf.w.lm_head);
    for (int i = 0; i < 4; i++) {
        const lily_layer_weights *M = &mlx.w.layers[i], *H = &hf.w.layers[i];
        compare_mlx_to_hf(&M->router, &H->router); /* 8-bit */
        compare_mlx_to_hf(&M->shared_expert_gate, &H->shared_expert_gate);
        compare_mlx_to_hf(&M->experts_gate, &H->experts_gate);
        compare_mlx_to_hf(&M->experts_up, &H->experts_up);
        compare_mlx_to_hf(&M->experts_down, &H->experts_down);
        compare_mlx_to_hf(&M->shared_down, &H->shared_down);
        if (i == 3) {
            compare_mlx_to_hf(&M->q_proj, &H->q_proj);
            compare_mlx_to_hf(&M->o_proj, &H->o_proj);
        } else {
            compare_mlx_to_hf(&M->in_proj_qkv, &H->in_proj_qkv);
            compare_mlx_to_hf(&M->out_proj, &H->out_proj);
            /* conv1d [C,1,K] vs [C,K,1]: same [C,K] values */
            float a[4], b[4];
            for (int c = 0; c < 256; c++) {
                lily_tensor_dequant_row(&M->conv1d, 0, c, 0, 4, a);
                lily_tensor_dequant_row(&H->conv1d, 0, c, 0, 4, b);
                assert_memory_equal(a, b, sizeof a);
            }
            /* MLX norms hold bf16(1 + w) (MODEL.md §2.3 step 5) */
            float n_mlx[128], n_hf[128];
            lily_tensor_dequant_row(&M->input_norm, 0, 0, 0, 128, n_mlx);
            lily_tensor_dequant_row(&H->input_norm, 0, 0, 0, 128, n_hf);
            for (int c = 0; c < 128; c++)
                assert_true(fabsf(n_mlx[c] - (1.0f + n_hf[c])) <= 1.0f / 256);
        }
    }
    close_model(&hf);
    close_model(&mlx);
}

/* --- hand-made affine words (MODEL.md §3) -------------------------------------------------------- */

static void test_dequant_4bit_low_nibble_first_negative_scale(void **state)
{
    (void)state;
    /* one row of 64 columns (one group), 4-bit: 8 words. Column 8m + j = (word[m] >> 4j) & 0xF. */
    uint32_t words[8];
    for (int m = 0; m < 8; m++) {
        words[m] = 0;
        for (int j = 0; j < 8; j++)
            words[m] |= (uint32_t)((m + j * 3) & 0xF) << (4 * j);
    }
    uint16_t scale = lily_f32_to_bf16(-0.25f), bias = lily_f32_to_bf16(1.5f);
    lily_tensor t = {.name = "hand", .data = words, .dtype = LILY_DTYPE_U32, .ndim = 2, .shape = {1, 64},
                     .bits = 4, .group_size = 64, .scales = &scale, .biases = &bias,
                     .scale_dtype = LILY_DTYPE_BF16, .expert_stride = 1, .row_bytes = 32, .scale_row_bytes = 2};
    float out[64];
    lily_tensor_dequant_row(&t, 0, 0, 0, 64, out);
    for (int c = 0; c < 64; c++) {
        int q = ((c / 8) + (c % 8) * 3) & 0xF;
        assert_true(out[c] == -0.25f * (float)q + 1.5f);
    }
    /* column 1 is the high nibble of byte 0 */
    uint8_t byte0;
    memcpy(&byte0, words, 1);
    assert_true(out[0] == -0.25f * (float)(byte0 & 0xF) + 1.5f);
    assert_true(out[1] == -0.25f * (float)(byte0 >> 4) + 1.5f);
}

static void test_dequant_8bit_two_groups_and_experts(void **state)
{
    (void)state;
    /* 2 experts x 2 rows x 128 cols at 8 bits, group 64: 32 words per row; f16 scales to cover that path */
    uint32_t words[2 * 2 * 32];
    uint16_t scales[2 * 2 * 2], biases[2 * 2 * 2];
    for (int p = 0; p < 4; p++) {
        for (int m = 0; m < 32; m++) {
            words[p * 32 + m] = 0;
            for (int j = 0; j < 4; j++)
                words[p * 32 + m] |= (uint32_t)((p * 37 + m * 4 + j) & 0xFF) << (8 * j);
        }
        for (int g = 0; g < 2; g++) {
            scales[p * 2 + g] = g ? 0xB800 /* f16 -0.5 */ : 0x2C00 /* f16 0.0625 */;
            biases[p * 2 + g] = g ? 0x4400 /* f16 4 */ : 0xBC00 /* f16 -1 */;
        }
    }
    lily_tensor t = {.name = "hand8", .data = words, .dtype = LILY_DTYPE_U32, .ndim = 3, .shape = {2, 2, 128},
                     .bits = 8, .group_size = 64, .scales = scales, .biases = biases,
                     .scale_dtype = LILY_DTYPE_F16, .expert_stride = 2, .row_bytes = 128, .scale_row_bytes = 4};
    float out[128];
    for (int e = 0; e < 2; e++)
        for (int r = 0; r < 2; r++) {
            int p = e * 2 + r;
            lily_tensor_dequant_row(&t, e, r, 0, 128, out);
            for (int c = 0; c < 128; c++) {
                int q = (p * 37 + c) & 0xFF; /* byte j of word m is column 4m + j */
                float want = c < 64 ? 0.0625f * (float)q - 1.0f : -0.5f * (float)q + 4.0f;
                if (out[c] != want)
                    fail_msg("expert %d row %d col %d: %g != %g", e, r, c, out[c], want);
            }
            lily_tensor_dequant_row(&t, e, r, 64, 64, out); /* second group alone */
            assert_true(out[0] == -0.5f * (float)((p * 37 + 64) & 0xFF) + 4.0f);
        }
}

/* --- error cases on edited copies of the fixtures ------------------------------------------------- */

typedef void (*header_edit)(json_t *header, const char *arg);

static void write_bytes(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    fclose(f);
}

/* The bytes of the safetensors file at path (*len), its header length (*header_len) and parsed header. */
static uint8_t *read_shard(const char *path, size_t *len, uint64_t *header_len, json_t **header)
{
    uint8_t *buf = (uint8_t *)test_read_file(path, len);
    assert_non_null(buf);
    uint64_t h = 0;
    for (int i = 7; i >= 0; i--)
        h = h << 8 | buf[i];
    *header_len = h;
    *header = json_loadb((const char *)buf + 8, (size_t)h, 0, NULL);
    assert_non_null(*header);
    return buf;
}

/* Copy tests/data/<src> into a new mkdtemp dir (returned in dir), passing every shard's header through
 * edit(header, arg) and rewriting the index's weight_map from the edited headers. */
static void make_variant(const char *src, header_edit edit, const char *arg, char *dir)
{
    strcpy(dir, "/tmp/lily_test_weights_XXXXXX");
    assert_non_null(mkdtemp(dir));
    char path[1024], out_path[1024];
    snprintf(path, sizeof path, "%s/config.json", test_data_path(src));
    size_t len;
    char *text = test_read_file(path, &len);
    assert_non_null(text);
    snprintf(out_path, sizeof out_path, "%s/config.json", dir);
    write_bytes(out_path, text, len);
    free(text);

    json_t *weight_map = json_object();
    char src_dir[512];
    snprintf(src_dir, sizeof src_dir, "%s", test_data_path(src));
    DIR *d = opendir(src_dir);
    assert_non_null(d);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        if (n < 12 || strcmp(de->d_name + n - 12, ".safetensors") != 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", src_dir, de->d_name);
        uint64_t h;
        json_t *header;
        uint8_t *buf = read_shard(path, &len, &h, &header);
        edit(header, arg);
        const char *key;
        json_t *v;
        json_object_foreach(header, key, v)
            if (strcmp(key, "__metadata__"))
                json_object_set_new(weight_map, key, json_string(de->d_name));
        char *htext = json_dumps(header, JSON_COMPACT);
        size_t hn = strlen(htext), padded = (hn + 7) / 8 * 8;
        uint8_t *out = malloc(8 + padded + (len - 8 - h));
        for (int i = 0; i < 8; i++)
            out[i] = (uint8_t)((uint64_t)padded >> (8 * i));
        memcpy(out + 8, htext, hn);
        memset(out + 8 + hn, ' ', padded - hn);
        memcpy(out + 8 + padded, buf + 8 + h, len - 8 - h);
        snprintf(out_path, sizeof out_path, "%s/%s", dir, de->d_name);
        write_bytes(out_path, out, 8 + padded + (len - 8 - h));
        free(out);
        free(htext);
        free(buf);
        json_decref(header);
    }
    closedir(d);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", src_dir);
    if (access(path, F_OK) == 0) {
        json_t *index = json_pack("{s:{},s:o}", "metadata", "weight_map", weight_map);
        snprintf(out_path, sizeof out_path, "%s/model.safetensors.index.json", dir);
        assert_int_equal(json_dump_file(index, out_path, 0), 0);
        json_decref(index);
    } else {
        json_decref(weight_map);
    }
}

static void remove_variant(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *de;
    char path[512];
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static void edit_delete(json_t *header, const char *name) { json_object_del(header, name); }

/* arg: "name|json-for-shape" */
static void edit_shape(json_t *header, const char *arg)
{
    char name[256];
    const char *bar = strchr(arg, '|');
    snprintf(name, sizeof name, "%.*s", (int)(bar - arg), arg);
    json_t *t = json_object_get(header, name);
    if (t)
        json_object_set_new(t, "shape", json_loads(bar + 1, JSON_DECODE_ANY, NULL));
}

/* arg: "name|DTYPE" */
static void edit_dtype(json_t *header, const char *arg)
{
    char name[256];
    const char *bar = strchr(arg, '|');
    snprintf(name, sizeof name, "%.*s", (int)(bar - arg), arg);
    json_t *t = json_object_get(header, name);
    if (t)
        json_object_set_new(t, "dtype", json_string(bar + 1));
}

/* arg: "name|json-shape|bytes": reshape and shrink the data range to `bytes` */
static void edit_shape_and_size(json_t *header, const char *arg)
{
    char name[256], shape[64];
    const char *bar = strchr(arg, '|'), *bar2 = strchr(bar + 1, '|');
    snprintf(name, sizeof name, "%.*s", (int)(bar - arg), arg);
    snprintf(shape, sizeof shape, "%.*s", (int)(bar2 - bar - 1), bar + 1);
    json_t *t = json_object_get(header, name);
    if (!t)
        return;
    json_object_set_new(t, "shape", json_loads(shape, 0, NULL));
    json_t *offs = json_object_get(t, "data_offsets");
    json_int_t begin = json_integer_value(json_array_get(offs, 0));
    json_array_set_new(offs, 1, json_integer(begin + atoi(bar2 + 1)));
}

/* Bind a variant and expect `status` with every non-NULL needle in the message. */
static void expect_bind_error(const char *src, header_edit edit, const char *arg, lily_status status, const char *n1,
                              const char *n2, const char *n3)
{
    char dir[64];
    make_variant(src, edit, arg, dir);
    model m;
    lily_error err = {0};
    lily_status st = open_model(dir, &m, &err);
    remove_variant(dir);
    if (st == LILY_OK)
        close_model(&m);
    if (st != status)
        fail_msg("status %s (%s), expected %s", lily_status_name(st), err.message, lily_status_name(status));
    const char *needles[3] = {n1, n2, n3};
    for (int i = 0; i < 3; i++)
        if (needles[i] && !strstr(err.message, needles[i]))
            fail_msg("message '%s' lacks '%s'", err.message, needles[i]);
}

static void edit_none(json_t *header, const char *arg)
{
    (void)header;
    (void)arg;
}

/* Overwrite element `index` (from the end when negative) of tensor `name` in the variant at dir with the
 * BF16/F16 bit pattern bits16 or the F32 pattern bits32, whichever the tensor's dtype takes. */
static void poison(const char *dir, const char *name, long index, uint16_t bits16, uint32_t bits32)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *de;
    bool done = false;
    while (!done && (de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        if (n < 12 || strcmp(de->d_name + n - 12, ".safetensors") != 0)
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        size_t len;
        uint64_t h;
        json_t *header;
        uint8_t *buf = read_shard(path, &len, &h, &header);
        json_t *t = json_object_get(header, name);
        if (t) {
            const char *dtype = json_string_value(json_object_get(t, "dtype"));
            const size_t size = !strcmp(dtype, "F32") ? 4 : 2;
            json_t *offs = json_object_get(t, "data_offsets");
            const size_t begin = (size_t)json_integer_value(json_array_get(offs, 0));
            const size_t end = (size_t)json_integer_value(json_array_get(offs, 1));
            const size_t at = 8 + (size_t)h + (index >= 0 ? begin + (size_t)index * size : end - (size_t)-index * size);
            if (size == 4)
                memcpy(buf + at, &bits32, 4);
            else
                memcpy(buf + at, &bits16, 2);
            write_bytes(path, buf, len);
            done = true;
        }
        json_decref(header);
        free(buf);
    }
    closedir(d);
    assert_true(done);
}

/* A variant of src with one poisoned element must fail to bind with every needle in the message. */
static void expect_non_finite_refused(const char *src, const char *name, long index, uint16_t bits16,
                                      uint32_t bits32, const char *needle)
{
    char dir[64];
    make_variant(src, edit_none, NULL, dir);
    poison(dir, name, index, bits16, bits32);
    model m;
    lily_error err = {0};
    lily_status st = open_model(dir, &m, &err);
    remove_variant(dir);
    if (st == LILY_OK)
        close_model(&m);
    if (st != LILY_ERR_MODEL || !strstr(err.message, needle) || !strstr(err.message, "not finite"))
        fail_msg("%s: status %s, message '%s' (want '%s' ... not finite)", name, lily_status_name(st), err.message,
                 needle);
}

static void test_loader_rejects_non_finite_values(void **state)
{
    (void)state;
    const uint16_t bf16_nan = 0x7fc0, bf16_inf = 0x7f80, bf16_ninf = 0xff80;
    const uint32_t f32_nan = 0x7fc00000u;
    /* a norm, a plain BF16 weight (last element), an F32 vector, a fused expert tensor's "up" half */
    expect_non_finite_refused("tiny-a/hf", "model.language_model.norm.weight", 3, bf16_nan, 0,
                              "model.language_model.norm.weight: element 3 of 128");
    expect_non_finite_refused("tiny-a/hf", "lm_head.weight", -1, bf16_inf, 0, "lm_head.weight: element 65535 of 65536");
    expect_non_finite_refused("tiny-a/hf", "model.language_model.layers.2.linear_attn.A_log", 0, 0, f32_nan,
                              "model.language_model.layers.2.linear_attn.A_log: element 0");
    expect_non_finite_refused("tiny-a/hf", "model.language_model.layers.3.mlp.experts.gate_up_proj", -1, bf16_ninf, 0,
                              "model.language_model.layers.3.mlp.experts.gate_up_proj");
    /* MLX: scales and biases of a quantized tensor, a norm holding 1 + w */
    expect_non_finite_refused("tiny-a/mlx4", "language_model.lm_head.scales", 5, bf16_nan, 0,
                              "language_model.lm_head.scales: element 5");
    expect_non_finite_refused("tiny-a/mlx4", "language_model.model.layers.1.mlp.switch_mlp.down_proj.biases", -1,
                              bf16_inf, 0, "language_model.model.layers.1.mlp.switch_mlp.down_proj.biases");
    expect_non_finite_refused("tiny-a/mlx4", "language_model.model.layers.0.input_layernorm.weight", 0, bf16_nan, 0,
                              "language_model.model.layers.0.input_layernorm.weight");
}

static void test_loader_rejects_missing_tensor(void **state)
{
    (void)state;
    expect_bind_error("tiny-a/mlx4", edit_delete, "language_model.model.layers.1.linear_attn.dt_bias", LILY_ERR_MODEL,
                      "language_model.model.layers.1.linear_attn.dt_bias", "missing", NULL);
    expect_bind_error("tiny-a/hf", edit_delete, "model.language_model.layers.2.mlp.experts.gate_up_proj",
                      LILY_ERR_MODEL, "model.language_model.layers.2.mlp.experts.gate_up_proj", "missing", NULL);
    expect_bind_error("tiny-a/hf", edit_delete, "lm_head.weight", LILY_ERR_MODEL, "lm_head.weight", NULL, NULL);
}

static void test_loader_rejects_wrong_shape(void **state)
{
    (void)state;
    /* the router transposed: same bytes, wrong shape */
    expect_bind_error("tiny-a/hf", edit_shape, "model.language_model.layers.1.mlp.gate.weight|[128,16]",
                      LILY_ERR_MODEL, "model.language_model.layers.1.mlp.gate.weight: expected [16,128]",
                      "found [128,16] BF16", NULL);
    expect_bind_error("tiny-a/hf", edit_shape, "model.language_model.layers.0.linear_attn.conv1d.weight|[256,2,2]",
                      LILY_ERR_MODEL, "conv1d.weight: expected [256,1,4] or [256,4,1]", "found [256,2,2]", NULL);
    expect_bind_error("tiny-a/mlx4", edit_shape, "language_model.model.layers.2.mlp.gate.weight|[32,16]",
                      LILY_ERR_MODEL, "layers.2.mlp.gate.weight: expected [16,16] U32 (4-bit) or [16,32] U32 (8-bit)",
                      "found [32,16] U32", NULL);
}

static void test_loader_rejects_wrong_dtype(void **state)
{
    (void)state;
    expect_bind_error("tiny-a/hf", edit_dtype, "model.language_model.layers.0.linear_attn.A_log|I32", LILY_ERR_MODEL,
                      "linear_attn.A_log: expected [4] BF16|F16|F32", "found [4] I32", NULL);
    expect_bind_error("tiny-a/mlx4", edit_dtype, "language_model.model.layers.0.mlp.switch_mlp.up_proj.weight|I32",
                      LILY_ERR_MODEL, "switch_mlp.up_proj.weight: expected", "U32", "found [16,64,16] I32");
}

static void test_loader_rejects_3bit(void **state)
{
    (void)state;
    /* in_proj_a [4,16] U32 at 4 bits -> [4,12] (32*12/128 = 3 bits) */
    expect_bind_error("tiny-a/mlx4", edit_shape_and_size, "language_model.model.layers.0.linear_attn.in_proj_a.weight|[4,12]|192",
                      LILY_ERR_UNSUPPORTED, "in_proj_a.weight", "3-bit", NULL);
}

static void test_loader_rejects_bad_scales(void **state)
{
    (void)state;
    expect_bind_error("tiny-a/mlx4", edit_delete, "language_model.model.layers.0.linear_attn.in_proj_z.biases",
                      LILY_ERR_UNSUPPORTED, "in_proj_z.biases", NULL, NULL);
    expect_bind_error("tiny-a/mlx4", edit_shape, "language_model.model.layers.0.linear_attn.in_proj_z.scales|[256]",
                      LILY_ERR_MODEL, "in_proj_z.scales: expected [128,2]", "found [256] BF16", NULL);
}

/* HF per-expert tensors (the MTP head's layout, MODEL.md §2.2): rewrite layer 1's fused experts as
 * mlp.experts.{e}.{gate,up,down}_proj.weight slices of the same bytes; the stacked result must equal
 * the fused views. */
static void split_experts(json_t *header, const char *arg)
{
    (void)arg;
    const int E = 16, I = 64, H = 128;
    const char *lp = "model.language_model.layers.1.mlp.experts.";
    char name[256];
    snprintf(name, sizeof name, "%sgate_up_proj", lp);
    json_t *gu = json_object_get(header, name);
    if (!gu)
        return;
    json_int_t gu0 = json_integer_value(json_array_get(json_object_get(gu, "data_offsets"), 0));
    snprintf(name, sizeof name, "%sdown_proj", lp);
    json_int_t d0 = json_integer_value(json_array_get(json_object_get(json_object_get(header, name), "data_offsets"), 0));
    for (int e = 0; e < E; e++) {
        json_int_t g = gu0 + (json_int_t)e * 2 * I * H * 2, u = g + (json_int_t)I * H * 2,
                   dn = d0 + (json_int_t)e * H * I * 2;
        snprintf(name, sizeof name, "%s%d.gate_proj.weight", lp, e);
        json_object_set_new(header, name, json_pack("{s:s,s:[i,i],s:[I,I]}", "dtype", "BF16", "shape", I, H,
                                                    "data_offsets", g, g + I * H * 2));
        snprintf(name, sizeof name, "%s%d.up_proj.weight", lp, e);
        json_object_set_new(header, name, json_pack("{s:s,s:[i,i],s:[I,I]}", "dtype", "BF16", "shape", I, H,
                                                    "data_offsets", u, u + I * H * 2));
        snprintf(name, sizeof name, "%s%d.down_proj.weight", lp, e);
        json_object_set_new(header, name, json_pack("{s:s,s:[i,i],s:[I,I]}", "dtype", "BF16", "shape", H, I,
                                                    "data_offsets", dn, dn + H * I * 2));
    }
    snprintf(name, sizeof name, "%sgate_up_proj", lp);
    json_object_del(header, name);
    snprintf(name, sizeof name, "%sdown_proj", lp);
    json_object_del(header, name);
}

static void test_bind_hf_per_expert_stacked(void **state)
{
    (void)state;
    char dir[64];
    make_variant("tiny-a/hf", split_experts, NULL, dir);
    model split, fused;
    lily_error err = {0};
    lily_status st = open_model(dir, &split, &err);
    remove_variant(dir);
    if (st != LILY_OK)
        fail_msg("%s", err.message);
    assert_int_equal(open_model(test_data_path("tiny-a/hf"), &fused, &err), LILY_OK);
    const lily_layer_weights *S = &split.w.layers[1], *F = &fused.w.layers[1];
    assert_null(lily_checkpoint_find(&split.ckpt, "model.language_model.layers.1.mlp.experts.gate_up_proj"));
    assert_shape(&S->experts_gate, 3, 16, 64, 128);
    assert_int_equal(S->experts_gate.expert_stride, 64);
    assert_shape(&S->experts_down, 3, 16, 128, 64);
    const lily_tensor *pairs[3][2] = {{&S->experts_gate, &F->experts_gate}, {&S->experts_up, &F->experts_up},
                                      {&S->experts_down, &F->experts_down}};
    float a[128], b[128];
    for (int k = 0; k < 3; k++)
        for (int e = 0; e < 16; e++)
            for (int r = 0; r < lily_tensor_rows(pairs[k][0]); r++) {
                int64_t cols = lily_tensor_cols(pairs[k][0]);
                lily_tensor_dequant_row(pairs[k][0], e, r, 0, cols, a);
                lily_tensor_dequant_row(pairs[k][1], e, r, 0, cols, b);
                assert_memory_equal(a, b, (size_t)cols * sizeof(float));
            }
    close_model(&split);
    close_model(&fused);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bind_hf_fixture),
        cmocka_unit_test(test_bind_mlx4_fixture),
        cmocka_unit_test(test_mlx4_dequantized_matches_hf),
        cmocka_unit_test(test_dequant_4bit_low_nibble_first_negative_scale),
        cmocka_unit_test(test_dequant_8bit_two_groups_and_experts),
        cmocka_unit_test(test_loader_rejects_non_finite_values),
        cmocka_unit_test(test_loader_rejects_missing_tensor),
        cmocka_unit_test(test_loader_rejects_wrong_shape),
        cmocka_unit_test(test_loader_rejects_wrong_dtype),
        cmocka_unit_test(test_loader_rejects_3bit),
        cmocka_unit_test(test_loader_rejects_bad_scales),
        cmocka_unit_test(test_bind_hf_per_expert_stacked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
