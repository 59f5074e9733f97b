#define _POSIX_C_SOURCE 200809L
#include "engine/timing.h"

#include <time.h>

double timing_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}
