/* Op timing from CUPTI activity records: the device's own start and end of every kernel,
 * memcpy and memset, NCCL's and cuBLASLt's kernels included. An op is tied to its kernels
 * by an external correlation id pushed around the calls that launch them: CUPTI then
 * emits one EXTERNAL_CORRELATION record per launching API call, mapping the call's
 * correlation id to ours, and every kernel record carries its call's correlation id. An
 * op's interval runs from its first kernel's start to its last kernel's end, so time spent
 * queued behind other work is not counted (unlike CUDA events).
 *
 * CUPTI fills buffers we hand it and returns them full, possibly from its own thread, so
 * the records are copied out under a lock. CUPTI's clock (cuptiGetTimestamp, ns) is tied
 * to timing_now_ms() by reading both at the step's start.
 *
 * The record structs are read through the oldest layouts still shipped (Kernel4, Memcpy,
 * Memset): the fields used here (kind, start, end, correlationId, a kernel's name, a
 * copy's kind) sit at the same offsets in every later version (name at 104 in Kernel4 to
 * Kernel10, copyKind at 4 in Memcpy to Memcpy6: offsetof against CUDA 13's headers), so
 * this reads the records of any CUPTI from CUDA 11 to 13. Each kernel's name (and its
 * interval) also goes to the timing as a piece of its op's work (cupti_timer_piece). */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include "engine/cuda/cuda_internal.h"

#include "engine/kernel_name.h"
#include "engine/log.h"
#include "engine/timing.h"

#include <cupti.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BUFFER_BYTES = 4 << 20 };

typedef struct {
    uint32_t corr;
    int32_t op;       /* the op it belongs to (set by resolve), or -1 */
    const char *name; /* interned (kernel_of): kernel, copy or set */
    uint64_t start, end;
} activity;

/* a kernel's name as CUPTI hands it (the same pointer in every record of that kernel)
 * and as the report gives it */
typedef struct {
    const char *symbol;
    char *name;
} kernel_entry;

typedef struct {
    uint32_t corr;
    uint32_t op;
} link;

static struct {
    pthread_mutex_t lock;
    activity *acts; /* [n_acts] kernels, copies and sets of this step */
    size_t n_acts, cap_acts;
    link *links;    /* [n_links] call correlation id -> our op */
    size_t n_links, cap_links;
    uint64_t origin_ts;
    double origin_ms;
    int n_ops;         /* ops begun this step */
    int resolved;      /* op_start/op_end hold this step's intervals */
    uint64_t *op_span; /* [2 * cap_ops] first start, last end of each op's records */
    int cap_ops;
    long dropped;
    kernel_entry *kernels; /* [n_kernels] every kernel name seen in the run */
    size_t n_kernels, cap_kernels;
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, BUFFER_BYTES);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? 2 * *cap : 65536;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* The report's name of the kernel CUPTI calls `symbol`, kept for the run: looked up by
 * CUPTI's pointer, then by name (two symbols may demangle alike). Under g.lock. */
static const char *kernel_of(const char *symbol) {
    for (size_t i = 0; i < g.n_kernels; i++)
        if (g.kernels[i].symbol == symbol) return g.kernels[i].name;
    char name[256];
    kernel_name(symbol, name, sizeof name);
    char *kept = NULL;
    for (size_t i = 0; i < g.n_kernels && !kept; i++)
        if (strcmp(g.kernels[i].name, name) == 0) kept = g.kernels[i].name;
    if (!kept) kept = strdup(name);
    if (!kept || grow((void **)&g.kernels, &g.cap_kernels, g.n_kernels + 1, sizeof(kernel_entry)))
        return kept ? kept : "?";
    g.kernels[g.n_kernels++] = (kernel_entry){symbol, kept};
    return kept;
}

static const char *copy_name(uint8_t copy_kind) {
    switch (copy_kind) { /* CUpti_ActivityMemcpyKind */
    case 1: return "memcpy_HtoD";
    case 2: return "memcpy_DtoH";
    case 8: return "memcpy_DtoD";
    case 9: return "memcpy_HtoH";
    case 10: return "memcpy_PtoP";
    default: return "memcpy";
    }
}

static void keep_activity(uint32_t corr, const char *name, uint64_t start, uint64_t end) {
    if (start == 0 || end < start) return; /* flushed before it finished */
    if (grow((void **)&g.acts, &g.cap_acts, g.n_acts + 1, sizeof(activity)) != 0) {
        g.dropped++;
        return;
    }
    g.acts[g.n_acts++] = (activity){corr, -1, name, start, end};
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid) {
    CUpti_Activity *r = NULL;
    pthread_mutex_lock(&g.lock);
    while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
        switch (r->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
            const CUpti_ActivityKernel4 *k = (const CUpti_ActivityKernel4 *)r;
            keep_activity(k->correlationId, kernel_of(k->name), k->start, k->end);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            const CUpti_ActivityMemcpy *m = (const CUpti_ActivityMemcpy *)r;
            keep_activity(m->correlationId, copy_name(m->copyKind), m->start, m->end);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            const CUpti_ActivityMemset *m = (const CUpti_ActivityMemset *)r;
            keep_activity(m->correlationId, "memset", m->start, m->end);
            break;
        }
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
            const CUpti_ActivityExternalCorrelation *e = (const CUpti_ActivityExternalCorrelation *)r;
            if (e->externalKind != CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) break;
            if (grow((void **)&g.links, &g.cap_links, g.n_links + 1, sizeof(link)) != 0) {
                g.dropped++;
                break;
            }
            /* our ids are op + 1: CUPTI reserves 0 */
            g.links[g.n_links++] = (link){e->correlationId, (uint32_t)(e->externalId - 1)};
            break;
        }
        default:
            break;
        }
    }
    size_t lost = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &lost) == CUPTI_SUCCESS) g.dropped += (long)lost;
    pthread_mutex_unlock(&g.lock);
    free(buffer);
}

int cupti_timer_start(char *why, size_t whylen) {
    /* each step's origin (cupti_timer_reset) first: without it every time would be off by
     * the whole clock, so a CUPTI that cannot give it leaves timing to the events, before
     * any activity is on (enabled, its records would pile up unread all run) */
    uint64_t ts = 0;
    const char *call = "cuptiGetTimestamp";
    CUptiResult rc = cuptiGetTimestamp(&ts);
    if (rc == CUPTI_SUCCESS) {
        call = "cuptiActivityRegisterCallbacks";
        rc = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    }
    /* EXTERNAL_CORRELATION records are emitted for API records only, so the runtime and
     * driver API kinds must be on too (their own records are skipped when read) */
    static const CUpti_ActivityKind kinds[] = {
        CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
        CUPTI_ACTIVITY_KIND_MEMSET,            CUPTI_ACTIVITY_KIND_RUNTIME,
        CUPTI_ACTIVITY_KIND_DRIVER,            CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION};
    size_t on = 0; /* kinds enabled */
    for (; rc == CUPTI_SUCCESS && on < sizeof kinds / sizeof kinds[0]; on++) {
        call = "cuptiActivityEnable";
        rc = cuptiActivityEnable(kinds[on]);
        if (rc != CUPTI_SUCCESS) break;
    }
    if (rc != CUPTI_SUCCESS) {
        /* the events time the run: what was switched on goes off again */
        for (size_t k = 0; k < on; k++) cuptiActivityDisable(kinds[k]);
        const char *msg = NULL;
        cuptiGetResultString(rc, &msg);
        snprintf(why, whylen, "%s: %s", call, msg ? msg : "error");
        return -1;
    }
    return 0;
}

/* Drops what is left of the previous step: the device is idle, so a forced flush hands
 * back every record it produced. */
void cupti_timer_reset(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    pthread_mutex_lock(&g.lock);
    g.n_acts = g.n_links = 0;
    pthread_mutex_unlock(&g.lock);
    g.n_ops = 0;
    g.resolved = 0;
    uint64_t ts = 0;
    CUptiResult rc = cuptiGetTimestamp(&ts); /* it worked at the start */
    if (rc != CUPTI_SUCCESS) {
        const char *msg = NULL;
        cuptiGetResultString(rc, &msg);
        log_error("rank %d: CUPTI: cuptiGetTimestamp: %s (GPTC_TIMER=events times with CUDA "
                  "events instead)", log_rank(), msg ? msg : "error");
        exit(EXIT_FAILURE);
    }
    g.origin_ms = timing_now_ms();
    g.origin_ts = ts;
}

int cupti_timer_begin(gptc_stream *s) {
    int op = g.n_ops++;
    cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, (uint64_t)op + 1);
    return op;
}

void cupti_timer_end(int op, gptc_stream *s) {
    uint64_t last = 0;
    cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
}

static int by_corr(const void *a, const void *b) {
    uint32_t x = ((const link *)a)->corr, y = ((const link *)b)->corr;
    return x < y ? -1 : x > y;
}

/* Once per step, at the first read: every record joined to its op through the links. */
static void resolve(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (g.n_ops > g.cap_ops) {
        int cap = g.n_ops * 2;
        uint64_t *p = realloc(g.op_span, 2 * (size_t)cap * sizeof(uint64_t));
        if (!p) return;
        g.op_span = p;
        g.cap_ops = cap;
    }
    for (int i = 0; i < g.n_ops; i++) g.op_span[2 * i] = UINT64_MAX, g.op_span[2 * i + 1] = 0;
    pthread_mutex_lock(&g.lock);
    qsort(g.links, g.n_links, sizeof(link), by_corr);
    for (size_t i = 0; i < g.n_acts; i++) {
        link key = {g.acts[i].corr, 0};
        const link *l = bsearch(&key, g.links, g.n_links, sizeof(link), by_corr);
        g.acts[i].op = -1;
        if (!l || (int)l->op >= g.n_ops) continue;
        g.acts[i].op = (int32_t)l->op;
        uint64_t *span = &g.op_span[2 * l->op];
        if (g.acts[i].start < span[0]) span[0] = g.acts[i].start;
        if (g.acts[i].end > span[1]) span[1] = g.acts[i].end;
    }
    pthread_mutex_unlock(&g.lock);
    g.resolved = 1;
}

int cupti_timer_read(int op, double *start_ms, double *end_ms) {
    if (!g.resolved) resolve();
    if (!g.resolved || op < 0 || op >= g.n_ops) return -1;
    const uint64_t *span = &g.op_span[2 * op];
    if (span[0] == UINT64_MAX) return -1;
    /* CUPTI stamps are ns; signed differences, a record may start before the origin */
    *start_ms = g.origin_ms + (double)(int64_t)(span[0] - g.origin_ts) * 1e-6;
    *end_ms = g.origin_ms + (double)(int64_t)(span[1] - g.origin_ts) * 1e-6;
    return 0;
}

int cupti_timer_piece(size_t i, int *op, const char **kernel, double *start_ms, double *end_ms) {
    if (!g.resolved) resolve();
    if (!g.resolved) return -1;
    pthread_mutex_lock(&g.lock);
    int rc = -1;
    if (i < g.n_acts) {
        *op = g.acts[i].op;
        *kernel = g.acts[i].name;
        /* as cupti_timer_read: ns since the step's origin, signed */
        *start_ms = g.origin_ms + (double)(int64_t)(g.acts[i].start - g.origin_ts) * 1e-6;
        *end_ms = g.origin_ms + (double)(int64_t)(g.acts[i].end - g.origin_ts) * 1e-6;
        rc = 0;
    }
    pthread_mutex_unlock(&g.lock);
    return rc;
}
