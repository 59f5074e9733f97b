/* A backend that times every op of another one (profile.timing = kernel): each entry of
 * the table calls the inner op between two clock readings and files a record with the
 * main thread's current context (layer, micro-batch, phase). On the CPU ops run inline,
 * so the two readings bracket the op exactly; a device backend will take its records
 * from CUPTI instead. */
#include "engine/timed_backend.h"

#include "engine/timing.h"

#include <math.h>

static gptc_backend g_timed;
static const gptc_backend *g_inner;

/* Hunting a non-finite value: every op's output is scanned and the first op that wrote
 * one is kept. Host memory: the CPU backend's (a device backend copies first). */
static int g_hunt;
static timing_finite_report g_first;

static void done(const char *name, double t0) {
    timing_record_op(name, TK_COMPUTE, TP_NONE, 0, timing_context(), t0, timing_now_ms());
}

static void scan(const char *name, const float *x, size_t n) {
    if (!g_hunt || g_first.found || !x) return;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) {
            timing_ctx c = timing_context();
            g_first = (timing_finite_report){1, name, c.layer, c.micro, c.phase, timing_now_ms()};
            return;
        }
}

void timed_backend_hunt(int on) {
    g_hunt = on;
    if (on) g_first = (timing_finite_report){0};
}

timing_finite_report timed_backend_first_nonfinite(void) { return g_first; }

static void t_zero(void *p, size_t bytes, gptc_stream *s) {
    double t0 = timing_now_ms();
    g_inner->zero(p, bytes, s);
    done("zero", t0);
}

static void t_embedding_forward(float *out, const int32_t *tokens, const float *wte,
                                const float *wpe, int N, int T, int C, int v_start, int v_local,
                                gptc_stream *s) {
    double t0 = timing_now_ms();
    g_inner->embedding_forward(out, tokens, wte, wpe, N, T, C, v_start, v_local, s);
    done("embedding_fwd", t0);
    scan("embedding_fwd", out, (size_t)N * C);
}

static void t_embedding_backward(float *dwte, float *dwpe, const float *dout,
                                 const int32_t *tokens, int N, int T, int C, int v_start,
                                 int v_local, gptc_stream *s) {
    double t0 = timing_now_ms();
    g_inner->embedding_backward(dwte, dwpe, dout, tokens, N, T, C, v_start, v_local, s);
    done("embedding_bwd", t0);
    scan("embedding_bwd", dwte, (size_t)v_local * C);
}

static void t_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                const float *w, const float *b, int N, int C, gptc_stream *s) {
    double t0 = timing_now_ms();
    g_inner->layernorm_forward(out, mean, rstd, inp, w, b, N, C, s);
    done("layernorm_fwd", t0);
    scan("layernorm_fwd", out, (size_t)N * C);
}

static void t_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                 const float *inp, const float *w, const float *mean,
                                 const float *rstd, int N, int C, gptc_stream *s) {
    double t0 = timing_now_ms();
    g_inner->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, s);
    done("layernorm_bwd", t0);
    scan("layernorm_bwd", dinp, (size_t)N * C);
}

static void t_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                             int N, int IC, int OC, int w_rows_out, gptc_stream *s) {
    double t0 = timing_now_ms();
    g_inner->matmul_forward(out, inp, w, bias, N, IC, OC, w_rows_out, s);
    done(timing_matmul_name(0), t0);
    scan(timing_matmul_name(0), out, (size_t)N * OC);
}

static void t_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                              const float *inp, const float *w, int N, int IC, int OC,
                              int w_rows_out, gptc_stream *s) {
    double t0 = timing_now_ms();
    g_inner->matmul_backward(dinp, dw, dbias, dout, inp, w, N, IC, OC, w_rows_out, s);
    done(timing_matmul_name(1), t0);
    scan(timing_matmul_name(1), dinp, (size_t)N * IC);
    scan(timing_matmul_name(1), dw, (size_t)IC * OC);
}

static void t_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                int NH, gptc_stream *s) {
    double t0 = timing_now_ms();
    g_inner->attention_forward(out, att, qkv, B, T, C, NH, s);
    done("attention_fwd", t0);
    scan("attention_fwd", out, (size_t)B * T * C);
}

static void t_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                                 const float *att, int B, int T, int C, int NH, gptc_stream *s) {
    double t0 = timing_now_ms();
    g_inner->attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH, s);
    done("attention_bwd", t0);
    scan("attention_bwd", dqkv, (size_t)B * T * 3 * C);
}

static void t_gelu_forward(float *out, const float *inp, size_t n, gptc_stream *s) {
    double t0 = timing_now_ms();
    g_inner->gelu_forward(out, inp, n, s);
    done("gelu_fwd", t0);
    scan("gelu_fwd", out, n);
}

static void t_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n,
                            gptc_stream *s) {
    double t0 = timing_now_ms();
    g_inner->gelu_backward(dinp, inp, dout, n, s);
    done("gelu_bwd", t0);
    scan("gelu_bwd", dinp, n);
}

static void t_add(float *out, const float *a, const float *b, size_t n, gptc_stream *s) {
    double t0 = timing_now_ms();
    g_inner->add(out, a, b, n, s);
    done("residual_add", t0);
    scan("residual_add", out, n);
}

static void t_vocab_max(float *mx, const float *logits, int N, int Vl, int v_valid,
                        gptc_stream *s) {
    double t0 = timing_now_ms();
    g_inner->vocab_max(mx, logits, N, Vl, v_valid, s);
    done("loss_max", t0);
}

static void t_vocab_expsum(float *stats, float *logits, const float *mx, const int32_t *targets,
                           int N, int Vl, int v_valid, int v_start, gptc_stream *s) {
    double t0 = timing_now_ms();
    g_inner->vocab_expsum(stats, logits, mx, targets, N, Vl, v_valid, v_start, s);
    done("loss_expsum", t0);
    scan("loss_expsum", stats, 2 * (size_t)N);
}

static void t_vocab_ce_finish(float *losses, float *logits, const float *stats,
                              const int32_t *targets, int N, int Vl, int v_valid, int v_start,
                              float dloss, gptc_stream *s) {
    double t0 = timing_now_ms();
    g_inner->vocab_ce_finish(losses, logits, stats, targets, N, Vl, v_valid, v_start, dloss, s);
    done("loss_finish", t0);
    scan("loss_finish", losses, (size_t)N);
}

static double t_sum_squares(const float *x, size_t n, gptc_stream *s) {
    double t0 = timing_now_ms();
    double r = g_inner->sum_squares(x, n, s);
    done("grad_norm", t0);
    return r;
}

static void t_scale(float *x, float a, size_t n, gptc_stream *s) {
    double t0 = timing_now_ms();
    g_inner->scale(x, a, n, s);
    done("grad_clip", t0);
}

static void t_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr,
                    float beta1, float beta2, float eps, float decay, float bc1, float bc2,
                    gptc_stream *s) {
    double t0 = timing_now_ms();
    g_inner->adamw(p, g, m, v, n, lr, beta1, beta2, eps, decay, bc1, bc2, s);
    done("adamw", t0);
}

const gptc_backend *timed_backend(const gptc_backend *inner) {
    g_inner = inner;
    g_timed = *inner;
    g_timed.zero = t_zero;
    g_timed.embedding_forward = t_embedding_forward;
    g_timed.embedding_backward = t_embedding_backward;
    g_timed.layernorm_forward = t_layernorm_forward;
    g_timed.layernorm_backward = t_layernorm_backward;
    g_timed.matmul_forward = t_matmul_forward;
    g_timed.matmul_backward = t_matmul_backward;
    g_timed.attention_forward = t_attention_forward;
    g_timed.attention_backward = t_attention_backward;
    g_timed.gelu_forward = t_gelu_forward;
    g_timed.gelu_backward = t_gelu_backward;
    g_timed.add = t_add;
    g_timed.vocab_max = t_vocab_max;
    g_timed.vocab_expsum = t_vocab_expsum;
    g_timed.vocab_ce_finish = t_vocab_ce_finish;
    g_timed.sum_squares = t_sum_squares;
    g_timed.scale = t_scale;
    g_timed.adamw = t_adamw;
    return &g_timed;
}
