/* synthetic.h — random but well-scaled weights built in memory, for benchmarks without a checkpoint.
 *
 * Owns: the built-in model shapes (Qwen3.6-35B-A3B, MODEL.md §1.2) and filling a lily_weights with
 * random tensors of the exact MLX 4-bit layout (MODEL.md §2.3: 4-bit affine, group 64, bf16 scales and
 * biases; router and shared_expert_gate at 8 bits; norms holding 1 + w; conv1d [C, K]; A_log f32;
 * dt_bias bf16) — the same kind of values tools/write_synthetic.py writes to disk: uniform random codes,
 * per-group scales giving zero-mean weights of std 1/sqrt(in_features) (output projections also divided
 * by sqrt(2 * n_layers)), iid router rows so routing spreads over the experts.
 * Does not own: a file (nothing is read or written) or the backend (the caller creates one on the weights).
 */
#ifndef LILY_SYNTHETIC_H
#define LILY_SYNTHETIC_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "lily.h"
#include "weights.h"

/* A synthetic model: its config, its weights (pointing into `buffer`), and the memory behind them. */
typedef struct {
    char name[256];        /* the preset name or the config file it came from */
    lily_config cfg;
    lily_weights weights;  /* layout MLX, quant_bits 4; free with lily_synthetic_free, not lily_weights_free */
    void *buffer;          /* every tensor's bytes */
    size_t buffer_size;
    char *names;           /* tensor names (the checkpoint names tools/write_synthetic.py writes) */
} lily_synthetic;

/* The config of a built-in shape: "qwen3.6-35b-a3b" (alias "35b"), "qwen3.6-35b-a3b-4l" (the same with
 * 4 layers, for a quick run), "small" (quarter width: hidden 512, 8 layers, 64 experts top-8, vocab 32768;
 * for CPU sweeps), or "tiny-a" (tests/data/tiny-a's shape). Quantization: 4 bits, group 64.
 * Errors: LILY_ERR_INVALID_ARGUMENT for an unknown name. */
lily_status lily_synthetic_preset(const char *name, lily_config *cfg, lily_error *err);

/* Build a synthetic model of shape `spec` — a preset name (above), a config.json file, or a model
 * directory holding one — with values drawn from `seed` by a counter-based generator (the same values
 * whatever n_threads is; n_threads 0 = all cores). Memory: the size of the MLX 4-bit checkpoint
 * (~19.5 GB for 35B-A3B). Errors: LILY_ERR_INVALID_ARGUMENT (unknown preset; hidden or an in-feature
 * count not a multiple of 64), as lily_config_load / lily_config_parse, LILY_ERR_OUT_OF_MEMORY. */
lily_status lily_synthetic_new(const char *spec, uint64_t seed, int n_threads, lily_synthetic **out, lily_error *err);
void lily_synthetic_free(lily_synthetic *s);

#endif
