/* Every CUDA op against the CPU op (the reference) on random inputs. Outputs the op
 * overwrites are poisoned with NaN first, so an element the GPU never wrote fails the
 * comparison; outputs it accumulates into start from the same random values on both
 * sides, so a missing or doubled "+=" fails too. Shapes include sizes that are not
 * multiples of any tile or warp (T = 37, C = 48, a vocabulary of 101 columns of which 97
 * are real). The kernels' float4 bodies need 16-byte aligned buffers, so their scalar
 * paths run on C = 45 and on views one float into an allocation ("unaligned"); layernorm
 * at C = 7000 takes its path without shared memory. Exits 77 (ctest: skipped) when there
 * is no GPU. The same source runs on the fake CUDA runtime of tests/cuda_emu as
 * test_cuda_ops_emu; what needs the launchers or the emulator themselves (refused shapes,
 * which the op table turns into an exit, fill_nan, the host flags, the emulated mma) is
 * tests/cuda_emu/test_cuda_emu.c.
 *
 * The error of an output is max |gpu - cpu| / max |cpu| over the tensor: element-wise
 * relative error is meaningless for values near zero. fp32 with TF32 off differs from
 * the CPU only by summation order, so the bound is 1e-5, loosened only where a sum runs
 * over thousands of terms (noted at the op). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_internal.h"
#include "engine/cuda/cuda_kernels.h"
#include "engine/rng.h"
#include "tests/attention_bf16_ref.h"

static const gptc_backend *cpu, *gpu;
static int g_failures;

static float *host_randn(size_t n, float std, uint64_t key) {
    float *x = malloc(n * sizeof(float)); /* [n] */
    for (size_t i = 0; i < n; i++) x[i] = std * rng_normal(key, i);
    return x;
}

static float *to_gpu(const float *h, size_t n) {
    float *d = gpu->alloc(n * sizeof(float)); /* [n] */
    gpu->copy_from_host(d, h, n * sizeof(float), NULL);
    return d;
}

/* every float of the device buffer d[n] set to NaN */
static void poison(float *d, size_t n) {
    float *h = malloc(n * sizeof(float)); /* [n] */
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    gpu->copy_from_host(d, h, n * sizeof(float), NULL);
    free(h);
}

/* a device buffer of n floats, every one NaN */
static float *poisoned(size_t n) {
    float *d = gpu->alloc(n * sizeof(float)); /* [n] */
    poison(d, n);
    return d;
}

static int32_t *ints_to_gpu(const int32_t *h, size_t n) {
    int32_t *d = gpu->alloc(n * sizeof(int32_t)); /* [n] */
    gpu->copy_from_host(d, h, n * sizeof(int32_t), NULL);
    return d;
}

/* Compares got (host memory) with the host reference; returns the error. */
static double compare_host(const char *what, const float *got, const float *ref, size_t n,
                           double tol) {
    double max_ref = 0, max_err = 0;
    size_t worst = 0;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        /* a non-finite value on either side must be matched exactly (NaN never is) */
        if (!(isfinite(got[i]) && isfinite(ref[i])) && !(got[i] == ref[i])) {
            bad = 1;
            worst = i;
            break;
        }
        if (!isfinite(ref[i])) continue;
        double e = fabs((double)got[i] - ref[i]);
        if (e > max_err) max_err = e, worst = i;
        if (fabs(ref[i]) > max_ref) max_ref = fabs(ref[i]);
    }
    double rel = max_ref > 0 ? max_err / max_ref : max_err;
    if (bad || !(rel <= tol)) {
        printf("FAIL %-28s rel err %.3g > %.1g (element %zu: gpu %.9g, cpu %.9g)\n", what,
               bad ? INFINITY : rel, tol, worst, got[worst], ref[worst]);
        g_failures++;
    } else {
        printf("ok   %-28s rel err %.3g\n", what, rel);
    }
    return bad ? INFINITY : rel;
}

/* Compares the device tensor with the host reference; frees nothing. */
static void compare(const char *what, const float *dev, const float *ref, size_t n, double tol) {
    float *got = malloc(n * sizeof(float)); /* [n] */
    gpu->copy_to_host(got, dev, n * sizeof(float), NULL);
    compare_host(what, got, ref, n, tol);
    free(got);
}

/* C % 4 != 0 (45) leaves the rows unaligned: the scalar path */
static void test_embedding(int C) {
    int B = 3, T = 37, N = B * T, V = 101, v_start = 40, v_local = 50;
    int32_t tok[3 * 37];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 37 + i / 5) % V); /* repeats, and some outside the shard */
    float *wte = host_randn((size_t)v_local * C, 1, 1), *wpe = host_randn((size_t)T * C, 1, 2);
    float *out = malloc((size_t)N * C * sizeof(float)); /* [N,C] */
    cpu->embedding_forward(out, tok, wte, wpe, N, T, C, v_start, v_local, NULL);
    int32_t *d_tok = ints_to_gpu(tok, N);
    float *d_wte = to_gpu(wte, (size_t)v_local * C), *d_wpe = to_gpu(wpe, (size_t)T * C);
    float *d_out = poisoned((size_t)N * C);
    gpu->embedding_forward(d_out, d_tok, d_wte, d_wpe, N, T, C, v_start, v_local, NULL);
    char name[64];
    snprintf(name, sizeof name, "embedding_forward C=%d", C);
    compare(name, d_out, out, (size_t)N * C, 1e-6);
    poison(d_out, (size_t)N * C);
    gpu->embedding_forward(d_out, d_tok, d_wte, NULL, N, T, C, v_start, v_local, NULL);
    cpu->embedding_forward(out, tok, wte, NULL, N, T, C, v_start, v_local, NULL);
    compare("embedding_forward (no wpe)", d_out, out, (size_t)N * C, 1e-6);

    float *dout = host_randn((size_t)N * C, 1, 3);
    float *dwte = host_randn((size_t)v_local * C, 1, 4), *dwpe = host_randn((size_t)T * C, 1, 5);
    float *d_dout = to_gpu(dout, (size_t)N * C), *d_dwte = to_gpu(dwte, (size_t)v_local * C);
    float *d_dwpe = to_gpu(dwpe, (size_t)T * C);
    cpu->embedding_backward(dwte, dwpe, dout, tok, N, T, C, v_start, v_local, NULL);
    gpu->embedding_backward(d_dwte, d_dwpe, d_dout, d_tok, N, T, C, v_start, v_local, NULL);
    compare("embedding_backward dwte", d_dwte, dwte, (size_t)v_local * C, 1e-5);
    compare("embedding_backward dwpe", d_dwpe, dwpe, (size_t)T * C, 1e-5);
    free(wte), free(wpe), free(out), free(dout), free(dwte), free(dwpe);
    gpu->release(d_tok), gpu->release(d_wte), gpu->release(d_wpe), gpu->release(d_out);
    gpu->release(d_dout), gpu->release(d_dwte), gpu->release(d_dwpe);
}

static void test_layernorm(int N, int C) {
    float *inp = host_randn((size_t)N * C, 2, 10), *w = host_randn(C, 1, 11), *b = host_randn(C, 1, 12);
    float *out = malloc((size_t)N * C * sizeof(float)), *mean = malloc(N * sizeof(float));
    float *rstd = malloc(N * sizeof(float));
    cpu->layernorm_forward(out, mean, rstd, inp, w, b, N, C, NULL);
    float *d_inp = to_gpu(inp, (size_t)N * C), *d_w = to_gpu(w, C), *d_b = to_gpu(b, C);
    float *d_out = poisoned((size_t)N * C), *d_mean = poisoned(N), *d_rstd = poisoned(N);
    gpu->layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C, NULL);
    char name[64];
    snprintf(name, sizeof name, "layernorm_forward C=%d", C);
    compare(name, d_out, out, (size_t)N * C, 1e-5);
    compare("layernorm_forward mean", d_mean, mean, N, 1e-5);
    compare("layernorm_forward rstd", d_rstd, rstd, N, 1e-5);

    float *dout = host_randn((size_t)N * C, 1, 13);
    float *dinp = host_randn((size_t)N * C, 1, 14), *dw = host_randn(C, 1, 15), *db = host_randn(C, 1, 16);
    float *d_dout = to_gpu(dout, (size_t)N * C), *d_dinp = to_gpu(dinp, (size_t)N * C);
    float *d_dw = to_gpu(dw, C), *d_db = to_gpu(db, C);
    cpu->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, NULL);
    gpu->layernorm_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, N, C, NULL);
    compare("layernorm_backward dinp", d_dinp, dinp, (size_t)N * C, 1e-5);
    compare("layernorm_backward dw", d_dw, dw, C, 1e-5);
    compare("layernorm_backward db", d_db, db, C, 1e-5);
    free(inp), free(w), free(b), free(out), free(mean), free(rstd), free(dout), free(dinp);
    free(dw), free(db);
    gpu->release(d_inp), gpu->release(d_w), gpu->release(d_b), gpu->release(d_out);
    gpu->release(d_mean), gpu->release(d_rstd), gpu->release(d_dout), gpu->release(d_dinp);
    gpu->release(d_dw), gpu->release(d_db);
}

/* precision = bf16 on both backends: the CPU rounds the operands to bf16 (nearest even)
 * and multiplies in fp32; cuBLASLt's CUBLAS_COMPUTE_32F_FAST_16BF converts them for the
 * tensor cores. The same 1e-5 bound holds only if the GPU rounds as the CPU does (a
 * conversion toward zero would differ by ~1e-3): that is what these runs check. */
static int g_bf16;

/* The GPU's bf16 output d_out[n] really is rounded: it differs from the CPU's strict fp32
 * result exact[n] by far more than summation order (1e-6) would; bf16 gives ~1e-3. */
static void check_apart_from_fp32(const char *what, const float *d_out, const float *exact, size_t n) {
    float *got = malloc(n * sizeof(float)); /* [n] */
    gpu->copy_to_host(got, d_out, n * sizeof(float), NULL);
    double max_ref = 0, max_err = 0;
    for (size_t i = 0; i < n; i++) {
        max_ref = fmax(max_ref, fabs(exact[i]));
        max_err = fmax(max_err, fabs((double)got[i] - exact[i]));
    }
    double rel = max_ref > 0 ? max_err / max_ref : 0;
    printf("%s %-28s differs from fp32 by %.3g%s\n", rel > 1e-4 ? "ok  " : "FAIL", what, rel,
           rel > 1e-4 ? " (rounded)" : ": not rounded to bf16?");
    if (!(rel > 1e-4)) g_failures++;
    free(got);
}

/* The matmuls under either precision (the GPU's, gpu->get_precision()). Under bf16 the
 * act buffers hold bf16 bits on the device; the inputs are bf16 values, so the reference
 * is the CPU run in strict fp32 on the same values (the exact product of bf16 operands up
 * to summation order), and each act output must be that result rounded once: within
 * half a bf16 ulp, 2^-8 |ref|, plus 1e-5 max |ref| for the order. A conversion toward
 * zero, a second rounding or a product of rounded-again operands fails that bound;
 * fp32 weight and bias gradients keep the 1e-5 bound. */
static int mm_bf16(void) { return gpu->get_precision() == GPTC_BF16; }

/* n random values (host_randn), rounded to bf16 when the GPU runs bf16 */
static float *mm_act_values(size_t n, float std, uint64_t key) {
    float *x = host_randn(n, std, key); /* [n] */
    if (mm_bf16())
        for (size_t i = 0; i < n; i++) x[i] = bf16_round(x[i]);
    return x;
}

/* a device act buffer holding h[n] (bf16 bits under bf16: h holds bf16 values) */
static gptc_act *mm_act_to_gpu(const float *h, size_t n) {
    if (!mm_bf16()) return to_gpu(h, n);
    uint16_t *b = malloc(n * sizeof(uint16_t)); /* [n] */
    for (size_t i = 0; i < n; i++) b[i] = bf16_bits(h[i]);
    gptc_act *d = gpu->alloc(n * sizeof(uint16_t)); /* [n] act */
    gpu->copy_from_host(d, b, n * sizeof(uint16_t), NULL);
    free(b);
    return d;
}

/* a device act buffer of n elements, every one NaN */
static gptc_act *mm_act_poisoned(size_t n) {
    if (!mm_bf16()) return poisoned(n);
    uint16_t *b = malloc(n * sizeof(uint16_t)); /* [n] */
    for (size_t i = 0; i < n; i++) b[i] = 0x7fc0; /* a quiet NaN */
    gptc_act *d = gpu->alloc(n * sizeof(uint16_t)); /* [n] act */
    gpu->copy_from_host(d, b, n * sizeof(uint16_t), NULL);
    free(b);
    return d;
}

/* the device act buffer d[n] as floats on the host (malloc'ed) */
static float *mm_act_to_host(const gptc_act *d, size_t n) {
    float *h = malloc(n * sizeof(float)); /* [n] */
    if (!mm_bf16()) {
        gpu->copy_to_host(h, d, n * sizeof(float), NULL);
        return h;
    }
    uint16_t *b = malloc(n * sizeof(uint16_t)); /* [n] */
    gpu->copy_to_host(b, d, n * sizeof(uint16_t), NULL);
    for (size_t i = 0; i < n; i++) h[i] = bf16_to_float(b[i]);
    free(b);
    return h;
}

/* The worst element of got[n] against ref[n] in units of the bound of one bf16 rounding
 * (> 1: too far; infinite: a non-finite value where ref has none), its index in *worst. */
static double mm_rounding_error(const float *got, const float *ref, size_t n, size_t *worst) {
    double max_ref = 0, worst_q = 0;
    *worst = 0;
    for (size_t i = 0; i < n; i++) max_ref = fmax(max_ref, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            *worst = i;
            return INFINITY;
        }
        double q = fabs((double)got[i] - ref[i]) / (ldexp(fabs(ref[i]), -8) + 1e-5 * max_ref + 1e-30);
        if (q > worst_q) worst_q = q, *worst = i;
    }
    return worst_q;
}

/* The act output d_got[n] against the fp32 reference ref[n]: under fp32 within 1e-5;
 * under bf16 ref rounded once, or, when alt is given, alt[n] rounded once (the path
 * without the epilogue, whose reference differs): either passes, the first that does is
 * named. */
static void check_rounded(const char *what, const gptc_act *d_got, const float *ref,
                          const float *alt, size_t n) {
    if (!mm_bf16()) {
        compare(what, d_got, ref, n, 1e-5);
        return;
    }
    float *got = mm_act_to_host(d_got, n);
    size_t worst, worst_alt = 0;
    double q = mm_rounding_error(got, ref, n, &worst);
    double q_alt = alt ? mm_rounding_error(got, alt, n, &worst_alt) : INFINITY;
    if (q <= 1 || q_alt <= 1) {
        printf("ok   %-28s within %.2f of one bf16 rounding%s\n", what, q <= 1 ? q : q_alt,
               q <= 1 ? (alt ? " (fused epilogue)" : "") : " (GEMM, then the kernel)");
    } else {
        printf("FAIL %-28s %.3g times the bound of one bf16 rounding (element %zu: gpu %.9g, "
               "cpu %.9g)\n", what, q, worst, got[worst], ref[worst]);
        g_failures++;
    }
    free(got);
}

/* The CPU backend in strict fp32 for the references (fp32 = 1), or back on the GPU's
 * precision, which main keeps both backends on (fp32 = 0). */
static void mm_cpu_fp32(int fp32) {
    cpu->set_precision(fp32 ? GPTC_FP32 : gpu->get_precision());
}

static void test_matmul(int N, int IC, int OC, int w_rows_out, int with_bias) {
    size_t nw = (size_t)IC * OC;
    const char *bf = mm_bf16() ? " bf16" : "";
    mm_cpu_fp32(1);
    float *inp = mm_act_values((size_t)N * IC, 1, 20), *w = mm_act_values(nw, 0.1f, 21);
    float *bias = with_bias ? mm_act_values(OC, 1, 22) : NULL;
    float *out = malloc((size_t)N * OC * sizeof(float)); /* [N,OC] */
    cpu->matmul_forward(out, inp, w, bias, N, IC, OC, w_rows_out, NULL);
    gptc_act *d_inp = mm_act_to_gpu(inp, (size_t)N * IC), *d_w = mm_act_to_gpu(w, nw);
    gptc_act *d_bias = bias ? mm_act_to_gpu(bias, OC) : NULL;
    gptc_act *d_out = mm_act_poisoned((size_t)N * OC);
    gpu->matmul_forward(d_out, d_inp, d_w, d_bias, N, IC, OC, w_rows_out, NULL);
    char name[96];
    snprintf(name, sizeof name, "matmul_forward %dx%dx%d%s%s%s", N, IC, OC,
             w_rows_out ? " W^T" : "", with_bias ? " +b" : "", bf);
    check_rounded(name, d_out, out, NULL, (size_t)N * OC);

    float *dout = mm_act_values((size_t)N * OC, 1, 23), *dw = host_randn(nw, 1, 24);
    float *dbias = host_randn(OC, 1, 25), *dinp = malloc((size_t)N * IC * sizeof(float));
    gptc_act *d_dout = mm_act_to_gpu(dout, (size_t)N * OC), *d_dinp = mm_act_poisoned((size_t)N * IC);
    float *d_dw = to_gpu(dw, nw), *d_dbias = to_gpu(dbias, OC);
    cpu->matmul_backward(dinp, dw, with_bias ? dbias : NULL, dout, inp, w, N, IC, OC, w_rows_out, NULL);
    gpu->matmul_backward(d_dinp, d_dw, with_bias ? d_dbias : NULL, d_dout, d_inp, d_w, N, IC, OC,
                         w_rows_out, NULL);
    snprintf(name, sizeof name, "matmul_backward dinp%s", bf);
    check_rounded(name, d_dinp, dinp, NULL, (size_t)N * IC);
    snprintf(name, sizeof name, "matmul_backward dw%s", bf);
    compare(name, d_dw, dw, nw, 1e-5);
    snprintf(name, sizeof name, "matmul_backward dbias%s", bf);
    if (with_bias) compare(name, d_dbias, dbias, OC, 1e-5);
    mm_cpu_fp32(0);
    free(inp), free(w), free(bias), free(out), free(dout), free(dw), free(dbias), free(dinp);
    gpu->release(d_inp), gpu->release(d_w), gpu->release(d_out), gpu->release(d_dout);
    gpu->release(d_dw), gpu->release(d_dbias), gpu->release(d_dinp);
    if (d_bias) gpu->release(d_bias);
}

/* The MLP's fused GELU: matmul_gelu_forward (pre and out) and matmul_dgelu_backward
 * against the CPU, which runs the unfused steps. With OC and IC multiples of 8 cuBLASLt's
 * epilogues run (if it has them for the shape); otherwise the GEMM and the GELU kernels:
 * both paths are checked. The epilogue must be the tanh-approximated GELU of the model:
 * an erf GELU would differ by ~1e-3 and fail the 1e-5 bound. Under bf16 the epilogue
 * takes the GELU (GELU') of the fp32 sum, so out (dpre) is rounded once from it; the
 * kernels read the rounded pre (the rounded product), which makes another reference:
 * the output must be one rounding from either. */
static void test_matmul_gelu(int N, int IC, int OC) {
    size_t no = (size_t)N * OC, ni = (size_t)N * IC, nw = (size_t)IC * OC;
    const char *bf = mm_bf16() ? " bf16" : "";
    mm_cpu_fp32(1);
    float *inp = mm_act_values(ni, 1, 40), *w = mm_act_values(nw, 0.2f, 41);
    float *bias = mm_act_values(OC, 1, 42);
    float *out = malloc(no * sizeof(float)), *pre = malloc(no * sizeof(float)); /* [N,OC] */
    cpu->matmul_gelu_forward(out, pre, inp, w, bias, N, IC, OC, NULL);
    gptc_act *d_inp = mm_act_to_gpu(inp, ni), *d_w = mm_act_to_gpu(w, nw);
    gptc_act *d_bias = mm_act_to_gpu(bias, OC);
    gptc_act *d_out = mm_act_poisoned(no), *d_pre = mm_act_poisoned(no);
    gpu->matmul_gelu_forward(d_out, d_pre, d_inp, d_w, d_bias, N, IC, OC, NULL);
    float *alt = NULL; /* [N,OC] gelu of the GPU's rounded pre: the unfused path under bf16 */
    if (mm_bf16()) {
        float *got_pre = mm_act_to_host(d_pre, no);
        alt = malloc(no * sizeof(float));
        cpu->gelu_forward(alt, got_pre, no, NULL);
        free(got_pre);
    }
    char name[96];
    snprintf(name, sizeof name, "matmul_gelu_forward %dx%dx%d%s", N, IC, OC, bf);
    check_rounded(name, d_out, out, alt, no);
    snprintf(name, sizeof name, "matmul_gelu_forward pre%s", bf);
    check_rounded(name, d_pre, pre, NULL, no);
    /* the backward through a projection IC -> OC whose input was gelu(pre2[N,IC]) */
    float *pre2 = mm_act_values(ni, 1, 43), *dout = mm_act_values(no, 1, 44);
    float *dpre = malloc(ni * sizeof(float)); /* [N,IC] */
    cpu->matmul_dgelu_backward(dpre, dout, w, pre2, N, IC, OC, NULL);
    float *alt2 = NULL; /* [N,IC] the rounded product times gelu'(pre2): the unfused path */
    if (mm_bf16()) {
        float *prod = malloc(ni * sizeof(float)); /* [N,IC] */
        cpu->matmul_backward(prod, NULL, NULL, dout, NULL, w, N, IC, OC, 0, NULL);
        for (size_t i = 0; i < ni; i++) prod[i] = bf16_round(prod[i]);
        alt2 = malloc(ni * sizeof(float));
        cpu->gelu_backward(alt2, pre2, prod, ni, NULL);
        free(prod);
    }
    gptc_act *d_pre2 = mm_act_to_gpu(pre2, ni), *d_dout = mm_act_to_gpu(dout, no);
    gptc_act *d_dpre = mm_act_poisoned(ni);
    gpu->matmul_dgelu_backward(d_dpre, d_dout, d_w, d_pre2, N, IC, OC, NULL);
    snprintf(name, sizeof name, "matmul_dgelu_backward %dx%dx%d%s", N, IC, OC, bf);
    check_rounded(name, d_dpre, dpre, alt2, ni);
    mm_cpu_fp32(0);
    free(inp), free(w), free(bias), free(out), free(pre), free(pre2), free(dout), free(dpre);
    free(alt), free(alt2);
    gpu->release(d_inp), gpu->release(d_w), gpu->release(d_bias), gpu->release(d_out);
    gpu->release(d_pre), gpu->release(d_pre2), gpu->release(d_dout), gpu->release(d_dpre);
}

/* bf16 through the op tables: the GPU's tensor-core kernels against the CPU's bf16
 * attention, which rounds at the same points; what differs is the arithmetic around
 * them (fp32 sums in another order, exp2 and the running maximum), which can move an
 * element across a bf16 rounding boundary: one bf16 step, 2^-8 of that term, at worst. */
#define ATT_BF16_TOL (1.0 / 256)

/* The GPU switched to its bf16 attention kernels (the rounding of P alone gives ~1e-3) */
static void check_attention_rounded(const float *d_out, const float *qkv, int B, int T, int C,
                                    int NH) {
    size_t ny = (size_t)B * T * C;
    float *exact = malloc(ny * sizeof(float)); /* [B,T,C] */
    float *att = malloc(cpu->attention_state_floats(B, T, NH) * sizeof(float));
    cpu->set_precision(GPTC_FP32);
    cpu->attention_forward(exact, att, qkv, B, T, C, NH, NULL);
    cpu->set_precision(GPTC_BF16);
    check_apart_from_fp32("attention_forward bf16", d_out, exact, ny);
    free(exact), free(att);
}

static void test_attention(int B, int T, int C, int NH) {
    size_t nqkv = (size_t)B * T * 3 * C, ny = (size_t)B * T * C;
    float *qkv = host_randn(nqkv, 1, 30), *out = malloc(ny * sizeof(float));
    float *att = malloc(cpu->attention_state_floats(B, T, NH) * sizeof(float));
    float *datt = malloc(cpu->attention_state_floats(B, T, NH) * sizeof(float));
    cpu->attention_forward(out, att, qkv, B, T, C, NH, NULL);
    float *d_qkv = to_gpu(qkv, nqkv), *d_out = poisoned(ny);
    size_t ns = gpu->attention_state_floats(B, T, NH);
    float *d_att = poisoned(ns), *d_datt = poisoned(ns);
    gpu->attention_forward(d_out, d_att, d_qkv, B, T, C, NH, NULL);
    char name[96];
    snprintf(name, sizeof name, "attention_forward T=%d hs=%d%s", T, C / NH, g_bf16 ? " bf16" : "");
    compare(name, d_out, out, ny, g_bf16 ? ATT_BF16_TOL : 1e-5);
    if (g_bf16) check_attention_rounded(d_out, qkv, B, T, C, NH);

    float *dout = host_randn(ny, 1, 31), *dqkv = malloc(nqkv * sizeof(float));
    float *d_dout = to_gpu(dout, ny), *d_dqkv = poisoned(nqkv);
    cpu->attention_backward(dqkv, datt, dout, out, qkv, att, B, T, C, NH, NULL);
    gpu->attention_backward(d_dqkv, d_datt, d_dout, d_out, d_qkv, d_att, B, T, C, NH, NULL);
    compare(g_bf16 ? "attention_backward dqkv bf16" : "attention_backward dqkv", d_dqkv, dqkv,
            nqkv, g_bf16 ? ATT_BF16_TOL : 1e-5);
    free(qkv), free(out), free(att), free(datt), free(dout), free(dqkv);
    gpu->release(d_qkv), gpu->release(d_out), gpu->release(d_att), gpu->release(d_datt);
    gpu->release(d_dout), gpu->release(d_dqkv);
}

/* The bf16 attention kernels (attention_bf16.cu), called through their launchers on the
 * backend's compute stream, against exact attention of the bf16-rounded inputs
 * (attention_bf16_ref), and against the fp32 kernels, which they must not equal.
 * What is left between kernel and reference is the kernels' own rounding of P (out, dv)
 * and dS (dq, dk) to bf16, each element off by at most u = 2^-8 relatively; the fp32
 * sums, exp2f and lse add ~1e-6. An output element is sum_u w_u x_u with weights P or
 * dS, so rounding the weights moves it by at most u sum_u |w_u| |x_u|: for out that is
 * u max|v|, about u max|out| (row 0's output is v_0, and max|v| is within 2 max|out| for
 * these inputs); for dq, dk, dv the sums cancel (dS rows sum to 0), so the bound is a few
 * times their size, but the roundings are independent and mostly cancel as well.
 * Measured (max-abs relative): out 0.22u, dv 0.45u, dq and dk 0.9u. Tolerance: 2u for
 * out, 4u for the gradients. And the error must be at least u/16: without the rounding
 * of P and dS (inputs rounded as in the reference) it is ~1e-6, so a kernel that skipped
 * it would pass the upper bound and fail here. lse sees no rounding but the inputs'
 * (which the reference shares): 1e-5, measured 1e-7. */
#define BF16_U (1.0 / 256)

/* compare_host, and the error must show the kernel's bf16 rounding (at least u/16) */
static void compare_bf16(const char *what, const float *got, const float *ref, size_t n,
                         double tol) {
    double rel = compare_host(what, got, ref, n, tol);
    if (rel <= tol && rel < BF16_U / 16) {
        printf("FAIL %-28s rel err %.3g: no sign of bf16 rounding (< u/16)\n", what, rel);
        g_failures++;
    }
}

/* offset 1: qkv and dout one float into their allocations, for the scalar loads */
static void test_attention_bf16(int B, int T, int NH, int hs, int offset) {
    int C = NH * hs;
    size_t nqkv = (size_t)B * T * 3 * C, ny = (size_t)B * T * C, nlse = (size_t)B * NH * T;
    float *qkv0 = host_randn(nqkv + offset, 1, 32); /* [offset + B*T*3C] */
    float *dout0 = host_randn(ny + offset, 1, 33);  /* [offset + B*T*C] */
    float *qkv = qkv0 + offset, *dout = dout0 + offset;
    float *out = malloc(ny * sizeof(float)), *lse = malloc(nlse * sizeof(float));
    float *dqkv = malloc(nqkv * sizeof(float));
    attention_bf16_ref(out, lse, dqkv, qkv, dout, B, T, C, NH);
    float *d_qkv0 = to_gpu(qkv0, nqkv + offset), *d_dout0 = to_gpu(dout0, ny + offset);
    float *d_qkv = d_qkv0 + offset, *d_dout = d_dout0 + offset, *d_out = poisoned(ny);
    float *d_lse = poisoned(nlse), *d_scratch = poisoned(nlse), *d_dqkv = poisoned(nqkv);
    cudaStream_t s = cuda_stream_of(NULL);
    cuda_attention_forward_bf16(d_out, d_lse, d_qkv, B, T, C, NH, s);
    int e = cuda_check_launch();
    cuda_attention_backward_bf16(d_dqkv, d_scratch, d_dout, d_out, d_qkv, d_lse, B, T, C, NH, s);
    e = e ? e : cuda_check_launch();
    if (e) {
        printf("FAIL attention bf16 hs=%d launch error %d\n", hs, e);
        g_failures++;
    }
    float *got = malloc(nqkv * sizeof(float)), *got_lse = malloc(nlse * sizeof(float));
    float *part = malloc(ny * sizeof(float)), *ref = malloc(ny * sizeof(float)); /* [B,T,C] */
    char name[96];
    gpu->copy_to_host(got, d_out, ny * sizeof(float), NULL);
    snprintf(name, sizeof name, "attention_fwd_bf16 T=%d hs=%d%s", T, hs,
             offset ? " unaligned" : "");
    compare_bf16(name, got, out, ny, 2 * BF16_U);
    gpu->copy_to_host(got_lse, d_lse, nlse * sizeof(float), NULL);
    compare_host("attention_fwd_bf16 lse", got_lse, lse, nlse, 1e-5);
    gpu->copy_to_host(got, d_dqkv, nqkv * sizeof(float), NULL);
    static const char *const part_name[3] = {"attention_bwd_bf16 dq", "attention_bwd_bf16 dk",
                                             "attention_bwd_bf16 dv"};
    for (int k = 0; k < 3; k++) {
        qkv_part(part, got, (size_t)B * T, C, k);
        qkv_part(ref, dqkv, (size_t)B * T, C, k);
        compare_bf16(part_name[k], part, ref, ny, 4 * BF16_U);
    }

    /* the fp32 kernels on the same inputs: the rounding must show */
    float *d_fout = poisoned(ny), *d_flse = poisoned(nlse), *d_fdqkv = poisoned(nqkv);
    float *f = malloc(nqkv * sizeof(float)); /* [B,T,3C] */
    gpu->attention_forward(d_fout, d_flse, d_qkv, B, T, C, NH, NULL);
    gpu->attention_backward(d_fdqkv, d_scratch, d_dout, d_fout, d_qkv, d_flse, B, T, C, NH, NULL);
    gpu->copy_to_host(f, d_fdqkv, nqkv * sizeof(float), NULL);
    int same = memcmp(got, f, nqkv * sizeof(float)) == 0;
    gpu->copy_to_host(got, d_out, ny * sizeof(float), NULL);
    gpu->copy_to_host(f, d_fout, ny * sizeof(float), NULL);
    same += memcmp(got, f, ny * sizeof(float)) == 0;
    printf("%s %-28s\n", same ? "FAIL" : "ok  ", "attention bf16 != fp32");
    g_failures += same != 0;
    free(f), gpu->release(d_fout), gpu->release(d_flse), gpu->release(d_fdqkv);
    free(qkv0), free(dout0), free(out), free(lse), free(dqkv), free(got), free(got_lse);
    free(part), free(ref);
    gpu->release(d_qkv0), gpu->release(d_dout0), gpu->release(d_out), gpu->release(d_lse);
    gpu->release(d_scratch), gpu->release(d_dqkv);
}

/* offset 1: every buffer one float into its allocation, for the scalar paths */
static void test_elementwise(size_t n, int offset) {
    size_t n0 = n + offset;
    float *a0 = host_randn(n0, 2, 40), *b0 = host_randn(n0, 1, 41); /* [offset + n] each */
    float *a = a0 + offset, *b = b0 + offset, *out = malloc(n * sizeof(float)); /* [n] */
    float *d_a0 = to_gpu(a0, n0), *d_b0 = to_gpu(b0, n0), *d_out0 = poisoned(n0);
    float *d_a = d_a0 + offset, *d_b = d_b0 + offset, *d_out = d_out0 + offset;
    char name[64];
    cpu->gelu_forward(out, a, n, NULL);
    gpu->gelu_forward(d_out, d_a, n, NULL);
    snprintf(name, sizeof name, "gelu_forward n=%zu%s", n, offset ? " unaligned" : "");
    compare(name, d_out, out, n, 1e-6);
    poison(d_out, n);
    cpu->gelu_backward(out, a, b, n, NULL);
    gpu->gelu_backward(d_out, d_a, d_b, n, NULL);
    compare("gelu_backward", d_out, out, n, 1e-6);
    poison(d_out, n);
    cpu->add(out, a, b, n, NULL);
    gpu->add(d_out, d_a, d_b, n, NULL);
    compare("add", d_out, out, n, 0);
    cpu->scale(a, 0.37f, n, NULL);
    gpu->scale(d_a, 0.37f, n, NULL);
    compare("scale", d_a, a, n, 0);
    double s_cpu = cpu->sum_squares(b, n, NULL), s_gpu = gpu->sum_squares(d_b, n, NULL);
    double rel = fabs(s_gpu - s_cpu) / s_cpu;
    snprintf(name, sizeof name, "sum_squares n=%zu", n);
    printf("%s %-28s rel err %.3g\n", rel <= 1e-12 ? "ok  " : "FAIL", name, rel);
    if (!(rel <= 1e-12)) g_failures++;
    free(a0), free(b0), free(out);
    gpu->release(d_a0), gpu->release(d_b0), gpu->release(d_out0);
}

static void test_cross_entropy(int N, int Vl, int v_valid, int v_start) {
    size_t n = (size_t)N * Vl;
    float *logits = host_randn(n, 3, 50), *mx = malloc(N * sizeof(float));
    float *stats = malloc(2 * (size_t)N * sizeof(float)), *losses = malloc(N * sizeof(float));
    int32_t *tgt = malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++) tgt[i] = (int32_t)((i * 53) % (v_start + v_valid + 20)); /* some on other ranks */
    float *d_logits = to_gpu(logits, n), *d_mx = poisoned(N), *d_stats = poisoned(2 * (size_t)N);
    float *d_losses = poisoned(N);
    int32_t *d_tgt = ints_to_gpu(tgt, N);
    cpu->vocab_max(mx, logits, N, Vl, v_valid, NULL);
    gpu->vocab_max(d_mx, d_logits, N, Vl, v_valid, NULL);
    compare("vocab_max", d_mx, mx, N, 0);
    cpu->vocab_expsum(stats, logits, mx, tgt, N, Vl, v_valid, v_start, NULL);
    gpu->vocab_expsum(d_stats, d_logits, d_mx, d_tgt, N, Vl, v_valid, v_start, NULL);
    compare("vocab_expsum stats", d_stats, stats, 2 * (size_t)N, 1e-5);
    compare("vocab_expsum exp(logits)", d_logits, logits, n, 1e-6);
    cpu->vocab_ce_finish(losses, logits, stats, tgt, N, Vl, v_valid, v_start, 0.01f, NULL);
    gpu->vocab_ce_finish(d_losses, d_logits, d_stats, d_tgt, N, Vl, v_valid, v_start, 0.01f, NULL);
    compare("vocab_ce_finish losses", d_losses, losses, N, 1e-6);
    compare("vocab_ce_finish dlogits", d_logits, logits, n, 1e-6);
    free(logits), free(mx), free(stats), free(losses), free(tgt);
    gpu->release(d_logits), gpu->release(d_mx), gpu->release(d_stats), gpu->release(d_losses);
    gpu->release(d_tgt);
}

/* offset 1: p alone one float into its allocation; one misaligned buffer must be
 * enough to send the update down the scalar path */
static void test_adamw(size_t n, int offset) {
    float *p0 = host_randn(n + offset, 1, 60); /* [offset + n] */
    float *g = host_randn(n, 1, 61), *m = host_randn(n, 0.1f, 62);
    float *v = host_randn(n, 0.1f, 63); /* [n] each */
    for (size_t i = 0; i < n; i++) v[i] = v[i] * v[i];
    float *p = p0 + offset, *d_p0 = to_gpu(p0, n + offset), *d_p = d_p0 + offset;
    float *d_g = to_gpu(g, n), *d_m = to_gpu(m, n), *d_v = to_gpu(v, n);
    float bc1 = 1 - powf(0.9f, 3), bc2 = 1 - powf(0.95f, 3);
    cpu->adamw(p, g, m, v, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, bc1, bc2, NULL);
    gpu->adamw(d_p, d_g, d_m, d_v, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, bc1, bc2, NULL);
    char name[64];
    snprintf(name, sizeof name, "adamw p n=%zu%s", n, offset ? " unaligned" : "");
    compare(name, d_p, p, n, 1e-6);
    compare("adamw m", d_m, m, n, 1e-6);
    compare("adamw v", d_v, v, n, 1e-6);
    free(p0), free(g), free(m), free(v);
    gpu->release(d_p0), gpu->release(d_g), gpu->release(d_m), gpu->release(d_v);
}

/* argv[1] = "quick": the smaller shapes only, for runs under compute-sanitizer, which
 * slows kernels down a hundredfold. */
int main(int argc, char **argv) {
    int quick = argc > 1 && strcmp(argv[1], "quick") == 0;
    char err[256];
    if (cuda_device_count() == 0) {
        printf("skipped: no GPU visible (test_cuda_ops needs one)\n");
        return 77;
    }
    cpu = cpu_backend();
    gpu = cuda_backend(0, err, sizeof err);
    if (!cpu || !gpu) {
        printf("FAIL: backend did not start: %s\n", gpu ? "cpu" : err);
        return 1;
    }
    test_embedding(48);
    test_embedding(45);
    test_layernorm(37, 48);
    if (!quick) test_layernorm(64, 768);
    test_layernorm(5, 7000); /* 2C floats above 48 KiB: dw, db by atomics, no shared memory */
    test_matmul(37, 48, 144, 0, 1);
    test_matmul(37, 48, 101, 1, 0); /* the tied LM head: W is [OC,IC] */
    if (!quick) test_matmul(128, 256, 64, 0, 1); /* the bias gradient in several row slices */
    test_matmul(33, 7, 5, 0, 1);    /* no dimension a multiple of 4: unaligned views */
    test_matmul_gelu(37, 48, 192);  /* the epilogues */
    test_matmul_gelu(37, 45, 100);  /* leading dimensions not multiples of 8: the kernels */
    cpu->set_precision(GPTC_BF16), gpu->set_precision(GPTC_BF16), g_bf16 = 1;
    test_attention(1, 130, 128, 2); /* hs 64 */
    if (!quick) test_attention(2, 64, 256, 2); /* hs 128 */
    test_matmul(37, 48, 144, 0, 1);
    test_matmul(37, 48, 101, 1, 0);
    if (!quick) test_matmul(128, 768, 256, 0, 1);
    cpu->set_precision(GPTC_FP32), gpu->set_precision(GPTC_FP32), g_bf16 = 0;
    test_attention(2, 37, 64, 4);   /* hs 16 */
    test_attention(1, 130, 128, 2); /* hs 64, T beyond one tile */
    if (!quick) test_attention(2, 64, 256, 2); /* hs 128 */
    test_attention_bf16(2, 37, 2, 64, 0);
    test_attention_bf16(1, 130, 2, 64, 0); /* 3 tiles, a partial last one */
    test_attention_bf16(1, 64, 1, 128, 0);
    test_attention_bf16(1, 70, 1, 64, 1);
    /* 6 tiles per row; small enough for test_cuda_ops_emu (the fake runtime) under ASan */
    if (!quick) test_attention_bf16(1, 333, 2, 64, 0);
    test_elementwise(quick ? 10007 : 1000003, 0);
    test_elementwise(1003, 1);
    test_cross_entropy(37, 101, 97, 0);
    test_cross_entropy(37, 101, 0, 101); /* a rank holding padding only */
    if (!quick) test_cross_entropy(19, 4096, 4096, 4096);
    test_adamw(quick ? 10007 : 100003, 0);
    test_adamw(1003, 1);
    if (g_failures) {
        printf("%d comparison(s) failed\n", g_failures);
        return 1;
    }
    printf("all CUDA ops match the CPU ops\n");
    return 0;
}
