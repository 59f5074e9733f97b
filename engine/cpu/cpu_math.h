/* exp and tanh that the compiler can vectorize. glibc's expf/tanhf are scalar calls
 * unless -ffast-math is on, which we keep off for reproducible IEEE arithmetic; these are
 * branch-free (selects only), so loops over them become AVX-512 code. Accuracy: expf
 * within 2 ulp on [-87, 88] (Cephes polynomial), tanh within 2e-7 absolute. */
#ifndef GPTC_CPU_MATH_H
#define GPTC_CPU_MATH_H

#include <stdint.h>

static inline float cpu_expf(float x) {
    /* a NaN input must come out NaN without passing through the integer conversion below
     * (which would be undefined): compute on 0 instead and select at the end */
    int nan = x != x;
    float y = nan ? 0.0f : x;
    y = y < -87.3f ? -87.3f : y;  /* below this exp underflows to 0 anyway */
    y = y > 88.3f ? 88.3f : y;
    /* round to nearest by the 1.5 * 2^23 trick: vectorizes where roundevenf does not */
    float n = (y * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* y / ln2 */
    float r = y - n * 0.693359375f;                                     /* ln2 in two parts */
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { uint32_t i; float f; } scale = {(uint32_t)((int32_t)n + 127) << 23}; /* 2^n */
    float e = x <= -87.3f ? 0.0f : p * scale.f;
    return nan ? x : e;
}

static inline float cpu_tanhf(float x) {
    float a = x < 0 ? -x : x;
    float t = 1.0f - 2.0f / (cpu_expf(2.0f * a) + 1.0f);
    return x < 0 ? -t : t;
}

#endif
