/* One training run from config to final checkpoint. The order matters for users: every
 * check that can fail (config, shapes, data, checkpoint, save path) runs before the big
 * allocations and before step 1, so a typo costs seconds. */
#define _POSIX_C_SOURCE 200809L
#include "engine/trainer.h"

#include <errno.h>
#include <mpi.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "data/tokens.h"
#include "engine/backend.h"
#include "engine/checkpoint.h"
#include "engine/cpu/cpu_blas.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/power.h"
#include "engine/log.h"
#include "engine/metrics_log.h"
#include "engine/nvtx.h"
#include "engine/output_files.h"
#include "engine/report.h"
#include "engine/run_plan.h"
#include "engine/stop_signal.h"
#include "engine/timed_backend.h"
#include "engine/timing.h"
#include "engine/watchdog.h"
#include "layers/gpt.h"
#include "layers/gpt_checkpoint.h"
#include "layers/optimizer.h"
#include "parallel/comm.h"
#include "parallel/comm_wait.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/tensor.h"

enum { ERR_LEN = 1024 };

/* The compute backend of train.device, and NVML when profile.power is on. Collective: a
 * rank without a usable GPU, or with one whose shared memory the model's attention does
 * not fit, fails every rank; the lowest such rank fills err, the others return NULL with
 * err empty. */
static const gptc_backend *start_backend(const gptc_config *c, const grid *g,
                                         const gpt_shape *shape, char *err, size_t n) {
    const gptc_backend *be = NULL;
    if (strcmp(c->device, "cuda") == 0) {
        /* ranks on a node share its GPUs by their index on the node */
        MPI_Comm node;
        int local = 0;
        if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g->rank, MPI_INFO_NULL,
                                &node) == MPI_SUCCESS) {
            MPI_Comm_rank(node, &local);
            MPI_Comm_free(&node);
        }
        be = cuda_backend(local, err, n);
        gptc_precision p = strcmp(c->precision, "bf16") == 0 ? GPTC_BF16 : GPTC_FP32;
        if (be && cuda_backend_check_model(shape->d_model / shape->n_head, p, err, n) != 0)
            be = NULL;
    } else {
        be = cpu_backend();
        /* the one reason it can fail: OpenBLAS did not load */
        if (!be) snprintf(err, n, "train.device = cpu: %s", cpu_blas_error());
    }
    char bus[32];
    if (be && c->power &&
        power_open(cuda_backend_device(), cuda_backend_pci_bus_id(bus, sizeof bus), err, n) != 0)
        be = NULL;
    /* the lowest failing rank speaks for all: one line, naming it */
    int first = grid_first_failing(!be, g->rank, g->world, NULL);
    if (first == g->world) return be;
    if (first != g->rank) err[0] = '\0';
    return NULL;
}

/* The whole model's parameters, unpadded: what a checkpoint holds, whatever part of them a
 * rank's buffers hold (a TP shard, a pipeline stage, with padding) */
static double model_params(const gpt_shape *s) {
    int n = 0;
    param_tensor *all = gpt_full_table(s, &n);
    double count = 0;
    for (int i = 0; all && i < n; i++) count += (double)all[i].rows * all[i].cols;
    free(all);
    return count;
}

static void print_model(const gpt_model *m, const batch_plan *bp, long first, long last,
                        const char *c_precision) {
    const gpt_shape *s = &m->shape;
    log_info("model: %d layers, %d heads, d_model %d, n_ctx %d, vocab %d (padded %d): %.3f M parameters\n",
             s->n_layer, s->n_head, s->d_model, s->n_ctx, s->vocab_size, s->vocab_padded,
             (double)model_params(s) / 1e6);
    log_info("batch: %d rows x %d tokens, %d micro-batch(es) of %d; steps %ld..%ld\n", bp->B, bp->T,
             bp->n_micro, bp->mb, first, last);
    size_t copy = m->params_act != m->params ? m->n_params * gptc_act_bytes(m->prec) : 0;
    log_info("memory per rank: parameters %.1f MiB (+ %.1f MiB bf16 copy), gradients %.1f MiB, "
             "optimizer state %.1f MiB, activations %.1f MiB\n",
             m->n_params * sizeof(float) / 1048576.0, copy / 1048576.0,
             m->n_params * sizeof(float) / 1048576.0, 2.0 * m->n_opt * sizeof(float) / 1048576.0,
             m->act_bytes / 1048576.0);
    if (strcmp(c_precision, "bf16") == 0)
        log_info("precision: bf16 activations and parameter copy (products with fp32 "
                 "accumulation); master parameters, gradients and optimizer state in fp32\n");
    char kernels[160];
    if (strcmp(m->be->name, "cuda") == 0 &&
        cuda_backend_attention_kernels(s->d_model / s->n_head, m->prec, kernels, sizeof kernels))
        log_info("attention kernels (bf16, head size %d): %s\n", s->d_model / s->n_head, kernels);
    if (strcmp(m->be->name, "cuda") == 0)
        log_info("backend: %s on GPU %d (rank 0), communication: %s\n", m->be->name,
                 cuda_backend_device(), comm_backend_description());
    else if (m->be->on_device)
        log_info("backend: %s, communication: %s\n", m->be->name, comm_backend_description());
    else
        log_info("backend: %s, %d OpenMP thread(s), OpenBLAS kernels %s\n", m->be->name,
                 omp_get_max_threads(), cpu_blas_corename());
}

/* OpenBLAS maps its buffers as it starts and at its first products: one that fails is
 * retried for ever, with no word (its issue 5289; under 0.8 to 1.2 GB on the machines
 * tried), so a low limit is named before it loads */
static void warn_address_space(const gptc_config *c, const grid *g) {
    struct rlimit as;
    int low = strcmp(c->device, "cpu") == 0 && getrlimit(RLIMIT_AS, &as) == 0 &&
              as.rlim_cur != RLIM_INFINITY && as.rlim_cur < (rlim_t)2 << 30;
    /* the lowest rank so limited says it, naming itself unless every rank is: a limit on
     * one rank (its node's, its wrapper's) went unsaid when only rank 0 looked, and that
     * rank hung in step 1 while its peers blamed it */
    int all = 0, first = grid_first_failing(low, g->rank, g->world, &all);
    if (first != g->rank) return;
    char who[32] = "";
    if (g->world > 1 && !all) snprintf(who, sizeof who, "rank %d: ", g->rank);
    log_warn_here("%sthe address space is limited to %.0f MiB (ulimit -v): OpenBLAS may fail "
                  "to map its buffers and then retry for ever, in the start-up or in step 1, "
                  "with no word; give it 2 GiB or more", who, (double)as.rlim_cur / 1048576.0);
}

typedef struct {
    const gptc_config *c;
    const grid *g;
    comm_group world, tp, pp, dp, embedding;
    comm_lane tp_lane, pp_lane, dp_lane; /* one communication stream per parallelism */
    int have_groups;
    tp_context tpc;
    dp_context dpc;
    pp_context ppc;
    size_t sp_done;            /* LayerNorm gradients below this are summed over TP */
    int policy_dp, policy_pp, policy_tp_chunks; /* the configured overlap policies */
    gpt_model model;
    batch_loader *loader;
    FILE *log;
    long log_lost; /* lines of the metrics log that could not be written (the first said) */
    int32_t *inputs, *targets; /* [B/dp, T] each, this rank's rows of the step */
    long *kept;                /* [SAVE_KEPT_FOUND + keep + 1] steps whose checkpoints are
                                * kept, oldest first */
    int n_kept;
    int speaker;               /* the lowest rank that failed a collective check, or -1 */
    /* the plan, from the start-up checks */
    gpt_shape shape;
    batch_plan bp;
    long first;                /* the first step to run: train.init's step + 1, or 1 */
    ckpt_file *init;           /* train.init, open from its check to its load; NULL: none */
    ckpt_meta meta;            /* train.init's */
    int has_optim;             /* train.init holds /optim, of AdamW's step optim_t */
    long optim_t;
    long t;                    /* AdamW's step count: optim_t, then one more an update */
    int kernel_timing;         /* profile.timing = kernel */
    char doing[ERR_LEN];       /* what the start-up reads, for the watchdog's message */
    atomic_long current_step;  /* what the watchdog reports (0: the start-up); its thread
                                * reads it */
    /* with kernel timing, the clock offset to rank 0 at the time origin, measured at
     * at0_ms (this rank's clock) within rtt0_ms / 2 */
    double clock0_ms, rtt0_ms, at0_ms;
} run_state;

static void run_free(run_state *r) {
    /* the watchdog stays until MPI_Finalize: draining a lane or freeing a group waits for
     * peers too, and a dead peer must not hang that. Streams first: communication still
     * queued reads and writes the buffers below */
    dp_params_settle(&r->dpc, &r->model);
    comm_lane_free(&r->tp_lane);
    comm_lane_free(&r->pp_lane);
    comm_lane_free(&r->dp_lane);
    dp_free(&r->dpc);
    pp_free(&r->ppc);
    /* A device's teardown (its memory, communicators, the profiler's last buffers) is
     * held as its start was; its peers wait as long in MPI_Finalize (main.c). Here,
     * after the last communication op: its beat would end the hold. */
    if (strcmp(r->c->device, "cuda") == 0) watchdog_hold(WATCHDOG_DEVICE_S);
    gpt_destroy(&r->model);
    if (r->loader) loader_destroy(r->loader);
    if (r->log) fclose(r->log);
    if (r->log_lost)
        log_warn("train.log_file %s: %ld step line(s) could not be written and are missing "
                 "from it", r->c->log_file, r->log_lost);
    free(r->inputs);
    free(r->targets);
    free(r->kept);
    timing_shutdown();
    power_close();
    /* freeing a group waits for its peers: a hang there is still this run's (its step,
     * its communicators to abort; a group leaves the hooks' registry before it goes) */
    if (r->have_groups) {
        comm_group_free(&r->tp);
        comm_group_free(&r->pp);
        comm_group_free(&r->dp);
        comm_group_free(&r->embedding);
        comm_group_free(&r->world);
    }
    /* the watchdog goes on to MPI_Finalize, without this run's step counter */
    watchdog_set_comm_hooks(NULL, NULL);
    watchdog_set_step(NULL);
}

/* path's size in bytes; 0 when it cannot be told */
static double file_bytes(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (double)st.st_size : 0;
}

/* Ranks that failed alone (a file one rank could not read) make every rank stop here:
 * returns nonzero on every rank if rc was nonzero on any. The lowest failing rank is then
 * r->speaker, which alone reports (the others would say the same, or less). */
static int agree(run_state *r, int rc) {
    if (!r->have_groups || r->g->world == 1) return rc;
    int world = r->g->world, worst = comm_max_int(&r->world, rc != 0 ? world - r->g->rank : 0);
    if (worst > 0) r->speaker = world - worst;
    return worst > 0;
}

/* Clocks drift apart (tens of ppm between nodes: a millisecond or more an hour), so the
 * offset to rank 0's clock taken before the time origin (offset0_ms at at0_ms on this
 * rank's clock, within rtt0_ms / 2) no longer holds for a long run's last steps. Taken
 * again at the end, a change larger than the two measurements' error is a drift, taken as
 * linear between the two measurements' instants: this rank's trace and step times are
 * mapped onto rank 0's timeline. The rate is the change over the time between those
 * instants, not up to now: on a loaded node the later round trips of one measurement
 * take hundreds of ms (test_timing's drift case saw a collective 24 ms off when the rate
 * was taken over the time up to the measurement's end). Durations change by the rate
 * alone (ppm), so the statistics stay as they are. Collective. */
static void align_clocks(run_state *r, double offset0_ms, double rtt0_ms, double at0_ms) {
    double rtt = 0, at = 0, offset = comm_clock_offset_ms(&r->world, &rtt, &at);
    double elapsed = at - at0_ms; /* this rank's clock, between the two measurements */
    double drift = offset - offset0_ms, error = (rtt0_ms + rtt) / 2;
    int apply = elapsed > 0 && fabs(drift) > error;
    if (apply) {
        /* a time u since the origin L0 = timing_origin_ms() is local t = L0 + u, at which
         * this clock is offset0 + rate (t - at0) ahead of rank 0's; the origin on rank
         * 0's clock is L0 - offset0 (trainer's start) */
        double rate = drift / elapsed;
        timing_map_times(1.0 - rate, -rate * (timing_origin_ms() - at0_ms) * 1e3);
    }
    double most = comm_max_double(&r->world, fabs(drift));
    double ppm = comm_max_double(&r->world, elapsed > 0 ? 1e6 * fabs(drift) / elapsed : 0);
    double worst_error = comm_max_double(&r->world, error), n_applied[1] = {apply};
    comm_sum_doubles(&r->world, n_applied, 1);
    if (n_applied[0] > 0)
        log_info("kernel timing: over the run the ranks' clocks drifted up to %.1f us from rank "
                 "0's (%.1f ppm); the trace of %.0f rank(s) is scaled back onto rank 0's "
                 "timeline, within %.1f us\n", most * 1e3, ppm, n_applied[0], worst_error * 1e3);
    else
        log_info("kernel timing: over the run the ranks' clocks moved at most %.1f us from rank "
                 "0's, within the measurements' error: the trace is left as it is\n",
                 most * 1e3);
}

static int save_checkpoint(run_state *r, long step, long t, char *err, size_t n) {
    const gptc_config *c = r->c;
    gpt_model *m = &r->model;
    char why[ERR_LEN - 16];
    int writer = r->g->dp_rank == 0, rc = 0;
    /* the optimizer state in parameter layout, assembled from the DP shards if sharded, on
     * the writers (DP rank 0) only: the other DP ranks hold the same tensors */
    float *opt_m = NULL, *opt_v = NULL; /* [n_params] each, writers' */
    dp_params_settle(&r->dpc, m); /* prefetched all-gathers land before parameters are read */
    dp_gather_masters(&r->dpc, m);
    if (t > 0) {
        if (writer) {
            opt_m = calloc(m->n_params, sizeof(float));
            opt_v = calloc(m->n_params, sizeof(float));
        }
        rc = agree(r, opt_m && opt_v ? 0 : writer ? -1 : 0);
        if (rc == 0) dp_gather_state(&r->dpc, m, opt_m, opt_v);
        else snprintf(why, sizeof(why), "%s: out of host memory for the optimizer state", c->save);
    }
    if (rc == 0) {
        /* rank 0 writes HDF5 while its loader's thread may read the next step's tokens: one
         * at a time, for an HDF5 built without its thread-safe option (data/tokens.h) */
        tokens_hdf5_lock();
        int failed_rank = -1;
        rc = gpt_save(m, &r->world, writer, c->save, step, opt_m, opt_v, t, &failed_rank, why,
                      sizeof(why));
        tokens_hdf5_unlock();
        if (rc != 0 && r->g->world > 1) r->speaker = failed_rank;
    }
    free(opt_m);
    free(opt_v);
    if (rc != 0) {
        snprintf(err, n, "train.save %s", why);
        return -1;
    }
    if (c->keep > 1 && r->g->rank == 0) save_keep_version(c->save, step, c->keep, r->kept, &r->n_kept);
    log_info("saved %s (step %ld%s)\n", c->save, step, t > 0 ? "" : ", no optimizer state");
    return 0;
}

/* The configured overlap policies, or all of them none (a contention-probe step: the
 * same math, serialized, as a baseline for every kernel from the same run). */
static void set_policies(run_state *r, int configured) {
    r->dpc.overlap = configured && r->policy_dp;
    r->ppc.async = configured && r->policy_pp;
    r->model.tp.chunks = configured ? r->policy_tp_chunks : 1;
}

static void on_params_needed(void *ctx, size_t lo, size_t hi) {
    run_state *r = ctx;
    dp_params_needed(&r->dpc, &r->model, lo, hi);
}

/* Called by the model as gradients become final during the step's last backward: the
 * sequence-parallel LayerNorm sums, then (overlap.dp = bucket) the DP buckets start. */
static void on_grads_final(void *ctx, size_t ready) {
    run_state *r = ctx;
    gpt_sequence_parallel_grads(&r->model, r->sp_done, ready);
    r->sp_done = ready;
    dp_grads_final(&r->dpc, &r->model, ready);
}

/* Test-only: GPTC_TEST_INF_GRAD_STEPS = "s1,s2,..." gives those steps an infinite
 * gradient norm on every rank (an overflow), so that a test can skip updates
 * (nan_policy = skip) without the parameters diverging for good */
static int test_inf_grad(long step) {
    const char *v = getenv("GPTC_TEST_INF_GRAD_STEPS");
    for (char *end; v && *v; v = *end ? end + 1 : end) {
        long s = strtol(v, &end, 10);
        if (end == v) return 0;
        if (s == step) return 1;
    }
    return 0;
}

/* One optimizer step: the pipeline schedule's forward and backward passes over the
 * micro-batches, the tied embedding and DP gradient reductions, global norm, clipping
 * and AdamW. Returns the step's mean loss and sets *norm. */
static double train_step(run_state *r, const batch_plan *bp, long step, long *t, double lr,
                         const optim_config *oc, double *norm, int *skipped) {
    gpt_model *m = &r->model;
    const grid *g = r->g;
    double tokens = (double)bp->B * bp->T;
    int sharded = r->dpc.sharded, piece = sharded ? g->dp_rank : 0;
    m->be->zero(m->grads, m->n_params * sizeof(float), m->stream);
    r->sp_done = 0;
    pp_run(&r->ppc, m, r->inputs, r->targets, bp->mb, bp->T, (float)(1.0 / tokens));
    timing_set_context(-1, -1, PH_BWD);
    gpt_sequence_parallel_grads(m, r->sp_done, m->n_params);
    pp_reduce_tied(&r->ppc, m);
    dp_finish_gradients(&r->dpc, m);
    m->be->synchronize(m->stream);
    double loss_sum = gpt_loss_sum(m);
    /* each number counted once over the world: losses live on the last stage (the same on
     * every TP rank); gradients are the same on every DP rank after an all-reduce, and
     * split into pieces after a reduce-scatter */
    timing_set_context(-1, -1, PH_OPT);
    double sums[2] = {loss_sum * (g->tp_rank == 0), /* loss, squared gradient norm */
                      gpt_grad_sum_squares(m, piece) * (sharded || g->dp_rank == 0)};
    if (g->world > 1) comm_sum_doubles(&r->world, sums, 2);
    double loss = sums[0] / tokens;
    *norm = test_inf_grad(step) ? INFINITY : sqrt(sums[1]);
    *skipped = !isfinite(loss) || !isfinite(*norm);
    if (!*skipped) {
        dp_params_settle(&r->dpc, m); /* the optimizer writes parameters a gather may fill */
        optim_step(m, oc, *norm, ++*t, lr, piece);
        dp_gather_params(&r->dpc, m, m->stream);
    }
    return loss;
}

/* Ends a step's work: the stream, and with kernel timing the lanes too. Work still queued
 * on a lane (ZeRO-1's prefetched gathers for the next step) belongs to this step's
 * records: it must finish before they are read, and before the next step starts on the
 * storage it writes them into. A timed step so ends with its last record, and its time
 * covers every record's. */
static void settle_step(run_state *r, int kernel_timing) {
    const gptc_backend *be = r->model.be;
    be->synchronize(r->model.stream);
    comm_lane *lanes[3] = {&r->tp_lane, &r->pp_lane, &r->dp_lane};
    for (int i = 0; i < 3 && kernel_timing; i++)
        if (lanes[i]->stream) be->stream_synchronize(lanes[i]->stream);
}

/* Closes the step begun at t0 (settled, its NVTX range popped, its device times read, its
 * timing summary and, with profile.power, its power sample in *pw taken); returns its ms. */
static double close_step(run_state *r, int kernel_timing, double t0, power_sample *pw) {
    const gptc_backend *be = r->model.be;
    settle_step(r, kernel_timing);
    double t1 = timing_now_ms(), ms = t1 - t0;
    timing_stop_clock(t1);
    nvtx_pop();
    if (kernel_timing && be->timer_read) timing_resolve_device(be->timer_read, be->timer_piece);
    timing_end_step(ms);
    *pw = (power_sample){NAN, NAN, NAN};
    if (r->c->power) {
        power_step_end(pw);
        timing_note_power(pw->energy_j, pw->power_w, pw->sm_clock_mhz);
    }
    return ms;
}

/* The timing report and trace of the steps that ran, with every rank's records on rank 0's
 * clock and each wait paired with the peer it waited for. Collective. */
static int write_timing(run_state *r, char *err, size_t n) {
    if (r->g->world > 1) {
        align_clocks(r, r->clock0_ms, r->rtt0_ms, r->at0_ms);
        comm_group *groups[] = {&r->world, &r->tp, &r->pp, &r->dp, &r->embedding};
        comm_match_waits(groups, (int)(sizeof(groups) / sizeof(groups[0])));
    }
    return report_write(&r->world, r->c->report, r->c->trace, err, n);
}

/* Replays the step whose loss or norm was not finite with every op's output checked, and
 * names the first op (over all ranks) that wrote NaN or Inf. Collective; returns the rank
 * that should report and fills where. */
static int locate_nonfinite(run_state *r, const batch_plan *bp, char *where, size_t n) {
    gpt_model *m = &r->model;
    m->be->zero(m->grads, m->n_params * sizeof(float), m->stream);
    timed_backend_hunt(1);
    pp_run(&r->ppc, m, r->inputs, r->targets, bp->mb, bp->T, (float)(1.0 / ((double)bp->B * bp->T)));
    /* the replay's bucket reductions and other lane work end here, on every rank alike:
     * the collectives that follow (write_timing's) run on the same communicators from this
     * thread, and two threads in collectives on one communicator may pair them apart */
    dp_finish_gradients(&r->dpc, m);
    settle_step(r, 1);
    (void)gpt_loss_sum(m); /* the replay's losses are not needed; the count restarts */
    timed_backend_hunt(0);
    timing_finite_report f = timed_backend_first_nonfinite();
    struct { double t; int rank; } mine = {f.found ? f.when_ms : 1e300, r->g->rank}, first = mine;
    if (r->g->world > 1) {
        watchdog_waiting("the first non-finite op's all-reduce on world");
        MPI_Allreduce(&mine, &first, 1, MPI_DOUBLE_INT, MPI_MINLOC, r->world.comm);
        watchdog_waiting(NULL);
    }
    if (first.t == 1e300) {
        snprintf(where, n, "; a replay found no op output that was not finite");
        return 0;
    }
    if (first.rank == r->g->rank) {
        char layer[32] = "";
        if (f.layer >= 0) snprintf(layer, sizeof(layer), "layer %d, ", f.layer);
        snprintf(where, n, "; first non-finite output: %s (%smicro-batch %d, %s) on rank %d", f.op,
                 layer, f.micro, timing_phase_name(f.phase), r->g->rank);
    }
    return first.rank;
}

/* Says which datasets under train.init's /model the model has no use for (a file
 * converted from Hugging Face's GPT-2 keeps its attention-mask buffers h.N.attn.bias, a
 * model with more layers than its attributes say): they are left out, not in silence.
 * -1 with err where a read of the file failed. */
static int note_unused_tensors(ckpt_file *f, const gpt_shape *shape, char *err, size_t n_err) {
    int n = 0, unknown = 0;
    param_tensor *all = gpt_full_table(shape, &n);
    const char **names = all ? malloc((size_t)n * sizeof(*names)) : NULL; /* [n] */
    if (names) {
        for (int i = 0; i < n; i++) names[i] = all[i].name;
        char first[128];
        unknown = ckpt_count_unknown(f, "model", names, n, first, sizeof first, err, n_err);
        if (unknown > 0)
            log_info("train.init %s: %d dataset(s) under /model that this model does not have "
                     "(/model/%s%s), left out\n", ckpt_file_path(f), unknown, first,
                     unknown > 1 ? ", ..." : "");
    }
    free(names);
    free(all);
    return unknown < 0 ? -1 : 0;
}

/* Says when the kernel statistics of steps first..c->steps will be empty: profile.warmup
 * leaves out the run's first steps, and a profile.contention_probe step feeds only the
 * probe's, so a short run can have no step for one side or both. */
static void warn_empty_statistics(const gptc_config *c, long first) {
    long a = first + c->prof_warmup, b = c->steps; /* the steps that make the statistics */
    if (b < first) return;                          /* no step to run */
    if (a > b) {
        log_warn("profile.warmup = %d covers every step this run takes (%ld..%ld): the kernel "
                 "statistics and the report's means will be empty", c->prof_warmup, first, b);
        return;
    }
    long n = c->contention_probe;
    if (n <= 0) return;
    long probes = b / n - (a - 1) / n; /* multiples of n in a..b */
    if (probes == 0)
        log_warn("profile.contention_probe = %ld: none of steps %ld..%ld is a probe step (every "
                 "%ld-th): no serialized baseline to compare against", n, a, b, n);
    else if (probes == b - a + 1)
        log_warn("profile.contention_probe = %ld: every one of steps %ld..%ld is a probe step: "
                 "none runs the overlap policies, whose statistics will be empty", n, a, b);
}

/* x, with a NaN's sign dropped: printf's "-nan" reads as a different value than "nan" */
static double unsigned_nan(double x) { return isnan(x) ? fabs(x) : x; }

/* metrics_write, saying once when the log could not be written (a full disk): training
 * goes on, since the checkpoints matter more than the lines, but not in silence. */
static void log_metrics(run_state *r, long step, double loss, double norm, double lr, double ms,
                        double tps, int skipped, const power_sample *pw) {
    if (metrics_write(r->log, step, loss, norm, lr, ms, tps, skipped, pw) == 0 || r->log_lost++)
        return;
    log_warn("train.log_file %s: the line of step %ld could not be written (%s); training "
             "goes on, and the lines that cannot be written are left out (their count comes "
             "at the end)", r->c->log_file, step, strerror(errno));
}

int train_test_thread_failure(const char *what, int rank) {
    const char *v = getenv("GPTC_TEST_THREAD_FAIL");
    char name[16];
    int r;
    return v && sscanf(v, "%d:%15s", &r, name) == 2 && r == rank && strcmp(name, what) == 0;
}

int train_refused(int failed, const char *err, int rank, int world) {
    int all = 0, first = grid_first_failing(failed, rank, world, &all);
    /* rank 0 names itself too where others passed: the cause is its alone */
    if (first == rank && (first > 0 || !all)) log_error("rank %d: %s", rank, err);
    else if (first == rank) log_error("%s", err);
    return first < world;
}

/* The checks every rank makes alike before anything is allocated: the config, train.init's
 * meta against [model] (and against rank 0's file), the shape, batch and pipeline plans,
 * the first step, the outputs (rank 0) and what the device can run. -1 with err naming
 * the first that fails. */
/* The watchdog's word for a hang (a corrupt file the HDF5 library loops over) or a crash
 * while the start-up reads an input: "reading train.init ck.h5". watchdog_doing(NULL)
 * when done. */
static void reading(run_state *r, const char *key, const char *path) {
    watchdog_doing(NULL); /* not read while it is rewritten */
    snprintf(r->doing, sizeof r->doing, "reading %s %s", key, path);
    watchdog_doing(r->doing);
}

static int plan_run(run_state *r, char *err, size_t n) {
    const gptc_config *c = r->c;
    const grid *g = r->g;
    if (config_validate(c, err, n) != 0 || plan_check_supported(c, g, err, n) != 0) return -1;
    if (c->init[0]) {
        char why[ERR_LEN - 16];
        reading(r, "train.init", c->init);
        r->init = ckpt_open(c->init, &r->meta, &r->has_optim, &r->optim_t, why, sizeof(why));
        watchdog_doing(NULL);
        if (!r->init) {
            memset(&r->meta, 0, sizeof(r->meta));
            snprintf(err, n, "train.init %s", why);
        }
        /* on every rank, opened or not: a broadcast (a rank that could not open it reports
         * that, not the difference) */
        plan_same_init(c->init, &r->meta, r->has_optim, r->optim_t, g->world, err[0] ? NULL : err,
                       n);
        if (err[0]) return -1;
    }
    if (plan_layout(c, g, r->init ? &r->meta : NULL, &r->shape, &r->bp, err, n) != 0)
        return -1;
    r->first = r->init ? r->meta.step + 1 : 1;
    if (r->first > c->steps + 1) {
        snprintf(err, n, "train.steps = %ld is before the checkpoint's step %ld (train.init %s)",
                 c->steps, r->meta.step, c->init);
        return -1;
    }
    if (g->rank == 0 && plan_check_outputs(c, r->first, err, n) != 0) return -1;
    return plan_check_device(c, &r->shape, r->bp.T, err, n);
}

/* profile.timing = kernel: room for a step's records (the timed op table, installed by the
 * caller, times every op into them). -1 with err when the records cannot be had. */
static int start_kernel_timing(run_state *r, char *err, size_t n) {
    const gpt_shape *s = &r->shape;
    /* room for the ops of a step: ~50 records per layer and micro-batch, plus the loss,
     * optimizer and bucket traffic, with a margin; chunked TP multiplies them, and the
     * records grow past this where a step needs it (timing.c) */
    size_t per_step = ((size_t)s->n_layer * 64 + 128) * (size_t)r->bp.n_micro +
                      (size_t)s->n_layer * 64 + 1024;
    if (timing_init(1, per_step) != 0) {
        snprintf(err, n, "profile.timing = kernel: out of memory for %zu records", per_step);
        return -1;
    }
    timing_set_warmup(r->c->prof_warmup);
    return 0;
}

/* The communicators (the world, each parallelism's group, the tied embedding's), a stream
 * for each parallelism, and the TP and pipeline contexts. Collective; -1 with err on the
 * rank that failed (every rank returns -1). */
static int start_comm(run_state *r, const gptc_backend *be, char *err, size_t n) {
    const gptc_config *c = r->c;
    const grid *g = r->g;
    comm_options copt = {c->comm_max_ctas, strcmp(c->comm_cta_policy, "efficiency") == 0 ? 1
                                           : strcmp(c->comm_cta_policy, "zero") == 0     ? 2
                                                                                         : 0};
    comm_set_options(&copt);
    if (comm_world(&r->world, be) != 0 ||
        comm_grid_groups(&r->world, g, &r->tp, &r->pp, &r->dp, err, n) != 0) {
        if (!err[0]) snprintf(err, n, "comm: %s", comm_error(&r->world));
        return -1;
    }
    r->have_groups = 1;
    int high = strcmp(c->comm_priority, "high") == 0, rc;
    errno = 0;
    if (train_test_thread_failure("lanes", g->rank)) {
        errno = EAGAIN, rc = -1;
    } else {
        rc = (g->tp > 1 && comm_lane_init(&r->tp_lane, be, high) != 0) ||
                     (g->pp > 1 && comm_lane_init(&r->pp_lane, be, high) != 0) ||
                     (g->dp > 1 && comm_lane_init(&r->dp_lane, be, high) != 0)
                 ? -1
                 : 0;
    }
    if (rc) {
        int e = errno; /* the CPU streams' thread creation sets it */
        snprintf(err, n, "could not create the communication streams%s%s", e ? ": " : "",
                 e ? strerror(e) : "");
    }
    /* a rank that failed here alone would leave the others waiting in its first op */
    if (agree(r, rc)) return -1;
    r->tpc = (tp_context){g->tp, g->tp_rank, g->tp > 1 ? &r->tp : NULL, c->sequence_parallel,
                          g->tp > 1 ? &r->tp_lane : NULL,
                          strcmp(c->overlap_tp, "chunked") == 0 ? c->tp_chunks : 1, NULL, NULL, 0};
    /* the tied wte: first and last stage of the same (tp, dp) position */
    int ends = g->pp > 1 && (g->pp_rank == 0 || g->pp_rank == g->pp - 1);
    if (comm_split(&r->world, &r->embedding, "embed", ends ? g->tp_rank + g->tp * g->dp_rank : -1,
                   g->pp_rank) != 0) {
        const char *e = comm_error(&r->embedding);
        snprintf(err, n, "comm: %s", e ? e : comm_error(&r->world));
        return -1;
    }
    /* the groups stand: from here on a failed op cannot be agreed on, and ends the job */
    comm_end_job_on_error(1);
    return pp_setup(&r->ppc, c->schedule, g->pp, c->virtual_stages, r->bp.n_micro, g->pp_rank,
                    &r->pp, &r->embedding, g->pp > 1 ? &r->pp_lane : NULL,
                    strcmp(c->overlap_pp, "async") == 0, err, n);
}

/* gpt_load's moments: this rank's pieces of the state (all of it, unless ZeRO-1 shards
 * it), and only the tensors that hold some of them read */
static int wants_state(size_t offset, size_t n, void *arg) {
    run_state *r = arg;
    return dp_keeps_state(&r->dpc, &r->model, offset, n);
}
static void keep_moment(const float *full, int which, void *arg) {
    run_state *r = arg;
    dp_scatter_moment(&r->dpc, &r->model, which, full);
}

/* train.init into the model just created: parameters, and the optimizer state when it
 * has one (a step-0 checkpoint without /optim is a plain initialisation). Closes it. */
static int load_init(run_state *r, char *err, size_t n) {
    const gptc_config *c = r->c;
    gpt_model *m = &r->model;
    char why[ERR_LEN - 16];
    gpt_moments moments = {wants_state, keep_moment, r};
    reading(r, "train.init", c->init);
    int rc = gpt_load(m, r->init, r->has_optim ? &moments : NULL, r->optim_t, why, sizeof(why));
    watchdog_doing(NULL);
    /* as for the tokens: a peer may still be reading its part of the file */
    watchdog_hold(watchdog_io_s(file_bytes(c->init) + 65536.0 * 3 * m->n_tensors));
    if (rc == 0 && r->g->rank == 0) rc = note_unused_tensors(r->init, &r->shape, why, sizeof why);
    if (rc != 0) snprintf(err, n, "train.init %s", why);
    ckpt_close(r->init);
    r->init = NULL;
    return rc;
}

/* The data (checked whole, over the ranks), the model with its parameters (train.init's,
 * or drawn from the seed), the metrics log and the step's buffers. Collective; -1 with
 * err on the rank that failed (every rank returns -1). */
static int start_model(run_state *r, const gptc_backend *be, char *err, size_t n) {
    const gptc_config *c = r->c;
    const grid *g = r->g;
    const batch_plan *bp = &r->bp;
    int sharded = strcmp(c->dp_shard, "optimizer") == 0 && g->dp > 1;
    /* floats a bucket, at least one: a bucket_mb under 4 bytes' worth gave 0, which
     * cut_buckets reads as no limit (one bucket, the largest) */
    size_t bucket_floats = (size_t)(c->dp_bucket_mb * 1048576.0 / sizeof(float));
    gpt_placement place = {g->pp, g->pp_rank, c->virtual_stages, r->ppc.slots,
                           bucket_floats > 0 ? bucket_floats : 1, sharded ? g->dp : 1};
    dp_init(&r->dpc, g->dp, g->dp_rank, sharded, strcmp(c->overlap_dp, "bucket") == 0, &r->dp,
            g->dp > 1 ? &r->dp_lane : NULL);

    int rows = bp->B / g->dp, row0 = g->dp_rank * rows;
    reading(r, "data.path", c->data_path);
    r->loader = loader_create(c->data_path, bp->T, bp->B, row0, row0 + rows, r->shape.vocab_size,
                              c->shuffle, c->seed, err, n);
    int rc = r->loader ? 0 : -1;
    /* every rank checks its part of the file: the whole, in a world-th of the time; a run
     * with no step to run (an initial checkpoint, a resume past train.steps) reads none */
    int check = r->first <= c->steps;
    if (rc == 0 && check) rc = loader_check(r->loader, g->rank, g->world, err, n);
    watchdog_doing(NULL);
    /* a peer may still be reading its part (a cold cache, another node's disk: a large
     * file's takes minutes), and the ranks meet next in plan_same_data or agree: waiting
     * for it there is not a hang */
    if (check) watchdog_hold(watchdog_io_s(loader_check_bytes(r->loader, g->world)));
    if (g->world > 1) { /* every rank takes part, its own loader failed or not */
        uint64_t fp[3];
        if (rc == 0) rc = loader_fingerprint(r->loader, fp, err, n);
        if (plan_same_data(c->data_path, rc == 0 ? fp : NULL, g->world, err, n) != 0) rc = -1;
    }
    if (rc == 0)
        rc = gpt_create(&r->model, &r->shape, bp->mb, bp->T, bp->n_micro, be, &r->tpc, &place,
                        err, n);
    if (rc != 0 && r->init) { /* a shape no one asked for: a checkpoint's attributes */
        size_t len = strlen(err);
        const gpt_shape *s = &r->shape;
        snprintf(err + len, n - len, " (the shape of train.init %s: n_layer %d, n_head %d, "
                 "d_model %d, n_ctx %d, vocab_size %d)", c->init, s->n_layer, s->n_head,
                 s->d_model, s->n_ctx, s->vocab_size);
    }
    if (agree(r, rc)) return -1;
    gpt_model *m = &r->model;
    m->on_grads_final = on_grads_final;
    m->on_params_needed = on_params_needed;
    m->hook_ctx = r;
    if (r->init) {
        if (agree(r, load_init(r, err, n))) return -1;
    } else {
        gpt_init_random(m, c->seed);
    }
    r->t = r->has_optim ? r->optim_t : 0;
    if (c->log_file[0] && g->rank == 0) {
        r->log = metrics_open(c->log_file, r->first, err, n);
        if (!r->log) rc = -1;
    }
    r->kept = calloc((size_t)SAVE_KEPT_FOUND + c->keep + 1, sizeof(long));
    r->inputs = malloc((size_t)rows * bp->T * sizeof(int32_t));
    r->targets = malloc((size_t)rows * bp->T * sizeof(int32_t));
    if (rc == 0 && (!r->inputs || !r->targets || !r->kept)) {
        snprintf(err, n, "out of host memory for the batch");
        rc = -1;
    }
    if (agree(r, rc)) return -1;
    r->policy_dp = r->dpc.overlap;
    r->policy_pp = r->ppc.async;
    r->policy_tp_chunks = m->tp.chunks;
    return 0;
}

/* What the run is, before its first step: the model and its memory, and the settings
 * that have no effect or will leave the statistics empty. */
static void announce(const run_state *r) {
    const gptc_config *c = r->c;
    const grid *g = r->g;
    const gpt_model *m = &r->model;
    print_model(m, &r->bp, r->first, c->steps, c->precision);
    if (c->save_every > 0 && !c->save[0])
        log_warn("train.save_every = %ld has no effect: train.save is empty", c->save_every);
    /* NCCL's settings: the CPU's communication threads have no CTAs to limit */
    if (strcmp(c->device, "cpu") == 0 && c->comm_max_ctas != 0)
        log_warn("overlap.comm_max_ctas = %d has no effect on train.device = cpu (an NCCL "
                 "setting)", c->comm_max_ctas);
    if (strcmp(c->device, "cpu") == 0 && strcmp(c->comm_cta_policy, "default") != 0)
        log_warn("overlap.comm_cta_policy = %s has no effect on train.device = cpu (an NCCL "
                 "setting)", c->comm_cta_policy);
    if (r->kernel_timing) warn_empty_statistics(c, r->first);
    if (g->dp > 1)
        log_info("data parallel: %d buckets over %d ranks (overlap.dp_bucket_mb = %g)%s\n",
                 m->n_buckets, g->dp, c->dp_bucket_mb,
                 r->dpc.sharded ? ", optimizer state sharded (ZeRO-1)" : "");
    if (g->pp > 1) /* what the report's pp_comm_wait_ms is to be read against */
        log_info("pipeline: %s, %d stages x %d chunk(s), %d micro-batch(es) a step: a bubble "
                 "of %.1f%% of the step where the stages are equal\n", c->schedule, g->pp,
                 c->virtual_stages, r->bp.n_micro,
                 100.0 * pp_span_bubble(c->virtual_stages, r->bp.n_micro, r->ppc.span));
    if (g->tp > 1 && r->tpc.chunks > 1) { /* the pieces the report's TP rows are counts of */
        int rows = r->bp.mb * r->bp.T, pieces = tp_pieces(&r->tpc, rows);
        if (pieces > 1) {
            char each[32]; /* uneven pieces differ by a row */
            if (rows % pieces) snprintf(each, sizeof each, "%d-%d", rows / pieces, rows / pieces + 1);
            else snprintf(each, sizeof each, "%d", rows / pieces);
            char sp[96] = ""; /* with sequence parallelism each rank's rows are cut */
            if (c->sequence_parallel)
                snprintf(sp, sizeof sp, " (sequence parallel: %d tp ranks x %d tp_chunks)",
                         g->tp, c->tp_chunks);
            log_info("tensor parallel: overlap.tp = chunked, each TP product and its collective "
                     "in %d pieces of %s row(s)%s\n", pieces, each, sp);
        } else
            log_warn("overlap.tp = chunked has no effect: %d rows (tokens) a micro-batch%s, "
                     "fewer than overlap.tp_chunks = %d",
                     c->sequence_parallel ? rows / g->tp : rows,
                     c->sequence_parallel ? " and tp rank (sequence parallel)" : "", c->tp_chunks);
    }
}

/* One time origin for all ranks, so that their traces line up: rank 0's clock now, in
 * each rank's clock. A barrier would not do: ranks leave it up to a scheduler's time
 * slice apart (milliseconds on a loaded node). Collective. */
static void start_clocks(run_state *r) {
    const grid *g = r->g;
    double rtt = 0, at = 0;
    double offset = g->world > 1 ? comm_clock_offset_ms(&r->world, &rtt, &at) : 0;
    double origin[2] = {g->rank == 0 ? timing_now_ms() : 0, rtt / 2}; /* [0] rank 0's */
    r->clock0_ms = offset, r->rtt0_ms = rtt, r->at0_ms = at;
    if (g->world > 1) {
        comm_sum_doubles(&r->world, origin, 1);
        origin[1] = comm_max_double(&r->world, origin[1]);
        log_info("kernel timing: the %d ranks' clocks agree with rank 0's within %.1f us "
                 "(half the shortest round trip to it)\n", g->world, origin[1] * 1e3);
    }
    timing_set_origin(origin[0] + offset);
}

/* What the steps did, for the run's last line */
typedef struct {
    long last_run;    /* the last step that ran (first - 1: none) */
    int stopped;      /* by a stop signal, before step last_run + 1 */
    double last_loss; /* step last_run's */
    /* over the steps after the first (which pays for page faults and warm-up): iter_ms,
     * and the wall time, which adds what kernel timing does around a step (the device
     * timer's reset, reading the records back, the step's analysis) and so counts in the
     * timing's overhead */
    double total_ms, total_wall_ms;
    long timed_steps;
} run_totals;

/* The steps first..train.steps, each logged, saved when due, until a stop signal (agreed
 * by every rank after the step) or a step whose loss or norm is not finite under
 * nan_policy = stop. -1 with err to fail the run (*silent: another rank reports). */
static int run_steps(run_state *r, run_totals *tot, int *silent, char *err, size_t n) {
    const gptc_config *c = r->c;
    const grid *g = r->g;
    gpt_model *m = &r->model;
    optim_config oc = {c->lr, c->min_lr, c->warmup_steps, c->steps,
                       strcmp(c->lr_schedule, "cosine") == 0, c->beta1, c->beta2, c->eps,
                       c->weight_decay, c->grad_clip};
    int skip_bad = strcmp(c->nan_policy, "skip") == 0, kernel_timing = r->kernel_timing;
    double tokens_per_step = (double)r->bp.B * r->bp.T;
    *tot = (run_totals){r->first - 1, 0, NAN, 0, 0, 0};
    /* a signal in the start-up (MPI's, loading train.init, checking the data: seconds in a
     * large run) stops every rank before the first step, as one in a step does after it */
    stop_startup_over();
    tot->stopped = stop_requested();
    if (g->world > 1) tot->stopped = comm_max_int(&r->world, tot->stopped);
    if (tot->stopped)
        log_info("stopped by a signal before step %ld: no step ran%s\n", r->first,
                 stop_signal_name());
    for (long step = r->first; step <= c->steps && !tot->stopped; step++) {
        double w0 = timing_now_ms();
        r->current_step = step;
        watchdog_beat();
        int probe = c->contention_probe > 0 && step % c->contention_probe == 0;
        set_policies(r, !probe);
        timing_begin_step(step, probe);
        timing_set_context(-1, -1, PH_FWD); /* the batch is read, and agreed on, for the forward */
        if (kernel_timing && m->be->timer_reset) m->be->timer_reset();
        if (c->power) power_step_begin();
        char step_name[32];
        snprintf(step_name, sizeof step_name, "step %ld", step);
        nvtx_push(step_name);
        double t0 = timing_now_ms();
        watchdog_test_slow_step(step);
        watchdog_test_stuck_step(step);
        if (agree(r, loader_get(r->loader, step, r->inputs, r->targets, err, n))) {
            nvtx_pop();
            return -1;
        }
        double lr = lr_at_step(&oc, step), norm;
        int skipped;
        double loss = train_step(r, &r->bp, step, &r->t, lr, &oc, &norm, &skipped);
        if (skipped && !skip_bad) {
            /* the step that stopped the run has its line too: what went non-finite; it is
             * closed before the replay, whose records stay out of the trace */
            power_sample pw;
            double ms = close_step(r, kernel_timing, t0, &pw);
            if (r->log)
                log_metrics(r, step, loss, norm, lr, ms, tokens_per_step / (ms / 1000.0), 1,
                            c->power ? &pw : NULL);
            /* the replay's records go to a step never closed (the buffer from its start) */
            timing_begin_step(step, 0);
            char where[256] = "", why[ERR_LEN] = "";
            int reporter = kernel_timing ? locate_nonfinite(r, &r->bp, where, sizeof(where)) : 0;
            snprintf(err, n, "step %ld: loss %g, grad norm %g is not finite (train.nan_policy = stop)%s",
                     step, unsigned_nan(loss), unsigned_nan(norm), where);
            *silent = g->rank != reporter;
            /* the report and trace of the steps that ran, this one too: where one looks
             * when a run blows up (every rank is here: the loss and norm are global) */
            watchdog_waits_marked(0); /* their collectives are not */
            if (kernel_timing && write_timing(r, why, sizeof why)) log_warn("%s", why);
            return -1;
        }
        if (skipped)
            log_info("step %ld: loss %g, grad norm %g is not finite: update skipped (train.nan_policy = skip)\n",
                     step, unsigned_nan(loss), unsigned_nan(norm));
        power_sample pw;
        double ms = close_step(r, kernel_timing, t0, &pw);
        if (step > r->first) {
            tot->total_ms += ms;
            tot->total_wall_ms += timing_now_ms() - w0;
            tot->timed_steps++;
        }
        tot->last_loss = loss;
        double tps = tokens_per_step / (ms / 1000.0);
        log_info("step %5ld/%ld | loss %.6f | lr %.3e | grad norm %.4f | %8.1f ms | %8.0f tok/s\n",
                 step, c->steps, unsigned_nan(loss), lr, unsigned_nan(norm), ms, tps);
        if (r->log) log_metrics(r, step, loss, norm, lr, ms, tps, skipped, c->power ? &pw : NULL);
        /* a signal on any rank stops every rank after this same step */
        int stop = stop_requested();
        if (g->world > 1) stop = comm_max_int(&r->world, stop);
        int due = c->save[0] && ((c->save_every > 0 && step % c->save_every == 0) ||
                                 step == c->steps || stop);
        if (due && save_checkpoint(r, step, r->t, err, n) != 0) return -1;
        tot->last_run = step;
        if (stop) { /* the report and trace still cover the steps that ran */
            log_info("stopped by a signal after step %ld%s%s\n", step, stop_signal_name(),
                     c->save[0] ? ": checkpoint written, train.init it to resume" : "");
            tot->stopped = 1;
        }
    }
    return 0;
}

/* After the steps: the step-0 checkpoint of a run with none to take, the timing report
 * and trace, and the run's last line. -1 with err to fail the run. */
static int finish_run(run_state *r, const run_totals *tot, char *err, size_t n) {
    const gptc_config *c = r->c;
    long first = r->first;
    /* train.steps = 0 from scratch (or from a step-0 initialisation, converted weights)
     * writes the initialisation itself, a step-0 checkpoint without /optim. A resumed run
     * with no step left writes nothing: it holds only what train.init holds, and would
     * replace train.save (a later run's, perhaps) with it. */
    int fresh = !c->init[0] || (first == 1 && !r->has_optim);
    if (c->save[0] && first > c->steps && fresh && !tot->stopped &&
        save_checkpoint(r, first - 1, r->t, err, n) != 0)
        return -1;
    if (r->kernel_timing && write_timing(r, err, n) != 0) return -1;
    double tokens_per_step = (double)r->bp.B * r->bp.T;
    if (tot->timed_steps > 0)
        log_info("done: %ld steps, final loss %.6f, mean %.1f ms/step, %.0f tok/s (steps after the "
                 "first); wall clock %.1f ms/step with the per-step bookkeeping\n",
                 tot->last_run - first + 1, unsigned_nan(tot->last_loss),
                 tot->total_ms / tot->timed_steps,
                 tokens_per_step * tot->timed_steps / (tot->total_ms / 1000.0),
                 tot->total_wall_ms / tot->timed_steps);
    else if (tot->last_run >= first)
        log_info("done: %ld steps, final loss %.6f\n", tot->last_run - first + 1,
                 unsigned_nan(tot->last_loss));
    else if (first > c->steps) /* (one stopped before its first step has said so) */
        log_info("done: no step to run (train.steps = %ld)%s\n", c->steps,
                 c->save[0] && !fresh ? "; nothing written to train.save" : "");
    return 0;
}

int train_run(const gptc_config *c, const grid *g) {
    char err[ERR_LEN] = "";
    run_state r;
    memset(&r, 0, sizeof(r));
    watchdog_set_step(&r.current_step);
    r.speaker = -1;
    r.c = c;
    r.g = g;
    int silent = 0;

    /* 1. Checks every rank makes identically (rank 0 reports). Usually every rank finds
     * the same and rank 0 says it once; a rank that failed alone (a file its node lacks)
     * says it, and the ranks that passed stop too, meeting the failed ones here. */
    int failed = plan_run(&r, err, sizeof err) != 0;
    if (train_refused(failed, err, g->rank, g->world)) goto refused;
    plan_print_effective(c, g, &r.shape, &r.bp);

    /* 2. The device, kernel timing and the watchdog */
    nvtx_enable(c->nvtx);
    /* a device's start (a CUDA context on a card without persistence mode, cuBLASLt,
     * CUPTI) may take tens of seconds on every rank */
    watchdog_hold(WATCHDOG_DEVICE_S);
    warn_address_space(c, g);
    const gptc_backend *be = start_backend(c, g, &r.shape, err, sizeof(err));
    if (!be) {
        silent = !err[0]; /* the ranks that failed have said why */
        goto fail;
    }
    be->set_precision(strcmp(c->precision, "bf16") == 0 ? GPTC_BF16 : GPTC_FP32);
    r.kernel_timing = strcmp(c->timing, "kernel") == 0;
    failed = r.kernel_timing && start_kernel_timing(&r, err, sizeof err) != 0;
    /* the timed op table: it times every op with kernel timing, and makes each an NVTX
     * range of its name (with timing off it keeps no record: an untimed run's capture had
     * shown its steps alone). In every build, so that the table runs where the tests run;
     * a range without NVTX costs a call. */
    if (r.kernel_timing || c->nvtx) be = timed_backend(be);
    /* From here on a rank may fail alone: it reports, and every rank agrees to stop,
     * before the communicators: the others would wait in their set-up for a rank that
     * failed until their watchdogs ended the job (train.comm_timeout_s) */
    watchdog_set_comm_hooks(comm_poll_async_errors, comm_abort_all);
    if (train_refused(failed, err, g->rank, g->world)) goto refused;

    /* 3. Communicators, data and model */
    if (start_comm(&r, be, err, sizeof err) != 0 || start_model(&r, be, err, sizeof err) != 0)
        goto fail;
    if (c->save[0] && g->rank == 0) save_dir_tidy(c->save, r.first, c->keep, r.kept, &r.n_kept);
    if (g->rank == 0) { /* a report or a trace can be large */
        output_tidy_stale(c->report);
        output_tidy_stale(c->trace);
        output_tidy_stale(c->log_file);
    }
    announce(&r);

    /* 4. The steps, and what comes after them */
    r.current_step = r.first;
    /* one rank has no peer to wait for: the watchdog watched its start-up's files alone
     * (a step's long layer on a big model is no hang) */
    if (g->world == 1) watchdog_stop();
    if (r.kernel_timing) start_clocks(&r);
    run_totals tot;
    /* On the CPU a step's every wait for a peer is marked (watchdog_waiting), so that a
     * rank that waits in none is known to be stuck itself. Not on a GPU: its host waits
     * on streams that may wait in NCCL for a peer. */
    watchdog_waits_marked(strcmp(c->device, "cpu") == 0);
    int steps_failed = run_steps(&r, &tot, &silent, err, sizeof err) != 0;
    watchdog_waits_marked(0);
    if (steps_failed || finish_run(&r, &tot, err, sizeof err) != 0)
        goto fail;
    run_free(&r);
    return 0;

refused:
    if (r.init) ckpt_close(r.init);
    run_free(&r);
    return 1;
fail:
    /* a rank with nothing of its own to say stays quiet: the failing rank has spoken */
    if (r.speaker >= 0 && r.speaker != g->rank) silent = 1;
    if (!silent && err[0]) { /* after start-up one rank may fail alone: it names itself */
        if (g->world > 1) log_error("rank %d: %s", g->rank, err);
        else log_error("%s", err);
    }
    if (r.init) ckpt_close(r.init);
    run_free(&r);
    return 1;
}
