#include "engine/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void log_vline(const char *prefix, const char *fmt, va_list ap) {
    char line[2048], out[4 * sizeof line]; /* out: line, its control characters escaped */
    vsnprintf(line, sizeof(line), fmt, ap);
    size_t len = strlen(line);
    if (len > 0 && line[len - 1] == '\n') line[len - 1] = '\0';
    /* one line, also when a path it names holds a newline (a file name may) */
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)line; *p; p++) {
        if (*p == '\n') out[o++] = '\\', out[o++] = 'n';
        else if (*p < 0x20 && *p != '\t') o += (size_t)snprintf(out + o, 5, "\\x%02x", *p);
        else out[o++] = (char)*p;
    }
    out[o] = 0;
    /* one write, so lines from several ranks do not interleave mid-line */
    fprintf(stderr, "%s%s\n", prefix, out);
    fflush(stderr);
}

void log_warn(const char *fmt, ...) {
    if (g_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    log_vline("gptc: warning: ", fmt, ap);
    va_end(ap);
}

void log_warn_here(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_vline("gptc: warning: ", fmt, ap);
    va_end(ap);
}

void log_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_vline("gptc: error: ", fmt, ap);
    va_end(ap);
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
