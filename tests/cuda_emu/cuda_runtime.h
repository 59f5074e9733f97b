/* Test tool, not part of the engine: the device side of CUDA for the CPU emulator of
 * tests/cuda_emu. When the emulated kernels are compiled, this header stands in for the
 * toolkit's <cuda_runtime.h>. It has two parts:
 *   - the emulator runtime's C interface (emu_runtime.c implements it), and
 *   - under C++ only, the CUDA built-ins the kernels use (threadIdx, __syncthreads,
 *     __shfl_xor_sync, atomicAdd, float4, dim3, ...), each mapped onto that runtime.
 * The kernels are compiled as C++ (nvcc compiles .cu files as C++ too); the few C++
 * features used here are those CUDA's own API needs, each noted where it is used. A
 * built-in a kernel uses and this header lacks is a compile error: add it here. */
#ifndef GPTC_CUDA_EMU_RUNTIME_H
#define GPTC_CUDA_EMU_RUNTIME_H

#include "cuda_runtime_api.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------ runtime (C) */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct emu_uint3 {
    unsigned int x, y, z;
} emu_uint3;

/* threadIdx and blockIdx of the calling CUDA thread (each one is a host thread) */
extern __thread emu_uint3 emu_thread_idx, emu_block_idx;
extern __thread emu_uint3 emu_block_dim, emu_grid_dim;
extern __thread void *emu_dyn_smem; /* the block's dynamic shared memory (extern __shared__) */

void emu_syncthreads(void);
/* __syncwarp of the full warp: a barrier of its lanes that orders their memory */
void emu_syncwarp(unsigned int mask);
/* One step of a warp shuffle: every lane of the warp passes its value (size bytes) in
 * `in` and receives lane src_lane's in `out`. */
void emu_warp_exchange(const void *in, void *out, size_t size, int src_lane);
/* A warp-collective step where every lane needs every lane's data (ldmatrix, emu_mma.h):
 * each lane passes size bytes (at most EMU_GATHER_MAX) in `in` and receives all 32
 * lanes' in out[32 * size], lane 0 first. Full warps only. */
#define EMU_GATHER_MAX 32
void emu_warp_gather(const void *in, void *out, size_t size);
/* mma.sync.aligned.m16n8k16 with bf16 A (a[4]) and B (b[2]) and fp32 D (d[4]), each lane
 * with its fragments of them (emu_mma.h) */
void emu_mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]);
/* cp.async of n bytes (valid from src, then zeros) from global to shared memory, queued
 * until emu_cp_async_wait covers it; commit closes a group; wait(k) makes every committed
 * group's copies but the newest k groups' (cp.async.wait_group k) */
void emu_cp_async(void *dst, const void *src, unsigned int n, unsigned int valid);
void emu_cp_async_commit(void);
void emu_cp_async_wait(unsigned int newest);
/* Prints "cuda_emu: " msg, with the calling CUDA thread if any, and aborts. */
void emu_fail(const char *msg);

/* A launch: body(ctx) runs once per thread of every block of grid, as block threads at a
 * time, in stream's order (NULL: before this returns); then free_ctx(ctx). ctx (the
 * kernel's arguments) is ctx_bytes long. kernel (its
 * address) only identifies the kernel for the shared memory limit, name for messages.
 * A bad configuration sets the calling thread's last error instead (ctx is freed). */
typedef void (*emu_body_fn)(void *ctx);
void emu_launch_kernel(const void *kernel, const char *name, emu_uint3 grid, emu_uint3 block,
                       size_t dyn_smem, cudaStream_t stream, emu_body_fn body, void *ctx,
                       size_t ctx_bytes, void (*free_ctx)(void *));
void emu_nanosleep(unsigned int ns);

#ifdef __cplusplus
}
#endif

/* ------------------------------------------------------------------ built-ins (C++) */

#ifdef __cplusplus

/* Every function is a host function. A __shared__ variable (the kernels declare them
 * inside kernels only) becomes a function-level static placed in the section emu_shared,
 * which the runtime fills with 0xff bytes (NaN as float and as double) before each
 * block: one block runs at a time, so one static per kernel is the block's copy, and a
 * read of shared memory the block has not written gives NaN. */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ __attribute__((section("emu_shared"))) static

#define threadIdx emu_thread_idx
#define blockIdx emu_block_idx
#define blockDim emu_block_dim
#define gridDim emu_grid_dim

/* C++: CUDA's dim3 has this constructor; the launchers write dim3 grid(x, y) and pass
 * plain integers where a dim3 is expected. */
struct dim3 {
    unsigned int x, y, z;
    dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

/* 16-byte aligned as on the GPU, where a misaligned float4 access faults: here it is
 * undefined behaviour that UBSan (the GPTC_SANITIZE=address build) reports. */
struct alignas(16) float4 {
    float x, y, z, w;
};
static inline float4 make_float4(float x, float y, float z, float w) {
    float4 r = {x, y, z, w};
    return r;
}
/* 8-byte aligned, as float4 is 16 */
struct alignas(8) float2 {
    float x, y;
};
static inline float2 make_float2(float x, float y) {
    float2 r = {x, y};
    return r;
}

static inline void __syncthreads(void) { emu_syncthreads(); }
static inline void __syncwarp(unsigned int mask = 0xffffffffu) { emu_syncwarp(mask); }

/* C++ overloads: CUDA overloads the shuffle on the value type. Only full-warp masks
 * exist in the kernels; a partial mask stops the test (it is not emulated). */
static inline float __shfl_xor_sync(unsigned int mask, float v, int lane_mask) {
    float r;
    if (mask != 0xffffffffu) emu_fail("__shfl_xor_sync: partial masks are not emulated");
    emu_warp_exchange(&v, &r, sizeof v, (int)(threadIdx.x & 31u) ^ lane_mask);
    return r;
}
static inline double __shfl_xor_sync(unsigned int mask, double v, int lane_mask) {
    double r;
    if (mask != 0xffffffffu) emu_fail("__shfl_xor_sync: partial masks are not emulated");
    emu_warp_exchange(&v, &r, sizeof v, (int)(threadIdx.x & 31u) ^ lane_mask);
    return r;
}

/* A relaxed atomic, as on the GPU: in the kernel's own code, so that a racecheck build
 * sees it (as an atomic: no race with another atomicAdd, and no order either). */
static inline float atomicAdd(float *p, float v) {
    unsigned int *w = (unsigned int *)p, seen = __atomic_load_n(w, __ATOMIC_RELAXED), sum;
    float old;
    do {
        memcpy(&old, &seen, sizeof old);
        float s = old + v;
        memcpy(&sum, &s, sizeof sum);
    } while (!__atomic_compare_exchange_n(w, &seen, sum, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}
static inline float __ldg(const float *p) { return *p; }
static inline float4 __ldg(const float4 *p) { return *p; }
static inline unsigned int __ldg(const unsigned int *p) { return *p; }
static inline unsigned short __ldg(const unsigned short *p) { return *p; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}
/* a real sleep: a kernel polling the host (wait_flag_kernel) must leave the few cores to
 * the threads it waits for */
static inline void __nanosleep(unsigned int ns) { emu_nanosleep(ns); }
static inline void __threadfence_system(void) { __sync_synchronize(); }

/* xform.py turns kernel<<<grid, block, smem, stream>>>(a, b) into
 *   emu_launch((const void *)kernel, "kernel", [emu_k = kernel, emu_a0 = (a), emu_a1 = (b)]()
 *              { emu_k(emu_a0, emu_a1); }, grid, block, smem, stream)
 * C++: the lambda carries the kernel's arguments (evaluated and copied at the launch, as a
 * launch does), and
 * a template is the only way to name its type; emu_call turns it into the plain
 * function pointer + context that the C runtime takes. The launch runs later, on its
 * stream's thread, so the lambda is copied to the heap (new) and deleted by emu_free
 * once the grid ran. The default arguments let a launch leave out smem and stream, as
 * <<<...>>> does. */
template <typename F> static void emu_call(void *ctx) { (*(F *)ctx)(); }
template <typename F> static void emu_free(void *ctx) { delete (F *)ctx; }

template <typename F>
static void emu_launch(const void *kernel, const char *name, F body, dim3 grid, dim3 block,
                       size_t dyn_smem = 0, cudaStream_t stream = 0) {
    emu_uint3 g = {grid.x, grid.y, grid.z}, b = {block.x, block.y, block.z};
    emu_launch_kernel(kernel, name, g, b, dyn_smem, stream, emu_call<F>, new F(body), sizeof(F),
                      emu_free<F>);
}

#endif /* __cplusplus */

#endif
