/* Launchers of the CUDA kernels (engine/cuda/ (.cu files)), callable from C. Each one is the op
 * of the same name in engine/backend.h, with the same buffers, shapes and "+=" rules,
 * issued on a CUDA stream; all pointers are device memory. gptc_act buffers hold the type
 * of precision p (float or bf16): kernels load them into fp32 and round once on store. They return at once (the
 * kernels run in stream order) and report launch errors through cuda_check_launch. */
#ifndef GPTC_CUDA_KERNELS_H
#define GPTC_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

void cuda_embedding_forward(gptc_act *out, const int32_t *tokens, const gptc_act *wte,
                            const gptc_act *wpe, int N, int T, int C, int v_start, int v_local,
                            gptc_precision p, cudaStream_t s);
/* dwte rows are accumulated with atomics: tokens repeat within a batch */
void cuda_embedding_backward(float *dwte, float *dwpe, const gptc_act *dout,
                             const int32_t *tokens, int N, int T, int C, int v_start,
                             int v_local, gptc_precision p, cudaStream_t s);

void cuda_layernorm_forward(gptc_act *out, float *mean, float *rstd, const gptc_act *inp,
                            const gptc_act *w, const gptc_act *b, int N, int C,
                            gptc_precision p, cudaStream_t s);
/* act res[N,C] = a + a2 (rounded), then the LayerNorm of res into out, mean, rstd, in one
 * kernel; res must not overlap a or a2. a2 NULL: the LayerNorm of a alone (res unused). */
void cuda_add_layernorm_forward(gptc_act *res, gptc_act *out, float *mean, float *rstd,
                                const gptc_act *a, const gptc_act *a2, const gptc_act *w,
                                const gptc_act *b, int N, int C, gptc_precision p,
                                cudaStream_t s);
void cuda_layernorm_backward(gptc_act *dinp, float *dw, float *db, float *dsum,
                             const gptc_act *dout, const gptc_act *inp, const gptc_act *w,
                             const float *mean, const float *rstd, int N, int C,
                             gptc_precision p, cudaStream_t s);

/* dbias[OC] += column sums of dout[N,OC] (the matmul's bias gradient) */
void cuda_bias_backward(float *dbias, const gptc_act *dout, int N, int OC, gptc_precision p,
                        cudaStream_t s);

/* Flash-style causal attention: the T x T probabilities are never stored. The forward
 * saves lse[B,NH,T], the base-2 log-sum-exp of each query row's scaled scores; the backward
 * uses scratch[B,NH,T] for rowsum(dout * out) and recomputes the probabilities.
 * qkv[B,T,3C] (q|k|v, heads in order), out[B,T,C], dqkv[B,T,3C] = (overwritten). */
void cuda_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C,
                            int NH, cudaStream_t s);
void cuda_attention_backward(float *dqkv, float *scratch, const float *dout,
                             const float *out, const float *qkv, const float *lse, int B,
                             int T, int C, int NH, cudaStream_t s);

/* The shared memory (bytes) a block of the fp32 attention at head size hs (1 to 128)
 * asks for on the current device: the most of its forward's and backward's, with the
 * variants the launchers pick there. Where the device allows less, the launchers refuse
 * (cuda_refuse), and the backend refuses the model at start (cuda_backend_check_model). */
size_t cuda_attention_smem(int hs);

/* The backward's first step, shared by both: D[B,NH,T] = rowsum(dout * out) per head,
 * for act dout, out [B,T,C] of precision p. */
void cuda_attention_dot(float *D, const gptc_act *dout, const gptc_act *out, int B, int T,
                        int C, int NH, gptc_precision p, cudaStream_t s);

/* The same ops for train.precision = bf16 (attention_bf16_fwd.cu and _bwd.cu), with the
 * same buffers and sizes, qkv, out, dout and dqkv in bf16 storage (uint16_t bits):
 * tensor-core products of bf16 operands with fp32 accumulation, the probabilities and their
 * gradients rounded to bf16 as operands; softmax, lse and D in fp32. Head size C / NH must
 * be a multiple of 8 up to 128 (otherwise a launch error, as above). */
void cuda_attention_forward_bf16(uint16_t *out, float *lse, const uint16_t *qkv, int B, int T,
                                 int C, int NH, cudaStream_t s);
/* dbias [3C] (or NULL) += the column sums of dqkv as stored, added by the kernels that
 * hold its values (the bias gradient of the projection that made qkv); scratch
 * [cuda_attention_bf16_scratch_floats] */
void cuda_attention_backward_bf16(uint16_t *dqkv, float *dbias, float *scratch,
                                  const uint16_t *dout, const uint16_t *out, const uint16_t *qkv,
                                  const float *lse, int B, int T, int C, int NH,
                                  cudaStream_t s);
/* as cuda_attention_smem, for these kernels (hs a multiple of 8 up to 128) */
size_t cuda_attention_bf16_smem(int hs);
/* which forward kernel runs at head size hs: "plain" (any hs but 64, or
 * GPTC_ATTENTION_FWD_ROWS=64), "rows128" (hs 64's default: 128 queries a block), or a
 * variant its environment variable chose ("pipelined": GPTC_ATTENTION_FWD=pipelined;
 * "wide": GPTC_ATTENTION_FWD=wide; hs 64 only) */
const char *cuda_attention_bf16_fwd_name(int hs);
/* the same for the backward's dq: "kernel" (its own kernel), or from the dk/dv kernel
 * (hs 64, on a device with two stages' shared memory) by "fused" (GPTC_ATTENTION_DQ=fused:
 * parts summed in order) or "atomic" (GPTC_ATTENTION_DQ=atomic: added by atomics); and 1
 * when the kernels add the qkv bias gradient themselves (the default; 0 under
 * GPTC_ATTENTION_BIAS=0, a pass after them) */
const char *cuda_attention_bf16_dq_name(int hs);
/* 0 when every variant variable (GPTC_ATTENTION_FWD, _FWD_ROWS, _DQ, _BIAS) is unset or
 * holds a value it takes; else -1 and err names the variable, its value and the choices */
int cuda_attention_bf16_check_env(char *err, size_t errlen);
int cuda_attention_bf16_bias_fused(void);
/* floats of the backward's scratch: D [B,NH,T], and with dq from the dk/dv kernel its
 * parts: about B T C T / 128 more (GPTC_ATTENTION_DQ=fused), or B T C rounded up to whole
 * tiles (GPTC_ATTENTION_DQ=atomic) */
size_t cuda_attention_bf16_scratch_floats(int B, int T, int C, int NH);

void cuda_gelu_forward(gptc_act *out, const gptc_act *inp, size_t n, gptc_precision p,
                       cudaStream_t s);
void cuda_gelu_backward(gptc_act *dinp, const gptc_act *inp, const gptc_act *dout, size_t n,
                        gptc_precision p, cudaStream_t s);
void cuda_add(gptc_act *out, const gptc_act *a, const gptc_act *b, size_t n, gptc_precision p,
              cudaStream_t s);
/* act out (column-major m x n, leading dimension ldo) = src (fp32 m x n, packed) + bias[m]
 * per row, rounded once */
void cuda_bias_round(gptc_act *out, int ldo, const float *src, const gptc_act *bias, int m,
                     int n, gptc_precision p, cudaStream_t s);
/* The GELU epilogue of a product left unfused: x = src (fp32 m x n, packed) + bias[m] per
 * row (bias NULL: none); act pre = x and act out = gelu(x), each rounded once from x */
void cuda_bias_gelu_round(gptc_act *out, gptc_act *pre, const float *src, const gptc_act *bias,
                          int m, size_t total, gptc_precision p, cudaStream_t s);
/* The DGELU epilogue: act dpre = src (the fp32 product) * gelu'(pre), rounded once */
void cuda_dgelu_round(gptc_act *dpre, const float *src, const gptc_act *pre, size_t total,
                      gptc_precision p, cudaStream_t s);
/* act dst[n] = src[n] rounded (engine/backend.h: to_act) */
void cuda_to_act(gptc_act *dst, const float *src, size_t n, gptc_precision p, cudaStream_t s);

void cuda_vocab_max(float *mx, const gptc_act *logits, int N, int Vl, int v_valid,
                    gptc_precision p, cudaStream_t s);
void cuda_vocab_expsum(float *stats, const gptc_act *logits, const float *mx,
                       const int32_t *targets, int N, int Vl, int v_valid, int v_start,
                       gptc_precision p, cudaStream_t s);
void cuda_vocab_ce_finish(float *losses, gptc_act *logits, const float *mx, const float *stats,
                          const int32_t *targets, int N, int Vl, int v_valid, int v_start,
                          float dloss, gptc_precision p, cudaStream_t s);
/* the three above on one rank's whole vocabulary (v_start 0): one kernel that reads and
 * writes each row once where it can (bf16, rows of 16-byte groups, Vl <= 57344), else
 * the three */
void cuda_cross_entropy(float *losses, gptc_act *logits, float *mx, float *stats,
                        const int32_t *targets, int N, int Vl, int v_valid, float dloss,
                        gptc_precision p, cudaStream_t s);

/* *out (device, one double) = sum of x[n]^2, summed in double; partial[n_partial] is
 * scratch of cuda_sum_squares_partials() doubles */
size_t cuda_sum_squares_partials(void);
void cuda_sum_squares(double *out, double *partial, const float *x, size_t n, cudaStream_t s);

/* The backend's adamw: a launch for every ADAM_MAX_PIECES pieces (optimizer.cu). bf16: a
 * piece's p_act, unless NULL or p, is a bf16 copy (uint16_t bits) of p to write; else
 * p_act is not written (the fp32 copy is p itself). */
void cuda_adamw(const gptc_adamw_piece *pieces, int n_pieces, const gptc_adamw_step *h,
                int bf16, cudaStream_t s);

/* Fills x[n] with a NaN bit pattern (tests poison outputs before an op). */
void cuda_fill_nan(float *x, size_t n, cudaStream_t s);

/* A kernel that spins until *flag (host-mapped memory written by a host thread) reaches
 * at least target: lets a stream wait for a host thread without a host callback. */
void cuda_wait_flag(const volatile unsigned int *flag, unsigned int target, cudaStream_t s);
/* A one-thread kernel that stores value into *flag (host-mapped) once the stream's
 * earlier work has completed: lets a host thread wait for a stream without a CUDA call. */
void cuda_set_flag(volatile unsigned int *flag, unsigned int value, cudaStream_t s);

/* 0 when the last launch on this thread went well; otherwise the CUDA error code. */
int cuda_check_launch(void);

/* A launcher that cannot run (a shape without a kernel, more shared memory than the
 * device allows) refuses: it launches an empty grid on s, so that cuda_check_launch
 * reports cudaErrorInvalidConfiguration as for any bad launch, and keeps why (printf
 * format) for cuda_launch_why. */
void cuda_refuse(cudaStream_t s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The reason of this thread's last refused launch ("" if none); cleared by the call. */
const char *cuda_launch_why(void);

/* cudaSuccess when the current device can run this build's kernels; otherwise the error
 * (cudaErrorNoKernelImageForDevice: none of the architectures they were compiled for
 * runs there, e.g. machine code for sm_80 and sm_90 on an sm_75) */
int cuda_kernels_runnable(void);

#ifdef __cplusplus
}
#endif

#endif
