/* The process grid: world = tp x pp x dp in Megatron order, TP ranks consecutive:
 * rank = tp_rank + tp * (dp_rank + dp * pp_rank). */
#ifndef GPTC_GRID_H
#define GPTC_GRID_H

#include <stddef.h>

typedef struct {
    int world, rank;
    int tp, pp, dp;
    int tp_rank, pp_rank, dp_rank;
} grid;

/* Fills g for this rank; dp = 0 means world / (tp*pp). Refuses a world that is not
 * tp*pp*dp with a one-line error naming the keys. */
int grid_layout(grid *g, int world, int rank, int tp, int pp, int dp, char *err, size_t errlen);
int grid_rank_of(const grid *g, int tp_rank, int pp_rank, int dp_rank);
/* The lowest rank of MPI_COMM_WORLD whose failed is nonzero, or world when none; with
 * *all (when not NULL) 1 when every rank failed. Every rank calls it at the same point of
 * its start-up checks: a rank that fails one alone (a file its node lacks, arguments of
 * its own) stops every rank there, instead of leaving them waiting for it in the next
 * collective. */
int grid_first_failing(int failed, int rank, int world, int *all);

#endif
