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
    if (!timing_on()) return (op_start){0, -1}; /* the table names the ops for NVTX alone */
    if (g_inner->timer_begin) return (op_start){0, g_inner->timer_begin(s)};
    return (op_start){timing_now_ms(), -1};
}

/* w: the call's work (engine/timing.h: timing_work), from the models beside each op */
static void done(const char *name, op_start t0, timing_work w, gptc_stream *s) {
    if (t0.op >= 0) {
        g_inner->timer_end(t0.op, s);
        timing_record_device(name, TK_COMPUTE, TP_NONE, 0, timing_context(), w,
                             timing_no_match(), t0.op);
    } else if (timing_on()) {
        timing_record_op(name, TK_COMPUTE, TP_NONE, 0, timing_context(), w, timing_no_match(),
                         t0.ms, timing_now_ms());
    }
    nvtx_pop();
}

/* Bytes of n activation-type elements and of n floats (the models below count in
 * elements; parameter gradients, optimizer state and statistics are fp32) */
static double act(double n) { return n * (double)gptc_act_bytes(g_inner->get_precision()); }
static double f32(double n) { return n * 4.0; }

/* a product's work: flops of N x IC x OC multiply-adds, and its bytes */
static timing_work product(double N, double IC, double OC, double bytes) {
    return (timing_work){2.0 * N * IC * OC, bytes};
}
/* an op with no products: its bytes alone */
static timing_work moves(double bytes) { return (timing_work){0.0, bytes}; }

/* The causal attention's products, forward: Q K^T and P V over the T (T + 1) / 2
 * query-key pairs of each of the B x NH heads, hs multiply-adds each (NH hs = C). */
static double attention_flops(int B, int T, int C) {
    return 2.0 * 2.0 * B * (double)C * ((double)T * (T + 1) / 2.0);
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
    done("zero", t0, moves(bytes), s);
}

static void t_embedding_forward(gptc_act *out, const int32_t *tokens, const gptc_act *wte,
                                const gptc_act *wpe, int N, int T, int C, int v_start, int v_local,
                                gptc_stream *s) {
    op_start t0 = begin("embedding_fwd", s);
    g_inner->embedding_forward(out, tokens, wte, wpe, N, T, C, v_start, v_local, s);
    /* tokens; a row of wte (and of wpe) read and one written per token */
    done("embedding_fwd", t0, moves(f32(N) + act((double)N * C) * (wpe ? 3 : 2)), s);
    scan_act("embedding_fwd", out, (size_t)N * C);
}

static void t_embedding_backward(float *dwte, float *dwpe, const gptc_act *dout,
                                 const int32_t *tokens, int N, int T, int C, int v_start,
                                 int v_local, gptc_stream *s) {
    op_start t0 = begin("embedding_bwd", s);
    g_inner->embedding_backward(dwte, dwpe, dout, tokens, N, T, C, v_start, v_local, s);
    /* tokens and dout; a row of dwte added into per token, all of dwpe */
    timing_work work = moves(f32(N) + act((double)N * C) + f32(2.0 * N * C) +
                          (dwpe ? f32(2.0 * T * C) : 0));
    done("embedding_bwd", t0, work, s);
    scan("embedding_bwd", dwte, (size_t)v_local * C);
}

static void t_layernorm_forward(gptc_act *out, float *mean, float *rstd, const gptc_act *inp,
                                const gptc_act *w, const gptc_act *b, int N, int C, gptc_stream *s) {
    op_start t0 = begin("layernorm_fwd", s);
    g_inner->layernorm_forward(out, mean, rstd, inp, w, b, N, C, s);
    /* inp, w, b in; out, mean, rstd out */
    done("layernorm_fwd", t0, moves(act(2.0 * N * C + 2.0 * C) + f32(2.0 * N)), s);
    scan_act("layernorm_fwd", out, (size_t)N * C);
}

static void t_add_layernorm_forward(gptc_act *res, gptc_act *out, float *mean, float *rstd,
                                    const gptc_act *a, const gptc_act *b, const gptc_act *w,
                                    const gptc_act *bias, int N, int C, gptc_stream *s) {
    op_start t0 = begin("add_layernorm_fwd", s);
    g_inner->add_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, C, s);
    /* a, b, w, bias in; res, out, mean, rstd out */
    done("add_layernorm_fwd", t0, moves(act(4.0 * N * C + 2.0 * C) + f32(2.0 * N)), s);
    scan_act("add_layernorm_fwd", res, (size_t)N * C);
    scan_act("add_layernorm_fwd", out, (size_t)N * C);
}

static void t_layernorm_backward(gptc_act *dinp, float *dw, float *db, float *dsum,
                                 const gptc_act *dout,
                                 const gptc_act *inp, const gptc_act *w, const float *mean,
                                 const float *rstd, int N, int C, gptc_stream *s) {
    op_start t0 = begin("layernorm_bwd", s);
    g_inner->layernorm_backward(dinp, dw, db, dsum, dout, inp, w, mean, rstd, N, C, s);
    /* dout, inp, w, mean, rstd in; dinp, dw, db (and dsum) added into */
    timing_work work = moves(act(4.0 * N * C + C) + f32(2.0 * N) + f32(2.0 * C) * (dsum ? 3 : 2));
    done("layernorm_bwd", t0, work, s);
    scan_act("layernorm_bwd", dinp, (size_t)N * C);
}

static void t_matmul_forward(gptc_act *out, const gptc_act *inp, const gptc_act *w,
                             const gptc_act *bias,
                             int N, int IC, int OC, int w_rows_out, gptc_stream *s) {
    op_start t0 = begin(timing_matmul_name(0), s);
    g_inner->matmul_forward(out, inp, w, bias, N, IC, OC, w_rows_out, s);
    /* inp, W (and bias) in, out out */
    timing_work work = product(N, IC, OC, act((double)N * IC + (double)IC * OC + (double)N * OC +
                                              (bias ? OC : 0)));
    done(timing_matmul_name(0), t0, work, s);
    scan_act(timing_matmul_name(0), out, (size_t)N * OC);
}

static void t_matmul_gelu_forward(gptc_act *out, gptc_act *pre, const gptc_act *inp,
                                  const gptc_act *w, const gptc_act *bias, int N, int IC, int OC, gptc_stream *s) {
    op_start t0 = begin(timing_matmul_gelu_name(0), s);
    g_inner->matmul_gelu_forward(out, pre, inp, w, bias, N, IC, OC, s);
    /* inp, W (and bias) in; pre and out out */
    timing_work work = product(N, IC, OC, act((double)N * IC + (double)IC * OC +
                                              2.0 * N * OC + (bias ? OC : 0)));
    done(timing_matmul_gelu_name(0), t0, work, s);
    scan_act(timing_matmul_gelu_name(0), out, (size_t)N * OC);
}

static void t_matmul_dgelu_backward(gptc_act *dpre, const gptc_act *dout, const gptc_act *w,
                                    const gptc_act *pre, int N, int IC, int OC, gptc_stream *s) {
    op_start t0 = begin(timing_matmul_gelu_name(1), s);
    g_inner->matmul_dgelu_backward(dpre, dout, w, pre, N, IC, OC, s);
    /* dout, W, pre in; dpre out */
    timing_work work = product(N, IC, OC, act((double)N * OC + (double)IC * OC + 2.0 * N * IC));
    done(timing_matmul_gelu_name(1), t0, work, s);
    scan_act(timing_matmul_gelu_name(1), dpre, (size_t)N * IC);
}

static void t_matmul_backward(gptc_act *dinp, float *dw, float *dbias, const gptc_act *dout,
                              const gptc_act *inp, const gptc_act *w, int N, int IC, int OC,
                              int w_rows_out, gptc_stream *s) {
    op_start t0 = begin(timing_matmul_name(1), s);
    g_inner->matmul_backward(dinp, dw, dbias, dout, inp, w, N, IC, OC, w_rows_out, s);
    /* dout in; dW's product reads inp and adds into dw, dinp's reads W and writes dinp,
     * dbias adds dout's column sums into dbias */
    timing_work work = {0.0, act((double)N * OC)};
    if (dw) {
        timing_work p = product(N, IC, OC, act((double)N * IC) + f32(2.0 * IC * OC));
        work = (timing_work){work.flops + p.flops, work.bytes + p.bytes};
    }
    if (dinp) {
        timing_work p = product(N, IC, OC, act((double)IC * OC + (double)N * IC));
        work = (timing_work){work.flops + p.flops, work.bytes + p.bytes};
    }
    if (dbias) work.bytes += f32(2.0 * OC);
    done(timing_matmul_name(1), t0, work, s);
    scan_act(timing_matmul_name(1), dinp, (size_t)N * IC);
    scan(timing_matmul_name(1), dw, (size_t)IC * OC);
}

static void t_attention_forward(gptc_act *out, float *att, const gptc_act *qkv, int B, int T, int C,
                                int NH, gptc_stream *s) {
    op_start t0 = begin("attention_fwd", s);
    g_inner->attention_forward(out, att, qkv, B, T, C, NH, s);
    /* qkv in; out and what the backward keeps (the backend's state) out */
    timing_work work = {attention_flops(B, T, C),
                     act(4.0 * B * T * C) + f32((double)g_inner->attention_state_floats(B, T, NH))};
    done("attention_fwd", t0, work, s);
    scan_act("attention_fwd", out, (size_t)B * T * C);
}

static void t_attention_backward(gptc_act *dqkv, float *dbias, float *datt, const gptc_act *dout,
                                 const gptc_act *out, const gptc_act *qkv, const float *att,
                                 int B, int T, int C, int NH, gptc_stream *s) {
    op_start t0 = begin("attention_bwd", s);
    g_inner->attention_backward(dqkv, dbias, datt, dout, out, qkv, att, B, T, C, NH, s);
    /* dS = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q: with the forward's Q K^T (P is
     * recomputed or kept), five products of the forward's two's size. dout, out, qkv and
     * the state in; dqkv out (and dbias added into) */
    timing_work work = {2.5 * attention_flops(B, T, C),
                     act(2.0 * B * T * C + 6.0 * B * T * C) +
                         f32((double)g_inner->attention_state_floats(B, T, NH)) +
                         (dbias ? f32(6.0 * C) : 0)};
    done("attention_bwd", t0, work, s);
    scan_act("attention_bwd", dqkv, (size_t)B * T * 3 * C);
}

static void t_gelu_forward(gptc_act *out, const gptc_act *inp, size_t n, gptc_stream *s) {
    op_start t0 = begin("gelu_fwd", s);
    g_inner->gelu_forward(out, inp, n, s);
    done("gelu_fwd", t0, moves(act(2.0 * n)), s);
    scan_act("gelu_fwd", out, n);
}

static void t_gelu_backward(gptc_act *dinp, const gptc_act *inp, const gptc_act *dout, size_t n,
                            gptc_stream *s) {
    op_start t0 = begin("gelu_bwd", s);
    g_inner->gelu_backward(dinp, inp, dout, n, s);
    done("gelu_bwd", t0, moves(act(3.0 * n)), s);
    scan_act("gelu_bwd", dinp, n);
}

static void t_add(gptc_act *out, const gptc_act *a, const gptc_act *b, size_t n, gptc_stream *s) {
    op_start t0 = begin("residual_add", s);
    g_inner->add(out, a, b, n, s);
    done("residual_add", t0, moves(act(3.0 * n)), s);
    scan_act("residual_add", out, n);
}

static void t_vocab_max(float *mx, const gptc_act *logits, int N, int Vl, int v_valid,
                        gptc_stream *s) {
    op_start t0 = begin("loss_max", s);
    g_inner->vocab_max(mx, logits, N, Vl, v_valid, s);
    /* the logits in; mx out */
    done("loss_max", t0, moves(act((double)N * Vl) + f32(N)), s);
}

static void t_vocab_expsum(float *stats, const gptc_act *logits, const float *mx,
                           const int32_t *targets, int N, int Vl, int v_valid, int v_start,
                           gptc_stream *s) {
    op_start t0 = begin("loss_expsum", s);
    g_inner->vocab_expsum(stats, logits, mx, targets, N, Vl, v_valid, v_start, s);
    /* the logits, mx and targets in; stats out */
    done("loss_expsum", t0, moves(act((double)N * Vl) + f32(4.0 * N)), s);
    scan("loss_expsum", stats, 2 * (size_t)N);
}

static void t_vocab_ce_finish(float *losses, gptc_act *logits, const float *mx,
                              const float *stats, const int32_t *targets, int N, int Vl,
                              int v_valid, int v_start, float dloss, gptc_stream *s) {
    op_start t0 = begin("loss_finish", s);
    g_inner->vocab_ce_finish(losses, logits, mx, stats, targets, N, Vl, v_valid, v_start, dloss,
                             s);
    /* the logits, mx, stats and targets in; the gradient over the logits and losses out */
    done("loss_finish", t0, moves(act(2.0 * N * Vl) + f32(5.0 * N)), s);
    scan("loss_finish", losses, (size_t)N);
}

static void t_cross_entropy(float *losses, gptc_act *logits, float *mx, float *stats,
                            const int32_t *targets, int N, int Vl, int v_valid, float dloss,
                            gptc_stream *s) {
    op_start t0 = begin("loss", s);
    g_inner->cross_entropy(losses, logits, mx, stats, targets, N, Vl, v_valid, dloss, s);
    /* the logits and targets in; the gradient over the logits, mx, stats, losses out */
    done("loss", t0, moves(act(2.0 * N * Vl) + f32(5.0 * N)), s);
    scan("loss", stats, 2 * (size_t)N);
    scan("loss", losses, (size_t)N);
}

static double t_sum_squares(const float *x, size_t n, gptc_stream *s) {
    op_start t0 = begin("grad_norm", s);
    double r = g_inner->sum_squares(x, n, s);
    done("grad_norm", t0, moves(f32(n)), s);
    return r;
}

static void t_adamw(const gptc_adamw_piece *pieces, int n_pieces, const gptc_adamw_step *h,
                    gptc_stream *s) {
    op_start t0 = begin("adamw", s);
    g_inner->adamw(pieces, n_pieces, h, s);
    /* per piece: p, g, m, v in; p, m, v (and the act copy) out */
    double bytes = 0;
    for (int k = 0; k < n_pieces; k++) {
        const gptc_adamw_piece *q = &pieces[k];
        bytes += f32(7.0 * q->n) + (q->p_act && q->p_act != q->p ? act(q->n) : 0);
    }
    done("adamw", t0, moves(bytes), s);
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
