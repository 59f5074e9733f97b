/* Test tool, not part of the engine: a fake CUPTI (cupti.h of tests/cuda_emu) for
 * gptc-train-emu, in two modes:
 *  - by default it refuses to start (cuptiActivityRegisterCallbacks fails), as CUPTI does
 *    when another profiler holds it, so that engine/cuda/cuda_backend.c falls back to its
 *    CUDA-event timer (timer_events.c);
 *  - with GPTC_EMU_CUPTI=1 it records activity as CUPTI does, so that timer_cupti.c runs:
 *    every call of the fake runtime that puts work on a stream (a kernel launch, a copy,
 *    a set, a cuBLASLt product, a fake NCCL op) gets a correlation id, and is an API record (kind
 *    RUNTIME, when enabled) followed, when the calling thread has an external id of that
 *    kind pushed, by an EXTERNAL_CORRELATION record linking the two; the work itself,
 *    when its stream runs it, is a CONCURRENT_KERNEL, MEMCPY or MEMSET record with the
 *    same correlation id, stamped with the host clock (CLOCK_MONOTONIC, ns), which
 *    cuptiGetTimestamp also reads. Records go into the buffers the client's request
 *    callback hands out; a full buffer goes back through its completion callback at once,
 *    the others at cuptiActivityFlushAll. External correlation stacks are per thread and
 *    per kind, as in CUPTI.
 * The records' layouts are cupti.h's (the fields the engine reads at the real offsets). */
#define _GNU_SOURCE /* gettid */

#include "cupti.h"
#include "emu_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

CUptiResult emu_cuptiGetResultString(CUptiResult result, const char **str) {
    switch (result) {
    case CUPTI_SUCCESS: *str = "CUPTI_SUCCESS"; break;
    case CUPTI_ERROR_INVALID_PARAMETER: *str = "CUPTI_ERROR_INVALID_PARAMETER"; break;
    case CUPTI_ERROR_MAX_LIMIT_REACHED: *str = "CUPTI_ERROR_MAX_LIMIT_REACHED"; break;
    case CUPTI_ERROR_INVALID_KIND: *str = "CUPTI_ERROR_INVALID_KIND"; break;
    case CUPTI_ERROR_NOT_INITIALIZED:
        *str = "CUPTI_ERROR_NOT_INITIALIZED (cuda_emu: CUPTI is off; GPTC_EMU_CUPTI=1 starts it)";
        break;
    default: *str = "CUPTI_ERROR_UNKNOWN"; break;
    }
    return CUPTI_SUCCESS;
}

/* GPTC_EMU_CUPTI=1 lets the fake start; =runtime_fails too, but the enable of the
 * RUNTIME kind fails (the client must then switch off what it had switched on: at exit
 * the fake says so when a kind was left on with no flush since) */
static int cupti_wanted(void) {
    const char *e = getenv("GPTC_EMU_CUPTI");
    return e && (strcmp(e, "1") == 0 || strcmp(e, "runtime_fails") == 0);
}

static int runtime_fails(void) {
    const char *e = getenv("GPTC_EMU_CUPTI");
    return e && strcmp(e, "runtime_fails") == 0;
}

enum { MAX_DEPTH = 64 };

static struct {
    pthread_mutex_t mu;
    _Atomic int on; /* callbacks registered */
    CUpti_BuffersCallbackRequestFunc request;
    CUpti_BuffersCallbackCompleteFunc complete;
    _Atomic unsigned int kinds; /* bit k: kind k enabled (kinds < 32 and 39) */
    int external_on;
    uint8_t *buf;               /* the buffer being filled */
    size_t size, used;
    size_t dropped;
    _Atomic uint32_t next_corr;
} C = {.mu = PTHREAD_MUTEX_INITIALIZER, .next_corr = 1};

/* per thread and kind (CUSTOM0..2 and the others): the pushed external ids */
static __thread uint64_t ext_stack[6][MAX_DEPTH];
static __thread int ext_depth[6];

static int kind_on(CUpti_ActivityKind k) {
    if (k == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) return C.external_on;
    return k < 32 && (atomic_load(&C.kinds) >> k & 1u);
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Appends one record (bytes, a multiple of 8); a full buffer goes back to the client. */
static void put_record(const void *rec, size_t bytes) {
    uint8_t *full = NULL;
    size_t full_size = 0, full_used = 0;
    pthread_mutex_lock(&C.mu);
    if (C.buf && C.used + bytes > C.size) {
        full = C.buf, full_size = C.size, full_used = C.used;
        C.buf = NULL;
    }
    if (!C.buf) {
        uint8_t *b = NULL;
        size_t size = 0, max_records = 0;
        C.request(&b, &size, &max_records);
        if (b && size >= bytes) C.buf = b, C.size = size, C.used = 0;
        else free(b); /* the client's buffer, from malloc in gptc; too small or none */
    }
    if (C.buf) {
        memcpy(C.buf + C.used, rec, bytes);
        C.used += bytes;
    } else {
        C.dropped++;
    }
    pthread_mutex_unlock(&C.mu);
    if (full) C.complete(NULL, 0, full, full_size, full_used);
}

uint32_t emu_cupti_api(void) {
    if (!atomic_load(&C.on)) return 0;
    uint32_t corr = atomic_fetch_add(&C.next_corr, 1);
    if (kind_on(CUPTI_ACTIVITY_KIND_RUNTIME)) {
        uint64_t t = now_ns();
        CUpti_ActivityAPI r = {CUPTI_ACTIVITY_KIND_RUNTIME, 0, t, t, (uint32_t)getpid(),
                               (uint32_t)gettid(), corr, 0};
        put_record(&r, sizeof r);
    }
    if (kind_on(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION))
        for (int k = 0; k < 6; k++)
            if (ext_depth[k] > 0) {
                CUpti_ActivityExternalCorrelation r = {CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
                                                       (CUpti_ExternalCorrelationKind)k,
                                                       ext_stack[k][ext_depth[k] - 1], corr, 0};
                put_record(&r, sizeof r);
            }
    return corr;
}

uint64_t emu_cupti_now(void) { return atomic_load(&C.on) ? now_ns() : 0; }

/* The symbol of kernel `name`, one pointer per name for the run, as CUPTI's records
 * share one name pointer per kernel: mangled as a C++ kernel of no parameters unless
 * c_symbol. */
static const char *symbol_of(const char *name, int c_symbol) {
    static struct {
        const char *name;
        int c_symbol;
        char *symbol;
    } *seen;
    static size_t n_seen, cap_seen;
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    const char *found = NULL;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n_seen && !found; i++)
        if (seen[i].c_symbol == c_symbol && strcmp(seen[i].name, name) == 0) found = seen[i].symbol;
    if (!found) {
        size_t len = strlen(name) + 32;
        char *sym = malloc(len);
        if (n_seen == cap_seen) {
            cap_seen = cap_seen ? 2 * cap_seen : 64;
            void *grown = realloc(seen, cap_seen * sizeof(*seen));
            if (!grown) emu_fail("fake CUPTI: out of memory");
            seen = grown;
        }
        if (!sym) emu_fail("fake CUPTI: out of memory");
        if (c_symbol) snprintf(sym, len, "%s", name);
        else snprintf(sym, len, "_Z%zu%sv", strlen(name), name);
        seen[n_seen].name = strdup(name);
        if (!seen[n_seen].name) emu_fail("fake CUPTI: out of memory");
        seen[n_seen].c_symbol = c_symbol;
        seen[n_seen++].symbol = sym;
        found = sym;
    }
    pthread_mutex_unlock(&mu);
    return found;
}

void emu_cupti_work(emu_cupti_work_kind what, uint32_t corr, const char *name, int c_symbol,
                    uint64_t start_ns, uint64_t end_ns) {
    if (!corr || !atomic_load(&C.on)) return;
    if (what == EMU_CUPTI_KERNEL) {
        CUpti_ActivityKind k = kind_on(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) ? CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL
                             : kind_on(CUPTI_ACTIVITY_KIND_KERNEL)            ? CUPTI_ACTIVITY_KIND_KERNEL
                                                                              : CUPTI_ACTIVITY_KIND_INVALID;
        if (k == CUPTI_ACTIVITY_KIND_INVALID) return;
        CUpti_ActivityKernel4 r;
        memset(&r, 0, sizeof r);
        r.kind = k, r.start = start_ns, r.end = end_ns, r.correlationId = corr;
        r.name = symbol_of(name ? name : "unnamed", c_symbol);
        put_record(&r, sizeof r);
    } else {
        CUpti_ActivityKind k = what == EMU_CUPTI_MEMCPY ? CUPTI_ACTIVITY_KIND_MEMCPY : CUPTI_ACTIVITY_KIND_MEMSET;
        if (!kind_on(k)) return;
        CUpti_ActivityMemcpy r;
        memset(&r, 0, sizeof r);
        r.kind = k, r.start = start_ns, r.end = end_ns, r.correlationId = corr;
        put_record(&r, sizeof r);
    }
}

CUptiResult emu_cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                               CUpti_BuffersCallbackCompleteFunc complete) {
    if (!cupti_wanted()) return CUPTI_ERROR_NOT_INITIALIZED;
    if (!request || !complete) return CUPTI_ERROR_INVALID_PARAMETER;
    pthread_mutex_lock(&C.mu);
    C.request = request;
    C.complete = complete;
    pthread_mutex_unlock(&C.mu);
    atomic_store(&C.on, 1);
    return CUPTI_SUCCESS;
}

static int flushed; /* cuptiActivityFlushAll has run */

static void check_left_on(void) {
    if ((atomic_load(&C.kinds) || C.external_on) && !flushed)
        fprintf(stderr, "cuda_emu: CUPTI activity kinds left enabled (0x%x) and never flushed: "
                "their records pile up unread\n", atomic_load(&C.kinds));
}

CUptiResult emu_cuptiActivityEnable(CUpti_ActivityKind kind) {
    if (!atomic_load(&C.on)) return CUPTI_ERROR_NOT_INITIALIZED;
    static int registered;
    if (!registered++) atexit(check_left_on);
    if (kind == CUPTI_ACTIVITY_KIND_RUNTIME && runtime_fails()) return CUPTI_ERROR_INVALID_KIND;
    switch (kind) {
    case CUPTI_ACTIVITY_KIND_MEMCPY:
    case CUPTI_ACTIVITY_KIND_MEMSET:
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_DRIVER:
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        atomic_fetch_or(&C.kinds, 1u << kind);
        return CUPTI_SUCCESS;
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION:
        C.external_on = 1;
        return CUPTI_SUCCESS;
    default:
        return CUPTI_ERROR_INVALID_KIND;
    }
}

CUptiResult emu_cuptiActivityDisable(CUpti_ActivityKind kind) {
    if (!atomic_load(&C.on)) return CUPTI_ERROR_NOT_INITIALIZED;
    if (kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) C.external_on = 0;
    else if ((int)kind >= 0 && kind < 32) atomic_fetch_and(&C.kinds, ~(1u << kind));
    else return CUPTI_ERROR_INVALID_KIND;
    return CUPTI_SUCCESS;
}

CUptiResult emu_cuptiActivityFlushAll(uint32_t flag) {
    if (!atomic_load(&C.on)) return CUPTI_ERROR_NOT_INITIALIZED;
    flushed = 1;
    pthread_mutex_lock(&C.mu);
    uint8_t *b = C.buf;
    size_t size = C.size, used = C.used;
    C.buf = NULL;
    pthread_mutex_unlock(&C.mu);
    if (b) C.complete(NULL, 0, b, size, used);
    return CUPTI_SUCCESS;
}

CUptiResult emu_cuptiGetTimestamp(uint64_t *timestamp) {
    *timestamp = now_ns();
    return CUPTI_SUCCESS;
}

CUptiResult emu_cuptiActivityPushExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t id) {
    if ((int)kind < 0 || (int)kind >= 6 || kind == CUPTI_EXTERNAL_CORRELATION_KIND_INVALID)
        return CUPTI_ERROR_INVALID_PARAMETER;
    if (ext_depth[kind] == MAX_DEPTH) return CUPTI_ERROR_MAX_LIMIT_REACHED;
    ext_stack[kind][ext_depth[kind]++] = id;
    return CUPTI_SUCCESS;
}

CUptiResult emu_cuptiActivityPopExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t *lastId) {
    if ((int)kind < 0 || (int)kind >= 6 || ext_depth[kind] == 0) return CUPTI_ERROR_INVALID_PARAMETER;
    uint64_t id = ext_stack[kind][--ext_depth[kind]];
    if (lastId) *lastId = id;
    return CUPTI_SUCCESS;
}

static size_t record_size(CUpti_ActivityKind k) {
    switch (k) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: return sizeof(CUpti_ActivityKernel4);
    case CUPTI_ACTIVITY_KIND_MEMCPY:
    case CUPTI_ACTIVITY_KIND_MEMSET: return sizeof(CUpti_ActivityMemcpy);
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: return sizeof(CUpti_ActivityAPI);
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: return sizeof(CUpti_ActivityExternalCorrelation);
    default: return 0;
    }
}

/* *record NULL: the first record of the buffer; otherwise the one after *record. */
CUptiResult emu_cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, CUpti_Activity **record) {
    size_t off = 0;
    if (*record) {
        size_t here = (size_t)((uint8_t *)*record - buffer), bytes = record_size((*record)->kind);
        if ((uint8_t *)*record < buffer || here >= valid || bytes == 0) return CUPTI_ERROR_INVALID_PARAMETER;
        off = here + bytes;
    }
    if (off >= valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *record = (CUpti_Activity *)(buffer + off);
    return CUPTI_SUCCESS;
}

CUptiResult emu_cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t streamId, size_t *dropped) {
    pthread_mutex_lock(&C.mu);
    *dropped = C.dropped;
    C.dropped = 0;
    pthread_mutex_unlock(&C.mu);
    return CUPTI_SUCCESS;
}
