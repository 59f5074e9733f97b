/* The op table every layer calls. A backend (CPU now, CUDA later) fills one of these;
 * layers hold a pointer to it and never ask which device they run on.
 *
 * Conventions: row-major float32 buffers on the backend's device; N = B*T token rows;
 * weights in Conv1D layout (y = x @ W + b, W is [in, out]) unless said otherwise.
 * "+=" in a comment means the op accumulates into that buffer (gradients accumulate over
 * micro-batches and over the two uses of the tied wte); everything else is overwritten.
 * Every op takes the stream it is issued on; the CPU backend runs ops inline. */
#ifndef GPTC_BACKEND_H
#define GPTC_BACKEND_H

#include <stddef.h>
#include <stdint.h>

typedef struct gptc_stream gptc_stream;

typedef struct gptc_backend {
    const char *name;

    /* memory: one call per big buffer (params, grads, optimizer state, activations) */
    void *(*alloc)(size_t bytes);
    void (*release)(void *p);
    void (*zero)(void *p, size_t bytes, gptc_stream *s);
    void (*copy_from_host)(void *dst, const void *src, size_t bytes, gptc_stream *s);
    void (*copy_to_host)(void *dst, const void *src, size_t bytes, gptc_stream *s);
    void (*synchronize)(gptc_stream *s);

    /* out[N,C] = wte[tokens[n]] + wpe[n % T] */
    void (*embedding_forward)(float *out, const int32_t *tokens, const float *wte,
                              const float *wpe, int N, int T, int C, gptc_stream *s);
    /* dwte[V,C] += , dwpe[T,C] += from dout[N,C] */
    void (*embedding_backward)(float *dwte, float *dwpe, const float *dout,
                               const int32_t *tokens, int N, int T, int C, gptc_stream *s);

    /* out[N,C] = (inp - mean) * rstd * w + b; saves mean[N], rstd[N] */
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C, gptc_stream *s);
    /* dinp[N,C] +=, dw[C] +=, db[C] += */
    void (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C, gptc_stream *s);

    /* out[N,OC] = inp[N,IC] @ W + bias (bias may be NULL). W is [IC,OC], or [OC,IC] when
     * w_rows_out (the tied LM head reads wte [V,C] that way). */
    void (*matmul_forward)(float *out, const float *inp, const float *w, const float *bias,
                           int N, int IC, int OC, int w_rows_out, gptc_stream *s);
    /* dinp[N,IC] = dout @ W^T (skipped when dinp is NULL), dw +=, dbias[OC] += (if not NULL) */
    void (*matmul_backward)(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int IC, int OC,
                            int w_rows_out, gptc_stream *s);

    /* Causal self-attention of one layer. qkv[B,T,3C] (q|k|v, heads in order),
     * out[B,T,C], att[B,NH,T,T] keeps the softmax probabilities for backward. */
    void (*attention_forward)(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH, gptc_stream *s);
    /* dqkv[B,T,3C] = , datt[B,NH,T,T] is scratch */
    void (*attention_backward)(float *dqkv, float *datt, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH, gptc_stream *s);

    /* tanh-approximated GELU over n elements; backward: dinp = dout * gelu'(inp) */
    void (*gelu_forward)(float *out, const float *inp, size_t n, gptc_stream *s);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t n,
                          gptc_stream *s);

    /* out[n] = a + b */
    void (*add)(float *out, const float *a, const float *b, size_t n, gptc_stream *s);
    /* acc[n] += x */
    void (*accumulate)(float *acc, const float *x, size_t n, gptc_stream *s);

    /* Softmax cross-entropy over the first V of Vp logits per row (padded columns never
     * enter the softmax). losses[N] = -log p[target]; logits[N,Vp] is overwritten by its
     * gradient, dloss * (p - onehot), with zeros in the padded columns. */
    void (*crossentropy_forward_backward)(float *losses, float *logits, const int32_t *targets,
                                          int N, int V, int Vp, float dloss, gptc_stream *s);

    /* Sum of squares of x[n], accumulated in double, returned to the host. */
    double (*sum_squares)(const float *x, size_t n, gptc_stream *s);
    /* x[n] *= a */
    void (*scale)(float *x, float a, size_t n, gptc_stream *s);
    /* AdamW (PyTorch semantics) on n elements; decay is 0 for tensors that take none.
     * bc1 = 1 - beta1^t, bc2 = 1 - beta2^t. */
    void (*adamw)(float *p, const float *g, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float decay, float bc1, float bc2,
                  gptc_stream *s);
} gptc_backend;

const gptc_backend *cpu_backend(void);

#endif
