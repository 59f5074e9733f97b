/* Moving a model's parameters and optimizer state to and from the checkpoint schema of
 * DESIGN section 4 (engine/checkpoint.h does the HDF5 side). */
#ifndef GPTC_GPT_CHECKPOINT_H
#define GPTC_GPT_CHECKPOINT_H

#include <stddef.h>

#include "engine/checkpoint.h"
#include "layers/gpt.h"

typedef struct comm_group comm_group;

/* Writes /model and, when t > 0 (updates taken), /optim (m, v, t) for a checkpoint of
 * step, from opt_m and opt_v (host, [n_params] each, in the parameter layout; read on the
 * writers only: the others may pass NULL). Collective over world (NULL for one rank):
 * each rank with writer set sends its shards (replicated tensors only from TP rank 0), and
 * world rank 0 writes the file. On failure, -1 on every rank, *failed_rank the lowest
 * rank that failed (its err says why; the others' name it). */
int gpt_save(const gpt_model *m, comm_group *world, int writer, const char *path, long step,
             const float *opt_m, const float *opt_v, long t, int *failed_rank, char *err,
             size_t errlen);
/* What a rank keeps of the optimizer state a checkpoint holds: wants says whether it
 * keeps any of the elements [offset, offset + n) of the parameter layout (a tensor it does
 * not want is not read: ZeRO-1 keeps a DP-th of each bucket); keep takes one whole moment
 * (host, [n_params], parameter layout, the tensors it did not want left 0; which 0: m,
 * 1: v) before the buffer is reused. */
typedef struct {
    int (*wants)(size_t offset, size_t n, void *arg);
    void (*keep)(const float *full, int which, void *arg);
    void *arg;
} gpt_moments;
/* Reads every parameter from an open checkpoint whose meta already matched the model
 * shape and, when moments is given, each optimizer moment in turn, through one host buffer
 * of n_params (three whole copies a rank were a 1.5B model's 19 GB); t_optim is the
 * updates /optim says they hold (moments other than zero after none are refused). */
int gpt_load(gpt_model *m, ckpt_file *f, const gpt_moments *moments, long t_optim, char *err,
             size_t errlen);

#endif
