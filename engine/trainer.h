/* The training run: resolve the model, open data and checkpoints, and step. */
#ifndef GPTC_TRAINER_H
#define GPTC_TRAINER_H

#include "engine/config.h"
#include "parallel/grid.h"

/* Runs the whole job. Returns the process exit code (0 on success); every failure has
 * already been reported as one line. */
int train_run(const gptc_config *cfg, const grid *g);
/* The start-up checks' verdict, called by every rank at the same point: 1 on every rank when
 * failed is nonzero on any, and then the lowest failing rank says err (naming itself unless
 * every rank failed: the cause may be its node's alone). */
int train_refused(int failed, const char *err, int rank, int world);
/* Test-only: GPTC_TEST_THREAD_FAIL=R:what makes rank R's start of what ("watchdog": its
 * thread; "lanes": the communication streams) fail as a thread limit (ulimit -u) does */
int train_test_thread_failure(const char *what, int rank);

#endif
