/* tokenizer_decode.c — token ids -> bytes, whole (lily_tokenizer_decode) and streamed (lily_detokenizer).
 *
 * Owns: ByteLevel decoding (the bytes were converted at load, so it is a concatenation) and the streaming
 * rule: emit only complete UTF-8 characters, hold back a character's first bytes until it completes,
 * replace bytes that can never form a character with U+FFFD.
 */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_internal.h"

static const char REPLACEMENT[] = "\xEF\xBF\xBD"; /* U+FFFD */

static bool skipped(const lily_tokenizer *tok, int32_t id, bool skip_special)
{
    return id < 0 || id >= tok->vocab_size || tok->token_len[id] < 0 ||
           (skip_special && (tok->token_flags[id] & TOK_FLAG_SPECIAL));
}

lily_status lily_tokenizer_decode(const lily_tokenizer *tok, const int32_t *ids, int n_ids, bool skip_special,
                                  char **text, size_t *len, lily_error *err)
{
    size_t total = 0;
    for (int i = 0; i < n_ids; i++)
        if (!skipped(tok, ids[i], skip_special))
            total += (size_t)tok->token_len[ids[i]];
    char *out = malloc(total + 1);
    if (!out) {
        *text = NULL;
        return lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory decoding %d tokens", n_ids);
    }
    size_t at = 0;
    for (int i = 0; i < n_ids; i++) {
        if (skipped(tok, ids[i], skip_special))
            continue;
        memcpy(out + at, tok->token_blob + tok->token_offset[ids[i]], (size_t)tok->token_len[ids[i]]);
        at += (size_t)tok->token_len[ids[i]];
    }
    out[at] = 0;
    *text = out;
    if (len)
        *len = at;
    return LILY_OK;
}

void lily_detokenizer_init(lily_detokenizer *d, const lily_tokenizer *tok, bool skip_special)
{
    memset(d, 0, sizeof *d);
    d->tok = tok;
    d->skip_special = skip_special;
}

void lily_detokenizer_free(lily_detokenizer *d)
{
    free(d->out);
    d->out = NULL;
    d->out_cap = 0;
}

static bool reserve(lily_detokenizer *d, size_t n, lily_error *err)
{
    if (n <= d->out_cap)
        return true;
    size_t cap = n < 64 ? 64 : 2 * n;
    char *p = realloc(d->out, cap);
    if (!p) {
        lily_error_set(err, LILY_ERR_OUT_OF_MEMORY, "out of memory in the detokenizer");
        return false;
    }
    d->out = p;
    d->out_cap = cap;
    return true;
}

lily_status lily_detokenizer_feed(lily_detokenizer *d, int32_t id, const char **text, size_t *len, lily_error *err)
{
    const lily_tokenizer *tok = d->tok;
    size_t n_token = skipped(tok, id, d->skip_special) ? 0 : (size_t)tok->token_len[id];
    size_t n_in = (size_t)d->n_pending + n_token;
    /* out holds the result (worst case: every byte becomes a 3-byte U+FFFD), then a copy of the input:
     * the writer at 3 * i never reaches the reader at 3 * n_in + 1 + i */
    if (!reserve(d, 4 * n_in + 1, err))
        return LILY_ERR_OUT_OF_MEMORY;
    unsigned char *in = (unsigned char *)d->out + 3 * n_in + 1;
    memcpy(in, d->pending, (size_t)d->n_pending);
    if (n_token)
        memcpy(in + d->n_pending, tok->token_blob + tok->token_offset[id], n_token);
    d->n_pending = 0;
    size_t out = 0, i = 0;
    while (i < n_in) {
        if (in[i] < 0x80) {
            d->out[out++] = (char)in[i++];
            continue;
        }
        int k;
        int r = tok_utf8_sequence(in + i, n_in - i, &k);
        if (r == 0) { /* the start of a character that the next token may complete */
            memcpy(d->pending, in + i, (size_t)k);
            d->n_pending = k;
            break;
        }
        if (r == 1) {
            memmove(d->out + out, in + i, (size_t)k);
            out += (size_t)k;
        } else {
            memcpy(d->out + out, REPLACEMENT, 3);
            out += 3;
        }
        i += (size_t)k;
    }
    d->out[out] = 0;
    *text = d->out;
    *len = out;
    return LILY_OK;
}

lily_status lily_detokenizer_flush(lily_detokenizer *d, const char **text, size_t *len, lily_error *err)
{
    if (!reserve(d, 4, err))
        return LILY_ERR_OUT_OF_MEMORY;
    size_t out = 0;
    if (d->n_pending > 0) {
        memcpy(d->out, REPLACEMENT, 3);
        out = 3;
    }
    d->n_pending = 0;
    d->out[out] = 0;
    *text = d->out;
    *len = out;
    return LILY_OK;
}
