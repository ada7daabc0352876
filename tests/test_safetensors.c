/* test_safetensors.c — the safetensors header parser and checkpoint opening: the fixture shards
 * (tests/data/tiny-a), and one test per malformed-file error, built in memory or in a mkdtemp dir. */
#include "test_support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/safetensors.h"

/* A safetensors image: u64 LE header length, header, data_len bytes of data (byte i = i & 0xff). */
static uint8_t *make_st(const char *header, size_t data_len, size_t *len)
{
    size_t h = strlen(header);
    *len = 8 + h + data_len;
    uint8_t *buf = malloc(*len ? *len : 1);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, header, h);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + h + i] = (uint8_t)i;
    return buf;
}

/* Parse header+data and expect failure with each of `needles` in the message. */
static void expect_parse_error(const char *header, size_t data_len, const char *needle1, const char *needle2)
{
    size_t len;
    uint8_t *buf = make_st(header, data_len, &len);
    lily_st_tensor *t = (lily_st_tensor *)1;
    int n = -1;
    lily_error err = {0};
    assert_int_equal(lily_st_parse(buf, len, &t, &n, &err), LILY_ERR_FORMAT);
    assert_null(t);
    assert_int_equal(n, 0);
    if (!strstr(err.message, needle1) || (needle2 && !strstr(err.message, needle2)))
        fail_msg("message '%s' lacks '%s' / '%s'", err.message, needle1, needle2 ? needle2 : "");
    free(buf);
}

static void test_st_parse_valid(void **state)
{
    (void)state;
    const char *header = "{\"__metadata__\":{\"format\":\"pt\"},"
                         "\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                         "\"b\":{\"dtype\":\"U32\",\"shape\":[2],\"data_offsets\":[12,20]},"
                         "\"empty\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[20,20]}}";
    size_t len;
    uint8_t *buf = make_st(header, 20, &len);
    lily_st_tensor *t;
    int n;
    lily_error err = {0};
    assert_int_equal(lily_st_parse(buf, len, &t, &n, &err), LILY_OK);
    assert_int_equal(n, 3);
    const uint8_t *data = buf + 8 + strlen(header);
    for (int i = 0; i < n; i++) {
        if (!strcmp(t[i].name, "a")) {
            assert_int_equal(t[i].dtype, LILY_DTYPE_BF16);
            assert_int_equal(t[i].ndim, 2);
            assert_int_equal(t[i].shape[0], 2);
            assert_int_equal(t[i].shape[1], 3);
            assert_ptr_equal(t[i].data, data);
            assert_int_equal(t[i].nbytes, 12);
        } else if (!strcmp(t[i].name, "b")) {
            assert_int_equal(t[i].dtype, LILY_DTYPE_U32);
            assert_ptr_equal(t[i].data, data + 12);
            assert_int_equal(((const uint8_t *)t[i].data)[0], 12);
        } else {
            assert_string_equal(t[i].name, "empty");
            assert_int_equal(t[i].nbytes, 0);
        }
    }
    lily_st_tensors_free(t, n);
    free(buf);
}

static void test_loader_rejects_truncated_header(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = make_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &len);
    lily_st_tensor *t;
    int n;
    lily_error err = {0};
    /* header claims more bytes than the file has */
    assert_int_equal(lily_st_parse(buf, 30, &t, &n, &err), LILY_ERR_FORMAT);
    assert_non_null(strstr(err.message, "past the end of the file"));
    assert_int_equal(lily_st_parse(buf, 5, &t, &n, &err), LILY_ERR_FORMAT);
    assert_non_null(strstr(err.message, "too short"));
    buf[7] = 0x80; /* absurd 2^63-byte header */
    assert_int_equal(lily_st_parse(buf, len, &t, &n, &err), LILY_ERR_FORMAT);
    free(buf);
}

static void test_loader_rejects_invalid_json(void **state)
{
    (void)state;
    expect_parse_error("{\"a\":{\"dtype\":\"F32\",", 0, "invalid JSON", NULL);
    expect_parse_error("[1,2,3]", 0, "not a JSON object", NULL);
    expect_parse_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                       8, "invalid JSON", "duplicate");
    expect_parse_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "'a'", "shape");
    expect_parse_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "'a'", "data_offsets");
    expect_parse_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "'a'",
                       "dimensions");
}

static void test_loader_rejects_unknown_dtype(void **state)
{
    (void)state;
    expect_parse_error("{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'w'", "Q4_K");
}

static void test_loader_rejects_offsets_out_of_range(void **state)
{
    (void)state;
    expect_parse_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 12, "'w'", "out of range");
    expect_parse_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 12, "'w'", "< begin");
}

static void test_loader_rejects_overlapping_tensors(void **state)
{
    (void)state;
    expect_parse_error("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                       12, "'x' and 'y' overlap", NULL);
}

static void test_loader_rejects_size_mismatch(void **state)
{
    (void)state;
    expect_parse_error("{\"w\":{\"dtype\":\"BF16\",\"shape\":[3,2],\"data_offsets\":[0,8]}}", 8, "'w'",
                       "size mismatch: 8 bytes in data_offsets but shape [3,2] of BF16 needs 12");
    expect_parse_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,8]}}", 8, "'w'",
                       "size mismatch: 8 bytes in data_offsets but shape [] of F32 needs 4");
}

/* a dimension past 2^48 is named as too large, not as "not a non-negative integer" */
static void test_loader_rejects_huge_dimension(void **state)
{
    (void)state;
    expect_parse_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,281474976710657],\"data_offsets\":[0,4]}}", 4, "'w'",
                       "shape[1] = 281474976710657 is too large (at most 2^48)");
    expect_parse_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "'w'",
                       "shape[0] is not a non-negative integer");
}

/* The HF fixture: two shards listed by model.safetensors.index.json. */
static void test_checkpoint_open_sharded_hf(void **state)
{
    (void)state;
    lily_checkpoint ck;
    lily_error err = {0};
    assert_int_equal(lily_checkpoint_open(test_data_path("tiny-a/hf"), &ck, &err), LILY_OK);
    assert_int_equal(ck.n_shards, 2);
    assert_int_equal(ck.n_tensors, 72);
    const lily_st_tensor *t = lily_checkpoint_find(&ck, "model.language_model.layers.0.mlp.experts.gate_up_proj");
    assert_non_null(t);
    assert_int_equal(t->dtype, LILY_DTYPE_BF16);
    assert_int_equal(t->ndim, 3);
    assert_int_equal(t->shape[0], 16);
    assert_int_equal(t->shape[1], 128);
    assert_int_equal(t->shape[2], 128);
    assert_int_equal(t->shard, 0);
    t = lily_checkpoint_find(&ck, "model.language_model.layers.0.linear_attn.A_log");
    assert_non_null(t);
    assert_int_equal(t->dtype, LILY_DTYPE_F32);
    uint64_t total = 0;
    for (int i = 0; i < ck.n_tensors; i++)
        total += ck.tensors[i].nbytes;
    assert_int_equal(total, 4489160); /* metadata.total_size of the index */
    assert_null(lily_checkpoint_find(&ck, "model.language_model.layers.0.mlp.experts.gate_up"));
    lily_checkpoint_close(&ck);
}

static void test_checkpoint_open_single_mlx(void **state)
{
    (void)state;
    lily_checkpoint ck;
    lily_error err = {0};
    assert_int_equal(lily_checkpoint_open(test_data_path("tiny-a/mlx4"), &ck, &err), LILY_OK);
    assert_int_equal(ck.n_shards, 1);
    assert_int_equal(ck.n_tensors, 182);
    const lily_st_tensor *t = lily_checkpoint_find(&ck, "language_model.model.layers.3.mlp.gate.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, LILY_DTYPE_U32);
    assert_int_equal(t->shape[1], 32);
    lily_checkpoint_close(&ck);
}

static void write_file(const char *path, const uint8_t *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    fclose(f);
}

/* No index and no model.safetensors: every *.safetensors, sorted; a name in two shards is an error;
 * a malformed shard's error starts with its path. */
static void test_checkpoint_open_directory_scan(void **state)
{
    (void)state;
    char dir[] = "/tmp/lily_test_st_XXXXXX", a[128], b[128];
    assert_non_null(mkdtemp(dir));
    snprintf(a, sizeof a, "%s/b-part.safetensors", dir);
    snprintf(b, sizeof b, "%s/a-part.safetensors", dir);
    size_t len;
    uint8_t *buf = make_st("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &len);
    write_file(a, buf, len);
    free(buf);
    buf = make_st("{\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &len);
    write_file(b, buf, len);
    free(buf);

    lily_checkpoint ck;
    lily_error err = {0};
    assert_int_equal(lily_checkpoint_open(dir, &ck, &err), LILY_OK);
    assert_int_equal(ck.n_shards, 2);
    assert_int_equal(lily_checkpoint_find(&ck, "y")->shard, 0); /* a-part sorts first */
    assert_int_equal(lily_checkpoint_find(&ck, "x")->shard, 1);
    lily_checkpoint_close(&ck);

    buf = make_st("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &len);
    write_file(b, buf, len);
    assert_int_equal(lily_checkpoint_open(dir, &ck, &err), LILY_ERR_FORMAT);
    assert_non_null(strstr(err.message, "'x' appears twice"));

    write_file(b, buf, len - 10); /* truncated */
    free(buf);
    assert_int_equal(lily_checkpoint_open(dir, &ck, &err), LILY_ERR_FORMAT);
    assert_non_null(strstr(err.message, b));
    unlink(a);
    unlink(b);
    assert_int_equal(lily_checkpoint_open(dir, &ck, &err), LILY_ERR_IO);
    rmdir(dir);
}

/* An index whose weight_map points outside the directory is refused, naming the tensor (the message was
 * formatted from the parsed index after it was freed: ASan's heap-use-after-free). */
static void test_checkpoint_index_file_outside(void **state)
{
    (void)state;
    char dir[] = "/tmp/lily_test_st_XXXXXX", path[128];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    const char *index = "{\"weight_map\": {\"model.language_model.layers.0.mlp.gate.weight\": \"../x.safetensors\"}}";
    write_file(path, (const uint8_t *)index, strlen(index));
    lily_checkpoint ck;
    lily_error err = {0};
    assert_int_equal(lily_checkpoint_open(dir, &ck, &err), LILY_ERR_FORMAT);
    if (!strstr(err.message, "weight_map[\"model.language_model.layers.0.mlp.gate.weight\"] is not a file name"))
        fail_msg("message '%s' does not name the tensor", err.message);
    unlink(path);
    rmdir(dir);
}

/* A model.safetensors that is a directory is named as not a regular file (mmap said "No such device"). */
static void test_checkpoint_shard_not_a_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/lily_test_st_XXXXXX", path[128];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(mkdir(path, 0700), 0);
    lily_checkpoint ck;
    lily_error err = {0};
    assert_int_equal(lily_checkpoint_open(dir, &ck, &err), LILY_ERR_IO);
    if (!strstr(err.message, "model.safetensors: not a regular file (a directory)"))
        fail_msg("message '%s'", err.message);
    rmdir(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_st_parse_valid),
        cmocka_unit_test(test_loader_rejects_truncated_header),
        cmocka_unit_test(test_loader_rejects_invalid_json),
        cmocka_unit_test(test_loader_rejects_unknown_dtype),
        cmocka_unit_test(test_loader_rejects_offsets_out_of_range),
        cmocka_unit_test(test_loader_rejects_overlapping_tensors),
        cmocka_unit_test(test_loader_rejects_size_mismatch),
        cmocka_unit_test(test_loader_rejects_huge_dimension),
        cmocka_unit_test(test_checkpoint_open_sharded_hf),
        cmocka_unit_test(test_checkpoint_open_single_mlx),
        cmocka_unit_test(test_checkpoint_open_directory_scan),
        cmocka_unit_test(test_checkpoint_index_file_outside),
        cmocka_unit_test(test_checkpoint_shard_not_a_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
