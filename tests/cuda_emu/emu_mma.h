/* Test tool, not part of the engine: the CPU emulator's versions of the device functions
 * of engine/cuda/mma.cuh (which includes this file when it is not compiled by nvcc):
 * mma.sync, ldmatrix, cp.async and the bf16 pair conversion.
 * mma.sync is warp-collective: each lane hands in its fragments, the warp meets at a
 * barrier (emu_warp_gather, like a shuffle), and each lane picks the two rows of A and
 * two columns of B it needs out of all 32 lanes' fragments by the PTX ISA's layout
 * ("Matrix Fragments for mma.m16n8k16 with floating point type"; mma.cuh repeats it) and
 * computes its own four elements of D.
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

typedef struct {
    uint32_t a[4], b[2];
} emu_mma_frag;

/* One bf16 of a gathered fragment register: the low half for an even index */
static inline float emu_frag_half(uint32_t w, int odd) {
    return bf16_to_float((uint16_t)(odd ? w >> 16 : w & 0xffffu));
}

static inline void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    emu_mma_frag mine = {{a[0], a[1], a[2], a[3]}, {b[0], b[1]}}, all[32];
    emu_warp_gather(&mine, all, sizeof mine);
    int lane = (int)(threadIdx.x & 31u), g = lane >> 2, t = lane & 3;
    /* this lane's rows g, g + 8 of A and columns 2t, 2t + 1 of B, found by inverting the
     * layout: A[row][col] is in lane 4 (row % 8) + (col % 8) / 2, register
     * a[row / 8 + 2 (col / 8)], half col % 2; B[k][n] in lane 4n + (k % 8) / 2, register
     * b[k / 8], half k % 2 */
    float arow[2][16]; /* A's rows g, g + 8 */
    float bcol[2][16]; /* B's columns 2t, 2t + 1 */
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 16; k++) {
            arow[h][k] = emu_frag_half(all[4 * g + ((k & 7) >> 1)].a[h | ((k >> 3) << 1)], k & 1);
            bcol[h][k] = emu_frag_half(all[4 * (2 * t + h) + ((k & 7) >> 1)].b[k >> 3], k & 1);
        }
    for (int i = 0; i < 4; i++) { /* d[i]: row g (+8 if i >= 2), col 2t + (i & 1) */
        double s = 0;
        for (int k = 0; k < 16; k++) s += (double)arow[i >> 1][k] * bcol[i & 1][k];
        d[i] = (float)(d[i] + s);
    }
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
