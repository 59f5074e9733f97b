/* Op timing with CUDA events, the fallback when CUPTI is not available (timer_cupti.c):
 * an op is two timing-enabled events recorded on its stream around its launches, so its
 * interval also covers the time its kernels waited behind earlier work on that stream, and
 * kernels it launches on other streams (NCCL's own) are not seen. Times come from the
 * device clock as elapsed time since an origin event recorded at the step's start, when
 * the device is idle: the host clock read right after that event completed anchors the
 * device clock to timing_now_ms(). Events are pooled and reused step after step. */
#include "engine/cuda/cuda_internal.h"

#include "engine/timing.h"

#include <stdlib.h>

static struct {
    cudaEvent_t origin;
    double origin_ms;    /* timing_now_ms() when origin completed */
    cudaEvent_t *events; /* [cap] the pool: op k of this step owns events 2k and 2k+1 */
    int used, cap;
} g;

static cudaEvent_t new_event(void) {
    cudaEvent_t e;
    cuda_check(cudaEventCreate(&e), "cudaEventCreate (timer)");
    return e;
}

void event_timer_reset(void) {
    if (!g.origin) g.origin = new_event();
    /* the host clock first: the device is idle, so the origin completes at once; read
     * after the synchronize, the host's wake-up would push every time of the step later */
    g.origin_ms = timing_now_ms();
    cuda_check(cudaEventRecord(g.origin, cuda_stream_of(NULL)), "cudaEventRecord (timer)");
    cuda_check(cudaEventSynchronize(g.origin), "cudaEventSynchronize (timer)");
    g.used = 0;
}

int event_timer_begin(gptc_stream *s) {
    if (g.used + 2 > g.cap) {
        int cap = g.cap ? 2 * g.cap : 2048;
        cudaEvent_t *p = realloc(g.events, (size_t)cap * sizeof *p);
        if (!p) cuda_check(cudaErrorMemoryAllocation, "timer event pool");
        for (int i = g.cap; i < cap; i++) p[i] = new_event();
        g.events = p;
        g.cap = cap;
    }
    int op = g.used / 2;
    g.used += 2;
    cuda_check(cudaEventRecord(g.events[2 * op], cuda_stream_of(s)), "cudaEventRecord (timer)");
    return op;
}

void event_timer_end(int op, gptc_stream *s) {
    cuda_check(cudaEventRecord(g.events[2 * op + 1], cuda_stream_of(s)), "cudaEventRecord (timer)");
}

int event_timer_read(int op, double *start_ms, double *end_ms) {
    float a = 0, b = 0;
    if (cudaEventQuery(g.events[2 * op + 1]) != cudaSuccess) { /* not reached (yet) */
        (void)cudaGetLastError();
        return -1;
    }
    cuda_check(cudaEventElapsedTime(&a, g.origin, g.events[2 * op]), "cudaEventElapsedTime");
    cuda_check(cudaEventElapsedTime(&b, g.origin, g.events[2 * op + 1]), "cudaEventElapsedTime");
    *start_ms = g.origin_ms + a;
    *end_ms = g.origin_ms + b;
    return 0;
}
