/* The optimizer step (AdamW) and the gradient-norm reduction (sum of squares). */
#include "engine/cuda/cuda_common.cuh"

#include <string.h>

#define ADAM_THREADS 256
#define ADAM_MAX_PIECES 48 /* pieces a launch: its parameters stay under 4 KiB */
#define SUMSQ_THREADS 256
#define SUMSQ_PARTIALS 1024 /* blocks of the first pass, one double each */

/* ------------------------------------------------------------------ AdamW */

/* cpu_adamw's expressions in its order: moments first, then the decoupled decay
 * (p * shrink, shrink = 1 - lr*decay) and the bias-corrected step. */
static __device__ __forceinline__ float adamw_one(float p, float g, float *m, float *v,
                                                  float beta1, float beta2, float eps,
                                                  float step_size, float bc2_sqrt,
                                                  float shrink) {
    float mi = beta1 * *m + (1.0f - beta1) * g;
    float vi = beta2 * *v + (1.0f - beta2) * g * g;
    *m = mi;
    *v = vi;
    return p * shrink - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
}

/* Elements i0, i0 + stride, ... of one piece: a float4 body when p, g, m, v are all
 * 16-byte aligned (vec), and a scalar tail. g is taken times gscale (the clipping
 * coefficient) as it is read. The bf16 parameter copy p_act (when not NULL) is written
 * element by element (8 bytes per float4: its alignment does not matter). */
static __device__ __forceinline__ void adamw_span(float *p /* [n] */,
                                                  uint16_t *p_act /* [n] or NULL */,
                                                  const float *g /* [n] */, float gscale,
                                                  float *m /* [n] */, float *v /* [n] */,
                                                  size_t n, int vec, size_t i0, size_t stride,
                                                  float beta1, float beta2, float eps,
                                                  float step_size, float bc2_sqrt,
                                                  float shrink) {
    size_t done = 0;
    if (vec) {
        size_t n4 = n / 4;
        for (size_t i = i0; i < n4; i += stride) {
            float4 p4 = ((float4 *)p)[i], g4 = ((const float4 *)g)[i];
            g4.x *= gscale, g4.y *= gscale, g4.z *= gscale, g4.w *= gscale;
            float4 m4 = ((float4 *)m)[i], v4 = ((float4 *)v)[i];
            p4.x = adamw_one(p4.x, g4.x, &m4.x, &v4.x, beta1, beta2, eps, step_size, bc2_sqrt,
                             shrink);
            p4.y = adamw_one(p4.y, g4.y, &m4.y, &v4.y, beta1, beta2, eps, step_size, bc2_sqrt,
                             shrink);
            p4.z = adamw_one(p4.z, g4.z, &m4.z, &v4.z, beta1, beta2, eps, step_size, bc2_sqrt,
                             shrink);
            p4.w = adamw_one(p4.w, g4.w, &m4.w, &v4.w, beta1, beta2, eps, step_size, bc2_sqrt,
                             shrink);
            ((float4 *)p)[i] = p4;
            if (p_act) {
                p_act[4 * i] = bf16_bits(p4.x);
                p_act[4 * i + 1] = bf16_bits(p4.y);
                p_act[4 * i + 2] = bf16_bits(p4.z);
                p_act[4 * i + 3] = bf16_bits(p4.w);
            }
            ((float4 *)m)[i] = m4;
            ((float4 *)v)[i] = v4;
        }
        done = n4 * 4;
    }
    for (size_t i = done + i0; i < n; i += stride) {
        float mi = m[i], vi = v[i];
        float pi = adamw_one(p[i], g[i] * gscale, &mi, &vi, beta1, beta2, eps, step_size,
                             bc2_sqrt, shrink);
        p[i] = pi;
        if (p_act) p_act[i] = bf16_bits(pi);
        m[i] = mi;
        v[i] = vi;
    }
}

/* Up to ADAM_MAX_PIECES pieces of an AdamW step, passed by value (kernel parameters, under
 * the 4 KiB every device takes): the blocks from first_block[k] to first_block[k + 1]
 * update piece k, a grid-stride loop of their own over it */
typedef struct {
    float *p[ADAM_MAX_PIECES];          /* [n[k]] each */
    uint16_t *p_act[ADAM_MAX_PIECES];   /* [n[k]] each, or NULL */
    const float *g[ADAM_MAX_PIECES];    /* [n[k]] each */
    float *m[ADAM_MAX_PIECES], *v[ADAM_MAX_PIECES]; /* [n[k]] each */
    size_t n[ADAM_MAX_PIECES];
    float shrink[ADAM_MAX_PIECES];      /* 1 - lr decay */
    int vec[ADAM_MAX_PIECES];           /* p, g, m, v 16-byte aligned */
    unsigned int first_block[ADAM_MAX_PIECES + 1];
    int count;
} adam_batch;

__global__ void adamw_kernel(adam_batch b, float gscale, float beta1, float beta2, float eps,
                             float step_size, float bc2_sqrt) {
    int k = 0; /* this block's piece: the same for all its threads */
    while (k + 1 < b.count && blockIdx.x >= b.first_block[k + 1]) k++;
    unsigned int blocks = b.first_block[k + 1] - b.first_block[k];
    size_t i0 = (size_t)(blockIdx.x - b.first_block[k]) * blockDim.x + threadIdx.x;
    adamw_span(b.p[k], b.p_act[k], b.g[k], gscale, b.m[k], b.v[k], b.n[k], b.vec[k], i0,
               (size_t)blocks * blockDim.x, beta1, beta2, eps, step_size, bc2_sqrt,
               b.shrink[k]);
}

/* ------------------------------------------------------------------ sum of squares */

/* First pass: each block sums a grid-stride share of x in double (each square formed in
 * double, as cpu_sum_squares does) and writes one partial. The grid size depends only on
 * n (not on the device), so the sum is reproducible. */
__global__ void sum_squares_partial_kernel(double *partial /* [gridDim.x] */,
                                           const float *x /* [n] */, size_t n, int vec) {
    __shared__ double sh[32]; /* block_sum_double scratch */
    size_t i0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x, done = 0;
    double acc = 0.0;
    if (vec) {
        size_t n4 = n / 4;
        for (size_t i = i0; i < n4; i += stride) {
            float4 v = ((const float4 *)x)[i];
            acc += (double)v.x * v.x;
            acc += (double)v.y * v.y;
            acc += (double)v.z * v.z;
            acc += (double)v.w * v.w;
        }
        done = n4 * 4;
    }
    for (size_t i = done + i0; i < n; i += stride) acc += (double)x[i] * x[i];
    acc = block_sum_double(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

/* Second pass: one block adds the partials in a fixed order; n_partial may be 0. */
__global__ void sum_squares_final_kernel(double *out /* [1] */,
                                         const double *partial /* [n_partial] */,
                                         int n_partial) {
    __shared__ double sh[32]; /* block_sum_double scratch */
    double acc = 0.0;
    for (int i = threadIdx.x; i < n_partial; i += blockDim.x) acc += partial[i];
    acc = block_sum_double(acc, sh);
    if (threadIdx.x == 0) *out = acc;
}

/* ------------------------------------------------------------------ launchers */

extern "C" {

void cuda_adamw(const gptc_adamw_piece *pieces, int n_pieces, const gptc_adamw_step *h,
                int bf16, cudaStream_t s) {
    float step_size = h->lr / h->bc1, bc2_sqrt = sqrtf(h->bc2);
    int k = 0; /* the next piece to put in a launch */
    while (k < n_pieces) {
        adam_batch b;
        memset(&b, 0, sizeof b);
        unsigned int blocks = 0;
        for (; k < n_pieces && b.count < ADAM_MAX_PIECES; k++) {
            const gptc_adamw_piece *q = &pieces[k];
            if (q->n == 0) continue;
            int i = b.count++, vec = aligned16(q->p) && aligned16(q->g) && aligned16(q->m) &&
                                     aligned16(q->v);
            b.p[i] = q->p;
            b.p_act[i] = bf16 && q->p_act != (gptc_act *)q->p ? (uint16_t *)q->p_act : NULL;
            b.g[i] = q->g, b.m[i] = q->m, b.v[i] = q->v, b.n[i] = q->n, b.vec[i] = vec;
            b.shrink[i] = 1.0f - h->lr * q->decay;
            b.first_block[i] = blocks;
            blocks += grid_for(vec ? q->n / 4 + 1 : q->n, ADAM_THREADS);
        }
        if (b.count == 0) continue;
        b.first_block[b.count] = blocks;
        adamw_kernel<<<blocks, ADAM_THREADS, 0, s>>>(b, h->gscale, h->beta1, h->beta2, h->eps,
                                                     step_size, bc2_sqrt);
    }
}

size_t cuda_sum_squares_partials(void) { return SUMSQ_PARTIALS; }

void cuda_sum_squares(double *out, double *partial, const float *x, size_t n, cudaStream_t s) {
    int vec = aligned16(x);
    size_t units = vec ? n / 4 + 1 : n;
    size_t blocks = (units + SUMSQ_THREADS - 1) / SUMSQ_THREADS;
    if (blocks > SUMSQ_PARTIALS) blocks = SUMSQ_PARTIALS;
    if (n == 0) blocks = 0; /* nothing to sum: the final pass alone writes 0 */
    if (blocks > 0)
        sum_squares_partial_kernel<<<(unsigned int)blocks, SUMSQ_THREADS, 0, s>>>(partial, x,
                                                                                  n, vec);
    sum_squares_final_kernel<<<1, SUMSQ_THREADS, 0, s>>>(out, partial, (int)blocks);
}

} /* extern "C" */
