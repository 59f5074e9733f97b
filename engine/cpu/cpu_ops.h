/* The CPU reference ops (see engine/backend.h for each op's contract). Plain C with
 * OpenMP over rows and OpenBLAS for the matrix products; deterministic for a fixed
 * thread count (reductions combine per-thread partials in thread order). */
#ifndef GPTC_CPU_OPS_H
#define GPTC_CPU_OPS_H

#include "engine/backend.h"

void cpu_embedding_forward(float *out, const int32_t *tokens, const float *wte,
                           const float *wpe, int N, int T, int C, int v_start, int v_local,
                           gptc_stream *s);
void cpu_embedding_backward(float *dwte, float *dwpe, const float *dout,
                            const int32_t *tokens, int N, int T, int C, int v_start,
                            int v_local, gptc_stream *s);
void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *w, const float *b, int N, int C, gptc_stream *s);
void cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, const float *mean,
                            const float *rstd, int N, int C, gptc_stream *s);
/* the precision of the matmuls (engine/backend.h: set_precision) */
void cpu_set_precision(gptc_precision p);
void cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                        int N, int IC, int OC, int w_rows_out, gptc_stream *s);
void cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                         const float *inp, const float *w, int N, int IC, int OC,
                         int w_rows_out, gptc_stream *s);
void cpu_matmul_gelu_forward(float *out, float *pre, const float *inp, const float *w,
                             const float *bias, int N, int IC, int OC, gptc_stream *s);
void cpu_matmul_dgelu_backward(float *dpre, const float *dout, const float *w, const float *pre,
                               int N, int IC, int OC, gptc_stream *s);
void cpu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                           int NH, gptc_stream *s);
/* att and datt hold [B,NH,T,T] probabilities; the backward does not read out */
size_t cpu_attention_state_floats(int B, int T, int NH);
void cpu_attention_backward(float *dqkv, float *datt, const float *dout, const float *out,
                            const float *qkv, const float *att, int B, int T, int C, int NH,
                            gptc_stream *s);
/* precision = bf16 attention (tensor-core flash semantics, cpu_ops.c): the reference of
 * the GPU's bf16 kernels; out is read by the backward */
void cpu_attention_forward_bf16(float *out, float *att, const float *qkv, int B, int T, int C,
                                int NH);
void cpu_attention_backward_bf16(float *dqkv, float *datt, const float *dout, const float *out,
                                 const float *qkv, const float *att, int B, int T, int C, int NH);
void cpu_gelu_forward(float *out, const float *inp, size_t n, gptc_stream *s);
void cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n,
                       gptc_stream *s);
void cpu_add(float *out, const float *a, const float *b, size_t n, gptc_stream *s);
void cpu_vocab_max(float *mx, const float *logits, int N, int Vl, int v_valid, gptc_stream *s);
void cpu_vocab_expsum(float *stats, float *logits, const float *mx, const int32_t *targets,
                      int N, int Vl, int v_valid, int v_start, gptc_stream *s);
void cpu_vocab_ce_finish(float *losses, float *logits, const float *stats,
                         const int32_t *targets, int N, int Vl, int v_valid, int v_start,
                         float dloss, gptc_stream *s);
double cpu_sum_squares(const float *x, size_t n, gptc_stream *s);
void cpu_scale(float *x, float a, size_t n, gptc_stream *s);
void cpu_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr,
               float beta1, float beta2, float eps, float decay, float bc1, float bc2,
               gptc_stream *s);

#endif
