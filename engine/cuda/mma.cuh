/* The warp-level tensor-core product, its shared-memory fragment loads (ldmatrix), the
 * asynchronous global-to-shared copies (cp.async) and the bf16 conversion that the bf16
 * kernels use, as small device functions: inline PTX under nvcc (sm_80 and later), and the CPU
 * emulator's own versions (tests/cuda_emu/emu_mma.h) otherwise. This header is the one
 * place where kernel code differs between the two; the emulator's versions follow the
 * PTX ISA's fragment layouts exactly (checked on their own by test_cuda_emu's mma test).
 *
 * Fragments of mma.m16n8k16 .bf16 with fp32 accumulators, for lane = 4 g + t
 * (g = lane >> 2, t = lane & 3); "x,x+1" is one 32-bit register holding two bf16, the
 * lower index in the low half:
 *   A (16 x 16, row-major):  a[0] = A[g][2t, 2t+1]      a[1] = A[g+8][2t, 2t+1]
 *                            a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
 *   B (16 x 8, "col"):       b[0] = B[2t, 2t+1][g]      b[1] = B[2t+8, 2t+9][g]
 *   C, D (16 x 8, fp32):     d[0], d[1] = D[g][2t, 2t+1]  d[2], d[3] = D[g+8][2t, 2t+1]
 * so the accumulators of two n-tiles side by side are, once packed to bf16, exactly the
 * A fragment of the 16 x 16 block they form (the flash-attention trick that keeps P and
 * dS in registers).
 *
 * ldmatrix .x4 loads four 8 x 8 bf16 matrices whose rows lie in shared memory, 16 bytes
 * each, 16-byte aligned: lanes 8i .. 8i+7 give the addresses of matrix i's rows 0..7, and
 * register r[i] of lane 4g + t receives matrix i's row g, columns 2t, 2t+1 (.trans: its
 * column g, rows 2t, 2t+1), the lower index in the low half. That is one A fragment, or
 * the B fragments of two n-tiles, per instruction, from row-major tiles: B from a tile
 * stored [n][k] without .trans, from one stored [k][n] with it.
 *
 * cp.async copies 16 bytes from global to shared memory without passing through
 * registers, so a block loads its next tile while it computes on the current one. A
 * thread's copies form groups (commit); wait(k) returns once all but its newest k groups
 * have landed, and only then (after a __syncthreads for other threads' copies) may the
 * destination be read. */
#ifndef GPTC_MMA_CUH
#define GPTC_MMA_CUH

#include "engine/bf16.h"

#include <stdint.h>

#if defined(__CUDACC__)

/* d[4] += A[16x16] B[16x8] (bf16 operands, fp32 accumulate); all 32 lanes must call it
 * together (mma.sync is warp-collective) */
static __device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4],
                                                      const uint32_t b[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* bf16x2_bits(lo, hi) in one instruction (cvt puts its first source in the high half) */
static __device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* 2^x by the special function unit alone (ex2.approx.ftz, within 2 ulp as exp2f is),
 * where exp2f adds three instructions that keep subnormal results: those flush to 0 here,
 * which in a softmax drops terms below 2^-126 of the largest. The bf16 attention and the
 * one-pass cross-entropy take one per score and were bound by issuing them. */
static __device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* the 32-bit shared-state-space address of a generic pointer to shared memory */
static __device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* r[4] = four 8 x 8 matrices; row_addr is this lane's row (see above). The "memory"
 * clobbers keep the compiler from moving shared-memory loads across the cp.async waits
 * and barriers that order them. */
static __device__ __forceinline__ void ldsm_x4(uint32_t r[4], const uint16_t *row_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(row_addr))
                 : "memory");
}

static __device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const uint16_t *row_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(row_addr))
                 : "memory");
}

/* 16 bytes to dst (shared) from src (global): the first `valid` bytes (0 or 16) copied,
 * the rest zero-filled; both 16-byte aligned */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :
                 : "r"(smem_u32(dst)), "l"(src), "r"(valid)
                 : "memory");
}

static __device__ __forceinline__ void cp_async_commit(void) {
    asm volatile("cp.async.commit_group;" ::: "memory");
}

/* every committed group has landed */
static __device__ __forceinline__ void cp_async_wait_all(void) {
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}

/* every committed group but the newest has landed */
static __device__ __forceinline__ void cp_async_wait_one(void) {
    asm volatile("cp.async.wait_group 1;" ::: "memory");
}

#else
#include "emu_mma.h"
#endif

#endif
