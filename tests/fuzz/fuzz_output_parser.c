/* fuzz_output_parser.c — libFuzzer target for the output parser (src/text/output_parser.c).
 *
 * Input: one flag byte (bit 0 thinking, bit 1 cut by length, bit 2 use a typed tools list), then model
 * text. Checks what must hold for any text: no crash or leak, the same result fed whole and one byte at a
 * time or in pieces of 7, and every tool call's arguments a JSON object. (Not checked: no think tag in
 * content. Dropping a tag can splice one out of its neighbours, as in "</thi</think>nk>".)
 * Run: cmake -S . -B build-fuzz -DLILY_FUZZ=ON -DCMAKE_C_COMPILER=clang && cmake --build build-fuzz
 *      --target fuzz_output_parser && build-fuzz/tests/fuzz/fuzz_output_parser tests/fuzz/corpus_output_parser
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/output_parser.h"

static const char tools_json[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"n\":{\"type\":\"integer\"},\"x\":{\"type\":\"number\"},\"b\":{\"type\":\"boolean\"},\"o\":{\"type\":\"object\"},"
    "\"a\":{\"type\":\"array\"},\"s\":{\"type\":\"string\"},\"u\":{\"type\":[\"integer\",\"null\"]}}}}}]";

/* The final result serialized as one JSON text, or NULL. */
static char *parse(const uint8_t *text, size_t len, size_t step, bool thinking, bool cut, const json_t *tools)
{
    lily_output_parser_options opts = {.thinking = thinking, .tools = tools};
    lily_output_parser *p = NULL;
    lily_error err;
    if (lily_output_parser_new(&opts, &p, &err) != LILY_OK)
        abort();
    for (size_t at = 0; at < len; at += step)
        if (lily_output_parser_feed(p, (const char *)text + at, len - at < step ? len - at : step, &err) != LILY_OK)
            abort();
    if (lily_output_parser_finish(p, cut, &err) != LILY_OK)
        abort();
    const lily_parsed_output *o = lily_output_parser_result(p);
    for (int i = 0; i < o->n_tool_calls; i++) {
        const char *a = o->tool_calls[i].arguments;
        json_t *args = json_loads(a, 0, NULL);
        json_t *utf8 = json_stringn(a, strlen(a)); /* NULL for invalid UTF-8, which jansson cannot load */
        if (!json_is_object(args) && utf8)
            abort();
        json_decref(utf8);
        json_decref(args);
    }
    json_t *choice = lily_output_choice_json(o, "call_");
    char *s = choice ? json_dumps(choice, JSON_COMPACT) : NULL;
    json_decref(choice);
    lily_output_parser_free(p);
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || memchr(data + 1, 0, size - 1)) /* jansson cannot load a NUL inside a key */
        return 0;
    const uint8_t flags = data[0];
    json_t *tools = (flags & 4) ? json_loads(tools_json, 0, NULL) : NULL;
    char *whole = parse(data + 1, size - 1, size, flags & 1, flags & 2, tools);
    char *bytes = parse(data + 1, size - 1, 1, flags & 1, flags & 2, tools);
    char *sevens = parse(data + 1, size - 1, 7, flags & 1, flags & 2, tools);
    if (!whole || !bytes || !sevens || strcmp(whole, bytes) || strcmp(whole, sevens))
        abort();
    free(whole);
    free(bytes);
    free(sevens);
    json_decref(tools);
    return 0;
}
