/* The comm layer's host-side calls, made on the caller and blocking it: small reductions
 * of doubles and ints that every rank must agree on, the gather of every rank's host bytes
 * to rank 0 (checkpoints, the timing report), and the clock offsets that put every
 * rank's timing records on rank 0's clock. */
#define _POSIX_C_SOURCE 200809L
#include "parallel/comm.h"
#include "parallel/comm_task.h"

#include "engine/log.h"
#include "engine/nvtx.h"
#include "engine/timing.h"
#include "engine/watchdog.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The host-side reductions block the caller: each is one record on it (stream 0, as an
 * op run on the caller), under a name of its own so that its few bytes do not mix with
 * the gradients' all-reduces in the report. 1 when MPI_Allreduce succeeded, else 0. */
static int host_allreduce(comm_group *g, const void *in, void *out, int n, MPI_Datatype type,
                          MPI_Op op) {
    const char *name = op == MPI_MAX ? "host_allreduce_max" : "host_allreduce";
    /* named to the watchdog as a stream's op is: a peer lost before a step's agreement
     * leaves this rank waiting here */
    comm_waiting(name, g);
    timing_match match = comm_group_match(g, OP_ALLREDUCE, -1, 0);
    double t0 = timing_on() ? timing_now_ms() : 0;
    nvtx_push(name);
    int rc = comm_mpi_ok(g, "MPI_Allreduce", MPI_Allreduce(in, out, n, type, op, g->comm));
    nvtx_pop();
    watchdog_waiting(NULL);
    int elem = 0;
    MPI_Type_size(type, &elem);
    if (timing_on())
        timing_record_op(name, TK_COMM, comm_group_par(g), 0, timing_context(),
                         (timing_work){0.0, (double)n * elem}, match, t0, timing_now_ms());
    comm_end_job_if_failed(g);
    return rc;
}

void comm_sum_doubles(comm_group *g, double *x, int n) {
    double sum[COMM_SUM_MAX]; /* [n]: x stays as it was if the reduction fails */
    if (n < 1 || n > COMM_SUM_MAX) {
        comm_mpi_ok(g, "MPI_Allreduce", MPI_ERR_COUNT);
        comm_end_job_if_failed(g);
    } else if (host_allreduce(g, x, sum, n, MPI_DOUBLE, MPI_SUM)) {
        memcpy(x, sum, (size_t)n * sizeof(*x));
    }
}

double comm_max_double(comm_group *g, double x) {
    double max = x;
    host_allreduce(g, &x, &max, 1, MPI_DOUBLE, MPI_MAX);
    return max;
}

int comm_max_int(comm_group *g, int x) {
    int max = x;
    host_allreduce(g, &x, &max, 1, MPI_INT, MPI_MAX);
    return max;
}

int comm_gather_host(comm_group *g, const void *mine, size_t n,
                     int (*take)(int rank, const void *bytes, size_t n, void *arg), void *arg) {
    enum { TAG = 7342 };
    if (g->size == 1) return take(0, mine, n, arg);
    size_t piece = comm_mpi_piece();
    uint64_t mine64 = n, *sizes = NULL; /* [size], rank 0's */
    if (g->rank == 0) sizes = log_calloc((size_t)g->size, sizeof(*sizes), "a gather's sizes");
    comm_waiting("gather to rank 0", g);
    int ok = comm_mpi_ok(g, "MPI_Gather", MPI_Gather(&mine64, 1, MPI_UINT64_T, sizes, 1,
                                                     MPI_UINT64_T, 0, g->comm));
    int rc = 0;
    if (g->rank != 0) {
        for (size_t k = 0; ok && k * piece < n; k++)
            ok = comm_mpi_ok(g, "MPI_Send", MPI_Send((const char *)mine + k * piece,
                                                     comm_piece_len(n, piece, k), MPI_BYTE, 0,
                                                     TAG, g->comm));
    } else if (ok) {
        size_t most = 0;
        for (int r = 1; r < g->size; r++) most = sizes[r] > most ? (size_t)sizes[r] : most;
        char *buf = log_calloc(most ? most : 1, 1, "a gather's bytes"); /* [most] */
        watchdog_waiting(NULL); /* a take (a write) is no wait for a peer */
        rc = take(0, mine, n, arg);
        for (int r = 1; ok && r < g->size; r++) {
            comm_waiting("gather to rank 0", g);
            for (size_t k = 0; ok && k * piece < sizes[r]; k++)
                ok = comm_mpi_ok(g, "MPI_Recv", MPI_Recv(buf + k * piece,
                                                         comm_piece_len(sizes[r], piece, k),
                                                         MPI_BYTE, r, TAG, g->comm,
                                                         MPI_STATUS_IGNORE));
            watchdog_waiting(NULL);
            if (ok && rc == 0) rc = take(r, buf, sizes[r], arg);
            watchdog_beat(); /* one rank's bytes came */
        }
        free(buf);
    }
    watchdog_waiting(NULL);
    free(sizes);
    comm_end_job_if_failed(g);
    return ok ? rc : -1;
}

double comm_clock_offset_ms(comm_group *g, double *rtt_ms, double *at_ms) {
    /* up to 64 round trips per rank, fewer once one took under 20 us: on a loaded node a
     * rank may wait a time slice for its peer, and only the fastest trip counts */
    enum { MAX_ROUNDS = 64, TAG = 7341 };
    const double good_ms = 0.02, done = -1; /* done: the rank's last message */
    double offset = 0, best = INFINITY, at = timing_now_ms();
    for (int r = 1; r < g->size; r++) { /* one rank at a time, so that rank 0 answers at once */
        if (g->rank == r) {
            for (int i = 0; i < MAX_ROUNDS && best > good_ms; i++) {
                double t0 = timing_now_ms(), t_root = 0;
                /* a failed send: no answer will come */
                if (!comm_mpi_ok(g, "MPI_Send", MPI_Send(&t0, 1, MPI_DOUBLE, 0, TAG, g->comm)) ||
                    !comm_mpi_ok(g, "MPI_Recv", MPI_Recv(&t_root, 1, MPI_DOUBLE, 0, TAG, g->comm,
                                                MPI_STATUS_IGNORE))) {
                    comm_end_job_if_failed(g);
                    break;
                }
                double t1 = timing_now_ms();
                if (t1 - t0 < best) {
                    best = t1 - t0;
                    at = (t0 + t1) / 2;
                    offset = at - t_root;
                }
            }
            comm_mpi_ok(g, "MPI_Send", MPI_Send(&done, 1, MPI_DOUBLE, 0, TAG, g->comm));
        } else if (g->rank == 0) {
            for (;;) {
                double t = done;
                if (!comm_mpi_ok(g, "MPI_Recv", MPI_Recv(&t, 1, MPI_DOUBLE, r, TAG, g->comm,
                                                MPI_STATUS_IGNORE)) || t == done)
                    break;
                double t_root = timing_now_ms();
                if (!comm_mpi_ok(g, "MPI_Send", MPI_Send(&t_root, 1, MPI_DOUBLE, r, TAG, g->comm))) break;
            }
        }
        comm_end_job_if_failed(g);
    }
    if (rtt_ms) *rtt_ms = g->rank == 0 ? 0 : best;
    if (at_ms) *at_ms = at;
    return offset;
}

