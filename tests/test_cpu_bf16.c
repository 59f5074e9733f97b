/* The CPU's bf16 attention (cpu_attention_forward_bf16 / _backward_bf16, the reference of
 * the GPU's tensor-core kernels) against a naive double-precision attention that rounds
 * at the same points, and against the fp32 attention.
 *
 * Bounds, as max |x - ref| / max |ref| over the tensor:
 *  - naive rounding reference: 4e-3. Both round the same quantities, but each computes
 *    them with its own arithmetic (fp32 sums here, double there), so an element lying
 *    within that difference of a bf16 rounding boundary rounds the other way and moves
 *    by one bf16 step, 2^-8 relative; one such term can dominate an output element: 2^-8
 *    = 3.9e-3 at worst. Flips are rare: the two arithmetics differ by ~2^-24 relative, so
 *    about 2^-24 / 2^-8 = 1.5e-5 of the rounded values flip, and the mean error stays
 *    near 1.5e-5 * 3.9e-3 = 6e-8 of the max; the bound on it is 1e-6. Rounding at another
 *    point (the normalised probabilities instead of the unnormalised ones, planted once)
 *    moved the mean to 1.4e-4.
 *  - fp32 attention: within 2e-2 (bf16 keeps 8 bits) and beyond 1e-4 (rounding happens). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/bf16.h"
#include "engine/cpu/cpu_ops.h"
#include "engine/rng.h"

static int g_failures;

static float *randn(size_t n, float std, uint64_t key) {
    float *x = malloc(n * sizeof(float)); /* [n] */
    for (size_t i = 0; i < n; i++) x[i] = std * rng_normal(key, i);
    return x;
}

/* max |got - ref| / max |ref| and the mean |got - ref| / max |ref| */
static void errors(const float *got, const double *ref, size_t n, double *max_rel, double *mean_rel) {
    double mr = 0, me = 0, se = 0;
    for (size_t i = 0; i < n; i++) {
        mr = fmax(mr, fabs(ref[i]));
        double e = fabs((double)got[i] - ref[i]);
        me = fmax(me, e);
        se += e;
    }
    *max_rel = mr > 0 ? me / mr : me;
    *mean_rel = mr > 0 ? se / (double)n / mr : se / (double)n;
}

static void expect(const char *what, int ok, double v) {
    printf("%s %-44s %.3g\n", ok ? "ok  " : "FAIL", what, v);
    if (!ok) g_failures++;
}

static double r16(double x) { return (double)bf16_round((float)x); }

/* Naive attention of one (b, h) in double, rounding where the kernels round. y[T,hs] out;
 * with dy: dq, dk, dv [T,hs] too. q, k, v, dy: [T, ld] views. */
static void naive(const float *q, const float *k, const float *v, const float *dy, size_t ld,
                  size_t yld, int T, int hs, double *y, double *dq, double *dk, double *dv) {
    double scale = 1.0 / sqrt((double)hs);
    double *p = calloc((size_t)T * T, sizeof(double)), *pe = calloc((size_t)T * T, sizeof(double));
    for (int t = 0; t < T; t++) {
        double m = -INFINITY, l = 0;
        for (int u = 0; u <= t; u++) {
            double s = 0;
            for (int d = 0; d < hs; d++) s += r16(q[t * ld + d]) * r16(k[u * ld + d]);
            p[t * T + u] = s * scale;
            m = fmax(m, s * scale);
        }
        for (int u = 0; u <= t; u++) pe[t * T + u] = exp(p[t * T + u] - m), l += pe[t * T + u];
        for (int d = 0; d < hs; d++) {
            double o = 0;
            for (int u = 0; u <= t; u++) o += r16(pe[t * T + u]) * r16(v[u * ld + d]);
            y[t * hs + d] = o / l;
        }
        for (int u = 0; u <= t; u++) p[t * T + u] = pe[t * T + u] / l;
    }
    if (dy) {
        memset(dq, 0, sizeof(double) * T * hs), memset(dk, 0, sizeof(double) * T * hs);
        memset(dv, 0, sizeof(double) * T * hs);
        for (int t = 0; t < T; t++) {
            double D = 0;
            for (int d = 0; d < hs; d++) D += r16(dy[t * yld + d]) * y[t * hs + d];
            for (int u = 0; u <= t; u++) {
                double dp = 0;
                for (int d = 0; d < hs; d++) dp += r16(dy[t * yld + d]) * r16(v[u * ld + d]);
                double ds = r16(p[t * T + u] * (dp - D));
                for (int d = 0; d < hs; d++) {
                    dv[u * hs + d] += r16(p[t * T + u]) * r16(dy[t * yld + d]);
                    dq[t * hs + d] += scale * ds * r16(k[u * ld + d]);
                    dk[u * hs + d] += scale * ds * r16(q[t * ld + d]);
                }
            }
        }
    }
    free(p), free(pe);
}

static void run(int B, int T, int C, int NH) {
    int hs = C / NH;
    size_t nqkv = (size_t)B * T * 3 * C, ny = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
    float *qkv = randn(nqkv, 1.0f, 70), *dy = randn(ny, 1.0f, 71);
    float *y16 = malloc(ny * sizeof(float)), *y32 = malloc(ny * sizeof(float));     /* [B,T,C] */
    float *att = malloc(natt * sizeof(float)), *datt = malloc(natt * sizeof(float)); /* [B,NH,T,T] */
    float *d16 = malloc(nqkv * sizeof(float)), *d32 = malloc(nqkv * sizeof(float));  /* [B,T,3C] */
    cpu_attention_forward(y32, att, qkv, B, T, C, NH, NULL);
    cpu_attention_backward(d32, datt, dy, y32, qkv, att, B, T, C, NH, NULL);
    cpu_attention_forward_bf16(y16, att, qkv, B, T, C, NH);
    cpu_attention_backward_bf16(d16, datt, dy, y16, qkv, att, B, T, C, NH);

    /* the naive reference, laid out as the op's tensors */
    double *ry = malloc(ny * sizeof(double)), *rd = malloc(nqkv * sizeof(double));
    double *y1 = malloc((size_t)T * hs * sizeof(double)), *g = malloc((size_t)3 * T * hs * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
            naive(q, q + C, q + 2 * C, dy + (size_t)b * T * C + (size_t)h * hs, 3 * (size_t)C, C, T,
                  hs, y1, g, g + (size_t)T * hs, g + (size_t)2 * T * hs);
            for (int t = 0; t < T; t++)
                for (int d = 0; d < hs; d++) {
                    ry[((size_t)b * T + t) * C + (size_t)h * hs + d] = y1[t * hs + d];
                    for (int part = 0; part < 3; part++)
                        rd[((size_t)b * T + t) * 3 * C + (size_t)part * C + (size_t)h * hs + d] =
                            g[(size_t)part * T * hs + (size_t)t * hs + d];
                }
        }
    double mx, mean;
    char what[96];
    errors(y16, ry, ny, &mx, &mean);
    snprintf(what, sizeof what, "forward T=%d hs=%d vs naive, max", T, hs);
    expect(what, mx <= 4e-3, mx);
    snprintf(what, sizeof what, "forward T=%d hs=%d vs naive, mean", T, hs);
    expect(what, mean <= 1e-6, mean);
    errors(d16, rd, nqkv, &mx, &mean);
    snprintf(what, sizeof what, "backward T=%d hs=%d vs naive, max", T, hs);
    expect(what, mx <= 4e-3, mx);
    snprintf(what, sizeof what, "backward T=%d hs=%d vs naive, mean", T, hs);
    expect(what, mean <= 1e-6, mean);

    double *e32 = malloc(nqkv * sizeof(double));
    for (size_t i = 0; i < ny; i++) e32[i] = y32[i];
    errors(y16, e32, ny, &mx, &mean);
    snprintf(what, sizeof what, "forward T=%d hs=%d vs fp32 (rounded, close)", T, hs);
    expect(what, mx > 1e-4 && mx <= 2e-2, mx);
    for (size_t i = 0; i < nqkv; i++) e32[i] = d32[i];
    errors(d16, e32, nqkv, &mx, &mean);
    snprintf(what, sizeof what, "backward T=%d hs=%d vs fp32 (rounded, close)", T, hs);
    expect(what, mx > 1e-4 && mx <= 2e-2, mx);
    free(qkv), free(dy), free(y16), free(y32), free(att), free(datt), free(d16), free(d32);
    free(ry), free(rd), free(y1), free(g), free(e32);
}

int main(void) {
    if (!cpu_backend()) return 1; /* loads OpenBLAS */
    run(2, 37, 64, 4);   /* hs 16, a tail past any tile */
    run(1, 130, 128, 2); /* hs 64 */
    if (g_failures) {
        printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    printf("the CPU's bf16 attention rounds where the kernels do\n");
    return 0;
}
