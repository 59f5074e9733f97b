/* Test tool, not part of the engine: a fake CUDA runtime (the host API of
 * cuda_runtime_api.h) on the CPU, so that the real host code of engine/cuda/ runs without
 * a GPU (gptc-train-emu, tests/test_cuda_fake_train.py). Kernel launches are
 * emu_runtime.c's; cuBLASLt and CUPTI are fake_cublaslt.c and fake_cupti.c.
 *
 * The model:
 *  - one device (GPTC_EMU_DEVICES=n for n; 0 makes cudaGetDeviceCount report none), an
 *    sm_90 with 2 multiprocessors (GPTC_EMU_SM), PCI bus id 0000:19:00.0 (where
 *    tests/fake_nvml.c has its device 0). The current device is per host thread, as in
 *    CUDA. GPTC_EMU_CC=75 (say) makes it a compute capability 7.5, for which, as the
 *    real build, it has no kernels (cudaFuncGetAttributes says so).
 *  - device memory is host heap memory: every cudaMalloc / cudaMallocHost block is its
 *    own malloc block (so that AddressSanitizer sees overruns), filled with 0xff bytes (a
 *    NaN as float and double: the GPU hands out garbage, and a read before a write shows).
 *    Blocks are registered, so that copies, memsets and cuBLASLt calls check that their
 *    device-side ranges lie inside one device or pinned block (the GPU cannot read plain
 *    host memory; with unified addressing it can read pinned memory), with the direction
 *    a copy claims. cudaHostGetDevicePointer is the identity on pinned memory.
 *  - a stream is a host thread running a FIFO of work (kernels, copies, sets, GEMMs,
 *    host functions, event records and waits), so streams run beside each other and
 *    beside the host, as on a GPU, and every ordering bug of the host code (a missing
 *    event wait, a buffer reused before its copy ran) can show. Kernels themselves run
 *    one at a time (emu_runtime.c), except kernels that wait for the host (the engine's
 *    wait_flag_kernel), which spin on their stream's thread as they would on an SM.
 *  - the NULL stream is the legacy stream, synchronous: work on it waits for the
 *    blocking streams (those created without cudaStreamNonBlocking), then runs on the
 *    calling thread. cudaStreamWaitEvent(NULL, e) therefore blocks the caller.
 *  - copies follow CUDA's rules for pageable memory: cudaMemcpyAsync from pageable host
 *    memory takes a snapshot of the source before it returns; to pageable host memory it
 *    returns only once the copy is done. Pinned memory is copied in stream order.
 *  - events count their records (a wait or query refers to the latest record at the
 *    time of the call) and keep the host clock (CLOCK_MONOTONIC) when the latest record
 *    completed: cudaEventElapsedTime is the difference, and is refused for events made
 *    with cudaEventDisableTiming.
 *  - calls that synchronise the whole device in CUDA (cudaDeviceSynchronize, cudaFree,
 *    cudaFreeHost) wait for every stream, so a host function that makes one while a
 *    stream waits for it deadlocks here as it would on a GPU.
 *  - lazy module loading (CUDA's default since 12.2): the first launch of each kernel, and
 *    cuBLASLt's first matmul of each kind, waits for every stream, as loading a module may
 *    wait for the device to go idle; a kernel that spins on its stream until a peer rank
 *    moves can then hold the launch for ever. CUDA_MODULE_LOADING = EAGER, as the
 *    process had it at its first CUDA call, loads everything at start: no such wait.
 *  - GPTC_EMU_JITTER_US=n delays each piece of a stream's work by a random pause of up to
 *    n us, to vary how streams and the host interleave (a stress test for ordering bugs).
 *  - a host wait (stream, event or device synchronisation) that lasts GPTC_EMU_HANG_S
 *    seconds (default 100) is taken for a deadlock: every stream and what it is doing
 *    is printed, and the process aborts. A stream synchronising itself from its own
 *    work is reported at once.
 * Errors set the calling thread's last error, as in CUDA; a refused call also says why
 * on stderr ("cuda_emu: ..."), which the engine's one-line CUDA errors do not.
 * cudaStreamDestroy waits for the stream's work (CUDA returns at once and releases it
 * later); nothing in the engine can tell. Stream priorities are kept, not applied.
 * Device memory the program never frees stays reachable from the registry, so
 * LeakSanitizer does not report it (a GPU frees it at exit).
 * What it cannot show: races between kernels of different streams (they run one at a
 * time), anything that depends on the GPU's speed relative to the host (the emulated
 * kernels are thousands of times slower, so the host is almost always far ahead of the
 * streams), and what only the real driver does. Not emulated: graphs, peer access,
 * managed memory, several devices that behave differently, stream capture. */
#define _GNU_SOURCE /* pthread_setname_np */

#include "emu_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#if defined(__SANITIZE_THREAD__)
#define EMU_FAKE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EMU_FAKE_TSAN 1
#endif
#endif
#ifdef EMU_FAKE_TSAN
/* TSan's dynamic annotations (exported by its runtime, declared in no header) */
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);
#endif

/* ------------------------------------------------------------------ errors, clock */

static __thread cudaError_t last_error;

cudaError_t emu_set_error(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
    return e;
}

cudaError_t emu_cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t emu_cudaPeekAtLastError(void) { return last_error; }

const char *emu_cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorNoKernelImageForDevice: return "cudaErrorNoKernelImageForDevice";
    default: return "cudaErrorUnknown";
    }
}

const char *emu_cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNoKernelImageForDevice: return "no kernel image is available for execution on the device";
    default: return "unknown error";
    }
}

double emu_now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* Complains on stderr (the engine turns the error into its own one-line message, which
 * does not say what was wrong with the arguments) and returns e as the call's error. */
static cudaError_t refuse(cudaError_t e, const char *call, const char *why) {
    fprintf(stderr, "cuda_emu: %s: %s\n", call, why);
    fflush(stderr);
    return emu_set_error(e);
}

/* ------------------------------------------------------------------ devices */

static __thread int current_device;

static int device_count(void) {
    const char *e = getenv("GPTC_EMU_DEVICES");
    return e && *e ? atoi(e) : 1;
}

/* compute capability x 10: 90, or GPTC_EMU_CC */
static int compute_capability(void) {
    const char *e = getenv("GPTC_EMU_CC");
    return e && atoi(e) > 0 ? atoi(e) : 90;
}

cudaError_t emu_func_get_attributes(cudaFuncAttributes *attr, const void *kernel) {
    if (!attr || !kernel) return refuse(cudaErrorInvalidValue, "cudaFuncGetAttributes", "a NULL argument");
    memset(attr, 0, sizeof *attr);
    /* the kernels are built for sm_80 and newer (CMakeLists.txt) */
    if (compute_capability() < 80) return emu_set_error(cudaErrorNoKernelImageForDevice);
    attr->maxThreadsPerBlock = 1024;
    attr->binaryVersion = attr->ptxVersion = compute_capability();
    return cudaSuccess;
}

/* ------------------------------------------------------------------ module loading */

static void drain_streams(int blocking_only, const char *what);

static int lazy_loading;
static pthread_once_t loading_read = PTHREAD_ONCE_INIT;
static void read_loading(void) {
    const char *v = getenv("CUDA_MODULE_LOADING");
    lazy_loading = !(v && strcmp(v, "EAGER") == 0);
}

/* the driver reads the variable once, when CUDA starts: so does the fake, at its first
 * device call */
static void module_loading_start(void) { pthread_once(&loading_read, read_loading); }

enum { MAX_LOADED = 1024 };
static uint64_t loaded[MAX_LOADED];
static int n_loaded;
static pthread_mutex_t loaded_mu = PTHREAD_MUTEX_INITIALIZER;

void emu_module_first_use(uint64_t key, const char *name) {
    module_loading_start();
    if (!lazy_loading) return;
    pthread_mutex_lock(&loaded_mu);
    int seen = 0;
    for (int i = 0; i < n_loaded && !seen; i++) seen = loaded[i] == key;
    pthread_mutex_unlock(&loaded_mu);
    if (seen) return;
    char what[200];
    snprintf(what, sizeof what, "the first launch of %s (lazy module loading waits for the "
             "device; CUDA_MODULE_LOADING = EAGER loads it at start)", name);
    drain_streams(0, what);
    /* loaded once the wait is over: a second thread's launch meanwhile waits too, as it
     * would for the loader */
    pthread_mutex_lock(&loaded_mu);
    seen = 0;
    for (int i = 0; i < n_loaded && !seen; i++) seen = loaded[i] == key;
    if (!seen && n_loaded < MAX_LOADED) loaded[n_loaded++] = key;
    pthread_mutex_unlock(&loaded_mu);
}

static int sm_count(void) {
    const char *e = getenv("GPTC_EMU_SM");
    return e && atoi(e) > 0 ? atoi(e) : 2;
}

cudaError_t emu_cudaGetDeviceCount(int *count) {
    module_loading_start();
    *count = device_count();
    return *count > 0 ? cudaSuccess : emu_set_error(cudaErrorNoDevice);
}

cudaError_t emu_cudaSetDevice(int device) {
    module_loading_start();
    if (device < 0 || device >= device_count()) return emu_set_error(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

cudaError_t emu_cudaGetDevice(int *device) {
    *device = current_device;
    return cudaSuccess;
}

cudaError_t emu_cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device) {
    if (device < 0 || device >= device_count()) return emu_set_error(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = sm_count(); break;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 * 1024; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = emu_smem_optin(); break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = emu_smem_optin() + 1024; break;
    /* small, so that the op tests' attention splits its (b, h) pairs into groups of a
     * few (attention_group), remainders included */
    case cudaDevAttrL2CacheSize: *value = 64 * 1024; break;
    case cudaDevAttrComputeCapabilityMajor: *value = compute_capability() / 10; break;
    case cudaDevAttrComputeCapabilityMinor: *value = compute_capability() % 10; break;
    default: return emu_set_error(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t emu_cudaGetDeviceProperties(cudaDeviceProp *prop, int device) {
    if (device < 0 || device >= device_count()) return emu_set_error(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "cuda_emu (CPU emulator)");
    prop->totalGlobalMem = (size_t)80 << 30;
    prop->sharedMemPerBlock = 48 * 1024;
    prop->sharedMemPerBlockOptin = 227 * 1024;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->multiProcessorCount = sm_count();
    prop->major = compute_capability() / 10;
    prop->minor = compute_capability() % 10;
    return cudaSuccess;
}

cudaError_t emu_cudaDeviceGetPCIBusId(char *pciBusId, int len, int device) {
    if (device < 0 || device >= device_count()) return emu_set_error(cudaErrorInvalidDevice);
    if (len < 13) return emu_set_error(cudaErrorInvalidValue);
    snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", 0x19 + device); /* fake_nvml.c's device 0 */
    return cudaSuccess;
}

/* an H100's range: 0 is the lowest priority, -5 the highest */
enum { PRIORITY_LEAST = 0, PRIORITY_GREATEST = -5 };

cudaError_t emu_cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority) {
    if (leastPriority) *leastPriority = PRIORITY_LEAST;
    if (greatestPriority) *greatestPriority = PRIORITY_GREATEST;
    return cudaSuccess;
}

/* ------------------------------------------------------------------ memory registry */

typedef struct {
    char *p;
    size_t bytes;
    emu_mem_class kind; /* EMU_MEM_DEVICE or EMU_MEM_PINNED */
} block;

static struct {
    pthread_mutex_t mu;
    block *b;
    size_t n, cap;
} mem = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int mem_add(void *p, size_t bytes, emu_mem_class kind) {
    pthread_mutex_lock(&mem.mu);
    if (mem.n == mem.cap) {
        size_t cap = mem.cap ? 2 * mem.cap : 256;
        block *b = realloc(mem.b, cap * sizeof *b);
        if (!b) {
            pthread_mutex_unlock(&mem.mu);
            return -1;
        }
        mem.b = b;
        mem.cap = cap;
    }
    mem.b[mem.n++] = (block){p, bytes, kind};
    pthread_mutex_unlock(&mem.mu);
    return 0;
}

/* Removes the block that starts at p if it is of this kind; -1 when there is none. */
static int mem_remove(void *p, emu_mem_class kind) {
    int rc = -1;
    pthread_mutex_lock(&mem.mu);
    for (size_t i = 0; i < mem.n; i++)
        if (mem.b[i].p == p && mem.b[i].kind == kind) {
            mem.b[i] = mem.b[--mem.n];
            rc = 0;
            break;
        }
    pthread_mutex_unlock(&mem.mu);
    return rc;
}

emu_mem_class emu_mem_classify(const void *p, size_t bytes) {
    const char *c = p;
    emu_mem_class k = EMU_MEM_PAGEABLE;
    pthread_mutex_lock(&mem.mu);
    for (size_t i = 0; i < mem.n; i++) {
        const block *b = &mem.b[i];
        if (c >= b->p && c < b->p + (b->bytes ? b->bytes : 1)) {
            k = bytes <= (size_t)(b->p + b->bytes - c) ? b->kind : EMU_MEM_OVERRUN;
            break;
        }
    }
    pthread_mutex_unlock(&mem.mu);
    return k;
}

int emu_check_device_range(const void *p, size_t bytes, const char *what, char *why, size_t n) {
    if (bytes == 0) return 0;
    emu_mem_class k = emu_mem_classify(p, bytes);
    if (k == EMU_MEM_DEVICE || k == EMU_MEM_PINNED) return 0;
    if (k == EMU_MEM_OVERRUN)
        snprintf(why, n, "%s [%p, +%zu bytes) runs past the end of its allocation", what, p, bytes);
    else
        snprintf(why, n, "%s %p is neither device memory nor pinned host memory: the GPU cannot "
                 "access it", what, p);
    return -1;
}

/* Asks for transparent huge pages under the 2 MiB-aligned middle of [p, p + bytes), so
 * that filling a large block takes a page fault per 2 MiB, not per 4 KiB: the engine's
 * 32 MiB GEMM workspace cost every emulated process 8192 faults, 0.13 to 0.19 s here
 * (9 to 70 ms with them). Where the kernel's THP setting is "never" it does nothing. */
static void want_huge_pages(void *p, size_t bytes) {
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t start = ((uintptr_t)p + huge - 1) & ~(huge - 1);
    uintptr_t end = ((uintptr_t)p + bytes) & ~(huge - 1);
    if (end > start) (void)madvise((void *)start, end - start, MADV_HUGEPAGE);
}

/* A block of its own, filled with 0xff bytes (NaN) like the garbage a GPU hands out, on
 * 256 bytes as cudaMalloc's and cudaHostAlloc's are (so that what depends on a pointer's
 * alignment, such as a cuBLASLt plan, is the same in every run); its exact size, so that
 * ASan sees an access past the end. Under ThreadSanitizer the fill is no access of the
 * program's (it is the allocation's, which no other thread can reach before it returns):
 * TSan does not see it, where recording it took half a second for the GEMM workspace. */
static void *poisoned_block(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 256, bytes ? bytes : 1) != 0) return NULL;
    want_huge_pages(p, bytes);
#ifdef EMU_FAKE_TSAN
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
#endif
    memset(p, 0xff, bytes);
#ifdef EMU_FAKE_TSAN
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
#endif
    return p;
}

/* ------------------------------------------------------------------ streams, events */

enum { STREAM_MAGIC = 0x57524541, EVENT_MAGIC = 0x45564e54 };

typedef enum { ITEM_FUNC, ITEM_RECORD, ITEM_WAIT } item_kind;

struct CUevent_st {
    unsigned int magic;
    unsigned int flags;
    pthread_mutex_t mu;
    pthread_cond_t done; /* broadcast whenever completed grows */
    uint64_t recorded;   /* number of the latest record */
    uint64_t completed;  /* highest record number reached by its stream */
    double stamp_ms;     /* host clock when the highest record completed */
    int refs;            /* the owner (until destroyed) plus every queued item */
};

typedef struct item {
    item_kind kind;
    void (*fn)(void *);
    void *arg;
    const char *what;
    struct CUevent_st *event;
    uint64_t gen;
    struct item *next;
} item;

struct CUstream_st {
    unsigned int magic;
    unsigned int flags;
    int priority;
    int id; /* for messages */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work; /* an item arrived, or stop was set */
    pthread_cond_t idle; /* finished grew */
    item *head, *tail;
    uint64_t pushed, finished;
    const char *running; /* what the thread is doing now (NULL: idle) */
    int stop;
    struct CUstream_st *next_live;
};

/* the live streams, for device synchronisation and hang reports */
static pthread_mutex_t streams_mu = PTHREAD_MUTEX_INITIALIZER;
static struct CUstream_st *streams;
static int next_stream_id = 1;
static __thread struct CUstream_st *self_stream; /* the stream whose thread this is */

static double hang_ms(void) {
    const char *e = getenv("GPTC_EMU_HANG_S");
    return (e && atof(e) > 0 ? atof(e) : 100.0) * 1e3;
}

static void cond_init(pthread_cond_t *c) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
}

/* What every stream is doing; read without locks (the process is about to abort). */
static void report_hang(const char *what, double waited_ms) {
    fprintf(stderr, "cuda_emu: %s has waited %.0f s: a deadlock (GPTC_EMU_HANG_S sets the "
            "limit). Streams:\n", what, waited_ms / 1e3);
    for (struct CUstream_st *s = streams; s; s = s->next_live)
        fprintf(stderr, "cuda_emu:   stream %d (%s, priority %d): %llu item(s) pending, %s%s\n",
                s->id, s->flags & cudaStreamNonBlocking ? "non-blocking" : "blocking",
                s->priority, (unsigned long long)(s->pushed - s->finished),
                s->running ? "running: " : "idle", s->running ? s->running : "");
    emu_fail("deadlock");
}

/* One wait on c, at most a second; reports a hang once the whole wait (since start_ms)
 * exceeds the limit. Called with m held. */
static void wait_a_while(pthread_cond_t *c, pthread_mutex_t *m, double start_ms, const char *what) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += 1;
    pthread_cond_timedwait(c, m, &t);
    double waited = emu_now_ms() - start_ms;
    if (waited > hang_ms()) {
        pthread_mutex_unlock(m);
        report_hang(what, waited);
    }
}

/* -------- events */

static void event_ref(struct CUevent_st *e) {
    pthread_mutex_lock(&e->mu);
    e->refs++;
    pthread_mutex_unlock(&e->mu);
}

static void event_unref(struct CUevent_st *e) {
    pthread_mutex_lock(&e->mu);
    int left = --e->refs;
    pthread_mutex_unlock(&e->mu);
    if (left) return;
    e->magic = 0;
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->done);
    free(e);
}

static int event_valid(cudaEvent_t e) { return e && e->magic == EVENT_MAGIC; }

static void event_complete(struct CUevent_st *e, uint64_t gen) {
    double now = emu_now_ms();
    pthread_mutex_lock(&e->mu);
    if (gen > e->completed) {
        e->completed = gen;
        e->stamp_ms = now;
    }
    pthread_cond_broadcast(&e->done);
    pthread_mutex_unlock(&e->mu);
}

/* Waits until record gen of e completed; a host wait (may_hang) reports deadlocks. */
static void event_wait_for(struct CUevent_st *e, uint64_t gen, const char *what) {
    double start = emu_now_ms();
    pthread_mutex_lock(&e->mu);
    while (e->completed < gen) {
        if (what) wait_a_while(&e->done, &e->mu, start, what);
        else pthread_cond_wait(&e->done, &e->mu);
    }
    pthread_mutex_unlock(&e->mu);
}

cudaError_t emu_cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned int flags) {
    if (flags & ~(unsigned int)(cudaEventBlockingSync | cudaEventDisableTiming | 0x04 /* interprocess */))
        return emu_set_error(cudaErrorInvalidValue);
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e) return emu_set_error(cudaErrorMemoryAllocation);
    e->magic = EVENT_MAGIC;
    e->flags = flags;
    pthread_mutex_init(&e->mu, NULL);
    cond_init(&e->done);
    e->refs = 1;
    *ev = e;
    return cudaSuccess;
}

cudaError_t emu_cudaEventCreate(cudaEvent_t *ev) { return emu_cudaEventCreateWithFlags(ev, 0); }

/* CUDA lets an event go with records or waits still queued: they hold references. */
cudaError_t emu_cudaEventDestroy(cudaEvent_t e) {
    if (!event_valid(e)) return refuse(cudaErrorInvalidResourceHandle, "cudaEventDestroy", "not a live event");
    e->magic = 0xdead; /* further use of the handle is an error, not a crash */
    event_unref(e);
    return cudaSuccess;
}

cudaError_t emu_cudaEventQuery(cudaEvent_t e) {
    if (!event_valid(e)) return refuse(cudaErrorInvalidResourceHandle, "cudaEventQuery", "not a live event");
    pthread_mutex_lock(&e->mu);
    int done = e->completed >= e->recorded;
    pthread_mutex_unlock(&e->mu);
    return done ? cudaSuccess : cudaErrorNotReady; /* not ready is not recorded as an error */
}

cudaError_t emu_cudaEventSynchronize(cudaEvent_t e) {
    if (!event_valid(e))
        return refuse(cudaErrorInvalidResourceHandle, "cudaEventSynchronize", "not a live event");
    pthread_mutex_lock(&e->mu);
    uint64_t gen = e->recorded;
    pthread_mutex_unlock(&e->mu);
    event_wait_for(e, gen, "cudaEventSynchronize");
    return cudaSuccess;
}

cudaError_t emu_cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!event_valid(start) || !event_valid(end))
        return refuse(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime", "not a live event");
    if ((start->flags | end->flags) & cudaEventDisableTiming)
        return refuse(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime",
                      "an event made with cudaEventDisableTiming");
    double t[2];
    cudaEvent_t ev[2] = {start, end};
    for (int i = 0; i < 2; i++) {
        pthread_mutex_lock(&ev[i]->mu);
        uint64_t rec = ev[i]->recorded, done = ev[i]->completed;
        t[i] = ev[i]->stamp_ms;
        pthread_mutex_unlock(&ev[i]->mu);
        if (rec == 0)
            return refuse(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime",
                          "an event that was never recorded");
        if (done < rec) return emu_set_error(cudaErrorNotReady);
    }
    *ms = (float)(t[1] - t[0]);
    return cudaSuccess;
}

/* -------- streams */

static void run_item(item *it) {
    switch (it->kind) {
    case ITEM_FUNC: it->fn(it->arg); break;
    case ITEM_RECORD:
        event_complete(it->event, it->gen);
        event_unref(it->event);
        break;
    case ITEM_WAIT:
        event_wait_for(it->event, it->gen, NULL);
        event_unref(it->event);
        break;
    }
}

/* GPTC_EMU_JITTER_US=n: each piece of a stream's work starts after a random pause of up
 * to n microseconds, so that the streams and the host interleave differently from run to
 * run and an ordering bug (a missing event wait) gets its chance to show. */
static long jitter_us(void) {
    const char *e = getenv("GPTC_EMU_JITTER_US");
    return e && atol(e) > 0 ? atol(e) : 0;
}

static void *stream_main(void *arg) {
    struct CUstream_st *s = arg;
    self_stream = s;
    long jitter = jitter_us();
    unsigned int seed = (unsigned int)(s->id * 2654435761u) ^ (unsigned int)time(NULL);
    char name[16];
    snprintf(name, sizeof name, "emu-stream-%d", s->id);
    pthread_setname_np(pthread_self(), name);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->work, &s->mu);
        if (!s->head) break;
        item *it = s->head;
        s->head = it->next;
        if (!s->head) s->tail = NULL;
        s->running = it->what;
        pthread_mutex_unlock(&s->mu);
        if (jitter) {
            struct timespec t = {0, 1000L * (long)(rand_r(&seed) % (unsigned int)jitter)};
            nanosleep(&t, NULL);
        }
        run_item(it);
        free(it);
        pthread_mutex_lock(&s->mu);
        s->running = NULL;
        s->finished++;
        pthread_cond_broadcast(&s->idle);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void enqueue(struct CUstream_st *s, item it) {
    item *copy = malloc(sizeof *copy);
    if (!copy) emu_fail("out of memory for a stream's work");
    *copy = it;
    copy->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = copy;
    else s->head = copy;
    s->tail = copy;
    s->pushed++;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
}

/* Waits for the work enqueued on s before the call. */
static void stream_drain(struct CUstream_st *s, const char *what) {
    if (s == self_stream) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s of stream %d from that stream's own work: it would wait "
                 "for itself forever", what, s->id);
        emu_fail(msg);
    }
    double start = emu_now_ms();
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->pushed;
    while (s->finished < target) wait_a_while(&s->idle, &s->mu, start, what);
    pthread_mutex_unlock(&s->mu);
}

/* the legacy stream waits for every blocking stream; every stream for the device */
static void drain_streams(int blocking_only, const char *what) {
    pthread_mutex_lock(&streams_mu);
    for (struct CUstream_st *s = streams; s; s = s->next_live)
        if (!blocking_only || !(s->flags & cudaStreamNonBlocking)) stream_drain(s, what);
    pthread_mutex_unlock(&streams_mu);
}

int emu_stream_valid(cudaStream_t s) { return !s || s->magic == STREAM_MAGIC; }

void emu_stream_run(cudaStream_t s, void (*fn)(void *), void *arg, const char *what) {
    if (!s) {
        drain_streams(1, "the legacy stream");
        fn(arg);
        return;
    }
    enqueue(s, (item){.kind = ITEM_FUNC, .fn = fn, .arg = arg, .what = what});
}

cudaError_t emu_cudaStreamCreateWithPriority(cudaStream_t *out, unsigned int flags, int priority) {
    if (flags & ~(unsigned int)cudaStreamNonBlocking) return emu_set_error(cudaErrorInvalidValue);
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s) return emu_set_error(cudaErrorMemoryAllocation);
    s->magic = STREAM_MAGIC;
    s->flags = flags;
    /* CUDA clamps a priority outside the range */
    s->priority = priority < PRIORITY_GREATEST ? PRIORITY_GREATEST
                : priority > PRIORITY_LEAST    ? PRIORITY_LEAST
                                               : priority;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    cond_init(&s->idle);
    pthread_mutex_lock(&streams_mu);
    s->id = next_stream_id++;
    if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
        pthread_mutex_unlock(&streams_mu);
        free(s);
        return emu_set_error(cudaErrorMemoryAllocation);
    }
    s->next_live = streams;
    streams = s;
    pthread_mutex_unlock(&streams_mu);
    *out = s;
    return cudaSuccess;
}

cudaError_t emu_cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    return emu_cudaStreamCreateWithPriority(s, flags, PRIORITY_LEAST);
}

cudaError_t emu_cudaStreamCreate(cudaStream_t *s) {
    return emu_cudaStreamCreateWithPriority(s, cudaStreamDefault, PRIORITY_LEAST);
}

cudaError_t emu_cudaStreamDestroy(cudaStream_t s) {
    if (!s || s->magic != STREAM_MAGIC)
        return refuse(cudaErrorInvalidResourceHandle, "cudaStreamDestroy", "not a live stream");
    stream_drain(s, "cudaStreamDestroy");
    pthread_mutex_lock(&streams_mu);
    for (struct CUstream_st **p = &streams; *p; p = &(*p)->next_live)
        if (*p == s) {
            *p = s->next_live;
            break;
        }
    pthread_mutex_unlock(&streams_mu);
    s->magic = 0;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->idle);
    free(s);
    return cudaSuccess;
}

cudaError_t emu_cudaStreamSynchronize(cudaStream_t s) {
    if (!emu_stream_valid(s))
        return refuse(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize", "not a live stream");
    if (!s) drain_streams(1, "cudaStreamSynchronize (legacy stream)");
    else stream_drain(s, "cudaStreamSynchronize");
    return cudaSuccess;
}

cudaError_t emu_cudaStreamQuery(cudaStream_t s) {
    if (!emu_stream_valid(s))
        return refuse(cudaErrorInvalidResourceHandle, "cudaStreamQuery", "not a live stream");
    if (!s) return cudaSuccess;
    pthread_mutex_lock(&s->mu);
    int idle = s->finished == s->pushed;
    pthread_mutex_unlock(&s->mu);
    return idle ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t emu_cudaDeviceSynchronize(void) {
    drain_streams(0, "cudaDeviceSynchronize");
    return cudaSuccess;
}

cudaError_t emu_cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!event_valid(e)) return refuse(cudaErrorInvalidResourceHandle, "cudaEventRecord", "not a live event");
    if (!emu_stream_valid(s))
        return refuse(cudaErrorInvalidResourceHandle, "cudaEventRecord", "not a live stream");
    pthread_mutex_lock(&e->mu);
    uint64_t gen = ++e->recorded;
    pthread_mutex_unlock(&e->mu);
    if (!s) {
        drain_streams(1, "cudaEventRecord (legacy stream)");
        event_complete(e, gen);
        return cudaSuccess;
    }
    event_ref(e);
    enqueue(s, (item){.kind = ITEM_RECORD, .event = e, .gen = gen, .what = "event record"});
    return cudaSuccess;
}

cudaError_t emu_cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    if (!event_valid(e))
        return refuse(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent", "not a live event");
    if (!emu_stream_valid(s))
        return refuse(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent", "not a live stream");
    if (flags != 0) return emu_set_error(cudaErrorInvalidValue);
    pthread_mutex_lock(&e->mu);
    uint64_t gen = e->recorded;
    pthread_mutex_unlock(&e->mu);
    if (gen == 0) return cudaSuccess; /* never recorded: nothing to wait for */
    if (!s) {
        event_wait_for(e, gen, "cudaStreamWaitEvent (legacy stream)");
        return cudaSuccess;
    }
    event_ref(e);
    enqueue(s, (item){.kind = ITEM_WAIT, .event = e, .gen = gen, .what = "event wait"});
    return cudaSuccess;
}

typedef struct {
    cudaHostFn_t fn;
    void *arg;
} host_call;

static void run_host_call(void *arg) {
    host_call c = *(host_call *)arg;
    free(arg);
    c.fn(c.arg);
}

cudaError_t emu_cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *userData) {
    if (!emu_stream_valid(s))
        return refuse(cudaErrorInvalidResourceHandle, "cudaLaunchHostFunc", "not a live stream");
    host_call *c = malloc(sizeof *c);
    if (!c) return emu_set_error(cudaErrorMemoryAllocation);
    *c = (host_call){fn, userData};
    emu_stream_run(s, run_host_call, c, "host function (cudaLaunchHostFunc)");
    return cudaSuccess;
}

/* ------------------------------------------------------------------ allocation */

cudaError_t emu_cudaMalloc(void **p, size_t bytes) {
    *p = NULL;
    if (bytes == 0) return cudaSuccess;
    void *q = poisoned_block(bytes);
    if (!q || mem_add(q, bytes, EMU_MEM_DEVICE) != 0) {
        free(q);
        return emu_set_error(cudaErrorMemoryAllocation);
    }
    *p = q;
    return cudaSuccess;
}

cudaError_t emu_cudaFree(void *p) {
    if (!p) return cudaSuccess;
    drain_streams(0, "cudaFree (it synchronises the device)");
    if (mem_remove(p, EMU_MEM_DEVICE) != 0)
        return refuse(cudaErrorInvalidValue, "cudaFree", "not the start of a live cudaMalloc block");
    free(p);
    return cudaSuccess;
}

/* Stream-ordered allocation: the block is usable by work queued on s from now on (it is
 * made at once here) and goes when s reaches the free, without waiting for the device as
 * cudaFree does. */
cudaError_t emu_cudaMallocAsync(void **p, size_t bytes, cudaStream_t s) {
    if (!emu_stream_valid(s))
        return refuse(cudaErrorInvalidValue, "cudaMallocAsync", "not a live stream");
    return emu_cudaMalloc(p, bytes);
}

static void run_free(void *p) {
    if (mem_remove(p, EMU_MEM_DEVICE) != 0)
        emu_fail("cudaFreeAsync: not the start of a live cudaMalloc block");
    free(p);
}

cudaError_t emu_cudaFreeAsync(void *p, cudaStream_t s) {
    if (!emu_stream_valid(s))
        return refuse(cudaErrorInvalidValue, "cudaFreeAsync", "not a live stream");
    if (p) emu_stream_run(s, run_free, p, "cudaFreeAsync");
    return cudaSuccess;
}

cudaError_t emu_cudaHostAlloc(void **p, size_t bytes, unsigned int flags) {
    *p = NULL;
    if (flags & ~(unsigned int)(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined))
        return emu_set_error(cudaErrorInvalidValue);
    void *q = poisoned_block(bytes);
    if (!q || mem_add(q, bytes, EMU_MEM_PINNED) != 0) {
        free(q);
        return emu_set_error(cudaErrorMemoryAllocation);
    }
    *p = q;
    return cudaSuccess;
}

cudaError_t emu_cudaMallocHost(void **p, size_t bytes) {
    return emu_cudaHostAlloc(p, bytes, cudaHostAllocDefault);
}

cudaError_t emu_cudaFreeHost(void *p) {
    if (!p) return cudaSuccess;
    drain_streams(0, "cudaFreeHost (it synchronises the device)");
    if (mem_remove(p, EMU_MEM_PINNED) != 0)
        return refuse(cudaErrorInvalidValue, "cudaFreeHost", "not the start of a live pinned block");
    free(p);
    return cudaSuccess;
}

/* With unified addressing every pinned block is mapped, at the same address. */
cudaError_t emu_cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags) {
    if (flags != 0) return emu_set_error(cudaErrorInvalidValue);
    if (emu_mem_classify(pHost, 1) != EMU_MEM_PINNED)
        return refuse(cudaErrorInvalidValue, "cudaHostGetDevicePointer", "not pinned host memory");
    *pDevice = pHost;
    return cudaSuccess;
}

/* ------------------------------------------------------------------ copies and sets */

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
    void *owned;   /* a snapshot of the source, freed after the copy */
    uint32_t corr; /* CUPTI's correlation id */
} copy_job;

static void run_copy(void *arg) {
    copy_job *j = arg;
    uint64_t t0 = emu_cupti_now();
    memcpy(j->dst, j->src, j->bytes);
    emu_cupti_work(EMU_CUPTI_MEMCPY, j->corr, NULL, 0, t0, emu_cupti_now());
    free(j->owned);
    free(j);
}

typedef struct {
    void *dst;
    int value;
    size_t bytes;
    uint32_t corr;
} set_job;

static void run_set(void *arg) {
    set_job *j = arg;
    uint64_t t0 = emu_cupti_now();
    memset(j->dst, j->value, j->bytes);
    emu_cupti_work(EMU_CUPTI_MEMSET, j->corr, NULL, 0, t0, emu_cupti_now());
    free(j);
}

static int is_device_side(emu_mem_class k) { return k == EMU_MEM_DEVICE || k == EMU_MEM_PINNED; }

/* Checks a copy against the direction it claims; sets *pageable_src / *pageable_dst when
 * that side is plain host memory. 0, or an error (already reported). */
static cudaError_t check_copy(const char *call, void *dst, const void *src, size_t bytes,
                              cudaMemcpyKind kind, int *pageable_src, int *pageable_dst) {
    char why[256];
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
        return refuse(cudaErrorInvalidMemcpyDirection, call, "not a cudaMemcpyKind");
    emu_mem_class ks = emu_mem_classify(src, bytes), kd = emu_mem_classify(dst, bytes);
    if (bytes && (ks == EMU_MEM_OVERRUN || kd == EMU_MEM_OVERRUN)) {
        snprintf(why, sizeof why, "%zu bytes from %p to %p: the %s runs past the end of its "
                 "allocation", bytes, src, dst, ks == EMU_MEM_OVERRUN ? "source" : "destination");
        return refuse(cudaErrorInvalidValue, call, why);
    }
    int src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    int dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    int src_host = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost;
    int dst_host = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost;
    const char *bad = NULL;
    if (bytes && src_dev && !is_device_side(ks)) bad = "the source is not device memory";
    else if (bytes && dst_dev && !is_device_side(kd)) bad = "the destination is not device memory";
    else if (bytes && src_host && ks == EMU_MEM_DEVICE) bad = "the source is device memory";
    else if (bytes && dst_host && kd == EMU_MEM_DEVICE) bad = "the destination is device memory";
    if (bad) {
        snprintf(why, sizeof why, "%zu bytes from %p to %p: %s, but the kind says otherwise",
                 bytes, src, dst, bad);
        return refuse(cudaErrorInvalidValue, call, why);
    }
    *pageable_src = ks == EMU_MEM_PAGEABLE;
    *pageable_dst = kd == EMU_MEM_PAGEABLE;
    return cudaSuccess;
}

cudaError_t emu_cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                                cudaStream_t s) {
    if (!emu_stream_valid(s))
        return refuse(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync", "not a live stream");
    int ps = 0, pd = 0;
    cudaError_t rc = check_copy("cudaMemcpyAsync", dst, src, bytes, kind, &ps, &pd);
    if (rc != cudaSuccess || bytes == 0) return rc;
    copy_job *j = malloc(sizeof *j);
    if (!j) return emu_set_error(cudaErrorMemoryAllocation);
    *j = (copy_job){dst, src, bytes, NULL, emu_cupti_api()};
    if (s && pd) {
        /* to pageable memory: returns once the copy is done */
        emu_stream_run(s, run_copy, j, "memcpy to pageable host memory");
        stream_drain(s, "cudaMemcpyAsync to pageable host memory");
        return cudaSuccess;
    }
    if (s && ps) {
        /* from pageable memory: the source is staged before the call returns */
        j->owned = malloc(bytes);
        if (!j->owned) {
            free(j);
            return emu_set_error(cudaErrorMemoryAllocation);
        }
        memcpy(j->owned, src, bytes);
        j->src = j->owned;
    }
    emu_stream_run(s, run_copy, j, "memcpy");
    return cudaSuccess;
}

cudaError_t emu_cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    return emu_cudaMemcpyAsync(dst, src, bytes, kind, NULL);
}

cudaError_t emu_cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s) {
    char why[256];
    if (!emu_stream_valid(s))
        return refuse(cudaErrorInvalidResourceHandle, "cudaMemsetAsync", "not a live stream");
    if (emu_check_device_range(dst, bytes, "destination", why, sizeof why) != 0)
        return refuse(cudaErrorInvalidValue, "cudaMemsetAsync", why);
    if (bytes == 0) return cudaSuccess;
    set_job *j = malloc(sizeof *j);
    if (!j) return emu_set_error(cudaErrorMemoryAllocation);
    *j = (set_job){dst, value, bytes, emu_cupti_api()};
    emu_stream_run(s, run_set, j, "memset");
    return cudaSuccess;
}

cudaError_t emu_cudaMemset(void *dst, int value, size_t bytes) {
    return emu_cudaMemsetAsync(dst, value, bytes, NULL);
}
