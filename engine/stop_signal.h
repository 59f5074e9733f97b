/* Stop signals (SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGHUP): every rank finishes the step
 * in flight, writes a checkpoint when train.save is set, and exits 0. */
#ifndef GPTC_STOP_SIGNAL_H
#define GPTC_STOP_SIGNAL_H

/* Installs the handlers: called first thing, as a batch system's signal may come while
 * MPI starts or a large train.init loads, which killed the rank outright. */
void stop_catch_signals(void);
/* 1 once this rank got a stop signal (the ranks agree on it at each step's end). */
int stop_requested(void);
/* The start-up is over (the ranks agreed before step 1): a stop signal from here on waits
 * for the step's end, with no start-up grace. */
void stop_startup_over(void);
/* " (SIGTERM)" for the stop signal this rank got, "" when another rank got it. */
const char *stop_signal_name(void);

#endif
