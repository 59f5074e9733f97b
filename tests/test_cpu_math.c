/* Accuracy of the vectorizable exp and tanh against libm in double precision, and bf16
 * rounding (engine/bf16.h) against a rounding done another way. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/bf16.h"
#include "engine/cpu/cpu_math.h"

static float from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
static uint32_t bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* x rounded to bf16 by distance: of the two bf16 values around x (cut toward zero, and
 * one bf16 step away from zero) the nearer, on a tie the one with an even last bit. */
static float bf16_by_distance(float x) {
    if (isnan(x) || isinf(x)) return x;
    float lo = from_bits(bits(x) & 0xffff0000u);
    /* one bf16 step (2^-7 of the binade; subnormals: 2^-133), in double so that the step
     * past the largest bf16 is 2^128 rather than infinity */
    uint32_t e = bits(lo) & 0x7f800000u;
    double step = e ? (double)from_bits(e) * 0x1p-7 : 0x1p-133;
    double hi = (double)fabsf(lo) + step;
    double dlo = fabs((double)x) - fabs((double)lo), dhi = hi - fabs((double)x);
    int up = dhi < dlo || (dhi == dlo && (bits(lo) & 0x10000u));
    if (!up) return lo;
    return copysignf(hi >= 0x1p128 ? INFINITY : (float)hi, x);
}

static int check_bf16(void) {
    int bad = 0;
    uint32_t u = 0x12345678u;
    for (int i = 0; i < 2000000; i++) {
        u = u * 1664525u + 1013904223u; /* every exponent and sign, finite ones compared */
        float x = from_bits(u);
        if (isnan(x) || isinf(x)) continue;
        float want = bf16_by_distance(x), got = bf16_round(x);
        if (bits(got) != bits(want)) {
            if (bad++ < 5) printf("bf16_round(%a) = %a, expected %a\n", (double)x, (double)got, (double)want);
        }
    }
    struct { float x, want; } cases[] = {
        {1.0f + 0x1p-8f, 1.0f},                      /* tie: down to the even 1.0 */
        {1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-6f},        /* tie: up to the even neighbour */
        {1.0f + 0x1p-8f + 0x1p-20f, 1.0f + 0x1p-7f}, /* just past the tie */
        {-1.0f - 0x1p-8f, -1.0f},
        {FLT_MAX, INFINITY},                          /* past the largest bf16 */
        {-0.0f, -0.0f},
        {0x1p-149f, 0.0f},                            /* the smallest subnormal */
        {0x1.fffffep+0f, 2.0f},                       /* a carry into the exponent */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float got = bf16_round(cases[i].x);
        if (bits(got) != bits(cases[i].want)) {
            printf("bf16_round(%a) = %a, expected %a\n", (double)cases[i].x, (double)got, (double)cases[i].want);
            bad++;
        }
    }
    /* a NaN stays a NaN of its sign, also one whose payload lies in the low half only */
    if (!isnan(bf16_round(NAN)) || !isnan(bf16_round(from_bits(0x7f800001u))) ||
        !(bits(bf16_round(from_bits(0xff800001u))) >> 31) || bits(bf16_round(NAN)) >> 31 ||
        bf16_round(INFINITY) != INFINITY || bf16_round(-INFINITY) != -INFINITY) {
        printf("bf16_round of NaN or infinity is wrong\n");
        bad++;
    }
    printf("bf16_round: %d mismatch(es)\n", bad);
    return bad == 0;
}

int main(void) {
    double worst_exp = 0, worst_tanh = 0;
    float at_exp = 0, at_tanh = 0;
    for (float x = -87.0f; x <= 88.0f; x += 0.000731f) {
        double rel = fabs(cpu_expf(x) - exp((double)x)) / exp((double)x);
        if (rel > worst_exp) { worst_exp = rel; at_exp = x; }
    }
    for (float x = -20.0f; x <= 20.0f; x += 0.0001371f) {
        double abs_err = fabs(cpu_tanhf(x) - tanh((double)x));
        if (abs_err > worst_tanh) { worst_tanh = abs_err; at_tanh = x; }
    }
    int ok = worst_exp < 3e-7 && worst_tanh < 3e-7 && cpu_expf(-100.0f) == 0.0f &&
             cpu_expf(0.0f) == 1.0f && cpu_tanhf(0.0f) == 0.0f && isnan(cpu_expf(NAN)) &&
             isnan(cpu_tanhf(NAN)) && cpu_expf(INFINITY) > 1e38f && cpu_expf(-INFINITY) == 0.0f;
    printf("exp: worst relative error %.3g at %g; tanh: worst absolute error %.3g at %g\n",
           worst_exp, at_exp, worst_tanh, at_tanh);
    ok = check_bf16() && ok;
    printf("%s\n", ok ? "PASSED" : "FAILED");
    return ok ? 0 : 1;
}
