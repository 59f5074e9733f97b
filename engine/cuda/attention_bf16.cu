/* Causal self-attention for train.precision = bf16, on tensor cores: the flash scheme of
 * attention.cu (same buffers, same lse [B,NH,T], same scratch, same three backward
 * kernels and the same determinism: no atomics, every element of dqkv written once), with
 * the tile products as mma.sync m16n8k16 bf16 (fp32 accumulate, engine/cuda/mma.cuh);
 * the variants chosen by environment variables (ab_fwd_variant, ab_dq_mode,
 * ab_bias_fused) differ from this where they say so: GPTC_ATTENTION_DQ=atomic and
 * GPTC_ATTENTION_BIAS=1 add by atomics.
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
 * rounded up to 16 columns, the extra ones zero). */
#include "engine/cuda/cuda_common.cuh"
#include "engine/cuda/mma.cuh"

#include <stdio.h>
#include <string.h>

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

/* dst[r] = src[r] for r < nrows, 0 up to 64 */
static __device__ __forceinline__ void load_row_vec(float *dst /* [64] */,
                                                    const float *src /* [nrows] */, int nrows) {
    if (threadIdx.x < AB_TILE)
        dst[threadIdx.x] = (int)threadIdx.x < nrows ? __ldg(src + threadIdx.x) : 0.0f;
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

/* tile_sv for the forward's mt m-tiles (1 or 2) at once, m-tile i only where on[i]: each
 * V fragment loaded once serves every m-tile's product */
static __device__ __forceinline__ void tile_sv2(float acc[2][AB_MAX_HS / 8][4],
                                                const float s[2][8][4], const int on[2], int mt,
                                                const uint16_t *V /* [64][ab_pitch(hs)] */,
                                                int hs) {
    int p = ab_pitch(hs);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        uint32_t a[2][4];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            a[i][0] = pack_bf16x2(s[i][2 * kk][0], s[i][2 * kk][1]);
            a[i][1] = pack_bf16x2(s[i][2 * kk][2], s[i][2 * kk][3]);
            a[i][2] = pack_bf16x2(s[i][2 * kk + 1][0], s[i][2 * kk + 1][1]);
            a[i][3] = pack_bf16x2(s[i][2 * kk + 1][2], s[i][2 * kk + 1][3]);
        }
#pragma unroll
        for (int jj = 0; jj < AB_MAX_HS / 16; jj++) {
            if (16 * jj >= hs) break;
            uint32_t b0[2], b1[2];
            frag_b_kn(b0, b1, V, p, 16 * jj, 16 * kk);
#pragma unroll
            for (int i = 0; i < 2; i++) {
                if (i >= mt || !on[i]) continue;
                mma_bf16_16816(acc[i][2 * jj], a[i], b0);
                mma_bf16_16816(acc[i][2 * jj + 1], a[i], b1);
            }
        }
    }
}

/* Reductions over the 4 lanes of a quad (lanes 4g .. 4g+3 hold one row of a fragment) */
static __device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 1));
    return fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 2));
}

static __device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(FULL_MASK, v, 1);
    return v + __shfl_xor_sync(FULL_MASK, v, 2);
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

/* The block's result rows through shared memory: each lane puts its two rows' fragment of
 * mul * acc, rounded to bf16 as store_acc rounds it, into st [64][ab_pitch(hs)] (the
 * warp's 16 rows from row 16 w), in 4-byte pairs. */
static __device__ __forceinline__ void stage_acc(uint16_t *st, const float acc[AB_MAX_HS / 8][4],
                                                 float mul, int hs) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, p = ab_pitch(hs);
    uint16_t *r0 = st + (16 * warp + (lane >> 2)) * p + 2 * (lane & 3), *r8 = r0 + 8 * p;
#pragma unroll
    for (int j = 0; j < AB_MAX_HS / 8; j++) {
        if (8 * j >= hs) break;
        *(uint32_t *)(r0 + 8 * j) = bf16x2_bits(mul * acc[j][0], mul * acc[j][1]);
        *(uint32_t *)(r8 + 8 * j) = bf16x2_bits(mul * acc[j][2], mul * acc[j][3]);
    }
}

/* After a barrier that follows stage_acc: rows r < nrows of st to dst + r * ld (16 bytes a
 * thread and consecutive threads along a row when vec, the rows then on 16 bytes; else 2
 * bytes), and, when dbias is not NULL, dbias[c] += the sum of column c over those rows
 * (c < hs): the bias gradient of these columns, the values added being the ones stored.
 * One atomicAdd a column for the block: the order of the blocks' additions varies, as in
 * cuda_bias_backward. */
static __device__ __forceinline__ void write_staged(uint16_t *dst, size_t ld, const uint16_t *st,
                                                    int nrows, int hs, float *dbias, int vec) {
    int p = ab_pitch(hs), nc = hs / 8;
    for (int u = threadIdx.x; u < nrows * nc; u += AB_THREADS) {
        int r = u / nc, c = 8 * (u % nc);
        if (vec) {
            *(bf16x8 *)(dst + (size_t)r * ld + c) = *(const bf16x8 *)(st + r * p + c);
        } else {
            for (int i = 0; i < 8; i++) dst[(size_t)r * ld + c + i] = st[r * p + c + i];
        }
    }
    if (!dbias) return;
    for (int c = threadIdx.x; c < hs; c += AB_THREADS) {
        float sum = 0.0f;
        for (int r = 0; r < nrows; r++) sum += bf16_to_float(st[r * p + c]);
        atomicAdd(dbias + c, sum);
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

/* ------------------------------------------------------------------ forward */

/* The online softmax of a warp's scores against nh halves of 64 keys from key k0 (nh 1: a
 * key tile; 2: the 128 keys of attn_fwd_wide's stage), s[h] the 16 x 64 scores of half h,
 * for this lane's rows g and g + 8 (queries tq[0], tq[1]), whose running maximum m, sum l
 * and accumulators o it updates: the causal mask on the diagonal half (diag[h]: the only
 * one with keys past a query, or past T), then per row one new maximum over the halves
 * that are on (on[h]: at or before the diagonal; an off half is left out and zeroed), o
 * and l rescaled once, and the probabilities in place of the scores (fp32: P V rounds them
 * as its operand). The scores stay unscaled: sl2 > 0 keeps their maximum, and the exponent
 * takes them times sl2 in one fused multiply-add (base 2, sl2 = log2(e) / sqrt(hs)). */
static __device__ __forceinline__ void softmax_keys(float s[][8][4], int nh, const int on[],
                                                    const int diag[], float m[2], float l[2],
                                                    float o[AB_MAX_HS / 8][4], const int tq[2],
                                                    int k0, int T, float sl2, int hs) {
    int t = threadIdx.x & 3;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        if (hf >= nh || !diag[hf]) continue;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int u = k0 + AB_TILE * hf + 8 * j + 2 * t + (e & 1);
                if (u > tq[e >> 1] || u >= T) s[hf][j][e] = -INFINITY;
            }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mx = -INFINITY;
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            if (hf >= nh || !on[hf]) continue;
#pragma unroll
            for (int j = 0; j < 8; j++) mx = fmaxf(mx, fmaxf(s[hf][j][2 * r], s[hf][j][2 * r + 1]));
        }
        float mn = fmaxf(m[r], quad_max(mx) * sl2);
        float ref = mn == -INFINITY ? 0.0f : mn; /* no key yet: all terms stay 0 */
        float alpha = exp2_ftz(m[r] - ref), ls = 0.0f;
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            if (hf >= nh) break;
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float pr = on[hf] ? exp2_ftz(fmaf(s[hf][j][2 * r + e], sl2, -ref)) : 0.0f;
                    s[hf][j][2 * r + e] = pr;
                    ls += pr;
                }
        }
        l[r] = l[r] * alpha + quad_sum(ls);
        m[r] = mn;
#pragma unroll
        for (int jd = 0; jd < AB_MAX_HS / 8; jd++)
            if (8 * jd < ab_cols(hs)) o[jd][2 * r] *= alpha, o[jd][2 * r + 1] *= alpha;
    }
}

/* softmax_keys over one key tile from k0, the diagonal one or not */
static __device__ __forceinline__ void softmax_tile(float s[8][4], float m[2], float l[2],
                                                    float o[AB_MAX_HS / 8][4], const int tq[2],
                                                    int k0, int diagonal, int T, float sl2,
                                                    int hs) {
    const int on[1] = {1}, diag[1] = {diagonal};
    softmax_keys((float (*)[8][4])s, 1, on, diag, m, l, o, tq, k0, T, sl2, hs);
}

/* Q's rows q0 .. q0 + 64 mt - 1 of this (batch, head) into Qs [64 mt][p] (base: its q of
 * row 0, row pitch ld), those past T zero-filled; an m-tile wholly past T reads nothing,
 * from row q0 */
static __device__ __forceinline__ void load_query_tiles(uint16_t *Qs, const uint16_t *base,
                                                        size_t ld, int q0, int mt, int T, int hs,
                                                        int vec) {
    int tile = AB_TILE * ab_pitch(hs);
    for (int i = 0; i < mt; i++) {
        int rows = T - q0 - i * AB_TILE;
        load_tile(Qs + i * tile, base + (size_t)(rows > 0 ? q0 + i * AB_TILE : q0) * ld, ld,
                  rows > 0 ? rows : 0, hs, vec);
    }
}

/* The forward's result for this lane's two rows of one m-tile, queries tq[0] and tq[1]:
 * out = o / l where the query is before T, and (the quad's first lane) its base-2 lse
 * = m + log2 l */
static __device__ __forceinline__ void store_rows(uint16_t *out /* [B,T,C] */,
                                                  float *lse /* [B,NH,T] */,
                                                  const float o[AB_MAX_HS / 8][4],
                                                  const float m[2], const float l[2],
                                                  const int tq[2], int bh, int T, int C, int NH,
                                                  int hs) {
    int b = bh / NH, h = bh % NH;
    uint16_t *orow[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int q = tq[r];
        orow[r] = q < T ? out + ((size_t)b * T + q) * C + (size_t)h * hs : NULL;
        if (q < T && (threadIdx.x & 3) == 0) lse[(size_t)bh * T + q] = m[r] + log2f(l[r]);
    }
    store_acc(orow[0], orow[1], o, 1.0f / l[0], 1.0f / l[1], hs);
}

/* Block (bh, y): batch b = bh / NH, head h = bh % NH, query tile NT-1-y of 64 mt rows
 * (the longest rows first); warp w owns the 16 queries q0 + 64 i + 16 w .. + 15 of each
 * of its mt m-tiles i, whose Q fragments it keeps in registers. Per key tile (64 keys) up
 * to the diagonal: S = Q K^T in the log2 domain (sl2 = log2(e) / sqrt(hs)), causal mask,
 * online softmax per row (this lane's rows g and g + 8 of each m-tile; the row's 64 scores
 * are spread over the quad), O = alpha O + P V. Then out = O / l and lse = m + log2 l
 * (base 2, as attention.cu's).
 * mt = 2 (hs 64 only: the registers of two m-tiles at hs 128 would not fit) is the flash
 * forward's larger query tile: each K and V fragment a warp loads from shared memory
 * serves two products, a key tile serves 128 queries, and a warp has two independent
 * chains of products to issue. m-tile i's diagonal is key tile mt qt + i; the key tile
 * after it (the last, for i = 0 of 2) lies wholly past its queries and is skipped. */
static __device__ __forceinline__ void attn_fwd(uint16_t *sm /* ab_fwd_smem(hs, mt, 0) */,
                                                uint16_t *out /* [B,T,C] */,
                                                float *lse /* [B,NH,T] */,
                                                const uint16_t *qkv /* [B,T,3C] */, int T, int C,
                                                int NH, float sl2, int vec, int pairs, int hs,
                                                int mt) {
    int p = ab_pitch(hs), tile = AB_TILE * p;
    uint16_t *Qs = sm;             /* [64 mt][p] this block's queries */
    uint16_t *KV = Qs + mt * tile; /* [2 stages][K, V][64][p] the streamed key and value tiles */

    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    int bh, rank;
    if (!attention_block(pairs, &bh, &rank)) return;
    int b = bh / NH, h = bh % NH, qt = gridDim.y - 1 - rank, q0 = qt * mt * AB_TILE;
    size_t ld = 3 * (size_t)C;
    const uint16_t *base = qkv + (size_t)b * T * ld + (size_t)h * hs; /* q of row 0 */
    /* key tiles: up to the last m-tile's diagonal, none starting at or past T */
    int nk = mt * (qt + 1), kmax = (T + AB_TILE - 1) / AB_TILE;
    if (nk > kmax) nk = kmax;

    load_query_tiles(Qs, base, ld, q0, mt, T, hs, vec);
    load_key_stage(KV, base, C, ld, 0, 0, T, hs, vec); /* one group with Q */

    uint32_t qf[2][AB_MAX_HS / 16][4];
    float o[2][AB_MAX_HS / 8][4], m[2][2], l[2][2];
    int tq[2][2]; /* this lane's queries: rows g and g + 8 of m-tile i */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (i >= mt) break;
        zero_acc(o[i], hs);
        m[i][0] = m[i][1] = -INFINITY;
        l[i][0] = l[i][1] = 0.0f;
        tq[i][0] = q0 + i * AB_TILE + 16 * warp + g;
        tq[i][1] = tq[i][0] + 8;
    }
    for (int kt = 0; kt < nk; kt++) {
        int k0 = kt * AB_TILE, next = kt + 1 < nk;
        const uint16_t *Ks = KV + 2 * (kt & 1) * tile, *Vs = Ks + tile;
        if (next) load_key_stage(KV, base, C, ld, kt + 1, (kt + 1) & 1, T, hs, vec);
        tile_landed(next);
        if (kt == 0) {
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int ks = 0; ks < AB_MAX_HS / 16; ks++)
                    if (i < mt && 16 * ks < hs)
                        frag_a(qf[i][ks], Qs + i * tile, p, 16 * warp, 16 * ks);
        }
        /* m-tile i takes this key tile when it is not past its diagonal (the same for the
         * whole warp, so the products below never diverge) */
        int on[2] = {mt == 1 || kt <= mt * qt, mt > 1 && kt <= mt * qt + 1};

        float s[2][8][4];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 8; j++) s[i][j][0] = s[i][j][1] = s[i][j][2] = s[i][j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < AB_MAX_HS / 16; ks++) {
            if (16 * ks >= hs) break;
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                uint32_t b0[2], b1[2];
                frag_b_nk(b0, b1, Ks, p, 16 * jj, 16 * ks);
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    if (i >= mt || !on[i]) continue;
                    mma_bf16_16816(s[i][2 * jj], qf[i][ks], b0);
                    mma_bf16_16816(s[i][2 * jj + 1], qf[i][ks], b1);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            if (i >= mt || !on[i]) continue;
            softmax_tile(s[i], m[i], l[i], o[i], tq[i], k0, kt == mt * qt + i, T, sl2, hs);
        }
        tile_sv2(o, s, on, mt, Vs, hs);
        __syncthreads(); /* this stage's readers are done: the next iteration refills it */
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (i >= mt) break;
        store_rows(out, lse, o[i], m[i], l[i], tq[i], bh, T, C, NH, hs);
    }
}

/* The pipelined forward's state: where its tiles are and what a warp carries from one key
 * tile to the next. */
typedef struct {
    const uint16_t *base;  /* q of row 0 of this (batch, head) in qkv, row pitch ld */
    size_t ld;
    const uint16_t *Qs;    /* [64][p] the block's queries */
    uint16_t *Kb, *Vb;     /* [2][64][p] each: key tiles and value tiles, two buffers each */
    int nk, T, C, hs, vec, tile, qt;
    int tq[2];             /* this lane's queries */
    float sl2;
} fwd_pipe;

/* Key tile kt of the pipelined forward, whose scores s (Q K^T, unscaled) a warp already
 * holds: after a barrier (every warp is done with the buffers about to be refilled: the
 * K tile kt came from, the V tile kt - 1 came from), it issues the copies of K tile
 * kt + 2 and V tile kt + 1 as one group, waits for the group before it (K tile kt + 1 and
 * V tile kt), and then takes the next tile's scores sn = Q K^T before this tile's softmax
 * and P V: the products of sn need nothing of the softmax, so the tensor cores work on
 * them while the softmax's exponentials and maxima issue. */
static __device__ __forceinline__ void fwd_pipe_step(const fwd_pipe *f, int kt, float s[8][4],
                                                     float sn[8][4], float m[2], float l[2],
                                                     float o[AB_MAX_HS / 8][4]) {
    int k0 = kt * AB_TILE;
    __syncthreads();
    if (kt + 2 < f->nk)
        load_tile(f->Kb + (kt & 1) * f->tile, f->base + f->C + (size_t)(k0 + 2 * AB_TILE) * f->ld,
                  f->ld, f->T - k0 - 2 * AB_TILE, f->hs, f->vec);
    if (kt + 1 < f->nk)
        load_tile(f->Vb + ((kt + 1) & 1) * f->tile,
                  f->base + 2 * (size_t)f->C + (size_t)(k0 + AB_TILE) * f->ld, f->ld,
                  f->T - k0 - AB_TILE, f->hs, f->vec);
    cp_async_commit(); /* every iteration one group, empty or not: the wait below counts them */
    cp_async_wait_one();
    __syncthreads();
    if (kt + 1 < f->nk)
        tile_scores(sn, f->Qs, 16 * (threadIdx.x >> 5), f->Kb + ((kt + 1) & 1) * f->tile, f->hs);
    softmax_tile(s, m, l, o, f->tq, k0, kt == f->qt, f->T, f->sl2, f->hs);
    tile_sv(o, s, f->Vb + (kt & 1) * f->tile, f->hs);
}

/* The forward of attn_fwd (mt = 1: 64 queries a block, 16 a warp) with the key tiles
 * software-pipelined (GPTC_ATTENTION_FWD=pipelined, hs 64): a warp takes tile kt + 1's
 * scores while it works through tile kt's softmax and P V (fwd_pipe_step), where attn_fwd
 * does the three in turn and every warp of the block stalls on the same step at once.
 * The K and V tiles have two buffers each and load one tile apart (K tile kt + 2 with V
 * tile kt + 1), so the shared memory is attn_fwd's; each warp holds two tiles' scores.
 * Same products in the same order, the same results bit for bit. */
static __device__ __forceinline__ void attn_fwd_pipe(uint16_t *sm /* ab_fwd_smem(hs, 1, 0) */,
                                                     uint16_t *out /* [B,T,C] */,
                                                     float *lse /* [B,NH,T] */,
                                                     const uint16_t *qkv /* [B,T,3C] */, int T,
                                                     int C, int NH, float sl2, int vec,
                                                     int pairs, int hs) {
    int p = ab_pitch(hs), tile = AB_TILE * p;
    uint16_t *Qs = sm; /* [64][p] this block's queries */
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    int bh, rank;
    if (!attention_block(pairs, &bh, &rank)) return;
    int b = bh / NH, h = bh % NH, qt = gridDim.y - 1 - rank, q0 = qt * AB_TILE;
    fwd_pipe f = {qkv + (size_t)b * T * 3 * C + (size_t)h * hs, 3 * (size_t)C, Qs,
                  Qs + tile /* [2][64][p] */, Qs + 3 * tile /* [2][64][p] */, qt + 1, T, C,
                  hs, vec, tile, qt, {q0 + 16 * warp + g, q0 + 16 * warp + g + 8}, sl2};

    /* group 0: Q and K tile 0; group 1: K tile 1 and V tile 0 */
    load_tile(Qs, f.base + (size_t)q0 * f.ld, f.ld, T - q0, hs, vec);
    load_tile(f.Kb, f.base + C, f.ld, T, hs, vec);
    cp_async_commit();
    if (f.nk > 1)
        load_tile(f.Kb + tile, f.base + C + (size_t)AB_TILE * f.ld, f.ld, T - AB_TILE, hs, vec);
    load_tile(f.Vb, f.base + 2 * (size_t)C, f.ld, T, hs, vec);
    cp_async_commit();
    cp_async_wait_one();
    __syncthreads();

    float o[AB_MAX_HS / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float s0[8][4], s1[8][4]; /* the scores of the tile in hand and of the next */
    zero_acc(o, hs);
    tile_scores(s0, Qs, 16 * warp, f.Kb, hs);
    /* two steps a turn, so that the two score arrays swap roles without copies */
    for (int kt = 0; kt < f.nk; kt += 2) {
        fwd_pipe_step(&f, kt, s0, s1, m, l, o);
        if (kt + 1 < f.nk) fwd_pipe_step(&f, kt + 1, s1, s0, m, l, o);
    }

    store_rows(out, lse, o, m, l, f.tq, bh, T, C, NH, hs);
}

/* Issues the copies of 128-key stage kt (K rows 128 kt .., both halves, then V's) into
 * stage st of KV [2][K0, K1, V0, V1][64][p] and commits them as one group. A half wholly
 * past T loads nothing (from row 128 kt, which is before T). */
static __device__ __forceinline__ void load_wide_stage(uint16_t *KV, const uint16_t *base,
                                                       int C, size_t ld, int kt, int st, int T,
                                                       int hs, int vec) {
    int tile = AB_TILE * ab_pitch(hs), k0 = 2 * kt * AB_TILE;
    uint16_t *dst = KV + 4 * st * tile;
#pragma unroll
    for (int kv = 0; kv < 2; kv++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            int rows = T - k0 - hf * AB_TILE, from = rows > 0 ? k0 + hf * AB_TILE : k0;
            load_tile(dst + (2 * kv + hf) * tile, base + (size_t)(kv + 1) * C + (size_t)from * ld,
                      ld, rows > 0 ? rows : 0, hs, vec);
        }
    cp_async_commit();
}

/* The forward in flash attention 2's shape for hs 64 (GPTC_ATTENTION_FWD=wide): a block of
 * 128 queries, warp w owning rows 16 w and 64 + 16 w of its two m-tiles (as attn_fwd at
 * mt = 2), streams 128 keys a stage (two halves of 64, double-buffered), so that a warp
 * takes 2 x 2 x 8 score tiles' products, one softmax rescaling and one pair of barriers
 * per 128 keys, where attn_fwd takes them per 64. The Q fragments are read from shared
 * memory at every stage rather than held (the registers go to the wider scores). m-tile
 * i's diagonal is half i of the block's last stage; half 1 of it lies past m-tile 0's
 * queries and is left out. The same products and roundings as attn_fwd's, in the same
 * order per 64 keys, but the softmax's maximum is taken over 128 keys: its results agree
 * with attn_fwd's to rounding, not bit for bit. */
static __device__ __forceinline__ void attn_fwd_wide(uint16_t *sm /* ab_fwd_smem(hs, 2, 1) */,
                                                     uint16_t *out /* [B,T,C] */,
                                                     float *lse /* [B,NH,T] */,
                                                     const uint16_t *qkv /* [B,T,3C] */, int T,
                                                     int C, int NH, float sl2, int vec,
                                                     int pairs, int hs) {
    int p = ab_pitch(hs), tile = AB_TILE * p;
    uint16_t *Qs = sm;            /* [128][p] this block's queries */
    uint16_t *KV = Qs + 2 * tile; /* [2 stages][K0, K1, V0, V1][64][p] */

    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    int bh, rank;
    if (!attention_block(pairs, &bh, &rank)) return;
    int b = bh / NH, h = bh % NH, qt = gridDim.y - 1 - rank, q0 = qt * 2 * AB_TILE;
    size_t ld = 3 * (size_t)C;
    const uint16_t *base = qkv + (size_t)b * T * ld + (size_t)h * hs; /* q of row 0 */
    int nk = qt + 1, kmax = (T + 2 * AB_TILE - 1) / (2 * AB_TILE);
    if (nk > kmax) nk = kmax;

    load_query_tiles(Qs, base, ld, q0, 2, T, hs, vec);
    load_wide_stage(KV, base, C, ld, 0, 0, T, hs, vec); /* one group with Q */

    float o[2][AB_MAX_HS / 8][4], m[2][2], l[2][2];
    int tq[2][2]; /* this lane's queries: rows g and g + 8 of m-tile i */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        zero_acc(o[i], hs);
        m[i][0] = m[i][1] = -INFINITY;
        l[i][0] = l[i][1] = 0.0f;
        tq[i][0] = q0 + i * AB_TILE + 16 * warp + g;
        tq[i][1] = tq[i][0] + 8;
    }
    for (int kt = 0; kt < nk; kt++) {
        int next = kt + 1 < nk;
        const uint16_t *Ks = KV + 4 * (kt & 1) * tile, *Vs = Ks + 2 * tile;
        if (next) load_wide_stage(KV, base, C, ld, kt + 1, (kt + 1) & 1, T, hs, vec);
        tile_landed(next);
        /* half hf of this stage for m-tile i: at or before its diagonal, or the diagonal
         * (the same for the whole warp: the products never diverge) */
        int on[2][2], diag[2][2]; /* [half][m-tile] */
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                on[hf][i] = 2 * kt + hf <= 2 * qt + i;
                diag[hf][i] = 2 * kt + hf == 2 * qt + i;
            }

        float s[2][2][8][4]; /* [half][m-tile] */
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 8; j++)
                    s[hf][i][j][0] = s[hf][i][j][1] = s[hf][i][j][2] = s[hf][i][j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < AB_MAX_HS / 16; ks++) {
            if (16 * ks >= hs) break;
            uint32_t qf[2][4];
#pragma unroll
            for (int i = 0; i < 2; i++) frag_a(qf[i], Qs + i * tile, p, 16 * warp, 16 * ks);
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    if (!on[hf][1]) continue; /* m-tile 1 is on wherever m-tile 0 is */
                    uint32_t b0[2], b1[2];
                    frag_b_nk(b0, b1, Ks + hf * tile, p, 16 * jj, 16 * ks);
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        if (!on[hf][i]) continue;
                        mma_bf16_16816(s[hf][i][2 * jj], qf[i], b0);
                        mma_bf16_16816(s[hf][i][2 * jj + 1], qf[i], b1);
                    }
                }
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float si[2][8][4];
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) si[hf][j][e] = s[hf][i][j][e];
            int oni[2] = {on[0][i], on[1][i]}, dgi[2] = {diag[0][i], diag[1][i]};
            softmax_keys(si, 2, oni, dgi, m[i], l[i], o[i], tq[i], 2 * kt * AB_TILE, T, sl2, hs);
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[hf][i][j][e] = si[hf][j][e];
        }
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            if (!on[hf][1]) continue;
            tile_sv2(o, s[hf], on[hf], 2, Vs + hf * tile, hs);
        }
        __syncthreads(); /* this stage's readers are done: the next iteration refills it */
    }

#pragma unroll
    for (int i = 0; i < 2; i++) store_rows(out, lse, o[i], m[i], l[i], tq[i], bh, T, C, NH, hs);
}

/* hs 64 in flash attention 2's shape (GPTC_ATTENTION_FWD=wide): 2 blocks an SM, as its
 * registers (up to 255) and shared memory (8 tiles and Q's 2) allow */
__global__ void __launch_bounds__(AB_THREADS, 2)
attention_bf16_fwd64_wide_kernel(uint16_t *out /* [B,T,C] */, float *lse /* [B,NH,T] */,
                                 const uint16_t *qkv /* [B,T,3C] */, int T, int C, int NH,
                                 float sl2, int vec, int pairs) {
    extern __shared__ float4 ab_smem[];
    attn_fwd_wide((uint16_t *)ab_smem, out, lse, qkv, T, C, NH, sl2, vec, pairs, 64);
}

/* hs 64 with the key tiles pipelined (GPTC_ATTENTION_FWD=pipelined); 3 blocks an SM, as
 * the shared memory allows */
__global__ void __launch_bounds__(AB_THREADS, 3)
attention_bf16_fwd64_pipe_kernel(uint16_t *out /* [B,T,C] */, float *lse /* [B,NH,T] */,
                                 const uint16_t *qkv /* [B,T,3C] */, int T, int C, int NH,
                                 float sl2, int vec, int pairs) {
    extern __shared__ float4 ab_smem[];
    attn_fwd_pipe((uint16_t *)ab_smem, out, lse, qkv, T, C, NH, sl2, vec, pairs, 64);
}

__global__ void __launch_bounds__(AB_THREADS)
attention_bf16_fwd64_kernel(uint16_t *out /* [B,T,C] */, float *lse /* [B,NH,T] */,
                            const uint16_t *qkv /* [B,T,3C] */, int T, int C, int NH,
                            float sl2, int vec, int pairs) {
    extern __shared__ float4 ab_smem[];
    attn_fwd((uint16_t *)ab_smem, out, lse, qkv, T, C, NH, sl2, vec, pairs, 64, 1);
}

/* hs 64 with two m-tiles a warp, 128 queries a block (GPTC_ATTENTION_FWD_ROWS=128) */
__global__ void __launch_bounds__(AB_THREADS, 2)
attention_bf16_fwd64x2_kernel(uint16_t *out /* [B,T,C] */, float *lse /* [B,NH,T] */,
                              const uint16_t *qkv /* [B,T,3C] */, int T, int C, int NH,
                              float sl2, int vec, int pairs) {
    extern __shared__ float4 ab_smem[];
    attn_fwd((uint16_t *)ab_smem, out, lse, qkv, T, C, NH, sl2, vec, pairs, 64, 2);
}

__global__ void __launch_bounds__(AB_THREADS)
attention_bf16_fwd128_kernel(uint16_t *out /* [B,T,C] */, float *lse /* [B,NH,T] */,
                             const uint16_t *qkv /* [B,T,3C] */, int T, int C, int NH,
                             float sl2, int vec, int pairs) {
    extern __shared__ float4 ab_smem[];
    attn_fwd((uint16_t *)ab_smem, out, lse, qkv, T, C, NH, sl2, vec, pairs, 128, 1);
}

/* any other head size (a multiple of 8 up to 128): hs = C / NH at run time, registers as
 * for 128 */
__global__ void __launch_bounds__(AB_THREADS)
attention_bf16_fwd_any_kernel(uint16_t *out /* [B,T,C] */, float *lse /* [B,NH,T] */,
                              const uint16_t *qkv /* [B,T,3C] */, int T, int C, int NH,
                              float sl2, int vec, int pairs) {
    extern __shared__ float4 ab_smem[];
    attn_fwd((uint16_t *)ab_smem, out, lse, qkv, T, C, NH, sl2, vec, pairs, C / NH, 1);
}

/* ------------------------------------------------------------------ backward */

/* P = exp2(s sl2 - lse2) and dS = P (dP - D), in place in s and dp, for one element whose
 * query's log2-domain lse and D are given. masked: P = 0 where key u is past query tq or
 * tq is past T. Only the diagonal tile and a partial last one need that: the callers
 * pass a constant, so that the other tiles' code has no test at all. */
static __device__ __forceinline__ void prob_and_ds(float *s, float *dp, int u, int tq, int T,
                                                   float sl2, float lse2, float D, int masked) {
    float p = exp2_ftz(fmaf(*s, sl2, -lse2));
    if (masked && (u > tq || tq >= T)) p = 0.0f;
    *s = p;
    *dp = p * (*dp - D);
}

/* prob_and_ds over a dk/dv warp's block: rows are its keys u[2] (this lane's), columns
 * the 64 queries from q0, whose stats are lse2[64] and D[64] */
static __device__ __forceinline__ void probs_by_key(float s[8][4], float dp[8][4],
                                                    const int u[2], int q0, int T, float sl2,
                                                    const float *lse2, const float *D,
                                                    int masked) {
    int t = threadIdx.x & 3;
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int c = 8 * j + 2 * t + (i & 1); /* query q0 + c */
            prob_and_ds(&s[j][i], &dp[j][i], u[i >> 1], q0 + c, T, sl2, lse2[c], D[c], masked);
        }
}

/* prob_and_ds over a dq warp's block: rows are its queries q0 + r0 (+ 8), whose stats are
 * lse2[r], D[r] (r = r0, r0 + 8), columns the 64 keys from k0 */
static __device__ __forceinline__ void probs_by_query(float s[8][4], float dp[8][4], int k0,
                                                      int q0, int r0, int T, float sl2,
                                                      const float *lse2, const float *D,
                                                      int masked) {
    int t = threadIdx.x & 3;
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = r0 + 8 * (i >> 1); /* query q0 + r */
            prob_and_ds(&s[j][i], &dp[j][i], k0 + 8 * j + 2 * t + (i & 1), q0 + r, T, sl2,
                        lse2[r], D[r], masked);
        }
}

/* Issues the copies of the query tile from row q0 (Q, then dO) into QdO and commits them,
 * with any copies issued before, as one group; stores their log2-domain lse and D into
 * stats. base, dbase: q and dout of row 0 of this (batch, head) (row pitches ld and C);
 * lse_bh, D_bh: its rows of lse and D. */
static __device__ __forceinline__ void load_query_stage(uint16_t *QdO /* [Q, dO][64][p] */,
                                                        float *stats /* [lse2, D][64] */,
                                                        const uint16_t *base,
                                                        const uint16_t *dbase, size_t ld,
                                                        int C, const float *lse_bh,
                                                        const float *D_bh, int q0, int T,
                                                        int hs, int vec) {
    load_tile(QdO, base + (size_t)q0 * ld, ld, T - q0, hs, vec);
    load_tile(QdO + AB_TILE * ab_pitch(hs), dbase + (size_t)q0 * C, (size_t)C, T - q0, hs, vec);
    cp_async_commit();
    load_row_vec(stats, lse_bh + q0, T - q0);
    load_row_vec(stats + AB_TILE, D_bh + q0, T - q0);
}

/* where the backward's dq comes from (ab_dq_mode): its own kernel, or the dk/dv kernel's
 * parts stored by pair or added by atomics */
typedef enum { AB_DQ_KERNEL, AB_DQ_PARTS, AB_DQ_ATOMIC } ab_dq_kind;

/* what every backward kernel reads and writes, passed by value (kernel parameters) */
typedef struct {
    uint16_t *dqkv;        /* [B,T,3C] */
    float *dbias;          /* [3C] += column sums of dqkv, or NULL */
    const uint16_t *dout;  /* [B,T,C] */
    const uint16_t *qkv;   /* [B,T,3C] */
    const float *lse;      /* [B,NH,T] base-2 log-sum-exp of the forward's scores */
    const float *D;        /* [B,NH,T] rowsum(dO * O) */
    int T, C, NH, vec;
    float sl2, scale;
    int pairs;             /* B * NH (attention_block) */
    float *dq_part;        /* NULL, or the fused dq's parts (ab_dq_part_floats), fp32,
                            * unscaled: by pair (dq_atomic 0), [B*NH][pair (query tile qt,
                            * key tile kt <= qt) at qt (qt + 1) / 2 + kt][64][hs]; by atomics
                            * (dq_atomic 1), [B*NH][query tile qt][64][hs], zero before the
                            * dk/dv kernel, which adds every key tile's part into it */
    int dq_atomic;
} ab_bwd_args;

/* The part of dQ a dk/dv block's key tile gives one query tile: the transposed dS^T the
 * warps hold, through shared memory (dss), times the block's K. */

/* dss [64 keys][AB_DS_PITCH] rows 16 w + g and + 8: this warp's dS^T (its 16 keys by the
 * query tile's 64 queries), rounded to bf16 as tile_sv rounds it for dK, so that dq and
 * dk see the same dS */
static __device__ __forceinline__ void stage_ds(uint16_t *dss, const float ds[8][4]) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint16_t *r0 = dss + (16 * warp + (lane >> 2)) * AB_DS_PITCH + 2 * (lane & 3);
    uint16_t *r8 = r0 + 8 * AB_DS_PITCH;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        *(uint32_t *)(r0 + 8 * j) = pack_bf16x2(ds[j][0], ds[j][1]);
        *(uint32_t *)(r8 + 8 * j) = pack_bf16x2(ds[j][2], ds[j][3]);
    }
}

/* acc = rows r0 .. r0 + 15 of dS (queries by the 64 keys: the transpose of dss, which
 * ldmatrix .trans reads as the A fragments) times K (64 keys by hs, row-major) */
static __device__ __forceinline__ void tile_dsk(float acc[AB_MAX_HS / 8][4], const uint16_t *dss,
                                                int r0, const uint16_t *K /* [64][p] */,
                                                int hs) {
    int lane = threadIdx.x & 31, mi = lane >> 3; /* mi: a[mi]'s 8x8 */
    zero_acc(acc, hs);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        uint32_t a[4]; /* rows (queries) r0 + 8 (mi & 1), columns (keys) 16 kk + 8 (mi >> 1) */
        ldsm_x4_trans(a, dss + (16 * kk + 8 * (mi >> 1) + (lane & 7)) * AB_DS_PITCH + r0 +
                             8 * (mi & 1));
        mma_a_by_rows(acc, a, K, 16 * kk, hs);
    }
}

/* The [64][hs] slot of a.dq_part that key tile kt gives query tile qt of pair bh, of nt
 * tiles a pair (ab_bwd_args): by pair, or by atomics the query tile's one slot */
static __device__ __forceinline__ size_t dq_slot(int bh, int nt, int qt, int kt, int atomic) {
    return atomic ? (size_t)bh * nt + qt
                  : (size_t)bh * (nt * (nt + 1) / 2) + qt * (qt + 1) / 2 + kt;
}

/* p[0] += x, p[1] += y as atomics whose results nobody reads: one 8-byte vector
 * reduction on sm_90, which has them (p global and 8-byte aligned), two 4-byte ones
 * before. The float2 atomicAdd would be an atom, which returns the old values into
 * registers this kernel has none to spare for; red returns nothing. */
static __device__ __forceinline__ void red_add_f32x2(float *p, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(x), "f"(y));
#else
    atomicAdd(p, x);
    atomicAdd(p + 1, y);
#endif
}

/* part[r][c] = acc for this lane's rows r0 + g and r0 + g + 8 that are below nrows (the
 * query tile's rows before T): part is a [64][hs] fp32 slot */
static __device__ __forceinline__ void store_part(float *part, const float acc[AB_MAX_HS / 8][4],
                                                  int r0, int nrows, int hs) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < AB_MAX_HS / 8; j++) {
        if (8 * j >= hs) break;
        int c = 8 * j + 2 * t;
        if (r0 + g < nrows)
            *(float2 *)(part + (size_t)(r0 + g) * hs + c) = make_float2(acc[j][0], acc[j][1]);
        if (r0 + g + 8 < nrows)
            *(float2 *)(part + (size_t)(r0 + g + 8) * hs + c) = make_float2(acc[j][2], acc[j][3]);
    }
}

/* store_part's sums: part[r][c] += acc, by atomics */
static __device__ __forceinline__ void add_part(float *part, const float acc[AB_MAX_HS / 8][4],
                                                int r0, int nrows, int hs) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int ok0 = r0 + g < nrows, ok8 = r0 + g + 8 < nrows;
    float *row0 = part + (size_t)(r0 + g) * hs + 2 * t, *row8 = row0 + 8 * (size_t)hs;
#pragma unroll
    for (int j = 0; j < AB_MAX_HS / 8; j++) {
        if (8 * j >= hs) break;
        if (ok0) red_add_f32x2(row0 + 8 * j, acc[j][0], acc[j][1]);
        if (ok8) red_add_f32x2(row8 + 8 * j, acc[j][2], acc[j][3]);
    }
}

/* Block (bh, y): key tile y (the longest loops first); warp w owns keys k0 + 16 w .. + 15.
 * K, V of the tile stay in shared memory; for each query tile at or after it, in the
 * transposed view (rows: this warp's keys, columns: the tile's 64 queries):
 * S^T = K Q^T and dP^T = V dO^T, P^T and dS^T from lse and D, then dV += P^T dO and
 * dK += dS^T Q with P^T and dS^T straight from the accumulators (Q and dO as the B of
 * both kinds of product, through the two ldmatrix forms). Writes dk = dK / sqrt(hs) and
 * dv for its keys < T. nst: stages of the streamed tiles, 2 (the next tile loads under
 * this one's products) or 1 (it loads after them: for devices whose blocks cannot have
 * the shared memory of two). staged: dk and dv leave through shared memory (write_staged:
 * 16-byte stores, and the bias gradient's sums when a.dbias is set); else each lane
 * stores its fragments, 2 bytes at a time, and a.dbias must be NULL.
 * fuse_dq (AB_DQ_PARTS or AB_DQ_ATOMIC, a compile-time constant as a.dq_atomic says; a.dq_part
 * set; two stages): the block also takes dQ's part of this key tile for each query
 * tile, dS K, and stores it to the pair's slot of a.dq_part (AB_DQ_ATOMIC: adds it into
 * the query tile's slot by atomics) for
 * attention_bf16_dq_sum_kernel to add up (or round): 5 products per tile pair instead of
 * the 4 here and 3 in the dq kernel, which recomputes S, dP and dS. The warps' dS^T goes
 * through shared memory (the A of dS K has queries for rows), one more barrier per tile. */
static __device__ __forceinline__ void attn_bwd_dkdv(uint16_t *sm /* ab_dkdv_smem(hs, nst) */,
                                                     ab_bwd_args a, int hs, int nst,
                                                     int staged, ab_dq_kind fuse_dq) {
    uint16_t *dqkv = a.dqkv;
    const uint16_t *dout = a.dout, *qkv = a.qkv;
    const float *lse = a.lse, *D = a.D;
    int T = a.T, C = a.C, NH = a.NH, vec = a.vec;
    float sl2 = a.sl2, scale = a.scale;
    int p = ab_pitch(hs), tile = AB_TILE * p;
    uint16_t *Ks = sm;           /* [64][p] this block's keys */
    uint16_t *Vs = Ks + tile;    /* [64][p] this block's values */
    uint16_t *QdO = Vs + tile;   /* [nst stages][Q, dO][64][p] the streamed query tiles */
    float *stats = (float *)(QdO + 2 * nst * tile); /* [nst][lse2, D][64] of their queries */
    uint16_t *dss = (uint16_t *)(stats + 2 * nst * AB_TILE); /* [64][AB_DS_PITCH] (fuse_dq) */

    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    int bh, ktile;
    if (!attention_block(a.pairs, &bh, &ktile)) return;
    int b = bh / NH, h = bh % NH, k0 = ktile * AB_TILE, ntiles = gridDim.y;
    size_t ld = 3 * (size_t)C;
    const uint16_t *base = qkv + (size_t)b * T * ld + (size_t)h * hs;   /* q of row 0 */
    const uint16_t *dbase = dout + (size_t)b * T * C + (size_t)h * hs; /* dout of row 0 */
    const float *lse_bh = lse + (size_t)bh * T, *D_bh = D + (size_t)bh * T;
    int u[2] = {k0 + 16 * warp + g, k0 + 16 * warp + g + 8}; /* this lane's keys */

    load_tile(Ks, base + C + (size_t)k0 * ld, ld, T - k0, hs, vec);
    load_tile(Vs, base + 2 * (size_t)C + (size_t)k0 * ld, ld, T - k0, hs, vec);
    load_query_stage(QdO, stats, base, dbase, ld, C, lse_bh, D_bh, k0, T, hs, vec);

    float dk[AB_MAX_HS / 8][4], dv[AB_MAX_HS / 8][4];
    zero_acc(dk, hs);
    zero_acc(dv, hs);
    for (int qt = ktile; qt < ntiles; qt++) {
        int q0 = qt * AB_TILE, next = qt + 1 < ntiles;
        int stage = nst == 2 ? (qt - ktile) & 1 : 0;
        const uint16_t *Qs = QdO + 2 * stage * tile, *dOs = Qs + tile;
        const float *lse_s = stats + 2 * stage * AB_TILE, *D_s = lse_s + AB_TILE;
        if (next && nst == 2)
            load_query_stage(QdO + 2 * (stage ^ 1) * tile, stats + 2 * (stage ^ 1) * AB_TILE,
                             base, dbase, ld, C, lse_bh, D_bh, q0 + AB_TILE, T, hs, vec);
        tile_landed(next && nst == 2);

        float s[8][4], dp[8][4];
        tile_scores(s, Ks, 16 * warp, Qs, hs);   /* k_u . q_t */
        tile_scores(dp, Vs, 16 * warp, dOs, hs); /* v_u . dout_t */
        if (qt == ktile || q0 + AB_TILE > T) /* the diagonal, or queries past T */
            probs_by_key(s, dp, u, q0, T, sl2, lse_s, D_s, 1);
        else
            probs_by_key(s, dp, u, q0, T, sl2, lse_s, D_s, 0);
        tile_sv(dv, s, dOs, hs);
        tile_sv(dk, dp, Qs, hs);
        if (fuse_dq) {
            stage_ds(dss, dp);
            __syncthreads(); /* every warp's keys of dS^T are in dss */
            float dq[AB_MAX_HS / 8][4];
            tile_dsk(dq, dss, 16 * warp, Ks, hs);
            int atomic = fuse_dq == AB_DQ_ATOMIC;
            float *slot = a.dq_part + dq_slot(bh, ntiles, qt, ktile, atomic) * AB_TILE * hs;
            if (atomic) add_part(slot, dq, 16 * warp, T - q0, hs);
            else store_part(slot, dq, 16 * warp, T - q0, hs);
        }
        __syncthreads(); /* this stage's readers are done (and dss's, with fuse_dq) */
        if (next && nst == 1)
            load_query_stage(QdO, stats, base, dbase, ld, C, lse_bh, D_bh, q0 + AB_TILE, T, hs,
                             vec);
    }

    if (!staged) { /* each lane stores its own fragments (a.dbias is NULL) */
        uint16_t *krow[2], *vrow[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            krow[r] = u[r] < T ? dqkv + ((size_t)b * T + u[r]) * ld + C + (size_t)h * hs : NULL;
            vrow[r] = u[r] < T ? krow[r] + C : NULL;
        }
        store_acc(krow[0], krow[1], dk, scale, scale, hs);
        store_acc(vrow[0], vrow[1], dv, 1.0f, 1.0f, hs);
        return;
    }
    /* dk and dv leave through the query tiles' stages, free since the loop's last barrier */
    uint16_t *dks = QdO, *dvs = QdO + tile;
    stage_acc(dks, dk, scale, hs);
    stage_acc(dvs, dv, 1.0f, hs);
    __syncthreads();
    int nrows = T - k0 < AB_TILE ? T - k0 : AB_TILE, out_vec = ((uintptr_t)dqkv & 15u) == 0;
    uint16_t *krow = dqkv + ((size_t)b * T + k0) * ld + C + (size_t)h * hs; /* dk of key k0 */
    float *db = a.dbias ? a.dbias + C + (size_t)h * hs : NULL; /* dbias of the k columns */
    write_staged(krow, ld, dks, nrows, hs, db, out_vec);
    write_staged(krow + C, ld, dvs, nrows, hs, db ? db + C : NULL, out_vec);
}

/* Block (bh, y): query tile NT-1-y (the longest loops first); warp w owns queries
 * q0 + 16 w .. + 15. Q, dO, lse, D of the tile stay in shared memory; for each key tile
 * up to the diagonal: S = Q K^T, dP = dO V^T, P and dS as in the dk/dv kernel, then
 * dQ += dS K (K through ldmatrix .trans as that B). Writes dq = dQ / sqrt(hs) for its
 * queries < T. nst: stages of the streamed tiles, as in the dk/dv kernel. */
static __device__ __forceinline__ void attn_bwd_dq(uint16_t *sm /* ab_dq_smem(hs, nst) */,
                                                   ab_bwd_args a, int hs, int nst) {
    uint16_t *dqkv = a.dqkv;
    const uint16_t *dout = a.dout, *qkv = a.qkv;
    const float *lse = a.lse, *D = a.D;
    int T = a.T, C = a.C, NH = a.NH, vec = a.vec;
    float sl2 = a.sl2, scale = a.scale;
    int p = ab_pitch(hs), tile = AB_TILE * p;
    uint16_t *Qs = sm;          /* [64][p] this block's queries */
    uint16_t *dOs = Qs + tile;  /* [64][p] their output gradient */
    uint16_t *KV = dOs + tile;  /* [nst stages][K, V][64][p] the streamed key and value tiles */
    float *lse_s = (float *)(KV + 2 * nst * tile); /* [64] log2(e) lse of this block's queries */
    float *D_s = lse_s + AB_TILE;            /* [64] D of this block's queries */

    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    int bh, rank;
    if (!attention_block(a.pairs, &bh, &rank)) return;
    int b = bh / NH, h = bh % NH, qt = gridDim.y - 1 - rank, q0 = qt * AB_TILE;
    size_t ld = 3 * (size_t)C;
    const uint16_t *base = qkv + (size_t)b * T * ld + (size_t)h * hs;
    const uint16_t *dbase = dout + (size_t)b * T * C + (size_t)h * hs;
    int r0 = 16 * warp + g; /* this lane's queries: q0 + r0 and q0 + r0 + 8 */

    load_tile(Qs, base + (size_t)q0 * ld, ld, T - q0, hs, vec);
    load_tile(dOs, dbase + (size_t)q0 * C, (size_t)C, T - q0, hs, vec);
    load_key_stage(KV, base, C, ld, 0, 0, T, hs, vec); /* one group with Q, dO */
    load_row_vec(lse_s, lse + (size_t)bh * T + q0, T - q0);
    load_row_vec(D_s, D + (size_t)bh * T + q0, T - q0);

    float dq[AB_MAX_HS / 8][4];
    zero_acc(dq, hs);
    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * AB_TILE, next = kt < qt, stage = nst == 2 ? kt & 1 : 0;
        const uint16_t *Ks = KV + 2 * stage * tile, *Vs = Ks + tile;
        if (next && nst == 2) load_key_stage(KV, base, C, ld, kt + 1, stage ^ 1, T, hs, vec);
        tile_landed(next && nst == 2);

        float s[8][4], dp[8][4];
        tile_scores(s, Qs, 16 * warp, Ks, hs);   /* q_t . k_u */
        tile_scores(dp, dOs, 16 * warp, Vs, hs); /* dout_t . v_u */
        if (kt == qt) /* the diagonal (the only tile with keys past T, or rows past T) */
            probs_by_query(s, dp, k0, q0, r0, T, sl2, lse_s, D_s, 1);
        else
            probs_by_query(s, dp, k0, q0, r0, T, sl2, lse_s, D_s, 0);
        tile_sv(dq, dp, Ks, hs);
        __syncthreads(); /* this stage's readers are done: the next iteration refills it */
        if (next && nst == 1) load_key_stage(KV, base, C, ld, kt + 1, 0, T, hs, vec);
    }

    /* dq leaves through the key tiles' stages, free since the loop's last barrier */
    stage_acc(KV, dq, scale, hs);
    __syncthreads();
    int nrows = T - q0 < AB_TILE ? T - q0 : AB_TILE, out_vec = ((uintptr_t)dqkv & 15u) == 0;
    write_staged(dqkv + ((size_t)b * T + q0) * ld + (size_t)h * hs, ld, KV, nrows, hs,
                 a.dbias ? a.dbias + (size_t)h * hs : NULL, out_vec);
}

/* at most 168 registers, for 3 blocks (12 warps) an SM: unbounded, ptxas takes 190 and leaves
 * room for 2; bounded, it spills 28 bytes (sm_90, nvcc 13.0). Which is faster is not yet
 * measured. The staged epilogue spills more (44 bytes stored, 96 loaded), so GPT-2's head
 * size keeps the plain one unless the bias gradient is fused (ab_bias_fused). */
__global__ void __launch_bounds__(AB_THREADS, 3) attention_bf16_dkdv64_kernel(ab_bwd_args a) {
    extern __shared__ float4 ab_smem[];
    attn_bwd_dkdv((uint16_t *)ab_smem, a, 64, 2, 0, AB_DQ_KERNEL);
}

__global__ void __launch_bounds__(AB_THREADS, 3) attention_bf16_dkdv64_bias_kernel(ab_bwd_args a) {
    extern __shared__ float4 ab_smem[];
    attn_bwd_dkdv((uint16_t *)ab_smem, a, 64, 2, 1, AB_DQ_KERNEL);
}

/* the same two with dq fused (GPTC_ATTENTION_DQ=fused: ab_dq_mode); at 168 registers they
 * spill less than the two above (12 and 24 bytes stored, nvcc 13.0): S and dP are dead
 * before dS K's accumulators are born */
__global__ void __launch_bounds__(AB_THREADS, 3) attention_bf16_dkdv64_dq_kernel(ab_bwd_args a) {
    extern __shared__ float4 ab_smem[];
    attn_bwd_dkdv((uint16_t *)ab_smem, a, 64, 2, 0, AB_DQ_PARTS);
}

__global__ void __launch_bounds__(AB_THREADS, 3)
attention_bf16_dkdv64_dq_bias_kernel(ab_bwd_args a) {
    extern __shared__ float4 ab_smem[];
    attn_bwd_dkdv((uint16_t *)ab_smem, a, 64, 2, 1, AB_DQ_PARTS);
}

/* and with dq's parts added by atomics (GPTC_ATTENTION_DQ=atomic) */
__global__ void __launch_bounds__(AB_THREADS, 3) attention_bf16_dkdv64_dqa_kernel(ab_bwd_args a) {
    extern __shared__ float4 ab_smem[];
    attn_bwd_dkdv((uint16_t *)ab_smem, a, 64, 2, 0, AB_DQ_ATOMIC);
}

__global__ void __launch_bounds__(AB_THREADS, 3)
attention_bf16_dkdv64_dqa_bias_kernel(ab_bwd_args a) {
    extern __shared__ float4 ab_smem[];
    attn_bwd_dkdv((uint16_t *)ab_smem, a, 64, 2, 1, AB_DQ_ATOMIC);
}

__global__ void __launch_bounds__(AB_THREADS) attention_bf16_dkdv128_kernel(ab_bwd_args a) {
    extern __shared__ float4 ab_smem[];
    attn_bwd_dkdv((uint16_t *)ab_smem, a, 128, 2, 1, AB_DQ_KERNEL);
}

__global__ void __launch_bounds__(AB_THREADS) attention_bf16_dq64_kernel(ab_bwd_args a) {
    extern __shared__ float4 ab_smem[];
    attn_bwd_dq((uint16_t *)ab_smem, a, 64, 2);
}

__global__ void __launch_bounds__(AB_THREADS) attention_bf16_dq128_kernel(ab_bwd_args a) {
    extern __shared__ float4 ab_smem[];
    attn_bwd_dq((uint16_t *)ab_smem, a, 128, 2);
}

/* any other head size, as the forward's */
__global__ void __launch_bounds__(AB_THREADS) attention_bf16_dkdv_any_kernel(ab_bwd_args a) {
    extern __shared__ float4 ab_smem[];
    attn_bwd_dkdv((uint16_t *)ab_smem, a, a.C / a.NH, 2, 1, AB_DQ_KERNEL);
}

__global__ void __launch_bounds__(AB_THREADS) attention_bf16_dq_any_kernel(ab_bwd_args a) {
    extern __shared__ float4 ab_smem[];
    attn_bwd_dq((uint16_t *)ab_smem, a, a.C / a.NH, 2);
}

/* any head size with one stage of streamed tiles: where the two-stage kernels need more
 * shared memory than the device gives a block (hs 120 and 128 on a 99 KiB sm_86 or
 * sm_89) */
__global__ void __launch_bounds__(AB_THREADS) attention_bf16_dkdv_lean_kernel(ab_bwd_args a) {
    extern __shared__ float4 ab_smem[];
    attn_bwd_dkdv((uint16_t *)ab_smem, a, a.C / a.NH, 1, 1, AB_DQ_KERNEL);
}

__global__ void __launch_bounds__(AB_THREADS) attention_bf16_dq_lean_kernel(ab_bwd_args a) {
    extern __shared__ float4 ab_smem[];
    attn_bwd_dq((uint16_t *)ab_smem, a, a.C / a.NH, 1);
}

/* Block (bh, y): query tile qt = NT-1-y of the fused dq (the most parts first). Its rows'
 * dq = scale times the sum of the parts the dk/dv blocks of key tiles 0 .. qt left in
 * a.dq_part, added in that order (the same sum whatever order the blocks ran in), rounded
 * once; with a.dq_atomic, scale times the one slot they added into (in the order they
 * ran). Out through shared memory as the dq kernel's (write_staged: the q columns' bias
 * sums too when a.dbias is set). */
__global__ void __launch_bounds__(AB_THREADS) attention_bf16_dq_sum_kernel(ab_bwd_args a) {
    extern __shared__ float4 ab_smem[];
    uint16_t *st = (uint16_t *)ab_smem; /* [64][ab_pitch(hs)] the rows' dq */
    int bh, rank;
    if (!attention_block(a.pairs, &bh, &rank)) return;
    int hs = a.C / a.NH, p = ab_pitch(hs), nt = gridDim.y, qt = nt - 1 - rank, q0 = qt * AB_TILE;
    int nrows = a.T - q0 < AB_TILE ? a.T - q0 : AB_TILE, nc = hs / 4;
    size_t slot = (size_t)AB_TILE * hs;
    const float *part = a.dq_part + dq_slot(bh, nt, qt, 0, a.dq_atomic) * slot;
    int nparts = a.dq_atomic ? 1 : qt + 1;
    for (int u = threadIdx.x; u < nrows * nc; u += AB_THREADS) {
        int r = u / nc, c = 4 * (u % nc);
        const float *x = part + (size_t)r * hs + c;
        float4 sum = *(const float4 *)x;
#pragma unroll 4 /* the loads are independent: several in flight */
        for (int kt = 1; kt < nparts; kt++) {
            float4 v = *(const float4 *)(x + kt * slot);
            sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
        }
        *(uint32_t *)(st + r * p + c) = bf16x2_bits(a.scale * sum.x, a.scale * sum.y);
        *(uint32_t *)(st + r * p + c + 2) = bf16x2_bits(a.scale * sum.z, a.scale * sum.w);
    }
    __syncthreads();
    size_t ld = 3 * (size_t)a.C;
    int b = bh / a.NH, h = bh % a.NH, out_vec = ((uintptr_t)a.dqkv & 15u) == 0;
    write_staged(a.dqkv + ((size_t)b * a.T + q0) * ld + (size_t)h * hs, ld, st, nrows, hs,
                 a.dbias ? a.dbias + (size_t)h * hs : NULL, out_vec);
}

/* ------------------------------------------------------------------ launchers */

/* the kernels above, as the launchers pick them */
typedef void (*ab_fwd_fn)(uint16_t *, float *, const uint16_t *, int, int, int, float, int, int);
typedef void (*ab_bwd_fn)(ab_bwd_args);

/* bytes of a [64][hs] tile */
static size_t ab_tile_bytes(int hs) { return (size_t)AB_TILE * ab_pitch(hs) * sizeof(uint16_t); }

/* mt query tiles and two stages of a key and a value tile (wide: of two each) */
static size_t ab_fwd_smem(int hs, int mt, int wide) {
    return (size_t)(mt + (wide ? 8 : 4)) * ab_tile_bytes(hs);
}

/* 1 when the environment variable name is set to value: the variants below are chosen
 * this way, so that a benchmark compares them in one build */
static int ab_env_is(const char *name, const char *value) {
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

/* The forward at hs 64, by the variants not yet on by default (a GPU run is to say which
 * is fastest; bench_gpt2 compares them): GPTC_ATTENTION_FWD=pipelined, attn_fwd_pipe;
 * GPTC_ATTENTION_FWD=wide, attn_fwd_wide (128 queries by 128 keys); else
 * GPTC_ATTENTION_FWD_ROWS=128, two m-tiles a warp (a block of 128 queries); else the
 * plain kernel. Any other head size: the plain kernel. */
typedef enum { AB_FWD_PLAIN, AB_FWD_ROWS128, AB_FWD_PIPE, AB_FWD_WIDE } ab_fwd_kind;
static ab_fwd_kind ab_fwd_variant(int hs) {
    if (hs != 64) return AB_FWD_PLAIN;
    if (ab_env_is("GPTC_ATTENTION_FWD", "pipelined")) return AB_FWD_PIPE;
    if (ab_env_is("GPTC_ATTENTION_FWD", "wide")) return AB_FWD_WIDE;
    if (ab_env_is("GPTC_ATTENTION_FWD_ROWS", "128")) return AB_FWD_ROWS128;
    return AB_FWD_PLAIN;
}

/* m-tiles a warp of the forward takes (a block's queries: 64 of them each) */
static int ab_fwd_mt(int hs) {
    ab_fwd_kind k = ab_fwd_variant(hs);
    return k == AB_FWD_ROWS128 || k == AB_FWD_WIDE ? 2 : 1;
}

/* the forward's shared memory at head size hs, for the variant that runs */
static size_t ab_fwd_smem_now(int hs) {
    return ab_fwd_smem(hs, ab_fwd_mt(hs), ab_fwd_variant(hs) == AB_FWD_WIDE);
}

/* 1 when the backward kernels add the qkv bias gradient while they hold dqkv
 * (GPTC_ATTENTION_BIAS=1), else 0: one pass of cuda_bias_backward over dqkv after them.
 * Off by default until a GPU run says whether the hs 64 dk/dv kernel's fused epilogue,
 * which spills more, costs less than the pass it saves; a benchmark compares both. */
static int ab_bias_fused(void) { return ab_env_is("GPTC_ATTENTION_BIAS", "1"); }

/* Where dq comes from (hs 64 with two stages only; every sm_80 and later has the shared
 * memory), instead of the dq kernel recomputing S, dP and dS (AB_DQ_KERNEL), so that a
 * tile pair takes 5 products instead of 7:
 *   - AB_DQ_PARTS (GPTC_ATTENTION_DQ=fused): the dk/dv kernel stores each pair's part and
 *     attention_bf16_dq_sum_kernel adds them in key order (deterministic), for a pass
 *     over the parts (fp32, about T / 128 times dq's size, written once and read once:
 *     at T 1024 about 17 times dq's bytes each way);
 *   - AB_DQ_ATOMIC (GPTC_ATTENTION_DQ=atomic): the dk/dv kernel adds each pair's part
 *     into one fp32 dq by atomics (8-byte reductions on sm_90, mostly in L2), which the
 *     same kernel then rounds: twice dq's fp32 bytes of traffic and a zeroing, but the
 *     sum's order is the order the blocks ran in, as flash attention 2's dq.
 * Off by default until a GPU run says which is fastest; the benchmarks compare all three. */
static ab_dq_kind ab_dq_mode(int hs, int nst) {
    if (hs != 64 || nst != 2) return AB_DQ_KERNEL;
    if (ab_env_is("GPTC_ATTENTION_DQ", "fused")) return AB_DQ_PARTS;
    if (ab_env_is("GPTC_ATTENTION_DQ", "atomic")) return AB_DQ_ATOMIC;
    return AB_DQ_KERNEL;
}

/* nst: stages of the streamed tiles; fuse_dq: with the dS^T tile of a fused dq (ab_dq_mode) */
static size_t ab_dkdv_smem(int hs, int nst, int fuse_dq) {
    return (2 + 2 * (size_t)nst) * ab_tile_bytes(hs) + 2 * (size_t)nst * AB_TILE * sizeof(float) +
           (fuse_dq ? (size_t)AB_TILE * AB_DS_PITCH * sizeof(uint16_t) : 0);
}

/* floats of the backward's scratch before the dq parts: D [B,NH,T], rounded up to 16 bytes */
static size_t ab_d_floats(int B, int T, int NH) { return ((size_t)B * NH * T + 3) & ~(size_t)3; }

/* floats of the fused dq's parts: a [64][hs] slot per (query tile, key tile <= it) pair,
 * or by atomics one per query tile */
static size_t ab_dq_part_floats(int B, int T, int NH, int hs, ab_dq_kind mode) {
    size_t nt = ((size_t)T + AB_TILE - 1) / AB_TILE;
    return (size_t)B * NH * (mode == AB_DQ_ATOMIC ? nt : nt * (nt + 1) / 2) * AB_TILE * hs;
}

static size_t ab_dq_smem(int hs, int nst) {
    return (2 + 2 * (size_t)nst) * ab_tile_bytes(hs) + 2 * AB_TILE * sizeof(float);
}

/* stages of the backward's streamed tiles at head size hs on a device that allows optin
 * bytes a block: 2 where they fit (dk/dv needs at least what dq does), else 1 (the lean
 * kernels) */
static int ab_bwd_stages(int hs, size_t optin) {
    return ab_dkdv_smem(hs, 2, 0) <= optin ? 2 : 1;
}

/* 1 when bf16 buffers a and b (either may be NULL) allow load_tile's 16-byte cp.async:
 * every tile row starts a multiple of 8 elements in (C and hs are multiples of 8), so
 * 16-byte aligned bases are enough */
static int ab_vec(const void *a, const void *b) {
    return ((uintptr_t)a & 15u) == 0 && ((uintptr_t)b & 15u) == 0;
}

/* 1 when a kernel exists for the head size: C = NH * hs, hs a multiple of 8 up to 128
 * (the 16-byte rows of ldmatrix and cp.async); otherwise the launch is refused
 * (cuda_refuse) */
static int ab_shape_ok(int C, int NH, cudaStream_t s) {
    if (NH > 0 && C > 0 && C % NH == 0 && C / NH % 8 == 0 && C / NH <= AB_MAX_HS) return 1;
    cuda_refuse(s, "no bf16 attention kernel for C = %d over %d heads (head sizes: multiples "
                "of 8 up to 128)", C, NH);
    return 0;
}

/* what[80] = "the bf16 attention forward at head size 64", as a refusal names a kernel */
static const char *ab_what(char *what, const char *role, int hs) {
    snprintf(what, 80, "the bf16 attention %s at head size %d", role, hs);
    return what;
}

/* The variant variables above and the values they take (the first, "", is unset) */
static const struct {
    const char *name, *values[4];
} ab_env_vars[] = {
    {"GPTC_ATTENTION_FWD", {"", "plain", "pipelined", "wide"}},
    {"GPTC_ATTENTION_FWD_ROWS", {"", "64", "128", NULL}},
    {"GPTC_ATTENTION_DQ", {"", "kernel", "fused", "atomic"}},
    {"GPTC_ATTENTION_BIAS", {"", "0", "1", NULL}},
};

extern "C" {

int cuda_attention_bf16_check_env(char *err, size_t errlen) {
    for (size_t i = 0; i < sizeof ab_env_vars / sizeof ab_env_vars[0]; i++) {
        const char *v = getenv(ab_env_vars[i].name);
        if (!v) continue;
        int known = 0;
        char choices[64] = "";
        for (int j = 0; j < 4 && ab_env_vars[i].values[j]; j++) {
            known |= strcmp(v, ab_env_vars[i].values[j]) == 0;
            if (j > 0)
                snprintf(choices + strlen(choices), sizeof choices - strlen(choices), "%s%s",
                         j > 1 ? ", " : "", ab_env_vars[i].values[j]);
        }
        if (!known) {
            snprintf(err, errlen, "%s = %s: give one of %s (or leave it unset)",
                     ab_env_vars[i].name, v, choices);
            return -1;
        }
    }
    return 0;
}

size_t cuda_attention_bf16_smem(int hs) {
    int nst = ab_bwd_stages(hs, (size_t)cuda_smem_optin());
    size_t need = ab_fwd_smem_now(hs);
    size_t kv = ab_dkdv_smem(hs, nst, ab_dq_mode(hs, nst) != AB_DQ_KERNEL);
    if (kv > need) need = kv;
    if (ab_dq_smem(hs, nst) > need) need = ab_dq_smem(hs, nst);
    return need;
}

const char *cuda_attention_bf16_fwd_name(int hs) {
    static const char *const names[] = {"plain", "rows128", "pipelined", "wide"};
    return names[ab_fwd_variant(hs)];
}

const char *cuda_attention_bf16_dq_name(int hs) {
    static const char *const names[] = {"kernel", "fused", "atomic"};
    return names[ab_dq_mode(hs, ab_bwd_stages(hs, (size_t)cuda_smem_optin()))];
}

int cuda_attention_bf16_bias_fused(void) { return ab_bias_fused(); }

void cuda_attention_forward_bf16(uint16_t *out, float *lse, const uint16_t *qkv, int B, int T,
                                 int C, int NH, cudaStream_t s) {
    if (!ab_shape_ok(C, NH, s)) return;
    if (B <= 0 || T <= 0) return;
    int hs = C / NH, vec = ab_vec(qkv, NULL);
    float sl2 = attention_sl2(hs);
    int mt = ab_fwd_mt(hs);
    size_t smem = ab_fwd_smem_now(hs);
    ab_fwd_kind kind = ab_fwd_variant(hs);
    ab_fwd_fn fwd = kind == AB_FWD_WIDE      ? attention_bf16_fwd64_wide_kernel
                    : kind == AB_FWD_ROWS128 ? attention_bf16_fwd64x2_kernel
                    : kind == AB_FWD_PIPE    ? attention_bf16_fwd64_pipe_kernel
                    : hs == 64               ? attention_bf16_fwd64_kernel
                    : hs == 128              ? attention_bf16_fwd128_kernel
                                             : attention_bf16_fwd_any_kernel;
    char what[80];
    if (!cuda_smem_ready((const void *)fwd, smem, ab_what(what, "forward", hs), s)) return;
    dim3 grid = attention_grid(B, NH, T, hs, mt * AB_TILE, sizeof(uint16_t));
    fwd<<<grid, AB_THREADS, smem, s>>>(out, lse, qkv, T, C, NH, sl2, vec, B * NH);
}

size_t cuda_attention_bf16_scratch_floats(int B, int T, int C, int NH) {
    size_t plain = (size_t)B * NH * T; /* D alone, as attention_state_floats */
    if (B <= 0 || T <= 0 || NH <= 0 || C % NH) return plain;
    int hs = C / NH, nst = ab_bwd_stages(hs, (size_t)cuda_smem_optin());
    ab_dq_kind mode = ab_dq_mode(hs, nst);
    if (mode == AB_DQ_KERNEL) return plain;
    return ab_d_floats(B, T, NH) + ab_dq_part_floats(B, T, NH, hs, mode);
}

void cuda_attention_backward_bf16(uint16_t *dqkv, float *dbias, float *scratch,
                                  const uint16_t *dout, const uint16_t *out, const uint16_t *qkv,
                                  const float *lse, int B, int T, int C, int NH,
                                  cudaStream_t s) {
    if (!ab_shape_ok(C, NH, s)) return;
    if (B <= 0 || T <= 0) return;
    int hs = C / NH, vec = ab_vec(qkv, dout);
    float scale = 1.0f / sqrtf((float)hs), sl2 = attention_sl2(hs);
    cuda_attention_dot(scratch, dout, out, B, T, C, NH, GPTC_BF16, s);
    int nst = ab_bwd_stages(hs, (size_t)cuda_smem_optin());
    ab_dq_kind mode = ab_dq_mode(hs, nst);
    int fuse_dq = mode != AB_DQ_KERNEL;
    size_t smem_kv = ab_dkdv_smem(hs, nst, fuse_dq);
    size_t smem_q = fuse_dq ? ab_tile_bytes(hs) : ab_dq_smem(hs, nst);
    int fused = dbias && ab_bias_fused();
    ab_bwd_fn dkdv = hs == 64    ? (fused ? attention_bf16_dkdv64_bias_kernel
                                          : attention_bf16_dkdv64_kernel)
                     : hs == 128 ? attention_bf16_dkdv128_kernel
                                 : attention_bf16_dkdv_any_kernel;
    ab_bwd_fn dq = hs == 64    ? attention_bf16_dq64_kernel
                   : hs == 128 ? attention_bf16_dq128_kernel
                               : attention_bf16_dq_any_kernel;
    if (nst == 1) dkdv = attention_bf16_dkdv_lean_kernel, dq = attention_bf16_dq_lean_kernel;
    if (mode == AB_DQ_PARTS)
        dkdv = fused ? attention_bf16_dkdv64_dq_bias_kernel : attention_bf16_dkdv64_dq_kernel;
    if (mode == AB_DQ_ATOMIC)
        dkdv = fused ? attention_bf16_dkdv64_dqa_bias_kernel : attention_bf16_dkdv64_dqa_kernel;
    if (fuse_dq) dq = attention_bf16_dq_sum_kernel;
    char what[80];
    ab_what(what, "backward", hs);
    /* dk/dv needs at least as much as dq, so a refusal names its need */
    if (!cuda_smem_ready((const void *)dkdv, smem_kv, what, s) ||
        !cuda_smem_ready((const void *)dq, smem_q, what, s))
        return;
    dim3 grid = attention_grid(B, NH, T, hs, AB_TILE, sizeof(uint16_t));
    /* the fused dq's parts follow D in the scratch (cuda_attention_bf16_scratch_floats) */
    float *part = fuse_dq ? scratch + ab_d_floats(B, T, NH) : NULL;
    if (mode == AB_DQ_ATOMIC) {
        size_t bytes = ab_dq_part_floats(B, T, NH, hs, mode) * sizeof(float);
        cudaError_t rc = cudaMemsetAsync(part, 0, bytes, s);
        if (rc != cudaSuccess) {
            cuda_refuse(s, "zeroing the bf16 attention's dq (%zu bytes): %s", bytes,
                        cudaGetErrorString(rc));
            return;
        }
    }
    ab_bwd_args a = {dqkv, fused ? dbias : NULL, dout, qkv, lse, scratch, T, C, NH, vec, sl2,
                     scale, B * NH, part, mode == AB_DQ_ATOMIC};
    dkdv<<<grid, AB_THREADS, smem_kv, s>>>(a);
    dq<<<grid, AB_THREADS, smem_q, s>>>(a);
    if (dbias && !fused) cuda_bias_backward(dbias, dqkv, B * T, 3 * C, GPTC_BF16, s);
}

} /* extern "C" */
