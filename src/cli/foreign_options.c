/* foreign_options.c — what lily does instead of another engine's command-line option (cli_common.h).
 *
 * Owns: the table of llama.cpp's (llama-cli, llama-server) and vLLM's (`vllm serve`) option names that users
 * of those engines type out of habit, each with lily's equivalent or why none is needed. Does not own: the
 * "unknown option" message itself (cli_unknown_argument, model_open.c).
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cli_common.h"

typedef struct {
    const char *name;   /* the option as the other engine spells it */
    const char *engine; /* "llama.cpp" or "vLLM" */
    const char *instead;
} foreign_option;

static const char ONE_GPU[] = "lily runs on one GPU: for several, serve the Hugging Face checkpoint with vLLM or "
                              "SGLang";
static const char ON_GPU[] = "--backend cuda runs every layer on the GPU; --n-cpu-moe N or --cpu-moe keeps routed "
                             "experts in host memory";
static const char ONE_AT_A_TIME[] = "lily serve runs one request at a time and queues the rest: --queue N";
static const char TEMPLATE[] = "lily renders the Qwen3.6 chat template itself: nothing to set";
static const char NO_DOWNLOAD[] = "lily downloads nothing: `hf download ORG/NAME --local-dir DIR`, then -m DIR";
static const char PARSED[] = "lily parses Qwen's reasoning and tool calls itself: nothing to set";

static const foreign_option TABLE[] = {
    {"-ngl", "llama.cpp", ON_GPU},
    {"--n-gpu-layers", "llama.cpp", ON_GPU},
    {"--gpu-layers", "llama.cpp", ON_GPU},
    {"-fa", "llama.cpp", "lily picks its attention kernels itself: nothing to set"},
    {"--flash-attn", "llama.cpp", "lily picks its attention kernels itself: nothing to set"},
    {"--jinja", "llama.cpp", TEMPLATE},
    {"--chat-template", "llama.cpp", TEMPLATE},
    {"--chat-template-file", "llama.cpp", TEMPLATE},
    {"-np", "llama.cpp", ONE_AT_A_TIME},
    {"--parallel", "llama.cpp", ONE_AT_A_TIME},
    {"-cb", "llama.cpp", ONE_AT_A_TIME},
    {"--cont-batching", "llama.cpp", ONE_AT_A_TIME},
    {"--mlock", "llama.cpp", "lily memory-maps the weights: nothing to set"},
    {"--no-mmap", "llama.cpp", "lily memory-maps the weights: nothing to set"},
    {"-hf", "llama.cpp", NO_DOWNLOAD},
    {"--hf-repo", "llama.cpp", NO_DOWNLOAD},
    {"--n-predict", "llama.cpp", "lily's is -n N"},
    {"-ts", "llama.cpp", ONE_GPU},
    {"--tensor-split", "llama.cpp", ONE_GPU},
    {"--max-model-len", "vLLM", "lily's is --ctx-size N"},
    {"--served-model-name", "vLLM", "lily serve's is --alias NAME"},
    {"--gpu-memory-utilization", "vLLM", "lily's is --gpu-memory GIB (GiB, not a fraction)"},
    {"-tp", "vLLM", ONE_GPU},
    {"--tensor-parallel-size", "vLLM", ONE_GPU},
    {"-pp", "vLLM", ONE_GPU},
    {"--pipeline-parallel-size", "vLLM", ONE_GPU},
    {"--max-num-seqs", "vLLM", ONE_AT_A_TIME},
    {"--enable-prefix-caching", "vLLM", "lily serve's prefix cache is always on (--cache-ram, --cache-vram)"},
    {"--enable-auto-tool-choice", "vLLM", PARSED},
    {"--tool-call-parser", "vLLM", PARSED},
    {"--reasoning-parser", "vLLM", PARSED},
    {"--trust-remote-code", "vLLM", "lily runs no code from the model directory: nothing to set"},
    {"--dtype", "vLLM", "lily runs the checkpoint as stored (MLX 4/8-bit or bf16): nothing to set"},
    {"--quantization", "vLLM", "lily reads the quantization from the checkpoint: nothing to set"},
};

int cli_foreign_option_hint(const char *arg, char *buf, size_t cap)
{
    size_t len = strcspn(arg, "="); /* --opt=VALUE names --opt */
    for (size_t i = 0; i < sizeof TABLE / sizeof TABLE[0]; i++)
        if (strlen(TABLE[i].name) == len && !strncmp(arg, TABLE[i].name, len)) {
            snprintf(buf, cap, "%s's option; %s", TABLE[i].engine, TABLE[i].instead);
            return 1;
        }
    return 0;
}
