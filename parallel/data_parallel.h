/* Data parallelism, DDP style: the gradients of all parameters live in one flat buffer in
 * the order backward finishes them, cut into buckets of whole tensors (layers/gpt.h), so
 * a bucket is a contiguous slice that is reduced in place over the DP group.
 *
 * With overlap.dp_shard = optimizer (ZeRO-1) each bucket is padded to a multiple of the
 * DP size; a rank reduce-scatters it, keeps AdamW state for its 1/dp piece only, updates
 * that piece of the parameters, and all-gathers the updated parameters. */
#ifndef GPTC_DATA_PARALLEL_H
#define GPTC_DATA_PARALLEL_H

#include "engine/backend.h"
#include "layers/gpt.h"

typedef struct comm_group comm_group;
typedef struct comm_lane comm_lane;

typedef struct {
    int size, rank;
    int sharded;           /* ZeRO-1 */
    comm_group *group;     /* NULL when size == 1 */
    comm_lane *lane;       /* the DP stream; NULL: reductions run inline */
} dp_context;

void dp_init(dp_context *dp, int size, int rank, int sharded, comm_group *group, comm_lane *lane);
/* Sums the gradients over the DP group bucket by bucket: all of each bucket, or when
 * sharded this rank's piece (reduce-scatter). overlap.dp = none: every bucket is issued
 * on the DP stream after the backward pass, and the optimizer waits for all of them. */
void dp_reduce_gradients(dp_context *dp, gpt_model *m, gptc_stream *s);
/* After a sharded optimizer step: every rank's updated piece to every rank. */
void dp_gather_params(dp_context *dp, gpt_model *m, gptc_stream *s);
/* Sharded optimizer state <-> the whole state in parameter layout ([n_params] each, for
 * checkpoints): gather assembles it on every rank, scatter keeps this rank's pieces. */
void dp_gather_state(dp_context *dp, gpt_model *m, float *m_full, float *v_full);
void dp_scatter_state(dp_context *dp, gpt_model *m, const float *m_full, const float *v_full);

#endif
