/* What the comm layer's op tests share (tests/test_comm.c on MPI, tests/test_comm_nccl.c on
 * the fake NCCL): the failure count and check, the groups under test, and the values each
 * rank contributes. One test program includes it once. */
#ifndef GPTC_COMM_TEST_H
#define GPTC_COMM_TEST_H

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include "parallel/comm.h"

static int failures;
static int world_rank;

static void check(int cond, const char *fmt, ...) {
    if (cond) return;
    va_list ap;
    va_start(ap, fmt);
    printf("rank %d FAIL: ", world_rank);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    failures++;
}

/* A group under test: the world ranks of its members, in group-rank order. */
typedef struct {
    comm_group *g;
    int members[4];
} team;

static int me(const team *t) { return t->members[t->g->rank]; }

/* Rank w's fp32 element i: the power of two says which ranks entered a sum and the 16*i
 * term which element it is, so a wrong group, block or offset shows as a wrong exact
 * integer. */
static float value(int w, size_t i) { return (float)((1 << w) + 16 * (double)i); }

/* Rank w's element i of an act buffer: a power of two, so fp32 and bf16 buffers hold it
 * exactly. Rank i % 4 gives 256 and the others 1 or 2, their pattern cycling through
 * every combination as i/4 grows; the power of two sets elements apart. Any group's sum
 * is exact in fp32 whatever the order (all are multiples of one power of two, at most 262
 * of it), so the expected bf16 sum is that sum rounded once, while many sums (259, 261)
 * are ties that rounding partial sums (256 + 1 -> 256) gets wrong. */
static float act_value(int w, size_t i) {
    int m = w == (int)(i % 4) ? 256 : 1 + (int)((i / 4 >> w) & 1);
    return ldexpf((float)m, (int)(i % 61) - 30);
}

#endif
