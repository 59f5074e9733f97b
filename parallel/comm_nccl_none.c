/* Builds without CUDA have no NCCL: comm.c then never makes an NCCL group. */
#include "parallel/comm_nccl.h"

#include <stdio.h>

int comm_nccl_version(void) { return 0; }
int comm_nccl_world(comm_group *g, const comm_options *o, char *err, size_t errlen) {
    snprintf(err, errlen, "comm: this build has no NCCL");
    return -1;
}
int comm_nccl_split(comm_group *parent, comm_group *g, int color, int key,
                    const comm_options *o, char *err, size_t errlen) {
    snprintf(err, errlen, "comm: this build has no NCCL");
    return -1;
}
void comm_nccl_issue(const comm_task *t, gptc_stream *s) {}
const char *comm_nccl_async_error(comm_group *g) { return NULL; }
void comm_nccl_abort(comm_group *g) {}
void comm_nccl_free(comm_group *g) {}
