/* The CPU backend under GPTC_BF16, in two parts.
 *
 * 1. Every op on bf16 buffers against the contract of engine/backend.h, bit for bit: the
 *    same backend under GPTC_FP32 runs the op on the same values (widened to float) and
 *    its act outputs are rounded once (bf16_bits); the bf16 op's stored bits must be
 *    exactly those, and its fp32 outputs (LayerNorm statistics, parameter gradients,
 *    loss statistics, optimizer state) exactly the fp32 op's. A missing or double
 *    rounding, a "+=" that rounds its partial result before adding, or an operand read
 *    wrongly moves some elements by a bf16 step. Outputs start as a NaN sentinel, so an
 *    element left unwritten fails too. Under GPTC_FP32, to_act and adamw's parameter copy
 *    are plain copies.
 *
 * 2. The CPU's bf16 attention (cpu_attention_forward_bf16 / _backward_bf16, the reference
 * of the GPU's tensor-core kernels) against a naive double-precision attention that rounds
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
static const gptc_backend *be;

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
    printf("%s %-62s %.3g\n", ok ? "ok  " : "FAIL", what, v);
    if (!ok) g_failures++;
}

/* ------------------------------------------------------------------ part 1: the ops */

/* every buffer of part 1, freed at the end (LeakSanitizer then sees only real leaks) */
static void *g_bufs[512];
static int g_nbufs;

static void *keep(void *p) {
    if (g_nbufs < 512) g_bufs[g_nbufs++] = p;
    return p;
}

static const uint16_t SENTINEL = 0x7fc1; /* a NaN no op writes */

/* bf16 bits of n normal values times std, rounded (the values every op reads) */
static uint16_t *act_randn(size_t n, float std, uint64_t key) {
    uint16_t *h = keep(malloc(n * sizeof(uint16_t))); /* [n] */
    for (size_t i = 0; i < n; i++) h[i] = bf16_bits(std * rng_normal(key, i));
    return h;
}

static uint16_t *act_sentinel(size_t n) {
    uint16_t *h = keep(malloc(n * sizeof(uint16_t))); /* [n] */
    for (size_t i = 0; i < n; i++) h[i] = SENTINEL;
    return h;
}

static uint16_t *act_copy(const uint16_t *h, size_t n) {
    return memcpy(keep(malloc(n * sizeof(uint16_t))), h, n * sizeof(uint16_t));
}

/* the floats bf16 h[n] stands for: the fp32 reference's inputs */
static float *wide(const uint16_t *h, size_t n) {
    float *x = keep(malloc(n * sizeof(float))); /* [n] */
    for (size_t i = 0; i < n; i++) x[i] = bf16_to_float(h[i]);
    return x;
}

static float *f_randn(size_t n, float std, uint64_t key) {
    float *x = keep(malloc(n * sizeof(float))); /* [n] */
    for (size_t i = 0; i < n; i++) x[i] = std * rng_normal(key, i);
    return x;
}

static float *f_copy(const float *x, size_t n) {
    return memcpy(keep(malloc(n * sizeof(float))), x, n * sizeof(float));
}

/* The bf16 op's act output got[n] against the fp32 op's ref[n] rounded once. */
static void expect_rounded(const char *what, const uint16_t *got, const float *ref, size_t n) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != bf16_bits(ref[i]) && !bad++) first = i;
    char line[128];
    snprintf(line, sizeof line, "%s: act bits == round(fp32), mismatches", what);
    expect(line, bad == 0, (double)bad);
    if (bad)
        printf("     first at %zu: got %#06x (%.9g), round(fp32 %.9g) = %#06x\n", first,
               got[first], bf16_to_float(got[first]), ref[first], bf16_bits(ref[first]));
}

/* An fp32 output of the bf16 op against the fp32 op's, bit for bit */
static void expect_same(const char *what, const float *got, const float *ref, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp(&got[i], &ref[i], sizeof(float)) != 0;
    char line[128];
    snprintf(line, sizeof line, "%s: fp32 bits == fp32 op, mismatches", what);
    expect(line, bad == 0, (double)bad);
}

static void test_layernorm(int N, int C) {
    size_t nx = (size_t)N * C;
    uint16_t *x = act_randn(nx, 1.5f, 1), *w = act_randn(C, 1.0f, 2), *b = act_randn(C, 0.5f, 3);
    uint16_t *dy = act_randn(nx, 1.0f, 4), *dx0 = act_randn(nx, 0.3f, 5);
    uint16_t *y = act_sentinel(nx), *dx = act_copy(dx0, nx);
    float *mean = f_randn(N, 1, 6), *rstd = f_randn(N, 1, 7); /* [N] */
    float *dw = f_randn(C, 1, 8), *db = f_randn(C, 1, 9);      /* [C], "+=" */
    float *ds = f_randn(C, 1, 11);                               /* [C], "+=" */
    float *rmean = f_copy(mean, N), *rrstd = f_copy(rstd, N);
    float *rdw = f_copy(dw, C), *rdb = f_copy(db, C), *rds = f_copy(ds, C);
    float *ds0 = f_copy(ds, C);
    be->set_precision(GPTC_BF16);
    be->layernorm_forward(y, mean, rstd, x, w, b, N, C, NULL);
    be->layernorm_backward(dx, dw, db, ds, dy, x, w, mean, rstd, N, C, NULL);
    float *ry = f_randn(nx, 1, 10), *rdx = wide(dx0, nx); /* rdx: "+=" onto the old values */
    be->set_precision(GPTC_FP32);
    be->layernorm_forward(ry, rmean, rrstd, wide(x, nx), wide(w, C), wide(b, C), N, C, NULL);
    be->layernorm_backward(rdx, rdw, rdb, rds, wide(dy, nx), wide(x, nx), wide(w, C), rmean,
                           rrstd, N, C, NULL);
    /* dsum: the column sums of dinp as stored, each column's rows in order from its old
     * value (the order of the matmul backward's bias gradient, whose sums these replace) */
    float *sx = wide(dx, nx), *want = f_copy(ds0, C), *rwant = f_copy(ds0, C); /* [C] */
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            want[c] += sx[(size_t)n * C + c];
            rwant[c] += rdx[(size_t)n * C + c];
        }
    expect_same("layernorm bwd dsum += (bf16, as stored)", ds, want, C);
    expect_same("layernorm bwd dsum += (fp32)", rds, rwant, C);
    expect_rounded("layernorm fwd out", y, ry, nx);
    expect_same("layernorm fwd mean", mean, rmean, N);
    expect_same("layernorm fwd rstd", rstd, rrstd, N);
    expect_rounded("layernorm bwd dinp +=", dx, rdx, nx);
    expect_same("layernorm bwd dw +=", dw, rdw, C);
    expect_same("layernorm bwd db +=", db, rdb, C);
}

static void test_matmul(int N, int IC, int OC, int w_rows_out) {
    size_t nx = (size_t)N * IC, nw = (size_t)IC * OC, ny = (size_t)N * OC;
    uint16_t *x = act_randn(nx, 1.0f, 11), *w = act_randn(nw, 0.2f, 12);
    uint16_t *b = act_randn(OC, 0.5f, 13);
    uint16_t *dy = act_randn(ny, 1.0f, 14), *y = act_sentinel(ny), *dx = act_sentinel(nx);
    float *dw = f_randn(nw, 1, 15), *db = f_randn(OC, 1, 16); /* "+=" */
    float *rdw = f_copy(dw, nw), *rdb = f_copy(db, OC);
    be->set_precision(GPTC_BF16);
    be->matmul_forward(y, x, w, b, N, IC, OC, w_rows_out, NULL);
    be->matmul_backward(dx, dw, db, dy, x, w, N, IC, OC, w_rows_out, NULL);
    float *ry = f_randn(ny, 1, 17), *rdx = f_randn(nx, 1, 18);
    be->set_precision(GPTC_FP32);
    be->matmul_forward(ry, wide(x, nx), wide(w, nw), wide(b, OC), N, IC, OC, w_rows_out, NULL);
    be->matmul_backward(rdx, rdw, rdb, wide(dy, ny), wide(x, nx), wide(w, nw), N, IC, OC,
                        w_rows_out, NULL);
    const char *fwd = w_rows_out ? "matmul fwd (W rows out)" : "matmul fwd";
    const char *bwd = w_rows_out ? "matmul bwd (W rows out)" : "matmul bwd";
    expect_rounded(fwd, y, ry, ny);
    expect_rounded(bwd, dx, rdx, nx);
    char what[64];
    snprintf(what, sizeof what, "%s dw +=", bwd);
    expect_same(what, dw, rdw, nw);
    snprintf(what, sizeof what, "%s dbias +=", bwd);
    expect_same(what, db, rdb, OC);
}

/* The fused MLP ops: the GELU reads the fp32 sum (pre is rounded only as stored); dpre
 * is the product times gelu'(pre), rounded once. */
static void test_matmul_gelu(int N, int IC, int OC) {
    size_t nx = (size_t)N * IC, nw = (size_t)IC * OC, ny = (size_t)N * OC;
    uint16_t *x = act_randn(nx, 1.0f, 21), *w = act_randn(nw, 0.3f, 22);
    uint16_t *b = act_randn(OC, 0.5f, 23);
    uint16_t *pre = act_sentinel(ny), *y = act_sentinel(ny);
    /* the backward of the projection after the GELU: pre2[N,IC2] is its GELU's input */
    uint16_t *dout = act_randn(nx, 1.0f, 24), *dpre = act_sentinel(ny);
    be->set_precision(GPTC_BF16);
    be->matmul_gelu_forward(y, pre, x, w, b, N, IC, OC, NULL);
    /* dpre[N,OC] = (dout[N,IC] @ W2^T) * gelu'(pre): W2 [OC,IC] is w read as [IC2=OC, OC2=IC] */
    be->matmul_dgelu_backward(dpre, dout, w, pre, N, OC, IC, NULL);
    float *rpre = f_randn(ny, 1, 25), *ry = f_randn(ny, 1, 26), *rdpre = f_randn(ny, 1, 27);
    be->set_precision(GPTC_FP32);
    be->matmul_gelu_forward(ry, rpre, wide(x, nx), wide(w, nw), wide(b, OC), N, IC, OC, NULL);
    be->matmul_dgelu_backward(rdpre, wide(dout, nx), wide(w, nw), wide(pre, ny), N, OC, IC, NULL);
    expect_rounded("matmul_gelu fwd pre", pre, rpre, ny);
    expect_rounded("matmul_gelu fwd out (gelu of fp32 sum)", y, ry, ny);
    expect_rounded("matmul_dgelu bwd dpre", dpre, rdpre, ny);
}

static void test_elementwise(size_t n) {
    uint16_t *a = act_randn(n, 2.0f, 31), *b = act_randn(n, 2.0f, 32), *d = act_randn(n, 1.0f, 33);
    uint16_t *sum = act_sentinel(n), *g = act_sentinel(n), *dg = act_sentinel(n);
    uint16_t *inplace = act_copy(a, n); /* add(out = a, a, b): the residual stream's use */
    be->set_precision(GPTC_BF16);
    be->add(sum, a, b, n, NULL);
    be->add(inplace, inplace, b, n, NULL);
    be->gelu_forward(g, a, n, NULL);
    be->gelu_backward(dg, a, d, n, NULL);
    float *rsum = f_randn(n, 1, 34), *rg = f_randn(n, 1, 35), *rdg = f_randn(n, 1, 36);
    be->set_precision(GPTC_FP32);
    be->add(rsum, wide(a, n), wide(b, n), n, NULL);
    be->gelu_forward(rg, wide(a, n), n, NULL);
    be->gelu_backward(rdg, wide(a, n), wide(d, n), n, NULL);
    expect_rounded("add", sum, rsum, n);
    expect_rounded("add in place", inplace, rsum, n);
    expect_rounded("gelu fwd", g, rg, n);
    expect_rounded("gelu bwd", dg, rdg, n);
}

static void test_embedding(int N, int T, int C, int V) {
    int v_start = 3, v_local = V - 5; /* a vocab-parallel rank: some tokens are not its own */
    size_t ny = (size_t)N * C, nte = (size_t)v_local * C, npe = (size_t)T * C;
    int32_t *tok = keep(malloc(N * sizeof(int32_t))); /* [N] */
    for (int n = 0; n < N; n++) tok[n] = (n * 7 + 1) % V;
    uint16_t *wte = act_randn(nte, 1.0f, 41), *wpe = act_randn(npe, 1.0f, 42);
    uint16_t *dy = act_randn(ny, 1.0f, 43), *y = act_sentinel(ny);
    float *dwte = f_randn(nte, 1, 44), *dwpe = f_randn(npe, 1, 45); /* "+=" */
    float *rdwte = f_copy(dwte, nte), *rdwpe = f_copy(dwpe, npe);
    be->set_precision(GPTC_BF16);
    be->embedding_forward(y, tok, wte, wpe, N, T, C, v_start, v_local, NULL);
    be->embedding_backward(dwte, dwpe, dy, tok, N, T, C, v_start, v_local, NULL);
    float *ry = f_randn(ny, 1, 46);
    be->set_precision(GPTC_FP32);
    be->embedding_forward(ry, tok, wide(wte, nte), wide(wpe, npe), N, T, C, v_start, v_local, NULL);
    be->embedding_backward(rdwte, rdwpe, wide(dy, ny), tok, N, T, C, v_start, v_local, NULL);
    expect_rounded("embedding fwd", y, ry, ny);
    expect_same("embedding bwd dwte +=", dwte, rdwte, nte);
    expect_same("embedding bwd dwpe +=", dwpe, rdwpe, npe);
}

/* The three loss steps; the logits must stay as they were until the finish writes the
 * gradient over them. */
static void test_cross_entropy(int N, int Vl, int v_valid, int v_start) {
    size_t nl = (size_t)N * Vl;
    int32_t *tgt = keep(malloc(N * sizeof(int32_t))); /* [N]: some outside this rank */
    for (int n = 0; n < N; n++) tgt[n] = v_start - 2 + (n * 5) % (v_valid + 4);
    uint16_t *logits = act_randn(nl, 3.0f, 51), *l0 = act_copy(logits, nl);
    size_t ns = 2 * (size_t)N;
    float *mx = f_randn(N, 1, 52), *stats = f_randn(ns, 1, 53), *loss = f_randn(N, 1, 54);
    float *rmx = f_randn(N, 1, 55), *rstats = f_randn(ns, 1, 56), *rloss = f_randn(N, 1, 57);
    float *ref = wide(l0, nl);
    be->set_precision(GPTC_BF16);
    be->vocab_max(mx, logits, N, Vl, v_valid, NULL);
    be->vocab_expsum(stats, logits, mx, tgt, N, Vl, v_valid, v_start, NULL);
    int untouched = memcmp(logits, l0, nl * sizeof(uint16_t)) == 0;
    be->vocab_ce_finish(loss, logits, mx, stats, tgt, N, Vl, v_valid, v_start, 0.25f, NULL);
    be->set_precision(GPTC_FP32);
    be->vocab_max(rmx, ref, N, Vl, v_valid, NULL);
    be->vocab_expsum(rstats, ref, rmx, tgt, N, Vl, v_valid, v_start, NULL);
    expect_same("vocab_max", mx, rmx, N);
    expect_same("vocab_expsum stats", stats, rstats, ns);
    if (!untouched) {
        printf("FAIL vocab_expsum wrote the logits\n");
        g_failures++;
    }
    be->vocab_ce_finish(rloss, ref, rmx, rstats, tgt, N, Vl, v_valid, v_start, 0.25f, NULL);
    expect_same("vocab_ce_finish losses", loss, rloss, N);
    expect_rounded("vocab_ce_finish dlogits", logits, ref, nl);
}

static void test_attention(int B, int T, int C, int NH) {
    size_t nqkv = (size_t)B * T * 3 * C, ny = (size_t)B * T * C;
    size_t natt = be->attention_state_floats(B, T, NH);
    uint16_t *qkv = act_randn(nqkv, 1.0f, 61), *dy = act_randn(ny, 1.0f, 62);
    uint16_t *y = act_sentinel(ny), *dqkv = act_sentinel(nqkv);
    float *att = f_randn(natt, 1, 63), *datt = f_randn(natt, 1, 64);
    float *ratt = f_randn(natt, 1, 65), *rdatt = f_randn(natt, 1, 66);
    float *ry = f_randn(ny, 1, 67), *rdqkv = f_randn(nqkv, 1, 68);
    float *db0 = f_randn((size_t)3 * C, 1, 69), *db = f_copy(db0, (size_t)3 * C); /* [3C] */
    be->set_precision(GPTC_BF16);
    be->attention_forward(y, att, qkv, B, T, C, NH, NULL);
    be->attention_backward(dqkv, db, datt, dy, y, qkv, att, B, T, C, NH, NULL);
    be->set_precision(GPTC_FP32);
    /* dbias: the column sums of dqkv as stored (bf16), each column's rows in order from its
     * old value, as a GPU sums what it stores (from the unrounded values it differed, and
     * no run-level tolerance saw it) */
    float *sq = wide(dqkv, nqkv), *want = f_copy(db0, (size_t)3 * C); /* [3C] */
    for (size_t n = 0; n < (size_t)B * T; n++)
        for (int c = 0; c < 3 * C; c++) want[c] += sq[n * 3 * C + c];
    expect_same("attention bwd dbias += (bf16, as stored)", db, want, (size_t)3 * C);
    /* the reference: the bf16 attention on fp32 buffers, the backward reading the stored y */
    cpu_attention_forward_bf16(ry, ratt, wide(qkv, nqkv), B, T, C, NH);
    cpu_attention_backward_bf16(rdqkv, rdatt, wide(dy, ny), wide(y, ny), wide(qkv, nqkv), ratt,
                                B, T, C, NH);
    expect_rounded("attention fwd", y, ry, ny);
    expect_same("attention fwd probabilities", att, ratt, natt);
    expect_rounded("attention bwd", dqkv, rdqkv, nqkv);
}

/* One AdamW piece of n elements through the backend: decay 0.1, t such that bc1 = 0.5 and
 * bc2 = 0.3 */
static void adamw1(float *p, gptc_act *pa, const float *g, float gscale, float *m, float *v,
                   size_t n) {
    gptc_adamw_step h = {.gscale = gscale, .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f,
                         .eps = 1e-8f, .bc1 = 0.5f, .bc2 = 0.3f};
    be->adamw(&(gptc_adamw_piece){p, pa, g, m, v, n, 0.1f}, 1, &h, NULL);
}

static void test_adamw_to_act(size_t n) {
    float *p = f_randn(n, 1, 71), *g = f_randn(n, 1, 72), *m = f_randn(n, 0.1f, 73);
    float *v = f_randn(n, 0.1f, 74);
    for (size_t i = 0; i < n; i++) v[i] *= v[i];
    float *rp = f_copy(p, n), *rm = f_copy(m, n), *rv = f_copy(v, n);
    uint16_t *pa = act_sentinel(n);
    be->set_precision(GPTC_BF16);
    adamw1(p, pa, g, 1.0f, m, v, n);
    be->set_precision(GPTC_FP32);
    adamw1(rp, NULL, g, 1.0f, rm, rv, n);
    expect_same("adamw p", p, rp, n);
    expect_same("adamw m", m, rm, n);
    expect_same("adamw v", v, rv, n);
    expect_rounded("adamw p_act", pa, rp, n);

    /* to_act, with ties: 1 + 2^-8 rounds to 1 (even), 1 + 3 * 2^-8 up to 1 + 2^-6 */
    float *src = f_randn(n, 1, 75);
    src[0] = 1.0f + 0x1p-8f, src[1] = 1.0f + 0x3p-8f, src[2] = -(1.0f + 0x1p-8f);
    uint16_t *h = act_sentinel(n);
    be->set_precision(GPTC_BF16);
    be->to_act(h, src, n, NULL);
    expect_rounded("to_act", h, src, n);
    expect("to_act ties to even", h[0] == 0x3f80 && h[1] == 0x3f82 && h[2] == 0xbf80, h[1]);

    /* under fp32 the parameter copy is a float copy */
    be->set_precision(GPTC_FP32);
    float *fa = f_randn(n, 1, 76), *fb = f_copy(src, n);
    be->to_act(fa, src, n, NULL);
    be->to_act(fb, fb, n, NULL);
    expect_same("fp32 to_act copies", fa, src, n);
    expect_same("fp32 to_act in place", fb, src, n);
    float *p2 = f_copy(rp, n), *m2 = f_copy(rm, n), *v2 = f_copy(rv, n), *pc = f_randn(n, 1, 77);
    adamw1(p2, pc, g, 1.0f, m2, v2, n);
    adamw1(rp, rp, g, 1.0f, rm, rv, n);
    expect_same("fp32 adamw p_act (a copy)", pc, p2, n);
    expect_same("fp32 adamw p_act == p", rp, p2, n);

    /* gscale (the clipping coefficient) is a pass scaling g first, folded in: bit for bit */
    float *gs = f_copy(g, n);
    for (size_t i = 0; i < n; i++) gs[i] *= 0.37f;
    adamw1(p2, NULL, gs, 1.0f, m2, v2, n);
    adamw1(rp, NULL, g, 0.37f, rm, rv, n);
    expect_same("adamw gscale p", rp, p2, n);
    expect_same("adamw gscale m", rm, m2, n);
    expect_same("adamw gscale v", rv, v2, n);
}

static void test_ops(void) {
    test_layernorm(37, 72);
    test_matmul(37, 48, 80, 0);
    test_matmul(37, 48, 80, 1);
    test_matmul_gelu(29, 40, 96);
    test_elementwise(4099);
    test_embedding(40, 8, 24, 17);
    test_cross_entropy(13, 300, 290, 0);
    test_cross_entropy(13, 160, 150, 140); /* a second vocab-parallel rank */
    test_attention(2, 19, 32, 2);
    test_adamw_to_act(1000);
    be->set_precision(GPTC_FP32);
    while (g_nbufs) free(g_bufs[--g_nbufs]);
}

/* ------------------------------------------------------------------ part 2: attention */

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
    cpu_attention_backward(d32, NULL, datt, dy, y32, qkv, att, B, T, C, NH, NULL);
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
    be = cpu_backend(); /* loads OpenBLAS */
    if (!be) return 1;
    test_ops();
    run(2, 37, 64, 4);   /* hs 16, a tail past any tile */
    run(1, 130, 128, 2); /* hs 64 */
    if (g_failures) {
        printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    printf("the CPU's bf16 ops round once, and its bf16 attention where the kernels do\n");
    return 0;
}
