/* anthropic.h — the Anthropic Messages API wire format (POST /v1/messages, /v1/messages/count_tokens).
 *
 * Owns: validating a Messages request and translating it into the same lily_oai_request the OpenAI chat
 * path runs (system -> a system message, tool_use / tool_result blocks -> tool calls / tool messages,
 * tools[].input_schema -> function parameters, tool_choice auto / any / tool / none -> auto / required /
 * named / none, thinking enabled + budget_tokens -> enable_thinking + reasoning_budget, disabled or absent
 * -> thinking off, stop_sequences -> stop, a final assistant message -> a prefill the reply continues:
 * continue_final); and every JSON object the server answers with: the message,
 * the stream's events, errors. Pure functions of their inputs.
 * Reference: docs.anthropic.com, "Messages" and "Streaming Messages".
 */
#ifndef LILY_SERVER_ANTHROPIC_H
#define LILY_SERVER_ANTHROPIC_H

#include <jansson.h>
#include <stdbool.h>

#include "server/openai.h"
#include "text/output_parser.h"

/* Parse a Messages request body (len bytes) into req (req->anthropic set; req->continue_final when the last
 * message is a non-empty assistant prefill). count_only: the /v1/messages/count_tokens shape (no
 * max_tokens). False: e is filled (400 invalid_request_error; the message names the Messages request's own
 * fields: stop_sequences.N, tools.N.name, tool_choice.name), also for two tools of one name, a tool_result
 * whose tool_use_id no tool_use block of an earlier message has (both as Anthropic's API), a prefill ending
 * in whitespace or combined with thinking, output_config.format, tool_choice any / tool, or a tool_use block. */
bool lily_anth_parse_request(const char *body, size_t len, bool count_only, lily_oai_request *req,
                             lily_oai_error *e);

/* {"type":"error","error":{"type":..,"message":..}} (malloc'd; NULL on OOM). The OpenAI error types map
 * to Anthropic's: authentication_error, not_found_error, request_too_large, api_error (5xx),
 * overloaded_error (503, sent as 529: lily_anth_http_status). */
char *lily_anth_error_json(const lily_oai_error *e);

/* The HTTP status an error with this (OpenAI-side) status gets on the Messages API: 503 ("come back
 * later": queue full, model loading, shutting down) is Anthropic's 529 overloaded_error; others as they are. */
int lily_anth_http_status(int http_status);

typedef struct {
    int input_tokens;         /* prompt tokens not read from the prefix cache */
    int cache_read_input_tokens;
    int output_tokens;
} lily_anth_usage;

/* "end_turn", "max_tokens", "stop_sequence" (stop_sequence non-NULL) or "tool_use". finish is the OpenAI
 * finish_reason of the same output. */
const char *lily_anth_stop_reason(const char *finish, const char *stop_sequence);

/* The whole message: content blocks thinking, text, tool_use (ids from call_ids[i], "call_" becoming
 * "toolu_"; input parsed from the arguments). New reference or NULL. */
json_t *lily_anth_message(const char *id, const char *model, const lily_parsed_output *o, char (*call_ids)[40],
                          int n_call_ids, const char *stop_reason, const char *stop_sequence,
                          const lily_anth_usage *u);

/* Streaming: the state of the open content block. */
typedef struct {
    int index;                /* the open block's index, -1 when none */
    int kind;                 /* lily_output_event_kind of the open block */
} lily_anth_stream;

/* message_start (usage as known before decoding) and a ping: out[0..2). */
int lily_anth_stream_start(const char *id, const char *model, const lily_anth_usage *u, json_t *out[2]);

/* The events one parser event makes (close the open block, open another, a delta): out[0..n), n <= 3.
 * call_id: the tool call's id for TOOL_CALL_START. */
int lily_anth_stream_event(lily_anth_stream *st, const lily_output_event *ev, const char *call_id, json_t *out[3]);

/* The end: close the open block, message_delta (stop_reason, stop_sequence, usage), message_stop. */
int lily_anth_stream_end(lily_anth_stream *st, const char *stop_reason, const char *stop_sequence,
                         const lily_anth_usage *u, json_t *out[3]);

#endif
