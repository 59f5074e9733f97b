/* Records timed by a device timer (engine/timing.h: timing_record_device and
 * timing_resolve_device), without a device: a fake timer hands out intervals chosen here,
 * so that the step's analysis can be checked exactly. Also checks that an op the timer
 * saw run nothing is left out of the statistics and counted as untimed
 * (untimed_records), that host-timed records in the same step keep their
 * times, that device handles are not carried into the next step, and that records past
 * the trace's cap are counted, not lost silently. Then the device kernels behind the ops
 * (timing_device_kernels, from the timer's pieces): each under its op's name, work
 * outside the ops under TIMING_NO_OP, a host-timed op's device work under its name
 * (timing_device_work), an untimed op's pieces left out, warm-up and probe
 * steps left out; and the names kernel_name gives CUPTI's symbols. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/kernel_name.h"
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
/* device kernels' times: differences of clock readings in ms, some 1e-9 relative apart */
static int near_us(double a, double b) { return fabs(a - b) < 1e-3; }

/* the device work of step 1 (op handles as recorded there, ms after the origin, inside
 * their ops' intervals above): two kernels of the first gemm (1-3 ms), of which only the
 * second runs beside the all-reduce (2-4 ms); NCCL's kernel of the all-reduce, beside
 * compute; one of the op the timer could not read (op 2); one of the second gemm (5-6
 * ms, alone); a copy outside every op, beside the all-reduce; one of a handle no record
 * has; a flag kernel of a host-staged all-reduce (timing_device_work, handle 5), beside
 * the first gemm */
static const struct {
    int op;
    const char *kernel;
    double a, b;
} PIECES[] = {{0, "k_gemm", 1.0, 1.8},       {0, "k_epilogue", 2.5, 3.0},
              {1, "nccl_kernel", 2.0, 4.0},  {2, "k_lost", 1.0, 2.0},
              {3, "k_gemm", 5.0, 6.0},       {-1, "memcpy_HtoD", 3.5, 3.75},
              {7, "k_stray", 1.0, 4.0},      {5, "wait_flag_kernel", 1.2, 1.6}};
static int g_pieces_on = 1; /* 0: the timer sees no kernels */

static int fake_piece(size_t i, int *op, const char **kernel, double *start_ms,
                      double *end_ms) {
    if (!g_pieces_on || i >= sizeof PIECES / sizeof PIECES[0]) return -1;
    *op = PIECES[i].op, *kernel = PIECES[i].kernel;
    *start_ms = g_origin + PIECES[i].a, *end_ms = g_origin + PIECES[i].b;
    return 0;
}

static const timing_device_kernel *device_kernel(const char *op, const char *kernel) {
    for (int i = 0; i < timing_n_device_kernels(); i++) {
        const timing_device_kernel *d = &timing_device_kernels()[i];
        if (strcmp(d->op, op) == 0 && strcmp(d->kernel, kernel) == 0) return d;
    }
    return NULL;
}

static void check_name(const char *symbol, size_t n, const char *want) {
    char got[256], what[512];
    kernel_name(symbol, got, n);
    snprintf(what, sizeof what, "kernel_name(%s) = %s (got %s)", symbol ? symbol : "NULL", want,
             got);
    check(strcmp(got, want) == 0, what);
}

static void check_kernel_names(void) {
    check_name("_Z24layernorm_forward_kernelPfS_PKfS1_iii", 256, "layernorm_forward_kernel");
    check_name("_ZN8cublasLt8epilogue4impl12globalKernelILi8ELi32EfEEvv", 256,
               "cublasLt::epilogue::impl::globalKernel<8,32,float>");
    /* CUTLASS's kernels: the template argument names the configuration */
    check_name("_ZN7cutlass7Kernel2I61cutlass_80_tensorop_s16816gemm_relu_bf16_64x64_32x6_tn_"
               "align8EEvNT_6ParamsE", 256,
               "cutlass::Kernel2<cutlass_80_tensorop_s16816gemm_relu_bf16_64x64_32x6_tn_align8>");
    check_name("_ZN4cute6kernelINS_5ShapeEEEvv", 256, "cute::kernel"); /* a substitution: no args */
    check_name("_Z6kernelILin3ELb1ELb0EN2ns4TileILi64EEEEvv", 256,
               "kernel<-3,true,false,ns::Tile<64>>");
    check_name("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cublas", 256,
               "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cublas");
    check_name("_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE",
               256, "ncclDevKernel_AllReduce_Sum_f32_RING_LL");
    check_name("_Z10gemmKernelILi128EEvPf", 256, "gemmKernel<128>");
    check_name("_ZL12local_kernelv", 256, "local_kernel");
    check_name("_ZN12_GLOBAL__N_16kernelEv", 256, "(anonymous_namespace)::kernel");
    check_name("_ZSt4swapIiEvRT_S1_", 256, "std::swap<int>");
    check_name("_ZNK3foo3barEv", 256, "foo::bar");
    check_name("_Z99short", 256, "_Z99short");          /* a length past the end: as it is */
    check_name("_Zweird", 256, "_Zweird");
    check_name("void f(int \"x\")\\", 256, "void_f(int__x_)_"); /* quoting characters */
    check_name(NULL, 256, "?");
    check_name("", 256, "?");
    check_name("abcdefghij", 8, "abcdefg");
    check_name("_ZN8cublasLt8epilogueE", 12, "cublasLt::e");
}

int main(void) {
    if (timing_init(1, 64) != 0) return 1;
    timing_set_trace_limit(6); /* steps 1 and 2 keep five records; step 3 one more */
    timing_set_origin(timing_now_ms());
    g_origin = timing_now_ms();
    timing_begin_step(1, 0);
    timing_ctx ctx = timing_context();
    /* compute 1-3 ms and 5-6 ms; communication 2-4 ms on the DP stream; an op that ran
     * nothing; a host-timed compute record 1.5-2.5 ms; each with its work */
    timing_record_device("gemm", TK_COMPUTE, TP_NONE, 0, ctx, (timing_work){3e9, 1e6}, timing_no_match(), 0);
    timing_record_device("allreduce", TK_COMM, TP_DP, 3, ctx, (timing_work){0, 4096}, timing_no_match(), 1);
    timing_record_device("empty", TK_COMPUTE, TP_NONE, 0, ctx, (timing_work){5, 5}, timing_no_match(), 2);
    timing_record_device("gemm", TK_COMPUTE, TP_NONE, 0, ctx, (timing_work){3e9, 1e6}, timing_no_match(), 3);
    timing_record_op("host_op", TK_COMPUTE, TP_NONE, 0, ctx, (timing_work){0, 8}, timing_no_match(),
                     g_origin + 1.5, g_origin + 2.5);
    timing_device_work("staged_allreduce", TK_COMM, 5);
    timing_resolve_device(fake_read, fake_piece);
    check(g_reads == 4, "every device record read once, host records not at all");
    timing_end_step(10.0);

    const timing_step_summary *s = &timing_steps()[0];
    /* compute union 1-3 and 5-6 = 3 ms; comm 2-4 = 2 ms, of which 2-3 under compute */
    check(near(s->compute_ms, 3.0), "compute time is the union of the compute intervals");
    check(near(s->comm_ms, 2.0), "communication time");
    check(near(s->exposed_comm_ms, 1.0), "exposed communication = comm not under compute");
    const timing_kernel_stats *g = kernel("gemm"), *a = kernel("allreduce"), *h = kernel("host_op");
    check(g && g->s.count == 2 && g->s.n_overlapped == 1 && g->s.n_isolated == 1 &&
              near(g->s.overlapped_us, 2000) && near(g->s.isolated_us, 1000),
          "gemm: one instance beside communication (2 ms), one alone (1 ms)");
    check(a && a->s.count == 1 && a->s.n_overlapped == 1, "allreduce ran beside compute");
    check(h && h->s.count == 1 && near(h->s.sum_us, 1000), "host-timed record kept its time");
    check(g->flops == 6e9 && g->bytes == 2e6 && a->flops == 0 && a->bytes == 4096 &&
              h->bytes == 8,
          "each kernel sums its instances' work");
    check(kernel("empty") == NULL, "an op that ran nothing on the device is dropped");
    check(timing_untimed(TK_COMPUTE) == 1 && timing_untimed(TK_COMM) == 0,
          "and counted as an untimed compute record");
    check(timing_n_trace() == 4, "the trace holds the four records that ran");
    const timing_device_kernel *dg = device_kernel("gemm", "k_gemm");
    check(dg && dg->s.count == 2 && near_us(dg->s.sum_us, 1800) && dg->s.n_isolated == 2 &&
              near_us(dg->s.isolated_us, 1800),
          "both gemms' k_gemm under gemm, neither beside communication");
    dg = device_kernel("gemm", "k_epilogue");
    check(dg && dg->s.count == 1 && near_us(dg->s.sum_us, 500) && dg->s.n_overlapped == 1,
          "a second kernel of an op kept apart, beside the all-reduce");
    dg = device_kernel("allreduce", "nccl_kernel");
    check(dg && dg->s.count == 1 && near_us(dg->s.sum_us, 2000) && dg->s.n_overlapped == 1,
          "a communication op's kernel, beside compute");
    dg = device_kernel(TIMING_NO_OP, "memcpy_HtoD");
    check(dg && dg->s.count == 1 && near_us(dg->s.sum_us, 250) && dg->s.n_overlapped == 1,
          "work outside every op, under (none), beside the all-reduce");
    check(!device_kernel("empty", "k_lost") && !device_kernel(TIMING_NO_OP, "k_lost"),
          "the pieces of an op the timer could not read are left out with it");
    dg = device_kernel("staged_allreduce", "wait_flag_kernel");
    check(dg && dg->s.count == 1 && near_us(dg->s.sum_us, 400) && dg->s.n_overlapped == 1 &&
              !device_kernel(TIMING_NO_OP, "wait_flag_kernel"),
          "device work handed to a host-timed op: under its name, as communication (beside "
          "compute, not beside communication)");
    check(!kernel("staged_allreduce"), "and no record of its own");
    check(timing_n_device_kernels() == 5, "and a handle no record has is left out too");

    /* next step: host records only (of step 1's size: one kernel entry); nothing of the
     * last step's handles may be read */
    g_reads = 0;
    timing_begin_step(2, 0);
    timing_record_op("host_op", TK_COMPUTE, TP_NONE, 0, ctx, (timing_work){0, 8}, timing_no_match(),
                     g_origin + 20, g_origin + 21);
    timing_resolve_device(fake_read, NULL);
    check(g_reads == 0, "handles of an earlier step are not read again");
    timing_end_step(5.0);
    check(kernel("host_op")->s.count == 2, "host record of the second step counted");

    /* a third step of two records: one fills the trace, one is left out of it */
    timing_begin_step(3, 0);
    timing_record_op("host_op", TK_COMPUTE, TP_NONE, 0, ctx, (timing_work){0, 8}, timing_no_match(),
                     g_origin + 30, g_origin + 31);
    timing_record_op("host_op", TK_COMPUTE, TP_NONE, 0, ctx, (timing_work){0, 8}, timing_no_match(),
                     g_origin + 32, g_origin + 33);
    timing_end_step(5.0);
    check(timing_n_trace() == 6 && timing_trace_omitted() == 1,
          "a record past the trace's cap is left out of it and counted");
    check(kernel("host_op")->s.count == 4, "records past the trace's cap are still timed");
    check(timing_dropped() == 0, "nothing dropped untimed");
    timing_shutdown();

    /* warm-up and probe steps: in neither the op statistics nor the device kernels */
    if (timing_init(1, 64) != 0) return 1;
    timing_set_warmup(1);
    timing_set_origin(timing_now_ms());
    g_origin = timing_now_ms();
    for (int step = 1; step <= 3; step++) {
        timing_begin_step(step, step == 2); /* step 1 warms up; step 2 is a probe */
        timing_record_device("gemm", TK_COMPUTE, TP_NONE, 0, ctx, (timing_work){0}, timing_no_match(), 0);
        timing_device_work("staged_allreduce", TK_COMM, 5);
        timing_resolve_device(fake_read, fake_piece);
        timing_end_step(10.0);
        dg = device_kernel("gemm", "k_gemm");
        const timing_device_kernel *dw = device_kernel("staged_allreduce", "wait_flag_kernel");
        if (step < 3)
            check(timing_n_device_kernels() == 0,
                  step == 1 ? "warm-up step: no device kernels" : "probe step: no device kernels");
        else
            check(dg && dg->s.count == 1 && near_us(dg->s.sum_us, 800) && dw && dw->s.count == 1 &&
                      near_us(dw->s.sum_us, 400),
                  "the next step's are counted, a host-timed op's device work too");
    }
    check(!kernel("staged_allreduce") && timing_n_trace() == 3,
          "device work alone is no record, in the statistics or the trace, in any step");
    g_pieces_on = 0;
    timing_begin_step(4, 0);
    timing_record_device("gemm", TK_COMPUTE, TP_NONE, 0, ctx, (timing_work){0}, timing_no_match(), 0);
    timing_resolve_device(fake_read, fake_piece);
    timing_end_step(10.0);
    long policy_gemms = 0; /* steps 3 and 4 (the probe step's have their own entry) */
    for (int i = 0; i < timing_n_kernels(); i++)
        if (!timing_kernels()[i].probe && strcmp(timing_kernels()[i].name, "gemm") == 0)
            policy_gemms += timing_kernels()[i].s.count;
    check(device_kernel("gemm", "k_gemm")->s.count == 1 && policy_gemms == 2,
          "a timer that sees no kernels adds none, and its ops are timed");
    timing_shutdown();
    check_kernel_names();
    if (failures) {
        printf("%d check(s) failed\n", failures);
        return 1;
    }
    printf("device-timed records resolve as expected\n");
    return 0;
}
