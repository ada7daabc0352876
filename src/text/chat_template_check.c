/* chat_template_check.c — is a model directory's chat template the one lily implements?
 *
 * Owns: finding the template in a model directory the way transformers does (chat_template.jinja first,
 * then tokenizer_config.json's "chat_template") and comparing its sha256 with the known Qwen3.6 one.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "base/json_load.h"
#include "base/sha256.h"
#include "text/chat_template.h"

/* sha256 of Qwen/Qwen3.6-35B-A3B chat_template.jinja (7764 bytes, no trailing newline; KNOWN.json). */
const char LILY_CHAT_TEMPLATE_KNOWN_SHA256[65] = "e84f32a23fdda27689f868aa4a1a5621f41133e51a48d7f3efcbea2839574259";

static void digest_of(const char *text, size_t len, char hex[65])
{
    while (len && text[len - 1] == '\n')
        len--;
    lily_sha256_hex(text, len, hex);
}

lily_status lily_chat_template_check(const char *model_dir, lily_chat_template_match *match, char sha256_hex[65],
                                     lily_error *err)
{
    char found[65] = "";
    struct stat sb;
    if (stat(model_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return lily_error_set(err, LILY_ERR_IO, "%s: not a readable directory", model_dir);

    size_t path_size = strlen(model_dir) + 64;
    char *path = malloc(path_size);
    if (!path)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory");
    lily_status status = LILY_OK;
    size_t len;
    snprintf(path, path_size, "%s/chat_template.jinja", model_dir);
    char *text;
    lily_error read_err = {0};
    lily_status read = lily_check_regular_file(path, &read_err);
    if (read == LILY_OK)
        read = lily_read_file(path, 0, &text, &len, &read_err);
    if (read == LILY_OK) {
        digest_of(text, len, found);
        free(text);
    } else if (read != LILY_ERR_IO || errno != ENOENT) {
        status = read; /* a missing template is not an error; anything else is */
        if (err)
            *err = read_err;
    } else {
        snprintf(path, path_size, "%s/tokenizer_config.json", model_dir);
        json_error_t jerr;
        FILE *probe = lily_check_regular_file(path, NULL) == LILY_OK ? fopen(path, "rb") : NULL;
        if (probe) {
            fclose(probe);
            json_t *config = lily_json_load_file(path, 0, 0, &jerr);
            if (!config) {
                status = lily_error_set(err, LILY_ERR_FORMAT, "%s: line %d: %s", path, jerr.line, jerr.text);
            } else {
                const json_t *tpl = json_object_get(config, "chat_template");
                if (json_is_array(tpl)) { /* [{"name": "default", "template": ...}, {"name": "tool_use", ...}] */
                    const json_t *chosen = NULL, *item;
                    size_t i;
                    json_array_foreach(tpl, i, item) {
                        const char *name = json_string_value(json_object_get(item, "name"));
                        if (name && !strcmp(name, "default"))
                            chosen = json_object_get(item, "template");
                    }
                    tpl = chosen;
                }
                if (json_is_string(tpl))
                    digest_of(json_string_value(tpl), json_string_length(tpl), found);
                else if (tpl && !json_is_null(tpl))
                    status = lily_error_set(err, LILY_ERR_FORMAT, "%s: chat_template: expected a string", path);
                json_decref(config);
            }
        }
    }
    free(path);
    if (status != LILY_OK)
        return status;
    *match = !found[0] ? LILY_CHAT_TEMPLATE_MISSING
             : !strcmp(found, LILY_CHAT_TEMPLATE_KNOWN_SHA256) ? LILY_CHAT_TEMPLATE_KNOWN
                                                                : LILY_CHAT_TEMPLATE_DIFFERENT;
    if (sha256_hex)
        memcpy(sha256_hex, found, sizeof found);
    return LILY_OK;
}
