#include "parallel/data_parallel.h"

#include <stdlib.h>

#include "parallel/comm.h"

int dp_plan(dp_context *dp, const gpt_model *m, double bucket_mb, int size, int rank,
            comm_group *group) {
    dp->size = size;
    dp->rank = rank;
    dp->group = size > 1 ? group : NULL;
    dp->n_buckets = 0;
    dp->buckets = calloc((size_t)m->n_tensors, sizeof(dp_bucket));
    if (!dp->buckets) return -1;
    size_t cap = (size_t)(bucket_mb * 1048576.0 / sizeof(float));
    size_t first_cap = cap < 262144 ? cap : 262144; /* 1 MiB of floats */
    dp_bucket *b = NULL;
    for (int i = 0; i < m->n_tensors; i++) {
        const param_tensor *t = &m->tensors[i];
        size_t limit = dp->n_buckets <= 1 ? first_cap : cap;
        if (!b || (b->count > 0 && b->count + t->numel > limit)) {
            b = &dp->buckets[dp->n_buckets++];
            b->offset = t->offset;
            b->first_tensor = i;
        }
        b->count += t->numel;
        b->n_tensors++;
    }
    return 0;
}

void dp_free(dp_context *dp) {
    free(dp->buckets);
    dp->buckets = NULL;
    dp->n_buckets = 0;
}

void dp_reduce_gradients(dp_context *dp, float *grads, gptc_stream *s) {
    if (!dp->group) return;
    for (int i = 0; i < dp->n_buckets; i++)
        comm_allreduce_sum(dp->group, grads + dp->buckets[i].offset, dp->buckets[i].count, s);
}
