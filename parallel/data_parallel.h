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
    int overlap;           /* overlap.dp = bucket */
    comm_group *group;     /* NULL when size == 1 */
    comm_lane *lane;       /* the DP stream; NULL: reductions run inline */
    int next;              /* first bucket of this step not yet issued */
    gptc_event **gathered; /* [n_events] (sharded, bucket policy): each bucket's all-gather */
    int n_events;
    int n_gathered;        /* buckets whose all-gather may still be in flight */
} dp_context;

void dp_init(dp_context *dp, int size, int rank, int sharded, int overlap, comm_group *group,
             comm_lane *lane);
/* The gradients [0, ready) are final (called during the last micro-batch's backward).
 * overlap.dp = bucket: every bucket wholly inside starts its reduction on the DP stream
 * now, while backward goes on; overlap.dp = none: nothing yet. */
void dp_grads_final(dp_context *dp, gpt_model *m, size_t ready);
/* After the backward pass: the buckets not yet issued are issued, and the optimizer's
 * compute waits for all of them. A bucket is summed over the DP group in place: all of
 * it, or when sharded this rank's piece (reduce-scatter). */
void dp_finish_gradients(dp_context *dp, gpt_model *m);
/* After a sharded optimizer step: every rank's updated piece of the parameters compute
 * reads (the bf16 copy under precision = bf16) to every rank. none: the all-gathers
 * finish before the step ends; bucket: they run behind the next step's forward, in the
 * order it reads the buckets, and compute waits for each bucket only when it reaches it
 * (dp_params_needed). */
void dp_gather_params(dp_context *dp, gpt_model *m, gptc_stream *s);
/* Under bf16 with sharded optimizer state a rank's fp32 masters are current only in its
 * own pieces: this gathers the others (before a checkpoint saves them); synchronous. */
void dp_gather_masters(dp_context *dp, gpt_model *m);
/* Compute is about to read parameters [lo, hi): waits for their buckets' all-gathers. */
void dp_params_needed(dp_context *dp, gpt_model *m, size_t lo, size_t hi);
/* Waits for every all-gather still in flight (before a checkpoint reads parameters). */
void dp_params_settle(dp_context *dp, gpt_model *m);
/* Sharded optimizer state <-> the whole state in parameter layout ([n_params] each, for
 * checkpoints): gather assembles it into m_full and v_full (NULL both on a rank that takes
 * part but keeps nothing); scatter keeps this rank's pieces of one moment (0: m, 1: v). */
void dp_gather_state(dp_context *dp, gpt_model *m, float *m_full, float *v_full);
void dp_scatter_moment(dp_context *dp, gpt_model *m, int which, const float *full);
/* Whether this rank keeps any of the optimizer state of [offset, offset + n) (parameter
 * layout): all of it unless sharded, else its pieces of the buckets. */
int dp_keeps_state(const dp_context *dp, const gpt_model *m, size_t offset, size_t n);
void dp_free(dp_context *dp);

#endif
