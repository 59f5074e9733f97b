/* Test tool, not part of the engine: a fake NCCL (the API of tests/cuda_emu/nccl.h) on
 * MPI and the fake CUDA runtime, so that parallel/comm_nccl.c runs on the CPU emulator
 * (gptc-train-emu-nccl, tests/test_cuda_fake_nccl.py). It is not NCCL: it shows that the
 * comm layer calls NCCL as NCCL's API says (arguments, stream order, groups, errors,
 * abort), not how NCCL itself behaves on GPUs.
 *
 * The model:
 *  - a communicator is a pair of MPI communicators of its own: one for its ops (run on
 *    stream threads), one for what the host does with it (split, destroy), so that the
 *    two never interleave collectives on one MPI communicator. MPI rank = NCCL rank.
 *  - ncclGetUniqueId puts a random nonce and the caller's MPI_COMM_WORLD rank in the id
 *    (NCCL puts its bootstrap root's address there); ncclCommInitRankConfig sends each
 *    rank's world rank to that root, which answers with the table, and every member
 *    makes the communicator with MPI_Comm_create_group, collective over the members
 *    only. So the rank that made the id must join the communicator (NCCL does not need
 *    that). ncclCommSplit is MPI_Comm_split of the parent, collective over the parent.
 *  - an op is checked when it is issued (communicator, stream, type, reduction, root or
 *    peer, the buffers inside device or pinned blocks of the fake runtime, overlaps other
 *    than NCCL's in-place forms; a refusal says why on stderr, "fake_nccl: ...") and put
 *    on the given stream of the fake runtime: it runs in stream order, on the stream's
 *    thread, after the work enqueued before it, and holds the stream until it is done,
 *    as a NCCL kernel does (and, with the fake CUPTI on, is a kernel record of the call
 *    that issued it, as NCCL's kernel launch is). The ops of one communicator run one at a time in the order
 *    they were issued, whatever their streams, as NCCL serialises a communicator's
 *    kernels: an issue order that differs between ranks deadlocks here as there.
 *  - device memory is host memory, so an op is nonblocking MPI on the buffers themselves
 *    (MPI_Iallgather, MPI_Ialltoall, MPI_Igather, MPI_Ibcast, MPI_Isend / MPI_Irecv), with
 *    MPI_Testall polled (backing off to 200 us sleeps) until done or until the
 *    communicator is aborted. Every reduction gathers all ranks' inputs and combines
 *    them on each rank in rank order, in fp32 for bf16 (widened exactly, rounded once per
 *    element, engine/bf16.h): every rank gets the same bits. NCCL's rings and trees add
 *    in other orders and round bf16 partial sums between ranks; no test here may depend
 *    on either order.
 *  - ncclGroupStart/End: the calls of a group are collected per thread and issued at the
 *    outermost ncclGroupEnd, as one job per communicator and stream, whose parts are all
 *    posted before any is waited for (so a send and a receive in one group cannot
 *    deadlock, as in NCCL).
 *  - ncclCommAbort (any thread, the watchdog's) sets the communicator's aborted flag:
 *    the op that is waiting returns, queued ones return when their stream reaches them,
 *    later calls are refused; it returns when no op of the communicator is running any
 *    more (at most 10 s), and says on stderr how many ops it made return. The MPI
 *    requests left behind are abandoned and the communicator is never freed (the
 *    process is expected to end, as after NCCL's abort).
 *  - ncclCommGetAsyncError reports what an op met: an MPI error (ncclSystemError), an
 *    abort (ncclSystemError) or the injected failure below (ncclRemoteError).
 *  - GPTC_FAKE_NCCL_FAIL=R:N: on MPI_COMM_WORLD rank R the N-th op (counted from 1 over
 *    all communicators, as they start) fails as on a lost peer connection: it records
 *    ncclRemoteError and then hangs, like a NCCL kernel whose peer is gone, until the
 *    communicator is aborted.
 *  - GPTC_FAKE_NCCL_STATS=1: the ops issued, by kind, on stderr at exit.
 * Not modelled: NCCL's algorithms, protocols, channels and CTAs (maxCTAs and CTAPolicy
 * are checked, then ignored: no SM is taken from compute, nothing runs on a device),
 * its timing, non-blocking communicators (config.blocking = 0 is refused), ncclAvg on
 * integers, fp16 and fp8 reductions, user-defined reductions, buffer registration,
 * ncclCommFinalize, ncclCommShrink, graphs, several GPUs, the detection of dead peers by
 * NCCL's proxy (a killed rank is noticed by mpirun or the watchdog here, never by the
 * fake), transfers of 2 GiB and more. */
#define _GNU_SOURCE

#include "nccl.h"

#include "emu_internal.h"
#include "engine/bf16.h"

#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { COMM_MAGIC = 0x4e43434c, COMM_DEAD = 0x44454144, ID_TAG_BASE = 17000 };

static const char ID_MAGIC[8] = "fakencl";

/* What the id carries: where the bootstrap root is, and which communicator it makes. */
typedef struct {
    char magic[8];
    uint64_t nonce;
    int root_world; /* MPI_COMM_WORLD rank of the rank that made the id */
} fake_id;

struct ncclComm {
    unsigned int magic;
    MPI_Comm ops; /* the ops' traffic, from stream threads */
    MPI_Comm ctl; /* the host's: split, destroy */
    int rank, size;
    int number; /* for messages: the n-th communicator this process made */
    pthread_mutex_t mu;
    pthread_cond_t turn; /* broadcast when next_run grows or the communicator is aborted */
    uint64_t issued;     /* jobs issued so far (the next one's number) */
    uint64_t next_run;   /* the job whose turn it is */
    atomic_int aborted;
    atomic_int running;  /* jobs on a stream thread now, waiting for their turn or running */
    atomic_int async;    /* ncclResult_t of the first failure; why is written before it */
    char why[512];
    struct ncclComm *next_dead; /* destroyed ones stay reachable (see ncclCommDestroy) */
};

typedef enum { P_ALLREDUCE, P_REDUCE_SCATTER, P_ALLGATHER, P_BROADCAST, P_REDUCE, P_SEND, P_RECV } part_kind;

/* One call, as issued. count is in elements of type: per rank's block for the
 * reduce-scatter (recvcount) and the all-gather (sendcount). */
typedef struct {
    part_kind kind;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t op;
    int peer; /* root or peer */
} part;

/* What one stream runs for one communicator: a call, or a group's calls. */
typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    uint64_t seq;
    uint32_t corr; /* the fake CUPTI's correlation id of the launching call (0: CUPTI off) */
    int n;
    part parts[];
} job;

/* ------------------------------------------------------------------ errors */

static __thread char last_error[512];

/* Refuses a call: says why on stderr (the comm layer's message has only the code) and
 * keeps it for ncclGetLastError. */
static ncclResult_t refuse(ncclResult_t rc, const char *call, const char *fmt, ...) {
    char why[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    snprintf(last_error, sizeof last_error, "fake_nccl: %s: %s", call, why);
    fprintf(stderr, "%s\n", last_error);
    fflush(stderr);
    return rc;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

/* A communicator's asynchronous failure, else this thread's last refusal (NCCL keeps one
 * string per process; here the watchdog thread asks about a stream thread's failure). */
const char *ncclGetLastError(ncclComm_t comm) {
    if (comm && (comm->magic == COMM_MAGIC || comm->magic == COMM_DEAD) &&
        atomic_load(&comm->async) != ncclSuccess)
        return comm->why;
    return last_error[0] ? last_error : "fake_nccl: no error recorded on this thread";
}

static int world_rank(void) {
    int r = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

/* Keeps the first asynchronous failure of c (later ones are its consequences). */
static void set_async(ncclComm_t c, ncclResult_t rc, const char *what) {
    pthread_mutex_lock(&c->mu);
    if (atomic_load(&c->async) == ncclSuccess) {
        snprintf(c->why, sizeof c->why, "fake_nccl: rank %d, communicator %d: %s", world_rank(),
                 c->number, what);
        atomic_store(&c->async, (int)rc);
        fprintf(stderr, "%s\n", c->why);
        fflush(stderr);
    }
    pthread_mutex_unlock(&c->mu);
}

static ncclResult_t mpi_failed(ncclComm_t c, const char *call, int rc) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
    char what[MPI_MAX_ERROR_STRING + 64];
    snprintf(what, sizeof what, "%s failed: %s", call, msg);
    if (c) set_async(c, ncclSystemError, what);
    else refuse(ncclSystemError, "MPI", "%s", what);
    return ncclSystemError;
}

/* ------------------------------------------------------------------ version, ids, config */

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return refuse(ncclInvalidArgument, "ncclGetVersion", "version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

static int mpi_ready(const char *call) {
    int init = 0, done = 0, level = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&done);
    if (!init || done) {
        refuse(ncclSystemError, call, "the fake needs MPI (initialised, not finalised)");
        return 0;
    }
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE) {
        refuse(ncclSystemError, call, "the fake's ops run MPI on stream threads: it needs "
               "MPI_THREAD_MULTIPLE");
        return 0;
    }
    return 1;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    if (!uniqueId) return refuse(ncclInvalidArgument, "ncclGetUniqueId", "uniqueId is NULL");
    if (!mpi_ready("ncclGetUniqueId")) return ncclSystemError;
    fake_id id;
    memset(&id, 0, sizeof id);
    memcpy(id.magic, ID_MAGIC, sizeof id.magic);
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&id.nonce, sizeof id.nonce, 1, f) != 1) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        id.nonce = ((uint64_t)t.tv_sec * 1000000007u) ^ (uint64_t)t.tv_nsec ^ ((uint64_t)getpid() << 32);
    }
    if (f) fclose(f);
    id.root_world = world_rank();
    memset(uniqueId, 0, sizeof *uniqueId);
    memcpy(uniqueId->internal, &id, sizeof id);
    return ncclSuccess;
}

static ncclResult_t check_config(const ncclConfig_t *c, const char *call) {
    if (!c) return ncclSuccess;
    if (c->magic != 0xcafebeef || c->size < sizeof(size_t) + 2 * sizeof(unsigned int))
        return refuse(ncclInvalidArgument, call, "config not made from NCCL_CONFIG_INITIALIZER "
                      "(magic 0x%x, size %zu)", c->magic, c->size);
    if (c->blocking != NCCL_CONFIG_UNDEF_INT && c->blocking != 1)
        return refuse(ncclInvalidArgument, call, "config.blocking = %d: non-blocking "
                      "communicators are not modelled", c->blocking);
    /* as NCCL's init.cc: a count under 1 is refused; one over its channel limit
     * (MAXCHANNELS, 64) is capped to it, and a minCTAs over maxCTAs lowered to it, with
     * no more than an NCCL_DEBUG=INFO line: not an error (the fake runs no CTAs) */
    if (c->maxCTAs != NCCL_CONFIG_UNDEF_INT && c->maxCTAs < 1)
        return refuse(ncclInvalidArgument, call, "config.maxCTAs = %d is under 1", c->maxCTAs);
    if (c->minCTAs != NCCL_CONFIG_UNDEF_INT && c->minCTAs < 1)
        return refuse(ncclInvalidArgument, call, "config.minCTAs = %d is under 1", c->minCTAs);
    if (c->CTAPolicy != NCCL_CONFIG_UNDEF_INT && c->CTAPolicy != NCCL_CTA_POLICY_DEFAULT &&
        c->CTAPolicy != NCCL_CTA_POLICY_EFFICIENCY && c->CTAPolicy != NCCL_CTA_POLICY_ZERO)
        return refuse(ncclInvalidArgument, call, "config.CTAPolicy = %d is no NCCL_CTA_POLICY_*",
                      c->CTAPolicy);
    return ncclSuccess;
}

/* ------------------------------------------------------------------ communicators */

static atomic_int comms_made;
static pthread_mutex_t dead_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *dead_comms;

/* Takes ctl (ours from now on) and makes the ops' duplicate of it. */
static ncclResult_t comm_make(MPI_Comm ctl, ncclComm_t *out, const char *call) {
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c) return refuse(ncclSystemError, call, "out of memory");
    c->ctl = ctl;
    int rc = MPI_Comm_set_errhandler(ctl, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(ctl, &c->ops);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(c->ops, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(ctl, &c->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(ctl, &c->size);
    if (rc != MPI_SUCCESS) {
        free(c);
        return mpi_failed(NULL, "MPI_Comm_dup", rc);
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->turn, NULL);
    atomic_init(&c->aborted, 0);
    atomic_init(&c->running, 0);
    atomic_init(&c->async, ncclSuccess);
    c->number = atomic_fetch_add(&comms_made, 1) + 1;
    c->magic = COMM_MAGIC;
    *out = c;
    return ncclSuccess;
}

static int comm_ok(ncclComm_t c) { return c && c->magic == COMM_MAGIC; }

static ncclResult_t check_comm(ncclComm_t c, const char *call) {
    if (!c) return refuse(ncclInvalidArgument, call, "comm is NULL");
    if (c->magic == COMM_DEAD) return refuse(ncclInvalidArgument, call, "communicator %d was destroyed", c->number);
    if (c->magic != COMM_MAGIC) return refuse(ncclInvalidArgument, call, "not a communicator");
    if (atomic_load(&c->aborted))
        return refuse(ncclInvalidUsage, call, "communicator %d was aborted", c->number);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config) {
    static const char call[] = "ncclCommInitRankConfig";
    if (!comm) return refuse(ncclInvalidArgument, call, "comm is NULL");
    *comm = NULL;
    if (!mpi_ready(call)) return ncclSystemError;
    fake_id id;
    memcpy(&id, commId.internal, sizeof id);
    if (memcmp(id.magic, ID_MAGIC, sizeof id.magic) != 0)
        return refuse(ncclInvalidArgument, call, "commId was not made by ncclGetUniqueId");
    int wsize = 0, me = world_rank();
    MPI_Comm_size(MPI_COMM_WORLD, &wsize);
    if (nranks < 1 || nranks > wsize || rank < 0 || rank >= nranks)
        return refuse(ncclInvalidArgument, call, "rank %d of %d (MPI_COMM_WORLD has %d ranks)",
                      rank, nranks, wsize);
    if (id.root_world < 0 || id.root_world >= wsize)
        return refuse(ncclInvalidArgument, call, "commId names world rank %d", id.root_world);
    ncclResult_t cr = check_config(config, call);
    if (cr != ncclSuccess) return cr;
    /* the bootstrap: every member's world rank to the root, the table back */
    int tag = ID_TAG_BASE + (int)(id.nonce % 10000u);
    int *table = malloc((size_t)nranks * sizeof *table); /* [nranks] world rank of each rank */
    if (!table) return refuse(ncclSystemError, call, "out of memory");
    for (int r = 0; r < nranks; r++) table[r] = -1;
    int rc = MPI_SUCCESS;
    if (me == id.root_world) {
        table[rank] = me;
        for (int i = 1; i < nranks && rc == MPI_SUCCESS; i++) {
            long long msg[3]; /* nonce's low bits, rank, world rank */
            rc = MPI_Recv(msg, 3, MPI_LONG_LONG, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            int r = (int)msg[1];
            if (rc == MPI_SUCCESS && (msg[0] != (long long)(id.nonce >> 1) || r < 0 || r >= nranks ||
                                      table[r] != -1)) {
                free(table);
                return refuse(ncclInvalidUsage, call, "world rank %lld joins as rank %d, which is "
                              "taken or out of range (or joins another communicator)", msg[2], r);
            }
            table[r] = (int)msg[2];
        }
        for (int r = 0; r < nranks && rc == MPI_SUCCESS; r++)
            if (table[r] != me) rc = MPI_Send(table, nranks, MPI_INT, table[r], tag, MPI_COMM_WORLD);
    } else {
        long long msg[3] = {(long long)(id.nonce >> 1), rank, me};
        rc = MPI_Send(msg, 3, MPI_LONG_LONG, id.root_world, tag, MPI_COMM_WORLD);
        if (rc == MPI_SUCCESS)
            rc = MPI_Recv(table, nranks, MPI_INT, id.root_world, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    MPI_Comm ctl = MPI_COMM_NULL;
    MPI_Group world = MPI_GROUP_NULL, members = MPI_GROUP_NULL;
    if (rc == MPI_SUCCESS) rc = MPI_Comm_group(MPI_COMM_WORLD, &world);
    if (rc == MPI_SUCCESS) rc = MPI_Group_incl(world, nranks, table, &members);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_create_group(MPI_COMM_WORLD, members, tag, &ctl);
    if (members != MPI_GROUP_NULL) MPI_Group_free(&members);
    if (world != MPI_GROUP_NULL) MPI_Group_free(&world);
    free(table);
    if (rc != MPI_SUCCESS) return mpi_failed(NULL, "the bootstrap over MPI_COMM_WORLD", rc);
    return comm_make(ctl, comm, call);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    return ncclCommInitRankConfig(comm, nranks, commId, rank, NULL);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config) {
    static const char call[] = "ncclCommSplit";
    ncclResult_t r = check_comm(comm, call);
    if (r != ncclSuccess) return r;
    if (!newcomm) return refuse(ncclInvalidArgument, call, "newcomm is NULL");
    *newcomm = NULL;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return refuse(ncclInvalidArgument, call, "color %d: negative and not NCCL_SPLIT_NOCOLOR", color);
    if ((r = check_config(config, call)) != ncclSuccess) return r;
    MPI_Comm ctl = MPI_COMM_NULL;
    int rc = MPI_Comm_split(comm->ctl, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &ctl);
    if (rc != MPI_SUCCESS) return mpi_failed(NULL, "MPI_Comm_split", rc);
    if (ctl == MPI_COMM_NULL) return ncclSuccess;
    return comm_make(ctl, newcomm, call);
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    if (!comm_ok(comm) || !count) return refuse(ncclInvalidArgument, "ncclCommCount", "bad arguments");
    *count = comm->size;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!comm_ok(comm) || !rank) return refuse(ncclInvalidArgument, "ncclCommUserRank", "bad arguments");
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    if (!asyncError) return refuse(ncclInvalidArgument, "ncclCommGetAsyncError", "asyncError is NULL");
    if (!comm || (comm->magic != COMM_MAGIC && comm->magic != COMM_DEAD))
        return refuse(ncclInvalidArgument, "ncclCommGetAsyncError", "not a communicator");
    if (comm->magic == COMM_DEAD)
        return refuse(ncclInvalidArgument, "ncclCommGetAsyncError", "communicator %d was destroyed "
                      "(a use after ncclCommDestroy)", comm->number);
    *asyncError = (ncclResult_t)atomic_load(&comm->async);
    return ncclSuccess;
}

/* Waits, at most limit_s, until no job of c is queued (done: every issued job ran) or,
 * for an abort, none runs; 0 when that happened. */
static int wait_quiet(ncclComm_t c, int for_abort, double limit_s) {
    double start = emu_now_ms();
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int quiet = for_abort ? atomic_load(&c->running) == 0 : c->next_run == c->issued;
        pthread_mutex_unlock(&c->mu);
        if (quiet) return 0;
        if (emu_now_ms() - start > limit_s * 1e3) return -1;
        struct timespec t = {0, 1000 * 1000};
        nanosleep(&t, NULL);
    }
}

/* NCCL frees the communicator once its work is done. Here it stays allocated, marked
 * destroyed, so that a late call on the handle (the watchdog's poll racing a free) is
 * reported rather than reading freed memory. */
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    static const char call[] = "ncclCommDestroy";
    if (!comm_ok(comm)) return refuse(ncclInvalidArgument, call, "not a live communicator");
    if (!atomic_load(&comm->aborted) && wait_quiet(comm, 0, 100) != 0)
        return refuse(ncclInternalError, call, "communicator %d still has ops queued after 100 s "
                      "(a stream that never reaches them?)", comm->number);
    comm->magic = COMM_DEAD;
    MPI_Comm_free(&comm->ops);
    MPI_Comm_free(&comm->ctl);
    pthread_mutex_lock(&dead_mu);
    comm->next_dead = dead_comms;
    dead_comms = comm;
    pthread_mutex_unlock(&dead_mu);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    static const char call[] = "ncclCommAbort";
    if (!comm) return ncclSuccess; /* NCCL accepts NULL */
    if (!comm_ok(comm)) return refuse(ncclInvalidArgument, call, "not a live communicator");
    int was = atomic_exchange(&comm->aborted, 1);
    pthread_mutex_lock(&comm->mu);
    pthread_cond_broadcast(&comm->turn);
    pthread_mutex_unlock(&comm->mu);
    int in_flight = atomic_load(&comm->running);
    int stuck = wait_quiet(comm, 1, 10) != 0;
    fprintf(stderr, "fake_nccl: rank %d: ncclCommAbort of communicator %d (rank %d of %d)%s: "
            "%d op(s) in flight%s\n", world_rank(), comm->number, comm->rank, comm->size,
            was ? " again" : "", in_flight,
            stuck ? ", some still running after 10 s" : in_flight ? ", all returned" : "");
    fflush(stderr);
    return ncclSuccess;
}

/* ------------------------------------------------------------------ arithmetic */

static size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

static int reducible(ncclDataType_t t, ncclRedOp_t op) {
    int flt = t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16;
    int integer = t == ncclInt32 || t == ncclInt64;
    return (op == ncclSum || op == ncclProd || op == ncclMax || op == ncclMin) ? flt || integer
         : op == ncclAvg ? flt : 0;
}

static double combine(double a, double b, ncclRedOp_t op) {
    switch (op) {
    case ncclProd: return a * b;
    case ncclMax: return b > a ? b : a;
    case ncclMin: return b < a ? b : a;
    default: return a + b;
    }
}

static float combine_f(float a, float b, ncclRedOp_t op) {
    switch (op) {
    case ncclProd: return a * b;
    case ncclMax: return b > a ? b : a;
    case ncclMin: return b < a ? b : a;
    default: return a + b;
    }
}

/* out[i] = rows[0][i] op rows[1][i] op ... in rank order; bf16 in fp32, rounded once. */
static void reduce_rows(void *out, const char *rows, int nrows, size_t count, ncclDataType_t t,
                        ncclRedOp_t op) {
    size_t row = count * type_size(t);
    for (size_t i = 0; i < count; i++) {
        if (t == ncclFloat32 || t == ncclBfloat16) {
            float acc = 0;
            for (int r = 0; r < nrows; r++) {
                float x;
                if (t == ncclBfloat16) {
                    uint16_t h;
                    memcpy(&h, rows + r * row + 2 * i, 2);
                    x = bf16_to_float(h);
                } else {
                    memcpy(&x, rows + r * row + 4 * i, 4);
                }
                acc = r ? combine_f(acc, x, op) : x;
            }
            if (op == ncclAvg) acc /= (float)nrows;
            if (t == ncclBfloat16) {
                uint16_t h = bf16_bits(acc);
                memcpy((char *)out + 2 * i, &h, 2);
            } else {
                memcpy((char *)out + 4 * i, &acc, 4);
            }
        } else if (t == ncclFloat64) {
            double acc = 0;
            for (int r = 0; r < nrows; r++) {
                double x;
                memcpy(&x, rows + r * row + 8 * i, 8);
                acc = r ? combine(acc, x, op) : x;
            }
            if (op == ncclAvg) acc /= nrows;
            memcpy((char *)out + 8 * i, &acc, 8);
        } else if (t == ncclInt32) {
            int32_t acc = 0;
            for (int r = 0; r < nrows; r++) {
                int32_t x;
                memcpy(&x, rows + r * row + 4 * i, 4);
                acc = r == 0 ? x : op == ncclProd ? acc * x : op == ncclMax ? (x > acc ? x : acc)
                    : op == ncclMin ? (x < acc ? x : acc) : acc + x;
            }
            memcpy((char *)out + 4 * i, &acc, 4);
        } else { /* ncclInt64 */
            int64_t acc = 0;
            for (int r = 0; r < nrows; r++) {
                int64_t x;
                memcpy(&x, rows + r * row + 8 * i, 8);
                acc = r == 0 ? x : op == ncclProd ? acc * x : op == ncclMax ? (x > acc ? x : acc)
                    : op == ncclMin ? (x < acc ? x : acc) : acc + x;
            }
            memcpy((char *)out + 8 * i, &acc, 8);
        }
    }
}

/* ------------------------------------------------------------------ running a job */

/* GPTC_FAKE_NCCL_FAIL=R:N, read once: the op number that fails on this rank (0: none). */
static long fail_at(void) {
    static atomic_long at = -1;
    long v = atomic_load(&at);
    if (v >= 0) return v;
    v = 0;
    const char *e = getenv("GPTC_FAKE_NCCL_FAIL");
    int r = -1;
    long n = 0;
    if (e && sscanf(e, "%d:%ld", &r, &n) == 2 && r == world_rank() && n > 0) v = n;
    atomic_store(&at, v);
    return v;
}

static atomic_long ops_started;

/* Polls until every request is done (0) or c is aborted or MPI fails (-1). */
static int wait_requests(ncclComm_t c, MPI_Request *req, int n) {
    long nap_ns = 0;
    for (;;) {
        int done = 0;
        int rc = n ? MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE) : (done = 1, MPI_SUCCESS);
        if (rc != MPI_SUCCESS) {
            mpi_failed(c, "MPI_Testall", rc);
            return -1;
        }
        if (done) return 0;
        if (atomic_load(&c->aborted)) return -1;
        /* no busy wait: on a 2-core machine the peer rank's compute needs the core */
        nap_ns = nap_ns ? (nap_ns * 2 > 200000 ? 200000 : nap_ns * 2) : 2000;
        struct timespec t = {0, nap_ns};
        nanosleep(&t, NULL);
    }
}

/* Scratch of one part: what its requests write, combined into recv once they are done. */
typedef struct {
    char *tmp;
} scratch;

static int post(ncclComm_t c, const part *p, scratch *s, MPI_Request *req, int *nreq) {
    size_t es = type_size(p->type), bytes = p->count * es;
    int b = (int)bytes, rc = MPI_SUCCESS;
    s->tmp = NULL;
    switch (p->kind) {
    case P_ALLREDUCE:
    case P_ALLGATHER:
        s->tmp = malloc(bytes * (size_t)c->size);
        if (!s->tmp) break;
        rc = MPI_Iallgather(p->send, b, MPI_BYTE, s->tmp, b, MPI_BYTE, c->ops, &req[(*nreq)++]);
        break;
    case P_REDUCE_SCATTER:
        s->tmp = malloc(bytes * (size_t)c->size);
        if (!s->tmp) break;
        rc = MPI_Ialltoall(p->send, b, MPI_BYTE, s->tmp, b, MPI_BYTE, c->ops, &req[(*nreq)++]);
        break;
    case P_REDUCE:
        if (c->rank == p->peer) {
            s->tmp = malloc(bytes * (size_t)c->size);
            if (!s->tmp) break;
        }
        rc = MPI_Igather(p->send, b, MPI_BYTE, s->tmp, b, MPI_BYTE, p->peer, c->ops, &req[(*nreq)++]);
        break;
    case P_BROADCAST:
        if (c->rank == p->peer && p->send != p->recv) memcpy(p->recv, p->send, bytes);
        rc = MPI_Ibcast(p->recv, b, MPI_BYTE, p->peer, c->ops, &req[(*nreq)++]);
        return rc == MPI_SUCCESS ? 0 : (mpi_failed(c, "MPI_Ibcast", rc), -1);
    case P_SEND:
        rc = MPI_Isend(p->send, b, MPI_BYTE, p->peer, 0, c->ops, &req[(*nreq)++]);
        return rc == MPI_SUCCESS ? 0 : (mpi_failed(c, "MPI_Isend", rc), -1);
    case P_RECV:
        rc = MPI_Irecv(p->recv, b, MPI_BYTE, p->peer, 0, c->ops, &req[(*nreq)++]);
        return rc == MPI_SUCCESS ? 0 : (mpi_failed(c, "MPI_Irecv", rc), -1);
    }
    if (!s->tmp && !(p->kind == P_REDUCE && c->rank != p->peer)) {
        set_async(c, ncclSystemError, "out of memory for an op's scratch");
        return -1;
    }
    if (rc != MPI_SUCCESS) {
        mpi_failed(c, "a nonblocking collective", rc);
        return -1;
    }
    return 0;
}

static void finish(ncclComm_t c, const part *p, scratch *s) {
    size_t bytes = p->count * type_size(p->type);
    switch (p->kind) {
    case P_ALLREDUCE:
    case P_REDUCE_SCATTER: reduce_rows(p->recv, s->tmp, c->size, p->count, p->type, p->op); break;
    case P_REDUCE:
        if (c->rank == p->peer) reduce_rows(p->recv, s->tmp, c->size, p->count, p->type, p->op);
        break;
    case P_ALLGATHER: memcpy(p->recv, s->tmp, bytes * (size_t)c->size); break;
    default: break;
    }
}

static void run_job(void *arg) {
    job *j = arg;
    ncclComm_t c = j->comm;
    uint64_t t0 = emu_cupti_now();
    atomic_fetch_add(&c->running, 1);
    /* a communicator's ops one at a time, in issue order */
    pthread_mutex_lock(&c->mu);
    while (c->next_run != j->seq && !atomic_load(&c->aborted)) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += 100 * 1000 * 1000;
        if (t.tv_nsec >= 1000000000) t.tv_sec++, t.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&c->turn, &c->mu, &t);
    }
    pthread_mutex_unlock(&c->mu);
    if (!atomic_load(&c->aborted)) {
        MPI_Request *req = calloc((size_t)j->n, sizeof *req); /* [n] at most one per part */
        scratch *s = calloc((size_t)j->n, sizeof *s);         /* [n] */
        int nreq = 0, bad = !req || !s;
        long op = atomic_fetch_add(&ops_started, 1) + 1;
        if (!bad && op == fail_at()) {
            set_async(c, ncclRemoteError, "GPTC_FAKE_NCCL_FAIL: this op lost its peer connection "
                      "(injected); it hangs until the communicator is aborted");
            /* waits like any op, for a message that never comes */
            MPI_Request never;
            static char none;
            if (MPI_Irecv(&none, 1, MPI_BYTE, c->rank, 1, c->ops, &never) == MPI_SUCCESS)
                wait_requests(c, &never, 1);
            bad = 1;
        }
        for (int i = 0; i < j->n && !bad; i++) bad = post(c, &j->parts[i], &s[i], req, &nreq) != 0;
        if (!bad && wait_requests(c, req, nreq) == 0)
            for (int i = 0; i < j->n; i++) finish(c, &j->parts[i], &s[i]);
        else if (!bad && atomic_load(&c->aborted))
            set_async(c, ncclSystemError, "an op was interrupted by ncclCommAbort");
        for (int i = 0; s && i < j->n; i++) free(s[i].tmp);
        free(s);
        free(req); /* an aborted op's requests are abandoned, not freed (MPI still owns them) */
    }
    pthread_mutex_lock(&c->mu);
    c->next_run++;
    pthread_cond_broadcast(&c->turn);
    pthread_mutex_unlock(&c->mu);
    atomic_fetch_sub(&c->running, 1);
    /* a kernel record, as NCCL's kernel makes: from the stream reaching it to its end */
    emu_cupti_work(EMU_CUPTI_KERNEL, j->corr, "ncclDevKernel_emu", 1, t0, emu_cupti_now());
    free(j);
}

/* Numbered in issue order; the stream's thread runs it when the stream reaches it. Called
 * on the issuing thread, where NCCL launches its kernel: that launch is the CUPTI API call
 * an external correlation id pushed around the NCCL call links to. */
static void start_job(job *j) {
    ncclComm_t c = j->comm;
    j->corr = emu_cupti_api();
    pthread_mutex_lock(&c->mu);
    j->seq = c->issued++;
    pthread_mutex_unlock(&c->mu);
    emu_stream_run(j->stream, run_job, j, "a fake NCCL op (fake_nccl.c)");
}

/* ------------------------------------------------------------------ issuing */

/* GPTC_FAKE_NCCL_STATS=1: at exit, one line on stderr with the ops issued by kind (and how
 * many of them bf16) and the groups, so that a test can see which calls a run made. */
static atomic_long issued_ops[7], issued_bf16[7], issued_groups;
static int stats_rank = -1;

static void print_stats(void) {
    static const char *k[] = {"allreduce", "reduce_scatter", "allgather", "broadcast", "reduce",
                              "send", "recv"};
    char line[512];
    int n = snprintf(line, sizeof line, "fake_nccl stats: rank %d:", stats_rank);
    for (int i = 0; i < 7 && n < (int)sizeof line; i++)
        n += snprintf(line + n, sizeof line - (size_t)n, " %s %ld (bf16 %ld)", k[i],
                      atomic_load(&issued_ops[i]), atomic_load(&issued_bf16[i]));
    if (n < (int)sizeof line)
        snprintf(line + n, sizeof line - (size_t)n, " groups %ld", atomic_load(&issued_groups));
    fprintf(stderr, "%s\n", line);
}

static void count(const part *p) {
    static atomic_int registered;
    if (!atomic_exchange(&registered, 1)) {
        stats_rank = world_rank();
        const char *e = getenv("GPTC_FAKE_NCCL_STATS");
        if (e && strcmp(e, "1") == 0) atexit(print_stats);
    }
    atomic_fetch_add(&issued_ops[p->kind], 1);
    if (p->type == ncclBfloat16) atomic_fetch_add(&issued_bf16[p->kind], 1);
}

static const char *part_name(part_kind k) {
    static const char *names[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather",
                                  "ncclBroadcast", "ncclReduce", "ncclSend", "ncclRecv"};
    return names[k];
}

/* Overlap of [a, a + an) and [b, b + bn). */
static int overlap(const void *a, size_t an, const void *b, size_t bn) {
    const char *x = a, *y = b;
    return an && bn && x < y + bn && y < x + an;
}

static ncclResult_t check_part(ncclComm_t c, cudaStream_t stream, const part *p) {
    const char *call = part_name(p->kind);
    ncclResult_t r = check_comm(c, call);
    if (r != ncclSuccess) return r;
    if (!emu_stream_valid(stream)) return refuse(ncclInvalidArgument, call, "not a live stream");
    size_t es = type_size(p->type);
    if (!es)
        return refuse(ncclInvalidArgument, call, "data type %d is not modelled", (int)p->type);
    int reduces = p->kind == P_ALLREDUCE || p->kind == P_REDUCE_SCATTER || p->kind == P_REDUCE;
    if (reduces && !reducible(p->type, p->op))
        return refuse(ncclInvalidArgument, call, "reduction %d on data type %d is not modelled",
                      (int)p->op, (int)p->type);
    int rooted = p->kind == P_BROADCAST || p->kind == P_REDUCE;
    int p2p = p->kind == P_SEND || p->kind == P_RECV;
    if ((rooted || p2p) && (p->peer < 0 || p->peer >= c->size))
        return refuse(ncclInvalidArgument, call, "%s %d of a communicator of %d ranks",
                      rooted ? "root" : "peer", p->peer, c->size);
    if (p->count > (size_t)INT32_MAX / es / (size_t)c->size)
        return refuse(ncclInvalidArgument, call, "%zu elements: 2 GiB or more are not modelled", p->count);
    /* what each buffer spans on this rank */
    size_t bytes = p->count * es, all = bytes * (size_t)c->size;
    size_t send_n = p->kind == P_REDUCE_SCATTER ? all : p->kind == P_RECV ? 0 : bytes;
    size_t recv_n = p->kind == P_ALLGATHER ? all : p->kind == P_SEND ? 0 : bytes;
    if (p->kind == P_BROADCAST && c->rank != p->peer) send_n = 0; /* only the root's is read */
    if (p->kind == P_REDUCE && c->rank != p->peer) recv_n = 0;   /* only the root's is written */
    char why[256];
    if (emu_check_device_range(p->send, send_n, "sendbuff", why, sizeof why) != 0 ||
        emu_check_device_range(p->recv, recv_n, "recvbuff", why, sizeof why) != 0)
        return refuse(ncclInvalidArgument, call, "%s", why);
    /* NCCL's in-place forms; other overlaps are undefined there */
    const char *s = p->send, *d = p->recv;
    int in_place = p->kind == P_ALLGATHER        ? s == d + (size_t)c->rank * bytes
                 : p->kind == P_REDUCE_SCATTER   ? d == s + (size_t)c->rank * bytes
                                                 : s == d;
    if (!in_place && overlap(s, send_n, d, recv_n))
        return refuse(ncclInvalidArgument, call, "sendbuff and recvbuff overlap other than in "
                      "NCCL's in-place form");
    return ncclSuccess;
}

/* The calls of the group being built on this thread (depth > 0). */
typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    part p;
} grouped;
static __thread int group_depth;
static __thread grouped *group_calls;
static __thread int group_n, group_cap;
static __thread ncclResult_t group_error;

static ncclResult_t issue(ncclComm_t c, cudaStream_t stream, part p) {
    ncclResult_t r = check_part(c, stream, &p);
    if (r != ncclSuccess) {
        if (group_depth && group_error == ncclSuccess) group_error = r;
        return r;
    }
    if (p.count == 0) return ncclSuccess; /* NCCL launches nothing for it either */
    count(&p);
    if (group_depth) {
        if (group_n == group_cap) {
            int cap = group_cap ? 2 * group_cap : 8;
            grouped *g = realloc(group_calls, (size_t)cap * sizeof *g);
            if (!g) return group_error = refuse(ncclSystemError, part_name(p.kind), "out of memory");
            group_calls = g;
            group_cap = cap;
        }
        group_calls[group_n++] = (grouped){c, stream, p};
        return ncclSuccess;
    }
    job *j = malloc(sizeof *j + sizeof(part));
    if (!j) return refuse(ncclSystemError, part_name(p.kind), "out of memory");
    *j = (job){.comm = c, .stream = stream, .n = 1};
    j->parts[0] = p;
    start_job(j);
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
    if (group_depth++ == 0) {
        group_n = 0;
        group_error = ncclSuccess;
    }
    return ncclSuccess;
}

/* One job per communicator and stream, in the order of each's first call. */
ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return refuse(ncclInvalidUsage, "ncclGroupEnd", "no ncclGroupStart");
    if (--group_depth) return ncclSuccess;
    ncclResult_t r = group_error;
    if (r != ncclSuccess) {
        group_n = 0;
        return r; /* NCCL drops the group's calls too */
    }
    if (group_n) atomic_fetch_add(&issued_groups, 1);
    for (int i = 0; i < group_n; i++) {
        if (!group_calls[i].comm) continue; /* taken by an earlier job */
        ncclComm_t c = group_calls[i].comm;
        cudaStream_t s = group_calls[i].stream;
        int n = 0;
        for (int k = i; k < group_n; k++) n += group_calls[k].comm == c && group_calls[k].stream == s;
        job *j = malloc(sizeof *j + (size_t)n * sizeof(part));
        if (!j) return refuse(ncclSystemError, "ncclGroupEnd", "out of memory");
        *j = (job){.comm = c, .stream = s, .n = n};
        n = 0;
        for (int k = i; k < group_n; k++)
            if (group_calls[k].comm == c && group_calls[k].stream == s) {
                j->parts[n++] = group_calls[k].p;
                group_calls[k].comm = NULL;
            }
        start_job(j);
    }
    group_n = 0;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
    return issue(comm, stream, (part){P_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0});
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
    return issue(comm, stream, (part){P_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0});
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
    return issue(comm, stream, (part){P_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0});
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    return issue(comm, stream, (part){P_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root});
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream) {
    return issue(comm, stream, (part){P_REDUCE, sendbuff, recvbuff, count, datatype, op, root});
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    return issue(comm, stream, (part){P_SEND, sendbuff, NULL, count, datatype, ncclSum, peer});
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    return issue(comm, stream, (part){P_RECV, NULL, recvbuff, count, datatype, ncclSum, peer});
}
