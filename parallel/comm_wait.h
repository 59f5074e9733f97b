/* The communication's waits for other ranks, matched after the run (comm_wait.c). */
#ifndef GPTC_COMM_WAIT_H
#define GPTC_COMM_WAIT_H

#include "parallel/comm.h"

/* Sets the wait of every kept communication record on groups[0..n) (NULL, a group this
 * rank is not in, or one of one rank: skipped) and sums the waits into the timing's
 * kernel statistics and step summaries (timing_sum_waits). Collective over each group, so
 * every rank passes its groups in the same order (world, tp, pp, dp, embed); after the
 * clocks were aligned and before the report. */
void comm_match_waits(comm_group *const *groups, int n);

#endif
