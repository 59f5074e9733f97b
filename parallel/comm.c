/* Communication over MPI. Each op is a plain blocking MPI call made either by the caller
 * (NULL stream) or by a stream's worker thread, which is what lets it overlap with the
 * compute on the calling thread. Rules for callers are in comm.h. */
#define _POSIX_C_SOURCE 200809L
#include "parallel/comm.h"
#include "parallel/comm_nccl.h"
#include "parallel/comm_task.h"

#include "engine/bf16.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/log.h"
#include "engine/nvtx.h"

#include "engine/timing.h"
#include "engine/watchdog.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* MPI counts are int; larger transfers are cut into pieces of at most this many elements.
 * Atomic because stream threads read it while a test may have just set it. */
static atomic_size_t max_count = INT_MAX;

void comm_set_max_count_for_testing(size_t n) {
    atomic_store(&max_count, n ? n : (size_t)INT_MAX);
}

/* ---- errors ---- */

/* Keeps only the first error: later ones are usually consequences of it. The state flag
 * lets stream threads and the caller race here without a lock. */
void comm_record_error(comm_group *g, const char *call, const char *what) {
    int none = 0;
    if (!atomic_compare_exchange_strong(&g->err_state, &none, 1)) return;
    snprintf(g->err, sizeof g->err, "%s on %s: %s", call, g->name, what);
    atomic_store(&g->err_state, 2);
}

/* 1 when rc is MPI_SUCCESS; otherwise records rc and returns 0. */
static int ok(comm_group *g, const char *call, int rc) {
    if (rc == MPI_SUCCESS) return 1;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error %d", rc);
    comm_record_error(g, call, msg);
    return 0;
}

const char *comm_error(const comm_group *g) {
    return atomic_load(&g->err_state) == 2 ? g->err : NULL;
}

static atomic_int g_end_job_on_error;

void comm_end_job_on_error(int on) { atomic_store(&g_end_job_on_error, on); }

/* With comm_end_job_on_error(1), an op that failed (MPI returned an error, a message of
 * the wrong size came, NCCL refused the launch) ends the job here, on every rank, with the
 * op's one line: skipped, it would leave the peers waiting in it, or pair their op with
 * this rank's next one and go on with what it did not write. */
static void end_job_if_failed(const comm_group *g) {
    const char *e = comm_error(g);
    if (!e || !atomic_load(&g_end_job_on_error)) return;
    int world_rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    log_error("rank %d: %s; aborting the job", world_rank, e);
    comm_abort_all();
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* ---- groups ---- */

/* The named groups, by comm_group_id, and whose traffic each carries (the tied
 * embedding's is the pipeline's) */
static const struct {
    const char *name;
    timing_par par;
} GROUP_IDS[] = {{"world", TP_NONE}, {"tp", TP_TP}, {"pp", TP_PP}, {"dp", TP_DP},
                 {"embed", TP_PP}};

static void group_init(comm_group *g, const char *name, const gptc_backend *be) {
    g->comm = MPI_COMM_NULL;
    g->nccl = NULL;
    atomic_init(&g->nccl_aborted, 0);
    g->size = 0;
    g->rank = -1;
    snprintf(g->name, sizeof g->name, "%s", name);
    g->be = be;
    atomic_init(&g->err_state, 0);
    g->err[0] = '\0';
    g->id = -1;
    for (int i = 0; i < (int)(sizeof(GROUP_IDS) / sizeof(GROUP_IDS[0])); i++)
        if (strcmp(name, GROUP_IDS[i].name) == 0) g->id = i;
    atomic_init(&g->coll_seq, 0);
    pthread_mutex_init(&g->channel_mu, NULL);
    g->n_channels = 0;
}

int comm_group_id(const comm_group *g) { return g->id; }

/* The op's place among the ops of the other ranks, counted at issue (in program order,
 * which the rules at the top of comm.h make the same on every rank): the n-th collective
 * on the group, or the n-th transfer of its peer, tag and direction. Only counted with
 * kernel timing on, which every rank turns on before its groups exist. */
static timing_match match_of(comm_group *g, op_kind kind, int peer, int tag) {
    if (!timing_on() || g->id < 0 || kind == OP_SENDRECV) return timing_no_match();
    if (kind != OP_SEND && kind != OP_RECV) {
        int k = kind == OP_BROADCAST ? TM_BCAST : kind == OP_REDUCE ? TM_REDUCE : TM_COLL;
        return (timing_match){(int8_t)k, (int8_t)g->id, (int16_t)(k == TM_COLL ? -1 : peer), 0,
                              atomic_fetch_add(&g->coll_seq, 1)};
    }
    int dir = kind == OP_SEND ? TM_SEND : TM_RECV, seq = -1;
    pthread_mutex_lock(&g->channel_mu);
    int c = 0;
    while (c < g->n_channels && !(g->channel[c].peer == peer && g->channel[c].tag == tag &&
                                  g->channel[c].dir == dir))
        c++;
    if (c == g->n_channels && c < COMM_CHANNELS)
        g->channel[g->n_channels++] = (comm_channel){peer, tag, dir, 0};
    if (c < g->n_channels) seq = g->channel[c].n++;
    pthread_mutex_unlock(&g->channel_mu);
    if (seq < 0) return timing_no_match();
    return (timing_match){(int8_t)dir, (int8_t)g->id, (int16_t)peer, tag, seq};
}

/* Errors must come back as return codes: the trainer decides, on every rank, how to stop. */
static int group_adopt(comm_group *g, MPI_Comm c) {
    g->comm = c;
    if (!ok(g, "MPI_Comm_set_errhandler", MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN)))
        return -1;
    if (!ok(g, "MPI_Comm_size", MPI_Comm_size(c, &g->size))) return -1;
    if (!ok(g, "MPI_Comm_rank", MPI_Comm_rank(c, &g->rank))) return -1;
    return 0;
}

/* Stream threads call MPI beside the main thread, which only this level allows. */
static int mpi_ready(comm_group *g) {
    int initialized = 0, provided = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
        comm_record_error(g, "comm_world", "MPI is not initialised");
        return 0;
    }
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE) {
        comm_record_error(g, "comm_world", "MPI was not initialised with MPI_THREAD_MULTIPLE");
        return 0;
    }
    return 1;
}

/* ---- which library carries a device backend's traffic ---- */

static comm_options g_options;
static comm_backend g_backend = COMM_MPI;
static int g_backend_decided;
static char g_backend_text[256] = "mpi";

void comm_set_options(const comm_options *o) { g_options = *o; }
comm_backend comm_backend_in_use(void) { return g_backend; }
const char *comm_backend_description(void) { return g_backend_text; }

/* Collective over g. NCCL before 2.30 refuses two ranks on one GPU, which is exactly how
 * a one-GPU machine runs multi-rank tests, so those fall back to MPI on host copies. */
static void decide_backend(comm_group *g) {
    if (g_backend_decided) return;
    g_backend_decided = 1;
    if (!g->be->on_device) return;
    int version = comm_nccl_version();
    MPI_Comm node;
    int shared = 0, other = -1;
    if (MPI_Comm_split_type(g->comm, MPI_COMM_TYPE_SHARED, g->rank, MPI_INFO_NULL, &node) ==
        MPI_SUCCESS) {
        /* the board by its PCI bus id: ordinals say nothing when every rank has its own
         * CUDA_VISIBLE_DEVICES */
        enum { ID = 32 };
        char mine[ID] = "";
        if (!cuda_backend_pci_bus_id(mine, ID)) snprintf(mine, ID, "device %d", cuda_backend_device());
        int n = 0, me = 0;
        MPI_Comm_size(node, &n);
        MPI_Comm_rank(node, &me);
        char *ids = calloc((size_t)n, ID); /* [ranks on this node][ID] their GPU */
        if (ids && MPI_Allgather(mine, ID, MPI_CHAR, ids, ID, MPI_CHAR, node) == MPI_SUCCESS)
            for (int r = 0; r < n; r++)
                if (r != me && strncmp(ids + (size_t)r * ID, mine, ID) == 0) shared = 1, other = r;
        free(ids);
        MPI_Comm_free(&node);
    }
    shared = comm_max_int(g, shared);
    const char *multi = getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    int multi_ok = version >= 23000 && multi && strcmp(multi, "1") == 0;
    int v1 = version / 10000, v2 = version / 100 % 100, v3 = version % 100;
    const char *force = getenv("GPTC_COMM");
    if (force && strcmp(force, "mpi") == 0) {
        g_backend = COMM_MPI_STAGED;
        snprintf(g_backend_text, sizeof g_backend_text, "mpi with host staging: GPTC_COMM=mpi");
    } else if (version == 0) {
        g_backend = COMM_MPI_STAGED;
        snprintf(g_backend_text, sizeof g_backend_text, "mpi with host staging: this build has no NCCL");
    } else if (shared && !multi_ok) {
        g_backend = COMM_MPI_STAGED;
        char why[96];
        if (version < 23000) snprintf(why, sizeof why, "is older than 2.30");
        else if (!multi) snprintf(why, sizeof why, "has NCCL_MULTI_RANK_GPU_ENABLE unset");
        else snprintf(why, sizeof why, "has NCCL_MULTI_RANK_GPU_ENABLE = %.24s (1 enables it)", multi);
        snprintf(g_backend_text, sizeof g_backend_text,
                 "mpi with host staging: ranks share a GPU (e.g. this rank and node rank %d) and "
                 "NCCL %d.%d.%d %s", other, v1, v2, v3, why);
    } else {
        g_backend = COMM_NCCL;
        snprintf(g_backend_text, sizeof g_backend_text, "nccl %d.%d.%d%s", v1, v2, v3,
                 shared ? " (several ranks per GPU)" : "");
    }
    /* NCCL only if every rank can: versions or environments may differ between nodes */
    if (comm_max_int(g, g_backend == COMM_MPI_STAGED) && g_backend != COMM_MPI_STAGED) {
        g_backend = COMM_MPI_STAGED;
        snprintf(g_backend_text, sizeof g_backend_text,
                 "mpi with host staging: another rank cannot use NCCL");
    }
}

/* The live NCCL groups, for the watchdog thread: it polls their asynchronous errors and
 * aborts them all when the job must end. A poll holds g_poll_mu while it queries, and a
 * group leaves the registry under it: once comm_group_free has taken a group out, no
 * poll is still reading its communicator, which it then destroys. */
enum { MAX_NCCL_GROUPS = 16 };
static comm_group *_Atomic g_nccl_groups[MAX_NCCL_GROUPS];
static pthread_mutex_t g_poll_mu = PTHREAD_MUTEX_INITIALIZER;

static void nccl_register(comm_group *g, int add) {
    pthread_mutex_lock(&g_poll_mu);
    for (int i = 0; i < MAX_NCCL_GROUPS; i++) {
        comm_group *expect = add ? NULL : g;
        if (atomic_compare_exchange_strong(&g_nccl_groups[i], &expect, add ? g : NULL)) break;
    }
    pthread_mutex_unlock(&g_poll_mu);
}

/* ncclCommGetAsyncError does not block, so holding the lock here is brief. */
const char *comm_poll_async_errors(void) {
    const char *e = NULL;
    pthread_mutex_lock(&g_poll_mu);
    for (int i = 0; i < MAX_NCCL_GROUPS && !e; i++) {
        comm_group *g = atomic_load(&g_nccl_groups[i]);
        e = g ? comm_nccl_async_error(g) : NULL;
    }
    pthread_mutex_unlock(&g_poll_mu);
    return e;
}

void comm_abort_all(void) {
    for (int i = 0; i < MAX_NCCL_GROUPS; i++) {
        comm_group *g = atomic_exchange(&g_nccl_groups[i], NULL);
        if (g) comm_nccl_abort(g);
    }
}

/* A duplicate rather than MPI_COMM_WORLD itself, so that our error handler and our
 * messages stay apart from whatever else the program does on MPI_COMM_WORLD. */
int comm_world(comm_group *g, const gptc_backend *be) {
    group_init(g, "world", be);
    if (!mpi_ready(g)) return -1;
    MPI_Comm c;
    if (!ok(g, "MPI_Comm_dup", MPI_Comm_dup(MPI_COMM_WORLD, &c))) return -1;
    if (group_adopt(g, c) != 0) return -1;
    decide_backend(g);
    if (g_backend == COMM_NCCL) {
        char err[256];
        if (comm_nccl_world(g, &g_options, err, sizeof err) != 0) {
            comm_record_error(g, "NCCL init", err);
            return -1;
        }
        nccl_register(g, 1);
    }
    return 0;
}

void comm_group_free(comm_group *g) {
    if (g->nccl) nccl_register(g, 0);
    comm_nccl_free(g);
    if (g->comm != MPI_COMM_NULL && g->size > 0) ok(g, "MPI_Comm_free", MPI_Comm_free(&g->comm));
    g->comm = MPI_COMM_NULL;
}

/* Called on every rank of the parent, also by those that join no group: NCCL's split is
 * collective over the parent like MPI's. */
static int nccl_split(comm_group *parent, comm_group *g, int color, int key) {
    if (!parent->nccl) return 0;
    char err[256];
    if (comm_nccl_split(parent, g, color, key, &g_options, err, sizeof err) != 0) {
        comm_record_error(parent, "ncclCommSplit", err);
        return -1;
    }
    if (g->nccl) nccl_register(g, 1);
    return 0;
}

int comm_split(comm_group *parent, comm_group *out, const char *name, int color, int key) {
    group_init(out, name, parent->be);
    MPI_Comm c;
    if (!ok(parent, "MPI_Comm_split",
            MPI_Comm_split(parent->comm, color < 0 ? MPI_UNDEFINED : color, key, &c)))
        return -1;
    if (nccl_split(parent, out, color, key) != 0) return -1;
    if (c == MPI_COMM_NULL) return 0;
    return group_adopt(out, c);
}

/* Splits the group of ranks sharing `color`, ordered by `key`, and checks that it came
 * out as the grid says. */
static int split_group(comm_group *parent, comm_group *g, int color, int key, int expect_size,
                       char *err, size_t errlen) {
    MPI_Comm c;
    if (!ok(g, "MPI_Comm_split", MPI_Comm_split(parent->comm, color, key, &c)) ||
        group_adopt(g, c) != 0) {
        snprintf(err, errlen, "comm: %s", comm_error(g));
        return -1;
    }
    if (nccl_split(parent, g, color, key) != 0) {
        snprintf(err, errlen, "comm: %s", comm_error(parent));
        return -1;
    }
    if (g->size != expect_size || g->rank != key) {
        snprintf(err, errlen, "comm: %s group has size %d and rank %d, the grid says %d and %d",
                 g->name, g->size, g->rank, expect_size, key);
        return -1;
    }
    return 0;
}

int comm_grid_groups(comm_group *world, const grid *gr, comm_group *tp, comm_group *pp,
                     comm_group *dp, char *err, size_t errlen) {
    group_init(tp, "tp", world->be);
    group_init(pp, "pp", world->be);
    group_init(dp, "dp", world->be);
    if (world->size != gr->world || world->rank != gr->rank) {
        snprintf(err, errlen, "comm: the grid is for rank %d of %d, but this is MPI rank %d of %d",
                 gr->rank, gr->world, world->rank, world->size);
        return -1;
    }
    /* The splits inherit the parent's MPI_ERRORS_RETURN, so a failing split reports too;
     * colors number the other two coordinates, keys order the group along its own. */
    int rc = split_group(world, tp, gr->pp_rank * gr->dp + gr->dp_rank, gr->tp_rank, gr->tp,
                         err, errlen);
    if (rc == 0)
        rc = split_group(world, pp, gr->dp_rank * gr->tp + gr->tp_rank, gr->pp_rank, gr->pp,
                         err, errlen);
    if (rc == 0)
        rc = split_group(world, dp, gr->pp_rank * gr->tp + gr->tp_rank, gr->dp_rank, gr->dp,
                         err, errlen);
    if (rc != 0) {
        comm_group_free(tp);
        comm_group_free(pp);
        comm_group_free(dp);
    }
    return rc;
}

/* ---- the MPI calls, in pieces of at most max_count elements ---- */

static size_t piece_size(void) { return atomic_load(&max_count); }

/* At least one piece, so that an empty message is still sent and matched. */
static size_t piece_count(size_t n, size_t piece) { return n == 0 ? 1 : (n + piece - 1) / piece; }

/* Length of piece k of n; 0 past the end. */
static int piece_len(size_t n, size_t piece, size_t k) {
    size_t off = k * piece;
    if (off >= n) return 0;
    return (int)(n - off < piece ? n - off : piece);
}

static void do_allreduce(comm_group *g, float *buf /* [n] */, size_t n, MPI_Op op) {
    size_t p = piece_size();
    for (size_t k = 0; k * p < n; k++)
        if (!ok(g, "MPI_Allreduce", MPI_Allreduce(MPI_IN_PLACE, buf + k * p, piece_len(n, p, k),
                                                  MPI_FLOAT, op, g->comm)))
            return;
}

/* MPI forbids aliased buffers; in place it reduces the whole buffer and leaves the result
 * at its start, from where it moves to this rank's block. */
static void reduce_scatter_whole(comm_group *g, const float *send /* [size * n] */,
                                 float *recv /* [n] */, size_t n) {
    if (recv != send + (size_t)g->rank * n) {
        ok(g, "MPI_Reduce_scatter_block",
           MPI_Reduce_scatter_block(send, recv, (int)n, MPI_FLOAT, MPI_SUM, g->comm));
        return;
    }
    float *whole = recv - (size_t)g->rank * n;
    if (ok(g, "MPI_Reduce_scatter_block",
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
            if (!ok(g, "MPI_Reduce", rc)) return;
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
        ok(g, "MPI_Allgather", MPI_Allgather(in_place ? MPI_IN_PLACE : send, (int)n, type, recv,
                                             (int)n, type, g->comm));
        return;
    }
    if (!in_place) memcpy(mine, send, n * e);
    for (int r = 0; r < g->size; r++)
        for (size_t k = 0; k * p < n; k++)
            if (!ok(g, "MPI_Bcast", MPI_Bcast((char *)recv + ((size_t)r * n + k * p) * e,
                                              piece_len(n, p, k), type, r, g->comm)))
                return;
}

static void do_broadcast(comm_group *g, char *buf /* [bytes] */, size_t bytes, int root) {
    size_t p = piece_size();
    for (size_t k = 0; k * p < bytes; k++)
        if (!ok(g, "MPI_Bcast", MPI_Bcast(buf + k * p, piece_len(bytes, p, k), MPI_BYTE, root,
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
        if (!ok(g, "MPI_Reduce", rc)) return;
    }
}

static void do_send(comm_group *g, const char *buf /* [bytes] */, size_t bytes, int peer,
                    int tag) {
    size_t p = piece_size(), pieces = piece_count(bytes, p);
    for (size_t k = 0; k < pieces; k++)
        if (!ok(g, "MPI_Send", MPI_Send(buf + k * p, piece_len(bytes, p, k), MPI_BYTE, peer, tag,
                                        g->comm)))
            return;
}

/* A short message would otherwise pass silently and leave stale bytes in buf. */
static int check_received(comm_group *g, const char *call, const MPI_Status *st, int expect) {
    int got = 0;
    if (!ok(g, "MPI_Get_count", MPI_Get_count(st, MPI_BYTE, &got))) return 0;
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
        if (!ok(g, "MPI_Recv", MPI_Recv(buf + k * p, len, MPI_BYTE, peer, tag, g->comm, &st)) ||
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
        if (!ok(g, "MPI_Sendrecv", rc)) return;
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

/* ---- issuing on a stream ---- */


static timing_par par_of(const comm_group *g) {
    return g->id < 0 ? TP_NONE : GROUP_IDS[g->id].par;
}

static const char *op_name(const comm_task *t) {
    switch (t->kind) {
    case OP_ALLREDUCE: return t->op == MPI_MAX ? "allreduce_max" : "allreduce";
    case OP_REDUCE_SCATTER: return "reduce_scatter";
    case OP_ALLGATHER: return "allgather";
    case OP_BROADCAST: return "broadcast";
    case OP_REDUCE: return "reduce";
    case OP_SEND: return "send";
    case OP_RECV: return "recv";
    case OP_SENDRECV: return "sendrecv";
    }
    return "comm";
}

static void run_op(const comm_task *t);
static timing_work comm_work(const comm_task *t);

/* Test-only: GPTC_TEST_COMM_FAIL_OP=R:N makes the N-th op (counted from 1 over all its
 * streams) of MPI_COMM_WORLD rank R a real MPI error (a negative count) in its place, so
 * that tests can see how a failed op ends the job. */
static int fail_this_op(const comm_task *t) {
    static long fail_at = -1;
    static atomic_long ops;
    if (fail_at < 0) {
        const char *v = getenv("GPTC_TEST_COMM_FAIL_OP");
        int rank = -1, victim = -2;
        long n = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        fail_at = v && sscanf(v, "%d:%ld", &victim, &n) == 2 && victim == rank ? n : 0;
    }
    if (fail_at <= 0 || atomic_fetch_add(&ops, 1) + 1 != fail_at) return 0;
    float x = 0;
    ok(t->g, op_name(t), MPI_Allreduce(MPI_IN_PLACE, &x, -1, MPI_FLOAT, MPI_SUM, t->g->comm));
    return 1;
}

/* Test-only: GPTC_TEST_COMM_DELAY_US=n makes every op run on a stream n microseconds
 * slower (a sleep before it, inside its timed interval), like a slow network, so that tests
 * can see communication hidden behind compute on a fast machine. */
static long comm_delay_us(void) {
    static long delay = -1;
    if (delay < 0) {
        const char *v = getenv("GPTC_TEST_COMM_DELAY_US");
        delay = v ? atol(v) : 0;
    }
    return delay;
}

/* Timed on the thread that runs it, so a record is exactly the op's time on that thread
 * (for a blocking transfer that includes waiting for the peer). */
static void run_task(const comm_task *t) {
    static _Thread_local char what[64]; /* outlives the op: the watchdog may print it */
    snprintf(what, sizeof(what), "%s on %s", op_name(t), t->g->name);
    watchdog_waiting(what);
    double t0 = timing_on() ? timing_now_ms() : 0;
    long delay = t->stream ? comm_delay_us() : 0;
    if (delay > 0) {
        struct timespec ts = {delay / 1000000, (delay % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    if (!fail_this_op(t)) run_op(t);
    end_job_if_failed(t->g);
    watchdog_waiting(NULL);
    watchdog_beat();
    if (timing_on())
        timing_record_op(op_name(t), TK_COMM, par_of(t->g), t->stream, t->ctx, comm_work(t),
                         t->match, t0, timing_now_ms());
}

static void run_op(const comm_task *t) {
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

static void run_and_free(void *arg) {
    run_task(arg);
    free(arg);
}

/* ---- MPI on host copies of device buffers ---- */

/* The part of device memory an op reads and writes: where it starts and how long. */
typedef struct {
    void *dev; /* [bytes] */
    size_t bytes;
    int read, written;
} region;

static size_t elem_size(const comm_task *t) {
    return t->kind == OP_BROADCAST || t->kind == OP_SEND || t->kind == OP_RECV ||
                   t->kind == OP_SENDRECV
               ? 1
               : gptc_act_bytes(t->type);
}

/* [0] the send buffer, [1] the receive buffer; bytes 0 where the op has none */
static void regions_of(const comm_task *t, region r[2]) {
    size_t e = elem_size(t), size = (size_t)t->g->size;
    memset(r, 0, 2 * sizeof(region));
    switch (t->kind) {
    case OP_ALLREDUCE: case OP_REDUCE: case OP_BROADCAST:
        r[1] = (region){t->recv, t->recv_n * e, 1, 1};
        break;
    case OP_REDUCE_SCATTER:
        r[0] = (region){(void *)t->send, size * t->recv_n * e, 1, 0};
        r[1] = (region){t->recv, t->recv_n * e, 0, 1};
        break;
    case OP_ALLGATHER:
        r[0] = (region){(void *)t->send, t->send_n * e, 1, 0};
        r[1] = (region){t->recv, size * t->send_n * e, 0, 1};
        break;
    case OP_SEND:
        r[0] = (region){(void *)t->send, t->send_n, 1, 0};
        break;
    case OP_RECV:
        r[1] = (region){t->recv, t->recv_n, 0, 1};
        break;
    case OP_SENDRECV:
        r[0] = (region){(void *)t->send, t->send_n, 1, 0};
        r[1] = (region){t->recv, t->recv_n, 0, 1};
        break;
    }
}

/* An op's bytes as nccl-tests counts them (engine/timing.h: timing_work): the larger of
 * its two buffers (an all-gather's output, a reduce-scatter's input, an all-reduce's one
 * buffer), so that bytes over time is its "algbw" */
static timing_work comm_work(const comm_task *t) {
    region r[2];
    regions_of(t, r);
    return (timing_work){0.0, (double)(r[0].bytes > r[1].bytes ? r[0].bytes : r[1].bytes)};
}

static int contains(const region *outer, const region *inner) {
    const char *o = outer->dev, *i = inner->dev;
    return inner->bytes > 0 && i >= o && i + inner->bytes <= o + outer->bytes;
}

/* Staging buffers in host memory the device copies at full speed, reused op after op: an
 * op takes one when it is issued and gives it back from its stream once its copies back
 * have completed. The main thread takes; stream workers give back.
 *
 * Pinned memory is allocated and freed only while no staged op is in flight. cudaMallocHost
 * and cudaFreeHost take a lock of the CUDA driver that every other CUDA call of the
 * process waits for, and hold it until the device is idle; a staged op's stream meanwhile
 * spins until its worker has run the op, and the worker's next CUDA call waits for that
 * lock: a deadlock (seen on an H200 with tp2 on one GPU). Sizes are rounded up to a power
 * of two, so the pool settles within the first step and later steps never wait here. */
enum { STAGE_SLOTS = 256, STAGE_MIN_BYTES = 64 << 10 };
typedef struct {
    char *p; /* [bytes] from be->alloc_host (CUDA: pinned) */
    size_t bytes;
    int busy;
} stage_buf;
static stage_buf g_stages[STAGE_SLOTS];
static int g_stages_busy; /* slots in flight */
static pthread_mutex_t g_stage_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_stage_freed = PTHREAD_COND_INITIALIZER;

static void stage_give_back(void *arg) {
    stage_buf *b = arg;
    pthread_mutex_lock(&g_stage_mu);
    b->busy = 0;
    g_stages_busy--;
    pthread_cond_broadcast(&g_stage_freed);
    pthread_mutex_unlock(&g_stage_mu);
}

static size_t stage_round(size_t bytes) {
    size_t r = STAGE_MIN_BYTES;
    while (r < bytes && r <= SIZE_MAX / 2) r *= 2;
    return r < bytes ? bytes : r;
}

/* The smallest free buffer that fits; else, once nothing is in flight, a free slot (the
 * emptiest) reallocated to fit. Waiting needs nothing from this thread: ops in flight
 * come back as their streams reach them. */
static stage_buf *stage_take(const gptc_backend *be, size_t bytes) {
    pthread_mutex_lock(&g_stage_mu);
    stage_buf *fit = NULL, *spare = NULL;
    for (;;) {
        for (int i = 0; i < STAGE_SLOTS; i++) {
            stage_buf *b = &g_stages[i];
            if (b->busy) continue;
            if (b->bytes >= bytes && (!fit || b->bytes < fit->bytes)) fit = b;
            if (!spare || b->bytes < spare->bytes) spare = b;
        }
        if (fit || (spare && g_stages_busy == 0)) break;
        fit = spare = NULL;
        pthread_cond_wait(&g_stage_freed, &g_stage_mu);
    }
    stage_buf *b = fit ? fit : spare;
    b->busy = 1;
    g_stages_busy++;
    pthread_mutex_unlock(&g_stage_mu);
    if (fit) return b;
    if (b->p) be->release_host(b->p);
    size_t want = stage_round(bytes);
    b->p = be->alloc_host(want);
    b->bytes = b->p ? want : 0;
    if (b->p) return b;
    stage_give_back(b); /* out of host memory */
    return NULL;
}


/* Copies the regions the op reads to a staging buffer, runs the MPI op on the host and
 * copies back what it wrote, all in s's order: on NULL now, on the caller; on a stream,
 * with the MPI call on the stream's host worker while the caller goes on issuing compute.
 * An in-place op's two buffers overlap: the outer one is staged and the inner one points
 * into its copy. */
static void run_staged(comm_task t, gptc_stream *s) {
    const gptc_backend *be = t.g->be;
    region r[2];
    regions_of(&t, r);
    int inner = -1; /* which region lies inside the other, if any */
    if (contains(&r[1], &r[0])) inner = 0;
    else if (contains(&r[0], &r[1])) inner = 1;
    size_t total = (inner == 0 ? 0 : r[0].bytes) + (inner == 1 ? 0 : r[1].bytes);
    stage_buf *buf = stage_take(be, total ? total : 1);
    if (!buf) {
        /* skipping the op would leave the peers waiting in it: end the job, saying why */
        log_error("rank %d: host staging of %s on %s: no pinned host memory for %zu bytes",
                  log_rank(), op_name(&t), t.g->name, total);
        exit(EXIT_FAILURE);
    }
    char *h[2];
    h[0] = buf->p;
    h[1] = buf->p + (inner == 0 ? 0 : r[0].bytes);
    if (inner >= 0) {
        /* one copy over both: only the inner part travels where only it is read (an
         * in-place all-gather's own block) or written (an in-place reduce-scatter's) */
        int outer = 1 - inner;
        h[outer] = buf->p;
        h[inner] = buf->p + ((char *)r[inner].dev - (char *)r[outer].dev);
        if (r[outer].read) r[inner].read = 0;
        if (r[outer].written) r[inner].written = 0;
    }
    for (int k = 0; k < 2; k++)
        if (r[k].read && r[k].bytes) be->copy_async(h[k], r[k].dev, r[k].bytes, s);
    if (t.send) t.send = h[0];
    if (t.recv) t.recv = h[1];
    comm_task *copy = s ? malloc(sizeof *copy) : NULL;
    if (copy) {
        *copy = t;
        be->launch_host_func(s, run_and_free, copy);
    } else {
        be->stream_synchronize(s);
        run_task(&t);
    }
    for (int k = 0; k < 2; k++)
        if (r[k].written && r[k].bytes) be->copy_async(r[k].dev, h[k], r[k].bytes, s);
    if (s) {
        be->launch_host_func(s, stage_give_back, buf);
    } else {
        be->stream_synchronize(s);
        stage_give_back(buf);
    }
}

static void issue(comm_task t, gptc_stream *s) {
    static const int stream_of_par[] = {0, 3, 1, 2}; /* none dp tp pp: engine/timing.h */
    t.ctx = timing_context();
    t.stream = s ? stream_of_par[par_of(t.g)] : 0;
    t.match = match_of(t.g, t.kind, t.peer, t.tag);
    if (t.g->nccl) {
        /* enqueued, not run: timed by device marks around it, like a compute op */
        const gptc_backend *be = t.g->be;
        int op = timing_on() && be->timer_begin ? be->timer_begin(s) : -1;
        nvtx_push(op_name(&t));
        comm_nccl_issue(&t, s);
        end_job_if_failed(t.g);
        nvtx_pop();
        if (op >= 0) {
            be->timer_end(op, s);
            timing_record_device(op_name(&t), TK_COMM, par_of(t.g), t.stream, t.ctx,
                                 comm_work(&t), t.match, op);
        }
        watchdog_beat();
        return;
    }
    if (t.g->be->on_device) {
        run_staged(t, s);
        return;
    }
    if (!s) {
        run_task(&t);
        return;
    }
    comm_task *copy = malloc(sizeof *copy);
    if (!copy) {
        /* Skipping the op would leave the other ranks waiting in it; doing it late, after
         * the stream's earlier work, keeps the order every rank expects. */
        t.g->be->stream_synchronize(s);
        run_task(&t);
        return;
    }
    *copy = t;
    t.g->be->launch_host_func(s, run_and_free, copy);
}

void comm_allreduce_sum_act(comm_group *g, gptc_act *buf, size_t n, gptc_precision t,
                            gptc_stream *s) {
    issue((comm_task){.kind = OP_ALLREDUCE, .g = g, .recv = buf, .recv_n = n, .op = MPI_SUM,
                      .type = t},
          s);
}

void comm_allreduce_sum(comm_group *g, float *buf, size_t n, gptc_stream *s) {
    comm_allreduce_sum_act(g, buf, n, GPTC_FP32, s);
}

void comm_allreduce_max(comm_group *g, float *buf, size_t n, gptc_stream *s) {
    issue((comm_task){.kind = OP_ALLREDUCE, .g = g, .recv = buf, .recv_n = n, .op = MPI_MAX}, s);
}

void comm_reduce_scatter_sum_act(comm_group *g, const gptc_act *send, gptc_act *recv, size_t n,
                                 gptc_precision t, gptc_stream *s) {
    issue((comm_task){.kind = OP_REDUCE_SCATTER, .g = g, .send = send, .recv = recv, .recv_n = n,
                      .type = t},
          s);
}

void comm_reduce_scatter_sum(comm_group *g, const float *send, float *recv, size_t n,
                             gptc_stream *s) {
    comm_reduce_scatter_sum_act(g, send, recv, n, GPTC_FP32, s);
}

void comm_allgather_act(comm_group *g, const gptc_act *send, gptc_act *recv, size_t n,
                        gptc_precision t, gptc_stream *s) {
    issue((comm_task){.kind = OP_ALLGATHER, .g = g, .send = send, .recv = recv, .send_n = n,
                      .type = t},
          s);
}

void comm_allgather(comm_group *g, const float *send, float *recv, size_t n, gptc_stream *s) {
    comm_allgather_act(g, send, recv, n, GPTC_FP32, s);
}

void comm_broadcast(comm_group *g, void *buf, size_t bytes, int root, gptc_stream *s) {
    issue((comm_task){.kind = OP_BROADCAST, .g = g, .recv = buf, .recv_n = bytes, .peer = root},
          s);
}

void comm_reduce_sum_act(comm_group *g, gptc_act *buf, size_t n, int root, gptc_precision t,
                         gptc_stream *s) {
    issue((comm_task){.kind = OP_REDUCE, .g = g, .recv = buf, .recv_n = n, .peer = root,
                      .type = t},
          s);
}

void comm_send(comm_group *g, const void *buf, size_t bytes, int peer, int tag, gptc_stream *s) {
    issue((comm_task){.kind = OP_SEND, .g = g, .send = buf, .send_n = bytes, .peer = peer,
                      .tag = tag},
          s);
}

void comm_recv(comm_group *g, void *buf, size_t bytes, int peer, int tag, gptc_stream *s) {
    issue((comm_task){.kind = OP_RECV, .g = g, .recv = buf, .recv_n = bytes, .peer = peer,
                      .tag = tag},
          s);
}

void comm_sendrecv(comm_group *g, const void *sendbuf, size_t send_bytes, int dst,
                   void *recvbuf, size_t recv_bytes, int src, int tag, gptc_stream *s) {
    issue((comm_task){.kind = OP_SENDRECV, .g = g, .send = sendbuf, .send_n = send_bytes,
                      .peer = dst, .recv = recvbuf, .recv_n = recv_bytes, .src = src, .tag = tag},
          s);
}

/* ---- host-side reductions ---- */

/* The host-side reductions block the caller: each is one record on it (stream 0, as an
 * op run on the caller), under a name of its own so that its few bytes do not mix with
 * the gradients' all-reduces in the report. 1 when MPI_Allreduce succeeded, else 0. */
static int host_allreduce(comm_group *g, const void *in, void *out, int n, MPI_Datatype type,
                          MPI_Op op) {
    timing_match match = match_of(g, OP_ALLREDUCE, -1, 0);
    double t0 = timing_on() ? timing_now_ms() : 0;
    int rc = ok(g, "MPI_Allreduce", MPI_Allreduce(in, out, n, type, op, g->comm));
    int elem = 0;
    MPI_Type_size(type, &elem);
    if (timing_on())
        timing_record_op(op == MPI_MAX ? "host_allreduce_max" : "host_allreduce", TK_COMM,
                         par_of(g), 0, timing_context(), (timing_work){0.0, (double)n * elem},
                         match, t0, timing_now_ms());
    end_job_if_failed(g);
    return rc;
}

void comm_sum_doubles(comm_group *g, double *x, int n) {
    double sum[COMM_SUM_MAX]; /* [n]: x stays as it was if the reduction fails */
    if (n < 1 || n > COMM_SUM_MAX) {
        ok(g, "MPI_Allreduce", MPI_ERR_COUNT);
        end_job_if_failed(g);
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
                if (!ok(g, "MPI_Send", MPI_Send(&t0, 1, MPI_DOUBLE, 0, TAG, g->comm)) ||
                    !ok(g, "MPI_Recv", MPI_Recv(&t_root, 1, MPI_DOUBLE, 0, TAG, g->comm,
                                                MPI_STATUS_IGNORE))) {
                    end_job_if_failed(g);
                    break;
                }
                double t1 = timing_now_ms();
                if (t1 - t0 < best) {
                    best = t1 - t0;
                    at = (t0 + t1) / 2;
                    offset = at - t_root;
                }
            }
            ok(g, "MPI_Send", MPI_Send(&done, 1, MPI_DOUBLE, 0, TAG, g->comm));
        } else if (g->rank == 0) {
            for (;;) {
                double t = done;
                if (!ok(g, "MPI_Recv", MPI_Recv(&t, 1, MPI_DOUBLE, r, TAG, g->comm,
                                                MPI_STATUS_IGNORE)) || t == done)
                    break;
                double t_root = timing_now_ms();
                if (!ok(g, "MPI_Send", MPI_Send(&t_root, 1, MPI_DOUBLE, r, TAG, g->comm))) break;
            }
        }
        end_job_if_failed(g);
    }
    if (rtt_ms) *rtt_ms = g->rank == 0 ? 0 : best;
    if (at_ms) *at_ms = at;
    return offset;
}

/* ---- lanes ---- */

int comm_lane_init(comm_lane *l, const gptc_backend *be, int high_priority) {
    l->be = be;
    l->stream = be->stream_create(high_priority);
    l->ready = be->event_create();
    l->done = be->event_create();
    return l->stream && l->ready && l->done ? 0 : -1;
}

void comm_lane_free(comm_lane *l) {
    if (!l->be) return;
    if (l->stream) l->be->stream_destroy(l->stream);
    if (l->ready) l->be->event_destroy(l->ready);
    if (l->done) l->be->event_destroy(l->done);
    l->stream = NULL;
    l->ready = l->done = NULL;
}

void comm_lane_after_compute(comm_lane *l) {
    if (!l || !l->stream) return;
    l->be->event_record(l->ready, NULL);
    l->be->stream_wait_event(l->stream, l->ready);
}

void comm_lane_join(comm_lane *l) {
    if (!l || !l->stream) return;
    l->be->event_record(l->done, l->stream);
    l->be->stream_wait_event(NULL, l->done);
}
