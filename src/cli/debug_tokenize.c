/* debug_tokenize.c — `lily debug tokenize [--model DIR] [--ids] [--no-special]`: stdin text -> token ids.
 *
 * Reads all of stdin verbatim (a trailing newline is part of the text) and encodes it as HF `tokenizers`
 * does, recognizing special tokens written in the text. Needs only DIR/tokenizer.json (and
 * tokenizer_config.json when present), not weights.
 * Output: with --ids, the ids separated by spaces on one line; otherwise one line per token,
 * "id<TAB>text", the text with \n, \t, \r, \\ and non-printable bytes escaped (\xNN), and a last line
 * "# N tokens, B bytes" on stderr.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "commands.h"
#include "text/tokenizer.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: lily debug tokenize [--model DIR] [--ids] [--no-special]\n"
               "  reads text on stdin and prints its token ids\n"
               "  --ids         only the ids, space-separated\n"
               "  --no-special  encode special tokens written in the text as plain text\n");
}

static void print_escaped(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c == '\r')
            fputs("\\r", stdout);
        else if (c == '\\')
            fputs("\\\\", stdout);
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else if (c < 0x80)
            putchar(c);
        else {
            /* print whole valid UTF-8 characters, escape stray bytes (a token may hold part of one) */
            int need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 0;
            bool ok = need > 0 && i + (size_t)need <= n && c <= 0xF4;
            for (int k = 1; ok && k < need; k++)
                ok = ((unsigned char)s[i + (size_t)k] & 0xC0) == 0x80;
            if (ok) {
                fwrite(s + i, 1, (size_t)need, stdout);
                i += (size_t)need - 1;
            } else {
                printf("\\x%02x", c);
            }
        }
    }
}

int debug_tokenize(int argc, char **argv)
{
    const char *model = NULL;
    bool ids_only = false, parse_special = true;
    static const cli_value_option opts[] = {{"--model", "-m"}};
    for (int i = 1; i < argc; i++) {
        const char *name, *value;
        int r = cli_match_option("debug tokenize", argc, argv, &i, opts, 1, &name, &value);
        if (r < 0)
            return 2;
        if (r > 0)
            model = value;
        else if (!strcmp(argv[i], "--ids"))
            ids_only = true;
        else if (!strcmp(argv[i], "--no-special"))
            parse_special = false;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "lily debug tokenize: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!model) { /* as every command: $LILY_MODEL, else the bundled model, else the test model */
        bool is_test_model;
        model = cli_default_model("debug tokenize", &is_test_model);
    }
    lily_error err = {0};
    lily_tokenizer *tok;
    if (lily_tokenizer_load(model, &tok, &err) != LILY_OK) {
        fprintf(stderr, "lily debug tokenize: %s\n", err.message);
        return 1;
    }
    size_t len;
    char *text = cli_read_all(stdin, &len);
    if (!text) {
        fprintf(stderr, "lily debug tokenize: cannot read stdin: %s\n", strerror(errno));
        lily_tokenizer_free(tok);
        return 1;
    }
    int32_t *ids;
    int n;
    if (lily_tokenizer_encode(tok, text, len, parse_special, &ids, &n, &err) != LILY_OK) {
        fprintf(stderr, "lily debug tokenize: %s\n", err.message);
        free(text);
        lily_tokenizer_free(tok);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        if (ids_only) {
            printf(i ? " %d" : "%d", (int)ids[i]);
            continue;
        }
        size_t tlen = 0;
        const char *t = lily_tokenizer_token_bytes(tok, ids[i], &tlen);
        printf("%d\t", (int)ids[i]);
        print_escaped(t ? t : "", tlen);
        putchar('\n');
    }
    if (ids_only)
        putchar('\n');
    fflush(stdout);
    if (!ids_only)
        fprintf(stderr, "# %d tokens, %zu bytes\n", n, len);
    free(ids);
    free(text);
    lily_tokenizer_free(tok);
    return 0;
}
