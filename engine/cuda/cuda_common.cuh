/* Device helpers shared by the kernel files (engine/cuda, the .cu files): loads and
 * stores of the activation type, warp and block reductions, and the host-side helpers
 * that size grid-stride launches. */
#ifndef GPTC_CUDA_COMMON_CUH
#define GPTC_CUDA_COMMON_CUH

#include "engine/bf16.h"
#include "engine/cuda/cuda_kernels.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define FULL_MASK 0xffffffffu

/* ------------------------------------------------------------------ activation type */

/* Element i of an act buffer (engine/backend.h: gptc_act) as a float: the bf16 bits
 * widened (exact) when bf16, else the float itself. bf16 is a kernel argument, the same
 * for every thread of a launch, so the branch never diverges; under fp32 the value and
 * hence every result is what a plain float load gave. */
static __device__ __forceinline__ float act_ld(const gptc_act *base, size_t i, int bf16) {
    return bf16 ? bf16_to_float(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

/* Stores x into element i of an act buffer: rounded to nearest even when bf16 (the one
 * rounding of an act output), as is under fp32. */
static __device__ __forceinline__ void act_st(gptc_act *base, size_t i, float x, int bf16) {
    if (bf16) ((uint16_t *)base)[i] = bf16_bits(x);
    else ((float *)base)[i] = x;
}

/* Eight consecutive bf16, 16 bytes: moved with one vector access (ld/st.global.v4)
 * instead of eight 2-byte ones, which would use an eighth of each memory transaction.
 * A plain aligned struct rather than uint4, which the CPU emulator (tests/cuda_emu)
 * does not define; nvcc still emits the v4 access for it. Element 2k is the low half of
 * w[k] (memory order on a little-endian device, as bf16x2_bits packs it). */
typedef struct {
    alignas(16) uint32_t w[4];
} bf16x8;

/* f[0..7] = the 8 bf16 of v, widened (exact) */
static __device__ __forceinline__ void bf16x8_unpack(float f[8], bf16x8 v) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        f[2 * k] = bf16_to_float((uint16_t)(v.w[k] & 0xffffu));
        f[2 * k + 1] = bf16_to_float((uint16_t)(v.w[k] >> 16));
    }
}

/* f[0..7], each rounded once (bf16_bits), packed in memory order */
static __device__ __forceinline__ bf16x8 bf16x8_pack(const float f[8]) {
    bf16x8 v;
#pragma unroll
    for (int k = 0; k < 4; k++) v.w[k] = bf16x2_bits(f[2 * k], f[2 * k + 1]);
    return v;
}

/* f[0..7] = elements i .. i+7 of a bf16 act buffer; base + i must be 16-byte aligned
 * (i a multiple of 8 and base aligned16). */
static __device__ __forceinline__ void act_ld8(float f[8], const gptc_act *base, size_t i) {
    bf16x8_unpack(f, *(const bf16x8 *)((const uint16_t *)base + i));
}

/* f[0..7] = elements i .. i+7 of an act buffer of either type (bf16: one 16-byte load;
 * fp32: two); base + i 16-byte aligned */
static __device__ __forceinline__ void act_ld8_any(float f[8], const gptc_act *base, size_t i,
                                                   int bf16) {
    if (bf16) {
        act_ld8(f, base, i);
        return;
    }
    float4 a = ((const float4 *)((const float *)base + i))[0];
    float4 b = ((const float4 *)((const float *)base + i))[1];
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
    f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

/* elements i .. i+7 of a bf16 act buffer = f[0..7] rounded; alignment as act_ld8 */
static __device__ __forceinline__ void act_st8(gptc_act *base, size_t i, const float f[8]) {
    *(bf16x8 *)((uint16_t *)base + i) = bf16x8_pack(f);
}

/* ------------------------------------------------------------------ warp reductions */

/* Butterfly (xor) reductions: every lane ends with the same, bitwise identical value
 * (each step adds the same two operands in every lane of a pair), so a warp can branch
 * on the result without a broadcast. All 32 lanes must take part. */
static __device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

static __device__ __forceinline__ double warp_sum_double(double v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, off));
    return v;
}

/* ------------------------------------------------------------------ block reductions */

/* Reductions over a whole block (blockDim.x a multiple of 32, at most 1024); every thread
 * gets the result. sh is the caller's scratch: __shared__ float/double sh[32]. The first
 * barrier lets a block call these back to back with the same scratch. The order of the
 * additions depends only on blockDim, so results are deterministic. */
static __device__ __forceinline__ double block_sum_double(double v, double *sh /* [32] */) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_double(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    return warp_sum_double(lane < nw ? sh[lane] : 0.0);
}

static __device__ __forceinline__ float block_max(float v, float *sh /* [32] */) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    return warp_max(lane < nw ? sh[lane] : -INFINITY);
}

/* ------------------------------------------------------------------ host helpers */

/* Multiprocessors of the current device (a driver-cached attribute: cheap to ask per
 * launch, and right when one process drives several devices). */
static inline int cuda_sm_count(void) {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        n <= 0)
        n = 108;
    return n;
}

/* The dynamic shared memory a block of the current device may opt in to (bytes; a
 * driver-cached attribute): 227 KiB on sm_90, 163 on sm_80, 99 on sm_86 / sm_89. 48 KiB,
 * what every device allows, when the query fails. */
static inline int cuda_smem_optin(void) {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        n <= 0)
        n = 48 * 1024;
    return n;
}

/* The shared memory of one multiprocessor (bytes), which its resident blocks share, each
 * with 1 KiB the system keeps: 228 KiB on sm_90. The opt-in plus that 1 KiB when the
 * query fails. */
static inline int cuda_smem_per_sm(void) {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) !=
            cudaSuccess ||
        n <= 0)
        n = cuda_smem_optin() + 1024;
    return n;
}

/* Readies kernel (its address) for blocks of bytes of dynamic shared memory (the opt-in
 * that CUDA asks for above 48 KiB) and returns 1; when this device allows fewer bytes,
 * refuses the launch instead (cuda_refuse), saying what needs how much, and returns 0. */
static inline int cuda_smem_ready(const void *kernel, size_t bytes, const char *what,
                                  cudaStream_t s) {
    int optin = cuda_smem_optin();
    if (bytes > (size_t)optin) {
        cuda_refuse(s, "%s needs %.1f KiB of shared memory per block; this GPU allows %.1f KiB",
                    what, bytes / 1024.0, optin / 1024.0);
        return 0;
    }
    (void)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    return 1;
}

/* Blocks for a grid-stride loop over units work items, per_block items per block per
 * pass: as many as the work needs, capped at a few resident waves of the device (the
 * loop covers the rest, so any size_t count works); at least 1. Callers return early
 * on empty work, so a launch never has 0 blocks. */
static inline unsigned int grid_for(size_t units, int per_block) {
    size_t need = (units + (size_t)per_block - 1) / (size_t)per_block;
    size_t cap = (size_t)cuda_sm_count() * 16;
    if (need > cap) need = cap;
    return need < 1 ? 1u : (unsigned int)need;
}

/* log2(e) / sqrt(hs), the attention scores' factor into the log2 domain, for the forward
 * and the backward of attention.cu and attention_bf16_*.cu alike: the backward's
 * P = exp2(s sl2 - lse) must undo the forward's lse with the same rounding, and
 * log2(e) / sqrtf(hs) and log2(e) * (1 / sqrtf(hs)), which they used, differ in the last
 * bit at hs 48 and 100 (an error of |s sl2| 2^-24 in P's exponent) */
static inline float attention_sl2(int hs) {
    return 1.4426950408889634f * (1.0f / sqrtf((float)hs));
}

/* The attention kernels' blocks: one per (b, h) pair and tile, and the blocks of one pair
 * read the same tiles (K and V in the forward and dq, Q and dO in dk/dv). Blocks start in
 * grid order, x fastest; a grid of (pairs, tiles) runs one pair's blocks a whole row of
 * pairs apart, and once the pairs' tiles outgrow the L2, each block reads them from DRAM
 * again. attention_grid makes it (group, tiles, groups): `group` pairs whose tiles fit in
 * half the L2 run together, longest tile first, then the next group. Pair and tile come
 * from the block index alone (a division would hold them in registers the kernels need:
 * +22 at the bf16 forward, measured with ptxas), and the blocks past the last pair return
 * at once (1 from attention_block: this block has work). */
static __device__ __forceinline__ int attention_block(int pairs, int *bh, int *rank) {
    *bh = (int)(blockIdx.z * gridDim.x + blockIdx.x);
    *rank = (int)blockIdx.y; /* 0: launched first, the longest loop under the causal mask */
    return *bh < pairs;
}

/* The grid of attention_block for B * NH (b, h) pairs of T rows in tiles of `tile` rows,
 * with elements of elem bytes: the tiles a pair's blocks reuse (K and V in the forward
 * and dq, Q and dO in dk/dv) take 2 T hs elements. GPTC_ATTENTION_GROUP = n sets the
 * group instead (n >= B * NH: the plain grid (pairs, tiles)), so that a benchmark can
 * compare the orders in one run. */
static inline dim3 attention_grid(int B, int NH, int T, int hs, int tile, size_t elem) {
    long pairs = (long)B * NH;
    size_t bytes_per_pair = 2 * (size_t)T * hs * elem;
    static long forced = -1;
    if (forced < 0) {
        const char *v = getenv("GPTC_ATTENTION_GROUP");
        forced = v && atol(v) > 0 ? atol(v) : 0;
    }
    long group = forced;
    if (group <= 0) {
        int dev = 0, l2 = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) != cudaSuccess || l2 <= 0)
            l2 = 40 << 20;
        group = (long)((size_t)l2 / 2 / bytes_per_pair);
        if (group < 1) group = 1;
    }
    if (group > pairs) group = pairs;
    long groups = (pairs + group - 1) / group;
    if (groups > 65535) groups = 65535; /* grid z's limit */
    group = (pairs + groups - 1) / groups; /* groups as even as can be: few idle blocks */
    return dim3((unsigned int)group, (unsigned int)((T + tile - 1) / tile),
                (unsigned int)((pairs + group - 1) / group));
}

/* 1 when p may be read or written as float4 (16-byte aligned); NULL counts as aligned */
static inline int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

#endif
