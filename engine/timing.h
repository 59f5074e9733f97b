/* Per-kernel timing of real training steps (profile.timing = kernel).
 *
 * Every backend op and every collective or send/recv becomes one record: name, kind
 * (compute or comm), parallelism, layer, micro-batch, phase, stream, start, end. On the
 * CPU a record is two clock readings on the thread that runs the op: compute ops run
 * inline on the main thread (stream 0), communication on its lane's thread (streams
 * 1 tp, 2 pp, 3 dp). Records of a step go into storage allocated before the step; the
 * step's analysis (busy time, exposed communication, which kernels ran beside
 * communication) runs after the step's clock has stopped. */
#ifndef GPTC_TIMING_H
#define GPTC_TIMING_H

#include <stddef.h>
#include <stdint.h>

/* Monotonic wall clock in milliseconds. For tests of the ranks' clock alignment,
 * GPTC_TEST_CLOCK_PPM = x makes it run x ppm fast from its first reading. */
double timing_now_ms(void);

typedef enum { TK_COMPUTE, TK_COMM } timing_kind;
typedef enum { TP_NONE, TP_DP, TP_TP, TP_PP, TIMING_PARS } timing_par;
typedef enum { PH_FWD, PH_BWD, PH_OPT } timing_phase;
enum { TIMING_STREAMS = 4 }; /* 0 compute, 1 tp, 2 pp, 3 dp */

/* What the main thread is working on; ops and collectives issued now carry it. */
typedef struct {
    int16_t layer;  /* -1: not inside a transformer layer (embedding, head, optimizer) */
    int16_t micro;  /* -1: not tied to a micro-batch */
    int8_t phase;   /* timing_phase */
} timing_ctx;

/* The work of one op call, as the report's rates count it (engine/timed_backend.c has
 * each op's model, parallel/comm.c each collective's):
 * flops: the floating-point operations of its products (2 per multiply-add of a matmul or
 *   of the attention's Q K^T, P V and, backward, its four gradient products and the
 *   recomputed Q K^T; causal pairs only): the attention's backward is 2.5x its forward, as
 *   FlashAttention-2 counts it, whether or not a backend keeps P. Elementwise arithmetic
 *   is not counted, so an elementwise op has 0.
 * bytes: the memory traffic it needs at the least: each input read once and each output
 *   written once (read too where the op adds into it); for a collective, its buffer as
 *   nccl-tests counts it (whose rate is then their "algbw"). */
typedef struct {
    double flops, bytes;
} timing_work;

/* Which op of the other ranks a communication record is the same op as, so that its wait
 * for them can be found after the run (parallel/comm_wait.c): the seq-th collective on
 * its group (a broadcast's and a reduce's kinds of their own: they need their root, or
 * the root needs them), or the seq-th send to (receive from) the group's rank peer with
 * tag, which the peer's seq-th receive from (send to) this rank with that tag matches. */
typedef enum { TM_NONE, TM_COLL, TM_BCAST, TM_REDUCE, TM_SEND, TM_RECV } timing_match_kind;
typedef struct {
    int8_t kind, group; /* timing_match_kind; comm_group_id (parallel/comm.h) */
    int16_t peer;       /* a send's destination, a receive's source, a broadcast's or reduce's
                         * root: rank in the group */
    int32_t tag, seq;
} timing_match;

typedef struct {
    const char *name;   /* a string literal: op or collective name */
    int8_t kind, par, phase, stream;
    int16_t layer, micro;
    int32_t step;
    float flops, bytes; /* timing_work of the call */
    timing_match match; /* kind TM_NONE for compute */
    /* the first wait_us of the op spent waiting for the last other rank it needs to start
     * it (a late sender, a collective's last member), set by comm_match_waits; -1: not
     * known (compute, one rank, or a peer's record missing) */
    float wait_us;
    /* world rank of a transfer's peer or of a broadcast's or reduce's root, for the trace;
     * set by comm_match_waits, -1 otherwise */
    int16_t peer_rank;
    /* ran while the other kind was in flight (the kernel statistics' split), set when the
     * step closes: the waits found after the run are split the same way */
    int8_t overlapped;
    double start_us, end_us; /* since the run's common start (all ranks) */
} timing_record;

/* 0 with timing off; capacity is the number of records a step may hold. */
int timing_init(int kernel_level, size_t capacity);
void timing_shutdown(void);
int timing_on(void);
/* Sets the run's time origin (timing_now_ms's clock): one instant for all ranks, each in
 * its own clock, so that their traces line up. */
void timing_set_origin(double origin_ms);
double timing_origin_ms(void);
/* Maps every time u kept for the trace (records, step spans; all in us since the origin)
 * to u * factor + shift_us: a clock's drift from rank 0's, measured over the run, taken
 * out (engine/trainer.c). */
void timing_map_times(double factor, double shift_us);
void timing_set_context(int layer, int micro, timing_phase phase);
/* Names the matrix products issued next by their role in the model ("qkv", "attn_proj",
 * "fc", "fc_proj", "lm_head"), so that the report tells their shapes apart; their records
 * are then "<role>_fwd" and "<role>_bwd". */
void timing_matmul_role(const char *role);
const char *timing_matmul_name(int backward);
/* the name of the op with the GELU fused, in the current role (fc_gelu_fwd, fc_proj_dgelu_bwd) */
const char *timing_matmul_gelu_name(int backward);
timing_ctx timing_context(void);
/* The match of a record no other rank's op pairs with: compute, a combined send-receive */
static inline timing_match timing_no_match(void) { return (timing_match){TM_NONE, -1, -1, 0, 0}; }
/* One op call timed on the host, [start_ms, end_ms); match: what a communication op is
 * among the other ranks' ops. Thread-safe, allocation-free; dropped (and counted) when the
 * step's storage is full. */
void timing_record_op(const char *name, timing_kind kind, timing_par par, int stream,
                      timing_ctx ctx, timing_work work, timing_match match, double start_ms,
                      double end_ms);
/* The same for an op timed on a device: op is its handle from the backend's timer
 * (engine/backend.h), resolved into times after the step by timing_resolve_device. */
void timing_record_device(const char *name, timing_kind kind, timing_par par, int stream,
                          timing_ctx ctx, timing_work work, timing_match match, int op);
/* The device work enqueued under timer handle op belongs to op name of kind, whose time a
 * host-timed record gives: host staging's copies and flag kernels around an MPI call on
 * a host thread. Without it that work counts as launched outside every op, as compute,
 * and its flag kernel's wait for the MPI call reads as a compute kernel slowed by
 * communication. No record of its own: its kernels only go to the device kernels. The
 * handle is never read, so a spoiled one would not be refused: only cuBLASLt's candidate
 * timing spoils ops, and only compute ops. Dropped when the step is full, uncounted. */
void timing_device_work(const char *name, timing_kind kind, int op);
/* The backend's timer_piece (engine/backend.h) */
typedef int (*timing_piece_fn)(size_t i, int *op, const char **kernel, double *start_ms,
                               double *end_ms);
/* Turns the step's device handles into times (read: the backend's timer_read); ops that
 * ran nothing on the device are dropped. Where piece is not NULL, the step's device
 * kernels are kept under the names of their ops, and timing_end_step adds them to
 * timing_device_kernels. Call after the step's work has completed and before
 * timing_end_step. */
void timing_resolve_device(int (*read)(int op, double *start_ms, double *end_ms),
                           timing_piece_fn piece);
/* probe: this step runs with every overlap policy forced to none (the contention probe),
 * and its kernels go to separate statistics: the serialized baseline. */
void timing_begin_step(long step, int probe);
/* The step's clock stopped at at_ms (timing_now_ms): the end of its span in the trace,
 * where the reading of a device's times that follows does not belong. Optional: without
 * it the span ends at timing_end_step. */
void timing_stop_clock(double at_ms);
/* Closes the step: iter_ms is its wall time. Analyses its records (outside the step). */
void timing_end_step(double iter_ms);
/* The run's first n steps (counted from its first timing_begin_step, so a resumed run
 * warms up too) are warm-up: a GPU's first step loads modules, plans each product and
 * touches memory for the first time. Their records go to the trace but not into the
 * kernel statistics, and their step summaries are marked. 0 (the default): none. */
void timing_set_warmup(int n);
int timing_warmup(void);

/* Per-step summary of one rank (report "steps"). */
typedef struct {
    long step;
    int probe;
    double iter_ms, compute_ms, comm_ms, exposed_comm_ms;
    /* the same two for the communication of each parallelism alone (TP_DP, TP_TP, TP_PP;
     * [TP_NONE] stays 0); they may overlap each other, so their sums can exceed comm_ms
     * and exposed_comm_ms */
    double par_comm_ms[TIMING_PARS], par_exposed_ms[TIMING_PARS];
    /* the part of exposed_comm_ms (par_exposed_ms) when every communication op in flight
     * was waiting for another rank to start it, no data moving and no compute running:
     * time lost to a late peer (a pipeline bubble, a slower rank), not to the network.
     * Filled by timing_sum_waits; has_wait 0 where no wait is known. */
    int has_wait;
    double wait_ms, par_wait_ms[TIMING_PARS];
    int whole; /* every record of the step was kept for the trace (the waits need them all) */
    double start_us, end_us; /* the step's span on the run's clock */
    int warmup;              /* one of the run's first profile.warmup steps: in the trace and
                              * the steps list, not in the kernel statistics or the means */
    int has_power;           /* profile.power: this rank's GPU readings of the step */
    double energy_j, power_w, sm_clock_mhz;
} timing_step_summary;

/* A kernel's instances of one rank: all, and split into those that ran while the other
 * kind (communication for compute, compute for communication) was in flight and the
 * rest */
typedef struct {
    long count, n_isolated, n_overlapped;
    double sum_us, isolated_us, overlapped_us;
} timing_split;

/* Per-kernel totals of one rank (merged over ranks by the report), for each parallelism
 * and call size apart: a dp all-reduce of gradient buckets and a tp all-reduce of
 * activations share a name, not their sizes or their contention, and a slowdown of an op
 * whose isolated calls are large and overlapped ones small (the forward's and the
 * backward's zeroing) measures the sizes, not the contention. */
typedef struct {
    const char *name;
    int kind;
    int par;            /* timing_par; TP_NONE for every compute op */
    int probe;          /* gathered in contention-probe steps */
    double call_bytes;  /* timing_work.bytes of one call (a record's, as a float keeps it) */
    timing_split s;
    double flops, bytes; /* timing_work summed over the s.count instances */
    /* A communication op's instances whose wait for other ranks is known
     * (timing_sum_waits): their waits, split as s is; and, in steps the trace kept whole,
     * their durations less those waits (the time each moved data), split by whether
     * compute ran beside that moving part. A comm op beside compute is often waiting for a
     * rank that is still computing: its slowdown is mostly that wait, not contention. */
    timing_split wait, moving;
    double moving_bytes; /* timing_work.bytes of the moving instances */
    /* Of those in whole steps, the instances whose wait took all of their time as far as
     * the clocks tell (a collective that seemed to end before its last member started,
     * by the clocks' alignment error): their moving time is below what was measured, so
     * they are counted here and left out of moving, where a 0 would pull its means down */
    long all_wait;
} timing_kernel_stats;

/* The device kernels behind the ops (report "device_kernels"): the kernels, copies and
 * sets each op's launches ran, by op name and kernel name, over the steps that also make
 * the kernel statistics (after warm-up, outside contention-probe steps), split as the
 * ops are into the instances that ran while the other kind was in flight (overlapped)
 * and the rest. op is TIMING_NO_OP for work launched outside every op (counted as
 * compute). Empty unless a timer saw them. */
#define TIMING_NO_OP "(none)"
typedef struct {
    const char *op, *kernel; /* op: a record's name; kernel: lives as long as the run */
    timing_split s;
} timing_device_kernel;
int timing_n_device_kernels(void);
const timing_device_kernel *timing_device_kernels(void);

/* Attaches GPU readings (profile.power) to the step timing_end_step closed last. */
void timing_note_power(double energy_j, double power_w, double sm_clock_mhz);
int timing_n_steps(void);
const timing_step_summary *timing_steps(void);
int timing_n_kernels(void);
const timing_kernel_stats *timing_kernels(void);
/* Records kept for the trace (every step's, up to a cap of 2e6 per rank); how many were
 * dropped untimed (over a step's capacity), and how many were timed but left out of the
 * trace (past its cap). */
size_t timing_n_trace(void);
const timing_record *timing_trace(void);
long timing_dropped(void);
long timing_trace_omitted(void);
/* Device-timed records of kind (TK_COMPUTE, TK_COMM) whose op the timer saw no work of
 * (left out of every figure): an op with nothing to launch, or kernels CUPTI did not tie
 * to the op. */
long timing_untimed(int kind);
/* Sets wait_us of kept record i (parallel/comm_wait.c), then timing_sum_waits adds the
 * waits into the kernel statistics and the step summaries (once, after the last step). */
void timing_set_wait(size_t i, float wait_us);
void timing_set_peer_rank(size_t i, int world_rank);
void timing_sum_waits(void);
/* The trace's cap in records, after timing_init (tests use a small one). */
void timing_set_trace_limit(size_t records);

const char *timing_kind_name(int kind);
const char *timing_par_name(int par);
const char *timing_phase_name(int phase);

#endif
