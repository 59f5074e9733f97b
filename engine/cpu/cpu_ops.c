/* CPU reference ops. Matrix products go to OpenBLAS; everything else is a loop over
 * rows split across OpenMP threads with a static schedule, so results are bitwise
 * reproducible for a fixed thread count (exact resume depends on that). */
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

/* ------------------------------------------------------------------ embedding */

void cpu_embedding_forward(float *out, const int32_t *tokens, const float *wte,
                           const float *wpe, int N, int T, int C, int v_start, int v_local,
                           gptc_stream *s) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        int row = tokens[n] - v_start; /* this rank's row of wte, if it holds the token */
        const float *te = row >= 0 && row < v_local ? wte + (size_t)row * C : NULL;
        const float *pe = wpe ? wpe + (size_t)(n % T) * C : NULL;
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = (te ? te[c] : 0.0f) + (pe ? pe[c] : 0.0f);
    }
}

void cpu_embedding_backward(float *dwte, float *dwpe, const float *dout,
                            const int32_t *tokens, int N, int T, int C, int v_start,
                            int v_local, gptc_stream *s) {
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

void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *w, const float *b, int N, int C, gptc_stream *s) {
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

void cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, const float *mean,
                            const float *rstd, int N, int C, gptc_stream *s) {
    int nt_max = omp_get_max_threads();
    /* partial[thread][2][C]: per-thread dw and db, summed in thread order below */
    float *partial = calloc((size_t)nt_max * 2 * C, sizeof(float));
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

static gptc_precision g_precision = GPTC_FP32;

void cpu_set_precision(gptc_precision p) { g_precision = p; }

/* n floats of scratch for the bf16 ops (rounded copies); out of memory ends the run */
static float *scratch_floats(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) {
        log_error("rank %d: out of memory for bf16 scratch (%zu floats)", log_rank(), n);
        exit(EXIT_FAILURE);
    }
    return p;
}

/* A product's operand x[n] as the product reads it: x itself in fp32; in bf16 a copy
 * rounded to bf16 (in *copy, which the caller frees), as the GPU converts its operands. */
static const float *operand(const float *x, size_t n, float **copy) {
    *copy = NULL;
    if (g_precision != GPTC_BF16) return x;
    float *c = scratch_floats(n);
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) c[i] = bf16_round(x[i]);
    *copy = c;
    return c;
}

void cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                        int N, int IC, int OC, int w_rows_out, gptc_stream *s) {
    float beta = 0.0f;
    if (bias) {
        #pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, sizeof(float) * OC);
        beta = 1.0f;
    }
    float *inp_copy, *w_copy;
    const float *a = operand(inp, (size_t)N * IC, &inp_copy);
    const float *b = operand(w, (size_t)IC * OC, &w_copy);
    cpu_sgemm(CblasNoTrans, w_rows_out ? CblasTrans : CblasNoTrans,
                N, OC, IC, 1.0f, a, IC, b, w_rows_out ? IC : OC, beta, out, OC);
    free(inp_copy);
    free(w_copy);
}

void cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                         const float *inp, const float *w, int N, int IC, int OC,
                         int w_rows_out, gptc_stream *s) {
    float *dout_copy = NULL, *w_copy = NULL, *inp_copy = NULL;
    const float *d = dout; /* the bias gradient sums dout itself, in fp32 */
    if (dinp || dw) d = operand(dout, (size_t)N * OC, &dout_copy);
    if (dinp) {
        const float *b = operand(w, (size_t)IC * OC, &w_copy);
        cpu_sgemm(CblasNoTrans, w_rows_out ? CblasNoTrans : CblasTrans,
                    N, IC, OC, 1.0f, d, OC, b, w_rows_out ? IC : OC, 0.0f, dinp, IC);
    }
    if (dw) {
        const float *a = operand(inp, (size_t)N * IC, &inp_copy);
        if (w_rows_out) /* dw[OC,IC] += dout^T @ inp */
            cpu_sgemm(CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, d, OC, a, IC, 1.0f, dw, IC);
        else /* dw[IC,OC] += inp^T @ dout */
            cpu_sgemm(CblasTrans, CblasNoTrans, IC, OC, N, 1.0f, a, IC, d, OC, 1.0f, dw, OC);
    }
    free(dout_copy);
    free(w_copy);
    free(inp_copy);
    if (dbias) {
        /* each thread sums its own band of columns over all rows */
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
}

/* The fused ops are the two steps they fuse: the CPU results stay bit for bit those of
 * the unfused layer. */
void cpu_matmul_gelu_forward(float *out, float *pre, const float *inp, const float *w,
                             const float *bias, int N, int IC, int OC, gptc_stream *s) {
    cpu_matmul_forward(pre, inp, w, bias, N, IC, OC, 0, s);
    cpu_gelu_forward(out, pre, (size_t)N * OC, s);
}

void cpu_matmul_dgelu_backward(float *dpre, const float *dout, const float *w, const float *pre,
                               int N, int IC, int OC, gptc_stream *s) {
    cpu_matmul_backward(dpre, NULL, NULL, dout, NULL, w, N, IC, OC, 0, s);
    cpu_gelu_backward(dpre, pre, dpre, (size_t)N * IC, s);
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

static float row_max(const float *x, int n) {
    float mx = x[0];
    #pragma omp simd reduction(max : mx)
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

/* ------------------------------------------------------------------ attention */

/* Per (batch, head) the products are small GEMMs on strided views of qkv: head h of
 * row t has q at qkv[t*3C + h*hs], k at +C, v at +2C, so no packing copy is needed. */

void cpu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                           int NH, gptc_stream *s) {
    if (g_precision == GPTC_BF16) {
        cpu_attention_forward_bf16(out, att, qkv, B, T, C, NH);
        return;
    }
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

void cpu_attention_backward(float *dqkv, float *datt, const float *dout, const float *out,
                            const float *qkv, const float *att, int B, int T, int C, int NH,
                            gptc_stream *s) {
    if (g_precision == GPTC_BF16) {
        cpu_attention_backward_bf16(dqkv, datt, dout, out, qkv, att, B, T, C, NH);
        return;
    }
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

void cpu_gelu_forward(float *out, const float *inp, size_t n, gptc_stream *s) {
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + cpu_tanhf(GELU_K * (x + 0.044715f * x * x * x)));
    }
}

void cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n,
                       gptc_stream *s) {
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

void cpu_add(float *out, const float *a, const float *b, size_t n, gptc_stream *s) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void cpu_scale(float *x, float a, size_t n, gptc_stream *s) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= a;
}

/* ------------------------------------------------------------------ loss */

/* Vocab-parallel softmax cross-entropy, in three passes around two all-reduces over the
 * tensor-parallel group (max, then sum-exp and target logit); with one rank the
 * all-reduces vanish and this is the plain fused loss. A rank holds Vl columns of the
 * padded vocab starting at global column v_start; only the first v_valid are real. */

void cpu_vocab_max(float *mx, const float *logits, int N, int Vl, int v_valid, gptc_stream *s) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        mx[n] = v_valid > 0 ? row_max(logits + (size_t)n * Vl, v_valid) : -INFINITY;
}

void cpu_vocab_expsum(float *stats, float *logits, const float *mx, const int32_t *targets,
                      int N, int Vl, int v_valid, int v_start, gptc_stream *s) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *row = logits + (size_t)n * Vl;
        int y = targets[n] - v_start;
        stats[N + n] = y >= 0 && y < v_valid ? row[y] - mx[n] : 0.0f;
        stats[n] = (float)exp_shift_sum(row, v_valid, mx[n]);
    }
}

void cpu_vocab_ce_finish(float *losses, float *logits, const float *stats,
                         const int32_t *targets, int N, int Vl, int v_valid, int v_start,
                         float dloss, gptc_stream *s) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *row = logits + (size_t)n * Vl;
        losses[n] = logf(stats[n]) - stats[N + n];
        float scale = dloss / stats[n];
        for (int i = 0; i < v_valid; i++) row[i] *= scale;
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

void cpu_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr,
               float beta1, float beta2, float eps, float decay, float bc1, float bc2,
               gptc_stream *s) {
    /* PyTorch's order: decay the weight, update moments, then step by
     * (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps). */
    float step_size = lr / bc1, bc2_sqrt = sqrtf(bc2), shrink = 1.0f - lr * decay;
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * shrink - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    }
}
