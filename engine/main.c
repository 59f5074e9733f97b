/* gptc-train: mpirun -np N gptc-train CONFIG.ini [--section.key=value ...] */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/log.h"
#include "engine/trainer.h"
#include "parallel/grid.h"

static const char *USAGE =
    "usage: gptc-train [CONFIG.ini] [--section.key=value ...]\n"
    "Trains a GPT-2 model; launch under mpirun for several ranks. README.md says what each key\n"
    "does.\n";

int main(int argc, char **argv) {
    int provided, world, rank;
    ckpt_library_init();
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    log_set_rank(rank);

    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        if (rank == 0) {
            gptc_config defaults;
            config_defaults(&defaults);
            printf("%s\n# every key, with its default (model keys 0: from train.init)\n", USAGE);
            config_print(&defaults, stdout);
        }
        MPI_Finalize();
        return 0;
    }
    const char *path = argc > 1 && strncmp(argv[1], "--", 2) != 0 ? argv[1] : NULL;
    int first_override = path ? 2 : 1;

    /* Every rank parses the same inputs, so every rank reaches the same verdict and
     * exits with it; only rank 0 speaks. */
    char err[1024];
    gptc_config cfg;
    grid g;
    config_defaults(&cfg);
    int rc = config_load(&cfg, path, argc - first_override, argv + first_override, err, sizeof(err));
    if (rc == 0) rc = grid_layout(&g, world, rank, cfg.tp, cfg.pp, cfg.dp, err, sizeof(err));
    if (rc != 0) {
        if (rank == 0) log_error("%s", err);
        MPI_Finalize();
        return 1;
    }
    if (rank == 0) printf("gptc-train: %d rank(s), tp %d x pp %d x dp %d\n", world, g.tp, g.pp, g.dp);
    int code = train_run(&cfg, &g);
    MPI_Finalize();
    return code;
}
