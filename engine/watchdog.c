#define _POSIX_C_SOURCE 200809L
#include "engine/watchdog.h"

#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/log.h"
#include "engine/stop_signal.h"
#include "engine/timing.h"

static _Atomic double g_last_ms;
static _Atomic double g_hold_until_ms; /* watchdog_hold: no timeout counted before this */
/* What each thread waits in (watchdog_waiting), a slot a thread: the main thread's host
 * reductions and the streams' ops run at once (a ZeRO-1 prefetch in flight while the step
 * agrees), and one shared name was cleared by whichever finished first. Threads past the
 * slots share them (the name is for the message only). */
enum { WAIT_SLOTS = 32 };
static _Atomic(const char *) g_waiting[WAIT_SLOTS];
static atomic_int g_wait_threads;
static atomic_int g_running;
static pthread_t g_thread;
static _Atomic double g_timeout_ms;
static int g_rank, g_world;
static _Atomic(atomic_long *) g_step;   /* NULL in the start-up; set under g_hooks */
static _Atomic(const char *) g_doing;    /* watchdog_doing */
static atomic_int g_finalizing;          /* watchdog_finalizing */
static atomic_int g_waits_marked;        /* watchdog_waits_marked */
/* the hooks reach communicators the run frees before MPI_Finalize, which the thread
 * still watches: they are set, and used, under g_hooks */
static pthread_mutex_t g_hooks = PTHREAD_MUTEX_INITIALIZER;
/* watchdog_stop wakes the watch at once: a process would otherwise end up to a tick late */
static pthread_cond_t g_wake;
static const char *(*g_poll)(void);
static void (*g_abort_all)(void);

void watchdog_set_comm_hooks(const char *(*poll)(void), void (*abort_all)(void)) {
    pthread_mutex_lock(&g_hooks);
    g_poll = poll;
    g_abort_all = abort_all;
    pthread_mutex_unlock(&g_hooks);
}

static atomic_long g_beats;

void watchdog_beat(void) {
    atomic_store_explicit(&g_last_ms, timing_now_ms(), memory_order_relaxed);
    /* the held wait is over: a hang after it is timed from here, not from the hold's end.
     * Released after the beat's time: the watch that sees the hold gone sees that time
     * (it read an old beat and no hold: a timeout at the end of every long hold) */
    atomic_store_explicit(&g_hold_until_ms, 0.0, memory_order_release);
    atomic_fetch_add_explicit(&g_beats, 1, memory_order_relaxed);
}

long watchdog_beats(void) { return atomic_load(&g_beats); }

void watchdog_hold(double seconds) { atomic_store(&g_hold_until_ms, timing_now_ms() + seconds * 1e3); }

/* 20 MB/s: a busy network file system's worst, so that only a disk that stopped is a hang */
double watchdog_io_s(double bytes) {
    static _Atomic double rate; /* read once: 0 until then */
    double r = atomic_load(&rate);
    if (r == 0) {
        const char *v = getenv("GPTC_TEST_IO_RATE");
        r = v && atof(v) > 0 ? atof(v) : 20e6;
        atomic_store(&rate, r);
    }
    return bytes / r;
}

/* Sleeps ms in slices that beat (a slow read or step goes on, a hung one would not), or
 * less when until (if not NULL) says to go on */
static void sleep_beating(long ms, int (*until)(void)) {
    for (; ms > 0 && !(until && until()); ms -= 10) {
        struct timespec ts = {0, (ms < 10 ? ms : 10) * 1000000L};
        nanosleep(&ts, NULL);
        watchdog_beat();
    }
}

void watchdog_test_slow_read(void) {
    const char *v = getenv("GPTC_TEST_SLOW_READS");
    if (!v) return;
    /* said once for each input (rank 0): a test waits for it to act during the reads */
    static char said[1024]; /* as long as the trainer's doing[ERR_LEN] */
    const char *doing = atomic_load(&g_doing);
    if (doing && strncmp(said, doing, sizeof said - 1) != 0) {
        snprintf(said, sizeof said, "%s", doing);
        log_info("test: %s, each read slowed by %ld ms (GPTC_TEST_SLOW_READS)\n", said, atol(v));
    }
    sleep_beating(atol(v), NULL);
}

void watchdog_test_slow_step(long step) {
    const char *v = getenv("GPTC_TEST_SLOW_STEP");
    long at = 0, ms = 0;
    if (v && sscanf(v, "%ld:%ld", &at, &ms) == 2 && at == step) sleep_beating(ms, stop_requested);
}

void watchdog_test_stuck_step(long step) {
    const char *v = getenv("GPTC_TEST_STUCK_STEP");
    int rank = -1;
    long at = 0;
    if (!v || sscanf(v, "%d:%ld", &rank, &at) != 2 || rank != g_rank || at != step) return;
    for (;;) { /* no beat, no wait for a peer: as a library call that spins */
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
    }
}

void watchdog_waits_marked(int yes) { atomic_store(&g_waits_marked, yes); }

/* What a rank that waits for a peer gives a rank stuck outside communication, whose
 * timeout ends about when its own does (it stopped beating first), to name itself before
 * this one's abort ends it: a quarter of the timeout, at most 5 s */
static double stuck_grace_ms(double timeout_ms) {
    return timeout_ms / 4 < 5e3 ? timeout_ms / 4 : 5e3;
}

void watchdog_waiting(const char *what) {
    static _Thread_local int slot = -1;
    if (slot < 0) slot = atomic_fetch_add(&g_wait_threads, 1) % WAIT_SLOTS;
    atomic_store(&g_waiting[slot], what);
}

/* Whether some thread waits: the slots' pointers alone, read every tick (the names they
 * point to are rewritten by their threads, and read only for the message) */
static int any_waiting(void) {
    for (int i = 0; i < WAIT_SLOTS; i++)
        if (atomic_load(&g_waiting[i])) return 1;
    return 0;
}

/* ", waiting in A and B" for the threads that wait, "" when none does */
static void waiting_text(char *out, size_t n) {
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < WAIT_SLOTS && len < n; i++) {
        const char *w = atomic_load(&g_waiting[i]);
        if (w) {
            int k = snprintf(out + len, n - len, "%s%s", len ? " and " : ", waiting in ", w);
            len = k < 0 ? n : len + (size_t)k;
        }
    }
}

/* "step s", or "the start-up", into where[64] (the counter is the main thread's, written
 * every step) */
static const char *where_text(char *where) {
    atomic_long *step = atomic_load(&g_step);
    long s = step ? atomic_load_explicit(step, memory_order_relaxed) : 0;
    if (s > 0) snprintf(where, 64, "step %ld", s);
    else snprintf(where, 64, "the start-up");
    return where;
}

static void *watch(void *arg) {
    const long tick_ns = 200L * 1000 * 1000;
    /* A tick that took a second more than its 200 ms: this process did not run (SIGSTOP, a
     * debugger, a starved machine). Time it did not run says nothing of its peers: no
     * timeout is counted from before it (a rank stopped, then woken by the launcher's kill
     * sequence, blamed a peer). */
    const double stall_ms = 1200.0;
    double prev = *(const double *)arg, resumed = 0.0; /* from watchdog_start: a thread
                                                         * that first ran late did not run */
    for (;;) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += tick_ns;
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        pthread_mutex_lock(&g_hooks); /* held to the abort, or released below */
        /* a wake-up before the tick's end that is not watchdog_stop's waits on */
        while (atomic_load(&g_running) &&
               pthread_cond_timedwait(&g_wake, &g_hooks, &until) != ETIMEDOUT)
            continue;
        if (!atomic_load(&g_running)) { /* stopped while it slept: no timeout now */
            pthread_mutex_unlock(&g_hooks);
            break;
        }
        const char *failed = g_poll ? g_poll() : NULL;
        char where[64];
        if (failed) {
            log_error("rank %d: %s, in %s; aborting the job", g_rank, failed, where_text(where));
            if (g_abort_all) g_abort_all();
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        /* the hold first: see watchdog_beat */
        double held = atomic_load_explicit(&g_hold_until_ms, memory_order_acquire);
        double last = atomic_load_explicit(&g_last_ms, memory_order_relaxed);
        double since = held > last ? held : last;
        /* one reading for the stall and the idle time: a stop after it is in neither */
        double now = timing_now_ms();
        if (now - prev > stall_ms) resumed = now;
        prev = now;
        double idle = now - (resumed > since ? resumed : since);
        int marked = atomic_load(&g_waits_marked) && g_world > 1, waits = any_waiting();
        double timeout = atomic_load(&g_timeout_ms);
        if (idle < timeout + (marked && waits ? stuck_grace_ms(timeout) : 0)) {
            pthread_mutex_unlock(&g_hooks);
            continue;
        }
        if (atomic_load(&g_finalizing)) {
            /* every rank's work is done: no job to abort, and MPI_Abort inside
             * MPI_Finalize is not to be relied on; this rank ends, and the launcher the
             * rest */
            log_error("rank %d: MPI_Finalize has waited %.0f s (train.comm_timeout_s) for the "
                      "other ranks: a peer rank has died or hung; ending this rank",
                      g_rank, idle / 1e3);
            _exit(1);
        }
        const char *doing = atomic_load(&g_doing);
        where_text(where);
        if (doing) {
            log_error("rank %d: no progress for %.0f s (train.comm_timeout_s) in %s, %s: a "
                      "corrupt file, or a disk that stopped; aborting the job",
                      g_rank, idle / 1e3, where, doing);
        } else if (marked && !waits) {
            log_error("rank %d: no progress for %.0f s (train.comm_timeout_s) in %s, waiting "
                      "for no peer: this rank itself is stuck (in its compute, a library, "
                      "the system or a disk); aborting the job", g_rank, idle / 1e3, where);
        } else {
            char what[256];
            waiting_text(what, sizeof what);
            log_error("rank %d: no progress for %.0f s (train.comm_timeout_s) in %s%s: %s; "
                      "aborting the job", g_rank, idle / 1e3, where, what,
                      g_world > 1 ? "a peer rank has died or hung" : "this rank has hung");
        }
        if (g_abort_all) g_abort_all();
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return NULL;
}

void watchdog_set_timeout(double timeout_s) { atomic_store(&g_timeout_ms, timeout_s * 1e3); }

void watchdog_set_step(atomic_long *step) {
    pthread_mutex_lock(&g_hooks); /* the counter of a run that ended is read no more */
    atomic_store(&g_step, step);
    pthread_mutex_unlock(&g_hooks);
}

/* the thread that set g_doing (gptc_core is linked statically: its thread-local storage
 * is read without a call, as a signal handler may) */
static _Thread_local volatile sig_atomic_t t_doing;

void watchdog_doing(const char *what) {
    atomic_store(&g_doing, what);
    t_doing = what != NULL;
    watchdog_beat();
}

const char *watchdog_doing_now(void) { return t_doing ? atomic_load(&g_doing) : NULL; }

void watchdog_finalizing(double teardown_s) {
    atomic_store(&g_finalizing, 1);
    /* the wait starts here; a hold for a peer's write of the last outputs stays, or is
     * lengthened to the peer's teardown */
    double now = timing_now_ms();
    atomic_store(&g_last_ms, now);
    if (atomic_load(&g_hold_until_ms) < now + teardown_s * 1e3)
        atomic_store(&g_hold_until_ms, now + teardown_s * 1e3);
}

int watchdog_start(double timeout_s, int rank) {
    watchdog_set_timeout(timeout_s);
    g_rank = rank;
    MPI_Comm_size(MPI_COMM_WORLD, &g_world);
    watchdog_beat();
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC); /* a tick is not a clock change */
    pthread_cond_init(&g_wake, &attr);
    pthread_condattr_destroy(&attr);
    atomic_store(&g_running, 1);
    static double started_ms; /* watch's first reading: set before, read after the create */
    started_ms = timing_now_ms();
    int e = pthread_create(&g_thread, NULL, watch, &started_ms);
    if (e) atomic_store(&g_running, 0);
    return e;
}

void watchdog_stop(void) {
    /* under g_hooks: a watch that has begun its check ends it (an abort) first */
    pthread_mutex_lock(&g_hooks);
    int was = atomic_exchange(&g_running, 0);
    pthread_cond_signal(&g_wake);
    pthread_mutex_unlock(&g_hooks);
    if (was) pthread_join(g_thread, NULL);
}
