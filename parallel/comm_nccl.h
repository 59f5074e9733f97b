/* The NCCL side of the comm layer (parallel/comm_nccl.c; parallel/comm_nccl_none.c in
 * builds without CUDA). Only comm.c calls these. */
#ifndef GPTC_COMM_NCCL_H
#define GPTC_COMM_NCCL_H

#include "parallel/comm.h"
#include "parallel/comm_task.h"

#include <stddef.h>

/* The NCCL library's version as NCCL encodes it (2.28.3 -> 22803); 0 without NCCL. */
int comm_nccl_version(void);
/* Collective over g->comm (an MPI communicator already adopted): makes g->nccl. 0, or -1
 * with the reason in err. */
int comm_nccl_world(comm_group *g, const comm_options *o, char *err, size_t errlen);
/* Collective over parent: splits parent->nccl as MPI split parent->comm (color < 0: no
 * group). */
int comm_nccl_split(comm_group *parent, comm_group *g, int color, int key,
                    const comm_options *o, char *err, size_t errlen);
/* Enqueues the op on s's CUDA stream (NULL: the compute stream). Errors are kept in g. */
void comm_nccl_issue(const comm_task *t, gptc_stream *s);
/* The communicator's asynchronous error, if any, as a message; NULL when healthy. */
const char *comm_nccl_async_error(comm_group *g);
/* Makes every NCCL call in flight on g return (a peer died); g is unusable afterwards. */
void comm_nccl_abort(comm_group *g);
void comm_nccl_free(comm_group *g);

#endif
