/* A corrupt HDF5 file can crash the library (a byte of a checkpoint's global heap made it
 * read past its buffer), and "Segmentation fault" from the launcher names neither the rank
 * nor the file. The handler writes one line, "gptc: error: rank 1: a crash (SIGSEGV) while
 * reading train.init ck.h5: a corrupt file?", puts back the handler it replaced (the MPI
 * library's backtrace, a sanitizer's report, or the default: a core and the signal's exit
 * status) and returns, so that the faulting instruction runs again into that one. */
#define _XOPEN_SOURCE 700 /* sigaltstack, SA_ONSTACK: XSI */
#include "engine/crash_signal.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "engine/log.h"
#include "engine/watchdog.h"

/* SIGABRT: a library's abort() on a state it cannot go on from (glibc's heap checks, an
 * assertion) */
static const int g_sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
static const char *const g_names[] = {"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"};
enum { N_SIGS = sizeof g_sigs / sizeof g_sigs[0] };
static struct sigaction g_was[N_SIGS];

/* s appended to buf[*len < cap) (async-signal-safe: no stdio in a handler) */
static void add(char *buf, size_t *len, size_t cap, const char *s) {
    while (*s && *len + 1 < cap) buf[(*len)++] = *s++;
}

static void add_int(char *buf, size_t *len, size_t cap, int v) {
    char digits[16];
    int n = 0;
    unsigned u = v < 0 ? 0u - (unsigned)v : (unsigned)v;
    do digits[n++] = (char)('0' + u % 10); while ((u /= 10) && n < 15);
    if (v < 0) add(buf, len, cap, "-");
    while (n > 0 && *len + 1 < cap) buf[(*len)++] = digits[--n];
}

static void on_crash(int sig, siginfo_t *info, void *context) {
    (void)context;
    int i = 0;
    while (i < N_SIGS - 1 && g_sigs[i] != sig) i++;
    char line[1024];
    size_t len = 0;
    add(line, &len, sizeof line, "gptc: error: rank ");
    add_int(line, &len, sizeof line, log_rank());
    add(line, &len, sizeof line, ": a crash (");
    add(line, &len, sizeof line, g_names[i]);
    add(line, &len, sizeof line, ")");
    const char *doing = watchdog_doing_now();
    if (doing) {
        add(line, &len, sizeof line, " while ");
        add(line, &len, sizeof line, doing);
        add(line, &len, sizeof line, ": a corrupt file?");
    }
    add(line, &len, sizeof line, "\n");
    ssize_t unused = write(STDERR_FILENO, line, len);
    (void)unused;
    sigaction(sig, &g_was[i], NULL);
    /* one sent by kill() or raise() has no instruction to fault again: send it once more,
     * pending until this handler returns */
    if (info == NULL || info->si_code <= 0) raise(sig);
}

/* A stack overflow (a recursion in a library on a corrupt file) faults on the guard page
 * with no stack left to run the handler on: the rank died without a word. The main
 * thread's handler runs on this one, unless the program set its own. */
static char g_alt_stack[64 * 1024];

static void use_alt_stack(void) {
    stack_t was;
    if (sigaltstack(NULL, &was) == 0 && !(was.ss_flags & SS_DISABLE)) return;
    stack_t st = {.ss_sp = g_alt_stack, .ss_size = sizeof g_alt_stack, .ss_flags = 0};
    sigaltstack(&st, NULL);
}

void crash_catch_signals(void) {
    use_alt_stack();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_crash;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < N_SIGS; i++) sigaction(g_sigs[i], &sa, &g_was[i]);
}
