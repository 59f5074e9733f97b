/* Matrix products of the CUDA backend through cuBLASLt, accumulated in strict fp32 (TF32
 * off: the fp32 path is the reference the CPU run is compared with). Under precision =
 * bf16 the act buffers are bf16 in memory: operands read exactly, act outputs rounded once
 * from the fp32 accumulator (after the bias or GELU epilogue), fp32 weight gradients.
 * Shapes and layouts as the op table's matmul_forward / matmul_backward
 * (engine/backend.h). */
#ifndef GPTC_CUDA_MATMUL_H
#define GPTC_CUDA_MATMUL_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "engine/backend.h"

/* Creates the cuBLASLt handle and workspace on the current device; -1 with err set. */
int cuda_matmul_init(char *err, size_t errlen);

/* The precision of the products that follow (engine/backend.h: set_precision): the type
 * of every gptc_act buffer below (fp32, or bf16 with fp32 accumulation). */
void cuda_matmul_set_precision(gptc_precision p);

/* GPTC_GEMM_CANDIDATES (cuda_matmul.c's top comment): how many plans timed their
 * candidates so far, how many took their choice from GPTC_GEMM_CACHE instead, and in how
 * many of both the heuristic's first was not the choice. */
void cuda_matmul_tuning(int *tuned, int *cached, int *not_first);
/* Plans made so far, and how many of them were dropped for another from a full table
 * (the one used longest ago goes) */
void cuda_matmul_plans(long *made, long *dropped);

/* act out[N,OC] = inp[N,IC] @ W (+ bias[OC], fused as the GEMM's epilogue; under bf16 with
 * rows of partial 16-byte groups, added to the fp32 product by a kernel), all act */
void cuda_matmul_forward(gptc_act *out, const gptc_act *inp, const gptc_act *w,
                         const gptc_act *bias, int N, int IC, int OC, int w_rows_out,
                         cudaStream_t s);
/* act dinp[N,IC] = dout @ W^T (skipped when NULL); fp32 dw += inp^T @ dout (skipped when
 * NULL); dout, inp, w act */
void cuda_matmul_backward(gptc_act *dinp, float *dw, const gptc_act *dout, const gptc_act *inp,
                          const gptc_act *w, int N, int IC, int OC, int w_rows_out,
                          cudaStream_t s);

/* pre[N,OC] = inp @ W + bias, out = gelu(pre), all act: one GEMM with cuBLASLt's GELU
 * epilogue where it has one for the shape (else the GEMM, then the GELU kernel, which
 * under bf16 reads the rounded pre) */
void cuda_matmul_gelu_forward(gptc_act *out, gptc_act *pre, const gptc_act *inp,
                              const gptc_act *w, const gptc_act *bias, int N, int IC, int OC,
                              cudaStream_t s);
/* dpre[N,IC] = (dout @ W^T) * gelu'(pre), all act: the DGELU epilogue, or the GEMM then the
 * kernel (under bf16 the product is then rounded once more, where dpre holds it) */
void cuda_matmul_dgelu_backward(gptc_act *dpre, const gptc_act *dout, const gptc_act *w,
                                const gptc_act *pre, int N, int IC, int OC, cudaStream_t s);

#endif
