/* gptc-train: mpirun -np N gptc-train CONFIG.ini [--section.key=value ...] */
#define _GNU_SOURCE /* dl_iterate_phdr, RTLD_NODELETE */
#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/checkpoint.h"
#include "engine/crash_signal.h"
#include "engine/config.h"
#include "engine/log.h"
#include "engine/output_files.h"
#include "engine/stop_signal.h"
#include "engine/trainer.h"
#include "engine/watchdog.h"
#include "parallel/grid.h"

/* comment lines, so that the --help output reads back as a config file */
static const char *USAGE =
    "# usage: gptc-train [CONFIG.ini] [--section.key=value ...]\n"
    "# Trains a GPT-2 model; launch under mpirun for several ranks. README.md says what each\n"
    "# key does.\n";

/* Nonzero, with err naming the first key, when this rank's effective configuration is not
 * rank 0's: ranks that trained with different settings would deadlock or diverge. */
static int differs_from_rank0(const gptc_config *c, int rank, int world, char *err, size_t n) {
    if (world == 1) return 0;
    char *mine = NULL, *theirs = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&mine, &len);
    if (!f) { /* the others are already in the broadcast: end them all */
        log_error("rank %d: out of memory for the configuration's text", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    config_print(c, f);
    fclose(f);
    long theirs_len = (long)len;
    MPI_Bcast(&theirs_len, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    theirs = rank == 0 ? mine : log_calloc((size_t)theirs_len + 1, 1, "rank 0's configuration");
    MPI_Bcast(theirs, (int)theirs_len, MPI_CHAR, 0, MPI_COMM_WORLD);
    int bad = 0;
    char section[64] = "";
    for (const char *a = mine, *b = theirs; *a || *b;) {
        size_t la = strcspn(a, "\n"), lb = strcspn(b, "\n");
        if (la != lb || memcmp(a, b, la) != 0) {
            snprintf(err, n, "config: %s%.*s here, but %s%.*s on rank 0 (give every rank the "
                     "same config file and arguments)", section, (int)la, a, section, (int)lb, b);
            bad = 1;
            break;
        }
        if (a[0] == '[' && la < sizeof(section) - 1)
            snprintf(section, sizeof(section), "%.*s.", (int)la - 2, a + 1);
        a += la + (a[la] != 0);
        b += lb + (b[lb] != 0);
    }
    if (theirs != mine) free(theirs);
    free(mine);
    return bad;
}

/* OpenMP's threads a rank (the CPU backend's, and the reference ops'): OMP_NUM_THREADS, if
 * set, must be a number from 1 to OMP_MAX, or a list of them (one a nesting level).
 * libgomp takes a bad value (an empty one too) with a warning of its own and runs with its
 * default, and a huge one crashed the run at its first parallel loop (it could not make
 * the threads). 0, or -1 with err. */
enum { OMP_MAX = 4096 };
static int check_omp_threads(char *err, size_t n) {
    const char *v = getenv("OMP_NUM_THREADS");
    if (!v) return 0;
    for (const char *p = v;;) {
        while (*p == ' ' || *p == '\t') p++;
        size_t digits = strspn(p, "0123456789");
        long x = digits > 0 && digits < 6 ? strtol(p, NULL, 10) : 0;
        p += digits;
        while (*p == ' ' || *p == '\t') p++;
        if (x < 1 || x > OMP_MAX || (*p && *p != ',')) {
            snprintf(err, n, "OMP_NUM_THREADS = %.64s: give a number of threads from 1 to %d "
                     "(or a list of them, one a nesting level)", v, OMP_MAX);
            return -1;
        }
        if (!*p++) return 0;
    }
}

/* dl_iterate_phdr's callback: the paths of the MPI library's loaded components (Open
 * MPI's mca_*.so) into the list arg; the loader's lock is held, so no dlopen here */
typedef struct {
    char *path[256];
    int n;
} loaded_list;

static int note_component(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    loaded_list *l = arg;
    const char *base = strrchr(info->dlpi_name, '/');
    if (base && strncmp(base, "/mca_", 5) == 0 && l->n < 256)
        l->path[l->n++] = strdup(info->dlpi_name);
    return 0;
}

/* Open MPI 4.1's progress thread can still run an event of a component that
 * MPI_Finalize has already unloaded (dlclose): a SIGSEGV at the end of a run that went
 * well, about one in 500 single-rank runs without mpirun on a loaded machine (a core:
 * the thread in libevent's event_base_loop calling into the unmapped component, while
 * the main thread's ess_singleton finalize joined it). Marked RTLD_NODELETE, the
 * components stay mapped to the process's end; other MPI libraries have no mca_*.so. */
static void keep_mpi_components_loaded(void) {
    loaded_list l = {{0}, 0};
    dl_iterate_phdr(note_component, &l);
    for (int i = 0; i < l.n; i++) {
        if (l.path[i]) dlopen(l.path[i], RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
        free(l.path[i]);
    }
}

/* Started without a launcher (a one-rank run), Open MPI 4 forks a daemon of its own for
 * services gptc never asks for (spawning processes, publishing names): 0.23 s of the
 * 0.32 s such a start took here, most of a run refused at its config. Isolated, it starts
 * in 0.09 s; without session directories too, as every isolated singleton takes the same
 * job name, and one's finalize removed the directory another was making (orte_init
 * failed). Under a launcher (mpirun, srun with PMI) nothing is set; nor a value the user
 * set. */
static void mpi_singleton_without_daemon(void) {
    static const char *launched[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof launched / sizeof *launched; i++)
        if (getenv(launched[i])) return;
    setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
    setenv("OMPI_MCA_orte_create_session_dirs", "0", 0);
}

/* MPI_Finalize waits for every rank: one that hung before it must not keep this one.
 * A GPU peer's teardown is held as its start was (trainer.c, run_free). */
static int finish(int code, const gptc_config *cfg) {
    watchdog_finalizing(strcmp(cfg->device, "cuda") == 0 ? WATCHDOG_DEVICE_S : 0.0);
    keep_mpi_components_loaded();
    MPI_Finalize();
    watchdog_stop();
    return code;
}

int main(int argc, char **argv) {
    int provided, world, rank;
    if (output_guard_std_fds() != 0) {
        /* its files would take the closed numbers: stdout's lines would go into one */
        fprintf(stderr, "gptc: error: descriptor 0, 1 or 2 is closed and /dev/null cannot be "
                "opened in its place\n");
        return EXIT_FAILURE;
    }
    stop_catch_signals();
    ckpt_library_init();
    mpi_singleton_without_daemon();
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    log_set_rank(rank);
    crash_catch_signals();
    /* watching from here, with train.comm_timeout_s's default until the config is read:
     * a rank whose config never comes (a FIFO) or whose start-up hangs ends the job too */
    char err[1024] = "";
    gptc_config cfg;
    config_defaults(&cfg);
    int wd = train_test_thread_failure("watchdog", rank) ? EAGAIN : watchdog_start(cfg.comm_timeout_s, rank);
    if (wd) snprintf(err, sizeof(err), "could not start the watchdog thread: %s", strerror(wd));
    if (train_refused(wd != 0, err, rank, world)) return finish(1, &cfg);
    /* stdout piped into a reader that goes away (| head, a closed ssh session's tee) ends
     * no run: the lines are lost, as to a closed stdout, while training, its checkpoints
     * and train.log_file go on */
    signal(SIGPIPE, SIG_IGN);
    /* past RLIMIT_FSIZE a write fails with EFBIG, which the outputs report in one line (the
     * signal killed the rank instead: no word, a torn metrics line, a temporary left) */
    signal(SIGXFSZ, SIG_IGN);

    int help = 0, help0;
    for (int i = 1; i < argc; i++)
        help |= strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0;
    /* a rank given --help alone (mpirun A : B) would leave the others waiting for it in
     * the config check: all print the help or none does */
    help0 = help;
    MPI_Bcast(&help0, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (help != help0)
        snprintf(err, sizeof(err), "--help %s (give every rank the same arguments)",
                 help ? "here, but not on rank 0" : "on rank 0, but not here");
    if (train_refused(help != help0, err, rank, world)) {
        return finish(1, &cfg);
    }
    if (help) {
        if (rank == 0) {
            gptc_config defaults;
            config_defaults(&defaults);
            printf("%s\n# every key, with its default. 0 means: for the model keys, from "
                   "train.init;\n# parallel.dp = world size / (tp * pp); train.micro_batch = "
                   "global_batch / dp;\n# train.seq_len = model.n_ctx\n", USAGE);
            config_print(&defaults, stdout);
        }
        return finish(0, &cfg);
    }
    const char *path = argc > 1 && strncmp(argv[1], "--", 2) != 0 ? argv[1] : NULL;
    int first_override = path ? 2 : 1;

    /* Every rank parses its own inputs. They should be the same, but a launcher may give
     * each rank its own (mpirun A : B, a pipe only one rank reads): a rank refused alone
     * reports, and every rank exits with it. */
    grid g;
    int rc = check_omp_threads(err, sizeof(err));
    if (rc == 0 && path && output_names_closed_std(path)) {
        /* /dev/null stands in for it: the config would read as empty, all defaults */
        snprintf(err, sizeof(err), "config %s: stdin was closed when the run started", path);
        rc = -1;
    }
    /* a config read from a terminal or a FIFO takes its writer's time, which is no hang of
     * this rank's: held until it is read (a peer that waits for it is timed) */
    watchdog_hold(INFINITY);
    if (rc == 0) rc = config_load(&cfg, path, argc - first_override, argv + first_override, err, sizeof(err));
    watchdog_beat();
    if (rc == 0) watchdog_set_timeout(cfg.comm_timeout_s);
    if (rc == 0) rc = grid_layout(&g, world, rank, cfg.tp, cfg.pp, cfg.dp, err, sizeof(err));
    if (train_refused(rc != 0, err, rank, world) ||
        train_refused(differs_from_rank0(&cfg, rank, world, err, sizeof(err)), err, rank, world)) {
        return finish(1, &cfg);
    }
    if (rank == 0) printf("gptc-train: %d rank(s), tp %d x pp %d x dp %d\n", world, g.tp, g.pp, g.dp);
    return finish(train_run(&cfg, &g), &cfg);
}
