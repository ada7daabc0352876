/* structured.h — which grammar (grammar/grammar.h) a chat request's output must follow: the
 * response_format schema for the content, or the forced tool's `parameters` for its call's arguments.
 */
#ifndef LILY_SERVER_STRUCTURED_H
#define LILY_SERVER_STRUCTURED_H

#include "grammar/grammar.h"
#include "runtime/generate.h"
#include "server/openai.h"
#include "text/tokenizer.h"

/* response_format json_object / json_schema: the content's grammar (compact JSON) in *out; NULL when the
 * request has no response_format. Errors: LILY_ERR_INVALID_ARGUMENT (a schema the engine cannot compile:
 * the message says which keyword), LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_structured_response_grammar(const lily_oai_request *req, lily_grammar **out, lily_error *err);

/* The arguments grammar (Qwen tool-call syntax) of the tool `name` (len bytes) in req->tools, or NULL when
 * there is no such tool or its parameters cannot be compiled (then said on stderr: the call goes
 * unconstrained rather than failing). */
lily_grammar *lily_structured_tool_grammar(const lily_oai_request *req, const char *name, size_t len);

/* response_format beside tools under tool_choice "auto": as in OpenAI's API, the model may call a tool or
 * answer, and only an answer must follow the format. This constraint wraps the format's (inner): until the
 * value has begun (nothing but whitespace taken after the think block), the tool-call opening token
 * (`call_open`, "<tool_call>") is allowed beside inner's tokens; once taken, no later token is constrained
 * (the call is as free as under "auto" without response_format). inner's own think-block wait is kept
 * (think_close: the token that ends it, -1 when the reply starts outside one). Set the fields, then take
 * lily_structured_or_call_hook (valid while c lives). */
typedef struct {
    lily_token_constraint inner;
    const lily_tokenizer *tok;
    int32_t call_open;
    int32_t think_close;
    bool waiting;  /* still inside the think block (set from think_close by the hook) */
    bool begun;    /* the value has taken a byte that is not whitespace: no call can open any more */
    bool released; /* the call opened: nothing is constrained */
} lily_structured_or_call;

lily_token_constraint lily_structured_or_call_hook(lily_structured_or_call *c);

#endif
