/* bench_grammar.c — the cost of grammar-constrained decoding on the host: the vocabulary trie, compiling a
 * schema, and the token mask per step.
 *
 * usage: bench_grammar [MODEL_DIR]
 * Default: tests/data/tokenizers/qwen3 (151,643 tokens, the vocabulary size of the real models; a model
 * directory from tools/write_synthetic.py has Qwen3.6's 248,320). Builds the vocabulary trie (timed; beside
 * it the reference build that inserts the tokens one by one, lily_token_trie_new_by_insertion), then for a
 * few schemas: compiling it and the matcher (timed, best of 200), then walking a document the schema accepts
 * token by token as the tokenizer splits it: mask (timed), check that the document's next token is allowed,
 * feed it. Prints the trie build times and, per schema, the compile time, the first mask's time (what a
 * request's first token waits for), the mean and worst mask time in ms and the tokens allowed on average
 * (process CPU time, steadier than wall time on a shared machine; BENCH_GRAMMAR_STEPS=1 prints every step).
 * One core. Not a test: numbers go to docs/BENCHMARKS.md.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "grammar/constraint.h"
#include "grammar/grammar.h"
#include "grammar/grammar_internal.h"
#include "text/tokenizer.h"

static const struct {
    const char *name, *schema, *document;
    lily_grammar_syntax syntax;
} cases[] = {
    {"object of scalars",
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
     "\"admin\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\",\"admin\"]}",
     "{\"name\":\"Ada Lovelace, the first programmer of the Analytical Engine\",\"age\":36,\"admin\":true}",
     LILY_GRAMMAR_JSON},
    {"nested + enum + array",
     "{\"type\":\"object\",\"properties\":{\"status\":{\"enum\":[\"open\",\"paid\",\"shipped\"]},\"items\":{\"type\":"
     "\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"sku\":{\"type\":\"string\"},\"qty\":{\"type\":"
     "\"integer\"}},\"required\":[\"sku\",\"qty\"]}},\"note\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}},"
     "\"required\":[\"status\",\"items\",\"note\"]}",
     "{\"status\":\"paid\",\"items\":[{\"sku\":\"A-100\",\"qty\":2},{\"sku\":\"B-7\",\"qty\":10}],\"note\":null}",
     LILY_GRAMMAR_JSON},
    {"string with maxLength, array of strings (bench/serve_speed.py's)",
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":400},\"tags\":{\"type\":"
     "\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":40}},\"required\":[\"name\",\"tags\"],"
     "\"additionalProperties\":false}",
     "{\"name\":\"kernel memory bandwidth river stone cloud matrix token engine green quiet signal paper window "
     "orange number thread castle forest lamp ocean silver delta\",\"tags\":[\"alpha\",\"kernel\",\"memory\"]}",
     LILY_GRAMMAR_JSON},
    {"json_object (free)", NULL,
     "{\"query\":\"weather in Paris\",\"filters\":{\"days\":[1,2,3],\"units\":\"metric\",\"verbose\":false}}",
     LILY_GRAMMAR_JSON},
    {"integers with bounds (pydantic Field(ge=, le=), negative and int64 ranges)",
     "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\","
     "\"minimum\":1,\"maximum\":9223372036854775807},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
     "\"delta\":{\"type\":\"integer\",\"minimum\":-500,\"exclusiveMaximum\":500},\"rank\":{\"type\":\"integer\","
     "\"minimum\":1}},\"required\":[\"id\",\"age\",\"delta\",\"rank\"]}}",
     "[{\"id\":4611686018427387,\"age\":36,\"delta\":-499,\"rank\":1},{\"id\":42,\"age\":150,\"delta\":0,"
     "\"rank\":1234567},{\"id\":1000000007,\"age\":0,\"delta\":499,\"rank\":31415926535}]",
     LILY_GRAMMAR_JSON},
    {"numbers with bounds (pydantic float Field(ge=, le=, gt=, lt=))",
     "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"score\":{\"type\":\"number\","
     "\"minimum\":0,\"maximum\":1},\"kelvin\":{\"type\":\"number\",\"exclusiveMinimum\":-273.15},\"delta\":{\"type\":"
     "\"number\",\"minimum\":-2.5,\"exclusiveMaximum\":2.5}},\"required\":[\"score\",\"kelvin\",\"delta\"]}}",
     "[{\"score\":0.8125,\"kelvin\":-273.1,\"delta\":-2.5},{\"score\":1,\"kelvin\":5778.25,\"delta\":0.333333},"
     "{\"score\":0,\"kelvin\":0.0,\"delta\":2.4999}]",
     LILY_GRAMMAR_JSON},
    {"tool arguments (bench/serve_speed.py's forced call)",
     "{\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\"},\"limit\":{\"type\":\"integer\"}},"
     "\"required\":[\"query\"]}",
     "<parameter=query>\nkernel memory bandwidth of the H200\n</parameter>\n<parameter=limit>\n20\n</parameter>\n"
     "</function>\n</tool_call>", LILY_GRAMMAR_QWEN_TOOL},
};

/* Process CPU seconds of lily_vocab_trie_new (by_insertion false) or of the reference build. */
static double time_trie(const lily_tokenizer *tok, int vocab, bool by_insertion)
{
    lily_error err = {0};
    lily_token_trie *t = NULL;
    const char **bytes = calloc((size_t)vocab, sizeof *bytes);
    size_t *lens = calloc((size_t)vocab, sizeof *lens);
    bool *excluded = calloc((size_t)vocab, sizeof *excluded);
    double s = lily_process_cpu_seconds();
    if (by_insertion && bytes && lens && excluded) {
        for (int id = 0; id < vocab; id++) {
            bytes[id] = lily_tokenizer_token_bytes(tok, id, &lens[id]);
            excluded[id] = lily_tokenizer_is_special(tok, id);
        }
        lily_token_trie_new_by_insertion(bytes, lens, excluded, vocab, &t, &err);
    } else if (!by_insertion) {
        lily_vocab_trie_new(tok, vocab, &t, &err);
    }
    s = lily_process_cpu_seconds() - s;
    lily_token_trie_free(t);
    free(bytes);
    free(lens);
    free(excluded);
    return t ? s : -1;
}

int main(int argc, char **argv)
{
    const char *model = argc > 1 ? argv[1] : LILY_SOURCE_DIR "/tests/data/tokenizers/qwen3";
    lily_error err = {0};
    lily_tokenizer *tok;
    if (lily_tokenizer_load(model, &tok, &err) != LILY_OK) {
        fprintf(stderr, "bench_grammar: %s\n", err.message);
        return 1;
    }
    const int vocab = lily_tokenizer_vocab_size(tok);
    double best = 1e9, best_ref = 1e9;
    for (int r = 0; r < 3; r++) {
        const double t = time_trie(tok, vocab, false), t_ref = time_trie(tok, vocab, true);
        best = t < best ? t : best;
        best_ref = t_ref < best_ref ? t_ref : best_ref;
    }
    lily_token_trie *trie;
    if (lily_vocab_trie_new(tok, vocab, &trie, &err) != LILY_OK) {
        fprintf(stderr, "bench_grammar: %s\n", err.message);
        return 1;
    }
    printf("vocabulary %d tokens (%s): trie built in %.1f ms (reference build by insertion %.1f ms; best of 3)\n",
           vocab, model, 1e3 * best, 1e3 * best_ref);
    uint8_t *allowed = malloc((size_t)vocab);
    int status = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0] && allowed; c++) {
        json_t *schema = cases[c].schema ? json_loads(cases[c].schema, 0, NULL) : NULL;
        lily_grammar *g = NULL;
        lily_grammar_matcher *m = NULL;
        double compile = 1e9;
        for (int r = 0; r < 200; r++) { /* compile + matcher, as a request does; best of 200 */
            lily_grammar_free(g);
            lily_grammar_matcher_free(m);
            g = NULL;
            m = NULL;
            const double t = lily_wall_seconds();
            if (lily_grammar_compile(schema, cases[c].syntax, &g, &err) != LILY_OK ||
                lily_grammar_matcher_new(g, &m, &err) != LILY_OK) {
                fprintf(stderr, "bench_grammar: %s\n", err.message);
                return 1;
            }
            const double dt = lily_wall_seconds() - t;
            compile = dt < compile ? dt : compile;
        }
        json_decref(schema);
        double first = 0;
        int32_t *ids;
        int n;
        if (lily_tokenizer_encode(tok, cases[c].document, strlen(cases[c].document), false, &ids, &n, &err) != LILY_OK)
            return 1;
        double total = 0, worst = 0;
        long n_allowed = 0;
        for (int i = 0; i < n; i++) {
            double t = lily_process_cpu_seconds();
            n_allowed += lily_grammar_matcher_mask(m, trie, allowed);
            t = lily_process_cpu_seconds() - t;
            first = i == 0 ? t : first;
            total += t;
            worst = t > worst ? t : worst;
            size_t len;
            const char *bytes = lily_tokenizer_token_bytes(tok, ids[i], &len);
            if (getenv("BENCH_GRAMMAR_STEPS"))
                printf("  step %d: %.3f ms, next token %.*s\n", i, 1e3 * t, (int)len, bytes);
            if (!allowed[ids[i]] || !lily_grammar_matcher_feed(m, bytes, len)) {
                fprintf(stderr, "bench_grammar: %s: token %d (%.*s) of the document is masked out\n", cases[c].name,
                        i, (int)len, bytes);
                status = 1;
                break;
            }
        }
        printf("%-24s %3d tokens: compile %.1f us, first mask %.3f ms, mask %.3f ms mean, %.3f ms worst, %.0f "
               "tokens allowed on average, complete: %s\n",
               cases[c].name, n, 1e6 * compile, 1e3 * first, 1e3 * total / n, 1e3 * worst, (double)n_allowed / n,
               lily_grammar_matcher_accepting(m) ? "yes" : "NO");
        free(ids);
        lily_grammar_matcher_free(m);
        lily_grammar_free(g);
    }
    free(allowed);
    lily_token_trie_free(trie);
    lily_tokenizer_free(tok);
    return status;
}
