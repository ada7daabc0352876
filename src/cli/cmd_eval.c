/* cmd_eval.c — `lily eval`: logits for given token ids, optionally compared with a reference.
 *
 *   lily eval [--model DIR] (--tokens 1,2,3 | --tokens-file F) [--decode-from K] [--prefill-chunk N]
 *             [--logits-out F] [--reference F] [--backend cpu|cuda] [--precision fast|exact] [--threads N]
 *
 * The first K tokens (all when --decode-from is absent) go through one prefill (chunked by
 * --prefill-chunk), the rest one at a time through the decode path. --logits-out writes every
 * position's logits as raw little-endian float32 [n_tokens, vocab]; --reference reads the same format
 * and prints max |Δ|, mean |Δ|, top-1 agreement and mean KL(reference‖lily). Checks outside the test
 * suite use this interface: keep it exactly as written.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/clock.h"
#include "cli_common.h"
#include "commands.h"
#include "runtime/engine.h"
#include "runtime/perplexity.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lily eval [--model DIR] (--tokens 1,2,3 | --tokens-file F) [--decode-from K]\n"
            "                 [--prefill-chunk N] [--logits-out F] [--reference F] [--backend cpu|cuda] [--threads N]\n"
            "                 [--precision fast|exact] [--deltanet recurrent|chunked]\n\n"
            "Runs token ids through the model: the first K through one prefill, the rest one by one (decode).\n"
            "  -m, --model DIR       model directory (config.json + *.safetensors; default: $LILY_MODEL, else the\n"
            "                        bundled model)\n"
            "  --tokens LIST         token ids separated by commas or spaces\n"
            "  --tokens-file F       token ids in a file, separated by whitespace or commas\n"
            "  --decode-from K       prefill the first K tokens, decode the rest one at a time (default: all prefill)\n"
            "  --prefill-chunk N     at most N tokens per forward pass during prefill (default 512, 4096 with cuda)\n"
            "  --logits-out F        write all logits as raw little-endian float32 [n_tokens, vocab]\n"
            "  --reference F         compare with reference logits (same format): max |Δ|, mean |Δ|, top-1, KL\n"
            "  --backend NAME        cpu (default) or cuda\n"
            "  --precision P         fast (default) or exact: fp32 everywhere (cuda: fp32 KV cache, no tensor\n"
            "                        cores; slower; cpu: no int8 dot products), the reference\n"
            "  --deltanet FORM       recurrent (default: split-invariant) or chunked (chunk 64 for multi-token\n"
            "                        calls, transformers' numerics)\n"
            "  -t, --threads N       " CLI_THREADS_HELP "\n");
}

/* Write count fp32 values raw (little-endian on every machine lily runs on) to f, opened for path before
 * the forward passes, and close it. Returns 0, or 1 printed. */
static int write_logits(FILE *f, const char *path, const float *logits, size_t count)
{
    bool ok = fwrite(logits, sizeof(float), count, f) == count;
    if (fclose(f) != 0)
        ok = false;
    if (!ok)
        fprintf(stderr, "lily eval: cannot write %s: %s\n", path, strerror(errno));
    return ok ? 0 : 1;
}

/* Whether the reference file f (path) holds float32 [n, vocab], by its size: checked before the forward
 * passes so that a wrong file fails at once. Returns 0, or 1 printed. */
static int check_reference_size(FILE *f, const char *path, int n, int vocab)
{
    struct stat sb;
    const size_t bytes = (size_t)n * (size_t)vocab * sizeof(float);
    if (fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode) && (size_t)sb.st_size == bytes)
        return 0;
    fprintf(stderr, "lily eval: reference %s is not float32 [%d, %d] (%zu bytes expected)\n", path, n, vocab, bytes);
    return 1;
}

/* Compare [n, vocab] logits with the reference file f (path), and close it; print the four numbers. */
static int compare_reference(FILE *f, const char *path, const float *logits, int n, int vocab)
{
    const size_t count = (size_t)n * vocab;
    float *ref = malloc(count * sizeof(float));
    if (!ref) {
        fclose(f);
        return fprintf(stderr, "lily eval: out of memory\n"), 1;
    }
    size_t got = fread(ref, sizeof(float), count, f);
    int extra = fgetc(f);
    fclose(f);
    if (got != count || extra != EOF) {
        fprintf(stderr, "lily eval: reference %s is not float32 [%d, %d] (%zu bytes expected)\n", path, n, vocab,
                count * sizeof(float));
        free(ref);
        return 1;
    }
    for (size_t i = 0; i < count; i++) /* a NaN or inf reference would read as perfect agreement (KL 0) */
        if (!isfinite(ref[i])) {
            fprintf(stderr, "lily eval: reference %s: logit %zu of row %zu is not finite (%g)\n", path,
                    i % (size_t)vocab, i / (size_t)vocab, (double)ref[i]);
            free(ref);
            return 1;
        }
    double max_abs = 0, sum_abs = 0, sum_kl = 0;
    int agree = 0;
    for (int t = 0; t < n; t++) {
        const float *a = ref + (size_t)t * vocab, *b = logits + (size_t)t * vocab;
        for (int i = 0; i < vocab; i++) {
            double d = fabs((double)a[i] - (double)b[i]);
            if (d > max_abs || d != d)
                max_abs = d != d ? INFINITY : d;
            sum_abs += d;
        }
        agree += lily_argmax(a, vocab) == lily_argmax(b, vocab);
        sum_kl += lily_kl_divergence(a, b, vocab);
    }
    printf("max |Δ|: %.6g\n", max_abs);
    printf("mean |Δ|: %.6g\n", sum_abs / (double)count);
    printf("top-1 agreement: %.4f (%d/%d)\n", (double)agree / n, agree, n);
    printf("mean KL(reference‖lily): %.6g\n", sum_kl / n);
    free(ref);
    return 0;
}

int cmd_eval(int argc, char **argv)
{
    const char *model = NULL, *tokens_arg = NULL, *tokens_file = NULL, *logits_out = NULL, *reference = NULL;
    const char *backend = "cpu";
    int decode_from = -1, prefill_chunk = 0, threads = 0;
    bool deltanet_chunked = false, exact = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        static const cli_value_option opts[] = {
            {"--model", "-m"}, {"--tokens", NULL}, {"--tokens-file", NULL}, {"--decode-from", NULL},
            {"--prefill-chunk", NULL}, {"--logits-out", NULL}, {"--reference", NULL}, {"--backend", NULL},
            {"--threads", "-t"}, {"--deltanet", NULL}, {"--precision", NULL}};
        const char *value = NULL, *name = NULL;
        int r = cli_match_option("eval", argc, argv, &i, opts, sizeof opts / sizeof opts[0], &name, &value);
        if (r < 0)
            return 2;
        if (!name) {
            cli_unknown_argument("eval", a);
            usage(stderr);
            return 2;
        }
        if (!strcmp(name, "--model"))
            model = value;
        else if (!strcmp(name, "--tokens"))
            tokens_arg = value;
        else if (!strcmp(name, "--tokens-file"))
            tokens_file = value;
        else if (!strcmp(name, "--logits-out"))
            logits_out = value;
        else if (!strcmp(name, "--reference"))
            reference = value;
        else if (!strcmp(name, "--backend")) {
            if (cli_check_backend("eval", value))
                return 2;
            backend = value;
        }
        else if (!strcmp(name, "--precision")) {
            if (cli_parse_precision("eval", value, &exact))
                return 2;
        }
        else if (!strcmp(name, "--deltanet")) {
            if (strcmp(value, "chunked") && strcmp(value, "recurrent")) {
                fprintf(stderr, "lily eval: --deltanet must be chunked or recurrent (got '%s')\n", value);
                return 2;
            }
            deltanet_chunked = !strcmp(value, "chunked");
        } else if (!strcmp(name, "--threads")) {
            if (cli_parse_threads("eval", name, value, &threads))
                return 2;
        } else {
            const bool is_decode_from = !strcmp(name, "--decode-from");
            long v;
            if (cli_parse_int("eval", name, value, is_decode_from ? 0 : 1, INT32_MAX, &v))
                return 2;
            if (is_decode_from)
                decode_from = (int)v;
            else
                prefill_chunk = (int)v;
        }
    }
    if (!tokens_arg == !tokens_file) {
        fprintf(stderr, "lily eval: needs exactly one of --tokens / --tokens-file\n\n");
        usage(stderr);
        return 2;
    }

    int32_t *tokens = NULL;
    int n = 0;
    int bad = tokens_file ? cli_read_token_ids_file("eval", tokens_file, &tokens, &n)
                          : cli_parse_token_ids("eval", tokens_arg, &tokens, &n);
    if (bad)
        return bad > 0 ? 1 : 2; /* an unreadable file is a runtime error, a bad id a usage error */
    if (n == 0) {
        free(tokens);
        fprintf(stderr, "lily eval: no token ids given\n");
        return 2;
    }
    if (decode_from < 0)
        decode_from = n;
    if (decode_from > n) {
        fprintf(stderr, "lily eval: --decode-from %d is past the %d tokens given\n", decode_from, n);
        free(tokens);
        return 2;
    }

    if (!model) {
        bool is_test_model;
        model = cli_default_model("eval", &is_test_model);
    }
    /* the output and the reference are opened before the model: a path that cannot be written or read fails
     * at once, not after the forward passes */
    FILE *out = NULL, *ref = NULL;
    if (logits_out && !(out = fopen(logits_out, "wb"))) {
        fprintf(stderr, "lily eval: cannot write %s: %s\n", logits_out, strerror(errno));
        free(tokens);
        return 1;
    }
    if (reference && !(ref = fopen(reference, "rb"))) {
        fprintf(stderr, "lily eval: cannot open reference %s: %s\n", reference, strerror(errno));
        if (out)
            fclose(out);
        free(tokens);
        return 1;
    }
    lily_error err = {0};
    lily_engine *e = NULL;
    lily_session *s = NULL;
    float *logits = NULL;
    int rc = 1;
    lily_engine_options eo = {.model_dir = model, .backend = backend, .n_threads = threads, .prefill_chunk = prefill_chunk,
                              .deltanet_chunked = deltanet_chunked, .exact = exact};
    if (lily_engine_open(&eo, &e, &err) != LILY_OK)
        goto fail;
    if (lily_session_new(e, n, &s, &err) != LILY_OK)
        goto fail;
    if (n > e->cfg.max_position_embeddings) /* the context is the input's length: as lily run's --ctx-size past it */
        fprintf(stderr, "lily eval: warning: %d tokens are beyond the model's max_position_embeddings %d; quality "
                        "past that length is untested\n",
                n, e->cfg.max_position_embeddings);
    const int vocab = e->cfg.vocab_size;
    if (ref && check_reference_size(ref, reference, n, vocab))
        goto done;
    logits = malloc(sizeof(float) * (size_t)n * (size_t)vocab);
    if (!logits) {
        lily_error_set(&err, LILY_ERR_OUT_OF_MEMORY, "out of memory for [%d, %d] logits", n, vocab);
        goto fail;
    }
    double t0 = lily_wall_seconds();
    if (decode_from > 0 && lily_session_append(s, tokens, decode_from, logits, &err) != LILY_OK)
        goto fail;
    double t1 = lily_wall_seconds();
    for (int i = decode_from; i < n; i++)
        if (lily_session_append(s, tokens + i, 1, logits + (size_t)i * vocab, &err) != LILY_OK)
            goto fail;
    double t2 = lily_wall_seconds();
    printf("eval: %d tokens (%d prefill in chunks of %d, %d decode), backend %s\n", n, decode_from, e->prefill_chunk,
           n - decode_from, backend);
    if (decode_from > 0)
        printf("prefill: %.2f tok/s (%.3f s)\n", decode_from / (t1 - t0), t1 - t0);
    if (n > decode_from)
        printf("decode: %.2f tok/s (%.3f s)\n", (n - decode_from) / (t2 - t1), t2 - t1);
    printf("last position top-1: %d\n", lily_argmax(logits + (size_t)(n - 1) * vocab, vocab));

    rc = out ? write_logits(out, logits_out, logits, (size_t)n * vocab) : 0;
    out = NULL;
    if (rc == 0 && ref) {
        rc = compare_reference(ref, reference, logits, n, vocab);
        ref = NULL;
    }
    goto done;
fail:
    fprintf(stderr, "lily eval: %s\n", err.message[0] ? err.message : "failed");
    rc = 1;
done:
    if (out)
        fclose(out);
    if (ref)
        fclose(ref);
    free(logits);
    lily_session_free(s);
    lily_engine_close(e);
    free(tokens);
    return rc;
}
