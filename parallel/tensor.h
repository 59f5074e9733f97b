/* Tensor parallelism (Megatron style): which slice of each weight a TP rank holds, and
 * the collectives the layers call between their ops.
 *
 *   c_attn   column-parallel: this rank's heads, i.e. q, k and v column blocks
 *   c_fc     column-parallel: a block of the 4C hidden columns
 *   c_proj   row-parallel (attention and MLP): the matching rows; outputs are partial
 *            sums, all-reduced over the TP group; the bias is added once (TP rank 0)
 *   wte      vocab-parallel: a block of rows of the padded vocabulary, used by the
 *            embedding (all-reduced) and the LM head (vocab-parallel cross-entropy)
 *   others   replicated (LayerNorms, wpe, row-parallel biases)
 * Every collective here is a no-op on a group of one, so the single-rank model runs
 * the same code.
 *
 * Sequence parallelism (parallel.sequence_parallel) also splits the rows (tokens) of the
 * residual stream: TP rank r keeps rows [r*N/tp, (r+1)*N/tp) through LayerNorms and
 * residual adds, and the two collectives around each parallel region change:
 *   entering (before c_attn, c_fc, the LM head):  identity      -> all-gather rows
 *   leaving  (after the row-parallel c_proj):      all-reduce    -> reduce-scatter rows
 * with the transposed pair in backward. A rank writes its rows at their place in an
 * [N,C] buffer, so both run in place. */
#ifndef GPTC_TENSOR_H
#define GPTC_TENSOR_H

#include <stddef.h>

#include "engine/backend.h"

typedef struct comm_group comm_group;
typedef struct comm_lane comm_lane;

typedef enum {
    SHARD_NONE,     /* replicated on every TP rank */
    SHARD_ROWS,     /* contiguous block of rows (dim 0) */
    SHARD_COLS,     /* contiguous block of columns (the last dim) */
    SHARD_QKV_COLS  /* the same block of columns in each of 3 equal column blocks */
} shard_kind;

typedef struct {
    int size, rank;
    comm_group *group; /* NULL when size == 1 */
    int sequence_parallel;
    comm_lane *lane;   /* the TP stream; NULL: collectives run inline */
    int chunks;        /* overlap.tp = chunked: token chunks per GEMM + collective; 1: none */
    const gptc_backend *be; /* its precision is the type of the activations below */
    gptc_event **pieces; /* [n_pieces] chunked with SP: a piece's broadcast is done */
    int n_pieces;
} tp_context;

/* How many pieces overlap.tp = chunked cuts a TP GEMM of N rows (a micro-batch's tokens)
 * and its collective into: chunks, or with sequence parallelism size x chunks (each
 * rank's block in chunks); 1 where it does not cut (no TP, chunks 1, or fewer rows a rank
 * than chunks). */
int tp_pieces(const tp_context *tp, int N);

/* One contiguous hyperslab of the unsharded tensor that lands in this rank's shard:
 * global [start, start+count) for each of the tensor's dims (a 1-D tensor uses index 1
 * for its only dim, index 0 is then start 0 count 1), at column local_col of the shard. */
typedef struct {
    long start[2], count[2];
    long local_col;
} shard_block;

/* Shard shape [rows, cols] of an unsharded [rows, cols] tensor (1-D: rows = 1).
 * padded_rows > rows allows a row split of a padded tensor (wte over the padded vocab). */
void tp_shard_shape(shard_kind k, long rows, long cols, long padded_rows, int tp,
                    long *local_rows, long *local_cols);
/* The hyperslabs of the unsharded tensor this rank holds; returns how many (1 or 3, or
 * 0 when a row shard lies wholly in the padding). */
int tp_shard_blocks(shard_kind k, long rows, long cols, long padded_rows, int tp, int rank,
                    shard_block blocks[3]);
/* Index in the unsharded tensor (row-major over [rows, cols]) of local element
 * (i, j), or -1 for padding. */
long tp_global_index(shard_kind k, long rows, long cols, long local_rows, long local_cols,
                     int rank, long i, long j);

/* Entering a parallel region: buf [N,C] holds this rank's rows (rows_local of them, at
 * their place); afterwards all N rows. Without sequence parallelism buf already holds
 * them all. Returns buf. */
gptc_act *tp_gather_rows(tp_context *tp, gptc_act *buf, size_t rows_local, size_t C);
/* Leaving a parallel region: buf [N,C] holds this rank's partial sums of all rows;
 * returns this rank's rows of the sum (all rows without sequence parallelism). */
gptc_act *tp_reduce_rows(tp_context *tp, gptc_act *buf, size_t rows_local, size_t C);
/* A column-parallel projection entering a parallel region (c_attn, c_fc, the LM head):
 * out[N,OC] = inp[N,IC] @ W + bias, where with sequence parallelism inp holds only this
 * rank's rows at their place and is all-gathered first (chunked: piece by piece, each
 * multiplied as it arrives). With gelu_out (else NULL), also gelu_out[N,OC] = gelu(out),
 * fused into the product (matmul_gelu_forward; W then is [IC,OC]). */
gptc_act *tp_column_parallel_forward(tp_context *tp, gptc_act *out, gptc_act *inp,
                                     const gptc_act *w /* [IC,OC], or [OC,IC] when w_rows_out */,
                                     const gptc_act *bias /* [OC] or NULL */, int N, int IC,
                                     int OC, int w_rows_out, gptc_act *gelu_out, gptc_stream *s);
/* The backward of a row-parallel projection (c_proj): dinp[N,IC] = dout @ W^T and dw,
 * dbias accumulate, where with sequence parallelism dout holds only this rank's rows at
 * their place and is all-gathered first (chunked: piece by piece). With gelu_pre[N,IC]
 * (the input of the GELU that made inp; else NULL), dinp is carried through the GELU's
 * backward too, fused into the product (matmul_dgelu_backward). */
void tp_row_parallel_backward(tp_context *tp, gptc_act *dinp, float *dw /* [IC,OC] */,
                              float *dbias /* [OC] */, gptc_act *dout,
                              const gptc_act *inp /* [N,IC] */, const gptc_act *w /* [IC,OC] */,
                              int N, int IC, int OC, const gptc_act *gelu_pre, gptc_stream *s);
/* A row-parallel projection leaving a parallel region (c_proj): out[N,OC] = the TP sum
 * of inp[N,IC] @ W (+ bias, added by rank 0 only), returned as this rank's rows (see
 * tp_reduce_rows). overlap.tp = chunked cuts the rows into tp->chunks pieces and reduces
 * piece i on the TP stream while piece i+1 is multiplied. */
gptc_act *tp_row_parallel_forward(tp_context *tp, gptc_act *out, const gptc_act *inp,
                                  const gptc_act *w /* [IC,OC] */,
                                  const gptc_act *bias /* [OC] or NULL */, int N, int IC, int OC,
                                  gptc_stream *s);
/* The backward of a column-parallel projection entering a parallel region (c_attn,
 * c_fc, and the LM head): dinp[N,IC] = TP sum of dout @ W^T, returned as this rank's
 * rows; dw and dbias accumulate as in matmul_backward. Chunked like the forward above,
 * with dw computed while the last pieces are reduced. */
gptc_act *tp_column_parallel_backward(tp_context *tp, gptc_act *dinp, float *dw, float *dbias,
                                      const gptc_act *dout, const gptc_act *inp,
                                      const gptc_act *w, int N, int IC, int OC, int w_rows_out,
                                      gptc_stream *s);
/* Sum (or max) over the TP group of fp32 buf[n], in place, between the compute stream's
 * work queued before and after the call (on the TP lane, which is tied to it). */
void tp_allreduce_sum(tp_context *tp, float *buf, size_t n);
void tp_allreduce_max(tp_context *tp, float *buf, size_t n);
void tp_free(tp_context *tp);

#endif
