/* LayerNorm over the last dimension (eps 1e-5), forward and backward, with the CPU
 * reference's formulas (engine/cpu/cpu_ops.c). */
#include "engine/cuda/cuda_common.cuh"

#define LN_THREADS 256
#define LN_WARPS (LN_THREADS / 32)
#define LN_SMEM_MAX (48 * 1024) /* dynamic shared memory usable without an opt-in */

/* One warp per row: a row is a few thousand floats at most, so the lanes stride it
 * (coalesced) and shuffles reduce it with no shared memory or barrier. The row is read
 * three times (mean, centred variance, output, as the CPU does); the re-reads hit L1.
 * vec8 (bf16, C % 8 == 0, all act buffers 16-byte aligned): a lane takes 8 contiguous
 * columns per access instead of 1 (2-byte loads would waste most of each transaction);
 * it sums its 8 before the next group, which reorders the row sums only. */
__global__ void layernorm_forward_kernel(gptc_act *out /* [N,C] */, float *mean /* [N] */,
                                         float *rstd /* [N] */,
                                         const gptc_act *inp /* [N,C] */,
                                         const gptc_act *w /* [C] */,
                                         const gptc_act *b /* [C] */, int N, int C, int vec8,
                                         int bf16) {
    int lane = threadIdx.x & 31;
    int nwarps = gridDim.x * LN_WARPS;
    for (int n = blockIdx.x * LN_WARPS + (threadIdx.x >> 5); n < N; n += nwarps) {
        size_t x = (size_t)n * C; /* row n of inp and of out */
        if (vec8) {
            float sum = 0.0f;
            for (int c = 8 * lane; c < C; c += 8 * 32) {
                float v[8]; /* columns c .. c+7 of the row */
                act_ld8(v, inp, x + c);
                for (int j = 0; j < 8; j++) sum += v[j];
            }
            float m = warp_sum(sum) / C;
            float var = 0.0f;
            for (int c = 8 * lane; c < C; c += 8 * 32) {
                float v[8]; /* columns c .. c+7 of the row */
                act_ld8(v, inp, x + c);
                for (int j = 0; j < 8; j++) {
                    float d = v[j] - m;
                    var += d * d;
                }
            }
            float r = 1.0f / sqrtf(warp_sum(var) / C + 1e-5f);
            for (int c = 8 * lane; c < C; c += 8 * 32) {
                float v[8], wc[8], bc[8]; /* columns c .. c+7 of the row, of w, of b */
                act_ld8(v, inp, x + c);
                act_ld8(wc, w, c);
                act_ld8(bc, b, c);
                for (int j = 0; j < 8; j++) v[j] = (v[j] - m) * r * wc[j] + bc[j];
                act_st8(out, x + c, v);
            }
            if (lane == 0) {
                mean[n] = m;
                rstd[n] = r;
            }
            continue;
        }
        float sum = 0.0f;
        for (int c = lane; c < C; c += 32) sum += act_ld(inp, x + c, bf16);
        float m = warp_sum(sum) / C;
        float var = 0.0f;
        for (int c = lane; c < C; c += 32) {
            float d = act_ld(inp, x + c, bf16) - m;
            var += d * d;
        }
        float r = 1.0f / sqrtf(warp_sum(var) / C + 1e-5f);
        for (int c = lane; c < C; c += 32)
            act_st(out, x + c,
                   (act_ld(inp, x + c, bf16) - m) * r * act_ld(w, c, bf16) + act_ld(b, c, bf16),
                   bf16);
        if (lane == 0) {
            mean[n] = m;
            rstd[n] = r;
        }
    }
}

/* dinp is per row but dw, db sum over rows. Each block owns a contiguous run of rows and
 * walks it in chunks of LN_WARPS rows. Per chunk, first each warp takes one row (shuffle
 * reductions for the two means, then dinp +=); then each thread takes the columns
 * c = tid + k*LN_THREADS and sums d*xhat and d over the chunk's rows (just read by the
 * warps, so these column-wise reads hit L1) into its own slots of a block-private
 * accumulator: no two threads share a slot, so no atomics and a fixed order. At the end
 * the block adds its accumulator into dw, db with one atomicAdd per column (only the
 * order of the blocks' additions varies). When 2*C floats exceed LN_SMEM_MAX
 * (use_smem = 0) each chunk's column sums go to dw, db by atomicAdd directly.
 * vec8 (bf16, C % 8 == 0, all act buffers 16-byte aligned) moves 16 bytes per access:
 * in the row pass a lane takes 8 contiguous columns (the two means are summed in another
 * order); in the column pass a thread owns the 8 columns 8g .. 8g+7 of its groups
 * g = tid + k*LN_THREADS, slots included, and sums each over the chunk's rows in the
 * same order as with one column per thread. */
__global__ void layernorm_backward_kernel(gptc_act *dinp /* [N,C] */, float *dw /* [C] */,
                                          float *db /* [C] */,
                                          const gptc_act *dout /* [N,C] */,
                                          const gptc_act *inp /* [N,C] */,
                                          const gptc_act *w /* [C] */,
                                          const float *mean /* [N] */,
                                          const float *rstd /* [N] */, int N, int C,
                                          int rows_per_block, int use_smem, int vec8,
                                          int bf16) {
    extern __shared__ float acc[]; /* [2][C]: this block's dw | db sums, when use_smem */
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int cw = vec8 ? 8 : 1; /* columns a thread owns per group in the column pass */
    if (use_smem) {
        /* a thread zeroes and later uses exactly the slots c and C + c of its columns */
        for (int g = threadIdx.x; g < C / cw; g += blockDim.x)
            for (int c = g * cw; c < (g + 1) * cw; c++) acc[c] = acc[C + c] = 0.0f;
    }
    int n_begin = blockIdx.x * rows_per_block;
    int n_end = n_begin + rows_per_block < N ? n_begin + rows_per_block : N;
    for (int n0 = n_begin; n0 < n_end; n0 += LN_WARPS) {
        int n = n0 + warp;
        if (n < n_end && vec8) { /* warp-uniform */
            size_t x = (size_t)n * C; /* row n of inp, dout and dinp */
            float m = mean[n], r = rstd[n];
            float mean_dn = 0.0f, mean_dn_xhat = 0.0f;
            for (int c = 8 * lane; c < C; c += 8 * 32) {
                float xv[8], wv[8], dv[8]; /* columns c .. c+7 of inp's row, w, dout's row */
                act_ld8(xv, inp, x + c);
                act_ld8(wv, w, c);
                act_ld8(dv, dout, x + c);
                for (int j = 0; j < 8; j++) {
                    float xhat = (xv[j] - m) * r;
                    float dn = wv[j] * dv[j];
                    mean_dn += dn;
                    mean_dn_xhat += dn * xhat;
                }
            }
            mean_dn = warp_sum(mean_dn) / C;
            mean_dn_xhat = warp_sum(mean_dn_xhat) / C;
            for (int c = 8 * lane; c < C; c += 8 * 32) {
                float xv[8], wv[8], dv[8], gv[8]; /* columns c .. c+7: inp, w, dout, dinp */
                act_ld8(xv, inp, x + c);
                act_ld8(wv, w, c);
                act_ld8(dv, dout, x + c);
                act_ld8(gv, dinp, x + c);
                for (int j = 0; j < 8; j++) {
                    float xhat = (xv[j] - m) * r;
                    gv[j] = gv[j] + (wv[j] * dv[j] - mean_dn - xhat * mean_dn_xhat) * r;
                }
                act_st8(dinp, x + c, gv);
            }
        } else if (n < n_end) { /* warp-uniform */
            size_t x = (size_t)n * C; /* row n of inp, dout and dinp */
            float m = mean[n], r = rstd[n];
            float mean_dn = 0.0f, mean_dn_xhat = 0.0f;
            for (int c = lane; c < C; c += 32) {
                float xhat = (act_ld(inp, x + c, bf16) - m) * r;
                float dn = act_ld(w, c, bf16) * act_ld(dout, x + c, bf16);
                mean_dn += dn;
                mean_dn_xhat += dn * xhat;
            }
            mean_dn = warp_sum(mean_dn) / C;
            mean_dn_xhat = warp_sum(mean_dn_xhat) / C;
            for (int c = lane; c < C; c += 32) {
                float xhat = (act_ld(inp, x + c, bf16) - m) * r;
                float wc = act_ld(w, c, bf16), dc = act_ld(dout, x + c, bf16);
                act_st(dinp, x + c,
                       act_ld(dinp, x + c, bf16) + (wc * dc - mean_dn - xhat * mean_dn_xhat) * r,
                       bf16);
            }
        }
        int n1 = n0 + LN_WARPS < n_end ? n0 + LN_WARPS : n_end;
        if (vec8) {
            for (int g = threadIdx.x; g < C / 8; g += blockDim.x) {
                int c = 8 * g;
                float pw[8], pb[8]; /* columns c .. c+7: sums over rows n0 .. n1-1 */
                for (int j = 0; j < 8; j++) pw[j] = pb[j] = 0.0f;
                for (int k = n0; k < n1; k++) {
                    float d[8], xv[8]; /* columns c .. c+7 of row k of dout, inp */
                    act_ld8(d, dout, (size_t)k * C + c);
                    act_ld8(xv, inp, (size_t)k * C + c);
                    float mk = mean[k], rk = rstd[k];
                    for (int j = 0; j < 8; j++) {
                        float xhat = (xv[j] - mk) * rk;
                        pw[j] += d[j] * xhat;
                        pb[j] += d[j];
                    }
                }
                for (int j = 0; j < 8; j++) {
                    if (use_smem) {
                        acc[c + j] += pw[j];
                        acc[C + c + j] += pb[j];
                    } else {
                        atomicAdd(dw + c + j, pw[j]);
                        atomicAdd(db + c + j, pb[j]);
                    }
                }
            }
        } else {
            for (int c = threadIdx.x; c < C; c += blockDim.x) {
                float pw = 0.0f, pb = 0.0f;
                for (int k = n0; k < n1; k++) {
                    float d = act_ld(dout, (size_t)k * C + c, bf16);
                    float xhat = (act_ld(inp, (size_t)k * C + c, bf16) - mean[k]) * rstd[k];
                    pw += d * xhat;
                    pb += d;
                }
                if (use_smem) {
                    acc[c] += pw;
                    acc[C + c] += pb;
                } else {
                    atomicAdd(dw + c, pw);
                    atomicAdd(db + c, pb);
                }
            }
        }
    }
    if (use_smem) {
        for (int g = threadIdx.x; g < C / cw; g += blockDim.x) {
            for (int c = g * cw; c < (g + 1) * cw; c++) {
                atomicAdd(dw + c, acc[c]);
                atomicAdd(db + c, acc[C + c]);
            }
        }
    }
}

extern "C" {

void cuda_layernorm_forward(gptc_act *out, float *mean, float *rstd, const gptc_act *inp,
                            const gptc_act *w, const gptc_act *b, int N, int C,
                            gptc_precision p, cudaStream_t s) {
    if (N <= 0 || C <= 0) return;
    int bf16 = p == GPTC_BF16;
    int vec8 = bf16 && C % 8 == 0 && aligned16(out) && aligned16(inp) && aligned16(w) &&
               aligned16(b);
    layernorm_forward_kernel<<<grid_for((size_t)N, LN_WARPS), LN_THREADS, 0, s>>>(
        out, mean, rstd, inp, w, b, N, C, vec8, bf16);
}

void cuda_layernorm_backward(gptc_act *dinp, float *dw, float *db, const gptc_act *dout,
                             const gptc_act *inp, const gptc_act *w, const float *mean,
                             const float *rstd, int N, int C, gptc_precision p,
                             cudaStream_t s) {
    if (N <= 0 || C <= 0) return;
    /* about 4 blocks per SM, each at least one chunk, runs a multiple of the chunk */
    long target = (long)cuda_sm_count() * 4;
    long rows = ((long)N + target - 1) / target;
    rows = (rows + LN_WARPS - 1) / LN_WARPS * LN_WARPS;
    int rows_per_block = (int)rows;
    unsigned int blocks = (unsigned int)(((long)N + rows - 1) / rows);
    size_t smem = 2 * (size_t)C * sizeof(float);
    int use_smem = smem <= LN_SMEM_MAX;
    int bf16 = p == GPTC_BF16;
    int vec8 = bf16 && C % 8 == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) &&
               aligned16(w);
    layernorm_backward_kernel<<<blocks, LN_THREADS, use_smem ? smem : 0, s>>>(
        dinp, dw, db, dout, inp, w, mean, rstd, N, C, rows_per_block, use_smem, vec8, bf16);
}

} /* extern "C" */
