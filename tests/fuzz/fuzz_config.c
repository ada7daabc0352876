/* fuzz_config.c — libFuzzer target for config.json (lily_config_parse).
 * Checks: no crash, leak or undefined behaviour; a refused config names a reason; an accepted one has
 * positive sizes, a layer type per layer and its stop ids inside the vocabulary.
 */
#include <stdint.h>

#include "fuzz_support.h"
#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lily_config cfg;
    lily_error err;
    if (lily_config_parse((const char *)data, size, &cfg, &err) != LILY_OK) {
        FUZZ_CHECK(err.message[0]);
        return 0;
    }
    FUZZ_CHECK(cfg.vocab_size > 0 && cfg.hidden > 0 && cfg.n_layers > 0);
    for (int i = 0; i < cfg.n_stop_ids; i++)
        FUZZ_CHECK(cfg.stop_ids[i] >= 0 && cfg.stop_ids[i] < cfg.vocab_size);
    for (int i = 0; i < cfg.n_layers; i++)
        FUZZ_CHECK(cfg.layer_types[i] == LILY_LAYER_FULL_ATTENTION || cfg.layer_types[i] == LILY_LAYER_LINEAR_ATTENTION);
    return 0;
}
