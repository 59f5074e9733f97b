/* launch_host_func of the CUDA backend: fn(arg) runs on a host thread of our own, one per
 * stream, in the stream's order, and the stream's later work waits until it returned.
 *
 * cudaLaunchHostFunc would give the same order, but its functions run on a thread the
 * CUDA runtime shares between streams, so a function blocking in MPI (a host-staged
 * collective waiting for a peer) would hold back the functions of every other stream
 * and can deadlock ranks whose streams wait on each other. Here each stream has a worker
 * and two counters in host-mapped memory: a one-thread kernel queued on the stream sets
 * `reached` to the task's number when the stream gets there, the worker polls it, runs
 * the function and bumps `done`, and a second one-thread kernel spins until `done` holds
 * the task's number.
 *
 * The worker makes no CUDA call between taking a task and finishing it. Some CUDA calls
 * take a lock of the driver and wait until the whole device is idle: cudaFree,
 * cudaFreeHost, cudaMallocHost, and the first launch of a kernel under lazy module
 * loading (CUDA 12's default). Made on the main thread while a spin kernel waits, such a
 * call waits for the worker; had the worker then called cudaEventSynchronize (as it once
 * did), it would wait for that lock: a deadlock, seen on an H200 with two ranks on one
 * GPU in step 1. Without CUDA calls the worker finishes its MPI call, the spin kernel
 * ends and the main thread's call completes.
 * With CUDA_DEVICE_MAX_CONNECTIONS=1 every stream shares one hardware queue, and work
 * queued behind a spinning kernel waits for it: leave that variable unset. */
#include "engine/cuda/cuda_internal.h"

#include "engine/cuda/cuda_kernels.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

typedef struct task {
    void (*fn)(void *);
    void *arg;
    unsigned int number; /* the stream's point before the function: reached >= number */
    struct task *next;
} task;

struct host_worker {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work;
    task *head, *tail;
    int stop;
    int device;
    unsigned int issued;    /* tasks enqueued (the main thread's count) */
    unsigned int *flags;    /* [2] host-mapped: [0] tasks the stream reached, [1] tasks done */
    unsigned int *flags_dev; /* [2] the same words, as the device sees them */
};

/* Polls the stream's counter: the wait is a few microseconds when the stream is idle and
 * as long as the compute before the op when it is busy, so the sleep grows to 50 us. */
static void wait_reached(const unsigned int *reached, unsigned int number) {
    long ns = 1000;
    /* an acquire load: the stream's copies before the flag are seen after it */
    for (int spins = 0; (int)(__atomic_load_n(reached, __ATOMIC_ACQUIRE) - number) < 0; spins++) {
        if (spins < 64) continue;
        struct timespec ts = {0, ns};
        nanosleep(&ts, NULL);
        if (ns < 50000) ns *= 2;
    }
}

static void *work(void *arg) {
    host_worker *w = arg;
    cudaSetDevice(w->device); /* the current device is per thread */
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (!w->head && !w->stop) pthread_cond_wait(&w->work, &w->mu);
        task *t = w->head;
        if (!t) {
            pthread_mutex_unlock(&w->mu);
            return NULL;
        }
        w->head = t->next;
        if (!w->head) w->tail = NULL;
        pthread_mutex_unlock(&w->mu);
        wait_reached(&w->flags[0], t->number);
        t->fn(t->arg);
        __atomic_add_fetch(&w->flags[1], 1u, __ATOMIC_RELEASE);
        free(t);
    }
}

host_worker *host_worker_create(int device) {
    host_worker *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->device = device;
    if (cudaHostAlloc((void **)&w->flags, 2 * sizeof(unsigned int), cudaHostAllocMapped) != cudaSuccess ||
        cudaHostGetDevicePointer((void **)&w->flags_dev, w->flags, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        free(w);
        return NULL;
    }
    w->flags[0] = w->flags[1] = 0;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->work, NULL);
    if (pthread_create(&w->thread, NULL, work, w) != 0) {
        cudaFreeHost(w->flags);
        free(w);
        return NULL;
    }
    return w;
}

/* The worker finishes its queue first; the caller has synchronised the stream. */
void host_worker_destroy(host_worker *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_signal(&w->work);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    cudaFreeHost(w->flags);
    free(w);
}

void host_worker_launch(host_worker *w, cudaStream_t s, void (*fn)(void *), void *arg) {
    task *t = malloc(sizeof *t);
    if (!t) cuda_check(cudaErrorMemoryAllocation, "host task");
    t->fn = fn;
    t->arg = arg;
    t->next = NULL;
    unsigned int number = t->number = ++w->issued;
    cuda_set_flag(&w->flags_dev[0], number, s);
    cuda_check((cudaError_t)cuda_check_launch(), "host task (flag kernel)");
    pthread_mutex_lock(&w->mu);
    if (w->tail) w->tail->next = t;
    else w->head = t;
    w->tail = t;
    pthread_cond_signal(&w->work);
    pthread_mutex_unlock(&w->mu);
    cuda_wait_flag(&w->flags_dev[1], number, s);
    cuda_check((cudaError_t)cuda_check_launch(), "host task (wait kernel)");
}
