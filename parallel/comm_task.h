/* One communication op as the comm layer carries it from issue to run; shared by the MPI
 * path (comm.c) and the NCCL path (comm_nccl.c). */
#ifndef GPTC_COMM_TASK_H
#define GPTC_COMM_TASK_H

#include "engine/timing.h"
#include "parallel/comm.h"

typedef enum {
    OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_BROADCAST, OP_REDUCE, OP_SEND, OP_RECV,
    OP_SENDRECV
} op_kind;

/* Everything an op needs, copied when it is issued: the caller's stack is gone by the
 * time a stream thread runs it. Counts are elements of type for the all-reduce,
 * reduce-scatter, all-gather and reduce, bytes otherwise. */
typedef struct {
    op_kind kind;
    comm_group *g;
    const void *send; /* [send_n]; reduce-scatter: [g->size * recv_n]; NULL if the op has none */
    void *recv;       /* [recv_n]; all-gather: [g->size * send_n]; NULL for a send */
    size_t send_n, recv_n;
    MPI_Op op; /* of the all-reduce */
    gptc_precision type; /* element type of the all-reduce, reduce-scatter, all-gather, reduce */
    int peer;  /* root (broadcast), destination (send, sendrecv) or source (recv) */
    int src;   /* source of sendrecv */
    int tag;
    timing_ctx ctx; /* what compute was doing when the op was issued */
    timing_match match; /* what the op is among the other ranks' */
    int stream;     /* timing's stream number: 0 when run on the caller */
} comm_task;

/* g's error becomes "call on <group>: what" unless it has one already (comm_error). */
void comm_record_error(comm_group *g, const char *call, const char *what);

#endif
