/* Finite-difference gradient checks of every CPU op's backward and of the whole model.
 *
 * Each op is wrapped as a scalar L = sum(op(x) * R) for a fixed random R (accumulated in
 * double); its backward with dout = R must give dL/dx. Central differences in fp32 carry
 * rounding noise of about eps_f32 * |L| / h, so inputs are kept small and the check is
 * |fd - analytic| <= ATOL + RTOL * max(|fd|, |analytic|): a wrong formula misses by O(1). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/rng.h"
#include "engine/watchdog.h"
#include "layers/gpt.h"

static const double RTOL = 1e-2, ATOL = 2e-4;
static int g_failures = 0;

/* every test buffer, freed at exit so that LeakSanitizer sees only real leaks */
static void *g_buffers[256];
static int g_n_buffers;

static float *keep(float *p) {
    if (g_n_buffers < 256) g_buffers[g_n_buffers++] = p;
    return p;
}

static float *randn(size_t n, float std, uint64_t key) {
    float *x = keep(malloc(n * sizeof(float))); /* [n] */
    for (size_t i = 0; i < n; i++) x[i] = std * rng_normal(key, i);
    return x;
}

static float *zeros(size_t n) { return keep(calloc(n, sizeof(float))); }

static double dot(const float *y, const float *r, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)y[i] * r[i];
    return s;
}

typedef double (*scalar_fn)(void *ctx);

static size_t gcd(size_t a, size_t b) {
    while (b) {
        size_t t = a % b;
        a = b, b = t;
    }
    return a;
}

/* The distance between probes: about n / count, so that they spread over the whole
 * tensor, and coprime to n, so that they are distinct and step through every column of
 * a [rows, C] tensor in turn (C divides n). A step sharing a factor with C reaches only
 * some columns: the old (i * 7919 + 13) % n probed odd columns alone wherever C was 16
 * or 40, and a backward that dropped every even channel's gradient passed. */
static size_t probe_step(size_t n, size_t count) {
    size_t step = count < n ? n / count : 1;
    while (gcd(step, n) != 1) step++;
    return step;
}

/* Element k of the count probes of an n-element tensor. */
static size_t probe_at(size_t n, size_t count, size_t k) {
    return (13 + k * probe_step(n, count)) % n;
}

/* Compares grad[idx] with central differences of f at min(n, max_checks) elements of x
 * (probe_at). */
static void check(const char *what, float *x, const float *grad, size_t n, scalar_fn f,
                  void *ctx, float h, int max_checks) {
    double worst = 0;
    size_t count = (size_t)max_checks < n ? (size_t)max_checks : n, bad_at = 0;
    double bad_fd = 0, bad_an = 0;
    for (size_t k = 0; k < count; k++) {
        size_t idx = probe_at(n, count, k);
        float keep = x[idx];
        x[idx] = keep + h;
        double lp = f(ctx);
        x[idx] = keep - h;
        double lm = f(ctx);
        x[idx] = keep;
        double fd = (lp - lm) / (2.0 * h), an = grad[idx];
        double excess = fabs(fd - an) / (ATOL + RTOL * fmax(fabs(fd), fabs(an)));
        if (excess > worst) {
            worst = excess;
            bad_at = idx;
            bad_fd = fd;
            bad_an = an;
        }
    }
    int ok = worst <= 1.0;
    printf("%-4s %-34s worst error/tolerance %.3f%s\n", ok ? "ok" : "FAIL", what, worst,
           ok ? "" : "");
    if (!ok) {
        printf("     at element %zu: finite difference %.8g, analytic %.8g\n", bad_at, bad_fd, bad_an);
        g_failures++;
    }
}

static const gptc_backend *be;

/* ------------------------------------------------------------------ ops */

typedef struct { int N, C; float *inp, *w, *b, *out, *mean, *rstd, *r; } ln_ctx;
static double ln_loss(void *p) {
    ln_ctx *c = p;
    be->layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C, NULL);
    return dot(c->out, c->r, (size_t)c->N * c->C);
}
static void test_layernorm(void) {
    int N = 6, C = 40;
    ln_ctx c = {N, C, randn(N * C, 1.0f, 1), randn(C, 1.0f, 2), randn(C, 1.0f, 3), zeros(N * C),
                zeros(N), zeros(N), randn(N * C, 1.0f, 4)};
    for (int i = 0; i < C; i++) c.w[i] += 1.0f;
    float *dinp = zeros(N * C), *dw = zeros(C), *db = zeros(C);
    ln_loss(&c);
    be->layernorm_backward(dinp, dw, db, NULL, c.r, c.inp, c.w, c.mean, c.rstd, N, C, NULL);
    check("layernorm d/inp", c.inp, dinp, N * C, ln_loss, &c, 1e-2f, 60);
    check("layernorm d/weight", c.w, dw, C, ln_loss, &c, 1e-2f, 40);
    check("layernorm d/bias", c.b, db, C, ln_loss, &c, 1e-2f, 40);
}

typedef struct { int N, IC, OC, rows_out; float *inp, *w, *b, *out, *r; } mm_ctx;
static double mm_loss(void *p) {
    mm_ctx *c = p;
    be->matmul_forward(c->out, c->inp, c->w, c->b, c->N, c->IC, c->OC, c->rows_out, NULL);
    return dot(c->out, c->r, (size_t)c->N * c->OC);
}
static void test_matmul(int rows_out) {
    int N = 7, IC = 19, OC = 23;
    mm_ctx c = {N, IC, OC, rows_out, randn(N * IC, 1.0f, 5), randn(IC * OC, 0.5f, 6),
                rows_out ? NULL : randn(OC, 1.0f, 7), zeros(N * OC), randn(N * OC, 1.0f, 8)};
    float *dinp = zeros(N * IC), *dw = zeros(IC * OC), *db = zeros(OC);
    mm_loss(&c);
    be->matmul_backward(dinp, dw, c.b ? db : NULL, c.r, c.inp, c.w, N, IC, OC, rows_out, NULL);
    check(rows_out ? "matmul (W [out,in]) d/inp" : "matmul (W [in,out]) d/inp", c.inp, dinp,
          N * IC, mm_loss, &c, 1e-2f, 60);
    check(rows_out ? "matmul (W [out,in]) d/W" : "matmul (W [in,out]) d/W", c.w, dw, IC * OC,
          mm_loss, &c, 1e-2f, 60);
    if (c.b) check("matmul d/bias", c.b, db, OC, mm_loss, &c, 1e-2f, 23);
}

typedef struct { int B, T, C, NH; float *qkv, *out, *att, *r; } att_ctx;
static double att_loss(void *p) {
    att_ctx *c = p;
    be->attention_forward(c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH, NULL);
    return dot(c->out, c->r, (size_t)c->B * c->T * c->C);
}
static void test_attention(void) {
    int B = 2, T = 9, C = 16, NH = 4;
    att_ctx c = {B, T, C, NH, randn(B * T * 3 * C, 1.0f, 9), zeros(B * T * C),
                 zeros(B * NH * T * T), randn(B * T * C, 1.0f, 10)};
    float *dqkv = randn(B * T * 3 * C, 1.0f, 11); /* poisoned: backward must overwrite */
    float *datt = zeros(B * NH * T * T);
    att_loss(&c);
    be->attention_backward(dqkv, NULL, datt, c.r, c.out, c.qkv, c.att, B, T, C, NH, NULL);
    check("attention d/qkv", c.qkv, dqkv, B * T * 3 * C, att_loss, &c, 1e-2f, 200);
}

typedef struct { size_t n; float *inp, *out, *r; } gelu_ctx;
static double gelu_loss(void *p) {
    gelu_ctx *c = p;
    be->gelu_forward(c->out, c->inp, c->n, NULL);
    return dot(c->out, c->r, c->n);
}
static void test_gelu(void) {
    size_t n = 300;
    gelu_ctx c = {n, randn(n, 2.0f, 12), zeros(n), randn(n, 1.0f, 13)};
    float *dinp = zeros(n);
    be->gelu_backward(dinp, c.inp, c.r, n, NULL);
    check("gelu d/inp", c.inp, dinp, n, gelu_loss, &c, 1e-2f, 100);
}

typedef struct { int N, T, C; int32_t *tok; float *wte, *wpe, *out, *r; } emb_ctx;
static double emb_loss(void *p) {
    emb_ctx *c = p;
    be->embedding_forward(c->out, c->tok, c->wte, c->wpe, c->N, c->T, c->C, 0, 6, NULL);
    return dot(c->out, c->r, (size_t)c->N * c->C);
}
static void test_embedding(void) {
    int B = 3, T = 5, N = B * T, C = 8, V = 6;
    int32_t tok[15];
    for (int i = 0; i < N; i++) tok[i] = (i * 5 + 1) % V; /* repeats: scatter-add must sum */
    emb_ctx c = {N, T, C, tok, randn(V * C, 1.0f, 14), randn(T * C, 1.0f, 15), zeros(N * C),
                 randn(N * C, 1.0f, 16)};
    float *dwte = zeros(V * C), *dwpe = zeros(T * C);
    be->embedding_backward(dwte, dwpe, c.r, tok, N, T, C, 0, V, NULL);
    check("embedding d/wte", c.wte, dwte, V * C, emb_loss, &c, 1e-2f, 48);
    check("embedding d/wpe", c.wpe, dwpe, T * C, emb_loss, &c, 1e-2f, 40);
}

/* The loss as one rank computes it: the three vocab ops with nothing to all-reduce. */
static void crossentropy(float *losses, float *logits, const int32_t *y, int N, int V, int Vp) {
    float mx[8], stats[16];
    be->vocab_max(mx, logits, N, Vp, V, NULL);
    be->vocab_expsum(stats, logits, mx, y, N, Vp, V, 0, NULL);
    be->vocab_ce_finish(losses, logits, mx, stats, y, N, Vp, V, 0, 1.0f, NULL);
}

typedef struct { int N, V, Vp; float *logits, *work, *losses; int32_t *y; } ce_ctx;
static double ce_loss(void *p) {
    ce_ctx *c = p;
    memcpy(c->work, c->logits, sizeof(float) * c->N * c->Vp);
    crossentropy(c->losses, c->work, c->y, c->N, c->V, c->Vp);
    double s = 0;
    for (int i = 0; i < c->N; i++) s += c->losses[i];
    return s;
}
static void test_crossentropy(void) {
    int N = 5, V = 11, Vp = 16;
    int32_t y[5] = {0, 10, 3, 3, 7};
    ce_ctx c = {N, V, Vp, randn(N * Vp, 2.0f, 17), zeros(N * Vp), zeros(N), y};
    ce_loss(&c);
    float *grad = keep(malloc(sizeof(float) * N * Vp)); /* [N,Vp] */
    memcpy(grad, c.work, sizeof(float) * N * Vp);
    check("crossentropy d/logits", c.logits, grad, N * Vp, ce_loss, &c, 1e-2f, 80);
    /* padded logits must not matter and must get zero gradient */
    int pad_ok = 1;
    for (int n = 0; n < N; n++)
        for (int v = V; v < Vp; v++) pad_ok &= grad[n * Vp + v] == 0.0f;
    double before = ce_loss(&c);
    for (int n = 0; n < N; n++) c.logits[n * Vp + V] = 1e4f;
    pad_ok &= ce_loss(&c) == before;
    printf("%-4s %-34s\n", pad_ok ? "ok" : "FAIL", "crossentropy ignores padded vocab");
    if (!pad_ok) g_failures++;
}

/* ------------------------------------------------------------------ whole model */

typedef struct { gpt_model *m; int32_t *tok, *tgt; } model_ctx;
static double model_loss(void *p) {
    model_ctx *c = p;
    gpt_chunk_forward(c->m, 0, 0, c->tok, c->tgt, 0.0f);
    return gpt_loss_sum(c->m) / (c->m->B * c->m->T);
}
static void test_model(void) {
    gpt_shape s = {.n_layer = 2, .n_head = 2, .d_model = 16, .n_ctx = 12, .vocab_size = 37};
    int B = 2, T = 8, N = B * T;
    gpt_model m;
    char err[256];
    tp_context one = {.size = 1};
    if (gpt_create(&m, &s, B, T, 1, be, &one, NULL, err, sizeof(err)) != 0) {
        printf("FAIL gpt_create: %s\n", err);
        g_failures++;
        return;
    }
    /* the initialisation is progress for the watchdog, row by row: a large model's takes
     * longer than train.comm_timeout_s */
    long beats = watchdog_beats(), rows = 0;
    for (int i = 0; i < m.n_tensors; i++) rows += m.tensors[i].local_rows;
    gpt_init_random(&m, 1);
    if (watchdog_beats() - beats < rows) {
        printf("FAIL gpt_init_random: %ld watchdog beats for %ld rows\n", watchdog_beats() - beats,
               rows);
        g_failures++;
    }
    /* larger weights than GPT-2's init so every gradient is well above the noise */
    for (int i = 0; i < m.n_tensors; i++) {
        const param_tensor *t = &m.tensors[i];
        size_t real = (size_t)t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
        uint64_t key = rng_key(99, t->name);
        for (size_t j = 0; j < real; j++)
            m.params[t->offset + j] = (t->init == INIT_ONE ? 1.0f : 0.0f) + 0.3f * rng_normal(key, j);
    }
    int32_t tok[16], tgt[16];
    for (int i = 0; i < N; i++) {
        tok[i] = (i * 11 + 3) % 37;
        tgt[i] = (i * 17 + 5) % 37;
    }
    model_ctx c = {&m, tok, tgt};
    be->zero(m.grads, m.n_params * sizeof(float), NULL);
    gpt_forward_backward(&m, tok, tgt, 1.0f / N);
    for (int i = 0; i < m.n_tensors; i++) {
        const param_tensor *t = &m.tensors[i];
        size_t real = (size_t)t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
        char what[80];
        snprintf(what, sizeof(what), "model d/%s", t->name);
        check(what, m.params + t->offset, m.grads + t->offset, real, model_loss, &c, 1e-2f, 16);
    }
    gpt_destroy(&m);
}

/* The probes are distinct and reach as many columns of a [rows, C] tensor as there are
 * probes (up to C): the shapes the checks below probe. */
static void test_probes(void) {
    static const size_t shapes[][3] = {/* rows, C, probes */
                                       {1, 40, 40},  {16, 40, 60}, {16, 16, 16}, {1, 16, 16},
                                       {16, 48, 16}, {64, 16, 16}, {37, 16, 48}, {12, 16, 40}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        size_t rows = shapes[i][0], C = shapes[i][1], n = rows * C, count = shapes[i][2];
        if (count > n) count = n;
        unsigned char seen[4096] = {0}, col[64] = {0};
        size_t distinct = 0, cols = 0;
        for (size_t k = 0; k < count; k++) {
            size_t idx = probe_at(n, count, k);
            distinct += !seen[idx]++;
            cols += !col[idx % C]++;
        }
        size_t want = count < C ? count : C;
        int ok = distinct == count && cols == want;
        printf("%-4s probes of [%zu, %zu]: %zu distinct of %zu, %zu columns of %zu\n",
               ok ? "ok" : "FAIL", rows, C, distinct, count, cols, want);
        if (!ok) g_failures++;
    }
}

int main(void) {
    be = cpu_backend();
    if (!be) return 1;
    test_probes();
    test_embedding();
    test_layernorm();
    test_matmul(0);
    test_matmul(1);
    test_attention();
    test_gelu();
    test_crossentropy();
    test_model();
    for (int i = 0; i < g_n_buffers; i++) free(g_buffers[i]);
    printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "PASSED", g_failures);
    return g_failures ? 1 : 0;
}
