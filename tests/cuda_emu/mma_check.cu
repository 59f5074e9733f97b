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
