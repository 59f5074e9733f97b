/* Matrix products of the CUDA backend through cuBLASLt, in strict fp32 (TF32 off: the fp32
 * path is the reference the CPU run is compared with), or with bf16 operands for
 * precision = bf16. Shapes and layouts as the op table's matmul_forward / matmul_backward
 * (engine/backend.h). */
#ifndef GPTC_CUDA_MATMUL_H
#define GPTC_CUDA_MATMUL_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "engine/backend.h"

/* Creates the cuBLASLt handle and workspace on the current device; -1 with err set. */
int cuda_matmul_init(char *err, size_t errlen);

/* The precision of the products that follow (engine/backend.h: set_precision). */
void cuda_matmul_set_precision(gptc_precision p);

/* out[N,OC] = inp[N,IC] @ W (+ bias[OC], fused as the GEMM's epilogue) */
void cuda_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                         int N, int IC, int OC, int w_rows_out, cudaStream_t s);
/* dinp[N,IC] = dout @ W^T (skipped when NULL); dw += inp^T @ dout (skipped when NULL) */
void cuda_matmul_backward(float *dinp, float *dw, const float *dout, const float *inp,
                          const float *w, int N, int IC, int OC, int w_rows_out, cudaStream_t s);

/* pre[N,OC] = inp @ W + bias, out = gelu(pre): one GEMM with cuBLASLt's GELU epilogue where
 * it has one for the shape (else the GEMM, then the GELU kernel) */
void cuda_matmul_gelu_forward(float *out, float *pre, const float *inp, const float *w,
                              const float *bias, int N, int IC, int OC, cudaStream_t s);
/* dpre[N,IC] = (dout @ W^T) * gelu'(pre): the DGELU epilogue, or the GEMM then the kernel */
void cuda_matmul_dgelu_backward(float *dpre, const float *dout, const float *w, const float *pre,
                                int N, int IC, int OC, cudaStream_t s);

#endif
