#include "parallel/grid.h"

#include <mpi.h>
#include <stdio.h>

int grid_layout(grid *g, int world, int rank, int tp, int pp, int dp, char *err, size_t errlen) {
    /* in long: tp and pp may each be up to 2^16, and their int product wraps */
    long tpp = (long)tp * pp;
    if (dp == 0) {
        if (world % tpp != 0) {
            snprintf(err, errlen, "parallel: world size %d is not a multiple of parallel.tp * parallel.pp = %ld",
                     world, tpp);
            return -1;
        }
        dp = (int)(world / tpp);
    }
    if ((long)tp * pp * dp != world) {
        snprintf(err, errlen, "parallel: world size %d != parallel.tp * parallel.pp * parallel.dp = %d * %d * %d",
                 world, tp, pp, dp);
        return -1;
    }
    g->world = world;
    g->rank = rank;
    g->tp = tp;
    g->pp = pp;
    g->dp = dp;
    g->tp_rank = rank % tp;
    g->dp_rank = (rank / tp) % dp;
    g->pp_rank = rank / (tp * dp);
    return 0;
}

int grid_rank_of(const grid *g, int tp_rank, int pp_rank, int dp_rank) {
    return tp_rank + g->tp * (dp_rank + g->dp * pp_rank);
}

int grid_first_failing(int failed, int rank, int world, int *all) {
    int v[2] = {failed ? rank : world, failed != 0}; /* both the least over the ranks */
    if (world > 1) MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all) *all = v[1];
    return v[0];
}
