/* Test tool, not part of the engine: one mma.sync m16n8k16 (engine/cuda/mma.cuh) on the
 * CPU emulator, with the fragments scattered and gathered by the PTX ISA's formulas
 * written out per element (section "Matrix Fragments for mma.m16n8k16 with floating
 * point type"), independently of emu_mma.h's way of writing them and of any kernel, so
 * that test_cuda_emu checks the emulator's mma against a plain matrix product. Compiled
 * through xform.py like the kernels of engine/cuda. */
#include "engine/cuda/cuda_common.cuh"
#include "engine/cuda/mma.cuh"

/* One warp: d = a b + c, all row-major floats, a and b already bf16 values. */
__global__ void mma_check_kernel(float *d /* [16][8] */, const float *a /* [16][16] */,
                                 const float *b /* [16][8] */, const float *c /* [16][8] */) {
    int lane = threadIdx.x, groupID = lane >> 2, tig = lane % 4;
    float ae[8], be[4], acc[4];
    for (int i = 0; i < 8; i++) { /* a_i */
        int row = (i < 2 || (i >= 4 && i < 6)) ? groupID : groupID + 8;
        int col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);
        ae[i] = a[row * 16 + col];
    }
    for (int i = 0; i < 4; i++) { /* b_i */
        int row = tig * 2 + (i & 1) + (i >= 2 ? 8 : 0), col = groupID;
        be[i] = b[row * 8 + col];
    }
    for (int i = 0; i < 4; i++) /* c_i */
        acc[i] = c[(i < 2 ? groupID : groupID + 8) * 8 + tig * 2 + (i & 1)];
    uint32_t af[4], bfr[2];
    for (int r = 0; r < 4; r++) af[r] = pack_bf16x2(ae[2 * r], ae[2 * r + 1]);
    for (int r = 0; r < 2; r++) bfr[r] = pack_bf16x2(be[2 * r], be[2 * r + 1]);
    mma_bf16_16816(acc, af, bfr);
    for (int i = 0; i < 4; i++)
        d[(i < 2 ? groupID : groupID + 8) * 8 + tig * 2 + (i & 1)] = acc[i];
}

extern "C" void emu_mma_check(float *d, const float *a, const float *b, const float *c) {
    mma_check_kernel<<<1, 32>>>(d, a, b, c);
}

/* One warp: m[16][16] (bf16 bits) into a shared [16][24] tile by cp.async in two commit
 * groups (rows 0..7, then rows 8..15 with rows 12..15 given src-size 0), then read back by
 * ldmatrix .x4 and .x4.trans; each lane checks what it sees element by element against
 * the PTX ISA's statements, written out here independently of emu_mma.h:
 *   - cp.async.wait_group 1 leaves the newest group in flight (on the emulator its
 *     destination holds the 0xff poison until then), wait_group 0 lands it, and src-size
 *     0 fills zeros;
 *   - ldmatrix: lanes 8i .. 8i+7 address rows 0..7 of matrix i; register i of lane l
 *     holds row l/4, columns 2(l%4) and 2(l%4)+1 of matrix i, the lower column in the low
 *     half; with .trans, column l/4, rows 2(l%4) and 2(l%4)+1.
 * Matrix i is rows 8(i&1).., columns 8(i>>1).. of the tile. bad[lane] counts mismatches. */
__global__ void cp_async_ldsm_check_kernel(int *bad /* [32] */, const uint16_t *m /* [16][16] */) {
    __shared__ float4 tile16[16 * 24 / 8]; /* float4: 16-byte aligned rows */
    uint16_t *tile = (uint16_t *)tile16;   /* [16][24] */
    int lane = threadIdx.x, nbad = 0, row = lane / 2, half = 8 * (lane % 2);
    /* each lane copies 8 elements: row lane / 2, columns half .. half + 7 */
    if (row < 8) cp_async16(tile + row * 24 + half, m + row * 16 + half, 16);
    cp_async_commit();
    if (row >= 8) cp_async16(tile + row * 24 + half, m + row * 16 + half, row < 12 ? 16 : 0);
    cp_async_commit();
    cp_async_wait_one();
    __syncthreads();
    for (int c = half; c < half + 8; c++)
        nbad += tile[row * 24 + c] != (row < 8 ? m[row * 16 + c] : (uint16_t)0xffff);
    cp_async_wait_all();
    __syncthreads();
    for (int c = half; c < half + 8; c++)
        nbad += tile[row * 24 + c] != (row < 12 ? m[row * 16 + c] : (uint16_t)0);

    int i_mine = lane / 8, j_mine = lane % 8; /* the row this lane addresses */
    const uint16_t *addr = tile + (8 * (i_mine & 1) + j_mine) * 24 + 8 * (i_mine >> 1);
    uint32_t r[4], rt[4];
    ldsm_x4(r, addr);
    ldsm_x4_trans(rt, addr);
    for (int i = 0; i < 4; i++) {
        int r0 = 8 * (i & 1), c0 = 8 * (i >> 1), g = lane / 4, t2 = 2 * (lane % 4);
        uint16_t lo = m[(r0 + g) * 16 + c0 + t2], hi = m[(r0 + g) * 16 + c0 + t2 + 1];
        uint16_t tlo = m[(r0 + t2) * 16 + c0 + g], thi = m[(r0 + t2 + 1) * 16 + c0 + g];
        if (r0 + g >= 12) lo = hi = 0;
        if (r0 + t2 >= 12) tlo = 0;
        if (r0 + t2 + 1 >= 12) thi = 0;
        nbad += (r[i] & 0xffffu) != lo || (r[i] >> 16) != hi;
        nbad += (rt[i] & 0xffffu) != tlo || (rt[i] >> 16) != thi;
    }
    bad[lane] = nbad;
}

extern "C" void emu_cp_async_ldsm_check(int *bad, const uint16_t *m) {
    cp_async_ldsm_check_kernel<<<1, 32>>>(bad, m);
}
