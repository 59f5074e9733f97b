/* Per-kernel timing. Inside a step: one atomic increment, a read lock and two clock
 * readings per op.
 * After the step: interval unions, exposed communication and the isolated/overlapped
 * split of every kernel.
 * A step's records grow past the capacity the trainer estimated (overlap.tp = chunked
 * multiplies the ops by tp_chunks, and more with sequence parallelism): the threads that
 * record hold a read lock, and the one that finds the arrays full takes the write lock to
 * grow them, so that no op goes untimed (up to RECORDS_MAX a step). */
#define _POSIX_C_SOURCE 200809L
#include "engine/timing.h"
#include "engine/log.h"
#include "engine/watchdog.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double clock_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

double timing_now_ms(void) {
    /* GPTC_TEST_CLOCK_PPM: read once; a race between threads' first calls reads it twice */
    static _Atomic double skew = -1.0, first = 0.0;
    double k = atomic_load(&skew);
    if (k < 0) {
        const char *v = getenv("GPTC_TEST_CLOCK_PPM");
        double ppm = v ? atof(v) : 0.0;
        atomic_store(&first, clock_ms());
        k = ppm > 0 && ppm < 1e5 ? ppm * 1e-6 : 0.0;
        atomic_store(&skew, k);
    }
    double t = clock_ms();
    return k > 0 ? t + (t - atomic_load(&first)) * k : t;
}

/* records kept for the trace over the whole run, all steps: ~130 MB on the host */
#define TRACE_CAP_DEFAULT ((size_t)2000000)
/* records of one step at most (~136 bytes each with the analysis scratch): past it an op
 * is dropped, and counted */
#define RECORDS_MAX ((size_t)1 << 21)

typedef struct { double a, b; } span;

/* a piece of a step's device work (backend timer_piece), under its op */
typedef struct {
    const char *op, *kernel; /* the op's record name (TIMING_NO_OP outside every op) */
    int kind;                /* the op's kind: which union it may overlap */
    double a, b;             /* us since the origin */
} step_piece;

/* the record name and kind of a device timer handle, this step */
typedef struct {
    const char *name; /* NULL: no record, or one the timer could not read */
    int kind;
} handle_op;

static struct {
    int on;
    double origin_ms;
    timing_ctx ctx;
    long step;
    int probe;
    int warmup; /* steps of the run left out of the kernel statistics */
    double step_start_ms, stop_ms; /* the step's span: timing_begin_step, timing_stop_clock */
    timing_record *rec;        /* [capacity] this step's records */
    int32_t *ops;              /* [capacity] device timer handle of rec, -1 (host times), or
                                * below -1: the handle of device work alone (work_only) */
    size_t capacity;
    pthread_rwlock_t grow;     /* read: writing a record; write: growing rec and ops */
    int grow_failed;           /* out of memory once: no more growth, so that every record
                                * below the capacity was written */
    atomic_size_t n;
    atomic_long dropped;
    long untimed[2];           /* [kind] records the device timer found no work of */
    span *work, *merged_comp, *merged_comm, *merged_par; /* [capacity] each, analysis scratch */
    timing_step_summary *steps; /* [cap_steps], n_steps used */
    int n_steps, cap_steps;
    timing_kernel_stats *kernels; /* [cap_kernels], n_kernels used */
    int n_kernels, cap_kernels;
    timing_device_kernel *dev; /* [cap_dev], n_dev used */
    int n_dev, cap_dev;
    handle_op *handles;        /* [cap_handles] this step's op of each device handle */
    size_t cap_handles;
    step_piece *pieces;        /* [cap_pieces], n_pieces used: this step's, until its end */
    size_t n_pieces, cap_pieces;
    timing_record *trace;      /* [cap_trace], n_trace used */
    size_t n_trace, cap_trace, trace_limit;
    long trace_omitted;        /* records past trace_limit, timed but not in the trace */
} T;

int timing_init(int kernel_level, size_t capacity) {
    memset(&T, 0, sizeof(T));
    T.ctx = (timing_ctx){-1, -1, PH_FWD};
    T.trace_limit = TRACE_CAP_DEFAULT;
    if (!kernel_level) return 0;
    if (capacity < 1) capacity = 1;
    T.capacity = capacity;
    T.rec = calloc(capacity, sizeof(timing_record));
    T.ops = calloc(capacity, sizeof *T.ops);
    T.work = calloc(capacity, sizeof(span));
    T.merged_comp = calloc(capacity, sizeof(span));
    T.merged_comm = calloc(capacity, sizeof(span));
    T.merged_par = calloc(capacity, sizeof(span));
    if (!T.rec || !T.ops || !T.work || !T.merged_comp || !T.merged_comm || !T.merged_par) {
        timing_shutdown();
        return -1;
    }
    pthread_rwlock_init(&T.grow, NULL);
    T.on = 1;
    T.origin_ms = timing_now_ms();
    return 0;
}

void timing_shutdown(void) {
    if (T.on) pthread_rwlock_destroy(&T.grow);
    free(T.rec);
    free(T.ops);
    free(T.work);
    free(T.merged_comp);
    free(T.merged_comm);
    free(T.merged_par);
    free(T.steps);
    free(T.kernels);
    free(T.dev);
    free(T.handles);
    free(T.pieces);
    free(T.trace);
    memset(&T, 0, sizeof(T));
}

int timing_on(void) { return T.on; }
void timing_set_origin(double origin_ms) { T.origin_ms = origin_ms; }
double timing_origin_ms(void) { return T.origin_ms; }

void timing_map_times(double factor, double shift_us) {
    for (size_t i = 0; i < T.n_trace; i++) {
        T.trace[i].start_us = T.trace[i].start_us * factor + shift_us;
        T.trace[i].end_us = T.trace[i].end_us * factor + shift_us;
    }
    for (int i = 0; i < T.n_steps; i++) {
        T.steps[i].start_us = T.steps[i].start_us * factor + shift_us;
        T.steps[i].end_us = T.steps[i].end_us * factor + shift_us;
    }
}

void timing_set_context(int layer, int micro, timing_phase phase) {
    T.ctx = (timing_ctx){(int16_t)layer, (int16_t)micro, (int8_t)phase};
    watchdog_beat(); /* called per layer: the finest progress the watchdog needs */
}

timing_ctx timing_context(void) { return T.ctx; }

/* role, forward, backward, and the ops with the GELU fused (matmul_gelu_forward,
 * matmul_dgelu_backward): their own names, since the weight gradient of that backward is
 * a second op under the plain name */
static const char *const ROLES[][5] = {
    {"qkv", "qkv_fwd", "qkv_bwd", "qkv_gelu_fwd", "qkv_dgelu_bwd"},
    {"attn_proj", "attn_proj_fwd", "attn_proj_bwd", "attn_proj_gelu_fwd", "attn_proj_dgelu_bwd"},
    {"fc", "fc_fwd", "fc_bwd", "fc_gelu_fwd", "fc_dgelu_bwd"},
    {"fc_proj", "fc_proj_fwd", "fc_proj_bwd", "fc_proj_gelu_fwd", "fc_proj_dgelu_bwd"},
    {"lm_head", "lm_head_fwd", "lm_head_bwd", "lm_head_gelu_fwd", "lm_head_dgelu_bwd"},
};
static int g_role = -1;

void timing_matmul_role(const char *role) {
    g_role = -1;
    for (int i = 0; i < (int)(sizeof(ROLES) / sizeof(ROLES[0])); i++)
        if (strcmp(ROLES[i][0], role) == 0) g_role = i;
}

const char *timing_matmul_name(int backward) {
    if (g_role < 0) return backward ? "matmul_bwd" : "matmul_fwd";
    return ROLES[g_role][backward ? 2 : 1];
}

const char *timing_matmul_gelu_name(int backward) {
    if (g_role < 0) return backward ? "matmul_dgelu_bwd" : "matmul_gelu_fwd";
    return ROLES[g_role][backward ? 4 : 3];
}

/* realloc(*p, bytes) into *p; 0, or -1 with *p as it was */
static int grow_one(void **p, size_t bytes) {
    void *q = realloc(*p, bytes);
    if (!q) return -1;
    *p = q;
    return 0;
}

/* Grows the records, their handles and the analysis scratch to hold index i (twice the
 * capacity, or more); called without the read lock. Growth stops for good at RECORDS_MAX
 * or at the first allocation that fails (the capacity then stays what every array holds). */
static void grow_records(size_t i) {
    pthread_rwlock_wrlock(&T.grow);
    if (i >= T.capacity && !T.grow_failed && i < RECORDS_MAX) {
        size_t cap = 2 * T.capacity > i + 1 ? 2 * T.capacity : i + 1;
        if (cap > RECORDS_MAX) cap = RECORDS_MAX;
        int bad = grow_one((void **)&T.rec, cap * sizeof *T.rec) ||
                  grow_one((void **)&T.ops, cap * sizeof *T.ops) ||
                  grow_one((void **)&T.work, cap * sizeof *T.work) ||
                  grow_one((void **)&T.merged_comp, cap * sizeof *T.merged_comp) ||
                  grow_one((void **)&T.merged_comm, cap * sizeof *T.merged_comm) ||
                  grow_one((void **)&T.merged_par, cap * sizeof *T.merged_par);
        if (bad) T.grow_failed = 1;
        else T.capacity = cap;
    }
    pthread_rwlock_unlock(&T.grow);
}

/* rec's slot for one more record of this step, with the read lock held (timing_put
 * releases it), or -1 (no lock held) when the record is dropped: counted where counted
 * (an op left untimed), not for a device-work-only slot */
static long take_slot(int counted) {
    size_t i = atomic_fetch_add(&T.n, 1);
    pthread_rwlock_rdlock(&T.grow);
    if (i >= T.capacity) {
        pthread_rwlock_unlock(&T.grow);
        grow_records(i);
        pthread_rwlock_rdlock(&T.grow);
    }
    if (i < T.capacity) return (long)i;
    pthread_rwlock_unlock(&T.grow);
    if (counted) atomic_fetch_add(&T.dropped, 1);
    return -1;
}

static void timing_put(long i, timing_record r, int32_t op) {
    T.rec[i] = r;
    T.ops[i] = op;
    pthread_rwlock_unlock(&T.grow);
}

static timing_record record_of(const char *name, timing_kind kind, timing_par par, int stream,
                               timing_ctx ctx, timing_work work, timing_match match) {
    return (timing_record){.name = name, .kind = (int8_t)kind, .par = (int8_t)par,
                           .phase = ctx.phase, .stream = (int8_t)stream, .layer = ctx.layer,
                           .micro = ctx.micro, .step = (int32_t)T.step,
                           .flops = (float)work.flops, .bytes = (float)work.bytes,
                           .match = match, .wait_us = -1.0f, .peer_rank = -1};
}

/* a host-timed record (op -1) or a device-timed one (its timer handle) */
static void record(timing_record r, double start_ms, double end_ms, int op) {
    long i = take_slot(1);
    if (i < 0) return;
    if (op < 0) {
        r.start_us = (start_ms - T.origin_ms) * 1e3;
        r.end_us = (end_ms - T.origin_ms) * 1e3;
    }
    timing_put(i, r, op < 0 ? -1 : op);
}

void timing_record_op(const char *name, timing_kind kind, timing_par par, int stream,
                      timing_ctx ctx, timing_work work, timing_match match, double start_ms,
                      double end_ms) {
    if (T.on) record(record_of(name, kind, par, stream, ctx, work, match), start_ms, end_ms, -1);
}

void timing_record_device(const char *name, timing_kind kind, timing_par par, int stream,
                          timing_ctx ctx, timing_work work, timing_match match, int op) {
    if (T.on) record(record_of(name, kind, par, stream, ctx, work, match), 0, 0, op);
}

/* A device-work-only slot's ops entry (timing_device_work): handle op encoded below -1,
 * which marks host-timed records (handle_of gives -1 back for those) */
static int32_t work_only(int op) { return -2 - op; }
static int handle_of(int32_t ops_entry) { return ops_entry >= 0 ? ops_entry : -2 - ops_entry; }

void timing_device_work(const char *name, timing_kind kind, int op) {
    if (!T.on || op < 0) return;
    long i = take_slot(0);
    if (i < 0) return;
    timing_put(i, (timing_record){.name = name, .kind = (int8_t)kind}, work_only(op));
}

/* Keeps each piece of the step's device work, under the op whose handle it carries
 * (handles, set for the ops that were read): pieces of an op that was not (untimed, or
 * its time spoiled) are left out with it. timing_end_step adds them up. */
static void keep_pieces(timing_piece_fn piece, size_t n_handles) {
    int op;
    const char *kernel;
    double a, b;
    for (size_t i = 0; piece(i, &op, &kernel, &a, &b) == 0; i++) {
        handle_op h = op == -1 ? (handle_op){TIMING_NO_OP, TK_COMPUTE}
                      : op >= 0 && (size_t)op < n_handles ? T.handles[op]
                                                           : (handle_op){NULL, 0};
        if (!h.name || !kernel) continue;
        if (T.n_pieces == T.cap_pieces) {
            T.cap_pieces = T.cap_pieces ? 2 * T.cap_pieces : 1024;
            T.pieces = log_realloc(T.pieces, sizeof(*T.pieces) * T.cap_pieces,
                                   "the timing's device kernels");
        }
        T.pieces[T.n_pieces++] = (step_piece){h.name, kernel, h.kind, (a - T.origin_ms) * 1e3,
                                              (b - T.origin_ms) * 1e3};
    }
}

void timing_resolve_device(int (*read)(int op, double *start_ms, double *end_ms),
                           timing_piece_fn piece) {
    if (!T.on) return;
    size_t n = atomic_load(&T.n), kept = 0, n_handles = 0;
    if (n > T.capacity) n = T.capacity;
    /* the kernels of warm-up and probe steps stay out, as their ops' statistics do */
    if (piece && T.n_steps < T.warmup) piece = NULL;
    if (piece && T.probe) piece = NULL;
    for (size_t i = 0; piece && i < n; i++) {
        int h = handle_of(T.ops[i]); /* -1 for a host-timed record */
        if (h >= 0 && (size_t)h >= n_handles) n_handles = (size_t)h + 1;
    }
    if (n_handles > T.cap_handles) {
        T.handles = log_realloc(T.handles, sizeof(*T.handles) * n_handles,
                                "the timing's op handles");
        T.cap_handles = n_handles;
    }
    if (n_handles) memset(T.handles, 0, sizeof(*T.handles) * n_handles);
    for (size_t i = 0; i < n; i++) {
        double a, b;
        if (T.ops[i] < -1) { /* device work only: its pieces' op, not a record */
            if (piece) T.handles[handle_of(T.ops[i])] = (handle_op){T.rec[i].name, T.rec[i].kind};
            continue;
        }
        if (T.ops[i] >= 0) {
            if (read(T.ops[i], &a, &b) != 0) {
                T.untimed[T.rec[i].kind == TK_COMM]++;
                continue;
            }
            if (piece) T.handles[T.ops[i]] = (handle_op){T.rec[i].name, T.rec[i].kind};
            T.rec[i].start_us = (a - T.origin_ms) * 1e3;
            T.rec[i].end_us = (b - T.origin_ms) * 1e3;
            T.ops[i] = -1;
        }
        T.rec[kept++] = T.rec[i];
    }
    atomic_store(&T.n, kept);
    if (piece) keep_pieces(piece, n_handles);
}

void timing_set_warmup(int n) { T.warmup = n > 0 ? n : 0; }
int timing_warmup(void) { return T.warmup; }

void timing_stop_clock(double at_ms) { T.stop_ms = at_ms; }

void timing_begin_step(long step, int probe) {
    T.stop_ms = 0;
    T.step = step;
    T.probe = probe;
    T.n_pieces = 0;
    atomic_store(&T.n, 0);
    T.step_start_ms = timing_now_ms();
}

/* ------------------------------------------------------------------ analysis */

static int by_start(const void *x, const void *y) {
    const span *a = x, *b = y;
    return a->a < b->a ? -1 : a->a > b->a;
}

/* Sorts in[k] and writes its union, sorted and disjoint, to out; returns its length. */
static size_t merge_spans(span *in, size_t k, span *out) {
    qsort(in, k, sizeof(span), by_start);
    size_t m = 0;
    for (size_t i = 0; i < k; i++) {
        if (m > 0 && in[i].a <= out[m - 1].b) {
            if (in[i].b > out[m - 1].b) out[m - 1].b = in[i].b;
        } else {
            out[m++] = in[i];
        }
    }
    return m;
}

/* Sorted, disjoint union of the records of one kind (and of one parallelism, par >= 0);
 * returns its length in out[]. */
static size_t union_of(const timing_record *r, size_t n, int kind, int par, span *out) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (r[i].kind == kind && (par < 0 || r[i].par == par))
            T.work[k++] = (span){r[i].start_us, r[i].end_us};
    return merge_spans(T.work, k, out);
}

static double total(const span *s, size_t n) {
    double t = 0;
    for (size_t i = 0; i < n; i++) t += s[i].b - s[i].a;
    return t;
}

/* Length of the intersection of two sorted disjoint unions. */
static double intersection(const span *x, size_t nx, const span *y, size_t ny) {
    double t = 0;
    size_t i = 0, j = 0;
    while (i < nx && j < ny) {
        double a = x[i].a > y[j].a ? x[i].a : y[j].a, b = x[i].b < y[j].b ? x[i].b : y[j].b;
        if (b > a) t += b - a;
        if (x[i].b < y[j].b) i++;
        else j++;
    }
    return t;
}

/* The part of the union comm not covered by the union comp: communication nothing hid. */
static double exposed(const span *comp, size_t nc, const span *comm, size_t nm) {
    return total(comm, nm) - intersection(comp, nc, comm, nm);
}

/* A comm op's time after its wait shorter than this, for an op of dur us, is no moving
 * time measured: the wait is kept as a float clamped to the duration (7 digits: 0.004 us
 * off at 0.1 s), and 10 ns is far below any transfer's time */
static double unmeasured_us(double dur) { return 0.01 + 1e-6 * dur; }

/* Does [a, b) meet the union u (sorted, disjoint)? */
static int meets(const span *u, size_t n, double a, double b) {
    size_t lo = 0, hi = n;
    while (lo < hi) { /* first span ending after a */
        size_t mid = (lo + hi) / 2;
        if (u[mid].b <= a) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && u[lo].a < b;
}

static void split_add(timing_split *s, double us, int over) {
    s->count++;
    s->sum_us += us;
    if (over) {
        s->n_overlapped++;
        s->overlapped_us += us;
    } else {
        s->n_isolated++;
        s->isolated_us += us;
    }
}

/* Did [a, b) of an op of kind run while the other kind was in flight (comp, comm: the
 * step's unions of each)? */
static int beside_other(int kind, double a, double b, const span *comp, size_t nc,
                        const span *comm, size_t nm) {
    return kind == TK_COMM ? meets(comp, nc, a, b) : meets(comm, nm, a, b);
}

static void add_device_kernel(const step_piece *p, int over) {
    timing_device_kernel *d = NULL;
    for (int i = 0; i < T.n_dev && !d; i++)
        if (T.dev[i].kernel == p->kernel &&
            (T.dev[i].op == p->op || strcmp(T.dev[i].op, p->op) == 0))
            d = &T.dev[i];
    if (!d) {
        if (T.n_dev == T.cap_dev) {
            T.cap_dev = T.cap_dev ? 2 * T.cap_dev : 64;
            T.dev = log_realloc(T.dev, sizeof(*T.dev) * (size_t)T.cap_dev,
                                "the timing's device kernels");
        }
        d = &T.dev[T.n_dev++];
        *d = (timing_device_kernel){.op = p->op, .kernel = p->kernel};
    }
    split_add(&d->s, p->b - p->a, over);
}

static timing_kernel_stats *kernel_slot(const timing_record *r, int probe) {
    for (int i = 0; i < T.n_kernels; i++) {
        timing_kernel_stats *k = &T.kernels[i];
        if (k->kind == r->kind && k->par == r->par && k->probe == probe &&
            k->call_bytes == (double)r->bytes && (k->name == r->name || strcmp(k->name, r->name) == 0))
            return k;
    }
    if (T.n_kernels == T.cap_kernels) {
        T.cap_kernels = T.cap_kernels ? 2 * T.cap_kernels : 64;
        T.kernels = log_realloc(T.kernels, sizeof(*T.kernels) * (size_t)T.cap_kernels,
                                "the timing's kernel statistics");
    }
    timing_kernel_stats *k = &T.kernels[T.n_kernels++];
    *k = (timing_kernel_stats){.name = r->name, .kind = r->kind, .par = r->par, .probe = probe,
                               .call_bytes = (double)r->bytes};
    return k;
}

static void keep_for_trace(const timing_record *r, size_t n) {
    if (T.n_trace + n > T.cap_trace && T.cap_trace < T.trace_limit) {
        size_t cap = T.cap_trace ? 2 * T.cap_trace : 4096;
        while (cap < T.n_trace + n) cap *= 2;
        if (cap > T.trace_limit) cap = T.trace_limit;
        timing_record *t = realloc(T.trace, sizeof(*t) * cap);
        if (t) {
            T.trace = t;
            T.cap_trace = cap;
        } else {
            T.trace_limit = T.cap_trace; /* the run goes on; the report says what is missing */
        }
    }
    size_t room = T.cap_trace - T.n_trace, k = n < room ? n : room;
    memcpy(T.trace + T.n_trace, r, k * sizeof(*r));
    T.n_trace += k;
    T.trace_omitted += (long)(n - k);
}

void timing_note_power(double energy_j, double power_w, double sm_clock_mhz) {
    if (!T.on || T.n_steps == 0) return;
    timing_step_summary *s = &T.steps[T.n_steps - 1];
    s->has_power = 1;
    s->energy_j = energy_j;
    s->power_w = power_w;
    s->sm_clock_mhz = sm_clock_mhz;
}

void timing_end_step(double iter_ms) {
    if (!T.on) return;
    /* where the step's clock stopped (timing_stop_clock), or now, before the analysis:
     * reading a device's times and sorting a large step's records take milliseconds, which
     * the trace's span of the step would show as a step longer than its iter_ms */
    double end_ms = T.stop_ms > T.step_start_ms ? T.stop_ms : timing_now_ms();
    size_t n = atomic_load(&T.n);
    if (n > T.capacity) n = T.capacity;
    size_t nc = union_of(T.rec, n, TK_COMPUTE, -1, T.merged_comp);
    size_t nm = union_of(T.rec, n, TK_COMM, -1, T.merged_comm);
    double comm = total(T.merged_comm, nm);
    int warm = T.n_steps < T.warmup; /* steps closed before this one, in this run */
    timing_step_summary s = {.step = T.step, .probe = T.probe, .warmup = warm,
                             .iter_ms = iter_ms, .compute_ms = total(T.merged_comp, nc) / 1e3,
                             .comm_ms = comm / 1e3,
                             .start_us = (T.step_start_ms - T.origin_ms) * 1e3,
                             .end_us = (end_ms - T.origin_ms) * 1e3};
    s.exposed_comm_ms = exposed(T.merged_comp, nc, T.merged_comm, nm) / 1e3;
    /* which parallelism's communication the compute hides, each on its own */
    for (int par = TP_DP; par < TIMING_PARS; par++) {
        size_t np = union_of(T.rec, n, TK_COMM, par, T.merged_par);
        s.par_comm_ms[par] = total(T.merged_par, np) / 1e3;
        s.par_exposed_ms[par] = exposed(T.merged_comp, nc, T.merged_par, np) / 1e3;
    }
    if (T.n_steps == T.cap_steps) {
        T.cap_steps = T.cap_steps ? 2 * T.cap_steps : 64;
        T.steps = log_realloc(T.steps, sizeof(*T.steps) * (size_t)T.cap_steps,
                              "the timing's step summaries");
    }
    T.steps[T.n_steps++] = s;
    /* a compute kernel is overlapped when communication was in flight during it; a
     * communication kernel when compute was */
    for (size_t i = 0; i < n && !warm; i++) {
        timing_record *r = &T.rec[i];
        r->overlapped = (int8_t)beside_other(r->kind, r->start_us, r->end_us, T.merged_comp, nc,
                                             T.merged_comm, nm);
        timing_kernel_stats *k = kernel_slot(r, T.probe);
        split_add(&k->s, r->end_us - r->start_us, r->overlapped);
        k->flops += r->flops;
        k->bytes += r->bytes;
    }
    /* the device kernels the same way: a kernel of a compute op (or of none) overlapped
     * when communication was in flight, one of a communication op when compute was */
    for (size_t i = 0; i < T.n_pieces; i++) {
        const step_piece *p = &T.pieces[i];
        add_device_kernel(p, beside_other(p->kind, p->a, p->b, T.merged_comp, nc, T.merged_comm,
                                          nm));
    }
    T.n_pieces = 0;
    size_t kept = T.n_trace;
    keep_for_trace(T.rec, n);
    T.steps[T.n_steps - 1].whole = T.n_trace - kept == n;
}

void timing_set_wait(size_t i, float wait_us) {
    if (i < T.n_trace) T.trace[i].wait_us = wait_us;
}

void timing_set_peer_rank(size_t i, int world_rank) {
    if (i < T.n_trace && world_rank >= 0 && world_rank <= INT16_MAX)
        T.trace[i].peer_rank = (int16_t)world_rank;
}

/* One step's lost time (timing_step_summary's wait_ms) from its kept records r[n], among
 * the communication of parallelism par (-1: all): the union of the ops' waiting parts
 * less what compute or an op's moving part (of that parallelism) covers. Scratch: in, wait
 * and busy hold n spans each. */
static double step_wait_us(const timing_record *r, size_t n, int par, span *in, span *wait,
                           span *busy) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (r[i].kind == TK_COMM && (par < 0 || r[i].par == par) && r[i].wait_us > 0)
            in[k++] = (span){r[i].start_us, r[i].start_us + r[i].wait_us};
    size_t nw = merge_spans(in, k, wait);
    if (nw == 0) return 0; /* nothing waited (a parallelism this step did not use) */
    k = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].kind == TK_COMM && par >= 0 && r[i].par != par) continue;
        /* an op whose wait is unknown counts as moving data all along: no loss is claimed */
        double a = r[i].kind == TK_COMM && r[i].wait_us > 0 ? r[i].start_us + r[i].wait_us
                                                            : r[i].start_us;
        if (r[i].end_us > a) in[k++] = (span){a, r[i].end_us};
    }
    size_t nb = merge_spans(in, k, busy);
    return total(wait, nw) - intersection(wait, nw, busy, nb);
}

void timing_sum_waits(void) {
    if (!T.on || T.n_trace == 0) return;
    /* [n_trace] each, scratch for one step's spans: all, the waits' union, the busy one */
    span *in = malloc(T.n_trace * sizeof *in), *wait = malloc(T.n_trace * sizeof *wait),
         *busy = malloc(T.n_trace * sizeof *busy);
    if (!in || !wait || !busy) {
        log_warn("no memory to sum the communication's waits: the report leaves them out");
        free(in), free(wait), free(busy);
        return;
    }
    /* the kept records run step by step, in the order of T.steps */
    int s = 0;
    for (size_t i = 0; i < T.n_trace;) {
        size_t j = i;
        while (j < T.n_trace && T.trace[j].step == T.trace[i].step) j++;
        while (s < T.n_steps && T.steps[s].step != T.trace[i].step) s++;
        if (s == T.n_steps) break;
        timing_step_summary *st = &T.steps[s];
        int known = 0;
        for (size_t q = i; q < j; q++)
            known |= T.trace[q].kind == TK_COMM && T.trace[q].wait_us >= 0;
        /* a step the trace's cap cut short lacks the compute that covered its waits */
        if (known && st->whole) {
            st->has_wait = 1;
            st->wait_ms = step_wait_us(T.trace + i, j - i, -1, in, wait, busy) / 1e3;
            for (int par = TP_DP; par < TIMING_PARS; par++)
                st->par_wait_ms[par] = step_wait_us(T.trace + i, j - i, par, in, wait, busy) / 1e3;
        }
        /* the step's compute, which an op's moving part ran beside or not (whole steps) */
        size_t nc = 0;
        for (size_t q = i; q < j && st->whole; q++)
            if (T.trace[q].kind == TK_COMPUTE)
                in[nc++] = (span){T.trace[q].start_us, T.trace[q].end_us};
        nc = merge_spans(in, nc, busy);
        for (size_t q = i; q < j && !st->warmup; q++) {
            const timing_record *r = &T.trace[q];
            if (r->kind != TK_COMM || r->wait_us < 0) continue;
            timing_kernel_stats *k = kernel_slot(r, st->probe);
            /* a wait read on one clock and a span on another may differ by a rounding */
            double dur = r->end_us - r->start_us, w = r->wait_us < dur ? r->wait_us : dur;
            split_add(&k->wait, w, r->overlapped);
            /* the moving part is overlapped when compute ran beside it, not beside the
             * wait: a transfer that began once a peer's compute was over met no compute */
            if (!st->whole) continue;
            if (dur - w < unmeasured_us(dur)) {
                k->all_wait++;
                continue;
            }
            split_add(&k->moving, dur - w, meets(busy, nc, r->start_us + w, r->end_us));
            k->moving_bytes += r->bytes;
        }
        s++;
        i = j;
    }
    free(in);
    free(wait);
    free(busy);
}

int timing_n_steps(void) { return T.n_steps; }
const timing_step_summary *timing_steps(void) { return T.steps; }
int timing_n_kernels(void) { return T.n_kernels; }
int timing_n_device_kernels(void) { return T.n_dev; }
const timing_device_kernel *timing_device_kernels(void) { return T.dev; }
const timing_kernel_stats *timing_kernels(void) { return T.kernels; }
size_t timing_n_trace(void) { return T.n_trace; }
const timing_record *timing_trace(void) { return T.trace; }
long timing_dropped(void) { return atomic_load(&T.dropped); }
long timing_trace_omitted(void) { return T.trace_omitted; }
long timing_untimed(int kind) { return T.untimed[kind == TK_COMM]; }
void timing_set_trace_limit(size_t records) { T.trace_limit = records; }

const char *timing_kind_name(int kind) { return kind == TK_COMM ? "comm" : "compute"; }
const char *timing_par_name(int par) {
    static const char *names[TIMING_PARS] = {"none", "dp", "tp", "pp"};
    return par >= 0 && par < TIMING_PARS ? names[par] : "none";
}
const char *timing_phase_name(int phase) {
    static const char *names[] = {"fwd", "bwd", "opt"};
    return phase >= 0 && phase < 3 ? names[phase] : "fwd";
}
