#include "parallel/data_parallel.h"

#include "layers/optimizer.h"
#include "parallel/comm.h"

void dp_init(dp_context *dp, int size, int rank, int sharded, comm_group *group, comm_lane *lane) {
    dp->lane = lane;
    dp->size = size;
    dp->rank = rank;
    dp->sharded = sharded && size > 1;
    dp->group = size > 1 ? group : NULL;
}

void dp_reduce_gradients(dp_context *dp, gpt_model *m, gptc_stream *compute) {
    if (!dp->group) return;
    comm_lane_after_compute(dp->lane);
    gptc_stream *s = dp->lane ? dp->lane->stream : NULL;
    for (int b = 0; b < m->n_buckets; b++) {
        const grad_bucket *bk = &m->buckets[b];
        float *whole = m->grads + bk->offset; /* [count] */
        if (!dp->sharded) {
            comm_allreduce_sum(dp->group, whole, bk->count, s);
            continue;
        }
        size_t piece = bk->count / (size_t)dp->size;
        comm_reduce_scatter_sum(dp->group, whole, whole + (size_t)dp->rank * piece, piece, s);
    }
    comm_lane_join(dp->lane);
}

void dp_gather_params(dp_context *dp, gpt_model *m, gptc_stream *compute) {
    if (!dp->sharded) return;
    comm_lane_after_compute(dp->lane);
    gptc_stream *s = dp->lane ? dp->lane->stream : NULL;
    for (int b = 0; b < m->n_buckets; b++) {
        const grad_bucket *bk = &m->buckets[b];
        size_t piece = bk->count / (size_t)dp->size;
        float *whole = m->params + bk->offset; /* [count] */
        comm_allgather(dp->group, whole + (size_t)dp->rank * piece, whole, piece, s);
    }
    comm_lane_join(dp->lane);
}

/* The state of a sharded bucket is gathered on the host: the CPU backend's memory is host
 * memory (a device backend stages it). */
void dp_gather_state(dp_context *dp, gpt_model *m, float *m_full, float *v_full) {
    for (int b = 0; b < m->n_buckets; b++) {
        const grad_bucket *bk = &m->buckets[b];
        size_t lo, hi, state;
        optim_piece(m, b, dp->sharded ? dp->rank : 0, &lo, &hi, &state);
        if (!dp->sharded) {
            m->be->copy_to_host(m_full + lo, m->opt_m + state, (hi - lo) * sizeof(float), NULL);
            m->be->copy_to_host(v_full + lo, m->opt_v + state, (hi - lo) * sizeof(float), NULL);
            continue;
        }
        comm_allgather(dp->group, m->opt_m + state, m_full + bk->offset, hi - lo, NULL);
        comm_allgather(dp->group, m->opt_v + state, v_full + bk->offset, hi - lo, NULL);
    }
}

void dp_scatter_state(dp_context *dp, gpt_model *m, const float *m_full, const float *v_full) {
    for (int b = 0; b < m->n_buckets; b++) {
        size_t lo, hi, state;
        optim_piece(m, b, dp->sharded ? dp->rank : 0, &lo, &hi, &state);
        m->be->copy_from_host(m->opt_m + state, m_full + lo, (hi - lo) * sizeof(float), NULL);
        m->be->copy_from_host(m->opt_v + state, v_full + lo, (hi - lo) * sizeof(float), NULL);
    }
}
