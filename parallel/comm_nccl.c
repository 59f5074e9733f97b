/* NCCL under the comm layer: each group's communicator is split from one world
 * communicator, all created with the ncclConfig_t of [overlap] comm_max_ctas and
 * comm_cta_policy, which bound the SMs that communication takes from compute. Ops are
 * enqueued on the CUDA stream behind the gptc stream they were issued on, so the overlap
 * policies order them with compute through the same events as on the CPU.
 *
 * Point-to-point tags have no NCCL counterpart: NCCL matches sends and receives between
 * two ranks in issue order, which the pipeline schedules already keep (their lists are
 * checked for matching order). */
#include "parallel/comm_nccl.h"

#include "engine/cuda/cuda_internal.h"

#include <nccl.h>
#include <stdio.h>
#include <string.h>

int comm_nccl_version(void) {
    int v = 0;
    return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

static ncclConfig_t make_config(const comm_options *o) {
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    if (o && o->max_ctas > 0) c.maxCTAs = o->max_ctas;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    /* "zero" arrived in NCCL 2.28; with 2.27 it falls back to efficiency */
#ifdef NCCL_CTA_POLICY_ZERO
    static const int policy[] = {NCCL_CTA_POLICY_DEFAULT, NCCL_CTA_POLICY_EFFICIENCY,
                                 NCCL_CTA_POLICY_ZERO};
#else
    static const int policy[] = {NCCL_CTA_POLICY_DEFAULT, NCCL_CTA_POLICY_EFFICIENCY,
                                 NCCL_CTA_POLICY_EFFICIENCY};
#endif
    if (o && o->cta_policy > 0 && o->cta_policy < 3) c.CTAPolicy = policy[o->cta_policy];
#endif
    return c;
}

static void keep_error(comm_group *g, const char *call, ncclResult_t rc) {
    char what[MPI_MAX_ERROR_STRING];
    snprintf(what, sizeof what, "%s (%s)", ncclGetErrorString(rc),
             ncclGetLastError((ncclComm_t)g->nccl));
    comm_record_error(g, call, what);
}

int comm_nccl_world(comm_group *g, const comm_options *o, char *err, size_t errlen) {
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t rc = ncclSuccess;
    if (g->rank == 0) rc = ncclGetUniqueId(&id);
    /* every rank must reach the broadcast, also when rank 0's id failed */
    int failed = rc != ncclSuccess;
    MPI_Bcast(&failed, 1, MPI_INT, 0, g->comm);
    if (failed) {
        snprintf(err, errlen, "comm: ncclGetUniqueId failed on rank 0 (%s)", ncclGetErrorString(rc));
        return -1;
    }
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, g->comm);
    ncclConfig_t c = make_config(o);
    ncclComm_t comm = NULL;
    rc = ncclCommInitRankConfig(&comm, g->size, id, g->rank, &c);
    if (rc != ncclSuccess) {
        snprintf(err, errlen, "comm: ncclCommInitRankConfig failed on rank %d (%s: %s)", g->rank,
                 ncclGetErrorString(rc), ncclGetLastError(NULL));
        return -1;
    }
    g->nccl = comm;
    return 0;
}

int comm_nccl_split(comm_group *parent, comm_group *g, int color, int key,
                    const comm_options *o, char *err, size_t errlen) {
    ncclConfig_t c = make_config(o);
    ncclComm_t comm = NULL;
    ncclResult_t rc = ncclCommSplit((ncclComm_t)parent->nccl, color < 0 ? NCCL_SPLIT_NOCOLOR : color,
                                    key, &comm, &c);
    if (rc != ncclSuccess) {
        snprintf(err, errlen, "comm: ncclCommSplit of %s failed (%s)", g->name,
                 ncclGetErrorString(rc));
        return -1;
    }
    g->nccl = comm;
    return 0;
}

/* ncclAllReduce and friends count elements of one type: the task's type for the
 * all-reduce, reduce-scatter, all-gather and reduce (bf16 sums are NCCL's own: it rounds
 * partial sums as they pass between ranks, unlike the MPI path's one rounding);
 * byte-sized ops go as ncclChar. */
void comm_nccl_issue(const comm_task *t, gptc_stream *s) {
    comm_group *g = t->g;
    ncclComm_t c = (ncclComm_t)g->nccl;
    cudaStream_t cs = cuda_stream_of(s);
    ncclDataType_t type = t->type == GPTC_BF16 ? ncclBfloat16 : ncclFloat32;
    ncclResult_t rc = ncclSuccess;
    const char *call = "nccl";
    switch (t->kind) {
    case OP_ALLREDUCE:
        call = "ncclAllReduce";
        rc = ncclAllReduce(t->recv, t->recv, t->recv_n, type,
                           t->op == MPI_MAX ? ncclMax : ncclSum, c, cs);
        break;
    case OP_REDUCE_SCATTER:
        call = "ncclReduceScatter";
        rc = ncclReduceScatter(t->send, t->recv, t->recv_n, type, ncclSum, c, cs);
        break;
    case OP_ALLGATHER:
        call = "ncclAllGather";
        rc = ncclAllGather(t->send, t->recv, t->send_n, type, c, cs);
        break;
    case OP_BROADCAST:
        call = "ncclBroadcast";
        rc = ncclBroadcast(t->recv, t->recv, t->recv_n, ncclChar, t->peer, c, cs);
        break;
    case OP_REDUCE:
        call = "ncclReduce";
        rc = ncclReduce(t->recv, t->recv, t->recv_n, type, ncclSum, t->peer, c, cs);
        break;
    case OP_SEND:
        call = "ncclSend";
        rc = ncclSend(t->send, t->send_n, ncclChar, t->peer, c, cs);
        break;
    case OP_RECV:
        call = "ncclRecv";
        rc = ncclRecv(t->recv, t->recv_n, ncclChar, t->peer, c, cs);
        break;
    case OP_SENDRECV:
        /* one group, so that a ring of ranks each sending and receiving cannot deadlock */
        call = "ncclSend/ncclRecv";
        rc = ncclGroupStart();
        if (rc == ncclSuccess) rc = ncclSend(t->send, t->send_n, ncclChar, t->peer, c, cs);
        if (rc == ncclSuccess) rc = ncclRecv(t->recv, t->recv_n, ncclChar, t->src, c, cs);
        ncclResult_t end = ncclGroupEnd();
        if (rc == ncclSuccess) rc = end;
        break;
    }
    if (rc != ncclSuccess) keep_error(g, call, rc);
}

const char *comm_nccl_async_error(comm_group *g) {
    if (!g->nccl) return NULL;
    ncclResult_t async = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError((ncclComm_t)g->nccl, &async);
    if (rc != ncclSuccess) async = rc;
    if (async == ncclSuccess || async == ncclInProgress) return NULL;
    keep_error(g, "NCCL", async);
    return comm_error(g);
}

/* From the watchdog thread: the pointer stays (the main thread may be reading it); the
 * flag tells comm_nccl_free that the communicator is gone already. */
void comm_nccl_abort(comm_group *g) {
    if (!g->nccl || atomic_exchange(&g->nccl_aborted, 1)) return;
    ncclCommAbort((ncclComm_t)g->nccl);
}

void comm_nccl_free(comm_group *g) {
    if (!g->nccl) return;
    if (!atomic_load(&g->nccl_aborted)) ncclCommDestroy((ncclComm_t)g->nccl);
    g->nccl = NULL;
}
