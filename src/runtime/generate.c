/* generate.c — prefill, then the decode loop: sample, stop checks, stream, append (generate.h).
 *
 * Owns: the order of a step and the bookkeeping (counts, timing, finish reason). Per step:
 *   cancel flag? -> sample from s->logits -> stop id? -> detokenize -> stop strings -> callback
 *   -> max_tokens / context full? -> lily_session_append (one decode forward)
 */
#include "runtime/generate.h"

#include <stdlib.h>

#include "base/clock.h"
#include "runtime/stop_strings.h"

lily_generate_params lily_generate_defaults(void)
{
    lily_generate_params p = {0};
    p.sampling = lily_sampler_defaults();
    return p;
}

const char *lily_finish_reason_name(lily_finish_reason f)
{
    switch (f) {
    case LILY_FINISH_STOP: return "stop";
    case LILY_FINISH_LENGTH: return "length";
    case LILY_FINISH_CANCELLED: return "cancelled";
    }
    return "?";
}

static lily_status tokenizer_feed(void *state, int32_t token, const char **text, size_t *len, lily_error *err)
{
    return lily_detokenizer_feed(state, token, text, len, err);
}

static lily_status tokenizer_flush(void *state, const char **text, size_t *len, lily_error *err)
{
    return lily_detokenizer_flush(state, text, len, err);
}

lily_detok_interface lily_detok_for_tokenizer(lily_detokenizer *d)
{
    return (lily_detok_interface){d, tokenizer_feed, tokenizer_flush};
}

static bool is_stop_id(const lily_generate_params *p, int32_t token)
{
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] == token)
            return true;
    return false;
}

static void finish_timing(lily_generate_result *r, double t_decode_start)
{
    r->decode_seconds = lily_wall_seconds() - t_decode_start;
    r->decode_tokens_per_second = r->n_decode_steps > 0 && r->decode_seconds > 0
                                      ? (double)r->n_decode_steps / r->decode_seconds : 0.0;
}

/* One step's text through the stop matcher: token >= 0 is fed to the detokenizer, token < 0 flushes it.
 * *out, *out_len: the bytes safe to stream now; *matched: the index of the stop string completed, or -1.
 * Errors: the detokenizer's; LILY_ERR_OUT_OF_MEMORY from the stop matcher. */
static lily_status detokenize_and_match(const lily_generate_params *p, lily_stop_matcher *stops, int32_t token,
                                        const char **out, size_t *out_len, int *matched, lily_error *err)
{
    const char *text = "";
    size_t len = 0;
    *out = "";
    *out_len = 0;
    *matched = -1;
    lily_status st = LILY_OK;
    if (token >= 0 && p->detok.feed)
        st = p->detok.feed(p->detok.state, token, &text, &len, err);
    else if (token < 0 && p->detok.flush)
        st = p->detok.flush(p->detok.state, &text, &len, err);
    if (st != LILY_OK)
        return st;
    *matched = lily_stop_matcher_feed(stops, text, len, out, out_len, err);
    return *matched == -2 ? LILY_ERR_OUT_OF_MEMORY : LILY_OK;
}

lily_status lily_generate(lily_session *s, const int32_t *prompt, int n_prompt, const lily_generate_params *params,
                          lily_generate_result *result, lily_error *err)
{
    lily_generate_result *r = result;
    *r = (lily_generate_result){.finish = LILY_FINISH_STOP, .stop_token = -1, .stop_string = -1, .last_token = -1};
    const lily_generate_params *p = params;
    if (n_prompt < 0 || (n_prompt > 0 && !prompt))
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "generate: bad prompt (%d tokens)", n_prompt);
    if (n_prompt == 0 && s->n_tokens == 0)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "generate: empty prompt and an empty session");
    if (p->n_stop_strings > 0 && !p->detok.feed)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "generate: stop strings need a detokenizer");
    if (p->n_stop_ids < 0 || (p->n_stop_ids > 0 && !p->stop_ids))
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "generate: bad stop id list");

    lily_sampler *sampler = NULL;
    lily_stop_matcher *stops = NULL;
    lily_status st = lily_sampler_new(&p->sampling, s->engine->cfg.vocab_size, &sampler, err);
    if (st != LILY_OK)
        return st;
    st = lily_stop_matcher_new(p->stop_strings, p->n_stop_strings, &stops, err);
    if (st != LILY_OK)
        goto done;

    /* prefill */
    double t0 = lily_wall_seconds();
    if (n_prompt > 0) {
        st = lily_session_append(s, prompt, n_prompt, NULL, err);
        if (st != LILY_OK)
            goto done;
    }
    double t_decode_start = lily_wall_seconds();
    r->n_prompt = n_prompt;
    r->prefill_seconds = t_decode_start - t0;
    r->prefill_tokens_per_second = n_prompt > 0 && r->prefill_seconds > 0 ? n_prompt / r->prefill_seconds : 0.0;
    st = lily_sampler_add_context(sampler, s->tokens, s->n_tokens, err);
    if (st != LILY_OK)
        goto done;

    bool callback_stopped = false;
    for (;;) {
        if (p->cancel && atomic_load(p->cancel)) {
            r->finish = LILY_FINISH_CANCELLED;
            break;
        }
        int32_t token = lily_sampler_sample(sampler, s->logits);
        if (is_stop_id(p, token)) {
            r->finish = LILY_FINISH_STOP;
            r->stop_token = token;
            break;
        }
        st = lily_sampler_accept(sampler, token, err);
        if (st != LILY_OK)
            goto done;
        r->n_generated++;

        const char *out;
        size_t out_len;
        int matched;
        st = detokenize_and_match(p, stops, token, &out, &out_len, &matched, err);
        if (st != LILY_OK)
            goto done;
        if (p->on_token && p->on_token(p->user, token, out, out_len) != 0)
            callback_stopped = true;
        if (matched >= 0) {
            r->finish = LILY_FINISH_STOP;
            r->stop_string = matched;
            r->last_token = token;
            break;
        }
        if (callback_stopped) {
            r->finish = LILY_FINISH_CANCELLED;
            r->last_token = token;
            break;
        }
        if ((p->max_tokens > 0 && r->n_generated >= p->max_tokens) || s->n_tokens >= s->max_ctx) {
            r->finish = LILY_FINISH_LENGTH;
            r->last_token = token;
            break;
        }
        st = lily_session_append(s, &token, 1, NULL, err);
        if (st != LILY_OK)
            goto done;
        r->n_decode_steps++;
    }

    /* Release what the detokenizer and the stop matcher still hold (nothing after a stop string). */
    if (r->stop_string < 0 && !callback_stopped) {
        const char *out;
        size_t out_len;
        int matched;
        st = detokenize_and_match(p, stops, -1, &out, &out_len, &matched, err);
        if (st != LILY_OK)
            goto done;
        if (p->on_token && out_len > 0)
            p->on_token(p->user, -1, out, out_len);
        if (matched < 0) {
            matched = lily_stop_matcher_flush(stops, &out, &out_len);
            if (p->on_token && out_len > 0)
                p->on_token(p->user, -1, out, out_len);
        }
        if (matched >= 0) { /* a stop string completed by the flushed bytes, or nested in held text */
            r->finish = LILY_FINISH_STOP;
            r->stop_string = matched;
        }
    }
    finish_timing(r, t_decode_start);
    st = LILY_OK;
done:
    lily_stop_matcher_free(stops);
    lily_sampler_free(sampler);
    return st;
}
