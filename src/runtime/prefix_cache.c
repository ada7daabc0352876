/* prefix_cache.c — checkpoints of session state at token positions, matched by token prefix
 * (prefix_cache.h).
 *
 * Owns: the checkpoint pool (reference-counted KV blocks shared between checkpoints, each checkpoint's
 * tail rows, recurrent part, ids and logits; a host byte cap with eviction by rank, then least recently
 * used; the
 * device pool and the pinned host pool, each with a first-fit allocator), matching a request's ids against the checkpoints and the
 * live session, the piecewise prefill that materializes the state at multiples of checkpoint_every, and
 * the counters.
 * Does not own: the layout of saved state (the backend's kv_save / recurrent_save) or the
 * session (engine.h).
 *
 * Checkpoints and blocks are flat arrays scanned linearly: matching costs one memcmp per checkpoint over
 * at most the request's length, finding a block one compare of (parent, hash) per held block, which is
 * nothing next to a forward pass.
 */
#include "runtime/prefix_cache.h"

#include "base/clock.h"
#include "base/memory_limit.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEVICE_ALIGN 256 /* pool offsets and sizes are multiples of this */

/* A piece of saved state: in host memory (host: in the pinned host pool when in_host_pool, else its own
 * malloc), at offset in the device pool (on_device), or empty. */
typedef struct {
    void *host;
    bool on_device;
    bool in_host_pool;
    size_t offset;
    size_t bytes;
} blob;

/* KV rows [k * block_rows, (k + 1) * block_rows) of every sequence that starts with the ids it covers:
 * those of the block before it (parent) and its own. */
typedef struct {
    uint64_t id;     /* unique, never reused */
    uint64_t parent; /* id of block k - 1; 0 for k = 0 */
    uint64_t hash;   /* FNV-1a of ids [0, (k + 1) * block_rows), chained: a fast filter before the memcmp */
    int32_t *ids;    /* [block_rows] its own ids */
    int refs;        /* checkpoints holding it */
    blob kv;
} kv_block;

typedef struct {
    int32_t *tokens;     /* [n_tokens] */
    int n_tokens;
    float *logits;       /* [vocab] after the last id; NULL for a mark taken inside a pass (restored only
                          * as a strict prefix of a request: the rest's prefill makes the logits) */
    kv_block **blocks;   /* [n_blocks] rows [0, n_blocks * block_rows) */
    int n_blocks;
    blob tail;           /* KV rows [n_blocks * block_rows, n_tokens) */
    blob rest;           /* the recurrent part (conv + recurrent state, the position) */
    size_t extra_host;   /* host bytes counted for tokens, logits, the block list and the entry itself */
    uint64_t last_use;   /* pool clock at the last store / restore / duplicate store */
    int rank;            /* RANK_*: what it offers; a lower rank is evicted first */
} checkpoint;

/* Eviction order: checkpoints at marks (the end of the system block, where the next turn resumes) are
 * reused by every later request of a conversation and outlive the others (the ends of prefills and
 * generations, periodic and cancelled-prefill ones), which serve an exact repeat or a continuation. */
enum { RANK_PLAIN = 0, RANK_MARK = 1 };

typedef struct {
    size_t offset, bytes;
} extent;

/* One backend allocation carved by first fit: the device pool (checkpoints in GPU memory) or the host
 * pool (page-locked host memory, which device copies reach at the link's full speed). */
typedef struct {
    void *base;       /* NULL: no pool */
    size_t capacity;
    extent *free_list; /* free extents, sorted by offset, never adjacent */
    int n_free, cap_free, n_blobs;
} arena;

/* What a deferred prefill left for lily_prefix_cache_flush (lily_prefix_cache_defer). */
typedef struct {
    int32_t *ids; /* [n] the prompt; NULL: nothing pending */
    int n;        /* the end of the prefill: a checkpoint of ids[0, n) */
    int mark;     /* > 0: the checkpoint of ids[0, mark) taken inside the last pass, its recurrent part in rest */
    blob rest;
} pending_checkpoints;

struct lily_prefix_cache {
    size_t ram_bytes, device_budget;
    int checkpoint_every;       /* <= 0: none inside a prefill */
    int block_rows;
    lily_engine *engine;        /* bound by the first checkpoint: the backend that owns the device pool */
    bool split;                 /* the backend has the split-state ops (without them nothing is cached) */
    size_t kv_row_bytes;
    arena device;               /* device.base NULL: no device-resident checkpoints */
    arena host;                 /* host.base NULL: host checkpoints are malloc'd (no host pools, or none fit) */
    bool host_pool_tried;
    checkpoint *entries;
    int n_entries, cap_entries;
    kv_block **blocks;
    int n_blocks, cap_blocks;
    uint64_t clock, last_block_id;
    bool defer;                 /* lily_prefix_cache_defer */
    pending_checkpoints pending;
    pthread_mutex_t lock;       /* guards stats (read from other threads) */
    lily_prefix_cache_stats stats; /* bytes / device_bytes: what the pool holds now */
};

static void pending_drop(lily_prefix_cache *pc);

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
    pc->device_budget = opts->device_bytes / DEVICE_ALIGN * DEVICE_ALIGN;
    pc->checkpoint_every = opts->checkpoint_every == 0 ? LILY_PREFIX_CACHE_DEFAULT_CHECKPOINT_EVERY
                                                       : opts->checkpoint_every;
    pc->block_rows = opts->block_rows > 0 ? opts->block_rows : LILY_PREFIX_CACHE_DEFAULT_BLOCK_ROWS;
    if (pthread_mutex_init(&pc->lock, NULL) != 0) {
        free(pc);
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "prefix cache: cannot create a mutex");
    }
    pc->stats.ram_bytes = pc->ram_bytes;
    *out = pc;
    return LILY_OK;
}

/* ---- accounting and the device pool's allocator ----------------------------------------------------- */

static size_t device_size(size_t bytes) { return (bytes + DEVICE_ALIGN - 1) / DEVICE_ALIGN * DEVICE_ALIGN; }

static void account(lily_prefix_cache *pc, long long host_delta, long long device_delta)
{
    pthread_mutex_lock(&pc->lock);
    pc->stats.bytes = (size_t)((long long)pc->stats.bytes + host_delta);
    pc->stats.device_bytes = (size_t)((long long)pc->stats.device_bytes + device_delta);
    pthread_mutex_unlock(&pc->lock);
}

/* The arena over base (capacity bytes, one free extent). False on OOM (the arena stays empty). */
static bool arena_init(arena *a, void *base, size_t capacity)
{
    memset(a, 0, sizeof *a);
    if (!(a->free_list = malloc(16 * sizeof *a->free_list)))
        return false;
    a->base = base;
    a->capacity = capacity;
    a->cap_free = 16;
    a->free_list[0] = (extent){0, capacity};
    a->n_free = 1;
    return true;
}

/* First fit; false when no free extent is large enough (or there is no pool). */
static bool arena_alloc(arena *a, size_t bytes, size_t *offset)
{
    if (!a->base || bytes == 0)
        return false;
    /* a free can split nothing but may add an extent: keep room for one per live allocation */
    if (a->cap_free < a->n_free + a->n_blobs + 2) {
        const int cap = 2 * (a->n_free + a->n_blobs + 2);
        extent *grown = realloc(a->free_list, (size_t)cap * sizeof *grown);
        if (!grown)
            return false;
        a->free_list = grown;
        a->cap_free = cap;
    }
    const size_t need = device_size(bytes);
    for (int i = 0; i < a->n_free; i++) {
        extent *e = &a->free_list[i];
        if (e->bytes < need)
            continue;
        *offset = e->offset;
        e->offset += need;
        e->bytes -= need;
        if (e->bytes == 0) {
            memmove(e, e + 1, (size_t)(a->n_free - i - 1) * sizeof *e);
            a->n_free--;
        }
        a->n_blobs++;
        return true;
    }
    return false;
}

static void arena_release(arena *a, size_t offset, size_t bytes)
{
    const size_t size = device_size(bytes);
    int i = 0;
    while (i < a->n_free && a->free_list[i].offset < offset)
        i++;
    const bool join_prev = i > 0 && a->free_list[i - 1].offset + a->free_list[i - 1].bytes == offset;
    const bool join_next = i < a->n_free && offset + size == a->free_list[i].offset;
    if (join_prev && join_next) {
        a->free_list[i - 1].bytes += size + a->free_list[i].bytes;
        memmove(&a->free_list[i], &a->free_list[i + 1], (size_t)(a->n_free - i - 1) * sizeof(extent));
        a->n_free--;
    } else if (join_prev) {
        a->free_list[i - 1].bytes += size;
    } else if (join_next) {
        a->free_list[i].offset = offset;
        a->free_list[i].bytes += size;
    } else { /* room was reserved by arena_alloc */
        memmove(&a->free_list[i + 1], &a->free_list[i], (size_t)(a->n_free - i) * sizeof(extent));
        a->free_list[i] = (extent){offset, size};
        a->n_free++;
    }
    a->n_blobs--;
}

static bool device_alloc(lily_prefix_cache *pc, size_t bytes, size_t *offset)
{
    if (!arena_alloc(&pc->device, bytes, offset))
        return false;
    account(pc, 0, (long long)device_size(bytes));
    return true;
}

static void device_release(lily_prefix_cache *pc, size_t offset, size_t bytes)
{
    arena_release(&pc->device, offset, bytes);
    account(pc, 0, -(long long)device_size(bytes));
}

/* The pinned host pool, sized to the host cap (at most an eighth of the machine's memory), made once:
 * when the cache is attached or on its first host checkpoint, on a backend with host pools (a failure
 * leaves malloc'd checkpoints). */
static void host_pool_make(lily_prefix_cache *pc)
{
    if (pc->host_pool_tried || !pc->engine)
        return;
    pc->host_pool_tried = true;
    const lily_backend *b = &pc->engine->backend;
    if (!b->ops->host_pool_new || !b->ops->host_pool_free)
        return;
    /* the cap, but at most an eighth of the memory this process may use (a container's cgroup limit counts):
     * page-locked memory cannot be swapped or reclaimed, and the rest of the cap falls back to malloc */
    size_t bytes = pc->ram_bytes;
    const uint64_t limit = lily_memory_limit_bytes();
    if (limit && bytes > limit / 8)
        bytes = (size_t)(limit / 8);
    bytes = bytes / DEVICE_ALIGN * DEVICE_ALIGN;
    void *base = NULL;
    lily_error ignored = {0};
    if (bytes == 0 || b->ops->host_pool_new(b->ctx, bytes, &base, &ignored) != LILY_OK)
        return;
    if (!arena_init(&pc->host, base, bytes)) {
        b->ops->host_pool_free(b->ctx, base);
        return;
    }
    pthread_mutex_lock(&pc->lock);
    pc->stats.host_pinned_bytes = bytes;
    pthread_mutex_unlock(&pc->lock);
}

/* Place b (b->bytes set) in the device pool when it fits there; else it stays for host_place. */
static void blob_place_device(lily_prefix_cache *pc, blob *b)
{
    b->on_device = device_alloc(pc, b->bytes, &b->offset);
}

/* Host bytes b still needs. */
static size_t blob_host_need(const blob *b) { return b->on_device ? 0 : b->bytes; }

static bool blob_place_host(lily_prefix_cache *pc, blob *b)
{
    if (b->on_device || b->bytes == 0)
        return true;
    host_pool_make(pc);
    size_t offset;
    if (arena_alloc(&pc->host, b->bytes, &offset)) {
        b->host = (char *)pc->host.base + offset;
        b->in_host_pool = true;
        b->offset = offset;
    } else if (!(b->host = malloc(b->bytes))) {
        return false;
    }
    account(pc, (long long)b->bytes, 0);
    return true;
}

static void blob_free(lily_prefix_cache *pc, blob *b)
{
    if (b->on_device)
        device_release(pc, b->offset, b->bytes);
    else if (b->host) {
        if (b->in_host_pool)
            arena_release(&pc->host, b->offset, b->bytes);
        else
            free(b->host);
        account(pc, -(long long)b->bytes, 0);
    }
    memset(b, 0, sizeof *b);
}

static lily_state_loc loc_of(const lily_prefix_cache *pc, const blob *b)
{
    lily_state_loc l = {b->host, b->on_device ? pc->device.base : NULL, b->offset};
    return l;
}

/* ---- blocks and checkpoints ------------------------------------------------------------------------- */

static size_t block_overhead(const lily_prefix_cache *pc)
{
    return sizeof(kv_block) + (size_t)pc->block_rows * sizeof(int32_t);
}

static uint64_t hash_ids(uint64_t h, const int32_t *ids, int n)
{
    const unsigned char *p = (const unsigned char *)ids;
    for (size_t i = 0; i < (size_t)n * sizeof *ids; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static kv_block *find_block(const lily_prefix_cache *pc, uint64_t parent, uint64_t hash, const int32_t *ids)
{
    for (int i = 0; i < pc->n_blocks; i++) {
        kv_block *b = pc->blocks[i];
        if (b->parent == parent && b->hash == hash && !memcmp(b->ids, ids, (size_t)pc->block_rows * sizeof *ids))
            return b;
    }
    return NULL;
}

static void block_unref(lily_prefix_cache *pc, kv_block *b)
{
    if (--b->refs > 0)
        return;
    for (int i = 0; i < pc->n_blocks; i++)
        if (pc->blocks[i] == b) {
            pc->blocks[i] = pc->blocks[--pc->n_blocks];
            break;
        }
    blob_free(pc, &b->kv);
    free(b->ids);
    free(b);
    account(pc, -(long long)block_overhead(pc), 0);
    pthread_mutex_lock(&pc->lock);
    pc->stats.n_blocks = pc->n_blocks;
    pthread_mutex_unlock(&pc->lock);
}

/* Drop what c holds (blocks it is the last holder of included); c may be partly built. */
static void checkpoint_release(lily_prefix_cache *pc, checkpoint *c)
{
    for (int k = 0; k < c->n_blocks; k++)
        if (c->blocks[k])
            block_unref(pc, c->blocks[k]);
    free(c->blocks);
    blob_free(pc, &c->tail);
    blob_free(pc, &c->rest);
    free(c->tokens);
    free(c->logits);
    account(pc, -(long long)c->extra_host, 0);
    memset(c, 0, sizeof *c);
}

static void remove_entry(lily_prefix_cache *pc, int i, bool evicted)
{
    checkpoint_release(pc, &pc->entries[i]);
    pc->entries[i] = pc->entries[pc->n_entries - 1];
    pc->n_entries--;
    pthread_mutex_lock(&pc->lock);
    pc->stats.n_checkpoints = pc->n_entries;
    if (evicted)
        pc->stats.evictions++;
    pthread_mutex_unlock(&pc->lock);
}

void lily_prefix_cache_clear(lily_prefix_cache *pc)
{
    if (!pc)
        return;
    pending_drop(pc);
    while (pc->n_entries > 0)
        remove_entry(pc, pc->n_entries - 1, false);
}

void lily_prefix_cache_free(lily_prefix_cache *pc)
{
    if (!pc)
        return;
    lily_prefix_cache_clear(pc);
    if (pc->device.base) {
        const lily_backend *b = &pc->engine->backend;
        b->ops->device_pool_free(b->ctx, pc->device.base);
    }
    if (pc->host.base) {
        const lily_backend *b = &pc->engine->backend;
        b->ops->host_pool_free(b->ctx, pc->host.base);
    }
    free(pc->device.free_list);
    free(pc->host.free_list);
    free(pc->entries);
    free(pc->blocks);
    pthread_mutex_destroy(&pc->lock);
    free(pc);
}

lily_status lily_prefix_cache_attach(lily_prefix_cache *pc, lily_engine *engine, lily_error *err)
{
    if (pc->engine)
        return pc->engine == engine
                   ? LILY_OK
                   : lily_error_set(err, LILY_ERR_INVALID_ARGUMENT, "prefix cache: a session of another engine");
    pc->engine = engine;
    const lily_backend *b = &engine->backend;
    const lily_backend_ops *o = b->ops;
    pc->split = o->kv_row_bytes && o->kv_save && o->kv_load && o->recurrent_bytes && o->recurrent_save &&
                o->recurrent_load;
    pc->kv_row_bytes = pc->split ? o->kv_row_bytes(b->ctx) : 0;
    if (engine->planned && engine->plan.pool_requested && pc->device_budget > engine->plan.pool_bytes)
        pc->device_budget = engine->plan.pool_bytes; /* what the memory plan left room for */
    if (pc->split && pc->device_budget > 0 && o->device_pool_new && o->device_pool_free) {
        lily_error ignored = {0};
        void *base = NULL;
        if (o->device_pool_new(b->ctx, pc->device_budget, &base, &ignored) == LILY_OK) {
            if (arena_init(&pc->device, base, pc->device_budget)) {
                pthread_mutex_lock(&pc->lock);
                pc->stats.device_capacity_bytes = pc->device_budget;
                pthread_mutex_unlock(&pc->lock);
            } else {
                o->device_pool_free(b->ctx, base);
            }
        } /* else no room on the device: host checkpoints only */
    }
    if (pc->split)
        host_pool_make(pc);
    return LILY_OK;
}

/* Drop checkpoints, lowest rank first and least recently used within a rank, until `need` more host
 * bytes fit. */
static void make_room(lily_prefix_cache *pc, size_t need)
{
    while (pc->n_entries > 0 && pc->stats.bytes + need > pc->ram_bytes) {
        int victim = 0;
        for (int i = 1; i < pc->n_entries; i++) {
            const checkpoint *c = &pc->entries[i], *v = &pc->entries[victim];
            if (c->rank < v->rank || (c->rank == v->rank && c->last_use < v->last_use))
                victim = i;
        }
        remove_entry(pc, victim, true);
    }
}

size_t lily_prefix_cache_state_bytes(const lily_session *s)
{
    const lily_backend *b = &s->engine->backend;
    const lily_backend_ops *o = b->ops;
    const size_t n = (size_t)s->max_ctx;
    size_t bytes = n * sizeof(int32_t) + (size_t)s->engine->cfg.vocab_size * sizeof(float) + sizeof(checkpoint);
    if (o->kv_row_bytes && o->recurrent_bytes)
        bytes += n * o->kv_row_bytes(b->ctx) + o->recurrent_bytes(b->ctx);
    else
        bytes += o->state_save_size(b->ctx, s->state);
    return bytes;
}

size_t lily_prefix_cache_default_ram_bytes(size_t state_bytes, uint64_t memory_limit)
{
    const size_t lo = (size_t)LILY_PREFIX_CACHE_DEFAULT_MIN_MIB << 20, hi = (size_t)LILY_PREFIX_CACHE_DEFAULT_MAX_MIB << 20;
    const size_t want = state_bytes > hi / LILY_PREFIX_CACHE_DEFAULT_STATES ? hi
                                                                           : state_bytes * LILY_PREFIX_CACHE_DEFAULT_STATES;
    size_t cap = want < lo ? lo : want;
    const uint64_t share = memory_limit / LILY_PREFIX_CACHE_DEFAULT_MEMORY_SHARE;
    if (memory_limit && share < cap)
        cap = (size_t)share > 0 ? (size_t)share : 1;
    return cap;
}

void lily_prefix_cache_set_ram_bytes(lily_prefix_cache *pc, size_t bytes)
{
    if (bytes == 0)
        return;
    pc->ram_bytes = bytes;
    pthread_mutex_lock(&pc->lock);
    pc->stats.ram_bytes = bytes;
    pthread_mutex_unlock(&pc->lock);
    make_room(pc, 0);
}

/* Fill c (blocks, tail, rest, tokens, logits placed and counted) from the state of s's first p tokens (p <=
 * s->n_tokens: KV rows [0, p) of s, the logits after token p - 1 or NULL). rest: NULL = the recurrent part is
 * s's (p == s->n_tokens), saved here; else a blob already placed and written (lily_session_append_mark), which c
 * takes over (*rest is emptied). Returns LILY_OK with c->tokens NULL when it was skipped (does not fit, out of
 * memory); c is then released. */
static lily_status build_checkpoint(lily_prefix_cache *pc, const lily_session *s, int p, const float *logits,
                                    blob *rest, checkpoint *c, lily_error *err)
{
    const lily_backend *b = &s->engine->backend;
    const lily_backend_ops *o = b->ops;
    const int B = pc->block_rows;
    if (rest) { /* released with c from here on */
        c->rest = *rest;
        memset(rest, 0, sizeof *rest);
    }
    const size_t vocab = (size_t)s->engine->cfg.vocab_size;
    const int nb = p / B;
    if (nb > 0 && !(c->blocks = calloc((size_t)nb, sizeof *c->blocks)))
        return LILY_OK;
    c->extra_host = sizeof(checkpoint) + (size_t)nb * sizeof *c->blocks;
    account(pc, (long long)c->extra_host, 0);

    /* the blocks already held (a prefix of the chain) are shared; the rest are new */
    uint64_t parent = 0, hash = 1469598103934665603ull;
    int first_new = 0; /* blocks [0, first_new) are shared, the rest new (a new block's children are new) */
    for (int k = 0; k < nb; k++) {
        const int32_t *ids = s->tokens + (size_t)k * B;
        hash = hash_ids(hash, ids, B);
        kv_block *blk = first_new == k ? find_block(pc, parent, hash, ids) : NULL;
        if (blk) {
            blk->refs++;
            first_new = k + 1;
        } else {
            if (pc->n_blocks == pc->cap_blocks) {
                const int cap = pc->cap_blocks ? 2 * pc->cap_blocks : 64;
                kv_block **grown = realloc(pc->blocks, (size_t)cap * sizeof *grown);
                if (!grown)
                    goto skip;
                pc->blocks = grown;
                pc->cap_blocks = cap;
            }
            blk = calloc(1, sizeof *blk);
            if (!blk || !(blk->ids = malloc((size_t)B * sizeof *blk->ids))) {
                free(blk);
                goto skip;
            }
            memcpy(blk->ids, ids, (size_t)B * sizeof *ids);
            blk->id = ++pc->last_block_id;
            blk->parent = parent;
            blk->hash = hash;
            blk->refs = 1;
            blk->kv.bytes = (size_t)B * pc->kv_row_bytes;
            blob_place_device(pc, &blk->kv);
            pc->blocks[pc->n_blocks++] = blk;
            account(pc, (long long)block_overhead(pc), 0);
            pthread_mutex_lock(&pc->lock);
            pc->stats.n_blocks = pc->n_blocks;
            pthread_mutex_unlock(&pc->lock);
        }
        c->blocks[k] = blk;
        c->n_blocks = k + 1;
        parent = blk->id;
    }
    c->n_blocks = nb;
    c->tail.bytes = (size_t)(p - nb * B) * pc->kv_row_bytes;
    blob_place_device(pc, &c->tail);
    if (!rest) {
        c->rest.bytes = o->recurrent_bytes(b->ctx);
        blob_place_device(pc, &c->rest);
    }

    /* host room: evicting never frees the blocks c holds (their references protect them) */
    const size_t logit_bytes = logits ? vocab * sizeof(float) : 0;
    size_t need = blob_host_need(&c->tail) + (rest ? 0 : blob_host_need(&c->rest)) + (size_t)p * sizeof(int32_t) +
                  logit_bytes;
    for (int k = first_new; k < nb; k++)
        need += blob_host_need(&c->blocks[k]->kv);
    /* what stays held when every other checkpoint is gone: c's bookkeeping and its blocks (the shared
     * ones' rows already placed); skipped without evicting anything when even that does not fit */
    size_t floor = c->extra_host + (size_t)nb * block_overhead(pc);
    for (int k = 0; k < first_new; k++)
        floor += blob_host_need(&c->blocks[k]->kv);
    if (floor + need > pc->ram_bytes)
        goto skip;
    make_room(pc, need);
    if (pc->stats.bytes + need > pc->ram_bytes)
        goto skip;
    for (int k = first_new; k < nb; k++)
        if (!blob_place_host(pc, &c->blocks[k]->kv))
            goto skip;
    if (!blob_place_host(pc, &c->tail) || (!rest && !blob_place_host(pc, &c->rest)))
        goto skip;
    c->tokens = malloc((size_t)p * sizeof(int32_t));
    c->logits = logits ? malloc(logit_bytes) : NULL;
    if (!c->tokens || (logits && !c->logits))
        goto skip;
    c->extra_host += (size_t)p * sizeof(int32_t) + logit_bytes;
    account(pc, (long long)((size_t)p * sizeof(int32_t) + logit_bytes), 0);
    memcpy(c->tokens, s->tokens, (size_t)p * sizeof(int32_t));
    c->n_tokens = p;
    if (logits)
        memcpy(c->logits, logits, logit_bytes);

    /* the bytes: new blocks, the tail, the recurrent part */
    lily_status st = LILY_OK;
    for (int k = first_new; k < nb && st == LILY_OK; k++)
        st = o->kv_save(b->ctx, s->state, k * B, B, loc_of(pc, &c->blocks[k]->kv), err);
    if (st == LILY_OK && c->tail.bytes)
        st = o->kv_save(b->ctx, s->state, nb * B, p - nb * B, loc_of(pc, &c->tail), err);
    if (st == LILY_OK && !rest)
        st = o->recurrent_save(b->ctx, s->state, loc_of(pc, &c->rest), err);
    if (st != LILY_OK)
        checkpoint_release(pc, c);
    return st;
skip:
    checkpoint_release(pc, c);
    return LILY_OK;
}

/* A checkpoint of s's first p tokens (build_checkpoint's p, logits and rest; rest is freed when not
 * taken) with the rank the new (or duplicate) checkpoint gets at least. A duplicate without logits takes
 * these logits when given (and when they fit). */
static lily_status store_at(lily_prefix_cache *pc, const lily_session *s, int p, const float *logits, blob *rest,
                            int rank, lily_error *err)
{
    lily_status st = p > 0 ? lily_prefix_cache_attach(pc, s->engine, err) : LILY_OK;
    bool held = p <= 0 || st != LILY_OK || !pc->split;
    for (int i = 0; i < pc->n_entries && !held; i++) {
        checkpoint *c = &pc->entries[i];
        if (c->n_tokens == p && !memcmp(c->tokens, s->tokens, (size_t)p * sizeof *s->tokens)) {
            c->last_use = ++pc->clock; /* the same state: keep the one held */
            c->rank = c->rank > rank ? c->rank : rank;
            held = true;
            const size_t logit_bytes = (size_t)s->engine->cfg.vocab_size * sizeof(float);
            if (!c->logits && logits && pc->stats.bytes + logit_bytes <= pc->ram_bytes &&
                (c->logits = malloc(logit_bytes))) {
                memcpy(c->logits, logits, logit_bytes);
                c->extra_host += logit_bytes;
                account(pc, (long long)logit_bytes, 0);
            }
        }
    }
    if (!held && pc->n_entries == pc->cap_entries) {
        const int cap = pc->cap_entries ? 2 * pc->cap_entries : 16;
        checkpoint *grown = realloc(pc->entries, (size_t)cap * sizeof *grown);
        if (grown) {
            pc->entries = grown;
            pc->cap_entries = cap;
        }
        held = !grown; /* skipped: the cache is an optimization */
    }
    if (held) {
        if (rest)
            blob_free(pc, rest);
        return st;
    }
    checkpoint c = {0};
    st = build_checkpoint(pc, s, p, logits, rest, &c, err);
    if (st != LILY_OK || !c.tokens)
        return st;
    c.last_use = ++pc->clock;
    c.rank = rank;
    pc->entries[pc->n_entries++] = c;
    pthread_mutex_lock(&pc->lock);
    pc->stats.n_checkpoints = pc->n_entries;
    pc->stats.checkpoints_taken++;
    pthread_mutex_unlock(&pc->lock);
    return LILY_OK;
}

/* lily_prefix_cache_checkpoint with the rank the new (or duplicate) checkpoint gets at least. */
static lily_status store(lily_prefix_cache *pc, const lily_session *s, int rank, lily_error *err)
{
    return store_at(pc, s, s->n_tokens, s->logits, NULL, rank, err);
}

static void pending_drop(lily_prefix_cache *pc)
{
    pending_checkpoints *p = &pc->pending;
    if (p->mark > 0)
        blob_free(pc, &p->rest);
    free(p->ids);
    memset(p, 0, sizeof *p);
}

void lily_prefix_cache_defer(lily_prefix_cache *pc, bool on)
{
    pc->defer = on;
}

lily_status lily_prefix_cache_flush(lily_prefix_cache *pc, const lily_session *s, lily_error *err)
{
    pending_checkpoints *p = &pc->pending;
    const double t0 = lily_wall_seconds();
    lily_status st = LILY_OK;
    /* s still holds the ids before the mark (decode appends; a reset or another prompt would not) */
    if (p->mark > 0) {
        if (s->n_tokens >= p->mark && !memcmp(s->tokens, p->ids, (size_t)p->mark * sizeof *p->ids))
            st = store_at(pc, s, p->mark, NULL, &p->rest, RANK_MARK, err); /* takes rest or frees it */
        else
            blob_free(pc, &p->rest);
        p->mark = 0;
    }
    /* the end of the prefill: s is exactly the prompt, its logits the prefill's */
    if (p->ids && st == LILY_OK && s->n_tokens == p->n && !memcmp(s->tokens, p->ids, (size_t)p->n * sizeof *p->ids))
        st = store(pc, s, RANK_PLAIN, err);
    const bool any = p->ids != NULL;
    pending_drop(pc);
    pthread_mutex_lock(&pc->lock);
    pc->stats.last_flush_s = any ? lily_wall_seconds() - t0 : 0.0; /* never an earlier flush's time */
    pthread_mutex_unlock(&pc->lock);
    return st;
}

lily_status lily_prefix_cache_checkpoint(lily_prefix_cache *pc, const lily_session *s, lily_error *err)
{
    lily_status st = lily_prefix_cache_flush(pc, s, err);
    return st != LILY_OK ? st : store(pc, s, RANK_PLAIN, err);
}

/* s := checkpoint c, bit for bit. On an error s holds a partial state (the caller resets it). */
static lily_status restore_checkpoint(lily_prefix_cache *pc, lily_session *s, const checkpoint *c, lily_error *err)
{
    if (c->n_tokens > s->max_ctx)
        return lily_error_set(err, LILY_ERR_CONTEXT_LENGTH, "session restore: %d tokens do not fit a context of %d",
                              c->n_tokens, s->max_ctx);
    const lily_backend *b = &s->engine->backend;
    const lily_backend_ops *o = b->ops;
    const int B = pc->block_rows;
    lily_status st = LILY_OK;
    for (int k = 0; k < c->n_blocks && st == LILY_OK; k++)
        st = o->kv_load(b->ctx, s->state, k * B, B, loc_of(pc, &c->blocks[k]->kv), err);
    if (st == LILY_OK && c->tail.bytes)
        st = o->kv_load(b->ctx, s->state, c->n_blocks * B, c->n_tokens - c->n_blocks * B, loc_of(pc, &c->tail), err);
    if (st == LILY_OK)
        st = o->recurrent_load(b->ctx, s->state, loc_of(pc, &c->rest), err);
    if (st != LILY_OK)
        return st;
    memcpy(s->tokens, c->tokens, (size_t)c->n_tokens * sizeof(int32_t));
    s->n_tokens = c->n_tokens;
    if (c->logits) /* else the caller prefills past c (a strict prefix), which makes them */
        memcpy(s->logits, c->logits, (size_t)s->engine->cfg.vocab_size * sizeof(float));
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
    /* a first turn that is the last before the generation prompt (a one-message conversation) ends a few
     * ids before its <think>: its mark would cost a forward pass of its own for what the <think> one serves */
    if (k == 2 && marks[1] - marks[0] < LILY_PREFIX_CACHE_MIN_MARK_GAP) {
        marks[0] = marks[1];
        k = 1;
    }
    return k;
}

/* Prefill ids[pos, n) into s (holding ids[0, pos)) in one marked pass (lily_session_append_mark) and store
 * the checkpoint of ids[0, mark) it took (RANK_MARK). *done = 0 when it could not start (no room for the
 * recurrent part, out of memory): nothing happened, the caller prefills in pieces. Adds the pass's time
 * and the store's to *forward_s and *checkpoint_s. */
static lily_status prefill_marked(lily_prefix_cache *pc, lily_session *s, const int32_t *ids, int pos, int mark,
                                  int n, int *done, double *forward_s, double *checkpoint_s, lily_error *err)
{
    const lily_backend *b = &s->engine->backend;
    *done = 0;
    blob rest = {0};
    rest.bytes = b->ops->recurrent_bytes(b->ctx);
    blob_place_device(pc, &rest);
    if (!blob_place_host(pc, &rest))
        return LILY_OK;
    /* no logits for the mark: a later request resumes past it (a strict prefix), and on a device backend
     * they would cost an LM head over one row and a copy to the host inside the cold prefill */
    double t0 = lily_wall_seconds();
    lily_status st = lily_session_append_mark(s, ids + pos, n - pos, mark - pos, loc_of(pc, &rest), NULL, err);
    *forward_s += lily_wall_seconds() - t0;
    if (st == LILY_OK) {
        *done = 1;
        pthread_mutex_lock(&pc->lock);
        pc->stats.prefilled_tokens += (uint64_t)(n - pos);
        pthread_mutex_unlock(&pc->lock);
        if (pc->defer) { /* stored by lily_prefix_cache_flush, after the first token */
            pc->pending.mark = mark;
            pc->pending.rest = rest;
        } else {
            t0 = lily_wall_seconds();
            st = store_at(pc, s, mark, NULL, &rest, RANK_MARK, err);
            *checkpoint_s += lily_wall_seconds() - t0;
        }
    } else {
        blob_free(pc, &rest);
    }
    return st;
}

/* The times and forward passes of the prefill that just ran (lily_prefix_cache_stats' last_*). */
static void record_last(lily_prefix_cache *pc, double restore_s, double forward_s, double checkpoint_s, int pieces)
{
    pthread_mutex_lock(&pc->lock);
    pc->stats.last_restore_s = restore_s;
    pc->stats.last_forward_s = forward_s;
    pc->stats.last_checkpoint_s = checkpoint_s;
    pc->stats.last_pieces = pieces;
    pthread_mutex_unlock(&pc->lock);
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
    lily_status fst = lily_prefix_cache_flush(pc, s, err); /* what an earlier deferred prefill left */
    if (fst != LILY_OK)
        return fst;

    /* The live session, when it holds a prefix of ids, needs no restore. */
    int live = 0;
    if (s->n_tokens > 0 && s->n_tokens <= n && !memcmp(s->tokens, ids, (size_t)s->n_tokens * sizeof *ids))
        live = s->n_tokens;
    int best = -1, depth = live;
    for (int i = 0; i < pc->n_entries; i++) {
        const checkpoint *c = &pc->entries[i];
        if (c->n_tokens > depth && (c->n_tokens < n || (c->n_tokens == n && c->logits)) &&
            !memcmp(c->tokens, ids, (size_t)c->n_tokens * sizeof *ids)) {
            best = i;
            depth = c->n_tokens;
        }
    }
    double restore_s = 0, forward_s = 0, checkpoint_s = 0;
    int pieces = 0;
    /* a restored mark's checkpoint has no logits: s->logits are not its until a forward pass makes them */
    const bool stale_logits = best >= 0 && !pc->entries[best].logits;
    if (best >= 0) {
        const double t0 = lily_wall_seconds();
        lily_status st = restore_checkpoint(pc, s, &pc->entries[best], err);
        restore_s = lily_wall_seconds() - t0;
        if (st != LILY_OK) {
            lily_session_reset(s);
            record_last(pc, restore_s, 0, 0, 0);
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
    lily_status st = LILY_OK;
    for (int pos = start; pos < n;) {
        if (cancel && cancel(cancel_user)) {
            lily_error ignored; /* what was prefilled stays: in s, and as a checkpoint */
            const double t0 = lily_wall_seconds();
            if (pos > start)
                store(pc, s, RANK_PLAIN, &ignored);
            else if (stale_logits) /* else a later prompt of exactly these ids would take those logits */
                lily_session_reset(s);
            checkpoint_s += lily_wall_seconds() - t0;
            st = lily_error_set(err, LILY_ERR_CANCELLED, "cancelled");
            goto out;
        }
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
        lily_error ignored;
        if (at_mark && pos + piece == end && end < n && n - pos <= chunk &&
            !(every > 0 && (end / every + 1) * every < n) && lily_prefix_cache_attach(pc, s->engine, &ignored) == LILY_OK &&
            pc->split) {
            /* the mark and the rest of the prompt in one pass, the mark's checkpoint taken inside it (a
             * prompt's <think> mark is a few ids before its end: no forward pass of its own for them) */
            bool later_mark = false;
            for (int i = 0; i < n_marks; i++)
                later_mark |= marks[i] > end && marks[i] < n;
            int done = 0;
            st = later_mark ? LILY_OK : prefill_marked(pc, s, ids, pos, end, n, &done, &forward_s, &checkpoint_s, err);
            if (st != LILY_OK)
                goto out;
            if (done) {
                pieces++;
                pos = n;
                continue;
            }
        }
        double t0 = lily_wall_seconds();
        st = lily_session_append(s, ids + pos, piece, NULL, err);
        forward_s += lily_wall_seconds() - t0;
        pieces++;
        if (st != LILY_OK)
            goto out;
        pos += piece;
        pthread_mutex_lock(&pc->lock);
        pc->stats.prefilled_tokens += (uint64_t)piece;
        pthread_mutex_unlock(&pc->lock);
        const bool at_boundary = (every > 0 && pos % every == 0) || (at_mark && pos == end);
        t0 = lily_wall_seconds();
        if (pos < n && at_boundary)
            st = store(pc, s, at_mark && pos == end ? RANK_MARK : RANK_PLAIN, err);
        checkpoint_s += lily_wall_seconds() - t0;
        if (st != LILY_OK)
            goto out;
    }
    if (pc->defer) { /* the end of the prefill (and a mark taken in the last pass): lily_prefix_cache_flush */
        if ((pc->pending.ids = malloc((size_t)n * sizeof *ids))) {
            memcpy(pc->pending.ids, ids, (size_t)n * sizeof *ids);
            pc->pending.n = n;
        } else {
            pending_drop(pc); /* the cache is an optimization */
        }
    } else {
        const double t0 = lily_wall_seconds();
        st = store(pc, s, RANK_PLAIN, err); /* the end of the prefill */
        checkpoint_s += lily_wall_seconds() - t0;
    }
out: /* also for a cancelled or failed prefill: its log line shows its own times, not the previous request's */
    record_last(pc, restore_s, forward_s, checkpoint_s, pieces);
    return st;
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
             "# HELP lily_prefix_cache_device_bytes Device memory the checkpoints hold.\n"
             "# TYPE lily_prefix_cache_device_bytes gauge\nlily_prefix_cache_device_bytes %zu\n"
             "# HELP lily_prefix_cache_device_capacity_bytes The device pool's size (--cache-vram; 0 = none).\n"
             "# TYPE lily_prefix_cache_device_capacity_bytes gauge\nlily_prefix_cache_device_capacity_bytes %zu\n"
             "# HELP lily_prefix_cache_blocks Shared KV-row blocks held.\n"
             "# TYPE lily_prefix_cache_blocks gauge\nlily_prefix_cache_blocks %d\n"
             "# HELP lily_prefix_cache_hits_total Prefills that reused a cached prefix.\n"
             "# TYPE lily_prefix_cache_hits_total counter\nlily_prefix_cache_hits_total %llu\n"
             "# HELP lily_prefix_cache_misses_total Prefills that reused nothing.\n"
             "# TYPE lily_prefix_cache_misses_total counter\nlily_prefix_cache_misses_total %llu\n"
             "# HELP lily_prefix_cache_evictions_total Checkpoints evicted to make room.\n"
             "# TYPE lily_prefix_cache_evictions_total counter\nlily_prefix_cache_evictions_total %llu\n"
             "# HELP lily_prefix_cache_reused_tokens_total Prompt tokens restored instead of prefilled.\n"
             "# TYPE lily_prefix_cache_reused_tokens_total counter\nlily_prefix_cache_reused_tokens_total %llu\n"
             "# HELP lily_prefix_cache_prefilled_tokens_total Prompt tokens prefilled.\n"
             "# TYPE lily_prefix_cache_prefilled_tokens_total counter\nlily_prefix_cache_prefilled_tokens_total %llu\n"
             "# HELP lily_prefix_cache_checkpoints_taken_total Checkpoints stored.\n"
             "# TYPE lily_prefix_cache_checkpoints_taken_total counter\nlily_prefix_cache_checkpoints_taken_total %llu\n",
             st.n_checkpoints, st.bytes, st.ram_bytes, st.device_bytes, st.device_capacity_bytes, st.n_blocks,
             (unsigned long long)st.hits, (unsigned long long)st.misses,
             (unsigned long long)st.evictions, (unsigned long long)st.reused_tokens,
             (unsigned long long)st.prefilled_tokens, (unsigned long long)st.checkpoints_taken);
    return out;
}
