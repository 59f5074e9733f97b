/* Test tool, not part of the engine: a CPU emulator of the CUDA execution model, just
 * enough to run the kernels of engine/cuda/ (the .cu files) without a GPU, so that the
 * test suite checks them on every run (tests/cuda_emu/test_cuda_emu.c).
 *
 * How: xform.py rewrites each .cu file's launches (kernel<<<...>>>(args)) and
 * `extern __shared__` arrays into plain C++, cuda_runtime.h supplies the built-ins, and
 * this file runs a launch: one host thread per CUDA thread of a block (so every CUDA
 * thread has its own registers and stack, as on the GPU), all blocks of the grid in turn
 * on those same threads, the launch finishing before it returns. __syncthreads is a real
 * barrier of the block's threads, a warp shuffle an exchange through per-thread slots
 * around a barrier of the warp's 32 threads, atomicAdd a locked add. Linux only (the
 * barriers are futexes); the cost is about a context switch per thread per barrier.
 *
 * What it catches:
 *  - wrong results: indexing, masking, tails of sizes that are not multiples of a tile,
 *    a warp or a vector width; grid-stride loops and multi-block reductions (the device
 *    has 2 multiprocessors, GPTC_EMU_SM=n to change, so grids are small and loop);
 *  - elements a kernel never writes (the test poisons outputs with NaN), and shared
 *    memory read before the block wrote it (it is refilled with 0xff bytes, a NaN, before
 *    every block, for __shared__ and dynamic shared memory alike);
 *  - a __syncthreads or shuffle that not every thread of the block (warp) reaches: at
 *    once when a thread finishes its block while others wait at a barrier, otherwise
 *    after EMU_BARRIER_TIMEOUT_S of waiting (both stop the test with a message);
 *  - launch configuration errors (block size, grid, dynamic shared memory above 48 KiB
 *    without cudaFuncSetAttribute, or above 227 KiB), as cudaGetLastError reports them;
 *  - under GPTC_SANITIZE=address: out-of-bounds reads and writes of global memory (each
 *    buffer is its own heap block) and of dynamic shared memory (allocated at the exact
 *    size the launch asked for), misaligned float4 accesses (UBSan), undefined behaviour
 *    in kernel code.
 * What it cannot catch:
 *  - races in general. Within a block, threads run truly concurrently but on a few cores
 *    at OS scheduling granularity, so a missing barrier shows only when the scheduler
 *    happens to run a reader before the writer (it then reads NaN shared memory).
 *    Between blocks there is no concurrency at all: blocks run one after another, so a
 *    plain += where blocks collide (and atomicAdd is needed) passes;
 *  - memory-model and warp-synchronous bugs: every access is a host access ordered by
 *    the barriers, and the lanes of a warp are independent threads that meet only at
 *    shuffles, so code relying on lockstep execution (or on __syncwarp, which is not
 *    provided) is neither emulated nor reliably exposed;
 *  - anything about streams, events, concurrency between kernels or host/device
 *    copies: launches run synchronously in issue order;
 *  - timing, occupancy, register or shared memory pressure, bank conflicts;
 *  - exact device arithmetic: expf, tanhf, ... are the host's, and contraction into FMA
 *    follows the host compiler, so results agree with the GPU only to rounding.
 * Limits: 1-D blocks, 1- or 2-D grids, full-warp shuffles of float and double, launches
 * from one host thread at a time; anything else stops with a message (or does not
 * compile), and cuda_runtime.h is where to add it. A test tool can hide bugs of its own:
 * tests/test_cuda_ops.c on a real GPU remains the reference check of the kernels. */
#define _GNU_SOURCE /* syscall */

#include "cuda_runtime.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define EMU_MAX_THREADS 1024          /* threads per block */
#define EMU_MAX_GRID_Y 65535
#define EMU_SMEM_DEFAULT (48 * 1024)  /* dynamic shared memory without an opt-in */
#define EMU_SMEM_OPTIN (227 * 1024)   /* the most an opt-in allows (sm_90) */
#define EMU_BARRIER_TIMEOUT_S 30      /* a barrier not complete by then is a deadlock */
#define EMU_STACK_BYTES (512 * 1024)  /* per emulated thread */

__thread emu_uint3 emu_thread_idx, emu_block_idx;
emu_uint3 emu_block_dim, emu_grid_dim;
void *emu_dyn_smem;

static cudaError_t last_error;
static __thread int in_kernel; /* 1 on the emulated CUDA threads */
static const char *kernel_name;
static size_t dyn_smem_bytes;
static emu_body_fn kernel_body;
static void *kernel_ctx;

/* ------------------------------------------------------------------ failures */

void emu_fail(const char *msg) {
    if (in_kernel)
        fprintf(stderr, "cuda_emu: %s, block (%u,%u), thread %u: %s\n", kernel_name,
                emu_block_idx.x, emu_block_idx.y, emu_thread_idx.x, msg);
    else
        fprintf(stderr, "cuda_emu: %s\n", msg);
    fflush(stderr);
    abort();
}

/* ------------------------------------------------------------------ barriers */

/* What a thread waits at; a barrier's waiters must all wait at the same kind. */
enum { AT_SYNCTHREADS, AT_SHUFFLE, AT_BLOCK_END };
static const char *const at_name[] = {"__syncthreads", "a warp shuffle", "the end of its block"};

/* A futex barrier (Linux): hundreds of threads on a few cores make every wait a context
 * switch, and a mutex + condition variable costs several times more per wait. */
typedef struct barrier {
    _Atomic unsigned int state;      /* arrivals << 2 | the kind the first one waits at */
    _Atomic unsigned int generation; /* the futex word: +1 each time all have arrived */
    unsigned int count;
} barrier;

static barrier block_barrier;                      /* all threads of the block */
static barrier warp_barrier[EMU_MAX_THREADS / 32]; /* the threads of each warp */
static double warp_slot[2][EMU_MAX_THREADS];       /* shuffle values, 2 sets */
static pthread_mutex_t atomic_mu = PTHREAD_MUTEX_INITIALIZER;

static void barrier_init(barrier *b, unsigned int count) {
    atomic_store(&b->state, 0);
    atomic_store(&b->generation, 0);
    b->count = count;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Waits until all count threads have arrived; the last one runs on_last (if any) first,
 * while the others still wait. */
static void barrier_wait(barrier *b, int at, void (*on_last)(void)) {
    char msg[200];
    unsigned int gen = atomic_load(&b->generation); /* cannot move on before we arrive */
    unsigned int s = atomic_load(&b->state), next;
    do {
        if (s >> 2 != 0 && (int)(s & 3u) != at) {
            snprintf(msg, sizeof msg, "reached %s while other threads wait at %s: a barrier "
                     "or shuffle that not every thread reaches", at_name[at], at_name[s & 3u]);
            emu_fail(msg);
        }
        next = s >> 2 == 0 ? (1u << 2) | (unsigned int)at : s + (1u << 2);
    } while (!atomic_compare_exchange_weak(&b->state, &s, next));
    if (next >> 2 == b->count) {
        if (on_last) on_last();
        atomic_store(&b->state, 0);
        atomic_fetch_add(&b->generation, 1);
        syscall(SYS_futex, &b->generation, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
        return;
    }
    double start = now_s();
    while (atomic_load(&b->generation) == gen) {
        struct timespec one_s = {1, 0};
        syscall(SYS_futex, &b->generation, FUTEX_WAIT_PRIVATE, gen, &one_s, NULL, 0);
        if (atomic_load(&b->generation) == gen && now_s() - start > EMU_BARRIER_TIMEOUT_S) {
            snprintf(msg, sizeof msg, "waited %d s at %s for %u more thread(s): a deadlock "
                     "(a barrier or shuffle that not every thread reaches)",
                     EMU_BARRIER_TIMEOUT_S, at_name[at], b->count - (atomic_load(&b->state) >> 2));
            emu_fail(msg);
        }
    }
}

void emu_syncthreads(void) { barrier_wait(&block_barrier, AT_SYNCTHREADS, NULL); }

/* One barrier per shuffle: slots alternate between two sets, so a lane that is already
 * one shuffle ahead writes the other set while its warp still reads this one (it cannot
 * get further ahead: the next barrier waits for them). */
void emu_warp_exchange(const void *in, void *out, size_t size, int src_lane) {
    static __thread unsigned int parity;
    unsigned int tid = emu_thread_idx.x, base = tid & ~31u;
    unsigned int width = emu_block_dim.x - base < 32 ? emu_block_dim.x - base : 32;
    double *slot = warp_slot[parity];
    parity ^= 1u;
    if (size > sizeof slot[0] || src_lane < 0 || (unsigned int)src_lane >= width)
        emu_fail("shuffle from a lane outside the warp");
    memcpy(&slot[tid], in, size);
    barrier_wait(&warp_barrier[tid / 32], AT_SHUFFLE, NULL); /* every lane has stored */
    memcpy(out, &slot[base + (unsigned int)src_lane], size);
}

float emu_atomic_add(float *p, float v) {
    pthread_mutex_lock(&atomic_mu);
    float old = *p;
    *p = old + v;
    pthread_mutex_unlock(&atomic_mu);
    return old;
}

/* ------------------------------------------------------------------ shared memory */

/* the __shared__ statics of all kernels (cuda_runtime.h); weak: there may be none */
extern char __start_emu_shared[] __attribute__((weak));
extern char __stop_emu_shared[] __attribute__((weak));

/* 0xff bytes: NaN as float and as double */
static void poison_shared(void) {
    char *start = __start_emu_shared, *stop = __stop_emu_shared;
    if (start && stop > start) memset(start, 0xff, (size_t)(stop - start));
    if (dyn_smem_bytes) memset(emu_dyn_smem, 0xff, dyn_smem_bytes);
}

/* kernels given cudaFuncAttributeMaxDynamicSharedMemorySize, and the value */
static struct {
    const void *kernel;
    size_t bytes;
} smem_optin[64];
static int n_smem_optin;

cudaError_t emu_func_set_attribute(const void *kernel, cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        value > EMU_SMEM_OPTIN)
        return cudaErrorInvalidValue;
    int i = 0;
    while (i < n_smem_optin && smem_optin[i].kernel != kernel) i++;
    if (i == n_smem_optin) {
        if (n_smem_optin == (int)(sizeof smem_optin / sizeof smem_optin[0]))
            emu_fail("too many kernels with a shared memory attribute");
        n_smem_optin++;
    }
    smem_optin[i].kernel = kernel;
    smem_optin[i].bytes = (size_t)value;
    return cudaSuccess;
}

static size_t smem_limit(const void *kernel) {
    for (int i = 0; i < n_smem_optin; i++)
        if (smem_optin[i].kernel == kernel && smem_optin[i].bytes > EMU_SMEM_DEFAULT)
            return smem_optin[i].bytes;
    return EMU_SMEM_DEFAULT;
}

/* ------------------------------------------------------------------ launches */

/* One emulated CUDA thread: runs the kernel for its threadIdx in every block in turn. */
static void *cuda_thread(void *arg) {
    in_kernel = 1;
    emu_thread_idx.x = (unsigned int)(uintptr_t)arg;
    emu_thread_idx.y = emu_thread_idx.z = 0;
    for (unsigned int by = 0; by < emu_grid_dim.y; by++)
        for (unsigned int bx = 0; bx < emu_grid_dim.x; bx++) {
            emu_block_idx.x = bx;
            emu_block_idx.y = by;
            emu_block_idx.z = 0;
            kernel_body(kernel_ctx);
            /* the last thread to finish the block refills shared memory for the next */
            barrier_wait(&block_barrier, AT_BLOCK_END, poison_shared);
        }
    return NULL;
}

void emu_run_grid(const void *kernel, const char *name, emu_uint3 grid, emu_uint3 block,
                  size_t dyn_smem, emu_body_fn body, void *ctx) {
    static pthread_t threads[EMU_MAX_THREADS];
    char msg[200];
    if (block.y != 1 || block.z != 1 || grid.z != 1) {
        snprintf(msg, sizeof msg, "%s: only 1-D blocks and 1- or 2-D grids are emulated", name);
        emu_fail(msg);
    }
    if (grid.x == 0 || grid.y == 0 || grid.y > EMU_MAX_GRID_Y || block.x == 0 ||
        block.x > EMU_MAX_THREADS) {
        last_error = cudaErrorInvalidConfiguration;
        return;
    }
    if (dyn_smem > smem_limit(kernel)) {
        last_error = cudaErrorInvalidValue;
        return;
    }
    unsigned int nt = block.x, nwarps = (nt + 31) / 32;
    kernel_name = name;
    kernel_body = body;
    kernel_ctx = ctx;
    emu_grid_dim = grid;
    emu_block_dim = block;
    dyn_smem_bytes = dyn_smem;
    /* the exact size (malloc's 16-byte alignment, as float4 needs), so that ASan sees
     * an access past the end; a block that asked for none gets a 1-byte block */
    emu_dyn_smem = malloc(dyn_smem ? dyn_smem : 1);
    if (!emu_dyn_smem || ((uintptr_t)emu_dyn_smem & 15u)) emu_fail("shared memory allocation");
    poison_shared();
    barrier_init(&block_barrier, nt);
    for (unsigned int w = 0; w < nwarps; w++)
        barrier_init(&warp_barrier[w], nt - 32 * w < 32 ? nt - 32 * w : 32);

    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, EMU_STACK_BYTES);
    for (unsigned int t = 0; t < nt; t++) {
        int rc = pthread_create(&threads[t], &attr, cuda_thread, (void *)(uintptr_t)t);
        if (rc != 0) {
            snprintf(msg, sizeof msg, "%s: pthread_create: %s", name, strerror(rc));
            emu_fail(msg);
        }
    }
    pthread_attr_destroy(&attr);
    for (unsigned int t = 0; t < nt; t++) pthread_join(threads[t], NULL);

    free(emu_dyn_smem);
    emu_dyn_smem = NULL;
    dyn_smem_bytes = 0;
    kernel_name = NULL;
}

/* ------------------------------------------------------------------ host API */

cudaError_t emu_cudaGetDevice(int *device) {
    *device = 0;
    return cudaSuccess;
}

cudaError_t emu_cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device) {
    (void)device;
    if (attr != cudaDevAttrMultiProcessorCount) return cudaErrorInvalidValue;
    const char *e = getenv("GPTC_EMU_SM");
    *value = e && atoi(e) > 0 ? atoi(e) : 2;
    return cudaSuccess;
}

cudaError_t emu_cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
