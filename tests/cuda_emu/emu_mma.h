/* Test tool, not part of the engine: the CPU emulator's versions of the device functions
 * of engine/cuda/mma.cuh (which includes this file when it is not compiled by nvcc):
 * mma.sync, ldmatrix, cp.async and the bf16 pair conversion.
 * mma.sync is warp-collective: each lane hands in its fragments, the warp meets at a
 * barrier (as at a shuffle), and each lane picks the two rows of A and two columns of B
 * it needs out of all 32 lanes' fragments by the PTX ISA's layout ("Matrix Fragments for
 * mma.m16n8k16 with floating point type"; mma.cuh repeats it) and computes its own four
 * elements of D. That is emu_mma_bf16_16816 in emu_runtime.c, outside the kernels' code:
 * under ThreadSanitizer the kernels are instrumented, and their reads of a copy of the
 * warp's fragments (registers, no memory the racecheck is about) took most of a bf16
 * racecheck's time.
 * Products of bf16 are exact in float; the sum of the 16 is taken in double and added
 * to the accumulator once, which is at least as accurate as the tensor core (so results
 * agree with the GPU to fp32 rounding, not bitwise). */
#ifndef GPTC_CUDA_EMU_MMA_H
#define GPTC_CUDA_EMU_MMA_H

#include "cuda_runtime.h"
#include "engine/bf16.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

static inline void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    emu_mma_bf16_16816(d, a, b);
}

static inline uint32_t pack_bf16x2(float lo, float hi) { return bf16x2_bits(lo, hi); }

/* ex2.approx.ftz: a subnormal argument counts as 0, a subnormal result is 0 (the
 * approximation itself is left out: the host's exp2f is within it) */
static inline float exp2_ftz(float x) {
    if (fabsf(x) < FLT_MIN) x = 0.0f;
    float y = exp2f(x);
    return y < FLT_MIN ? 0.0f : y;
}

/* ldmatrix .x4 (mma.cuh): the lanes' row addresses meet as a gather; lane 4g + t reads
 * word t of row g of each matrix (trans: the halves at column g of rows 2t, 2t + 1).
 * Rows must be 16-byte aligned, as on the GPU. */
static inline void emu_ldsm_x4(uint32_t r[4], const uint16_t *row_addr, int trans) {
    const uint16_t *rows[32];
    if ((uintptr_t)row_addr & 15u) emu_fail("ldmatrix: a row address not 16-byte aligned");
    emu_warp_gather(&row_addr, rows, sizeof row_addr);
    int lane = (int)(threadIdx.x & 31u), g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) {
        const uint16_t *const *m = rows + 8 * i; /* matrix i's rows */
        uint32_t lo = trans ? m[2 * t][g] : m[g][2 * t];
        uint32_t hi = trans ? m[2 * t + 1][g] : m[g][2 * t + 1];
        r[i] = lo | hi << 16;
    }
}

static inline void ldsm_x4(uint32_t r[4], const uint16_t *row_addr) { emu_ldsm_x4(r, row_addr, 0); }
static inline void ldsm_x4_trans(uint32_t r[4], const uint16_t *row_addr) {
    emu_ldsm_x4(r, row_addr, 1);
}

/* cp.async: queued by the emulator, made at the wait that covers it (emu_runtime.c) */
static inline void cp_async16(void *dst, const void *src, int valid) {
    emu_cp_async(dst, src, 16, (unsigned int)valid);
}
static inline void cp_async_commit(void) { emu_cp_async_commit(); }
static inline void cp_async_wait_all(void) { emu_cp_async_wait(0); }
static inline void cp_async_wait_one(void) { emu_cp_async_wait(1); }

#endif
