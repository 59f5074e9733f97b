/* train.log_file: one JSON object per optimizer step (DESIGN section 4, "Metrics"),
 * written by rank 0. */
#ifndef GPTC_METRICS_LOG_H
#define GPTC_METRICS_LOG_H

#include <stdio.h>

#include "engine/power.h"

/* Opens path for the steps first.. of this run. A resumed run (first > 1) goes on after
 * its checkpoint's step: lines of steps >= first, written by a run that went further
 * before it stopped, are dropped, and the new ones are appended. NULL with err on failure,
 * naming train.log_file. */
FILE *metrics_open(const char *path, long first, char *err, size_t n);

/* One step's line; a number that is not finite is written as null (JSON has no NaN), a
 * step whose update was skipped says "skipped": true, and power (NULL when profile.power
 * is off) adds energy_j, power_w and sm_clock_mhz. 0, or -1 (errno set) when it could not
 * be written (a full disk): then none of it is in the file, which stays one JSON object a
 * line. f is written with write(2), not through its stdio buffer. */
int metrics_write(FILE *f, long step, double loss, double grad_norm, double lr, double iter_ms,
                  double tokens_per_s, int skipped, const power_sample *power);

#endif
