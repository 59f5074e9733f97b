/* The op table of another backend with every op timed (engine/timing.h) and an NVTX
 * range of its name; with timing off (profile.nvtx alone) only the ranges. */
#ifndef GPTC_TIMED_BACKEND_H
#define GPTC_TIMED_BACKEND_H

#include "engine/backend.h"

/* One timed table per process, wrapping inner. */
const gptc_backend *timed_backend(const gptc_backend *inner);

/* Where a non-finite value first appeared (train.nan_policy = stop with kernel timing). */
typedef struct {
    int found;
    const char *op;
    int layer, micro, phase;
    double when_ms;
} timing_finite_report;

/* While on, every op's output is scanned for NaN or Inf (slow: only to replay a step). */
void timed_backend_hunt(int on);
timing_finite_report timed_backend_first_nonfinite(void);

#endif
