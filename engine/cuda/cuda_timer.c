/* The CUDA backend's device timer (per-kernel timing with CUDA events; engine/backend.h).
 * A mark is a timing-enabled event recorded on a stream. Times come from the device clock
 * as elapsed time since an origin event recorded at the step's start, when the device is
 * idle: the host clock read right after that event completed anchors the device clock to
 * timing_now_ms(). Events are pooled and reused step after step. */
#include "engine/cuda/cuda_internal.h"

#include "engine/timing.h"

#include <stdlib.h>

static struct {
    cudaEvent_t origin;
    double origin_ms;    /* timing_now_ms() when origin completed */
    cudaEvent_t *events; /* [cap] the pool; marks 0..used-1 hold this step's */
    int used, cap;
} g;

static cudaEvent_t new_event(void) {
    cudaEvent_t e;
    cuda_check(cudaEventCreate(&e), "cudaEventCreate (timer)");
    return e;
}

void cuda_timer_reset(void) {
    if (!g.origin) g.origin = new_event();
    cuda_check(cudaEventRecord(g.origin, cuda_stream_of(NULL)), "cudaEventRecord (timer)");
    cuda_check(cudaEventSynchronize(g.origin), "cudaEventSynchronize (timer)");
    g.origin_ms = timing_now_ms();
    g.used = 0;
}

int cuda_timer_mark(gptc_stream *s) {
    if (g.used == g.cap) {
        int cap = g.cap ? 2 * g.cap : 1024;
        cudaEvent_t *p = realloc(g.events, (size_t)cap * sizeof *p);
        if (!p) cuda_check(cudaErrorMemoryAllocation, "timer event pool");
        for (int i = g.cap; i < cap; i++) p[i] = new_event();
        g.events = p;
        g.cap = cap;
    }
    cuda_check(cudaEventRecord(g.events[g.used], cuda_stream_of(s)), "cudaEventRecord (timer)");
    return g.used++;
}

double cuda_timer_read(int mark) {
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, g.origin, g.events[mark]), "cudaEventElapsedTime");
    return g.origin_ms + ms;
}
