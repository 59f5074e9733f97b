/* Pipeline schedules as data: every accepted (schedule, pp, v, n_micro) with pp 1..4, v 1..3,
 * n_micro 1..8 builds lists that pass the checker, run each forward before its backward and
 * have the documented warm-up; the refused combinations name their key; and the checker
 * rejects hand-broken lists (a textbook 1F1B that deadlocks with blocking send/recv, every
 * adjacent send/recv pair swapped, a missing recv or send, a backward before its forward, a
 * duplicated forward, a recv from the wrong peer, backwards out of forward order); every
 * list's activation slot count (pp_count_slots) is checked by brute force.
 * Prints a few schedules as timelines for the docs. Exit 0 = pass. */
#include "parallel/schedule.h"
#include "tests/check.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static int min_int(int a, int b) { return a < b ? a : b; }

/* The warm-up formulas, written out again so the test does not read them from the code. */
static int expected_warmup(const char *name, int pp, int v, int n_micro, int rank) {
    if (strcmp(name, "gpipe") == 0) return n_micro;
    if (strcmp(name, "1f1b") == 0) return min_int(pp - rank - 1, n_micro);
    return min_int((pp - rank - 1) * 2 + (v - 1) * pp, n_micro * v);
}

/* Combinations the schedules refuse, and the key the error must name. */
static const char *expected_refusal(const char *name, int pp, int v, int n_micro) {
    if (strcmp(name, "interleaved") != 0) return v != 1 ? "parallel.virtual_stages" : NULL;
    if (v < 2) return "parallel.virtual_stages";
    if (pp < 2) return "parallel.pp";
    if (n_micro % pp != 0) return "train.micro_batch";
    return NULL;
}

/* Builds all ranks' lists into lists[0..pp-1]; 0 or -1 (with err). */
static int build_all(const char *name, int pp, int v, int n_micro, pp_list *lists, char *err, size_t errlen) {
    for (int r = 0; r < pp; r++) {
        lists[r] = (pp_list){0};
        if (pp_schedule_build(name, pp, v, n_micro, r, &lists[r], err, errlen) != 0) return -1;
    }
    return 0;
}

static void free_all(pp_list *lists, int pp) {
    for (int r = 0; r < pp; r++) pp_list_free(&lists[r]);
}

/* Independent of the checker: on each chunk every micro-batch runs forward once, backward
 * once, forward first; forwards before the first backward match the warm-up formula;
 * pp = 1 lists have no send/recv. */
static void check_rank(const char *name, int pp, int v, int n_micro, int rank, const pp_list *l) {
    int cells = v * n_micro;
    int *fwd_at = malloc((size_t)cells * sizeof *fwd_at), *bwd_at = malloc((size_t)cells * sizeof *bwd_at);
    for (int i = 0; i < cells; i++) fwd_at[i] = bwd_at[i] = -1;
    int forwards_before_backward = -1, n_fwd = 0, n_comm = 0;
    for (int i = 0; i < l->n; i++) {
        const pp_action *a = &l->a[i];
        int at = a->chunk * n_micro + a->micro;
        if (a->kind == PP_FWD) {
            check(fwd_at[at] < 0, "%s pp=%d v=%d n=%d rank %d: forward %d/%d twice", name, pp, v, n_micro, rank,
                  a->micro, a->chunk);
            fwd_at[at] = i;
            n_fwd++;
        } else if (a->kind == PP_BWD) {
            check(bwd_at[at] < 0, "%s pp=%d v=%d n=%d rank %d: backward %d/%d twice", name, pp, v, n_micro, rank,
                  a->micro, a->chunk);
            bwd_at[at] = i;
            if (forwards_before_backward < 0) forwards_before_backward = n_fwd;
        } else {
            n_comm++;
        }
    }
    for (int i = 0; i < cells; i++)
        check(fwd_at[i] >= 0 && bwd_at[i] > fwd_at[i], "%s pp=%d v=%d n=%d rank %d: micro %d chunk %d: forward "
              "at %d, backward at %d", name, pp, v, n_micro, rank, i % n_micro, i / n_micro, fwd_at[i], bwd_at[i]);
    int w = pp_warmup_count(name, pp, v, n_micro, rank);
    int want_w = expected_warmup(name, pp, v, n_micro, rank);
    check(w == want_w, "%s pp=%d v=%d n=%d rank %d: warm-up %d, formula says %d", name, pp, v, n_micro, rank, w,
          want_w);
    int want_first = min_int(want_w + 1, cells);
    check(forwards_before_backward == want_first, "%s pp=%d v=%d n=%d rank %d: %d forwards before the first "
          "backward, expected %d", name, pp, v, n_micro, rank, forwards_before_backward, want_first);
    if (pp == 1) check(n_comm == 0, "%s pp=1 n=%d: %d send/recv actions", name, n_micro, n_comm);
    free(fwd_at);
    free(bwd_at);
}

/* pp_count_slots against a count by brute force (at every action, the micro-batches of
 * each chunk between their first and last action), and what the pipeline relies on: no
 * two live micro-batches of a chunk share slot micro % slots */
static void check_slots(const char *name, int pp, int v, int n_micro, int rank, const pp_list *l) {
    int slots[3] = {0, 0, 0};
    pp_count_slots(l, v, n_micro, slots);
    for (int c = 0; c < v; c++) {
        int most = 1, collided = 0;
        for (int i = 0; i < l->n; i++) {
            int live = 0, taken[8] = {0}; /* [n_micro <= 8] */
            for (int m = 0; m < n_micro; m++) {
                int first = -1, last = -1;
                for (int j = 0; j < l->n; j++)
                    if (l->a[j].chunk == c && l->a[j].micro == m) {
                        if (first < 0) first = j;
                        last = j;
                    }
                if (first > i || last < i) continue;
                live++;
                if (slots[c] > 0 && taken[m % slots[c]]++) collided = 1;
            }
            if (live > most) most = live;
        }
        check(slots[c] == most, "%s pp=%d v=%d n=%d rank %d: chunk %d needs %d slots, counted %d",
              name, pp, v, n_micro, rank, c, most, slots[c]);
        check(!collided, "%s pp=%d v=%d n=%d rank %d: chunk %d: two live micro-batches share a "
              "slot of %d", name, pp, v, n_micro, rank, c, slots[c]);
    }
}

/* Every adjacent (send, recv) pair with the same peer, swapped on its own, must deadlock:
 * the peer has the two messages in the opposite order. */
static void check_swaps_deadlock(const char *name, int pp, int v, int n_micro, pp_list *lists) {
    char err[512];
    int swaps = 0;
    for (int r = 0; r < pp; r++) {
        for (int i = 0; i + 1 < lists[r].n; i++) {
            pp_action *x = &lists[r].a[i], *y = &lists[r].a[i + 1];
            int x_send = x->kind == PP_SEND_ACT || x->kind == PP_SEND_GRAD;
            int y_send = y->kind == PP_SEND_ACT || y->kind == PP_SEND_GRAD;
            int x_comm = x->peer >= 0, y_comm = y->peer >= 0;
            if (!x_comm || !y_comm || x_send == y_send || x->peer != y->peer) continue;
            pp_action t = *x;
            *x = *y;
            *y = t;
            int rc = pp_schedule_check(pp, v, n_micro, lists, err, sizeof err);
            check(rc != 0 && strstr(err, "deadlock") != NULL, "%s pp=%d v=%d n=%d: swapping rank %d actions %d,%d "
                  "should deadlock, checker says: %s", name, pp, v, n_micro, r, i, i + 1, rc ? err : "ok");
            *y = *x;
            *x = t;
            swaps++;
        }
    }
    check(pp == 1 || swaps > 0, "%s pp=%d v=%d n=%d: no adjacent send/recv pair to swap", name, pp, v, n_micro);
}

/* pp_schedule_span on lists written out by hand: 1f1b's shape on pp = 2, 2 micro-batches,
 * except that stage 0 runs both forwards before sending either, so stage 1 starts late;
 * by hand: 10 units, one more than the built list's 9. */
static void hand_span(void) {
    pp_action r0[] = {{PP_FWD, 0, 0, -1},       {PP_FWD, 1, 0, -1},       {PP_SEND_ACT, 0, 0, 1},
                      {PP_SEND_ACT, 1, 0, 1},   {PP_RECV_GRAD, 0, 0, 1},  {PP_BWD, 0, 0, -1},
                      {PP_RECV_GRAD, 1, 0, 1},  {PP_BWD, 1, 0, -1}};
    pp_action r1[] = {{PP_RECV_ACT, 0, 0, 0},   {PP_FWD, 0, 0, -1},       {PP_RECV_ACT, 1, 0, 0},
                      {PP_BWD, 0, 0, -1},       {PP_SEND_GRAD, 0, 0, 0},  {PP_FWD, 1, 0, -1},
                      {PP_BWD, 1, 0, -1},       {PP_SEND_GRAD, 1, 0, 0}};
    pp_list lists[2] = {{r0, 8, 8}, {r1, 8, 8}};
    char err[512];
    long span = pp_schedule_span(2, 1, 2, lists, err, sizeof err);
    check(span == 10, "hand-made 1f1b pp=2 n=2 list: span %ld, by hand 10 (%s)", span,
          span < 0 ? err : "");
    pp_list built[2];
    if (build_all("1f1b", 2, 1, 2, built, err, sizeof err) != 0) {
        check(0, "1f1b pp=2 n=2: %s", err);
        return;
    }
    span = pp_schedule_span(2, 1, 2, built, err, sizeof err);
    check(span == 9, "built 1f1b pp=2 n=2 list: span %ld, expected 9", span);
    /* 2 micro-batches of 3 units in 9: a third idle, the (p - 1) / (m + p - 1) of 1F1B */
    check(fabs(pp_span_bubble(1, 2, span) - 1.0 / 3.0) < 1e-12, "bubble of 9 units: %g, not 1/3",
          pp_span_bubble(1, 2, span));
    free_all(built, 2);
}

/* Every accepted combination up to pp 8, v 4, 24 micro-batches: played with blocking
 * send/recv in list order, the lists take exactly the schedule's arithmetic, (v * n + pp -
 * 1) * 3 units: no rank waits at a send for a receiver still computing beyond the bubble.
 * (Placing each message where its producer ended made 54 of these 120 interleaved
 * combinations longer: pp = 2, v = 2, 8 micro-batches took 63 units, not 51.) */
static void spans(void) {
    const char *names[] = {"gpipe", "1f1b", "interleaved"};
    char err[512];
    int n_checked = 0;
    for (int s = 0; s < 3; s++)
        for (int pp = 1; pp <= 8; pp++)
            for (int v = 1; v <= 4; v++)
                for (int n = 1; n <= 24; n++) {
                    if (pp_schedule_validate(names[s], pp, v, n, err, sizeof err) != 0) continue;
                    pp_list lists[8];
                    if (build_all(names[s], pp, v, n, lists, err, sizeof err) != 0) {
                        check(0, "%s pp=%d v=%d n=%d: build failed: %s", names[s], pp, v, n, err);
                        continue;
                    }
                    long span = pp_schedule_span(pp, v, n, lists, err, sizeof err);
                    long want = (long)(v * n + pp - 1) * 3;
                    check(span == want, "%s pp=%d v=%d n=%d: blocking span %ld units, the "
                          "schedule's arithmetic %ld%s%s", names[s], pp, v, n, span, want,
                          span < 0 ? ": " : "", span < 0 ? err : "");
                    free_all(lists, pp);
                    n_checked++;
                }
    check(n_checked == 504, "%d combinations timed, expected 504", n_checked);
}

static int sweep(void) {
    const char *names[] = {"gpipe", "1f1b", "interleaved"};
    char err[512];
    int accepted = 0, refused = 0;
    for (int s = 0; s < 3; s++) {
        for (int pp = 1; pp <= 4; pp++) {
            for (int v = 1; v <= 3; v++) {
                for (int n = 1; n <= 8; n++) {
                    const char *key = expected_refusal(names[s], pp, v, n);
                    int rc = pp_schedule_validate(names[s], pp, v, n, err, sizeof err);
                    if (key) {
                        check(rc != 0 && strstr(err, key) != NULL, "%s pp=%d v=%d n=%d: expected a refusal naming "
                              "%s, got: %s", names[s], pp, v, n, key, rc ? err : "accepted");
                        check(pp_warmup_count(names[s], pp, v, n, 0) == -1, "%s pp=%d v=%d n=%d: warm-up of a "
                              "refused combination", names[s], pp, v, n);
                        pp_list l = {0};
                        check(pp_schedule_build(names[s], pp, v, n, 0, &l, err, sizeof err) != 0,
                              "%s pp=%d v=%d n=%d: built a refused combination", names[s], pp, v, n);
                        pp_list_free(&l);
                        refused++;
                        continue;
                    }
                    check(rc == 0, "%s pp=%d v=%d n=%d: refused: %s", names[s], pp, v, n, err);
                    pp_list lists[4];
                    if (build_all(names[s], pp, v, n, lists, err, sizeof err) != 0) {
                        check(0, "%s pp=%d v=%d n=%d: build failed: %s", names[s], pp, v, n, err);
                    } else {
                        rc = pp_schedule_check(pp, v, n, lists, err, sizeof err);
                        check(rc == 0, "%s pp=%d v=%d n=%d: checker: %s", names[s], pp, v, n, err);
                        for (int r = 0; r < pp; r++) {
                            check_rank(names[s], pp, v, n, r, &lists[r]);
                            check_slots(names[s], pp, v, n, r, &lists[r]);
                        }
                        check_swaps_deadlock(names[s], pp, v, n, lists);
                    }
                    free_all(lists, pp);
                    accepted++;
                }
            }
        }
    }
    printf("sweep: %d combinations built and checked, %d refused\n", accepted, refused);
    return accepted;
}

static void expect_refusal(const char *name, int pp, int v, int n_micro, const char *needle) {
    char err[512];
    int rc = pp_schedule_validate(name, pp, v, n_micro, err, sizeof err);
    check(rc != 0 && strstr(err, needle) != NULL, "%s pp=%d v=%d n=%d: expected refusal with '%s', got: %s",
          name ? name : "(null)", pp, v, n_micro, needle, rc ? err : "accepted");
    if (rc != 0) printf("refused: %s\n", err);
}

static void refusals(void) {
    expect_refusal("zigzag", 2, 1, 4, "parallel.schedule");
    expect_refusal(NULL, 2, 1, 4, "parallel.schedule");
    expect_refusal("1f1b", 0, 1, 4, "parallel.pp");
    expect_refusal("1f1b", 2, 0, 4, "parallel.virtual_stages");
    expect_refusal("1f1b", 2, 1, 0, "train.micro_batch");
    expect_refusal("1f1b", 2, 2, 4, "parallel.virtual_stages");
    expect_refusal("gpipe", 2, 3, 4, "parallel.virtual_stages");
    expect_refusal("interleaved", 2, 1, 4, "parallel.virtual_stages");
    expect_refusal("interleaved", 1, 2, 4, "parallel.pp");
    expect_refusal("interleaved", 4, 2, 6, "train.micro_batch");
    char err[256];
    pp_list l = {0};
    check(pp_schedule_build("1f1b", 2, 1, 4, 2, &l, err, sizeof err) != 0 && strstr(err, "rank") != NULL,
          "rank 2 of pp=2 was built");
    pp_list_free(&l);
}

/* ---- hand-broken lists ---- */

static pp_action act(pp_kind k, int micro, int chunk, int peer) { return (pp_action){k, micro, chunk, peer}; }

static void remove_at(pp_list *l, int i) {
    memmove(&l->a[i], &l->a[i + 1], (size_t)(l->n - i - 1) * sizeof *l->a);
    l->n--;
}

static int find(const pp_list *l, pp_kind k, int micro) {
    for (int i = 0; i < l->n; i++)
        if (l->a[i].kind == k && l->a[i].micro == micro) return i;
    return -1;
}

/* Builds (name, pp, n_micro) with v = 1, lets `breakit` change it, and expects the checker to
 * refuse it with a message containing `needle`. */
static void expect_broken(const char *what, const char *name, int pp, int n_micro,
                          void (*breakit)(pp_list *lists), const char *needle) {
    char err[512];
    pp_list lists[4];
    if (build_all(name, pp, 1, n_micro, lists, err, sizeof err) != 0) {
        check(0, "%s: build failed: %s", what, err);
        free_all(lists, pp);
        return;
    }
    check(pp_schedule_check(pp, 1, n_micro, lists, err, sizeof err) == 0, "%s: intact lists fail: %s", what, err);
    breakit(lists);
    int rc = pp_schedule_check(pp, 1, n_micro, lists, err, sizeof err);
    check(rc != 0 && strstr(err, needle) != NULL, "%s: expected '%s', checker says: %s", what, needle,
          rc ? err : "ok");
    if (rc != 0) printf("%-28s -> %s\n", what, err);
    free_all(lists, pp);
}

static void drop_first_recv_act_rank1(pp_list *lists) { remove_at(&lists[1], find(&lists[1], PP_RECV_ACT, 0)); }
static void drop_first_send_grad_rank1(pp_list *lists) { remove_at(&lists[1], find(&lists[1], PP_SEND_GRAD, 0)); }
static void backward_first(pp_list *lists) {
    /* pp = 1, 1f1b: F0 B0 F1 B1 -> B0 F0 F1 B1 */
    pp_action t = lists[0].a[0];
    lists[0].a[0] = lists[0].a[1];
    lists[0].a[1] = t;
}
static void duplicate_forward(pp_list *lists) {
    int i = find(&lists[0], PP_FWD, 1);
    pp_list_push(&lists[0], lists[0].a[lists[0].n - 1]);
    memmove(&lists[0].a[i + 1], &lists[0].a[i], (size_t)(lists[0].n - 2 - i) * sizeof *lists[0].a);
}
static void recv_wrong_peer(pp_list *lists) { lists[1].a[find(&lists[1], PP_RECV_ACT, 0)].peer = 2; }
static void backwards_reordered(pp_list *lists) {
    /* pp = 1, gpipe: F0 F1 B0 B1 -> F0 F1 B1 B0 */
    pp_action t = lists[0].a[2];
    lists[0].a[2] = lists[0].a[3];
    lists[0].a[3] = t;
}
static void backward_before_gradient(pp_list *lists) {
    /* rank 0 runs backward 0 and only then receives its gradient */
    int rg = find(&lists[0], PP_RECV_GRAD, 0), b = find(&lists[0], PP_BWD, 0);
    pp_action t = lists[0].a[rg];
    memmove(&lists[0].a[rg], &lists[0].a[rg + 1], (size_t)(b - rg) * sizeof t);
    lists[0].a[b] = t;
}
static void send_before_forward(pp_list *lists) {
    /* rank 0 sends activation 0 before computing it */
    int f = find(&lists[0], PP_FWD, 0), s = find(&lists[0], PP_SEND_ACT, 0);
    pp_action t = lists[0].a[f];
    lists[0].a[f] = lists[0].a[s];
    lists[0].a[s] = t;
}

/* The textbook 1F1B with "recv before compute, send after compute" on every action:
 * rank 0 sends activation 1 while rank 1 sends gradient 0; neither recv is posted. */
static void textbook_deadlock(void) {
    pp_list lists[2] = {{0}, {0}};
    pp_action r0[] = {act(PP_FWD, 0, 0, -1), act(PP_SEND_ACT, 0, 0, 1), act(PP_FWD, 1, 0, -1),
                      act(PP_SEND_ACT, 1, 0, 1), act(PP_RECV_GRAD, 0, 0, 1), act(PP_BWD, 0, 0, -1),
                      act(PP_RECV_GRAD, 1, 0, 1), act(PP_BWD, 1, 0, -1)};
    pp_action r1[] = {act(PP_RECV_ACT, 0, 0, 0), act(PP_FWD, 0, 0, -1), act(PP_BWD, 0, 0, -1),
                      act(PP_SEND_GRAD, 0, 0, 0), act(PP_RECV_ACT, 1, 0, 0), act(PP_FWD, 1, 0, -1),
                      act(PP_BWD, 1, 0, -1), act(PP_SEND_GRAD, 1, 0, 0)};
    for (size_t i = 0; i < sizeof r0 / sizeof r0[0]; i++) pp_list_push(&lists[0], r0[i]);
    for (size_t i = 0; i < sizeof r1 / sizeof r1[0]; i++) pp_list_push(&lists[1], r1[i]);
    char err[512];
    int rc = pp_schedule_check(2, 1, 2, lists, err, sizeof err);
    check(rc != 0 && strstr(err, "deadlock") != NULL, "textbook 1F1B: expected a deadlock, checker says: %s",
          rc ? err : "ok");
    if (rc != 0) printf("%-28s -> %s\n", "textbook 1F1B", err);
    /* receiving the gradient before sending the next activation on rank 0 fixes it */
    pp_action t = lists[0].a[3];
    lists[0].a[3] = lists[0].a[4];
    lists[0].a[4] = t;
    rc = pp_schedule_check(2, 1, 2, lists, err, sizeof err);
    check(rc == 0, "textbook 1F1B with rank 0's send/recv swapped: %s", err);
    pp_list_free(&lists[0]);
    pp_list_free(&lists[1]);
}

static void broken_lists(void) {
    textbook_deadlock();
    expect_broken("missing recv", "1f1b", 2, 4, drop_first_recv_act_rank1, "input activation");
    expect_broken("missing send", "1f1b", 2, 4, drop_first_send_grad_rank1, "rank 0");
    expect_broken("backward before forward", "1f1b", 1, 2, backward_first, "backward before its forward");
    expect_broken("backward before its gradient", "1f1b", 2, 4, backward_before_gradient, "output gradient");
    expect_broken("duplicated forward", "1f1b", 2, 4, duplicate_forward, "duplicate forward");
    expect_broken("recv from wrong peer", "1f1b", 3, 3, recv_wrong_peer, "wrong peer");
    expect_broken("backwards out of order", "gpipe", 1, 2, backwards_reordered, "forward order");
    expect_broken("send before its forward", "1f1b", 2, 2, send_before_forward, "send before");
}

/* ---- timeline rendering ---- */

/* Plays the lists with unit-time computes, each as early as its rank's order and its data
 * allow (messages take no time), and prints one row per rank: F/B, micro, chunk letter. */
static void render(const char *name, int pp, int v, int n_micro) {
    char err[512];
    pp_list lists[4];
    if (build_all(name, pp, v, n_micro, lists, err, sizeof err) != 0) {
        check(0, "render %s: %s", name, err);
        free_all(lists, pp);
        return;
    }
    int S = pp * v, slots = 0;
    int *fdone = malloc((size_t)S * n_micro * sizeof *fdone), *bdone = malloc((size_t)S * n_micro * sizeof *bdone);
    int pos[4] = {0}, cap = 4 * n_micro * v + 4 * S;
    char *grid = malloc((size_t)pp * cap * 4);
    memset(grid, ' ', (size_t)pp * cap * 4);
    for (int i = 0; i < S * n_micro; i++) fdone[i] = bdone[i] = -1;
    for (int t = 0, left = 1; left && t < cap; t++) {
        left = 0;
        for (int r = 0; r < pp; r++) {
            while (pos[r] < lists[r].n && lists[r].a[pos[r]].peer >= 0) pos[r]++; /* messages are free */
            if (pos[r] == lists[r].n) continue;
            left = 1;
            const pp_action *a = &lists[r].a[pos[r]];
            int g = pp_stage(pp, r, a->chunk), m = a->micro;
            int ok;
            if (a->kind == PP_FWD) ok = g == 0 || (fdone[(g - 1) * n_micro + m] >= 0 && fdone[(g - 1) * n_micro + m] < t);
            else ok = g == S - 1 || (bdone[(g + 1) * n_micro + m] >= 0 && bdone[(g + 1) * n_micro + m] < t);
            if (!ok) continue;
            (a->kind == PP_FWD ? fdone : bdone)[g * n_micro + m] = t;
            char cellbuf[8];
            snprintf(cellbuf, sizeof cellbuf, "%c%d%c", a->kind == PP_FWD ? 'F' : 'B', m, v > 1 ? 'a' + a->chunk : ' ');
            memcpy(&grid[((size_t)r * cap + t) * 4], cellbuf, strlen(cellbuf));
            if (t + 1 > slots) slots = t + 1;
            pos[r]++;
        }
    }
    printf("\n%s, pp=%d, v=%d, n_micro=%d (F/B micro-batch%s; one column per time unit)\n", name, pp, v, n_micro,
           v > 1 ? ", chunk a/b/c" : "");
    for (int r = 0; r < pp; r++) {
        printf("rank %d |", r);
        for (int t = 0; t < slots; t++) {
            const char *c = &grid[((size_t)r * cap + t) * 4];
            printf("%.4s", c[0] == ' ' ? " .  " : c);
        }
        printf("\n");
    }
    free(grid);
    free(fdone);
    free(bdone);
    free_all(lists, pp);
}

static void print_list(const char *name, int pp, int v, int n_micro, int rank) {
    char err[256], what[96];
    pp_list l = {0};
    if (pp_schedule_build(name, pp, v, n_micro, rank, &l, err, sizeof err) != 0) {
        check(0, "print %s: %s", name, err);
        return;
    }
    printf("\n%s, pp=%d, v=%d, n_micro=%d: rank %d's list\n", name, pp, v, n_micro, rank);
    for (int i = 0; i < l.n; i++) {
        pp_action_format(&l.a[i], what, sizeof what);
        printf("  %2d %s\n", i, what);
    }
    pp_list_free(&l);
}

int main(void) {
    int accepted = sweep();
    /* gpipe and 1f1b: 4 pp x 8 n_micro each; interleaved: v 2..3 x n_micro in {2,4,6,8} (pp 2),
     * {3,6} (pp 3), {4,8} (pp 4) */
    check(accepted == 32 + 32 + 2 * 8, "%d combinations accepted, expected 80", accepted);
    refusals();
    broken_lists();
    hand_span();
    spans();
    render("gpipe", 4, 1, 8);
    render("1f1b", 4, 1, 8);
    render("interleaved", 4, 2, 8);
    print_list("1f1b", 4, 1, 8, 1);
    if (failures) {
        fprintf(stderr, "test_schedule: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_schedule: all passed\n");
    return 0;
}
