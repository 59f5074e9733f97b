/* AdamW with PyTorch semantics, global-norm clipping and the learning-rate schedule
 * (DESIGN section 3). */
#ifndef GPTC_OPTIMIZER_H
#define GPTC_OPTIMIZER_H

#include "layers/gpt.h"

typedef struct {
    double lr, min_lr;
    long warmup_steps, total_steps;
    int cosine;               /* 0: constant after warm-up */
    double beta1, beta2, eps, weight_decay, grad_clip;
} optim_config;

/* Learning rate of optimizer step s (1-based): linear warm-up to lr over warmup_steps,
 * then constant, or cosine from lr down to min_lr at total_steps. */
double lr_at_step(const optim_config *c, long step);
/* The piece of bucket b this rank updates: flat [lo, hi) of params and grads, whose
 * optimizer state starts at index state of opt_m / opt_v. Without sharding (shards 1)
 * that is the whole bucket. */
void optim_piece(const gpt_model *m, int b, int shard_rank, size_t *lo, size_t *hi,
                 size_t *state);
/* Clips (coef = min(1, clip / (norm + 1e-6))) and applies AdamW step t (1-based) with
 * learning rate lr to this rank's pieces. Returns the clip coefficient used. */
double optim_step(gpt_model *m, const optim_config *c, double grad_norm, long t, double lr,
                  int shard_rank);

#endif
