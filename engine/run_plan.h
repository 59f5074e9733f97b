/* What a run is, worked out from its config before anything starts: the model shape, the
 * batch and pipeline plans, and the checks that refuse a run by name before step 1. Each
 * check returns 0, or -1 with err naming the key (and the cause). */
#ifndef GPTC_RUN_PLAN_H
#define GPTC_RUN_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "engine/checkpoint.h"
#include "engine/config.h"
#include "layers/gpt.h"
#include "parallel/grid.h"

typedef struct {
    int B;       /* global batch rows */
    int T;       /* sequence length */
    int mb;      /* micro-batch rows */
    int n_micro; /* micro-batches per DP rank and step */
} batch_plan;

/* Keys whose features this build refuses by name rather than ignore. */
int plan_check_supported(const gptc_config *c, const grid *g, char *err, size_t n);
/* The model shape: from [model], from train.init's meta (NULL: none), or both where they
 * agree. */
int plan_shape(const gptc_config *c, const ckpt_meta *meta, gpt_shape *s, char *err,
               size_t n);
/* Collective: this rank's train.init (meta, optimizer state and t) against rank 0's;
 * err names the first field that differs (NULL: take part only, as a rank that could not
 * open its file does). */
void plan_same_init(const char *path, const ckpt_meta *meta, int has_optim, long optim_t,
                    int world, char *err, size_t n);
/* Collective: this rank's data.path fingerprint (loader_fingerprint; NULL: take part only,
 * as a rank whose loader failed does) against rank 0's; -1 with err naming what differs. */
int plan_same_data(const char *path, const uint64_t *fp, int world, char *err, size_t n);
/* Rows, sequence length and micro-batches, from train.* and the layout. */
int plan_batch(const gptc_config *c, const grid *g, const gpt_shape *s, batch_plan *p,
               char *err, size_t n);
/* Whole layers per pipeline chunk, and a schedule that exists for the plan. */
int plan_pipeline(const gptc_config *c, const grid *g, const gpt_shape *s,
                  const batch_plan *bp, char *err, size_t n);
/* The model shape (plan_shape, with train.init's meta or NULL) checked for the layout,
 * and the batch and pipeline plans: what a config asks of the layout, in the order the
 * run checks it (tests/test_configs.c runs the shipped configs through it). */
int plan_layout(const gptc_config *c, const grid *g, const ckpt_meta *meta, gpt_shape *s,
                batch_plan *bp, char *err, size_t n);
/* What train.device = cuda cannot run (head sizes, sequence length). */
int plan_check_device(const gptc_config *c, const gpt_shape *s, int T, char *err, size_t n);
/* Rank 0, which writes them: every output path writable, and none the file of an input
 * or of another output, nor (train.keep) a version of the checkpoint that this run, from
 * step first, would write over a file of another kind; a trace or report that goes to a
 * FIFO is opened now and held until the end (output_whole_hold). */
int plan_check_outputs(const gptc_config *c, long first, char *err, size_t n);
/* Rank 0 prints the configuration as used: derived keys with the values they took. */
void plan_print_effective(const gptc_config *c, const grid *g, const gpt_shape *s,
                          const batch_plan *bp);

#endif
