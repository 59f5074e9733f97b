/* The executor only walks the list: every decision about order was made, and proved
 * deadlock-free, when the schedule was built. Sends and receives block (overlap.pp =
 * none); the list's order makes that safe. */
#include "parallel/pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/timing.h"
#include "parallel/comm.h"

enum { TAG_ACT = 1, TAG_GRAD = 2 }; /* one tag per direction: the lists keep each in order */

int pp_setup(pp_context *pc, const char *schedule, int pp, int v, int n_micro, int rank,
             comm_group *group, comm_group *embedding, comm_lane *lane, int async, char *err,
             size_t errlen) {
    memset(pc, 0, sizeof(*pc));
    pc->lane = lane;
    pc->async = async && lane && pp > 1;
    pc->pp = pp;
    pc->rank = rank;
    pc->v = v;
    pc->n_micro = n_micro;
    pc->group = pp > 1 ? group : NULL;
    pc->embedding = embedding && embedding->size > 1 ? embedding : NULL;
    if (pp_schedule_validate(schedule, pp, v, n_micro, err, errlen) != 0) return -1;
    pp_list *all = calloc((size_t)pp, sizeof(pp_list)); /* [pp] every rank's list */
    pc->slots = calloc((size_t)v, sizeof(int));
    if (!all || !pc->slots) {
        free(all);
        snprintf(err, errlen, "out of host memory building the pipeline schedule");
        return -1;
    }
    int rc = 0;
    for (int r = 0; r < pp && rc == 0; r++)
        rc = pp_schedule_build(schedule, pp, v, n_micro, r, &all[r], err, errlen);
    if (rc == 0) {
        pc->span = pp_schedule_span(pp, v, n_micro, all, err, errlen);
        rc = pc->span < 0 ? -1 : 0;
    }
    if (rc == 0) {
        pc->list = all[rank];
        memset(&all[rank], 0, sizeof(pp_list));
        pp_count_slots(&pc->list, v, n_micro, pc->slots);
    }
    if (rc == 0 && pc->async) {
        for (int c = 0; c < v; c++)
            if (pc->slots[c] > pc->max_slots) pc->max_slots = pc->slots[c];
        pc->slot_done = calloc((size_t)v * pc->max_slots, sizeof(gptc_event *));
        for (int k = 0; pc->slot_done && k < v * pc->max_slots && rc == 0; k++)
            if (!(pc->slot_done[k] = lane->be->event_create())) rc = -1;
        if (!pc->slot_done || rc != 0) {
            snprintf(err, errlen, "out of memory for the pipeline's events");
            rc = -1;
        }
    }
    for (int r = 0; r < pp; r++) pp_list_free(&all[r]);
    free(all);
    return rc;
}

void pp_free(pp_context *pc) {
    for (int k = 0; pc->slot_done && k < pc->v * pc->max_slots; k++)
        if (pc->slot_done[k]) pc->lane->be->event_destroy(pc->slot_done[k]);
    free(pc->slot_done);
    pc->slot_done = NULL;
    pp_list_free(&pc->list);
    free(pc->slots);
    pc->slots = NULL;
}

static gptc_event *slot_event(pp_context *pc, const pp_action *a) {
    return pc->slot_done[a->chunk * pc->max_slots + a->micro % pc->slots[a->chunk]];
}

/* A transfer runs on the PP stream once the compute before it is done. none: the next
 * compute waits for it; async: only the compute of the same slot will (wait_slot). */
static void transfer(pp_context *pc, const pp_action *a, void *buf, size_t bytes) {
    comm_lane_after_compute(pc->lane);
    gptc_stream *s = pc->lane ? pc->lane->stream : NULL;
    int tag = a->kind == PP_SEND_ACT || a->kind == PP_RECV_ACT ? TAG_ACT : TAG_GRAD;
    if (a->kind == PP_SEND_ACT || a->kind == PP_SEND_GRAD)
        comm_send(pc->group, buf, bytes, a->peer, tag, s);
    else
        comm_recv(pc->group, buf, bytes, a->peer, tag, s);
    if (pc->async) pc->lane->be->event_record(slot_event(pc, a), s);
    else comm_lane_join(pc->lane);
}

/* Before compute on a slot: every transfer issued on that slot so far has finished (the
 * stream is in order, so the slot's latest event covers the earlier ones). */
static void wait_slot(pp_context *pc, const pp_action *a) {
    if (pc->async) pc->lane->be->stream_wait_event(NULL, slot_event(pc, a));
}

void pp_run(pp_context *pc, gpt_model *m, const int32_t *inputs, const int32_t *targets,
            int mb, int T, float dloss) {
    size_t bytes = gpt_chunk_bytes(m);
    for (int i = 0; i < pc->list.n; i++) {
        const pp_action *a = &pc->list.a[i];
        size_t rows = (size_t)a->micro * mb * T;
        int backward = a->kind == PP_BWD || a->kind == PP_SEND_GRAD || a->kind == PP_RECV_GRAD;
        timing_set_context(-1, a->micro, backward ? PH_BWD : PH_FWD);
        switch (a->kind) {
        case PP_FWD:
            wait_slot(pc, a);
            gpt_chunk_forward(m, a->chunk, a->micro, inputs + rows, targets + rows, dloss);
            break;
        case PP_BWD:
            wait_slot(pc, a);
            /* backward runs in micro-batch order on every chunk: the last one is final */
            gpt_chunk_backward(m, a->chunk, a->micro, a->micro == pc->n_micro - 1);
            break;
        case PP_SEND_ACT:
            transfer(pc, a, gpt_chunk_output(m, a->chunk, a->micro), bytes);
            break;
        case PP_RECV_ACT:
            transfer(pc, a, gpt_chunk_input(m, a->chunk, a->micro), bytes);
            break;
        case PP_SEND_GRAD:
        case PP_RECV_GRAD:
            transfer(pc, a, gpt_chunk_grad(m, a->chunk, a->micro), bytes);
            break;
        }
    }
    if (pc->async) comm_lane_join(pc->lane); /* the step's last sends leave before reuse */
}

void pp_reduce_tied(pp_context *pc, gpt_model *m) {
    if (!pc->embedding) return;
    const param_tensor *wte = gpt_find_tensor(m, "wte");
    comm_lane_after_compute(pc->lane);
    comm_allreduce_sum(pc->embedding, m->grads + wte->offset, wte->numel,
                       pc->lane ? pc->lane->stream : NULL);
    comm_lane_join(pc->lane);
}
