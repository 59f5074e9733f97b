#include "parallel/tensor.h"

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
 * its input, and the compute that follows waits for it. (s, the caller's compute
 * stream, is the default one.) */
static gptc_stream *lane_begin(tp_context *tp) {
    comm_lane_after_compute(tp->lane);
    return tp->lane ? tp->lane->stream : NULL;
}

float *tp_gather_rows(tp_context *tp, float *buf, size_t rows_local, size_t C, gptc_stream *s) {
    if (tp->size > 1 && tp->sequence_parallel) {
        size_t n = rows_local * C;
        comm_allgather(tp->group, buf + (size_t)tp->rank * n, buf, n, lane_begin(tp));
        comm_lane_join(tp->lane);
    }
    return buf;
}

float *tp_reduce_rows(tp_context *tp, float *buf, size_t rows_local, size_t C, gptc_stream *s) {
    if (tp->size == 1) return buf;
    size_t n = rows_local * C;
    float *mine = tp->sequence_parallel ? buf + (size_t)tp->rank * n : buf;
    if (tp->sequence_parallel) comm_reduce_scatter_sum(tp->group, buf, mine, n, lane_begin(tp));
    else comm_allreduce_sum(tp->group, buf, n, lane_begin(tp));
    comm_lane_join(tp->lane);
    return mine;
}

/* overlap.tp = chunked, without sequence parallelism: the GEMM of rows [r0, r1) is done
 * before their all-reduce is issued, and the next GEMM runs while it is in flight. */
static int chunking(const tp_context *tp, int N) {
    return tp->size > 1 && tp->chunks > 1 && !tp->sequence_parallel && N >= tp->chunks;
}

float *tp_row_parallel_forward(tp_context *tp, float *out, const float *inp, const float *w,
                               const float *bias, int N, int IC, int OC, gptc_stream *s) {
    const float *b = tp->rank == 0 ? bias : NULL;
    if (!chunking(tp, N)) {
        tp->be->matmul_forward(out, inp, w, b, N, IC, OC, 0, s);
        return tp_reduce_rows(tp, out, (size_t)(tp->sequence_parallel ? N / tp->size : N),
                              (size_t)OC, s);
    }
    for (int i = 0; i < tp->chunks; i++) {
        int r0 = (int)((long)N * i / tp->chunks), r1 = (int)((long)N * (i + 1) / tp->chunks);
        float *o = out + (size_t)r0 * OC;
        tp->be->matmul_forward(o, inp + (size_t)r0 * IC, w, b, r1 - r0, IC, OC, 0, s);
        comm_allreduce_sum(tp->group, o, (size_t)(r1 - r0) * OC, lane_begin(tp));
    }
    comm_lane_join(tp->lane);
    return out;
}

float *tp_column_parallel_backward(tp_context *tp, float *dinp, float *dw, float *dbias,
                                   const float *dout, const float *inp, const float *w, int N,
                                   int IC, int OC, int w_rows_out, gptc_stream *s) {
    if (!chunking(tp, N)) {
        tp->be->matmul_backward(dinp, dw, dbias, dout, inp, w, N, IC, OC, w_rows_out, s);
        return tp_reduce_rows(tp, dinp, (size_t)(tp->sequence_parallel ? N / tp->size : N),
                              (size_t)IC, s);
    }
    for (int i = 0; i < tp->chunks; i++) {
        int r0 = (int)((long)N * i / tp->chunks), r1 = (int)((long)N * (i + 1) / tp->chunks);
        float *d = dinp + (size_t)r0 * IC;
        tp->be->matmul_backward(d, NULL, NULL, dout + (size_t)r0 * OC, NULL, w, r1 - r0, IC, OC,
                                w_rows_out, s);
        comm_allreduce_sum(tp->group, d, (size_t)(r1 - r0) * IC, lane_begin(tp));
    }
    tp->be->matmul_backward(NULL, dw, dbias, dout, inp, w, N, IC, OC, w_rows_out, s);
    comm_lane_join(tp->lane);
    return dinp;
}

void tp_allreduce_sum(tp_context *tp, float *buf, size_t n, gptc_stream *s) {
    if (tp->size == 1) return;
    comm_allreduce_sum(tp->group, buf, n, lane_begin(tp));
    comm_lane_join(tp->lane);
}

void tp_allreduce_max(tp_context *tp, float *buf, size_t n, gptc_stream *s) {
    if (tp->size == 1) return;
    comm_allreduce_max(tp->group, buf, n, lane_begin(tp));
    comm_lane_join(tp->lane);
}
