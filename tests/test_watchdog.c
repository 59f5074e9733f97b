/* watchdog_hold on 2 ranks, timeout 0.5 s. "hold": a hold of 3 s then 1.5 s without a beat
 * (rank 0 as in a long fsync, rank 1 as waiting for it) is not a hang, and the job exits
 * 0. "expire": a hold of 0.5 s then 3 s without a beat is one: the watchdog ends the job,
 * saying "no progress" (ctest expects that line). "ended": a hold of 30 s that a beat ends
 * at once (the wait was short), then 3 s without a beat: a hang, timed from the beat, not
 * from the hold's end. "waiting": "expire", where the main thread waits in one op and two
 * other threads in others, one of which ends its op: the line names the two still waiting
 * (ctest expects both names; one name shared by all threads was cleared by the first to
 * finish), and the step it was in (7). "doing": "expire" in the start-up while reading a
 * file (watchdog_doing): the line names the file (a corrupt file the HDF5 library loops
 * over). "finalize": rank 1 hangs (its watchdog stopped) before MPI_Finalize, which rank 0
 * has entered: rank 0 ends itself, saying MPI_Finalize waited (ctest expects it).
 * "teardown": rank 1 comes to MPI_Finalize 1.5 s after rank 0 (a device's teardown), which
 * waits with 3 s of teardown allowed: both exit 0. "stopped": rank 1 waits (no beat) and
 * is stopped (SIGSTOP) by rank 0 for 3 s, timeout 1.5 s, then woken and sent what it
 * waits for: time it did not run is no peer's hang, and both exit 0 (its watchdog
 * blamed a peer at once). "grace": every wait marked (watchdog_waits_marked), timeout 4 s:
 * rank 0 waits in an op without a beat for 4.5 s, within the 1 s grace that lets a peer
 * stuck outside communication name itself first, while rank 1 beats: both exit 0. Also
 * checks watchdog_io_s's rate. */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/watchdog.h"

static void sleep_s(double s) {
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&t, NULL);
}

/* a stream's op: waits in arg; the first ends its op, the second is still in it */
static void *op_thread(void *arg) {
    watchdog_waiting(arg);
    if (strcmp(arg, "allgather on dp") == 0) watchdog_waiting(NULL);
    return NULL;
}

int main(int argc, char **argv) {
    int provided = 0, rank = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int ended = argc > 1 && strcmp(argv[1], "ended") == 0;
    int waiting = argc > 1 && strcmp(argv[1], "waiting") == 0;
    int doing = argc > 1 && strcmp(argv[1], "doing") == 0;
    int finalize = argc > 1 && strcmp(argv[1], "finalize") == 0;
    int teardown = argc > 1 && strcmp(argv[1], "teardown") == 0;
    int expire = ended || waiting || doing || (argc > 1 && strcmp(argv[1], "expire") == 0);
    atomic_long step = waiting ? 7 : 0;
    double rate = 1e9 / watchdog_io_s(1e9); /* bytes a second */
    if (rate < 1e6 || rate > 1e9) {
        printf("FAIL: watchdog_io_s allows %.3g bytes/s, not a slow disk's rate\n", rate);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (watchdog_start(0.5, rank) != 0) {
        printf("FAIL: no watchdog thread\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    watchdog_set_step(&step);
    if (finalize) {
        if (rank == 1) { /* hung: no watchdog of its own to end the job */
            watchdog_stop();
            sleep_s(30.0);
        }
        watchdog_finalizing(0.0);
        MPI_Finalize();
        printf("FAIL: rank %d: MPI_Finalize returned, its peer hung\n", rank);
        return 1;
    }
    if (teardown) {
        if (rank == 1) { /* its own watchdog held through its slow teardown, as run_free
                          * holds a GPU's */
            watchdog_hold(3.0);
            sleep_s(1.5);
        }
        watchdog_finalizing(3.0);
        MPI_Finalize();
        watchdog_stop();
        printf("ok: rank %d: MPI_Finalize waited through its peer's teardown\n", rank);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "stopped") == 0) {
        watchdog_set_timeout(1.5);
        int pid = (int)getpid(), go = 1;
        if (rank == 1) {
            MPI_Send(&pid, 1, MPI_INT, 0, 0, MPI_COMM_WORLD);
            watchdog_beat();
            MPI_Recv(&go, 1, MPI_INT, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            watchdog_beat();
        } else {
            watchdog_hold(30.0);
            MPI_Recv(&pid, 1, MPI_INT, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            kill((pid_t)pid, SIGSTOP);
            sleep_s(3.0);
            kill((pid_t)pid, SIGCONT);
            sleep_s(0.3); /* its watchdog wakes first, as the launcher's kill sequence's */
            MPI_Send(&go, 1, MPI_INT, 1, 1, MPI_COMM_WORLD);
            watchdog_beat();
        }
        MPI_Barrier(MPI_COMM_WORLD);
        watchdog_stop();
        printf("ok: rank %d: a rank stopped for 3 s blamed no peer\n", rank);
        MPI_Finalize();
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "grace") == 0) {
        watchdog_set_timeout(4.0);
        watchdog_waits_marked(1);
        if (rank == 0) {
            watchdog_waiting("allreduce on tp");
            sleep_s(4.5);
            watchdog_waiting(NULL);
        } else {
            for (int i = 0; i < 45; i++) {
                sleep_s(0.1);
                watchdog_beat();
            }
        }
        watchdog_beat();
        MPI_Barrier(MPI_COMM_WORLD);
        watchdog_stop();
        printf("ok: rank %d: a wait of 4.5 s at a 4 s timeout, in its grace\n", rank);
        MPI_Finalize();
        return 0;
    }
    if (doing) watchdog_doing("reading train.init ck.h5");
    watchdog_hold(ended ? 30.0 : expire ? 0.5 : 3.0); /* hold: 2 s of slack for a loaded
                                                        * machine's scheduling */
    if (ended) watchdog_beat();
    if (waiting) {
        watchdog_waiting("host_allreduce on world");
        const char *ops[2] = {"allgather on dp", "reduce_scatter on dp"};
        for (int i = 0; i < 2; i++) { /* one after the other: their slots in this order */
            pthread_t t;
            if (pthread_create(&t, NULL, op_thread, (void *)ops[i]) == 0) pthread_join(t, NULL);
        }
    }
    sleep_s(expire ? 3.0 : 1.5);
    watchdog_beat();
    MPI_Barrier(MPI_COMM_WORLD);
    watchdog_stop();
    printf("%s: rank %d %s\n", expire ? "FAIL" : "ok", rank,
           expire ? "was not stopped after its hold ran out" : "held through 1.5 s without a beat");
    MPI_Finalize();
    return expire;
}
