/* Causal self-attention for train.precision = bf16, on tensor cores: the flash scheme of
 * attention.cu (same buffers, same lse [B,NH,T], same scratch, same three backward
 * kernels and the same determinism: no atomics, every element of dqkv written once), with
 * the tile products as mma.sync m16n8k16 bf16 (fp32 accumulate, engine/cuda/mma.cuh);
 * the variants chosen by environment variables (ab_fwd_variant, ab_dq_mode,
 * ab_bias_fused) differ from this where they say so: GPTC_ATTENTION_DQ=atomic and the
 * qkv bias gradient taken by the kernels (the default; GPTC_ATTENTION_BIAS=0 leaves it to
 * cuda_bias_backward, which adds by atomics too) add by atomics.
 * qkv, out, dout and dqkv are bf16 storage (uint16_t bits, engine/bf16.h), read as they
 * are (their tiles enter shared memory as bf16, no conversion); lse and the scratch D
 * are fp32. Besides the stores of out and dqkv (each rounded once, from fp32
 * accumulators), bf16 rounding happens where an fp32 value enters a product:
 *   - the probabilities P (after the online softmax's rescaling) are rounded as the
 *     A operand of P V (forward) and P^T dO (dv);
 *   - dS = P (dP - D) is computed in fp32 and rounded as the A operand of dS K (dq) and
 *     dS^T Q (dk).
 * Scores, softmax statistics, lse, D and all accumulators are fp32. D = rowsum(dout * out)
 * reads the stored bf16 dout and out, the same dO that dP = dO V^T sees, so that each
 * row of dS still sums to (about) zero as the softmax gradient does.
 *
 * Tiling: a block is 4 warps (128 threads) and 64 rows of its own (queries in the forward
 * and in the dq kernel, keys in the dk/dv kernel), 16 per warp; the other side streams
 * through shared memory in tiles of 64 rows. A warp's 16 x 64 score block is 8 n-tiles
 * of mma accumulators, which (mma.cuh) are also the A fragments of the next product, so
 * P and dS never go through shared memory.
 *
 * Every tile is stored once, row-major [64][hs] as in global memory, with a pitch of
 * hs + 8 elements: 16 bytes past a multiple of 128, so the 8 rows an ldmatrix phase
 * reads fall in 8 different 16-byte bank groups. ldmatrix makes every operand from that
 * one layout: A fragments and the B of a product that reduces along hs (Q K^T: K's rows
 * are B's columns) directly, the B of a product that reduces along the 64 rows (P V,
 * P^T dO, dS K, dS^T Q) with .trans.
 *
 * Pipelining: the streamed tiles are double-buffered. Each thread issues the cp.async
 * copies of tile i + 1 into the other stage, then waits for tile i's group only, so the
 * next tile's loads run under this tile's products. Two barriers per tile: one after the
 * wait (every thread's copies of tile i have landed), one after the products (nobody
 * reads the stage that iteration i + 1 refills). Where two stages do not fit a block's
 * shared memory (the backward at hs 120 and 128 on a 99 KiB sm_86 or sm_89), the
 * backward kernels run with one: the next tile loads after the second barrier, not under
 * the products. When qkv or dout is not 16-byte aligned
 * the same code loads synchronously, two bytes at a time. Rows past T are zero-filled
 * (cp.async's src-size 0) and masked. The kernel body takes the head size as an argument
 * and is inlined into one kernel per common head size (64 and 128), so its loops and
 * register arrays are sized at compile time, and into one for any other multiple of 8 up
 * to 128 (hs = C / NH at run time; its loops run to 128 with a test, its tiles are hs
 * rounded up to 16 columns, the extra ones zero).
 *
 * This header holds what the three files share: the tile and fragment helpers of both
 * passes and the host's choices (variant, shared memory, shape), which attention_bf16.cu
 * makes; the kernels and launchers are in attention_bf16_fwd.cu and attention_bf16_bwd.cu. */
#ifndef GPTC_ATTENTION_BF16_CUH
#define GPTC_ATTENTION_BF16_CUH

#include "engine/cuda/cuda_common.cuh"
#include "engine/cuda/mma.cuh"

#define AB_TILE 64     /* rows of a block, and rows of a streamed tile */
#define AB_THREADS 128 /* 4 warps x 16 rows */
#define AB_MAX_HS 128
#define AB_PAD 8       /* elements past hs in a tile row (16 bytes) */
#define AB_DS_PITCH (AB_TILE + AB_PAD) /* elements per row of the fused dq's dS^T tile */

/* columns the products cover: hs rounded up to the mma's k of 16 (tile columns from hs up
 * to it are zero, so they add nothing) */
static __host__ __device__ __forceinline__ int ab_cols(int hs) { return (hs + 15) & ~15; }

/* elements per row of a [64][hs] tile */
static __host__ __device__ __forceinline__ int ab_pitch(int hs) { return ab_cols(hs) + AB_PAD; }

/* ------------------------------------------------------------------ choices (attention_bf16.cu) */

/* the forward at hs 64, by variant (ab_fwd_variant) */
typedef enum { AB_FWD_PLAIN, AB_FWD_ROWS128, AB_FWD_PIPE, AB_FWD_WIDE } ab_fwd_kind;

/* where the backward's dq comes from (ab_dq_mode): its own kernel, or the dk/dv kernel's
 * parts stored by pair or added by atomics */
typedef enum { AB_DQ_KERNEL, AB_DQ_PARTS, AB_DQ_ATOMIC } ab_dq_kind;

size_t ab_tile_bytes(int hs);
ab_fwd_kind ab_fwd_variant(int hs);
int ab_fwd_mt(int hs);
size_t ab_fwd_smem_now(int hs);
int ab_bias_fused(void);
ab_dq_kind ab_dq_mode(int hs, int nst);
size_t ab_dkdv_smem(int hs, int nst, int fuse_dq);
size_t ab_dq_smem(int hs, int nst);
int ab_bwd_stages(int hs, size_t optin);
int ab_vec(const void *a, const void *b);
int ab_shape_ok(int C, int NH, cudaStream_t s);
const char *ab_what(char *what, const char *role, int hs);

/* ------------------------------------------------------------------ tiles */

/* tile[r][0..hs) = src[r * ld + 0..hs) for r < nrows, 0 for nrows <= r < 64 and for the
 * columns from hs to ab_cols(hs) (src: a [64][hs] view of bf16, row pitch ld elements,
 * whose row 0 is valid memory even when nrows is 0; hs a multiple of 8). vec: cp.async
 * in 16-byte chunks (src and every row 16-byte aligned), which the caller commits and
 * waits for; else plain 2-byte loads. A row's chunks go to consecutive threads, so the
 * reads coalesce. */
static __device__ __forceinline__ void load_tile(uint16_t *tile /* [64][ab_pitch(hs)] */,
                                                 const uint16_t *src, size_t ld, int nrows,
                                                 int hs, int vec) {
    int nc = ab_cols(hs) / 8, p = ab_pitch(hs);
    for (int u = threadIdx.x; u < AB_TILE * nc; u += AB_THREADS) {
        int r = u / nc, c = 8 * (u % nc), ok = r < nrows && c < hs;
        uint16_t *dst = tile + r * p + c;
        const uint16_t *from = src + (size_t)(ok ? r : 0) * ld + c; /* a valid address */
        if (vec) {
            cp_async16(dst, from, ok ? 16 : 0);
        } else {
            for (int i = 0; i < 8; i++) dst[i] = ok ? __ldg(from + i) : (uint16_t)0;
        }
    }
}

/* ------------------------------------------------------------------ fragments */

/* A fragment of the 16 x 16 block at rows r0, columns c0 of a row-major tile (matrices:
 * rows r0 / r0 + 8 at column c0, then the same at c0 + 8, as mma.cuh's a[0..3]) */
static __device__ __forceinline__ void frag_a(uint32_t a[4], const uint16_t *tile, int p,
                                              int r0, int c0) {
    int lane = threadIdx.x & 31;
    ldsm_x4(a, tile + (r0 + (lane & 15)) * p + c0 + 8 * (lane >> 4));
}

/* B fragments of n-tiles n0 .. n0 + 7 (b0) and n0 + 8 .. n0 + 15 (b1) at k-step k0, from a
 * tile whose rows are B's columns (tile[n][k]: the K tile of Q K^T) */
static __device__ __forceinline__ void frag_b_nk(uint32_t b0[2], uint32_t b1[2],
                                                 const uint16_t *tile, int p, int n0, int k0) {
    int lane = threadIdx.x & 31;
    uint32_t r[4];
    ldsm_x4(r, tile + (n0 + (lane & 7) + 8 * (lane >> 4)) * p + k0 + 8 * ((lane >> 3) & 1));
    b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}

/* The same from a tile stored as B itself (tile[k][n]: the V tile of P V), transposed by
 * ldmatrix */
static __device__ __forceinline__ void frag_b_kn(uint32_t b0[2], uint32_t b1[2],
                                                 const uint16_t *tile, int p, int n0, int k0) {
    int lane = threadIdx.x & 31;
    uint32_t r[4];
    ldsm_x4_trans(r, tile + (k0 + (lane & 15)) * p + n0 + 8 * (lane >> 4));
    b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}

/* acc[j] = rows r0 .. r0 + 15 of tile A (16 x hs) times the transpose of tile B's 64 rows
 * (n = 8j + 0..7): a warp's 16 x 64 block of scores Q K^T (or dO V^T, K Q^T, ...).
 * Loops over the head size run to their bound for hs <= 128 with a test inside, so that
 * they unroll (the register arrays need constant indices) whether hs is a constant (the
 * tests then fold away) or not. */
static __device__ __forceinline__ void tile_scores(float acc[8][4], const uint16_t *A, int r0,
                                                   const uint16_t *B, int hs) {
    int p = ab_pitch(hs);
#pragma unroll
    for (int j = 0; j < 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < AB_MAX_HS / 16; ks++) {
        if (16 * ks >= hs) break;
        uint32_t a[4];
        frag_a(a, A, p, r0, 16 * ks);
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            uint32_t b0[2], b1[2];
            frag_b_nk(b0, b1, B, p, 16 * jj, 16 * ks);
            mma_bf16_16816(acc[2 * jj], a, b0);
            mma_bf16_16816(acc[2 * jj + 1], a, b1);
        }
    }
}

/* acc[j] += a (the A fragment of a 16 x 16 block, k-step k0) times rows k0 .. k0 + 15 of
 * tile B (row-major [64][hs]: the V of P V, the K of dS K), every n-tile of hs */
static __device__ __forceinline__ void mma_a_by_rows(float acc[AB_MAX_HS / 8][4],
                                                     const uint32_t a[4], const uint16_t *B,
                                                     int k0, int hs) {
    int p = ab_pitch(hs);
#pragma unroll
    for (int jj = 0; jj < AB_MAX_HS / 16; jj++) {
        if (16 * jj >= hs) break;
        uint32_t b0[2], b1[2];
        frag_b_kn(b0, b1, B, p, 16 * jj, k0);
        mma_bf16_16816(acc[2 * jj], a, b0);
        mma_bf16_16816(acc[2 * jj + 1], a, b1);
    }
}

/* acc[jd] += S (16 x 64, this warp's accumulators s) times tile V (64 x hs, row-major);
 * S is rounded to bf16 here, the one rounding of P or dS */
static __device__ __forceinline__ void tile_sv(float acc[AB_MAX_HS / 8][4], const float s[8][4],
                                               const uint16_t *V /* [64][ab_pitch(hs)] */,
                                               int hs) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        uint32_t a[4] = {pack_bf16x2(s[2 * kk][0], s[2 * kk][1]),
                         pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                         pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                         pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
        mma_a_by_rows(acc, a, V, 16 * kk, hs);
    }
}

static __device__ __forceinline__ void zero_acc(float acc[AB_MAX_HS / 8][4], int hs) {
#pragma unroll
    for (int j = 0; j < AB_MAX_HS / 8; j++) {
        if (8 * j >= ab_cols(hs)) break;
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    }
}

/* dst[row][8j + 2t + (0, 1)] = mul * acc[j], rounded to bf16, for this lane's two rows
 * (g, g + 8) of a warp's 16 x hs block whose row g starts at row0 (NULL: the row is past
 * T) */
static __device__ __forceinline__ void store_acc(uint16_t *row0, uint16_t *row8,
                                                 const float acc[AB_MAX_HS / 8][4], float mul0,
                                                 float mul8, int hs) {
    int t = threadIdx.x & 3;
#pragma unroll
    for (int j = 0; j < AB_MAX_HS / 8; j++) {
        if (8 * j >= hs) break;
        int c = 8 * j + 2 * t;
        if (row0) {
            row0[c] = bf16_bits(mul0 * acc[j][0]);
            row0[c + 1] = bf16_bits(mul0 * acc[j][1]);
        }
        if (row8) {
            row8[c] = bf16_bits(mul8 * acc[j][2]);
            row8[c + 1] = bf16_bits(mul8 * acc[j][3]);
        }
    }
}

/* Issues the copies of key tile kt (K, then V, rows 64 kt ..) into stage st of KV and
 * commits them, with any copies issued before, as one group. base: q of row 0 of this
 * (batch, head) in qkv [B,T,3C], row pitch ld. */
static __device__ __forceinline__ void load_key_stage(uint16_t *KV /* [stages][K, V][64][p] */,
                                                      const uint16_t *base, int C, size_t ld,
                                                      int kt, int st, int T, int hs, int vec) {
    int tile = AB_TILE * ab_pitch(hs), k0 = kt * AB_TILE;
    uint16_t *Ks = KV + 2 * st * tile;
    size_t row = (size_t)k0 * ld;
    load_tile(Ks, base + C + row, ld, T - k0, hs, vec);
    load_tile(Ks + tile, base + 2 * (size_t)C + row, ld, T - k0, hs, vec);
    cp_async_commit();
}

/* Waits for the tile a loop iteration computes on: the copies of every group but the
 * next tile's, when one was issued (vec), then the barrier that makes every thread's
 * copies (and plain stores) visible */
static __device__ __forceinline__ void tile_landed(int next_issued) {
    if (next_issued) cp_async_wait_one();
    else cp_async_wait_all();
    __syncthreads();
}

#endif /* GPTC_ATTENTION_BF16_CUH */
