#include "parallel/grid.h"

#include <stdio.h>

int grid_layout(grid *g, int world, int rank, int tp, int pp, int dp, char *err, size_t errlen) {
    if (dp == 0) {
        if (world % (tp * pp) != 0) {
            snprintf(err, errlen, "parallel: world size %d is not a multiple of parallel.tp * parallel.pp = %d",
                     world, tp * pp);
            return -1;
        }
        dp = world / (tp * pp);
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
