/* Causal self-attention for train.precision = bf16, on tensor cores: the flash scheme of
 * attention.cu (same buffers, same lse [B,NH,T], same scratch, same three backward
 * kernels and the same determinism: no atomics, every element of dqkv written once), with
 * the tile products as mma.sync m16n8k16 bf16 (fp32 accumulate, engine/cuda/mma.cuh).
 * qkv, out, dout and dqkv are bf16 storage (uint16_t bits, engine/bf16.h), read as they
 * are (their tiles enter shared memory as bf16 pairs, no conversion); lse and the
 * scratch D are fp32. Besides the stores of out and dqkv (each rounded once, from fp32
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
 * through shared memory in tiles of 64. A warp's 16 x 64 score block is 8 n-tiles of
 * mma accumulators, which (mma.cuh) are also the A fragments of the next product, so P and
 * dS never go through shared memory. Operand tiles are bf16 pairs in 32-bit words, in
 * two layouts: row-major [64][hs] (pitch AB_RP words) where the product's reduction runs
 * along hs, and transposed [hs][64] (pitch AB_TP) where it runs along the 64 rows; both
 * pitches are 4 words past a multiple of 32, so the 32 lanes of a fragment load (word t
 * of row g, g < 8, t < 4) hit 32 different banks. Tiles past T are zero-filled and
 * masked. The kernel body takes the head size as an argument and is inlined into one
 * kernel per supported head size (64 and 128), so its loops and register arrays are
 * sized at compile time. */
#include "engine/cuda/cuda_common.cuh"
#include "engine/cuda/mma.cuh"

#define AB_TILE 64              /* rows of a block, and rows of a streamed tile */
#define AB_THREADS 128          /* 4 warps x 16 rows */
#define AB_MAX_HS 128
#define AB_TP (AB_TILE / 2 + 4) /* words per row of a transposed [hs][64] tile */
#define AB_LOG2E 1.4426950408889634f
#define AB_LN2 0.6931471805599453f

/* words per row of a row-major [64][hs] tile */
static __host__ __device__ __forceinline__ int ab_rp(int hs) { return hs / 2 + 4; }

/* ------------------------------------------------------------------ tiles */

/* x[0..3] = p[0..3], bf16 bits (two 4-byte loads when vec: p is then 8-byte aligned) */
static __device__ __forceinline__ void load4(uint32_t x[4], const uint16_t *p, int vec) {
    if (vec) {
        uint32_t lo = __ldg((const unsigned int *)p), hi = __ldg((const unsigned int *)p + 1);
        x[0] = lo & 0xffffu, x[1] = lo >> 16, x[2] = hi & 0xffffu, x[3] = hi >> 16;
    } else {
        for (int i = 0; i < 4; i++) x[i] = __ldg(p + i);
    }
}

/* Rows r < nrows of src (a [64][hs] view of bf16, row pitch ld elements), rows
 * nrows..63 zero: into rows[r][d / 2] (row-major) and/or cols[d][r / 2] (transposed),
 * either may be NULL. A thread takes 2 rows x 4 columns at a time, the 4-column groups
 * of a row on consecutive lanes, so the global reads coalesce. */
static __device__ __forceinline__ void load_tile(uint32_t *rows /* [64][ab_rp(hs)] */,
                                                 uint32_t *cols /* [hs][AB_TP] */,
                                                 const uint16_t *src, size_t ld, int nrows,
                                                 int hs, int vec) {
    int nq = hs / 4, rp = ab_rp(hs);
    for (int u = threadIdx.x; u < AB_TILE / 2 * nq; u += AB_THREADS) {
        int pr = u / nq, q = u % nq, r = 2 * pr;
        uint32_t x0[4] = {0, 0, 0, 0}, x1[4] = {0, 0, 0, 0};
        if (r < nrows) load4(x0, src + (size_t)r * ld + 4 * q, vec);
        if (r + 1 < nrows) load4(x1, src + (size_t)(r + 1) * ld + 4 * q, vec);
        if (rows) {
            rows[r * rp + 2 * q] = x0[0] | x0[1] << 16;
            rows[r * rp + 2 * q + 1] = x0[2] | x0[3] << 16;
            rows[(r + 1) * rp + 2 * q] = x1[0] | x1[1] << 16;
            rows[(r + 1) * rp + 2 * q + 1] = x1[2] | x1[3] << 16;
        }
        if (cols)
            for (int i = 0; i < 4; i++) cols[(4 * q + i) * AB_TP + pr] = x0[i] | x1[i] << 16;
    }
}

/* dst[r] = mul * src[r] for r < nrows, 0 up to 64 */
static __device__ __forceinline__ void load_row_vec(float *dst /* [64] */,
                                                    const float *src /* [nrows] */,
                                                    int nrows, float mul) {
    if (threadIdx.x < AB_TILE)
        dst[threadIdx.x] = (int)threadIdx.x < nrows ? mul * __ldg(src + threadIdx.x) : 0.0f;
}

/* ------------------------------------------------------------------ fragments */

/* A fragment of k-step ks (columns 16 ks .. 16 ks + 15) of a row-major 16-row block
 * (mma.cuh: a[0] = A[g][2t, 2t+1], a[1] = A[g+8][..], a[2], a[3] 8 columns on) */
static __device__ __forceinline__ void frag_a(uint32_t a[4], const uint32_t *R /* [16][rp] */,
                                              int rp, int ks) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, w = 8 * ks + t;
    a[0] = R[g * rp + w];
    a[1] = R[(g + 8) * rp + w];
    a[2] = R[g * rp + w + 4];
    a[3] = R[(g + 8) * rp + w + 4];
}

/* B fragment of k-step ks, n-tile n0 .. n0 + 7, from a tile that holds B's columns as
 * rows (row n = B[.][n]: a row-major K tile for Q K^T, a transposed V tile for P V)
 * (mma.cuh: b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g]) */
static __device__ __forceinline__ void frag_b(uint32_t b[2], const uint32_t *R /* [n][rp] */,
                                              int rp, int n0, int ks) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint32_t *row = R + (n0 + g) * rp + 8 * ks + t;
    b[0] = row[0];
    b[1] = row[4];
}

/* acc[j] = A (16 x hs, row-major block) times the transpose of B rows n = 8j + (0..7)
 * (a [64][hs] row-major tile): a warp's 16 x 64 block of scores Q K^T (or dO V^T ...) */
static __device__ __forceinline__ void tile_scores(float acc[8][4], const uint32_t *A,
                                                   const uint32_t *B, int hs) {
    int rp = ab_rp(hs);
#pragma unroll
    for (int j = 0; j < 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < hs / 16; ks++) {
        uint32_t a[4];
        frag_a(a, A, rp, ks);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t b[2];
            frag_b(b, B, rp, 8 * j, ks);
            mma_bf16_16816(acc[j], a, b);
        }
    }
}

/* acc[jd] += S (16 x 64, this warp's accumulators s) times V (64 x hs, given as the
 * transposed tile Vt [hs][64]); S is rounded to bf16 here, the one rounding of P or dS */
static __device__ __forceinline__ void tile_sv(float acc[AB_MAX_HS / 8][4], const float s[8][4],
                                               const uint32_t *Vt /* [hs][AB_TP] */, int hs) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        uint32_t a[4] = {pack_bf16x2(s[2 * kk][0], s[2 * kk][1]),
                         pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                         pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                         pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int jd = 0; jd < hs / 8; jd++) {
            uint32_t b[2];
            frag_b(b, Vt, AB_TP, 8 * jd, kk);
            mma_bf16_16816(acc[jd], a, b);
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
    for (int j = 0; j < hs / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
}

/* dst[row][8j + 2t + (0, 1)] = mul * acc[j], rounded to bf16, for this lane's two rows
 * (g, g + 8) of a warp's 16 x hs block whose row g starts at row0 (NULL: the row is past
 * T) */
static __device__ __forceinline__ void store_acc(uint16_t *row0, uint16_t *row8,
                                                 const float acc[AB_MAX_HS / 8][4], float mul0,
                                                 float mul8, int hs) {
    int t = threadIdx.x & 3;
#pragma unroll
    for (int j = 0; j < hs / 8; j++) {
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

/* ------------------------------------------------------------------ forward */

/* Block (bh, y): batch b = bh / NH, head h = bh % NH, query tile NT-1-y (the longest
 * rows first); warp w owns queries q0 + 16 w .. + 15, whose Q fragments it keeps in
 * registers. Per key tile up to the diagonal: S = Q K^T in the log2 domain (sl2 =
 * log2(e) / sqrt(hs)), causal mask, online softmax per row (this lane's rows g and g + 8;
 * the row's 64 scores are spread over the quad), O = alpha O + P V. Then out = O / l and
 * lse = ln 2 * m + ln l. Barriers guard the reload of K, V (after the last tile's
 * readers) and the loaded tiles (before the products). */
static __device__ __forceinline__ void attn_fwd(uint32_t *sm, uint16_t *out, float *lse,
                                                const uint16_t *qkv, int T, int C, int NH,
                                                float sl2, int vec, int hs) {
    int rp = ab_rp(hs);
    uint32_t *Qs = sm;                /* [64][rp] this block's queries */
    uint32_t *Ks = Qs + AB_TILE * rp; /* [64][rp] current key tile */
    uint32_t *Vt = Ks + AB_TILE * rp; /* [hs][AB_TP] current value tile, transposed */

    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    int qt = gridDim.y - 1 - blockIdx.y, q0 = qt * AB_TILE;
    size_t ld = 3 * (size_t)C;
    const uint16_t *base = qkv + (size_t)b * T * ld + (size_t)h * hs; /* q of row 0 */
    int tq[2] = {q0 + 16 * warp + g, q0 + 16 * warp + g + 8}; /* this lane's queries */

    load_tile(Qs, NULL, base + (size_t)q0 * ld, ld, T - q0, hs, vec);
    __syncthreads(); /* Qs loaded */
    uint32_t qf[AB_MAX_HS / 16][4];
#pragma unroll
    for (int ks = 0; ks < hs / 16; ks++) frag_a(qf[ks], Qs + 16 * warp * rp, rp, ks);

    float o[AB_MAX_HS / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    zero_acc(o, hs);
    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * AB_TILE;
        __syncthreads(); /* the previous tile's readers of Ks, Vt are done */
        load_tile(Ks, NULL, base + C + (size_t)k0 * ld, ld, T - k0, hs, vec);
        load_tile(NULL, Vt, base + 2 * (size_t)C + (size_t)k0 * ld, ld, T - k0, hs, vec);
        __syncthreads(); /* Ks, Vt loaded */

        float s[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < hs / 16; ks++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                uint32_t bf[2];
                frag_b(bf, Ks, rp, 8 * j, ks);
                mma_bf16_16816(s[j], qf[ks], bf);
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    int u = k0 + 8 * j + 2 * t + i;
                    float v = u <= tq[r] && u < T ? s[j][2 * r + i] * sl2 : -INFINITY;
                    s[j][2 * r + i] = v;
                    mx = fmaxf(mx, v);
                }
            float mn = fmaxf(m[r], quad_max(mx));
            float ref = mn == -INFINITY ? 0.0f : mn; /* no key yet: all terms stay 0 */
            float alpha = exp2f(m[r] - ref), ls = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    float p = exp2f(s[j][2 * r + i] - ref);
                    s[j][2 * r + i] = p;
                    ls += p;
                }
            l[r] = l[r] * alpha + quad_sum(ls);
            m[r] = mn;
#pragma unroll
            for (int jd = 0; jd < hs / 8; jd++) o[jd][2 * r] *= alpha, o[jd][2 * r + 1] *= alpha;
        }
        tile_sv(o, s, Vt, hs);
    }

    uint16_t *orow[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        orow[r] = tq[r] < T ? out + ((size_t)b * T + tq[r]) * C + (size_t)h * hs : NULL;
        if (tq[r] < T && t == 0) lse[(size_t)bh * T + tq[r]] = m[r] * AB_LN2 + logf(l[r]);
    }
    store_acc(orow[0], orow[1], o, 1.0f / l[0], 1.0f / l[1], hs);
}

__global__ void __launch_bounds__(AB_THREADS)
attention_bf16_fwd64_kernel(uint16_t *out /* [B,T,C] */, float *lse /* [B,NH,T] */,
                            const uint16_t *qkv /* [B,T,3C] */, int T, int C, int NH,
                            float sl2, int vec) {
    extern __shared__ float4 ab_smem[];
    attn_fwd((uint32_t *)ab_smem, out, lse, qkv, T, C, NH, sl2, vec, 64);
}

__global__ void __launch_bounds__(AB_THREADS)
attention_bf16_fwd128_kernel(uint16_t *out /* [B,T,C] */, float *lse /* [B,NH,T] */,
                             const uint16_t *qkv /* [B,T,3C] */, int T, int C, int NH,
                             float sl2, int vec) {
    extern __shared__ float4 ab_smem[];
    attn_fwd((uint32_t *)ab_smem, out, lse, qkv, T, C, NH, sl2, vec, 128);
}

/* ------------------------------------------------------------------ backward */

/* P = exp2(s - lse2) where key u <= query tq < T, else 0, and dS = P (dp - D), in place
 * in s and dp: one accumulator element, its query's log2-domain lse and D given */
static __device__ __forceinline__ void prob_and_ds(float *s, float *dp, int u, int tq, int T,
                                                   float sl2, float lse2, float D) {
    float p = u <= tq && tq < T ? exp2f(*s * sl2 - lse2) : 0.0f;
    *s = p;
    *dp = p * (*dp - D);
}

/* Block (bh, y): key tile y (the longest loops first); warp w owns keys k0 + 16 w .. + 15.
 * K, V of the tile stay in shared memory; for each query tile at or after it, in the
 * transposed view (rows: this warp's keys, columns: the tile's 64 queries):
 * S^T = K Q^T and dP^T = V dO^T, P^T and dS^T from lse and D, then dV += P^T dO and
 * dK += dS^T Q with P^T and dS^T straight from the accumulators. Q and dO enter in both
 * layouts: row-major as the B operand of the scores, transposed as that of dV and dK.
 * Writes dk = dK / sqrt(hs) and dv for its keys < T. */
static __device__ __forceinline__ void attn_bwd_dkdv(uint32_t *sm, uint16_t *dqkv,
                                                     const uint16_t *dout,
                                                     const uint16_t *qkv, const float *lse,
                                                     const float *D, int T, int C, int NH,
                                                     float sl2, float scale, int vec, int hs) {
    int rp = ab_rp(hs);
    uint32_t *Ks = sm;                    /* [64][rp] this block's keys */
    uint32_t *Vs = Ks + AB_TILE * rp;     /* [64][rp] this block's values */
    uint32_t *Qs = Vs + AB_TILE * rp;     /* [64][rp] current query tile */
    uint32_t *dOs = Qs + AB_TILE * rp;    /* [64][rp] its output gradient */
    uint32_t *Qt = dOs + AB_TILE * rp;    /* [hs][AB_TP] current query tile, transposed */
    uint32_t *dOt = Qt + hs * AB_TP;      /* [hs][AB_TP] its output gradient, transposed */
    float *lse_s = (float *)(dOt + hs * AB_TP); /* [64] log2(e) lse of the current queries */
    float *D_s = lse_s + AB_TILE;               /* [64] D of the current queries */

    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    int ktile = blockIdx.y, k0 = ktile * AB_TILE, ntiles = gridDim.y;
    size_t ld = 3 * (size_t)C;
    const uint16_t *base = qkv + (size_t)b * T * ld + (size_t)h * hs;   /* q of row 0 */
    const uint16_t *dbase = dout + (size_t)b * T * C + (size_t)h * hs; /* dout of row 0 */
    int u[2] = {k0 + 16 * warp + g, k0 + 16 * warp + g + 8}; /* this lane's keys */

    load_tile(Ks, NULL, base + C + (size_t)k0 * ld, ld, T - k0, hs, vec);
    load_tile(Vs, NULL, base + 2 * (size_t)C + (size_t)k0 * ld, ld, T - k0, hs, vec);

    float dk[AB_MAX_HS / 8][4], dv[AB_MAX_HS / 8][4];
    zero_acc(dk, hs);
    zero_acc(dv, hs);
    for (int qt = ktile; qt < ntiles; qt++) {
        int q0 = qt * AB_TILE;
        __syncthreads(); /* the previous tile's readers of Qs, dOs, Qt, dOt, lse_s, D_s done */
        load_tile(Qs, Qt, base + (size_t)q0 * ld, ld, T - q0, hs, vec);
        load_tile(dOs, dOt, dbase + (size_t)q0 * C, (size_t)C, T - q0, hs, vec);
        load_row_vec(lse_s, lse + (size_t)bh * T + q0, T - q0, AB_LOG2E);
        load_row_vec(D_s, D + (size_t)bh * T + q0, T - q0, 1.0f);
        __syncthreads(); /* Ks, Vs (first pass), the query tile loaded */

        float s[8][4], dp[8][4];
        tile_scores(s, Ks + 16 * warp * rp, Qs, hs);   /* k_u . q_t */
        tile_scores(dp, Vs + 16 * warp * rp, dOs, hs); /* v_u . dout_t */
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int c = 8 * j + 2 * t + (i & 1); /* query q0 + c */
                prob_and_ds(&s[j][i], &dp[j][i], u[i >> 1], q0 + c, T, sl2, lse_s[c], D_s[c]);
            }
        tile_sv(dv, s, dOt, hs);
        tile_sv(dk, dp, Qt, hs);
    }

    uint16_t *krow[2], *vrow[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        krow[r] = u[r] < T ? dqkv + ((size_t)b * T + u[r]) * ld + C + (size_t)h * hs : NULL;
        vrow[r] = u[r] < T ? krow[r] + C : NULL;
    }
    store_acc(krow[0], krow[1], dk, scale, scale, hs);
    store_acc(vrow[0], vrow[1], dv, 1.0f, 1.0f, hs);
}

/* Block (bh, y): query tile NT-1-y (the longest loops first); warp w owns queries
 * q0 + 16 w .. + 15. Q, dO, lse, D of the tile stay in shared memory; for each key tile
 * up to the diagonal: S = Q K^T, dP = dO V^T, P and dS as in the dk/dv kernel, then
 * dQ += dS K (K also transposed, as the B operand). Writes dq = dQ / sqrt(hs) for its
 * queries < T. */
static __device__ __forceinline__ void attn_bwd_dq(uint32_t *sm, uint16_t *dqkv,
                                                   const uint16_t *dout, const uint16_t *qkv,
                                                   const float *lse, const float *D, int T,
                                                   int C, int NH, float sl2, float scale,
                                                   int vec, int hs) {
    int rp = ab_rp(hs);
    uint32_t *Qs = sm;                    /* [64][rp] this block's queries */
    uint32_t *dOs = Qs + AB_TILE * rp;    /* [64][rp] their output gradient */
    uint32_t *Ks = dOs + AB_TILE * rp;    /* [64][rp] current key tile */
    uint32_t *Vs = Ks + AB_TILE * rp;     /* [64][rp] current value tile */
    uint32_t *Kt = Vs + AB_TILE * rp;     /* [hs][AB_TP] current key tile, transposed */
    float *lse_s = (float *)(Kt + hs * AB_TP); /* [64] log2(e) lse of this block's queries */
    float *D_s = lse_s + AB_TILE;              /* [64] D of this block's queries */

    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    int qt = gridDim.y - 1 - blockIdx.y, q0 = qt * AB_TILE;
    size_t ld = 3 * (size_t)C;
    const uint16_t *base = qkv + (size_t)b * T * ld + (size_t)h * hs;
    const uint16_t *dbase = dout + (size_t)b * T * C + (size_t)h * hs;
    int r0 = 16 * warp + g, tq[2] = {q0 + r0, q0 + r0 + 8}; /* this lane's queries */

    load_tile(Qs, NULL, base + (size_t)q0 * ld, ld, T - q0, hs, vec);
    load_tile(dOs, NULL, dbase + (size_t)q0 * C, (size_t)C, T - q0, hs, vec);
    load_row_vec(lse_s, lse + (size_t)bh * T + q0, T - q0, AB_LOG2E);
    load_row_vec(D_s, D + (size_t)bh * T + q0, T - q0, 1.0f);

    float dq[AB_MAX_HS / 8][4];
    zero_acc(dq, hs);
    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * AB_TILE;
        __syncthreads(); /* the previous tile's readers of Ks, Vs, Kt are done */
        load_tile(Ks, Kt, base + C + (size_t)k0 * ld, ld, T - k0, hs, vec);
        load_tile(Vs, NULL, base + 2 * (size_t)C + (size_t)k0 * ld, ld, T - k0, hs, vec);
        __syncthreads(); /* Qs, dOs, lse_s, D_s (first pass), the key tile loaded */

        float s[8][4], dp[8][4];
        tile_scores(s, Qs + 16 * warp * rp, Ks, hs);   /* q_t . k_u */
        tile_scores(dp, dOs + 16 * warp * rp, Vs, hs); /* dout_t . v_u */
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int r = r0 + 8 * (i >> 1); /* query q0 + r */
                prob_and_ds(&s[j][i], &dp[j][i], k0 + 8 * j + 2 * t + (i & 1), q0 + r, T, sl2,
                            lse_s[r], D_s[r]);
            }
        tile_sv(dq, dp, Kt, hs);
    }

    uint16_t *qrow[2];
#pragma unroll
    for (int r = 0; r < 2; r++)
        qrow[r] = tq[r] < T ? dqkv + ((size_t)b * T + tq[r]) * ld + (size_t)h * hs : NULL;
    store_acc(qrow[0], qrow[1], dq, scale, scale, hs);
}

#define AB_BWD_ARGS                                                                        \
    uint16_t *dqkv /* [B,T,3C] */, const uint16_t *dout /* [B,T,C] */,                    \
        const uint16_t *qkv /* [B,T,3C] */, const float *lse /* [B,NH,T] */,              \
        const float *D /* [B,NH,T] */, int T, int C, int NH, float sl2, float scale, int vec

__global__ void __launch_bounds__(AB_THREADS) attention_bf16_dkdv64_kernel(AB_BWD_ARGS) {
    extern __shared__ float4 ab_smem[];
    attn_bwd_dkdv((uint32_t *)ab_smem, dqkv, dout, qkv, lse, D, T, C, NH, sl2, scale, vec, 64);
}

__global__ void __launch_bounds__(AB_THREADS) attention_bf16_dkdv128_kernel(AB_BWD_ARGS) {
    extern __shared__ float4 ab_smem[];
    attn_bwd_dkdv((uint32_t *)ab_smem, dqkv, dout, qkv, lse, D, T, C, NH, sl2, scale, vec,
                  128);
}

__global__ void __launch_bounds__(AB_THREADS) attention_bf16_dq64_kernel(AB_BWD_ARGS) {
    extern __shared__ float4 ab_smem[];
    attn_bwd_dq((uint32_t *)ab_smem, dqkv, dout, qkv, lse, D, T, C, NH, sl2, scale, vec, 64);
}

__global__ void __launch_bounds__(AB_THREADS) attention_bf16_dq128_kernel(AB_BWD_ARGS) {
    extern __shared__ float4 ab_smem[];
    attn_bwd_dq((uint32_t *)ab_smem, dqkv, dout, qkv, lse, D, T, C, NH, sl2, scale, vec, 128);
}

/* Never runs: launched with an empty grid to report an unsupported shape through
 * cuda_check_launch (cudaErrorInvalidConfiguration), as attention.cu does. */
__global__ void attention_bf16_unsupported_kernel(void) {}

/* ------------------------------------------------------------------ launchers */

static size_t ab_fwd_smem(int hs) {
    return (2 * (size_t)AB_TILE * ab_rp(hs) + (size_t)hs * AB_TP) * sizeof(uint32_t);
}

static size_t ab_dkdv_smem(int hs) {
    return (4 * (size_t)AB_TILE * ab_rp(hs) + 2 * (size_t)hs * AB_TP + 2 * AB_TILE) *
           sizeof(uint32_t);
}

static size_t ab_dq_smem(int hs) {
    return (4 * (size_t)AB_TILE * ab_rp(hs) + (size_t)hs * AB_TP + 2 * AB_TILE) *
           sizeof(uint32_t);
}

/* 1 when bf16 buffers a and b (either may be NULL) allow the 4-byte loads of load4: every
 * tile row starts a multiple of 4 elements in (C and hs are multiples of 64), so 8-byte
 * aligned bases are enough */
static int ab_vec(const void *a, const void *b) {
    return ((uintptr_t)a & 7u) == 0 && ((uintptr_t)b & 7u) == 0;
}

/* 1 when a kernel exists for the head size: C = NH * hs, hs 64 or 128 */
static int ab_shape_ok(int C, int NH) {
    return NH > 0 && C > 0 && C % NH == 0 && (C / NH == 64 || C / NH == 128);
}

extern "C" {

void cuda_attention_forward_bf16(uint16_t *out, float *lse, const uint16_t *qkv, int B, int T,
                                 int C, int NH, cudaStream_t s) {
    if (!ab_shape_ok(C, NH)) {
        attention_bf16_unsupported_kernel<<<0, 1, 0, s>>>();
        return;
    }
    if (B <= 0 || T <= 0) return;
    int hs = C / NH, vec = ab_vec(qkv, NULL);
    float sl2 = AB_LOG2E / sqrtf((float)hs);
    size_t smem = ab_fwd_smem(hs);
    dim3 grid((unsigned int)((long)B * NH), (unsigned int)((T + AB_TILE - 1) / AB_TILE));
    if (hs == 64) {
        (void)cudaFuncSetAttribute(attention_bf16_fwd64_kernel,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        attention_bf16_fwd64_kernel<<<grid, AB_THREADS, smem, s>>>(out, lse, qkv, T, C, NH,
                                                                   sl2, vec);
    } else {
        (void)cudaFuncSetAttribute(attention_bf16_fwd128_kernel,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        attention_bf16_fwd128_kernel<<<grid, AB_THREADS, smem, s>>>(out, lse, qkv, T, C, NH,
                                                                    sl2, vec);
    }
}

void cuda_attention_backward_bf16(uint16_t *dqkv, float *scratch, const uint16_t *dout,
                                  const uint16_t *out, const uint16_t *qkv, const float *lse,
                                  int B, int T, int C, int NH, cudaStream_t s) {
    if (!ab_shape_ok(C, NH)) {
        attention_bf16_unsupported_kernel<<<0, 1, 0, s>>>();
        return;
    }
    if (B <= 0 || T <= 0) return;
    int hs = C / NH, vec = ab_vec(qkv, dout);
    float scale = 1.0f / sqrtf((float)hs), sl2 = AB_LOG2E * scale;
    cuda_attention_dot(scratch, dout, out, B, T, C, NH, GPTC_BF16, s);
    size_t smem_kv = ab_dkdv_smem(hs), smem_q = ab_dq_smem(hs);
    dim3 grid((unsigned int)((long)B * NH), (unsigned int)((T + AB_TILE - 1) / AB_TILE));
    if (hs == 64) {
        (void)cudaFuncSetAttribute(attention_bf16_dkdv64_kernel,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_kv);
        (void)cudaFuncSetAttribute(attention_bf16_dq64_kernel,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q);
        attention_bf16_dkdv64_kernel<<<grid, AB_THREADS, smem_kv, s>>>(
            dqkv, dout, qkv, lse, scratch, T, C, NH, sl2, scale, vec);
        attention_bf16_dq64_kernel<<<grid, AB_THREADS, smem_q, s>>>(
            dqkv, dout, qkv, lse, scratch, T, C, NH, sl2, scale, vec);
    } else {
        (void)cudaFuncSetAttribute(attention_bf16_dkdv128_kernel,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_kv);
        (void)cudaFuncSetAttribute(attention_bf16_dq128_kernel,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q);
        attention_bf16_dkdv128_kernel<<<grid, AB_THREADS, smem_kv, s>>>(
            dqkv, dout, qkv, lse, scratch, T, C, NH, sl2, scale, vec);
        attention_bf16_dq128_kernel<<<grid, AB_THREADS, smem_q, s>>>(
            dqkv, dout, qkv, lse, scratch, T, C, NH, sl2, scale, vec);
    }
}

} /* extern "C" */
