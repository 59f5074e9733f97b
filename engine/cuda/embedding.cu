/* Token + position embedding, forward and backward, for a vocab-parallel wte: this rank
 * holds rows [v_start, v_start + v_local) of the vocabulary; other tokens get a 0 row
 * (forward) and no gradient (backward). */
#include "engine/cuda/cuda_common.cuh"

#define EMB_THREADS 256

/* Blocks stride over rows and threads over the row's columns, so the token lookup is
 * done once per row and every read and write is coalesced; float4 when vec (C % 4 == 0
 * and out, wte, wpe 16-byte aligned). Same sum as the CPU: te + pe, each 0 if absent. */
__global__ void embedding_forward_kernel(float *out /* [N,C] */, const int32_t *tokens /* [N] */,
                                         const float *wte /* [v_local,C] */,
                                         const float *wpe /* [T,C] or NULL */, int N, int T,
                                         int C, int v_start, int v_local, int vec) {
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        int row = tokens[n] - v_start; /* this rank's row of wte, if it holds the token */
        const float *te = row >= 0 && row < v_local ? wte + (size_t)row * C : NULL;
        const float *pe = wpe ? wpe + (size_t)(n % T) * C : NULL;
        float *o = out + (size_t)n * C;
        if (vec) {
            float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int c = threadIdx.x; c < C / 4; c += blockDim.x) {
                float4 a = te ? ((const float4 *)te)[c] : zero;
                float4 b = pe ? ((const float4 *)pe)[c] : zero;
                ((float4 *)o)[c] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
            }
        } else {
            for (int c = threadIdx.x; c < C; c += blockDim.x)
                o[c] = (te ? te[c] : 0.0f) + (pe ? pe[c] : 0.0f);
        }
    }
}

/* Tokens repeat within a batch, so rows of dwte collide: blocks stride over token rows,
 * threads over columns, and each element is added with an atomicAdd (order, hence the
 * last bits, vary from run to run). */
__global__ void embedding_backward_wte_kernel(float *dwte /* [v_local,C] */,
                                              const float *dout /* [N,C] */,
                                              const int32_t *tokens /* [N] */, int N, int C,
                                              int v_start, int v_local) {
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        int row = tokens[n] - v_start;
        if (row < 0 || row >= v_local) continue; /* block-uniform: no barrier inside */
        float *te = dwte + (size_t)row * C;
        const float *d = dout + (size_t)n * C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(te + c, d[c]);
    }
}

/* dwpe[t] gathers rows t, t+T, t+2T, ... < N: one thread per element of dwpe walks them
 * in order, so there are no collisions, no atomics and the CPU's order of additions
 * (consecutive threads take consecutive columns: coalesced). */
__global__ void embedding_backward_wpe_kernel(float *dwpe /* [T,C] */,
                                              const float *dout /* [N,C] */, int N, int T,
                                              int C) {
    size_t total = (size_t)T * C;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        size_t t = e / (size_t)C, c = e % (size_t)C;
        float v = dwpe[e];
        for (size_t n = t; n < (size_t)N; n += (size_t)T) v += dout[n * C + c];
        dwpe[e] = v;
    }
}

extern "C" {

void cuda_embedding_forward(float *out, const int32_t *tokens, const float *wte,
                            const float *wpe, int N, int T, int C, int v_start, int v_local,
                            cudaStream_t s) {
    if (N <= 0 || C <= 0) return;
    int vec = C % 4 == 0 && aligned16(out) && aligned16(wte) && aligned16(wpe);
    embedding_forward_kernel<<<grid_for((size_t)N, 1), EMB_THREADS, 0, s>>>(
        out, tokens, wte, wpe, N, T, C, v_start, v_local, vec);
}

void cuda_embedding_backward(float *dwte, float *dwpe, const float *dout,
                             const int32_t *tokens, int N, int T, int C, int v_start,
                             int v_local, cudaStream_t s) {
    if (N <= 0 || C <= 0) return;
    if (v_local > 0)
        embedding_backward_wte_kernel<<<grid_for((size_t)N, 1), EMB_THREADS, 0, s>>>(
            dwte, dout, tokens, N, C, v_start, v_local);
    if (dwpe && T > 0)
        embedding_backward_wpe_kernel<<<grid_for((size_t)T * C, EMB_THREADS), EMB_THREADS, 0,
                                        s>>>(dwpe, dout, N, T, C);
}

} /* extern "C" */
