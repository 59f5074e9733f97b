/* The reference of the bf16 attention kernels (attention_bf16_fwd.cu, _bwd.cu) for
 * test_cuda_ops (on a GPU and on the emulator): exact causal attention, in double, of the
 * inputs as the kernels see them (q, k, v and dout rounded to bf16), so that what remains
 * between a kernel and this is only the rounding the kernel does inside (P and dS to bf16,
 * fp32 sums), which the test's tolerances are derived from. Every output is overwritten. */
#ifndef GPTC_TEST_ATTENTION_BF16_REF_H
#define GPTC_TEST_ATTENTION_BF16_REF_H

#include "engine/bf16.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* out[B,T,C], lse[B,NH,T] (base 2: log2 of the row's sum of exp(scale q.k), as the kernels
 * keep it); with dout (else NULL) also dqkv[B,T,3C] */
static void attention_bf16_ref(float *out, float *lse, float *dqkv, const float *qkv,
                               const float *dout, int B, int T, int C, int NH) {
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    size_t n = (size_t)T * hs;
    double *q = malloc(n * sizeof(double)), *k = malloc(n * sizeof(double));   /* [T][hs] */
    double *v = malloc(n * sizeof(double)), *o = malloc(n * sizeof(double));   /* [T][hs] */
    double *dO = malloc(n * sizeof(double)), *dq = malloc(n * sizeof(double)); /* [T][hs] */
    double *dk = malloc(n * sizeof(double)), *dv = malloc(n * sizeof(double)); /* [T][hs] */
    double *p = malloc((size_t)T * sizeof(double));                            /* [T] */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++)
                for (int i = 0; i < hs; i++) {
                    const float *row = qkv + ((size_t)b * T + t) * 3 * C + (size_t)h * hs + i;
                    q[t * hs + i] = bf16_round(row[0]);
                    k[t * hs + i] = bf16_round(row[C]);
                    v[t * hs + i] = bf16_round(row[2 * C]);
                    size_t y = ((size_t)b * T + t) * C + (size_t)h * hs + i;
                    dO[t * hs + i] = dout ? bf16_round(dout[y]) : 0;
                }
            memset(dq, 0, n * sizeof(double));
            memset(dk, 0, n * sizeof(double));
            memset(dv, 0, n * sizeof(double));
            for (int t = 0; t < T; t++) {
                double mx = -INFINITY, sum = 0;
                for (int u = 0; u <= t; u++) {
                    double s = 0;
                    for (int i = 0; i < hs; i++) s += q[t * hs + i] * k[u * hs + i];
                    p[u] = s * scale;
                    if (p[u] > mx) mx = p[u];
                }
                for (int u = 0; u <= t; u++) sum += p[u] = exp(p[u] - mx);
                for (int i = 0; i < hs; i++) o[t * hs + i] = 0;
                for (int u = 0; u <= t; u++) {
                    p[u] /= sum;
                    for (int i = 0; i < hs; i++) o[t * hs + i] += p[u] * v[u * hs + i];
                }
                lse[((size_t)b * NH + h) * T + t] = (float)((mx + log(sum)) / log(2.0));
                for (int i = 0; i < hs; i++)
                    out[((size_t)b * T + t) * C + h * hs + i] = (float)o[t * hs + i];
                if (!dout) continue;
                double D = 0;
                for (int i = 0; i < hs; i++) D += dO[t * hs + i] * o[t * hs + i];
                for (int u = 0; u <= t; u++) {
                    double dp = 0;
                    for (int i = 0; i < hs; i++) dp += dO[t * hs + i] * v[u * hs + i];
                    double ds = p[u] * (dp - D) * scale;
                    for (int i = 0; i < hs; i++) {
                        dq[t * hs + i] += ds * k[u * hs + i];
                        dk[u * hs + i] += ds * q[t * hs + i];
                        dv[u * hs + i] += p[u] * dO[t * hs + i];
                    }
                }
            }
            if (!dout) continue;
            for (int t = 0; t < T; t++)
                for (int i = 0; i < hs; i++) {
                    float *row = dqkv + ((size_t)b * T + t) * 3 * C + (size_t)h * hs + i;
                    row[0] = (float)dq[t * hs + i];
                    row[C] = (float)dk[t * hs + i];
                    row[2 * C] = (float)dv[t * hs + i];
                }
        }
    free(q), free(k), free(v), free(o), free(dO), free(dq), free(dk), free(dv), free(p);
}

/* part (0 q, 1 k, 2 v) of x[B*T][3C] into dst[B*T][C], to compare each on its own scale */
static void qkv_part(float *dst, const float *x, size_t rows, int C, int part) {
    for (size_t r = 0; r < rows; r++)
        memcpy(dst + r * C, x + r * 3 * C + (size_t)part * C, C * sizeof(float));
}

#endif
