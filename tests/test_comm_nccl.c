/* The comm layer's NCCL path (parallel/comm_nccl.c) op by op, on 4 ranks of the CPU
 * emulator's CUDA backend with the fake NCCL of tests/cuda_emu/fake_nccl.c (it is not NCCL:
 * this shows that comm_nccl.c calls NCCL as its API says, not what NCCL does on GPUs).
 * Run with NCCL_MULTI_RANK_GPU_ENABLE=1, so that the four ranks on the one fake GPU take
 * NCCL. On world and on the grid groups of tp=2,pp=2,dp=1 and tp=1,pp=2,dp=2 (made by
 * ncclCommSplit, groups of one rank included), on the compute stream and on two comm
 * streams, at a few sizes (0 included): fp32 all-reduce sum and max, reduce-scatter and
 * all-gather (in place and not), broadcast from every root, and the collectives on the
 * activation type in bf16 (compared bit for bit with the sum rounded once: the fake sums
 * as the MPI path does), reduce to a root, a send/receive ring on two streams and a
 * sendrecv ring (one ncclGroupStart/End). Device buffers are filled and read through the
 * backend's copies on the op's stream.
 *
 * Rank w's values are those of test_comm.c (tests/comm_test.h): exact integers for fp32,
 * powers of two for the activation type whose bf16 sums are often ties, so a wrong group,
 * block, offset, root, type or rounding shows. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/bf16.h"
#include "engine/cuda/cuda_backend.h"
#include "parallel/comm.h"
#include "parallel/grid.h"
#include "tests/comm_test.h"

static const gptc_backend *be;

/* host scratch and its device twin: n elements of es bytes */
typedef struct {
    char *h;
    void *d;
    size_t bytes;
} twin;

static twin twin_make(size_t n, size_t es) {
    twin t = {malloc(n * es + 1), be->alloc(n * es + 1), n * es};
    if (!t.h || !t.d) {
        printf("out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return t;
}
static void twin_free(twin *t) {
    free(t->h);
    be->release(t->d);
}
static void up(twin *t, gptc_stream *s) { be->copy_from_host(t->d, t->h, t->bytes, s); }
static void down(twin *t, gptc_stream *s) {
    be->stream_synchronize(s);
    be->copy_to_host(t->h, t->d, t->bytes, s);
}

static void put(twin *t, size_t i, gptc_precision p, float x) {
    if (p == GPTC_BF16) ((uint16_t *)t->h)[i] = bf16_bits(x);
    else ((float *)t->h)[i] = x;
}
static float got(const twin *t, size_t i, gptc_precision p) {
    return p == GPTC_BF16 ? bf16_to_float(((const uint16_t *)t->h)[i]) : ((const float *)t->h)[i];
}
/* x as the type holds it: one rounding to bf16 */
static float as(float x, gptc_precision p) { return p == GPTC_BF16 ? bf16_round(x) : x; }
static size_t es_of(gptc_precision p) { return p == GPTC_BF16 ? 2 : 4; }
static const char *tn(gptc_precision p) { return p == GPTC_BF16 ? "bf16" : "fp32"; }

/* element value of rank w: exact integers in fp32, act_value in bf16 */
static float val(int w, size_t i, gptc_precision p) {
    return p == GPTC_BF16 ? act_value(w, i) : value(w, i);
}
static float sum_of(const team *t, size_t i, gptc_precision p) {
    float s = 0;
    for (int r = 0; r < t->g->size; r++) s += val(t->members[r], i, p);
    return as(s, p);
}

static void test_allreduce(const team *t, size_t n, gptc_precision p, gptc_stream *s) {
    twin b = twin_make(n, es_of(p));
    for (size_t i = 0; i < n; i++) put(&b, i, p, val(me(t), i, p));
    up(&b, s);
    comm_allreduce_sum_act(t->g, b.d, n, p, s);
    down(&b, s);
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (got(&b, i, p) != sum_of(t, i, p)) bad = i;
    check(bad == n, "%s allreduce on %s n=%zu: element %zu", tn(p), t->g->name, n, bad);
    if (p == GPTC_FP32) {
        int top = 0;
        for (int r = 0; r < t->g->size; r++) top = t->members[r] > top ? t->members[r] : top;
        for (size_t i = 0; i < n; i++) put(&b, i, p, val(me(t), i, p));
        up(&b, s);
        comm_allreduce_max(t->g, (float *)b.d, n, s);
        down(&b, s);
        bad = n;
        for (size_t i = 0; i < n && bad == n; i++)
            if (got(&b, i, p) != value(top, i)) bad = i;
        check(bad == n, "allreduce max on %s n=%zu: element %zu", t->g->name, n, bad);
    }
    twin_free(&b);
}

static void test_reduce_scatter(const team *t, size_t n, gptc_precision p, gptc_stream *s) {
    size_t size = (size_t)t->g->size, rank = (size_t)t->g->rank, es = es_of(p);
    twin send = twin_make(size * n, es), recv = twin_make(n, es);
    for (int in_place = 0; in_place < 2; in_place++) {
        for (size_t j = 0; j < size * n; j++) put(&send, j, p, val(me(t), j, p));
        up(&send, s);
        void *out = in_place ? (char *)send.d + rank * n * es : recv.d;
        comm_reduce_scatter_sum_act(t->g, send.d, out, n, p, s);
        twin *res = in_place ? &send : &recv;
        down(res, s);
        size_t off = in_place ? rank * n : 0, bad = n;
        for (size_t i = 0; i < n && bad == n; i++)
            if (got(res, off + i, p) != sum_of(t, rank * n + i, p)) bad = i;
        check(bad == n, "%s%s reduce_scatter on %s n=%zu: element %zu", tn(p),
              in_place ? " in-place" : "", t->g->name, n, bad);
    }
    twin_free(&send);
    twin_free(&recv);
}

static void test_allgather(const team *t, size_t n, gptc_precision p, gptc_stream *s) {
    size_t size = (size_t)t->g->size, rank = (size_t)t->g->rank, es = es_of(p);
    twin send = twin_make(n, es), recv = twin_make(size * n, es);
    for (size_t i = 0; i < n; i++) put(&send, i, p, val(me(t), i, p));
    up(&send, s);
    for (int in_place = 0; in_place < 2; in_place++) {
        for (size_t j = 0; j < size * n; j++) put(&recv, j, p, -1);
        for (size_t i = 0; in_place && i < n; i++) put(&recv, rank * n + i, p, val(me(t), i, p));
        up(&recv, s);
        void *mine = (char *)recv.d + rank * n * es;
        comm_allgather_act(t->g, in_place ? mine : send.d, recv.d, n, p, s);
        down(&recv, s);
        size_t bad = size * n;
        for (size_t j = 0; j < size * n && bad == size * n; j++)
            if (got(&recv, j, p) != as(val(t->members[j / n], j % n, p), p)) bad = j;
        check(bad == size * n, "%s%s allgather on %s n=%zu: element %zu", tn(p),
              in_place ? " in-place" : "", t->g->name, n, bad);
    }
    twin_free(&send);
    twin_free(&recv);
}

/* to the last group rank; the others' buffers stay as they were */
static void test_reduce(const team *t, size_t n, gptc_precision p, gptc_stream *s) {
    int root = t->g->size - 1;
    twin b = twin_make(n, es_of(p));
    for (size_t i = 0; i < n; i++) put(&b, i, p, val(me(t), i, p));
    up(&b, s);
    comm_reduce_sum_act(t->g, b.d, n, root, p, s);
    down(&b, s);
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++) {
        float want = t->g->rank == root ? sum_of(t, i, p) : as(val(me(t), i, p), p);
        if (got(&b, i, p) != want) bad = i;
    }
    check(bad == n, "%s reduce to %d on %s n=%zu: element %zu", tn(p), root, t->g->name, n, bad);
    twin_free(&b);
}

static void test_broadcast(const team *t, size_t n, gptc_stream *s) {
    twin b = twin_make(n, 4);
    for (int root = 0; root < t->g->size; root++) {
        for (size_t i = 0; i < n; i++) put(&b, i, GPTC_FP32, t->g->rank == root ? value(me(t), i) : -1);
        up(&b, s);
        comm_broadcast(t->g, b.d, n * 4, root, s);
        down(&b, s);
        size_t bad = n;
        for (size_t i = 0; i < n && bad == n; i++)
            if (got(&b, i, GPTC_FP32) != value(t->members[root], i)) bad = i;
        check(bad == n, "broadcast on %s from %d n=%zu: element %zu", t->g->name, root, n, bad);
    }
    twin_free(&b);
}

/* each rank sends n + 3 * rank floats to the next: the two sides of an exchange differ */
static void test_rings(const team *t, size_t n, gptc_stream *s1, gptc_stream *s2) {
    int size = t->g->size, rank = t->g->rank;
    if (size < 2) return;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    size_t out_n = n + 3 * (size_t)rank, in_n = n + 3 * (size_t)prev;
    twin out = twin_make(out_n, 4), in = twin_make(in_n, 4);
    for (int sendrecv = 0; sendrecv < 2; sendrecv++) {
        for (size_t i = 0; i < out_n; i++) put(&out, i, GPTC_FP32, value(me(t), i));
        for (size_t i = 0; i < in_n; i++) put(&in, i, GPTC_FP32, -1);
        up(&out, s1);
        up(&in, s2);
        if (sendrecv) {
            comm_sendrecv(t->g, out.d, out_n * 4, next, in.d, in_n * 4, prev, 12, s1);
            down(&in, s1);
        } else {
            /* on two streams; a communicator's ops run in issue order (in NCCL as in
             * the fake), so the receive waits for the send, which is small enough to be
             * buffered (NCCL's connection buffers, MPI's eager sends) */
            comm_send(t->g, out.d, out_n * 4, next, 11, s1);
            comm_recv(t->g, in.d, in_n * 4, prev, 11, s2);
            be->stream_synchronize(s1);
            down(&in, s2);
        }
        size_t bad = in_n;
        for (size_t i = 0; i < in_n && bad == in_n; i++)
            if (got(&in, i, GPTC_FP32) != value(t->members[prev], i)) bad = i;
        check(bad == in_n, "%s ring on %s n=%zu: element %zu", sendrecv ? "sendrecv" : "send/recv",
              t->g->name, in_n, bad);
    }
    twin_free(&out);
    twin_free(&in);
}

static void test_group(const team *t, gptc_stream *s1, gptc_stream *s2) {
    static const size_t sizes[] = {0, 1, 37, 1000};
    for (int k = 0; k < 4; k++)
        for (int on_stream = 0; on_stream < 2; on_stream++) {
            size_t n = sizes[k];
            gptc_stream *s = on_stream ? s1 : NULL;
            for (int b = 0; b < 2; b++) {
                gptc_precision p = b ? GPTC_BF16 : GPTC_FP32;
                test_allreduce(t, n, p, s);
                test_reduce_scatter(t, n, p, s);
                test_allgather(t, n, p, s);
                test_reduce(t, n, p, s);
            }
            test_broadcast(t, n, s);
            test_rings(t, n, s1, s2);
        }
    check(comm_error(t->g) == NULL, "no error on %s: %s", t->g->name,
          comm_error(t->g) ? comm_error(t->g) : "");
}

static void test_layout(comm_group *world, int tp, int pp, int dp, gptc_stream *s1,
                        gptc_stream *s2) {
    grid gr;
    char err[256];
    comm_group tpg, ppg, dpg;
    if (grid_layout(&gr, 4, world_rank, tp, pp, dp, err, sizeof err) != 0 ||
        comm_grid_groups(world, &gr, &tpg, &ppg, &dpg, err, sizeof err) != 0) {
        check(0, "layout tp=%d pp=%d dp=%d: %s", tp, pp, dp, err);
        return;
    }
    team tpt = {&tpg, {0}}, ppt = {&ppg, {0}}, dpt = {&dpg, {0}};
    for (int k = 0; k < tp; k++) tpt.members[k] = grid_rank_of(&gr, k, gr.pp_rank, gr.dp_rank);
    for (int k = 0; k < pp; k++) ppt.members[k] = grid_rank_of(&gr, gr.tp_rank, k, gr.dp_rank);
    for (int k = 0; k < dp; k++) dpt.members[k] = grid_rank_of(&gr, gr.tp_rank, gr.pp_rank, k);
    check(tpg.nccl && ppg.nccl && dpg.nccl, "layout tp=%d pp=%d dp=%d: a group without NCCL", tp,
          pp, dp);
    test_group(&tpt, s1, s2);
    test_group(&ppt, s1, s2);
    test_group(&dpt, s1, s2);
    comm_group_free(&tpg);
    comm_group_free(&ppg);
    comm_group_free(&dpg);
}

int main(int argc, char **argv) {
    int provided = 0, world_size = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (provided < MPI_THREAD_MULTIPLE || world_size != 4) {
        if (world_rank == 0) printf("FAIL: needs 4 ranks and MPI_THREAD_MULTIPLE\n");
        MPI_Finalize();
        return 1;
    }
    char err[256];
    be = cuda_backend(world_rank, err, sizeof err);
    if (!be) {
        printf("FAIL: cuda_backend: %s\n", err);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* the config's limits go to ncclCommInitRankConfig and ncclCommSplit, which check them */
    comm_set_options(&(comm_options){.max_ctas = 8, .cta_policy = 2});
    gptc_stream *s1 = be->stream_create(1), *s2 = be->stream_create(0);
    comm_group world;
    if (!s1 || !s2 || comm_world(&world, be) != 0) {
        printf("FAIL: setup: %s\n", comm_error(&world) ? comm_error(&world) : "streams");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    check(comm_backend_in_use() == COMM_NCCL && world.nccl,
          "the comm layer took %s, not NCCL (NCCL_MULTI_RANK_GPU_ENABLE=1 unset?)",
          comm_backend_description());
    team wt = {&world, {0, 1, 2, 3}};
    test_group(&wt, s1, s2);
    test_layout(&world, 2, 2, 1, s1, s2);
    test_layout(&world, 1, 2, 2, s1, s2);
    be->stream_destroy(s1);
    be->stream_destroy(s2);
    int any = 0;
    MPI_Allreduce(&failures, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    comm_group_free(&world);
    if (world_rank == 0) printf("%s (%s)\n", any ? "FAILED" : "PASSED", comm_backend_description());
    MPI_Finalize();
    return any ? 1 : 0;
}
