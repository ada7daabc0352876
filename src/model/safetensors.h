/* safetensors.h — memory-mapped safetensors files, single or sharded (model.safetensors.index.json).
 *
 * Owns: header parsing (bounds-checked, fuzzable without a file), the mapping of each shard, and the
 * name -> tensor table of a whole checkpoint. Format: 8-byte little-endian header length N, N bytes of
 * JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the data.
 */
#ifndef LILY_SAFETENSORS_H
#define LILY_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "lily.h"

#define LILY_MAX_NDIM 8

typedef struct {
    char *name;
    lily_dtype dtype;
    int ndim;
    int64_t shape[LILY_MAX_NDIM];
    const void *data;     /* inside the mapping */
    uint64_t nbytes;
    int shard;            /* index of the file it came from */
} lily_st_tensor;

/* Parse a safetensors header held in memory: buf is the whole file (or a fuzz input) of size len.
 * On success *out holds n_tensors entries (names owned by the array; data points into buf).
 * Checks: header length fits in the file, valid JSON object, known dtypes, shape product * dtype size
 * == end - begin, offsets within the data section, no two tensors overlapping.
 * Errors: LILY_ERR_FORMAT with a message naming the problem (and the tensor). */
lily_status lily_st_parse(const uint8_t *buf, size_t len, lily_st_tensor **out, int *n_tensors, lily_error *err);
void lily_st_tensors_free(lily_st_tensor *tensors, int n_tensors);

/* A checkpoint: every shard mapped, every tensor indexed by name. */
typedef struct lily_checkpoint {
    int n_shards;
    void **maps;          /* [n_shards] mmap base addresses */
    size_t *map_sizes;
    lily_st_tensor *tensors;
    int n_tensors;
    void *index;          /* name -> tensor hash table (opaque) */
} lily_checkpoint;

/* Open DIR: model.safetensors.index.json when present (every shard it names), else model.safetensors,
 * else every *.safetensors in DIR. Errors: LILY_ERR_IO (missing/unreadable file, mmap failure),
 * LILY_ERR_FORMAT (as lily_st_parse; the message starts with the file name; duplicate tensor names). */
lily_status lily_checkpoint_open(const char *model_dir, lily_checkpoint *ckpt, lily_error *err);
void lily_checkpoint_close(lily_checkpoint *ckpt);

/* The tensor named `name`, or NULL. */
const lily_st_tensor *lily_checkpoint_find(const lily_checkpoint *ckpt, const char *name);

#endif
