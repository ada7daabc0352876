/* prefix_cache.c — checkpoints of session state at token positions, matched by token prefix
 * (prefix_cache.h).
 *
 * Owns: the checkpoint pool (host snapshots from lily_session_save, a byte cap, least-recently-used
 * eviction), matching a request's ids against the checkpoints and the live session, the piecewise
 * prefill that materializes the state at multiples of checkpoint_every, and the counters.
 * Does not own: the snapshot format (the backend's state_save) or the session (engine.h).
 *
 * The pool is a flat array scanned linearly: matching costs one memcmp per checkpoint over at most the
 * request's length, which is nothing next to a forward pass.
 */
#include "runtime/prefix_cache.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    lily_session_snapshot snap; /* state + ids [0, snap.n_tokens) + logits after the last id */
    size_t bytes;               /* what it costs the pool */
    uint64_t last_use;          /* pool clock at the last store / restore / duplicate store */
} checkpoint;

struct lily_prefix_cache {
    size_t ram_bytes, device_bytes;
    int checkpoint_every;       /* <= 0: none inside a prefill */
    checkpoint *entries;
    int n_entries, cap_entries;
    uint64_t clock;
    pthread_mutex_t lock;       /* guards stats (read from other threads) and the pool's size fields */
    lily_prefix_cache_stats stats;
};

lily_status lily_prefix_cache_new(const lily_prefix_cache_options *opts, lily_prefix_cache **out, lily_error *err)
{
    *out = NULL;
    lily_prefix_cache *pc = calloc(1, sizeof *pc);
    if (!pc)
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "prefix cache: out of memory");
    const lily_prefix_cache_options none = {0};
    if (!opts)
        opts = &none;
    pc->ram_bytes = opts->ram_bytes ? opts->ram_bytes : (size_t)LILY_PREFIX_CACHE_DEFAULT_RAM_MIB << 20;
    pc->device_bytes = opts->device_bytes;
    pc->checkpoint_every = opts->checkpoint_every == 0 ? LILY_PREFIX_CACHE_DEFAULT_CHECKPOINT_EVERY
                                                       : opts->checkpoint_every;
    if (pthread_mutex_init(&pc->lock, NULL) != 0) {
        free(pc);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "prefix cache: cannot create a mutex");
    }
    pc->stats.ram_bytes = pc->ram_bytes;
    *out = pc;
    return LILY_OK;
}

void lily_prefix_cache_clear(lily_prefix_cache *pc)
{
    if (!pc)
        return;
    for (int i = 0; i < pc->n_entries; i++)
        lily_session_snapshot_free(&pc->entries[i].snap);
    pthread_mutex_lock(&pc->lock);
    pc->n_entries = 0;
    pc->stats.n_checkpoints = 0;
    pc->stats.bytes = 0;
    pthread_mutex_unlock(&pc->lock);
}

void lily_prefix_cache_free(lily_prefix_cache *pc)
{
    if (!pc)
        return;
    lily_prefix_cache_clear(pc);
    free(pc->entries);
    pthread_mutex_destroy(&pc->lock);
    free(pc);
}

/* True when the checkpoint's ids are ids[0, its length). */
static bool is_prefix_of(const checkpoint *c, const int32_t *ids, int n)
{
    const int p = c->snap.n_tokens;
    return p > 0 && p <= n && !memcmp(c->snap.tokens, ids, (size_t)p * sizeof *ids);
}

static void remove_entry(lily_prefix_cache *pc, int i, bool evicted)
{
    const size_t bytes = pc->entries[i].bytes;
    lily_session_snapshot_free(&pc->entries[i].snap);
    pc->entries[i] = pc->entries[pc->n_entries - 1];
    pthread_mutex_lock(&pc->lock);
    pc->n_entries--;
    pc->stats.n_checkpoints = pc->n_entries;
    pc->stats.bytes -= bytes;
    if (evicted)
        pc->stats.evictions++;
    pthread_mutex_unlock(&pc->lock);
}

/* Drop least-recently-used checkpoints until `need` more bytes fit. */
static void make_room(lily_prefix_cache *pc, size_t need)
{
    while (pc->n_entries > 0 && pc->stats.bytes + need > pc->ram_bytes) {
        int lru = 0;
        for (int i = 1; i < pc->n_entries; i++)
            if (pc->entries[i].last_use < pc->entries[lru].last_use)
                lru = i;
        remove_entry(pc, lru, true);
    }
}

lily_status lily_prefix_cache_checkpoint(lily_prefix_cache *pc, const lily_session *s, lily_error *err)
{
    const int p = s->n_tokens;
    if (p <= 0)
        return LILY_OK;
    for (int i = 0; i < pc->n_entries; i++) {
        checkpoint *c = &pc->entries[i];
        if (c->snap.n_tokens == p && !memcmp(c->snap.tokens, s->tokens, (size_t)p * sizeof *s->tokens)) {
            c->last_use = ++pc->clock; /* the same state: keep the one held */
            return LILY_OK;
        }
    }
    const lily_backend *b = &s->engine->backend;
    const size_t bytes = b->ops->state_save_size(b->ctx, s->state) + (size_t)p * sizeof(int32_t) +
                         (size_t)s->engine->cfg.vocab_size * sizeof(float) + sizeof(checkpoint);
    if (bytes > pc->ram_bytes)
        return LILY_OK; /* larger than the whole pool */
    make_room(pc, bytes);
    if (pc->n_entries == pc->cap_entries) {
        const int cap = pc->cap_entries ? 2 * pc->cap_entries : 16;
        checkpoint *grown = realloc(pc->entries, (size_t)cap * sizeof *grown);
        if (!grown)
            return LILY_OK; /* skipped: the cache is an optimization */
        pc->entries = grown;
        pc->cap_entries = cap;
    }
    checkpoint c = {.bytes = bytes, .last_use = ++pc->clock};
    lily_error save_err = {0};
    lily_status st = lily_session_save(s, &c.snap, &save_err);
    if (st == LILY_ERR_OUT_OF_MEMORY)
        return LILY_OK; /* skipped */
    if (st != LILY_OK) {
        if (err)
            *err = save_err;
        return st;
    }
    pc->entries[pc->n_entries] = c;
    pthread_mutex_lock(&pc->lock);
    pc->n_entries++;
    pc->stats.n_checkpoints = pc->n_entries;
    pc->stats.bytes += bytes;
    pc->stats.checkpoints_taken++;
    pthread_mutex_unlock(&pc->lock);
    return LILY_OK;
}

int lily_prefix_cache_chat_marks(const int32_t *ids, int n, int32_t im_start, int32_t im_end, int32_t think,
                                 int marks[2])
{
    int k = 0;
    if (n > 2 && im_start >= 0 && im_end >= 0 && ids[0] == im_start) {
        /* the end of the first turn ("<|im_start|>system\n...<|im_end|>\n"): where the next one opens */
        int next = -1;
        for (int i = 2; i < n && next < 0; i++)
            if (ids[i] == im_start)
                next = i;
        if (next > 0 && ids[next - 2] == im_end)
            marks[k++] = next;
    }
    for (int i = n - 1; think >= 0 && i > 0 && i >= n - 8; i--)
        if (ids[i] == think) {
            marks[k++] = i;
            break;
        }
    return k;
}

lily_status lily_prefix_cache_prefill(lily_prefix_cache *pc, lily_session *s, const int32_t *ids, int n,
                                      const int *marks, int n_marks, lily_prefix_cancel_fn cancel, void *cancel_user,
                                      int *reused, lily_error *err)
{
    if (reused)
        *reused = 0;
    if (n < 1 || !ids)
        return lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "prefix cache: empty prompt");
    if (n > s->max_ctx)
        return lily_error_set(err, LILY_ERR_CONTEXT_LENGTH,
                              "context length exceeded: %d prompt tokens > context size %d", n, s->max_ctx);

    /* The live session, when it holds a prefix of ids, needs no restore. */
    int live = 0;
    if (s->n_tokens > 0 && s->n_tokens <= n && !memcmp(s->tokens, ids, (size_t)s->n_tokens * sizeof *ids))
        live = s->n_tokens;
    int best = -1, depth = live;
    for (int i = 0; i < pc->n_entries; i++)
        if (pc->entries[i].snap.n_tokens > depth && is_prefix_of(&pc->entries[i], ids, n)) {
            best = i;
            depth = pc->entries[i].snap.n_tokens;
        }
    if (best >= 0) {
        lily_status st = lily_session_restore(s, &pc->entries[best].snap, err);
        if (st != LILY_OK) {
            lily_session_reset(s);
            return st;
        }
        pc->entries[best].last_use = ++pc->clock;
    } else if (live == 0 && s->n_tokens > 0) {
        lily_session_reset(s);
    }
    const int start = depth;
    pthread_mutex_lock(&pc->lock);
    if (start > 0)
        pc->stats.hits++;
    else
        pc->stats.misses++;
    pc->stats.reused_tokens += (uint64_t)start;
    pthread_mutex_unlock(&pc->lock);
    if (reused)
        *reused = start;

    /* Prefill the rest in pieces that end at every multiple of checkpoint_every and at the mark
     * (checkpointed there) and are at most one prefill chunk long (cancel is polled between them). */
    const int every = pc->checkpoint_every;
    const int chunk = s->engine->prefill_chunk > 0 ? s->engine->prefill_chunk : 512;
    for (int pos = start; pos < n;) {
        if (cancel && cancel(cancel_user))
            return lily_error_set(err, LILY_ERR_CANCELLED, "cancelled");
        int end = n;
        if (every > 0) {
            const int boundary = (pos / every + 1) * every;
            if (boundary < end)
                end = boundary;
        }
        bool at_mark = false;
        for (int i = 0; i < n_marks; i++)
            if (marks[i] > pos && marks[i] <= end) {
                end = marks[i];
                at_mark = true;
            }
        const int piece = end - pos < chunk ? end - pos : chunk;
        lily_status st = lily_session_append(s, ids + pos, piece, NULL, err);
        if (st != LILY_OK)
            return st;
        pos += piece;
        pthread_mutex_lock(&pc->lock);
        pc->stats.prefilled_tokens += (uint64_t)piece;
        pthread_mutex_unlock(&pc->lock);
        const bool at_boundary = (every > 0 && pos % every == 0) || (at_mark && pos == end);
        if (pos < n && at_boundary && (st = lily_prefix_cache_checkpoint(pc, s, err)) != LILY_OK)
            return st;
    }
    return lily_prefix_cache_checkpoint(pc, s, err); /* the end of the prefill */
}

void lily_prefix_cache_stats_get(lily_prefix_cache *pc, lily_prefix_cache_stats *out)
{
    pthread_mutex_lock(&pc->lock);
    *out = pc->stats;
    pthread_mutex_unlock(&pc->lock);
}

char *lily_prefix_cache_metrics(lily_prefix_cache *pc)
{
    lily_prefix_cache_stats st;
    lily_prefix_cache_stats_get(pc, &st);
    const size_t cap = 4096;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    snprintf(out, cap,
             "# HELP lily_prefix_cache_checkpoints Session-state checkpoints held by the prefix cache.\n"
             "# TYPE lily_prefix_cache_checkpoints gauge\nlily_prefix_cache_checkpoints %d\n"
             "# HELP lily_prefix_cache_bytes Host memory the checkpoints hold.\n"
             "# TYPE lily_prefix_cache_bytes gauge\nlily_prefix_cache_bytes %zu\n"
             "# HELP lily_prefix_cache_capacity_bytes The prefix cache's host memory cap (--cache-ram).\n"
             "# TYPE lily_prefix_cache_capacity_bytes gauge\nlily_prefix_cache_capacity_bytes %zu\n"
             "# HELP lily_prefix_cache_hits_total Prefills that reused a cached prefix.\n"
             "# TYPE lily_prefix_cache_hits_total counter\nlily_prefix_cache_hits_total %llu\n"
             "# HELP lily_prefix_cache_misses_total Prefills that reused nothing.\n"
             "# TYPE lily_prefix_cache_misses_total counter\nlily_prefix_cache_misses_total %llu\n"
             "# HELP lily_prefix_cache_evictions_total Checkpoints evicted (least recently used) to make room.\n"
             "# TYPE lily_prefix_cache_evictions_total counter\nlily_prefix_cache_evictions_total %llu\n"
             "# HELP lily_prefix_cache_reused_tokens_total Prompt tokens restored instead of prefilled.\n"
             "# TYPE lily_prefix_cache_reused_tokens_total counter\nlily_prefix_cache_reused_tokens_total %llu\n"
             "# HELP lily_prefix_cache_prefilled_tokens_total Prompt tokens prefilled.\n"
             "# TYPE lily_prefix_cache_prefilled_tokens_total counter\nlily_prefix_cache_prefilled_tokens_total %llu\n"
             "# HELP lily_prefix_cache_checkpoints_taken_total Checkpoints stored.\n"
             "# TYPE lily_prefix_cache_checkpoints_taken_total counter\nlily_prefix_cache_checkpoints_taken_total %llu\n",
             st.n_checkpoints, st.bytes, st.ram_bytes, (unsigned long long)st.hits, (unsigned long long)st.misses,
             (unsigned long long)st.evictions, (unsigned long long)st.reused_tokens,
             (unsigned long long)st.prefilled_tokens, (unsigned long long)st.checkpoints_taken);
    return out;
}
