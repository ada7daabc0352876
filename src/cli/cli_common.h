/* cli_common.h — what the commands share: the default model directory, opening a model (engine +
 * tokenizer + checks), the sampling / engine options every generating command accepts, printing a
 * streamed reply (reasoning, content, tool calls), and parsing integer options and token-id lists.
 */
#ifndef LILY_CLI_COMMON_H
#define LILY_CLI_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "model/config.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

/* The bundled default model's directory name under <source>/models/ (set by the lead). */
#ifndef LILY_DEFAULT_MODEL_NAME
#define LILY_DEFAULT_MODEL_NAME "lily-tiny"
#endif

/* The model directory to use when -m is not given: $LILY_MODEL if set, else
 * <LILY_SOURCE_DIR>/models/LILY_DEFAULT_MODEL_NAME if it exists, else <LILY_SOURCE_DIR>/tests/data/tiny-chat.
 * Prints one line on stderr naming the directory chosen and why. Returns a static string, never NULL.
 * *is_test_model: the last choice (random weights) was taken. */
const char *cli_default_model(const char *cmd, bool *is_test_model);

/* Check a --backend value: "cpu" or "cuda" (cuda in a build without it is a load-time error, not this one).
 * Prints "lily CMD: unknown backend 'NAME' (backends: cpu, cuda)" on stderr and returns -1 when name is
 * neither (the caller exits with status 2, a usage error); 0 when known. */
int cli_check_backend(const char *cmd, const char *name);

/* A --precision value: "fast" (false, the default: the backend's fast kernels) or "exact" (true: fp32
 * everywhere, lily_backend_options.exact) into *exact. Prints
 * "lily CMD: --precision expects fast or exact, got "V"" on stderr and returns -1 otherwise; 0 on success. */
int cli_parse_precision(const char *cmd, const char *value, bool *exact);

/* Options shared by the generating commands. */
typedef struct {
    const char *model_dir;     /* -m; NULL = cli_default_model */
    const char *backend;       /* --backend cpu|cuda */
    bool exact;                /* --precision exact (lily_backend_options.exact); default fast */
    int n_threads;             /* --threads (0 = all cores) */
    int prefill_chunk;         /* --prefill-chunk (0 = engine default) */
    int ctx_size;              /* --ctx-size (0 = the model's; cuda: as large as fits, up to the model's) */
    size_t gpu_memory_bytes;   /* --gpu-memory (0 = all free; lily_engine_options.gpu_memory_bytes) */
    size_t device_pool_bytes;  /* the device checkpoint pool the command will ask for (chat's --cache-vram) */
    int n_cpu_moe;             /* --n-cpu-moe / --cpu-moe (lily_engine_options.n_cpu_moe; 0 = the plan's) */
    const char *cpu_moe_option; /* which of the two set n_cpu_moe (NULL: neither): giving both is an error */
    int host_experts;          /* --host-experts (lily_engine_options.host_experts; 0 = the backend's rule) */
    int max_tokens;            /* -n (0 = until a stop token or a full context) */
    bool set_max_tokens;       /* -n given (0 included: no cap over generation_config.json's) */
    lily_sampler_params sampling; /* --temp --top-p --top-k --min-p --seed; filled by cli_model_open from
                                     generation_config.json unless given on the command line; without
                                     --seed the seed comes from the clock */
    bool set_temp, set_top_p, set_top_k, set_min_p, set_seed; /* given on the command line */
    bool random_seed;          /* --seed -1: a random seed (set_seed false), printed once drawn */
    bool no_think;             /* --no-think */
    bool host_sampler;         /* --host-sampler: never the backend's device decode loop (generate.h) */
    bool verbose;              /* --verbose: print the decode path after each reply */
    bool hide_reasoning;       /* --hide-reasoning */
    const char *system;        /* --system TEXT */
} cli_gen_options;

/* Defaults: backend "cpu", everything else zero / off; sampling = lily_sampler_defaults(). */
void cli_gen_options_init(cli_gen_options *o);

/* Try to parse argv[*i] (and its value) as one of the shared options. Returns 1 when consumed (*i is
 * advanced past the value), 0 when argv[*i] is not a shared option, -1 on a bad value (message printed). */
int cli_gen_option(const char *cmd, int argc, char **argv, int *i, cli_gen_options *o);

/* The shared options' help lines. */
void cli_gen_options_usage(FILE *f);

/* An opened model: engine, tokenizer and the stop ids (config + generation_config + the tokenizer's
 * <|im_end|>, <|endoftext|> and eos token). */
typedef struct {
    const char *model_dir;
    lily_engine *engine;
    lily_tokenizer *tok;
    int32_t stop_ids[LILY_MAX_STOP_IDS + 3];
    int n_stop_ids;
} cli_model;

/* Open o->model_dir (or the default model): check the directory, load the tokenizer (a missing or
 * malformed tokenizer.json is an error), open the engine, check the tokenizer's ids fit the model's
 * vocab_size, warn on stderr when the chat template differs from the known one (unless raw), and fill
 * sampling defaults from generation_config.json (temperature, top_p, top_k, min_p) for options not given.
 * Prints "lily CMD: message" on stderr and returns 1 on error; 0 on success. */
int cli_model_open(const char *cmd, cli_gen_options *o, bool raw, cli_model *m);
void cli_model_close(cli_model *m);

/* Encode text (special tokens written in it recognized). Prints the error; returns 0 or 1. */
int cli_encode(const char *cmd, const cli_model *m, const char *text, int32_t **ids, int *n_ids);

/* Check that text (NUL-terminated) is valid UTF-8 (utf8proc's rules: no overlong forms, surrogates or
 * code points past U+10FFFF), as the chat template's JSON messages need. Prints
 * "lily CMD: WHAT is not valid UTF-8 (byte N of M)" and returns 1 if not; 0 if valid. */
int cli_check_utf8(const char *cmd, const char *what, const char *text);

/* The message for a command-line word no option takes, then a blank line (the caller prints its usage):
 * "unknown option '-x'", or for a word that is not an option "unexpected argument 'x'" with what to do
 * (run: the prompt goes after -p, as `ollama run MODEL PROMPT` users type it first); an option of llama.cpp
 * or vLLM gets what lily does instead (cli_foreign_option_hint). */
void cli_unknown_argument(const char *cmd, const char *arg);

/* For an option of llama.cpp or vLLM that lily does not take (-ngl, --max-model-len, --tensor-parallel-size,
 * ...; "--opt=VALUE" names --opt): writes "ENGINE's option; what lily does instead" to buf (cap bytes) and
 * returns 1; returns 0 for any other word. */
int cli_foreign_option_hint(const char *arg, char *buf, size_t cap);

/* Prints a streamed reply to a FILE: raw text verbatim, or (parsed) reasoning — ANSI faint when the
 * stream is a terminal, dropped when hide_reasoning — then content, and tool calls as
 * "[tool call] name {arguments}". Also keeps the parser's result for the caller (chat history). */
typedef struct {
    FILE *out;
    bool raw;                  /* no parsing: print the text as generated */
    bool hide_reasoning;
    bool tty;                  /* out is a terminal: ANSI faint for reasoning (else <think> ... </think> lines) */
    lily_output_parser *parser;
    int state;                 /* what was printed last: 0 nothing, 1 reasoning, 2 content, 3 tool call */
    bool at_line_start;
} cli_printer;

/* thinking: the prompt opened a think block. Errors: out of memory (printed; returns 1). */
int cli_printer_init(cli_printer *p, FILE *out, bool raw, bool thinking, bool hide_reasoning);

/* A lily_token_callback: feeds the text to the parser (or prints it raw). user is a cli_printer *. */
int cli_printer_on_token(void *user, int32_t token, const char *text, size_t len);

/* End of the reply: flush the parser, close any open styling, end the line. Returns 0 or 1 (printed). */
int cli_printer_finish(cli_printer *p, bool cut_by_length);
void cli_printer_free(cli_printer *p);

/* All of f, NUL-terminated (malloc'd; *len bytes, not counting the NUL). NULL on a read error or OOM, with errno
 * saying which (EISDIR for a directory opened as a file, ENOMEM). */
char *cli_read_all(FILE *f, size_t *len);

/* The whole text of a prompt file, or of stdin when path is "-" (malloc'd, NUL-terminated). NULL after a
 * message on stderr ("lily CMD: ...", with the system's reason) when it cannot be opened or read, or holds a
 * NUL byte. */
char *cli_read_prompt(const char *cmd, const char *path);

/* Match argv[*i] against a table of value options (n entries; alt may be NULL): "NAME VALUE", "ALT VALUE",
 * or "NAME=VALUE" / "ALT=VALUE" for names starting with "--". Returns 1 on a match with *name set to the
 * entry's name and *value to its value (*i advanced past a separate value); 0 when argv[*i] is none of
 * them (nothing printed); -1 when it is one but no value follows ("lily CMD: OPT needs a value" printed:
 * a usage error). Every command parses its value options through this, so all accept the = form. */
typedef struct {
    const char *name, *alt;
} cli_value_option;
int cli_match_option(const char *cmd, int argc, char **argv, int *i, const cli_value_option *opts, size_t n,
                     const char **name, const char **value);

/* --threads, the one rule for every command: 0 = all cores (the default), else 1..CLI_MAX_THREADS;
 * anything else is a usage error (exit 2), checked while parsing, before any thread starts. */
#define CLI_MAX_THREADS 4096
#define CLI_THREADS_HELP "CPU threads: 0 = all cores (the default), at most 4096"

/* Parse a --threads value by that rule into *out. Prints "lily CMD: OPT expects an integer in [0, 4096],
 * got "S"" and returns -1 when it breaks it; 0 on success. */
int cli_parse_threads(const char *cmd, const char *opt, const char *s, int *out);

/* Parse an integer option value in [min, max]. Prints "lily CMD: OPT expects an integer in [min, max], got
 * "S"" on stderr and returns -1 when s is not one; 0 on success. */
int cli_parse_int(const char *cmd, const char *opt, const char *s, long min, long max, long *out);

/* The smallest --ctx-size lily takes: a chat's fixed template tokens (the Qwen3.5/3.6 template around an empty
 * user message: 10 with thinking, 12 without) and one reply token need 13; 16, the power of two above, leaves
 * room for a word. Smaller contexts failed every request. */
#define CLI_MIN_CTX_SIZE 16

/* Parse a --ctx-size value: 0 (the default) or an integer in [CLI_MIN_CTX_SIZE, 2^24]. Prints
 * "lily CMD: OPT N is too small: the minimum is 16 tokens ..." or cli_parse_int's message and returns -1
 * when it is neither; 0 on success. */
int cli_parse_ctx_size(const char *cmd, const char *opt, const char *s, long *out);

/* Parse a --cache-ram value, MiB (an integer in [1, 2^24]), into bytes. A cap past the memory this process
 * may use (lily_memory_limit_bytes: physical memory, or a cgroup limit when lower) can never be honoured, so
 * it is refused too: prints "lily CMD: OPT N MiB is more than the memory this process may use (M MiB ...)"
 * and returns -1; 0 on success. */
int cli_parse_cache_ram(const char *cmd, const char *opt, const char *s, size_t *bytes);

/* Parse a --gpu-memory value, GiB (a decimal number in (0, 65536]), into bytes. Prints "lily CMD: OPT
 * expects ..." and returns -1 otherwise; 0 on success. */
int cli_parse_gib(const char *cmd, const char *opt, const char *s, size_t *bytes);
#define CLI_GPU_MEMORY_HELP "GPU memory lily may hold, GiB (default: all free; the plan is printed)"

/* Parse a --n-cpu-moe value (an integer >= 0) into lily_engine_options.n_cpu_moe's encoding: 0 becomes
 * LILY_N_CPU_MOE_NONE, N > 0 stays N. Prints "lily CMD: --n-cpu-moe expects ..." and returns -1 otherwise. */
int cli_parse_n_cpu_moe(const char *cmd, const char *opt, const char *s, int *n_cpu_moe);
/* Parse a --host-experts value: zero-copy, cpu, or N in [1, 64] (lily_backend_options.host_experts). Prints
 * "lily CMD: --host-experts expects ..." and returns -1 otherwise; 0 on success. */
int cli_parse_host_experts(const char *cmd, const char *opt, const char *s, int *host_experts);
#define CLI_HOST_EXPERTS_HELP "decode of experts in host memory: zero-copy (GPU over PCIe), cpu, or N (CPU takes N of the top-k)"
#define CLI_HOST_EXPERTS_DEFAULT_HELP "default: half of the top-k on the CPU with 7+ threads, else zero-copy"
/* Records that option (--cpu-moe or --n-cpu-moe) sets n_cpu_moe in *set_by. The other one already given is a
 * usage error: prints "lily CMD: --cpu-moe and --n-cpu-moe conflict ..." and returns -1; 0 otherwise. */
int cli_note_cpu_moe_option(const char *cmd, const char *option, const char **set_by);
/* --cpu-moe: every layer's routed experts (lily_engine_options.n_cpu_moe) */
#define CLI_CPU_MOE_ALL INT32_MAX
#define CLI_CPU_MOE_HELP "keep every layer's routed experts in host memory (cuda; read over PCIe)"
#define CLI_N_CPU_MOE_HELP "the first N layers' routed experts in host memory (cuda; default: the fewest that fit)"

/* Token ids separated by whitespace, commas or brackets ("1,2,3", "[1 2 3]") into a malloc'd array
 * (*n_out may be 0: the caller decides whether an empty list is an error). Returns 0, or -1 with
 * "lily CMD: ..." printed on stderr (a negative, non-numeric or out-of-range id; out of memory). */
int cli_parse_token_ids(const char *cmd, const char *text, int32_t **out, int *n_out);

/* cli_parse_token_ids on the contents of a file. Returns 0; 1 when the file cannot be read; -1 when its
 * contents are not an id list (the reason printed on stderr in both cases). */
int cli_read_token_ids_file(const char *cmd, const char *path, int32_t **out, int *n_out);

/* "decode path: device loop (N batches, M steps re-run after the stop)" or "decode path: host sampler
 * (why)" on stderr, for --verbose. */
void cli_print_decode_path(const char *prefix, const lily_generate_result *r);

/* Print "prefill: N tokens, X tok/s | decode: N tokens, Y tok/s (finish)" to stderr. */
void cli_print_speed(const char *prefix, int n_prefill, double prefill_s, int n_generated, int n_decode_steps,
                     double decode_s, const char *finish);

/* The reason a reply ended, as the speed lines print it: lily_finish_reason_name, and for "length" what the
 * limit was: o's -n (set_max_tokens) or generation_config.json's max_new_tokens, or the full context of
 * max_ctx tokens (what to raise). Written into buf[n]; returns buf. */
const char *cli_finish_text(const lily_generate_result *r, const cli_gen_options *o, int max_ctx, char *buf, size_t n);

#endif
