/* bench_cpu_exact.c — prefill and decode speed of the CPU backend's exact mode (fp32 activations,
 * weights dequantized exactly) through the session API, as the runtime drives it.
 *
 * usage: bench_cpu_exact MODEL_DIR [PROMPT_TOKENS=300] [DECODE_TOKENS=32] [THREADS=0 (all)] [PREFILL_CHUNK=512]
 * The prompt is deterministic ids (i * 7919 mod vocab); prefill asks for the last token's logits only;
 * decode feeds back the greedy token, one forward per token. Prints wall-clock tok/s and the process
 * CPU seconds (on a shared machine the CPU time is the steadier number). Not a test: numbers go to
 * docs/BENCHMARKS.md.
 */
#include <stdio.h>
#include <stdlib.h>

#include "base/clock.h"
#include "runtime/engine.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_cpu_exact MODEL_DIR [PROMPT_TOKENS] [DECODE_TOKENS] [THREADS] [PREFILL_CHUNK]\n");
        return 2;
    }
    const int n_prompt = argc > 2 ? atoi(argv[2]) : 300;
    const int n_decode = argc > 3 ? atoi(argv[3]) : 32;
    const int threads = argc > 4 ? atoi(argv[4]) : 0;
    const int chunk = argc > 5 ? atoi(argv[5]) : 512;
    if (n_prompt < 1 || n_decode < 0) {
        fprintf(stderr, "bench_cpu_exact: need PROMPT_TOKENS >= 1 and DECODE_TOKENS >= 0\n");
        return 2;
    }
    lily_error err = {0};
    lily_engine *e;
    lily_engine_options o = {.model_dir = argv[1], .backend = "cpu", .n_threads = threads, .prefill_chunk = chunk,
                             .exact = true};
    double t_load = lily_wall_seconds();
    if (lily_engine_open(&o, &e, &err) != LILY_OK) {
        fprintf(stderr, "bench_cpu_exact: %s\n", err.message);
        return 1;
    }
    t_load = lily_wall_seconds() - t_load;
    lily_session *s;
    if (lily_session_new(e, n_prompt + n_decode, &s, &err) != LILY_OK) {
        fprintf(stderr, "bench_cpu_exact: %s\n", err.message);
        return 1;
    }
    const int vocab = e->cfg.vocab_size;
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    if (!prompt) {
        fprintf(stderr, "bench_cpu_exact: out of memory for %d prompt tokens\n", n_prompt);
        return 1;
    }
    for (int i = 0; i < n_prompt; i++)
        prompt[i] = (int32_t)(((int64_t)i * 7919) % vocab);

    double w0 = lily_wall_seconds(), c0 = lily_process_cpu_seconds();
    if (lily_session_append(s, prompt, n_prompt, NULL, &err) != LILY_OK) {
        fprintf(stderr, "bench_cpu_exact: %s\n", err.message);
        return 1;
    }
    double w1 = lily_wall_seconds(), c1 = lily_process_cpu_seconds();
    for (int i = 0; i < n_decode; i++) {
        int32_t next = 0;
        for (int v = 1; v < vocab; v++)
            if (s->logits[v] > s->logits[next])
                next = v;
        if (lily_session_append(s, &next, 1, NULL, &err) != LILY_OK) {
            fprintf(stderr, "bench_cpu_exact: %s\n", err.message);
            return 1;
        }
    }
    double w2 = lily_wall_seconds(), c2 = lily_process_cpu_seconds();
    printf("model %s: %d layers, hidden %d, vocab %d; threads %s, prefill chunk %d; load %.2f s\n", argv[1],
           e->cfg.n_layers, e->cfg.hidden, vocab, threads ? argv[4] : "all", e->prefill_chunk, t_load);
    printf("prefill %4d tokens: %8.2f tok/s wall (%.3f s), %.3f CPU s\n", n_prompt, n_prompt / (w1 - w0), w1 - w0,
           c1 - c0);
    if (n_decode)
        printf("decode  %4d tokens: %8.2f tok/s wall (%.3f s), %.3f CPU s\n", n_decode, n_decode / (w2 - w1), w2 - w1,
               c2 - c1);
    free(prompt);
    lily_session_free(s);
    lily_engine_close(e);
    return 0;
}
