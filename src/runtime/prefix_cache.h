/* prefix_cache.h — checkpoints of a session's full state at token positions, reused across requests.
 *
 * A hybrid model cannot roll its Gated DeltaNet state back to an earlier position the way a KV cache can
 * be truncated, so a follow-up request (a conversation resent with one more turn) can only skip the
 * tokens it shares with an earlier one when the state at a shared position was kept. A checkpoint is the
 * session at position p: KV rows [0, p) of the attention layers, the conv state and the fp32 recurrent
 * state of every Gated DeltaNet layer at p (bit-exact, as live), the logits after token p-1 and the token
 * ids [0, p). Checkpoints are taken
 *   - at the end of every prompt prefill (before the first generated token),
 *   - at caller-given marks inside the prompt (lily_prefix_cache_chat_marks): the end of the system
 *     block, shared by different conversations with the same system prompt and tools, and
 *     where the generation prompt's thinking block opens. The
 *     Qwen3.6 template renders an earlier assistant turn as "<|im_start|>assistant\n" + content, without
 *     the "<think>\n" (thinking on) or "<think>\n\n</think>\n\n" (off) the generation prompt ended
 *     with, so a follow-up request leaves turn 1's sequence at that <think>, a few tokens before the end
 *     of turn 1's prefill; this checkpoint is the one it resumes from. The prefill stops at a mark (a
 *     piece ends there) except the last one when the rest of the prompt fits the same prefill chunk with
 *     no periodic checkpoint in between: that mark and the rest run as one forward pass that takes the
 *     mark's checkpoint inside it (lily_session_append_mark) without the logits after the mark (a
 *     device backend would spend an LM head on them inside the cold prefill; the request resuming there
 *     prefills past it, and only a request ending exactly at the mark would need them: it is not restored
 *     from such a checkpoint),
 *   - at the end of every generation (lily_prefix_cache_checkpoint, called by the caller), and
 *   - every checkpoint_every tokens during a prefill, at absolute positions k * checkpoint_every (the
 *     prompt is prefilled in pieces ending there, so the state at those positions materializes).
 * Matching: the deepest checkpoint whose ids are a prefix of the request's ids (that is, the deepest at
 * or before the point where the request leaves the longest common prefix with the cached sequences) is
 * restored, or the live session is kept when it already holds a deeper prefix; only the rest is
 * prefilled. An exact repeat restores the end-of-prefill checkpoint with its logits and prefills nothing.
 *
 * Memory: KV rows are shared, not copied per checkpoint. They are stored in blocks of block_rows rows
 * (default 256), each keyed by the token ids [0, end of the block) it covers (a chain: the block before
 * it and its own ids, like vLLM's prefix-caching blocks) and reference-counted. A checkpoint at p holds
 * references to the blocks of rows [0, p / block_rows * block_rows), its own tail rows up to p, the
 * recurrent part of the state (conv + recurrent state, position), the logits and the ids; checkpoints of
 * one conversation share their common blocks, and a block is freed when the last checkpoint holding it
 * goes. This needs the backend's optional split-state ops (backend.h: kv_save / recurrent_save ...); a
 * backend without them gets whole snapshots (lily_session_save), one per checkpoint.
 * Host memory is capped at ram_bytes (each block counted once). A checkpoint that would not fit even
 * alone (with the blocks it shares) is skipped without evicting anything; else checkpoints are evicted to
 * make room: those at other positions before the ones at marks (the system block's end and the turn-resume
 * <think>, which every later request of a conversation reuses), least recently used first within each. When the backend has device pools (CUDA) and device_bytes > 0,
 * one pool of device_bytes is allocated by lily_prefix_cache_attach or else the first checkpoint (the
 * only device allocation; never during decode or graph capture) and blocks, tails and recurrent parts go there first, restored with
 * device-to-device copies; what does not fit falls back to host memory. Snapshots are taken between
 * forward() calls, never inside a captured graph.
 *
 * Exactness: a restored session is bit-identical to the session that was saved when the backend's
 * results do not depend on how tokens were split into forward() calls — true of the CPU backend (its
 * delta rule is recurrent for every n) — and then a cached run equals a cold run bit for bit. On a
 * backend whose prefill and decode kernels round differently (CUDA) a cached run agrees with a cold one
 * only to rounding wherever the cold run prefills tokens the cached run had decoded, and a shared block
 * holds the rows of the session that stored it first (identical ids, possibly other rounding).
 *
 * Threads: one thread uses a cache with its sessions; lily_prefix_cache_stats and
 * lily_prefix_cache_metrics may be called from any thread at any time.
 */
#ifndef LILY_PREFIX_CACHE_H
#define LILY_PREFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "lily.h"
#include "runtime/engine.h"

#define LILY_PREFIX_CACHE_DEFAULT_RAM_MIB 4096 /* the cap when no session sizes it (lily_prefix_cache_new) */
/* lily_prefix_cache_default_ram_bytes: this many full-context states, within [MIN, MAX] MiB */
#define LILY_PREFIX_CACHE_DEFAULT_STATES 4
#define LILY_PREFIX_CACHE_DEFAULT_MIN_MIB 64
#define LILY_PREFIX_CACHE_DEFAULT_MAX_MIB 4096
#define LILY_PREFIX_CACHE_DEFAULT_MEMORY_SHARE 4 /* ... and at most a quarter of the memory lily may use */
#define LILY_PREFIX_CACHE_DEFAULT_CHECKPOINT_EVERY 4096
#define LILY_PREFIX_CACHE_DEFAULT_VRAM_MIB 2048 /* the CLI's default --cache-vram on the CUDA backend */
#define LILY_PREFIX_CACHE_DEFAULT_BLOCK_ROWS 256

typedef struct {
    size_t ram_bytes;       /* host pool cap in bytes; 0 = LILY_PREFIX_CACHE_DEFAULT_RAM_MIB MiB */
    size_t device_bytes;    /* device pool for device-resident checkpoints; 0 = none (also on a backend
                               without device pools) */
    int checkpoint_every;   /* tokens between checkpoints inside a prefill; 0 = 4096; < 0 = none */
    int block_rows;         /* KV rows per shared block; 0 = LILY_PREFIX_CACHE_DEFAULT_BLOCK_ROWS */
} lily_prefix_cache_options;

typedef struct {
    int n_checkpoints;          /* held now */
    size_t bytes;               /* host memory held now: KV blocks (each once), tails, recurrent parts,
                                   token ids, logits and bookkeeping of every checkpoint */
    size_t ram_bytes;           /* the cap */
    uint64_t hits;              /* prefills that reused at least one token */
    uint64_t misses;            /* prefills that reused nothing */
    uint64_t evictions;         /* checkpoints dropped to make room */
    uint64_t reused_tokens;     /* prompt tokens not prefilled, summed */
    uint64_t prefilled_tokens;  /* prompt tokens prefilled, summed */
    uint64_t checkpoints_taken; /* checkpoints stored (duplicates of a held one are not counted) */
    size_t device_bytes;        /* device memory held now (in the device pool) */
    size_t device_capacity_bytes; /* the device pool's size; 0 until the first checkpoint makes it, or none */
    size_t host_pinned_bytes;   /* the page-locked host pool's size (host checkpoints live there while it has
                                   room); 0 when the backend has none or it could not be made */
    int n_blocks;               /* shared KV blocks held now */
    /* where the last lily_prefix_cache_prefill spent its time (seconds): restoring a checkpoint, forward
     * passes, taking checkpoints (the one at its end included unless deferred: lily_prefix_cache_defer);
     * and its forward passes' count */
    double last_restore_s, last_forward_s, last_checkpoint_s;
    double last_flush_s; /* the last lily_prefix_cache_flush's checkpoints (deferred ones), seconds */
    int last_pieces;
} lily_prefix_cache_stats;

typedef struct lily_prefix_cache lily_prefix_cache;

/* Nonzero = stop the prefill (checked between forward passes). */
typedef int (*lily_prefix_cancel_fn)(void *user);

/* An empty cache. Errors: LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_prefix_cache_new(const lily_prefix_cache_options *opts, lily_prefix_cache **out, lily_error *err);
void lily_prefix_cache_free(lily_prefix_cache *pc);

/* Bind the cache to engine (whose sessions it will serve) and make its pools now: one device
 * allocation of device_bytes when the backend has device pools, and one page-locked host allocation of the
 * host cap (ram_bytes) when it has host pools; the only two the cache makes (set the cap first). Optional:
 * the first checkpoint does it otherwise. A pool that does not fit is not an error: without the device
 * pool the cache keeps host checkpoints only (stats' device_capacity_bytes stays 0); without the host pool
 * (or once it is full) host checkpoints are malloc'd (slower device copies).
 * Errors: LILY_ERR_INVALID_ARGUMENT when already bound to another engine. */
lily_status lily_prefix_cache_attach(lily_prefix_cache *pc, lily_engine *engine, lily_error *err);

/* Make s hold exactly ids[0, n) with the logits after ids[n-1] in s->logits, reusing the deepest cached
 * (or live) prefix and prefilling the rest, with checkpoints as described above and at each of
 * marks[n_marks] (positions; those outside (0, n) are ignored; marks may be NULL when n_marks is 0; see
 * lily_prefix_cache_chat_marks). *reused (may be NULL)
 * receives the tokens not prefilled. cancel (may be NULL) is polled between forward passes.
 * On an error the session holds a prefix of ids (possibly empty); the cache stays valid. On
 * LILY_ERR_CANCELLED it holds every piece prefilled before the cancel, also checkpointed (when any was),
 * or nothing when the cancel came before the first forward pass after restoring a mark's checkpoint (it
 * has no logits: a later request of exactly its ids would otherwise take stale ones from the live session).
 * Errors: LILY_ERR_INVALID_ARGUMENT (n < 1), LILY_ERR_CONTEXT_LENGTH (n > s->max_ctx, nothing changed),
 * LILY_ERR_CANCELLED, errors of lily_session_append / lily_session_restore. A checkpoint that cannot be
 * stored (out of memory, larger than the pool) is skipped, not an error. */
lily_status lily_prefix_cache_prefill(lily_prefix_cache *pc, lily_session *s, const int32_t *ids, int n,
                                      const int *marks, int n_marks, lily_prefix_cancel_fn cancel, void *cancel_user,
                                      int *reused, lily_error *err);

/* The fewest ids between a first-turn mark and the <think> mark after it for both to be kept. */
#define LILY_PREFIX_CACHE_MIN_MARK_GAP 16

/* The marks of a chat prompt rendered by the Qwen3.6 template (ids[n]): the end of the first turn
 * ("<|im_start|>system\n...<|im_end|>\n", the system block with the tools when there is one), and the
 * last <think> among the last 8 ids (the generation prompt's). The first is dropped when the second is fewer
 * than LILY_PREFIX_CACHE_MIN_MARK_GAP ids after it (a one-message conversation: each mark splits the prefill,
 * and a forward pass of a few ids costs milliseconds on a GPU). im_start, im_end, think: the tokenizer's ids
 * for <|im_start|>, <|im_end|>, <think> (-1 when missing). Writes at most 2 positions to marks; returns how
 * many. */
int lily_prefix_cache_chat_marks(const int32_t *ids, int n, int32_t im_start, int32_t im_end, int32_t think,
                                 int marks[2]);

/* Deferred checkpoints (off by default). On: lily_prefix_cache_prefill leaves the checkpoints it would
 * take after its last forward pass — the end of the prefill, and a mark taken inside that pass — pending,
 * so that a server can answer the first token before it stores them (they cost ~1 ms of host work and
 * device copies on a GPU backend); lily_prefix_cache_flush then stores them. The KV rows and the state
 * they capture stay valid while the session keeps the prompt: decode only appends rows, and a mark's
 * recurrent part was saved inside the pass. */
void lily_prefix_cache_defer(lily_prefix_cache *pc, bool on);

/* Store the checkpoints the last deferred prefill left pending, those still valid for s: the end of the
 * prefill while s holds exactly that prompt (nothing appended since), a mark while s still holds the ids
 * before it; the rest are dropped. A no-op when nothing is pending. Every other lily_prefix_cache_prefill
 * and lily_prefix_cache_checkpoint call flushes first. Its time goes to the stats' last_flush_s.
 * Errors: as lily_prefix_cache_checkpoint (the pending checkpoints are gone either way). */
lily_status lily_prefix_cache_flush(lily_prefix_cache *pc, const lily_session *s, lily_error *err);

/* Checkpoint s as it is now (e.g. at the end of a generation: prompt + reply). Skipped when s is empty,
 * when the same sequence is already held (it becomes most recently used), or when it does not fit.
 * A cache serves the sessions of one engine (the first one checkpointed).
 * Errors: LILY_ERR_INVALID_ARGUMENT (a session of another engine); backend save errors. */
lily_status lily_prefix_cache_checkpoint(lily_prefix_cache *pc, const lily_session *s, lily_error *err);

/* Host bytes of one checkpoint of s at its full context (s->max_ctx tokens): KV rows, the recurrent part
 * (or a whole snapshot on a backend without split-state ops), logits and token ids. */
size_t lily_prefix_cache_state_bytes(const lily_session *s);

/* The default host cap for sessions whose full-context state is state_bytes (lily_prefix_cache_state_bytes):
 * LILY_PREFIX_CACHE_DEFAULT_STATES such states, at least LILY_PREFIX_CACHE_DEFAULT_MIN_MIB and at most
 * LILY_PREFIX_CACHE_DEFAULT_MAX_MIB MiB; and at most a LILY_PREFIX_CACHE_DEFAULT_MEMORY_SHARE-th of
 * memory_limit bytes when that is nonzero (lily_memory_limit_bytes, base/memory_limit.h: a container's
 * cgroup limit counts), below the floor too, so the default never fills a small container. */
size_t lily_prefix_cache_default_ram_bytes(size_t state_bytes, uint64_t memory_limit);

/* Change the host cap (bytes > 0); checkpoints are evicted to fit it now. */
void lily_prefix_cache_set_ram_bytes(lily_prefix_cache *pc, size_t bytes);

/* Drop every checkpoint (counters stay). */
void lily_prefix_cache_clear(lily_prefix_cache *pc);

/* A consistent copy of the counters. Thread-safe. */
void lily_prefix_cache_stats_get(lily_prefix_cache *pc, lily_prefix_cache_stats *out);

/* The counters as Prometheus text (lily_prefix_cache_* metrics), malloc'd; NULL when out of memory.
 * Thread-safe. */
char *lily_prefix_cache_metrics(lily_prefix_cache *pc);

#endif
