/* What the CUDA backend shares with the other CUDA-aware host code (comm over NCCL,
 * device timing); plain C with the CUDA runtime's types. */
#ifndef GPTC_CUDA_INTERNAL_H
#define GPTC_CUDA_INTERNAL_H

#include "engine/backend.h"

#include <cuda_runtime_api.h>

/* The CUDA stream behind a backend stream (NULL: the compute stream). */
cudaStream_t cuda_stream_of(gptc_stream *s);
/* Ends the process with one line naming the rank and the call when rc is an error: a
 * failed CUDA call leaves the context unusable, and mpirun then stops the other ranks. */
void cuda_check(cudaError_t rc, const char *what);

/* The device timer of the op table (engine/cuda/cuda_timer.c). */
void cuda_timer_reset(void);
int cuda_timer_mark(gptc_stream *s);
double cuda_timer_read(int mark);

#endif
