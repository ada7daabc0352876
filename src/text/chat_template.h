/* chat_template.h — the Qwen3.6 chat template, rendered by C code instead of a Jinja interpreter.
 *
 * lily implements the logic of one template, Qwen/Qwen3.6-35B-A3B's chat_template.jinja (sha256
 * e84f32a2..., kept in tests/data/tokenizers/qwen35/), byte for byte as Hugging Face transformers renders
 * it (jinja2 sandbox, trim_blocks, lstrip_blocks; tojson = json.dumps(ensure_ascii=False)), on an OpenAI
 * chat-completions request, after the request preprocessing vLLM's OpenAI server does. A model directory
 * carrying a different template is still rendered with this logic; lily_chat_template_check lets the
 * caller warn about it.
 */
#ifndef LILY_TEXT_CHAT_TEMPLATE_H
#define LILY_TEXT_CHAT_TEMPLATE_H

#include <jansson.h>

#include "lily.h"

/* Overrides for what the request says. Each field is -1 (take it from the request), 0 (false) or 1 (true). */
typedef struct {
    int enable_thinking;       /* request: chat_template_kwargs.enable_thinking; absent means on */
    int preserve_thinking;     /* request: chat_template_kwargs.preserve_thinking; absent means off */
    int add_generation_prompt; /* request: add_generation_prompt; absent means on (as vLLM) */
    int fold_system;           /* 1: a system / developer message anywhere joins the one system block (their
                                * stripped texts in order, joined by a blank line): the prompt is the template's
                                * for that one leading system message and the other messages (tool results either
                                * side of a late system message share one user turn), instead of the template's
                                * "must be at the beginning" error (lily's server); -1, 0: the error */
} lily_chat_options;

/* All fields -1: the request decides everything. */
void lily_chat_options_init(lily_chat_options *opts);

/* Render a chat request to the exact prompt text the model sees.
 *
 * request: either an OpenAI chat-completions request object or a bare `messages` array. Read fields:
 *   messages              array of {role, content, [reasoning_content], [tool_calls]}; roles system,
 *                         developer (rendered as system), user, assistant, tool; content a string, null,
 *                         or a list of parts ({"type":"text","text":...}; image/image_url/video parts
 *                         render as the template's vision placeholders)
 *   tools                 array of tool objects, each written with json.dumps into the system block
 *   chat_template_kwargs  {enable_thinking, preserve_thinking: bool or null, add_vision_id}
 *   add_generation_prompt bool, default true
 *   continue_final_message bool, default false (vLLM's name): the last message, which must be the
 *                         assistant's, is left open (no <|im_end|>) so the reply continues its text (an
 *                         assistant prefill); add_generation_prompt must then be false
 * Assistant tool_calls[*] are {"function": {"name", "arguments"}} (or the bare function object);
 * arguments is an object, or a JSON string holding an object (parsed, as vLLM does); null or "" means {}.
 * opts may be NULL (same as all -1).
 * On success *out is a malloc'd NUL-terminated UTF-8 string (the caller frees it). With a generation
 * prompt it ends "<|im_start|>assistant\n<think>\n" (thinking on) or "...<think>\n\n</think>\n\n" (off);
 * continuing the final message, it ends with that message's (stripped) content.
 * Errors: LILY_ERR_TEMPLATE with a message naming the message at fault: no messages, no user query
 * (a user turn that is not only a <tool_response>), an unknown role, a system/developer message that is
 * not first (unless opts->fold_system), an image in the system message, content of the wrong type or an
 * unknown content part, a continue_final_message with add_generation_prompt or after a message that is
 * not the assistant's, a tool call without a string name, arguments that are not an object (or a string
 * that does not parse to one), fields of the wrong JSON type. LILY_ERR_OUT_OF_MEMORY. *out is NULL on error. */
lily_status lily_chat_render(const json_t *request, const lily_chat_options *opts, char **out, lily_error *err);

/* lily_chat_render that also gives the prompt's length in bytes (*len, excluding the terminating NUL): the
 * text holds U+0000 where a message's content did, so strlen would cut it short. */
lily_status lily_chat_render_n(const json_t *request, const lily_chat_options *opts, char **out, size_t *len,
                               lily_error *err);

/* What a model directory says about its chat template. */
typedef enum {
    LILY_CHAT_TEMPLATE_KNOWN,     /* identical to the Qwen3.6 template lily implements */
    LILY_CHAT_TEMPLATE_DIFFERENT, /* present, but not byte-identical (trailing newlines aside) */
    LILY_CHAT_TEMPLATE_MISSING,   /* neither chat_template.jinja nor tokenizer_config.json's chat_template */
} lily_chat_template_match;

/* The sha256 (hex) of the known template text with trailing newlines removed. */
extern const char LILY_CHAT_TEMPLATE_KNOWN_SHA256[65];

/* Compare model_dir's chat template with the known one. The template is read as transformers reads it:
 * model_dir/chat_template.jinja if present, else tokenizer_config.json's "chat_template" (a string, or
 * a list of {name, template} from which "default" is taken). Trailing newlines are ignored.
 * *match receives the verdict; when sha256_hex is not NULL it receives the found template's digest
 * ("" when missing). Errors: LILY_ERR_IO (model_dir unreadable), LILY_ERR_FORMAT (tokenizer_config.json
 * is not valid JSON, or its chat_template has the wrong type). */
lily_status lily_chat_template_check(const char *model_dir, lily_chat_template_match *match, char sha256_hex[65],
                                     lily_error *err);

#endif
