/* The comm layer's groups: MPI communicators (and NCCL's beside them) for the world and
 * for each parallelism, the library that carries a device backend's traffic, the first
 * error of each group, and the live NCCL groups the watchdog polls. */
#define _POSIX_C_SOURCE 200809L
#include "parallel/comm.h"
#include "parallel/comm_nccl.h"
#include "parallel/comm_task.h"

#include "engine/cuda/cuda_backend.h"
#include "engine/log.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ---- */

/* Keeps only the first error: later ones are usually consequences of it. The state flag
 * lets stream threads and the caller race here without a lock. */
void comm_record_error(comm_group *g, const char *call, const char *what) {
    int none = 0;
    if (!atomic_compare_exchange_strong(&g->err_state, &none, 1)) return;
    snprintf(g->err, sizeof g->err, "%s on %s: %s", call, g->name, what);
    atomic_store(&g->err_state, 2);
}

const char *comm_error(const comm_group *g) {
    return atomic_load(&g->err_state) == 2 ? g->err : NULL;
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

timing_par comm_group_par(const comm_group *g) {
    return g->id < 0 ? TP_NONE : GROUP_IDS[g->id].par;
}

/* The op's place among the ops of the other ranks, counted at issue (in program order,
 * which the rules at the top of comm.h make the same on every rank): the n-th collective
 * on the group, or the n-th transfer of its peer, tag and direction. Only counted with
 * kernel timing on, which every rank turns on before its groups exist. */
timing_match comm_group_match(comm_group *g, op_kind kind, int peer, int tag) {
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
    if (!comm_mpi_ok(g, "MPI_Comm_set_errhandler", MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN)))
        return -1;
    if (!comm_mpi_ok(g, "MPI_Comm_size", MPI_Comm_size(c, &g->size))) return -1;
    if (!comm_mpi_ok(g, "MPI_Comm_rank", MPI_Comm_rank(c, &g->rank))) return -1;
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

/* Under g_poll_mu too: a comm_group_free on another thread that found its group taken
 * out here waits for the abort to end before it frees the communicator (it destroyed
 * one still being aborted). */
void comm_abort_all(void) {
    pthread_mutex_lock(&g_poll_mu);
    for (int i = 0; i < MAX_NCCL_GROUPS; i++) {
        comm_group *g = atomic_exchange(&g_nccl_groups[i], NULL);
        if (g) comm_nccl_abort(g);
    }
    pthread_mutex_unlock(&g_poll_mu);
}

/* A duplicate rather than MPI_COMM_WORLD itself, so that our error handler and our
 * messages stay apart from whatever else the program does on MPI_COMM_WORLD. */
int comm_world(comm_group *g, const gptc_backend *be) {
    const char *env = getenv("GPTC_TEST_MPI_PIECE");
    long piece = env ? atol(env) : 0;
    if (piece > 0) comm_set_max_count_for_testing((size_t)piece);
    group_init(g, "world", be);
    if (!mpi_ready(g)) return -1;
    if (piece > 0) /* tests: that it took (rank 0 says it) */
        log_info("test: every MPI call in pieces of at most %ld elements (GPTC_TEST_MPI_PIECE)\n",
                 piece);
    MPI_Comm c;
    if (!comm_mpi_ok(g, "MPI_Comm_dup", MPI_Comm_dup(MPI_COMM_WORLD, &c))) return -1;
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
    if (g->comm != MPI_COMM_NULL && g->size > 0) comm_mpi_ok(g, "MPI_Comm_free", MPI_Comm_free(&g->comm));
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
    if (!comm_mpi_ok(parent, "MPI_Comm_split",
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
    if (!comm_mpi_ok(g, "MPI_Comm_split", MPI_Comm_split(parent->comm, color, key, &c)) ||
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

