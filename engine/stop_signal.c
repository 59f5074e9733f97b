/* The stop signals: a request to finish the step in flight, save and exit 0 (README,
 * "Running"). The handlers only note the request; the trainer looks at it between steps. */
#define _POSIX_C_SOURCE 200809L
#include "engine/stop_signal.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* SIGINT, SIGTERM (a user's Ctrl-C, a batch system's time limit), SIGUSR1, SIGUSR2 (Slurm's
 * --signal=USR1@60, sent ahead of the limit for a checkpoint) and SIGHUP (a closed
 * terminal or ssh session; left ignored when the run inherits it ignored, as under nohup):
 * finish the step in flight, write a checkpoint when train.save is set, and exit 0 on
 * every rank. Their default action ended the rank with no checkpoint.
 * A rank blocked where the flag is not looked at (its config read from a terminal or a
 * FIFO, a write to a stdout nobody reads, a library's start that never returns) would
 * never stop: a stop signal FORCE_AFTER_MS or more after the first takes the
 * signal's default action (the rank ends, mpirun ends the others). One sooner is the same
 * request delivered twice: a terminal's Ctrl-C reaches the ranks and mpirun forwards it.
 * And one stop signal in the start-up, before the ranks agree on it at step 1, ends the
 * rank the same way when that point is not reached within START_GRACE_S (a `timeout` or a
 * batch system sends one signal; a rank stuck in its start-up would outlive it). */
enum { FORCE_AFTER_MS = 3000 };
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "the stop handler needs a lock-free atomic");
static volatile sig_atomic_t g_stop_signal = 0;
/* CLOCK_MONOTONIC ms of the first (0: none yet): set once, by compare-and-swap, so that
 * two threads taking signals at once agree which came first, and a later one reads it */
static _Atomic long long g_stop_at_ms = 0;
enum { START_GRACE_S = 20 };
static unsigned g_start_grace_s = START_GRACE_S; /* GPTC_TEST_STOP_GRACE_S in the tests */
static volatile sig_atomic_t g_started = 0;      /* 1 from the agreement before step 1 */

/* Ends the process by sig's default action, after the line msg[len] on stderr */
static void end_by_signal(int sig, const char *msg, size_t len) {
    ssize_t unused = write(STDERR_FILENO, msg, len);
    (void)unused;
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    raise(sig); /* pending until the handler returns, then the default action */
}

/* SIGALRM, armed by a stop signal in the start-up */
static void on_start_grace_over(int unused) {
    (void)unused;
    static const char msg[] = "gptc: a stop signal in the start-up, which has not ended "
                              "since: ending now\n";
    if (!g_started && g_stop_signal) end_by_signal(g_stop_signal, msg, sizeof msg - 1);
}

static void on_stop_signal(int sig) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long now = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + 1, first = 0;
    if (atomic_compare_exchange_strong(&g_stop_at_ms, &first, now)) {
        g_stop_signal = sig;
        if (!g_started) alarm(g_start_grace_s);
        return;
    }
    if (now - first < FORCE_AFTER_MS) return;
    static const char msg[] = "gptc: a second stop signal: ending now, without finishing the "
                              "step or writing a checkpoint\n";
    end_by_signal(sig, msg, sizeof msg - 1);
}

static const int STOP_SIGNALS[] = {SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGHUP};
enum { N_STOP_SIGNALS = sizeof STOP_SIGNALS / sizeof STOP_SIGNALS[0] };

void stop_catch_signals(void) {
    struct sigaction sa, was;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART; /* a read or write in flight goes on: the flag is looked at later */
    sigset_t stop;
    sigemptyset(&stop);
    for (int i = 0; i < N_STOP_SIGNALS; i++) sigaddset(&stop, STOP_SIGNALS[i]);
    sa.sa_mask = stop; /* the handler is not re-entered by another of them */
    for (int i = 0; i < N_STOP_SIGNALS; i++) {
        int sig = STOP_SIGNALS[i];
        if (sig == SIGHUP && sigaction(sig, NULL, &was) == 0 && was.sa_handler == SIG_IGN)
            continue; /* nohup: a hangup is to go unnoticed */
        sigaction(sig, &sa, NULL);
    }
    const char *grace = getenv("GPTC_TEST_STOP_GRACE_S");
    if (grace && atoi(grace) > 0) g_start_grace_s = (unsigned)atoi(grace);
    struct sigaction alrm;
    memset(&alrm, 0, sizeof alrm);
    alrm.sa_handler = on_start_grace_over;
    alrm.sa_flags = SA_RESTART;
    alrm.sa_mask = stop;
    sigaction(SIGALRM, &alrm, NULL);
    /* a launcher may pass them on blocked: they then stayed pending to the last step. Before
     * MPI starts its threads, which inherit this mask */
    sigaddset(&stop, SIGALRM);
    sigprocmask(SIG_UNBLOCK, &stop, NULL);
}

const char *stop_signal_name(void) {
    switch (g_stop_signal) {
    case SIGINT: return " (SIGINT)";
    case SIGTERM: return " (SIGTERM)";
    case SIGUSR1: return " (SIGUSR1)";
    case SIGUSR2: return " (SIGUSR2)";
    case SIGHUP: return " (SIGHUP)";
    default: return "";
    }
}

int stop_requested(void) { return g_stop_signal != 0; }

void stop_startup_over(void) {
    g_started = 1;
    alarm(0); /* the start-up grace: this is the point it waited for */
}
