/* The op table of another backend with every op timed (engine/timing.h). */
#ifndef GPTC_TIMED_BACKEND_H
#define GPTC_TIMED_BACKEND_H

#include "engine/backend.h"

/* One timed table per process, wrapping inner. */
const gptc_backend *timed_backend(const gptc_backend *inner);

#endif
