/* structured.c — the grammar a chat request's output follows (structured.h). */
#include "server/structured.h"

#include <math.h>
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

/* Can the call still open at this step? */
static bool call_can_open(const lily_structured_or_call *c)
{
    return !c->waiting && !c->begun && !c->released;
}

static int or_call_mask(void *user, float *logits, int vocab)
{
    lily_structured_or_call *c = user;
    if (c->released)
        return 0;
    if (!call_can_open(c) || c->call_open >= vocab)
        return c->inner.mask(c->inner.user, logits, vocab);
    const float open_logit = logits[c->call_open];
    int n = c->inner.mask(c->inner.user, logits, vocab);
    if (n == 0) /* no constraint at this step: the opening is allowed already */
        return 0;
    if (n < 0) { /* inner allows nothing: only the opening */
        for (int v = 0; v < vocab; v++)
            logits[v] = -INFINITY;
        n = 0;
    }
    if (logits[c->call_open] == -INFINITY && open_logit != -INFINITY)
        n++;
    logits[c->call_open] = open_logit;
    return n;
}

static int or_call_allowed(void *user, uint32_t *bits, int vocab)
{
    lily_structured_or_call *c = user;
    if (c->released)
        return 0;
    int n = c->inner.allowed(c->inner.user, bits, vocab);
    if (n == 0 || !call_can_open(c) || c->call_open >= vocab)
        return n;
    if (n < 0) {
        memset(bits, 0, (size_t)(vocab + 31) / 32 * sizeof *bits);
        n = 0;
    }
    uint32_t bit = 1u << (c->call_open & 31);
    if (!(bits[c->call_open >> 5] & bit)) {
        bits[c->call_open >> 5] |= bit;
        n++;
    }
    return n;
}

static void or_call_accept(void *user, int32_t token)
{
    lily_structured_or_call *c = user;
    if (c->released)
        return;
    if (call_can_open(c) && token == c->call_open) {
        c->released = true;
        return;
    }
    if (c->waiting) {
        c->waiting = token != c->think_close;
    } else if (!c->begun) {
        size_t len = 0;
        const char *bytes = lily_tokenizer_token_bytes(c->tok, token, &len);
        for (size_t i = 0; bytes && i < len && !c->begun; i++)
            c->begun = !memchr(" \t\r\n", bytes[i], 4);
    }
    c->inner.accept(c->inner.user, token);
}

/* Stop strings stay on until the value has begun (then inner masks every later token) or for good once the
 * call has opened. */
static bool or_call_masking(void *user)
{
    lily_structured_or_call *c = user;
    return !c->released && c->begun && (!c->inner.masking || c->inner.masking(c->inner.user));
}

lily_token_constraint lily_structured_or_call_hook(lily_structured_or_call *c)
{
    c->waiting = c->think_close >= 0;
    c->begun = c->released = false;
    return (lily_token_constraint){.user = c, .mask = or_call_mask,
                                   .allowed = c->inner.allowed ? or_call_allowed : NULL, .accept = or_call_accept,
                                   .masking = or_call_masking};
}
