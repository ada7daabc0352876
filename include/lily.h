/* lily.h — the public C API shared by the CLI, the server and the tests.
 *
 * Owns: status codes and the error record every layer returns through. The engine and session API live
 * in src/runtime/engine.h; this header stays small so every file can include it.
 */
#ifndef LILY_H
#define LILY_H

#include <stddef.h>
#include <stdint.h>

#define LILY_VERSION "0.1.0"

/* Every fallible function returns one of these; the words go into a lily_error. */
typedef enum {
    LILY_OK = 0,
    LILY_ERR_INVALID_ARGUMENT, /* a caller passed something the API does not accept */
    LILY_ERR_IO,               /* open/read/mmap/write failed */
    LILY_ERR_FORMAT,           /* a file is malformed: bad JSON, truncated safetensors, unknown dtype */
    LILY_ERR_MODEL,            /* the checkpoint does not match the config: missing tensor, wrong shape/dtype */
    LILY_ERR_UNSUPPORTED,      /* valid input lily does not implement (e.g. 3-bit weights) */
    LILY_ERR_OUT_OF_MEMORY,    /* host or device allocation failed */
    LILY_ERR_CONTEXT_LENGTH,   /* a prompt or generation would exceed the context size */
    LILY_ERR_BACKEND,          /* a backend (CUDA) call failed */
    LILY_ERR_TOKENIZER,        /* tokenizer files missing, malformed or inconsistent with the model */
    LILY_ERR_TEMPLATE,         /* the chat template cannot render this conversation */
    LILY_ERR_CANCELLED,        /* the caller asked to stop */
} lily_status;

/* An error record: the status and a human-readable message naming the object at fault. */
typedef struct {
    lily_status status;
    char message[1024];
} lily_error;

/* Record (status, printf-formatted message) in err (err may be NULL) and return status. */
lily_status lily_error_set(lily_error *err, lily_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefix err->message with "context: " (for adding the file or tensor name on the way up). */
void lily_error_prefix(lily_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A short stable name for a status ("ok", "format", "model", ...). */
const char *lily_status_name(lily_status status);

#endif
