/* bench_prefix_cache.c — time to first token of a conversation's turn 2, cold against the prefix cache
 * (runtime/prefix_cache.h), for histories of several lengths.
 *
 * usage: bench_prefix_cache MODEL_DIR [HISTORIES=4096,16384] [NEW_TOKENS=64] [THREADS=1] [REPLY_TOKENS=32]
 *
 * Per history length H: turn 1 is H prompt ids (i * 7919 mod vocab, special ids avoided) prefilled through
 * the cache, then REPLY_TOKENS greedy tokens and the end-of-generation checkpoint. The session is then
 * reset (as if another conversation had run in between), so turn 2 must restore a checkpoint, not keep
 * the live session. Turn 2 = turn 1 + reply + NEW_TOKENS new ids:
 *   cold:   a fresh session prefills all of turn 2 (lily_session_append), then samples the first token;
 *   cached: lily_prefix_cache_prefill (restore + prefill of the new ids), then samples the first token.
 *   new only: a session that still holds turn 1 + reply live appends the new ids (the floor: what turn 2
 *           costs with no restore at all; cached - new only = the restore).
 * Both first tokens and prompt logits are compared bit for bit. Prints a Markdown table of wall seconds
 * and process CPU seconds (the steadier number on a shared machine). Not a test: numbers go to
 * docs/BENCHMARKS.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/perplexity.h"
#include "runtime/prefix_cache.h"

static int fail(const char *what, const lily_error *err)
{
    fprintf(stderr, "bench_prefix_cache: %s: %s\n", what, err->message);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_prefix_cache MODEL_DIR [HISTORIES=4096,16384] [NEW_TOKENS=64] [THREADS=1] "
                        "[REPLY_TOKENS=32]\n");
        return 2;
    }
    const char *histories = argc > 2 ? argv[2] : "4096,16384";
    const int n_new = argc > 3 ? atoi(argv[3]) : 64;
    const int threads = argc > 4 ? atoi(argv[4]) : 1;
    const int n_reply = argc > 5 ? atoi(argv[5]) : 32;
    lily_error err = {0};
    lily_engine *e = NULL;
    lily_engine_options eo = {.model_dir = argv[1], .backend = "cpu", .n_threads = threads};
    if (lily_engine_open(&eo, &e, &err) != LILY_OK)
        return fail("engine", &err);
    const int vocab = e->cfg.vocab_size;
    printf("model %s, %d threads, prefill chunk %d, %d new tokens in turn 2, %d reply tokens in turn 1\n\n",
           argv[1], threads, e->prefill_chunk, n_new, n_reply);
    printf("| history | turn 2 tokens | cold TTFT s (cpu s) | cached TTFT s (cpu s) | new only s (cpu s) | speedup "
           "| reused | prefilled | checkpoints (MiB) | exact |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    char *list = strdup(histories);
    int rc = 0;
    for (char *tok = strtok(list, ","); tok && rc == 0; tok = strtok(NULL, ",")) {
        const int H = atoi(tok);
        const int max_ctx = H + n_reply + n_new + 16;
        int32_t *ids = malloc((size_t)max_ctx * sizeof *ids);
        float *cold_logits = malloc((size_t)vocab * sizeof(float));
        lily_session *s = NULL, *cold = NULL, *live = NULL;
        lily_prefix_cache *pc = NULL;
        if (!ids || !cold_logits || lily_session_new(e, max_ctx, &s, &err) != LILY_OK ||
            lily_session_new(e, max_ctx, &cold, &err) != LILY_OK || lily_session_new(e, max_ctx, &live, &err) != LILY_OK ||
            lily_prefix_cache_new(NULL, &pc, &err) != LILY_OK) {
            rc = fail("setup", &err);
            goto next;
        }
        for (int i = 0; i < H; i++)
            ids[i] = 16 + (int32_t)(((int64_t)i * 7919) % (vocab - 16));
        /* turn 1: prompt, reply, end-of-generation checkpoint */
        if (lily_prefix_cache_prefill(pc, s, ids, H, NULL, 0, NULL, NULL, NULL, &err) != LILY_OK) {
            rc = fail("turn 1 prefill", &err);
            goto next;
        }
        lily_generate_params gp = lily_generate_defaults();
        gp.sampling.temperature = 0;
        gp.max_tokens = n_reply;
        lily_generate_result gr;
        if (lily_generate(s, NULL, 0, &gp, &gr, &err) != LILY_OK ||
            lily_prefix_cache_checkpoint(pc, s, &err) != LILY_OK) {
            rc = fail("turn 1 generation", &err);
            goto next;
        }
        const int n1 = s->n_tokens;
        int n2 = n1;
        memcpy(ids, s->tokens, (size_t)n2 * sizeof *ids);
        for (int i = 0; i < n_new; i++)
            ids[n2++] = 16 + (int32_t)(((int64_t)(i + 7) * 104729) % (vocab - 16));
        if (lily_session_copy(live, s, &err) != LILY_OK) {
            rc = fail("copy", &err);
            goto next;
        }
        lily_session_reset(s); /* another conversation ran in between */

        double w0 = lily_wall_seconds(), c0 = lily_process_cpu_seconds();
        if (lily_session_append(live, ids + n1, n2 - n1, NULL, &err) != LILY_OK) {
            rc = fail("live append", &err);
            goto next;
        }
        const double live_wall = lily_wall_seconds() - w0, live_cpu = lily_process_cpu_seconds() - c0;

        w0 = lily_wall_seconds(), c0 = lily_process_cpu_seconds();
        if (lily_session_append(cold, ids, n2, NULL, &err) != LILY_OK) {
            rc = fail("cold prefill", &err);
            goto next;
        }
        const int cold_first = lily_argmax(cold->logits, vocab);
        const double cold_wall = lily_wall_seconds() - w0, cold_cpu = lily_process_cpu_seconds() - c0;
        memcpy(cold_logits, cold->logits, (size_t)vocab * sizeof(float));

        int reused = 0;
        w0 = lily_wall_seconds(), c0 = lily_process_cpu_seconds();
        if (lily_prefix_cache_prefill(pc, s, ids, n2, NULL, 0, NULL, NULL, &reused, &err) != LILY_OK) {
            rc = fail("cached prefill", &err);
            goto next;
        }
        const int cached_first = lily_argmax(s->logits, vocab);
        const double cached_wall = lily_wall_seconds() - w0, cached_cpu = lily_process_cpu_seconds() - c0;
        const bool exact = cached_first == cold_first &&
                           !memcmp(cold_logits, s->logits, (size_t)vocab * sizeof(float)) &&
                           !memcmp(cold_logits, live->logits, (size_t)vocab * sizeof(float));
        lily_prefix_cache_stats st;
        lily_prefix_cache_stats_get(pc, &st);
        printf("| %d | %d | %.3f (%.3f) | %.3f (%.3f) | %.3f (%.3f) | %.0fx | %d | %d | %d (%.1f) | %s |\n", H, n2,
               cold_wall, cold_cpu, cached_wall, cached_cpu, live_wall, live_cpu,
               cached_wall > 0 ? cold_wall / cached_wall : 0.0, reused, n2 - reused,
               st.n_checkpoints, (double)st.bytes / (1 << 20), exact ? "bit-identical" : "DIFFERS");
        fflush(stdout);
        if (!exact)
            rc = 1;
    next:
        lily_prefix_cache_free(pc);
        lily_session_free(s);
        lily_session_free(cold);
        lily_session_free(live);
        free(ids);
        free(cold_logits);
    }
    free(list);
    lily_engine_close(e);
    return rc;
}
