/* The training run: resolve the model, open data and checkpoints, and step. */
#ifndef GPTC_TRAINER_H
#define GPTC_TRAINER_H

#include "engine/config.h"
#include "parallel/grid.h"

/* Runs the whole job. Returns the process exit code (0 on success); every failure has
 * already been reported as one line. */
int train_run(const gptc_config *cfg, const grid *g);
/* The start-up checks' verdict, called by every rank at the same point: 1 on every rank when
 * failed is nonzero on any, and then the lowest failing rank says err (naming itself when it
 * is not rank 0: the cause may be its node's alone). */
int train_refused(int failed, const char *err, int rank, int world);

#endif
