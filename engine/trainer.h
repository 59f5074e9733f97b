/* The training run: resolve the model, open data and checkpoints, and step. */
#ifndef GPTC_TRAINER_H
#define GPTC_TRAINER_H

#include "engine/config.h"
#include "parallel/grid.h"

/* Runs the whole job. Returns the process exit code (0 on success); every failure has
 * already been reported as one line. */
int train_run(const gptc_config *cfg, const grid *g);

#endif
