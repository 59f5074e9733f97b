/* The CPU reference ops (see engine/backend.h for each op's contract). Plain C with
 * OpenMP over rows and OpenBLAS for the matrix products; deterministic for a fixed
 * thread count (reductions combine per-thread partials in thread order). */
#ifndef GPTC_CPU_OPS_H
#define GPTC_CPU_OPS_H

#include "engine/backend.h"

/* Activation-type buffers (gptc_act) hold float under GPTC_FP32 and bf16 bits under
 * GPTC_BF16: cpu_set_precision picks which. */
void cpu_set_precision(gptc_precision p);
gptc_precision cpu_get_precision(void);
void cpu_to_act(gptc_act *dst, const float *src, size_t n, gptc_stream *s);
void cpu_embedding_forward(gptc_act *out, const int32_t *tokens, const gptc_act *wte,
                           const gptc_act *wpe, int N, int T, int C, int v_start, int v_local,
                           gptc_stream *s);
void cpu_embedding_backward(float *dwte, float *dwpe, const gptc_act *dout,
                            const int32_t *tokens, int N, int T, int C, int v_start,
                            int v_local, gptc_stream *s);
void cpu_layernorm_forward(gptc_act *out, float *mean, float *rstd, const gptc_act *inp,
                           const gptc_act *w, const gptc_act *b, int N, int C, gptc_stream *s);
void cpu_add_layernorm_forward(gptc_act *res, gptc_act *out, float *mean, float *rstd,
                               const gptc_act *a, const gptc_act *b, const gptc_act *w,
                               const gptc_act *bias, int N, int C, gptc_stream *s);
void cpu_layernorm_backward(gptc_act *dinp, float *dw, float *db, float *dsum,
                            const gptc_act *dout,
                            const gptc_act *inp, const gptc_act *w, const float *mean,
                            const float *rstd, int N, int C, gptc_stream *s);
void cpu_matmul_forward(gptc_act *out, const gptc_act *inp, const gptc_act *w,
                        const gptc_act *bias, int N, int IC, int OC, int w_rows_out,
                        gptc_stream *s);
void cpu_matmul_backward(gptc_act *dinp, float *dw, float *dbias, const gptc_act *dout,
                         const gptc_act *inp, const gptc_act *w, int N, int IC, int OC,
                         int w_rows_out, gptc_stream *s);
void cpu_matmul_gelu_forward(gptc_act *out, gptc_act *pre, const gptc_act *inp,
                             const gptc_act *w, const gptc_act *bias, int N, int IC, int OC,
                             gptc_stream *s);
void cpu_matmul_dgelu_backward(gptc_act *dpre, const gptc_act *dout, const gptc_act *w,
                               const gptc_act *pre, int N, int IC, int OC, gptc_stream *s);
void cpu_attention_forward(gptc_act *out, float *att, const gptc_act *qkv, int B, int T,
                           int C, int NH, gptc_stream *s);
/* att and datt hold [B,NH,T,T] probabilities; the backward does not read out under fp32 */
size_t cpu_attention_state_floats(int B, int T, int NH);
void cpu_attention_backward(gptc_act *dqkv, float *dbias, float *datt, const gptc_act *dout,
                            const gptc_act *out, const gptc_act *qkv, const float *att, int B,
                            int T, int C, int NH, gptc_stream *s);
/* The bf16 attention on fp32 buffers (tensor-core flash semantics, cpu_ops.c): what
 * cpu_attention_* compute under GPTC_BF16 between the conversions, and the reference of
 * the GPU's bf16 kernels; out is read by the backward. Independent of the precision set. */
void cpu_attention_forward_bf16(float *out, float *att, const float *qkv, int B, int T, int C,
                                int NH);
void cpu_attention_backward_bf16(float *dqkv, float *datt, const float *dout, const float *out,
                                 const float *qkv, const float *att, int B, int T, int C, int NH);
void cpu_gelu_forward(gptc_act *out, const gptc_act *inp, size_t n, gptc_stream *s);
void cpu_gelu_backward(gptc_act *dinp, const gptc_act *inp, const gptc_act *dout, size_t n,
                       gptc_stream *s);
void cpu_add(gptc_act *out, const gptc_act *a, const gptc_act *b, size_t n, gptc_stream *s);
void cpu_vocab_max(float *mx, const gptc_act *logits, int N, int Vl, int v_valid,
                   gptc_stream *s);
void cpu_vocab_expsum(float *stats, const gptc_act *logits, const float *mx,
                      const int32_t *targets, int N, int Vl, int v_valid, int v_start,
                      gptc_stream *s);
void cpu_vocab_ce_finish(float *losses, gptc_act *logits, const float *mx, const float *stats,
                         const int32_t *targets, int N, int Vl, int v_valid, int v_start,
                         float dloss, gptc_stream *s);
void cpu_cross_entropy(float *losses, gptc_act *logits, float *mx, float *stats,
                       const int32_t *targets, int N, int Vl, int v_valid, float dloss,
                       gptc_stream *s);
double cpu_sum_squares(const float *x, size_t n, gptc_stream *s);
void cpu_adamw(const gptc_adamw_piece *pieces, int n_pieces, const gptc_adamw_step *h,
               gptc_stream *s);

#endif
