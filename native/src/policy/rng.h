/* rng.h - internal: the seeded generator behind sampling and random residual choices
 * (xorshift64*): the same seed gives the same stream on every machine. */
#ifndef RM_RNG_H
#define RM_RNG_H

#include <stdint.h>

static inline uint64_t rm_rng_seed(uint64_t seed) {
    const uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL;
    return s ? s : 1;   /* the state must never be 0 */
}

/* A uniform double in [0, 1). */
static inline double rm_rng_unit(uint64_t * state) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return (double) ((x * 0x2545F4914F6CDD1DULL) >> 11) * (1.0 / 9007199254740992.0);
}

#endif
