/* generate.h — the generation loop: prefill a prompt, then sample, stream and append one token at a time.
 *
 * Owns: the loop over a lily_session (engine.h) with a sampler (sampler.h), stop ids, stop strings
 * (stop_strings.h), max tokens, cancellation, streaming through a callback, and the prefill / decode
 * timing. Does not own: tokenization (the caller passes ids and an incremental detokenizer) or splitting
 * the text into reasoning / content / tool calls (text/output_parser.h, fed from the callback).
 *
 * Two decode paths with the same results (token ids, text, callbacks, finish, session contents):
 *   host sampler: per token, forward() copies the logits to the host and sampler.h picks the token;
 *   device loop: the backend's decode_loop op (backend.h; the CUDA backend) picks tokens on the device
 *     and streams them, with no host synchronization per token. Used by default (decode =
 *     LILY_DECODE_AUTO) when the backend has the op, for every sampler setting (penalties, logit bias,
 *     top-k / top-p / min-p, logprobs included), unless a token constraint needs the host per token. The
 *     first token of a generation is still sampled on the host, and so are a reasoning budget's forced
 *     close tokens (a batch ends where the budget is spent; the loop resumes after the close). Tokens are decoded in
 *     batches (8 growing to 64 steps); the recurrent state is saved at each batch start (recurrent_save),
 *     and when generation stops inside a batch after the device ran past that point, the batch-start
 *     state is restored and the kept tokens are run again one forward() at a time, so the session ends
 *     exactly as the host sampler's would. Both paths draw with sampler.h's Gumbel-max noise keyed by
 *     (seed, draw index, token): greedy output is identical token for token, and a seeded draw gives the
 *     host sampler's token except where float rounding moves a top-p cut or a near tie (rare).
 *   The host sampler also takes over when no device memory is left for the checkpoint or the backend
 *   declines (LILY_ERR_UNSUPPORTED from its first decode_loop call). result.decode_path says which ran.
 *   The environment variable LILY_DECODE_LOOP=host (or 0) forces the host sampler (A/B comparisons).
 *
 * Session contents afterwards: the prompt and every streamed token, except that the last token of a
 * generation cut by max_tokens, a stop string or cancellation is not appended (appending it would cost
 * a forward pass whose logits nobody reads); a stop token is never appended. result.last_token says
 * which token that was, so a caller that keeps the session (chat) can append it.
 */
#ifndef LILY_GENERATE_H
#define LILY_GENERATE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lily.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "text/tokenizer.h"

/* An incremental detokenizer, as function pointers so the loop does not depend on the tokenizer's
 * internals. feed: the text that token completes (valid UTF-8, possibly empty; valid until the next call).
 * flush: what is still held at the end. lily_detok_for_tokenizer wraps text/tokenizer.h's detokenizer. */
typedef struct {
    void *state;
    lily_status (*feed)(void *state, int32_t token, const char **text, size_t *len, lily_error *err);
    lily_status (*flush)(void *state, const char **text, size_t *len, lily_error *err); /* may be NULL */
} lily_detok_interface;

/* text/tokenizer.h's streaming detokenizer (initialized by the caller) behind the interface. */
lily_detok_interface lily_detok_for_tokenizer(lily_detokenizer *d);

/* Called once per generated token (the stop token excluded) with the text released at this step: the
 * token's text minus anything held back as a possible stop-string start, plus earlier held text now
 * known to be safe; possibly empty. At the end, held text is released by one more call with token -1
 * (only when non-empty). The token's logprobs: lily_generate_params.token_logprobs (s->logits holds the
 * logits only on the host path). Return 0 to continue, nonzero to stop (finish = LILY_FINISH_CANCELLED). */
typedef int (*lily_token_callback)(void *user, int32_t token, const char *text, size_t len);

typedef enum {
    LILY_FINISH_STOP = 0,  /* a stop token id or a stop string */
    LILY_FINISH_LENGTH,    /* max_tokens generated, or the context is full: prompt + generated == max_ctx (the
                              last token is streamed, not appended), as vLLM keeps them <= max_model_len */
    LILY_FINISH_CANCELLED, /* the cancel flag was set or the callback returned nonzero */
} lily_finish_reason;

typedef enum {
    LILY_DECODE_AUTO = 0, /* the backend's device loop when it can (see above), else the host sampler */
    LILY_DECODE_HOST = 1, /* always the host sampler (A/B comparisons; a callback that reads s->logits) */
} lily_decode_mode;

/* A constraint on the next token (constrained decoding: grammar/constraint.h). The device loop takes it
 * when it has `allowed` (each step's mask is computed on the host while the device runs the step's forward
 * pass; only the sampling waits for it); without `allowed`, the host sampler decodes. */
typedef struct {
    void *user;
    /* Before each sampled token: set the logits of disallowed tokens in logits[vocab] (a copy) to -INFINITY.
     * Returns how many are allowed; 0: no constraint at this step; < 0: no token may follow (generation
     * ends as a stop). */
    int (*mask)(void *user, float *logits, int vocab);
    /* Optional, the same mask as bits: bits[(vocab + 31) / 32] gets bit (id & 31) of word id >> 5 set for each
     * allowed id (every word written when it returns > 0; untouched otherwise). Returns as mask does. */
    int (*allowed)(void *user, uint32_t *bits, int vocab);
    /* Every token taken (sampled or forced), the stop token excluded, before the next mask. */
    void (*accept)(void *user, int32_t token);
    /* Optional: true once the constraint masks every later token (a grammar past its think block). From the
     * token it turns true on (asked after accept), stop strings are no longer matched: they would cut the
     * value the constraint guarantees (what the stop matcher held back is released with that token). */
    bool (*masking)(void *user);
} lily_token_constraint;

typedef struct {
    lily_sampler_params sampling;
    int max_tokens;                   /* at most this many generated tokens; <= 0: until the context is full */
    const int32_t *stop_ids;          /* [n_stop_ids] e.g. lily_config.stop_ids (<|im_end|>, <|endoftext|>) */
    int n_stop_ids;
    const char *const *stop_strings;  /* [n_stop_strings]; matched across tokens, never streamed; not inside
                                         constrained text (constraint->masking) */
    int n_stop_strings;
    lily_detok_interface detok;       /* feed may be NULL when there are no stop strings: no text is streamed */
    lily_token_callback on_token;     /* may be NULL */
    void *user;
    const atomic_int *cancel;         /* may be NULL; nonzero stops before the next token, or the prompt's
                                         next prefill chunk (engine->prefill_chunk; the first is always
                                         appended; set it from a signal handler or another thread) */
    lily_decode_mode decode;          /* LILY_DECODE_AUTO (default) or LILY_DECODE_HOST */
    const lily_token_constraint *constraint; /* may be NULL */

    /* Reasoning budget (as llama.cpp's --reasoning-budget): when n_think_close > 0 and reasoning_budget >= 0,
     * the generation starts inside an open think block (the prompt ends with "<think>\n"); once
     * reasoning_budget tokens were generated in it and the model has not closed it (think_end_id), the
     * think_close tokens (e.g. "\n</think>\n\n", see lily_think_close_tokens) are forced: streamed through
     * on_token and appended like sampled tokens (they count in n_generated and max_tokens), and the answer
     * is sampled after them. A budget of 0 closes the block at once. The forced tokens are appended by the
     * host; the rest decodes on either path. */
    int reasoning_budget;             /* tokens; < 0: no budget (the default) */
    const int32_t *think_close;       /* [n_think_close] */
    int n_think_close;
    int32_t think_end_id;             /* the token that closes a think block ("</think>"), -1 if none */

    /* Logprobs (OpenAI's logprobs / top_logprobs): when token_logprobs is non-NULL and logprobs >= 0 (at most
     * LILY_TOP_LOGPROBS_MAX alternatives), *token_logprobs holds the token's logprobs (runtime/logprobs.h:
     * log-softmax of the raw logits) during each on_token call with a token >= 0, on either decode path. */
    int logprobs;                     /* < 0 (the default): none */
    lily_token_logprobs *token_logprobs;
} lily_generate_params;

/* Defaults: lily_sampler_defaults(), reasoning_budget -1, think_end_id -1, logprobs -1, everything else zero /
 * NULL. */
lily_generate_params lily_generate_defaults(void);

typedef struct {
    lily_finish_reason finish;
    int n_prompt;                     /* prompt tokens prefilled */
    int n_generated;                  /* tokens sampled and streamed (the stop token excluded) */
    int n_decode_steps;               /* single-token forward passes after the prefill (device loop: the
                                         steps kept, as the host sampler would have run them) */
    int32_t stop_token;               /* the stop id that ended generation, or -1 */
    int stop_string;                  /* index of the stop string that ended generation, or -1 */
    int32_t last_token;               /* the last token streamed but not appended (see above), or -1 */
    double prefill_seconds;           /* wall time of the prompt's lily_session_append */
    double decode_seconds;            /* wall time from the end of the prefill to the end */
    double prefill_tokens_per_second; /* n_prompt / prefill_seconds (0 when nothing was prefilled) */
    double decode_tokens_per_second;  /* n_decode_steps / decode_seconds (0 when there were none) */
    bool device_loop;                 /* the backend's device loop decoded (at least one batch) */
    const char *decode_path;          /* static text for logs: "device loop" or "host sampler (WHY)" */
    int n_device_batches;             /* decode_loop calls */
    int n_replayed;                   /* steps run again through forward() after a stop inside a batch */
    int n_reasoning;                  /* tokens generated inside the think block (the forced close excluded) */
    bool reasoning_cut;               /* the reasoning budget closed the think block */
} lily_generate_result;

/* Append prompt[n_prompt] to the session (prefill, in chunks of engine->prefill_chunk: result->n_prompt
 * says how many a cancellation left appended), then generate until a stop token, a stop string,
 * max_tokens, a full context, or cancellation. n_prompt may be 0 to continue from the session's last
 * logits (the session must then hold at least one token). The repetition penalty sees every token in
 * the session; presence / frequency penalties see the generated tokens.
 * result is filled as far as generation got, also on error.
 * Errors: LILY_ERR_INVALID_ARGUMENT (bad sampler params; stop strings without a detokenizer; nothing to
 * continue from); LILY_ERR_CONTEXT_LENGTH (the prompt does not fit: nothing is appended); errors from
 * lily_session_append and the detokenizer; LILY_ERR_BACKEND when logits the host sampler is to read hold a
 * NaN or an infinity (checked before every host-sampled token, the first one of a device-loop generation
 * included; the device loop checks every step's logits the same way); LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_generate(lily_session *s, const int32_t *prompt, int n_prompt, const lily_generate_params *params,
                          lily_generate_result *result, lily_error *err);

/* The tokens a reasoning budget forces to close a think block: "\n</think>\n\n" encoded with special
 * tokens recognized (*ids malloc'd, *n of them), and *end_id the id of "</think>" when it is one token,
 * else -1. Errors: LILY_ERR_UNSUPPORTED when the vocabulary has no "</think>" token (nothing allocated);
 * the tokenizer's errors. */
lily_status lily_think_close_tokens(const lily_tokenizer *tok, int32_t **ids, int *n, int32_t *end_id,
                                    lily_error *err);

/* "stop", "length" or "cancelled". */
const char *lily_finish_reason_name(lily_finish_reason f);

#endif
