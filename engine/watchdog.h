/* A dying or hung rank must not hang the others in a collective forever: a watchdog
 * thread on every rank aborts the whole job, naming this rank and what it waits in, when
 * nothing has completed for train.comm_timeout_s seconds: from MPI's start to its end on
 * a multi-rank run, over the start-up alone on a single rank (a corrupt input file).
 * "Completed" is any layer of compute (timing_set_context) or any communication op.
 * With NCCL the thread also polls the communicators' asynchronous errors, and aborts them
 * (ncclCommAbort) before it ends the job, so that no GPU stays spinning in a collective. */
#ifndef GPTC_WATCHDOG_H
#define GPTC_WATCHDOG_H

#include <stdatomic.h>

/* Seconds a device's start and its teardown (a CUDA context on a card without persistence
 * mode, cuBLASLt, NCCL, CUPTI) are held on top of train.comm_timeout_s, on every rank */
enum { WATCHDOG_DEVICE_S = 60 };

/* Marks progress; cheap enough to call per layer and per communication op. */
void watchdog_beat(void);
/* How many beats so far, watchdog or not (tests: that long work marks its progress) */
long watchdog_beats(void);
/* A wait of up to seconds that is not a hang: a write and fsync of rank 0's, sized by its
 * bytes, that every rank waits for, or a peer's reading of the inputs every rank reads,
 * which a cold cache or another node's disk makes slower than this rank's. The timeout
 * counts from its end, or from the first beat after it began (the wait is over), which
 * ends the hold. */
void watchdog_hold(double seconds);
/* The seconds watchdog_hold allows for moving bytes to or from a slow shared disk.
 * Test-only: GPTC_TEST_IO_RATE = bytes a second in place of that disk's. */
double watchdog_io_s(double bytes);
/* Test-only: GPTC_TEST_SLOW_READS = ms makes each read of a start-up check or checkpoint
 * load take that much longer (a cold cache, a slow disk), so that a test can make one
 * rank read slower than its peers */
void watchdog_test_slow_read(void);
/* Test-only: GPTC_TEST_SLOW_STEP = "s:ms" makes step s take ms longer on every rank (a first
 * step that loads and plans), so that a test can see the report name a slow step; a rank
 * that gets a stop signal goes on at once, so that a test can stop a run inside step s
 * however long the signal takes to come */
void watchdog_test_slow_step(long step);
/* Test-only: GPTC_TEST_STUCK_STEP = "r:s" makes rank r stop at step s for ever, neither
 * beating nor waiting for a peer (a library call that spins), so that a test can see
 * which rank names itself */
void watchdog_test_stuck_step(long step);
/* What the calling thread is about to wait in, for the message (a string literal or a
 * buffer that stays valid); NULL when it is done. Each thread has its own: the message
 * names every thread's. */
void watchdog_waiting(const char *what);
/* 1 while every wait of this rank for a peer is marked with watchdog_waiting (the CPU's
 * steps): a rank without progress that waits in none is then stuck itself and says so,
 * and a rank that waits gives such a peer a grace (a quarter of the timeout, at most 5 s)
 * to say it first. 0 (the default): whatever it waits in, a peer is blamed. */
void watchdog_waits_marked(int yes);
/* Starts the thread, as soon as MPI has started: a rank that hangs in the start-up (a
 * corrupt file the HDF5 library loops over, a config read from a FIFO no one writes) must
 * end the job as one in a step does. 0, or pthread_create's error number. */
int watchdog_start(double timeout_s, int rank);
/* train.comm_timeout_s, once the config is read (until then its default) */
void watchdog_set_timeout(double timeout_s);
/* The run's step counter, for the message ("in step s"); NULL or 0: "in the start-up" */
void watchdog_set_step(atomic_long *step);
/* What the main thread does where a hang or a crash would be the input's fault, for the
 * message ("reading train.init ck.h5": a string that stays valid), NULL when it is done;
 * a beat either way. */
void watchdog_doing(const char *what);
/* watchdog_doing's input when the calling thread set it, else NULL: a crash on another
 * thread (a loader's, OpenMP's) is not the input's (async-signal-safe) */
const char *watchdog_doing_now(void);
/* In MPI_Finalize, which waits for every rank: a timeout there ends this rank alone
 * (exit 1), as no job is left to abort. teardown_s on top of the timeout: a peer may
 * still be freeing its device (a context, communicators, the profiler's buffers). */
void watchdog_finalizing(double teardown_s);
void watchdog_stop(void);
/* For a device communication library whose ops run asynchronously (NCCL): poll returns a
 * message when a communicator has failed (checked every tick, from the watchdog thread),
 * abort_all makes every op in flight return. Either may be NULL. */
void watchdog_set_comm_hooks(const char *(*poll)(void), void (*abort_all)(void));

#endif
