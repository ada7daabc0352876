/* cmd_perplexity.c — `lily perplexity`: teacher-forced perplexity of a text or a token list, and how
 * closely lily's logits follow a reference run (top-1 agreement, mean KL).
 *
 *   lily perplexity -m DIR (-f TEXT [--special] | --tokens-file F) [--ctx N] [--reference-logits F]
 *                   [--backend cpu|cuda] [--threads N]
 *
 * Owns: options, reading the inputs (token ids as in `lily eval --tokens-file`; reference logits as raw
 * little-endian fp32 [n_tokens, vocab], the `lily eval --logits-out` format) and the report. The scoring
 * is runtime/perplexity.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands.h"
#include "runtime/engine.h"
#include "runtime/perplexity.h"

#if defined(__has_include)
#if __has_include("text/tokenizer.h")
#include "text/tokenizer.h"
#define LILY_PERPLEXITY_HAVE_TOKENIZER 1
#endif
#endif

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lily perplexity -m DIR (-f TEXT | --tokens-file F) [options]\n\n"
            "Teacher-forced perplexity over the input in windows of --ctx tokens (the state is reset at each\n"
            "window; a window's first token is context only). With --reference-logits, also the top-1\n"
            "agreement and mean KL(reference || lily) at every position, and the reference's own perplexity.\n\n"
            "  -m, --model DIR          model directory\n"
            "  -f, --file TEXT          a UTF-8 text file, tokenized with the model's tokenizer.json\n"
            "  --tokens-file F          token ids separated by whitespace or commas\n"
            "  --ctx N                  window length (default 512, at most the input)\n"
            "  --reference-logits F     raw little-endian fp32 [n_tokens, vocab] (lily eval --logits-out)\n"
            "  --backend cpu|cuda       (default cpu)\n"
            "  --threads N              CPU threads (default: all cores)\n"
            "  --prefill-chunk N        tokens per forward pass (default 512)\n"
            "  --special                with -f: special tokens written in the text (<|im_start|>) become their\n"
            "                           ids (default: encoded as plain text)\n");
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap)
            break;
        char *bigger = realloc(buf, 2 * cap + 1);
        if (!bigger) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = bigger;
        cap *= 2;
    }
    int failed = ferror(f);
    fclose(f);
    if (!buf || failed) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (len)
        *len = n;
    return buf;
}

/* Ids separated by whitespace, commas or brackets. Returns 0, or -1 with a message on stderr. */
static int parse_tokens(const char *text, int32_t **out, int64_t *n_out)
{
    int64_t cap = 1024, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    const char *p = text;
    while (ids) {
        while (*p && strchr(" \t\r\n,[]", *p))
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "lily perplexity: bad token id near '%.20s'\n", p);
            free(ids);
            return -1;
        }
        if (n == cap) {
            int32_t *bigger = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!bigger) {
                free(ids);
                ids = NULL;
                break;
            }
            ids = bigger;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    if (!ids) {
        fprintf(stderr, "lily perplexity: out of memory reading token ids\n");
        return -1;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

static void show_progress(void *user, int64_t done, int64_t total)
{
    *(int *)user = 1;
    fprintf(stderr, "\rperplexity: %lld / %lld tokens", (long long)done, (long long)total);
    fflush(stderr);
}

int cmd_perplexity(int argc, char **argv)
{
    const char *model = NULL, *text_file = NULL, *tokens_file = NULL, *ref_file = NULL, *backend = "cpu";
    int ctx = 512, n_threads = 0, prefill_chunk = 0, parse_special = 0;
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
        if (i + 1 >= argc) {
            fprintf(stderr, "lily perplexity: %s needs a value (or is unknown)\n\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file"))
            text_file = v;
        else if (!strcmp(a, "--tokens-file"))
            tokens_file = v;
        else if (!strcmp(a, "--reference-logits"))
            ref_file = v;
        else if (!strcmp(a, "--backend"))
            backend = v;
        else if (!strcmp(a, "--ctx") || !strcmp(a, "-c"))
            ctx = atoi(v);
        else if (!strcmp(a, "--threads") || !strcmp(a, "-t"))
            n_threads = atoi(v);
        else if (!strcmp(a, "--prefill-chunk"))
            prefill_chunk = atoi(v);
        else {
            fprintf(stderr, "lily perplexity: unknown option '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model || !text_file == !tokens_file) {
        fprintf(stderr, "lily perplexity: needs -m DIR and exactly one of -f TEXT / --tokens-file F\n\n");
        usage(stderr);
        return 2;
    }
    if (ctx < 2 || n_threads < 0 || prefill_chunk < 0) {
        fprintf(stderr, "lily perplexity: --ctx must be >= 2, --threads and --prefill-chunk >= 0\n");
        return 2;
    }

    lily_error err = {0};
    int32_t *tokens = NULL;
    int64_t n = 0;
    if (tokens_file) {
        char *text = read_file(tokens_file, NULL);
        if (!text) {
            fprintf(stderr, "lily perplexity: cannot read %s: %s\n", tokens_file, strerror(errno));
            return 1;
        }
        int bad = parse_tokens(text, &tokens, &n);
        free(text);
        if (bad)
            return 1;
    } else {
#ifdef LILY_PERPLEXITY_HAVE_TOKENIZER
        size_t len;
        char *text = read_file(text_file, &len);
        if (!text) {
            fprintf(stderr, "lily perplexity: cannot read %s: %s\n", text_file, strerror(errno));
            return 1;
        }
        lily_tokenizer *tok = NULL;
        int n_ids = 0;
        lily_status st = lily_tokenizer_load(model, &tok, &err);
        if (st == LILY_OK)
            st = lily_tokenizer_encode(tok, text, len, parse_special, &tokens, &n_ids, &err);
        lily_tokenizer_free(tok);
        free(text);
        if (st != LILY_OK) {
            fprintf(stderr, "lily perplexity: %s\n", err.message);
            return 1;
        }
        n = n_ids;
#else
        fprintf(stderr, "lily perplexity: -f needs the tokenizer, which this build lacks; use --tokens-file\n");
        return 1;
#endif
    }
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
                              .prefill_chunk = prefill_chunk};
    if (lily_engine_open(&eo, &e, &err) != LILY_OK || lily_session_new(e, ctx, &s, &err) != LILY_OK) {
        fprintf(stderr, "lily perplexity: %s\n", err.message);
        goto done;
    }
    int progress_shown = 0;
    lily_perplexity_options po = {.ctx = ctx, .progress = show_progress, .progress_user = &progress_shown};
    if (ref_file) {
        int fd = open(ref_file, O_RDONLY);
        struct stat sb;
        if (fd < 0 || fstat(fd, &sb) != 0) {
            fprintf(stderr, "lily perplexity: cannot open %s: %s\n", ref_file, strerror(errno));
            if (fd >= 0)
                close(fd);
            goto done;
        }
        size_t row = (size_t)e->cfg.vocab_size * sizeof(float);
        ref_size = (size_t)sb.st_size;
        if (ref_size == 0 || ref_size % row) {
            fprintf(stderr, "lily perplexity: %s: %zu bytes is not a whole number of fp32 rows of vocab %d\n", ref_file,
                    ref_size, e->cfg.vocab_size);
            close(fd);
            goto done;
        }
        ref_map = mmap(NULL, ref_size, PROT_READ, MAP_PRIVATE, fd, 0);
        close(fd);
        if (ref_map == MAP_FAILED) {
            fprintf(stderr, "lily perplexity: cannot map %s: %s\n", ref_file, strerror(errno));
            goto done;
        }
        po.ref_logits = ref_map;
        po.ref_rows = (int64_t)(ref_size / row);
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
        printf("reference perplexity: %.6f on the same %lld predictions (lily %+.4f%%)\n", r.ref_perplexity,
               (long long)r.ref_n_scored, 100.0 * (r.perplexity / r.ref_perplexity - 1.0));
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
