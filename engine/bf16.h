/* bfloat16 rounding on the host: the CPU reference of precision = bf16 rounds exactly
 * where the GPU converts, so that the CPU stays the reference in bf16 too. */
#ifndef GPTC_BF16_H
#define GPTC_BF16_H

#include <stdint.h>
#include <string.h>

/* x rounded to the nearest bfloat16 (ties to even), returned as the float it equals:
 * the top 16 bits of the float, the low 16 bits cleared. NaN stays NaN (the carry could
 * otherwise turn a NaN whose payload sits in the low bits into infinity); a finite value
 * past the largest bf16 rounds to infinity, as a conversion on the GPU does. */
static inline float bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x;
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

#endif
