/* fuzz_chat_template.c — libFuzzer target for chat rendering (lily_chat_render) on any JSON: a request
 * object or a bare messages array.
 * Input: one flag byte (bits 0-1: enable_thinking -1/0/1, bits 2-3: preserve_thinking, bits 4-5:
 * add_generation_prompt; 3 means -1), then the JSON text.
 * Checks: no crash, leak or undefined behaviour; a refusal is LILY_ERR_TEMPLATE (or out of memory) with
 * a message; a rendering is valid UTF-8 and ends with the generation prompt when one was asked for.
 */
#include <jansson.h>
#include <stdint.h>
#include <string.h>

#include "fuzz_support.h"
#include "text/chat_template.h"

static int tri(int bits) { return bits == 3 ? -1 : bits & 1; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    json_t *request = json_loadb((const char *)data + 1, size - 1, JSON_DECODE_ANY, NULL);
    if (!request)
        return 0;
    lily_chat_options o;
    lily_chat_options_init(&o);
    o.enable_thinking = tri(data[0] & 3);
    o.preserve_thinking = tri(data[0] >> 2 & 3);
    o.add_generation_prompt = tri(data[0] >> 4 & 3);
    char *out = NULL;
    lily_error err;
    lily_status st = lily_chat_render(request, &o, &out, &err);
    if (st == LILY_OK) {
        const size_t len = strlen(out);
        FUZZ_CHECK(fuzz_valid_utf8(out, len));
        if (o.add_generation_prompt == 1)
            FUZZ_CHECK(len >= 22 && (!memcmp(out + len - 8, "<think>\n", 8) ||
                                     !memcmp(out + len - 19, "<think>\n\n</think>\n\n", 19)));
        free(out);
    } else {
        FUZZ_CHECK(!out && (st == LILY_ERR_TEMPLATE || st == LILY_ERR_OUT_OF_MEMORY) && err.message[0]);
    }
    json_decref(request);
    return 0;
}
