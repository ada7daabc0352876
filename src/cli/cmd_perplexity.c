/* cmd_perplexity.c — `lily perplexity`: teacher-forced perplexity of a text or a token list, and how
 * closely lily's logits follow a reference run (top-1 agreement, mean KL).
 *
 *   lily perplexity [-m DIR] (-f TEXT [--special] | --tokens-file F) [--ctx N] [--reference-logits F]
 *                   [--backend cpu|cuda] [--precision fast|exact] [--threads N]
 *
 * Owns: options, reading the inputs (token ids as in `lily eval --tokens-file`; reference logits as raw
 * little-endian fp32 [n_tokens, vocab], the `lily eval --logits-out` format) and the report. The scoring
 * is runtime/perplexity.c.
 */
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "cli_common.h"
#include "commands.h"
#include "model/config.h"
#include "model/gguf_check.h"
#include "runtime/engine.h"
#include "runtime/perplexity.h"
#include "text/tokenizer.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lily perplexity [-m DIR] (-f TEXT | --tokens-file F) [options]\n\n"
            "Teacher-forced perplexity over the input in windows of --ctx tokens (the state is reset at each\n"
            "window; a window's first token is context only). With --reference-logits, also the top-1\n"
            "agreement and mean KL(reference || lily) at every position, and the reference's own perplexity.\n\n"
            "  -m, --model DIR          model directory (default: $LILY_MODEL, else the bundled model)\n"
            "  -f, --file TEXT          a UTF-8 text file (- : stdin), tokenized with the model's tokenizer.json\n"
            "  --tokens-file F          token ids separated by whitespace or commas\n"
            "  -c, --ctx N              window length (default 512, at most the input)\n"
            "  --reference-logits F     raw little-endian fp32 [n_tokens, vocab] (lily eval --logits-out)\n"
            "  --backend cpu|cuda       (default cpu)\n"
            "  --precision P            fast (default) or exact: fp32 everywhere (cuda: fp32 KV cache, no tensor\n"
            "                           cores; slower; cpu: no int8 dot products), the reference\n"
            "  -t, --threads N          " CLI_THREADS_HELP "\n"
            "  --prefill-chunk N        tokens per forward pass (default 512, 4096 with cuda)\n"
            "  --special                with -f: special tokens written in the text (<|im_start|>) become their\n"
            "                           ids (default: encoded as plain text)\n");
}

static void show_progress(void *user, int64_t done, int64_t total)
{
    /* a line rewritten in place on a terminal; into a log, one line per tenth of the work */
    static int64_t last_tenth = -1;
    if (!isatty(STDERR_FILENO)) {
        int64_t tenth = total > 0 ? done * 10 / total : 10;
        if (tenth == last_tenth)
            return;
        last_tenth = tenth;
        fprintf(stderr, "perplexity: %lld / %lld tokens\n", (long long)done, (long long)total);
        return;
    }
    *(int *)user = 1;
    fprintf(stderr, "\rperplexity: %lld / %lld tokens", (long long)done, (long long)total);
    fflush(stderr);
}

/* The input as token ids: tokens_file parsed, or text_file encoded with the model's tokenizer.
 * Returns 0, or 1 with the reason printed on stderr. */
static int read_input(const char *model, const char *text_file, const char *tokens_file, int parse_special,
                      int32_t **tokens, int *n)
{
    if (tokens_file)
        return cli_read_token_ids_file("perplexity", tokens_file, tokens, n) ? 1 : 0;
    lily_error err = {0};
    size_t len;
    char *text;
    if (!strcmp(text_file, "-")) { /* stdin, as lily run -f - */
        if (!(text = cli_read_all(stdin, &len))) {
            fprintf(stderr, "lily perplexity: cannot read stdin: %s\n", strerror(errno));
            return 1;
        }
    } else if (lily_read_file(text_file, 0, &text, &len, &err) != LILY_OK) {
        fprintf(stderr, "lily perplexity: %s\n", err.message);
        return 1;
    }
    lily_tokenizer *tok = NULL;
    /* the directory before the tokenizer: its error would hide these */
    lily_status st = lily_check_not_gguf(model, &err);
    if (st == LILY_OK)
        st = lily_check_model_dir(model, &err);
    if (st == LILY_OK)
        st = lily_tokenizer_load(model, &tok, &err);
    if (st == LILY_OK)
        st = lily_tokenizer_encode(tok, text, len, parse_special, tokens, n, &err);
    lily_tokenizer_free(tok);
    free(text);
    if (st != LILY_OK) {
        fprintf(stderr, "lily perplexity: %s\n", err.message);
        return 1;
    }
    return 0;
}

/* Map reference logits, raw fp32 [rows, vocab]: *map and *size for munmap. Returns 0, or 1 with the
 * reason printed on stderr (*map stays MAP_FAILED). */
static int map_reference(const char *ref_file, int vocab, void **map, size_t *size)
{
    int fd = open(ref_file, O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        fprintf(stderr, "lily perplexity: cannot open %s: %s\n", ref_file, strerror(errno));
        if (fd >= 0)
            close(fd);
        return 1;
    }
    size_t row = (size_t)vocab * sizeof(float);
    *size = (size_t)sb.st_size;
    if (*size == 0 || *size % row) {
        fprintf(stderr, "lily perplexity: %s: %zu bytes is not a whole number of fp32 rows of vocab %d\n", ref_file,
                *size, vocab);
        close(fd);
        return 1;
    }
    *map = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (*map == MAP_FAILED) {
        fprintf(stderr, "lily perplexity: cannot map %s: %s\n", ref_file, strerror(errno));
        return 1;
    }
    const float *x = *map; /* a NaN or inf would make every comparison meaningless (KL reads as 0) */
    for (size_t i = 0; i < *size / sizeof(float); i++)
        if (!isfinite(x[i])) {
            fprintf(stderr, "lily perplexity: %s: logit %zu of row %zu is not finite (%g)\n", ref_file,
                    i % (size_t)vocab, i / (size_t)vocab, (double)x[i]);
            munmap(*map, *size);
            *map = MAP_FAILED;
            return 1;
        }
    return 0;
}

int cmd_perplexity(int argc, char **argv)
{
    const char *model = NULL, *text_file = NULL, *tokens_file = NULL, *ref_file = NULL, *backend = "cpu";
    int ctx = 512, n_threads = 0, prefill_chunk = 0, parse_special = 0;
    bool exact = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--special")) {
            parse_special = 1;
            continue;
        }
        static const cli_value_option opts[] = {
            {"--model", "-m"}, {"--file", "-f"}, {"--tokens-file", NULL}, {"--reference-logits", NULL},
            {"--backend", NULL}, {"--precision", NULL}, {"--ctx", "-c"}, {"--threads", "-t"},
            {"--prefill-chunk", NULL}};
        const char *name = NULL, *v = NULL;
        int r = cli_match_option("perplexity", argc, argv, &i, opts, sizeof opts / sizeof opts[0], &name, &v);
        if (r < 0)
            return 2;
        if (r == 0) {
            cli_unknown_argument("perplexity", a);
            usage(stderr);
            return 2;
        }
        long n;
        if (!strcmp(name, "--model"))
            model = v;
        else if (!strcmp(name, "--file"))
            text_file = v;
        else if (!strcmp(name, "--tokens-file"))
            tokens_file = v;
        else if (!strcmp(name, "--reference-logits"))
            ref_file = v;
        else if (!strcmp(name, "--backend")) {
            if (cli_check_backend("perplexity", v))
                return 2;
            backend = v;
        }
        else if (!strcmp(name, "--precision")) {
            if (cli_parse_precision("perplexity", v, &exact))
                return 2;
        }
        else if (!strcmp(name, "--threads")) {
            if (cli_parse_threads("perplexity", name, v, &n_threads))
                return 2;
        }
        else if (!strcmp(name, "--ctx")) {
            if (cli_parse_int("perplexity", name, v, 2, INT32_MAX, &n))
                return 2;
            ctx = (int)n;
        }
        else { /* --prefill-chunk */
            if (cli_parse_int("perplexity", name, v, 0, INT32_MAX, &n))
                return 2;
            prefill_chunk = (int)n;
        }
    }
    if (!text_file == !tokens_file) {
        fprintf(stderr, "lily perplexity: needs exactly one of -f TEXT / --tokens-file F\n\n");
        usage(stderr);
        return 2;
    }
    if (parse_special && tokens_file) {
        fprintf(stderr, "lily perplexity: --special applies to -f TEXT (a token-id file has no text to encode)\n");
        return 2;
    }
    if (!model) {
        bool is_test_model;
        model = cli_default_model("perplexity", &is_test_model);
    }

    lily_error err = {0};
    int32_t *tokens = NULL;
    int n = 0;
    if (read_input(model, text_file, tokens_file, parse_special, &tokens, &n))
        return 1;
    if (n < 2) {
        fprintf(stderr, "lily perplexity: the input has %lld tokens; at least 2 are needed\n", (long long)n);
        free(tokens);
        return 1;
    }
    if (ctx > n)
        ctx = (int)n;

    int rc = 1;
    lily_engine *e = NULL;
    lily_session *s = NULL;
    void *ref_map = MAP_FAILED;
    size_t ref_size = 0;
    lily_engine_options eo = {.model_dir = model, .backend = backend, .n_threads = n_threads,
                              .prefill_chunk = prefill_chunk, .exact = exact};
    if (lily_engine_open(&eo, &e, &err) != LILY_OK || lily_session_new(e, ctx, &s, &err) != LILY_OK) {
        fprintf(stderr, "lily perplexity: %s\n", err.message);
        goto done;
    }
    /* as lily run says of a --ctx-size past the model's length; a text past the window is not scored whole */
    if (ctx > e->cfg.max_position_embeddings)
        fprintf(stderr, "lily perplexity: warning: --ctx %d is beyond the model's max_position_embeddings %d; "
                        "quality past that length is untested\n",
                ctx, e->cfg.max_position_embeddings);
    const int n_windows = n / ctx + (n % ctx >= 2); /* a 1-token tail is no window: nothing to score */
    if (n > ctx && n_windows == 1) /* n = ctx + 1: the tail of one token is no window */
        fprintf(stderr, "lily perplexity: warning: the input is %d tokens, one more than the window (--ctx %d): its "
                        "last token is not scored (--ctx %d for that)\n",
                n, ctx, n);
    else if (n > ctx)
        fprintf(stderr, "lily perplexity: warning: the input is %d tokens, longer than the window (--ctx %d): it is "
                        "scored in %d windows, the state reset at each, not as one text (--ctx %d for that)\n",
                n, ctx, n_windows, n);
    int progress_shown = 0;
    lily_perplexity_options po = {.ctx = ctx, .progress = show_progress, .progress_user = &progress_shown};
    if (ref_file) {
        if (map_reference(ref_file, e->cfg.vocab_size, &ref_map, &ref_size))
            goto done;
        po.ref_logits = ref_map;
        po.ref_rows = (int64_t)(ref_size / ((size_t)e->cfg.vocab_size * sizeof(float)));
        if (po.ref_rows != n)
            fprintf(stderr, "lily perplexity: note: %s has %lld rows for %lld tokens; comparing the first %lld\n",
                    ref_file, (long long)po.ref_rows, (long long)n, (long long)(po.ref_rows < n ? po.ref_rows : n));
        if (ctx < n)
            fprintf(stderr, "lily perplexity: note: %lld tokens in windows of %d; the reference must have been "
                            "computed in the same windows to compare\n",
                    (long long)n, ctx);
    }

    lily_perplexity_result r;
    lily_status st = lily_perplexity_run(s, tokens, n, &po, &r, &err);
    if (progress_shown)
        fputs("\n", stderr);
    if (st != LILY_OK) {
        fprintf(stderr, "lily perplexity: %s\n", err.message);
        goto done;
    }
    printf("tokens: %lld in %d window(s) of %d; %lld predictions scored\n", (long long)n, r.n_windows, ctx,
           (long long)r.n_scored);
    printf("perplexity: %.6f (mean NLL %.6f nats)\n", r.perplexity, r.nll_mean);
    if (r.n_compared) {
        if (r.ref_n_scored == r.n_scored)
            printf("reference perplexity: %.6f on the same %lld predictions (lily %+.4f%%)\n", r.ref_perplexity,
                   (long long)r.ref_n_scored, 100.0 * (r.perplexity / r.ref_perplexity - 1.0));
        else /* a shorter reference: lily's own perplexity on the positions it covers is the comparison */
            printf("reference perplexity: %.6f on the first %lld predictions (lily %.6f there, %+.4f%%)\n",
                   r.ref_perplexity, (long long)r.ref_n_scored, r.lily_ref_perplexity,
                   100.0 * (r.lily_ref_perplexity / r.ref_perplexity - 1.0));
        printf("top-1 agreement: %.4f%% (%lld / %lld positions)\n", 100.0 * r.top1_agreement, (long long)r.top1_agree,
               (long long)r.n_compared);
        printf("KL(reference || lily): mean %.6g, max %.6g nats\n", r.kl_mean, r.kl_max);
    }
    rc = 0;
done:
    if (ref_map != MAP_FAILED)
        munmap(ref_map, ref_size);
    lily_session_free(s);
    lily_engine_close(e);
    free(tokens);
    return rc;
}
