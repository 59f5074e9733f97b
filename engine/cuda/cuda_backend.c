/* The CUDA backend's op table: memory, streams and events map one to one onto the CUDA
 * runtime; compute ops launch the kernels of engine/cuda/ (.cu files) and cuBLASLt (cuda_matmul.c).
 *
 * The NULL gptc_stream is the backend's compute stream, a non-blocking stream created at
 * start: the legacy default stream would serialise with every other stream and so undo
 * every overlap policy. Copies between host and device block the caller until done, as the
 * CPU backend's do, because callers reuse their host buffers at once.
 *
 * A CUDA error here is not recoverable (an asynchronous kernel fault poisons the
 * context), so it ends the process with one line naming the rank, the call and the
 * error; mpirun then stops the other ranks. */
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_internal.h"

#include "engine/cuda/cuda_kernels.h"
#include "engine/cuda/cuda_matmul.h"
#include "engine/log.h"

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gptc_stream {
    cudaStream_t s;
    host_worker *worker; /* made at the first launch_host_func */
};
struct gptc_event {
    cudaEvent_t e;
};

static struct {
    int device;
    cudaStream_t compute;
    host_worker *compute_worker; /* launch_host_func on the NULL stream */
    double *sumsq_out;     /* [1] device result of sum_squares */
    double *sumsq_partial; /* [cuda_sum_squares_partials()] device scratch */
    double *sumsq_host;    /* [1] pinned host copy */
} g;

void cuda_check(cudaError_t rc, const char *what) {
    if (rc == cudaSuccess) return;
    log_error("rank %d: CUDA error in %s: %s", log_rank(), what, cudaGetErrorString(rc));
    exit(EXIT_FAILURE);
}

static void check_launch(const char *op) {
    int rc = cuda_check_launch();
    if (rc == 0) return;
    const char *why = cuda_launch_why();
    if (why[0]) { /* a launcher refused, and said why */
        log_error("rank %d: %s: %s", log_rank(), op, why);
        exit(EXIT_FAILURE);
    }
    cuda_check((cudaError_t)rc, op);
}

cudaStream_t cuda_stream_of(gptc_stream *s) { return s ? s->s : g.compute; }
static cudaStream_t cu(gptc_stream *s) { return cuda_stream_of(s); }

/* ---- memory ---- */

static void *cu_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
        (void)cudaGetLastError(); /* an allocation failure is reported by the caller */
        return NULL;
    }
    /* the CPU backend hands out zeroed memory and layers rely on it; cudaMemset would go
     * on the legacy stream, which our non-blocking streams do not wait for */
    cuda_check(cudaMemsetAsync(p, 0, bytes, g.compute), "cudaMemsetAsync");
    cuda_check(cudaStreamSynchronize(g.compute), "alloc");
    return p;
}
static void cu_release(void *p) {
    if (p) cuda_check(cudaFree(p), "cudaFree");
}
static void cu_zero(void *p, size_t bytes, gptc_stream *s) {
    cuda_check(cudaMemsetAsync(p, 0, bytes, cu(s)), "cudaMemsetAsync");
}
static void cu_copy_from_host(void *dst, const void *src, size_t bytes, gptc_stream *s) {
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cu(s)), "copy_from_host");
    cuda_check(cudaStreamSynchronize(cu(s)), "copy_from_host");
}
static void cu_copy_to_host(void *dst, const void *src, size_t bytes, gptc_stream *s) {
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cu(s)), "copy_to_host");
    cuda_check(cudaStreamSynchronize(cu(s)), "copy_to_host");
}

static void *cu_alloc_host(size_t bytes) {
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}
static void cu_release_host(void *p) {
    if (p) cuda_check(cudaFreeHost(p), "cudaFreeHost");
}
static void cu_copy_async(void *dst, const void *src, size_t bytes, gptc_stream *s) {
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cu(s)), "copy_async");
}

/* ---- streams and events ---- */

static gptc_stream *cu_stream_create(int high_priority) {
    gptc_stream *st = malloc(sizeof *st);
    if (!st) return NULL;
    int least = 0, greatest = 0; /* numerically, "greatest" priority is the lowest number */
    cuda_check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    st->worker = NULL;
    if (cudaStreamCreateWithPriority(&st->s, cudaStreamNonBlocking,
                                     high_priority ? greatest : least) != cudaSuccess) {
        (void)cudaGetLastError();
        free(st);
        return NULL;
    }
    /* made now, not at the first host function: its pinned counter must not be
     * allocated mid-step (pinned allocation may wait for the whole device) */
    if (!(st->worker = host_worker_create(g.device))) {
        cudaStreamDestroy(st->s);
        free(st);
        return NULL;
    }
    return st;
}
static void cu_stream_destroy(gptc_stream *st) {
    if (!st) return;
    cuda_check(cudaStreamSynchronize(st->s), "stream_destroy");
    host_worker_destroy(st->worker);
    cuda_check(cudaStreamDestroy(st->s), "cudaStreamDestroy");
    free(st);
}
static void cu_stream_synchronize(gptc_stream *s) {
    cuda_check(cudaStreamSynchronize(cu(s)), "stream_synchronize");
}
static gptc_event *cu_event_create(void) {
    gptc_event *ev = malloc(sizeof *ev);
    if (!ev) return NULL;
    if (cudaEventCreateWithFlags(&ev->e, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        free(ev);
        return NULL;
    }
    return ev;
}
/* CUDA releases an event's resources once its pending records and waits are done */
static void cu_event_destroy(gptc_event *ev) {
    if (!ev) return;
    cuda_check(cudaEventDestroy(ev->e), "cudaEventDestroy");
    free(ev);
}
static void cu_event_record(gptc_event *ev, gptc_stream *s) {
    cuda_check(cudaEventRecord(ev->e, cu(s)), "cudaEventRecord");
}
static void cu_stream_wait_event(gptc_stream *s, gptc_event *ev) {
    cuda_check(cudaStreamWaitEvent(cu(s), ev->e, 0), "cudaStreamWaitEvent");
}
static void cu_event_synchronize(gptc_event *ev) {
    cuda_check(cudaEventSynchronize(ev->e), "cudaEventSynchronize");
}
static void cu_launch_host_func(gptc_stream *s, void (*fn)(void *), void *arg) {
    host_worker_launch(s ? s->worker : g.compute_worker, cu(s), fn, arg);
}

/* ---- compute ops ---- */

/* The precision every launcher is given: the type of the act buffers (engine/backend.h) */
static gptc_precision g_precision = GPTC_FP32;
static void cu_set_precision(gptc_precision p) {
    g_precision = p;
    cuda_matmul_set_precision(p);
}
static gptc_precision cu_get_precision(void) { return g_precision; }

static void cu_to_act(gptc_act *dst, const float *src, size_t n, gptc_stream *s) {
    cuda_to_act(dst, src, n, g_precision, cu(s));
    check_launch("to_act");
}
static void cu_embedding_forward(gptc_act *out, const int32_t *tokens, const gptc_act *wte,
                                 const gptc_act *wpe, int N, int T, int C, int v_start,
                                 int v_local, gptc_stream *s) {
    cuda_embedding_forward(out, tokens, wte, wpe, N, T, C, v_start, v_local, g_precision, cu(s));
    check_launch("embedding_forward");
}
static void cu_embedding_backward(float *dwte, float *dwpe, const gptc_act *dout,
                                  const int32_t *tokens, int N, int T, int C, int v_start,
                                  int v_local, gptc_stream *s) {
    cuda_embedding_backward(dwte, dwpe, dout, tokens, N, T, C, v_start, v_local, g_precision,
                            cu(s));
    check_launch("embedding_backward");
}
static void cu_layernorm_forward(gptc_act *out, float *mean, float *rstd, const gptc_act *inp,
                                 const gptc_act *w, const gptc_act *b, int N, int C,
                                 gptc_stream *s) {
    cuda_layernorm_forward(out, mean, rstd, inp, w, b, N, C, g_precision, cu(s));
    check_launch("layernorm_forward");
}
/* whether [p, p + bytes) and [q, q + bytes) share a byte */
static int ranges_overlap(const void *p, const void *q, size_t bytes) {
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
    return a < b + bytes && b < a + bytes;
}

/* one kernel unless res overlaps an input, which its later passes re-read */
static void cu_add_layernorm_forward(gptc_act *res, gptc_act *out, float *mean, float *rstd,
                                     const gptc_act *a, const gptc_act *b, const gptc_act *w,
                                     const gptc_act *bias, int N, int C, gptc_stream *s) {
    size_t bytes = (size_t)N * C * gptc_act_bytes(g_precision);
    if (ranges_overlap(res, a, bytes) || ranges_overlap(res, b, bytes)) {
        cuda_add(res, a, b, (size_t)N * C, g_precision, cu(s));
        cuda_layernorm_forward(out, mean, rstd, res, w, bias, N, C, g_precision, cu(s));
    } else {
        cuda_add_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, C, g_precision,
                                   cu(s));
    }
    check_launch("add_layernorm_forward");
}
static void cu_layernorm_backward(gptc_act *dinp, float *dw, float *db, float *dsum,
                                  const gptc_act *dout, const gptc_act *inp, const gptc_act *w,
                                  const float *mean, const float *rstd, int N, int C,
                                  gptc_stream *s) {
    cuda_layernorm_backward(dinp, dw, db, dsum, dout, inp, w, mean, rstd, N, C, g_precision,
                            cu(s));
    check_launch("layernorm_backward");
}
static void cu_matmul_forward(gptc_act *out, const gptc_act *inp, const gptc_act *w,
                              const gptc_act *bias, int N, int IC, int OC, int w_rows_out,
                              gptc_stream *s) {
    cuda_matmul_forward(out, inp, w, bias, N, IC, OC, w_rows_out, cu(s));
    check_launch("matmul_forward"); /* the bias kernel of a product cuBLASLt does not fuse */
}
static void cu_matmul_backward(gptc_act *dinp, float *dw, float *dbias, const gptc_act *dout,
                               const gptc_act *inp, const gptc_act *w, int N, int IC, int OC,
                               int w_rows_out, gptc_stream *s) {
    cuda_matmul_backward(dinp, dw, dout, inp, w, N, IC, OC, w_rows_out, cu(s));
    check_launch("matmul_backward");
    /* its own pass over dout: cuBLASLt's BGRADA epilogue would take the sums in dw's
     * product, but its algorithms were slower than the plain product and this kernel
     * together (H100, GPT-2 124M bf16 at micro-batch 32: +1.1 ms a step, 2026-11-27) */
    if (dbias) {
        cuda_bias_backward(dbias, dout, N, OC, g_precision, cu(s));
        check_launch("matmul_backward (bias)");
    }
}
static void cu_matmul_gelu_forward(gptc_act *out, gptc_act *pre, const gptc_act *inp,
                                   const gptc_act *w, const gptc_act *bias, int N, int IC,
                                   int OC, gptc_stream *s) {
    cuda_matmul_gelu_forward(out, pre, inp, w, bias, N, IC, OC, cu(s));
    check_launch("matmul_gelu_forward");
}
static void cu_matmul_dgelu_backward(gptc_act *dpre, const gptc_act *dout, const gptc_act *w,
                                     const gptc_act *pre, int N, int IC, int OC,
                                     gptc_stream *s) {
    cuda_matmul_dgelu_backward(dpre, dout, w, pre, N, IC, OC, cu(s));
    check_launch("matmul_dgelu_backward");
}
static size_t cu_attention_state_floats(int B, int T, int NH) { return (size_t)B * NH * T; }
static size_t cu_attention_scratch_floats(int B, int T, int C, int NH) {
    return g_precision == GPTC_BF16 ? cuda_attention_bf16_scratch_floats(B, T, C, NH)
                                    : cu_attention_state_floats(B, T, NH);
}
/* bf16: the tensor-core kernels on bf16 storage (attention_bf16_fwd.cu, attention_bf16_bwd.cu); fp32: attention.cu */
static void cu_attention_forward(gptc_act *out, float *att, const gptc_act *qkv, int B, int T,
                                 int C, int NH, gptc_stream *s) {
    if (g_precision == GPTC_BF16)
        cuda_attention_forward_bf16((uint16_t *)out, att, (const uint16_t *)qkv, B, T, C, NH,
                                    cu(s));
    else
        cuda_attention_forward((float *)out, att, (const float *)qkv, B, T, C, NH, cu(s));
    check_launch("attention_forward");
}
static void cu_attention_backward(gptc_act *dqkv, float *dbias, float *datt,
                                  const gptc_act *dout, const gptc_act *out, const gptc_act *qkv,
                                  const float *att, int B, int T, int C, int NH,
                                  gptc_stream *s) {
    if (g_precision == GPTC_BF16) {
        cuda_attention_backward_bf16((uint16_t *)dqkv, dbias, datt, (const uint16_t *)dout,
                                     (const uint16_t *)out, (const uint16_t *)qkv, att, B, T,
                                     C, NH, cu(s));
    } else {
        cuda_attention_backward((float *)dqkv, datt, (const float *)dout, (const float *)out,
                                (const float *)qkv, att, B, T, C, NH, cu(s));
        /* the fp32 kernels leave it to a pass of its own */
        if (dbias) cuda_bias_backward(dbias, dqkv, B * T, 3 * C, GPTC_FP32, cu(s));
    }
    check_launch("attention_backward");
}
static void cu_gelu_forward(gptc_act *out, const gptc_act *inp, size_t n, gptc_stream *s) {
    cuda_gelu_forward(out, inp, n, g_precision, cu(s));
    check_launch("gelu_forward");
}
static void cu_gelu_backward(gptc_act *dinp, const gptc_act *inp, const gptc_act *dout,
                             size_t n, gptc_stream *s) {
    cuda_gelu_backward(dinp, inp, dout, n, g_precision, cu(s));
    check_launch("gelu_backward");
}
static void cu_add(gptc_act *out, const gptc_act *a, const gptc_act *b, size_t n,
                   gptc_stream *s) {
    cuda_add(out, a, b, n, g_precision, cu(s));
    check_launch("add");
}
static void cu_vocab_max(float *mx, const gptc_act *logits, int N, int Vl, int v_valid,
                         gptc_stream *s) {
    cuda_vocab_max(mx, logits, N, Vl, v_valid, g_precision, cu(s));
    check_launch("vocab_max");
}
static void cu_vocab_expsum(float *stats, const gptc_act *logits, const float *mx,
                            const int32_t *targets, int N, int Vl, int v_valid, int v_start,
                            gptc_stream *s) {
    cuda_vocab_expsum(stats, logits, mx, targets, N, Vl, v_valid, v_start, g_precision, cu(s));
    check_launch("vocab_expsum");
}
static void cu_vocab_ce_finish(float *losses, gptc_act *logits, const float *mx,
                               const float *stats, const int32_t *targets, int N, int Vl,
                               int v_valid, int v_start, float dloss, gptc_stream *s) {
    cuda_vocab_ce_finish(losses, logits, mx, stats, targets, N, Vl, v_valid, v_start, dloss,
                         g_precision, cu(s));
    check_launch("vocab_ce_finish");
}
static void cu_cross_entropy(float *losses, gptc_act *logits, float *mx, float *stats,
                             const int32_t *targets, int N, int Vl, int v_valid, float dloss,
                             gptc_stream *s) {
    cuda_cross_entropy(losses, logits, mx, stats, targets, N, Vl, v_valid, dloss, g_precision,
                       cu(s));
    check_launch("cross_entropy");
}
/* The result comes back to the host, so this waits for the stream: callers sum whole
 * gradient slices, a few per step. */
static double cu_sum_squares(const float *x, size_t n, gptc_stream *s) {
    cuda_sum_squares(g.sumsq_out, g.sumsq_partial, x, n, cu(s));
    check_launch("sum_squares");
    cuda_check(cudaMemcpyAsync(g.sumsq_host, g.sumsq_out, sizeof(double), cudaMemcpyDeviceToHost,
                               cu(s)), "sum_squares");
    cuda_check(cudaStreamSynchronize(cu(s)), "sum_squares");
    return *g.sumsq_host;
}
/* a piece's parameter copy is written only where it is a bf16 buffer of its own: under
 * fp32 the copy compute reads is p itself */
static void cu_adamw(const gptc_adamw_piece *pieces, int n_pieces, const gptc_adamw_step *h,
                     gptc_stream *s) {
    cuda_adamw(pieces, n_pieces, h, g_precision == GPTC_BF16, cu(s));
    check_launch("adamw");
}

/* ---- device timing: CUPTI where it starts, else CUDA events ---- */

static int g_cupti = -1; /* -1 undecided, 0 events, 1 CUPTI */
static int g_spoil;      /* cuda_timer_spoil_op since the op in flight began */
static int *g_spoiled;   /* [g_n_spoiled] this step's ops whose time is not their own */
static int g_n_spoiled, g_cap_spoiled;

void cuda_timer_spoil_op(void) { g_spoil = 1; }

/* Decided at the first step that is timed, so that runs without kernel timing never pay
 * for CUPTI's activity tracing. GPTC_TIMER=events forces the fallback (e.g. under nsys,
 * which owns CUPTI). */
static void cu_timer_reset(void) {
    if (g_cupti < 0) {
        char why[160] = "GPTC_TIMER=events";
        const char *env = getenv("GPTC_TIMER");
        g_cupti = !(env && strcmp(env, "events") == 0) && cupti_timer_start(why, sizeof why) == 0;
        if (g_cupti)
            log_info("kernel timing: CUPTI activity records of every kernel, copy and set\n");
        else
            log_info("kernel timing: CUDA events around each op (CUPTI: %s)\n", why);
    }
    if (g_cupti) cupti_timer_reset();
    else event_timer_reset();
    g_n_spoiled = 0;
}
static int cu_timer_begin(gptc_stream *s) {
    g_spoil = 0;
    return g_cupti == 1 ? cupti_timer_begin(s) : event_timer_begin(s);
}
static void cu_timer_end(int op, gptc_stream *s) {
    if (g_cupti == 1) cupti_timer_end(op, s);
    else event_timer_end(op, s);
    if (g_spoil) {
        g_spoil = 0;
        if (g_n_spoiled == g_cap_spoiled) {
            g_cap_spoiled = g_cap_spoiled ? 2 * g_cap_spoiled : 64;
            g_spoiled = log_realloc(g_spoiled, sizeof(int) * (size_t)g_cap_spoiled,
                                    "the timer's spoiled ops");
        }
        g_spoiled[g_n_spoiled++] = op;
    }
}
static int cu_timer_read(int op, double *start_ms, double *end_ms) {
    for (int i = 0; i < g_n_spoiled; i++)
        if (g_spoiled[i] == op) return -1;
    return g_cupti == 1 ? cupti_timer_read(op, start_ms, end_ms)
                        : event_timer_read(op, start_ms, end_ms);
}

/* a spoiled op's pieces come with its handle, which timer_read refused: the report
 * leaves them out with the op */
static int cu_timer_piece(size_t i, int *op, const char **kernel, double *start_ms,
                          double *end_ms) {
    return g_cupti == 1 ? cupti_timer_piece(i, op, kernel, start_ms, end_ms) : -1;
}

static const gptc_backend CUDA = {
    .name = "cuda",
    .on_device = 1,
    .alloc = cu_alloc,
    .release = cu_release,
    .zero = cu_zero,
    .copy_from_host = cu_copy_from_host,
    .copy_to_host = cu_copy_to_host,
    .alloc_host = cu_alloc_host,
    .release_host = cu_release_host,
    .copy_async = cu_copy_async,
    .synchronize = cu_stream_synchronize,
    .stream_create = cu_stream_create,
    .stream_destroy = cu_stream_destroy,
    .event_create = cu_event_create,
    .event_destroy = cu_event_destroy,
    .event_record = cu_event_record,
    .stream_wait_event = cu_stream_wait_event,
    .event_synchronize = cu_event_synchronize,
    .stream_synchronize = cu_stream_synchronize,
    .launch_host_func = cu_launch_host_func,
    .timer_reset = cu_timer_reset,
    .timer_begin = cu_timer_begin,
    .timer_end = cu_timer_end,
    .timer_read = cu_timer_read,
    .timer_piece = cu_timer_piece,
    .embedding_forward = cu_embedding_forward,
    .embedding_backward = cu_embedding_backward,
    .layernorm_forward = cu_layernorm_forward,
    .add_layernorm_forward = cu_add_layernorm_forward,
    .layernorm_backward = cu_layernorm_backward,
    .set_precision = cu_set_precision,
    .get_precision = cu_get_precision,
    .to_act = cu_to_act,
    .matmul_forward = cu_matmul_forward,
    .matmul_backward = cu_matmul_backward,
    .matmul_gelu_forward = cu_matmul_gelu_forward,
    .matmul_dgelu_backward = cu_matmul_dgelu_backward,
    .attention_state_floats = cu_attention_state_floats,
    .attention_scratch_floats = cu_attention_scratch_floats,
    .attention_forward = cu_attention_forward,
    .attention_backward = cu_attention_backward,
    .gelu_forward = cu_gelu_forward,
    .gelu_backward = cu_gelu_backward,
    .add = cu_add,
    .vocab_max = cu_vocab_max,
    .vocab_expsum = cu_vocab_expsum,
    .vocab_ce_finish = cu_vocab_ce_finish,
    .cross_entropy = cu_cross_entropy,
    .sum_squares = cu_sum_squares,
    .adamw = cu_adamw,
};

int cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/* the architectures the kernels were compiled for, as CMake was given them */
#ifndef GPTC_CUDA_ARCHS
#define GPTC_CUDA_ARCHS "sm_80 and newer"
#endif

const gptc_backend *cuda_backend(int local_rank, char *err, size_t errlen) {
    static int started = 0;
    if (started) return &CUDA;
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess || n == 0) {
        snprintf(err, errlen, "train.device = cuda: no usable GPU (%s)",
                 rc != cudaSuccess ? cudaGetErrorString(rc) : "no device found");
        (void)cudaGetLastError();
        return NULL;
    }
    /* ranks on one node share its GPUs round-robin; several ranks per GPU is allowed
     * (tests on one-GPU machines), the comm layer then picks a backend that copes */
    g.device = local_rank % n;
    if ((rc = cudaSetDevice(g.device)) != cudaSuccess ||
        (rc = cudaStreamCreateWithFlags(&g.compute, cudaStreamNonBlocking)) != cudaSuccess ||
        (rc = cudaMalloc((void **)&g.sumsq_out, sizeof(double))) != cudaSuccess ||
        (rc = cudaMalloc((void **)&g.sumsq_partial,
                         cuda_sum_squares_partials() * sizeof(double))) != cudaSuccess ||
        (rc = cudaMallocHost((void **)&g.sumsq_host, sizeof(double))) != cudaSuccess) {
        snprintf(err, errlen, "train.device = cuda: GPU %d failed to start (%s)", g.device,
                 cudaGetErrorString(rc));
        (void)cudaGetLastError();
        return NULL;
    }
    if ((rc = (cudaError_t)cuda_kernels_runnable()) != cudaSuccess) {
        int major = 0, minor = 0;
        (void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, g.device);
        (void)cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, g.device);
        snprintf(err, errlen, "train.device = cuda: GPU %d (compute capability %d.%d) cannot run "
                 "this build's kernels (%s): they are built for %s (CMAKE_CUDA_ARCHITECTURES)",
                 g.device, major, minor, cudaGetErrorString(rc), GPTC_CUDA_ARCHS);
        return NULL;
    }
    if (!(g.compute_worker = host_worker_create(g.device))) {
        snprintf(err, errlen, "train.device = cuda: could not start the compute stream's host worker");
        return NULL;
    }
    /* a misspelt variant would otherwise run the default without a word */
    if (cuda_attention_bf16_check_env(err, errlen) != 0) return NULL;
    const char *group = getenv("GPTC_ATTENTION_GROUP");
    if (group && group[0]) {
        char *end;
        long n = strtol(group, &end, 10);
        if (*end || n < 1) {
            snprintf(err, errlen, "GPTC_ATTENTION_GROUP = %s: give a positive count of (batch, "
                     "head) pairs (or leave it unset for the L2's)", group);
            return NULL;
        }
    }
    /* comm_group.c's decide_backend forces host-staged MPI on "mpi" and takes NCCL otherwise */
    const char *force = getenv("GPTC_COMM");
    if (force && force[0] && strcmp(force, "mpi") != 0) {
        snprintf(err, errlen, "GPTC_COMM = %s: give mpi (host-staged MPI instead of NCCL), or "
                 "leave it unset", force);
        return NULL;
    }
    const char *timer = getenv("GPTC_TIMER");
    if (timer && timer[0] && strcmp(timer, "events") != 0) {
        snprintf(err, errlen, "GPTC_TIMER = %s: give events (or leave it unset for CUPTI)",
                 timer);
        return NULL;
    }
    if (cuda_matmul_init(err, errlen) != 0) return NULL;
    started = 1;
    return &CUDA;
}

const char *cuda_backend_attention_kernels(int head_size, gptc_precision p, char *buf,
                                           size_t len) {
    if (p != GPTC_BF16) return NULL;
    const char *dq = cuda_attention_bf16_dq_name(head_size);
    snprintf(buf, len, "forward %s, dq %s, qkv bias %s", cuda_attention_bf16_fwd_name(head_size),
             strcmp(dq, "fused") == 0    ? "from the dk/dv kernel"
             : strcmp(dq, "atomic") == 0 ? "from the dk/dv kernel by atomics"
                                         : "by its own kernel",
             cuda_attention_bf16_bias_fused() ? "by the kernels" : "by a pass");
    return buf;
}

int cuda_backend_check_model(int head_size, gptc_precision p, char *err, size_t errlen) {
    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, g.device) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        return 0; /* unknown: the launchers still refuse by name */
    }
    int bf16 = p == GPTC_BF16;
    size_t need = bf16 ? cuda_attention_bf16_smem(head_size) : cuda_attention_smem(head_size);
    if (need <= (size_t)optin) return 0;
    snprintf(err, errlen, "train.device = cuda: the %s attention at head size %d "
             "(model.d_model / model.n_head) needs %.1f KiB of shared memory per block; GPU %d "
             "allows %.1f KiB%s", bf16 ? "bf16" : "fp32", head_size, need / 1024.0, g.device,
             optin / 1024.0,
             !bf16 && head_size % 8 == 0 && cuda_attention_bf16_smem(head_size) <= (size_t)optin
                 ? " (train.precision = bf16 fits)" : "");
    return -1;
}

int cuda_backend_device(void) { return g.device; }

const char *cuda_backend_pci_bus_id(char *buf, int len) {
    if (cudaDeviceGetPCIBusId(buf, len, g.device) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return buf;
}
