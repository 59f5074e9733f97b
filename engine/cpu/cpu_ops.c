/* CPU reference ops. Matrix products go to OpenBLAS; everything else is a loop over
 * rows split across OpenMP threads with a static schedule, so results are bitwise
 * reproducible for a fixed thread count (exact resume depends on that).
 * Each op is written once, in fp32 (the f32_* kernels); the cpu_* entries at the end of
 * the file run them on activation-type buffers of either precision. */
#include "engine/cpu/cpu_ops.h"
#include "engine/cpu/cpu_blas.h"
#include "engine/cpu/cpu_math.h"
#include "engine/bf16.h"
#include "engine/log.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_THREADS = 256 };

static gptc_precision g_precision = GPTC_FP32;

void cpu_set_precision(gptc_precision p) { g_precision = p; }
gptc_precision cpu_get_precision(void) { return g_precision; }

/* n floats of scratch for the bf16 ops (not zeroed); out of memory ends the run */
static float *scratch_floats(size_t n) {
    return log_realloc(NULL, n * sizeof(float), "bf16 scratch");
}

/* ------------------------------------------------------------------ embedding */

static void f32_embedding_forward(float *out /* [N,C] */, const int32_t *tokens /* [N] */,
                                  const float *wte /* [v_local,C] */,
                                  const float *wpe /* [T,C] or NULL */, int N, int T, int C,
                                  int v_start, int v_local) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        int row = tokens[n] - v_start; /* this rank's row of wte, if it holds the token */
        const float *te = row >= 0 && row < v_local ? wte + (size_t)row * C : NULL;
        const float *pe = wpe ? wpe + (size_t)(n % T) * C : NULL;
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = (te ? te[c] : 0.0f) + (pe ? pe[c] : 0.0f);
    }
}

static void f32_embedding_backward(float *dwte /* [v_local,C] */, float *dwpe /* [T,C] or NULL */,
                                   const float *dout /* [N,C] */, const int32_t *tokens /* [N] */,
                                   int N, int T, int C, int v_start, int v_local) {
    /* Rows of dwte collide when a token repeats, so threads split the columns instead:
     * each thread owns a column band of every row and walks the tokens in order. */
    #pragma omp parallel
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((long)C * id / nt), c1 = (int)((long)C * (id + 1) / nt);
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * C;
            int row = tokens[n] - v_start;
            if (row >= 0 && row < v_local) {
                float *te = dwte + (size_t)row * C;
                for (int c = c0; c < c1; c++) te[c] += d[c];
            }
            if (dwpe) {
                float *pe = dwpe + (size_t)(n % T) * C;
                for (int c = c0; c < c1; c++) pe[c] += d[c];
            }
        }
    }
}

/* ------------------------------------------------------------------ layernorm */

static void f32_layernorm_forward(float *out /* [N,C] */, float *mean /* [N] */,
                                  float *rstd /* [N] */, const float *inp /* [N,C] */,
                                  const float *w /* [C] */, const float *b /* [C] */, int N,
                                  int C) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float sum = 0.0f;
        for (int c = 0; c < C; c++) sum += x[c];
        float m = sum / C;
        float var = 0.0f;
        for (int c = 0; c < C; c++) {
            float d = x[c] - m;
            var += d * d;
        }
        float r = 1.0f / sqrtf(var / C + 1e-5f);
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r * w[c] + b[c];
        mean[n] = m;
        rstd[n] = r;
    }
}

static void f32_layernorm_backward(float *dinp /* [N,C] */, float *dw /* [C] */,
                                   float *db /* [C] */, const float *dout /* [N,C] */,
                                   const float *inp /* [N,C] */, const float *w /* [C] */,
                                   const float *mean /* [N] */, const float *rstd /* [N] */, int N,
                                   int C) {
    int nt_max = omp_get_max_threads();
    /* partial[thread][2][C]: per-thread dw and db, summed in thread order below */
    float *partial = log_calloc((size_t)nt_max * 2 * C, sizeof(float),
                                "layernorm_backward's partial sums");
    int nt_used = 1;
    #pragma omp parallel
    {
        int id = omp_get_thread_num();
        #pragma omp single
        nt_used = omp_get_num_threads();
        float *pdw = partial + (size_t)id * 2 * C, *pdb = pdw + C;
        #pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
            float *dx = dinp + (size_t)n * C;
            float m = mean[n], r = rstd[n];
            float mean_dn = 0.0f, mean_dn_xhat = 0.0f;
            for (int c = 0; c < C; c++) {
                float xhat = (x[c] - m) * r, dn = w[c] * d[c];
                mean_dn += dn;
                mean_dn_xhat += dn * xhat;
                pdw[c] += d[c] * xhat;
                pdb[c] += d[c];
            }
            mean_dn /= C;
            mean_dn_xhat /= C;
            for (int c = 0; c < C; c++) {
                float xhat = (x[c] - m) * r;
                dx[c] += (w[c] * d[c] - mean_dn - xhat * mean_dn_xhat) * r;
            }
        }
    }
    for (int t = 0; t < nt_used; t++) {
        const float *pdw = partial + (size_t)t * 2 * C, *pdb = pdw + C;
        for (int c = 0; c < C; c++) {
            dw[c] += pdw[c];
            db[c] += pdb[c];
        }
    }
    free(partial);
}

/* ------------------------------------------------------------------ matmul */

static void f32_matmul_forward(float *out /* [N,OC] */, const float *inp /* [N,IC] */,
                               const float *w /* [IC,OC], or [OC,IC] when w_rows_out */,
                               const float *bias /* [OC] or NULL */, int N, int IC, int OC,
                               int w_rows_out) {
    float beta = 0.0f;
    if (bias) {
        #pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, sizeof(float) * OC);
        beta = 1.0f;
    }
    cpu_sgemm(CblasNoTrans, w_rows_out ? CblasTrans : CblasNoTrans,
                N, OC, IC, 1.0f, inp, IC, w, w_rows_out ? IC : OC, beta, out, OC);
}

/* dbias[OC] += the column sums of dout[N,OC]; each thread sums its own band of columns over
 * all rows, in row order */
static void f32_column_sums(float *dbias, const float *dout, int N, int OC) {
    #pragma omp parallel
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((long)OC * id / nt), c1 = (int)((long)OC * (id + 1) / nt);
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * OC;
            for (int c = c0; c < c1; c++) dbias[c] += d[c];
        }
    }
}

static void f32_matmul_backward(float *dinp /* [N,IC] or NULL */,
                                float *dw /* [IC,OC], or [OC,IC] when w_rows_out; or NULL */,
                                float *dbias /* [OC] or NULL */, const float *dout /* [N,OC] */,
                                const float *inp /* [N,IC]; only read for dw */,
                                const float *w /* [IC,OC], or [OC,IC] when w_rows_out */, int N,
                                int IC, int OC, int w_rows_out) {
    if (dinp)
        cpu_sgemm(CblasNoTrans, w_rows_out ? CblasNoTrans : CblasTrans,
                    N, IC, OC, 1.0f, dout, OC, w, w_rows_out ? IC : OC, 0.0f, dinp, IC);
    if (dw) {
        if (w_rows_out) /* dw[OC,IC] += dout^T @ inp */
            cpu_sgemm(CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dw, IC);
        else /* dw[IC,OC] += inp^T @ dout */
            cpu_sgemm(CblasTrans, CblasNoTrans, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f, dw, OC);
    }
    if (dbias) f32_column_sums(dbias, dout, N, OC);
}

static void f32_gelu_forward(float *out, const float *inp, size_t n);
static void f32_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* The fused ops are the two steps they fuse: the CPU results stay bit for bit those of
 * the unfused layer. */
static void f32_matmul_gelu_forward(float *out /* [N,OC] */, float *pre /* [N,OC] */,
                                    const float *inp /* [N,IC] */, const float *w /* [IC,OC] */,
                                    const float *bias /* [OC] or NULL */, int N, int IC, int OC) {
    f32_matmul_forward(pre, inp, w, bias, N, IC, OC, 0);
    f32_gelu_forward(out, pre, (size_t)N * OC);
}

static void f32_matmul_dgelu_backward(float *dpre /* [N,IC] */, const float *dout /* [N,OC] */,
                                      const float *w /* [IC,OC] */, const float *pre /* [N,IC] */,
                                      int N, int IC, int OC) {
    f32_matmul_backward(dpre, NULL, NULL, dout, NULL, w, N, IC, OC, 0);
    f32_gelu_backward(dpre, pre, dpre, (size_t)N * IC);
}

/* ------------------------------------------------------------------ row helpers */

/* x[i] = exp(x[i] - shift) for i < n; returns their sum. Blocks of 256 are summed in
 * float across SIMD lanes (fast) and the block sums in double, which keeps a 50k-term
 * softmax normaliser accurate without a double conversion per element (7x slower). */
static double exp_shift_sum(float *x, int n, float shift) {
    double total = 0.0;
    for (int i0 = 0; i0 < n; i0 += 256) {
        int i1 = i0 + 256 < n ? i0 + 256 : n;
        float block = 0.0f;
        #pragma omp simd reduction(+ : block)
        for (int i = i0; i < i1; i++) {
            float e = cpu_expf(x[i] - shift);
            x[i] = e;
            block += e;
        }
        total += block;
    }
    return total;
}

/* The sum of exp(x[i] - shift) for i < n, summed as exp_shift_sum does, x left as it is */
static double exp_sum(const float *x, int n, float shift) {
    double total = 0.0;
    for (int i0 = 0; i0 < n; i0 += 256) {
        int i1 = i0 + 256 < n ? i0 + 256 : n;
        float block = 0.0f;
        #pragma omp simd reduction(+ : block)
        for (int i = i0; i < i1; i++) block += cpu_expf(x[i] - shift);
        total += block;
    }
    return total;
}

static float row_max(const float *x, int n) {
    float mx = x[0];
    #pragma omp simd reduction(max : mx)
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

/* ------------------------------------------------------------------ attention */

/* Per (batch, head) the products are small GEMMs on strided views of qkv: head h of
 * row t has q at qkv[t*3C + h*hs], k at +C, v at +2C, so no packing copy is needed. */

static void f32_attention_forward(float *out /* [B,T,C] */, float *att /* [B,NH,T,T] */,
                                  const float *qkv /* [B,T,3C] */, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    /* one (batch, head) per thread: inside a parallel region the OpenMP OpenBLAS runs
     * each small GEMM on the calling thread, so there is no fork/join per product */
    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
        const float *k = q + C, *v = q + 2 * C;
        float *a = att + (size_t)bh * T * T; /* [T,T] */
        cpu_sgemm(CblasNoTrans, CblasTrans, T, T, hs, scale, q, 3 * C, k,
                    3 * C, 0.0f, a, T);
        for (int t = 0; t < T; t++) {
            float *row = a + (size_t)t * T;
            float inv = (float)(1.0 / exp_shift_sum(row, t + 1, row_max(row, t + 1)));
            for (int u = 0; u <= t; u++) row[u] *= inv;
            for (int u = t + 1; u < T; u++) row[u] = 0.0f;
        }
        cpu_sgemm(CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, 3 * C,
                    0.0f, out + (size_t)b * T * C + (size_t)h * hs, C);
    }
}

size_t cpu_attention_state_floats(int B, int T, int NH) {
    return (size_t)B * NH * T * T;
}

static void f32_attention_backward(float *dqkv /* [B,T,3C] */, float *datt /* [B,NH,T,T] scratch */,
                                   const float *dout /* [B,T,C] */, const float *out /* [B,T,C] */,
                                   const float *qkv /* [B,T,3C] */,
                                   const float *att /* [B,NH,T,T] */, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        size_t off = (size_t)b * T * 3 * C + (size_t)h * hs;
        const float *q = qkv + off, *k = q + C, *v = q + 2 * C;
        float *dq = dqkv + off, *dk = dq + C, *dv = dq + 2 * C;
        const float *a = att + (size_t)bh * T * T; /* [T,T] */
        float *da = datt + (size_t)bh * T * T;     /* [T,T] */
        const float *dy = dout + (size_t)b * T * C + (size_t)h * hs;
        /* dv = att^T @ dy ; datt = dy @ v^T */
        cpu_sgemm(CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, dy, C, 0.0f,
                    dv, 3 * C);
        cpu_sgemm(CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dy, C, v, 3 * C,
                    0.0f, da, T);
        /* softmax backward in place: dpre = att * (datt - sum(att * datt)) */
        for (int t = 0; t < T; t++) {
            const float *ar = a + (size_t)t * T;
            float *dr = da + (size_t)t * T;
            float dot = 0.0f;
            for (int u = 0; u <= t; u++) dot += ar[u] * dr[u];
            for (int u = 0; u <= t; u++) dr[u] = ar[u] * (dr[u] - dot);
            for (int u = t + 1; u < T; u++) dr[u] = 0.0f;
        }
        /* dq = scale * dpre @ k ; dk = scale * dpre^T @ q */
        cpu_sgemm(CblasNoTrans, CblasNoTrans, T, hs, T, scale, da, T, k, 3 * C,
                    0.0f, dq, 3 * C);
        cpu_sgemm(CblasTrans, CblasNoTrans, T, hs, T, scale, da, T, q, 3 * C,
                    0.0f, dk, 3 * C);
    }
}

/* precision = bf16 attention, as tensor-core flash kernels compute it (FlashAttention-2
 * with bf16 operands): q, k, v and dout rounded to bf16; scores, softmax statistics and
 * every sum in fp32; the unnormalised probabilities exp(s - max) rounded to bf16 for the
 * product with v, normalised afterwards by the sum of the unrounded ones; in the backward
 * the probabilities rounded for dv, dS rounded for dq and dk, and D = rowsum(dout * out)
 * with the rounded dout (the one dP sees, so that each row of dS still sums to ~0) and
 * the forward's output. (A GPU kernel's running maximum can differ from the row's final
 * one, so its rounded values may differ from these by one bf16 step.) */
/* dst[T,hs] = src rows rounded to bf16; src is a [T, ld] view */
static void round_rows(float *dst, const float *src, int T, int hs, size_t ld) {
    for (int t = 0; t < T; t++)
        for (int d = 0; d < hs; d++) dst[(size_t)t * hs + d] = bf16_round(src[(size_t)t * ld + d]);
}

void cpu_attention_forward_bf16(float *out, float *att, const float *qkv, int B, int T, int C,
                                int NH) {
    int hs = C / NH;
    size_t th = (size_t)T * hs, tt = (size_t)T * T;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
        float *a = att + (size_t)bh * tt; /* [T,T]: the normalised probabilities, fp32 */
        float *o = out + (size_t)b * T * C + (size_t)h * hs;
        float *buf = scratch_floats(3 * th + tt + (size_t)T);
        float *qr = buf, *kr = qr + th, *vr = kr + th; /* [T,hs] each, rounded */
        float *er = vr + th;                           /* [T,T] exp(s - max), rounded */
        float *inv = er + tt;                          /* [T] 1 / sum of the unrounded */
        round_rows(qr, q, T, hs, 3 * (size_t)C);
        round_rows(kr, q + C, T, hs, 3 * (size_t)C);
        round_rows(vr, q + 2 * C, T, hs, 3 * (size_t)C);
        cpu_sgemm(CblasNoTrans, CblasTrans, T, T, hs, scale, qr, hs, kr, hs, 0.0f, a, T);
        for (int t = 0; t < T; t++) {
            float *row = a + (size_t)t * T, *rrow = er + (size_t)t * T;
            inv[t] = (float)(1.0 / exp_shift_sum(row, t + 1, row_max(row, t + 1)));
            for (int u = 0; u <= t; u++) rrow[u] = bf16_round(row[u]), row[u] *= inv[t];
            for (int u = t + 1; u < T; u++) rrow[u] = row[u] = 0.0f;
        }
        cpu_sgemm(CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, er, T, vr, hs, 0.0f, o, C);
        for (int t = 0; t < T; t++)
            for (int d = 0; d < hs; d++) o[(size_t)t * C + d] *= inv[t];
        free(buf);
    }
}

void cpu_attention_backward_bf16(float *dqkv, float *datt, const float *dout, const float *out,
                                 const float *qkv, const float *att, int B, int T, int C, int NH) {
    int hs = C / NH;
    size_t th = (size_t)T * hs, tt = (size_t)T * T;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        size_t off = (size_t)b * T * 3 * C + (size_t)h * hs, yoff = (size_t)b * T * C + (size_t)h * hs;
        const float *q = qkv + off;
        float *dq = dqkv + off, *dk = dq + C, *dv = dq + 2 * C;
        const float *a = att + (size_t)bh * tt; /* [T,T] */
        float *da = datt + (size_t)bh * tt;     /* [T,T] */
        const float *dy = dout + yoff, *y = out + yoff;
        float *buf = scratch_floats(4 * th + tt);
        float *qr = buf, *kr = qr + th, *vr = kr + th, *dyr = vr + th; /* [T,hs] each */
        float *pr = dyr + th;                                          /* [T,T] */
        round_rows(qr, q, T, hs, 3 * (size_t)C);
        round_rows(kr, q + C, T, hs, 3 * (size_t)C);
        round_rows(vr, q + 2 * C, T, hs, 3 * (size_t)C);
        round_rows(dyr, dy, T, hs, (size_t)C);
        for (size_t i = 0; i < tt; i++) pr[i] = bf16_round(a[i]);
        /* dv = P^T @ dout ; dP = dout @ v^T */
        cpu_sgemm(CblasTrans, CblasNoTrans, T, hs, T, 1.0f, pr, T, dyr, hs, 0.0f, dv, 3 * C);
        cpu_sgemm(CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dyr, hs, vr, hs, 0.0f, da, T);
        for (int t = 0; t < T; t++) {
            const float *ar = a + (size_t)t * T;
            float *dr = da + (size_t)t * T;
            float D = 0.0f;
            for (int d = 0; d < hs; d++) D += dyr[(size_t)t * hs + d] * y[(size_t)t * C + d];
            for (int u = 0; u <= t; u++) dr[u] = bf16_round(ar[u] * (dr[u] - D));
            for (int u = t + 1; u < T; u++) dr[u] = 0.0f;
        }
        /* dq = scale * dS @ k ; dk = scale * dS^T @ q */
        cpu_sgemm(CblasNoTrans, CblasNoTrans, T, hs, T, scale, da, T, kr, hs, 0.0f, dq, 3 * C);
        cpu_sgemm(CblasTrans, CblasNoTrans, T, hs, T, scale, da, T, qr, hs, 0.0f, dk, 3 * C);
        free(buf);
    }
}

/* ------------------------------------------------------------------ elementwise */

static const float GELU_K = 0.7978845608028654f; /* sqrt(2/pi) */

static void f32_gelu_forward(float *out /* [n] */, const float *inp /* [n] */, size_t n) {
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + cpu_tanhf(GELU_K * (x + 0.044715f * x * x * x)));
    }
}

static void f32_gelu_backward(float *dinp /* [n] */, const float *inp /* [n] */,
                              const float *dout /* [n] */, size_t n) {
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float th = cpu_tanhf(GELU_K * (x + 0.044715f * x * x * x));
        float sech2 = 1.0f - th * th;
        float local = 0.5f * (1.0f + th) +
                      0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = local * dout[i];
    }
}

static void f32_add(float *out /* [n] */, const float *a /* [n] */, const float *b /* [n] */,
                    size_t n) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* ------------------------------------------------------------------ loss */

/* Vocab-parallel softmax cross-entropy, in three passes around two all-reduces over the
 * tensor-parallel group (max, then sum-exp and target logit); with one rank the
 * all-reduces vanish and this is the plain fused loss. A rank holds Vl columns of the
 * padded vocab starting at global column v_start; only the first v_valid are real. */

static void f32_vocab_max(float *mx /* [N] */, const float *logits /* [N,Vl] */, int N, int Vl,
                          int v_valid) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        mx[n] = v_valid > 0 ? row_max(logits + (size_t)n * Vl, v_valid) : -INFINITY;
}

static void f32_vocab_expsum(float *stats /* [2,N] */, const float *logits /* [N,Vl] */,
                             const float *mx /* [N] */, const int32_t *targets /* [N] */, int N,
                             int Vl, int v_valid, int v_start) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *row = logits + (size_t)n * Vl;
        int y = targets[n] - v_start;
        stats[N + n] = y >= 0 && y < v_valid ? row[y] - mx[n] : 0.0f;
        stats[n] = (float)exp_sum(row, v_valid, mx[n]);
    }
}

static void f32_vocab_ce_finish(float *losses /* [N] */, float *logits /* [N,Vl] */,
                                const float *mx /* [N] */, const float *stats /* [2,N] */,
                                const int32_t *targets /* [N] */, int N, int Vl, int v_valid,
                                int v_start, float dloss) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *row = logits + (size_t)n * Vl, shift = mx[n];
        losses[n] = logf(stats[n]) - stats[N + n];
        float scale = dloss / stats[n];
        #pragma omp simd
        for (int i = 0; i < v_valid; i++) row[i] = cpu_expf(row[i] - shift) * scale;
        int y = targets[n] - v_start;
        if (y >= 0 && y < v_valid) row[y] -= dloss;
        for (int i = v_valid < 0 ? 0 : v_valid; i < Vl; i++) row[i] = 0.0f;
    }
}

/* ------------------------------------------------------------------ optimizer */

double cpu_sum_squares(const float *x, size_t n, gptc_stream *s) {
    double partial[MAX_THREADS] = {0};
    int nt_used = 1;
    #pragma omp parallel
    {
        int id = omp_get_thread_num();
        #pragma omp single
        nt_used = omp_get_num_threads();
        double acc = 0.0;
        #pragma omp for schedule(static)
        for (size_t i = 0; i < n; i++) acc += (double)x[i] * x[i];
        if (id < MAX_THREADS) partial[id] = acc;
    }
    double total = 0.0;
    for (int t = 0; t < nt_used && t < MAX_THREADS; t++) total += partial[t];
    return total;
}

static void f32_adamw(float *p /* [n] */, const float *g /* [n] */, float gscale,
                      float *m /* [n] */, float *v /* [n] */, size_t n, float lr, float beta1,
                      float beta2, float eps, float decay, float bc1, float bc2) {
    /* PyTorch's order: decay the weight, update moments, then step by
     * (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps). */
    float step_size = lr / bc1, bc2_sqrt = sqrtf(bc2), shrink = 1.0f - lr * decay;
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gscale;
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * shrink - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    }
}

/* ------------------------------------------------------------------ the activation type */

/* Under GPTC_BF16 each op is its fp32 kernel above between two conversions: its act
 * inputs are widened to fp32 scratch (exact), the kernel runs unchanged, and each act
 * output is rounded once as it is stored (a "+=" output is widened too, so that the
 * kernel adds to its exact old value). One copy of each computation thus serves both
 * precisions, and a bf16 result is by construction the fp32 op on the same values,
 * rounded once, which is the contract (engine/backend.h) and what tests/test_cpu_bf16.c
 * checks. Under GPTC_FP32 the kernels run on the buffers themselves: nothing changes.
 * The element-wise ops' views are all [n]. */

static int bf16(void) { return g_precision == GPTC_BF16; }

/* The scratch of the conversions: one buffer per thread (ops run inline on whichever
 * thread calls them) that grows to the largest op's need and is kept, so that a training
 * step allocates nothing once the first has run. */
static _Thread_local float *g_arena; /* [g_arena_n] */
static _Thread_local size_t g_arena_n;

/* n floats of scratch (earlier contents are lost); an op takes all it needs at once */
static float *arena(size_t n) {
    if (n > g_arena_n) {
        free(g_arena);
        g_arena = scratch_floats(n);
        g_arena_n = n;
    }
    return g_arena;
}

/* The next n floats of an op's scratch region *next */
static float *take(float **next, size_t n) {
    float *p = *next;
    *next += n;
    return p;
}

/* The next n floats of *next holding bf16 src[n] widened (exact); NULL for a NULL src */
static float *unpack(float **next, const gptc_act *src, size_t n) {
    if (!src) return NULL;
    const uint16_t *h = src;
    float *x = take(next, n);
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] = bf16_to_float(h[i]);
    return x;
}

/* bf16 dst[n] = x rounded to nearest even, the one rounding of an act output */
static void pack(gptc_act *dst, const float *x, size_t n) {
    uint16_t *h = dst;
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) h[i] = bf16_bits(x[i]);
}

void cpu_to_act(gptc_act *dst, const float *src, size_t n, gptc_stream *s) {
    if (bf16())
        pack(dst, src, n);
    else if (dst != src)
        memcpy(dst, src, n * sizeof(float));
}

void cpu_embedding_forward(gptc_act *out, const int32_t *tokens, const gptc_act *wte,
                           const gptc_act *wpe, int N, int T, int C, int v_start, int v_local,
                           gptc_stream *s) {
    if (!bf16()) {
        f32_embedding_forward(out, tokens, wte, wpe, N, T, C, v_start, v_local);
        return;
    }
    size_t no = (size_t)N * C, nte = (size_t)v_local * C, npe = (size_t)T * C;
    float *next = arena(no + nte + npe);
    const float *te = unpack(&next, wte, nte) /* [v_local,C] */,
                *pe = unpack(&next, wpe, npe) /* [T,C] */;
    float *o = take(&next, no); /* [N,C] */
    f32_embedding_forward(o, tokens, te, pe, N, T, C, v_start, v_local);
    pack(out, o, no);
}

void cpu_embedding_backward(float *dwte, float *dwpe, const gptc_act *dout,
                            const int32_t *tokens, int N, int T, int C, int v_start,
                            int v_local, gptc_stream *s) {
    if (!bf16()) {
        f32_embedding_backward(dwte, dwpe, dout, tokens, N, T, C, v_start, v_local);
        return;
    }
    size_t nd = (size_t)N * C;
    float *next = arena(nd);
    const float *d = unpack(&next, dout, nd); /* [N,C] */
    f32_embedding_backward(dwte, dwpe, d, tokens, N, T, C, v_start, v_local);
}

void cpu_layernorm_forward(gptc_act *out, float *mean, float *rstd, const gptc_act *inp,
                           const gptc_act *w, const gptc_act *b, int N, int C, gptc_stream *s) {
    if (!bf16()) {
        f32_layernorm_forward(out, mean, rstd, inp, w, b, N, C);
        return;
    }
    size_t nx = (size_t)N * C;
    float *next = arena(2 * nx + 2 * (size_t)C);
    const float *x = unpack(&next, inp, nx) /* [N,C] */, *wf = unpack(&next, w, C) /* [C] */,
                *bf = unpack(&next, b, C) /* [C] */;
    float *o = take(&next, nx); /* [N,C] */
    f32_layernorm_forward(o, mean, rstd, x, wf, bf, N, C);
    pack(out, o, nx);
}

/* the reference defines the fused op as the two it fuses */
void cpu_add_layernorm_forward(gptc_act *res, gptc_act *out, float *mean, float *rstd,
                               const gptc_act *a, const gptc_act *b, const gptc_act *w,
                               const gptc_act *bias, int N, int C, gptc_stream *s) {
    cpu_add(res, a, b, (size_t)N * C, s);
    cpu_layernorm_forward(out, mean, rstd, res, w, bias, N, C, s);
}

/* dsum: the column sums f32_matmul_backward would take of dinp as its dout, the same
 * values in the same order (the bias gradient moves here, bit for bit) */
void cpu_layernorm_backward(gptc_act *dinp, float *dw, float *db, float *dsum,
                            const gptc_act *dout, const gptc_act *inp, const gptc_act *w,
                            const float *mean, const float *rstd, int N, int C,
                            gptc_stream *s) {
    if (!bf16()) {
        f32_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
        if (dsum) f32_column_sums(dsum, dinp, N, C);
        return;
    }
    size_t nx = (size_t)N * C;
    float *next = arena((dsum ? 4 : 3) * nx + (size_t)C);
    const float *d = unpack(&next, dout, nx) /* [N,C] */, *x = unpack(&next, inp, nx) /* [N,C] */;
    const float *wf = unpack(&next, w, C); /* [C] */
    float *dx = unpack(&next, dinp, nx); /* [N,C]; "+=": the kernel adds to the old value */
    f32_layernorm_backward(dx, dw, db, d, x, wf, mean, rstd, N, C);
    pack(dinp, dx, nx);
    if (dsum) f32_column_sums(dsum, unpack(&next, dinp, nx), N, C); /* as stored */
}

/* The products read the bf16 operands exactly and sum in fp32, as the GPU's do. */
void cpu_matmul_forward(gptc_act *out, const gptc_act *inp, const gptc_act *w,
                        const gptc_act *bias, int N, int IC, int OC, int w_rows_out,
                        gptc_stream *s) {
    if (!bf16()) {
        f32_matmul_forward(out, inp, w, bias, N, IC, OC, w_rows_out);
        return;
    }
    size_t nx = (size_t)N * IC, nw = (size_t)IC * OC, no = (size_t)N * OC;
    float *next = arena(nx + nw + (size_t)OC + no);
    const float *x = unpack(&next, inp, nx) /* [N,IC] */, *wf = unpack(&next, w, nw) /* [IC,OC] */;
    const float *bf = unpack(&next, bias, OC); /* [OC] */
    float *o = take(&next, no); /* [N,OC] */
    f32_matmul_forward(o, x, wf, bf, N, IC, OC, w_rows_out);
    pack(out, o, no);
}

void cpu_matmul_backward(gptc_act *dinp, float *dw, float *dbias, const gptc_act *dout,
                         const gptc_act *inp, const gptc_act *w, int N, int IC, int OC,
                         int w_rows_out, gptc_stream *s) {
    if (!bf16()) {
        f32_matmul_backward(dinp, dw, dbias, dout, inp, w, N, IC, OC, w_rows_out);
        return;
    }
    size_t nx = (size_t)N * IC, nw = (size_t)IC * OC, nd = (size_t)N * OC;
    float *next = arena(nd + nw + 2 * nx);
    const float *d = unpack(&next, dout, nd); /* [N,OC] */
    const float *wf = unpack(&next, dinp ? w : NULL, nw) /* [IC,OC] */,
                *x = unpack(&next, dw ? inp : NULL, nx) /* [N,IC] */;
    float *dx = dinp ? take(&next, nx) : NULL; /* [N,IC] */
    f32_matmul_backward(dx, dw, dbias, d, x, wf, N, IC, OC, w_rows_out);
    if (dinp) pack(dinp, dx, nx);
}

void cpu_matmul_gelu_forward(gptc_act *out, gptc_act *pre, const gptc_act *inp,
                             const gptc_act *w, const gptc_act *bias, int N, int IC, int OC,
                             gptc_stream *s) {
    if (!bf16()) {
        f32_matmul_gelu_forward(out, pre, inp, w, bias, N, IC, OC);
        return;
    }
    size_t nx = (size_t)N * IC, nw = (size_t)IC * OC, no = (size_t)N * OC;
    float *next = arena(nx + nw + (size_t)OC + 2 * no);
    const float *x = unpack(&next, inp, nx) /* [N,IC] */, *wf = unpack(&next, w, nw) /* [IC,OC] */;
    const float *bf = unpack(&next, bias, OC); /* [OC] */
    float *p = take(&next, no), *o = take(&next, no); /* [N,OC] each */
    /* the GELU reads the fp32 sum, before pre is rounded (as cuBLASLt's epilogue does) */
    f32_matmul_gelu_forward(o, p, x, wf, bf, N, IC, OC);
    pack(pre, p, no);
    pack(out, o, no);
}

void cpu_matmul_dgelu_backward(gptc_act *dpre, const gptc_act *dout, const gptc_act *w,
                               const gptc_act *pre, int N, int IC, int OC, gptc_stream *s) {
    if (!bf16()) {
        f32_matmul_dgelu_backward(dpre, dout, w, pre, N, IC, OC);
        return;
    }
    size_t nd = (size_t)N * OC, nw = (size_t)IC * OC, np = (size_t)N * IC;
    float *next = arena(nd + nw + 2 * np);
    const float *d = unpack(&next, dout, nd) /* [N,OC] */, *wf = unpack(&next, w, nw) /* [IC,OC] */;
    const float *p = unpack(&next, pre, np); /* [N,IC] */
    float *dp = take(&next, np); /* [N,IC]: the product times gelu'(pre), rounded once */
    f32_matmul_dgelu_backward(dp, d, wf, p, N, IC, OC);
    pack(dpre, dp, np);
}

/* The bf16 attention kernels round their operands again: a no-op on widened bf16. */
void cpu_attention_forward(gptc_act *out, float *att, const gptc_act *qkv, int B, int T,
                           int C, int NH, gptc_stream *s) {
    if (!bf16()) {
        f32_attention_forward(out, att, qkv, B, T, C, NH);
        return;
    }
    size_t nqkv = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
    float *next = arena(nqkv + no);
    const float *q = unpack(&next, qkv, nqkv); /* [B,T,3C] */
    float *o = take(&next, no); /* [B,T,C] */
    cpu_attention_forward_bf16(o, att, q, B, T, C, NH);
    pack(out, o, no);
}

/* dbias: the sums of dqkv as stored (rounded under bf16), as matmul_backward's bias
 * gradient reads it */
void cpu_attention_backward(gptc_act *dqkv, float *dbias, float *datt, const gptc_act *dout,
                            const gptc_act *out, const gptc_act *qkv, const float *att, int B,
                            int T, int C, int NH, gptc_stream *s) {
    if (!bf16()) {
        f32_attention_backward(dqkv, datt, dout, out, qkv, att, B, T, C, NH);
        if (dbias) f32_column_sums(dbias, dqkv, B * T, 3 * C);
        return;
    }
    size_t nqkv = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
    float *next = arena(2 * nqkv + 2 * no);
    const float *d = unpack(&next, dout, no), *o = unpack(&next, out, no); /* [B,T,C] each */
    const float *q = unpack(&next, qkv, nqkv); /* [B,T,3C] */
    float *dq = take(&next, nqkv); /* [B,T,3C] */
    cpu_attention_backward_bf16(dq, datt, d, o, q, att, B, T, C, NH);
    pack(dqkv, dq, nqkv);
    if (dbias) {
        for (size_t i = 0; i < nqkv; i++) dq[i] = bf16_round(dq[i]); /* what pack stored */
        f32_column_sums(dbias, dq, B * T, 3 * C);
    }
}

void cpu_gelu_forward(gptc_act *out, const gptc_act *inp, size_t n, gptc_stream *s) {
    if (!bf16()) {
        f32_gelu_forward(out, inp, n);
        return;
    }
    float *next = arena(2 * n);
    const float *x = unpack(&next, inp, n);
    float *o = take(&next, n);
    f32_gelu_forward(o, x, n);
    pack(out, o, n);
}

void cpu_gelu_backward(gptc_act *dinp, const gptc_act *inp, const gptc_act *dout, size_t n,
                       gptc_stream *s) {
    if (!bf16()) {
        f32_gelu_backward(dinp, inp, dout, n);
        return;
    }
    float *next = arena(3 * n);
    const float *x = unpack(&next, inp, n), *d = unpack(&next, dout, n);
    float *dx = take(&next, n);
    f32_gelu_backward(dx, x, d, n);
    pack(dinp, dx, n);
}

void cpu_add(gptc_act *out, const gptc_act *a, const gptc_act *b, size_t n, gptc_stream *s) {
    if (!bf16()) {
        f32_add(out, a, b, n);
        return;
    }
    float *next = arena(3 * n);
    const float *af = unpack(&next, a, n), *bf = unpack(&next, b, n);
    float *o = take(&next, n);
    f32_add(o, af, bf, n);
    pack(out, o, n);
}

void cpu_vocab_max(float *mx, const gptc_act *logits, int N, int Vl, int v_valid,
                   gptc_stream *s) {
    if (!bf16()) {
        f32_vocab_max(mx, logits, N, Vl, v_valid);
        return;
    }
    size_t nl = (size_t)N * Vl;
    float *next = arena(nl);
    f32_vocab_max(mx, unpack(&next, logits, nl), N, Vl, v_valid);
}

void cpu_vocab_expsum(float *stats, const gptc_act *logits, const float *mx,
                      const int32_t *targets, int N, int Vl, int v_valid, int v_start,
                      gptc_stream *s) {
    if (!bf16()) {
        f32_vocab_expsum(stats, logits, mx, targets, N, Vl, v_valid, v_start);
        return;
    }
    size_t nl = (size_t)N * Vl;
    float *next = arena(nl);
    f32_vocab_expsum(stats, unpack(&next, logits, nl), mx, targets, N, Vl, v_valid, v_start);
}

void cpu_vocab_ce_finish(float *losses, gptc_act *logits, const float *mx, const float *stats,
                         const int32_t *targets, int N, int Vl, int v_valid, int v_start,
                         float dloss, gptc_stream *s) {
    if (!bf16()) {
        f32_vocab_ce_finish(losses, logits, mx, stats, targets, N, Vl, v_valid, v_start, dloss);
        return;
    }
    size_t nl = (size_t)N * Vl;
    float *next = arena(nl);
    float *l = unpack(&next, logits, nl); /* [N,Vl] */
    f32_vocab_ce_finish(losses, l, mx, stats, targets, N, Vl, v_valid, v_start, dloss);
    pack(logits, l, nl);
}

/* the three steps on one copy of the logits (unpacked once under bf16) */
void cpu_cross_entropy(float *losses, gptc_act *logits, float *mx, float *stats,
                       const int32_t *targets, int N, int Vl, int v_valid, float dloss,
                       gptc_stream *s) {
    size_t nl = (size_t)N * Vl;
    float *next = bf16() ? arena(nl) : NULL;
    float *l = bf16() ? unpack(&next, logits, nl) : (float *)logits;
    f32_vocab_max(mx, l, N, Vl, v_valid);
    f32_vocab_expsum(stats, l, mx, targets, N, Vl, v_valid, 0);
    f32_vocab_ce_finish(losses, l, mx, stats, targets, N, Vl, v_valid, 0, dloss);
    if (bf16()) pack(logits, l, nl);
}

void cpu_adamw(const gptc_adamw_piece *pieces, int n_pieces, const gptc_adamw_step *h,
               gptc_stream *s) {
    for (int k = 0; k < n_pieces; k++) {
        const gptc_adamw_piece *q = &pieces[k];
        f32_adamw(q->p, q->g, h->gscale, q->m, q->v, q->n, h->lr, h->beta1, h->beta2, h->eps,
                  q->decay, h->bc1, h->bc2);
        if (q->p_act && q->p_act != q->p) cpu_to_act(q->p_act, q->p, q->n, s);
    }
}
