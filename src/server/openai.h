/* openai.h — the OpenAI wire format: request validation and response / SSE chunk JSON.
 *
 * Owns: turning a request body (jansson) into a validated lily_oai_request with OpenAI-style errors, and
 * building every JSON object the server sends (errors, chat.completion, chat.completion.chunk,
 * text_completion, usage). Pure functions of their inputs: no model, no sockets, no threads.
 * Reference: the OpenAI API reference (platform.openai.com/docs/api-reference/chat), plus the fields vLLM
 * and llama.cpp accept for open models (top_k, min_p, repetition_penalty, chat_template_kwargs,
 * reasoning_content).
 */
#ifndef LILY_SERVER_OPENAI_H
#define LILY_SERVER_OPENAI_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* An error to send: HTTP status + the four fields of {"error":{message,type,param,code}}.
 * param and code are "" when null. */
typedef struct {
    int http_status;          /* 400, 401, 403, 404, 405, 413, 415, 500, 503 */
    char type[48];            /* "invalid_request_error", "authentication_error", "server_error", ... */
    char param[64];
    char code[48];            /* "context_length_exceeded", "invalid_api_key", ... */
    char message[768];
} lily_oai_error;

void lily_oai_error_set(lily_oai_error *e, int http_status, const char *type, const char *param,
                        const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* e = 500 server_error "Out of memory."; returns false (for `return lily_oai_out_of_memory(e);`). */
bool lily_oai_out_of_memory(lily_oai_error *e);

/* {"error":{"message":..,"type":..,"param":..|null,"code":..|null}} as a malloc'd string (NULL on OOM). */
char *lily_oai_error_json(const lily_oai_error *e);

typedef enum {
    LILY_TOOL_CHOICE_AUTO = 0,
    LILY_TOOL_CHOICE_NONE,
    LILY_TOOL_CHOICE_REQUIRED,
    LILY_TOOL_CHOICE_NAMED,
} lily_tool_choice;

typedef struct {
    int32_t token;
    float bias;
} lily_oai_logit_bias;

/* A validated request. Sampling fields the client left out are NAN (floats) or -1 (ints), so the model's
 * generation_config.json defaults can fill them. JSON pointers borrow from `body` (kept alive by it). */
typedef struct {
    json_t *body;             /* the parsed request (one reference owned here) */
    bool is_chat;             /* /v1/chat/completions (else /v1/completions) */

    /* chat */
    json_t *messages;         /* array, non-empty, every item an object with a known role */
    json_t *tools;            /* array or NULL; NULL when tool_choice is none */
    lily_tool_choice tool_choice;
    char tool_name[256];      /* for LILY_TOOL_CHOICE_NAMED */
    bool single_tool_call;    /* parallel_tool_calls false (Anthropic: disable_parallel_tool_use): the reply
                               * ends once its first tool call is closed */
    int enable_thinking;      /* -1 unset (template default: on), 0, 1 */
    int preserve_thinking;    /* -1 unset, 0, 1 */
    json_t *chat_template_kwargs; /* object or NULL */
    bool json_output;         /* response_format json_object / json_schema: the content is constrained JSON */
    json_t *json_schema;      /* response_format.json_schema.schema, or NULL (json_object: any object) */
    int reasoning_budget;     /* reasoning_budget / max_reasoning_tokens; -1 = none */
    bool anthropic;           /* translated from POST /v1/messages (server/anthropic.h): answered in its shape */
    json_t *responses;        /* translated from POST /v1/responses (server/responses.h): the fields the Response
                               * echoes (owned); NULL on the other routes. Answered in the Responses API's shape */
    json_t *responses_origins; /* with responses: for each of messages, the input item it came from (owned):
                               * [item index (-1: instructions), then an assistant message's tool_calls[k]'s
                               * function_call item at 1 + k] */
    bool continue_final;      /* the last message is an assistant prefill: the reply continues its text
                               * (Anthropic's prefill; set by server/anthropic.h, not an OpenAI field) */

    /* completions */
    const char *prompt_text;  /* prompt as a string, or NULL */
    size_t prompt_text_len;   /* its bytes (it may hold U+0000) */
    int32_t *prompt_ids;      /* prompt as token ids (malloc'd), or NULL */
    int n_prompt_ids;
    bool echo;

    /* both */
    bool stream;
    bool include_usage;       /* stream_options.include_usage */
    int max_tokens;           /* max_tokens / max_completion_tokens; -1 = until the context is full */
    double temperature, top_p, min_p;
    double presence_penalty, frequency_penalty, repetition_penalty;
    int top_k;
    bool has_seed;
    uint64_t seed;
    char **stop;              /* n_stop malloc'd strings */
    int n_stop;
    bool logprobs;
    int top_logprobs;         /* 0..20 */
    lily_oai_logit_bias *logit_bias; /* n_logit_bias entries (malloc'd) */
    int n_logit_bias;
} lily_oai_request;

/* Limits on a request body's JSON, checked on the text before jansson builds the document (jansson costs
 * ~40 bytes per value: 262144 values stay near 10 MB whatever the body's size). */
#define LILY_OAI_MAX_JSON_DEPTH 64
#define LILY_OAI_MAX_JSON_VALUES (1 << 18)

/* Parse a request body (len bytes; U+0000 allowed in strings; one leading UTF-8 byte order mark skipped)
 * into *out. Returns false with e set (400) when it nests deeper than LILY_OAI_MAX_JSON_DEPTH, has more
 * than LILY_OAI_MAX_JSON_VALUES values, or is not JSON. */
bool lily_oai_json_load(const char *body, size_t len, json_t **out, lily_oai_error *e);

/* The most stop sequences a request may give ('stop'; 'stop_sequences' on the Messages API). */
#define LILY_OAI_MAX_STOP 16

/* The longest tool name each API takes: OpenAI's rule is ^[a-zA-Z0-9_-]{1,64}$, the Messages API's
 * ^[a-zA-Z0-9_-]{1,128}$ (Claude Code names an MCP tool mcp__SERVER__TOOL, which can run past 64). */
#define LILY_OAI_MAX_TOOL_NAME 64
#define LILY_ANTH_MAX_TOOL_NAME 128

/* Whether name is a JSON string a tool may be called: 1 to max_len of [a-zA-Z0-9_-] (the characters the chat
 * template can write into the prompt as they are). */
bool lily_oai_valid_tool_name(const json_t *name, size_t max_len);

/* Parse and validate a chat (is_chat) or completions request body (len bytes, not NUL-terminated).
 * Returns true on success; on failure fills e (400, type invalid_request_error, param naming the field)
 * and leaves req empty (safe to free). Unknown fields are ignored, as OpenAI-compatible servers do. */
bool lily_oai_parse_request(const char *body, size_t len, bool is_chat, lily_oai_request *req,
                            lily_oai_error *e);
/* lily_oai_parse_request of a chat request translated from the Messages API (server/anthropic.h), whose tool
 * names may be up to LILY_ANTH_MAX_TOOL_NAME characters. */
bool lily_oai_parse_translated_request(const char *body, size_t len, lily_oai_request *req, lily_oai_error *e);
void lily_oai_request_free(lily_oai_request *req);

/* The JSON the chat template renders: {messages, tools?, chat_template_kwargs, add_generation_prompt:true}
 * with enable_thinking folded in from reasoning_effort, and tools dropped for tool_choice none; with
 * continue_final, {..., add_generation_prompt:false, continue_final_message:true} (text/chat_template.h).
 * New reference (NULL on OOM). */
json_t *lily_oai_template_request(const lily_oai_request *req);

/* Usage numbers of one request. */
typedef struct {
    int prompt_tokens;
    int completion_tokens;
    int cached_tokens;
    int reasoning_tokens;
} lily_oai_usage;

json_t *lily_oai_usage_json(const lily_oai_usage *u);

/* One tool call of a finished message. arguments is a JSON object text. */
typedef struct {
    char id[40];
    char *name;
    char *arguments;
} lily_oai_tool_call;

/* One token's log-probabilities (for logprobs / top_logprobs): a generated token's, or an echoed prompt token's
 * (logprob NaN for the first, which nothing predicts: null in the JSON). */
typedef struct {
    char *token;              /* the token's text (may be a partial UTF-8 sequence: bytes carry it exactly) */
    int token_len;
    float logprob;
    int n_top;
    struct {
        char *token;
        int token_len;
        float logprob;
    } top[20];
} lily_oai_logprob;

void lily_oai_logprob_clear(lily_oai_logprob *lp);

/* Chat logprobs {"content":[{token, logprob, bytes, top_logprobs}...]} for n entries (new reference). */
json_t *lily_oai_chat_logprobs_json(const lily_oai_logprob *lps, int n);
/* Completions logprobs {tokens, token_logprobs, top_logprobs, text_offset} (text_offset from offset0); each
 * top_logprobs dict holds the top entries and the sampled token (OpenAI: up to logprobs + 1 entries). */
json_t *lily_oai_completion_logprobs_json(const lily_oai_logprob *lps, int n, int offset0);

/* Identity of one response: shared by its chunks. */
typedef struct {
    char id[48];              /* "chatcmpl-<hex>" or "cmpl-<hex>" */
    long long created;        /* unix seconds */
    const char *model;
} lily_oai_ident;

/* Fill ident with a fresh random id (prefix "chatcmpl-" or "cmpl-") and the current time. */
void lily_oai_ident_init(lily_oai_ident *ident, bool is_chat, const char *model);

/* A fresh tool call id "call_<24 alphanumerics>". */
void lily_oai_tool_call_id(char out[40]);

/* The whole non-streaming chat.completion response. content/reasoning (content_len / reasoning_len bytes,
 * which may hold U+0000) may be NULL. logprobs is stolen (may be NULL). finish_reason: "stop" | "length" |
 * "tool_calls". */
json_t *lily_oai_chat_response(const lily_oai_ident *ident, const char *content, size_t content_len,
                               const char *reasoning, size_t reasoning_len, const lily_oai_tool_call *calls,
                               int n_calls, const char *finish_reason,
                               json_t *logprobs, const lily_oai_usage *usage);

/* The whole non-streaming text_completion response: text is text_len bytes (U+0000 kept). logprobs is stolen
 * (may be NULL). */
json_t *lily_oai_completion_response(const lily_oai_ident *ident, const char *text, size_t text_len,
                                     const char *finish_reason,
                                     json_t *logprobs, const lily_oai_usage *usage);

/* A chat.completion.chunk with one choice. delta is stolen ({} for the last chunk); finish_reason NULL
 * except on the last; logprobs stolen or NULL; usage_null adds "usage":null (include_usage streams). */
json_t *lily_oai_chat_chunk(const lily_oai_ident *ident, json_t *delta, const char *finish_reason,
                            json_t *logprobs, bool usage_null);

/* The usage chunk of an include_usage stream: "choices":[] and the usage. is_chat picks the object name. */
json_t *lily_oai_usage_chunk(const lily_oai_ident *ident, bool is_chat, const lily_oai_usage *usage);

/* A streamed text_completion chunk of text_len bytes of text (U+0000 kept). logprobs stolen or NULL. */
json_t *lily_oai_completion_chunk(const lily_oai_ident *ident, const char *text, size_t text_len,
                                  const char *finish_reason, json_t *logprobs, bool usage_null);

/* Deltas. */
json_t *lily_oai_delta_role(void);                                    /* {"role":"assistant","content":""} */
json_t *lily_oai_delta_text(const char *field, const char *text, size_t len); /* {"content":".."} */
json_t *lily_oai_delta_tool_open(int index, const char *id, const char *name); /* id, type, name, "" */
json_t *lily_oai_delta_tool_args(int index, const char *fragment, size_t len);

/* "data: <compact json>\n\n" as a malloc'd string (json is not stolen); NULL on OOM. */
char *lily_oai_sse(const json_t *json, size_t *len);

/* A JSON string from len bytes that may not be valid UTF-8 (each invalid byte becomes U+FFFD; U+0000 is
 * kept). NULL on OOM. */
json_t *lily_oai_string(const char *s, size_t len);

/* The length of the longest prefix of s[0, n) that does not end inside a UTF-8 character: n, or n less
 * the 1-3 bytes of a multi-byte sequence that the end cuts short. For cutting text on a character
 * boundary (copy at most max bytes: lily_oai_utf8_cut(s, min(len, max))). */
size_t lily_oai_utf8_cut(const char *s, size_t n);

/* "an object", "an array", "a string", "an integer", "a number", "a boolean" or "null": v's JSON type, for
 * "expected X, but got Y instead" messages; "nothing" when v is NULL (the field is missing). */
const char *lily_oai_json_kind(const json_t *v);

/* "event: TYPE\ndata: JSON\n\n" for an event object with a "type" (the Messages API's and the Responses API's
 * streams; malloc'd; NULL on OOM or when the event has no "type"). */
char *lily_oai_sse_event(const json_t *event, size_t *len);

/* JSON text (compact) of j as a malloc'd string. */
char *lily_oai_dump(const json_t *j);

#endif
