/* file.h — reading a whole small file (configs, tokenizer.json, templates, token-id lists) into memory.
 *
 * Owns: the one whole-file reader the model, text and CLI layers share. Large tensors are mapped, never
 * read (model/safetensors.h).
 */
#ifndef LILY_BASE_FILE_H
#define LILY_BASE_FILE_H

#include <stddef.h>

#include "lily.h"

/* Read the file at path into a malloc'd buffer with a NUL after the last byte (*len excludes it); the
 * caller frees *out. max_bytes > 0 refuses larger files; 0 = no limit.
 * Errors (the message starts with the path; *out is NULL):
 *   LILY_ERR_IO "PATH: cannot open (reason)" or "PATH: read failed (reason)", with errno left as the
 *   failing call set it (ENOENT for a missing file);
 *   LILY_ERR_FORMAT "PATH: larger than N bytes" when max_bytes is exceeded;
 *   LILY_ERR_OUT_OF_MEMORY "PATH: out of memory". */
lily_status lily_read_file(const char *path, size_t max_bytes, char **out, size_t *len, lily_error *err);

/* Refuse a path that exists but is not a regular file (a FIFO, a directory, a device), before anything
 * opens it: opening a FIFO blocks until a writer comes, so a model file that is one would hang the loader.
 * Returns LILY_OK for a regular file and for a path stat() cannot see (the caller's open reports that, with
 * its errno); else LILY_ERR_IO "PATH: not a regular file (a FIFO|a directory|a device or socket)", errno
 * EINVAL. */
lily_status lily_check_regular_file(const char *path, lily_error *err);

#endif
