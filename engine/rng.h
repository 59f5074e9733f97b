/* Counter-based random numbers (Philox4x32-10): a draw is a pure function of (key,
 * counter), so every rank can produce its own shard of a tensor's init without drawing
 * anyone else's (DESIGN section 3). */
#ifndef GPTC_RNG_H
#define GPTC_RNG_H

#include <stdint.h>

/* The key of one named stream: mixes the run seed with the tensor's unsharded name. */
uint64_t rng_key(uint64_t seed, const char *name);
/* Four independent uniform 32-bit words for counter index. */
void rng_philox(uint64_t key, uint64_t index, uint32_t out[4]);
/* Standard normal draw for element index of the stream key (Box-Muller). */
float rng_normal(uint64_t key, uint64_t index);

#endif
