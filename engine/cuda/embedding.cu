/* Token + position embedding, forward and backward, for a vocab-parallel wte: this rank
 * holds rows [v_start, v_start + v_local) of the vocabulary; other tokens get a 0 row
 * (forward) and no gradient (backward). */
#include "engine/cuda/cuda_common.cuh"

#define EMB_THREADS 256

/* Blocks stride over rows and threads over the row's columns, so the token lookup is
 * done once per row and every read and write is coalesced. vec (out, wte, wpe 16-byte
 * aligned and C % 4 == 0 under fp32, C % 8 == 0 under bf16): 16 bytes per access, a
 * float4 or 8 bf16 (2-byte accesses would waste most of each transaction). Same sum as
 * the CPU: te + pe, each 0 if absent, rounded once when bf16. */
__global__ void embedding_forward_kernel(gptc_act *out /* [N,C] */,
                                         const int32_t *tokens /* [N] */,
                                         const gptc_act *wte /* [v_local,C] */,
                                         const gptc_act *wpe /* [T,C] or NULL */, int N,
                                         int T, int C, int v_start, int v_local, int vec,
                                         int bf16) {
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        int row = tokens[n] - v_start; /* this rank's row of wte, if it holds the token */
        int has_te = row >= 0 && row < v_local;
        size_t te = (size_t)row * C, pe = (size_t)(n % T) * C, o = (size_t)n * C;
        if (vec && bf16) {
            for (int c = 8 * threadIdx.x; c < C; c += 8 * blockDim.x) {
                float a[8], b[8]; /* columns c .. c+7 of the wte row, the wpe row (or 0) */
                for (int j = 0; j < 8; j++) a[j] = b[j] = 0.0f;
                if (has_te) act_ld8(a, wte, te + c);
                if (wpe) act_ld8(b, wpe, pe + c);
                for (int j = 0; j < 8; j++) a[j] = a[j] + b[j];
                act_st8(out, o + c, a);
            }
        } else if (vec) {
            const float *tef = has_te ? (const float *)wte + te : NULL;
            const float *pef = wpe ? (const float *)wpe + pe : NULL;
            float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int c = threadIdx.x; c < C / 4; c += blockDim.x) {
                float4 a = tef ? ((const float4 *)tef)[c] : zero;
                float4 b = pef ? ((const float4 *)pef)[c] : zero;
                ((float4 *)((float *)out + o))[c] =
                    make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
            }
        } else {
            for (int c = threadIdx.x; c < C; c += blockDim.x)
                act_st(out, o + c,
                       (has_te ? act_ld(wte, te + c, bf16) : 0.0f) +
                           (wpe ? act_ld(wpe, pe + c, bf16) : 0.0f),
                       bf16);
        }
    }
}

/* Tokens repeat within a batch, so rows of dwte collide: blocks stride over token rows,
 * threads over columns, and each element is added with an atomicAdd (order, hence the
 * last bits, vary from run to run). */
__global__ void embedding_backward_wte_kernel(float *dwte /* [v_local,C] */,
                                              const gptc_act *dout /* [N,C] */,
                                              const int32_t *tokens /* [N] */, int N, int C,
                                              int v_start, int v_local, int bf16) {
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        int row = tokens[n] - v_start;
        if (row < 0 || row >= v_local) continue; /* block-uniform: no barrier inside */
        float *te = dwte + (size_t)row * C;
        size_t d = (size_t)n * C;
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            atomicAdd(te + c, act_ld(dout, d + c, bf16));
    }
}

/* dwpe[t] gathers rows t, t+T, t+2T, ... < N: one thread per element of dwpe walks them
 * in order, so there are no collisions, no atomics and the CPU's order of additions
 * (consecutive threads take consecutive columns: coalesced). */
__global__ void embedding_backward_wpe_kernel(float *dwpe /* [T,C] */,
                                              const gptc_act *dout /* [N,C] */, int N, int T,
                                              int C, int bf16) {
    size_t total = (size_t)T * C;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        size_t t = e / (size_t)C, c = e % (size_t)C;
        float v = dwpe[e];
        for (size_t n = t; n < (size_t)N; n += (size_t)T) v += act_ld(dout, n * C + c, bf16);
        dwpe[e] = v;
    }
}

extern "C" {

void cuda_embedding_forward(gptc_act *out, const int32_t *tokens, const gptc_act *wte,
                            const gptc_act *wpe, int N, int T, int C, int v_start, int v_local,
                            gptc_precision p, cudaStream_t s) {
    if (N <= 0 || C <= 0) return;
    int bf16 = p == GPTC_BF16;
    int vec = C % (bf16 ? 8 : 4) == 0 && aligned16(out) && aligned16(wte) && aligned16(wpe);
    embedding_forward_kernel<<<grid_for((size_t)N, 1), EMB_THREADS, 0, s>>>(
        out, tokens, wte, wpe, N, T, C, v_start, v_local, vec, bf16);
}

void cuda_embedding_backward(float *dwte, float *dwpe, const gptc_act *dout,
                             const int32_t *tokens, int N, int T, int C, int v_start,
                             int v_local, gptc_precision p, cudaStream_t s) {
    if (N <= 0 || C <= 0) return;
    int bf16 = p == GPTC_BF16;
    if (v_local > 0)
        embedding_backward_wte_kernel<<<grid_for((size_t)N, 1), EMB_THREADS, 0, s>>>(
            dwte, dout, tokens, N, C, v_start, v_local, bf16);
    if (dwpe && T > 0)
        embedding_backward_wpe_kernel<<<grid_for((size_t)T * C, EMB_THREADS), EMB_THREADS, 0,
                                        s>>>(dwpe, dout, N, T, C, bf16);
}

} /* extern "C" */
