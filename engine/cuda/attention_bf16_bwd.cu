/* The bf16 attention's backward kernels and their launcher: D = rowsum(dout * out), then
 * the dk/dv kernel over key tiles and the dq kernel over query tiles, or (ab_dq_mode, hs
 * 64) the dk/dv kernel with dq's parts and the kernel that sums them. The scheme they
 * share, and the tile helpers: attention_bf16.cuh. */
#include "engine/cuda/attention_bf16.cuh"

/* dst[r] = src[r] for r < nrows, 0 up to 64 */
static __device__ __forceinline__ void load_row_vec(float *dst /* [64] */,
                                                    const float *src /* [nrows] */, int nrows) {
    if (threadIdx.x < AB_TILE)
        dst[threadIdx.x] = (int)threadIdx.x < nrows ? __ldg(src + threadIdx.x) : 0.0f;
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

/* ------------------------------------------------------------------ launcher */

/* the kernels above, as the launcher picks them */
typedef void (*ab_bwd_fn)(ab_bwd_args);

/* floats of the backward's scratch before the dq parts: D [B,NH,T], rounded up to 16 bytes */
static size_t ab_d_floats(int B, int T, int NH) { return ((size_t)B * NH * T + 3) & ~(size_t)3; }

/* floats of the fused dq's parts: a [64][hs] slot per (query tile, key tile <= it) pair,
 * or by atomics one per query tile */
static size_t ab_dq_part_floats(int B, int T, int NH, int hs, ab_dq_kind mode) {
    size_t nt = ((size_t)T + AB_TILE - 1) / AB_TILE;
    return (size_t)B * NH * (mode == AB_DQ_ATOMIC ? nt : nt * (nt + 1) / 2) * AB_TILE * hs;
}

extern "C" {

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
