/* bfloat16 rounding, one definition for the CPU reference, the CUDA kernels (through
 * engine/cuda/mma.cuh) and the tests, so that every side rounds exactly as the others do.
 * Plain C; under nvcc the functions are also device functions. */
#ifndef GPTC_BF16_H
#define GPTC_BF16_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define BF16_FN static __host__ __device__ __forceinline__
#else
#define BF16_FN static inline
#endif

/* The bf16 bit pattern nearest to x, ties to even (what cvt.rn.bf16.f32 does): add half
 * an ulp of bf16 minus one, plus the kept lowest bit, and truncate, so a carry out of the
 * mantissa rounds up the exponent (up to infinity, as it should). A NaN is kept a quiet
 * NaN of the same sign: the add could carry its payload into an infinity. */
BF16_FN uint16_t bf16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* The float that bf16 bit pattern h stands for (exact: bf16 is a float's upper half). */
BF16_FN float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* x rounded to the nearest bf16, as a float */
BF16_FN float bf16_round(float x) { return bf16_to_float(bf16_bits(x)); }

/* Two bf16 in one 32-bit word, lo in the low half: the element order of the .bf16x2
 * operands of mma (the lower column or row index in the low half). */
BF16_FN uint32_t bf16x2_bits(float lo, float hi) {
    return (uint32_t)bf16_bits(lo) | ((uint32_t)bf16_bits(hi) << 16);
}

#endif
