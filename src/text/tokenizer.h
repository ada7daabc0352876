/* tokenizer.h — byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json`, and the streaming
 * detokenizer.
 *
 * What is implemented (the subset byte-level BPE models such as Qwen2/3/3.5, GPT-2 and Llama 3 use):
 *   - added_tokens (special or not) split out of the raw text first, leftmost-longest; tokens marked
 *     "normalized": true are matched again after normalization; lstrip / rstrip / single_word honoured;
 *   - normalizer: none, NFC / NFD / NFKC / NFKD (utf8proc), or a Sequence of those;
 *   - pre_tokenizer: Split (Regex or String pattern, every behavior, invert) and ByteLevel (use_regex with
 *     the GPT-2 pattern, add_prefix_space), alone or in a Sequence. Regexes are compiled by PCRE2 with
 *     PCRE2_UTF | PCRE2_UCP (JIT when available);
 *   - model: BPE with merges in either JSON form (["a","b"] pairs or "a b" strings), ranked by position,
 *     ignore_merges; no dropout, no continuing_subword_prefix / end_of_word_suffix;
 *   - decoder: ByteLevel.
 * Anything else in the file is rejected with LILY_ERR_TOKENIZER naming the unsupported part. The
 * post_processor is ignored: lily never adds BOS/EOS around a text (the chat template writes them).
 * Special-token ids are read from the files; nothing assumes a vocabulary size or an id.
 *
 * Known differences from HF `tokenizers` 0.23 (found by differential fuzzing; none in the test corpora):
 *   - characters assigned after Unicode 14 (PCRE2 10.42's tables; e.g. CJK Extension H/I, Egyptian
 *     hieroglyphs extended, Kaktovik numerals) are unassigned to lily's \p{L}/\p{N}, so text next to them
 *     can split differently;
 *   - NFC follows utf8proc's tables, which are newer than HF's: a combining mark added in Unicode 10+ that
 *     follows another mark is canonically reordered by lily and left in place by HF.
 * \s in a Split regex means Unicode White_Space, as in HF's Oniguruma (PCRE2's own \s adds U+180E).
 *
 * Thread safety: after loading (and after any lily_tokenizer_set_pretokenize_regex), every function
 * taking a const lily_tokenizer * may be called from several threads at once.
 */
#ifndef LILY_TEXT_TOKENIZER_H
#define LILY_TEXT_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lily.h"

typedef struct lily_tokenizer lily_tokenizer;

/* Load a tokenizer. path is a model directory (reads DIR/tokenizer.json, and DIR/tokenizer_config.json
 * when present for the eos/bos/pad token names) or the path of a tokenizer.json file (its directory's
 * tokenizer_config.json is read when present).
 * Errors: LILY_ERR_TOKENIZER for a missing, unreadable, malformed or unsupported tokenizer.json (the
 * message names the file and the part at fault); LILY_ERR_OUT_OF_MEMORY. On error *out is NULL.
 * About 0.3 s for the 11 MB Qwen3 file (most of it JSON parsing). */
lily_status lily_tokenizer_load(const char *path, lily_tokenizer **out, lily_error *err);

void lily_tokenizer_free(lily_tokenizer *tok); /* NULL is fine */

/* Encode UTF-8 text (len bytes, need not be NUL-terminated) into token ids, as HF `tokenizers`
 * Tokenizer.encode(text, add_special_tokens=False) does.
 * parse_special: true -> added tokens marked "special" written in the text become their ids (what HF
 *   does when a rendered chat prompt is encoded); false -> special tokens are encoded as plain text (HF's
 *   split_special_tokens=True). Added tokens that are not special are always matched, as in HF.
 * *ids: malloc'd array of *n_ids ids (the caller frees it; non-NULL even when *n_ids == 0).
 * Errors: LILY_ERR_INVALID_ARGUMENT when text is not valid UTF-8 (message gives the byte offset);
 * LILY_ERR_OUT_OF_MEMORY; LILY_ERR_TOKENIZER if the regex engine fails. */
lily_status lily_tokenizer_encode(const lily_tokenizer *tok, const char *text, size_t len, bool parse_special,
                                  int32_t **ids, int *n_ids, lily_error *err);

/* lily_tokenizer_encode for a caller with a limit of max_ids ids (max_ids < 0: none, as encode): a text
 * over it is still counted exactly up to count_ids (>= max_ids; a client trims an over-long prompt by that
 * count), and past that encoding stops, having done work in proportion to count_ids rather than to len.
 * Returns LILY_OK with the ids when the text makes at most count_ids (*n_ids may exceed max_ids: the caller
 * compares); else *ids is NULL and *n_ids is a lower bound on its count, greater than max_ids (count_ids + 1
 * when counting passed count_ids). A pre-token is skipped unmerged when a lower bound on its ids shows the
 * text cannot be counted, or, for a pre-token of 1 KiB or more, is over max_ids: each BPE id is a
 * vocabulary entry, so byte b of the piece belongs to an id of at most m(b) bytes, m(b) the longest entry
 * holding b, and the piece makes at least sum over its bytes of 1 / m(b) ids.
 * Otherwise the same ids, ownership and errors as lily_tokenizer_encode. */
lily_status lily_tokenizer_encode_max(const lily_tokenizer *tok, const char *text, size_t len, bool parse_special,
                                      int max_ids, int count_ids, int32_t **ids, int *n_ids, lily_error *err);

/* Decode ids into the exact bytes they stand for (ByteLevel decoding; added tokens give their content
 * verbatim). skip_special drops tokens marked special (HF decode(skip_special_tokens=True)). Ids that
 * are not tokens (out of range, holes in the id space) decode to nothing, as in HF.
 * *text: malloc'd, NUL-terminated, *len bytes (len may be NULL). The bytes are not sanitized: a sequence
 * cut inside a UTF-8 character gives a partial character (HF would print U+FFFD); use the detokenizer
 * for text that must be valid UTF-8. Errors: LILY_ERR_OUT_OF_MEMORY only. */
lily_status lily_tokenizer_decode(const lily_tokenizer *tok, const int32_t *ids, int n_ids, bool skip_special,
                                  char **text, size_t *len, lily_error *err);

/* The id of a token: an added token by its content ("<|im_end|>"), else a vocabulary entry written as in
 * tokenizer.json's vocab (byte-level form, e.g. "Ġthe"). -1 when there is none. */
int32_t lily_tokenizer_token_id(const lily_tokenizer *tok, const char *token);

/* The raw bytes of one token (not NUL-terminated; *len bytes), NULL for an id that is not a token. */
const char *lily_tokenizer_token_bytes(const lily_tokenizer *tok, int32_t id, size_t *len);

/* True when id is an added token marked "special" in tokenizer.json. */
bool lily_tokenizer_is_special(const lily_tokenizer *tok, int32_t id);

/* max token id + 1 over the vocabulary and the added tokens (151,669 for Qwen3). */
int32_t lily_tokenizer_vocab_size(const lily_tokenizer *tok);

/* Ids of tokenizer_config.json's eos_token / bos_token / pad_token, -1 when absent or unknown. */
int32_t lily_tokenizer_eos_id(const lily_tokenizer *tok);
int32_t lily_tokenizer_bos_id(const lily_tokenizer *tok);
int32_t lily_tokenizer_pad_id(const lily_tokenizer *tok);

/* Replace the pattern of the first Split pre-tokenizer step with a new regex (used to run the Qwen2/3
 * vocabulary with the Qwen3.5 pattern). Not thread-safe: call before the tokenizer is shared.
 * Errors: LILY_ERR_TOKENIZER when there is no Split step or PCRE2 rejects the pattern (the message
 * gives PCRE2's reason and offset). */
lily_status lily_tokenizer_set_pretokenize_regex(lily_tokenizer *tok, const char *pattern, lily_error *err);

/* --- incremental detokenizer, for streaming -------------------------------------------------------------
 * Feed ids one at a time; each call returns the text that became complete. The output is always valid
 * UTF-8: bytes that end inside a character are held back until the character completes. Concatenating
 * every piece plus the flush gives exactly lily_tokenizer_decode's bytes whenever those are valid UTF-8;
 * bytes that can never form a valid character become U+FFFD (one per maximal invalid subpart, as
 * Python's and Rust's lossy decoders do), and an incomplete character left at flush becomes one U+FFFD. */
typedef struct {
    const lily_tokenizer *tok;
    bool skip_special;
    unsigned char pending[4]; /* the start of a character still waiting for its continuation bytes */
    int n_pending;
    char *out; /* the last piece returned, NUL-terminated */
    size_t out_cap;
} lily_detokenizer;

/* Start a stream over tok (which must outlive d). skip_special: special tokens (<|im_end|>, ...) give no
 * text. Cannot fail: buffers are allocated on the first feed. */
void lily_detokenizer_init(lily_detokenizer *d, const lily_tokenizer *tok, bool skip_special);

/* Add one token; *text (NUL-terminated, *len bytes, valid until the next call) is the newly complete
 * text, possibly empty. Errors: LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_detokenizer_feed(lily_detokenizer *d, int32_t id, const char **text, size_t *len,
                                  lily_error *err);

/* End of stream: returns what is held back (as U+FFFD, since it is an incomplete character) and resets
 * the detokenizer for a new stream. */
lily_status lily_detokenizer_flush(lily_detokenizer *d, const char **text, size_t *len, lily_error *err);

/* Free the output buffer (d itself belongs to the caller). */
void lily_detokenizer_free(lily_detokenizer *d);

#endif
