/* fuzz_tokenizer_json.c — libFuzzer target for loading tokenizer.json (lily_tokenizer_load), the input
 * written to a file in a private temp directory.
 * Checks: no crash, leak or undefined behaviour; a refused file names a reason; an accepted tokenizer
 * encodes a fixed text to ids inside its vocabulary and decodes them again.
 */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_support.h"

static char dir[] = "/tmp/lily-fuzz-tokenizer-XXXXXX", path[64];

static void remove_dir(void)
{
    unlink(path);
    rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!path[0]) {
        FUZZ_CHECK(mkdtemp(dir));
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        atexit(remove_dir);
    }
    FILE *f = fopen(path, "wb");
    FUZZ_CHECK(f);
    FUZZ_CHECK(fwrite(data, 1, size, f) == size);
    fclose(f);
    lily_tokenizer *tok = NULL;
    lily_error err;
    if (lily_tokenizer_load(path, &tok, &err) != LILY_OK) {
        FUZZ_CHECK(!tok && err.message[0]);
        return 0;
    }
    static const char text[] = "Hello, world! <|im_end|> 123 \xC3\xA9t\xC3\xA9\n\n  x";
    int32_t *ids = NULL;
    int n = 0;
    if (lily_tokenizer_encode(tok, text, sizeof text - 1, true, &ids, &n, &err) == LILY_OK) {
        for (int i = 0; i < n; i++)
            FUZZ_CHECK(ids[i] >= 0 && ids[i] < lily_tokenizer_vocab_size(tok));
        char *back = NULL;
        size_t len = 0;
        if (lily_tokenizer_decode(tok, ids, n, false, &back, &len, &err) == LILY_OK)
            free(back);
    }
    free(ids);
    lily_tokenizer_free(tok);
    return 0;
}
