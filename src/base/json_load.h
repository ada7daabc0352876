/* json_load.h — parsing JSON text whose numbers may lie outside jansson's int64 / double range.
 *
 * Owns: lily_json_loadb, the one JSON text loader for files and request bodies whose integers lily does
 * not control (MLX-LM's converter writes "model_max_length": 1000000000000000019884624838656 into
 * tokenizer_config.json; a client may send "seed": 9223372036854775808). jansson refuses such text
 * ("too big integer", "real number overflow"); here an integer literal outside [-2^63, 2^63) is read as a
 * real (the nearest double) and a literal beyond the double range as the largest double with its sign, so
 * the document loads and only a field that lily reads as an integer is refused, by name.
 */
#ifndef LILY_BASE_JSON_LOAD_H
#define LILY_BASE_JSON_LOAD_H

#include <jansson.h>
#include <stddef.h>

/* json_loadb(text, len, flags, error), except for the number literals above. Text without such a literal
 * is parsed as is, without a copy. Returns NULL with *error filled on malformed text (line and column of
 * the text as given, except that an error on a line after a rewritten literal may report another column)
 * or when out of memory. */
json_t *lily_json_loadb(const char *text, size_t len, size_t flags, json_error_t *error);

/* The file at path (at most max_bytes; 0 = no limit) read whole, then lily_json_loadb. Returns NULL with
 * error->text saying why (cannot open / read / too large, malformed) on failure. */
json_t *lily_json_load_file(const char *path, size_t max_bytes, size_t flags, json_error_t *error);

#endif
