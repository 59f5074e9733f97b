/* The op table every layer calls. A backend (CPU now, CUDA later) fills one of these;
 * layers hold a pointer to it and never ask which device they run on.
 *
 * Conventions: row-major buffers on the backend's device, float32 unless marked "act"
 * (the activation type, gptc_act below: fp32 or bf16 by train.precision); N = B*T rows;
 * weights in Conv1D layout (y = x @ W + b, W is [in, out]) unless said otherwise.
 * "+=" in a comment means the op accumulates into that buffer (gradients accumulate over
 * micro-batches and over the two uses of the tied wte); everything else is overwritten.
 * Every op takes the stream it is issued on; the CPU backend runs ops inline.
 *
 * Streams and events (CUDA: cudaStream_t / cudaEvent_t). The NULL stream is the default
 * compute stream. On the CPU it is the calling thread itself: ops run inline, so an event
 * recorded on NULL is complete at once, stream_wait_event(NULL, e) blocks the caller until
 * e completes, and launch_host_func(NULL, f, a) calls f(a) now. A stream from
 * stream_create is a worker thread running its queue (host functions, event records,
 * event waits) in FIFO order. The CPU compute and memory ops below ignore their stream
 * and always run inline on the caller: issue them on NULL, and put work that must run in
 * a comm stream's order into that stream with launch_host_func.
 * An event is re-recordable: a wait (stream_wait_event, event_synchronize) refers to the
 * most recent event_record made before the wait call; waiting on a never-recorded event
 * returns at once. Records of one event should stay on one stream at a time: if a record
 * on another stream completes first, waits on the older record are released with it. */
#ifndef GPTC_BACKEND_H
#define GPTC_BACKEND_H

#include <stddef.h>
#include <stdint.h>

typedef struct gptc_stream gptc_stream;
typedef struct gptc_event gptc_event;

/* train.precision. GPTC_FP32 is the reference: everything in fp32, TF32 off.
 * GPTC_BF16 (mixed precision): activations, their gradients and the copy of the
 * parameters that compute reads are stored as bfloat16 (the activation type below);
 * parameter gradients, the fp32 master parameters, optimizer state, LayerNorm statistics,
 * the attention's saved statistics, the loss statistics and the losses stay fp32.
 * Every op reads its activation-type inputs exactly, computes in fp32 as under
 * GPTC_FP32, and rounds each activation-type output to nearest even once, when it stores
 * it (a "+=" output: the old value plus the op's fp32 result, rounded once). Products
 * (matmuls, attention) run on bf16 operands with fp32 accumulation; the attention also
 * rounds its probabilities (and their gradients) to bf16 as operands of its second
 * product, as tensor-core flash kernels do. */
typedef enum { GPTC_FP32 = 0, GPTC_BF16 = 1 } gptc_precision;

/* An element of the activation type: float under GPTC_FP32, bfloat16 under GPTC_BF16
 * (the upper half of a float's bits, engine/bf16.h). A gptc_act pointer is untyped
 * memory: step through it with gptc_act_at. Buffers marked "act" below hold this type;
 * every other buffer holds float. */
typedef void gptc_act;

static inline size_t gptc_act_bytes(gptc_precision p) { return p == GPTC_BF16 ? 2 : 4; }

/* Element i of an activation-type buffer of precision p. */
static inline gptc_act *gptc_act_at(const gptc_act *base, size_t i, gptc_precision p) {
    return (char *)base + i * gptc_act_bytes(p);
}

/* A piece of an AdamW step: n consecutive elements of tensors of one weight decay. */
typedef struct {
    float *p;        /* [n] fp32 parameters (the master weights) */
    gptc_act *p_act; /* [n] act: the copy compute reads, written as the new p rounded; NULL
                      * or p itself: none of its own (fp32) */
    const float *g;  /* [n] gradient */
    float *m, *v;    /* [n] first and second moments */
    size_t n;
    float decay;     /* 0 for tensors that take none */
} gptc_adamw_piece;

/* An AdamW step's constants. bc1 = 1 - beta1^t, bc2 = 1 - beta2^t. The gradient is taken
 * as g * gscale (the clipping coefficient, 1 for none: the same float product a pass
 * scaling g first would store, without that pass over the gradients). */
typedef struct {
    float gscale, lr, beta1, beta2, eps, bc1, bc2;
} gptc_adamw_step;

typedef struct gptc_backend {
    const char *name;
    /* 1 when buffers live in device memory, which the host must not touch: communication
     * then goes through the device's own library or is staged through host copies */
    int on_device;

    /* memory: one call per big buffer (params, grads, optimizer state, activations) */
    void *(*alloc)(size_t bytes);
    void (*release)(void *p);
    void (*zero)(void *p, size_t bytes, gptc_stream *s);
    void (*copy_from_host)(void *dst, const void *src, size_t bytes, gptc_stream *s);
    void (*copy_to_host)(void *dst, const void *src, size_t bytes, gptc_stream *s);
    /* Host memory the device copies from and to at full speed (CUDA: pinned), for staging. */
    void *(*alloc_host)(size_t bytes);
    void (*release_host)(void *p);
    /* A copy in s's order that does not wait for it (host memory from alloc_host, or
     * device memory, either side); the CPU copies at once. */
    void (*copy_async)(void *dst, const void *src, size_t bytes, gptc_stream *s);
    /* older name of stream_synchronize, kept for existing callers; the CPU table still
     * points it at a no-op, which is right only for the NULL stream */
    void (*synchronize)(gptc_stream *s);

    /* streams and events (semantics at the top of this file) */
    /* A new stream. high_priority asks the OS to favour its thread (CPU: a nice 5 below
     * the creating thread's on Linux, when permitted, e.g. as root); not getting it is not
     * an error. NULL on failure. */
    gptc_stream *(*stream_create)(int high_priority);
    /* Finishes the work queued on s, then frees it. */
    void (*stream_destroy)(gptc_stream *s);
    gptc_event *(*event_create)(void);
    /* May be called with records or waits on it still queued; freed when they are done. */
    void (*event_destroy)(gptc_event *e);
    /* Marks the point in s's queue reached so far. */
    void (*event_record)(gptc_event *e, gptc_stream *s);
    /* Work enqueued on s after this call runs only after e's point completed. */
    void (*stream_wait_event)(gptc_stream *s, gptc_event *e);
    /* The host blocks until e's point completed. */
    void (*event_synchronize)(gptc_event *e);
    /* The host blocks until the work enqueued on s before this call has finished. */
    void (*stream_synchronize)(gptc_stream *s);
    /* Runs fn(arg) on a host thread in s's order; s's later work waits until it returned
     * (CPU: on the stream's thread; CUDA: on a worker thread of the stream's own, so fn
     * may block, e.g. in MPI, without holding back other streams). */
    void (*launch_host_func)(gptc_stream *s, void (*fn)(void *), void *arg);

    /* Device-side timing of ops for profile.timing = kernel. NULL on the CPU, whose ops
     * run inline so that two host clock readings bracket each one. timer_reset starts a
     * step (the device must be idle; earlier handles are dropped). timer_begin and
     * timer_end bracket the calls that enqueue one op on s (kernels it launches on other
     * streams count too where the timer can see them); timer_read, once the step's work
     * has completed, gives the op's device interval on timing_now_ms()'s clock and
     * returns 0, or -1 when the op ran nothing on the device. */
    void (*timer_reset)(void);
    int (*timer_begin)(gptc_stream *s);
    void (*timer_end)(int op, gptc_stream *s);
    int (*timer_read)(int op, double *start_ms, double *end_ms);
    /* The device work behind the ops, for the report's device_kernels (NULL, or returning
     * -1 at once, where the timer does not see kernels: the CPU, CUDA events). After
     * timer_read: piece i of the step's work (a kernel, copy or set) gives its op handle
     * (-1: launched outside every op), its kernel's name (engine/kernel_name.h; it lives
     * as long as the run) and its interval on timing_now_ms()'s clock, and returns 0; -1
     * past the last piece. */
    int (*timer_piece)(size_t i, int *op, const char **kernel, double *start_ms,
                       double *end_ms);

    /* The precision (gptc_precision above); fp32, the default, is strict (no TF32). Set
     * once, before the first op and before any activation-type buffer is sized. */
    void (*set_precision)(gptc_precision p);
    gptc_precision (*get_precision)(void);
    /* act dst[n] = src[n] (fp32), rounded to the activation type (a plain copy under
     * fp32, skipped when dst == src): refreshes the parameter copy compute reads */
    void (*to_act)(gptc_act *dst, const float *src, size_t n, gptc_stream *s);

    /* act out[N,C] = wte[tokens[n] - v_start] (0 unless v_start <= token < v_start +
     * v_local: the rows this rank holds of a vocab-parallel wte) + wpe[n % T] (skipped if
     * NULL); wte and wpe are act (the parameter copy) */
    void (*embedding_forward)(gptc_act *out, const int32_t *tokens, const gptc_act *wte,
                              const gptc_act *wpe, int N, int T, int C, int v_start, int v_local,
                              gptc_stream *s);
    /* dwte[v_local,C] += , dwpe[T,C] += (skipped if NULL; fp32) from act dout[N,C] */
    void (*embedding_backward)(float *dwte, float *dwpe, const gptc_act *dout,
                               const int32_t *tokens, int N, int T, int C, int v_start,
                               int v_local, gptc_stream *s);

    /* act out[N,C] = (inp - mean) * rstd * w + b for act inp, w, b; saves mean[N],
     * rstd[N] (fp32) */
    void (*layernorm_forward)(gptc_act *out, float *mean, float *rstd, const gptc_act *inp,
                              const gptc_act *w, const gptc_act *b, int N, int C,
                              gptc_stream *s);
    /* The residual add and the LayerNorm that reads its sum, as one op: act res[N,C] = a + b
     * (rounded to act), then layernorm_forward(out, mean, rstd, res, w, bias). The same
     * results as add followed by layernorm_forward; a backend may do it in one pass. */
    void (*add_layernorm_forward)(gptc_act *res, gptc_act *out, float *mean, float *rstd,
                                  const gptc_act *a, const gptc_act *b, const gptc_act *w,
                                  const gptc_act *bias, int N, int C, gptc_stream *s);
    /* act dinp[N,C] +=, dw[C] +=, db[C] += (fp32), from act dout, inp, w; dsum[C] (fp32,
     * NULL: skipped) += the column sums of dinp as stored after the update: dinp is the
     * gradient of a residual stream, and those sums the bias gradient of the projection
     * whose output was added into it, which a GPU takes while it holds the rows */
    void (*layernorm_backward)(gptc_act *dinp, float *dw, float *db, float *dsum,
                               const gptc_act *dout, const gptc_act *inp, const gptc_act *w,
                               const float *mean, const float *rstd, int N, int C,
                               gptc_stream *s);

    /* act out[N,OC] = inp[N,IC] @ W + bias (bias may be NULL), all act. W is [IC,OC], or
     * [OC,IC] when w_rows_out (the tied LM head reads wte [V,C] that way). */
    void (*matmul_forward)(gptc_act *out, const gptc_act *inp, const gptc_act *w,
                           const gptc_act *bias, int N, int IC, int OC, int w_rows_out,
                           gptc_stream *s);
    /* act dinp[N,IC] = dout @ W^T; fp32 dw += inp^T @ dout, dbias[OC] += column sums of
     * dout; each skipped when NULL (a split backward computes dinp by row chunks and dw
     * once). dout, inp, w are act. */
    void (*matmul_backward)(gptc_act *dinp, float *dw, float *dbias, const gptc_act *dout,
                            const gptc_act *inp, const gptc_act *w, int N, int IC, int OC,
                            int w_rows_out, gptc_stream *s);

    /* The MLP's first projection with its activation fused (cuBLASLt's GELU epilogue), all
     * act: pre[N,OC] = inp[N,IC] @ W[IC,OC] + bias (kept for the backward), out =
     * gelu(pre), where the GELU reads the fp32 sum before pre is rounded. */
    void (*matmul_gelu_forward)(gptc_act *out, gptc_act *pre, const gptc_act *inp,
                                const gptc_act *w, const gptc_act *bias, int N, int IC, int OC,
                                gptc_stream *s);
    /* The input gradient of the projection that follows the GELU, with the GELU's own
     * backward fused (DGELU epilogue), all act: dpre[N,IC] = (dout[N,OC] @ W^T) *
     * gelu'(pre[N,IC]), rounded once. W is [IC,OC]; its gradient and the bias's come from
     * matmul_backward (dinp NULL). */
    void (*matmul_dgelu_backward)(gptc_act *dpre, const gptc_act *dout, const gptc_act *w,
                                  const gptc_act *pre, int N, int IC, int OC, gptc_stream *s);

    /* Causal self-attention of one layer. act qkv[B,T,3C] (q|k|v, heads in order), act
     * out[B,T,C]; att[attention_state_floats] (fp32) keeps what backward needs: the
     * softmax probabilities [B,NH,T,T] on the CPU, the rows' log-sum-exp [B,NH,T] on CUDA,
     * whose flash-style kernels recompute the probabilities instead of storing them. */
    size_t (*attention_state_floats)(int B, int T, int NH);
    /* floats of attention_backward's datt scratch, at least attention_state_floats (NULL:
     * that many); at the precision set */
    size_t (*attention_scratch_floats)(int B, int T, int C, int NH);
    void (*attention_forward)(gptc_act *out, float *att, const gptc_act *qkv, int B, int T,
                              int C, int NH, gptc_stream *s);
    /* act dqkv[B,T,3C] = ; dbias[3C] += column sums of dqkv (skipped when NULL: the bias
     * gradient of the projection that made qkv, which a GPU adds while the values are in
     * its registers instead of reading dqkv again); act dout, out (the forward's output),
     * qkv; datt[attention_scratch_floats] (fp32) is scratch */
    void (*attention_backward)(gptc_act *dqkv, float *dbias, float *datt, const gptc_act *dout,
                               const gptc_act *out, const gptc_act *qkv, const float *att,
                               int B, int T, int C, int NH, gptc_stream *s);

    /* tanh-approximated GELU over n act elements; backward: dinp = dout * gelu'(inp) */
    void (*gelu_forward)(gptc_act *out, const gptc_act *inp, size_t n, gptc_stream *s);
    void (*gelu_backward)(gptc_act *dinp, const gptc_act *inp, const gptc_act *dout, size_t n,
                          gptc_stream *s);

    /* act out[n] = a + b */
    void (*add)(gptc_act *out, const gptc_act *a, const gptc_act *b, size_t n, gptc_stream *s);

    /* Softmax cross-entropy over a vocabulary split across ranks, in three steps around
     * two all-reduces (max, then sum): this rank holds Vl columns of the padded vocab
     * starting at global column v_start, of which the first v_valid are real (padded
     * columns never enter the softmax). The logits are act; mx, stats and losses fp32.
     * No step stores probabilities: the last one recomputes them from the logits and
     * writes the gradient over the logits, so they are read three times and written once.
     * vocab_max: mx[N] = max over the valid columns of logits[N,Vl] (-inf if none). */
    void (*vocab_max)(float *mx, const gptc_act *logits, int N, int Vl, int v_valid,
                      gptc_stream *s);
    /* stats[2,N] = row sums of exp(logits - mx) over the valid columns | target logit
     * minus mx where this rank holds the target, else 0 */
    void (*vocab_expsum)(float *stats, const gptc_act *logits, const float *mx,
                         const int32_t *targets, int N, int Vl, int v_valid, int v_start,
                         gptc_stream *s);
    /* with stats summed over ranks: losses[N] = log(sum) - target; logits[N,Vl] becomes
     * dloss * (p - onehot) with p = exp(logit - mx) / sum, zero in padded columns */
    void (*vocab_ce_finish)(float *losses, gptc_act *logits, const float *mx,
                            const float *stats, const int32_t *targets, int N, int Vl,
                            int v_valid, int v_start, float dloss, gptc_stream *s);
    /* The three steps above at once, where one rank holds the whole vocabulary (tp = 1,
     * v_start 0): the same mx, stats, losses and gradient, with no all-reduce to wait for
     * between them, so a backend may read each row once and write it once. */
    void (*cross_entropy)(float *losses, gptc_act *logits, float *mx, float *stats,
                          const int32_t *targets, int N, int Vl, int v_valid, float dloss,
                          gptc_stream *s);

    /* The optimizer's ops work on fp32 buffers only.
     * Sum of squares of x[n], accumulated in double, returned to the host. */
    double (*sum_squares)(const float *x, size_t n, gptc_stream *s);
    /* AdamW (PyTorch semantics) over n_pieces pieces (gptc_adamw_piece) with one step's
     * constants: one call for a whole optimizer step, so that a GPU updates every
     * tensor in a launch or a few rather than one launch a tensor. Each piece is updated
     * as if alone; pieces do not overlap. */
    void (*adamw)(const gptc_adamw_piece *pieces, int n_pieces, const gptc_adamw_step *h,
                  gptc_stream *s);
} gptc_backend;

const gptc_backend *cpu_backend(void);

/* engine/cpu/cpu_stream.c: the CPU backend's streams and events */
gptc_stream *cpu_stream_create(int high_priority);
void cpu_stream_destroy(gptc_stream *s);
gptc_event *cpu_event_create(void);
void cpu_event_destroy(gptc_event *e);
void cpu_event_record(gptc_event *e, gptc_stream *s);
void cpu_stream_wait_event(gptc_stream *s, gptc_event *e);
void cpu_event_synchronize(gptc_event *e);
void cpu_stream_synchronize(gptc_stream *s);
void cpu_launch_host_func(gptc_stream *s, void (*fn)(void *), void *arg);

#endif
