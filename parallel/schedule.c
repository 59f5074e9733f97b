/* Pipeline schedules as data (see schedule.h for the layout and the meaning of each action).
 *
 * Building a rank's list takes two steps:
 *   1. the compute order: which forward/backward each rank runs next. All three schedules are
 *      warm-up / steady 1F1B / cool-down; they differ only in the warm-up count (gpipe is 1F1B
 *      whose warm-up is every micro-batch) and, for interleaved, in the micro/chunk of the
 *      k-th forward and backward.
 *   2. the messages: every rank's compute order is played in an idealised run (forward 1,
 *      backward 2 time units, a compute starts when its rank is free and its input exists).
 *      Each message is handed over at the first instant after its producer finishes when
 *      both its ranks are between computes (play); every rank's list is its computes and
 *      its messages sorted by (time, messages before computes, message key). The key is the
 *      same on both ends of a message, so all lists are projections of one global order, which
 *      is exactly what makes blocking send/recv in list order deadlock-free.
 * The plain alternative, "recv before the compute, send after it", deadlocks 1F1B: stage r
 * sends activation m+w and then waits for gradient m, while stage r+1 sends gradient m and then
 * waits for activation m+w. Step 2 orders such pairs the same way on both sides.
 *
 * The checker does not trust the builder: it replays all lists with rendezvous semantics. */
#include "parallel/schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/log.h"

/* ---- lists and names ---- */

int pp_list_push(pp_list *l, pp_action a) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        pp_action *p = realloc(l->a, (size_t)cap * sizeof *p);
        if (!p) return -1;
        l->a = p;
        l->cap = cap;
    }
    l->a[l->n++] = a;
    return 0;
}

void pp_list_free(pp_list *l) {
    free(l->a);
    l->a = NULL;
    l->n = l->cap = 0;
}

const char *pp_kind_name(pp_kind k) {
    switch (k) {
    case PP_FWD: return "FWD";
    case PP_BWD: return "BWD";
    case PP_SEND_ACT: return "SEND_ACT";
    case PP_RECV_ACT: return "RECV_ACT";
    case PP_SEND_GRAD: return "SEND_GRAD";
    case PP_RECV_GRAD: return "RECV_GRAD";
    }
    return "?";
}

static int is_compute(pp_kind k) { return k == PP_FWD || k == PP_BWD; }
static int is_send(pp_kind k) { return k == PP_SEND_ACT || k == PP_SEND_GRAD; }
static int is_known_kind(int k) { return k >= PP_FWD && k <= PP_RECV_GRAD; }

void pp_action_format(const pp_action *a, char *buf, size_t len) {
    if (!is_known_kind((int)a->kind)) {
        snprintf(buf, len, "kind %d micro %d chunk %d peer %d", (int)a->kind, a->micro, a->chunk, a->peer);
    } else if (is_compute(a->kind)) {
        snprintf(buf, len, "%s micro %d chunk %d", pp_kind_name(a->kind), a->micro, a->chunk);
    } else {
        snprintf(buf, len, "%s micro %d chunk %d %s rank %d", pp_kind_name(a->kind), a->micro, a->chunk,
                 is_send(a->kind) ? "to" : "from", a->peer);
    }
}

int pp_stage(int pp, int rank, int chunk) { return chunk * pp + rank; }

/* The stage on the other end of a message: activations flow to g+1 and come from g-1,
 * gradients flow to g-1 and come from g+1. */
static int peer_stage(int g, pp_kind k) {
    return (k == PP_SEND_ACT || k == PP_RECV_GRAD) ? g + 1 : g - 1;
}

int pp_peer_chunk(int pp, int rank, const pp_action *a) {
    return peer_stage(pp_stage(pp, rank, a->chunk), a->kind) / pp;
}

/* ---- which combinations exist ---- */

typedef enum { SCHED_GPIPE, SCHED_1F1B, SCHED_INTERLEAVED } sched_kind;

static int parse_name(const char *name, sched_kind *s) {
    if (!name) return -1;
    if (strcmp(name, "gpipe") == 0) *s = SCHED_GPIPE;
    else if (strcmp(name, "1f1b") == 0) *s = SCHED_1F1B;
    else if (strcmp(name, "interleaved") == 0) *s = SCHED_INTERLEAVED;
    else return -1;
    return 0;
}

int pp_schedule_validate(const char *name, int pp, int v, int n_micro, char *err, size_t errlen) {
    sched_kind s;
    if (parse_name(name, &s) != 0) {
        snprintf(err, errlen, "parallel.schedule: unknown schedule '%s' (gpipe|1f1b|interleaved)",
                 name ? name : "(null)");
        return -1;
    }
    if (pp < 1) {
        snprintf(err, errlen, "parallel.pp: must be >= 1 (got %d)", pp);
        return -1;
    }
    if (v < 1) {
        snprintf(err, errlen, "parallel.virtual_stages: must be >= 1 (got %d)", v);
        return -1;
    }
    if (n_micro < 1) {
        snprintf(err, errlen,
                 "train.micro_batch: the number of micro-batches train.global_batch / (parallel.dp * "
                 "train.micro_batch) must be >= 1 (got %d)", n_micro);
        return -1;
    }
    if (s != SCHED_INTERLEAVED) {
        if (v != 1) {
            snprintf(err, errlen,
                     "parallel.virtual_stages = %d needs parallel.schedule = interleaved (got %s)", v, name);
            return -1;
        }
        return 0;
    }
    if (v < 2) {
        snprintf(err, errlen, "parallel.schedule = interleaved needs parallel.virtual_stages >= 2 (got %d)", v);
        return -1;
    }
    /* With one rank every chunk boundary would be a hand-off inside the rank, and there is no
     * bubble for interleaving to shrink. */
    if (pp < 2) {
        snprintf(err, errlen, "parallel.schedule = interleaved needs parallel.pp >= 2 (got %d)", pp);
        return -1;
    }
    /* Megatron's interleaving moves micro-batches through the chunks in groups of pp. */
    if (n_micro % pp != 0) {
        snprintf(err, errlen,
                 "train.micro_batch: parallel.schedule = interleaved needs the number of micro-batches "
                 "train.global_batch / (parallel.dp * train.micro_batch) = %d to be a multiple of "
                 "parallel.pp = %d", n_micro, pp);
        return -1;
    }
    return 0;
}

/* ---- step 1: the compute order ---- */

static int min_int(int a, int b) { return a < b ? a : b; }

int pp_warmup_count(const char *name, int pp, int v, int n_micro, int rank) {
    char err[256];
    sched_kind s;
    if (parse_name(name, &s) != 0 || pp_schedule_validate(name, pp, v, n_micro, err, sizeof err) != 0 ||
        rank < 0 || rank >= pp)
        return -1;
    switch (s) {
    case SCHED_GPIPE:
        /* all forwards first: the whole step is warm-up */
        return n_micro;
    case SCHED_1F1B:
        /* the ranks after this one each need one micro-batch in flight before the first
         * gradient can come back */
        return min_int(pp - rank - 1, n_micro);
    case SCHED_INTERLEAVED:
        /* Megatron: twice the distance to the last rank, plus one full round of the other
         * v-1 chunks, so that the first backward's gradient is on its way when it is needed */
        return min_int((pp - rank - 1) * 2 + (v - 1) * pp, n_micro * v);
    }
    return -1;
}

/* The k-th forward on a rank. Micro-batches move through the chunks in groups of pp: micros
 * 0..pp-1 on chunk 0, the same micros on chunk 1, ..., then micros pp..2pp-1 on chunk 0, and
 * so on. With v = 1 this is simply micro k on chunk 0. */
static pp_action kth_forward(int k, int pp, int v) {
    int group = k / (pp * v), in_group = k % (pp * v);
    pp_action a = {PP_FWD, group * pp + in_group % pp, in_group / pp, -1};
    return a;
}

/* The k-th backward: the same micro-batch order, with the chunks walked last to first. */
static pp_action kth_backward(int k, int pp, int v) {
    pp_action a = kth_forward(k, pp, v);
    a.kind = PP_BWD;
    a.chunk = v - 1 - a.chunk;
    return a;
}

static int compute_order(int pp, int v, int n_micro, int warmup, pp_list *out) {
    int total = n_micro * v;
    int rc = 0;
    /* warm-up: forwards only, filling the pipeline */
    for (int k = 0; k < warmup; k++) rc |= pp_list_push(out, kth_forward(k, pp, v));
    /* steady state: each new forward is followed by the oldest backward */
    for (int k = 0; k < total - warmup; k++) {
        rc |= pp_list_push(out, kth_forward(warmup + k, pp, v));
        rc |= pp_list_push(out, kth_backward(k, pp, v));
    }
    /* cool-down: drain the backwards still owed */
    for (int k = total - warmup; k < total; k++) rc |= pp_list_push(out, kth_backward(k, pp, v));
    return rc;
}

/* ---- step 2: the messages ---- */

enum { COST_FWD = 1, COST_BWD = 2 };

/* One entry of a rank's list before sorting. Messages sort before computes at the same time
 * (a recv must precede the compute that starts when it arrives; a send follows the compute
 * that ended then). Messages at the same time sort by (gradient?, source stage, micro), a key
 * both ends compute alike. */
typedef struct {
    long time;
    int is_compute;
    int is_grad, src_stage, micro;
    pp_action act;
} event;

static int event_cmp(const void *pa, const void *pb) {
    const event *a = pa, *b = pb;
    if (a->time != b->time) return a->time < b->time ? -1 : 1;
    if (a->is_compute != b->is_compute) return a->is_compute - b->is_compute;
    if (a->is_grad != b->is_grad) return a->is_grad - b->is_grad;
    if (a->src_stage != b->src_stage) return a->src_stage - b->src_stage;
    return a->micro - b->micro;
}

/* A tensor produced (its compute ended) and not yet handed over. */
typedef struct {
    int is_grad, src, dst, micro; /* src and dst: stages */
} message;

/* The idealised run's state: every rank's compute order played with forward 1, backward 2
 * time units, and every message handed over as a rendezvous, at the first instant when
 * neither of its ranks is inside a compute. */
typedef struct {
    int pp, S, n_micro, rank;
    const pp_list *orders;    /* [pp] each rank's compute order */
    int *pos;                 /* [pp] each rank's next compute */
    long *end;                /* [pp] when each rank's compute ends; -1: between computes */
    pp_action *cur;           /* [pp] each rank's compute in progress */
    unsigned char *fwd_done;  /* [stage][micro] */
    unsigned char *act_in;    /* [stage][micro] the input activation arrived */
    unsigned char *grad_in;   /* [stage][micro] the output gradient arrived */
    message *pending;         /* [2 * S * n_micro] at most every message at once */
    int n_pending;
    event *ev;                /* [cap] rank's computes and message ends */
    int n_ev;
} run;

static size_t sm(const run *u, int g, int m) { return (size_t)g * u->n_micro + m; }

/* Rank r's compute in progress ended at x: its tensor waits for its receiver. */
static void finish(run *u, int r) {
    const pp_action *a = &u->cur[r];
    int g = pp_stage(u->pp, r, a->chunk);
    u->end[r] = -1;
    if (a->kind == PP_FWD) {
        u->fwd_done[sm(u, g, a->micro)] = 1;
        if (g < u->S - 1) u->pending[u->n_pending++] = (message){0, g, g + 1, a->micro};
    } else if (g > 0) {
        u->pending[u->n_pending++] = (message){1, g, g - 1, a->micro};
    }
}

/* Hands over, at x, every waiting message whose two ranks are between computes, and adds
 * rank's ends of them to its events. */
static void hand_over(run *u, long x) {
    int kept = 0;
    for (int i = 0; i < u->n_pending; i++) {
        message q = u->pending[i];
        int from = q.src % u->pp, to = q.dst % u->pp;
        if (u->end[from] >= 0 || u->end[to] >= 0) {
            u->pending[kept++] = q;
            continue;
        }
        (q.is_grad ? u->grad_in : u->act_in)[sm(u, q.dst, q.micro)] = 1;
        if (u->rank == from) {
            pp_action a = {q.is_grad ? PP_SEND_GRAD : PP_SEND_ACT, q.micro, q.src / u->pp, to};
            u->ev[u->n_ev++] = (event){x, 0, q.is_grad, q.src, q.micro, a};
        }
        if (u->rank == to) {
            pp_action a = {q.is_grad ? PP_RECV_GRAD : PP_RECV_ACT, q.micro, q.dst / u->pp, from};
            u->ev[u->n_ev++] = (event){x, 0, q.is_grad, q.src, q.micro, a};
        }
    }
    u->n_pending = kept;
}

/* Starts, at x, rank r's next compute if it is between computes and the compute's input
 * is there. */
static void start(run *u, int r, long x) {
    if (u->end[r] >= 0 || u->pos[r] >= u->orders[r].n) return;
    const pp_action *a = &u->orders[r].a[u->pos[r]];
    int g = pp_stage(u->pp, r, a->chunk);
    size_t at = sm(u, g, a->micro);
    int ready = a->kind == PP_FWD ? g == 0 || u->act_in[at]
                                  : u->fwd_done[at] && (g == u->S - 1 || u->grad_in[at]);
    if (!ready) return;
    u->cur[r] = *a;
    u->pos[r]++;
    u->end[r] = x + (a->kind == PP_FWD ? COST_FWD : COST_BWD);
    if (r == u->rank) u->ev[u->n_ev++] = (event){x, 1, 0, 0, 0, *a};
}

/* Plays the run from time 0 to its end, one instant at a time (an instant is when some
 * compute ends): computes ending then finish, messages are handed over, computes start.
 * A rank whose next compute lacks its input waits between computes; a rank with a tensor
 * to send does not wait for its receiver, it sends at a later instant when both are free.
 * So every message happens when both its ranks are between computes, and blocking
 * send/recv in the resulting list order keeps this run's times: no rank waits at a send
 * for a receiver still computing (placing each message where its producer ends, instead,
 * made interleaved pp = 2 wait 24% of a step for a bubble of 6%, test_schedule's spans).
 * 0, or -1 if some compute never gets its input (a bug in step 1). */
static int play(run *u) {
    long x = 0;
    for (;;) {
        for (int r = 0; r < u->pp; r++)
            if (u->end[r] >= 0 && u->end[r] <= x) finish(u, r);
        hand_over(u, x);
        for (int r = 0; r < u->pp; r++) start(u, r, x);
        long next = -1;
        for (int r = 0; r < u->pp; r++)
            if (u->end[r] >= 0 && (next < 0 || u->end[r] < next)) next = u->end[r];
        if (next < 0) break; /* nothing computing: the run is over, or stuck */
        x = next;
    }
    for (int r = 0; r < u->pp; r++)
        if (u->pos[r] < u->orders[r].n) return -1;
    return u->n_pending == 0 ? 0 : -1;
}

int pp_schedule_build(const char *name, int pp, int v, int n_micro, int rank, pp_list *out, char *err,
                      size_t errlen) {
    if (pp_schedule_validate(name, pp, v, n_micro, err, errlen) != 0) return -1;
    if (rank < 0 || rank >= pp) {
        snprintf(err, errlen, "pp schedule: rank %d outside 0..parallel.pp-1 = 0..%d", rank, pp - 1);
        return -1;
    }
    /* Every rank's compute order is needed to place this rank's messages. */
    int S = pp * v;
    size_t cells = (size_t)S * n_micro;
    pp_list *orders = calloc((size_t)pp, sizeof *orders); /* [pp] each rank's compute order */
    /* at most: every compute of this rank, plus one end of every message */
    size_t cap = 2 * (size_t)v * n_micro + 2 * cells;
    run u = {pp, S, n_micro, rank, orders, calloc((size_t)pp, sizeof(int)),
             malloc((size_t)pp * sizeof(long)), calloc((size_t)pp, sizeof(pp_action)),
             calloc(cells, 1), calloc(cells, 1), calloc(cells, 1),
             malloc(2 * cells * sizeof(message)), 0, malloc(cap * sizeof(event)), 0};
    int rc = -1;
    if (!orders || !u.pos || !u.end || !u.cur || !u.fwd_done || !u.act_in || !u.grad_in ||
        !u.pending || !u.ev) {
        snprintf(err, errlen, "pp schedule: out of memory");
        goto done;
    }
    for (int r = 0; r < pp; r++) {
        u.end[r] = -1;
        if (compute_order(pp, v, n_micro, pp_warmup_count(name, pp, v, n_micro, r), &orders[r]) != 0) {
            snprintf(err, errlen, "pp schedule: out of memory");
            goto done;
        }
    }
    if (play(&u) != 0) {
        snprintf(err, errlen, "pp schedule: internal error: %s compute order for pp=%d v=%d n_micro=%d stalls",
                 name, pp, v, n_micro);
        goto done;
    }
    qsort(u.ev, (size_t)u.n_ev, sizeof *u.ev, event_cmp);
    rc = 0;
    for (int i = 0; i < u.n_ev; i++) rc |= pp_list_push(out, u.ev[i].act);
    if (rc != 0) snprintf(err, errlen, "pp schedule: out of memory");
done:
    if (orders)
        for (int r = 0; r < pp; r++) pp_list_free(&orders[r]);
    free(orders);
    free(u.pos);
    free(u.end);
    free(u.cur);
    free(u.fwd_done);
    free(u.act_in);
    free(u.grad_in);
    free(u.pending);
    free(u.ev);
    return rc;
}

/* ---- the checker ---- */

/* Replays all lists at once. Computes never wait: everything they need comes from earlier
 * actions of the same list, so if it is missing when the compute is reached it never will
 * be. A send completes together with the peer's matching recv (rendezvous), so a rank waits
 * at a send until the peer's current action is that recv, and at a recv until the peer's
 * current action is that send. Each rank's lists are fixed sequences and each message has one
 * possible partner, so an enabled step stays enabled until taken: taking steps greedily
 * reaches the end exactly when some execution does, and a state with nothing enabled is a
 * deadlock of every execution. */
typedef struct {
    int pp, v, n_micro, S;
    const pp_list *lists;                             /* [pp] every rank's list */
    int *pc;                                          /* [pp] next action of each rank */
    unsigned char *fwd, *bwd, *act_in, *grad_in, *act_out, *grad_out; /* [rank][chunk][micro] */
    int *fwd_order;                                   /* [rank][chunk][i]: micro of i-th forward */
    int *n_fwd, *n_bwd;                               /* [rank][chunk] */
    long *clock;                                      /* [pp] forward 1, backward 2 a chunk */
    char *err;
    size_t errlen;
} checker;

static size_t cell(const checker *c, int r, int chunk, int m) {
    return ((size_t)r * c->v + chunk) * c->n_micro + m;
}

/* Sets the error "rank r action i (ACTION): why" and returns -1. */
static int fail_at(const checker *c, int r, int i, const char *why) {
    char what[96];
    pp_action_format(&c->lists[r].a[i], what, sizeof what);
    snprintf(c->err, c->errlen, "pp schedule: rank %d action %d (%s): %s", r, i, what, why);
    return -1;
}

/* Shape of one action on its own: ranges, and the peer being the adjacent stage's rank. */
static int check_static(const checker *c, int r, int i) {
    const pp_action *a = &c->lists[r].a[i];
    char why[128];
    if (!is_known_kind((int)a->kind)) return fail_at(c, r, i, "unknown action kind");
    if (a->micro < 0 || a->micro >= c->n_micro) return fail_at(c, r, i, "micro-batch out of range");
    if (a->chunk < 0 || a->chunk >= c->v) return fail_at(c, r, i, "chunk out of range");
    if (is_compute(a->kind)) return a->peer == -1 ? 0 : fail_at(c, r, i, "a compute must have peer -1");
    int g = pp_stage(c->pp, r, a->chunk), pg = peer_stage(g, a->kind);
    if (pg < 0) return fail_at(c, r, i, "stage 0 has no previous stage to exchange with");
    if (pg >= c->S) return fail_at(c, r, i, "the last stage has no next stage to exchange with");
    if (a->peer != pg % c->pp) {
        snprintf(why, sizeof why, "wrong peer: stage %d's partner is stage %d on rank %d", g, pg, pg % c->pp);
        return fail_at(c, r, i, why);
    }
    if (a->peer == r) return fail_at(c, r, i, "a rank cannot send to itself");
    return 0;
}

static int run_compute(checker *c, int r, int i) {
    const pp_action *a = &c->lists[r].a[i];
    int g = pp_stage(c->pp, r, a->chunk);
    c->clock[r] += a->kind == PP_FWD ? COST_FWD : COST_BWD;
    size_t at = cell(c, r, a->chunk, a->micro);
    size_t rc = (size_t)r * c->v + a->chunk;
    if (a->kind == PP_FWD) {
        if (c->fwd[at]) return fail_at(c, r, i, "duplicate forward");
        if (g > 0 && !c->act_in[at]) return fail_at(c, r, i, "forward before its input activation was received");
        c->fwd[at] = 1;
        c->fwd_order[rc * c->n_micro + c->n_fwd[rc]++] = a->micro;
        return 0;
    }
    if (c->bwd[at]) return fail_at(c, r, i, "duplicate backward");
    if (!c->fwd[at]) return fail_at(c, r, i, "backward before its forward");
    if (g < c->S - 1 && !c->grad_in[at])
        return fail_at(c, r, i, "backward before its output gradient was received");
    int expected = c->fwd_order[rc * c->n_micro + c->n_bwd[rc]];
    if (a->micro != expected) {
        char why[128];
        snprintf(why, sizeof why, "backwards on this chunk must follow forward order: micro %d is next", expected);
        return fail_at(c, r, i, why);
    }
    c->bwd[at] = 1;
    c->n_bwd[rc]++;
    return 0;
}

/* Flags of the tensor a send carries / a recv fills, on this rank. */
static unsigned char *send_flag(const checker *c, pp_kind k, size_t at) {
    return k == PP_SEND_ACT ? &c->act_out[at] : &c->grad_out[at];
}
static unsigned char *recv_flag(const checker *c, pp_kind k, size_t at) {
    return k == PP_RECV_ACT ? &c->act_in[at] : &c->grad_in[at];
}

/* Is peer's current action the recv that matches rank r's send a? */
static int matches(const checker *c, int r, const pp_action *a, int peer) {
    if (c->pc[peer] >= c->lists[peer].n) return 0;
    const pp_action *b = &c->lists[peer].a[c->pc[peer]];
    pp_kind want = a->kind == PP_SEND_ACT ? PP_RECV_ACT : PP_RECV_GRAD;
    return b->kind == want && b->micro == a->micro && b->peer == r && b->chunk == pp_peer_chunk(c->pp, r, a);
}

/* Runs rank r as far as it goes without waiting: 1 if it moved, 0 if not, -1 on an error. */
static int advance(checker *c, int r) {
    int moved = 0;
    while (c->pc[r] < c->lists[r].n) {
        int i = c->pc[r];
        const pp_action *a = &c->lists[r].a[i];
        size_t at = cell(c, r, a->chunk, a->micro);
        if (is_compute(a->kind)) {
            if (run_compute(c, r, i) != 0) return -1;
            c->pc[r]++;
        } else if (is_send(a->kind)) {
            int produced = a->kind == PP_SEND_ACT ? c->fwd[at] : c->bwd[at];
            if (!produced) return fail_at(c, r, i, "send before the compute that produces its tensor");
            if (*send_flag(c, a->kind, at)) return fail_at(c, r, i, "duplicate send");
            if (!matches(c, r, a, a->peer)) break;
            /* the rendezvous: both sides complete together */
            const pp_action *b = &c->lists[a->peer].a[c->pc[a->peer]];
            *send_flag(c, a->kind, at) = 1;
            *recv_flag(c, b->kind, cell(c, a->peer, b->chunk, b->micro)) = 1;
            if (c->clock[a->peer] < c->clock[r]) c->clock[a->peer] = c->clock[r];
            else c->clock[r] = c->clock[a->peer];
            c->pc[r]++;
            c->pc[a->peer]++;
        } else {
            if (*recv_flag(c, a->kind, at)) return fail_at(c, r, i, "duplicate receive");
            break; /* completed by the sender's step */
        }
        moved = 1;
    }
    return moved;
}

/* Nothing can move: say who waits for whom. */
static int report_stuck(const checker *c) {
    for (int r = 0; r < c->pp; r++) {
        if (c->pc[r] >= c->lists[r].n) continue;
        const pp_action *a = &c->lists[r].a[c->pc[r]];
        int p = a->peer;
        char why[192];
        if (c->pc[p] >= c->lists[p].n) {
            snprintf(why, sizeof why, "never matched: rank %d has finished its list", p);
        } else {
            char theirs[96];
            pp_action_format(&c->lists[p].a[c->pc[p]], theirs, sizeof theirs);
            snprintf(why, sizeof why, "deadlock: rank %d waits at action %d (%s)", p, c->pc[p], theirs);
        }
        return fail_at(c, r, c->pc[r], why);
    }
    return -1;
}

/* After every list ran to the end: nothing owed is missing. */
static int check_complete(const checker *c) {
    for (int r = 0; r < c->pp; r++) {
        for (int ch = 0; ch < c->v; ch++) {
            int g = pp_stage(c->pp, r, ch);
            for (int m = 0; m < c->n_micro; m++) {
                size_t at = cell(c, r, ch, m);
                const char *why = !c->fwd[at]                     ? "forward never runs"
                                  : !c->bwd[at]                   ? "backward never runs"
                                  : g < c->S - 1 && !c->act_out[at] ? "activation never sent"
                                  : g > 0 && !c->grad_out[at]     ? "input gradient never sent"
                                                                  : NULL;
                if (why) {
                    snprintf(c->err, c->errlen, "pp schedule: rank %d micro %d chunk %d: %s", r, m, ch, why);
                    return -1;
                }
            }
        }
    }
    return 0;
}

static int replay(checker *c) {
    for (int r = 0; r < c->pp; r++)
        for (int i = 0; i < c->lists[r].n; i++)
            if (check_static(c, r, i) != 0) return -1;
    for (;;) {
        int moved = 0, finished = 1;
        for (int r = 0; r < c->pp; r++) {
            int rc = advance(c, r);
            if (rc < 0) return -1;
            moved |= rc;
            finished &= c->pc[r] == c->lists[r].n;
        }
        if (finished) return check_complete(c);
        if (!moved) return report_stuck(c);
    }
}

/* pp_schedule_check, and the replay's span in time units when span is not NULL */
static int check_lists(int pp, int v, int n_micro, const pp_list *lists, char *err, size_t errlen,
                       long *span) {
    if (pp < 1 || v < 1 || n_micro < 1) {
        snprintf(err, errlen, "pp schedule: check needs pp, v, n_micro >= 1 (got %d, %d, %d)", pp, v, n_micro);
        return -1;
    }
    size_t cells = (size_t)pp * v * n_micro;
    checker c = {pp, v, n_micro, pp * v, lists, calloc((size_t)pp, sizeof(int)),
                 calloc(cells, 1), calloc(cells, 1), calloc(cells, 1), calloc(cells, 1),
                 calloc(cells, 1), calloc(cells, 1), calloc(cells, sizeof(int)),
                 calloc((size_t)pp * v, sizeof(int)), calloc((size_t)pp * v, sizeof(int)),
                 calloc((size_t)pp, sizeof(long)), err, errlen};
    int rc;
    if (!c.pc || !c.fwd || !c.bwd || !c.act_in || !c.grad_in || !c.act_out || !c.grad_out || !c.fwd_order ||
        !c.n_fwd || !c.n_bwd || !c.clock) {
        snprintf(err, errlen, "pp schedule: out of memory");
        rc = -1;
    } else {
        rc = replay(&c);
    }
    if (rc == 0 && span) {
        *span = 0;
        for (int r = 0; r < pp; r++)
            if (c.clock[r] > *span) *span = c.clock[r];
    }
    free(c.pc);
    free(c.fwd);
    free(c.bwd);
    free(c.act_in);
    free(c.grad_in);
    free(c.act_out);
    free(c.grad_out);
    free(c.fwd_order);
    free(c.n_fwd);
    free(c.n_bwd);
    free(c.clock);
    return rc;
}

int pp_schedule_check(int pp, int v, int n_micro, const pp_list *lists, char *err, size_t errlen) {
    return check_lists(pp, v, n_micro, lists, err, errlen, NULL);
}

long pp_schedule_span(int pp, int v, int n_micro, const pp_list *lists, char *err, size_t errlen) {
    long span = -1;
    return check_lists(pp, v, n_micro, lists, err, errlen, &span) == 0 ? span : -1;
}

double pp_span_bubble(int v, int n_micro, long span) {
    return 1.0 - (double)v * n_micro * (COST_FWD + COST_BWD) / (double)span;
}

/* A micro-batch holds a slot of a chunk from the first action that touches its buffers
 * (receive or forward) to the last (backward or sending the gradient). Starts and ends
 * both come in micro-batch order, so the live ones are consecutive and micro % slots
 * never collides; slots = the most live at once. */
void pp_count_slots(const pp_list *l, int v, int n_micro, int *slots /* [v] */) {
    int n = v * n_micro;
    /* [n] each: the index of the first and of the last action of chunk-micro k */
    int *first = log_calloc((size_t)n, sizeof(int), "the pipeline's slot count");
    int *last = log_calloc((size_t)n, sizeof(int), "the pipeline's slot count");
    /* [l->n + 1]: how many of a chunk's micro-batches start (+) and end (-) at action i,
     * summed as the list is walked: a pass per chunk, not per (action, micro-batch), which
     * took 29 s at 262144 micro-batches */
    int *change = log_calloc((size_t)l->n + 1, sizeof(int), "the pipeline's slot count");
    for (int k = 0; k < n; k++) first[k] = last[k] = -1;
    for (int i = 0; i < l->n; i++) {
        int k = l->a[i].chunk * n_micro + l->a[i].micro;
        if (first[k] < 0) first[k] = i;
        last[k] = i;
    }
    for (int c = 0; c < v; c++) {
        memset(change, 0, ((size_t)l->n + 1) * sizeof(int));
        for (int k = c * n_micro; k < (c + 1) * n_micro; k++)
            if (first[k] >= 0) {
                change[first[k]]++;
                change[last[k] + 1]--;
            }
        slots[c] = 1;
        for (int i = 0, live = 0; i < l->n; i++) {
            live += change[i];
            if (live > slots[c]) slots[c] = live;
        }
    }
    free(first);
    free(last);
    free(change);
}
