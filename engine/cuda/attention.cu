/* Causal self-attention, flash style (FlashAttention-2 scheme, fp32 on CUDA cores): the
 * T x T score matrix never reaches memory. The forward keeps one (batch, head, query
 * tile) per block and streams the key/value tiles through shared memory with an online
 * softmax; it saves lse = log2(sum_u exp2(sl2 q.k_u)) per query row, sl2 = log2(e) scale:
 * the base-2 log-sum-exp the kernels compute in, with no rounding into a natural log and
 * back. The backward recomputes the probabilities from lse.
 *
 * Backward scheme (chosen for determinism and simplicity, no atomics, no zeroing pass):
 *   1. attention_bwd_dot_kernel:  D[b,h,t] = dout[t] . out[t] over the head (scratch).
 *   2. attention_bwd_dkdv kernels: one block per (b, h, key tile) keeps dk, dv of its 64
 *      keys in registers and loops over the query tiles at or after it, recomputing
 *      P = exp2(sl2 q.k - lse) and dS = P * (dout.v - D). Writes dk, dv.
 *   3. attention_bwd_dq kernels:   one block per (b, h, query tile) loops over the key
 *      tiles at or before it, recomputes P and dS the same way and writes dq.
 * Kernels 2 and 3 each own a disjoint part of dqkv (k|v and q) and write every element
 * of it for t < T, so dqkv needs no clearing; the price is computing S and dP twice
 * (7 tile products per tile pair instead of 5 with an atomicAdd dq).
 *
 * Tiling (the layout of attention_bf16.cuh, on CUDA cores): a block is 4 warps (128
 * threads) and 64 rows of its own (queries in the forward and in dq, keys in dk/dv),
 * 16 per warp; the other side streams through shared memory in tiles of 64 rows. Every
 * tile is stored once, row-major as in global memory: [64][p], p = hsmax + 4 (68 for
 * hs <= 64, 132 for hs <= 128), so rows are 16-byte aligned and p / 4 is odd: 8
 * consecutive rows read at one column fall in 8 different 16-byte bank groups. A lane
 * owns 4 rows of its warp's 16, row(i) = 2 rg + (i & 1) + 8 (i >> 1), and a column group
 * kg (lane_rg, lane_kg: 4 x 8 lanes). Two products, each a warp's 16 rows against the 64
 * rows of a tile, make all seven tile products of the scheme:
 *   scores  s[i][j] = sum_d A[row(i)][d] B[kg + 8j][d]  (Q K^T, dO V^T, K Q^T, V dO^T):
 *           4 x 8 per lane; per 4 d: 4 LDS.128 of A, 8 of B, 128 FMA
 *   outputs o[i][4 kg + 32 h + e] += sum_u S[row(i)][u] V[u][..]  (P V, dS K, P^T dO,
 *           dS^T Q; S a [64][68] score tile): 4 rows x nc float4 per lane (nc = hsmax / 32);
 *           per 4 u: 4 LDS.128 of S, 4 nc of V, 64 nc FMA
 * The scores reach the output product through shared memory (scalar stores: rows 2 rg
 * apart are 8 banks apart at pitch 68, so each store covers 32 banks); a warp reads back
 * only its own rows, and P^T (dk/dv) only this lane's own slots.
 *
 * Cost model (per SM per cycle): 4 FMA warp-instructions (128 lanes); shared memory
 * returns 128 bytes, one register to each lane of a warp, so an LDS.128 takes 4 cycles,
 * or 2 when lanes n and n ^ 1 (or n ^ 2) load the same address (the LDS.U pairing of
 * Volta and later, if ptxas proves it: the lane bits are laid out for it, lane_rg), and
 * more with bank conflicts; stores 128 bytes. Per 64 x 64 tile pair at hs 64, per block,
 * FMA cycles (F) against shared-memory cycles (M, with pairing [without]):
 *   old (8 warps of 4 x 4 on [hs][68] transposed tiles; per d 2 LDS.128 per 16 FMA, the
 *     operand shared by a half warp paired; K, V or Q, dO stored transposed by scalar
 *     stores with 4-way conflicts, 1024 cycles a tile, and loaded synchronously):
 *     score product 3072 [4096], output product 3072 [4096], against 2048 F each;
 *     forward  M 8320 [10368] / F 4096: FMA <= 49% [40%] of peak
 *     dk/dv    M 14720 [18816] / F 8192: <= 56% [44%];  dq 11392 [14464] / 6144: <= 54% [42%]
 *   new (4 warps of 4 x 8; per 4 d 12 LDS.128 per 128 FMA, all paired; tiles by 16-byte
 *     cp.async, 128 cycles a tile; score stores 128, P^T read-back 128):
 *     score product 1536 [3072], output product 1536 [3072], against 2048 F each;
 *     forward  M 3456 [6528] / F 4096: smem 84% of the FMA time, FMA-bound [<= 63%]
 *     dk/dv    M 6848 [12992] / F 8192: 84% [<= 63%];  dq 4992 [9600] / 6144: 81% [<= 64%]
 * Issue slots (PTX of the inner loops, unrolled by 2): old tile_dot 32 FMA in 48
 * instructions, tile_pv 128 in 187 to 236 (the per-column guards of ATT_NJ = 8); new 256
 * FMA in ~290 (24 LDS.128, ~10 address and loop): FMA 88% of the issued instructions.
 * Per warp per tile pair the softmax adds ~130 (32 EX2 on the SFU), the copies ~50.
 *
 * Pipelining (single buffers but split phases: each tile is refilled as soon as its last
 * reader is done, so its global latency runs under the other half of the tile's work):
 *   forward: K is read by S only, V by P V only: V(kt) is issued after the barrier that
 *     opens tile kt and lands under S = Q K^T; K(kt + 1) is issued after the barrier that
 *     follows S and lands under P V. Two barriers per key tile; 4 tiles of shared memory.
 *   dq: K is read by S and dS K, V by dP only: K is double-buffered (issued a whole tile
 *     ahead), V(kt + 1) is issued after the barrier that follows dS and lands under dS K.
 *     Two barriers per key tile.
 *   dk/dv: Q is read by S^T first and dS^T Q last, dO by dP^T and P^T dO: dO(qt) is
 *     issued after the barrier that opens tile qt and lands under S^T; Q(qt + 1) is issued
 *     after the barrier that follows dS^T Q and lands under P^T dO. Four barriers.
 *     lse and D of a query tile go through one register per thread (a plain load issued
 *     with Q's copies, stored to shared memory just before the next opening barrier).
 *   hs <= 128 (tiles of 132 floats a row): those two would take 170.5 and 182 KiB, above
 *     the 163 KiB a block may have on sm_80 (A100), so there dq has one key stage (K(kt)
 *     is issued after the opening barrier, dP is computed first and lands it, a third
 *     barrier), and dk/dv one score tile (P^T dO before dP^T, a barrier before dS^T
 *     replaces P^T; Q(qt + 1) lands under nothing of its own block: five barriers).
 * The copies are 16-byte cp.async (engine/cuda/mma.cuh) when hs % 4 == 0 and every buffer
 * is 16-byte aligned (then the output rows are written as float4 too); otherwise the same
 * schedule loads synchronously, a float at a time, and stores scalars. Rows past T and
 * columns from hs up to hsmax are zero-filled, so every product runs on finite values and
 * the columns past hs are computed and never stored.
 *
 * Occupancy (H100/H200: 228 KiB shared memory and 64K registers per SM; ptxas of nvcc
 * 13.0, sm_90, no spills; old, 256 threads: forward 80 registers and 24 warps an SM at
 * hs 64, dk/dv and dq 128 registers and 16 warps; at hs 128, 8 warps):
 *   hs <= 64:  forward 159 registers (bound: 168), 68 KiB: 3 blocks, 12 warps an SM;
 *              dk/dv 228 and 102.5 KiB, dq 254 and 102 KiB: 2 blocks, 8 warps (the
 *              lean variants: 228 and 254, 85.5 and 85 KiB)
 *   hs <= 128: forward 168, 116 KiB; dk/dv 255, 149.5 KiB; dq 220, 149 KiB: 1 block,
 *              4 warps
 * Fewer warps than before, each with 32 to 128 independent accumulators. (On an A100's
 * 164 KiB: 2 blocks of the forward at hs 64, else 1.) The kernel bodies take hsmax (64 or
 * 128) as an argument and are inlined into one kernel each, so pitches, column counts,
 * register arrays and the schedule are compile-time; hs (1 .. hsmax) is not. */
#include "engine/cuda/cuda_common.cuh"
#include "engine/cuda/mma.cuh"

#define ATT_TILE 64         /* rows of a block, and rows of a streamed tile */
#define ATT_THREADS 128     /* 4 warps x 16 rows */
#define ATT_DOT_THREADS 256 /* attention_bwd_dot_kernel: 8 warps, a (b, t, h) row each */
#define ATT_MAX_HS 128
#define ATT_NACC (ATT_MAX_HS / 8) /* output accumulators per row of a lane: nc float4 */
#define ATT_SP 68                 /* pitch of a [64][64] score tile */

/* floats per row of a [64][hs] tile in a kernel for head sizes up to hsmax (64 or 128) */
static __host__ __device__ __forceinline__ int att_pitch(int hsmax) { return hsmax + 4; }

/* ------------------------------------------------------------------ lane geometry */

/* A lane's place in its warp's 16 x 64 blocks: row group rg (4 rows) and column group kg
 * (8 keys, or 2 float4 output columns per 64), from the lane's bits as
 *   bit 0: kg bit 0, bit 1: rg bit 0, bits 2-3: kg bits 1-2, bit 4: rg bit 1,
 * so that lanes n and n ^ 1 (same rg) load the same row of the block's own operand and
 * lanes n and n ^ 2 (same kg) the same row or columns of the streamed one: the pattern
 * for which the SM may return an LDS.128 in 2 cycles instead of 4 (LDS.U). */
static __device__ __forceinline__ int lane_rg(void) {
    int lane = (int)(threadIdx.x & 31);
    return ((lane >> 1) & 1) | ((lane >> 3) & 2);
}

static __device__ __forceinline__ int lane_kg(void) {
    int lane = (int)(threadIdx.x & 31);
    return (lane & 1) | ((lane >> 1) & 6);
}

/* This lane's first row in its warp's block: 16 warp + 2 rg */
static __device__ __forceinline__ int lane_row0(void) {
    return 16 * (int)(threadIdx.x >> 5) + 2 * lane_rg();
}

/* row(i) - row(0) of this lane's 4 rows: 0, 1, 8, 9 */
static __device__ __forceinline__ int row_off(int i) { return (i & 1) + 8 * (i >> 1); }

/* max and sum over the 8 lanes of a row group (they share rows: lane bits 0, 2, 3);
 * every lane gets the same bits (butterfly) */
static __device__ __forceinline__ float group8_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 1));
    v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 4));
    return fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 8));
}

static __device__ __forceinline__ float group8_sum(float v) {
    v += __shfl_xor_sync(FULL_MASK, v, 1);
    v += __shfl_xor_sync(FULL_MASK, v, 4);
    return v + __shfl_xor_sync(FULL_MASK, v, 8);
}

/* ------------------------------------------------------------------ tiles */

/* tile[r][0..hsmax) = src[r * ld + 0..hs) for r < nrows, zeros past hs and for
 * nrows <= r < 64 (src: a [64][hs] view, row pitch ld floats; nrows >= 1). vec: cp.async in
 * 16-byte chunks (src and ld multiples of 4 floats, hs % 4 == 0), which the caller commits
 * and waits for; else plain loads, a float at a time. A row's chunks go to consecutive
 * threads, so the reads coalesce. */
static __device__ __forceinline__ void load_tile(float *tile /* [64][att_pitch(hsmax)] */,
                                                 const float *src, size_t ld, int nrows,
                                                 int hs, int hsmax, int vec) {
    int p = att_pitch(hsmax), nc = hsmax / 4; /* 16-byte chunks per row */
    int step = ATT_THREADS / nc;              /* rows per pass of the block */
    int r = (int)threadIdx.x / nc, c = 4 * ((int)threadIdx.x % nc);
    float *dst = tile + r * p + c;
#pragma unroll
    for (int k = 0; k < ATT_TILE / step; k++, r += step, dst += step * p) {
        /* row r's chunk; rows past nrows point at src, a valid address never read */
        const float *from = r < nrows ? src + (size_t)r * ld + c : src;
        if (vec) {
            int ok = r < nrows && c < hs;
            cp_async16(dst, ok ? from : src, ok ? 16 : 0);
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++) dst[e] = r < nrows && c + e < hs ? __ldg(from + e) : 0.0f;
        }
    }
}

/* This thread's element of a query tile's statistics (dk/dv): lse[q] for threads
 * 0..63, D[q] for 64..127, q = q0 + thread % 64; 0 past T. A plain load, so that it is
 * issued early and stored to shared memory late (the rows are not 16-byte aligned). */
static __device__ __forceinline__ float load_stat(const float *lse_bh /* [T] */,
                                                  const float *D_bh /* [T] */, int q0, int T) {
    int q = q0 + (int)(threadIdx.x & 63);
    if (q >= T) return 0.0f;
    return threadIdx.x < 64 ? __ldg(lse_bh + q) : __ldg(D_bh + q);
}

/* ------------------------------------------------------------------ warp products */

static __device__ __forceinline__ void zero_scores(float s[4][8]) {
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) s[i][j] = 0.0f;
}

static __device__ __forceinline__ void zero_acc(float acc[4][ATT_NACC], int nc) {
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int c = 0; c < 4 * nc; c++) acc[i][c] = 0.0f;
}

/* One step of warp_scores: s[i][j] += a[row_off(i) p + 0..3] . b[8j p + 0..3] */
static __device__ __forceinline__ void scores_step(float s[4][8], const float *a,
                                                   const float *b, int p) {
    float4 av[4];
#pragma unroll
    for (int i = 0; i < 4; i++) av[i] = *(const float4 *)(a + row_off(i) * p);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float4 bv = *(const float4 *)(b + 8 * j * p);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float acc = s[i][j];
            acc += av[i].x * bv.x;
            acc += av[i].y * bv.y;
            acc += av[i].z * bv.z;
            acc += av[i].w * bv.w;
            s[i][j] = acc;
        }
    }
}

/* s[i][j] = sum_{d < hs4} A[row(i)][d] B[kg + 8j][d]: this lane's 4 x 8 block of the warp's
 * 16 x 64 block of A B^T (A: the block's rows, B: a streamed tile; hs4 = hs rounded up to
 * 4, the tiles hold zeros from hs). Per 4 d: 4 + 8 LDS.128 for 128 FMA. An A load covers
 * 4 distinct float4 (rows 2 rg apart: 4 bank groups), a B load 8 consecutive rows at one
 * column (8 bank groups): no conflicts, and each pairs lanes (lane_rg). */
static __device__ __forceinline__ void warp_scores(float s[4][8],
                                                   const float *A /* [64][p] */,
                                                   const float *B /* [64][p] */, int p,
                                                   int hs4) {
    const float *a = A + lane_row0() * p, *b = B + lane_kg() * p;
    zero_scores(s);
    if (p == att_pitch(64)) {
#pragma unroll 2
        for (int d = 0; d < hs4; d += 4) scores_step(s, a + d, b + d, p);
    } else {
        /* hs <= 128: one step per iteration, so that the operands of a second one do not
         * push dk/dv (128 accumulators) into spilling */
#pragma unroll 1
        for (int d = 0; d < hs4; d += 4) scores_step(s, a + d, b + d, p);
    }
}

/* acc[i][4h + e] += sum_u S[row(i)][u] V[u][4 kg + 32 h + e] (h < nc, e < 4): this lane's
 * 4 rows x nc float4 column groups of the warp's 16 x hsmax block of S V (S: a score tile
 * in shared memory, V: a [64][hsmax] tile). Per 4 u: 4 + 4 nc LDS.128 for 64 nc FMA. An S
 * load covers 4 distinct float4, a V load 8 consecutive float4 of one row (all 32 banks):
 * no conflicts, and each pairs lanes (lane_rg). */
static __device__ __forceinline__ void warp_sv(float acc[4][ATT_NACC],
                                               const float *S /* [64][ATT_SP] */,
                                               const float *V /* [64][p] */, int p, int nc) {
    const float *sr = S + lane_row0() * ATT_SP, *v = V + 4 * lane_kg();
#pragma unroll 2
    for (int u = 0; u < ATT_TILE; u += 4) {
        float w[4][4]; /* [row i][key u + f] */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float4 t = *(const float4 *)(sr + row_off(i) * ATT_SP + u);
            w[i][0] = t.x, w[i][1] = t.y, w[i][2] = t.z, w[i][3] = t.w;
        }
#pragma unroll
        for (int f = 0; f < 4; f++)
#pragma unroll
            for (int h = 0; h < nc; h++) {
                float4 vv = *(const float4 *)(v + (u + f) * p + 32 * h);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    acc[i][4 * h + 0] += w[i][f] * vv.x;
                    acc[i][4 * h + 1] += w[i][f] * vv.y;
                    acc[i][4 * h + 2] += w[i][f] * vv.z;
                    acc[i][4 * h + 3] += w[i][f] * vv.w;
                }
            }
    }
}

/* S[row(i)][kg + 8j] = s[i][j]: this lane's block into a score tile. For one (i, j) the
 * lanes write rows 2 rg apart (8 banks at pitch 68), columns kg: 32 distinct banks. */
static __device__ __forceinline__ void store_scores(float *S /* [64][ATT_SP] */,
                                                    const float s[4][8]) {
    float *sr = S + lane_row0() * ATT_SP + lane_kg();
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) sr[row_off(i) * ATT_SP + 8 * j] = s[i][j];
}

/* dst[(t0 + row(i)) * ld + 4 kg + 32 h + e] = mul[i] * acc[i][4h + e] for the rows
 * t0 + row(i) < T and the columns < hs: float4 stores when vec (dst, ld and hs multiples of
 * 4 floats), else scalars */
static __device__ __forceinline__ void store_rows(float *dst, size_t ld, int t0, int T,
                                                  const float acc[4][ATT_NACC],
                                                  const float mul[4], int hs, int nc,
                                                  int vec) {
    int kg = lane_kg();
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int t = t0 + row_off(i);
        if (t >= T) continue;
        float *row = dst + (size_t)t * ld;
#pragma unroll
        for (int h = 0; h < nc; h++) {
            int c = 4 * kg + 32 * h;
            float v[4];
#pragma unroll
            for (int e = 0; e < 4; e++) v[e] = mul[i] * acc[i][4 * h + e];
            if (vec) {
                if (c < hs) *(float4 *)(row + c) = make_float4(v[0], v[1], v[2], v[3]);
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (c + e < hs) row[c + e] = v[e];
            }
        }
    }
}

/* ------------------------------------------------------------------ forward */

/* One key tile's online softmax for this lane's 4 rows (queries t0 + row(i)); s holds
 * their raw scores against keys k0 + kg + 8j. Scales them to the log2 domain
 * (sl2 = log2(e) / sqrt(hs)), masks keys past the query when masked (the diagonal tile:
 * the only one with such keys, and the only one with keys past T for the rows < T), takes
 * the new row maximum over the 8 lanes of the row, leaves P = exp2(s - m) in s, and
 * updates m and l (this lane's share of the row sum: reduced once, at the end). alpha:
 * the factor exp2(m_old - m_new) of the row's output accumulators. */
static __device__ __forceinline__ void softmax_tile(float s[4][8], float m[4], float l[4],
                                                    float alpha[4], float sl2, int t0, int k0,
                                                    int masked) {
    int kg = lane_kg();
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float v = s[i][j] * sl2;
            if (masked && k0 + kg + 8 * j > t0 + row_off(i)) v = -INFINITY;
            s[i][j] = v;
            mx = fmaxf(mx, v);
        }
        float mn = fmaxf(m[i], group8_max(mx));
        float ref = mn == -INFINITY ? 0.0f : mn; /* no key yet: all terms stay 0 */
        float ls = 0.0f;
        alpha[i] = exp2f(m[i] - ref);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            s[i][j] = exp2f(s[i][j] - ref);
            ls += s[i][j];
        }
        l[i] = l[i] * alpha[i] + ls;
        m[i] = mn;
    }
}

/* Block (bh, y): batch b = bh / NH, head h = bh % NH, query tile NT-1-y (the longest
 * rows first); warp w owns queries q0 + 16 w .. + 15. Per key tile up to the diagonal:
 * S = Q K^T, online softmax, P to shared memory (own rows), O = alpha O + P V. Finally
 * out = O / l and lse = m + log2 l (m: the row's largest score, in the log2 domain). */
static __device__ __forceinline__ void attn_fwd(float *sm /* att_fwd_smem(hsmax) */,
                                                float *out /* [B,T,C] */, float *lse /* [B,NH,T] */,
                                                const float *qkv /* [B,T,3C] */, int T, int C,
                                                int NH, float sl2, int vec, int pairs,
                                                int hsmax) {
    int p = att_pitch(hsmax), tile = ATT_TILE * p, nc = hsmax / 32;
    float *Qs = sm;         /* [64][p] this block's queries */
    float *Ks = Qs + tile;  /* [64][p] the current key tile */
    float *Vs = Ks + tile;  /* [64][p] the current value tile */
    float *Ps = Vs + tile;  /* [64][ATT_SP] probabilities, [query][key] */

    int hs = C / NH, hs4 = (hs + 3) & ~3;
    int bh, rank;
    if (!attention_block(pairs, &bh, &rank)) return;
    int b = bh / NH, h = bh % NH, qt = gridDim.y - 1 - rank, q0 = qt * ATT_TILE;
    size_t ld = 3 * (size_t)C;
    const float *base = qkv + (size_t)b * T * ld + (size_t)h * hs; /* q of row 0 */
    int t0 = q0 + lane_row0(); /* this lane's query of row(0) */

    load_tile(Qs, base + (size_t)q0 * ld, ld, T - q0, hs, hsmax, vec);
    load_tile(Ks, base + C, ld, T, hs, hsmax, vec); /* key tile 0 */
    cp_async_commit();

    float o[4][ATT_NACC], m[4], l[4];
    zero_acc(o, nc);
#pragma unroll
    for (int i = 0; i < 4; i++) m[i] = -INFINITY, l[i] = 0.0f;

    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * ATT_TILE;
        cp_async_wait_all();
        __syncthreads(); /* K(kt) (and Q) landed; every warp is done with V and P of kt - 1 */
        load_tile(Vs, base + 2 * (size_t)C + (size_t)k0 * ld, ld, T - k0, hs, hsmax, vec);
        cp_async_commit();

        float s[4][8], alpha[4];
        warp_scores(s, Qs, Ks, p, hs4);
        if (kt == qt) softmax_tile(s, m, l, alpha, sl2, t0, k0, 1);
        else softmax_tile(s, m, l, alpha, sl2, t0, k0, 0);
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int c = 0; c < 4 * nc; c++) o[i][c] *= alpha[i];
        store_scores(Ps, s);
        cp_async_wait_all();
        __syncthreads(); /* V(kt) landed, P complete; every warp is done with K(kt) */
        if (kt < qt) {
            load_tile(Ks, base + C + (size_t)(k0 + ATT_TILE) * ld, ld, T - k0 - ATT_TILE, hs,
                      hsmax, vec);
            cp_async_commit();
        }
        warp_sv(o, Ps, Vs, p, nc);
    }

    float inv[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float lt = group8_sum(l[i]);
        int t = t0 + row_off(i);
        inv[i] = 1.0f / lt;
        if (t < T && lane_kg() == 0) lse[(size_t)bh * T + t] = m[i] + log2f(lt);
    }
    store_rows(out + (size_t)b * T * C + (size_t)h * hs, (size_t)C, t0, T, o, inv, hs, nc, vec);
}

/* 68 KiB of shared memory at hs 64: 3 blocks an SM, so at most 168 registers */
__global__ void __launch_bounds__(ATT_THREADS, 3)
attention_fwd64_kernel(float *out /* [B,T,C] */, float *lse /* [B,NH,T] */,
                       const float *qkv /* [B,T,3C] */, int T, int C, int NH, float sl2,
                       int vec, int pairs) {
    extern __shared__ float4 att_smem[];
    attn_fwd((float *)att_smem, out, lse, qkv, T, C, NH, sl2, vec, pairs, 64);
}

__global__ void __launch_bounds__(ATT_THREADS)
attention_fwd128_kernel(float *out /* [B,T,C] */, float *lse /* [B,NH,T] */,
                        const float *qkv /* [B,T,3C] */, int T, int C, int NH, float sl2,
                        int vec, int pairs) {
    extern __shared__ float4 att_smem[];
    attn_fwd((float *)att_smem, out, lse, qkv, T, C, NH, sl2, vec, pairs, 128);
}

/* ------------------------------------------------------------------ backward */

/* D[b,h,t] = sum_i dout[b,t,h*hs+i] * out[b,t,h*hs+i] (act: fp32 here, bf16 for
 * attention_bf16_bwd.cu, through cuda_attention_dot): one warp per (b, t, h), with
 * consecutive warps on consecutive heads of a row so the reads coalesce. */
__global__ void attention_bwd_dot_kernel(float *D /* [B,NH,T] */,
                                         const gptc_act *dout /* [B,T,C] */,
                                         const gptc_act *out /* [B,T,C] */, int B, int T,
                                         int C, int NH, int bf16) {
    int hs = C / NH, lane = threadIdx.x & 31;
    size_t rows = (size_t)B * T * NH;
    size_t stride = ((size_t)gridDim.x * blockDim.x) >> 5;
    for (size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < rows;
         w += stride) {
        size_t bt = w / NH;
        int h = (int)(w % NH);
        size_t row = bt * C + (size_t)h * hs; /* this head's elements of dout and out */
        float acc = 0.0f;
        for (int i = lane; i < hs; i += 32)
            acc += act_ld(dout, row + i, bf16) * act_ld(out, row + i, bf16);
        acc = warp_sum(acc);
        if (lane == 0) {
            size_t b = bt / T, t = bt % T;
            D[(b * NH + h) * T + t] = acc;
        }
    }
}

/* attention_bwd_dot_kernel with 16-byte loads, where hs = 8 * lanes (lanes: 1 to 32, a
 * power of two) and both buffers are 16-byte aligned: a lane multiplies 8 elements, its
 * group of `lanes` lanes adds them by shuffles within the group, and a warp takes
 * 32 / lanes consecutive (b, t, h) rows at once (at hs 64 four heads of a row, 512
 * contiguous bytes of bf16 where the kernel above reads 64 at a time). */
__global__ void attention_bwd_dot_vec_kernel(float *D /* [B,NH,T] */,
                                             const gptc_act *dout /* [B,T,C] */,
                                             const gptc_act *out /* [B,T,C] */, int B, int T,
                                             int C, int NH, int bf16, int lanes) {
    int hs = C / NH, lane = threadIdx.x & 31, part = lane % lanes, per_warp = 32 / lanes;
    size_t rows = (size_t)B * T * NH, units = (rows + per_warp - 1) / per_warp;
    size_t stride = ((size_t)gridDim.x * blockDim.x) >> 5;
    for (size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < units;
         w += stride) {
        size_t r = w * per_warp + lane / lanes; /* this lane's row */
        float acc = 0.0f;
        if (r < rows) {
            size_t i = r / NH * C + (size_t)(r % NH) * hs + 8 * (size_t)part;
            float a[8], b[8];
            act_ld8_any(a, dout, i, bf16);
            act_ld8_any(b, out, i, bf16);
            for (int j = 0; j < 8; j++) acc += a[j] * b[j];
        }
        for (int off = lanes >> 1; off > 0; off >>= 1) /* within the group: xor < lanes */
            acc += __shfl_xor_sync(FULL_MASK, acc, off);
        if (r < rows && part == 0) {
            size_t bt = r / NH, b = bt / T, t = bt % T, h = r % NH;
            D[(b * NH + h) * T + t] = acc;
        }
    }
}

/* P^T = exp2(s sl2 - lse2[t]) over a dk/dv lane's block (rows: keys u0 + row(i); columns:
 * queries t = q0 + kg + 8j, whose log2-domain lse is lse2[kg + 8j]), in place. masked:
 * 0 where u > t or t >= T (the diagonal tile and a partial last one; the callers pass a
 * constant, so that the other tiles' code has no test at all). */
static __device__ __forceinline__ void probs_by_key(float s[4][8], int u0, int q0, int T,
                                                    float sl2, const float *lse2 /* [64] */,
                                                    int masked) {
    int kg = lane_kg();
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float lq = lse2[kg + 8 * j];
        int t = q0 + kg + 8 * j;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float pr = exp2f(s[i][j] * sl2 - lq);
            if (masked && (u0 + row_off(i) > t || t >= T)) pr = 0.0f;
            s[i][j] = pr;
        }
    }
}

/* dS^T = P^T (dp - D[t]) over a dk/dv lane's block, in place in dp: P^T read back from
 * this lane's own slots of the score tile, D of query q0 + kg + 8j from Dq[kg + 8j] */
static __device__ __forceinline__ void ds_by_key(float dp[4][8], const float *Pt /* [64][ATT_SP] */,
                                                 const float *Dq /* [64] */) {
    const float *pr = Pt + lane_row0() * ATT_SP + lane_kg();
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float d = Dq[lane_kg() + 8 * j];
#pragma unroll
        for (int i = 0; i < 4; i++) dp[i][j] = pr[row_off(i) * ATT_SP + 8 * j] * (dp[i][j] - d);
    }
}

/* what every backward kernel reads and writes, passed by value (kernel parameters) */
typedef struct {
    float *dqkv;           /* [B,T,3C] */
    const float *dout;     /* [B,T,C] */
    const float *qkv;      /* [B,T,3C] */
    const float *lse;      /* [B,NH,T] base-2 log-sum-exp of the forward's scores */
    const float *D;        /* [B,NH,T] rowsum(dO * O) */
    int T, C, NH, vec;
    float sl2, scale;
    int pairs;             /* B * NH (attention_block) */
} att_bwd_args;

/* Block (bh, y): key tile y (the longest loops first); warp w owns keys k0 + 16 w .. + 15.
 * K, V of the tile stay in shared memory; for each query tile at or after it, in the
 * transposed view (rows: the block's keys, columns: the tile's 64 queries):
 * S^T = K Q^T, P^T from lse; dP^T = V dO^T, dS^T = P^T (dP^T - D); then dK += dS^T Q and
 * dV += P^T dO, with P^T and dS^T through shared memory. Writes dk = scale dK and dv for
 * its keys < T. */
static __device__ __forceinline__ void attn_bwd_dkdv(float *sm /* att_dkdv_smem(hsmax, two) */,
                                                     att_bwd_args a, int hsmax, int two) {
    float *dqkv = a.dqkv;
    const float *dout = a.dout, *qkv = a.qkv;
    const float *lse = a.lse, *D = a.D;
    int T = a.T, C = a.C, NH = a.NH, vec = a.vec;
    float sl2 = a.sl2, scale = a.scale;
    /* two: separate P^T and dS^T tiles (else one: see the top) */
    int p = att_pitch(hsmax), tile = ATT_TILE * p, nc = hsmax / 32;
    float *Ks = sm;                      /* [64][p] this block's keys */
    float *Vs = Ks + tile;               /* [64][p] their values */
    float *Qs = Vs + tile;               /* [64][p] the current query tile */
    float *dOs = Qs + tile;              /* [64][p] its output gradient */
    float *Pt = dOs + tile;              /* [64][ATT_SP] P^T, [key][query] */
    float *dSt = two ? Pt + ATT_TILE * ATT_SP : Pt; /* [64][ATT_SP] dS^T, [key][query] */
    float *stats = dSt + ATT_TILE * ATT_SP; /* [2][64] lse, then D, of its queries */

    int hs = C / NH, hs4 = (hs + 3) & ~3;
    int bh, ktile;
    if (!attention_block(a.pairs, &bh, &ktile)) return;
    int b = bh / NH, h = bh % NH, k0 = ktile * ATT_TILE, ntiles = gridDim.y;
    size_t ld = 3 * (size_t)C;
    const float *base = qkv + (size_t)b * T * ld + (size_t)h * hs;   /* q of row 0 */
    const float *dbase = dout + (size_t)b * T * C + (size_t)h * hs; /* dout of row 0 */
    const float *lse_bh = lse + (size_t)bh * T, *D_bh = D + (size_t)bh * T;
    int u0 = k0 + lane_row0(); /* this lane's key of row(0) */

    load_tile(Ks, base + C + (size_t)k0 * ld, ld, T - k0, hs, hsmax, vec);
    load_tile(Vs, base + 2 * (size_t)C + (size_t)k0 * ld, ld, T - k0, hs, hsmax, vec);
    load_tile(Qs, base + (size_t)k0 * ld, ld, T - k0, hs, hsmax, vec); /* query tile ktile */
    cp_async_commit();
    float st = load_stat(lse_bh, D_bh, k0, T);

    float dk[4][ATT_NACC], dv[4][ATT_NACC];
    zero_acc(dk, nc);
    zero_acc(dv, nc);
    for (int qt = ktile; qt < ntiles; qt++) {
        int q0 = qt * ATT_TILE, q1 = q0 + ATT_TILE, next = qt + 1 < ntiles;
        stats[threadIdx.x] = st; /* the last readers (dS^T of qt - 1) passed a barrier */
        cp_async_wait_all();
        __syncthreads(); /* Q(qt), its stats (K, V) landed; every warp is done with dO and
                          * the score tiles of qt - 1 */
        load_tile(dOs, dbase + (size_t)q0 * C, (size_t)C, T - q0, hs, hsmax, vec);
        cp_async_commit();
        int masked = qt == ktile || q1 > T; /* the diagonal, or queries past T */

        float s[4][8];
        warp_scores(s, Ks, Qs, p, hs4); /* k_u . q_t */
        if (masked) probs_by_key(s, u0, q0, T, sl2, stats, 1);
        else probs_by_key(s, u0, q0, T, sl2, stats, 0);
        store_scores(Pt, s);
        cp_async_wait_all();
        __syncthreads(); /* dO(qt) landed, P^T complete */
        if (!two) warp_sv(dv, Pt, dOs, p, nc); /* P^T's last readers before dS^T replaces it */
        /* dP^T only now, and P^T read back from this lane's own slots: 32 score registers
         * live beside the 2 x 4 nc x 4 accumulators instead of 64 */
        warp_scores(s, Vs, dOs, p, hs4); /* v_u . dout_t */
        ds_by_key(s, Pt, stats + ATT_TILE);
        if (!two) __syncthreads(); /* every warp is done with P^T */
        store_scores(dSt, s);
        __syncthreads(); /* dS^T complete */
        warp_sv(dk, dSt, Qs, p, nc);
        __syncthreads(); /* every warp is done with Q(qt) (and dS^T) */
        if (next) {
            load_tile(Qs, base + (size_t)q1 * ld, ld, T - q1, hs, hsmax, vec);
            cp_async_commit();
            st = load_stat(lse_bh, D_bh, q1, T);
        }
        if (two) warp_sv(dv, Pt, dOs, p, nc); /* under the copies of Q(qt + 1) */
    }

    float mk[4] = {scale, scale, scale, scale}, mv[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    float *krows = dqkv + (size_t)b * T * ld + C + (size_t)h * hs; /* dk of row 0 */
    store_rows(krows, ld, u0, T, dk, mk, hs, nc, vec);
    store_rows(krows + C, ld, u0, T, dv, mv, hs, nc, vec);
}

/* P = exp2(s sl2 - lse2[i]) and dS = P (dp - D[i]) over a dq lane's block (rows: queries
 * t0 + row(i), whose statistics the lane holds; columns: keys k0 + kg + 8j), dS into dp.
 * masked: P = 0 where the key is past the query or the query past T (the diagonal tile). */
static __device__ __forceinline__ void ds_by_query(const float s[4][8], float dp[4][8], int t0,
                                                   int k0, int T, float sl2,
                                                   const float lse2[4], const float Dq[4],
                                                   int masked) {
    int kg = lane_kg();
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int t = t0 + row_off(i);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float pr = exp2f(s[i][j] * sl2 - lse2[i]);
            if (masked && (k0 + kg + 8 * j > t || t >= T)) pr = 0.0f;
            dp[i][j] = pr * (dp[i][j] - Dq[i]);
        }
    }
}

/* Block (bh, y): query tile NT-1-y (the longest loops first); warp w owns queries
 * q0 + 16 w .. + 15. Q and dO of the tile stay in shared memory, lse and D of a lane's
 * rows in registers; for each key tile up to the diagonal: S = Q K^T, dP = dO V^T, P and
 * dS as in the dk/dv kernel, dS to shared memory (own rows), then dQ += dS K. Writes
 * dq = scale dQ for its queries < T. */
static __device__ __forceinline__ void attn_bwd_dq(float *sm /* att_dq_smem(hsmax, two) */,
                                                   att_bwd_args a, int hsmax, int two) {
    float *dqkv = a.dqkv;
    const float *dout = a.dout, *qkv = a.qkv;
    const float *lse = a.lse, *D = a.D;
    int T = a.T, C = a.C, NH = a.NH, vec = a.vec;
    float sl2 = a.sl2, scale = a.scale;
    /* two: two key stages (else one: see the top) */
    int p = att_pitch(hsmax), tile = ATT_TILE * p, nc = hsmax / 32;
    float *Qs = sm;                       /* [64][p] this block's queries */
    float *dOs = Qs + tile;               /* [64][p] their output gradient */
    float *Ks = dOs + tile;               /* [1 + two stages][64][p] the streamed key tiles */
    float *Vs = Ks + (1 + two) * tile;    /* [64][p] the current value tile */
    float *dSs = Vs + tile;               /* [64][ATT_SP] dS, [query][key] */

    int hs = C / NH, hs4 = (hs + 3) & ~3;
    int bh, rank;
    if (!attention_block(a.pairs, &bh, &rank)) return;
    int b = bh / NH, h = bh % NH, qt = gridDim.y - 1 - rank, q0 = qt * ATT_TILE;
    size_t ld = 3 * (size_t)C;
    const float *base = qkv + (size_t)b * T * ld + (size_t)h * hs;
    const float *dbase = dout + (size_t)b * T * C + (size_t)h * hs;
    int t0 = q0 + lane_row0(); /* this lane's query of row(0) */

    load_tile(Qs, base + (size_t)q0 * ld, ld, T - q0, hs, hsmax, vec);
    load_tile(dOs, dbase + (size_t)q0 * C, (size_t)C, T - q0, hs, hsmax, vec);
    load_tile(Ks, base + C, ld, T, hs, hsmax, vec); /* key tile 0, stage 0 */
    load_tile(Vs, base + 2 * (size_t)C, ld, T, hs, hsmax, vec);
    cp_async_commit();
    float lse2[4], Dq[4]; /* of this lane's rows; 0 past T */
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int t = t0 + row_off(i);
        lse2[i] = t < T ? __ldg(lse + (size_t)bh * T + t) : 0.0f;
        Dq[i] = t < T ? __ldg(D + (size_t)bh * T + t) : 0.0f;
    }

    float dq[4][ATT_NACC];
    zero_acc(dq, nc);
    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * ATT_TILE, k1 = k0 + ATT_TILE;
        const float *Kc = Ks + (two ? (kt & 1) * tile : 0);
        cp_async_wait_all();
        __syncthreads(); /* V(kt) (K(kt) with two stages; Q, dO) landed; every warp is done
                          * with dS and with the key stage of kt - 1 */
        if (two && kt < qt) { /* a whole tile ahead */
            load_tile(Ks + ((kt + 1) & 1) * tile, base + C + (size_t)k1 * ld, ld, T - k1, hs,
                      hsmax, vec);
            cp_async_commit();
        } else if (!two && kt > 0) { /* under dP */
            load_tile(Ks, base + C + (size_t)k0 * ld, ld, T - k0, hs, hsmax, vec);
            cp_async_commit();
        }

        float s[4][8], dp[4][8];
        warp_scores(dp, dOs, Vs, p, hs4); /* dout_t . v_u */
        if (!two) {
            cp_async_wait_all();
            __syncthreads(); /* K(kt) landed */
        }
        warp_scores(s, Qs, Kc, p, hs4);   /* q_t . k_u */
        if (kt == qt) ds_by_query(s, dp, t0, k0, T, sl2, lse2, Dq, 1);
        else ds_by_query(s, dp, t0, k0, T, sl2, lse2, Dq, 0);
        store_scores(dSs, dp);
        __syncthreads(); /* dS complete; every warp is done with V(kt) */
        if (kt < qt) {
            load_tile(Vs, base + 2 * (size_t)C + (size_t)k1 * ld, ld, T - k1, hs, hsmax, vec);
            cp_async_commit();
        }
        warp_sv(dq, dSs, Kc, p, nc);
    }

    float mq[4] = {scale, scale, scale, scale};
    store_rows(dqkv + (size_t)b * T * ld + (size_t)h * hs, ld, t0, T, dq, mq, hs, nc, vec);
}

/* 102.5 KiB of shared memory at hs 64: 2 blocks an SM, which leave 255 registers */
__global__ void __launch_bounds__(ATT_THREADS, 2)
attention_bwd_dkdv64_kernel(att_bwd_args a) {
    extern __shared__ float4 att_smem[];
    attn_bwd_dkdv((float *)att_smem, a, 64, 1);
}

/* hs 64 with one score tile, 85.5 KiB: for devices that allow less than 102.5 KiB a block
 * (sm_86, sm_89: 99 KiB) */
__global__ void __launch_bounds__(ATT_THREADS, 2)
attention_bwd_dkdv64_lean_kernel(att_bwd_args a) {
    extern __shared__ float4 att_smem[];
    attn_bwd_dkdv((float *)att_smem, a, 64, 0);
}

__global__ void __launch_bounds__(ATT_THREADS)
attention_bwd_dkdv128_kernel(att_bwd_args a) {
    extern __shared__ float4 att_smem[];
    attn_bwd_dkdv((float *)att_smem, a, 128, 0);
}

__global__ void __launch_bounds__(ATT_THREADS, 2)
attention_bwd_dq64_kernel(att_bwd_args a) {
    extern __shared__ float4 att_smem[];
    attn_bwd_dq((float *)att_smem, a, 64, 1);
}

/* hs 64 with one key stage, 85 KiB (as dkdv64_lean) */
__global__ void __launch_bounds__(ATT_THREADS, 2)
attention_bwd_dq64_lean_kernel(att_bwd_args a) {
    extern __shared__ float4 att_smem[];
    attn_bwd_dq((float *)att_smem, a, 64, 0);
}

__global__ void __launch_bounds__(ATT_THREADS)
attention_bwd_dq128_kernel(att_bwd_args a) {
    extern __shared__ float4 att_smem[];
    attn_bwd_dq((float *)att_smem, a, 128, 0);
}

/* ------------------------------------------------------------------ launchers */

/* the kernels above, as the launchers pick them */
typedef void (*att_fwd_fn)(float *, float *, const float *, int, int, int, float, int, int);
typedef void (*att_bwd_fn)(att_bwd_args);

/* bytes of a [64][hs] tile of the kernel for head sizes up to hsmax, and of a score tile */
static size_t att_tile_bytes(int hsmax) {
    return (size_t)ATT_TILE * att_pitch(hsmax) * sizeof(float);
}

static size_t att_score_bytes(void) { return (size_t)ATT_TILE * ATT_SP * sizeof(float); }

static size_t att_fwd_smem(int hsmax) { return 3 * att_tile_bytes(hsmax) + att_score_bytes(); }

/* two = 0 takes one score tile (dk/dv) or one key stage (dq) less: always at hs <= 128,
 * to stay within the 163 KiB a block may have on sm_80, and at hs <= 64 on devices that
 * allow less than the two-tile kernels need (sm_86, sm_89: 99 KiB) */
static size_t att_dkdv_smem(int hsmax, int two) {
    return 4 * att_tile_bytes(hsmax) + (two ? 2 : 1) * att_score_bytes() +
           2 * ATT_TILE * sizeof(float);
}

static size_t att_dq_smem(int hsmax, int two) {
    return (two ? 5 : 4) * att_tile_bytes(hsmax) + att_score_bytes();
}

/* the backward's variants at head size hs on a device that allows optin bytes a block:
 * *two_kv, *two_q = 1 for the two-tile dk/dv and two-stage dq kernels (hs <= 64 where they
 * fit), 0 for the lean ones */
static void att_bwd_variants(int hs, size_t optin, int *two_kv, int *two_q) {
    *two_kv = hs <= 64 && att_dkdv_smem(64, 1) <= optin;
    *two_q = hs <= 64 && att_dq_smem(64, 1) <= optin;
}

/* 1 when the tiles above cover the head size: C = NH * hs with 1 <= hs <= 128; otherwise
 * the launch is refused (cuda_refuse) */
static int att_shape_ok(int C, int NH, cudaStream_t s) {
    if (NH > 0 && C > 0 && C % NH == 0 && C / NH <= ATT_MAX_HS) return 1;
    cuda_refuse(s, "no fp32 attention kernel for C = %d over %d heads (head sizes 1 to %d)", C,
                NH, ATT_MAX_HS);
    return 0;
}

/* 1 when the 16-byte paths may run: hs % 4 == 0 (then C, every row pitch and every head's
 * offset are multiples of 4 floats) and the buffers a, b, c (NULL: unused) 16-byte aligned */
static int att_vec(int hs, const void *a, const void *b, const void *c) {
    return hs % 4 == 0 && ((uintptr_t)a & 15u) == 0 && ((uintptr_t)b & 15u) == 0 &&
           ((uintptr_t)c & 15u) == 0;
}

extern "C" {

size_t cuda_attention_smem(int hs) {
    int hsmax = hs > 64 ? 128 : 64, two_kv, two_q;
    att_bwd_variants(hs, (size_t)cuda_smem_optin(), &two_kv, &two_q);
    size_t need = att_fwd_smem(hsmax);
    if (att_dkdv_smem(hsmax, two_kv) > need) need = att_dkdv_smem(hsmax, two_kv);
    if (att_dq_smem(hsmax, two_q) > need) need = att_dq_smem(hsmax, two_q);
    return need;
}

void cuda_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C,
                            int NH, cudaStream_t s) {
    if (!att_shape_ok(C, NH, s)) return;
    if (B <= 0 || T <= 0) return;
    int hs = C / NH, vec = att_vec(hs, qkv, out, NULL), wide = hs > 64;
    float sl2 = attention_sl2(hs);
    size_t smem = att_fwd_smem(wide ? 128 : 64);
    att_fwd_fn fwd = wide ? attention_fwd128_kernel : attention_fwd64_kernel;
    if (!cuda_smem_ready((const void *)fwd, smem,
                         wide ? "the fp32 attention forward at head size 65 to 128"
                              : "the fp32 attention forward at head size <= 64",
                         s))
        return;
    dim3 grid = attention_grid(B, NH, T, hs, ATT_TILE, sizeof(float));
    fwd<<<grid, ATT_THREADS, smem, s>>>(out, lse, qkv, T, C, NH, sl2, vec, B * NH);
}

void cuda_attention_dot(float *D, const gptc_act *dout, const gptc_act *out, int B, int T,
                        int C, int NH, gptc_precision p, cudaStream_t s) {
    size_t rows = (size_t)B * T * NH;
    int hs = C / NH, lanes = hs / 8;
    if (hs % 8 == 0 && lanes >= 1 && lanes <= 32 && (lanes & (lanes - 1)) == 0 &&
        aligned16(dout) && aligned16(out)) {
        size_t units = (rows + 32 / lanes - 1) / (32 / lanes); /* warps' worth of rows */
        attention_bwd_dot_vec_kernel<<<grid_for(units, ATT_DOT_THREADS / 32), ATT_DOT_THREADS, 0,
                                       s>>>(D, dout, out, B, T, C, NH, p == GPTC_BF16, lanes);
        return;
    }
    attention_bwd_dot_kernel<<<grid_for(rows, ATT_DOT_THREADS / 32), ATT_DOT_THREADS, 0, s>>>(
        D, dout, out, B, T, C, NH, p == GPTC_BF16);
}

void cuda_attention_backward(float *dqkv, float *scratch, const float *dout,
                             const float *out, const float *qkv, const float *lse, int B,
                             int T, int C, int NH, cudaStream_t s) {
    if (!att_shape_ok(C, NH, s)) return;
    if (B <= 0 || T <= 0) return;
    int hs = C / NH, vec = att_vec(hs, qkv, dout, dqkv);
    float scale = 1.0f / sqrtf((float)hs), sl2 = attention_sl2(hs);
    cuda_attention_dot(scratch, dout, out, B, T, C, NH, GPTC_FP32, s);
    int wide = hs > 64, two_kv, two_q;
    att_bwd_variants(hs, (size_t)cuda_smem_optin(), &two_kv, &two_q);
    size_t smem_kv = att_dkdv_smem(wide ? 128 : 64, two_kv);
    size_t smem_q = att_dq_smem(wide ? 128 : 64, two_q);
    att_bwd_fn dkdv = wide     ? attention_bwd_dkdv128_kernel
                      : two_kv ? attention_bwd_dkdv64_kernel
                               : attention_bwd_dkdv64_lean_kernel;
    att_bwd_fn dq = wide    ? attention_bwd_dq128_kernel
                    : two_q ? attention_bwd_dq64_kernel
                            : attention_bwd_dq64_lean_kernel;
    const char *what = wide ? "the fp32 attention backward at head size 65 to 128"
                            : "the fp32 attention backward at head size <= 64";
    /* dk/dv needs at least as much as dq, so a refusal names its need */
    if (!cuda_smem_ready((const void *)dkdv, smem_kv, what, s) ||
        !cuda_smem_ready((const void *)dq, smem_q, what, s))
        return;
    dim3 grid = attention_grid(B, NH, T, hs, ATT_TILE, sizeof(float));
    att_bwd_args a = {dqkv, dout, qkv, lse, scratch, T, C, NH, vec, sl2, scale, B * NH};
    dkdv<<<grid, ATT_THREADS, smem_kv, s>>>(a);
    dq<<<grid, ATT_THREADS, smem_q, s>>>(a);
}

} /* extern "C" */
