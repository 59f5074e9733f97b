#include "engine/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int g_rank = 0;

void log_set_rank(int rank) { g_rank = rank; }
int log_rank(void) { return g_rank; }

void log_info(const char *fmt, ...) {
    if (g_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

void log_error(const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    /* one write, so lines from several ranks do not interleave mid-line */
    fprintf(stderr, "gptc: error: %s\n", line);
    fflush(stderr);
}

void *log_calloc(size_t n, size_t size, const char *what) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        log_error("rank %d: out of memory for %s (%zu x %zu bytes)", g_rank, what, n, size);
        exit(EXIT_FAILURE);
    }
    return p;
}

void *log_realloc(void *p, size_t bytes, const char *what) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) {
        log_error("rank %d: out of memory for %s (%zu bytes)", g_rank, what, bytes);
        exit(EXIT_FAILURE);
    }
    return q;
}
