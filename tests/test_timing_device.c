/* Records timed by a device timer (engine/timing.h: timing_record_device and
 * timing_resolve_device), without a device: a fake timer hands out intervals chosen here,
 * so that the step's analysis can be checked exactly. Also checks that an op the timer
 * saw run nothing is left out of the statistics and counted as untimed
 * (untimed_records), that host-timed records in the same step keep their
 * times, that device handles are not carried into the next step, and that records past
 * the trace's cap are counted, not lost silently. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/timing.h"

static int failures;

static void check(int ok, const char *what) {
    if (!ok) {
        printf("FAIL %s\n", what);
        failures++;
    } else {
        printf("ok   %s\n", what);
    }
}

/* op k ran over [start[k], end[k]] ms after the origin; -1: nothing ran */
static double g_origin;
static const double START[] = {1.0, 2.0, -1, 5.0, 1.5};
static const double END[] = {3.0, 4.0, -1, 6.0, 2.5};
static int g_reads;

static int fake_read(int op, double *start_ms, double *end_ms) {
    g_reads++;
    if (op < 0 || op > 4 || START[op] < 0) return -1;
    *start_ms = g_origin + START[op];
    *end_ms = g_origin + END[op];
    return 0;
}

static const timing_kernel_stats *kernel(const char *name) {
    for (int i = 0; i < timing_n_kernels(); i++)
        if (strcmp(timing_kernels()[i].name, name) == 0) return &timing_kernels()[i];
    return NULL;
}

static int near(double a, double b) { return fabs(a - b) < 1e-6; }

int main(void) {
    if (timing_init(1, 64) != 0) return 1;
    timing_set_trace_limit(6); /* steps 1 and 2 keep five records; step 3 one more */
    timing_set_origin(timing_now_ms());
    g_origin = timing_now_ms();
    timing_begin_step(1, 0);
    timing_ctx ctx = timing_context();
    /* compute 1-3 ms and 5-6 ms; communication 2-4 ms on the DP stream; an op that ran
     * nothing; a host-timed compute record 1.5-2.5 ms */
    timing_record_device("gemm", TK_COMPUTE, TP_NONE, 0, ctx, 0);
    timing_record_device("allreduce", TK_COMM, TP_DP, 3, ctx, 1);
    timing_record_device("empty", TK_COMPUTE, TP_NONE, 0, ctx, 2);
    timing_record_device("gemm", TK_COMPUTE, TP_NONE, 0, ctx, 3);
    timing_record_op("host_op", TK_COMPUTE, TP_NONE, 0, ctx, g_origin + 1.5, g_origin + 2.5);
    timing_resolve_device(fake_read);
    check(g_reads == 4, "every device record read once, host records not at all");
    timing_end_step(10.0);

    const timing_step_summary *s = &timing_steps()[0];
    /* compute union 1-3 and 5-6 = 3 ms; comm 2-4 = 2 ms, of which 2-3 under compute */
    check(near(s->compute_ms, 3.0), "compute time is the union of the compute intervals");
    check(near(s->comm_ms, 2.0), "communication time");
    check(near(s->exposed_comm_ms, 1.0), "exposed communication = comm not under compute");
    const timing_kernel_stats *g = kernel("gemm"), *a = kernel("allreduce"), *h = kernel("host_op");
    check(g && g->count == 2 && g->n_overlapped == 1 && g->n_isolated == 1 &&
              near(g->overlapped_us, 2000) && near(g->isolated_us, 1000),
          "gemm: one instance beside communication (2 ms), one alone (1 ms)");
    check(a && a->count == 1 && a->n_overlapped == 1, "allreduce ran beside compute");
    check(h && h->count == 1 && near(h->sum_us, 1000), "host-timed record kept its time");
    check(kernel("empty") == NULL, "an op that ran nothing on the device is dropped");
    check(timing_untimed(TK_COMPUTE) == 1 && timing_untimed(TK_COMM) == 0,
          "and counted as an untimed compute record");
    check(timing_n_trace() == 4, "the trace holds the four records that ran");

    /* next step: host records only; nothing of the last step's handles may be read */
    g_reads = 0;
    timing_begin_step(2, 0);
    timing_record_op("host_op", TK_COMPUTE, TP_NONE, 0, ctx, g_origin + 20, g_origin + 21);
    timing_resolve_device(fake_read);
    check(g_reads == 0, "handles of an earlier step are not read again");
    timing_end_step(5.0);
    check(kernel("host_op")->count == 2, "host record of the second step counted");

    /* a third step of two records: one fills the trace, one is left out of it */
    timing_begin_step(3, 0);
    timing_record_op("host_op", TK_COMPUTE, TP_NONE, 0, ctx, g_origin + 30, g_origin + 31);
    timing_record_op("host_op", TK_COMPUTE, TP_NONE, 0, ctx, g_origin + 32, g_origin + 33);
    timing_end_step(5.0);
    check(timing_n_trace() == 6 && timing_trace_omitted() == 1,
          "a record past the trace's cap is left out of it and counted");
    check(kernel("host_op")->count == 4, "records past the trace's cap are still timed");
    check(timing_dropped() == 0, "nothing dropped untimed");
    timing_shutdown();
    if (failures) {
        printf("%d check(s) failed\n", failures);
        return 1;
    }
    printf("device-timed records resolve as expected\n");
    return 0;
}
