/* The BLAS under the CPU backend: OpenBLAS, loaded at run time so that its kernel can be
 * chosen for this CPU first. OpenBLAS 0.3.21 does not recognise recent Xeons and falls
 * back to its SSE3 (Prescott) kernels, 5x slower than the AVX-512 ones the hardware runs;
 * its choice is made when the library loads, from OPENBLAS_CORETYPE. So unless the user
 * set that variable, we set it from the CPU's features and only then dlopen the library. */
#ifndef GPTC_CPU_BLAS_H
#define GPTC_CPU_BLAS_H

#include <cblas.h>

/* Loads OpenBLAS once (thread-safe); returns 0, or -1 (cpu_blas_error says why). */
int cpu_blas_init(void);
/* why cpu_blas_init failed, one line ("" before it, or when it did not) */
const char *cpu_blas_error(void);
/* The kernel family OpenBLAS runs, e.g. "SkylakeX" (after cpu_blas_init). */
const char *cpu_blas_corename(void);
/* cblas_sgemm, row-major; same arguments as CBLAS. */
void cpu_sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
               float alpha, const float *A, int lda, const float *B, int ldb, float beta,
               float *C, int ldc);

#endif
