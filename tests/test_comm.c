/* The MPI communication layer on 4 ranks: every op on world and on the grid groups of two
 * layouts (tp=2,pp=2,dp=1 and tp=1,pp=2,dp=2), in place and not, issued on the caller and
 * on comm streams; the collectives on the activation type (fp32 and bf16); the path for
 * counts above INT_MAX (with the piece size lowered); the host-staged path of device
 * backends (on a CPU table that claims device memory); ordering through events and host
 * functions; and errors that are reported, not fatal.
 *
 * Rank w contributes value(w, i) at index i, or act_value(w, i) on the activation type
 * (tests/comm_test.h says why those values). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend.h"
#include "engine/bf16.h"
#include "parallel/comm.h"
#include "parallel/grid.h"
#include "tests/comm_test.h"

static float *floats(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) {
        printf("out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return p;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static float sum_over(const team *t, size_t i) {
    float s = 0;
    for (int r = 0; r < t->g->size; r++) s += value(t->members[r], i);
    return s;
}

/* Waits for the stream (the caller's own work on NULL is already done). */
static void finish(const team *t, gptc_stream *s) { t->g->be->stream_synchronize(s); }

/* ---- collectives ---- */

static void test_allreduce(const team *t, size_t n, gptc_stream *s) {
    float *buf = floats(n);
    for (size_t i = 0; i < n; i++) buf[i] = value(me(t), i);
    comm_allreduce_sum(t->g, buf, n, s);
    finish(t, s);
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (buf[i] != sum_over(t, i)) bad = i;
    check(bad == n, "allreduce on %s n=%zu: element %zu", t->g->name, n, bad);

    /* max: the highest world rank of the group wins, whichever group rank it has */
    for (size_t i = 0; i < n; i++) buf[i] = value(me(t), i);
    comm_allreduce_max(t->g, buf, n, s);
    finish(t, s);
    int top = 0;
    for (int r = 0; r < t->g->size; r++)
        if (t->members[r] > top) top = t->members[r];
    bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (buf[i] != value(top, i)) bad = i;
    check(bad == n, "allreduce max on %s n=%zu: element %zu", t->g->name, n, bad);
    free(buf);
}

static void test_reduce_scatter(const team *t, size_t n, gptc_stream *s) {
    int size = t->g->size, rank = t->g->rank;
    float *send = floats(size * n), *recv = floats(n);
    for (size_t j = 0; j < size * n; j++) send[j] = value(me(t), j);
    for (size_t i = 0; i < n; i++) recv[i] = -1;
    comm_reduce_scatter_sum(t->g, send, recv, n, s);
    finish(t, s);
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (recv[i] != sum_over(t, rank * n + i)) bad = i;
    check(bad == n, "reduce_scatter on %s n=%zu: element %zu", t->g->name, n, bad);

    /* in place: the result lands in this rank's block of the same buffer */
    for (size_t j = 0; j < size * n; j++) send[j] = value(me(t), j);
    comm_reduce_scatter_sum(t->g, send, send + rank * n, n, s);
    finish(t, s);
    bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (send[rank * n + i] != sum_over(t, rank * n + i)) bad = i;
    check(bad == n, "in-place reduce_scatter on %s n=%zu: element %zu", t->g->name, n, bad);
    free(send);
    free(recv);
}

static void test_allgather(const team *t, size_t n, gptc_stream *s) {
    int size = t->g->size, rank = t->g->rank;
    float *send = floats(n), *recv = floats(size * n);
    for (size_t i = 0; i < n; i++) send[i] = value(me(t), i);
    for (size_t j = 0; j < size * n; j++) recv[j] = -1;
    comm_allgather(t->g, send, recv, n, s);
    finish(t, s);
    size_t bad = size * n;
    for (size_t j = 0; j < size * n && bad == size * n; j++)
        if (recv[j] != value(t->members[j / n], j % n)) bad = j;
    check(bad == size * n, "allgather on %s n=%zu: element %zu", t->g->name, n, bad);

    /* in place: this rank's block is already where it belongs */
    for (size_t j = 0; j < size * n; j++) recv[j] = -1;
    for (size_t i = 0; i < n; i++) recv[rank * n + i] = value(me(t), i);
    comm_allgather(t->g, recv + rank * n, recv, n, s);
    finish(t, s);
    bad = size * n;
    for (size_t j = 0; j < size * n && bad == size * n; j++)
        if (recv[j] != value(t->members[j / n], j % n)) bad = j;
    check(bad == size * n, "in-place allgather on %s n=%zu: element %zu", t->g->name, n, bad);
    free(send);
    free(recv);
}

static void test_broadcast(const team *t, size_t n, gptc_stream *s) {
    float *buf = floats(n);
    for (int root = 0; root < t->g->size; root++) {
        for (size_t i = 0; i < n; i++) buf[i] = t->g->rank == root ? value(me(t), i) : -1;
        comm_broadcast(t->g, buf, n * sizeof(float), root, s);
        finish(t, s);
        size_t bad = n;
        for (size_t i = 0; i < n && bad == n; i++)
            if (buf[i] != value(t->members[root], i)) bad = i;
        check(bad == n, "broadcast on %s from %d n=%zu: element %zu", t->g->name, root, n, bad);
    }
    free(buf);
}

/* ---- collectives on the activation type ---- */

static void act_put(gptc_act *buf, size_t i, gptc_precision t, float x) {
    if (t == GPTC_BF16) ((uint16_t *)buf)[i] = bf16_bits(x);
    else ((float *)buf)[i] = x;
}

/* Element i's bits: results are compared bit for bit. */
static uint32_t act_bits(const gptc_act *buf, size_t i, gptc_precision t) {
    if (t == GPTC_BF16) return ((const uint16_t *)buf)[i];
    uint32_t u;
    memcpy(&u, (const float *)buf + i, sizeof u);
    return u;
}

/* x as an element of t: one rounding to bf16 */
static uint32_t act_bits_of(float x, gptc_precision t) {
    float b; /* room for either type */
    act_put(&b, 0, t, x);
    return act_bits(&b, 0, t);
}

static uint32_t act_sum_bits(const team *t, size_t i, gptc_precision type) {
    float s = 0;
    for (int r = 0; r < t->g->size; r++) s += act_value(t->members[r], i);
    return act_bits_of(s, type);
}

static gptc_act *acts(size_t n, gptc_precision t) {
    gptc_act *p = malloc((n ? n : 1) * gptc_act_bytes(t));
    if (!p) {
        printf("out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return p;
}

/* 1 when every rank of the group holds the same bytes as group rank 0. */
static int same_on_group(const team *t, const void *buf, size_t bytes) {
    char *first = malloc(bytes ? bytes : 1);
    if (t->g->rank == 0) memcpy(first, buf, bytes);
    MPI_Bcast(first, (int)bytes, MPI_BYTE, 0, t->g->comm);
    int same = memcmp(first, buf, bytes) == 0, all = 0;
    MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, t->g->comm);
    free(first);
    return all;
}

static const char *type_name(gptc_precision t) { return t == GPTC_BF16 ? "bf16" : "fp32"; }

static void test_allreduce_act(const team *t, size_t n, gptc_precision type, gptc_stream *s) {
    gptc_act *buf = acts(n, type);
    for (size_t i = 0; i < n; i++) act_put(buf, i, type, act_value(me(t), i));
    comm_allreduce_sum_act(t->g, buf, n, type, s);
    finish(t, s);
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (act_bits(buf, i, type) != act_sum_bits(t, i, type)) bad = i;
    check(bad == n, "%s allreduce on %s n=%zu: element %zu", type_name(type), t->g->name, n, bad);
    check(same_on_group(t, buf, n * gptc_act_bytes(type)), "%s allreduce on %s n=%zu: ranks differ",
          type_name(type), t->g->name, n);
    free(buf);
}

static void test_reduce_scatter_act(const team *t, size_t n, gptc_precision type,
                                    gptc_stream *s) {
    size_t size = (size_t)t->g->size, rank = (size_t)t->g->rank;
    gptc_act *send = acts(size * n, type), *recv = acts(n, type);
    for (int in_place = 0; in_place < 2; in_place++) {
        for (size_t j = 0; j < size * n; j++) act_put(send, j, type, act_value(me(t), j));
        for (size_t i = 0; i < n; i++) act_put(recv, i, type, -1);
        gptc_act *out = in_place ? gptc_act_at(send, rank * n, type) : recv;
        comm_reduce_scatter_sum_act(t->g, send, out, n, type, s);
        finish(t, s);
        size_t bad = n;
        for (size_t i = 0; i < n && bad == n; i++)
            if (act_bits(out, i, type) != act_sum_bits(t, rank * n + i, type)) bad = i;
        check(bad == n, "%s%s reduce_scatter on %s n=%zu: element %zu", type_name(type),
              in_place ? " in-place" : "", t->g->name, n, bad);
        size_t changed = size * n;
        for (size_t j = 0; j < size * n && changed == size * n && !in_place; j++)
            if (act_bits(send, j, type) != act_bits_of(act_value(me(t), j), type)) changed = j;
        check(changed == size * n, "%s reduce_scatter on %s n=%zu wrote send element %zu",
              type_name(type), t->g->name, n, changed);
    }
    free(send);
    free(recv);
}

/* The sum lands on the root (the last group rank) only; the others' buffers stay as they
 * were. */
static void test_reduce_act(const team *t, size_t n, gptc_precision type, gptc_stream *s) {
    int root = t->g->size - 1;
    gptc_act *buf = acts(n, type);
    for (size_t i = 0; i < n; i++) act_put(buf, i, type, act_value(me(t), i));
    comm_reduce_sum_act(t->g, buf, n, root, type, s);
    finish(t, s);
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++) {
        uint32_t want = t->g->rank == root ? act_sum_bits(t, i, type)
                                           : act_bits_of(act_value(me(t), i), type);
        if (act_bits(buf, i, type) != want) bad = i;
    }
    check(bad == n, "%s reduce to %d on %s n=%zu: element %zu", type_name(type), root,
          t->g->name, n, bad);
    free(buf);
}

static void test_allgather_act(const team *t, size_t n, gptc_precision type, gptc_stream *s) {
    size_t size = (size_t)t->g->size, rank = (size_t)t->g->rank;
    gptc_act *send = acts(n, type), *recv = acts(size * n, type);
    for (size_t i = 0; i < n; i++) act_put(send, i, type, act_value(me(t), i));
    for (int in_place = 0; in_place < 2; in_place++) {
        for (size_t j = 0; j < size * n; j++) act_put(recv, j, type, -1);
        gptc_act *mine = gptc_act_at(recv, rank * n, type);
        if (in_place) memcpy(mine, send, n * gptc_act_bytes(type));
        comm_allgather_act(t->g, in_place ? mine : send, recv, n, type, s);
        finish(t, s);
        size_t bad = size * n;
        for (size_t j = 0; j < size * n && bad == size * n; j++)
            if (act_bits(recv, j, type) != act_bits_of(act_value(t->members[j / n], j % n), type))
                bad = j;
        check(bad == size * n, "%s%s allgather on %s n=%zu: element %zu", type_name(type),
              in_place ? " in-place" : "", t->g->name, n, bad);
        check(same_on_group(t, recv, size * n * gptc_act_bytes(type)),
              "%s allgather on %s n=%zu: ranks differ", type_name(type), t->g->name, n);
    }
    free(send);
    free(recv);
}

static void test_act(const team *t, size_t n, gptc_stream *s) {
    for (int k = 0; k < 2; k++) {
        gptc_precision type = k ? GPTC_BF16 : GPTC_FP32;
        test_allreduce_act(t, n, type, s);
        test_reduce_scatter_act(t, n, type, s);
        test_reduce_act(t, n, type, s);
        test_allgather_act(t, n, type, s);
    }
}

/* The values above test the one rounding only if some sums are not bf16 numbers. */
static void test_act_values_round(void) {
    int inexact = 0;
    for (size_t i = 0; i < 1000; i++) {
        float s = 0;
        for (int w = 0; w < 4; w++) s += act_value(w, i);
        inexact += bf16_round(s) != s;
    }
    check(inexact > 100 && bf16_bits(259.0f) == 0x4382 && bf16_bits(257.0f) == 0x4380,
          "bf16 test values: %d of 1000 world sums round", inexact);
}

/* ---- point to point ---- */

/* Ring: each rank sends to the next and receives from the previous. On the caller, even
 * ranks send first and odd ranks receive first; on streams, the send and the receive go
 * to two streams and run at the same time. */
static void test_ring(const team *t, size_t n, gptc_stream *send_s, gptc_stream *recv_s) {
    int size = t->g->size, rank = t->g->rank;
    if (size < 2) return;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    float *out = floats(n), *in = floats(n);
    for (size_t i = 0; i < n; i++) {
        out[i] = value(me(t), i);
        in[i] = -1;
    }
    size_t bytes = n * sizeof(float);
    if (!send_s && rank % 2 == 1) comm_recv(t->g, in, bytes, prev, 11, recv_s);
    comm_send(t->g, out, bytes, next, 11, send_s);
    if (send_s || rank % 2 == 0) comm_recv(t->g, in, bytes, prev, 11, recv_s);
    finish(t, send_s);
    finish(t, recv_s);
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (in[i] != value(t->members[prev], i)) bad = i;
    check(bad == n, "send/recv ring on %s n=%zu: element %zu", t->g->name, n, bad);
    free(out);
    free(in);
}

/* Every rank sends a different length, so the two sides of one exchange differ in pieces. */
static size_t ring_len(size_t n, int group_rank) { return n + 3 * (size_t)group_rank; }

static void test_sendrecv(const team *t, size_t n, gptc_stream *s) {
    int size = t->g->size, rank = t->g->rank;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    size_t out_n = ring_len(n, rank), in_n = ring_len(n, prev);
    float *out = floats(out_n), *in = floats(in_n);
    for (size_t i = 0; i < out_n; i++) out[i] = value(me(t), i);
    for (size_t i = 0; i < in_n; i++) in[i] = -1;
    comm_sendrecv(t->g, out, out_n * sizeof(float), next, in, in_n * sizeof(float), prev, 12, s);
    finish(t, s);
    size_t bad = in_n;
    for (size_t i = 0; i < in_n && bad == in_n; i++)
        if (in[i] != value(t->members[prev], i)) bad = i;
    check(bad == in_n, "sendrecv ring on %s n=%zu: element %zu", t->g->name, in_n, bad);
    free(out);
    free(in);
}

static void test_host_reductions(const team *t) {
    double want = 0;
    int want_max = 0;
    for (int r = 0; r < t->g->size; r++) {
        want += t->members[r] + 0.25;
        if (t->members[r] > want_max) want_max = t->members[r];
    }
    double one = me(t) + 0.25;
    comm_sum_doubles(t->g, &one, 1);
    check(one == want, "comm_sum_doubles of one value on %s", t->g->name);
    check(comm_max_int(t->g, me(t)) == want_max, "comm_max_int on %s", t->g->name);
    check(comm_max_double(t->g, me(t) + 0.5) == want_max + 0.5, "comm_max_double on %s",
          t->g->name);
    /* each element its own sum: element k adds k * (member + 1) over the group */
    double x[3], want_k[3] = {0, 0, 0};
    for (int k = 0; k < 3; k++) {
        x[k] = k * (me(t) + 1.0);
        for (int r = 0; r < t->g->size; r++) want_k[k] += k * (t->members[r] + 1.0);
    }
    comm_sum_doubles(t->g, x, 3);
    for (int k = 0; k < 3; k++)
        check(x[k] == want_k[k], "comm_sum_doubles on %s: element %d is %g, want %g", t->g->name,
              k, x[k], want_k[k]);
}

/* Every op, on the caller and on streams, at a few sizes (0 included). */
static void test_group(const team *t, gptc_stream *s1, gptc_stream *s2) {
    static const size_t sizes[] = {0, 1, 37, 1000};
    for (int k = 0; k < 4; k++) {
        size_t n = sizes[k];
        for (int on_stream = 0; on_stream < 2; on_stream++) {
            gptc_stream *s = on_stream ? s1 : NULL;
            test_allreduce(t, n, s);
            test_reduce_scatter(t, n, s);
            test_allgather(t, n, s);
            test_act(t, n, s);
            test_broadcast(t, n, s);
            test_ring(t, n, s, on_stream ? s2 : NULL);
            test_sendrecv(t, n, s);
        }
    }
    test_host_reductions(t);
    check(comm_error(t->g) == NULL, "no error on %s: %s", t->g->name,
          comm_error(t->g) ? comm_error(t->g) : "");
}

/* ---- grid groups ---- */

static void test_layout(const gptc_backend *be, int tp, int pp, int dp, gptc_stream *s1,
                        gptc_stream *s2) {
    grid gr;
    char err[256];
    if (grid_layout(&gr, 4, world_rank, tp, pp, dp, err, sizeof err) != 0) {
        check(0, "grid_layout: %s", err);
        return;
    }
    comm_group world, tpg, ppg, dpg;
    if (comm_world(&world, be) != 0 ||
        comm_grid_groups(&world, &gr, &tpg, &ppg, &dpg, err, sizeof err) != 0) {
        check(0, "comm_grid_groups: %s", err);
        return;
    }
    team tpt = {&tpg, {0}}, ppt = {&ppg, {0}}, dpt = {&dpg, {0}};
    for (int k = 0; k < tp; k++) tpt.members[k] = grid_rank_of(&gr, k, gr.pp_rank, gr.dp_rank);
    for (int k = 0; k < pp; k++) ppt.members[k] = grid_rank_of(&gr, gr.tp_rank, k, gr.dp_rank);
    for (int k = 0; k < dp; k++) dpt.members[k] = grid_rank_of(&gr, gr.tp_rank, gr.pp_rank, k);
    check(tpg.size == tp && tpg.rank == gr.tp_rank && strcmp(tpg.name, "tp") == 0,
          "tp group shape (tp=%d pp=%d dp=%d)", tp, pp, dp);
    check(ppg.size == pp && ppg.rank == gr.pp_rank && strcmp(ppg.name, "pp") == 0,
          "pp group shape (tp=%d pp=%d dp=%d)", tp, pp, dp);
    check(dpg.size == dp && dpg.rank == gr.dp_rank && strcmp(dpg.name, "dp") == 0,
          "dp group shape (tp=%d pp=%d dp=%d)", tp, pp, dp);
    test_group(&tpt, s1, s2);
    test_group(&ppt, s1, s2);
    test_group(&dpt, s1, s2);

    /* Groups of different dimensions are separate communicators, so collectives on them
     * may run at the same time: tp on a stream while dp runs on the caller. */
    size_t n = 500;
    float *a = floats(n), *b = floats(n);
    for (size_t i = 0; i < n; i++) a[i] = b[i] = value(world_rank, i);
    comm_allreduce_sum(&tpg, a, n, s1);
    comm_allreduce_sum(&dpg, b, n, NULL);
    finish(&tpt, s1);
    size_t bad_a = n, bad_b = n;
    for (size_t i = 0; i < n; i++) {
        if (bad_a == n && a[i] != sum_over(&tpt, i)) bad_a = i;
        if (bad_b == n && b[i] != sum_over(&dpt, i)) bad_b = i;
    }
    check(bad_a == n && bad_b == n, "concurrent tp and dp allreduce: elements %zu, %zu", bad_a,
          bad_b);
    free(a);
    free(b);

    comm_group_free(&tpg);
    comm_group_free(&ppg);
    comm_group_free(&dpg);
    comm_group_free(&world);
}

static void test_bad_grid(const gptc_backend *be) {
    grid gr;
    char err[256] = "";
    grid_layout(&gr, 8, world_rank, 2, 2, 2, err, sizeof err);
    comm_group world, tpg, ppg, dpg;
    int rc = comm_world(&world, be);
    if (rc == 0) rc = comm_grid_groups(&world, &gr, &tpg, &ppg, &dpg, err, sizeof err);
    check(rc != 0 && strstr(err, "MPI rank") != NULL, "a grid for 8 ranks is refused: '%s'", err);
    comm_group_free(&world);
}

/* ---- streams ---- */

static void busy_compute(double *sink) {
    double x = 0;
    for (int i = 0; i < 2000000; i++) x += (double)(i % 7) * 0.5;
    *sink += x;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* An allreduce on a comm stream while the caller computes; the caller waits on an event
 * recorded after it before reading the buffer. Rank 0 joins late, so on the other ranks
 * the allreduce cannot finish for 1.5 s: issuing it must return long before that, or it
 * did not run on the stream. (Half of it: at 300 ms and 150, a thread descheduled on a
 * loaded machine, 4 ranks on 2 cores, could come close.) */
static void test_overlap(const team *world, const gptc_backend *be, gptc_stream *cs) {
    size_t n = 200000;
    float *buf = floats(n);
    for (size_t i = 0; i < n; i++) buf[i] = value(me(world), i % 1000);
    gptc_event *ev = be->event_create();
    if (world->g->rank == 0) sleep_ms(1500);
    double t0 = now_ms();
    comm_allreduce_sum(world->g, buf, n, cs);
    be->event_record(ev, cs);
    double issue_ms = now_ms() - t0;
    check(world->g->rank == 0 || issue_ms < 750,
          "issuing an allreduce on a stream took %.0f ms: it ran on the caller", issue_ms);
    double sink = 0;
    busy_compute(&sink);
    be->stream_wait_event(NULL, ev);
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (buf[i] != sum_over(world, i % 1000)) bad = i;
    check(bad == n && sink > 0, "allreduce on a stream beside compute: element %zu", bad);
    be->event_destroy(ev);
    free(buf);
}

static void sleep_30ms(void *arg) { sleep_ms(30); }

/* s2 all-gathers what s1 all-reduces; only the event between them makes s2 see the sums. A
 * second world group keeps the two streams off one communicator, so a broken order shows
 * as wrong values instead of a hang. */
static void test_two_streams(const team *world, comm_group *world2, const gptc_backend *be,
                             gptc_stream *s1, gptc_stream *s2) {
    size_t n = 64;
    int size = world->g->size;
    float *buf = floats(n), *out = floats(size * n);
    for (size_t i = 0; i < n; i++) buf[i] = value(me(world), i);
    for (size_t j = 0; j < size * n; j++) out[j] = -1;
    gptc_event *ev = be->event_create();
    be->launch_host_func(s1, sleep_30ms, NULL);
    comm_allreduce_sum(world->g, buf, n, s1);
    be->event_record(ev, s1);
    be->stream_wait_event(s2, ev);
    comm_allgather(world2, buf, out, n, s2);
    finish(world, s2);
    size_t bad = size * n;
    for (size_t j = 0; j < size * n && bad == size * n; j++)
        if (out[j] != sum_over(world, j % n)) bad = j;
    check(bad == size * n, "two streams ordered by an event: element %zu", bad);
    finish(world, s1);
    be->event_destroy(ev);
    free(buf);
    free(out);
}

/* Recording an event again moves it: the second wait must not pass on the first record. */
static void test_rerecorded_event(const team *world, const gptc_backend *be, gptc_stream *s) {
    size_t n = 16;
    float *a = floats(n), *b = floats(n);
    for (size_t i = 0; i < n; i++) a[i] = b[i] = value(me(world), i);
    gptc_event *ev = be->event_create();
    comm_allreduce_sum(world->g, a, n, s);
    be->event_record(ev, s);
    be->stream_wait_event(NULL, ev);
    check(a[0] == sum_over(world, 0) && a[n - 1] == sum_over(world, n - 1),
          "first record of an event");
    be->launch_host_func(s, sleep_30ms, NULL);
    comm_allreduce_sum(world->g, b, n, s);
    be->event_record(ev, s);
    be->stream_wait_event(NULL, ev);
    check(b[0] == sum_over(world, 0) && b[n - 1] == sum_over(world, n - 1),
          "a re-recorded event waits for its new point");
    be->event_destroy(ev);
    free(a);
    free(b);
}

typedef struct {
    float *buf, *snapshot;
    size_t n;
    int base;
    int log[8];
    int nlog;
} host_state;

static void host_fill(void *arg) {
    host_state *h = arg;
    for (size_t i = 0; i < h->n; i++) h->buf[i] = value(h->base, i);
    h->log[h->nlog++] = 1;
}

static void host_snapshot(void *arg) {
    host_state *h = arg;
    memcpy(h->snapshot, h->buf, h->n * sizeof(float));
    h->log[h->nlog++] = 2;
}

static void host_clobber(void *arg) {
    host_state *h = arg;
    for (size_t i = 0; i < h->n; i++) h->buf[i] = -7;
    h->log[h->nlog++] = 3;
}

/* Host functions run in the stream's order around the comm ops. */
static void test_host_func_order(const team *world, const gptc_backend *be, gptc_stream *s) {
    size_t n = 32;
    host_state h = {.buf = floats(n), .snapshot = floats(n), .n = n, .base = me(world)};
    be->launch_host_func(s, host_fill, &h);
    comm_allreduce_sum(world->g, h.buf, n, s);
    be->launch_host_func(s, host_snapshot, &h);
    be->launch_host_func(s, host_clobber, &h);
    finish(world, s);
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (h.snapshot[i] != sum_over(world, i)) bad = i;
    check(h.nlog == 3 && h.log[0] == 1 && h.log[1] == 2 && h.log[2] == 3 && bad == n,
          "launch_host_func order around an allreduce (element %zu)", bad);
    free(h.buf);
    free(h.snapshot);
}

/* ---- counts above INT_MAX, with the piece size lowered ---- */

static void test_pieces(const team *world, gptc_stream *s1, gptc_stream *s2) {
    comm_set_max_count_for_testing(5);
    for (int on_stream = 0; on_stream < 2; on_stream++) {
        gptc_stream *s = on_stream ? s1 : NULL;
        for (size_t n = 4; n <= 13; n += 9) { /* one piece; several with a short last one */
            test_allreduce(world, n, s);
            test_reduce_scatter(world, n, s);
            test_allgather(world, n, s);
            test_act(world, n, s);
            test_broadcast(world, n, s);
            test_ring(world, n, s, on_stream ? s2 : NULL);
            test_sendrecv(world, n, s);
        }
    }
    comm_set_max_count_for_testing(0);
    check(comm_error(world->g) == NULL, "no error in pieces: %s",
          comm_error(world->g) ? comm_error(world->g) : "");
}

/* ---- MPI on host copies of device buffers ---- */

/* A device backend's groups stage every op through host buffers (GPTC_TEST_STAGED does
 * the same for whole runs): here a copy of the CPU table that claims device memory, its
 * streams being the CPU's. Its world group takes MPI like the first world did (the
 * backend is decided once, for a host backend here), so its ops take the staged path. */
static void test_staged(const gptc_backend *be, gptc_stream *s1, gptc_stream *s2) {
    gptc_backend device = *be;
    device.on_device = 1;
    comm_group g;
    if (comm_world(&g, &device) != 0) {
        check(0, "comm_world on the staged table: %s", comm_error(&g) ? comm_error(&g) : "");
        return;
    }
    team t = {&g, {0, 1, 2, 3}};
    test_group(&t, s1, s2);
    test_pieces(&t, s1, s2);
    comm_group_free(&g);
}

/* ---- errors come back, they do not abort ---- */

static void test_errors(const gptc_backend *be, gptc_stream *s) {
    comm_group g;
    if (comm_world(&g, be) != 0) {
        check(0, "comm_world for the error test");
        return;
    }
    check(comm_error(&g) == NULL, "a fresh group has no error");
    float x = 1;
    comm_send(&g, &x, sizeof x, g.size + 5, 0, NULL); /* no such rank */
    const char *e = comm_error(&g);
    const char *want = "MPI_Send on world: ";
    check(e && strncmp(e, want, strlen(want)) == 0, "error of a bad send: '%s'", e ? e : "(none)");
    comm_recv(&g, &x, sizeof x, -7, 0, s); /* a second error, on a stream: the first stays */
    be->stream_synchronize(s);
    check(comm_error(&g) == e && strncmp(comm_error(&g), want, strlen(want)) == 0,
          "the first error is kept");
    comm_group_free(&g);
}

int main(int argc, char **argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    int world_size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (provided < MPI_THREAD_MULTIPLE || world_size != 4) {
        if (world_rank == 0)
            printf("FAIL: needs 4 ranks and MPI_THREAD_MULTIPLE (got %d ranks, level %d)\n",
                   world_size, provided);
        MPI_Finalize();
        return 1;
    }
    const gptc_backend *be = cpu_backend();
    if (!be) {
        printf("FAIL: cpu_backend() unavailable\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    gptc_stream *s1 = be->stream_create(1), *s2 = be->stream_create(0);
    comm_group world, world2;
    if (!s1 || !s2 || comm_world(&world, be) != 0 || comm_world(&world2, be) != 0) {
        printf("FAIL: setup\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    team wt = {&world, {0, 1, 2, 3}};
    check(world.size == 4 && world.rank == world_rank && strcmp(world.name, "world") == 0,
          "world group shape");

    test_group(&wt, s1, s2);
    test_layout(be, 2, 2, 1, s1, s2);
    test_layout(be, 1, 2, 2, s1, s2);
    test_bad_grid(be);
    test_pieces(&wt, s1, s2);
    test_act_values_round();
    test_staged(be, s1, s2);
    test_overlap(&wt, be, s1);
    test_two_streams(&wt, &world2, be, s1, s2);
    test_rerecorded_event(&wt, be, s1);
    test_host_func_order(&wt, be, s1);
    test_errors(be, s1);

    be->stream_destroy(s1);
    be->stream_destroy(s2);
    int any = 0;
    MPI_Allreduce(&failures, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    comm_group_free(&world);
    comm_group_free(&world2);
    if (world_rank == 0) printf("%s\n", any ? "FAILED" : "PASSED");
    MPI_Finalize();
    return any ? 1 : 0;
}
