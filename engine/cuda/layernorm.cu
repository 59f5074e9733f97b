/* LayerNorm over the last dimension (eps 1e-5), forward and backward, with the CPU
 * reference's formulas (engine/cpu/cpu_ops.c). */
#include "engine/cuda/cuda_common.cuh"

#define LN_THREADS 256
#define LN_WARPS (LN_THREADS / 32)
#define LN_SMEM_MAX (48 * 1024) /* dynamic shared memory usable without an opt-in */

/* One warp per row: a row is a few thousand floats at most, so the lanes stride it
 * (coalesced) and shuffles reduce it with no shared memory or barrier. The row is read
 * three times (mean, centred variance, output, as the CPU does); the re-reads hit L1. */
__global__ void layernorm_forward_kernel(float *out /* [N,C] */, float *mean /* [N] */,
                                         float *rstd /* [N] */, const float *inp /* [N,C] */,
                                         const float *w /* [C] */, const float *b /* [C] */,
                                         int N, int C) {
    int lane = threadIdx.x & 31;
    int nwarps = gridDim.x * LN_WARPS;
    for (int n = blockIdx.x * LN_WARPS + (threadIdx.x >> 5); n < N; n += nwarps) {
        const float *x = inp + (size_t)n * C;
        float sum = 0.0f;
        for (int c = lane; c < C; c += 32) sum += x[c];
        float m = warp_sum(sum) / C;
        float var = 0.0f;
        for (int c = lane; c < C; c += 32) {
            float d = x[c] - m;
            var += d * d;
        }
        float r = 1.0f / sqrtf(warp_sum(var) / C + 1e-5f);
        float *o = out + (size_t)n * C;
        for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * r * w[c] + b[c];
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
 * (use_smem = 0) each chunk's column sums go to dw, db by atomicAdd directly. */
__global__ void layernorm_backward_kernel(float *dinp /* [N,C] */, float *dw /* [C] */,
                                          float *db /* [C] */, const float *dout /* [N,C] */,
                                          const float *inp /* [N,C] */,
                                          const float *w /* [C] */, const float *mean /* [N] */,
                                          const float *rstd /* [N] */, int N, int C,
                                          int rows_per_block, int use_smem) {
    extern __shared__ float acc[]; /* [2][C]: this block's dw | db sums, when use_smem */
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (use_smem) {
        /* a thread zeroes and later uses exactly the slots c and C + c of its columns */
        for (int c = threadIdx.x; c < C; c += blockDim.x) acc[c] = acc[C + c] = 0.0f;
    }
    int n_begin = blockIdx.x * rows_per_block;
    int n_end = n_begin + rows_per_block < N ? n_begin + rows_per_block : N;
    for (int n0 = n_begin; n0 < n_end; n0 += LN_WARPS) {
        int n = n0 + warp;
        if (n < n_end) { /* warp-uniform */
            const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
            float *dx = dinp + (size_t)n * C;
            float m = mean[n], r = rstd[n];
            float mean_dn = 0.0f, mean_dn_xhat = 0.0f;
            for (int c = lane; c < C; c += 32) {
                float xhat = (x[c] - m) * r, dn = w[c] * d[c];
                mean_dn += dn;
                mean_dn_xhat += dn * xhat;
            }
            mean_dn = warp_sum(mean_dn) / C;
            mean_dn_xhat = warp_sum(mean_dn_xhat) / C;
            for (int c = lane; c < C; c += 32) {
                float xhat = (x[c] - m) * r;
                dx[c] += (w[c] * d[c] - mean_dn - xhat * mean_dn_xhat) * r;
            }
        }
        int n1 = n0 + LN_WARPS < n_end ? n0 + LN_WARPS : n_end;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float pw = 0.0f, pb = 0.0f;
            for (int k = n0; k < n1; k++) {
                float d = dout[(size_t)k * C + c];
                float xhat = (inp[(size_t)k * C + c] - mean[k]) * rstd[k];
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
    if (use_smem) {
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            atomicAdd(dw + c, acc[c]);
            atomicAdd(db + c, acc[C + c]);
        }
    }
}

extern "C" {

void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *w, const float *b, int N, int C, cudaStream_t s) {
    if (N <= 0 || C <= 0) return;
    layernorm_forward_kernel<<<grid_for((size_t)N, LN_WARPS), LN_THREADS, 0, s>>>(
        out, mean, rstd, inp, w, b, N, C);
}

void cuda_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                             const float *inp, const float *w, const float *mean,
                             const float *rstd, int N, int C, cudaStream_t s) {
    if (N <= 0 || C <= 0) return;
    /* about 4 blocks per SM, each at least one chunk, runs a multiple of the chunk */
    long target = (long)cuda_sm_count() * 4;
    long rows = ((long)N + target - 1) / target;
    rows = (rows + LN_WARPS - 1) / LN_WARPS * LN_WARPS;
    int rows_per_block = (int)rows;
    unsigned int blocks = (unsigned int)(((long)N + rows - 1) / rows);
    size_t smem = 2 * (size_t)C * sizeof(float);
    int use_smem = smem <= LN_SMEM_MAX;
    layernorm_backward_kernel<<<blocks, LN_THREADS, use_smem ? smem : 0, s>>>(
        dinp, dw, db, dout, inp, w, mean, rstd, N, C, rows_per_block, use_smem);
}

} /* extern "C" */
