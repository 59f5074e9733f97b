/* Communication: how an op is issued and run. Each op is a plain blocking MPI call
 * (comm_mpi.c) made either by the caller (NULL stream) or by a stream's worker thread,
 * which is what lets it overlap with the compute on the calling thread; device buffers go
 * through host copies unless NCCL carries the group (comm_nccl.c). Groups are made in
 * comm_group.c, the host-side reductions are in comm_host.c. Rules for callers are in
 * comm.h. */
#define _POSIX_C_SOURCE 200809L
#include "parallel/comm.h"
#include "parallel/comm_nccl.h"
#include "parallel/comm_task.h"

#include "engine/log.h"
#include "engine/nvtx.h"
#include "engine/timing.h"
#include "engine/watchdog.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- errors ---- */

static atomic_int g_end_job_on_error;

void comm_end_job_on_error(int on) { atomic_store(&g_end_job_on_error, on); }

/* With comm_end_job_on_error(1), an op that failed (MPI returned an error, a message of
 * the wrong size came, NCCL refused the launch) ends the job here, on every rank, with the
 * op's one line: skipped, it would leave the peers waiting in it, or pair their op with
 * this rank's next one and go on with what it did not write. */
void comm_end_job_if_failed(const comm_group *g) {
    const char *e = comm_error(g);
    if (!e || !atomic_load(&g_end_job_on_error)) return;
    int world_rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    log_error("rank %d: %s; aborting the job", world_rank, e);
    comm_abort_all();
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* ---- issuing on a stream ---- */

void comm_waiting(const char *op, const comm_group *g) {
    /* one a thread, which waits in one op at a time; it outlives the op: the watchdog
     * may print it after */
    static _Thread_local char what[64];
    snprintf(what, sizeof what, "%s on %s", op, g->name);
    watchdog_waiting(what);
}

static const char *op_name(const comm_task *t) {
    switch (t->kind) {
    case OP_ALLREDUCE: return t->op == MPI_MAX ? "allreduce_max" : "allreduce";
    case OP_REDUCE_SCATTER: return "reduce_scatter";
    case OP_ALLGATHER: return "allgather";
    case OP_BROADCAST: return "broadcast";
    case OP_REDUCE: return "reduce";
    case OP_SEND: return "send";
    case OP_RECV: return "recv";
    case OP_SENDRECV: return "sendrecv";
    }
    return "comm";
}

static timing_work comm_work(const comm_task *t);

/* Test-only: GPTC_TEST_COMM_FAIL_OP=R:N makes the N-th op (counted from 1 over all its
 * streams) of MPI_COMM_WORLD rank R a real MPI error (a negative count) in its place, so
 * that tests can see how a failed op ends the job. */
static int fail_this_op(const comm_task *t) {
    static long fail_at = -1;
    static atomic_long ops;
    if (fail_at < 0) {
        const char *v = getenv("GPTC_TEST_COMM_FAIL_OP");
        int rank = -1, victim = -2;
        long n = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        fail_at = v && sscanf(v, "%d:%ld", &victim, &n) == 2 && victim == rank ? n : 0;
    }
    if (fail_at <= 0 || atomic_fetch_add(&ops, 1) + 1 != fail_at) return 0;
    float x = 0;
    comm_mpi_ok(t->g, op_name(t), MPI_Allreduce(MPI_IN_PLACE, &x, -1, MPI_FLOAT, MPI_SUM, t->g->comm));
    return 1;
}

/* Test-only: GPTC_TEST_COMM_DELAY_US=n makes every op run on a stream n microseconds
 * slower (a sleep before it, inside its timed interval), like a slow network, so that tests
 * can see communication hidden behind compute on a fast machine. */
static long comm_delay_us(void) {
    static long delay = -1;
    if (delay < 0) {
        const char *v = getenv("GPTC_TEST_COMM_DELAY_US");
        delay = v ? atol(v) : 0;
    }
    return delay;
}

/* Timed on the thread that runs it, so a record is exactly the op's time on that thread
 * (for a blocking transfer that includes waiting for the peer). */
static void run_task(const comm_task *t) {
    comm_waiting(op_name(t), t->g);
    double t0 = timing_on() ? timing_now_ms() : 0;
    long delay = t->stream ? comm_delay_us() : 0;
    if (delay > 0) {
        struct timespec ts = {delay / 1000000, (delay % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    if (!fail_this_op(t)) comm_mpi_run(t);
    comm_end_job_if_failed(t->g);
    watchdog_waiting(NULL);
    watchdog_beat();
    if (timing_on())
        timing_record_op(op_name(t), TK_COMM, comm_group_par(t->g), t->stream, t->ctx, comm_work(t),
                         t->match, t0, timing_now_ms());
}


static void run_and_free(void *arg) {
    run_task(arg);
    free(arg);
}

/* ---- MPI on host copies of device buffers ---- */

/* The part of device memory an op reads and writes: where it starts and how long. */
typedef struct {
    void *dev; /* [bytes] */
    size_t bytes;
    int read, written;
} region;

static size_t elem_size(const comm_task *t) {
    return t->kind == OP_BROADCAST || t->kind == OP_SEND || t->kind == OP_RECV ||
                   t->kind == OP_SENDRECV
               ? 1
               : gptc_act_bytes(t->type);
}

/* [0] the send buffer, [1] the receive buffer; bytes 0 where the op has none */
static void regions_of(const comm_task *t, region r[2]) {
    size_t e = elem_size(t), size = (size_t)t->g->size;
    memset(r, 0, 2 * sizeof(region));
    switch (t->kind) {
    case OP_ALLREDUCE: case OP_REDUCE: case OP_BROADCAST:
        r[1] = (region){t->recv, t->recv_n * e, 1, 1};
        break;
    case OP_REDUCE_SCATTER:
        r[0] = (region){(void *)t->send, size * t->recv_n * e, 1, 0};
        r[1] = (region){t->recv, t->recv_n * e, 0, 1};
        break;
    case OP_ALLGATHER:
        r[0] = (region){(void *)t->send, t->send_n * e, 1, 0};
        r[1] = (region){t->recv, size * t->send_n * e, 0, 1};
        break;
    case OP_SEND:
        r[0] = (region){(void *)t->send, t->send_n, 1, 0};
        break;
    case OP_RECV:
        r[1] = (region){t->recv, t->recv_n, 0, 1};
        break;
    case OP_SENDRECV:
        r[0] = (region){(void *)t->send, t->send_n, 1, 0};
        r[1] = (region){t->recv, t->recv_n, 0, 1};
        break;
    }
}

/* An op's bytes as nccl-tests counts them (engine/timing.h: timing_work): the larger of
 * its two buffers (an all-gather's output, a reduce-scatter's input, an all-reduce's one
 * buffer), so that bytes over time is its "algbw" */
static timing_work comm_work(const comm_task *t) {
    region r[2];
    regions_of(t, r);
    return (timing_work){0.0, (double)(r[0].bytes > r[1].bytes ? r[0].bytes : r[1].bytes)};
}

static int contains(const region *outer, const region *inner) {
    const char *o = outer->dev, *i = inner->dev;
    return inner->bytes > 0 && i >= o && i + inner->bytes <= o + outer->bytes;
}

/* Staging buffers in host memory the device copies at full speed, reused op after op: an
 * op takes one when it is issued and gives it back from its stream once its copies back
 * have completed. The main thread takes; stream workers give back.
 *
 * Pinned memory is allocated and freed only while no staged op is in flight. cudaMallocHost
 * and cudaFreeHost take a lock of the CUDA driver that every other CUDA call of the
 * process waits for, and hold it until the device is idle; a staged op's stream meanwhile
 * spins until its worker has run the op, and the worker's next CUDA call waits for that
 * lock: a deadlock (seen on an H200 with tp2 on one GPU). Sizes are rounded up to a power
 * of two, so the pool settles within the first step and later steps never wait here. */
enum { STAGE_SLOTS = 256, STAGE_MIN_BYTES = 64 << 10 };
typedef struct {
    char *p; /* [bytes] from be->alloc_host (CUDA: pinned) */
    size_t bytes;
    int busy;
} stage_buf;
static stage_buf g_stages[STAGE_SLOTS];
static int g_stages_busy; /* slots in flight */
static pthread_mutex_t g_stage_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_stage_freed = PTHREAD_COND_INITIALIZER;

static void stage_give_back(void *arg) {
    stage_buf *b = arg;
    pthread_mutex_lock(&g_stage_mu);
    b->busy = 0;
    g_stages_busy--;
    pthread_cond_broadcast(&g_stage_freed);
    pthread_mutex_unlock(&g_stage_mu);
}

static size_t stage_round(size_t bytes) {
    size_t r = STAGE_MIN_BYTES;
    while (r < bytes && r <= SIZE_MAX / 2) r *= 2;
    return r < bytes ? bytes : r;
}

/* The smallest free buffer that fits; else, once nothing is in flight, a free slot (the
 * emptiest) reallocated to fit. Waiting needs nothing from this thread: ops in flight
 * come back as their streams reach them. */
static stage_buf *stage_take(const gptc_backend *be, size_t bytes) {
    pthread_mutex_lock(&g_stage_mu);
    stage_buf *fit = NULL, *spare = NULL;
    for (;;) {
        for (int i = 0; i < STAGE_SLOTS; i++) {
            stage_buf *b = &g_stages[i];
            if (b->busy) continue;
            if (b->bytes >= bytes && (!fit || b->bytes < fit->bytes)) fit = b;
            if (!spare || b->bytes < spare->bytes) spare = b;
        }
        if (fit || (spare && g_stages_busy == 0)) break;
        fit = spare = NULL;
        pthread_cond_wait(&g_stage_freed, &g_stage_mu);
    }
    stage_buf *b = fit ? fit : spare;
    b->busy = 1;
    g_stages_busy++;
    pthread_mutex_unlock(&g_stage_mu);
    if (fit) return b;
    if (b->p) be->release_host(b->p);
    size_t want = stage_round(bytes);
    b->p = be->alloc_host(want);
    b->bytes = b->p ? want : 0;
    if (b->p) return b;
    stage_give_back(b); /* out of host memory */
    return NULL;
}


/* Copies the regions the op reads to a staging buffer, runs the MPI op on the host and
 * copies back what it wrote, all in s's order: on NULL now, on the caller; on a stream,
 * with the MPI call on the stream's host worker while the caller goes on issuing compute.
 * An in-place op's two buffers overlap: the outer one is staged and the inner one points
 * into its copy. */
static void run_staged(comm_task t, gptc_stream *s) {
    const gptc_backend *be = t.g->be;
    region r[2];
    regions_of(&t, r);
    int inner = -1; /* which region lies inside the other, if any */
    if (contains(&r[1], &r[0])) inner = 0;
    else if (contains(&r[0], &r[1])) inner = 1;
    size_t total = (inner == 0 ? 0 : r[0].bytes) + (inner == 1 ? 0 : r[1].bytes);
    stage_buf *buf = stage_take(be, total ? total : 1);
    if (!buf) {
        /* skipping the op would leave the peers waiting in it: end the job, saying why */
        log_error("rank %d: host staging of %s on %s: no pinned host memory for %zu bytes",
                  log_rank(), op_name(&t), t.g->name, total);
        exit(EXIT_FAILURE);
    }
    char *h[2];
    h[0] = buf->p;
    h[1] = buf->p + (inner == 0 ? 0 : r[0].bytes);
    if (inner >= 0) {
        /* one copy over both: only the inner part travels where only it is read (an
         * in-place all-gather's own block) or written (an in-place reduce-scatter's) */
        int outer = 1 - inner;
        h[outer] = buf->p;
        h[inner] = buf->p + ((char *)r[inner].dev - (char *)r[outer].dev);
        if (r[outer].read) r[inner].read = 0;
        if (r[outer].written) r[inner].written = 0;
    }
    /* the copies and the host task's flag kernels are this op's device work; its time is
     * the MPI call's, which run_task records on the host */
    int op = timing_on() && be->timer_begin ? be->timer_begin(s) : -1;
    for (int k = 0; k < 2; k++)
        if (r[k].read && r[k].bytes) be->copy_async(h[k], r[k].dev, r[k].bytes, s);
    if (t.send) t.send = h[0];
    if (t.recv) t.recv = h[1];
    comm_task *copy = s ? malloc(sizeof *copy) : NULL;
    if (copy) {
        *copy = t;
        be->launch_host_func(s, run_and_free, copy);
    } else {
        be->stream_synchronize(s);
        run_task(&t);
    }
    for (int k = 0; k < 2; k++)
        if (r[k].written && r[k].bytes) be->copy_async(r[k].dev, h[k], r[k].bytes, s);
    if (s) {
        be->launch_host_func(s, stage_give_back, buf);
    } else {
        be->stream_synchronize(s);
        stage_give_back(buf);
    }
    if (op >= 0) {
        be->timer_end(op, s);
        timing_device_work(op_name(&t), TK_COMM, op);
    }
}

/* The op on the path its group takes: NCCL, host staging, or MPI on the caller or on the
 * stream's host thread */
static void issue_on_path(comm_task t, gptc_stream *s) {
    if (t.g->nccl) {
        /* enqueued, not run: timed by device marks around it, like a compute op */
        const gptc_backend *be = t.g->be;
        int op = timing_on() && be->timer_begin ? be->timer_begin(s) : -1;
        comm_nccl_issue(&t, s);
        comm_end_job_if_failed(t.g);
        if (op >= 0) {
            be->timer_end(op, s);
            timing_record_device(op_name(&t), TK_COMM, comm_group_par(t.g), t.stream, t.ctx,
                                 comm_work(&t), t.match, op);
        }
        watchdog_beat();
        return;
    }
    if (t.g->be->on_device) {
        run_staged(t, s);
        return;
    }
    if (!s) {
        run_task(&t);
        return;
    }
    comm_task *copy = malloc(sizeof *copy);
    if (!copy) {
        /* Skipping the op would leave the other ranks waiting in it; doing it late, after
         * the stream's earlier work, keeps the order every rank expects. */
        t.g->be->stream_synchronize(s);
        run_task(&t);
        return;
    }
    *copy = t;
    t.g->be->launch_host_func(s, run_and_free, copy);
}

static void issue(comm_task t, gptc_stream *s) {
    static const int stream_of_par[] = {0, 3, 1, 2}; /* none dp tp pp: engine/timing.h */
    t.ctx = timing_context();
    t.stream = s ? stream_of_par[comm_group_par(t.g)] : 0;
    t.match = comm_group_match(t.g, t.kind, t.peer, t.tag);
    /* a range around the issue on every path, as around a compute op's launches: a
     * tool puts the device work launched inside it (NCCL's kernel, host staging's copies
     * and flag kernels) under the collective's name */
    nvtx_push(op_name(&t));
    issue_on_path(t, s);
    nvtx_pop();
}

void comm_allreduce_sum_act(comm_group *g, gptc_act *buf, size_t n, gptc_precision t,
                            gptc_stream *s) {
    issue((comm_task){.kind = OP_ALLREDUCE, .g = g, .recv = buf, .recv_n = n, .op = MPI_SUM,
                      .type = t},
          s);
}

void comm_allreduce_sum(comm_group *g, float *buf, size_t n, gptc_stream *s) {
    comm_allreduce_sum_act(g, buf, n, GPTC_FP32, s);
}

void comm_allreduce_max(comm_group *g, float *buf, size_t n, gptc_stream *s) {
    issue((comm_task){.kind = OP_ALLREDUCE, .g = g, .recv = buf, .recv_n = n, .op = MPI_MAX}, s);
}

void comm_reduce_scatter_sum_act(comm_group *g, const gptc_act *send, gptc_act *recv, size_t n,
                                 gptc_precision t, gptc_stream *s) {
    issue((comm_task){.kind = OP_REDUCE_SCATTER, .g = g, .send = send, .recv = recv, .recv_n = n,
                      .type = t},
          s);
}

void comm_reduce_scatter_sum(comm_group *g, const float *send, float *recv, size_t n,
                             gptc_stream *s) {
    comm_reduce_scatter_sum_act(g, send, recv, n, GPTC_FP32, s);
}

void comm_allgather_act(comm_group *g, const gptc_act *send, gptc_act *recv, size_t n,
                        gptc_precision t, gptc_stream *s) {
    issue((comm_task){.kind = OP_ALLGATHER, .g = g, .send = send, .recv = recv, .send_n = n,
                      .type = t},
          s);
}

void comm_allgather(comm_group *g, const float *send, float *recv, size_t n, gptc_stream *s) {
    comm_allgather_act(g, send, recv, n, GPTC_FP32, s);
}

void comm_broadcast(comm_group *g, void *buf, size_t bytes, int root, gptc_stream *s) {
    issue((comm_task){.kind = OP_BROADCAST, .g = g, .recv = buf, .recv_n = bytes, .peer = root},
          s);
}

void comm_reduce_sum_act(comm_group *g, gptc_act *buf, size_t n, int root, gptc_precision t,
                         gptc_stream *s) {
    issue((comm_task){.kind = OP_REDUCE, .g = g, .recv = buf, .recv_n = n, .peer = root,
                      .type = t},
          s);
}

void comm_send(comm_group *g, const void *buf, size_t bytes, int peer, int tag, gptc_stream *s) {
    issue((comm_task){.kind = OP_SEND, .g = g, .send = buf, .send_n = bytes, .peer = peer,
                      .tag = tag},
          s);
}

void comm_recv(comm_group *g, void *buf, size_t bytes, int peer, int tag, gptc_stream *s) {
    issue((comm_task){.kind = OP_RECV, .g = g, .recv = buf, .recv_n = bytes, .peer = peer,
                      .tag = tag},
          s);
}

void comm_sendrecv(comm_group *g, const void *sendbuf, size_t send_bytes, int dst,
                   void *recvbuf, size_t recv_bytes, int src, int tag, gptc_stream *s) {
    issue((comm_task){.kind = OP_SENDRECV, .g = g, .send = sendbuf, .send_n = send_bytes,
                      .peer = dst, .recv = recvbuf, .recv_n = recv_bytes, .src = src, .tag = tag},
          s);
}

/* ---- lanes ---- */

int comm_lane_init(comm_lane *l, const gptc_backend *be, int high_priority) {
    l->be = be;
    l->stream = be->stream_create(high_priority);
    l->ready = be->event_create();
    l->done = be->event_create();
    return l->stream && l->ready && l->done ? 0 : -1;
}

void comm_lane_free(comm_lane *l) {
    if (!l->be) return;
    if (l->stream) l->be->stream_destroy(l->stream);
    if (l->ready) l->be->event_destroy(l->ready);
    if (l->done) l->be->event_destroy(l->done);
    l->stream = NULL;
    l->ready = l->done = NULL;
}

void comm_lane_after_compute(comm_lane *l) {
    if (!l || !l->stream) return;
    l->be->event_record(l->ready, NULL);
    l->be->stream_wait_event(l->stream, l->ready);
}

void comm_lane_join(comm_lane *l) {
    if (!l || !l->stream) return;
    l->be->event_record(l->done, l->stream);
    l->be->stream_wait_event(NULL, l->done);
}

