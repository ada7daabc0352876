/* structured.c — the grammar a chat request's output follows (structured.h). */
#include "server/structured.h"

#include <stdio.h>
#include <string.h>

lily_status lily_structured_response_grammar(const lily_oai_request *req, lily_grammar **out, lily_error *err)
{
    *out = NULL;
    if (!req->json_output)
        return LILY_OK;
    return lily_grammar_compile(req->json_schema, LILY_GRAMMAR_JSON, out, err);
}

lily_grammar *lily_structured_tool_grammar(const lily_oai_request *req, const char *name, size_t len)
{
    size_t i;
    json_t *t;
    json_array_foreach(req->tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        const char *n = json_string_value(json_object_get(fn, "name"));
        if (!n || strlen(n) != len || memcmp(n, name, len))
            continue;
        json_t *params = json_object_get(fn, "parameters");
        lily_grammar *g = NULL;
        lily_error err = {0};
        if (lily_grammar_compile(json_is_object(params) ? params : NULL, LILY_GRAMMAR_QWEN_TOOL, &g, &err) != LILY_OK) {
            fprintf(stderr, "lily serve: note: the arguments of tool '%s' are not constrained (%s)\n", n, err.message);
            return NULL;
        }
        return g;
    }
    return NULL;
}
