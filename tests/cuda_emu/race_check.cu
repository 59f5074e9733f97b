/* Test tool, not part of the engine: kernels with a planted synchronization bug unless
 * made safe. Six are races, so that the racecheck (emu_runtime.c, under
 * GPTC_SANITIZE=thread) is seen to report one: within a block, shared memory a warp writes
 * and another reads, and a cp.async destination another thread reads after the issuing
 * thread's wait (safe: with a barrier); between blocks, blocks writing the same elements
 * (safe: each block its own), and blocks adding into the same elements (safe: by
 * atomicAdd). Kernel 6 is a race within a warp: a lane reads what another wrote with
 * only a shuffle between, which orders no memory (safe: a __syncwarp). Kernel 7 is blocks
 * 0 and 2, of one colour, adding into the same elements from the same thread indices.
 * Two are barriers that not every thread reaches, which the emulator stops at
 * in every build: a thread that skips a __syncthreads, and half a warp at a shuffle.
 * Made safe, they run, and test_cuda_emu checks their results. Compiled through xform.py
 * like the kernels of engine/cuda. */
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

/* 4 blocks of 32: out[32 b + t] = v[t] + b, or (indexed 0) every block to out[t] */
__global__ void race_blocks_kernel(float *out /* [4 * 32] */, const float *v /* [32] */,
                                   int indexed) {
    int t = threadIdx.x, b = blockIdx.x;
    out[(indexed ? 32 * b : 0) + t] = v[t] + (float)b;
}

/* 4 blocks of 32: out[t] += v[t] in every block, by atomicAdd or (atomic 0) a plain += */
__global__ void race_atomic_kernel(float *out /* [32] */, const float *v /* [32] */,
                                   int atomic) {
    int t = threadIdx.x;
    if (atomic) atomicAdd(out + t, v[t]);
    else out[t] += v[t];
}

/* 64 threads: out[t] = v[t % 32] + 2 after a __syncthreads that (all 0) thread 0 skips */
__global__ void sync_skip_kernel(float *out /* [64] */, const float *v /* [32] */, int all) {
    int t = threadIdx.x;
    if (all || t != 0) __syncthreads();
    out[t] = v[t & 31] + 2.0f;
}

/* 64 threads: warp 0 swaps neighbours' values by a shuffle (all 0: only its lanes 0..15
 * get there), then every thread stores its value after a __syncthreads:
 * out[t] = v[t ^ 1] for t < 32, v[t - 32] above */
__global__ void sync_shuffle_kernel(float *out /* [64] */, const float *v /* [32] */, int all) {
    int t = threadIdx.x;
    float x = v[t & 31];
    if (t < (all ? 32 : 16)) x = __shfl_xor_sync(0xffffffffu, x, 1);
    __syncthreads();
    out[t] = x;
}

/* 32 threads: out[t] = v[t ^ 1], through shared memory that lane t ^ 1 wrote; between the
 * write and the read a shuffle (safe 0) or a __syncwarp */
__global__ void race_warp_kernel(float *out /* [32] */, const float *v /* [32] */, int safe) {
    __shared__ float buf[32];
    int t = threadIdx.x;
    buf[t] = v[t];
    if (safe) __syncwarp();
    else (void)__shfl_xor_sync(0xffffffffu, v[t], 1);
    out[t] = buf[t ^ 1];
}

/* 3 blocks of 32: blocks 0 and 2 (one colour of the racecheck's checkerboard) add v[t]
 * into out[t], by atomicAdd or (atomic 0) a plain +=; block 1 stores out[32 + t] = v[t] */
__global__ void race_far_blocks_kernel(float *out /* [64] */, const float *v /* [32] */,
                                       int atomic) {
    int t = threadIdx.x;
    if (blockIdx.x == 1) out[32 + t] = v[t];
    else if (atomic) atomicAdd(out + t, v[t]);
    else out[t] += v[t];
}

/* which: 0 the shared-memory kernel, 1 the cp.async one, 2 the blocks', 3 the atomic
 * one, 4 the skipped __syncthreads, 5 the half-warp shuffle, 6 the warp's, 7 the far
 * blocks'; safe 0 plants the bug */
extern "C" void emu_race_check(int which, int safe, float *out /* [4 * 32] */,
                               const float *v /* [32] */) {
    if (which == 0) race_shared_kernel<<<1, 64>>>(out, v, safe);
    else if (which == 1) race_cp_async_kernel<<<1, 64>>>(out, v, safe);
    else if (which == 2) race_blocks_kernel<<<4, 32>>>(out, v, safe);
    else if (which == 3) race_atomic_kernel<<<4, 32>>>(out, v, safe);
    else if (which == 4) sync_skip_kernel<<<1, 64>>>(out, v, safe);
    else if (which == 5) sync_shuffle_kernel<<<1, 64>>>(out, v, safe);
    else if (which == 6) race_warp_kernel<<<1, 32>>>(out, v, safe);
    else race_far_blocks_kernel<<<3, 32>>>(out, v, safe);
}
