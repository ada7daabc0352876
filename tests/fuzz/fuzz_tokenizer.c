/* fuzz_tokenizer.c — libFuzzer target for encoding and decoding with the Qwen3 tokenizer
 * (tests/data/tokenizers/qwen3: the real vocabulary, merges, pre-tokenizer and NFC normalizer).
 * Input: one flag byte (bit 0: parse special tokens; bit 1: the rest is token ids, 3 bytes each, taken
 * modulo the vocabulary, instead of text).
 * Checks: no crash, leak or undefined behaviour; encode refuses only invalid UTF-8 and gives ids inside
 * the vocabulary; text without special tokens comes back from decode(encode(text)) as its NFC form, here
 * checked as: the same bytes when the text is ASCII; the streaming detokenizer's pieces are valid UTF-8 and
 * join to decode's bytes whenever those are valid UTF-8.
 */
#include <stdint.h>
#include <string.h>

#include "fuzz_support.h"

/* Stream ids through the detokenizer; the joined pieces must be valid UTF-8 and equal want[want_len] when
 * want is valid UTF-8. */
static void check_stream(lily_tokenizer *tok, const int32_t *ids, int n, const char *want, size_t want_len)
{
    lily_detokenizer d;
    lily_detokenizer_init(&d, tok, false);
    char *joined = malloc(want_len * 3 + 16 * (size_t)n + 16);
    FUZZ_CHECK(joined);
    size_t at = 0;
    lily_error err;
    const char *piece;
    size_t len;
    for (int i = 0; i < n; i++) {
        FUZZ_CHECK(lily_detokenizer_feed(&d, ids[i], &piece, &len, &err) == LILY_OK);
        FUZZ_CHECK(fuzz_valid_utf8(piece, len));
        memcpy(joined + at, piece, len);
        at += len;
    }
    FUZZ_CHECK(lily_detokenizer_flush(&d, &piece, &len, &err) == LILY_OK);
    memcpy(joined + at, piece, len);
    at += len;
    FUZZ_CHECK(fuzz_valid_utf8(joined, at));
    if (fuzz_valid_utf8(want, want_len))
        FUZZ_CHECK(at == want_len && !memcmp(joined, want, at));
    lily_detokenizer_free(&d);
    free(joined);
}

/* The tokenizer is loaded before the first input, so its load time (seconds for Qwen3's under ASan) does
 * not count against libFuzzer's per-input timeout. */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_tokenizer("tokenizers/qwen3");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096)
        return 0;
    lily_tokenizer *tok = fuzz_tokenizer("tokenizers/qwen3");
    const int32_t vocab = lily_tokenizer_vocab_size(tok);
    const bool special = data[0] & 1;
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    lily_error err;
    int32_t *ids = NULL;
    int n = 0;
    if (data[0] & 2) {
        n = (int)(len / 3);
        ids = malloc((size_t)n * sizeof *ids + 1);
        FUZZ_CHECK(ids);
        for (int i = 0; i < n; i++)
            ids[i] = (int32_t)(((uint32_t)data[1 + 3 * i] << 16 | (uint32_t)data[2 + 3 * i] << 8 | data[3 + 3 * i]) %
                               (uint32_t)vocab);
    } else {
        lily_status st = lily_tokenizer_encode(tok, text, len, special, &ids, &n, &err);
        if (st != LILY_OK) {
            FUZZ_CHECK(st == LILY_ERR_INVALID_ARGUMENT && !fuzz_valid_utf8(text, len));
            return 0;
        }
        for (int i = 0; i < n; i++)
            FUZZ_CHECK(ids[i] >= 0 && ids[i] < vocab);
    }
    char *back = NULL;
    size_t back_len = 0;
    FUZZ_CHECK(lily_tokenizer_decode(tok, ids, n, false, &back, &back_len, &err) == LILY_OK);
    if (!(data[0] & 2)) {
        bool ascii = true;
        for (size_t i = 0; i < len && ascii; i++)
            ascii = (unsigned char)text[i] < 0x80 && text[i] != 0;
        if (ascii)
            FUZZ_CHECK(back_len == len && !memcmp(back, text, len));
    }
    check_stream(tok, ids, n, back, back_len);
    free(back);
    free(ids);
    return 0;
}
