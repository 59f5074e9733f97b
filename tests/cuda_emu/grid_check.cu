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

/* Holds its stream for ms milliseconds, so that what is launched after it runs later. */
__global__ void hold_kernel(unsigned int ms) {
    for (unsigned int i = 0; i < ms; i++) __nanosleep(1000000);
}

__global__ void arg_check_kernel(int *out, int v) {
    if (threadIdx.x == 0) *out = v;
}

/* *out = the value a local had when a launch was made (7), read by the grid after the
 * local changed to 9: the launch waits behind a hold of 200 ms on a stream of its own.
 * A CUDA launch evaluates and copies its arguments when it is made. Returns -1 when the
 * stream could not be made. */
extern "C" int emu_arg_check(int *out) {
    cudaStream_t s;
    if (cudaStreamCreate(&s) != cudaSuccess) return -1;
    int v = 7;
    const int *pv = &v;
    hold_kernel<<<1, 1, 0, s>>>(200);
    arg_check_kernel<<<1, 1, 0, s>>>(out, *pv);
    v = 9;
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    return *pv == 9 ? 0 : -1;
}
