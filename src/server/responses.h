/* responses.h — OpenAI's Responses API wire format (POST /v1/responses), stateless.
 *
 * Owns: validating a Responses request and translating it into the same lily_oai_request the chat path runs
 * (instructions -> a system message; input as a string -> a user message; message items -> messages,
 * developer kept as developer, a system / developer item where it is (rendering folds them all into the one
 * system block); reasoning / assistant message / function_call items of one turn -> one
 * assistant message with reasoning_content, content and tool_calls; function_call_output -> a tool message;
 * flat function tools -> chat tools; tool_choice {"type":"function","name"} -> named; text.format ->
 * response_format; max_output_tokens -> max_tokens; reasoning.effort -> reasoning_effort); and every JSON
 * object the server answers with: the Response object, its output items (reasoning, message, function_call)
 * and the stream's events, each with its sequence_number. Nothing is stored: previous_response_id,
 * conversation and background are refused (400), store is accepted and answered false. Errors are OpenAI's
 * {"error":{message,type,param,code}} (openai.h). Pure functions of their inputs.
 * Reference: platform.openai.com/docs/api-reference/responses ("Create a model response", "Streaming events").
 */
#ifndef LILY_SERVER_RESPONSES_H
#define LILY_SERVER_RESPONSES_H

#include <jansson.h>
#include <stdbool.h>

#include "server/openai.h"
#include "text/output_parser.h"

/* Parse a Responses request body (len bytes) into req: req->responses holds the fields the Response object
 * echoes (instructions, max_output_tokens, metadata, parallel_tool_calls, reasoning, temperature, text,
 * tool_choice, tools, top_p, user). False: e is filled (400 invalid_request_error, param naming the Responses
 * field: input[3].call_id, tools[0].name, text.format.schema, ...), also for previous_response_id,
 * conversation, background true, a function_call_output whose call_id no earlier function_call item has (as
 * OpenAI's API), a non-text content part, a hosted tool (web_search, file_search, ...). Unknown fields are
 * ignored, as on the chat route. */
bool lily_resp_parse_request(const char *body, size_t len, lily_oai_request *req, lily_oai_error *e);

/* The 400 for a chat-template error (LILY_ERR_TEMPLATE's message, "chat template: messages[N]: ...") on a
 * request of this route: the message and param name the input item the user sent instead of the chat message
 * it became ("input[3]", a function_call's field "input[4].arguments", "instructions"); param "input" with the
 * message as it is when it names no message. */
void lily_resp_template_error(const lily_oai_request *req, const char *message, lily_oai_error *e);

/* The Response's output as the reply is generated: the items closed so far, the open one, and the stream's
 * next sequence_number. Fed the output parser's events (text/output_parser.h) in order; the same for a
 * stream (events made) and a whole response (none made), so both carry the same items. */
typedef struct {
    const lily_oai_ident *ident; /* id "resp_<24 alphanumerics>", created_at, model (borrowed) */
    const json_t *echo;       /* lily_oai_request.responses (borrowed) */
    int seq;                  /* the next event's sequence_number */
    json_t *output;           /* the closed items, in order */
    int open;                 /* the open item: LILY_OUTPUT_REASONING, _CONTENT (a message), _TOOL_CALL_START
                               * (a function_call), or -1 when none */
    char item_id[64];         /* the open item's id: rs_ / msg_ / fc_ + the response's random part + index */
    char call_id[40];         /* the open function_call's call_id */
    char *name;               /* the open function_call's name (malloc'd) */
    char *text;               /* the open item's text (or arguments) so far: text_len bytes (may hold U+0000) */
    size_t text_len, text_cap;
    bool failed;              /* out of memory on the way: the output is not whole */
} lily_resp_output;

/* Most events one call makes: closing an item (3), opening one (2), a delta (1). */
#define LILY_RESP_MAX_EVENTS 6

/* Start with no items. ident and echo must outlive o. False when out of memory. */
bool lily_resp_output_init(lily_resp_output *o, const lily_oai_ident *ident, const json_t *echo);
void lily_resp_output_free(lily_resp_output *o);

/* response.created and response.in_progress (status in_progress, no output, usage null): out[0..2). */
int lily_resp_stream_start(lily_resp_output *o, json_t *out[2]);

/* One parser event: close the open item when the event starts another kind (or another call), open one, add
 * the delta. call_id: the call's id for TOOL_CALL_START. out: the stream's events (out[0..n), n <=
 * LILY_RESP_MAX_EVENTS), or NULL for none (a response that does not stream: 0 is returned). */
int lily_resp_output_event(lily_resp_output *o, const lily_output_event *ev, const char *call_id, json_t **out);

/* The end: close the open item (status "incomplete" when incomplete, i.e. cut by max_output_tokens or the
 * context), then, on a stream (out non-NULL), the terminal event: response.completed, or response.incomplete
 * (as OpenAI's API) with the whole Response (usage u). out[0..n), n <= 4. */
int lily_resp_output_end(lily_resp_output *o, bool incomplete, const lily_oai_usage *u, json_t **out);

/* The Response object: id, object "response", created_at, status ("in_progress", "completed", "incomplete"
 * with incomplete_details.reason "max_output_tokens"), model, output (o's closed items), usage (NULL: null;
 * input_tokens with input_tokens_details.cached_tokens, output_tokens with output_tokens_details.
 * reasoning_tokens, total_tokens), error null, store false, and the request's echoed fields. New reference
 * or NULL on OOM. */
json_t *lily_resp_response(const lily_resp_output *o, const char *status, const lily_oai_usage *u);

/* A stream's in-band error: {"type":"error","code":..,"message":..,"param":..|null,"sequence_number":seq},
 * code being e's code, else its type ("server_error", "unavailable_error"). New reference or NULL on OOM. */
json_t *lily_resp_error_event(const lily_oai_error *e, int seq);

#endif
