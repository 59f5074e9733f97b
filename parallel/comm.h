/* Communication on a group of ranks, issued on a backend stream so that it can overlap
 * with compute. Three implementations sit behind these functions: MPI on host buffers
 * (the CPU backend), NCCL on device buffers (parallel/comm_nccl.c), and MPI on host copies
 * of device buffers (the fallback for GPUs where NCCL cannot run: copies on the op's
 * stream, the MPI call on that stream's host worker, so it overlaps with compute as the
 * CPU's does).
 *
 * Rules the callers rely on:
 * - An op issued on stream s runs in s's order (CPU: on s's worker thread); on NULL it
 *   runs now on the caller. Every argument is copied when the op is issued, but the
 *   buffers and the group must stay valid until the op has run (record an event after it
 *   and wait on that event before touching the buffers or freeing the group).
 * - Collectives on one group must be issued in the same order on every rank of the group,
 *   and never run concurrently on one group: keep all collectives of a group on one stream,
 *   or order the streams with events. Different groups may run concurrently.
 * - Point-to-point transfers running concurrently between the same two ranks need distinct
 *   tags (messages with the same peer and tag are matched in issue order per thread only).
 * - MPI must be initialised with MPI_THREAD_MULTIPLE when streams are used.
 * - Errors do not abort by default: the first one is kept per group (comm_error), and
 *   callers agree on errors (comm_max_int) at points where every rank is known to arrive.
 *   A failed op in a running job cannot be agreed on (its peers may wait in it, or pair it
 *   with the next op): after comm_end_job_on_error(1) it ends the job (MPI_Abort). */
#ifndef GPTC_COMM_H
#define GPTC_COMM_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "engine/backend.h"
#include "parallel/grid.h"

/* transfers issued to (dir TM_SEND) or from (TM_RECV) a peer with a tag: n so far */
typedef struct {
    int peer, tag, dir, n;
} comm_channel;
enum { COMM_CHANNELS = 16 };

/* Tagged, so that other headers can forward-declare it as struct comm_group. */
typedef struct comm_group {
    MPI_Comm comm;
    int size, rank;         /* within the group */
    char name[8];           /* "world", "tp", "pp", "dp", "embed" */
    int id;                 /* comm_group_id */
    const gptc_backend *be; /* whose streams the ops are issued on */
    atomic_int err_state;   /* 0: no error, 1: being written, 2: err holds the first one */
    char err[MPI_MAX_ERROR_STRING + 64];
    void *nccl;             /* ncclComm_t when the group's ops run on NCCL; NULL: on MPI */
    atomic_int nccl_aborted; /* the watchdog aborted it: not to be destroyed again */
    /* Counts of the ops issued so far, which tell the timing what an op is among the other
     * ranks' (engine/timing.h: timing_match): collectives, and point-to-point transfers
     * per peer, tag and direction (the channels; past COMM_CHANNELS of them, unmatched). */
    atomic_int coll_seq;
    pthread_mutex_t channel_mu;
    int n_channels;
    comm_channel channel[COMM_CHANNELS];
} comm_group;

/* Which of the trainer's groups g is, the same number on every rank: 0 world, 1 tp, 2 pp,
 * 3 dp, 4 embed (the first and last pipeline stages' tied embedding); -1 for another. */
int comm_group_id(const comm_group *g);

/* How a device backend's groups communicate (decided once, by the first comm_world):
 * NCCL on the device's streams; or MPI on host copies when NCCL cannot serve (a build
 * without NCCL, or several ranks on one GPU with NCCL < 2.30; or GPTC_COMM=mpi, which
 * tests use to run the staged path anywhere). Host backends use MPI. */
typedef enum { COMM_MPI, COMM_NCCL, COMM_MPI_STAGED } comm_backend;
/* Options of the NCCL communicators ([overlap] comm_max_ctas, comm_cta_policy); set them
 * before comm_world. cta_policy: 0 default, 1 efficiency, 2 zero. */
typedef struct {
    int max_ctas;
    int cta_policy;
} comm_options;
void comm_set_options(const comm_options *o);
comm_backend comm_backend_in_use(void);
/* One line for the log: which backend runs and why, e.g. "nccl 2.28.3" or
 * "mpi with host staging: ranks 0 and 1 share GPU 0 and NCCL 2.28.3 is older than 2.30". */
const char *comm_backend_description(void);

/* A private duplicate of MPI_COMM_WORLD. 0 on success; -1 with comm_error(g) set. */
int comm_world(comm_group *g, const gptc_backend *be);
/* The groups of the process grid (Megatron order): tp = ranks with the same
 * (pp_rank, dp_rank); dp = same (pp_rank, tp_rank); pp = same (tp_rank, dp_rank). Group
 * rank = the rank's coordinate along that dimension. Collective over world (from
 * comm_world; the groups are split from it, NCCL's too, and take its backend); gr must
 * describe this process in a world of world's size. */
int comm_grid_groups(comm_group *world, const grid *gr, comm_group *tp, comm_group *pp,
                     comm_group *dp, char *err, size_t errlen);
/* Collective over parent: the ranks passing the same color >= 0 form a group ordered by
 * key; a rank passing color < 0 joins none (out->size is then 0). */
int comm_split(comm_group *parent, comm_group *out, const char *name, int color, int key);
/* Collective over the group; the ops issued on it must have run. */
void comm_group_free(comm_group *g);

/* In place: buf[n] on every rank becomes the elementwise sum (max) over the group. */
void comm_allreduce_sum(comm_group *g, float *buf, size_t n, gptc_stream *s);
void comm_allreduce_max(comm_group *g, float *buf, size_t n, gptc_stream *s);
/* send[size * n] -> recv[n] = this rank's block of the sum. In place when
 * recv == send + rank * n; the other blocks of send then hold unspecified values. */
void comm_reduce_scatter_sum(comm_group *g, const float *send, float *recv, size_t n,
                             gptc_stream *s);
/* send[n] -> recv[size * n], block r from group rank r. In place when
 * send == recv + rank * n. */
void comm_allgather(comm_group *g, const float *send, float *recv, size_t n, gptc_stream *s);
/* The same three on elements of the activation type of precision t (engine/backend.h):
 * float, or bfloat16 (activations under train.precision = bf16); counts are elements.
 * GPTC_FP32 is exactly the float functions above. bf16 sums: on MPI, summed in fp32 and
 * rounded to bf16 once per element (bf16 of the fp32 sum, the same on every rank); on
 * NCCL, ncclBfloat16, whose partial sums are rounded as they pass between ranks. The
 * all-gather copies the bits. */
void comm_allreduce_sum_act(comm_group *g, gptc_act *buf, size_t n, gptc_precision t,
                            gptc_stream *s);
void comm_reduce_scatter_sum_act(comm_group *g, const gptc_act *send, gptc_act *recv, size_t n,
                                 gptc_precision t, gptc_stream *s);
void comm_allgather_act(comm_group *g, const gptc_act *send, gptc_act *recv, size_t n,
                        gptc_precision t, gptc_stream *s);
void comm_broadcast(comm_group *g, void *buf, size_t bytes, int root, gptc_stream *s);
/* buf[n] (the activation type of precision t) on root becomes the sum over the group (in
 * place; bf16 as comm_allreduce_sum_act); other ranks' are read only. */
void comm_reduce_sum_act(comm_group *g, gptc_act *buf, size_t n, int root, gptc_precision t,
                         gptc_stream *s);
/* peer is a group rank */
void comm_send(comm_group *g, const void *buf, size_t bytes, int peer, int tag, gptc_stream *s);
void comm_recv(comm_group *g, void *buf, size_t bytes, int peer, int tag, gptc_stream *s);
/* Send to dst and receive from src at once, so that ranks exchanging in a ring or in pairs
 * cannot deadlock. */
void comm_sendrecv(comm_group *g, const void *sendbuf, size_t send_bytes, int dst,
                   void *recvbuf, size_t recv_bytes, int src, int tag, gptc_stream *s);

/* A parallelism's communication stream and the two events that order it with compute
 * (the default stream). Overlap policies differ only in where they call these. */
typedef struct comm_lane {
    const gptc_backend *be;
    gptc_stream *stream;        /* NULL: communication runs on the caller */
    gptc_event *ready, *done;
} comm_lane;
/* 0, or -1 if the stream or events could not be made. */
int comm_lane_init(comm_lane *l, const gptc_backend *be, int high_priority);
void comm_lane_free(comm_lane *l);
/* Work issued on the lane from now on starts after the compute issued so far. */
void comm_lane_after_compute(comm_lane *l);
/* Compute issued from now on starts after the lane's work issued so far. */
void comm_lane_join(comm_lane *l);

/* Host-side and synchronous (losses, norms, agreeing on errors). On error they return x
 * (comm_sum_doubles leaves x[0..n) as they were). */
enum { COMM_SUM_MAX = 8 };
void comm_sum_doubles(comm_group *g, double *x, int n); /* 1 <= n <= COMM_SUM_MAX */
double comm_max_double(comm_group *g, double x);
int comm_max_int(comm_group *g, int x);

/* Every rank's host bytes to rank 0 of g, one rank at a time in rank order: rank 0 calls
 * take(r, bytes, n, arg) for each rank r (its own `mine` first, uncopied), the bytes valid
 * during the call only; the others send theirs. Any size: sent in pieces (an MPI count is
 * an int), and rank 0 holds one rank's bytes at a time, not all of them. After a take
 * that fails, the rest are still received (no rank is left waiting) but not taken.
 * Returns 0, or the first nonzero take's return (on rank 0), or -1 when MPI failed
 * (comm_error). Collective. */
int comm_gather_host(comm_group *g, const void *mine, size_t n,
                     int (*take)(int rank, const void *bytes, size_t n, void *arg), void *arg);

/* This rank's clock (timing_now_ms) minus rank 0's of g, in ms, estimated NTP-style
 * from round trips with rank 0: the one with the shortest round trip, *rtt_ms, gives the
 * estimate, which is then off by at most half of it (0 and 0 on rank 0), and holds at
 * *at_ms on this rank's clock, the middle of that trip (the rounds after it may take
 * hundreds of ms on a loaded node, in which a drifting clock moves on). Collective. */
double comm_clock_offset_ms(comm_group *g, double *rtt_ms, double *at_ms);

/* For the watchdog thread (engine/watchdog.h): the first asynchronous error of a live
 * NCCL group as a message (NULL when none), and aborting every NCCL group. */
const char *comm_poll_async_errors(void);
void comm_abort_all(void);

/* The first error any op on g met, e.g. "MPI_Allreduce on dp: <MPI's message>"; NULL
 * when none. */
const char *comm_error(const comm_group *g);

/* on = 1: from now on a failed op prints "rank k: <its error>; aborting the job" and ends
 * the job on every rank (the trainer's steps); 0 (the default): it is kept, as above. */
void comm_end_job_on_error(int on);

/* Tests only: split every MPI call into pieces of at most max_count elements (0 restores
 * INT_MAX), so the path for counts above INT_MAX runs on small buffers. Call it while no
 * op is in flight. A run of gptc-train takes it from GPTC_TEST_MPI_PIECE (comm_world). */
void comm_set_max_count_for_testing(size_t max_count);

#endif
