/* Pipeline-parallel schedules as data: gpipe, 1f1b and interleaved 1f1b.
 *
 * Layout. pp ranks (pipeline stages), each holding v model chunks (v = parallel.virtual_stages,
 * 1 except for the interleaved schedule). The layers are cut into S = pp*v consecutive pieces;
 * global stage g = chunk*pp + rank holds piece g (Megatron's interleaved layout). The forward of
 * a micro-batch visits g = 0, 1, ..., S-1 (rank 0 chunk 0, ..., rank pp-1 chunk 0, rank 0
 * chunk 1, ...); its backward visits them in reverse.
 *
 * A schedule is one list of actions per rank. The executor walks its list in order and does
 * nothing else; pp_schedule_check() proves, before a step runs, that all ranks' lists complete.
 *
 * What each action means for the executor (g = chunk*pp + this rank):
 *   PP_FWD  (micro m, chunk c)  forward of micro-batch m through local chunk c. Input: stage 0
 *           embeds m's tokens; any other stage uses the tensor of the RECV_ACT (m, c) that came
 *           earlier in this list. Output: the last stage (g = S-1) computes m's loss; any other
 *           stage keeps its output for the SEND_ACT (m, c) that comes later. peer = -1.
 *   PP_BWD  (m, c)  backward of m through chunk c. Output gradient: the last stage starts from
 *           its own loss; any other stage uses the tensor of the earlier RECV_GRAD (m, c).
 *           Accumulates chunk c's parameter gradients; stages g > 0 keep the gradient w.r.t.
 *           their input for the later SEND_GRAD (m, c). After it, (m, c)'s saved activations
 *           may be freed. peer = -1.
 *   PP_SEND_ACT  (m, c, peer)  send FWD (m, c)'s output to peer, the rank of stage g+1; there it
 *           is RECV_ACT (m, (g+1)/pp, this rank).
 *   PP_RECV_ACT  (m, c, peer)  receive FWD (m, c)'s input from peer, the rank of stage g-1;
 *           there it is SEND_ACT (m, (g-1)/pp, this rank).
 *   PP_SEND_GRAD (m, c, peer)  send BWD (m, c)'s input gradient to peer, the rank of stage g-1;
 *           there it is RECV_GRAD (m, (g-1)/pp, this rank).
 *   PP_RECV_GRAD (m, c, peer)  receive BWD (m, c)'s output gradient from peer, the rank of
 *           stage g+1; there it is SEND_GRAD (m, (g+1)/pp, this rank).
 * `chunk` is always the chunk on THIS rank that produced (send) or will consume (recv) the
 * tensor; pp_peer_chunk() gives the chunk on the other side. Every message is one tensor
 * shaped like a block's input/output (a [micro_batch, seq_len, d_model] activation or its
 * gradient). There is no combined send+recv kind: with the ordering below none is needed.
 *
 * Ordering guarantee. Each rank's list is the projection of one global sequence of events
 * (computes, and messages that appear in both endpoints' lists at the same place of that
 * sequence). Hence:
 *   - executing every send and recv as a BLOCKING rendezvous (MPI_Ssend/MPI_Recv, or NCCL
 *     send/recv each completed before the next action) in list order never deadlocks;
 *   - between any two ranks, the messages of each direction appear in the same order on both
 *     sides, so MPI's non-overtaking rule matches them even with a single tag per direction;
 *   - an executor may relax this (post a recv earlier, complete a send later, overlap.pp =
 *     async) as long as it issues point-to-point operations in list order and waits for a
 *     recv before the compute that consumes it and for a send before the buffer is reused.
 * Each message sits where it is handed over in an idealised run (forward 1, backward 2 time
 * units, transfers instant but needing both ranks): at the first instant after its producing
 * compute when neither rank is inside a compute. A rank with a tensor to send goes on
 * computing; one whose next compute lacks its input waits. So, run blocking, no rank waits
 * at a send for a receiver still computing, and the lists take the schedule's arithmetic,
 * pp_schedule_span = (v * n_micro + pp - 1) * 3, the bubble (pp - 1) / (v * n_micro + pp - 1).
 *
 * On every (rank, chunk) backwards run in the same micro-batch order as forwards (FIFO, and
 * for all three schedules that is micro 0, 1, ...), so the gradient accumulation order, and
 * with it the float sums, is the same for every schedule.
 *
 * Accepted combinations (anything else is refused with a one-line error naming the key):
 *   gpipe, 1f1b:  v == 1, any pp >= 1, any n_micro >= 1.
 *   interleaved:  v >= 2, pp >= 2, n_micro a multiple of pp (Megatron's groups of pp).
 * n_micro is the number of micro-batches per optimizer step,
 * train.global_batch / (parallel.dp * train.micro_batch).
 *
 * Phases. Every schedule is warm-up (forwards only), steady state (one forward, then one
 * backward), cool-down (backwards only), with warm-up counts
 *   gpipe:       n_micro (everything is warm-up: all forwards, then all backwards)
 *   1f1b:        min(pp - rank - 1, n_micro)
 *   interleaved: min((pp - rank - 1)*2 + (v - 1)*pp, n_micro*v)
 * The k-th forward is micro (k / (pp*v))*pp + k % pp on chunk (k / pp) % v; the k-th backward
 * the same micro on chunk v - 1 - (k / pp) % v (for v = 1: micro k, chunk 0). Because steady
 * state starts with a forward, a rank runs min(warmup + 1, n_micro*v) forwards before its
 * first backward. */
#ifndef GPTC_SCHEDULE_H
#define GPTC_SCHEDULE_H

#include <stddef.h>

typedef enum { PP_FWD, PP_BWD, PP_SEND_ACT, PP_RECV_ACT, PP_SEND_GRAD, PP_RECV_GRAD } pp_kind;

typedef struct {
    pp_kind kind;
    int micro; /* micro-batch, 0 .. n_micro-1 */
    int chunk; /* local chunk on this rank, 0 .. v-1 */
    int peer;  /* the other rank for send/recv; -1 for FWD/BWD */
} pp_action;

typedef struct {
    pp_action *a; /* [cap], the first n used */
    int n, cap;
} pp_list;

/* Refuses impossible combinations (see above) with a one-line error naming the key.
 * name: "gpipe" | "1f1b" | "interleaved". */
int pp_schedule_validate(const char *name, int pp, int v, int n_micro, char *err, size_t errlen);

/* Builds rank's list into out (which must be empty, {0}); 0, or -1 with a one-line error. */
int pp_schedule_build(const char *name, int pp, int v, int n_micro, int rank, pp_list *out, char *err,
                      size_t errlen);

/* Simulates the pp lists (lists[r] for rank r) under blocking rendezvous send/recv and checks
 * that they complete and compute the right things: every action well formed and addressed to
 * the rank of the adjacent stage; each (micro, chunk) forward and backward exactly once on each
 * rank; a forward only after its input arrived; a backward only after its own forward and its
 * output gradient (the last stage: its forward); a send only after its tensor exists; every
 * send met by exactly one matching recv; backwards on each chunk in forward (FIFO) order; no
 * deadlock. 0, or -1 with a one-line description of the first problem (rank, action, why). */
int pp_schedule_check(int pp, int v, int n_micro, const pp_list *lists, char *err, size_t errlen);

/* The checker's replay timed: every forward takes 1 unit and every backward 2 (per chunk),
 * transfers none, and a send and its recv complete together when both ranks have reached
 * them. Returns the last rank's end in those units, or -1 with err set where
 * pp_schedule_check fails. For these schedules the least possible is
 * (v * n_micro + pp - 1) * 3: the bubble (pp - 1) / (v * n_micro + pp - 1) of each rank's
 * span, which the lists built above reach (test_schedule). */
long pp_schedule_span(int pp, int v, int n_micro, const pp_list *lists, char *err, size_t errlen);
/* The part of a span in which a rank does not compute: 1 - v * n_micro * 3 / span. */
double pp_span_bubble(int v, int n_micro, long span);

/* The warm-up count of the formulas above, or -1 for a refused combination. */
int pp_warmup_count(const char *name, int pp, int v, int n_micro, int rank);

/* Global stage of (rank, chunk): chunk*pp + rank. */
int pp_stage(int pp, int rank, int chunk);
/* For a send/recv on `rank`: the chunk that the message belongs to on a->peer. */
int pp_peer_chunk(int pp, int rank, const pp_action *a);

const char *pp_kind_name(pp_kind k);
/* "FWD micro 3 chunk 1", "SEND_ACT micro 3 chunk 1 to rank 2", "RECV_GRAD micro 0 chunk 0 from rank 1". */
void pp_action_format(const pp_action *a, char *buf, size_t len);

/* The activation slots each chunk of list l needs: the most of its micro-batches live at
 * once, from the first action that touches one's buffers to the last. Live ones are
 * consecutive, so slot micro % slots[c] never holds two. */
void pp_count_slots(const pp_list *l, int v, int n_micro, int *slots /* [v] */);
/* Appends to l; 0, or -1 when out of memory. */
int pp_list_push(pp_list *l, pp_action a);
void pp_list_free(pp_list *l);

#endif
