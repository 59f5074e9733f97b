#include "parallel/data_parallel.h"

#include <stdlib.h>

#include "layers/optimizer.h"
#include "parallel/comm.h"

void dp_init(dp_context *dp, int size, int rank, int sharded, int overlap, comm_group *group,
             comm_lane *lane) {
    dp->lane = lane;
    dp->overlap = overlap;
    dp->next = 0;
    dp->size = size;
    dp->rank = rank;
    dp->sharded = sharded && size > 1;
    dp->group = size > 1 ? group : NULL;
}

static void issue_bucket(dp_context *dp, gpt_model *m, int b) {
    const grad_bucket *bk = &m->buckets[b];
    gptc_stream *s = dp->lane ? dp->lane->stream : NULL;
    float *whole = m->grads + bk->offset; /* [count] */
    comm_lane_after_compute(dp->lane);
    if (!dp->sharded) {
        comm_allreduce_sum(dp->group, whole, bk->count, s);
        return;
    }
    size_t lo, hi;
    gpt_bucket_piece(m, b, dp->rank, &lo, &hi);
    comm_reduce_scatter_sum(dp->group, whole, m->grads + lo, hi - lo, s);
}

/* where a bucket's last tensor ends (its padding is never written) */
static size_t bucket_data_end(const gpt_model *m, const grad_bucket *bk) {
    const param_tensor *t = &m->tensors[bk->first_tensor + bk->n_tensors - 1];
    return t->offset + t->numel;
}

void dp_grads_final(dp_context *dp, gpt_model *m, size_t ready) {
    if (!dp->group || !dp->overlap) return;
    while (dp->next < m->n_buckets && bucket_data_end(m, &m->buckets[dp->next]) <= ready)
        issue_bucket(dp, m, dp->next++);
}

void dp_finish_gradients(dp_context *dp, gpt_model *m) {
    if (!dp->group) return;
    while (dp->next < m->n_buckets) issue_bucket(dp, m, dp->next++);
    dp->next = 0;
    comm_lane_join(dp->lane);
}

void dp_gather_params(dp_context *dp, gpt_model *m, gptc_stream *compute) {
    if (!dp->sharded) return;
    int prefetch = dp->overlap && dp->lane;
    if (prefetch && !dp->gathered) {
        dp->gathered = calloc((size_t)m->n_buckets, sizeof(gptc_event *));
        for (int b = 0; dp->gathered && b < m->n_buckets; b++)
            dp->gathered[b] = dp->lane->be->event_create();
        if (dp->gathered) dp->n_events = m->n_buckets;
        else prefetch = 0;
    }
    comm_lane_after_compute(dp->lane);
    gptc_stream *s = dp->lane ? dp->lane->stream : NULL;
    /* the forward reads the buckets last to first (wte and wpe first) */
    for (int b = m->n_buckets - 1; b >= 0; b--) {
        const grad_bucket *bk = &m->buckets[b];
        size_t lo, hi;
        gpt_bucket_piece(m, b, dp->rank, &lo, &hi);
        /* what compute reads: the bf16 copy when there is one (the optimizer wrote this
         * rank's piece of it; other pieces of the fp32 masters wait for a checkpoint,
         * dp_gather_masters), else the parameters themselves */
        gptc_act *whole = gptc_act_at(m->params_act, bk->offset, m->prec); /* [count] */
        comm_allgather_act(dp->group, gptc_act_at(m->params_act, lo, m->prec), whole, hi - lo,
                           m->prec, s);
        if (prefetch) dp->lane->be->event_record(dp->gathered[b], s);
    }
    if (prefetch) dp->n_gathered = m->n_buckets;
    else comm_lane_join(dp->lane);
}

void dp_params_needed(dp_context *dp, gpt_model *m, size_t lo, size_t hi) {
    if (!dp->n_gathered) return;
    for (int b = 0; b < m->n_buckets; b++) {
        const grad_bucket *bk = &m->buckets[b];
        if (bk->offset < hi && bk->offset + bk->count > lo)
            dp->lane->be->stream_wait_event(NULL, dp->gathered[b]);
    }
}

void dp_params_settle(dp_context *dp, gpt_model *m) {
    if (!dp->n_gathered) return;
    comm_lane_join(dp->lane);
    dp->n_gathered = 0;
}

void dp_gather_masters(dp_context *dp, gpt_model *m) {
    if (!dp->sharded || m->params_act == m->params) return;
    for (int b = 0; b < m->n_buckets; b++) {
        size_t lo, hi;
        gpt_bucket_piece(m, b, dp->rank, &lo, &hi);
        float *whole = m->params + m->buckets[b].offset; /* [count] */
        comm_allgather(dp->group, m->params + lo, whole, hi - lo, NULL);
    }
}

/* A sharded bucket's state is gathered into the gradient buffer (unused between steps,
 * laid out like the parameters, on the device where there is one: NCCL reads and writes
 * device memory only) and copied from there to the host, on the ranks that want it (a
 * checkpoint's writers). The others take part in the all-gathers and keep nothing: eight
 * DP ranks each holding a 1.5B model's whole state was 50 GB of host memory a node. */
void dp_gather_state(dp_context *dp, gpt_model *m, float *m_full, float *v_full) {
    for (int b = 0; b < m->n_buckets; b++) {
        const grad_bucket *bk = &m->buckets[b];
        size_t lo, hi, state;
        optim_piece(m, b, dp->sharded ? dp->rank : 0, &lo, &hi, &state);
        if (!dp->sharded) {
            if (!m_full) continue;
            m->be->copy_to_host(m_full + lo, m->opt_m + state, (hi - lo) * sizeof(float), NULL);
            m->be->copy_to_host(v_full + lo, m->opt_v + state, (hi - lo) * sizeof(float), NULL);
            continue;
        }
        size_t all = (size_t)dp->size * (hi - lo);
        float *scratch = m->grads + bk->offset; /* [dp * (hi - lo)] */
        comm_allgather(dp->group, m->opt_m + state, scratch, hi - lo, NULL);
        if (m_full) m->be->copy_to_host(m_full + bk->offset, scratch, all * sizeof(float), NULL);
        comm_allgather(dp->group, m->opt_v + state, scratch, hi - lo, NULL);
        if (v_full) m->be->copy_to_host(v_full + bk->offset, scratch, all * sizeof(float), NULL);
    }
}

int dp_keeps_state(const dp_context *dp, const gpt_model *m, size_t offset, size_t n) {
    for (int b = 0; dp->sharded && b < m->n_buckets; b++) {
        size_t lo, hi, state;
        optim_piece(m, b, dp->rank, &lo, &hi, &state);
        if (lo < offset + n && offset < hi) return 1;
    }
    return !dp->sharded;
}

void dp_scatter_moment(dp_context *dp, gpt_model *m, int which, const float *full) {
    float *state_of = which == 0 ? m->opt_m : m->opt_v; /* [n_opt] */
    for (int b = 0; b < m->n_buckets; b++) {
        size_t lo, hi, state;
        optim_piece(m, b, dp->sharded ? dp->rank : 0, &lo, &hi, &state);
        m->be->copy_from_host(state_of + state, full + lo, (hi - lo) * sizeof(float), NULL);
    }
}

void dp_free(dp_context *dp) {
    for (int b = 0; b < dp->n_events; b++)
        if (dp->gathered[b]) dp->lane->be->event_destroy(dp->gathered[b]);
    free(dp->gathered);
    dp->gathered = NULL;
}
