/* bench_tokenizer.c — tokenizer load time and encode / decode throughput on one core.
 *
 * usage: bench_tokenizer [MODEL_DIR] [CORPUS.jsonl] [MB]
 * Defaults: tests/data/tokenizers/qwen3, its parity corpus (tests/data/tokenizers/qwen3-parity.jsonl), 4 MB.
 * The text is every "qwen3" record's text joined by newlines, repeated until it reaches MB megabytes
 * (special tokens in it are parsed). Prints load time, then encode MB/s for the first pass (BPE cache cold)
 * and the best of three later passes, and decode MB/s. Not a test: numbers go to docs/BENCHMARKS.md.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "text/tokenizer.h"

/* CPU time of this thread: steadier than wall time on a shared machine */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    const char *model = argc > 1 ? argv[1] : LILY_SOURCE_DIR "/tests/data/tokenizers/qwen3";
    const char *corpus = argc > 2 ? argv[2] : LILY_SOURCE_DIR "/tests/data/tokenizers/qwen3-parity.jsonl";
    double target_mb = argc > 3 ? atof(argv[3]) : 4.0;

    lily_error err = {0};
    lily_tokenizer *tok;
    double t0 = lily_wall_seconds(), load_c0 = cpu_now();
    if (lily_tokenizer_load(model, &tok, &err) != LILY_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", err.message);
        return 1;
    }
    double load_s = lily_wall_seconds() - t0, load_cpu = cpu_now() - load_c0;

    FILE *f = fopen(corpus, "rb");
    if (!f) {
        fprintf(stderr, "bench_tokenizer: cannot open %s\n", corpus);
        return 1;
    }
    size_t cap = 1 << 20, len = 0;
    char *base = malloc(cap), line[1 << 16];
    while (base && fgets(line, sizeof line, f)) {
        json_error_t jerr;
        json_t *r = json_loads(line, JSON_ALLOW_NUL, &jerr);
        const char *mode = json_string_value(json_object_get(r, "mode"));
        if (mode && !strcmp(mode, "qwen3")) {
            const json_t *text = json_object_get(r, "text");
            size_t n = json_string_length(text);
            if (len + n + 1 > cap) {
                cap = 2 * (len + n + 1);
                base = realloc(base, cap);
            }
            if (base) {
                memcpy(base + len, json_string_value(text), n);
                len += n;
                base[len++] = '\n';
            }
        }
        json_decref(r);
    }
    fclose(f);
    if (!base || len == 0) {
        fprintf(stderr, "bench_tokenizer: no text read from %s\n", corpus);
        return 1;
    }
    size_t target = (size_t)(target_mb * 1e6), total = 0;
    char *text = malloc(target + len);
    while (text && total < target) {
        memcpy(text + total, base, len);
        total += len;
    }
    if (!text)
        return 1;

    double first = 0, best = 1e30, best_cpu = 1e30;
    int32_t *ids = NULL;
    int n_ids = 0;
    for (int pass = 0; pass < 4; pass++) {
        free(ids);
        t0 = lily_wall_seconds();
        double c0 = cpu_now();
        if (lily_tokenizer_encode(tok, text, total, true, &ids, &n_ids, &err) != LILY_OK) {
            fprintf(stderr, "bench_tokenizer: %s\n", err.message);
            return 1;
        }
        double s = lily_wall_seconds() - t0, cpu = cpu_now() - c0;
        if (pass > 0 && cpu < best_cpu)
            best_cpu = cpu;
        if (pass == 0)
            first = s;
        else if (s < best)
            best = s;
    }
    char *decoded;
    size_t decoded_len;
    t0 = lily_wall_seconds();
    lily_tokenizer_decode(tok, ids, n_ids, false, &decoded, &decoded_len, &err);
    double decode_s = lily_wall_seconds() - t0;

    printf("model            %s (%d ids)\n", model, (int)lily_tokenizer_vocab_size(tok));
    printf("load             %.3f s (wall), %.3f s CPU\n", load_s, load_cpu);
    printf("text             %.2f MB (%zu distinct bytes repeated), %d tokens, %.2f bytes/token\n", total / 1e6, len,
           n_ids, (double)total / n_ids);
    printf("encode, 1st pass %.1f MB/s (BPE cache cold)\n", total / 1e6 / first);
    printf("encode, best     %.1f MB/s, %.2f M tokens/s (wall); %.1f MB/s of thread CPU time\n", total / 1e6 / best,
           n_ids / 1e6 / best, total / 1e6 / best_cpu);
    printf("decode           %.1f MB/s\n", decoded_len / 1e6 / decode_s);
    free(decoded);
    free(ids);
    free(text);
    free(base);
    lily_tokenizer_free(tok);
    return 0;
}
