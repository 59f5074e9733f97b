/* Clocks for step timing. Per-kernel records, the report and the trace build on this. */
#ifndef GPTC_TIMING_H
#define GPTC_TIMING_H

/* Monotonic wall clock in milliseconds. */
double timing_now_ms(void);

#endif
