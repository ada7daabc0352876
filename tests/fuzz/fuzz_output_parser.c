/* fuzz_output_parser.c — libFuzzer target for the output parser (src/text/output_parser.c).
 *
 * Input: one flag byte (bit 0 thinking, bit 1 cut by length, bit 2 use a typed tools list, bit 3 take the
 * tools from the input: the bytes up to the first 0xFF are a request's "tools" value, validated by
 * lily_oai_parse_request as `lily serve` does), then model text. Checks what must hold for any text: no crash or leak, the same result fed whole and one byte at a
 * time or in pieces of 7, and every tool call's arguments a JSON object. (Not checked: no think tag in
 * content. Dropping a tag can splice one out of its neighbours, as in "</thi</think>nk>".)
 * Run: see docs/FUZZING.md.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/openai.h"
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
    const uint8_t *text = data + 1;
    size_t len = size - 1;
    json_t *tools = (flags & 4) ? json_loads(tools_json, 0, NULL) : NULL;
    lily_oai_request req = {0};
    if (flags & 8) {
        const uint8_t *end = memchr(text, 0xFF, len);
        if (!end) {
            json_decref(tools);
            return 0;
        }
        static const char head[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":";
        const size_t tn = (size_t)(end - text);
        char *body = malloc(sizeof head + tn + 1);
        if (!body)
            abort();
        memcpy(body, head, sizeof head - 1);
        memcpy(body + sizeof head - 1, text, tn);
        body[sizeof head - 1 + tn] = '}';
        lily_oai_error e;
        const bool ok = lily_oai_parse_request(body, sizeof head + tn, true, &req, &e);
        free(body);
        json_decref(tools);
        if (!ok)
            return 0;
        tools = json_incref(req.tools);
        text = end + 1;
        len -= tn + 1;
    }
    char *whole = parse(text, len, len ? len : 1, flags & 1, flags & 2, tools);
    char *bytes = parse(text, len, 1, flags & 1, flags & 2, tools);
    char *sevens = parse(text, len, 7, flags & 1, flags & 2, tools);
    if (!whole || !bytes || !sevens || strcmp(whole, bytes) || strcmp(whole, sevens))
        abort();
    free(whole);
    free(bytes);
    free(sevens);
    json_decref(tools);
    lily_oai_request_free(&req);
    return 0;
}
