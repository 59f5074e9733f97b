/* How long each communication op of the run waited for the other ranks, found after the
 * run from the kept records of every rank (profile.timing = kernel).
 *
 * An op cannot finish before the ranks it needs have started it: a receive needs the send
 * it matches and a send its receive, an all-reduce (all-gather, reduce-scatter) every
 * member of its group, a broadcast's other ranks its root and the root every member, a
 * reduce's root every member and its other ranks the root. So the first
 *     wait = (latest start among the ranks it needs) - (this op's start)
 * of an op, at most its duration, was spent waiting for another rank (a pipeline stage
 * still computing, a slower data-parallel rank), not moving data. An op that can finish
 * without them (a send under MPI's eager limit, a broadcast's root, a reduce's other
 * ranks) waited for nothing when the last of them started after it had ended; a
 * broadcast's root with several members waited for the last of those that started
 * while it ran, and for none that started after its end. The ops are paired by
 * what comm.c counted at issue (engine/timing.h: timing_match): the n-th collective of a
 * group, the n-th send to a peer with a tag and the peer's n-th receive from it with that
 * tag. Start times are on rank 0's timeline (the trainer aligned the clocks), within the
 * alignment's error, a few microseconds on one node.
 *
 * A group's collectives have one count on every member, so their starts meet in
 * all-reduces over arrays indexed by it (the latest start, the root's, how many members
 * kept the op); a transfer's start goes to its peer alone, in one all-to-all. */
#include "parallel/comm_wait.h"

#include "engine/log.h"
#include "engine/timing.h"
#include "engine/watchdog.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int is_collective(int kind) { return kind == TM_COLL || kind == TM_BCAST || kind == TM_REDUCE; }

/* Can the op end before the ranks it needs start theirs? */
static int may_end_first(const timing_record *r, int me) {
    return r->match.kind == TM_SEND || (r->match.kind == TM_BCAST && r->match.peer == me) ||
           (r->match.kind == TM_REDUCE && r->match.peer != me);
}

/* wait of record i, whose needed ranks started at `latest` at the latest */
static void set_wait(size_t i, const timing_record *r, int me, double latest) {
    double dur = r->end_us - r->start_us, wait = latest - r->start_us;
    if (may_end_first(r, me) && latest >= r->end_us) wait = 0;
    timing_set_wait(i, (float)(wait < 0 ? 0 : wait < dur ? wait : dur > 0 ? dur : 0));
}

/* An agreement over g: 1 when any member failed (fail != 0), so that all skip together.
 * Not comm_max_int, which would count and time itself as an op of a step that has ended.
 * A member whose all-reduce fails skips alone; with MPI_ERRORS_RETURN a broken
 * communicator fails on every member, and the watchdog ends a job that waits on one. */
static int any_failed(comm_group *g, int fail) {
    int any = 1;
    if (MPI_Allreduce(&fail, &any, 1, MPI_INT, MPI_MAX, g->comm) != MPI_SUCCESS) return 1;
    return any;
}

/* The waits of this rank's collectives on g, rec[idx[0..n)] the group's records. 0, or
 * -1 when the group's members skipped them (memory, MPI, over INT_MAX collectives). */
static int match_collectives(comm_group *g, const timing_record *rec, const size_t *idx,
                             size_t n) {
    int S = g->size, me = g->rank;
    long long range[2] = {LLONG_MAX, LLONG_MAX}; /* lowest seq, -highest */
    for (size_t i = 0; i < n; i++) {
        const timing_match *m = &rec[idx[i]].match;
        if (!is_collective(m->kind)) continue;
        if (m->seq < range[0]) range[0] = m->seq;
        if (-(long long)m->seq < range[1]) range[1] = -(long long)m->seq;
    }
    long long lim[2];
    if (MPI_Allreduce(range, lim, 2, MPI_LONG_LONG, MPI_MIN, g->comm) != MPI_SUCCESS) return -1;
    long long lo = lim[0], hi = -lim[1];
    if (hi < lo) return 0; /* no member kept a collective */
    size_t span = (size_t)(hi - lo) + 1;
    /* [3 * span]: by seq - lo, the latest start of a member, the root's start, the root's
     * end; then [span] the latest start of a broadcast's members before its root's end
     * (-inf: none) */
    double *starts = NULL, *before = NULL;
    int *kept = NULL; /* [span] how many members kept the op */
    int fail = span > (size_t)INT_MAX / 3;
    if (!fail) {
        starts = malloc(3 * span * sizeof(*starts));
        before = malloc(span * sizeof(*before));
        kept = calloc(span, sizeof(*kept));
        fail = !starts || !before || !kept;
    }
    for (size_t j = 0; !fail && j < 3 * span; j++) starts[j] = -INFINITY;
    for (size_t j = 0; !fail && j < span; j++) before[j] = -INFINITY;
    for (size_t i = 0; !fail && i < n; i++) {
        const timing_record *r = &rec[idx[i]];
        if (!is_collective(r->match.kind)) continue;
        size_t j = (size_t)(r->match.seq - lo);
        starts[j] = r->start_us;
        if (r->match.kind != TM_COLL && r->match.peer == me) {
            starts[span + j] = r->start_us;
            starts[2 * span + j] = r->end_us;
        }
        kept[j] = 1;
    }
    fail = any_failed(g, fail) ||
           MPI_Allreduce(MPI_IN_PLACE, starts, (int)(3 * span), MPI_DOUBLE, MPI_MAX, g->comm) !=
               MPI_SUCCESS ||
           MPI_Allreduce(MPI_IN_PLACE, kept, (int)span, MPI_INT, MPI_SUM, g->comm) != MPI_SUCCESS;
    /* a broadcast's root (an eager one too) can only have waited for members that came
     * while it ran: the second round keeps those starts alone */
    for (size_t i = 0; !fail && i < n; i++) {
        const timing_record *r = &rec[idx[i]];
        if (r->match.kind != TM_BCAST) continue;
        size_t j = (size_t)(r->match.seq - lo);
        if (r->start_us < starts[2 * span + j]) before[j] = r->start_us;
    }
    if (fail || MPI_Allreduce(MPI_IN_PLACE, before, (int)span, MPI_DOUBLE, MPI_MAX, g->comm) !=
                    MPI_SUCCESS) {
        free(starts), free(before), free(kept);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const timing_record *r = &rec[idx[i]];
        if (!is_collective(r->match.kind)) continue;
        size_t j = (size_t)(r->match.seq - lo);
        if (kept[j] != S) continue; /* a member's record is missing: not known */
        /* a broadcast's other ranks need its root, a reduce's other ranks give to it */
        int to_root = r->match.kind != TM_COLL && r->match.peer != me;
        int bcast_root = r->match.kind == TM_BCAST && r->match.peer == me;
        set_wait(idx[i], r, me, to_root ? starts[span + j] : bcast_root ? before[j] : starts[j]);
    }
    free(starts), free(before), free(kept);
    return 0;
}

/* One transfer as its peer sees it: its direction, tag, count and start */
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

static int is_transfer(const timing_match *m, int S, int me) {
    return (m->kind == TM_SEND || m->kind == TM_RECV) && m->peer >= 0 && m->peer < S &&
           m->peer != me;
}

/* The waits of this rank's transfers on g (as match_collectives). */
static int match_transfers(comm_group *g, const timing_record *rec, const size_t *idx,
                           size_t n) {
    int S = g->size, me = g->rank;
    /* [S] each: bytes of items to and from each group rank, and where they start */
    int *scount = calloc((size_t)S, sizeof(int)), *sdispl = calloc((size_t)S, sizeof(int));
    int *rcount = calloc((size_t)S, sizeof(int)), *rdispl = calloc((size_t)S, sizeof(int));
    wait_item *out = NULL; /* [n_out] this rank's transfers, by peer */
    wait_item *in = NULL;  /* [n_in] the peers' transfers with this rank, by peer */
    int fail = !scount || !sdispl || !rcount || !rdispl;
    size_t n_out = 0;
    for (size_t i = 0; !fail && i < n; i++)
        if (is_transfer(&rec[idx[i]].match, S, me)) scount[rec[idx[i]].match.peer]++, n_out++;
    fail = fail || n_out > (size_t)INT_MAX / sizeof(wait_item);
    if (!fail) out = malloc((n_out ? n_out : 1) * sizeof(*out));
    fail = fail || !out;
    for (int p = 0, at = 0; !fail && p < S; p++) {
        sdispl[p] = at * (int)sizeof(wait_item);
        for (size_t i = 0; i < n; i++) {
            const timing_record *r = &rec[idx[i]];
            if (is_transfer(&r->match, S, me) && r->match.peer == p)
                out[at++] = (wait_item){r->match.kind, r->match.tag, r->match.seq, 0, r->start_us};
        }
        scount[p] *= (int)sizeof(wait_item);
    }
    if (any_failed(g, fail)) goto skip;
    fail = MPI_Alltoall(scount, 1, MPI_INT, rcount, 1, MPI_INT, g->comm) != MPI_SUCCESS;
    size_t n_in = 0;
    for (int p = 0; !fail && p < S; p++) {
        if ((n_in * sizeof(wait_item)) + (size_t)rcount[p] > (size_t)INT_MAX) fail = 1;
        rdispl[p] = (int)(n_in * sizeof(wait_item));
        n_in += (size_t)rcount[p] / sizeof(wait_item);
    }
    if (!fail) in = malloc((n_in ? n_in : 1) * sizeof(*in));
    fail = fail || !in;
    if (any_failed(g, fail) ||
        MPI_Alltoallv(out, scount, sdispl, MPI_BYTE, in, rcount, rdispl, MPI_BYTE, g->comm) !=
            MPI_SUCCESS)
        goto skip;
    for (int p = 0; p < S; p++)
        qsort((char *)in + rdispl[p], (size_t)rcount[p] / sizeof(wait_item), sizeof(wait_item),
              by_key);
    for (size_t i = 0; i < n; i++) {
        const timing_record *r = &rec[idx[i]];
        if (!is_transfer(&r->match, S, me)) continue;
        int p = r->match.peer;
        /* the peer's side of a transfer is the other direction */
        wait_item key = {r->match.kind == TM_SEND ? TM_RECV : TM_SEND, r->match.tag,
                         r->match.seq, 0, 0};
        const wait_item *f = bsearch(&key, (const char *)in + rdispl[p],
                                     (size_t)rcount[p] / sizeof(wait_item), sizeof(wait_item),
                                     by_key);
        if (f) set_wait(idx[i], r, me, f->start_us > r->start_us ? f->start_us : r->start_us);
    }
    free(out), free(in), free(scount), free(sdispl), free(rcount), free(rdispl);
    return 0;
skip:
    free(out), free(in), free(scount), free(sdispl), free(rcount), free(rdispl);
    return -1;
}

/* Names the world rank of each record's peer or root in the trace (the group's ranks are
 * its own numbering). */
static void name_peers(comm_group *g, const timing_record *rec, const size_t *idx, size_t n) {
    int S = g->size;
    /* [S] each: the group's ranks, and their world ranks */
    int *mine = malloc((size_t)S * sizeof(int)), *world = malloc((size_t)S * sizeof(int));
    MPI_Group gg, wg;
    if (mine && world && MPI_Comm_group(g->comm, &gg) == MPI_SUCCESS) {
        if (MPI_Comm_group(MPI_COMM_WORLD, &wg) == MPI_SUCCESS) {
            for (int p = 0; p < S; p++) mine[p] = p;
            if (MPI_Group_translate_ranks(gg, S, mine, wg, world) == MPI_SUCCESS)
                for (size_t i = 0; i < n; i++) {
                    int p = rec[idx[i]].match.peer; /* an all-reduce's is -1: it has none */
                    if (rec[idx[i]].match.kind != TM_COLL && p >= 0 && p < S)
                        timing_set_peer_rank(idx[i], world[p]);
                }
            MPI_Group_free(&wg);
        }
        MPI_Group_free(&gg);
    }
    free(mine);
    free(world);
}

/* The waits of this rank's records on g. 0, or -1 when some were skipped. */
static int match_group(comm_group *g) {
    int id = comm_group_id(g);
    const timing_record *rec = timing_trace();
    size_t n_all = timing_n_trace(), n = 0;
    for (size_t i = 0; i < n_all; i++) n += rec[i].match.group == id && rec[i].match.kind != TM_NONE;
    size_t *idx = malloc((n ? n : 1) * sizeof(*idx)); /* [n] the group's records */
    for (size_t i = 0, k = 0; idx && i < n_all; i++)
        if (rec[i].match.group == id && rec[i].match.kind != TM_NONE) idx[k++] = i;
    if (any_failed(g, !idx)) {
        free(idx);
        return -1;
    }
    name_peers(g, rec, idx, n);
    int rc = match_collectives(g, rec, idx, n);
    watchdog_beat();
    if (match_transfers(g, rec, idx, n) != 0) rc = -1;
    watchdog_beat();
    free(idx);
    return rc;
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
