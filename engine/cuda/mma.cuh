/* The warp-level tensor-core product and the bf16 conversion the bf16 kernels use, as
 * small device functions: inline PTX under nvcc (sm_80 and later), and the CPU
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
 * dS in registers). */
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

#else
#include "emu_mma.h"
#endif

#endif
