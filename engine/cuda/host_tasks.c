/* launch_host_func of the CUDA backend: fn(arg) runs on a host thread of our own, one per
 * stream, in the stream's order, and the stream's later work waits until it returned.
 *
 * cudaLaunchHostFunc would give the same order, but its functions run on a thread the
 * CUDA runtime shares between streams, so a function blocking in MPI (a host-staged
 * collective waiting for a peer) would hold back the functions of every other stream
 * and can deadlock ranks whose streams wait on each other. Here each stream has a worker
 * that waits for an event marking the point the stream reached, runs the function, then
 * bumps a counter in host-mapped memory; a one-thread kernel queued on the stream spins
 * until the counter reaches the task's number. The functions may call CUDA, but nothing
 * that waits for the whole device (cudaFree, cudaFreeHost, cudaDeviceSynchronize): that
 * would wait for the spin kernel, which waits for the function.
 * With CUDA_DEVICE_MAX_CONNECTIONS=1 every stream shares one hardware queue, and work
 * queued behind a spinning kernel waits for it: leave that variable unset. */
#include "engine/cuda/cuda_internal.h"

#include "engine/cuda/cuda_kernels.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

typedef struct task {
    void (*fn)(void *);
    void *arg;
    cudaEvent_t reached; /* the stream's point before the function */
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
    unsigned int *done;     /* [1] host-mapped: tasks finished */
    unsigned int *done_dev; /* the same word, as the device sees it */
};

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
        cuda_check(cudaEventSynchronize(t->reached), "host task (event)");
        cuda_check(cudaEventDestroy(t->reached), "host task (event)");
        t->fn(t->arg);
        __atomic_add_fetch(w->done, 1u, __ATOMIC_RELEASE);
        free(t);
    }
}

host_worker *host_worker_create(int device) {
    host_worker *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->device = device;
    if (cudaHostAlloc((void **)&w->done, sizeof(unsigned int), cudaHostAllocMapped) != cudaSuccess ||
        cudaHostGetDevicePointer((void **)&w->done_dev, w->done, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        free(w);
        return NULL;
    }
    *w->done = 0;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->work, NULL);
    if (pthread_create(&w->thread, NULL, work, w) != 0) {
        cudaFreeHost(w->done);
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
    cudaFreeHost(w->done);
    free(w);
}

void host_worker_launch(host_worker *w, cudaStream_t s, void (*fn)(void *), void *arg) {
    task *t = malloc(sizeof *t);
    if (!t) cuda_check(cudaErrorMemoryAllocation, "host task");
    t->fn = fn;
    t->arg = arg;
    t->next = NULL;
    /* blocking sync: the worker sleeps rather than spins beside MPI's progress threads */
    cuda_check(cudaEventCreateWithFlags(&t->reached, cudaEventDisableTiming | cudaEventBlockingSync),
               "host task (event)");
    cuda_check(cudaEventRecord(t->reached, s), "host task (event)");
    unsigned int number = ++w->issued;
    pthread_mutex_lock(&w->mu);
    if (w->tail) w->tail->next = t;
    else w->head = t;
    w->tail = t;
    pthread_cond_signal(&w->work);
    pthread_mutex_unlock(&w->mu);
    cuda_wait_flag(w->done_dev, number, s);
    cuda_check((cudaError_t)cuda_check_launch(), "host task (wait kernel)");
}
