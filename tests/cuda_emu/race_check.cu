/* Test tool, not part of the engine: two kernels that are races without their barrier,
 * so that the racecheck (emu_runtime.c, under GPTC_SANITIZE=thread) is seen to report
 * one: shared memory a warp writes and another reads, and a cp.async destination another
 * thread reads after the issuing thread's wait. With the barrier, the same kernels are
 * race-free, and test_cuda_emu checks their results. Compiled through xform.py like the
 * kernels of engine/cuda. */
#include "engine/cuda/cuda_common.cuh"
#include "engine/cuda/mma.cuh"

/* 64 threads: warp 0 stores v[i] + 1 to shared memory, warp 1 reads it into out */
__global__ void race_shared_kernel(float *out /* [32] */, const float *v /* [32] */,
                                   int barrier) {
    __shared__ float buf[32];
    int t = threadIdx.x;
    if (t < 32) buf[t] = v[t] + 1.0f;
    if (barrier) __syncthreads();
    if (t >= 32) out[t - 32] = buf[t - 32];
}

/* 64 threads: warp 0 copies v (as 8 float4) into shared memory by cp.async and waits for
 * its copies, warp 1 reads them into out */
__global__ void race_cp_async_kernel(float *out /* [32] */, const float *v /* [32] */,
                                     int barrier) {
    __shared__ float4 tile[8];
    int t = threadIdx.x;
    if (t < 8) cp_async16(&tile[t], v + 4 * t, 16);
    cp_async_commit();
    cp_async_wait_all();
    if (barrier) __syncthreads();
    if (t >= 32) out[t - 32] = ((const float *)tile)[t - 32];
}

/* which: 0 the shared-memory kernel, 1 the cp.async one; barrier 0 makes it a race */
extern "C" void emu_race_check(int which, int barrier, float *out, const float *v) {
    if (which == 0) race_shared_kernel<<<1, 64>>>(out, v, barrier);
    else race_cp_async_kernel<<<1, 64>>>(out, v, barrier);
}
