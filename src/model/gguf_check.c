/* gguf_check.c — see gguf_check.h. */
#include "model/gguf_check.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define GGUF_ADVICE "lily loads Hugging Face safetensors checkpoints: pass the directory of the HF checkpoint " \
                    "(e.g. Qwen/Qwen3.6-35B-A3B) or of its MLX 4-bit conversion (an mlx-community ...-4bit " \
                    "download, or `mlx_lm.convert --hf-path DIR -q`)"

static bool ends_with_gguf(const char *name)
{
    size_t n = strlen(name);
    return n >= 5 && !strcasecmp(name + n - 5, ".gguf");
}

static bool has_gguf_magic(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    char magic[4] = {0};
    size_t n = fread(magic, 1, 4, f);
    fclose(f);
    return n == 4 && !memcmp(magic, "GGUF", 4);
}

lily_status lily_check_not_gguf(const char *path, lily_error *err)
{
    struct stat sb;
    if (!path || stat(path, &sb) != 0)
        return LILY_OK;
    if (S_ISREG(sb.st_mode)) {
        if (ends_with_gguf(path) || has_gguf_magic(path))
            return lily_error_set(err, LILY_ERR_UNSUPPORTED, "%s is a GGUF file (llama.cpp's format), which lily "
                                  "does not read; " GGUF_ADVICE, path);
        return LILY_OK;
    }
    if (!S_ISDIR(sb.st_mode))
        return LILY_OK;
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/config.json", path);
    if (stat(cfg, &sb) == 0)
        return LILY_OK;
    DIR *d = opendir(path);
    if (!d)
        return LILY_OK;
    char first[256] = "";
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (ends_with_gguf(e->d_name) && n++ == 0)
            snprintf(first, sizeof first, "%s", e->d_name);
    closedir(d);
    if (n > 0)
        return lily_error_set(err, LILY_ERR_UNSUPPORTED, "%s holds GGUF files (%s%s: llama.cpp's format, which "
                              "lily does not read) and no config.json; " GGUF_ADVICE, path, first,
                              n > 1 ? ", ..." : "");
    return LILY_OK;
}
