/* Pipeline parallelism: runs this rank's action list (parallel/schedule.h) for one
 * optimizer step, moving activations and their gradients between stages point to point,
 * and combines the tied embedding's gradient between the first and last stage. */
#ifndef GPTC_PIPELINE_H
#define GPTC_PIPELINE_H

#include <stddef.h>
#include <stdint.h>

#include "layers/gpt.h"
#include "parallel/schedule.h"

typedef struct comm_group comm_group;
typedef struct comm_lane comm_lane;

typedef struct {
    int pp, rank, v, n_micro;
    pp_list list;           /* this rank's actions */
    int *slots;             /* [v] activation slots each chunk needs (micro-batches live) */
    comm_group *group;      /* the pp group; NULL when pp == 1 */
    comm_group *embedding;  /* first and last stage of this (tp, dp); NULL if not one */
    comm_lane *lane;        /* the PP stream; NULL: transfers run inline */
    int async;              /* overlap.pp = async */
    gptc_event **slot_done; /* [v * max slots] last transfer issued on each slot (async) */
    int max_slots;
    long span;              /* the lists' idealised run, in units (pp_schedule_span) */
} pp_context;

/* Builds every rank's list, proves with the checker that together they complete, and
 * keeps this rank's. Returns 0 or -1 with a one-line error naming the key. */
int pp_setup(pp_context *pc, const char *schedule, int pp, int v, int n_micro, int rank,
             comm_group *group, comm_group *embedding, comm_lane *lane, int async, char *err,
             size_t errlen);
void pp_free(pp_context *pc);
/* One step's forward and backward passes of n_micro micro-batches of mb rows of T tokens
 * (inputs and targets: host [n_micro*mb, T]). The losses this rank computed (last stage
 * only) are read with gpt_loss_sum once the model's stream is synchronised.
 * overlap.pp = none: every transfer blocks compute until it is done.
 * overlap.pp = async: transfers are issued on the PP stream in list order (so receives
 * are posted as early as the list has them) and compute goes on; a forward or backward
 * waits only for the transfers of its own activation slot (its input arrived, the
 * previous micro-batch's output in that slot has left). */
void pp_run(pp_context *pc, gpt_model *m, const int32_t *inputs, const int32_t *targets,
            int mb, int T, float dloss);
/* Sums the tied wte gradient of the first and last stage (after pp_run). */
void pp_reduce_tied(pp_context *pc, gpt_model *m);

#endif
