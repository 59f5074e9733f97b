/* CPU streams and events. A stream is a worker thread draining a FIFO queue, so a
 * communication stream really runs beside the compute on the calling thread, as a CUDA
 * stream runs beside the host. The NULL stream is the caller itself: what is issued on it
 * has already happened when the call returns.
 *
 * An event counts its records: record number g is complete once the stream it was
 * recorded on has run past it. A wait remembers the record number current at the time of
 * the wait call, so recording the event again later does not move an earlier wait. */
#define _GNU_SOURCE /* gettid, for a per-thread nice value */
#include "engine/backend.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

struct gptc_event {
    pthread_mutex_t mu;
    pthread_cond_t done;  /* broadcast whenever completed grows */
    uint64_t recorded;    /* number of the latest record */
    uint64_t completed;   /* highest record number reached by its stream */
    int refs;             /* the owner plus every queued item that points here */
};

typedef enum { ITEM_FUNC, ITEM_RECORD, ITEM_WAIT } item_kind;

typedef struct item {
    item_kind kind;
    void (*fn)(void *);
    void *arg;
    gptc_event *event;
    uint64_t gen;         /* record number: the one made (RECORD) or awaited (WAIT) */
    struct item *next;
} item;

struct gptc_stream {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work;  /* the queue got an item, or stop was set */
    pthread_cond_t idle;  /* finished grew */
    item *head, *tail;
    uint64_t pushed, finished; /* items ever enqueued / ever run */
    int stop;
    int high_priority;
};

/* ---- events ---- */

gptc_event *cpu_event_create(void) {
    gptc_event *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->done, NULL);
    e->refs = 1;
    return e;
}

static void event_ref(gptc_event *e) {
    pthread_mutex_lock(&e->mu);
    e->refs++;
    pthread_mutex_unlock(&e->mu);
}

static void event_unref(gptc_event *e) {
    pthread_mutex_lock(&e->mu);
    int left = --e->refs;
    pthread_mutex_unlock(&e->mu);
    if (left) return;
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->done);
    free(e);
}

/* Queued records and waits hold their own reference, so the owner may let go early, as
 * cudaEventDestroy allows. */
void cpu_event_destroy(gptc_event *e) {
    if (e) event_unref(e);
}

static uint64_t event_new_record(gptc_event *e) {
    pthread_mutex_lock(&e->mu);
    uint64_t g = ++e->recorded;
    pthread_mutex_unlock(&e->mu);
    return g;
}

static uint64_t event_latest_record(gptc_event *e) {
    pthread_mutex_lock(&e->mu);
    uint64_t g = e->recorded;
    pthread_mutex_unlock(&e->mu);
    return g;
}

static void event_complete(gptc_event *e, uint64_t gen) {
    pthread_mutex_lock(&e->mu);
    if (gen > e->completed) e->completed = gen;
    pthread_cond_broadcast(&e->done);
    pthread_mutex_unlock(&e->mu);
}

static void event_wait_for(gptc_event *e, uint64_t gen) {
    pthread_mutex_lock(&e->mu);
    while (e->completed < gen) pthread_cond_wait(&e->done, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

/* ---- the worker ---- */

static void set_high_priority(void) {
#ifdef __linux__
    /* Linux keeps a nice value per thread, so this favours the comm thread alone. A
     * real-time policy is avoided on purpose: MPI busy-polls, and a SCHED_FIFO poller
     * could starve the compute thread on a small machine. Five below the nice the thread
     * was created with, not an absolute -5: under `nice -n 19` an absolute -5 put the
     * busy-polling comm threads above every other job on a shared machine and starved
     * this run's own compute. Lowering nice needs CAP_SYS_NICE; without it the thread
     * keeps the process's priority. */
    id_t tid = (id_t)gettid();
    errno = 0;
    int nice_now = getpriority(PRIO_PROCESS, tid);
    if (nice_now == -1 && errno != 0) return;
    (void)setpriority(PRIO_PROCESS, tid, nice_now - 5 < -20 ? -20 : nice_now - 5);
#endif
}

static void run_item(item *it) {
    switch (it->kind) {
    case ITEM_FUNC: it->fn(it->arg); break;
    case ITEM_RECORD: event_complete(it->event, it->gen); event_unref(it->event); break;
    case ITEM_WAIT: event_wait_for(it->event, it->gen); event_unref(it->event); break;
    }
}

static void *worker_main(void *arg) {
    gptc_stream *s = arg;
    if (s->high_priority) set_high_priority();
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->work, &s->mu);
        if (!s->head) break; /* stop was set and the queue is drained */
        item *it = s->head;
        s->head = it->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&s->mu);

        run_item(it);
        free(it);

        pthread_mutex_lock(&s->mu);
        s->finished++;
        pthread_cond_broadcast(&s->idle);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Runs the item at once when the queue cannot take it: slower order is still order, and
 * an out-of-memory here must not silently drop a collective. */
static void enqueue(gptc_stream *s, item it) {
    item *copy = malloc(sizeof *copy);
    if (!copy) {
        cpu_stream_synchronize(s);
        run_item(&it);
        return;
    }
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

/* ---- streams ---- */

gptc_stream *cpu_stream_create(int high_priority) {
    gptc_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->idle, NULL);
    s->high_priority = high_priority;
    int e = pthread_create(&s->thread, NULL, worker_main, s);
    if (e) {
        pthread_cond_destroy(&s->idle);
        pthread_cond_destroy(&s->work);
        pthread_mutex_destroy(&s->mu);
        free(s);
        errno = e; /* the caller's message says why */
        return NULL;
    }
    return s;
}

void cpu_stream_destroy(gptc_stream *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->idle);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Waits for what was enqueued before the call, not for an empty queue, so another thread
 * that keeps issuing work cannot hold the caller forever. */
void cpu_stream_synchronize(gptc_stream *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->pushed;
    while (s->finished < target) pthread_cond_wait(&s->idle, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

void cpu_launch_host_func(gptc_stream *s, void (*fn)(void *), void *arg) {
    if (!s) {
        fn(arg);
        return;
    }
    enqueue(s, (item){.kind = ITEM_FUNC, .fn = fn, .arg = arg});
}

void cpu_event_record(gptc_event *e, gptc_stream *s) {
    uint64_t g = event_new_record(e);
    if (!s) {
        event_complete(e, g);
        return;
    }
    event_ref(e);
    enqueue(s, (item){.kind = ITEM_RECORD, .event = e, .gen = g});
}

void cpu_stream_wait_event(gptc_stream *s, gptc_event *e) {
    uint64_t g = event_latest_record(e);
    if (!s) {
        event_wait_for(e, g);
        return;
    }
    event_ref(e);
    enqueue(s, (item){.kind = ITEM_WAIT, .event = e, .gen = g});
}

void cpu_event_synchronize(gptc_event *e) {
    event_wait_for(e, event_latest_record(e));
}
