/* philox.h — the counter-based random numbers of a sampled draw, shared by host C and device CUDA.
 *
 * Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011):
 * ten rounds of two 32x32->64-bit multiplies and a Weyl-sequence key schedule map a 128-bit counter and a
 * 64-bit key to 128 random bits. No state: the numbers for (seed, draw, token) are a pure function of
 * them, so the host sampler (runtime/sampler.c) and the CUDA sampler compute the same values in any order
 * and on any thread.
 *
 * A draw uses them as Gumbel-max (Gumbel 1954; e.g. Maddison, Tarlow, Minka 2014): with z_i the scaled
 * logits of the candidate set, argmax_i (z_i + g_i), g_i = -log(-log(u_i)) for independent uniform u_i,
 * is distributed as softmax(z) over the set; the choice needs no sum, sort or scan, only an argmax.
 * Everything here is plain integer arithmetic and one double log pair, header-only, usable from both
 * compilers.
 */
#ifndef LILY_PHILOX_H
#define LILY_PHILOX_H

#include <stdint.h>

#if defined(__CUDACC__)
#define LILY_HOST_DEVICE __host__ __device__ __forceinline__
#else
#include <math.h>
#define LILY_HOST_DEVICE static inline
#endif

typedef struct {
    uint32_t v[4];
} lily_philox_block;

/* hi:lo of a * b (32 x 32 -> 64 bits). */
LILY_HOST_DEVICE uint32_t lily_philox_mulhilo(uint32_t a, uint32_t b, uint32_t *hi)
{
    const uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

/* Philox4x32-10 of counter ctr[4] under key (k0, k1): 128 random bits. The round constants are the
 * published ones (M0 = 0xD2511F53, M1 = 0xCD9E8D57, W0 = 0x9E3779B9, W1 = 0xBB67AE85). */
LILY_HOST_DEVICE lily_philox_block lily_philox4x32_10(lily_philox_block ctr, uint32_t k0, uint32_t k1)
{
    for (int round = 0; round < 10; round++) {
        uint32_t hi0, hi1;
        const uint32_t lo0 = lily_philox_mulhilo(0xD2511F53u, ctr.v[0], &hi0);
        const uint32_t lo1 = lily_philox_mulhilo(0xCD9E8D57u, ctr.v[2], &hi1);
        lily_philox_block next;
        next.v[0] = hi1 ^ ctr.v[1] ^ k0;
        next.v[1] = lo1;
        next.v[2] = hi0 ^ ctr.v[3] ^ k1;
        next.v[3] = lo0;
        ctr = next;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return ctr;
}

/* The Philox block that holds the random word of token `token` in draw `draw` under `seed`: counter
 * (draw low, draw high, token / 4, 0), key (seed low, seed high); each block serves four consecutive
 * tokens (word token % 4), so a pass over the vocabulary in id order needs one block per four tokens. */
LILY_HOST_DEVICE lily_philox_block lily_philox_draw_block(uint64_t seed, uint64_t draw, uint32_t token)
{
    lily_philox_block c;
    c.v[0] = (uint32_t)draw;
    c.v[1] = (uint32_t)(draw >> 32);
    c.v[2] = token >> 2;
    c.v[3] = 0u;
    return lily_philox4x32_10(c, (uint32_t)seed, (uint32_t)(seed >> 32));
}

/* Token `token`'s uniform in (0, 1) from its block: (word + 1/2) / 2^32, never 0 or 1. */
LILY_HOST_DEVICE double lily_philox_token_uniform(lily_philox_block b, uint32_t token)
{
    return ((double)b.v[token & 3u] + 0.5) * (1.0 / 4294967296.0);
}

LILY_HOST_DEVICE double lily_philox_uniform(uint64_t seed, uint64_t draw, uint32_t token)
{
    return lily_philox_token_uniform(lily_philox_draw_block(seed, draw, token), token);
}

/* The Gumbel noise -log(-log(u)) of a uniform u in (0, 1). */
LILY_HOST_DEVICE double lily_gumbel_of_uniform(double u) { return -log(-log(u)); }

/* The Gumbel noise that token `token` adds to its scaled logit in draw `draw`: the token with the largest
 * z + noise among the candidates is the draw. In (-3.2, 22.9) (u has 32 random bits: a token more than 22
 * nats below the likeliest, probability < 1e-9 of it, is never drawn). */
LILY_HOST_DEVICE double lily_gumbel_noise(uint64_t seed, uint64_t draw, uint32_t token)
{
    return lily_gumbel_of_uniform(lily_philox_uniform(seed, draw, token));
}

#undef LILY_HOST_DEVICE
#endif
