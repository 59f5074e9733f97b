/* Every CUDA kernel launcher (engine/cuda/cuda_kernels.h) run on the CPU emulator of
 * tests/cuda_emu (emu_runtime.c says what it can and cannot catch) and compared with the
 * CPU op of the same name, so that the kernels are checked on every run of the suite,
 * with or without a GPU. It is tests/test_cuda_ops.c (the same check on a real GPU) with
 * the same shapes and rules: outputs an op overwrites are poisoned with NaN, outputs it
 * accumulates into start from the same random values on both sides, the error of an
 * output is max |emu - cpu| / max |cpu|, sizes are not multiples of tiles (T = 37,
 * C = 48, a 101-column vocabulary of which 97 are real). Additions here: misaligned
 * buffers and C = 45 (the kernels' scalar paths), layernorm's no-shared-memory path
 * (C = 7000), fill_nan, wait_flag and the unsupported-shape error of attention; lighter:
 * the elementwise vectors (100003 floats rather than 1000003, noted at the call).
 * Not here: matmul, which is cuBLASLt on the GPU, not a kernel of ours; only its bias
 * gradient (cuda_bias_backward) is, and is compared with the CPU matmul_backward's dbias.
 * The attention kernels keep a log-sum-exp where the CPU keeps probabilities, so only
 * out and dqkv are compared. The bf16 attention kernels (attention_bf16.cu), which no CPU
 * op matches, are compared with exact attention of their bf16-rounded inputs
 * (tests/attention_bf16_ref.h, also used by test_cuda_ops.c), after the bf16 rounding
 * and one emulated mma (mma_check.cu) are checked on their own. The whole test takes a
 * second or less (a few under GPTC_SANITIZE=address): the emulator's cost is a fiber
 * switch per thread per barrier. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/cuda/cuda_kernels.h"
#include "engine/rng.h"
#include "tests/attention_bf16_ref.h"

/* mma_check.cu: d[16][8] = a[16][16] b[16][8] + c on one emulated mma.sync */
void emu_mma_check(float *d, const float *a, const float *b, const float *c);

static const gptc_backend *cpu;
static int g_failures;

static float *host_randn(size_t n, float std, uint64_t key) {
    float *x = malloc(n * sizeof(float)); /* [n] */
    for (size_t i = 0; i < n; i++) x[i] = std * rng_normal(key, i);
    return x;
}

/* a copy of x[n] for the emulated kernel, which works on host memory */
static float *dup(const float *x, size_t n) {
    float *y = malloc(n * sizeof(float)); /* [n] */
    memcpy(y, x, n * sizeof(float));
    return y;
}

/* n floats, every one NaN */
static float *poisoned(size_t n) {
    float *x = malloc(n * sizeof(float)); /* [n] */
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

/* A launch error (cudaGetLastError) is a failure of the op that launched. */
static void check_launch(const char *what) {
    int e = cuda_check_launch();
    if (e) {
        printf("FAIL %-28s launch error %d\n", what, e);
        g_failures++;
    }
}

/* Normwise relative error of got against the CPU's ref, as in test_cuda_ops.c. */
static void compare(const char *what, const float *got, const float *ref, size_t n, double tol) {
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
        printf("FAIL %-28s rel err %.3g > %.1g (element %zu: emu %.9g, cpu %.9g)\n", what,
               bad ? INFINITY : rel, tol, worst, got[worst], ref[worst]);
        g_failures++;
    } else {
        printf("ok   %-28s rel err %.3g\n", what, rel);
    }
}

static void test_embedding(int C) {
    int B = 3, T = 37, N = B * T, V = 101, v_start = 40, v_local = 50;
    int32_t tok[3 * 37];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 37 + i / 5) % V); /* repeats, and some outside the shard */
    float *wte = host_randn((size_t)v_local * C, 1, 1), *wpe = host_randn((size_t)T * C, 1, 2);
    float *out = malloc((size_t)N * C * sizeof(float)), *e_out = poisoned((size_t)N * C);
    char name[64];
    cpu->embedding_forward(out, tok, wte, wpe, N, T, C, v_start, v_local, NULL);
    cuda_embedding_forward(e_out, tok, wte, wpe, N, T, C, v_start, v_local, NULL);
    check_launch("embedding_forward");
    snprintf(name, sizeof name, "embedding_forward C=%d", C);
    compare(name, e_out, out, (size_t)N * C, 1e-6);
    free(e_out), e_out = poisoned((size_t)N * C);
    cpu->embedding_forward(out, tok, wte, NULL, N, T, C, v_start, v_local, NULL);
    cuda_embedding_forward(e_out, tok, wte, NULL, N, T, C, v_start, v_local, NULL);
    check_launch("embedding_forward");
    compare("embedding_forward (no wpe)", e_out, out, (size_t)N * C, 1e-6);

    float *dout = host_randn((size_t)N * C, 1, 3);
    float *dwte = host_randn((size_t)v_local * C, 1, 4), *dwpe = host_randn((size_t)T * C, 1, 5);
    float *e_dwte = dup(dwte, (size_t)v_local * C), *e_dwpe = dup(dwpe, (size_t)T * C);
    cpu->embedding_backward(dwte, dwpe, dout, tok, N, T, C, v_start, v_local, NULL);
    cuda_embedding_backward(e_dwte, e_dwpe, dout, tok, N, T, C, v_start, v_local, NULL);
    check_launch("embedding_backward");
    compare("embedding_backward dwte", e_dwte, dwte, (size_t)v_local * C, 1e-5);
    compare("embedding_backward dwpe", e_dwpe, dwpe, (size_t)T * C, 1e-5);
    free(wte), free(wpe), free(out), free(e_out), free(dout), free(dwte), free(dwpe);
    free(e_dwte), free(e_dwpe);
}

static void test_layernorm(int N, int C) {
    float *inp = host_randn((size_t)N * C, 2, 10), *w = host_randn(C, 1, 11), *b = host_randn(C, 1, 12);
    float *out = malloc((size_t)N * C * sizeof(float)), *mean = malloc(N * sizeof(float));
    float *rstd = malloc(N * sizeof(float));
    float *e_out = poisoned((size_t)N * C), *e_mean = poisoned(N), *e_rstd = poisoned(N);
    cpu->layernorm_forward(out, mean, rstd, inp, w, b, N, C, NULL);
    cuda_layernorm_forward(e_out, e_mean, e_rstd, inp, w, b, N, C, NULL);
    check_launch("layernorm_forward");
    char name[64];
    snprintf(name, sizeof name, "layernorm_forward C=%d", C);
    compare(name, e_out, out, (size_t)N * C, 1e-5);
    compare("layernorm_forward mean", e_mean, mean, N, 1e-5);
    compare("layernorm_forward rstd", e_rstd, rstd, N, 1e-5);

    float *dout = host_randn((size_t)N * C, 1, 13);
    float *dinp = host_randn((size_t)N * C, 1, 14), *dw = host_randn(C, 1, 15), *db = host_randn(C, 1, 16);
    float *e_dinp = dup(dinp, (size_t)N * C), *e_dw = dup(dw, C), *e_db = dup(db, C);
    cpu->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, NULL);
    cuda_layernorm_backward(e_dinp, e_dw, e_db, dout, inp, w, e_mean, e_rstd, N, C, NULL);
    check_launch("layernorm_backward");
    compare("layernorm_backward dinp", e_dinp, dinp, (size_t)N * C, 1e-5);
    compare("layernorm_backward dw", e_dw, dw, C, 1e-5);
    compare("layernorm_backward db", e_db, db, C, 1e-5);
    free(inp), free(w), free(b), free(out), free(mean), free(rstd), free(e_out), free(e_mean);
    free(e_rstd), free(dout), free(dinp), free(dw), free(db), free(e_dinp), free(e_dw), free(e_db);
}

/* The bias gradient of the matmul: dbias[OC] += column sums of dout[N,OC]. */
static void test_bias_backward(int N, int OC) {
    float *dout = host_randn((size_t)N * OC, 1, 23), *dbias = host_randn(OC, 1, 25);
    float *e_dbias = dup(dbias, OC);
    cpu->matmul_backward(NULL, NULL, dbias, dout, NULL, NULL, N, 1, OC, 0, NULL);
    cuda_bias_backward(e_dbias, dout, N, OC, NULL);
    check_launch("bias_backward");
    char name[64];
    snprintf(name, sizeof name, "bias_backward %dx%d", N, OC);
    compare(name, e_dbias, dbias, OC, 1e-5);
    free(dout), free(dbias), free(e_dbias);
}

static void test_attention(int B, int T, int C, int NH) {
    size_t nqkv = (size_t)B * T * 3 * C, ny = (size_t)B * T * C, nlse = (size_t)B * NH * T;
    float *qkv = host_randn(nqkv, 1, 30), *out = malloc(ny * sizeof(float));
    float *att = malloc(cpu->attention_state_floats(B, T, NH) * sizeof(float));
    float *datt = malloc(cpu->attention_state_floats(B, T, NH) * sizeof(float));
    float *e_out = poisoned(ny), *e_lse = poisoned(nlse), *e_scratch = poisoned(nlse);
    cpu->attention_forward(out, att, qkv, B, T, C, NH, NULL);
    cuda_attention_forward(e_out, e_lse, qkv, B, T, C, NH, NULL);
    check_launch("attention_forward");
    char name[96];
    snprintf(name, sizeof name, "attention_forward T=%d hs=%d", T, C / NH);
    compare(name, e_out, out, ny, 1e-5);

    float *dout = host_randn(ny, 1, 31), *dqkv = malloc(nqkv * sizeof(float));
    float *e_dqkv = poisoned(nqkv);
    cpu->attention_backward(dqkv, datt, dout, out, qkv, att, B, T, C, NH, NULL);
    cuda_attention_backward(e_dqkv, e_scratch, dout, e_out, qkv, e_lse, B, T, C, NH, NULL);
    check_launch("attention_backward");
    compare("attention_backward dqkv", e_dqkv, dqkv, nqkv, 1e-5);
    free(qkv), free(out), free(att), free(datt), free(e_out), free(e_lse), free(e_scratch);
    free(dout), free(dqkv), free(e_dqkv);
}

/* A head size above 128 has no kernel: the launchers report it as a launch error. */
static void test_attention_unsupported(void) {
    float x[4] = {0};
    cuda_attention_forward(x, x, x, 1, 1, 258, 2, NULL);
    int fwd = cuda_check_launch();
    cuda_attention_backward(x, x, x, x, x, x, 1, 1, 258, 2, NULL);
    int bwd = cuda_check_launch();
    printf("%s %-28s launch errors %d, %d\n", fwd && bwd ? "ok  " : "FAIL",
           "attention hs=129 refused", fwd, bwd);
    if (!(fwd && bwd)) g_failures++;
    /* the bf16 kernels exist for hs 64 and 128 only */
    cuda_attention_forward_bf16(x, x, x, 1, 1, 96, 3, NULL);
    fwd = cuda_check_launch();
    cuda_attention_backward_bf16(x, x, x, x, x, x, 1, 1, 96, 3, NULL);
    bwd = cuda_check_launch();
    printf("%s %-28s launch errors %d, %d\n", fwd && bwd ? "ok  " : "FAIL",
           "attention bf16 hs=32 refused", fwd, bwd);
    if (!(fwd && bwd)) g_failures++;
}

/* bf16 rounding (engine/cuda/bf16.h) on values whose nearest bf16 is known: ties go to
 * the even neighbour, a carry rounds the exponent up (to infinity past the largest
 * bf16), NaN stays NaN of the same sign. */
static void test_bf16_round(void) {
    static const struct {
        uint32_t in;
        uint16_t out;
    } cases[] = {
        {0x3f800000u, 0x3f80}, /* 1 */
        {0x3f808000u, 0x3f80}, /* 1 + 2^-8: a tie, to the even 1 */
        {0x3f818000u, 0x3f82}, /* 1 + 3 2^-8: a tie, to the even 1 + 2^-6 */
        {0x3f808001u, 0x3f81}, /* just above the tie: up */
        {0x3f807fffu, 0x3f80}, /* just below: down */
        {0xbf818000u, 0xbf82}, /* the same tie, negative */
        {0x3fffffffu, 0x4000}, /* carry into the exponent */
        {0x7f7fffffu, 0x7f80}, /* FLT_MAX: past the largest bf16 and its half ulp: inf */
        {0x7f800000u, 0x7f80}, /* inf */
        {0x00000001u, 0x0000}, /* the smallest denormal: to zero */
        {0x80000000u, 0x8000}, /* -0 */
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float x;
        memcpy(&x, &cases[i].in, sizeof x);
        if (bf16_bits(x) != cases[i].out) {
            printf("FAIL bf16_bits(0x%08x) = 0x%04x, not 0x%04x\n", (unsigned)cases[i].in,
                   (unsigned)bf16_bits(x), (unsigned)cases[i].out);
            bad = 1;
        }
    }
    uint16_t pn = bf16_bits(NAN), nn = bf16_bits(-NAN);
    if (!isnan(bf16_to_float(pn)) || !isnan(bf16_to_float(nn)) || (pn >> 15) || !(nn >> 15)) {
        printf("FAIL bf16_bits(NaN) = 0x%04x, 0x%04x\n", (unsigned)pn, (unsigned)nn);
        bad = 1;
    }
    printf("%s %-28s\n", bad ? "FAIL" : "ok  ", "bf16 rounding");
    g_failures += bad;
}

/* One emulated mma.sync m16n8k16 (fragments placed by mma_check.cu from the PTX ISA's
 * formulas) against a plain product: a wrong fragment layout in emu_mma.h moves
 * elements and fails by O(1). The operands are bf16 values, so only the order of the
 * fp32 sum differs. */
static void test_mma(void) {
    float a[16 * 16], b[16 * 8], c[16 * 8], d[16 * 8], ref[16 * 8];
    for (int i = 0; i < 16 * 16; i++) a[i] = bf16_nearest(rng_normal(70, i));
    for (int i = 0; i < 16 * 8; i++) b[i] = bf16_nearest(rng_normal(71, i));
    for (int i = 0; i < 16 * 8; i++) c[i] = rng_normal(72, i), d[i] = NAN;
    emu_mma_check(d, a, b, c);
    check_launch("mma_check");
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            double s = c[r * 8 + n];
            for (int k = 0; k < 16; k++) s += (double)a[r * 16 + k] * b[k * 8 + n];
            ref[r * 8 + n] = (float)s;
        }
    compare("mma m16n8k16 bf16 (emulated)", d, ref, 16 * 8, 1e-6);
}

/* 1 when x[n] and y[n] are bitwise equal */
static int same_bits(const float *x, const float *y, size_t n) {
    return memcmp(x, y, n * sizeof(float)) == 0;
}

/* The bf16 kernels against exact attention of the bf16-rounded inputs
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

/* compare, and the error must show the kernel's bf16 rounding (at least u/16) */
static void compare_bf16(const char *what, const float *got, const float *ref, size_t n,
                         double tol) {
    double max_ref = 0, max_err = 0;
    for (size_t i = 0; i < n; i++) {
        if (fabs(ref[i]) > max_ref) max_ref = fabs(ref[i]);
        double e = fabs((double)got[i] - ref[i]);
        if (e > max_err || e != e) max_err = e;
    }
    int failures = g_failures;
    compare(what, got, ref, n, tol);
    if (g_failures == failures && max_err < max_ref * BF16_U / 16) {
        printf("FAIL %-28s rel err %.3g: no sign of bf16 rounding (< u/16)\n", what,
               max_err / max_ref);
        g_failures++;
    }
}

static void test_attention_bf16(int B, int T, int NH, int hs, int offset) {
    int C = NH * hs;
    size_t nqkv = (size_t)B * T * 3 * C, ny = (size_t)B * T * C, nlse = (size_t)B * NH * T;
    float *qkv0 = host_randn(nqkv + offset, 1, 32), *dout0 = host_randn(ny + offset, 1, 33);
    float *qkv = qkv0 + offset, *dout = dout0 + offset;
    float *out = malloc(ny * sizeof(float)), *lse = malloc(nlse * sizeof(float));
    float *dqkv = malloc(nqkv * sizeof(float));
    attention_bf16_ref(out, lse, dqkv, qkv, dout, B, T, C, NH);
    float *e_out = poisoned(ny), *e_lse = poisoned(nlse), *e_scratch = poisoned(nlse);
    float *e_dqkv = poisoned(nqkv), *f_out = poisoned(ny), *f_lse = poisoned(nlse);
    float *f_dqkv = poisoned(nqkv);
    cuda_attention_forward_bf16(e_out, e_lse, qkv, B, T, C, NH, NULL);
    check_launch("attention_forward_bf16");
    char name[96];
    snprintf(name, sizeof name, "attention_fwd_bf16 T=%d hs=%d%s", T, hs,
             offset ? " unaligned" : "");
    compare_bf16(name, e_out, out, ny, 2 * BF16_U);
    compare("attention_fwd_bf16 lse", e_lse, lse, nlse, 1e-5);
    cuda_attention_backward_bf16(e_dqkv, e_scratch, dout, e_out, qkv, e_lse, B, T, C, NH, NULL);
    check_launch("attention_backward_bf16");
    size_t rows = (size_t)B * T;
    float *got = malloc(ny * sizeof(float)), *ref = malloc(ny * sizeof(float)); /* [B,T,C] */
    static const char *const part_name[3] = {"attention_bwd_bf16 dq", "attention_bwd_bf16 dk",
                                             "attention_bwd_bf16 dv"};
    for (int part = 0; part < 3; part++) {
        qkv_part(got, e_dqkv, rows, C, part);
        qkv_part(ref, dqkv, rows, C, part);
        compare_bf16(part_name[part], got, ref, ny, 4 * BF16_U);
    }

    cuda_attention_forward(f_out, f_lse, qkv, B, T, C, NH, NULL);
    check_launch("attention_forward");
    cuda_attention_backward(f_dqkv, e_scratch, dout, f_out, qkv, f_lse, B, T, C, NH, NULL);
    check_launch("attention_backward");
    int same = same_bits(e_out, f_out, ny) + same_bits(e_dqkv, f_dqkv, nqkv);
    printf("%s %-28s\n", same ? "FAIL" : "ok  ", "attention bf16 != fp32");
    g_failures += same != 0;
    free(qkv0), free(dout0), free(out), free(lse), free(dqkv), free(e_out), free(e_lse);
    free(e_scratch), free(e_dqkv), free(f_out), free(f_lse), free(f_dqkv), free(got), free(ref);
}

/* offset floats into each buffer: 1 makes them misaligned, for the kernels' scalar paths */
static void test_elementwise(size_t n, int offset) {
    float *a0 = host_randn(n + offset, 2, 40), *b0 = host_randn(n + offset, 1, 41);
    float *a = a0 + offset, *b = b0 + offset, *out = malloc(n * sizeof(float));
    float *e_o0 = poisoned(n + offset), *e_a0 = dup(a0, n + offset), *e_out = e_o0 + offset;
    float *e_a = e_a0 + offset;
    char name[64];
    cpu->gelu_forward(out, a, n, NULL);
    cuda_gelu_forward(e_out, e_a, n, NULL);
    check_launch("gelu_forward");
    snprintf(name, sizeof name, "gelu_forward n=%zu%s", n, offset ? " unaligned" : "");
    compare(name, e_out, out, n, 1e-6);
    for (size_t i = 0; i < n; i++) e_out[i] = NAN;
    cpu->gelu_backward(out, a, b, n, NULL);
    cuda_gelu_backward(e_out, e_a, b, n, NULL);
    check_launch("gelu_backward");
    compare("gelu_backward", e_out, out, n, 1e-6);
    for (size_t i = 0; i < n; i++) e_out[i] = NAN;
    cpu->add(out, a, b, n, NULL);
    cuda_add(e_out, e_a, b, n, NULL);
    check_launch("add");
    compare("add", e_out, out, n, 0);
    cpu->scale(a, 0.37f, n, NULL);
    cuda_scale(e_a, 0.37f, n, NULL);
    check_launch("scale");
    compare("scale", e_a, a, n, 0);

    double s_cpu = cpu->sum_squares(b, n, NULL), s_emu = NAN;
    size_t np = cuda_sum_squares_partials();
    double *partial = malloc(np * sizeof(double)); /* [np] */
    for (size_t i = 0; i < np; i++) partial[i] = NAN;
    cuda_sum_squares(&s_emu, partial, b, n, NULL);
    check_launch("sum_squares");
    double rel = fabs(s_emu - s_cpu) / s_cpu;
    snprintf(name, sizeof name, "sum_squares n=%zu", n);
    printf("%s %-28s rel err %.3g\n", rel <= 1e-12 ? "ok  " : "FAIL", name, rel);
    if (!(rel <= 1e-12)) g_failures++;

    cuda_fill_nan(e_a, n, NULL);
    check_launch("fill_nan");
    size_t not_nan = 0;
    for (size_t i = 0; i < n; i++) not_nan += !isnan(e_a[i]);
    printf("%s %-28s %zu of %zu not NaN\n", not_nan ? "FAIL" : "ok  ", "fill_nan", not_nan, n);
    if (not_nan) g_failures++;
    free(a0), free(b0), free(out), free(e_o0), free(e_a0), free(partial);
}

static void test_cross_entropy(int N, int Vl, int v_valid, int v_start) {
    size_t n = (size_t)N * Vl;
    float *logits = host_randn(n, 3, 50), *mx = malloc(N * sizeof(float));
    float *stats = malloc(2 * (size_t)N * sizeof(float)), *losses = malloc(N * sizeof(float));
    int32_t *tgt = malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++) tgt[i] = (int32_t)((i * 53) % (v_start + v_valid + 20)); /* some on other ranks */
    float *e_logits = dup(logits, n), *e_mx = poisoned(N), *e_stats = poisoned(2 * (size_t)N);
    float *e_losses = poisoned(N);
    char name[64];
    cpu->vocab_max(mx, logits, N, Vl, v_valid, NULL);
    cuda_vocab_max(e_mx, e_logits, N, Vl, v_valid, NULL);
    check_launch("vocab_max");
    snprintf(name, sizeof name, "vocab_max %dx%d valid %d", N, Vl, v_valid);
    compare(name, e_mx, mx, N, 0);
    cpu->vocab_expsum(stats, logits, mx, tgt, N, Vl, v_valid, v_start, NULL);
    cuda_vocab_expsum(e_stats, e_logits, e_mx, tgt, N, Vl, v_valid, v_start, NULL);
    check_launch("vocab_expsum");
    compare("vocab_expsum stats", e_stats, stats, 2 * (size_t)N, 1e-5);
    compare("vocab_expsum exp(logits)", e_logits, logits, n, 1e-6);
    cpu->vocab_ce_finish(losses, logits, stats, tgt, N, Vl, v_valid, v_start, 0.01f, NULL);
    cuda_vocab_ce_finish(e_losses, e_logits, e_stats, tgt, N, Vl, v_valid, v_start, 0.01f, NULL);
    check_launch("vocab_ce_finish");
    compare("vocab_ce_finish losses", e_losses, losses, N, 1e-6);
    compare("vocab_ce_finish dlogits", e_logits, logits, n, 1e-6);
    free(logits), free(mx), free(stats), free(losses), free(tgt), free(e_logits), free(e_mx);
    free(e_stats), free(e_losses);
}

static void test_adamw(size_t n, int offset) {
    float *p0 = host_randn(n + offset, 1, 60), *g = host_randn(n, 1, 61);
    float *m = host_randn(n, 0.1f, 62), *v = host_randn(n, 0.1f, 63);
    for (size_t i = 0; i < n; i++) v[i] = v[i] * v[i];
    float *p = p0 + offset, *e_p0 = dup(p0, n + offset), *e_p = e_p0 + offset;
    float *e_m = dup(m, n), *e_v = dup(v, n);
    float bc1 = 1 - powf(0.9f, 3), bc2 = 1 - powf(0.95f, 3);
    cpu->adamw(p, g, m, v, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, bc1, bc2, NULL);
    cuda_adamw(e_p, g, e_m, e_v, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, bc1, bc2, NULL);
    check_launch("adamw");
    char name[64];
    snprintf(name, sizeof name, "adamw p n=%zu%s", n, offset ? " unaligned" : "");
    compare(name, e_p, p, n, 1e-6);
    compare("adamw m", e_m, m, n, 1e-6);
    compare("adamw v", e_v, v, n, 1e-6);
    free(p0), free(g), free(m), free(v), free(e_p0), free(e_m), free(e_v);
}

/* The flag already at (or past) the target: the wait kernel returns at once. */
static void test_wait_flag(void) {
    volatile unsigned int flag = 5;
    cuda_wait_flag(&flag, 5, NULL);
    cuda_wait_flag(&flag, 2, NULL);
    int e = cuda_check_launch();
    printf("%s %-28s launch error %d\n", e ? "FAIL" : "ok  ", "wait_flag", e);
    if (e) g_failures++;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* in order with the emulator's messages on stderr */
    cpu = cpu_backend();
    if (!cpu) {
        printf("FAIL: the CPU backend did not start\n");
        return 1;
    }
    test_embedding(48);
    test_embedding(45); /* C % 4 != 0: the scalar path */
    test_layernorm(37, 48);
    test_layernorm(64, 768);
    test_layernorm(5, 7000); /* 2C floats above 48 KiB: dw, db by atomics, no shared memory */
    test_bias_backward(37, 144);
    test_bias_backward(128, 64); /* several row slices */
    test_bias_backward(33, 5);
    test_attention(2, 37, 64, 4);   /* hs 16 */
    test_attention(1, 130, 128, 2); /* hs 64, T beyond one tile */
    test_attention(2, 64, 256, 2);  /* hs 128 */
    test_attention_unsupported();
    test_bf16_round();
    test_mma();
    test_attention_bf16(2, 37, 2, 64, 0);
    test_attention_bf16(1, 130, 2, 64, 0); /* 3 tiles, a partial last one */
    test_attention_bf16(1, 64, 1, 128, 0);
    test_attention_bf16(1, 70, 1, 64, 1);  /* qkv, dout not 16-byte aligned: scalar loads */
    /* test_cuda_ops.c has n = 1000003; here 100003 takes the same paths (several
     * grid-stride passes, 98 partial sums) at a tenth of the emulation time */
    test_elementwise(100003, 0);
    test_elementwise(1003, 1);
    test_cross_entropy(37, 101, 97, 0);
    test_cross_entropy(37, 101, 0, 101); /* a rank holding padding only */
    test_cross_entropy(19, 4096, 4096, 4096);
    test_adamw(100003, 0);
    test_adamw(1003, 1);
    test_wait_flag();
    if (g_failures) {
        printf("%d comparison(s) failed\n", g_failures);
        return 1;
    }
    printf("all emulated CUDA kernels match the CPU ops\n");
    return 0;
}
