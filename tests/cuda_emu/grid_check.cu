/* Test tool, not part of the engine: which blocks a 3-D grid runs (the attention kernels'
 * grids are 3-D, engine/cuda/cuda_common.cuh attention_grid), for test_cuda_emu. Compiled
 * through xform.py like the kernels of engine/cuda. */
#include "engine/cuda/cuda_common.cuh"

/* Each block's thread 0 adds 1 at its own index and records the coordinates it saw. */
__global__ void grid_check_kernel(int *count /* [gz][gy][gx] */,
                                  int *coords /* [gz][gy][gx][3] */) {
    if (threadIdx.x != 0) return;
    size_t i = ((size_t)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    count[i] += 1;
    coords[3 * i] = (int)blockIdx.x;
    coords[3 * i + 1] = (int)blockIdx.y;
    coords[3 * i + 2] = (int)blockIdx.z;
}

extern "C" void emu_grid_check(int *count, int *coords, unsigned int gx, unsigned int gy,
                               unsigned int gz) {
    grid_check_kernel<<<dim3(gx, gy, gz), 32>>>(count, coords);
}
