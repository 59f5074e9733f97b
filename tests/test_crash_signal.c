/* A crash's line (engine/crash_signal.c). "overflow": a child recurses without end while
 * "reading train.init ck.h5", where the faulting thread has no stack left to run a
 * handler on (without an alternate stack it died with no word): its stderr must hold the
 * line naming the signal and the file. "other thread": while the main thread reads that
 * file, another thread faults: the line must not blame the file. "abort": a library
 * calls abort() while the file is read (it had only the launcher's word). Either way the
 * child must still die of the crash (the handler it replaced runs after: here the
 * default, or a sanitizer's report and exit). */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/crash_signal.h"
#include "engine/watchdog.h"

/* not a tail call, and a frame the optimizer keeps: every call takes 4 KB more stack
 * (the bound is a terabyte's worth: never reached) */
static int recurse(volatile char *above, int depth) {
    if (depth > (1 << 28)) return 0;
    volatile char frame[4096];
    frame[depth % 4096] = (char)depth;
    return recurse(frame, depth + 1) + frame[0] + above[0];
}

/* a store to a page that allows none: a fault the sanitizers do not catch before it */
static void *fault(void *arg) {
    (void)arg;
    volatile int *page = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page != MAP_FAILED) *page = 1;
    return NULL;
}

/* the child's stderr into text[n]; its wait status */
static int run_child(int mode, char *text, size_t n) {
    int out[2];
    if (pipe(out) != 0) {
        perror("pipe");
        return -1;
    }
    pid_t child = fork();
    if (child == 0) {
        dup2(out[1], STDERR_FILENO);
        close(out[0]);
        crash_catch_signals();
        watchdog_doing("reading train.init ck.h5");
        /* under ulimit -s unlimited the stack would grow through the machine's memory */
        struct rlimit stack;
        if (getrlimit(RLIMIT_STACK, &stack) == 0 &&
            (stack.rlim_cur == RLIM_INFINITY || stack.rlim_cur > (rlim_t)8 << 20)) {
            stack.rlim_cur = (rlim_t)8 << 20;
            setrlimit(RLIMIT_STACK, &stack);
        }
        char base = 0;
        if (mode == 1) _exit(recurse(&base, 1));
        if (mode == 2) abort();
        pthread_t t;
        if (pthread_create(&t, NULL, fault, NULL) == 0) pthread_join(t, NULL);
        _exit(0);
    }
    close(out[1]);
    size_t len = 0;
    ssize_t k;
    while (len + 1 < n && (k = read(out[0], text + len, n - 1 - len)) > 0) len += (size_t)k;
    text[len] = '\0';
    close(out[0]);
    int status = 0;
    waitpid(child, &status, 0);
    return status;
}

int main(void) {
    const char *names[3] = {"other thread", "overflow", "abort"};
    const char *wants[3] = {"gptc: error: rank 0: a crash (SIGSEGV)\n",
                            "gptc: error: rank 0: a crash (SIGSEGV) while reading train.init "
                            "ck.h5: a corrupt file?\n",
                            "gptc: error: rank 0: a crash (SIGABRT) while reading train.init "
                            "ck.h5: a corrupt file?\n"};
    int failed = 0;
    for (int mode = 0; mode < 3; mode++) {
        static char text[65536];
        int status = run_child(mode, text, sizeof text);
        int crashed = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
        int line = 0;
        for (const char *p = text; (p = strstr(p, "gptc: error: ")); p++)
            line = line || strncmp(p, wants[mode], strlen(wants[mode])) == 0;
        if (!crashed || !line || (mode == 0 && strstr(text, "while reading"))) {
            printf("FAIL: %s: %s %d, want the line %sstderr:\n%.2000s\n", names[mode],
                   WIFSIGNALED(status) ? "signal" : "exit",
                   WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), wants[mode],
                   text);
            failed = 1;
        } else {
            printf("ok   %s: %s", names[mode], wants[mode]);
        }
    }
    return failed;
}
