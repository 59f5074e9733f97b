/* A crash names its rank, and the input it was reading, before the rank ends. */
#ifndef GPTC_CRASH_SIGNAL_H
#define GPTC_CRASH_SIGNAL_H

/* Installs the handlers of SIGSEGV, SIGBUS, SIGILL and SIGFPE (after MPI_Init, whose
 * library installs its own, which then still runs). */
void crash_catch_signals(void);

#endif
