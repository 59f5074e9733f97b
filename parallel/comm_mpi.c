/* The blocking MPI calls each op comes down to, on host memory: cut into pieces MPI's int
 * counts can carry, bf16 sums made in fp32 and rounded once. Run by the caller or by a
 * stream's worker thread (comm.c). */
#define _POSIX_C_SOURCE 200809L
#include "parallel/comm.h"
#include "parallel/comm_task.h"

#include "engine/bf16.h"
#include "engine/log.h"

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* MPI counts are int; larger transfers are cut into pieces of at most this many elements.
 * Atomic because stream threads read it while a test may have just set it. */
static atomic_size_t max_count = INT_MAX;

void comm_set_max_count_for_testing(size_t n) {
    atomic_store(&max_count, n ? n : (size_t)INT_MAX);
}

/* 1 when rc is MPI_SUCCESS; otherwise records rc and returns 0. */
int comm_mpi_ok(comm_group *g, const char *call, int rc) {
    if (rc == MPI_SUCCESS) return 1;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error %d", rc);
    comm_record_error(g, call, msg);
    return 0;
}

/* ---- the MPI calls, in pieces of at most max_count elements ---- */

static size_t piece_size(void) { return atomic_load(&max_count); }
size_t comm_mpi_piece(void) { return piece_size(); }

/* At least one piece, so that an empty message is still sent and matched. */
static size_t piece_count(size_t n, size_t piece) { return n == 0 ? 1 : (n + piece - 1) / piece; }

/* Length of piece k of n; 0 past the end. */
static int piece_len(size_t n, size_t piece, size_t k) {
    size_t off = k * piece;
    if (off >= n) return 0;
    return (int)(n - off < piece ? n - off : piece);
}
int comm_piece_len(size_t n, size_t piece, size_t k) { return piece_len(n, piece, k); }

static void do_allreduce(comm_group *g, float *buf /* [n] */, size_t n, MPI_Op op) {
    size_t p = piece_size();
    for (size_t k = 0; k * p < n; k++)
        if (!comm_mpi_ok(g, "MPI_Allreduce", MPI_Allreduce(MPI_IN_PLACE, buf + k * p, piece_len(n, p, k),
                                                  MPI_FLOAT, op, g->comm)))
            return;
}

/* MPI forbids aliased buffers; in place it reduces the whole buffer and leaves the result
 * at its start, from where it moves to this rank's block. */
static void reduce_scatter_whole(comm_group *g, const float *send /* [size * n] */,
                                 float *recv /* [n] */, size_t n) {
    if (recv != send + (size_t)g->rank * n) {
        comm_mpi_ok(g, "MPI_Reduce_scatter_block",
           MPI_Reduce_scatter_block(send, recv, (int)n, MPI_FLOAT, MPI_SUM, g->comm));
        return;
    }
    float *whole = recv - (size_t)g->rank * n;
    if (comm_mpi_ok(g, "MPI_Reduce_scatter_block",
           MPI_Reduce_scatter_block(MPI_IN_PLACE, whole, (int)n, MPI_FLOAT, MPI_SUM, g->comm)) &&
        whole != recv)
        memmove(recv, whole, n * sizeof(float));
}

/* Blocks above max_count: a piece of one block is not contiguous with the same piece of the
 * next, so each piece is reduced to its owner separately. Slower, but only blocks of 8 GB
 * and more come here. */
static void reduce_scatter_pieces(comm_group *g, const float *send /* [size * n] */,
                                  float *recv /* [n] */, size_t n) {
    int in_place = recv == send + (size_t)g->rank * n;
    size_t p = piece_size();
    for (size_t k = 0; k * p < n; k++) {
        size_t off = k * p;
        int len = piece_len(n, p, k);
        for (int r = 0; r < g->size; r++) {
            const float *piece = send + (size_t)r * n + off;
            int rc = r != g->rank
                ? MPI_Reduce(piece, NULL, len, MPI_FLOAT, MPI_SUM, r, g->comm)
                : MPI_Reduce(in_place ? MPI_IN_PLACE : piece, recv + off, len, MPI_FLOAT,
                             MPI_SUM, r, g->comm);
            if (!comm_mpi_ok(g, "MPI_Reduce", rc)) return;
        }
    }
}

static void do_reduce_scatter(comm_group *g, const float *send /* [size * n] */,
                              float *recv /* [n] */, size_t n) {
    if (n <= piece_size()) reduce_scatter_whole(g, send, recv, n);
    else reduce_scatter_pieces(g, send, recv, n);
}

/* How elements of t travel when nothing adds them: bf16 as its 16 bits. */
static MPI_Datatype mpi_type(gptc_precision t) { return t == GPTC_BF16 ? MPI_UINT16_T : MPI_FLOAT; }

/* Above max_count each rank broadcasts its block piece by piece, for the same reason as
 * reduce_scatter_pieces. */
static void do_allgather(comm_group *g, const gptc_act *send /* [n] */,
                         gptc_act *recv /* [size * n] */, size_t n, gptc_precision t) {
    size_t e = gptc_act_bytes(t);
    MPI_Datatype type = mpi_type(t);
    char *mine = (char *)recv + (size_t)g->rank * n * e;
    int in_place = send == mine;
    size_t p = piece_size();
    if (n <= p) {
        comm_mpi_ok(g, "MPI_Allgather", MPI_Allgather(in_place ? MPI_IN_PLACE : send, (int)n, type, recv,
                                             (int)n, type, g->comm));
        return;
    }
    if (!in_place) memcpy(mine, send, n * e);
    for (int r = 0; r < g->size; r++)
        for (size_t k = 0; k * p < n; k++)
            if (!comm_mpi_ok(g, "MPI_Bcast", MPI_Bcast((char *)recv + ((size_t)r * n + k * p) * e,
                                              piece_len(n, p, k), type, r, g->comm)))
                return;
}

static void do_broadcast(comm_group *g, char *buf /* [bytes] */, size_t bytes, int root) {
    size_t p = piece_size();
    for (size_t k = 0; k * p < bytes; k++)
        if (!comm_mpi_ok(g, "MPI_Bcast", MPI_Bcast(buf + k * p, piece_len(bytes, p, k), MPI_BYTE, root,
                                          g->comm)))
            return;
}

/* Sum to root, in place there (MPI_IN_PLACE); other ranks' buffers are only read. */
static void do_reduce(comm_group *g, float *buf /* [n] */, size_t n, int root) {
    size_t p = piece_size();
    for (size_t k = 0; k * p < n; k++) {
        float *piece = buf + k * p;
        int rc = g->rank == root
                     ? MPI_Reduce(MPI_IN_PLACE, piece, piece_len(n, p, k), MPI_FLOAT, MPI_SUM, root, g->comm)
                     : MPI_Reduce(piece, NULL, piece_len(n, p, k), MPI_FLOAT, MPI_SUM, root, g->comm);
        if (!comm_mpi_ok(g, "MPI_Reduce", rc)) return;
    }
}

static void do_send(comm_group *g, const char *buf /* [bytes] */, size_t bytes, int peer,
                    int tag) {
    size_t p = piece_size(), pieces = piece_count(bytes, p);
    for (size_t k = 0; k < pieces; k++)
        if (!comm_mpi_ok(g, "MPI_Send", MPI_Send(buf + k * p, piece_len(bytes, p, k), MPI_BYTE, peer, tag,
                                        g->comm)))
            return;
}

/* A short message would otherwise pass silently and leave stale bytes in buf. */
static int check_received(comm_group *g, const char *call, const MPI_Status *st, int expect) {
    int got = 0;
    if (!comm_mpi_ok(g, "MPI_Get_count", MPI_Get_count(st, MPI_BYTE, &got))) return 0;
    if (got == expect) return 1;
    char what[96];
    snprintf(what, sizeof what, "got %d bytes from rank %d, expected %d", got, st->MPI_SOURCE,
             expect);
    comm_record_error(g, call, what);
    return 0;
}

static void do_recv(comm_group *g, char *buf /* [bytes] */, size_t bytes, int peer, int tag) {
    size_t p = piece_size(), pieces = piece_count(bytes, p);
    for (size_t k = 0; k < pieces; k++) {
        MPI_Status st;
        int len = piece_len(bytes, p, k);
        if (!comm_mpi_ok(g, "MPI_Recv", MPI_Recv(buf + k * p, len, MPI_BYTE, peer, tag, g->comm, &st)) ||
            !check_received(g, "MPI_Recv", &st, len))
            return;
    }
}

/* Piece k of the send and piece k of the receive travel together. When one side has fewer
 * pieces, its extra steps use MPI_PROC_NULL (a no-op), and the partner's step k still
 * matches ours: dst receives exactly as many pieces as we send, src sends as many as we
 * receive. */
static void do_sendrecv(comm_group *g, const char *sendbuf /* [send_bytes] */, size_t send_bytes,
                        int dst, char *recvbuf /* [recv_bytes] */, size_t recv_bytes, int src,
                        int tag) {
    size_t p = piece_size();
    size_t sends = piece_count(send_bytes, p), recvs = piece_count(recv_bytes, p);
    size_t steps = sends > recvs ? sends : recvs;
    for (size_t k = 0; k < steps; k++) {
        MPI_Status st;
        int slen = piece_len(send_bytes, p, k), rlen = piece_len(recv_bytes, p, k);
        /* past a side's last piece its pointer stays put: it is not read, and pointing
         * beyond the buffer would be undefined */
        const char *sp = k < sends ? sendbuf + k * p : sendbuf;
        char *rp = k < recvs ? recvbuf + k * p : recvbuf;
        int rc = MPI_Sendrecv(sp, slen, MPI_BYTE, k < sends ? dst : MPI_PROC_NULL, tag, rp, rlen,
                              MPI_BYTE, k < recvs ? src : MPI_PROC_NULL, tag, g->comm, &st);
        if (!comm_mpi_ok(g, "MPI_Sendrecv", rc)) return;
        if (k < recvs && !check_received(g, "MPI_Sendrecv", &st, rlen)) return;
    }
}

/* ---- bf16 sums: in fp32, rounded once ---- */

/* A bf16 sum travels as fp32: each rank widens its elements (exactly), MPI sums the floats
 * and each element of the sum is rounded once, so the result is bf16 of the fp32 sum, the
 * same on every rank, whatever order MPI adds in. Summing the bf16 bits pairwise instead
 * would round every partial sum.
 * The fp32 copy is scratch of the thread that runs the op (ops of other groups run at the
 * same time on other threads; one thread runs one op at a time), kept between ops and
 * grown as needed: a fresh allocation of an activation's size per op would fault its
 * pages in again every time. It is freed when the thread ends. Failing to get it would
 * leave the peers waiting in the op, so the job ends, saying why. */
typedef struct {
    float *p; /* [n] */
    size_t n;
} wide_scratch;

static pthread_key_t g_wide_key;
static pthread_once_t g_wide_once = PTHREAD_ONCE_INIT;

static void wide_scratch_free(void *arg) {
    wide_scratch *w = arg;
    free(w->p);
    free(w);
}

static void wide_key_make(void) { pthread_key_create(&g_wide_key, wide_scratch_free); }

/* The calling thread's scratch of at least n floats, or NULL when out of memory */
static float *wide_scratch_get(size_t n) {
    pthread_once(&g_wide_once, wide_key_make);
    wide_scratch *w = pthread_getspecific(g_wide_key);
    if (!w) {
        if (!(w = calloc(1, sizeof *w))) return NULL;
        pthread_setspecific(g_wide_key, w);
    }
    if (n > w->n) {
        free(w->p);
        w->p = malloc(n * sizeof(float));
        w->n = w->p ? n : 0;
    }
    return w->p;
}

static float *widened(comm_group *g, const char *op, const uint16_t *h /* [n] */, size_t n) {
    float *f = wide_scratch_get(n ? n : 1); /* [n] */
    if (!f) {
        log_error("rank %d: bf16 %s on %s: no memory for its fp32 copy (%zu floats)",
                  log_rank(), op, g->name, n);
        exit(EXIT_FAILURE);
    }
    for (size_t i = 0; i < n; i++) f[i] = bf16_to_float(h[i]);
    return f;
}

static void narrow(uint16_t *h /* [n] */, const float *f /* [n] */, size_t n) {
    for (size_t i = 0; i < n; i++) h[i] = bf16_bits(f[i]);
}

static void do_allreduce_act(comm_group *g, gptc_act *buf /* [n] */, size_t n, gptc_precision t,
                             MPI_Op op) {
    if (t == GPTC_FP32) {
        do_allreduce(g, buf, n, op);
        return;
    }
    float *wide = widened(g, "allreduce", buf, n); /* [n] */
    do_allreduce(g, wide, n, op);
    narrow(buf, wide, n);
}

/* The fp32 copy of all of send is reduced in place, so an in-place call and the other
 * differ only in where this rank's block is rounded to. */
static void do_reduce_scatter_act(comm_group *g, const gptc_act *send /* [size * n] */,
                                  gptc_act *recv /* [n] */, size_t n, gptc_precision t) {
    if (t == GPTC_FP32) {
        do_reduce_scatter(g, send, recv, n);
        return;
    }
    float *wide = widened(g, "reduce_scatter", send, (size_t)g->size * n); /* [size * n] */
    float *mine = wide + (size_t)g->rank * n;                             /* [n] */
    do_reduce_scatter(g, wide, mine, n);
    narrow(recv, mine, n);
}

/* Only root's sum is kept, so only root rounds (other ranks' buffers are only read). */
static void do_reduce_act(comm_group *g, gptc_act *buf /* [n] */, size_t n, int root,
                          gptc_precision t) {
    if (t == GPTC_FP32) {
        do_reduce(g, buf, n, root);
        return;
    }
    float *wide = widened(g, "reduce", buf, n); /* [n] */
    do_reduce(g, wide, n, root);
    if (g->rank == root) narrow(buf, wide, n);
}

/* ---- one op ---- */

void comm_mpi_run(const comm_task *t) {
    switch (t->kind) {
    case OP_ALLREDUCE: do_allreduce_act(t->g, t->recv, t->recv_n, t->type, t->op); break;
    case OP_REDUCE_SCATTER:
        do_reduce_scatter_act(t->g, t->send, t->recv, t->recv_n, t->type);
        break;
    case OP_ALLGATHER: do_allgather(t->g, t->send, t->recv, t->send_n, t->type); break;
    case OP_BROADCAST: do_broadcast(t->g, t->recv, t->recv_n, t->peer); break;
    case OP_REDUCE: do_reduce_act(t->g, t->recv, t->recv_n, t->peer, t->type); break;
    case OP_SEND: do_send(t->g, t->send, t->send_n, t->peer, t->tag); break;
    case OP_RECV: do_recv(t->g, t->recv, t->recv_n, t->peer, t->tag); break;
    case OP_SENDRECV:
        do_sendrecv(t->g, t->send, t->send_n, t->peer, t->recv, t->recv_n, t->src, t->tag);
        break;
    }
}
