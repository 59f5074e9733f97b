/* One communication op as the comm layer carries it from issue to run, and what the comm
 * layer's files share: the issuing (comm.c), the groups (comm_group.c), the MPI calls
 * (comm_mpi.c), the host-side calls (comm_host.c) and the NCCL path (comm_nccl.c). Not for
 * callers outside the layer: they have comm.h. */
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

/* 1 when rc is MPI_SUCCESS; otherwise records rc as g's error and returns 0. */
int comm_mpi_ok(comm_group *g, const char *call, int rc);

/* The most elements one MPI call moves: INT_MAX, or less in tests (comm_mpi.c). */
size_t comm_mpi_piece(void);
/* Length of piece k of n elements cut into pieces of `piece`; 0 past the end (comm_mpi.c). */
int comm_piece_len(size_t n, size_t piece, size_t k);

/* Runs t's MPI calls on host memory, blocking until they are done (comm_mpi.c). */
void comm_mpi_run(const comm_task *t);

/* Ends the job if g has an error and comm_end_job_on_error(1) was called (comm.c). */
void comm_end_job_if_failed(const comm_group *g);

/* Tells the watchdog that the calling thread now waits in "op on <group>" (comm.c); the
 * op clears it with watchdog_waiting(NULL). */
void comm_waiting(const char *op, const comm_group *g);

/* Whose traffic g carries, for timing (comm_group.c). */
timing_par comm_group_par(const comm_group *g);

/* The op's place among the other ranks' ops, counted at issue (comm_group.c). */
timing_match comm_group_match(comm_group *g, op_kind kind, int peer, int tag);

#endif
