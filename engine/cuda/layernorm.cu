/* LayerNorm over the last dimension (eps 1e-5), forward and backward, with the CPU
 * reference's formulas (engine/cpu/cpu_ops.c). */
#include "engine/cuda/cuda_common.cuh"

#define LN_THREADS 256
#define LN_WARPS (LN_THREADS / 32)

/* Element i of the row being normalised: inp's, or with the residual add fused (inp2 not
 * NULL) inp + inp2 rounded once to the act type, the value the add would have stored. */
static __device__ __forceinline__ float ln_in(const gptc_act *inp, const gptc_act *inp2,
                                              size_t i, int bf16) {
    float v = act_ld(inp, i, bf16);
    if (!inp2) return v;
    v += act_ld(inp2, i, bf16);
    return bf16 ? bf16_to_float(bf16_bits(v)) : v;
}

/* ln_in for elements i .. i+7 of bf16 buffers (act_ld8's alignment) */
static __device__ __forceinline__ void ln_in8(float v[8], const gptc_act *inp,
                                              const gptc_act *inp2, size_t i) {
    act_ld8(v, inp, i);
    if (!inp2) return;
    float y[8]; /* elements i .. i+7 of inp2 */
    act_ld8(y, inp2, i);
    for (int j = 0; j < 8; j++) v[j] = bf16_to_float(bf16_bits(v[j] + y[j]));
}

/* One warp per row: a row is a few thousand floats at most, so the lanes stride it
 * (coalesced) and shuffles reduce it with no shared memory or barrier. The row is read
 * three times (mean, centred variance, output, as the CPU does); the re-reads hit L1.
 * vec8 (bf16, C % 8 == 0, all act buffers 16-byte aligned): a lane takes 8 contiguous
 * columns per access instead of 1 (2-byte loads would waste most of each transaction);
 * it sums its 8 before the next group, which reorders the row sums only.
 * With inp2 (the residual add fused in front): the row is inp + inp2 (ln_in), stored to
 * res on the first pass; the later passes add again from inp and inp2, which L1 holds,
 * rather than read back res (so res must not overlap them). That saves the add's own
 * launch and one pass over the residual stream in memory. */
__global__ void layernorm_forward_kernel(gptc_act *out /* [N,C] */, float *mean /* [N] */,
                                         float *rstd /* [N] */,
                                         gptc_act *res /* [N,C], NULL without inp2 */,
                                         const gptc_act *inp /* [N,C] */,
                                         const gptc_act *inp2 /* [N,C] or NULL */,
                                         const gptc_act *w /* [C] */,
                                         const gptc_act *b /* [C] */, int N, int C, int vec8,
                                         int bf16) {
    int lane = threadIdx.x & 31;
    int nwarps = gridDim.x * LN_WARPS;
    for (int n = blockIdx.x * LN_WARPS + (threadIdx.x >> 5); n < N; n += nwarps) {
        size_t x = (size_t)n * C; /* row n of inp, inp2, res and out */
        if (vec8) {
            float sum = 0.0f;
            for (int c = 8 * lane; c < C; c += 8 * 32) {
                float v[8]; /* columns c .. c+7 of the row */
                ln_in8(v, inp, inp2, x + c);
                if (inp2) act_st8(res, x + c, v); /* already rounded: stored exactly */
                for (int j = 0; j < 8; j++) sum += v[j];
            }
            float m = warp_sum(sum) / C;
            float var = 0.0f;
            for (int c = 8 * lane; c < C; c += 8 * 32) {
                float v[8]; /* columns c .. c+7 of the row */
                ln_in8(v, inp, inp2, x + c);
                for (int j = 0; j < 8; j++) {
                    float d = v[j] - m;
                    var += d * d;
                }
            }
            float r = 1.0f / sqrtf(warp_sum(var) / C + 1e-5f);
            for (int c = 8 * lane; c < C; c += 8 * 32) {
                float v[8], wc[8], bc[8]; /* columns c .. c+7 of the row, of w, of b */
                ln_in8(v, inp, inp2, x + c);
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
        for (int c = lane; c < C; c += 32) {
            float v = ln_in(inp, inp2, x + c, bf16);
            if (inp2) act_st(res, x + c, v, bf16);
            sum += v;
        }
        float m = warp_sum(sum) / C;
        float var = 0.0f;
        for (int c = lane; c < C; c += 32) {
            float d = ln_in(inp, inp2, x + c, bf16) - m;
            var += d * d;
        }
        float r = 1.0f / sqrtf(warp_sum(var) / C + 1e-5f);
        for (int c = lane; c < C; c += 32)
            act_st(out, x + c,
                   (ln_in(inp, inp2, x + c, bf16) - m) * r * act_ld(w, c, bf16) +
                       act_ld(b, c, bf16),
                   bf16);
        if (lane == 0) {
            mean[n] = m;
            rstd[n] = r;
        }
    }
}

/* dinp is per row but dw, db sum over rows. Each block owns a contiguous run of rows;
 * warp w takes rows n_begin + w, + LN_WARPS, ... (per row: shuffle reductions for the two
 * means, then dinp +=), and while it has a row's dout and xhat in registers it adds
 * dout * xhat and dout into slice w % slices of the block's shared accumulator (and, with
 * dsum, the new dinp as stored: a third sum, the bias gradient of a projection). With
 * slices = LN_WARPS (C up to ~3600 on sm_90) no two warps share a slot: plain adds in a
 * fixed order. With fewer slices (larger C) the warps that share one add with shared
 * atomics. At the end the block sums its slices in order and adds the result into dw, db
 * with one atomicAdd per column (the order of the blocks' additions varies anyway). When
 * not even one slice fits (slices = 0) each row's terms go to dw, db by atomicAdd.
 * vec8 (bf16, C % 8 == 0, all act buffers 16-byte aligned) moves 16 bytes per access: a
 * lane takes 8 contiguous columns (the two means are summed in another order), and its
 * slots are laid out by ln_slot so that the lanes' float4 accesses are consecutive. */
static __device__ __forceinline__ int ln_slot(int c, int vec8) {
    if (!vec8) return c; /* lanes take consecutive columns: consecutive words */
    /* column c = 256 k + 8 l + 4 h + e is lane l's half h of its group k: slot
     * ((2 k + h) 32 + l) 4 + e, so each half is one float4 and the 32 lanes' float4 of a
     * (k, h) are contiguous */
    int k = c >> 8, l = (c >> 3) & 31, h = (c >> 2) & 1, e = c & 3;
    return (((2 * k + h) * 32 + l) << 2) + e;
}

/* floats in one warp's dw (or db) slice: ln_slot's range */
static __host__ __device__ __forceinline__ int ln_slice(int C, int vec8) {
    return vec8 ? (C + 255) / 256 * 256 : C;
}

/* slot[0..3] += a[0..3], slot[128..131] += a[4..7]: lane's two float4 of a vec8 group
 * (ln_slot: h = 1 lies 32 float4 further); by atomics when warps share the slice */
static __device__ __forceinline__ void ln_add8(float *slot, const float a[8], int shared) {
    if (shared) {
        for (int j = 0; j < 4; j++) {
            atomicAdd(slot + j, a[j]);
            atomicAdd(slot + 128 + j, a[4 + j]);
        }
        return;
    }
    float4 *p = (float4 *)slot;
    float4 lo = p[0], hi = p[32];
    p[0] = make_float4(lo.x + a[0], lo.y + a[1], lo.z + a[2], lo.w + a[3]);
    p[32] = make_float4(hi.x + a[4], hi.y + a[5], hi.z + a[6], hi.w + a[7]);
}

/* 4 blocks an SM at most (the launcher's wave): 64 registers a thread fit them, where
 * ptxas would take 72 with dsum's sums and leave room for 3 (sm_90, nvcc 13.0; no spill
 * at 56) */
__global__ void __launch_bounds__(LN_THREADS, 4)
layernorm_backward_kernel(gptc_act *dinp /* [N,C] */, float *dw /* [C] */, float *db /* [C] */,
                          float *dsum /* [C] or NULL */, const gptc_act *dout /* [N,C] */,
                          const gptc_act *inp /* [N,C] */, const gptc_act *w /* [C] */,
                          const float *mean /* [N] */, const float *rstd /* [N] */, int N,
                          int C, int rows_per_block, int slices, int vec8, int bf16) {
    /* [slices][nacc][S], S = ln_slice(C, vec8): the dw | db (| dsum) sums of warps w,
     * w + slices, ... */
    extern __shared__ float4 ln_smem[];
    float *acc = (float *)ln_smem;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int S = ln_slice(C, vec8), nacc = dsum ? 3 : 2;
    int shared = slices < LN_WARPS; /* warps share a slice: atomics */
    float *acc_w = acc + (size_t)(slices ? warp % slices : 0) * nacc * S, *acc_b = acc_w + S;
    float *acc_s = acc_b + S; /* only with dsum */
    if (slices) {
        for (int i = threadIdx.x; i < slices * nacc * S; i += blockDim.x) acc[i] = 0.0f;
        __syncthreads();
    }
    int n_begin = blockIdx.x * rows_per_block;
    int n_end = n_begin + rows_per_block < N ? n_begin + rows_per_block : N;
    for (int n = n_begin + warp; n < n_end; n += LN_WARPS) {
        size_t x = (size_t)n * C; /* row n of inp, dout and dinp */
        float m = mean[n], r = rstd[n];
        float mean_dn = 0.0f, mean_dn_xhat = 0.0f;
        if (vec8) { /* uniform */
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
                float pw[8];                      /* dout * xhat of those columns */
                act_ld8(xv, inp, x + c);
                act_ld8(wv, w, c);
                act_ld8(dv, dout, x + c);
                act_ld8(gv, dinp, x + c);
                for (int j = 0; j < 8; j++) {
                    float xhat = (xv[j] - m) * r;
                    gv[j] = gv[j] + (wv[j] * dv[j] - mean_dn - xhat * mean_dn_xhat) * r;
                    pw[j] = dv[j] * xhat;
                }
                act_st8(dinp, x + c, gv);
                if (dsum) /* the values as stored */
                    for (int j = 0; j < 8; j++) gv[j] = bf16_to_float(bf16_bits(gv[j]));
                if (slices) {
                    ln_add8(acc_w + ln_slot(c, 1), pw, shared);
                    ln_add8(acc_b + ln_slot(c, 1), dv, shared);
                    if (dsum) ln_add8(acc_s + ln_slot(c, 1), gv, shared);
                } else {
                    for (int j = 0; j < 8; j++) {
                        atomicAdd(dw + c + j, pw[j]);
                        atomicAdd(db + c + j, dv[j]);
                        if (dsum) atomicAdd(dsum + c + j, gv[j]);
                    }
                }
            }
            continue;
        }
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
            float g = dsum ? act_ld(dinp, x + c, bf16) : 0.0f; /* as stored */
            if (slices && !shared) {
                acc_w[c] += dc * xhat;
                acc_b[c] += dc;
                if (dsum) acc_s[c] += g;
            } else if (slices) {
                atomicAdd(acc_w + c, dc * xhat);
                atomicAdd(acc_b + c, dc);
                if (dsum) atomicAdd(acc_s + c, g);
            } else {
                atomicAdd(dw + c, dc * xhat);
                atomicAdd(db + c, dc);
                if (dsum) atomicAdd(dsum + c, g);
            }
        }
    }
    if (!slices) return;
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        int slot = ln_slot(c, vec8);
        float sw = 0.0f, sb = 0.0f, ss = 0.0f;
        for (int k = 0; k < slices; k++) {
            const float *a = acc + (size_t)k * nacc * S + slot;
            sw += a[0];
            sb += a[S];
            if (dsum) ss += a[2 * S];
        }
        atomicAdd(dw + c, sw);
        atomicAdd(db + c, sb);
        if (dsum) atomicAdd(dsum + c, ss);
    }
}

extern "C" {

void cuda_layernorm_forward(gptc_act *out, float *mean, float *rstd, const gptc_act *inp,
                            const gptc_act *w, const gptc_act *b, int N, int C,
                            gptc_precision p, cudaStream_t s) {
    cuda_add_layernorm_forward(NULL, out, mean, rstd, inp, NULL, w, b, N, C, p, s);
}

void cuda_add_layernorm_forward(gptc_act *res, gptc_act *out, float *mean, float *rstd,
                                const gptc_act *a, const gptc_act *a2, const gptc_act *w,
                                const gptc_act *b, int N, int C, gptc_precision p,
                                cudaStream_t s) {
    if (N <= 0 || C <= 0) return;
    int bf16 = p == GPTC_BF16;
    int vec8 = bf16 && C % 8 == 0 && aligned16(out) && aligned16(a) && aligned16(w) &&
               aligned16(b) && (!a2 || (aligned16(a2) && aligned16(res)));
    layernorm_forward_kernel<<<grid_for((size_t)N, LN_WARPS), LN_THREADS, 0, s>>>(
        out, mean, rstd, a2 ? res : NULL, a, a2, w, b, N, C, vec8, bf16);
}

void cuda_layernorm_backward(gptc_act *dinp, float *dw, float *db, float *dsum,
                             const gptc_act *dout, const gptc_act *inp, const gptc_act *w,
                             const float *mean, const float *rstd, int N, int C,
                             gptc_precision p, cudaStream_t s) {
    if (N <= 0 || C <= 0) return;
    int bf16 = p == GPTC_BF16;
    int vec8 = bf16 && C % 8 == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) &&
               aligned16(w);
    /* a slice per warp if they fit, else as many as fit (a power of two: warps w and
     * w + slices share one), else none */
    size_t slice_bytes = (dsum ? 3 : 2) * (size_t)ln_slice(C, vec8) * sizeof(float);
    int slices = LN_WARPS;
    size_t optin = (size_t)cuda_smem_optin();
    while (slices > 0 && slices * slice_bytes > optin) slices /= 2;
    size_t smem = slices * slice_bytes;
    /* one wave of blocks, up to 4 an SM (fewer where their slices take the SM's shared
     * memory: 3 at C 768 with dsum), each at least a row per warp, so that each warp's
     * slice sums several rows before the block's one atomicAdd per column */
    long per_sm = (long)cuda_smem_per_sm() / (long)(smem + 1024);
    if (per_sm > 4) per_sm = 4;
    if (dsum && per_sm < 2 && slices == LN_WARPS) {
        /* the third sum would leave one block an SM (8 warps: C 768 on a 100 KiB sm_86 or
         * sm_89), too few to keep memory busy: the sums take a pass of their own */
        cuda_layernorm_backward(dinp, dw, db, NULL, dout, inp, w, mean, rstd, N, C, p, s);
        cuda_bias_backward(dsum, dinp, N, C, p, s);
        return;
    }
    if (per_sm < 1) per_sm = 1;
    long target = (long)cuda_sm_count() * per_sm;
    long rows = ((long)N + target - 1) / target;
    rows = (rows + LN_WARPS - 1) / LN_WARPS * LN_WARPS;
    int rows_per_block = (int)rows;
    unsigned int blocks = (unsigned int)(((long)N + rows - 1) / rows);
    /* fits by construction: this only sets the kernel's opt-in */
    if (!cuda_smem_ready((const void *)layernorm_backward_kernel, smem, "the layernorm backward",
                         s))
        return;
    layernorm_backward_kernel<<<blocks, LN_THREADS, smem, s>>>(
        dinp, dw, db, dsum, dout, inp, w, mean, rstd, N, C, rows_per_block, slices, vec8, bf16);
}

} /* extern "C" */
