/* NVTX ranges (profile.nvtx), so that an Nsight Systems capture names gptc's steps, ops
 * and collectives. Builds with CUDA use NVTX v3 (header-only: without a profiler attached
 * a range costs a few nanoseconds); builds without it link engine/nvtx_none.c. Ranges
 * nest per thread. */
#ifndef GPTC_NVTX_H
#define GPTC_NVTX_H

void nvtx_enable(int on);
void nvtx_push(const char *name);
void nvtx_pop(void);

#endif
