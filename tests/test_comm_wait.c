/* parallel/comm_wait.c on 3 ranks, from records made up so that every rule shows: an
 * all-reduce waits for its last member; a broadcast's other ranks for its root, the root
 * for every member that started before it ended (none: an eager root); a reduce's root
 * for every member, its other ranks for the root unless they ended first; a receive for
 * its send, a send for its receive unless it ended first (eager); a wait is at most the
 * op's duration; an op a member did not keep, or whose peer sent nothing with its tag, has
 * no wait; the step's exposed wait is the waiting less what compute and moving data
 * cover, per parallelism its own moving data only, and none where the trace's cap cut the
 * step short. Each expected wait is written out by hand beside its times (us). */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/timing.h"
#include "parallel/comm.h"
#include "parallel/comm_wait.h"

static int failures, rank;

/* one record of the op this rank ran: [a, b) us; match kind, root or peer, tag, seq */
static void op_of(int par, const char *name, double a, double b, int kind, int peer, int tag,
                  int seq) {
    timing_match m = {(int8_t)kind, 0, (int16_t)peer, tag, seq};
    timing_record_op(name, TK_COMM, par, 3, timing_context(), (timing_work){0, 4}, m, a / 1e3,
                     b / 1e3);
}

static void op(const char *name, double a, double b, int kind, int peer, int tag, int seq) {
    op_of(TP_DP, name, a, b, kind, peer, tag, seq);
}

static void compute(double a, double b) {
    timing_record_op("matmul_fwd", TK_COMPUTE, TP_NONE, 0, timing_context(), (timing_work){0, 0},
                     timing_no_match(), a / 1e3, b / 1e3);
}

/* the i-th kept record's wait is `want` (-1: none known) */
static void expect(size_t i, double want, const char *what) {
    double got = i < timing_n_trace() ? timing_trace()[i].wait_us : NAN;
    if (isnan(got) || (want < 0 ? got >= 0 : fabs(got - want) > 1e-3)) {
        printf("rank %d FAIL: %s (record %zu): wait %.3f us, want %.3f\n", rank, what, i, got,
               want);
        failures++;
    }
}

int main(int argc, char **argv) {
    int provided = 0, size = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    comm_group world;
    if (size != 3 || comm_world(&world, cpu_backend()) != 0 || timing_init(1, 64) != 0) {
        printf("FAIL: needs 3 ranks, the world group and timing\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    timing_set_origin(0.0);
    /* rank 0 keeps 16 records for the trace: steps 1 and 2's 15, and step 3's first */
    if (rank == 0) timing_set_trace_limit(16);
    /* rank r's start of each op, and its end, by rank */
    static const double coll_a[3] = {10, 30, 20};
    static const double bcast1_a[3] = {200, 150, 140}, bcast1_b[3] = {300, 160, 250};
    static const double bcast2_a[3] = {400, 420, 450}, bcast2_b[3] = {500, 510, 520};
    static const double red3_a[3] = {610, 580, 600}, red3_b[3] = {620, 590, 700};
    static const double red4_a[3] = {800, 780, 790}, red4_b[3] = {900, 850, 795};
    static const double bcast5_a[3] = {1750, 1770, 1850}, bcast5_b[3] = {1800, 1780, 1860};
    static const double short_a[3] = {2000, 2050, 2060}, short_b[3] = {2005, 2100, 2100};

    timing_begin_step(1, 0);
    op("allreduce", coll_a[rank], 100, TM_COLL, -1, 0, 0);
    op("broadcast", bcast1_a[rank], bcast1_b[rank], TM_BCAST, 1, 0, 1);
    op("broadcast", bcast2_a[rank], bcast2_b[rank], TM_BCAST, 0, 0, 2);
    op("reduce", red3_a[rank], red3_b[rank], TM_REDUCE, 2, 0, 3);
    op("reduce", red4_a[rank], red4_b[rank], TM_REDUCE, 0, 0, 4);
    op("broadcast", bcast5_a[rank], bcast5_b[rank], TM_BCAST, 0, 0, 10);
    if (rank != 2) op("allreduce", 1900, 1950, TM_COLL, -1, 0, 5); /* rank 2 kept none */
    op("allreduce", short_a[rank], short_b[rank], TM_COLL, -1, 0, 6);
    if (rank == 0) {
        op("send", 1000, 1005, TM_SEND, 1, 7, 0);
        op("send", 1100, 1150, TM_SEND, 1, 7, 1);
        op("send", 1200, 1300, TM_SEND, 1, 7, 2);
        op("send", 1400, 1500, TM_SEND, 1, 8, 0);
    } else if (rank == 1) {
        op("recv", 1010, 1011, TM_RECV, 0, 7, 0);
        op("recv", 1050, 1160, TM_RECV, 0, 7, 1);
        op("recv", 1250, 1310, TM_RECV, 0, 7, 2);
        op("recv", 1350, 1510, TM_RECV, 0, 8, 0);
        op("recv", 1600, 1700, TM_RECV, 0, 9, 0); /* nothing was sent with tag 9 */
    }
    timing_end_step(3.0);
    /* step 2: compute covers [3000, 3100) of rank 0's wait [3050, 3150) for the others, and
     * a pp all-reduce moves data over [3120, 3140) of it (rank 0 the last to arrive); on
     * rank 1 compute [3130, 3135) runs beside that pp all-reduce's moving part */
    timing_begin_step(2, 0);
    if (rank == 0) compute(3000, 3100);
    op("allreduce", rank == 0 ? 3050 : 3150, 3200, TM_COLL, -1, 0, 7);
    op_of(TP_PP, "allreduce", rank == 0 ? 3120 : 3100, 3140, TM_COLL, -1, 0, 8);
    if (rank == 1) compute(3130, 3135);
    timing_end_step(0.3);
    /* step 3: rank 0's compute [4000, 4100) covers its whole wait [4000, 4050), but the
     * trace's cap drops it: the step's exposed wait is unknown there, not 0.05 ms */
    timing_begin_step(3, 0);
    op("allreduce", rank == 0 ? 4000 : 4050, 4100, TM_COLL, -1, 0, 9);
    if (rank == 0) compute(4000, 4100);
    timing_end_step(0.1);

    comm_group *groups[] = {&world};
    comm_match_waits(groups, 1);

    /* all-reduce #0: the last member started at 30 */
    expect(0, 30 - coll_a[rank], "allreduce: the last member's start less this rank's");
    /* broadcast #1, root 1 (150-160) ended before rank 0 started (200): an eager root, 0,
     * not its whole 10 us; rank 0 started after the root, 0; rank 2 (140) waited
     * 150 - 140 = 10 for it */
    static const double bcast1_w[3] = {0, 0, 10};
    expect(1, bcast1_w[rank], "broadcast: the root's start, or an eager root's 0");
    /* broadcast #2, root 0 (400-500): it needed every member, the last at 450: 50; the
     * others started after the root: 0 */
    static const double bcast2_w[3] = {50, 0, 0};
    expect(2, bcast2_w[rank], "broadcast: the root waits for the last member");
    /* reduce #3, root 2 (600-700): it needed every member, the last at 610: 10; rank 0
     * (610) started after the root: 0; rank 1 (580-590) ended before the root began: 0,
     * not 10 */
    static const double red3_w[3] = {0, 0, 10};
    expect(3, red3_w[rank], "reduce: the root waits for all, an eager member for nothing");
    /* reduce #4, root 0 (800-900): the others started before it, 0; rank 1 (780-850)
     * needed the root from 800: 20; rank 2 (790-795) ended first: 0 */
    static const double red4_w[3] = {0, 20, 0};
    expect(4, red4_w[rank], "reduce: a member waits for the root while it runs");
    /* broadcast #10, root 0 (1750-1800): rank 1 came while it ran (1770), rank 2 after its
     * end (1850): the root waited 20 for rank 1 and none for rank 2, not 0 for the last
     * start alone; rank 1 started after the root, 0; rank 2 too */
    static const double bcast5_w[3] = {20, 0, 0};
    expect(5, bcast5_w[rank], "broadcast: the root waits for the members that came while it ran");
    size_t at = 6;
    if (rank != 2) expect(at++, -1, "a collective one member did not keep has no wait");
    /* all-reduce #6: rank 0's op lasted 5 us of its 60 us wait: at most its duration */
    static const double short_w[3] = {5, 10, 0};
    expect(at++, short_w[rank], "a wait is at most the op's duration");
    if (rank == 0) {
        expect(at++, 0, "an eager send (ended before its receive began) waited for nothing");
        expect(at++, 0, "a send whose receive was posted first");
        expect(at++, 50, "a send waits for its receive");
        expect(at++, 0, "a send of another tag, its receive posted first");
    } else if (rank == 1) {
        expect(at++, 0, "a receive posted after its send");
        expect(at++, 50, "a receive waits for its send");
        expect(at++, 0, "a receive posted after its (rendezvous) send");
        expect(at++, 50, "a receive of another tag pairs with that tag's send");
        expect(at++, -1, "a receive of a tag nothing was sent with has no wait");
    }
    /* step 2: rank 0 waited [3050, 3150), compute covered [3050, 3100) and the pp
     * all-reduce's moving part [3120, 3140): 30 us exposed; the dp communication alone
     * lost 50 us (another parallelism's moving data covers none of its own); the others
     * waited 20 us in the pp all-reduce for rank 0 */
    expect(at + (rank == 0), rank == 0 ? 100 : 0, "step 2's all-reduce");
    expect(at + (rank == 0) + 1, rank == 0 ? 0 : 20, "step 2's pp all-reduce");
    const timing_step_summary *st = timing_steps();
    double want2 = rank == 0 ? 0.03 : 0.02, dp2 = rank == 0 ? 0.05 : 0.0,
           pp2 = rank == 0 ? 0.0 : 0.02;
    if (timing_n_steps() < 2 || !st[1].has_wait || fabs(st[1].wait_ms - want2) > 1e-9 ||
        fabs(st[1].par_wait_ms[TP_DP] - dp2) > 1e-9 || fabs(st[1].par_wait_ms[TP_PP] - pp2) > 1e-9) {
        printf("rank %d FAIL: step 2's exposed wait %.6f ms (dp %.6f, pp %.6f), want %.6f (dp "
               "%.6f, pp %.6f)\n", rank, st[1].wait_ms, st[1].par_wait_ms[TP_DP],
               st[1].par_wait_ms[TP_PP], want2, dp2, pp2);
        failures++;
    }
    if (timing_n_steps() != 3 || st[2].has_wait != (rank != 0)) {
        printf("rank %d FAIL: step 3, cut short by the trace's cap on rank 0: has_wait %d\n",
               rank, timing_n_steps() == 3 ? st[2].has_wait : -1);
        failures++;
    }
    /* the kernel statistics: the dp allreduce's known waits, three steps, split as the
     * durations are: rank 0's step 2 and 3 all-reduces ran beside its compute
     * (overlapped), every other one alone. Each one's duration less its wait, split by
     * whether compute ran beside that moving part, in the steps kept whole: rank 0's step
     * 2 one moved data over [3150, 3200), after its compute: isolated; its step 3 is cut
     * short by the cap. The pp all-reduce's moving part on rank 1, [3120, 3140), ran
     * beside compute: overlapped. Rank 0's short all-reduce of step 1 waited all of its
     * 5 us (it seemed to end before the last member started): no moving time, all_wait */
    const timing_kernel_stats *k = timing_kernels();
    timing_split w = {0}, mv = {0}, pp = {0};
    long all_wait = 0;
    for (int i = 0; i < timing_n_kernels(); i++)
        if (strcmp(k[i].name, "allreduce") == 0 && k[i].par == TP_DP) {
            all_wait += k[i].all_wait;
            w.count += k[i].wait.count, w.sum_us += k[i].wait.sum_us;
            w.n_overlapped += k[i].wait.n_overlapped, w.overlapped_us += k[i].wait.overlapped_us;
            mv.count += k[i].moving.count, mv.sum_us += k[i].moving.sum_us;
            mv.n_overlapped += k[i].moving.n_overlapped, mv.overlapped_us += k[i].moving.overlapped_us;
        } else if (strcmp(k[i].name, "allreduce") == 0 && k[i].par == TP_PP) {
            pp = k[i].moving;
        }
    double want_sum = (30 - coll_a[rank]) + short_w[rank] + (rank == 0 ? 100 + 50 : 0);
    double want_ovl = rank == 0 ? 150 : 0;
    /* moving: step 1's two (90 - 20 on rank 0 and, past its wait of all 5 us, none of the
     * other) and step 2's (50 on rank 0, the others' 3200 - 3150 less no wait), and the
     * others' step 3 (4100 - 4050) */
    double want_mv = (100 - coll_a[rank]) + (short_b[rank] - short_a[rank]) -
                     (30 - coll_a[rank]) - short_w[rank] + 50 + (rank == 0 ? 0 : 50);
    long want_mv_n = rank == 0 ? 2 : 4;
    if (all_wait != (rank == 0)) {
        printf("rank %d FAIL: allreduce's instances that waited all along: %ld, want %d\n", rank,
               all_wait, rank == 0);
        failures++;
    }
    if (w.count != 4 || fabs(w.sum_us - want_sum) > 1e-3 || w.n_overlapped != (rank == 0 ? 2 : 0) ||
        fabs(w.overlapped_us - want_ovl) > 1e-3 || mv.count != want_mv_n ||
        fabs(mv.sum_us - want_mv) > 1e-3 || mv.n_overlapped != 0 || mv.overlapped_us != 0) {
        printf("rank %d FAIL: allreduce's waits in the statistics: %ld of %.3f us (%ld "
               "overlapped, %.3f us), moving %ld of %.3f us (%ld overlapped, %.3f us); want 4 "
               "of %.3f (%d, %.3f), moving %ld of %.3f (none overlapped)\n", rank, w.count,
               w.sum_us, w.n_overlapped, w.overlapped_us, mv.count, mv.sum_us, mv.n_overlapped,
               mv.overlapped_us, want_sum, rank == 0 ? 2 : 0, want_ovl, want_mv_n, want_mv);
        failures++;
    }
    /* rank 0 waited for no one (0 us) and moved 20 us; the others waited 20 of their 40 */
    if (pp.count != 1 || fabs(pp.sum_us - 20) > 1e-3 || pp.n_overlapped != (rank == 1)) {
        printf("rank %d FAIL: the pp all-reduce's moving part: %ld of %.3f us, %ld overlapped; "
               "want 1 of 20 us, %d overlapped\n", rank, pp.count, pp.sum_us, pp.n_overlapped,
               rank == 1);
        failures++;
    }
    /* the trace names the root and the peer by world rank */
    const timing_record *r = timing_trace();
    if (r[1].peer_rank != 1 || r[4].peer_rank != 0 || r[0].peer_rank != -1) {
        printf("rank %d FAIL: the roots in the trace: %d and %d (want 1 and 0), an all-reduce's "
               "%d (want -1)\n", rank, r[1].peer_rank, r[4].peer_rank, r[0].peer_rank);
        failures++;
    }
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("%s: %d failure(s)\n", total ? "FAIL" : "ok", total);
    timing_shutdown();
    comm_group_free(&world);
    MPI_Finalize();
    return total != 0;
}
