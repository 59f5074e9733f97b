/* The failure count and check of the single-process C tests: a check that fails prints
 * "FAIL: " and its message on stderr and counts; the test exits nonzero when any did.
 * One test program includes it once. */
#ifndef GPTC_TEST_CHECK_H
#define GPTC_TEST_CHECK_H

#include <stdarg.h>
#include <stdio.h>

static int failures;

static __attribute__((format(printf, 2, 3))) void check(int ok, const char *fmt, ...) {
    if (ok) return;
    failures++;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

#endif
