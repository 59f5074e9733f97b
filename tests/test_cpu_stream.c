/* Semantics of the CPU backend's streams and events, in one process: FIFO order, the NULL
 * stream running inline, waits across streams, re-recorded events, synchronize, and
 * destroying a stream or an event with work still queued. Meant to run under
 * ThreadSanitizer too: the stream machinery must be what orders every access here.
 *
 * A "gate" holds a stream's thread at a known point so that the test can look at what
 * has and has not run yet, without relying on timing for correctness. */
#define _GNU_SOURCE /* gettid: a thread's own nice value */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "engine/backend.h"

static int failures;

static void check(int cond, const char *what) {
    if (!cond) {
        printf("FAIL: %s\n", what);
        failures++;
    }
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- a gate that a host function waits at until the test opens it ---- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open;
    atomic_int arrived;
} gate;

static void gate_init(gate *g) {
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->open = 0;
    atomic_init(&g->arrived, 0);
}

static void gate_pass(void *arg) {
    gate *g = arg;
    atomic_store(&g->arrived, 1);
    pthread_mutex_lock(&g->mu);
    while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate *g) {
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void gate_wait_arrived(gate *g) {
    while (!atomic_load(&g->arrived)) sleep_ms(1);
}

static void gate_destroy(gate *g) {
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}

/* ---- host functions ---- */

typedef struct {
    int values[2000];
    int n;
} order_log;

typedef struct {
    order_log *log;
    int value;
} log_entry;

/* Plain (non-atomic) writes: only the stream's order makes them safe. */
static void append(void *arg) {
    log_entry *e = arg;
    e->log->values[e->log->n++] = e->value;
}

static void set_flag(void *arg) { atomic_store((atomic_int *)arg, 1); }

typedef struct {
    int *from, *to;
} int_copy;

static void copy_int(void *arg) {
    int_copy *c = arg;
    *c->to = *c->from;
}

static void slow_increment(void *arg) {
    sleep_ms(1);
    (*(int *)arg)++;
}

/* ---- the tests ---- */

static void test_null_stream_is_inline(const gptc_backend *be) {
    atomic_int ran;
    atomic_init(&ran, 0);
    be->launch_host_func(NULL, set_flag, &ran);
    check(atomic_load(&ran) == 1, "launch_host_func(NULL) runs at once");

    gptc_event *e = be->event_create();
    be->event_record(e, NULL);
    be->event_synchronize(e);   /* would block forever if the record were not complete */
    be->stream_wait_event(NULL, e);
    be->stream_synchronize(NULL);
    be->synchronize(NULL);
    be->event_destroy(e);
}

static void test_fifo(const gptc_backend *be) {
    static order_log log;
    static log_entry entries[2000];
    gptc_stream *s = be->stream_create(0);
    check(s != NULL, "stream_create");
    log.n = 0;
    for (int i = 0; i < 2000; i++) {
        entries[i] = (log_entry){&log, i};
        be->launch_host_func(s, append, &entries[i]);
    }
    be->stream_synchronize(s);
    int in_order = log.n == 2000;
    for (int i = 0; in_order && i < 2000; i++) in_order = log.values[i] == i;
    check(in_order, "host functions run in FIFO order and synchronize waits for all");
    be->stream_destroy(s);
}

static void test_never_recorded(const gptc_backend *be) {
    gptc_event *e = be->event_create();
    gptc_stream *s = be->stream_create(0);
    atomic_int ran;
    atomic_init(&ran, 0);
    be->event_synchronize(e);
    be->stream_wait_event(NULL, e);
    be->stream_wait_event(s, e);
    be->launch_host_func(s, set_flag, &ran);
    be->stream_synchronize(s);
    check(atomic_load(&ran) == 1, "a wait on a never-recorded event passes");
    be->stream_destroy(s);
    be->event_destroy(e);
}

/* s2 waits for an event recorded on s1 behind a closed gate. */
static void test_wait_across_streams(const gptc_backend *be) {
    gptc_stream *s1 = be->stream_create(0), *s2 = be->stream_create(1);
    gptc_event *e = be->event_create();
    gate g;
    gate_init(&g);
    int produced = 0, consumed = -1; /* plain ints: ordered only by the event */
    atomic_int s2_done;
    atomic_init(&s2_done, 0);

    be->launch_host_func(s1, gate_pass, &g);
    be->launch_host_func(s1, slow_increment, &produced);
    be->event_record(e, s1);
    be->stream_wait_event(s2, e);
    int_copy c = {&produced, &consumed};
    be->launch_host_func(s2, copy_int, &c);
    be->launch_host_func(s2, set_flag, &s2_done);

    gate_wait_arrived(&g);
    sleep_ms(20);
    check(atomic_load(&s2_done) == 0, "s2 does not pass its wait before s1 reaches the event");
    gate_open(&g);
    be->stream_synchronize(s2);
    check(consumed == 1, "s2 sees what s1 did before the event");
    be->stream_synchronize(s1);
    check(produced == 1, "synchronize(s1)");

    be->event_destroy(e);
    be->stream_destroy(s1);
    be->stream_destroy(s2);
    gate_destroy(&g);
}

/* The host waits on an event: event_synchronize and stream_wait_event(NULL, e). */
static void test_host_waits(const gptc_backend *be) {
    gptc_stream *s = be->stream_create(0);
    gptc_event *e = be->event_create();
    gate g;
    gate_init(&g);
    int x = 0;
    be->launch_host_func(s, gate_pass, &g);
    be->launch_host_func(s, slow_increment, &x);
    be->event_record(e, s);
    gate_wait_arrived(&g);
    gate_open(&g);
    be->event_synchronize(e);
    check(x == 1, "event_synchronize waits for the work before the record");

    be->launch_host_func(s, slow_increment, &x);
    be->event_record(e, s);
    be->stream_wait_event(NULL, e);
    check(x == 2, "stream_wait_event(NULL, e) blocks the caller until e completes");
    be->event_destroy(e);
    be->stream_destroy(s);
    gate_destroy(&g);
}

/* A wait refers to the latest record at the time of the wait call: recording again later
 * neither delays an earlier wait nor lets a later wait use the old record. */
static void test_rerecord(const gptc_backend *be) {
    gptc_stream *s1 = be->stream_create(0), *s2 = be->stream_create(0);
    gptc_event *e = be->event_create();
    gate first;
    gate_init(&first);
    atomic_int a, b;
    atomic_init(&a, 0);
    atomic_init(&b, 0);

    be->event_record(e, s1);               /* record 1: reached at once */
    be->stream_wait_event(s2, e);          /* s2 waits for record 1 */
    be->launch_host_func(s2, set_flag, &a);
    be->launch_host_func(s1, gate_pass, &first);
    be->event_record(e, s1);               /* record 2: behind the gate */
    be->stream_synchronize(s2);
    check(atomic_load(&a) == 1, "a wait is not moved by a later record");

    be->stream_wait_event(s2, e);          /* s2 waits for record 2 */
    be->launch_host_func(s2, set_flag, &b);
    gate_wait_arrived(&first);
    sleep_ms(20);
    check(atomic_load(&b) == 0, "a wait after a re-record waits for the new record");
    gate_open(&first);
    be->stream_synchronize(s2);
    check(atomic_load(&b) == 1, "the new record completes");

    be->event_destroy(e);
    be->stream_destroy(s1);
    be->stream_destroy(s2);
    gate_destroy(&first);
}

/* synchronize waits for what was enqueued before it, even while the stream is held. */
static void test_synchronize(const gptc_backend *be) {
    gptc_stream *s = be->stream_create(0);
    gate g;
    gate_init(&g);
    int n = 0;
    be->launch_host_func(s, gate_pass, &g);
    for (int i = 0; i < 10; i++) be->launch_host_func(s, slow_increment, &n);
    gate_wait_arrived(&g);
    gate_open(&g);
    be->stream_synchronize(s);
    check(n == 10, "stream_synchronize waits for all queued work");
    be->stream_destroy(s);
    gate_destroy(&g);
}

/* Destroying a stream finishes its queue; destroying an event with a record and a wait
 * still queued is safe (ASan/TSan would see a use after free otherwise). */
static void test_destroy_with_queued_work(const gptc_backend *be) {
    gptc_stream *s1 = be->stream_create(0), *s2 = be->stream_create(0);
    gptc_event *e = be->event_create();
    gate g;
    gate_init(&g);
    int n = 0, m = 0;
    be->launch_host_func(s1, gate_pass, &g);
    for (int i = 0; i < 50; i++) be->launch_host_func(s1, slow_increment, &n);
    be->event_record(e, s1);
    be->stream_wait_event(s2, e);
    be->launch_host_func(s2, slow_increment, &m);
    be->event_destroy(e);
    gate_wait_arrived(&g);
    gate_open(&g);
    be->stream_destroy(s1);
    check(n == 50, "stream_destroy runs the queued work first");
    be->stream_destroy(s2);
    check(m == 1, "a wait on a destroyed event still completes");
    gate_destroy(&g);
}

/* Two host threads issuing to one stream: each thread's items stay in its own order. */
typedef struct {
    const gptc_backend *be;
    gptc_stream *s;
    order_log *log;
    log_entry entries[500];
    int base;
} producer;

static void *produce(void *arg) {
    producer *p = arg;
    for (int i = 0; i < 500; i++) {
        p->entries[i] = (log_entry){p->log, p->base + i};
        p->be->launch_host_func(p->s, append, &p->entries[i]);
    }
    return NULL;
}

static void test_two_producers(const gptc_backend *be) {
    static order_log log;
    static producer p[2];
    gptc_stream *s = be->stream_create(0);
    log.n = 0;
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        p[i] = (producer){.be = be, .s = s, .log = &log, .base = i * 1000};
        pthread_create(&t[i], NULL, produce, &p[i]);
    }
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    be->stream_synchronize(s);
    int last[2] = {-1, 999}, ordered = log.n == 1000;
    for (int i = 0; ordered && i < log.n; i++) {
        int who = log.values[i] / 1000;
        ordered = log.values[i] > last[who];
        last[who] = log.values[i];
    }
    check(ordered, "items from two producer threads keep each thread's order");
    be->stream_destroy(s);
}

#ifdef __linux__
static void read_nice(void *arg) { *(int *)arg = getpriority(PRIO_PROCESS, (id_t)gettid()); }

/* A stream's thread's nice value, read on the thread */
static int stream_nice(const gptc_backend *be, int high_priority) {
    gptc_stream *s = be->stream_create(high_priority);
    int nice_value = 99;
    be->launch_host_func(s, read_nice, &nice_value);
    be->stream_synchronize(s);
    be->stream_destroy(s);
    return nice_value;
}

/* comm_priority = high is relative to the run's nice (a `nice -n 10` run's comm threads at
 * 5, not at an absolute -5 above every other job); normal keeps it. Last: it leaves the
 * main thread at nice 10. */
static void test_priority_relative(const gptc_backend *be) {
    id_t me = (id_t)gettid();
    errno = 0;
    int before = getpriority(PRIO_PROCESS, me);
    /* raising nice is always permitted; lowering it (a run under `nice -n 19`) where the
     * thread may, e.g. as root: try it rather than skip a niced ctest */
    if ((before == -1 && errno) || setpriority(PRIO_PROCESS, me, 10) != 0) {
        printf("skip: comm priority (this thread's nice is %d, cannot set it to 10)\n", before);
        return;
    }
    /* may a thread lower its nice here (CAP_SYS_NICE)? then the stream's must be 5 */
    int may_lower = setpriority(PRIO_PROCESS, me, 9) == 0;
    setpriority(PRIO_PROCESS, me, 10);
    int high = stream_nice(be, 1), normal = stream_nice(be, 0);
    check(high == (may_lower ? 5 : 10), "a high-priority stream's thread runs 5 below the "
                                        "creating thread's nice (10), where permitted");
    check(normal == 10, "a normal stream's thread keeps the creating thread's nice");
    printf("comm priority: under nice 10 a high-priority stream's thread runs at %d, a normal "
           "one's at %d (lowering nice %s here)\n", high, normal,
           may_lower ? "permitted" : "not permitted");
}
#endif

int main(void) {
    const gptc_backend *be = cpu_backend();
    if (!be) {
        printf("FAIL: cpu_backend() unavailable\n");
        return 1;
    }
    test_null_stream_is_inline(be);
    test_fifo(be);
    test_never_recorded(be);
    test_wait_across_streams(be);
    test_host_waits(be);
    test_rerecord(be);
    test_synchronize(be);
    test_destroy_with_queued_work(be);
    test_two_producers(be);
#ifdef __linux__
    test_priority_relative(be);
#endif
    printf("%s\n", failures ? "FAILED" : "PASSED");
    return failures ? 1 : 0;
}
