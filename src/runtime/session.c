/* session.c — a conversation's state on one engine (engine.h): the backend state (KV cache, conv and
 * recurrent state), the token ids it holds and the logits of its last token.
 *
 * Owns: chunked prefill (at most engine->prefill_chunk tokens per forward(); context carried across
 * chunks), the context-size check (an error, never a truncation), copy, save and restore.
 */
#include "engine.h"

#include <stdlib.h>
#include <string.h>

#define LILY_SESSION_DEFAULT_MAX_CTX 32768

static const lily_backend_ops *ops_of(const lily_session *s) { return s->engine->backend.ops; }
static void *ctx_of(const lily_session *s) { return s->engine->backend.ctx; }

lily_status lily_session_new(lily_engine *e, int max_ctx, lily_session **out, lily_error *err)
{
    *out = NULL;
    if (max_ctx < 0)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "session: context size must be positive (got %d)", max_ctx);
    if (max_ctx == 0 && e->planned) {
        max_ctx = e->plan.ctx;
    } else if (max_ctx == 0) {
        max_ctx = e->cfg.max_position_embeddings;
        if (max_ctx <= 0 || max_ctx > LILY_SESSION_DEFAULT_MAX_CTX)
            max_ctx = LILY_SESSION_DEFAULT_MAX_CTX;
    }
    lily_session *s = calloc(1, sizeof *s);
    if (!s)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "session: out of memory");
    s->engine = e;
    s->max_ctx = max_ctx;
    s->tokens = malloc((size_t)max_ctx * sizeof(int32_t));
    s->logits = calloc((size_t)e->cfg.vocab_size, sizeof(float));
    if (!s->tokens || !s->logits) {
        lily_session_free(s);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "session: out of memory for %d tokens", max_ctx);
    }
    lily_status st = ops_of(s)->state_new(ctx_of(s), max_ctx, &s->state, err);
    if (st != LILY_OK) {
        lily_session_free(s);
        return st;
    }
    *out = s;
    return LILY_OK;
}

void lily_session_free(lily_session *s)
{
    if (!s)
        return;
    if (s->state)
        ops_of(s)->state_free(ctx_of(s), s->state);
    free(s->tokens);
    free(s->logits);
    free(s);
}

void lily_session_reset(lily_session *s)
{
    ops_of(s)->state_reset(ctx_of(s), s->state);
    s->n_tokens = 0;
}

lily_status lily_session_append(lily_session *s, const int32_t *tokens, int n, float *logits_all, lily_error *err)
{
    const lily_config *cfg = &s->engine->cfg;
    if (n < 0 || (n > 0 && !tokens))
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "session: invalid token array (n = %d)", n);
    if (n == 0)
        return LILY_OK;
    lily_status st = lily_session_check_new_tokens(s, tokens, n, err);
    if (st != LILY_OK)
        return st;
    const int chunk = s->engine->prefill_chunk;
    const int64_t vocab = cfg->vocab_size;
    for (int done = 0; done < n;) {
        const int m = n - done < chunk ? n - done : chunk;
        const bool last = done + m == n;
        lily_logits_mode mode = logits_all ? LILY_LOGITS_ALL : last ? LILY_LOGITS_LAST : LILY_LOGITS_NONE;
        float *dst = logits_all ? logits_all + (int64_t)done * vocab : last ? s->logits : NULL;
        st = ops_of(s)->forward(ctx_of(s), s->state, tokens + done, m, mode, dst, err);
        if (st != LILY_OK)
            return st; /* the chunks before this one stay appended */
        memcpy(s->tokens + s->n_tokens, tokens + done, (size_t)m * sizeof(int32_t));
        s->n_tokens += m;
        done += m;
    }
    if (logits_all)
        memcpy(s->logits, logits_all + (int64_t)(n - 1) * vocab, (size_t)vocab * sizeof(float));
    return LILY_OK;
}

lily_status lily_session_append_mark(lily_session *s, const int32_t *tokens, int n, int mark, lily_state_loc mark_loc,
                                     float *mark_logits, lily_error *err)
{
    const lily_backend_ops *o = ops_of(s);
    const lily_config *cfg = &s->engine->cfg;
    if (n < 2 || n > s->engine->prefill_chunk || mark <= 0 || mark >= n || !tokens)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "session: a marked append of %d tokens at %d", n, mark);
    if (!o->forward_mark && !o->recurrent_save)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "session: the %s backend cannot save its state", o->name);
    lily_status st = lily_session_check_new_tokens(s, tokens, n, err);
    if (st != LILY_OK)
        return st;
    if (!o->forward_mark) { /* two appends, the state saved between them */
        if ((st = lily_session_append(s, tokens, mark, NULL, err)) != LILY_OK ||
            (st = o->recurrent_save(ctx_of(s), s->state, mark_loc, err)) != LILY_OK)
            return st;
        if (mark_logits)
            memcpy(mark_logits, s->logits, (size_t)cfg->vocab_size * sizeof(float));
        return lily_session_append(s, tokens + mark, n - mark, NULL, err);
    }
    st = o->forward_mark(ctx_of(s), s->state, tokens, n, mark, mark_loc, mark_logits, LILY_LOGITS_LAST, s->logits, err);
    if (st != LILY_OK)
        return st;
    memcpy(s->tokens + s->n_tokens, tokens, (size_t)n * sizeof(int32_t));
    s->n_tokens += n;
    return LILY_OK;
}

lily_status lily_session_copy(lily_session *dst, const lily_session *src, lily_error *err)
{
    if (dst->engine != src->engine)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "session copy: the sessions belong to different engines");
    if (src->n_tokens > dst->max_ctx)
        return lily_error_set(err, LILY_ERR_CONTEXT_LENGTH, "session copy: %d tokens do not fit a context of %d",
                              src->n_tokens, dst->max_ctx);
    lily_status st = ops_of(src)->state_copy(ctx_of(src), dst->state, src->state, err);
    if (st != LILY_OK)
        return st;
    memcpy(dst->tokens, src->tokens, (size_t)src->n_tokens * sizeof(int32_t));
    dst->n_tokens = src->n_tokens;
    memcpy(dst->logits, src->logits, (size_t)src->engine->cfg.vocab_size * sizeof(float));
    return LILY_OK;
}

lily_status lily_session_save(const lily_session *s, lily_session_snapshot *snap, lily_error *err)
{
    memset(snap, 0, sizeof *snap);
    const size_t vocab = (size_t)s->engine->cfg.vocab_size;
    snap->state_size = ops_of(s)->state_save_size(ctx_of(s), s->state);
    snap->state_buf = malloc(snap->state_size);
    snap->tokens = malloc((size_t)(s->n_tokens > 0 ? s->n_tokens : 1) * sizeof(int32_t));
    snap->logits = malloc(vocab * sizeof(float));
    if (!snap->state_buf || !snap->tokens || !snap->logits) {
        const size_t state_size = snap->state_size; /* the free below zeroes snap */
        lily_session_snapshot_free(snap);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "session save: out of memory for %zu bytes",
                              state_size);
    }
    lily_status st = ops_of(s)->state_save(ctx_of(s), s->state, snap->state_buf, snap->state_size, err);
    if (st != LILY_OK) {
        lily_session_snapshot_free(snap);
        return st;
    }
    memcpy(snap->tokens, s->tokens, (size_t)s->n_tokens * sizeof(int32_t));
    snap->n_tokens = s->n_tokens;
    memcpy(snap->logits, s->logits, vocab * sizeof(float));
    return LILY_OK;
}

lily_status lily_session_restore(lily_session *s, const lily_session_snapshot *snap, lily_error *err)
{
    if (snap->n_tokens > s->max_ctx)
        return lily_error_set(err, LILY_ERR_CONTEXT_LENGTH, "session restore: %d tokens do not fit a context of %d",
                              snap->n_tokens, s->max_ctx);
    lily_status st = ops_of(s)->state_restore(ctx_of(s), s->state, snap->state_buf, snap->state_size, err);
    if (st != LILY_OK)
        return st;
    memcpy(s->tokens, snap->tokens, (size_t)snap->n_tokens * sizeof(int32_t));
    s->n_tokens = snap->n_tokens;
    memcpy(s->logits, snap->logits, (size_t)s->engine->cfg.vocab_size * sizeof(float));
    return LILY_OK;
}

void lily_session_snapshot_free(lily_session_snapshot *snap)
{
    if (!snap)
        return;
    free(snap->state_buf);
    free(snap->tokens);
    free(snap->logits);
    memset(snap, 0, sizeof *snap);
}
