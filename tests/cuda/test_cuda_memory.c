/* test_cuda_memory.c — the CUDA backend's memory_needs (what the memory plan reads) for the
 * Qwen3.6-35B-A3B shape: the KV cache per token is 10 attention layers x K and V x 2 KV heads x 256 dims
 * of bf16 (+ a 4-byte token slot), the DeltaNet state 30 layers of conv + recurrent state, and the
 * prefill scratch grows by less than one vocabulary row of fp32 per chunk token (the all-row logits are
 * computed in blocks, never [chunk, vocab] at once). Exits 77 when no GPU is present.
 */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "model/synthetic.h"

#include "cuda_test_compare.h"

static void run(void)
{
    lily_error err = {0};
    lily_config cfg;
    REQUIRE(lily_synthetic_preset("qwen3.6-35b-a3b", &cfg, &err) == LILY_OK, "preset: %s", err.message);
    lily_weights w; /* no tensors: weight bytes 0; the scratch and state sizes depend on the shape only */
    memset(&w, 0, sizeof w);
    const lily_backend_ops *ops = lily_backend_find("cuda");
    REQUIRE(ops && ops->memory_needs, "cuda backend without memory_needs");
    lily_backend_options o;
    memset(&o, 0, sizeof o);
    lily_backend_memory m4k, m2k, mx;
    o.max_chunk = 4096;
    REQUIRE(ops->memory_needs(&cfg, &w, &o, &m4k, &err) == LILY_OK, "memory_needs: %s", err.message);
    o.max_chunk = 2048;
    REQUIRE(ops->memory_needs(&cfg, &w, &o, &m2k, &err) == LILY_OK, "memory_needs: %s", err.message);
    REQUIRE(m4k.device_total > 0 && m4k.device_free <= m4k.device_total, "device memory %zu of %zu",
            m4k.device_free, m4k.device_total);
    REQUIRE(m4k.weight_bytes == 0, "weight bytes %zu without tensors", m4k.weight_bytes);
    REQUIRE(m4k.kv_bytes_per_token == 10 * 2 * 2 * 256 * 2 + 4, "KV bytes per token %zu", m4k.kv_bytes_per_token);
    const size_t conv = 2 * 3 * (size_t)(2 * 16 * 128 + 32 * 128) * 4, rec = 32 * 128 * 128 * 4;
    REQUIRE(m4k.state_bytes >= 30 * (conv + rec) && m4k.state_bytes < 30 * (conv + rec) + 65536,
            "state bytes %zu (conv + recurrent of 30 layers: %zu)", m4k.state_bytes, 30 * (conv + rec));
    const double per_token = (double)(m4k.scratch_bytes - m2k.scratch_bytes) / 2048;
    printf("prefill scratch: %.1f MiB at chunk 4096, %.1f MiB at 2048 (%.0f bytes per token; a vocabulary row "
           "is %d)\n", m4k.scratch_bytes / 1048576.0, m2k.scratch_bytes / 1048576.0, per_token, cfg.vocab_size * 4);
    REQUIRE(per_token < cfg.vocab_size * 4.0, "scratch grows by %.0f bytes per chunk token", per_token);
    REQUIRE(m4k.scratch_bytes < ((size_t)3 << 29), "scratch at chunk 4096: %zu bytes", m4k.scratch_bytes);
    /* a debug hook sees all rows at once: the whole chunk's logits are kept */
    o.max_chunk = 4096;
    o.debug_hook = (lily_debug_hook)1;
    REQUIRE(ops->memory_needs(&cfg, &w, &o, &mx, &err) == LILY_OK, "memory_needs: %s", err.message);
    REQUIRE(mx.scratch_bytes >= m4k.scratch_bytes + (size_t)(4096 - 128) * cfg.vocab_size * 4,
            "with a debug hook: %zu bytes", mx.scratch_bytes);
    o.device = 1 << 20;
    REQUIRE(ops->memory_needs(&cfg, &w, &o, &mx, &err) == LILY_ERR_INVALID_ARGUMENT, "device out of range accepted");
}

int main(void)
{
    if (cuda_test_no_device())
        return 77;
    run();
    printf("%s\n", g_fail ? "FAILED" : "all passed");
    return g_fail ? 1 : 0;
}
