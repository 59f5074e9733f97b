/* One training run from config to final checkpoint. The order matters for users: every
 * check that can fail (config, shapes, data, checkpoint, save path) runs before the big
 * allocations and before step 1, so a typo costs seconds. */
#define _POSIX_C_SOURCE 200809L
#include "engine/trainer.h"

#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/tokens.h"
#include "engine/backend.h"
#include "engine/checkpoint.h"
#include "engine/cpu/cpu_blas.h"
#include "engine/log.h"
#include "engine/timing.h"
#include "layers/gpt.h"
#include "layers/gpt_checkpoint.h"
#include "layers/optimizer.h"

enum { ERR_LEN = 1024 };

/* Features whose keys exist in the contract but whose code lands with later work are
 * refused by name rather than silently ignored. */
static int check_supported(const gptc_config *c, const grid *g, char *err, size_t n) {
    if (strcmp(c->device, "cuda") == 0)
        snprintf(err, n, "train.device = cuda: this build has no CUDA backend yet (use cpu)");
    else if (strcmp(c->precision, "fp32") != 0)
        snprintf(err, n, "train.precision = %s: the cpu backend trains in fp32 only", c->precision);
    else if (g->tp > 1 || g->pp > 1 || g->dp > 1)
        snprintf(err, n, "parallel: tp=%d pp=%d dp=%d: multi-rank layouts are not implemented yet (run one rank)",
                 g->tp, g->pp, g->dp);
    else if (strcmp(c->timing, "kernel") == 0)
        snprintf(err, n, "profile.timing = kernel is not implemented yet (use step or off)");
    else if (c->trace[0] || c->report[0])
        snprintf(err, n, "profile.%s needs profile.timing = kernel, which is not implemented yet",
                 c->trace[0] ? "trace" : "report");
    else if (c->power)
        snprintf(err, n, "profile.power = true needs train.device = cuda");
    else if (c->contention_probe > 0)
        snprintf(err, n, "profile.contention_probe is not implemented yet");
    else
        return 0;
    return -1;
}

/* Model shape from [model], from the checkpoint, or both when they agree. */
static int resolve_shape(const gptc_config *c, const ckpt_meta *meta, gpt_shape *s,
                         char *err, size_t n) {
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
    return gpt_check_shape(s, err, n);
}

typedef struct {
    int B;      /* global batch rows */
    int T;      /* sequence length */
    int mb;     /* micro-batch rows */
    int n_micro;
} batch_plan;

static int plan_batch(const gptc_config *c, const grid *g, const gpt_shape *s, batch_plan *p,
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
    return 0;
}

/* Refuses a save path we could not write at the end of a long run. */
static int check_save_path(const char *path, char *err, size_t n) {
    char copy[CFG_STR_MAX];
    snprintf(copy, sizeof(copy), "%s", path);
    const char *dir = dirname(copy);
    if (access(dir, W_OK | X_OK) != 0) {
        snprintf(err, n, "train.save %s: directory %s is not writable: %s", path, dir, strerror(errno));
        return -1;
    }
    return 0;
}

static void print_model(const gpt_model *m, const batch_plan *bp, long first, long last) {
    const gpt_shape *s = &m->shape;
    log_info("model: %d layers, %d heads, d_model %d, n_ctx %d, vocab %d (padded %d): %.3f M parameters\n",
             s->n_layer, s->n_head, s->d_model, s->n_ctx, s->vocab_size, s->vocab_padded,
             (double)(m->n_params - (size_t)(s->vocab_padded - s->vocab_size) * s->d_model) / 1e6);
    log_info("batch: %d rows x %d tokens, %d micro-batch(es) of %d; steps %ld..%ld\n", bp->B, bp->T,
             bp->n_micro, bp->mb, first, last);
    log_info("memory: parameters+gradients+adam %.1f MiB, activations %.1f MiB\n",
             4.0 * m->n_params * sizeof(float) / 1048576.0, m->act_floats * sizeof(float) / 1048576.0);
    log_info("backend: %s, %d OpenMP thread(s), OpenBLAS kernels %s\n", m->be->name,
             omp_get_max_threads(), cpu_blas_corename());
}

/* The name under which the checkpoint of one step is kept: ckpt.h5 -> ckpt.step42.h5 */
static void versioned_name(const char *path, long step, char *out, size_t n) {
    size_t len = strlen(path);
    if (len > 3 && strcmp(path + len - 3, ".h5") == 0)
        snprintf(out, n, "%.*s.step%ld.h5", (int)(len - 3), path, step);
    else
        snprintf(out, n, "%s.step%ld", path, step);
}

/* train.keep = k > 1 keeps the last k checkpoints as hard links to what path held, so
 * path is always the newest and every kept file is complete. Older links are removed. */
static void keep_versions(const char *path, long step, int keep, long *kept, int *n_kept) {
    char name[CFG_STR_MAX + 32];
    versioned_name(path, step, name, sizeof(name));
    unlink(name);
    if (link(path, name) != 0) {
        log_info("warning: could not keep %s: %s\n", name, strerror(errno));
        return;
    }
    kept[(*n_kept)++] = step;
    while (*n_kept > keep) {
        versioned_name(path, kept[0], name, sizeof(name));
        unlink(name);
        memmove(kept, kept + 1, sizeof(long) * (size_t)--(*n_kept));
    }
}

static int save_checkpoint(const gpt_model *m, const gptc_config *c, long step, long t,
                           long *kept, int *n_kept, char *err, size_t n) {
    char why[ERR_LEN - 16];
    if (gpt_save(m, c->save, step, t > 0, t, why, sizeof(why)) != 0) {
        snprintf(err, n, "train.save %s", why);
        return -1;
    }
    if (c->keep > 1) keep_versions(c->save, step, c->keep, kept, n_kept);
    log_info("saved %s (step %ld%s)\n", c->save, step, t > 0 ? "" : ", no optimizer state");
    return 0;
}

typedef struct {
    gpt_model model;
    batch_loader *loader;
    FILE *log;
    int32_t *inputs, *targets; /* [B,T] each, this rank's rows of the step */
    long *kept;                /* [keep + 1] steps whose checkpoints are kept, oldest first */
    int n_kept;
} run_state;

static void run_free(run_state *r) {
    gpt_destroy(&r->model);
    if (r->loader) loader_destroy(r->loader);
    if (r->log) fclose(r->log);
    free(r->inputs);
    free(r->targets);
    free(r->kept);
}

int train_run(const gptc_config *c, const grid *g) {
    char err[ERR_LEN];
    run_state r;
    memset(&r, 0, sizeof(r));
    ckpt_file *init = NULL;
    ckpt_meta meta;
    int has_optim = 0;
    long optim_t = 0;
    gpt_shape shape;
    batch_plan bp;

    if (config_validate(c, err, sizeof(err)) != 0 || check_supported(c, g, err, sizeof(err)) != 0)
        goto fail;
    if (c->init[0]) {
        char why[ERR_LEN - 16];
        init = ckpt_open(c->init, &meta, &has_optim, &optim_t, why, sizeof(why));
        if (!init) {
            snprintf(err, sizeof(err), "train.init %s", why);
            goto fail;
        }
    }
    if (resolve_shape(c, init ? &meta : NULL, &shape, err, sizeof(err)) != 0 ||
        plan_batch(c, g, &shape, &bp, err, sizeof(err)) != 0)
        goto fail;
    if (c->save[0] && check_save_path(c->save, err, sizeof(err)) != 0) goto fail;

    long first = init ? meta.step + 1 : 1;
    if (first > c->steps + 1) {
        snprintf(err, sizeof(err), "train.steps = %ld is before the checkpoint's step %ld (train.init %s)",
                 c->steps, meta.step, c->init);
        goto fail;
    }
    r.loader = loader_create(c->data_path, bp.T, bp.B, 0, bp.B, shape.vocab_size, c->shuffle,
                             c->seed, err, sizeof(err));
    if (!r.loader) goto fail;

    const gptc_backend *be = cpu_backend();
    if (!be) {
        snprintf(err, sizeof(err), "train.device = cpu: the CPU backend could not start (see above)");
        goto fail;
    }
    if (gpt_create(&r.model, &shape, bp.mb, bp.T, be, err, sizeof(err)) != 0) goto fail;
    gpt_model *m = &r.model;
    if (init) {
        /* a step-0 checkpoint without /optim is a plain initialisation */
        char why[ERR_LEN - 16];
        if (gpt_load(m, init, has_optim, why, sizeof(why)) != 0) {
            snprintf(err, sizeof(err), "train.init %s", why);
            goto fail;
        }
        ckpt_close(init);
        init = NULL;
    } else {
        gpt_init_random(m, c->seed);
    }
    long t = has_optim ? optim_t : 0;

    if (c->log_file[0]) {
        r.log = fopen(c->log_file, first > 1 ? "a" : "w");
        if (!r.log) {
            snprintf(err, sizeof(err), "train.log_file %s: %s", c->log_file, strerror(errno));
            goto fail;
        }
    }
    r.kept = calloc((size_t)c->keep + 1, sizeof(long));
    r.inputs = malloc((size_t)bp.B * bp.T * sizeof(int32_t));
    r.targets = malloc((size_t)bp.B * bp.T * sizeof(int32_t));
    if (!r.inputs || !r.targets || !r.kept) {
        snprintf(err, sizeof(err), "out of host memory for the batch");
        goto fail;
    }

    print_model(m, &bp, first, c->steps);
    optim_config oc = {c->lr, c->min_lr, c->warmup_steps, c->steps,
                       strcmp(c->lr_schedule, "cosine") == 0, c->beta1, c->beta2, c->eps,
                       c->weight_decay, c->grad_clip};
    int skip_bad = strcmp(c->nan_policy, "skip") == 0;
    double tokens_per_step = (double)bp.B * bp.T, dloss = 1.0 / tokens_per_step;
    double total_ms = 0, last_loss = NAN;
    long timed_steps = 0;
    for (long step = first; step <= c->steps; step++) {
        double t0 = timing_now_ms();
        if (loader_get(r.loader, step, r.inputs, r.targets, err, sizeof(err)) != 0) goto fail;
        m->be->zero(m->grads, m->n_params * sizeof(float), m->stream);
        double loss_sum = 0;
        for (int k = 0; k < bp.n_micro; k++) {
            size_t off = (size_t)k * bp.mb * bp.T;
            loss_sum += gpt_forward(m, r.inputs + off, r.targets + off, (float)dloss);
            gpt_backward(m);
        }
        double loss = loss_sum / tokens_per_step;
        double norm = sqrt(grad_sum_squares(m));
        double lr = lr_at_step(&oc, step);
        if (!isfinite(loss) || !isfinite(norm)) {
            if (!skip_bad) {
                snprintf(err, sizeof(err), "step %ld: loss %g, grad norm %g is not finite (train.nan_policy = stop)",
                         step, loss, norm);
                goto fail;
            }
            log_info("step %ld: loss %g, grad norm %g is not finite: update skipped (train.nan_policy = skip)\n",
                     step, loss, norm);
        } else {
            optim_step(m, &oc, norm, ++t, lr);
        }
        m->be->synchronize(m->stream);
        double ms = timing_now_ms() - t0;
        if (step > first) { /* the first step pays for page faults and warm-up */
            total_ms += ms;
            timed_steps++;
        }
        last_loss = loss;
        double tps = tokens_per_step / (ms / 1000.0);
        log_info("step %5ld/%ld | loss %.6f | lr %.3e | grad norm %.4f | %8.1f ms | %8.0f tok/s\n",
                 step, c->steps, loss, lr, norm, ms, tps);
        if (r.log) {
            fprintf(r.log, "{\"step\": %ld, \"loss\": %.9g, \"grad_norm\": %.9g, \"lr\": %.9g, "
                           "\"iter_ms\": %.3f, \"tokens_per_s\": %.1f}\n",
                    step, loss, norm, lr, ms, tps);
            fflush(r.log);
        }
        int due = c->save[0] && ((c->save_every > 0 && step % c->save_every == 0) || step == c->steps);
        if (due && save_checkpoint(m, c, step, t, r.kept, &r.n_kept, err, sizeof(err)) != 0)
            goto fail;
    }
    /* a run with no steps left still writes what it holds: with train.steps = 0 that is
     * the initialisation itself, a step-0 checkpoint without /optim */
    if (c->save[0] && first > c->steps &&
        save_checkpoint(m, c, first - 1, t, r.kept, &r.n_kept, err, sizeof(err)) != 0)
        goto fail;
    if (timed_steps > 0)
        log_info("done: %ld steps, final loss %.6f, mean %.1f ms/step, %.0f tok/s (steps after the first)\n",
                 c->steps - first + 1, last_loss, total_ms / timed_steps,
                 tokens_per_step * timed_steps / (total_ms / 1000.0));
    else
        log_info("done: %ld steps, final loss %.6f\n", c->steps - first + 1, last_loss);
    run_free(&r);
    return 0;

fail:
    log_error("%s", err);
    if (init) ckpt_close(init);
    run_free(&r);
    return 1;
}
