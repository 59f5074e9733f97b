/* NVTX ranges (profile.nvtx), so that an Nsight Systems capture names gptc's steps, ops
 * and collectives. Builds with CUDA use NVTX v3 (header-only: without a profiler attached
 * a range costs a few nanoseconds); builds without it link engine/nvtx_none.c. Ranges
 * nest per thread. */
#ifndef GPTC_NVTX_H
#define GPTC_NVTX_H

void nvtx_enable(int on);
/* 1 where ranges can reach a tool (this build has NVTX), 0 where they are no-ops */
int nvtx_built(void);
void nvtx_push(const char *name);
void nvtx_pop(void);

#endif
