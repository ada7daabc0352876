/* generate.c — prefill, then the decode loop: sample, stop checks, stream, append (generate.h).
 *
 * Owns: the order of a step and the bookkeeping (counts, timing, finish reason). Per step:
 *   cancel flag? -> sample from s->logits -> stop id? -> detokenize -> stop strings -> callback
 *   -> max_tokens / context full? -> lily_session_append (one decode forward)
 * and the device loop (generate.h): the same checks per token as the backend's decode_loop streams the
 * tokens, batches with a recurrent-state checkpoint at each start, and the undo of steps run past a stop.
 * A constraint's mask for the next token is computed as each token arrives (the device runs the next
 * step's forward pass meanwhile) and handed to decode_loop as bits.
 */
#include "runtime/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/clock.h"
#include "runtime/logprobs.h"
#include "runtime/stop_strings.h"

/* Device-loop batches: floor(sqrt(tokens generated so far)) steps, within [MIN, MAX]. A batch costs a
 * recurrent-state checkpoint and one synchronization; a stop inside it costs re-running its kept steps
 * (about half a batch) through forward(), so batches grow with the generation (the sum of both is
 * least near sqrt of the length). */
#define DEVICE_BATCH_MIN 8
#define DEVICE_BATCH_MAX 64

lily_generate_params lily_generate_defaults(void)
{
    lily_generate_params p = {0};
    p.sampling = lily_sampler_defaults();
    p.reasoning_budget = -1;
    p.think_end_id = -1;
    p.logprobs = -1;
    return p;
}

lily_status lily_think_close_tokens(const lily_tokenizer *tok, int32_t **ids, int *n, int32_t *end_id,
                                    lily_error *err)
{
    *ids = NULL;
    *n = 0;
    *end_id = lily_tokenizer_token_id(tok, "</think>");
    if (*end_id < 0)
        return lily_error_set(err, LILY_ERR_UNSUPPORTED, "the vocabulary has no '</think>' token: no reasoning budget");
    static const char close[] = "\n</think>\n\n";
    return lily_tokenizer_encode(tok, close, sizeof close - 1, true, ids, n, err);
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
    if (!stops) { /* no stop strings matched here (constrained text) */
        *out = text;
        *out_len = len;
        return LILY_OK;
    }
    *matched = lily_stop_matcher_feed(stops, text, len, out, out_len, err);
    return *matched == -2 ? LILY_ERR_OUT_OF_MEMORY : LILY_OK;
}

/* The state of one lily_generate call, shared by the host loop and the device loop's callback. */
typedef struct {
    lily_session *s;
    const lily_generate_params *p;
    lily_generate_result *r;
    lily_sampler *sampler;
    lily_stop_matcher *stops;
    bool stops_off;                   /* the constraint masks: stop strings are no longer matched */
    char *joined;                     /* [joined_cap] held text released as they went off, then the token's */
    size_t joined_cap;
    bool callback_stopped;
    bool thinking;                    /* inside the think block a reasoning budget watches (false without one) */
    int n_forced;                     /* think_close tokens forced so far */
    lily_error *err;
    float *masked;                    /* [vocab] the constraint's copy of the logits, or NULL */
    const lily_token_logprobs *device_lp; /* the device loop's logprobs of the token being taken, or NULL */
    int32_t *history_ids;             /* [vocab] the sampler's penalty history for the device loop */
    uint32_t *history_counts;         /* [vocab] */
    int32_t *bias_ids;                /* [n_logit_bias] the logit bias for the device loop */
    float *bias_values;
    uint32_t *mask_bits;              /* [(vocab + 31) / 32] the constraint's mask of the next token (device loop) */
    int mask_state;                   /* what mask_bits says: 1 the bits, 0 every token, -1 no token may follow */
} gen_state;

static bool cancelled(const lily_generate_params *p) { return p->cancel && atomic_load(p->cancel); }

/* Append len bytes to g->joined at *at. False: out of memory (err set). */
static bool join_text(gen_state *g, size_t *at, const char *text, size_t len)
{
    if (*at + len + 1 > g->joined_cap) {
        size_t cap = LILY_MAX(2 * g->joined_cap, *at + len + 1);
        char *p = realloc(g->joined, cap);
        if (!p) {
            lily_error_set(g->err, LILY_ERR_OUT_OF_MEMORY, "generate: out of memory");
            return false;
        }
        g->joined = p;
        g->joined_cap = cap;
    }
    if (len)
        memcpy(g->joined + *at, text, len);
    *at += len;
    return true;
}

/* The text of a taken token (the constraint has accepted it) through the stop strings, as
 * detokenize_and_match; when the constraint starts masking at this token, the stop matcher first releases
 * what it held (a stop string wholly inside it still matches: then this token's text is dropped) and is off
 * from then on (generate.h). */
static lily_status token_text(gen_state *g, int32_t token, const char **out, size_t *out_len, int *matched)
{
    const lily_generate_params *p = g->p;
    size_t released = 0;
    if (!g->stops_off && p->constraint && p->constraint->masking && p->constraint->masking(p->constraint->user)) {
        g->stops_off = true;
        const char *held;
        size_t held_len;
        *matched = lily_stop_matcher_flush(g->stops, &held, &held_len);
        if (!join_text(g, &released, held, held_len))
            return LILY_ERR_OUT_OF_MEMORY;
        if (*matched >= 0) {
            *out = g->joined;
            *out_len = released;
            return LILY_OK;
        }
    }
    lily_status st = detokenize_and_match(p, g->stops_off ? NULL : g->stops, token, out, out_len, matched, g->err);
    if (st != LILY_OK || released == 0)
        return st;
    size_t at = released;
    if (!join_text(g, &at, *out, *out_len))
        return LILY_ERR_OUT_OF_MEMORY;
    *out = g->joined;
    *out_len = at;
    return LILY_OK;
}

/* LILY_ERR_BACKEND when a logit the sampler is about to read is NaN or infinite: the forward pass
 * overflowed (or the weights hold such values), and any token drawn from it would be noise. */
static lily_status check_logits(const lily_session *s, lily_error *err)
{
    const int vocab = s->engine->cfg.vocab_size;
    float sum = 0.0f; /* NaN or infinite when any term is: one pass, no branch per logit */
    for (int i = 0; i < vocab; i++)
        sum += s->logits[i] * 0.0f;
    if (sum == 0.0f)
        return LILY_OK;
    int at = 0;
    while (at < vocab && isfinite(s->logits[at]))
        at++;
    return lily_error_set(err, LILY_ERR_BACKEND,
                          "the forward pass gave a non-finite logit (%g for token id %d) after %d tokens: the model's "
                          "arithmetic overflowed or its weights are corrupt",
                          at < vocab ? (double)s->logits[at] : 0.0, at, s->n_tokens);
}

/* A chosen token through the loop's checks: stop id, the sampler's history, text and stop strings, the
 * callback, max_tokens and a full context. *stop: generation ends with this token (r->finish and the
 * rest set as generate.h says); it is then not appended. Errors: the sampler's, the detokenizer's. */
static lily_status take_token(gen_state *g, int32_t token, bool *stop)
{
    const lily_generate_params *p = g->p;
    lily_generate_result *r = g->r;
    *stop = true;
    if (is_stop_id(p, token)) {
        r->finish = LILY_FINISH_STOP;
        r->stop_token = token;
        return LILY_OK;
    }
    lily_status st = lily_sampler_accept(g->sampler, token, g->err);
    if (st != LILY_OK)
        return st;
    r->n_generated++;
    if (p->constraint)
        p->constraint->accept(p->constraint->user, token);

    const char *out;
    size_t out_len;
    int matched = -1;
    st = token_text(g, token, &out, &out_len, &matched);
    if (st != LILY_OK)
        return st;
    if (p->token_logprobs && p->logprobs >= 0) { /* the logprobs the callback reads */
        if (g->device_lp)
            *p->token_logprobs = *g->device_lp;
        else
            lily_logprobs_compute(g->s->logits, g->s->engine->cfg.vocab_size, token, p->logprobs, p->token_logprobs);
    }
    if (p->on_token && p->on_token(p->user, token, out, out_len) != 0)
        g->callback_stopped = true;
    if (g->thinking) {
        if (token == p->think_end_id)
            g->thinking = false;
        else
            r->n_reasoning++;
    }
    if (matched >= 0) {
        r->finish = LILY_FINISH_STOP;
        r->stop_string = matched;
        r->last_token = token;
        return LILY_OK;
    }
    if (g->callback_stopped) {
        r->finish = LILY_FINISH_CANCELLED;
        r->last_token = token;
        return LILY_OK;
    }
    /* the token fills the context's last position: the prompt and the reply together never exceed it
     * (vLLM's prompt + completion <= max_model_len); appending it would leave nothing to sample from */
    if ((p->max_tokens > 0 && r->n_generated >= p->max_tokens) || g->s->n_tokens + 1 >= g->s->max_ctx) {
        r->finish = LILY_FINISH_LENGTH;
        r->last_token = token;
        return LILY_OK;
    }
    *stop = false;
    return LILY_OK;
}

/* The reasoning budget's forced close is next or under way: the host loop chooses those tokens (the device
 * loop hands back before them). */
static bool forcing_due(const gen_state *g)
{
    const lily_generate_params *p = g->p;
    if (p->n_think_close <= 0 || p->reasoning_budget < 0)
        return false;
    if (g->n_forced > 0)
        return g->n_forced < p->n_think_close;
    return g->thinking && g->r->n_reasoning >= p->reasoning_budget;
}

/* The next token of the forced think close, when the reasoning budget is spent (generate.h). */
static bool next_forced(gen_state *g, int32_t *token)
{
    if (!forcing_due(g))
        return false;
    if (g->n_forced == 0) {
        g->thinking = false;
        g->r->reasoning_cut = true;
    }
    *token = g->p->think_close[g->n_forced++];
    return true;
}

/* The next token on the host path: the reasoning budget's forced close, else a draw from the logits (masked
 * by the constraint). *none: the constraint allows no token. */
static int32_t choose_token(gen_state *g, bool *none)
{
    const lily_generate_params *p = g->p;
    lily_session *s = g->s;
    int32_t token;
    *none = false;
    if (next_forced(g, &token))
        return token;
    if (!p->constraint)
        return lily_sampler_sample(g->sampler, s->logits);
    const int vocab = s->engine->cfg.vocab_size;
    memcpy(g->masked, s->logits, (size_t)vocab * sizeof *g->masked);
    int allowed = p->constraint->mask(p->constraint->user, g->masked, vocab);
    if (allowed < 0) {
        *none = true;
        return -1;
    }
    return lily_sampler_sample(g->sampler, allowed ? g->masked : s->logits);
}

/* ---- the device loop ----------------------------------------------------------------------------- */

/* NULL when the device loop can decode these settings (*ds filled but for the logit bias table and the
 * per-batch fields: draw0 and the penalty history), else why not (for logs). The device sampler takes
 * every sampler.h setting. */
static const char *device_loop_refusal(const gen_state *g, lily_device_sampling *ds)
{
    const lily_session *s = g->s;
    const lily_generate_params *p = g->p;
    const lily_backend_ops *o = s->engine->backend.ops;
    const lily_sampler_params *sp = &p->sampling;
    const char *env = getenv("LILY_DECODE_LOOP");
    if (p->decode == LILY_DECODE_HOST)
        return "host sampler (asked for)";
    if (env && (!strcmp(env, "host") || !strcmp(env, "0")))
        return "host sampler (LILY_DECODE_LOOP)";
    if (p->constraint && !p->constraint->allowed)
        return "host sampler (the constraint has no token bit mask)";
    if (!o || !o->decode_loop || !o->recurrent_bytes || !o->recurrent_save || !o->recurrent_load)
        return "host sampler (the backend has no device loop)";
    *ds = (lily_device_sampling){.temperature = sp->temperature,
                                 .top_k = sp->top_k,
                                 .top_p = sp->top_p,
                                 .min_p = sp->min_p,
                                 .presence_penalty = sp->presence_penalty,
                                 .frequency_penalty = sp->frequency_penalty,
                                 .repetition_penalty = sp->repetition_penalty,
                                 .seed = sp->seed,
                                 .top_logprobs = p->token_logprobs ? p->logprobs : -1};
    return NULL;
}

/* The constraint's mask of the token after the ones taken so far into g->mask_bits / g->mask_state
 * (returned). */
static int next_mask(gen_state *g)
{
    const lily_token_constraint *c = g->p->constraint;
    const int n = c->allowed(c->user, g->mask_bits, g->s->engine->cfg.vocab_size);
    g->mask_state = n > 0 ? 1 : n < 0 ? -1 : 0;
    return g->mask_state;
}

/* lily_device_sampling.token_mask: the mask next_mask computed when the step's input token was taken. */
static int device_token_mask(void *user, int index, uint32_t *bits)
{
    (void)index;
    const gen_state *g = user;
    if (g->mask_state <= 0)
        return 0;
    memcpy(bits, g->mask_bits, (size_t)(g->s->engine->cfg.vocab_size + 31) / 32 * sizeof *bits);
    return 1;
}

/* The device loop's copies of the logit bias and room for the penalty history (only what the settings
 * use). Errors: LILY_ERR_OUT_OF_MEMORY. */
static lily_status device_tables_new(gen_state *g, lily_error *err)
{
    const lily_sampler_params *sp = &g->p->sampling;
    const int vocab = g->s->engine->cfg.vocab_size;
    if (sp->n_logit_bias > 0) {
        g->bias_ids = malloc((size_t)sp->n_logit_bias * sizeof *g->bias_ids);
        g->bias_values = malloc((size_t)sp->n_logit_bias * sizeof *g->bias_values);
        if (!g->bias_ids || !g->bias_values)
            return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "generate: out of memory");
        for (int i = 0; i < sp->n_logit_bias; i++) {
            g->bias_ids[i] = sp->logit_bias[i].token;
            g->bias_values[i] = sp->logit_bias[i].bias;
        }
    }
    if (g->p->constraint && !(g->mask_bits = malloc((size_t)(vocab + 31) / 32 * sizeof *g->mask_bits)))
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "generate: out of memory");
    if (sp->presence_penalty != 0.0f || sp->frequency_penalty != 0.0f || sp->repetition_penalty != 1.0f) {
        g->history_ids = malloc((size_t)vocab * sizeof *g->history_ids);
        g->history_counts = malloc((size_t)vocab * sizeof *g->history_counts);
        if (!g->history_ids || !g->history_counts)
            return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "generate: out of memory");
    }
    return LILY_OK;
}

/* Where the batch-start checkpoint of the recurrent state lives: a device pool when the backend has
 * them, else host memory. */
typedef struct {
    lily_state_loc loc;
    void *pool;
    void *host;
} checkpoint;

static lily_status checkpoint_new(const lily_session *s, checkpoint *ck, lily_error *err)
{
    const lily_backend *b = &s->engine->backend;
    const size_t bytes = b->ops->recurrent_bytes(b->ctx);
    memset(ck, 0, sizeof *ck);
    if (b->ops->device_pool_new) {
        lily_status st = b->ops->device_pool_new(b->ctx, bytes, &ck->pool, err);
        ck->loc.device_pool = ck->pool;
        return st;
    }
    ck->host = malloc(bytes ? bytes : 1);
    ck->loc.host = ck->host;
    return ck->host ? LILY_OK
                    : lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "generate: out of memory for a %zu-byte checkpoint",
                                     bytes);
}

static void checkpoint_free(const lily_session *s, checkpoint *ck)
{
    const lily_backend *b = &s->engine->backend;
    if (ck->pool && b->ops->device_pool_free)
        b->ops->device_pool_free(b->ctx, ck->pool);
    free(ck->host);
    memset(ck, 0, sizeof *ck);
}

/* One decode_loop call. tokens[0]: the batch's first input (chosen and kept before the call); tokens[i]:
 * the token step i - 1 chose. kept: the steps whose input the session took over (appended to s->tokens
 * as each step's token arrives, as the host loop appends before it samples the next). batch_end: the last
 * step's token went on (no stop); the callback still returned nonzero so that decode_loop writes that
 * step's logits to s->logits, which keeps the session whole (tokens, state, logits) at every batch start:
 * an error in a later batch rolls back to a session whose logits match its tokens. handback: -1, or the
 * token (taken, not appended) after which the constraint allows no token: the batch stops there and the
 * host loop appends it and ends the generation as it would. */
typedef struct {
    gen_state *g;
    int32_t tokens[DEVICE_BATCH_MAX + 1];
    int n;
    int kept;
    bool stopped;
    bool batch_end;
    int32_t handback;
    lily_status status;
} device_batch;

/* decode_loop's per-token call: token `index` was chosen by step `index`, whose input is now in the
 * session; then the host loop's steps for the token (the cancel flag first, as the host loop checks it
 * before sampling). */
static int on_device_token(void *user, int32_t token, int index, const lily_token_logprobs *logprobs)
{
    device_batch *b = user;
    gen_state *g = b->g;
    lily_session *s = g->s;
    if (b->stopped || b->batch_end)
        return 1;
    b->stopped = true;
    if (index != b->kept || index >= b->n) {
        b->status = lily_error_set(g->err, LILY_ERR_BACKEND, "generate: the decode loop sent token %d of %d out of order",
                                   index, b->n);
        return 1;
    }
    s->tokens[s->n_tokens++] = b->tokens[index];
    b->kept++;
    g->r->n_decode_steps++;
    if (cancelled(g->p)) {
        g->r->finish = LILY_FINISH_CANCELLED;
        return 1;
    }
    bool stop = false;
    g->device_lp = logprobs;
    b->status = take_token(g, token, &stop);
    g->device_lp = NULL;
    if (b->status != LILY_OK || stop)
        return 1;
    if (g->p->constraint && next_mask(g) < 0) { /* nothing may follow: the host loop ends it */
        b->handback = token;
        return 1;
    }
    b->tokens[index + 1] = token;
    b->stopped = false;
    if (index == b->n - 1) { /* no further step: ask for this one's logits (see device_batch) */
        b->batch_end = true;
        return 1;
    }
    return 0;
}

/* Decode from `first` (chosen, kept, not yet appended) with the backend's decode_loop until the host
 * loop's checks stop it; the session then holds what the host loop's would (tokens, state, logits).
 * *declined: the first call returned LILY_ERR_UNSUPPORTED before any token (e.g. a CUDA engine with a
 * debug hook): nothing happened, the host loop takes over from `first` (returns LILY_OK).
 * *handback: -1, or the token (chosen and kept, not appended) after which the reasoning budget forces
 * the think close (a batch never runs past the budget) or the constraint allows no token: the host loop
 * appends it, then forces the close or ends. g->mask_state: the mask after `first` (with a constraint). */
static lily_status device_decode(gen_state *g, int32_t first, lily_device_sampling *ds, const checkpoint *ck,
                                 bool *declined, int32_t *handback)
{
    lily_session *s = g->s;
    const lily_generate_params *p = g->p;
    lily_generate_result *r = g->r;
    const lily_backend *be = &s->engine->backend;
    lily_error *err = g->err;
    device_batch b;
    for (;;) {
        int n = DEVICE_BATCH_MIN;
        while (n < DEVICE_BATCH_MAX && (n + 1) * (n + 1) <= r->n_generated)
            n++;
        /* the steps left before max_tokens / a full context stop generation (take_token let `first`
         * through, so both are >= 1): a batch never runs past them */
        if (p->max_tokens > 0 && n > p->max_tokens - r->n_generated)
            n = p->max_tokens - r->n_generated;
        if (n > s->max_ctx - 1 - s->n_tokens)
            n = s->max_ctx - 1 - s->n_tokens;
        /* inside a think block under a budget: at most the reasoning tokens left (>= 1: not forcing_due) */
        if (g->thinking && n > p->reasoning_budget - r->n_reasoning)
            n = p->reasoning_budget - r->n_reasoning;
        lily_status st = be->ops->recurrent_save(be->ctx, s->state, ck->loc, err);
        if (st != LILY_OK)
            return st;
        const int n_start = s->n_tokens;
        /* the sampler's state as the host loop would draw from it: draw index and penalty history */
        ds->draw0 = lily_sampler_draw_index(g->sampler);
        if (g->history_ids) {
            ds->n_history = lily_sampler_history(g->sampler, g->history_ids, g->history_counts);
            ds->history_ids = g->history_ids;
            ds->history_counts = g->history_counts;
        }
        b = (device_batch){.g = g, .n = n, .handback = -1, .status = LILY_OK};
        b.tokens[0] = first;
        int n_run = 0;
        r->n_device_batches++;
        st = be->ops->decode_loop(be->ctx, s->state, first, n, ds, on_device_token, &b, s->logits, &n_run, err);
        if (st == LILY_OK && !b.stopped && n_run != n)
            st = lily_error_set(err, LILY_ERR_BACKEND, "generate: the decode loop ran %d of %d steps", n_run, n);
        if (st != LILY_OK) {
            /* leave the session at the batch start, as a failed append of `first` would */
            lily_error ignored;
            be->ops->recurrent_load(be->ctx, s->state, ck->loc, &ignored);
            s->n_tokens = n_start;
            r->n_decode_steps -= b.kept;
            if (st == LILY_ERR_UNSUPPORTED && r->n_device_batches == 1 && b.kept == 0 && n_run == 0) {
                r->n_device_batches = 0;
                *declined = true;
                return LILY_OK;
            }
            return st;
        }
        if (b.stopped && n_run != b.kept) {
            /* the device ran past the stop: back to the batch start, then the kept steps one forward() at a
             * time, exactly the host loop's appends (and its logits) */
            s->n_tokens = n_start;
            r->n_decode_steps -= b.kept;
            st = be->ops->recurrent_load(be->ctx, s->state, ck->loc, err);
            for (int i = 0; i < b.kept && st == LILY_OK; i++) {
                st = lily_session_append(s, &b.tokens[i], 1, NULL, err);
                if (st == LILY_OK) {
                    r->n_decode_steps++;
                    r->n_replayed++;
                }
            }
            if (st != LILY_OK)
                return st;
        }
        /* else the state is where the host loop's would be, and decode_loop wrote s->logits (a stop or the
         * batch end) */
        if (b.stopped) {
            if (b.status == LILY_OK && b.handback >= 0)
                *handback = b.handback;
            return b.status;
        }
        lily_sampler_set_draw_index(g->sampler, ds->draw0 + (uint64_t)n); /* the batch drew n tokens */
        first = b.tokens[n];
        if (forcing_due(g)) {
            *handback = first;
            return LILY_OK;
        }
    }
}

lily_status lily_generate(lily_session *s, const int32_t *prompt, int n_prompt, const lily_generate_params *params,
                          lily_generate_result *result, lily_error *err)
{
    lily_generate_result *r = result;
    *r = (lily_generate_result){.finish = LILY_FINISH_STOP, .stop_token = -1, .stop_string = -1, .last_token = -1,
                                .decode_path = "host sampler"};
    const lily_generate_params *p = params;
    if (n_prompt < 0 || (n_prompt > 0 && !prompt))
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "generate: bad prompt (%d tokens)", n_prompt);
    if (n_prompt == 0 && s->n_tokens == 0)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "generate: empty prompt and an empty session");
    if (p->n_stop_strings > 0 && !p->detok.feed)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "generate: stop strings need a detokenizer");
    if (p->n_stop_ids < 0 || (p->n_stop_ids > 0 && !p->stop_ids))
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "generate: bad stop id list");
    if (p->n_think_close < 0 || (p->n_think_close > 0 && !p->think_close))
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "generate: bad think-close token list");

    gen_state g = {.s = s, .p = p, .r = r, .err = err, .thinking = p->n_think_close > 0 && p->reasoning_budget >= 0};
    checkpoint ck = {0};
    bool have_ck = false;
    lily_device_sampling ds;
    lily_status st = lily_sampler_new(&p->sampling, s->engine->cfg.vocab_size, &g.sampler, err);
    if (st != LILY_OK)
        return st;
    if (p->logprobs > LILY_TOP_LOGPROBS_MAX) {
        st = lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "generate: logprobs %d > %d", p->logprobs,
                            LILY_TOP_LOGPROBS_MAX);
        goto done;
    }
    const char *refusal = device_loop_refusal(&g, &ds);
    if (refusal)
        r->decode_path = refusal;
    else if ((st = device_tables_new(&g, err)) != LILY_OK)
        goto done;
    if (!refusal && g.bias_ids) {
        ds.bias_ids = g.bias_ids;
        ds.bias_values = g.bias_values;
        ds.n_bias = p->sampling.n_logit_bias;
    }
    if (!refusal && p->constraint) {
        ds.token_mask = device_token_mask;
        ds.mask_user = &g;
    }
    st = lily_stop_matcher_new(p->stop_strings, p->n_stop_strings, &g.stops, err);
    if (st != LILY_OK)
        goto done;
    if (p->constraint && !(g.masked = malloc((size_t)s->engine->cfg.vocab_size * sizeof *g.masked))) {
        st = lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "generate: out of memory");
        goto done;
    }

    /* prefill, a chunk per append (the chunks lily_session_append would cut, so the same forward passes):
     * a cancel between two stops it there, as between two tokens; a long prompt on a CPU takes minutes */
    double t0 = lily_wall_seconds();
    const int chunk = s->engine->prefill_chunk > 0 ? s->engine->prefill_chunk : n_prompt;
    /* what one append would refuse whole is refused before the first chunk */
    if (n_prompt > chunk && (st = lily_session_check_new_tokens(s, prompt, n_prompt, err)) != LILY_OK)
        goto done;
    int prefilled = 0;
    while (prefilled < n_prompt && !(prefilled > 0 && cancelled(p))) {
        const int m = LILY_MIN(chunk, n_prompt - prefilled);
        st = lily_session_append(s, prompt + prefilled, m, NULL, err);
        if (st != LILY_OK)
            goto done;
        prefilled += m;
    }
    double t_decode_start = lily_wall_seconds();
    r->n_prompt = prefilled;
    r->prefill_seconds = t_decode_start - t0;
    r->prefill_tokens_per_second = prefilled > 0 && r->prefill_seconds > 0 ? prefilled / r->prefill_seconds : 0.0;
    st = lily_sampler_add_context(g.sampler, s->tokens, s->n_tokens, err);
    if (st != LILY_OK)
        goto done;

    for (;;) {
        if (cancelled(p)) {
            r->finish = LILY_FINISH_CANCELLED;
            break;
        }
        if (s->n_tokens >= s->max_ctx) { /* a prompt (or forced tokens) that filled it: no room for a reply */
            r->finish = LILY_FINISH_LENGTH;
            break;
        }
        if ((st = check_logits(s, err)) != LILY_OK)
            goto done;
        bool none = false;
        int32_t token = choose_token(&g, &none);
        if (none) { /* the constraint is complete: nothing may follow */
            r->finish = LILY_FINISH_STOP;
            break;
        }
        bool stop = false;
        st = take_token(&g, token, &stop);
        if (st != LILY_OK)
            goto done;
        if (stop)
            break;
        if (!refusal && !have_ck) { /* the first token kept: the device loop takes over from here */
            lily_error ignored;
            if (checkpoint_new(s, &ck, &ignored) == LILY_OK) {
                have_ck = true;
            } else {
                checkpoint_free(s, &ck);
                refusal = r->decode_path = "host sampler (no memory for the recurrent-state checkpoint)";
            }
        }
        /* the device loop starts with the mask of the next token; none allowed: the host loop ends it */
        if (have_ck && !forcing_due(&g) && (!p->constraint || next_mask(&g) >= 0)) {
            bool declined = false;
            int32_t handback = -1;
            st = device_decode(&g, token, &ds, &ck, &declined, &handback);
            if (!declined) {
                r->device_loop = true;
                r->decode_path = "device loop";
                if (st != LILY_OK)
                    goto done;
                if (handback < 0)
                    break;
                token = handback; /* append it, then force the think close or end (no token allowed) */
            } else {
                checkpoint_free(s, &ck);
                have_ck = false;
                refusal = r->decode_path = "host sampler (the backend declined the device loop)";
            }
        }
        st = lily_session_append(s, &token, 1, NULL, err);
        if (st != LILY_OK)
            goto done;
        r->n_decode_steps++;
    }

    /* Release what the detokenizer and the stop matcher still hold (nothing after a stop string). */
    if (r->stop_string < 0 && !g.callback_stopped) {
        const char *out;
        size_t out_len;
        int matched;
        st = detokenize_and_match(p, g.stops_off ? NULL : g.stops, -1, &out, &out_len, &matched, err);
        if (st != LILY_OK)
            goto done;
        if (p->on_token && out_len > 0)
            p->on_token(p->user, -1, out, out_len);
        if (matched < 0 && !g.stops_off) {
            matched = lily_stop_matcher_flush(g.stops, &out, &out_len);
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
    if (have_ck)
        checkpoint_free(s, &ck);
    lily_stop_matcher_free(g.stops);
    free(g.joined);
    lily_sampler_free(g.sampler);
    free(g.masked);
    free(g.history_ids);
    free(g.history_counts);
    free(g.bias_ids);
    free(g.bias_values);
    free(g.mask_bits);
    return st;
}
