/* structured.h — which grammar (grammar/grammar.h) a chat request's output must follow: the
 * response_format schema for the content, or the forced tool's `parameters` for its call's arguments.
 */
#ifndef LILY_SERVER_STRUCTURED_H
#define LILY_SERVER_STRUCTURED_H

#include "grammar/grammar.h"
#include "server/openai.h"

/* response_format json_object / json_schema: the content's grammar (compact JSON) in *out; NULL when the
 * request has no response_format. Errors: LILY_ERR_INVALID_ARGUMENT (a schema the engine cannot compile:
 * the message says which keyword), LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_structured_response_grammar(const lily_oai_request *req, lily_grammar **out, lily_error *err);

/* The arguments grammar (Qwen tool-call syntax) of the tool `name` (len bytes) in req->tools, or NULL when
 * there is no such tool or its parameters cannot be compiled (then said on stderr: the call goes
 * unconstrained rather than failing). */
lily_grammar *lily_structured_tool_grammar(const lily_oai_request *req, const char *name, size_t len);

#endif
