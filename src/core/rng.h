/*
 * rng - a small, fast, seedable generator (xoshiro256**, seeded through splitmix64) with
 * uniform and normal draws. The same seed gives the same stream on every machine.
 */
#ifndef WELD_CORE_RNG_H
#define WELD_CORE_RNG_H

#include <stdint.h>

struct rng {
    uint64_t s[4];
    int has_spare;
    double spare;
};

void rng_seed(struct rng *r, uint64_t seed);
uint64_t rng_u64(struct rng *r);
double rng_uniform(struct rng *r);            /* [0, 1) with 53 random bits */
double rng_normal(struct rng *r);             /* N(0, 1), Box-Muller */

#endif
