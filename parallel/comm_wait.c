/* How long each communication op of the run waited for the other ranks, found after the
 * run from the kept records of every rank (profile.timing = kernel).
 *
 * An op cannot finish before its last participant has started it: a receive waits for the
 * send it matches, a send (past MPI's eager limit, and always on NCCL) for the receive,
 * a collective for its group's last member. So the first
 *     wait = (latest start among the other participants) - (this op's start)
 * of an op, clamped to [0, its duration], was spent waiting for another rank (a pipeline
 * stage still computing, a slower data-parallel rank), not moving data. The ops are paired
 * by what comm.c counted at issue (engine/timing.h: timing_match): the n-th collective of a
 * group, the n-th send to a peer with a tag and the peer's n-th receive from it with that
 * tag. Start times are on rank 0's timeline (the trainer aligned the clocks), within the
 * alignment's error, a few microseconds on one node.
 *
 * Each group's members exchange the starts of the ops they share (one all-to-all a
 * group): a collective's go to every other member, a transfer's to its peer. */
#include "parallel/comm_wait.h"

#include "engine/log.h"
#include "engine/timing.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One op as a peer sees it: its match (kind, tag, seq) and start on the common clock */
typedef struct {
    int32_t kind, tag, seq, pad;
    double start_us;
} wait_item;

static int by_key(const void *x, const void *y) {
    const wait_item *a = x, *b = y;
    if (a->kind != b->kind) return a->kind < b->kind ? -1 : 1;
    if (a->tag != b->tag) return a->tag < b->tag ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/* The start of peer's op (kind, tag, seq) among its items it[n] (sorted), or -1 when the
 * peer kept no such record (past its trace's cap, or not timed) */
static int find_start(const wait_item *it, int n, int kind, int tag, int seq, double *start) {
    wait_item key = {kind, tag, seq, 0, 0};
    const wait_item *f = bsearch(&key, it, (size_t)n, sizeof(*it), by_key);
    if (!f) return -1;
    *start = f->start_us;
    return 0;
}

/* Does record r of this rank's group go to group rank p (not this rank)? */
static int goes_to(const timing_record *r, int p) {
    return r->match.kind == TM_COLL || r->match.peer == p;
}

/* An agreement over g: 1 when any member failed (fail != 0), so that all skip together */
static int any_failed(comm_group *g, int fail) {
    int any = 1;
    if (MPI_Allreduce(&fail, &any, 1, MPI_INT, MPI_MAX, g->comm) != MPI_SUCCESS) return 1;
    return any;
}

/* The waits of this rank's records on g. 0, or -1 when the group's members skipped it
 * (memory, an MPI error, more than INT_MAX bytes for one peer). */
static int match_group(comm_group *g) {
    int id = comm_group_id(g), S = g->size, me = g->rank;
    const timing_record *all = timing_trace();
    size_t n_all = timing_n_trace(), n_rec = 0;
    for (size_t i = 0; i < n_all; i++)
        n_rec += all[i].match.group == id && all[i].match.kind != TM_NONE;
    size_t *idx = malloc((n_rec ? n_rec : 1) * sizeof(*idx)); /* [n_rec] the group's records */
    for (size_t i = 0, k = 0; idx && i < n_all; i++)
        if (all[i].match.group == id && all[i].match.kind != TM_NONE) idx[k++] = i;
    /* [S] each: bytes of items to and from each group rank, and where they start */
    int *scount = calloc((size_t)S, sizeof(int)), *sdispl = calloc((size_t)S, sizeof(int));
    int *rcount = calloc((size_t)S, sizeof(int)), *rdispl = calloc((size_t)S, sizeof(int));
    wait_item *out = NULL; /* [total_out] the items for each peer, in peer order */
    wait_item *in = NULL;  /* [total_in] each peer's items, in peer order */
    int fail = !idx || !scount || !sdispl || !rcount || !rdispl;
    size_t total_out = 0;
    for (int p = 0; !fail && p < S; p++) {
        size_t k = 0;
        for (size_t i = 0; p != me && i < n_rec; i++) k += goes_to(&all[idx[i]], p);
        if (k > (size_t)INT_MAX / sizeof(wait_item) ||
            total_out + k > (size_t)INT_MAX / sizeof(wait_item))
            fail = 1;
        else
            scount[p] = (int)(k * sizeof(wait_item)), total_out += k;
    }
    if (!fail) out = malloc((total_out ? total_out : 1) * sizeof(*out));
    fail = fail || !out;
    for (int p = 0, at = 0; !fail && p < S; p++) {
        sdispl[p] = at * (int)sizeof(wait_item);
        for (size_t i = 0; p != me && i < n_rec; i++) {
            const timing_record *r = &all[idx[i]];
            if (goes_to(r, p))
                out[at++] = (wait_item){r->match.kind, r->match.tag, r->match.seq, 0, r->start_us};
        }
    }
    if (any_failed(g, fail)) goto skip;
    fail = MPI_Alltoall(scount, 1, MPI_INT, rcount, 1, MPI_INT, g->comm) != MPI_SUCCESS;
    size_t total_in = 0;
    for (int p = 0; !fail && p < S; p++) {
        if (total_in * sizeof(wait_item) + (size_t)rcount[p] > (size_t)INT_MAX) fail = 1;
        rdispl[p] = (int)(total_in * sizeof(wait_item));
        total_in += (size_t)rcount[p] / sizeof(wait_item);
    }
    if (!fail) in = malloc((total_in ? total_in : 1) * sizeof(*in));
    fail = fail || !in;
    if (any_failed(g, fail)) goto skip;
    if (MPI_Alltoallv(out, scount, sdispl, MPI_BYTE, in, rcount, rdispl, MPI_BYTE, g->comm) !=
        MPI_SUCCESS)
        goto skip;
    for (int p = 0; p < S; p++)
        qsort((char *)in + rdispl[p], (size_t)rcount[p] / sizeof(wait_item), sizeof(wait_item),
              by_key);
    for (size_t i = 0; i < n_rec; i++) {
        const timing_record *r = &all[idx[i]];
        double latest = r->start_us, s;
        int known = 1;
        for (int p = 0; p < S && known; p++) {
            if (p == me || (r->match.kind != TM_COLL && r->match.peer != p)) continue;
            /* the peer's side of a transfer is the other direction */
            int kind = r->match.kind == TM_SEND ? TM_RECV
                       : r->match.kind == TM_RECV ? TM_SEND
                                                   : TM_COLL;
            const wait_item *it = (const wait_item *)((const char *)in + rdispl[p]);
            known = find_start(it, rcount[p] / (int)sizeof(wait_item), kind, r->match.tag,
                               r->match.seq, &s) == 0;
            if (known && s > latest) latest = s;
        }
        if (!known) continue;
        double dur = r->end_us - r->start_us, wait = latest - r->start_us;
        timing_set_wait(idx[i], (float)(wait < dur ? wait : dur > 0 ? dur : 0));
    }
    free(idx), free(out), free(in), free(scount), free(sdispl), free(rcount), free(rdispl);
    return 0;
skip:
    free(idx), free(out), free(in), free(scount), free(sdispl), free(rcount), free(rdispl);
    return -1;
}

void comm_match_waits(comm_group *const *groups, int n) {
    int skipped = 0;
    for (int i = 0; i < n; i++) {
        comm_group *g = groups[i];
        if (!g || g->comm == MPI_COMM_NULL || g->size < 2 || comm_group_id(g) < 0) continue;
        if (match_group(g) != 0) skipped = 1;
    }
    if (skipped)
        log_warn("kernel timing: the communication's waits for other ranks could not be "
                 "matched on every group (memory or MPI): the report leaves those out");
    timing_sum_waits();
}
