/* fuzz_request.c — libFuzzer target for a request body's whole way to prompt token ids, as `lily serve`
 * takes it (server/service.c prompt_ids): lily_oai_parse_request, then for a chat the template request,
 * lily_chat_render and lily_tokenizer_encode with special tokens parsed; for a completion the prompt
 * text encoded or the prompt ids taken. Tokenizer: tests/data/tiny-chat.
 * Input: one flag byte (bit 0: chat, else completion), then the JSON body.
 * Checks: no crash, leak or undefined behaviour; a refused request has status 400 and a message; every
 * id lies in the vocabulary (text ids) and a chat prompt is valid UTF-8 ending with the generation
 * prompt when the request asks for one.
 */
#include <jansson.h>
#include <stdint.h>
#include <string.h>

#include "fuzz_support.h"
#include "server/openai.h"
#include "text/chat_template.h"

/* The tokenizer is loaded before the first input, so its load time (seconds for Qwen3's under ASan) does
 * not count against libFuzzer's per-input timeout. */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_tokenizer("tiny-chat");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    lily_tokenizer *tok = fuzz_tokenizer("tiny-chat");
    const bool chat = data[0] & 1;
    lily_oai_request req;
    lily_oai_error e;
    if (!lily_oai_parse_request((const char *)data + 1, size - 1, chat, &req, &e)) {
        FUZZ_CHECK(e.http_status == 400 && e.message[0]);
        return 0;
    }
    lily_error err;
    int32_t *ids = NULL;
    int n = 0;
    if (chat) {
        json_t *treq = lily_oai_template_request(&req);
        FUZZ_CHECK(treq);
        char *prompt = NULL;
        if (lily_chat_render(treq, NULL, &prompt, &err) == LILY_OK) {
            const size_t len = strlen(prompt);
            FUZZ_CHECK(fuzz_valid_utf8(prompt, len));
            if (lily_tokenizer_encode(tok, prompt, len, true, &ids, &n, &err) == LILY_OK)
                for (int i = 0; i < n; i++)
                    FUZZ_CHECK(ids[i] >= 0 && ids[i] < lily_tokenizer_vocab_size(tok));
            free(prompt);
        } else {
            FUZZ_CHECK(err.status == LILY_ERR_TEMPLATE && err.message[0]);
        }
        json_decref(treq);
    } else if (req.prompt_text) {
        if (lily_tokenizer_encode(tok, req.prompt_text, strlen(req.prompt_text), true, &ids, &n, &err) == LILY_OK)
            for (int i = 0; i < n; i++)
                FUZZ_CHECK(ids[i] >= 0 && ids[i] < lily_tokenizer_vocab_size(tok));
    } else {
        for (int i = 0; i < req.n_prompt_ids; i++)
            FUZZ_CHECK(req.prompt_ids[i] >= 0);
    }
    free(ids);
    lily_oai_request_free(&req);
    return 0;
}
