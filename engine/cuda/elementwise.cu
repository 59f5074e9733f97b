/* Elementwise kernels (GELU, add, to_act, scale, NaN fill), the bias gradient's column
 * sums, the host-flag wait and the launch check. Elementwise kernels are grid-stride
 * loops with size_t indices and bandwidth-bound: when every buffer is 16-byte aligned
 * (vec) each thread moves 16 bytes per access, a float4 under fp32 or 8 bf16 (act_ld8 /
 * act_st8) under bf16, and the last n % 4 (n % 8) elements go one by one (act_ld /
 * act_st), as does everything when a buffer is not aligned. The arithmetic per element
 * is the same on every path, so the path never changes a result. */
#include "engine/cuda/cuda_common.cuh"

#include <stdarg.h>
#include <stdio.h>

#define EW_THREADS 256

static const float GELU_K = 0.7978845608028654f; /* sqrt(2/pi) */

/* same expressions, in the same order, as cpu_gelu_forward / cpu_gelu_backward */
static __device__ __forceinline__ float gelu_fwd(float x) {
    return 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x)));
}

static __device__ __forceinline__ float gelu_bwd(float x, float dout) {
    float th = tanhf(GELU_K * (x + 0.044715f * x * x * x));
    float sech2 = 1.0f - th * th;
    float local = 0.5f * (1.0f + th) +
                  0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    return local * dout;
}

/* Blocks for an elementwise op on n elements, counted in 16-byte vectors when vec:
 * float4 (4 elements) under fp32, 8 bf16 under bf16. */
static unsigned int ew_grid(size_t n, int vec, int bf16) {
    return grid_for(vec ? n / (bf16 ? 8 : 4) + 1 : n, EW_THREADS);
}

/* ------------------------------------------------------------------ GELU */

/* Grid-stride; when vec (all pointers 16-byte aligned) a body of 8-bf16 groups (bf16) or
 * float4s (fp32), then the scalar tail. */
__global__ void gelu_forward_kernel(gptc_act *out /* [n] */, const gptc_act *inp /* [n] */,
                                    size_t n, int vec, int bf16) {
    size_t i0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x, done = 0;
    if (vec && bf16) {
        size_t n8 = n / 8;
        for (size_t i = i0; i < n8; i += stride) {
            float x[8]; /* elements 8i .. 8i+7 */
            act_ld8(x, inp, 8 * i);
            for (int j = 0; j < 8; j++) x[j] = gelu_fwd(x[j]);
            act_st8(out, 8 * i, x);
        }
        done = n8 * 8;
    } else if (vec) {
        size_t n4 = n / 4;
        for (size_t i = i0; i < n4; i += stride) {
            float4 x = ((const float4 *)inp)[i];
            ((float4 *)out)[i] = make_float4(gelu_fwd(x.x), gelu_fwd(x.y), gelu_fwd(x.z),
                                             gelu_fwd(x.w));
        }
        done = n4 * 4;
    }
    for (size_t i = done + i0; i < n; i += stride)
        act_st(out, i, gelu_fwd(act_ld(inp, i, bf16)), bf16);
}

/* Same layout as gelu_forward_kernel. */
__global__ void gelu_backward_kernel(gptc_act *dinp /* [n] */, const gptc_act *inp /* [n] */,
                                     const gptc_act *dout /* [n] */, size_t n, int vec,
                                     int bf16) {
    size_t i0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x, done = 0;
    if (vec && bf16) {
        size_t n8 = n / 8;
        for (size_t i = i0; i < n8; i += stride) {
            float x[8], d[8]; /* elements 8i .. 8i+7 of inp, dout */
            act_ld8(x, inp, 8 * i);
            act_ld8(d, dout, 8 * i);
            for (int j = 0; j < 8; j++) x[j] = gelu_bwd(x[j], d[j]);
            act_st8(dinp, 8 * i, x);
        }
        done = n8 * 8;
    } else if (vec) {
        size_t n4 = n / 4;
        for (size_t i = i0; i < n4; i += stride) {
            float4 x = ((const float4 *)inp)[i], d = ((const float4 *)dout)[i];
            ((float4 *)dinp)[i] = make_float4(gelu_bwd(x.x, d.x), gelu_bwd(x.y, d.y),
                                              gelu_bwd(x.z, d.z), gelu_bwd(x.w, d.w));
        }
        done = n4 * 4;
    }
    for (size_t i = done + i0; i < n; i += stride)
        act_st(dinp, i, gelu_bwd(act_ld(inp, i, bf16), act_ld(dout, i, bf16)), bf16);
}

/* ---------------------------------------------------------- add, to_act, scale, fill */

/* out may alias a or b: each element is read before it is written, by one thread. */
__global__ void add_kernel(gptc_act *out /* [n] */, const gptc_act *a /* [n] */,
                           const gptc_act *b /* [n] */, size_t n, int vec, int bf16) {
    size_t i0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x, done = 0;
    if (vec && bf16) {
        size_t n8 = n / 8;
        for (size_t i = i0; i < n8; i += stride) {
            float x[8], y[8]; /* elements 8i .. 8i+7 of a, b */
            act_ld8(x, a, 8 * i);
            act_ld8(y, b, 8 * i);
            for (int j = 0; j < 8; j++) x[j] = x[j] + y[j];
            act_st8(out, 8 * i, x);
        }
        done = n8 * 8;
    } else if (vec) {
        size_t n4 = n / 4;
        for (size_t i = i0; i < n4; i += stride) {
            float4 x = ((const float4 *)a)[i], y = ((const float4 *)b)[i];
            ((float4 *)out)[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
        }
        done = n4 * 4;
    }
    for (size_t i = done + i0; i < n; i += stride)
        act_st(out, i, act_ld(a, i, bf16) + act_ld(b, i, bf16), bf16);
}

/* dst = src rounded to the activation type (a copy under fp32); same layout as
 * add_kernel: under bf16 a group is two float4s of src in, 8 bf16 out. */
__global__ void to_act_kernel(gptc_act *dst /* [n] */, const float *src /* [n] */, size_t n,
                              int vec, int bf16) {
    size_t i0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x, done = 0;
    if (vec && bf16) {
        size_t n8 = n / 8;
        for (size_t i = i0; i < n8; i += stride) {
            float4 lo = ((const float4 *)src)[2 * i], hi = ((const float4 *)src)[2 * i + 1];
            float x[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w}; /* src 8i .. 8i+7 */
            act_st8(dst, 8 * i, x);
        }
        done = n8 * 8;
    } else if (vec) {
        size_t n4 = n / 4;
        for (size_t i = i0; i < n4; i += stride) ((float4 *)dst)[i] = ((const float4 *)src)[i];
        done = n4 * 4;
    }
    for (size_t i = done + i0; i < n; i += stride) act_st(dst, i, src[i], bf16);
}

/* out (column-major m x n, leading dimension ldo) = src (m x n, packed) + bias[i] on each
 * row i, rounded once to the activation type: the bias epilogue done here, where cuBLASLt's
 * would round the product before adding it (cuda_matmul.c: gemm). A thread per element. */
__global__ void bias_round_kernel(gptc_act *out /* [n, ldo] */, int ldo,
                                  const float *src /* [n, m] */,
                                  const gptc_act *bias /* [m] */, int m, size_t total,
                                  int bf16) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        size_t i = e % (size_t)m, j = e / (size_t)m;
        act_st(out, j * (size_t)ldo + i, src[e] + act_ld(bias, i, bf16), bf16);
    }
}

/* The GELU epilogue done here, for a product cuBLASLt does not fuse: x = src + bias[i] on
 * row i (column-major m x n, packed), pre = x and out = gelu(x), each rounded once from the
 * fp32 x, as the epilogue rounds them (backend.h: matmul_gelu_forward). */
__global__ void bias_gelu_round_kernel(gptc_act *out /* [n, m] */, gptc_act *pre /* [n, m] */,
                                       const float *src /* [n, m] */,
                                       const gptc_act *bias /* [m] or NULL */, int m,
                                       size_t total, int bf16) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        float x = src[e] + (bias ? act_ld(bias, e % (size_t)m, bf16) : 0.0f);
        act_st(pre, e, x, bf16);
        act_st(out, e, gelu_fwd(x), bf16);
    }
}

/* The DGELU epilogue done here: dpre = src * gelu'(pre) from the fp32 product src, rounded
 * once (backend.h: matmul_dgelu_backward). */
__global__ void dgelu_round_kernel(gptc_act *dpre /* [total] */, const float *src /* [total] */,
                                   const gptc_act *pre /* [total] */, size_t total, int bf16) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride)
        act_st(dpre, e, gelu_bwd(act_ld(pre, e, bf16), src[e]), bf16);
}

/* Quiet NaN 0x7fc00000 everywhere; same layout as add_kernel. */
__global__ void fill_nan_kernel(float *x /* [n] */, size_t n, int vec) {
    size_t i0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x, done = 0;
    float nan = __int_as_float(0x7fc00000);
    if (vec) {
        size_t n4 = n / 4;
        for (size_t i = i0; i < n4; i += stride)
            ((float4 *)x)[i] = make_float4(nan, nan, nan, nan);
        done = n4 * 4;
    }
    for (size_t i = done + i0; i < n; i += stride) x[i] = nan;
}

/* ------------------------------------------------------------------ bias gradient */

#define BB_COLS 32 /* columns per block: one per lane, so each row read is one 128 B line */
#define BB_WARPS 8 /* warps per block, striding through the block's slice of rows */

/* Column sums are a reduction over N rows. Block (x, y) takes columns [32x, 32x+32) and
 * row slice y; its 8 warps stride through the slice (lane = column, so reads coalesce),
 * the 8 per-warp sums are added in shared memory in a fixed order, and one atomicAdd
 * per column adds the slice's sum into dbias. With one slice (wide OC) the result is
 * deterministic; with several, only the order of the slices' atomics varies. */
__global__ void bias_backward_kernel(float *dbias /* [OC] */,
                                     const gptc_act *dout /* [N,OC] */, int N, int OC,
                                     int rows_per_slice, int bf16) {
    __shared__ float part[BB_WARPS][BB_COLS]; /* per-warp column sums */
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int c = blockIdx.x * BB_COLS + lane;
    int r0 = blockIdx.y * rows_per_slice;
    int r1 = r0 + rows_per_slice < N ? r0 + rows_per_slice : N;
    float acc = 0.0f;
    if (c < OC)
        for (int r = r0 + warp; r < r1; r += BB_WARPS)
            acc += act_ld(dout, (size_t)r * OC + c, bf16);
    part[warp][lane] = acc;
    __syncthreads();
    if (warp == 0 && c < OC) {
        float s = 0.0f;
        for (int w = 0; w < BB_WARPS; w++) s += part[w][lane];
        atomicAdd(dbias + c, s);
    }
}

#define BB_VEC_COLS (8 * 32) /* columns per block of the 16-byte kernel: 8 a lane */
/* its last step has thread t add column t: one thread per column of the block */
static_assert(BB_WARPS * 32 == BB_VEC_COLS, "bias_backward_vec_kernel needs 256 threads");

/* bias_backward_kernel with 16-byte loads, for OC % 8 == 0 and dout 16-byte aligned: a
 * lane takes 8 adjacent columns, so a warp reads 256 columns of a row (512 bytes in bf16)
 * where the kernel above reads 32 (64 bytes in bf16: a quarter of what a warp's request
 * could move). Each column adds the same rows in the same order as there; block (x, y)
 * takes columns [256x, 256x+256) and row slice y, and its thread t adds column 256x+t's
 * 8 warp sums. */
__global__ void bias_backward_vec_kernel(float *dbias /* [OC] */,
                                         const gptc_act *dout /* [N,OC] */, int N, int OC,
                                         int rows_per_slice, int bf16) {
    __shared__ float part[BB_WARPS][BB_VEC_COLS]; /* per-warp column sums */
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int c0 = blockIdx.x * BB_VEC_COLS + 8 * lane; /* this lane's first column */
    int r0 = blockIdx.y * rows_per_slice;
    int r1 = r0 + rows_per_slice < N ? r0 + rows_per_slice : N;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (c0 >= OC) r1 = r0; /* past the last column: no rows, only the barrier */
#pragma unroll 4 /* loads of several rows in flight: the sums wait, the reads need not */
    for (int r = r0 + warp; r < r1; r += BB_WARPS) {
        size_t i = (size_t)r * OC + c0;
        float x[8]; /* columns c0 .. c0+7 of row r */
        act_ld8_any(x, dout, i, bf16);
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] += x[j];
    }
#pragma unroll
    for (int j = 0; j < 8; j++) part[warp][8 * lane + j] = acc[j];
    __syncthreads();
    int c = blockIdx.x * BB_VEC_COLS + threadIdx.x;
    if (c < OC) {
        float sum = 0.0f;
        for (int w = 0; w < BB_WARPS; w++) sum += part[w][threadIdx.x];
        atomicAdd(dbias + c, sum);
    }
}

/* ------------------------------------------------------------------ host flag */

/* One thread polls the host-mapped flag: a volatile load every pass (never cached in a
 * register), a short sleep between passes so the spinning costs the SM almost nothing. */
__global__ void wait_flag_kernel(const volatile unsigned int *flag /* [1], host-mapped */,
                                 unsigned int target) {
    /* wrap-safe: the counter is compared as a distance, not as a magnitude */
    while ((int)(*flag - target) < 0) __nanosleep(500);
    /* the host wrote its data before the flag: order our later reads after it */
    __threadfence_system();
}

/* The stream has reached this point: publish the task number to the host. The copies and
 * kernels before it in the stream have completed; the fence orders their writes to host
 * memory before the flag, as the host thread polling it will read them. */
__global__ void set_flag_kernel(volatile unsigned int *flag /* [1], host-mapped */,
                                unsigned int value) {
    __threadfence_system();
    *flag = value;
    __threadfence_system();
}

/* ------------------------------------------------------------------ launchers */

/* Never runs: a refused launch's empty grid (cuda_refuse) */
__global__ void refused_kernel(void) {}

/* why this host thread's last launch was refused (cuda_refuse) */
static __thread char refused_why[256];

extern "C" {

int cuda_kernels_runnable(void) {
    cudaFuncAttributes a;
    cudaError_t e = cudaFuncGetAttributes(&a, (const void *)add_kernel);
    if (e != cudaSuccess) (void)cudaGetLastError();
    return (int)e;
}

void cuda_gelu_forward(gptc_act *out, const gptc_act *inp, size_t n, gptc_precision p,
                       cudaStream_t s) {
    if (n == 0) return;
    int bf16 = p == GPTC_BF16, vec = aligned16(out) && aligned16(inp);
    gelu_forward_kernel<<<ew_grid(n, vec, bf16), EW_THREADS, 0, s>>>(out, inp, n, vec, bf16);
}

void cuda_gelu_backward(gptc_act *dinp, const gptc_act *inp, const gptc_act *dout, size_t n,
                        gptc_precision p, cudaStream_t s) {
    if (n == 0) return;
    int bf16 = p == GPTC_BF16;
    int vec = aligned16(dinp) && aligned16(inp) && aligned16(dout);
    gelu_backward_kernel<<<ew_grid(n, vec, bf16), EW_THREADS, 0, s>>>(dinp, inp, dout, n, vec,
                                                                       bf16);
}

void cuda_add(gptc_act *out, const gptc_act *a, const gptc_act *b, size_t n, gptc_precision p,
              cudaStream_t s) {
    if (n == 0) return;
    int bf16 = p == GPTC_BF16, vec = aligned16(out) && aligned16(a) && aligned16(b);
    add_kernel<<<ew_grid(n, vec, bf16), EW_THREADS, 0, s>>>(out, a, b, n, vec, bf16);
}

void cuda_to_act(gptc_act *dst, const float *src, size_t n, gptc_precision p,
                 cudaStream_t s) {
    int bf16 = p == GPTC_BF16;
    if (n == 0 || (!bf16 && dst == (const gptc_act *)src)) return;
    int vec = aligned16(dst) && aligned16(src);
    to_act_kernel<<<ew_grid(n, vec, bf16), EW_THREADS, 0, s>>>(dst, src, n, vec, bf16);
}

void cuda_bias_round(gptc_act *out, int ldo, const float *src, const gptc_act *bias, int m,
                     int n, gptc_precision p, cudaStream_t s) {
    size_t total = (size_t)m * n;
    if (total == 0) return;
    bias_round_kernel<<<ew_grid(total, 0, 0), EW_THREADS, 0, s>>>(out, ldo, src, bias, m, total,
                                                                  p == GPTC_BF16);
}

void cuda_bias_gelu_round(gptc_act *out, gptc_act *pre, const float *src, const gptc_act *bias,
                          int m, size_t total, gptc_precision p, cudaStream_t s) {
    if (total == 0) return;
    bias_gelu_round_kernel<<<ew_grid(total, 0, 0), EW_THREADS, 0, s>>>(out, pre, src, bias, m,
                                                                       total, p == GPTC_BF16);
}

void cuda_dgelu_round(gptc_act *dpre, const float *src, const gptc_act *pre, size_t total,
                      gptc_precision p, cudaStream_t s) {
    if (total == 0) return;
    dgelu_round_kernel<<<ew_grid(total, 0, 0), EW_THREADS, 0, s>>>(dpre, src, pre, total,
                                                                   p == GPTC_BF16);
}

void cuda_fill_nan(float *x, size_t n, cudaStream_t s) {
    if (n == 0) return;
    int vec = aligned16(x);
    fill_nan_kernel<<<ew_grid(n, vec, 0), EW_THREADS, 0, s>>>(x, n, vec);
}

void cuda_bias_backward(float *dbias, const gptc_act *dout, int N, int OC, gptc_precision p,
                        cudaStream_t s) {
    if (N <= 0 || OC <= 0) return;
    int vec = OC % 8 == 0 && aligned16(dout), cols = vec ? BB_VEC_COLS : BB_COLS;
    int col_blocks = (OC + cols - 1) / cols;
    /* enough row slices for about 4 blocks per SM, each slice at least 64 rows */
    long want = ((long)cuda_sm_count() * 4 + col_blocks - 1) / col_blocks;
    long max_slices = (N + 63) / 64;
    long slices = want < max_slices ? want : max_slices;
    if (slices > 65535) slices = 65535;
    if (slices < 1) slices = 1;
    int rows_per_slice = (int)((N + slices - 1) / slices);
    slices = (N + rows_per_slice - 1) / rows_per_slice;
    dim3 grid((unsigned int)col_blocks, (unsigned int)slices);
    if (vec)
        bias_backward_vec_kernel<<<grid, BB_WARPS * 32, 0, s>>>(dbias, dout, N, OC,
                                                                rows_per_slice, p == GPTC_BF16);
    else
        bias_backward_kernel<<<grid, BB_WARPS * 32, 0, s>>>(dbias, dout, N, OC, rows_per_slice,
                                                            p == GPTC_BF16);
}

void cuda_wait_flag(const volatile unsigned int *flag, unsigned int target, cudaStream_t s) {
    wait_flag_kernel<<<1, 1, 0, s>>>(flag, target);
}

void cuda_set_flag(volatile unsigned int *flag, unsigned int value, cudaStream_t s) {
    set_flag_kernel<<<1, 1, 0, s>>>(flag, value);
}

int cuda_check_launch(void) { return (int)cudaGetLastError(); }

void cuda_refuse(cudaStream_t s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(refused_why, sizeof refused_why, fmt, ap);
    va_end(ap);
    refused_kernel<<<0, 1, 0, s>>>();
}

const char *cuda_launch_why(void) {
    static __thread char copy[sizeof refused_why];
    snprintf(copy, sizeof copy, "%s", refused_why);
    refused_why[0] = '\0';
    return copy;
}

} /* extern "C" */
