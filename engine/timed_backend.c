/* A backend that times every op of another one (profile.timing = kernel): each entry of
 * the table calls the inner op between two clock readings and files a record with the
 * main thread's current context (layer, micro-batch, phase). On the CPU ops run inline,
 * so the two readings bracket the op exactly. A device backend's ops only enqueue work,
 * so there the two readings are marks of the device's own timer (CUDA events) on the op's
 * stream, resolved into times after the step. Each op is also an NVTX range, so that an
 * Nsight Systems capture shows gptc's names over the kernels. */
#include "engine/timed_backend.h"

#include "engine/nvtx.h"
#include "engine/timing.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static gptc_backend g_timed;
static const gptc_backend *g_inner;

/* Hunting a non-finite value: every op's output is scanned and the first op that wrote
 * one is kept. Host memory: the CPU backend's (a device backend copies first). */
static int g_hunt;
static timing_finite_report g_first;

/* Where an op began: a host clock reading, or the handle of the device's timer when the
 * inner backend has one (its ops return before they run). */
typedef struct {
    double ms;
    int op;
} op_start;

static op_start begin(const char *name, gptc_stream *s) {
    nvtx_push(name);
    if (g_inner->timer_begin) return (op_start){0, g_inner->timer_begin(s)};
    return (op_start){timing_now_ms(), -1};
}

static void done(const char *name, op_start t0, gptc_stream *s) {
    if (t0.op >= 0) {
        g_inner->timer_end(t0.op, s);
        timing_record_device(name, TK_COMPUTE, TP_NONE, 0, timing_context(), t0.op);
    } else {
        timing_record_op(name, TK_COMPUTE, TP_NONE, 0, timing_context(), t0.ms, timing_now_ms());
    }
    nvtx_pop();
}

/* A device's output is copied to the host first; a replay is slow anyway. */
static unsigned char *g_scan_buf; /* [g_scan_cap] host copy of a device output */
static size_t g_scan_cap;

static int finite_at(const void *x, size_t i, size_t elem) {
    if (elem == 2) { /* bf16: the exponent bits all ones mean Inf or NaN */
        uint16_t h;
        memcpy(&h, (const char *)x + 2 * i, 2);
        return (h & 0x7f80u) != 0x7f80u;
    }
    return isfinite(((const float *)x)[i]);
}

/* x[n] of elem-byte elements: float, or bf16 (an activation-type buffer) */
static void scan_elems(const char *name, const void *x, size_t n, size_t elem) {
    if (!g_hunt || g_first.found || !x) return;
    if (g_inner->on_device) {
        if (n * elem > g_scan_cap) {
            unsigned char *p = realloc(g_scan_buf, n * elem);
            if (!p) return;
            g_scan_buf = p;
            g_scan_cap = n * elem;
        }
        g_inner->copy_to_host(g_scan_buf, x, n * elem, NULL);
        x = g_scan_buf;
    }
    for (size_t i = 0; i < n; i++)
        if (!finite_at(x, i, elem)) {
            timing_ctx c = timing_context();
            g_first = (timing_finite_report){1, name, c.layer, c.micro, c.phase, timing_now_ms()};
            return;
        }
}

static void scan(const char *name, const float *x, size_t n) {
    scan_elems(name, x, n, sizeof(float));
}
static void scan_act(const char *name, const gptc_act *x, size_t n) {
    scan_elems(name, x, n, gptc_act_bytes(g_inner->get_precision()));
}

void timed_backend_hunt(int on) {
    g_hunt = on;
    if (on) g_first = (timing_finite_report){0};
}

timing_finite_report timed_backend_first_nonfinite(void) { return g_first; }

static void t_zero(void *p, size_t bytes, gptc_stream *s) {
    op_start t0 = begin("zero", s);
    g_inner->zero(p, bytes, s);
    done("zero", t0, s);
}

static void t_embedding_forward(gptc_act *out, const int32_t *tokens, const gptc_act *wte,
                                const gptc_act *wpe, int N, int T, int C, int v_start, int v_local,
                                gptc_stream *s) {
    op_start t0 = begin("embedding_fwd", s);
    g_inner->embedding_forward(out, tokens, wte, wpe, N, T, C, v_start, v_local, s);
    done("embedding_fwd", t0, s);
    scan_act("embedding_fwd", out, (size_t)N * C);
}

static void t_embedding_backward(float *dwte, float *dwpe, const gptc_act *dout,
                                 const int32_t *tokens, int N, int T, int C, int v_start,
                                 int v_local, gptc_stream *s) {
    op_start t0 = begin("embedding_bwd", s);
    g_inner->embedding_backward(dwte, dwpe, dout, tokens, N, T, C, v_start, v_local, s);
    done("embedding_bwd", t0, s);
    scan("embedding_bwd", dwte, (size_t)v_local * C);
}

static void t_layernorm_forward(gptc_act *out, float *mean, float *rstd, const gptc_act *inp,
                                const gptc_act *w, const gptc_act *b, int N, int C, gptc_stream *s) {
    op_start t0 = begin("layernorm_fwd", s);
    g_inner->layernorm_forward(out, mean, rstd, inp, w, b, N, C, s);
    done("layernorm_fwd", t0, s);
    scan_act("layernorm_fwd", out, (size_t)N * C);
}

static void t_add_layernorm_forward(gptc_act *res, gptc_act *out, float *mean, float *rstd,
                                    const gptc_act *a, const gptc_act *b, const gptc_act *w,
                                    const gptc_act *bias, int N, int C, gptc_stream *s) {
    op_start t0 = begin("add_layernorm_fwd", s);
    g_inner->add_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, C, s);
    done("add_layernorm_fwd", t0, s);
    scan_act("add_layernorm_fwd", res, (size_t)N * C);
    scan_act("add_layernorm_fwd", out, (size_t)N * C);
}

static void t_layernorm_backward(gptc_act *dinp, float *dw, float *db, float *dsum,
                                 const gptc_act *dout,
                                 const gptc_act *inp, const gptc_act *w, const float *mean,
                                 const float *rstd, int N, int C, gptc_stream *s) {
    op_start t0 = begin("layernorm_bwd", s);
    g_inner->layernorm_backward(dinp, dw, db, dsum, dout, inp, w, mean, rstd, N, C, s);
    done("layernorm_bwd", t0, s);
    scan_act("layernorm_bwd", dinp, (size_t)N * C);
}

static void t_matmul_forward(gptc_act *out, const gptc_act *inp, const gptc_act *w,
                             const gptc_act *bias,
                             int N, int IC, int OC, int w_rows_out, gptc_stream *s) {
    op_start t0 = begin(timing_matmul_name(0), s);
    g_inner->matmul_forward(out, inp, w, bias, N, IC, OC, w_rows_out, s);
    done(timing_matmul_name(0), t0, s);
    scan_act(timing_matmul_name(0), out, (size_t)N * OC);
}

static void t_matmul_gelu_forward(gptc_act *out, gptc_act *pre, const gptc_act *inp,
                                  const gptc_act *w, const gptc_act *bias, int N, int IC, int OC, gptc_stream *s) {
    op_start t0 = begin(timing_matmul_gelu_name(0), s);
    g_inner->matmul_gelu_forward(out, pre, inp, w, bias, N, IC, OC, s);
    done(timing_matmul_gelu_name(0), t0, s);
    scan_act(timing_matmul_gelu_name(0), out, (size_t)N * OC);
}

static void t_matmul_dgelu_backward(gptc_act *dpre, const gptc_act *dout, const gptc_act *w,
                                    const gptc_act *pre, int N, int IC, int OC, gptc_stream *s) {
    op_start t0 = begin(timing_matmul_gelu_name(1), s);
    g_inner->matmul_dgelu_backward(dpre, dout, w, pre, N, IC, OC, s);
    done(timing_matmul_gelu_name(1), t0, s);
    scan_act(timing_matmul_gelu_name(1), dpre, (size_t)N * IC);
}

static void t_matmul_backward(gptc_act *dinp, float *dw, float *dbias, const gptc_act *dout,
                              const gptc_act *inp, const gptc_act *w, int N, int IC, int OC,
                              int w_rows_out, gptc_stream *s) {
    op_start t0 = begin(timing_matmul_name(1), s);
    g_inner->matmul_backward(dinp, dw, dbias, dout, inp, w, N, IC, OC, w_rows_out, s);
    done(timing_matmul_name(1), t0, s);
    scan_act(timing_matmul_name(1), dinp, (size_t)N * IC);
    scan(timing_matmul_name(1), dw, (size_t)IC * OC);
}

static void t_attention_forward(gptc_act *out, float *att, const gptc_act *qkv, int B, int T, int C,
                                int NH, gptc_stream *s) {
    op_start t0 = begin("attention_fwd", s);
    g_inner->attention_forward(out, att, qkv, B, T, C, NH, s);
    done("attention_fwd", t0, s);
    scan_act("attention_fwd", out, (size_t)B * T * C);
}

static void t_attention_backward(gptc_act *dqkv, float *dbias, float *datt, const gptc_act *dout,
                                 const gptc_act *out, const gptc_act *qkv, const float *att,
                                 int B, int T, int C, int NH, gptc_stream *s) {
    op_start t0 = begin("attention_bwd", s);
    g_inner->attention_backward(dqkv, dbias, datt, dout, out, qkv, att, B, T, C, NH, s);
    done("attention_bwd", t0, s);
    scan_act("attention_bwd", dqkv, (size_t)B * T * 3 * C);
}

static void t_gelu_forward(gptc_act *out, const gptc_act *inp, size_t n, gptc_stream *s) {
    op_start t0 = begin("gelu_fwd", s);
    g_inner->gelu_forward(out, inp, n, s);
    done("gelu_fwd", t0, s);
    scan_act("gelu_fwd", out, n);
}

static void t_gelu_backward(gptc_act *dinp, const gptc_act *inp, const gptc_act *dout, size_t n,
                            gptc_stream *s) {
    op_start t0 = begin("gelu_bwd", s);
    g_inner->gelu_backward(dinp, inp, dout, n, s);
    done("gelu_bwd", t0, s);
    scan_act("gelu_bwd", dinp, n);
}

static void t_add(gptc_act *out, const gptc_act *a, const gptc_act *b, size_t n, gptc_stream *s) {
    op_start t0 = begin("residual_add", s);
    g_inner->add(out, a, b, n, s);
    done("residual_add", t0, s);
    scan_act("residual_add", out, n);
}

static void t_vocab_max(float *mx, const gptc_act *logits, int N, int Vl, int v_valid,
                        gptc_stream *s) {
    op_start t0 = begin("loss_max", s);
    g_inner->vocab_max(mx, logits, N, Vl, v_valid, s);
    done("loss_max", t0, s);
}

static void t_vocab_expsum(float *stats, const gptc_act *logits, const float *mx,
                           const int32_t *targets, int N, int Vl, int v_valid, int v_start,
                           gptc_stream *s) {
    op_start t0 = begin("loss_expsum", s);
    g_inner->vocab_expsum(stats, logits, mx, targets, N, Vl, v_valid, v_start, s);
    done("loss_expsum", t0, s);
    scan("loss_expsum", stats, 2 * (size_t)N);
}

static void t_vocab_ce_finish(float *losses, gptc_act *logits, const float *mx,
                              const float *stats, const int32_t *targets, int N, int Vl,
                              int v_valid, int v_start, float dloss, gptc_stream *s) {
    op_start t0 = begin("loss_finish", s);
    g_inner->vocab_ce_finish(losses, logits, mx, stats, targets, N, Vl, v_valid, v_start, dloss,
                             s);
    done("loss_finish", t0, s);
    scan("loss_finish", losses, (size_t)N);
}

static void t_cross_entropy(float *losses, gptc_act *logits, float *mx, float *stats,
                            const int32_t *targets, int N, int Vl, int v_valid, float dloss,
                            gptc_stream *s) {
    op_start t0 = begin("loss", s);
    g_inner->cross_entropy(losses, logits, mx, stats, targets, N, Vl, v_valid, dloss, s);
    done("loss", t0, s);
    scan("loss", stats, 2 * (size_t)N);
    scan("loss", losses, (size_t)N);
}

static double t_sum_squares(const float *x, size_t n, gptc_stream *s) {
    op_start t0 = begin("grad_norm", s);
    double r = g_inner->sum_squares(x, n, s);
    done("grad_norm", t0, s);
    return r;
}

static void t_adamw(float *p, gptc_act *p_act, const float *g, float gscale, float *m, float *v,
                    size_t n, float lr, float beta1, float beta2, float eps, float decay,
                    float bc1, float bc2, gptc_stream *s) {
    op_start t0 = begin("adamw", s);
    g_inner->adamw(p, p_act, g, gscale, m, v, n, lr, beta1, beta2, eps, decay, bc1, bc2, s);
    done("adamw", t0, s);
}

const gptc_backend *timed_backend(const gptc_backend *inner) {
    g_inner = inner;
    g_timed = *inner;
    g_timed.zero = t_zero;
    g_timed.embedding_forward = t_embedding_forward;
    g_timed.embedding_backward = t_embedding_backward;
    g_timed.layernorm_forward = t_layernorm_forward;
    g_timed.add_layernorm_forward = t_add_layernorm_forward;
    g_timed.layernorm_backward = t_layernorm_backward;
    g_timed.matmul_forward = t_matmul_forward;
    g_timed.matmul_backward = t_matmul_backward;
    g_timed.matmul_gelu_forward = t_matmul_gelu_forward;
    g_timed.matmul_dgelu_backward = t_matmul_dgelu_backward;
    g_timed.attention_forward = t_attention_forward;
    g_timed.attention_backward = t_attention_backward;
    g_timed.gelu_forward = t_gelu_forward;
    g_timed.gelu_backward = t_gelu_backward;
    g_timed.add = t_add;
    g_timed.vocab_max = t_vocab_max;
    g_timed.vocab_expsum = t_vocab_expsum;
    g_timed.vocab_ce_finish = t_vocab_ce_finish;
    g_timed.cross_entropy = t_cross_entropy;
    g_timed.sum_squares = t_sum_squares;
    g_timed.adamw = t_adamw;
    return &g_timed;
}
