/* Vocab-parallel softmax cross-entropy in three steps around two all-reduces (see
 * cpu_vocab_max / cpu_vocab_expsum / cpu_vocab_ce_finish): this rank holds Vl columns
 * of the padded vocab starting at global column v_start; the first v_valid are real.
 * A row is Vl logits (50304/tp: tens of thousands), so each kernel gives a row to one
 * block whose threads stride the columns (coalesced) and reduce with a block reduction.
 * When vec (the buffer 16-byte aligned and every row too: Vl % 4 == 0 under fp32,
 * Vl % 8 == 0 under bf16) a thread moves 16 bytes per access, a float4 or 8 bf16
 * (act_ld8 / act_st8: 2-byte accesses would waste most of each transaction), and the
 * columns past the last whole group go one by one. The logits are of the activation type
 * (act_ld / act_st); mx, stats and losses fp32. */
#include "engine/cuda/cuda_common.cuh"
#include "engine/cuda/mma.cuh"

#define CE_THREADS 512

/* number of valid columns, clamped into [0, Vl] so a bad v_valid never leaves the row */
static __device__ __forceinline__ int valid_cols(int v_valid, int Vl) {
    return v_valid < 0 ? 0 : v_valid > Vl ? Vl : v_valid;
}

/* the select of cpu's row_max: a NaN operand x is skipped */
static __device__ __forceinline__ float max_sel(float a, float x) { return x > a ? x : a; }

/* mx[n] = max over the valid columns (-inf if none); one block per row. */
__global__ void vocab_max_kernel(float *mx /* [N] */, const gptc_act *logits /* [N,Vl] */,
                                 int N, int Vl, int v_valid, int vec, int bf16) {
    __shared__ float sh[32]; /* block_max scratch */
    int n = blockIdx.x, nv = valid_cols(v_valid, Vl), done = 0;
    size_t row_start = (size_t)n * Vl;
    const float *row = (const float *)logits + row_start; /* only read when vec and fp32 */
    float m = -INFINITY;
    if (vec && bf16) { /* the maximum does not depend on the order */
        for (int i = threadIdx.x; i < nv / 8; i += blockDim.x) {
            float x[8]; /* columns 8i .. 8i+7 */
            act_ld8(x, logits, row_start + 8 * (size_t)i);
            for (int j = 0; j < 8; j++) m = max_sel(m, x[j]);
        }
        done = nv / 8 * 8;
    } else if (vec) {
        for (int i = threadIdx.x; i < nv / 4; i += blockDim.x) {
            float4 x = ((const float4 *)row)[i];
            m = max_sel(max_sel(max_sel(max_sel(m, x.x), x.y), x.z), x.w);
        }
        done = nv / 4 * 4;
    }
    for (int i = done + threadIdx.x; i < nv; i += blockDim.x)
        m = max_sel(m, act_ld(logits, row_start + i, bf16));
    m = block_max(m, sh);
    if (threadIdx.x == 0) mx[n] = m;
}

/* One block per row, the logits only read: stats[n] = the sum of exp(logit - mx) over the
 * valid columns, each thread summing in double and the block in double (the CPU sums
 * 256-element float blocks in double; this is at least as accurate); stats[N + n] =
 * target logit - mx if this rank holds the target among its valid columns, else 0. */
__global__ void vocab_expsum_kernel(float *stats /* [2,N] */,
                                    const gptc_act *logits /* [N,Vl] */,
                                    const float *mx /* [N] */, const int32_t *targets /* [N] */,
                                    int N, int Vl, int v_valid, int v_start, int vec,
                                    int bf16) {
    __shared__ double sh[32]; /* block_sum_double scratch */
    int n = blockIdx.x, nv = valid_cols(v_valid, Vl), done = 0;
    size_t row_start = (size_t)n * Vl;
    const float *row = (const float *)logits + row_start; /* only read when vec and fp32 */
    float shift = mx[n];
    double acc = 0.0;
    if (vec && bf16) { /* groups wholly among the valid columns; padding is not read */
        for (int i = threadIdx.x; i < nv / 8; i += blockDim.x) {
            float x[8]; /* columns 8i .. 8i+7 */
            act_ld8(x, logits, row_start + 8 * (size_t)i);
            for (int j = 0; j < 8; j++) acc += expf(x[j] - shift);
        }
        done = nv / 8 * 8;
    } else if (vec) {
        for (int i = threadIdx.x; i < nv / 4; i += blockDim.x) {
            float4 x = ((const float4 *)row)[i];
            acc += (double)expf(x.x - shift) + (double)expf(x.y - shift) +
                   (double)expf(x.z - shift) + (double)expf(x.w - shift);
        }
        done = nv / 4 * 4;
    }
    for (int i = done + threadIdx.x; i < nv; i += blockDim.x)
        acc += expf(act_ld(logits, row_start + i, bf16) - shift);
    acc = block_sum_double(acc, sh);
    if (threadIdx.x == 0) {
        int y = targets[n] - v_start;
        stats[n] = (float)acc;
        stats[N + n] = y >= 0 && y < nv ? act_ld(logits, row_start + y, bf16) - shift : 0.0f;
    }
}

/* the gradient of column i from e = exp(logit - shift): p * dloss (p = e / sum, as
 * e * (dloss / sum) on the CPU), minus dloss on the target, 0 on padded columns */
static __device__ __forceinline__ float ce_grad_of(float e, int i, int nv, int y, float scale,
                                                   float dloss) {
    if (i >= nv) return 0.0f;
    float g = e * scale;
    return i == y ? g - dloss : g;
}

static __device__ __forceinline__ float ce_grad(float x, int i, int nv, int y, float shift,
                                                float scale, float dloss) {
    return ce_grad_of(expf(x - shift), i, nv, y, scale, dloss);
}

#define CE_LOG2E 1.4426950408889634f

/* exp(x - m) in the log2 domain, as the attention kernels take it, given ml2 = m * log2(e):
 * one fused multiply-add and the hardware exp2 (exp2_ftz), where expf spends about ten
 * instructions (the one-pass kernel takes two exponentials per logit and was bound by
 * issuing them: 3.6 ms a step with expf on an H100, 2.5 with exp2f). Within about 2e-6
 * of expf for the 20 units below the max where terms still count, so a bf16 gradient
 * may lie one rounding from the CPU's. */
static __device__ __forceinline__ float ce_exp(float x, float ml2) {
    return exp2_ftz(fmaf(x, CE_LOG2E, -ml2));
}

/* One block per row over all Vl columns (valid and padded): every logit is read and its
 * gradient written over it by one thread, so no barrier is needed. */
__global__ void vocab_ce_finish_kernel(float *losses /* [N] */, gptc_act *logits /* [N,Vl] */,
                                       const float *mx /* [N] */,
                                       const float *stats /* [2,N] */,
                                       const int32_t *targets /* [N] */, int N, int Vl,
                                       int v_valid, int v_start, float dloss, int vec,
                                       int bf16) {
    int n = blockIdx.x, nv = valid_cols(v_valid, Vl), done = 0;
    size_t row_start = (size_t)n * Vl;
    float *row = (float *)logits + row_start; /* only used when vec and fp32 */
    float sum = stats[n], shift = mx[n];
    if (threadIdx.x == 0) losses[n] = logf(sum) - stats[N + n];
    float scale = dloss / sum;
    int y = targets[n] - v_start;
    if (y < 0 || y >= nv) y = -1; /* not held here: no column matches */
    if (vec && bf16) {
        for (int i = threadIdx.x; i < Vl / 8; i += blockDim.x) {
            float x[8]; /* columns 8i .. 8i+7 */
            act_ld8(x, logits, row_start + 8 * (size_t)i);
            for (int j = 0; j < 8; j++)
                x[j] = ce_grad(x[j], 8 * i + j, nv, y, shift, scale, dloss);
            act_st8(logits, row_start + 8 * (size_t)i, x);
        }
        done = Vl / 8 * 8;
    } else if (vec) {
        for (int i = threadIdx.x; i < Vl / 4; i += blockDim.x) {
            float4 x = ((float4 *)row)[i];
            int c = 4 * i;
            x.x = ce_grad(x.x, c, nv, y, shift, scale, dloss);
            x.y = ce_grad(x.y, c + 1, nv, y, shift, scale, dloss);
            x.z = ce_grad(x.z, c + 2, nv, y, shift, scale, dloss);
            x.w = ce_grad(x.w, c + 3, nv, y, shift, scale, dloss);
            ((float4 *)row)[i] = x;
        }
        done = Vl / 4 * 4;
    }
    for (int i = done + threadIdx.x; i < Vl; i += blockDim.x)
        act_st(logits, row_start + i,
               ce_grad(act_ld(logits, row_start + i, bf16), i, nv, y, shift, scale, dloss), bf16);
}

/* ------------------------------------------------------------------ one rank, one pass */

#define CEF_THREADS 512
#define CEF_LOADS 8 /* 16-byte loads a thread keeps in flight while it copies the row */

/* The three kernels above in one, where one rank holds the whole vocabulary, for bf16
 * rows of 16-byte groups: a block per row copies the row into shared memory as it reads
 * it, then takes the max, the sum and the gradient from there, so the logits are read
 * from memory once and the gradient written once instead of three reads and a write.
 * The same max, the same loss and gradient formulas (ce_grad_of), the exponentials taken
 * by ce_exp, and a double sum, each group of 8 terms summed in float first (the CPU sums
 * 256-element float blocks in double: this is at least as accurate).
 * Why shared memory: a row of GPT-2's 50304 bf16 is 98 KiB, so two blocks fit an sm_90
 * (227 KiB), and one block's loads run while the other reduces and takes exponentials.
 * The earlier design kept the row in the registers of 1024 threads, one block an SM: the
 * SM's memory traffic stopped at every reduction (4.3 ms a step on an H200 for 32768 rows
 * against about 1.4 ms to read and write them). */
__global__ void __launch_bounds__(CEF_THREADS, 2)
cross_entropy_bf16_kernel(float *losses /* [N] */, gptc_act *logits /* [N,Vl] */,
                          float *mx /* [N] */, float *stats /* [2,N] */,
                          const int32_t *targets /* [N] */, int N, int Vl, int v_valid,
                          float dloss) {
    extern __shared__ bf16x8 ce_row[]; /* [Vl / 8] this block's row */
    __shared__ float shf[32];          /* block_max scratch */
    __shared__ double shd[32];         /* block_sum_double scratch */
    int n = blockIdx.x, nv = valid_cols(v_valid, Vl), ng = Vl / 8;
    bf16x8 *row = (bf16x8 *)((uint16_t *)logits + (size_t)n * Vl); /* [Vl / 8] */
    float m = -INFINITY;
    for (int base = 0; base < ng; base += CEF_LOADS * CEF_THREADS) {
        bf16x8 v[CEF_LOADS]; /* groups base + threadIdx.x + k * CEF_THREADS */
#pragma unroll
        for (int k = 0; k < CEF_LOADS; k++) { /* all loads first: in flight together */
            int gi = base + threadIdx.x + k * CEF_THREADS;
            if (gi < ng) v[k] = row[gi];
        }
#pragma unroll
        for (int k = 0; k < CEF_LOADS; k++) {
            int gi = base + threadIdx.x + k * CEF_THREADS;
            if (gi >= ng) continue;
            ce_row[gi] = v[k];
            float x[8];
            bf16x8_unpack(x, v[k]);
            int whole = 8 * gi + 8 <= nv; /* every column valid: no test per column */
            for (int j = 0; j < 8; j++)
                if (whole || 8 * gi + j < nv) m = max_sel(m, x[j]);
        }
    }
    m = block_max(m, shf); /* its barriers also publish ce_row to the block */
    float ml2 = m * CE_LOG2E;
    double acc = 0.0;
    for (int gi = threadIdx.x; gi < ng; gi += CEF_THREADS) {
        float x[8], s = 0.0f;
        bf16x8_unpack(x, ce_row[gi]);
        int whole = 8 * gi + 8 <= nv;
        for (int j = 0; j < 8; j++)
            if (whole || 8 * gi + j < nv) s += ce_exp(x[j], ml2);
        acc += s;
    }
    acc = block_sum_double(acc, shd);
    int y = targets[n];
    if (y < 0 || y >= nv) y = -1; /* out of range: no column matches, as in expsum */
    float sum = (float)acc, scale = dloss / sum;
    if (threadIdx.x == 0) {
        float t = y >= 0 ? bf16_to_float(((const uint16_t *)ce_row)[y]) - m : 0.0f;
        mx[n] = m;
        stats[n] = sum;
        stats[N + n] = t;
        losses[n] = logf(sum) - t;
    }
    for (int gi = threadIdx.x; gi < ng; gi += CEF_THREADS) {
        float x[8];
        bf16x8_unpack(x, ce_row[gi]);
        if (8 * gi + 8 <= nv && gi != y >> 3) { /* valid columns, not the target's group */
            for (int j = 0; j < 8; j++) x[j] = ce_exp(x[j], ml2) * scale;
        } else {
            for (int j = 0; j < 8; j++)
                x[j] = ce_grad_of(ce_exp(x[j], ml2), 8 * gi + j, nv, y, scale, dloss);
        }
        bf16x8 g; /* rounded as bf16x8_pack, a pair an instruction (cvt) */
        for (int k = 0; k < 4; k++) g.w[k] = pack_bf16x2(x[2 * k], x[2 * k + 1]);
        row[gi] = g;
    }
}

extern "C" {

/* 16-byte rows: the buffer 16-byte aligned, Vl a multiple of 4 floats or 8 bf16 */
static int ce_vec(const gptc_act *logits, int Vl, int bf16) {
    return Vl % (bf16 ? 8 : 4) == 0 && aligned16(logits);
}

void cuda_vocab_max(float *mx, const gptc_act *logits, int N, int Vl, int v_valid,
                    gptc_precision p, cudaStream_t s) {
    if (N <= 0) return;
    int bf16 = p == GPTC_BF16;
    vocab_max_kernel<<<N, CE_THREADS, 0, s>>>(mx, logits, N, Vl, v_valid,
                                              ce_vec(logits, Vl, bf16), bf16);
}

void cuda_vocab_expsum(float *stats, const gptc_act *logits, const float *mx,
                       const int32_t *targets, int N, int Vl, int v_valid, int v_start,
                       gptc_precision p, cudaStream_t s) {
    if (N <= 0) return;
    int bf16 = p == GPTC_BF16;
    vocab_expsum_kernel<<<N, CE_THREADS, 0, s>>>(stats, logits, mx, targets, N, Vl, v_valid,
                                                 v_start, ce_vec(logits, Vl, bf16), bf16);
}

void cuda_vocab_ce_finish(float *losses, gptc_act *logits, const float *mx, const float *stats,
                          const int32_t *targets, int N, int Vl, int v_valid, int v_start,
                          float dloss, gptc_precision p, cudaStream_t s) {
    if (N <= 0) return;
    int bf16 = p == GPTC_BF16;
    vocab_ce_finish_kernel<<<N, CE_THREADS, 0, s>>>(losses, logits, mx, stats, targets, N, Vl,
                                                    v_valid, v_start, dloss,
                                                    ce_vec(logits, Vl, bf16), bf16);
}

void cuda_cross_entropy(float *losses, gptc_act *logits, float *mx, float *stats,
                        const int32_t *targets, int N, int Vl, int v_valid, float dloss,
                        gptc_precision p, cudaStream_t s) {
    if (N <= 0) return;
    /* the row and the static scratch (384 bytes) in the shared memory a block may have;
     * wider rows (more than about 115000 columns on sm_90) take the three kernels */
    size_t smem = (size_t)Vl * 2;
    if (p == GPTC_BF16 && ce_vec(logits, Vl, 1) && smem + 384 <= (size_t)cuda_smem_optin() &&
        cuda_smem_ready((const void *)cross_entropy_bf16_kernel, smem,
                        "the one-pass bf16 cross-entropy", s)) {
        cross_entropy_bf16_kernel<<<N, CEF_THREADS, smem, s>>>(losses, logits, mx, stats,
                                                                targets, N, Vl, v_valid, dloss);
        return;
    }
    cuda_vocab_max(mx, logits, N, Vl, v_valid, p, s);
    cuda_vocab_expsum(stats, logits, mx, targets, N, Vl, v_valid, 0, p, s);
    cuda_vocab_ce_finish(losses, logits, mx, stats, targets, N, Vl, v_valid, 0, dloss, p, s);
}

} /* extern "C" */
