/* safetensors.c — parse safetensors headers and map the shards of a checkpoint.
 *
 * Owns: the bounds-checked header parser (lily_st_parse, pure, fuzzed by tests/fuzz/fuzz_safetensors.c),
 * finding the shards of a model directory (index.json, model.safetensors or every *.safetensors), the
 * read-only mmap of each shard, and the name -> tensor hash table. Does not own: what the tensors mean
 * (weights.c).
 * Format (huggingface/safetensors README): u64 little-endian N, N bytes of JSON
 * {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the data;
 * offsets are relative to the first byte after the header.
 */
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/json_load.h"

void lily_st_tensors_free(lily_st_tensor *tensors, int n_tensors)
{
    if (!tensors)
        return;
    for (int i = 0; i < n_tensors; i++)
        free(tensors[i].name);
    free(tensors);
}

/* A non-negative JSON integer as uint64; false when it is not one. */
static bool json_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

static int compare_by_offset(const void *a, const void *b)
{
    const lily_st_tensor *x = *(const lily_st_tensor *const *)a, *y = *(const lily_st_tensor *const *)b;
    uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;
    return px < py ? -1 : px > py;
}

/* Parse one header entry into t (name already set). data/data_len: the data section. */
static lily_status parse_entry(const json_t *v, const uint8_t *data, uint64_t data_len, lily_st_tensor *t,
                               lily_error *err)
{
    if (!json_is_object(v))
        return lily_error_set(err, LILY_ERR_FORMAT, "tensor '%s': header entry is not an object", t->name);
    const json_t *dtype = json_object_get(v, "dtype");
    if (!json_is_string(dtype))
        return lily_error_set(err, LILY_ERR_FORMAT, "tensor '%s': missing or non-string \"dtype\"", t->name);
    t->dtype = lily_dtype_from_name(json_string_value(dtype));
    if (t->dtype == LILY_DTYPE_UNKNOWN)
        return lily_error_set(err, LILY_ERR_FORMAT, "tensor '%s': unknown dtype \"%.32s\"", t->name,
                              json_string_value(dtype));

    const json_t *shape = json_object_get(v, "shape");
    if (!json_is_array(shape))
        return lily_error_set(err, LILY_ERR_FORMAT, "tensor '%s': missing or non-list \"shape\"", t->name);
    if (json_array_size(shape) > LILY_MAX_NDIM)
        return lily_error_set(err, LILY_ERR_FORMAT, "tensor '%s': %zu dimensions (at most %d)", t->name,
                              json_array_size(shape), LILY_MAX_NDIM);
    t->ndim = (int)json_array_size(shape);
    uint64_t n_elements = 1;
    bool overflow = false;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t dim;
        if (!json_u64(json_array_get(shape, (size_t)d), &dim))
            return lily_error_set(err, LILY_ERR_FORMAT, "tensor '%s': shape[%d] is not a non-negative integer",
                                  t->name, d);
        if (dim > ((uint64_t)1 << 48))
            return lily_error_set(err, LILY_ERR_FORMAT, "tensor '%s': shape[%d] = %llu is too large (at most 2^48)",
                                  t->name, d, (unsigned long long)dim);
        t->shape[d] = (int64_t)dim;
        if (dim != 0 && n_elements > UINT64_MAX / dim)
            overflow = true;
        n_elements *= dim;
    }
    uint64_t esize = (uint64_t)lily_dtype_size(t->dtype);
    if (overflow || (n_elements != 0 && n_elements > UINT64_MAX / esize))
        return lily_error_set(err, LILY_ERR_FORMAT, "tensor '%s': shape is too large", t->name);

    const json_t *offs = json_object_get(v, "data_offsets");
    uint64_t begin, end;
    if (!json_is_array(offs) || json_array_size(offs) != 2 || !json_u64(json_array_get(offs, 0), &begin) ||
        !json_u64(json_array_get(offs, 1), &end))
        return lily_error_set(err, LILY_ERR_FORMAT,
                              "tensor '%s': \"data_offsets\" must be a list of two non-negative integers", t->name);
    if (end < begin)
        return lily_error_set(err, LILY_ERR_FORMAT, "tensor '%s': data_offsets end %llu < begin %llu", t->name,
                              (unsigned long long)end, (unsigned long long)begin);
    if (end > data_len)
        return lily_error_set(err, LILY_ERR_FORMAT,
                              "tensor '%s': data_offsets [%llu, %llu] out of range (data section is %llu bytes)",
                              t->name, (unsigned long long)begin, (unsigned long long)end,
                              (unsigned long long)data_len);
    if (end - begin != n_elements * esize) {
        char dims[LILY_MAX_NDIM * 21 + 3] = "[";
        for (int d = 0; d < t->ndim; d++)
            snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld", d ? "," : "",
                     (long long)t->shape[d]);
        snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "]");
        return lily_error_set(err, LILY_ERR_FORMAT,
                              "tensor '%s': size mismatch: %llu bytes in data_offsets but shape %s of %s needs %llu",
                              t->name, (unsigned long long)(end - begin), dims, lily_dtype_name(t->dtype),
                              (unsigned long long)(n_elements * esize));
    }
    t->data = data + begin;
    t->nbytes = end - begin;
    return LILY_OK;
}

lily_status lily_st_parse(const uint8_t *buf, size_t len, lily_st_tensor **out, int *n_tensors, lily_error *err)
{
    *out = NULL;
    *n_tensors = 0;
    if (len < 8)
        return lily_error_set(err, LILY_ERR_FORMAT, "file too short (%zu bytes) for a safetensors header", len);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--)
        header_len = header_len << 8 | buf[i];
    if (header_len > len - 8)
        return lily_error_set(err, LILY_ERR_FORMAT,
                              "header length %llu runs past the end of the file (%zu bytes): truncated or not safetensors",
                              (unsigned long long)header_len, len);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)header_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return lily_error_set(err, LILY_ERR_FORMAT, "invalid JSON header at byte %d: %s", jerr.position, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return lily_error_set(err, LILY_ERR_FORMAT, "header is not a JSON object");
    }

    const uint8_t *data = buf + 8 + header_len;
    uint64_t data_len = len - 8 - header_len;
    size_t cap = json_object_size(root);
    lily_st_tensor *tensors = calloc(cap ? cap : 1, sizeof *tensors);
    lily_st_tensor **by_offset = calloc(cap ? cap : 1, sizeof *by_offset);
    lily_status st = LILY_OK;
    int n = 0;
    if (!tensors || !by_offset)
        st = lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory parsing a safetensors header");

    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        if (st != LILY_OK)
            break;
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(value))
                st = lily_error_set(err, LILY_ERR_FORMAT, "\"__metadata__\" is not an object");
            continue;
        }
        lily_st_tensor *t = &tensors[n];
        t->name = strdup(key);
        if (!t->name) {
            st = lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory parsing a safetensors header");
            break;
        }
        n++;
        st = parse_entry(value, data, data_len, t, err);
    }
    json_decref(root);

    /* No two non-empty tensors may share bytes: sort by start, compare neighbours. */
    if (st == LILY_OK) {
        int m = 0;
        for (int i = 0; i < n; i++)
            if (tensors[i].nbytes)
                by_offset[m++] = &tensors[i];
        qsort(by_offset, (size_t)m, sizeof *by_offset, compare_by_offset);
        for (int i = 1; i < m && st == LILY_OK; i++) {
            const lily_st_tensor *a = by_offset[i - 1], *b = by_offset[i];
            if ((const uint8_t *)a->data + a->nbytes > (const uint8_t *)b->data)
                st = lily_error_set(err, LILY_ERR_FORMAT, "tensors '%s' and '%s' overlap in the data section", a->name,
                                    b->name);
        }
    }
    free(by_offset);
    if (st != LILY_OK) {
        lily_st_tensors_free(tensors, n);
        return st;
    }
    *out = tensors;
    *n_tensors = n;
    return LILY_OK;
}

/* --- name -> tensor table: open addressing, FNV-1a, capacity a power of two >= 2n ------------------- */

typedef struct {
    size_t mask;
    int *slots; /* tensor index, -1 empty */
} name_table;

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ULL;
    return h;
}

/* Insert every tensor; on a duplicate name returns its earlier index through *dup (else -1). */
static name_table *table_build(const lily_st_tensor *tensors, int n, int *dup_a, int *dup_b)
{
    name_table *t = malloc(sizeof *t);
    size_t cap = 16;
    while (cap < (size_t)n * 2)
        cap *= 2;
    if (!t || !(t->slots = malloc(cap * sizeof *t->slots))) {
        free(t);
        return NULL;
    }
    t->mask = cap - 1;
    for (size_t i = 0; i < cap; i++)
        t->slots[i] = -1;
    *dup_a = *dup_b = -1;
    for (int i = 0; i < n; i++) {
        size_t s = fnv1a(tensors[i].name) & t->mask;
        while (t->slots[s] >= 0) {
            if (!strcmp(tensors[t->slots[s]].name, tensors[i].name)) {
                *dup_a = t->slots[s];
                *dup_b = i;
                return t;
            }
            s = (s + 1) & t->mask;
        }
        t->slots[s] = i;
    }
    return t;
}

static void table_free(name_table *t)
{
    if (t) {
        free(t->slots);
        free(t);
    }
}

const lily_st_tensor *lily_checkpoint_find(const lily_checkpoint *ckpt, const char *name)
{
    const name_table *t = ckpt->index;
    if (!t)
        return NULL;
    for (size_t s = fnv1a(name) & t->mask; t->slots[s] >= 0; s = (s + 1) & t->mask)
        if (!strcmp(ckpt->tensors[t->slots[s]].name, name))
            return &ckpt->tensors[t->slots[s]];
    return NULL;
}

/* --- shards -------------------------------------------------------------------------------------- */

static int compare_strings(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void free_strings(char **v, int n)
{
    for (int i = 0; v && i < n; i++)
        free(v[i]);
    free(v);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Append a copy of s to the growing list *v (size *n). */
static bool push_string(char ***v, int *n, const char *s)
{
    char **bigger = realloc(*v, (size_t)(*n + 1) * sizeof **v);
    if (!bigger)
        return false;
    *v = bigger;
    if (!(bigger[*n] = strdup(s)))
        return false;
    (*n)++;
    return true;
}

/* The shard file names of model_dir, sorted. Also returns the parsed index (or NULL) for the
 * weight_map cross-check. */
static lily_status list_shards(const char *model_dir, char ***names, int *n_names, json_t **index_out,
                               lily_error *err)
{
    char path[4096];
    *names = NULL;
    *n_names = 0;
    *index_out = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", model_dir);
    if (access(path, F_OK) == 0) {
        lily_status st = lily_check_regular_file(path, err);
        if (st != LILY_OK)
            return st;
        json_error_t jerr;
        json_t *index = lily_json_load_file(path, 0, 0, &jerr);
        if (!index)
            return lily_error_set(err, LILY_ERR_FORMAT, "%s: invalid JSON at line %d: %s", path, jerr.line, jerr.text);
        json_t *map = json_object_get(index, "weight_map");
        if (!json_is_object(map)) {
            json_decref(index);
            return lily_error_set(err, LILY_ERR_FORMAT, "%s: missing \"weight_map\" object", path);
        }
        const char *key;
        json_t *value;
        json_object_foreach(map, key, value) {
            const char *file = json_string_value(value);
            if (!file || !*file || strchr(file, '/') || !strcmp(file, "..")) {
                /* the message first: key lives in index */
                lily_error_set(err, LILY_ERR_FORMAT, "%s: weight_map[\"%s\"] is not a file name in the directory",
                               path, key);
                json_decref(index);
                free_strings(*names, *n_names);
                *names = NULL;
                *n_names = 0;
                return LILY_ERR_FORMAT;
            }
            bool seen = false;
            for (int i = 0; i < *n_names && !seen; i++)
                seen = !strcmp((*names)[i], file);
            if (!seen && !push_string(names, n_names, file)) {
                json_decref(index);
                free_strings(*names, *n_names);
                *names = NULL;
                *n_names = 0;
                return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
            }
        }
        if (*n_names == 0) {
            json_decref(index);
            return lily_error_set(err, LILY_ERR_FORMAT, "%s: weight_map is empty", path);
        }
        *index_out = index;
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", model_dir);
        if (access(path, F_OK) == 0) {
            if (!push_string(names, n_names, "model.safetensors"))
                return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
            return LILY_OK;
        }
        DIR *dir = opendir(model_dir);
        if (!dir)
            return lily_error_set(err, LILY_ERR_IO, "cannot open model directory %s: %s", model_dir, strerror(errno));
        struct dirent *de;
        while ((de = readdir(dir)) != NULL) {
            if (de->d_name[0] == '.' || !ends_with(de->d_name, ".safetensors"))
                continue;
            if (!push_string(names, n_names, de->d_name)) {
                closedir(dir);
                free_strings(*names, *n_names);
                *names = NULL;
                *n_names = 0;
                return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
            }
        }
        closedir(dir);
        if (*n_names == 0)
            return lily_error_set(err, LILY_ERR_IO, "%s: no model.safetensors.index.json and no *.safetensors files",
                                  model_dir);
    }
    qsort(*names, (size_t)*n_names, sizeof **names, compare_strings);
    return LILY_OK;
}

/* mmap one shard read-only. */
static lily_status map_file(const char *path, void **base, size_t *size, lily_error *err)
{
    lily_status st = lily_check_regular_file(path, err);
    if (st != LILY_OK)
        return st;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return lily_error_set(err, LILY_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return lily_error_set(err, LILY_ERR_IO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) { /* a directory or a device: mmap would say only "No such device" */
        close(fd);
        return lily_error_set(err, LILY_ERR_IO, "%s is not a regular file", path);
    }
    if (sb.st_size < 8) {
        close(fd);
        return lily_error_set(err, LILY_ERR_FORMAT, "%s: file too short (%lld bytes) for a safetensors header", path,
                              (long long)sb.st_size);
    }
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED)
        return lily_error_set(err, LILY_ERR_IO, "cannot mmap %s: %s", path, strerror(e));
    *base = p;
    *size = (size_t)sb.st_size;
    return LILY_OK;
}

void lily_checkpoint_close(lily_checkpoint *ckpt)
{
    if (!ckpt)
        return;
    for (int i = 0; ckpt->maps && i < ckpt->n_shards; i++)
        if (ckpt->maps[i])
            munmap(ckpt->maps[i], ckpt->map_sizes[i]);
    free(ckpt->maps);
    free(ckpt->map_sizes);
    lily_st_tensors_free(ckpt->tensors, ckpt->n_tensors);
    table_free(ckpt->index);
    memset(ckpt, 0, sizeof *ckpt);
}

lily_status lily_checkpoint_open(const char *model_dir, lily_checkpoint *ckpt, lily_error *err)
{
    memset(ckpt, 0, sizeof *ckpt);
    char **shards = NULL;
    int n_shards = 0;
    json_t *index = NULL;
    lily_status st = list_shards(model_dir, &shards, &n_shards, &index, err);
    if (st != LILY_OK)
        return st;

    ckpt->maps = calloc((size_t)n_shards, sizeof *ckpt->maps);
    ckpt->map_sizes = calloc((size_t)n_shards, sizeof *ckpt->map_sizes);
    if (!ckpt->maps || !ckpt->map_sizes)
        st = lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory opening %s", model_dir);
    ckpt->n_shards = st == LILY_OK ? n_shards : 0;

    char path[4096];
    for (int s = 0; s < n_shards && st == LILY_OK; s++) {
        snprintf(path, sizeof path, "%s/%s", model_dir, shards[s]);
        st = map_file(path, &ckpt->maps[s], &ckpt->map_sizes[s], err);
        if (st != LILY_OK)
            break;
        lily_st_tensor *part;
        int n_part;
        st = lily_st_parse(ckpt->maps[s], ckpt->map_sizes[s], &part, &n_part, err);
        if (st != LILY_OK) {
            lily_error_prefix(err, "%s", path);
            break;
        }
        lily_st_tensor *all = realloc(ckpt->tensors, (size_t)(ckpt->n_tensors + n_part + 1) * sizeof *all);
        if (!all) {
            lily_st_tensors_free(part, n_part);
            st = lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory opening %s", path);
            break;
        }
        ckpt->tensors = all;
        for (int i = 0; i < n_part; i++) {
            part[i].shard = s;
            all[ckpt->n_tensors++] = part[i];
        }
        free(part); /* names moved into ckpt->tensors */
    }

    if (st == LILY_OK) {
        int a, b;
        ckpt->index = table_build(ckpt->tensors, ckpt->n_tensors, &a, &b);
        if (!ckpt->index)
            st = lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory indexing %s", model_dir);
        else if (a >= 0)
            st = lily_error_set(err, LILY_ERR_FORMAT, "%s: tensor '%s' appears twice (in %s and in %s)", model_dir,
                                ckpt->tensors[a].name, shards[ckpt->tensors[a].shard],
                                shards[ckpt->tensors[b].shard]);
    }

    /* The index must agree with the shards: every tensor it lists is in the shard it names. */
    if (st == LILY_OK && index) {
        const char *key;
        json_t *value;
        json_object_foreach(json_object_get(index, "weight_map"), key, value) {
            const lily_st_tensor *t = lily_checkpoint_find(ckpt, key);
            if (!t || strcmp(shards[t->shard], json_string_value(value)) != 0) {
                st = lily_error_set(err, LILY_ERR_FORMAT,
                                    "%s/model.safetensors.index.json: tensor '%s' is listed in %s but %s", model_dir,
                                    key, json_string_value(value), t ? "stored in another shard" : "not found there");
                break;
            }
        }
    }
    json_decref(index);
    free_strings(shards, n_shards);
    if (st != LILY_OK)
        lily_checkpoint_close(ckpt);
    return st;
}
