/* Data parallelism, DDP style: the gradients of all parameters live in one flat buffer in
 * the order backward finishes them (layers/gpt.h), so a bucket is a contiguous run of
 * whole tensors that is reduced in place over the DP group. */
#ifndef GPTC_DATA_PARALLEL_H
#define GPTC_DATA_PARALLEL_H

#include <stddef.h>

#include "engine/backend.h"
#include "layers/gpt.h"

typedef struct comm_group comm_group;

typedef struct {
    size_t offset, count;  /* floats of the flat gradient buffer */
    int first_tensor, n_tensors;
} dp_bucket;

typedef struct {
    int size, rank;
    comm_group *group;     /* NULL when size == 1 */
    int n_buckets;
    dp_bucket *buckets;    /* [n_buckets] in buffer order */
} dp_context;

/* Cuts the model's tensors into buckets of about bucket_mb MiB (whole tensors; the first
 * bucket is at most 1 MiB so its reduction can start as early as possible). */
int dp_plan(dp_context *dp, const gpt_model *m, double bucket_mb, int size, int rank,
            comm_group *group);
void dp_free(dp_context *dp);
/* Sums the gradients over the DP group, bucket by bucket, in place on stream s. */
void dp_reduce_gradients(dp_context *dp, float *grads, gptc_stream *s);

#endif
