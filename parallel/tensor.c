#include "parallel/tensor.h"

#include <stdlib.h>

#include "parallel/comm.h"

void tp_shard_shape(shard_kind k, long rows, long cols, long padded_rows, int tp,
                    long *local_rows, long *local_cols) {
    *local_rows = rows;
    *local_cols = cols;
    if (k == SHARD_ROWS) *local_rows = (padded_rows > rows ? padded_rows : rows) / tp;
    else if (k == SHARD_COLS || k == SHARD_QKV_COLS) *local_cols = cols / tp;
}

int tp_shard_blocks(shard_kind k, long rows, long cols, long padded_rows, int tp, int rank,
                    shard_block blocks[3]) {
    long lr, lc;
    tp_shard_shape(k, rows, cols, padded_rows, tp, &lr, &lc);
    if (k == SHARD_QKV_COLS) {
        long third = cols / 3, w = lc / 3;
        for (int b = 0; b < 3; b++)
            blocks[b] = (shard_block){{0, b * third + rank * w}, {rows, w}, b * w};
        return 3;
    }
    shard_block b = {{0, 0}, {rows, cols}, 0};
    if (k == SHARD_ROWS) {
        long first = rank * lr, real = rows - first;
        if (real <= 0) return 0;
        b.start[0] = first;
        b.count[0] = real < lr ? real : lr;
    } else if (k == SHARD_COLS) {
        b.start[1] = rank * lc;
        b.count[1] = lc;
    }
    blocks[0] = b;
    return 1;
}

long tp_global_index(shard_kind k, long rows, long cols, long local_rows, long local_cols,
                     int rank, long i, long j) {
    long gi = i, gj = j;
    if (k == SHARD_ROWS) gi = rank * local_rows + i;
    else if (k == SHARD_COLS) gj = rank * local_cols + j;
    else if (k == SHARD_QKV_COLS) {
        long w = local_cols / 3, block = j / w;
        gj = block * (cols / 3) + rank * w + j % w;
    }
    return gi < rows ? gi * cols + gj : -1;
}

/* overlap.tp = none: each collective runs on the TP stream after the compute that made
 * its input (on the default stream, the one the lane is tied to), and the compute that
 * follows waits for it. */
static gptc_stream *lane_begin(tp_context *tp) {
    comm_lane_after_compute(tp->lane);
    return tp->lane ? tp->lane->stream : NULL;
}

/* The activations' type, and element i of an activation buffer */
static gptc_precision prec(const tp_context *tp) { return tp->be->get_precision(); }
static gptc_act *at(const tp_context *tp, const gptc_act *p, size_t i) {
    return gptc_act_at(p, i, prec(tp));
}

gptc_act *tp_gather_rows(tp_context *tp, gptc_act *buf, size_t rows_local, size_t C) {
    if (tp->size > 1 && tp->sequence_parallel) {
        size_t n = rows_local * C;
        comm_allgather_act(tp->group, at(tp, buf, (size_t)tp->rank * n), buf, n, prec(tp),
                           lane_begin(tp));
        comm_lane_join(tp->lane);
    }
    return buf;
}

gptc_act *tp_reduce_rows(tp_context *tp, gptc_act *buf, size_t rows_local, size_t C) {
    if (tp->size == 1) return buf;
    size_t n = rows_local * C;
    gptc_act *mine = tp->sequence_parallel ? at(tp, buf, (size_t)tp->rank * n) : buf;
    if (tp->sequence_parallel)
        comm_reduce_scatter_sum_act(tp->group, buf, mine, n, prec(tp), lane_begin(tp));
    else
        comm_allreduce_sum_act(tp->group, buf, n, prec(tp), lane_begin(tp));
    comm_lane_join(tp->lane);
    return mine;
}

/* overlap.tp = chunked cuts the rows into pieces: without sequence parallelism `chunks`
 * contiguous ones; with it, each rank's block into `chunks`, so that piece p belongs to
 * rank p / chunks and its all-gather is a broadcast from that rank, its reduce-scatter a
 * reduce to it. A piece's GEMM and the collective of the previous (or next) piece run at
 * the same time. */
static int chunked(const tp_context *tp, int N) {
    int per_rank = tp->sequence_parallel ? N / tp->size : N;
    return tp->size > 1 && tp->chunks > 1 && per_rank >= tp->chunks;
}

static int n_pieces(const tp_context *tp) {
    return tp->sequence_parallel ? tp->size * tp->chunks : tp->chunks;
}

int tp_pieces(const tp_context *tp, int N) { return chunked(tp, N) ? n_pieces(tp) : 1; }

static void piece_rows(const tp_context *tp, int N, int p, int *r0, int *r1, int *owner) {
    int k = tp->chunks;
    if (!tp->sequence_parallel) {
        *r0 = (int)((long)N * p / k);
        *r1 = (int)((long)N * (p + 1) / k);
        *owner = -1;
        return;
    }
    int Nl = N / tp->size, o = p / k, j = p % k;
    *r0 = o * Nl + (int)((long)Nl * j / k);
    *r1 = o * Nl + (int)((long)Nl * (j + 1) / k);
    *owner = o;
}

/* The events that mark each piece's broadcast done (made once, on first use). */
static gptc_event *piece_event(tp_context *tp, int p) {
    if (!tp->pieces) {
        tp->n_pieces = n_pieces(tp);
        tp->pieces = calloc((size_t)tp->n_pieces, sizeof(gptc_event *));
        for (int i = 0; tp->pieces && i < tp->n_pieces; i++)
            tp->pieces[i] = tp->be->event_create();
    }
    return tp->pieces && p < tp->n_pieces ? tp->pieces[p] : NULL;
}

/* Broadcasts every piece of buf [N,C] from its owner on the TP stream, each followed by
 * its event, and returns at once: the pieces arrive while the caller computes. */
static void broadcast_pieces(tp_context *tp, gptc_act *buf, int N, int C) {
    gptc_stream *s = lane_begin(tp);
    for (int p = 0; p < n_pieces(tp); p++) {
        int r0, r1, owner;
        piece_rows(tp, N, p, &r0, &r1, &owner);
        comm_broadcast(tp->group, at(tp, buf, (size_t)r0 * C),
                       (size_t)(r1 - r0) * C * gptc_act_bytes(prec(tp)), owner, s);
        gptc_event *e = piece_event(tp, p);
        if (e && s) tp->be->event_record(e, s);
    }
}

/* Issues the sum of one piece: to its owner (the reduce-scatter's share) or to all. */
static void reduce_piece(tp_context *tp, gptc_act *buf /* [n] */, size_t n, int owner) {
    if (owner < 0) comm_allreduce_sum_act(tp->group, buf, n, prec(tp), lane_begin(tp));
    else comm_reduce_sum_act(tp->group, buf, n, owner, prec(tp), lane_begin(tp));
}

static void wait_piece(tp_context *tp, int p) {
    gptc_event *e = piece_event(tp, p);
    if (e && tp->lane) tp->be->stream_wait_event(NULL, e);
}

static size_t own_offset(const tp_context *tp, int N, int C) {
    return tp->sequence_parallel ? (size_t)tp->rank * (N / tp->size) * C : 0;
}

/* rows [r0, r1) of the column-parallel product, with the GELU fused when gelu_out */
static void column_rows(tp_context *tp, gptc_act *out /* [N,OC] */,
                        gptc_act *gelu_out /* [N,OC] or NULL */, const gptc_act *inp /* [N,IC] */,
                        const gptc_act *w /* [IC,OC], or [OC,IC] when w_rows_out */,
                        const gptc_act *bias /* [OC] or NULL */, int r0, int r1, int IC,
                        int OC, int w_rows_out, gptc_stream *s) {
    size_t o = (size_t)r0 * OC, i = (size_t)r0 * IC;
    if (gelu_out)
        tp->be->matmul_gelu_forward(at(tp, gelu_out, o), at(tp, out, o), at(tp, inp, i), w, bias,
                                    r1 - r0, IC, OC, s);
    else
        tp->be->matmul_forward(at(tp, out, o), at(tp, inp, i), w, bias, r1 - r0, IC, OC,
                               w_rows_out, s);
}

gptc_act *tp_column_parallel_forward(tp_context *tp, gptc_act *out, gptc_act *inp,
                                     const gptc_act *w, const gptc_act *bias, int N, int IC,
                                     int OC, int w_rows_out, gptc_act *gelu_out, gptc_stream *s) {
    if (!tp->sequence_parallel || !chunked(tp, N)) {
        tp_gather_rows(tp, inp, (size_t)(tp->sequence_parallel ? N / tp->size : N), (size_t)IC);
        column_rows(tp, out, gelu_out, inp, w, bias, 0, N, IC, OC, w_rows_out, s);
        return out;
    }
    broadcast_pieces(tp, inp, N, IC);
    for (int p = 0; p < n_pieces(tp); p++) {
        int r0, r1, owner;
        piece_rows(tp, N, p, &r0, &r1, &owner);
        wait_piece(tp, p);
        column_rows(tp, out, gelu_out, inp, w, bias, r0, r1, IC, OC, w_rows_out, s);
    }
    comm_lane_join(tp->lane);
    return out;
}

gptc_act *tp_row_parallel_forward(tp_context *tp, gptc_act *out, const gptc_act *inp,
                                  const gptc_act *w, const gptc_act *bias, int N, int IC,
                                  int OC, gptc_stream *s) {
    const gptc_act *b = tp->rank == 0 ? bias : NULL;
    if (!chunked(tp, N)) {
        tp->be->matmul_forward(out, inp, w, b, N, IC, OC, 0, s);
        return tp_reduce_rows(tp, out, (size_t)(tp->sequence_parallel ? N / tp->size : N),
                              (size_t)OC);
    }
    for (int p = 0; p < n_pieces(tp); p++) {
        int r0, r1, owner;
        piece_rows(tp, N, p, &r0, &r1, &owner);
        gptc_act *o = at(tp, out, (size_t)r0 * OC);
        tp->be->matmul_forward(o, at(tp, inp, (size_t)r0 * IC), w, b, r1 - r0, IC, OC, 0, s);
        reduce_piece(tp, o, (size_t)(r1 - r0) * OC, owner);
    }
    comm_lane_join(tp->lane);
    return at(tp, out, own_offset(tp, N, OC));
}

gptc_act *tp_column_parallel_backward(tp_context *tp, gptc_act *dinp, float *dw, float *dbias,
                                      const gptc_act *dout, const gptc_act *inp,
                                      const gptc_act *w, int N, int IC, int OC, int w_rows_out,
                                      gptc_stream *s) {
    if (!chunked(tp, N)) {
        tp->be->matmul_backward(dinp, dw, dbias, dout, inp, w, N, IC, OC, w_rows_out, s);
        return tp_reduce_rows(tp, dinp, (size_t)(tp->sequence_parallel ? N / tp->size : N),
                              (size_t)IC);
    }
    for (int p = 0; p < n_pieces(tp); p++) {
        int r0, r1, owner;
        piece_rows(tp, N, p, &r0, &r1, &owner);
        gptc_act *d = at(tp, dinp, (size_t)r0 * IC);
        tp->be->matmul_backward(d, NULL, NULL, at(tp, dout, (size_t)r0 * OC), NULL, w, r1 - r0,
                                IC, OC, w_rows_out, s);
        reduce_piece(tp, d, (size_t)(r1 - r0) * IC, owner);
    }
    tp->be->matmul_backward(NULL, dw, dbias, dout, inp, w, N, IC, OC, w_rows_out, s);
    comm_lane_join(tp->lane);
    return at(tp, dinp, own_offset(tp, N, IC));
}

/* dinp rows [r0, r1) of the row-parallel backward, through the GELU's backward when
 * gelu_pre (the activation's input) is given */
static void row_dinp(tp_context *tp, gptc_act *dinp /* [N,IC] */,
                     const gptc_act *dout /* [N,OC] */, const gptc_act *w /* [IC,OC] */,
                     const gptc_act *gelu_pre /* [N,IC] or NULL */, int r0, int r1, int IC,
                     int OC, gptc_stream *s) {
    size_t i = (size_t)r0 * IC, o = (size_t)r0 * OC;
    if (gelu_pre)
        tp->be->matmul_dgelu_backward(at(tp, dinp, i), at(tp, dout, o), w, at(tp, gelu_pre, i),
                                      r1 - r0, IC, OC, s);
    else
        tp->be->matmul_backward(at(tp, dinp, i), NULL, NULL, at(tp, dout, o), NULL, w, r1 - r0,
                                IC, OC, 0, s);
}

void tp_row_parallel_backward(tp_context *tp, gptc_act *dinp, float *dw, float *dbias,
                              gptc_act *dout, const gptc_act *inp, const gptc_act *w, int N,
                              int IC, int OC, const gptc_act *gelu_pre, gptc_stream *s) {
    if (!tp->sequence_parallel || !chunked(tp, N)) {
        tp_gather_rows(tp, dout, (size_t)(tp->sequence_parallel ? N / tp->size : N), (size_t)OC);
        if (gelu_pre) {
            row_dinp(tp, dinp, dout, w, gelu_pre, 0, N, IC, OC, s);
            tp->be->matmul_backward(NULL, dw, dbias, dout, inp, w, N, IC, OC, 0, s);
        } else {
            tp->be->matmul_backward(dinp, dw, dbias, dout, inp, w, N, IC, OC, 0, s);
        }
        return;
    }
    broadcast_pieces(tp, dout, N, OC);
    for (int p = 0; p < n_pieces(tp); p++) {
        int r0, r1, owner;
        piece_rows(tp, N, p, &r0, &r1, &owner);
        wait_piece(tp, p);
        row_dinp(tp, dinp, dout, w, gelu_pre, r0, r1, IC, OC, s);
    }
    tp->be->matmul_backward(NULL, dw, dbias, dout, inp, w, N, IC, OC, 0, s);
    comm_lane_join(tp->lane);
}

void tp_allreduce_sum(tp_context *tp, float *buf, size_t n) {
    if (tp->size == 1) return;
    comm_allreduce_sum(tp->group, buf, n, lane_begin(tp));
    comm_lane_join(tp->lane);
}

void tp_allreduce_max(tp_context *tp, float *buf, size_t n) {
    if (tp->size == 1) return;
    comm_allreduce_max(tp->group, buf, n, lane_begin(tp));
    comm_lane_join(tp->lane);
}

void tp_free(tp_context *tp) {
    for (int i = 0; tp->pieces && i < tp->n_pieces; i++)
        if (tp->pieces[i]) tp->be->event_destroy(tp->pieces[i]);
    free(tp->pieces);
    tp->pieces = NULL;
}
