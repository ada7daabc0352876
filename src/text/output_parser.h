/* output_parser.h — generated text -> reasoning, content and tool calls (Qwen3.5/3.6 XML format).
 *
 * Owns: splitting the model's raw output into the OpenAI message fields, incrementally. Text goes in as
 * pieces of any size (one token's bytes, one byte, or everything at once); deltas come out through a
 * callback; the final result is the same for every way of splitting the same text.
 *
 * The format (the Qwen3.6 chat template's tool instructions):
 *     [reasoning]</think>\n\n[content]<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n
 *     ...</function>\n</tool_call>
 * Rules:
 * - Reasoning: when the prompt opened a think block (options.thinking), text is reasoning until
 *   "</think>" or a "<tool_call>" (the model may call a tool without closing its thought). A "<think>" in
 *   content opens reasoning again; stray "<think>"/"</think>" tags are dropped, so no think tag the model wrote
 *   reaches content or reasoning (only a tag spliced from the text around a dropped one could, as in
 *   "</thi</think>nk>").
 * - Reasoning and content are each trimmed of leading and trailing whitespace (held back while streaming,
 *   released when more text follows); content continuing a prefill (options.continuation) keeps its
 *   leading whitespace.
 * - Tool calls: "<tool_call>" (or a bare "<function=" in content) opens one. A function or parameter name
 *   ends at ">" or at a newline. A value loses one leading and one trailing newline and ends at
 *   "</parameter>", or, when that is missing, at the next "<parameter=", "</function>" or "</tool_call>".
 *   A missing "</function>" or "</tool_call>" is closed at the next tag that implies it or at the end.
 *   Stray text between the structural tags of a call is ignored. The older JSON form inside the tags,
 *   <tool_call>{"name": ..., "arguments": {...}}</tool_call>, is accepted too (its arguments arrive in one
 *   fragment when the block closes); a block that does not parse as such becomes content.
 * - Values are converted by the tool's JSON-schema type (options.tools, OpenAI `tools` array): "string"
 *   (or no schema, or a type list containing "string") stays raw text; integer, number, boolean, object,
 *   array and null are parsed as JSON (with lily serve's loader, base/json_load.h) and written verbatim when
 *   they parse to an allowed type (booleans also accept True/False; "null" is null for any non-string type;
 *   an integer past int64 is an integer, its digits kept); anything unparsable is kept as a string.
 * - Arguments are a compact JSON object, keys in the order written: {"city":"Paris","days":3}.
 * - With options.verbatim_answer, content that begins before any tool call runs to the end as written.
 */
#ifndef LILY_OUTPUT_PARSER_H
#define LILY_OUTPUT_PARSER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "lily.h"

typedef enum {
    LILY_OUTPUT_REASONING,       /* text: reasoning delta */
    LILY_OUTPUT_CONTENT,         /* text: content delta */
    LILY_OUTPUT_TOOL_CALL_START, /* tool_index, text: the function name (complete) */
    LILY_OUTPUT_TOOL_ARGUMENTS,  /* tool_index, text: the next fragment of the arguments JSON */
    LILY_OUTPUT_TOOL_CALL_END,   /* tool_index, text: empty; the arguments are complete (unfinished: cut short) */
} lily_output_event_kind;

typedef struct {
    lily_output_event_kind kind;
    int tool_index;              /* 0-based, for the TOOL_* kinds; -1 otherwise */
    const char *text;            /* NUL-terminated; valid only during the callback */
    size_t len;
    bool unfinished;             /* TOOL_CALL_END: the text ended inside the call (max tokens or a stop string
                                  * cut it) and finish closed it, arguments as far as they got */
} lily_output_event;

typedef void (*lily_output_callback)(void *user, const lily_output_event *event);

typedef struct {
    bool thinking;               /* the prompt ends with an open think block ("<think>\n") */
    bool continuation;           /* the prompt ends inside content (an assistant prefill the reply continues):
                                  * content keeps its leading whitespace (" blue" after "The sky is") */
    const json_t *tools;         /* OpenAI tools array for parameter types, or NULL (all values strings) */
    bool verbatim_answer;        /* the answer is constrained output (response_format: JSON by a grammar): from
                                  * the first non-whitespace byte of content before any tool call to the end, the
                                  * text is content as written, no tag read in it ({"</think>": "<tool_call>"}
                                  * is a JSON value); a tool call may still open before the answer begins */
    lily_output_callback on_event; /* may be NULL */
    void *user;
} lily_output_parser_options;

typedef struct {
    char *name;
    char *arguments;             /* JSON object text */
} lily_tool_call;

typedef struct {
    const char *reasoning;       /* NUL-terminated, "" when none */
    size_t reasoning_len;
    const char *content;         /* NUL-terminated, "" when none */
    size_t content_len;
    lily_tool_call *tool_calls;  /* [n_tool_calls] */
    int n_tool_calls;
    bool finished;               /* lily_output_parser_finish was called */
    bool cut_by_length;          /* as passed to lily_output_parser_finish */
    bool call_unfinished;        /* the text ended inside a tool call, before its </function> (or the JSON
                                  * form's closing brace): finish closed the call, arguments as far as they got */
} lily_parsed_output;

typedef struct lily_output_parser lily_output_parser;

/* A parser for one generation. options->tools is referenced (json_incref), not copied.
 * Errors: LILY_ERR_INVALID_ARGUMENT (tools not an array); LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_output_parser_new(const lily_output_parser_options *options, lily_output_parser **out,
                                   lily_error *err);
void lily_output_parser_free(lily_output_parser *p);

/* Feed len bytes of generated text; deltas go to the callback before this returns. Bytes that could be
 * the start of a tag are held until the next feed (or finish). Errors: LILY_ERR_OUT_OF_MEMORY (the
 * parser is then unusable); LILY_ERR_INVALID_ARGUMENT after finish. */
lily_status lily_output_parser_feed(lily_output_parser *p, const char *text, size_t len, lily_error *err);

/* End of generation: process held text, close an unfinished tool call. cut_by_length: generation stopped
 * at max tokens (or the context limit); a function or parameter name it cut (before its ">" or newline) is
 * then dropped, no call or no argument: it may be a prefix of the real name. Errors: as feed. */
lily_status lily_output_parser_finish(lily_output_parser *p, bool cut_by_length, lily_error *err);

/* lily_output_parser_finish for a text a stop string ended (the stop string not fed): a function or parameter
 * name it cut is dropped as one max tokens cut (it may be a prefix of the real name: no call to a tool that
 * does not exist), but cut_by_length stays false. Errors: as feed. */
lily_status lily_output_parser_finish_stopped(lily_output_parser *p, lily_error *err);

/* The result so far (complete after finish); owned by the parser. */
const lily_parsed_output *lily_output_parser_result(const lily_output_parser *p);

/* Whether a rendered prompt leaves a think block open for the model (its last "<think>" comes after its
 * last "</think>"): the value for options.thinking. True for the Qwen3.6 template with enable_thinking
 * (the prompt ends "<think>\n"), false with it off (the prompt ends with an empty think block). */
bool lily_prompt_opens_thinking(const char *prompt, size_t len);

/* "length" when cut by length (a tool call the cut left open after its name is kept, arguments as far as they
 * got), else "tool_calls" when calls were made, else "stop". */
const char *lily_output_finish_reason(const lily_parsed_output *o);

/* The OpenAI choice for a finished output:
 *   {"message": {"role": "assistant", "content": str|null, "reasoning_content": str|null,
 *                "tool_calls": [{"id": ID_PREFIX<index>, "type": "function",
 *                                "function": {"name": str, "arguments": str}}]  (only when there are calls)},
 *    "finish_reason": str}
 * Empty content / reasoning are null. Invalid UTF-8 (never produced from a proper detokenizer) becomes
 * U+FFFD. id_prefix NULL means "call_". Returns a new reference, or NULL when out of memory. */
json_t *lily_output_choice_json(const lily_parsed_output *o, const char *id_prefix);

#endif
