/* Accuracy of the vectorizable exp and tanh against libm in double precision. */
#include <math.h>
#include <stdio.h>

#include "engine/cpu/cpu_math.h"

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
    printf("%s\n", ok ? "PASSED" : "FAILED");
    return ok ? 0 : 1;
}
