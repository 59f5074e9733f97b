/* Builds without CUDA have no NVTX headers; ranges are then no-ops. */
#include "engine/nvtx.h"

void nvtx_enable(int on) {}
void nvtx_push(const char *name) {}
void nvtx_pop(void) {}
