/* A crash's line (engine/crash_signal.c) also for a stack overflow, where the faulting
 * thread has no stack left to run a handler on: a child recurses without end while
 * "reading train.init ck.h5"; its stderr must hold the line naming the signal and the
 * file, and it must still die of the crash (the handler it replaced runs after: here the
 * default, or a sanitizer's report and exit). Without an alternate stack the child died
 * with no word. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
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

int main(void) {
    int out[2];
    if (pipe(out) != 0) {
        perror("pipe");
        return 1;
    }
    pid_t child = fork();
    if (child == 0) {
        dup2(out[1], STDERR_FILENO);
        close(out[0]);
        crash_catch_signals();
        watchdog_doing("reading train.init ck.h5");
        char base = 0;
        return recurse(&base, 1);
    }
    close(out[1]);
    char text[65536];
    size_t len = 0;
    ssize_t k;
    while (len + 1 < sizeof text && (k = read(out[0], text + len, sizeof text - 1 - len)) > 0)
        len += (size_t)k;
    text[len] = '\0';
    int status = 0;
    waitpid(child, &status, 0);
    const char *want = "gptc: error: rank 0: a crash (SIGSEGV) while reading train.init ck.h5: "
                       "a corrupt file?\n";
    int crashed = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
    if (!crashed || !strstr(text, want)) {
        printf("FAIL: a stack overflow: %s %d, want the line %sstderr:\n%.2000s\n",
               WIFSIGNALED(status) ? "signal" : "exit",
               WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), want, text);
        return 1;
    }
    printf("ok   a stack overflow says: %s", want);
    return 0;
}
