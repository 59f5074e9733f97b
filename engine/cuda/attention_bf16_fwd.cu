/* The bf16 attention's forward kernels and their launcher: the plain kernel (one for hs
 * 64, one for 128, one for any other head size) and, at hs 64, the variants
 * ab_fwd_variant picks (128 queries a block, the pipelined key tiles, flash attention 2's
 * 128 x 128 shape). The scheme they share, and the tile helpers: attention_bf16.cuh. */
#include "engine/cuda/attention_bf16.cuh"

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

/* ------------------------------------------------------------------ launcher */

/* the kernels above, as the launcher picks them */
typedef void (*ab_fwd_fn)(uint16_t *, float *, const uint16_t *, int, int, int, float, int, int);

extern "C" {

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

} /* extern "C" */
