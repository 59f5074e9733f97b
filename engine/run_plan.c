/* What a run is, worked out from its config before anything starts (engine/run_plan.h):
 * the checks that refuse a run by name before step 1, the model shape, and the batch and
 * pipeline plans. */
#define _POSIX_C_SOURCE 200809L
#include "engine/run_plan.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cuda/cuda_backend.h"
#include "engine/output_files.h"
#include "parallel/schedule.h"

/* Features whose keys exist in the contract but whose code lands with later work are
 * refused by name rather than silently ignored. */
int plan_check_supported(const gptc_config *c, const grid *g, char *err, size_t n) {
    if ((c->trace[0] || c->report[0]) && strcmp(c->timing, "kernel") != 0)
        snprintf(err, n, "profile.%s needs profile.timing = kernel", c->trace[0] ? "trace" : "report");
    else if (c->power && strcmp(c->device, "cuda") != 0)
        snprintf(err, n, "profile.power = true needs train.device = cuda");
    else if (c->contention_probe > 0 && strcmp(c->timing, "kernel") != 0)
        snprintf(err, n, "profile.contention_probe needs profile.timing = kernel");
    else if (c->prof_warmup > 0 && strcmp(c->timing, "kernel") != 0)
        snprintf(err, n, "profile.warmup needs profile.timing = kernel");
    else
        return 0;
    return -1;
}

/* Model shape from [model], from the checkpoint, or both when they agree. */
int plan_shape(const gptc_config *c, const ckpt_meta *meta, gpt_shape *s, char *err,
               size_t n) {
    struct { const char *key; int cfg; long ckpt; int *dst; } k[] = {
        {"n_layer", c->n_layer, meta ? meta->n_layer : 0, &s->n_layer},
        {"n_head", c->n_head, meta ? meta->n_head : 0, &s->n_head},
        {"d_model", c->d_model, meta ? meta->d_model : 0, &s->d_model},
        {"n_ctx", c->n_ctx, meta ? meta->n_ctx : 0, &s->n_ctx},
        {"vocab_size", c->vocab_size, meta ? meta->vocab_size : 0, &s->vocab_size},
    };
    memset(s, 0, sizeof(*s));
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        if (meta && k[i].cfg && k[i].cfg != k[i].ckpt) {
            snprintf(err, n, "config: model.%s = %d contradicts train.init %s (%s = %ld)", k[i].key,
                     k[i].cfg, c->init, k[i].key, k[i].ckpt);
            return -1;
        }
        if (!meta && !k[i].cfg) {
            snprintf(err, n, "config: model.%s is required when train.init is empty", k[i].key);
            return -1;
        }
        long v = meta ? k[i].ckpt : k[i].cfg;
        if (v < 1 || v > (1L << 30)) {
            snprintf(err, n, "train.init %s: attribute %s = %ld is out of range", c->init, k[i].key, v);
            return -1;
        }
        *k[i].dst = (int)v;
    }
    return 0;
}

/* Each rank reads train.init from its own file system: node-local copies under one name
 * may differ (one left from another run), and ranks that load different models or
 * steps meet in collectives of different sizes or counts. Compares this rank's
 * checkpoint with rank 0's (collective: call it on every rank, opened or not); err (NULL:
 * only take part) names the first field that differs. */
void plan_same_init(const char *path, const ckpt_meta *meta, int has_optim, long optim_t,
                    int world, char *err, size_t n) {
    enum { FIELDS = 8 };
    static const char *const name[FIELDS] = {"step",  "n_layer",    "n_head",       "d_model",
                                             "n_ctx", "vocab_size", "optimizer state", "optimizer t"};
    long mine[FIELDS] = {meta->step,  meta->n_layer,    meta->n_head, meta->d_model,
                         meta->n_ctx, meta->vocab_size, has_optim,    optim_t};
    long root[FIELDS];
    memcpy(root, mine, sizeof(root));
    if (world > 1) MPI_Bcast(root, FIELDS, MPI_LONG, 0, MPI_COMM_WORLD);
    for (int i = 0; err && i < FIELDS; i++)
        if (mine[i] != root[i]) {
            snprintf(err, n, "train.init %s: %s = %ld here, but %ld on rank 0 (every rank must "
                     "read the same checkpoint)", path, name[i], mine[i], root[i]);
            return;
        }
}

/* As plan_same_init for data.path: this rank's token file fingerprint (loader_fingerprint;
 * NULL where this rank has none, having failed before) against rank 0's. Collective;
 * returns -1 with err set when they differ, else 0. */
int plan_same_data(const char *path, const uint64_t *fp, int world, char *err, size_t n) {
    static const char *const name[2] = {"tokens", "vocab_size"};
    uint64_t mine[4] = {fp != NULL}, root[4]; /* valid, then fp[0 .. 2] */
    if (fp) memcpy(mine + 1, fp, 3 * sizeof(*fp));
    memcpy(root, mine, sizeof(root));
    if (world > 1) MPI_Bcast(root, 4, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    if (!fp || !root[0]) return 0; /* a failed rank speaks for itself */
    for (int i = 0; i < 2; i++)
        if (mine[1 + i] != root[1 + i]) {
            snprintf(err, n, "data.path %s: %s = %llu here, but %llu on rank 0 (every rank must "
                     "read the same tokens)", path, name[i], (unsigned long long)mine[1 + i],
                     (unsigned long long)root[1 + i]);
            return -1;
        }
    if (mine[3] == root[3]) return 0;
    snprintf(err, n, "data.path %s: its tokens differ from rank 0's file of that name (as "
             "many, other values; every rank must read the same tokens)", path);
    return -1;
}

/* Rows of the global batch, sequence length and micro-batches, which the layout must
 * divide. */
int plan_batch(const gptc_config *c, const grid *g, const gpt_shape *s, batch_plan *p,
               char *err, size_t n) {
    p->B = c->global_batch;
    p->T = c->seq_len ? c->seq_len : s->n_ctx;
    if (p->T > s->n_ctx) {
        snprintf(err, n, "config: train.seq_len = %d is larger than model.n_ctx = %d", p->T, s->n_ctx);
        return -1;
    }
    if (p->B % g->dp != 0) {
        snprintf(err, n, "config: train.global_batch = %d is not divisible by parallel.dp = %d", p->B, g->dp);
        return -1;
    }
    p->mb = c->micro_batch ? c->micro_batch : p->B / g->dp;
    if (p->B % (g->dp * p->mb) != 0) {
        snprintf(err, n, "config: train.global_batch = %d is not divisible by parallel.dp * train.micro_batch = %d * %d",
                 p->B, g->dp, p->mb);
        return -1;
    }
    p->n_micro = p->B / (g->dp * p->mb);
    if (c->sequence_parallel && (p->mb * p->T) % g->tp != 0) {
        snprintf(err, n, "config: parallel.sequence_parallel splits train.micro_batch * train.seq_len = %d tokens over parallel.tp = %d, which does not divide them",
                 p->mb * p->T, g->tp);
        return -1;
    }
    return 0;
}

/* The pipeline split: whole layers per chunk, and a schedule that exists for it. */
int plan_pipeline(const gptc_config *c, const grid *g, const gpt_shape *s,
                  const batch_plan *bp, char *err, size_t n) {
    int chunks = g->pp * c->virtual_stages;
    if (s->n_layer % chunks != 0) {
        snprintf(err, n, "config: model.n_layer = %d is not divisible by parallel.pp * parallel.virtual_stages = %d * %d",
                 s->n_layer, g->pp, c->virtual_stages);
        return -1;
    }
    return pp_schedule_validate(c->schedule, g->pp, c->virtual_stages, bp->n_micro, err, n);
}

int plan_layout(const gptc_config *c, const grid *g, const ckpt_meta *meta, gpt_shape *s,
                batch_plan *bp, char *err, size_t n) {
    if (plan_shape(c, meta, s, err, n) != 0 || gpt_check_shape(s, g->tp, err, n) != 0 ||
        plan_batch(c, g, s, bp, err, n) != 0 || plan_pipeline(c, g, s, bp, err, n) != 0)
        return -1;
    return 0;
}

/* The CUDA attention kernels handle head sizes up to 128 in fp32, and multiples of 8 up
 * to 128 on tensor cores under precision = bf16 (16-byte rows for ldmatrix); the CPU's
 * attention, any. Their grids hold a sequence's 64-row tiles in y, which stops at 65535. */
int plan_check_device(const gptc_config *c, const gpt_shape *s, int T, char *err, size_t n) {
    int hs = s->d_model / s->n_head;
    if (strcmp(c->device, "cuda") != 0) return 0;
    if ((long)T > 65535L * 64) {
        snprintf(err, n, "train.device = cuda takes train.seq_len up to %ld (65535 attention "
                 "tiles of 64 rows), not %d", 65535L * 64, T);
        return -1;
    }
    if (strcmp(c->precision, "bf16") == 0 && hs % 8 != 0) {
        snprintf(err, n, "train.precision = bf16 on train.device = cuda needs a head size "
                 "(model.d_model / model.n_head) that is a multiple of 8, not %d", hs);
        return -1;
    }
    if (hs > 128) { /* the fp32 attention kernels' tiles hold up to 128 columns */
        snprintf(err, n, "train.device = cuda needs a head size (model.d_model / model.n_head) "
                 "of at most 128, not %d", hs);
        return -1;
    }
    return 0;
}

/* The outputs are written at the end of a long run (checkpoints, the trace and the
 * report after the last step): a path that fails then, or that names another file the
 * run reads or writes, is refused now. A trace or report that goes to a FIFO is opened
 * now and held (output_whole_hold). Rank 0's. */
int plan_check_outputs(const gptc_config *c, long first, char *err, size_t n) {
    /* the CUDA backend's GEMM choices, appended during the run */
    const char *gemm = strcmp(c->device, "cuda") == 0 ? cuda_backend_gemm_cache() : NULL;
    const named_path files[] = {
        {"train.save", c->save, 1},        {"train.log_file", c->log_file, 1},
        {"profile.trace", c->trace, 1},    {"profile.report", c->report, 1},
        {"the config file", c->source, 0}, {"data.path", c->data_path, 0},
        {"train.init", c->init, 0},
        {"GPTC_GEMM_CACHE", gemm ? gemm : "", 1}};
    if (output_paths_distinct(files, (int)(sizeof files / sizeof files[0]), err, n) != 0)
        return -1;
    /* the checkpoint is written beside and renamed over */
    const output_kind kinds[4] = {OUTPUT_CHECKPOINT, OUTPUT_METRICS, OUTPUT_TRACE, OUTPUT_REPORT};
    for (int i = 0; i < 4; i++)
        if (output_path_check(files[i].key, files[i].path, kinds[i], err, n) != 0) return -1;
    if (save_versions_check(c->save, first, c->steps, c->save_every, c->keep, err, n) != 0)
        return -1;
    for (int i = 2; i < 4; i++) { /* the trace and the report, written after the last step */
        char why[256];
        if (output_whole_hold(files[i].path, why, sizeof why) != 0) {
            snprintf(err, n, "%s %s: cannot write: %s", files[i].key, files[i].path, why);
            return -1;
        }
    }
    return 0;
}

/* The configuration this run uses: keys left to default by derivation (parallel.dp,
 * the model shape from train.init, seq_len, micro_batch) show the values they took. */
void plan_print_effective(const gptc_config *c, const grid *g, const gpt_shape *s,
                          const batch_plan *bp) {
    if (g->rank != 0) return;
    gptc_config eff = *c;
    eff.dp = g->dp;
    eff.n_layer = s->n_layer;
    eff.n_head = s->n_head;
    eff.d_model = s->d_model;
    eff.n_ctx = s->n_ctx;
    eff.vocab_size = s->vocab_size;
    eff.seq_len = bp->T;
    eff.micro_batch = bp->mb;
    printf("# effective configuration\n");
    config_print(&eff, stdout);
    printf("\n");
    fflush(stdout);
}
