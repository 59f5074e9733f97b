/* Test tool, not part of the engine: a CPU emulator of the CUDA execution model, just
 * enough to run the kernels of engine/cuda/ (the .cu files) without a GPU, so that the
 * test suite checks them on every run (tests/test_cuda_ops.c as test_cuda_ops_emu, and
 * tests/cuda_emu/test_cuda_emu.c) and so that the real host code of engine/cuda/ trains
 * on it (gptc-train-emu; fake_runtime.c is the rest of the CUDA runtime: memory, streams,
 * events, copies).
 *
 * How: xform.py rewrites each .cu file's launches (kernel<<<...>>>(args)) and
 * `extern __shared__` arrays into plain C++, cuda_runtime.h supplies the built-ins, and
 * this file runs a launch. Every CUDA thread of a block is a fiber (so it has its own
 * registers and stack, as on the GPU) and all blocks of the grid run in turn on those
 * same fibers, on the one host thread that runs the grid: a fiber runs until it reaches
 * a barrier, then the next one runs. __syncthreads is a barrier of the block's fibers, a
 * warp shuffle an exchange through per-thread slots around a barrier of the warp's 32,
 * a warp-collective mma.sync (emu_mma.h) the same with every lane's fragments, atomicAdd
 * a relaxed atomic. A switch between fibers costs nanoseconds (it was a futex wake and
 * an OS context switch when CUDA threads were host threads, 20 to 30 times slower on the
 * training runs of gptc-train-emu). Linux only (glibc's ucontext where the switch is not
 * this file's own assembly: x86-64 has it).
 * A launch is checked (configuration, shared memory) when it is made, on the launching
 * thread, whose cudaGetLastError then reports it, as in CUDA. It runs in its stream's
 * order on the stream's thread (fake_runtime.c), so the host goes on at once; on the NULL
 * stream it runs before the launch returns. Grids run one at a time (a device lock), so
 * shared memory and barriers are those of one kernel; kernels that talk to the host
 * through pinned memory (HOST_FLAG_KERNELS below: the engine's wait_flag_kernel, which
 * spins until a host thread bumps a counter, and set_flag_kernel) instead run on their
 * stream's thread beside the others, one thread, as they would spin on an SM of their own.
 *
 * What it catches:
 *  - wrong results: indexing, masking, tails of sizes that are not multiples of a tile,
 *    a warp or a vector width; grid-stride loops and multi-block reductions (the device
 *    has 2 multiprocessors, GPTC_EMU_SM=n to change, so grids are small and loop);
 *  - elements a kernel never writes (the test poisons outputs with NaN), and shared
 *    memory read before the block wrote it (it is refilled with 0xff bytes, a NaN, before
 *    every block, for __shared__ and dynamic shared memory alike);
 *  - a __syncthreads or shuffle that not every thread of the block (warp) reaches, at
 *    once: a thread that arrives at another barrier than the ones waiting there, or
 *    every live thread waiting with no barrier able to complete (a message, then abort);
 *  - cp.async misuse: a read of the destination before the wait that covers its group
 *    (the destination holds NaN until then), and copies a thread never waits for;
 *  - launch configuration errors (block size, grid, dynamic shared memory above 48 KiB
 *    without cudaFuncSetAttribute, or above the opt-in limit, 227 KiB or
 *    GPTC_EMU_SMEM_OPTIN_KB), as cudaGetLastError reports them;
 *  - under GPTC_SANITIZE=address: out-of-bounds reads and writes of global memory (each
 *    buffer is its own heap block) and of dynamic shared memory (allocated at the exact
 *    size the launch asked for), misaligned float4 accesses (UBSan), undefined behaviour
 *    in kernel code. The kernels are instrumented, this file is not (as under TSan): what
 *    it does on a kernel's behalf with the kernel's memory (cp.async's copies, a warp's
 *    gathers) goes through memcpy and memset, which ASan's interceptors check, and the
 *    rest is its own bookkeeping (fibers, barriers, slots), whose checks (and -O1) took
 *    a seventh of an ASan emulated training run;
 *  - under GPTC_SANITIZE=thread, races within a block and between blocks (racecheck,
 *    below): TSan reports two accesses to the same memory, one a write, by threads that
 *    no barrier orders (of a block) or by different blocks, not both atomicAdd, whatever
 *    order the emulator ran them in.
 * What it cannot catch:
 *  - races in the other builds. Within a block, each
 *    warp in turn runs up to the next __syncthreads, upwards through the warps in one
 *    pass and downwards in the next (run_fibers), so a missing barrier between a write
 *    of shared memory and a read by another warp shows (the read gets NaN, or a
 *    cp.async's poison) in the passes where the reader runs first, and a refill that
 *    does not wait for the readers of the old contents in the passes where the writer
 *    does: deterministic, but not every pattern.
 *    Between blocks there is no concurrency at all: blocks run one after another, so a
 *    plain += where blocks collide (and atomicAdd is needed) passes; nor between kernels
 *    of different streams (one grid at a time), in any build;
 *  - memory-model and warp-synchronous bugs, outside the racecheck: every access is a
 *    host access ordered by the barriers, and the lanes of a warp are independent threads
 *    that meet only at shuffles and __syncwarp (full mask only), so code relying on
 *    lockstep execution is neither emulated nor reliably exposed;
 *  - timing, occupancy, register or shared memory pressure, bank conflicts;
 *  - exact device arithmetic: expf, tanhf, ... are the host's, and contraction into FMA
 *    follows the host compiler, so results agree with the GPU only to rounding.
 * Limits: 1-D blocks, 1-, 2- or 3-D grids, full-warp shuffles of float and double, full-warp
 * mma.sync m16n8k16 bf16 with fp32 accumulators (summed in double here), full-warp
 * ldmatrix .x4 (and .trans), 16-byte cp.async with its commit groups; anything
 * else stops with a message (or does not compile), and cuda_runtime.h is where to add it.
 * A test tool can hide bugs of its own: tests/test_cuda_ops.c on a real GPU remains the
 * reference check of the kernels. */
#define _GNU_SOURCE /* MAP_NORESERVE */

#include "cuda_runtime.h"
#include "emu_internal.h"
#include "engine/bf16.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#define EMU_MAX_THREADS 1024          /* threads per block */
#define EMU_MAX_GRID_Y 65535         /* and z, as on a GPU */
#define EMU_SMEM_DEFAULT (48 * 1024)  /* dynamic shared memory without an opt-in */

__thread emu_uint3 emu_thread_idx, emu_block_idx;
/* per thread: the CUDA threads of the grid that runs and a host-waiting kernel running
 * beside it on its stream's thread each see their own launch */
__thread emu_uint3 emu_block_dim, emu_grid_dim;
__thread void *emu_dyn_smem;

static __thread int in_kernel; /* 1 on the emulated CUDA threads */
static __thread const char *kernel_name; /* of the kernel this thread runs */

/* The grid that runs (one at a time: device_mu). */
static pthread_mutex_t device_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    const char *name;
    emu_body_fn body;
    void *ctx;
    emu_uint3 grid, block;
    void *smem; /* [smem_bytes] dynamic shared memory */
    size_t smem_bytes;
} cur;

/* ------------------------------------------------------------------ failures */

void emu_fail(const char *msg) {
    if (in_kernel)
        fprintf(stderr, "cuda_emu: %s, block (%u,%u,%u), thread %u: %s\n", kernel_name,
                emu_block_idx.x, emu_block_idx.y, emu_block_idx.z, emu_thread_idx.x, msg);
    else
        fprintf(stderr, "cuda_emu: %s\n", msg);
    fflush(stderr);
    abort();
}

/* ------------------------------------------------------------------ fibers */

/* Every CUDA thread of the grid that runs is a fiber: its own stack and registers, run on
 * the thread that runs the grid (the stream's) until it reaches a barrier, where it
 * hands the CPU to the next fiber in the scheduler's order (run_block; to the scheduler
 * itself only at the end of a pass over the block's warps). A switch (emu_ctx) is a few
 * nanoseconds (ucontext's swapcontext makes a system call each time, a hundred times
 * that, and a futex wake of a real thread costs more still). A fiber lives as long as the
 * process, started once (making a fiber's start afresh for every thread of every grid took
 * two system calls, a fifth of an emulated training run's time); between grids it waits
 * in fiber_main for the next one. Under a sanitizer every switch is announced to it
 * (ASan's and TSan's fiber API). */
#if defined(__SANITIZE_THREAD__)
#error "build emu_runtime.c uninstrumented, with -DEMU_RACECHECK (racecheck below)"
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#error "build emu_runtime.c uninstrumented, with -DEMU_RACECHECK (racecheck below)"
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#error "build emu_runtime.c uninstrumented, with -DEMU_ASAN (what it catches, above)"
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#error "build emu_runtime.c uninstrumented, with -DEMU_ASAN (what it catches, above)"
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/asan_interface.h>
#endif
#ifdef EMU_RACECHECK
#include <sanitizer/tsan_interface.h>
#define EMU_TSAN 1
/* TSan's dynamic annotations (exported by its runtime, declared in no header) */
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);
#endif

/* A context to switch to (a fiber's, or the scheduler's: the host thread that runs the
 * grid), and the switch (ctx_switch, below).
 * On x86-64 the switch is a function of its own in assembly (emu_ctx_switch): it pushes
 * the callee-saved registers, swaps the stack pointer, pops the other context's and
 * returns into it. A call and its return stay paired, so the CPU predicts the return
 * (the lanes of a warp switch from the same call site to the same call site): 7 to 8 ns a
 * switch against 45 to 55 for a setjmp/longjmp pair, which leaves the call to the
 * jumping function unreturned and every return after a switch mispredicted (measured on
 * a ring of 32 fibers; the shuffles' switches were most of an emulated training run).
 * The floating-point control words are not switched: nothing that runs on the fibers
 * changes them. A fiber's first switch returns into emu_ctx_boot, which calls fiber_main.
 * Elsewhere (or with EMU_PORTABLE_SWITCH) the compiler's __builtin_setjmp /
 * __builtin_longjmp, not libc's _setjmp / _longjmp: those save the signal mask's flag and
 * unwind the thread's cancellation handlers on every jump (a tenth of an emulated
 * training run), and both sanitizers intercept them (ASan unpoisons the whole stack on
 * every _longjmp, where a switch leaves no frame behind for it to clean; TSan checks each
 * jump against its own record of the thread's setjmps, which a jump to another fiber's
 * stack fails); a fiber's first start is ucontext's makecontext/setcontext. */
#if defined(__x86_64__) && !defined(EMU_PORTABLE_SWITCH)
#define EMU_ASM_SWITCH 1
typedef struct emu_ctx {
    void *sp; /* its stack pointer while switched out (the callee-saved registers there) */
} emu_ctx;
#else
typedef void *emu_jmp_buf[5];
typedef struct emu_ctx {
    emu_jmp_buf resume; /* where it goes on (after its first start) */
    ucontext_t *start;  /* a fiber's first start */
    int started;
} emu_ctx;
#endif

/* What a thread waits at; a barrier's waiters must all wait at the same kind. */
enum { AT_SYNCTHREADS, AT_SHUFFLE, AT_BLOCK_END, AT_SYNCWARP };
static const char *const at_name[] = {"__syncthreads", "a warp shuffle", "the end of its block",
                                      "__syncwarp"};

typedef struct barrier {
    unsigned int first, count; /* its threads: first .. first + count - 1 */
    unsigned int arrived;
    int at; /* the kind the first arrival waits at */
    unsigned int gen; /* completions so far */
    char sync[2];     /* racecheck: sync objects of its even and odd completions */
} barrier;

/* F_PARKED: done with its block, until the scheduler gives it the next (or ends the grid);
 * F_DONE: done with its grid, until a later grid starts it again */
enum { F_RUN, F_WAIT, F_PARKED, F_DONE };

/* One pending cp.async: n bytes to dst, the first valid from src and the rest zero,
 * in commit group `group` */
typedef struct cp_async_copy {
    void *dst;
    const void *src;
    unsigned int n, valid, group;
} cp_async_copy;

/* Small (the scheduler reads every fiber's state after each pass), with what a switch
 * touches first. */
typedef struct fiber {
    emu_ctx ctx;
    char *stack;         /* [EMU_FIBER_STACK], below it a guard page */
    unsigned int tid;
    emu_uint3 block_idx;
    unsigned int parity; /* shuffle slot set */
    int state;
    int grid_over;       /* F_PARKED: leave the grid instead of running another block */
    barrier *waiting;    /* F_WAIT: the barrier it waits at */
    /* its cp.async copies not waited for yet (emu_cp_async): made at cp.async.wait_group */
    struct cp_async_copy *cp;
    unsigned int cp_n, cp_cap, cp_groups; /* pending, allocated, groups committed so far */
#ifdef EMU_ASAN
    void *fake_stack;
#endif
#ifdef EMU_TSAN
    void *tsan;
#endif
} fiber;

#ifdef EMU_ASAN
#define EMU_FIBER_STACK (1024 * 1024) /* ASan's redzones make frames several times larger */
#else
#define EMU_FIBER_STACK (256 * 1024)
#endif

/* Two sets of fibers, each a block's threads: a block runs on the set of its colour on a
 * checkerboard of the grid, so neighbouring blocks never share a fiber (a fiber's stack and
 * its TSan identity, see racecheck below); within a set, each block turns the threads one
 * fiber further, so that its thread t is not on the fiber of thread t of the block before. */
#define EMU_SETS 2
static fiber *fibers;    /* [EMU_SETS][EMU_MAX_THREADS], stacks made as needed */
static unsigned int fibers_made[EMU_SETS];
static fiber *block_threads[EMU_MAX_THREADS]; /* [block.x] the fiber of each thread */
static fiber *running;   /* the fiber on the CPU, NULL: the scheduler */
static emu_ctx sched_ctx;
#ifdef EMU_ASAN
static void *sched_fake_stack;
static const void *sched_stack_bottom;
static size_t sched_stack_size;
static int from_sched; /* the switch that is made comes from the scheduler (to_fiber_end) */
#endif
#ifdef EMU_TSAN
static void *sched_tsan;
#endif

static barrier block_barrier;                      /* all threads of the block */
static barrier warp_barrier[EMU_MAX_THREADS / 32]; /* the threads of each warp */
static double warp_slot[2][EMU_MAX_THREADS];       /* shuffle values, 2 sets */
/* gather values (emu_warp_gather), 2 sets; the set alternates with the same parity as the
 * shuffles', so any sequence of shuffles and gathers keeps the argument below */
typedef unsigned char gather_slot[EMU_GATHER_MAX];
static gather_slot warp_blob[2][EMU_MAX_THREADS];

static void barrier_init(barrier *b, unsigned int first, unsigned int count) {
    b->first = first;
    b->count = count;
    b->arrived = 0;
    b->at = -1;
    b->gen = 0;
}

/* ------------------------------------------------------------------ racecheck
 * Under ThreadSanitizer (GPTC_SANITIZE=thread) the emulator checks the kernels for races,
 * within a block as compute-sanitizer's racecheck does on a GPU, and between blocks (which
 * compute-sanitizer does not check): TSan sees every memory access of the kernel code (the
 * xform'ed .cu files are instrumented), and the only order between CUDA threads is the one
 * CUDA gives:
 *  - a switch between fibers carries no order (__tsan_switch_to_fiber_no_sync), and this
 *    file, whose bookkeeping every thread touches, is not instrumented;
 *  - __syncthreads (and __syncwarp, for its warp) is a barrier: each thread releases on
 *    arrival and acquires on leaving, on the barrier's sync object of this completion (one
 *    of two, alternating, so that a fast thread's arrival at the next completion orders
 *    nothing before a slow one's leaving);
 *  - a warp's shuffles and gathers (mma.sync, ldmatrix) exchange values and order no
 *    memory, as __shfl_sync promises no order of other memory: TSan does not see their
 *    slots, and a lane that reads what another lane wrote with only a shuffle between is
 *    a race (a __syncwarp between orders it). It also halves the racecheck's time, whose
 *    most is TSan's vector clocks;
 *  - blocks are not ordered: the end of a block is no barrier to TSan, and the barriers'
 *    sync objects are forgotten (rc_forget) before the next block uses them, and
 *    so is what the block did to shared memory, which the next block reuses. Only the
 *    fibers carry an order, their own program order. The two sets alternate as the
 *    squares of a checkerboard, so each block is checked against its neighbours in x, y
 *    and z; within a set, the k-th block runs thread t on fiber (t + k) mod n, so its
 *    thread t comes after thread t - (k - j) of the set's j-th block. Two threads of
 *    different blocks go unchecked only when their colours agree and their thread indices
 *    differ by the blocks' distance in the set (mod n): the same thread index, the common
 *    case of blocks adding into one element, is checked between any two blocks;
 *  - atomicAdd is a relaxed atomic (cuda_runtime.h): no race with another atomicAdd, no
 *    order either;
 *  - a grid is ordered after what its stream did before it (the stream's thread releases
 *    rc_grid_in, every thread acquires it at its start) and before what follows (every
 *    thread releases rc_grid_out after each of its blocks, the stream's thread acquires it
 *    at the end);
 *  - cp.async writes its destination when issued (the poison) and at the wait (the data),
 *    as the issuing thread: another thread's access that no barrier after the wait orders
 *    is a race (so is a refill issued before every reader of the old contents passed a
 *    barrier).
 * Not checked: between kernels of different streams (grids take the device lock, whose mutex orders
 * them; gptc's kernels all run on one stream, its lanes' copies and collectives are
 * checked). */
static char rc_grid_in, rc_grid_out; /* sync objects: the stream's work before, after a grid */
#ifdef EMU_TSAN
/* TSan's Java API, declared in no header: java_free drops the sync objects of a range,
 * java_alloc its record of accesses (AnnotateNewMemory does nothing in this libtsan) */
void __tsan_java_alloc(unsigned long ptr, unsigned long size);
void __tsan_java_free(unsigned long ptr, unsigned long size);
static void rc_acquire(void *sync) { if (sync) __tsan_acquire(sync); }
static void rc_release(void *sync) { if (sync) __tsan_release(sync); }
/* TSan forgets every access to [p, p + n) and every sync object there: memory that the
 * next block reuses is new to it, as on a GPU it would be another block's */
static void rc_forget(void *p, size_t n) {
    if (!n) return;
    __tsan_java_free((unsigned long)p, n);
    __tsan_java_alloc((unsigned long)p, n);
}
/* from rc_ignore(1) to rc_ignore(0) TSan does not see this thread's accesses */
static void rc_ignore(int on) {
    if (on) AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
    else AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
}
#else
static void rc_acquire(void *sync) { (void)sync; }
static void rc_release(void *sync) { (void)sync; }
static void rc_forget(void *p, size_t n) { (void)p, (void)n; }
static void rc_ignore(int on) { (void)on; }
#endif

/* Sanitizer bookkeeping around a switch from the scheduler to f and back, and from one
 * fiber to another (to_other_begin, then to_fiber_end). */
static void to_fiber_begin(fiber *f) {
#ifdef EMU_ASAN
    from_sched = 1;
    __sanitizer_start_switch_fiber(&sched_fake_stack, f->stack, EMU_FIBER_STACK);
#endif
#ifdef EMU_TSAN
    __tsan_switch_to_fiber(f->tsan, __tsan_switch_to_fiber_no_sync);
#endif
    (void)f;
}
static void to_other_begin(fiber *f, fiber *g) {
#ifdef EMU_ASAN
    from_sched = 0;
    __sanitizer_start_switch_fiber(&f->fake_stack, g->stack, EMU_FIBER_STACK);
#endif
#ifdef EMU_TSAN
    __tsan_switch_to_fiber(g->tsan, __tsan_switch_to_fiber_no_sync);
#endif
    (void)f, (void)g;
}
/* in f, which a switch has just entered: the stack it came from is the scheduler's, to go
 * back to at the end of the pass, when the switch came from there */
static void to_fiber_end(fiber *f) {
#ifdef EMU_ASAN
    if (from_sched)
        __sanitizer_finish_switch_fiber(f->fake_stack, &sched_stack_bottom, &sched_stack_size);
    else
        __sanitizer_finish_switch_fiber(f->fake_stack, NULL, NULL);
#endif
    (void)f;
}
static void to_sched_begin(fiber *f) {
#ifdef EMU_ASAN
    /* a fiber never ends (fiber_main): its fake stack is kept */
    __sanitizer_start_switch_fiber(&f->fake_stack, sched_stack_bottom, sched_stack_size);
#endif
#ifdef EMU_TSAN
    __tsan_switch_to_fiber(sched_tsan, __tsan_switch_to_fiber_no_sync);
#endif
    (void)f;
}
static void to_sched_end(void) {
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(sched_fake_stack, NULL, NULL);
#endif
}

static void fiber_main(void);

#ifdef EMU_ASM_SWITCH
/* emu_ctx_switch(save, to): the callee-saved registers onto this stack, its stack pointer
 * into *save, then `to`'s stack pointer, its registers, and a return where it switched
 * out (or into emu_ctx_boot, for a fiber's first switch, with fiber_main in rbx and the
 * stack 16-byte aligned at the call, as ctx_make lays it out). */
__attribute__((visibility("hidden"))) void emu_ctx_switch(void **save, void *to);
__attribute__((visibility("hidden"))) void emu_ctx_boot(void);
__asm__(".pushsection .text\n"
        ".p2align 4\n"
        ".globl emu_ctx_switch\n"
        ".hidden emu_ctx_switch\n"
        ".type emu_ctx_switch, @function\n"
        "emu_ctx_switch:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size emu_ctx_switch, .-emu_ctx_switch\n"
        ".p2align 4\n"
        ".globl emu_ctx_boot\n"
        ".hidden emu_ctx_boot\n"
        ".type emu_ctx_boot, @function\n"
        "emu_ctx_boot:\n"
        "    call *%rbx\n"
        "    ud2\n"
        ".size emu_ctx_boot, .-emu_ctx_boot\n"
        ".popsection\n");

/* Lays out a fiber's first switch at the top of stack[bytes]: the six registers (rbx:
 * fiber_main, rbp: 0, the end of the frame chain), the return into emu_ctx_boot, and two
 * empty words, so that emu_ctx_boot's call finds the stack 16-byte aligned. */
static void ctx_make(emu_ctx *c, char *stack, size_t bytes) {
    void **sp = (void **)(((uintptr_t)stack + bytes) & ~(uintptr_t)15);
    *--sp = NULL;
    *--sp = NULL;
    *--sp = (void *)emu_ctx_boot;
    *--sp = NULL;               /* rbp */
    *--sp = (void *)fiber_main; /* rbx */
    for (int i = 0; i < 4; i++) *--sp = NULL; /* r12 .. r15 */
    c->sp = sp;
}

/* Saves the running context in *from and goes on in *to; returns when something switches
 * back to *from. */
static void ctx_switch(emu_ctx *from, emu_ctx *to) { emu_ctx_switch(&from->sp, to->sp); }
#else
/* A fiber's first start at fiber_main on stack[bytes]. Its own function: getcontext may
 * return twice, and a loop's counter beside it may not survive. */
static void ctx_make(emu_ctx *c, char *stack, size_t bytes) {
    c->start = malloc(sizeof *c->start);
    if (!c->start) emu_fail("no memory for a CUDA thread");
    c->started = 0;
    getcontext(c->start);
    c->start->uc_stack.ss_sp = stack;
    c->start->uc_stack.ss_size = bytes;
    c->start->uc_link = NULL;
    makecontext(c->start, fiber_main, 0);
}

/* Jumps to a resume point. Not inlined, as the builtin longjmp may not share a frame with
 * its setjmp. Nor does it look noreturn (where this file was instrumented by ASan, an
 * optimising compiler inferred that, and ASan then unpoisoned the whole stack before
 * every call of it: half of an -O1 run's time): hence the test of the saved resume
 * address (word 1 in GCC's and Clang's layout), which is never NULL (the saved frame
 * pointer, word 0, may be where the frame has none). */
__attribute__((noinline)) static void switch_to(emu_jmp_buf to) {
    if (to[1]) __builtin_longjmp(to, 1);
}

/* Goes on in c where it switched out, or starts it the first time in its life. */
static void jump_into(emu_ctx *c) {
    if (c->started) switch_to(c->resume);
    c->started = 1;
    setcontext(c->start);
}

/* Saves the running context in *from and goes on in *to; returns when something switches
 * back to *from. The builtin's setjmp must be in the frame that resumes. Its callers may
 * not keep values in the registers it does not touch itself (GCC's -fipa-ra, on from
 * -O2), as the jump back brings another stack's registers: noipa. */
#if defined(__has_attribute)
#if __has_attribute(noipa)
#define EMU_NOIPA __attribute__((noipa))
#endif
#endif
#ifndef EMU_NOIPA
#define EMU_NOIPA __attribute__((noinline))
#endif
EMU_NOIPA static void ctx_switch(emu_ctx *from, emu_ctx *to) {
    from->started = 1; /* the scheduler's context is never made: it is resumed only here */
    if (__builtin_setjmp(from->resume) == 0) jump_into(to);
}
#endif

/* From fiber f (the running one) back to the scheduler; returns when the scheduler
 * resumes it. What it does after the switch uses f only, no thread-local: between grids
 * (fiber_main) the host thread that resumes a fiber may be another one. */
static void yield_to_scheduler(fiber *f) {
    to_sched_begin(f);
    ctx_switch(&f->ctx, &sched_ctx);
    to_fiber_end(f);
}

/* Makes g the running fiber: its threadIdx and blockIdx on this host thread. */
static void enter(fiber *g) {
    running = g;
    emu_thread_idx.x = g->tid;
    emu_thread_idx.y = emu_thread_idx.z = 0;
    emu_block_idx = g->block_idx;
}

/* From fiber f (the running one) to fiber g; returns when f is resumed. */
static void switch_fibers(fiber *f, fiber *g) {
    enter(g);
    to_other_begin(f, g);
    ctx_switch(&f->ctx, &g->ctx);
    to_fiber_end(f);
}

/* The scheduler's walk through the fibers of the block that runs (run_block): the pass,
 * and in it the warp (k-th in the pass's order) and lane (i-th) to look at next; the
 * fibers run in this warp's current sweep over its lanes (ran_warp) and in the pass. */
static struct {
    unsigned int nt, pass, k, i, ran_warp, ran;
} walk;

/* The next fiber that can run (F_RUN) in the walk's order, NULL at the end of the pass:
 * the warps in turn, upwards in even passes and downwards in odd ones, each warp's lanes
 * in the same direction, swept again and again while a sweep ran any of them, so that a
 * warp runs as far as its barriers let it before the next warp starts (run_block). */
static fiber *next_fiber(void) {
    unsigned int nt = walk.nt, nw = (nt + 31) / 32, down = walk.pass & 1;
    for (; walk.k < nw; walk.k++) {
        unsigned int first = 32 * (down ? nw - 1 - walk.k : walk.k);
        unsigned int n = nt - first < 32 ? nt - first : 32;
        for (;;) {
            while (walk.i < n) {
                fiber *f = block_threads[first + (down ? n - 1 - walk.i : walk.i)];
                walk.i++;
                if (f->state == F_RUN) {
                    walk.ran_warp++;
                    return f;
                }
            }
            walk.ran += walk.ran_warp;
            walk.i = 0;
            if (!walk.ran_warp) break; /* the warp waits at a __syncthreads, or is done */
            walk.ran_warp = 0;
        }
    }
    return NULL;
}

/* The running fiber f hands the CPU to the next one of the walk (to none when that is f
 * itself), or back to the scheduler at the end of the pass; returns when f is resumed.
 * A direct switch is half the jumps of one through the scheduler, which shuffles (a
 * switch a lane each) made most of an emulated training run's time. */
static void yield(fiber *f) {
    fiber *g = next_fiber();
    if (g == f) return;
    if (g) switch_fibers(f, g);
    else yield_to_scheduler(f);
}

/* Counts a thread's arrival at b, waiting at `at`; all waiters of b must wait at the same
 * kind. Returns 1 for the last of b's threads. */
static int arrive(barrier *b, int at) {
    char msg[200];
    if (b->arrived != 0 && b->at != at) {
        snprintf(msg, sizeof msg, "reached %s while other threads wait at %s: a barrier "
                 "or shuffle that not every thread reaches", at_name[at], at_name[b->at]);
        emu_fail(msg);
    }
    if (b->arrived++ == 0) b->at = at;
    if (b->arrived < b->count) return 0;
    b->arrived = 0;
    b->at = -1;
    b->gen++;
    return 1;
}

/* Arrives at b and waits until all its threads have. Only __syncthreads and __syncwarp
 * order memory (racecheck): a warp's shuffles and gathers exchange values, as __shfl_sync
 * promises no order of other memory. */
static void barrier_wait(barrier *b, int at) {
    char *sync = at == AT_SYNCTHREADS || at == AT_SYNCWARP ? &b->sync[b->gen & 1] : NULL;
    if (arrive(b, at)) {
        rc_acquire(sync); /* orders the others' work before what this one does next */
        rc_release(sync);
        /* release the others (they are the fibers waiting at b) */
        for (unsigned int t = b->first; t < b->first + b->count; t++)
            if (block_threads[t]->state == F_WAIT && block_threads[t]->waiting == b)
                block_threads[t]->state = F_RUN;
    } else {
        rc_release(sync);
        running->state = F_WAIT;
        running->waiting = b;
    }
    /* even the last one yields: the others run before it goes on, as on a GPU none is
     * ahead by more than the barrier */
    yield(running);
    rc_acquire(sync);
}

void emu_syncthreads(void) { barrier_wait(&block_barrier, AT_SYNCTHREADS); }

void emu_syncwarp(unsigned int mask) {
    unsigned int tid = emu_thread_idx.x;
    if (mask != 0xffffffffu) emu_fail("__syncwarp: partial masks are not emulated");
    barrier_wait(&warp_barrier[tid / 32], AT_SYNCWARP);
}

/* A shuffled value's size bytes (4 or 8 but for a char or short) by moves the compiler
 * makes inline: a call of memcpy went through ThreadSanitizer's interceptor twice a lane
 * a shuffle. */
static void copy_value(void *dst, const void *src, size_t size) {
    if (size == 4) __builtin_memcpy(dst, src, 4);
    else if (size == 8) __builtin_memcpy(dst, src, 8);
    else memcpy(dst, src, size);
}

/* One barrier per shuffle: slots alternate between two sets, so a lane that is already
 * one shuffle ahead writes the other set while its warp still reads this one (it cannot
 * get further ahead: the next barrier waits for them). */
void emu_warp_exchange(const void *in, void *out, size_t size, int src_lane) {
    unsigned int tid = emu_thread_idx.x, base = tid & ~31u;
    unsigned int width = emu_block_dim.x - base < 32 ? emu_block_dim.x - base : 32;
    double *slot = warp_slot[running->parity];
    running->parity ^= 1u;
    if (size > sizeof slot[0] || src_lane < 0 || (unsigned int)src_lane >= width)
        emu_fail("shuffle from a lane outside the warp");
    rc_ignore(1); /* the exchange is of values: its slots are no memory of the kernel's */
    copy_value(&slot[tid], in, size);
    rc_ignore(0);
    barrier_wait(&warp_barrier[tid / 32], AT_SHUFFLE); /* every lane has stored */
    rc_ignore(1);
    copy_value(out, &slot[base + (unsigned int)src_lane], size);
    rc_ignore(0);
}

/* Stores this lane's size bytes in its slot of the next set and waits for its whole warp
 * to have stored; returns the warp's 32 slots, lane 0 first, which stay as they are
 * until this lane's next shuffle or gather (the argument of emu_warp_exchange). */
static const gather_slot *gather_slots(const void *in, size_t size) {
    unsigned int tid = emu_thread_idx.x, base = tid & ~31u;
    gather_slot *slot = warp_blob[running->parity];
    running->parity ^= 1u;
    if (size > EMU_GATHER_MAX || emu_block_dim.x - base < 32)
        emu_fail("warp gather: more than EMU_GATHER_MAX bytes, or a partial warp");
    rc_ignore(1); /* as in emu_warp_exchange */
    memcpy(slot[tid], in, size);
    rc_ignore(0);
    barrier_wait(&warp_barrier[tid / 32], AT_SHUFFLE); /* every lane has stored */
    return slot + base;
}

void emu_warp_gather(const void *in, void *out, size_t size) {
    const gather_slot *all = gather_slots(in, size);
    rc_ignore(1);
    for (unsigned int l = 0; l < 32; l++) memcpy((char *)out + l * size, all[l], size);
    rc_ignore(0);
}

/* The mma's reads are of registers (the lanes' fragments, in the emulator's slots) and
 * of the lane's accumulators: no memory of the kernel's for a sanitizer to check. */

/* word i of lane l's fragment in a gather's slots */
static uint32_t frag_word(const gather_slot *all, int l, int i) {
    uint32_t w;
    memcpy(&w, all[l] + 4 * i, sizeof w);
    return w;
}

/* bf16 `odd` (0: the low half) of a fragment word */
static float frag_half(uint32_t w, int odd) {
    return bf16_to_float((uint16_t)(odd ? w >> 16 : w & 0xffffu));
}

void emu_mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    uint32_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]}; /* words 0-3: A's, 4-5: B's */
    const gather_slot *all = gather_slots(mine, sizeof mine);
    int lane = (int)(emu_thread_idx.x & 31u), g = lane >> 2, t = lane & 3;
    /* this lane's rows g, g + 8 of A and columns 2t, 2t + 1 of B, found by inverting the
     * layout: A[row][col] is in lane 4 (row % 8) + (col % 8) / 2, register
     * a[row / 8 + 2 (col / 8)], half col % 2; B[k][n] in lane 4n + (k % 8) / 2, register
     * b[k / 8], half k % 2 */
    float arow[2][16]; /* A's rows g, g + 8 */
    float bcol[2][16]; /* B's columns 2t, 2t + 1 */
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 16; k++) {
            arow[h][k] = frag_half(frag_word(all, 4 * g + ((k & 7) >> 1), h | ((k >> 3) << 1)),
                                   k & 1);
            bcol[h][k] = frag_half(frag_word(all, 4 * (2 * t + h) + ((k & 7) >> 1), 4 + (k >> 3)),
                                   k & 1);
        }
    for (int i = 0; i < 4; i++) { /* d[i]: row g (+8 if i >= 2), col 2t + (i & 1) */
        double s = 0;
        for (int k = 0; k < 16; k++) s += (double)arow[i >> 1][k] * bcol[i & 1][k];
        d[i] = (float)(d[i] + s);
    }
}

/* cp.async (engine/cuda/mma.cuh, tests/cuda_emu/emu_mma.h): the destination is
 * poisoned (0xff bytes: NaN as float and as bf16) when the copy is issued, and the copy
 * is made only at the wait that covers its group. So a read of the destination before
 * the wait (and the barrier after it) gets NaN, and so does a thread still reading what
 * was there when another thread issued the copy (a missing barrier before a refill). */
void emu_cp_async(void *dst, const void *src, unsigned int n, unsigned int valid) {
    fiber *f = running;
    if (!f) emu_fail("cp.async outside a kernel");
    if (valid > n || ((uintptr_t)dst % n) || ((uintptr_t)src % n))
        emu_fail("cp.async: source or destination not aligned to its size, or src-size > cp-size");
    if (f->cp_n == f->cp_cap) {
        unsigned int cap = f->cp_cap ? 2 * f->cp_cap : 64;
        cp_async_copy *c = realloc(f->cp, cap * sizeof *c);
        if (!c) emu_fail("no memory for cp.async");
        f->cp = c, f->cp_cap = cap;
    }
    f->cp[f->cp_n++] = (cp_async_copy){dst, src, n, valid, f->cp_groups};
    memset(dst, 0xff, n);
}

void emu_cp_async_commit(void) {
    if (!running) emu_fail("cp.async.commit_group outside a kernel");
    running->cp_groups++;
}

/* cp.async.wait_group newest: the copies of every committed group but the newest
 * `newest` ones are made; later (uncommitted or newer) copies stay queued, in order */
void emu_cp_async_wait(unsigned int newest) {
    fiber *f = running;
    if (!f) emu_fail("cp.async.wait_group outside a kernel");
    unsigned int kept = 0;
    for (unsigned int i = 0; i < f->cp_n; i++) {
        cp_async_copy *c = &f->cp[i];
        if (c->group + newest < f->cp_groups) {
            memcpy(c->dst, c->src, c->valid);
            memset((char *)c->dst + c->valid, 0, c->n - c->valid);
        } else {
            f->cp[kept++] = *c;
        }
    }
    f->cp_n = kept;
}

/* ------------------------------------------------------------------ shared memory */

/* the __shared__ statics of all kernels (cuda_runtime.h); weak: there may be none */
extern char __start_emu_shared[] __attribute__((weak));
extern char __stop_emu_shared[] __attribute__((weak));

/* 0xff bytes: NaN as float and as double */
static void poison_shared(void) {
    char *start = __start_emu_shared, *stop = __stop_emu_shared;
    if (start && stop > start) memset(start, 0xff, (size_t)(stop - start));
    if (cur.smem_bytes) memset(cur.smem, 0xff, cur.smem_bytes);
}

/* The most dynamic shared memory a kernel may opt in to: 227 KiB as on sm_90, or
 * GPTC_EMU_SMEM_OPTIN_KB KiB (99 for an sm_86 / sm_89 card, 163 for an A100), so tests
 * can run the launchers' choices for smaller devices. */
int emu_smem_optin(void) {
    const char *e = getenv("GPTC_EMU_SMEM_OPTIN_KB");
    return (e && atoi(e) > 0 ? atoi(e) : 227) * 1024;
}

/* kernels given cudaFuncAttributeMaxDynamicSharedMemorySize, and the value */
static struct {
    const void *kernel;
    size_t bytes;
} smem_optin[64];
static int n_smem_optin;
static pthread_mutex_t smem_optin_mu = PTHREAD_MUTEX_INITIALIZER;

cudaError_t emu_func_set_attribute(const void *kernel, cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        value > emu_smem_optin())
        return emu_set_error(cudaErrorInvalidValue);
    pthread_mutex_lock(&smem_optin_mu);
    int i = 0;
    while (i < n_smem_optin && smem_optin[i].kernel != kernel) i++;
    if (i == n_smem_optin) {
        if (n_smem_optin == (int)(sizeof smem_optin / sizeof smem_optin[0]))
            emu_fail("too many kernels with a shared memory attribute");
        n_smem_optin++;
    }
    smem_optin[i].kernel = kernel;
    smem_optin[i].bytes = (size_t)value;
    pthread_mutex_unlock(&smem_optin_mu);
    return cudaSuccess;
}

static size_t smem_limit(const void *kernel) {
    size_t limit = EMU_SMEM_DEFAULT;
    pthread_mutex_lock(&smem_optin_mu);
    for (int i = 0; i < n_smem_optin; i++)
        if (smem_optin[i].kernel == kernel && smem_optin[i].bytes > EMU_SMEM_DEFAULT)
            limit = smem_optin[i].bytes;
    pthread_mutex_unlock(&smem_optin_mu);
    return limit;
}

/* ------------------------------------------------------------------ launches */

/* The last thread to finish a block readies shared memory for the next: poisoned, and
 * (racecheck) new to TSan, as are the barriers (__syncthreads', __syncwarp's). */
static void block_done(void) {
    rc_ignore(1); /* the poison is no access of the block's, which no barrier orders now */
    poison_shared();
    rc_ignore(0);
    char *start = __start_emu_shared, *stop = __stop_emu_shared;
    if (start && stop > start) rc_forget(start, (size_t)(stop - start));
    rc_forget(cur.smem, cur.smem_bytes);
    rc_forget(block_barrier.sync, sizeof block_barrier.sync);
    for (unsigned int w = 0; w < (cur.block.x + 31) / 32; w++)
        rc_forget(warp_barrier[w].sync, sizeof warp_barrier[w].sync);
}

/* The end of a thread's block: it parks until the scheduler gives it the next block or
 * ends the grid; the last of the block to get there first readies shared memory for the
 * next block (block_done). Orders nothing: blocks are unordered (racecheck). */
static void block_end(void) {
    if (arrive(&block_barrier, AT_BLOCK_END)) block_done();
    running->state = F_PARKED;
    yield(running);
}

/* A fiber's part in one grid, as an emulated CUDA thread: runs the kernel for its
 * threadIdx in each block the scheduler gives it (f->block_idx), parking after each until
 * the next one or the end of the grid. Out of line, so that its thread-local reads are
 * its own: the host thread is the grid's, which may not be the one of fiber_main's
 * previous call. */
__attribute__((noinline)) static void fiber_grid(fiber *f) {
    rc_acquire(&rc_grid_in);
    for (;;) {
        cur.body(cur.ctx);
        if (f->cp_n) emu_fail("cp.async copies the thread never waited for");
        rc_release(&rc_grid_out);
        block_end();
        if (f->grid_over) return;
    }
}

/* A fiber's life: a grid's part (fiber_grid), then a wait until a later grid resumes it,
 * for ever. */
static void fiber_main(void) {
    fiber *f = running;
    to_fiber_end(f);
    for (;;) {
        fiber_grid(f);
        f->state = F_DONE;
        yield_to_scheduler(f);
    }
}

/* A fiber, made once: its stack (guard page below it, so that an overflow faults) and its
 * first start at fiber_main, `colour` cache lines below the stack's top. The stacks are
 * whole pages apart, so without the colour every fiber's frames would sit at one offset
 * in a page, in the same few sets of the caches, and more switches would miss them (5%
 * of an emulated training run). */
static void make_fiber(fiber *f, unsigned int colour) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *m = mmap(NULL, EMU_FIBER_STACK + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED || mprotect(m, page, PROT_NONE) != 0) emu_fail("no memory for a CUDA thread's stack");
    f->stack = m + page;
#ifdef EMU_TSAN
    f->tsan = __tsan_create_fiber(0);
#endif
#ifdef EMU_ASAN
    f->fake_stack = NULL;
#endif
    ctx_make(&f->ctx, f->stack, EMU_FIBER_STACK - 64 * (size_t)(colour % (page / 64)));
}

/* Switches from the scheduler to f until a fiber yields back to it. */
static void resume(fiber *f) {
    enter(f);
    to_fiber_begin(f);
    ctx_switch(&sched_ctx, &f->ctx);
    to_sched_end();
    running = NULL;
}

/* Runs a block on its fibers (block_threads) until all of them are parked at its end. A pass
 * takes the warps in turn, alternately upwards and downwards, and runs each warp's lanes
 * (in the same direction) until none of them can go on, i.e. until the whole warp waits at
 * a __syncthreads (or is done), before the next warp starts: a warp runs as far ahead of
 * the others as a barrier lets it, as one may on a GPU. So a read of shared memory that
 * another warp writes without a barrier in between shows (as NaN, or as a cp.async's
 * poison) in the passes where the reader goes first, and a write (or cp.async) that should
 * wait for other warps' reads of the old contents shows in the passes where the writer
 * goes first. The walk is next_fiber's: the scheduler resumes its first fiber, and each
 * fiber that yields hands over to the next (yield), the last back to the scheduler. */
static void run_block(unsigned int nt) {
    fiber *const *fs = block_threads;
    char msg[240];
    walk.nt = nt;
    for (unsigned int pass = 0;; pass++) {
        unsigned int busy = 0;
        walk.pass = pass;
        walk.k = walk.i = walk.ran_warp = walk.ran = 0;
        fiber *first = next_fiber();
        if (first) resume(first);
        for (unsigned int t = 0; t < nt; t++) busy += fs[t]->state != F_PARKED;
        if (!busy) return;
        if (walk.ran) continue;
        /* every thread of the block waits, and no barrier can complete */
        unsigned int t = 0;
        while (t < nt && fs[t]->state != F_WAIT) t++;
        const barrier *b = fs[t]->waiting;
        emu_thread_idx.x = t;
        emu_block_idx = fs[t]->block_idx;
        snprintf(msg, sizeof msg, "waits at %s with %u of %u thread(s) there, and no other "
                 "thread can arrive: a barrier or shuffle that not every thread reaches",
                 at_name[b->at], b->arrived, b->count);
        emu_fail(msg);
    }
}

/* Readies fiber f, thread t of its block, to start the grid. */
static void ready_fiber(fiber *f, unsigned int t) {
    f->tid = t;
    f->parity = 0;
    f->grid_over = 0;
    f->waiting = NULL;
    f->cp_n = f->cp_groups = 0;
}

/* Readies set s's first nt fibers (stacks made once) to start the grid. */
static void start_set(unsigned int s, unsigned int nt) {
    fiber *fs = &fibers[s * EMU_MAX_THREADS];
    for (unsigned int t = 0; t < nt; t++) {
        if (t >= fibers_made[s]) {
            make_fiber(&fs[t], t);
            fibers_made[s] = t + 1;
        }
        ready_fiber(&fs[t], t);
    }
}

/* Runs a checked grid to completion on this thread, holding the device: block after
 * block, each on the set of fibers of its colour (EMU_SETS), then lets the fibers go. */
static void run_grid(const char *name, emu_uint3 grid, emu_uint3 block, size_t dyn_smem,
                     emu_body_fn body, void *ctx) {
    unsigned int nt = block.x, nwarps = (nt + 31) / 32;
    pthread_mutex_lock(&device_mu);
    if (!fibers) {
        fibers = calloc(EMU_SETS * EMU_MAX_THREADS, sizeof *fibers);
        if (!fibers) emu_fail("no memory for the CUDA threads");
    }
    cur.name = name;
    cur.body = body;
    cur.ctx = ctx;
    cur.grid = grid;
    cur.block = block;
    cur.smem_bytes = dyn_smem;
    /* the exact size (malloc's 16-byte alignment, as float4 needs), so that ASan sees
     * an access past the end; a block that asked for none gets a 1-byte block */
    cur.smem = malloc(dyn_smem ? dyn_smem : 1);
    if (!cur.smem || ((uintptr_t)cur.smem & 15u)) emu_fail("shared memory allocation");
    poison_shared();
    barrier_init(&block_barrier, 0, nt);
    for (unsigned int w = 0; w < nwarps; w++)
        barrier_init(&warp_barrier[w], 32 * w, nt - 32 * w < 32 ? nt - 32 * w : 32);
#ifdef EMU_TSAN
    sched_tsan = __tsan_get_current_fiber();
#endif
    rc_release(&rc_grid_in); /* the inputs, earlier grids */

    /* this thread's view while the grid runs (restored after: it may be the host's) */
    int was_in_kernel = in_kernel;
    const char *was_name = kernel_name;
    emu_uint3 was_block_dim = emu_block_dim, was_grid_dim = emu_grid_dim;
    void *was_smem = emu_dyn_smem;
    in_kernel = 1;
    kernel_name = name;
    emu_block_dim = block;
    emu_grid_dim = grid;
    emu_dyn_smem = cur.smem;
    int started[EMU_SETS] = {0};
    unsigned int turn[EMU_SETS] = {0}; /* blocks run so far on each set, mod nt */
    for (unsigned int bz = 0; bz < grid.z; bz++)
    for (unsigned int by = 0; by < grid.y; by++)
        for (unsigned int bx = 0; bx < grid.x; bx++) {
            unsigned int s = (bx + by + bz) % EMU_SETS;
            if (!started[s]) start_set(s, nt);
            started[s] = 1;
            for (unsigned int t = 0; t < nt; t++) {
                fiber *f = &fibers[s * EMU_MAX_THREADS + (t + turn[s]) % nt];
                f->tid = t;
                f->parity = 0; /* the warp it now serves may have shuffled more or less */
                f->block_idx = (emu_uint3){bx, by, bz};
                f->state = F_RUN;
                block_threads[t] = f;
            }
            turn[s] = (turn[s] + 1) % nt;
            run_block(nt);
        }
    for (unsigned int s = 0; s < EMU_SETS; s++)
        for (unsigned int t = 0; started[s] && t < nt; t++) {
            fiber *f = &fibers[s * EMU_MAX_THREADS + t];
            f->grid_over = 1;
            f->state = F_RUN;
            resume(f); /* it goes back to the scheduler (fiber_main), not to the next */
        }
    rc_acquire(&rc_grid_out); /* the grid's work, before what the stream does next */
    in_kernel = was_in_kernel;
    kernel_name = was_name;
    emu_block_dim = was_block_dim;
    emu_grid_dim = was_grid_dim;
    emu_dyn_smem = was_smem;
    emu_thread_idx = emu_block_idx = (emu_uint3){0, 0, 0};

    free(cur.smem);
    memset(&cur, 0, sizeof cur);
    pthread_mutex_unlock(&device_mu);
}

/* Kernels that talk to host threads through words of pinned memory: wait_flag_kernel
 * spins until a host thread lets it go, set_flag_kernel tells one that the stream got
 * there. Run under the device lock the first would stop every other kernel, the host work
 * it waits for included; so both run on their stream's thread as one CUDA thread, beside
 * the grid that holds the device. They must be 1 x 1 launches without shared memory or
 * barriers (checked: a barrier of theirs would meet the other grid's). */
enum { HOST_WAITS = 1, HOST_SIGNALS = 2 };
static const struct {
    const char *name;
    int kind;
} HOST_FLAG_KERNELS[] = {{"wait_flag_kernel", HOST_WAITS}, {"set_flag_kernel", HOST_SIGNALS}};

/* HOST_WAITS or HOST_SIGNALS for those kernels, 0 for the others */
static int host_flag_kind(const char *name) {
    for (size_t i = 0; i < sizeof HOST_FLAG_KERNELS / sizeof HOST_FLAG_KERNELS[0]; i++)
        if (strcmp(HOST_FLAG_KERNELS[i].name, name) == 0) return HOST_FLAG_KERNELS[i].kind;
    return 0;
}

#ifdef EMU_TSAN
/* __tsan_acquire (acquire = 1) or __tsan_release of every pinned word that a pointer
 * among the kernel's arguments (ctx, ctx_bytes) points to */
static void sync_pinned_args(const void *ctx, size_t ctx_bytes, int acquire) {
    for (size_t off = 0; off + sizeof(void *) <= ctx_bytes; off += sizeof(void *)) {
        void *p;
        memcpy(&p, (const char *)ctx + off, sizeof p);
        if (!p || emu_mem_classify(p, 1) != EMU_MEM_PINNED) continue;
        if (acquire) __tsan_acquire(p);
        else __tsan_release(p);
    }
}
#endif

static void run_host_flag(const char *name, int kind, emu_body_fn body, void *ctx,
                          size_t ctx_bytes) {
    emu_uint3 one = {1, 1, 1}, zero = {0, 0, 0};
    int was_in_kernel = in_kernel;
    const char *was_name = kernel_name;
    in_kernel = 1;
    kernel_name = name;
    emu_block_dim = emu_grid_dim = one;
    emu_thread_idx = emu_block_idx = zero;
    emu_dyn_smem = NULL;
#ifdef EMU_TSAN
    /* On the GPU the flag's volatile accesses and __threadfence_system order the stream's
     * work against the host thread's. TSan would take them for races with the host's
     * atomics and see no order: the kernel's accesses are ignored, and the waiting kernel
     * acquires every pinned word its arguments point to after it was let go, the
     * signalling one releases them before its store (the host's acquire load of the flag
     * then orders the stream's earlier work, e.g. copies to host memory, before it). */
    if (kind == HOST_WAITS) {
        AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    } else {
        sync_pinned_args(ctx, ctx_bytes, 0);
        AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
    }
#endif
    body(ctx);
#ifdef EMU_TSAN
    if (kind == HOST_WAITS) {
        AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
        sync_pinned_args(ctx, ctx_bytes, 1);
    } else {
        AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    }
#endif
    (void)kind, (void)ctx_bytes;
    in_kernel = was_in_kernel;
    kernel_name = was_name;
}

/* A launch as its stream runs it: the closure of the kernel and its arguments. */
typedef struct {
    const char *name;
    emu_uint3 grid, block;
    size_t dyn_smem;
    emu_body_fn body;
    void *ctx;
    size_t ctx_bytes;
    void (*free_ctx)(void *);
    uint32_t corr; /* CUPTI's correlation id of the launch */
} launch;

static void run_launch(void *arg) {
    launch *l = arg;
    uint64_t t0 = emu_cupti_now();
    int kind = host_flag_kind(l->name);
    if (kind) run_host_flag(l->name, kind, l->body, l->ctx, l->ctx_bytes);
    else run_grid(l->name, l->grid, l->block, l->dyn_smem, l->body, l->ctx);
    emu_cupti_work(EMU_CUPTI_KERNEL, l->corr, l->name, 0, t0, emu_cupti_now());
    l->free_ctx(l->ctx);
    free(l);
}

void emu_launch_kernel(const void *kernel, const char *name, emu_uint3 grid, emu_uint3 block,
                       size_t dyn_smem, cudaStream_t stream, emu_body_fn body, void *ctx,
                       size_t ctx_bytes, void (*free_ctx)(void *)) {
    char msg[200];
    if (block.y != 1 || block.z != 1) {
        snprintf(msg, sizeof msg, "%s: only 1-D blocks are emulated", name);
        emu_fail(msg);
    }
    cudaError_t e = cudaSuccess;
    if (grid.x == 0 || grid.y == 0 || grid.y > EMU_MAX_GRID_Y || grid.z == 0 ||
        grid.z > EMU_MAX_GRID_Y || block.x == 0 ||
        block.x > EMU_MAX_THREADS)
        e = cudaErrorInvalidConfiguration;
    else if (dyn_smem > smem_limit(kernel))
        e = cudaErrorInvalidValue;
    else if (!emu_stream_valid(stream))
        e = cudaErrorInvalidResourceHandle;
    if (e == cudaSuccess && host_flag_kind(name) &&
        (grid.x != 1 || grid.y != 1 || grid.z != 1 || block.x != 1 || dyn_smem != 0)) {
        snprintf(msg, sizeof msg, "%s talks to the host, so it is emulated as one thread "
                 "only: launch it <<<1, 1, 0>>>", name);
        emu_fail(msg);
    }
    launch *l = e == cudaSuccess ? malloc(sizeof *l) : NULL;
    if (e == cudaSuccess && !l) e = cudaErrorMemoryAllocation;
    if (e != cudaSuccess) {
        emu_set_error(e);
        free_ctx(ctx);
        return;
    }
    emu_module_first_use((uint64_t)(uintptr_t)kernel, name);
    *l = (launch){name, grid, block, dyn_smem, body, ctx, ctx_bytes, free_ctx, emu_cupti_api()};
    emu_stream_run(stream, run_launch, l, name);
}

void emu_nanosleep(unsigned int ns) {
    struct timespec t = {0, (long)ns};
    nanosleep(&t, NULL);
}
