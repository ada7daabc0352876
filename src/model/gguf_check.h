/* gguf_check.h — recognizing a GGUF model (llama.cpp's format) where lily expects a checkpoint directory,
 * so the user is told what the file is and what to use instead rather than "config.json: not found". */
#ifndef LILY_MODEL_GGUF_CHECK_H
#define LILY_MODEL_GGUF_CHECK_H

#include "lily.h"

/* LILY_ERR_UNSUPPORTED with a message naming the format and what to do when path is a GGUF file (its first
 * four bytes are "GGUF", or its name ends in .gguf) or a directory that holds *.gguf files and no
 * config.json; LILY_OK otherwise (including a path that does not exist: the caller reports that). */
lily_status lily_check_not_gguf(const char *path, lily_error *err);

#endif
