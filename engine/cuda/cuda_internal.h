/* What the CUDA backend shares with the other CUDA-aware host code (comm over NCCL,
 * device timing); plain C with the CUDA runtime's types. */
#ifndef GPTC_CUDA_INTERNAL_H
#define GPTC_CUDA_INTERNAL_H

#include "engine/backend.h"

#include <cuda_runtime_api.h>
#include <stddef.h>

/* The CUDA stream behind a backend stream (NULL: the compute stream). */
cudaStream_t cuda_stream_of(gptc_stream *s);
/* Ends the process with one line naming the rank and the call when rc is an error: a
 * failed CUDA call leaves the context unusable, and mpirun then stops the other ranks. */
void cuda_check(cudaError_t rc, const char *what);

/* A stream's host worker (engine/cuda/host_tasks.c): runs host functions in the stream's
 * order on a thread of its own. */
typedef struct host_worker host_worker;
host_worker *host_worker_create(int device);
void host_worker_destroy(host_worker *w);
void host_worker_launch(host_worker *w, cudaStream_t s, void (*fn)(void *), void *arg);

/* The op table's device timer (engine/backend.h), two ways: CUPTI activity records of the
 * kernels each op launched (timer_cupti.c), or CUDA events around the op's launches
 * (timer_events.c). cupti_timer_start returns -1 where CUPTI cannot run. */
void event_timer_reset(void);
int event_timer_begin(gptc_stream *s);
void event_timer_end(int op, gptc_stream *s);
int event_timer_read(int op, double *start_ms, double *end_ms);
int cupti_timer_start(char *why, size_t whylen);
void cupti_timer_reset(void);
int cupti_timer_begin(gptc_stream *s);
void cupti_timer_end(int op, gptc_stream *s);
int cupti_timer_read(int op, double *start_ms, double *end_ms);
int cupti_timer_piece(size_t i, int *op, const char **kernel, double *start_ms, double *end_ms);
/* Called inside an op that ran work besides its own (cuda_matmul.c timing its cuBLASLt
 * candidates): the op's device time is then not its own, so the timer reads it as
 * untimed and the report leaves it out. */
void cuda_timer_spoil_op(void);

#endif
